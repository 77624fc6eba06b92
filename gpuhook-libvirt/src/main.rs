//! `gpuhook-libvirt`: gpuhook's companion that talks to libvirt (the hook itself never may:
//! libvirtd holds the domain lock while it runs).
//!
//! - `reconcile [--dry-run]`: free reservations of domains libvirt no longer runs (LXC
//!   domains by the LXC driver, VMs by the QEMU driver).
//! - `request DOMAIN --count N …`: set (or `--clear`) a defined LXC domain's GPU request
//!   through `virDomainSetMetadata`, validated by the hook's own parser; for a QEMU domain,
//!   write the GPUs chosen now as `<hostdev>` elements into its definition ([`vm`]).

use clap::Parser;
use gpuhook::doors::cli::{LibvirtCli, LibvirtCommand, RequestArgs};
use gpuhook::host::config::Config;
use gpuhook::host::procfs::ProcRef;
use gpuhook::request::metadata::{self, NS};
use gpuhook::reserve::reconcile;
use gpuhook::reserve::state::Store;
use std::collections::HashSet;
use std::process::ExitCode;
use virt::connect::Connect;
use virt::domain::Domain;
use virt::sys;

mod vm;

/// The LXC driver's URI when `-c` names none.
const LXC_URI: &str = "lxc:///system";

fn main() -> ExitCode {
    let cli = LibvirtCli::parse();
    if let Some(c) = &cli.config {
        std::env::set_var(gpuhook::host::config::ENV, c);
    }
    let r = match cli.command {
        LibvirtCommand::Reconcile { dry_run } => reconcile(&cli, dry_run),
        LibvirtCommand::Request {
            ref domain,
            ref request,
            clear,
            live,
        } => request_cmd(&cli, domain, (!clear).then_some(request.clone()), live),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuhook-libvirt: {e}");
            gpuhook::log::error(&format!("gpuhook-libvirt: {e}"));
            ExitCode::FAILURE
        }
    }
}

fn connect(uri: &str) -> Result<Connect, String> {
    Connect::open(Some(uri)).map_err(|e| format!("cannot connect to {uri}: {e}"))
}

/// The UUIDs of the domains `conn` runs.
fn running(conn: &Connect) -> Result<HashSet<String>, String> {
    Ok(conn
        .list_all_domains(sys::VIR_CONNECT_LIST_DOMAINS_ACTIVE)
        .map_err(|e| format!("listing domains: {e}"))?
        .iter()
        .filter_map(|d| d.uuid_string().ok())
        .map(|u| u.to_ascii_lowercase())
        .collect())
}

fn reconcile(cli: &LibvirtCli, dry_run: bool) -> Result<(), String> {
    let cfg = Config::load().map_err(|e| e.to_string())?;
    let store = Store::new(&cfg.state_file);
    let conn = connect(cli.connect.as_deref().unwrap_or(LXC_URI))?;
    let active = running(&conn)?;
    // The VMs the QEMU driver runs; without it, VMs are judged by their QEMU processes alone.
    let vms = match connect(&cli.qemu_connect).and_then(|c| running(&c)) {
        Ok(v) => Some(v),
        Err(e) => {
            let st = store.read().map_err(|e| e.to_string())?;
            if st
                .reservations
                .values()
                .any(|r| r.kind() == gpuhook::reserve::state::HolderKind::Vm)
            {
                eprintln!("gpuhook-libvirt: VMs are judged by their QEMU processes alone: {e}");
            }
            None
        }
    };
    let alive = |p: &ProcRef| p.alive();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let world = reconcile::LibvirtView {
        active: &active,
        vms: vms.as_ref(),
        now,
        seen: reconcile::Liveness {
            alive: &alive,
            controller: &reconcile::controller_running,
        },
    };
    let freed = if dry_run {
        let st = store.read().map_err(|e| e.to_string())?;
        reconcile::plan(&st, &world)
            .into_iter()
            .map(|(u, why)| (st.reservations[&u].clone(), why))
            .collect::<Vec<_>>()
    } else {
        // Decide again under the lock: a domain that started meanwhile is kept. Their GPUs
        // that a process still has open drain; draining ones nothing has open any more are
        // free again.
        let recheck = |st: &mut gpuhook::reserve::state::State| {
            gpuhook::reserve::drain::log_settled(&gpuhook::reserve::drain::recheck(st))
        };
        gpuhook::reserve::lifecycle::free(
            &gpuhook::reserve::world::World::real(&cfg),
            |st| reconcile::plan(st, &world),
            recheck,
        )
        .map_err(|e| e.to_string())?
        .freed
    };
    let verb = if dry_run { "would free" } else { "freed" };
    for (r, why) in &freed {
        let line = format!(
            "{verb} {} of {}: {why}",
            gpuhook::ids::Unit::join(&r.gpus, ","),
            r.holder.who_exactly()
        );
        println!("{line}");
        if !dry_run {
            gpuhook::log::info(&format!("reconcile: {line}"));
        }
    }
    if freed.is_empty() {
        println!("nothing to free: every reservation belongs to a running or starting domain");
    }
    Ok(())
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

/// The request element as `virDomainSetMetadata` takes it: libvirt itself puts the root in
/// gpuhook's namespace (prefix `gpu`), and only the root, so children declare it.
fn element(a: &RequestArgs) -> String {
    element_in(a, "gpus", "")
}

/// The element as libvirt stores and shows it (for validation with the hook's parser).
fn stored_element(a: &RequestArgs) -> String {
    element_in(a, "gpu:gpus", &format!(" xmlns:gpu=\"{NS}\""))
}

fn element_in(a: &RequestArgs, root: &str, decl: &str) -> String {
    let mut attrs = String::new();
    let mut add = |k: &str, v: &Option<String>| {
        if let Some(v) = v {
            attrs.push_str(&format!(" {k}=\"{}\"", esc(v)));
        }
    };
    add("count", &a.count.map(|c| c.to_string()));
    add("vendor", &a.vendor);
    add("arch", &a.arch);
    add("model", &a.model);
    add("capabilities", &a.capabilities);
    add("mode", &a.mode);
    add("uid", &a.uid.map(|c| c.to_string()));
    add("gid", &a.gid.map(|c| c.to_string()));
    add("mig", &a.mig.then(|| "yes".to_string()));
    add("share", &a.share.then(|| "yes".to_string()));
    add("driver", &a.driver);
    let children: String = a
        .device
        .iter()
        .map(|d| {
            let key = if gpuhook::ids::normalize_pci(d).is_some() {
                "pci"
            } else {
                "uuid"
            };
            format!("<gpu:device xmlns:gpu=\"{NS}\" {key}=\"{}\"/>", esc(d))
        })
        .collect();
    if children.is_empty() {
        format!("<{root}{decl}{attrs}/>")
    } else {
        format!("<{root}{decl}{attrs}>{children}</{root}>")
    }
}

fn lookup(conn: &Connect, name: &str) -> Result<Domain, String> {
    conn.lookup_domain_by_name(name)
        .or_else(|_| conn.lookup_domain_by_uuid_string(name))
        .map_err(|e| format!("no domain '{name}': {e}"))
}

/// `request`: on the domain `-c`'s URI knows (without `-c`: the LXC driver's, else the QEMU
/// driver's): an LXC domain's metadata, a QEMU domain's hostdevs.
fn request_cmd(
    cli: &LibvirtCli,
    name: &str,
    attrs: Option<RequestArgs>,
    live: bool,
) -> Result<(), String> {
    let (conn, dom) = match &cli.connect {
        Some(uri) => {
            let conn = connect(uri)?;
            let dom = lookup(&conn, name)?;
            (conn, dom)
        }
        None => match connect(LXC_URI).and_then(|c| lookup(&c, name).map(|d| (c, d))) {
            Ok(found) => found,
            Err(lxc) => {
                let conn = connect(&cli.qemu_connect).map_err(|e| format!("{lxc}; {e}"))?;
                let dom = lookup(&conn, name).map_err(|e| format!("{lxc}; {e}"))?;
                (conn, dom)
            }
        },
    };
    if vm::is_qemu(&dom)? {
        return vm::request(&conn, &dom, name, attrs.as_ref(), live);
    }
    if attrs.as_ref().is_some_and(|a| a.numa.is_some()) {
        return Err(format!(
            "domain '{name}': --numa is for a VM's request (an LXC domain's GPUs are chosen at its start)"
        ));
    }
    let active = dom.is_active().map_err(|e| e.to_string())?;
    let persistent = dom.is_persistent().map_err(|e| e.to_string())?;
    let mut flags = 0;
    if persistent {
        flags |= sys::VIR_DOMAIN_AFFECT_CONFIG;
    }
    if active && (live || !persistent) {
        flags |= sys::VIR_DOMAIN_AFFECT_LIVE;
    }
    let Some(a) = attrs else {
        dom.set_metadata(
            sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
            None,
            None,
            Some(NS),
            flags,
        )
        .map_err(|e| format!("domain '{name}': removing the GPU request: {e}"))?;
        println!("domain '{name}' asks for no GPUs now");
        return Ok(());
    };
    let elem = element(&a);
    // Validate with the hook's own parser, in the domain's real XML (its <idmap> matters).
    let stored = stored_element(&a);
    let xml = dom
        .xml_desc(if persistent {
            sys::VIR_DOMAIN_XML_INACTIVE
        } else {
            0
        })
        .map_err(|e| format!("domain '{name}': {e}"))?;
    let probe = with_request(&xml, &stored);
    let parsed =
        metadata::parse_domain(probe.as_bytes()).map_err(|e| format!("domain '{name}': {e}"))?;
    let req = parsed
        .request
        .ok_or_else(|| format!("domain '{name}': request did not parse back"))?;
    dom.set_metadata(
        sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
        Some(&elem),
        Some("gpu"),
        Some(NS),
        flags,
    )
    .map_err(|e| format!("domain '{name}': setting the GPU request: {e}"))?;
    let when = if active && flags & sys::VIR_DOMAIN_AFFECT_LIVE == 0 {
        " (from its next start)"
    } else {
        ""
    };
    println!("domain '{name}' now asks for {req}{when}");
    Ok(())
}

/// The domain XML with gpuhook's element in `<metadata>` (any earlier one removed).
fn with_request(xml: &str, elem: &str) -> String {
    let xml = match (xml.find("<metadata>"), xml.find("</metadata>")) {
        (Some(a), Some(b)) if b > a => {
            let inner = &xml[a + "<metadata>".len()..b];
            let kept = if metadata::mentions_gpuhook(inner.as_bytes()) {
                String::new()
            } else {
                inner.to_owned()
            };
            format!(
                "{}<metadata>{kept}{elem}</metadata>{}",
                &xml[..a],
                &xml[b + "</metadata>".len()..]
            )
        }
        _ => match xml.rfind("</domain>") {
            Some(i) => format!("{}<metadata>{elem}</metadata>{}", &xml[..i], &xml[i..]),
            None => xml.to_owned(),
        },
    };
    xml
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_forms() {
        let a = RequestArgs {
            count: Some(2),
            arch: Some("fermi".into()),
            model: Some("M<2050".into()),
            device: vec!["0000:07:00.0".into(), "GPU-abc".into()],
            ..Default::default()
        };
        let e = stored_element(&a);
        assert_eq!(e, "<gpu:gpus xmlns:gpu=\"urn:gpuhook:gpu:1\" count=\"2\" arch=\"fermi\" model=\"M&lt;2050\"><gpu:device xmlns:gpu=\"urn:gpuhook:gpu:1\" pci=\"0000:07:00.0\"/><gpu:device xmlns:gpu=\"urn:gpuhook:gpu:1\" uuid=\"GPU-abc\"/></gpu:gpus>");
        assert!(element(&a).starts_with("<gpus count=\"2\""));
        let dom = with_request("<domain type='lxc'><name>x</name><uuid>155e2a6a-e7c9-40ab-9e0e-8fd8636abd19</uuid></domain>", &e);
        let r = metadata::parse_domain(dom.as_bytes())
            .unwrap()
            .request
            .unwrap();
        assert_eq!(r.count, 2);
        assert_eq!(r.devices.len(), 2);
        // --mig: instances.
        let m = RequestArgs {
            count: Some(3),
            mig: true,
            ..Default::default()
        };
        let dom = with_request(
            "<domain type='lxc'><name>x</name><uuid>155e2a6a-e7c9-40ab-9e0e-8fd8636abd19</uuid></domain>",
            &stored_element(&m),
        );
        let r = metadata::parse_domain(dom.as_bytes())
            .unwrap()
            .request
            .unwrap();
        assert!(r.mig && r.count == 3, "{r}");
        // --share: slots of shared GPUs.
        let sh = RequestArgs {
            count: Some(2),
            share: true,
            ..Default::default()
        };
        let dom = with_request(
            "<domain type='lxc'><name>x</name><uuid>155e2a6a-e7c9-40ab-9e0e-8fd8636abd19</uuid></domain>",
            &stored_element(&sh),
        );
        let r = metadata::parse_domain(dom.as_bytes())
            .unwrap()
            .request
            .unwrap();
        assert!(r.share && !r.mig && r.count == 2, "{r}");
        // --driver cdi: the driver's user space.
        let c = RequestArgs {
            count: Some(1),
            driver: Some("cdi".into()),
            ..Default::default()
        };
        let dom = with_request(
            "<domain type='lxc'><name>x</name><uuid>155e2a6a-e7c9-40ab-9e0e-8fd8636abd19</uuid></domain>",
            &stored_element(&c),
        );
        let r = metadata::parse_domain(dom.as_bytes())
            .unwrap()
            .request
            .unwrap();
        assert_eq!(r.driver, Some(gpuhook::request::Driver::Cdi), "{r}");
    }
}
