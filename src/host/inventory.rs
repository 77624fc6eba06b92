//! The host's GPUs, read from sysfs, the NVIDIA driver's procfs and the device nodes, under
//! the roots of the config (so a whole fake host can be described). Read at every hook run:
//! no daemon, no cache that can go stale.

use crate::host::arch::{self, PciIds};
use crate::host::config::Config;
use crate::ids::{normalize_pci, Vendor};
use crate::node::Node;
use crate::request::Capabilities;
use nix::fcntl::{openat, readlinkat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode};
use serde::Serialize;
use std::fs;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("inventory: {0}")]
pub struct InventoryError(pub String);

/// A host's device node: the [`Node`] a container gets (path in its `/dev`, number) and the
/// mode, as `stat` of the host node gives them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct DevNode {
    #[serde(flatten)]
    pub node: Node,
    /// Permission bits of the host node.
    #[serde(skip)]
    pub mode: u32,
}

impl std::ops::Deref for DevNode {
    type Target = Node;
    fn deref(&self) -> &Node {
        &self.node
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
    /// Driver details not read yet (lazy scan); see [`Inventory::settle`].
    pub pending: bool,
    /// The PCI driver bound to it (`nvidia`, `amdgpu`, `vfio-pci`, …).
    pub driver: Option<String>,
    /// Its MIG compute instances (read with the NVIDIA driver's details): while it has any,
    /// they are the units it is handed out in, never the whole GPU.
    pub migs: Vec<Mig>,
    /// Its PCIe link, read for listings only.
    pub link: Option<Link>,
}

/// A MIG compute instance: the parent GPU's node plus the access capabilities of its GPU
/// instance and compute instance (`/dev/nvidia-caps/nvidia-cap<m>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mig {
    pub gi: u32,
    pub ci: u32,
    pub gi_cap: DevNode,
    pub ci_cap: DevNode,
}

impl Mig {
    /// The instance's name in reservations: `0000:3b:00.0/gi1/ci0`.
    pub fn id(&self, pci: &str) -> String {
        format!("{pci}/gi{}/ci{}", self.gi, self.ci)
    }
}

/// The PCI address of a reserved unit: a whole GPU (`0000:3b:00.0`) or a MIG instance of it
/// (`0000:3b:00.0/gi1/ci0`).
pub fn unit_pci(unit: &str) -> &str {
    unit.split_once('/').map_or(unit, |(p, _)| p)
}

/// A PCIe link as sysfs shows it (`current_link_speed` `16.0 GT/s PCIe`, `…_width` `16`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Link {
    pub speed: String,
    pub max_speed: String,
    pub width: u32,
    pub max_width: u32,
}

impl Link {
    fn gts(s: &str) -> Option<f64> {
        s.split_whitespace().next()?.parse().ok()
    }

    /// Below its maximum speed or width. (An idle NVIDIA GPU lowers its link speed to save
    /// power, so a slow link is shown, never held against the GPU.)
    pub fn degraded(&self) -> bool {
        self.width < self.max_width
            || matches!((Self::gts(&self.speed), Self::gts(&self.max_speed)), (Some(a), Some(b)) if a < b)
    }
}

impl std::fmt::Display for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let short = |s: &str| s.trim_end_matches(" PCIe").to_owned();
        write!(
            f,
            "PCIe {} x{} of {} x{}",
            short(&self.speed),
            self.width,
            short(&self.max_speed),
            self.max_width
        )
    }
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
    /// PCI functions a lazy scan did not look at: unbound or passthrough functions of a GPU
    /// vendor, which may be GPUs that cannot be used. A full scan has none.
    pub deferred: usize,
}

impl Inventory {
    /// The GPU of a PCI address, or of a reserved unit (a MIG instance's is its GPU).
    pub fn by_pci(&self, pci: &str) -> Option<&Gpu> {
        let pci = unit_pci(pci);
        self.gpus.iter().find(|g| g.pci == pci)
    }

    /// The MIG instance a unit id names, with its GPU.
    pub fn mig(&self, unit: &str) -> Option<(&Gpu, &Mig)> {
        let g = self.by_pci(unit)?;
        g.migs.iter().find(|m| m.id(&g.pci) == unit).map(|m| (g, m))
    }

    /// Every node a container holding `gpus` (PCI addresses) gets: the GPUs' own nodes, then
    /// the control nodes their vendors need for the capabilities, each once, in a stable order.
    pub fn nodes_for(&self, gpus: &[String], caps: Capabilities) -> Vec<DevNode> {
        let chosen: Vec<&Gpu> = gpus.iter().filter_map(|p| self.by_pci(p)).collect();
        let mut out: Vec<DevNode> = Vec::new();
        for u in gpus {
            let Some(g) = self.by_pci(u) else { continue };
            // A MIG instance: its GPU's `/dev/nvidiaN` (none of the GPU's DRM nodes, which
            // every holder of an instance would share), then its two access capabilities.
            if let Some((_, m)) = self.mig(u) {
                out.extend(
                    g.nodes
                        .iter()
                        .filter(|(r, _)| *r == Role::Nvidia)
                        .map(|(_, n)| n.clone()),
                );
                out.push(m.gi_cap.clone());
                out.push(m.ci_cap.clone());
                continue;
            }
            out.extend(g.nodes_for(caps).cloned());
        }
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

/// Reads a small sysfs/proc attribute relative to an open directory (no path walk from the
/// root): open, one read (sysfs and procfs hand an attribute over in one read; a short read
/// of a regular file is its end), close.
fn read_at(dir: BorrowedFd, name: &str) -> Option<String> {
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

/// PCI base class + subclass 0x1200, "processing accelerator": AMD Instinct MI300X,
/// MI300A and MI325X enumerate so (the kernel's amdgpu driver matches that class for them).
const ACCELERATOR_CLASS: u32 = 0x1200;

/// Whether a PCI class may be a GPU of some vendor (before the vendor is known).
fn gpu_class(class: u32) -> bool {
    DISPLAY_CLASSES.contains(&class) || class >> 8 == ACCELERATOR_CLASS
}

/// Whether a PCI function is a GPU gpuhook hands out: a display-class function of NVIDIA,
/// AMD or Intel, or an AMD processing accelerator. Other vendors' accelerators (Intel's NPUs
/// are class 0x1200 too, FPGAs, inference cards) are not GPUs.
fn is_gpu(class: u32, vendor: u16) -> bool {
    match Vendor::from_pci_id(vendor) {
        Some(Vendor::Amd) => gpu_class(class),
        Some(_) => DISPLAY_CLASSES.contains(&class),
        None => false,
    }
}

/// What a scan must read beyond what choosing GPUs needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scan {
    /// Only what a request with these capabilities can get; `None`: everything (listings).
    pub caps: Option<Capabilities>,
    /// Leave NVIDIA driver details (model, UUID, device minor and node) for
    /// [`Inventory::settle`] on the GPUs actually chosen: the scan then costs a few reads
    /// per GPU, whatever the host holds. A lazy scan also leaves out the PCI functions that
    /// can be no usable GPU (unbound, or parked for passthrough) when the kernel's
    /// `/proc/bus/pci/devices` says so without a look at each ([`Inventory::deferred`]):
    /// they count only in GPU indices and in the reasons a refusal gives.
    pub lazy: bool,
}

impl Scan {
    /// Everything (for listings).
    pub const FULL: Scan = Scan {
        caps: None,
        lazy: false,
    };

    /// What a hook run for this request needs. Lazy unless the request looks at what only
    /// the driver tells (the model name, GPU UUIDs).
    pub fn for_request(req: &crate::request::Request) -> Scan {
        use crate::request::DeviceSel;
        let sels = || req.devices.iter().chain(req.migs.iter().map(|m| &m.gpu));
        let eager = req
            .filters
            .iter()
            .any(|f| f.field == crate::request::Field::Model)
            || sels().any(|d| matches!(d, DeviceSel::Uuid(_)));
        Scan {
            caps: Some(req.capabilities),
            // An index names a GPU by its place among all GPUs: every function is looked at.
            lazy: !eager && !sels().any(|d| matches!(d, DeviceSel::Index(_))),
        }
    }

    /// NVIDIA GPUs' DRM nodes come only with `graphics`.
    fn nvidia_drm(&self) -> bool {
        self.caps.is_none_or(|c| c.graphics)
    }

    fn control(&self, ctl: Control) -> bool {
        self.caps.is_none_or(|c| match ctl {
            Control::NvidiaCtl => true,
            Control::NvidiaUvm | Control::NvidiaUvmTools | Control::Kfd => c.compute,
            Control::NvidiaModeset => c.graphics,
        })
    }
}

/// The host's device root, opened once per scan: nodes are looked up relative to it.
struct DevRoot<'a> {
    path: &'a Path,
    fd: Option<OwnedFd>,
    /// The proc root (`/proc/devices` names the `nvidia-caps` major).
    proc: &'a Path,
}

impl DevRoot<'_> {
    /// The host node behind container path `/dev/<rel>`: must be a character device (not a
    /// symlink to one).
    fn node(&self, rel: &str) -> Result<DevNode, String> {
        let p = self.path.join(rel);
        let fd = self
            .fd
            .as_ref()
            .ok_or_else(|| format!("{}: cannot open the device root", self.path.display()))?;
        let st = fstatat(fd, rel, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| format!("{}: {}", p.display(), std::io::Error::from(e)))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFCHR {
            return Err(format!("{} is not a character device", p.display()));
        }
        Ok(DevNode {
            node: Node::new(
                format!("/dev/{rel}"),
                libc::major(st.st_rdev),
                libc::minor(st.st_rdev),
            ),
            mode: st.st_mode & 0o777,
        })
    }
}

impl DevRoot<'_> {
    /// `/dev/nvidia-caps/nvidia-cap<m>`: the host's node when it has one (`stat`), else the
    /// number from the `nvidia-caps` major of `/proc/devices` (nvidia-modprobe makes these
    /// nodes on demand: a host may lack them).
    fn cap_node(&self, minor: u32, mode: u32) -> Result<DevNode, String> {
        let rel = format!("nvidia-caps/nvidia-cap{minor}");
        if let Ok(n) = self.node(&rel) {
            return Ok(n);
        }
        let devices = self.proc.join("devices");
        let major = fs::read_to_string(&devices)
            .ok()
            .and_then(|t| {
                t.lines().find_map(|l| {
                    let (n, name) = l.trim().split_once(' ')?;
                    (name.trim() == "nvidia-caps").then(|| n.parse().ok())?
                })
            })
            .ok_or_else(|| {
                format!(
                    "no /dev/{rel} and no nvidia-caps major in {}",
                    devices.display()
                )
            })?;
        Ok(DevNode {
            node: Node::new(format!("/dev/{rel}"), major, minor),
            mode,
        })
    }
}

fn open_dir(p: &Path) -> Option<OwnedFd> {
    nix::fcntl::open(
        p,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()
}

/// PCI drivers that bind NVIDIA, AMD or Intel GPUs, or park them for passthrough (with any
/// driver whose name holds `vfio`: `vfio-pci`, `nvgrace_gpu_vfio_pci`, …).
const GPU_DRIVERS: [&str; 7] = [
    "nvidia", "nouveau", "amdgpu", "radeon", "i915", "xe", "pci-stub",
];

/// Whether a PCI function can be a GPU, from one `readlink` of its `driver` link (a third of
/// what reading its class costs): unbound, or bound to a GPU (or passthrough) driver. A server
/// lists hundreds of functions that are none (ports, NICs, drives), all bound to their drivers.
/// `Some(driver)`: it may be a GPU, bound to `driver` (`None`: unbound).
fn may_be_gpu(devices: BorrowedFd, name: &str) -> Option<Option<String>> {
    match readlinkat(devices, format!("{name}/driver").as_str()) {
        Ok(target) => {
            let t = target.as_bytes();
            let drv = t.rsplit(|b| *b == b'/').next().unwrap_or(t);
            (GPU_DRIVERS.iter().any(|g| g.as_bytes() == drv)
                || drv.windows(4).any(|w| w == b"vfio"))
            .then(|| Some(String::from_utf8_lossy(drv).into_owned()))
        }
        Err(_) => Some(None),
    }
}

/// Why a GPU's PCI config space says it is gone: the first dword reads as all ones (a
/// device that fell off the bus answers every read so) or cannot be read. A missing file
/// (not a real sysfs) says nothing.
fn config_space_problem(devices: BorrowedFd, pci: &str) -> Option<String> {
    let fd = match openat(
        devices,
        format!("{pci}/config").as_str(),
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return None,
        Err(e) => {
            return Some(format!(
                "its PCI config space cannot be read: {}",
                std::io::Error::from(e)
            ))
        }
    };
    let mut id = [0u8; 4];
    match nix::unistd::read(&fd, &mut id) {
        Ok(4) if id == [0xff; 4] => {
            Some("its PCI config space reads as all ones: fallen off the bus".into())
        }
        Ok(_) => None,
        Err(e) => Some(format!(
            "its PCI config space cannot be read: {}",
            std::io::Error::from(e)
        )),
    }
}

/// The PCIe link of a device, when sysfs shows one.
fn read_link(devices: BorrowedFd, name: &str) -> Option<Link> {
    let at = |a: &str| read_at(devices, &format!("{name}/{a}")).map(|s| s.trim().to_owned());
    Some(Link {
        speed: at("current_link_speed")?,
        max_speed: at("max_link_speed")?,
        width: at("current_link_width")?.parse().ok()?,
        max_width: at("max_link_width")?.parse().ok()?,
    })
}

/// GPU drivers that bind display or accelerator functions only: a function bound to one is
/// a GPU without a look at its class.
const DISPLAY_DRIVERS: [&str; 6] = ["nvidia", "nouveau", "amdgpu", "radeon", "i915", "xe"];

/// What the kernel's `/proc/bus/pci/devices` tells of one PCI function.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Listed {
    /// No GPU: another vendor's, or bound to a driver that is no GPU's.
    NoGpu,
    /// Bound to a GPU driver: (vendor, device, driver).
    Gpu(u16, u16, String),
    /// Unbound, or bound to a passthrough driver: a GPU only if its class says so.
    Maybe,
}

/// `/proc/bus/pci/devices` (one line per function: `BBDF`, `VVVVDDDD`, IRQ, 7 BAR starts,
/// 7 sizes, driver name or empty; tab-separated, `drivers/pci/proc.c`), by bus and devfn,
/// sorted. It has no PCI domain: a key that two domains share maps to `None` (look at each).
fn proc_pci_devices(proc: &Path) -> Option<Vec<(u16, Option<Listed>)>> {
    let f = fs::File::open(proc.join("bus/pci/devices")).ok()?;
    let mut text = Vec::with_capacity(96 * 1024);
    f.take(16 << 20).read_to_end(&mut text).ok()?;
    let hex = |b: &[u8]| -> Option<u32> {
        b.iter()
            .try_fold(0u32, |n, c| Some(n << 4 | (*c as char).to_digit(16)?))
    };
    let mut m: Vec<(u16, Option<Listed>)> = Vec::with_capacity(256);
    let mut rest = &text[..];
    // The kernel's fixed layout is read by position: "BBDF\tVVVVDDDD\tIRQ", then 14 fields
    // "\t%16llx" (17 bytes each), then "\tDRIVER\n". Anything else: not used at all.
    while !rest.is_empty() {
        let irq_end = 14 + rest.get(14..)?.iter().take(12).position(|&c| c == b'\t')?;
        let bars = rest.get(irq_end..irq_end + 14 * 17 + 1)?;
        if rest[4] != b'\t' || rest[13] != b'\t' || (0..=14).any(|k| bars[k * 17] != b'\t') {
            return None;
        }
        let key = hex(&rest[..4])? as u16;
        let id = hex(&rest[5..13])?;
        let tail = &rest[irq_end + 14 * 17 + 1..];
        let nl = tail.iter().take(64).position(|&c| c == b'\n')?;
        let driver = std::str::from_utf8(&tail[..nl]).ok()?.trim();
        rest = &tail[nl + 1..];
        let (vendor, device) = ((id >> 16) as u16, id as u16);
        let listed = match driver {
            _ if Vendor::from_pci_id(vendor).is_none() => Listed::NoGpu,
            "" => Listed::Maybe,
            d if DISPLAY_DRIVERS.contains(&d) => Listed::Gpu(vendor, device, d.to_owned()),
            d if GPU_DRIVERS.contains(&d) || d.contains("vfio") => Listed::Maybe,
            _ => Listed::NoGpu,
        };
        m.push((key, Some(listed)));
    }
    m.sort_by_key(|(k, _)| *k);
    // The same key twice: two PCI domains, not told apart here.
    let mut out: Vec<(u16, Option<Listed>)> = Vec::with_capacity(m.len());
    for (k, l) in m {
        match out.last_mut() {
            Some((last, seen)) if *last == k => *seen = None,
            _ => out.push((k, l)),
        }
    }
    Some(out)
}

/// The `/proc/bus/pci/devices` key of a normalized PCI address (`0000:3b:00.0`).
fn bus_devfn(pci: &str) -> Option<u16> {
    let b = u8::from_str_radix(pci.get(5..7)?, 16).ok()?;
    let d = u8::from_str_radix(pci.get(8..10)?, 16).ok()?;
    let f = u8::from_str_radix(pci.get(11..12)?, 16).ok()?;
    Some(u16::from(b) << 8 | u16::from(d) << 3 | u16::from(f))
}

/// Class, vendor and device of a PCI device: from its `uevent` in one read
/// (`PCI_CLASS=30200`, `PCI_ID=10DE:2330`), else from the `class`, `vendor`, `device` files.
fn pci_ids(devices: BorrowedFd, name: &str) -> Option<(u32, u16, u16)> {
    let at = |attr: &str| read_at(devices, &format!("{name}/{attr}"));
    if let Some(u) = at("uevent") {
        let (mut class, mut id) = (None, None);
        for line in u.lines() {
            if let Some(v) = line.strip_prefix("PCI_CLASS=") {
                class = u32::from_str_radix(v.trim(), 16).ok();
            } else if let Some(v) = line.strip_prefix("PCI_ID=") {
                id = v.trim().split_once(':').and_then(|(a, b)| {
                    Some((
                        u16::from_str_radix(a, 16).ok()?,
                        u16::from_str_radix(b, 16).ok()?,
                    ))
                });
            }
        }
        if let (Some(c), Some((v, d))) = (class, id) {
            return Some((c, v, d));
        }
    }
    let class = hex(at("class"))?;
    if !gpu_class(class) {
        return Some((class, 0, 0));
    }
    let vendor = hex(at("vendor"))? as u16;
    let device = hex(at("device")).unwrap_or(0) as u16;
    Some((class, vendor, device))
}

/// Reads the host's GPUs (everything).
pub fn scan(cfg: &Config) -> Result<Inventory, InventoryError> {
    scan_with(cfg, Scan::FULL)
}

/// Reads the host's GPUs. The PCI device list is read once; each device's directory is
/// opened once and its attributes read relative to it (no path walk per file); the device
/// root and the NVIDIA driver's directory are opened once.
pub fn scan_with(cfg: &Config, what: Scan) -> Result<Inventory, InventoryError> {
    let devices = cfg.sysfs.join("bus/pci/devices");
    let mut dir = nix::dir::Dir::open(
        &devices,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        InventoryError(format!(
            "cannot list {}: {}",
            devices.display(),
            std::io::Error::from(e)
        ))
    })?;
    // A lazy scan skips what the kernel's list already rules out, and looks no closer at
    // functions that can be no usable GPU: without even a copy of their names.
    let listed = if what.lazy {
        proc_pci_devices(&cfg.proc)
    } else {
        None
    };
    let mut deferred = 0;
    let mut names: Vec<(std::ffi::OsString, Option<Listed>)> = Vec::new();
    for e in dir.iter().flatten() {
        let raw = e.file_name().to_bytes();
        let known = listed.as_ref().and_then(|l| {
            let key = bus_devfn(std::str::from_utf8(raw).ok()?)?;
            l.binary_search_by_key(&key, |(k, _)| *k)
                .ok()
                .and_then(|i| l[i].1.clone())
        });
        match known {
            Some(Listed::NoGpu) => continue,
            Some(Listed::Maybe) => {
                deferred += 1;
                continue;
            }
            _ => names.push((std::ffi::OsStr::from_bytes(raw).to_owned(), known)),
        }
    }
    let dirfd = dir.as_fd();
    struct Found {
        pci: String,
        name: String,
        vendor: u16,
        device: u16,
        driver: Option<String>,
    }
    let mut found: Vec<Found> = Vec::new();
    for (name, known) in names {
        let Some(name) = name.to_str().map(str::to_owned) else {
            continue;
        };
        let Some(pci) = normalize_pci(&name) else {
            continue;
        };
        let (driver, ids) = match known {
            Some(Listed::Gpu(v, d, drv)) => (Some(drv), Some((DISPLAY_CLASSES[0], v, d))),
            _ => match may_be_gpu(dirfd, &name) {
                Some(driver) => (driver, None),
                None => continue,
            },
        };
        let Some((class, vendor, device)) = ids.or_else(|| pci_ids(dirfd, &name)) else {
            continue;
        };
        if !is_gpu(class, vendor) {
            continue;
        }
        found.push(Found {
            pci,
            name,
            vendor,
            device,
            driver,
        });
    }
    found.sort_by(|a, b| a.pci.cmp(&b.pci));
    let dev = DevRoot {
        path: &cfg.dev,
        fd: open_dir(&cfg.dev),
        proc: &cfg.proc,
    };
    let nv_gpus_path = cfg.proc.join("driver/nvidia/gpus");
    let nv_gpus = if found.iter().any(|f| f.vendor == 0x10de) {
        open_dir(&nv_gpus_path)
    } else {
        None
    };

    let mut pci_ids_db = PciIds::new(cfg.pci_ids.as_deref());
    let mut inv = Inventory {
        deferred,
        ..Inventory::default()
    };
    for (index, f) in found.into_iter().enumerate() {
        let vendor = Vendor::from_pci_id(f.vendor).expect("filtered above");
        let numa_node = read_at(dirfd, &format!("{}/numa_node", f.name))
            .and_then(|s| s.trim().parse::<i64>().ok())
            .and_then(|n| u32::try_from(n).ok());
        let parent = readlinkat(dirfd, f.name.as_str())
            .ok()
            .and_then(|t| {
                let comps: Vec<String> = PathBuf::from(t)
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                comps.len().checked_sub(2).map(|i| comps[i].clone())
            })
            .filter(|p| p != ".." && p != "devices");
        let mut gpu = Gpu {
            index,
            excluded: cfg.is_excluded(&f.pci),
            pci: f.pci,
            vendor,
            vendor_id: f.vendor,
            device_id: f.device,
            model: String::new(),
            arch: None,
            uuid: None,
            numa_node,
            parent,
            nodes: vec![],
            problem: None,
            pending: false,
            driver: f.driver,
            migs: vec![],
            link: if what.caps.is_none() {
                read_link(dirfd, &f.name)
            } else {
                None
            },
        };
        let sys_dir = devices.join(&f.name);
        match vendor {
            Vendor::Nvidia => {
                if what.lazy {
                    gpu.pending = true;
                } else {
                    nvidia_details(
                        &mut gpu,
                        dirfd,
                        nv_gpus.as_ref().map(|f| f.as_fd()),
                        &nv_gpus_path,
                        &dev,
                    );
                }
                if what.nvidia_drm() {
                    add_drm_nodes(&dev, &sys_dir, &mut gpu, false);
                }
            }
            Vendor::Amd | Vendor::Intel => {
                add_drm_nodes(&dev, &sys_dir, &mut gpu, true);
                if let Some(p) = config_space_problem(dirfd, &gpu.pci) {
                    gpu.problem = Some(p);
                }
            }
        }
        let ov = cfg.override_for(&gpu.pci, f.vendor, f.device);
        let builtin = arch::builtin(f.vendor, f.device);
        gpu.arch = ov.arch.clone().or_else(|| builtin.map(|b| b.0.to_owned()));
        if gpu.model.is_empty() || ov.model.is_some() {
            gpu.model = ov
                .model
                .clone()
                .or_else(|| builtin.map(|b| b.1.to_owned()))
                .unwrap_or_default();
        }
        if gpu.arch.is_none() || gpu.model.is_empty() {
            if let Some((a, m)) = pci_ids_db.lookup(f.vendor, f.device) {
                if gpu.arch.is_none() {
                    gpu.arch = a.map(str::to_owned);
                }
                if gpu.model.is_empty() {
                    gpu.model = m;
                }
            }
        }
        if gpu.model.is_empty() {
            gpu.model = format!("{:04x}:{:04x}", f.vendor, f.device);
        }
        inv.gpus.push(gpu);
    }
    for (ctl, name) in Control::ALL.into_iter().filter(|(c, _)| what.control(*c)) {
        if let Ok(n) = dev.node(name) {
            inv.controls.push((ctl, n));
        }
    }
    Ok(inv)
}

/// The NVIDIA driver's facts of one GPU (model, UUID, device minor → `/dev/nvidiaN`), or the
/// problem that makes it unusable.
fn nvidia_details(
    gpu: &mut Gpu,
    devices: BorrowedFd,
    nv_gpus: Option<BorrowedFd>,
    nv_gpus_path: &Path,
    dev: &DevRoot,
) {
    gpu.pending = false;
    if let Some(p) = config_space_problem(devices, &gpu.pci) {
        gpu.problem = Some(p);
        return;
    }
    let info_path = nv_gpus_path.join(&gpu.pci).join("information");
    let Some(text) = nv_gpus.and_then(|fd| read_at(fd, &format!("{}/information", gpu.pci))) else {
        gpu.problem = Some(match gpu.driver.as_deref() {
            Some("nvidia") => format!(
                "bound to the nvidia driver, which no longer lists it (no {}): fallen off the bus, or the driver failed it",
                info_path.display()
            ),
            Some(other) => format!("bound to {other}, not to the nvidia driver"),
            None => format!(
                "NVIDIA driver has no {} (driver not loaded?)",
                info_path.display()
            ),
        });
        return;
    };
    let info = parse_nvidia_information(&text);
    if let Some(m) = info.model {
        gpu.model = m;
    }
    gpu.uuid = info.uuid;
    if info.excluded {
        gpu.problem = Some("excluded by the NVIDIA driver (GPU Excluded: Yes)".into());
    }
    match info.minor {
        None => gpu.problem = Some(format!("no Device Minor in {}", info_path.display())),
        Some(m) => {
            match dev.node(&format!("nvidia{m}")) {
                Ok(n) => gpu.nodes.insert(0, (Role::Nvidia, n)),
                Err(e) => gpu.problem = Some(e),
            }
            match read_migs(nv_gpus_path, m, dev) {
                Ok(migs) => gpu.migs = migs,
                Err(e) => gpu.problem = Some(e),
            }
        }
    }
}

/// `DeviceFileMinor:` and `DeviceFileMode:` of a capability's procfs `access` file
/// (`nv-caps.c`: `DeviceFileMinor: 3\nDeviceFileMode: 292\nDeviceFileModify: 1\n`).
fn cap_access(text: &str) -> Option<(u32, u32)> {
    let mut minor = None;
    let mut mode = 0o444;
    for line in text.lines() {
        match line.split_once(':') {
            Some(("DeviceFileMinor", v)) => minor = v.trim().parse().ok(),
            Some(("DeviceFileMode", v)) => mode = v.trim().parse::<u32>().ok()? & 0o777,
            _ => {}
        }
    }
    Some((minor?, mode))
}

/// The MIG compute instances of the GPU whose device minor is `minor`, from the driver's
/// `/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/ci<C>/access` files, in (gi, ci)
/// order; none when the GPU has no MIG directory. The capability nodes are the host's
/// `/dev/nvidia-caps/nvidia-cap<m>` (`stat`ed), else made from the `nvidia-caps` major in
/// `/proc/devices` and the access file's mode.
fn read_migs(nv_gpus_path: &Path, minor: u32, dev: &DevRoot) -> Result<Vec<Mig>, String> {
    // <proc>/driver/nvidia/gpus → <proc>/driver/nvidia/capabilities/gpu<minor>/mig
    let base = nv_gpus_path
        .with_file_name("capabilities")
        .join(format!("gpu{minor}/mig"));
    let Ok(rd) = fs::read_dir(&base) else {
        return Ok(vec![]);
    };
    let num = |name: &str, prefix: &str| -> Option<u32> { name.strip_prefix(prefix)?.parse().ok() };
    let cap = |dir: &Path| -> Result<DevNode, String> {
        let p = dir.join("access");
        let text = fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        let (m, mode) =
            cap_access(&text).ok_or_else(|| format!("{}: no DeviceFileMinor", p.display()))?;
        dev.cap_node(m, mode)
    };
    let mut out = Vec::new();
    let mut gis: Vec<(u32, PathBuf)> = rd
        .flatten()
        .filter_map(|e| Some((num(e.file_name().to_str()?, "gi")?, e.path())))
        .collect();
    gis.sort();
    for (gi, gdir) in gis {
        let gi_cap = cap(&gdir)?;
        let mut cis: Vec<(u32, PathBuf)> = fs::read_dir(&gdir)
            .map_err(|e| format!("{}: {e}", gdir.display()))?
            .flatten()
            .filter_map(|e| Some((num(e.file_name().to_str()?, "ci")?, e.path())))
            .collect();
        cis.sort();
        for (ci, cdir) in cis {
            out.push(Mig {
                gi,
                ci,
                gi_cap: gi_cap.clone(),
                ci_cap: cap(&cdir)?,
            });
        }
    }
    Ok(out)
}

impl Inventory {
    /// Reads what a lazy scan left out for these GPUs (PCI addresses): after it, each of
    /// them is either usable with its nodes, or has its problem.
    pub fn settle(&mut self, cfg: &Config, pcis: &[String]) {
        let wanted = |g: &Gpu| g.pending && pcis.iter().any(|p| unit_pci(p) == g.pci);
        if !self.gpus.iter().any(wanted) {
            return;
        }
        let dev = DevRoot {
            path: &cfg.dev,
            fd: open_dir(&cfg.dev),
            proc: &cfg.proc,
        };
        let nv_gpus_path = cfg.proc.join("driver/nvidia/gpus");
        let nv_gpus = open_dir(&nv_gpus_path);
        let Some(devices) = open_dir(&cfg.sysfs.join("bus/pci/devices")) else {
            for g in self.gpus.iter_mut().filter(|g| g.pending) {
                g.pending = false;
                g.problem = Some("sysfs PCI devices cannot be opened".into());
            }
            return;
        };
        for g in self.gpus.iter_mut().filter(|g| wanted(g)) {
            let model = g.model.clone();
            nvidia_details(
                g,
                devices.as_fd(),
                nv_gpus.as_ref().map(|f| f.as_fd()),
                &nv_gpus_path,
                &dev,
            );
            // An operator's override still wins over the driver's model name.
            if cfg
                .override_for(&g.pci, g.vendor_id, g.device_id)
                .model
                .is_some()
            {
                g.model = model;
            }
        }
    }
}

/// DRM nodes of a GPU from sysfs `drm/`; `required`: a render node is the GPU's own node.
fn add_drm_nodes(dev: &DevRoot, dir: &Path, gpu: &mut Gpu, required: bool) {
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
        let digits = |p: &str| {
            name.len() > p.len()
                && name.starts_with(p)
                && name[p.len()..].bytes().all(|b| b.is_ascii_digit())
        };
        let role = if digits("renderD") {
            Role::Render
        } else if digits("card") {
            Role::Card
        } else {
            continue;
        };
        match dev.node(&format!("dri/{name}")) {
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
    fn gpu_classes() {
        // Display classes for the three vendors.
        for c in [0x030000, 0x030200, 0x038000] {
            assert!(is_gpu(c, 0x10de) && is_gpu(c, 0x1002) && is_gpu(c, 0x8086));
        }
        // Processing accelerators: AMD Instinct MI300 class only.
        assert!(is_gpu(0x120000, 0x1002));
        assert!(!is_gpu(0x120000, 0x8086), "Intel NPU");
        assert!(!is_gpu(0x120000, 0x10de));
        assert!(!is_gpu(0x120000, 0x1ded), "another vendor's accelerator");
        // Neither NVSwitch (bridge 0x0680) nor other classes.
        assert!(!is_gpu(0x068000, 0x10de));
        assert!(!is_gpu(0x010802, 0x1002));
        assert!(!is_gpu(0x030000, 0x1af4));
    }

    #[test]
    fn only_unbound_or_gpu_bound_functions_are_read() {
        let d = tempfile::tempdir().unwrap();
        for (dev, driver) in [
            ("0000:01:00.0", Some("nvidia")),
            ("0000:02:00.0", Some("vfio-pci")),
            ("0000:03:00.0", Some("nvgrace_gpu_vfio_pci")),
            ("0000:04:00.0", None),
            ("0000:05:00.0", Some("pcieport")),
            ("0000:06:00.0", Some("mlx5_core")),
            ("0000:07:00.0", Some("nvidia-fake")),
        ] {
            std::fs::create_dir(d.path().join(dev)).unwrap();
            if let Some(drv) = driver {
                std::os::unix::fs::symlink(
                    format!("../../../bus/pci/drivers/{drv}"),
                    d.path().join(dev).join("driver"),
                )
                .unwrap();
            }
        }
        let fd = open_dir(d.path()).unwrap();
        let may: Vec<Option<Option<String>>> = (1..=7)
            .map(|i| may_be_gpu(fd.as_fd(), &format!("0000:0{i}:00.0")))
            .collect();
        let some = |d: &str| Some(Some(d.to_owned()));
        assert_eq!(
            may,
            [
                some("nvidia"),
                some("vfio-pci"),
                some("nvgrace_gpu_vfio_pci"),
                Some(None),
                None,
                None,
                None
            ]
        );
    }

    #[test]
    fn kernel_pci_list() {
        assert_eq!(bus_devfn("0000:3b:00.1"), Some(0x3b01));
        assert_eq!(bus_devfn("0000:00:1f.7"), Some(0x00ff));
        assert_eq!(bus_devfn("0001:c8:02.0"), Some(0xc810));
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("bus/pci")).unwrap();
        let line = |bdf: &str, id: &str, drv: &str| {
            format!("{bdf}\t{id}\t0{}\t{drv}\n", "\t               0".repeat(14))
        };
        let text = [
            line("3b00", "10de2330", "nvidia"),        // a GPU, bound
            line("3b01", "10de22e8", "snd_hda_intel"), // its audio function
            line("3c00", "10de2330", ""),              // a GPU without its driver
            line("3d00", "10de2330", "vfio-pci"),      // parked for passthrough
            line("0008", "1af41045", "virtio-pci"),
            line("1f00", "80860b00", ""), // an Intel function, unbound: class unknown
            line("4100", "15b3101d", "mlx5_core"),
            line("c810", "10de2330", "nvidia"), // the same bus/devfn in two PCI domains
            line("c810", "80861572", "i40e"),
        ]
        .concat();
        std::fs::write(d.path().join("bus/pci/devices"), text).unwrap();
        let list = proc_pci_devices(d.path()).unwrap();
        let m: std::collections::HashMap<u16, Option<Listed>> = list.into_iter().collect();
        assert_eq!(
            m[&0x3b00],
            Some(Listed::Gpu(0x10de, 0x2330, "nvidia".into()))
        );
        assert_eq!(m[&0x3b01], Some(Listed::NoGpu));
        assert_eq!(m[&0x3c00], Some(Listed::Maybe));
        assert_eq!(m[&0x3d00], Some(Listed::Maybe));
        assert_eq!(m[&0x0008], Some(Listed::NoGpu));
        assert_eq!(m[&0x1f00], Some(Listed::Maybe));
        assert_eq!(m[&0x4100], Some(Listed::NoGpu));
        assert_eq!(
            m[&0xc810], None,
            "ambiguous without the domain: look at each"
        );
        // What this machine's kernel writes parses too.
        if Path::new("/proc/bus/pci/devices").exists() {
            let real = proc_pci_devices(Path::new("/proc")).expect("the kernel's own list");
            assert!(!real.is_empty());
        }
        std::fs::write(d.path().join("bus/pci/devices"), "zz\tyy\n").unwrap();
        assert!(
            proc_pci_devices(d.path()).is_none(),
            "not the kernel's format: unused"
        );
    }

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
