//! `gpuhook detach`: GPUs (or MIG instances) taken back from a running container. The units
//! are resolved among those its reservation holds; a process of the container that has one
//! of their own nodes open refuses it (unless forced); then, in one step under the state
//! lock, their grants are taken back from its device cgroup and only then are they freed (a
//! unit whose grant could not be taken back, or whose node another rule of the cgroup still
//! allows after the deny, stays reserved); last their nodes leave its `/dev`. A unit a process (anywhere) still has open is draining, as after every free.
//!
//! Under systemd's cgroup manager the scope's device policy loses the entries of exactly the
//! nodes taken back before the locked step (outside the state lock), so that no `systemctl
//! daemon-reload` gives back a freed GPU; those of nodes the step keeps granted go back after
//! it, all of them when it is refused, and when that change fails (its read-back too). The
//! step takes back only nodes whose entries left the list: a record that changed meanwhile
//! so that it would take back another refuses the detach. In a user-namespaced container the nodes are mounts:
//! taken off while they are the ones gpuhook recorded.
//!
//! The CDI driver files gpuhook put in its root (at `started` or `attach`) go with the last
//! unit that needs them: those the CDI specs give the units it keeps stay (a spec that cannot
//! be read now keeps them all while any unit stays); the rest leave the record in the same
//! locked step and are then taken out of its root, each only while it is still what gpuhook
//! made.

use super::driver_files::{driver_needed, take_files};
use super::error::LifecycleError;
use super::free::drain_freed;
use super::holder::Holder;
use super::nodes::root_owner;
use crate::cgroup::{DeviceCgroup, ManagedPolicy};
use crate::enter::container::{Container, ContainerError};
use crate::enter::devdir::Bound;
use crate::enter::rootfs::Done;
use crate::host::inventory::{Inventory, Scan};
use crate::host::procfs::{Budget, ProcRef};
use crate::ids::Unit;
use crate::leftovers::Leftovers;
use crate::log;
use crate::node::NodeSpec;
use crate::request::{Capabilities, DeviceSel};
use crate::reserve::alloc;
use crate::reserve::drain;
use crate::reserve::error::Error;
use crate::reserve::state::Store;
use crate::reserve::state::{now_rfc3339, Blocked, Node, Phase, Reservation, State, Transition};
use crate::reserve::world::World;
use std::collections::BTreeSet;

/// Which of its units a container gives back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Which {
    /// The GPUs these select (PCI address, UUID, index: every unit it holds of that GPU);
    /// a [`DeviceSel::Pci`] that is a MIG unit's name (`PCI/giN/ciM`) selects that instance.
    Units(Vec<DeviceSel>),
    /// Every unit it holds.
    All,
}

/// What a detach did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Detached {
    /// The units taken back and freed.
    pub units: Vec<Unit>,
    /// With `force`: the detached units a process of the container had open, and those
    /// processes (they keep their open files).
    pub kept_open: Vec<(Unit, Vec<ProcRef>)>,
    /// The detached units a process still has open: draining, given to no one until closed.
    pub draining: Vec<Unit>,
}

/// Every node a unit can come with, whatever capabilities its request named: what a
/// remaining unit may need is never taken away.
const EVERY: Capabilities = Capabilities {
    compute: true,
    utility: true,
    graphics: true,
    video: true,
};

/// Takes `which` of its units back from the holder's running container (found by `find`):
/// refused, nothing changed, when it is not running with this init, a selector names no
/// unit it holds, or (without `force`) a process of the container has one of their own
/// nodes open or might have; then grants taken back, units freed, nodes removed.
pub fn detach(
    f: &World,
    h: &Holder,
    which: &Which,
    force: bool,
    find: impl FnOnce() -> Result<Container, ContainerError>,
) -> Result<Detached, Error> {
    let ct = find()?;
    let st = Store::new(&f.cfg.state_file).read()?;
    let r = running(st.reservations.get(&h.key), &ct)?;
    let mut inv = (f.scan)(f.cfg, scan_for(which))?;
    inv.settle(f.cfg, &r.gpus);
    let units = resolve(&inv, r, which)?;
    let open = open_in_container(f, &inv, &st, h, &units, &ct, force)?;
    let needed = driver_needed(f, h, &inv, &st, r, &units);
    // The scope's device policy where systemd keeps one loses the entries of the nodes about
    // to be taken back first (outside the state lock: it runs `systemctl`), so that no
    // reload gives back a GPU once it is free; those the locked step keeps go back after it.
    let planned: Vec<Node> = plan(&inv, r, &units).into_iter().map(|(n, _)| n).collect();
    let mut policy = untold(f, &ct, &planned)?;
    let mut cg = match (f.cgroup)(f.cfg, &ct) {
        Ok(c) => c,
        Err(e) => return Err(retold(&mut policy, &planned, e.into())),
    };
    let now = now_rfc3339();
    let mut stops = Vec::new();
    let locked = Store::new(&f.cfg.state_file).update(|st| -> Result<_, Error> {
        let r = st.reservations.get_mut(&h.key);
        running(r.as_deref(), &ct)?;
        let r = r.ok_or(LifecycleError::ChangedWhileDetaching)?;
        if !units.iter().all(|u| r.gpus.contains(u)) {
            return Err(LifecycleError::ChangedWhileDetaching.into());
        }
        let revoked = revoke(&mut *cg, as_planned(plan(&inv, r, &units), &planned)?);
        let freed: Vec<Unit> = units
            .iter()
            .filter(|u| !revoked.kept.contains(u))
            .copied()
            .collect();
        if !freed.is_empty() || !revoked.denied.is_empty() {
            r.gpus.retain(|u| !freed.contains(u));
            r.nodes.retain(|n| !revoked.denied.contains(n));
            r.hotplugged = true;
            r.updated = now;
        }
        // The driver files only these units needed, once they all are freed.
        let files = match revoked.kept.is_empty() {
            true => take_files(r, &needed),
            false => Done::default(),
        };
        // The nodes bound into a user-namespaced container that go, by identity.
        let bound = take_bound(r, &revoked.denied);
        // The last of its recorded driver files taken out: nothing of a driver to be out of
        // date. (An OCI container's files from its create are its runtime's mounts: never
        // recorded, never taken.)
        let took = !files.mounted.is_empty() || !files.links.is_empty();
        if took && !super::attach::has_driver_files(r) {
            (r.driver, r.driver_version) = (None, None);
        }
        let gone = Reservation {
            gpus: freed.clone(),
            ..r.clone()
        };
        let settled = drain_freed(f, st, &[(gone, ())]);
        // A daemon left without sharers by this detach is marked to stop (told to quit
        // after the lock).
        let s = crate::reserve::mps::stop_unused(f.cfg, f.mps, f.proc, st);
        s.notes.iter().for_each(|n| crate::log::info(n));
        stops = s.marked;
        let draining = settled.draining.into_iter().map(|(u, _)| u).collect();
        Ok((freed, revoked, draining, files, bound))
    });
    drop(cg);
    let (freed, revoked, draining, files, bound) = match locked {
        Ok(x) => x,
        Err(e) => return Err(retold(&mut policy, &planned, e)),
    };
    for n in crate::reserve::mps::finish_stops(f.cfg, f.mps, f.proc, stops) {
        crate::log::info(&n);
    }
    let policy_left = policy_after(&mut policy, &planned, &revoked.denied);
    let out = Detached {
        kept_open: open
            .into_iter()
            .filter(|(u, _)| freed.contains(u))
            .collect(),
        units: freed,
        draining,
    };
    log_detached(f, h, &out);
    let out = finish(f, h, &ct, out, revoked, &files, &bound)?;
    if !policy_left.is_empty() {
        return Err(LifecycleError::PolicyNotUpdated {
            units: out.units,
            left: policy_left,
        }
        .into());
    }
    Ok(out)
}

/// The service manager's device policy of the container's cgroup (systemd's scope), where it
/// keeps one, without entries for `nodes`. Once the change was tried, whatever came back, the
/// list may lack them while the container still holds them: on failure they are put back
/// (what could not be is said with the error; nothing is freed).
fn untold(
    f: &World,
    ct: &Container,
    nodes: &[Node],
) -> Result<Option<Box<dyn ManagedPolicy>>, Error> {
    if nodes.is_empty() {
        return Ok(None);
    }
    let mut policy = (f.manager)(f.cfg, ct)?;
    if let Some(p) = &mut policy {
        if let Err(e) = p.remove(nodes) {
            return Err(retold(&mut policy, nodes, e.into()));
        }
    }
    Ok(policy)
}

/// After the locked step: the entries of nodes still granted go back to the scope's policy
/// (the step took back only nodes whose entries had left it: [`untold`]). Returns what could
/// not be told.
fn policy_after(
    policy: &mut Option<Box<dyn ManagedPolicy>>,
    planned: &[Node],
    denied: &[Node],
) -> Leftovers {
    let kept: Vec<Node> = planned
        .iter()
        .filter(|n| !denied.contains(n))
        .cloned()
        .collect();
    let mut left = Leftovers::default();
    if let Some(p) = policy {
        if !kept.is_empty() {
            if let Err(e) = p.restore(&kept) {
                left.push(format_args!("{}: {e}", p.name()));
            }
        }
    }
    left
}

/// The error `e` of a detach that took nothing, after the manager's entries for `nodes` are
/// put back (what could not be is said with it).
fn retold(policy: &mut Option<Box<dyn ManagedPolicy>>, nodes: &[Node], e: Error) -> Error {
    let mut left = Leftovers::default();
    if let Some(p) = policy {
        if let Err(x) = p.restore(nodes) {
            left.push(format_args!("{}: {x}", p.name()));
        }
    }
    super::activate::with_rollback(e, left)
}

/// The plan of the locked step, when it takes back only nodes whose entries left the scope's
/// list before (`planned`): one the record added meanwhile (another detach freed what kept it)
/// could leave the list only after the free, and a reload would give it back until then.
fn as_planned(
    plan: Vec<(Node, Vec<Unit>)>,
    planned: &[Node],
) -> Result<Vec<(Node, Vec<Unit>)>, Error> {
    if plan.iter().any(|(n, _)| !planned.contains(n)) {
        return Err(LifecycleError::ChangedWhileDetaching.into());
    }
    Ok(plan)
}

/// Takes out of `r`'s record the bind-mounted nodes at the paths of `denied`.
fn take_bound(r: &mut Reservation, denied: &[Node]) -> Vec<Bound> {
    let (gone, keep) = std::mem::take(&mut r.node_mounts)
        .into_iter()
        .partition(|b| denied.iter().any(|n| n.path == b.path));
    r.node_mounts = keep;
    gone
}

/// The holder's reservation, when it is running with this container's init.
fn running<'r>(r: Option<&'r Reservation>, ct: &Container) -> Result<&'r Reservation, Error> {
    let r = r.filter(|r| !r.gpus.is_empty());
    // Whether its init lives does not matter here: it must be this container's.
    let found = r.map(|r| r.found(|_| true, None));
    match Transition::Detach.from(found) {
        Err(Blocked::NotRunning) => {
            let phase = found.map_or(Phase::Prepared, |f| f.phase);
            return Err(LifecycleError::NotRunning { phase }.into());
        }
        Err(_) => return Err(LifecycleError::NothingToDetach.into()),
        Ok(_) => {}
    }
    let r = r.ok_or(LifecycleError::NothingToDetach)?;
    if r.init != Some(ct.init) {
        return Err(LifecycleError::NotThisInit { init: ct.init.pid }.into());
    }
    Ok(r)
}

/// What of the host the selectors need: every node of every GPU (a unit's nodes are taken
/// back whatever capabilities gave them); all GPUs looked at for an index, the driver's
/// details for a UUID.
fn scan_for(which: &Which) -> Scan {
    let by_place = match which {
        Which::All => false,
        Which::Units(sels) => sels
            .iter()
            .any(|s| matches!(s, DeviceSel::Uuid(_) | DeviceSel::Index(_))),
    };
    Scan {
        caps: None,
        lazy: !by_place,
    }
}

/// The units `which` names among those `r` holds, in its order; a selector that names none
/// of them is refused.
fn resolve(inv: &Inventory, r: &Reservation, which: &Which) -> Result<Vec<Unit>, Error> {
    let sels = match which {
        Which::All => return Ok(r.gpus.clone()),
        Which::Units(sels) => sels,
    };
    let mut named = BTreeSet::new();
    for sel in sels {
        let unit = match sel {
            DeviceSel::Pci(s) => s.parse::<Unit>().ok(),
            _ => None,
        };
        let unit = unit.or_else(|| alloc::resolve(&inv.gpus, sel).map(|g| Unit::Gpu(g.pci)));
        let of: Vec<Unit> = r
            .gpus
            .iter()
            .filter(|u| match unit {
                Some(Unit::Gpu(p)) => u.pci() == p,
                Some(m) => **u == m,
                None => false,
            })
            .copied()
            .collect();
        if of.is_empty() {
            return Err(LifecycleError::NotHeld {
                sel: sel.clone(),
                held: r.gpus.clone(),
            }
            .into());
        }
        named.extend(of);
    }
    if named.is_empty() {
        return Err(LifecycleError::NothingToDetach.into());
    }
    Ok(r.gpus
        .iter()
        .filter(|u| named.contains(u))
        .copied()
        .collect())
}

fn number(n: &Node) -> u64 {
    libc::makedev(n.major, n.minor)
}

/// The units (of `units`) whose own nodes a process of the container (one in its init's PID
/// namespace) has open, with those processes. Without `force`, any such process refuses
/// the detach (naming it), and so does a look that could not read every process in time.
fn open_in_container(
    f: &World,
    inv: &Inventory,
    st: &State,
    h: &Holder,
    units: &[Unit],
    ct: &Container,
    force: bool,
) -> Result<Vec<(Unit, Vec<ProcRef>)>, Error> {
    // Own nodes as a free sees them: with the state as this detach leaves it (a GPU
    // instance another of its instances still uses is not this unit's alone).
    let mut after = st.clone();
    let Some(r) = after.reservations.get_mut(&h.key) else {
        return Ok(Vec::new());
    };
    r.gpus.retain(|u| !units.contains(u));
    let gone = Reservation {
        gpus: units.to_vec(),
        ..r.clone()
    };
    let mut own = drain::freed_units(inv, &after, &[gone]);
    // A slot of a GPU other sharers keep: not draining when freed (their processes have it
    // open by design), but this container's own processes must have let go of it, as of a
    // whole GPU (the look below is within the container's PID namespace).
    for u in units.iter().filter(|u| u.is_slot()) {
        if own.iter().any(|f| f.unit.pci() == u.pci()) {
            continue;
        }
        if let Some(g) = inv.by_unit(u) {
            own.push(drain::FreedUnit {
                unit: *u,
                nodes: g.own_nodes(),
                after: h.who(),
            });
        }
    }
    let wanted: BTreeSet<u64> = own.iter().flat_map(|u| &u.nodes).map(number).collect();
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let Some(ns) = f.proc.pid_ns(ct.init.pid) else {
        return if force {
            Ok(Vec::new())
        } else {
            Err(LifecycleError::NamespaceUnknown { init: ct.init.pid }.into())
        };
    };
    let me = f.me;
    let in_ct = |p: i32| p != me && f.proc.pid_ns(p) == Some(ns);
    let found = f.proc.openers(&wanted, in_ct, &Budget::new(drain::BUDGET));
    let open: Vec<(Unit, Vec<ProcRef>)> = own
        .iter()
        .filter_map(|u| {
            let procs: BTreeSet<ProcRef> = u
                .nodes
                .iter()
                .filter_map(|n| found.openers.get(&number(n)))
                .flatten()
                .copied()
                .collect();
            (!procs.is_empty()).then(|| (u.unit, procs.into_iter().collect()))
        })
        .collect();
    if force {
        return Ok(open);
    }
    if let Some((unit, procs)) = open.first() {
        return Err(LifecycleError::OpenInContainer {
            unit: *unit,
            pid: procs[0].pid,
            comm: f.proc.comm(procs[0].pid).unwrap_or_else(|| "?".into()),
            others: procs.len() - 1,
        }
        .into());
    }
    if !found.complete() {
        return Err(LifecycleError::MaybeOpen {
            units: units.to_vec(),
            unread: found.unread_total,
        }
        .into());
    }
    Ok(open)
}

/// The nodes recorded for `r` that only `units` need, each with the units that need it
/// (fewest first): a whole GPU's own nodes; a MIG instance's compute-instance capability,
/// its GPU instance's unless another instance of it stays, its GPU's node unless another
/// instance of that GPU stays; the control nodes once no unit of their vendor stays. When
/// no unit stays, every recorded node (a CDI spec's too). Never a node not recorded: what
/// the container had of its own is not gpuhook's to take.
fn plan(inv: &Inventory, r: &Reservation, units: &[Unit]) -> Vec<(Node, Vec<Unit>)> {
    let stay: Vec<Unit> = r
        .gpus
        .iter()
        .filter(|u| !units.contains(u))
        .copied()
        .collect();
    let needed: BTreeSet<u64> = inv
        .nodes_for(&stay, EVERY)
        .iter()
        .map(|n| number(n))
        .collect();
    let own: Vec<(Unit, BTreeSet<u64>)> = units
        .iter()
        .map(|u| {
            (
                *u,
                inv.nodes_for(&[*u], EVERY)
                    .iter()
                    .map(|n| number(n))
                    .collect(),
            )
        })
        .collect();
    let mut out: Vec<(Node, Vec<Unit>)> = r
        .nodes
        .iter()
        .filter(|n| !needed.contains(&number(n)))
        .filter_map(|n| {
            let by: Vec<Unit> = own
                .iter()
                .filter(|(_, nums)| nums.contains(&number(n)))
                .map(|(u, _)| *u)
                .collect();
            match (by.is_empty(), stay.is_empty()) {
                (false, _) => Some((n.clone(), by)),
                (true, true) => Some((n.clone(), units.to_vec())),
                (true, false) => None,
            }
        })
        .collect();
    out.sort_by_key(|(_, by)| by.len());
    out
}

/// What taking the grants back did.
#[derive(Debug, Default)]
struct Revoked {
    /// The nodes no longer granted.
    denied: Vec<Node>,
    /// The units a grant of which could not be taken back: they stay reserved.
    kept: Vec<Unit>,
    left: Leftovers,
}

/// Takes back each planned grant (whoever added it: an earlier run did); a node that a unit
/// already kept needs is left granted. A deny counts only once the cgroup no longer allows
/// the node: a wildcard rule (`c 195:* rwm`) makes v1's deny of an exact rule a no-op.
fn revoke(cg: &mut dyn DeviceCgroup, plan: Vec<(Node, Vec<Unit>)>) -> Revoked {
    let mut out = Revoked::default();
    for (n, by) in plan {
        if by.iter().any(|u| out.kept.contains(u)) {
            continue;
        }
        match cg.deny(&n).map_err(Error::from).and_then(|()| gone(cg, &n)) {
            Ok(()) => out.denied.push(n),
            Err(e) => {
                out.left.push(e);
                // None of them is kept yet (else this node was left granted above).
                out.kept.extend(by);
            }
        }
    }
    out
}

/// Whether the cgroup now refuses the node: one another rule still allows is an error.
fn gone(cg: &dyn DeviceCgroup, n: &Node) -> Result<(), Error> {
    if cg.is_allowed(n)? {
        return Err(LifecycleError::StillAllowed {
            path: cg.path().to_path_buf(),
            node: n.clone(),
        }
        .into());
    }
    Ok(())
}

/// Logs the detach: holder, id, units, the uid that asked, the processes that keep a
/// detached unit open.
fn log_detached(f: &World, h: &Holder, d: &Detached) {
    if d.units.is_empty() {
        return;
    }
    log::info(&format!(
        "{}: detached {} (asked by uid {})",
        h.id.who_exactly(),
        Unit::join(&d.units, ","),
        f.uid
    ));
    for (u, procs) in &d.kept_open {
        for p in procs {
            log::warn(&format!(
                "{}: detached {u} with --force: process {} ({}) keeps its open file",
                h.who(),
                p.pid,
                f.proc.comm(p.pid).unwrap_or_else(|| "?".into())
            ));
        }
    }
}

/// After the locked step: the nodes whose grants were taken back leave the container's
/// `/dev`; a grant that could not be taken back, or a node that could not be removed, is
/// the error (said after what was detached).
fn finish(
    f: &World,
    h: &Holder,
    ct: &Container,
    out: Detached,
    revoked: Revoked,
    files: &Done,
    bound: &[Bound],
) -> Result<Detached, Error> {
    let specs: Vec<NodeSpec> = revoked
        .denied
        .iter()
        .map(|n| NodeSpec {
            node: n.clone(),
            mode: 0,
            uid: 0,
            gid: 0,
        })
        .collect();
    let removed = if specs.is_empty() {
        Ok(())
    } else {
        f.enter.remove_nodes(ct, &specs, &[], bound)
    };
    let empty = files.mounted.is_empty()
        && files.links.is_empty()
        && files.created.is_empty()
        && files.written.is_empty();
    let taken = match empty {
        true => Ok(Leftovers::default()),
        false => f.enter.uninject(ct, files, root_owner(h)),
    };
    if !revoked.kept.is_empty() {
        return Err(LifecycleError::CannotRevoke {
            kept: revoked.kept,
            detached: out.units,
            left: revoked.left,
        }
        .into());
    }
    if let Err(e) = removed {
        return Err(LifecycleError::NodesNotRemoved {
            units: out.units,
            source: Box::new(e),
        }
        .into());
    }
    match taken {
        Ok(left) if left.is_empty() => {
            if !empty {
                log::info(&format!(
                    "{}: took back {} CDI driver mount(s) and {} link(s) no GPU it keeps needs",
                    h.who(),
                    files.mounted.len(),
                    files.links.len()
                ));
            }
            Ok(out)
        }
        Ok(left) => Err(LifecycleError::DriverFilesLeft {
            units: out.units,
            left,
        }
        .into()),
        Err(e) => Err(LifecycleError::DriverFilesNotRemoved {
            units: out.units,
            source: Box::new(e),
        }
        .into()),
    }
}
