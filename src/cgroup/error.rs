//! Why work on a cgroup failed: the cgroup, and what went wrong there ([`Fault`]), with the
//! OS error it came from. A value (serde): it is said in the container helper's reply too.

use crate::host::syserr::{IoErr, SysErr};
use crate::leftovers::Leftovers;
use crate::node::Node;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("cgroup {path}: {fault}")]
pub struct CgroupError {
    pub path: PathBuf,
    pub fault: Fault,
}

impl CgroupError {
    pub fn new(path: &Path, fault: impl Into<Fault>) -> Self {
        CgroupError {
            path: path.to_path_buf(),
            fault: fault.into(),
        }
    }

    /// The same error, saying also what a rollback after it could not undo (nothing more
    /// when `left` is empty).
    pub fn with_left(self, left: Leftovers) -> Self {
        if left.is_empty() {
            return self;
        }
        CgroupError {
            path: self.path,
            fault: Fault::RollbackIncomplete {
                fault: Box::new(self.fault),
                left,
            },
        }
    }
}

/// What a bpf map operation was doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MapOp {
    Update,
    Delete,
    Revoke,
}

impl std::fmt::Display for MapOp {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(match self {
            MapOp::Update => "update",
            MapOp::Delete => "delete",
            MapOp::Revoke => "revoke",
        })
    }
}

/// What went wrong at a cgroup.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum Fault {
    #[error("cannot read: {0}")]
    Read(#[source] IoErr),
    #[error("cgroup path {cgroup} is outside the mount")]
    OutsideMount { cgroup: String },
    #[error("process has no devices cgroup (v1) nor a unified cgroup (v2)")]
    NoDeviceCgroup,
    /// Its devices controller is on no v1 hierarchy (a cgroup v2 container).
    #[error("no devices controller on a cgroup v1 hierarchy")]
    NoV1Devices,
    #[error("devices controller is not mounted")]
    DevicesNotMounted,
    #[error("no cgroup2 mount")]
    NoCgroup2,
    #[error("container init {pid} has left its cgroup: it is exiting, or its main thread exited")]
    InitLeft { pid: i32 },
    /// An OCI container's init is not in the cgroup its runtime put it in at create (its
    /// state's), nor (cgroup v2) below it: rules changed where it is now would leave the
    /// runtime's in force for the container's processes left in that one.
    #[error("container init {pid} is in cgroup {now}, not in {made} where its runtime put it{}; refusing to change its device rules", if *.below { " (cgroup v1: rules changed below it would not bind the processes left there)" } else { "" })]
    LeftItsCgroup {
        pid: i32,
        now: String,
        made: String,
        /// It is below that one (refused on v1 only).
        below: bool,
    },
    /// Where the runtime put an OCI container's init is not known: neither its
    /// `createRuntime` hook recorded it nor a runtime's state names that init.
    #[error("where its runtime put container init {pid} is not known (no record of its createRuntime hook, no runtime state under oci_state_roots that names it); refusing to change its device rules")]
    MadeUnknown { pid: i32 },
    /// A device program not systemd's below the cgroup the runtime made, on the way to the
    /// init: not the runtime's (it attaches its own where it put the init).
    #[error("{} holds a device program below the cgroup its runtime made ({made}); refusing to change the container's device rules", .dir.display())]
    ProgramBelow { dir: PathBuf, made: String },
    #[error(transparent)]
    OutsideDomain(#[from] OutsideDomain),
    /// Granting one node failed.
    #[error("granting {} ({}:{}): {fault}", node.path, node.major, node.minor)]
    Granting { node: Node, fault: Box<Fault> },
    #[error("{fault}{}", left.note())]
    RollbackIncomplete { fault: Box<Fault>, left: Leftovers },
    // ---- v1 ----
    #[error("write '{line}' to {file}: {error}")]
    Write {
        file: String,
        line: String,
        #[source]
        error: IoErr,
    },
    #[error("read devices.list: {0}")]
    ReadList(#[source] IoErr),
    #[error("list sub-cgroups: {0}")]
    ListSubCgroups(#[source] IoErr),
    // ---- v2 ----
    #[error("open: {0}")]
    Open(#[source] SysErr),
    #[error("BPF_PROG_QUERY: {0}")]
    ProgQuery(#[source] SysErr),
    #[error("BPF_PROG_QUERY (effective): {0}")]
    ProgQueryEffective(#[source] SysErr),
    #[error("BPF_PROG_GET_FD_BY_ID {id}: {errno}")]
    ProgFd {
        id: u32,
        #[source]
        errno: SysErr,
    },
    #[error("program {id} info: {errno}")]
    ProgInfo {
        id: u32,
        #[source]
        errno: SysErr,
    },
    #[error("BPF_MAP_GET_FD_BY_ID {id}: {errno}")]
    MapFd {
        id: u32,
        #[source]
        errno: SysErr,
    },
    #[error("map {id} info: {errno}")]
    MapInfo {
        id: u32,
        #[source]
        errno: SysErr,
    },
    #[error("device access is restricted by {programs} program(s) of a parent cgroup and none here to update")]
    ParentPrograms { programs: usize },
    #[error("{programs} device program(s) attached, none with libvirt's map layout (hash, u64 key, u32 value); refusing to guess")]
    NoLibvirtMap { programs: usize },
    #[error("{maps} device maps of libvirt's layout attached; refusing to guess which one rules")]
    SeveralMaps { maps: usize },
    #[error("map lookup: {0}")]
    MapLookup(#[source] SysErr),
    #[error("counting map entries: {0}")]
    MapCount(#[source] SysErr),
    #[error("libvirt's device map is full ({used} of {max} entries)")]
    MapFull { used: usize, max: u32 },
    #[error("map {op} {major}:{minor}: {errno}")]
    MapEntry {
        op: MapOp,
        major: u32,
        minor: u32,
        #[source]
        errno: SysErr,
    },
    // ---- v2, an OCI runtime's program ----
    #[error("gpuhook's lock of this cgroup ({}): {errno}", .dir.display())]
    Lock {
        dir: PathBuf,
        #[source]
        errno: SysErr,
    },
    #[error("its device program is attached with flags {flags:#x}, not BPF_F_ALLOW_MULTI as runc and crun attach theirs; refusing to replace it")]
    NotMulti { flags: u32 },
    #[error("{entries} device entries of gpuhook's in one program; at most {max}")]
    TooManyEntries { entries: usize, max: usize },
    #[error("{programs} device programs attached here, not the one of an OCI runtime; refusing to guess")]
    NotOneProgram { programs: usize },
    #[error("device program {id} is not plain code gpuhook can read ({maps} map(s), or an instruction it does not model); refusing to replace it")]
    UnreadableProgram { id: u32, maps: u32 },
    #[error("device program {id} in force for it is not plain code gpuhook can read ({maps} map(s), or an instruction it does not model): cannot tell what it lets through")]
    UnreadableInForce { id: u32, maps: u32 },
    // ---- systemd's device policy of the container's scope ----
    #[error("{unit}: {what}")]
    Systemd { unit: String, what: String },
    #[error("the device program gives no verdict gpuhook can read for {major}:{minor}")]
    UnreadableVerdict { major: u32, minor: u32 },
    #[error("BPF_PROG_LOAD of the replacement device program: {0}")]
    ProgLoad(#[source] SysErr),
    #[error("BPF_PROG_ATTACH of the replacement device program: {0}")]
    ProgAttach(#[source] SysErr),
    #[error("BPF_PROG_DETACH of the device program it replaces: {0}")]
    ProgDetach(#[source] SysErr),
    /// What a test double says.
    #[cfg(test)]
    #[error("{0}")]
    Fake(String),
}

/// A container init's cgroup that is not the one libvirt made for the container, nor below
/// it ([`super::domain_path`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("container init's cgroup {init} is outside the cgroup libvirt made for it ({domain})")]
pub struct OutsideDomain {
    pub init: String,
    pub domain: String,
}

/// What a test double's cgroup says.
#[cfg(test)]
impl From<&str> for Fault {
    fn from(said: &str) -> Fault {
        Fault::Fake(said.into())
    }
}
