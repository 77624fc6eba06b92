//! What the plugin waits on: inotify on the state file's directory (every change of the state
//! is a rename into it) and on kubelet's plugin directory (its socket made anew, ours
//! removed, its checkpoint written). A state directory that is not there yet (no
//! reservation made yet on a host before tmpfiles ran) is waited for on its nearest
//! existing ancestor, so its first change is seen at once, not at the next tick; the plugin
//! directory is watched once it is there ([`Watcher::ensure`], at each tick).

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
    /// While the state directory is missing: its nearest existing ancestor, watched for
    /// the directory on the way being made.
    ancestor_wd: Option<WatchDescriptor>,
}

/// What the ancestor of a missing directory is watched for: a directory made or moved in, or
/// the ancestor itself gone.
const ANCESTOR_FLAGS: AddWatchFlags = AddWatchFlags::IN_CREATE
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_ONLYDIR)
    .union(AddWatchFlags::IN_DELETE_SELF)
    .union(AddWatchFlags::IN_MOVE_SELF);

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
            ancestor_wd: None,
        };
        w.ensure();
        Ok(w)
    }

    /// Watches the directories not watched yet (one that was missing, or replaced);
    /// returns whether one was added (what happened in it before is then unknown).
    pub fn ensure(&mut self) -> bool {
        let mut added = self.ensure_state();
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

    /// Watches the state directory if it is not yet (returns whether it now is, newly);
    /// while it is missing, its nearest existing ancestor instead.
    fn ensure_state(&mut self) -> bool {
        if self.state_wd.is_some() {
            return false;
        }
        let ino = &self.fd.get_ref().0;
        self.state_wd = ino.add_watch(&self.state_dir, DIR_FLAGS).ok();
        if let Some(wd) = self.ancestor_wd.take() {
            // Gone already when the ancestor itself went: nothing to take back then.
            let _ = ino.rm_watch(wd);
        }
        if self.state_wd.is_some() {
            return true;
        }
        // The plugin directory's own watch is left alone (one descriptor per inode: a
        // second add would replace its mask); it is then seen at the tick.
        self.ancestor_wd = self
            .state_dir
            .ancestors()
            .skip(1)
            .filter(|a| *a != self.plugin_dir)
            .find_map(|a| ino.add_watch(a, ANCESTOR_FLAGS).ok());
        false
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
                if self.state_wd.is_none() && Some(e.wd) == self.ancestor_wd {
                    // A directory on the way was made (or the ancestor went): look again;
                    // the state directory watched now may hold a state file already.
                    if self.ensure_state() {
                        c.state = true;
                    }
                } else if Some(e.wd) == self.state_wd {
                    if gone {
                        self.state_wd = None;
                        c.state = true;
                        // Made again later: waited for on its ancestor meanwhile.
                        self.ensure_state();
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The state directory made after the plugin started (`mkdir -p`, then the state file
    /// renamed in, as gpuhook's first reservation does): seen at once, not at the tick.
    #[test]
    fn a_state_directory_made_later_is_seen_at_once() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let t = tempfile::tempdir().expect("tempdir");
            let state = t.path().join("run/gpuhook/state.json");
            let plugin = t.path().join("device-plugins");
            std::fs::create_dir(&plugin).expect("plugin dir");
            let mut w = Watcher::new(&state, &plugin).expect("watcher");
            assert!(w.state_wd.is_none() && w.ancestor_wd.is_some());
            let dir = state.parent().expect("parent");
            std::fs::create_dir_all(dir).expect("mkdir -p");
            let tmp = dir.join(".state.json.tmp");
            std::fs::write(&tmp, "{}").expect("write");
            std::fs::rename(&tmp, &state).expect("rename");
            let mut seen = false;
            while !seen {
                let c = tokio::time::timeout(Duration::from_secs(1), w.next())
                    .await
                    .expect("the state's change within 1 s, without a tick")
                    .expect("inotify");
                seen = c.state;
            }
            assert!(w.state_wd.is_some());
        });
    }
}
