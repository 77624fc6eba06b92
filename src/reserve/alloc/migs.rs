//! MIG compute instances: the ones a request names, then free ones, packed.

use super::error::{AllocError, WhyNoMig};
use super::held::{gi_holder, mdev_holder, slots_of, Held};
use super::select::{field_value, matches, resolve};
use crate::host::inventory::Gpu;
use crate::ids::Unit;
use crate::request::Request;

/// instances of usable, matching GPUs that no one holds whole, never one whose GPU instance
/// another holder uses ([`gi_holder`]); packed (the GPU with the fewest free instances that
/// suffices, else the fullest first), so that other GPUs keep theirs together.
pub fn allocate_migs(gpus: &[Gpu], held: &Held, req: &Request) -> Result<Vec<Unit>, AllocError> {
    let mut chosen = named_migs(gpus, held, req)?;
    let want = req.count as usize - chosen.len();
    let eligible = |g: &&Gpu| {
        g.usable()
            && !held.contains_key(&Unit::Gpu(g.pci))
            && slots_of(held, g.pci).next().is_none()
            && mdev_holder(held, g.pci).is_none()
            && matches(g, &req.filters)
    };
    let mut groups: Vec<(usize, Vec<Unit>)> = gpus
        .iter()
        .filter(eligible)
        .map(|g| {
            let free: Vec<Unit> = g
                .migs
                .iter()
                .filter(|m| gi_holder(held, g.pci, m.gi).is_none())
                .map(|m| m.id(g.pci))
                .filter(|id| !chosen.iter().any(|(_, c)| c == id))
                .collect();
            (g.index, free)
        })
        .filter(|(_, f)| !f.is_empty())
        .collect();
    let free: usize = groups.iter().map(|(_, f)| f.len()).sum();
    if free < want {
        return Err(mig_shortage(gpus, held, req, free, chosen.len()));
    }
    // The smallest group that suffices; else the fullest groups first.
    let pick = |gr: &mut Vec<(usize, Vec<Unit>)>| -> Vec<(usize, Unit)> {
        if want == 0 {
            return vec![];
        }
        if let Some((i, ids)) = gr
            .iter()
            .filter(|(_, f)| f.len() >= want)
            .min_by_key(|(i, f)| (f.len(), *i))
        {
            return ids.iter().take(want).map(|id| (*i, *id)).collect();
        }
        gr.sort_by(|(ia, a), (ib, b)| b.len().cmp(&a.len()).then(ia.cmp(ib)));
        gr.iter()
            .flat_map(|(i, ids)| ids.iter().map(move |id| (*i, *id)))
            .take(want)
            .collect()
    };
    chosen.extend(pick(&mut groups));
    chosen.sort();
    Ok(chosen.into_iter().map(|(_, id)| id).collect())
}

/// The exact instances the request names, each checked free and usable.
fn named_migs(gpus: &[Gpu], held: &Held, req: &Request) -> Result<Vec<(usize, Unit)>, AllocError> {
    let mut chosen: Vec<(usize, Unit)> = Vec::new();
    for sel in &req.migs {
        let g = resolve(gpus, &sel.gpu).ok_or_else(|| AllocError::NoGpu {
            sel: sel.gpu.clone(),
        })?;
        let m = g
            .migs
            .iter()
            .find(|m| m.gi == sel.gi && m.ci == sel.ci)
            .ok_or_else(|| AllocError::NoMig {
                pci: g.pci,
                sel: sel.clone(),
            })?;
        let id = m.id(g.pci);
        if chosen.iter().any(|(_, c)| *c == id) {
            return Err(AllocError::MigNamedTwice { sel: sel.clone() });
        }
        if let Some(p) = g
            .problem
            .as_deref()
            .or(g.excluded.then_some("excluded by the host config"))
        {
            return Err(AllocError::MigUnusable {
                pci: g.pci,
                sel: sel.clone(),
                problem: p.to_string(),
            });
        }
        // Held whole, or as slots (shared before it was put in MIG mode), or by VMs' mediated
        // devices.
        if let Some(h) = held
            .get(&Unit::Gpu(g.pci))
            .map(String::as_str)
            .or_else(|| slots_of(held, g.pci).next().map(|(_, h)| h))
            .or_else(|| mdev_holder(held, g.pci))
        {
            return Err(AllocError::HeldWhole {
                pci: g.pci,
                sel: sel.clone(),
                holder: h.to_string(),
            });
        }
        if let Some(h) = held.get(&id) {
            return Err(AllocError::MigHeld {
                unit: id,
                sel: sel.clone(),
                holder: h.clone(),
            });
        }
        if let Some((other, h)) = gi_holder(held, g.pci, m.gi) {
            return Err(AllocError::GiHeld {
                unit: id,
                sel: sel.clone(),
                holder: h.to_string(),
                through: other,
            });
        }
        if let Some(f) = req
            .filters
            .iter()
            .find(|f| !f.op.matches(field_value(g, f.field)))
        {
            return Err(AllocError::MigMismatch {
                pci: g.pci,
                sel: sel.clone(),
                filter: Box::new(f.clone()),
            });
        }
        chosen.push((g.index, id));
    }
    Ok(chosen)
}

/// The refusal when fewer than `want` instances are free (`free` of them, besides the
/// `chosen` ones the request names).
fn mig_shortage(
    gpus: &[Gpu],
    held: &Held,
    req: &Request,
    free: usize,
    chosen: usize,
) -> AllocError {
    let total: usize = gpus
        .iter()
        .filter(|g| matches(g, &req.filters))
        .map(|g| g.migs.len())
        .sum();
    let holders: std::collections::BTreeSet<&str> = gpus
        .iter()
        .filter(|g| matches(g, &req.filters))
        .flat_map(|g| g.migs.iter().map(|m| m.id(g.pci)))
        .filter_map(|id| held.get(&id).map(String::as_str))
        .collect();
    let mut why = Vec::new();
    if !holders.is_empty() {
        why.push(WhyNoMig::Held(
            holders.into_iter().map(str::to_owned).collect(),
        ));
    }
    if let Some(g) = gpus
        .iter()
        .find(|g| matches(g, &req.filters) && !g.migs.is_empty() && !g.usable())
    {
        why.push(WhyNoMig::Unusable {
            pci: g.pci,
            problem: g.problem.as_deref().unwrap_or("excluded").to_owned(),
        });
    }
    AllocError::MigShortage {
        req: Box::new(req.clone()),
        free: free + chosen,
        total,
        why,
    }
}
