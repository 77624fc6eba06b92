//! One CRI scenario's world: a fake GPU host, gpuhook's config for it, a private containerd
//! with the shipped gpuhook handler, the pause and busybox images imported, and a CRI client
//! speaking to it as kubelet does. Made per scenario, torn down after (kept when it failed,
//! for inspection).

use super::containerd::{self, Containerd, BUSYBOX_IMAGE, PAUSE_IMAGE};
use super::pod::PodSpec;
use super::{api, Cri, CriError};
use crate::FakeHost;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The files a bed is made from, each as an operator has it: the gpuhook binary, the
/// shipped containerd snippet and RuntimeClass manifest.
#[derive(Debug, Clone)]
pub struct Files {
    pub gpuhook: PathBuf,
    pub snippet: PathBuf,
    pub runtimeclass: PathBuf,
}

/// A shipped file: `$ENV`, else the source tree's `hooks/NAME` (tests), else the installed
/// `/usr/share/gpuhook/engines/NAME` (a machine with the package, no sources).
pub fn shipped(env: &str, name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    let tree = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../hooks")
        .join(name);
    if let Ok(tree) = std::fs::canonicalize(tree) {
        return tree;
    }
    Path::new("/usr/share/gpuhook/engines").join(name)
}

impl Files {
    /// The gpuhook binary given; the snippet `$GPUHOOK_CRI_SNIPPET` (else see [`shipped`]),
    /// the RuntimeClass `$GPUHOOK_CRI_RUNTIMECLASS`.
    pub fn with(gpuhook: PathBuf) -> Files {
        Files {
            gpuhook,
            snippet: shipped("GPUHOOK_CRI_SNIPPET", "containerd-config.toml"),
            runtimeclass: shipped("GPUHOOK_CRI_RUNTIMECLASS", "kubernetes-runtimeclass.yaml"),
        }
    }
}

/// The handler a RuntimeClass manifest names, checked as the API server would take it.
pub fn runtimeclass_handler(path: &Path) -> Result<(String, String), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: Value =
        serde_yaml_ng::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let bad = |what: &str| format!("{}: {what}", path.display());
    if v["apiVersion"] != "node.k8s.io/v1" || v["kind"] != "RuntimeClass" {
        return Err(bad("not a node.k8s.io/v1 RuntimeClass"));
    }
    let name = v["metadata"]["name"]
        .as_str()
        .ok_or_else(|| bad("no metadata.name"))?;
    let handler = v["handler"].as_str().ok_or_else(|| bad("no handler"))?;
    Ok((name.to_string(), handler.to_string()))
}

/// A pod the bed runs: its sandbox ID and the config kubelet sent.
#[derive(Debug, Clone)]
pub struct Pod {
    pub id: String,
    pub spec: PodSpec,
    pub config: api::PodSandboxConfig,
    pub log_dir: PathBuf,
}

pub struct Bed {
    pub dir: PathBuf,
    pub files: Files,
    /// gpuhook's config (the fake host, the state, the runtime, the state roots).
    pub config: PathBuf,
    pub ctd: Containerd,
    pub cri: Cri,
    /// The RuntimeClass's name and the handler it names (`gpuhook`).
    pub runtimeclass: String,
    pub handler: String,
    /// The cgroup parent of this bed's pods (`/gpuhook-cri/NAME`), as kubelet's
    /// `/kubepods/…` with the cgroupfs driver.
    pub cgroup_parent: String,
    pub keep: bool,
}

/// The runc the bed's gpuhook runs: `runc` on `PATH`, else `/usr/sbin/runc`.
pub fn runc() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("runc"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/runc"))
}

impl Bed {
    /// A bed named `name` on the fake host `fake`, under `/var/lib/gpuhook-tests`.
    pub fn new(files: &Files, name: &str, fake: FakeHost) -> Result<Bed, String> {
        let tag = format!("{name}-{}", std::process::id());
        Bed::at(
            files,
            &crate::trusted_tmp().join(format!("cri-{tag}")),
            &tag,
            fake,
        )
    }

    /// A bed in `dir` (emptied first), its pods' cgroups under `/gpuhook-cri/TAG`.
    pub fn at(files: &Files, dir: &Path, tag: &str, fake: FakeHost) -> Result<Bed, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err(
                "the CRI bed runs containerd, cgroups and device nodes: run it as root".into(),
            );
        }
        let (runtimeclass, handler) = runtimeclass_handler(&files.runtimeclass)?;
        let dir = dir.to_path_buf();
        containerd::unmount_under(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let paths = fake
            .create(&dir.join("host"))
            .map_err(|e| format!("fake host: {e}"))?;
        let mut cfg = paths.config(&dir.join("run/state.json"));
        cfg["oci_runtime"] = json!(runc());
        cfg["oci_state_roots"] =
            json!([dir.join("containerd/runc").join(containerd::K8S_NAMESPACE)]);
        let config = dir.join("config.json");
        std::fs::write(&config, serde_json::to_vec_pretty(&cfg).expect("json"))
            .map_err(|e| format!("{}: {e}", config.display()))?;
        let ctd = Containerd::start(&containerd::Options {
            dir: dir.join("containerd"),
            gpuhook: files.gpuhook.clone(),
            gpuhook_config: config.clone(),
            snippet: files.snippet.clone(),
        })?;
        let images = dir.join("images");
        std::fs::create_dir_all(&images).map_err(|e| e.to_string())?;
        // The pause container: PID 1 of the pod's namespaces until killed, reaping what it
        // is given (a shared PID namespace's orphans).
        let pause = crate::image::busybox_tarball(
            &images,
            "gh-pause:test",
            &crate::image::Run {
                entrypoint: vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done".into(),
                ],
                cmd: vec![],
            },
        )?;
        let busybox = crate::image::busybox_tarball(
            &images,
            "gh-busybox:test",
            &crate::image::Run {
                entrypoint: vec![],
                cmd: vec!["sh".into()],
            },
        )?;
        ctd.import(&pause)?;
        ctd.import(&busybox)?;
        let mut cri = ctd.cri().map_err(|e| e.to_string())?;
        for i in [PAUSE_IMAGE, BUSYBOX_IMAGE] {
            if !cri.image_present(i).map_err(|e| e.to_string())? {
                return Err(format!("the CRI plugin does not see {i} after its import"));
            }
        }
        Ok(Bed {
            cgroup_parent: format!("/gpuhook-cri/{tag}"),
            dir,
            files: files.clone(),
            config,
            ctd,
            cri,
            runtimeclass,
            handler,
            keep: false,
        })
    }

    /// `gpuhook ARGS…` with the bed's config.
    pub fn gh(&self, args: &[&str]) -> Output {
        Command::new(&self.files.gpuhook)
            .args(args)
            .env("GPUHOOK_CONFIG", &self.config)
            .env_remove("GPUHOOK_VERBOSE")
            .output()
            .expect("run gpuhook")
    }

    /// `gpuhook list --json`.
    pub fn list(&self) -> Value {
        let o = self.gh(&["list", "--json"]);
        assert!(o.status.success(), "gpuhook list: {}", stderr(&o));
        serde_json::from_slice(&o.stdout).expect("list --json")
    }

    /// Holder ID → the PCI addresses it holds, per `list --json`.
    pub fn holders(&self) -> BTreeMap<String, Vec<String>> {
        let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for g in self.list()["gpus"].as_array().expect("gpus") {
            if let Some(d) = g["holder"]["domain"].as_str() {
                m.entry(d.to_owned())
                    .or_default()
                    .push(g["pci"].as_str().expect("pci").to_owned());
            }
        }
        m
    }

    /// Runs a pod's sandbox on `handler`.
    pub fn pod_on(&mut self, spec: PodSpec, handler: &str) -> Result<Pod, CriError> {
        let log_dir = self
            .ctd
            .opts
            .dir
            .join("pods")
            .join(format!("{}_{}_{}", spec.namespace, spec.name, spec.uid));
        let _ = std::fs::create_dir_all(&log_dir);
        let cg = format!("{}/pod{}", self.cgroup_parent, spec.uid);
        let config = spec.sandbox_config(&cg, &log_dir);
        let id = self.cri.run_pod_sandbox(&config, handler)?;
        Ok(Pod {
            id,
            spec,
            config,
            log_dir,
        })
    }

    /// Runs a pod's sandbox on the RuntimeClass's handler; panics when it cannot.
    pub fn pod(&mut self, spec: PodSpec) -> Pod {
        let h = self.handler.clone();
        self.pod_on(spec, &h)
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", self.ctd.log_tail()))
    }

    /// `CreateContainer` of busybox running `script` under `sh -c`.
    pub fn create(&mut self, pod: &Pod, name: &str, script: &str) -> Result<String, CriError> {
        let c = pod
            .spec
            .container_config(name, BUSYBOX_IMAGE, &["/bin/sh", "-c", script]);
        self.cri.create_container(&pod.id, &c, &pod.config)
    }

    /// `CreateContainer` + `StartContainer`, as kubelet starts a container; panics when it
    /// cannot.
    pub fn run(&mut self, pod: &Pod, name: &str, script: &str) -> String {
        let id = self
            .create(pod, name, script)
            .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}"));
        if let Err(e) = self.cri.start_container(&id) {
            panic!("StartContainer {name}: {e}");
        }
        id
    }

    /// `ExecSync` of `sh -c script`: (exit code, stdout, stderr).
    pub fn exec(&mut self, id: &str, script: &str) -> (i32, String, String) {
        let r = self
            .cri
            .exec_sync(id, &["/bin/sh", "-c", script], 30)
            .unwrap_or_else(|e| panic!("ExecSync in {id}: {e}"));
        (
            r.exit_code,
            String::from_utf8_lossy(&r.stdout).into_owned(),
            String::from_utf8_lossy(&r.stderr).into_owned(),
        )
    }

    /// The container's state (`ContainerStatus`).
    pub fn state(&mut self, id: &str) -> (i32, i32) {
        let s = self
            .cri
            .container_status(id)
            .unwrap_or_else(|e| panic!("ContainerStatus {id}: {e}"))
            .status
            .expect("a status");
        (s.state, s.exit_code)
    }

    /// Waits until the container has exited (its exit code).
    pub fn wait_exited(&mut self, id: &str, limit: Duration) -> i32 {
        let deadline = Instant::now() + limit;
        loop {
            let (state, code) = self.state(id);
            if state == api::ContainerState::ContainerExited as i32 {
                return code;
            }
            assert!(Instant::now() < deadline, "{id} did not exit in {limit:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Tears the bed down: pods, containerd, shims, mounts, the pods' cgroups; the directory
    /// too unless kept.
    pub fn teardown(&mut self) -> Vec<String> {
        let notes = self.ctd.teardown();
        remove_cgroups(&self.cgroup_parent);
        if !self.keep {
            containerd::unmount_under(&self.dir);
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        notes
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        for n in self.teardown() {
            eprintln!("cri bed: {n}");
        }
        if self.keep {
            eprintln!("cri bed kept for inspection: {}", self.dir.display());
        }
    }
}

/// Removes the (empty) cgroup directories the bed's pods left, under every cgroup mount.
pub fn remove_cgroups(parent: &str) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    for l in info.lines() {
        let (pre, post) = l.split_once(" - ").unwrap_or((l, ""));
        if !post.starts_with("cgroup") {
            continue;
        }
        let Some(mnt) = pre.split_whitespace().nth(4) else {
            continue;
        };
        let top = Path::new(mnt).join(parent.trim_start_matches('/'));
        rmdir_tree(&top);
        // `/gpuhook-cri` itself, once no bed uses it.
        if let Some(p) = top.parent() {
            let _ = std::fs::remove_dir(p);
        }
    }
}

fn rmdir_tree(p: &Path) {
    if let Ok(d) = std::fs::read_dir(p) {
        for e in d.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                rmdir_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(p);
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
