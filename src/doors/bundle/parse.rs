//! What a bundle's `config.json` asks for (annotations `gpuhook.io/…`, else `GPUHOOK_…` in
//! `process.env`), the container user namespace's id mapping, and the checks a GPU container
//! must pass (a PID namespace of its own, a valid container ID).

use super::error::BundleError;
use super::hooks::{our_hooks, HOOK_WORD};
use crate::request::oci::{self, ANNOTATION_PREFIX, ENV_PREFIX};
use crate::request::{IdMap, Request, Wording};
use serde_json::{json, Value};

/// Whether `config.json`'s bytes could hold a request, or gpuhook's earlier edits, at all:
/// the pass-through path for every other container costs this one search.
pub fn mentions_request(config: &[u8]) -> bool {
    let has = |n: &[u8]| config.windows(n.len()).any(|w| w == n);
    has(ANNOTATION_PREFIX.as_bytes())
        || has(ENV_PREFIX.as_bytes())
        || has(format!("\"{HOOK_WORD}\"").as_bytes())
}

/// How the host reads requests (config keys).
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// `GPUHOOK_…` variables in `process.env` are a request (config `oci_env_requests`,
    /// default true): an image's `ENV` can then ask for GPUs.
    pub env_requests: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy { env_requests: true }
    }
}

/// What a bundle asks for.
#[derive(Debug)]
pub struct Bundle {
    /// The whole `config.json`, kept to be edited and written back.
    pub config: Value,
    /// `None`: no `gpuhook.io/` annotation and no `GPUHOOK_` variable.
    pub request: Option<Request>,
    /// The container's user namespace (`linux.uidMappings`/`gidMappings`); empty without one.
    pub idmap: IdMap,
    /// The config holds gpuhook's additions from an earlier `create` of this bundle.
    pub edited: bool,
    /// The pod's allocation its units come from (`gpuhook.io/allocation`, from kubelet's
    /// device plugin), with the container's pod; then `request` says only how its nodes and
    /// driver files are made (capabilities, mode, owner, driver).
    pub allocation: Option<(String, Option<oci::CriPod>)>,
    /// The words its request was written in (annotations, or `process.env`): a refusal that
    /// says what to ask for instead says it in them.
    pub wording: Wording,
}

/// Whether the config is a Kubernetes pod's sandbox ("pause") container: pod annotations
/// reach it too (containerd's `pod_annotations`), and it never gets GPUs.
pub fn is_sandbox(config: &Value) -> bool {
    [
        "/annotations/io.kubernetes.cri.container-type",
        "/annotations/io.kubernetes.cri-o.ContainerType",
    ]
    .iter()
    .any(|p| config.pointer(p) == Some(&json!("sandbox")))
}

/// A Kubernetes pod's app container (the CRI runtimes' annotations) without a PID namespace
/// of its own: what the pod says that made it so.
fn pod_pid_mode(config: &Value) -> Option<&'static str> {
    let app = [
        "/annotations/io.kubernetes.cri.container-type",
        "/annotations/io.kubernetes.cri-o.ContainerType",
    ]
    .iter()
    .any(|p| config.pointer(p) == Some(&json!("container")));
    if !app {
        return None;
    }
    let joined = config
        .pointer("/linux/namespaces")
        .and_then(Value::as_array)
        .is_some_and(|ns| {
            ns.iter()
                .any(|n| n.get("type") == Some(&json!("pid")) && n.get("path").is_some())
        });
    Some(if joined {
        "the pod shares one PID namespace among its containers (shareProcessNamespace: true)"
    } else {
        "the pod runs in the host's PID namespace (hostPID: true)"
    })
}

/// Whether the container has a PID namespace of its own (a `pid` entry without `path`): its
/// init's exit then ends every process in it, which is when gpuhook frees its GPUs.
fn own_pid_namespace(config: &Value) -> bool {
    config
        .pointer("/linux/namespaces")
        .and_then(Value::as_array)
        .is_some_and(|ns| {
            ns.iter()
                .any(|n| n.get("type") == Some(&json!("pid")) && n.get("path").is_none())
        })
}

/// Parses `config.json`; an error names the fault in one line.
pub fn parse(config: &[u8], policy: Policy) -> Result<Bundle, BundleError> {
    let config: Value = serde_json::from_slice(config).map_err(BundleError::NotJson)?;
    if !config.is_object() {
        return Err(BundleError::NotJsonObject);
    }
    let mut pairs = oci::pairs(&config, policy.env_requests)?;
    let allocation = if is_sandbox(&config) {
        None
    } else {
        oci::take_allocation(&mut pairs)?.map(|a| (a, oci::CriPod::of(&config)))
    };
    let wording = oci::wording(&pairs);
    let idmap = IdMap {
        uid: oci::id_ranges(&config, "uidMappings")?,
        gid: oci::id_ranges(&config, "gidMappings")?,
    };
    let edited = !our_hooks(&config).is_empty();
    let request = if (pairs.is_empty() && allocation.is_none()) || is_sandbox(&config) {
        None
    } else {
        let r = oci::request(&pairs)?;
        if !own_pid_namespace(&config) {
            return Err(match pod_pid_mode(&config) {
                Some(how) => BundleError::PodPidNamespace { how },
                None => BundleError::NoPidNamespace,
            });
        }
        idmap.owner(r.uid, r.gid, ("linux.uidMappings", "linux.gidMappings"))?;
        Some(r)
    };
    Ok(Bundle {
        config,
        request,
        idmap,
        edited,
        allocation,
        wording,
    })
}

/// Whether the container gets a user namespace of its own (`linux.namespaces` has `user`):
/// the runtime cannot `mknod` there, and bind-mounts the host's node of the same path.
pub fn has_user_namespace(config: &Value) -> bool {
    config
        .pointer("/linux/namespaces")
        .and_then(Value::as_array)
        .is_some_and(|ns| ns.iter().any(|n| n.get("type") == Some(&json!("user"))))
}

/// Whether `id` is a container ID gpuhook keeps in its state: what runc and crun accept
/// (letters, digits, `_+-.`), at most 1024 bytes.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 1024
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'+' | b'-' | b'.'))
}
