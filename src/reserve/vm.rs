//! Virtual machines in the one pool: what a QEMU domain's hostdevs hold ([`ask`]), whether it
//! may have them now ([`check`]), and the GPUs running VMs have that gpuhook did not hand out
//! ([`passed_through`], from libvirt's live status XML: a GPU bound to `vfio-pci` before
//! gpuhook's hook was installed, or hot-plugged with `virsh attach-device`, for which libvirt
//! runs no hook).
//!
//! A PCI hostdev holds every GPU among the functions of its PCI device (a hostdev naming only
//! a GPU's audio function holds the GPU): whole, exclusively, with its companion functions.
//! An mdev hostdev holds its mediated device, [`Unit::Mdev`] of its parent GPU: VMs share the
//! GPU's mediated devices, and while one is held no one else gets the GPU (whole, as a slot,
//! as MIG instances). The XML is the tenant's: nothing here frees, moves or changes another
//! holder's reservation; what the status XML says only refuses.

use crate::host::config::Config;
use crate::host::inventory::{config_probe, gpus_of_device, Inventory};
use crate::host::procfs::Proc;
use crate::ids::{Pci, Unit};
use crate::reserve::alloc::{self, Held};
use crate::reserve::state::State;

mod ask;
mod choose;
pub mod error;
mod passed;
#[cfg(test)]
mod tests;

pub use ask::{ask, VmAsk};
pub use choose::{choose, ChosenGpu, ForVm};
pub use error::VmError;
pub use passed::{passed_through, PassedThrough, PassedVm};

/// [`passed_through`], then [`mark_passed_through`]: what running VMs pass through, marked.
pub fn mark_running_vms(
    cfg: &Config,
    proc: Proc,
    inv: &mut Inventory,
    st: &State,
) -> PassedThrough {
    let p = passed_through(cfg, proc);
    mark_passed_through(inv, st, &p);
    p
}

/// Marks the GPUs running VMs pass through and no reservation names as unusable for a
/// container, naming the VM: a container is refused them, and told who has them.
pub fn mark_passed_through(inv: &mut Inventory, st: &State, passed: &PassedThrough) {
    for (u, vm) in passed.iter() {
        let p = u.pci();
        if st.holder_of(&Unit::Gpu(p)).is_some() {
            continue;
        }
        if let Some(g) = inv.gpus.iter_mut().find(|g| g.pci == p) {
            g.problem = Some(format!(
                "passed through to {} (running; libvirt's status XML, not reserved through gpuhook)",
                vm.who()
            ));
            g.pending = false;
        }
    }
}

/// Whether the VM of UUID `uuid` may hold `ask`'s units now: each GPU present and usable
/// (not excluded, its config space readable, not quarantined, not being reset, not scrub
/// pending, not draining), held by no one else (`held`: every other reservation's units and
/// the draining ones) and passed through to no other running VM; a whole GPU not one the
/// config shares; a mediated device's GPU held by no one but VMs' mediated devices. Whether
/// the GPU is bound to the host's driver or to `vfio-pci` does not matter: libvirt binds it
/// (`managed='yes'`), or the operator parked it.
pub fn check(
    cfg: &Config,
    st: &State,
    held: &Held,
    passed: &PassedThrough,
    uuid: &str,
    a: &VmAsk,
) -> Result<(), VmError> {
    for u in &a.units {
        let (pci, by) = (u.pci(), a.by(u));
        usable(cfg, st, pci, &by)?;
        match u {
            Unit::Mdev { .. } => {
                let whole = held
                    .get(&Unit::Gpu(pci))
                    .map(String::as_str)
                    .or_else(|| other_than_mdev(held, pci));
                if let Some(h) = whole {
                    return Err(VmError::MdevOnHeld {
                        pci,
                        by,
                        holder: h.to_string(),
                    });
                }
                if let Some(h) = held.get(u) {
                    return Err(VmError::MdevHeld {
                        unit: *u,
                        by,
                        holder: h.clone(),
                    });
                }
                match passed.of_gpu(pci, Some(uuid)) {
                    Some((p, vm)) if p == *u || !p.is_mdev() => {
                        return Err(VmError::PassedThrough {
                            pci,
                            by,
                            vm: vm.who(),
                        })
                    }
                    _ => {}
                }
            }
            _ => {
                if let Some(h) = alloc::busy(held, pci) {
                    return Err(VmError::Held {
                        pci,
                        by,
                        holder: h.to_string(),
                    });
                }
                if let Some((_, vm)) = passed.of_gpu(pci, Some(uuid)) {
                    return Err(VmError::PassedThrough {
                        pci,
                        by,
                        vm: vm.who(),
                    });
                }
                let ids = gpus_of_device(cfg, pci)
                    .into_iter()
                    .find(|g| g.pci == pci)
                    .map(|g| (g.vendor_id, g.device_id));
                if let Some(sh) = ids.and_then(|(v, d)| cfg.sharing_for(&pci, v, d)) {
                    return Err(VmError::Shareable {
                        pci,
                        by,
                        replicas: sh.replicas,
                    });
                }
            }
        }
    }
    Ok(())
}

/// Who holds GPU `pci` by anything but a mediated device (a MIG instance, a slot).
fn other_than_mdev(held: &Held, pci: Pci) -> Option<&str> {
    held.range(Unit::first_mig(pci)..)
        .take_while(|(k, _)| k.pci() == pci)
        .find(|(k, _)| !k.is_mdev())
        .map(|(_, v)| v.as_str())
}

/// The GPU itself can be passed through: not excluded, no health record against it, its
/// config space readable.
fn usable(cfg: &Config, st: &State, pci: Pci, by: &str) -> Result<(), VmError> {
    if cfg.is_excluded(&pci) {
        return Err(VmError::Excluded { pci, by: by.into() });
    }
    let problem = crate::reserve::health::unusable(st, pci)
        .or_else(|| config_probe(cfg, pci).err().map(|e| e.to_string()));
    match problem {
        Some(problem) => Err(VmError::Unusable {
            pci,
            by: by.into(),
            problem,
        }),
        None => Ok(()),
    }
}
