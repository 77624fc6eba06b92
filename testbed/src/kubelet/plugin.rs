//! kubelet's registration server and its client of each plugin (`plugin/v1beta1/`):
//! `Register` dials the plugin's socket and asks its options before it answers; then a task
//! reads the plugin's `ListAndWatch` stream into the device manager's state.

use super::{EventKind, Shared, State};
use kubelet_api::v1beta1 as api;
use kubelet_api::v1beta1::device_plugin_client::DevicePluginClient;
use kubelet_api::v1beta1::registration_server::{Registration, RegistrationServer};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// kubelet's dial timeout (`client.go` `dial`).
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// A plugin kubelet talks to, for one resource.
#[derive(Debug)]
pub struct Endpoint {
    pub endpoint: String,
    pub options: api::DevicePluginOptions,
    pub client: DevicePluginClient<Channel>,
    /// The `ListAndWatch` reader.
    task: Option<tokio::task::JoinHandle<()>>,
    /// Which registration this is (a newer one of the same resource replaces it).
    pub serial: u64,
}

impl Endpoint {
    /// Stops reading its stream (kubelet's `Disconnect`).
    pub fn abort(&self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// gRPC's words for a status, as grpc-go prints an error (what kubelet logs and puts in a
/// pod's rejection).
pub fn grpc_error(s: &tonic::Status) -> String {
    let code = format!("{:?}", s.code());
    format!("rpc error: code = {code} desc = {}", s.message())
}

/// Dials a plugin's socket as kubelet does: retried until it answers, 10 s at most.
pub async fn dial(socket: &Path) -> Result<DevicePluginClient<Channel>, String> {
    let uri = format!("unix://{}", socket.display());
    let ep =
        tonic::transport::Endpoint::from_shared(uri.clone()).map_err(|e| format!("{uri}: {e}"))?;
    let deadline = Instant::now() + DIAL_TIMEOUT;
    loop {
        match ep.connect().await {
            Ok(ch) => return Ok(DevicePluginClient::new(ch)),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!(
                    "failed to dial device plugin: context deadline exceeded ({}: {e})",
                    socket.display()
                ))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

struct Registrar {
    shared: Arc<Shared>,
    generation: u64,
}

fn refuse(shared: &Shared, resource: &str, why: String) -> tonic::Status {
    shared.with(|st| {
        st.event(EventKind::Refused {
            resource: resource.to_string(),
            why: why.clone(),
        })
    });
    // grpc-go turns a handler's plain error into code Unknown.
    tonic::Status::unknown(why)
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn register(
        &self,
        req: tonic::Request<api::RegisterRequest>,
    ) -> Result<tonic::Response<api::Empty>, tonic::Status> {
        let r = req.into_inner();
        if r.version != kubelet_api::VERSION {
            let why = format!(
                "requested API version {:?} is not supported by kubelet. Supported versions are [\"v1beta1\"]",
                r.version
            );
            return Err(refuse(&self.shared, &r.resource_name, why));
        }
        if !super::is_extended_resource_name(&r.resource_name) {
            let why = format!("the ResourceName {:?} is invalid", r.resource_name);
            return Err(refuse(&self.shared, &r.resource_name, why));
        }
        let socket = self.shared.dir.join(&r.endpoint);
        let mut client = dial(&socket)
            .await
            .map_err(|e| refuse(&self.shared, &r.resource_name, e))?;
        let options = client
            .get_device_plugin_options(api::Empty {})
            .await
            .map_err(|s| {
                let why = format!("failed to get device plugin options: {}", grpc_error(&s));
                refuse(&self.shared, &r.resource_name, why)
            })?
            .into_inner();
        connected(&self.shared, self.generation, &r, client, options);
        Ok(tonic::Response::new(api::Empty {}))
    }
}

/// `PluginConnected`, then the `ListAndWatch` reader (`runClient`).
fn connected(
    shared: &Arc<Shared>,
    generation: u64,
    r: &api::RegisterRequest,
    client: DevicePluginClient<Channel>,
    options: api::DevicePluginOptions,
) {
    let resource = r.resource_name.clone();
    let serial = shared.with(|st| {
        let serial = st.events.len() as u64;
        if let Some(old) = st.endpoints.remove(&resource) {
            old.abort();
        }
        st.endpoints.insert(
            resource.clone(),
            Endpoint {
                endpoint: r.endpoint.clone(),
                options,
                client: client.clone(),
                task: None,
                serial,
            },
        );
        st.event(EventKind::Registered {
            resource: resource.clone(),
            endpoint: r.endpoint.clone(),
            options,
        });
        serial
    });
    let sh = Arc::clone(shared);
    let task = tokio::spawn(async move {
        let why = watch(&sh, generation, &resource, serial, client).await;
        sh.with(|st| {
            let ours = st
                .endpoints
                .get(&resource)
                .is_some_and(|e| e.serial == serial);
            if ours && st.generation == generation {
                st.endpoints.remove(&resource);
                st.devices.mark_unhealthy(&resource);
                st.event(EventKind::Ended {
                    resource: resource.clone(),
                    why,
                });
            }
        });
    });
    shared.with(|st| {
        if let Some(e) = st.endpoints.get_mut(&r.resource_name) {
            if e.serial == serial {
                e.task = Some(task);
            }
        }
    });
}

/// Reads the stream until it ends: why it ended.
async fn watch(
    shared: &Arc<Shared>,
    generation: u64,
    resource: &str,
    serial: u64,
    mut client: DevicePluginClient<Channel>,
) -> String {
    let mut stream = match client.list_and_watch(api::Empty {}).await {
        Ok(s) => s.into_inner(),
        Err(s) => return format!("ListAndWatch ended unexpectedly: {}", grpc_error(&s)),
    };
    loop {
        match stream.message().await {
            Ok(Some(m)) => shared.with(|st| received(shared, st, generation, resource, serial, &m)),
            Ok(None) => return "ListAndWatch ended unexpectedly: EOF".into(),
            Err(s) => return format!("ListAndWatch ended unexpectedly: {}", grpc_error(&s)),
        }
    }
}

/// `PluginListAndWatchReceiver`: the list replaces the resource's devices, and the
/// checkpoint is written.
fn received(
    shared: &Shared,
    st: &mut State,
    generation: u64,
    resource: &str,
    serial: u64,
    m: &api::ListAndWatchResponse,
) {
    let current = st
        .endpoints
        .get(resource)
        .is_some_and(|e| e.serial == serial);
    if st.generation != generation || !current {
        return;
    }
    st.devices.update(resource, &m.devices);
    st.event(EventKind::Listed {
        resource: resource.to_string(),
        devices: m
            .devices
            .iter()
            .map(|d| super::Listed {
                id: d.id.clone(),
                health: d.health.clone(),
                numa: d
                    .topology
                    .iter()
                    .flat_map(|t| t.nodes.iter().map(|n| n.id))
                    .collect(),
            })
            .collect(),
    });
    shared.write_checkpoint(st);
}

/// Listens on `<dir>/kubelet.sock` and serves `Registration` until told to stop.
pub fn serve_registration(
    rt: &tokio::runtime::Runtime,
    shared: &Arc<Shared>,
) -> Result<
    (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ),
    String,
> {
    let path = shared.dir.join(kubelet_api::KUBELET_SOCKET);
    let _ = std::fs::remove_file(&path);
    let listener = {
        let _g = rt.enter();
        tokio::net::UnixListener::bind(&path).map_err(|e| format!("{}: {e}", path.display()))?
    };
    let generation = shared.lock().generation;
    let svc = RegistrationServer::new(Registrar {
        shared: Arc::clone(shared),
        generation,
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
            eprintln!("kubelet stand-in: the registration server: {e}");
        }
    });
    Ok((tx, task))
}
