//! Choosing GPUs for a request: pure functions over the inventory and the set of held GPUs.
//!
//! Exact count; vendor/arch/model filters; explicit devices; excluded and unusable GPUs never
//! given. Placement is deterministic and topology-aware: all GPUs on one NUMA node if one
//! can hold the request (best fit: the node with the fewest free GPUs that still suffices,
//! which keeps whole nodes free for large requests), then under one PCI parent (switch or
//! root port) the same way, then lowest index.

use crate::host::inventory::Gpu;
use crate::ids::{Pci, Unit, Vendor};
use crate::request::{DeviceSel, Field, Filter, MigSel, Request};
use std::collections::BTreeMap;

/// Why a request gets no GPUs: each refusal with what it names, printed as one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// A `<gpu:device>` (or a MIG selector's GPU) names no GPU of this host.
    #[error("no GPU with {sel} on this host")]
    NoGpu { sel: DeviceSel },
    /// Two `<gpu:device>` selectors name one GPU.
    #[error("{sel} names GPU {pci} a second time")]
    NamedTwice { sel: DeviceSel, pci: Pci },
    /// A named GPU is excluded by the host config.
    #[error("GPU {pci} ({sel}) is excluded by the host config")]
    Excluded { pci: Pci, sel: DeviceSel },
    /// A named GPU has a problem (no driver, quarantined…).
    #[error("GPU {pci} ({sel}) cannot be used: {problem}")]
    Unusable {
        pci: Pci,
        sel: DeviceSel,
        problem: String,
    },
    /// A named GPU is handed out as its MIG instances only.
    #[error(
        "GPU {pci} ({sel}) is in MIG mode with {instances} instances: ask for them (mig='yes')"
    )]
    InMigMode {
        pci: Pci,
        sel: DeviceSel,
        instances: usize,
    },
    /// A named GPU, or one of its MIG instances, is held by `holder`.
    #[error("GPU {pci} ({sel}) is held by {holder}")]
    Held {
        pci: Pci,
        sel: DeviceSel,
        holder: String,
    },
    /// A named GPU fails one of the request's filters.
    #[error(
        "GPU {pci} ({sel}) does not match {filter} (it is {vendor} {} {model})",
        .arch.as_deref().unwrap_or("unknown-arch")
    )]
    Mismatch {
        pci: Pci,
        sel: DeviceSel,
        filter: Box<Filter>,
        vendor: Vendor,
        arch: Option<String>,
        model: String,
    },
    /// Fewer usable, free, matching GPUs than asked: `free` of the `matching` ones, and why
    /// the others are not (`why`: one reason per cause).
    #[error(
        "cannot reserve {req}: only {free} of the host's {matching} matching GPU{} {} free{}",
        plural(*.matching),
        is_are(*.free),
        detail(.why, ", ")
    )]
    Shortage {
        req: Box<Request>,
        free: usize,
        matching: usize,
        why: Vec<String>,
    },
    /// A named GPU is shared: it is given as slots only.
    #[error("GPU {pci} ({sel}) is shared ({replicas} slots): ask for a slot (share='yes')")]
    Shareable {
        pci: Pci,
        sel: DeviceSel,
        replicas: u32,
    },
    /// A shared request names a GPU the host config does not share.
    #[error("GPU {pci} ({sel}) is not shared by the host config (\"sharing\"): ask for it whole (no share='yes')")]
    NotShareable { pci: Pci, sel: DeviceSel },
    /// A named shared GPU of which the holder has a slot already.
    #[error(
        "GPU {pci} ({sel}): the container holds a slot of it already (one slot of a GPU each)"
    )]
    SharesAlready { pci: Pci, sel: DeviceSel },
    /// Every slot of a named shared GPU is taken.
    #[error("GPU {pci} ({sel}): all {replicas} slots are taken, by {}", .holders.join(", "))]
    SlotsFull {
        pci: Pci,
        sel: DeviceSel,
        replicas: u32,
        holders: Vec<String>,
    },
    /// Fewer shared GPUs with a free slot than asked (one slot each): `free` of the
    /// `shareable` matching ones, and why the others are not (`why`).
    #[error(
        "cannot reserve {req}: only {free} of the host's {shareable} matching shared GPU{} {} a free slot{}",
        plural(*.shareable),
        if *.free == 1 { "has" } else { "have" },
        detail(.why, "; ")
    )]
    SlotShortage {
        req: Box<Request>,
        free: usize,
        shareable: usize,
        why: Vec<String>,
    },
    /// A `<gpu:mig>` names an instance its GPU does not have.
    #[error("GPU {pci} has no MIG instance gi {} ci {} ({sel})", .sel.gi, .sel.ci)]
    NoMig { pci: Pci, sel: MigSel },
    #[error("{sel} is named twice")]
    MigNamedTwice { sel: MigSel },
    /// The GPU of a named MIG instance has a problem, or is excluded.
    #[error("GPU {pci} ({sel}) cannot be used: {problem}")]
    MigUnusable {
        pci: Pci,
        sel: MigSel,
        problem: String,
    },
    /// The GPU of a named MIG instance is held whole.
    #[error("GPU {pci} ({sel}) is held whole by {holder}")]
    HeldWhole {
        pci: Pci,
        sel: MigSel,
        holder: String,
    },
    /// A named MIG instance is held.
    #[error("{unit} ({sel}) is held by {holder}")]
    MigHeld {
        unit: Unit,
        sel: MigSel,
        holder: String,
    },
    /// Another holder uses the named instance's GPU instance (`sel.gi`), through `through`.
    #[error("{unit} ({sel}): its GPU instance gi {} is held by {holder} (through {through}); compute instances of one GPU instance share its memory and engines", .sel.gi)]
    GiHeld {
        unit: Unit,
        sel: MigSel,
        holder: String,
        through: Unit,
    },
    /// The GPU of a named MIG instance fails one of the request's filters.
    #[error("GPU {pci} ({sel}) does not match {filter}")]
    MigMismatch {
        pci: Pci,
        sel: MigSel,
        filter: Box<Filter>,
    },
    /// Fewer free MIG instances than asked: `free` (the named ones included) of the `total`
    /// on matching GPUs, and why the others are not (`why`).
    #[error(
        "cannot reserve {req}: only {free} of the host's {total} MIG instance{} on matching GPUs {} free{}",
        plural(*.total),
        is_are(*.free),
        detail(.why, "; ")
    )]
    MigShortage {
        req: Box<Request>,
        free: usize,
        total: usize,
        why: Vec<String>,
    },
}

/// The plural ending for `n` things.
fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// The verb for `n` things.
fn is_are(n: usize) -> &'static str {
    if n == 1 {
        "is"
    } else {
        "are"
    }
}

/// A shortage's reasons after a colon, joined by `sep`; nothing when there are none.
fn detail<'a>(why: &'a [String], sep: &'static str) -> Detail<'a> {
    Detail(why, sep)
}

/// [`detail`]'s words, written as they are displayed.
struct Detail<'a>(&'a [String], &'static str);

impl std::fmt::Display for Detail<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            return Ok(());
        }
        write!(f, ": {}", self.0.join(self.1))
    }
}

/// Who holds a unit (a whole GPU, a MIG instance): unit → its holder as messages name it
/// (`domain 'web1'`, `container 'ID'`).
pub type Held = BTreeMap<Unit, String>;

fn field_value(g: &Gpu, f: Field) -> Option<&str> {
    match f {
        Field::Vendor => Some(g.vendor.as_str()),
        Field::Arch => g.arch.as_deref(),
        Field::Model => Some(g.model.as_str()),
    }
}

pub fn matches(g: &Gpu, filters: &[Filter]) -> bool {
    filters
        .iter()
        .all(|f| f.op.matches(field_value(g, f.field)))
}

/// The GPU a `<gpu:device>` selector names.
pub fn resolve<'a>(gpus: &'a [Gpu], sel: &DeviceSel) -> Option<&'a Gpu> {
    gpus.iter().find(|g| match sel {
        DeviceSel::Pci(p) => g.pci == *p,
        DeviceSel::Uuid(u) => g.uuid.as_deref().is_some_and(|x| x.eq_ignore_ascii_case(u)),
        DeviceSel::Index(i) => g.index == *i as usize,
    })
}

/// Who holds any of the GPU: the whole GPU, or one of its MIG instances.
pub fn busy(held: &Held, pci: Pci) -> Option<&str> {
    held.get(&Unit::Gpu(pci)).map(String::as_str).or_else(|| {
        held.range(Unit::first_mig(pci)..)
            .next()
            .filter(|(k, _)| k.pci() == pci)
            .map(|(_, v)| v.as_str())
    })
}

/// Who uses GPU instance `gi` of GPU `pci`, through which of its compute instances: they
/// share the GPU instance's memory, engines and fault domain, so a GPU instance serves one
/// holder at a time. `held` lists other holders' units only (never the asking holder's, which
/// may take several compute instances of one GPU instance).
pub fn gi_holder(held: &Held, pci: Pci, gi: u32) -> Option<(Unit, &str)> {
    held.range(Unit::first_of_gi(pci, gi)..)
        .next()
        .filter(|(k, _)| k.pci() == pci && k.gi() == Some(gi))
        .map(|(k, v)| (*k, v.as_str()))
}

/// A GPU a request names, as a whole GPU or a slot: not excluded, usable, not in MIG mode.
fn usable_named(g: &Gpu, sel: &DeviceSel) -> Result<(), AllocError> {
    if g.excluded {
        return Err(AllocError::Excluded {
            pci: g.pci,
            sel: sel.clone(),
        });
    }
    if let Some(p) = &g.problem {
        return Err(AllocError::Unusable {
            pci: g.pci,
            sel: sel.clone(),
            problem: p.clone(),
        });
    }
    if !g.migs.is_empty() {
        return Err(AllocError::InMigMode {
            pci: g.pci,
            sel: sel.clone(),
            instances: g.migs.len(),
        });
    }
    Ok(())
}

/// A GPU a request names meets each of its filters.
fn matches_named(g: &Gpu, sel: &DeviceSel, req: &Request) -> Result<(), AllocError> {
    match req
        .filters
        .iter()
        .find(|f| !f.op.matches(field_value(g, f.field)))
    {
        Some(f) => Err(AllocError::Mismatch {
            pci: g.pci,
            sel: sel.clone(),
            filter: Box::new(f.clone()),
            vendor: g.vendor,
            arch: g.arch.clone(),
            model: g.model.clone(),
        }),
        None => Ok(()),
    }
}

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
    // Held whole, or as slots (a GPU whose sharing was taken out of the config while held).
    let held_by = |g: &Gpu| {
        held.get(&Unit::Gpu(g.pci))
            .map(String::as_str)
            .or_else(|| slots_of(held, g.pci).next().map(|(_, h)| h))
    };
    let mut holders: Vec<&str> = matching.iter().filter_map(|g| held_by(g)).collect();
    holders.dedup();
    let n_held = matching.iter().filter(|g| held_by(g).is_some()).count();
    if n_held > 0 {
        why.push(format!("{n_held} held by {}", holders.join(", ")));
    }
    let n_excl = matching.iter().filter(|g| g.excluded).count();
    if n_excl > 0 {
        why.push(format!("{n_excl} excluded"));
    }
    let n_mig = matching
        .iter()
        .filter(|g| !g.migs.is_empty() && !held.contains_key(&Unit::Gpu(g.pci)))
        .count();
    if n_mig > 0 {
        why.push(format!(
            "{n_mig} in MIG mode (handed out as instances: mig='yes')"
        ));
    }
    let n_shared = matching
        .iter()
        .filter(|g| {
            g.sharing.is_some() && g.migs.is_empty() && !held.contains_key(&Unit::Gpu(g.pci))
        })
        .count();
    if n_shared > 0 {
        why.push(format!(
            "{n_shared} shared (handed out as slots: share='yes')"
        ));
    }
    let unusable: Vec<&&Gpu> = matching
        .iter()
        .filter(|g| !g.excluded && g.problem.is_some())
        .collect();
    if let Some(first) = unusable.first() {
        why.push(format!(
            "{} unusable ({}: {})",
            unusable.len(),
            first.pci,
            first.problem.as_deref().unwrap_or_default()
        ));
    }
    AllocError::Shortage {
        req: Box::new(req.clone()),
        free,
        matching: matching.len(),
        why,
    }
}

/// The slots of GPU `pci` in use: (slot number, holder), in slot order.
pub fn slots_of(held: &Held, pci: Pci) -> impl Iterator<Item = (u32, &str)> {
    held.range(Unit::first_slot(pci)..)
        .take_while(move |(k, _)| k.pci() == pci)
        .filter_map(|(k, v)| match *k {
            Unit::Slot { slot, .. } => Some((slot, v.as_str())),
            _ => None,
        })
}

/// Who holds slots of GPU `pci`, each once, in slot order.
pub fn sharers(held: &Held, pci: Pci) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for (_, h) in slots_of(held, pci) {
        if !v.iter().any(|x| x == h) {
            v.push(h.to_string());
        }
    }
    v
}

/// The lowest free slot of a shared GPU, if it has one.
fn free_slot(g: &Gpu, held: &Held) -> Option<Unit> {
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

/// Chooses `req.count` slots of shared GPUs (SPEC "Sharing"), each on a different GPU: the
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

/// Who holds GPU `pci` whole, or one of its MIG instances (not its slots).
fn whole_or_mig_holder(held: &Held, pci: Pci) -> Option<&str> {
    held.get(&Unit::Gpu(pci)).map(String::as_str).or_else(|| {
        held.range(Unit::first_mig(pci)..)
            .next()
            .filter(|(k, _)| k.pci() == pci && k.is_mig())
            .map(|(_, v)| v.as_str())
    })
}

/// The refusal of a shared request: which matching shared GPUs are full (and whose slots
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
            why.push(format!("{} held whole by {h}", g.pci));
        } else if g.excluded {
            why.push(format!("{} excluded", g.pci));
        } else if let Some(p) = &g.problem {
            why.push(format!("{} unusable ({p})", g.pci));
        } else if sharing.contains(&g.pci) {
            why.push(format!("{} has a slot of this holder's already", g.pci));
        } else if free_slot(g, held).is_none() {
            why.push(format!(
                "{} has {}/{replicas} slots taken by {}",
                g.pci,
                slots_of(held, g.pci).count(),
                sharers(held, g.pci).join(", ")
            ));
        }
    }
    let n_not = matching.len() - shared.len();
    if n_not > 0 {
        why.push(format!(
            "{n_not} matching GPU{} {} not shared by the host config",
            plural(n_not),
            is_are(n_not)
        ));
    }
    AllocError::SlotShortage {
        req: Box::new(req.clone()),
        free,
        shareable: shared.len(),
        why,
    }
}

/// Chooses `req.count` MIG compute instances: the exact ones the request names, then free
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
        // Held whole, or as slots (shared before it was put in MIG mode).
        if let Some(h) = held
            .get(&Unit::Gpu(g.pci))
            .map(String::as_str)
            .or_else(|| slots_of(held, g.pci).next().map(|(_, h)| h))
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
        why.push(format!(
            "held by {}",
            holders.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    if let Some(g) = gpus
        .iter()
        .find(|g| matches(g, &req.filters) && !g.migs.is_empty() && !g.usable())
    {
        why.push(format!(
            "{} unusable: {}",
            g.pci,
            g.problem.as_deref().unwrap_or("excluded")
        ));
    }
    AllocError::MigShortage {
        req: Box::new(req.clone()),
        free: free + chosen,
        total,
        why,
    }
}

/// Groups GPUs by a key, keeping index order inside each group.
fn groups<'a, K: Ord + Clone>(gs: &[&'a Gpu], key: impl Fn(&Gpu) -> K) -> Vec<(K, Vec<&'a Gpu>)> {
    let mut m: BTreeMap<K, Vec<&Gpu>> = BTreeMap::new();
    for g in gs {
        m.entry(key(g)).or_default().push(g);
    }
    m.into_iter().collect()
}

/// Picks `want` GPUs from `gs` by best fit on groups of `key`; `inner` orders a group.
fn best_fit<'a, K: Ord + Clone>(
    gs: &[&'a Gpu],
    want: usize,
    key: impl Fn(&Gpu) -> K,
    inner: impl Fn(&[&'a Gpu], usize) -> Vec<&'a Gpu>,
) -> Vec<&'a Gpu> {
    let mut gr = groups(gs, key);
    // Smallest group that suffices (ties: lowest key, i.e. lowest NUMA node / parent).
    if let Some((_, g)) = gr
        .iter()
        .filter(|(_, g)| g.len() >= want)
        .min_by_key(|(k, g)| (g.len(), k.clone()))
    {
        return inner(g, want);
    }
    // None suffices: spread over the fewest groups, largest first.
    gr.sort_by(|(ka, a), (kb, b)| b.len().cmp(&a.len()).then(ka.cmp(kb)));
    let mut out = Vec::new();
    for (_, g) in gr {
        let take = (want - out.len()).min(g.len());
        out.extend(inner(&g, take));
        if out.len() == want {
            break;
        }
    }
    out
}

fn by_parent<'a>(gs: &[&'a Gpu], want: usize) -> Vec<&'a Gpu> {
    best_fit(gs, want, |x| x.parent.clone(), |h, n| h[..n].to_vec())
}

fn parents_spanned(gs: &[&Gpu]) -> usize {
    let mut p: Vec<&Option<String>> = gs.iter().map(|g| &g.parent).collect();
    p.sort();
    p.dedup();
    p.len()
}

fn place<'a>(cands: &[&'a Gpu], want: usize) -> Vec<&'a Gpu> {
    let numa = |g: &Gpu| g.numa_node.map_or(u64::MAX, u64::from);
    // Among NUMA nodes that can hold the whole request: fewest PCI parents spanned, then
    // best fit (fewest free GPUs), then lowest node (unknown node last).
    let best = groups(cands, numa)
        .into_iter()
        .filter(|(_, g)| g.len() >= want)
        .map(|(k, g)| {
            let sel = by_parent(&g, want);
            ((parents_spanned(&sel), g.len(), k), sel)
        })
        .min_by(|a, b| a.0.cmp(&b.0));
    match best {
        Some((_, sel)) => sel,
        None => best_fit(cands, want, numa, by_parent),
    }
}

/// Extra GPUs for a request that names some devices: closest to the first named one.
fn near<'a>(cands: &[&'a Gpu], anchor: &Gpu, want: usize) -> Vec<&'a Gpu> {
    let mut c = cands.to_vec();
    c.sort_by_key(|g| {
        (
            g.numa_node != anchor.numa_node,
            g.parent != anchor.parent,
            g.index,
        )
    });
    c.truncate(want);
    c
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::host::inventory::Role;
    use crate::ids::Vendor;
    use crate::request::extra_specs::Op;
    use crate::request::Capabilities;

    pub(crate) fn gpu(
        index: usize,
        numa: Option<u32>,
        parent: &str,
        vendor: Vendor,
        arch: &str,
    ) -> Gpu {
        Gpu {
            index,
            pci: format!("0000:{:02x}:00.0", 0x10 + index).parse().unwrap(),
            vendor,
            vendor_id: 0x10de,
            device_id: 0x2330,
            model: format!("Model {arch}"),
            arch: Some(arch.into()),
            uuid: Some(format!("GPU-{index:08}")),
            numa_node: numa,
            parent: Some(parent.into()),
            nodes: vec![(
                Role::Nvidia,
                crate::host::inventory::DevNode {
                    node: crate::node::Node::new(format!("/dev/nvidia{index}"), 195, index as u32),
                    mode: 0o666,
                },
            )],
            excluded: false,
            problem: None,
            pending: false,
            driver: Some("nvidia".into()),
            migs: vec![],
            link: None,
            sharing: None,
        }
    }

    /// 8 GPUs, 2 NUMA nodes, 2 GPUs per PCIe switch (DGX-like).
    pub(crate) fn dgx() -> Vec<Gpu> {
        (0..8)
            .map(|i| {
                gpu(
                    i,
                    Some((i / 4) as u32),
                    &format!("sw{}", i / 2),
                    Vendor::Nvidia,
                    "hopper",
                )
            })
            .collect()
    }

    pub(crate) fn req(count: u32) -> Request {
        Request {
            count,
            filters: vec![],
            devices: vec![],
            capabilities: Capabilities::default(),
            mode: None,
            uid: 0,
            gid: 0,
            mig: false,
            migs: vec![],
            driver: None,
            share: false,
        }
    }

    fn idx(gpus: &[Gpu], units: &[Unit]) -> Vec<usize> {
        units
            .iter()
            .map(|p| gpus.iter().find(|g| g.pci == p.pci()).unwrap().index)
            .collect()
    }

    fn hold(h: &mut Held, gpus: &[Gpu], units: &[Unit], who: &str) {
        let _ = gpus;
        for p in units {
            h.insert(*p, format!("domain '{who}'"));
        }
    }

    /// The unit of this name.
    pub(crate) fn unit(s: &str) -> Unit {
        s.parse().unwrap()
    }

    fn pci(s: &str) -> Pci {
        s.parse().unwrap()
    }

    /// `/dev/nvidia-caps/nvidia-cap<m>` as a test host has it.
    pub(crate) fn cap_node(m: u32) -> crate::host::inventory::DevNode {
        crate::host::inventory::DevNode {
            node: crate::node::Node::new(format!("/dev/nvidia-caps/nvidia-cap{m}"), 236, m),
            mode: 0o444,
        }
    }

    /// `g` in MIG mode with these (gi, ci) instances (capability minors `gi*9`, `gi*9+1+ci`).
    pub(crate) fn with_migs(mut g: Gpu, layout: &[(u32, u32)]) -> Gpu {
        g.migs = layout
            .iter()
            .map(|&(gi, ci)| crate::host::inventory::Mig {
                gi,
                ci,
                gi_cap: cap_node(gi * 9),
                ci_cap: cap_node(gi * 9 + 1 + ci),
            })
            .collect();
        g
    }

    #[test]
    fn mig_instances_packed_and_never_whole() {
        let mut gs = dgx();
        gs[0] = with_migs(gs[0].clone(), &[(7, 0), (8, 0), (9, 0)]);
        gs[1] = with_migs(gs[1].clone(), &[(1, 0), (2, 0)]);
        let mut held = Held::new();
        let mut r = req(2);
        r.mig = true;
        // Best fit: the GPU whose free instances just suffice.
        assert_eq!(
            allocate(&gs, &held, &r).unwrap(),
            ["0000:11:00.0/gi1/ci0", "0000:11:00.0/gi2/ci0"]
        );
        held.insert(unit("0000:11:00.0/gi1/ci0"), "domain 'x'".into());
        assert_eq!(
            allocate(&gs, &held, &r).unwrap(),
            ["0000:10:00.0/gi7/ci0", "0000:10:00.0/gi8/ci0"]
        );
        // Four: none suffices alone; the fullest first.
        r.count = 4;
        assert_eq!(allocate(&gs, &held, &r).unwrap().len(), 4);
        r.count = 5;
        assert!(allocate(&gs, &held, &r).unwrap_err().to_string().contains(
            "only 4 of the host's 5 MIG instances on matching GPUs are free: held by domain 'x'"
        ));
        // Whole GPUs: never one with instances, nor one whose instance is held.
        assert_eq!(busy(&held, pci("0000:11:00.0")), Some("domain 'x'"));
        assert_eq!(busy(&held, pci("0000:10:00.0")), None);
        assert_eq!(busy(&held, pci("0000:11:00.1")), None);
        let whole = allocate(&gs, &held, &req(6)).unwrap();
        assert!(!whole.contains(&unit("0000:10:00.0")) && !whole.contains(&unit("0000:11:00.0")));
        assert!(allocate(&gs, &held, &req(7))
            .unwrap_err()
            .to_string()
            .contains("2 in MIG mode"));
        // A GPU held whole gives no instance.
        held.insert(unit("0000:10:00.0"), "domain 'w'".into());
        r.count = 1;
        r.migs = vec![crate::request::MigSel {
            gpu: DeviceSel::Index(0),
            gi: 7,
            ci: 0,
        }];
        assert!(allocate(&gs, &held, &r)
            .unwrap_err()
            .to_string()
            .contains("is held whole by domain 'w'"));
    }

    /// Compute instances of one GPU instance share its memory, engines and fault domain: one
    /// holder at a time (it may take several of them), another GPU instance is another unit.
    #[test]
    fn one_gpu_instance_serves_one_holder() {
        let mut gs = dgx();
        gs[0] = with_migs(gs[0].clone(), &[(7, 0), (7, 1), (8, 0)]);
        let id = |gi: u32, ci: u32| Unit::Mig {
            pci: pci("0000:10:00.0"),
            gi,
            ci,
        };
        let exact = |sels: &[(u32, u32)]| {
            let mut r = req(sels.len() as u32);
            r.mig = true;
            r.migs = sels
                .iter()
                .map(|&(gi, ci)| crate::request::MigSel {
                    gpu: DeviceSel::Index(0),
                    gi,
                    ci,
                })
                .collect();
            r
        };
        let mut held = Held::new();
        held.insert(id(7, 0), "domain 'a'".into());
        assert_eq!(
            gi_holder(&held, pci("0000:10:00.0"), 7),
            Some((id(7, 0), "domain 'a'"))
        );
        assert_eq!(gi_holder(&held, pci("0000:10:00.0"), 8), None);
        // An exact request for the other compute instance of gi 7: refused, naming 'a'.
        assert_eq!(
            allocate(&gs, &held, &exact(&[(7, 1)])).unwrap_err().to_string(),
            "0000:10:00.0/gi7/ci1 (MIG index 0 gi 7 ci 1): its GPU instance gi 7 is held by domain 'a' (through 0000:10:00.0/gi7/ci0); compute instances of one GPU instance share its memory and engines"
        );
        assert_eq!(allocate(&gs, &held, &exact(&[(8, 0)])).unwrap(), [id(8, 0)]);
        // Packed: never gi7/ci1; of two asked only one is free.
        let mut r = req(1);
        r.mig = true;
        assert_eq!(allocate(&gs, &held, &r).unwrap(), [id(8, 0)]);
        r.count = 2;
        let e = allocate(&gs, &held, &r).unwrap_err();
        assert!(
            e.to_string().contains(
                "only 1 of the host's 3 MIG instances on matching GPUs is free: held by domain 'a'"
            ),
            "{e}"
        );
        // One holder may take both compute instances of one GPU instance, packed or exact.
        let none = Held::new();
        assert_eq!(allocate(&gs, &none, &r).unwrap(), [id(7, 0), id(7, 1)]);
        assert_eq!(
            allocate(&gs, &none, &exact(&[(7, 0), (7, 1)])).unwrap(),
            [id(7, 0), id(7, 1)]
        );
        // gi 1 is not gi 17's prefix.
        let mut g17 = dgx();
        g17[0] = with_migs(g17[0].clone(), &[(1, 0), (17, 0)]);
        let mut h17 = Held::new();
        h17.insert(unit("0000:10:00.0/gi17/ci0"), "domain 'b'".into());
        assert_eq!(gi_holder(&h17, pci("0000:10:00.0"), 1), None);
        h17.insert(unit("0000:10:00.0/gi10/ci0"), "domain 'c'".into());
        h17.insert(unit("0000:10:00.0/gi1/ci3"), "domain 'd'".into());
        assert_eq!(
            gi_holder(&h17, pci("0000:10:00.0"), 1),
            Some((unit("0000:10:00.0/gi1/ci3"), "domain 'd'"))
        );
        h17.remove(&unit("0000:10:00.0/gi1/ci3"));
        h17.remove(&unit("0000:10:00.0/gi10/ci0"));
        r.count = 1;
        assert_eq!(allocate(&g17, &h17, &r).unwrap(), ["0000:10:00.0/gi1/ci0"]);
    }

    #[test]
    fn exact_count_and_determinism() {
        let g = dgx();
        let a = allocate(&g, &Held::new(), &req(2)).unwrap();
        assert_eq!(a, allocate(&g, &Held::new(), &req(2)).unwrap());
        assert_eq!(idx(&g, &a), vec![0, 1], "one switch pair on NUMA 0");
        for n in 1..=8 {
            assert_eq!(
                allocate(&g, &Held::new(), &req(n)).unwrap().len(),
                n as usize
            );
        }
        let e = allocate(&g, &Held::new(), &req(9)).unwrap_err();
        assert!(
            e.to_string()
                .contains("only 8 of the host's 8 matching GPUs are free"),
            "{e}"
        );
    }

    #[test]
    fn numa_best_fit_keeps_nodes_whole() {
        let g = dgx();
        let mut h = Held::new();
        let a = allocate(&g, &h, &req(1)).unwrap();
        assert_eq!(idx(&g, &a), vec![0]);
        hold(&mut h, &g, &a, "one");
        // A 4-GPU request fits only NUMA 1 now.
        let b = allocate(&g, &h, &req(4)).unwrap();
        assert_eq!(idx(&g, &b), vec![4, 5, 6, 7]);
        hold(&mut h, &g, &b, "four");
        // A single GPU goes next to the used one: switch 0's remaining GPU (best fit).
        let c = allocate(&g, &h, &req(1)).unwrap();
        assert_eq!(idx(&g, &c), vec![1]);
        hold(&mut h, &g, &c, "another");
        // A pair gets a whole switch.
        let d = allocate(&g, &h, &req(2)).unwrap();
        assert_eq!(idx(&g, &d), vec![2, 3]);
    }

    #[test]
    fn pair_prefers_whole_switch_over_split() {
        let g = dgx();
        let mut h = Held::new();
        h.insert(Unit::Gpu(g[0].pci), "x".into());
        h.insert(Unit::Gpu(g[2].pci), "y".into());
        // NUMA 0 has 1 and 3 free (on different switches), NUMA 1 has 4 free: a whole switch
        // on NUMA 1 beats a split pair on the tighter node 0.
        let a = allocate(&g, &h, &req(2)).unwrap();
        assert_eq!(idx(&g, &a), vec![4, 5]);
        // Only NUMA 0 left for a pair: split across its switches rather than across nodes.
        h.insert(Unit::Gpu(g[4].pci), "p".into());
        h.insert(Unit::Gpu(g[6].pci), "q".into());
        let a = allocate(&g, &h, &req(2)).unwrap();
        assert_eq!(idx(&g, &a), vec![1, 3]);
        h.remove(&Unit::Gpu(g[4].pci));
        h.remove(&Unit::Gpu(g[6].pci));
        h.insert(Unit::Gpu(g[5].pci), "z".into());
        // Now NUMA 1 has 3 free: {4} on sw2 and {6,7} on sw3; NUMA 0 has {1,3}: 2 free, best fit.
        let a = allocate(&g, &h, &req(3)).unwrap();
        assert_eq!(idx(&g, &a), vec![4, 6, 7]);
    }

    #[test]
    fn spreads_when_no_node_suffices() {
        let g = dgx();
        let mut h = Held::new();
        h.insert(Unit::Gpu(g[0].pci), "x".into());
        let a = allocate(&g, &h, &req(6)).unwrap();
        // NUMA 1 whole, then a pair from node 0 that shares a switch (2,3), not 1 and 2.
        assert_eq!(idx(&g, &a), vec![2, 3, 4, 5, 6, 7]);
    }

    #[test]
    fn filters_vendor_arch_model() {
        let g = vec![
            gpu(0, Some(0), "a", Vendor::Nvidia, "fermi"),
            gpu(1, Some(0), "a", Vendor::Amd, "cdna2"),
            gpu(2, Some(0), "a", Vendor::Intel, "xe-hpc"),
            gpu(3, Some(0), "a", Vendor::Nvidia, "kepler"),
        ];
        let mut r = req(1);
        r.filters = vec![Filter {
            field: Field::Vendor,
            op: Op::Eq("amd".into()),
        }];
        assert_eq!(idx(&g, &allocate(&g, &Held::new(), &r).unwrap()), vec![1]);
        r.filters = vec![Filter {
            field: Field::Arch,
            op: Op::Eq("kepler".into()),
        }];
        assert_eq!(idx(&g, &allocate(&g, &Held::new(), &r).unwrap()), vec![3]);
        r.filters = vec![Filter {
            field: Field::Arch,
            op: Op::OneOf(vec!["xe-hpc".into(), "kepler".into()]),
        }];
        r.count = 2;
        assert_eq!(
            idx(&g, &allocate(&g, &Held::new(), &r).unwrap()),
            vec![2, 3]
        );
        r.filters = vec![Filter {
            field: Field::Model,
            op: Op::Contains("fermi".into()),
        }];
        r.count = 1;
        assert_eq!(idx(&g, &allocate(&g, &Held::new(), &r).unwrap()), vec![0]);
        r.filters = vec![Filter {
            field: Field::Arch,
            op: Op::Eq("hopper".into()),
        }];
        let e = allocate(&g, &Held::new(), &r).unwrap_err();
        assert!(
            e.to_string()
                .contains("only 0 of the host's 0 matching GPUs are free"),
            "{e}"
        );
    }

    #[test]
    fn unknown_arch_never_matches() {
        let mut g = vec![gpu(0, Some(0), "a", Vendor::Nvidia, "fermi")];
        g[0].arch = None;
        let mut r = req(1);
        r.filters = vec![Filter {
            field: Field::Arch,
            op: Op::Ne("kepler".into()),
        }];
        assert!(allocate(&g, &Held::new(), &r).is_err());
    }

    #[test]
    fn excluded_and_unusable_never_given() {
        let mut g = dgx();
        g[0].excluded = true;
        g[1].problem = Some("no driver".into());
        let a = allocate(&g, &Held::new(), &req(6)).unwrap();
        assert!(!idx(&g, &a).contains(&0) && !idx(&g, &a).contains(&1));
        let e = allocate(&g, &Held::new(), &req(7)).unwrap_err();
        assert!(e.to_string().contains("1 excluded"), "{e}");
        assert!(
            e.to_string()
                .contains("1 unusable (0000:11:00.0: no driver)"),
            "{e}"
        );
        let mut r = req(1);
        r.devices = vec![DeviceSel::Index(0)];
        assert!(allocate(&g, &Held::new(), &r)
            .unwrap_err()
            .to_string()
            .contains("excluded by the host config"));
        r.devices = vec![DeviceSel::Pci(g[1].pci.to_string())];
        assert!(allocate(&g, &Held::new(), &r)
            .unwrap_err()
            .to_string()
            .contains("cannot be used: no driver"));
    }

    #[test]
    fn explicit_devices() {
        let g = dgx();
        let mut h = Held::new();
        let mut r = req(1);
        r.devices = vec![DeviceSel::Uuid("gpu-00000005".into())];
        assert_eq!(idx(&g, &allocate(&g, &h, &r).unwrap()), vec![5]);
        // count beyond the named ones: nearest to the first named device.
        r.count = 3;
        r.devices = vec![DeviceSel::Index(6)];
        assert_eq!(idx(&g, &allocate(&g, &h, &r).unwrap()), vec![4, 6, 7]);
        h.insert(Unit::Gpu(g[6].pci), "domain 'other'".into());
        let e = allocate(&g, &h, &r).unwrap_err();
        assert!(e.to_string().contains("is held by domain 'other'"), "{e}");
        r.devices = vec![DeviceSel::Pci("0000:99:00.0".into())];
        assert!(allocate(&g, &h, &r)
            .unwrap_err()
            .to_string()
            .contains("no GPU with pci 0000:99:00.0"));
        r.devices = vec![DeviceSel::Index(1), DeviceSel::Pci(g[1].pci.to_string())];
        assert!(allocate(&g, &h, &r)
            .unwrap_err()
            .to_string()
            .contains("a second time"));
        r.devices = vec![DeviceSel::Index(1)];
        r.filters = vec![Filter {
            field: Field::Arch,
            op: Op::Eq("fermi".into()),
        }];
        let e = allocate(&g, &h, &r).unwrap_err();
        assert!(
            e.to_string().contains("does not match arch == fermi"),
            "{e}"
        );
    }

    #[test]
    fn held_reported_by_name() {
        let g = dgx();
        let mut h = Held::new();
        for (i, x) in g.iter().take(7).enumerate() {
            let who = if i < 4 { "domain 'a'" } else { "container 'b'" };
            h.insert(Unit::Gpu(x.pci), who.into());
        }
        let e = allocate(&g, &h, &req(2)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot reserve 2 GPUs: only 1 of the host's 8 matching GPUs is free: 7 held by domain 'a', container 'b'"
        );
    }

    /// Every refusal of a whole-GPU request word for word: these lines are what the product says.
    #[test]
    fn gpu_refusals_word_for_word() {
        let said = |gs: &[Gpu], h: &Held, r: &Request| allocate(gs, h, r).unwrap_err().to_string();
        let mut gs = dgx();
        gs[2].excluded = true;
        gs[3].problem = Some("no driver".into());
        gs[4] = with_migs(gs[4].clone(), &[(1, 0), (2, 0)]);
        gs[5].arch = None;
        let mut h = Held::new();
        h.insert(Unit::Gpu(gs[6].pci), "domain 'a'".into());
        let named = |devices: Vec<DeviceSel>| Request { devices, ..req(1) };
        let cases = [
            (vec![DeviceSel::Index(9)], "no GPU with index 9 on this host"),
            (
                vec![DeviceSel::Index(0), DeviceSel::Uuid("gpu-00000000".into())],
                "uuid gpu-00000000 names GPU 0000:10:00.0 a second time",
            ),
            (
                vec![DeviceSel::Index(2)],
                "GPU 0000:12:00.0 (index 2) is excluded by the host config",
            ),
            (
                vec![DeviceSel::Index(3)],
                "GPU 0000:13:00.0 (index 3) cannot be used: no driver",
            ),
            (
                vec![DeviceSel::Index(4)],
                "GPU 0000:14:00.0 (index 4) is in MIG mode with 2 instances: ask for them (mig='yes')",
            ),
            (
                vec![DeviceSel::Index(6)],
                "GPU 0000:16:00.0 (index 6) is held by domain 'a'",
            ),
        ];
        for (devices, text) in cases {
            assert_eq!(said(&gs, &h, &named(devices)), text);
        }
        let mut r = named(vec![DeviceSel::Pci("0000:15:00.0".into())]);
        r.filters = vec![Filter {
            field: Field::Arch,
            op: Op::Eq("hopper".into()),
        }];
        assert_eq!(
            said(&gs, &h, &r),
            "GPU 0000:15:00.0 (pci 0000:15:00.0) does not match arch == hopper (it is nvidia unknown-arch Model hopper)"
        );
        let e = allocate(&gs, &h, &req(8)).unwrap_err();
        assert!(
            matches!(&e, AllocError::Shortage { free: 4, matching: 8, why, .. } if why.len() == 4),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "cannot reserve 8 GPUs: only 4 of the host's 8 matching GPUs are free: 1 held by domain 'a', 1 excluded, 1 in MIG mode (handed out as instances: mig='yes'), 1 unusable (0000:13:00.0: no driver)"
        );
        let one = [gpu(0, Some(0), "a", Vendor::Amd, "cdna2")];
        assert_eq!(
            said(&one, &Held::new(), &req(2)),
            "cannot reserve 2 GPUs: only 1 of the host's 1 matching GPU is free"
        );
    }

    /// Every refusal of a MIG request word for word: named instances, then counted ones.
    #[test]
    fn mig_refusals_word_for_word() {
        let said = |gs: &[Gpu], h: &Held, r: &Request| allocate(gs, h, r).unwrap_err().to_string();
        let mut m = dgx();
        m[0] = with_migs(m[0].clone(), &[(1, 0), (1, 1), (2, 0)]);
        for g in &mut m[1..4] {
            *g = with_migs(g.clone(), &[(1, 0)]);
        }
        m[1].excluded = true;
        m[2].problem = Some("Xid 79".into());
        let mut h = Held::new();
        h.insert(Unit::Gpu(m[3].pci), "domain 'w'".into());
        h.insert(unit("0000:10:00.0/gi1/ci0"), "container 'c'".into());
        let migs = |count: u32, sels: &[(u32, u32, u32)]| Request {
            mig: true,
            migs: sels
                .iter()
                .map(|&(i, gi, ci)| crate::request::MigSel {
                    gpu: DeviceSel::Index(i),
                    gi,
                    ci,
                })
                .collect(),
            ..req(count)
        };
        let cases = [
            (migs(1, &[(9, 1, 0)]), "no GPU with index 9 on this host"),
            (
                migs(1, &[(0, 3, 0)]),
                "GPU 0000:10:00.0 has no MIG instance gi 3 ci 0 (MIG index 0 gi 3 ci 0)",
            ),
            (
                migs(2, &[(0, 2, 0), (0, 2, 0)]),
                "MIG index 0 gi 2 ci 0 is named twice",
            ),
            (
                migs(1, &[(1, 1, 0)]),
                "GPU 0000:11:00.0 (MIG index 1 gi 1 ci 0) cannot be used: excluded by the host config",
            ),
            (
                migs(1, &[(2, 1, 0)]),
                "GPU 0000:12:00.0 (MIG index 2 gi 1 ci 0) cannot be used: Xid 79",
            ),
            (
                migs(1, &[(3, 1, 0)]),
                "GPU 0000:13:00.0 (MIG index 3 gi 1 ci 0) is held whole by domain 'w'",
            ),
            (
                migs(1, &[(0, 1, 0)]),
                "0000:10:00.0/gi1/ci0 (MIG index 0 gi 1 ci 0) is held by container 'c'",
            ),
            (
                migs(3, &[]),
                "cannot reserve 3 MIG instances: only 1 of the host's 6 MIG instances on matching GPUs is free: held by container 'c'; 0000:11:00.0 unusable: excluded",
            ),
            (
                migs(2, &[(0, 2, 0)]),
                "cannot reserve 2 MIG instances, MIG index 0 gi 2 ci 0: only 1 of the host's 6 MIG instances on matching GPUs is free: held by container 'c'; 0000:11:00.0 unusable: excluded",
            ),
        ];
        for (r, text) in cases {
            assert_eq!(said(&m, &h, &r), text);
        }
        let e = allocate(&m, &h, &migs(1, &[(0, 1, 1)])).unwrap_err();
        assert!(
            matches!(e, AllocError::GiHeld { through, .. } if through == unit("0000:10:00.0/gi1/ci0")),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "0000:10:00.0/gi1/ci1 (MIG index 0 gi 1 ci 1): its GPU instance gi 1 is held by container 'c' (through 0000:10:00.0/gi1/ci0); compute instances of one GPU instance share its memory and engines"
        );
        let mut r = migs(1, &[(0, 2, 0)]);
        r.filters = vec![Filter {
            field: Field::Arch,
            op: Op::Eq("fermi".into()),
        }];
        assert_eq!(
            said(&m, &h, &r),
            "GPU 0000:10:00.0 (MIG index 0 gi 2 ci 0) does not match arch == fermi"
        );
        let lone = [with_migs(m[4].clone(), &[(1, 0)])];
        assert_eq!(
            said(&lone, &Held::new(), &migs(2, &[])),
            "cannot reserve 2 MIG instances: only 1 of the host's 1 MIG instance on matching GPUs is free"
        );
    }

    /// 4 GPUs: 0 and 1 shared (3 and 2 slots), 2 whole, 3 shared but in MIG mode.
    fn shared_host() -> Vec<Gpu> {
        let mut v: Vec<Gpu> = (0..4)
            .map(|i| gpu(i, Some(0), "sw0", Vendor::Nvidia, "fermi"))
            .collect();
        let share = |n| Some(crate::host::config::Sharing::timeslice(n));
        v[0].sharing = share(3);
        v[1].sharing = share(2);
        v[3].sharing = share(2);
        v[3] = with_migs(v[3].clone(), &[(1, 0)]);
        v
    }

    fn shared(count: u32) -> Request {
        Request {
            share: true,
            ..req(count)
        }
    }

    #[test]
    fn slots_fewest_used_first_each_on_another_gpu() {
        let g = shared_host();
        let mut h = Held::new();
        let take = |who: &str, n: u32, h: &mut Held| -> Result<Vec<Unit>, AllocError> {
            let u = allocate(&g, h, &shared(n))?;
            for x in &u {
                h.insert(*x, format!("domain '{who}'"));
            }
            Ok(u)
        };
        assert_eq!(
            take("a", 1, &mut h).unwrap(),
            vec![unit("0000:10:00.0/slot0")]
        );
        // 0 has one in use, 1 none: 1 first.
        assert_eq!(
            take("b", 1, &mut h).unwrap(),
            vec![unit("0000:11:00.0/slot0")]
        );
        // Two slots: on two GPUs, never two of one.
        assert_eq!(
            take("c", 2, &mut h).unwrap(),
            vec![unit("0000:10:00.0/slot1"), unit("0000:11:00.0/slot1")]
        );
        // 1 is full (2/2), 0 has one left; two slots cannot be on one GPU.
        assert_eq!(
            allocate(&g, &h, &shared(2)).unwrap_err().to_string(),
            "cannot reserve 2 shared GPU slots: only 1 of the host's 2 matching shared GPUs has a free slot: \
             0000:11:00.0 has 2/2 slots taken by domain 'b', domain 'c'; 2 matching GPUs are not shared by the host config"
        );
        assert_eq!(
            take("d", 1, &mut h).unwrap(),
            vec![unit("0000:10:00.0/slot2")]
        );
        assert_eq!(
            allocate(&g, &h, &shared(1)).unwrap_err().to_string(),
            "cannot reserve 1 shared GPU slot: only 0 of the host's 2 matching shared GPUs have a free slot: \
             0000:10:00.0 has 3/3 slots taken by domain 'a', domain 'c', domain 'd'; \
             0000:11:00.0 has 2/2 slots taken by domain 'b', domain 'c'; 2 matching GPUs are not shared by the host config"
        );
        // A freed slot is taken again, the lowest first.
        h.remove(&unit("0000:10:00.0/slot1"));
        assert_eq!(
            allocate(&g, &h, &shared(1)).unwrap(),
            vec![unit("0000:10:00.0/slot1")]
        );
        // Whole requests never get a shared GPU, nor a MIG GPU's instances shared.
        assert_eq!(
            allocate(&g, &Held::new(), &req(1)).unwrap(),
            vec![unit("0000:12:00.0")]
        );
        let e = allocate(&g, &Held::new(), &req(2)).unwrap_err().to_string();
        assert!(
            e.contains("2 shared (handed out as slots: share='yes')"),
            "{e}"
        );
    }

    #[test]
    fn named_slots_and_their_refusals() {
        let g = shared_host();
        let mut h = Held::new();
        let named = |sel: &str| {
            let mut r = shared(1);
            r.devices = vec![DeviceSel::Pci(sel.into())];
            r
        };
        assert_eq!(
            allocate(&g, &h, &named("0000:11:00.0")).unwrap(),
            vec![unit("0000:11:00.0/slot0")]
        );
        h.insert(unit("0000:11:00.0/slot0"), "domain 'a'".into());
        h.insert(unit("0000:11:00.0/slot1"), "container 'b'".into());
        let said = |r: &Request, h: &Held| allocate(&g, h, r).unwrap_err().to_string();
        assert_eq!(
            said(&named("0000:11:00.0"), &h),
            "GPU 0000:11:00.0 (pci 0000:11:00.0): all 2 slots are taken, by domain 'a', container 'b'"
        );
        assert_eq!(
            said(&named("0000:12:00.0"), &h),
            "GPU 0000:12:00.0 (pci 0000:12:00.0) is not shared by the host config (\"sharing\"): ask for it whole (no share='yes')"
        );
        assert_eq!(
            said(&named("0000:13:00.0"), &h),
            "GPU 0000:13:00.0 (pci 0000:13:00.0) is in MIG mode with 1 instances: ask for them (mig='yes')"
        );
        let mut whole = req(1);
        whole.devices = vec![DeviceSel::Pci("0000:10:00.0".into())];
        assert_eq!(
            said(&whole, &h),
            "GPU 0000:10:00.0 (pci 0000:10:00.0) is shared (3 slots): ask for a slot (share='yes')"
        );
        // Held whole (say, before the config shared it): no slot of it.
        let mut w = Held::new();
        w.insert(unit("0000:10:00.0"), "domain 'old'".into());
        assert_eq!(
            said(&named("0000:10:00.0"), &w),
            "GPU 0000:10:00.0 (pci 0000:10:00.0) is held by domain 'old'"
        );
        assert!(said(&shared(2), &w).contains("0000:10:00.0 held whole by domain 'old'"));
        // The slots of one GPU are neighbours: another GPU's units are not counted.
        assert_eq!(slots_of(&h, pci("0000:10:00.0")).count(), 0);
        assert_eq!(
            sharers(&h, pci("0000:11:00.0")),
            vec!["domain 'a'".to_string(), "container 'b'".to_string()]
        );
    }

    /// Review F1: `replicas` lowered while slots above it are held: they count against it.
    /// F3: a GPU put in MIG mode while its slots are held gives no instance.
    #[test]
    fn held_slots_count_whatever_their_number() {
        let mut g = shared_host();
        let mut h = Held::new();
        h.insert(unit("0000:11:00.0/slot2"), "domain 'a'".into());
        h.insert(unit("0000:11:00.0/slot3"), "domain 'b'".into());
        let mut named = shared(1);
        named.devices = vec![DeviceSel::Pci("0000:11:00.0".into())];
        assert_eq!(
            allocate(&g, &h, &named).unwrap_err().to_string(),
            "GPU 0000:11:00.0 (pci 0000:11:00.0): all 2 slots are taken, by domain 'a', domain 'b'"
        );
        // Unnamed: GPU 0 (3 slots, none used) has room, GPU 1 none.
        assert_eq!(
            allocate(&g, &h, &shared(1)).unwrap(),
            vec![unit("0000:10:00.0/slot0")]
        );
        g[0].sharing = None;
        assert!(allocate(&g, &h, &shared(1))
            .unwrap_err()
            .to_string()
            .contains("0000:11:00.0 has 2/2 slots taken by domain 'a', domain 'b'"));
        // MIG mode since: no instance while a slot is held.
        let mut g = shared_host();
        g[1] = with_migs(g[1].clone(), &[(1, 0)]);
        let mut m = req(1);
        m.mig = true;
        h.remove(&unit("0000:11:00.0/slot3"));
        // GPU 3's instance, never GPU 1's.
        assert_eq!(
            allocate(&g, &h, &m).unwrap(),
            vec![unit("0000:13:00.0/gi1/ci0")]
        );
        m.count = 2;
        let e = allocate(&g, &h, &m).unwrap_err().to_string();
        assert!(e.starts_with("cannot reserve 2 MIG instances"), "{e}");
        let mut named = m.clone();
        named.migs = vec![MigSel {
            gpu: DeviceSel::Pci("0000:11:00.0".into()),
            gi: 1,
            ci: 0,
        }];
        named.count = 1;
        assert!(allocate(&g, &h, &named)
            .unwrap_err()
            .to_string()
            .contains("is held whole by domain 'a'"));
        // A whole request's refusal names a slot holder of a GPU no longer shared.
        let mut g = shared_host();
        g[1].sharing = None;
        let e = allocate(&g, &h, &req(3)).unwrap_err().to_string();
        assert!(e.contains("1 held by domain 'a'"), "{e}");
    }
}
