//! Work inside a container's root filesystem for CDI ([`crate::cdi::Plan`]): bind mounts of
//! the host driver's files, `create-symlinks` and `update-ldcache`.
//!
//! Every path in the container is walked from its root one component at a time with
//! `O_NOFOLLOW` (a symlink the container made is refused, never followed), missing
//! directories and mount-point files are created as the walk goes (and listed, for
//! rollback), and the final act is on a descriptor: `move_mount` onto an `O_PATH` handle,
//! `symlinkat`/`openat` in a held directory. Mounts use the mount API: the source is cloned
//! in the host's mount namespace (`open_tree(OPEN_TREE_CLONE)`), made read-only, `nosuid`,
//! `nodev` and private while still detached (`mount_setattr`), and only then moved into the
//! container (`move_mount`) — never visible writable. The linker cache is built by the host's
//! static `ldconfig` run inside the container's root, without capabilities, as the owner of
//! that root: nothing of the container is ever run or loaded by gpuhook.

use crate::cdi::{BindMount, Plan};
use crate::enter::devdir::{self, Sys};
use crate::enter::tree::{DetachedTree, MOVE_MOUNT_F_EMPTY_PATH, MOVE_MOUNT_T_EMPTY_PATH};
use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, mkdirat, Mode};
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

mod error;
pub(crate) mod ldconfig;
mod owner;
mod paths;
pub use error::{ComponentError, RootfsError};
pub use owner::Owner;
pub use paths::LD_CONF;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mounted {
    pub target: String,
    pub dev: u64,
    pub ino: u64,
}

/// What gpuhook made in a container's root for CDI besides its mounts, as the state records
/// it (so `detach` can take back what no GPU the container keeps needs): the links, the
/// directories and mount-point files created, the files written, and the folders its linker
/// cache was built for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Files {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub created: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub written: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ld_folders: Vec<String>,
}

impl Files {
    pub fn is_empty(&self) -> bool {
        self.created.is_empty()
            && self.links.is_empty()
            && self.written.is_empty()
            && self.ld_folders.is_empty()
    }

    /// Adds what `done` made (each path once), and the linker cache's folders, if any.
    pub fn add(&mut self, done: &Done, ld_folders: &[String]) {
        let put = |to: &mut Vec<String>, from: &[String]| {
            for p in from {
                if !to.contains(p) {
                    to.push(p.clone());
                }
            }
        };
        put(&mut self.created, &done.created);
        put(&mut self.links, &done.links);
        put(&mut self.written, &done.written);
        put(&mut self.ld_folders, ld_folders);
    }
}

/// What was done in a container's root, for rollback and later checks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Done {
    pub mounted: Vec<Mounted>,
    /// Directories and mount-point files created, in creation order.
    pub created: Vec<String>,
    /// Symlinks created.
    pub links: Vec<String>,
    /// Files gpuhook wrote that were not there before (its `ld.so.conf.d` file, an
    /// `ld.so.conf` a root lacked).
    pub written: Vec<String>,
    /// What was left as it was (an existing file at a link's place), for the log.
    pub notes: Vec<String>,
}

// ---- the mount API (Linux 5.2; mount_setattr 5.12) ----

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `mount_setattr` on a mount's descriptor (empty path, `at` adding `AT_RECURSIVE` where
/// wanted): the attributes `set` set, `clear` cleared, made private.
fn set_attr(fd: &OwnedFd, set: u64, clear: u64, at: libc::c_uint) -> Result<(), Errno> {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clear,
        propagation: libc::MS_PRIVATE,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr on our descriptor, empty path, a correctly sized struct.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            at | libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    Errno::result(r).map(drop)
}

/// A detached mount of the node `name` in `dir` (one gpuhook made on a tmpfs of its own,
/// mounted in the host's user namespace), cloned in this mount namespace (`open_tree`) and made
/// read-only, `nosuid`, `noexec` and private while detached — not `nodev`: it is a device to
/// be opened. What a user-namespaced container gets for a node ([`crate::enter::devdir::Bound`]).
pub fn node_tree(dir: &OwnedFd, name: &str) -> Result<DetachedTree, Errno> {
    let cname = CString::new(name).map_err(|_| Errno::EINVAL)?;
    let flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
    // SAFETY: open_tree on a directory descriptor we hold and a valid C string.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, dir.as_raw_fd(), cname.as_ptr(), flags) };
    let fd = Errno::result(fd)?;
    // SAFETY: a fresh descriptor the kernel just returned, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    set_attr(
        &fd,
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
        MOUNT_ATTR_NODEV,
        0,
    )?;
    let st = fstat(&fd)?;
    Ok(DetachedTree {
        fd,
        dev: st.st_dev,
        ino: st.st_ino,
    })
}

/// Clones each mount's source (in this, the host's, mount namespace) and sets its
/// attributes while it is detached.
pub fn open_trees(mounts: &[BindMount]) -> Result<Vec<DetachedTree>, RootfsError> {
    mounts.iter().map(open_tree).collect()
}

fn open_tree(m: &BindMount) -> Result<DetachedTree, RootfsError> {
    let path = || m.source.clone();
    let src =
        CString::new(m.source.as_str()).map_err(|_| RootfsError::NulInPath { path: path() })?;
    let mut flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
    if m.recursive {
        flags |= AT_RECURSIVE;
    }
    // SAFETY: open_tree with a valid C string; the returned descriptor is owned below.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, src.as_ptr(), flags) };
    if fd < 0 {
        let errno = Errno::last().into();
        return Err(RootfsError::Clone {
            path: path(),
            errno,
        });
    }
    // SAFETY: a fresh descriptor the kernel just returned, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if !m.rw {
        set |= MOUNT_ATTR_RDONLY;
    }
    if m.noexec {
        set |= MOUNT_ATTR_NOEXEC;
    }
    let at = if m.recursive { AT_RECURSIVE } else { 0 };
    set_attr(&fd, set, 0, at).map_err(|e| RootfsError::SetAttr {
        path: path(),
        errno: e.into(),
    })?;
    let st = fstat(&fd).map_err(|e| RootfsError::SourceStat {
        path: path(),
        errno: e.into(),
    })?;
    Ok(DetachedTree {
        fd,
        dev: st.st_dev,
        ino: st.st_ino,
    })
}

/// What [`walk_to`] does at a component that does not exist.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Missing {
    /// Creates the directory (recorded in `done`).
    Create,
    /// Fails.
    Fail,
    /// Stops: nothing more to walk (`None`).
    Stop,
}

/// Walks `rel` (a relative path, components joined by `/`) from `root`, never following a
/// symlink (but a merged-`/usr` top-level link, [`open_component`]); a missing component
/// as `missing` says. Returns the directory and its path in the container.
fn walk_to(
    root: &OwnedFd,
    rel: &str,
    missing: Missing,
    done: &mut Done,
) -> Result<Option<(OwnedFd, String)>, RootfsError> {
    let mut dir = root
        .try_clone()
        .map_err(|e| RootfsError::RootDup(e.into()))?;
    let mut path = String::new();
    for c in rel.split('/').filter(|c| !c.is_empty()) {
        path.push('/');
        path.push_str(c);
        match open_component(root, &dir, path.len() == c.len() + 1, c) {
            Ok(d) => dir = d,
            Err(_)
                if missing != Missing::Fail
                    && fstatat(&dir, c, AtFlags::AT_SYMLINK_NOFOLLOW) == Err(Errno::ENOENT) =>
            {
                if missing == Missing::Stop {
                    return Ok(None);
                }
                mkdirat(&dir, c, Mode::from_bits_truncate(0o755)).map_err(|e| {
                    RootfsError::Create {
                        path: path.clone(),
                        errno: e.into(),
                    }
                })?;
                done.created.push(path.clone());
                dir = devdir::open_dir(&Sys, &dir, c).map_err(|e| RootfsError::Walk {
                    path: path.clone(),
                    error: e.into(),
                })?;
            }
            Err(error) => return Err(RootfsError::Walk { path, error }),
        }
    }
    Ok(Some((dir, path)))
}

/// [`walk_to`], creating missing directories (`create`) or failing on them.
fn walk(root: &OwnedFd, rel: &str, create: bool, done: &mut Done) -> Result<OwnedFd, RootfsError> {
    let missing = if create {
        Missing::Create
    } else {
        Missing::Fail
    };
    walk_to(root, rel, missing, done)?
        .map(|(d, _)| d)
        .ok_or_else(|| RootfsError::Missing { rel: rel.into() })
}

/// The top-level links of a merged-`/usr` root (Debian ≥ 12, Ubuntu, Fedora images):
/// `/lib -> usr/lib` and the like, the only symlinks on the way that gpuhook follows, and
/// only to exactly there. nvidia-ctk on such a host writes `/lib/x86_64-linux-gnu/…` paths.
const MERGED_USR: [&str; 6] = ["lib", "lib64", "lib32", "libx32", "bin", "sbin"];

/// Opens directory `name` in `dir` without following a symlink, except, at the top of the
/// root (`top`), a merged-`/usr` link to its `usr/` directory (walked itself one component
/// at a time).
fn open_component(
    root: &OwnedFd,
    dir: &OwnedFd,
    top: bool,
    name: &str,
) -> Result<OwnedFd, ComponentError> {
    match devdir::open_dir(&Sys, dir, name) {
        Ok(d) => Ok(d),
        Err(e) if top && MERGED_USR.contains(&name) => {
            let target = nix::fcntl::readlinkat(dir, name).map_err(|_| e.clone())?;
            let t = target.to_string_lossy();
            if t.trim_start_matches('/').trim_end_matches('/') != format!("usr/{name}") {
                return Err(e.into());
            }
            let usr = devdir::open_dir(&Sys, root, "usr").map_err(ComponentError::Usr)?;
            devdir::open_dir(&Sys, &usr, name).map_err(|error| ComponentError::UsrDir {
                name: name.into(),
                error,
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// Checks, without changing anything, that the directories of `dir` (absolute, in the root)
/// that exist are directories, not symlinks; `leaf`: also that `dir/leaf`, if it exists, is
/// not a symlink. For the OCI door, before the runtime mounts there.
pub fn check_path(root: &OwnedFd, dir: &str, leaf: Option<&str>) -> Result<(), RootfsError> {
    let Some((d, path)) = walk_to(root, dir, Missing::Stop, &mut Done::default())? else {
        return Ok(());
    };
    if let Some(l) = leaf {
        if fstatat(&d, l, AtFlags::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFLNK)
        {
            return Err(RootfsError::SymlinkLeaf {
                dir: path,
                leaf: l.into(),
            });
        }
    }
    Ok(())
}

/// The directory and last component of an absolute container path: `/a/b/c` → (`a/b`, `c`).
pub fn split(path: &str) -> (&str, &str) {
    let p = path.trim_start_matches('/');
    match p.rsplit_once('/') {
        Some((a, b)) => (a, b),
        None => ("", p),
    }
}

/// From here on, acts on files as the container's root does: file-system ids `owner`, and
/// no capability that overrides file permissions or ownership (`CAP_DAC_*`, `CAP_FOWNER`,
/// `CAP_CHOWN`, `CAP_MKNOD` go). Kept: mounting (`move_mount`, `umount`) and what starting
/// `ldconfig` takes (chroot, changing ids, the bounding set). What gpuhook creates is then
/// the container root's without a `chown`, and a directory the container's root could not
/// write (a read-only share mounted over `/usr/lib`), gpuhook cannot either.
/// `mounts`: keep `CAP_SYS_ADMIN` (the libvirt door mounts and joins namespaces; the OCI
/// hook does neither). `CAP_KILL` stays: the time limit on `ldconfig`, which runs as the
/// container's root, must be able to end it.
pub fn act_as(owner: Owner, mounts: bool) -> Result<(), RootfsError> {
    use caps::Capability;
    let mut keep = vec![
        Capability::CAP_SYS_CHROOT,
        Capability::CAP_SETUID,
        Capability::CAP_SETGID,
        Capability::CAP_SETPCAP,
        Capability::CAP_KILL,
    ];
    if mounts {
        keep.push(Capability::CAP_SYS_ADMIN);
    }
    // Supplementary groups count in permission checks too: none of the host's. (In a user
    // namespace whose setgroups is denied there are none of the host's to drop.)
    match nix::unistd::setgroups(&[]) {
        Ok(()) | Err(Errno::EPERM) => {}
        Err(e) => return Err(RootfsError::Setgroups(e.into())),
    }
    crate::enter::caps::keep_only(&keep)?;
    // setfsuid/setfsgid say nothing on failure: the second call returns the id in force.
    nix::unistd::setfsgid(owner.gid.into());
    let gid = nix::unistd::setfsgid(owner.gid.into());
    nix::unistd::setfsuid(owner.uid.into());
    let uid = nix::unistd::setfsuid(owner.uid.into());
    if (uid.as_raw(), gid.as_raw()) != (owner.uid, owner.gid) {
        return Err(RootfsError::FsIds {
            want: owner,
            uid: uid.as_raw(),
            gid: gid.as_raw(),
        });
    }
    Ok(())
}

/// Applies the plan's mounts (`trees`, from [`open_trees`], in the same order), symlinks and
/// linker cache in the container whose root is `root`, as [`act_as`] set up; `cgroups`:
/// the `cgroup.procs` files of the container's cgroups, which `ldconfig` joins
/// ([`run_ldconfig`]). On error, what was done so far is undone ([`undo`]), and what could
/// not be is said on the error's line.
pub fn apply(
    root: &OwnedFd,
    trees: Vec<DetachedTree>,
    plan: &Plan,
    ldconfig: Option<&OwnedFd>,
    owner: Owner,
    cgroups: &[OwnedFd],
) -> Result<Done, RootfsError> {
    let mut done = Done::default();
    match apply_into(root, trees, plan, ldconfig, owner, cgroups, &mut done) {
        Ok(()) => Ok(done),
        Err(e) => {
            let left = undo(root, &done);
            if left.is_empty() {
                Err(e)
            } else {
                let error = Box::new(e);
                Err(RootfsError::RolledBack { error, left })
            }
        }
    }
}

fn apply_into(
    root: &OwnedFd,
    trees: Vec<DetachedTree>,
    plan: &Plan,
    ldconfig: Option<&OwnedFd>,
    owner: Owner,
    cgroups: &[OwnedFd],
    done: &mut Done,
) -> Result<(), RootfsError> {
    for (t, m) in trees.into_iter().zip(&plan.mounts) {
        mount_one(root, t, m, done)?;
    }
    for l in &plan.links {
        let (parent, name) = split(&l.link);
        let dir = walk(root, parent, true, done)?;
        match nix::unistd::symlinkat(l.target.as_str(), &dir, name) {
            Ok(()) => done.links.push(l.link.clone()),
            Err(Errno::EEXIST) => {
                let now = nix::fcntl::readlinkat(&dir, name).ok();
                let now = now.as_ref().and_then(|t| t.to_str());
                if now == Some(l.target.as_str()) {
                    continue;
                }
                match now.filter(|t| other_version(t, &l.target)) {
                    // A link to another version of the same library: what a start before a
                    // driver upgrade left in a root that outlives its containers. Replaced,
                    // or the container would load the old driver's library (or nothing).
                    Some(old) => {
                        let old = old.to_string();
                        relink(&dir, name, &l.target).map_err(|e| RootfsError::Link {
                            link: l.link.clone(),
                            errno: e.into(),
                        })?;
                        done.links.push(l.link.clone());
                        done.notes.push(format!(
                            "{} led to {old}, another version: now to {}",
                            l.link, l.target
                        ));
                    }
                    None => done.notes.push(format!(
                        "{} exists in the container; left as it is (not a link to {})",
                        l.link, l.target
                    )),
                }
            }
            Err(e) => {
                let link = l.link.clone();
                return Err(RootfsError::Link {
                    link,
                    errno: e.into(),
                });
            }
        }
    }
    if !plan.ld_folders.is_empty() {
        if let Some(ld) = ldconfig {
            write_conf(root, &plan.ld_folders, done)?;
            ldconfig::run_ldconfig(root, ld, &plan.ld_folders, owner, cgroups)?;
        }
    }
    Ok(())
}

/// Whether link targets `old` and `new` are two versions of one library: plain names in the
/// link's directory, the same up to `.so.` (`libcuda.so.550.54.15`, `libcuda.so.560.28.03`).
fn other_version(old: &str, new: &str) -> bool {
    fn stem(t: &str) -> Option<&str> {
        (!t.contains('/'))
            .then(|| t.split_once(".so.").map(|(s, _)| s))
            .flatten()
    }
    old != new && stem(old).is_some() && stem(old) == stem(new)
}

/// `name` in `dir` becomes a symlink to `target`: a new link under a temporary name, renamed
/// over it (what was there is never followed).
fn relink(dir: &OwnedFd, name: &str, target: &str) -> Result<(), Errno> {
    let tmp = format!(".{name}.gpuhook-{}", std::process::id());
    let _ = nix::unistd::unlinkat(dir, tmp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
    nix::unistd::symlinkat(target, dir, tmp.as_str())?;
    nix::fcntl::renameat(dir, tmp.as_str(), dir, name).inspect_err(|_| {
        let _ = nix::unistd::unlinkat(dir, tmp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
    })
}

fn mount_one(
    root: &OwnedFd,
    t: DetachedTree,
    m: &BindMount,
    done: &mut Done,
) -> Result<(), RootfsError> {
    let (parent, name) = split(&m.target);
    let target = || m.target.clone();
    let at = |e: Errno| RootfsError::At {
        path: target(),
        errno: e.into(),
    };
    let dir = walk(root, parent, true, done)?;
    let want = if m.dir { libc::S_IFDIR } else { libc::S_IFREG };
    match fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(s) => {
            let kind = s.st_mode & libc::S_IFMT;
            let fits = kind == want || (!m.dir && kind == libc::S_IFSOCK);
            if !fits {
                let (target, src) = (target(), m.source.clone());
                return Err(RootfsError::Occupied { target, kind, src });
            }
        }
        Err(Errno::ENOENT) => {
            if m.dir {
                mkdirat(&dir, name, Mode::from_bits_truncate(0o755))
            } else {
                openat(
                    &dir,
                    name,
                    OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_WRONLY
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(0o644),
                )
                .map(drop)
            }
            .map_err(|e| RootfsError::Create {
                path: target(),
                errno: e.into(),
            })?;
            // An MPS daemon's mount point is never taken back (by an undo or a detach): in
            // a container that shares the host's root it is the host's, where other
            // containers have their own mounts over it.
            if !crate::cdi::MPS_TARGETS.contains(&m.target.as_str()) {
                done.created.push(m.target.clone());
            }
        }
        Err(e) => return Err(at(e)),
    }
    let to = openat(
        &dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(at)?;
    let kind = fstat(&to).map(|s| s.st_mode & libc::S_IFMT);
    if kind == Ok(libc::S_IFLNK) {
        return Err(RootfsError::BecameSymlink { target: target() });
    }
    // SAFETY: move_mount between two descriptors we hold, with empty paths.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            t.fd.as_raw_fd(),
            c"".as_ptr(),
            to.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if r < 0 {
        let errno = Errno::last().into();
        let (src, target) = (m.source.clone(), target());
        return Err(RootfsError::Mount { src, target, errno });
    }
    done.mounted.push(Mounted {
        target: m.target.clone(),
        dev: t.dev,
        ino: t.ino,
    });
    Ok(())
}

/// Writes gpuhook's `ld.so.conf.d` file: a new file under a temporary name (`O_EXCL`,
/// `O_NOFOLLOW`: whatever the container put at any name is never opened), renamed over the
/// final name (which replaces a file or node the container left there; a mount point there
/// refuses). A root without `/etc/ld.so.conf` (busybox images) gets one that includes the
/// directory, as nvidia-cdi-hook does.
fn write_conf(root: &OwnedFd, folders: &[String], done: &mut Done) -> Result<(), RootfsError> {
    let dir = walk(root, "etc/ld.so.conf.d", true, done)?;
    let text: String = folders.iter().map(|d| format!("{d}\n")).collect();
    let existed = fstatat(&dir, LD_CONF, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok();
    replace_file(&dir, LD_CONF, &text).map_err(|e| RootfsError::WriteConf(e.into()))?;
    if !existed {
        done.written.push(format!("/etc/ld.so.conf.d/{LD_CONF}"));
    }
    let etc = walk(root, "etc", false, done)?;
    if fstatat(&etc, "ld.so.conf", AtFlags::AT_SYMLINK_NOFOLLOW) == Err(Errno::ENOENT) {
        replace_file(&etc, "ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
            .map_err(|e| RootfsError::WriteLdSoConf(e.into()))?;
        done.written.push("/etc/ld.so.conf".into());
    }
    Ok(())
}

/// `name` in `dir` becomes a new regular file holding `text` (temporary name, rename).
fn replace_file(dir: &OwnedFd, name: &str, text: &str) -> Result<(), Errno> {
    replace_bytes(dir, name, text.as_bytes())
}

/// `name` in `dir` becomes a new regular file holding `bytes` (a temporary name made with
/// `O_EXCL|O_NOFOLLOW`, renamed over `name`: what was at `name` is never opened).
fn replace_bytes(dir: &OwnedFd, name: &str, text: &[u8]) -> Result<(), Errno> {
    use crate::host::atomic::{replace, AtomicWrite};
    let tmp = format!(".{name}.gpuhook-{}", std::process::id());
    let r = AtomicWrite {
        dir: std::os::fd::AsFd::as_fd(dir),
        tmp: std::path::Path::new(&tmp),
        name: std::path::Path::new(name),
        mode: 0o644,
        chmod: None,
        owner: None,
        clear_stale: false,
        durable: false,
    };
    replace(&r, text).map_err(|(_, e)| e)
}

/// Whether `m` is still mounted at its place (what is there is the inode gpuhook mounted).
fn in_place(root: &OwnedFd, m: &Mounted) -> Result<(OwnedFd, bool), RootfsError> {
    let (parent, name) = split(&m.target);
    let mut scratch = Done::default();
    let dir = walk(root, parent, false, &mut scratch)?;
    let st = fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(|e| RootfsError::At {
        path: m.target.clone(),
        errno: e.into(),
    })?;
    Ok((dir, (st.st_dev, st.st_ino) == (m.dev, m.ino)))
}

/// The mounts of `done` no longer in place in the container (its root changed them).
pub fn missing(root: &OwnedFd, mounted: &[Mounted]) -> Vec<String> {
    mounted
        .iter()
        .filter(|m| !matches!(in_place(root, m), Ok((_, true))))
        .map(|m| m.target.clone())
        .collect()
}

/// Takes back what [`apply`] did (each thing only if it is still what gpuhook made);
/// returns what could not be.
pub fn undo(root: &OwnedFd, done: &Done) -> crate::leftovers::Leftovers {
    let mut left = crate::leftovers::Leftovers::default();
    for m in done.mounted.iter().rev() {
        match in_place(root, m) {
            Ok((dir, true)) => {
                let name = split(&m.target).1;
                let r = nix::unistd::fchdir(&dir).and_then(|()| {
                    nix::mount::umount2(
                        name,
                        nix::mount::MntFlags::MNT_DETACH | nix::mount::MntFlags::UMOUNT_NOFOLLOW,
                    )
                });
                if let Err(e) = r {
                    left.push(format_args!("mount {}: {e}", m.target));
                }
            }
            Ok((_, false)) => {}
            // Nothing at its place: not mounted there (any more), nothing to take back.
            Err(RootfsError::At { errno, .. }) if errno.errno() == Errno::ENOENT => {}
            Err(e) => left.push(format_args!("mount {}: {e}", m.target)),
        }
    }
    let _ = nix::unistd::fchdir(root);
    // Links, then the files gpuhook wrote: each only while it is still of that kind.
    let kinds = done.links.iter().map(|l| (l, libc::S_IFLNK));
    let written = done.written.iter().map(|w| (w, libc::S_IFREG));
    for (path, kind) in kinds.rev().chain(written.rev()) {
        let (parent, name) = split(path);
        let Ok(dir) = walk(root, parent, false, &mut Done::default()) else {
            continue;
        };
        if fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|st| st.st_mode & libc::S_IFMT == kind)
        {
            let _ = nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
        }
    }
    for c in done.created.iter().rev() {
        let (parent, name) = split(c);
        let Ok(dir) = walk(root, parent, false, &mut Done::default()) else {
            continue;
        };
        match fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                let _ = nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::RemoveDir);
            }
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_size == 0 => {
                let _ = nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
            }
            _ => {}
        }
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_to_another_version_of_the_same_library() {
        assert!(other_version(
            "libcuda.so.550.54.15",
            "libcuda.so.560.28.03"
        ));
        assert!(!other_version(
            "libcuda.so.550.54.15",
            "libcuda.so.550.54.15"
        ));
        assert!(!other_version("libfoo.so.1", "libcuda.so.560.28.03"));
        assert!(!other_version("/etc/passwd", "libcuda.so.1"));
        assert!(!other_version("../x/libcuda.so.1", "libcuda.so.560.28.03"));
        assert!(!other_version("libcuda.so", "libcuda.so.1"));
    }

    #[test]
    fn a_link_left_by_another_driver_is_replaced_anything_else_left_alone() {
        let t = tempfile::tempdir().unwrap();
        let lib = t.path().join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&lib).unwrap();
        std::os::unix::fs::symlink("libcuda.so.550.54.15", lib.join("libcuda.so.1")).unwrap();
        std::fs::write(lib.join("libnvidia-ml.so.1"), "the image's own file").unwrap();
        let root = nix::fcntl::open(
            t.path(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let plan = Plan {
            links: vec![
                crate::cdi::Link {
                    target: "libcuda.so.560.28.03".into(),
                    link: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                },
                crate::cdi::Link {
                    target: "libnvidia-ml.so.560.28.03".into(),
                    link: "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1".into(),
                },
            ],
            ..Default::default()
        };
        let owner = Owner { uid: 0, gid: 0 };
        let done = apply(&root, Vec::new(), &plan, None, owner, &[]).unwrap();
        assert_eq!(
            std::fs::read_link(lib.join("libcuda.so.1")).unwrap(),
            std::path::Path::new("libcuda.so.560.28.03")
        );
        assert_eq!(done.links, ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"]);
        assert_eq!(
            std::fs::read_to_string(lib.join("libnvidia-ml.so.1")).unwrap(),
            "the image's own file"
        );
        assert_eq!(done.notes.len(), 2, "{:?}", done.notes);
        assert!(done.notes[0].contains("led to libcuda.so.550.54.15, another version"));
        assert!(std::fs::read_dir(&lib).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains("gpuhook")));
    }

    #[test]
    fn split_paths() {
        assert_eq!(
            split("/usr/lib/x/libcuda.so.1"),
            ("usr/lib/x", "libcuda.so.1")
        );
        assert_eq!(split("/top"), ("", "top"));
    }
}
