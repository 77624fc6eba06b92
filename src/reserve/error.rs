//! The crate's error: each module's own error, kept as one line that names the cause.

use crate::cgroup::CgroupError;
use crate::enter::container::ContainerError;
use crate::enter::rootfs::RootfsError;
use crate::host::config::ConfigError;
use crate::host::inventory::InventoryError;
use crate::request::metadata::ParseError;
use crate::reserve::alloc::AllocError;
use crate::reserve::state::StateError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Parse(#[from] ParseError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("{0}")]
    Alloc(#[from] AllocError),
    #[error("{0}")]
    Container(#[from] ContainerError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// The OCI door's check of the container's root ([`crate::enter::rootfs::check_path`]).
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    /// A failure whose rollback could not undo everything: what is left is said on the same
    /// line, and kept as a value for callers.
    #[error("{error}{}", crate::cgroup::rollback_note(left))]
    RollbackIncomplete {
        error: Box<Error>,
        left: Vec<String>,
    },
    #[error("{0}")]
    Other(String),
}

impl Error {
    pub fn other(m: impl Into<String>) -> Error {
        Error::Other(m.into())
    }
}
