//! The NVIDIA driver's facts of a GPU: `/proc/driver/nvidia/gpus/<bus>/information` and the
//! MIG capabilities under `/proc/driver/nvidia/capabilities`.

use super::devroot::{DevRoot, NodeUnavailable};
use super::gpu::{DevNode, Gpu, Mig, Role};
use super::pci::{config_space_problem, read_at};
use std::fs;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

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

/// The NVIDIA driver's facts of one GPU (model, UUID, device minor → `/dev/nvidiaN`), or the
/// problem that makes it unusable.
pub(super) fn nvidia_details(
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
    let info_path = nv_gpus_path.join(gpu.pci.as_str()).join("information");
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
                Err(e) => gpu.problem = Some(e.to_string()),
            }
            match read_migs(nv_gpus_path, m, dev) {
                Ok(migs) => gpu.migs = migs,
                Err(e) => gpu.problem = Some(e.to_string()),
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
fn read_migs(nv_gpus_path: &Path, minor: u32, dev: &DevRoot) -> Result<Vec<Mig>, NodeUnavailable> {
    // <proc>/driver/nvidia/gpus → <proc>/driver/nvidia/capabilities/gpu<minor>/mig
    let base = nv_gpus_path
        .with_file_name("capabilities")
        .join(format!("gpu{minor}/mig"));
    let Ok(rd) = fs::read_dir(&base) else {
        return Ok(vec![]);
    };
    let num = |name: &str, prefix: &str| -> Option<u32> { name.strip_prefix(prefix)?.parse().ok() };
    let cap = |dir: &Path| -> Result<DevNode, NodeUnavailable> {
        let p = dir.join("access");
        let text = fs::read_to_string(&p).map_err(|source| NodeUnavailable::Read {
            path: p.clone(),
            source,
        })?;
        let (m, mode) = cap_access(&text).ok_or(NodeUnavailable::NoMinor { path: p })?;
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
            .map_err(|source| NodeUnavailable::Read {
                path: gdir.clone(),
                source,
            })?
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
