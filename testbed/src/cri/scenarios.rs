//! Kubernetes' contract through the CRI (docs/guides/kubernetes.md), each scenario on a bed of its own ([`Bed`]): a fake GPU host (the blueprint's
//! two Tesla M2050, nodes 195:0 and 195:1, control node 195:255), a private containerd whose
//! `gpuhook` handler is the shipped snippet, and the calls kubelet makes. `tests/cri.rs` runs
//! each as a test; `gpuhook-testbed cri scenarios` runs them on any machine with the package
//! (a Debian 13 VM with containerd 1.7), printing `N passed, M failed`.
//!
//! A node a container's device cgroup allows opens with ENXIO there (no driver behind the
//! fake major); one it denies, with EPERM: each probe makes the node itself.

use super::api;
use super::bed::{stderr, stdout, Bed, Files};
use super::pod::PodSpec;
use crate::FakeHost;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// A scenario: its name and body (panics on failure, as a test does).
pub type Scenario = fn(&Files);

pub const SCENARIOS: &[(&str, Scenario)] = &[
    (
        "gpu_pod_containers_get_their_gpus_and_the_sandbox_none",
        gpu_pod_containers_get_their_gpus_and_the_sandbox_none,
    ),
    (
        "unmet_request_fails_start_container_and_reserves_nothing",
        unmet_request_fails_start_container_and_reserves_nothing,
    ),
    (
        "init_containers_hold_gpus_while_they_run",
        init_containers_hold_gpus_while_they_run,
    ),
    (
        "share_process_namespace_pods_are_refused",
        share_process_namespace_pods_are_refused,
    ),
    ("every_removal_path_frees", every_removal_path_frees),
    (
        "default_handler_ignores_the_annotations",
        default_handler_ignores_the_annotations,
    ),
    (
        "killed_behind_containerds_back_is_stale_and_reclaimed",
        killed_behind_containerds_back_is_stale_and_reclaimed,
    ),
    (
        "attach_and_detach_by_cri_container_id",
        attach_and_detach_by_cri_container_id,
    ),
    (
        "containerd_restarted_keeps_the_reservations",
        containerd_restarted_keeps_the_reservations,
    ),
    (
        "the_readme_pod_runs_as_written",
        the_readme_pod_runs_as_written,
    ),
];

/// A container that runs until stopped.
const SLEEP: &str = "trap 'exit 0' TERM; while :; do sleep 1; done";
const GPU0: &str = "0000:07:00.0";
const GPU1: &str = "0000:08:00.0";
const ALL: [&str; 3] = ["195:0", "195:1", "195:255"];

/// A script that lists the container's NVIDIA nodes (`node PATH MAJ:MIN`, hex) and says of
/// each `major:minor` whether the device cgroup lets it open such a node (`open`) or not
/// (`denied`), through a node it makes itself.
pub fn probe_script(numbers: &[&str]) -> String {
    let mut s = String::from(
        "for n in /dev/nvidia*; do [ -c $n ] && echo \"node $n $(stat -c '%t:%T' $n)\"; done; ",
    );
    for (i, mm) in numbers.iter().enumerate() {
        let (ma, mi) = mm.split_once(':').expect("MAJ:MIN");
        s.push_str(&format!(
            "rm -f /dev/probe{i}; mknod /dev/probe{i} c {ma} {mi}; if cat /dev/probe{i} 2>&1 | grep -q 'No such device or address'; then echo 'dev {mm} open'; else echo 'dev {mm} denied'; fi; rm -f /dev/probe{i}; "
        ));
    }
    s
}

/// Asserts what a probe's output says.
pub fn assert_probe(text: &str, open: &[&str], denied: &[&str]) {
    for mm in open {
        assert!(
            text.contains(&format!("dev {mm} open")),
            "{mm} not open: {text}"
        );
    }
    for mm in denied {
        assert!(
            text.contains(&format!("dev {mm} denied")),
            "{mm} not denied: {text}"
        );
    }
}

impl Bed {
    /// Probes the GPU nodes from inside a running container (`ExecSync`).
    pub fn probe(&mut self, id: &str, open: &[&str], denied: &[&str]) -> String {
        let all: Vec<&str> = open.iter().chain(denied).copied().collect();
        let (code, out, err) = self.exec(id, &probe_script(&all));
        assert_eq!(code, 0, "probe in {id}: {out}{err}");
        assert_probe(&out, open, denied);
        out
    }

    /// The bundle's `config.json` the runtime was given for a container or sandbox.
    pub fn bundle(&self, id: &str) -> Value {
        let p = self.ctd.bundle_config(id);
        serde_json::from_slice(
            &std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
        )
        .expect("config.json")
    }

    /// The reservations, by holder ID: (kind, stale).
    pub fn reservations(&self) -> BTreeMap<String, (String, bool)> {
        let mut m = BTreeMap::new();
        for g in self.list()["gpus"].as_array().expect("gpus") {
            let h = &g["holder"];
            if let Some(d) = h["domain"].as_str() {
                m.insert(
                    d.to_string(),
                    (
                        h["kind"].as_str().unwrap_or("").to_string(),
                        h["stale"] == json!(true),
                    ),
                );
            }
        }
        m
    }

    /// `gpuhook ARGS…` that must fail: its stderr, one line.
    pub fn gh_refused(&self, args: &[&str]) -> String {
        let o = self.gh(args);
        assert!(
            !o.status.success(),
            "gpuhook {args:?} must fail: {}",
            stdout(&o)
        );
        let e = stderr(&o);
        assert_eq!(e.trim_end().lines().count(), 1, "one line: {e}");
        e.trim_end().to_string()
    }

    /// `gpuhook ARGS…` that must succeed: its stdout.
    pub fn gh_ok(&self, args: &[&str]) -> String {
        let o = self.gh(args);
        assert!(o.status.success(), "gpuhook {args:?}: {}", stderr(&o));
        stdout(&o)
    }
}

/// A bed on the blueprint's host; kept when the scenario panics.
struct Guarded(Bed);

impl std::ops::Deref for Guarded {
    type Target = Bed;
    fn deref(&self) -> &Bed {
        &self.0
    }
}

impl std::ops::DerefMut for Guarded {
    fn deref_mut(&mut self) -> &mut Bed {
        &mut self.0
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.keep = true;
            eprintln!("containerd log (tail):\n{}", self.0.ctd.log_tail());
        }
    }
}

fn bed(files: &Files, name: &str) -> Guarded {
    Guarded(Bed::new(files, name, FakeHost::blueprint()).unwrap_or_else(|e| panic!("CRI bed: {e}")))
}

fn gpu_pod(name: &str, gpus: &str) -> PodSpec {
    PodSpec::new(name).annotate("gpuhook.io/gpus", gpus)
}

/// A StartContainer that must fail: gpuhook's line in the gRPC error, once.
fn assert_start_refused(b: &mut Bed, id: &str, needle: &str) -> String {
    let e = b
        .cri
        .start_container(id)
        .expect_err("StartContainer must fail");
    let m = e.message().to_string();
    assert!(m.contains(needle), "{e}");
    assert_eq!(
        m.matches("gpuhook: ").count(),
        1,
        "gpuhook's line once: {m}"
    );
    // containerd's words around it: the OCI create failed, in StartContainer.
    assert!(m.contains("OCI runtime create failed"), "{m}");
    m
}

/// A pod on the `gpuhook` handler asking for one GPU: each of its two app containers gets
/// one (open there, the other denied), the sandbox none though the pod's annotations reach its
/// config; `gpuhook attach`/`detach` to the sandbox are refused in one line; a third
/// container finds no GPU free; removing the pod frees both.
pub fn gpu_pod_containers_get_their_gpus_and_the_sandbox_none(files: &Files) {
    let mut b = bed(files, "sandbox");
    let pod = b.pod(gpu_pod("gpu-pod", "1"));
    let c1 = b.run(&pod, "app1", SLEEP);
    // Hotplug into the sandbox, a GPU free: refused, nothing changed.
    for args in [
        vec!["attach", pod.id.as_str()],
        vec!["attach", pod.id.as_str(), "--container"],
        vec!["detach", pod.id.as_str(), "--all"],
    ] {
        let e = b.gh_refused(&args);
        assert!(
            e.contains(&format!("container '{}'", pod.id)) && e.contains("sandbox"),
            "{e}"
        );
    }
    assert_eq!(b.holders().len(), 1, "{:?}", b.holders());
    let c2 = b.run(&pod, "app2", SLEEP);
    let h = b.holders();
    assert_eq!(h.get(&c1), Some(&vec![GPU0.to_string()]), "{h:?}");
    assert_eq!(h.get(&c2), Some(&vec![GPU1.to_string()]), "{h:?}");
    assert!(!h.contains_key(&pod.id), "the sandbox holds nothing: {h:?}");
    let out = b.probe(&c1, &["195:0", "195:255"], &["195:1"]);
    assert!(out.contains("node /dev/nvidia0 c3:0"), "{out}");
    assert!(!out.contains("/dev/nvidia1 "), "{out}");
    b.probe(&c2, &["195:1", "195:255"], &["195:0"]);
    // The pod's annotations reached the sandbox's config (pod_annotations), which gpuhook
    // left as it was: no device, no hook.
    let sb = b.bundle(&pod.id);
    assert_eq!(
        sb["annotations"]["gpuhook.io/gpus"], "1",
        "{}",
        sb["annotations"]
    );
    assert_eq!(
        sb["annotations"]["io.kubernetes.cri.container-type"],
        "sandbox"
    );
    let text = sb.to_string();
    assert!(
        !text.contains("oci-hook") && !text.contains("/dev/nvidia"),
        "{text}"
    );
    let app = b.bundle(&c1);
    assert!(app.to_string().contains("/dev/nvidia0"), "{app}");
    // A third container of the pod: no GPU left, refused naming the holders.
    let c3 = b.create(&pod, "app3", SLEEP).expect("CreateContainer");
    assert_start_refused(
        &mut b,
        &c3,
        &format!("gpuhook: container '{c3}': cannot reserve 1 GPU"),
    );
    assert_eq!(b.holders(), h);
    b.cri.stop_pod_sandbox(&pod.id).expect("StopPodSandbox");
    b.cri.remove_pod_sandbox(&pod.id).expect("RemovePodSandbox");
    assert!(b.holders().is_empty(), "{:?}", b.holders());
}

/// A request that cannot be met (three GPUs of two), or a malformed one: `CreateContainer`
/// succeeds (containerd makes no OCI container there), `StartContainer` fails with gpuhook's
/// one line in the gRPC error, nothing is reserved, and the GPUs go to the next pod.
pub fn unmet_request_fails_start_container_and_reserves_nothing(files: &Files) {
    let mut b = bed(files, "unmet");
    let pod = b.pod(gpu_pod("three", "3"));
    let c = b.create(&pod, "app", SLEEP).expect("CreateContainer");
    assert_start_refused(
        &mut b,
        &c,
        &format!("gpuhook: container '{c}': cannot reserve 3 GPUs: only 2 of the host's 2 matching GPUs are free"),
    );
    assert!(
        b.list()["reservations"]
            .as_array()
            .is_none_or(|r| r.is_empty()),
        "{}",
        b.list()
    );
    assert!(b.holders().is_empty());
    let (state, _) = b.state(&c);
    assert_ne!(state, api::ContainerState::ContainerRunning as i32);
    b.cri.remove_container(&c).expect("RemoveContainer");
    for (key, value, needle) in [
        (
            "gpuhook.io/colour",
            "red",
            "unknown key: annotation 'gpuhook.io/colour'",
        ),
        (
            "gpuhook.io/arch",
            "teleport",
            "unknown architecture 'teleport' (known: ",
        ),
    ] {
        let p = b.pod(PodSpec::new(&format!("bad-{value}")).annotate(key, value));
        let c = b.create(&p, "app", SLEEP).expect("CreateContainer");
        let m = assert_start_refused(&mut b, &c, &format!("gpuhook: container '{c}': "));
        assert!(m.contains(needle), "{m}");
        assert!(b.holders().is_empty());
    }
    let pod = b.pod(gpu_pod("two", "2"));
    let c = b.run(&pod, "app", SLEEP);
    assert_eq!(b.holders()[&c], [GPU0, GPU1]);
    b.probe(&c, &ALL, &[]);
}

/// kubelet runs init containers one after the other, each to its exit, before the app
/// containers: each holds the pod's GPUs while it runs (its probe, in its CRI log, found
/// them open), frees them at its exit, and the app container gets them next.
pub fn init_containers_hold_gpus_while_they_run(files: &Files) {
    let mut b = bed(files, "init");
    let pod = b.pod(gpu_pod("with-init", "2"));
    for name in ["init-1", "init-2"] {
        let script = format!(
            "{} while [ ! -e /tmp/done ]; do sleep 0.1; done",
            probe_script(&ALL)
        );
        let id = b.run(&pod, name, &script);
        assert_eq!(
            b.holders().get(&id),
            Some(&vec![GPU0.to_string(), GPU1.to_string()])
        );
        let (code, _, err) = b.exec(&id, "touch /tmp/done");
        assert_eq!(code, 0, "{err}");
        assert_eq!(b.wait_exited(&id, Duration::from_secs(30)), 0);
        let log = pod.log_dir.join(name).join("0.log");
        let text =
            std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        assert_probe(&text, &ALL, &[]);
        // Exited: containerd deleted its task, gpuhook-runtime freed its GPUs.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !b.holders().is_empty() {
            assert!(
                Instant::now() < deadline,
                "{name} still holds: {:?}",
                b.holders()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let app = b.run(&pod, "app", SLEEP);
    assert_eq!(b.holders()[&app], [GPU0, GPU1]);
    b.probe(&app, &ALL, &[]);
}

/// `shareProcessNamespace: true`: the app containers join the sandbox's PID namespace, so
/// one that asks for GPUs is refused at `StartContainer` in one line saying so; the same pod
/// without a request runs.
pub fn share_process_namespace_pods_are_refused(files: &Files) {
    let mut b = bed(files, "sharepid");
    let pod = b.pod(gpu_pod("shared", "1").share_pid());
    let c = b.create(&pod, "app", SLEEP).expect("CreateContainer");
    let m = assert_start_refused(&mut b, &c, &format!("gpuhook: container '{c}': "));
    assert!(m.contains("shareProcessNamespace"), "{m}");
    assert!(b.holders().is_empty(), "{:?}", b.holders());
    let plain = b.pod(PodSpec::new("shared-plain").share_pid());
    let c = b.run(&plain, "app", SLEEP);
    // It does share the sandbox's PID namespace: the pause process is PID 1 there.
    let (_, ps, _) = b.exec(&c, "cat /proc/1/cmdline");
    assert!(ps.contains("trap"), "{ps}");
    b.probe(&c, &[], &["195:0"]);
    assert!(b.holders().is_empty());
}

/// Each way kubelet ends a container frees its GPU: `StopContainer`, `RemoveContainer` of a
/// running one, `StopPodSandbox`, `RemovePodSandbox` of a running pod.
pub fn every_removal_path_frees(files: &Files) {
    let mut b = bed(files, "removal");
    let pa = b.pod(gpu_pod("stop-container", "1"));
    let ca = b.run(&pa, "app", SLEEP);
    let pb = b.pod(gpu_pod("remove-container", "1"));
    let cb = b.run(&pb, "app", SLEEP);
    assert_eq!(b.holders().len(), 2);
    b.cri.stop_container(&ca, 10).expect("StopContainer");
    let h = b.holders();
    assert!(
        !h.contains_key(&ca) && h.contains_key(&cb),
        "StopContainer frees: {h:?}"
    );
    b.cri.remove_container(&ca).expect("RemoveContainer");
    b.cri
        .remove_container(&cb)
        .expect("RemoveContainer of a running container");
    assert!(
        b.holders().is_empty(),
        "RemoveContainer frees: {:?}",
        b.holders()
    );
    let pc = b.pod(gpu_pod("stop-pod", "1"));
    let cc = b.run(&pc, "app", SLEEP);
    let pd = b.pod(gpu_pod("remove-pod", "1"));
    let cd = b.run(&pd, "app", SLEEP);
    assert_eq!(b.holders().len(), 2);
    b.cri.stop_pod_sandbox(&pc.id).expect("StopPodSandbox");
    let h = b.holders();
    assert!(
        !h.contains_key(&cc) && h.contains_key(&cd),
        "StopPodSandbox frees: {h:?}"
    );
    b.cri
        .remove_pod_sandbox(&pd.id)
        .expect("RemovePodSandbox of a running pod");
    assert!(
        b.holders().is_empty(),
        "RemovePodSandbox frees: {:?}",
        b.holders()
    );
    b.cri.remove_pod_sandbox(&pc.id).expect("RemovePodSandbox");
    for p in [&pa, &pb] {
        b.cri.remove_pod_sandbox(&p.id).expect("RemovePodSandbox");
    }
    assert!(b
        .cri
        .list_containers(None)
        .expect("ListContainers")
        .is_empty());
}

/// The same annotations on the default handler (and on `runc` named): containerd passes no
/// pod annotation to it, gpuhook-runtime is not in the way, no GPU is reserved or given.
pub fn default_handler_ignores_the_annotations(files: &Files) {
    let mut b = bed(files, "default");
    for handler in ["", "runc"] {
        let pod = b
            .pod_on(gpu_pod(&format!("plain-{handler}"), "1"), handler)
            .expect("RunPodSandbox");
        let c = b.run(&pod, "app", SLEEP);
        b.probe(&c, &[], &["195:0", "195:1"]);
        assert!(b.holders().is_empty(), "{:?}", b.holders());
        let cfg = b.bundle(&c);
        assert!(
            cfg["annotations"].get("gpuhook.io/gpus").is_none(),
            "{}",
            cfg["annotations"]
        );
        assert!(!cfg.to_string().contains("oci-hook"));
    }
}

/// Sends SIGCONT to a stopped process when dropped (a failed scenario leaves no shim frozen).
struct Thaw(i32);

impl Drop for Thaw {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0),
            nix::sys::signal::SIGCONT,
        );
    }
}

/// A container's init killed while its shim cannot tell containerd (the shim frozen): gpuhook
/// lists its GPU stale, and a pod that needs it gets it; once the shim runs again containerd
/// sees the container exited, and nothing of the new holder's is freed.
pub fn killed_behind_containerds_back_is_stale_and_reclaimed(files: &Files) {
    let mut b = bed(files, "stale");
    let pa = b.pod(gpu_pod("victim", "1"));
    let ca = b.run(&pa, "app", SLEEP);
    assert_eq!(b.holders()[&ca], [GPU0]);
    let init = b.ctd.init_pid(&ca).expect("runc's state of the container");
    let shim = super::containerd::ppid(init).expect("its shim");
    let comm = std::fs::read_to_string(format!("/proc/{shim}/comm")).unwrap_or_default();
    assert!(comm.starts_with("containerd-shim"), "{shim}: {comm}");
    let pid = |p: i32| nix::unistd::Pid::from_raw(p);
    nix::sys::signal::kill(pid(shim), nix::sys::signal::SIGSTOP).expect("SIGSTOP the shim");
    let thaw = Thaw(shim);
    nix::sys::signal::kill(pid(init), nix::sys::signal::SIGKILL).expect("SIGKILL the init");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !b.reservations().get(&ca).is_some_and(|(_, stale)| *stale) {
        assert!(Instant::now() < deadline, "not stale: {}", b.list());
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = b.gh_ok(&["list"]);
    assert!(text.contains(&format!("stale: container {ca}")), "{text}");
    let pb = b.pod(gpu_pod("heir", "2"));
    let cb = b.run(&pb, "app", SLEEP);
    assert_eq!(
        b.holders(),
        BTreeMap::from([(cb.clone(), vec![GPU0.to_string(), GPU1.to_string()])])
    );
    drop(thaw);
    let deadline = Instant::now() + Duration::from_secs(30);
    while b.state(&ca).0 != api::ContainerState::ContainerExited as i32 {
        assert!(Instant::now() < deadline, "containerd never saw {ca} exit");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Its task deleted (gpuhook-runtime delete, its poststop): the heir keeps both.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(b.reservations().get(&cb), Some(&("oci".to_string(), false)));
    assert_eq!(b.holders()[&cb].len(), 2);
    b.probe(&cb, &ALL, &[]);
}

/// `gpuhook attach`/`detach` by CRI container ID (runc's state under the shim's root, in
/// `oci_state_roots`): on the `gpuhook` handler, attach, detach, attach again and
/// `StopContainer` frees; on the default handler attach and detach too.
pub fn attach_and_detach_by_cri_container_id(files: &Files) {
    let mut b = bed(files, "hotplug");
    let pod = b.pod(PodSpec::new("hotplug"));
    let c = b.run(&pod, "app", SLEEP);
    b.probe(&c, &[], &["195:0"]);
    let out = b.gh_ok(&["attach", &c, "--count", "1"]);
    assert!(
        out.contains(&format!("attached {GPU0} to container '{c}'")),
        "{out}"
    );
    assert_eq!(b.reservations().get(&c), Some(&("oci".to_string(), false)));
    let out = b.probe(&c, &["195:0", "195:255"], &["195:1"]);
    assert!(out.contains("node /dev/nvidia0 c3:0"), "{out}");
    let out = b.gh_ok(&["detach", &c, "--all"]);
    assert!(
        out.contains(&format!("detached {GPU0} from container '{c}'")),
        "{out}"
    );
    b.probe(&c, &[], &["195:0"]);
    assert!(b.holders().is_empty());
    b.gh_ok(&["attach", &c, "--container", "--device", GPU1]);
    assert_eq!(b.holders()[&c], [GPU1]);
    b.cri.stop_container(&c, 10).expect("StopContainer");
    assert!(
        b.holders().is_empty(),
        "StopContainer frees an attached GPU: {:?}",
        b.holders()
    );
    // The default handler's container: the same state root, gpuhook-runtime not involved.
    let plain = b
        .pod_on(PodSpec::new("hotplug-runc"), "")
        .expect("RunPodSandbox");
    let d = b.run(&plain, "app", SLEEP);
    b.gh_ok(&["attach", &d, "--device", GPU0]);
    b.probe(&d, &["195:0"], &["195:1"]);
    b.gh_ok(&["detach", &d, "--device", GPU0]);
    b.probe(&d, &[], &["195:0"]);
    assert!(b.holders().is_empty());
    let e = b.gh_refused(&[
        "attach",
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    ]);
    assert!(
        e.contains("no running libvirt domain or OCI container"),
        "{e}"
    );
}

/// containerd stopped (as systemd stops it) and crashed while GPU pods run: the containers
/// run on, keep their reservations (never listed stale), and containerd, started again,
/// shows them running; another pod is still refused the held GPU; the pod's removal frees.
pub fn containerd_restarted_keeps_the_reservations(files: &Files) {
    let mut b = bed(files, "restart");
    let pod = b.pod(gpu_pod("survivor", "1"));
    let c = b.run(&pod, "app", SLEEP);
    for sig in [nix::sys::signal::SIGTERM, nix::sys::signal::SIGKILL] {
        b.ctd.stop(sig).expect("stop containerd");
        assert_eq!(
            b.reservations().get(&c),
            Some(&("oci".to_string(), false)),
            "{sig}"
        );
        b.ctd.restart().expect("containerd starts again");
        b.cri = b.ctd.cri().expect("CRI after the restart");
        let listed = b
            .cri
            .list_containers(Some(&pod.id))
            .expect("ListContainers");
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].id, c);
        assert_eq!(
            listed[0].state,
            api::ContainerState::ContainerRunning as i32,
            "{sig}"
        );
        assert_eq!(b.holders()[&c], [GPU0], "{sig}");
        b.probe(&c, &["195:0"], &["195:1"]);
    }
    let other = b.pod(gpu_pod("other", "2"));
    let o = b.create(&other, "app", SLEEP).expect("CreateContainer");
    assert_start_refused(&mut b, &o, &format!("1 held by container '{c}'"));
    b.cri.remove_pod_sandbox(&pod.id).expect("RemovePodSandbox");
    assert!(b.holders().is_empty(), "{:?}", b.holders());
}

/// The README's Kubernetes pod, as written: its `runtimeClassName` is the shipped
/// RuntimeClass, whose handler the bed's containerd has from the shipped snippet; its
/// annotations ask; its container gets that many GPUs (its image and command replaced by the
/// bed's busybox and the probe).
pub fn the_readme_pod_runs_as_written(files: &Files) {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let Ok(text) = std::fs::read_to_string(&readme) else {
        // A machine with the package but not the sources: the README is the installed one.
        let installed = Path::new("/usr/share/doc/gpuhook/README.md");
        return readme_pod(
            files,
            &std::fs::read_to_string(installed).expect("the README"),
        );
    };
    readme_pod(files, &text)
}

/// The YAML blocks of a Markdown text.
fn yaml_blocks(md: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut cur: Option<String> = None;
    for l in md.lines() {
        match (&mut cur, l.trim_start()) {
            (None, t) if t.starts_with("```yaml") => cur = Some(String::new()),
            (Some(b), t) if t.starts_with("```") => {
                for doc in b.split("\n---\n") {
                    if let Ok(v) = serde_yaml_ng::from_str::<Value>(doc) {
                        out.push(v);
                    }
                }
                cur = None;
            }
            (Some(b), _) => {
                b.push_str(l);
                b.push('\n');
            }
            _ => {}
        }
    }
    out
}

fn readme_pod(files: &Files, md: &str) {
    let blocks = yaml_blocks(md);
    let pod = blocks
        .iter()
        .find(|v| v["kind"] == "Pod")
        .expect("a Pod manifest in the README");
    let mut b = bed(files, "readme");
    assert_eq!(
        pod["spec"]["runtimeClassName"],
        json!(b.runtimeclass),
        "{pod:?}"
    );
    let shipped = super::bed::runtimeclass_handler(&files.runtimeclass).expect("RuntimeClass");
    // The README shows the shipped RuntimeClass as it is.
    let rc: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&files.runtimeclass).unwrap()).unwrap();
    assert!(
        blocks.contains(&rc),
        "the README's RuntimeClass is not the shipped one"
    );
    let mut spec = PodSpec::new(pod["metadata"]["name"].as_str().expect("name"));
    let mut want = 0;
    for (k, v) in pod["metadata"]["annotations"]
        .as_object()
        .expect("annotations")
    {
        let v = v.as_str().expect("annotations are strings");
        if k == "gpuhook.io/gpus" {
            want = v.parse().expect("a count");
        }
        spec = spec.annotate(k, v);
    }
    assert!(want > 0, "the README's pod asks for GPUs");
    let p = b.pod_on(spec, &shipped.1).expect("RunPodSandbox");
    let name = pod["spec"]["containers"][0]["name"]
        .as_str()
        .expect("a container");
    let c = b.run(&p, name, SLEEP);
    assert_eq!(b.holders()[&c].len(), want, "{:?}", b.holders());
    let open: Vec<&str> = ALL[..want].iter().copied().chain(["195:255"]).collect();
    b.probe(&c, &open, &ALL[want..2]);
}
