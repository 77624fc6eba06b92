//! What a VM's hostdevs hold on this host ([`ask`]): each a whole GPU with its companion
//! functions, or a mediated device of a GPU.

use super::error::VmError;
use crate::host::config::Config;
use crate::host::inventory::{gpus_of_device, mdev_parent};
use crate::ids::Unit;
use crate::request::hostdev::{Hostdev, QemuDomain};
use std::collections::BTreeMap;
use std::fmt;

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
