//! `gpuhook-runtime` under Debian's containerd 1.6: a private containerd (its own root, state
//! and socket in the test's directory, started here and killed after), an image imported from
//! a tarball of the busybox rootfs (no registry), and `ctr run --runc-binary` so the runc v2
//! shim runs the wrapper where it would run runc. The README's `ctr run` lines are run as
//! written; the package's CRI entry (`hooks/containerd-config.toml`) is loaded by that
//! containerd. Fake GPU hosts as in `tests/oci.rs`: a node the container's device cgroup
//! allows opens with ENXIO (no driver behind the fake major), one it denies with EPERM.

mod common;

use common::{assert_ok, stderr, Host};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use testbed::FakeHost;

const RUNC: &str = "/usr/sbin/runc";
const IMAGE: &str = "docker.io/library/gh-busybox:test";

/// A fake host, gpuhook-runtime on it, a private containerd with the busybox image.
struct Ctr {
    host: Host,
    /// What `--runc-binary` names: a script that sets the config and execs the link.
    runtime: PathBuf,
    dir: PathBuf,
    sock: PathBuf,
    /// Each test its own namespace: the shim's runc root and cgroups are per namespace.
    ns: String,
    child: std::process::Child,
}

impl Ctr {
    fn start(fake: FakeHost, ns: &str) -> Ctr {
        let host = Host::with(fake, |c| c["oci_runtime"] = json!(RUNC));
        let root = host.root().to_path_buf();
        let link = root.join("gpuhook-runtime");
        std::os::unix::fs::symlink(common::bin(), &link).unwrap();
        let runtime = root.join("runtime.sh");
        std::fs::write(
            &runtime,
            format!(
                "#!/bin/sh\nGPUHOOK_CONFIG={} exec {} \"$@\"\n",
                host.config.display(),
                link.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o755)).unwrap();
        let dir = root.join("containerd");
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("c.sock");
        let config = dir.join("config.toml");
        std::fs::write(
            &config,
            "version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n",
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .arg("--root")
            .arg(dir.join("root"))
            .arg("--state")
            .arg(dir.join("state"))
            .arg("--address")
            .arg(&sock)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("containerd (Debian package containerd)");
        let c = Ctr {
            host,
            runtime,
            dir,
            sock,
            ns: ns.into(),
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !c.ctr(&["version"]).output().unwrap().status.success() {
            assert!(
                Instant::now() < deadline,
                "containerd did not start: {}",
                std::fs::read_to_string(c.dir.join("containerd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let t = testbed::image::busybox_tarball(
            c.host.root(),
            "gh-busybox:test",
            &testbed::image::Run {
                entrypoint: vec![],
                cmd: vec!["sh".into()],
            },
        )
        .expect("the busybox image");
        assert_ok(
            &c.ctr(&["image", "import", t.to_str().unwrap()])
                .output()
                .unwrap(),
        );
        c
    }

    /// `ctr --address SOCK --namespace NS ARGS…`.
    fn ctr(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ctr");
        c.arg("--address")
            .arg(&self.sock)
            .args(["--namespace", &self.ns])
            .args(args);
        c
    }

    /// `ctr run --rm --runc-binary WRAPPER ARGS… IMAGE ID sh -c SCRIPT`.
    fn run(&self, args: &[&str], id: &str, script: &str) -> Output {
        self.ctr(&[
            "run",
            "--rm",
            "--runc-binary",
            self.runtime.to_str().unwrap(),
        ])
        .args(args)
        .args([IMAGE, id, "sh", "-c", script])
        .output()
        .unwrap()
    }

    fn reservations(&self) -> Vec<Value> {
        self.host.list()["reservations"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// `ctr task ls`'s status of `id` (`RUNNING`, `STOPPED`), if it has a task.
    fn task_status(&self, id: &str) -> Option<String> {
        let o = self.ctr(&["task", "ls"]).output().unwrap();
        assert_ok(&o);
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|w| w.first() == Some(&id))
            .and_then(|w| w.get(2).map(|s| s.to_string()))
    }
}

impl Drop for Ctr {
    fn drop(&mut self) {
        // What a failed test left running: its shim outlives containerd, and its rootfs mount
        // would pin the test's directory.
        if let Ok(o) = self.ctr(&["task", "ls", "-q"]).output() {
            for id in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                let _ = self.ctr(&["task", "kill", "-s", "SIGKILL", id]).output();
                let _ = self.ctr(&["task", "rm", "-f", id]).output();
            }
        }
        if let Ok(o) = self.ctr(&["container", "ls", "-q"]).output() {
            for id in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                let _ = self.ctr(&["container", "rm", id]).output();
            }
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::SIGTERM,
        );
        let _ = self.child.wait();
        // The shim's runc root for the namespace (empty once its tasks are deleted).
        let _ = std::fs::remove_dir(Path::new("/run/containerd/runc").join(&self.ns));
    }
}

/// A script that lists the GPU nodes the container was given and says, for each
/// `major:minor`, whether its device cgroup lets it open such a node (`open`: ENXIO) or not
/// (`denied`: EPERM), through a node it makes itself.
fn probe(numbers: &[&str]) -> String {
    let mut s = String::from(
        "for n in /dev/nvidia*; do [ -c $n ] && echo \"node $n $(stat -c '%t:%T' $n)\"; done; ",
    );
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
            "{mm} not denied: {text}\nstderr: {}",
            stderr(o)
        );
    }
}

/// The README's `ctr run` lines, continuation lines joined, as their words.
fn readme_ctr_lines() -> Vec<Vec<String>> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let lines: Vec<Vec<String>> = readme
        .replace("\\\n", " ")
        .lines()
        .filter(|l| l.starts_with("ctr run "))
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect();
    assert_eq!(lines.len(), 2, "the README's containerd snippet: {lines:?}");
    lines
}

/// The README's snippet, run as written: `/usr/bin/gpuhook-runtime` is this test's wrapper,
/// `IMAGE` the busybox image, `nvidia-smi` the probe. The annotation line gets one of the two
/// GPUs (and the control node), the env line both; each is freed when `--rm` deletes it.
#[test]
fn the_readme_ctr_lines_get_their_gpus_and_free_them() {
    let c = Ctr::start(FakeHost::blueprint(), "gh-readme");
    let lines = readme_ctr_lines();
    for (line, (open, denied)) in lines.iter().zip([
        (&["195:0", "195:255"][..], &["195:1"][..]),
        (&["195:0", "195:1", "195:255"][..], &[][..]),
    ]) {
        assert!(
            line.iter().any(|w| w == "/usr/bin/gpuhook-runtime"),
            "{line:?}"
        );
        let words: Vec<String> = line[1..]
            .iter()
            .map(|w| match w.as_str() {
                "/usr/bin/gpuhook-runtime" => c.runtime.to_str().unwrap().to_owned(),
                "IMAGE" => IMAGE.to_owned(),
                w => w.to_owned(),
            })
            .collect();
        let (cmd, args) = words.split_last().unwrap();
        assert_eq!(cmd, "nvidia-smi", "{line:?}");
        let o = c
            .ctr(&[])
            .args(args)
            .args(["sh", "-c", &probe(&["195:0", "195:1", "195:255"])])
            .output()
            .unwrap();
        assert_ok(&o);
        assert_probe(&o, open, denied);
        assert!(out(&o).contains("node /dev/nvidia0 c3:0"), "{}", out(&o));
        assert!(c.reservations().is_empty(), "{:?}", c.reservations());
    }
    // Without a request the container gets no GPU.
    let o = c.run(&[], "plain", &probe(&["195:0"]));
    assert_ok(&o);
    assert_probe(&o, &[], &["195:0"]);
}

/// A request that cannot be met, or a malformed one, reaches the `ctr` user as gpuhook's one
/// line (through the runtime's `--log`, which the shim reads); nothing is reserved, and the
/// GPUs are still there for the next container.
#[test]
fn a_refusal_reaches_the_ctr_user() {
    let c = Ctr::start(FakeHost::blueprint(), "gh-refuse");
    for (args, id, needle) in [
        (
            &["--annotation", "gpuhook.io/gpus=3"][..],
            "three",
            "gpuhook: container 'three': cannot reserve 3 GPUs: only 2 of the host's 2 matching GPUs are free",
        ),
        (
            &["--env", "GPUHOOK_ARCH=teleport"][..],
            "badarch",
            "gpuhook: container 'badarch': ",
        ),
        (
            &["--annotation", "gpuhook.io/colour=red"][..],
            "colour",
            "gpuhook: container 'colour': ",
        ),
    ] {
        let o = c.run(args, id, "echo ran");
        assert!(!o.status.success(), "accepted: {}", stderr(&o));
        assert!(!out(&o).contains("ran"), "the container ran: {}", out(&o));
        let e = stderr(&o);
        assert!(
            e.contains("OCI runtime create failed") && e.contains(needle),
            "{e}"
        );
        assert_eq!(
            e.lines().filter(|l| l.contains("gpuhook: ")).count(),
            1,
            "{e}"
        );
        assert!(c.reservations().is_empty(), "{:?}", c.reservations());
        let _ = c.ctr(&["container", "rm", id]).output();
    }
    let o = c.run(
        &["--annotation", "gpuhook.io/gpus=2"],
        "two",
        &probe(&["195:0", "195:1"]),
    );
    assert_ok(&o);
    assert_probe(&o, &["195:0", "195:1"], &[]);
}

/// A detached container holds its GPU while it runs (listed as its live holder; another
/// container asking for both is refused naming it); killed, it is listed stale until its task
/// is deleted, which frees the GPU.
#[test]
fn a_detached_container_holds_its_gpu_until_its_task_is_deleted() {
    let c = Ctr::start(FakeHost::blueprint(), "gh-detached");
    let o = c
        .ctr(&["run", "-d", "--runc-binary", c.runtime.to_str().unwrap()])
        .args(["--annotation", "gpuhook.io/gpus=1"])
        .args([IMAGE, "holder", "sleep", "1000"])
        .output()
        .unwrap();
    assert_ok(&o);
    assert_eq!(c.task_status("holder").as_deref(), Some("RUNNING"));
    let r = c.reservations();
    assert_eq!(
        (r.len(), &r[0]["kind"], &r[0]["domain"], &r[0]["phase"]),
        (1, &json!("oci"), &json!("holder"), &json!("running")),
        "{r:?}"
    );
    let l = c.host.list();
    assert_eq!(
        l["gpus"][0]["holder"],
        json!({"kind": "oci", "domain": "holder", "uuid": "holder", "phase": "running", "stale": false})
    );
    let o = c.run(&["--env", "GPUHOOK_GPUS=2"], "both", "true");
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("cannot reserve 2 GPUs: only 1 of the host's 2 matching GPUs is free: 1 held by container 'holder'"),
        "{}",
        stderr(&o)
    );
    let _ = c.ctr(&["container", "rm", "both"]).output();

    assert_ok(
        &c.ctr(&["task", "kill", "-s", "SIGKILL", "holder"])
            .output()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.task_status("holder").as_deref() != Some("STOPPED") {
        assert!(Instant::now() < deadline, "the task did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(c.host.list()["gpus"][0]["holder"]["stale"], true);
    let text = c.host.cmd().arg("list").output().unwrap();
    assert!(
        out(&text).contains("stale: container holder (its container init (pid "),
        "{}",
        out(&text)
    );
    assert_ok(&c.ctr(&["task", "rm", "holder"]).output().unwrap());
    assert!(c.reservations().is_empty(), "{:?}", c.reservations());
    assert_ok(&c.ctr(&["container", "rm", "holder"]).output().unwrap());
    let o = c.run(
        &["--env", "GPUHOOK_GPUS=2"],
        "both2",
        &probe(&["195:0", "195:1"]),
    );
    assert_ok(&o);
    assert_probe(&o, &["195:0", "195:1"], &[]);
}

/// The package's CRI runtime entry, as containerd 1.6 loads it: `containerd config dump` of
/// a config holding it shows the runtime with its shim, binary and pod annotations.
#[test]
fn the_packaged_cri_entry_loads_in_containerd() {
    let dir = tempfile::Builder::new()
        .prefix("gpuhook-containerd-")
        .tempdir_in(testbed::trusted_tmp())
        .unwrap();
    let snippet = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("hooks/containerd-config.toml"),
    )
    .unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, format!("version = 2\n{snippet}")).unwrap();
    let o = Command::new("containerd")
        .arg("--config")
        .arg(&config)
        .args(["config", "dump"])
        .output()
        .expect("containerd (Debian package containerd)");
    assert_ok(&o);
    let dump = out(&o);
    let section = |name: &str| -> String {
        let head = format!("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.{name}]");
        let mut lines = dump.lines().skip_while(|l| l.trim() != head);
        assert!(lines.next().is_some(), "no {head} in the dump: {dump}");
        lines
            .take_while(|l| !l.trim_start().starts_with('['))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let runtime = section("gpuhook");
    assert!(
        runtime.contains("runtime_type = \"io.containerd.runc.v2\"")
            && runtime.contains("pod_annotations = [\"gpuhook.io/*\"]"),
        "{runtime}"
    );
    let options = section("gpuhook.options");
    assert!(
        options.contains("BinaryName = \"/usr/bin/gpuhook-runtime\""),
        "{options}"
    );
}
