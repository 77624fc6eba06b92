//! The crate's error: each module's own error, kept as one line that names the cause.

use crate::alloc::AllocError;
use crate::cgroup::CgroupError;
use crate::config::ConfigError;
use crate::container::ContainerError;
use crate::inventory::InventoryError;
use crate::metadata::ParseError;
use crate::state::StateError;

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
    #[error("{0}")]
    Other(String),
}

impl Error {
    pub fn other(m: impl Into<String>) -> Error {
        Error::Other(m.into())
    }
}
