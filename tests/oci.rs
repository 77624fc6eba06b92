//! The OCI front door under real engines: `gpuhook-runtime` wrapping runc and crun, driven by
//! podman and by plain `runc run`, on fake GPU hosts (real char-device nodes whose major no
//! driver owns: a process allowed by its device cgroup gets ENXIO opening one, a process
//! denied gets EPERM). cgroup v1 is this machine's layout; cgroup v2 runs in a private mount
//! namespace whose `/sys/fs/cgroup` is a cgroup2 mount (crun refuses the hybrid layout).
//!
//! What this machine needs the harness to work round: `podman run` needs lower
//! rlimits (no CAP_SYS_RESOURCE), and crun cannot raise RLIMIT_MEMLOCK, so crun runs with a
//! tiny LD_PRELOAD shim (built here with `cc`) that ignores that one EPERM.

mod common;
#[path = "oci/driver.rs"]
mod driver;

use common::{assert_ok, stderr, Host};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use testbed::FakeHost;

const RUNC: &str = "/usr/sbin/runc";
const CRUN: &str = "/usr/bin/crun";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cgroup {
    V1,
    V2,
}

/// A fake host, gpuhook-runtime on it, a busybox root filesystem.
struct Oci {
    host: Host,
    /// What engines are pointed at: a script that sets the config and execs the link.
    runtime: PathBuf,
    /// `gpuhook-runtime`, a symlink to the binary under test.
    link: PathBuf,
    rootfs: PathBuf,
}

fn memlock_shim(dir: &Path) -> PathBuf {
    let src = dir.join("memlock.c");
    let so = dir.join("memlock.so");
    std::fs::write(
        &src,
        r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/resource.h>
/* This VM lacks CAP_SYS_RESOURCE: crun's raise of RLIMIT_MEMLOCK fails. */
int setrlimit(__rlimit_resource_t r, const struct rlimit *l) {
    int (*real)(__rlimit_resource_t, const struct rlimit *) = dlsym(RTLD_NEXT, "setrlimit");
    int rc = real(r, l);
    if (rc != 0 && errno == EPERM && r == RLIMIT_MEMLOCK) return 0;
    return rc;
}
"#,
    )
    .unwrap();
    let o = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("cc");
    assert_ok(&o);
    so
}

fn busybox_rootfs(root: &Path) -> PathBuf {
    let r = root.join("rootfs");
    for d in ["bin", "dev", "proc", "sys", "tmp", "etc", "sync", "run"] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    std::fs::copy("/usr/bin/busybox", r.join("bin/busybox")).expect("busybox-static");
    for a in [
        "sh", "cat", "ls", "mknod", "stat", "echo", "sleep", "grep", "test", "[", "id", "true",
    ] {
        std::os::unix::fs::symlink("busybox", r.join("bin").join(a)).unwrap();
    }
    std::fs::write(r.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n").unwrap();
    r
}

impl Oci {
    fn new(fake: FakeHost, real: &str) -> Oci {
        let real = real.to_string();
        let host = Host::with(fake, move |c| c["oci_runtime"] = json!(real));
        let root = host.root().to_path_buf();
        let link = root.join("gpuhook-runtime");
        std::os::unix::fs::symlink(common::bin(), &link).unwrap();
        let preload = if real_is_crun(&host) {
            format!("LD_PRELOAD={} ", memlock_shim(&root).display())
        } else {
            String::new()
        };
        let runtime = root.join("runtime.sh");
        std::fs::write(
            &runtime,
            format!(
                "#!/bin/sh\n{preload}GPUHOOK_CONFIG={} exec {} \"$@\"\n",
                host.config.display(),
                link.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o755)).unwrap();
        let rootfs = busybox_rootfs(&root);
        Oci {
            host,
            runtime,
            link,
            rootfs,
        }
    }

    /// The state's reservations (empty when there is no state file yet).
    fn reservations(&self) -> Vec<Value> {
        self.host.list()["reservations"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// `podman run` of the busybox rootfs with `script`, through gpuhook-runtime.
    fn podman(&self, cg: Cgroup, extra: &[&str], script: &str) -> Command {
        self.podman_with(cg, self.runtime.as_os_str(), &self.rootfs, extra, script)
    }

    /// The same with `--runtime` given as `runtime` (a path, or a name from containers.conf)
    /// and the root filesystem `rootfs`.
    fn podman_with(
        &self,
        cg: Cgroup,
        runtime: &std::ffi::OsStr,
        rootfs: &Path,
        extra: &[&str],
        script: &str,
    ) -> Command {
        let mut c = in_cgroup(cg, "podman");
        if cg == Cgroup::V2 {
            c.args(["--cgroup-manager", "cgroupfs"]);
        }
        c.arg("--runtime").arg(runtime).args([
            "run",
            "--network",
            "none",
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
            "--cap-add",
            "mknod",
        ]);
        if cg == Cgroup::V2 {
            // That cgroup2 mount has no controllers (they are v1's on this host).
            c.args(["--pids-limit", "-1"]);
        }
        c.args(extra)
            .arg("--rootfs")
            .arg(rootfs)
            .args(["sh", "-c", script]);
        c
    }

    /// A runc bundle (from `runc spec`) for the rootfs running `script`, with annotations.
    fn bundle(&self, name: &str, annotations: Value, script: &str) -> PathBuf {
        let b = self.host.root().join(name);
        std::fs::create_dir_all(&b).unwrap();
        let _ = std::fs::remove_file(b.join("config.json"));
        let o = Command::new(RUNC)
            .args(["spec", "--bundle"])
            .arg(&b)
            .output()
            .unwrap();
        assert_ok(&o);
        let p = b.join("config.json");
        let mut c: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        c["root"] = json!({"path": self.rootfs, "readonly": false});
        c["process"]["terminal"] = json!(false);
        c["process"]["args"] = json!(["sh", "-c", script]);
        for k in ["bounding", "effective", "permitted"] {
            c["process"]["capabilities"][k]
                .as_array_mut()
                .unwrap()
                .push(json!("CAP_MKNOD"));
        }
        c["annotations"] = annotations;
        std::fs::write(&p, serde_json::to_vec_pretty(&c).unwrap()).unwrap();
        b
    }

    /// `gpuhook-runtime create --bundle B ID` in cgroup v1, run to its end.
    fn create(&self, b: &Path, id: &str) -> Output {
        self.wrapper(Cgroup::V1, &["create", "--bundle", b.to_str().unwrap(), id])
            .output()
            .unwrap()
    }

    /// `gpuhook-runtime --root ROOT ARGS…` (runc's own command line).
    fn wrapper(&self, cg: Cgroup, args: &[&str]) -> Command {
        let mut c = in_cgroup(cg, self.link.to_str().unwrap());
        c.env("GPUHOOK_CONFIG", &self.host.config)
            .arg("--root")
            .arg(self.host.root().join(format!("runc-root-{cg:?}")))
            .args(args);
        if real_is_crun(&self.host) {
            c.env("LD_PRELOAD", self.host.root().join("memlock.so"));
        }
        c
    }
}

fn real_is_crun(h: &Host) -> bool {
    let c: Value = serde_json::from_slice(&std::fs::read(&h.config).unwrap()).unwrap();
    c["oci_runtime"] == json!(CRUN)
}

/// `prog` run in this cgroup layout: as is (v1), or in a private mount namespace whose
/// `/sys/fs/cgroup` is the cgroup2 hierarchy alone.
fn in_cgroup(cg: Cgroup, prog: &str) -> Command {
    match cg {
        Cgroup::V1 => Command::new(prog),
        Cgroup::V2 => {
            let mut c = Command::new("unshare");
            c.args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                "umount -R /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup && exec \"$@\"",
                "sh",
                prog,
            ]);
            c
        }
    }
}

/// A script that says, for each `major:minor`, whether the container's device cgroup lets it
/// open such a node (`open`: ENXIO, no driver behind the fake major) or not (`denied`:
/// EPERM), through a node it makes itself; and lists the GPU nodes it was given.
fn probe(numbers: &[&str]) -> String {
    let mut s = String::from("for n in /dev/nvidia*; do [ -c $n ] && echo \"node $n $(stat -c '%t:%T %a %u %g' $n)\"; done; ");
    for (i, mm) in numbers.iter().enumerate() {
        let (ma, mi) = mm.split_once(':').unwrap();
        s.push_str(&format!(
            "mknod /dev/probe{i} c {ma} {mi}; if cat /dev/probe{i} 2>&1 | grep -q 'No such device or address'; then echo 'dev {mm} open'; else echo 'dev {mm} denied'; fi; "
        ));
    }
    s
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn assert_probe(o: &Output, open: &[&str], denied: &[&str]) {
    let text = out(o);
    for mm in open {
        assert!(
            text.contains(&format!("dev {mm} open")),
            "{mm} not open: {text}\nstderr: {}",
            stderr(o)
        );
    }
    for mm in denied {
        assert!(
            text.contains(&format!("dev {mm} denied")),
            "{mm} not denied: {text}"
        );
    }
}

/// Asserts the wrapper's refusal: exit 1 (podman: its own status 126 naming the runtime's
/// error), one `gpuhook: container 'ID': …` line with `needle`.
fn assert_refused(o: &Output, needle: &str) {
    let e = stderr(o);
    assert!(!o.status.success(), "accepted: {e}");
    let line = e
        .lines()
        .find(|l| l.contains("gpuhook: container '"))
        .unwrap_or_else(|| panic!("no gpuhook line naming the container: {e}"));
    assert!(line.contains(needle), "{line:?} lacks {needle:?}");
}

#[test]
fn runc_bundle_gets_exactly_its_gpu_in_cgroup_v1_and_v2() {
    for cg in [Cgroup::V1, Cgroup::V2] {
        let o = Oci::new(FakeHost::blueprint(), RUNC);
        let b = o.bundle(
            "b1",
            json!({"gpuhook.io/gpus": "1", "gpuhook.io/uid": "1000", "gpuhook.io/gid": "44",
                   "gpuhook.io/mode": "0660", "org.example/other": "kept"}),
            &probe(&["195:0", "195:255", "195:1"]),
        );
        let r = o
            .wrapper(cg, &["run", "--bundle", b.to_str().unwrap(), "gpu-runc-1"])
            .output()
            .unwrap();
        assert_ok(&r);
        assert_probe(&r, &["195:0", "195:255"], &["195:1"]);
        let text = out(&r);
        assert!(
            text.contains("node /dev/nvidia0 c3:0 660 1000 44"),
            "{cg:?}: {text}"
        );
        assert!(!text.contains("/dev/nvidia1"), "{text}");
        // The runtime ran the poststop hook: nothing is held.
        assert_eq!(o.reservations(), Vec::<Value>::new(), "{cg:?}");
        // The config kept what it had, and got gpuhook's entries.
        let c: Value =
            serde_json::from_slice(&std::fs::read(b.join("config.json")).unwrap()).unwrap();
        assert_eq!(c["annotations"]["org.example/other"], json!("kept"));
        assert_eq!(
            c["hooks"]["createRuntime"][0]["args"][2],
            json!("create-runtime")
        );
        assert!(c["linux"]["resources"]["devices"]
            .as_array()
            .unwrap()
            .contains(
                &json!({"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rw"})
            ));
        // The same bundle run again asking for the other GPU: the first run's additions are
        // gone (no access to GPU 0, one pair of hooks); then without a request: no GPU.
        let mut c = c;
        c["annotations"] = json!({"gpuhook.io/devices": "1", "org.example/other": "kept"});
        std::fs::write(b.join("config.json"), serde_json::to_vec(&c).unwrap()).unwrap();
        let r = o
            .wrapper(cg, &["run", "--bundle", b.to_str().unwrap(), "gpu-runc-2"])
            .output()
            .unwrap();
        assert_ok(&r);
        assert_probe(&r, &["195:1", "195:255"], &["195:0"]);
        let c: Value =
            serde_json::from_slice(&std::fs::read(b.join("config.json")).unwrap()).unwrap();
        assert_eq!(c["hooks"]["poststop"].as_array().unwrap().len(), 1, "{c}");
        let mut c = c;
        c["annotations"] = json!({"org.example/other": "kept"});
        std::fs::write(b.join("config.json"), serde_json::to_vec(&c).unwrap()).unwrap();
        let r = o
            .wrapper(cg, &["run", "--bundle", b.to_str().unwrap(), "gpu-runc-3"])
            .output()
            .unwrap();
        assert_ok(&r);
        assert_probe(&r, &[], &["195:1", "195:0", "195:255"]);
        assert!(!out(&r).contains("node /dev/nvidia"), "{}", out(&r));
        assert_eq!(o.reservations(), Vec::<Value>::new(), "{cg:?}");
    }
}

/// `gpuhook.io/mig=yes` through runc, cgroup v1 and v2: the container gets its MIG
/// instance's GPU node and two capability nodes, and nothing of the other instances or
/// the management capabilities.
#[test]
fn runc_bundle_gets_a_mig_instance() {
    use testbed::fakehost::{mig_minor, CAPS_MAJOR};
    for cg in [Cgroup::V1, Cgroup::V2] {
        let o = Oci::new(FakeHost::dgx8_mig(), RUNC);
        // The first GPU with a free instance: 0000:18:00.0 (/dev/nvidia2), gi 7.
        let (g, c) = (mig_minor(2, 7, None), mig_minor(2, 7, Some(0)));
        let (og, oc) = (mig_minor(2, 8, None), mig_minor(2, 8, Some(0)));
        let mine = [
            "195:2".to_string(),
            format!("{CAPS_MAJOR}:{g}"),
            format!("{CAPS_MAJOR}:{c}"),
        ];
        let others = [
            format!("{CAPS_MAJOR}:{og}"),
            format!("{CAPS_MAJOR}:{oc}"),
            format!("{CAPS_MAJOR}:1"),
            format!("{CAPS_MAJOR}:2"),
            "195:3".to_string(),
        ];
        let all: Vec<&str> = mine.iter().chain(&others).map(String::as_str).collect();
        let b = o.bundle(
            "m1",
            json!({"gpuhook.io/mig": "yes"}),
            &format!("echo caps: $(ls /dev/nvidia-caps); {}", probe(&all)),
        );
        let r = o
            .wrapper(
                cg,
                &["run", "--bundle", b.to_str().unwrap(), "gpu-runc-mig"],
            )
            .output()
            .unwrap();
        assert_ok(&r);
        let mine: Vec<&str> = mine.iter().map(String::as_str).collect();
        let others: Vec<&str> = others.iter().map(String::as_str).collect();
        assert_probe(&r, &mine, &others);
        assert!(
            out(&r).contains(&format!("caps: nvidia-cap{g} nvidia-cap{c}\n")),
            "{cg:?}: {}",
            out(&r)
        );
        assert_eq!(o.reservations(), Vec::<Value>::new(), "{cg:?}");
    }
}

/// A root filesystem the container's root (host uid 100000) owns, as podman's own --userns
/// images are.
fn chown_rootfs_to_100000(o: &Oci) {
    let st = Command::new("chown")
        .args(["-R", "-h", "100000:100000"])
        .arg(&o.rootfs)
        .status()
        .unwrap();
    assert!(st.success());
}

/// A user-namespaced container (podman --uidmap): gpuhook makes the nodes, owned by the
/// host ids the request's uid/gid map to, and the runtime bind-mounts them; the container
/// sees its own ids, as with libvirt's <idmap>.
/// The state under a tmpfs mounted as systemd mounts `/run` (`nodev`, `strictatime`): the
/// nodes of a user-namespaced container still reach it. A bind made inside the user
/// namespace keeps its source's flags locked, so runc's remount (`bind,nosuid,noexec`) of a
/// node from such a `/run` is refused (EPERM); gpuhook makes its nodes on a tmpfs of its own.
#[test]
fn user_namespaced_nodes_from_a_state_on_systemds_run() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    chown_rootfs_to_100000(&o);
    let run = o.host.root().join("sysrun");
    std::fs::create_dir_all(&run).unwrap();
    let m = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "nosuid,nodev,strictatime,mode=0755",
            "sysrun",
        ])
        .arg(&run)
        .output()
        .unwrap();
    assert_ok(&m);
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-R").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(run.clone());
    let state = run.join("gpuhook/state.json");
    o.host.edit_config(|c| c["state_file"] = json!(state));
    let r = o
        .podman(
            Cgroup::V1,
            &[
                "--rm",
                "--uidmap",
                "0:100000:65536",
                "--gidmap",
                "0:100000:65536",
                "--annotation",
                "gpuhook.io/gpus=1",
            ],
            "cat /dev/nvidia0",
        )
        .output()
        .unwrap();
    assert!(
        stderr(&r).contains("can't open '/dev/nvidia0': No such device or address"),
        "{}",
        stderr(&r)
    );
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

#[test]
fn user_namespaced_podman_container_owns_its_nodes() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    chown_rootfs_to_100000(&o);
    let r = o
        .podman(
            Cgroup::V1,
            &[
                "--rm",
                "--uidmap",
                "0:100000:65536",
                "--gidmap",
                "0:100000:65536",
                "--annotation",
                "gpuhook.io/gpus=1",
                "--annotation",
                "gpuhook.io/uid=1000",
                "--annotation",
                "gpuhook.io/gid=44",
                "--annotation",
                "gpuhook.io/mode=0600",
            ],
            // mknod is not allowed in a user namespace: the given node is opened itself.
            "ls -ln /dev | grep nvidia0; cat /dev/nvidia0; cat /proc/self/uid_map",
        )
        .output()
        .unwrap();
    assert_ok(&r);
    let text = out(&r);
    assert!(text.contains("0     100000      65536"), "{text}");
    let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains("crw------- 1 1000 44 195, 0"), "{text}");
    assert!(
        stderr(&r).contains("can't open '/dev/nvidia0': No such device or address"),
        "{}",
        stderr(&r)
    );
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
    let nodes = o.host.state.parent().unwrap().join("nodes");
    let left: Vec<_> = std::fs::read_dir(&nodes).unwrap().flatten().collect();
    assert!(left.is_empty(), "nodes left: {left:?}");
    // An operator's `gpuhook release` of a running one is refused (its access would outlive
    // the reservation), in one line; its removal frees the reservation and its nodes.
    podman_rm("gh-oci-userns");
    let r = o
        .podman(
            Cgroup::V1,
            &[
                "-d",
                "--name",
                "gh-oci-userns",
                "--uidmap",
                "0:100000:65536",
                "--gidmap",
                "0:100000:65536",
                "--annotation",
                "gpuhook.io/gpus=1",
            ],
            "sleep 60",
        )
        .output()
        .unwrap();
    assert_ok(&r);
    let id = out(&r).trim().to_string();
    assert!(nodes.join(&id).is_dir());
    let r = o.host.cmd().args(["release", &id]).output().unwrap();
    assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
    let e = stderr(&r);
    assert_eq!(e.trim_end().lines().count(), 1, "{e}");
    assert!(
        e.starts_with(&format!("gpuhook: container '{id}' still runs (init "))
            && e.ends_with(&format!(
                "or take its GPUs back with 'gpuhook detach {id} --container --all'\n"
            )),
        "{e}"
    );
    assert_eq!(o.reservations().len(), 1, "{:?}", o.reservations());
    podman_rm(&id);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
    let left: Vec<_> = std::fs::read_dir(&nodes).unwrap().flatten().collect();
    assert!(
        left.is_empty(),
        "nodes left after release and removal: {left:?}"
    );
    // A uid the container's namespace does not map: refused.
    let r = o
        .podman(
            Cgroup::V1,
            &[
                "--rm",
                "--uidmap",
                "0:100000:1000",
                "--gidmap",
                "0:100000:1000",
                "--annotation",
                "gpuhook.io/uid=1000",
            ],
            "true",
        )
        .output()
        .unwrap();
    assert_refused(&r, "uid 1000 is not mapped by linux.uidMappings");
}

#[test]
fn without_a_request_everything_passes_through() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    let b = o.bundle("plain", json!({"org.example/x": "1"}), "ls /dev; exit 7");
    let before = std::fs::read(b.join("config.json")).unwrap();
    let r = o
        .wrapper(Cgroup::V1, &["run", "-b", b.to_str().unwrap(), "plain-1"])
        .output()
        .unwrap();
    // The runtime's status, untouched config, no GPU node, no state written.
    assert_eq!(r.status.code(), Some(7), "{}", stderr(&r));
    assert!(!out(&r).contains("nvidia"), "{}", out(&r));
    assert_eq!(std::fs::read(b.join("config.json")).unwrap(), before);
    assert!(!o.host.state.exists());
    // Other commands: the real runtime's own answer.
    let mine = o.wrapper(Cgroup::V1, &["--version"]).output().unwrap();
    let real = Command::new(RUNC).arg("--version").output().unwrap();
    assert_eq!(
        (mine.status.code(), out(&mine)),
        (real.status.code(), out(&real))
    );
}

#[test]
fn bad_requests_are_refused_before_the_runtime_runs() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    // A "runtime" that only says it was called.
    let marker = o.host.root().join("runtime-was-called");
    let fake = o.host.root().join("fake-runtime");
    std::fs::write(&fake, format!("#!/bin/sh\ntouch {}\n", marker.display())).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&o.host.config).unwrap()).unwrap();
    cfg["oci_runtime"] = json!(fake);
    common::write_config(&o.host.config, &cfg.to_string());
    for (ann, needle) in [
        (
            json!({"gpuhook.io/gpus": "two"}),
            "annotation 'gpuhook.io/gpus'",
        ),
        (
            json!({"gpuhook.io/gpu": "1"}),
            "unknown key: annotation 'gpuhook.io/gpu'",
        ),
        (
            json!({"gpuhook.io/gpus": "3"}),
            "cannot reserve 3 GPUs: only 2 of the host's 2",
        ),
        (json!({"gpuhook.io/arch": "hopper"}), "arch == hopper"),
        (
            json!({"gpuhook.io/devices": "0000:99:00.0"}),
            "no GPU with pci 0000:99:00.0",
        ),
        (
            json!({"gpuhook.io/uid": "5"}),
            "gid 40 is not mapped by linux.gidMappings",
        ),
    ] {
        let mut ann = ann;
        let b = o.bundle("bad", json!({}), "true");
        let p = b.join("config.json");
        let mut c: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        if ann.get("gpuhook.io/uid").is_some() {
            // A user namespace that does not map the asked-for owner.
            c["linux"]["uidMappings"] =
                json!([{"containerID": 0, "hostID": 100000, "size": 65536}]);
            c["linux"]["gidMappings"] = json!([{"containerID": 0, "hostID": 100000, "size": 10}]);
            ann["gpuhook.io/gid"] = json!("40");
        }
        c["annotations"] = ann.clone();
        std::fs::write(&p, serde_json::to_vec(&c).unwrap()).unwrap();
        let before = std::fs::read(&p).unwrap();
        let r = o.create(&b, "bad-1");
        assert_eq!(r.status.code(), Some(1), "{ann}: {}", stderr(&r));
        let e = stderr(&r);
        assert_eq!(e.trim_end().lines().count(), 1, "{e}");
        assert!(e.starts_with("gpuhook: container 'bad-1': "), "{e}");
        assert!(e.contains(needle), "{ann}: {e:?} lacks {needle:?}");
        assert!(!marker.exists(), "{ann}: the runtime was called");
        assert_eq!(std::fs::read(&p).unwrap(), before, "{ann}: config changed");
        assert!(o.reservations().is_empty(), "{ann}: {:?}", o.reservations());
    }
    // The host's PID namespace: refused (its init's exit would not end its other processes).
    let b = o.bundle("hostpid", json!({"gpuhook.io/gpus": "1"}), "true");
    let p = b.join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    c["linux"]["namespaces"]
        .as_array_mut()
        .unwrap()
        .retain(|n| n["type"] != "pid");
    std::fs::write(&p, serde_json::to_vec(&c).unwrap()).unwrap();
    let r = o.create(&b, "hostpid-1");
    assert_refused(&r, "needs a PID namespace of its own");
    assert!(!marker.exists());
    // A config that exists but is broken names no runtime: nothing is run, even for a
    // container without a request, and the refusal goes to the runtime's --log too.
    let good_cfg = std::fs::read_to_string(&o.host.config).unwrap();
    common::write_config(&o.host.config, "{\"oci_runtme\": \"/usr/sbin/runc\"}");
    let log = o.host.root().join("runtime-log.json");
    let b = o.bundle("plain", json!({}), "true");
    let r = o
        .wrapper(
            Cgroup::V1,
            &[
                "--log",
                log.to_str().unwrap(),
                "--log-format",
                "json",
                "create",
                "--bundle",
                b.to_str().unwrap(),
                "plain-1",
            ],
        )
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(127), "{}", stderr(&r));
    assert!(
        stderr(&r).contains("refusing to guess which OCI runtime"),
        "{}",
        stderr(&r)
    );
    assert!(!marker.exists());
    let logged: Value =
        serde_json::from_str(std::fs::read_to_string(&log).unwrap().trim()).unwrap();
    assert_eq!(logged["level"], "error");
    assert!(
        logged["msg"].as_str().unwrap().contains("unknown field"),
        "{logged}"
    );
    common::write_config(&o.host.config, &good_cfg);
    // A good request calls it (so the marker above could appear).
    let b = o.bundle("good", json!({"gpuhook.io/gpus": "1"}), "true");
    let r = o.create(&b, "good-1");
    assert_ok(&r);
    assert!(marker.exists());
}

#[test]
fn podman_with_runc_v1_and_crun_v2() {
    for (real, cg) in [(RUNC, Cgroup::V1), (CRUN, Cgroup::V2)] {
        let o = Oci::new(FakeHost::blueprint(), real);
        let r = o
            .podman(
                cg,
                &[
                    "--rm",
                    "--annotation",
                    "gpuhook.io/gpus=1",
                    "--annotation",
                    "gpuhook.io/devices=1",
                ],
                &probe(&["195:1", "195:0"]),
            )
            .output()
            .unwrap();
        assert_ok(&r);
        assert_probe(&r, &["195:1"], &["195:0"]);
        assert!(
            out(&r).contains("node /dev/nvidia1 c3:1 666 0 0"),
            "{real}: {}",
            out(&r)
        );
        assert!(
            o.reservations().is_empty(),
            "{real}: {:?}",
            o.reservations()
        );
        // The same keys as environment variables.
        let r = o
            .podman(
                cg,
                &["--rm", "--env", "GPUHOOK_GPUS=2"],
                &probe(&["195:0", "195:1"]),
            )
            .output()
            .unwrap();
        assert_ok(&r);
        assert_probe(&r, &["195:0", "195:1"], &[]);
        // The runtime as the package's containers.conf snippet names it.
        let conf = snippet(&o, "podman-containers.conf", o.host.root());
        let r = o
            .podman_with(
                cg,
                "gpuhook".as_ref(),
                &o.rootfs,
                &["--rm", "--annotation", "gpuhook.io/gpus=1"],
                &probe(&["195:0"]),
            )
            .env("CONTAINERS_CONF", &conf)
            .output()
            .unwrap();
        assert_ok(&r);
        assert_probe(&r, &["195:0"], &[]);
        // A container without a request gets no GPU.
        let r = o
            .podman(cg, &["--rm"], &probe(&["195:0"]))
            .output()
            .unwrap();
        assert_ok(&r);
        assert_probe(&r, &[], &["195:0"]);
        assert!(!out(&r).contains("node /dev/nvidia"), "{}", out(&r));
    }
}

/// Removes a podman container, waiting (up to 20 s) while podman still tidies it up.
/// [`podman_rm`] of a container made in that cgroup layout.
fn podman_rm_in(cg: Cgroup, id: &str) {
    if cg == Cgroup::V2 {
        let _ = in_cgroup(Cgroup::V2, "podman")
            .args(["--cgroup-manager", "cgroupfs", "rm", "-f", "-t", "0", id])
            .output();
    }
    podman_rm(id);
}

fn podman_rm(id: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let _ = Command::new("podman")
            .args(["rm", "-f", "-t", "0", id])
            .output();
        let left = Command::new("podman")
            .args(["ps", "-a", "-q", "--filter", &format!("name=^{id}$")])
            .output()
            .unwrap();
        let by_id = Command::new("podman")
            .args(["ps", "-a", "-q", "--filter", &format!("id={id}")])
            .output()
            .unwrap();
        if (out(&left).trim().is_empty() && out(&by_id).trim().is_empty())
            || Instant::now() > deadline
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One libvirt domain (its `prepare` hook, as libvirtd runs it) and podman containers
/// contend for the two GPUs of one host: each refusal names the other door's holder.
#[test]
fn libvirt_domain_and_podman_container_share_one_pool() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    podman_rm("gh-oci-share");
    let xml = common::domain("vm1", 1, &common::gpus("count='1'"));
    assert_ok(&o.host.hook("vm1", "prepare", &xml));
    let r = o
        .podman(
            Cgroup::V1,
            &["--rm", "--annotation", "gpuhook.io/gpus=2"],
            "true",
        )
        .output()
        .unwrap();
    assert_refused(&r, "1 held by domain 'vm1'");
    // One GPU is left: the container gets it (not the domain's).
    let r = o
        .podman(
            Cgroup::V1,
            &[
                "-d",
                "--name",
                "gh-oci-share",
                "--annotation",
                "gpuhook.io/gpus=1",
            ],
            "sleep 60",
        )
        .output()
        .unwrap();
    assert_ok(&r);
    let id = out(&r).trim().to_string();
    let list = o.host.list();
    let held: Vec<(String, String)> = list["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["holder"]["kind"].as_str().unwrap_or("-").to_string(),
                g["holder"]["domain"].as_str().unwrap_or("-").to_string(),
            )
        })
        .collect();
    assert_eq!(
        held,
        vec![("libvirt".into(), "vm1".into()), ("oci".into(), id.clone())],
        "{list}"
    );
    let running = &list["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "oci")
        .unwrap()["phase"];
    assert_eq!(running, "running");
    // The domain's second start wants both: refused, naming the container.
    let xml2 = common::domain("vm2", 2, &common::gpus("count='1'"));
    let e = o.host.hook("vm2", "prepare", &xml2);
    common::assert_fails(
        &e,
        "vm2",
        &format!("held by domain 'vm1', container '{id}'"),
    );
    // podman rm -f: the runtime's delete (and poststop) free the container's GPU at once.
    podman_rm(&id);
    let kinds: Vec<String> = o
        .reservations()
        .iter()
        .map(|r| r["kind"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kinds, vec!["libvirt"]);
    assert_ok(&o.host.hook("vm2", "prepare", &xml2));
}

/// 32 `podman run`s at once on a 4-GPU host: exactly 4 get a GPU, the others are refused
/// with one line, and nothing stays held or half-made afterwards.
#[test]
fn thirty_two_concurrent_podman_runs_four_winners_no_leaks() {
    let o = Oci::new(FakeHost::wide(4), RUNC);
    for i in 0..32 {
        podman_rm(&format!("gh-oci-race-{i}"));
    }
    let sync = o.host.root().join("sync");
    std::fs::create_dir_all(&sync).unwrap();
    let release = sync.join("go");
    let vol = format!("{}:/sync", sync.display());
    // Winners wait (up to 60 s) until every loser has been refused.
    let script = "n=0; while [ ! -e /sync/go ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n+1)); done; ls /dev | grep -c '^nvidia[0-9]'";
    let children: Vec<_> = (0..32)
        .map(|i| {
            o.podman(
                Cgroup::V1,
                &[
                    "--rm",
                    "--name",
                    &format!("gh-oci-race-{i}"),
                    "-v",
                    &vol,
                    "--annotation",
                    "gpuhook.io/gpus=1",
                ],
                script,
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    let mut children: Vec<Option<std::process::Child>> = children.into_iter().map(Some).collect();
    let mut results: Vec<Option<Output>> = (0..32).map(|_| None).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut released = false;
    while results.iter().any(Option::is_none) && Instant::now() < deadline {
        for i in 0..32 {
            if let Some(c) = children[i].as_mut() {
                if c.try_wait().unwrap().is_some() {
                    results[i] = Some(children[i].take().unwrap().wait_with_output().unwrap());
                }
            }
        }
        let refused = results
            .iter()
            .flatten()
            .filter(|r| !r.status.success())
            .count();
        if !released && refused >= 28 {
            std::fs::write(&release, "").unwrap();
            released = true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if !released {
        std::fs::write(&release, "").unwrap();
    }
    for c in children.iter_mut().flatten() {
        let _ = c.kill();
    }
    let results: Vec<Output> = results
        .into_iter()
        .map(|r| r.expect("a podman run did not finish in 120 s"))
        .collect();
    let winners: Vec<&Output> = results.iter().filter(|r| r.status.success()).collect();
    assert_eq!(winners.len(), 4, "winners: {}", winners.len());
    for w in &winners {
        assert_eq!(out(w).trim(), "1", "a winner saw other GPUs: {}", out(w));
    }
    for l in results.iter().filter(|r| !r.status.success()) {
        assert_refused(
            l,
            "cannot reserve 1 GPU: only 0 of the host's 4 matching GPUs are free",
        );
    }
    assert!(
        o.reservations().is_empty(),
        "leaked: {:?}",
        o.reservations()
    );
    let ps = Command::new("podman")
        .args(["ps", "-a", "--filter", "name=gh-oci-race", "-q"])
        .output()
        .unwrap();
    assert_eq!(out(&ps).trim(), "", "containers left");
}

/// Crashes between reserve and start, and a container killed with SIGKILL: the next request
/// that needs the GPUs gets them (stale rules), and `list` says who held what before.
#[test]
fn crashed_runtimes_and_killed_containers_leave_nothing_held() {
    // (a) The runtime SIGKILLed in the middle of `create` (a stand-in runtime that hangs
    // where runc would make the container): the reservation names a dead runtime.
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    let hang = o.host.root().join("hanging-runtime");
    std::fs::write(&hang, "#!/bin/sh\nexec sleep 60\n").unwrap();
    std::fs::set_permissions(&hang, std::fs::Permissions::from_mode(0o755)).unwrap();
    let good_cfg: Value = serde_json::from_slice(&std::fs::read(&o.host.config).unwrap()).unwrap();
    let mut cfg = good_cfg.clone();
    cfg["oci_runtime"] = json!(hang);
    common::write_config(&o.host.config, &cfg.to_string());
    let b = o.bundle("crash", json!({"gpuhook.io/gpus": "2"}), "true");
    let mut child = o
        .wrapper(
            Cgroup::V1,
            &["create", "--bundle", b.to_str().unwrap(), "crash-1"],
        )
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while o.reservations().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = o.reservations();
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(
        (r[0]["kind"].as_str(), r[0]["phase"].as_str()),
        (Some("oci"), Some("prepared"))
    );
    assert_eq!(r[0]["stale"], Value::Null);
    // Another create of the same ID meanwhile (another runtime root, a retry) is refused:
    // it neither takes the GPUs over nor moves the reservation.
    let b1 = o.bundle("crash-other", json!({"gpuhook.io/gpus": "1"}), "true");
    let again = o.create(&b1, "crash-1");
    assert_refused(&again, "another create of this container ID holds GPUs");
    assert_eq!(o.reservations(), r);
    child.kill().unwrap();
    child.wait().unwrap();
    let r = o.reservations();
    assert!(
        r[0]["stale"].as_str().unwrap().contains("the runtime"),
        "{r:?}"
    );
    common::write_config(&o.host.config, &good_cfg.to_string());
    // (b) The next container that needs both GPUs gets them; it is then SIGKILLed.
    let b2 = o.bundle("killed", json!({"gpuhook.io/gpus": "2"}), "sleep 60");
    let r = o
        .wrapper(
            Cgroup::V1,
            &["run", "-d", "--bundle", b2.to_str().unwrap(), "killed-1"],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(r.success());
    let r = o.reservations();
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(
        (r[0]["domain"].as_str(), r[0]["phase"].as_str()),
        (Some("killed-1"), Some("running"))
    );
    // A second create of the running container's ID is refused by gpuhook (its runtime would
    // refuse it too) and leaves the reservation as it was.
    let again = o.create(&b2, "killed-1");
    assert_refused(&again, "already runs with GPUs");
    assert_eq!(o.reservations()[0]["phase"], "running");
    // A create of that ID without a request whose runtime cannot be executed (a missing
    // interpreter: ENOENT at exec) reserved nothing, and frees nothing.
    let broken = o.host.root().join("broken-runtime");
    std::fs::write(&broken, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&broken, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut bad_cfg = good_cfg.clone();
    bad_cfg["oci_runtime"] = json!(broken);
    let bad_path = o.host.root().join("broken-config.json");
    common::write_config(&bad_path, &bad_cfg.to_string());
    let plain = o.bundle("plain-again", json!({}), "true");
    let r = Command::new(&o.link)
        .env("GPUHOOK_CONFIG", &bad_path)
        .args(["create", "--bundle", plain.to_str().unwrap(), "killed-1"])
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(127), "{}", stderr(&r));
    assert_eq!(o.reservations()[0]["phase"], "running");
    // `delete --force` of that ID under another runtime root exits 0 (runc knows no such
    // container there): the running container keeps its GPUs.
    let mut other = Command::new(&o.link);
    other
        .env("GPUHOOK_CONFIG", &o.host.config)
        .args(["--root"])
        .arg(o.host.root().join("another-root"))
        .args(["delete", "--force", "killed-1"]);
    assert_ok(&other.output().unwrap());
    assert_eq!(o.reservations()[0]["phase"], "running");
    let pid = o.reservations()[0]["init_pid"].as_i64().unwrap() as i32;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while o.reservations()[0]["stale"].is_null() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(o.reservations()[0]["stale"]
        .as_str()
        .unwrap()
        .contains("init"));
    // Nobody deleted it; a libvirt domain that needs both GPUs gets them.
    let xml = common::domain("vm-after", 3, &common::gpus("count='2'"));
    assert_ok(&o.host.hook("vm-after", "prepare", &xml));
    let _ = o
        .wrapper(Cgroup::V1, &["delete", "--force", "killed-1"])
        .output();
    // A container whose ID is the domain's UUID (a valid runc ID) cannot take its key,
    // and its delete does not free the domain's reservation.
    let uuid = common::uuid(3);
    let b3 = o.bundle("collide", json!({"gpuhook.io/gpus": "1"}), "true");
    let r = o.create(&b3, &uuid);
    assert_refused(&r, "is already the key of domain 'vm-after''s reservation");
    let _ = o.wrapper(Cgroup::V1, &["delete", &uuid]).output();
    // The domain's reservation survives the containers' deletes.
    let kinds: Vec<Value> = o.reservations().iter().map(|r| r["kind"].clone()).collect();
    assert_eq!(kinds, vec![json!("libvirt")]);
    // And the reverse: a libvirt stop hook for a domain whose UUID is a (created, not yet
    // started) container's ID leaves the container's reservation alone.
    assert_ok(&o.host.hook("vm-after", "stopped", &xml));
    let id5 = common::uuid(5);
    let b5 = o.bundle("created", json!({"gpuhook.io/gpus": "1"}), "true");
    let r = o
        .wrapper(
            Cgroup::V1,
            &["create", "--bundle", b5.to_str().unwrap(), &id5],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(r.success());
    let xml5 = common::domain("vm-five", 5, &common::gpus("count='1'"));
    assert_ok(&o.host.hook("vm-five", "stopped", &xml5));
    let held: Vec<(Value, Value)> = o
        .reservations()
        .iter()
        .map(|r| (r["kind"].clone(), r["phase"].clone()))
        .collect();
    assert_eq!(held, vec![(json!("oci"), json!("running"))]);
    let r = o
        .wrapper(Cgroup::V1, &["delete", "--force", &id5])
        .output()
        .unwrap();
    assert_ok(&r);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// podman's conmon SIGKILLed, then the container's init: nobody is left to run the
/// runtime's delete, and the next request that needs the GPU still gets it.
#[test]
fn conmon_killed_then_init_killed_frees_on_next_request() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    podman_rm("gh-oci-conmon");
    let r = o
        .podman(
            Cgroup::V1,
            &[
                "-d",
                "--name",
                "gh-oci-conmon",
                "--annotation",
                "gpuhook.io/gpus=2",
            ],
            "sleep 60",
        )
        .output()
        .unwrap();
    assert_ok(&r);
    let id = out(&r).trim().to_string();
    let inspect = |f: &str| -> i32 {
        let o = Command::new("podman")
            .args(["inspect", "--format", f, &id])
            .output()
            .unwrap();
        out(&o).trim().parse().unwrap()
    };
    let (conmon, init) = (inspect("{{.State.ConmonPid}}"), inspect("{{.State.Pid}}"));
    use nix::sys::signal::{kill, SIGKILL};
    use nix::unistd::Pid;
    kill(Pid::from_raw(conmon), SIGKILL).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // The container outlives its conmon: its GPUs stay its own.
    one_more_is_refused(&o, &id);
    kill(Pid::from_raw(init), SIGKILL).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = o
            .podman(
                Cgroup::V1,
                &["--rm", "--annotation", "gpuhook.io/gpus=2"],
                &probe(&["195:0", "195:1"]),
            )
            .output()
            .unwrap();
        if r.status.success() {
            assert_probe(&r, &["195:0", "195:1"], &[]);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "GPUs never freed: {}",
            stderr(&r)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    podman_rm(&id);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// A request for one more GPU is refused, naming the container `id` that holds them.
fn one_more_is_refused(o: &Oci, id: &str) {
    let r = o
        .podman(
            Cgroup::V1,
            &["--rm", "--annotation", "gpuhook.io/gpus=1"],
            "true",
        )
        .output()
        .unwrap();
    assert_refused(&r, &format!("held by container '{id}'"));
}

/// A container's init names itself with bytes that are not UTF-8 (no privilege needed):
/// it still runs, so its GPUs stay its own. (Read as text, its `/proc/PID/stat` did not
/// parse, the init looked gone and the next request reclaimed every GPU it held.)
#[test]
fn init_with_a_name_that_is_not_utf8_keeps_its_gpus() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    podman_rm("gh-oci-comm");
    let r = o
        .podman(
            Cgroup::V1,
            &[
                "-d",
                "--name",
                "gh-oci-comm",
                "--annotation",
                "gpuhook.io/gpus=2",
            ],
            r"printf '\377\376' > /proc/self/comm; while :; do sleep 1; done",
        )
        .output()
        .unwrap();
    assert_ok(&r);
    let id = out(&r).trim().to_string();
    let o2 = Command::new("podman")
        .args(["inspect", "--format", "{{.State.Pid}}", &id])
        .output()
        .unwrap();
    let init: i32 = out(&o2).trim().parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read(format!("/proc/{init}/comm")).unwrap_or_default() != b"\xff\xfe\n" {
        assert!(Instant::now() < deadline, "the init did not rename itself");
        std::thread::sleep(Duration::from_millis(50));
    }
    one_more_is_refused(&o, &id);
    let held = o.reservations();
    assert_eq!(held.len(), 1, "{held:?}");
    podman_rm(&id);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// One of the engine snippets the package ships (`hooks/`), with `/usr/bin/gpuhook-runtime`
/// replaced by this test's wrapper, written into `dir`.
fn snippet(o: &Oci, name: &str, dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("hooks")
            .join(name),
    )
    .unwrap();
    assert!(text.contains("/usr/bin/gpuhook-runtime"), "{name}");
    let p = dir.join(name);
    std::fs::write(
        &p,
        text.replace("/usr/bin/gpuhook-runtime", o.runtime.to_str().unwrap()),
    )
    .unwrap();
    p
}

/// A dockerd of this test's own (its own data, exec root and socket), with gpuhook-runtime
/// added as runtime `gpuhook`; stopped when dropped.
struct Docker {
    child: std::process::Child,
    sock: String,
}

impl Docker {
    fn start(o: &Oci) -> Docker {
        let d = o.host.root().join("docker");
        std::fs::create_dir_all(&d).unwrap();
        let sock = format!("unix://{}/docker.sock", d.display());
        let log = std::fs::File::create(d.join("dockerd.log")).unwrap();
        let child = Command::new("dockerd")
            .arg("--data-root")
            .arg(d.join("data"))
            .arg("--exec-root")
            .arg(d.join("exec"))
            .arg("--pidfile")
            .arg(d.join("docker.pid"))
            .args(["-H", &sock, "--iptables=false", "--ip6tables=false"])
            .args(["--bridge=none", "--storage-driver", "vfs"])
            // The package's snippet (hooks/docker-daemon.json), pointed at this test's wrapper.
            .arg("--config-file")
            .arg(snippet(o, "docker-daemon.json", &d))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("dockerd (Debian package docker.io)");
        let dk = Docker { child, sock };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !dk.cli(&["info"]).output().unwrap().status.success() {
            assert!(
                Instant::now() < deadline,
                "dockerd did not start: {}",
                std::fs::read_to_string(d.join("dockerd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // The image: the busybox rootfs, imported from a tarball (no registry).
        let tar = Command::new("tar")
            .arg("-C")
            .arg(&o.rootfs)
            .args(["-c", "."])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut tar = tar;
        let imp = dk
            .cli(&["import", "-", "gh-busybox:test"])
            .stdin(tar.stdout.take().unwrap())
            .output()
            .unwrap();
        assert_ok(&imp);
        assert!(tar.wait().unwrap().success());
        dk
    }

    fn cli(&self, args: &[&str]) -> Command {
        let mut c = Command::new("docker");
        c.env("DOCKER_HOST", &self.sock).args(args);
        c
    }

    fn run(&self, env: &[&str], script: &str) -> Output {
        let mut c = self.cli(&[
            "run",
            "--rm",
            "--runtime",
            "gpuhook",
            "--network",
            "none",
            "--cap-add",
            "MKNOD",
        ]);
        for e in env {
            c.args(["-e", e]);
        }
        c.args(["gh-busybox:test", "sh", "-c", script])
            .output()
            .unwrap()
    }
}

impl Drop for Docker {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// docker (dockerd --add-runtime) with runc: docker 20.10 has no `--annotation`, so the
/// request comes as environment variables; a refusal reaches the docker user through the
/// runtime's `--log` file, which containerd's shim reads.
#[test]
fn docker_with_runc() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    let dk = Docker::start(&o);
    let r = dk.run(
        &["GPUHOOK_GPUS=1", "GPUHOOK_DEVICES=1"],
        &probe(&["195:1", "195:0"]),
    );
    assert_ok(&r);
    assert_probe(&r, &["195:1"], &["195:0"]);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
    let r = dk.run(&["GPUHOOK_GPUS=3"], "true");
    assert_refused(
        &r,
        "cannot reserve 3 GPUs: only 2 of the host's 2 matching GPUs are free",
    );
    let r = dk.run(&[], &probe(&["195:0"]));
    assert_ok(&r);
    assert_probe(&r, &[], &["195:0"]);
    assert!(!o.host.state.exists() || o.reservations().is_empty());
    let ps = dk.cli(&["ps", "-aq"]).output().unwrap();
    assert_eq!(out(&ps).trim(), "");
}

/// podman's arguments asking for one GPU with the driver's user space.
const CDI_ONE_GPU: [&str; 4] = [
    "--annotation",
    "gpuhook.io/gpus=1",
    "--annotation",
    "gpuhook.io/driver=cdi",
];

/// `podman run --rm` through gpuhook-runtime of `rootfs` (not the busybox one) with `script`.
fn podman_rootfs(o: &Oci, rootfs: &Path, extra: &[&str], script: &str) -> Output {
    let mut args = vec!["--rm"];
    args.extend_from_slice(extra);
    o.podman_with(Cgroup::V1, o.runtime.as_os_str(), rootfs, &args, script)
        .output()
        .unwrap()
}

/// A container with its own root filesystem gets the host driver's user space from the CDI
/// spec `nvidia-ctk cdi generate` writes: the libraries, nvidia-smi, firmware and socket
/// mounted read-only, nosuid, nodev at the spec's paths, the symlinks and the linker cache
/// made by gpuhook (ldconfig -p and dlopen("libcuda.so.1") work inside), the hooks gpuhook
/// does not do itself passed to runc, the spec's environment set; only its own GPU.
#[test]
fn podman_rootfs_gets_the_driver_from_cdi() {
    let fake = FakeHost::blueprint();
    let o = Oci::new(fake.clone(), RUNC);
    let drv = o.host.with_cdi(&fake);
    let rootfs = testbed::driver::rootfs(&o.host.root().join("cdi-rootfs")).unwrap();
    let marker = format!("gh-{}", std::process::id());
    let script = format!(
        "{}\necho \"env $NVIDIA_VISIBLE_DEVICES $NVIDIA_CTK_LIBCUDA_DIR {marker}\"\nls /dev",
        common::CDI_PROBE
    );
    let r = podman_rootfs(&o, &rootfs, &CDI_ONE_GPU, &script);
    let s = out(&r);
    assert!(r.status.success(), "{s}");
    common::assert_cdi_probe(&s);
    assert!(
        s.contains(&format!("env void /usr/lib/x86_64-linux-gnu {marker}")),
        "{s}"
    );
    // The spec's control nodes, nvidia-modeset included.
    for n in [
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
        "nvidia-modeset",
    ] {
        assert!(s.lines().any(|l| l == n), "{n}: {s}");
    }
    // The hooks gpuhook does not do itself ran (as runc runs createContainer hooks).
    let log = std::fs::read_to_string(drv.root.join("cdi-hook.log")).unwrap_or_default();
    for h in [
        "enable-cuda-compat --host-driver-version=535.129.03",
        "disable-device-node-modification",
    ] {
        assert!(log.contains(h), "{h}: {log}");
    }
    assert!(
        !log.contains("create-symlinks") && !log.contains("update-ldcache"),
        "{log}"
    );
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// The image carries a block device node (a loop device over a file of zeros) at
/// `/etc/ld.so.cache~`, where glibc's `ldconfig` opens its temporary cache without
/// `O_EXCL`: the `createContainer` hook's `ldconfig` sees the root only through `nodev`
/// mounts and writes its cache to a tmpfs of its own: the device is never written, the
/// container gets a working cache.
#[test]
fn cdi_ldconfig_never_writes_a_planted_node() {
    let fake = FakeHost::blueprint();
    let o = Oci::new(fake.clone(), RUNC);
    o.host.with_cdi(&fake);
    let rootfs = testbed::driver::rootfs(&o.host.root().join("cdi-planted")).unwrap();
    let lo = common::PlantedLoop::new(o.host.root());
    lo.plant(&rootfs.join("etc/ld.so.cache~"));
    let r = podman_rootfs(&o, &rootfs, &CDI_ONE_GPU, common::CDI_PROBE);
    let s = out(&r);
    assert!(r.status.success(), "{s}\nstderr: {}", stderr(&r));
    common::assert_cdi_probe(&s);
    assert!(lo.untouched(), "ldconfig wrote through the planted node");
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
    // The image points ldconfig's auxiliary cache directory through its /proc at the root
    // of the runtime's init (still the host's when createContainer hooks run), at a host
    // directory: refused in one line, nothing written on the host.
    let host_dir = o.host.root().join("host-dir");
    std::fs::create_dir_all(&host_dir).unwrap();
    std::fs::create_dir_all(rootfs.join("var/cache")).unwrap();
    let _ = std::fs::remove_dir_all(rootfs.join("var/cache/ldconfig"));
    std::os::unix::fs::symlink(
        format!("/proc/1/root{}", host_dir.display()),
        rootfs.join("var/cache/ldconfig"),
    )
    .unwrap();
    let r = podman_rootfs(&o, &rootfs, &CDI_ONE_GPU, "echo STARTED");
    assert!(!out(&r).contains("STARTED"));
    assert_refused(
        &r,
        "container /var/cache/ldconfig is not a directory; refusing to run ldconfig",
    );
    assert!(std::fs::read_dir(&host_dir).unwrap().next().is_none());
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// A user-namespaced podman container (its root is host uid 100000) with its own root
/// and `driver=cdi`: the `createContainer` hook runs in the container's user namespace, so
/// the ldconfig sandbox (its namespaces, the nodev copy of the root, the tmpfs for the
/// cache) is made with the capabilities of that namespace only; the cache is the
/// container root's, and the planted node is not written either.
#[test]
fn cdi_in_a_user_namespace() {
    let fake = FakeHost::blueprint();
    let o = Oci::new(fake.clone(), RUNC);
    let drv = o.host.with_cdi(&fake);
    // (The fake driver's passed hooks log there; in the user namespace they run as an
    // unmapped uid.)
    let log = drv.root.join("cdi-hook.log");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .unwrap();
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(std::fs::Permissions::from_mode(0o666))
        .unwrap();
    let rootfs = testbed::driver::rootfs(&o.host.root().join("cdi-userns")).unwrap();
    let lo = common::PlantedLoop::new(o.host.root());
    lo.plant(&rootfs.join("etc/ld.so.cache~"));
    let st = Command::new("chown")
        .args(["-R", "-h", "100000:100000"])
        .arg(&rootfs)
        .status()
        .unwrap();
    assert!(st.success());
    let mut args = vec!["--uidmap", "0:100000:65536", "--gidmap", "0:100000:65536"];
    args.extend_from_slice(&CDI_ONE_GPU);
    let r = podman_rootfs(&o, &rootfs, &args, common::CDI_PROBE);
    let s = out(&r);
    assert!(r.status.success(), "{s}{}", stderr(&r));
    common::assert_cdi_probe(&s);
    assert!(lo.untouched(), "ldconfig wrote through the planted node");
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(rootfs.join("etc/ld.so.cache")).unwrap();
    assert_eq!((m.uid(), m.gid()), (100000, 100000));
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// The spec's text without its hooks that gpuhook does not do itself (each hook a block of
/// lines from `- hookName:` on).
fn without_foreign_hooks(spec: &str) -> String {
    let mut out = String::new();
    let mut block = String::new();
    let flush = |block: &mut String, out: &mut String| {
        if !block.contains("create-symlinks") && !block.contains("update-ldcache") {
            block.clear();
        }
        out.push_str(block);
        block.clear();
    };
    for l in spec.lines() {
        if l == "        - hookName: createContainer" {
            flush(&mut block, &mut out);
            block.push_str(l);
            block.push('\n');
        } else if !block.is_empty() && l.starts_with("          ") {
            block.push_str(l);
            block.push('\n');
        } else {
            if !block.is_empty() {
                flush(&mut block, &mut out);
            }
            out.push_str(l);
            out.push('\n');
        }
    }
    flush(&mut block, &mut out);
    out
}

/// `"cdi_foreign_hooks": "refuse"`: the nvidia-ctk-shaped spec's hooks that gpuhook does not
/// do itself (`enable-cuda-compat`, …) would run as root against the image; with the switch
/// the podman user gets one line naming the hook and the spec file, the runtime never runs
/// (nothing started), nothing stays reserved. The same spec without them works. (The fake
/// hooks' log is shared by the tests running at once: not looked at here.)
#[test]
fn cdi_foreign_hooks_refused_on_request() {
    let fake = FakeHost::blueprint();
    let o = Oci::new(fake.clone(), RUNC);
    let drv = o.host.with_cdi(&fake);
    o.host
        .edit_config(|c| c["cdi_foreign_hooks"] = json!("refuse"));
    let spec = o.host.root().join("cdi/run/nvidia.yaml");
    let rootfs = testbed::driver::rootfs(&o.host.root().join("cdi-rootfs")).unwrap();
    let r = podman_rootfs(&o, &rootfs, &CDI_ONE_GPU, "echo STARTED");
    assert!(!out(&r).contains("STARTED"));
    assert_refused(
        &r,
        &format!(
            "CDI spec {}: createContainer hook {} enable-cuda-compat is not one gpuhook does itself, and the host config refuses such hooks (\"cdi_foreign_hooks\": \"refuse\")",
            spec.display(),
            drv.root.join("usr/bin/nvidia-cdi-hook").display()
        ),
    );
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
    let text = std::fs::read_to_string(&spec).unwrap();
    let stripped = without_foreign_hooks(&text);
    assert!(
        !stripped.contains("enable-cuda-compat") && stripped.contains("update-ldcache"),
        "{stripped}"
    );
    common::write_config(&spec, &stripped);
    let r = podman_rootfs(&o, &rootfs, &CDI_ONE_GPU, common::CDI_PROBE);
    let s = out(&r);
    assert!(r.status.success(), "{s}{}", stderr(&r));
    common::assert_cdi_probe(&s);
    assert!(o.reservations().is_empty());
}

/// A hostile image: `/usr/lib` a symlink to the host's-looking `/etc` (the createContainer
/// hook runs before the runtime enters the root: followed, it would write on the host).
/// Refused before the runtime runs, nothing reserved; a bad spec the same.
#[test]
fn cdi_refuses_symlinked_rootfs_and_bad_specs() {
    let fake = FakeHost::blueprint();
    let o = Oci::new(fake.clone(), RUNC);
    o.host.with_cdi(&fake);
    let rootfs = testbed::driver::rootfs(&o.host.root().join("cdi-rootfs")).unwrap();
    std::fs::create_dir_all(rootfs.join("elsewhere")).unwrap();
    std::fs::remove_dir_all(rootfs.join("usr/lib")).unwrap();
    std::os::unix::fs::symlink("/elsewhere", rootfs.join("usr/lib")).unwrap();
    let ann = CDI_ONE_GPU;
    let r = podman_rootfs(&o, &rootfs, &ann, "true");
    assert_refused(&r, "container /usr/lib is a symlink; refusing to follow it");
    assert!(o.reservations().is_empty());
    assert!(std::fs::read_dir(rootfs.join("elsewhere"))
        .unwrap()
        .next()
        .is_none());
    // A spec for another driver version: one line, nothing started or reserved.
    let good = testbed::driver::rootfs(&o.host.root().join("cdi-rootfs2")).unwrap();
    let spec = o.host.root().join("cdi/run/nvidia.yaml");
    let text = std::fs::read_to_string(&spec).unwrap();
    common::write_config(&spec, &text.replace("535.129.03", "550.54.15"));
    let r = podman_rootfs(&o, &good, &ann, "echo STARTED");
    assert!(!out(&r).contains("STARTED"));
    assert_refused(&r, "the spec is for another driver");
    assert!(o.reservations().is_empty());
    // No spec at all.
    std::fs::remove_file(&spec).unwrap();
    let r = podman_rootfs(&o, &good, &ann, "echo STARTED");
    assert_refused(&r, "no CDI spec for nvidia.com/gpu in");
    assert!(o.reservations().is_empty());
}

/// An `amd-ctk cdi generate`-shaped JSON spec on a host with NVIDIA, AMD and Intel GPUs:
/// an AMD request with `driver=cdi` gets its GPU's card and render nodes and `/dev/kfd`
/// from the spec (numbers checked against the host's nodes), nothing of the other AMD
/// GPU; an NVIDIA request on the same host, which has no NVIDIA spec, is refused in one
/// line naming the generator.
#[test]
fn cdi_amd_json_spec() {
    let fake = FakeHost::mixed();
    let o = Oci::new(fake.clone(), RUNC);
    let run = o.host.root().join("cdi/run");
    std::fs::create_dir_all(&run).unwrap();
    common::write_config(
        &run.join("amd.json"),
        &testbed::driver::amd_spec(&fake, &o.host.paths),
    );
    o.host
        .edit_config(|c| c["cdi_spec_dirs"] = json!(["/nonexistent/etc/cdi", run]));
    let ann = |vendor: &str| {
        vec![
            "--rm".to_string(),
            "--annotation".into(),
            format!("gpuhook.io/vendor={vendor}"),
            "--annotation".into(),
            "gpuhook.io/driver=cdi".into(),
        ]
    };
    let a = ann("amd");
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let r = o
        .podman(Cgroup::V1, &a, "ls /dev /dev/dri")
        .output()
        .unwrap();
    let s = out(&r);
    assert!(r.status.success(), "{s}{}", stderr(&r));
    assert!(s.lines().any(|l| l == "kfd"), "{s}");
    let dri: Vec<&str> = s
        .lines()
        .filter(|l| l.starts_with("card") || l.starts_with("renderD"))
        .collect();
    assert_eq!(dri.len(), 2, "its card and render node only: {s}");
    let n = ann("nvidia");
    let n: Vec<&str> = n.iter().map(String::as_str).collect();
    let r = o.podman(Cgroup::V1, &n, "true").output().unwrap();
    assert_refused(
        &r,
        "no CDI spec for nvidia.com/gpu in /nonexistent/etc/cdi, ",
    );
    assert!(o.reservations().is_empty());
}

/// A merged-`/usr` image and a spec from a merged-`/usr` host (paths under `/lib`): the
/// runtime mounts through `/lib -> usr/lib`, gpuhook's hook follows exactly that link for the
/// symlinks and the cache; the driver works inside.
#[test]
fn cdi_merged_usr_image() {
    let fake = FakeHost::blueprint();
    let o = Oci::new(fake.clone(), RUNC);
    o.host.with_cdi(&fake);
    let spec = o.host.root().join("cdi/run/nvidia.yaml");
    let text = std::fs::read_to_string(&spec).unwrap();
    common::write_config(&spec, &common::spec_under_lib(&text));
    let rootfs = testbed::driver::rootfs(&o.host.root().join("cdi-rootfs")).unwrap();
    common::merge_usr(&rootfs);
    let r = podman_rootfs(&o, &rootfs, &CDI_ONE_GPU, common::CDI_PROBE);
    let s = out(&r);
    assert!(r.status.success(), "{s}{}", stderr(&r));
    common::assert_cdi_merged(&s);
}

/// Hole 3 under podman: a process in a GPU container passes its descriptor of the GPU's node
/// over a unix socket to a process on the host, which keeps it after `podman rm`. The GPU
/// is draining: listed with that PID, the next container asking for it is refused naming
/// the PID and its command; once the holder exits the next container gets it. The
/// container really opens the node: the fake GPU has the numbers of `/dev/full`
/// ([`common::openable`]; a driverless node cannot be opened, and an `O_PATH` descriptor
/// holds no GPU).
#[test]
fn podman_gpu_kept_open_outside_drains() {
    let o = Oci::new(common::blueprint_minors(241, 242), RUNC);
    common::openable(&o.host.paths.dev.join("nvidia241"));
    podman_rm("gh-oci-drain");
    let sync = o.host.root().join("sync");
    std::fs::create_dir_all(&sync).unwrap();
    let keeper = common::fdkeeper(o.host.root());
    std::fs::copy(&keeper, o.rootfs.join("bin/fdkeeper")).unwrap();
    let (sock, mark) = (sync.join("drain.sock"), sync.join("drain.got"));
    let mut recv = common::fd_receiver(&keeper, &sock, &mark);
    let vol = format!("{}:/sync", sync.display());
    let one = ["--annotation", "gpuhook.io/devices=0"];
    let r = o
        .podman(
            Cgroup::V1,
            &[&["-d", "--name", "gh-oci-drain", "-v", &vol][..], &one[..]].concat(),
            "fdkeeper send /sync/drain.sock /dev/nvidia241 && sleep 600",
        )
        .output()
        .unwrap();
    assert_ok(&r);
    let id = out(&r).trim().to_string();
    assert!(common::wait_mark(&mark), "the descriptor never came out");
    let pid = recv.id();
    podman_rm(&id);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
    let l = o.host.list();
    assert_eq!(
        common::gpu_of(&l, "0000:07:00.0")["draining"],
        json!([pid]),
        "{l}"
    );
    let r = o
        .podman(Cgroup::V1, &[&["--rm"][..], &one[..]].concat(), "true")
        .output()
        .unwrap();
    assert_refused(
        &r,
        &format!("GPU 0000:07:00.0 (index 0) is held by pid {pid} (fdkeeper), which still has 0000:07:00.0 open after container '{id}' (draining)"),
    );
    recv.kill();
    let r = o
        .podman(
            Cgroup::V1,
            &[&["--rm"][..], &one[..]].concat(),
            "stat -c '%t:%T' /dev/nvidia241 && head -c 1 /dev/nvidia241 >/dev/null && echo opened",
        )
        .output()
        .unwrap();
    assert_ok(&r);
    assert_eq!(out(&r), "1:7\nopened\n", "{}", stderr(&r));
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
    assert_eq!(
        common::gpu_of(&o.host.list(), "0000:07:00.0")["draining"],
        json!([])
    );
}

/// `podman exec` of a script in a running container (through the runtime it was made with).
fn podman_exec(id: &str, script: &str) -> Output {
    podman_exec_in(Cgroup::V1, id, script)
}

/// [`podman_exec`] in that cgroup layout (the one the container was made in).
fn podman_exec_in(cg: Cgroup, id: &str, script: &str) -> Output {
    let mut c = in_cgroup(cg, "podman");
    if cg == Cgroup::V2 {
        c.args(["--cgroup-manager", "cgroupfs"]);
    }
    c.args(["exec", id, "sh", "-c", script])
        .output()
        .expect("podman exec")
}

/// `gpuhook ARGS… --json` on the fake host, which must succeed: what it printed.
fn gh_json(o: &Oci, args: &[&str]) -> Value {
    let r = o.host.cmd().args(args).output().unwrap();
    assert_ok(&r);
    serde_json::from_slice(&r.stdout).unwrap()
}

/// A running podman container's init (host PID).
fn init_pid(id: &str) -> String {
    let o = Command::new("podman")
        .args(["inspect", "-f", "{{.State.Pid}}", id])
        .output()
        .unwrap();
    assert_ok(&o);
    out(&o).trim().to_string()
}

/// The `devices.list` of a running podman container's v1 devices cgroup (its init's).
fn devices_list(id: &str) -> Vec<String> {
    let pid = init_pid(id);
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = cg
        .lines()
        .find_map(|l| l.split_once(":devices:").map(|(_, p)| p.to_string()))
        .expect("a v1 devices cgroup");
    let list = std::fs::read_to_string(format!("/sys/fs/cgroup/devices{path}/devices.list"))
        .expect("devices.list");
    list.lines().map(str::to_string).collect()
}

/// A detached podman container (runc, cgroup v1) named `name`, through gpuhook-runtime,
/// with these options, running `script`; its ID.
fn podman_detached(o: &Oci, name: &str, extra: &[&str], script: &str) -> String {
    podman_rm(name);
    let r = o
        .podman(
            Cgroup::V1,
            &[&["-d", "--name", name][..], extra].concat(),
            script,
        )
        .output()
        .unwrap();
    assert_ok(&r);
    out(&r).trim().to_string()
}

/// Whether root in the container may open the node `major:minor` (ENXIO: its device cgroup
/// allows it, no driver behind the fake major) or not (EPERM), through a node it makes.
fn open_in(id: &str, mm: &str) -> &'static str {
    open_in_cg(Cgroup::V1, id, mm)
}

/// [`open_in`] for a container made in that cgroup layout.
fn open_in_cg(cg: Cgroup, id: &str, mm: &str) -> &'static str {
    let (ma, mi) = mm.split_once(':').unwrap();
    let r = podman_exec_in(
        cg,
        id,
        &format!(
            "rm -f /dev/probe; mknod /dev/probe c {ma} {mi}; cat /dev/probe; rm -f /dev/probe"
        ),
    );
    let e = stderr(&r);
    // A real device (1:3, /dev/null) opens and reads without a word.
    if e.contains("No such device or address") || (r.status.success() && e.trim().is_empty()) {
        "open"
    } else if e.contains("Operation not permitted") {
        "denied"
    } else {
        panic!("{mm}: {e}")
    }
}

/// A podman (runc, cgroup v1) container started with one of the blueprint's GPUs gets the
/// second by `gpuhook attach` (node, exact grant, openable), gives it back by `detach` (node
/// and grant gone), and its removal frees everything, the attached GPU included.
#[test]
fn oci_attach_and_detach_in_a_running_podman_container() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    let id = podman_detached(
        &o,
        "gh-oci-hp1",
        &["--annotation", "gpuhook.io/devices=0"],
        "sleep 600",
    );
    assert_eq!(o.host.holders()[&id], ["0000:07:00.0"]);
    assert_eq!(open_in(&id, "195:1"), "denied");
    let a = o.host.cmd().args(["attach", &id]).output().unwrap();
    assert_ok(&a);
    assert!(
        out(&a).contains(&format!("attached 0000:08:00.0 to container '{id}'")),
        "{}",
        out(&a)
    );
    assert_eq!(o.host.holders()[&id], ["0000:07:00.0", "0000:08:00.0"]);
    let ls = podman_exec(&id, "ls /dev");
    assert!(out(&ls).lines().any(|l| l == "nvidia1"), "{}", out(&ls));
    assert!(
        devices_list(&id).iter().any(|l| l == "c 195:1 rw"),
        "{:?}",
        devices_list(&id)
    );
    let r = podman_exec(&id, "cat /dev/nvidia1");
    assert!(
        stderr(&r).contains("No such device or address"),
        "{}",
        stderr(&r)
    );
    assert_eq!(open_in(&id, "195:1"), "open");
    // Nothing more to give: refused in one line naming the holders.
    let e = o.host.cmd().args(["attach", &id]).output().unwrap();
    assert!(!e.status.success());
    assert_eq!(stderr(&e).trim().lines().count(), 1, "{}", stderr(&e));
    let j = gh_json(&o, &["detach", &id, "--device", "0000:08:00.0", "--json"]);
    assert_eq!(j["detached"], json!(["0000:08:00.0"]), "{j}");
    assert_eq!(j["holder"]["kind"], json!("oci"), "{j}");
    assert_eq!(o.host.holders()[&id], ["0000:07:00.0"]);
    let ls = podman_exec(&id, "ls /dev");
    assert!(!out(&ls).lines().any(|l| l == "nvidia1"), "{}", out(&ls));
    assert!(out(&ls).lines().any(|l| l == "nvidia0"), "{}", out(&ls));
    assert!(
        !devices_list(&id).iter().any(|l| l == "c 195:1 rw"),
        "{:?}",
        devices_list(&id)
    );
    assert_eq!(open_in(&id, "195:1"), "denied");
    assert_eq!(open_in(&id, "195:0"), "open", "its own GPU stays");
    // Attached again, then removed: the stop frees both.
    assert_ok(
        &o.host
            .cmd()
            .args(["attach", &id, "--device", "1"])
            .output()
            .unwrap(),
    );
    assert_eq!(o.host.holders()[&id].len(), 2);
    podman_rm(&id);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// On cgroup v1 a grant given to a cgroup does not reach those below it: a container whose
/// init moved below the devices cgroup its runtime made (runc's `cgroup_paths`) is refused
/// attach and detach in one line, nothing changed; back where runc put it, both work.
#[test]
fn oci_hotplug_refused_where_the_init_moved_below_its_devices_cgroup_on_cgroup_v1() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    let id = podman_detached(
        &o,
        "gh-oci-moved-v1",
        &["--annotation", "gpuhook.io/devices=0"],
        "sleep 600",
    );
    let made = init_cgroup_dir(&id);
    let below = made.join("moved");
    let pid = init_pid(&id);
    let move_init = |to: &Path| std::fs::write(to.join("cgroup.procs"), &pid).unwrap();
    std::fs::create_dir_all(&below).unwrap();
    move_init(&below);
    for args in [
        vec!["attach", id.as_str(), "--device", "1"],
        vec!["detach", id.as_str(), "--device", "0000:07:00.0"],
    ] {
        let r = o.host.cmd().args(&args).output().unwrap();
        assert_refused(&r, "where its runtime put it (cgroup v1");
        assert_eq!(o.host.holders()[&id], ["0000:07:00.0"], "{args:?}");
    }
    assert_eq!(open_in(&id, "195:0"), "open");
    move_init(&made);
    std::fs::remove_dir(&below).unwrap();
    let j = gh_json(&o, &["detach", &id, "--device", "0000:07:00.0", "--json"]);
    assert_eq!(j["detached"], json!(["0000:07:00.0"]), "{j}");
    assert_eq!(open_in(&id, "195:0"), "denied");
    podman_rm(&id);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// An init that left the mount namespace its runtime made (it unshared its own, as a
/// container with `CAP_SYS_ADMIN` and no seccomp filter may) is refused hotplug in one line,
/// nothing changed: gpuhook would make nodes and mounts in a namespace the container chose
/// (the hostile review of issue 31; the old code attached there). The namespaces are those
/// gpuhook-runtime's createRuntime hook recorded.
#[test]
fn oci_hotplug_refused_for_an_init_that_left_its_mount_namespace() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    let id = podman_detached(
        &o,
        "gh-oci-unshared",
        &[
            "--annotation",
            "gpuhook.io/devices=0",
            "--cap-add",
            "sys_admin",
        ],
        "exec busybox unshare -m sleep 600",
    );
    let pid = init_pid(&id);
    let t = Instant::now();
    while std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default() != "sleep\n" {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the init never slept"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for args in [
        vec!["attach", id.as_str(), "--device", "1"],
        vec!["detach", id.as_str(), "--device", "0000:07:00.0"],
    ] {
        let r = o.host.cmd().args(&args).output().unwrap();
        assert_refused(&r, "has left the mount namespace its runtime made");
        assert_eq!(o.host.holders()[&id], ["0000:07:00.0"], "{args:?}");
    }
    podman_rm(&id);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// A container started without a request gets a GPU by attach (found through runc's state:
/// gpuhook recorded nothing of it), and its removal frees it.
#[test]
fn oci_attach_to_a_podman_container_that_asked_for_none() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    let id = podman_detached(&o, "gh-oci-hp2", &[], "sleep 600");
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
    let j = gh_json(&o, &["attach", &id, "--device", "0000:08:00.0", "--json"]);
    assert_eq!(j["attached"], json!(["0000:08:00.0"]), "{j}");
    assert!(
        j["devices"]
            .as_array()
            .unwrap()
            .contains(&json!("/dev/nvidia1")),
        "{j}"
    );
    assert_eq!(o.host.holders()[&id], ["0000:08:00.0"]);
    let r = podman_exec(&id, "cat /dev/nvidia1; cat /dev/nvidiactl");
    assert_eq!(
        stderr(&r).matches("No such device or address").count(),
        2,
        "{}",
        stderr(&r)
    );
    assert!(devices_list(&id).iter().any(|l| l == "c 195:1 rw"));
    // Not a container of this host: refused in one line.
    let e = o
        .host
        .cmd()
        .args(["attach", "gh-oci-none"])
        .output()
        .unwrap();
    assert!(
        stderr(&e).contains("no running libvirt domain or OCI container named 'gh-oci-none'"),
        "{}",
        stderr(&e)
    );
    podman_rm(&id);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// A container that mounted another directory over its `/dev` is refused in one line, as a
/// domain's is at `started`: nothing reserved, nothing made.
#[test]
fn oci_attach_refuses_a_dev_the_container_replaced() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    let id = podman_detached(
        &o,
        "gh-oci-hp3",
        &["--cap-add", "sys_admin"],
        "mkdir -p /tmp/d && busybox mount --bind /tmp/d /dev && sleep 600",
    );
    let pid = init_pid(&id);
    let deadline = Instant::now() + Duration::from_secs(10);
    let bound = || {
        std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
            .is_ok_and(|m| m.lines().any(|l| l.contains("/tmp/d /dev ")))
    };
    while !bound() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(bound(), "the container never mounted over its /dev");
    let e = o.host.cmd().args(["attach", &id]).output().unwrap();
    assert!(!e.status.success(), "{}", out(&e));
    let said = stderr(&e);
    assert_eq!(said.trim().lines().count(), 1, "{said}");
    assert!(
        said.contains("not the tmpfs its OCI runtime mounts; refusing to write there"),
        "{said}"
    );
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
    podman_rm(&id);
}

/// The device programs attached to a running container's init's cgroup on the unified
/// hierarchy (this host's is at `/sys/fs/cgroup/unified`).
fn device_programs(id: &str) -> Vec<u32> {
    let pid = init_pid(id);
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = cg
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("a unified cgroup")
        .to_string();
    let dir = std::fs::File::open(format!("/sys/fs/cgroup/unified{path}")).unwrap();
    use std::os::fd::AsFd;
    gpuhook::cgroup::bpf::prog_query(dir.as_fd(), gpuhook::cgroup::bpf::BPF_CGROUP_DEVICE, 0)
        .unwrap()
}

/// A crun container on cgroup v2, started with one GPU: attach replaces crun's device program
/// by one that allows what crun's did plus the second GPU, detach of the GPU it got at create
/// by one that denies it; crun's own rules (`/dev/null`) stay, one program is attached at a
/// time, and the removal frees everything. Device access is probed by the kernel (EPERM from
/// the program, ENXIO past it), not read from gpuhook's words.
#[test]
fn oci_attach_and_detach_in_a_crun_container_on_cgroup_v2() {
    attach_and_detach_on_cgroup_v2(CRUN);
}

/// The same with runc's device program (runc's `devicefilter`).
#[test]
fn oci_attach_and_detach_in_a_runc_container_on_cgroup_v2() {
    attach_and_detach_on_cgroup_v2(RUNC);
}

fn attach_and_detach_on_cgroup_v2(runtime: &str) {
    let o = Oci::new(FakeHost::blueprint(), runtime);
    let name = format!("gh-oci-hp4-{}", runtime.rsplit('/').next().unwrap());
    let id = podman_v2_with_gpu0(&o, &name);
    let open = |mm| open_in_cg(Cgroup::V2, &id, mm);
    let crun_prog = device_programs(&id);
    assert_eq!(crun_prog.len(), 1, "{crun_prog:?}");
    assert_eq!(open("195:0"), "open");
    assert_eq!(open("195:1"), "denied");

    let j = gh_json(&o, &["attach", &id, "--json"]);
    assert_eq!(j["attached"], json!(["0000:08:00.0"]), "{j}");
    assert_eq!(o.host.holders()[&id], ["0000:07:00.0", "0000:08:00.0"]);
    // The lock of the cgroup whose program was replaced is the pool's own, beside its state
    // (issue 39: it was in the host's /run/gpuhook, which every pool shared).
    let locks = o.host.state.parent().unwrap().join("cgroup-locks");
    let n = std::fs::read_dir(&locks)
        .unwrap_or_else(|e| panic!("{}: {e}", locks.display()))
        .count();
    assert_eq!(n, 1, "{}", locks.display());
    let ls = podman_exec_in(Cgroup::V2, &id, "ls /dev");
    assert!(out(&ls).lines().any(|l| l == "nvidia1"), "{}", out(&ls));
    let replaced = device_programs(&id);
    assert_eq!(replaced.len(), 1, "{replaced:?}");
    assert_ne!(replaced, crun_prog, "crun's program was not replaced");
    assert_eq!(open("195:1"), "open");
    assert_eq!(open("195:0"), "open");
    assert_eq!(open("1:3"), "open", "crun's own rules stay");
    assert_eq!(open("195:2"), "denied", "nothing but the GPU's nodes more");
    assert_eq!(open("7:0"), "denied");

    // The GPU crun granted at create (from config.json) is taken back too.
    let j = gh_json(&o, &["detach", &id, "--device", "0000:07:00.0", "--json"]);
    assert_eq!(j["detached"], json!(["0000:07:00.0"]), "{j}");
    assert_eq!(open("195:0"), "denied");
    assert_eq!(open("195:1"), "open");
    let j = gh_json(&o, &["detach", &id, "--device", "0000:08:00.0", "--json"]);
    assert_eq!(j["detached"], json!(["0000:08:00.0"]), "{j}");
    assert_eq!(open("195:1"), "denied");
    assert_eq!(open("1:3"), "open");
    assert_eq!(device_programs(&id).len(), 1);
    let held: Vec<Value> = o.reservations().iter().map(|r| r["gpus"].clone()).collect();
    assert_eq!(held, [json!([])], "the container's record holds no GPU");

    assert_ok(
        &o.host
            .cmd()
            .args(["attach", &id, "--device", "1"])
            .output()
            .unwrap(),
    );
    assert_eq!(open("195:1"), "open");
    let _ = in_cgroup(Cgroup::V2, "podman")
        .args(["--cgroup-manager", "cgroupfs", "rm", "-f", "-t", "0", &id])
        .output();
    podman_rm(&id);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// A container may move its init below the cgroup its runtime made where its cgroup is
/// writable to it (podman --systemd=always, a cgroupfs manager): hotplug then changes the
/// device rules where the runtime's program is, in the cgroup the runtime's state names, so
/// that no process left there keeps a detached GPU (hostile review: the old code denied it in
/// the init's new cgroup alone, and `podman exec`, which joins the runtime's cgroup, still
/// opened it: the next tenant's GPU). An attach grants there too; an init moved out of that
/// cgroup is refused in one line.
#[test]
fn oci_hotplug_in_a_crun_container_whose_init_moved_below_its_cgroup_on_cgroup_v2() {
    hotplug_with_the_init_moved(CRUN);
}

/// The same under runc.
#[test]
fn oci_hotplug_in_a_runc_container_whose_init_moved_below_its_cgroup_on_cgroup_v2() {
    hotplug_with_the_init_moved(RUNC);
}

fn hotplug_with_the_init_moved(runtime: &str) {
    let o = Oci::new(FakeHost::blueprint(), runtime);
    // Under crun no runtime's state is read: where crun put the init is what gpuhook-runtime's
    // createRuntime hook recorded, before anything of the container ran.
    if runtime == CRUN {
        let mut c: Value = serde_json::from_slice(&std::fs::read(&o.host.config).unwrap()).unwrap();
        c["oci_state_roots"] = json!([]);
        std::fs::write(&o.host.config, c.to_string()).unwrap();
    }
    let name = format!("gh-oci-moved-{}", runtime.rsplit('/').next().unwrap());
    let id = podman_v2_with_gpu0(&o, &name);
    // `podman exec` runs in the cgroup the runtime made: a process the container left there.
    let open = |mm| open_in_cg(Cgroup::V2, &id, mm);
    let dev = |n: &str| o.host.paths.dev.join(n);
    let made = init_cgroup_dir(&id);
    let pid = init_pid(&id);
    let move_init = |to: &Path| {
        std::fs::create_dir_all(to).unwrap();
        std::fs::write(to.join("cgroup.procs"), &pid).unwrap();
    };
    assert_eq!(open("195:0"), "open");
    // A GPU attached while the init is where its runtime put it.
    let j = gh_json(&o, &["attach", &id, "--device", "1", "--json"]);
    assert_eq!(j["attached"], json!(["0000:08:00.0"]), "{j}");
    let below = made.join("moved");
    move_init(&below);
    assert_eq!(init_cgroup_dir(&id), below);
    assert_eq!(open_from_dir(&below, &dev("nvidia1")), "open", "the init's");

    // Detached with the init below: denied to every process of the container.
    let j = gh_json(&o, &["detach", &id, "--device", "0000:07:00.0", "--json"]);
    assert_eq!(j["detached"], json!(["0000:07:00.0"]), "{j}");
    assert_eq!(
        open_from_dir(&made, &dev("nvidia0")),
        "denied",
        "a process left in the runtime's cgroup"
    );
    assert_eq!(open("195:0"), "denied", "podman exec");
    assert_eq!(
        open_from_dir(&below, &dev("nvidia0")),
        "denied",
        "the init's"
    );
    assert_eq!(open("195:1"), "open");
    assert_eq!(open("1:3"), "open", "the runtime's own rules stay");

    // Attached with the init below: granted where the runtime's program is.
    let j = gh_json(&o, &["attach", &id, "--device", "0", "--json"]);
    assert_eq!(j["attached"], json!(["0000:07:00.0"]), "{j}");
    assert_eq!(open_from_dir(&below, &dev("nvidia0")), "open", "the init's");
    assert_eq!(
        open_from_dir(&made, &dev("nvidia0")),
        "open",
        "the runtime's"
    );
    assert_eq!(open("195:2"), "denied", "nothing but the GPU's nodes more");

    // A device program below the runtime's cgroup, on the way to the init: no runtime's
    // (a narrower one there would be the one a detach changed), refused.
    {
        use std::os::fd::AsFd;
        let allow_all = [
            gpuhook::cgroup::bpf::Insn {
                code: 0xb7,
                regs: 0,
                off: 0,
                imm: 1,
            },
            gpuhook::cgroup::bpf::Insn {
                code: 0x95,
                regs: 0,
                off: 0,
                imm: 0,
            },
        ];
        let prog = gpuhook::cgroup::bpf::prog_load(
            gpuhook::cgroup::bpf::BPF_PROG_TYPE_CGROUP_DEVICE,
            &allow_all,
            "GPL",
        )
        .unwrap();
        let cg = std::fs::File::open(&below).unwrap();
        let attach = gpuhook::cgroup::bpf::BPF_CGROUP_DEVICE;
        gpuhook::cgroup::bpf::prog_attach(
            cg.as_fd(),
            prog.as_fd(),
            attach,
            gpuhook::cgroup::bpf::BPF_F_ALLOW_MULTI,
        )
        .unwrap();
        let r = o
            .host
            .cmd()
            .args(["detach", &id, "--device", "0000:08:00.0"])
            .output()
            .unwrap();
        assert_refused(
            &r,
            "holds a device program below the cgroup its runtime made",
        );
        assert_eq!(o.host.holders()[&id], ["0000:07:00.0", "0000:08:00.0"]);
        gpuhook::cgroup::bpf::prog_detach(cg.as_fd(), prog.as_fd(), attach).unwrap();
    }

    // Out of the runtime's cgroup: refused, nothing changed.
    let out_of = made.parent().unwrap().join(format!("gh-elsewhere-{name}"));
    move_init(&out_of);
    let r = o
        .host
        .cmd()
        .args(["detach", &id, "--device", "0000:08:00.0"])
        .output()
        .unwrap();
    assert_refused(&r, "where its runtime put it");
    assert_eq!(o.host.holders()[&id], ["0000:07:00.0", "0000:08:00.0"]);
    assert_eq!(open("195:1"), "open");

    move_init(&made);
    for d in [&below, &out_of] {
        std::fs::remove_dir(d).unwrap_or_else(|e| {
            let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
            panic!("{}: {e} (processes: {procs:?})", d.display())
        });
    }
    let _ = in_cgroup(Cgroup::V2, "podman")
        .args(["--cgroup-manager", "cgroupfs", "rm", "-f", "-t", "0", &id])
        .output();
    podman_rm(&id);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// A detached podman container `name` on cgroup v2 (cgroupfs) that asked for GPU 0 and sleeps;
/// its ID.
fn podman_v2_with_gpu0(o: &Oci, name: &str) -> String {
    podman_rm(name);
    let r = o
        .podman(
            Cgroup::V2,
            &["-d", "--name", name, "--annotation", "gpuhook.io/devices=0"],
            "sleep 600",
        )
        .output()
        .unwrap();
    assert_ok(&r);
    out(&r).trim().to_string()
}

/// The device cgroup a running container's init is in, as this host mounts it: its v1
/// devices cgroup, else (a v2 container, on a cgroup v2 host or beside v1) its cgroup on the
/// unified hierarchy, wherever that is mounted here.
fn init_cgroup_dir(id: &str) -> PathBuf {
    let pid = init_pid(id);
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let v1 = cg
        .lines()
        .find_map(|l| l.split_once(":devices:").map(|(_, p)| p.to_string()))
        .filter(|p| p != "/");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mount_of = |fs: &str, opt: Option<&str>| {
        mounts.lines().find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let mut post = post.split_whitespace();
            let (t, _, opts) = (post.next()?, post.next()?, post.next()?);
            let ok = t == fs && opt.is_none_or(|o| opts.split(',').any(|x| x == o));
            ok.then(|| pre.split_whitespace().nth(4).unwrap().to_string())
        })
    };
    match v1 {
        Some(p) => PathBuf::from(format!(
            "{}{p}",
            mount_of("cgroup", Some("devices")).expect("devices mount")
        )),
        None => {
            let p = cg
                .lines()
                .find_map(|l| l.strip_prefix("0::"))
                .expect("a unified cgroup")
                .to_string();
            PathBuf::from(format!(
                "{}{p}",
                mount_of("cgroup2", None).expect("cgroup2 mount")
            ))
        }
    }
}

/// Whether the container's device cgroup lets its processes open the host node `node` (ENXIO:
/// let through, no driver behind a fake major; EPERM: refused), asked of the kernel by a host
/// shell moved into the init's cgroup: a user-namespaced container can make no node to try.
fn open_from_cgroup(id: &str, node: &Path) -> &'static str {
    open_from_dir(&init_cgroup_dir(id), node)
}

/// [`open_from_cgroup`] from the cgroup directory `dir`.
fn open_from_dir(dir: &Path, node: &Path) -> &'static str {
    let r = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {}/cgroup.procs && exec cat {}",
            dir.display(),
            node.display()
        ))
        .output()
        .unwrap();
    let e = stderr(&r);
    if e.contains("No such device or address") {
        "open"
    } else if e.contains("Operation not permitted") {
        "denied"
    } else {
        panic!("{}: {e}", node.display())
    }
}

/// The paths of the nodes the state records as bind-mounted into container `id`.
fn node_mounts(o: &Oci, id: &str) -> Vec<String> {
    let st: Value = serde_json::from_slice(&std::fs::read(&o.host.state).unwrap()).unwrap();
    st["reservations"][id]["node_mounts"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|b| b["path"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// A user-namespaced podman container (--uidmap; podman's own cgroup layout on this host, or
/// crun on cgroup v2) gets GPUs by attach as runc gives them in a user namespace: the node is
/// a bind mount on a file made as its root in its `/dev` (owned as the container's root,
/// opened there), the GPU's cgroup grant exact; it loses them at detach (mount and file gone,
/// refused again). What the container put at a node's place refuses the attach and is left as
/// it is; what it put there after (its own mount taken off, a symlink) is left by the detach.
#[test]
fn oci_attach_and_detach_in_a_user_namespaced_container() {
    userns_attach_and_detach(RUNC, Cgroup::V1);
}

/// The same with crun on cgroup v2: podman's own layout on a cgroup v2 host (systemd's cgroup
/// manager on one booted with systemd), else a cgroup2 mount namespace (crun refuses this
/// machine's hybrid layout).
#[test]
fn oci_attach_and_detach_in_a_user_namespaced_crun_container_on_cgroup_v2() {
    let unified = nix::sys::statfs::statfs("/sys/fs/cgroup")
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC);
    userns_attach_and_detach(CRUN, if unified { Cgroup::V1 } else { Cgroup::V2 });
}

fn userns_attach_and_detach(runtime: &str, cg: Cgroup) {
    let o = Oci::new(FakeHost::blueprint(), runtime);
    chown_rootfs_to_100000(&o);
    let name = format!("gh-oci-hpns-{}", runtime.rsplit('/').next().unwrap());
    podman_rm(&name);
    let r = o
        .podman(
            cg,
            &[
                "-d",
                "--name",
                &name,
                "--uidmap",
                "0:100000:65536",
                "--gidmap",
                "0:100000:65536",
                "--cap-add",
                "sys_admin",
            ],
            "sleep 600",
        )
        .output()
        .unwrap();
    assert_ok(&r);
    let id = out(&r).trim().to_string();
    let exec = |script: &str| podman_exec_in(cg, &id, script);
    let dev = |n: &str| o.host.paths.dev.join(n);
    // runc confines a container's devices with a user namespace too; crun with cgroupfs
    // attaches no device program to one (its user namespace is the confinement: no node it
    // can make opens): every device passes its cgroup until a detach puts gpuhook's deny there.
    let confined = open_from_cgroup(&id, &dev("nvidia1")) == "denied";
    if runtime == RUNC {
        assert!(
            confined,
            "runc's program lets GPU 1 through before the attach"
        );
    }

    let j = gh_json(&o, &["attach", &id, "--device", "0000:08:00.0", "--json"]);
    assert_eq!(j["attached"], json!(["0000:08:00.0"]), "{j}");
    // Its root sees the node as its own, and opens it.
    let ls = exec("ls -ln /dev/nvidia1 /dev/nvidiactl");
    let words = out(&ls).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains("crw-rw-rw- 1 0 0 195, 1"),
        "{} {}",
        out(&ls),
        stderr(&ls)
    );
    assert!(words.contains("crw-rw-rw- 1 0 0 195, 255"), "{}", out(&ls));
    let r = exec("cat /dev/nvidia1; cat /dev/nvidiactl");
    assert_eq!(
        stderr(&r).matches("No such device or address").count(),
        2,
        "{}",
        stderr(&r)
    );
    let mounts = out(&exec("cat /proc/1/mountinfo"));
    assert!(
        mounts
            .lines()
            .any(|l| l.contains(" /dev/nvidia1 ") && l.contains(" ro,")),
        "{mounts}"
    );
    assert_eq!(open_from_cgroup(&id, &dev("nvidia1")), "open");
    if confined {
        assert_eq!(
            open_from_cgroup(&id, &dev("nvidia0")),
            "denied",
            "only the attached GPU"
        );
    }
    let bound = node_mounts(&o, &id);
    assert_eq!(
        bound,
        [
            "/dev/nvidia1",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools"
        ]
    );

    // What the container put at GPU 0's place: refused in one line, left as it is.
    for (plant, what) in [
        ("ln -s /dev/null /dev/nvidia0", "is a symlink"),
        ("touch /dev/nvidia0", "is a regular file"),
        (
            "touch /dev/nvidia0 && mount --bind /dev/null /dev/nvidia0",
            "is the character device 1:3",
        ),
    ] {
        assert_ok(&exec(plant));
        let e = o
            .host
            .cmd()
            .args(["attach", &id, "--device", "0000:07:00.0"])
            .output()
            .unwrap();
        assert!(!e.status.success(), "{plant}: {}", out(&e));
        let said = stderr(&e);
        assert_eq!(said.trim().lines().count(), 1, "{said}");
        assert!(
            said.contains(&format!(
                "container /dev/nvidia0 {what} (not the character device 195:0); refusing to replace it"
            )),
            "{plant}: {said}"
        );
        assert_eq!(o.host.holders()[&id], ["0000:08:00.0"]);
        if confined {
            assert_eq!(open_from_cgroup(&id, &dev("nvidia0")), "denied");
        }
        let still = exec("ls -l /dev/nvidia0; cat /dev/nvidia0 && echo readable");
        assert!(
            out(&still).contains("/dev/nvidia0"),
            "{plant}: {}",
            out(&still)
        );
        assert_ok(&exec("umount /dev/nvidia0 2>/dev/null; rm -f /dev/nvidia0"));
    }
    // With its place free, GPU 0 comes too.
    assert_ok(
        &o.host
            .cmd()
            .args(["attach", &id, "--device", "0000:07:00.0"])
            .output()
            .unwrap(),
    );
    assert!(stderr(&exec("cat /dev/nvidia0")).contains("No such device or address"));

    // Detach: mount and file gone, refused again; the GPU it keeps stays.
    let j = gh_json(&o, &["detach", &id, "--device", "0000:08:00.0", "--json"]);
    assert_eq!(j["detached"], json!(["0000:08:00.0"]), "{j}");
    let ls = out(&exec("ls /dev"));
    assert!(!ls.lines().any(|l| l == "nvidia1"), "{ls}");
    assert!(
        ls.lines().any(|l| l == "nvidia0" || l == "nvidiactl"),
        "{ls}"
    );
    assert!(
        !out(&exec("cat /proc/1/mountinfo")).contains(" /dev/nvidia1 "),
        "the mount stays"
    );
    assert_eq!(open_from_cgroup(&id, &dev("nvidia1")), "denied");
    assert_eq!(open_from_cgroup(&id, &dev("nvidia0")), "open");

    // Given again, then the container takes the mount off and puts a symlink there: detach
    // takes the grant, and leaves the container's symlink (and what it points at) alone.
    assert_ok(
        &o.host
            .cmd()
            .args(["attach", &id, "--device", "0000:08:00.0"])
            .output()
            .unwrap(),
    );
    assert_ok(&exec(
        "umount /dev/nvidia1 && rm /dev/nvidia1 && ln -s /dev/null /dev/nvidia1",
    ));
    let j = gh_json(&o, &["detach", &id, "--all", "--json"]);
    assert_eq!(
        j["detached"],
        json!(["0000:07:00.0", "0000:08:00.0"]),
        "{j}"
    );
    assert_eq!(
        out(&exec("readlink /dev/nvidia1")).trim(),
        "/dev/null",
        "the container's symlink stays"
    );
    let ls = out(&exec("ls /dev"));
    assert!(
        !ls.lines().any(|l| l == "nvidia0" || l == "nvidiactl"),
        "{ls}"
    );
    assert_eq!(open_from_cgroup(&id, &dev("nvidia0")), "denied");
    assert_eq!(open_from_cgroup(&id, &dev("nvidia1")), "denied");
    assert!(node_mounts(&o, &id).is_empty());
    podman_rm_in(cg, &id);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// A user-namespaced container with a GPU from its create (the runtime bind-mounted gpuhook's
/// node) gets a second by attach, and detach of the first takes the runtime's mount of it off
/// (its empty mount-point file too) and its grant.
#[test]
fn oci_user_namespaced_container_with_a_gpu_from_create_attach_and_detach() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    chown_rootfs_to_100000(&o);
    let maps = ["--uidmap", "0:100000:65536", "--gidmap", "0:100000:65536"];
    let id = podman_detached(
        &o,
        "gh-oci-hpns2",
        &[&maps[..], &["--annotation", "gpuhook.io/devices=0"]].concat(),
        "sleep 600",
    );
    let dev = |n: &str| o.host.paths.dev.join(n);
    assert_eq!(o.host.holders()[&id], ["0000:07:00.0"]);
    assert_eq!(open_from_cgroup(&id, &dev("nvidia0")), "open");
    assert_eq!(open_from_cgroup(&id, &dev("nvidia1")), "denied");
    let a = o.host.cmd().args(["attach", &id]).output().unwrap();
    assert_ok(&a);
    assert_eq!(o.host.holders()[&id], ["0000:07:00.0", "0000:08:00.0"]);
    let r = podman_exec(&id, "cat /dev/nvidia1");
    assert!(
        stderr(&r).contains("No such device or address"),
        "{}",
        stderr(&r)
    );
    assert_eq!(open_from_cgroup(&id, &dev("nvidia1")), "open");
    let j = gh_json(&o, &["detach", &id, "--device", "0000:07:00.0", "--json"]);
    assert_eq!(j["detached"], json!(["0000:07:00.0"]), "{j}");
    let ls = out(&podman_exec(&id, "ls /dev"));
    assert!(!ls.lines().any(|l| l == "nvidia0"), "{ls}");
    assert!(ls.lines().any(|l| l == "nvidia1"), "{ls}");
    assert_eq!(open_from_cgroup(&id, &dev("nvidia0")), "denied");
    assert_eq!(open_from_cgroup(&id, &dev("nvidia1")), "open");
    podman_rm(&id);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// The driver's mounts (`/proc/1/mounts` in the container) of libcuda and nvidia-smi.
fn oci_driver_mounts(id: &str) -> Vec<String> {
    let r = podman_exec(id, "cat /proc/1/mounts");
    out(&r)
        .lines()
        .filter(|l| l.contains("libcuda.so.535.129.03 ") || l.contains("/usr/bin/nvidia-smi "))
        .map(str::to_owned)
        .collect()
}

/// A running podman container (runc, cgroup v1) with its own root filesystem and no GPU
/// gets one by `gpuhook attach --driver cdi`: the driver's files, links and linker cache from
/// the CDI spec inside (as a `driver=cdi` create gives them); a second GPU keeps the same
/// mounts; detach of one keeps what the other needs; detach of the last takes them out.
#[test]
fn oci_attach_cdi_into_a_running_podman_container_with_its_own_root() {
    let fake = FakeHost::blueprint();
    let o = Oci::new(fake.clone(), RUNC);
    o.host.with_cdi(&fake);
    let rootfs = testbed::driver::rootfs(&o.host.root().join("cdi-hp")).unwrap();
    let name = "gh-oci-hpcdi";
    podman_rm(name);
    let r = o
        .podman_with(
            Cgroup::V1,
            o.runtime.as_os_str(),
            &rootfs,
            &["-d", "--name", name],
            "sleep 600",
        )
        .output()
        .unwrap();
    assert_ok(&r);
    let id = out(&r).trim().to_string();
    assert!(oci_driver_mounts(&id).is_empty());
    let attach = |dev: &str| {
        let a = o
            .host
            .cmd()
            .args(["attach", &id, "--driver", "cdi", "--device", dev])
            .output()
            .unwrap();
        assert_ok(&a);
    };
    attach("0000:07:00.0");
    let r = podman_exec(&id, common::CDI_PROBE);
    common::assert_cdi_probe(&out(&r));
    let mounts = oci_driver_mounts(&id);
    assert_eq!(mounts.len(), 2, "{mounts:?}");
    attach("0000:08:00.0");
    assert_eq!(o.host.holders()[&id], ["0000:07:00.0", "0000:08:00.0"]);
    assert_eq!(oci_driver_mounts(&id), mounts);
    let ls = podman_exec(&id, "ls /dev");
    assert!(out(&ls).lines().any(|l| l == "nvidia1"), "{}", out(&ls));
    let d = |dev: &str| {
        let r = o
            .host
            .cmd()
            .args(["detach", &id, "--device", dev])
            .output()
            .unwrap();
        assert_ok(&r);
    };
    d("0000:07:00.0");
    assert_eq!(oci_driver_mounts(&id), mounts);
    let r = podman_exec(&id, "cuda-probe");
    assert!(out(&r).contains("dlopen libcuda.so.1: ok"), "{}", out(&r));
    d("0000:08:00.0");
    assert!(
        oci_driver_mounts(&id).is_empty(),
        "{:?}",
        oci_driver_mounts(&id)
    );
    let ls = podman_exec(&id, "ls /usr/lib/x86_64-linux-gnu/");
    assert!(!out(&ls).contains("libcuda"), "{}", out(&ls));
    podman_rm(&id);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// `gpuhook ARGS…` under strace, its `bpf` calls logged to `log`; with `kill_at` (1-based
/// among them) SIGKILLed at that one. Its stderr and strace's log.
fn under_strace(o: &Oci, args: &[&str], kill_at: Option<usize>, log: &Path) -> String {
    let mut c = Command::new("strace");
    c.args(["-e", "trace=bpf", "-o"]).arg(log);
    if let Some(n) = kill_at {
        c.args(["-e", &format!("inject=bpf:signal=SIGKILL:when={n}")]);
    }
    let r = c
        .arg(common::bin())
        .args(args)
        .env("GPUHOOK_CONFIG", &o.host.config)
        .output()
        .expect("strace");
    // strace's own words (`+++ killed by SIGKILL +++`) are in its log.
    format!(
        "{}{}",
        stderr(&r),
        std::fs::read_to_string(log).unwrap_or_default()
    )
}

/// The 1-based place of each `bpf` command in an strace log.
fn bpf_calls(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once("bpf(").map(|(_, r)| r))
        .map(|r| r.split(',').next().unwrap().to_string())
        .collect()
}

/// SIGKILL of `gpuhook attach` and `detach` of a crun container on cgroup v2 at each step of
/// the program's replacement (its load, the new one's attach, the old one's detach): the
/// container can open the GPU only while its reservation holds it, and what a kill left (two
/// programs, which rule together) is made one program by the next detach.
#[test]
fn oci_v2_replacement_killed_at_each_step() {
    let o = Oci::new(FakeHost::blueprint(), CRUN);
    let name = "gh-oci-hpk";
    podman_rm(name);
    let r = o
        .podman(
            Cgroup::V2,
            &["-d", "--name", name, "--annotation", "gpuhook.io/devices=0"],
            "sleep 600",
        )
        .output()
        .unwrap();
    assert_ok(&r);
    let id = out(&r).trim().to_string();
    let open = |mm| open_in_cg(Cgroup::V2, &id, mm);
    let holds = || {
        o.host
            .holders()
            .get(&id)
            .is_some_and(|g| g.iter().any(|p| p == "0000:08:00.0"))
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("strace");
    let attach = ["attach", id.as_str(), "--device", "0000:08:00.0"];
    let detach = ["detach", id.as_str(), "--device", "0000:08:00.0"];
    // The steps, from an attach and a detach that run to their end.
    under_strace(&o, &attach, None, &log);
    let at = bpf_calls(&log);
    assert_eq!(open("195:1"), "open");
    under_strace(&o, &detach, None, &log);
    let de = bpf_calls(&log);
    assert_eq!(open("195:1"), "denied");
    let step = |calls: &[String], cmd: &str| {
        1 + calls
            .iter()
            .position(|c| c == cmd)
            .unwrap_or_else(|| panic!("no {cmd} in {calls:?}"))
    };
    // (step, command, its calls, GPU attached before, programs attached after the kill)
    for (cmd, args, calls, attached, programs) in [
        ("BPF_PROG_LOAD", &attach, &at, false, 1),
        ("BPF_PROG_ATTACH", &attach, &at, false, 1),
        ("BPF_PROG_DETACH", &attach, &at, false, 2),
        ("BPF_PROG_ATTACH", &detach, &de, true, 1),
        ("BPF_PROG_DETACH", &detach, &de, true, 2),
    ] {
        let what = format!("{} killed at {cmd}", args[0]);
        if attached {
            assert_ok(&o.host.cmd().args(attach).output().unwrap());
        }
        let err = under_strace(&o, args, Some(step(calls, cmd)), &log);
        assert!(err.contains("killed by SIGKILL"), "{what}: {err}");
        // Never usable unless held; a kill between the two steps leaves two programs.
        if open("195:1") == "open" {
            assert!(
                holds(),
                "{what}: the container opens a GPU it does not hold"
            );
        }
        assert_eq!(open("195:0"), "open", "{what}: its own GPU");
        assert_eq!(open("1:3"), "open", "{what}: crun's rules");
        assert_eq!(device_programs(&id).len(), programs, "{what}");
        // The next detach (or the kill's own, done) leaves one program, the GPU denied.
        if holds() {
            assert_ok(&o.host.cmd().args(detach).output().unwrap());
        }
        assert!(!holds(), "{what}");
        assert_eq!(open("195:1"), "denied", "{what}");
        if device_programs(&id).len() > 1 {
            // A detach killed after its state was written: the next change merges.
            assert_ok(&o.host.cmd().args(attach).output().unwrap());
            assert_ok(&o.host.cmd().args(detach).output().unwrap());
        }
        assert_eq!(device_programs(&id).len(), 1, "{what}");
    }
    let _ = in_cgroup(Cgroup::V2, "podman")
        .args(["--cgroup-manager", "cgroupfs", "rm", "-f", "-t", "0", &id])
        .output();
    podman_rm(&id);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// Two podman containers share 0000:07:00.0 (2 time slices), one asking by annotation, the
/// other by environment: each holds a slot, opens the GPU, not the other one; a third is
/// refused, the podman user told in one line naming both sharers; their removal frees both.
#[test]
fn podman_containers_share_one_gpu() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    o.host
        .edit_config(|c| c["sharing"] = json!({"0000:07:00.0": {"replicas": 2}}));
    let a = podman_detached(
        &o,
        "gh-share-a",
        &["--annotation", "gpuhook.io/share=yes"],
        "sleep 60",
    );
    let b = podman_detached(
        &o,
        "gh-share-b",
        &["--env", "GPUHOOK_SHARE=yes"],
        "sleep 60",
    );
    let h = o.host.holders();
    assert_eq!(
        h.get(&a),
        Some(&vec!["0000:07:00.0/slot0".to_string()]),
        "{h:?}"
    );
    assert_eq!(
        h.get(&b),
        Some(&vec!["0000:07:00.0/slot1".to_string()]),
        "{h:?}"
    );
    assert_eq!(h.len(), 2, "{h:?}");
    for id in [&a, &b] {
        assert!(devices_list(id).iter().any(|l| l == "c 195:0 rw"), "{id}");
        assert_eq!(open_in(id, "195:0"), "open", "{id}");
        assert_eq!(open_in(id, "195:1"), "denied", "{id}");
    }
    let r = o
        .podman(
            Cgroup::V1,
            &["--rm", "--annotation", "gpuhook.io/share=yes"],
            "true",
        )
        .output()
        .unwrap();
    assert_refused(
        &r,
        &format!("0000:07:00.0 has 2/2 slots taken by container '{a}', container '{b}'"),
    );
    assert_eq!(o.reservations().len(), 2, "the refused one left nothing");
    podman_rm(&a);
    assert_eq!(o.host.holders().keys().collect::<Vec<_>>(), [&b]);
    podman_rm(&b);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// A podman container sharing a GPU in `mps` mode (docs/guides/sharing.md, "MPS") with the test bed's
/// stand-in daemon: it sees the daemon's pipe directory (with the control FIFO) at
/// /tmp/nvidia-mps, the daemon's private /dev/shm (its marker file) and
/// CUDA_MPS_PIPE_DIRECTORY; the daemon quits when the container is removed.
#[test]
fn podman_mps_sharer_gets_the_daemons_pipe_shm_and_env() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    let standin = Path::new(env!("CARGO_MANIFEST_DIR")).join("testbed/scripts/mps-control-standin");
    o.host.edit_config(|c| {
        c["sharing"] = json!({"0000:07:00.0": {"replicas": 2, "mode": "mps"}});
        c["mps_control"] = json!(standin);
    });
    let r = o
        .podman(
            Cgroup::V1,
            &["--rm", "--annotation", "gpuhook.io/share=yes"],
            "ls -l /tmp/nvidia-mps; ls /dev/shm; echo pipe=$CUDA_MPS_PIPE_DIRECTORY",
        )
        .output()
        .unwrap();
    assert_ok(&r);
    let s = out(&r);
    assert!(s.contains("control"), "{s}");
    assert!(s.contains("nvidia-cuda-mps-control.pid"), "{s}");
    assert!(s.contains("gpuhook-mps-standin"), "{s}");
    assert!(s.contains("pipe=/tmp/nvidia-mps"), "{s}");
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
    let st: Value = serde_json::from_slice(&std::fs::read(&o.host.state).unwrap()).unwrap();
    assert!(st.get("mps").is_none(), "{st}");
}
