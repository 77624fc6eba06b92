//! Health follows the pool: other doors' holders, quarantine, a race for the last GPU, a
//! corrupt state file.

use super::super::bed::{Files, KubeletBed};
use super::super::pods::{Container, Pod};
use super::*;
use crate::libvirtd::{Daemon, DomainSpec, Hook};
use crate::FakeHost;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// A domain's XML as libvirtd hands it to its hook, asking for `count` GPUs.
pub fn domain_xml(name: &str, n: u32, count: u32) -> String {
    format!(
        "<domain type='lxc'>\n  <name>{name}</name>\n  <uuid>{n:08x}-0000-4000-8000-{n:012x}</uuid>\n  <metadata>\n    <gpu:gpus xmlns:gpu=\"urn:gpuhook:gpu:1\" count='{count}'/>\n  </metadata>\n  <memory unit='KiB'>65536</memory>\n  <vcpu placement='static'>1</vcpu>\n  <os>\n    <type arch='x86_64'>exe</type>\n    <init>/bin/sh</init>\n  </os>\n  <devices>\n    <filesystem type='mount'>\n      <source dir='/'/>\n      <target dir='/'/>\n    </filesystem>\n  </devices>\n</domain>\n"
    )
}

/// libvirt's LXC hook run as libvirtd runs it (`gpuhook hook NAME OP SUBOP -`, the domain
/// XML on its standard input), with the bed's config.
pub fn hook(b: &KubeletBed, name: &str, op: &str, xml: &str) -> Output {
    use std::io::Write;
    let sub = if matches!(op, "stopped" | "release") {
        "end"
    } else {
        "begin"
    };
    let mut c = Command::new(&b.files.cri.gpuhook)
        .args(["hook", name, op, sub, "-"])
        .env("GPUHOOK_CONFIG", &b.cri.config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the hook");
    let mut stdin = c.stdin.take().expect("stdin");
    let _ = stdin.write_all(xml.as_bytes());
    drop(stdin);
    c.wait_with_output().expect("the hook")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A private libvirtd whose LXC hook is the gpuhook under test on the bed's config.
fn libvirtd(b: &KubeletBed) -> Daemon {
    let mut d = Daemon::new(
        &b.dir().join("libvirt"),
        Hook::Binary(b.files.cri.gpuhook.clone()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&b.cri.config).expect("config")).expect("json");
    d.write_config(&cfg).unwrap_or_else(|e| panic!("{e}"));
    d.start().unwrap_or_else(|e| panic!("{e}"));
    d
}

/// podman through gpuhook-runtime on the bed's config (runc under it), a busybox root.
struct Podman {
    runtime: PathBuf,
    rootfs: PathBuf,
}

fn busybox() -> PathBuf {
    ["/usr/bin/busybox", "/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .expect("busybox-static")
}

impl Podman {
    fn new(b: &KubeletBed) -> Podman {
        use std::os::unix::fs::PermissionsExt;
        let dir = b.dir().join("podman");
        let r = dir.join("rootfs");
        for d in ["bin", "dev", "proc", "sys", "tmp", "etc", "run"] {
            std::fs::create_dir_all(r.join(d)).expect("rootfs");
        }
        std::fs::copy(busybox(), r.join("bin/busybox")).expect("busybox");
        for a in ["sh", "sleep", "cat", "true"] {
            let _ = std::os::unix::fs::symlink("busybox", r.join("bin").join(a));
        }
        std::fs::write(r.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n").expect("passwd");
        let link = dir.join("gpuhook-runtime");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&b.files.cri.gpuhook, &link).expect("link");
        let runtime = dir.join("runtime.sh");
        std::fs::write(
            &runtime,
            format!(
                "#!/bin/sh\nGPUHOOK_CONFIG={} exec {} \"$@\"\n",
                b.cri.config.display(),
                link.display()
            ),
        )
        .expect("runtime.sh");
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        Podman { runtime, rootfs: r }
    }

    /// `podman run -d` asking for one GPU; the container's ID.
    fn run(&self, name: &str) -> String {
        self.rm(name);
        let o = Command::new("podman")
            .arg("--runtime")
            .arg(&self.runtime)
            .args([
                "run",
                "-d",
                "--name",
                name,
                "--network",
                "none",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
                "--annotation",
                "gpuhook.io/gpus=1",
                "--rootfs",
            ])
            .arg(&self.rootfs)
            .args(["sh", "-c", "sleep 3600"])
            .output()
            .expect("podman");
        assert!(o.status.success(), "podman run {name}: {}", text(&o.stderr));
        text(&o.stdout).trim().to_string()
    }

    fn rm(&self, name: &str) {
        let _ = Command::new("podman")
            .args(["rm", "-f", "-t", "0", name])
            .output();
    }
}

/// The PCI address `holder` (an LXC domain's name or a container's ID) holds, per `list`.
fn gpu_of(b: &KubeletBed, holder: &str) -> String {
    let l = b.list();
    l["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|g| g["holder"]["domain"] == holder)
        .and_then(|g| g["pci"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("{holder} holds no GPU: {l}"))
}

/// The other of the blueprint's two GPUs.
fn other(g: &str) -> &'static str {
    if g == GPU0 {
        GPU1
    } else {
        GPU0
    }
}

/// A GPU a libvirt domain takes (a real libvirtd starting an LXC container whose hook is
/// gpuhook) reaches kubelet `Unhealthy` within 1 s of the reservation while the other stays
/// `Healthy`; `Healthy` again within 1 s of its release at `virsh destroy`. The same for a
/// podman container through gpuhook-runtime, created and removed.
pub fn health_follows_a_libvirt_domain_and_a_podman_container(files: &Files) {
    let b = bed(files, "health", FakeHost::blueprint(), |_, _| {});
    let d = libvirtd(&b);
    let spec = DomainSpec::new(
        "kb-dom",
        r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1" count="1"/>"#,
    );
    d.define(&spec.xml()).unwrap_or_else(|e| panic!("{e}"));
    let since = SystemTime::now();
    d.virsh_ok(&["start", "kb-dom"])
        .unwrap_or_else(|e| panic!("{e}"));
    let g = gpu_of(&b, "kb-dom");
    let late = b.assert_health_within(GPU, &g, UNHEALTHY, since, state_changed(&b), "virsh start");
    eprintln!("libvirt domain took {g}: Unhealthy after {late:?}");
    assert_eq!(b.health(GPU)[other(&g)], HEALTHY);
    let since = SystemTime::now();
    d.virsh_ok(&["destroy", "kb-dom"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(b.holder(&g).is_null(), "{}", b.holder(&g));
    let late = b.assert_health_within(GPU, &g, HEALTHY, since, state_changed(&b), "virsh destroy");
    eprintln!("libvirt domain freed {g}: Healthy after {late:?}");
    d.cleanup("kb-");
    drop(d);

    let p = Podman::new(&b);
    let since = SystemTime::now();
    let id = p.run("kb-podman");
    let g = gpu_of(&b, &id);
    let late = b.assert_health_within(GPU, &g, UNHEALTHY, since, state_changed(&b), "podman run");
    eprintln!("podman container took {g}: Unhealthy after {late:?}");
    assert_eq!(b.health(GPU)[other(&g)], HEALTHY);
    let since = SystemTime::now();
    p.rm("kb-podman");
    assert!(b.holder(&g).is_null(), "{}", b.holder(&g));
    let late = b.assert_health_within(GPU, &g, HEALTHY, since, state_changed(&b), "podman rm");
    eprintln!("podman container freed {g}: Healthy after {late:?}");
}

/// An Xid 79 in the kernel log (the GPU's config space reads all ones: fallen off the bus),
/// read by `gpuhook health scan`: the GPU is quarantined and reaches kubelet `Unhealthy`
/// within 1 s; kubelet then has one GPU to give. Its config space back and `gpuhook health
/// clear`: `Healthy` within 1 s, two GPUs to give again.
pub fn quarantine_and_recovery(files: &Files) {
    let b = bed(files, "quarantine", FakeHost::blueprint(), |_, _| {});
    let host = b.host();
    std::fs::write(
        host.dev.join("kmsg"),
        crate::health::xid_record(1, GPU1, 79, crate::health::xid_text(79)),
    )
    .expect("kmsg");
    let config = crate::health::config_all_ones(&host, GPU1);
    let since = SystemTime::now();
    let o = b.cri.gh(&["health", "scan"]);
    assert!(o.status.success(), "health scan: {}", text(&o.stderr));
    assert!(
        b.list()["gpus"][1]["quarantine"].is_object(),
        "not quarantined: {}",
        b.list()["gpus"][1]
    );
    b.assert_health_within(
        GPU,
        GPU1,
        UNHEALTHY,
        since,
        state_changed(&b),
        "health scan",
    );
    assert_eq!(b.health(GPU)[GPU0], HEALTHY);
    let two = Pod::new("two").container(Container::new("app", SLEEP).limit(GPU, 2));
    let e = b
        .kubelet
        .admit(&two)
        .expect_err("two GPUs while one is quarantined");
    assert!(e.0.ends_with("Requested: 2, Available: 1"), "{e}");
    crate::health::config_back(&host, GPU1, &config);
    let since = SystemTime::now();
    let o = b.cri.gh(&["health", "clear", GPU1]);
    assert!(o.status.success(), "health clear: {}", text(&o.stderr));
    b.assert_health_within(GPU, GPU1, HEALTHY, since, state_changed(&b), "health clear");
    b.kubelet.admit(&two).unwrap_or_else(|e| panic!("{e}"));
}

/// Races for the last GPU, `rounds` times: kubelet admitting a pod (the plugin's
/// `Allocate`) against libvirt's `prepare` of a domain asking for one GPU, started
/// together. Each round exactly one wins and holds the GPU; the other is refused in one
/// line (kubelet's rejection carries the plugin's line naming the domain, or kubelet refused
/// on the plugin's `Unhealthy`; the hook's line names the pod's holder), never both.
pub fn allocate_races_a_libvirt_prepare_for_the_last_gpu(files: &Files) {
    let rounds: u32 = std::env::var("GPUHOOK_KUBELET_RACES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let b = bed(files, "race", FakeHost::blueprint(), |_, _| {});
    // GPU0 goes to a domain for good: GPU1 is the last.
    let keep = domain_xml("kb-keep", 1, 1);
    let o = hook(&b, "kb-keep", "prepare", &keep);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let kept = gpu_of(&b, "kb-keep");
    let last = other(&kept);
    let waited = b.first_listed(
        GPU,
        &kept,
        UNHEALTHY,
        SystemTime::UNIX_EPOCH,
        Duration::from_secs(5),
    );
    assert!(waited.is_some(), "{kept} never Unhealthy");
    let (mut pods_won, mut domains_won, mut plugin_refused) = (0, 0, 0);
    for i in 0..rounds {
        assert!(
            b.wait_free(last, Duration::from_secs(10)).is_some(),
            "round {i}: {last} not free: {}",
            b.holder(last)
        );
        assert!(
            b.first_listed(
                GPU,
                last,
                HEALTHY,
                SystemTime::now() - WITHIN * 2,
                Duration::from_secs(5)
            )
            .is_some()
                || b.health(GPU)[last] == HEALTHY,
            "round {i}: {last} not Healthy"
        );
        let name = format!("kb-race-{i}");
        let pod =
            Pod::new(&format!("race-{i}")).container(Container::new("app", SLEEP).limit(GPU, 1));
        let xml = domain_xml(&name, 100 + i, 1);
        let start = std::sync::Barrier::new(2);
        let (admitted, prepared) = std::thread::scope(|s| {
            let a = s.spawn(|| {
                start.wait();
                b.kubelet.admit(&pod)
            });
            let p = s.spawn(|| {
                start.wait();
                hook(&b, &name, "prepare", &xml)
            });
            (a.join().expect("admit"), p.join().expect("prepare"))
        });
        let holder = b.holder(last);
        match (&admitted, prepared.status.success()) {
            (Ok(()), false) => {
                pods_won += 1;
                let e = text(&prepared.stderr);
                assert_one_line("the hook", &e);
                assert!(e.contains(&name), "round {i}: {e}");
                assert_eq!(who(&holder).0, "pod", "round {i}: {holder}");
                b.kubelet.delete(&pod);
            }
            (Err(r), true) => {
                domains_won += 1;
                assert_one_line("kubelet's rejection", &r.0);
                if r.0.starts_with("rpc error") {
                    plugin_refused += 1;
                    assert!(r.0.contains(&format!("domain '{name}'")), "round {i}: {r}");
                } else {
                    assert!(
                        r.0.starts_with("requested number of devices unavailable"),
                        "round {i}: {r}"
                    );
                }
                assert_eq!(
                    who(&holder),
                    ("libvirt".to_string(), name.clone()),
                    "round {i}"
                );
                let o = hook(&b, &name, "release", &xml);
                assert!(o.status.success(), "release: {}", text(&o.stderr));
            }
            (Ok(()), true) => panic!("round {i}: both won {last}: {holder}"),
            (Err(r), false) => panic!(
                "round {i}: neither won {last} (kubelet: {r}; hook: {})",
                text(&prepared.stderr)
            ),
        }
    }
    eprintln!(
        "{rounds} rounds: the pod won {pods_won}, the domain {domains_won} ({plugin_refused} of them refused by the plugin's Allocate)"
    );
}

/// The state file made unreadable: within 1 s every device reaches kubelet `Unhealthy`, the
/// plugin says why in one line naming the file, kubelet admits no GPU pod; the file gone (an
/// empty pool): `Healthy` again.
pub fn a_corrupt_state_file_makes_no_device_healthy(files: &Files) {
    let b = bed(files, "corrupt", FakeHost::blueprint(), |_, _| {});
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&b.cri.config).expect("config")).expect("json");
    let state = PathBuf::from(cfg["state_file"].as_str().expect("state_file"));
    let before = b.plugin_log_text().len();
    let since = SystemTime::now();
    std::fs::create_dir_all(state.parent().expect("dir")).expect("state dir");
    std::fs::write(&state, "{\"reservations\": {\"x\": ").expect("state");
    let changed = state_changed(&b);
    for g in [GPU0, GPU1] {
        b.assert_health_within(GPU, g, UNHEALTHY, since, changed, "corrupt state");
    }
    let t = Instant::now();
    let said = loop {
        let log = b.plugin_log_text();
        let new = log.get(before..).unwrap_or("").to_string();
        if new.contains(&state.display().to_string()) || t.elapsed() > Duration::from_secs(2) {
            break new;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let lines: Vec<&str> = said
        .lines()
        .filter(|l| l.contains(&state.display().to_string()))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "the plugin must say why in one line naming {}: {said}",
        state.display()
    );
    let one = Pod::new("one").container(Container::new("app", SLEEP).limit(GPU, 1));
    let e = b
        .kubelet
        .admit(&one)
        .expect_err("admitted on a corrupt state");
    assert!(e.0.starts_with("no healthy devices present"), "{e}");
    let since = SystemTime::now();
    std::fs::remove_file(&state).expect("rm state");
    let changed = SystemTime::now();
    for g in [GPU0, GPU1] {
        b.assert_health_within(GPU, g, HEALTHY, since, changed, "state removed");
    }
    assert!(Path::new(&state).parent().is_some());
}
