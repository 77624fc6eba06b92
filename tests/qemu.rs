//! gpuhook as libvirt's QEMU hook, under a real libvirtd with its QEMU driver and real QEMUs
//! (software emulation, no disk: SeaBIOS idles), beside LXC domains of the same daemon and
//! podman containers, all drawing GPUs from one pool on a fake host.
//!
//! One daemon (isolated from the host's, see `testbed::libvirtd`) serves every case; its
//! `hooks/qemu` and `hooks/lxc` are the gpuhook just built, and a probe in `hooks/qemu.d`
//! (run by libvirt after gpuhook, at every call) records each call, snapshots the pool
//! (`gpuhook list --json`) at the calls a case asks for, and can hold a call until the case
//! lets it go. The emulator is this distribution's QEMU, unpacked into the test cache by
//! `scripts/qemu-unpacked.sh`. This host has no IOMMU: libvirt refuses a PCI passthrough
//! start after `prepare` ("host doesn't support passthrough"), which is how a start that
//! fails after `prepare` is proven here; running VMs that hold GPUs are proven in the
//! Debian 13 bed (`tests/debian13`). A daemon or an emulator that cannot start fails the
//! suite. Arguments filter cases by substring.

mod common;
#[path = "qemu/contend.rs"]
mod contend;
#[path = "qemu/lifecycle.rs"]
mod lifecycle;

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use testbed::{Daemon, DomainSpec, FakeHost, Hook, Hostdev, VmSpec};

pub struct Bed {
    pub d: Daemon,
    pub work: PathBuf,
    hosts: usize,
    /// The emulator every VM names.
    pub qemu: PathBuf,
}

impl Bed {
    pub fn config(&self) -> PathBuf {
        self.d.config_path()
    }

    pub fn state(&self) -> PathBuf {
        self.work.join("state/state.json")
    }

    pub fn probe(&self) -> PathBuf {
        self.work.join("probe")
    }

    /// Describes a new fake host to the daemon's hooks and to the CLI (libvirt's QEMU status
    /// directory: the daemon's); clears the state and the probe's records.
    pub fn use_host(&mut self, fake: FakeHost) -> testbed::HostPaths {
        self.use_host_with(fake, |_| {})
    }

    pub fn use_host_with(
        &mut self,
        fake: FakeHost,
        edit: impl FnOnce(&mut Value),
    ) -> testbed::HostPaths {
        self.hosts += 1;
        let p = fake
            .create(&self.work.join(format!("host{}", self.hosts)))
            .expect("fake host");
        let mut cfg = p.config(&self.state());
        cfg["libvirt_qemu_dir"] = json!(self.d.qemu_state_dir());
        edit(&mut cfg);
        self.d.write_config(&cfg).expect("config");
        let _ = std::fs::remove_file(self.state());
        self.reset_probe();
        p
    }

    pub fn reset_probe(&self) {
        let _ = std::fs::remove_dir_all(self.probe());
        std::fs::create_dir_all(self.probe()).expect("probe dir");
    }

    /// The hook calls libvirt made since the last reset, `NAME OP SUBOP` each.
    pub fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.probe().join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The calls for one domain, `OP SUBOP` each.
    pub fn calls_of(&self, name: &str) -> Vec<String> {
        self.calls()
            .iter()
            .filter_map(|c| c.strip_prefix(&format!("{name} ")).map(str::to_owned))
            .collect()
    }

    pub fn gh(&self, args: &[&str]) -> Output {
        Command::new(common::bin())
            .args(args)
            .env("GPUHOOK_CONFIG", self.config())
            .output()
            .expect("gpuhook")
    }

    pub fn list(&self) -> Value {
        let o = self.gh(&["list", "--json"]);
        assert!(o.status.success(), "list: {}", common::stderr(&o));
        serde_json::from_slice(&o.stdout).expect("json")
    }

    /// Holder name → (its kind, the PCI addresses it holds), per `list --json`.
    pub fn holders(&self) -> BTreeMap<String, (String, Vec<String>)> {
        holders_of(&self.list())
    }

    pub fn vm(&self, name: &str) -> VmSpec {
        VmSpec::new(name, &self.qemu)
    }

    pub fn define_vm(&self, spec: &VmSpec) {
        self.d.define_vm(&spec.xml()).expect("define VM");
    }

    /// `virsh start` of a VM; Err(stderr) on failure.
    pub fn start_vm(&self, name: &str) -> Result<(), String> {
        let o = self.d.virsh_qemu(&["start", name]).expect("virsh");
        if o.status.success() {
            Ok(())
        } else {
            let bed = self.d.check_mounts().err();
            Err(common::stderr(&o) + &bed.map(|b| format!(" [{b}]")).unwrap_or_default())
        }
    }

    pub fn vm_state(&self, name: &str) -> String {
        self.d
            .virsh_qemu_ok(&["domstate", name])
            .expect("domstate")
            .trim()
            .to_owned()
    }

    /// The running VM's QEMU process, from libvirt's pid file.
    pub fn qemu_pid(&self, name: &str) -> i32 {
        let p = self.d.qemu_state_dir().join(format!("{name}.pid"));
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .trim()
            .parse()
            .expect("pid")
    }

    pub fn define_lxc(&self, spec: &DomainSpec) {
        self.d.define(&spec.xml()).expect("define LXC domain");
    }

    /// `virsh start` of an LXC domain; Err(stderr) on failure.
    pub fn start_lxc(&self, name: &str) -> Result<(), String> {
        let o = self.d.virsh(&["start", name]).expect("virsh");
        if o.status.success() {
            Ok(())
        } else {
            Err(common::stderr(&o))
        }
    }

    /// Waits up to `secs` for `what` (checked every 50 ms).
    pub fn wait(&self, secs: u64, what: impl Fn() -> bool) -> bool {
        let end = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < end {
            if what() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        what()
    }
}

pub fn holders_of(l: &Value) -> BTreeMap<String, (String, Vec<String>)> {
    let mut m: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    for g in l["gpus"].as_array().expect("gpus") {
        if let Some(d) = g["holder"]["domain"].as_str() {
            let e = m.entry(d.into()).or_insert_with(|| {
                (
                    g["holder"]["kind"].as_str().unwrap_or("").to_owned(),
                    Vec::new(),
                )
            });
            e.1.push(g["pci"].as_str().expect("pci").into());
        }
    }
    m
}

/// An LXC domain that asks for these GPUs by address.
pub fn lxc_pinned(name: &str, pcis: &[&str]) -> DomainSpec {
    let devs: String = pcis
        .iter()
        .map(|p| format!(r#"<gpu:device pci="{p}"/>"#))
        .collect();
    DomainSpec::new(
        name,
        &format!(r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1">{devs}</gpu:gpus>"#),
    )
}

/// The one line of a failed `virsh start` that gpuhook wrote (libvirt quotes the hook's
/// standard error at the end of its own line); panics unless there is exactly one.
pub fn gpuhook_line(err: &str) -> String {
    let ours: Vec<&str> = err.lines().filter(|l| l.contains("gpuhook: ")).collect();
    assert_eq!(ours.len(), 1, "not one gpuhook line: {err}");
    let l = ours[0];
    l[l.find("gpuhook: ").expect("gpuhook")..].to_owned()
}

pub fn hostdev(pci: &str) -> Hostdev {
    Hostdev::pci(pci)
}

type Case = fn(&mut Bed);

const CASES: &[(&str, Case)] = &[
    ("plain_vm_untouched", lifecycle::plain_vm_untouched),
    ("plain_vm_save_restore", lifecycle::plain_vm_save_restore),
    (
        "plain_vm_reconnect_and_stale",
        lifecycle::plain_vm_reconnect_and_stale,
    ),
    (
        "failed_start_after_prepare_frees",
        lifecycle::failed_start_after_prepare_frees,
    ),
    (
        "gpu_metadata_in_a_vm_refused",
        lifecycle::gpu_metadata_in_a_vm_refused,
    ),
    ("vm_refused_gpu_of_lxc", contend::vm_refused_gpu_of_lxc),
    (
        "vm_refused_gpu_of_container",
        contend::vm_refused_gpu_of_container,
    ),
    ("lxc_refused_gpu_of_vm", contend::lxc_refused_gpu_of_vm),
    ("request_writes_hostdevs", contend::request_writes_hostdevs),
    ("mdev_vms_share_a_gpu", contend::mdev_vms_share_a_gpu),
];

fn main() {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if std::env::args().any(|a| a == "--list") {
        for (n, _) in CASES {
            println!("{n}: test");
        }
        return;
    }
    common::require_root();
    let t0 = Instant::now();
    let qemu = match testbed::vm::unpacked_qemu() {
        Ok(q) => q,
        Err(e) => {
            eprintln!("FATAL: no emulator for the VMs, so nothing here can be tested: {e}");
            std::process::exit(1);
        }
    };
    let work = PathBuf::from(format!("/var/lib/gpuhook-qemu-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let mut d = match Daemon::new(&work.join("libvirt"), Hook::Binary(common::bin())) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("FATAL: cannot set up libvirtd: {e}");
            std::process::exit(1);
        }
    };
    install_probe(&d, &work);
    d.write_config(&json!({})).unwrap();
    let t1 = Instant::now();
    if let Err(e) = d.start() {
        eprintln!("FATAL: libvirtd did not start, so nothing here can be tested: {e}");
        std::process::exit(1);
    }
    println!(
        "libvirtd up in {:.1}s ({}), hooks: {}, emulator: {} (ready in {:.1}s)",
        t1.elapsed().as_secs_f64(),
        d.qemu_uri,
        common::bin().display(),
        qemu.display(),
        t1.duration_since(t0).as_secs_f64()
    );
    let mut bed = Bed {
        d,
        work: work.clone(),
        hosts: 0,
        qemu,
    };
    let mut failed = Vec::new();
    let mut ran = 0;
    for (name, case) in CASES {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        ran += 1;
        let t = Instant::now();
        let mut r = std::panic::catch_unwind(AssertUnwindSafe(|| case(&mut bed)));
        // The test bed broken behind its back (its bind mounts detached): this case proved
        // nothing; the daemon starts again with its mounts for the next.
        if let Err(b) = bed.d.recover() {
            println!("test {name}: {b}; libvirtd restarted");
            r = Err(Box::new(b));
        }
        // A held probe call lets go, then every test domain goes.
        bed.reset_probe();
        bed.d.cleanup("gh-");
        let _ = Command::new("podman")
            .args(["rm", "-f", "-t", "0", "gh-qemu-oci"])
            .output();
        let _ = std::fs::remove_file(bed.state());
        match r {
            Ok(()) => println!("test {name} ... ok ({:.1}s)", t.elapsed().as_secs_f64()),
            Err(_) => {
                println!("test {name} ... FAILED");
                failed.push(*name);
            }
        }
    }
    let _ = bed.d.stop();
    println!(
        "\nqemu: {} passed; {} failed: {failed:?} ({:.0}s)",
        ran - failed.len(),
        failed.len(),
        t0.elapsed().as_secs_f64()
    );
    if failed.is_empty() {
        let _ = std::fs::remove_dir_all(&work);
    } else {
        println!(
            "work dir kept for inspection: {} (libvirtd log: {})",
            work.display(),
            bed.d.log_path().display()
        );
        std::process::exit(1);
    }
    if ran == 0 {
        eprintln!("no case matched {filters:?}");
        std::process::exit(1);
    }
}

/// The probe (`testbed::vm::probe_script`), in the daemon's `hooks/qemu.d` before it starts
/// (libvirt looks for hooks then).
fn install_probe(d: &Daemon, work: &Path) {
    let dir = d.hooks_dir().join("qemu.d");
    std::fs::create_dir_all(&dir).unwrap();
    let text = testbed::vm::probe_script(&work.join("probe"), &d.config_path(), &common::bin());
    let f = dir.join("90-probe");
    std::fs::write(&f, text).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir_all(work.join("probe")).unwrap();
}
