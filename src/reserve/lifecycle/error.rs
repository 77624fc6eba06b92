//! The lifecycle steps' own refusals and failures: one line each, naming the unit, the holder's
//! id or the process, and the cause.

use crate::cgroup::CgroupError;
use crate::enter::container::ContainerError;
use crate::ids::Unit;
use crate::leftovers::Leftovers;
use crate::request::DeviceSel;
use crate::reserve::state::{Node, Phase};
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// A container created with a pod's allocation (`gpuhook.io/allocation`).
    #[error(transparent)]
    Pod(#[from] PodCreateError),
    /// The choice kept naming units the inventory then found unusable (a bound on the
    /// retries, so that a disagreement never spins under the state lock).
    #[error("cannot settle on GPUs: {units} kept turning out unusable; nothing reserved")]
    Unsettled { units: String },
    #[error("holds no GPU reservation (did the prepare hook run? is gpuhook installed at libvirtd's start?)")]
    NoReservation,
    #[error("holds no GPU reservation made by this create (was it released or reclaimed?)")]
    NotThisCreate,
    #[error("reserved GPU {unit} is no longer on the host")]
    UnitGone { unit: Unit },
    /// `why`: the inventory's problem with the GPU.
    #[error("reserved GPU {unit} cannot be used: {why}")]
    UnitUnusable { unit: Unit, why: String },
    #[error("reserved GPU {unit} is now excluded by the host config")]
    UnitExcluded { unit: Unit },
    #[error("reserved MIG instance {unit} no longer exists")]
    MigGone { unit: Unit },
    #[error("GPU {unit} has no device node: {}", why.as_deref().unwrap_or("unknown"))]
    NoDeviceNode { unit: Unit, why: Option<String> },
    #[error("cannot read this process's own start time")]
    OwnStartTime,
    /// `gpuhook release` of a holder whose container runs: its access would outlive the
    /// reservation.
    #[error(
        "{who} still runs (init {init}) with GPUs {}: release frees only what no running container holds; stop it{}",
        Unit::join(gpus, ","),
        detach.as_ref().map_or(String::new(), |d| format!(", or take its GPUs back with '{d}'"))
    )]
    StillRuns {
        who: String,
        init: i32,
        gpus: Vec<Unit>,
        detach: Option<String>,
    },
    #[error("its id {id} is already the key of {holder}'s reservation")]
    KeyOfAnother { id: String, holder: String },
    #[error(
        "a container with this ID already runs with GPUs {} (init {init})",
        Unit::join(gpus, ",")
    )]
    AlreadyRuns { gpus: Vec<Unit>, init: i32 },
    #[error(
        "another create of this container ID holds GPUs {} (runtime pid {pid})",
        Unit::join(gpus, ",")
    )]
    AnotherCreate { gpus: Vec<Unit>, pid: i32 },
    #[error("GPU reservation was released while the container started")]
    ReleasedWhileStarting,
    #[error("GPU reservation changed while the container started")]
    ChangedWhileStarting,
    /// The container helper said the init is gone (with what it saw, if anything).
    #[error("container init {pid} exited during started{}", in_parens(cause))]
    InitExited {
        pid: i32,
        cause: Option<Box<ContainerError>>,
    },
    #[error("it uses GPU {unit}, which is reserved by {holder}")]
    UsedByAnother { unit: Unit, holder: String },
    #[error("it uses MIG instance {unit}, whose GPU instance gi {gi} is reserved by {holder} (through {through})")]
    GpuInstanceShared {
        unit: Unit,
        gi: u32,
        holder: String,
        through: String,
    },
    /// `attach` to a holder whose reservation is not yet running (between `prepare` and
    /// `started`, or an OCI `create` before its init).
    #[error(
        "its GPU reservation is prepared but not running: attach gives GPUs to a running container"
    )]
    AttachPrepared,
    /// `attach`: the reservation records another init than the container found (it
    /// restarted, or the record is stale).
    #[error(
        "its GPU reservation records container init {}, but its init now is {found}: not the running container (did reconnect run?)",
        recorded.map_or("none".to_string(), |p| p.to_string())
    )]
    AttachOtherInit { recorded: Option<i32>, found: i32 },
    /// A CDI mount's source could not be read on the host (to record it before it is made).
    #[error("CDI mount source {path}: {source}")]
    MountSource {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "GPU reservation was released or changed while GPUs {} were attached",
        Unit::join(units, ",")
    )]
    ChangedWhileAttaching { units: Vec<Unit> },
    #[error("its device cgroup grants GPU(s) {} it does not hold, and that access cannot be taken away: {source}", Unit::join(gpus, ","))]
    CannotDeny {
        gpus: Vec<Unit>,
        #[source]
        source: CgroupError,
    },
    /// `attach`: after the grant, a device rule in force for the container's cgroup still
    /// refuses a node (a program of a cgroup above it, a manager's policy that did not take
    /// the new entry).
    #[error(
        "cgroup {}: {} ({}:{}) is still refused by a device rule in force for the container after the grant{}",
        path.display(),
        node.path,
        node.major,
        node.minor,
        by.as_ref().map_or(String::new(), |b| format!(" (its {b} was told)"))
    )]
    NotInForce {
        path: PathBuf,
        node: Node,
        by: Option<String>,
    },
    /// `detach` took the units back, but the service manager's device policy could not be set
    /// to match (an entry of a unit it kept not put back).
    #[error("detached GPU(s) {} (their grants taken back), but the device policy of its scope could not be updated to match: {left}", Unit::join(units, ","))]
    PolicyNotUpdated { units: Vec<Unit>, left: Leftovers },
    /// The host's `/dev/char` entry of a node handed to systemd leads elsewhere.
    #[error(transparent)]
    CharLink {
        #[from]
        source: crate::host::charlink::CharLinkError,
    },
    #[error("holds no GPU to detach")]
    NothingToDetach,
    #[error("is not running (its GPU reservation is {}): nothing to detach from", phase_word(*phase))]
    NotRunning { phase: Phase },
    #[error("its GPU reservation is not for the container that runs now (init {init}): is it restarting?")]
    NotThisInit { init: i32 },
    #[error("{sel} names no GPU it holds (it holds {})", Unit::join(held, ","))]
    NotHeld { sel: DeviceSel, held: Vec<Unit> },
    /// A process of the container (PID, its command) has one of the unit's own nodes open.
    #[error("GPU {unit} is open in the container: process {pid} ({comm}){}; close it or detach with --force", more(*others))]
    OpenInContainer {
        unit: Unit,
        pid: i32,
        comm: String,
        others: usize,
    },
    /// The look at the container's processes did not read them all in time.
    #[error("cannot tell whether GPU(s) {} are open in the container: {unread} of its processes could not be read in time; try again, or detach with --force", Unit::join(units, ","))]
    MaybeOpen { units: Vec<Unit>, unread: usize },
    #[error("cannot tell which processes are the container's (the PID namespace of its init {init} cannot be read), so whether its GPUs are open; detach with --force to go ahead")]
    NamespaceUnknown { init: i32 },
    #[error("GPU reservation changed while detaching; try again")]
    ChangedWhileDetaching,
    /// Grants that could not be taken back (`left`): their units stay reserved.
    #[error(
        "the device-cgroup grants of GPU(s) {} cannot be taken back ({left}): they stay reserved{}",
        Unit::join(kept, ","),
        detached_too(detached)
    )]
    CannotRevoke {
        kept: Vec<Unit>,
        detached: Vec<Unit>,
        left: Leftovers,
    },
    /// A deny that took nothing away: another rule of the container's cgroup (a wildcard such
    /// as `c 195:* rwm`) still allows the node.
    #[error(
        "cgroup {}: {} ({}:{}) is still allowed by another rule of the container's cgroup",
        path.display(),
        node.path,
        node.major,
        node.minor
    )]
    StillAllowed { path: PathBuf, node: Node },
    #[error("detached GPU(s) {} (their grants taken back), but the CDI driver files only they needed could not be taken out of the container's root: {source}", Unit::join(units, ","))]
    DriverFilesNotRemoved {
        units: Vec<Unit>,
        #[source]
        source: Box<ContainerError>,
    },
    #[error("detached GPU(s) {} (their grants taken back), but of the CDI driver files only they needed some are left in the container's root: {left}", Unit::join(units, ","))]
    DriverFilesLeft { units: Vec<Unit>, left: Leftovers },
    /// `attach` with another driver user space than the container got already.
    #[error("its driver files came from {had}; attach --driver {asked} would mix two sets of them (attach with --driver {had}, or restart it with driver {asked})", had = had.as_str(), asked = asked.as_str())]
    DriverMix {
        had: crate::request::Driver,
        asked: crate::request::Driver,
    },
    /// `attach` of the new driver's files to a container that has the old driver's.
    #[error("its driver files are of NVIDIA driver {old}, the host runs {new} now: attaching would mix two drivers' files; restart the container to get {new}")]
    DriverOutdated { old: String, new: String },
    #[error("detached GPU(s) {} (their grants taken back), but their nodes could not be removed from the container's /dev: {source}", Unit::join(units, ","))]
    NodesNotRemoved {
        units: Vec<Unit>,
        #[source]
        source: Box<ContainerError>,
    },
}

/// How a reservation's phase is named (as the state file writes it).
fn phase_word(p: Phase) -> &'static str {
    match p {
        Phase::Prepared => "prepared",
        Phase::Running => "running",
    }
}

/// ` and N more processes`, or nothing.
fn more(others: usize) -> String {
    match others {
        0 => String::new(),
        1 => " and 1 more process".into(),
        n => format!(" and {n} more processes"),
    }
}

/// `; GPU(s) … detached`, or nothing.
fn detached_too(units: &[Unit]) -> String {
    if units.is_empty() {
        String::new()
    } else {
        format!("; GPU(s) {} detached", Unit::join(units, ","))
    }
}

/// ` (CAUSE)`, or nothing.
fn in_parens(cause: &Option<Box<ContainerError>>) -> String {
    cause
        .as_ref()
        .map(|c| format!(" ({c})"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reserve::error::Error;

    /// The words are the product's: as they were when each was built in place.
    #[test]
    fn messages_read_as_before() {
        let unit = |s: &str| s.parse::<Unit>().expect("unit");
        let gpus = vec![unit("0000:3b:00.0"), unit("0000:3c:00.0/gi1/ci0")];
        let cases: [(LifecycleError, &str); 7] = [
            (
                LifecycleError::NoDeviceNode {
                    unit: unit("0000:3b:00.0"),
                    why: None,
                },
                "GPU 0000:3b:00.0 has no device node: unknown",
            ),
            (
                LifecycleError::NoDeviceNode {
                    unit: unit("0000:3b:00.0"),
                    why: Some("unbound".into()),
                },
                "GPU 0000:3b:00.0 has no device node: unbound",
            ),
            (
                LifecycleError::AlreadyRuns {
                    gpus: gpus.clone(),
                    init: 42,
                },
                "a container with this ID already runs with GPUs 0000:3b:00.0,0000:3c:00.0/gi1/ci0 (init 42)",
            ),
            (
                LifecycleError::AnotherCreate {
                    gpus: gpus.clone(),
                    pid: 7,
                },
                "another create of this container ID holds GPUs 0000:3b:00.0,0000:3c:00.0/gi1/ci0 (runtime pid 7)",
            ),
            (
                LifecycleError::InitExited {
                    pid: 9,
                    cause: None,
                },
                "container init 9 exited during started",
            ),
            (
                LifecycleError::InitExited {
                    pid: 9,
                    cause: Some("reaped".into()),
                },
                "container init 9 exited during started (reaped)",
            ),
            (
                LifecycleError::CannotDeny {
                    gpus,
                    source: CgroupError::new(std::path::Path::new("/sys/fs/cgroup/x"), "EPERM"),
                },
                "its device cgroup grants GPU(s) 0000:3b:00.0,0000:3c:00.0/gi1/ci0 it does not hold, and that access cannot be taken away: cgroup /sys/fs/cgroup/x: EPERM",
            ),
        ];
        for (e, want) in cases {
            assert_eq!(Error::from(e).to_string(), want);
        }
        let after = Error::InitExitedAfter {
            pid: 9,
            error: Box::new(LifecycleError::ChangedWhileStarting.into()),
        };
        assert_eq!(
            after.to_string(),
            "container init 9 exited during started (GPU reservation changed while the container started)"
        );
    }
}

/// Why a container cannot have the allocation its annotation names.
#[derive(Debug, thiserror::Error)]
pub enum PodCreateError {
    #[error("gpuhook.io/allocation '{alloc}' names no allocation of this node's pool (kubelet's device plugin made none, or it was freed)")]
    NoAllocation { alloc: String },
    #[error("gpuhook.io/allocation '{alloc}' is not an allocation ID (32 hex digits)")]
    NotAnId { alloc: String },
    #[error("gpuhook.io/allocation needs a Kubernetes pod's container (its CRI sandbox annotations are missing)")]
    NotPodContainer,
    /// The allocation is another pod's (`theirs`: how the allocation names it; `ours`: the
    /// container's pod).
    #[error(
        "gpuhook.io/allocation '{alloc}' belongs to {theirs}, not to this container's pod {ours}"
    )]
    AnotherPod {
        alloc: String,
        theirs: String,
        ours: String,
    },
    #[error("gpuhook.io/allocation '{alloc}' is held by container {container}, which still runs or is being created")]
    InUse { alloc: String, container: String },
    #[error("gpuhook.io/allocation '{alloc}' holds GPU {unit}, which cannot be used now: {why}")]
    Unusable {
        alloc: String,
        unit: Unit,
        why: String,
    },
}
