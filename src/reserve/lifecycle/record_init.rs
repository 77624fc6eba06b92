//! OCI `createRuntime`: the container's init exists, and the reservation runs.

use super::error::LifecycleError;
use super::holder::Holder;
use crate::host::procfs::ProcRef;
use crate::ids::Unit;
use crate::log;
use crate::reserve::error::Error;
use crate::reserve::state::Store;
use crate::reserve::state::{now_rfc3339, Started, Transition};
use crate::reserve::world::World;

/// An OCI container's init exists (its `createRuntime` hook): the reservation is running and
/// stale once that init is gone. `by` is the process that reserved it (the hook's token): a
/// hook left from another `create` of the same ID acts on nothing. An error when the
/// container holds no such reservation. `cgroup`, `namespaces`: where the runtime put the
/// init.
pub fn record_init(
    f: &World,
    h: &Holder,
    by: ProcRef,
    init: ProcRef,
    cgroup: Option<crate::cgroup::Made>,
    namespaces: Option<crate::host::procfs::Namespaces>,
) -> Result<(), Error> {
    let now = now_rfc3339();
    let gpus = Store::new(&f.cfg.state_file).update(|st| -> Result<_, Error> {
        // A container created with a pod's allocation holds that.
        let key = match &h.id {
            crate::reserve::state::HolderId::Oci { id } => {
                st.container_key(id).unwrap_or_else(|| h.key.clone())
            }
            _ => h.key.clone(),
        };
        let r = st
            .reservations
            .get_mut(&key)
            .filter(|r| r.prepared_by == Some(by))
            .ok_or(LifecycleError::NotThisCreate)?;
        // Its nodes were recorded at its create (the runtime made them from its config).
        Transition::RecordInit
            .from(Some(r.found(|p| f.proc.alive(p), Some(by))))
            .map_err(|_| LifecycleError::NotThisCreate)?;
        let started = Started {
            controller: None,
            init,
            nodes: std::mem::take(&mut r.nodes),
            cgroup,
            namespaces,
        };
        r.set_running(started, &now);
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
