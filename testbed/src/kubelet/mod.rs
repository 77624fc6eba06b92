//! A kubelet stand-in: kubelet's side of the device plugin API `v1beta1` and of the pod
//! resources API `v1`, spoken over unix sockets exactly as kubelet speaks them, and the part
//! of kubelet that turns a pod's `resources.limits` into devices and those into the CRI
//! `CreateContainer` (driven through [`crate::cri`]). There is no kubelet on the test
//! machines; its side of these protocols is small, and each behaviour here is kubelet's own
//! (the files named are under kubelet's `pkg/kubelet/cm/devicemanager/` unless said):
//!
//! - **Registration** (`plugin/v1beta1/server.go`, `handler.go`, `client.go`): serves
//!   `v1beta1.Registration/Register` on `<plugin dir>/kubelet.sock`. A request whose version
//!   is not `v1beta1`, or whose resource name is not an extended resource name (a domain
//!   prefix, not `kubernetes.io/`), is answered with kubelet's error. Otherwise kubelet dials
//!   `<plugin dir>/<endpoint>` (blocking, 10 s), calls `GetDevicePluginOptions`, and only
//!   then answers the `Register`; after that it opens `ListAndWatch` and keeps each
//!   message's list as the resource's devices (all, healthy, their topology), writing its
//!   checkpoint after each. A stream that ends marks the resource's devices unhealthy. A
//!   second registration of a resource replaces the first.
//! - **Allocation** (`manager.go`: `Allocate`, `allocateContainerResources`,
//!   `devicesToAllocate`): for each container, init containers first, each resource of its
//!   `limits` the plugin registered: the pods kubelet no longer runs are forgotten
//!   (`UpdateAllocatedDevices`), devices an init container held are reused, then with
//!   `get_preferred_allocation_available` `GetPreferredAllocation(available, must include,
//!   size)`, the preferred ones that are available, then any available ones; `Allocate` with
//!   the chosen IDs; the response is kept per pod, container and resource and the checkpoint
//!   written. Not enough healthy free devices, or an `Allocate` that fails, rejects the pod
//!   with kubelet's words ([`devices`]).
//! - **The container** (`pod_devices.go` `deviceRunContainerOptions`,
//!   `kuberuntime_container.go` `generateContainerConfig`): with `pre_start_required`,
//!   `PreStartContainer` first; then the kept responses go into CRI's `ContainerConfig`:
//!   `envs`, `mounts` (read-only as asked, no SELinux relabel), `devices` (host path,
//!   container path, permissions), `annotations` (kubelet's own win a conflict) and
//!   `cdi_devices` (CRI's `CDI_devices`; kubelet passes a device plugin's CDI names in that
//!   field only, never as `cdi.k8s.io/` annotations, which it writes for dynamic resource
//!   claims alone) ([`pods`]).
//! - **The checkpoint** `<plugin dir>/kubelet_internal_checkpoint` ([`checkpoint`]), written
//!   on each allocation and each `ListAndWatch` message, never when a pod goes: a deleted
//!   pod's entries leave it at the next write after kubelet forgot the pod (the next
//!   allocation, or a pod resources `List` followed by a write).
//! - **Pod resources** (`pkg/kubelet/apis/podresources/server_v1.go`): `List` (every active
//!   pod, each app container's devices, one `ContainerDevices` per device and NUMA node; it
//!   forgets inactive pods first, as kubelet's does), `GetAllocatableResources` (the healthy
//!   devices), `Get` (one pod), on `<plugin dir>/../pod-resources/kubelet.sock`
//!   ([`podresources`]). A bed can run without it (a kubelet whose plugin cannot reach it).
//! - **Restart** (`server.go` `Start`, `manager.go` `CleanupPluginDirectory`,
//!   `readCheckpoint`): every socket file in the plugin directory is removed (not the
//!   checkpoint, not directories), the state comes back from the checkpoint (allocations;
//!   each resource known with no device until its plugin registers again), and `kubelet.sock`
//!   is made anew.
//!
//! What the stand-in leaves out: the topology manager (its default policy `none` gives no
//! NUMA hint, so kubelet takes no alignment into account), the scheduler (a pod is admitted
//! here as kubelet admits a pod the API server bound to it), node status, and the
//! five-minute grace before a gone plugin's resource is dropped.

pub mod bed;
pub mod checkpoint;
pub mod cli;
pub mod devices;
pub mod plugin;
pub mod podresources;
pub mod pods;
pub mod scenarios;
#[cfg(test)]
mod selftest;

use devices::Devices;
use kubelet_api::v1beta1 as api;
use plugin::Endpoint;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

/// What happened between kubelet and the plugins, in order, with the time it happened.
#[derive(Debug, Clone)]
pub struct Event {
    pub at: SystemTime,
    pub what: EventKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    /// A `Register` kubelet accepted (after dialing the plugin and asking its options).
    Registered {
        resource: String,
        endpoint: String,
        options: api::DevicePluginOptions,
    },
    /// A `Register` kubelet refused, with its error.
    Refused { resource: String, why: String },
    /// A `ListAndWatch` message.
    Listed {
        resource: String,
        devices: Vec<Listed>,
    },
    /// A plugin's stream ended (or kubelet stopped): its devices count as unhealthy.
    Ended { resource: String, why: String },
}

/// A device as a `ListAndWatch` message lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub id: String,
    pub health: String,
    /// Its topology's NUMA nodes.
    pub numa: Vec<i64>,
}

/// A pod kubelet runs: what kubelet knows of it from the API server.
#[derive(Debug, Clone)]
pub struct ActivePod {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    /// App containers' names, in order (init containers are not listed by pod resources).
    pub containers: Vec<String>,
}

/// kubelet's state, shared by its servers, its plugin clients and the bed.
#[derive(Debug, Default)]
pub struct State {
    pub devices: Devices,
    /// Resource → the plugin endpoint kubelet talks to.
    pub endpoints: BTreeMap<String, Endpoint>,
    /// The pods kubelet runs (admitted, not deleted), by UID.
    pub active: BTreeMap<String, ActivePod>,
    pub events: Vec<Event>,
    /// Whether the pod resources API is served.
    pub pod_resources: bool,
    /// Bumped at each start: a stream of an older start writes nothing.
    pub generation: u64,
}

impl State {
    pub fn event(&mut self, what: EventKind) {
        self.events.push(Event {
            at: SystemTime::now(),
            what,
        });
    }

    pub fn active_uids(&self) -> BTreeSet<String> {
        self.active.keys().cloned().collect()
    }
}

/// What the servers and the plugin clients share.
pub struct Shared {
    /// kubelet's device plugin directory (`/var/lib/kubelet/device-plugins/`).
    pub dir: PathBuf,
    pub state: Mutex<State>,
    /// Notified at every change of the state.
    pub changed: Condvar,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the checkpoint of the state (`writeCheckpoint`); kubelet logs a failure.
    pub fn write_checkpoint(&self, st: &State) {
        if let Err(e) = st.devices.checkpoint().write(&self.dir) {
            eprintln!("kubelet stand-in: {e}");
        }
    }

    /// Changes the state and wakes whoever waits on it.
    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let r = f(&mut self.lock());
        self.changed.notify_all();
        r
    }

    /// Waits until `ok` holds of the state, `limit` at most: whether it did.
    pub fn wait(&self, limit: Duration, mut ok: impl FnMut(&State) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        let mut st = self.lock();
        loop {
            if ok(&st) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self
                .changed
                .wait_timeout(st, left.min(Duration::from_millis(100)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// The pod resources socket beside a plugin directory: `<dir>/../pod-resources/kubelet.sock`.
pub fn pod_resources_socket(plugin_dir: &Path) -> PathBuf {
    plugin_dir
        .parent()
        .unwrap_or(plugin_dir)
        .join("pod-resources")
        .join(kubelet_api::KUBELET_SOCKET)
}

/// The running servers of one start.
struct Running {
    stop: Vec<tokio::sync::oneshot::Sender<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The kubelet stand-in: its servers run on a runtime of their own; the bed calls it from
/// plain threads.
pub struct Kubelet {
    pub rt: tokio::runtime::Runtime,
    pub shared: Arc<Shared>,
    running: Option<Running>,
}

impl Kubelet {
    /// Starts kubelet's servers for the plugin directory `dir` (made when missing), the pod
    /// resources API with them unless `pod_resources` is false.
    pub fn start(dir: &Path, pod_resources: bool) -> Result<Kubelet, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kubelet-stand-in")
            .enable_all()
            .build()
            .map_err(|e| format!("tokio: {e}"))?;
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            state: Mutex::new(State {
                pod_resources,
                ..State::default()
            }),
            changed: Condvar::new(),
        });
        let mut k = Kubelet {
            rt,
            shared,
            running: None,
        };
        k.up()?;
        Ok(k)
    }

    /// kubelet's start: the directory cleaned of sockets, the state read back from the
    /// checkpoint, the servers listening.
    fn up(&mut self) -> Result<(), String> {
        let dir = self.shared.dir.clone();
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        cleanup_plugin_dir(&dir)?;
        let devices = match checkpoint::Checkpoint::read(&dir) {
            Ok(Some(cp)) => Devices::from_checkpoint(&cp),
            Ok(None) => Devices::default(),
            Err(e) => {
                // kubelet: "Continue after failing to read checkpoint file".
                eprintln!("kubelet stand-in: {e}");
                Devices::default()
            }
        };
        let serve_podres = self.shared.with(|st| {
            st.devices = devices;
            st.endpoints.clear();
            st.generation += 1;
            st.pod_resources
        });
        let mut running = Running {
            stop: Vec::new(),
            tasks: Vec::new(),
        };
        let (tx, task) = plugin::serve_registration(&self.rt, &self.shared)?;
        running.stop.push(tx);
        running.tasks.push(task);
        if serve_podres {
            let (tx, task) = podresources::serve(&self.rt, &self.shared)?;
            running.stop.push(tx);
            running.tasks.push(task);
        }
        self.running = Some(running);
        Ok(())
    }

    /// kubelet's stop: its servers closed, every plugin stream dropped (each resource's
    /// devices unhealthy).
    pub fn stop(&mut self) {
        let Some(r) = self.running.take() else {
            return;
        };
        for s in r.stop {
            let _ = s.send(());
        }
        self.rt.block_on(async {
            for t in r.tasks {
                let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
            }
        });
        self.shared.with(|st| {
            let gone: Vec<String> = st.endpoints.keys().cloned().collect();
            for r in gone {
                if let Some(e) = st.endpoints.remove(&r) {
                    e.abort();
                }
                st.devices.mark_unhealthy(&r);
                st.event(EventKind::Ended {
                    resource: r,
                    why: "kubelet stopped".into(),
                });
            }
        });
    }

    /// kubelet restarted: stopped, then started again from its checkpoint; the pods it runs
    /// stay (they come from the API server).
    pub fn restart(&mut self) -> Result<(), String> {
        self.stop();
        self.up()
    }

    /// Serves the pod resources API from the next start on (or not).
    pub fn set_pod_resources(&self, on: bool) {
        self.shared.with(|st| st.pod_resources = on);
    }

    pub fn socket(&self) -> PathBuf {
        self.shared.dir.join(kubelet_api::KUBELET_SOCKET)
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `CleanupPluginDirectory`: every socket in the directory goes, but the checkpoint and
/// directories stay.
pub fn cleanup_plugin_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    let list = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in list.flatten() {
        if e.file_name() == checkpoint::FILE {
            continue;
        }
        let p = e.path();
        // kubelet stats (follows links); a dangling link is skipped as a stat error.
        match std::fs::metadata(&p) {
            Ok(m) if m.file_type().is_socket() => {
                std::fs::remove_file(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// kubelet's `IsExtendedResourceName` (with `IsQualifiedName` of its quota form).
pub fn is_extended_resource_name(name: &str) -> bool {
    let Some((prefix, base)) = name.split_once('/') else {
        return false;
    };
    if name.contains("kubernetes.io/") || name.starts_with("requests.") {
        return false;
    }
    let dns_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let prefix_ok = prefix.len() <= 253 && prefix.split('.').all(dns_label);
    let b = base.as_bytes();
    let base_ok = !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    prefix_ok && base_ok && !base.contains('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_resource_names_as_kubelet_takes_them() {
        for ok in [
            "gpuhook.io/gpu",
            "gpuhook.io/mig-1g.10gb",
            "gpuhook.io/gpu-shared",
            "nvidia.com/gpu",
        ] {
            assert!(is_extended_resource_name(ok), "{ok}");
        }
        for bad in [
            "gpu",
            "kubernetes.io/gpu",
            "gpuhook.io/",
            "gpuhook.io/a/b",
            "Gpuhook.io/gpu",
            "gpuhook.io/-gpu",
        ] {
            assert!(!is_extended_resource_name(bad), "{bad}");
        }
    }

    #[test]
    fn cleanup_leaves_the_checkpoint_files_and_directories() {
        let d = tempfile_dir("cleanup");
        std::fs::write(d.join(checkpoint::FILE), "{}").unwrap();
        std::fs::write(d.join("notes"), "x").unwrap();
        std::fs::create_dir(d.join("sub")).unwrap();
        let _l = std::os::unix::net::UnixListener::bind(d.join("gpuhook.sock")).unwrap();
        cleanup_plugin_dir(&d).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, [checkpoint::FILE, "notes", "sub"]);
        let _ = std::fs::remove_dir_all(&d);
    }

    fn tempfile_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gpuhook-kubelet-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
