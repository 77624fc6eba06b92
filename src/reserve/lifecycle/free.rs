//! The one free path: every door's stop, an operator's `release`, and `reconcile` take
//! reservations out of the state through [`free`], so a freed unit that a process still
//! has open is draining whoever freed it.

use super::error::LifecycleError;
use crate::host::inventory::Scan;
use crate::log;
use crate::reserve::drain::{self, Settled};
use crate::reserve::error::Error;
use crate::reserve::state::{
    Blocked, HolderKey, HolderKind, Reservation, State, Store, Transition,
};
use crate::reserve::world::World;

/// What one free took out of the state, each with what the chooser said of it (`why`: a
/// reason for `reconcile`, nothing for the others), and which of its units now drain.
#[derive(Debug)]
pub struct Released<W = ()> {
    pub freed: Vec<(Reservation, W)>,
    pub drained: Settled,
}

/// Frees, in one step under the state's lock: `choose` names the reservations (by key) to
/// take out, each with a `why`; their units that a process still has open become draining
/// (nodes read through `f.scan`, openers looked for in `f.proc`); then `then` runs on the
/// state (a door's own bookkeeping, in the same locked step). A key that is not in the state
/// frees nothing.
pub fn free<W>(
    f: &World,
    choose: impl FnOnce(&State) -> Vec<(HolderKey, W)>,
    then: impl FnOnce(&mut State),
) -> Result<Released<W>, Error> {
    let mut stops = Vec::new();
    let released = Store::new(&f.cfg.state_file).update(|st| {
        let freed: Vec<(Reservation, W)> = choose(st)
            .into_iter()
            .filter_map(|(k, why)| st.reservations.remove(&k).map(|r| (r, why)))
            .collect();
        let drained = drain_freed(f, st, &freed);
        then(st);
        // A daemon left without sharers (by this free, or one before that could not stop
        // it) is marked to stop: told to quit below, after the lock.
        let s = crate::reserve::mps::stop_unused(f.cfg, f.mps, f.proc, st);
        s.notes.iter().for_each(|n| log::info(n));
        stops = s.marked;
        Ok::<_, Error>(Released { freed, drained })
    })?;
    for n in crate::reserve::mps::finish_stops(f.cfg, f.mps, f.proc, stops) {
        log::info(&n);
    }
    Ok(released)
}

/// After `freed` left the state: their units that a process still has open become draining.
/// The nodes' numbers come from the host's inventory, read here (lazily: the driver's details
/// of the freed GPUs only); when it cannot be read that is said, and the units are free.
pub(super) fn drain_freed<W>(f: &World, st: &mut State, freed: &[(Reservation, W)]) -> Settled {
    if freed.iter().all(|(r, _)| r.gpus.is_empty()) {
        return Settled::default();
    }
    let lazy = Scan {
        caps: None,
        lazy: true,
    };
    let mut inv = match (f.scan)(f.cfg, lazy) {
        Ok(i) => i,
        Err(e) => {
            log::warn(&format!(
                "cannot look for processes that keep freed GPUs open ({e}): they are free"
            ));
            let rs: Vec<Reservation> = freed.iter().map(|(r, _)| r.clone()).collect();
            crate::reserve::health::scrub::scrub_freed(f.cfg, st, None, &rs);
            return Settled::default();
        }
    };
    let rs: Vec<Reservation> = freed.iter().map(|(r, _)| r.clone()).collect();
    drain::after_free_in(&mut inv, f.cfg, st, &rs, f.proc)
}

/// `stopped`/`release`/`delete`: frees the reservation the state holds under `key` (a
/// holder's: its kind is in its key), whatever the holder's request says now; returns it, if
/// there was one.
pub fn free_key(f: &World, key: &HolderKey) -> Result<Option<Reservation>, Error> {
    let mine = |st: &State| match st.reservations.contains_key(key) {
        true => vec![(key.clone(), ())],
        false => Vec::new(),
    };
    let freed = free(f, mine, |_| {})?;
    Ok(freed.freed.into_iter().next().map(|(r, ())| r))
}

/// `gpuhook release`: frees the reservation under `key` (its holder resolved by the door),
/// unless its holder still runs: the transition table's `Release` row refuses a running
/// reservation whose container init lives and that holds GPUs (its device access is
/// gpuhook's grant, and the GPU must not be free while it has it), saying how to stop it or
/// take its GPUs back first. A prepared one, or one whose holder is gone, is freed. Refused
/// at a look without the lock (nothing written), and decided again under it.
pub fn release(f: &World, key: &HolderKey) -> Result<Released, Error> {
    if let Some(r) = Store::new(&f.cfg.state_file).read()?.reservations.get(key) {
        may_release(f, r)?;
    }
    let mut refused = None;
    let choose = |st: &State| match st.reservations.get(key).map(|r| may_release(f, r)) {
        Some(Ok(())) => vec![(key.clone(), ())],
        Some(Err(e)) => {
            refused = Some(e);
            Vec::new()
        }
        None => Vec::new(),
    };
    let out = free(f, choose, |_| {})?;
    match refused {
        Some(e) => Err(e.into()),
        None => Ok(out),
    }
}

/// The `Release` row for `r`: a reservation that holds no GPU gives no access, whoever runs.
fn may_release(f: &World, r: &Reservation) -> Result<(), LifecycleError> {
    let mut found = r.found(|p| f.proc.alive(p), None);
    found.live &= !r.gpus.is_empty();
    match Transition::Release.from(Some(found)) {
        Err(Blocked::Runs) => Err(still_runs(r)),
        _ => Ok(()),
    }
}

/// The refusal of a running holder's release: how to stop it, or take its GPUs back.
fn still_runs(r: &Reservation) -> LifecycleError {
    let detach = match r.kind() {
        HolderKind::Libvirt | HolderKind::Oci => Some(format!(
            "gpuhook detach {} {} --all",
            r.holder.name(),
            r.kind().flag()
        )),
        HolderKind::Vm | HolderKind::Pod => None,
    };
    LifecycleError::StillRuns {
        who: r.holder.who(),
        init: r.init.map_or(0, |i| i.pid),
        gpus: r.gpus.clone(),
        detach,
    }
}
