//! A request from an OCI bundle's `config.json`: annotations `gpuhook.io/KEY`, else
//! `GPUHOOK_KEY` entries of `process.env`, validated as the domain XML's attributes are
//! (the same `attrs::set_attr`); and the container user namespace's id ranges. The
//! bundle itself (reading, editing, cleaning it) is the OCI door's (`doors::bundle`).

use crate::ids::normalize_pci;
use crate::request::attrs::{self, GpusBuilder};
use crate::request::metadata::error::{AttrError, Conflict, ParseError};
use crate::request::{DeviceSel, IdRange, Request, Wording};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

pub const ANNOTATION_PREFIX: &str = "gpuhook.io/";
pub const ENV_PREFIX: &str = "GPUHOOK_";
/// The request keys, as annotations (`gpuhook.io/KEY`) and env (`GPUHOOK_KEY`, upper case).
pub const KEYS: &str =
    "gpus, arch, vendor, model, devices, capabilities, mode, uid, gid, mig, share, driver";
const MAX_VALUE: usize = 4096;
const MAX_DEVICES: usize = 256;
/// gpuhook's own variables, which a container's environment may carry (it is not a request).
const ENV_NOT_KEYS: [&str; 2] = ["CONFIG", "VERBOSE"];

/// Why a `config.json` holds no valid request; one line naming the fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OciError {
    #[error("config.json: \"annotations\" is not an object")]
    Annotations,
    #[error("annotation '{0}' is not a string")]
    NotString(String),
    /// A key's value is longer than gpuhook reads (`src` says where it came from).
    #[error("{src} is longer than {MAX_VALUE} bytes")]
    TooLong { src: KeyFrom },
    #[error("unknown key: {src} (known: {KEYS})")]
    UnknownKey { src: KeyFrom },
    /// A key's value is refused (`src` says where it came from).
    #[error("{src}: {source}")]
    Attr { src: KeyFrom, source: AttrError },
    /// `devices` is refused (`src` says where it came from).
    #[error("{src}: {source}")]
    Devices { src: KeyFrom, source: DevicesError },
    /// The count asked for is below the number of GPUs `devices` names.
    #[error("{count_from} asks for {count} GPU{}, fewer than the {n} named by {devices_from}", if *.count == 1 { "" } else { "s" })]
    CountBelowDevices {
        count_from: KeyFrom,
        count: u32,
        devices_from: KeyFrom,
        n: u32,
    },
    /// Whole GPUs by `devices`, and MIG instances by `mig`.
    #[error("{devices} names whole GPUs and {mig} asks for MIG instances: a request is one or the other")]
    MigAndDevices { mig: KeyFrom, devices: KeyFrom },
    /// MIG instances and shared slots both.
    #[error("MIG instances are never shared: {mig} and {share} cannot be asked for together")]
    ShareAndMig { mig: KeyFrom, share: KeyFrom },
    /// The keys together are no request (a conflict only the domain XML's keys make: its
    /// words).
    #[error(transparent)]
    Request(#[from] ParseError),
    /// kubelet's device plugin's allocation (`src`) with a key that chooses units (`other`).
    #[error("{src} (kubelet's device plugin's allocation) cannot be combined with {other}: the allocation's units are the container's")]
    WithAllocation { src: KeyFrom, other: KeyFrom },
    /// `linux.uidMappings` or `gidMappings` (`which`) is not a list of ranges.
    #[error("config.json: linux.{which} is not a list of {{containerID, hostID, size}}")]
    IdMappings { which: String },
}

/// What is wrong with a `devices` list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DevicesError {
    /// The list (quoted) has an empty entry.
    #[error("empty entry in '{0}'")]
    EmptyEntry(String),
    #[error("device index '{0}' is out of range")]
    IndexRange(String),
    #[error("'{0}' is neither a PCI address (0000:3b:00.0), a GPU UUID (GPU-…) nor an index")]
    NotDevice(String),
    #[error("more than {MAX_DEVICES} devices")]
    TooMany,
    /// One entry (as written) is in the list twice.
    #[error("'{0}' is named twice")]
    Twice(String),
}

/// Where a request key came from, in the words its user typed: for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyFrom {
    /// An OCI annotation: its whole key (`gpuhook.io/gpus`).
    Annotation(String),
    /// A variable of the bundle's `process.env`: its name (`GPUHOOK_GPUS`).
    Env(String),
    /// An option of an operator's command (`--count`).
    Flag(&'static str),
}

impl std::fmt::Display for KeyFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyFrom::Annotation(k) => write!(f, "annotation '{k}'"),
            KeyFrom::Env(v) => write!(f, "environment variable {v}"),
            KeyFrom::Flag(o) => f.write_str(o),
        }
    }
}

/// The key of kubelet's device plugin's annotation (`gpuhook.io/allocation`): the pod's
/// allocation a container's units come from. Not a request key: only an annotation.
pub const ALLOCATION_KEY: &str = "allocation";

/// The request keys that choose units: with an allocation, they contradict it.
const CHOOSING: [&str; 8] = [
    "gpus", "arch", "vendor", "model", "devices", "mig", "share", "count",
];

/// A Kubernetes container's pod, as its CRI runtime's annotations name it (containerd's
/// `io.kubernetes.cri.sandbox-*`, CRI-O's `io.kubernetes.cri-o.SandboxID` and
/// `io.kubernetes.pod.*`): its sandbox ID, namespace, name, UID, and the container's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriPod {
    pub sandbox: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub uid: Option<String>,
    pub container: Option<String>,
}

impl CriPod {
    /// The pod of a `config.json`'s annotations; `None` when it names no CRI sandbox.
    pub fn of(config: &Value) -> Option<CriPod> {
        let a = config.get("annotations")?.as_object()?;
        let first = |keys: &[&str]| {
            keys.iter()
                .find_map(|k| a.get(*k).and_then(Value::as_str))
                .filter(|s| !s.is_empty() && s.len() <= 1024)
                .map(str::to_owned)
        };
        Some(CriPod {
            sandbox: first(&[
                "io.kubernetes.cri.sandbox-id",
                "io.kubernetes.cri-o.SandboxID",
            ])?,
            namespace: first(&[
                "io.kubernetes.cri.sandbox-namespace",
                "io.kubernetes.pod.namespace",
            ]),
            name: first(&["io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"]),
            uid: first(&["io.kubernetes.cri.sandbox-uid", "io.kubernetes.pod.uid"]),
            container: first(&[
                "io.kubernetes.cri.container-name",
                "io.kubernetes.container.name",
            ]),
        })
    }

    /// How messages name it: `'ns/name'`, else `sandbox 'ID'`.
    pub fn who(&self) -> String {
        match (&self.namespace, &self.name) {
            (Some(ns), Some(n)) => format!("'{ns}/{n}'"),
            _ => format!("sandbox '{}'", self.sandbox),
        }
    }
}

/// The allocation `pairs` name (`gpuhook.io/allocation`, taken out of them), checked against
/// the other keys: those that choose units contradict it.
pub fn take_allocation(pairs: &mut Pairs) -> Result<Option<String>, OciError> {
    let Some((src, v)) = pairs.get(ALLOCATION_KEY).cloned() else {
        return Ok(None);
    };
    if !matches!(src, KeyFrom::Annotation(_)) {
        return Err(OciError::UnknownKey { src });
    }
    if let Some((_, (other, _))) = pairs.iter().find(|(k, _)| CHOOSING.contains(&k.as_str())) {
        return Err(OciError::WithAllocation {
            src,
            other: other.clone(),
        });
    }
    pairs.remove(ALLOCATION_KEY);
    Ok(Some(v))
}

/// Each request key (`gpus`, `arch`, …) with where it came from (for messages) and its value.
pub type Pairs = BTreeMap<String, (KeyFrom, String)>;

/// The request keys of a `config.json`: its `gpuhook.io/` annotations; without any, its
/// `GPUHOOK_` variables (when `env_requests`).
pub fn pairs(config: &Value, env_requests: bool) -> Result<Pairs, OciError> {
    let mut pairs = Pairs::new();
    if let Some(a) = config.get("annotations") {
        let a = a.as_object().ok_or(OciError::Annotations)?;
        for (k, v) in a {
            if let Some(key) = k.strip_prefix(ANNOTATION_PREFIX) {
                let v = v.as_str().ok_or_else(|| OciError::NotString(k.clone()))?;
                pairs.insert(
                    key.to_string(),
                    (KeyFrom::Annotation(k.clone()), v.to_string()),
                );
            }
        }
    }
    if pairs.is_empty() && env_requests {
        // No annotation: the same keys as environment variables (the last one wins, as in
        // the process's environment).
        let env = config.pointer("/process/env").and_then(Value::as_array);
        for e in env.into_iter().flatten() {
            let Some(e) = e.as_str() else { continue };
            let Some((k, v)) = e.split_once('=') else {
                continue;
            };
            if let Some(key) = k
                .strip_prefix(ENV_PREFIX)
                .filter(|k| !ENV_NOT_KEYS.contains(k))
            {
                pairs.insert(
                    key.to_ascii_lowercase(),
                    (KeyFrom::Env(k.to_string()), v.to_string()),
                );
            }
        }
    }
    Ok(pairs)
}

/// The words the keys were written in, for refusals that say what to ask for instead: the
/// environment's when a key came from it, an operator's options when one came from them,
/// else (an annotation, or no key: kubelet's allocation) the annotations'.
pub fn wording(pairs: &Pairs) -> Wording {
    let from = |f: fn(&KeyFrom) -> bool| pairs.values().any(|(k, _)| f(k));
    if from(|k| matches!(k, KeyFrom::Env(_))) {
        Wording::Env
    } else if from(|k| matches!(k, KeyFrom::Flag(_))) {
        Wording::Flag
    } else {
        Wording::Annotation
    }
}

/// The request from its keys (`gpus`, `arch`, …) with where each came from, validated as the
/// domain XML's attributes are.
pub fn request(pairs: &Pairs) -> Result<Request, OciError> {
    let mut g = GpusBuilder::default();
    for (key, (src, v)) in pairs {
        if v.len() > MAX_VALUE {
            return Err(OciError::TooLong { src: src.clone() });
        }
        let attr = |source| OciError::Attr {
            src: src.clone(),
            source,
        };
        let known = match key.as_str() {
            "gpus" => attrs::set_attr(&mut g, "count", v).map_err(attr)?,
            "count" => false,
            "devices" => {
                g.devices
                    .extend(devices(v).map_err(|source| OciError::Devices {
                        src: src.clone(),
                        source,
                    })?);
                true
            }
            k => attrs::set_attr(&mut g, k, v).map_err(attr)?,
        };
        if !known {
            return Err(OciError::UnknownKey { src: src.clone() });
        }
    }
    attrs::build_request(g).map_err(|c| worded(c, pairs))
}

/// A conflict among the keys, in the words of the door they came through (annotations,
/// environment variables, an operator's options).
fn worded(c: Conflict, pairs: &Pairs) -> OciError {
    let from = |k: &str| pairs.get(k).map(|(f, _)| f.clone());
    match (
        &c,
        from("gpus"),
        from("devices"),
        from("mig"),
        from("share"),
    ) {
        (
            Conflict::CountBelowChildren {
                count,
                n,
                mig: false,
            },
            Some(c),
            Some(d),
            _,
            _,
        ) => OciError::CountBelowDevices {
            count_from: c,
            count: *count,
            devices_from: d,
            n: *n,
        },
        (Conflict::MigAndDevices, _, Some(devices), Some(mig), _) => {
            OciError::MigAndDevices { mig, devices }
        }
        (Conflict::ShareAndMig, _, _, Some(mig), Some(share)) => {
            OciError::ShareAndMig { mig, share }
        }
        _ => OciError::Request(c.into()),
    }
}

/// `gpuhook.io/devices`: a comma list of PCI addresses, GPU UUIDs or indices.
pub fn devices(v: &str) -> Result<Vec<DeviceSel>, DevicesError> {
    let mut out = Vec::new();
    for item in v.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(DevicesError::EmptyEntry(v.to_string()));
        }
        let sel = if item.bytes().all(|b| b.is_ascii_digit()) {
            DeviceSel::Index(
                item.parse()
                    .map_err(|_| DevicesError::IndexRange(item.to_string()))?,
            )
        } else if let Some(p) = normalize_pci(item) {
            DeviceSel::Pci(p)
        } else if item.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            DeviceSel::Uuid(item.to_ascii_lowercase())
        } else {
            return Err(DevicesError::NotDevice(item.to_string()));
        };
        if out.contains(&sel) {
            return Err(DevicesError::Twice(item.to_string()));
        }
        out.push(sel);
        if out.len() > MAX_DEVICES {
            return Err(DevicesError::TooMany);
        }
    }
    Ok(out)
}

/// `linux.uidMappings` or `gidMappings` as id ranges (container id → host id).
pub fn id_ranges(config: &Value, which: &str) -> Result<Vec<IdRange>, OciError> {
    let Some(v) = config.pointer(&format!("/linux/{which}")) else {
        return Ok(Vec::new());
    };
    let bad = || OciError::IdMappings {
        which: which.to_string(),
    };
    let field = |m: &Map<String, Value>, k: &str| {
        m.get(k)
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(bad)
    };
    v.as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|m| {
            let m = m.as_object().ok_or_else(bad)?;
            Ok(IdRange {
                start: field(m, "containerID")?,
                target: field(m, "hostID")?,
                count: field(m, "size")?,
            })
        })
        .collect()
}
