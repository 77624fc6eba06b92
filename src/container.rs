//! Entering a running libvirt LXC container: finding its init, and creating device nodes in
//! its `/dev`.
//!
//! The container's `/dev` is hostile and can race us. All work there happens in a forked
//! child that `setns`es into the init's mount namespace (never a path through
//! `/proc/PID/root`), walks from `/dev` one component at a time with `O_NOFOLLOW`, and acts
//! only through `*at()` calls on directory file descriptors it holds. It refuses a `/dev`
//! that is the host's, a directory that is another mount, and anything at a node's place that
//! is not already the right character device. It keeps only the capabilities it needs, and
//! undoes what it created when a later node fails.

use crate::procfs::{self, ProcRef};
use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, fstatat, mkdirat, mknodat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ContainerError(pub String);

fn cerr<T>(m: impl Into<String>) -> Result<T, ContainerError> {
    Err(ContainerError(m.into()))
}

/// A running container: its libvirt_lxc controller and its init.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Container {
    pub controller: i32,
    pub init: ProcRef,
}

/// Accepts a domain name for use in `/run/libvirt/lxc/NAME.pid` (libvirt forbids `/`).
fn safe_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

/// The libvirt_lxc controller's PID from `/run/libvirt/lxc/NAME.pid`.
pub fn pidfile_controller(name: &str) -> Result<i32, ContainerError> {
    if !safe_name(name) {
        return cerr(format!("unsafe domain name {name:?}"));
    }
    let p = format!("/run/libvirt/lxc/{name}.pid");
    let s = std::fs::read_to_string(&p)
        .map_err(|e| ContainerError(format!("domain XML has no id and {p} cannot be read: {e}")))?;
    s.trim()
        .parse::<i32>()
        .map_err(|_| ContainerError(format!("{p} holds no PID")))
}

/// Finds the container of a running domain. `id` is `<domain id=…>` (the controller's
/// PID); without it, `/run/libvirt/lxc/NAME.pid`. The init is the controller's child whose
/// PID in its own namespace is 1. (The status XML's `<init pid>` is stale during `started`:
/// never used.)
pub fn find(name: &str, id: Option<i32>) -> Result<Container, ContainerError> {
    let controller = match id {
        Some(pid) if pid > 0 => pid,
        _ => pidfile_controller(name)?,
    };
    if procfs::start_time(controller).is_none() {
        return cerr(format!("controller process {controller} does not exist"));
    }
    let inits: Vec<i32> = procfs::children(controller)
        .into_iter()
        .filter(|c| {
            let ns = procfs::nspid(*c);
            ns.len() >= 2 && ns.last() == Some(&1)
        })
        .collect();
    match inits.as_slice() {
        [init] => {
            let init = ProcRef::of(*init)
                .ok_or_else(|| ContainerError(format!("container init {init} exited")))?;
            Ok(Container { controller, init })
        }
        [] => cerr(format!(
            "controller {controller} has no child that is PID 1 of a PID namespace (container init not running)"
        )),
        many => cerr(format!("controller {controller} has several container inits {many:?}")),
    }
}

/// A node to create in the container: its path there, number, mode and host-side owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSpec {
    pub path: String,
    pub major: u32,
    pub minor: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl NodeSpec {
    fn rdev(&self) -> u64 {
        libc::makedev(self.major, self.minor)
    }
    /// Components under `/dev`, each a plain name.
    fn components(&self) -> Result<Vec<&str>, String> {
        let rest = self
            .path
            .strip_prefix("/dev/")
            .ok_or_else(|| format!("node path {} is not under /dev", self.path))?;
        let comps: Vec<&str> = rest.split('/').collect();
        if comps
            .iter()
            .any(|c| c.is_empty() || *c == "." || *c == ".." || c.contains('\0'))
        {
            return Err(format!("bad node path {}", self.path));
        }
        Ok(comps)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// gpuhook made the node.
    Created,
    /// The right character device was already there; left as it was.
    Existing,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Status {
    Present,
    Missing,
    /// Something else is there (described).
    Wrong(String),
}

/// What a run in the container made (for rollback).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Made {
    pub outcomes: Vec<Outcome>,
    /// Directories created, e.g. `/dev/dri`.
    pub dirs: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
enum Job {
    Create(Vec<NodeSpec>),
    Remove {
        nodes: Vec<NodeSpec>,
        dirs: Vec<String>,
    },
    Inspect(Vec<NodeSpec>),
}

#[derive(Debug, Serialize, Deserialize)]
enum Reply {
    Made(Made),
    Removed,
    Statuses(Vec<Status>),
    Failed(String),
}

/// How long the child may take. Operations are a few syscalls on a tmpfs; the bound only
/// guarantees the hook (and so libvirtd, which waits for it) never hangs.
const CHILD_TIMEOUT: Duration = Duration::from_secs(20);

/// Creates `nodes` in the container's `/dev`; on any failure removes what it created and
/// returns the error.
pub fn create_nodes(init: ProcRef, nodes: &[NodeSpec]) -> Result<Made, ContainerError> {
    match run(init, &Job::Create(nodes.to_vec()))? {
        Reply::Made(m) => Ok(m),
        Reply::Failed(e) => Err(ContainerError(e)),
        _ => cerr("unexpected reply from container helper"),
    }
}

/// Removes nodes this gpuhook created (each only if it is still that character device) and
/// the directories it created (if empty).
pub fn remove_nodes(
    init: ProcRef,
    nodes: &[NodeSpec],
    dirs: &[String],
) -> Result<(), ContainerError> {
    match run(
        init,
        &Job::Remove {
            nodes: nodes.to_vec(),
            dirs: dirs.to_vec(),
        },
    )? {
        Reply::Removed => Ok(()),
        Reply::Failed(e) => Err(ContainerError(e)),
        _ => cerr("unexpected reply from container helper"),
    }
}

/// What is at each node's place in the container.
pub fn inspect(init: ProcRef, nodes: &[NodeSpec]) -> Result<Vec<Status>, ContainerError> {
    match run(init, &Job::Inspect(nodes.to_vec()))? {
        Reply::Statuses(s) => Ok(s),
        Reply::Failed(e) => Err(ContainerError(e)),
        _ => cerr("unexpected reply from container helper"),
    }
}

fn run(init: ProcRef, job: &Job) -> Result<Reply, ContainerError> {
    let ns_path = format!("/proc/{}/ns/mnt", init.pid);
    let ns = nix::fcntl::open(
        ns_path.as_str(),
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        ContainerError(format!(
            "container init {} is gone ({ns_path}: {e})",
            init.pid
        ))
    })?;
    // The namespace we hold is the init's only if the PID was not reused meanwhile.
    if !init.alive() {
        return cerr(format!("container init {} exited", init.pid));
    }
    let own = nix::sys::stat::stat("/proc/self/ns/mnt")
        .map_err(|e| ContainerError(format!("/proc/self/ns/mnt: {e}")))?;
    let theirs = fstat(&ns).map_err(|e| ContainerError(format!("{ns_path}: {e}")))?;
    if own.st_ino == theirs.st_ino && own.st_dev == theirs.st_dev {
        return cerr(format!(
            "container init {} shares the host's mount namespace; refusing",
            init.pid
        ));
    }
    let host_dev =
        nix::sys::stat::stat("/dev").map_err(|e| ContainerError(format!("/dev: {e}")))?;
    let (rd, wr) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| ContainerError(format!("pipe: {e}")))?;
    let payload = serde_json::to_vec(job).expect("job serializes");
    // SAFETY: the child only makes syscalls, allocates (glibc's malloc is fork-safe) and
    // leaves with _exit; it never returns into the caller's code.
    match unsafe { nix::unistd::fork() }.map_err(|e| ContainerError(format!("fork: {e}")))? {
        nix::unistd::ForkResult::Child => {
            drop(rd);
            let reply = match child(&ns, (host_dev.st_dev, host_dev.st_ino), &payload) {
                Ok(r) => r,
                Err(e) => Reply::Failed(e),
            };
            let bytes = serde_json::to_vec(&reply).unwrap_or_default();
            let mut f = std::fs::File::from(wr);
            let _ = f.write_all(&bytes);
            drop(f);
            // SAFETY: leave without running the parent's destructors or atexit handlers.
            unsafe { libc::_exit(0) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(wr);
            drop(ns);
            let out = read_with_deadline(rd, CHILD_TIMEOUT);
            if out.is_err() {
                let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
            }
            let status = nix::sys::wait::waitpid(child, None);
            let out = out?;
            match status {
                Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => {}
                other => return cerr(format!("container helper failed: {other:?}")),
            }
            serde_json::from_slice(&out)
                .map_err(|e| ContainerError(format!("container helper reply: {e}")))
        }
    }
}

fn read_with_deadline(fd: OwnedFd, limit: Duration) -> Result<Vec<u8>, ContainerError> {
    let deadline = Instant::now() + limit;
    let mut f = std::fs::File::from(fd);
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return cerr(format!(
                "container helper did not finish within {}s; killed",
                limit.as_secs()
            ));
        }
        let mut pfd = libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if r < 0 {
            if Errno::last() == Errno::EINTR {
                continue;
            }
            return cerr(format!("poll: {}", Errno::last()));
        }
        if r == 0 {
            continue;
        }
        match f.read(&mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return cerr(format!("reading container helper: {e}")),
        }
    }
}

// ---- in the child, inside the container's mount namespace ----

fn child(ns: &OwnedFd, host_dev: (u64, u64), payload: &[u8]) -> Result<Reply, String> {
    // SAFETY: plain prctl calls on this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        libc::prctl(libc::PR_SET_DUMPABLE, 0);
    }
    let job: Job = serde_json::from_slice(payload).map_err(|e| format!("job: {e}"))?;
    nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("setns into the container's mount namespace: {e}"))?;
    drop_capabilities()?;
    nix::sys::stat::umask(Mode::empty());
    let root = nix::fcntl::open(
        "/",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("container /: {e}"))?;
    let dev = open_dir(&root, "dev").map_err(|e| format!("container /dev {e}"))?;
    let st = fstat(&dev).map_err(|e| format!("container /dev: {e}"))?;
    if (st.st_dev, st.st_ino) == host_dev {
        return Err("container /dev is the host's /dev; refusing to write there".into());
    }
    let dev_fs = st.st_dev;
    Ok(match job {
        Job::Create(nodes) => {
            let mut made = Made::default();
            for (i, n) in nodes.iter().enumerate() {
                match create_one(&dev, dev_fs, n, &mut made.dirs) {
                    Ok(o) => made.outcomes.push(o),
                    Err(e) => {
                        let created: Vec<NodeSpec> = nodes[..i]
                            .iter()
                            .zip(&made.outcomes)
                            .filter(|(_, o)| **o == Outcome::Created)
                            .map(|(n, _)| n.clone())
                            .collect();
                        remove(&dev, dev_fs, &created, &made.dirs);
                        return Ok(Reply::Failed(e));
                    }
                }
            }
            Reply::Made(made)
        }
        Job::Remove { nodes, dirs } => {
            remove(&dev, dev_fs, &nodes, &dirs);
            Reply::Removed
        }
        Job::Inspect(nodes) => {
            Reply::Statuses(nodes.iter().map(|n| status(&dev, dev_fs, n)).collect())
        }
    })
}

/// Keeps only what making nodes needs: mknod, chown, and reaching into directories the
/// container's root owns.
fn drop_capabilities() -> Result<(), String> {
    use caps::{CapSet, Capability};
    let want: caps::CapsHashSet = [
        Capability::CAP_MKNOD,
        Capability::CAP_CHOWN,
        Capability::CAP_FOWNER,
        Capability::CAP_DAC_OVERRIDE,
        Capability::CAP_DAC_READ_SEARCH,
    ]
    .into_iter()
    .collect();
    let have =
        caps::read(None, CapSet::Permitted).map_err(|e| format!("reading capabilities: {e}"))?;
    let keep: caps::CapsHashSet = want.intersection(&have).copied().collect();
    caps::set(None, CapSet::Effective, &keep).map_err(|e| format!("dropping capabilities: {e}"))?;
    caps::set(None, CapSet::Permitted, &keep).map_err(|e| format!("dropping capabilities: {e}"))?;
    caps::clear(None, CapSet::Inheritable).map_err(|e| format!("dropping capabilities: {e}"))?;
    Ok(())
}

/// Opens a directory entry without following a symlink. Errors read "is a symlink; …",
/// "is a regular file, not a directory", ": <errno>".
fn open_dir(parent: &OwnedFd, name: &str) -> Result<OwnedFd, String> {
    openat(
        parent,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        // O_DIRECTORY|O_NOFOLLOW on a symlink gives ENOTDIR (or ELOOP): say what it is.
        Errno::ELOOP | Errno::ENOTDIR => {
            match fstatat(parent, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => {
                    "is a symlink; refusing to follow it".to_owned()
                }
                Ok(st) => format!("is {}, not a directory", describe(&st)),
                Err(e) => format!(": {e}"),
            }
        }
        e => format!(": {e}"),
    })
}

/// What kind of thing an `fstatat` found, for messages.
fn describe(st: &libc::stat) -> String {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFLNK => "a symlink".into(),
        libc::S_IFREG => "a regular file".into(),
        libc::S_IFDIR => "a directory".into(),
        libc::S_IFBLK => "a block device".into(),
        libc::S_IFIFO => "a FIFO".into(),
        libc::S_IFSOCK => "a socket".into(),
        libc::S_IFCHR => format!(
            "the character device {}:{}",
            libc::major(st.st_rdev),
            libc::minor(st.st_rdev)
        ),
        _ => "something unknown".into(),
    }
}

fn is_node(st: &libc::stat, n: &NodeSpec) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFCHR && st.st_rdev == n.rdev()
}

/// Walks to the directory holding the node; creates missing directories when `dirs` is given.
fn walk_parent<'a>(
    dev: &OwnedFd,
    dev_fs: u64,
    n: &'a NodeSpec,
    mut dirs: Option<&mut Vec<String>>,
) -> Result<Option<(OwnedFd, &'a str)>, String> {
    let comps = n.components()?;
    let (leaf, parents) = comps
        .split_last()
        .ok_or_else(|| format!("bad node path {}", n.path))?;
    let mut cur = dev.try_clone().map_err(|e| format!("dup: {e}"))?;
    let mut at = String::from("/dev");
    for c in parents {
        at = format!("{at}/{c}");
        let next = match open_dir(&cur, c) {
            Ok(fd) => fd,
            Err(_)
                if matches!(
                    fstatat(&cur, *c, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW),
                    Err(Errno::ENOENT)
                ) =>
            {
                let Some(d) = dirs.as_deref_mut() else {
                    return Ok(None);
                };
                match mkdirat(&cur, *c, Mode::from_bits_truncate(0o755)) {
                    Ok(()) => d.push(at.clone()),
                    Err(Errno::EEXIST) => {}
                    Err(e) => return Err(format!("cannot create container {at}: {e}")),
                }
                open_dir(&cur, c).map_err(|e| format!("container {at} {e}"))?
            }
            Err(e) => return Err(format!("container {at} {e}")),
        };
        let st = fstat(&next).map_err(|e| format!("container {at}: {e}"))?;
        if st.st_dev != dev_fs {
            return Err(format!("container {at} is another mount; refusing"));
        }
        cur = next;
    }
    Ok(Some((cur, leaf)))
}

fn create_one(
    dev: &OwnedFd,
    dev_fs: u64,
    n: &NodeSpec,
    dirs: &mut Vec<String>,
) -> Result<Outcome, String> {
    let (dir, leaf) = walk_parent(dev, dev_fs, n, Some(dirs))?.expect("dirs given");
    let nofollow = nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW;
    match fstatat(&dir, leaf, nofollow) {
        Ok(st) if is_node(&st, n) => return Ok(Outcome::Existing),
        Ok(st) => {
            return Err(format!(
                "container {} is {} (not the character device {}:{}); refusing to replace it",
                n.path,
                describe(&st),
                n.major,
                n.minor
            ))
        }
        Err(Errno::ENOENT) => {}
        Err(e) => return Err(format!("container {}: {e}", n.path)),
    }
    if n.mode & !0o777 != 0 {
        return Err(format!("bad mode {:o} for {}", n.mode, n.path));
    }
    mknodat(
        &dir,
        leaf,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(n.mode),
        n.rdev(),
    )
    .map_err(|e| {
        format!(
            "cannot create container {} ({}:{}): {e}",
            n.path, n.major, n.minor
        )
    })?;
    // From here on, act on the node we made through a descriptor that names it, never by path.
    let done = (|| {
        let fd = openat(
            &dir,
            leaf,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("container {} vanished after mknod: {e}", n.path))?;
        let st = fstat(&fd).map_err(|e| format!("container {}: {e}", n.path))?;
        if !is_node(&st, n) {
            return Err(format!(
                "container {} was swapped for {} while being created",
                n.path,
                describe(&st)
            ));
        }
        // SAFETY: fchownat on a valid O_PATH descriptor with AT_EMPTY_PATH touches that inode.
        let r = unsafe {
            libc::fchownat(
                fd.as_raw_fd(),
                c"".as_ptr(),
                n.uid,
                n.gid,
                libc::AT_EMPTY_PATH,
            )
        };
        Errno::result(r).map_err(|e| {
            format!(
                "cannot chown container {} to {}:{}: {e}",
                n.path, n.uid, n.gid
            )
        })?;
        let st = fstat(&fd).map_err(|e| format!("container {}: {e}", n.path))?;
        if st.st_mode & 0o7777 != n.mode {
            return Err(format!(
                "container {} has mode {:o}, wanted {:o}",
                n.path,
                st.st_mode & 0o7777,
                n.mode
            ));
        }
        Ok(())
    })();
    if let Err(e) = done {
        remove(dev, dev_fs, std::slice::from_ref(n), &[]);
        return Err(e);
    }
    Ok(Outcome::Created)
}

fn remove(dev: &OwnedFd, dev_fs: u64, nodes: &[NodeSpec], dirs: &[String]) {
    for n in nodes.iter().rev() {
        let Ok(Some((dir, leaf))) = walk_parent(dev, dev_fs, n, None) else {
            continue;
        };
        match fstatat(&dir, leaf, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if is_node(&st, n) => {
                let _ = unlinkat(&dir, leaf, UnlinkatFlags::NoRemoveDir);
            }
            _ => {}
        }
    }
    for d in dirs.iter().rev() {
        let Some(rel) = d.strip_prefix("/dev/") else {
            continue;
        };
        let comps: Vec<&str> = rel.split('/').collect();
        let (leaf, parents) = match comps.split_last() {
            Some(x) => x,
            None => continue,
        };
        let mut cur = match dev.try_clone() {
            Ok(c) => c,
            Err(_) => continue,
        };
        let mut ok = true;
        for c in parents {
            match open_dir(&cur, c) {
                Ok(fd) => cur = fd,
                Err(_) => {
                    ok = false;
                    break;
                }
            }
        }
        if ok {
            // Only an empty directory goes; a symlink put in its place is not a directory.
            let _ = unlinkat(&cur, *leaf, UnlinkatFlags::RemoveDir);
        }
    }
}

fn status(dev: &OwnedFd, dev_fs: u64, n: &NodeSpec) -> Status {
    match walk_parent(dev, dev_fs, n, None) {
        Err(e) => Status::Wrong(e),
        Ok(None) => Status::Missing,
        Ok(Some((dir, leaf))) => {
            match fstatat(&dir, leaf, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) if is_node(&st, n) => Status::Present,
                Ok(st) => Status::Wrong(format!("container {} is {}", n.path, describe(&st))),
                Err(Errno::ENOENT) => Status::Missing,
                Err(e) => Status::Wrong(format!("container {}: {e}", n.path)),
            }
        }
    }
}
