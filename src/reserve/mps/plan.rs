//! What is decided on the state alone: which daemons to start, which to stop, which
//! interrupted starts to sweep; and the locked steps that stop and sweep.

use super::daemon::Daemon;
use super::work::Mps;
use crate::host::config::{Config, ShareMode};
use crate::host::inventory::Inventory;
use crate::host::procfs::{Proc, ProcRef};
use crate::ids::{Pci, Unit};
use crate::reserve::state::State;
use std::collections::BTreeSet;

/// The daemon serving a holder of `units` (the first of its slots with one recorded: a
/// container has one `/tmp/nvidia-mps`), with its GPU.
pub fn daemon_for<'s>(st: &'s State, units: &[Unit]) -> Option<(Pci, &'s Daemon)> {
    units
        .iter()
        .filter(|u| u.is_slot())
        .find_map(|u| st.mps.get(&u.pci()).map(|d| (u.pci(), d)))
}

/// What to do: daemons to start (a GPU shared with MPS, a slot of it held, no live daemon
/// recorded and no start of one: a live one is waited for, a dead one's leftovers are
/// swept first) and to stop (a recorded daemon whose GPU no
/// reservation holds a slot of).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DaemonPlan {
    pub start: Vec<Pci>,
    pub stop: Vec<Pci>,
}

/// [`DaemonPlan`] on the state; `mps`: the GPUs shared with MPS; `alive`: whether a process runs
/// (a daemon, or the gpuhook process starting one).
pub fn plan(st: &State, mps: &BTreeSet<Pci>, alive: &dyn Fn(&ProcRef) -> bool) -> DaemonPlan {
    let used: BTreeSet<Pci> = st
        .reservations
        .values()
        .flat_map(|r| r.gpus.iter())
        .filter(|u| u.is_slot())
        .map(Unit::pci)
        .collect();
    DaemonPlan {
        start: used
            .iter()
            .filter(|p| mps.contains(p))
            .filter(|p| !st.mps.get(p).is_some_and(|d| d.starting || alive(&d.proc)))
            .copied()
            .collect(),
        stop: st
            .mps
            .keys()
            .filter(|p| !used.contains(p))
            .copied()
            .collect(),
    }
}

/// The GPUs of the inventory shared with MPS.
pub fn mps_gpus(inv: &Inventory) -> BTreeSet<Pci> {
    inv.gpus
        .iter()
        .filter(|g| g.sharing.is_some_and(|s| s.mode == ShareMode::Mps))
        .map(|g| g.pci)
        .collect()
}

/// The GPUs shared with MPS that `units` hold slots of.
pub fn mps_gpus_of(inv: &Inventory, units: &[Unit]) -> BTreeSet<Pci> {
    let mps = mps_gpus(inv);
    units
        .iter()
        .filter(|u| u.is_slot())
        .map(Unit::pci)
        .filter(|p| mps.contains(p))
        .collect()
}

/// This process, as a daemon's starter: as `proc` sees it, or as the host's `/proc` does.
pub fn own_ref(proc: Proc) -> Option<ProcRef> {
    let pid = std::process::id() as i32;
    proc.proc_ref(pid)
        .or_else(|| crate::host::procfs::REAL.proc_ref(pid))
}

/// Under the state lock: a start recorded `starting` whose starter is gone (killed between
/// its two locked steps) is swept, one bounded pass ([`Mps::sweep`]): what it left running
/// is killed, and the record forgotten once nothing of it is left. Until then the record
/// stays, so no daemon is started for that GPU beside the leftovers; the next locked step
/// (a waiting sharer's, or any door's) passes again. No door waits on the lock for a
/// process that is slow to die.
pub fn sweep_dead(cfg: &Config, m: &dyn Mps, proc: Proc, st: &mut State) -> Vec<String> {
    let dead: Vec<(Pci, Daemon)> = st
        .mps
        .iter()
        .filter(|(_, d)| d.starting && Some(d.proc) != own_ref(proc) && !proc.alive(&d.proc))
        .map(|(p, d)| (*p, d.clone()))
        .collect();
    let mut notes = Vec::new();
    for (pci, d) in dead {
        let swept = m.sweep(cfg, pci, &d);
        let head = format!(
            "MPS daemon of GPU {pci} ({}): its start by pid {} did not finish (the process is gone)",
            d.uuid, d.proc.pid
        );
        if swept.left.is_empty() && swept.killed.is_empty() {
            st.mps.remove(&pci);
            notes.push(format!("{head}; nothing it left runs any more: forgotten"));
        } else if swept.left.is_empty() {
            st.mps.remove(&pci);
            notes.push(format!("{head}; stopped what it left: {:?}", swept.killed));
        } else {
            notes.push(format!(
                "{head}; killed what it left, not gone yet: {:?} (no daemon is started for the GPU until they are)",
                swept.left
            ));
        }
    }
    notes
}

/// Tells the daemons without sharers to quit and forgets them (one that died is forgotten
/// too); one that cannot be told stays recorded, for the next free or `reconcile`. A start
/// in progress is left to its starter; one whose starter is gone is swept.
pub fn stop_unused(cfg: &Config, m: &dyn Mps, proc: Proc, st: &mut State) -> Vec<String> {
    let mut notes = sweep_dead(cfg, m, proc, st);
    let p = plan(st, &BTreeSet::new(), &|r| proc.alive(r));
    for pci in p.stop {
        let Some(d) = st.mps.get(&pci).cloned() else {
            continue;
        };
        if d.starting {
            continue;
        }
        if !proc.alive(&d.proc) {
            st.mps.remove(&pci);
            notes.push(format!(
                "MPS daemon pid {} of GPU {pci} had already exited",
                d.proc.pid
            ));
            continue;
        }
        match m.quit(cfg, pci, &d) {
            Ok(()) => {
                st.mps.remove(&pci);
                notes.push(format!(
                    "stopped MPS daemon pid {} of GPU {pci} (no sharer left)",
                    d.proc.pid
                ));
            }
            Err(e) => notes.push(format!("{e}; it stays recorded")),
        }
    }
    notes
}
