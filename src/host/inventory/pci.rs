//! The PCI functions that may be GPUs: sysfs `bus/pci/devices`, and the kernel's list in
//! `/proc/bus/pci/devices` that a lazy scan reads instead of each function's directory.

use super::gpu::PcieLink;
use crate::ids::Vendor;
use nix::fcntl::{openat, readlinkat, OFlag};
use nix::sys::stat::Mode;
use std::fs;
use std::io::Read;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Reads a small sysfs/proc attribute relative to an open directory (no path walk from the
/// root): open, one read (sysfs and procfs hand an attribute over in one read; a short read
/// of a regular file is its end), close.
pub(super) fn read_at(dir: BorrowedFd, name: &str) -> Option<String> {
    read_fd(fs::File::from(
        openat(dir, name, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).ok()?,
    ))
}

pub(super) fn read_fd(mut f: fs::File) -> Option<String> {
    let mut buf = [0u8; 4096];
    let n = f.read(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

pub(super) fn hex(s: Option<String>) -> Option<u32> {
    let s = s?;
    let s = s.trim();
    u32::from_str_radix(s.strip_prefix("0x").unwrap_or(s), 16).ok()
}

pub(super) const DISPLAY_CLASSES: [u32; 3] = [0x030000, 0x030200, 0x038000];

/// PCI base class + subclass 0x1200, "processing accelerator": AMD Instinct MI300X,
/// MI300A and MI325X enumerate so (the kernel's amdgpu driver matches that class for them).
pub(super) const ACCELERATOR_CLASS: u32 = 0x1200;

/// Whether a PCI class may be a GPU of some vendor (before the vendor is known).
pub(super) fn gpu_class(class: u32) -> bool {
    DISPLAY_CLASSES.contains(&class) || class >> 8 == ACCELERATOR_CLASS
}

/// Whether a PCI function is a GPU gpuhook hands out: a display-class function of NVIDIA,
/// AMD or Intel, or an AMD processing accelerator. Other vendors' accelerators (Intel's NPUs
/// are class 0x1200 too, FPGAs, inference cards) are not GPUs.
pub(super) fn is_gpu(class: u32, vendor: u16) -> bool {
    match Vendor::from_pci_id(vendor) {
        Some(Vendor::Amd) => gpu_class(class),
        Some(_) => DISPLAY_CLASSES.contains(&class),
        None => false,
    }
}

pub(super) fn open_dir(p: &Path) -> Option<OwnedFd> {
    nix::fcntl::open(
        p,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()
}

/// PCI drivers that bind NVIDIA, AMD or Intel GPUs, or park them for passthrough (with any
/// driver whose name holds `vfio`: `vfio-pci`, `nvgrace_gpu_vfio_pci`, …).
pub(super) const GPU_DRIVERS: [&str; 7] = [
    "nvidia", "nouveau", "amdgpu", "radeon", "i915", "xe", "pci-stub",
];

/// Whether a PCI function can be a GPU, from one `readlink` of its `driver` link (a third of
/// what reading its class costs): unbound, or bound to a GPU (or passthrough) driver. A server
/// lists hundreds of functions that are none (ports, NICs, drives), all bound to their drivers.
/// `Some(driver)`: it may be a GPU, bound to `driver` (`None`: unbound).
pub(super) fn may_be_gpu(devices: BorrowedFd, name: &str) -> Option<Option<String>> {
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
pub(super) fn config_space_problem(devices: BorrowedFd, pci: &str) -> Option<String> {
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
pub(super) fn read_link(devices: BorrowedFd, name: &str) -> Option<PcieLink> {
    let at = |a: &str| read_at(devices, &format!("{name}/{a}")).map(|s| s.trim().to_owned());
    Some(PcieLink {
        speed: at("current_link_speed")?,
        max_speed: at("max_link_speed")?,
        width: at("current_link_width")?.parse().ok()?,
        max_width: at("max_link_width")?.parse().ok()?,
    })
}

/// GPU drivers that bind display or accelerator functions only: a function bound to one is
/// a GPU without a look at its class.
pub(super) const DISPLAY_DRIVERS: [&str; 6] =
    ["nvidia", "nouveau", "amdgpu", "radeon", "i915", "xe"];

/// What the kernel's `/proc/bus/pci/devices` tells of one PCI function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Listed {
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
pub(super) fn proc_pci_devices(proc: &Path) -> Option<Vec<(u16, Option<Listed>)>> {
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
pub(super) fn bus_devfn(pci: &str) -> Option<u16> {
    let b = u8::from_str_radix(pci.get(5..7)?, 16).ok()?;
    let d = u8::from_str_radix(pci.get(8..10)?, 16).ok()?;
    let f = u8::from_str_radix(pci.get(11..12)?, 16).ok()?;
    Some(u16::from(b) << 8 | u16::from(d) << 3 | u16::from(f))
}

/// Class, vendor and device of a PCI device: from its `uevent` in one read
/// (`PCI_CLASS=30200`, `PCI_ID=10DE:2330`), else from the `class`, `vendor`, `device` files.
pub(super) fn pci_ids(devices: BorrowedFd, name: &str) -> Option<(u32, u16, u16)> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

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
}
