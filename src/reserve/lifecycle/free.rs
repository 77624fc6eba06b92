//! The one free path: every door's stop, an operator's `release`, and `reconcile` take
//! reservations out of the state through [`free`], so a freed unit that a process still
//! has open is draining whoever freed it.

use super::store::store;
use crate::host::inventory::Scan;
use crate::log;
use crate::reserve::drain::{self, Settled};
use crate::reserve::error::Error;
use crate::reserve::facts::Facts;
use crate::reserve::state::{HolderKind, Reservation, State};

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
    f: &Facts,
    choose: impl FnOnce(&State) -> Vec<(String, W)>,
    then: impl FnOnce(&mut State),
) -> Result<Released<W>, Error> {
    let mut stops = Vec::new();
    let released = store(f.cfg).update(|st| {
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
pub(super) fn drain_freed<W>(f: &Facts, st: &mut State, freed: &[(Reservation, W)]) -> Settled {
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

/// `stopped`/`release`/`delete`: frees the reservation the state holds under `id` for a
/// holder of this kind (whatever the holder's request says now); returns it, if there was one.
pub fn free_key(f: &Facts, kind: HolderKind, id: &str) -> Result<Option<Reservation>, Error> {
    let mine = |st: &State| match st.reservations.get(id) {
        Some(r) if r.kind == kind => vec![(id.to_string(), ())],
        _ => Vec::new(),
    };
    let freed = free(f, mine, |_| {})?;
    Ok(freed.freed.into_iter().next().map(|(r, ())| r))
}
