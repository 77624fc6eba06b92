//! Virtual machines for libvirt's QEMU driver in tests: a minimal TCG domain (no disk, no OS:
//! SeaBIOS finds nothing to boot and idles, which is all a start, a hook and a passthrough
//! need), with PCI or mediated-device `<hostdev>`s, and the emulator it runs.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A `<hostdev mode='subsystem'>` of a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hostdev {
    /// A PCI function by address (`0000:07:00.0`); `managed='yes'` has libvirt bind it to
    /// `vfio-pci` at start and give it back at stop.
    Pci { addr: String, managed: bool },
    /// A mediated device by UUID (a vGPU).
    Mdev { uuid: String },
}

impl Hostdev {
    pub fn pci(addr: &str) -> Hostdev {
        Hostdev::Pci {
            addr: addr.into(),
            managed: true,
        }
    }

    /// The element, as a domain's `<devices>` and `virsh attach-device` take it.
    pub fn xml(&self) -> String {
        match self {
            Hostdev::Pci { addr, managed } => {
                let (domain, rest) = addr.split_once(':').unwrap_or(("0000", addr));
                let (bus, rest) = rest.split_once(':').unwrap_or(("00", rest));
                let (slot, function) = rest.split_once('.').unwrap_or((rest, "0"));
                format!(
                    "<hostdev mode='subsystem' type='pci' managed='{}'><source><address domain='0x{domain}' bus='0x{bus}' slot='0x{slot}' function='0x{function}'/></source></hostdev>",
                    if *managed { "yes" } else { "no" }
                )
            }
            Hostdev::Mdev { uuid } => format!(
                "<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='{uuid}'/></source></hostdev>"
            ),
        }
    }
}

/// A QEMU domain under software emulation (`type='qemu'`).
#[derive(Debug, Clone)]
pub struct VmSpec {
    pub name: String,
    pub uuid: Option<String>,
    /// `pc` (i440FX) or `q35` (PCIe: what a passthrough VM uses).
    pub machine: String,
    pub memory_mib: u32,
    /// The emulator binary (`<emulator>`).
    pub emulator: PathBuf,
    pub hostdevs: Vec<Hostdev>,
    /// Raw children of `<metadata>`.
    pub metadata: String,
}

impl VmSpec {
    pub fn new(name: &str, emulator: &Path) -> VmSpec {
        VmSpec {
            name: name.into(),
            uuid: None,
            machine: "q35".into(),
            memory_mib: 32,
            emulator: emulator.to_path_buf(),
            hostdevs: Vec::new(),
            metadata: String::new(),
        }
    }

    pub fn with(mut self, dev: Hostdev) -> VmSpec {
        self.hostdevs.push(dev);
        self
    }

    pub fn xml(&self) -> String {
        let uuid = self
            .uuid
            .as_ref()
            .map(|u| format!("  <uuid>{u}</uuid>\n"))
            .unwrap_or_default();
        let metadata = if self.metadata.is_empty() {
            String::new()
        } else {
            format!("  <metadata>{}</metadata>\n", self.metadata)
        };
        let devs: String = self
            .hostdevs
            .iter()
            .map(|d| format!("    {}\n", d.xml()))
            .collect();
        format!(
            "<domain type='qemu'>\n  <name>{}</name>\n{uuid}  <memory unit='MiB'>{}</memory>\n  <vcpu>1</vcpu>\n{metadata}  <os><type arch='x86_64' machine='{}'>hvm</type></os>\n  <devices>\n    <emulator>{}</emulator>\n{devs}    <memballoon model='none'/>\n  </devices>\n</domain>\n",
            self.name,
            self.memory_mib,
            self.machine,
            self.emulator.display()
        )
    }
}

/// A probe for libvirt's `hooks/qemu.d` (libvirt runs it after `hooks/qemu`, at every call,
/// with the same arguments and domain XML), keeping its records in `dir`: one line per call
/// in `calls`, its arguments as libvirt gave them (`NAME OP SUBOP EXTRA`), the XML of the last call per domain and op in
/// `xml-NAME-OP`; with `snap-OP` present, `gpuhook list --json` (the binary `gpuhook`, the
/// config `config`) into `list-NAME-OP.json`; with `hold-NAME-OP` present, `held-NAME-OP`
/// made and the call held while `hold-NAME-OP` exists. It prints nothing (libvirt reads a
/// hook's output at `restore` and `migrate` as domain XML).
pub fn probe_script(dir: &Path, config: &Path, gpuhook: &Path) -> String {
    format!(
        r#"#!/bin/sh
# A test bed probe (testbed/src/vm.rs): records libvirt's QEMU hook calls.
P='{}'
cat >"$P/xml-$1-$2"
echo "$*" >>"$P/calls"
if [ -e "$P/snap-$2" ]; then GPUHOOK_CONFIG='{}' '{}' list --json >"$P/list-$1-$2.json" 2>&1; fi
if [ -e "$P/hold-$1-$2" ]; then
    : >"$P/held-$1-$2"
    while [ -e "$P/hold-$1-$2" ]; do sleep 0.05; done
fi
exit 0
"#,
        dir.display(),
        config.display(),
        gpuhook.display()
    )
}

/// This distribution's `qemu-system-x86_64`, unpacked into the test cache by
/// `scripts/qemu-unpacked.sh` (made once, reused while its stamp holds): the wrapper that runs
/// it with its libraries and firmware. An error with the script's words when it cannot.
pub fn unpacked_qemu() -> Result<PathBuf, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/qemu-unpacked.sh");
    let o = Command::new(&script)
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    let out = String::from_utf8_lossy(&o.stdout);
    if !o.status.success() {
        return Err(format!(
            "{} failed ({}): {}",
            script.display(),
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    let dir = PathBuf::from(out.lines().last().unwrap_or("").trim());
    let bin = dir.join("bin/qemu-system-x86_64");
    if !bin.is_file() {
        return Err(format!(
            "{} printed {out:?}: no {}",
            script.display(),
            bin.display()
        ));
    }
    Ok(bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostdev_addresses_as_libvirt_reads_them() {
        assert_eq!(
            Hostdev::pci("0000:07:00.1").xml(),
            "<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x0000' bus='0x07' slot='0x00' function='0x1'/></source></hostdev>"
        );
        let x = VmSpec::new("v", Path::new("/q"))
            .with(Hostdev::Mdev {
                uuid: "4b20d080-1b54-4048-85b3-a6a62d165c01".into(),
            })
            .xml();
        assert!(x.contains("<emulator>/q</emulator>"), "{x}");
        assert!(
            x.contains("type='mdev' model='vfio-pci'><source><address uuid='4b20d080-1b54-4048-85b3-a6a62d165c01'/>"),
            "{x}"
        );
        assert!(!x.contains("<metadata>"), "{x}");
    }
}
