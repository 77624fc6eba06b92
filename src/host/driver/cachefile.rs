//! The host's linker cache, `<root>/etc/ld.so.cache`, read as a driver file is trusted: it
//! decides which directories libraries are taken from, so one that an unprivileged account
//! may write (or swap, through a directory it may write) is not used. Below the root `etc`
//! and the cache are each opened once, without following a link, checked on that descriptor
//! (root's, not writable by group or others; the cache a regular file of at most
//! [`ldcache::MAX_SIZE`] bytes) and read from it, no more than that bound; the caller checks
//! the root and the directories above it before it uses the bytes.

use super::ldcache::{self, LdCacheError};
use nix::errno::Errno;
use nix::fcntl::{open, openat, OFlag};
use nix::sys::stat::{fstat, FileStat, Mode};
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// Where the cache is, under the root.
pub const LDCACHE: &str = "etc/ld.so.cache";

/// Why the linker cache is not read (the caller names the file).
#[derive(Debug, thiserror::Error)]
pub enum CacheFault {
    #[error(transparent)]
    Parse(#[from] LdCacheError),
    #[error("owned by uid {uid}, not root")]
    NotRoots { uid: u32 },
    #[error("has mode {mode:04o}: group or others may write it")]
    Writable { mode: u32 },
    #[error("a directory on the way to it ({}) is owned by uid {uid}, not root", .dir.display())]
    DirNotRoots { dir: PathBuf, uid: u32 },
    #[error("a directory on the way to it ({}) has mode {mode:04o}: group or others may write it", .dir.display())]
    DirWritable { dir: PathBuf, mode: u32 },
    #[error("a directory on the way to it ({}) is a symbolic link or not a directory", .dir.display())]
    NotDir { dir: PathBuf },
    #[error("a symbolic link (not followed)")]
    Link,
    #[error("not a regular file")]
    NotFile,
    #[error("{}: {source}", .at.display())]
    Io { at: PathBuf, source: std::io::Error },
}

/// The cache's bytes and what `fstat` said of it then.
pub struct CacheBytes {
    pub bytes: Vec<u8>,
    pub stat: FileStat,
}

fn io(at: &Path, e: Errno) -> CacheFault {
    CacheFault::Io {
        at: at.to_path_buf(),
        source: e.into(),
    }
}

/// Opens `name` in `dir` (at `at`) without following a link: `None` when it is not there.
fn open_in(
    dir: &OwnedFd,
    name: &str,
    flags: OFlag,
    at: &Path,
) -> Result<Option<OwnedFd>, CacheFault> {
    let flags = flags | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::ENOENT) => Ok(None),
        Err(Errno::ELOOP | Errno::ENOTDIR) if flags.contains(OFlag::O_DIRECTORY) => {
            Err(CacheFault::NotDir {
                dir: at.to_path_buf(),
            })
        }
        Err(Errno::ELOOP) => Err(CacheFault::Link),
        Err(e) => Err(io(at, e)),
    }
}

/// Root's and closed to group and others (`dir`: the path, for the message).
fn trusted(st: &FileStat, dir: Option<&Path>) -> Result<(), CacheFault> {
    let mode = st.st_mode & 0o7777;
    match (dir, st.st_uid != 0, mode & 0o022 != 0) {
        (Some(d), true, _) => Err(CacheFault::DirNotRoots {
            dir: d.to_path_buf(),
            uid: st.st_uid,
        }),
        (Some(d), false, true) => Err(CacheFault::DirWritable {
            dir: d.to_path_buf(),
            mode,
        }),
        (None, true, _) => Err(CacheFault::NotRoots { uid: st.st_uid }),
        (None, false, true) => Err(CacheFault::Writable { mode }),
        (_, false, false) => Ok(()),
    }
}

/// The linker cache under `real_root` (the root with its links resolved, already checked):
/// `None` when there is none (or no `etc`).
pub fn read(real_root: &Path) -> Result<Option<CacheBytes>, CacheFault> {
    let dir_flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let root = open(real_root, dir_flags, Mode::empty()).map_err(|e| io(real_root, e))?;
    let etc_path = real_root.join("etc");
    let Some(etc) = open_in(&root, "etc", OFlag::O_DIRECTORY, &etc_path)? else {
        return Ok(None);
    };
    trusted(&fstat(&etc).map_err(|e| io(&etc_path, e))?, Some(&etc_path))?;
    let path = real_root.join(LDCACHE);
    let Some(fd) = open_in(&etc, "ld.so.cache", OFlag::O_NONBLOCK, &path)? else {
        return Ok(None);
    };
    let stat = fstat(&fd).map_err(|e| io(&path, e))?;
    if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(CacheFault::NotFile);
    }
    trusted(&stat, None)?;
    let too_big = |n: u64| CacheFault::Parse(LdCacheError::TooBig(n as usize));
    if stat.st_size as u64 > ldcache::MAX_SIZE as u64 {
        return Err(too_big(stat.st_size as u64));
    }
    let mut bytes = Vec::with_capacity(stat.st_size as usize);
    std::fs::File::from(fd)
        .take(ldcache::MAX_SIZE as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| CacheFault::Io {
            at: path.clone(),
            source,
        })?;
    if bytes.len() > ldcache::MAX_SIZE {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(Some(CacheBytes { bytes, stat }))
}
