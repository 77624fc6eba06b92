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
use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, mkdirat, Mode};
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::time::Duration;

/// The file gpuhook writes into the container's `/etc/ld.so.conf.d` (LXD writes
/// `00-lxdcdi.conf`, nvidia-cdi-hook `00-nvcr-*.conf`).
pub const LD_CONF: &str = "00-gpuhook-cdi.conf";

/// How long the container's `ldconfig` may take.
const LDCONFIG_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a host's static `ldconfig` is (Ubuntu's `/sbin/ldconfig` is a script around
/// `ldconfig.real`).
const LDCONFIGS: [&str; 4] = [
    "/sbin/ldconfig.real",
    "/usr/sbin/ldconfig.real",
    "/sbin/ldconfig",
    "/usr/sbin/ldconfig",
];

/// One mount gpuhook made: where, and the identity of what it mounted (to unmount only that).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mounted {
    pub target: String,
    pub dev: u64,
    pub ino: u64,
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
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
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

/// A detached copy of a mount's source, its attributes set: ready to be moved into a
/// container. Call in the host's mount namespace.
pub struct Tree {
    fd: OwnedFd,
    dev: u64,
    ino: u64,
}

/// Clones each mount's source (in this, the host's, mount namespace) and sets its
/// attributes while it is detached.
pub fn open_trees(mounts: &[BindMount]) -> Result<Vec<Tree>, String> {
    mounts.iter().map(open_tree).collect()
}

fn open_tree(m: &BindMount) -> Result<Tree, String> {
    let src = CString::new(m.source.as_str()).map_err(|_| format!("{}: NUL in path", m.source))?;
    let mut flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
    if m.recursive {
        flags |= AT_RECURSIVE;
    }
    // SAFETY: open_tree with a valid C string; the returned descriptor is owned below.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, src.as_ptr(), flags) };
    if fd < 0 {
        return Err(format!("cannot clone {}: {}", m.source, Errno::last()));
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
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: libc::MS_PRIVATE,
        userns_fd: 0,
    };
    let mut at = libc::AT_EMPTY_PATH as libc::c_uint;
    if m.recursive {
        at |= AT_RECURSIVE;
    }
    // SAFETY: mount_setattr on our descriptor with an empty path and a correctly sized struct.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            at,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(format!(
            "cannot make {} read-only, nosuid, nodev: {}",
            m.source,
            Errno::last()
        ));
    }
    let st = fstat(&fd).map_err(|e| format!("{}: {e}", m.source))?;
    Ok(Tree {
        fd,
        dev: st.st_dev,
        ino: st.st_ino,
    })
}

/// The host's static `ldconfig`, as an exec-only copy ([`crate::enter::sandbox::exec_only_copy`])
/// to be run over a container's root. One that needs a program interpreter would load the
/// container's `ld.so`: refused.
pub fn host_ldconfig() -> Result<OwnedFd, String> {
    let path = LDCONFIGS
        .iter()
        .find(|p| std::path::Path::new(p).is_file())
        .ok_or_else(|| {
            format!(
                "no ldconfig on the host (looked at {})",
                LDCONFIGS.join(", ")
            )
        })?;
    let f = std::fs::File::open(path).map_err(|e| format!("{path}: {e}"))?;
    if has_interpreter(&f).map_err(|e| format!("{path}: {e}"))? {
        return Err(format!(
            "the host's {path} is dynamically linked: run inside a container it would load the container's libraries; gpuhook needs a static ldconfig"
        ));
    }
    crate::enter::sandbox::exec_only_copy(&f, "ldconfig").map_err(|e| format!("{path}: {e}"))
}

/// Whether a 64-bit ELF file has a `PT_INTERP` program header.
fn has_interpreter(f: &std::fs::File) -> Result<bool, String> {
    let mut h = [0u8; 64];
    f.read_exact_at(&mut h, 0).map_err(|e| e.to_string())?;
    if &h[..4] != b"\x7fELF" || h[4] != 2 || h[5] != 1 {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let phoff = u64::from_le_bytes(h[0x20..0x28].try_into().expect("8 bytes"));
    let phentsize = u64::from(u16::from_le_bytes([h[0x36], h[0x37]]));
    let phnum = u64::from(u16::from_le_bytes([h[0x38], h[0x39]]));
    if phentsize < 4 {
        return Err("bad program header size".into());
    }
    for i in 0..phnum {
        let mut t = [0u8; 4];
        f.read_exact_at(&mut t, phoff + i * phentsize)
            .map_err(|e| e.to_string())?;
        if u32::from_le_bytes(t) == 3 {
            return Ok(true);
        }
    }
    Ok(false)
}

// ---- in the container's root ----

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
) -> Result<Option<(OwnedFd, String)>, String> {
    let mut dir = root
        .try_clone()
        .map_err(|e| format!("container root: {e}"))?;
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
                mkdirat(&dir, c, Mode::from_bits_truncate(0o755))
                    .map_err(|e| format!("cannot create {path} in the container: {e}"))?;
                done.created.push(path.clone());
                dir =
                    devdir::open_dir(&Sys, &dir, c).map_err(|e| format!("container {path} {e}"))?;
            }
            Err(e) => return Err(format!("container {path} {e}")),
        }
    }
    Ok(Some((dir, path)))
}

/// [`walk_to`], creating missing directories (`create`) or failing on them.
fn walk(root: &OwnedFd, rel: &str, create: bool, done: &mut Done) -> Result<OwnedFd, String> {
    let missing = if create {
        Missing::Create
    } else {
        Missing::Fail
    };
    walk_to(root, rel, missing, done)?
        .map(|(d, _)| d)
        .ok_or_else(|| format!("container /{rel}: missing"))
}

/// The top-level links of a merged-`/usr` root (Debian ≥ 12, Ubuntu, Fedora images):
/// `/lib -> usr/lib` and the like, the only symlinks on the way that gpuhook follows, and
/// only to exactly there. nvidia-ctk on such a host writes `/lib/x86_64-linux-gnu/…` paths.
const MERGED_USR: [&str; 6] = ["lib", "lib64", "lib32", "libx32", "bin", "sbin"];

/// Opens directory `name` in `dir` without following a symlink, except, at the top of the
/// root (`top`), a merged-`/usr` link to its `usr/` directory (walked itself one component
/// at a time).
fn open_component(root: &OwnedFd, dir: &OwnedFd, top: bool, name: &str) -> Result<OwnedFd, String> {
    match devdir::open_dir(&Sys, dir, name) {
        Ok(d) => Ok(d),
        Err(e) if top && MERGED_USR.contains(&name) => {
            let target = nix::fcntl::readlinkat(dir, name).map_err(|_| e.clone())?;
            let t = target.to_string_lossy();
            if t.trim_start_matches('/').trim_end_matches('/') != format!("usr/{name}") {
                return Err(e);
            }
            let usr = devdir::open_dir(&Sys, root, "usr").map_err(|e| format!("(/usr {e})"))?;
            devdir::open_dir(&Sys, &usr, name).map_err(|e| format!("(/usr/{name} {e})"))
        }
        Err(e) => Err(e),
    }
}

/// Checks, without changing anything, that the directories of `dir` (absolute, in the root)
/// that exist are directories, not symlinks; `leaf`: also that `dir/leaf`, if it exists, is
/// not a symlink. For the OCI door, before the runtime mounts there.
pub fn check_path(root: &OwnedFd, dir: &str, leaf: Option<&str>) -> Result<(), String> {
    let Some((d, path)) = walk_to(root, dir, Missing::Stop, &mut Done::default())? else {
        return Ok(());
    };
    if let Some(l) = leaf {
        if fstatat(&d, l, AtFlags::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFLNK)
        {
            return Err(format!(
                "container {path}/{l} is a symlink; refusing to mount over it"
            ));
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

/// The ids gpuhook acts as in a container's root: its root's (container uid and gid 0, mapped
/// through the container's user namespace; the host's root without one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
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
pub fn act_as(owner: Owner, mounts: bool) -> Result<(), String> {
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
        Err(e) => return Err(format!("setgroups: {e}")),
    }
    crate::enter::container::keep_only(&keep)?;
    // setfsuid/setfsgid say nothing on failure: the second call returns the id in force.
    nix::unistd::setfsgid(owner.gid.into());
    let gid = nix::unistd::setfsgid(owner.gid.into());
    nix::unistd::setfsuid(owner.uid.into());
    let uid = nix::unistd::setfsuid(owner.uid.into());
    if (uid.as_raw(), gid.as_raw()) != (owner.uid, owner.gid) {
        return Err(format!(
            "cannot act as the container's root ({}:{}): file-system ids stayed {}:{}",
            owner.uid,
            owner.gid,
            uid.as_raw(),
            gid.as_raw()
        ));
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
    trees: Vec<Tree>,
    plan: &Plan,
    ldconfig: Option<&OwnedFd>,
    owner: Owner,
    cgroups: &[OwnedFd],
) -> Result<Done, String> {
    let mut done = Done::default();
    match apply_into(root, trees, plan, ldconfig, owner, cgroups, &mut done) {
        Ok(()) => Ok(done),
        Err(e) => {
            let left = undo(root, &done);
            if left.is_empty() {
                Err(e)
            } else {
                Err(format!("{e} (rollback left: {})", left.join("; ")))
            }
        }
    }
}

fn apply_into(
    root: &OwnedFd,
    trees: Vec<Tree>,
    plan: &Plan,
    ldconfig: Option<&OwnedFd>,
    owner: Owner,
    cgroups: &[OwnedFd],
    done: &mut Done,
) -> Result<(), String> {
    for (t, m) in trees.into_iter().zip(&plan.mounts) {
        mount_one(root, t, m, done)?;
    }
    for l in &plan.links {
        let (parent, name) = split(&l.link);
        let dir = walk(root, parent, true, done)?;
        match nix::unistd::symlinkat(l.target.as_str(), &dir, name) {
            Ok(()) => done.links.push(l.link.clone()),
            Err(Errno::EEXIST) => {
                let same = nix::fcntl::readlinkat(&dir, name)
                    .ok()
                    .is_some_and(|t| t.as_os_str() == l.target.as_str());
                if !same {
                    done.notes.push(format!(
                        "{} exists in the container; left as it is (not a link to {})",
                        l.link, l.target
                    ));
                }
            }
            Err(e) => {
                return Err(format!(
                    "cannot create link {} in the container: {e}",
                    l.link
                ))
            }
        }
    }
    if !plan.ld_folders.is_empty() {
        if let Some(ld) = ldconfig {
            write_conf(root, &plan.ld_folders, done)?;
            run_ldconfig(root, ld, &plan.ld_folders, owner, cgroups)?;
        }
    }
    Ok(())
}

fn mount_one(root: &OwnedFd, t: Tree, m: &BindMount, done: &mut Done) -> Result<(), String> {
    let (parent, name) = split(&m.target);
    let dir = walk(root, parent, true, done)?;
    let want = if m.dir { libc::S_IFDIR } else { libc::S_IFREG };
    match fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(s) => {
            let kind = s.st_mode & libc::S_IFMT;
            let fits = kind == want || (!m.dir && kind == libc::S_IFSOCK);
            if !fits {
                return Err(format!(
                    "container {} is {}; refusing to mount {} there",
                    m.target,
                    match kind {
                        libc::S_IFLNK => "a symlink",
                        libc::S_IFDIR => "a directory",
                        libc::S_IFREG => "a file",
                        _ => "a special file",
                    },
                    m.source
                ));
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
            .map_err(|e| format!("cannot create {} in the container: {e}", m.target))?;
            done.created.push(m.target.clone());
        }
        Err(e) => return Err(format!("container {}: {e}", m.target)),
    }
    let target = openat(
        &dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("container {}: {e}", m.target))?;
    let kind = fstat(&target).map(|s| s.st_mode & libc::S_IFMT);
    if kind == Ok(libc::S_IFLNK) {
        return Err(format!(
            "container {} became a symlink; refusing to mount there",
            m.target
        ));
    }
    // SAFETY: move_mount between two descriptors we hold, with empty paths.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            t.fd.as_raw_fd(),
            c"".as_ptr(),
            target.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if r < 0 {
        return Err(format!(
            "cannot mount {} at {} in the container: {}",
            m.source,
            m.target,
            Errno::last()
        ));
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
fn write_conf(root: &OwnedFd, folders: &[String], done: &mut Done) -> Result<(), String> {
    let dir = walk(root, "etc/ld.so.conf.d", true, done)?;
    let text: String = folders.iter().map(|d| format!("{d}\n")).collect();
    let existed = fstatat(&dir, LD_CONF, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok();
    replace_file(&dir, LD_CONF, &text)
        .map_err(|e| format!("cannot write /etc/ld.so.conf.d/{LD_CONF} in the container: {e}"))?;
    if !existed {
        done.written.push(format!("/etc/ld.so.conf.d/{LD_CONF}"));
    }
    let etc = walk(root, "etc", false, done)?;
    if fstatat(&etc, "ld.so.conf", AtFlags::AT_SYMLINK_NOFOLLOW) == Err(Errno::ENOENT) {
        replace_file(&etc, "ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
            .map_err(|e| format!("cannot write /etc/ld.so.conf in the container: {e}"))?;
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
    use std::io::Write;
    let tmp = format!(".{name}.gpuhook-{}", std::process::id());
    let fd = openat(
        dir,
        tmp.as_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )?;
    let written = std::fs::File::from(fd)
        .write_all(text)
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)));
    let r = written.and_then(|()| nix::fcntl::renameat(dir, tmp.as_str(), dir, name));
    if r.is_err() {
        let _ = nix::unistd::unlinkat(dir, tmp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
    }
    r
}

/// Limits on the container's `ldconfig`: address space, CPU seconds, file size, no core.
const LDCONFIG_LIMITS: [(nix::sys::resource::Resource, u64); 4] = [
    (nix::sys::resource::Resource::RLIMIT_AS, 1 << 30),
    (nix::sys::resource::Resource::RLIMIT_CPU, 10),
    (nix::sys::resource::Resource::RLIMIT_FSIZE, 256 << 20),
    (nix::sys::resource::Resource::RLIMIT_CORE, 0),
];

/// Where `ldconfig` writes its cache, in its own view of the container's root: a tmpfs of
/// its own mounted over the root's `/dev` (never the container's `/etc/ld.so.cache~`,
/// where the container may have left a device node or a FIFO).
const CACHE_IN_VIEW: &str = "/dev/ld.so.cache";

/// The largest linker cache gpuhook copies into a container.
const CACHE_MAX: u64 = 64 << 20;

/// The new namespaces `ldconfig` gets (none of the container's: it cannot be seen, traced
/// or signalled from inside the container, and reaches no network).
fn ldconfig_namespaces() -> nix::sched::CloneFlags {
    use nix::sched::CloneFlags as F;
    F::CLONE_NEWNS | F::CLONE_NEWPID | F::CLONE_NEWNET | F::CLONE_NEWIPC | F::CLONE_NEWUTS
}

/// Runs the host's `ldconfig` (an exec-only copy, [`host_ldconfig`]) over the container's
/// root and installs the cache it builds as the container's `/etc/ld.so.cache`.
///
/// A first child joins the container's cgroups (`cgroups`: their `cgroup.procs`, opened
/// by the caller on the host: its device, memory and pids limits then bind `ldconfig`),
/// makes new mount, pid, net, ipc and uts namespaces, sets `nodev,nosuid` on every mount of
/// its view of the root (a device node there cannot be opened, whatever the container
/// planted), mounts a tmpfs of its own over the view's `/dev` for the cache, and chroots.
/// Its child, pid 1 of the new pid namespace, is confined ([`crate::enter::sandbox`]: no
/// capabilities, the container root's ids, limits, no process, no environment, only
/// descriptors 0-2) and execs `ldconfig -i -C /dev/ld.so.cache FOLDERS`. The first child
/// then copies the cache from its tmpfs into the container's `/etc` by temporary name and
/// rename, as the container's root. On a kernel that cannot mount into that view (before
/// 6.15 a detached tree takes no mounts), `ldconfig` writes the cache in place, still
/// through `nodev` mounts (a device node planted there then fails the run: refused).
fn run_ldconfig(
    root: &OwnedFd,
    ldconfig: &OwnedFd,
    folders: &[String],
    owner: Owner,
    cgroups: &[OwnedFd],
) -> Result<(), String> {
    let mut argv: Vec<CString> = vec![c"ldconfig".into(), c"-i".into(), c"-X".into()];
    for f in folders {
        argv.push(CString::new(f.as_str()).map_err(|_| "NUL in a folder".to_string())?);
    }
    let etc = walk(root, "etc", false, &mut Done::default())?;
    let filter = crate::enter::sandbox::no_fork_filter()?;
    let (rd, wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    // SAFETY: the caller is single-threaded (the gpuhook binary, or its helper child); the
    // child only makes syscalls and execs or _exits.
    match unsafe { nix::unistd::fork() }.map_err(|e| format!("fork: {e}"))? {
        nix::unistd::ForkResult::Child => {
            // SAFETY: plain syscalls on descriptors we own.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                libc::prctl(libc::PR_SET_DUMPABLE, 0);
                libc::dup2(wr.as_raw_fd(), 1);
                libc::dup2(wr.as_raw_fd(), 2);
            }
            let code = match ldconfig_child(root, &etc, ldconfig, argv, owner, cgroups, &filter) {
                Ok(()) => 0,
                Err((code, msg)) => {
                    // SAFETY: write to our end of the pipe.
                    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
                    code
                }
            };
            // SAFETY: leave without running the parent's destructors.
            unsafe { libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(wr);
            let out = crate::enter::container::read_pipe(rd, LDCONFIG_TIMEOUT, 65536).map_err(
                |e| match e {
                    None => format!(
                        "ldconfig in the container did not finish within {}s; killed",
                        LDCONFIG_TIMEOUT.as_secs()
                    ),
                    Some(e) => format!("reading ldconfig's output: {e}"),
                },
            );
            if out.is_err() {
                let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
            }
            let status = nix::sys::wait::waitpid(child, None);
            let out = out?;
            match status {
                Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
                other => {
                    let text = String::from_utf8_lossy(&out);
                    let first = text.lines().next().unwrap_or("").trim();
                    Err(format!(
                        "ldconfig in the container failed ({}){}",
                        match other {
                            Ok(nix::sys::wait::WaitStatus::Exited(_, c)) => format!("exit {c}"),
                            o => format!("{o:?}"),
                        },
                        if first.is_empty() {
                            String::new()
                        } else {
                            format!(": {first}")
                        }
                    ))
                }
            }
        }
    }
}

/// The first child of [`run_ldconfig`]: the view, the run, the copy. `Err`: exit code and
/// message.
fn ldconfig_child(
    root: &OwnedFd,
    etc: &OwnedFd,
    ldconfig: &OwnedFd,
    mut argv: Vec<CString>,
    owner: Owner,
    cgroups: &[OwnedFd],
    filter: &seccompiler::BpfProgram,
) -> Result<(), (i32, String)> {
    let fail = |what: &str, e: Errno| (127, format!("{what}: {e}"));
    for cg in cgroups {
        nix::unistd::write(cg, b"0").map_err(|e| fail("joining the container's cgroup", e))?;
    }
    // A copy of the container's root with all its mounts, made nodev and nosuid while it
    // is detached (this process's own: the container never sees it).
    let view = clone_tree(root).map_err(|e| fail("cloning the container's root", e))?;
    let mut id = ldconfig_identity(owner);
    // (Mounted into the detached copy from the namespace it was cloned in: the kernel
    // takes mounts into a detached tree only from there.)
    let cache = cache_tmpfs(&view, &["dev"], id);
    // glibc's ldconfig writes its auxiliary cache too where that directory exists (even
    // with -i): a tmpfs of its own there as well. A symlink on the way would take that
    // write elsewhere: refused.
    let aux = aux_cache_dir(&view).map_err(|e| (127, e))?;
    if aux && cache.is_some() && cache_tmpfs(&view, &["var", "cache", "ldconfig"], id).is_none() {
        return Err((127, "cannot mount a tmpfs over /var/cache/ldconfig".into()));
    }
    if cache.is_none() {
        // This kernel mounts nothing into a detached tree (before 6.15): ldconfig writes
        // in place, through nodev mounts, as the container's root, which must then not be
        // host root.
        if owner.uid == 0 && in_initial_user_ns() {
            return Err((
                127,
                "this kernel cannot mount a tmpfs into a detached tree (Linux 6.15 can): refusing to run ldconfig as host root over the container's root".into(),
            ));
        }
        id = owner;
    }
    nix::sched::unshare(ldconfig_namespaces())
        .map_err(|e| fail("new namespaces for ldconfig", e))?;
    if cache.is_some() {
        argv.insert(3, c"-C".into());
        argv.insert(4, CString::new(CACHE_IN_VIEW).expect("no NUL"));
    }
    nix::unistd::fchdir(&view).map_err(|e| fail("fchdir", e))?;
    nix::unistd::chroot(".").map_err(|e| fail("chroot", e))?;
    nix::unistd::chdir("/").map_err(|e| fail("chdir", e))?;
    // pid 1 of the new pid namespace.
    // SAFETY: single-threaded; the child confines itself and execs or _exits.
    let run = match unsafe { nix::unistd::fork() }.map_err(|e| fail("fork", e))? {
        nix::unistd::ForkResult::Child => {
            let limits = LDCONFIG_LIMITS;
            let c = crate::enter::sandbox::Confinement {
                uid: id.uid,
                gid: id.gid,
                limits: &limits,
                filter,
            };
            let (what, e) = crate::enter::sandbox::confine_and_exec(ldconfig, &argv, &c);
            let msg = format!("{what}: {e}");
            // SAFETY: write to standard error (the pipe), then leave.
            unsafe {
                libc::write(2, msg.as_ptr().cast(), msg.len());
                libc::_exit(127)
            }
        }
        nix::unistd::ForkResult::Parent { child } => child,
    };
    match nix::sys::wait::waitpid(run, None) {
        Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => {}
        Ok(nix::sys::wait::WaitStatus::Exited(_, c)) => return Err((c, String::new())),
        Ok(nix::sys::wait::WaitStatus::Signaled(_, sig, _)) => {
            return Err((128 + sig as i32, format!("ldconfig killed by {sig}")))
        }
        other => return Err((127, format!("ldconfig: {other:?}"))),
    }
    if let Some(cache) = cache {
        let bytes = read_cache(&cache).map_err(|e| (127, format!("ldconfig's cache: {e}")))?;
        replace_bytes(etc, "ld.so.cache", &bytes)
            .map_err(|e| fail("cannot write /etc/ld.so.cache in the container", e))?;
    }
    Ok(())
}

/// Who `ldconfig` runs as. In the initial user namespace (a container without one: its root
/// is host root), an id that owns no file and runs no process: `ldconfig` follows any path
/// the container lays out for it, and as host uid 0 it could reach through a `/proc/PID/root`
/// of the container's `/proc` (any dumpable uid-0 process) into the host's tree and write
/// there; as an id nothing runs as, it may look into no process at all, and it writes only
/// into its own tmpfs. In a user namespace, the container's root (a host id that is not
/// root).
fn ldconfig_identity(owner: Owner) -> Owner {
    if in_initial_user_ns() {
        Owner {
            uid: LDCONFIG_ID,
            gid: LDCONFIG_ID,
        }
    } else {
        owner
    }
}

/// The id `ldconfig` runs as in the initial user namespace: `(uid_t)-2`, the last valid id,
/// which no account uses.
pub const LDCONFIG_ID: u32 = u32::MAX - 1;

/// Whether this process is in the initial user namespace (its uid map is the identity of
/// every id).
fn in_initial_user_ns() -> bool {
    std::fs::read_to_string("/proc/self/uid_map")
        .map(|m| m.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"])
        .unwrap_or(false)
}

/// Whether the view has a `/var/cache/ldconfig` directory (each component a directory,
/// none a symlink); a symlink or other file on the way is refused.
fn aux_cache_dir(view: &OwnedFd) -> Result<bool, String> {
    let mut at: Option<OwnedFd> = None;
    let mut path = String::new();
    for c in ["var", "cache", "ldconfig"] {
        path.push('/');
        path.push_str(c);
        let dir = at.as_ref().unwrap_or(view);
        match fstatat(dir, c, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Err(Errno::ENOENT) => return Ok(false),
            Err(e) => return Err(format!("container {path}: {e}")),
            Ok(st) if st.st_mode & libc::S_IFMT != libc::S_IFDIR => {
                return Err(format!(
                    "container {path} is not a directory; refusing to run ldconfig (it would write its auxiliary cache through it)"
                ))
            }
            Ok(_) => {}
        }
        at = Some(
            openat(
                dir,
                c,
                OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| format!("container {path}: {e}"))?,
        );
    }
    Ok(true)
}

/// A detached recursive copy of the tree at `root`, every mount of it `nodev,nosuid`,
/// private.
fn clone_tree(root: &OwnedFd) -> Result<OwnedFd, Errno> {
    let flags = OPEN_TREE_CLONE | AT_RECURSIVE | (libc::O_CLOEXEC | libc::AT_EMPTY_PATH) as u32;
    // SAFETY: open_tree on our descriptor with an empty path; the result is owned below.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, root.as_raw_fd(), c"".as_ptr(), flags) };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: a fresh descriptor the kernel just returned.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    set_attr(&fd, MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID, AT_RECURSIVE)?;
    Ok(fd)
}

fn set_attr(fd: &OwnedFd, set: u64, at: libc::c_uint) -> Result<(), Errno> {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
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
    if r < 0 {
        return Err(Errno::last());
    }
    Ok(())
}

/// A fresh tmpfs (`owner`'s, mode 0755) mounted over the directory `dir` (its
/// components, none a symlink) of `view`; `None` where there is no such directory or the
/// kernel refuses the mount.
fn cache_tmpfs(view: &OwnedFd, dir: &[&str], owner: Owner) -> Option<OwnedFd> {
    let mut dev: Option<OwnedFd> = None;
    for c in dir {
        let at = dev.as_ref().unwrap_or(view);
        dev = Some(
            openat(
                at,
                *c,
                OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .ok()?,
        );
    }
    let dev = dev?;
    // SAFETY: fsopen with a valid C string; the result is owned below.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), 1u32) };
    if fs < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor.
    let fs = unsafe { OwnedFd::from_raw_fd(fs as i32) };
    // (0755: the first child, acting as the container's root, reads the cache back; no one
    // else sees this mount.)
    let opts = [
        ("mode".to_string(), "0755".to_string()),
        ("uid".to_string(), owner.uid.to_string()),
        ("gid".to_string(), owner.gid.to_string()),
        ("size".to_string(), format!("{}", CACHE_MAX * 2)),
    ];
    for (k, v) in &opts {
        let (k, v) = (
            CString::new(k.as_str()).ok()?,
            CString::new(v.as_str()).ok()?,
        );
        // SAFETY: fsconfig(FSCONFIG_SET_STRING) with valid C strings.
        let r = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                1u32,
                k.as_ptr(),
                v.as_ptr(),
                0,
            )
        };
        if r < 0 {
            return None;
        }
    }
    // SAFETY: fsconfig(FSCONFIG_CMD_CREATE).
    let r = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            6u32,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if r < 0 {
        return None;
    }
    let attrs = MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC;
    // SAFETY: fsmount(FSMOUNT_CLOEXEC) of the configured context.
    let m = unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), 1u32, attrs as u32) };
    if m < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor.
    let m = unsafe { OwnedFd::from_raw_fd(m as i32) };
    // SAFETY: move_mount between two descriptors we hold, with empty paths.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            m.as_raw_fd(),
            c"".as_ptr(),
            dev.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    (r == 0).then_some(m)
}

/// The cache `ldconfig` left in its tmpfs: a regular file, bounded.
fn read_cache(tmp: &OwnedFd) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let fd = openat(
        tmp,
        "ld.so.cache",
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| e.to_string())?;
    let st = fstat(&fd).map_err(|e| e.to_string())?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size as u64 > CACHE_MAX {
        return Err("not a regular file of at most 64 MiB".into());
    }
    let mut out = Vec::with_capacity(st.st_size as usize);
    std::fs::File::from(fd)
        .take(CACHE_MAX)
        .read_to_end(&mut out)
        .map_err(|e| e.to_string())?;
    Ok(out)
}

/// Whether `m` is still mounted at its place (what is there is the inode gpuhook mounted).
fn in_place(root: &OwnedFd, m: &Mounted) -> Result<(OwnedFd, bool), String> {
    let (parent, name) = split(&m.target);
    let mut scratch = Done::default();
    let dir = walk(root, parent, false, &mut scratch)?;
    let st = fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .map_err(|e| format!("container {}: {e}", m.target))?;
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
pub fn undo(root: &OwnedFd, done: &Done) -> Vec<String> {
    let mut left = Vec::new();
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
                    left.push(format!("mount {}: {e}", m.target));
                }
            }
            Ok((_, false)) => {}
            Err(e) => left.push(format!("mount {}: {e}", m.target)),
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
    fn split_paths() {
        assert_eq!(
            split("/usr/lib/x/libcuda.so.1"),
            ("usr/lib/x", "libcuda.so.1")
        );
        assert_eq!(split("/top"), ("", "top"));
    }

    #[test]
    fn host_ldconfig_is_static() {
        // The build machine's ldconfig (glibc builds it static-pie).
        let fd = host_ldconfig().expect("a static ldconfig on this host");
        assert!(!has_interpreter(&std::fs::File::from(fd)).unwrap());
        // A dynamically linked program has an interpreter.
        let sh = std::fs::File::open("/bin/sh").unwrap();
        assert!(has_interpreter(&sh).unwrap());
    }
}
