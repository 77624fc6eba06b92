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
    NotDir(Found),
    #[error(": {0}")]
    Sys(#[source] SysErr),
}

/// What a stat found at a place, as far as messages say it (`a FIFO`, `the character
/// device 1:3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Found {
    /// `S_IFMT` bits.
    pub kind: u32,
    pub rdev: u64,
}

impl From<&Stat> for Found {
    fn from(st: &Stat) -> Found {
        Found {
            kind: st.kind,
            rdev: st.rdev,
        }
    }
}

impl std::fmt::Display for Found {
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
pub enum NodeError {
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
        found: Found,
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
    Swapped { path: String, found: Found },
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
}

/// What a stat says, as far as the walk cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// `S_IFMT` bits.
    pub kind: u32,
    pub mode: u32,
    pub rdev: u64,
    /// The filesystem (`st_dev`).
    pub fs: u64,
}

impl Stat {
    fn of(st: &libc::stat) -> Stat {
        Stat {
            kind: st.st_mode & libc::S_IFMT,
            mode: st.st_mode & 0o7777,
            rdev: st.st_rdev,
            fs: st.st_dev,
        }
    }
}

/// The directory operations the walk needs. `Dir` is an open directory, `Obj` an open handle
/// on a node (`O_PATH`) that names it whatever happens to its path.
pub trait DirOps {
    type Dir;
    type Obj;
    fn dup(&self, d: &Self::Dir) -> Result<Self::Dir, Errno>;
    /// Opens a directory, not following a symlink (`O_DIRECTORY | O_NOFOLLOW`).
    fn open_dir(&self, parent: &Self::Dir, name: &str) -> Result<Self::Dir, Errno>;
    fn fstat(&self, d: &Self::Dir) -> Result<Stat, Errno>;
    /// `fstatat(AT_SYMLINK_NOFOLLOW)`.
    fn lstat(&self, parent: &Self::Dir, name: &str) -> Result<Stat, Errno>;
    fn mkdir(&self, parent: &Self::Dir, name: &str, mode: u32) -> Result<(), Errno>;
    fn mknod_chr(&self, parent: &Self::Dir, name: &str, mode: u32, rdev: u64) -> Result<(), Errno>;
    /// `O_PATH | O_NOFOLLOW`.
    fn open_obj(&self, parent: &Self::Dir, name: &str) -> Result<Self::Obj, Errno>;
    fn fstat_obj(&self, o: &Self::Obj) -> Result<Stat, Errno>;
    fn chown_obj(&self, o: &Self::Obj, uid: u32, gid: u32) -> Result<(), Errno>;
    fn unlink(&self, parent: &Self::Dir, name: &str, dir: bool) -> Result<(), Errno>;
}

/// The real operations, on directory descriptors.
pub struct Sys;

impl DirOps for Sys {
    type Dir = OwnedFd;
    type Obj = OwnedFd;
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
    fn fstat(&self, d: &OwnedFd) -> Result<Stat, Errno> {
        fstat(d).map(|s| Stat::of(&s))
    }
    fn lstat(&self, parent: &OwnedFd, name: &str) -> Result<Stat, Errno> {
        fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW).map(|s| Stat::of(&s))
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
    fn fstat_obj(&self, o: &OwnedFd) -> Result<Stat, Errno> {
        fstat(o).map(|s| Stat::of(&s))
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
}

/// Opens a directory of the container's `/dev`; the error says what is there instead.
pub fn open_dir<D: DirOps>(ops: &D, parent: &D::Dir, name: &str) -> Result<D::Dir, OpenDirError> {
    ops.open_dir(parent, name).map_err(|e| match e {
        // O_DIRECTORY|O_NOFOLLOW on a symlink gives ENOTDIR (or ELOOP): say what it is.
        Errno::ELOOP | Errno::ENOTDIR => match ops.lstat(parent, name) {
            Ok(st) if st.kind == libc::S_IFLNK => OpenDirError::Symlink,
            Ok(st) => OpenDirError::NotDir(Found::from(&st)),
            Err(e) => OpenDirError::Sys(e.into()),
        },
        e => OpenDirError::Sys(e.into()),
    })
}

fn is_node(st: &Stat, n: &NodeSpec) -> bool {
    st.kind == libc::S_IFCHR && st.rdev == n.rdev()
}

/// The components of a path under `/dev`, each a plain name.
fn components(path: &str) -> Result<Vec<&str>, NodeError> {
    let rest = path
        .strip_prefix("/dev/")
        .ok_or_else(|| NodeError::NotUnderDev { path: path.into() })?;
    let comps: Vec<&str> = rest.split('/').collect();
    if comps
        .iter()
        .any(|c| c.is_empty() || *c == "." || *c == ".." || c.contains('\0'))
    {
        return Err(NodeError::BadPath { path: path.into() });
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
) -> Result<Option<(D::Dir, &'a str)>, NodeError> {
    let comps = components(path)?;
    let (leaf, parents) = comps
        .split_last()
        .ok_or_else(|| NodeError::BadPath { path: path.into() })?;
    let mut cur = ops.dup(dev).map_err(|e| NodeError::Dup(e.into()))?;
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
                        return Err(NodeError::CreateDir { at, errno });
                    }
                }
                open_dir(ops, &cur, c).map_err(|error| NodeError::OpenDir {
                    at: at.clone(),
                    error,
                })?
            }
            Err(error) => return Err(NodeError::OpenDir { at, error }),
        };
        let st = ops.fstat(&next).map_err(|e| NodeError::Stat {
            at: at.clone(),
            errno: e.into(),
        })?;
        if st.fs != dev_fs {
            return Err(NodeError::OtherMount { at });
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
) -> Result<Outcome, NodeError> {
    let (dir, leaf) = walk_parent(ops, dev, dev_fs, &n.path, Some(dirs))?.expect("dirs given");
    let path = || n.path.clone();
    let stat_err = |e: Errno| NodeError::Stat {
        at: path(),
        errno: e.into(),
    };
    match ops.lstat(&dir, leaf) {
        Ok(st) if is_node(&st, n) => return Ok(Outcome::Existing),
        Ok(st) => {
            return Err(NodeError::InTheWay {
                path: path(),
                found: Found::from(&st),
                major: n.major,
                minor: n.minor,
            })
        }
        Err(Errno::ENOENT) => {}
        Err(e) => return Err(stat_err(e)),
    }
    if n.mode & !0o777 != 0 {
        let mode = n.mode;
        return Err(NodeError::BadMode { mode, path: path() });
    }
    ops.mknod_chr(&dir, leaf, n.mode, n.rdev())
        .map_err(|e| NodeError::Mknod {
            path: path(),
            major: n.major,
            minor: n.minor,
            errno: e.into(),
        })?;
    // From here on, act on the node we made through a handle that names it, never by path.
    let done = (|| {
        let o = ops.open_obj(&dir, leaf).map_err(|e| NodeError::Vanished {
            path: path(),
            errno: e.into(),
        })?;
        let st = ops.fstat_obj(&o).map_err(stat_err)?;
        if !is_node(&st, n) {
            let found = Found::from(&st);
            return Err(NodeError::Swapped {
                path: path(),
                found,
            });
        }
        ops.chown_obj(&o, n.uid, n.gid)
            .map_err(|e| NodeError::Chown {
                path: path(),
                uid: n.uid,
                gid: n.gid,
                errno: e.into(),
            })?;
        let st = ops.fstat_obj(&o).map_err(stat_err)?;
        if st.mode != n.mode {
            let (mode, want) = (st.mode, n.mode);
            return Err(NodeError::Mode {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Node;
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    /// One inode of the in-memory `/dev`.
    #[derive(Debug, Clone)]
    struct Inode {
        st: Stat,
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
    }

    const DIR: u32 = libc::S_IFDIR;
    const CHR: u32 = libc::S_IFCHR;
    const LNK: u32 = libc::S_IFLNK;
    const REG: u32 = libc::S_IFREG;

    impl Fake {
        fn new() -> Fake {
            Fake {
                inodes: RefCell::new(vec![Inode {
                    st: Stat {
                        kind: DIR,
                        mode: 0o755,
                        rdev: 0,
                        fs: 1,
                    },
                    owner: (0, 0),
                    children: BTreeMap::new(),
                }]),
                log: RefCell::new(Vec::new()),
                mknod_fails: None,
                swap_after_mknod: false,
            }
        }
        fn add(&self, parent: usize, name: &str, kind: u32, rdev: u64, fs: Option<u64>) -> usize {
            let mut v = self.inodes.borrow_mut();
            let fs = fs.unwrap_or(v[parent].st.fs);
            v.push(Inode {
                st: Stat {
                    kind,
                    mode: 0o755,
                    rdev,
                    fs,
                },
                owner: (0, 0),
                children: BTreeMap::new(),
            });
            let ino = v.len() - 1;
            v[parent].children.insert(name.into(), ino);
            ino
        }
        fn child(&self, d: usize, name: &str) -> Result<usize, Errno> {
            self.inodes.borrow()[d]
                .children
                .get(name)
                .copied()
                .ok_or(Errno::ENOENT)
        }
        /// Every path and what it is, for comparing before and after.
        fn tree(&self) -> Vec<String> {
            fn walk(v: &[Inode], ino: usize, at: &str, out: &mut Vec<String>) {
                for (name, c) in &v[ino].children {
                    let p = format!("{at}/{name}");
                    let i = &v[*c];
                    out.push(format!(
                        "{p} {:o} {:x} {}:{}",
                        i.st.kind, i.st.rdev, i.owner.0, i.owner.1
                    ));
                    walk(v, *c, &p, out);
                }
            }
            let mut out = Vec::new();
            walk(&self.inodes.borrow(), 0, "/dev", &mut out);
            out
        }
        fn writes(&self) -> Vec<String> {
            self.log.borrow().clone()
        }
    }

    impl DirOps for Fake {
        type Dir = usize;
        type Obj = usize;
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
        fn fstat(&self, d: &usize) -> Result<Stat, Errno> {
            Ok(self.inodes.borrow()[*d].st)
        }
        fn lstat(&self, parent: &usize, name: &str) -> Result<Stat, Errno> {
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
                self.inodes.borrow_mut()[ino].st = Stat {
                    kind: LNK,
                    mode: 0o777,
                    rdev: 0,
                    fs: 1,
                };
            }
            Ok(())
        }
        fn open_obj(&self, parent: &usize, name: &str) -> Result<usize, Errno> {
            self.child(*parent, name)
        }
        fn fstat_obj(&self, o: &usize) -> Result<Stat, Errno> {
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
            self.log.borrow_mut().push(format!("unlink {name}"));
            self.inodes.borrow_mut()[*parent].children.remove(name);
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
}
