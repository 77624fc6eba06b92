//! What running VMs pass through without a reservation, by libvirt's live status XML
//! ([`passed_through`]).

use super::ask::ask;
use crate::host::config::Config;
use crate::host::procfs::Proc;
use crate::ids::{Pci, Unit};
use crate::log;
use std::collections::BTreeMap;

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
