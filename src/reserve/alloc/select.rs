//! What a request names, and whether a GPU matches it.

use super::error::AllocError;
use crate::host::config::Config;
use crate::host::inventory::Gpu;
use crate::request::extra_specs::{custom_name, Op};
use crate::request::{DeviceSel, Field, Filter, Request, Wording};
use std::collections::BTreeSet;

/// Every architecture name this host knows: the built-in table's (with the NVIDIA chip
/// families the PCI id database gives), the config's `overrides`, and its GPUs'.
pub fn known_archs(cfg: &Config, gpus: &[Gpu]) -> BTreeSet<String> {
    crate::host::arch::known_names()
        .into_iter()
        .map(str::to_owned)
        .chain(cfg.override_archs().map(str::to_ascii_lowercase))
        .chain(
            gpus.iter()
                .filter_map(|g| g.arch.as_deref())
                .map(str::to_ascii_lowercase),
        )
        .collect()
}

/// A request that names an architecture no GPU can have (a typo: `fermy`) is refused as such,
/// with the names that are known, before any GPU is looked at: the architectures it asks
/// for by name (`arch`, `gpu_arch` `s==`, `<or>`) and by Placement's class
/// (`CUSTOM_GPU_<ARCH>`). A filter that excludes or compares (`!=`, `<in>`, `s<`) is not a
/// name.
pub fn known_arch(req: &Request, known: &BTreeSet<String>) -> Result<(), AllocError> {
    let listed = || known.iter().cloned().collect::<Vec<_>>();
    for f in req.filters.iter().filter(|f| f.field == Field::Arch) {
        let named: Vec<&String> = match &f.op {
            Op::Eq(x) => vec![x],
            Op::OneOf(xs) => xs.iter().collect(),
            Op::Class(c) => {
                if !known.iter().any(|k| custom_name("GPU_", k) == *c) {
                    return Err(AllocError::UnknownClass {
                        class: c.clone(),
                        known: listed(),
                    });
                }
                continue;
            }
            _ => continue,
        };
        if let Some(x) = named
            .into_iter()
            .find(|x| !known.contains(&x.to_ascii_lowercase()))
        {
            return Err(AllocError::UnknownArch {
                arch: x.clone(),
                known: listed(),
            });
        }
    }
    Ok(())
}

pub(super) fn field_value(g: &Gpu, f: Field) -> Option<&str> {
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

/// A GPU a request names, as a whole GPU or a slot: not excluded, usable, not in MIG mode.
pub(super) fn usable_named(g: &Gpu, sel: &DeviceSel) -> Result<(), AllocError> {
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
            wording: Wording::Xml,
        });
    }
    Ok(())
}

/// A GPU a request names meets each of its filters.
pub(super) fn matches_named(g: &Gpu, sel: &DeviceSel, req: &Request) -> Result<(), AllocError> {
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
