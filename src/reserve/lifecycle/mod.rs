//! The lifecycle of a GPU reservation, whichever front door drives it (the libvirt hook
//! today, the OCI runtime wrapper next): reserve (`prepare`), confirm (`start`), activate
//! (`started`: grants and nodes, undone on failure), re-adopt (`reconnect`), free. A front
//! door turns its own input (domain XML, an OCI bundle) into a [`Holder`] and a [`Request`],
//! says how to find its running container, and maps the results to its own exit codes.

use crate::cdi;
use crate::enter::container;
use crate::host::config::Config;
use crate::host::inventory::{Inventory, Scan};
use crate::host::procfs::{self, Proc, ProcRef};
use crate::ids::Unit;
use crate::log;
use crate::node::NodeSpec;
use crate::request::{Driver, IdMap, Request};
use crate::reserve::alloc;
use crate::reserve::error::Error;
use crate::reserve::facts::Facts;
use crate::reserve::state::{now_rfc3339, Node, Phase, Reservation, State, StateError, Store};

mod activate;
mod attach;
mod detach;
mod error;
mod free;
mod readopt;
mod reserve;
#[cfg(test)]
mod tests;

pub use crate::reserve::state::HolderKind;
pub use activate::{activate, activate_with};
pub use attach::{attach_with, Attached};
pub use detach::{detach_with, Detached, Which};
pub use error::LifecycleError;
pub use free::{free, free_with, Freed};
pub use readopt::{readopt, readopt_with, Readopted};
pub use reserve::{reserve, reserve_nodes, reserve_nodes_with, reserve_with};

/// Who holds GPUs: what the state keys a reservation by (`id`), the name operators know it
/// by, and how its container's user namespace maps ids (nodes are owned by its root).
#[derive(Debug, Clone, Copy)]
pub struct Holder<'a> {
    pub kind: HolderKind,
    pub name: &'a str,
    pub id: &'a str,
    pub idmap: &'a IdMap,
}

impl Holder<'_> {
    /// How messages name it: `domain 'web1'`, `container 'ID'`.
    pub fn who(&self) -> String {
        self.kind.who(self.name)
    }

    /// How messages name its uid and gid mappings.
    fn idmap_names(&self) -> (&'static str, &'static str) {
        match self.kind {
            HolderKind::Libvirt => (
                crate::request::metadata::IDMAP,
                crate::request::metadata::IDMAP,
            ),
            HolderKind::Oci => ("linux.uidMappings", "linux.gidMappings"),
        }
    }
}

fn store(cfg: &Config) -> Store {
    Store::new(&cfg.state_file)
}

/// Why a reservation is stale (its holder is gone), if it is: [`crate::reserve::reconcile::stale`]
/// on this host's processes.
pub fn stale_reason(r: &Reservation) -> Option<String> {
    stale_on(r, procfs::HOST, &controller_running)
}

/// [`stale_reason`] on these facts.
fn stale_on(r: &Reservation, proc: Proc, controller: &dyn Fn(&str) -> bool) -> Option<String> {
    crate::reserve::reconcile::stale(
        r,
        &crate::reserve::reconcile::Seen {
            alive: &|p| proc.alive(p),
            controller,
        },
    )
}

/// Whether libvirt's controller for the domain runs (`/run/libvirt/lxc/NAME.pid`).
pub fn controller_running(name: &str) -> bool {
    container::pidfile_controller(name)
        .ok()
        .and_then(procfs::comm)
        .is_some_and(|c| c == "libvirt_lxc")
}

/// Drops stale reservations; returns what was reclaimed, for the log, and the reservations.
fn reclaim_stale(f: &Facts, st: &mut State) -> (Vec<String>, Vec<Reservation>) {
    let stale: Vec<(String, String)> = st
        .reservations
        .iter()
        .filter_map(|(u, r)| stale_on(r, f.proc, f.controller_running).map(|why| (u.clone(), why)))
        .collect();
    stale
        .into_iter()
        .filter_map(|(u, why)| {
            st.reservations.remove(&u).map(|r| {
                (
                    format!(
                        "reclaimed GPUs {} of {} ({u}): {why}",
                        Unit::join(&r.gpus, ","),
                        r.who()
                    ),
                    r,
                )
            })
        })
        .unzip()
}

/// Whether a reserved unit can still be given: a whole GPU that is usable and not in MIG
/// mode, or a MIG instance that exists on a usable GPU.
fn unit_ok(inv: &Inventory, unit: &Unit) -> bool {
    match *unit {
        Unit::Mig { .. } => inv.mig(unit).is_some_and(|(g, _)| g.usable()),
        // A slot: its GPU is still shared, with this slot among its replicas.
        Unit::Slot { slot, .. } => inv.by_unit(unit).is_some_and(|g| {
            g.usable() && g.migs.is_empty() && g.sharing.is_some_and(|s| slot < s.replicas)
        }),
        Unit::Gpu(_) => inv
            .by_unit(unit)
            .is_some_and(|g| g.usable() && g.migs.is_empty() && g.sharing.is_none()),
    }
}

/// Whether an existing reservation still fits the request on this inventory.
fn satisfies(inv: &Inventory, gpus: &[Unit], req: &Request) -> bool {
    gpus.len() == req.count as usize
        && gpus.iter().all(|p| {
            p.is_mig() == req.mig
                && p.is_slot() == req.share
                && unit_ok(inv, p)
                && inv
                    .by_unit(p)
                    .is_some_and(|g| alloc::matches(g, &req.filters))
        })
        && req.devices.iter().all(|sel| {
            alloc::resolve(&inv.gpus, sel)
                .is_some_and(|g| gpus.iter().any(|u| !u.is_mig() && u.pci() == g.pci))
        })
        && req.migs.iter().all(|sel| {
            alloc::resolve(&inv.gpus, &sel.gpu).is_some_and(|g| {
                gpus.contains(&Unit::Mig {
                    pci: g.pci,
                    gi: sel.gi,
                    ci: sel.ci,
                })
            })
        })
}

/// The nodes an OCI container gets, and its CDI edits.
pub type Prepared = (Vec<NodeSpec>, Option<cdi::Plan>);

/// An OCI container's init exists (its `createRuntime` hook): the reservation is running and
/// stale once that init is gone. `by` is the process that reserved it (the hook's token): a
/// hook left from another `create` of the same ID acts on nothing. An error when the
/// container holds no such reservation. `cgroup`, `namespaces`: where the runtime put the
/// init.
pub fn record_init(
    h: &Holder,
    by: ProcRef,
    init: ProcRef,
    cgroup: Option<crate::cgroup::Made>,
    namespaces: Option<crate::host::procfs::Namespaces>,
) -> Result<(), Error> {
    record_init_in(&Config::load()?, h, by, init, cgroup, namespaces)
}

/// [`record_init`] with the config the front door loaded.
pub fn record_init_in(
    cfg: &Config,
    h: &Holder,
    by: ProcRef,
    init: ProcRef,
    cgroup: Option<crate::cgroup::Made>,
    namespaces: Option<crate::host::procfs::Namespaces>,
) -> Result<(), Error> {
    let now = now_rfc3339();
    let gpus = store(cfg).update(|st| -> Result<_, Error> {
        let r = st
            .reservations
            .get_mut(h.id)
            .filter(|r| r.kind == h.kind && r.prepared_by == Some(by))
            .ok_or(LifecycleError::NotThisCreate)?;
        r.phase = Phase::Running;
        r.init = Some(init);
        r.cgroup = cgroup;
        r.namespaces = namespaces;
        r.updated = now;
        Ok(r.gpus.clone())
    })?;
    log::info(&format!(
        "{}: init {} runs with GPUs {}",
        h.who(),
        init.pid,
        Unit::join(&gpus, ",")
    ));
    Ok(())
}

/// A new reservation of these units for the holder, in this phase, as of `now`; what a step
/// knows of its container it fills in.
fn new_reservation(
    h: &Holder,
    req: &Request,
    gpus: &[Unit],
    phase: Phase,
    now: &str,
) -> Reservation {
    Reservation {
        kind: h.kind,
        domain: h.name.to_string(),
        uuid: h.id.to_string(),
        gpus: gpus.to_vec(),
        phase,
        request: req.to_string(),
        created: now.to_string(),
        updated: now.to_string(),
        prepared_by: None,
        controller: None,
        init: None,
        cgroup: None,
        namespaces: None,
        nodes: Vec::new(),
        mounts: Vec::new(),
        rootfs: Default::default(),
        hotplugged: false,
        node_mounts: Vec::new(),
        driver: None,
        driver_version: None,
    }
}

fn reservation(st: &State, h: &Holder) -> Result<Reservation, Error> {
    st.reservations
        .get(h.id)
        .cloned()
        .ok_or(LifecycleError::NoReservation.into())
}

/// `start`: checks that the holder's reservation still stands on this host.
pub fn confirm(h: &Holder, req: &Request) -> Result<(), Error> {
    confirm_with(&Facts::host(&Config::load()?), h, req)
}

/// [`confirm`] on these facts.
pub fn confirm_with(f: &Facts, h: &Holder, req: &Request) -> Result<(), Error> {
    let st = store(f.cfg).read()?;
    let r = reservation(&st, h)?;
    let mut inv = (f.scan)(f.cfg, scan_for(f.cfg, req))?;
    crate::reserve::health::apply(&mut inv, &st);
    inv.settle(f.cfg, &r.gpus);
    for p in &r.gpus {
        let g = inv
            .by_unit(p)
            .ok_or(LifecycleError::UnitGone { unit: *p })?;
        if let Some(why) = &g.problem {
            return Err(LifecycleError::UnitUnusable {
                unit: *p,
                why: why.clone(),
            }
            .into());
        }
        if g.excluded {
            return Err(LifecycleError::UnitExcluded { unit: *p }.into());
        }
        if p.is_mig() && inv.mig(p).is_none() {
            return Err(LifecycleError::MigGone { unit: *p }.into());
        }
    }
    Ok(())
}

/// The nodes a container gets for its GPUs, with mode and host-side owner.
fn node_specs(
    h: &Holder,
    req: &Request,
    inv: &Inventory,
    gpus: &[Unit],
) -> Result<Vec<NodeSpec>, Error> {
    for p in gpus {
        let g = inv
            .by_unit(p)
            .ok_or(LifecycleError::UnitGone { unit: *p })?;
        // An instance deleted (or MIG mode left) since: its GPU's node alone would be more.
        if p.is_mig() && inv.mig(p).is_none() {
            return Err(LifecycleError::MigGone { unit: *p }.into());
        }
        if g.nodes.is_empty() {
            return Err(LifecycleError::NoDeviceNode {
                unit: *p,
                why: g.problem.clone(),
            }
            .into());
        }
    }
    owned(
        h,
        req,
        inv.nodes_for(gpus, req.capabilities)
            .into_iter()
            .map(|n| (n.node, n.mode)),
    )
}

/// Nodes (each with its host node's mode) as the container gets them: the request's mode, if
/// it says one, and owned by the request's container-side uid and gid through the holder's
/// id map.
fn owned(
    h: &Holder,
    req: &Request,
    nodes: impl IntoIterator<Item = (Node, u32)>,
) -> Result<Vec<NodeSpec>, Error> {
    let (uid, gid) = h.idmap.owner(req.uid, req.gid, h.idmap_names())?;
    Ok(nodes
        .into_iter()
        .map(|(node, mode)| NodeSpec {
            mode: req.mode.unwrap_or(mode),
            node,
            uid,
            gid,
        })
        .collect())
}

/// What a container would get of the driver's user space for these GPUs (`gpuhook check`):
/// from the CDI specs (`driver="cdi"`) or the host (`"host"`); `None` when its request does
/// not ask for it.
pub fn cdi_preview(
    cfg: &Config,
    h: &Holder,
    req: &Request,
    inv: &Inventory,
    gpus: &[Unit],
) -> Result<Option<cdi::Plan>, Error> {
    let specs = node_specs(h, req, inv, gpus)?;
    Ok(cdi_plan(&Facts::host(cfg), h, req, inv, gpus, &specs)?.map(|(p, _)| p))
}

/// What of the host a request reads: with the driver's user space from CDI, every node of
/// every GPU (a spec's device is matched to GPUs by all their nodes, DRM ones included), not
/// only those its capabilities give.
fn scan_for(cfg: &Config, req: &Request) -> Scan {
    let mut s = Scan::for_request(req);
    if wants_driver(cfg, req) == Some(Driver::Cdi) {
        s.caps = None;
    }
    s
}

/// The driver files for the container's units, when its request (or the host default) asks
/// for the driver's user space: the edits of the vendors' CDI specs (`driver="cdi"`) or the
/// running driver's files found on the host (`"host"`; none for AMD or Intel GPUs, whose
/// user space is the image's). `specs`: the nodes gpuhook grants it anyway. A spec's extra
/// nodes come back as node specs owned as `specs` are. An error (no spec, a bad one, one for
/// another driver; no module, no libcuda, a file that may not be given) is one line naming
/// the file.
fn cdi_plan(
    f: &Facts,
    h: &Holder,
    req: &Request,
    inv: &Inventory,
    gpus: &[Unit],
    specs: &[NodeSpec],
) -> Result<Option<(cdi::Plan, Vec<NodeSpec>)>, Error> {
    let Some(driver) = wants_driver(f.cfg, req) else {
        return Ok(None);
    };
    let granted = specs.iter().map(|s| num(s)).collect();
    let Some(plan) = plan_for(f, driver, inv, gpus, &[], granted)? else {
        return Ok(None);
    };
    let extra = owned(h, req, plan.nodes.iter().map(|n| (n.node.clone(), n.mode)))?;
    Ok(Some((plan, extra)))
}

/// The driver user space a request (or the host default) asks for: `cdi` or `host`; `None`
/// for nodes only.
fn wants_driver(cfg: &Config, req: &Request) -> Option<Driver> {
    match req.driver.unwrap_or(cfg.driver) {
        Driver::None => None,
        d => Some(d),
    }
}

fn num(n: &Node) -> (u32, u32) {
    (n.major, n.minor)
}

/// The driver files of `driver` for `gpus`: the CDI specs' edits ([`driver_plan`]), or the
/// host's running NVIDIA driver ([`host_plan`]).
fn plan_for(
    f: &Facts,
    driver: Driver,
    inv: &Inventory,
    gpus: &[Unit],
    holds: &[Unit],
    granted: std::collections::BTreeSet<(u32, u32)>,
) -> Result<Option<cdi::Plan>, Error> {
    match driver {
        Driver::None => Ok(None),
        Driver::Cdi => driver_plan(f, inv, gpus, holds, granted).map(Some),
        Driver::Host => host_plan(f, inv, gpus),
    }
}

/// `driver="host"`: the running NVIDIA driver's files when one of `gpus` is NVIDIA's
/// (found on the host, cached, checked for trust at each call); `None` for AMD and Intel
/// GPUs alone (their nodes are what they get, as with `none`).
fn host_plan(f: &Facts, inv: &Inventory, gpus: &[Unit]) -> Result<Option<cdi::Plan>, Error> {
    if !gpus.iter().any(|u| is_nvidia(inv, u)) {
        return Ok(None);
    }
    let d = (f.host_driver)(f.cfg)?;
    Ok(Some(cdi::host::plan(&d.found, &d.sonames)?))
}

/// Whether a unit is of an NVIDIA GPU.
fn is_nvidia(inv: &Inventory, u: &Unit) -> bool {
    inv.by_unit(u)
        .is_some_and(|g| g.vendor == crate::ids::Vendor::Nvidia)
}

/// The edits of the vendors' CDI specs for `gpus`; `holds`: other units the container holds
/// (their nodes are its own, not another GPU's), `granted`: the nodes it is granted anyway.
fn driver_plan(
    f: &Facts,
    inv: &Inventory,
    gpus: &[Unit],
    holds: &[Unit],
    granted: std::collections::BTreeSet<(u32, u32)>,
) -> Result<cdi::Plan, Error> {
    let cfg = f.cfg;
    let mut units = cdi::Units {
        granted,
        ..Default::default()
    };
    for u in gpus {
        let Some(g) = inv.by_unit(u) else { continue };
        units.vendors.push(g.vendor);
        let own = match inv.mig(u) {
            Some((_, m)) => vec![num(&m.gi_cap), num(&m.ci_cap)],
            None => g.nodes.iter().map(|(_, n)| num(n)).collect(),
        };
        units.own.push(cdi::ChosenUnit {
            id: u.to_string(),
            vendor: g.vendor,
            nodes: own,
        });
    }
    let mine = |u: Unit| gpus.contains(&u) || holds.contains(&u);
    for g in &inv.gpus {
        if !mine(Unit::Gpu(g.pci)) {
            units.foreign.extend(g.nodes.iter().map(|(_, n)| num(n)));
        }
        for m in &g.migs {
            if !mine(m.id(g.pci)) {
                units.foreign.extend([num(&m.gi_cap), num(&m.ci_cap)]);
            }
        }
    }
    let granted = units.granted.clone();
    units.foreign.retain(|n| !granted.contains(n));
    let kinds: Vec<&str> = units.vendors.iter().map(|v| cdi::kind_of(*v)).collect();
    let loaded = (f.cdi_specs)(&cfg.cdi_spec_dirs, &kinds)?;
    let version = std::fs::read_to_string(cfg.proc.join("driver/nvidia/version"))
        .ok()
        .and_then(|t| cdi::nvidia_version(&t));
    let host = cdi::SpecHost {
        foreign_hooks: cfg.cdi_foreign_hooks,
        dev: &cfg.dev,
        nvidia_version: version,
        dirs: &cfg.cdi_spec_dirs,
    };
    Ok(cdi::plan(&loaded, &units, &host)?)
}

/// What a reservation records of the driver files its container gets from `plan`: where
/// they come from (`cdi` or `host`) and the NVIDIA driver version they are of. A plan of an
/// MPS daemon's directories alone records nothing.
fn driver_record(
    cfg: &Config,
    req: &Request,
    plan: Option<&cdi::Plan>,
) -> (Option<Driver>, Option<String>) {
    match plan {
        Some(p) if p.host_driver.is_some() || !p.specs.is_empty() => {
            (wants_driver(cfg, req), p.nvidia_version.clone())
        }
        _ => (None, None),
    }
}

fn as_nodes(specs: &[NodeSpec]) -> Vec<Node> {
    specs.iter().map(|s| s.node.clone()).collect()
}

/// The host ids of the container's root (through its `<idmap>`; unmapped: nobody).
fn root_owner(h: &Holder) -> crate::enter::rootfs::Owner {
    crate::enter::rootfs::Owner {
        uid: h.idmap.host_uid(0).unwrap_or(65534),
        gid: h.idmap.host_gid(0).unwrap_or(65534),
    }
}

/// Runs `f` on the state under its lock (written back only when it changed): for a front
/// door's own bookkeeping that must not race a reserve or a free (its own error type, which
/// says a state that cannot be read or written too).
pub fn with_state<T, E: From<StateError>>(
    cfg: &Config,
    f: impl FnOnce(&mut State) -> Result<T, E>,
) -> Result<T, E> {
    store(cfg).update(f)
}

/// Whether the state's bytes name `id`: a look without lock or parse, for a front door with
/// nothing to do unless the state holds something for it.
pub fn may_hold(cfg: &Config, id: &str) -> bool {
    store(cfg).mentions(id)
}

/// The MPS daemon serving a holder of `units` (if one does), whose directories' mounts are
/// recorded in the holder `id`'s reservation before they are made (their targets and their
/// sources' identity), as the CDI mounts an attach makes are: a detach, even after a
/// SIGKILL, takes them back. Returns the daemon with those records.
fn record_mps_mounts(
    st: &mut State,
    id: &str,
    units: &[Unit],
) -> Result<
    Option<(
        crate::ids::Pci,
        crate::reserve::mps::Daemon,
        Vec<crate::enter::rootfs::Mounted>,
    )>,
    Error,
> {
    let Some((pci, d)) = crate::reserve::mps::daemon_for(st, units) else {
        return Ok(None);
    };
    let d = d.clone();
    let made = crate::reserve::mps::mounts(&d)
        .iter()
        .map(attach::planned)
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(r) = st.reservations.get_mut(id) {
        r.mounts.extend(made.iter().cloned());
    }
    Ok(Some((pci, d, made)))
}

/// The directory of the MPS daemon serving the holder `id`'s slots, if one does
/// ([`crate::reserve::mps::daemon_for`]).
pub fn mps_dir(cfg: &Config, id: &str) -> Option<std::path::PathBuf> {
    let st = store(cfg).read().ok()?;
    let r = st.reservations.get(id)?;
    crate::reserve::mps::daemon_for(&st, &r.gpus).map(|(_, d)| d.dir.clone())
}
