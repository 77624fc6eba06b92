//! GPU health on fake hosts: kernel log records as the NVIDIA driver writes them (what
//! `/dev/kmsg` hands out, continuation lines included), the stand-in for the reset program
//! (`scripts/gpu-reset-standin`), the stand-in for `nvidia-smi`'s memory error counters
//! (`scripts/nvidia-smi-standin`), what a GPU's sysfs and driver files look like when it
//! fell off the bus or after a reset that failed, and a reboot (a new boot id).

use crate::HostPaths;
use std::path::{Path, PathBuf};

/// One NVIDIA Xid record as `/dev/kmsg` hands it out (driver 535 and later): priority 4
/// (warning, facility kernel), sequence number `seq`, the GPU's bus as the driver names it
/// (`PCI:0000:3b:00`), then the device's continuation lines.
pub fn xid_record(seq: u64, pci: &str, xid: u32, text: &str) -> String {
    let bus = pci.strip_suffix(".0").unwrap_or(pci);
    format!(
        "4,{seq},{},-;NVRM: Xid (PCI:{bus}): {xid}, {text}\n SUBSYSTEM=pci\n DEVICE=+pci:{bus}.0\n",
        4_213_561_000 + seq * 1000
    )
}

/// The text each class of Xid comes with on real hosts (driver 535/550), by Xid.
pub fn xid_text(xid: u32) -> &'static str {
    match xid {
        13 => "pid=2811, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
        31 => "pid=2811, name=python3, channel 0x00000002, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f1c_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
        43 => "pid=2811, name=python3, Ch 00000008",
        48 => "pid=2811, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
        62 => "223b6a66 00002100 00000000 20662342 20662ba6 20664272 2065f7ca 2063f48c",
        63 => "pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
        64 => "pid=1896, Row Remapper: Failed to remap a row, RMA the GPU.",
        74 => "pid=0, NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
        79 => "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        92 => "pid=0, High single-bit ECC error rate",
        94 => "pid=3001, name=python3, Contained: SM (0x1). RST: No, D-RST: No",
        95 => "pid=3001, name=python3, Uncontained: FBHUB. RST: Yes, D-RST: No",
        119 => "pid=0, Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).",
        120 => "pid=0, GSP task exception: store access page fault (cause:0xf) @ pc:0x1b3e200",
        _ => "pid=0, an event of this Xid",
    }
}

/// Xid 154 stating `action` as the driver words it (`GPU Reset Required`, `Node Reboot
/// Required`, `Drain and Reset`, `None`).
pub fn xid_154(action: &str) -> String {
    let code = match action {
        "GPU Reset Required" => 1,
        "Node Reboot Required" => 2,
        "Drain and Reset" => 4,
        _ => 0,
    };
    format!("GPU recovery action changed from 0x0 (None) to 0x{code:x} ({action})")
}

/// The stand-in for `nvidia-smi --gpu-reset` (see the script's own words).
pub fn reset_standin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gpu-reset-standin")
}

/// The `reset_command` that runs the stand-in on the fake host at `root` (the directory
/// [`HostPaths::root`] names).
pub fn standin_command(root: &Path) -> serde_json::Value {
    serde_json::json!([
        reset_standin(),
        "--root",
        root,
        "--gpu-reset",
        "-i",
        "{pci}"
    ])
}

/// What the stand-in does at its next calls: `ok`, `fail`, `allones`, `exclude`, `unlist`,
/// `hang`, `slow`.
pub fn standin_mode(p: &HostPaths, mode: &str) {
    std::fs::write(p.root.join("reset-standin.mode"), mode).expect("reset-standin.mode");
}

/// Each call the stand-in logged: its arguments, environment, descriptors, standard input.
pub fn standin_calls(p: &HostPaths) -> Vec<serde_json::Value> {
    std::fs::read_to_string(p.root.join("reset-standin.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("stand-in log line"))
        .collect()
}

/// A GPU that fell off the bus, or whose reset failed: every read of its config space
/// answers all ones. What its config space held before (for [`config_back`]).
pub fn config_all_ones(p: &HostPaths, pci: &str) -> Vec<u8> {
    let path = p.sysfs.join("bus/pci/devices").join(pci).join("config");
    let before = std::fs::read(&path).expect("config");
    std::fs::write(&path, [0xffu8; 256]).expect("config");
    before
}

/// The GPU answers again: its config space holds `bytes` (what [`config_all_ones`] gave).
pub fn config_back(p: &HostPaths, pci: &str, bytes: &[u8]) {
    std::fs::write(
        p.sysfs.join("bus/pci/devices").join(pci).join("config"),
        bytes,
    )
    .expect("config");
}

/// The stand-in for `nvidia-smi`'s counters (see the script's own words).
pub fn smi_standin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/nvidia-smi-standin")
}

/// Puts the fake host's `nvidia-smi` at `<root>/bin/nvidia-smi` (a copy of the stand-in,
/// root's, mode 0755; it finds the fake host from its own path), and gives its path: the
/// config's `nvidia_smi`.
pub fn install_smi(p: &HostPaths) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bin = p.root.join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = bin.join("nvidia-smi");
    std::fs::copy(smi_standin(), &path).expect("nvidia-smi");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// What the stand-in answers for GPU `pci`: each field given (`"2"`, `"Yes"`, `"[N/A]"`),
/// the others their defaults (no error).
pub fn smi_answers(p: &HostPaths, pci: &str, fields: &[(&str, &str)]) {
    let path = p.root.join("nvidia-smi-standin.json");
    let mut all: serde_json::Value = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| serde_json::json!({}));
    all[pci] = fields
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect::<serde_json::Map<_, _>>()
        .into();
    std::fs::write(&path, all.to_string()).expect("nvidia-smi-standin.json");
}

/// What the stand-in does at its next calls: `ok`, `fail`, `hang`.
pub fn smi_mode(p: &HostPaths, mode: &str) {
    std::fs::write(p.root.join("nvidia-smi-standin.mode"), mode).expect("nvidia-smi-standin.mode");
}

/// Each call the stand-in logged: its arguments and environment.
pub fn smi_calls(p: &HostPaths) -> Vec<serde_json::Value> {
    std::fs::read_to_string(p.root.join("nvidia-smi-standin.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("stand-in log line"))
        .collect()
}

/// Runs the capture script (`scripts/netfilter-xid-records`, as root): the records
/// netfilter's LOG target writes for rules whose prefixes imitate Xids, as /dev/kmsg hands
/// them out, the UDP ports from `port`; or why it could not.
pub fn netfilter_records(port: u16) -> Result<String, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/netfilter-xid-records");
    let o = std::process::Command::new(&script)
        .arg(port.to_string())
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if !o.status.success() {
        return Err(format!(
            "{}: {}: {}",
            script.display(),
            o.status,
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    String::from_utf8(o.stdout).map_err(|e| e.to_string())
}

/// The host rebooted: a new boot id, and a kernel log that starts anew with `records`.
pub fn reboot(p: &HostPaths, boot_id: &str, records: &str) {
    std::fs::write(
        p.proc.join("sys/kernel/random/boot_id"),
        format!("{boot_id}\n"),
    )
    .expect("boot_id");
    std::fs::write(p.dev.join("kmsg"), records).expect("kmsg");
}
