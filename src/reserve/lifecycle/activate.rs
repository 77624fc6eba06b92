//! `started`: grants and nodes in a running container, the CDI driver files, undone on
//! failure.

use super::error::LifecycleError;
use super::holder::Holder;
use super::nodes::{as_nodes, root_owner};
use super::plan::{driver_record, given, scan_for, Given};
use super::store::reservation;
use crate::cdi;
use crate::cgroup::{self, DeviceCgroup};
use crate::enter::container::{Container, ContainerError};
use crate::leftovers::Leftovers;
use crate::log;
use crate::node::{NodeSpec, Outcome};
use crate::request::Request;
use crate::reserve::error::Error;
use crate::reserve::mps;
use crate::reserve::state::Store;
use crate::reserve::state::{now_rfc3339, Node, Started, Transition};
use crate::reserve::world::World;

/// What one `apply` changed, so it can be undone.
pub(super) struct Applied {
    pub(super) cg: Box<dyn DeviceCgroup>,
    pub(super) granted: Vec<Node>,
    pub(super) created: Vec<NodeSpec>,
    dirs: Vec<String>,
    /// In a user-namespaced container: the nodes bind-mounted.
    pub(super) bound: Vec<crate::enter::devdir::Bound>,
}

/// Grants the nodes in the container's device cgroup, then creates them in its `/dev`.
/// On failure nothing of this call is left behind.
pub(super) fn apply(f: &World, ct: &Container, specs: &[NodeSpec]) -> Result<Applied, Error> {
    let mut cg = (f.cgroup)(f.cfg, ct)?;
    let granted = cgroup::grant_all(&mut *cg, &as_nodes(specs))?;
    match f.enter.create_nodes(ct, specs) {
        Ok(made) => {
            let created = specs
                .iter()
                .zip(&made.outcomes)
                .filter(|(_, o)| **o == Outcome::Created)
                .map(|(s, _)| s.clone())
                .collect();
            Ok(Applied {
                cg,
                granted,
                created,
                dirs: made.dirs,
                bound: made.bound,
            })
        }
        Err(e) => Err(with_rollback(
            e.into(),
            cgroup::revoke_all(&mut *cg, &granted),
        )),
    }
}

/// The error, with what its rollback could not undo said on the same line.
pub(super) fn with_rollback(e: Error, left: Leftovers) -> Error {
    if left.is_empty() {
        e
    } else {
        Error::RollbackIncomplete {
            error: Box::new(e),
            left,
        }
    }
}

/// Takes back what `apply` did; returns what could not be undone (empty when all was).
/// A container whose init has exited lost its `/dev` with its mount namespace, and its
/// cgroup goes with it: nothing there is left to undo, whatever failed.
pub(super) fn undo(f: &World, ct: &Container, mut a: Applied) -> Leftovers {
    let mut left = Leftovers::default();
    if let Err(e) = f.enter.remove_nodes(ct, &a.created, &a.dirs, &a.bound) {
        left.push(format_args!("nodes: {e}"));
    }
    left.append(cgroup::revoke_all(&mut *a.cg, &a.granted));
    if f.proc.alive(&ct.init) {
        left
    } else {
        Leftovers::default()
    }
}

/// `started`: grants the reserved GPUs' nodes in the container's device cgroup and makes
/// them in its `/dev` (undone on failure), then records the container in the state. `find`
/// is how the front door finds its container (libvirt: through the controller).
pub fn activate(
    f: &World,
    h: &Holder,
    req: &Request,
    find: impl FnOnce() -> Result<Container, ContainerError>,
) -> Result<(), Error> {
    let st = Store::new(&f.cfg.state_file);
    let snap = st.read()?;
    let r = reservation(&snap, h)?;
    Transition::Start
        .from(Some(r.found(|p| f.proc.alive(p), None)))
        .map_err(|_| LifecycleError::NoReservation)?;
    // A sharer of a GPU shared with MPS: its daemon's directories (docs/guides/sharing.md, "MPS").
    let mps = mps::daemon_for(&snap, &r.gpus).map(|(pci, d)| (pci, d.clone()));
    drop(snap);
    let mut inv = (f.scan)(f.cfg, scan_for(f.cfg, req))?;
    inv.settle(f.cfg, &r.gpus);
    let ct = find()?;
    let Given {
        nodes: specs,
        mut plan,
    } = given(f, h, req, &inv, &r.gpus)?;
    let (driver, driver_version) = driver_record(f.cfg, req, plan.as_ref());
    if let Some((_, d)) = &mps {
        plan.get_or_insert_with(Default::default)
            .mounts
            .extend(mps::mounts(d));
    }
    let applied = apply_in_started(f, &ct, &specs)?;
    // The driver's files: mounted, linked and cached in the container's root (undone there
    // on failure; then the nodes and grants are undone too).
    let done = match plan
        .as_ref()
        .filter(|p| !p.mounts.is_empty() || p.writes_rootfs())
    {
        Some(p) => match f.enter.inject(&ct, p, root_owner(h)) {
            Ok(d) => Some(d),
            Err(e) => return Err(with_rollback(e.into(), undo(f, &ct, applied))),
        },
        None => None,
    };
    let now = now_rfc3339();
    let recorded = st.update(|s| -> Result<(), Error> {
        let cur = s
            .reservations
            .get_mut(&h.key)
            .ok_or(LifecycleError::ReleasedWhileStarting)?;
        if cur.gpus != r.gpus {
            return Err(LifecycleError::ChangedWhileStarting.into());
        }
        let started = Started {
            controller: Some(ct.controller),
            init: ct.init,
            nodes: as_nodes(&specs),
            cgroup: None,
            namespaces: None,
        };
        cur.set_running(started, &now);
        cur.mounts = done.as_ref().map(|d| d.mounted.clone()).unwrap_or_default();
        cur.rootfs = Default::default();
        if let (Some(d), Some(p)) = (&done, &plan) {
            cur.rootfs.add(d, &p.ld_folders);
        }
        (cur.driver, cur.driver_version) = (driver, driver_version);
        Ok(())
    });
    if let Err(e) = recorded {
        let mut left = Leftovers::default();
        if let Some(d) = &done {
            match f.enter.uninject(&ct, d, root_owner(h)) {
                Ok(l) => left.append(l),
                Err(e) => left.push(format_args!("driver files: {e}")),
            }
        }
        left.append(undo(f, &ct, applied));
        return Err(with_rollback(e, left));
    }
    if let Some(p) = &plan {
        log_cdi(h, p, done.as_ref());
    }
    if let Some((pci, d)) = &mps {
        log_mps(h, *pci, d);
    }
    log::info(&format!(
        "{}: granted and created {} in container (init {})",
        h.who(),
        specs
            .iter()
            .map(|s| s.path.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        ct.init.pid
    ));
    Ok(())
}

/// [`apply`] at `started`: a failure because the init exited meanwhile says so first (that
/// is the cause an operator needs). The container helper says it as a value; a cgroup that
/// vanished with the init is recognized by looking at the init.
fn apply_in_started(f: &World, ct: &Container, specs: &[NodeSpec]) -> Result<Applied, Error> {
    let applied = apply(f, ct, specs).map_err(|e| match e {
        // The init is gone: so are its cgroup and /dev, and nothing is left to roll back.
        Error::RollbackIncomplete { error, .. }
            if matches!(*error, Error::Container(ContainerError::InitGone { .. })) =>
        {
            *error
        }
        e => e,
    });
    applied.map_err(|e| match e {
        Error::Container(ContainerError::InitGone { pid, cause }) => {
            LifecycleError::InitExited { pid, cause }.into()
        }
        e if !f.proc.alive(&ct.init) => Error::InitExitedAfter {
            pid: ct.init.pid,
            error: Box::new(e),
        },
        e => e,
    })
}

/// What a running container (libvirt's at `started`, or any at `attach`) got from the CDI
/// specs, and what of them gpuhook does not do there (other hooks: the container's process
/// already runs; its environment).
pub(super) fn log_cdi(h: &Holder, p: &cdi::Plan, done: Option<&crate::enter::rootfs::Done>) {
    // A plan of an MPS daemon's directories only (no spec, no host driver): said by
    // [`log_mps`].
    if p.specs.is_empty() && p.host_driver.is_none() {
        return;
    }
    let cdi_mounts = |d: &crate::enter::rootfs::Done| {
        d.mounted
            .iter()
            .filter(|m| !mps::is_target(&m.target))
            .count()
    };
    let (hooks, env) = match h.kind() {
        crate::reserve::state::HolderKind::Libvirt => {
            ("a libvirt container", "a running libvirt container")
        }
        crate::reserve::state::HolderKind::Oci | crate::reserve::state::HolderKind::Pod => {
            ("a running OCI container", "a running OCI container")
        }
        crate::reserve::state::HolderKind::Vm => ("a virtual machine", "a virtual machine"),
    };
    let from = match &p.host_driver {
        Some(d) => d.clone(),
        None => format!("{} ({})", p.specs.join(", "), p.devices.join(" ")),
    };
    log::info(&format!(
        "{}: driver files from {from}: {} mount(s), {} link(s), linker cache {}",
        h.who(),
        done.map_or(0, cdi_mounts),
        done.map_or(0, |d| d.links.len()),
        if p.ld_folders.is_empty() {
            "not asked".to_string()
        } else {
            format!("updated for {}", p.ld_folders.join(" "))
        }
    ));
    for n in done.map(|d| d.notes.as_slice()).unwrap_or_default() {
        log::info(&format!("{}: {n}", h.who()));
    }
    if !p.hooks.is_empty() {
        log::info(&format!(
            "{}: CDI hooks not run for {hooks}: {}",
            h.who(),
            p.hooks
                .iter()
                .map(|k| format!("{} {}", k.stage, k.args.join(" ")))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    if !p.env.is_empty() {
        log::info(&format!(
            "{}: CDI environment not set in {env}: {}",
            h.who(),
            p.env.join(" ")
        ));
    }
}

/// What a sharer of a GPU shared with MPS got in its container: its daemon's pipes and
/// shared memory.
pub(super) fn log_mps(h: &Holder, pci: crate::ids::Pci, d: &mps::Daemon) {
    log::info(&format!(
        "{}: MPS daemon of GPU {pci} ({}, pid {}): {} at {} and {} at {} in the container",
        h.who(),
        d.uuid,
        d.proc.pid,
        d.pipe().display(),
        mps::CONTAINER_PIPE,
        d.shm().display(),
        mps::CONTAINER_SHM
    ));
}
