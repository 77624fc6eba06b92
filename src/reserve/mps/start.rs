//! Starting a GPU's daemon without holding the state lock while it comes up: the caller's
//! locked step marks the slot `starting` ([`claim`]: its directories made, the starter
//! recorded); after the lock is dropped, [`bring_up`] starts it and a second locked step
//! records it, or forgets the mark (and undoes the caller's step) when it failed. A second
//! sharer that finds the mark waits for it, outside the lock; a mark whose starter is gone
//! is swept by the next locked step ([`super::plan::sweep_dead`], one bounded pass: a sharer
//! that finds what it left still dying waits for it, outside the lock, as for a start). A
//! sharer that finds the GPU's daemon being stopped (`stopping`: its last sharer left) waits
//! for it to be gone the same way (taking the stop over when its stopper is gone), then
//! starts a new one; never one beside it.

use super::daemon::Daemon;
use super::error::MpsError;
use super::plan::{finish_stops, mps_gpus_of, own_ref, plan, sweep_dead, take_over};
use super::work::Mps;
use crate::host::config::Config;
use crate::host::inventory::Inventory;
use crate::host::procfs::{Proc, ProcRef};
use crate::ids::{Pci, Unit};
use crate::reserve::state::{State, StateError, Store};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a sharer waits for a daemon another process is starting (its `-d`, its PID
/// file and its limits may each take [`super::daemon::DEADLINE`]).
pub const WAIT: Duration = Duration::from_secs(35);
/// How often it looks again.
const WAIT_POLL: Duration = Duration::from_millis(20);
/// How often it looks again when the start's process is gone and what it left is dying, or
/// when the daemon is being stopped: each look is a locked step (with a pass of the sweep),
/// so other doors get the lock between.
const SWEEP_POLL: Duration = Duration::from_millis(100);

/// What [`bring_up`] did: lines for the log, and the daemons of the holder's GPUs.
#[derive(Debug, Default)]
pub struct Up {
    pub notes: Vec<String>,
    pub daemons: BTreeMap<Pci, Daemon>,
}

/// Under the state lock (the caller's step): sweeps starts whose starter is gone, and marks
/// `starting` the daemons the holder of `units` needs (a GPU shared with MPS it holds a
/// slot of, with no live daemon and no live start recorded), its directories made. Fails,
/// and the caller's step with it, when one cannot be (a GPU without a UUID). Nothing is
/// started here: [`bring_up`], after the lock, does.
pub fn claim(
    cfg: &Config,
    m: &dyn Mps,
    proc: Proc,
    st: &mut State,
    inv: &Inventory,
    units: &[Unit],
) -> Result<Vec<String>, MpsError> {
    let notes = sweep_dead(cfg, m, proc, st);
    let gpus = mps_gpus_of(inv, units);
    if gpus.is_empty() {
        return Ok(notes);
    }
    let me = own_ref(proc);
    for pci in plan(st, &gpus, &|r| Some(*r) == me || proc.alive(r)).start {
        let Some(g) = inv.by_pci(&pci) else { continue };
        let uuid = g.uuid.clone().ok_or(MpsError::NoUuid { pci })?;
        let me = me.ok_or(MpsError::OwnStartTime {
            pci,
            pid: std::process::id() as i32,
        })?;
        let dir = m.dirs(cfg, pci, &uuid)?;
        st.mps.insert(
            pci,
            Daemon {
                proc: me,
                uuid,
                dir,
                starting: true,
                stopping: None,
            },
        );
    }
    Ok(notes)
}

/// Who starts the daemons of a holder's GPUs, as one locked look sees it.
#[derive(Default)]
struct StartLook {
    /// Marked `starting` by this process: to start now.
    mine: Vec<(Pci, String)>,
    /// Marked by another live process: to wait for.
    theirs: Vec<(Pci, Daemon)>,
    /// Being stopped: to wait for, until it is gone.
    stopping: Vec<(Pci, Daemon)>,
    /// Recorded.
    done: Vec<(Pci, Daemon)>,
}

fn look(st: &State, gpus: &[Pci], me: Option<ProcRef>) -> StartLook {
    let mut l = StartLook::default();
    for pci in gpus {
        match st.mps.get(pci) {
            Some(d) if d.stopping.is_some() => l.stopping.push((*pci, d.clone())),
            Some(d) if d.starting && Some(d.proc) == me => l.mine.push((*pci, d.uuid.clone())),
            Some(d) if d.starting => l.theirs.push((*pci, d.clone())),
            Some(d) => l.done.push((*pci, d.clone())),
            None => {}
        }
    }
    l
}

/// Forgets the starts this process marked.
fn forget_mine(st: &mut State, me: Option<ProcRef>) {
    st.mps.retain(|_, d| !(d.starting && Some(d.proc) == me));
}

/// After the caller's locked step ([`claim`]), outside the lock: starts the daemons this
/// process marked for the holder of `units`, records them in a second locked step, and
/// waits (bounded by [`WAIT`]) for those another process is starting. On failure the
/// marks are forgotten, `undo` is applied to the state in the same locked step (the
/// caller's step taken back: nothing is reserved), the daemons this call started are told
/// to quit, and the error returned.
pub fn bring_up(
    cfg: &Config,
    m: &dyn Mps,
    proc: Proc,
    inv: &Inventory,
    units: &[Unit],
    undo: &dyn Fn(&mut State),
) -> Result<Up, MpsError> {
    let gpus: Vec<Pci> = mps_gpus_of(inv, units).into_iter().collect();
    let mut up = Up::default();
    if gpus.is_empty() {
        return Ok(up);
    }
    let store = Store::new(&cfg.state_file);
    let me = own_ref(proc);
    let fail = |e: MpsError| {
        let _ = store.update(|st| -> Result<(), StateError> {
            forget_mine(st, me);
            undo(st);
            Ok(())
        });
        e
    };
    let end = Instant::now() + WAIT;
    loop {
        // Locked: sweep, mark again what a failed start of another process left unstarted,
        // take over a stop of these GPUs whose stopper is gone.
        let (l, stops) = store
            .update(|st| -> Result<(StartLook, Vec<_>), MpsError> {
                let taken = take_over(proc, st, Some(&gpus));
                for n in taken
                    .notes
                    .into_iter()
                    .chain(claim(cfg, m, proc, st, inv, units)?)
                {
                    // A sweep that waits for what it killed says so once.
                    if !up.notes.contains(&n) {
                        up.notes.push(n);
                    }
                }
                Ok((look(st, &gpus, me), taken.marked))
            })
            .map_err(fail)?;
        up.notes.extend(finish_stops(cfg, m, proc, stops));
        if !l.mine.is_empty() {
            let started = start_mine(cfg, m, inv, &l.mine).map_err(fail)?;
            record(cfg, m, &store, me, started, &mut up).map_err(fail)?;
        }
        up.daemons.extend(l.done);
        if let Some((pci, d)) = l.stopping.into_iter().next() {
            if Instant::now() >= end {
                return Err(fail(MpsError::StillStopping {
                    pci,
                    uuid: d.uuid,
                    pid: d.proc.pid,
                    waited: WAIT,
                }));
            }
            // Each look is a locked step that forgets it once it is gone.
            std::thread::sleep(SWEEP_POLL);
            continue;
        }
        let Some((pci, d)) = l.theirs.into_iter().next() else {
            return Ok(up);
        };
        if Instant::now() >= end {
            // A mark whose starter is gone is one whose leftovers do not die.
            let (uuid, starter) = (d.uuid, d.proc.pid);
            return Err(fail(if proc.alive(&d.proc) {
                MpsError::StillStarting {
                    pci,
                    uuid,
                    starter,
                    waited: WAIT,
                }
            } else {
                MpsError::Unswept {
                    pci,
                    uuid,
                    starter,
                    waited: WAIT,
                }
            }));
        }
        std::thread::sleep(if proc.alive(&d.proc) {
            WAIT_POLL
        } else {
            SWEEP_POLL
        });
    }
}

/// Starts the daemons marked by this process, outside the lock; on a failure, the ones
/// started before it are told to quit.
fn start_mine(
    cfg: &Config,
    m: &dyn Mps,
    inv: &Inventory,
    mine: &[(Pci, String)],
) -> Result<Vec<(Pci, Daemon)>, MpsError> {
    let mut started: Vec<(Pci, Daemon)> = Vec::new();
    for (pci, uuid) in mine {
        let Some(sharing) = inv.by_pci(pci).and_then(|g| g.sharing) else {
            continue;
        };
        match m.start(cfg, *pci, uuid, &sharing) {
            Ok(d) => started.push((*pci, d)),
            Err(e) => {
                for (pci, d) in &started {
                    let _ = m.quit(cfg, *pci, d);
                }
                return Err(e);
            }
        }
    }
    Ok(started)
}

/// The second locked step: records the daemons started (each in place of this process's
/// mark). One whose mark is gone (swept) is told to quit, as are all when the state cannot
/// be written: no daemon runs unrecorded.
fn record(
    cfg: &Config,
    m: &dyn Mps,
    store: &Store,
    me: Option<ProcRef>,
    started: Vec<(Pci, Daemon)>,
    up: &mut Up,
) -> Result<(), MpsError> {
    let stray = store.update(|st| -> Result<Vec<(Pci, Daemon)>, MpsError> {
        let mut stray = Vec::new();
        for (pci, d) in &started {
            if st
                .mps
                .get(pci)
                .is_some_and(|r| r.starting && Some(r.proc) == me)
            {
                up.notes.push(format!(
                    "started MPS daemon pid {} for GPU {pci} ({})",
                    d.proc.pid, d.uuid
                ));
                st.mps.insert(*pci, d.clone());
                up.daemons.insert(*pci, d.clone());
            } else {
                stray.push((*pci, d.clone()));
            }
        }
        Ok(stray)
    });
    let stray = match stray {
        Ok(s) => s,
        Err(e) => {
            for (pci, d) in &started {
                let _ = m.quit(cfg, *pci, d);
            }
            return Err(e);
        }
    };
    for (pci, d) in stray {
        up.daemons.remove(&pci);
        let _ = m.quit(cfg, pci, &d);
    }
    Ok(())
}
