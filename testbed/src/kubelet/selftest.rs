//! The stand-in against a small device plugin made here (no root, no gpuhook): the
//! protocol as kubelet runs it, end to end over real unix sockets.

use super::checkpoint::Checkpoint;
use super::pods::{Container, Pod};
use super::{EventKind, Kubelet};
use kubelet_api::v1 as pr;
use kubelet_api::v1beta1 as api;
use kubelet_api::v1beta1::device_plugin_server::{DevicePlugin, DevicePluginServer};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;

type ListSender = tokio::sync::mpsc::Sender<Result<api::ListAndWatchResponse, tonic::Status>>;

const RES: &str = "example.com/gpu";

#[derive(Default)]
struct Calls {
    allocate: Vec<Vec<String>>,
    preferred: Vec<(Vec<String>, Vec<String>, i32)>,
    prestart: Vec<Vec<String>>,
    refuse: Option<String>,
}

#[derive(Clone)]
struct Fake {
    calls: Arc<Mutex<Calls>>,
    lists: Arc<Mutex<Vec<ListSender>>>,
}

fn devices(healthy: &[bool]) -> api::ListAndWatchResponse {
    api::ListAndWatchResponse {
        devices: healthy
            .iter()
            .enumerate()
            .map(|(i, h)| api::Device {
                id: format!("dev{i}"),
                health: if *h { "Healthy" } else { "Unhealthy" }.into(),
                topology: Some(api::TopologyInfo {
                    nodes: vec![api::NumaNode { id: i as i64 % 2 }],
                }),
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl DevicePlugin for Fake {
    async fn get_device_plugin_options(
        &self,
        _r: tonic::Request<api::Empty>,
    ) -> Result<tonic::Response<api::DevicePluginOptions>, tonic::Status> {
        Ok(tonic::Response::new(api::DevicePluginOptions {
            pre_start_required: true,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = ReceiverStream<Result<api::ListAndWatchResponse, tonic::Status>>;

    async fn list_and_watch(
        &self,
        _r: tonic::Request<api::Empty>,
    ) -> Result<tonic::Response<Self::ListAndWatchStream>, tonic::Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tx.send(Ok(devices(&[true, true, false]))).await.ok();
        self.lists.lock().unwrap().push(tx);
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        r: tonic::Request<api::PreferredAllocationRequest>,
    ) -> Result<tonic::Response<api::PreferredAllocationResponse>, tonic::Status> {
        let c = &r.get_ref().container_requests[0];
        let mut avail = c.available_device_i_ds.clone();
        avail.sort();
        self.calls.lock().unwrap().preferred.push((
            avail.clone(),
            c.must_include_device_i_ds.clone(),
            c.allocation_size,
        ));
        // Prefers the last one.
        Ok(tonic::Response::new(api::PreferredAllocationResponse {
            container_responses: vec![api::ContainerPreferredAllocationResponse {
                device_i_ds: avail
                    .into_iter()
                    .rev()
                    .take(c.allocation_size as usize)
                    .collect(),
            }],
        }))
    }

    async fn allocate(
        &self,
        r: tonic::Request<api::AllocateRequest>,
    ) -> Result<tonic::Response<api::AllocateResponse>, tonic::Status> {
        let ids = r.get_ref().container_requests[0].devices_ids.clone();
        let mut c = self.calls.lock().unwrap();
        if let Some(why) = &c.refuse {
            return Err(tonic::Status::unknown(why.clone()));
        }
        c.allocate.push(ids.clone());
        let mut resp = api::ContainerAllocateResponse::default();
        resp.annotations
            .insert("example.com/ids".into(), ids.join(","));
        Ok(tonic::Response::new(api::AllocateResponse {
            container_responses: vec![resp],
        }))
    }

    async fn pre_start_container(
        &self,
        r: tonic::Request<api::PreStartContainerRequest>,
    ) -> Result<tonic::Response<api::PreStartContainerResponse>, tonic::Status> {
        self.calls
            .lock()
            .unwrap()
            .prestart
            .push(r.into_inner().devices_ids);
        Ok(tonic::Response::new(api::PreStartContainerResponse {}))
    }
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuhook-kubelet-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("device-plugins")).unwrap();
    d
}

/// Serves the fake plugin on `dir/fake.sock` and registers it with kubelet.
fn register(k: &Kubelet, fake: &Fake, dir: &Path, version: &str) -> Result<(), tonic::Status> {
    let sock = dir.join("fake.sock");
    let _ = std::fs::remove_file(&sock);
    let listener = {
        let _g = k.rt.enter();
        tokio::net::UnixListener::bind(&sock).unwrap()
    };
    let svc = DevicePluginServer::new(fake.clone());
    k.rt.spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(kubelet_api::unix_incoming(listener))
            .await;
    });
    let kubelet_sock = dir.join("kubelet.sock");
    k.rt.block_on(async {
        let ch = kubelet_api::unix_channel(&kubelet_sock).unwrap();
        let mut c = kubelet_api::v1beta1::registration_client::RegistrationClient::new(ch);
        c.register(api::RegisterRequest {
            version: version.into(),
            endpoint: "fake.sock".into(),
            resource_name: RES.into(),
            options: None,
        })
        .await
        .map(|_| ())
    })
}

fn list(k: &Kubelet) -> pr::ListPodResourcesResponse {
    let sock = super::pod_resources_socket(&k.shared.dir);
    k.rt.block_on(async {
        let ch = kubelet_api::unix_channel(&sock).unwrap();
        let mut c = pr::pod_resources_lister_client::PodResourcesListerClient::new(ch);
        c.list(pr::ListPodResourcesRequest {})
            .await
            .unwrap()
            .into_inner()
    })
}

#[test]
fn registration_allocation_checkpoint_pod_resources_and_restart() {
    let root = tmp("selftest");
    let dir = root.join("device-plugins");
    let mut k = Kubelet::start(&dir, true).unwrap();
    let fake = Fake {
        calls: Default::default(),
        lists: Default::default(),
    };
    // A wrong version: kubelet's words, nothing registered.
    let e = register(&k, &fake, &dir, "v1alpha").unwrap_err();
    assert_eq!(
        e.message(),
        "requested API version \"v1alpha\" is not supported by kubelet. Supported versions are [\"v1beta1\"]"
    );
    register(&k, &fake, &dir, "v1beta1").unwrap();
    assert!(k.shared.wait(Duration::from_secs(5), |st| st
        .devices
        .all
        .contains_key(RES)));
    {
        let st = k.shared.lock();
        assert!(matches!(&st.events[0].what, EventKind::Refused { .. }));
        assert!(
            matches!(&st.events[1].what, EventKind::Registered { options, .. } if options.pre_start_required)
        );
        assert_eq!(st.devices.healthy[RES].len(), 2);
    }
    // The first write of the checkpoint: the healthy devices, no pod.
    let cp = Checkpoint::read(&dir).unwrap().unwrap();
    assert_eq!(cp.registered[RES], ["dev0", "dev1"]);
    assert!(cp.entries.is_empty());

    let a = Pod::new("a").container(Container::new("c", "true").limit(RES, 1));
    k.admit(&a).unwrap();
    {
        let c = fake.calls.lock().unwrap();
        assert_eq!(
            c.preferred,
            [(vec!["dev0".into(), "dev1".into()], vec![], 1)]
        );
        // The plugin's preferred device was taken.
        assert_eq!(c.allocate, [vec!["dev1".to_string()]]);
    }
    let opts = k.run_options(&a, &a.containers[0]).unwrap();
    assert_eq!(opts[0].annotations["example.com/ids"], "dev1");
    assert_eq!(
        fake.calls.lock().unwrap().prestart,
        [vec!["dev1".to_string()]]
    );
    let cp = Checkpoint::read(&dir).unwrap().unwrap();
    assert_eq!(cp.entries.len(), 1);
    assert_eq!(cp.entries[0].device_ids[&1], ["dev1"]);
    let l = list(&k);
    assert_eq!(l.pod_resources[0].name, "a");
    let d = &l.pod_resources[0].containers[0].devices[0];
    assert_eq!(
        (d.resource_name.as_str(), d.device_ids[0].as_str()),
        (RES, "dev1")
    );
    assert_eq!(d.topology.as_ref().unwrap().nodes[0].id, 1);

    // Only dev0 is left; two are refused in kubelet's words, nothing asked of the plugin.
    let b = Pod::new("b").container(Container::new("c", "true").limit(RES, 2));
    let e = k.admit(&b).unwrap_err();
    assert_eq!(
        e.0,
        "requested number of devices unavailable for example.com/gpu. Requested: 2, Available: 1"
    );
    // The plugin refuses: kubelet rejects the pod with the plugin's error.
    fake.calls.lock().unwrap().refuse = Some("dev0 is taken".into());
    let c = Pod::new("c").container(Container::new("c", "true").limit(RES, 1));
    let e = k.admit(&c).unwrap_err();
    assert_eq!(e.0, "rpc error: code = Unknown desc = dev0 is taken");
    fake.calls.lock().unwrap().refuse = None;

    // a deleted: still in the checkpoint (kubelet writes none then), gone from List, and
    // from the checkpoint at the next write.
    k.delete(&a);
    assert_eq!(Checkpoint::read(&dir).unwrap().unwrap().entries.len(), 1);
    assert!(list(&k).pod_resources.is_empty());
    assert_eq!(Checkpoint::read(&dir).unwrap().unwrap().entries.len(), 1);
    let tx = fake.lists.lock().unwrap()[0].clone();
    k.rt.block_on(tx.send(Ok(devices(&[true, true, true]))))
        .unwrap();
    assert!(k.shared.wait(Duration::from_secs(5), |st| st
        .devices
        .healthy
        .get(RES)
        .is_some_and(|h| h.len() == 3)));
    assert!(Checkpoint::read(&dir).unwrap().unwrap().entries.is_empty());

    // b's allocation, then kubelet restarts: the plugin's socket goes, kubelet.sock is new,
    // the allocation comes back from the checkpoint, the resource has no device until the
    // plugin registers again.
    let b = Pod::new("b").container(Container::new("c", "true").limit(RES, 2));
    k.admit(&b).unwrap();
    // A second name keeps the old socket's inode in use: the new one must have another.
    std::fs::hard_link(dir.join("kubelet.sock"), root.join("old.sock")).unwrap();
    let before = std::fs::metadata(root.join("old.sock")).unwrap();
    k.restart().unwrap();
    assert!(!dir.join("fake.sock").exists());
    let after = std::fs::metadata(dir.join("kubelet.sock")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_ne!(before.ino(), after.ino());
    {
        let st = k.shared.lock();
        assert!(st.devices.healthy[RES].is_empty());
        assert_eq!(st.devices.pods[b.uid()]["c"][RES].ids().len(), 2);
        assert!(st.endpoints.is_empty());
    }
    register(&k, &fake, &dir, "v1beta1").unwrap();
    assert!(k.shared.wait(Duration::from_secs(5), |st| st
        .devices
        .healthy
        .get(RES)
        .is_some_and(|h| h.len() == 2)));
    // b holds dev2 and dev1 (the plugin's preferred); dev2 is unhealthy now: dev0 is left.
    let d = Pod::new("d").container(Container::new("c", "true").limit(RES, 2));
    assert!(k
        .admit(&d)
        .unwrap_err()
        .0
        .ends_with("Requested: 2, Available: 1"));
    drop(k);
    let _ = std::fs::remove_dir_all(&root);
}
