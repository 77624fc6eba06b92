//! `gpuhook-libvirt request VM --count N …`: GPUs for a VM, chosen by the rules a container's
//! are chosen by (filters, named devices, NUMA node and PCIe topology, health, draining,
//! held), but for what a VM may have that a container may not: a GPU bound to `vfio-pci` (or
//! with no driver) is free for it. Nothing is reserved: the VM's `prepare` does that.

use super::passed::PassedThrough;
use crate::host::config::Config;
use crate::host::inventory::{config_probe, functions_of_device, Gpu, Inventory};
use crate::ids::{Pci, Unit};
use crate::request::{Request, Wording};
use crate::reserve::alloc::{self, AllocError};
use crate::reserve::state::{HolderId, State};

/// A GPU chosen for a VM, with every function of its PCI device (the GPU's first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChosenGpu {
    pub gpu: Pci,
    pub functions: Vec<Pci>,
}

/// Which VM a choice is for, and where.
#[derive(Debug, Clone, Copy)]
pub struct ForVm<'a> {
    /// The VM's UUID: its own reservation is no obstacle.
    pub uuid: &'a str,
    /// Only GPUs on this NUMA node.
    pub numa: Option<u32>,
    /// GPUs its definition passes through already: not chosen again.
    pub taken: &'a [Pci],
}

/// Chooses `req`'s GPUs for the VM `vm`.
pub fn choose(
    cfg: &Config,
    inv: &Inventory,
    st: &State,
    passed: &PassedThrough,
    vm: ForVm,
    req: &Request,
) -> Result<Vec<ChosenGpu>, AllocError> {
    let ForVm { uuid, numa, taken } = vm;
    let key = HolderId::Vm {
        name: String::new(),
        uuid: uuid.to_string(),
    }
    .key();
    let mut held = st.held(Some(&key));
    for p in taken {
        held.insert(Unit::Gpu(*p), "its own definition (a hostdev)".into());
    }
    let gpus: Vec<Gpu> = inv
        .gpus
        .iter()
        .map(|g| Gpu {
            problem: for_a_vm(cfg, st, passed, uuid, g, numa),
            pending: false,
            ..g.clone()
        })
        .collect();
    // A refusal says what a VM can have instead (never MIG instances, nor slots).
    let units = alloc::allocate(&gpus, &held, req).map_err(|e| e.in_words(Wording::Vm))?;
    Ok(units
        .into_iter()
        .map(|u| {
            let gpu = u.pci();
            let mut functions = functions_of_device(cfg, gpu);
            functions.retain(|f| *f != gpu);
            functions.insert(0, gpu);
            ChosenGpu { gpu, functions }
        })
        .collect())
}

/// Why a VM cannot have GPU `g`: its health, its config space, another running VM, another
/// NUMA node; not its driver (libvirt binds it to `vfio-pci`).
fn for_a_vm(
    cfg: &Config,
    st: &State,
    passed: &PassedThrough,
    uuid: &str,
    g: &Gpu,
    numa: Option<u32>,
) -> Option<String> {
    if let Some(p) = crate::reserve::health::unusable(st, g.pci) {
        return Some(p);
    }
    if let Some(n) = numa.filter(|n| g.numa_node != Some(*n)) {
        return Some(format!("not on NUMA node {n}"));
    }
    if let Some((_, vm)) = passed.of_gpu(g.pci, Some(uuid)) {
        return Some(format!("passed through to {}", vm.who()));
    }
    config_probe(cfg, g.pci).err().map(|e| e.to_string())
}
