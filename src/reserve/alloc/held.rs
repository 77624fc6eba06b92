//! Who holds what: the held units and their holders, looked up by GPU, GPU instance, slot.

use crate::ids::{Pci, Unit};
use std::collections::BTreeMap;

/// Who holds a unit (a whole GPU, a MIG instance): unit → its holder as messages name it
/// (`domain 'web1'`, `container 'ID'`).
pub type Held = BTreeMap<Unit, String>;

/// Who holds any of the GPU: the whole GPU, one of its MIG instances, its mediated devices
/// or its slots.
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

/// Who holds GPU `pci` whole, one of its MIG instances, or one of its mediated devices (a
/// VM's vGPU): anyone but its slots' holders.
pub(super) fn whole_or_mig_holder(held: &Held, pci: Pci) -> Option<&str> {
    held.get(&Unit::Gpu(pci)).map(String::as_str).or_else(|| {
        held.range(Unit::first_mig(pci)..)
            .next()
            .filter(|(k, _)| k.pci() == pci && k.is_mig())
            .map(|(_, v)| v.as_str())
            .or_else(|| mdev_holder(held, pci))
    })
}

/// Who holds one of GPU `pci`'s mediated devices (the first, in UUID order): a VM's vGPU
/// shares the GPU with other VMs' mediated devices only.
pub fn mdev_holder(held: &Held, pci: Pci) -> Option<&str> {
    held.range(Unit::first_mdev(pci)..)
        .next()
        .filter(|(k, _)| k.pci() == pci && k.is_mdev())
        .map(|(_, v)| v.as_str())
}
