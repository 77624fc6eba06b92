//! `gpuhook metrics`: the host's GPUs and reservations in the Prometheus text exposition
//! format (version 0.0.4), for node_exporter's textfile collector. Pure: inventory and state
//! in, text out; the CLI writes it (atomically with `--output`).

use crate::host::inventory::Inventory;
use crate::ids::Unit;
use crate::reserve::state::{HolderKind, Phase, State};
use crate::reserve::vm::PassedThrough;
use std::fmt::Write;

/// A label value, escaped as the exposition format wants (`\`, `"`, newline).
fn esc(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn family(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} gauge");
}

fn counter(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} counter");
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: u64) {
    let l: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", esc(v)))
        .collect();
    let _ = writeln!(out, "{name}{{{}}} {value}", l.join(","));
}

/// The exposition text.
pub fn render(inv: &Inventory, st: &State) -> String {
    render_with(inv, st, &PassedThrough::default())
}

/// [`render`], with what running VMs pass through without a reservation (`passed`, libvirt's
/// status XML): their GPUs shown held by them (kind `vm`).
pub fn render_with(inv: &Inventory, st: &State, passed: &PassedThrough) -> String {
    let mut out = String::new();
    gpu_info(&mut out, inv);
    gpu_reserved(&mut out, inv, st, passed);
    gpu_health(&mut out, inv, st);
    gpu_recovery(&mut out, inv, st);
    mig_reserved(&mut out, inv, st);
    shared_slots(&mut out, inv, st);
    link_degraded(&mut out, inv);
    reservations(&mut out, st);
    out
}

/// `gpuhook_gpu_info`: each GPU, its names.
fn gpu_info(out: &mut String, inv: &Inventory) {
    family(
        out,
        "gpuhook_gpu_info",
        "A GPU of this host, as gpuhook sees it (value 1).",
    );
    for g in &inv.gpus {
        let numa = g.numa_node.map(|n| n.to_string()).unwrap_or_default();
        sample(
            out,
            "gpuhook_gpu_info",
            &[
                ("pci", &g.pci),
                ("index", &g.index.to_string()),
                ("vendor", g.vendor.as_str()),
                ("model", &g.model),
                ("arch", g.arch.as_deref().unwrap_or("")),
                ("numa_node", &numa),
            ],
            1,
        );
    }
}

/// `gpuhook_gpu_reserved`: each GPU's holder.
fn gpu_reserved(out: &mut String, inv: &Inventory, st: &State, passed: &PassedThrough) {
    family(
        out,
        "gpuhook_gpu_reserved",
        "Whether the GPU is reserved (1) and by which holder (kind libvirt, oci or vm, or shared: its sharers, comma-separated; vm also for VMs' mediated devices, and for a running VM that passes it through without a reservation; empty when free).",
    );
    for g in &inv.gpus {
        let names: Vec<String> = st
            .slots_of(g.pci)
            .into_iter()
            .map(|(_, r)| r.holder.shown_name().into_owned())
            .collect();
        let joined = names.join(",");
        // VMs' mediated devices of it, reserved or passed through.
        let mut vms: Vec<&str> = st
            .reservations
            .values()
            .filter(|r| r.gpus.iter().any(|u| u.is_mdev() && u.pci() == g.pci))
            .map(|r| r.holder.name())
            .collect();
        if let Some((_, vm)) = passed.of_gpu(g.pci, None) {
            if !vms.contains(&vm.name.as_str()) {
                vms.push(&vm.name);
            }
        }
        let vms = vms.join(",");
        let whole = st
            .holder_of(&Unit::Gpu(g.pci))
            .map(|r| (r.kind().as_str(), r.holder.shown_name()));
        let (kind, holder, v) = match &whole {
            Some((kind, name)) => (*kind, name.as_ref(), 1),
            None if !names.is_empty() => ("shared", joined.as_str(), 1),
            None if !vms.is_empty() => (HolderKind::Vm.as_str(), vms.as_str(), 1),
            None => ("", "", 0),
        };
        sample(
            out,
            "gpuhook_gpu_reserved",
            &[("pci", &g.pci), ("kind", kind), ("holder", holder)],
            v,
        );
    }
}

/// `gpuhook_gpu_usable`, `gpuhook_gpu_quarantined`, `gpuhook_gpu_draining`.
fn gpu_health(out: &mut String, inv: &Inventory, st: &State) {
    family(
        out,
        "gpuhook_gpu_usable",
        "Whether the GPU can be given to a container (present, driver and node usable, not excluded).",
    );
    for g in &inv.gpus {
        sample(
            out,
            "gpuhook_gpu_usable",
            &[("pci", &g.pci)],
            u64::from(g.usable()),
        );
    }
    family(
        out,
        "gpuhook_gpu_quarantined",
        "Whether the GPU is quarantined after an NVIDIA Xid error (gpuhook health scan); xid names it.",
    );
    for g in &inv.gpus {
        let q = st.quarantine.get(g.pci.as_str());
        let xid = q
            .and_then(|q| q.xid)
            .map(|x| x.to_string())
            .unwrap_or_default();
        sample(
            out,
            "gpuhook_gpu_quarantined",
            &[("pci", &g.pci), ("xid", &xid)],
            u64::from(q.is_some()),
        );
    }
    family(
        out,
        "gpuhook_gpu_draining",
        "Whether the GPU (or one of its MIG instances) is draining: freed while a process still has it open, given to no one until it is closed.",
    );
    for g in &inv.gpus {
        let pids = crate::reserve::drain::pids_of(st, g.pci);
        sample(
            out,
            "gpuhook_gpu_draining",
            &[("pci", &g.pci)],
            u64::from(!pids.is_empty()),
        );
    }
}

/// docs/guides/health.md: `gpuhook_gpu_xid_total`,
/// `gpuhook_gpu_resets_total`, and the states a GPU is unusable in besides quarantine
/// (`gpuhook_gpu_needs_inspection`, `gpuhook_gpu_resetting`, `gpuhook_gpu_scrub_pending`).
fn gpu_recovery(out: &mut String, inv: &Inventory, st: &State) {
    counter(
        out,
        "gpuhook_gpu_xid_total",
        "NVIDIA Xid errors gpuhook health scan read for the GPU, by Xid and the action NVIDIA's Xid catalog gives it (ignore, restart, reset, reboot).",
    );
    for (pci, h) in &st.health {
        for c in &h.xids {
            sample(
                out,
                "gpuhook_gpu_xid_total",
                &[
                    ("pci", pci),
                    ("xid", &c.xid.to_string()),
                    ("action", c.action.as_str()),
                ],
                c.count,
            );
        }
    }
    counter(
        out,
        "gpuhook_gpu_resets_total",
        "Resets of the GPU (gpuhook health reset, auto_reset, reset_on_release): result ok when every probe after it passed, failed otherwise.",
    );
    // Every GPU listed, and every address the state counts resets of.
    let mut pcis: Vec<String> = inv.gpus.iter().map(|g| g.pci.to_string()).collect();
    for (pci, h) in &st.health {
        if (h.resets_ok > 0 || h.resets_failed > 0) && !pcis.contains(pci) {
            pcis.push(pci.clone());
        }
    }
    for pci in &pcis {
        let h = st.health.get(pci);
        for (result, n) in [
            ("ok", h.map_or(0, |h| h.resets_ok)),
            ("failed", h.map_or(0, |h| h.resets_failed)),
        ] {
            sample(
                out,
                "gpuhook_gpu_resets_total",
                &[("pci", pci), ("result", result)],
                n,
            );
        }
    }
    for (name, help, of) in [
        (
            "gpuhook_gpu_needs_inspection",
            "Whether the GPU was quarantined max_quarantines times within 24 hours: it stays quarantined until gpuhook health clear.",
            (&|pci: &str| st.quarantine.get(pci).is_some_and(|q| q.needs_inspection))
                as &dyn Fn(&str) -> bool,
        ),
        (
            "gpuhook_gpu_resetting",
            "Whether a reset of the GPU is under way (or was killed before it ended): it is given to no one.",
            &|pci: &str| {
                st.health
                    .get(pci)
                    .is_some_and(|h| h.resetting.is_some())
            },
        ),
        (
            "gpuhook_gpu_scrub_pending",
            "Whether the GPU was freed with reset_on_release and waits for its reset: it is given to no one.",
            &|pci: &str| crate::reserve::health::scrub_pending(st, pci),
        ),
    ] {
        family(out, name, help);
        for g in &inv.gpus {
            sample(out, name, &[("pci", &g.pci)], u64::from(of(g.pci.as_str())));
        }
    }
}

/// `gpuhook_mig_reserved`, when some GPU has MIG instances.
fn mig_reserved(out: &mut String, inv: &Inventory, st: &State) {
    if !inv.gpus.iter().any(|g| !g.migs.is_empty()) {
        return;
    }
    family(
        out,
        "gpuhook_mig_reserved",
        "Whether a MIG compute instance is reserved (1) and by which holder (empty when free).",
    );
    for g in &inv.gpus {
        for m in &g.migs {
            let id = m.id(g.pci);
            let held = st
                .holder_of(&id)
                .map(|r| (r.kind().as_str(), r.holder.shown_name()));
            let (kind, holder, v) = match &held {
                Some((kind, name)) => (*kind, name.as_ref(), 1),
                None => ("", "", 0),
            };
            sample(
                out,
                "gpuhook_mig_reserved",
                &[
                    ("pci", &g.pci),
                    ("gi", &m.gi.to_string()),
                    ("ci", &m.ci.to_string()),
                    ("kind", kind),
                    ("holder", holder),
                ],
                v,
            );
        }
    }
}

/// `gpuhook_gpu_shared_slots` and `gpuhook_gpu_shared_used`, when some GPU is shared.
fn shared_slots(out: &mut String, inv: &Inventory, st: &State) {
    let held = st.held(None);
    // Also a GPU whose sharing was taken out of the config while slots are held (replicas 0).
    let shared: Vec<_> = inv
        .gpus
        .iter()
        .filter_map(|g| match g.sharing {
            Some(s) => Some((g, s)),
            None if crate::reserve::alloc::slots_of(&held, g.pci)
                .next()
                .is_some() =>
            {
                Some((g, crate::host::config::Sharing::timeslice(0)))
            }
            None => None,
        })
        .collect();
    if shared.is_empty() {
        return;
    }
    family(
        out,
        "gpuhook_gpu_shared_slots",
        "How many slots a shared GPU is given as (its replicas); mode timeslice or mps.",
    );
    for (g, s) in &shared {
        sample(
            out,
            "gpuhook_gpu_shared_slots",
            &[("pci", &g.pci), ("mode", s.mode.as_str())],
            u64::from(s.replicas),
        );
    }
    family(
        out,
        "gpuhook_gpu_shared_used",
        "How many slots of a shared GPU are reserved.",
    );
    for (g, _) in &shared {
        let used = crate::reserve::alloc::slots_of(&held, g.pci).count();
        sample(
            out,
            "gpuhook_gpu_shared_used",
            &[("pci", &g.pci)],
            used as u64,
        );
    }
}

/// `gpuhook_gpu_link_degraded`, when the scan read some GPU's link.
fn link_degraded(out: &mut String, inv: &Inventory) {
    if !inv.gpus.iter().any(|g| g.link.is_some()) {
        return;
    }
    family(
        out,
        "gpuhook_gpu_link_degraded",
        "Whether the GPU's PCIe link runs below its maximum speed or width (idle GPUs lower their speed).",
    );
    for g in &inv.gpus {
        if let Some(l) = &g.link {
            sample(
                out,
                "gpuhook_gpu_link_degraded",
                &[("pci", &g.pci)],
                u64::from(l.degraded()),
            );
        }
    }
}

/// `gpuhook_reservations`: how many, by holder kind and phase.
fn reservations(out: &mut String, st: &State) {
    family(
        out,
        "gpuhook_reservations",
        "Reservations in the state, by holder kind and phase.",
    );
    for kind in HolderKind::EVERY {
        for (phase, name) in [(Phase::Prepared, "prepared"), (Phase::Running, "running")] {
            let n = st
                .reservations
                .values()
                .filter(|r| r.kind() == kind && r.phase == phase)
                .count();
            sample(
                out,
                "gpuhook_reservations",
                &[("kind", kind.as_str()), ("phase", name)],
                n as u64,
            );
        }
    }
}

/// The driver families (docs/guides/driver.md):
/// `gpuhook_container_driver_outdated{kind,domain,uuid}`, for each reservation that recorded
/// the NVIDIA driver version its container got, 1 when the host runs another now (`host`:
/// the running module's version, `None` when none is loaded: nothing to compare with, 0);
/// `gpuhook_cdi_spec_stale{spec}`, for each CDI spec file (`specs`: its path and whether an
/// entry of it is stale, as `gpuhook cdi check` says).
pub fn render_driver(st: &State, host: Option<&str>, specs: &[(String, bool)]) -> String {
    let mut out = String::new();
    family(
        &mut out,
        "gpuhook_container_driver_outdated",
        "Whether a running container got the files of another NVIDIA driver than the host runs now (1: restart it for the new driver's).",
    );
    for r in st.reservations.values() {
        let Some(v) = r.driver_version.as_deref() else {
            continue;
        };
        let outdated = host.is_some_and(|h| h != v);
        let (domain, uuid) = match r.kind() {
            // A pod's allocation ID is the key to its units: never whole in metrics.
            HolderKind::Pod => (r.holder.shown_name(), r.holder.shown_name()),
            _ => {
                let (d, u) = r.holder.domain_and_uuid();
                (d.into(), u.into())
            }
        };
        sample(
            &mut out,
            "gpuhook_container_driver_outdated",
            &[
                ("kind", r.kind().as_str()),
                ("domain", &domain),
                ("uuid", &uuid),
            ],
            u64::from(outdated),
        );
    }
    family(
        &mut out,
        "gpuhook_cdi_spec_stale",
        "Whether a CDI spec names files or nodes the host no longer has, another NVIDIA driver's files, or GPUs it no longer has (gpuhook cdi check).",
    );
    for (path, stale) in specs {
        sample(
            &mut out,
            "gpuhook_cdi_spec_stale",
            &[("spec", path)],
            u64::from(*stale),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_on_an_older_driver_and_stale_specs() {
        let mut st = State::default();
        for (id, v) in [
            ("a", Some("550.54.15")),
            ("b", Some("560.28.03")),
            ("c", None),
        ] {
            let mut r: crate::reserve::state::Reservation =
                serde_json::from_value(serde_json::json!({
                    "kind": "oci", "domain": id, "uuid": id, "gpus": ["0000:10:00.0"],
                    "phase": "running", "request": "1 GPU", "created": "x", "updated": "x",
                }))
                .unwrap();
            r.driver_version = v.map(str::to_owned);
            st.insert(r);
        }
        let t = render_driver(
            &st,
            Some("560.28.03"),
            &[
                ("/etc/cdi/nvidia.yaml".into(), true),
                ("/var/run/cdi/amd.json".into(), false),
            ],
        );
        assert!(
            t.contains(
                "gpuhook_container_driver_outdated{kind=\"oci\",domain=\"a\",uuid=\"a\"} 1\n"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "gpuhook_container_driver_outdated{kind=\"oci\",domain=\"b\",uuid=\"b\"} 0\n"
            ),
            "{t}"
        );
        assert!(!t.contains("domain=\"c\""), "{t}");
        assert!(
            t.contains("gpuhook_cdi_spec_stale{spec=\"/etc/cdi/nvidia.yaml\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("gpuhook_cdi_spec_stale{spec=\"/var/run/cdi/amd.json\"} 0\n"),
            "{t}"
        );
        // No module loaded: nothing is said to be out of date.
        assert!(!render_driver(&st, None, &[]).contains("} 1\n"));
    }

    #[test]
    fn shared_gpus_count_their_slots() {
        use crate::reserve::alloc::tests::{gpu, unit};
        let mut inv = Inventory {
            gpus: vec![
                gpu(0, Some(0), "sw0", crate::ids::Vendor::Nvidia, "fermi"),
                gpu(1, Some(0), "sw0", crate::ids::Vendor::Nvidia, "fermi"),
            ],
            ..Default::default()
        };
        assert!(!render(&inv, &State::default()).contains("gpuhook_gpu_shared"));
        inv.gpus[1].sharing = Some(crate::host::config::Sharing::timeslice(3));
        let mut st = State::default();
        let mut r: crate::reserve::state::Reservation = serde_json::from_value(serde_json::json!({
            "domain": "a", "uuid": "u-a", "gpus": ["0000:11:00.0/slot0"], "phase": "running",
            "request": "1 shared GPU slot", "created": "x", "updated": "x"
        }))
        .unwrap();
        st.insert(r.clone());
        r.holder = crate::reserve::state::HolderId::Libvirt {
            name: "a".into(),
            uuid: "u-b".into(),
        };
        r.gpus = vec![unit("0000:11:00.0/slot1")];
        st.insert(r);
        let t = render(&inv, &st);
        assert!(
            t.contains("gpuhook_gpu_shared_slots{pci=\"0000:11:00.0\",mode=\"timeslice\"} 3\n"),
            "{t}"
        );
        assert!(
            t.contains("gpuhook_gpu_shared_used{pci=\"0000:11:00.0\"} 2\n"),
            "{t}"
        );
        assert!(
            !t.contains("gpuhook_gpu_shared_used{pci=\"0000:10:00.0\""),
            "{t}"
        );
        assert!(
            t.contains(
                "gpuhook_gpu_reserved{pci=\"0000:11:00.0\",kind=\"shared\",holder=\"a,a\"} 1\n"
            ),
            "{t}"
        );
        // Its sharing taken out of the config while held: still counted, replicas 0.
        inv.gpus[1].sharing = None;
        let t = render(&inv, &st);
        assert!(
            t.contains("gpuhook_gpu_shared_slots{pci=\"0000:11:00.0\",mode=\"timeslice\"} 0\n"),
            "{t}"
        );
        assert!(
            t.contains("gpuhook_gpu_shared_used{pci=\"0000:11:00.0\"} 2\n"),
            "{t}"
        );
    }

    /// A pod's allocation ID is the key to its units (`gpuhook.io/allocation`): metrics,
    /// which node_exporter serves to whoever reaches it, name it by 8 characters only.
    #[test]
    fn metrics_never_show_a_pods_allocation_id() {
        use crate::reserve::alloc::tests::gpu;
        const A: &str = "0123456789abcdef0123456789abcdef";
        let inv = Inventory {
            gpus: vec![gpu(0, Some(0), "sw0", crate::ids::Vendor::Nvidia, "fermi")],
            ..Default::default()
        };
        let mut st = State::default();
        let mut r: crate::reserve::state::Reservation = serde_json::from_value(serde_json::json!({
            "domain": "x", "uuid": "x", "gpus": ["0000:10:00.0"], "phase": "running",
            "request": "gpuhook.io/gpu: 0000:10:00.0", "created": "x", "updated": "x",
            "driver_version": "550.54.15"
        }))
        .unwrap();
        r.holder = crate::reserve::state::HolderId::Pod {
            alloc: A.into(),
            pod: Box::default(),
        };
        st.insert(r);
        let t = render(&inv, &st);
        assert!(
            t.contains(
                "gpuhook_gpu_reserved{pci=\"0000:10:00.0\",kind=\"pod\",holder=\"01234567…\"} 1\n"
            ),
            "{t}"
        );
        assert!(!t.contains(A), "{t}");
        assert!(!t.contains(&A[..9]), "{t}");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(esc(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(esc("x\ny"), "x\\ny");
        let mut s = String::new();
        sample(&mut s, "m", &[("model", "Tesla \"M\"")], 1);
        assert_eq!(s, "m{model=\"Tesla \\\"M\\\"\"} 1\n");
    }
}
