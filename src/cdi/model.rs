//! The CDI spec's values as read ([`Spec`], [`Loaded`]) and what a container gets from them
//! ([`Plan`]: bind mounts, links, hooks, nodes).

use crate::ids::Vendor;
use crate::node::Node;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// gpuhook's own subcommand for the two NVIDIA hooks, as `gpuhook cdi generate` names it in
/// a spec's hooks (`gpuhook cdi-hook create-symlinks …`).
pub const CDI_HOOK: &str = "cdi-hook";

/// The CDI versions gpuhook reads (`specs-go/versions.go`).
pub(super) const VERSIONS: [&str; 8] = [
    "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
];

/// The newest of them.
pub const MAX_VERSION: &str = "1.1.0";

/// A spec file larger than this is refused (a full NVIDIA spec is ~20 KB).
pub(super) const MAX_SPEC: u64 = 4 << 20;

/// The default spec directories, lowest priority first.
/// Every OCI hook stage (gpuhook's own hooks, and CDI hooks it passes on, may be in any).
pub const STAGES: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

// ---- the spec, as `specs-go/config.go` defines it (unknown fields refused) ----

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    #[serde(default)]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub devices: Option<Vec<Device>>,
    #[serde(default)]
    pub container_edits: Option<Edits>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    #[serde(default)]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub container_edits: Option<Edits>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Edits {
    #[serde(default)]
    pub env: Option<Vec<String>>,
    #[serde(default)]
    pub device_nodes: Option<Vec<DeviceNode>>,
    #[serde(default)]
    pub hooks: Option<Vec<SpecHook>>,
    #[serde(default)]
    pub mounts: Option<Vec<SpecMount>>,
    #[serde(default)]
    pub intel_rdt: Option<serde_json::Value>,
    #[serde(default, rename = "additionalGids")]
    pub additional_gids: Option<Vec<u32>>,
    #[serde(default)]
    pub net_devices: Option<Vec<serde_json::Value>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceNode {
    pub path: String,
    #[serde(default)]
    pub host_path: Option<String>,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub major: Option<i64>,
    #[serde(default)]
    pub minor: Option<i64>,
    #[serde(default)]
    pub file_mode: Option<u32>,
    #[serde(default)]
    pub permissions: Option<String>,
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SpecMount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default)]
    pub options: Option<Vec<String>>,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SpecHook {
    pub hook_name: String,
    pub path: String,
    #[serde(default)]
    pub args: Option<Vec<String>>,
    #[serde(default)]
    pub env: Option<Vec<String>>,
    #[serde(default)]
    pub timeout: Option<i64>,
}

/// A spec read from a file.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub path: PathBuf,
    /// Index of its directory in the list (higher wins).
    pub dir: usize,
    pub spec: Spec,
}

// ---- what gets applied ----

/// A bind mount of a host file or directory into the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindMount {
    pub source: String,
    /// Absolute path in the container.
    pub target: String,
    /// Writable (the spec said `rw`); otherwise read-only.
    pub rw: bool,
    /// `rbind`: submounts too.
    pub recursive: bool,
    pub noexec: bool,
    /// The source is a directory (the target is made one).
    pub dir: bool,
}

/// `create-symlinks --link TARGET::LINK`: a symlink at `link` (absolute, in the container)
/// with the content `target`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub target: String,
    pub link: String,
}

/// A hook gpuhook does not do itself: passed to the OCI runtime as it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassedHook {
    pub stage: String,
    pub path: String,
    pub args: Vec<String>,
    pub env: Vec<String>,
    pub timeout: Option<i64>,
}

/// An extra device node a spec gives (a control node gpuhook does not grant by itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtraNode {
    pub node: Node,
    /// Permission bits: the spec's `fileMode`, else the host node's.
    pub mode: u32,
}

/// Where gpuhook mounts an MPS daemon's pipe and shm directories in a sharer's container
/// (docs/guides/sharing.md, "MPS"): no spec may mount there (gpuhook tells its mounts apart by target).
pub const MPS_TARGETS: [&str; 2] = ["/tmp/nvidia-mps", "/dev/shm"];

/// What a container gets from the specs, for the GPUs it was given.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The spec files applied, and the CDI devices (`kind=name`).
    pub specs: Vec<String>,
    pub devices: Vec<String>,
    pub nodes: Vec<ExtraNode>,
    pub mounts: Vec<BindMount>,
    pub links: Vec<Link>,
    /// `update-ldcache --folder`: directories (in the container) for its linker cache.
    pub ld_folders: Vec<String>,
    pub hooks: Vec<PassedHook>,
    pub env: Vec<String>,
    pub additional_gids: Vec<u32>,
    /// Where the files come from when no spec gives them (`driver="host"`: the running
    /// driver found on the host), for the log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_driver: Option<String>,
    /// The NVIDIA driver version the plan's files are of (`driver="host"`: the running
    /// module's; `cdi`: the one its libraries name, else the module's): what the
    /// reservation records as the container's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvidia_version: Option<String>,
}

impl Plan {
    /// Whether gpuhook has anything to do inside the container's root (links or the cache).
    pub fn writes_rootfs(&self) -> bool {
        !self.links.is_empty() || !self.ld_folders.is_empty()
    }
}

/// The vendor's CDI kind.
pub fn kind_of(v: Vendor) -> &'static str {
    match v {
        Vendor::Nvidia => "nvidia.com/gpu",
        Vendor::Amd => "amd.com/gpu",
        Vendor::Intel => "intel.com/gpu",
    }
}

/// The command that writes the vendor's spec.
pub fn generator(v: Vendor) -> &'static str {
    match v {
        Vendor::Nvidia => "nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml",
        Vendor::Amd => "amd-ctk cdi generate --output=/var/run/cdi/amd.json",
        Vendor::Intel => "intel-cdi-specs-generator --cdi-dir /var/run/cdi gpu",
    }
}
