//! The names kubelet's API carries: a unit's device ID, a new allocation's ID, and the
//! annotation that hands it to the container.

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
        // A VM's mediated device is no pod's: never advertised, never parsed back.
        Unit::Mdev { .. } => unit.to_string(),
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
