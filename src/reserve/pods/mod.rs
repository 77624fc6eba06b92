//! Kubernetes' door onto the pool: what kubelet's device plugin advertises and allocates. A
//! pod asks for `gpuhook.io/gpu`, `gpuhook.io/gpu-shared` or `gpuhook.io/mig-PROFILE` in its
//! `resources.limits`; kubelet knows a node's units only from a device plugin, which
//! `gpuhook-device-plugin` is, over these functions:
//!
//! - [`units`]: every unit of the pool as kubelet sees it: its resource, device ID, NUMA node
//!   and health, which follows the pool (free, or held by a pod's allocation: healthy;
//!   anything else: unhealthy, with why);
//! - [`allocate`]: kubelet's `Allocate`: the units reserved at once for a pod (holder kind
//!   `pod`, pending until a container is created with them), or refused in one line naming
//!   who took one; what the container gets (device specs, the `gpuhook.io/allocation`
//!   annotation, CDI names); `GetPreferredAllocation`'s choice ([`allocate::preferred`]);
//! - [`kubelet`]: what kubelet says of its pods (its pod resources API, or its checkpoint
//!   file): pending allocations of pods it no longer lists are freed, the others named;
//! - [`profiles`]: the MIG profile of each compute instance, as the driver names it
//!   (`nvidia-smi mig -lci`).
//!
//! The OCI runtime's side (a container created with `gpuhook.io/allocation`) is the
//! lifecycle's `pod_create` step.

pub mod allocate;
pub mod error;
pub mod kubelet;
pub mod profiles;
#[cfg(test)]
mod tests;
pub mod units;

pub use allocate::{allocate, preferred, Allocated};
pub use error::PodError;
pub use kubelet::{sync, KubeletView, PodDevices, Source};
pub use profiles::Profiles;
pub use units::{advertise, Device, Health, Resource};

use crate::ids::{Pci, Unit};

/// The annotation kubelet's `Allocate` answer gives a container: the allocation's ID, which
/// `gpuhook-runtime` turns into the container's reservation.
pub const ANNOTATION: &str = "gpuhook.io/allocation";

/// A unit's device ID, as kubelet's device plugin API carries it (at most 63 characters): a
/// whole GPU by its PCI address (`0000:3b:00.0`), a MIG compute instance by `PCI:GI:CI`
/// (`0000:18:00.0:7:0`: the driver's files give no instance UUID), a shared GPU's slot by
/// `PCI/slot-N`.
pub fn device_id(unit: &Unit) -> String {
    match *unit {
        Unit::Gpu(p) => p.to_string(),
        Unit::Mig { pci, gi, ci } => format!("{pci}:{gi}:{ci}"),
        Unit::Slot { pci, slot } => format!("{pci}/slot-{slot}"),
    }
}

/// The unit a device ID names ([`device_id`]'s inverse); `None` for anything else.
pub fn unit_of(id: &str) -> Option<Unit> {
    if let Some((pci, slot)) = id.split_once("/slot-") {
        let n = slot
            .parse()
            .ok()
            .filter(|_| slot.bytes().all(|b| b.is_ascii_digit()))?;
        return Some(Unit::Slot {
            pci: pci.parse().ok()?,
            slot: n,
        });
    }
    // `DDDD:BB:DD.F` has two colons; a MIG ID two more.
    let parts: Vec<&str> = id.split(':').collect();
    match parts.len() {
        3 => Some(Unit::Gpu(id.parse::<Pci>().ok()?)),
        5 => {
            let pci = parts[..3].join(":").parse::<Pci>().ok()?;
            let num = |s: &str| {
                s.parse::<u32>()
                    .ok()
                    .filter(|_| s.bytes().all(|b| b.is_ascii_digit()))
            };
            Some(Unit::Mig {
                pci,
                gi: num(parts[3])?,
                ci: num(parts[4])?,
            })
        }
        _ => None,
    }
}

/// A new allocation's ID: 128 random bits in hex (from the kernel's random source). Only
/// kubelet (through the `Allocate` answer) and root (the state file, the containers'
/// `config.json`) ever see one: a pod cannot guess another's to take its units.
pub fn new_alloc_id() -> std::io::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}
