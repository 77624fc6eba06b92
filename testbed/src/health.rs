//! GPU health on fake hosts: kernel log records as the NVIDIA driver writes them (what
//! `/dev/kmsg` hands out, continuation lines included), the stand-in for the reset program
//! (`scripts/gpu-reset-standin`), what a GPU's sysfs and driver files look like after a
//! reset that failed, and a reboot (a new boot id).

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
/// answers all ones.
pub fn config_all_ones(p: &HostPaths, pci: &str) {
    std::fs::write(
        p.sysfs.join("bus/pci/devices").join(pci).join("config"),
        [0xffu8; 256],
    )
    .expect("config");
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
