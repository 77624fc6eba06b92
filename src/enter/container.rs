//! Entering a running container (a libvirt LXC domain, an OCI container): finding its init,
//! and creating device nodes in its `/dev`.
//!
//! The container's `/dev` is hostile and can race us. All work there happens in a forked
//! child that `setns`es into the init's mount namespace (opened once when the container is
//! found, [`crate::enter::namespace`]; never a path through `/proc/PID/root`), walks from `/dev` one component at a time with `O_NOFOLLOW`, and acts
//! only through `*at()` calls on directory file descriptors it holds. It refuses a `/dev`
//! that is the host's, a directory that is another mount, and anything at a node's place that
//! is not already the right character device. It keeps only the capabilities it needs, and
//! undoes what it created when a later node fails.

use crate::enter::devdir::{self, Bound, Sys};
use crate::enter::namespace::{MntNs, PinError};
use crate::enter::rootfs;
use crate::enter::sandbox::{self, ForkError, Waited};
use crate::host::procfs::{self, Namespaces, Proc, ProcRef};
use crate::node::{NodeSpec, Outcome};
use nix::fcntl::OFlag;
use nix::sys::stat::{fstat, Mode};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::time::Duration;

use crate::enter::caps::{keep_only, CapsError};
use crate::enter::tree::DetachedTree;

mod dev;
mod error;
pub use dev::{DevBy, DevTmpfs};
pub use error::{ContainerError, Failure, Refusal};

fn gone(pid: i32, cause: Option<ContainerError>) -> ContainerError {
    ContainerError::gone(pid, cause)
}

/// `path: errno`, of a file the helper machinery opens or stats.
fn at(path: &str, e: nix::errno::Errno) -> Failure {
    let (path, errno) = (path.to_owned(), e.into());
    Failure::At { path, errno }
}

/// A running container: whose view of the mounts its `/dev` identity was read from
/// (`controller`: libvirt's `libvirt_lxc` controller; for an OCI container, which has no
/// process of its runtime left, its init itself), its init, and the identity of the `/dev`
/// made for it. Only the cgroup of a libvirt domain is found through `controller`
/// ([`crate::cgroup::for_container`]); an OCI container's is its init's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub controller: i32,
    pub init: ProcRef,
    pub dev: DevTmpfs,
    /// Its `/dev` is its own user namespace's (an OCI container with a user namespace: the
    /// runtime mounted it there), so the host's root can make no node in it: nodes are bind
    /// mounts of nodes gpuhook makes, on files made as its root (these host ids), as runc makes
    /// them in a user namespace ([`devdir::Bound`]). `None`: nodes are made with `mknod`.
    pub userns: Option<rootfs::Owner>,
    /// Where its runtime put it (an OCI container's, from the runtime's state; unknown for a
    /// libvirt domain, whose cgroup is its controller's): its device cgroup for hotplug.
    pub made: crate::cgroup::Made,
    /// Its init's mount namespace, opened once when it was found (and compared there with
    /// the one its runtime made, where gpuhook recorded it): every helper joins this one.
    pub mnt: MntNs,
}

/// Where libvirt keeps its LXC state (`LXC_STATE_DIR`): `/run/libvirt/lxc`, or
/// `/var/run/libvirt/lxc` in builds configured with that run-state directory.
pub const LXC_STATE_DIRS: [&str; 2] = ["/run/libvirt/lxc", "/var/run/libvirt/lxc"];

/// The last (topmost) of `mounts` at one of `points`.
fn topmost<'m>(mounts: &'m [procfs::Mount], points: &[String]) -> Option<&'m procfs::Mount> {
    mounts
        .iter()
        .rev()
        .find(|m| points.contains(&m.mount_point))
}

/// Whether a mount is a tmpfs mounted whole (root `/`).
fn whole_tmpfs(m: &procfs::Mount) -> bool {
    m.fs_type == "tmpfs" && m.root == "/"
}

/// Finds the container's `/dev` tmpfs among the controller's mounts: the last (topmost)
/// mount at `LXC_STATE_DIR/NAME.dev`, which must be a tmpfs mounted whole (root `/`).
/// Returns its mount point and device.
pub fn dev_mount(mounts: &[procfs::Mount], name: &str) -> Result<(String, u64), Failure> {
    let wanted: Vec<String> = LXC_STATE_DIRS
        .iter()
        .map(|d| format!("{d}/{name}.dev"))
        .collect();
    let m = topmost(mounts, &wanted).ok_or_else(|| Failure::NoDevTmpfs {
        at: wanted[0].clone(),
    })?;
    if !whole_tmpfs(m) {
        return Err(Failure::NotDevTmpfs {
            fs_type: m.fs_type.clone(),
            root: m.root.clone(),
            at: m.mount_point.clone(),
        });
    }
    Ok((m.mount_point.clone(), m.dev))
}

/// An OCI container's `/dev` among its init's own mounts: the topmost mount at `/dev`, which
/// must be a tmpfs mounted whole (the one the runtime mounts there). Returns its device.
pub fn oci_dev_mount(mounts: &[procfs::Mount]) -> Result<u64, Refusal> {
    let m = topmost(mounts, &["/dev".to_string()]).ok_or(Refusal::NoDevMount)?;
    if !whole_tmpfs(m) {
        return Err(Refusal::NotTmpfsDev {
            fs_type: m.fs_type.clone(),
            root: m.root.clone(),
        });
    }
    Ok(m.dev)
}

/// The identity of the directory `at` on the filesystem `dev`, seen through `pid`'s root
/// (`lstat`: a symlink there is no directory).
fn dev_identity(by: DevBy, pid: i32, at: &str, dev: u64) -> Result<DevTmpfs, ContainerError> {
    let p = format!("/proc/{pid}/root{at}");
    let at = at.to_owned();
    let st = nix::sys::stat::lstat(p.as_str()).map_err(|e| Failure::DevStat {
        by,
        pid,
        at: at.clone(),
        errno: e.into(),
    })?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR || st.st_dev != dev {
        return Err(Failure::DevMismatch { by, pid, at }.into());
    }
    Ok(DevTmpfs {
        dev,
        ino: st.st_ino,
        by,
    })
}

/// The identity of the container's `/dev` tmpfs, read from its controller: the mount from the
/// controller's `mountinfo`, the root inode by `stat` through the controller's root (both the
/// controller's view, which the container cannot change: its own mount namespace is a
/// private copy).
pub fn controller_dev(name: &str, controller: i32) -> Result<DevTmpfs, ContainerError> {
    let by = DevBy::Libvirt;
    let mounts = procfs::mounts(Some(controller)).ok_or(Failure::NoMountinfo {
        by,
        pid: controller,
    })?;
    let (at, dev) = dev_mount(&mounts, name)?;
    dev_identity(by, controller, &at, dev)
}

/// The running OCI container whose init is `init` (found by the front door: gpuhook's
/// record, or the runtime's state): the `/dev` tmpfs of the init's own mount namespace
/// (its `mountinfo`, and its root inode through the init's root), checked again by the
/// helper as at `started`. `controller` is the init itself. `userns`: its root's host ids,
/// when it runs in a user namespace of its own (its `/dev` is that namespace's). `want`: the
/// user and mount namespaces its runtime made (gpuhook's record), which the init must be in.
pub fn find_oci(
    init: ProcRef,
    userns: Option<rootfs::Owner>,
    want: Option<Namespaces>,
) -> Result<Container, ContainerError> {
    let by = DevBy::Runtime;
    let pid = init.pid;
    if !init.alive() {
        return Err(gone(pid, None));
    }
    let mnt = pin_init(init, want)?;
    let still = |e: ContainerError| if init.alive() { e } else { gone(pid, Some(e)) };
    let mounts = procfs::mounts(Some(pid))
        .ok_or(Failure::NoMountinfo { by, pid })
        .map_err(|e| still(e.into()))?;
    let dev = oci_dev_mount(&mounts).map_err(|e| still(e.into()))?;
    let dev = dev_identity(by, pid, "/dev", dev).map_err(still)?;
    // Read through its PID: the same process still, or what was read is another's.
    if !init.alive() {
        return Err(gone(pid, None));
    }
    Ok(Container {
        controller: pid,
        init,
        dev,
        userns,
        made: Default::default(),
        mnt,
    })
}

/// The init's mount namespace, opened once ([`MntNs::pin`]; with `want`, its user and mount
/// namespaces compared with those on the descriptors opened), then the init checked alive
/// still: a PID reused meanwhile would have given another process's namespace.
fn pin_init(init: ProcRef, want: Option<Namespaces>) -> Result<MntNs, ContainerError> {
    let pid = init.pid;
    let ns = MntNs::pin(pid, want).map_err(|e| -> ContainerError {
        match e {
            PinError::Left { kind } => Refusal::LeftNamespace { pid, kind }.into(),
            PinError::Open { kind, errno } => {
                at(&format!("/proc/{pid}/ns/{}", kind.file()), errno).into()
            }
        }
    });
    if !init.alive() {
        return Err(gone(pid, ns.err()));
    }
    ns
}

/// Accepts a domain name for use in `/run/libvirt/lxc/NAME.pid` (libvirt forbids `/`).
pub fn safe_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

/// The libvirt_lxc controller's PID from `/run/libvirt/lxc/NAME.pid`.
pub fn pidfile_controller(name: &str) -> Result<i32, ContainerError> {
    if !safe_name(name) {
        let name = name.to_owned();
        return Err(Failure::UnsafeName { name }.into());
    }
    let p = format!("/run/libvirt/lxc/{name}.pid");
    let s = std::fs::read_to_string(&p).map_err(|e| Failure::Pidfile {
        path: p.clone(),
        error: e.into(),
    })?;
    s.trim()
        .parse::<i32>()
        .map_err(|_| Failure::NoPid { path: p }.into())
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
    let proc = &procfs::REAL;
    if proc.start_time(controller).is_none() {
        return Err(Failure::NoController { controller }.into());
    }
    let inits: Vec<ProcRef> = proc
        .children(controller)
        .into_iter()
        .filter_map(|c| init_child(proc, controller, c))
        .collect();
    match inits.as_slice() {
        [init] => {
            // The controller takes the container's /dev down when its init dies: say that.
            let dev = controller_dev(name, controller).map_err(|e| {
                if init.alive() {
                    e
                } else {
                    gone(init.pid, Some(e))
                }
            })?;
            let mnt = pin_init(*init, None)?;
            Ok(Container {
                controller,
                init: *init,
                dev,
                userns: None,
                made: Default::default(),
                mnt,
            })
        }
        [] => Err(Failure::NoInit { controller }.into()),
        many => {
            let pids = many.iter().map(|p| p.pid).collect();
            Err(Failure::SeveralInits { controller, pids }.into())
        }
    }
}

/// `pid`, a child of `controller` a moment ago, as the container init: PID 1 of its own PID
/// namespace. Its identity (start time) is read first and checked again after the facts, with
/// its parent: had it exited and its PID been reused between the reads, the facts could be
/// another process's, and that process is not the controller's child.
fn init_child(proc: &Proc, controller: i32, pid: i32) -> Option<ProcRef> {
    let p = proc.proc_ref(pid)?;
    let ns = proc.nspid(pid);
    let is_init = ns.len() >= 2 && ns.last() == Some(&1);
    (is_init && proc.ppid(pid) == Some(controller) && proc.alive(&p)).then_some(p)
}

/// What a run in the container made (for rollback).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerMade {
    pub outcomes: Vec<Outcome>,
    /// Directories created, e.g. `/dev/dri`.
    pub dirs: Vec<String>,
    /// In a user-namespaced container: the nodes bind-mounted (those `Created`).
    #[serde(default)]
    pub bound: Vec<Bound>,
}

#[derive(Debug, Serialize, Deserialize)]
enum Job {
    Create(Vec<NodeSpec>),
    /// A user-namespaced container's nodes: bind mounts, acting as its root (`owner`).
    Bind(Vec<NodeSpec>, rootfs::Owner),
    Remove {
        nodes: Vec<NodeSpec>,
        dirs: Vec<String>,
        /// A user-namespaced container's (acting as its root): its nodes are mounts, those
        /// gpuhook made in `bound`.
        userns: Option<(rootfs::Owner, Vec<Bound>)>,
    },
    /// CDI: mounts, links and the linker cache in the container's root, acting as its root
    /// (`owner`).
    Inject(crate::cdi::Plan, rootfs::Owner),
    Uninject(rootfs::Done, rootfs::Owner),
    /// Which of these mounts are no longer in place.
    Check(Vec<rootfs::Mounted>),
}

#[derive(Debug, Serialize, Deserialize)]
enum Reply {
    Made(ContainerMade),
    Removed,
    Injected(rootfs::Done),
    /// What could not be undone.
    Left(crate::leftovers::Leftovers),
    /// The mounts no longer in place.
    Missing(Vec<String>),
    Failed(ContainerError),
}

/// How long the child may take. Operations are a few syscalls on a tmpfs; the bound only
/// guarantees the hook (and so libvirtd, which waits for it) never hangs.
const CHILD_TIMEOUT: Duration = Duration::from_secs(20);

/// Creates `nodes` in the container's `/dev`; on any failure removes what it created and
/// returns the error.
pub fn create_nodes(ct: &Container, nodes: &[NodeSpec]) -> Result<ContainerMade, ContainerError> {
    let job = match ct.userns {
        Some(owner) => Job::Bind(nodes.to_vec(), owner),
        None => Job::Create(nodes.to_vec()),
    };
    match run(ct, &job)? {
        Reply::Made(m) => Ok(m),
        Reply::Failed(e) => Err(e),
        _ => Err(Failure::UnexpectedReply.into()),
    }
}

/// Removes nodes this gpuhook created (each only if it is still that character device) and
/// the directories it created (if empty); in a user-namespaced container the nodes' mounts
/// ([`devdir::unbind`]: `bound`, those gpuhook made).
pub fn remove_nodes(
    ct: &Container,
    nodes: &[NodeSpec],
    dirs: &[String],
    bound: &[Bound],
) -> Result<(), ContainerError> {
    match run(
        ct,
        &Job::Remove {
            nodes: nodes.to_vec(),
            dirs: dirs.to_vec(),
            userns: ct.userns.map(|o| (o, bound.to_vec())),
        },
    )? {
        Reply::Removed => Ok(()),
        Reply::Failed(e) => Err(e),
        _ => Err(Failure::UnexpectedReply.into()),
    }
}

/// The `cgroup.procs` files of the init's cgroups, opened on the host for writing (the
/// container's `ldconfig` joins them: [`rootfs::apply`]).
fn container_cgroups(pid: i32) -> Result<Vec<OwnedFd>, ContainerError> {
    let files = crate::cgroup::procs_files(pid).map_err(Failure::Cgroup)?;
    files
        .iter()
        .map(|p| {
            nix::fcntl::open(
                p,
                OFlag::O_WRONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
                Mode::empty(),
            )
            .map_err(|e| at(&p.display().to_string(), e).into())
        })
        .collect()
}

/// Applies a CDI plan's mounts, links and linker cache in the container's root (its mount
/// sources cloned in the host's namespace first); on failure undoes what it did.
pub fn inject(
    ct: &Container,
    plan: &crate::cdi::Plan,
    owner: rootfs::Owner,
) -> Result<rootfs::Done, ContainerError> {
    match run(ct, &Job::Inject(plan.clone(), owner))? {
        Reply::Injected(d) => Ok(d),
        Reply::Failed(e) => Err(e),
        _ => Err(Failure::UnexpectedReply.into()),
    }
}

/// Takes back what [`inject`] did; returns what could not be.
pub fn uninject(
    ct: &Container,
    done: &rootfs::Done,
    owner: rootfs::Owner,
) -> Result<crate::leftovers::Leftovers, ContainerError> {
    match run(ct, &Job::Uninject(done.clone(), owner))? {
        Reply::Left(l) => Ok(l),
        Reply::Failed(e) => Err(e),
        _ => Err(Failure::UnexpectedReply.into()),
    }
}

/// The mounts of `mounted` no longer in place in the container.
pub fn check_mounts(
    ct: &Container,
    mounted: &[rootfs::Mounted],
) -> Result<Vec<String>, ContainerError> {
    match run(ct, &Job::Check(mounted.to_vec()))? {
        Reply::Missing(l) => Ok(l),
        Reply::Failed(e) => Err(e),
        _ => Err(Failure::UnexpectedReply.into()),
    }
}

fn run(ct: &Container, job: &Job) -> Result<Reply, ContainerError> {
    let init = ct.init;
    // The init's mount namespace as it was opened (and checked) when the container was found:
    // never opened again by its path, which the init may point elsewhere meanwhile.
    let ns = &ct.mnt;
    // The cgroups the container's ldconfig joins (before the check below that they are the
    // init's).
    let cgroups = match job {
        Job::Inject(p, _) if !p.ld_folders.is_empty() => container_cgroups(init.pid)?,
        _ => Vec::new(),
    };
    // The init still runs (what was read through its PID is its own): else say it is gone.
    if !init.alive() {
        return Err(gone(init.pid, None));
    }
    let own = nix::sys::stat::stat("/proc/self/ns/mnt").map_err(|e| at("/proc/self/ns/mnt", e))?;
    if own.st_ino == ns.id.ino && own.st_dev == ns.id.dev {
        return Err(Failure::SharedNamespace { pid: init.pid }.into());
    }
    let host_dev = nix::sys::stat::stat("/dev").map_err(|e| at("/dev", e))?;
    let payload = serde_json::to_vec(job).expect("job serializes");
    let helper = move |wr: OwnedFd| {
        let reply = match child(
            ns,
            cgroups,
            (host_dev.st_dev, host_dev.st_ino),
            ct.dev,
            &payload,
        ) {
            Ok(r) => r,
            Err(e) => Reply::Failed(e),
        };
        let bytes = serde_json::to_vec(&reply).unwrap_or_default();
        let mut f = std::fs::File::from(wr);
        let _ = f.write_all(&bytes);
        0
    };
    // SAFETY: a child forked from a multi-threaded process may find locks held by threads
    // that do not exist in it. The gpuhook binary is single-threaded (its C `main` starts no
    // Rust runtime and nothing spawns a thread). In any caller, the child takes no lock but
    // malloc's, which glibc makes fork-safe: it only makes syscalls, allocates, serializes
    // and leaves with _exit, never returning into the caller's code.
    let waited = unsafe { sandbox::fork_and_wait(CHILD_TIMEOUT, usize::MAX, helper) };
    let (out, status) = waited.map_err(|e| match e {
        ForkError::Pipe(e) => Failure::Pipe(e),
        ForkError::Fork(e) => Failure::Fork(e),
        ForkError::TimedOut => Failure::TimedOut {
            secs: CHILD_TIMEOUT.as_secs(),
        },
        ForkError::Read(e) => Failure::Read(e),
    })?;
    match status {
        Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => {}
        other => return Err(Failure::HelperFailed(Waited::from(other)).into()),
    }
    let reply: Reply = serde_json::from_slice(&out).map_err(|e| Failure::BadReply {
        error: e.to_string(),
    })?;
    // A failure because the init exited meanwhile (its namespace and /dev went under the
    // helper) is said as that: the caller decides on the cause, not the symptom.
    Ok(match reply {
        Reply::Failed(e) if !init.alive() => Reply::Failed(gone(init.pid, Some(e))),
        r => r,
    })
}

// ---- in the child, inside the container's mount namespace ----

fn child(
    ns: &MntNs,
    cgroups: Vec<OwnedFd>,
    host_dev: (u64, u64),
    want: DevTmpfs,
    payload: &[u8],
) -> Result<Reply, ContainerError> {
    // SAFETY: plain prctl calls on this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        libc::prctl(libc::PR_SET_DUMPABLE, 0);
    }
    let job: Job = serde_json::from_slice(payload).map_err(|e| Failure::BadJob {
        error: e.to_string(),
    })?;
    // What an injection needs from the host's side: the sources, cloned and made read-only
    // while detached, and the host's ldconfig.
    let mut trees = Vec::new();
    let mut ldconfig = None;
    let mut nodes_made = Vec::new();
    if let Job::Bind(nodes, _) = &job {
        match own_nodes(nodes) {
            Ok(t) => nodes_made = t,
            Err(e) => return Ok(Reply::Failed(e.into())),
        }
    }
    if let Job::Inject(plan, _) = &job {
        match rootfs::open_trees(&plan.mounts) {
            Ok(t) => trees = t,
            Err(e) => return Ok(Reply::Failed(Refusal::Rootfs(e).into())),
        }
        if !plan.ld_folders.is_empty() {
            match rootfs::ldconfig::host_ldconfig() {
                Ok(l) => ldconfig = Some(l),
                Err(e) => return Ok(Reply::Failed(Refusal::Rootfs(e).into())),
            }
        }
    }
    ns.join().map_err(|e| Failure::Setns(e.into()))?;
    match &job {
        Job::Inject(_, owner)
        | Job::Uninject(_, owner)
        | Job::Bind(_, owner)
        | Job::Remove {
            userns: Some((owner, _)),
            ..
        } => rootfs::act_as(*owner, true).map_err(Failure::Identity)?,
        _ => drop_capabilities().map_err(Failure::Caps)?,
    }
    nix::sys::stat::umask(Mode::empty());
    let root = nix::fcntl::open(
        "/",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Failure::Root(e.into()))?;
    let dev = devdir::open_dir(&Sys, &root, "dev").map_err(Failure::DevDir)?;
    let st = fstat(&dev).map_err(|e| Failure::DevFstat(e.into()))?;
    let refused = |r: Refusal| Ok(Reply::Failed(r.into()));
    if (st.st_dev, st.st_ino) == host_dev {
        return refused(Refusal::HostDev);
    }
    if (st.st_dev, st.st_ino) != (want.dev, want.ino) {
        return refused(Refusal::NotItsDev {
            dev: st.st_dev,
            ino: st.st_ino,
            want,
        });
    }
    let dev_fs = st.st_dev;
    Ok(match job {
        Job::Create(nodes) => create_in(&dev, dev_fs, &nodes),
        Job::Bind(nodes, _) => bind_in(&dev, dev_fs, &nodes, &nodes_made),
        Job::Remove {
            nodes,
            dirs,
            userns,
        } => {
            match userns {
                Some((_, bound)) => devdir::unbind(&Sys, &dev, dev_fs, &nodes, &bound, &dirs),
                None => devdir::remove(&Sys, &dev, dev_fs, &nodes, &dirs),
            }
            Reply::Removed
        }
        Job::Inject(plan, owner) => {
            match rootfs::apply(&root, trees, &plan, ldconfig.as_ref(), owner, &cgroups) {
                Ok(done) => Reply::Injected(done),
                Err(e) => Reply::Failed(Refusal::Rootfs(e).into()),
            }
        }
        Job::Uninject(done, _) => Reply::Left(rootfs::undo(&root, &done)),
        Job::Check(mounted) => Reply::Missing(rootfs::missing(&root, &mounted)),
    })
}

/// The helper's `Create`: each node made in the container's `/dev` (open as `dev`); on a
/// refusal, those it created are removed again.
fn create_in(dev: &OwnedFd, dev_fs: u64, nodes: &[NodeSpec]) -> Reply {
    let mut made = ContainerMade::default();
    for (i, n) in nodes.iter().enumerate() {
        match devdir::create_one(&Sys, dev, dev_fs, n, &mut made.dirs) {
            Ok(o) => made.outcomes.push(o),
            Err(e) => {
                let created: Vec<NodeSpec> = nodes[..i]
                    .iter()
                    .zip(&made.outcomes)
                    .filter(|(_, o)| **o == Outcome::Created)
                    .map(|(n, _)| n.clone())
                    .collect();
                devdir::remove(&Sys, dev, dev_fs, &created, &made.dirs);
                return Reply::Failed(Refusal::Node(e).into());
            }
        }
    }
    Reply::Made(made)
}

/// The helper's `Bind`: each node's detached tree (`trees`, made on the host's side) bound
/// in the container's `/dev`; on a refusal, those it bound are unbound again.
fn bind_in(dev: &OwnedFd, dev_fs: u64, nodes: &[NodeSpec], trees: &[DetachedTree]) -> Reply {
    let mut made = ContainerMade::default();
    for (n, t) in nodes.iter().zip(trees) {
        match devdir::bind_one(&Sys, dev, dev_fs, n, t, t.id(), &mut made.dirs) {
            Ok((o, b)) => {
                made.outcomes.push(o);
                made.bound.extend(b);
            }
            Err(e) => {
                devdir::unbind(&Sys, dev, dev_fs, nodes, &made.bound, &made.dirs);
                return Reply::Failed(Refusal::Node(e).into());
            }
        }
    }
    Reply::Made(made)
}

/// The nodes a user-namespaced container gets bind mounts of, made in the host's user
/// namespace where they can be used (in the helper, before it joins the container): a mount
/// namespace of the helper's own (nothing it mounts reaches the host's), a fresh tmpfs there
/// (not `nodev`), each node made on it as the request asks (number, mode, host-side owner), and
/// a detached clone of each ([`rootfs::node_tree`]). The tmpfs lives on in the mounts moved
/// into the container; nothing is left on the host.
fn own_nodes(nodes: &[NodeSpec]) -> Result<Vec<DetachedTree>, Failure> {
    use nix::mount::{mount, MsFlags};
    let fail = |what: &str, e: nix::errno::Errno| Failure::OwnNode {
        what: what.to_owned(),
        errno: e.into(),
    };
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| fail("(unshare of a mount namespace)", e))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| fail("(its mounts made private)", e))?;
    // Mounted over the host's /dev in this namespace alone: a directory every host has.
    mount(
        Some("gpuhook-nodes"),
        "/dev",
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=0700,size=64k,nr_inodes=1024"),
    )
    .map_err(|e| fail("(a tmpfs for them)", e))?;
    let dir = nix::fcntl::open(
        "/dev",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| fail("(its tmpfs)", e))?;
    nix::sys::stat::umask(Mode::empty());
    let mut out = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let what = || format!("{} ({}:{})", n.path, n.major, n.minor);
        if n.mode & !0o777 != 0 {
            return Err(fail(&what(), nix::errno::Errno::EINVAL));
        }
        let name = i.to_string();
        nix::sys::stat::mknodat(
            &dir,
            name.as_str(),
            nix::sys::stat::SFlag::S_IFCHR,
            Mode::from_bits_truncate(n.mode),
            n.rdev(),
        )
        .map_err(|e| fail(&what(), e))?;
        nix::unistd::fchownat(
            &dir,
            name.as_str(),
            Some(n.uid.into()),
            Some(n.gid.into()),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| fail(&what(), e))?;
        nix::sys::stat::fchmodat(
            &dir,
            name.as_str(),
            Mode::from_bits_truncate(n.mode),
            nix::sys::stat::FchmodatFlags::NoFollowSymlink,
        )
        .map_err(|e| fail(&what(), e))?;
        let t = rootfs::node_tree(&dir, &name).map_err(|e| fail(&what(), e))?;
        out.push(t);
    }
    Ok(out)
}

/// Keeps only what making nodes needs: mknod, chown, and reaching into directories the
/// container's root owns (work in its root: [`rootfs::act_as`]).
fn drop_capabilities() -> Result<(), CapsError> {
    use caps::Capability;
    keep_only(&[
        Capability::CAP_MKNOD,
        Capability::CAP_CHOWN,
        Capability::CAP_FOWNER,
        Capability::CAP_DAC_OVERRIDE,
        Capability::CAP_DAC_READ_SEARCH,
    ])
}

/// Opens a directory entry without following a symlink. Errors read "is a symlink; …",
/// "is a regular file, not a directory", ": <errno>".
#[cfg(test)]
mod tests {
    use super::*;

    /// The helper's errors cross the fork as values and read as one line.
    #[test]
    fn errors_are_values_across_the_fork() {
        let enoent = nix::errno::Errno::ENOENT;
        for e in [
            gone(42, None),
            gone(42, Some(at("/dev/nvidia0", enoent).into())),
            Refusal::HostDev.into(),
            Failure::Fork(nix::errno::Errno::EAGAIN.into()).into(),
            Refusal::Node(devdir::MakeNodeError::InTheWay {
                path: "/dev/nvidia0".into(),
                found: devdir::PlaceFound {
                    kind: libc::S_IFCHR,
                    rdev: libc::makedev(1, 3),
                },
                major: 195,
                minor: 0,
            })
            .into(),
            Refusal::Rootfs(rootfs::RootfsError::LdconfigFailed {
                status: Waited::Signaled {
                    pid: 9,
                    signal: libc::SIGKILL,
                    core: false,
                },
                said: "ldconfig: cannot open".into(),
            })
            .into(),
            Failure::Cgroup(crate::cgroup::CgroupError::new(
                std::path::Path::new("/proc/7/cgroup"),
                crate::cgroup::Fault::Read(std::io::Error::from_raw_os_error(libc::EACCES).into()),
            ))
            .into(),
        ] {
            let reply = Reply::Failed(e.clone());
            let back: Reply = serde_json::from_slice(&serde_json::to_vec(&reply).unwrap()).unwrap();
            assert!(matches!(back, Reply::Failed(ref x) if *x == e), "{back:?}");
        }
        assert_eq!(gone(7, None).to_string(), "container init 7 exited");
        assert_eq!(
            gone(7, Some(at("/proc/7/ns/mnt", enoent).into())).to_string(),
            "container init 7 exited (/proc/7/ns/mnt: ENOENT: No such file or directory)"
        );
        assert_eq!(
            ContainerError::from(Failure::Fork(nix::errno::Errno::EAGAIN.into())).to_string(),
            format!("fork: {}", nix::errno::Errno::EAGAIN)
        );
        let ld = ContainerError::from(Refusal::Rootfs(rootfs::RootfsError::LdconfigFailed {
            status: Waited::Exited { pid: 9, code: 1 },
            said: String::new(),
        }));
        assert_eq!(ld.to_string(), "ldconfig in the container failed (exit 1)");
    }

    fn mount(point: &str, fs: &str, root: &str, dev: u64) -> procfs::Mount {
        procfs::Mount {
            dev,
            root: root.into(),
            mount_point: point.into(),
            fs_type: fs.into(),
            super_options: "rw".into(),
        }
    }

    #[test]
    fn libvirts_dev_tmpfs_among_the_controllers_mounts() {
        let base = vec![
            mount("/", "ext4", "/", 1),
            mount("/run/libvirt/lxc/t1.devpts", "devpts", "/", 2),
        ];
        let e = dev_mount(&base, "t1").unwrap_err().to_string();
        assert!(
            e.contains("no /dev tmpfs mounted at /run/libvirt/lxc/t1.dev"),
            "{e}"
        );
        let mut m = base.clone();
        m.push(mount("/run/libvirt/lxc/t1.dev", "tmpfs", "/", 7));
        m.push(mount("/run/libvirt/lxc/t10.dev", "tmpfs", "/", 8));
        assert_eq!(
            dev_mount(&m, "t1").unwrap(),
            ("/run/libvirt/lxc/t1.dev".into(), 7)
        );
        // The topmost mount at the path rules; it must be a whole tmpfs.
        m.push(mount("/run/libvirt/lxc/t1.dev", "ext4", "/", 9));
        assert!(dev_mount(&m, "t1")
            .unwrap_err()
            .to_string()
            .contains("ext4 (root /)"));
        m.push(mount("/run/libvirt/lxc/t1.dev", "tmpfs", "/sub", 7));
        assert!(dev_mount(&m, "t1")
            .unwrap_err()
            .to_string()
            .contains("root /sub"));
        // Builds that keep the state under /var/run.
        let v = vec![mount("/var/run/libvirt/lxc/t1.dev", "tmpfs", "/", 5)];
        assert_eq!(dev_mount(&v, "t1").unwrap().1, 5);
    }

    /// An OCI container's `/dev` is the topmost mount at `/dev` of its init's: a whole tmpfs.
    #[test]
    fn an_oci_containers_dev_among_its_inits_mounts() {
        let mut m = vec![mount("/", "overlay", "/", 1)];
        assert_eq!(oci_dev_mount(&m), Err(Refusal::NoDevMount));
        m.push(mount("/dev", "tmpfs", "/", 7));
        m.push(mount("/dev/shm", "tmpfs", "/", 8));
        assert_eq!(oci_dev_mount(&m), Ok(7));
        // Something mounted over it: a bind of another directory, the host's devtmpfs.
        m.push(mount("/dev", "tmpfs", "/sub", 9));
        let e = ContainerError::from(oci_dev_mount(&m).unwrap_err()).to_string();
        assert_eq!(e, "container /dev is tmpfs (root /sub), not the tmpfs its OCI runtime mounts; refusing to write there");
        m.push(mount("/dev", "devtmpfs", "/", 5));
        assert!(
            matches!(oci_dev_mount(&m), Err(Refusal::NotTmpfsDev { fs_type, .. }) if fs_type == "devtmpfs")
        );
        // The helper's refusal names who made the /dev it wanted.
        let want = |by| DevTmpfs {
            dev: libc::makedev(0, 43),
            ino: 1,
            by,
        };
        let found = |by| {
            Refusal::NotItsDev {
                dev: libc::makedev(0, 50),
                ino: 2,
                want: want(by),
            }
            .to_string()
        };
        assert!(found(DevBy::Libvirt).starts_with("container /dev is not the tmpfs libvirt made for it (found device 0:50 inode 2, want 0:43 inode 1)"));
        assert!(found(DevBy::Runtime)
            .starts_with("container /dev is not the tmpfs its OCI runtime made for it"));
        let f = Failure::DevMismatch {
            by: DevBy::Runtime,
            pid: 7,
            at: "/dev".into(),
        };
        assert_eq!(
            f.to_string(),
            "container init 7: /dev is not the tmpfs its mountinfo lists"
        );
    }

    /// A written-out `/proc`: each process's `stat` (state, parent, flags, start time),
    /// `status` (`NSpid`) and its threads.
    /// pid, state, parent, start time, `NSpid`, threads.
    type FakeProc<'a> = (i32, &'a str, i32, u64, &'a str, &'a [i32]);

    fn fake_proc(procs: &[FakeProc]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (pid, state, ppid, start, nspid, threads) in procs {
            let p = d.path().join(pid.to_string());
            std::fs::create_dir_all(p.join("task")).unwrap();
            // Fields after "(comm)": state ppid pgrp session tty tpgid flags … starttime (22nd).
            let mut f: Vec<String> = vec![state.to_string(), ppid.to_string()];
            f.extend(["1", "1", "0", "-1", "4194560"].map(String::from));
            f.extend((0..12).map(|_| "0".to_string()));
            f.push(start.to_string());
            let stat = format!("{pid} (init (x)) {}\n", f.join(" "));
            std::fs::write(p.join("stat"), &stat).unwrap();
            std::fs::write(p.join("status"), format!("Name:\tinit\nNSpid:\t{nspid}\n")).unwrap();
            for t in *threads {
                let td = p.join("task").join(t.to_string());
                std::fs::create_dir_all(&td).unwrap();
                std::fs::write(
                    td.join("stat"),
                    if t == pid {
                        stat.clone()
                    } else {
                        stat.replacen(&format!(") {state} "), ") R ", 1)
                    },
                )
                .unwrap();
            }
        }
        d
    }

    /// The init is decided from `/proc` facts alone: PID 1 of a nested PID namespace, child of
    /// the controller, running; a zombie leader lives on while another thread runs.
    #[test]
    fn init_from_a_written_out_proc() {
        let d = fake_proc(&[
            (100, "S", 1, 5, "100", &[100]),           // the controller
            (200, "S", 100, 7, "200 1", &[200]),       // its container init
            (201, "S", 100, 8, "201", &[201]),         // a plain child
            (202, "S", 55, 9, "202 1", &[202]),        // an init, not the controller's
            (203, "Z", 100, 10, "203 1", &[203]),      // an exited init
            (204, "Z", 100, 11, "204 1", &[204, 205]), // leader exited, another thread runs
        ]);
        let root = d.path().to_str().unwrap().to_string();
        let proc = Proc { root: &root };
        let got: Vec<Option<i32>> = [200, 201, 202, 203, 204, 299]
            .iter()
            .map(|c| init_child(&proc, 100, *c).map(|p| p.pid))
            .collect();
        assert_eq!(got, [Some(200), None, None, None, Some(204), None]);
        // The same PID with another start time is another process.
        let old = ProcRef {
            pid: 200,
            start_time: 6,
        };
        assert!(!proc.alive(&old));
        assert!(proc.alive(&ProcRef {
            pid: 200,
            start_time: 7
        }));
    }

    /// Only a child of the controller that is PID 1 of its own PID namespace is the init.
    #[test]
    fn init_is_the_controllers_pid_namespace_init() {
        let me = std::process::id() as i32;
        let mut plain = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert_eq!(
            init_child(&procfs::REAL, me, plain.id() as i32),
            None,
            "not a PID-namespace init"
        );
        let mut ns = std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--", "sleep", "5"])
            .spawn()
            .unwrap();
        let unshare = ns.id() as i32;
        let mut init = None;
        for _ in 0..100 {
            if let Some(c) = procfs::REAL.children(unshare).first() {
                init = Some(*c);
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let init = init.expect("unshare's child");
        let got = init_child(&procfs::REAL, unshare, init)
            .expect("PID 1 of its namespace, child of unshare");
        assert_eq!(got.pid, init);
        assert_eq!(
            init_child(&procfs::REAL, me, init),
            None,
            "not our child: parentage is checked"
        );
        let _ = ns.kill();
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(init), nix::sys::signal::SIGKILL);
        ns.wait().unwrap();
        plain.kill().unwrap();
        plain.wait().unwrap();
    }
}
