//! One kubelet scenario's world: the CRI bed ([`crate::cri::bed::Bed`]: a fake GPU host,
//! gpuhook's config for it, a private containerd with the shipped gpuhook handler), the
//! kubelet stand-in in `<bed>/kubelet/device-plugins` (pod resources beside it), and gpuhook's
//! device plugin started on the bed's config with `kubelet_plugin_dir` pointing there. Pods
//! go through kubelet's admission (the plugin's `Allocate`) and then the CRI, as kubelet
//! runs them.

use super::pods::{apply, Container, Pod};
use super::{EventKind, Kubelet, Listed};
use crate::cri::bed::{Bed, Files as CriFiles};
use crate::cri::containerd::BUSYBOX_IMAGE;
use crate::{FakeHost, HostPaths};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// The roots of the fake host made at `root` (as [`FakeHost::create`] lays them out).
pub fn host_paths(root: &Path) -> HostPaths {
    HostPaths {
        root: root.to_path_buf(),
        sysfs: root.join("sys"),
        proc: root.join("proc"),
        dev: root.join("dev"),
    }
}

/// What a kubelet bed is made from: the CRI bed's files and the device plugin's command.
#[derive(Debug, Clone)]
pub struct Files {
    pub cri: CriFiles,
    /// The device plugin: program and arguments (it reads `GPUHOOK_CONFIG`).
    pub plugin: Vec<String>,
}

impl Files {
    /// The gpuhook binary given; the plugin `$GPUHOOK_DEVICE_PLUGIN` (a command line, split
    /// at spaces), else `gpuhook-device-plugin` beside that binary when there is one, else
    /// `<gpuhook> device-plugin`.
    pub fn with(gpuhook: PathBuf) -> Files {
        let plugin = match std::env::var("GPUHOOK_DEVICE_PLUGIN") {
            Ok(cmd) if !cmd.trim().is_empty() => {
                cmd.split_whitespace().map(str::to_string).collect()
            }
            _ => {
                let beside = gpuhook.with_file_name("gpuhook-device-plugin");
                if beside.is_file() {
                    vec![beside.to_string_lossy().into_owned()]
                } else {
                    vec![
                        gpuhook.to_string_lossy().into_owned(),
                        "device-plugin".to_string(),
                    ]
                }
            }
        };
        Files {
            cri: CriFiles::with(gpuhook),
            plugin,
        }
    }
}

/// A pod kubelet runs: its manifest, its sandbox, its containers' IDs by name.
#[derive(Debug, Clone)]
pub struct RunningPod {
    pub pod: Pod,
    pub sandbox: crate::cri::bed::Pod,
    pub containers: Vec<(String, String)>,
}

impl RunningPod {
    pub fn id(&self, name: &str) -> &str {
        self.containers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, id)| id.as_str())
            .unwrap_or_else(|| panic!("no container {name} in pod {}", self.pod.spec.name))
    }
}

pub struct KubeletBed {
    pub cri: Bed,
    pub kubelet: Kubelet,
    pub plugin_dir: PathBuf,
    pub files: Files,
    plugin: Option<Child>,
    pub plugin_log: PathBuf,
    plugin_starts: u32,
}

impl KubeletBed {
    /// A bed named `name` on the fake host `fake`, gpuhook's config changed by `edit` (the
    /// plugin directory is set before), the pod resources API served or not; the plugin
    /// started.
    pub fn new(
        files: &Files,
        name: &str,
        fake: FakeHost,
        pod_resources: bool,
        edit: impl FnOnce(&mut Value, &HostPaths),
    ) -> Result<KubeletBed, String> {
        let tag = format!("k{name}-{}", std::process::id());
        let dir = crate::trusted_tmp().join(format!("kubelet-{tag}"));
        let cri = Bed::at(&files.cri, &dir, &tag, fake)?;
        let plugin_dir = dir.join("kubelet/device-plugins");
        let mut cfg: Value = serde_json::from_slice(
            &std::fs::read(&cri.config).map_err(|e| format!("{}: {e}", cri.config.display()))?,
        )
        .map_err(|e| e.to_string())?;
        cfg["kubelet_plugin_dir"] = serde_json::json!(plugin_dir);
        edit(&mut cfg, &host_paths(&dir.join("host")));
        std::fs::write(&cri.config, serde_json::to_vec_pretty(&cfg).expect("json"))
            .map_err(|e| format!("{}: {e}", cri.config.display()))?;
        let kubelet = Kubelet::start(&plugin_dir, pod_resources)?;
        let plugin_log = dir.join("plugin.log");
        let mut b = KubeletBed {
            cri,
            kubelet,
            plugin_dir,
            files: files.clone(),
            plugin: None,
            plugin_log,
            plugin_starts: 0,
        };
        b.start_plugin()?;
        Ok(b)
    }

    /// Starts the device plugin on the bed's config, its output appended to `plugin.log`.
    pub fn start_plugin(&mut self) -> Result<(), String> {
        use std::io::Write;
        self.plugin_starts += 1;
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.plugin_log)
            .map_err(|e| format!("{}: {e}", self.plugin_log.display()))?;
        let _ = writeln!(
            log,
            "==== start {} of {:?}",
            self.plugin_starts, self.files.plugin
        );
        let (prog, args) = self
            .files
            .plugin
            .split_first()
            .ok_or("no device plugin command")?;
        let child = Command::new(prog)
            .args(args)
            .env("GPUHOOK_CONFIG", &self.cri.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting the device plugin {prog}: {e}"))?;
        self.plugin = Some(child);
        Ok(())
    }

    /// Kills the plugin (SIGKILL, as a node's OOM killer or a crash would) and reaps it.
    pub fn kill_plugin(&mut self) {
        if let Some(mut c) = self.plugin.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the plugin as systemd stops a service (SIGTERM, then SIGKILL after 10 s).
    pub fn stop_plugin(&mut self) {
        let Some(mut c) = self.plugin.take() else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(c.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Whether the plugin process still runs (its exit status when it does not).
    pub fn plugin_exited(&mut self) -> Option<std::process::ExitStatus> {
        self.plugin
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn plugin_log_text(&self) -> String {
        std::fs::read_to_string(&self.plugin_log).unwrap_or_default()
    }

    /// The last `n` lines of the plugin's log.
    pub fn plugin_log_tail(&self, n: usize) -> String {
        crate::libvirtd::tail(&self.plugin_log, n)
    }

    /// What the plugin said last for `resource`, and when; `None` before its first message.
    pub fn listed(&self, resource: &str) -> Option<(SystemTime, Vec<Listed>)> {
        let st = self.kubelet.shared.lock();
        st.events.iter().rev().find_map(|e| match &e.what {
            EventKind::Listed {
                resource: r,
                devices,
            } if r == resource => Some((e.at, devices.clone())),
            _ => None,
        })
    }

    /// The resources registered with kubelet now.
    pub fn registered(&self) -> Vec<String> {
        self.kubelet
            .shared
            .lock()
            .endpoints
            .keys()
            .cloned()
            .collect()
    }

    /// Waits (`limit` at most) until each of `resources` is registered and has listed its
    /// devices once; an error with the plugin's log when not (at once when the plugin exits).
    pub fn wait_registered(&mut self, resources: &[&str], limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let mut exited = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ok = self
                .kubelet
                .shared
                .wait(left.min(Duration::from_millis(200)), |st| {
                    resources
                        .iter()
                        .all(|r| st.endpoints.contains_key(*r) && st.devices.all.contains_key(*r))
                });
            if ok {
                return Ok(());
            }
            if exited.is_none() {
                exited = self.plugin_exited();
            }
            if left.is_zero() || exited.is_some() {
                break;
            }
        }
        let how = match exited {
            Some(st) => format!("the device plugin exited ({st})"),
            None => format!(
                "the device plugin did not register {resources:?} with kubelet in {limit:?}"
            ),
        };
        Err(format!(
            "{how} (registered: {:?}); kubelet saw: {:?}; the plugin's log:\n{}",
            self.registered(),
            self.kubelet.shared.lock().events,
            self.plugin_log_tail(30)
        ))
    }

    /// Waits until the plugin lists `id` of `resource` with `health`: when the message that
    /// said so came, or `None` after `limit`.
    pub fn wait_health(
        &self,
        resource: &str,
        id: &str,
        health: &str,
        limit: Duration,
    ) -> Option<SystemTime> {
        let mut at = None;
        self.kubelet.shared.wait(limit, |st| {
            at = st
                .events
                .iter()
                .rev()
                .find_map(|e| match &e.what {
                    EventKind::Listed {
                        resource: r,
                        devices,
                    } if r == resource => Some(
                        devices
                            .iter()
                            .any(|d| d.id == id && d.health == health)
                            .then_some(e.at),
                    ),
                    _ => None,
                })
                .flatten();
            at.is_some()
        });
        at
    }

    /// kubelet admits the pod, then runs it through the CRI: its sandbox on the pod's
    /// runtime class, each init container to its end, each app container started.
    pub fn run_pod(&mut self, pod: &Pod) -> Result<RunningPod, String> {
        self.kubelet
            .admit(pod)
            .map_err(|e| format!("kubelet rejected pod {}: {e}", pod.spec.name))?;
        self.start_pod(pod)
    }

    /// The CRI part of [`KubeletBed::run_pod`], for a pod kubelet admitted.
    pub fn start_pod(&mut self, pod: &Pod) -> Result<RunningPod, String> {
        let handler = pod.handler.clone().unwrap_or_default();
        let sandbox = self
            .cri
            .pod_on(pod.spec.clone(), &handler)
            .map_err(|e| format!("RunPodSandbox {}: {e}", pod.spec.name))?;
        let mut running = RunningPod {
            pod: pod.clone(),
            sandbox,
            containers: Vec::new(),
        };
        for c in &pod.init {
            let id = self.create(&running, c)?;
            self.cri
                .cri
                .start_container(&id)
                .map_err(|e| format!("StartContainer {}: {e}", c.name))?;
            let code = self.cri.wait_exited(&id, Duration::from_secs(60));
            if code != 0 {
                return Err(format!("init container {} exited {code}", c.name));
            }
            running.containers.push((c.name.clone(), id));
        }
        for c in &pod.containers {
            let id = self.create(&running, c)?;
            self.cri
                .cri
                .start_container(&id)
                .map_err(|e| format!("StartContainer {}: {e}", c.name))?;
            running.containers.push((c.name.clone(), id));
        }
        Ok(running)
    }

    /// The config kubelet sends for a container: its manifest, then its devices'.
    pub fn container_config(
        &self,
        pod: &Pod,
        c: &Container,
    ) -> Result<crate::cri::api::ContainerConfig, String> {
        let responses = self
            .kubelet
            .run_options(pod, c)
            .map_err(|e| format!("container {}: {e}", c.name))?;
        let mut config =
            pod.spec
                .container_config(&c.name, BUSYBOX_IMAGE, &["/bin/sh", "-c", &c.script]);
        apply(&mut config, &responses);
        Ok(config)
    }

    /// `CreateContainer` of one of the pod's containers, as kubelet sends it.
    pub fn create(&mut self, running: &RunningPod, c: &Container) -> Result<String, String> {
        let config = self.container_config(&running.pod, c)?;
        self.cri
            .cri
            .create_container(&running.sandbox.id, &config, &running.sandbox.config)
            .map_err(|e| format!("CreateContainer {}: {e}", c.name))
    }

    /// The pod deleted: its containers stopped and removed, its sandbox too, then kubelet
    /// no longer runs it.
    pub fn delete_pod(&mut self, p: &RunningPod) {
        for (_, id) in p.containers.iter().rev() {
            let _ = self.cri.cri.stop_container(id, 0);
            let _ = self.cri.cri.remove_container(id);
        }
        let _ = self.cri.cri.stop_pod_sandbox(&p.sandbox.id);
        let _ = self.cri.cri.remove_pod_sandbox(&p.sandbox.id);
        self.kubelet.delete(&p.pod);
    }

    /// `gpuhook list --json`.
    pub fn list(&self) -> Value {
        self.cri.list()
    }

    /// The bed's directory.
    pub fn dir(&self) -> &Path {
        &self.cri.dir
    }

    /// The fake host's roots.
    pub fn host(&self) -> HostPaths {
        host_paths(&self.cri.dir.join("host"))
    }

    /// The checkpoint as kubelet wrote it last.
    pub fn checkpoint(&self) -> super::checkpoint::Checkpoint {
        super::checkpoint::Checkpoint::read(&self.plugin_dir)
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_default()
    }
}

impl Drop for KubeletBed {
    fn drop(&mut self) {
        self.stop_plugin();
        self.kubelet.stop();
        if std::thread::panicking() {
            self.cri.keep = true;
            eprintln!(
                "device plugin log (tail):\n{}\nkubelet saw: {:#?}",
                self.plugin_log_tail(40),
                self.kubelet.shared.lock().events
            );
        }
    }
}
