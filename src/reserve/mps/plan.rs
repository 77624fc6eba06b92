//! What is decided on the state alone: which daemons to start, which to stop, which
//! interrupted starts to sweep; the locked steps that mark stops and sweep, and the stops
//! themselves, after the lock.

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
/// recorded, no start and no stop of one: a live start is waited for, a dead one's leftovers
/// are swept first, a stop is waited for) and to stop (a recorded daemon whose GPU no
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
            .filter(|p| {
                !st.mps
                    .get(p)
                    .is_some_and(|d| d.starting || d.stopping.is_some() || alive(&d.proc))
            })
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
/// process that is slow to die. A daemon recorded `stopping` that is gone is forgotten.
pub fn sweep_dead(cfg: &Config, m: &dyn Mps, proc: Proc, st: &mut State) -> Vec<String> {
    let mut notes = forget_stopped(proc, st);
    let dead: Vec<(Pci, Daemon)> = st
        .mps
        .iter()
        .filter(|(_, d)| d.starting && Some(d.proc) != own_ref(proc) && !proc.alive(&d.proc))
        .map(|(p, d)| (*p, d.clone()))
        .collect();
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

/// Forgets the daemons recorded `stopping` that are gone.
fn forget_stopped(proc: Proc, st: &mut State) -> Vec<String> {
    let gone: Vec<(Pci, Daemon)> = st
        .mps
        .iter()
        .filter(|(_, d)| d.stopping.is_some() && !proc.alive(&d.proc))
        .map(|(p, d)| (*p, d.clone()))
        .collect();
    gone.into_iter()
        .map(|(pci, d)| {
            st.mps.remove(&pci);
            format!(
                "MPS daemon pid {} of GPU {pci} is gone: its record forgotten",
                d.proc.pid
            )
        })
        .collect()
}

/// A daemon marked `stopping` by this process under the state lock, to be stopped after it
/// ([`finish_stops`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stop {
    pub pci: Pci,
    /// The daemon, as recorded.
    pub daemon: Daemon,
    /// Its stop was begun by another process, gone since: it may have been told to quit
    /// already, so it is killed.
    pub taken_over: bool,
}

/// What a locked step decided to stop: lines for the log, and the stops it marked (to be
/// passed to [`finish_stops`] once the step is written, never under the lock).
#[derive(Debug, Default)]
#[must_use]
pub struct Stops {
    pub notes: Vec<String>,
    pub marked: Vec<Stop>,
}

/// Under the state lock: marks `stopping` (by this process) the daemons of the GPUs in
/// `gpus` (all with `None`) whose stop another process began and left (it is gone, the
/// daemon runs): they are taken over.
pub fn take_over(proc: Proc, st: &mut State, gpus: Option<&[Pci]>) -> Stops {
    let mut out = Stops::default();
    let Some(me) = own_ref(proc) else {
        return out;
    };
    for (pci, d) in st.mps.iter_mut() {
        let Some(by) = d.stopping else { continue };
        if by == me || proc.alive(&by) || gpus.is_some_and(|g| !g.contains(pci)) {
            continue;
        }
        out.notes.push(format!(
            "MPS daemon pid {} of GPU {pci}: its stop by pid {} did not finish (the process is gone): taken over",
            d.proc.pid, by.pid
        ));
        out.marked.push(Stop {
            pci: *pci,
            daemon: d.clone(),
            taken_over: true,
        });
        d.stopping = Some(me);
    }
    out
}

/// Under the state lock: marks `stopping` the daemons without sharers (forgetting one that
/// died) and takes over stops left by a process that is gone; nothing is told to quit here
/// (that may take [`super::daemon::DEADLINE`] twice): the caller passes the marks to
/// [`finish_stops`] after its step. A start in progress is left to its starter; one whose
/// starter is gone is swept.
pub fn stop_unused(cfg: &Config, m: &dyn Mps, proc: Proc, st: &mut State) -> Stops {
    let mut out = take_over(proc, st, None);
    out.notes.extend(sweep_dead(cfg, m, proc, st));
    let me = own_ref(proc);
    let p = plan(st, &BTreeSet::new(), &|r| proc.alive(r));
    for pci in p.stop {
        let Some(d) = st.mps.get_mut(&pci) else {
            continue;
        };
        if d.starting || d.stopping.is_some() {
            continue;
        }
        if !proc.alive(&d.proc) {
            out.notes.push(format!(
                "MPS daemon pid {} of GPU {pci} had already exited",
                d.proc.pid
            ));
            st.mps.remove(&pci);
            continue;
        }
        let Some(me) = me else {
            out.notes.push(format!(
                "MPS daemon pid {} of GPU {pci} has no sharer left, but this process's start time is unknown: it stays recorded",
                d.proc.pid
            ));
            continue;
        };
        out.marked.push(Stop {
            pci,
            daemon: d.clone(),
            taken_over: false,
        });
        d.stopping = Some(me);
    }
    out
}

/// How long a stop waits for what it killed to be gone (outside the lock).
pub const KILL_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// After the locked step that marked them ([`stop_unused`], [`take_over`]), outside the
/// lock: each daemon is told to quit (one whose stop was taken over is not: it is killed),
/// and killed with what was started for it when it does not go; then one locked step
/// forgets each that is gone (still marked by this process). One that does not die stays
/// recorded `stopping`; a later locked step forgets it once it is gone.
pub fn finish_stops(cfg: &Config, m: &dyn Mps, proc: Proc, stops: Vec<Stop>) -> Vec<String> {
    let mut notes = Vec::new();
    if stops.is_empty() {
        return notes;
    }
    for s in &stops {
        let (pci, d) = (s.pci, &s.daemon);
        let quit = match s.taken_over {
            true => None,
            false => Some(m.quit(cfg, pci, d)),
        };
        if let Some(Ok(())) = quit {
            notes.push(format!(
                "stopped MPS daemon pid {} of GPU {pci} (no sharer left)",
                d.proc.pid
            ));
            continue;
        }
        let swept = m.kill(cfg, pci, d, KILL_GRACE);
        let why = match quit {
            Some(Err(e)) => format!("{e}"),
            _ => format!("MPS daemon pid {} of GPU {pci}", d.proc.pid),
        };
        notes.push(if swept.left.is_empty() {
            format!("{why}; killed: {:?}", swept.killed)
        } else {
            format!(
                "{why}; killed, not gone yet: {:?} (it stays recorded as stopping; no daemon is started for the GPU until it is gone)",
                swept.left
            )
        });
    }
    let me = own_ref(proc);
    let forgot = crate::reserve::state::Store::new(&cfg.state_file).update(|st| {
        for s in &stops {
            let mine = st.mps.get(&s.pci).is_some_and(|r| {
                r.proc == s.daemon.proc && r.stopping.is_some() && r.stopping == me
            });
            if mine && !proc.alive(&s.daemon.proc) {
                st.mps.remove(&s.pci);
            }
        }
        Ok::<_, crate::reserve::state::StateError>(())
    });
    if let Err(e) = forgot {
        notes.push(format!(
            "the stopped MPS daemons' records are not forgotten now ({e}): a later step does"
        ));
    }
    notes
}
