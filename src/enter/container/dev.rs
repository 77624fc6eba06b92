//! A container's `/dev` tmpfs as gpuhook knows it: its identity and who made it.

use serde::{Deserialize, Serialize};

/// The tmpfs libvirt's controller mounts at `/run/libvirt/lxc/NAME.dev` in its own mount
/// namespace and moves to the container's `/dev` (`virLXCControllerSetupDev`,
/// `lxcContainerMountFSDev`), or the one an OCI runtime mounts at the container's `/dev`:
/// its device and the inode of its root. The only `/dev` gpuhook writes into is the
/// directory with exactly this identity; a container that bind-mounts another directory (of
/// its host-backed rootfs, a `<filesystem>` passthrough, a fresh devtmpfs) over `/dev` or `/`
/// is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevTmpfs {
    pub dev: u64,
    pub ino: u64,
    /// Who made it (and whose mounts it was read from).
    #[serde(default)]
    pub by: DevBy,
}

/// Who made a container's `/dev` tmpfs, and whose mounts gpuhook reads it from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DevBy {
    /// libvirt's controller, read from the controller's own mounts (the container cannot
    /// change them).
    #[default]
    Libvirt,
    /// The OCI runtime, read from the container init's mounts.
    Runtime,
}

impl DevBy {
    /// Who made it, as messages say.
    pub fn maker(self) -> &'static str {
        match self {
            DevBy::Libvirt => "libvirt",
            DevBy::Runtime => "its OCI runtime",
        }
    }

    /// Whose mounts it is read from, as messages say.
    pub fn viewer(self) -> &'static str {
        match self {
            DevBy::Libvirt => "controller",
            DevBy::Runtime => "container init",
        }
    }
}
