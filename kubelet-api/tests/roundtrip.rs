//! The generated code speaks to itself over a unix socket: kubelet's `Registration` and
//! `PodResourcesLister` served and called, the plugin's `ListAndWatch` streamed. Each
//! call goes through the wire (HTTP/2, gRPC framing, protobuf), so a wrong path, package or
//! field number on one side shows here.

use kubelet_api::v1::pod_resources_lister_client::PodResourcesListerClient;
use kubelet_api::v1::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
use kubelet_api::v1beta1::device_plugin_client::DevicePluginClient;
use kubelet_api::v1beta1::device_plugin_server::{DevicePlugin, DevicePluginServer};
use kubelet_api::v1beta1::registration_client::RegistrationClient;
use kubelet_api::v1beta1::registration_server::{Registration, RegistrationServer};
use kubelet_api::{unix_channel, unix_incoming, v1, v1beta1};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

#[derive(Default)]
struct Kubelet {
    registered: Arc<Mutex<Vec<v1beta1::RegisterRequest>>>,
}

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(
        &self,
        r: Request<v1beta1::RegisterRequest>,
    ) -> Result<Response<v1beta1::Empty>, Status> {
        self.registered.lock().unwrap().push(r.into_inner());
        Ok(Response::new(v1beta1::Empty {}))
    }
}

#[tonic::async_trait]
impl PodResourcesLister for Kubelet {
    async fn list(
        &self,
        _: Request<v1::ListPodResourcesRequest>,
    ) -> Result<Response<v1::ListPodResourcesResponse>, Status> {
        Ok(Response::new(v1::ListPodResourcesResponse {
            pod_resources: vec![v1::PodResources {
                name: "trainer".into(),
                namespace: "ml".into(),
                containers: vec![v1::ContainerResources {
                    name: "main".into(),
                    devices: vec![v1::ContainerDevices {
                        resource_name: "gpuhook.io/gpu".into(),
                        device_ids: vec!["0000:3b:00.0".into()],
                        topology: None,
                    }],
                    ..Default::default()
                }],
            }],
        }))
    }
    async fn get_allocatable_resources(
        &self,
        _: Request<v1::AllocatableResourcesRequest>,
    ) -> Result<Response<v1::AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not here"))
    }
    async fn get(
        &self,
        _: Request<v1::GetPodResourcesRequest>,
    ) -> Result<Response<v1::GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not here"))
    }
}

struct Plugin;

type Devices = Pin<Box<dyn Stream<Item = Result<v1beta1::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    type ListAndWatchStream = Devices;
    async fn get_device_plugin_options(
        &self,
        _: Request<v1beta1::Empty>,
    ) -> Result<Response<v1beta1::DevicePluginOptions>, Status> {
        Ok(Response::new(v1beta1::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }
    async fn list_and_watch(
        &self,
        _: Request<v1beta1::Empty>,
    ) -> Result<Response<Devices>, Status> {
        let (tx, rx) = mpsc::channel(4);
        for health in [kubelet_api::HEALTHY, kubelet_api::UNHEALTHY] {
            let d = v1beta1::Device {
                id: "0000:3b:00.0".into(),
                health: health.into(),
                topology: Some(v1beta1::TopologyInfo {
                    nodes: vec![v1beta1::NumaNode { id: 1 }],
                }),
            };
            tx.send(Ok(v1beta1::ListAndWatchResponse { devices: vec![d] }))
                .await
                .unwrap();
        }
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
    async fn get_preferred_allocation(
        &self,
        _: Request<v1beta1::PreferredAllocationRequest>,
    ) -> Result<Response<v1beta1::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("not here"))
    }
    async fn allocate(
        &self,
        r: Request<v1beta1::AllocateRequest>,
    ) -> Result<Response<v1beta1::AllocateResponse>, Status> {
        let ids = &r.get_ref().container_requests[0].devices_ids;
        Err(Status::resource_exhausted(format!("{ids:?} taken")))
    }
    async fn pre_start_container(
        &self,
        _: Request<v1beta1::PreStartContainerRequest>,
    ) -> Result<Response<v1beta1::PreStartContainerResponse>, Status> {
        Ok(Response::new(v1beta1::PreStartContainerResponse {}))
    }
}

#[tokio::test(flavor = "current_thread")]
async fn each_service_round_trips_over_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet_sock = dir.path().join(kubelet_api::KUBELET_SOCKET);
    let plugin_sock = dir.path().join("gpuhook-gpu.sock");
    let kubelet = Kubelet::default();
    let registered = Arc::clone(&kubelet.registered);
    let lister = Kubelet::default();
    let incoming = unix_incoming(tokio::net::UnixListener::bind(&kubelet_sock).unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(kubelet))
            .add_service(PodResourcesListerServer::new(lister))
            .serve_with_incoming(incoming),
    );
    let incoming = unix_incoming(tokio::net::UnixListener::bind(&plugin_sock).unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(Plugin))
            .serve_with_incoming(incoming),
    );

    let mut reg = RegistrationClient::new(unix_channel(&kubelet_sock).unwrap());
    reg.register(v1beta1::RegisterRequest {
        version: kubelet_api::VERSION.into(),
        endpoint: "gpuhook-gpu.sock".into(),
        resource_name: "gpuhook.io/gpu".into(),
        options: Some(v1beta1::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }),
    })
    .await
    .unwrap();
    let got = registered.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].resource_name, "gpuhook.io/gpu");
    assert_eq!(got[0].endpoint, "gpuhook-gpu.sock");
    assert!(got[0].options.unwrap().get_preferred_allocation_available);

    let mut pods = PodResourcesListerClient::new(unix_channel(&kubelet_sock).unwrap());
    let listed = pods
        .list(v1::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let c = &listed.pod_resources[0].containers[0];
    assert_eq!(listed.pod_resources[0].namespace, "ml");
    assert_eq!(c.devices[0].device_ids, ["0000:3b:00.0"]);

    let mut plugin = DevicePluginClient::new(unix_channel(&plugin_sock).unwrap());
    let opts = plugin
        .get_device_plugin_options(v1beta1::Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(!opts.pre_start_required && opts.get_preferred_allocation_available);
    let mut stream = plugin
        .list_and_watch(v1beta1::Empty {})
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    let second = stream.message().await.unwrap().unwrap();
    assert_eq!(first.devices[0].health, "Healthy");
    assert_eq!(first.devices[0].topology.as_ref().unwrap().nodes[0].id, 1);
    assert_eq!(second.devices[0].health, "Unhealthy");
    let refused = plugin
        .allocate(v1beta1::AllocateRequest {
            container_requests: vec![v1beta1::ContainerAllocateRequest {
                devices_ids: vec!["0000:3b:00.0".into()],
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert_eq!(refused.message(), "[\"0000:3b:00.0\"] taken");
}
