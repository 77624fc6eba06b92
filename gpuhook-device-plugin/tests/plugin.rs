//! The real `gpuhook-device-plugin` on a fake host (the 8×H100 `dgx8`), against a kubelet
//! stand-in served here with tonic: kubelet's `Registration` on `kubelet.sock` and its pod
//! resources API on `../pod-resources/kubelet.sock`, and the plugin's own `DevicePlugin`
//! called on the socket it registered. The pool is changed as gpuhook's other doors change
//! it (a libvirt domain's reservation written through the state file's lock).

use gpuhook::reserve::state::{HolderKind, Phase, Reservation, State, Store};
use kubelet_api::v1::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
use kubelet_api::v1beta1::device_plugin_client::DevicePluginClient;
use kubelet_api::v1beta1::registration_server::{Registration, RegistrationServer};
use kubelet_api::v1beta1::{self as api, Empty};
use kubelet_api::{unix_channel, unix_incoming, v1};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testbed::FakeHost;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

/// The kubelet stand-in: what plugins registered, and the pods it lists.
#[derive(Clone, Default)]
struct Kubelet {
    registered: Arc<Mutex<Vec<api::RegisterRequest>>>,
    pods: Arc<Mutex<Vec<v1::PodResources>>>,
    tx: Option<mpsc::UnboundedSender<String>>,
}

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(&self, r: Request<api::RegisterRequest>) -> Result<Response<Empty>, Status> {
        let r = r.into_inner();
        if let Some(tx) = &self.tx {
            let _ = tx.send(r.resource_name.clone());
        }
        self.registered.lock().unwrap().push(r);
        Ok(Response::new(Empty {}))
    }
}

#[tonic::async_trait]
impl PodResourcesLister for Kubelet {
    async fn list(
        &self,
        _: Request<v1::ListPodResourcesRequest>,
    ) -> Result<Response<v1::ListPodResourcesResponse>, Status> {
        Ok(Response::new(v1::ListPodResourcesResponse {
            pod_resources: self.pods.lock().unwrap().clone(),
        }))
    }
    async fn get_allocatable_resources(
        &self,
        _: Request<v1::AllocatableResourcesRequest>,
    ) -> Result<Response<v1::AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("stand-in"))
    }
    async fn get(
        &self,
        _: Request<v1::GetPodResourcesRequest>,
    ) -> Result<Response<v1::GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("stand-in"))
    }
}

/// A fake host, its config and state, kubelet's directories, and the plugin running.
struct Bed {
    _dir: tempfile::TempDir,
    root: PathBuf,
    config: PathBuf,
    state: PathBuf,
    plugins: PathBuf,
    plugin: Option<Child>,
}

impl Bed {
    fn new(fake: FakeHost, edit: impl FnOnce(&mut serde_json::Value)) -> Bed {
        assert!(
            nix::unistd::geteuid().is_root(),
            "fake hosts make device nodes: run as root"
        );
        let dir = tempfile::Builder::new()
            .prefix("gpuhook-dp-")
            .tempdir_in(testbed::trusted_tmp())
            .unwrap();
        let root = dir.path().to_path_buf();
        let paths = fake.create(&root.join("host")).unwrap();
        let state = root.join("run/state.json");
        let plugins = root.join("kubelet/device-plugins");
        std::fs::create_dir_all(&plugins).unwrap();
        std::fs::create_dir_all(root.join("kubelet/pod-resources")).unwrap();
        std::fs::create_dir_all(root.join("run")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(root.join("run"), std::fs::Permissions::from_mode(0o700)).unwrap();
        let mut cfg = paths.config(&state);
        cfg["kubelet_plugin_dir"] = serde_json::json!(plugins);
        edit(&mut cfg);
        let config = root.join("config.json");
        std::fs::write(&config, cfg.to_string()).unwrap();
        Bed {
            _dir: dir,
            root,
            config,
            state,
            plugins,
            plugin: None,
        }
    }

    fn start_plugin(&mut self) {
        let child = Command::new(env!("CARGO_BIN_EXE_gpuhook-device-plugin"))
            .arg("--config")
            .arg(&self.config)
            .spawn()
            .unwrap();
        self.plugin = Some(child);
    }

    fn stop_plugin(&mut self) {
        if let Some(mut c) = self.plugin.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = c.wait();
        }
    }

    fn kubelet_sock(&self) -> PathBuf {
        self.plugins.join("kubelet.sock")
    }

    fn pod_resources_sock(&self) -> PathBuf {
        self.root.join("kubelet/pod-resources/kubelet.sock")
    }

    fn state(&self) -> State {
        Store::new(&self.state).read().unwrap()
    }

    /// Writes `edit` into the state under its lock, as every door does.
    fn change(&self, edit: impl FnOnce(&mut State)) {
        Store::new(&self.state)
            .update(|st| -> Result<(), gpuhook::reserve::state::StateError> {
                edit(st);
                Ok(())
            })
            .unwrap();
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        self.stop_plugin();
    }
}

/// Serves the kubelet stand-in: registration on `sock`, pod resources on `pods` (when given).
/// Returns a handle that stops both.
fn serve_kubelet(k: Kubelet, sock: &Path, pods: Option<&Path>) -> tokio::task::JoinHandle<()> {
    let _ = std::fs::remove_file(sock);
    let reg = unix_incoming(tokio::net::UnixListener::bind(sock).unwrap());
    let lister = pods.map(|p| {
        let _ = std::fs::remove_file(p);
        unix_incoming(tokio::net::UnixListener::bind(p).unwrap())
    });
    let k2 = k.clone();
    tokio::spawn(async move {
        let a = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(k))
            .serve_with_incoming(reg);
        match lister {
            Some(l) => {
                let b = tonic::transport::Server::builder()
                    .add_service(PodResourcesListerServer::new(k2))
                    .serve_with_incoming(l);
                let _ = tokio::join!(a, b);
            }
            None => {
                let _ = a.await;
            }
        }
    })
}

async fn wait_registered(rx: &mut mpsc::UnboundedReceiver<String>, name: &str, within: Duration) {
    let end = Instant::now() + within;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some(n)) if n == name => return,
            Ok(Some(_)) => continue,
            _ => panic!("{name} not registered within {within:?}"),
        }
    }
}

/// The next list from `s` that satisfies `ok`, within `within`; returns it and how long it
/// took.
async fn next_list(
    s: &mut tonic::Streaming<api::ListAndWatchResponse>,
    within: Duration,
    ok: impl Fn(&[api::Device]) -> bool,
) -> (Vec<api::Device>, Duration) {
    let t0 = Instant::now();
    loop {
        let left = within.saturating_sub(t0.elapsed());
        let m = tokio::time::timeout(left, s.message())
            .await
            .unwrap_or_else(|_| panic!("no fitting ListAndWatch update within {within:?}"))
            .unwrap()
            .unwrap();
        if ok(&m.devices) {
            return (m.devices, t0.elapsed());
        }
    }
}

/// The reservation of pod allocation `alloc`.
fn alloc_of<'a>(st: &'a State, alloc: &str) -> Option<&'a Reservation> {
    st.reservations
        .values()
        .find(|r| r.kind() == HolderKind::Pod && r.holder.name() == alloc)
}

fn health_of<'a>(l: &'a [api::Device], id: &str) -> &'a str {
    &l.iter()
        .find(|d| d.id == id)
        .unwrap_or_else(|| panic!("no {id} in {l:?}"))
        .health
}

/// A libvirt domain's running reservation of `pci`, its init this test process (alive).
fn domain_holds(st: &mut State, name: &str, uuid: &str, pci: &str) {
    let mut r: Reservation = serde_json::from_value(serde_json::json!({
        "domain": name, "uuid": uuid, "gpus": [pci], "phase": "running",
        "request": "1 GPU", "created": "2026-01-01T00:00:00Z", "updated": "2026-01-01T00:00:00Z",
    }))
    .unwrap();
    r.init = gpuhook::host::procfs::ProcRef::of(std::process::id() as i32);
    assert_eq!(r.phase, Phase::Running);
    st.insert(r);
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

const U1: &str = "4c7f30aa-ffe6-489b-80ff-0f27ece176a3";

/// Registration, the devices with their NUMA nodes, health that follows the pool within
/// 1 s (a domain takes a GPU, frees it), `Allocate` reserving for a pod or refusing in one
/// line naming the domain, and a pod kubelet stops listing freed.
#[test]
fn registers_advertises_the_pool_and_allocates_in_it() {
    let mut bed = Bed::new(FakeHost::dgx8(), |_| {});
    rt().block_on(async {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let k = Kubelet {
            tx: Some(tx),
            ..Kubelet::default()
        };
        let _srv = serve_kubelet(k.clone(), &bed.kubelet_sock(), Some(&bed.pod_resources_sock()));
        bed.start_plugin();
        wait_registered(&mut rx, "gpuhook.io/gpu", Duration::from_secs(10)).await;
        let reg = k.registered.lock().unwrap()[0].clone();
        assert_eq!(reg.version, "v1beta1");
        assert_eq!(reg.endpoint, "gpuhook-gpu.sock");
        let opts = reg.options.unwrap();
        assert!(!opts.pre_start_required && opts.get_preferred_allocation_available);

        let mut plugin = DevicePluginClient::new(unix_channel(&bed.plugins.join("gpuhook-gpu.sock")).unwrap());
        let mut s = plugin.list_and_watch(Empty {}).await.unwrap().into_inner();
        let (first, _) = next_list(&mut s, Duration::from_secs(5), |_| true).await;
        assert_eq!(first.len(), 8, "{first:?}");
        assert!(first.iter().all(|d| d.health == "Healthy"), "{first:?}");
        let d0 = first.iter().find(|d| d.id == "0000:18:00.0").unwrap();
        assert_eq!(d0.topology.as_ref().unwrap().nodes[0].id, 0);
        let d7 = first.iter().find(|d| d.id == "0000:ca:00.0").unwrap();
        assert_eq!(d7.topology.as_ref().unwrap().nodes[0].id, 1);

        // A libvirt domain takes a GPU: unhealthy within 1 s; freed: healthy again.
        bed.change(|st| domain_holds(st, "web1", U1, "0000:1a:00.0"));
        let (l, took) = next_list(&mut s, Duration::from_secs(1), |l| {
            health_of(l, "0000:1a:00.0") == "Unhealthy"
        })
        .await;
        assert!(took < Duration::from_secs(1), "{took:?}");
        assert_eq!(l.iter().filter(|d| d.health == "Healthy").count(), 7);
        // Allocate of the unit the domain took since: refused, naming the domain.
        let refused = plugin
            .allocate(api::AllocateRequest {
                container_requests: vec![api::ContainerAllocateRequest {
                    devices_ids: vec!["0000:1a:00.0".into()],
                }],
            })
            .await
            .unwrap_err();
        assert_eq!(
            refused.message(),
            format!("gpuhook.io/gpu: device 0000:1a:00.0 was taken by domain 'web1' ({U1}) since the last ListAndWatch; nothing allocated")
        );
        assert!(!refused.message().contains('\n'));
        bed.change(|st| {
            st.reservations.clear();
        });
        next_list(&mut s, Duration::from_secs(1), |l| {
            health_of(l, "0000:1a:00.0") == "Healthy"
        })
        .await;

        // Allocate: reserved for a pod at once; the answer names the nodes, the allocation.
        let a = plugin
            .allocate(api::AllocateRequest {
                container_requests: vec![api::ContainerAllocateRequest {
                    devices_ids: vec!["0000:18:00.0".into()],
                }],
            })
            .await
            .unwrap()
            .into_inner();
        let c = &a.container_responses[0];
        let alloc = c.annotations["gpuhook.io/allocation"].clone();
        assert!(gpuhook::ids::is_alloc_id(&alloc), "{alloc}");
        let paths: Vec<&str> = c.devices.iter().map(|d| d.container_path.as_str()).collect();
        assert!(paths.contains(&"/dev/nvidia2") && paths.contains(&"/dev/nvidiactl"), "{paths:?}");
        let n0 = c.devices.iter().find(|d| d.container_path == "/dev/nvidia2").unwrap();
        assert_eq!(Path::new(&n0.host_path), bed.root.join("host/dev/nvidia2"));
        assert_eq!(n0.permissions, "rw");
        assert!(c.cdi_devices.is_empty(), "no driver configured: no CDI names");
        let st = bed.state();
        let r = alloc_of(&st, &alloc).unwrap();
        assert_eq!((r.kind(), r.gpus.len()), (HolderKind::Pod, 1));
        assert_eq!(r.holder.pod().unwrap().resource, "gpuhook.io/gpu");
        // Held by the pod: still healthy to kubelet, which counts it as used.
        let l = plugin.list_and_watch(Empty {}).await.unwrap().into_inner().message().await.unwrap().unwrap();
        assert_eq!(health_of(&l.devices, "0000:18:00.0"), "Healthy");

        // kubelet lists the pod: named; then no more: freed within 10 s.
        *k.pods.lock().unwrap() = vec![v1::PodResources {
            name: "trainer".into(),
            namespace: "ml".into(),
            containers: vec![v1::ContainerResources {
                name: "main".into(),
                devices: vec![v1::ContainerDevices {
                    resource_name: "gpuhook.io/gpu".into(),
                    device_ids: vec!["0000:18:00.0".into()],
                    topology: None,
                }],
                ..Default::default()
            }],
        }];
                wait_until(Duration::from_secs(10), || {
            alloc_of(&bed.state(), &alloc).is_some_and(|r| {
                r.holder.pod().is_some_and(|p| p.listed && p.name.as_deref() == Some("trainer"))
            })
        })
        .await;
        k.pods.lock().unwrap().clear();
        let t0 = Instant::now();
        wait_until(Duration::from_secs(10), || {
            alloc_of(&bed.state(), &alloc).is_none()
        })
        .await;
        assert!(t0.elapsed() < Duration::from_secs(10));
    });
}

async fn wait_until(within: Duration, ok: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < within, "not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// kubelet restarts (its sockets removed, `kubelet.sock` made anew): every resource registers
/// again within 5 s; the plugin restarts: nothing of the pool is lost; a corrupt state
/// advertises nothing healthy; an allocation kubelet never lists is freed after
/// `kubelet_claim_s`.
#[test]
fn survives_restarts_and_a_corrupt_state() {
    let mut bed = Bed::new(FakeHost::dgx8(), |c| {
        c["kubelet_claim_s"] = serde_json::json!(3)
    });
    rt().block_on(async {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let k = Kubelet {
            tx: Some(tx.clone()),
            ..Kubelet::default()
        };
        // No pod resources API: kubelet's checkpoint is its word.
        let srv = serve_kubelet(k.clone(), &bed.kubelet_sock(), None);
        bed.start_plugin();
        wait_registered(&mut rx, "gpuhook.io/gpu", Duration::from_secs(10)).await;
        let mut plugin = DevicePluginClient::new(unix_channel(&bed.plugins.join("gpuhook-gpu.sock")).unwrap());
        let a = plugin
            .allocate(api::AllocateRequest {
                container_requests: vec![
                    api::ContainerAllocateRequest { devices_ids: vec!["0000:18:00.0".into()] },
                    api::ContainerAllocateRequest { devices_ids: vec!["0000:1a:00.0".into()] },
                ],
            })
            .await
            .unwrap()
            .into_inner();
        let allocs: Vec<String> = a
            .container_responses
            .iter()
            .map(|c| c.annotations["gpuhook.io/allocation"].clone())
            .collect();
        assert_ne!(allocs[0], allocs[1]);
        // kubelet's checkpoint names the first container's allocation.
        let checkpoint = serde_json::json!({"Data": {"PodDeviceEntries": [
            {"PodUID": "6f1c2d3e-0000-4000-8000-000000000001", "ContainerName": "main",
             "ResourceName": "gpuhook.io/gpu", "DeviceIDs": {"0": ["0000:18:00.0"]}, "AllocResp": ""}
        ], "RegisteredDevices": {"gpuhook.io/gpu": []}}, "Checksum": 1});
        std::fs::write(bed.plugins.join("kubelet_internal_checkpoint"), checkpoint.to_string()).unwrap();

        // kubelet restarts: its sockets go, its own comes anew.
        srv.abort();
        for e in std::fs::read_dir(&bed.plugins).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "sock") {
                std::fs::remove_file(p).unwrap();
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let k2 = Kubelet { tx: Some(tx), ..Kubelet::default() };
        let t0 = Instant::now();
        let _srv2 = serve_kubelet(k2.clone(), &bed.kubelet_sock(), None);
        wait_registered(&mut rx, "gpuhook.io/gpu", Duration::from_secs(5)).await;
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(bed.plugins.join("gpuhook-gpu.sock").exists());

        // The allocation kubelet never named is freed after kubelet_claim_s (3 s); the one
        // its checkpoint names stays, named by its pod's UID.
        let (a0, a1) = (&allocs[0], &allocs[1]);
        wait_until(Duration::from_secs(12), || alloc_of(&bed.state(), a1).is_none()).await;
        let st = bed.state();
        let p = alloc_of(&st, a0).unwrap().holder.pod().unwrap().clone();
        assert_eq!(p.uid.as_deref(), Some("6f1c2d3e-0000-4000-8000-000000000001"));
        assert_eq!(p.container_name.as_deref(), Some("main"));

        // The plugin restarts: the pool is the state file, nothing lost.
        bed.stop_plugin();
        assert!(!bed.plugins.join("gpuhook-gpu.sock").exists());
        bed.start_plugin();
        wait_registered(&mut rx, "gpuhook.io/gpu", Duration::from_secs(10)).await;
        assert!(alloc_of(&bed.state(), a0).is_some());

        // A corrupt state: nothing healthy, one line said; read again: as before.
        let mut plugin = DevicePluginClient::new(unix_channel(&bed.plugins.join("gpuhook-gpu.sock")).unwrap());
        let mut s = plugin.list_and_watch(Empty {}).await.unwrap().into_inner();
        next_list(&mut s, Duration::from_secs(5), |l| l.len() == 8).await;
        let good = std::fs::read(&bed.state).unwrap();
        let tmp = bed.root.join("run/.garbage");
        std::fs::write(&tmp, b"{not json").unwrap();
        std::fs::rename(&tmp, &bed.state).unwrap();
        next_list(&mut s, Duration::from_secs(1), |l| l.iter().all(|d| d.health == "Unhealthy")).await;
        let refused = plugin
            .allocate(api::AllocateRequest {
                container_requests: vec![api::ContainerAllocateRequest { devices_ids: vec!["0000:40:00.0".into()] }],
            })
            .await
            .unwrap_err();
        assert!(refused.message().contains("is corrupt"), "{}", refused.message());
        std::fs::write(&tmp, &good).unwrap();
        std::fs::rename(&tmp, &bed.state).unwrap();
        let (l, _) = next_list(&mut s, Duration::from_secs(1), |l| l.iter().any(|d| d.health == "Healthy")).await;
        assert_eq!(l.iter().filter(|d| d.health == "Healthy").count(), 8);
    });
}

/// Every resource of a host with MIG GPUs (profiles as `nvidia-smi mig -lci` names them)
/// and a shared GPU: a socket and a registration each; MIG instances by `PCI:GI:CI`, slots
/// by `PCI/slot-N`; `Allocate` of an instance gives its GPU's node and its two capability
/// nodes.
#[test]
fn every_resource_mig_profiles_and_shared_slots() {
    let fake = FakeHost::dgx8_mig();
    let mut bed = Bed::new(fake, |c| {
        c["sharing"] = serde_json::json!({"0000:42:00.0": {"replicas": 2}});
    });
    let paths = testbed::HostPaths {
        root: bed.root.join("host"),
        sysfs: bed.root.join("host/sys"),
        proc: bed.root.join("host/proc"),
        dev: bed.root.join("host/dev"),
    };
    let smi = testbed::health::install_smi(&paths);
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&bed.config).unwrap()).unwrap();
    cfg["nvidia_smi"] = serde_json::json!(smi);
    std::fs::write(&bed.config, cfg.to_string()).unwrap();
    rt().block_on(async {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let k = Kubelet {
            tx: Some(tx),
            ..Kubelet::default()
        };
        let _srv = serve_kubelet(k.clone(), &bed.kubelet_sock(), None);
        bed.start_plugin();
        let want = [
            "gpuhook.io/gpu",
            "gpuhook.io/gpu-shared",
            "gpuhook.io/mig-1g.10gb",
            "gpuhook.io/mig-2c.4g.40gb",
            "gpuhook.io/mig-2g.20gb",
            "gpuhook.io/mig-3g.40gb",
        ];
        for _ in want {
            tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .unwrap();
        }
        let mut got: Vec<String> = k
            .registered
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.resource_name.clone())
            .collect();
        got.sort();
        assert_eq!(got, want);
        let list = |sock: &str| {
            let p = bed.plugins.join(sock);
            async move {
                let mut c = DevicePluginClient::new(unix_channel(&p).unwrap());
                let l = c
                    .list_and_watch(Empty {})
                    .await
                    .unwrap()
                    .into_inner()
                    .message()
                    .await;
                let mut ids: Vec<String> = l
                    .unwrap()
                    .unwrap()
                    .devices
                    .into_iter()
                    .map(|d| d.id)
                    .collect();
                ids.sort();
                ids
            }
        };
        assert_eq!(
            list("gpuhook-mig-1g.10gb.sock").await,
            [
                "0000:18:00.0:10:0",
                "0000:18:00.0:11:0",
                "0000:18:00.0:12:0",
                "0000:18:00.0:13:0",
                "0000:18:00.0:7:0",
                "0000:18:00.0:8:0",
                "0000:18:00.0:9:0",
                "0000:40:00.0:13:0",
            ]
        );
        assert_eq!(
            list("gpuhook-mig-2c.4g.40gb.sock").await,
            ["0000:40:00.0:1:0", "0000:40:00.0:1:1"]
        );
        assert_eq!(
            list("gpuhook-gpu-shared.sock").await,
            ["0000:42:00.0/slot-0", "0000:42:00.0/slot-1"]
        );
        let whole = list("gpuhook-gpu.sock").await;
        assert_eq!(whole.len(), 4, "{whole:?}");
        assert!(!whole
            .iter()
            .any(|i| i.starts_with("0000:18:00.0") || i.starts_with("0000:42:00.0")));
        // Allocate of a MIG instance: its GPU's node and its two capability nodes.
        let mut c = DevicePluginClient::new(
            unix_channel(&bed.plugins.join("gpuhook-mig-2g.20gb.sock")).unwrap(),
        );
        let a = c
            .allocate(api::AllocateRequest {
                container_requests: vec![api::ContainerAllocateRequest {
                    devices_ids: vec!["0000:40:00.0:5:0".into()],
                }],
            })
            .await
            .unwrap()
            .into_inner();
        let paths: Vec<String> = a.container_responses[0]
            .devices
            .iter()
            .map(|d| d.container_path.clone())
            .collect();
        let caps = |ci: Option<u32>| {
            format!(
                "/dev/nvidia-caps/nvidia-cap{}",
                testbed::fakehost::mig_minor(0, 5, ci)
            )
        };
        for want in ["/dev/nvidia0".to_string(), caps(None), caps(Some(0))] {
            assert!(paths.contains(&want), "{want} not in {paths:?}");
        }
        let st = bed.state();
        let r = st
            .reservations
            .values()
            .find(|r| r.kind() == HolderKind::Pod)
            .unwrap();
        assert_eq!(r.holder.pod().unwrap().resource, "gpuhook.io/mig-2g.20gb");
        assert_eq!(r.gpus[0].to_string(), "0000:40:00.0/gi5/ci0");
    });
}
