//! The crate's error: each module's own error, kept as one line that names the cause.

use crate::cdi::{LoadError, PlanError};
use crate::cgroup::CgroupError;
use crate::enter::container::ContainerError;
use crate::enter::rootfs::RootfsError;
use crate::host::config::ConfigError;
use crate::host::inventory::InventoryError;
use crate::request::metadata::ParseError;
use crate::request::Unmapped;
use crate::reserve::alloc::AllocError;
use crate::reserve::health::error::HealthError;
use crate::reserve::lifecycle::error::LifecycleError;
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
    #[error(transparent)]
    Unmapped(#[from] Unmapped),
    /// The OCI door's check of the container's root ([`crate::enter::rootfs::check_path`]).
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    #[error(transparent)]
    Mps(#[from] crate::reserve::mps::MpsError),
    /// A failure whose rollback could not undo everything: what is left is said on the same
    /// line, and kept as a value for callers.
    #[error("{error}{}", left.note())]
    RollbackIncomplete {
        error: Box<Error>,
        left: crate::leftovers::Leftovers,
    },
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    /// A step failed and the init turned out gone: that is the cause, the failure in brackets.
    #[error("container init {pid} exited during started ({error})")]
    InitExitedAfter {
        pid: i32,
        #[source]
        error: Box<Error>,
    },
    #[error(transparent)]
    Health(#[from] HealthError),
    /// The vendors' CDI specs could not be read (one line naming the file).
    #[error(transparent)]
    CdiSpecs(#[from] LoadError),
    /// The CDI specs' edits for the container's units cannot be made.
    #[error(transparent)]
    CdiPlan(#[from] PlanError),
    /// The running driver's user space cannot be given (`driver="host"`).
    #[error(transparent)]
    Driver(#[from] crate::host::driver::DriverError),
    /// A virtual machine's hostdevs ([`crate::reserve::vm`]).
    #[error(transparent)]
    Vm(Box<crate::reserve::vm::error::VmError>),
    /// libvirt's QEMU status directory (a VM's pid file).
    #[error(transparent)]
    QemuFile(Box<crate::host::qemu::QemuFileError>),
}

impl Error {
    /// The error with its allocation refusal (if it is one, or carries one) in `w`, the
    /// words of the door its request came through ([`AllocError::in_words`]).
    pub fn in_words(self, w: crate::request::Wording) -> Error {
        match self {
            Error::Alloc(e) => Error::Alloc(e.in_words(w)),
            Error::RollbackIncomplete { error, left } => Error::RollbackIncomplete {
                error: Box::new(error.in_words(w)),
                left,
            },
            Error::InitExitedAfter { pid, error } => Error::InitExitedAfter {
                pid,
                error: Box::new(error.in_words(w)),
            },
            e => e,
        }
    }
}

impl From<crate::reserve::vm::error::VmError> for Error {
    fn from(e: crate::reserve::vm::error::VmError) -> Error {
        Error::Vm(Box::new(e))
    }
}

impl From<crate::host::qemu::QemuFileError> for Error {
    fn from(e: crate::host::qemu::QemuFileError) -> Error {
        Error::QemuFile(Box::new(e))
    }
}
