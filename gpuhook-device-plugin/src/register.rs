//! One socket and one registration per resource, in kubelet's plugin directory. kubelet
//! removes the plugins' sockets and makes its own `kubelet.sock` anew when it restarts: a
//! socket of ours that is gone (or is no longer the one we bound) is bound again, and every
//! resource registers again when `kubelet.sock` is another file than the one registered
//! with. Looked at on every change of the directory, and at each tick.

use crate::pool::Pool;
use crate::service::{options, Service};
use gpuhook::log;
use gpuhook::reserve::pods::Resource;
use kubelet_api::v1beta1::device_plugin_server::DevicePluginServer;
use kubelet_api::v1beta1::registration_client::RegistrationClient;
use kubelet_api::v1beta1::RegisterRequest;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// How long a registration may take.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(3);

/// A file's identity.
fn identity(p: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// A resource's server: its socket and the file it bound, and how to stop it.
struct Running {
    path: PathBuf,
    file: Option<(u64, u64)>,
    stop: Option<oneshot::Sender<()>>,
    /// Registered with the `kubelet.sock` of this identity.
    registered: Option<(u64, u64)>,
}

/// The servers of every resource, and what kubelet was told.
pub struct Servers {
    dir: PathBuf,
    pool: Arc<Pool>,
    running: BTreeMap<Resource, Running>,
    /// The last failure said (each said once until it changes).
    said: BTreeMap<Resource, String>,
}

impl Servers {
    pub fn new(pool: Arc<Pool>) -> Servers {
        Servers {
            dir: pool.cfg.kubelet_plugin_dir.clone(),
            pool,
            running: BTreeMap::new(),
            said: BTreeMap::new(),
        }
    }

    /// Every resource to serve has its socket (bound again when it is gone), and is
    /// registered with the `kubelet.sock` there now.
    pub async fn reconcile(&mut self) {
        let kubelet = self.dir.join(kubelet_api::KUBELET_SOCKET);
        for res in self.pool.resources() {
            let path = self.dir.join(res.socket());
            let ours = self
                .running
                .get(&res)
                .is_some_and(|r| r.file.is_some() && identity(&r.path) == r.file);
            if !ours {
                if let Err(e) = self.serve(&res, &path) {
                    self.say(&res, format!("cannot serve {}: {e}", path.display()));
                    continue;
                }
            }
            let Some(k) = identity(&kubelet) else {
                continue;
            };
            if self.running.get(&res).and_then(|r| r.registered) == Some(k) {
                continue;
            }
            match register(&kubelet, &res).await {
                Ok(()) => {
                    log::info(&format!(
                        "device-plugin: registered {} ({}) with kubelet",
                        res.name(),
                        path.display()
                    ));
                    self.said.remove(&res);
                    if let Some(r) = self.running.get_mut(&res) {
                        r.registered = Some(k);
                    }
                }
                Err(e) => self.say(
                    &res,
                    format!(
                        "cannot register {} with kubelet ({}): {e}",
                        res.name(),
                        kubelet.display()
                    ),
                ),
            }
        }
    }

    fn say(&mut self, res: &Resource, line: String) {
        if self.said.get(res) != Some(&line) {
            log::warn(&format!("device-plugin: {line}"));
            self.said.insert(res.clone(), line);
        }
    }

    /// Binds the resource's socket (what is at its path is ours, or left by a plugin before
    /// us: removed first) and serves it.
    fn serve(&mut self, res: &Resource, path: &Path) -> std::io::Result<()> {
        if let Some(mut old) = self.running.remove(res) {
            if let Some(s) = old.stop.take() {
                let _ = s.send(());
            }
        }
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_dir() => {
                return Err(std::io::Error::other("a directory is in its place"))
            }
            Ok(_) => std::fs::remove_file(path)?,
            Err(_) => {}
        }
        let listener = tokio::net::UnixListener::bind(path)?;
        let file = identity(path);
        let (stop, stopped) = oneshot::channel::<()>();
        let svc = DevicePluginServer::new(Service {
            resource: res.clone(),
            pool: Arc::clone(&self.pool),
        });
        let name = res.name();
        tokio::spawn(async move {
            let r = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(kubelet_api::unix_incoming(listener), async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = r {
                log::warn(&format!("device-plugin: {name}: server: {e}"));
            }
        });
        self.running.insert(
            res.clone(),
            Running {
                path: path.to_path_buf(),
                file,
                stop: Some(stop),
                registered: None,
            },
        );
        Ok(())
    }

    /// Stops every server and removes its socket (kubelet then knows the plugin is gone).
    pub fn stop(&mut self) {
        for (_, mut r) in std::mem::take(&mut self.running) {
            if let Some(s) = r.stop.take() {
                let _ = s.send(());
            }
            if r.file.is_some() && identity(&r.path) == r.file {
                let _ = std::fs::remove_file(&r.path);
            }
        }
    }
}

/// `Registration.Register` of `res` at kubelet's socket.
async fn register(kubelet: &Path, res: &Resource) -> Result<(), String> {
    let channel = kubelet_api::unix_channel(kubelet).map_err(|e| e.to_string())?;
    let mut client = RegistrationClient::new(channel);
    let req = RegisterRequest {
        version: kubelet_api::VERSION.into(),
        endpoint: res.socket(),
        resource_name: res.name(),
        options: Some(options()),
    };
    match tokio::time::timeout(REGISTER_TIMEOUT, client.register(req)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(s)) => Err(format!("{}: {}", s.code(), s.message())),
        Err(_) => Err(format!("no answer in {} s", REGISTER_TIMEOUT.as_secs())),
    }
}
