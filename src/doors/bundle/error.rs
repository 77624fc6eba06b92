//! Why a bundle's `config.json` is refused or cannot be edited.

use crate::request::oci::OciError;
use crate::request::Unmapped;

/// Why a `config.json` is refused or cannot be edited; one line naming the fault.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("config.json is not valid JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("config.json is not a JSON object")]
    NotJsonObject,
    /// The request it holds is not valid.
    #[error(transparent)]
    Request(#[from] OciError),
    #[error("a GPU container needs a PID namespace of its own (gpuhook frees its GPUs when its init exits; with the host's or a joined PID namespace its other processes would keep them)")]
    NoPidNamespace,
    /// A Kubernetes pod's container in the pod's shared PID namespace
    /// (`shareProcessNamespace: true`) or the host's (`hostPID: true`): `how` says which.
    #[error("{how}: its containers have no PID namespace of their own, which a GPU container needs (gpuhook frees its GPUs when its init exits)")]
    PodPidNamespace { how: &'static str },
    /// The request's owner is not in the container's user namespace.
    #[error(transparent)]
    Unmapped(#[from] Unmapped),
    /// A part of the config (`at`: `linux`, `linux.resources`…) that is not an object.
    #[error("config.json: {at} is not an object")]
    NotObject { at: String },
    /// A part of the config that is not a list.
    #[error("config.json: {at} is not a list")]
    NotList { at: String },
    /// Something the config mounts at a reserved GPU's node.
    #[error("config.json already mounts something at {path}; refusing to shadow it")]
    MountAtNode { path: String },
    /// A device of the config at a node's path, with another number (or the node is bound).
    #[error("config.json already has a device at {path} ({}); refusing to replace it", number(.theirs))]
    DeviceAtNode {
        path: String,
        theirs: Option<(u32, u32)>,
    },
    /// Something the config mounts where a CDI spec mounts the driver's `host` file.
    #[error("config.json already mounts something at {target}; refusing to shadow it with the driver's {host}")]
    MountAtCdi { target: String, host: String },
    /// A hook the CDI spec gives whose program is not on this host (`name`: its first
    /// argument).
    #[error("CDI hook {path} ({name}) is not on this host")]
    HookMissing { path: String, name: String },
    /// The work of gpuhook's `cdi` hook cannot be written as its argument.
    #[error("{0}")]
    Work(#[source] serde_json::Error),
}

/// A device number for a message: `MAJ:MIN`, `?` for none.
fn number(n: &Option<(u32, u32)>) -> String {
    n.map_or("?".into(), |(a, b)| format!("{a}:{b}"))
}
