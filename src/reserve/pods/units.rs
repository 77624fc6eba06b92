//! The pool as kubelet sees it: each unit with its resource, device ID, NUMA node and
//! health. Health follows the pool: a unit is healthy when it is free (a stale holder's is:
//! the allocation that needs it reclaims it) or held by a pod's allocation (kubelet already
//! counts it as used); unhealthy while anything else holds it, and while its GPU is
//! quarantined, needs inspection, is being reset, is scrub pending, is draining, has a
//! problem the inventory sees, or is gone from the host.

use super::device::device_id;
use super::profiles::Profiles;
use crate::host::inventory::{Gpu, Inventory};
use crate::ids::Unit;
use crate::reserve::state::{HolderKind, Reservation, State};
use std::collections::BTreeMap;

/// The prefix of every resource gpuhook advertises.
pub const PREFIX: &str = "gpuhook.io/";

/// A resource a pod asks for in its `resources.limits`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    /// `gpuhook.io/gpu`: whole GPUs.
    Gpu,
    /// `gpuhook.io/gpu-shared`: slots of GPUs the config shares.
    Shared,
    /// `gpuhook.io/mig-PROFILE`: MIG compute instances of one profile (`1g.10gb`).
    Mig(String),
}

impl Resource {
    /// Its name as kubelet and pods write it: `gpuhook.io/gpu`, `gpuhook.io/gpu-shared`,
    /// `gpuhook.io/mig-1g.10gb`.
    pub fn name(&self) -> String {
        match self {
            Resource::Gpu => format!("{PREFIX}gpu"),
            Resource::Shared => format!("{PREFIX}gpu-shared"),
            Resource::Mig(p) => format!("{PREFIX}mig-{p}"),
        }
    }

    /// The resource a name is; `None` for a name that is none of gpuhook's (a profile is
    /// letters, digits, `.` and `-`).
    pub fn parse(name: &str) -> Option<Resource> {
        match name.strip_prefix(PREFIX)? {
            "gpu" => Some(Resource::Gpu),
            "gpu-shared" => Some(Resource::Shared),
            rest => {
                let p = rest.strip_prefix("mig-")?;
                super::profiles::profile_ok(p).then(|| Resource::Mig(p.to_string()))
            }
        }
    }

    /// The plugin's socket for it, in kubelet's plugin directory: `gpuhook-gpu.sock`,
    /// `gpuhook-gpu-shared.sock`, `gpuhook-mig-1g.10gb.sock`.
    pub fn socket(&self) -> String {
        match self {
            Resource::Gpu => "gpuhook-gpu.sock".into(),
            Resource::Shared => "gpuhook-gpu-shared.sock".into(),
            Resource::Mig(p) => format!("gpuhook-mig-{p}.sock"),
        }
    }

    /// The resource of a unit: a MIG instance's by its profile (none while its profile is
    /// unknown).
    pub fn of(unit: &Unit, profiles: &Profiles) -> Option<Resource> {
        match unit {
            Unit::Gpu(_) => Some(Resource::Gpu),
            Unit::Slot { .. } => Some(Resource::Shared),
            Unit::Mig { .. } => profiles.of(unit).map(|p| Resource::Mig(p.to_string())),
            Unit::Mdev { .. } => None,
        }
    }
}

/// Healthy or not, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Healthy,
    Unhealthy(String),
}

impl Health {
    /// As kubelet's API writes it.
    pub fn word(&self) -> &'static str {
        match self {
            Health::Healthy => "Healthy",
            Health::Unhealthy(_) => "Unhealthy",
        }
    }
}

/// One unit as `ListAndWatch` gives it: a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advertised {
    pub id: String,
    pub unit: Unit,
    pub numa: Option<u32>,
    pub health: Health,
}

/// Every unit of the pool by resource, each resource's devices in unit order. `inv` is the
/// host (with its GPUs' health applied from `st`: [`crate::reserve::health::apply`]),
/// `stale` why a reservation's holder is gone (its units are then free to take), `seen` the
/// units advertised before, with their resources: those the host no longer has are listed
/// unhealthy, as kubelet must hear (a pod's allocation's units that the host lost are listed
/// so too). Excluded GPUs are not the pool's; a GPU in MIG mode is given as its instances
/// (those whose profile is known), a shared GPU as its slots, any other as itself.
pub fn advertise(
    inv: &Inventory,
    st: &State,
    profiles: &Profiles,
    stale: &dyn Fn(&Reservation) -> Option<String>,
    seen: &BTreeMap<Unit, Resource>,
) -> BTreeMap<Resource, Vec<Advertised>> {
    let mut out: BTreeMap<Resource, Vec<Advertised>> = BTreeMap::new();
    for g in inv.gpus.iter().filter(|g| !g.excluded) {
        for unit in units_of(g) {
            let Some(res) = Resource::of(&unit, profiles) else {
                continue;
            };
            out.entry(res).or_default().push(Advertised {
                id: device_id(&unit),
                unit,
                numa: g.numa_node,
                health: health(g, &unit, st, stale),
            });
        }
    }
    let mut lost: Vec<(Unit, Option<Resource>)> =
        seen.iter().map(|(u, r)| (*u, Some(r.clone()))).collect();
    for r in st.reservations.values() {
        if let Some(p) = r.holder.pod() {
            lost.extend(r.gpus.iter().map(|u| (*u, Resource::parse(&p.resource))));
        }
    }
    for (unit, res) in lost {
        if inv
            .gpus
            .iter()
            .any(|g| !g.excluded && units_of(g).contains(&unit))
        {
            continue;
        }
        let Some(res) = res else { continue };
        let list = out.entry(res).or_default();
        if !list.iter().any(|d| d.unit == unit) {
            list.push(Advertised {
                id: device_id(&unit),
                unit,
                numa: None,
                health: Health::Unhealthy("gone from the host".into()),
            });
        }
    }
    for list in out.values_mut() {
        list.sort_by_key(|d| d.unit);
    }
    out
}

/// The units a GPU is given as.
pub fn units_of(g: &Gpu) -> Vec<Unit> {
    if !g.migs.is_empty() {
        return g.migs.iter().map(|m| m.id(g.pci)).collect();
    }
    match g.sharing {
        Some(sh) => (0..sh.replicas)
            .map(|slot| Unit::Slot { pci: g.pci, slot })
            .collect(),
        None => vec![Unit::Gpu(g.pci)],
    }
}

/// A unit's health: its GPU's state first, then who holds it.
fn health(
    g: &Gpu,
    unit: &Unit,
    st: &State,
    stale: &dyn Fn(&Reservation) -> Option<String>,
) -> Health {
    if let Some(p) = &g.problem {
        return Health::Unhealthy(p.clone());
    }
    let draining = |u: &Unit| st.draining.get(u).map(|d| d.holder(u));
    if let Some(d) = draining(unit).or_else(|| draining(&Unit::Gpu(g.pci))) {
        return Health::Unhealthy(format!("draining: {d}"));
    }
    // The GPU whole, or (MIG) another compute instance of its GPU instance, held by another.
    let mut holders: Vec<&Reservation> = Vec::new();
    if let Some(r) = st.holder_of(unit) {
        holders.push(r);
    }
    if let Unit::Mig { pci, gi, ci } = *unit {
        if let Some(r) = st.holder_of(&Unit::Gpu(pci)) {
            holders.push(r);
        }
        for m in &g.migs {
            let other = Unit::Mig { pci, gi, ci: m.ci };
            if m.gi == gi && m.ci != ci {
                if let Some(r) = st.holder_of(&other) {
                    if st.holder_of(unit).is_none_or(|mine| mine.key() != r.key()) {
                        holders.push(r);
                    }
                }
            }
        }
    }
    for r in holders {
        if r.kind() == HolderKind::Pod && st.holder_of(unit).is_some_and(|m| m.key() == r.key()) {
            continue;
        }
        if stale(r).is_some() && r.kind() != HolderKind::Pod {
            continue;
        }
        return Health::Unhealthy(format!("held by {}", r.who()));
    }
    Health::Healthy
}
