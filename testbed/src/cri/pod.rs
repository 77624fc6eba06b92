//! Pods and containers as kubelet describes them to the runtime: the sandbox config
//! (metadata, labels, the pod's annotations, its cgroup parent, host network, the PID
//! namespace mode from `shareProcessNamespace`) and each container's config (the same
//! namespace options, a log path under the pod's log directory).

use super::api;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// What a pod manifest says that reaches the runtime.
#[derive(Debug, Clone, Default)]
pub struct PodSpec {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// `metadata.annotations`: kubelet passes them all to the sandbox config.
    pub annotations: BTreeMap<String, String>,
    /// `spec.shareProcessNamespace`.
    pub share_process_namespace: bool,
}

impl PodSpec {
    /// A pod in namespace `default`; its UID made from the name and this process.
    pub fn new(name: &str) -> PodSpec {
        PodSpec {
            name: name.into(),
            namespace: "default".into(),
            uid: format!(
                "{:08x}-0000-4000-8000-{:012x}",
                std::process::id(),
                hash(name)
            ),
            ..Default::default()
        }
    }

    pub fn annotate(mut self, key: &str, value: &str) -> PodSpec {
        self.annotations.insert(key.into(), value.into());
        self
    }

    pub fn share_pid(mut self) -> PodSpec {
        self.share_process_namespace = true;
        self
    }

    /// kubelet's namespace options: host network (the bed has no CNI), the pod's IPC, the
    /// PID namespace per container unless the pod shares one.
    pub fn namespaces(&self) -> api::NamespaceOption {
        api::NamespaceOption {
            network: api::NamespaceMode::Node as i32,
            pid: if self.share_process_namespace {
                api::NamespaceMode::Pod as i32
            } else {
                api::NamespaceMode::Container as i32
            },
            ipc: api::NamespaceMode::Pod as i32,
            ..Default::default()
        }
    }

    /// The sandbox config kubelet sends (`RunPodSandbox`, and again with each
    /// `CreateContainer`).
    pub fn sandbox_config(&self, cgroup_parent: &str, log_dir: &Path) -> api::PodSandboxConfig {
        let labels = HashMap::from([
            ("io.kubernetes.pod.name".to_string(), self.name.clone()),
            (
                "io.kubernetes.pod.namespace".to_string(),
                self.namespace.clone(),
            ),
            ("io.kubernetes.pod.uid".to_string(), self.uid.clone()),
        ]);
        api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: self.name.clone(),
                uid: self.uid.clone(),
                namespace: self.namespace.clone(),
                attempt: 0,
            }),
            // kubelet names the host only for a pod with a network of its own (runc refuses a
            // hostname without a UTS namespace, which a host-network pod shares).
            hostname: String::new(),
            log_directory: log_dir.to_string_lossy().into_owned(),
            labels,
            annotations: self
                .annotations
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            linux: Some(api::LinuxPodSandboxConfig {
                cgroup_parent: cgroup_parent.into(),
                security_context: Some(api::LinuxSandboxSecurityContext {
                    namespace_options: Some(self.namespaces()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A container's config as kubelet sends it (`CreateContainer`): `command` is the
    /// manifest's `command` (the image's entrypoint replaced).
    pub fn container_config(
        &self,
        name: &str,
        image: &str,
        command: &[&str],
    ) -> api::ContainerConfig {
        api::ContainerConfig {
            metadata: Some(api::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(api::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            command: command.iter().map(|s| s.to_string()).collect(),
            labels: HashMap::from([
                ("io.kubernetes.container.name".to_string(), name.to_string()),
                ("io.kubernetes.pod.name".to_string(), self.name.clone()),
                (
                    "io.kubernetes.pod.namespace".to_string(),
                    self.namespace.clone(),
                ),
                ("io.kubernetes.pod.uid".to_string(), self.uid.clone()),
            ]),
            annotations: HashMap::from([(
                "io.kubernetes.container.restartCount".to_string(),
                "0".to_string(),
            )]),
            log_path: format!("{name}/0.log"),
            linux: Some(api::LinuxContainerConfig {
                resources: Some(api::LinuxContainerResources {
                    cpu_shares: 2,
                    oom_score_adj: 1000,
                    ..Default::default()
                }),
                security_context: Some(api::LinuxContainerSecurityContext {
                    namespace_options: Some(self.namespaces()),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        }
    }
}

/// FNV-1a, for UIDs that differ by name.
fn hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    }) & 0xffff_ffff_ffff
}
