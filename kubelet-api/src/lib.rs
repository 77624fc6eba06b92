//! kubelet's gRPC protocols, as a device plugin and kubelet speak them over unix sockets:
//!
//! - [`v1beta1`]: the device plugin API (`package v1beta1`): kubelet's `Registration`
//!   service and the plugin's `DevicePlugin` service (`GetDevicePluginOptions`,
//!   `ListAndWatch`, `GetPreferredAllocation`, `Allocate`, `PreStartContainer`);
//! - [`v1`]: the pod resources API (`package v1`): kubelet's `PodResourcesLister` (`List`,
//!   `GetAllocatableResources`, `Get`).
//!
//! Both are generated once by `scripts/generate.sh` from the vendored `proto/` files (the
//! Kubernetes Authors', Apache-2.0; where each came from is in its header) and committed, so
//! the build needs no protoc. Each service has its client and its server: gpuhook's device
//! plugin serves `DevicePlugin` and calls `Registration` and `PodResourcesLister`; a
//! kubelet stand-in does the reverse.

#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod v1;
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod v1beta1;

use std::path::Path;
use tonic::transport::{Channel, Endpoint};

/// The API version a device plugin registers with (`RegisterRequest.version`).
pub const VERSION: &str = "v1beta1";
/// A device's health words in `ListAndWatchResponse` (kubelet's `constants.go`).
pub const HEALTHY: &str = "Healthy";
/// See [`HEALTHY`].
pub const UNHEALTHY: &str = "Unhealthy";
/// kubelet's registration socket, in its device plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// A channel to a gRPC server on the unix socket `path` (connected lazily: the first call
/// connects, and fails if nothing listens).
///
/// # Errors
/// A path that is not valid UTF-8 or makes no URI.
pub fn unix_channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let uri = format!("unix://{}", path.to_str().unwrap_or_default());
    Ok(Endpoint::from_shared(uri)?.connect_lazy())
}

/// The connections of a listening unix socket, as `Server::serve_with_incoming` takes them.
pub fn unix_incoming(
    listener: tokio::net::UnixListener,
) -> tokio_stream::wrappers::UnixListenerStream {
    tokio_stream::wrappers::UnixListenerStream::new(listener)
}
