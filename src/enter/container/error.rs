//! Why work on a container failed, as a value the caller decides on ([`ContainerError`]: the
//! init gone, refused by the container, or anything else). It crosses the fork from the
//! helper as serde, so every error in it is a value: OS errors by their numbers
//! ([`crate::host::syserr`]), what a library or a child said by its text.

use super::dev::{DevBy, DevTmpfs};
use crate::cgroup::CgroupError;
use crate::enter::caps::CapsError;
use crate::enter::devdir::{MakeNodeError, OpenDirError};
use crate::enter::rootfs::RootfsError;
use crate::enter::sandbox::{PipeError, Waited};
use crate::host::syserr::{IoErr, SysErr};
use serde::{Deserialize, Serialize};

/// Why work on a container failed; still one line for the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ContainerError {
    /// The container's init is gone: its mount namespace, `/dev` and cgroup went with it, so
    /// nothing of it is left to act on or undo; `cause`: what failed because of it.
    #[error("container init {pid} exited{}", cause.as_ref().map(|c| format!(" ({c})")).unwrap_or_default())]
    InitGone {
        pid: i32,
        #[source]
        cause: Option<Box<ContainerError>>,
    },
    /// The container refused gpuhook (something mounted over its `/dev`, a symlink or a
    /// foreign node in the way, no space): the container's doing, refused with rollback.
    #[error(transparent)]
    Refused(Refusal),
    /// Finding the container, or gpuhook's own helper machinery (fork, pipe, reply, time).
    #[error(transparent)]
    Other(Failure),
}

impl ContainerError {
    pub(super) fn gone(pid: i32, cause: Option<ContainerError>) -> ContainerError {
        let cause = cause.map(Box::new);
        ContainerError::InitGone { pid, cause }
    }
}

impl From<Refusal> for ContainerError {
    fn from(r: Refusal) -> ContainerError {
        ContainerError::Refused(r)
    }
}

impl From<Failure> for ContainerError {
    fn from(f: Failure) -> ContainerError {
        ContainerError::Other(f)
    }
}

/// What the container did that gpuhook refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum Refusal {
    #[error("container /dev is the host's /dev; refusing to write there")]
    HostDev,
    #[error(
        "container /dev is not the tmpfs {} made for it (found device {}:{} inode {ino}, want {}:{} inode {}): something is mounted over /dev or /; refusing to write there",
        want.by.maker(), libc::major(*dev), libc::minor(*dev), libc::major(want.dev), libc::minor(want.dev), want.ino
    )]
    NotItsDev { dev: u64, ino: u64, want: DevTmpfs },
    /// An OCI container whose `/dev` is no mount of its own (the runtime mounts a tmpfs).
    #[error("container /dev is no mount of its own, not the tmpfs its OCI runtime mounts; refusing to write there")]
    NoDevMount,
    #[error("container /dev is {fs_type} (root {root}), not the tmpfs its OCI runtime mounts; refusing to write there")]
    NotTmpfsDev { fs_type: String, root: String },
    /// An OCI container's init is in another user or mount namespace than the one its runtime
    /// made (it unshared its own): gpuhook would act in a namespace the container chose.
    #[error("its init (pid {pid}) has left the {} namespace its runtime made; refusing to change it", kind.word())]
    LeftNamespace {
        pid: i32,
        kind: crate::enter::namespace::NsKind,
    },
    /// A node could not be made in its `/dev`.
    #[error(transparent)]
    Node(#[from] MakeNodeError),
    /// Its root refused a mount, a link, the linker cache (or the host lacks what they need).
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    /// What a test double says.
    #[cfg(test)]
    #[error("{0}")]
    Fake(String),
}

/// Why the container could not be found or worked on, other than the two above.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum Failure {
    // ---- finding it ----
    #[error("libvirt's controller has no /dev tmpfs mounted at {at}")]
    NoDevTmpfs { at: String },
    #[error(
        "libvirt's controller has {fs_type} (root {root}) at {at}, not the tmpfs it makes for /dev"
    )]
    NotDevTmpfs {
        fs_type: String,
        root: String,
        at: String,
    },
    #[error("{} {pid}: cannot read its mountinfo", by.viewer())]
    NoMountinfo { by: DevBy, pid: i32 },
    #[error("{} {pid}: {at}: {errno}", by.viewer())]
    DevStat {
        by: DevBy,
        pid: i32,
        at: String,
        #[source]
        errno: SysErr,
    },
    #[error("{} {pid}: {at} is not the tmpfs its mountinfo lists", by.viewer())]
    DevMismatch { by: DevBy, pid: i32, at: String },
    #[error("unsafe domain name {name:?}")]
    UnsafeName { name: String },
    #[error("domain XML has no id and {path} cannot be read: {error}")]
    Pidfile {
        path: String,
        #[source]
        error: IoErr,
    },
    #[error("{path} holds no PID")]
    NoPid { path: String },
    #[error("controller process {controller} does not exist")]
    NoController { controller: i32 },
    #[error("controller {controller} has no child that is PID 1 of a PID namespace (container init not running)")]
    NoInit { controller: i32 },
    #[error("controller {controller} has several container inits {pids:?}")]
    SeveralInits { controller: i32, pids: Vec<i32> },
    // ---- the helper ----
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("{path}: {errno}")]
    At {
        path: String,
        #[source]
        errno: SysErr,
    },
    #[error("container init {pid} shares the host's mount namespace; refusing")]
    SharedNamespace { pid: i32 },
    #[error("pipe: {0}")]
    Pipe(#[source] SysErr),
    #[error("fork: {0}")]
    Fork(#[source] SysErr),
    #[error("container helper did not finish within {secs}s; killed")]
    TimedOut { secs: u64 },
    #[error("reading container helper: {0}")]
    Read(#[source] PipeError),
    #[error("container helper failed: {0}")]
    HelperFailed(Waited),
    /// The reply did not decode (`error`: what serde_json said).
    #[error("container helper reply: {error}")]
    BadReply { error: String },
    #[error("unexpected reply from container helper")]
    UnexpectedReply,
    // ---- in the helper ----
    /// The job did not decode (`error`: what serde_json said).
    #[error("job: {error}")]
    BadJob { error: String },
    #[error("setns into the container's mount namespace: {0}")]
    Setns(#[source] SysErr),
    /// Acting as the container's root ([`crate::enter::rootfs::act_as`]).
    #[error(transparent)]
    Identity(#[from] RootfsError),
    #[error(transparent)]
    Caps(#[from] CapsError),
    #[error("container /: {0}")]
    Root(#[source] SysErr),
    #[error("container /dev {0}")]
    DevDir(#[source] OpenDirError),
    #[error("container /dev: {0}")]
    DevFstat(#[source] SysErr),
    /// Making the nodes a user-namespaced container gets bind mounts of (on a tmpfs of
    /// gpuhook's own, in a mount namespace of the helper's own).
    #[error("making the node {what}: {errno}")]
    OwnNode {
        what: String,
        #[source]
        errno: SysErr,
    },
    /// What a test double says.
    #[cfg(test)]
    #[error("{0}")]
    Fake(String),
}

/// A test double's refusal, as it says it.
#[cfg(test)]
impl From<&str> for Refusal {
    fn from(said: &str) -> Refusal {
        Refusal::Fake(said.into())
    }
}

/// A test double's failure, as it says it.
#[cfg(test)]
impl From<&str> for Failure {
    fn from(said: &str) -> Failure {
        Failure::Fake(said.into())
    }
}

/// A test double's cause of an init's exit, as it says it.
#[cfg(test)]
impl From<&str> for Box<ContainerError> {
    fn from(said: &str) -> Box<ContainerError> {
        Box::new(ContainerError::Other(said.into()))
    }
}
