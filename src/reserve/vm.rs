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
use crate::host::inventory::{config_probe, gpus_of_device, mdev_parent, Inventory};
use crate::host::procfs::Proc;
use crate::ids::{Pci, Unit};
use crate::log;
use crate::request::hostdev::{Hostdev, QemuDomain};
use crate::reserve::alloc::{self, Held};
use crate::reserve::state::State;
use std::collections::BTreeMap;
use std::fmt;

mod choose;
pub mod error;
#[cfg(test)]
mod tests;

pub use choose::{choose, ChosenGpu, ForVm};
pub use error::VmError;

/// What a VM's hostdevs hold on this host: its units, each with the hostdevs that name it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmAsk {
    /// Whole GPUs and mediated devices, in unit order, each once.
    pub units: Vec<Unit>,
    /// Which hostdevs name each unit.
    pub named: BTreeMap<Unit, Vec<Hostdev>>,
}

impl VmAsk {
    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    /// How a message names what holds `unit`: `hostdev 0000:3b:00.1`, `mdev UUID`.
    pub fn by(&self, unit: &Unit) -> String {
        self.named
            .get(unit)
            .map(|v| {
                v.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    }
}

/// As the state's `request` and the log name it: `GPU 0000:3b:00.0 (hostdev 0000:3b:00.0,
/// hostdev 0000:3b:00.1), mdev UUID of GPU 0000:3c:00.0`.
impl fmt::Display for VmAsk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, u) in self.units.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match u {
                Unit::Mdev { mdev, .. } => write!(f, "mdev {mdev} of GPU {}", u.pci())?,
                u => write!(f, "GPU {u} ({})", self.by(u))?,
            }
        }
        Ok(())
    }
}

/// The units the domain's hostdevs hold. Hostdevs of functions that are no GPU's (and whose
/// device has no GPU) and mediated devices of other devices are left alone; a GPU passed
/// through whole and as a mediated device at once is refused.
pub fn ask(cfg: &Config, dom: &QemuDomain) -> Result<VmAsk, VmError> {
    let mut a = VmAsk::default();
    for h in &dom.hostdevs {
        let units: Vec<Unit> = match h {
            Hostdev::Pci { addr, .. } => match addr.pci() {
                Some(p) => gpus_of_device(cfg, p)
                    .into_iter()
                    .map(|g| Unit::Gpu(g.pci))
                    .collect(),
                None => Vec::new(),
            },
            Hostdev::Mdev { uuid } => match mdev_parent(cfg, *uuid)? {
                Some(p) if gpus_of_device(cfg, p).iter().any(|g| g.pci == p) => {
                    Unit::mdev(p, *uuid).into_iter().collect()
                }
                _ => Vec::new(),
            },
        };
        for u in units {
            a.named.entry(u).or_default().push(*h);
        }
    }
    a.units = a.named.keys().copied().collect();
    for u in &a.units {
        let pci = u.pci();
        if u.is_mdev() && a.named.contains_key(&Unit::Gpu(pci)) {
            return Err(VmError::WholeAndMdev {
                pci,
                whole: a.by(&Unit::Gpu(pci)),
                mdev: a.by(u),
            });
        }
    }
    Ok(a)
}

/// A running VM's passed-through unit that no reservation names: the VM (its name and
/// UUID) as libvirt's status XML shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassedVm {
    pub name: String,
    pub uuid: String,
}

impl PassedVm {
    /// How messages name it.
    pub fn who(&self) -> String {
        crate::reserve::state::HolderKind::Vm.who(&self.name)
    }
}

/// The units running VMs pass through, by libvirt's live status XML, each with its VM.
#[derive(Debug, Clone, Default)]
pub struct PassedThrough(BTreeMap<Unit, PassedVm>);

impl PassedThrough {
    /// For tests: these units passed through to these VMs.
    pub fn of(v: impl IntoIterator<Item = (Unit, PassedVm)>) -> PassedThrough {
        PassedThrough(v.into_iter().collect())
    }

    /// The VM (other than the one of UUID `except`) that passes GPU `pci` through, whole or
    /// as a mediated device; with a mediated device, the unit.
    pub fn of_gpu(&self, pci: Pci, except: Option<&str>) -> Option<(Unit, &PassedVm)> {
        self.0
            .range(Unit::Gpu(pci)..)
            .take_while(|(u, _)| u.pci() == pci)
            .find(|(_, v)| Some(v.uuid.as_str()) != except)
            .map(|(u, v)| (*u, v))
    }

    /// Every unit and its VM.
    pub fn iter(&self) -> impl Iterator<Item = (&Unit, &PassedVm)> {
        self.0.iter()
    }
}

/// What the running VMs pass through, by libvirt's status directory (read-only; a status
/// file that cannot be read is said in the log and counts for nothing).
pub fn passed_through(cfg: &Config, proc: Proc) -> PassedThrough {
    let (vms, unread) = crate::host::qemu::running_with_hostdevs(cfg, proc);
    for e in unread {
        log::warn(&format!("libvirt's QEMU status: {e}"));
    }
    let mut m = BTreeMap::new();
    for vm in vms {
        let d = &vm.status.domain;
        let a = match ask(cfg, d) {
            Ok(a) => a,
            Err(e) => {
                log::warn(&format!("vm '{}': libvirt's status XML: {e}", d.name));
                continue;
            }
        };
        for u in a.units {
            m.entry(u).or_insert(PassedVm {
                name: d.name.clone(),
                uuid: d.uuid.clone(),
            });
        }
    }
    PassedThrough(m)
}

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
