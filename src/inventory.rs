//! The host's GPUs, read from sysfs, the NVIDIA driver's procfs and the device nodes, under
//! the roots of the config (so a whole fake host can be described). Read at every hook run:
//! no daemon, no cache that can go stale.

use crate::arch::{self, PciIds};
use crate::config::Config;
use crate::metadata::{normalize_pci, Capabilities, Vendor};
use nix::fcntl::{openat, readlinkat, OFlag};
use nix::sys::stat::Mode;
use serde::Serialize;
use std::fs;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("inventory: {0}")]
pub struct InventoryError(pub String);

/// A character device node: where it is in the container's `/dev`, and its number and mode
/// as `stat` of the host node gives them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct DevNode {
    /// Path inside the container, e.g. `/dev/nvidia0`, `/dev/dri/renderD128`.
    pub path: String,
    pub major: u32,
    pub minor: u32,
    /// Permission bits of the host node.
    #[serde(skip)]
    pub mode: u32,
}

impl DevNode {
    pub fn rdev(&self) -> u64 {
        libc::makedev(self.major, self.minor)
    }
}

/// Why a node comes with a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `/dev/nvidiaN`
    Nvidia,
    /// `/dev/dri/renderD*`
    Render,
    /// `/dev/dri/card*`
    Card,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// Position in PCI address order among all GPUs found (excluded ones included).
    pub index: usize,
    pub pci: String,
    pub vendor: Vendor,
    pub vendor_id: u16,
    pub device_id: u16,
    pub model: String,
    pub arch: Option<String>,
    pub uuid: Option<String>,
    pub numa_node: Option<u32>,
    /// The PCI device (or root complex) the GPU hangs from: GPUs that share it are close.
    pub parent: Option<String>,
    /// The GPU's own nodes.
    pub nodes: Vec<(Role, DevNode)>,
    pub excluded: bool,
    /// Why this GPU cannot be given to a container (driver missing, node missing, …).
    pub problem: Option<String>,
}

impl Gpu {
    pub fn usable(&self) -> bool {
        !self.excluded && self.problem.is_none()
    }

    /// The GPU's nodes a container gets with the given capabilities.
    pub fn nodes_for(&self, caps: Capabilities) -> impl Iterator<Item = &DevNode> {
        self.nodes
            .iter()
            .filter(move |(role, _)| match (self.vendor, role) {
                (Vendor::Nvidia, Role::Nvidia) => true,
                (Vendor::Nvidia, _) => caps.graphics,
                (_, Role::Render) => true,
                (_, Role::Card) => caps.graphics,
                (_, Role::Nvidia) => false,
            })
            .map(|(_, n)| n)
    }

    /// Every node of the GPU, for listings.
    pub fn paths(&self) -> Vec<String> {
        self.nodes.iter().map(|(_, n)| n.path.clone()).collect()
    }
}

/// Shared control nodes: one set per host, granted with a container's first GPU of the vendor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    NvidiaCtl,
    NvidiaUvm,
    NvidiaUvmTools,
    NvidiaModeset,
    Kfd,
}

impl Control {
    const ALL: [(Control, &'static str); 5] = [
        (Control::NvidiaCtl, "nvidiactl"),
        (Control::NvidiaUvm, "nvidia-uvm"),
        (Control::NvidiaUvmTools, "nvidia-uvm-tools"),
        (Control::NvidiaModeset, "nvidia-modeset"),
        (Control::Kfd, "kfd"),
    ];

    fn wanted(self, vendor: Vendor, caps: Capabilities) -> bool {
        match (self, vendor) {
            (Control::NvidiaCtl, Vendor::Nvidia) => true,
            (Control::NvidiaUvm | Control::NvidiaUvmTools, Vendor::Nvidia) => caps.compute,
            (Control::NvidiaModeset, Vendor::Nvidia) => caps.graphics,
            (Control::Kfd, Vendor::Amd) => caps.compute,
            _ => false,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Inventory {
    pub gpus: Vec<Gpu>,
    pub controls: Vec<(Control, DevNode)>,
}

impl Inventory {
    pub fn by_pci(&self, pci: &str) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.pci == pci)
    }

    /// Every node a container holding `gpus` (PCI addresses) gets: the GPUs' own nodes, then
    /// the control nodes their vendors need for the capabilities, each once, in a stable order.
    pub fn nodes_for(&self, gpus: &[String], caps: Capabilities) -> Vec<DevNode> {
        let chosen: Vec<&Gpu> = gpus.iter().filter_map(|p| self.by_pci(p)).collect();
        let mut out: Vec<DevNode> = chosen
            .iter()
            .flat_map(|g| g.nodes_for(caps).cloned())
            .collect();
        for (ctl, node) in &self.controls {
            if chosen.iter().any(|g| ctl.wanted(g.vendor, caps)) {
                out.push(node.clone());
            }
        }
        let mut seen = std::collections::HashSet::new();
        out.retain(|n| seen.insert(n.path.clone()));
        out
    }
}

/// The host node behind container path `/dev/<rel>`: must be a character device (not a
/// symlink to one).
fn host_node(dev_root: &Path, rel: &str) -> Result<DevNode, String> {
    let p = dev_root.join(rel);
    let md = fs::symlink_metadata(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    if !md.file_type().is_char_device() {
        return Err(format!("{} is not a character device", p.display()));
    }
    let rdev = md.rdev();
    Ok(DevNode {
        path: format!("/dev/{rel}"),
        major: libc::major(rdev),
        minor: libc::minor(rdev),
        mode: md.mode() & 0o777,
    })
}

/// Reads a small sysfs/proc file into a string: open, one read (sysfs and procfs hand the
/// whole attribute over in one read; a short read of a regular file is its end), close.
fn read_small(p: &Path) -> Option<String> {
    read_fd(fs::File::open(p).ok()?)
}

/// Like [`read_small`], relative to an open directory (no path walk from the root).
fn read_at(dir: &OwnedFd, name: &str) -> Option<String> {
    read_fd(fs::File::from(
        openat(dir, name, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).ok()?,
    ))
}

fn read_fd(mut f: fs::File) -> Option<String> {
    let mut buf = [0u8; 4096];
    let n = f.read(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

fn hex(s: Option<String>) -> Option<u32> {
    let s = s?;
    let s = s.trim();
    u32::from_str_radix(s.strip_prefix("0x").unwrap_or(s), 16).ok()
}

/// NVIDIA driver facts of one GPU (`/proc/driver/nvidia/gpus/<bus>/information`).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct NvidiaInfo {
    pub model: Option<String>,
    pub uuid: Option<String>,
    pub minor: Option<u32>,
    pub excluded: bool,
}

pub fn parse_nvidia_information(text: &str) -> NvidiaInfo {
    let mut info = NvidiaInfo::default();
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        match k.trim() {
            "Model" if !v.is_empty() => info.model = Some(v.to_owned()),
            "GPU UUID" if !v.is_empty() && !v.contains('?') => info.uuid = Some(v.to_owned()),
            "Device Minor" => info.minor = v.parse().ok(),
            "GPU Excluded" => info.excluded = v.eq_ignore_ascii_case("yes"),
            _ => {}
        }
    }
    info
}

const DISPLAY_CLASSES: [u32; 3] = [0x030000, 0x030200, 0x038000];

/// What a scan must read beyond what choosing GPUs needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scan {
    /// The DRM nodes of NVIDIA GPUs (only nodes a container gets with `graphics`).
    pub nvidia_drm: bool,
}

impl Scan {
    /// Everything (for listings).
    pub const FULL: Scan = Scan { nvidia_drm: true };

    /// What a hook run for a request with these capabilities needs.
    pub fn for_caps(caps: Capabilities) -> Scan {
        Scan {
            nvidia_drm: caps.graphics,
        }
    }
}

/// Reads the host's GPUs (everything).
pub fn scan(cfg: &Config) -> Result<Inventory, InventoryError> {
    scan_with(cfg, Scan::FULL)
}

/// Reads the host's GPUs. Each PCI device directory is opened once and its attributes read
/// relative to it; the class is read first, so non-display devices cost one small read.
pub fn scan_with(cfg: &Config, what: Scan) -> Result<Inventory, InventoryError> {
    let devices = cfg.sysfs.join("bus/pci/devices");
    let dirfd = nix::fcntl::open(
        &devices,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| InventoryError(format!("cannot list {}: {e}", devices.display())))?;
    let entries = fs::read_dir(&devices)
        .map_err(|e| InventoryError(format!("cannot list {}: {e}", devices.display())))?;
    struct Found {
        pci: String,
        dir: OwnedFd,
        name: std::ffi::OsString,
        vendor: u16,
    }
    let mut found: Vec<Found> = Vec::new();
    for ent in entries.flatten() {
        let name = ent.file_name();
        let Some(pci) = name.to_str().and_then(normalize_pci) else {
            continue;
        };
        let Ok(dir) = openat(
            &dirfd,
            name.as_os_str(),
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        let Some(class) = hex(read_at(&dir, "class")) else {
            continue;
        };
        if !DISPLAY_CLASSES.contains(&class) {
            continue;
        }
        let Some(vendor) = hex(read_at(&dir, "vendor")) else {
            continue;
        };
        if Vendor::from_pci_id(vendor as u16).is_none() {
            continue;
        }
        found.push(Found {
            pci,
            dir,
            name,
            vendor: vendor as u16,
        });
    }
    found.sort_by(|a, b| a.pci.cmp(&b.pci));

    let mut pci_ids = PciIds::new(cfg.pci_ids.as_deref());
    let mut inv = Inventory::default();
    for (index, f) in found.into_iter().enumerate() {
        let (pci, dir, vendor_id) = (f.pci, f.dir, f.vendor);
        let vendor = Vendor::from_pci_id(vendor_id).expect("filtered above");
        let device_id = hex(read_at(&dir, "device")).unwrap_or(0) as u16;
        let numa_node = read_at(&dir, "numa_node")
            .and_then(|s| s.trim().parse::<i64>().ok())
            .and_then(|n| u32::try_from(n).ok());
        let parent = readlinkat(&dirfd, f.name.as_os_str())
            .ok()
            .and_then(|t| {
                let t = PathBuf::from(t);
                let comps: Vec<String> = t
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                comps.len().checked_sub(2).map(|i| comps[i].clone())
            })
            .filter(|p| p != ".." && p != "devices");
        let mut gpu = Gpu {
            index,
            excluded: cfg.is_excluded(&pci),
            pci,
            vendor,
            vendor_id,
            device_id,
            model: String::new(),
            arch: None,
            uuid: None,
            numa_node,
            parent,
            nodes: vec![],
            problem: None,
        };
        let sys_dir = devices.join(&f.name);
        let mut driver_model = None;
        match vendor {
            Vendor::Nvidia => {
                let info_path = cfg
                    .proc
                    .join("driver/nvidia/gpus")
                    .join(&gpu.pci)
                    .join("information");
                match read_small(&info_path) {
                    None => {
                        gpu.problem = Some(format!(
                            "NVIDIA driver has no {} (driver not loaded?)",
                            info_path.display()
                        ))
                    }
                    Some(text) => {
                        let info = parse_nvidia_information(&text);
                        driver_model = info.model;
                        gpu.uuid = info.uuid;
                        if info.excluded {
                            gpu.problem =
                                Some("excluded by the NVIDIA driver (GPU Excluded: Yes)".into());
                        }
                        match info.minor {
                            None => {
                                gpu.problem =
                                    Some(format!("no Device Minor in {}", info_path.display()))
                            }
                            Some(m) => match host_node(&cfg.dev, &format!("nvidia{m}")) {
                                Ok(n) => gpu.nodes.push((Role::Nvidia, n)),
                                Err(e) => gpu.problem = Some(e),
                            },
                        }
                    }
                }
                if what.nvidia_drm {
                    add_drm_nodes(cfg, &sys_dir, &mut gpu, false);
                }
            }
            Vendor::Amd | Vendor::Intel => add_drm_nodes(cfg, &sys_dir, &mut gpu, true),
        }
        let ov = cfg.override_for(&gpu.pci, vendor_id, device_id);
        let builtin = arch::builtin(vendor_id, device_id);
        gpu.arch = ov.arch.clone().or_else(|| builtin.map(|b| b.0.to_owned()));
        gpu.model = ov
            .model
            .clone()
            .or(driver_model)
            .or_else(|| builtin.map(|b| b.1.to_owned()))
            .unwrap_or_default();
        if gpu.arch.is_none() || gpu.model.is_empty() {
            if let Some((a, m)) = pci_ids.lookup(vendor_id, device_id) {
                if gpu.arch.is_none() {
                    gpu.arch = a.map(str::to_owned);
                }
                if gpu.model.is_empty() {
                    gpu.model = m;
                }
            }
        }
        if gpu.model.is_empty() {
            gpu.model = format!("{vendor_id:04x}:{device_id:04x}");
        }
        inv.gpus.push(gpu);
    }
    for (ctl, name) in Control::ALL {
        if let Ok(n) = host_node(&cfg.dev, name) {
            inv.controls.push((ctl, n));
        }
    }
    Ok(inv)
}

/// DRM nodes of a GPU from sysfs `drm/`; `required`: a render node is the GPU's own node.
fn add_drm_nodes(cfg: &Config, dir: &Path, gpu: &mut Gpu, required: bool) {
    let mut names: Vec<String> = fs::read_dir(dir.join("drm"))
        .map(|it| {
            it.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    let mut render = false;
    for name in names {
        let role = if name.starts_with("renderD")
            && name[7..].bytes().all(|b| b.is_ascii_digit())
            && name.len() > 7
        {
            Role::Render
        } else if name.starts_with("card")
            && name[4..].bytes().all(|b| b.is_ascii_digit())
            && name.len() > 4
        {
            Role::Card
        } else {
            continue;
        };
        match host_node(&cfg.dev, &format!("dri/{name}")) {
            Ok(n) => {
                render |= role == Role::Render;
                gpu.nodes.push((role, n));
            }
            Err(e) if required && role == Role::Render => gpu.problem = Some(e),
            Err(_) => {}
        }
    }
    if required && !render && gpu.problem.is_none() {
        gpu.problem = Some(format!(
            "no DRM render node under {}/drm (driver not loaded?)",
            dir.display()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_information_formats() {
        // Driver 260-era (Fermi) and 535-era files.
        let old = "Model: \t\t Tesla M2050\nIRQ:   \t\t 16\nGPU UUID: \t GPU-6f9d1a4e-5a4c-9a61-1d3b-2b1c0f5e8a71\nVideo BIOS: \t 70.00.2f.00.03\nBus Type: \t PCIe\nDMA Size: \t 40 bits\nDMA Mask: \t 0xffffffffff\nBus Location: \t 0000:07:00.0\nDevice Minor: \t 1\n";
        let i = parse_nvidia_information(old);
        assert_eq!(i.model.as_deref(), Some("Tesla M2050"));
        assert_eq!(
            i.uuid.as_deref(),
            Some("GPU-6f9d1a4e-5a4c-9a61-1d3b-2b1c0f5e8a71")
        );
        assert_eq!(i.minor, Some(1));
        assert!(!i.excluded);
        let new = "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 182\nGPU UUID: \t GPU-58eb8aad-1f2f-4b4d-8f5e-0d3e2f0c4a11\nVideo BIOS: \t 96.00.74.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t 0000:18:00.0\nDevice Minor: \t 0\nGPU Excluded:\t Yes\nGPU Firmware:\t 535.129.03\n";
        let i = parse_nvidia_information(new);
        assert_eq!(i.minor, Some(0));
        assert!(i.excluded);
        let garbled = parse_nvidia_information("GPU UUID: \t ??\nDevice Minor: \t x\n");
        assert_eq!(garbled, NvidiaInfo::default());
    }
}
