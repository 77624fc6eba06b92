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
    match std::fs::read(&path) {
        Ok(bytes) => KubeletView::from_checkpoint(&bytes)
            .map_err(|e| format!("{api}; {}: {e}", path.display())),
        Err(e) => Err(format!("{api}; {}: {e}", path.display())),
    }
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
                if self.failed.as_ref() != Some(&line) {
                    log::warn(&line);
                    self.failed = Some(line);
                }
            }
        }
    }
}
