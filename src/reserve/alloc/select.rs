//! What a request names, and whether a GPU matches it.

use super::error::AllocError;
use crate::host::inventory::Gpu;
use crate::request::{DeviceSel, Field, Filter, Request};

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
