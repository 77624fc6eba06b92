//! Virtual machines on a fake host: QEMU domain XML as libvirt gives its QEMU hook, the
//! binary driven as that hook, and a VM that runs as libvirt's status directory shows one
//! (a pid file naming a live process, the live status XML).

use super::{run_with_stdin, uuid, Host};
use std::path::PathBuf;
use std::process::{Child, Command, Output};

/// A PCI hostdev of the function at `pci` (`0000:3b:00.0`), as libvirt formats it (the
/// guest-side `<address>` too).
pub fn pci_hostdev(pci: &str) -> String {
    let (d, rest) = pci.split_at(4);
    let (b, s, f) = (&rest[1..3], &rest[4..6], &rest[7..8]);
    format!("    <hostdev mode='subsystem' type='pci' managed='yes'>\n      <driver name='vfio'/>\n      <source>\n        <address domain='0x{d}' bus='0x{b}' slot='0x{s}' function='0x{f}'/>\n      </source>\n      <alias name='hostdev0'/>\n      <address type='pci' domain='0x0000' bus='0x06' slot='0x00' function='0x0'/>\n    </hostdev>\n")
}

/// An mdev hostdev of the mediated device `uuid`.
pub fn mdev_hostdev(uuid: &str) -> String {
    format!("    <hostdev mode='subsystem' type='mdev' managed='no' model='vfio-pci' display='off'>\n      <source>\n        <address uuid='{uuid}'/>\n      </source>\n      <alias name='hostdev1'/>\n    </hostdev>\n")
}

/// A QEMU domain as libvirt formats it for its hook (UUID [`vm_uuid`]`(n)`), with `devices`
/// in `<devices>` and `meta` in `<metadata>`.
pub fn vm_domain(name: &str, n: u32, devices: &str, meta: &str) -> String {
    format!(
        "<domain type='kvm' id='{n}'>\n  <name>{name}</name>\n  <uuid>{}</uuid>\n  <metadata>\n    {meta}\n  </metadata>\n  <memory unit='KiB'>1048576</memory>\n  <currentMemory unit='KiB'>1048576</currentMemory>\n  <vcpu placement='static'>2</vcpu>\n  <os>\n    <type arch='x86_64' machine='pc-q35-7.2'>hvm</type>\n    <boot dev='hd'/>\n  </os>\n  <features>\n    <acpi/>\n  </features>\n  <devices>\n    <emulator>/usr/bin/qemu-system-x86_64</emulator>\n    <disk type='file' device='disk'>\n      <driver name='qemu' type='qcow2'/>\n      <source file='/var/lib/libvirt/images/{name}.qcow2'/>\n      <target dev='vda' bus='virtio'/>\n      <address type='pci' domain='0x0000' bus='0x04' slot='0x00' function='0x0'/>\n    </disk>\n    <interface type='network'>\n      <mac address='52:54:00:6b:3c:58'/>\n      <source network='default'/>\n      <model type='virtio'/>\n    </interface>\n{devices}    <memballoon model='virtio'/>\n  </devices>\n</domain>\n",
        vm_uuid(n)
    )
}

/// A deterministic UUID for VM `n` (not any LXC test domain's, unless a test says so).
pub fn vm_uuid(n: u32) -> String {
    format!("{n:08x}-0000-4000-9000-{n:012x}")
}

/// libvirt's status XML of a running VM: `<domstatus>` around its live domain XML.
pub fn status_xml(domain_xml: &str, pid: u32) -> String {
    format!("<!--\nWARNING: THIS IS AN AUTO-GENERATED FILE. CHANGES TO IT ARE LIKELY TO BE\nOVERWRITTEN AND LOST. Changes to this xml configuration should be made using:\n  virsh edit\n-->\n<domstatus state='running' reason='booted' pid='{pid}'>\n  <taint flag='high-privileges'/>\n  <monitor path='/var/lib/libvirt/qemu/domain-1-x/monitor.sock' type='unix'/>\n  <vcpus>\n    <vcpu id='0' pid='{pid}'/>\n  </vcpus>\n  {domain_xml}</domstatus>\n")
}

/// A VM's QEMU process as libvirt's status directory shows it while it runs: a live
/// process (`sleep`), its pid file and its status XML; gone when dropped.
pub struct RunningVm {
    pub child: Child,
    pub pidfile: PathBuf,
    pub xml: PathBuf,
}

impl RunningVm {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The QEMU process ends (libvirt's files stay, as after a crash nobody saw).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The VM stops as libvirt stops it: its QEMU ends, its pid file and status XML go.
    pub fn stop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.pidfile);
        let _ = std::fs::remove_file(&self.xml);
    }
}

impl Drop for RunningVm {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Host {
    /// libvirt's QEMU status directory of this host (the config's `libvirt_qemu_dir`).
    pub fn qemu_dir(&self) -> PathBuf {
        self.root().join("qemu")
    }

    /// `gpuhook hook --qemu NAME OP SUBOP -` with `xml` on stdin.
    pub fn qemu(&self, name: &str, op: &str, xml: &str) -> Output {
        let subop = if matches!(op, "stopped" | "release") {
            "end"
        } else {
            "begin"
        };
        run_with_stdin(
            self.cmd().args(["hook", "--qemu", name, op, subop, "-"]),
            xml,
        )
    }

    /// Starts VM `name` as libvirt's status directory shows a running one: a process for its
    /// QEMU, `NAME.pid`, and `NAME.xml` around `domain_xml` (what it passes through now).
    pub fn run_vm(&self, name: &str, domain_xml: &str) -> RunningVm {
        let dir = self.qemu_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("sleep").arg("600").spawn().expect("sleep");
        let pidfile = dir.join(format!("{name}.pid"));
        let xml = dir.join(format!("{name}.xml"));
        std::fs::write(&pidfile, format!("{}\n", child.id())).unwrap();
        std::fs::write(&xml, status_xml(domain_xml, child.id())).unwrap();
        RunningVm {
            child,
            pidfile,
            xml,
        }
    }

    /// A whole VM start as libvirt runs it: `prepare`, `start`, then (its QEMU running)
    /// `started`. Returns the running VM, or the first failing call's output.
    pub fn start_vm(&self, name: &str, xml: &str) -> Result<RunningVm, Output> {
        for op in ["prepare", "start"] {
            let o = self.qemu(name, op, xml);
            if !o.status.success() {
                return Err(o);
            }
        }
        let vm = self.run_vm(name, xml);
        let o = self.qemu(name, "started", xml);
        if !o.status.success() {
            return Err(o);
        }
        Ok(vm)
    }
}

/// An LXC domain's UUID for test domain `n` (the holders' tests give a VM the same one).
pub fn lxc_uuid(n: u32) -> String {
    uuid(n)
}
