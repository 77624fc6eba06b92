//! What the plugin waits on: inotify on the state file's directory (every change of the state
//! is a rename into it) and on kubelet's plugin directory (its socket made anew, ours
//! removed, its checkpoint written). A directory that is not there yet is watched once it
//! is ([`Watcher::ensure`], at each tick).

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The inotify instance, as tokio's reactor takes a descriptor.
struct Ino(Inotify);

impl AsRawFd for Ino {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// What changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Changed {
    /// The state file (or its directory).
    pub state: bool,
    /// A socket in kubelet's plugin directory (kubelet's, or ours).
    pub sockets: bool,
    /// kubelet's checkpoint.
    pub checkpoint: bool,
}

pub struct Watcher {
    fd: AsyncFd<Ino>,
    state_dir: PathBuf,
    state_name: OsString,
    plugin_dir: PathBuf,
    state_wd: Option<WatchDescriptor>,
    plugin_wd: Option<WatchDescriptor>,
}

const DIR_FLAGS: AddWatchFlags = AddWatchFlags::IN_CREATE
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_CLOSE_WRITE)
    .union(AddWatchFlags::IN_DELETE_SELF)
    .union(AddWatchFlags::IN_MOVE_SELF);

impl Watcher {
    pub fn new(state_file: &Path, plugin_dir: &Path) -> std::io::Result<Watcher> {
        let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        let mut w = Watcher {
            // SAFETY: `Ino` owns the inotify descriptor; it stays open, and `as_raw_fd` gives
            // it, for as long as the `AsyncFd` owns the `Ino`.
            fd: unsafe { AsyncFd::register_with_interest(Ino(ino), Interest::READABLE) }
                .map_err(std::io::Error::from)?,
            state_dir: state_file.parent().unwrap_or(Path::new("/")).to_path_buf(),
            state_name: state_file.file_name().unwrap_or_default().to_os_string(),
            plugin_dir: plugin_dir.to_path_buf(),
            state_wd: None,
            plugin_wd: None,
        };
        w.ensure();
        Ok(w)
    }

    /// Watches the directories not watched yet (one that was missing, or replaced);
    /// returns whether one was added (what happened in it before is then unknown).
    pub fn ensure(&mut self) -> bool {
        let mut added = false;
        if self.state_wd.is_none() {
            self.state_wd = self
                .fd
                .get_ref()
                .0
                .add_watch(&self.state_dir, DIR_FLAGS)
                .ok();
            added |= self.state_wd.is_some();
        }
        if self.plugin_wd.is_none() {
            self.plugin_wd = self
                .fd
                .get_ref()
                .0
                .add_watch(&self.plugin_dir, DIR_FLAGS)
                .ok();
            added |= self.plugin_wd.is_some();
        }
        added
    }

    /// Waits for changes; returns what changed (several events at once are one answer).
    pub async fn next(&mut self) -> std::io::Result<Changed> {
        loop {
            let mut guard = self.fd.readable().await?;
            let events = match guard
                .try_io(|fd| fd.get_ref().0.read_events().map_err(std::io::Error::from))
            {
                Ok(Ok(ev)) => ev,
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            };
            let mut c = Changed::default();
            for e in events {
                let gone = e.mask.intersects(
                    AddWatchFlags::IN_DELETE_SELF
                        | AddWatchFlags::IN_MOVE_SELF
                        | AddWatchFlags::IN_IGNORED,
                );
                if Some(e.wd) == self.state_wd {
                    if gone {
                        self.state_wd = None;
                        c.state = true;
                    } else if e.name.as_deref() == Some(self.state_name.as_os_str()) {
                        c.state = true;
                    }
                } else if Some(e.wd) == self.plugin_wd {
                    if gone {
                        self.plugin_wd = None;
                        c.sockets = true;
                        continue;
                    }
                    let name = e.name.as_deref().map(|n| n.to_string_lossy().into_owned());
                    match name.as_deref() {
                        Some(crate::kubelet::CHECKPOINT) => c.checkpoint = true,
                        Some(n) if n.ends_with(".sock") => c.sockets = true,
                        _ => {}
                    }
                }
            }
            if c != Changed::default() {
                return Ok(c);
            }
        }
    }
}
