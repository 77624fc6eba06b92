//! The host work behind MPS sharing, as the lifecycle's facts pass it in.

use super::daemon::{dir_for, Daemon};
use super::error::MpsError;
use crate::host::config::{Config, Sharing};
use crate::ids::Pci;
use std::path::PathBuf;

/// What one pass of a sweep did: the PIDs it killed, and those still running at its end
/// (killed, not gone yet); none left: nothing of the start runs any more.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Swept {
    pub killed: Vec<i32>,
    pub left: Vec<i32>,
}

/// The host work: a daemon's directories (made under the state lock, before its start is
/// recorded), starting a daemon (and setting its limits: outside the lock), telling one to
/// quit, and stopping what a killed start left.
pub trait Mps {
    /// Makes the daemon's directories; its directory (by default [`dir_for`], its
    /// directories made with the default modes).
    fn dirs(&self, cfg: &Config, pci: Pci, uuid: &str) -> Result<PathBuf, MpsError> {
        let dir = dir_for(cfg, uuid);
        for d in ["pipe", "log", "shm"] {
            std::fs::create_dir_all(dir.join(d)).map_err(|cause| MpsError::Io {
                pci,
                uuid: uuid.into(),
                what: format!("mkdir {}", dir.join(d).display()),
                cause,
            })?;
        }
        Ok(dir)
    }
    fn start(
        &self,
        cfg: &Config,
        pci: Pci,
        uuid: &str,
        sharing: &Sharing,
    ) -> Result<Daemon, MpsError>;
    /// Tells the daemon to quit and waits (bounded) for it to exit; never under the state
    /// lock.
    fn quit(&self, cfg: &Config, pci: Pci, d: &Daemon) -> Result<(), MpsError>;
    /// Kills (SIGKILL) the daemon and every process started for it (found as the sweep
    /// finds them), waiting at most `grace` for them to be gone: what a quit that did not
    /// end leaves. By default nothing.
    fn kill(&self, cfg: &Config, pci: Pci, d: &Daemon, grace: std::time::Duration) -> Swept {
        let _ = (cfg, pci, d, grace);
        Swept::default()
    }
    /// One pass, under the state lock and so bounded well under a second, that kills every
    /// process a start of `d` (recorded `starting`, its starter gone) left running and
    /// looks whether any is still there; the record is forgotten only once none is (a later
    /// locked step passes again). By default nothing (a start that runs nothing outside the
    /// process).
    fn sweep(&self, cfg: &Config, pci: Pci, d: &Daemon) -> Swept {
        let _ = (cfg, pci, d);
        Swept::default()
    }
}
