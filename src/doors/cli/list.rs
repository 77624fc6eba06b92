//! `gpuhook list`: the GPUs and who holds them, as a table or as JSON. A reservation whose
//! holder is gone (stale: the next request that needs its units reclaims it) is listed as
//! such, never as a live holder.

use super::common::load_with_vms;
use crate::host::inventory::{Gpu, Inventory};
use crate::ids::Unit;
use crate::reserve::error::Error;
use crate::reserve::state::{HolderId, HolderKey, HolderKind, Reservation, State};
use crate::reserve::vm::PassedThrough;
use serde_json::json;
use std::collections::HashMap;

/// A GPU's mediated device: its reservation and why its holder is gone (`None`: a running VM
/// passes it through without one).
type MdevHeld<'a, 'b> = (Unit, Option<(&'a Reservation, Option<&'b str>)>);

/// The state's reservations with, for each, why its holder is gone (`None`: it lives),
/// looked at once per listing.
struct Holders<'a> {
    st: &'a State,
    stale: HashMap<&'a HolderKey, Option<String>>,
    /// The NVIDIA driver the host runs now (`None`: no module loaded), against which a
    /// container's recorded `driver_version` is out of date.
    host_driver: Option<String>,
    /// What running VMs pass through without a reservation (libvirt's status XML).
    passed: PassedThrough,
}

impl<'a> Holders<'a> {
    fn new(st: &'a State, stale: &dyn Fn(&Reservation) -> Option<String>) -> Holders<'a> {
        let stale = st.reservations.iter().map(|(k, r)| (k, stale(r))).collect();
        Holders {
            st,
            stale,
            host_driver: None,
            passed: PassedThrough::default(),
        }
    }

    /// With what running VMs pass through unreserved.
    fn with_passed(mut self, p: PassedThrough) -> Self {
        self.passed = p;
        self
    }

    /// The running VM that passes GPU `g` through whole without a reservation, if one does.
    fn passed_whole(&self, g: &Gpu) -> Option<&crate::reserve::vm::PassedVm> {
        match self.passed.of_gpu(g.pci, None) {
            Some((u, vm)) if !u.is_mdev() && self.st.holder_of(&Unit::Gpu(g.pci)).is_none() => {
                Some(vm)
            }
            _ => None,
        }
    }

    /// The GPU's mediated devices held, each with its reservation and why its holder is gone;
    /// then those running VMs pass through without one.
    fn mdevs(&self, g: &Gpu) -> Vec<MdevHeld<'a, '_>> {
        let mut v: Vec<MdevHeld<'a, '_>> = self
            .st
            .reservations
            .values()
            .flat_map(|r| r.gpus.iter().map(move |u| (*u, r)))
            .filter(|(u, _)| u.is_mdev() && u.pci() == g.pci)
            .map(|(u, r)| (u, Some((r, self.stale(r)))))
            .collect();
        for (u, _) in self.passed.iter() {
            if u.is_mdev() && u.pci() == g.pci && !v.iter().any(|(x, _)| x == u) {
                v.push((*u, None));
            }
        }
        v.sort_by_key(|(u, _)| *u);
        v
    }

    /// With the NVIDIA driver the host runs now.
    fn with_host_driver(mut self, v: Option<String>) -> Self {
        self.host_driver = v;
        self
    }

    /// Whether `r`'s container got the files of another NVIDIA driver than the host runs now
    /// (a driver upgraded under it): its recorded version and the host's.
    fn outdated<'r>(&'r self, r: &'r Reservation) -> Option<(&'r str, &'r str)> {
        let had = r.driver_version.as_deref()?;
        let now = self.host_driver.as_deref()?;
        (had != now).then_some((had, now))
    }

    /// Why `r`'s holder is gone, if it is.
    fn stale(&self, r: &Reservation) -> Option<&str> {
        self.stale.get(&r.key()).and_then(|w| w.as_deref())
    }

    /// Who holds `unit`, and why that holder is gone if it is.
    fn of(&self, unit: &Unit) -> Option<(&'a Reservation, Option<&str>)> {
        self.st.holder_of(unit).map(|r| (r, self.stale(r)))
    }

    /// `holder` in `list --json`: `null` when free.
    fn json(&self, unit: &Unit) -> serde_json::Value {
        match self.of(unit) {
            Some((r, why)) => {
                let (domain, uuid) = r.holder.domain_and_uuid();
                let mut v = json!({
                    "kind": r.kind(), "domain": domain, "uuid": uuid, "phase": r.phase,
                    "stale": why.is_some(),
                });
                if let Some(p) = pod_json(&r.holder) {
                    v["pod"] = p;
                }
                v
            }
            None => serde_json::Value::Null,
        }
    }

    /// A GPU's `holder`: its reservation's, else the running VM that passes it through
    /// without one (`"reserved": false`).
    fn gpu_json(&self, g: &Gpu) -> serde_json::Value {
        match self.passed_whole(g) {
            Some(vm) => json!({
                "kind": HolderKind::Vm, "domain": vm.name, "uuid": vm.uuid, "reserved": false,
            }),
            None => self.json(&Unit::Gpu(g.pci)),
        }
    }

    /// A shared GPU's slots in use: (slot unit, its holder, why that holder is gone), in
    /// slot order.
    /// Every slot held is listed, also one the config no longer has (its replicas
    /// lowered, or its sharing taken out, while the slot was held).
    fn slots(&self, g: &Gpu) -> Vec<(Unit, &'a Reservation, Option<&str>)> {
        self.st
            .slots_of(g.pci)
            .into_iter()
            .map(|(u, r)| (u, r, self.stale(r)))
            .collect()
    }

    /// `sharing` in `list --json`: `null` for a GPU that is not shared (and has no slot held).
    fn sharing_json(&self, g: &Gpu) -> serde_json::Value {
        let mdevs = self.mdevs(g);
        if !mdevs.is_empty() {
            return mdev_json(&mdevs, &self.passed);
        }
        let sh = match g.sharing {
            Some(sh) => sh,
            None if !self.slots(g).is_empty() => crate::host::config::Sharing::timeslice(0),
            None => return serde_json::Value::Null,
        };
        let holders: Vec<_> = self
            .slots(g)
            .into_iter()
            .map(|(u, r, why)| {
                let (domain, uuid) = r.holder.domain_and_uuid();
                let mut v = json!({
                    "kind": r.kind(), "domain": domain, "uuid": uuid, "phase": r.phase,
                    "stale": why.is_some(), "slot": u,
                });
                if let Some(p) = pod_json(&r.holder) {
                    v["pod"] = p;
                }
                v
            })
            .collect();
        json!({
            "mode": sh.mode, "replicas": sh.replicas, "used": holders.len(),
            "memory_limit_mib": sh.memory_limit_mib,
            "active_thread_percentage": sh.active_thread_percentage,
            "holders": holders,
        })
    }

    /// The HOLDER cell of a shared GPU: `2/3 shared: web1, container c1` (`stale: NAME` for
    /// a holder that is gone), `0/3 shared`.
    fn shared_cell(&self, g: &Gpu) -> Option<String> {
        let slots = self.slots(g);
        let sh = g
            .sharing
            .or_else(|| (!slots.is_empty()).then(|| crate::host::config::Sharing::timeslice(0)))?;
        let names: Vec<String> = slots
            .iter()
            .map(|(_, r, why)| {
                let name = table_name(&r.holder);
                match why {
                    Some(_) => format!("stale: {name}"),
                    None => name,
                }
            })
            .collect();
        Some(format!(
            "{}/{} shared{}",
            slots.len(),
            sh.replicas,
            if names.is_empty() {
                String::new()
            } else {
                format!(": {}", names.join(", "))
            }
        ))
    }

    /// The HOLDER cell of a GPU whose mediated devices VMs hold (`mdev: vm a, vm b`; one
    /// whose holder is gone `stale: vm a`, one unreserved `vm c (not reserved)`), or that a
    /// running VM passes through without a reservation (`vm hot (passed through, not
    /// reserved)`).
    fn vm_cell(&self, g: &Gpu) -> Option<String> {
        if let Some(vm) = self.passed_whole(g) {
            return Some(format!(
                "{} (passed through, not reserved)",
                table_name(&HolderId::Vm {
                    name: vm.name.clone(),
                    uuid: vm.uuid.clone()
                })
            ));
        }
        let mdevs = self.mdevs(g);
        if mdevs.is_empty() {
            return None;
        }
        let names: Vec<String> = mdevs
            .iter()
            .map(|(u, held)| match held {
                Some((r, Some(_))) => format!("stale: {}", table_name(&r.holder)),
                Some((r, None)) => table_name(&r.holder),
                None => match self.passed.iter().find(|(x, _)| *x == u) {
                    Some((_, vm)) => format!("vm {} (not reserved)", vm.name),
                    None => String::new(),
                },
            })
            .collect();
        Some(format!("mdev: {}", names.join(", ")))
    }

    /// The HOLDER cell of a held unit: `web1 (running)`, `container ID (prepared)`, or
    /// `stale: web1 (its container init (pid 4242) is gone)`.
    fn cell(&self, unit: &Unit) -> Option<String> {
        let (r, why) = self.of(unit)?;
        let name = table_name(&r.holder);
        let name = match self.outdated(r) {
            Some((had, now)) => format!("{name} [driver {had}, host now {now}]"),
            None => name,
        };
        Some(match why {
            Some(why) => format!("stale: {name} ({why})"),
            None => format!(
                "{name} ({})",
                serde_json::to_value(r.phase)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default()
            ),
        })
    }
}

/// `sharing` of a GPU whose mediated devices VMs hold: mode `mdev`, each VM with its
/// mediated device (`slot`: the unit, `mdev`: its UUID); one a running VM passes through
/// without a reservation has `"reserved": false`.
fn mdev_json(mdevs: &[MdevHeld], passed: &PassedThrough) -> serde_json::Value {
    let holders: Vec<_> = mdevs
        .iter()
        .filter_map(|(u, held)| {
            let mdev = match u {
                Unit::Mdev { mdev, .. } => mdev.to_string(),
                _ => return None,
            };
            Some(match held {
                Some((r, why)) => {
                    let (domain, uuid) = r.holder.domain_and_uuid();
                    json!({
                        "kind": r.kind(), "domain": domain, "uuid": uuid, "phase": r.phase,
                        "stale": why.is_some(), "slot": u, "mdev": mdev,
                    })
                }
                None => {
                    let vm = passed.iter().find(|(x, _)| *x == u)?.1;
                    json!({
                        "kind": HolderKind::Vm, "domain": vm.name, "uuid": vm.uuid,
                        "reserved": false, "slot": u, "mdev": mdev,
                    })
                }
            })
        })
        .collect();
    json!({
        "mode": "mdev", "replicas": null, "used": holders.len(),
        "memory_limit_mib": null, "active_thread_percentage": null,
        "holders": holders,
    })
}

/// How the text table names a holder: a libvirt LXC domain by its name, the other kinds
/// with their kind (`container ID`, `vm NAME`); a pod's allocation by its pod and container
/// once kubelet named them (`pod NS/NAME/CONTAINER`), else by its ID (`pod allocation ID`),
/// with the container that holds its units (`in container ID`) or `pending`.
fn table_name(h: &HolderId) -> String {
    match (h.kind(), h.pod()) {
        (HolderKind::Libvirt, _) => h.name().to_string(),
        (HolderKind::Pod, Some(p)) => {
            let name = match (p.pod_name(), &p.container_name) {
                (Some(pod), Some(c)) => format!("pod {pod}/{c}"),
                (Some(pod), None) => format!("pod {pod}"),
                _ => format!("pod allocation {}", h.name()),
            };
            match &p.container {
                Some(c) => format!("{name} in container {c}"),
                None => format!("{name} pending"),
            }
        }
        (k, _) => format!("{} {}", k.word(), h.name()),
    }
}

/// `holder.pod` in `list --json` for a pod's allocation: its resource, pod (namespace, name,
/// UID), container's name, and the OCI container that holds its units (`null`: pending).
fn pod_json(h: &HolderId) -> Option<serde_json::Value> {
    let p = h.pod()?;
    Some(json!({
        "allocation": h.name(), "resource": p.resource, "namespace": p.namespace,
        "name": p.name, "uid": p.uid, "container_name": p.container_name,
        "container": p.container, "pending": p.container.is_none(),
    }))
}

/// The stable JSON form of `list`.
pub fn list_json(inv: &Inventory, st: &State) -> serde_json::Value {
    json_with(
        inv,
        &Holders::new(st, &crate::reserve::reconcile::stale_reason),
    )
}

fn json_with(inv: &Inventory, h: &Holders) -> serde_json::Value {
    let st = h.st;
    let gpus: Vec<_> = inv
        .gpus
        .iter()
        .map(|g| {
            json!({
                "index": g.index,
                "pci": g.pci,
                "vendor": g.vendor.as_str(),
                "model": g.model,
                "arch": g.arch,
                "uuid": g.uuid,
                "numa_node": g.numa_node,
                "devices": g.paths(),
                "excluded": g.excluded,
                "holder": h.gpu_json(g),
                "sharing": h.sharing_json(g),
                "vendor_id": format!("{:04x}", g.vendor_id),
                "device_id": format!("{:04x}", g.device_id),
                "parent": g.parent,
                "nodes": g.nodes.iter().map(|(_, n)| n).collect::<Vec<_>>(),
                "problem": g.problem,
                "driver": g.driver,
                "migs": g.migs.iter().map(|m| {
                    let id = m.id(g.pci);
                    json!({
                        "gi": m.gi, "ci": m.ci, "id": id,
                        "nodes": g.mig_nodes(m).collect::<Vec<_>>(),
                        "holder": h.json(&id),
                        "draining": crate::reserve::drain::unit_pids(st, &id),
                    })
                }).collect::<Vec<_>>(),
                "quarantine": crate::reserve::health::quarantine_json(st, g.pci.as_str()),
                "scrub_pending": crate::reserve::health::scrub_pending(st, g.pci.as_str()),
                "resetting": st.health.get(g.pci.as_str()).and_then(|h| h.resetting.as_ref()).map(|r| json!({
                    "pid": r.by.pid, "since": r.since,
                })),
                "draining": crate::reserve::drain::pids_of(st, g.pci),
                "link": g.link.as_ref().map(|l| json!({
                    "speed": l.speed, "max_speed": l.max_speed,
                    "width": l.width, "max_width": l.max_width,
                    "degraded": l.degraded(),
                })),
            })
        })
        .collect();
    let controls: Vec<_> = inv.controls.iter().map(|(_, n)| n).collect();
    let reservations: Vec<_> = st
        .reservations
        .values()
        .map(|r| {
            let (domain, uuid) = r.holder.domain_and_uuid();
            json!({
                "kind": r.kind(), "domain": domain, "uuid": uuid, "phase": r.phase, "gpus": r.gpus,
                "request": r.request, "created": r.created, "updated": r.updated,
                "init_pid": r.init.map(|i| i.pid),
                "stale": h.stale(r),
                "driver": r.driver.map(|d| d.as_str()),
                "driver_version": r.driver_version,
                "driver_outdated": h.outdated(r).is_some(),
            })
        })
        .collect();
    json!({"gpus": gpus, "controls": controls, "reservations": reservations})
}

pub(super) fn list(as_json: bool) -> Result<i32, Error> {
    let (cfg, inv, st, passed) = load_with_vms()?;
    let holders = Holders::new(&st, &crate::reserve::reconcile::stale_reason)
        .with_host_driver(crate::host::driver::module_version(&cfg.proc).ok())
        .with_passed(passed);
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json_with(&inv, &holders)).expect("json")
        );
        return Ok(0);
    }
    print_table(
        &[
            "INDEX", "PCI", "VENDOR", "MODEL", "ARCH", "NUMA", "DEVICES", "HOLDER",
        ],
        &rows(&inv, &holders),
    );
    if inv.gpus.is_empty() {
        println!(
            "(no NVIDIA, AMD or Intel GPU found under {})",
            cfg.sysfs.display()
        );
    }
    Ok(0)
}

/// The text table's rows, one per GPU.
fn rows(inv: &Inventory, h: &Holders) -> Vec<[String; 8]> {
    let st = h.st;
    inv.gpus
        .iter()
        .map(|g| {
            let unit = Unit::Gpu(g.pci);
            let holder = match (
                h.cell(&unit).or_else(|| h.vm_cell(g)),
                st.draining.get(&unit),
            ) {
                (Some(c), _) => c,
                (None, Some(d)) => {
                    format!("draining: {}", d.who())
                }
                (None, None) if g.excluded => "excluded".into(),
                (None, None) => match (&g.problem, h.shared_cell(g)) {
                    (Some(p), Some(c)) => format!("{c} [unusable: {p}]"),
                    (Some(p), None) => format!("unusable: {p}"),
                    // Slots held on a GPU put in MIG mode since: both.
                    (None, Some(c)) if !g.migs.is_empty() && !h.slots(g).is_empty() => {
                        format!("{c}; {}", mig_cell(h, g))
                    }
                    (None, _) if !g.migs.is_empty() => mig_cell(h, g),
                    (None, Some(c)) => c,
                    (None, None) => "free".into(),
                },
            };
            let holder = match &g.link {
                Some(l) if l.degraded() => format!("{holder} [link {l}]"),
                _ => holder,
            };
            [
                g.index.to_string(),
                g.pci.to_string(),
                g.vendor.to_string(),
                g.model.clone(),
                g.arch.clone().unwrap_or_else(|| "-".into()),
                g.numa_node.map_or("-".into(), |n| n.to_string()),
                g.paths().join(","),
                holder,
            ]
        })
        .collect()
}

/// The HOLDER cell of a GPU in MIG mode: how many instances are free, who holds the others
/// (a holder that is gone as `stale: NAME`), or keeps them draining.
fn mig_cell(h: &Holders, g: &Gpu) -> String {
    let st = h.st;
    let held: Vec<String> = g
        .migs
        .iter()
        .filter_map(|m| {
            let id = m.id(g.pci);
            let name = id.instance()?;
            h.of(&id)
                .map(|(r, why)| match why {
                    Some(_) => format!("{name} stale: {}", r.holder.name()),
                    None => format!("{name} {}", r.holder.name()),
                })
                .or_else(|| {
                    st.draining
                        .get(&id)
                        .map(|d| format!("{name} draining: {}", d.who()))
                })
        })
        .collect();
    format!(
        "MIG: {} of {} instances free{}",
        g.migs.len() - held.len(),
        g.migs.len(),
        if held.is_empty() {
            String::new()
        } else {
            format!(" ({})", held.join(", "))
        }
    )
}

fn print_table(head: &[&str; 8], rows: &[[String; 8]]) {
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let s: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = w[i]))
            .collect();
        println!("{}", s.join("  ").trim_end());
    };
    line(head.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Vendor;
    use crate::reserve::alloc::tests::{gpu, unit, with_migs};

    fn reservation(domain: &str, uuid: &str, kind: HolderKind, units: &[&str]) -> Reservation {
        Reservation::for_test(kind, domain, uuid, units)
    }

    /// GPU 0 held by a live domain, GPU 1 by a container that is gone, GPU 2 free; GPU 3 in
    /// MIG mode with one instance of a live domain's, one of a gone domain's, one free.
    fn host() -> (Inventory, State) {
        let inv = Inventory {
            gpus: vec![
                gpu(0, Some(0), "sw0", Vendor::Nvidia, "hopper"),
                gpu(1, Some(0), "sw0", Vendor::Nvidia, "hopper"),
                gpu(2, Some(0), "sw1", Vendor::Nvidia, "hopper"),
                with_migs(
                    gpu(3, Some(0), "sw1", Vendor::Nvidia, "hopper"),
                    &[(1, 0), (2, 0), (3, 0)],
                ),
            ],
            ..Default::default()
        };
        let mut st = State::default();
        for r in [
            reservation("web1", "u-live", HolderKind::Libvirt, &["0000:10:00.0"]),
            reservation("c1", "c1", HolderKind::Oci, &["0000:11:00.0"]),
            reservation(
                "m1",
                "u-mig-live",
                HolderKind::Libvirt,
                &["0000:13:00.0/gi1/ci0"],
            ),
            reservation(
                "m2",
                "u-mig-gone",
                HolderKind::Libvirt,
                &["0000:13:00.0/gi2/ci0"],
            ),
        ] {
            st.insert(r);
        }
        (inv, st)
    }

    /// The holders of `c1` and `m2` are gone.
    fn gone(r: &Reservation) -> Option<String> {
        matches!(r.holder.domain_and_uuid().1, "c1" | "u-mig-gone")
            .then(|| "its container init (pid 4242) is gone".to_owned())
    }

    #[test]
    fn a_gone_holder_is_listed_stale_in_json() {
        let (inv, st) = host();
        let l = json_with(&inv, &Holders::new(&st, &gone));
        assert_eq!(
            l["gpus"][0]["holder"],
            json!({"kind": "libvirt", "domain": "web1", "uuid": "u-live", "phase": "running", "stale": false})
        );
        assert_eq!(
            l["gpus"][1]["holder"],
            json!({"kind": "oci", "domain": "c1", "uuid": "c1", "phase": "running", "stale": true})
        );
        assert_eq!(l["gpus"][2]["holder"], serde_json::Value::Null);
        let migs = &l["gpus"][3]["migs"];
        assert_eq!(migs[0]["holder"]["stale"], false);
        assert_eq!(migs[1]["holder"]["stale"], true);
        assert_eq!(migs[1]["holder"]["domain"], "m2");
        assert_eq!(migs[2]["holder"], serde_json::Value::Null);
        let stale: Vec<(&str, &serde_json::Value)> = l["reservations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["uuid"].as_str().unwrap(), &r["stale"]))
            .collect();
        assert!(stale.contains(&("c1", &json!("its container init (pid 4242) is gone"))));
        assert!(stale.contains(&("u-live", &serde_json::Value::Null)));
    }

    #[test]
    fn a_gone_holder_is_listed_stale_in_the_table() {
        let (inv, st) = host();
        let rows = rows(&inv, &Holders::new(&st, &gone));
        let holder: Vec<&str> = rows.iter().map(|r| r[7].as_str()).collect();
        assert_eq!(
            holder,
            [
                "web1 (running)",
                "stale: container c1 (its container init (pid 4242) is gone)",
                "free",
                "MIG: 1 of 3 instances free (gi1/ci0 m1, gi2/ci0 stale: m2)",
            ]
        );
    }

    #[test]
    fn a_shared_gpu_lists_its_sharers() {
        let (mut inv, mut st) = host();
        inv.gpus[2].sharing = Some(crate::host::config::Sharing {
            mode: crate::host::config::ShareMode::Mps,
            replicas: 3,
            memory_limit_mib: Some(2048),
            active_thread_percentage: None,
        });
        for r in [
            reservation("a", "u-a", HolderKind::Libvirt, &["0000:12:00.0/slot0"]),
            reservation("c1", "c1", HolderKind::Oci, &["0000:12:00.0/slot2"]),
        ] {
            st.insert(r);
        }
        let l = json_with(&inv, &Holders::new(&st, &gone));
        let g = &l["gpus"][2];
        assert_eq!(g["holder"], serde_json::Value::Null);
        assert_eq!(
            g["sharing"],
            json!({
                "mode": "mps", "replicas": 3, "used": 2, "memory_limit_mib": 2048,
                "active_thread_percentage": null,
                "holders": [
                    {"kind": "libvirt", "domain": "a", "uuid": "u-a", "phase": "running", "stale": false, "slot": "0000:12:00.0/slot0"},
                    {"kind": "oci", "domain": "c1", "uuid": "c1", "phase": "running", "stale": true, "slot": "0000:12:00.0/slot2"},
                ]
            })
        );
        assert_eq!(l["gpus"][0]["sharing"], serde_json::Value::Null);
        let rows = rows(&inv, &Holders::new(&st, &gone));
        assert_eq!(rows[2][7], "2/3 shared: a, stale: container c1");
        // Its sharing taken out of the config while a slot is held: still listed.
        let mut no_share = inv.clone();
        no_share.gpus[2].sharing = None;
        let l = json_with(&no_share, &Holders::new(&st, &gone));
        assert_eq!(l["gpus"][2]["sharing"]["replicas"], 0);
        assert_eq!(l["gpus"][2]["sharing"]["used"], 2);
        let rows = super::rows(&no_share, &Holders::new(&st, &gone));
        assert_eq!(rows[2][7], "2/0 shared: a, stale: container c1");
        st.reservations.clear();
        let rows = super::rows(&inv, &Holders::new(&st, &gone));
        assert_eq!(rows[2][7], "0/3 shared");
        let rows = super::rows(&no_share, &Holders::new(&st, &gone));
        assert_eq!(rows[2][7], "free");
    }

    #[test]
    fn a_mig_instance_lists_its_parent_node_and_both_capabilities() {
        let (inv, st) = host();
        let l = json_with(&inv, &Holders::new(&st, &gone));
        assert_eq!(
            l["gpus"][3]["migs"][1]["nodes"],
            json!([
                {"path": "/dev/nvidia3", "major": 195, "minor": 3},
                {"path": "/dev/nvidia-caps/nvidia-cap18", "major": 236, "minor": 18},
                {"path": "/dev/nvidia-caps/nvidia-cap19", "major": 236, "minor": 19},
            ])
        );
        // What a holder of the instance is given, listed as it is given.
        let given: Vec<serde_json::Value> = inv
            .nodes_for(&[unit("0000:13:00.0/gi2/ci0")], Default::default())
            .iter()
            .map(|n| json!(n))
            .collect();
        assert_eq!(l["gpus"][3]["migs"][1]["nodes"], json!(given));
    }
}
