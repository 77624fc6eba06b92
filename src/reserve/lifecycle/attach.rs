//! `gpuhook attach`: more GPUs (or MIG instances) for a running container, all or nothing.
//! In this order: reserved (added to its reservation, or a new running one, with the nodes
//! about to be granted), granted in its device cgroup, made in its `/dev`, recorded. A node
//! its cgroup allowed before, and that its reservation does not record, is the container's
//! own: neither granted, made nor recorded (so a detach never takes it). A
//! failure takes back what was done, the grants before the units: a unit is never free while
//! the container may still use it, whenever the process is killed; and what a killed attach
//! granted is recorded, so a later detach (or stop) takes it back before the unit is free.
//!
//! Under systemd's cgroup manager the scope's device policy lists the new nodes too (before
//! the grant, outside the state lock), and on any failure once that change was tried (its
//! own too: refused, timed out, read back wrong or not at all) the list is put back as it was
//! before the units are freed; while it may still list them they stay reserved (the
//! container's, listed), so no reload ever lets it open a GPU another holds. Nothing is said
//! `attached` before every device rule in force for the container lets the nodes through
//! (`DeviceCgroup::effective`: every program from its cgroup up to the root on cgroup v2).
//! In a user-namespaced container the nodes are bind mounts, recorded by identity.
//!
//! With the driver's user space (`--driver cdi`), the new units' CDI edits come too, as at
//! `started` (`activate.rs`): the spec's extra nodes with the GPU's, then its mounts, links and
//! linker cache in the container's root (through the same helper and checks), only what the
//! container does not have from gpuhook already. The mounts are recorded with the nodes before
//! they are made (so a detach after a SIGKILL takes them back), the rest once made.

use super::activate::{apply, log_cdi, log_mps, undo, with_rollback, Applied};
use super::error::LifecycleError;
use super::holder::{new_reservation, Holder};
use super::mounts::planned;
use super::nodes::{as_nodes, node_specs, owned, root_owner};
use super::plan::{driver_record, plan_for, scan_for, wants_driver};
use super::prepare::{choose, no_twin};
use crate::cdi;
use crate::cgroup::{CgroupError, DeviceCgroup, Fault, ManagedPolicy};
use crate::enter::container::{Container, ContainerError};
use crate::enter::devdir::Bound;
use crate::enter::rootfs::{Done, Mounted};
use crate::host::inventory::Inventory;
use crate::ids::Unit;
use crate::leftovers::Leftovers;
use crate::log;
use crate::node::NodeSpec;
use crate::request::Request;
use crate::reserve::drain;
use crate::reserve::error::Error;
use crate::reserve::mps;
use crate::reserve::state::HolderKind;
use crate::reserve::state::Store;
use crate::reserve::state::{now_rfc3339, Node, Reservation, Started, State, Transition};
use crate::reserve::world::World;

/// What one attach gave the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    /// The units added to its reservation.
    pub units: Vec<Unit>,
    /// The nodes granted and made for them (those its reservation did not record already,
    /// nor its device cgroup allow: those are the container's own).
    pub nodes: Vec<NodeSpec>,
}

/// What the locked step reserved, and what taking it back needs.
struct MoreReserved {
    units: Vec<Unit>,
    /// Their nodes that the reservation did not record yet and the cgroup did not allow.
    specs: Vec<NodeSpec>,
    /// The reservation is this attach's own (the container held none).
    created: bool,
    /// Whether the reservation was hotplugged before.
    was_hotplugged: bool,
    /// What it recorded of its driver files before (`driver`, `driver_version`).
    was_driver: (Option<crate::request::Driver>, Option<String>),
    /// With the driver's user space: what of the CDI edits is new to the container (its
    /// mounts not recorded yet; its links; its linker cache, for every folder recorded too).
    plan: Option<cdi::Plan>,
    /// The plan's mounts as recorded before they are made (their sources' identity).
    mounts: Vec<Mounted>,
    /// The MPS daemon whose directories the plan mounts (the container's first slot of a
    /// GPU shared with MPS).
    mps: Option<(crate::ids::Pci, mps::Daemon)>,
}

impl MoreReserved {
    /// The plan, when it has anything to do in the container's root.
    fn rootfs_work(&self) -> Option<&cdi::Plan> {
        self.plan
            .as_ref()
            .filter(|p| !p.mounts.is_empty() || p.writes_rootfs())
    }
}

/// Starts the MPS daemons [`reserve_more`] marked `starting` (outside the state lock): their
/// notes join `notes`, the container's daemon in `got` becomes the one started.
fn bring_up_mps(
    f: &World,
    inv: &Inventory,
    got: &mut MoreReserved,
    notes: &mut Vec<String>,
) -> Result<(), Error> {
    let up = mps::bring_up(f.cfg, f.mps, f.proc, inv, &got.units, &|_| {})?;
    notes.extend(up.notes);
    if let Some((pci, d)) = &mut got.mps {
        if let Some(started) = up.daemons.get(pci) {
            *d = started.clone();
        }
    }
    Ok(())
}

/// `attach`: reserves `req.count` more units for the holder's running container (`find`),
/// grants their nodes in its device cgroup and makes them in its `/dev`; nothing of it is
/// left on failure. Refused (nothing changed) when the container does not run, its
/// reservation is only prepared or records another init, or the units are not there. The
/// door passes the facts of its kind of container (an OCI one's device cgroup is its init's).
pub fn attach(
    f: &World,
    h: &Holder,
    req: &Request,
    find: impl FnOnce() -> Result<Container, ContainerError>,
) -> Result<Attached, Error> {
    let ct = find()?;
    let cg = (f.cgroup)(f.cfg, &ct)?;
    let mut inv = (f.scan)(f.cfg, scan_for(f.cfg, req))?;
    let (mut got, mut notes) = match Store::new(&f.cfg.state_file)
        .update(|st| reserve_more(f, st, &mut inv, h, req, &ct, &*cg))
    {
        Ok(g) => g,
        Err(e) => {
            super::prepare::keep_reclaimed(f, &mut inv);
            return Err(e);
        }
    };
    drop(cg);
    // The daemons marked `starting` above start now, outside the state lock.
    if let Err(e) = bring_up_mps(f, &inv, &mut got, &mut notes) {
        return Err(take_back(
            f,
            &mut inv,
            h,
            &ct,
            &got,
            e,
            Leftovers::default(),
        ));
    }
    for n in notes {
        log::info(&n);
    }
    // The scope's device policy where systemd keeps one lists the nodes too, before they are
    // granted (outside the state lock: it runs `systemctl`), and loses them again on failure.
    let nodes = as_nodes(&got.specs);
    let mut policy = match tell_manager(f, &ct, &nodes) {
        Ok(p) => p,
        Err(e) => {
            let (e, left) = split(e);
            return Err(take_back(f, &mut inv, h, &ct, &got, e, left));
        }
    };
    let applied = match apply(f, &ct, &got.specs) {
        Ok(a) => a,
        Err(e) => {
            let (e, mut left) = split(e);
            left.append(untell(&mut policy, &nodes));
            return Err(take_back(f, &mut inv, h, &ct, &got, e, left));
        }
    };
    // Never `attached` before every device rule in force for the container lets them through.
    if let Err(e) = in_force(&*applied.cg, &got.specs, policy.as_deref()) {
        let mut left = undo(f, &ct, applied);
        left.append(untell(&mut policy, &nodes));
        return Err(take_back(f, &mut inv, h, &ct, &got, e, left));
    }
    // The driver's files (undone there on failure; then the nodes and grants are too).
    let done = match got.rootfs_work() {
        Some(p) => match f.enter.inject(&ct, p, root_owner(h)) {
            Ok(d) => Some(d),
            Err(e) => {
                let mut left = undo(f, &ct, applied);
                left.append(untell(&mut policy, &nodes));
                return Err(take_back(f, &mut inv, h, &ct, &got, e.into(), left));
            }
        },
        None => None,
    };
    if let Err(e) = record(f, h, &got, done.as_ref(), &applied.bound) {
        let mut left = Leftovers::default();
        if let Some(d) = &done {
            match f.enter.uninject(&ct, d, root_owner(h)) {
                Ok(l) => left.append(l),
                Err(e) => left.push(format_args!("driver files: {e}")),
            }
        }
        left.append(undo(f, &ct, applied));
        left.append(untell(&mut policy, &nodes));
        return Err(take_back(f, &mut inv, h, &ct, &got, e, left));
    }
    if let Some(p) = &policy {
        log_policy(h, &**p, &nodes);
    }
    log_attached(f, h, req, &got, done.as_ref(), &applied, &ct);
    Ok(Attached {
        units: got.units,
        nodes: got.specs,
    })
}

/// What an attach did, for the log: the driver's files, the MPS daemon, the units.
fn log_attached(
    f: &World,
    h: &Holder,
    req: &Request,
    got: &MoreReserved,
    done: Option<&Done>,
    applied: &Applied,
    ct: &Container,
) {
    if let Some(p) = &got.plan {
        log_cdi(h, p, done);
    }
    if let Some((pci, d)) = &got.mps {
        log_mps(h, *pci, d);
    }
    log::info(&format!(
        "{}: attached {} for {req} (asked by uid {}); granted {} and created {} node(s) in container (init {})",
        h.id.who_exactly(),
        Unit::join(&got.units, ","),
        f.uid,
        applied.granted.len(),
        applied.created.len(),
        ct.init.pid
    ));
}

/// The scope's device policy lists the attached nodes too: said.
fn log_policy(h: &Holder, p: &dyn ManagedPolicy, nodes: &[Node]) {
    log::info(&format!(
        "{}: {} lists {} too",
        h.who(),
        p.name(),
        nodes
            .iter()
            .map(|n| format!("{}:{}", n.major, n.minor))
            .collect::<Vec<_>>()
            .join(" ")
    ));
}

/// How long an attach waits for every device rule in force for the container to let its new
/// nodes through, after it told a service manager (systemd puts a changed `DeviceAllow=` in
/// force on its own, right after it answers); without one, the rules are read once.
const IN_FORCE_WAIT: std::time::Duration = if cfg!(test) {
    std::time::Duration::from_millis(100)
} else {
    std::time::Duration::from_secs(5)
};

/// The service manager's device policy of the container's cgroup (systemd's scope), where it
/// keeps one, told to list `nodes`. Once the change was tried, whatever came back (refused,
/// timed out, its read-back failed), the manager may list them: on failure its list is put
/// back as it was before the units go back to the pool; what could not be put back comes
/// with the error ([`split`] apart: the units then stay reserved, [`take_back`]).
fn tell_manager(
    f: &World,
    ct: &Container,
    nodes: &[Node],
) -> Result<Option<Box<dyn ManagedPolicy>>, Error> {
    if nodes.is_empty() {
        return Ok(None);
    }
    let mut policy = (f.manager)(f.cfg, ct)?;
    if let Some(p) = &mut policy {
        for n in nodes {
            char_link(f, n)?;
        }
        if let Err(e) = p.allow(nodes) {
            let left = untell(&mut policy, nodes);
            return Err(with_rollback(e.into(), left));
        }
    }
    Ok(policy)
}

/// The host's `/dev/char/MAJ:MIN` entry of a node handed to systemd, made when missing (as
/// at an OCI create, [`crate::host::charlink`]): a systemd that finds a device by that
/// entry (older than the ones that read its numbers from the name) would drop the node at its
/// next reload. A node with no host node of that number is left without one; an entry that
/// leads elsewhere refuses the attach (systemd would allow that other device).
fn char_link(f: &World, n: &Node) -> Result<(), Error> {
    crate::host::charlink::ensure_logged(&f.cfg.dev, &n.path, n.major, n.minor)
        .map_err(|source| LifecycleError::CharLink { source }.into())
}

/// Puts the manager's entries for `nodes` back as they were before [`tell_manager`]; what
/// could not be (the manager may then still list them).
fn untell(policy: &mut Option<Box<dyn ManagedPolicy>>, nodes: &[Node]) -> Leftovers {
    let mut left = Leftovers::default();
    if let Some(p) = policy {
        if let Err(e) = p.restore(nodes) {
            let listed: Vec<String> = nodes
                .iter()
                .map(|n| format!("{}:{}", n.major, n.minor))
                .collect();
            left.push(format_args!(
                "{}: {e} (it may still list {})",
                p.name(),
                listed.join(" ")
            ));
        }
    }
    left
}

/// Whether every node is now let through by every device rule in force for the container's
/// cgroup ([`DeviceCgroup::effective`]): waited for up to [`IN_FORCE_WAIT`] when a manager
/// was told, read once otherwise.
fn in_force(
    cg: &dyn DeviceCgroup,
    specs: &[NodeSpec],
    told: Option<&dyn ManagedPolicy>,
) -> Result<(), Error> {
    let until = std::time::Instant::now() + IN_FORCE_WAIT;
    loop {
        let refused = specs.iter().find_map(|s| match cg.effective(&s.node) {
            Ok(true) => None,
            Ok(false) => Some(Err(s)),
            Err(e) => Some(Ok(e)),
        });
        let last = told.is_none() || std::time::Instant::now() >= until;
        match refused {
            None => return Ok(()),
            Some(Ok(e)) if last => return Err(e.into()),
            Some(Err(s)) if last => {
                return Err(LifecycleError::NotInForce {
                    path: cg.path().to_path_buf(),
                    node: s.node.clone(),
                    by: told.map(|p| p.name()),
                }
                .into())
            }
            Some(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
}

/// The holder's reservation may take more: running (the transition table), with this init.
fn may_take_more(f: &World, r: &Reservation, ct: &Container) -> Result<(), Error> {
    Transition::Attach
        .from(Some(r.found(|p| f.proc.alive(p), None)))
        .map_err(|_| LifecycleError::AttachPrepared)?;
    if r.init != Some(ct.init) {
        return Err(LifecycleError::AttachOtherInit {
            recorded: r.init.map(|i| i.pid),
            found: ct.init.pid,
        }
        .into());
    }
    Ok(())
}

/// Under the state lock: the holder's reservation may take more (a running one of this
/// container, or none), the units are chosen as `reserve` chooses them (the holder's own
/// count as held) and added to it, with the nodes about to be granted (not those `cg`
/// allows already: the container's own).
fn reserve_more(
    f: &World,
    st: &mut State,
    inv: &mut Inventory,
    h: &Holder,
    req: &Request,
    ct: &Container,
    cg: &dyn DeviceCgroup,
) -> Result<(MoreReserved, Vec<String>), Error> {
    let now = &now_rfc3339();
    // What running VMs pass through is theirs; a quarantined GPU is given to no one.
    let passed = crate::reserve::vm::mark_running_vms(f.cfg, f.proc, inv, st);
    crate::reserve::health::apply(inv, st);
    no_twin(st, h)?;
    if let Some(r) = st.reservations.get(&h.key) {
        may_take_more(f, r, ct)?;
    }
    // One slot of a shared GPU per holder: not one of those it has.
    let sharing: Vec<crate::ids::Pci> = st
        .reservations
        .get(&h.key)
        .map(|r| {
            r.gpus
                .iter()
                .filter(|u| u.is_slot())
                .map(Unit::pci)
                .collect()
        })
        .unwrap_or_default();
    // Whether it has an MPS daemon's directories already (recorded at its create, `started`
    // or an earlier attach): a container has one `/tmp/nvidia-mps`.
    let has_mps = st
        .reservations
        .get(&h.key)
        .is_some_and(|r| r.mounts.iter().any(|m| mps::is_target(&m.target)));
    let (units, mut notes) = choose(f, st, inv, req, &sharing, &passed)?;
    let mut specs = node_specs(h, req, inv, &units)?;
    let r = st.reservations.get(&h.key);
    let mut plan = match wants_driver(f.cfg, req) {
        Some(d) => new_edits(f, h, req, inv, &units, r, &mut specs, d)?,
        None => None,
    };
    let (driver, version) = driver_record(f.cfg, req, plan.as_ref());
    let mut mounts: Vec<Mounted> = match &plan {
        Some(p) => p.mounts.iter().map(planned).collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    let specs = not_yet_allowed(h, cg, r.map_or(&[], |r| &r.nodes[..]), specs, &mut notes)?;
    let (created, was_hotplugged) = (r.is_none(), r.is_some_and(|r| r.hotplugged));
    let was_driver = r.map_or((None, None), |r| (r.driver, r.driver_version.clone()));
    let r = st.reservations.entry(h.key.clone()).or_insert_with(|| {
        let mut r = new_reservation(h, req, &[], now);
        let started = Started {
            // An OCI container has no controller (its `Container` names its init there).
            controller: (h.kind() == HolderKind::Libvirt).then_some(ct.controller),
            init: ct.init,
            nodes: Vec::new(),
            cgroup: None,
            namespaces: None,
        };
        r.set_running(started, now);
        r
    });
    r.gpus.extend(&units);
    // Recorded before they are granted: a detach of a killed attach's units takes back
    // their grants before it frees them.
    r.nodes.extend(as_nodes(&specs));
    r.mounts.extend(mounts.iter().cloned());
    r.hotplugged = true;
    if driver.is_some() {
        r.driver = driver;
        r.driver_version = r.driver_version.take().or(version);
    }
    r.updated = now.to_string();
    // The first slot of a GPU shared with MPS starts its daemon (or one that died).
    notes.extend(mps::claim(f.cfg, f.mps, f.proc, st, inv, &units)?);
    // The first slot of a GPU shared with MPS this container gets: its daemon's directories,
    // planned and recorded as the CDI mounts are.
    let daemon = match has_mps {
        true => None,
        false => super::mounts::record_mps_mounts(st, &h.key, &units)?,
    };
    if let Some((_, d, made)) = &daemon {
        mounts.extend(made.iter().cloned());
        plan.get_or_insert_with(Default::default)
            .mounts
            .extend(mps::mounts(d));
    }
    let got = MoreReserved {
        units,
        specs,
        created,
        was_hotplugged,
        was_driver,
        plan,
        mounts,
        mps: daemon.map(|(pci, d, _)| (pci, d)),
    };
    Ok((got, notes))
}

/// The driver files of the new `units` (from the CDI specs, or the host's running driver)
/// that the container (its reservation `r`) does not have from gpuhook yet: a spec's extra
/// nodes join `specs` (owned as they are); its mounts recorded already are left out; the
/// linker cache is built for the folders recorded too (gpuhook's `ld.so.conf.d` file lists
/// them all). Refused when the container has driver files from the other source, or of
/// another NVIDIA driver version than these (a driver upgraded since it started).
#[allow(clippy::too_many_arguments)]
fn new_edits(
    f: &World,
    h: &Holder,
    req: &Request,
    inv: &Inventory,
    units: &[Unit],
    r: Option<&Reservation>,
    specs: &mut Vec<NodeSpec>,
    driver: crate::request::Driver,
) -> Result<Option<cdi::Plan>, Error> {
    let holds = r.map_or(&[][..], |r| &r.gpus[..]);
    let recorded = r.map_or(&[][..], |r| &r.nodes[..]);
    let granted = specs
        .iter()
        .map(|s| &s.node)
        .chain(recorded)
        .map(|n| (n.major, n.minor))
        .collect();
    if let Some(had) = r.and_then(|r| r.driver).filter(|d| *d != driver) {
        return Err(LifecycleError::DriverMix { had, asked: driver }.into());
    }
    let Some(mut plan) = plan_for(f, driver, inv, units, holds, granted)? else {
        return Ok(None);
    };
    if let Some(r) = r {
        if let (Some(old), Some(new)) = (&r.driver_version, &plan.nvidia_version) {
            if old != new {
                return Err(LifecycleError::DriverOutdated {
                    old: old.clone(),
                    new: new.clone(),
                }
                .into());
            }
        }
    }
    specs.extend(owned(
        h,
        req,
        plan.nodes.iter().map(|n| (n.node.clone(), n.mode)),
    )?);
    if let Some(r) = r {
        // An OCI container made with the host's driver has its files from its create (its
        // runtime's mounts, not recorded here): the same files serve every NVIDIA GPU.
        if driver == crate::request::Driver::Host
            && r.kind() == HolderKind::Oci
            && r.driver == Some(driver)
            && !has_driver_files(r)
        {
            plan.mounts.clear();
            plan.links.clear();
            plan.ld_folders.clear();
        }
        plan.mounts
            .retain(|m| !r.mounts.iter().any(|x| x.target == m.target));
        if !plan.ld_folders.is_empty() {
            let mut folders = r.rootfs.ld_folders.clone();
            folders.extend(
                plan.ld_folders
                    .iter()
                    .filter(|d| !r.rootfs.ld_folders.contains(d))
                    .cloned(),
            );
            plan.ld_folders = folders;
        }
    }
    Ok(Some(plan))
}

/// Whether gpuhook put driver files in the reservation's container (CDI's or the host's;
/// not an MPS daemon's directories).
pub(super) fn has_driver_files(r: &Reservation) -> bool {
    r.mounts.iter().any(|m| !mps::is_target(&m.target)) || !r.rootfs.is_empty()
}

/// Of `specs`, those to grant, make and record: not one `recorded` already, nor one `cg`
/// allows already that it does not record (the container's own: a `--device` of its own, a
/// `<hostdev>`, a wildcard rule; said in `notes`), which a detach must then never take.
fn not_yet_allowed(
    h: &Holder,
    cg: &dyn DeviceCgroup,
    recorded: &[Node],
    specs: Vec<NodeSpec>,
    notes: &mut Vec<String>,
) -> Result<Vec<NodeSpec>, Error> {
    let mut out = Vec::new();
    for s in specs.into_iter().filter(|s| !recorded.contains(&s.node)) {
        if cg.confines() && cg.is_allowed(&s.node)? {
            notes.push(format!(
                "{}: {} ({}:{}) is already allowed in its device cgroup: the container's own, not granted, made or recorded",
                h.who(),
                s.path,
                s.major,
                s.minor
            ));
        } else {
            out.push(s);
        }
    }
    Ok(out)
}

/// A failure of [`apply`], and apart from it what its own rollback could not undo (a grant
/// that could not be revoked: the units must then stay reserved).
fn split(e: Error) -> (Error, Leftovers) {
    match e {
        Error::RollbackIncomplete { error, left } => (*error, left),
        Error::Cgroup(CgroupError {
            path,
            fault: Fault::RollbackIncomplete { fault, left },
        }) => (CgroupError::new(&path, *fault).into(), left),
        e => (e, Leftovers::default()),
    }
}

/// Under the state lock: the attached units, granted and made, recorded as the reservation's
/// when it still holds them (a stop or a detach may have come in between); their nodes, which
/// the reserve recorded, again if something in between left them out.
fn record(
    f: &World,
    h: &Holder,
    got: &MoreReserved,
    done: Option<&Done>,
    bound: &[Bound],
) -> Result<(), Error> {
    Store::new(&f.cfg.state_file).update(|st| -> Result<(), Error> {
        let r = st
            .reservations
            .get_mut(&h.key)
            .filter(|r| got.units.iter().all(|u| r.gpus.contains(u)))
            .ok_or_else(|| LifecycleError::ChangedWhileAttaching {
                units: got.units.clone(),
            })?;
        for n in as_nodes(&got.specs) {
            if !r.nodes.contains(&n) {
                r.nodes.push(n);
            }
        }
        // The mounts as made (recorded before as planned); the rest of what was made.
        let planned = |m: &Mounted| got.mounts.iter().any(|x| x.target == m.target);
        r.mounts.retain(|m| !planned(m));
        if let (Some(d), Some(p)) = (done, &got.plan) {
            r.mounts.extend(d.mounted.iter().cloned());
            r.rootfs.add(d, &p.ld_folders);
        }
        // The nodes bound into a user-namespaced container, by identity (what detach takes).
        r.node_mounts
            .retain(|b| bound.iter().all(|x| x.path != b.path));
        r.node_mounts.extend(bound.iter().cloned());
        r.updated = now_rfc3339();
        Ok(())
    })
}

/// A failure `e` after the units were reserved, with what undoing the grants and nodes left
/// (`left`): the units are taken back out of the reservation (one this attach made is
/// deleted). While a grant of them may be left, they stay reserved, and the error says so. A
/// container whose init is gone took its cgroup and `/dev` with it: nothing is left there.
fn take_back(
    f: &World,
    inv: &mut Inventory,
    h: &Holder,
    ct: &Container,
    got: &MoreReserved,
    e: Error,
    mut left: Leftovers,
) -> Error {
    if !f.proc.alive(&ct.init) {
        left = Leftovers::default();
    }
    let units = Unit::join(&got.units, ",");
    if !left.is_empty() {
        left.push(format_args!("GPUs {units} stay reserved for {}", h.who()));
    } else if let Err(u) = unreserve(f, inv, h, got) {
        left.push(format_args!(
            "GPUs {units} stay reserved for {}: {u}",
            h.who()
        ));
    }
    with_rollback(e, left)
}

/// Under the state lock: the units and the nodes the reserve recorded for them out of the
/// holder's reservation (draining if a process opened one meanwhile), the reservation deleted
/// when this attach made it and nothing else came into it.
fn unreserve(f: &World, inv: &mut Inventory, h: &Holder, got: &MoreReserved) -> Result<(), Error> {
    Store::new(&f.cfg.state_file).update(|st| -> Result<(), Error> {
        let Some(r) = st.reservations.get_mut(&h.key) else {
            return Ok(());
        };
        r.gpus.retain(|u| !got.units.contains(u));
        let nodes = as_nodes(&got.specs);
        r.nodes.retain(|n| !nodes.contains(n));
        r.mounts.retain(|m| !got.mounts.contains(m));
        r.hotplugged = got.was_hotplugged;
        (r.driver, r.driver_version) = got.was_driver.clone();
        let out = Reservation {
            gpus: got.units.clone(),
            ..r.clone()
        };
        if got.created && r.gpus.is_empty() {
            st.reservations.remove(&h.key);
        }
        drain::after_free_in(inv, f.cfg, st, &[out], f.proc);
        // A daemon this attach started for a slot it gave back has no sharer now.
        for n in mps::stop_unused(f.cfg, f.mps, f.proc, st) {
            log::info(&n);
        }
        Ok(())
    })
}
