//! The VM's side: the scenarios, in order, as root on the booted Debian 13. Each one's
//! commands and their output go to `/job/results/NAME.log`; one `GPUHOOK-VM: RESULT NAME ok`
//! (or `FAIL` and the reason) line to the second serial port, which the host reads.

use super::vm::MANIFEST;
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::Instant;
use testbed::{FakeHost, HostPaths};

#[path = "hosts.rs"]
mod hosts;
#[path = "kubelet.rs"]
mod kubelet;
#[path = "libvirt.rs"]
mod libvirt;
#[path = "oci.rs"]
mod oci;
#[path = "qemu.rs"]
mod qemu;

pub struct Scenario {
    pub name: &'static str,
    /// Runs whatever the filters say (the package steps: the rest uses what they install).
    pub always: bool,
    run: fn(&mut Vm),
}

const fn s(name: &'static str, run: fn(&mut Vm)) -> Scenario {
    Scenario {
        name,
        always: false,
        run,
    }
}

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "host-facts",
        always: true,
        run: hosts::facts,
    },
    Scenario {
        name: "deb-lifecycle",
        always: true,
        run: hosts::deb_lifecycle,
    },
    Scenario {
        name: "rpm-lifecycle",
        always: true,
        run: hosts::rpm_lifecycle,
    },
    Scenario {
        name: "install",
        always: true,
        run: hosts::install,
    },
    s("demo", hosts::demo),
    s("libvirt-domain", libvirt::domains),
    s("libvirt-hotplug", libvirt::hotplug),
    s("qemu-plain", qemu::plain),
    s("qemu-passthrough", qemu::passthrough),
    s("qemu-killed", qemu::killed),
    s("podman-crun-systemd", oci::podman_crun),
    s("podman-runc-systemd", oci::podman_runc),
    s("podman-crun-cgroupfs", oci::podman_crun_cgroupfs),
    s("oci-hotplug-crun-systemd", oci::hotplug_crun),
    s("oci-hotplug-runc-systemd", oci::hotplug_runc),
    s("oci-hotplug-crun-cgroupfs", oci::hotplug_crun_cgroupfs),
    s("oci-userns-crun", oci::userns_crun),
    s("oci-userns-runc", oci::userns_runc),
    s("mps-sharing", oci::mps_sharing),
    s("cri-containerd", hosts::cri),
    s("kubelet-device-plugin", kubelet::kubelet),
];

pub fn selected(s: &Scenario, filters: &[String]) -> bool {
    s.always || filters.is_empty() || filters.iter().any(|f| s.name.contains(f.as_str()))
}

static PANIC: Mutex<String> = Mutex::new(String::new());

pub fn main(filters: &[String]) {
    std::panic::set_hook(Box::new(|info| {
        let msg = match info.payload().downcast_ref::<String>() {
            Some(s) => s.clone(),
            None => info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .unwrap_or_default(),
        };
        let at = info
            .location()
            .map(|l| format!(" ({}:{})", l.file(), l.line()))
            .unwrap_or_default();
        *PANIC.lock().unwrap_or_else(|e| e.into_inner()) = format!("{msg}{at}");
    }));
    let chosen: Vec<&Scenario> = SCENARIOS.iter().filter(|s| selected(s, filters)).collect();
    say(&format!("GPUHOOK-VM: START {} scenarios", chosen.len()));
    let results = Path::new("/job/results");
    let _ = std::fs::create_dir_all(results);
    let (mut passed, mut failed) = (0, 0);
    for sc in chosen {
        let log =
            std::fs::File::create(results.join(format!("{}.log", sc.name))).expect("scenario log");
        let mut vm = Vm {
            log,
            hosts: 0,
            cleanups: Vec::new(),
        };
        let t = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (sc.run)(&mut vm)));
        let secs = t.elapsed().as_secs_f64();
        match r {
            Ok(()) => {
                passed += 1;
                say(&format!("GPUHOOK-VM: RESULT {} ok {secs:.1}s", sc.name));
            }
            Err(_) => {
                failed += 1;
                let msg = std::mem::take(&mut *PANIC.lock().unwrap_or_else(|e| e.into_inner()));
                let _ = writeln!(vm.log, "\nFAILED: {msg}");
                let first = msg.lines().next().unwrap_or("").chars().take(400);
                say(&format!(
                    "GPUHOOK-VM: RESULT {} FAIL {secs:.1}s {}",
                    sc.name,
                    first.collect::<String>()
                ));
            }
        }
        // What the scenario started goes, passed or failed, before the next one runs.
        for c in std::mem::take(&mut vm.cleanups).iter().rev() {
            let _ = vm.sh(c);
        }
        let _ = vm.log.sync_all();
    }
    say(&format!("GPUHOOK-VM: DONE {passed} passed {failed} failed"));
}

fn say(line: &str) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{line}");
    let _ = o.flush();
}

/// One scenario's handle on the VM: its log, and the fake hosts it made.
pub struct Vm {
    log: std::fs::File,
    hosts: u32,
    /// Shell commands run after the scenario, last first, whatever its end.
    cleanups: Vec<String>,
}

pub const GPUHOOK: &str = "/usr/bin/gpuhook";
pub const CONFIG: &str = "/etc/gpuhook/config.json";
pub const STATE: &str = "/run/gpuhook/state.json";

impl Vm {
    /// Runs `script` after the scenario, passed or failed.
    pub fn on_exit(&mut self, script: &str) {
        self.cleanups.push(script.to_string());
    }

    pub fn note(&mut self, s: &str) {
        let _ = writeln!(self.log, "{s}");
    }

    /// Runs `cmd`, logging it and what it said.
    pub fn cmd(&mut self, cmd: &mut Command) -> Output {
        let t = Instant::now();
        let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        let _ = writeln!(
            self.log,
            "$ {cmd:?}\n  [{} in {:.1}s]",
            o.status,
            t.elapsed().as_secs_f64()
        );
        for (what, b) in [("out", &o.stdout), ("err", &o.stderr)] {
            for l in String::from_utf8_lossy(b).lines() {
                let _ = writeln!(self.log, "  {what}| {l}");
            }
        }
        o
    }

    pub fn sh(&mut self, script: &str) -> Output {
        self.cmd(Command::new("sh").args(["-c", script]))
    }

    /// `sh -c script`, which must succeed; its stdout.
    pub fn ok(&mut self, script: &str) -> String {
        let o = self.sh(script);
        assert!(
            o.status.success(),
            "`{script}` failed ({}): {}",
            o.status,
            last_line(&o)
        );
        text(&o)
    }

    /// `gpuhook ARGS` (the installed binary, the installed config).
    pub fn gh(&mut self, args: &[&str]) -> Output {
        self.cmd(Command::new(GPUHOOK).args(args))
    }

    pub fn list(&mut self) -> Value {
        let o = self.gh(&["list", "--json"]);
        assert!(o.status.success(), "list: {}", last_line(&o));
        serde_json::from_slice(&o.stdout).expect("list json")
    }

    /// The PCI addresses each holder holds, per `list --json`.
    pub fn holders(&mut self) -> std::collections::BTreeMap<String, Vec<String>> {
        let mut m: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for g in self.list()["gpus"].as_array().expect("gpus") {
            if let Some(d) = g["holder"]["domain"].as_str() {
                m.entry(d.to_owned())
                    .or_default()
                    .push(g["pci"].as_str().expect("pci").to_owned());
            }
            for s in g["sharing"]["holders"].as_array().into_iter().flatten() {
                m.entry(s["domain"].as_str().expect("domain").to_owned())
                    .or_default()
                    .push(s["slot"].as_str().expect("slot").to_owned());
            }
        }
        self.note(&format!("holders: {m:?}"));
        m
    }

    /// A new fake host (the blueprint's two Tesla M2050 unless told), described to the
    /// installed gpuhook in `/etc/gpuhook/config.json`; the state starts empty.
    pub fn host(&mut self, fake: FakeHost, edit: impl FnOnce(&mut Value)) -> HostPaths {
        self.hosts += 1;
        let dir = PathBuf::from(format!("/var/lib/gpuhook-vm/host-{}", std::process::id()))
            .join(self.hosts.to_string());
        let _ = std::fs::remove_dir_all(&dir);
        let p = fake.create(&dir).expect("fake host");
        let mut cfg = p.config(Path::new(STATE));
        edit(&mut cfg);
        self.note(&format!("config: {cfg}"));
        std::fs::write(CONFIG, serde_json::to_vec_pretty(&cfg).expect("json")).expect("config");
        let _ = std::fs::remove_file(STATE);
        p
    }

    /// For each host node: `open` when a process in `pid`'s cgroup may open it (ENXIO: no
    /// driver behind the fake number), `denied` (EPERM: a device program said no).
    pub fn access(&mut self, pid: i32, nodes: &[&Path]) -> Vec<&'static str> {
        let cg = cgroup_of(pid);
        let r = testbed::probe::open_in_cgroup(&cg.join("cgroup.procs"), None, nodes)
            .unwrap_or_else(|e| panic!("probe in {}: {e}", cg.display()));
        let v: Vec<&'static str> = r
            .iter()
            .map(|r| match r {
                Err(nix::errno::Errno::ENXIO) => "open",
                Err(nix::errno::Errno::EPERM) => "denied",
                Ok(()) => "opened",
                Err(_) => "error",
            })
            .collect();
        self.note(&format!(
            "access from {} ({}): {:?} -> {v:?}",
            pid,
            cg.display(),
            nodes
        ));
        v
    }
}

/// The unified cgroup directory of `pid`.
pub fn cgroup_of(pid: i32) -> PathBuf {
    let s = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    let rel = s
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_else(|| panic!("no unified cgroup for {pid}: {s}"));
    Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/'))
}

pub fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The last non-empty line of stderr (else stdout): what a failure said.
pub fn last_line(o: &Output) -> String {
    let e = err(o);
    let t = text(o);
    e.lines()
        .chain(t.lines())
        .rfind(|l| !l.trim().is_empty())
        .unwrap_or("")
        .to_string()
}

pub fn gpus(attrs: &str) -> String {
    format!(r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1" {attrs}/>"#)
}

pub fn cfg_runtime(path: &str) -> impl FnOnce(&mut Value) {
    let p = path.to_string();
    move |c: &mut Value| c["oci_runtime"] = json!(p)
}

pub fn manifest(rel: &str) -> PathBuf {
    Path::new(MANIFEST).join(rel)
}
