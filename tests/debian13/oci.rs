//! podman 5 through the installed gpuhook-runtime, with crun and runc, under systemd's cgroup
//! manager (podman's default here) and cgroupfs; hotplug; user-namespaced containers; MPS.

use super::{cfg_runtime, err, last_line, manifest, text, Vm};
use serde_json::{json, Value};
use std::path::Path;
use testbed::FakeHost;

const CRUN: &str = "/usr/bin/crun";
const RUNC: &str = "/usr/sbin/runc";
const IMAGE: &str = "localhost/gh-busybox";

/// A busybox image, imported once from a root made of the static busybox.
pub fn image(vm: &mut Vm) {
    if vm
        .sh(&format!("podman image exists {IMAGE}"))
        .status
        .success()
    {
        return;
    }
    let r = "/var/tmp/gh-busybox";
    vm.ok(&format!(
        "rm -rf {r} && mkdir -p {r}/bin {r}/dev {r}/proc {r}/sys {r}/tmp {r}/etc {r}/run && \
         cp /bin/busybox {r}/bin/busybox && \
         for a in sh cat ls mknod stat echo sleep grep test id true rm mkdir tr; do ln -s busybox {r}/bin/$a; done && \
         echo 'root:x:0:0:root:/:/bin/sh' > {r}/etc/passwd && \
         tar -C {r} -c . | podman import - {IMAGE}"
    ));
}

/// `podman run -d` through gpuhook-runtime; the container's ID.
fn run(vm: &mut Vm, name: &str, manager: Option<&str>, extra: &[&str]) -> String {
    let _ = vm.sh(&format!("podman rm -f -t 0 {name} >/dev/null 2>&1"));
    let mut args: Vec<String> = Vec::new();
    if let Some(m) = manager {
        args.push(format!("--cgroup-manager={m}"));
    }
    args.extend(
        [
            "--runtime",
            "/usr/bin/gpuhook-runtime",
            "run",
            "-d",
            "--name",
            name,
            "--network",
            "none",
            "--cap-add",
            "mknod",
        ]
        .map(String::from),
    );
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend([IMAGE, "sleep", "3600"].map(String::from));
    vm.on_exit(&format!("podman rm -f -t 0 {name}"));
    let o = vm.cmd(std::process::Command::new("podman").args(&args));
    assert!(o.status.success(), "podman run {name}: {}", last_line(&o));
    text(&o).trim().to_string()
}

fn init_pid(vm: &mut Vm, id: &str) -> i32 {
    vm.ok(&format!("podman inspect -f '{{{{.State.Pid}}}}' {id}"))
        .trim()
        .parse()
        .expect("pid")
}

/// What opening `path` in the container says: `open` (ENXIO: allowed, no driver behind the
/// fake number), `denied` (EPERM), `missing` (no such node).
fn open_in(vm: &mut Vm, id: &str, path: &str) -> &'static str {
    let o = vm.sh(&format!("podman exec {id} cat {path}"));
    let e = err(&o);
    if e.contains("No such device or address") {
        "open"
    } else if e.contains("Operation not permitted") {
        "denied"
    } else if e.contains("No such file") {
        "missing"
    } else {
        panic!("cat {path} in {id}: {e}")
    }
}

fn rm(vm: &mut Vm, id: &str) {
    vm.ok(&format!("podman rm -f -t 0 {id}"));
}

fn reload(vm: &mut Vm) {
    vm.ok("systemctl daemon-reload");
    // systemd re-applies the units' cgroup settings, device programs included.
    std::thread::sleep(std::time::Duration::from_millis(500));
}

/// A container asking for one GPU at create: it opens, the other GPU's number is denied, both
/// still so after `systemctl daemon-reload`; removal frees.
fn gpu_at_create(vm: &mut Vm, runtime: &str, manager: Option<&str>) {
    let p = vm.host(FakeHost::blueprint(), cfg_runtime(runtime));
    let (n0, n1) = (p.dev.join("nvidia0"), p.dev.join("nvidia1"));
    image(vm);
    let id = run(vm, "gh-c1", manager, &["--annotation", "gpuhook.io/gpus=1"]);
    let pid = init_pid(vm, &id);
    assert_eq!(open_in(vm, &id, "/dev/nvidia0"), "open");
    assert_eq!(vm.access(pid, &[&n0, &n1]), ["open", "denied"]);
    assert_eq!(vm.holders()[&id], ["0000:07:00.0"]);
    reload(vm);
    assert_eq!(
        open_in(vm, &id, "/dev/nvidia0"),
        "open",
        "lost at daemon-reload"
    );
    assert_eq!(vm.access(pid, &[&n0, &n1]), ["open", "denied"]);
    // A second container asking for both is refused in one line, nothing reserved.
    let o = vm.sh(&format!(
        "podman --runtime /usr/bin/gpuhook-runtime run --rm --network none --annotation gpuhook.io/gpus=2 {IMAGE} true"
    ));
    assert!(!o.status.success(), "two GPUs given while one is held");
    assert!(err(&o).contains("gpuhook: container '"), "{}", err(&o));
    rm(vm, &id);
    assert!(vm.holders().is_empty(), "removal did not free");
}

pub fn podman_crun(vm: &mut Vm) {
    gpu_at_create(vm, CRUN, None);
}

pub fn podman_runc(vm: &mut Vm) {
    gpu_at_create(vm, RUNC, None);
}

pub fn podman_crun_cgroupfs(vm: &mut Vm) {
    gpu_at_create(vm, CRUN, Some("cgroupfs"));
}

/// `gpuhook attach` into a container that asked for no GPU: it opens through every device
/// program up the tree (systemd's on the scope included), stays open after
/// `systemctl daemon-reload`; `detach` takes it away, and a reload does not give it back;
/// attach works again after the reloads; removal frees.
fn hotplug(vm: &mut Vm, runtime: &str, manager: Option<&str>) {
    let p = vm.host(FakeHost::blueprint(), cfg_runtime(runtime));
    let n0 = p.dev.join("nvidia0");
    image(vm);
    let id = run(vm, "gh-h1", manager, &[]);
    let pid = init_pid(vm, &id);
    assert_eq!(vm.access(pid, &[&n0]), ["denied"]);
    let o = vm.gh(&["attach", &id, "--device", "0000:07:00.0"]);
    assert!(o.status.success(), "attach: {}", last_line(&o));
    assert_eq!(
        open_in(vm, &id, "/dev/nvidia0"),
        "open",
        "attached but not openable"
    );
    assert_eq!(vm.access(pid, &[&n0]), ["open"]);
    reload(vm);
    assert_eq!(
        open_in(vm, &id, "/dev/nvidia0"),
        "open",
        "attach lost at daemon-reload"
    );
    let o = vm.gh(&["detach", &id, "--device", "0000:07:00.0"]);
    assert!(
        o.status.success(),
        "detach after a reload: {}",
        last_line(&o)
    );
    assert_eq!(vm.access(pid, &[&n0]), ["denied"]);
    assert_eq!(open_in(vm, &id, "/dev/nvidia0"), "missing");
    reload(vm);
    assert_eq!(
        vm.access(pid, &[&n0]),
        ["denied"],
        "detach undone by daemon-reload"
    );
    let o = vm.gh(&["attach", &id, "--device", "0000:07:00.0"]);
    assert!(
        o.status.success(),
        "attach after reloads: {}",
        last_line(&o)
    );
    assert_eq!(open_in(vm, &id, "/dev/nvidia0"), "open");
    assert_eq!(vm.holders()[&id], ["0000:07:00.0"]);
    rm(vm, &id);
    assert!(
        vm.holders().is_empty(),
        "removal did not free the attached GPU"
    );
}

pub fn hotplug_crun(vm: &mut Vm) {
    hotplug(vm, CRUN, None);
}

pub fn hotplug_runc(vm: &mut Vm) {
    hotplug(vm, RUNC, None);
}

pub fn hotplug_crun_cgroupfs(vm: &mut Vm) {
    hotplug(vm, CRUN, Some("cgroupfs"));
}

/// User-namespaced containers (`--userns=auto`): a GPU at create opens; `attach` into one
/// that asked for none gives it the node (a bind mount of the host's) and the grant, `detach`
/// takes both away; removal frees.
fn userns(vm: &mut Vm, runtime: &str) {
    let p = vm.host(FakeHost::blueprint(), cfg_runtime(runtime));
    let (n0, n1) = (p.dev.join("nvidia0"), p.dev.join("nvidia1"));
    image(vm);
    let a = run(
        vm,
        "gh-u1",
        None,
        &["--userns=auto", "--annotation", "gpuhook.io/gpus=1"],
    );
    let pa = init_pid(vm, &a);
    let map = vm.ok(&format!("cat /proc/{pa}/uid_map"));
    assert!(
        !map.trim().starts_with("0 0 4294967295"),
        "no user namespace: {map}"
    );
    assert_eq!(open_in(vm, &a, "/dev/nvidia0"), "open");
    assert_eq!(vm.access(pa, &[&n0, &n1]), ["open", "denied"]);

    let b = run(vm, "gh-u2", None, &["--userns=auto"]);
    let pb = init_pid(vm, &b);
    let o = vm.gh(&["attach", &b, "--device", "0000:08:00.0"]);
    assert!(
        o.status.success(),
        "attach into a user-namespaced container: {}",
        last_line(&o)
    );
    assert_eq!(open_in(vm, &b, "/dev/nvidia1"), "open");
    assert_eq!(vm.access(pb, &[&n0, &n1]), ["denied", "open"]);
    reload(vm);
    assert_eq!(
        open_in(vm, &b, "/dev/nvidia1"),
        "open",
        "lost at daemon-reload"
    );
    let o = vm.gh(&["detach", &b, "--device", "0000:08:00.0"]);
    assert!(o.status.success(), "detach: {}", last_line(&o));
    assert_eq!(open_in(vm, &b, "/dev/nvidia1"), "missing");
    assert_eq!(vm.access(pb, &[&n0, &n1]), ["denied", "denied"]);
    let h = vm.holders();
    assert_eq!(h[&a], ["0000:07:00.0"]);
    assert!(!h.contains_key(&b), "{h:?}");
    rm(vm, &a);
    rm(vm, &b);
    assert!(vm.holders().is_empty());
}

pub fn userns_crun(vm: &mut Vm) {
    userns(vm, CRUN);
}

pub fn userns_runc(vm: &mut Vm) {
    userns(vm, RUNC);
}

/// Two containers share an `mps` GPU's slots: one daemon (the stand-in), its pipe at
/// `/tmp/nvidia-mps` in both, one `/dev/shm` between them; a third is refused naming both;
/// the daemon is told to quit when the last one goes.
pub fn mps_sharing(vm: &mut Vm) {
    let standin = manifest("testbed/scripts/mps-control-standin");
    vm.host(FakeHost::blueprint(), |c: &mut Value| {
        c["oci_runtime"] = json!(CRUN);
        c["mps_control"] = json!(standin);
        c["sharing"] = json!({"0000:07:00.0": {"replicas": 2, "mode": "mps"}});
    });
    image(vm);
    let share = [
        "--annotation",
        "gpuhook.io/gpus=1",
        "--annotation",
        "gpuhook.io/share=yes",
    ];
    let a = run(vm, "gh-m1", None, &share);
    let b = run(vm, "gh-m2", None, &share);
    for id in [&a, &b] {
        vm.ok(&format!("podman exec {id} test -p /tmp/nvidia-mps/control"));
        // The init's environment: gpuhook-runtime sets it in config.json (podman exec builds
        // its own from podman's record).
        let env = vm.ok(&format!(
            "podman exec {id} sh -c \"tr '\\\\0' '\\\\n' < /proc/1/environ\""
        ));
        assert!(
            env.lines()
                .any(|l| l == "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"),
            "{env}"
        );
        assert_eq!(open_in(vm, id, "/dev/nvidia0"), "open");
    }
    vm.ok(&format!(
        "podman exec {a} sh -c 'echo hello > /dev/shm/gh-mark'"
    ));
    assert_eq!(
        vm.ok(&format!("podman exec {b} cat /dev/shm/gh-mark"))
            .trim(),
        "hello"
    );
    let o = vm.sh(&format!(
        "podman --runtime /usr/bin/gpuhook-runtime run --rm --network none {} {IMAGE} true",
        share.join(" ")
    ));
    assert!(!o.status.success(), "a third sharer got a slot");
    let e = err(&o);
    assert!(
        e.contains(&a) && e.contains(&b),
        "the refusal does not name the sharers: {e}"
    );
    let l = vm.list();
    let uuid = l["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .find(|g| g["pci"] == "0000:07:00.0")
        .and_then(|g| g["uuid"].as_str())
        .expect("uuid")
        .to_string();
    rm(vm, &a);
    rm(vm, &b);
    let log = Path::new("/run/gpuhook/mps")
        .join(&uuid)
        .join("log/control.log");
    let t = std::time::Instant::now();
    loop {
        let s = std::fs::read_to_string(&log).unwrap_or_default();
        if s.contains("Command: quit") {
            break;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "the daemon was not told to quit: {s}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(vm.holders().is_empty());
}
