//! The state file as the steps and doors reach it: under its lock, or a look at its bytes.

use super::error::LifecycleError;
use super::holder::Holder;
use crate::host::config::Config;
use crate::reserve::error::Error;
use crate::reserve::state::{Reservation, State, StateError, Store};

pub(super) fn store(cfg: &Config) -> Store {
    Store::new(&cfg.state_file)
}

pub(super) fn reservation(st: &State, h: &Holder) -> Result<Reservation, Error> {
    st.reservations
        .get(h.id)
        .cloned()
        .ok_or(LifecycleError::NoReservation.into())
}

/// Runs `f` on the state under its lock (written back only when it changed): for a front
/// door's own bookkeeping that must not race a reserve or a free (its own error type, which
/// says a state that cannot be read or written too).
pub fn with_state<T, E: From<StateError>>(
    cfg: &Config,
    f: impl FnOnce(&mut State) -> Result<T, E>,
) -> Result<T, E> {
    store(cfg).update(f)
}

/// Whether the state's bytes name `id`: a look without lock or parse, for a front door with
/// nothing to do unless the state holds something for it.
pub fn may_hold(cfg: &Config, id: &str) -> bool {
    store(cfg).mentions(id)
}

/// The directory of the MPS daemon serving the holder `id`'s slots, if one does
/// ([`crate::reserve::mps::daemon_for`]).
pub fn mps_dir(cfg: &Config, id: &str) -> Option<std::path::PathBuf> {
    let st = store(cfg).read().ok()?;
    let r = st.reservations.get(id)?;
    crate::reserve::mps::daemon_for(&st, &r.gpus).map(|(_, d)| d.dir.clone())
}
