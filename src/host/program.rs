//! A host program gpuhook runs as root (the configured `nvidia-smi`; a GPU's reset
//! command): trusted only when no one but root can change what runs, and opened once, so
//! that what runs is the file checked.
//!
//! [`trusted_program`] walks the path from `/` one component at a time with
//! `O_PATH|O_NOFOLLOW`, each directory opened from the one above it and checked on its
//! descriptor: root's, and not writable by group or others (a sticky one, `/tmp`, may be,
//! above the program's own directory). A symbolic link met on the way (Debian's
//! `/usr/bin/nvidia-smi` → `/etc/alternatives/…` → `/usr/lib/nvidia/current/nvidia-smi`) is
//! read from the checked directory that holds it (it must be root's: only root can have put
//! it there) and its target walked the same way. The program itself must be a regular file of root's that group
//! and others may not write. An account that owns any directory on the way (`/opt/nvidia`
//! above a root-owned `bin`) could swap what is below it between a check and an exec by
//! path; so the program is refused, and the one that passes is run from the descriptor
//! checked (`enter::sandbox::run_program_fd`), never looked up by its path again.

use crate::host::syserr::IoErr;
use nix::errno::Errno;
use nix::fcntl::{openat, readlinkat, OFlag};
use nix::sys::stat::{fstat, FileStat, Mode};
use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

/// Links followed on the way before the path is refused (the kernel's own bound).
pub const MAX_LINKS: usize = 40;

/// A program that may be run as root: where it is (its links resolved) and its descriptor
/// (`O_PATH`), the file checked.
#[derive(Debug)]
pub struct TrustedProgram {
    pub path: PathBuf,
    pub fd: OwnedFd,
}

/// Why a program is not run (each message names the program as configured).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgramError {
    #[error("{} is not an absolute path", .path.display())]
    NotAbsolute { path: PathBuf },
    #[error("no {}: {source}", .path.display())]
    Missing { path: PathBuf, source: IoErr },
    #[error("{} is not a regular file", .path.display())]
    NotAFile { path: PathBuf },
    #[error("{} is owned by uid {uid}, not root: not run", .path.display())]
    NotRoots { path: PathBuf, uid: u32 },
    #[error("{} may be written by group or others (mode {mode:o}): not run", .path.display())]
    Writable { path: PathBuf, mode: u32 },
    #[error("{}: a directory on the way to it ({}) is owned by uid {uid}, not root: not run", .path.display(), .dir.display())]
    DirNotRoots {
        path: PathBuf,
        dir: PathBuf,
        uid: u32,
    },
    #[error("{}: a directory on the way to it ({}) may be written by group or others (mode {mode:o}): not run", .path.display(), .dir.display())]
    DirWritable {
        path: PathBuf,
        dir: PathBuf,
        mode: u32,
    },
    #[error("{}: {} on the way to it is not a directory", .path.display(), .dir.display())]
    NotDir { path: PathBuf, dir: PathBuf },
    #[error("{}: more than {MAX_LINKS} symbolic links on the way to it", .path.display())]
    Links { path: PathBuf },
}

fn kind(st: &FileStat) -> libc::mode_t {
    st.st_mode & libc::S_IFMT
}

/// The components of `p` to walk, `..` kept (resolved against what was walked).
fn parts(p: &Path) -> VecDeque<OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect()
}

/// The program at `path` if it may be run as root (see the module's comment), opened.
pub fn trusted_program(path: &Path) -> Result<TrustedProgram, ProgramError> {
    if !path.is_absolute() {
        return Err(ProgramError::NotAbsolute {
            path: path.to_path_buf(),
        });
    }
    let missing = |e: Errno| ProgramError::Missing {
        path: path.to_path_buf(),
        source: std::io::Error::from(e).into(),
    };
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let root = nix::fcntl::open("/", flags | OFlag::O_DIRECTORY, Mode::empty()).map_err(missing)?;
    trusted_dir(path, Path::new("/"), &fstat(&root).map_err(missing)?, false)?;
    // The directories walked, `/` first: a `..` goes back one.
    let mut dirs: Vec<(OwnedFd, PathBuf)> = vec![(root, PathBuf::from("/"))];
    let mut todo = parts(path);
    let mut links = 0usize;
    while let Some(name) = todo.pop_front() {
        if name == ".." {
            if dirs.len() > 1 {
                dirs.pop();
            }
            continue;
        }
        let (dir, at) = dirs.last().expect("/ stays");
        let here = at.join(&name);
        let fd = openat(dir, name.as_os_str(), flags, Mode::empty()).map_err(missing)?;
        let st = fstat(&fd).map_err(missing)?;
        match kind(&st) {
            libc::S_IFLNK => {
                // Only root can have made it in a directory passed so far, but for one in a
                // sticky directory: its owner could swap it there.
                if st.st_uid != 0 {
                    return Err(ProgramError::NotRoots {
                        path: here,
                        uid: st.st_uid,
                    });
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(ProgramError::Links {
                        path: path.to_path_buf(),
                    });
                }
                let target = PathBuf::from(readlinkat(dir, name.as_os_str()).map_err(missing)?);
                if target.is_absolute() {
                    dirs.truncate(1);
                }
                for p in parts(&target).into_iter().rev() {
                    todo.push_front(p);
                }
            }
            libc::S_IFDIR if !todo.is_empty() => {
                // Sticky and writable only above the program's own directory.
                trusted_dir(path, &here, &st, true)?;
                dirs.push((fd, here));
            }
            libc::S_IFREG if todo.is_empty() => {
                let (own_fd, own) = dirs.last().expect("/ stays");
                trusted_dir(path, own, &fstat(own_fd).map_err(missing)?, false)?;
                if st.st_uid != 0 {
                    return Err(ProgramError::NotRoots {
                        path: here,
                        uid: st.st_uid,
                    });
                }
                if st.st_mode & 0o022 != 0 {
                    return Err(ProgramError::Writable {
                        path: here,
                        mode: st.st_mode & 0o7777,
                    });
                }
                return Ok(TrustedProgram { path: here, fd });
            }
            _ if todo.is_empty() => return Err(ProgramError::NotAFile { path: here }),
            _ => {
                return Err(ProgramError::NotDir {
                    path: path.to_path_buf(),
                    dir: here,
                })
            }
        }
    }
    Err(ProgramError::NotAFile {
        path: path.to_path_buf(),
    })
}

/// A directory `dir` on the way to `path`: root's, not writable by group or others
/// (`sticky_ok`: unless its sticky bit is set).
fn trusted_dir(
    path: &Path,
    dir: &Path,
    st: &FileStat,
    sticky_ok: bool,
) -> Result<(), ProgramError> {
    let mode = st.st_mode & 0o7777;
    if st.st_uid != 0 {
        return Err(ProgramError::DirNotRoots {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
            uid: st.st_uid,
        });
    }
    if mode & 0o022 != 0 && !(sticky_ok && mode & 0o1000 != 0) {
        return Err(ProgramError::DirWritable {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
