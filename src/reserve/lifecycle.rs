//! The lifecycle of a GPU reservation, whichever front door drives it (the libvirt hook
//! today, the OCI runtime wrapper next): reserve (`prepare`), confirm (`start`), activate
//! (`started`: grants and nodes, undone on failure), re-adopt (`reconnect`), free. A front
//! door turns its own input (domain XML, an OCI bundle) into a [`Holder`] and a [`Request`],
//! says how to find its running container, and maps the results to its own exit codes.

use crate::cdi;
use crate::cgroup::{self, DeviceCgroup};
use crate::enter::container::{self, Container, ContainerError};
use crate::host::config::Config;
use crate::host::inventory::{self, Inventory, Scan};
use crate::host::procfs::{self, ProcRef};
use crate::log;
use crate::node::{NodeSpec, Outcome};
use crate::request::{DeviceSel, Driver, IdMap, Request};
use crate::reserve::alloc;
use crate::reserve::drain;
use crate::reserve::error::Error;
use crate::reserve::state::{now_rfc3339, Node, Phase, Reservation, State, Store};

pub use crate::reserve::state::HolderKind;

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
    crate::reserve::reconcile::stale(
        r,
        &crate::reserve::reconcile::Seen {
            alive: &|p| p.alive(),
            controller: &controller_running,
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
fn reclaim_stale(st: &mut State) -> (Vec<String>, Vec<Reservation>) {
    let stale: Vec<(String, String)> = st
        .reservations
        .iter()
        .filter_map(|(u, r)| stale_reason(r).map(|why| (u.clone(), why)))
        .collect();
    stale
        .into_iter()
        .filter_map(|(u, why)| {
            st.reservations.remove(&u).map(|r| {
                (
                    format!(
                        "reclaimed GPUs {} of {} ({u}): {why}",
                        r.gpus.join(","),
                        r.who()
                    ),
                    r,
                )
            })
        })
        .unzip()
}

/// A reserve that does not fit: reclaims stale reservations (their GPUs that a process still
/// has open become draining) and looks again at the draining GPUs (one pass over `/proc` for
/// both). Returns what was done, for the log, and whether the state changed (the choice is
/// then made again, and a refusal says what holds the GPUs now).
fn reclaim_for(cfg: &Config, st: &mut State, inv: &mut Inventory) -> (Vec<String>, bool) {
    let (mut notes, freed) = reclaim_stale(st);
    let units: Vec<String> = freed.iter().flat_map(|r| r.gpus.clone()).collect();
    inv.settle(cfg, &units);
    let fresh = drain::freed_units(inv, st, &freed);
    let recheck = !st.draining.is_empty();
    if fresh.is_empty() && !recheck {
        return (notes, !freed.is_empty());
    }
    let s = drain::settle(
        st,
        fresh,
        recheck,
        procfs::HOST,
        &now_rfc3339(),
        drain::BUDGET,
    );
    notes.extend(drain::notes(&s));
    (notes, !freed.is_empty() || recheck)
}

/// Whether a reserved unit can still be given: a whole GPU that is usable and not in MIG
/// mode, or a MIG instance that exists on a usable GPU.
fn unit_ok(inv: &Inventory, unit: &str) -> bool {
    if unit.contains('/') {
        inv.mig(unit).is_some_and(|(g, _)| g.usable())
    } else {
        inv.by_pci(unit)
            .is_some_and(|g| g.usable() && g.migs.is_empty())
    }
}

/// Whether an existing reservation still fits the request on this inventory.
fn satisfies(inv: &Inventory, gpus: &[String], req: &Request) -> bool {
    gpus.len() == req.count as usize
        && gpus.iter().all(|p| {
            p.contains('/') == req.mig
                && unit_ok(inv, p)
                && inv
                    .by_pci(p)
                    .is_some_and(|g| alloc::matches(g, &req.filters))
        })
        && req
            .devices
            .iter()
            .all(|sel| alloc::resolve(&inv.gpus, sel).is_some_and(|g| gpus.contains(&g.pci)))
        && req.migs.iter().all(|sel| {
            alloc::resolve(&inv.gpus, &sel.gpu)
                .is_some_and(|g| gpus.contains(&format!("{}/gi{}/ci{}", g.pci, sel.gi, sel.ci)))
        })
}

/// A MIG request looks at GPUs' instances (the driver's details) one GPU at a time, the
/// GPUs it names first, until it knows enough free instances: not at every GPU's.
fn settle_for_migs(cfg: &Config, inv: &mut Inventory, held: &alloc::Held, req: &Request) {
    let named: Vec<String> = req
        .migs
        .iter()
        .filter_map(|m| alloc::resolve(&inv.gpus, &m.gpu).map(|g| g.pci.clone()))
        .collect();
    inv.settle(cfg, &named);
    let free_on = |inv: &Inventory, p: &str| {
        inv.by_pci(p).map_or(0, |g| {
            g.migs
                .iter()
                .filter(|m| alloc::gi_holder(held, &g.pci, m.gi).is_none())
                .count()
        })
    };
    let mut free: usize = named.iter().map(|p| free_on(inv, p)).sum();
    let order: Vec<String> = inv
        .gpus
        .iter()
        .filter(|g| {
            g.vendor == crate::ids::Vendor::Nvidia
                && g.usable()
                && !held.contains_key(&g.pci)
                && !named.contains(&g.pci)
                && alloc::matches(g, &req.filters)
        })
        .map(|g| g.pci.clone())
        .collect();
    for p in order {
        if free >= req.count as usize {
            break;
        }
        inv.settle(cfg, std::slice::from_ref(&p));
        free += free_on(inv, &p);
    }
}

/// `prepare`: reserves GPUs for the holder (or keeps the reservation it has, if it still
/// fits), reclaiming stale reservations only when the request does not fit otherwise. The
/// reservation is abandoned when libvirtd (the hook's parent) is gone with no container.
pub fn reserve(h: &Holder, req: &Request) -> Result<(), Error> {
    reserve_by(&Config::load()?, h, req, procfs::parent()).map(|_| ())
}

/// `create` of an OCI container: reserves as [`reserve`] does, for a process that will
/// become the runtime (the wrapper execs it: when it is gone with no init recorded, the
/// reservation is stale), and returns the nodes the container gets, owned by the request's
/// container-side uid and gid (the runtime makes them), and the reserving process (the
/// token its hooks carry). Nothing is reserved on error. `cfg`: the config the front door
/// already loaded.
pub fn reserve_nodes(
    cfg: &Config,
    h: &Holder,
    req: &Request,
) -> Result<(Prepared, ProcRef), Error> {
    let me = ProcRef::of(std::process::id() as i32)
        .ok_or_else(|| Error::other("cannot read this process's own start time"))?;
    reserve_by(cfg, h, req, Some(me)).map(|n| (n, me))
}

fn reserve_by(
    cfg: &Config,
    h: &Holder,
    req: &Request,
    by: Option<ProcRef>,
) -> Result<Prepared, Error> {
    let mut inv = inventory::scan_with(cfg, scan_for(cfg, req))?;
    let now = now_rfc3339();
    let (gpus, notes, specs) = store(cfg).update(|st| -> Result<_, Error> {
        // A quarantined GPU is given to no one (its Xid is the reason a refusal names).
        crate::reserve::health::apply(&mut inv, st);
        let mut notes = Vec::new();
        if let Some(r) = st.reservations.get(h.id) {
            if r.kind != h.kind {
                return Err(Error::other(format!(
                    "its id {} is already the key of {}'s reservation",
                    h.id,
                    r.who()
                )));
            }
            // A second `create` of a container ID that holds GPUs (an engine's retry, another
            // runtime root, a race) must neither take over nor move a reservation whose
            // container runs or is being created: refused while that init, or that `create`,
            // lives. A stale one is taken over.
            if r.kind == HolderKind::Oci {
                match (r.phase, r.init, r.prepared_by) {
                    (Phase::Running, Some(i), _) if i.alive() => {
                        return Err(Error::other(format!(
                            "a container with this ID already runs with GPUs {} (init {})",
                            r.gpus.join(","),
                            i.pid
                        )))
                    }
                    (Phase::Prepared, _, Some(p)) if Some(p) != by && p.alive() => {
                        return Err(Error::other(format!(
                            "another create of this container ID holds GPUs {} (runtime pid {})",
                            r.gpus.join(","),
                            p.pid
                        )))
                    }
                    _ => {}
                }
            }
        }
        if let Some(r) = st.reservations.get_mut(h.id) {
            inv.settle(cfg, &r.gpus);
            if satisfies(&inv, &r.gpus, req) {
                r.phase = Phase::Prepared;
                r.prepared_by = by;
                r.init = None;
                r.controller = None;
                r.nodes.clear();
                r.domain = h.name.to_string();
                r.request = req.to_string();
                r.updated = now.clone();
                let gpus = r.gpus.clone();
                let specs = prepared_edits(cfg, h, req, &inv, &gpus)?;
                if let Some(r) = st.reservations.get_mut(h.id) {
                    r.nodes = as_nodes(&specs.0);
                    r.mounts.clear();
                }
                return Ok((gpus, notes, specs));
            }
            // Its GPUs are freed for the new choice: one a process still has open drains.
            if let Some(old) = st.reservations.remove(h.id) {
                drain::after_free_on(&mut inv, cfg, st, std::slice::from_ref(&old));
            }
        }
        // Stale reservations (holder gone) are reclaimed only when the request does not fit
        // otherwise: the common path reads no /proc file per reservation.
        // A lazy scan left the NVIDIA driver's details of the chosen GPUs for now: a chosen
        // GPU that turns out unusable (or in MIG mode) is marked, and the choice made again
        // without it.
        if req.mig {
            settle_for_migs(cfg, &mut inv, &st.held(None), req);
        }
        let mut reclaimed = false;
        let gpus = loop {
            let g = match alloc::allocate(&inv.gpus, &st.held(None), req) {
                Ok(g) => g,
                Err(e) => {
                    // Stale reservations (holder gone) are reclaimed, and draining GPUs
                    // looked at again, only when the request does not fit otherwise: the
                    // common path reads no /proc file per reservation.
                    if !reclaimed {
                        reclaimed = true;
                        let (n, changed) = reclaim_for(cfg, st, &mut inv);
                        notes = n;
                        if changed {
                            continue;
                        }
                    }
                    return Err(refusal(cfg, req, st, e, inv.deferred).into());
                }
            };
            inv.settle(cfg, &g);
            if g.iter().all(|p| unit_ok(&inv, p)) {
                break g;
            }
        };
        let specs = prepared_edits(cfg, h, req, &inv, &gpus)?;
        st.reservations.insert(
            h.id.to_string(),
            Reservation {
                kind: h.kind,
                domain: h.name.to_string(),
                uuid: h.id.to_string(),
                gpus: gpus.clone(),
                phase: Phase::Prepared,
                request: req.to_string(),
                created: now.clone(),
                updated: now.clone(),
                prepared_by: by,
                controller: None,
                init: None,
                nodes: as_nodes(&specs.0),
                mounts: Vec::new(),
            },
        );
        Ok((gpus, notes, specs))
    })?;
    for n in notes {
        log::info(&n);
    }
    log::info(&format!(
        "{} ({}): reserved {} for {req}",
        h.who(),
        h.id,
        gpus.join(",")
    ));
    Ok(specs)
}

/// An OCI container's nodes (and CDI edits) are decided at `create` (the runtime makes them
/// from its config); a libvirt domain's at `started`, in the running container — but its
/// CDI specs are checked at `prepare` too, so that a request that cannot get its driver's
/// files reserves nothing.
fn prepared_edits(
    cfg: &Config,
    h: &Holder,
    req: &Request,
    inv: &Inventory,
    gpus: &[String],
) -> Result<Prepared, Error> {
    let cdi = req.driver.unwrap_or(cfg.driver) == Driver::Cdi;
    if h.kind == HolderKind::Libvirt && !cdi {
        return Ok((Vec::new(), None));
    }
    let mut specs = node_specs(h, req, inv, gpus)?;
    let plan = cdi_plan(cfg, h, req, inv, gpus, &specs)?;
    if h.kind == HolderKind::Libvirt {
        return Ok((Vec::new(), plan.map(|p| p.0)));
    }
    let plan = plan.map(|(p, extra)| {
        specs.extend(extra);
        p
    });
    Ok((specs, plan))
}

/// The nodes an OCI container gets, and its CDI edits.
pub type Prepared = (Vec<NodeSpec>, Option<cdi::Plan>);

/// An OCI container's init exists (its `createRuntime` hook): the reservation is running and
/// stale once that init is gone. `by` is the process that reserved it (the hook's token): a
/// hook left from another `create` of the same ID acts on nothing. An error when the
/// container holds no such reservation.
pub fn record_init(h: &Holder, by: ProcRef, init: ProcRef) -> Result<(), Error> {
    let cfg = Config::load()?;
    let now = now_rfc3339();
    let gpus = store(&cfg).update(|st| -> Result<_, Error> {
        let r = st
            .reservations
            .get_mut(h.id)
            .filter(|r| r.kind == h.kind && r.prepared_by == Some(by))
            .ok_or_else(|| {
                Error::other(
                    "holds no GPU reservation made by this create (was it released or reclaimed?)",
                )
            })?;
        r.phase = Phase::Running;
        r.init = Some(init);
        r.updated = now;
        Ok(r.gpus.clone())
    })?;
    log::info(&format!(
        "{}: init {} runs with GPUs {}",
        h.who(),
        init.pid,
        gpus.join(",")
    ));
    Ok(())
}

fn reservation(st: &State, h: &Holder) -> Result<Reservation, Error> {
    st.reservations
        .get(h.id)
        .cloned()
        .ok_or_else(|| Error::other("holds no GPU reservation (did the prepare hook run? is gpuhook installed at libvirtd's start?)"))
}

/// The refusal for a request that does not fit. A lazy scan left out the functions that can
/// be no usable GPU: their reasons belong in the refusal, so the host is looked at whole
/// (only on this path) and the choice made again for its words.
fn refusal(
    cfg: &Config,
    req: &Request,
    st: &State,
    e: alloc::AllocError,
    deferred: usize,
) -> alloc::AllocError {
    // A MIG request looked at the instances of only as many GPUs as it needed.
    if deferred == 0 && !req.mig {
        return e;
    }
    let full = Scan {
        caps: Some(req.capabilities),
        lazy: false,
    };
    match inventory::scan_with(cfg, full) {
        Ok(mut inv) => {
            crate::reserve::health::apply(&mut inv, st);
            alloc::allocate(&inv.gpus, &st.held(None), req)
                .err()
                .unwrap_or(e)
        }
        Err(_) => e,
    }
}

/// `start`: checks that the holder's reservation still stands on this host.
pub fn confirm(h: &Holder, req: &Request) -> Result<(), Error> {
    let cfg = Config::load()?;
    let st = store(&cfg).read()?;
    let r = reservation(&st, h)?;
    let mut inv = inventory::scan_with(&cfg, scan_for(&cfg, req))?;
    crate::reserve::health::apply(&mut inv, &st);
    inv.settle(&cfg, &r.gpus);
    for p in &r.gpus {
        let g = inv
            .by_pci(p)
            .ok_or_else(|| Error::other(format!("reserved GPU {p} is no longer on the host")))?;
        if let Some(why) = &g.problem {
            return Err(Error::other(format!(
                "reserved GPU {p} cannot be used: {why}"
            )));
        }
        if g.excluded {
            return Err(Error::other(format!(
                "reserved GPU {p} is now excluded by the host config"
            )));
        }
        if p.contains('/') && inv.mig(p).is_none() {
            return Err(Error::other(format!(
                "reserved MIG instance {p} no longer exists"
            )));
        }
    }
    Ok(())
}

/// The nodes a container gets for its GPUs, with mode and host-side owner.
fn node_specs(
    h: &Holder,
    req: &Request,
    inv: &Inventory,
    gpus: &[String],
) -> Result<Vec<NodeSpec>, Error> {
    for p in gpus {
        let g = inv
            .by_pci(p)
            .ok_or_else(|| Error::other(format!("reserved GPU {p} is no longer on the host")))?;
        // An instance deleted (or MIG mode left) since: its GPU's node alone would be more.
        if p.contains('/') && inv.mig(p).is_none() {
            return Err(Error::other(format!(
                "reserved MIG instance {p} no longer exists"
            )));
        }
        if g.nodes.is_empty() {
            return Err(Error::other(format!(
                "GPU {p} has no device node: {}",
                g.problem.as_deref().unwrap_or("unknown")
            )));
        }
    }
    let (uid, gid) = h
        .idmap
        .owner(req.uid, req.gid, h.idmap_names())
        .map_err(Error::Other)?;
    Ok(inv
        .nodes_for(gpus, req.capabilities)
        .into_iter()
        .map(|n| NodeSpec {
            mode: req.mode.unwrap_or(n.mode),
            node: n.node,
            uid,
            gid,
        })
        .collect())
}

/// What a container would get from the CDI specs for these GPUs (`gpuhook check`); `None`
/// when its request does not ask for the driver's user space.
pub fn cdi_preview(
    cfg: &Config,
    h: &Holder,
    req: &Request,
    inv: &Inventory,
    gpus: &[String],
) -> Result<Option<cdi::Plan>, Error> {
    let specs = node_specs(h, req, inv, gpus)?;
    Ok(cdi_plan(cfg, h, req, inv, gpus, &specs)?.map(|(p, _)| p))
}

/// What of the host a request reads: with the driver's user space (CDI), every node of every
/// GPU (a spec's device is matched to GPUs by all their nodes, DRM ones included), not only
/// those its capabilities give.
fn scan_for(cfg: &Config, req: &Request) -> Scan {
    let mut s = Scan::for_request(req);
    if req.driver.unwrap_or(cfg.driver) == Driver::Cdi {
        s.caps = None;
    }
    s
}

/// The edits of the vendors' CDI specs for the container's units, when its request (or the
/// host default) asks for the driver's user space (`driver="cdi"`); `specs`: the nodes
/// gpuhook grants it anyway. The spec's extra nodes come back as node specs owned as `specs`
/// are. An error (no spec, a bad one, one for another driver) is one line naming the file.
fn cdi_plan(
    cfg: &Config,
    h: &Holder,
    req: &Request,
    inv: &Inventory,
    gpus: &[String],
    specs: &[NodeSpec],
) -> Result<Option<(cdi::Plan, Vec<NodeSpec>)>, Error> {
    if req.driver.unwrap_or(cfg.driver) != Driver::Cdi {
        return Ok(None);
    }
    let num = |n: &Node| (n.major, n.minor);
    let mut units = cdi::Units {
        granted: specs.iter().map(|s| num(s)).collect(),
        ..Default::default()
    };
    for u in gpus {
        let Some(g) = inv.by_pci(u) else { continue };
        units.vendors.push(g.vendor);
        let own = match inv.mig(u) {
            Some((_, m)) => vec![num(&m.gi_cap), num(&m.ci_cap)],
            None => g.nodes.iter().map(|(_, n)| num(n)).collect(),
        };
        units.own.push(cdi::Unit {
            id: u.clone(),
            vendor: g.vendor,
            nodes: own,
        });
    }
    for g in &inv.gpus {
        if !gpus.contains(&g.pci) {
            units.foreign.extend(g.nodes.iter().map(|(_, n)| num(n)));
        }
        for m in &g.migs {
            if !gpus.contains(&m.id(&g.pci)) {
                units.foreign.extend([num(&m.gi_cap), num(&m.ci_cap)]);
            }
        }
    }
    let granted = units.granted.clone();
    units.foreign.retain(|n| !granted.contains(n));
    let kinds: Vec<&str> = units.vendors.iter().map(|v| cdi::kind_of(*v)).collect();
    let who = |e: String| Error::other(e);
    let loaded = cdi::load(&cfg.cdi_spec_dirs, &kinds).map_err(who)?;
    let version = std::fs::read_to_string(cfg.proc.join("driver/nvidia/version"))
        .ok()
        .and_then(|t| cdi::nvidia_version(&t));
    let host = cdi::Host {
        foreign_hooks: cfg.cdi_foreign_hooks,
        dev: &cfg.dev,
        nvidia_version: version,
        dirs: &cfg.cdi_spec_dirs,
    };
    let plan = cdi::plan(&loaded, &units, &host).map_err(who)?;
    let (uid, gid) = h
        .idmap
        .owner(req.uid, req.gid, h.idmap_names())
        .map_err(Error::Other)?;
    let extra = plan
        .nodes
        .iter()
        .map(|n| NodeSpec {
            node: n.node.clone(),
            mode: req.mode.unwrap_or(n.mode),
            uid,
            gid,
        })
        .collect();
    Ok(Some((plan, extra)))
}

fn as_nodes(specs: &[NodeSpec]) -> Vec<Node> {
    specs.iter().map(|s| s.node.clone()).collect()
}

/// What one `apply` changed, so it can be undone.
struct Applied {
    cg: Box<dyn DeviceCgroup>,
    granted: Vec<Node>,
    created: Vec<NodeSpec>,
    dirs: Vec<String>,
}

/// Grants the nodes in the container's device cgroup, then creates them in its `/dev`.
/// On failure nothing of this call is left behind.
fn apply(ct: &Container, specs: &[NodeSpec]) -> Result<Applied, Error> {
    let mut cg = cgroup::for_container(ct.controller, ct.init.pid)?;
    let granted = cgroup::grant_all(&mut *cg, &as_nodes(specs))?;
    match container::create_nodes(ct, specs) {
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
            })
        }
        Err(e) => Err(with_rollback(
            e.into(),
            &cgroup::revoke_all(&mut *cg, &granted),
        )),
    }
}

/// The error, with what its rollback could not undo said on the same line.
fn with_rollback(e: Error, left: &[String]) -> Error {
    if left.is_empty() {
        e
    } else {
        Error::RollbackIncomplete {
            error: Box::new(e),
            left: left.to_vec(),
        }
    }
}

/// Takes back what `apply` did; returns what could not be undone (empty when all was).
/// A container whose init has exited lost its `/dev` with its mount namespace, and its
/// cgroup goes with it: nothing there is left to undo, whatever failed.
fn undo(ct: &Container, mut a: Applied) -> Vec<String> {
    let mut left = Vec::new();
    if let Err(e) = container::remove_nodes(ct, &a.created, &a.dirs) {
        left.push(format!("nodes: {e}"));
    }
    left.extend(cgroup::revoke_all(&mut *a.cg, &a.granted));
    if ct.init.alive() {
        left
    } else {
        Vec::new()
    }
}

/// `started`: grants the reserved GPUs' nodes in the container's device cgroup and makes
/// them in its `/dev` (undone on failure), then records the container in the state. `find`
/// is how the front door finds its container (libvirt: through the controller).
pub fn activate(
    h: &Holder,
    req: &Request,
    find: impl FnOnce() -> Result<Container, ContainerError>,
) -> Result<(), Error> {
    let cfg = Config::load()?;
    let st = store(&cfg);
    let r = reservation(&st.read()?, h)?;
    let mut inv = inventory::scan_with(&cfg, scan_for(&cfg, req))?;
    inv.settle(&cfg, &r.gpus);
    let ct = find()?;
    let mut specs = node_specs(h, req, &inv, &r.gpus)?;
    let plan = cdi_plan(&cfg, h, req, &inv, &r.gpus, &specs)?.map(|(p, extra)| {
        specs.extend(extra);
        p
    });
    // A failure because the init exited meanwhile says so first: that is the cause an
    // operator needs. The container helper says it as a value; a cgroup that vanished with
    // the init is recognized by looking at the init.
    let applied = apply(&ct, &specs).map_err(|e| match e {
        // The init is gone: so are its cgroup and /dev, and nothing is left to roll back.
        Error::RollbackIncomplete { error, .. }
            if matches!(*error, Error::Container(ContainerError::InitGone { .. })) =>
        {
            *error
        }
        e => e,
    });
    let applied = applied.map_err(|e| match e {
        Error::Container(ContainerError::InitGone { pid, cause }) => Error::other(format!(
            "container init {pid} exited during started{}",
            cause.map(|c| format!(" ({c})")).unwrap_or_default()
        )),
        e if !ct.init.alive() => Error::other(format!(
            "container init {} exited during started ({e})",
            ct.init.pid
        )),
        e => e,
    })?;
    // The driver's files: mounted, linked and cached in the container's root (undone there
    // on failure; then the nodes and grants are undone too).
    let done = match plan
        .as_ref()
        .filter(|p| !p.mounts.is_empty() || p.writes_rootfs())
    {
        Some(p) => match container::inject(&ct, p, root_owner(h)) {
            Ok(d) => Some(d),
            Err(e) => return Err(with_rollback(e.into(), &undo(&ct, applied))),
        },
        None => None,
    };
    let now = now_rfc3339();
    let recorded = st.update(|s| -> Result<(), Error> {
        let cur = s.reservations.get_mut(h.id).ok_or_else(|| {
            Error::other("GPU reservation was released while the container started")
        })?;
        if cur.gpus != r.gpus {
            return Err(Error::other(
                "GPU reservation changed while the container started",
            ));
        }
        cur.phase = Phase::Running;
        cur.controller = Some(ct.controller);
        cur.init = Some(ct.init);
        cur.nodes = as_nodes(&specs);
        cur.mounts = done.as_ref().map(|d| d.mounted.clone()).unwrap_or_default();
        cur.updated = now;
        Ok(())
    });
    if let Err(e) = recorded {
        let mut left = Vec::new();
        if let Some(d) = &done {
            match container::uninject(&ct, d, root_owner(h)) {
                Ok(l) => left.extend(l),
                Err(e) => left.push(format!("driver files: {e}")),
            }
        }
        left.extend(undo(&ct, applied));
        return Err(with_rollback(e, &left));
    }
    if let Some(p) = &plan {
        log_cdi(h, p, done.as_ref());
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

/// The host ids of the container's root (through its `<idmap>`; unmapped: nobody).
fn root_owner(h: &Holder) -> crate::enter::rootfs::Owner {
    crate::enter::rootfs::Owner {
        uid: h.idmap.host_uid(0).unwrap_or(65534),
        gid: h.idmap.host_gid(0).unwrap_or(65534),
    }
}

/// What a libvirt container got from the CDI specs, and what of them gpuhook does not do
/// for libvirt (other hooks: the container's process already runs; its environment).
fn log_cdi(h: &Holder, p: &cdi::Plan, done: Option<&crate::enter::rootfs::Done>) {
    log::info(&format!(
        "{}: driver files from {} ({}): {} mount(s), {} link(s), linker cache {}",
        h.who(),
        p.specs.join(", "),
        p.devices.join(" "),
        done.map_or(0, |d| d.mounted.len()),
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
            "{}: CDI hooks not run for a libvirt container: {}",
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
            "{}: CDI environment not set in a running libvirt container: {}",
            h.who(),
            p.env.join(" ")
        ));
    }
}

/// How [`readopt`] ended; the front door decides what it means for the container (libvirt
/// kills it when it is inconsistent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readopted {
    /// Reservation, grants and nodes are as they should be.
    Consistent,
    /// gpuhook's own files (config, state, inventory) could not be read: logged, and the
    /// running container left alone (stopping it would not fix them).
    LeftAlone,
    /// The container cannot be made consistent (its GPU is another's, its `/dev` refuses a
    /// node, its init is gone).
    Inconsistent,
}

/// `reconnect`: re-adopts a running container's reservation (from its device cgroup when
/// the state lost it), re-grants and re-makes what it lost.
pub fn readopt(
    h: &Holder,
    req: &Request,
    find: impl FnOnce() -> Result<Container, ContainerError>,
) -> Readopted {
    let soft = |what: &str, e: &dyn std::fmt::Display| {
        log::error(&format!(
            "{}: reconnect: {what}: {e}; container left as it is",
            h.who()
        ));
        Readopted::LeftAlone
    };
    let cfg = match Config::load() {
        Ok(c) => c,
        Err(e) => return soft("cannot read the config", &e),
    };
    let mut inv = match inventory::scan_with(&cfg, Scan::FULL) {
        Ok(mut i) => {
            // Reconnect is rare: settle every GPU (adoption looks at all of them).
            let all: Vec<String> = i.gpus.iter().map(|g| g.pci.clone()).collect();
            i.settle(&cfg, &all);
            i
        }
        Err(e) => return soft("cannot read the GPU inventory", &e),
    };
    let fatal = |e: Error| {
        log::error(&format!(
            "{}: reconnect: container cannot be made consistent: {e}",
            h.who()
        ));
        Readopted::Inconsistent
    };
    let ct = match find() {
        Ok(c) => c,
        Err(e) => return fatal(e.into()),
    };
    // What the container's device cgroup grants, read now, before the lock: adoption decides
    // from it under the lock without touching the container (whose /dev could stall us).
    let mut cg = cgroup::for_container(ct.controller, ct.init.pid);
    let granted = match &cg {
        Ok(c) => granted_gpus(&**c, &inv),
        Err(e) => Err(e.to_string()),
    };
    let now = now_rfc3339();
    let mut adopted = None;
    type Decided = Result<
        (
            Vec<String>,
            Vec<NodeSpec>,
            Vec<crate::enter::rootfs::Mounted>,
        ),
        Error,
    >;
    let decided = store(&cfg).update(|st| -> Result<Decided, Error> {
        let (notes, freed) = reclaim_stale(st);
        for n in notes {
            log::info(&n);
        }
        drain::after_free_on(&mut inv, &cfg, st, &freed);
        let gpus = match st.reservations.get(h.id) {
            Some(r) => r.gpus.clone(),
            None => {
                let held = st.held(Some(h.id));
                // A top-up never takes a quarantined GPU.
                let mut healthy = inv.clone();
                crate::reserve::health::apply(&mut healthy, st);
                match granted
                    .as_ref()
                    .map_err(|e| Error::other(e.clone()))
                    .and_then(|g| adopt(req, &healthy, &held, g))
                {
                    Ok((g, ignored)) => {
                        // Access the state does not account for would let two containers
                        // share a GPU: taken away before the lock lets anyone reserve it.
                        // (`granted` came from the cgroup: it is open.)
                        if let Ok(c) = cg.as_mut() {
                            if let Err(e) = deny_left_out(&mut **c, &inv, &ignored, &g) {
                                return Ok(Err(e));
                            }
                        }
                        adopted = Some(ignored);
                        g
                    }
                    Err(e) => return Ok(Err(e)),
                }
            }
        };
        let mut specs = match node_specs(h, req, &inv, &gpus) {
            Ok(s) => s,
            Err(e) => return Ok(Err(e)),
        };
        // The nodes a CDI spec gives come back too (a spec that went bad since is said,
        // and the container keeps what it has).
        match cdi_plan(&cfg, h, req, &inv, &gpus, &specs) {
            Ok(Some((_, extra))) => specs.extend(extra),
            Ok(None) => {}
            Err(e) => log::warn(&format!(
                "{}: reconnect: its CDI spec's nodes are not re-made: {e}",
                h.who()
            )),
        }
        let r = st
            .reservations
            .entry(h.id.to_string())
            .or_insert_with(|| Reservation {
                kind: h.kind,
                domain: h.name.to_string(),
                uuid: h.id.to_string(),
                gpus: gpus.clone(),
                phase: Phase::Running,
                request: req.to_string(),
                created: now.clone(),
                updated: now.clone(),
                prepared_by: None,
                controller: None,
                init: None,
                nodes: vec![],
                mounts: vec![],
            });
        r.phase = Phase::Running;
        r.controller = Some(ct.controller);
        r.init = Some(ct.init);
        r.nodes = as_nodes(&specs);
        r.updated = now.clone();
        Ok(Ok((gpus, specs, r.mounts.clone())))
    });
    let (gpus, specs, mounts) = match decided {
        Err(e) => return soft("cannot update the state", &e),
        Ok(Err(e)) => return fatal(e),
        Ok(Ok(d)) => d,
    };
    if let Some(ignored) = adopted.as_ref().filter(|i| !i.is_empty()) {
        let open = match &cg {
            Ok(c) => still_allowed(&**c, &inv, ignored),
            Err(_) => Vec::new(),
        };
        log::warn(&format!(
            "{}: reconnect: its device cgroup also granted GPU(s) {} beyond what it holds for {req}; access taken away{}",
            h.who(),
            ignored.join(","),
            if open.is_empty() {
                String::new()
            } else {
                format!(
                    " (a wildcard rule of its cgroup still allows {})",
                    open.join(", ")
                )
            }
        ));
    }
    // The driver files mounted at `started`: a container's root may unmount them (its own
    // business); said, never a reason to stop it.
    if !mounts.is_empty() {
        match container::check_mounts(&ct, &mounts) {
            Ok(gone) if gone.is_empty() => {}
            Ok(gone) => log::warn(&format!(
                "{}: reconnect: {} of {} CDI driver mount(s) are no longer in place: {}",
                h.who(),
                gone.len(),
                mounts.len(),
                gone.join(" ")
            )),
            Err(e) => log::warn(&format!(
                "{}: reconnect: cannot check its CDI driver mounts: {e}",
                h.who()
            )),
        }
    }
    match apply(&ct, &specs) {
        Ok(a) => {
            log::info(&format!(
                "{}: reconnect: {} GPUs {}; re-granted {} and re-created {} node(s)",
                h.who(),
                if adopted.is_some() {
                    "re-adopted"
                } else {
                    "kept"
                },
                gpus.join(","),
                a.granted.len(),
                a.created.len()
            ));
            Readopted::Consistent
        }
        Err(e) => fatal(e),
    }
}

/// The GPUs of which the container's device cgroup grants any of their own nodes by an
/// exact rule (an AMD or Intel GPU's render node alone gives compute). The cgroup is kernel
/// state the container cannot widen for itself; the nodes in its `/dev` are not evidence (it
/// can make them), and a wildcard rule names no GPU.
fn granted_gpus(cg: &dyn DeviceCgroup, inv: &Inventory) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for g in &inv.gpus {
        // A GPU in MIG mode: its instances, by their compute instance's capability (the
        // parent's node comes with every instance of it).
        if !g.migs.is_empty() {
            for m in &g.migs {
                if cg
                    .grants_exactly(&m.ci_cap.node)
                    .map_err(|e| e.to_string())?
                {
                    out.push(m.id(&g.pci));
                }
            }
            continue;
        }
        for (_, n) in &g.nodes {
            if cg.grants_exactly(&n.node).map_err(|e| e.to_string())? {
                out.push(g.pci.clone());
                break;
            }
        }
    }
    Ok(out)
}

/// The state lost a running container's reservation: take back the GPUs its device cgroup
/// grants (`granted`), as far as they fit the request and never more than it asks for, and
/// top up to the request's count; or reserve afresh when it has none. GPUs the request names
/// come first, then granted ones fill the other places. A granted GPU that another domain
/// holds cannot be reconciled. Pure: it reads neither the container nor the host. Returns
/// the GPUs and the granted ones it does not hold (their access must be taken away).
fn adopt(
    req: &Request,
    inv: &Inventory,
    held: &alloc::Held,
    granted: &[String],
) -> Result<(Vec<String>, Vec<String>), Error> {
    for p in granted {
        // An instance held, or its GPU held whole; a GPU held whole or by an instance.
        let h = if p.contains('/') {
            held.get(p)
                .or_else(|| held.get(inventory::unit_pci(p)))
                .map(String::as_str)
        } else {
            alloc::busy(held, p)
        };
        if let Some(h) = h {
            return Err(Error::other(format!(
                "it uses GPU {p}, which is reserved by {h}"
            )));
        }
        // Another holder's compute instance of the same GPU instance: they would share it.
        if let Some(((other, h), gi)) = inv
            .mig(p)
            .and_then(|(g, m)| alloc::gi_holder(held, &g.pci, m.gi).map(|x| (x, m.gi)))
        {
            return Err(Error::other(format!(
                "it uses MIG instance {p}, whose GPU instance gi {gi} is reserved by {h} (through {other})"
            )));
        }
    }
    if req.mig {
        let named: Vec<String> = req
            .migs
            .iter()
            .filter_map(|s| {
                alloc::resolve(&inv.gpus, &s.gpu)
                    .map(|g| format!("{}/gi{}/ci{}", g.pci, s.gi, s.ci))
            })
            .collect();
        let room = (req.count as usize).saturating_sub(req.migs.len());
        let mut want = req.clone();
        want.migs.extend(
            granted
                .iter()
                .filter(|p| !named.contains(p))
                .filter_map(|p| inv.mig(p))
                .filter(|(g, _)| g.usable() && alloc::matches(g, &req.filters))
                .take(room)
                .map(|(g, m)| crate::request::MigSel {
                    gpu: DeviceSel::Pci(g.pci.clone()),
                    gi: m.gi,
                    ci: m.ci,
                }),
        );
        let units = alloc::allocate(&inv.gpus, held, &want)?;
        let left_out = granted
            .iter()
            .filter(|p| !units.contains(p))
            .cloned()
            .collect();
        return Ok((units, left_out));
    }
    let named: Vec<&str> = req
        .devices
        .iter()
        .filter_map(|s| alloc::resolve(&inv.gpus, s).map(|g| g.pci.as_str()))
        .collect();
    let room = (req.count as usize).saturating_sub(req.devices.len());
    let fill: Vec<&String> = granted
        .iter()
        .filter(|p| !p.contains('/') && !named.contains(&p.as_str()))
        .filter(|p| {
            inv.by_pci(p)
                .is_some_and(|g| g.usable() && alloc::matches(g, &req.filters))
        })
        .take(room)
        .collect();
    let mut want = req.clone();
    want.devices
        .extend(fill.iter().map(|p| DeviceSel::Pci(p.to_string())));
    let gpus = alloc::allocate(&inv.gpus, held, &want)?;
    let left_out = granted
        .iter()
        .filter(|p| !gpus.contains(p))
        .cloned()
        .collect();
    Ok((gpus, left_out))
}

/// The own nodes of these units: a whole GPU's nodes; a MIG instance's two capabilities
/// (its GPU's node serves every instance of it).
fn own_nodes<'a>(inv: &'a Inventory, gpus: &'a [String]) -> impl Iterator<Item = Node> + 'a {
    gpus.iter().flat_map(move |p| -> Vec<Node> {
        match inv.mig(p) {
            Some((_, m)) => vec![m.gi_cap.node.clone(), m.ci_cap.node.clone()],
            None if p.contains('/') => vec![],
            None => inv
                .by_pci(p)
                .map(|g| g.nodes.iter().map(|(_, n)| n.node.clone()).collect())
                .unwrap_or_default(),
        }
    })
}

/// Takes away the container's access to GPUs it was granted but does not hold: every node of
/// their own (shared control nodes stay). One deny each on the domain cgroup (v1 passes it
/// down to every cgroup below): cheap enough to run under the state lock. An error when one
/// fails (the container cannot then be made consistent).
fn deny_left_out(
    cg: &mut dyn DeviceCgroup,
    inv: &Inventory,
    gpus: &[String],
    kept: &[String],
) -> Result<(), Error> {
    if gpus.is_empty() {
        return Ok(());
    }
    // A GPU instance's capability that a kept compute instance of it still needs stays.
    let keep: Vec<Node> = own_nodes(inv, kept).collect();
    let cannot = |e: &dyn std::fmt::Display| {
        Error::other(format!(
            "its device cgroup grants GPU(s) {} it does not hold, and that access cannot be taken away: {e}",
            gpus.join(",")
        ))
    };
    for node in own_nodes(inv, gpus).filter(|n| !keep.contains(n)) {
        cg.deny(&node).map_err(|e| cannot(&e))?;
    }
    Ok(())
}

/// Which of those GPUs' nodes a rule of the container's cgroup still allows after the deny
/// (a wildcard, `c 226:* rwm`, which an exact deny cannot take back): for the log.
fn still_allowed(cg: &dyn DeviceCgroup, inv: &Inventory, gpus: &[String]) -> Vec<String> {
    own_nodes(inv, gpus)
        .filter(|n| cg.is_allowed(n).unwrap_or(false))
        .map(|n| n.path)
        .collect()
}

/// `stopped`/`release`/`delete`: frees the reservation the state holds under `id` for a
/// holder of this kind (whatever the holder's request says now); returns it, if there was one.
pub fn free(cfg: &Config, kind: HolderKind, id: &str) -> Result<Option<Reservation>, Error> {
    store(cfg).update(|s| {
        let freed = match s.reservations.get(id) {
            Some(r) if r.kind == kind => s.reservations.remove(id),
            _ => None,
        };
        if let Some(r) = &freed {
            drain::after_free(cfg, s, std::slice::from_ref(r));
        }
        Ok::<_, Error>(freed)
    })
}

/// Runs `f` on the state under its lock (written back only when it changed): for a front
/// door's own bookkeeping that must not race a reserve or a free.
pub fn with_state<T>(
    cfg: &Config,
    f: impl FnOnce(&mut State) -> Result<T, Error>,
) -> Result<T, Error> {
    store(cfg).update(f)
}

/// Whether the state's bytes name `id`: a look without lock or parse, for a front door with
/// nothing to do unless the state holds something for it.
pub fn may_hold(cfg: &Config, id: &str) -> bool {
    store(cfg).mentions(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reserve::alloc::tests::{cap_node, dgx, req, with_migs};

    fn pci(i: usize) -> String {
        format!("0000:{:02x}:00.0", 0x10 + i)
    }

    fn pcis(ix: &[usize]) -> Vec<String> {
        ix.iter().map(|i| pci(*i)).collect()
    }

    #[test]
    fn adoption_takes_what_the_cgroup_grants_never_more_than_asked() {
        let inv = Inventory {
            gpus: dgx(),
            controls: vec![],
            deferred: 0,
        };
        let none = alloc::Held::new();
        // Nothing granted: reserve afresh.
        let (g, out) = adopt(&req(2), &inv, &none, &[]).unwrap();
        assert_eq!((g.len(), out.len()), (2, 0));
        // Granted 5 and 6 for a 2-GPU request: those two, whatever is placed better.
        let (g, out) = adopt(&req(2), &inv, &none, &pcis(&[5, 6])).unwrap();
        assert_eq!((g, out), (pcis(&[5, 6]), vec![]));
        // Granted three for a 1-GPU request: one kept, the others to be taken away.
        let (g, out) = adopt(&req(1), &inv, &none, &pcis(&[3, 5, 6])).unwrap();
        assert_eq!((g, out), (pcis(&[3]), pcis(&[5, 6])));
        // Granted one for a 2-GPU request: topped up.
        let (g, out) = adopt(&req(2), &inv, &none, &pcis(&[7])).unwrap();
        assert!(
            g.contains(&pci(7)) && g.len() == 2 && out.is_empty(),
            "{g:?}"
        );
        // Held by another domain: cannot be reconciled.
        let mut held = alloc::Held::new();
        held.insert(pci(5), "domain 'other'".into());
        let e = adopt(&req(1), &inv, &held, &pcis(&[5])).unwrap_err();
        assert!(e.to_string().contains("reserved by domain 'other'"), "{e}");
    }

    /// The state lost a MIG container's reservation: its grants name the instance it uses
    /// (by the compute instance's capability), never another, and a held one is a conflict.
    #[test]
    fn mig_adoption_takes_the_granted_instances() {
        let mut gpus = dgx();
        gpus[0] = with_migs(gpus[0].clone(), &[(1, 0), (2, 0), (7, 0)]);
        let inv = Inventory {
            gpus,
            controls: vec![],
            deferred: 0,
        };
        let unit = |gi: u32| format!("{}/gi{gi}/ci0", pci(0));
        let mut r = req(1);
        r.mig = true;
        let mut held = alloc::Held::new();
        held.insert(unit(1), "domain 'other'".into());
        // It uses gi2: exactly that one, whatever packing would prefer.
        let (g, out) = adopt(&r, &inv, &held, &[unit(2)]).unwrap();
        assert_eq!((g, out), (vec![unit(2)], vec![]));
        // It uses an instance another holds: cannot be reconciled.
        let e = adopt(&r, &inv, &held, &[unit(1)]).unwrap_err();
        assert!(e.to_string().contains("reserved by domain 'other'"), "{e}");
        // Two granted for one asked: one kept, the other's capabilities to take away.
        let (g, out) = adopt(&r, &inv, &held, &[unit(2), unit(7)]).unwrap();
        assert_eq!((g, out), (vec![unit(2)], vec![unit(7)]));
        let gone: Vec<Node> = own_nodes(&inv, &[unit(7)]).collect();
        assert_eq!(
            gone,
            [cap_node(63).node, cap_node(64).node],
            "not the GPU's own node"
        );
        // The GPU held whole by another: its instances are no one else's.
        let mut whole = alloc::Held::new();
        whole.insert(pci(0), "domain 'w'".into());
        assert!(adopt(&r, &inv, &whole, &[unit(2)]).is_err());
    }

    /// The state lost a MIG container's reservation and its cgroup grants a compute instance
    /// of a GPU instance another holder uses: a conflict (they would share its memory and
    /// engines); a top-up never takes such an instance either.
    #[test]
    fn mig_adoption_refuses_a_shared_gpu_instance() {
        let mut gpus = dgx();
        gpus[0] = with_migs(gpus[0].clone(), &[(7, 0), (7, 1), (8, 0)]);
        let inv = Inventory {
            gpus,
            controls: vec![],
            deferred: 0,
        };
        let unit = |gi: u32, ci: u32| format!("{}/gi{gi}/ci{ci}", pci(0));
        let mut r = req(1);
        r.mig = true;
        let mut held = alloc::Held::new();
        held.insert(unit(7, 0), "domain 'other'".into());
        let e = adopt(&r, &inv, &held, &[unit(7, 1)]).unwrap_err();
        assert!(
            e.to_string().contains(&format!(
                "it uses MIG instance {}, whose GPU instance gi 7 is reserved by domain 'other' (through {})",
                unit(7, 1),
                unit(7, 0)
            )),
            "{e}"
        );
        // Nothing granted: a fresh choice is the other GPU instance.
        let (g, _) = adopt(&r, &inv, &held, &[]).unwrap();
        assert_eq!(g, [unit(8, 0)]);
        // Both compute instances of gi 7 granted to one container: its own, adopted.
        r.count = 2;
        let none = alloc::Held::new();
        let (g, out) = adopt(&r, &inv, &none, &[unit(7, 0), unit(7, 1)]).unwrap();
        assert_eq!((g, out), (vec![unit(7, 0), unit(7, 1)], vec![]));
    }

    /// A request naming index 0 with count 2 was topped up with GPU 2 (GPU 1 was held then);
    /// the state is lost: GPU 2 is re-adopted, not GPU 1 (nearer), which would leave GPU 2
    /// granted to the container and free in the state.
    #[test]
    fn adoption_fills_unnamed_places_from_the_grants() {
        let inv = Inventory {
            gpus: dgx(),
            controls: vec![],
            deferred: 0,
        };
        let mut r = req(2);
        r.devices = vec![DeviceSel::Index(0)];
        let (g, out) = adopt(&r, &inv, &alloc::Held::new(), &pcis(&[0, 2])).unwrap();
        assert_eq!((g, out), (pcis(&[0, 2]), vec![]));
        // A granted GPU that does not fit the filters is not adopted, and is reported.
        let mut r = req(1);
        r.filters = vec![crate::request::Filter {
            field: crate::request::Field::Arch,
            op: crate::request::extra_specs::Op::Eq("ampere".into()),
        }];
        let mut inv2 = inv.clone();
        inv2.gpus[4].arch = Some("ampere".into());
        let (g, out) = adopt(&r, &inv2, &alloc::Held::new(), &pcis(&[1])).unwrap();
        assert_eq!((g, out), (pcis(&[4]), pcis(&[1])));
    }
}
