//! What the state records of an MPS control daemon, where its directories are, and what a
//! sharer's container gets of them.

use crate::host::config::{Config, Sharing};
use crate::host::procfs::ProcRef;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where a container finds the daemon's pipes (the MPS clients' default).
pub const CONTAINER_PIPE: &str = crate::cdi::MPS_TARGETS[0];
/// Where a container finds the daemon's shared memory.
pub const CONTAINER_SHM: &str = crate::cdi::MPS_TARGETS[1];
/// The file the real daemon writes its PID to, in its pipe directory.
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// How long the daemon may take to be ready, and a client command to answer.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// A daemon gpuhook started, as the state records it (keyed by its GPU's PCI address).
///
/// While `starting`, the daemon is being started outside the state lock and `proc` is the
/// gpuhook process starting it (the daemon's own PID is not known yet): no one else starts
/// one for that GPU while that process lives; once it is gone with the record still
/// `starting`, the next locked step stops whatever it left (found by its pipe directory)
/// and forgets the record.
///
/// While `stopping`, the daemon (no sharer left) is being told to quit, outside the state
/// lock, by the gpuhook process recorded there (killed when it does not go); no daemon is
/// started for that GPU beside it. A later locked step forgets the record once the daemon
/// is gone; one whose stopper is gone with the daemon still running is taken over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Daemon {
    pub proc: ProcRef,
    pub uuid: String,
    pub dir: PathBuf,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub starting: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopping: Option<ProcRef>,
}

impl Daemon {
    pub fn pipe(&self) -> PathBuf {
        self.dir.join("pipe")
    }
    pub fn shm(&self) -> PathBuf {
        self.dir.join("shm")
    }
}

/// What a sharer's container gets of its daemon, as bind mounts (made by the container
/// helper at `started` and `attach`, as the CDI mounts are): `pipe` at `/tmp/nvidia-mps`,
/// **read-only** (clients open the daemon's FIFOs and sockets there, which a read-only
/// mount allows; they create nothing in it, and a sharer must not plant anything where the
/// daemon and gpuhook, both host root, look: its PID file, its `control`), and `shm` at
/// `/dev/shm`, writable (clients create their segments there); `nosuid` and `nodev` as
/// every mount gpuhook makes.
pub fn mounts(d: &Daemon) -> Vec<crate::cdi::BindMount> {
    [
        (d.pipe(), CONTAINER_PIPE, false),
        (d.shm(), CONTAINER_SHM, true),
    ]
    .into_iter()
    .map(|(src, dst, rw)| crate::cdi::BindMount {
        source: src.display().to_string(),
        target: dst.into(),
        rw,
        recursive: false,
        noexec: false,
        dir: true,
    })
    .collect()
}

/// Whether a recorded mount target is one of a daemon's (not a CDI spec's).
pub fn is_target(t: &str) -> bool {
    crate::cdi::MPS_TARGETS.contains(&t)
}

/// The directory of a GPU's daemon: `mps/<UUID>` beside the state file.
pub fn dir_for(cfg: &Config, uuid: &str) -> PathBuf {
    cfg.state_file
        .parent()
        .unwrap_or(Path::new("/"))
        .join("mps")
        .join(uuid)
}

/// The client commands that set the configured limits.
pub fn limit_commands(s: &Sharing) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(m) = s.memory_limit_mib {
        v.push(format!("set_default_device_pinned_mem_limit 0 {m}M"));
    }
    if let Some(p) = s.active_thread_percentage {
        v.push(format!("set_default_active_thread_percentage {p}"));
    }
    v
}
