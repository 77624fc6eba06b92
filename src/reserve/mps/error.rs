//! Why an MPS daemon could not be started or stopped.

use crate::ids::Pci;
use crate::reserve::state::StateError;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    #[error("GPU {pci} is shared with MPS but has no UUID: cannot start its MPS daemon")]
    NoUuid { pci: Pci },
    #[error("MPS daemon of GPU {pci} ({uuid}): {what}: {cause}")]
    Io {
        pci: Pci,
        uuid: String,
        what: String,
        cause: std::io::Error,
    },
    #[error("MPS daemon of GPU {pci} ({uuid}): {what}")]
    Failed {
        pci: Pci,
        uuid: String,
        what: String,
    },
    #[error(
        "MPS daemon of GPU {pci} ({uuid}): still being started by pid {starter} after {waited:?}"
    )]
    StillStarting {
        pci: Pci,
        uuid: String,
        starter: i32,
        waited: Duration,
    },
    #[error(
        "MPS daemon of GPU {pci} ({uuid}): what its start by pid {starter} left (the process is gone) still runs {waited:?} after it was killed; no daemon is started beside it"
    )]
    Unswept {
        pci: Pci,
        uuid: String,
        starter: i32,
        waited: Duration,
    },
    #[error(
        "MPS daemon of GPU {pci} ({uuid}): pid {pid} is being stopped and still runs {waited:?} later; no daemon is started beside it"
    )]
    StillStopping {
        pci: Pci,
        uuid: String,
        pid: i32,
        waited: Duration,
    },
    #[error("MPS daemon of GPU {pci}: the start time of this process (pid {pid}) is unknown")]
    OwnStartTime { pci: Pci, pid: i32 },
    #[error(transparent)]
    State(#[from] StateError),
}
