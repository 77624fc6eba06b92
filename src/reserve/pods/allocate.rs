//! kubelet's `Allocate`: the units it names reserved in the pool at once for a pod (holder
//! kind `pod`, pending until a container is created with them), each container's request an
//! allocation of its own, all or nothing; or refused in one line naming who took a unit
//! since kubelet last heard it was free. A unit held by another pod's allocation is taken
//! over (kubelet gives a unit to a new pod only when the old one no longer holds it by its
//! own books), unless that allocation's container still runs. And `GetPreferredAllocation`:
//! gpuhook's own choice among the units kubelet offers.

use super::device::{device_id, new_alloc_id, unit_of};
use super::error::PodError;
use super::profiles::Profiles;
use super::units::{units_of, Resource};
use crate::host::charlink::host_node;
use crate::host::inventory::{Inventory, Scan};
use crate::ids::{Unit, Vendor};
use crate::log;
use crate::request::{Capabilities, Driver, Request};
use crate::reserve::lifecycle::holder::{new_reservation, Holder};
use crate::reserve::lifecycle::prepare::unit_ok;
use crate::reserve::reconcile::{reclaim_stale, stale_on};
use crate::reserve::state::{now_rfc3339, Alias, HolderKey, HolderKind, PodOf, State, Store};
use crate::reserve::world::World;

/// One container's allocation: its ID (the `gpuhook.io/allocation` annotation's value), its
/// units, the device nodes it gets (container path, host path), and the driver's files as
/// CDI device names (where the config sets a driver).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocated {
    pub alloc: String,
    pub units: Vec<Unit>,
    pub nodes: Vec<(String, String)>,
    pub cdi: Vec<String>,
}

/// The nodes a pod's container gets with its units: the capabilities of a request that says
/// nothing (`compute,utility`).
fn caps() -> Capabilities {
    Request::default().capabilities
}

/// `Allocate` for `resource`: each of `requests` (one per container, its device IDs) gets an
/// allocation of its own; all or none. `profiles` names the MIG instances' resources.
pub fn allocate(
    f: &World,
    resource: &Resource,
    requests: &[Vec<String>],
    profiles: &Profiles,
) -> Result<Vec<Allocated>, PodError> {
    let name = resource.name();
    let wanted = parse_requests(&name, resource, requests, profiles)?;
    let all: Vec<Unit> = wanted.iter().flatten().copied().collect();
    let lazy = Scan {
        caps: None,
        lazy: true,
    };
    let mut inv = (f.scan)(f.cfg, lazy).map_err(crate::reserve::error::Error::from)?;
    inv.settle(f.cfg, &all);
    let ids: Vec<String> = wanted
        .iter()
        .map(|_| new_alloc_id().map_err(PodError::Random))
        .collect::<Result<_, _>>()?;
    let now = now_rfc3339();
    let made = Store::new(&f.cfg.state_file).update(|st| -> Result<_, PodError> {
        crate::reserve::health::apply(&mut inv, st);
        let (notes, gone) = make_room(f, st, &mut inv, &name, &all)?;
        for (units, alloc) in wanted.iter().zip(&ids) {
            // An allocation whose units all went to this one lives on as its alias.
            let aliases: Vec<Alias> = gone
                .iter()
                .filter(|(old, _)| old.units.iter().all(|u| units.contains(u)))
                .flat_map(|(old, theirs)| {
                    std::iter::once(old.clone()).chain(theirs.iter().cloned())
                })
                .collect();
            let h = Holder::pod(
                alloc,
                PodOf {
                    resource: name.clone(),
                    aliases,
                    ..PodOf::default()
                },
            );
            let mut r = new_reservation(&h, &Request::default(), units, &now);
            r.request = format!(
                "{name}: {}",
                units.iter().map(device_id).collect::<Vec<_>>().join(",")
            );
            st.insert(r);
        }
        let mut notes = notes;
        notes.extend(
            crate::reserve::mps::claim(f.cfg, f.mps, f.proc, st, &inv, &all)
                .map_err(crate::reserve::error::Error::from)?,
        );
        Ok(notes)
    })?;
    let keys: Vec<HolderKey> = ids
        .iter()
        .map(|a| Holder::pod(a, PodOf::default()).key)
        .collect();
    let undo = |st: &mut State| {
        for k in &keys {
            st.reservations.remove(k);
        }
    };
    let up = crate::reserve::mps::bring_up(f.cfg, f.mps, f.proc, &inv, &all, &undo)
        .map_err(crate::reserve::error::Error::from)?;
    for n in made.iter().chain(&up.notes) {
        log::info(n);
    }
    let out: Vec<Allocated> = wanted
        .into_iter()
        .zip(ids)
        .map(|(units, alloc)| {
            // The log (readable by more than root) shows the ID's head only: the whole ID
            // is the key to the pod's units.
            log::info(&format!(
                "kubelet: {name}: allocation {} reserves {} for a pod",
                Holder::pod(&alloc, PodOf::default()).id.shown_name(),
                units.iter().map(device_id).collect::<Vec<_>>().join(",")
            ));
            Allocated {
                nodes: nodes_of(f, &inv, &units),
                cdi: cdi_names(f.cfg.driver, &inv, &units),
                units,
                alloc,
            }
        })
        .collect();
    Ok(out)
}

/// Each container's device IDs as units of `resource`; an ID twice, an ID of no unit of the
/// resource, or two slots of one GPU for a container are refused.
fn parse_requests(
    name: &str,
    resource: &Resource,
    requests: &[Vec<String>],
    profiles: &Profiles,
) -> Result<Vec<Vec<Unit>>, PodError> {
    // Sets, not lists: kubelet's request is input (a 4 MiB message carries ~10^5 IDs).
    let mut seen: std::collections::BTreeSet<Unit> = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for ids in requests {
        let mut units = Vec::new();
        for id in ids {
            let unit = unit_of(id)
                .filter(|u| Resource::of(u, profiles).as_ref() == Some(resource))
                .ok_or_else(|| PodError::UnknownDevice {
                    resource: name.to_string(),
                    id: id.clone(),
                })?;
            if !seen.insert(unit) {
                return Err(PodError::Twice {
                    resource: name.to_string(),
                    id: id.clone(),
                });
            }
            units.push(unit);
        }
        units.sort();
        let mut per_gpu: std::collections::BTreeMap<_, usize> = std::collections::BTreeMap::new();
        for u in units.iter().filter(|u| u.is_slot()) {
            *per_gpu.entry(u.pci()).or_default() += 1;
        }
        let slots_of_one: Vec<Unit> = units
            .iter()
            .filter(|u| u.is_slot() && per_gpu.get(&u.pci()).is_some_and(|n| *n > 1))
            .copied()
            .collect();
        if !slots_of_one.is_empty() {
            return Err(PodError::TwoSlots {
                resource: name.to_string(),
                units: slots_of_one,
            });
        }
        out.push(units);
    }
    Ok(out)
}

/// A pod's allocation that gave up every unit it held: it (its ID and units), and its own
/// aliases.
type Gone = (Alias, Vec<Alias>);

/// Makes `units` free to reserve, or refuses: each must be on the host and usable, not
/// draining; a pod's allocation holding it gives it up (removed once it holds nothing), unless
/// its container lives; a stale holder's is reclaimed; anyone else's is refused, naming them.
/// A MIG instance also needs its GPU instance free of other holders. Returns what was done,
/// for the log, and the pod allocations that gave up all they held.
fn make_room(
    f: &World,
    st: &mut State,
    inv: &mut Inventory,
    name: &str,
    units: &[Unit],
) -> Result<(Vec<String>, Vec<Gone>), PodError> {
    let mut notes = Vec::new();
    let mut gone: Vec<Gone> = Vec::new();
    // What each pod allocation held before this request took from it.
    let mut held_before: std::collections::BTreeMap<HolderKey, Vec<Unit>> = Default::default();
    let stale_others = units.iter().any(|u| {
        holders_of(st, inv, u).iter().any(|k| {
            st.reservations[k].kind() != HolderKind::Pod
                && stale_on(&st.reservations[k], f.proc, f.controller_running).is_some()
        })
    });
    if stale_others {
        let (n, freed) = reclaim_stale(f.proc, f.controller_running, st);
        notes.extend(n);
        crate::reserve::drain::after_free_in(inv, f.cfg, st, &freed, f.proc);
    }
    for u in units {
        let id = device_id(u);
        usable(st, inv, name, u)?;
        for k in holders_of(st, inv, u) {
            let r = &st.reservations[&k];
            if r.kind() != HolderKind::Pod {
                return Err(PodError::Taken {
                    resource: name.to_string(),
                    id,
                    holder: r.holder.who_exactly(),
                });
            }
            let found = r.found(|p| f.proc.alive(p), None);
            if found.live {
                return Err(PodError::InUse {
                    resource: name.to_string(),
                    id,
                    holder: r.who(),
                    container: r
                        .holder
                        .pod()
                        .and_then(|p| p.container.clone())
                        .unwrap_or_default(),
                });
            }
            let r = st.reservations.get_mut(&k).expect("listed");
            held_before
                .entry(k.clone())
                .or_insert_with(|| r.gpus.clone());
            r.gpus.retain(|x| x.pci() != u.pci() || !same_place(x, u));
            notes.push(format!(
                "kubelet: {name}: device {id} taken over from {} (kubelet gave it anew)",
                r.holder.who_exactly()
            ));
            if r.gpus.is_empty() {
                let old = st.reservations.remove(&k).expect("listed");
                gone.push((
                    Alias {
                        alloc: old.holder.name().to_string(),
                        units: held_before.remove(&k).unwrap_or_default(),
                    },
                    old.holder
                        .pod()
                        .map(|p| p.aliases.clone())
                        .unwrap_or_default(),
                ));
            } else if r.phase == crate::reserve::state::Phase::Running {
                // Its container is gone: what is left goes back to its pod, pending.
                r.to_pending(&now_rfc3339());
            }
        }
    }
    Ok((notes, gone))
}

/// `u` is on the host as a unit of its own, usable, not excluded, not draining; else the
/// refusal.
fn usable(st: &State, inv: &Inventory, name: &str, u: &Unit) -> Result<(), PodError> {
    let id = device_id(u);
    let refuse_unusable = |why: String| PodError::Unusable {
        resource: name.to_string(),
        id: id.clone(),
        why,
    };
    let gone = || PodError::Gone {
        resource: name.to_string(),
        id: id.clone(),
    };
    let g = inv.by_unit(u).ok_or_else(gone)?;
    if !units_of(g).contains(u) {
        return Err(gone());
    }
    if let Some(p) = &g.problem {
        return Err(refuse_unusable(p.clone()));
    }
    if g.excluded || !unit_ok(inv, u) {
        return Err(refuse_unusable("excluded by the host config".into()));
    }
    for d in [*u, Unit::Gpu(u.pci())] {
        if let Some(dr) = st.draining.get(&d) {
            return Err(refuse_unusable(format!("draining: {}", dr.holder(&d))));
        }
    }
    Ok(())
}

/// Whether `x`, held, stands in the way of `u` (a unit of the same GPU): the same unit, the
/// GPU whole (held, or asked for: any unit of it is in the way), a VM's mediated device
/// (while one is held no one but VMs' mediated devices gets the GPU), or (MIG) another
/// compute instance of its GPU instance.
fn same_place(x: &Unit, u: &Unit) -> bool {
    x == u
        || matches!(x, Unit::Gpu(_) | Unit::Mdev { .. })
        || matches!(u, Unit::Gpu(_))
        || (x.is_mig() && u.is_mig() && x.gi() == u.gi())
}

/// The keys of the reservations that stand in the way of `u` ([`same_place`]).
fn holders_of(st: &State, inv: &Inventory, u: &Unit) -> Vec<HolderKey> {
    let _ = inv;
    let mut v: Vec<HolderKey> = st
        .reservations
        .iter()
        .filter(|(_, r)| {
            r.gpus
                .iter()
                .any(|x| x.pci() == u.pci() && same_place(x, u))
        })
        .map(|(k, _)| k.clone())
        .collect();
    v.dedup();
    v
}

/// The device nodes a container holding `units` gets, as kubelet's `DeviceSpec`s carry them:
/// the path in the container, and the host's node (under the config's device root).
fn nodes_of(f: &World, inv: &Inventory, units: &[Unit]) -> Vec<(String, String)> {
    inv.nodes_for(units, caps())
        .into_iter()
        .filter_map(|n| {
            let host = host_node(&f.cfg.dev, &n.path)?;
            Some((n.path.clone(), host.display().to_string()))
        })
        .collect()
}

/// The driver's files as CDI device names, where the config's `driver` is `host` or `cdi`:
/// NVIDIA's kind, each GPU by its UUID (else its index), a MIG instance by `INDEX:GI` (as
/// `gpuhook cdi generate` and NVIDIA's generator name them). None for other vendors.
pub fn cdi_names(driver: Driver, inv: &Inventory, units: &[Unit]) -> Vec<String> {
    if driver == Driver::None {
        return Vec::new();
    }
    let mut out: Vec<String> = Vec::new();
    for u in units {
        let Some(g) = inv.by_unit(u).filter(|g| g.vendor == Vendor::Nvidia) else {
            continue;
        };
        let dev = match (u, &g.uuid) {
            (Unit::Mig { gi, .. }, _) => format!("{}:{gi}", g.index),
            (_, Some(uuid)) => uuid.clone(),
            (_, None) => g.index.to_string(),
        };
        let name = format!("{}={dev}", crate::cdi::kind_of(Vendor::Nvidia));
        if !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// `GetPreferredAllocation`: `size` of the `available` device IDs of `resource`, with every
/// one of `must`, chosen as gpuhook chooses for any request (topology: one NUMA node, then
/// one PCI parent; slots on the least used GPUs, one per GPU), among the units the pool has
/// free now. IDs it cannot use are left out; when the choice cannot be made, the first
/// `size` available (kubelet's own default).
pub fn preferred(
    inv: &Inventory,
    st: &State,
    resource: &Resource,
    available: &[String],
    must: &[String],
    size: usize,
) -> Vec<String> {
    let fallback = || {
        let mut v: Vec<String> = must.to_vec();
        v.extend(available.iter().filter(|a| !must.contains(a)).cloned());
        v.truncate(size);
        v
    };
    if size <= must.len() {
        return fallback();
    }
    let offered: Vec<Unit> = available.iter().filter_map(|a| unit_of(a)).collect();
    let must_units: Vec<Unit> = must.iter().filter_map(|a| unit_of(a)).collect();
    // Everything not offered counts as held: the chooser then picks among the offer.
    let mut held = st.held(None);
    for g in &inv.gpus {
        for u in units_of(g) {
            if !offered.contains(&u) || must_units.contains(&u) {
                held.entry(u).or_insert_with(|| "kubelet".into());
            }
        }
    }
    let mut req = Request {
        count: (size - must_units.len()) as u32,
        ..Request::default()
    };
    match resource {
        Resource::Gpu => {}
        Resource::Shared => req.share = true,
        Resource::Mig(_) => req.mig = true,
    }
    let gpus: Vec<crate::host::inventory::Gpu> = inv
        .gpus
        .iter()
        .filter(|g| g.usable() && !g.excluded)
        .cloned()
        .collect();
    let sharing: Vec<crate::ids::Pci> = must_units.iter().map(Unit::pci).collect();
    match crate::reserve::alloc::allocate_beside(&gpus, &held, &req, &sharing) {
        Ok(units) => {
            let mut v: Vec<String> = must.to_vec();
            v.extend(units.iter().map(device_id));
            v.truncate(size);
            v
        }
        Err(_) => fallback(),
    }
}
