//! What kubelet says of its pods, read for the pool's pod allocations: its pod resources API
//! (`PodResourcesLister.List` on `pod-resources/kubelet.sock` beside the plugin directory),
//! else its checkpoint file (`kubelet_internal_checkpoint` in the plugin directory).

use crate::pool::Pool;
use gpuhook::log;
use gpuhook::reserve::pods::{self, KubeletSource, KubeletView, PodDevices};
use gpuhook::reserve::world::World;
use kubelet_api::v1::pod_resources_lister_client::PodResourcesListerClient;
use kubelet_api::v1::ListPodResourcesRequest;
use std::sync::Arc;
use std::time::Duration;

/// How long kubelet's `List` may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(3);

/// The checkpoint's file name in kubelet's plugin directory.
pub const CHECKPOINT: &str = "kubelet_internal_checkpoint";

/// The largest checkpoint read (kubelet's, for a node's pods, is a few KiB to a few MiB).
const MAX_CHECKPOINT: usize = 64 << 20;

/// kubelet's word now: the pod resources API if it answers, else the checkpoint if it can be
/// read, else nothing (the reason, said once per change by the caller).
pub async fn view(pool: &Pool) -> Result<KubeletView, String> {
    let sock = pool.cfg.pod_resources_socket();
    let api = if sock.exists() {
        match list(&sock).await {
            Ok(v) => return Ok(v),
            Err(e) => format!("{}: {e}", sock.display()),
        }
    } else {
        format!("{}: not there", sock.display())
    };
    let path = pool.cfg.kubelet_plugin_dir.join(CHECKPOINT);
    match read_checkpoint(&path) {
        Ok(bytes) => KubeletView::from_checkpoint(&bytes, &alloc_of)
            .map_err(|e| format!("{api}; {}: {e}", path.display())),
        Err(e) => Err(format!("{api}; {}: {e}", path.display())),
    }
}

/// Reads kubelet's checkpoint: opened once without following a link and without waiting
/// (a FIFO would stop the plugin's one thread), a regular file, at most [`MAX_CHECKPOINT`]
/// bytes. kubelet writes it so (a rename); anything else at its path is not read.
fn read_checkpoint(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind, Read};
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(nix::libc::ELOOP) => Error::other("a symbolic link, not kubelet's file"),
            _ => e,
        })?;
    let m = f.metadata()?;
    if !m.file_type().is_file() {
        return Err(Error::new(ErrorKind::InvalidData, "not a regular file"));
    }
    let mut buf = Vec::new();
    f.take(MAX_CHECKPOINT as u64 + 1).read_to_end(&mut buf)?;
    if buf.len() > MAX_CHECKPOINT {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("larger than {MAX_CHECKPOINT} bytes"),
        ));
    }
    Ok(buf)
}

/// The allocation an `AllocResp` of kubelet's checkpoint names: the `Allocate` answer kubelet
/// kept for the container (base64 of a `ContainerAllocateResponse`), its
/// `gpuhook.io/allocation` annotation.
pub fn alloc_of(resp: &str) -> Option<String> {
    use prost::Message;
    let bytes = base64_decode(resp)?;
    let r = kubelet_api::v1beta1::ContainerAllocateResponse::decode(bytes.as_slice()).ok()?;
    r.annotations.get(pods::ANNOTATION).cloned()
}

/// Standard base64 (with or without padding), as Go's JSON writes a `[]byte`.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.trim_end_matches('=').bytes() {
        acc = (acc << 6) | u32::from(val(c)?);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// `PodResourcesLister.List`: each container of each pod with its devices of each resource.
async fn list(sock: &std::path::Path) -> Result<KubeletView, String> {
    let channel = kubelet_api::unix_channel(sock).map_err(|e| e.to_string())?;
    let mut client = PodResourcesListerClient::new(channel);
    let resp =
        match tokio::time::timeout(LIST_TIMEOUT, client.list(ListPodResourcesRequest {})).await {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(s)) => return Err(format!("{}: {}", s.code(), s.message())),
            Err(_) => return Err(format!("no answer in {} s", LIST_TIMEOUT.as_secs())),
        };
    let mut pods = Vec::new();
    for p in resp.pod_resources {
        for c in p.containers {
            for d in c.devices {
                pods.push(PodDevices {
                    namespace: Some(p.namespace.clone()),
                    name: Some(p.name.clone()),
                    uid: None,
                    container: c.name.clone(),
                    resource: d.resource_name,
                    ids: d.device_ids,
                    alloc: None,
                });
            }
        }
    }
    Ok(KubeletView {
        source: KubeletSource::PodResources,
        pods,
    })
}

/// Keeps kubelet's word and applies it to the pool.
pub struct Kubelet {
    pool: Arc<Pool>,
    said: Option<String>,
    /// The last failure to apply it (said once until it changes).
    failed: Option<String>,
}

impl Kubelet {
    pub fn new(pool: Arc<Pool>) -> Kubelet {
        Kubelet {
            pool,
            said: None,
            failed: None,
        }
    }

    /// One pass: kubelet's word now, applied ([`pods::sync`]).
    pub async fn sync(&mut self) {
        let view = match view(&self.pool).await {
            Ok(v) => {
                if self.said.take().is_some() {
                    log::info(&format!(
                        "device-plugin: kubelet's word is read again (its {})",
                        match v.source {
                            KubeletSource::PodResources => "pod resources API",
                            KubeletSource::Checkpoint => "checkpoint",
                        }
                    ));
                }
                Some(v)
            }
            Err(e) => {
                let line = format!("device-plugin: kubelet says nothing of its pods now ({e}): no pod allocation is freed until it does");
                if self.said.as_ref() != Some(&line) {
                    log::warn(&line);
                    self.said = Some(line);
                }
                None
            }
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let f = World::real(&self.pool.cfg);
        match pods::sync(&f, view.as_ref(), now, self.pool.cfg.kubelet_claim_s) {
            Ok(notes) => {
                self.failed = None;
                let changed = !notes.is_empty();
                for n in notes {
                    log::info(&format!("device-plugin: {n}"));
                }
                if changed {
                    self.pool.refresh();
                }
            }
            Err(e) => {
                let line = format!("device-plugin: kubelet's word not applied: {e}");
                // A state that cannot be read is said once, by the pool's look (every unit
                // unhealthy): not again here. That look first, so that a state spoilt since
                // the last one is said by it.
                self.pool.refresh();
                let said = self
                    .pool
                    .trouble()
                    .is_some_and(|t| line.contains(t.as_str()));
                if said {
                    self.failed = Some(line);
                } else if self.failed.as_ref() != Some(&line) {
                    log::warn(&line);
                    self.failed = Some(line);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    fn b64(bytes: &[u8]) -> String {
        const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut s = String::new();
        for c in bytes.chunks(3) {
            let n = c
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
            for i in 0..4 {
                s.push(if i <= c.len() {
                    A[(n >> (18 - 6 * i) & 63) as usize] as char
                } else {
                    '='
                });
            }
        }
        s
    }

    /// kubelet writes its checkpoint as a regular file (a rename): whatever else is at its
    /// path (a link to a file of the host, a FIFO that would stop the plugin's one thread,
    /// something endless) is not read.
    #[test]
    fn the_checkpoint_is_read_only_as_a_bounded_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        let text = br#"{"Data":{"PodDeviceEntries":[],"RegisteredDevices":{}},"Checksum":1}"#;
        std::fs::write(&real, text).unwrap();
        assert_eq!(read_checkpoint(&real).unwrap(), text);
        let link = dir.path().join(CHECKPOINT);
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = read_checkpoint(&link).unwrap_err().to_string();
        assert!(e.contains("link"), "{e}");
        std::fs::remove_file(&link).unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let f2 = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(read_checkpoint(&f2).map_err(|e| e.to_string()));
        });
        let e = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("a FIFO at the checkpoint's path blocks the read")
            .unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        let big = dir.path().join("big");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_CHECKPOINT as u64 + 1).unwrap();
        let e = read_checkpoint(&big).unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
        // The FIFO's reader, where it blocked, is let go.
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(&fifo);
    }

    /// The allocation of an `Allocate` answer as kubelet's checkpoint keeps it (Go writes a
    /// `[]byte` as padded standard base64).
    #[test]
    fn checkpoint_alloc_resp_names_the_allocation() {
        use prost::Message;
        assert_eq!(base64_decode("TWFu").unwrap(), b"Man");
        assert_eq!(base64_decode("TWE=").unwrap(), b"Ma");
        assert_eq!(base64_decode("TQ").unwrap(), b"M");
        assert_eq!(base64_decode("T!=="), None);
        let resp = kubelet_api::v1beta1::ContainerAllocateResponse {
            annotations: [(
                "gpuhook.io/allocation".to_string(),
                "0123456789abcdef0123456789abcdef".to_string(),
            )]
            .into(),
            devices: vec![kubelet_api::v1beta1::DeviceSpec {
                container_path: "/dev/nvidia0".into(),
                host_path: "/dev/nvidia0".into(),
                permissions: "rw".into(),
            }],
            ..Default::default()
        };
        let text = b64(&resp.encode_to_vec());
        assert_eq!(
            alloc_of(&text).as_deref(),
            Some("0123456789abcdef0123456789abcdef")
        );
        assert_eq!(alloc_of(""), None);
        assert_eq!(alloc_of("not base64!"), None);
    }
}
