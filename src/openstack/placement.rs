//! `gpuhook placement`: this host's GPUs as an OpenStack Nova provider config (schema 1.0,
//! `[compute]provider_config_location`), so that Placement schedules GPU flavors
//! (`resources:CUSTOM_GPU_FERMI=2`) only onto hosts with such GPUs free. Pure: inventory in,
//! YAML text out.
//!
//! One inventory `CUSTOM_GPU_<ARCH>` per architecture present: `total` its GPUs, `reserved`
//! the excluded or unusable ones and those in MIG mode, `min_unit` 1, `max_unit` total, `step_size` 1,
//! `allocation_ratio` 1.0; traits `CUSTOM_GPU_VENDOR_<VENDOR>` and `CUSTOM_GPU_ARCH_<ARCH>`.
//! GPUs of unknown architecture get no inventory (a flavor cannot name them).
//!
//! A shared GPU (config `sharing`) counts only in `CUSTOM_GPU_<ARCH>_SHARED`, with its
//! `replicas` slots in `total`; `max_unit` there is the number of shared GPUs, since one
//! request's slots are each on another GPU.

use crate::host::inventory::Inventory;
use std::collections::BTreeMap;
use std::fmt::Write;

pub use crate::request::extra_specs::{custom_name, valid_custom_name};

/// One resource class's inventory.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    total: u32,
    reserved: u32,
    max_unit: u32,
}

/// Per resource class: whole GPUs in `CUSTOM_GPU_<ARCH>`, slots in `…_SHARED`.
fn per_arch(inv: &Inventory) -> BTreeMap<String, Counts> {
    let mut m: BTreeMap<String, Counts> = BTreeMap::new();
    for g in &inv.gpus {
        let Some(arch) = g.arch.as_deref() else {
            continue;
        };
        let mut rc = custom_name("GPU_", arch);
        let n = match g.sharing {
            Some(s) => {
                rc.push_str(crate::request::extra_specs::SHARED_SUFFIX);
                s.replicas
            }
            None => 1,
        };
        let e = m.entry(rc).or_default();
        e.total += n;
        e.max_unit += 1;
        // Unusable (quarantined, draining…), or in MIG mode (handed out as instances, never
        // whole, never shared): not for flavors.
        if !g.usable() || !g.migs.is_empty() {
            e.reserved += n;
        }
    }
    // `max_unit`: whole GPUs, one each; shared, at most one slot of each GPU per request.
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
        for (rc, c) in &arches {
            let _ = write!(
                out,
                "        - {rc}:\n            total: {}\n            reserved: {}\n            min_unit: 1\n            max_unit: {}\n            step_size: 1\n            allocation_ratio: 1.0\n",
                c.total, c.reserved, c.max_unit
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
    fn shared_gpus_count_their_slots_in_their_own_class() {
        use crate::reserve::alloc::tests::gpu;
        let mut inv = Inventory {
            gpus: (0..4)
                .map(|i| gpu(i, Some(0), "sw0", crate::ids::Vendor::Nvidia, "fermi"))
                .collect(),
            ..Default::default()
        };
        let share = |n| Some(crate::host::config::Sharing::timeslice(n));
        inv.gpus[1].sharing = share(3);
        inv.gpus[2].sharing = share(2);
        inv.gpus[2].problem = Some("quarantined".into());
        let y = render(&inv);
        assert!(
            y.contains("        - CUSTOM_GPU_FERMI:\n            total: 2\n            reserved: 0\n            min_unit: 1\n            max_unit: 2\n"),
            "{y}"
        );
        assert!(
            y.contains("        - CUSTOM_GPU_FERMI_SHARED:\n            total: 5\n            reserved: 2\n            min_unit: 1\n            max_unit: 2\n"),
            "{y}"
        );
    }

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
