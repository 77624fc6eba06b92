//! The one interface of a container's device cgroup ([`DeviceCgroup`]), a service manager's
//! policy beside it ([`ManagedPolicy`]), and what every backend shares: granting and revoking
//! node by node, and running the device programs in force (v2).

use super::error::{CgroupError, Fault};
use super::{bpf, interp};
use crate::leftovers::Leftovers;
use crate::node::Node;
use std::path::Path;

/// Opens cgroup directory `dir` for its BPF programs (v2).
pub(super) fn open_dir(dir: &Path) -> Result<std::os::fd::OwnedFd, CgroupError> {
    nix::fcntl::open(
        dir,
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|x| CgroupError::new(dir, Fault::Open(x.into())))
}

/// A descriptor of BPF program `id` attached to cgroup `dir` (named in the error).
pub(super) fn prog_fd(dir: &Path, id: u32) -> Result<std::os::fd::OwnedFd, CgroupError> {
    bpf::prog_get_fd_by_id(id).map_err(|x| {
        let errno = x.into();
        CgroupError::new(dir, Fault::ProgFd { id, errno })
    })
}

/// Whether every device program in force for the cgroup `dir` (open as `cg`) lets the node be
/// read and written: `BPF_F_QUERY_EFFECTIVE`, the programs attached there and to each cgroup
/// above it, each run here ([`interp::eval`]). One gpuhook cannot run gives no verdict: an
/// error.
pub(super) fn programs_allow(
    dir: &Path,
    cg: std::os::fd::BorrowedFd,
    n: &Node,
) -> Result<bool, CgroupError> {
    let e = |f: Fault| CgroupError::new(dir, f);
    let ids = bpf::prog_query(cg, bpf::BPF_CGROUP_DEVICE, bpf::BPF_F_QUERY_EFFECTIVE)
        .map_err(|x| e(Fault::ProgQueryEffective(x.into())))?;
    for id in ids {
        let prog = prog_fd(dir, id)?;
        let (insns, maps) = bpf::prog_xlated(std::os::fd::AsFd::as_fd(&prog)).map_err(|x| {
            let errno = x.into();
            e(Fault::ProgInfo { id, errno })
        })?;
        let verdict = match maps {
            0 => interp::eval(&insns, interp::DevCtx::rw_char(n.major, n.minor)),
            _ => None,
        };
        match verdict {
            Some(true) => {}
            Some(false) => return Ok(false),
            None => return Err(e(Fault::UnreadableInForce { id, maps })),
        }
    }
    Ok(true)
}

/// A cgroup whose device access gpuhook can widen by exact character devices.
pub trait DeviceCgroup {
    /// The cgroup directory (for messages).
    fn path(&self) -> &Path;
    /// Whether `rw` access to the char device is already allowed.
    fn is_allowed(&self, node: &Node) -> Result<bool, CgroupError>;
    /// Whether a rule for exactly this char device grants `rw` (a wildcard rule is evidence
    /// of nothing: it names no GPU). What `reconnect` adopts from.
    fn grants_exactly(&self, node: &Node) -> Result<bool, CgroupError>;
    /// Allows `rw` access to exactly this char device.
    fn allow(&mut self, node: &Node) -> Result<(), CgroupError>;
    /// Takes back an access this gpuhook run added.
    fn revoke(&mut self, node: &Node) -> Result<(), CgroupError>;
    /// Takes away `rw` access to exactly this char device, whoever added it (a GPU a container
    /// was granted but does not hold: `reconnect` leaves no access behind that the state does
    /// not account for).
    fn deny(&mut self, node: &Node) -> Result<(), CgroupError>;
    /// Whether its rules confine device access at all: a node they allow is then the
    /// container's own. Not a cgroup where no runtime attached a device program (crun attaches
    /// none for a container with a user namespace): every device passes it, none is the
    /// container's own.
    fn confines(&self) -> bool {
        true
    }
    /// Whether the container's processes may now read and write the node: what every rule in
    /// force for them allows, the cgroups' above included (v2: every device program from the
    /// cgroup up to the root; v1: its `devices.list`, which no child widens past its parent).
    /// What an attach checks before it says `attached`.
    fn effective(&self, node: &Node) -> Result<bool, CgroupError> {
        self.is_allowed(node)
    }
    /// Grants every node not yet allowed; returns the ones it added. On failure nothing it
    /// added is left, and the error says what a rollback could not undo.
    fn grant_missing(&mut self, nodes: &[Node]) -> Result<Vec<Node>, CgroupError> {
        grant_each(self, nodes)
    }
}

/// The device rules a service manager keeps for a container's cgroup and applies again on its
/// own ([`super::systemd::Scope`]: systemd's `DeviceAllow=` of the container's scope, put in force at
/// every change and `systemctl daemon-reload`): a grant it does not list never passes its
/// program (v2) or is taken back at the next reload (v1); an entry it keeps for a GPU taken
/// back gives that back (v1). Changed outside the state lock (it runs a program).
pub trait ManagedPolicy {
    /// What messages call it (`systemd unit libpod-ID.scope`).
    fn name(&self) -> String;
    /// Lists `rw` of exactly these nodes (those it lacks).
    fn allow(&mut self, nodes: &[Node]) -> Result<(), CgroupError>;
    /// Takes out its entries for exactly these nodes, whoever listed them.
    fn remove(&mut self, nodes: &[Node]) -> Result<(), CgroupError>;
    /// Puts its entries for these nodes back as they were when this value was made.
    fn restore(&mut self, nodes: &[Node]) -> Result<(), CgroupError>;
}

/// Grants every node not yet allowed. Returns the ones this call added (the only ones a
/// rollback may take back: access the container had before, or that another owner gave, is
/// never revoked). On failure, revokes what it added and returns the error.
pub fn grant_all(cg: &mut dyn DeviceCgroup, nodes: &[Node]) -> Result<Vec<Node>, CgroupError> {
    cg.grant_missing(nodes)
}

/// [`DeviceCgroup::grant_missing`] one node at a time.
fn grant_each<C: DeviceCgroup + ?Sized>(
    cg: &mut C,
    nodes: &[Node],
) -> Result<Vec<Node>, CgroupError> {
    let mut added = Vec::new();
    for n in nodes {
        let r = cg.is_allowed(n).and_then(|ok| {
            if ok {
                Ok(false)
            } else {
                cg.allow(n).map(|_| true)
            }
        });
        match r {
            Ok(true) => added.push(n.clone()),
            Ok(false) => {}
            Err(e) => {
                let left = revoke_all(cg, &added);
                let fault = Fault::Granting {
                    node: n.clone(),
                    fault: Box::new(e.fault),
                };
                return Err(CgroupError::new(&e.path, fault).with_left(left));
            }
        }
    }
    Ok(added)
}

/// Best-effort revoke, newest first; returns what could not be taken back, so the caller
/// can say it on its one error line.
pub fn revoke_all<C: DeviceCgroup + ?Sized>(cg: &mut C, nodes: &[Node]) -> Leftovers {
    nodes
        .iter()
        .rev()
        .filter_map(|n| cg.revoke(n).err().map(|e| e.to_string()))
        .collect()
}
