//! What the steps share of the state file (reached as every door reaches it:
//! [`Store::new`] of the config's `state_file`, read or changed under its lock).

use super::error::LifecycleError;
use super::holder::Holder;
use crate::host::config::Config;
use crate::reserve::error::Error;
use crate::reserve::state::{HolderKey, Reservation, State, Store};

pub(super) fn reservation(st: &State, h: &Holder) -> Result<Reservation, Error> {
    st.reservations
        .get(&h.key)
        .cloned()
        .ok_or(LifecycleError::NoReservation.into())
}

/// The directory of the MPS daemon serving the slots of the holder filed under `key`, if
/// one does ([`crate::reserve::mps::daemon_for`]).
pub fn mps_dir(cfg: &Config, key: &HolderKey) -> Option<std::path::PathBuf> {
    let st = Store::new(&cfg.state_file).read().ok()?;
    let r = st.reservations.get(key)?;
    crate::reserve::mps::daemon_for(&st, &r.gpus).map(|(_, d)| d.dir.clone())
}
