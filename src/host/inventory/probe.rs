//! The re-probe after a GPU reset (docs/guides/health.md):
//! its PCI config space reads and is not all ones, the driver bound to it lists it (the
//! NVIDIA driver: its `information` file), and that driver has not excluded it
//! (`GPU Excluded: No`). Each is read fresh, through the config's roots.

use super::nvidia::parse_nvidia_information;
use super::pci::{open_dir, read_at};
use crate::host::config::Config;
use crate::ids::Pci;
use nix::fcntl::{openat, readlinkat, OFlag};
use nix::sys::stat::Mode;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// The probe that failed: one line (what `list` shows as the quarantine's reason).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeFailure {
    #[error("no PCI function {pci} under {}: the GPU is gone from the bus", devices.display())]
    Gone { pci: Pci, devices: PathBuf },
    #[error("its PCI config space cannot be read: {cause}")]
    ConfigUnreadable { cause: String },
    #[error("its PCI config space reads as all ones: fallen off the bus")]
    ConfigAllOnes,
    #[error("no driver is bound to it")]
    Unbound,
    #[error("bound to the nvidia driver, which no longer lists it (no {})", path.display())]
    NotListed { path: PathBuf },
    #[error("excluded by the NVIDIA driver (GPU Excluded: Yes)")]
    Excluded,
}

/// Every probe of the GPU at `pci`, in order; the first that fails.
pub fn probe(cfg: &Config, pci: Pci) -> Result<(), ProbeFailure> {
    config_probe(cfg, pci)?;
    let devices_path = cfg.sysfs.join("bus/pci/devices");
    let devices = open_dir(&devices_path).ok_or_else(|| ProbeFailure::Gone {
        pci,
        devices: devices_path.clone(),
    })?;
    let name = pci.as_str();
    let driver = match readlinkat(devices.as_fd(), format!("{name}/driver").as_str()) {
        Ok(t) => {
            let t = t.as_bytes();
            String::from_utf8_lossy(t.rsplit(|b| *b == b'/').next().unwrap_or(t)).into_owned()
        }
        Err(_) => return Err(ProbeFailure::Unbound),
    };
    if driver != "nvidia" {
        // Another GPU driver has no list of its own to look in: bound is listed.
        return Ok(());
    }
    let gpus = cfg.proc.join("driver/nvidia/gpus");
    let path = gpus.join(name).join("information");
    let text = open_dir(&gpus)
        .and_then(|d| read_at(d.as_fd(), &format!("{name}/information")))
        .ok_or(ProbeFailure::NotListed { path })?;
    if parse_nvidia_information(&text).excluded {
        return Err(ProbeFailure::Excluded);
    }
    Ok(())
}

/// The first probe alone: the GPU's PCI config space reads, and not as all ones (a GPU that
/// fell off the bus answers every read with all ones). [`ProbeFailure::Gone`] when the
/// function is not under `<sys>/bus/pci/devices` at all.
pub fn config_probe(cfg: &Config, pci: Pci) -> Result<(), ProbeFailure> {
    let devices_path = cfg.sysfs.join("bus/pci/devices");
    let gone = || ProbeFailure::Gone {
        pci,
        devices: devices_path.clone(),
    };
    let devices = open_dir(&devices_path).ok_or_else(gone)?;
    let name = pci.as_str();
    let config = match openat(
        devices.as_fd(),
        format!("{name}/config").as_str(),
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Err(gone()),
        Err(e) => {
            return Err(ProbeFailure::ConfigUnreadable {
                cause: std::io::Error::from(e).to_string(),
            })
        }
    };
    let mut id = [0u8; 4];
    match nix::unistd::read(&config, &mut id) {
        Ok(4) if id == [0xff; 4] => return Err(ProbeFailure::ConfigAllOnes),
        Ok(4) => {}
        Ok(n) => {
            return Err(ProbeFailure::ConfigUnreadable {
                cause: format!("{n} of its first 4 bytes read"),
            })
        }
        Err(e) => {
            return Err(ProbeFailure::ConfigUnreadable {
                cause: std::io::Error::from(e).to_string(),
            })
        }
    }
    Ok(())
}

/// The GPU's own nodes as its driver names them, read without a look at its config space (a
/// GPU that fell off the bus, or whose reset failed, may still be open somewhere):
/// `/dev/nvidiaN` from the NVIDIA driver's `Device Minor`, the DRM nodes its sysfs `drm`
/// directory lists. What a reset looks for in processes' descriptors, beside what the
/// inventory lists.
pub fn own_nodes_of(cfg: &Config, pci: Pci) -> Vec<crate::node::Node> {
    use std::os::unix::fs::FileTypeExt;
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let name = pci.as_str();
    let info = cfg.proc.join("driver/nvidia/gpus").join(name);
    let minor = open_dir(&info)
        .and_then(|d| read_at(d.as_fd(), "information"))
        .and_then(|t| parse_nvidia_information(&t).minor);
    if let Some(m) = minor {
        let host = cfg.dev.join(format!("nvidia{m}"));
        if let Ok(md) = std::fs::symlink_metadata(&host) {
            if md.file_type().is_char_device() {
                let r = md.rdev();
                out.push(crate::node::Node::new(
                    format!("/dev/nvidia{m}"),
                    libc::major(r),
                    libc::minor(r),
                ));
            }
        }
    }
    let drm = cfg.sysfs.join("bus/pci/devices").join(name).join("drm");
    if let Ok(rd) = std::fs::read_dir(&drm) {
        let mut names: Vec<String> = rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("card") || n.starts_with("renderD"))
            .collect();
        names.sort();
        for n in names {
            let num = std::fs::read_to_string(drm.join(&n).join("dev")).ok();
            let parsed = num.as_deref().and_then(|s| {
                let (a, b) = s.trim().split_once(':')?;
                Some((a.parse().ok()?, b.parse().ok()?))
            });
            if let Some((major, minor)) = parsed {
                out.push(crate::node::Node::new(
                    format!("/dev/dri/{n}"),
                    major,
                    minor,
                ));
            }
        }
    }
    out
}
