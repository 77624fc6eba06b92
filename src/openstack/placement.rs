//! `gpuhook placement`: this host's GPUs as an OpenStack Nova provider config (schema 1.0,
//! `[compute]provider_config_location`), so that Placement schedules GPU flavors
//! (`resources:CUSTOM_GPU_FERMI=2`) only onto hosts with such GPUs free. Pure: inventory in,
//! YAML text out.
//!
//! One inventory `CUSTOM_GPU_<ARCH>` per architecture present: `total` its GPUs, `reserved`
//! the excluded or unusable ones and those in MIG mode, `min_unit` 1, `max_unit` total, `step_size` 1,
//! `allocation_ratio` 1.0; traits `CUSTOM_GPU_VENDOR_<VENDOR>` and `CUSTOM_GPU_ARCH_<ARCH>`.
//! GPUs of unknown architecture get no inventory (a flavor cannot name them).

use crate::host::inventory::Inventory;
use std::collections::BTreeMap;
use std::fmt::Write;

pub use crate::request::extra_specs::{custom_name, valid_custom_name};

/// Per architecture: (total, reserved).
fn per_arch(inv: &Inventory) -> BTreeMap<String, (u32, u32)> {
    let mut m: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    for g in &inv.gpus {
        let Some(arch) = g.arch.as_deref() else {
            continue;
        };
        let e = m.entry(custom_name("GPU_", arch)).or_default();
        e.0 += 1;
        // Unusable, or in MIG mode (handed out as instances, never whole): not for flavors.
        if !g.usable() || !g.migs.is_empty() {
            e.1 += 1;
        }
    }
    m
}

/// The provider config.
pub fn render(inv: &Inventory) -> String {
    let mut out = String::from(
        "# Written by gpuhook placement: this compute node's GPUs for Placement.\n\
         meta:\n  schema_version: '1.0'\nproviders:\n  - identification:\n      name: $COMPUTE_NODE\n",
    );
    let arches = per_arch(inv);
    if !arches.is_empty() {
        out.push_str("    inventories:\n      additional:\n");
        for (rc, (total, reserved)) in &arches {
            let _ = write!(
                out,
                "        - {rc}:\n            total: {total}\n            reserved: {reserved}\n            min_unit: 1\n            max_unit: {total}\n            step_size: 1\n            allocation_ratio: 1.0\n"
            );
        }
    }
    let mut traits: Vec<String> = inv
        .gpus
        .iter()
        .map(|g| custom_name("GPU_VENDOR_", g.vendor.as_str()))
        .chain(
            inv.gpus
                .iter()
                .filter_map(|g| g.arch.as_deref().map(|a| custom_name("GPU_ARCH_", a))),
        )
        .collect();
    traits.sort();
    traits.dedup();
    if !traits.is_empty() {
        out.push_str("    traits:\n      additional:\n");
        for t in traits {
            let _ = writeln!(out, "        - {t}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_placements_rules() {
        assert_eq!(custom_name("GPU_", "fermi"), "CUSTOM_GPU_FERMI");
        assert_eq!(
            custom_name("GPU_", "ada-lovelace"),
            "CUSTOM_GPU_ADA_LOVELACE"
        );
        assert_eq!(
            custom_name("GPU_ARCH_", "gfx90a.x"),
            "CUSTOM_GPU_ARCH_GFX90A_X"
        );
        // Every architecture gpuhook knows gives a valid name.
        for a in crate::host::arch::known_names() {
            let n = custom_name("GPU_", a);
            assert!(valid_custom_name(&n), "{a}: {n}");
        }
        assert_eq!(custom_name("GPU_", &"x".repeat(300)).len(), 255);
        assert!(!valid_custom_name("CUSTOM_"));
        assert!(!valid_custom_name("CUSTOM_gpu"));
        assert!(!valid_custom_name("GPU_FERMI"));
    }
}
