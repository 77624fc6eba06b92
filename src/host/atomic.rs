//! The one atomic file writer: a new file under a temporary name in the same directory
//! (`O_CREAT|O_EXCL|O_NOFOLLOW`: whatever is at either name is never opened), written,
//! renamed over the target. Each caller says what else it needs (a stale temporary file
//! cleared first, an owner and mode, `fsync` of the file and its directory).

use nix::errno::Errno;
use nix::fcntl::{openat, renameat, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::{fsync, unlinkat, UnlinkatFlags};
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

/// The step of [`replace`] that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Creating the temporary file.
    Create,
    /// Its owner or mode, or writing it.
    Write,
    /// `fsync` of the temporary file.
    Fsync,
    /// The rename over the target.
    Rename,
    /// `fsync` of the directory.
    FsyncDir,
}

/// One replacement: `tmp` and `name` are relative to `dir` (or whole paths, with
/// [`nix::fcntl::AT_FDCWD`]).
pub struct AtomicWrite<'a> {
    pub dir: BorrowedFd<'a>,
    pub tmp: &'a Path,
    pub name: &'a Path,
    /// The mode the temporary file is created with (the umask applies).
    pub mode: u32,
    /// Then set to exactly this mode (`fchmod`), after the owner.
    pub chmod: Option<u32>,
    /// Then owned by this uid and gid (`fchown`).
    pub owner: Option<(u32, u32)>,
    /// A file left at `tmp` is removed first (else the create refuses it).
    pub clear_stale: bool,
    /// The file is `fsync`ed before the rename, the directory after it.
    pub durable: bool,
}

/// Writes `bytes` to `r.name` in `r.dir` by temporary name and rename. On failure after the
/// temporary file was made, it is removed; the target is as it was.
pub fn replace(r: &AtomicWrite, bytes: &[u8]) -> Result<(), (Step, Errno)> {
    if r.clear_stale {
        let _ = unlinkat(r.dir, r.tmp, UnlinkatFlags::NoRemoveDir);
    }
    let fd = openat(
        r.dir,
        r.tmp,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(r.mode),
    )
    .map_err(|e| (Step::Create, e))?;
    let result = (|| {
        let mut f = std::fs::File::from(fd);
        let write = |e: Errno| (Step::Write, e);
        if let Some((uid, gid)) = r.owner {
            nix::unistd::fchown(f.as_fd(), Some(uid.into()), Some(gid.into())).map_err(write)?;
        }
        if let Some(mode) = r.chmod {
            nix::sys::stat::fchmod(f.as_fd(), Mode::from_bits_truncate(mode)).map_err(write)?;
        }
        f.write_all(bytes)
            .map_err(|e| write(Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))))?;
        if r.durable {
            fsync(f.as_fd()).map_err(|e| (Step::Fsync, e))?;
        }
        drop(f);
        renameat(r.dir, r.tmp, r.dir, r.name).map_err(|e| (Step::Rename, e))?;
        if r.durable {
            fsync(r.dir).map_err(|e| (Step::FsyncDir, e))?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = unlinkat(r.dir, r.tmp, UnlinkatFlags::NoRemoveDir);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn replaces_by_rename_and_leaves_no_temporary_file() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), "old").unwrap();
        let dir = std::fs::File::open(d.path()).unwrap();
        std::fs::write(d.path().join(".f.tmp"), "stale").unwrap();
        let r = AtomicWrite {
            dir: dir.as_fd(),
            tmp: Path::new(".f.tmp"),
            name: Path::new("f"),
            mode: 0o600,
            chmod: Some(0o640),
            owner: None,
            clear_stale: true,
            durable: true,
        };
        replace(&r, b"new").unwrap();
        assert_eq!(std::fs::read(d.path().join("f")).unwrap(), b"new");
        let mode = std::fs::metadata(d.path().join("f"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o640);
        assert!(!d.path().join(".f.tmp").exists());
        // Without clearing, a file at the temporary name is refused, the target kept.
        std::fs::write(d.path().join(".f.tmp"), "stale").unwrap();
        let r = AtomicWrite {
            clear_stale: false,
            ..r
        };
        assert_eq!(
            replace(&r, b"x").unwrap_err(),
            (Step::Create, Errno::EEXIST)
        );
        assert_eq!(std::fs::read(d.path().join("f")).unwrap(), b"new");
    }
}
