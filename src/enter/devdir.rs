//! The walk in a container's `/dev`: making and removing nodes one path component at a time,
//! never following a symlink, refusing another mount, replacing nothing that is not already
//! the right character device. The logic runs over [`DirOps`], the few directory operations
//! it needs (as youki puts its syscalls behind a trait): [`Sys`] does them with `*at()` calls
//! on directory descriptors (in the helper that joined the container's mount namespace); the
//! tests drive an in-memory `/dev` that records every call and can be made hostile.

use crate::host::syserr::SysErr;
use crate::node::{NodeSpec, Outcome};
use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, mkdirat, mknodat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};
use serde::{Deserialize, Serialize};
use std::os::fd::{AsRawFd, OwnedFd};

/// Why a directory could not be opened: what is there instead. Reads as the rest of a line
/// that names the directory (`container /dev/dri is a symlink; …`, `… : ENOENT: …`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum OpenDirError {
    #[error("is a symlink; refusing to follow it")]
    Symlink,
    #[error("is {0}, not a directory")]
    NotDir(PlaceFound),
    #[error(": {0}")]
    Sys(#[source] SysErr),
}

/// What a stat found at a place, as far as messages say it (`a FIFO`, `the character
/// device 1:3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlaceFound {
    /// `S_IFMT` bits.
    pub kind: u32,
    pub rdev: u64,
}

impl From<&WalkStat> for PlaceFound {
    fn from(st: &WalkStat) -> PlaceFound {
        PlaceFound {
            kind: st.kind,
            rdev: st.rdev,
        }
    }
}

impl std::fmt::Display for PlaceFound {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(match self.kind {
            libc::S_IFLNK => "a symlink",
            libc::S_IFREG => "a regular file",
            libc::S_IFDIR => "a directory",
            libc::S_IFBLK => "a block device",
            libc::S_IFIFO => "a FIFO",
            libc::S_IFSOCK => "a socket",
            libc::S_IFCHR => {
                let (ma, mi) = (libc::major(self.rdev), libc::minor(self.rdev));
                return write!(f, "the character device {ma}:{mi}");
            }
            _ => "something unknown",
        })
    }
}

/// Why a node could not be made in the container's `/dev`. A value (serde): it crosses the
/// fork in the helper's reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum MakeNodeError {
    #[error("node path {path} is not under /dev")]
    NotUnderDev { path: String },
    #[error("bad node path {path}")]
    BadPath { path: String },
    #[error("dup: {0}")]
    Dup(#[source] SysErr),
    #[error("cannot create container {at}: {errno}")]
    CreateDir {
        at: String,
        #[source]
        errno: SysErr,
    },
    #[error("container {at} {error}")]
    OpenDir {
        at: String,
        #[source]
        error: OpenDirError,
    },
    #[error("container {at}: {errno}")]
    Stat {
        at: String,
        #[source]
        errno: SysErr,
    },
    #[error("container {at} is another mount; refusing")]
    OtherMount { at: String },
    #[error("container {path} is {found} (not the character device {major}:{minor}); refusing to replace it")]
    InTheWay {
        path: String,
        found: PlaceFound,
        major: u32,
        minor: u32,
    },
    #[error("bad mode {mode:o} for {path}")]
    BadMode { mode: u32, path: String },
    #[error("cannot create container {path} ({major}:{minor}): {errno}")]
    Mknod {
        path: String,
        major: u32,
        minor: u32,
        #[source]
        errno: SysErr,
    },
    #[error("container {path} vanished after mknod: {errno}")]
    Vanished {
        path: String,
        #[source]
        errno: SysErr,
    },
    #[error("container {path} was swapped for {found} while being created")]
    Swapped { path: String, found: PlaceFound },
    #[error("cannot chown container {path} to {uid}:{gid}: {errno}")]
    Chown {
        path: String,
        uid: u32,
        gid: u32,
        #[source]
        errno: SysErr,
    },
    #[error("container {path} has mode {mode:o}, wanted {want:o}")]
    Mode { path: String, mode: u32, want: u32 },
    #[error("cannot create container {path} to mount the node on: {errno}")]
    MountPoint {
        path: String,
        #[source]
        errno: SysErr,
    },
    #[error("cannot mount the node on container {path}: {errno}")]
    Bind {
        path: String,
        #[source]
        errno: SysErr,
    },
}

/// What a stat says, as far as the walk cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalkStat {
    /// `S_IFMT` bits.
    pub kind: u32,
    pub mode: u32,
    pub rdev: u64,
    /// The filesystem (`st_dev`).
    pub fs: u64,
    pub ino: u64,
    pub size: i64,
}

impl WalkStat {
    fn of(st: &libc::stat) -> WalkStat {
        WalkStat {
            kind: st.st_mode & libc::S_IFMT,
            mode: st.st_mode & 0o7777,
            rdev: st.st_rdev,
            fs: st.st_dev,
            ino: st.st_ino,
            size: st.st_size,
        }
    }
}

/// The directory operations the walk needs. `Dir` is an open directory, `Obj` an open handle
/// on a node (`O_PATH`) that names it whatever happens to its path.
pub trait DirOps {
    type Dir;
    type Obj;
    /// A detached mount of one node, ready to be moved into the container.
    type Tree;
    fn dup(&self, d: &Self::Dir) -> Result<Self::Dir, Errno>;
    /// Opens a directory, not following a symlink (`O_DIRECTORY | O_NOFOLLOW`).
    fn open_dir(&self, parent: &Self::Dir, name: &str) -> Result<Self::Dir, Errno>;
    fn fstat(&self, d: &Self::Dir) -> Result<WalkStat, Errno>;
    /// `fstatat(AT_SYMLINK_NOFOLLOW)`.
    fn lstat(&self, parent: &Self::Dir, name: &str) -> Result<WalkStat, Errno>;
    fn mkdir(&self, parent: &Self::Dir, name: &str, mode: u32) -> Result<(), Errno>;
    fn mknod_chr(&self, parent: &Self::Dir, name: &str, mode: u32, rdev: u64) -> Result<(), Errno>;
    /// `O_PATH | O_NOFOLLOW`.
    fn open_obj(&self, parent: &Self::Dir, name: &str) -> Result<Self::Obj, Errno>;
    fn fstat_obj(&self, o: &Self::Obj) -> Result<WalkStat, Errno>;
    fn chown_obj(&self, o: &Self::Obj, uid: u32, gid: u32) -> Result<(), Errno>;
    fn unlink(&self, parent: &Self::Dir, name: &str, dir: bool) -> Result<(), Errno>;
    /// Creates an empty regular file (`O_CREAT | O_EXCL | O_NOFOLLOW`): a mount point.
    fn create_file(&self, parent: &Self::Dir, name: &str) -> Result<(), Errno>;
    /// Moves the detached mount `tree` onto the object (`move_mount`).
    fn mount_on(&self, tree: &Self::Tree, target: &Self::Obj) -> Result<(), Errno>;
    /// Unmounts what is mounted at `name` (lazily, never through a symlink).
    fn umount(&self, parent: &Self::Dir, name: &str) -> Result<(), Errno>;
}

/// The real operations, on directory descriptors.
pub struct Sys;

impl DirOps for Sys {
    type Dir = OwnedFd;
    type Obj = OwnedFd;
    type Tree = crate::enter::tree::DetachedTree;
    fn dup(&self, d: &OwnedFd) -> Result<OwnedFd, Errno> {
        d.try_clone()
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(0)))
    }
    fn open_dir(&self, parent: &OwnedFd, name: &str) -> Result<OwnedFd, Errno> {
        openat(
            parent,
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
    }
    fn fstat(&self, d: &OwnedFd) -> Result<WalkStat, Errno> {
        fstat(d).map(|s| WalkStat::of(&s))
    }
    fn lstat(&self, parent: &OwnedFd, name: &str) -> Result<WalkStat, Errno> {
        fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW).map(|s| WalkStat::of(&s))
    }
    fn mkdir(&self, parent: &OwnedFd, name: &str, mode: u32) -> Result<(), Errno> {
        mkdirat(parent, name, Mode::from_bits_truncate(mode))
    }
    fn mknod_chr(&self, parent: &OwnedFd, name: &str, mode: u32, rdev: u64) -> Result<(), Errno> {
        mknodat(
            parent,
            name,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(mode),
            rdev,
        )
    }
    fn open_obj(&self, parent: &OwnedFd, name: &str) -> Result<OwnedFd, Errno> {
        openat(
            parent,
            name,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
    }
    fn fstat_obj(&self, o: &OwnedFd) -> Result<WalkStat, Errno> {
        fstat(o).map(|s| WalkStat::of(&s))
    }
    fn chown_obj(&self, o: &OwnedFd, uid: u32, gid: u32) -> Result<(), Errno> {
        // SAFETY: fchownat on a valid O_PATH descriptor with AT_EMPTY_PATH touches that inode.
        let r =
            unsafe { libc::fchownat(o.as_raw_fd(), c"".as_ptr(), uid, gid, libc::AT_EMPTY_PATH) };
        Errno::result(r).map(drop)
    }
    fn unlink(&self, parent: &OwnedFd, name: &str, dir: bool) -> Result<(), Errno> {
        let how = if dir {
            UnlinkatFlags::RemoveDir
        } else {
            UnlinkatFlags::NoRemoveDir
        };
        unlinkat(parent, name, how)
    }
    fn create_file(&self, parent: &OwnedFd, name: &str) -> Result<(), Errno> {
        openat(
            parent,
            name,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map(drop)
    }
    fn mount_on(
        &self,
        tree: &crate::enter::tree::DetachedTree,
        target: &OwnedFd,
    ) -> Result<(), Errno> {
        tree.move_onto(target)
    }
    fn umount(&self, parent: &OwnedFd, name: &str) -> Result<(), Errno> {
        nix::unistd::fchdir(parent)?;
        nix::mount::umount2(
            name,
            nix::mount::MntFlags::MNT_DETACH | nix::mount::MntFlags::UMOUNT_NOFOLLOW,
        )
    }
}

/// Opens a directory of the container's `/dev`; the error says what is there instead.
pub fn open_dir<D: DirOps>(ops: &D, parent: &D::Dir, name: &str) -> Result<D::Dir, OpenDirError> {
    ops.open_dir(parent, name).map_err(|e| match e {
        // O_DIRECTORY|O_NOFOLLOW on a symlink gives ENOTDIR (or ELOOP): say what it is.
        Errno::ELOOP | Errno::ENOTDIR => match ops.lstat(parent, name) {
            Ok(st) if st.kind == libc::S_IFLNK => OpenDirError::Symlink,
            Ok(st) => OpenDirError::NotDir(PlaceFound::from(&st)),
            Err(e) => OpenDirError::Sys(e.into()),
        },
        e => OpenDirError::Sys(e.into()),
    })
}

fn is_node(st: &WalkStat, n: &NodeSpec) -> bool {
    st.kind == libc::S_IFCHR && st.rdev == n.rdev()
}

/// The components of a path under `/dev`, each a plain name.
fn components(path: &str) -> Result<Vec<&str>, MakeNodeError> {
    let rest = path
        .strip_prefix("/dev/")
        .ok_or_else(|| MakeNodeError::NotUnderDev { path: path.into() })?;
    let comps: Vec<&str> = rest.split('/').collect();
    if comps
        .iter()
        .any(|c| c.is_empty() || *c == "." || *c == ".." || c.contains('\0'))
    {
        return Err(MakeNodeError::BadPath { path: path.into() });
    }
    Ok(comps)
}

/// The one walk: from `/dev` to the directory holding `path`'s last component, one
/// component at a time, never through a symlink or onto another mount; missing directories
/// are created (and recorded) when `dirs` is given, else the walk ends with `None`.
fn walk_parent<'a, D: DirOps>(
    ops: &D,
    dev: &D::Dir,
    dev_fs: u64,
    path: &'a str,
    mut dirs: Option<&mut Vec<String>>,
) -> Result<Option<(D::Dir, &'a str)>, MakeNodeError> {
    let comps = components(path)?;
    let (leaf, parents) = comps
        .split_last()
        .ok_or_else(|| MakeNodeError::BadPath { path: path.into() })?;
    let mut cur = ops.dup(dev).map_err(|e| MakeNodeError::Dup(e.into()))?;
    let mut at = String::from("/dev");
    for c in parents {
        at = format!("{at}/{c}");
        let next = match open_dir(ops, &cur, c) {
            Ok(d) => d,
            Err(_) if matches!(ops.lstat(&cur, c), Err(Errno::ENOENT)) => {
                let Some(d) = dirs.as_deref_mut() else {
                    return Ok(None);
                };
                match ops.mkdir(&cur, c, 0o755) {
                    Ok(()) => d.push(at.clone()),
                    Err(Errno::EEXIST) => {}
                    Err(e) => {
                        let errno = e.into();
                        return Err(MakeNodeError::CreateDir { at, errno });
                    }
                }
                open_dir(ops, &cur, c).map_err(|error| MakeNodeError::OpenDir {
                    at: at.clone(),
                    error,
                })?
            }
            Err(error) => return Err(MakeNodeError::OpenDir { at, error }),
        };
        let st = ops.fstat(&next).map_err(|e| MakeNodeError::Stat {
            at: at.clone(),
            errno: e.into(),
        })?;
        if st.fs != dev_fs {
            return Err(MakeNodeError::OtherMount { at });
        }
        cur = next;
    }
    Ok(Some((cur, leaf)))
}

/// Makes one node (and missing directories, recorded in `dirs`); `Existing` when the right
/// character device is already there. On failure nothing of this node is left.
pub fn create_one<D: DirOps>(
    ops: &D,
    dev: &D::Dir,
    dev_fs: u64,
    n: &NodeSpec,
    dirs: &mut Vec<String>,
) -> Result<Outcome, MakeNodeError> {
    let (dir, leaf) = walk_parent(ops, dev, dev_fs, &n.path, Some(dirs))?.expect("dirs given");
    let path = || n.path.clone();
    let stat_err = |e: Errno| MakeNodeError::Stat {
        at: path(),
        errno: e.into(),
    };
    match ops.lstat(&dir, leaf) {
        Ok(st) if is_node(&st, n) => return Ok(Outcome::Existing),
        Ok(st) => {
            return Err(MakeNodeError::InTheWay {
                path: path(),
                found: PlaceFound::from(&st),
                major: n.major,
                minor: n.minor,
            })
        }
        Err(Errno::ENOENT) => {}
        Err(e) => return Err(stat_err(e)),
    }
    if n.mode & !0o777 != 0 {
        let mode = n.mode;
        return Err(MakeNodeError::BadMode { mode, path: path() });
    }
    ops.mknod_chr(&dir, leaf, n.mode, n.rdev())
        .map_err(|e| MakeNodeError::Mknod {
            path: path(),
            major: n.major,
            minor: n.minor,
            errno: e.into(),
        })?;
    // From here on, act on the node we made through a handle that names it, never by path.
    let done = (|| {
        let o = ops
            .open_obj(&dir, leaf)
            .map_err(|e| MakeNodeError::Vanished {
                path: path(),
                errno: e.into(),
            })?;
        let st = ops.fstat_obj(&o).map_err(stat_err)?;
        if !is_node(&st, n) {
            let found = PlaceFound::from(&st);
            return Err(MakeNodeError::Swapped {
                path: path(),
                found,
            });
        }
        ops.chown_obj(&o, n.uid, n.gid)
            .map_err(|e| MakeNodeError::Chown {
                path: path(),
                uid: n.uid,
                gid: n.gid,
                errno: e.into(),
            })?;
        let st = ops.fstat_obj(&o).map_err(stat_err)?;
        if st.mode != n.mode {
            let (mode, want) = (st.mode, n.mode);
            return Err(MakeNodeError::Mode {
                path: path(),
                mode,
                want,
            });
        }
        Ok(())
    })();
    if let Err(e) = done {
        remove(ops, dev, dev_fs, std::slice::from_ref(n), &[]);
        return Err(e);
    }
    Ok(Outcome::Created)
}

/// Removes nodes (each only if it is still that character device) and directories (only
/// empty ones, never through a symlink), last made first.
pub fn remove<D: DirOps>(ops: &D, dev: &D::Dir, dev_fs: u64, nodes: &[NodeSpec], dirs: &[String]) {
    for n in nodes.iter().rev() {
        let Ok(Some((dir, leaf))) = walk_parent(ops, dev, dev_fs, &n.path, None) else {
            continue;
        };
        match ops.lstat(&dir, leaf) {
            Ok(st) if is_node(&st, n) => {
                let _ = ops.unlink(&dir, leaf, false);
            }
            _ => {}
        }
    }
    for d in dirs.iter().rev() {
        // Only an empty directory goes; a symlink put in its place is not a directory.
        if let Ok(Some((parent, leaf))) = walk_parent(ops, dev, dev_fs, d, None) {
            let _ = ops.unlink(&parent, leaf, true);
        }
    }
}

/// A node bind-mounted into a user-namespaced container's `/dev` (its `/dev` tmpfs is its user
/// namespace's: the host's root can make no node there, and one made would be `nodev`): its
/// path, the node mounted there (a node gpuhook made on a tmpfs of its own, by filesystem and
/// inode), and the empty file gpuhook made in the container's `/dev` to mount it on. What
/// `detach` takes back: the mount while it is that node, the file while it is that file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bound {
    pub path: String,
    pub dev: u64,
    pub ino: u64,
    pub file_dev: u64,
    pub file_ino: u64,
}

/// Bind-mounts `tree` (the node `n`, made by gpuhook; `id`: its filesystem and inode) at `n`'s
/// path, as runc does in a user namespace: on an empty regular file made there (with missing
/// directories, recorded in `dirs`), reached with `O_NOFOLLOW` and mounted on through that
/// handle. `Existing` (nothing done) when the right character device is there already; any
/// other thing there (a symlink, a file, another device) is refused. On failure nothing of this
/// node is left.
pub fn bind_one<D: DirOps>(
    ops: &D,
    dev: &D::Dir,
    dev_fs: u64,
    n: &NodeSpec,
    tree: &D::Tree,
    id: (u64, u64),
    dirs: &mut Vec<String>,
) -> Result<(Outcome, Option<Bound>), MakeNodeError> {
    let (dir, leaf) = walk_parent(ops, dev, dev_fs, &n.path, Some(dirs))?.expect("dirs given");
    let path = || n.path.clone();
    let stat_err = |e: Errno| MakeNodeError::Stat {
        at: path(),
        errno: e.into(),
    };
    match ops.lstat(&dir, leaf) {
        Ok(st) if is_node(&st, n) => return Ok((Outcome::Existing, None)),
        Ok(st) => {
            return Err(MakeNodeError::InTheWay {
                path: path(),
                found: PlaceFound::from(&st),
                major: n.major,
                minor: n.minor,
            })
        }
        Err(Errno::ENOENT) => {}
        Err(e) => return Err(stat_err(e)),
    }
    ops.create_file(&dir, leaf)
        .map_err(|e| MakeNodeError::MountPoint {
            path: path(),
            errno: e.into(),
        })?;
    // From here on, act on the file we made through a handle that names it, never by path.
    let mut made = None;
    let done = (|| {
        let o = ops
            .open_obj(&dir, leaf)
            .map_err(|e| MakeNodeError::Vanished {
                path: path(),
                errno: e.into(),
            })?;
        let st = ops.fstat_obj(&o).map_err(stat_err)?;
        if st.kind != libc::S_IFREG || st.size != 0 {
            let found = PlaceFound::from(&st);
            return Err(MakeNodeError::Swapped {
                path: path(),
                found,
            });
        }
        made = Some((st.fs, st.ino));
        ops.mount_on(tree, &o).map_err(|e| MakeNodeError::Bind {
            path: path(),
            errno: e.into(),
        })?;
        Ok(Bound {
            path: path(),
            dev: id.0,
            ino: id.1,
            file_dev: st.fs,
            file_ino: st.ino,
        })
    })();
    match done {
        Ok(b) => Ok((Outcome::Created, Some(b))),
        Err(e) => {
            // The file we made, only while it is that file (not mounted on).
            if let (Some((fs, ino)), Ok(st)) = (made, ops.lstat(&dir, leaf)) {
                if st.kind == libc::S_IFREG && (st.fs, st.ino) == (fs, ino) {
                    let _ = ops.unlink(&dir, leaf, false);
                }
            }
            Err(e)
        }
    }
}

/// Takes nodes out of a user-namespaced container's `/dev` (the unit's nodes, by path and
/// number; `bound`: those gpuhook bind-mounted, by identity): a mount of gpuhook's is taken
/// off while it is that node and its file removed while it is that empty file; at a node's
/// path that gpuhook recorded nothing for (the runtime bound it at create, from gpuhook's node
/// directory; an attach killed before it recorded), a mount of that very character device is
/// taken off and the empty file it was mounted on removed. Anything else there is the
/// container's, and stays. Directories (only empty ones) go last.
pub fn unbind<D: DirOps>(
    ops: &D,
    dev: &D::Dir,
    dev_fs: u64,
    nodes: &[NodeSpec],
    bound: &[Bound],
    dirs: &[String],
) {
    for n in nodes.iter().rev() {
        let Ok(Some((dir, leaf))) = walk_parent(ops, dev, dev_fs, &n.path, None) else {
            continue;
        };
        let ours = bound.iter().find(|b| b.path == n.path);
        let Ok(st) = ops.lstat(&dir, leaf) else {
            continue;
        };
        // What is mounted there to take off, and the file under it to remove: gpuhook's
        // (by identity), or at an unrecorded path a mount of that very device.
        let under = match ours {
            Some(b) if (st.fs, st.ino) == (b.dev, b.ino) => Some((b.file_dev, Some(b.file_ino))),
            None if is_node(&st, n) && st.fs != dev_fs => Some((dev_fs, None)),
            _ => None,
        };
        let Some((fs, ino)) = under else {
            continue;
        };
        if ops.umount(&dir, leaf).is_err() {
            continue;
        }
        if let Ok(f) = ops.lstat(&dir, leaf) {
            if f.kind == libc::S_IFREG
                && f.size == 0
                && f.fs == fs
                && ino.is_none_or(|i| i == f.ino)
            {
                let _ = ops.unlink(&dir, leaf, false);
            }
        }
    }
    for d in dirs.iter().rev() {
        if let Ok(Some((parent, leaf))) = walk_parent(ops, dev, dev_fs, d, None) {
            let _ = ops.unlink(&parent, leaf, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Node;
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    /// One inode of the in-memory `/dev`.
    #[derive(Debug, Clone)]
    struct Inode {
        st: WalkStat,
        owner: (u32, u32),
        children: BTreeMap<String, usize>,
    }

    /// A recording in-memory `/dev` (inode 0, filesystem 1) that can be made hostile.
    struct Fake {
        inodes: RefCell<Vec<Inode>>,
        log: RefCell<Vec<String>>,
        /// mknod fails with this (a full /dev: ENOSPC).
        mknod_fails: Option<Errno>,
        /// The container swaps a symlink in right after our mknod.
        swap_after_mknod: bool,
        /// Mounts: (directory, name) and the inode on top there, last mounted last.
        mounts: RefCell<Vec<(usize, String, usize)>>,
        /// The container swaps a symlink in for our mount point right after it is made.
        swap_after_create: bool,
        /// Mounting fails with this.
        mount_fails: Option<Errno>,
    }

    const DIR: u32 = libc::S_IFDIR;
    const CHR: u32 = libc::S_IFCHR;
    const LNK: u32 = libc::S_IFLNK;
    const REG: u32 = libc::S_IFREG;

    impl Fake {
        fn new() -> Fake {
            Fake {
                inodes: RefCell::new(vec![Inode {
                    st: WalkStat {
                        kind: DIR,
                        mode: 0o755,
                        rdev: 0,
                        fs: 1,
                        ino: 0,
                        size: 0,
                    },
                    owner: (0, 0),
                    children: BTreeMap::new(),
                }]),
                log: RefCell::new(Vec::new()),
                mknod_fails: None,
                swap_after_mknod: false,
                mounts: RefCell::new(Vec::new()),
                swap_after_create: false,
                mount_fails: None,
            }
        }
        /// A node gpuhook made elsewhere (filesystem 9), to be mounted: its inode.
        fn own_node(&self, rdev: u64) -> usize {
            let mut v = self.inodes.borrow_mut();
            let ino = v.len();
            v.push(Inode {
                st: WalkStat {
                    kind: CHR,
                    mode: 0o666,
                    rdev,
                    fs: 9,
                    ino: ino as u64,
                    size: 0,
                },
                owner: (100000, 100000),
                children: BTreeMap::new(),
            });
            ino
        }
        /// Where an inode is linked: its directory and name.
        fn place(&self, ino: usize) -> Option<(usize, String)> {
            let v = self.inodes.borrow();
            v.iter().enumerate().find_map(|(d, i)| {
                i.children
                    .iter()
                    .find(|(_, c)| **c == ino)
                    .map(|(n, _)| (d, n.clone()))
            })
        }
        fn add(&self, parent: usize, name: &str, kind: u32, rdev: u64, fs: Option<u64>) -> usize {
            let mut v = self.inodes.borrow_mut();
            let fs = fs.unwrap_or(v[parent].st.fs);
            let ino = v.len() as u64;
            v.push(Inode {
                st: WalkStat {
                    kind,
                    mode: 0o755,
                    rdev,
                    fs,
                    ino,
                    size: 0,
                },
                owner: (0, 0),
                children: BTreeMap::new(),
            });
            let ino = v.len() - 1;
            v[parent].children.insert(name.into(), ino);
            ino
        }
        fn child(&self, d: usize, name: &str) -> Result<usize, Errno> {
            let top = self
                .mounts
                .borrow()
                .iter()
                .rev()
                .find_map(|(p, n, i)| (*p == d && n == name).then_some(*i));
            if let Some(i) = top {
                return Ok(i);
            }
            self.inodes.borrow()[d]
                .children
                .get(name)
                .copied()
                .ok_or(Errno::ENOENT)
        }
        /// Every path and what it is, for comparing before and after.
        fn tree(&self) -> Vec<String> {
            fn walk(f: &Fake, ino: usize, at: &str, out: &mut Vec<String>) {
                let names: Vec<String> = f.inodes.borrow()[ino].children.keys().cloned().collect();
                for name in names {
                    let c = f.child(ino, &name).unwrap();
                    let p = format!("{at}/{name}");
                    let i = f.inodes.borrow()[c].clone();
                    let mounted = if i.st.fs == 9 { " (mounted)" } else { "" };
                    out.push(format!(
                        "{p} {:o} {:x} {}:{}{mounted}",
                        i.st.kind, i.st.rdev, i.owner.0, i.owner.1
                    ));
                    walk(f, c, &p, out);
                }
            }
            let mut out = Vec::new();
            walk(self, 0, "/dev", &mut out);
            out
        }
        fn writes(&self) -> Vec<String> {
            self.log.borrow().clone()
        }
    }

    impl DirOps for Fake {
        type Dir = usize;
        type Obj = usize;
        type Tree = usize;
        fn dup(&self, d: &usize) -> Result<usize, Errno> {
            Ok(*d)
        }
        fn open_dir(&self, parent: &usize, name: &str) -> Result<usize, Errno> {
            let c = self.child(*parent, name)?;
            match self.inodes.borrow()[c].st.kind {
                DIR => Ok(c),
                LNK => Err(Errno::ELOOP),
                _ => Err(Errno::ENOTDIR),
            }
        }
        fn fstat(&self, d: &usize) -> Result<WalkStat, Errno> {
            Ok(self.inodes.borrow()[*d].st)
        }
        fn lstat(&self, parent: &usize, name: &str) -> Result<WalkStat, Errno> {
            let c = self.child(*parent, name)?;
            Ok(self.inodes.borrow()[c].st)
        }
        fn mkdir(&self, parent: &usize, name: &str, _mode: u32) -> Result<(), Errno> {
            if self.child(*parent, name).is_ok() {
                return Err(Errno::EEXIST);
            }
            self.log.borrow_mut().push(format!("mkdir {name}"));
            self.add(*parent, name, DIR, 0, None);
            Ok(())
        }
        fn mknod_chr(&self, parent: &usize, name: &str, mode: u32, rdev: u64) -> Result<(), Errno> {
            if let Some(e) = self.mknod_fails {
                return Err(e);
            }
            if self.child(*parent, name).is_ok() {
                return Err(Errno::EEXIST);
            }
            self.log.borrow_mut().push(format!("mknod {name}"));
            let ino = self.add(*parent, name, CHR, rdev, None);
            self.inodes.borrow_mut()[ino].st.mode = mode;
            if self.swap_after_mknod {
                self.inodes.borrow_mut()[ino].st = WalkStat {
                    kind: LNK,
                    mode: 0o777,
                    rdev: 0,
                    fs: 1,
                    ino: ino as u64,
                    size: 0,
                };
            }
            Ok(())
        }
        fn open_obj(&self, parent: &usize, name: &str) -> Result<usize, Errno> {
            self.child(*parent, name)
        }
        fn fstat_obj(&self, o: &usize) -> Result<WalkStat, Errno> {
            Ok(self.inodes.borrow()[*o].st)
        }
        fn chown_obj(&self, o: &usize, uid: u32, gid: u32) -> Result<(), Errno> {
            self.log.borrow_mut().push(format!("chown {o} {uid}:{gid}"));
            self.inodes.borrow_mut()[*o].owner = (uid, gid);
            Ok(())
        }
        fn unlink(&self, parent: &usize, name: &str, dir: bool) -> Result<(), Errno> {
            let c = self.child(*parent, name)?;
            let i = self.inodes.borrow()[c].clone();
            match (dir, i.st.kind) {
                (true, DIR) if !i.children.is_empty() => return Err(Errno::ENOTEMPTY),
                (true, k) if k != DIR => return Err(Errno::ENOTDIR),
                (false, DIR) => return Err(Errno::EISDIR),
                _ => {}
            }
            if self
                .mounts
                .borrow()
                .iter()
                .any(|(p, n, _)| p == parent && n == name)
            {
                return Err(Errno::EBUSY);
            }
            self.log.borrow_mut().push(format!("unlink {name}"));
            self.inodes.borrow_mut()[*parent].children.remove(name);
            Ok(())
        }
        fn create_file(&self, parent: &usize, name: &str) -> Result<(), Errno> {
            if self.child(*parent, name).is_ok() {
                return Err(Errno::EEXIST);
            }
            self.log.borrow_mut().push(format!("create {name}"));
            let ino = self.add(*parent, name, REG, 0, None);
            self.inodes.borrow_mut()[ino].owner = (100000, 100000);
            if self.swap_after_create {
                self.inodes.borrow_mut()[ino].st.kind = LNK;
            }
            Ok(())
        }
        fn mount_on(&self, tree: &usize, target: &usize) -> Result<(), Errno> {
            if let Some(e) = self.mount_fails {
                return Err(e);
            }
            let (d, n) = self.place(*target).ok_or(Errno::ENOENT)?;
            self.log.borrow_mut().push(format!("mount {n}"));
            self.mounts.borrow_mut().push((d, n, *tree));
            Ok(())
        }
        fn umount(&self, parent: &usize, name: &str) -> Result<(), Errno> {
            let mut m = self.mounts.borrow_mut();
            let at = m
                .iter()
                .rposition(|(p, n, _)| p == parent && n == name)
                .ok_or(Errno::EINVAL)?;
            m.remove(at);
            self.log.borrow_mut().push(format!("umount {name}"));
            Ok(())
        }
    }

    fn spec(path: &str, major: u32, minor: u32) -> NodeSpec {
        NodeSpec {
            node: Node::new(path, major, minor),
            mode: 0o660,
            uid: 100000,
            gid: 100044,
        }
    }

    fn create(f: &Fake, n: &NodeSpec) -> (Result<Outcome, String>, Vec<String>) {
        let mut dirs = Vec::new();
        let r = create_one(f, &0, 1, n, &mut dirs).map_err(|e| e.to_string());
        (r, dirs)
    }

    #[test]
    fn makes_nodes_and_directories_owned_as_asked() {
        let f = Fake::new();
        let n = spec("/dev/dri/renderD128", 226, 128);
        let (r, dirs) = create(&f, &n);
        assert_eq!(r, Ok(Outcome::Created));
        assert_eq!(dirs, ["/dev/dri"]);
        assert_eq!(
            f.tree(),
            [
                "/dev/dri 40000 0 0:0",
                "/dev/dri/renderD128 20000 e280 100000:100044"
            ]
        );
        // Again: the right node is there, nothing is written.
        let before = f.writes().len();
        assert_eq!(create(&f, &n).0, Ok(Outcome::Existing));
        assert_eq!(f.writes().len(), before);
        // Rollback: the node, then the (now empty) directory.
        remove(&f, &0, 1, std::slice::from_ref(&n), &dirs);
        assert_eq!(f.tree(), Vec::<String>::new());
    }

    #[test]
    fn a_symlinked_directory_is_never_followed() {
        let f = Fake::new();
        f.add(0, "dri", LNK, 0, None);
        let before = f.tree();
        let (r, _) = create(&f, &spec("/dev/dri/renderD128", 226, 128));
        assert_eq!(
            r,
            Err("container /dev/dri is a symlink; refusing to follow it".into())
        );
        assert_eq!((f.tree(), f.writes()), (before, vec![]));
        // A regular file where a directory should be.
        let f = Fake::new();
        f.add(0, "dri", REG, 0, None);
        let (r, _) = create(&f, &spec("/dev/dri/renderD128", 226, 128));
        assert!(r
            .unwrap_err()
            .contains("is a regular file, not a directory"));
        assert!(f.writes().is_empty());
    }

    #[test]
    fn what_is_at_the_nodes_place_is_never_replaced() {
        for (kind, rdev, what) in [
            (LNK, 0, "a symlink"),
            (REG, 0, "a regular file"),
            (CHR, libc::makedev(1, 3), "the character device 1:3"),
            (DIR, 0, "a directory"),
        ] {
            let f = Fake::new();
            f.add(0, "nvidia0", kind, rdev, None);
            let before = f.tree();
            let (r, _) = create(&f, &spec("/dev/nvidia0", 195, 0));
            assert_eq!(
                r,
                Err(format!("container /dev/nvidia0 is {what} (not the character device 195:0); refusing to replace it"))
            );
            assert_eq!((f.tree(), f.writes()), (before.clone(), vec![]));
            // And a rollback leaves what the container put there.
            remove(&f, &0, 1, &[spec("/dev/nvidia0", 195, 0)], &[]);
            assert_eq!(f.tree(), before);
        }
    }

    #[test]
    fn another_mount_inside_dev_is_refused() {
        let f = Fake::new();
        f.add(0, "dri", DIR, 0, Some(2));
        let (r, dirs) = create(&f, &spec("/dev/dri/renderD128", 226, 128));
        assert_eq!(
            r,
            Err("container /dev/dri is another mount; refusing".into())
        );
        assert!(dirs.is_empty() && f.writes().is_empty());
    }

    #[test]
    fn a_full_dev_leaves_nothing_behind() {
        let mut f = Fake::new();
        f.mknod_fails = Some(Errno::ENOSPC);
        let (r, dirs) = create(&f, &spec("/dev/dri/renderD128", 226, 128));
        assert!(r.unwrap_err().contains("No space left on device"));
        // The directory made on the way is the caller's to undo (it is in `dirs`).
        assert_eq!(dirs, ["/dev/dri"]);
        remove(&f, &0, 1, &[], &dirs);
        assert_eq!(f.tree(), Vec::<String>::new());
    }

    #[test]
    fn a_node_swapped_after_mknod_is_neither_chowned_nor_followed() {
        let mut f = Fake::new();
        f.swap_after_mknod = true;
        let (r, _) = create(&f, &spec("/dev/nvidia0", 195, 0));
        assert_eq!(
            r,
            Err("container /dev/nvidia0 was swapped for a symlink while being created".into())
        );
        assert!(
            f.writes().iter().all(|w| !w.starts_with("chown")),
            "{:?}",
            f.writes()
        );
        // The symlink is the container's: the rollback does not remove it.
        assert_eq!(f.tree(), ["/dev/nvidia0 120000 0 0:0"]);
    }

    #[test]
    fn removal_takes_only_what_is_still_ours() {
        let f = Fake::new();
        let dri = f.add(0, "dri", DIR, 0, None);
        f.add(dri, "renderD128", CHR, libc::makedev(1, 3), None); // not ours any more
        f.add(0, "nvidia0", CHR, libc::makedev(195, 0), None); // ours
        f.add(0, "nvidia1", CHR, libc::makedev(195, 1), None); // not asked for
        remove(
            &f,
            &0,
            1,
            &[
                spec("/dev/dri/renderD128", 226, 128),
                spec("/dev/nvidia0", 195, 0),
            ],
            &["/dev/dri".into()],
        );
        assert_eq!(
            f.tree(),
            [
                "/dev/dri 40000 0 0:0",
                "/dev/dri/renderD128 20000 103 0:0",
                "/dev/nvidia1 20000 c301 0:0"
            ]
        );
    }

    type Bind = Result<(Outcome, Option<Bound>), String>;

    fn bind(f: &Fake, n: &NodeSpec) -> (Bind, Vec<String>) {
        let t = f.own_node(n.rdev());
        let mut dirs = Vec::new();
        let r = bind_one(f, &0, 1, n, &t, (9, t as u64), &mut dirs).map_err(|e| e.to_string());
        (r, dirs)
    }

    /// A user-namespaced container's node: gpuhook's own node mounted on an empty file made
    /// in its /dev (and a missing directory); taken off and removed again by identity.
    #[test]
    fn binds_a_node_on_a_file_it_makes_and_takes_it_back() {
        let f = Fake::new();
        let n = spec("/dev/dri/renderD128", 226, 128);
        let (r, dirs) = bind(&f, &n);
        let (o, b) = r.unwrap();
        let b = b.expect("bound");
        assert_eq!(
            (o, dirs.as_slice()),
            (Outcome::Created, &["/dev/dri".to_string()][..])
        );
        assert_eq!((b.path.as_str(), b.dev), ("/dev/dri/renderD128", 9));
        assert_eq!(b.file_dev, 1);
        assert_eq!(
            f.tree(),
            [
                "/dev/dri 40000 0 0:0",
                "/dev/dri/renderD128 20000 e280 100000:100000 (mounted)"
            ]
        );
        assert_eq!(
            f.writes(),
            ["mkdir dri", "create renderD128", "mount renderD128"]
        );
        // Again: the node is there (mounted), nothing is done.
        let (r, _) = bind(&f, &n);
        assert_eq!(r.unwrap(), (Outcome::Existing, None));
        unbind(
            &f,
            &0,
            1,
            std::slice::from_ref(&n),
            std::slice::from_ref(&b),
            &dirs,
        );
        assert_eq!(f.tree(), Vec::<String>::new());
        assert_eq!(
            f.writes()[3..],
            ["umount renderD128", "unlink renderD128", "unlink dri"]
        );
    }

    /// What the container put at the node's place is neither mounted over nor removed.
    #[test]
    fn binds_over_nothing_the_container_put_there() {
        for (kind, rdev, what) in [
            (LNK, 0, "a symlink"),
            (REG, 0, "a regular file"),
            (CHR, libc::makedev(1, 3), "the character device 1:3"),
        ] {
            let f = Fake::new();
            f.add(0, "nvidia1", kind, rdev, None);
            let before = f.tree();
            let (r, _) = bind(&f, &spec("/dev/nvidia1", 195, 1));
            assert_eq!(
                r,
                Err(format!("container /dev/nvidia1 is {what} (not the character device 195:1); refusing to replace it"))
            );
            assert_eq!((f.tree(), f.writes()), (before.clone(), vec![]));
        }
        // A symlink swapped in for the file gpuhook made: not mounted on, left to the
        // container.
        let mut f = Fake::new();
        f.swap_after_create = true;
        let (r, _) = bind(&f, &spec("/dev/nvidia1", 195, 1));
        assert_eq!(
            r,
            Err("container /dev/nvidia1 was swapped for a symlink while being created".into())
        );
        assert!(
            f.writes().iter().all(|w| !w.starts_with("mount")),
            "{:?}",
            f.writes()
        );
        // A mount that fails: the file made for it goes.
        let mut f = Fake::new();
        f.mount_fails = Some(Errno::EPERM);
        let (r, _) = bind(&f, &spec("/dev/nvidia1", 195, 1));
        assert!(r
            .unwrap_err()
            .starts_with("cannot mount the node on container /dev/nvidia1"));
        assert_eq!(f.tree(), Vec::<String>::new());
    }

    /// At detach: a mount that is no longer gpuhook's (the container took it off and put
    /// a symlink, or its own file, there) stays; the runtime's mount of the node (a GPU given
    /// at create) is taken off with its empty file; another device's stays.
    #[test]
    fn unbinds_only_what_is_still_gpuhooks() {
        let f = Fake::new();
        let n1 = spec("/dev/nvidia1", 195, 1);
        let (r, _) = bind(&f, &n1);
        let b = r.unwrap().1.unwrap();
        // The container takes the mount off and puts a symlink in the file's place.
        f.umount(&0, "nvidia1").unwrap();
        f.unlink(&0, "nvidia1", false).unwrap();
        f.add(0, "nvidia1", LNK, 0, None);
        // The runtime's mount of GPU 0 (from gpuhook's node directory, at create), and a
        // mount of /dev/null at GPU 2's path.
        let n0 = spec("/dev/nvidia0", 195, 0);
        let file = f.add(0, "nvidia0", REG, 0, None);
        let _ = file;
        let t0 = f.own_node(n0.rdev());
        f.mounts.borrow_mut().push((0, "nvidia0".into(), t0));
        let n2 = spec("/dev/nvidia2", 195, 2);
        f.add(0, "nvidia2", REG, 0, None);
        let null = f.own_node(libc::makedev(1, 3));
        f.mounts.borrow_mut().push((0, "nvidia2".into(), null));
        unbind(&f, &0, 1, &[n0, n1, n2], &[b], &[]);
        assert_eq!(
            f.tree(),
            [
                "/dev/nvidia1 120000 0 0:0",
                "/dev/nvidia2 20000 103 100000:100000 (mounted)"
            ]
        );
    }
}
