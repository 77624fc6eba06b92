//! OCI `createRuntime`: the container's init exists, and the reservation runs.

use super::error::LifecycleError;
use super::holder::Holder;
use super::store::store;
use crate::host::procfs::ProcRef;
use crate::ids::Unit;
use crate::log;
use crate::reserve::error::Error;
use crate::reserve::facts::Facts;
use crate::reserve::state::now_rfc3339;

/// An OCI container's init exists (its `createRuntime` hook): the reservation is running and
/// stale once that init is gone. `by` is the process that reserved it (the hook's token): a
/// hook left from another `create` of the same ID acts on nothing. An error when the
/// container holds no such reservation. `cgroup`, `namespaces`: where the runtime put the
/// init.
pub fn record_init(
    f: &Facts,
    h: &Holder,
    by: ProcRef,
    init: ProcRef,
    cgroup: Option<crate::cgroup::Made>,
    namespaces: Option<crate::host::procfs::Namespaces>,
) -> Result<(), Error> {
    let now = now_rfc3339();
    let gpus = store(f.cfg).update(|st| -> Result<_, Error> {
        let r = st
            .reservations
            .get_mut(h.id)
            .filter(|r| r.kind == h.kind && r.prepared_by == Some(by))
            .ok_or(LifecycleError::NotThisCreate)?;
        r.set_init(init, cgroup, namespaces, &now);
        Ok(r.gpus.clone())
    })?;
    log::info(&format!(
        "{}: init {} runs with GPUs {}",
        h.who(),
        init.pid,
        Unit::join(&gpus, ",")
    ));
    Ok(())
}
