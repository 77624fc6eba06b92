//! Why work in a container's root failed ([`RootfsError`]): the place, and the error it came
//! from. A value (serde): it crosses the fork in the container helper's reply.

use super::owner::Owner;
use super::paths::{LDCONFIGS, LD_CONF};
use crate::cdi::soname::ElfError;
use crate::enter::caps::CapsError;
use crate::enter::devdir::OpenDirError;
use crate::enter::sandbox::{PipeError, SandboxError, Waited};
use crate::host::syserr::{IoErr, SysErr};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum RootfsError {
    // ---- a mount's source, on the host ----
    #[error("{path}: NUL in path")]
    NulInPath { path: String },
    #[error("cannot clone {path}: {errno}")]
    Clone {
        path: String,
        #[source]
        errno: SysErr,
    },
    #[error("cannot make {path} read-only, nosuid, nodev: {errno}")]
    SetAttr {
        path: String,
        #[source]
        errno: SysErr,
    },
    #[error("{path}: {errno}")]
    SourceStat {
        path: String,
        #[source]
        errno: SysErr,
    },
    // ---- the walk in the container's root ----
    #[error("container root: {0}")]
    RootDup(#[source] IoErr),
    #[error("cannot create {path} in the container: {errno}")]
    Create {
        path: String,
        #[source]
        errno: SysErr,
    },
    #[error("container {path} {error}")]
    Walk {
        path: String,
        #[source]
        error: ComponentError,
    },
    #[error("container /{rel}: missing")]
    Missing { rel: String },
    #[error("container {path}: {errno}")]
    At {
        path: String,
        #[source]
        errno: SysErr,
    },
    #[error("container {dir}/{leaf} is a symlink; refusing to mount over it")]
    SymlinkLeaf { dir: String, leaf: String },
    // ---- acting as the container's root ----
    #[error("setgroups: {0}")]
    Setgroups(#[source] SysErr),
    #[error(transparent)]
    Caps(#[from] CapsError),
    #[error("cannot act as the container's root ({}:{}): file-system ids stayed {uid}:{gid}", want.uid, want.gid)]
    FsIds { want: Owner, uid: u32, gid: u32 },
    // ---- mounts, links, files ----
    #[error("{error} (rollback left: {left})")]
    RolledBack {
        #[source]
        error: Box<RootfsError>,
        left: crate::leftovers::Leftovers,
    },
    #[error("cannot create link {link} in the container: {errno}")]
    Link {
        link: String,
        #[source]
        errno: SysErr,
    },
    #[error("container {target} is {}; refusing to mount {src} there", kind_name(*kind))]
    Occupied {
        target: String,
        /// `S_IFMT` bits of what is there.
        kind: u32,
        src: String,
    },
    #[error("container {target} became a symlink; refusing to mount there")]
    BecameSymlink { target: String },
    #[error("cannot mount {src} at {target} in the container: {errno}")]
    Mount {
        src: String,
        target: String,
        #[source]
        errno: SysErr,
    },
    #[error("cannot write /etc/ld.so.conf.d/{conf} in the container: {0}", conf = LD_CONF)]
    WriteConf(#[source] SysErr),
    #[error("cannot write /etc/ld.so.conf in the container: {0}")]
    WriteLdSoConf(#[source] SysErr),
    // ---- the host's ldconfig ----
    #[error("no ldconfig on the host (looked at {})", LDCONFIGS.join(", "))]
    NoLdconfig,
    #[error("{path}: {error}")]
    LdconfigOpen {
        path: String,
        #[source]
        error: IoErr,
    },
    /// Its ELF headers could not be read.
    #[error("{path}: {error}")]
    LdconfigElf {
        path: String,
        #[source]
        error: ElfRead,
    },
    #[error("the host's {path} is dynamically linked: run inside a container it would load the container's libraries; gpuhook needs a static ldconfig")]
    LdconfigDynamic { path: String },
    #[error("{path}: {error}")]
    LdconfigCopy {
        path: String,
        #[source]
        error: SandboxError,
    },
    // ---- running it over the container's root ----
    #[error("NUL in a folder")]
    NulInFolder,
    #[error(transparent)]
    Filter(SandboxError),
    #[error("pipe: {0}")]
    LdconfigPipe(#[source] SysErr),
    #[error("fork: {0}")]
    LdconfigFork(#[source] SysErr),
    #[error("ldconfig in the container did not finish within {secs}s; killed")]
    LdconfigTimedOut { secs: u64 },
    #[error("reading ldconfig's output: {0}")]
    LdconfigRead(#[source] PipeError),
    /// `said`: the first line of what it (or its first child) wrote.
    #[error(
        "ldconfig in the container failed ({}){}",
        ended(status),
        said_text(said)
    )]
    LdconfigFailed { status: Waited, said: String },
    #[error("container {path} is not a directory; refusing to run ldconfig (it would write its auxiliary cache through it)")]
    AuxCacheNotDir { path: String },
}

/// Why the host `ldconfig`'s ELF headers could not be read: [`ElfError`] as a value (it
/// crosses the fork), each reading as the reader says it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ElfRead {
    #[error("{0}")]
    Io(#[source] IoErr),
    #[error("{}", ElfError::NotElf64)]
    NotElf64,
    #[error("{}", ElfError::HeaderSize)]
    HeaderSize,
    #[error("{}", ElfError::TooManyHeaders)]
    TooManyHeaders,
}

impl From<ElfError> for ElfRead {
    fn from(e: ElfError) -> ElfRead {
        match e {
            ElfError::Io(e) => ElfRead::Io(e.into()),
            ElfError::NotElf64 => ElfRead::NotElf64,
            ElfError::HeaderSize => ElfRead::HeaderSize,
            ElfError::TooManyHeaders => ElfRead::TooManyHeaders,
        }
    }
}

/// Why a directory on a walk could not be opened: the directory itself, or, behind a
/// merged-`/usr` top-level link, `/usr` or the directory under it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ComponentError {
    #[error(transparent)]
    Dir(#[from] OpenDirError),
    #[error("(/usr {0})")]
    Usr(#[source] OpenDirError),
    #[error("(/usr/{name} {error})")]
    UsrDir {
        name: String,
        #[source]
        error: OpenDirError,
    },
}

/// What kind of thing is at a mount's place, for messages.
fn kind_name(kind: u32) -> &'static str {
    match kind {
        libc::S_IFLNK => "a symlink",
        libc::S_IFDIR => "a directory",
        libc::S_IFREG => "a file",
        _ => "a special file",
    }
}

/// How `ldconfig` ended: `exit N`, else the wait's result.
fn ended(status: &Waited) -> String {
    match status {
        Waited::Exited { code, .. } => format!("exit {code}"),
        o => o.to_string(),
    }
}

fn said_text(said: &str) -> String {
    if said.is_empty() {
        String::new()
    } else {
        format!(": {said}")
    }
}
