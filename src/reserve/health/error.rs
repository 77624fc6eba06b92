//! Why a health step failed or was refused.

use crate::ids::Pci;
use nix::errno::Errno;
use std::path::{Path, PathBuf};

/// Why a health step failed or was refused: one line naming the file or the GPU.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    /// The kernel log cannot be read: which file, what `health scan` wants of it, what to do.
    #[error("cannot read the kernel log {} ({source}): health scan finds the NVIDIA driver's Xid records there{}", path.display(), kmsg_hint(source))]
    Kmsg {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("'{pci}' is neither a PCI address (0000:3b:00.0), a GPU UUID (GPU-…) nor an index")]
    NotPci { pci: String },
    /// A GPU named by its index or UUID that this host does not list.
    #[error("no GPU with {sel} on this host (gpuhook list shows them)")]
    NoSuchGpu { sel: crate::request::DeviceSel },
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
    /// The configured reset cannot run at all: nothing was marked.
    #[error("GPU {pci} not reset: the config's reset_command cannot run: {source}; a configuration fault, so nothing was marked and the GPU keeps its state: {}", source.remedy())]
    Unrunnable { pci: Pci, source: Unrunnable },
    #[error("GPU {pci} is being reset (pid {pid}, since {since})")]
    Resetting { pci: Pci, pid: i32, since: String },
    #[error("cannot read this process's own start time")]
    OwnStartTime,
}

/// What an operator can do about a kernel log that cannot be read.
fn kmsg_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::NotFound => "; it is the kmsg under the config's \"dev\" root (/dev/kmsg on a host): a \"dev\" that names another tree, or a container or fake host without one (run the scan on the host)",
        std::io::ErrorKind::PermissionDenied => "; run it as root, as gpuhook-health.service does",
        _ => "",
    }
}

impl HealthError {
    pub(super) fn kmsg(path: &Path, e: Errno) -> HealthError {
        HealthError::Kmsg {
            path: path.to_path_buf(),
            source: e.into(),
        }
    }
}

/// Why the configured reset cannot run at all: a fault of the config (or of the host's
/// install), not of the GPU. Said before anything is marked: the GPU keeps its state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unrunnable {
    /// The program is missing, or not trusted to run as root (not root's, writable by
    /// others, or a directory on its way is).
    #[error(transparent)]
    Program(#[from] crate::host::program::ProgramError),
    #[error("{} may not be executed (mode {mode:o})", path.display())]
    NotExecutable { path: PathBuf, mode: u32 },
    /// `reset_command: "pci"` for a function the kernel offers no reset for.
    #[error("{}: {source}: the kernel offers no function-level reset for it", path.display())]
    NoSysfsReset {
        path: PathBuf,
        source: crate::host::syserr::IoErr,
    },
}

impl Unrunnable {
    /// What the operator can do about it.
    pub fn remedy(&self) -> &'static str {
        match self {
            Unrunnable::NoSysfsReset { .. } => {
                "name a reset program in reset_command (nvidia-smi --gpu-reset)"
            }
            _ => "install the program as root's, or name another in reset_command (\"pci\" is the kernel's function-level reset)",
        }
    }
}
