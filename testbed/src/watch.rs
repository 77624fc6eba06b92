//! What was opened in a directory while a test acted: the kernel's inotify events on it, so
//! a test proves that a hook never touched a file (not only that the file is unchanged).

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use std::path::Path;

/// A watch on one directory's entries: opens, reads, writes, creations, removals.
pub struct Opens {
    fd: Inotify,
}

impl Opens {
    pub fn watch(dir: &Path) -> Result<Opens, String> {
        let fd = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| format!("inotify_init: {e}"))?;
        fd.add_watch(
            dir,
            AddWatchFlags::IN_OPEN
                | AddWatchFlags::IN_ACCESS
                | AddWatchFlags::IN_MODIFY
                | AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_DELETE
                | AddWatchFlags::IN_MOVED_TO,
        )
        .map_err(|e| format!("inotify_add_watch {}: {e}", dir.display()))?;
        Ok(Opens { fd })
    }

    /// What happened since the watch began (or the last call): `EVENT NAME` lines.
    pub fn seen(&self) -> Vec<String> {
        let mut v = Vec::new();
        while let Ok(events) = self.fd.read_events() {
            if events.is_empty() {
                break;
            }
            for e in events {
                let name = e
                    .name
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| ".".into());
                v.push(format!("{:?} {name}", e.mask));
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_and_a_read_are_seen() {
        let t = tempfile_dir();
        std::fs::write(t.join("state.json"), "{}").unwrap();
        let w = Opens::watch(&t).unwrap();
        assert_eq!(w.seen(), Vec::<String>::new());
        let _ = std::fs::read(t.join("state.json")).unwrap();
        let seen = w.seen();
        assert!(
            seen.iter()
                .any(|l| l.contains("IN_OPEN") && l.ends_with(" state.json")),
            "{seen:?}"
        );
        let _ = std::fs::remove_dir_all(&t);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let t = std::env::temp_dir().join(format!("gpuhook-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        std::fs::create_dir_all(&t).unwrap();
        t
    }
}
