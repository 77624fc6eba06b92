//! The container's linker cache: the host's static `ldconfig` (an exec-only copy), run over
//! the container's root in [`crate::enter::sandbox`], its cache copied into the container's
//! `/etc` ([`run_ldconfig`]).

use super::paths::LDCONFIGS;
use super::*;
use crate::enter::sandbox::{self, ForkError, Waited};
use std::time::Duration;

/// How long the container's `ldconfig` may take.
const LDCONFIG_TIMEOUT: Duration = Duration::from_secs(10);

/// One mount gpuhook made: where, and the identity of what it mounted (to unmount only that).
/// The host's static `ldconfig`, as an exec-only copy ([`sandbox::exec_only_copy`])
/// to be run over a container's root. One that needs a program interpreter would load the
/// container's `ld.so`: refused.
pub fn host_ldconfig() -> Result<OwnedFd, RootfsError> {
    let path = *LDCONFIGS
        .iter()
        .find(|p| std::path::Path::new(p).is_file())
        .ok_or(RootfsError::NoLdconfig)?;
    let f = std::fs::File::open(path).map_err(|e| RootfsError::LdconfigOpen {
        path: path.into(),
        error: e.into(),
    })?;
    if has_interpreter(&f, path)? {
        let path = path.into();
        return Err(RootfsError::LdconfigDynamic { path });
    }
    sandbox::exec_only_copy(&f, "ldconfig").map_err(|error| RootfsError::LdconfigCopy {
        path: path.into(),
        error,
    })
}

/// Whether a 64-bit ELF file (at `path`, for messages) has a `PT_INTERP` program header.
fn has_interpreter(f: &std::fs::File, path: &str) -> Result<bool, RootfsError> {
    const PT_INTERP: u32 = 3;
    let headers = crate::cdi::soname::program_headers(f).map_err(|e| RootfsError::LdconfigElf {
        path: path.into(),
        error: e.into(),
    })?;
    Ok(headers.iter().any(|s| s.kind == PT_INTERP))
}

// ---- in the container's root ----
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
pub(super) fn run_ldconfig(
    root: &OwnedFd,
    ldconfig: &OwnedFd,
    folders: &[String],
    owner: Owner,
    cgroups: &[OwnedFd],
) -> Result<(), RootfsError> {
    let mut argv: Vec<CString> = vec![c"ldconfig".into(), c"-i".into(), c"-X".into()];
    for f in folders {
        argv.push(CString::new(f.as_str()).map_err(|_| RootfsError::NulInFolder)?);
    }
    let etc = walk(root, "etc", false, &mut Done::default())?;
    let filter = sandbox::no_fork_filter().map_err(RootfsError::Filter)?;
    let first = move |wr: OwnedFd| {
        // SAFETY: plain syscalls on descriptors we own.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            libc::prctl(libc::PR_SET_DUMPABLE, 0);
            libc::dup2(wr.as_raw_fd(), 1);
            libc::dup2(wr.as_raw_fd(), 2);
        }
        match ldconfig_child(root, &etc, ldconfig, argv, owner, cgroups, &filter) {
            Ok(()) => 0,
            Err(e) => {
                let msg = e.to_string();
                // SAFETY: write to our end of the pipe.
                unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
                e.code()
            }
        }
    };
    // SAFETY: the caller is single-threaded (the gpuhook binary, or its helper child); the
    // child only makes syscalls and execs or _exits.
    let waited = unsafe { sandbox::fork_and_wait(LDCONFIG_TIMEOUT, 65536, first) };
    let (out, status) = waited.map_err(|e| match e {
        ForkError::Pipe(e) => RootfsError::LdconfigPipe(e),
        ForkError::Fork(e) => RootfsError::LdconfigFork(e),
        ForkError::TimedOut => RootfsError::LdconfigTimedOut {
            secs: LDCONFIG_TIMEOUT.as_secs(),
        },
        ForkError::Read(e) => RootfsError::LdconfigRead(e),
    })?;
    match status {
        Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
        other => {
            // What it wrote is its own text: the first line is said as it is.
            let text = String::from_utf8_lossy(&out);
            let said = text.lines().next().unwrap_or("").trim().to_owned();
            let status = Waited::from(other);
            Err(RootfsError::LdconfigFailed { status, said })
        }
    }
}

/// Why the first child of [`run_ldconfig`] failed: said on its standard error (the pipe),
/// with its exit code ([`ChildFailed::code`]).
#[derive(Debug, thiserror::Error)]
enum ChildFailed {
    /// A step of the set-up (`what`) failed.
    #[error("{what}: {errno}")]
    Sys { what: &'static str, errno: Errno },
    #[error("{0}")]
    AuxCache(RootfsError),
    #[error("cannot mount a tmpfs over /var/cache/ldconfig")]
    AuxTmpfs,
    #[error("this kernel cannot mount a tmpfs into a detached tree (Linux 6.15 can): refusing to run ldconfig as host root over the container's root")]
    HostRootInPlace,
    /// `ldconfig` exited with `code` (it said why itself).
    #[error("")]
    Exited { code: i32 },
    #[error("ldconfig killed by {0}")]
    Killed(nix::sys::signal::Signal),
    #[error("ldconfig: {0:?}")]
    Wait(nix::Result<nix::sys::wait::WaitStatus>),
    #[error("ldconfig's cache: {0}")]
    Cache(CacheError),
}

impl ChildFailed {
    /// The first child's exit code: `ldconfig`'s own, `128 + signal` when it was killed,
    /// else 127.
    fn code(&self) -> i32 {
        match self {
            ChildFailed::Exited { code } => *code,
            ChildFailed::Killed(sig) => 128 + *sig as i32,
            _ => 127,
        }
    }
}

/// The first child of [`run_ldconfig`]: the view, the run, the copy.
fn ldconfig_child(
    root: &OwnedFd,
    etc: &OwnedFd,
    ldconfig: &OwnedFd,
    mut argv: Vec<CString>,
    owner: Owner,
    cgroups: &[OwnedFd],
    filter: &seccompiler::BpfProgram,
) -> Result<(), ChildFailed> {
    let fail = |what: &'static str, errno: Errno| ChildFailed::Sys { what, errno };
    for cg in cgroups {
        nix::unistd::write(cg, b"0").map_err(|e| fail("joining the container's cgroup", e))?;
    }
    // A copy of the container's root with all its mounts, made nodev and nosuid while it
    // is detached (this process's own: the container never sees it).
    let view = clone_tree(root).map_err(|e| fail("cloning the container's root", e))?;
    let mut id = ldconfig_identity(owner);
    // Read-only too: ldconfig (-X) writes nothing in the container's tree, only into the
    // tmpfs mounted below, which are mounts of their own and writable. (Mounted into the
    // detached copy from the namespace it was cloned in: the kernel takes mounts into a
    // detached tree only from there.)
    set_attr(&view, MOUNT_ATTR_RDONLY, 0, AT_RECURSIVE)
        .map_err(|e| fail("making the copy of the container's root read-only", e))?;
    let cache = cache_tmpfs(&view, &["dev"], id);
    if cache.is_none() {
        // (Without a tmpfs, the cache is written in place: see below.)
        set_attr(&view, 0, MOUNT_ATTR_RDONLY, AT_RECURSIVE)
            .map_err(|e| fail("making the copy of the container's root writable", e))?;
    }
    // glibc's ldconfig writes its auxiliary cache too where that directory exists (even
    // with -i): a tmpfs of its own there as well. A symlink on the way would take that
    // write elsewhere: refused.
    let aux = aux_cache_dir(&view).map_err(ChildFailed::AuxCache)?;
    if aux && cache.is_some() && cache_tmpfs(&view, &["var", "cache", "ldconfig"], id).is_none() {
        return Err(ChildFailed::AuxTmpfs);
    }
    if cache.is_none() {
        // This kernel mounts nothing into a detached tree (before 6.15): ldconfig writes
        // in place, through nodev mounts, as the container's root, which must then not be
        // host root.
        if owner.uid == 0 && in_initial_user_ns() {
            return Err(ChildFailed::HostRootInPlace);
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
            let c = sandbox::Confinement {
                uid: id.uid,
                gid: id.gid,
                limits: &limits,
                filter,
            };
            let (what, e) = sandbox::confine_and_exec(ldconfig, &argv, &c);
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
        Ok(nix::sys::wait::WaitStatus::Exited(_, code)) => {
            return Err(ChildFailed::Exited { code })
        }
        Ok(nix::sys::wait::WaitStatus::Signaled(_, sig, _)) => {
            return Err(ChildFailed::Killed(sig))
        }
        other => return Err(ChildFailed::Wait(other)),
    }
    if let Some(cache) = cache {
        let bytes = read_cache(&cache).map_err(ChildFailed::Cache)?;
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
fn aux_cache_dir(view: &OwnedFd) -> Result<bool, RootfsError> {
    let mut at: Option<OwnedFd> = None;
    let mut path = String::new();
    for c in ["var", "cache", "ldconfig"] {
        path.push('/');
        path.push_str(c);
        let dir = at.as_ref().unwrap_or(view);
        let at_path = |e: Errno| RootfsError::At {
            path: path.clone(),
            errno: e.into(),
        };
        match fstatat(dir, c, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Err(Errno::ENOENT) => return Ok(false),
            Err(e) => return Err(at_path(e)),
            Ok(st) if st.st_mode & libc::S_IFMT != libc::S_IFDIR => {
                return Err(RootfsError::AuxCacheNotDir { path })
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
            .map_err(at_path)?,
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
    set_attr(&fd, MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID, 0, AT_RECURSIVE)?;
    Ok(fd)
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
fn read_cache(tmp: &OwnedFd) -> Result<Vec<u8>, CacheError> {
    use std::io::Read;
    let fd = openat(
        tmp,
        "ld.so.cache",
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let st = fstat(&fd)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size as u64 > CACHE_MAX {
        return Err(CacheError::NotRegular);
    }
    let mut out = Vec::with_capacity(st.st_size as usize);
    std::fs::File::from(fd)
        .take(CACHE_MAX)
        .read_to_end(&mut out)?;
    Ok(out)
}

/// Why the cache `ldconfig` built could not be read back (said by its first child).
#[derive(Debug, thiserror::Error)]
enum CacheError {
    #[error("{0}")]
    Sys(#[from] Errno),
    #[error("not a regular file of at most 64 MiB")]
    NotRegular,
    #[error("{0}")]
    Read(#[from] std::io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elf_errors_read_as_the_reader_says_them() {
        use super::super::error::ElfRead;
        use crate::cdi::soname::ElfError;
        let io = || std::io::Error::from_raw_os_error(libc::ENOENT);
        let eof = || std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        for e in [
            ElfError::Io(io()),
            ElfError::Io(eof()),
            ElfError::NotElf64,
            ElfError::HeaderSize,
            ElfError::TooManyHeaders,
        ] {
            let text = e.to_string();
            assert_eq!(ElfRead::from(e).to_string(), text);
        }
    }

    #[test]
    fn the_first_childs_failures_say_what_they_said_with_their_codes() {
        use nix::sys::signal::Signal;
        let sys = ChildFailed::Sys {
            what: "chroot",
            errno: Errno::EPERM,
        };
        assert_eq!(sys.to_string(), format!("chroot: {}", Errno::EPERM));
        assert_eq!(sys.code(), 127);
        assert_eq!(ChildFailed::Exited { code: 1 }.to_string(), "");
        assert_eq!(ChildFailed::Exited { code: 1 }.code(), 1);
        let killed = ChildFailed::Killed(Signal::SIGKILL);
        assert_eq!(killed.to_string(), "ldconfig killed by SIGKILL");
        assert_eq!(killed.code(), 128 + libc::SIGKILL);
        assert_eq!(ChildFailed::AuxTmpfs.code(), 127);
    }

    #[test]
    fn host_ldconfig_is_static() {
        // The build machine's ldconfig (glibc builds it static-pie).
        let fd = host_ldconfig().expect("a static ldconfig on this host");
        assert!(!has_interpreter(&std::fs::File::from(fd), "copy").unwrap());
        // A dynamically linked program has an interpreter.
        let sh = std::fs::File::open("/bin/sh").unwrap();
        assert!(has_interpreter(&sh, "/bin/sh").unwrap());
    }
}
