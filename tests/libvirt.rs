//! gpuhook under a real libvirtd with real LXC containers, real mknod, real cgroups.
//!
//! One daemon (isolated from the host's, see `testbed::libvirtd`) serves every case; this
//! file is its own test runner (`harness = false`) so the daemon can be started once,
//! restarted by cases, and stopped at the end. A daemon that cannot start fails the suite.
//!
//! `GPUHOOK_TEST_HOOK=installed` tests the hook the package installed in
//! `/etc/libvirt/hooks` (and `GPUHOOK_TEST_BIN` the CLI) instead of the one just built.
//! Arguments filter cases by substring.

mod common;
#[path = "libvirt/driver.rs"]
mod driver;
#[path = "libvirt/hotplug.rs"]
mod hotplug;
#[path = "libvirt/mps.rs"]
mod mps;
#[path = "libvirt/sharing.rs"]
mod sharing;

use gpuhook::enter::container::Container;
use nix::errno::Errno;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use testbed::{probe, Daemon, DomainSpec, FakeHost, Hook};

struct Bed {
    d: Daemon,
    work: PathBuf,
    hosts: usize,
}

/// One node as `stat` shows it inside the container.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    kind: String,
    major: u32,
    minor: u32,
    uid: u32,
    gid: u32,
    mode: u32,
}

const META_NS: &str = r#"xmlns:gpu="urn:gpuhook:gpu:1""#;

impl Bed {
    fn config(&self) -> PathBuf {
        self.d.config_path()
    }

    fn state(&self) -> PathBuf {
        self.work.join("state/state.json")
    }

    /// Describes a new fake host to the daemon's hook and to the CLI; clears the state.
    fn use_host(&mut self, fake: FakeHost) -> testbed::HostPaths {
        self.use_host_with(fake, |_| {})
    }

    fn use_host_with(
        &mut self,
        fake: FakeHost,
        edit: impl FnOnce(&mut Value),
    ) -> testbed::HostPaths {
        self.hosts += 1;
        let p = fake
            .create(&self.work.join(format!("host{}", self.hosts)))
            .expect("fake host");
        let mut cfg = p.config(&self.state());
        edit(&mut cfg);
        self.d.write_config(&cfg).expect("config");
        let _ = std::fs::remove_file(self.state());
        p
    }

    fn gh(&self, args: &[&str]) -> Output {
        Command::new(common::bin())
            .args(args)
            .env("GPUHOOK_CONFIG", self.config())
            .output()
            .expect("gpuhook")
    }

    fn list(&self) -> Value {
        let o = self.gh(&["list", "--json"]);
        assert!(o.status.success(), "list: {}", common::stderr(&o));
        serde_json::from_slice(&o.stdout).expect("json")
    }

    fn holders(&self) -> BTreeMap<String, Vec<String>> {
        let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for g in self.list()["gpus"].as_array().expect("gpus") {
            if let Some(d) = g["holder"]["domain"].as_str() {
                m.entry(d.into())
                    .or_default()
                    .push(g["pci"].as_str().expect("pci").into());
            }
        }
        m
    }

    fn reservation(&self, name: &str) -> Option<Value> {
        self.list()["reservations"]
            .as_array()
            .expect("reservations")
            .iter()
            .find(|r| r["domain"] == name)
            .cloned()
    }

    fn define(&self, spec: &DomainSpec) {
        self.d.define(&spec.xml()).expect("define");
    }

    /// `virsh start`; Err(stderr) on failure.
    fn start(&self, name: &str) -> Result<(), String> {
        let o = self.d.virsh(&["start", name]).expect("virsh");
        if o.status.success() {
            Ok(())
        } else {
            // A refusal because the daemon's hook no longer reads the test bed's config says so.
            let bed = self.d.check_mounts().err();
            Err(common::stderr(&o) + &bed.map(|b| format!(" [{b}]")).unwrap_or_default())
        }
    }

    fn define_start(&self, spec: &DomainSpec) {
        self.define(spec);
        if let Err(e) = self.start(&spec.name) {
            panic!("starting {}: {e}", spec.name);
        }
    }

    fn state_of(&self, name: &str) -> String {
        self.d
            .virsh_ok(&["domstate", name])
            .expect("domstate")
            .trim()
            .to_owned()
    }

    /// Waits up to 10 s for libvirt to see the domain stop.
    fn wait_shut_off(&self, name: &str) -> bool {
        for _ in 0..100 {
            if self.state_of(name) == "shut off" {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        false
    }

    fn xml(&self, name: &str) -> String {
        self.d.virsh_ok(&["dumpxml", name]).expect("dumpxml")
    }

    fn ct(&self, name: &str) -> Container {
        self.d.container(name).expect("container")
    }

    fn sh_in(&self, ct: &Container, script: &str) -> Output {
        testbed::shell_in(ct.init.pid, script)
            .output()
            .expect("nsenter")
    }

    /// GPU-ish entries of the container's /dev (nvidia*, kfd, dri/*).
    fn dev(&self, ct: &Container) -> BTreeMap<String, Entry> {
        let o = self.sh_in(ct, "for f in /dev/nvidia* /dev/nvidia-caps/* /dev/kfd /dev/dri /dev/dri/*; do [ -e \"$f\" ] || [ -L \"$f\" ] && stat -c '%n|%F|%t|%T|%u|%g|%a' \"$f\"; done; true");
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split('|').collect();
                (f.len() == 7).then(|| {
                    (
                        f[0].to_owned(),
                        Entry {
                            kind: f[1].to_owned(),
                            major: u32::from_str_radix(f[2], 16).unwrap_or(0),
                            minor: u32::from_str_radix(f[3], 16).unwrap_or(0),
                            uid: f[4].parse().unwrap_or(0),
                            gid: f[5].parse().unwrap_or(0),
                            mode: u32::from_str_radix(f[6], 8).unwrap_or(0),
                        },
                    )
                })
            })
            .collect()
    }

    /// Char nodes of the container's /dev that gpuhook manages: path → (major, minor).
    fn nodes(&self, ct: &Container) -> BTreeMap<String, (u32, u32)> {
        self.dev(ct)
            .into_iter()
            .filter(|(_, e)| e.kind == "character special file")
            .map(|(p, e)| (p, (e.major, e.minor)))
            .collect()
    }

    fn cgroup_dir(&self, ct: &Container) -> PathBuf {
        gpuhook::cgroup::for_pid(ct.init.pid)
            .expect("cgroup")
            .path()
            .to_path_buf()
    }

    fn devices_list(&self, ct: &Container) -> Vec<String> {
        let l = std::fs::read_to_string(self.cgroup_dir(ct).join("devices.list"))
            .expect("devices.list");
        l.lines().map(str::to_owned).collect()
    }

    /// Opens paths as a process of the container would (its cgroup, its mount namespace).
    fn open_in(&self, ct: &Container, paths: &[&str]) -> Vec<Result<(), Errno>> {
        let p: Vec<&Path> = paths.iter().map(Path::new).collect();
        probe::open_in_cgroup(
            &self.cgroup_dir(ct).join("cgroup.procs"),
            Some(ct.init.pid),
            &p,
        )
        .expect("probe")
    }

    /// Runs the hook directly as libvirt would, with the live XML.
    fn hook_direct(&self, name: &str, op: &str) -> Output {
        let xml = self.xml(name);
        common::run_with_stdin(
            Command::new(common::bin())
                .args(["hook", name, op, "begin", "-"])
                .env("GPUHOOK_CONFIG", self.config()),
            &xml,
        )
    }
}

fn spec(name: &str, attrs: &str) -> DomainSpec {
    DomainSpec::new(name, &format!("<gpu:gpus {META_NS} {attrs}/>"))
}

const LIBVIRT_DEFAULT: [&str; 9] = [
    "c 1:3 rwm",
    "c 1:5 rwm",
    "c 1:7 rwm",
    "c 1:8 rwm",
    "c 1:9 rwm",
    "c 5:0 rwm",
    "c 5:2 rwm",
    "c 10:229 rwm",
    "c 136:* rwm",
];

fn expect_list(got: &[String], extra: &[&str]) {
    let mut want: Vec<String> = LIBVIRT_DEFAULT
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect();
    want.sort();
    let mut got = got.to_vec();
    got.sort();
    assert_eq!(got, want, "devices.list");
}

fn nodes(pairs: &[(&str, u32, u32)]) -> BTreeMap<String, (u32, u32)> {
    pairs
        .iter()
        .map(|(p, a, b)| (p.to_string(), (*a, *b)))
        .collect()
}

// ---------------------------------------------------------------- cases

fn blueprint_flavor(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    let s = DomainSpec::new(
        "gh-cg1",
        &format!(
            r#"<gpu:gpus {META_NS}><gpu:extra_spec name="gpus">= 2</gpu:extra_spec><gpu:extra_spec name="gpu_arch">s== fermi</gpu:extra_spec></gpu:gpus>"#
        ),
    );
    b.define_start(&s);
    assert_eq!(b.holders()["gh-cg1"], ["0000:07:00.0", "0000:08:00.0"]);
    assert_eq!(b.reservation("gh-cg1").unwrap()["phase"], "running");
    let ct = b.ct("gh-cg1");
    assert_eq!(b.reservation("gh-cg1").unwrap()["init_pid"], ct.init.pid);
    assert_eq!(
        b.nodes(&ct),
        nodes(&[
            ("/dev/nvidia0", 195, 0),
            ("/dev/nvidia1", 195, 1),
            ("/dev/nvidiactl", 195, 255),
            ("/dev/nvidia-uvm", 509, 0),
            ("/dev/nvidia-uvm-tools", 509, 1)
        ])
    );
    let e = &b.dev(&ct)["/dev/nvidia0"];
    assert_eq!(
        (e.uid, e.gid, e.mode),
        (0, 0, 0o666),
        "owner root of the container, host node's mode"
    );
    expect_list(
        &b.devices_list(&ct),
        &[
            "c 195:0 rw",
            "c 195:1 rw",
            "c 195:255 rw",
            "c 509:0 rw",
            "c 509:1 rw",
        ],
    );
    // A device it was not given, made inside by root: the cgroup refuses it.
    let mk = b.sh_in(
        &ct,
        "mknod /dev/nvidia7 c 195 7 && mknod /dev/nvidia-modeset c 195 254",
    );
    assert!(mk.status.success(), "{}", common::stderr(&mk));
    let r = b.open_in(
        &ct,
        &[
            "/dev/nvidia0",
            "/dev/nvidia1",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia7",
            "/dev/nvidia-modeset",
            "/dev/null",
        ],
    );
    assert_eq!(
        r,
        vec![
            Err(Errno::ENXIO),
            Err(Errno::ENXIO),
            Err(Errno::ENXIO),
            Err(Errno::ENXIO),
            Err(Errno::EPERM),
            Err(Errno::EPERM),
            Ok(())
        ]
    );
    b.d.virsh_ok(&["destroy", "gh-cg1"]).unwrap();
    assert!(b.holders().is_empty(), "destroy frees");
    assert!(b.reservation("gh-cg1").is_none());
}

fn more_than_free_fails(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    b.define_start(&spec("gh-a", r#"count="1""#));
    b.define(&spec("gh-b", r#"count="2""#));
    let e = b.start("gh-b").expect_err("gh-b must not start");
    assert!(e.contains("Hook script execution failed"), "{e}");
    assert!(
        e.contains("gpuhook: domain 'gh-b': cannot reserve 2 GPUs: only 1 of the host's 2 matching GPUs is free: 1 held by domain 'gh-a'"),
        "{e}"
    );
    assert_eq!(b.state_of("gh-b"), "shut off");
    assert_eq!(
        b.holders().keys().collect::<Vec<_>>(),
        ["gh-a"],
        "the failed start's release freed nothing of gh-a"
    );
    b.define_start(&spec("gh-c", ""));
    let (a, c) = (b.ct("gh-a"), b.ct("gh-c"));
    assert_eq!(
        b.nodes(&a)
            .keys()
            .filter(|k| k.starts_with("/dev/nvidia") && k[11..].parse::<u32>().is_ok())
            .collect::<Vec<_>>(),
        ["/dev/nvidia0"]
    );
    assert_eq!(
        b.nodes(&c)
            .keys()
            .filter(|k| k.starts_with("/dev/nvidia") && k[11..].parse::<u32>().is_ok())
            .collect::<Vec<_>>(),
        ["/dev/nvidia1"]
    );
    assert!(!b.devices_list(&a).contains(&"c 195:1 rw".to_string()));
    assert!(!b.devices_list(&c).contains(&"c 195:0 rw".to_string()));
}

/// A running container's init names itself with bytes that are not UTF-8 (`printf` into
/// its own `/proc/self/comm`, no privilege needed): it still holds both GPUs, a second
/// domain is refused naming it, and `reconnect` keeps it. (Read as text, its `stat` did not
/// parse, the init looked gone, and the next request took all of its GPUs.)
fn renamed_init_keeps_its_gpus(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    let go = b.work.join("rename-now");
    let _ = std::fs::remove_file(&go);
    let mut s = spec("gh-comm", r#"count="2""#);
    s.init = format!(
        r"while [ ! -e {} ]; do sleep 0.1; done; printf '\377\376' > /proc/self/comm; while :; do sleep 1; done",
        go.display()
    );
    b.define_start(&s);
    let ct = b.ct("gh-comm");
    std::fs::write(&go, "").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::read(format!("/proc/{}/comm", ct.init.pid)).unwrap_or_default() != b"\xff\xfe\n"
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the init did not rename itself"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    b.define(&spec("gh-comm2", r#"count="1""#));
    let e = b.start("gh-comm2").expect_err("gh-comm2 must not start");
    assert!(e.contains("held by domain 'gh-comm'"), "{e}");
    assert_eq!(
        b.holders().keys().collect::<Vec<_>>(),
        ["gh-comm"],
        "{:?}",
        b.holders()
    );
    common::assert_ok(&b.hook_direct("gh-comm", "reconnect"));
    assert_eq!(b.holders()["gh-comm"].len(), 2, "{:?}", b.holders());
    b.d.virsh_ok(&["destroy", "gh-comm"]).unwrap();
    assert!(b.wait_shut_off("gh-comm"));
    assert!(b.holders().is_empty(), "{:?}", b.holders());
}

/// A real libvirt LXC domain and podman containers (through gpuhook-runtime on the same
/// config and state) contend for the blueprint's two GPUs: each door's refusal names the
/// other's holder, and a freed GPU goes to the other door.
fn libvirt_and_podman_contend(b: &mut Bed) {
    b.use_host_with(FakeHost::blueprint(), |c| {
        c["oci_runtime"] = serde_json::json!("/usr/sbin/runc")
    });
    b.define_start(&spec("gh-lx", r#"count="1""#));
    let (rt, rootfs) = sharing::podman_bed(b, "oci");
    let podman = |extra: &[&str], cmd: &str| {
        Command::new("podman")
            .arg("--runtime")
            .arg(&rt)
            .args(["run", "--network", "none", "--ulimit", "nofile=1024:1024"])
            .args(["--ulimit", "nproc=1024:1024"])
            .args(extra)
            .arg("--rootfs")
            .arg(&rootfs)
            .args(["sh", "-c", cmd])
            .output()
            .expect("podman")
    };
    let _ = Command::new("podman")
        .args(["rm", "-f", "-t", "0", "gh-oci-lx"])
        .output();
    let r = podman(&["--rm", "--annotation", "gpuhook.io/gpus=2"], "true");
    let e = common::stderr(&r);
    assert!(!r.status.success(), "{e}");
    assert!(
        e.contains("cannot reserve 2 GPUs: only 1 of the host's 2 matching GPUs is free: 1 held by domain 'gh-lx'"),
        "{e}"
    );
    let r = podman(
        &[
            "-d",
            "--name",
            "gh-oci-lx",
            "--annotation",
            "gpuhook.io/gpus=1",
        ],
        "sleep 60",
    );
    assert!(r.status.success(), "{}", common::stderr(&r));
    let id = String::from_utf8_lossy(&r.stdout).trim().to_string();
    let h = b.holders();
    assert_eq!(h.get("gh-lx").map(Vec::len), Some(1), "{h:?}");
    assert_eq!(h.get(&id).map(Vec::len), Some(1), "{h:?}");
    assert_ne!(h["gh-lx"], h[&id]);
    b.define(&spec("gh-lx2", r#"count="1""#));
    let e = b.start("gh-lx2").expect_err("no GPU is free");
    assert!(
        e.contains(&format!("held by domain 'gh-lx', container '{id}'")),
        "{e}"
    );
    // The container goes: its GPU is the next domain's.
    let _ = Command::new("podman")
        .args(["rm", "-f", "-t", "0", &id])
        .output();
    b.start("gh-lx2").expect("gh-lx2 gets the container's GPU");
    let h = b.holders();
    assert_eq!(h.keys().collect::<Vec<_>>(), ["gh-lx", "gh-lx2"]);
    b.d.virsh_ok(&["destroy", "gh-lx"]).unwrap();
    b.d.virsh_ok(&["destroy", "gh-lx2"]).unwrap();
    assert!(b.holders().is_empty());
}

fn plain_domain_untouched(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    let plain = DomainSpec::new(
        "gh-plain",
        "<nova:instance xmlns:nova=\"http://openstack.org/xmlns/libvirt/nova/1.1\"/>",
    );
    b.define_start(&plain);
    let ct = b.ct("gh-plain");
    assert!(b.dev(&ct).is_empty(), "no GPU node in a plain container");
    expect_list(&b.devices_list(&ct), &[]);
    assert!(
        !b.state().exists(),
        "a plain domain never creates the state file"
    );
    b.d.virsh_ok(&["destroy", "gh-plain"]).unwrap();
    // A broken config: plain domains still start and stop; GPU domains fail naming it.
    std::fs::write(b.config(), "{ \"sysfs\": ").unwrap();
    b.start("gh-plain")
        .expect("plain domain with broken config");
    b.define(&spec("gh-g", ""));
    let e = b.start("gh-g").expect_err("GPU domain with broken config");
    assert!(
        e.contains("gpuhook: domain 'gh-g': config /etc/gpuhook/config.json: "),
        "{e}"
    );
    b.d.virsh_ok(&["destroy", "gh-plain"]).unwrap();
    assert!(!b.state().exists());
}

/// Domains as Nova's libvirt driver writes them (its own metadata classes, from PyPI): a
/// flavor with Placement's `resources:CUSTOM_GPU_FERMI=2` gets both Fermi GPUs, one without
/// GPU keys starts untouched beside it, and the GPUs are free again after destroy.
fn nova_flavor_through_libvirt(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    let init = b.work.join("nova-init.sh");
    std::fs::write(&init, "#!/bin/sh\nwhile :; do sleep 1; done\n").unwrap();
    std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let init = init.to_str().unwrap();
    let gpu = common::nova_domain(
        "gh-nova-g1",
        &common::uuid(0x4e0a),
        init,
        "g1.fermi2",
        &serde_json::json!({"resources:CUSTOM_GPU_FERMI": "2", "hw:cpu_policy": "shared"}),
    );
    let plain = common::nova_domain(
        "gh-nova-m1",
        &common::uuid(0x4e0b),
        init,
        "m1.small",
        &serde_json::json!({"hw:cpu_policy": "shared"}),
    );
    b.d.define(&gpu).expect("define");
    b.d.define(&plain).expect("define");
    b.start("gh-nova-g1").expect("start the GPU flavor");
    b.start("gh-nova-m1").expect("start the plain flavor");
    assert_eq!(b.holders()["gh-nova-g1"], ["0000:07:00.0", "0000:08:00.0"]);
    assert_eq!(
        b.reservation("gh-nova-g1").unwrap()["request"],
        "2 GPUs, arch in resource class CUSTOM_GPU_FERMI"
    );
    let ct = b.ct("gh-nova-g1");
    let n = b.nodes(&ct);
    assert_eq!(
        (n.get("/dev/nvidia0"), n.get("/dev/nvidia1")),
        (Some(&(195, 0)), Some(&(195, 1)))
    );
    let r = b.open_in(&ct, &["/dev/nvidia0", "/dev/nvidia1"]);
    assert_eq!(r, vec![Err(Errno::ENXIO), Err(Errno::ENXIO)]);
    let m1 = b.ct("gh-nova-m1");
    assert!(
        b.dev(&m1).is_empty(),
        "no GPU node in the plain flavor's container"
    );
    expect_list(&b.devices_list(&m1), &[]);
    assert_eq!(b.holders().len(), 1);
    b.d.virsh_ok(&["destroy", "gh-nova-g1"]).unwrap();
    b.d.virsh_ok(&["destroy", "gh-nova-m1"]).unwrap();
    assert!(b.holders().is_empty(), "destroy frees");
}

/// Two containers on MIG slices of one H100: each sees its GPU's node and only its own
/// instance's two capability nodes; the other's, and the management capabilities
/// (`nvidia-cap1` config, `nvidia-cap2` monitor), are refused by its device cgroup.
fn mig_slices_of_one_gpu(b: &mut Bed) {
    use testbed::fakehost::{mig_minor, CAPS_MAJOR};
    b.use_host(FakeHost::dgx8_mig());
    let slice = |name: &str, gi: u32| {
        DomainSpec::new(
            name,
            &format!(
                r#"<gpu:gpus {META_NS}><gpu:mig pci="0000:1a:00.0" gi="{gi}" ci="0"/></gpu:gpus>"#
            ),
        )
    };
    b.define_start(&slice("gh-mig-a", 1));
    b.define_start(&slice("gh-mig-b", 2));
    let cap = |m: u32| format!("/dev/nvidia-caps/nvidia-cap{m}");
    for (name, mine, other) in [("gh-mig-a", 1, 2), ("gh-mig-b", 2, 1)] {
        let ct = b.ct(name);
        let (g, c) = (mig_minor(3, mine, None), mig_minor(3, mine, Some(0)));
        let (og, oc) = (mig_minor(3, other, None), mig_minor(3, other, Some(0)));
        let want: BTreeMap<String, (u32, u32)> = [
            ("/dev/nvidia3".to_string(), (195, 3)),
            (cap(g), (CAPS_MAJOR, g)),
            (cap(c), (CAPS_MAJOR, c)),
            ("/dev/nvidiactl".to_string(), (195, 255)),
            ("/dev/nvidia-uvm".to_string(), (509, 0)),
            ("/dev/nvidia-uvm-tools".to_string(), (509, 1)),
        ]
        .into_iter()
        .collect();
        assert_eq!(b.nodes(&ct), want, "{name}");
        let grants = [
            "c 195:3 rw".to_string(),
            format!("c {CAPS_MAJOR}:{g} rw"),
            format!("c {CAPS_MAJOR}:{c} rw"),
            "c 195:255 rw".into(),
            "c 509:0 rw".into(),
            "c 509:1 rw".into(),
        ];
        let grants: Vec<&str> = grants.iter().map(String::as_str).collect();
        expect_list(&b.devices_list(&ct), &grants);
        // The other instance's capabilities and the management ones, made inside by root.
        let mk = b.sh_in(
            &ct,
            &format!(
                "mknod /dev/nvidia-caps/nvidia-cap{og} c {CAPS_MAJOR} {og} && mknod /dev/nvidia-caps/nvidia-cap{oc} c {CAPS_MAJOR} {oc} && mknod /dev/nvidia-caps/nvidia-cap1 c {CAPS_MAJOR} 1 && mknod /dev/nvidia-caps/nvidia-cap2 c {CAPS_MAJOR} 2"
            ),
        );
        assert!(mk.status.success(), "{}", common::stderr(&mk));
        let paths = [cap(g), cap(c), cap(og), cap(oc), cap(1), cap(2)];
        let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
        assert_eq!(
            b.open_in(&ct, &paths),
            vec![
                Err(Errno::ENXIO),
                Err(Errno::ENXIO),
                Err(Errno::EPERM),
                Err(Errno::EPERM),
                Err(Errno::EPERM),
                Err(Errno::EPERM)
            ],
            "{name}"
        );
    }
    // libvirtd restarts: reconnect keeps both reservations and repairs a lost capability.
    let ct = b.ct("gh-mig-a");
    let lost = mig_minor(3, 1, Some(0));
    let o = b.sh_in(&ct, &format!("rm /dev/nvidia-caps/nvidia-cap{lost}"));
    assert!(o.status.success());
    b.d.restart().unwrap();
    assert_eq!(b.state_of("gh-mig-a"), "running");
    assert_eq!(
        b.reservation("gh-mig-a").unwrap()["gpus"],
        serde_json::json!(["0000:1a:00.0/gi1/ci0"])
    );
    assert_eq!(b.nodes(&ct)[&cap(lost)], (CAPS_MAJOR, lost));
    // The state file lost: reconnect re-adopts, from each container's grants, exactly the
    // instance it uses (not the one packing would choose).
    std::fs::remove_file(b.state()).unwrap();
    b.d.restart().unwrap();
    for (name, gi) in [("gh-mig-a", 1), ("gh-mig-b", 2)] {
        assert_eq!(b.state_of(name), "running");
        assert_eq!(
            b.reservation(name).unwrap()["gpus"],
            serde_json::json!([format!("0000:1a:00.0/gi{gi}/ci0")]),
            "{name}"
        );
    }
    // The GPU itself is not handed out whole meanwhile.
    b.define(&spec("gh-whole", r#"count="6""#));
    let e = b.start("gh-whole").expect_err("a MIG GPU given whole");
    assert!(e.contains("3 in MIG mode"), "{e}");
    b.d.virsh_ok(&["destroy", "gh-mig-a"]).unwrap();
    b.d.virsh_ok(&["destroy", "gh-mig-b"]).unwrap();
    assert!(b.reservation("gh-mig-a").is_none() && b.reservation("gh-mig-b").is_none());
}

/// Compute instances of one GPU instance share its memory, engines and fault domain: with
/// 0000:40:00.0's gi1/ci0 held by a running domain, a domain asking for gi1/ci1 (exact) or
/// for every instance left (packed) is refused at start in one line naming the holder, and
/// nothing stays reserved for it; with the first one gone the second starts.
fn mig_gpu_instance_one_holder(b: &mut Bed) {
    b.use_host(FakeHost::dgx8_mig());
    let slice = |name: &str, ci: u32| {
        DomainSpec::new(
            name,
            &format!(
                r#"<gpu:gpus {META_NS}><gpu:mig pci="0000:40:00.0" gi="1" ci="{ci}"/></gpu:gpus>"#
            ),
        )
    };
    b.define_start(&slice("gh-gi-a", 0));
    b.define(&slice("gh-gi-b", 1));
    let e = b
        .start("gh-gi-b")
        .expect_err("two holders on one GPU instance");
    assert!(
        e.contains("gpuhook: domain 'gh-gi-b': 0000:40:00.0/gi1/ci1 (MIG pci 0000:40:00.0 gi 1 ci 1): its GPU instance gi 1 is held by domain 'gh-gi-a' (through 0000:40:00.0/gi1/ci0)"),
        "{e}"
    );
    assert!(b.reservation("gh-gi-b").is_none());
    // 13 instances: one held, its GPU instance's other one taken with it.
    b.define(&spec("gh-gi-p", r#"mig="yes" count="12""#));
    let e = b
        .start("gh-gi-p")
        .expect_err("a packed request sharing a GPU instance");
    assert!(
        e.contains("only 11 of the host's 13 MIG instances on matching GPUs are free: held by domain 'gh-gi-a'"),
        "{e}"
    );
    assert!(b.reservation("gh-gi-p").is_none());
    b.d.virsh_ok(&["destroy", "gh-gi-a"]).unwrap();
    b.start("gh-gi-b").expect("its GPU instance is free again");
    assert_eq!(
        b.reservation("gh-gi-b").unwrap()["gpus"],
        serde_json::json!(["0000:40:00.0/gi1/ci1"])
    );
    b.d.virsh_ok(&["destroy", "gh-gi-b"]).unwrap();
}

fn reconnect_keeps_and_repairs(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    b.define_start(&spec("gh-r", ""));
    let before = b.reservation("gh-r").unwrap();
    let ct = b.ct("gh-r");
    b.d.restart().unwrap();
    assert_eq!(b.state_of("gh-r"), "running");
    let after = b.reservation("gh-r").unwrap();
    assert_eq!(
        (&after["gpus"], &after["init_pid"], &after["phase"]),
        (&before["gpus"], &before["init_pid"], &before["phase"])
    );
    // Lost node and lost grant (e.g. systemd daemon-reload resetting the cgroup): restored.
    let o = b.sh_in(&ct, "rm /dev/nvidia0 /dev/nvidia-uvm");
    assert!(o.status.success());
    std::fs::write(b.cgroup_dir(&ct).join("devices.deny"), "c 195:0 rw").unwrap();
    assert_eq!(b.open_in(&ct, &["/dev/nvidia0"]), vec![Err(Errno::ENOENT)]);
    b.d.restart().unwrap();
    assert_eq!(b.state_of("gh-r"), "running");
    assert_eq!(b.nodes(&ct)["/dev/nvidia0"], (195, 0));
    assert_eq!(b.nodes(&ct)["/dev/nvidia-uvm"], (509, 0));
    assert!(b.devices_list(&ct).contains(&"c 195:0 rw".to_string()));
    assert_eq!(b.open_in(&ct, &["/dev/nvidia0"]), vec![Err(Errno::ENXIO)]);
    // The state file lost (wiped /run while running): reconnect re-adopts the GPU it uses.
    std::fs::remove_file(b.state()).unwrap();
    b.d.restart().unwrap();
    assert_eq!(b.state_of("gh-r"), "running");
    assert_eq!(b.holders()["gh-r"], ["0000:07:00.0"]);
    assert_eq!(b.reservation("gh-r").unwrap()["init_pid"], ct.init.pid);
}

fn numa_placement_and_isolation(b: &mut Bed) {
    b.use_host(FakeHost::dgx8());
    b.define_start(&spec("gh-n1", r#"count="4""#));
    b.define_start(&spec("gh-n2", r#"count="4" arch="hopper""#));
    let h = b.holders();
    assert_eq!(
        h["gh-n1"],
        [
            "0000:18:00.0",
            "0000:1a:00.0",
            "0000:40:00.0",
            "0000:42:00.0"
        ],
        "NUMA 0"
    );
    assert_eq!(
        h["gh-n2"],
        [
            "0000:9a:00.0",
            "0000:9c:00.0",
            "0000:c8:00.0",
            "0000:ca:00.0"
        ],
        "NUMA 1"
    );
    b.define(&spec("gh-n3", ""));
    let e = b.start("gh-n3").expect_err("host is full");
    assert!(
        e.contains("only 0 of the host's 8 matching GPUs are free: 8 held by domain 'gh-n1', domain 'gh-n2'"),
        "{e}"
    );
    let (n1, n2) = (b.ct("gh-n1"), b.ct("gh-n2"));
    let gpu_nodes = |m: BTreeMap<String, (u32, u32)>| {
        m.into_iter()
            .filter(|(_, v)| v.0 == 195 && v.1 < 128)
            .map(|(_, v)| v.1)
            .collect::<Vec<_>>()
    };
    assert_eq!(gpu_nodes(b.nodes(&n1)), vec![0, 1, 2, 3]);
    assert_eq!(gpu_nodes(b.nodes(&n2)), vec![4, 5, 6, 7]);
    assert!(b.sh_in(&n1, "mknod /dev/nvidia4 c 195 4").status.success());
    assert_eq!(
        b.open_in(&n1, &["/dev/nvidia0", "/dev/nvidia4"]),
        vec![Err(Errno::ENXIO), Err(Errno::EPERM)]
    );
}

fn three_vendors(b: &mut Bed) {
    b.use_host(FakeHost::mixed());
    b.define_start(&spec("gh-amd", r#"vendor="amd""#));
    b.define_start(&spec(
        "gh-intel",
        r#"vendor="intel" model="max" capabilities="compute,graphics""#,
    ));
    b.define_start(&spec("gh-nv", r#"vendor="nvidia""#));
    let (amd, intel, nv) = (b.ct("gh-amd"), b.ct("gh-intel"), b.ct("gh-nv"));
    assert_eq!(
        b.nodes(&amd),
        nodes(&[("/dev/dri/renderD129", 226, 129), ("/dev/kfd", 510, 0)])
    );
    assert_eq!(b.dev(&amd)["/dev/dri"].kind, "directory");
    assert_eq!(b.dev(&amd)["/dev/kfd"].mode, 0o660);
    assert_eq!(
        b.nodes(&intel),
        nodes(&[
            ("/dev/dri/card2", 226, 2),
            ("/dev/dri/renderD130", 226, 130)
        ])
    );
    assert_eq!(
        b.nodes(&nv),
        nodes(&[
            ("/dev/nvidia0", 195, 0),
            ("/dev/nvidiactl", 195, 255),
            ("/dev/nvidia-uvm", 509, 0),
            ("/dev/nvidia-uvm-tools", 509, 1)
        ])
    );
    expect_list(&b.devices_list(&amd), &["c 226:129 rw", "c 510:0 rw"]);
    expect_list(&b.devices_list(&intel), &["c 226:2 rw", "c 226:130 rw"]);
    assert_eq!(
        b.open_in(&amd, &["/dev/kfd", "/dev/dri/renderD129"]),
        vec![Err(Errno::ENXIO), Err(Errno::ENXIO)]
    );
    b.define(&spec("gh-nv2", r#"vendor="nvidia""#));
    let e = b.start("gh-nv2").expect_err("the T4 has no driver");
    assert!(
        e.contains("1 unusable (0000:65:00.0: NVIDIA driver has no"),
        "{e}"
    );
}

fn idmap_owners(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    let mut s = spec("gh-id", r#"uid="5" gid="6" mode="0660""#);
    s.idmap = Some(200000);
    b.define_start(&s);
    let ct = b.ct("gh-id");
    let d = b.dev(&ct);
    for p in ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"] {
        assert_eq!(
            (d[p].uid, d[p].gid, d[p].mode),
            (200005, 200006, 0o660),
            "{p}"
        );
    }
    let mut s = spec("gh-id2", "");
    s.idmap = Some(300000);
    b.define_start(&s);
    let d = b.dev(&b.ct("gh-id2"));
    assert_eq!(
        (
            d["/dev/nvidia1"].uid,
            d["/dev/nvidia1"].gid,
            d["/dev/nvidia1"].mode
        ),
        (300000, 300000, 0o666),
        "mapped root"
    );
}

fn destroy_and_start_again(b: &mut Bed) {
    b.use_host(FakeHost::dgx8());
    b.define_start(&spec("gh-cyc", r#"count="2""#));
    let first = b.holders()["gh-cyc"].clone();
    for _ in 0..3 {
        b.d.virsh_ok(&["destroy", "gh-cyc"]).unwrap();
        assert!(b.holders().is_empty());
        b.start("gh-cyc").unwrap();
        assert_eq!(b.holders()["gh-cyc"], first);
        let ct = b.ct("gh-cyc");
        assert_eq!(
            b.reservation("gh-cyc").unwrap()["init_pid"],
            ct.init.pid,
            "the new init, not the stale one"
        );
        assert_eq!(b.open_in(&ct, &["/dev/nvidia2"]), vec![Err(Errno::ENXIO)]);
    }
}

/// Host-side targets a hostile container points its /dev entries at.
struct Targets {
    file: PathBuf,
    dir: PathBuf,
    host_dev: Vec<String>,
}

impl Targets {
    fn new(b: &Bed) -> Targets {
        let dir = b.work.join("precious-dir");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let file = b.work.join("precious-file");
        std::fs::write(&file, "precious\n").unwrap();
        Targets {
            file,
            dir,
            host_dev: Self::host_dev(),
        }
    }
    fn host_dev() -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir("/dev")
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
    /// Nothing outside the container's /dev was created or changed.
    fn intact(&self) {
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::symlink_metadata(&self.file).unwrap();
        assert!(md.is_file(), "target replaced");
        assert_eq!(std::fs::read_to_string(&self.file).unwrap(), "precious\n");
        assert_eq!((md.uid(), md.mode() & 0o7777), (0, 0o644));
        // The containers here share the host's root, and the hostile inits run `ln -s` through
        // their own /dev symlinks to this directory. When libvirt stops such a container (a
        // start gpuhook refused), it signals the container's processes: an `rm` dies before
        // removing `/dev/dri -> precious-dir`, the init (immune as PID 1) goes on, and its next
        // `ln -s precious-file /dev/dri/renderD129` lands here. Measured without gpuhook doing
        // anything (a domain without GPU metadata, start + destroy): 3 of 30. A symlink here
        // is the container's doing: gpuhook makes only directories and character devices and
        // never calls symlink(2). Anything else here is a failure.
        let found: Vec<String> = std::fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| !e.file_type().unwrap().is_symlink())
            .map(|e| {
                let md = std::fs::symlink_metadata(e.path()).unwrap();
                format!(
                    "{} ({:?}, mode {:o}, rdev {:x}, link {:?})",
                    e.file_name().to_string_lossy(),
                    md.file_type(),
                    md.mode(),
                    md.rdev(),
                    std::fs::read_link(e.path()).ok()
                )
            })
            .collect();
        assert!(found.is_empty(), "created in the target dir: {found:?}");
        assert_eq!(Self::host_dev(), self.host_dev, "host /dev changed");
    }
}

fn hostile_direct(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    b.define_start(&spec("gh-h", r#"count="2""#));
    let ct = b.ct("gh-h");
    let t = Targets::new(b);
    // A symlink where a node belongs.
    let o = b.sh_in(
        &ct,
        &format!("rm /dev/nvidia0 && ln -s {} /dev/nvidia0", t.file.display()),
    );
    assert!(o.status.success());
    let o = b.hook_direct("gh-h", "started");
    common::assert_fails(&o, "gh-h", "container /dev/nvidia0 is a symlink (not the character device 195:0); refusing to replace it");
    t.intact();
    // A regular file where a node belongs: the nodes this call made are taken back, and the
    // grants it added revoked; what was there before stays.
    assert!(b
        .sh_in(
            &ct,
            "rm /dev/nvidia0 && rm /dev/nvidiactl && : > /dev/nvidiactl"
        )
        .status
        .success());
    std::fs::write(b.cgroup_dir(&ct).join("devices.deny"), "c 195:0 rw").unwrap();
    let o = b.hook_direct("gh-h", "started");
    common::assert_fails(
        &o,
        "gh-h",
        "container /dev/nvidiactl is a regular file (not the character device 195:255)",
    );
    let n = b.nodes(&ct);
    assert!(
        !n.contains_key("/dev/nvidia0"),
        "node made by the failed call is removed: {n:?}"
    );
    assert_eq!(n["/dev/nvidia1"], (195, 1), "a node that was there stays");
    assert!(
        !b.devices_list(&ct).contains(&"c 195:0 rw".to_string()),
        "grant added by the failed call is revoked"
    );
    assert!(b.devices_list(&ct).contains(&"c 195:1 rw".to_string()));
    assert_eq!(b.dev(&ct)["/dev/nvidiactl"].kind, "regular empty file");
    t.intact();
    // A symlinked /dev/dri (AMD render node lives there).
    b.use_host(FakeHost::mixed());
    b.define_start(&spec("gh-hd", r#"vendor="amd""#));
    let ct = b.ct("gh-hd");
    assert!(b
        .sh_in(
            &ct,
            &format!("rm -r /dev/dri && ln -s {} /dev/dri", t.dir.display())
        )
        .status
        .success());
    let o = b.hook_direct("gh-hd", "started");
    common::assert_fails(
        &o,
        "gh-hd",
        "container /dev/dri is a symlink; refusing to follow it",
    );
    t.intact();
    // A container whose /dev is the host's devtmpfs: refused before anything is written.
    b.define_start(&spec("gh-hh", r#"vendor="intel" model="flex""#));
    let ct = b.ct("gh-hh");
    let o = b.sh_in(&ct, "mount -t devtmpfs devtmpfs /dev");
    assert!(o.status.success(), "{}", common::stderr(&o));
    let o = b.hook_direct("gh-hh", "started");
    common::assert_fails(
        &o,
        "gh-hh",
        "container /dev is the host's /dev; refusing to write there",
    );
    t.intact();
}

fn hostile_reconnect_kills(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    b.define_start(&spec("gh-hr", ""));
    let ct = b.ct("gh-hr");
    let t = Targets::new(b);
    assert!(b
        .sh_in(
            &ct,
            &format!("rm /dev/nvidia0 && ln -s {} /dev/nvidia0", t.file.display())
        )
        .status
        .success());
    b.d.restart().unwrap();
    // libvirt stops it; libvirt 9.0 sometimes also drops the definition while loading
    // ("domain is already being removed"), so only "not running" is asserted.
    let st = b.d.virsh(&["domstate", "gh-hr"]).unwrap();
    let st = String::from_utf8_lossy(&st.stdout).trim().to_owned();
    assert!(
        st == "shut off" || st.is_empty(),
        "a container that cannot be made consistent is stopped, not {st}"
    );
    for _ in 0..50 {
        if !ct.init.alive() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(!ct.init.alive(), "its init is gone");
    assert!(b.holders().is_empty(), "its GPUs are freed");
    t.intact();
    let log = std::fs::read_to_string(b.d.log_path()).unwrap();
    assert!(log.contains("gpuhook: domain 'gh-hr': reconnect: container cannot be made consistent: container /dev/nvidia0 is a symlink"), "libvirtd log lacks the reason");
}

fn hostile_init_races_started(b: &mut Bed) {
    let t = Targets::new(b);
    let mut outcomes = Vec::new();
    for i in 0..4 {
        b.use_host(FakeHost::mixed());
        let mut s = spec(&format!("gh-race{i}"), r#"vendor="amd""#);
        s.init = format!(
            "ln -s {f} /dev/kfd; rm -rf /dev/dri; ln -s {d} /dev/dri; : > /dev/nvidiactl; while :; do sleep 1; done",
            f = t.file.display(),
            d = t.dir.display()
        );
        b.define(&s);
        match b.start(&s.name) {
            Ok(()) => {
                // gpuhook won the race: its nodes are there, the init's symlinks were refused.
                let ct = b.ct(&s.name);
                assert_eq!(b.nodes(&ct)["/dev/kfd"], (510, 0));
                outcomes.push("started");
            }
            Err(e) => {
                // The refusal names the domain and a container path (a symlink, or a directory the
                // init removed under gpuhook's descriptor).
                assert!(
                    e.contains(&format!("gpuhook: domain '{}': ", s.name))
                        && e.contains("container /dev/"),
                    "{e}"
                );
                assert!(b.holders().is_empty(), "a failed start frees its GPUs");
                outcomes.push("refused");
            }
        }
        t.intact();
    }
    eprintln!("    race outcomes: {outcomes:?}");
}

/// The container swaps /dev entries for symlinks in a tight loop while `started` runs,
/// again and again: every run ends in success or a one-line refusal, and nothing outside
/// the container's /dev is ever created or changed.
fn hostile_swap_race(b: &mut Bed) {
    b.use_host(FakeHost::mixed());
    let t = Targets::new(b);
    let mut s = spec("gh-swap", r#"vendor="amd" capabilities="compute,graphics""#);
    s.init = format!(
        "while :; do rm -rf /dev/dri /dev/kfd; ln -s {d} /dev/dri; ln -s {f} /dev/kfd; rm -f /dev/dri /dev/kfd; mkdir /dev/dri; ln -s {f} /dev/dri/renderD129; rm -rf /dev/dri; done",
        d = t.dir.display(),
        f = t.file.display()
    );
    b.define(&s);
    // The start itself may lose the race (then libvirt stops it): retry until it runs.
    let mut started = false;
    for _ in 0..10 {
        if b.start("gh-swap").is_ok() {
            started = true;
            break;
        }
    }
    assert!(started, "never won the start race in 10 tries");
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..60 {
        let o = b.hook_direct("gh-swap", "started");
        match o.status.code() {
            Some(0) => ok += 1,
            Some(1) => {
                let e = common::stderr(&o);
                assert_eq!(e.trim_end().lines().count(), 1, "{e}");
                // "container /dev/dri is a symlink…", "cannot create container
                // /dev/dri/card1 …: ENOENT" (directory removed under the open descriptor), …
                assert!(
                    e.starts_with("gpuhook: domain 'gh-swap': ") && e.contains("container /dev/"),
                    "{e}"
                );
                refused += 1;
            }
            other => panic!("hook ended with {other:?}: {}", common::stderr(&o)),
        }
        t.intact();
    }
    eprintln!("    swap race: 60 started runs against a swapping container: {ok} succeeded, {refused} refused");
}

/// A container whose /dev has no room (no inodes left): a clear error, everything undone.
fn full_container_dev(b: &mut Bed) {
    b.use_host(FakeHost::mixed());
    b.define_start(&spec("gh-full", r#"vendor="amd""#));
    let ct = b.ct("gh-full");
    let t = Targets::new(b);
    // Take the nodes away, then leave the tmpfs no free inode.
    let o = b.sh_in(&ct, "rm -rf /dev/dri /dev/kfd && used=$(df -i /dev | awk 'NR==2{print $3}') && mount -o remount,nr_inodes=$((used+1)) /dev && touch /dev/last && ! touch /dev/nomore");
    assert!(o.status.success(), "{}", common::stderr(&o));
    std::fs::write(b.cgroup_dir(&ct).join("devices.deny"), "c 226:129 rw").unwrap();
    std::fs::write(b.cgroup_dir(&ct).join("devices.deny"), "c 510:0 rw").unwrap();
    let o = b.hook_direct("gh-full", "started");
    common::assert_fails(&o, "gh-full", "No space left on device");
    assert!(
        b.nodes(&ct).is_empty(),
        "nothing half-made: {:?}",
        b.dev(&ct)
    );
    expect_list(&b.devices_list(&ct), &[]);
    t.intact();
    // Room again: the next run recovers.
    assert!(b.sh_in(&ct, "rm -f /dev/last").status.success());
    assert!(b
        .sh_in(&ct, "mount -o remount,nr_inodes=4096 /dev")
        .status
        .success());
    let o = b.hook_direct("gh-full", "started");
    common::assert_ok(&o);
    assert_eq!(b.nodes(&ct).len(), 2);
}

/// The container's init exits while `started` runs: success (before) or a clear error
/// (after), never a write elsewhere; libvirt then stops the domain and its GPUs come back.
fn init_exits_during_started(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    let t = Targets::new(b);
    let mut outcomes = Vec::new();
    let mut missed = 0;
    for (i, delay_us) in [0u64, 300, 1000, 3000].into_iter().enumerate() {
        let name = format!("gh-exit{i}");
        b.define_start(&spec(&name, ""));
        let ct = b.ct(&name);
        let xml = b.xml(&name);
        let mut child = Command::new(common::bin())
            .args(["hook", &name, "started", "begin", "-"])
            .env("GPUHOOK_CONFIG", b.config())
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), xml.as_bytes()).unwrap();
        std::thread::sleep(std::time::Duration::from_micros(delay_us));
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(ct.init.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        let o = child.wait_with_output().unwrap();
        let e = common::stderr(&o);
        match o.status.code() {
            Some(0) => outcomes.push("done before exit"),
            Some(1) => {
                assert_eq!(e.trim_end().lines().count(), 1, "{e}");
                assert!(
                    e.contains("exited")
                        || e.contains("released while the container started")
                        || e.contains("is gone")
                        || e.contains("does not exist")
                        || e.contains("no child")
                        || e.contains("container helper"),
                    "{e}"
                );
                outcomes.push("refused");
            }
            other => panic!("{other:?}: {e}"),
        }
        t.intact();
        if !b.wait_shut_off(&name) {
            // libvirt's own miss, not gpuhook's: its controller lost its libvirtd client at
            // start-up (it happens with plain domains too), so the exit event went nowhere.
            // The reservation must still be freed by the next thing libvirt does: destroy.
            assert!(!ct.init.alive(), "the init was killed");
            let log = controller_log_since_start(b, &name);
            assert!(
                log.contains("Dropping event 1 because libvirtd is not connected"),
                "domain still running with a dead init, and not libvirt's known miss:\n{log}"
            );
            if outcomes.last() == Some(&"done before exit") {
                // gpuhook already sees the reservation as stale: a prepare would reclaim it.
                let r = b.reservation(&name).expect("still reserved");
                assert!(r["stale"].as_str().unwrap_or("").contains("is gone"), "{r}");
            }
            missed += 1;
            b.d.virsh_ok(&["destroy", &name]).unwrap();
        }
        assert!(
            b.reservation(&name).is_none(),
            "GPUs of a dead container are freed"
        );
    }
    eprintln!("    init exit during started: {outcomes:?}; exits libvirt missed: {missed}");
}

/// What libvirt's controller logged for the domain's latest start.
fn controller_log_since_start(b: &Bed, name: &str) -> String {
    let log = std::fs::read_to_string(b.d.lxc_log(name)).unwrap_or_default();
    match log.rfind(": starting up") {
        Some(i) => log[i..].to_owned(),
        None => log,
    }
}

fn killed_behind_libvirts_back(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    b.define_start(&spec("gh-k", r#"count="2""#));
    let ct = b.ct("gh-k");
    b.d.stop().unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(ct.controller),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(ct.init.pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(b.reservation("gh-k").unwrap()["stale"]
        .as_str()
        .unwrap()
        .contains("is gone"));
    b.d.start().unwrap();
    // libvirt noticed the dead container (release hook), or the next prepare reclaims it.
    b.define_start(&spec("gh-k2", r#"count="2""#));
    assert_eq!(b.holders().keys().collect::<Vec<_>>(), ["gh-k2"]);
}

/// The gpuhook-libvirt binary: `$GPUHOOK_TEST_LIBVIRT_BIN`, else beside the gpuhook just built.
fn libvirt_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("GPUHOOK_TEST_LIBVIRT_BIN") {
        return p.into();
    }
    let p = common::bin().with_file_name("gpuhook-libvirt");
    assert!(
        p.exists(),
        "{} is missing: cargo build -p gpuhook-libvirt (cargo test --workspace builds it)",
        p.display()
    );
    p
}

fn glv(b: &Bed, args: &[&str]) -> Output {
    Command::new(libvirt_bin())
        .arg("-c")
        .arg(&b.d.uri)
        .arg("--config")
        .arg(b.config())
        .args(args)
        .output()
        .expect("gpuhook-libvirt")
}

fn request_through_libvirt(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    b.define(&DomainSpec::new("gh-req", ""));
    let o = glv(b, &["request", "gh-req", "--count", "2", "--arch", "Fermi"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "domain 'gh-req' now asks for 2 GPUs, arch == fermi"
    );
    let xml = b.xml("gh-req");
    assert!(
        xml.contains("urn:gpuhook:gpu:1") && xml.contains("count=\"2\""),
        "{xml}"
    );
    b.start("gh-req").unwrap();
    assert_eq!(b.holders()["gh-req"].len(), 2);
    // Validated by the hook's parser before anything is set.
    for (args, needle) in [
        (vec!["--count", "0"], "count must be at least 1"),
        (
            vec!["--count", "1", "--vendor", "3dfx"],
            "unknown vendor '3dfx'",
        ),
        (
            vec!["--count", "1", "--capabilities", "display"],
            "unknown capability 'display'",
        ),
        (
            vec!["--count", "1", "--uid", "70000"],
            "uid 70000 is not mapped",
        ),
    ] {
        let mut a = vec!["request", "gh-req"];
        a.extend(args);
        let o = if needle.starts_with("uid") {
            let mut s = DomainSpec::new("gh-req-id", "");
            s.idmap = Some(100000);
            b.define(&s);
            a[1] = "gh-req-id";
            glv(b, &a)
        } else {
            glv(b, &a)
        };
        assert!(!o.status.success());
        assert!(
            common::stderr(&o).contains(needle),
            "{}",
            common::stderr(&o)
        );
    }
    assert!(
        b.xml("gh-req").contains("count=\"2\""),
        "a refused request changes nothing"
    );
    // Running: the persistent definition changes, the live one only with --live.
    let o = glv(
        b,
        &[
            "request",
            "gh-req",
            "--count",
            "1",
            "--device",
            "0000:08:00.0",
        ],
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("(from its next start)"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(b.xml("gh-req").contains("count=\"2\""));
    assert!(b
        .d
        .virsh_ok(&["dumpxml", "--inactive", "gh-req"])
        .unwrap()
        .contains("pci=\"0000:08:00.0\""));
    b.d.virsh_ok(&["destroy", "gh-req"]).unwrap();
    b.start("gh-req").unwrap();
    assert_eq!(b.holders()["gh-req"], ["0000:08:00.0"]);
    let o = glv(b, &["request", "gh-req", "--clear"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert!(!b
        .d
        .virsh_ok(&["dumpxml", "--inactive", "gh-req"])
        .unwrap()
        .contains("urn:gpuhook"));
    let o = glv(b, &["request", "gh-nope", "--count", "1"]);
    assert!(common::stderr(&o).contains("no domain 'gh-nope'"));
}

fn reconcile_frees_only_the_gone(b: &mut Bed) {
    use gpuhook::host::procfs::ProcRef;
    use gpuhook::reserve::state::{rfc3339, HolderId, Phase, Reservation, Store};
    b.use_host(FakeHost::dgx8());
    b.define_start(&spec("gh-live", ""));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let me = ProcRef::of(std::process::id() as i32).unwrap();
    let fake =
        |n: u32, name: &str, gpu: &str, phase: Phase, prepared_by: Option<ProcRef>, age: i64| {
            Reservation {
                holder: HolderId::Libvirt {
                    name: name.into(),
                    uuid: common::uuid(n),
                },
                gpus: vec![gpu.parse().unwrap()],
                phase,
                request: "1 GPU".into(),
                created: rfc3339(now - age),
                updated: rfc3339(now - age),
                prepared_by,
                controller: None,
                init: (phase == Phase::Running).then_some(ProcRef {
                    pid: 999_999,
                    start_time: 1,
                }),
                cgroup: None,
                namespaces: None,
                nodes: vec![],
                mounts: vec![],
                rootfs: Default::default(),
                hotplugged: false,
                node_mounts: Vec::new(),
                driver: None,
                driver_version: None,
            }
        };
    Store::new(&b.state())
        .update(|st| {
            for r in [
                fake(1, "gh-ghost", "0000:9a:00.0", Phase::Running, None, 60),
                fake(
                    2,
                    "gh-starting",
                    "0000:9c:00.0",
                    Phase::Prepared,
                    Some(me),
                    5,
                ),
                fake(
                    3,
                    "gh-abandoned",
                    "0000:c8:00.0",
                    Phase::Prepared,
                    Some(me),
                    3600,
                ),
            ] {
                st.reservations.insert(r.key(), r);
            }
            Ok::<_, gpuhook::Error>(())
        })
        .unwrap();
    let o = glv(b, &["reconcile", "--dry-run"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        out.contains("would free 0000:9a:00.0 of domain 'gh-ghost'")
            && out.contains("would free 0000:c8:00.0 of domain 'gh-abandoned'"),
        "{out}"
    );
    assert!(
        !out.contains("gh-live") && !out.contains("gh-starting"),
        "{out}"
    );
    assert_eq!(b.holders().len(), 4, "dry run changes nothing");
    let o = glv(b, &["reconcile"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.starts_with("freed "))
            .count(),
        2
    );
    assert_eq!(
        b.holders().keys().collect::<Vec<_>>(),
        ["gh-live", "gh-starting"]
    );
    let o = glv(b, &["reconcile"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("nothing to free"));
    // A broken libvirt URI is a clear error.
    let o = Command::new(libvirt_bin())
        .args(["-c", "lxc:///system?socket=/nonexistent", "--config"])
        .arg(b.config())
        .arg("reconcile")
        .output()
        .unwrap();
    assert!(
        !o.status.success()
            && common::stderr(&o).contains("cannot connect to lxc:///system?socket=/nonexistent")
    );
}

/// The container mounts something else over its `/dev`: a host directory its root shares, or
/// a sub-directory of a fresh devtmpfs (the host's real `/dev`). gpuhook writes only into the
/// tmpfs libvirt's controller made for it: `started` and `reconnect` refuse in one line and
/// nothing appears outside.
fn hostile_dev_overmount(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    b.define_start(&spec("gh-ovr", ""));
    let ct = b.ct("gh-ovr");
    let t = Targets::new(b);
    // `started` and `reconnect` both refuse; after each, `outside` holds nothing new.
    let refused = |b: &Bed, t: &Targets, outside: &Path| {
        for op in ["started", "reconnect"] {
            let o = b.hook_direct("gh-ovr", op);
            common::assert_fails(
                &o,
                "gh-ovr",
                "container /dev is not the tmpfs libvirt made for it",
            );
            let made: Vec<_> = std::fs::read_dir(outside)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert!(
                made.is_empty(),
                "{op} wrote into {}: {made:?}",
                outside.display()
            );
            t.intact();
        }
    };
    // A host directory bind-mounted over /dev.
    let o = b.sh_in(&ct, &format!("mount --bind {} /dev", t.dir.display()));
    assert!(o.status.success(), "{}", common::stderr(&o));
    refused(b, &t, &t.dir);
    // A sub-directory of a devtmpfs mounted in the container: making it creates
    // /dev/gh-ovr-sub on the host (devtmpfs has one superblock), and nothing may land there.
    let host_sub = Path::new("/dev/gh-ovr-sub");
    let _ = std::fs::remove_dir(host_sub);
    let view = b.work.join("devtmpfs-view");
    std::fs::create_dir_all(&view).unwrap();
    let o = b.sh_in(
        &ct,
        &format!(
            "umount /dev && mount -t devtmpfs devtmpfs {v} && mkdir {v}/gh-ovr-sub && mount --bind {v}/gh-ovr-sub /dev",
            v = view.display()
        ),
    );
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert!(
        host_sub.is_dir(),
        "the container's devtmpfs is the host's /dev"
    );
    let t = Targets::new(b);
    refused(b, &t, host_sub);
    std::fs::remove_dir(host_sub).unwrap();
    // Its own /dev back in place: the same container gets its nodes again.
    let o = b.sh_in(&ct, "umount /dev");
    assert!(o.status.success(), "{}", common::stderr(&o));
    common::assert_ok(&b.hook_direct("gh-ovr", "started"));
    assert_eq!(b.nodes(&ct)["/dev/nvidia0"], (195, 0));
}

/// The state lost a running container's reservation (a wiped `/run`, a state file replaced
/// by hand; `gpuhook release` of a running domain is refused) and libvirtd restarts:
/// `reconnect` adopts what the container's device cgroup grants by exact rule, never a GPU
/// whose node the container has in its `/dev`, never more than it asks for.
fn reconnect_adopts_only_granted(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    b.define_start(&spec("gh-adopt", r#"count="1""#));
    let ct = b.ct("gh-adopt");
    assert_eq!(b.holders()["gh-adopt"], ["0000:07:00.0"]);
    // A node of the other GPU in its /dev (a container controls what its /dev holds).
    let o = b.sh_in(&ct, "mknod /dev/nvidia1 c 195 1");
    assert!(o.status.success(), "{}", common::stderr(&o));
    lose_reservation(b, "gh-adopt");
    assert!(b.holders().is_empty());
    b.d.restart().unwrap();
    assert_eq!(b.state_of("gh-adopt"), "running");
    assert_eq!(
        b.holders()["gh-adopt"],
        ["0000:07:00.0"],
        "adopted from its cgroup only"
    );
    assert!(!b.devices_list(&ct).contains(&"c 195:1 rw".to_string()));
    assert_eq!(
        b.open_in(&ct, &["/dev/nvidia0", "/dev/nvidia1"]),
        vec![Err(Errno::ENXIO), Err(Errno::EPERM)]
    );
    // Its cgroup grants both GPUs (an operator's hand), it asks for one: it keeps one, and
    // loses access to the other (free in the state, so another domain may get it).
    std::fs::write(b.cgroup_dir(&ct).join("devices.allow"), "c 195:1 rw").unwrap();
    lose_reservation(b, "gh-adopt");
    // (Run as libvirt would at its restart: libvirtd logs a hook's stderr only on failure.)
    let o = b.hook_direct("gh-adopt", "reconnect");
    common::assert_ok(&o);
    assert_eq!(
        b.holders()["gh-adopt"],
        ["0000:07:00.0"],
        "never beyond count"
    );
    assert!(
        common::stderr(&o).contains("gpuhook: warning: domain 'gh-adopt': reconnect: its device cgroup also granted GPU(s) 0000:08:00.0 beyond what it holds for 1 GPU; access taken away"),
        "{}",
        common::stderr(&o)
    );
    assert!(!b.devices_list(&ct).contains(&"c 195:1 rw".to_string()));
    assert_eq!(
        b.open_in(&ct, &["/dev/nvidia0", "/dev/nvidia1"]),
        vec![Err(Errno::ENXIO), Err(Errno::EPERM)]
    );
    b.d.virsh_ok(&["destroy", "gh-adopt"]).unwrap();
    // Its init moves itself into a sub-cgroup where it denied its GPU: the evidence is still
    // read from the cgroup libvirt made for it (through its controller), so it re-adopts
    // the GPU it holds, not a fresh one beside the access it keeps.
    b.define_start(&spec("gh-adopt-a", ""));
    b.define_start(&spec("gh-adopt-b", ""));
    assert_eq!(b.holders()["gh-adopt-b"], ["0000:08:00.0"]);
    b.d.virsh_ok(&["destroy", "gh-adopt-a"]).unwrap();
    let ct = b.ct("gh-adopt-b");
    // Named `libvirt`, as libvirt's own nested cgroup is under systemd: the name gives it
    // nothing (the domain cgroup is the controller's, never one below).
    let jail = b.cgroup_dir(&ct).join("libvirt");
    std::fs::create_dir(&jail).unwrap();
    std::fs::write(jail.join("devices.deny"), "c 195:1 rw").unwrap();
    std::fs::write(jail.join("cgroup.procs"), ct.init.pid.to_string()).unwrap();
    lose_reservation(b, "gh-adopt-b");
    common::assert_ok(&b.hook_direct("gh-adopt-b", "reconnect"));
    assert_eq!(
        b.holders()["gh-adopt-b"],
        ["0000:08:00.0"],
        "from its domain cgroup"
    );
    b.d.virsh_ok(&["destroy", "gh-adopt-b"]).unwrap();
    let _ = std::fs::remove_dir(&jail);
}

/// The state loses domain `name`'s reservation, as a wiped `/run` or a state file replaced by
/// hand does (`gpuhook release` of a running domain is refused).
fn lose_reservation(b: &Bed, name: &str) {
    gpuhook::reserve::state::Store::new(&b.state())
        .update(|st| {
            st.reservations.retain(|_, r| r.holder.name() != name);
            Ok::<_, gpuhook::Error>(())
        })
        .unwrap();
}

/// `gpuhook release` of a running domain is refused, in one line naming `detach --all`: its
/// container keeps its GPU (it opens) and no one else gets it; `detach --all` takes the GPU
/// back (the container can no longer open it) and `release` then lets the reservation go;
/// the GPU is another's to have. Once stopped, a domain's reservation is gone with it.
fn release_of_a_running_domain(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    b.define_start(&spec("gh-rel", r#"count="1""#));
    let ct = b.ct("gh-rel");
    assert_eq!(b.holders()["gh-rel"], ["0000:07:00.0"]);
    assert_eq!(b.open_in(&ct, &["/dev/nvidia0"]), vec![Err(Errno::ENXIO)]);
    let o = b.gh(&["release", "gh-rel"]);
    assert_eq!(o.status.code(), Some(1));
    let e = common::stderr(&o);
    assert_eq!(
        e.trim_end(),
        format!("gpuhook: domain 'gh-rel' still runs (init {}) with GPUs 0000:07:00.0: release frees only what no running container holds; stop it, or take its GPUs back with 'gpuhook detach gh-rel --domain --all'", ct.init.pid)
    );
    assert_eq!(b.holders()["gh-rel"], ["0000:07:00.0"], "nothing freed");
    assert_eq!(b.open_in(&ct, &["/dev/nvidia0"]), vec![Err(Errno::ENXIO)]);
    b.define(&spec("gh-rel2", r#"count="2""#));
    let e = b.start("gh-rel2").unwrap_err();
    assert!(e.contains("held by domain 'gh-rel'"), "{e}");
    b.gh_host_ok(&["detach", "gh-rel", "--all"]);
    assert_eq!(b.open_in(&ct, &["/dev/nvidia0"]), vec![Err(Errno::ENOENT)]);
    assert!(!b.devices_list(&ct).contains(&"c 195:0 rw".to_string()));
    let o = b.gh(&["release", "gh-rel"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let u = b.xml("gh-rel");
    let u = u
        .split("<uuid>")
        .nth(1)
        .and_then(|u| u.split("</uuid>").next())
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("released domain 'gh-rel' ({u}) (it held no GPU)\n")
    );
    // Nothing of it is left: the other domain gets both GPUs.
    b.start("gh-rel2").expect("both GPUs are free");
    assert_eq!(b.holders()["gh-rel2"], ["0000:07:00.0", "0000:08:00.0"]);
}

/// `gpuhook-libvirt request --clear --live` drops the request from a running domain's live
/// XML; its stop hooks then see no gpuhook metadata, and still free its GPUs by UUID.
fn stop_frees_after_live_clear(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    b.define_start(&spec("gh-clr", r#"count="2""#));
    assert_eq!(b.holders()["gh-clr"].len(), 2);
    let o = glv(b, &["request", "gh-clr", "--clear", "--live"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert!(!b.xml("gh-clr").contains("urn:gpuhook"), "live XML lost it");
    b.d.virsh_ok(&["destroy", "gh-clr"]).unwrap();
    assert!(b.holders().is_empty(), "freed at stop: {:?}", b.holders());
    // A domain that never asked is still untouched: no state file is made for it.
    std::fs::remove_file(b.state()).unwrap();
    b.define_start(&DomainSpec::new("gh-clr-plain", ""));
    b.d.virsh_ok(&["destroy", "gh-clr-plain"]).unwrap();
    assert!(!b.state().exists());
}

/// Sub-cgroups of the container's device cgroup (systemd's, a nested container manager's)
/// that exist before `started` or `reconnect` get the grants too (v1 does not pass a parent's
/// new rule to existing children), and a rollback takes them back from all of them.
fn grants_reach_sub_cgroups(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    b.define_start(&spec("gh-sub", ""));
    let ct = b.ct("gh-sub");
    let cg = b.cgroup_dir(&ct);
    let open_from = |d: &Path| {
        probe::open_in_cgroup(
            &d.join("cgroup.procs"),
            Some(ct.init.pid),
            &[Path::new("/dev/nvidia0")],
        )
        .expect("probe")
    };
    let lose = || {
        // A deny on the container's cgroup reaches every cgroup below it.
        std::fs::write(cg.join("devices.deny"), "c 195:0 rw").unwrap();
    };
    lose();
    let sub = cg.join("system.slice");
    std::fs::create_dir(&sub).unwrap();
    // A sub-cgroup narrowed on purpose (a unit with DevicePolicy=closed, a nested container
    // runtime's own list): gpuhook never widens it.
    let closed = cg.join("closed.service");
    std::fs::create_dir(&closed).unwrap();
    std::fs::write(closed.join("devices.deny"), "c 1:9 rwm").unwrap();
    assert_eq!(open_from(&sub), vec![Err(Errno::EPERM)]);
    common::assert_ok(&b.hook_direct("gh-sub", "started"));
    assert_eq!(open_from(&closed), vec![Err(Errno::EPERM)], "not widened");
    assert_eq!(
        open_from(&sub),
        vec![Err(Errno::ENXIO)],
        "granted below too"
    );
    // reconnect, with a deeper one.
    lose();
    let deeper = sub.join("inner.scope");
    std::fs::create_dir(&deeper).unwrap();
    b.d.restart().unwrap();
    assert_eq!(b.state_of("gh-sub"), "running");
    for d in [&cg, &sub, &deeper] {
        assert_eq!(open_from(d), vec![Err(Errno::ENXIO)], "{}", d.display());
    }
    // A failing `started` revokes what it added, everywhere.
    lose();
    let o = b.sh_in(&ct, "rm /dev/nvidiactl && : > /dev/nvidiactl");
    assert!(o.status.success());
    common::assert_fails(
        &b.hook_direct("gh-sub", "started"),
        "gh-sub",
        "container /dev/nvidiactl is a regular file",
    );
    for d in [&cg, &sub, &deeper] {
        let l = std::fs::read_to_string(d.join("devices.list")).unwrap();
        assert!(
            !l.lines().any(|x| x == "c 195:0 rw"),
            "{}: {l}",
            d.display()
        );
        assert_eq!(open_from(d), vec![Err(Errno::EPERM)], "{}", d.display());
    }
    assert_eq!(open_from(&closed), vec![Err(Errno::EPERM)]);
    std::fs::remove_dir(&deeper).unwrap();
    std::fs::remove_dir(&sub).unwrap();
    std::fs::remove_dir(&closed).unwrap();
}

type Case = fn(&mut Bed);

/// A host with CDI: the fake driver's spec (as `nvidia-ctk cdi generate` writes it) in the
/// second of two spec directories; the driver; a fresh root filesystem at `rootfs`.
fn cdi_host(b: &mut Bed, rootfs: &str) -> (testbed::driver::FakeDriver, PathBuf) {
    let fake = FakeHost::blueprint();
    let cdi = b.work.join(format!("cdi{}", b.hosts + 1));
    let (etc, run) = (cdi.join("etc"), cdi.join("run"));
    let p = b.use_host_with(fake.clone(), |c| c["cdi_spec_dirs"] = json!([etc, run]));
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::create_dir_all(&run).unwrap();
    let drv = common::fake_driver();
    common::write_config(&run.join("nvidia.yaml"), &drv.nvidia_spec(&fake, &p));
    let dir = b.work.join(rootfs);
    let _ = std::fs::remove_dir_all(&dir);
    (drv, testbed::driver::rootfs(&dir).expect("rootfs"))
}

fn with_rootfs(name: &str, attrs: &str, rootfs: &Path, ro: bool) -> DomainSpec {
    let mut s = spec(name, attrs);
    s.rootfs = Some((rootfs.to_path_buf(), ro));
    s
}

/// The host's own mounts under `dir` (none may appear: the container's mounts stay in it).
fn host_mounts_under(dir: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&*dir.to_string_lossy()))
        .map(str::to_owned)
        .collect()
}

/// A libvirt LXC container with its own root filesystem asks `driver="cdi"`: at `started`
/// gpuhook mounts the driver's files into the running container (mount API, read-only,
/// nosuid, nodev), makes the spec's links and the linker cache; nvidia-smi, ldconfig -p and
/// dlopen("libcuda.so.1") work inside, and nothing is mounted on the host's side.
/// `reconnect` re-checks the mounts (one the container took away is said, not fatal); a
/// second start works again.
fn cdi_own_rootfs(b: &mut Bed) {
    let (_drv, rootfs) = cdi_host(b, "cdi-rootfs");
    b.define_start(&with_rootfs("gh-cdi", r#"driver="cdi""#, &rootfs, false));
    let ct = b.ct("gh-cdi");
    let o = b.sh_in(&ct, common::CDI_PROBE);
    common::assert_cdi_probe(&String::from_utf8_lossy(&o.stdout));
    assert_eq!(b.nodes(&ct).get("/dev/nvidia-modeset"), Some(&(195, 254)));
    assert!(
        host_mounts_under(&rootfs).is_empty(),
        "{:?}",
        host_mounts_under(&rootfs)
    );
    let st: Value = serde_json::from_slice(&std::fs::read(b.state()).unwrap()).unwrap();
    let r = st["reservations"]
        .as_object()
        .and_then(|m| m.values().find(|r| r["domain"] == "gh-cdi"))
        .expect("reservation");
    assert!(r["mounts"].as_array().is_some_and(|m| m.len() > 10), "{r}");
    // reconnect: all in place; then one taken away by the container: said, container kept.
    common::assert_ok(&b.hook_direct("gh-cdi", "reconnect"));
    let o = b.sh_in(&ct, "umount /usr/bin/nvidia-smi");
    assert!(o.status.success(), "{}", common::stderr(&o));
    let o = b.hook_direct("gh-cdi", "reconnect");
    common::assert_ok(&o);
    assert!(
        common::stderr(&o).contains("1 of ") && common::stderr(&o).contains("/usr/bin/nvidia-smi"),
        "{}",
        common::stderr(&o)
    );
    // Stop and start again: the mount points gpuhook made are reused. Meanwhile the
    // container left a FIFO at gpuhook's ld.so.conf.d name (an open for writing would hang
    // or fail) and a symlink to one of its files at its ld.so.conf: gpuhook never opens
    // what is there, it renames a new file over it.
    b.d.virsh_ok(&["destroy", "gh-cdi"]).unwrap();
    assert!(b.wait_shut_off("gh-cdi"));
    let conf = rootfs.join("etc/ld.so.conf.d/00-gpuhook-cdi.conf");
    std::fs::remove_file(&conf).unwrap();
    nix::unistd::mkfifo(&conf, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    std::fs::write(rootfs.join("etc/victim"), "keep\n").unwrap();
    std::fs::remove_file(rootfs.join("etc/ld.so.conf")).unwrap();
    std::os::unix::fs::symlink("/etc/victim", rootfs.join("etc/ld.so.conf")).unwrap();
    b.start("gh-cdi").expect("second start");
    assert!(std::fs::symlink_metadata(&conf).unwrap().is_file());
    assert_eq!(
        std::fs::read_to_string(&conf).unwrap(),
        "/usr/lib/x86_64-linux-gnu\n"
    );
    assert_eq!(
        std::fs::read_to_string(rootfs.join("etc/victim")).unwrap(),
        "keep\n"
    );
    let ct = b.ct("gh-cdi");
    let o = b.sh_in(&ct, common::CDI_PROBE);
    common::assert_cdi_probe(&String::from_utf8_lossy(&o.stdout));
    b.d.virsh_ok(&["destroy", "gh-cdi"]).unwrap();
    assert!(b.wait_shut_off("gh-cdi"));
    assert!(b.holders().is_empty());
}

/// A merged-`/usr` root (`/lib -> usr/lib`, Debian 12 and Ubuntu images) and a spec written
/// on a merged-`/usr` host (paths under `/lib/x86_64-linux-gnu`): gpuhook follows that one
/// top-level link to exactly `usr/lib` (and no other symlink), the driver works inside.
fn cdi_merged_usr(b: &mut Bed) {
    let (_drv, rootfs) = cdi_host(b, "cdi-merged");
    common::merge_usr(&rootfs);
    let spec = b.work.join(format!("cdi{}/run/nvidia.yaml", b.hosts));
    let text = std::fs::read_to_string(&spec).unwrap();
    common::write_config(&spec, &common::spec_under_lib(&text));
    b.define_start(&with_rootfs(
        "gh-cdi-usr",
        r#"driver="cdi""#,
        &rootfs,
        false,
    ));
    let ct = b.ct("gh-cdi-usr");
    let o = b.sh_in(&ct, common::CDI_PROBE);
    common::assert_cdi_merged(&String::from_utf8_lossy(&o.stdout));
    assert!(rootfs
        .join("usr/lib/x86_64-linux-gnu/libcuda.so")
        .is_symlink());
    assert!(host_mounts_under(&rootfs).is_empty());
    b.d.virsh_ok(&["destroy", "gh-cdi-usr"]).unwrap();
    assert!(b.wait_shut_off("gh-cdi-usr"));
}

/// A container with a user namespace (`<idmap>`: its root is host uid 100000) and its own
/// root owned by that uid: gpuhook acts there as that uid (file-system ids, no capability
/// over file permissions), so what it creates is the container root's, and ldconfig runs as
/// it; CUDA's libraries are found inside.
fn cdi_idmapped_rootfs(b: &mut Bed) {
    let (_drv, rootfs) = cdi_host(b, "cdi-idmap");
    let o = Command::new("chown")
        .args(["-hR", "100000:100000"])
        .arg(&rootfs)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", common::stderr(&o));
    let mut s = with_rootfs("gh-cdi-map", r#"driver="cdi""#, &rootfs, false);
    s.idmap = Some(100000);
    b.define_start(&s);
    let ct = b.ct("gh-cdi-map");
    let o = b.sh_in(&ct, common::CDI_PROBE);
    common::assert_cdi_probe(&String::from_utf8_lossy(&o.stdout));
    use std::os::unix::fs::MetadataExt;
    for p in [
        "usr/lib/x86_64-linux-gnu/libcuda.so",
        "etc/ld.so.conf.d/00-gpuhook-cdi.conf",
        "etc/ld.so.cache",
        "usr/share/nvidia",
    ] {
        if let Ok(m) = std::fs::symlink_metadata(rootfs.join(p)) {
            assert_eq!((m.uid(), m.gid()), (100000, 100000), "{p}");
        }
    }
    // A mount point file gpuhook made (seen from the host side, under the mount).
    let m = std::fs::symlink_metadata(rootfs.join("usr/bin/nvidia-smi")).unwrap();
    assert_eq!(m.uid(), 100000);
    b.d.virsh_ok(&["destroy", "gh-cdi-map"]).unwrap();
    assert!(b.wait_shut_off("gh-cdi-map"));
}

/// A hostile or broken root filesystem: `/usr/lib` a symlink, the root read-only, the root
/// full. Each refused at `started` with one line naming the cause; libvirt stops the domain,
/// nothing stays reserved, nothing of gpuhook is left in the root, nothing written outside.
fn cdi_hostile_rootfs(b: &mut Bed) {
    // Symlinked /usr/lib (to a directory of the rootfs: followed, the libraries would land
    // there).
    let (_drv, rootfs) = cdi_host(b, "cdi-evil");
    std::fs::create_dir_all(rootfs.join("elsewhere")).unwrap();
    std::fs::remove_dir_all(rootfs.join("usr/lib")).unwrap();
    std::os::unix::fs::symlink("/elsewhere", rootfs.join("usr/lib")).unwrap();
    b.define(&with_rootfs(
        "gh-cdi-evil",
        r#"driver="cdi""#,
        &rootfs,
        false,
    ));
    let e = b.start("gh-cdi-evil").unwrap_err();
    assert!(
        e.contains("container /usr/lib is a symlink; refusing to follow it"),
        "{e}"
    );
    assert!(b.wait_shut_off("gh-cdi-evil"));
    assert!(b.holders().is_empty(), "{:?}", b.holders());
    assert!(std::fs::read_dir(rootfs.join("elsewhere"))
        .unwrap()
        .next()
        .is_none());
    assert!(host_mounts_under(&rootfs).is_empty());
    // A read-only root: nothing can be made there.
    let (_drv, rootfs) = cdi_host(b, "cdi-ro");
    b.define(&with_rootfs("gh-cdi-ro", r#"driver="cdi""#, &rootfs, true));
    let e = b.start("gh-cdi-ro").unwrap_err();
    assert!(e.contains("Read-only file system"), "{e}");
    assert!(b.wait_shut_off("gh-cdi-ro"));
    assert!(b.holders().is_empty(), "{:?}", b.holders());
    // A full root (a small tmpfs): the linker cache cannot be written; what was made
    // (mount points, links) is taken away again.
    let (_drv, src) = cdi_host(b, "cdi-full-src");
    // (The tmpfs is mounted where libvirtd sees it: in its private mount namespace.)
    let full = b.work.join("cdi-full");
    std::fs::create_dir_all(&full).unwrap();
    let daemon = b.d.pid().expect("libvirtd runs");
    let o = testbed::shell_in(
        daemon,
        &format!(
            "mount -t tmpfs -o size=16m tmpfs {f} && cp -a {}/. {f}/ && (dd if=/dev/zero of={f}/fill bs=64k 2>/dev/null; true)",
            src.display(),
            f = full.display()
        ),
    )
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", common::stderr(&o));
    let before = tree(daemon, &full);
    b.define(&with_rootfs("gh-cdi-full", r#"driver="cdi""#, &full, false));
    let e = b.start("gh-cdi-full").unwrap_err();
    assert!(e.contains("No space left on device"), "{e}");
    assert!(b.wait_shut_off("gh-cdi-full"));
    assert!(b.holders().is_empty(), "{:?}", b.holders());
    assert_eq!(tree(daemon, &full), before, "rolled back");
    let _ = testbed::shell_in(daemon, &format!("umount {}", full.display())).output();
}

/// The container swaps a symlink (to its own `/elsewhere`) in and out at the place of the
/// libraries' directory while `started` runs again and again: each run either does its work
/// in the real directory or is refused with one line; nothing ever lands in `/elsewhere`,
/// nothing outside the container changes. Then a spec for another driver: the next start
/// is refused in one line naming the spec, and nothing stays reserved.
fn cdi_swap_race(b: &mut Bed) {
    let (_drv, rootfs) = cdi_host(b, "cdi-race");
    std::fs::create_dir_all(rootfs.join("elsewhere")).unwrap();
    b.define_start(&with_rootfs(
        "gh-cdi-race",
        r#"driver="cdi""#,
        &rootfs,
        false,
    ));
    let ct = b.ct("gh-cdi-race");
    let host_before = tree(
        std::process::id() as i32,
        Path::new("/usr/lib/x86_64-linux-gnu"),
    );
    let mut swapper = testbed::shell_in(
        ct.init.pid,
        "B=/usr/bin/busybox; L=/usr/lib/x86_64-linux-gnu; while :; do $B mv $L /usr/lib/real && $B ln -s /elsewhere $L && $B rm $L && $B mv /usr/lib/real $L; done 2>/dev/null",
    )
    .spawn()
    .unwrap();
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..12 {
        let o = b.hook_direct("gh-cdi-race", "started");
        let e = common::stderr(&o);
        if o.status.success() {
            ok += 1;
        } else {
            refused += 1;
            assert_eq!(e.trim().lines().count(), 1, "{e}");
            assert!(e.contains("gh-cdi-race"), "{e}");
        }
        let inside: Vec<_> = std::fs::read_dir(rootfs.join("elsewhere"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(inside.is_empty(), "followed the symlink: {inside:?}");
    }
    let _ = swapper.kill();
    let _ = swapper.wait();
    eprintln!("    swap race: {ok} started, {refused} refused");
    assert_eq!(
        tree(
            std::process::id() as i32,
            Path::new("/usr/lib/x86_64-linux-gnu")
        ),
        host_before
    );
    assert!(host_mounts_under(&rootfs).is_empty());
    b.d.virsh_ok(&["destroy", "gh-cdi-race"]).unwrap();
    assert!(b.wait_shut_off("gh-cdi-race"));
    // A spec for another driver version: refused at prepare, one line, nothing reserved.
    let spec = b.work.join(format!("cdi{}/run/nvidia.yaml", b.hosts));
    let text = std::fs::read_to_string(&spec).unwrap();
    common::write_config(&spec, &text.replace("535.129.03", "550.54.15"));
    let e = b.start("gh-cdi-race").unwrap_err();
    assert!(
        e.contains("the host runs 535.129.03: the spec is for another driver"),
        "{e}"
    );
    assert!(b.holders().is_empty(), "{:?}", b.holders());
}

/// The image leaves a block device node (a loop device over a file of zeros) at
/// `/etc/ld.so.cache~`, where glibc's `ldconfig` opens its temporary cache without
/// `O_EXCL`, and a FIFO at the auxiliary cache's temporary name. gpuhook's `ldconfig` sees
/// the root only through `nodev` mounts and writes its cache to a tmpfs of its own: the
/// device is never written, nothing blocks, the container gets a regular cache, and the
/// planted nodes are left as they were.
fn cdi_ldconfig_planted_nodes(b: &mut Bed) {
    let (_drv, rootfs) = cdi_host(b, "cdi-planted");
    let lo = common::PlantedLoop::new(&b.work);
    lo.plant(&rootfs.join("etc/ld.so.cache~"));
    b.define_start(&with_rootfs(
        "gh-cdi-node",
        r#"driver="cdi""#,
        &rootfs,
        false,
    ));
    assert!(lo.untouched(), "ldconfig wrote through the planted node");
    // Again with a FIFO at the auxiliary cache's temporary name (an open for writing would
    // block until the time limit).
    b.d.virsh_ok(&["destroy", "gh-cdi-node"]).unwrap();
    assert!(b.wait_shut_off("gh-cdi-node"));
    let aux = rootfs.join("var/cache/ldconfig/aux-cache~");
    std::fs::create_dir_all(aux.parent().unwrap()).unwrap();
    nix::unistd::mkfifo(&aux, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    b.start("gh-cdi-node").expect("start with a FIFO planted");
    assert!(lo.untouched(), "ldconfig wrote through the planted node");
    let ct = b.ct("gh-cdi-node");
    // (started again over what is there: still nothing written through the node.)
    common::assert_ok(&b.hook_direct("gh-cdi-node", "started"));
    assert!(lo.untouched());

    let o = b.sh_in(&ct, common::CDI_PROBE);
    common::assert_cdi_probe(&String::from_utf8_lossy(&o.stdout));
    let cache = std::fs::read(rootfs.join("etc/ld.so.cache")).unwrap();
    assert!(cache.starts_with(b"glibc-ld.so.cache"), "not a cache");
    use std::os::unix::fs::FileTypeExt;
    let planted = std::fs::symlink_metadata(rootfs.join("etc/ld.so.cache~")).unwrap();
    assert!(planted.file_type().is_block_device());
    assert!(std::fs::symlink_metadata(&aux)
        .unwrap()
        .file_type()
        .is_fifo());
    // The image points ldconfig's auxiliary cache directory elsewhere (through the
    // container's /proc, into the real root where the node is not nodev): refused in one
    // line, nothing written there.
    let evil = rootfs.join("evil");
    std::fs::create_dir_all(&evil).unwrap();
    lo.plant(&evil.join("aux-cache~"));
    std::fs::remove_file(&aux).unwrap();
    std::fs::remove_dir(aux.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink("/proc/1/root/evil", aux.parent().unwrap()).unwrap();
    let o = b.hook_direct("gh-cdi-node", "started");
    let e = common::stderr(&o);
    assert!(!o.status.success(), "{e}");
    assert!(
        e.contains("container /var/cache/ldconfig is not a directory; refusing to run ldconfig"),
        "{e}"
    );
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(lo.untouched());
    b.d.virsh_ok(&["destroy", "gh-cdi-node"]).unwrap();
    assert!(b.wait_shut_off("gh-cdi-node"));
    assert!(lo.untouched());
}

/// Every path under `dir` as process `pid` sees it (for "nothing changed").
fn tree(pid: i32, dir: &Path) -> Vec<String> {
    let o = testbed::shell_in(pid, &format!("find {}", dir.display()))
        .output()
        .unwrap();
    // (libvirt's own pivot directory aside.)
    let mut v: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.ends_with("/.oldroot"))
        .map(str::to_owned)
        .collect();
    v.sort();
    v
}

/// Hole 3 under a real libvirtd: a process in the container passes its descriptor of the
/// GPU's node over a unix socket to a process on the host (outside the container's PID
/// namespace), which keeps it after `virsh destroy`. The GPU is draining: listed with that
/// PID, a second domain asking for it is refused naming the PID and its command; once the
/// holder exits the second domain starts with it. The container really opens the node: the
/// fake GPU has the numbers of `/dev/full` ([`common::openable`]; a driverless node cannot
/// be opened, and an `O_PATH` descriptor holds no GPU).
fn fd_passed_out_drains(b: &mut Bed) {
    let p = b.use_host(common::blueprint_minors(231, 232));
    common::openable(&p.dev.join("nvidia231"));
    let keeper = common::fdkeeper(&b.work);
    let (sock, mark) = (b.work.join("drain.sock"), b.work.join("drain.got"));
    let mut recv = common::fd_receiver(&keeper, &sock, &mark);
    let mut s = DomainSpec::new(
        "gh-drain1",
        &format!(r#"<gpu:gpus {META_NS}><gpu:device index="0"/></gpu:gpus>"#),
    );
    s.init = format!(
        "while [ ! -c /dev/nvidia231 ]; do sleep 0.1; done; {} send {} /dev/nvidia231; while :; do sleep 1; done",
        keeper.display(),
        sock.display()
    );
    b.define_start(&s);
    assert_eq!(b.holders()["gh-drain1"], ["0000:07:00.0"]);
    assert!(common::wait_mark(&mark), "the descriptor never came out");
    let pid = recv.id();
    b.d.virsh_ok(&["destroy", "gh-drain1"]).unwrap();
    assert!(b.holders().is_empty(), "destroy frees");
    let l = b.list();
    assert_eq!(
        common::gpu_of(&l, "0000:07:00.0")["draining"],
        json!([pid]),
        "{l}"
    );
    let text = String::from_utf8_lossy(&b.gh(&["list"]).stdout).into_owned();
    assert!(
        text.contains(&format!("draining: pid {pid} (fdkeeper)")),
        "{text}"
    );
    b.define(&DomainSpec::new(
        "gh-drain2",
        &format!(r#"<gpu:gpus {META_NS}><gpu:device index="0"/></gpu:gpus>"#),
    ));
    let e = b.start("gh-drain2").expect_err("gh-drain2 must not start");
    assert!(
        e.contains(&format!("gpuhook: domain 'gh-drain2': GPU 0000:07:00.0 (index 0) is held by pid {pid} (fdkeeper), which still has 0000:07:00.0 open after domain 'gh-drain1' (draining)")),
        "{e}"
    );
    assert_eq!(b.state_of("gh-drain2"), "shut off");
    recv.kill();
    b.start("gh-drain2")
        .expect("gh-drain2 starts once the holder is gone");
    assert_eq!(b.holders()["gh-drain2"], ["0000:07:00.0"]);
    let ct = b.ct("gh-drain2");
    // Its node (1:7, see above) opens there.
    assert_eq!(b.open_in(&ct, &["/dev/nvidia231"]), vec![Ok(())]);
    assert_eq!(
        common::gpu_of(&b.list(), "0000:07:00.0")["draining"],
        json!([])
    );
}

const CASES: &[(&str, Case)] = &[
    ("cdi_own_rootfs", cdi_own_rootfs),
    ("cdi_hostile_rootfs", cdi_hostile_rootfs),
    ("cdi_idmapped_rootfs", cdi_idmapped_rootfs),
    ("cdi_swap_race", cdi_swap_race),
    ("cdi_ldconfig_planted_nodes", cdi_ldconfig_planted_nodes),
    ("cdi_merged_usr", cdi_merged_usr),
    (
        "host_driver_own_rootfs_across_an_upgrade",
        driver::host_driver_own_rootfs_across_an_upgrade,
    ),
    (
        "host_driver_refusals_and_hostile_rootfs",
        driver::host_driver_refusals_and_hostile_rootfs,
    ),
    (
        "attach_host_driver_in_a_domain_with_its_own_root",
        driver::attach_host_driver_in_a_domain_with_its_own_root,
    ),
    (
        "host_driver_service_account_socket",
        driver::host_driver_service_account_socket,
    ),
    ("blueprint_flavor", blueprint_flavor),
    ("more_than_free_fails", more_than_free_fails),
    ("renamed_init_keeps_its_gpus", renamed_init_keeps_its_gpus),
    ("plain_domain_untouched", plain_domain_untouched),
    ("nova_flavor_through_libvirt", nova_flavor_through_libvirt),
    ("mig_slices_of_one_gpu", mig_slices_of_one_gpu),
    ("mig_gpu_instance_one_holder", mig_gpu_instance_one_holder),
    ("libvirt_and_podman_contend", libvirt_and_podman_contend),
    ("reconnect_keeps_and_repairs", reconnect_keeps_and_repairs),
    ("numa_placement_and_isolation", numa_placement_and_isolation),
    ("three_vendors", three_vendors),
    ("idmap_owners", idmap_owners),
    ("destroy_and_start_again", destroy_and_start_again),
    ("fd_passed_out_drains", fd_passed_out_drains),
    ("hostile_direct", hostile_direct),
    ("hostile_reconnect_kills", hostile_reconnect_kills),
    ("hostile_init_races_started", hostile_init_races_started),
    ("hostile_swap_race", hostile_swap_race),
    ("hostile_dev_overmount", hostile_dev_overmount),
    (
        "reconnect_adopts_only_granted",
        reconnect_adopts_only_granted,
    ),
    ("release_of_a_running_domain", release_of_a_running_domain),
    ("stop_frees_after_live_clear", stop_frees_after_live_clear),
    ("grants_reach_sub_cgroups", grants_reach_sub_cgroups),
    ("full_container_dev", full_container_dev),
    ("init_exits_during_started", init_exits_during_started),
    ("killed_behind_libvirts_back", killed_behind_libvirts_back),
    ("request_through_libvirt", request_through_libvirt),
    (
        "attach_and_detach_in_a_running_domain",
        hotplug::attach_and_detach_in_a_running_domain,
    ),
    (
        "attach_to_a_domain_without_a_request",
        hotplug::attach_to_a_domain_without_a_request,
    ),
    ("attach_refusals", hotplug::attach_refusals),
    (
        "attach_cdi_in_a_domain_with_its_own_root",
        hotplug::attach_cdi_in_a_domain_with_its_own_root,
    ),
    (
        "attaches_race_for_the_last_gpu",
        hotplug::attaches_race_for_the_last_gpu,
    ),
    ("detach_of_an_open_gpu", hotplug::detach_of_an_open_gpu),
    (
        "attach_killed_at_each_step",
        hotplug::attach_killed_at_each_step,
    ),
    (
        "detach_killed_at_each_step",
        hotplug::detach_killed_at_each_step,
    ),
    ("mig_attach_and_detach", hotplug::mig_attach_and_detach),
    (
        "a_name_both_domain_and_container",
        hotplug::a_name_both_domain_and_container,
    ),
    (
        "reconcile_frees_only_the_gone",
        reconcile_frees_only_the_gone,
    ),
    (
        "share_two_domains_one_gpu",
        sharing::share_two_domains_one_gpu,
    ),
    ("share_refusals", sharing::share_refusals),
    (
        "share_libvirt_and_podman",
        sharing::share_libvirt_and_podman,
    ),
    ("share_sharer_killed", sharing::share_sharer_killed),
    (
        "mps_two_domains_one_daemon",
        mps::mps_two_domains_one_daemon,
    ),
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
    let installed = std::env::var("GPUHOOK_TEST_HOOK").as_deref() == Ok("installed");
    let work = PathBuf::from(format!(
        // Not /var/tmp: CDI spec directories under it would be refused (others may write it).
        "/var/lib/gpuhook-libvirt-test-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let hook = if installed {
        Hook::Installed
    } else {
        Hook::Binary(common::bin())
    };
    let mut d = match Daemon::new(&work.join("libvirt"), hook) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("FATAL: cannot set up libvirtd: {e}");
            std::process::exit(1);
        }
    };
    d.write_config(&serde_json::json!({})).unwrap();
    if let Err(e) = d.start() {
        eprintln!("FATAL: libvirtd did not start, so nothing here can be tested: {e}");
        std::process::exit(1);
    }
    println!(
        "libvirtd up ({}), hook: {}",
        d.uri,
        if installed {
            "installed /etc/libvirt/hooks/lxc".into()
        } else {
            common::bin().display().to_string()
        }
    );
    let mut bed = Bed {
        d,
        work: work.clone(),
        hosts: 0,
    };
    let mut failed = Vec::new();
    let mut ran = 0;
    for (name, case) in CASES {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        ran += 1;
        let t0 = std::time::Instant::now();
        let mut r = std::panic::catch_unwind(AssertUnwindSafe(|| case(&mut bed)));
        // The test bed broken behind its back (its bind mounts detached): this case proved
        // nothing; the daemon starts again with its mounts for the next.
        if let Err(b) = bed.d.recover() {
            println!("test {name}: {b}; libvirtd restarted");
            r = Err(Box::new(b));
        }
        bed.d.cleanup("gh-");
        let _ = std::fs::remove_file(bed.state());
        match r {
            Ok(()) => println!("test {name} ... ok ({:.1}s)", t0.elapsed().as_secs_f64()),
            Err(_) => {
                println!("test {name} ... FAILED");
                failed.push(*name);
            }
        }
    }
    let _ = bed.d.stop();
    println!(
        "\nlibvirt: {} passed; {} failed: {failed:?}",
        ran - failed.len(),
        failed.len()
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
