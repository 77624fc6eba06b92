//! Which reservations `gpuhook-libvirt reconcile` frees: those of domains libvirt no longer
//! runs — but never one whose container init is still alive (whatever libvirt says, that
//! container still has the GPUs), and never one between `prepare` and `started` (its
//! libvirtd is alive and the prepare is recent).

use crate::host::procfs::{self, Proc, ProcRef};
use crate::ids::Unit;
use crate::reserve::state::{
    parse_rfc3339, HolderId, HolderKey, HolderKind, Phase, Reservation, State,
};
use std::collections::HashSet;

/// A `prepare` older than this whose domain never became active was abandoned (libvirt
/// starts an LXC container in well under a second).
pub const PREPARE_GRACE_SECS: i64 = 600;

/// What staleness is decided from; injected so the rule is testable.
pub struct Liveness<'a> {
    /// Whether a process (PID + start time) still lives.
    pub alive: &'a dyn Fn(&ProcRef) -> bool,
    /// Whether libvirt's controller for a domain (by name) runs.
    pub controller: &'a dyn Fn(&str) -> bool,
}

/// What reconcile knows of the world; the functions are injected so the decision is testable.
pub struct LibvirtView<'a> {
    /// UUIDs of the domains libvirt runs.
    pub active: &'a HashSet<String>,
    /// UUIDs of the QEMU domains (VMs) libvirt's QEMU driver runs, when it could be asked;
    /// `None`: VMs are judged by the staleness rule alone.
    pub vms: Option<&'a HashSet<String>>,
    pub now: i64,
    pub seen: Liveness<'a>,
}

/// The one staleness rule, for every front door: why a reservation's holder is gone, if it
/// is. A running one: its recorded init is gone. A prepared one: the process that reserved
/// is gone (libvirtd for a domain, and no controller of the domain runs; the runtime the
/// wrapper became for an OCI container, which recorded no init). A pod's allocation: only
/// its container can be gone (its init, or the runtime creating it); a pending one (no
/// container) never is: kubelet's word frees it ([`crate::reserve::pods`]), and a stale
/// container gives its units back to it ([`Reservation::to_pending`]), never to the pool.
pub fn stale(r: &Reservation, seen: &Liveness) -> Option<String> {
    match (r.phase, r.kind()) {
        (Phase::Running, HolderKind::Vm) => match r.init {
            Some(i) if !(seen.alive)(&i) => {
                Some(format!("its QEMU process (pid {}) is gone", i.pid))
            }
            _ => None,
        },
        (Phase::Running, _) => match r.init {
            Some(i) if !(seen.alive)(&i) => {
                Some(format!("its container init (pid {}) is gone", i.pid))
            }
            _ => None,
        },
        (Phase::Prepared, HolderKind::Libvirt) => match r.prepared_by {
            Some(p) if !(seen.alive)(&p) && !(seen.controller)(r.holder.name()) => Some(format!(
                "it was prepared by pid {} which is gone, and no container of it runs",
                p.pid
            )),
            _ => None,
        },
        (Phase::Prepared, HolderKind::Oci) => match r.prepared_by {
            Some(p) if !(seen.alive)(&p) => Some(format!(
                "the runtime (pid {}) that reserved it is gone and recorded no container init",
                p.pid
            )),
            _ => None,
        },
        (Phase::Prepared, HolderKind::Pod) => match r.prepared_by {
            Some(p) if !(seen.alive)(&p) => Some(format!(
                "the runtime (pid {}) that created its container is gone and recorded no container init",
                p.pid
            )),
            _ => None,
        },
        (Phase::Prepared, HolderKind::Vm) => match r.prepared_by {
            Some(p) if !(seen.alive)(&p) => Some(format!(
                "it was prepared by pid {} which is gone, and recorded no QEMU process",
                p.pid
            )),
            _ => None,
        },
    }
}

/// Why a reservation is stale (its holder is gone), if it is: [`stale`]
/// on this host's processes.
pub fn stale_reason(r: &Reservation) -> Option<String> {
    stale_on(r, procfs::REAL, &controller_running)
}

/// [`stale_reason`] on these facts: `proc` for liveness, `controller` for libvirt's
/// controllers.
pub fn stale_on(r: &Reservation, proc: Proc, controller: &dyn Fn(&str) -> bool) -> Option<String> {
    stale(
        r,
        &Liveness {
            alive: &|p| proc.alive(p),
            controller,
        },
    )
}

/// Whether libvirt's controller for the domain runs (`/run/libvirt/lxc/NAME.pid`).
pub fn controller_running(name: &str) -> bool {
    crate::enter::container::pidfile_controller(name)
        .ok()
        .and_then(procfs::comm)
        .is_some_and(|c| c == "libvirt_lxc")
}

/// Drops stale reservations; returns what was reclaimed, for the log, and the reservations.
/// A pod's allocation whose container is gone is not dropped: its units go back to the pod
/// (pending), said in the log.
pub fn reclaim_stale(
    proc: Proc,
    controller: &dyn Fn(&str) -> bool,
    st: &mut State,
) -> (Vec<String>, Vec<Reservation>) {
    let stale: Vec<(HolderKey, String)> = st
        .reservations
        .iter()
        .filter_map(|(k, r)| stale_on(r, proc, controller).map(|why| (k.clone(), why)))
        .collect();
    let (pods, stale): (Vec<_>, Vec<_>) = stale
        .into_iter()
        .partition(|(k, _)| st.reservations[k].kind() == HolderKind::Pod);
    let now = crate::reserve::state::now_rfc3339();
    let mut notes: Vec<String> = pods
        .into_iter()
        .filter_map(|(k, why)| {
            let r = st.reservations.get_mut(&k)?;
            let note = format!(
                "{}: its container {} is gone ({why}): {} back to the pod, pending",
                r.holder.who_exactly(),
                r.holder
                    .pod()
                    .and_then(|p| p.container.as_deref())
                    .unwrap_or("?"),
                Unit::join(&r.gpus, ",")
            );
            r.to_pending(&now);
            Some(note)
        })
        .collect();
    let (more, freed): (Vec<String>, Vec<Reservation>) = stale
        .into_iter()
        .filter_map(|(k, why)| {
            st.reservations.remove(&k).map(|r| {
                (
                    format!(
                        "reclaimed GPUs {} of {}: {why}",
                        Unit::join(&r.gpus, ","),
                        r.holder.who_exactly()
                    ),
                    r,
                )
            })
        })
        .unzip();
    notes.extend(more);
    (notes, freed)
}

/// What reconcile does with a reservation, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Keep(&'static str),
    Free(String),
}

/// Why a reservation is kept, or why it should be freed: the staleness rule, and what
/// libvirt says runs: an LXC domain by the LXC driver's list, a VM by the QEMU driver's
/// (when it could be asked). An OCI container is never libvirt's to judge.
pub fn verdict(r: &Reservation, w: &LibvirtView) -> Verdict {
    let (uuid, active, words) = match &r.holder {
        HolderId::Libvirt { uuid, .. } => (uuid, w.active, &LXC),
        HolderId::Oci { .. } => {
            return match stale(r, &w.seen) {
                None => Verdict::Keep("its OCI container (or the runtime creating it) is alive"),
                Some(why) => Verdict::Free(why),
            }
        }
        HolderId::Vm { uuid, .. } => match w.vms {
            Some(vms) => (uuid, vms, &VM),
            None => {
                return match stale(r, &w.seen) {
                    None => Verdict::Keep("its VM (or the libvirtd preparing it) is alive"),
                    Some(why) => Verdict::Free(why),
                }
            }
        },
        HolderId::Pod { .. } => {
            return Verdict::Keep("a pod's allocation: kubelet's device plugin frees it")
        }
    };
    if active.contains(uuid) {
        return Verdict::Keep(words.running);
    }
    if let Some(why) = stale(r, &w.seen) {
        return Verdict::Free(why);
    }
    if r.init.is_some_and(|i| (w.seen.alive)(&i)) {
        return Verdict::Keep(words.alive);
    }
    if r.phase == Phase::Prepared {
        let age = parse_rfc3339(&r.updated).map_or(i64::MAX, |t| w.now - t);
        let preparer_alive = r.prepared_by.is_some_and(|p| (w.seen.alive)(&p));
        if preparer_alive && age < PREPARE_GRACE_SECS {
            return Verdict::Keep(words.starting);
        }
        return Verdict::Free(format!("prepared {age}s ago and never started"));
    }
    Verdict::Free(words.gone.into())
}

/// How reconcile says its decisions of a kind of libvirt domain.
struct Words {
    running: &'static str,
    alive: &'static str,
    starting: &'static str,
    gone: &'static str,
}

const LXC: Words = Words {
    running: "domain is running",
    alive: "its container init is still alive",
    starting: "domain is between prepare and started",
    gone: "libvirt does not run the domain and its container is gone",
};

const VM: Words = Words {
    running: "VM is running",
    alive: "its QEMU process is still alive",
    starting: "VM is between prepare and started",
    gone: "libvirt does not run the VM and its QEMU process is gone",
};

/// The reservations to free (by key), with reasons.
pub fn plan(st: &State, w: &LibvirtView) -> Vec<(HolderKey, String)> {
    st.reservations
        .iter()
        .filter_map(|(k, r)| match verdict(r, w) {
            Verdict::Keep(_) => None,
            Verdict::Free(why) => Some((k.clone(), why)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reserve::state::{now_rfc3339, rfc3339};

    fn res(
        uuid: &str,
        phase: Phase,
        init: Option<i32>,
        prep: Option<i32>,
        updated: i64,
    ) -> Reservation {
        Reservation {
            phase,
            created: now_rfc3339(),
            updated: rfc3339(updated),
            prepared_by: prep.map(|pid| ProcRef { pid, start_time: 1 }),
            init: init.map(|pid| ProcRef { pid, start_time: 1 }),
            ..Reservation::for_test(
                Default::default(),
                &format!("d{uuid}"),
                uuid,
                &[&format!("0000:{uuid}:00.0")],
            )
        }
    }

    #[test]
    fn decisions() {
        let now = 1_800_000_000;
        let mut st = State::default();
        for r in [
            res("01", Phase::Running, Some(10), None, now), // active in libvirt
            res("02", Phase::Running, Some(11), None, now), // inactive, init alive
            res("03", Phase::Running, Some(12), None, now), // inactive, init dead
            res("04", Phase::Prepared, None, Some(20), now - 5), // starting now
            res("05", Phase::Prepared, None, Some(20), now - 3600), // abandoned, libvirtd alive
            res("06", Phase::Prepared, None, Some(21), now - 5), // preparer gone
        ] {
            st.insert(r);
        }
        let active: HashSet<String> = ["01".to_string()].into();
        let alive = |p: &ProcRef| [10, 11, 20].contains(&p.pid);
        let w = LibvirtView {
            active: &active,
            vms: None,
            now,
            seen: Liveness {
                alive: &alive,
                controller: &|_| false,
            },
        };
        let freed: Vec<&str> = plan(&st, &w)
            .into_iter()
            .map(|(k, _)| st.reservations[&k].holder.domain_and_uuid().1)
            .collect();
        assert_eq!(freed, ["03", "05", "06"]);
        assert_eq!(
            verdict(&st.reservations["libvirt:04"], &w),
            Verdict::Keep("domain is between prepare and started")
        );
        assert_eq!(
            verdict(&st.reservations["libvirt:02"], &w),
            Verdict::Keep("its container init is still alive")
        );
    }

    /// The one rule, for both kinds: a running holder by its init; a prepared domain by its
    /// libvirtd and controller; a prepared container by the runtime that reserved.
    #[test]
    fn one_staleness_rule() {
        let now = 1_800_000_000;
        let alive = |p: &ProcRef| p.pid == 10;
        let ctl = |name: &str| name == "d21";
        let seen = Liveness {
            alive: &alive,
            controller: &ctl,
        };
        let lv = |uuid: &str, phase, init, prep| res(uuid, phase, init, prep, now);
        let oci = |uuid: &str, phase, init, prep| {
            let r = res(uuid, phase, init, prep, now);
            Reservation {
                holder: HolderId::Oci { id: uuid.into() },
                ..r
            }
        };
        let cases = [
            (lv("20", Phase::Running, Some(10), None), false),
            (lv("20", Phase::Running, Some(11), None), true),
            (lv("21", Phase::Prepared, None, Some(11)), false), // controller d21 runs
            (lv("22", Phase::Prepared, None, Some(11)), true),
            (lv("22", Phase::Prepared, None, Some(10)), false),
            (oci("21", Phase::Prepared, None, Some(11)), true), // no controller for containers
            (oci("23", Phase::Prepared, None, Some(10)), false),
            (oci("23", Phase::Running, Some(11), Some(10)), true),
        ];
        for (r, want) in cases {
            assert_eq!(stale(&r, &seen).is_some(), want, "{r:?}");
        }
    }

    /// OCI containers are never libvirt's: kept while their init (or the runtime creating
    /// them) lives, however old, whatever libvirt runs; freed when that is gone.
    #[test]
    fn oci_containers_by_their_own_rule() {
        let now = 1_800_000_000;
        let mut st = State::default();
        for r in [
            res("11", Phase::Running, Some(10), Some(30), now - 86_400), // init alive
            res("12", Phase::Running, Some(12), Some(30), now),          // init dead
            res("13", Phase::Prepared, None, Some(20), now - 86_400),    // runtime creating
            res("14", Phase::Prepared, None, Some(21), now),             // runtime gone
        ] {
            let holder = HolderId::Oci {
                id: r.holder.domain_and_uuid().1.into(),
            };
            st.insert(Reservation { holder, ..r });
        }
        let active: HashSet<String> = ["12".to_string()].into();
        let alive = |p: &ProcRef| [10, 20].contains(&p.pid);
        let w = LibvirtView {
            active: &active,
            vms: None,
            now,
            seen: Liveness {
                alive: &alive,
                controller: &|_| false,
            },
        };
        let freed: Vec<(String, String)> = plan(&st, &w)
            .into_iter()
            .map(|(k, why)| (k.to_string(), why))
            .collect();
        assert_eq!(
            freed,
            [
                (
                    "12".to_string(),
                    "its container init (pid 12) is gone".to_string()
                ),
                (
                    "14".to_string(),
                    "the runtime (pid 21) that reserved it is gone and recorded no container init"
                        .to_string()
                )
            ]
        );
    }

    /// VMs: by the QEMU driver's list of running domains when it could be asked (a VM it
    /// runs is kept however its recorded process looks; one it does not run is freed once its
    /// QEMU process is gone, or its prepare is old); by the staleness rule alone otherwise.
    /// A VM with an LXC domain's UUID is judged by the QEMU driver's list only.
    #[test]
    fn vms_by_the_qemu_drivers_list() {
        let now = 1_800_000_000;
        let vm = |uuid: &str, phase, init: Option<i32>, prep: Option<i32>, age: i64| {
            let r = res(uuid, phase, init, prep, now - age);
            Reservation {
                holder: HolderId::Vm {
                    name: format!("v{uuid}"),
                    uuid: uuid.into(),
                },
                ..r
            }
        };
        let mut st = State::default();
        for r in [
            vm("31", Phase::Running, Some(12), None, 0), // libvirt runs it; pid recorded gone
            vm("32", Phase::Running, Some(10), None, 0), // not listed; QEMU alive
            vm("33", Phase::Running, Some(12), None, 0), // not listed; QEMU gone
            vm("34", Phase::Prepared, None, Some(20), 5), // starting
            vm("35", Phase::Prepared, None, Some(20), 3600), // never started
            vm("01", Phase::Running, Some(12), None, 0), // an LXC domain's UUID, QEMU gone
        ] {
            st.insert(r);
        }
        let lxc: HashSet<String> = ["01".to_string()].into();
        let qemu: HashSet<String> = ["31".to_string()].into();
        let alive = |p: &ProcRef| [10, 20].contains(&p.pid);
        let w = |vms| LibvirtView {
            active: &lxc,
            vms,
            now,
            seen: Liveness {
                alive: &alive,
                controller: &|_| false,
            },
        };
        let freed = |w: &LibvirtView| -> Vec<(String, String)> {
            plan(&st, w)
                .into_iter()
                .map(|(k, why)| (k.to_string(), why))
                .collect()
        };
        assert_eq!(
            freed(&w(Some(&qemu))),
            [
                (
                    "vm:01".to_string(),
                    "its QEMU process (pid 12) is gone".to_string()
                ),
                ("vm:33".into(), "its QEMU process (pid 12) is gone".into()),
                (
                    "vm:35".into(),
                    "prepared 3600s ago and never started".into()
                ),
            ]
        );
        assert_eq!(
            verdict(&st.reservations["vm:31"], &w(Some(&qemu))),
            Verdict::Keep("VM is running")
        );
        assert_eq!(
            verdict(&st.reservations["vm:32"], &w(Some(&qemu))),
            Verdict::Keep("its QEMU process is still alive")
        );
        assert_eq!(
            verdict(&st.reservations["vm:34"], &w(Some(&qemu))),
            Verdict::Keep("VM is between prepare and started")
        );
        // Without the QEMU driver's list: the staleness rule alone (31 looks gone).
        let alone: Vec<String> = freed(&w(None)).into_iter().map(|(k, _)| k).collect();
        assert_eq!(alone, ["vm:01", "vm:31", "vm:33"]);
    }
}
