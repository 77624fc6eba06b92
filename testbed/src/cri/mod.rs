//! A CRI client: Kubernetes' `runtime.v1` spoken over a runtime's unix socket as kubelet
//! speaks it (gRPC over HTTP/2, one unary call at a time), and the private containerd it is
//! pointed at in the tests ([`containerd`]), the pods kubelet would ask for ([`pod`]), the
//! scenarios the tests and `gpuhook-testbed cri` run ([`scenarios`]).
//!
//! The messages are generated once from the vendored proto (`testbed/proto/runtime/v1/api.proto`,
//! `testbed/scripts/cri-generate.sh`) and built with `prost` alone; the transport is `h2` on a
//! current-thread tokio runtime. gRPC's framing is small enough to write here: a request is
//! `POST /runtime.v1.RuntimeService/METHOD` with `content-type: application/grpc` and `te:
//! trailers`, its body one message behind a 5-byte prefix (flag, big-endian length); the
//! answer is one such message and trailers with `grpc-status` and `grpc-message` (or a
//! trailers-only answer: the status in the headers).

#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod api;
pub mod bed;
pub mod cli;
pub mod containerd;
pub mod pod;
pub mod scenarios;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long one call may take unless said otherwise (kubelet's default runtime request
/// timeout is 2 minutes; a test wants to know sooner).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// gRPC's status codes, by number, for messages.
const CODES: [&str; 17] = [
    "OK",
    "Cancelled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

/// Why a call did not return its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CriError {
    /// The runtime answered with a gRPC status other than OK: what kubelet would log.
    Status {
        method: String,
        code: u32,
        message: String,
    },
    /// No answer: the socket, HTTP/2 or the framing failed, or the call timed out.
    Transport { method: String, what: String },
}

impl CriError {
    /// The runtime's `grpc-message` (empty for a transport failure).
    pub fn message(&self) -> &str {
        match self {
            CriError::Status { message, .. } => message,
            CriError::Transport { .. } => "",
        }
    }

    /// The gRPC status code (`None` for a transport failure).
    pub fn code(&self) -> Option<u32> {
        match self {
            CriError::Status { code, .. } => Some(*code),
            CriError::Transport { .. } => None,
        }
    }
}

impl std::fmt::Display for CriError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CriError::Status {
                method,
                code,
                message,
            } => write!(
                f,
                "{method}: rpc error: code = {} desc = {message}",
                CODES.get(*code as usize).copied().unwrap_or("?")
            ),
            CriError::Transport { method, what } => write!(f, "{method}: {what}"),
        }
    }
}

impl std::error::Error for CriError {}

/// A connection to a CRI runtime's socket.
pub struct Cri {
    rt: tokio::runtime::Runtime,
    send: h2::client::SendRequest<Bytes>,
    socket: PathBuf,
}

/// `%XX` escapes of a `grpc-message` decoded (gRPC percent-encodes it).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One message in gRPC's length-prefixed framing (not compressed).
fn frame(m: &impl Message) -> Bytes {
    let len = m.encoded_len();
    let mut b = BytesMut::with_capacity(5 + len);
    b.put_u8(0);
    b.put_u32(len as u32);
    m.encode(&mut b).expect("a BytesMut grows");
    b.freeze()
}

/// The one message of an answer's body.
fn unframe<R: Message + Default>(mut body: Bytes) -> Result<R, String> {
    if body.len() < 5 {
        return Err(format!(
            "an answer of {} bytes is no gRPC message",
            body.len()
        ));
    }
    let compressed = body.get_u8();
    let len = body.get_u32() as usize;
    if compressed != 0 {
        return Err("a compressed answer (none was offered)".into());
    }
    if body.len() != len {
        return Err(format!(
            "the answer's frame says {len} bytes, the body has {}",
            body.len()
        ));
    }
    R::decode(body).map_err(|e| format!("the answer does not decode: {e}"))
}

/// A `grpc-status` (and `grpc-message`) from headers or trailers: `None` when absent.
fn status_of(h: &http::HeaderMap) -> Option<(u32, String)> {
    let code = h.get("grpc-status")?.to_str().ok()?.trim().parse().ok()?;
    let msg = h
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .map(percent_decode)
        .unwrap_or_default();
    Some((code, msg))
}

impl Cri {
    /// Connects to the runtime's unix socket (HTTP/2 with prior knowledge, as gRPC's
    /// `unix://` target does).
    pub fn connect(socket: &Path) -> Result<Cri, CriError> {
        let fail = |what: String| CriError::Transport {
            method: "connect".into(),
            what: format!("{}: {what}", socket.display()),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| fail(e.to_string()))?;
        let send = rt.block_on(async {
            let io = tokio::net::UnixStream::connect(socket)
                .await
                .map_err(|e| fail(e.to_string()))?;
            let (send, conn) = h2::client::Builder::new()
                .initial_window_size(4 << 20)
                .max_frame_size(1 << 20)
                .handshake::<_, Bytes>(io)
                .await
                .map_err(|e| fail(e.to_string()))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok::<_, CriError>(send)
        })?;
        Ok(Cri {
            rt,
            send,
            socket: socket.to_path_buf(),
        })
    }

    /// The socket this client speaks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// One unary call `/runtime.v1.SERVICE/METHOD`, bounded by `timeout`.
    pub fn call<Q: Message, R: Message + Default>(
        &mut self,
        service: &str,
        method: &str,
        req: &Q,
        timeout: Duration,
    ) -> Result<R, CriError> {
        let transport = |what: String| CriError::Transport {
            method: method.to_string(),
            what,
        };
        let send = self.send.clone();
        let body = frame(req);
        let path = format!("/runtime.v1.{service}/{method}");
        let fut = async move {
            let mut send = send.ready().await.map_err(|e| e.to_string())?;
            let request = http::Request::builder()
                .method("POST")
                .uri(format!("http://localhost{path}"))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .header("grpc-timeout", format!("{}m", timeout.as_millis()))
                .header("user-agent", "gpuhook-testbed-cri/1")
                .body(())
                .map_err(|e| e.to_string())?;
            let (answer, mut stream) = send
                .send_request(request, false)
                .map_err(|e| e.to_string())?;
            stream.send_data(body, true).map_err(|e| e.to_string())?;
            let answer = answer.await.map_err(|e| e.to_string())?;
            let (head, mut recv) = answer.into_parts();
            if head.status != http::StatusCode::OK {
                return Err(format!("HTTP status {}", head.status));
            }
            // Trailers-only: the status comes with the headers, and there is no body.
            if let Some(s) = status_of(&head.headers) {
                return Ok((Bytes::new(), Some(s)));
            }
            let mut buf = BytesMut::new();
            while let Some(chunk) = recv.data().await {
                let chunk = chunk.map_err(|e| e.to_string())?;
                let _ = recv.flow_control().release_capacity(chunk.len());
                buf.extend_from_slice(&chunk);
            }
            let trailers = recv.trailers().await.map_err(|e| e.to_string())?;
            Ok((buf.freeze(), trailers.as_ref().and_then(status_of)))
        };
        let (body, status) = self
            .rt
            .block_on(async { tokio::time::timeout(timeout, fut).await })
            .map_err(|_| transport(format!("no answer in {timeout:?}")))?
            .map_err(transport)?;
        match status {
            Some((0, _)) => unframe(body).map_err(transport),
            Some((code, message)) => Err(CriError::Status {
                method: method.to_string(),
                code,
                message,
            }),
            None => Err(transport("an answer without grpc-status".into())),
        }
    }

    fn rt<Q: Message, R: Message + Default>(
        &mut self,
        method: &str,
        req: Q,
    ) -> Result<R, CriError> {
        self.call("RuntimeService", method, &req, CALL_TIMEOUT)
    }

    pub fn version(&mut self) -> Result<api::VersionResponse, CriError> {
        self.rt(
            "Version",
            api::VersionRequest {
                version: "v1".into(),
            },
        )
    }

    /// `Status` (verbose: the runtime's config and handlers in `info`).
    pub fn status(&mut self) -> Result<api::StatusResponse, CriError> {
        self.rt("Status", api::StatusRequest { verbose: true })
    }

    /// `RunPodSandbox` on `handler` (`""`: the runtime's default); the sandbox ID.
    pub fn run_pod_sandbox(
        &mut self,
        config: &api::PodSandboxConfig,
        handler: &str,
    ) -> Result<String, CriError> {
        let r: api::RunPodSandboxResponse = self.rt(
            "RunPodSandbox",
            api::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: handler.into(),
            },
        )?;
        Ok(r.pod_sandbox_id)
    }

    pub fn stop_pod_sandbox(&mut self, id: &str) -> Result<(), CriError> {
        let _: api::StopPodSandboxResponse = self.rt(
            "StopPodSandbox",
            api::StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            },
        )?;
        Ok(())
    }

    pub fn remove_pod_sandbox(&mut self, id: &str) -> Result<(), CriError> {
        let _: api::RemovePodSandboxResponse = self.rt(
            "RemovePodSandbox",
            api::RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            },
        )?;
        Ok(())
    }

    pub fn pod_sandbox_status(
        &mut self,
        id: &str,
    ) -> Result<api::PodSandboxStatusResponse, CriError> {
        self.rt(
            "PodSandboxStatus",
            api::PodSandboxStatusRequest {
                pod_sandbox_id: id.into(),
                verbose: true,
            },
        )
    }

    pub fn list_pod_sandbox(&mut self) -> Result<Vec<api::PodSandbox>, CriError> {
        let r: api::ListPodSandboxResponse = self.rt(
            "ListPodSandbox",
            api::ListPodSandboxRequest { filter: None },
        )?;
        Ok(r.items)
    }

    /// `CreateContainer` in a pod, with the pod's config as kubelet sends it; the container ID.
    pub fn create_container(
        &mut self,
        pod: &str,
        config: &api::ContainerConfig,
        sandbox: &api::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let r: api::CreateContainerResponse = self.rt(
            "CreateContainer",
            api::CreateContainerRequest {
                pod_sandbox_id: pod.into(),
                config: Some(config.clone()),
                sandbox_config: Some(sandbox.clone()),
            },
        )?;
        Ok(r.container_id)
    }

    pub fn start_container(&mut self, id: &str) -> Result<(), CriError> {
        let _: api::StartContainerResponse = self.rt(
            "StartContainer",
            api::StartContainerRequest {
                container_id: id.into(),
            },
        )?;
        Ok(())
    }

    /// `StopContainer` with a grace period of `timeout` seconds (then SIGKILL).
    pub fn stop_container(&mut self, id: &str, timeout: i64) -> Result<(), CriError> {
        let _: api::StopContainerResponse = self.rt(
            "StopContainer",
            api::StopContainerRequest {
                container_id: id.into(),
                timeout,
            },
        )?;
        Ok(())
    }

    pub fn remove_container(&mut self, id: &str) -> Result<(), CriError> {
        let _: api::RemoveContainerResponse = self.rt(
            "RemoveContainer",
            api::RemoveContainerRequest {
                container_id: id.into(),
            },
        )?;
        Ok(())
    }

    /// `ListContainers`, all of them or a pod's.
    pub fn list_containers(&mut self, pod: Option<&str>) -> Result<Vec<api::Container>, CriError> {
        let filter = pod.map(|p| api::ContainerFilter {
            pod_sandbox_id: p.into(),
            ..Default::default()
        });
        let r: api::ListContainersResponse =
            self.rt("ListContainers", api::ListContainersRequest { filter })?;
        Ok(r.containers)
    }

    pub fn container_status(&mut self, id: &str) -> Result<api::ContainerStatusResponse, CriError> {
        self.rt(
            "ContainerStatus",
            api::ContainerStatusRequest {
                container_id: id.into(),
                verbose: true,
            },
        )
    }

    /// `ExecSync`: runs `cmd` in the container, waits `timeout` seconds at most.
    pub fn exec_sync(
        &mut self,
        id: &str,
        cmd: &[&str],
        timeout: i64,
    ) -> Result<api::ExecSyncResponse, CriError> {
        let req = api::ExecSyncRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout,
        };
        let limit = CALL_TIMEOUT + Duration::from_secs(timeout.max(0) as u64);
        self.call("RuntimeService", "ExecSync", &req, limit)
    }

    /// `ImageStatus` of an image reference: whether the runtime has it.
    pub fn image_present(&mut self, image: &str) -> Result<bool, CriError> {
        let r: api::ImageStatusResponse = self.call(
            "ImageService",
            "ImageStatus",
            &api::ImageStatusRequest {
                image: Some(api::ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
                verbose: false,
            },
            CALL_TIMEOUT,
        )?;
        Ok(r.image.is_some())
    }
}

/// A container state's name as crictl prints it (`Running`, `Exited`, …).
pub fn state_name(state: i32) -> &'static str {
    match api::ContainerState::try_from(state) {
        Ok(api::ContainerState::ContainerCreated) => "Created",
        Ok(api::ContainerState::ContainerRunning) => "Running",
        Ok(api::ContainerState::ContainerExited) => "Exited",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_messages() {
        let req = api::RemoveContainerRequest {
            container_id: "abc".into(),
        };
        let f = frame(&req);
        assert_eq!(&f[..5], &[0, 0, 0, 0, 5]);
        // Field 1, wire type 2 (length-delimited), 3 bytes.
        assert_eq!(&f[5..], b"\x0a\x03abc");
        let back: api::RemoveContainerRequest = unframe(f).unwrap();
        assert_eq!(back, req);
        assert!(
            unframe::<api::RemoveContainerRequest>(Bytes::from_static(b"\0\0\0\0\x09\x0a"))
                .unwrap_err()
                .contains("says 9 bytes")
        );
        assert_eq!(
            percent_decode("failed: gpuhook%3A container %27x%27%0A"),
            "failed: gpuhook: container 'x'\n"
        );
        assert_eq!(percent_decode("100%"), "100%");
        let e = CriError::Status {
            method: "StartContainer".into(),
            code: 2,
            message: "boom".into(),
        };
        assert_eq!(
            e.to_string(),
            "StartContainer: rpc error: code = Unknown desc = boom"
        );
    }
}
