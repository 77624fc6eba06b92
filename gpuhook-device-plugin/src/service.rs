//! The `DevicePlugin` service of one resource, as kubelet calls it on the plugin's socket:
//! options, the device list and its changes, gpuhook's preferred choice, and `Allocate`,
//! which reserves in the pool.

use crate::pool::Pool;
use gpuhook::host::inventory::{self, Scan};
use gpuhook::log;
use gpuhook::reserve::pods::{self, Advertised, Resource};
use gpuhook::reserve::state::Store;
use gpuhook::reserve::world::World;
use kubelet_api::v1beta1::device_plugin_server::DevicePlugin;
use kubelet_api::v1beta1::{
    AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, DevicePluginOptions, DeviceSpec, Empty,
    ListAndWatchResponse, NumaNode, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, TopologyInfo,
};
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

/// One resource's service.
pub struct Service {
    pub resource: Resource,
    pub pool: Arc<Pool>,
}

/// What the plugin tells kubelet of its options: no `PreStartContainer`, a preferred choice.
pub fn options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// A device as `ListAndWatch` carries it.
fn device(d: &Advertised) -> kubelet_api::v1beta1::Device {
    kubelet_api::v1beta1::Device {
        id: d.id.clone(),
        health: d.health.word().into(),
        topology: d.numa.map(|n| TopologyInfo {
            nodes: vec![NumaNode { id: i64::from(n) }],
        }),
    }
}

type Devices = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Service {
    type ListAndWatchStream = Devices;

    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<Devices>, Status> {
        let mut rx = self.pool.subscribe();
        let resource = self.resource.clone();
        let (tx, out) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut last: Option<Vec<kubelet_api::v1beta1::Device>> = None;
            loop {
                let list: Vec<kubelet_api::v1beta1::Device> = rx
                    .borrow_and_update()
                    .devices
                    .get(&resource)
                    .map(|l| l.iter().map(device).collect())
                    .unwrap_or_default();
                if last.as_ref() != Some(&list) {
                    let msg = ListAndWatchResponse {
                        devices: list.clone(),
                    };
                    if tx.send(Ok(msg)).await.is_err() {
                        return;
                    }
                    last = Some(list);
                }
                tokio::select! {
                    changed = rx.changed() => if changed.is_err() { return },
                    () = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out),
        )))
    }

    async fn get_preferred_allocation(
        &self,
        r: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let cfg = &self.pool.cfg;
        let st = Store::new(&cfg.state_file)
            .read()
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        let mut inv = inventory::scan_with(cfg, Scan::FULL)
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        gpuhook::reserve::health::apply(&mut inv, &st);
        let container_responses = r
            .into_inner()
            .container_requests
            .iter()
            .map(|c| ContainerPreferredAllocationResponse {
                device_i_ds: pods::preferred(
                    &inv,
                    &st,
                    &self.resource,
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    usize::try_from(c.allocation_size).unwrap_or(0),
                ),
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        r: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let requests: Vec<Vec<String>> = r
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| c.devices_ids)
            .collect();
        let f = World::real(&self.pool.cfg);
        let made = pods::allocate(&f, &self.resource, &requests, &self.pool.profiles());
        // The state changed (or a refusal may have reclaimed): every stream hears it now.
        self.pool.refresh();
        let made = made.map_err(|e| {
            let line = format!("device-plugin: Allocate: {e}");
            log::error(&line);
            Status::failed_precondition(e.to_string())
        })?;
        let container_responses = made
            .into_iter()
            .map(|a| ContainerAllocateResponse {
                envs: Default::default(),
                mounts: Vec::new(),
                devices: a
                    .nodes
                    .into_iter()
                    .map(|(container_path, host_path)| DeviceSpec {
                        container_path,
                        host_path,
                        permissions: "rw".into(),
                    })
                    .collect(),
                annotations: [(pods::ANNOTATION.to_string(), a.alloc)].into(),
                cdi_devices: a.cdi.into_iter().map(|name| CdiDevice { name }).collect(),
            })
            .collect();
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}
