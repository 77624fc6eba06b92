//! One scan of the host: the PCI functions that are GPUs, each one's nodes and names, the
//! control nodes.

use super::devroot::DevRoot;
use super::gpu::{Control, Gpu, Inventory, InventoryError, Role};
use super::nvidia::nvidia_details;
use super::pci::{
    bus_devfn, config_space_problem, is_gpu, may_be_gpu, open_dir, pci_ids, proc_pci_devices,
    read_at, read_link, Listed, DISPLAY_CLASSES,
};
use crate::host::arch::{self, PciIds};
use crate::host::config::Config;
use crate::ids::{Pci, Unit, Vendor};
use crate::request::Capabilities;
use nix::fcntl::{readlinkat, OFlag};
use nix::sys::stat::Mode;
use std::fs;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

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
    .map_err(|e| InventoryError::CannotList {
        path: devices.clone(),
        source: e.into(),
    })?;
    // A lazy scan skips what the kernel's list already rules out, and looks no closer at
    // functions that can be no usable GPU: without even a copy of their names.
    let listed = if what.lazy {
        proc_pci_devices(&cfg.proc)
    } else {
        None
    };
    let (names, deferred) = list_functions(&mut dir, listed.as_deref());
    let dirfd = dir.as_fd();
    let found = find_gpus(dirfd, names);
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
    let nv = Nv {
        gpus: nv_gpus.as_ref().map(|f| f.as_fd()),
        path: &nv_gpus_path,
    };

    let mut pci_ids_db = PciIds::new(cfg.pci_ids.as_deref());
    let mut inv = Inventory {
        deferred,
        ..Inventory::default()
    };
    for (index, f) in found.into_iter().enumerate() {
        let (vendor_id, device_id) = (f.vendor, f.device);
        let sys_dir = devices.join(&f.name);
        let mut gpu = new_gpu(cfg, what, dirfd, index, f);
        add_vendor_facts(&mut gpu, what, dirfd, &nv, &dev, &sys_dir);
        name_gpu(&mut gpu, cfg, &mut pci_ids_db, vendor_id, device_id);
        inv.gpus.push(gpu);
    }
    for (ctl, name) in Control::ALL.into_iter().filter(|(c, _)| what.control(*c)) {
        if let Ok(n) = dev.node(name) {
            inv.controls.push((ctl, n));
        }
    }
    Ok(inv)
}

/// A PCI function that is a GPU, before its details are read.
struct GpuFunction {
    pci: Pci,
    name: String,
    vendor: u16,
    device: u16,
    driver: Option<String>,
}

/// The NVIDIA driver's `gpus` directory: open (when some GPU is NVIDIA's), and its path.
struct Nv<'a> {
    gpus: Option<BorrowedFd<'a>>,
    path: &'a Path,
}

/// The names in sysfs `bus/pci/devices` worth a closer look, with what the kernel's list
/// says of each; and how many functions that list let a lazy scan defer.
fn list_functions(
    dir: &mut nix::dir::Dir,
    listed: Option<&[(u16, Option<Listed>)]>,
) -> (Vec<(std::ffi::OsString, Option<Listed>)>, usize) {
    let mut deferred = 0;
    let mut names: Vec<(std::ffi::OsString, Option<Listed>)> = Vec::new();
    for e in dir.iter().flatten() {
        let raw = e.file_name().to_bytes();
        let known = listed.and_then(|l| {
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
    (names, deferred)
}

/// The functions among `names` that are GPUs, in PCI address order.
fn find_gpus(
    dirfd: BorrowedFd,
    names: Vec<(std::ffi::OsString, Option<Listed>)>,
) -> Vec<GpuFunction> {
    let mut found: Vec<GpuFunction> = Vec::new();
    for (name, known) in names {
        let Some(name) = name.to_str().map(str::to_owned) else {
            continue;
        };
        let Some(pci) = Pci::normalize(&name) else {
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
        found.push(GpuFunction {
            pci,
            name,
            vendor,
            device,
            driver,
        });
    }
    found.sort_by_key(|a| a.pci);
    found
}

/// The GPU of a function, with what sysfs tells of it (NUMA node, parent bridge, link).
fn new_gpu(cfg: &Config, what: Scan, dirfd: BorrowedFd, index: usize, f: GpuFunction) -> Gpu {
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
    Gpu {
        index,
        excluded: cfg.is_excluded(&f.pci),
        sharing: cfg.sharing_for(&f.pci, f.vendor, f.device),
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
        // For listings (a full scan) only: a free's or detach's lazy scan wants no link.
        link: if what.caps.is_none() && !what.lazy {
            read_link(dirfd, &f.name)
        } else {
            None
        },
    }
}

/// What each vendor's driver tells: NVIDIA's details (or pending, in a lazy scan) and DRM
/// nodes with `graphics`; AMD's and Intel's DRM nodes and config space.
fn add_vendor_facts(
    gpu: &mut Gpu,
    what: Scan,
    dirfd: BorrowedFd,
    nv: &Nv,
    dev: &DevRoot,
    sys_dir: &Path,
) {
    match gpu.vendor {
        Vendor::Nvidia => {
            if what.lazy {
                gpu.pending = true;
            } else {
                nvidia_details(gpu, dirfd, nv.gpus, nv.path, dev);
            }
            if what.nvidia_drm() {
                add_drm_nodes(dev, sys_dir, gpu, false);
            }
        }
        Vendor::Amd | Vendor::Intel => {
            add_drm_nodes(dev, sys_dir, gpu, true);
            if let Some(p) = config_space_problem(dirfd, &gpu.pci) {
                gpu.problem = Some(p);
            }
        }
    }
}

/// The GPU's architecture and model: the config's override, the built-in table, the PCI id
/// database, else the PCI id itself.
fn name_gpu(gpu: &mut Gpu, cfg: &Config, pci_ids_db: &mut PciIds, vendor: u16, device: u16) {
    let ov = cfg.override_for(&gpu.pci, vendor, device);
    let builtin = arch::builtin(vendor, device);
    gpu.arch = ov.arch.clone().or_else(|| builtin.map(|b| b.0.to_owned()));
    if gpu.model.is_empty() || ov.model.is_some() {
        gpu.model = ov
            .model
            .clone()
            .or_else(|| builtin.map(|b| b.1.to_owned()))
            .unwrap_or_default();
    }
    if gpu.arch.is_none() || gpu.model.is_empty() {
        if let Some((a, m)) = pci_ids_db.lookup(vendor, device) {
            if gpu.arch.is_none() {
                gpu.arch = a.map(str::to_owned);
            }
            if gpu.model.is_empty() {
                gpu.model = m;
            }
        }
    }
    if gpu.model.is_empty() {
        gpu.model = format!("{:04x}:{:04x}", vendor, device);
    }
}

impl Inventory {
    /// Reads what a lazy scan left out for the GPUs of these units (or PCI addresses): after
    /// it, each of them is either usable with its nodes, or has its problem.
    pub fn settle<U: Copy + Into<Unit>>(&mut self, cfg: &Config, units: &[U]) {
        let wanted = |g: &Gpu| g.pending && units.iter().any(|u| (*u).into().pci() == g.pci);
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
            Err(e) if required && role == Role::Render => gpu.problem = Some(e.to_string()),
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
