//! The running driver's user space found on the host ([`crate::host::driver`]) as what both
//! front doors apply: a [`Plan`] (`driver="host"`), built here so that the mounts, links and
//! linker cache take the one path CDI's take; as a CDI spec (`gpuhook cdi generate`), for
//! engines that read CDI themselves; and the entries of vendors' specs that no longer match
//! the host (`gpuhook cdi check`).

use super::error::PlanError;
use super::model::{kind_of, BindMount, Device, Edits, Link, Loaded, Plan, Spec};
use super::plan::host_node_path;
use crate::host::driver::{version_shaped, DriverFileKind, DriverFound};
use crate::host::inventory::Inventory;
use crate::ids::Vendor;
use serde::Serialize;
use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The lowest CDI version that holds what [`spec`] writes: `hostPath` of device nodes came
/// in 0.5.0 (podman 4.3 and containerd 1.6 read it).
pub const GENERATED_VERSION: &str = "0.5.0";

/// The driver's files as a container gets them: each file bind-mounted read-only,
/// `nosuid,nodev` at the path it was found at (a socket also `noexec`); the SONAME links of
/// the libraries (`sonames`: a library's path → its `DT_SONAME`) and `libcuda.so` in their
/// directories; the linker cache for those directories.
pub fn plan(found: &DriverFound, sonames: &BTreeMap<String, String>) -> Result<Plan, PlanError> {
    let mut p = Plan {
        host_driver: Some(format!("the host's NVIDIA driver {}", found.version)),
        nvidia_version: Some(found.version.clone()),
        ..Default::default()
    };
    for f in &found.files {
        p.mounts.push(BindMount {
            source: f.source.to_string_lossy().into_owned(),
            target: f.path.clone(),
            rw: false,
            recursive: false,
            noexec: f.kind == DriverFileKind::Socket,
            dir: false,
        });
    }
    p.links = links(found, sonames);
    p.ld_folders = found.lib_dirs.clone();
    p.check()?;
    Ok(p)
}

/// The links `ldconfig` would make for the libraries (SONAME → file, in each library
/// directory), and `libcuda.so` → its SONAME (what nvidia-ctk's spec links too).
fn links(found: &DriverFound, sonames: &BTreeMap<String, String>) -> Vec<Link> {
    let mut out: Vec<Link> = Vec::new();
    let taken = |out: &[Link], link: &str| {
        out.iter().any(|l| l.link == link) || found.files.iter().any(|f| f.path == link)
    };
    for f in found.of(DriverFileKind::Library) {
        let Some((dir, file)) = f.path.rsplit_once('/') else {
            continue;
        };
        if !found.lib_dirs.iter().any(|d| d == dir) {
            continue;
        }
        let Some(so) = sonames.get(&f.path) else {
            continue;
        };
        let link = format!("{dir}/{so}");
        if so == file || so.contains('/') || so.is_empty() || taken(&out, &link) {
            continue;
        }
        out.push(Link {
            target: file.to_string(),
            link,
        });
        if file.starts_with("libcuda.so.") {
            let dev = format!("{dir}/libcuda.so");
            if !taken(&out, &dev) {
                out.push(Link {
                    target: so.clone(),
                    link: dev,
                });
            }
        }
    }
    out
}

// ---- `gpuhook cdi generate` ----

/// The CDI spec of `kind` `nvidia.com/gpu` for this host's NVIDIA GPUs and running driver:
/// one device per GPU named by its index (as `gpuhook list` numbers GPUs) and by its UUID,
/// one per MIG GPU instance (`INDEX:GI`: the GPU's node, the instance's capability and those
/// of its compute instances), and `all`; the control nodes and the driver's files
/// (read-only bind mounts) for every device, and two hooks that run `hook` (this gpuhook) as
/// `gpuhook cdi-hook create-symlinks` and `update-ldcache`, which gpuhook's own `driver="cdi"`
/// also does itself. Node host paths are under `dev` (the config's device root).
pub fn spec(
    found: &DriverFound,
    sonames: &BTreeMap<String, String>,
    inv: &Inventory,
    dev: &Path,
    hook: &str,
) -> Result<serde_json::Value, PlanError> {
    use serde_json::json;
    let plan = plan(found, sonames)?;
    let node = |path: &str| {
        let host = host_node_path(path, dev)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| path.to_string());
        json!({"path": path, "hostPath": host})
    };
    let devices = named_devices(inv);
    let devices: Vec<serde_json::Value> = devices
        .into_iter()
        .map(|(name, nodes)| {
            json!({
                "name": name,
                "containerEdits": {"deviceNodes": nodes.iter().map(|n| node(n)).collect::<Vec<_>>()},
            })
        })
        .collect();
    let controls: Vec<serde_json::Value> = inv
        .controls
        .iter()
        .filter(|(c, _)| !matches!(c, crate::host::inventory::Control::Kfd))
        .map(|(_, n)| node(&n.path))
        .collect();
    let mounts: Vec<serde_json::Value> = plan
        .mounts
        .iter()
        .map(|m| {
            let mut opts = vec!["ro", "nosuid", "nodev", "bind"];
            if m.noexec {
                opts.push("noexec");
            }
            json!({"hostPath": m.source, "containerPath": m.target, "options": opts})
        })
        .collect();
    let hooks = spec_hooks(&plan, hook);
    let mut edits = serde_json::Map::new();
    if !controls.is_empty() {
        edits.insert("deviceNodes".into(), controls.into());
    }
    edits.insert("mounts".into(), mounts.into());
    if !hooks.is_empty() {
        edits.insert("hooks".into(), hooks.into());
    }
    Ok(json!({
        "cdiVersion": GENERATED_VERSION,
        "kind": kind_of(Vendor::Nvidia),
        "devices": devices,
        "containerEdits": edits,
    }))
}

/// The spec's devices by name, with their nodes' paths: each NVIDIA GPU by index and UUID,
/// each MIG GPU instance (`INDEX:GI`), and `all`.
fn named_devices(inv: &Inventory) -> Vec<(String, Vec<String>)> {
    let mut devices: Vec<(String, Vec<String>)> = Vec::new();
    let mut all: Vec<String> = Vec::new();
    for g in inv.gpus.iter().filter(|g| g.vendor == Vendor::Nvidia) {
        let own: Vec<String> = g
            .nodes
            .iter()
            .filter(|(r, _)| *r == crate::host::inventory::Role::Nvidia)
            .map(|(_, n)| n.path.clone())
            .collect();
        if own.is_empty() {
            continue;
        }
        all.extend(own.iter().cloned());
        devices.push((g.index.to_string(), own.clone()));
        if let Some(u) = &g.uuid {
            devices.push((u.clone(), own.clone()));
        }
        let mut gis: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for m in &g.migs {
            let e = gis.entry(m.gi).or_insert_with(|| {
                let mut v = own.clone();
                v.push(m.gi_cap.path.clone());
                v
            });
            if !e.contains(&m.ci_cap.path) {
                e.push(m.ci_cap.path.clone());
            }
        }
        for (gi, nodes) in gis {
            for n in &nodes {
                if !all.contains(n) {
                    all.push(n.clone());
                }
            }
            devices.push((format!("{}:{gi}", g.index), nodes));
        }
    }
    if !all.is_empty() {
        devices.push(("all".into(), all));
    }
    devices
}

/// The spec's two hooks (`create-symlinks`, `update-ldcache`), each only when it has work.
fn spec_hooks(plan: &Plan, hook: &str) -> Vec<serde_json::Value> {
    use serde_json::json;
    let mut hooks = Vec::new();
    if !plan.links.is_empty() {
        let mut args = vec![
            "gpuhook".to_string(),
            "cdi-hook".into(),
            "create-symlinks".into(),
        ];
        for l in &plan.links {
            args.push("--link".into());
            args.push(format!("{}::{}", l.target, l.link));
        }
        hooks.push(json!({"hookName": "createContainer", "path": hook, "args": args}));
    }
    if !plan.ld_folders.is_empty() {
        let mut args = vec![
            "gpuhook".to_string(),
            "cdi-hook".into(),
            "update-ldcache".into(),
        ];
        for f in &plan.ld_folders {
            args.push("--folder".into());
            args.push(f.clone());
        }
        hooks.push(json!({"hookName": "createContainer", "path": hook, "args": args}));
    }
    hooks
}

// ---- `gpuhook cdi check` ----

/// One entry of a spec that does not match the host now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stale {
    /// The device whose edits name it (`None`: the spec's common edits).
    pub device: Option<String>,
    /// `mount`, `node`, `hook` or `device`.
    pub what: &'static str,
    /// The path (or the device name) it names.
    pub path: String,
    /// Why it is stale.
    pub why: String,
}

/// What [`check`] says of one spec file.
#[derive(Debug, Clone, Serialize)]
pub struct Checked {
    pub spec: PathBuf,
    pub kind: String,
    pub stale: Vec<Stale>,
}

/// The version a host path names as an NVIDIA driver's: `…/lib*.so.X.Y[.Z]` or
/// `…/firmware/nvidia/X.Y.Z/…`, with `X` of three digits or more (a driver's, not a
/// library's own version as `libnvidia-egl-wayland.so.1.1.13` has).
pub fn driver_version_of(path: &str) -> Option<&str> {
    let driverish = |v: &str| {
        version_shaped(v)
            && v.split('.')
                .next()
                .is_some_and(|m| m.len() >= 3 && !m.starts_with('0'))
    };
    if let Some((_, rest)) = path.split_once("/firmware/nvidia/") {
        let v = rest.split('/').next()?;
        return driverish(v).then_some(v);
    }
    let file = path.rsplit('/').next()?;
    let (_, v) = file.split_once(".so.")?;
    driverish(v).then_some(v)
}

/// Every entry of these specs that names a file or node the host no longer has, a file of
/// another NVIDIA driver than the running `version`, a hook for another driver's version,
/// or a GPU (by index, UUID or MIG instance) the host no longer has as the spec says.
pub fn check(specs: &[Loaded], version: Option<&str>, inv: &Inventory, dev: &Path) -> Vec<Checked> {
    specs
        .iter()
        .map(|l| Checked {
            spec: l.path.clone(),
            kind: l.spec.kind.clone(),
            stale: check_spec(&l.spec, version, inv, dev),
        })
        .collect()
}

fn check_spec(s: &Spec, version: Option<&str>, inv: &Inventory, dev: &Path) -> Vec<Stale> {
    let nvidia = s.kind == kind_of(Vendor::Nvidia);
    let mut out = Vec::new();
    if let Some(e) = &s.container_edits {
        check_edits(e, None, nvidia, version, dev, &mut out);
    }
    for d in s.devices.as_deref().unwrap_or_default() {
        if let Some(e) = &d.container_edits {
            check_edits(e, Some(&d.name), nvidia, version, dev, &mut out);
        }
        if nvidia {
            check_device(d, inv, &mut out);
        }
    }
    out
}

fn check_edits(
    e: &Edits,
    device: Option<&str>,
    nvidia: bool,
    version: Option<&str>,
    dev: &Path,
    out: &mut Vec<Stale>,
) {
    let stale = |what, path: &str, why: String| Stale {
        device: device.map(str::to_owned),
        what,
        path: path.to_string(),
        why,
    };
    for m in e.mounts.as_deref().unwrap_or_default() {
        if std::fs::metadata(&m.host_path).is_err() {
            out.push(stale("mount", &m.host_path, "does not exist".into()));
            continue;
        }
        if let (true, Some(run), Some(v)) = (nvidia, version, driver_version_of(&m.host_path)) {
            if v != run {
                out.push(stale(
                    "mount",
                    &m.host_path,
                    format!("is of NVIDIA driver {v}, the host runs {run}"),
                ));
            }
        }
    }
    for n in e.device_nodes.as_deref().unwrap_or_default() {
        let hp = n.host_path.as_deref().unwrap_or(&n.path);
        let Ok(host) = host_node_path(hp, dev) else {
            out.push(stale("node", hp, "is not an absolute path".into()));
            continue;
        };
        match std::fs::metadata(&host) {
            Err(_) => out.push(stale("node", hp, "does not exist".into())),
            Ok(md) if !md.file_type().is_char_device() => {
                out.push(stale("node", hp, "is not a character device".into()))
            }
            Ok(md) => {
                let (ma, mi) = (libc::major(md.rdev()), libc::minor(md.rdev()));
                let said = (n.major.unwrap_or(0), n.minor.unwrap_or(0));
                if said != (0, 0) && said != (i64::from(ma), i64::from(mi)) {
                    out.push(stale(
                        "node",
                        hp,
                        format!("is {ma}:{mi}, the spec says {}:{}", said.0, said.1),
                    ));
                }
            }
        }
    }
    if let (true, Some(run)) = (nvidia, version) {
        for h in e.hooks.as_deref().unwrap_or_default() {
            for a in h.args.as_deref().unwrap_or_default() {
                if let Some(v) = a.strip_prefix("--host-driver-version=") {
                    if v != run {
                        out.push(stale("hook", &h.path, format!("{a}: the host runs {run}")));
                    }
                }
            }
        }
    }
}

/// A device named as nvidia-ctk and `gpuhook cdi generate` name them (an index, a UUID,
/// `INDEX:GI`): the host has that GPU (or instance), and the device's nodes hold its node.
fn check_device(d: &Device, inv: &Inventory, out: &mut Vec<Stale>) {
    let name = d.name.as_str();
    if name == "all" {
        return;
    }
    let nodes: Vec<String> = d
        .container_edits
        .as_ref()
        .and_then(|e| e.device_nodes.as_ref())
        .map(|n| n.iter().map(|x| x.path.clone()).collect())
        .unwrap_or_default();
    let (gpu, gi) = match name.split_once(':') {
        Some((i, g)) => (i, g.parse::<u32>().ok()),
        None => (name, None),
    };
    let found = if let Ok(i) = gpu.parse::<usize>() {
        inv.gpus.iter().find(|g| g.index == i)
    } else if gpu.starts_with("GPU-") {
        inv.gpus.iter().find(|g| g.uuid.as_deref() == Some(gpu))
    } else {
        // A name of another scheme: only its nodes are checked.
        return;
    };
    let mut stale = |why: String| {
        out.push(Stale {
            device: Some(name.to_string()),
            what: "device",
            path: name.to_string(),
            why,
        })
    };
    let Some(g) = found.filter(|g| g.vendor == Vendor::Nvidia) else {
        stale("the host has no such NVIDIA GPU".into());
        return;
    };
    let own = g
        .nodes
        .iter()
        .find(|(r, _)| *r == crate::host::inventory::Role::Nvidia)
        .map(|(_, n)| n.path.clone());
    match own {
        Some(o) if nodes.contains(&o) => {}
        Some(o) => stale(format!(
            "that GPU is {} ({o}) now, the spec gives {}",
            g.pci,
            nodes.join(" ")
        )),
        None => stale(format!("GPU {} has no node now", g.pci)),
    }
    if let Some(gi) = gi {
        if !g.migs.iter().any(|m| m.gi == gi) {
            stale(format!("GPU {} has no MIG GPU instance {gi} now", g.pci));
        }
    }
}
