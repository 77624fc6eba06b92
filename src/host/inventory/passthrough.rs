//! What a virtual machine's hostdevs name on this host, read straight from sysfs without a
//! scan of every function: the GPUs among the functions of one PCI device (the device of a
//! hostdev's address: a GPU and its companion functions, its audio, USB and serial
//! controllers), and the GPU a mediated device (a vGPU) belongs to.

use super::pci::{is_gpu, open_dir, pci_ids};
use crate::host::config::Config;
use crate::ids::{MdevId, Pci};
use nix::fcntl::readlinkat;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// A GPU found at a hostdev's PCI device: its address and PCI ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceGpu {
    pub pci: Pci,
    pub vendor_id: u16,
    pub device_id: u16,
}

/// The GPUs among the eight functions of the PCI device of `addr` (its domain, bus and
/// slot), in function order: what a hostdev naming any of those functions holds. The
/// functions are read as a scan reads them (class and ids from `uevent`), so what is a GPU
/// here is one in `gpuhook list`.
pub fn gpus_of_device(cfg: &Config, addr: Pci) -> Vec<DeviceGpu> {
    let Some(dir) = open_dir(&cfg.sysfs.join("bus/pci/devices")) else {
        return Vec::new();
    };
    let device = &addr.as_str()[..10];
    (0..8)
        .filter_map(|f| {
            let name = format!("{device}.{f}");
            let (class, vendor_id, device_id) = pci_ids(dir.as_fd(), &name)?;
            is_gpu(class, vendor_id).then(|| DeviceGpu {
                pci: name.parse().expect("a PCI address"),
                vendor_id,
                device_id,
            })
        })
        .collect()
}

/// Every function of the PCI device of `addr` that sysfs lists, in function order: what a VM
/// is given with a GPU (its audio, USB and serial controllers share its IOMMU group).
pub fn functions_of_device(cfg: &Config, addr: Pci) -> Vec<Pci> {
    let devices = cfg.sysfs.join("bus/pci/devices");
    let device = &addr.as_str()[..10];
    (0..8)
        .filter_map(|f| {
            let name = format!("{device}.{f}");
            devices
                .join(&name)
                .exists()
                .then(|| name.parse().expect("a PCI address"))
        })
        .collect()
}

/// Why a mediated device's GPU cannot be told.
#[derive(Debug, thiserror::Error)]
pub enum MdevParentError {
    #[error("mediated device {mdev}: {} names no PCI device as its parent", path.display())]
    NoParent { mdev: MdevId, path: PathBuf },
}

/// The PCI function a mediated device belongs to, from sysfs
/// (`bus/mdev/devices/UUID` → `…/PARENT/UUID`); for one made on an SR-IOV virtual function
/// (NVIDIA's vGPU since Ampere), the physical function (`PARENT/physfn`). `None` when the
/// host has no such mediated device (libvirt then fails the start itself).
pub fn mdev_parent(cfg: &Config, mdev: MdevId) -> Result<Option<Pci>, MdevParentError> {
    let path = cfg.sysfs.join("bus/mdev/devices").join(mdev.to_string());
    let Ok(target) = std::fs::read_link(&path) else {
        return Ok(None);
    };
    let parent = target
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .and_then(Pci::normalize)
        .ok_or(MdevParentError::NoParent { mdev, path })?;
    // A virtual function's physical function.
    let physfn = open_dir(&cfg.sysfs.join("bus/pci/devices")).and_then(|d| {
        let t = readlinkat(d.as_fd(), format!("{parent}/physfn").as_str()).ok()?;
        let name = t.as_bytes().rsplit(|b| *b == b'/').next()?;
        Pci::normalize(std::str::from_utf8(name).ok()?)
    });
    Ok(Some(physfn.unwrap_or(parent)))
}
