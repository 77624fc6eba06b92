//! kubelet's pod resources API `v1` (`pkg/kubelet/apis/podresources/server_v1.go`) on
//! `<plugin dir>/../pod-resources/kubelet.sock`: which devices each active pod's app
//! containers hold.

use super::devices::{Devices, NO_TOPOLOGY};
use super::{ActivePod, Shared};
use kubelet_api::v1 as pr;
use kubelet_api::v1::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
use std::sync::Arc;

struct Lister {
    shared: Arc<Shared>,
}

/// `containerDevicesFromResourceDeviceInstances`: one entry per device and NUMA node (a
/// device without topology: one entry without it).
fn container_devices(d: &Devices, pod: &str, container: &str) -> Vec<pr::ContainerDevices> {
    let mut v = Vec::new();
    let Some(res) = d.pods.get(pod).and_then(|c| c.get(container)) else {
        return v;
    };
    for (resource, a) in res {
        let mut seen = std::collections::BTreeSet::new();
        for (numa, ids) in &a.device_ids {
            for id in ids {
                let topology = (*numa != NO_TOPOLOGY).then(|| pr::TopologyInfo {
                    nodes: vec![pr::NumaNode { id: *numa }],
                });
                if topology.is_none() && !seen.insert(id.clone()) {
                    continue;
                }
                v.push(pr::ContainerDevices {
                    resource_name: resource.clone(),
                    device_ids: vec![id.clone()],
                    topology,
                });
            }
        }
    }
    v
}

fn pod_resources(d: &Devices, p: &ActivePod) -> pr::PodResources {
    pr::PodResources {
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        containers: p
            .containers
            .iter()
            .map(|c| pr::ContainerResources {
                name: c.clone(),
                devices: container_devices(d, &p.uid, c),
                ..Default::default()
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _req: tonic::Request<pr::ListPodResourcesRequest>,
    ) -> Result<tonic::Response<pr::ListPodResourcesResponse>, tonic::Status> {
        let pods = self.shared.with(|st| {
            // kubelet's List runs UpdateAllocatedDevices first (no checkpoint write).
            let active = st.active_uids();
            st.devices.forget_inactive(&active);
            st.active
                .values()
                .map(|p| pod_resources(&st.devices, p))
                .collect()
        });
        Ok(tonic::Response::new(pr::ListPodResourcesResponse {
            pod_resources: pods,
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _req: tonic::Request<pr::AllocatableResourcesRequest>,
    ) -> Result<tonic::Response<pr::AllocatableResourcesResponse>, tonic::Status> {
        let st = self.shared.lock();
        let mut devices = Vec::new();
        for (resource, healthy) in &st.devices.healthy {
            for id in healthy {
                let nodes: Vec<i64> = st
                    .devices
                    .all
                    .get(resource)
                    .and_then(|r| r.get(id))
                    .and_then(|d| d.topology.as_ref())
                    .map(|t| t.nodes.iter().map(|n| n.id).collect())
                    .unwrap_or_default();
                let one = |topology| pr::ContainerDevices {
                    resource_name: resource.clone(),
                    device_ids: vec![id.clone()],
                    topology,
                };
                if nodes.is_empty() {
                    devices.push(one(None));
                }
                for n in nodes {
                    devices.push(one(Some(pr::TopologyInfo {
                        nodes: vec![pr::NumaNode { id: n }],
                    })));
                }
            }
        }
        Ok(tonic::Response::new(pr::AllocatableResourcesResponse {
            devices,
            ..Default::default()
        }))
    }

    async fn get(
        &self,
        req: tonic::Request<pr::GetPodResourcesRequest>,
    ) -> Result<tonic::Response<pr::GetPodResourcesResponse>, tonic::Status> {
        let q = req.into_inner();
        let st = self.shared.lock();
        let p = st
            .active
            .values()
            .find(|p| p.name == q.pod_name && p.namespace == q.pod_namespace)
            .ok_or_else(|| {
                tonic::Status::unknown(format!(
                    "pod {} in namespace {} not found",
                    q.pod_name, q.pod_namespace
                ))
            })?;
        Ok(tonic::Response::new(pr::GetPodResourcesResponse {
            pod_resources: Some(pod_resources(&st.devices, p)),
        }))
    }
}

/// Listens on the pod resources socket (made anew) and serves until told to stop.
pub fn serve(
    rt: &tokio::runtime::Runtime,
    shared: &Arc<Shared>,
) -> Result<
    (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ),
    String,
> {
    let path = super::pod_resources_socket(&shared.dir);
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let _ = std::fs::remove_file(&path);
    let listener = {
        let _g = rt.enter();
        tokio::net::UnixListener::bind(&path).map_err(|e| format!("{}: {e}", path.display()))?
    };
    let svc = PodResourcesListerServer::new(Lister {
        shared: Arc::clone(shared),
    });
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = rt.spawn(async move {
        let r = tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(kubelet_api::unix_incoming(listener), async {
                let _ = rx.await;
            })
            .await;
        if let Err(e) = r {
            eprintln!("kubelet stand-in: the pod resources server: {e}");
        }
    });
    Ok((tx, task))
}
