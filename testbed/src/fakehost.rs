//! Fake GPU hosts: sysfs, procfs and `/dev` trees laid out as on real machines, with real
//! character device nodes made by `mknod` (root only), described to gpuhook through the
//! config's roots.
//!
//! Field formats are copied from real hosts: sysfs `vendor`/`device`/`class` as `0x…`,
//! `numa_node` `-1` when unknown, `bus/pci/devices/*` symlinks into `devices/pci…/…`
//! bridge paths, the NVIDIA driver's `information` file (260-era and 535-era layouts),
//! DRM `card*`/`renderD*` directories with `dev` files, and non-GPU display devices
//! (BMC VGA, NVSwitch) that must be ignored.

use nix::sys::stat::{mknod, Mode, SFlag};
use serde_json::json;
use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// Dynamic majors as seen on real hosts (they differ between hosts: always `stat`).
pub const UVM_MAJOR: u32 = 509;
pub const KFD_MAJOR: u32 = 510;
pub const NVIDIA_MAJOR: u32 = 195;
pub const DRM_MAJOR: u32 = 226;
/// An H100 80GB as seven 1g.10gb: GPU instances 7–13, one compute instance each.
pub const SEVEN_1G: &[(u32, &[u32])] = &[
    (7, &[0]),
    (8, &[0]),
    (9, &[0]),
    (10, &[0]),
    (11, &[0]),
    (12, &[0]),
    (13, &[0]),
];

/// A GPU's MIG layout: its GPU instances, each with its compute instances.
pub type MigLayout = Vec<(u32, Vec<u32>)>;

/// `nvidia-caps` as `/proc/devices` lists it on a MIG host.
pub const CAPS_MAJOR: u32 = 236;

/// The driver's capability minors (`/proc/driver/nvidia-caps/mig-minors`): `config` 1,
/// `monitor` 2, then per GPU (device minor) 15 GPU instances of 1 access + 8 compute
/// instances each.
pub fn mig_minor(gpu: u32, gi: u32, ci: Option<u32>) -> u32 {
    3 + gpu * 135 + gi * 9 + ci.map_or(0, |c| 1 + c)
}

#[derive(Debug, Clone)]
pub enum Driver {
    /// NVIDIA with its proc `information` (device minor, model, UUID).
    Nvidia {
        minor: u32,
        model: String,
        uuid: String,
        old_format: bool,
    },
    /// amdgpu / i915 / xe: DRM nodes only.
    Drm { card: u32, render: u32 },
    /// No driver bound (e.g. NVIDIA card without the module, or a BMC VGA).
    None,
    /// Bound to a driver that is not a GPU's (`pcieport`, `nvme`, `mlx5_core`, …).
    Other(&'static str),
}

#[derive(Debug, Clone)]
pub struct FakeDevice {
    pub pci: String,
    pub vendor: u16,
    pub device: u16,
    pub class: u32,
    pub subsystem: (u16, u16),
    pub numa: i32,
    /// Path from the root complex, e.g. `["pci0000:00", "0000:00:03.0"]`.
    pub upstream: Vec<String>,
    pub driver: Driver,
}

#[derive(Debug, Clone)]
pub struct FakeHost {
    pub name: String,
    pub devices: Vec<FakeDevice>,
    /// `/dev/nvidiactl`, `nvidia-modeset`, `nvidia-uvm(-tools)` present.
    pub nvidia_controls: bool,
    /// `/dev/kfd` present.
    pub kfd: bool,
    /// GPUs in MIG mode: PCI address → its GPU instances, each with its compute instances.
    pub mig: Vec<(String, MigLayout)>,
    /// Mediated devices (vGPUs, as `mdevctl` or the vendor's manager makes them): (parent
    /// PCI address, UUID), listed under `bus/mdev/devices`.
    pub mdevs: Vec<(String, String)>,
}

/// Where a created fake host's roots are.
#[derive(Debug, Clone)]
pub struct HostPaths {
    pub root: PathBuf,
    pub sysfs: PathBuf,
    pub proc: PathBuf,
    pub dev: PathBuf,
}

impl HostPaths {
    /// A gpuhook config for this host.
    pub fn config(&self, state_file: &Path) -> serde_json::Value {
        json!({
            "sysfs": self.sysfs, "proc": self.proc, "dev": self.dev,
            "state_file": state_file,
        })
    }
}

fn nv(
    pci: &str,
    device: u16,
    numa: i32,
    upstream: &[&str],
    minor: u32,
    model: &str,
    old: bool,
) -> FakeDevice {
    FakeDevice {
        pci: pci.into(),
        vendor: 0x10de,
        device,
        class: 0x030200,
        subsystem: (0x10de, 0x0000),
        numa,
        upstream: upstream.iter().map(|s| s.to_string()).collect(),
        driver: Driver::Nvidia {
            minor,
            model: model.into(),
            uuid: format!(
                "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
                0x5eed_0000u32 + minor * 7919 + u32::from(device),
                device,
                minor,
                numa.unsigned_abs(),
                0x1f2e3d4c5b6au64 + u64::from(minor)
            ),
            old_format: old,
        },
    }
}

fn other(
    pci: &str,
    vendor: u16,
    device: u16,
    class: u32,
    numa: i32,
    upstream: &[&str],
    driver: Driver,
) -> FakeDevice {
    FakeDevice {
        pci: pci.into(),
        vendor,
        device,
        class,
        subsystem: (vendor, 0x0000),
        numa,
        upstream: upstream.iter().map(|s| s.to_string()).collect(),
        driver,
    }
}

impl FakeHost {
    /// The blueprint's cg1 host: two Tesla M2050 (Fermi), 260-era driver, plus the board's
    /// Matrox BMC VGA and its chipset.
    pub fn blueprint() -> FakeHost {
        FakeHost {
            name: "blueprint".into(),
            devices: vec![
                other(
                    "0000:00:00.0",
                    0x8086,
                    0x3406,
                    0x060000,
                    -1,
                    &["pci0000:00"],
                    Driver::None,
                ),
                nv(
                    "0000:07:00.0",
                    0x06de,
                    -1,
                    &["pci0000:00", "0000:00:03.0"],
                    0,
                    "Tesla M2050",
                    true,
                ),
                nv(
                    "0000:08:00.0",
                    0x06de,
                    -1,
                    &["pci0000:00", "0000:00:07.0"],
                    1,
                    "Tesla M2050",
                    true,
                ),
                other(
                    "0000:01:03.0",
                    0x102b,
                    0x0532,
                    0x030000,
                    -1,
                    &["pci0000:00", "0000:00:1e.0"],
                    Driver::None,
                ),
            ],
            nvidia_controls: true,
            kfd: false,
            mig: vec![],
            mdevs: vec![],
        }
    }

    /// An 8-GPU, two-socket host (DGX-like): H100 SXM5 behind four PCIe switches, NVSwitches
    /// (class 0x0680, not GPUs), an ASPEED BMC VGA. Device minors differ from PCI order.
    pub fn dgx8() -> FakeHost {
        let mut d = vec![other(
            "0000:03:00.0",
            0x1a03,
            0x2000,
            0x030000,
            0,
            &["pci0000:00", "0000:00:1c.5", "0000:02:00.0"],
            Driver::None,
        )];
        let switches = [
            ("0000:15:01.0", "0000:18:00.0", "0000:1a:00.0"),
            ("0000:3f:01.0", "0000:40:00.0", "0000:42:00.0"),
            ("0000:97:01.0", "0000:9a:00.0", "0000:9c:00.0"),
            ("0000:c7:01.0", "0000:c8:00.0", "0000:ca:00.0"),
        ];
        let roots = ["pci0000:15", "pci0000:3f", "pci0000:97", "pci0000:c7"];
        let minors = [2, 3, 0, 1, 6, 7, 4, 5];
        for (s, (sw, a, b)) in switches.iter().enumerate() {
            let numa = (s / 2) as i32;
            for (k, pci) in [a, b].iter().enumerate() {
                let i = s * 2 + k;
                d.push(nv(
                    pci,
                    0x2330,
                    numa,
                    &[roots[s], sw],
                    minors[i],
                    "NVIDIA H100 80GB HBM3",
                    false,
                ));
            }
        }
        for (i, pci) in [
            "0000:07:00.0",
            "0000:08:00.0",
            "0000:85:00.0",
            "0000:86:00.0",
        ]
        .iter()
        .enumerate()
        {
            d.push(other(
                pci,
                0x10de,
                0x22a3,
                0x068000,
                (i / 2) as i32,
                &["pci0000:00"],
                Driver::None,
            ));
        }
        FakeHost {
            name: "dgx8".into(),
            devices: d,
            nvidia_controls: true,
            kfd: false,
            mig: vec![],
            mdevs: vec![],
        }
    }

    /// NVIDIA + AMD + Intel on one host, with an NVIDIA card whose driver is not loaded.
    pub fn mixed() -> FakeHost {
        FakeHost {
            name: "mixed".into(),
            devices: vec![
                nv(
                    "0000:17:00.0",
                    0x20f1,
                    0,
                    &["pci0000:16", "0000:16:02.0"],
                    0,
                    "NVIDIA A100-PCIE-40GB",
                    false,
                ),
                other(
                    "0000:31:00.0",
                    0x1002,
                    0x740f,
                    0x038000,
                    0,
                    &["pci0000:30", "0000:30:01.0"],
                    Driver::Drm {
                        card: 1,
                        render: 129,
                    },
                ),
                other(
                    "0000:4b:00.0",
                    0x8086,
                    0x0bda,
                    0x038000,
                    1,
                    &["pci0000:4a", "0000:4a:01.0"],
                    Driver::Drm {
                        card: 2,
                        render: 130,
                    },
                ),
                other(
                    "0000:00:02.0",
                    0x8086,
                    0x56c0,
                    0x030000,
                    0,
                    &["pci0000:00"],
                    Driver::Drm {
                        card: 0,
                        render: 128,
                    },
                ),
                other(
                    "0000:65:00.0",
                    0x10de,
                    0x1eb8,
                    0x030200,
                    1,
                    &["pci0000:64", "0000:64:00.0"],
                    Driver::None,
                ),
            ],
            nvidia_controls: true,
            kfd: true,
            mig: vec![],
            mdevs: vec![],
        }
    }

    /// An AMD Instinct host: an MI210 (display class 0x0380), two MI300X (class 0x1200,
    /// "processing accelerator", as the kernel lists them), an Intel NPU (class 0x1200 too,
    /// not a GPU) left unbound so only its class and vendor tell, and an NVIDIA L40S after
    /// them in PCI order (its index shifts if an MI300X is missed).
    pub fn mi300() -> FakeHost {
        let amd = |pci: &str, device: u16, class: u32, numa: i32, root: &str, card: u32| {
            other(
                pci,
                0x1002,
                device,
                class,
                numa,
                &[root, &format!("{}:01.0", &root[3..])],
                Driver::Drm {
                    card,
                    render: 128 + card,
                },
            )
        };
        FakeHost {
            name: "mi300".into(),
            devices: vec![
                other(
                    "0000:00:0b.0",
                    0x8086,
                    0x7d1d,
                    0x120000,
                    0,
                    &["pci0000:00"],
                    Driver::None,
                ),
                amd("0000:05:00.0", 0x740f, 0x038000, 0, "pci0000:04", 1),
                amd("0000:0c:00.0", 0x74a1, 0x120000, 0, "pci0000:0b", 2),
                amd("0000:8c:00.0", 0x74a1, 0x120000, 1, "pci0000:8b", 3),
                nv(
                    "0000:c1:00.0",
                    0x26b9,
                    1,
                    &["pci0000:c0", "0000:c0:01.0"],
                    0,
                    "NVIDIA L40S",
                    false,
                ),
            ],
            nvidia_controls: true,
            kfd: true,
            mig: vec![],
            mdevs: vec![],
        }
    }

    /// `n` A100 SXM4 over two NUMA nodes, two per switch (for benchmarks and stress).
    pub fn wide(n: usize) -> FakeHost {
        let mut d = Vec::new();
        for i in 0..n {
            let numa = (i * 2 / n.max(1)) as i32;
            // Buses stay below 0x100 up to 78 GPUs: two per switch, each pair on its own root.
            assert!(n <= 78, "wide hosts have at most 78 GPUs");
            let bus = 0x10 + i * 3;
            let root = format!("pci0000:{:02x}", 0x10 + (i / 2) * 6);
            let sw = format!("0000:{:02x}:01.0", 0x10 + (i / 2) * 6);
            d.push(nv(
                &format!("0000:{bus:02x}:00.0"),
                0x20b0,
                numa,
                &[&root, &sw],
                i as u32,
                "NVIDIA A100-SXM4-40GB",
                false,
            ));
        }
        FakeHost {
            name: format!("wide{n}"),
            devices: d,
            nvidia_controls: true,
            kfd: false,
            mig: vec![],
            mdevs: vec![],
        }
    }

    /// Puts a GPU in MIG mode with these GPU instances and their compute instances (as
    /// `nvidia-smi mig -cgi … -C` leaves them).
    pub fn with_mig(mut self, pci: &str, layout: &[(u32, &[u32])]) -> FakeHost {
        self.mig.push((
            pci.into(),
            layout.iter().map(|(g, cs)| (*g, cs.to_vec())).collect(),
        ));
        self
    }

    /// The 8×H100 host with mixed MIG layouts, from `nvidia-smi mig` profiles of an
    /// H100 80GB: 0000:18:00.0 as seven 1g.10gb (GPU instances 7–13), 0000:1a:00.0 as two
    /// 3g.40gb (1, 2), 0000:40:00.0 as a 4g.40gb split in two compute instances, a
    /// 2g.20gb and a 1g.10gb; the other five whole.
    pub fn dgx8_mig() -> FakeHost {
        FakeHost::dgx8()
            .with_mig("0000:18:00.0", SEVEN_1G)
            .with_mig("0000:1a:00.0", &[(1, &[0]), (2, &[0])])
            .with_mig("0000:40:00.0", &[(1, &[0, 1]), (5, &[0]), (13, &[0])])
    }

    /// Every NVIDIA GPU of the host as seven 1g instances (the benchmark's 8×7 layout).
    pub fn all_mig7(mut self) -> FakeHost {
        let pcis: Vec<String> = self
            .devices
            .iter()
            .filter(|d| matches!(d.driver, Driver::Nvidia { .. }))
            .map(|d| d.pci.clone())
            .collect();
        for p in pcis {
            self = self.with_mig(&p, SEVEN_1G);
        }
        self.name.push_str("-mig7");
        self
    }

    /// Adds `n` PCI functions that are not GPUs, as a real server lists beside its GPUs
    /// (root ports and switch ports, NICs, NVMe drives, Intel chipset functions): every hook
    /// run looks at each one (its driver link; the class of the unbound ones) to find the GPUs.
    pub fn with_other_functions(mut self, n: usize) -> FakeHost {
        const KINDS: [(u16, u16, u32, Option<&str>); 4] = [
            (0x1022, 0x1483, 0x060400, Some("pcieport")), // AMD root port (bridge)
            (0x15b3, 0x101d, 0x020000, Some("mlx5_core")), // Mellanox ConnectX-6 Dx
            (0x144d, 0xa80a, 0x010802, Some("nvme")),     // Samsung NVMe
            (0x8086, 0x0b00, 0x088000, None),             // Intel chipset function, no driver bound
        ];
        for i in 0..n {
            let (vendor, device, class, driver) = KINDS[i % KINDS.len()];
            let bus = 0x80 + i / 8;
            assert!(bus <= 0xff, "at most 1024 other functions");
            let pci = format!("0000:{bus:02x}:00.{}", i % 8);
            let numa = (i % 2) as i32;
            self.devices.push(other(
                &pci,
                vendor,
                device,
                class,
                numa,
                &["pci0000:80"],
                driver.map_or(Driver::None, Driver::Other),
            ));
        }
        self.name = format!("{}+{n}", self.name);
        self
    }

    /// Gives every NVIDIA GPU its HD audio function (`.1`: class 0x0403, NVIDIA's, bound to
    /// `snd_hda_intel`), as real boards have: the function a VM passes through with its GPU.
    pub fn with_audio(mut self) -> FakeHost {
        let audio: Vec<FakeDevice> = self
            .devices
            .iter()
            .filter(|d| d.vendor == 0x10de && d.class >> 8 == 0x0302)
            .map(|d| FakeDevice {
                pci: format!("{}.1", &d.pci[..10]),
                device: 0x22e8,
                class: 0x040300,
                driver: Driver::Other("snd_hda_intel"),
                ..d.clone()
            })
            .collect();
        self.devices.extend(audio);
        self.name.push_str("+audio");
        self
    }

    /// Binds the function at `pci` to `driver` instead of its own (`vfio-pci`: parked for
    /// passthrough, as an operator does with `driverctl` or libvirt with `managed='yes'`; the
    /// NVIDIA driver then neither lists it nor has its node).
    pub fn bound_to(mut self, pci: &str, driver: &'static str) -> FakeHost {
        let d = self
            .devices
            .iter_mut()
            .find(|d| d.pci == pci)
            .unwrap_or_else(|| panic!("no function {pci} on {}", self.name));
        d.driver = Driver::Other(driver);
        self
    }

    /// A mediated device (a vGPU) of the function at `parent`, by its UUID.
    pub fn with_mdev(mut self, parent: &str, uuid: &str) -> FakeHost {
        self.mdevs.push((parent.into(), uuid.into()));
        self
    }

    /// Builds the host under `root` (which must not exist or be empty). Needs root for mknod.
    pub fn create(&self, root: &Path) -> io::Result<HostPaths> {
        let p = HostPaths {
            root: root.into(),
            sysfs: root.join("sys"),
            proc: root.join("proc"),
            dev: root.join("dev"),
        };
        fs::create_dir_all(p.sysfs.join("bus/pci/devices"))?;
        fs::create_dir_all(p.sysfs.join("bus/pci/drivers"))?;
        fs::create_dir_all(p.proc.join("driver"))?;
        fs::create_dir_all(p.proc.join("sys/kernel/random"))?;
        fs::write(
            p.proc.join("sys/kernel/random/boot_id"),
            "0f4a9a4e-5a4c-4b61-9d3b-2b1c0f5e8a71\n",
        )?;
        fs::create_dir_all(p.dev.join("dri/by-path"))?;
        let mut any_nvidia = false;
        for d in &self.devices {
            let rel: PathBuf = d.upstream.iter().chain(std::iter::once(&d.pci)).collect();
            let dir = p.sysfs.join("devices").join(&rel);
            fs::create_dir_all(&dir)?;
            let w = |f: &str, v: String| fs::write(dir.join(f), v);
            w("vendor", format!("0x{:04x}\n", d.vendor))?;
            w("device", format!("0x{:04x}\n", d.device))?;
            w("class", format!("0x{:06x}\n", d.class))?;
            w("subsystem_vendor", format!("0x{:04x}\n", d.subsystem.0))?;
            w("subsystem_device", format!("0x{:04x}\n", d.subsystem.1))?;
            w("numa_node", format!("{}\n", d.numa))?;
            w("revision", "0xa1\n".into())?;
            w("enable", "1\n".into())?;
            // The standard header of the config space (what root reads of `config`):
            // ids, command, status, revision, class, subsystem; the rest zero.
            let mut cfg = [0u8; 256];
            cfg[0..2].copy_from_slice(&d.vendor.to_le_bytes());
            cfg[2..4].copy_from_slice(&d.device.to_le_bytes());
            cfg[4..6].copy_from_slice(&0x0406u16.to_le_bytes());
            cfg[6..8].copy_from_slice(&0x0010u16.to_le_bytes());
            cfg[8] = 0xa1;
            cfg[9..12].copy_from_slice(&d.class.to_le_bytes()[..3]);
            cfg[0x2c..0x2e].copy_from_slice(&d.subsystem.0.to_le_bytes());
            cfg[0x2e..0x30].copy_from_slice(&d.subsystem.1.to_le_bytes());
            fs::write(dir.join("config"), cfg)?;
            // The function's reset (the kernel offers it for a function it can reset:
            // FLR, a bus reset), write-only as in sysfs.
            fs::write(dir.join("reset"), "")?;
            fs::set_permissions(
                dir.join("reset"),
                std::os::unix::fs::PermissionsExt::from_mode(0o200),
            )?;
            // A PCIe Gen4 x16 link at full speed.
            w("current_link_speed", "16.0 GT/s PCIe\n".into())?;
            w("max_link_speed", "16.0 GT/s PCIe\n".into())?;
            w("current_link_width", "16\n".into())?;
            w("max_link_width", "16\n".into())?;
            let driver = match &d.driver {
                Driver::Nvidia { .. } => "DRIVER=nvidia\n",
                Driver::Drm { .. } if d.vendor == 0x1002 => "DRIVER=amdgpu\n",
                Driver::Drm { .. } => "DRIVER=xe\n",
                Driver::Other(name) => &format!("DRIVER={name}\n"),
                Driver::None => "",
            };
            w(
                "uevent",
                format!(
                    "{driver}PCI_CLASS={:X}\nPCI_ID={:04X}:{:04X}\nPCI_SUBSYS_ID={:04X}:{:04X}\nPCI_SLOT_NAME={}\nMODALIAS=pci:v{:08X}d{:08X}sv{:08X}sd{:08X}bc{:02X}sc{:02X}i{:02X}\n",
                    d.class, d.vendor, d.device, d.subsystem.0, d.subsystem.1, d.pci,
                    d.vendor, d.device, d.subsystem.0, d.subsystem.1, d.class >> 16, (d.class >> 8) & 0xff, d.class & 0xff
                ),
            )?;
            symlink(
                format!("../../../devices/{}", rel.display()),
                p.sysfs.join("bus/pci/devices").join(&d.pci),
            )?;
            match &d.driver {
                Driver::Nvidia {
                    minor,
                    model,
                    uuid,
                    old_format,
                } => {
                    any_nvidia = true;
                    bind_driver(&p, &dir, "nvidia")?;
                    let info = p.proc.join("driver/nvidia/gpus").join(&d.pci);
                    fs::create_dir_all(&info)?;
                    let text = if *old_format {
                        format!("Model: \t\t {model}\nIRQ:   \t\t 16\nGPU UUID: \t {uuid}\nVideo BIOS: \t 70.00.2f.00.03\nBus Type: \t PCIe\nDMA Size: \t 40 bits\nDMA Mask: \t 0xffffffffff\nBus Location: \t {}\nDevice Minor: \t {minor}\n", d.pci)
                    } else {
                        format!("Model: \t\t {model}\nIRQ:   \t\t 182\nGPU UUID: \t {uuid}\nVideo BIOS: \t 96.00.74.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n", d.pci)
                    };
                    fs::write(info.join("information"), text)?;
                    node(
                        &p.dev.join(format!("nvidia{minor}")),
                        NVIDIA_MAJOR,
                        *minor,
                        0o666,
                        0,
                    )?;
                }
                Driver::Drm { card, render } => {
                    bind_driver(&p, &dir, if d.vendor == 0x1002 { "amdgpu" } else { "xe" })?;
                    for (name, minor, mode, gid) in [
                        (format!("card{card}"), *card, 0o660, 44),
                        (format!("renderD{render}"), *render, 0o666, 109),
                    ] {
                        let dd = dir.join("drm").join(&name);
                        fs::create_dir_all(&dd)?;
                        fs::write(dd.join("dev"), format!("{DRM_MAJOR}:{minor}\n"))?;
                        node(&p.dev.join("dri").join(&name), DRM_MAJOR, minor, mode, gid)?;
                        let kind = if name.starts_with("card") {
                            "card"
                        } else {
                            "render"
                        };
                        symlink(
                            format!("../{name}"),
                            p.dev
                                .join("dri/by-path")
                                .join(format!("pci-{}-{kind}", d.pci)),
                        )?;
                    }
                }
                Driver::Other(name) => bind_driver(&p, &dir, name)?,
                Driver::None => {}
            }
        }
        // Mediated devices: a directory under their parent, linked from `bus/mdev/devices`.
        for (parent, uuid) in &self.mdevs {
            let d = self
                .devices
                .iter()
                .find(|d| d.pci == *parent)
                .ok_or_else(|| io::Error::other(format!("no parent {parent} for mdev {uuid}")))?;
            let rel: PathBuf = d.upstream.iter().chain(std::iter::once(&d.pci)).collect();
            let dir = p.sysfs.join("devices").join(&rel).join(uuid);
            fs::create_dir_all(&dir)?;
            fs::write(
                dir.join("uevent"),
                "MDEV_TYPE=nvidia-1045\nDRIVER=vfio_mdev\n",
            )?;
            fs::create_dir_all(p.sysfs.join("bus/mdev/devices"))?;
            symlink(
                format!("../../../devices/{}/{uuid}", rel.display()),
                p.sysfs.join("bus/mdev/devices").join(uuid),
            )?;
        }
        // The kernel's list of PCI functions, in its own format (drivers/pci/proc.c): bus and
        // devfn, vendor and device, IRQ, 7 BAR starts, 7 sizes, the bound driver's name.
        let mut list = String::new();
        for d in &self.devices {
            let n = |i: usize| u8::from_str_radix(&d.pci[i..i + 2], 16).unwrap_or(0);
            let (bus, dev, func) = (n(5), n(8), d.pci[11..12].parse::<u8>().unwrap_or(0));
            let driver = match &d.driver {
                Driver::Nvidia { .. } => "nvidia",
                Driver::Drm { .. } if d.vendor == 0x1002 => "amdgpu",
                Driver::Drm { .. } => "xe",
                Driver::Other(name) => name,
                Driver::None => "",
            };
            list.push_str(&format!(
                "{bus:02x}{:02x}\t{:04x}{:04x}\t{:x}",
                dev << 3 | func,
                d.vendor,
                d.device,
                if driver.is_empty() {
                    0
                } else {
                    64 + u32::from(bus) % 100
                }
            ));
            for i in 0..14 {
                let v: u64 = match i {
                    0 if !driver.is_empty() => 0xfb00_0000 + (u64::from(bus) << 20),
                    7 if !driver.is_empty() => 0x100_0000,
                    _ => 0,
                };
                list.push_str(&format!("\t{v:16x}"));
            }
            list.push_str(&format!("\t{driver}\n"));
        }
        fs::create_dir_all(p.proc.join("bus/pci"))?;
        fs::write(p.proc.join("bus/pci/devices"), list)?;
        if any_nvidia {
            fs::write(p.proc.join("driver/nvidia/version"), "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")?;
        }
        if self.nvidia_controls {
            node(&p.dev.join("nvidiactl"), NVIDIA_MAJOR, 255, 0o666, 0)?;
            node(&p.dev.join("nvidia-modeset"), NVIDIA_MAJOR, 254, 0o666, 0)?;
            node(&p.dev.join("nvidia-uvm"), UVM_MAJOR, 0, 0o666, 0)?;
            node(&p.dev.join("nvidia-uvm-tools"), UVM_MAJOR, 1, 0o666, 0)?;
        }
        if self.kfd {
            node(&p.dev.join("kfd"), KFD_MAJOR, 0, 0o660, 109)?;
        }
        if any_nvidia {
            // The driver's capabilities (nv-caps.c): the management ones, the minors table,
            // and per MIG GPU its instances' access files; the nodes nvidia-modprobe makes.
            let caps = p.proc.join("driver/nvidia/capabilities");
            let access = |dir: &Path, m: u32, mode: u32| -> io::Result<()> {
                fs::create_dir_all(dir)?;
                fs::write(
                    dir.join("access"),
                    format!("DeviceFileMinor: {m}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"),
                )
            };
            fs::create_dir_all(caps.join("mig"))?;
            fs::write(
                caps.join("mig/config"),
                "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n",
            )?;
            fs::write(
                caps.join("mig/monitor"),
                "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n",
            )?;
            let mut minors = String::from("config 1\nmonitor 2\n");
            for g in 0..8 {
                for gi in 0..15 {
                    minors.push_str(&format!(
                        "gpu{g}/gi{gi}/access {}\n",
                        mig_minor(g, gi, None)
                    ));
                    for ci in 0..8 {
                        minors.push_str(&format!(
                            "gpu{g}/gi{gi}/ci{ci}/access {}\n",
                            mig_minor(g, gi, Some(ci))
                        ));
                    }
                }
            }
            fs::create_dir_all(p.proc.join("driver/nvidia-caps"))?;
            fs::write(p.proc.join("driver/nvidia-caps/mig-minors"), minors)?;
            fs::write(
                p.proc.join("devices"),
                format!("Character devices:\n  1 mem\n  4 /dev/vc/0\n  5 /dev/tty\n 10 misc\n{NVIDIA_MAJOR} nvidia-frontend\n{DRM_MAJOR} drm\n{CAPS_MAJOR} nvidia-caps\n{UVM_MAJOR} nvidia-uvm\n\nBlock devices:\n  8 sd\n259 blkext\n"),
            )?;
            fs::create_dir_all(p.dev.join("nvidia-caps"))?;
            node(
                &p.dev.join("nvidia-caps/nvidia-cap1"),
                CAPS_MAJOR,
                1,
                0o400,
                0,
            )?;
            node(
                &p.dev.join("nvidia-caps/nvidia-cap2"),
                CAPS_MAJOR,
                2,
                0o444,
                0,
            )?;
            for (pci, layout) in &self.mig {
                let Some(minor) = self
                    .devices
                    .iter()
                    .find(|d| d.pci == *pci)
                    .and_then(|d| match d.driver {
                        Driver::Nvidia { minor, .. } => Some(minor),
                        _ => None,
                    })
                else {
                    continue;
                };
                for (gi, cis) in layout {
                    let gdir = caps.join(format!("gpu{minor}/mig/gi{gi}"));
                    let gm = mig_minor(minor, *gi, None);
                    access(&gdir, gm, 292)?;
                    node(
                        &p.dev.join(format!("nvidia-caps/nvidia-cap{gm}")),
                        CAPS_MAJOR,
                        gm,
                        0o444,
                        0,
                    )?;
                    for ci in cis {
                        let cm = mig_minor(minor, *gi, Some(*ci));
                        access(&gdir.join(format!("ci{ci}")), cm, 292)?;
                        node(
                            &p.dev.join(format!("nvidia-caps/nvidia-cap{cm}")),
                            CAPS_MAJOR,
                            cm,
                            0o444,
                            0,
                        )?;
                    }
                }
            }
        }
        Ok(p)
    }
}

fn bind_driver(p: &HostPaths, dir: &Path, driver: &str) -> io::Result<()> {
    let drv = p.sysfs.join("bus/pci/drivers").join(driver);
    fs::create_dir_all(&drv)?;
    let depth = dir
        .strip_prefix(&p.sysfs)
        .map(|r| r.components().count())
        .unwrap_or(0);
    symlink(
        format!("{}bus/pci/drivers/{driver}", "../".repeat(depth)),
        dir.join("driver"),
    )?;
    // And the driver's link back to the device, as sysfs has both.
    let (Ok(rel), Some(name)) = (dir.strip_prefix(&p.sysfs), dir.file_name()) else {
        return Ok(());
    };
    symlink(format!("../../../../{}", rel.display()), drv.join(name))
}

/// `mknod` a character device with exact mode and group. (The mode is set after, with
/// `chmod`: the umask is the whole process's, and clearing it here for a moment would give
/// directories another test thread makes meanwhile mode 0777.)
pub fn node(path: &Path, major: u32, minor: u32, mode: u32, gid: u32) -> io::Result<()> {
    mknod(
        path,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(mode),
        nix::sys::stat::makedev(major.into(), minor.into()),
    )
    .map_err(io::Error::from)?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o7777))?;
    }
    nix::unistd::chown(
        path,
        Some(nix::unistd::Uid::from_raw(0)),
        Some(nix::unistd::Gid::from_raw(gid)),
    )
    .map_err(io::Error::from)
}

/// Adds `n` running reservations of other domains to the state file at `state`: on PCI
/// addresses (domain 0001) no fake host has, held by a container init that is this live
/// process, so they are never stale and never compete for GPUs; they only make the state
/// large (for stress tests and benchmarks).
pub fn fill_state(state: &Path, n: u32) -> Result<(), String> {
    use gpuhook::host::procfs::ProcRef;
    use gpuhook::reserve::state::{now_rfc3339, HolderId, Phase, Reservation, Store};
    let me = ProcRef::of(std::process::id() as i32).ok_or("no /proc entry for this process")?;
    Store::new(state)
        .update(|st| {
            for i in 0..n {
                let holder = HolderId::Libvirt {
                    name: format!("bulk{i}"),
                    uuid: format!("{:08x}-1111-4000-8000-{i:012x}", 0xb0b0_0000u32 + i),
                };
                st.reservations.insert(
                    holder.key(),
                    Reservation {
                        holder,
                        gpus: vec![format!("0001:{:02x}:{:02x}.0", i / 32, i % 32)
                            .parse()
                            .expect("a PCI address (n < 8192)")],
                        phase: Phase::Running,
                        request: "1 GPU".into(),
                        created: now_rfc3339(),
                        updated: now_rfc3339(),
                        prepared_by: None,
                        controller: Some(1),
                        init: Some(me),
                        cgroup: None,
                        namespaces: None,
                        nodes: vec![],
                        mounts: vec![],
                        rootfs: Default::default(),
                        hotplugged: false,
                        node_mounts: Vec::new(),
                        driver: None,
                        driver_version: None,
                    },
                );
            }
            Ok::<_, gpuhook::Error>(())
        })
        .map_err(|e| e.to_string())
}
