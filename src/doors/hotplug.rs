//! `gpuhook attach` and `gpuhook detach`: GPUs into and out of a running container (docs/guides/hotplug.md). This door finds the container and says what happened; the steps themselves
//! are the lifecycle's ([`lifecycle::attach`], [`lifecycle::detach`], on the facts of the kind of container).
//!
//! A libvirt domain is found as libvirt's LXC driver keeps a running one: its status file
//! `LXC_STATE_DIR/NAME.xml` (`<domstatus>` around the live `<domain>`), by name, or by UUID
//! among those files; the container then as at `started` (its controller's init, the same
//! `/dev` identity checks). An OCI container by its ID ([`oci_container`]): gpuhook's record of its
//! init, else its runtime's state; its `/dev` from its init's mounts, its device cgroup its
//! init's (cgroup v1).

use crate::doors::bundle::parse as bundle;
use crate::doors::error::CliError;
use crate::enter::container::{self, Container, ContainerError};
use crate::host::config::Config;
use crate::ids::{normalize_uuid, Unit};
use crate::request::metadata::{self, Domain};
use crate::request::oci::{self, KeyFrom, Pairs};
use crate::request::{DeviceSel, Request, Wording};
use crate::reserve::lifecycle::{self, Attached, Detached, Holder, Pick, Which};
use crate::reserve::state::{HolderId, HolderKind, State, Store};
use crate::reserve::world::World;
use std::io::Read;
use std::path::Path;

pub mod oci_container;

/// What `gpuhook attach` asks for (the attributes of `<gpu:gpus>`, as options).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AttachArgs {
    /// Domain name or UUID, or OCI container ID
    pub name: String,
    /// How many GPUs (or MIG instances) more (default: the number of --device, else 1)
    #[arg(long)]
    pub count: Option<u32>,
    /// Vendor: nvidia, amd, intel
    #[arg(long)]
    pub vendor: Option<String>,
    /// Architecture (fermi, kepler, … hopper, blackwell)
    #[arg(long)]
    pub arch: Option<String>,
    /// Substring of the model name
    #[arg(long)]
    pub model: Option<String>,
    /// Exact GPU by PCI address, GPU UUID or index (repeatable)
    #[arg(long, value_name = "SEL")]
    pub device: Vec<String>,
    /// MIG compute instances instead of whole GPUs
    #[arg(long)]
    pub mig: bool,
    /// A shared slot of a GPU (the host's sharing policy; see "Sharing"); not with --mig
    #[arg(long, conflicts_with = "mig")]
    pub share: bool,
    /// compute,utility,graphics,video
    #[arg(long, value_name = "LIST")]
    pub capabilities: Option<String>,
    /// The host driver's user space: none (nodes only), cdi (from the vendor's CDI spec) or
    /// host (the running driver's files, found on the host)
    #[arg(long, value_parser = ["none", "cdi", "host"])]
    pub driver: Option<String>,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
    /// NAME is a libvirt LXC domain (its name or UUID)
    #[arg(long, conflicts_with_all = ["container", "vm"])]
    pub domain: bool,
    /// NAME is an OCI container's ID
    #[arg(long, conflicts_with = "vm")]
    pub container: bool,
    /// NAME is a virtual machine (a libvirt QEMU domain: refused, its GPUs are its
    /// <hostdev>s)
    #[arg(long)]
    pub vm: bool,
}

/// What `gpuhook detach` takes back: the GPUs named by `--device`, or `--all`.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["device", "all"])))]
pub struct DetachArgs {
    /// Domain name or UUID, or OCI container ID
    pub name: String,
    /// A GPU it holds, by PCI address, GPU UUID or index, or a MIG instance
    /// (0000:3b:00.0/gi1/ci0) (repeatable)
    #[arg(long, value_name = "SEL", conflicts_with = "all")]
    pub device: Vec<String>,
    /// Every GPU it holds (instead of --device)
    #[arg(long)]
    pub all: bool,
    /// Detach even while a process of the container has the GPU open (it keeps its open file)
    #[arg(long)]
    pub force: bool,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
    /// NAME is a libvirt LXC domain (its name or UUID)
    #[arg(long, conflicts_with_all = ["container", "vm"])]
    pub domain: bool,
    /// NAME is an OCI container's ID
    #[arg(long, conflicts_with = "vm")]
    pub container: bool,
    /// NAME is a virtual machine (a libvirt QEMU domain: refused, its GPUs are its
    /// <hostdev>s)
    #[arg(long)]
    pub vm: bool,
}

/// A running container the command names.
enum HotplugTarget {
    Libvirt(Domain),
    Oci(oci_container::Oci),
}

impl HotplugTarget {
    fn holder(&self) -> Holder<'_> {
        match self {
            HotplugTarget::Libvirt(d) => Holder::libvirt(&d.name, &d.uuid, &d.idmap),
            HotplugTarget::Oci(o) => Holder::oci(&o.id, &o.idmap),
        }
    }

    /// The host's facts for its lifecycle steps (an OCI container's device cgroup is its
    /// init's).
    fn facts<'a>(&self, cfg: &'a Config) -> World<'a> {
        match self {
            HotplugTarget::Libvirt(_) => World::real(cfg),
            HotplugTarget::Oci(_) => oci_container::facts(cfg),
        }
    }

    /// Finds the running container, as at `started` (libvirt) or from its init (OCI).
    fn find(&self) -> Result<Container, ContainerError> {
        match self {
            HotplugTarget::Libvirt(d) => container::find(&d.name, d.id),
            HotplugTarget::Oci(o) => {
                container::find_oci(o.init, o.userns(), o.namespaces).map(|c| Container {
                    made: o.made.clone(),
                    ..c
                })
            }
        }
    }
}

/// The container `name` names ([`lifecycle::resolve`]): among a running libvirt domain (by
/// name or UUID), an OCI container of that ID that gpuhook or its runtime knows, and a VM
/// whose reservation the state holds, the one `pick` allows; a name that more than one
/// answers to is refused, naming each, and so is a VM (its GPUs are its `<hostdev>`s). The
/// state is read as every command reads it: one that cannot be read fails the command.
fn target(cfg: &Config, name: &str, pick: Pick) -> Result<HotplugTarget, CliError> {
    let st: State = Store::new(&cfg.state_file)
        .read()
        .map_err(crate::reserve::error::Error::from)?;
    let dom = match pick.allows(HolderKind::Libvirt) {
        true => running_domain(container::LXC_STATE_DIRS.iter().map(Path::new), name)?,
        false => None,
    };
    let mut found: Vec<HolderId> = Vec::new();
    if let Some(d) = &dom {
        found.push(HolderId::Libvirt {
            name: d.name.clone(),
            uuid: d.uuid.clone(),
        });
    }
    // Whoever may define a domain must not catch, by its name, what is meant for a container
    // (nor make a container lose its GPUs to a `detach` meant for it).
    if pick.allows(HolderKind::Oci)
        && bundle::valid_id(name)
        && oci_container::known(cfg, &st, name)
    {
        found.push(oci_container::container(name));
    }
    found.extend(
        st.reservations
            .values()
            .filter(|r| r.kind() == HolderKind::Vm)
            .filter(|r| crate::reserve::reconcile::stale_reason(r).is_none())
            .map(|r| r.holder.clone()),
    );
    // A running VM with no reservation (libvirt's status directory): refused all the same.
    if pick.allows(HolderKind::Vm) {
        let (vms, _) = crate::host::qemu::running_all(cfg, crate::host::procfs::REAL);
        for v in vms {
            let id = HolderId::Vm {
                name: v.status.domain.name,
                uuid: v.status.domain.uuid,
            };
            if !found.contains(&id) {
                found.push(id);
            }
        }
    }
    let nobody = || {
        let name = name.to_string();
        match pick {
            Pick::Any => CliError::NoContainer { name },
            Pick::Only(HolderKind::Libvirt) => CliError::NoDomain { name },
            Pick::Only(HolderKind::Oci) => CliError::NoOciContainer { name },
            Pick::Only(HolderKind::Vm) => CliError::NoVm { name },
            // No option names a pod's allocation: its container is an OCI container.
            Pick::Only(HolderKind::Pod) => CliError::NoContainer { name },
        }
    };
    match lifecycle::resolve(name, pick, found)? {
        Some(HolderId::Libvirt { .. }) => dom.map(HotplugTarget::Libvirt).ok_or_else(nobody),
        Some(HolderId::Oci { id }) => match oci_container::find(cfg, &st, &id)? {
            Some(o) => Ok(HotplugTarget::Oci(o)),
            None => Err(nobody()),
        },
        Some(vm @ HolderId::Vm { .. }) => Err(CliError::HotplugVm { who: vm.who() }),
        Some(HolderId::Pod { .. }) | None => Err(nobody()),
    }
}

/// The live `<domain>` of a running libvirt LXC domain named `name` (or of UUID `name`), from
/// the status files in `dirs`; `None` when none runs.
pub fn running_domain<'a>(
    dirs: impl Iterator<Item = &'a Path> + Clone,
    name: &str,
) -> Result<Option<Domain>, CliError> {
    // A UUID first, as virsh looks a domain up: one *named* like another's UUID does not
    // capture the commands meant for that one.
    if let Some(uuid) = normalize_uuid(name) {
        if let Some(d) = by_uuid(dirs.clone(), &uuid)? {
            return Ok(Some(d));
        }
    }
    if !container::safe_name(name) {
        return Ok(None);
    }
    for d in dirs {
        let p = d.join(format!("{name}.xml"));
        if let Some(xml) = status_domain(&p)? {
            let dom = parsed(&p, &xml)?;
            // libvirt names the file after the domain: the one in it must be that one.
            return Ok((dom.name == name).then_some(dom));
        }
    }
    Ok(None)
}

/// The running domain of this UUID among the status files in `dirs`.
fn by_uuid<'a>(
    dirs: impl Iterator<Item = &'a Path>,
    uuid: &str,
) -> Result<Option<Domain>, CliError> {
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_none_or(|x| x != "xml") {
                continue;
            }
            if let Some(xml) = status_domain(&p)? {
                if metadata::domain_uuid(&xml).as_deref() == Some(uuid) {
                    let dom = parsed(&p, &xml)?;
                    return Ok((dom.uuid == uuid).then_some(dom));
                }
            }
        }
    }
    Ok(None)
}

fn parsed(p: &Path, xml: &[u8]) -> Result<Domain, CliError> {
    metadata::parse_domain(xml).map_err(|source| CliError::StatusXml {
        path: p.to_path_buf(),
        source,
    })
}

/// The `<domain>…</domain>` of a status file, or `None` when there is no such file (or it
/// holds no domain: not a status file).
fn status_domain(p: &Path) -> Result<Option<Vec<u8>>, CliError> {
    let f = match std::fs::File::open(p) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(CliError::ReadStatus {
                path: p.to_path_buf(),
                source,
            })
        }
    };
    let mut bytes = Vec::new();
    f.take(metadata::MAX_XML as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| CliError::ReadStatus {
            path: p.to_path_buf(),
            source,
        })?;
    Ok(domain_element(&bytes).map(<[u8]>::to_vec))
}

/// The first `<domain …>` element through the last `</domain>`.
fn domain_element(b: &[u8]) -> Option<&[u8]> {
    let start = find(b, b"<domain ").or_else(|| find(b, b"<domain>"))?;
    let end_tag = b"</domain>";
    let end = b
        .windows(end_tag.len())
        .rposition(|w| w == end_tag)
        .filter(|e| *e > start)?;
    Some(&b[start..end + end_tag.len()])
}

fn find(b: &[u8], needle: &[u8]) -> Option<usize> {
    b.windows(needle.len()).position(|w| w == needle)
}

/// The request the options make, each checked as the XML's attribute of that name is.
pub fn attach_request(a: &AttachArgs) -> Result<Request, CliError> {
    let mut pairs = Pairs::new();
    let mut put = |key: &str, flag: &'static str, v: Option<String>| {
        if let Some(v) = v {
            pairs.insert(key.to_string(), (KeyFrom::Flag(flag), v));
        }
    };
    put("gpus", "--count", a.count.map(|c| c.to_string()));
    put("vendor", "--vendor", a.vendor.clone());
    put("arch", "--arch", a.arch.clone());
    put("model", "--model", a.model.clone());
    put(
        "devices",
        "--device",
        (!a.device.is_empty()).then(|| a.device.join(",")),
    );
    put("mig", "--mig", a.mig.then(|| "yes".to_string()));
    put("share", "--share", a.share.then(|| "yes".to_string()));
    put("capabilities", "--capabilities", a.capabilities.clone());
    put("driver", "--driver", a.driver.clone());
    Ok(oci::request(&pairs)?)
}

/// `detach`'s selectors: a MIG instance by its unit name, else what `--device` takes.
fn which(d: &DetachArgs) -> Result<Which, CliError> {
    if d.all {
        return Ok(Which::All);
    }
    let mut sels = Vec::new();
    for s in &d.device {
        match s.parse::<Unit>() {
            Ok(u) if u.is_mig() || u.is_slot() => sels.push(DeviceSel::Pci(u.to_string())),
            _ => sels.extend(oci::devices(s).map_err(|source| CliError::Selector {
                sel: s.clone(),
                source,
            })?),
        }
    }
    Ok(Which::Units(sels))
}

/// `gpuhook attach`.
pub fn attach(a: &AttachArgs) -> Result<i32, CliError> {
    let cfg = Config::load().map_err(crate::reserve::error::Error::from)?;
    let req = attach_request(a)?;
    let t = target(&cfg, &a.name, Pick::of(a.domain, a.container, a.vm))?;
    let h = t.holder();
    // A refusal says what to ask for instead in the options' words (`--mig`, `--share`).
    let got = lifecycle::attach(&t.facts(&cfg), &h, &req, || t.find())
        .map_err(|e| named(&h, e.in_words(Wording::Flag)))?;
    if a.json {
        println!("{}", attached_json(&h, &got));
    } else {
        for u in &got.units {
            println!("attached {u} to {}", h.who());
        }
        let nodes: Vec<&str> = got.nodes.iter().map(|n| n.node.path.as_str()).collect();
        if !nodes.is_empty() {
            println!("  device nodes: {}", nodes.join(" "));
        }
    }
    Ok(0)
}

/// `gpuhook detach`.
pub fn detach(d: &DetachArgs) -> Result<i32, CliError> {
    let cfg = Config::load().map_err(crate::reserve::error::Error::from)?;
    let which = which(d)?;
    let t = target(&cfg, &d.name, Pick::of(d.domain, d.container, d.vm))?;
    let h = t.holder();
    let got = lifecycle::detach(&t.facts(&cfg), &h, &which, d.force, || t.find())
        .map_err(|e| named(&h, e))?;
    if d.json {
        println!("{}", detached_json(&h, &got));
        return Ok(0);
    }
    for u in &got.units {
        println!("detached {u} from {}", h.who());
    }
    for (u, pids) in &got.kept_open {
        let pids: Vec<String> = pids.iter().map(|p| p.pid.to_string()).collect();
        println!(
            "{u}: process {} of the container keeps its open file (detached with --force)",
            pids.join(", ")
        );
    }
    for u in &got.draining {
        println!(
            "{u} is draining: a process still has it open; it is given to no one until closed"
        );
    }
    Ok(0)
}

/// A lifecycle's failure as the door says it: one of the device cgroup's names the container
/// (the cgroup's own words name only its path).
fn named(h: &Holder, e: crate::reserve::error::Error) -> CliError {
    use crate::enter::container::Refusal;
    match e {
        crate::reserve::error::Error::Cgroup(source) => CliError::HotplugCgroup {
            who: h.who(),
            source,
        },
        crate::reserve::error::Error::Container(ContainerError::Refused(
            Refusal::LeftNamespace { pid, kind },
        )) => CliError::OciLeftNamespace {
            id: h.name().to_string(),
            pid,
            which: kind.word(),
        },
        e => e.into(),
    }
}

fn holder_json(h: &Holder) -> serde_json::Value {
    let (_, uuid) = h.id.domain_and_uuid();
    serde_json::json!({"kind": h.kind(), "name": h.name(), "uuid": uuid})
}

fn attached_json(h: &Holder, a: &Attached) -> serde_json::Value {
    serde_json::json!({
        "holder": holder_json(h),
        "attached": a.units,
        "devices": a.nodes.iter().map(|n| n.node.path.as_str()).collect::<Vec<_>>(),
    })
}

fn detached_json(h: &Holder, d: &Detached) -> serde_json::Value {
    serde_json::json!({
        "holder": holder_json(h),
        "detached": d.units,
        "kept_open": d.kept_open.iter().map(|(u, p)| serde_json::json!({
            "unit": u,
            "pids": p.iter().map(|p| p.pid).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "draining": d.draining,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "<!--\nWARNING: THIS IS AN AUTO-GENERATED FILE.\n-->\n\n<domstatus state='running' reason='booted' pid='29936'>\n  <init pid='29937'/>\n  <domain type='lxc' id='29936'>\n    <name>web1</name>\n    <uuid>4c7f30aa-ffe6-489b-80ff-0f27ece176a3</uuid>\n    <memory unit='KiB'>65536</memory>\n    <os>\n      <type arch='x86_64'>exe</type>\n      <init>/bin/sh</init>\n    </os>\n  </domain>\n  <cgroup/>\n</domstatus>\n";

    #[test]
    fn a_running_domain_by_name_or_uuid() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("web1.xml"), STATUS).unwrap();
        std::fs::write(t.path().join("web1.pid"), "29936\n").unwrap();
        let dirs = [t.path()];
        let d = running_domain(dirs.iter().copied(), "web1")
            .unwrap()
            .unwrap();
        assert_eq!((d.name.as_str(), d.id), ("web1", Some(29936)));
        let by_uuid = running_domain(dirs.iter().copied(), "4C7F30AA-FFE6-489B-80FF-0F27ECE176A3")
            .unwrap()
            .unwrap();
        assert_eq!(by_uuid.uuid, "4c7f30aa-ffe6-489b-80ff-0f27ece176a3");
        assert!(running_domain(dirs.iter().copied(), "web2")
            .unwrap()
            .is_none());
        // A domain named like web1's UUID does not capture it; a file that is not its
        // domain's own is no domain of that name.
        let uuid = "4c7f30aa-ffe6-489b-80ff-0f27ece176a3";
        std::fs::write(
            t.path().join(format!("{uuid}.xml")),
            STATUS
                .replace(uuid, "5d8041bb-0000-4000-8000-000000000001")
                .replace("<name>web1</name>", &format!("<name>{uuid}</name>")),
        )
        .unwrap();
        let d = running_domain(dirs.iter().copied(), uuid).unwrap().unwrap();
        assert_eq!(d.name, "web1");
        std::fs::write(t.path().join("web3.xml"), STATUS).unwrap();
        assert!(running_domain(dirs.iter().copied(), "web3")
            .unwrap()
            .is_none());
        // A name that is a path is no domain's.
        assert!(running_domain(dirs.iter().copied(), "../web1")
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_broken_status_file_is_said() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(
            t.path().join("web1.xml"),
            "<domstatus><domain type='lxc'><name>web1</name></domain></domstatus>",
        )
        .unwrap();
        let e = running_domain([t.path()].iter().copied(), "web1").unwrap_err();
        assert!(e.to_string().contains("web1.xml"), "{e}");
    }

    #[test]
    fn attach_options_are_checked_as_attributes() {
        let a = AttachArgs {
            name: "web1".into(),
            arch: Some("ampere".into()),
            device: vec!["0000:3b:00.0".into(), "1".into()],
            ..Default::default()
        };
        let r = attach_request(&a).unwrap();
        assert_eq!(r.count, 2);
        assert_eq!(r.devices.len(), 2);
        let one = attach_request(&AttachArgs::default()).unwrap();
        assert_eq!((one.count, one.mig), (1, false));
        let bad = AttachArgs {
            capabilities: Some("teleport".into()),
            ..Default::default()
        };
        let e = attach_request(&bad).unwrap_err().to_string();
        assert!(e.starts_with("--capabilities: "), "{e}");
        let share = AttachArgs {
            share: true,
            ..Default::default()
        };
        assert!(attach_request(&share).unwrap().share);
        let both = AttachArgs {
            share: true,
            mig: true,
            ..Default::default()
        };
        // Conflicts in the words of the options, never the domain XML's.
        let said = |a: AttachArgs| attach_request(&a).unwrap_err().to_string();
        assert_eq!(
            said(AttachArgs {
                count: Some(1),
                device: vec!["0".into(), "1".into()],
                ..Default::default()
            }),
            "--count asks for 1 GPU, fewer than the 2 named by --device"
        );
        assert_eq!(
            said(AttachArgs {
                device: vec!["0000:3b:00.0".into(), "3b:00.0".into()],
                ..Default::default()
            }),
            "--device: '3b:00.0' is named twice"
        );
        assert_eq!(
            said(AttachArgs {
                device: vec!["0".into()],
                mig: true,
                ..Default::default()
            }),
            "--device names whole GPUs and --mig asks for MIG instances: a request is one or the other"
        );
        // (clap refuses --mig with --share before this, too.)
        assert_eq!(
            attach_request(&both).unwrap_err().to_string(),
            "MIG instances are never shared: --mig and --share cannot be asked for together"
        );
    }
}
