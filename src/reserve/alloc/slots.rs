//! Slots of shared GPUs (docs/guides/sharing.md): one slot of a GPU each.

use super::error::{AllocError, WhyNoSlot};
use super::held::{sharers, slots_of, whole_or_mig_holder, Held};
use super::select::{matches, matches_named, resolve, usable_named};
use crate::host::inventory::Gpu;
use crate::ids::{Pci, Unit};
use crate::request::{Request, Wording};

/// The lowest free slot of a shared GPU, if it has one.
pub(super) fn free_slot(g: &Gpu, held: &Held) -> Option<Unit> {
    let replicas = g.sharing?.replicas;
    let used: Vec<u32> = slots_of(held, g.pci).map(|(s, _)| s).collect();
    // Counted, not only numbered: slots held past `replicas` (the config lowered it while
    // they were held) count against it.
    if used.len() >= replicas as usize {
        return None;
    }
    (0..replicas)
        .find(|s| !used.contains(s))
        .map(|slot| Unit::Slot { pci: g.pci, slot })
}

/// Chooses `req.count` slots of shared GPUs (docs/guides/sharing.md), each on a different GPU: the
/// GPUs the request names, then, among the usable, matching shared GPUs with a free slot, the
/// one with the fewest slots in use first (then the lowest index). Never a GPU in MIG mode
/// (MIG instances are never shared) nor one someone holds whole. Returns the slots in the
/// GPUs' index order.
pub fn allocate_slots(
    gpus: &[Gpu],
    held: &Held,
    req: &Request,
    sharing: &[Pci],
) -> Result<Vec<Unit>, AllocError> {
    let mut chosen: Vec<(&Gpu, Unit)> = Vec::new();
    for sel in &req.devices {
        let g = resolve(gpus, sel).ok_or_else(|| AllocError::NoGpu { sel: sel.clone() })?;
        if sharing.contains(&g.pci) {
            return Err(AllocError::SharesAlready {
                pci: g.pci,
                sel: sel.clone(),
            });
        }
        if chosen.iter().any(|(c, _)| c.pci == g.pci) {
            return Err(AllocError::NamedTwice {
                sel: sel.clone(),
                pci: g.pci,
            });
        }
        usable_named(g, sel)?;
        let Some(sh) = g.sharing else {
            return Err(AllocError::NotShareable {
                pci: g.pci,
                sel: sel.clone(),
                wording: Wording::Xml,
            });
        };
        if let Some(h) = whole_or_mig_holder(held, g.pci) {
            return Err(AllocError::Held {
                pci: g.pci,
                sel: sel.clone(),
                holder: h.to_string(),
            });
        }
        let Some(slot) = free_slot(g, held) else {
            return Err(AllocError::SlotsFull {
                pci: g.pci,
                sel: sel.clone(),
                replicas: sh.replicas,
                holders: sharers(held, g.pci),
            });
        };
        matches_named(g, sel, req)?;
        chosen.push((g, slot));
    }
    let want = req.count as usize - chosen.len();
    let mut candidates: Vec<(usize, &Gpu, Unit)> = gpus
        .iter()
        .filter(|g| {
            g.usable()
                && g.migs.is_empty()
                && g.sharing.is_some()
                && whole_or_mig_holder(held, g.pci).is_none()
                && matches(g, &req.filters)
                && !sharing.contains(&g.pci)
                && !chosen.iter().any(|(c, _)| c.pci == g.pci)
        })
        .filter_map(|g| free_slot(g, held).map(|s| (slots_of(held, g.pci).count(), g, s)))
        .collect();
    if candidates.len() < want {
        return Err(slot_shortage(
            gpus,
            held,
            req,
            chosen.len() + candidates.len(),
            sharing,
        ));
    }
    candidates.sort_by_key(|(used, g, _)| (*used, g.index));
    chosen.extend(candidates.into_iter().take(want).map(|(_, g, s)| (g, s)));
    chosen.sort_by_key(|(g, _)| g.index);
    Ok(chosen.into_iter().map(|(_, s)| s).collect())
}

/// they are), which are unusable, and how many matching GPUs are not shared at all.
fn slot_shortage(
    gpus: &[Gpu],
    held: &Held,
    req: &Request,
    free: usize,
    sharing: &[Pci],
) -> AllocError {
    let matching: Vec<&Gpu> = gpus.iter().filter(|g| matches(g, &req.filters)).collect();
    let shared: Vec<&&Gpu> = matching
        .iter()
        .filter(|g| g.sharing.is_some() && g.migs.is_empty())
        .collect();
    let mut why = Vec::new();
    for g in &shared {
        let replicas = g.sharing.map_or(0, |s| s.replicas);
        if let Some(h) = whole_or_mig_holder(held, g.pci) {
            why.push(WhyNoSlot::HeldWhole {
                pci: g.pci,
                holder: h.to_owned(),
            });
        } else if g.excluded {
            why.push(WhyNoSlot::Excluded(g.pci));
        } else if let Some(p) = &g.problem {
            why.push(WhyNoSlot::Unusable {
                pci: g.pci,
                problem: p.clone(),
            });
        } else if sharing.contains(&g.pci) {
            why.push(WhyNoSlot::OursAlready(g.pci));
        } else if free_slot(g, held).is_none() {
            why.push(WhyNoSlot::Full {
                pci: g.pci,
                taken: slots_of(held, g.pci).count(),
                replicas,
                holders: sharers(held, g.pci),
            });
        }
    }
    let n_not = matching.len() - shared.len();
    if n_not > 0 {
        why.push(WhyNoSlot::NotShared { count: n_not });
    }
    AllocError::SlotShortage {
        req: Box::new(req.clone()),
        free,
        shareable: shared.len(),
        why,
    }
}
