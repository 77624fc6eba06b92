//! Whole GPUs: the ones a request names, then the best placed free ones.

use super::error::{AllocError, WhyNoGpu};
use super::held::{busy, mdev_holder, slots_of, Held};
use super::migs::allocate_migs;
use super::place::{near, place};
use super::select::{matches, matches_named, resolve, usable_named};
use super::slots::allocate_slots;
use crate::host::inventory::Gpu;
use crate::ids::{Pci, Unit};
use crate::request::{Request, Wording};

/// Chooses `req.count` GPUs (or MIG instances, for a MIG request). Returns their units in
/// index order.
pub fn allocate(gpus: &[Gpu], held: &Held, req: &Request) -> Result<Vec<Unit>, AllocError> {
    allocate_beside(gpus, held, req, &[])
}

/// [`allocate`] for a holder that already holds slots of the GPUs `sharing` (an attach): a
/// shared request gets none of theirs (one holder, one slot of a GPU).
pub fn allocate_beside(
    gpus: &[Gpu],
    held: &Held,
    req: &Request,
    sharing: &[Pci],
) -> Result<Vec<Unit>, AllocError> {
    if req.mig {
        return allocate_migs(gpus, held, req);
    }
    if req.share {
        return allocate_slots(gpus, held, req, sharing);
    }
    let mut chosen: Vec<&Gpu> = Vec::new();
    for sel in &req.devices {
        let g = resolve(gpus, sel).ok_or_else(|| AllocError::NoGpu { sel: sel.clone() })?;
        if chosen.iter().any(|c| c.pci == g.pci) {
            return Err(AllocError::NamedTwice {
                sel: sel.clone(),
                pci: g.pci,
            });
        }
        usable_named(g, sel)?;
        if let Some(sh) = g.sharing {
            return Err(AllocError::Shareable {
                pci: g.pci,
                sel: sel.clone(),
                replicas: sh.replicas,
                wording: Wording::Xml,
            });
        }
        if let Some(h) = busy(held, g.pci) {
            return Err(AllocError::Held {
                pci: g.pci,
                sel: sel.clone(),
                holder: h.to_string(),
            });
        }
        matches_named(g, sel, req)?;
        chosen.push(g);
    }
    let want = req.count as usize - chosen.len();
    let candidates: Vec<&Gpu> = gpus
        .iter()
        .filter(|g| {
            g.usable()
                && g.migs.is_empty()
                && g.sharing.is_none()
                && busy(held, g.pci).is_none()
                && matches(g, &req.filters)
        })
        .filter(|g| !chosen.iter().any(|c| c.pci == g.pci))
        .collect();
    if candidates.len() < want {
        return Err(shortage(gpus, held, req, chosen.len() + candidates.len()));
    }
    let extra = if chosen.is_empty() {
        place(&candidates, want)
    } else {
        near(&candidates, chosen[0], want)
    };
    chosen.extend(extra);
    chosen.sort_by_key(|g| g.index);
    Ok(chosen.into_iter().map(|g| Unit::Gpu(g.pci)).collect())
}

fn shortage(gpus: &[Gpu], held: &Held, req: &Request, free: usize) -> AllocError {
    let matching: Vec<&Gpu> = gpus.iter().filter(|g| matches(g, &req.filters)).collect();
    let mut why = Vec::new();
    // Held whole, or as slots (a GPU whose sharing was taken out of the config while held),
    // or by VMs' mediated devices.
    let held_by = |g: &Gpu| {
        held.get(&Unit::Gpu(g.pci))
            .map(String::as_str)
            .or_else(|| slots_of(held, g.pci).next().map(|(_, h)| h))
            .or_else(|| mdev_holder(held, g.pci))
    };
    let mut holders: Vec<&str> = matching.iter().filter_map(|g| held_by(g)).collect();
    holders.dedup();
    let n_held = matching.iter().filter(|g| held_by(g).is_some()).count();
    if n_held > 0 {
        why.push(WhyNoGpu::Held {
            count: n_held,
            holders: holders.into_iter().map(str::to_owned).collect(),
        });
    }
    let n_excl = matching.iter().filter(|g| g.excluded).count();
    if n_excl > 0 {
        why.push(WhyNoGpu::Excluded(n_excl));
    }
    let n_mig = matching
        .iter()
        .filter(|g| !g.migs.is_empty() && !held.contains_key(&Unit::Gpu(g.pci)))
        .count();
    if n_mig > 0 {
        why.push(WhyNoGpu::InMigMode {
            count: n_mig,
            wording: Wording::Xml,
        });
    }
    let n_shared = matching
        .iter()
        .filter(|g| {
            g.sharing.is_some() && g.migs.is_empty() && !held.contains_key(&Unit::Gpu(g.pci))
        })
        .count();
    if n_shared > 0 {
        why.push(WhyNoGpu::Shared {
            count: n_shared,
            wording: Wording::Xml,
        });
    }
    let unusable: Vec<&&Gpu> = matching
        .iter()
        .filter(|g| !g.excluded && g.problem.is_some())
        .collect();
    if let Some(first) = unusable.first() {
        why.push(WhyNoGpu::Unusable {
            count: unusable.len(),
            first: first.pci,
            problem: first.problem.clone().unwrap_or_default(),
        });
    }
    AllocError::Shortage {
        req: Box::new(req.clone()),
        free,
        matching: matching.len(),
        why,
    }
}
