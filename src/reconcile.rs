//! Which reservations `gpuhook-libvirt reconcile` frees: those of domains libvirt no longer
//! runs — but never one whose container init is still alive (whatever libvirt says, that
//! container still has the GPUs), and never one between `prepare` and `started` (its
//! libvirtd is alive and the prepare is recent).

use crate::procfs::ProcRef;
use crate::state::{parse_rfc3339, HolderKind, Phase, Reservation, State};
use std::collections::HashSet;

/// A `prepare` older than this whose domain never became active was abandoned (libvirt
/// starts an LXC container in well under a second).
pub const PREPARE_GRACE_SECS: i64 = 600;

/// What reconcile knows of the world; the functions are injected so the decision is testable.
pub struct World<'a> {
    /// UUIDs of the domains libvirt runs.
    pub active: &'a HashSet<String>,
    pub now: i64,
    pub alive: &'a dyn Fn(&ProcRef) -> bool,
}

/// Why an OCI container's reservation is stale, if it is: its recorded init is gone, or no
/// init was recorded and the runtime process that reserved it (the wrapper became it) is
/// gone. libvirt's view of domains has nothing to say about it.
pub fn oci_stale(r: &Reservation, alive: &dyn Fn(&ProcRef) -> bool) -> Option<String> {
    match (r.phase, r.init, r.prepared_by) {
        (Phase::Running, Some(i), _) if !alive(&i) => {
            Some(format!("its container init (pid {}) is gone", i.pid))
        }
        (Phase::Prepared, _, Some(p)) if !alive(&p) => Some(format!(
            "the runtime (pid {}) that reserved it is gone and recorded no container init",
            p.pid
        )),
        _ => None,
    }
}

/// Why a reservation is kept, or `None` when it should be freed (with the reason).
pub fn verdict(r: &Reservation, w: &World) -> Result<&'static str, String> {
    if r.kind == HolderKind::Oci {
        return match oci_stale(r, w.alive) {
            None => Ok("its OCI container (or the runtime creating it) is alive"),
            Some(why) => Err(why),
        };
    }
    if w.active.contains(&r.uuid) {
        return Ok("domain is running");
    }
    if r.init.is_some_and(|i| (w.alive)(&i)) {
        return Ok("its container init is still alive");
    }
    if r.phase == Phase::Prepared {
        let age = parse_rfc3339(&r.updated).map_or(i64::MAX, |t| w.now - t);
        let preparer_alive = r.prepared_by.is_some_and(|p| (w.alive)(&p));
        if preparer_alive && age < PREPARE_GRACE_SECS {
            return Ok("domain is between prepare and started");
        }
        return Err(format!("prepared {age}s ago and never started"));
    }
    Err("libvirt does not run the domain and its container is gone".into())
}

/// UUIDs to free, with reasons.
pub fn plan(st: &State, w: &World) -> Vec<(String, String)> {
    st.reservations
        .values()
        .filter_map(|r| verdict(r, w).err().map(|why| (r.uuid.clone(), why)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{now_rfc3339, rfc3339};

    fn res(
        uuid: &str,
        phase: Phase,
        init: Option<i32>,
        prep: Option<i32>,
        updated: i64,
    ) -> Reservation {
        Reservation {
            kind: Default::default(),
            domain: format!("d{uuid}"),
            uuid: uuid.into(),
            gpus: vec![format!("0000:{uuid}:00.0")],
            phase,
            request: "1 GPU".into(),
            created: now_rfc3339(),
            updated: rfc3339(updated),
            prepared_by: prep.map(|pid| ProcRef { pid, start_time: 1 }),
            controller: None,
            init: init.map(|pid| ProcRef { pid, start_time: 1 }),
            nodes: vec![],
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
            st.reservations.insert(r.uuid.clone(), r);
        }
        let active: HashSet<String> = ["01".to_string()].into();
        let alive = |p: &ProcRef| [10, 11, 20].contains(&p.pid);
        let w = World {
            active: &active,
            now,
            alive: &alive,
        };
        let freed: Vec<String> = plan(&st, &w).into_iter().map(|(u, _)| u).collect();
        assert_eq!(freed, ["03", "05", "06"]);
        assert_eq!(
            verdict(&st.reservations["04"], &w),
            Ok("domain is between prepare and started")
        );
        assert_eq!(
            verdict(&st.reservations["02"], &w),
            Ok("its container init is still alive")
        );
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
            let mut r = r;
            r.kind = HolderKind::Oci;
            st.reservations.insert(r.uuid.clone(), r);
        }
        let active: HashSet<String> = ["12".to_string()].into();
        let alive = |p: &ProcRef| [10, 20].contains(&p.pid);
        let w = World {
            active: &active,
            now,
            alive: &alive,
        };
        let freed: Vec<(String, String)> = plan(&st, &w);
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
}
