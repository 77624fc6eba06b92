//! The driver's user space a container gets: the vendors' CDI specs' edits
//! (`driver="cdi"`) or the host's running driver (`"host"`), and what a reservation records
//! of them.

use super::holder::Holder;
use super::nodes::{node_specs, owned};
use crate::cdi;
use crate::host::config::Config;
use crate::host::inventory::{Inventory, Scan};
use crate::ids::Unit;
use crate::node::NodeSpec;
use crate::request::{Driver, Request};
use crate::reserve::error::Error;
use crate::reserve::state::Node;
use crate::reserve::world::World;

/// What a container gets for its units: the nodes it is granted and has made, and the plan of
/// its driver's user space (`None`: its request asks for none).
#[derive(Debug, Default)]
pub struct Given {
    pub nodes: Vec<NodeSpec>,
    pub plan: Option<cdi::Plan>,
}

/// What a container gets for `gpus`, in the one order every step puts it together (`prepare`,
/// `started`, `gpuhook check`; `reconnect` through [`with_plan`]): the units' node specs, then
/// the plan of the driver's user space its request (or the host default) asks for
/// ([`cdi_plan`]: the vendors' CDI specs, or the host's running driver), then that plan's
/// extra nodes, owned as the units' are.
pub(super) fn given(
    f: &World,
    h: &Holder,
    req: &Request,
    inv: &Inventory,
    gpus: &[Unit],
) -> Result<Given, Error> {
    with_plan(f, h, req, inv, gpus, node_specs(h, req, inv, gpus)?)
}

/// `nodes` (the units' node specs, and what else the step grants), then the driver's plan for
/// the units, whose extra nodes join them.
pub(super) fn with_plan(
    f: &World,
    h: &Holder,
    req: &Request,
    inv: &Inventory,
    gpus: &[Unit],
    mut nodes: Vec<NodeSpec>,
) -> Result<Given, Error> {
    let plan = cdi_plan(f, h, req, inv, gpus, &nodes)?.map(|(p, extra)| {
        nodes.extend(extra);
        p
    });
    Ok(Given { nodes, plan })
}

/// What a container would get of the driver's user space for these GPUs (`gpuhook check`):
/// from the CDI specs (`driver="cdi"`) or the host (`"host"`); `None` when its request does
/// not ask for it.
pub fn cdi_preview(
    f: &World,
    h: &Holder,
    req: &Request,
    inv: &Inventory,
    gpus: &[Unit],
) -> Result<Option<cdi::Plan>, Error> {
    Ok(given(f, h, req, inv, gpus)?.plan)
}

/// What of the host a request reads: with the driver's user space from CDI, every node of
/// every GPU (a spec's device is matched to GPUs by all their nodes, DRM ones included), not
/// only those its capabilities give.
pub(super) fn scan_for(cfg: &Config, req: &Request) -> Scan {
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
    f: &World,
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
/// for nodes only. The one place the effective driver is decided.
pub(super) fn wants_driver(cfg: &Config, req: &Request) -> Option<Driver> {
    match req.driver.unwrap_or(cfg.driver) {
        Driver::None => None,
        d => Some(d),
    }
}

pub(super) fn num(n: &Node) -> (u32, u32) {
    (n.major, n.minor)
}

/// The driver files of `driver` for `gpus`: the CDI specs' edits ([`driver_plan`]), or the
/// host's running NVIDIA driver ([`host_plan`]).
pub(super) fn plan_for(
    f: &World,
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
pub(super) fn host_plan(
    f: &World,
    inv: &Inventory,
    gpus: &[Unit],
) -> Result<Option<cdi::Plan>, Error> {
    if !gpus.iter().any(|u| is_nvidia(inv, u)) {
        return Ok(None);
    }
    let d = (f.host_driver)(f.cfg)?;
    Ok(Some(cdi::host::plan(&d.found, &d.sonames)?))
}

/// Whether a unit is of an NVIDIA GPU.
pub(super) fn is_nvidia(inv: &Inventory, u: &Unit) -> bool {
    inv.by_unit(u)
        .is_some_and(|g| g.vendor == crate::ids::Vendor::Nvidia)
}

/// The edits of the vendors' CDI specs for `gpus`; `holds`: other units the container holds
/// (their nodes are its own, not another GPU's), `granted`: the nodes it is granted anyway.
pub(super) fn driver_plan(
    f: &World,
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
pub(super) fn driver_record(
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
