//! Why a health step failed or was refused.

use crate::ids::Pci;
use nix::errno::Errno;
use std::path::{Path, PathBuf};

/// Why a health step failed or was refused: one line naming the file or the GPU.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error("{}: {source}", path.display())]
    Kmsg {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("'{pci}' is not a PCI address like 0000:3b:00.0")]
    NotPci { pci: String },
    #[error("GPU {pci} is not quarantined")]
    NotQuarantined { pci: String },
    #[error("{pci} is not a GPU this host lists")]
    NotAGpu { pci: Pci },
    #[error("GPU {pci} is held by {who}: it is reset only when nothing holds it")]
    Held { pci: Pci, who: String },
    #[error("GPU {pci} is open: {who}; it is reset only when no process has it open")]
    Open { pci: Pci, who: String },
    #[error("GPU {pci} may be open: the descriptors of {total} process(es) (pids {who}) were not all read in time; it is reset only when no process has it open")]
    Unread { pci: Pci, who: String, total: usize },
    #[error("GPU {pci} is being reset (pid {pid}, since {since})")]
    Resetting { pci: Pci, pid: i32, since: String },
    #[error("cannot read this process's own start time")]
    OwnStartTime,
}

impl HealthError {
    pub(super) fn kmsg(path: &Path, e: Errno) -> HealthError {
        HealthError::Kmsg {
            path: path.to_path_buf(),
            source: e.into(),
        }
    }
}
