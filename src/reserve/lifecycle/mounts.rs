//! Mounts recorded before they are made: a detach, even after a SIGKILL, takes them back.

use super::error::LifecycleError;
use crate::cdi;
use crate::enter::rootfs::Mounted;
use crate::ids::Unit;
use crate::reserve::error::Error;
use crate::reserve::state::State;

/// A mount as the state records it before it is made: its target, and the identity its
/// source has on the host (what the mount shows at the target, `open_tree` following links
/// as this `stat` does), so that a detach after a SIGKILL unmounts it only if it is there.
pub(super) fn planned(m: &cdi::BindMount) -> Result<Mounted, Error> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(&m.source).map_err(|source| LifecycleError::MountSource {
        path: m.source.clone(),
        source,
    })?;
    Ok(Mounted {
        target: m.target.clone(),
        dev: md.dev(),
        ino: md.ino(),
    })
}

/// The MPS daemon serving a holder of `units` (if one does), whose directories' mounts are
/// recorded in the reservation under `key` before they are made (their targets and their
/// sources' identity), as the CDI mounts an attach makes are: a detach, even after a
/// SIGKILL, takes them back. Returns the daemon with those records.
pub(super) fn record_mps_mounts(
    st: &mut State,
    key: &crate::reserve::state::HolderKey,
    units: &[Unit],
) -> Result<
    Option<(
        crate::ids::Pci,
        crate::reserve::mps::Daemon,
        Vec<crate::enter::rootfs::Mounted>,
    )>,
    Error,
> {
    let Some((pci, d)) = crate::reserve::mps::daemon_for(st, units) else {
        return Ok(None);
    };
    let d = d.clone();
    let made = crate::reserve::mps::mounts(&d)
        .iter()
        .map(planned)
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(r) = st.reservations.get_mut(key) {
        r.mounts.extend(made.iter().cloned());
    }
    Ok(Some((pci, d, made)))
}
