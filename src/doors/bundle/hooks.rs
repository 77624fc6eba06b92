//! gpuhook's hooks in a `config.json`: the word that marks them, their stages and token, the
//! work of the `cdi` hook, what the runtime passes them on stdin, and how to find them again.

use serde_json::{json, Value};

/// The word that marks gpuhook's hooks in a `config.json` (`[PATH, "oci-hook", STAGE, TOKEN,
/// ADDED]`): ADDED lists what that edit added (`MAJ:MIN:PATH`, comma-separated), so that a
/// bundle used again (`runc run` of the same directory) is cleaned of it before it is edited
/// again, or passed on without it.
pub const HOOK_WORD: &str = "oci-hook";

/// The mark on a CDI hook gpuhook passed on to the runtime (in its env), for [`super::strip::strip`].
pub(super) const CDI_MARK: &str = "GPUHOOK_CDI=1";

/// How the runtime runs gpuhook at its hooks: this binary, and the config it was given.
#[derive(Debug, Clone)]
pub struct HookCmd {
    pub path: String,
    pub env: Vec<String>,
    /// Which reservation the hooks belong to (the reserving process, `PID.START`): a hook
    /// left from an earlier `create` of the same ID or bundle acts on nothing else.
    pub token: String,
}

/// The hooks' token: the reserving process, written `PID.START` (its start time in clock
/// ticks since boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HookToken(pub crate::host::procfs::ProcRef);

impl std::fmt::Display for HookToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.0.pid, self.0.start_time)
    }
}

/// A token that is not `PID.START`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a reservation token (PID.START)")]
pub struct BadToken;

impl std::str::FromStr for HookToken {
    type Err = BadToken;
    fn from_str(t: &str) -> Result<Self, BadToken> {
        let (p, s) = t.split_once('.').ok_or(BadToken)?;
        Ok(HookToken(crate::host::procfs::ProcRef {
            pid: p.parse().map_err(|_| BadToken)?,
            start_time: s.parse().map_err(|_| BadToken)?,
        }))
    }
}

/// The `oci-hook` stages gpuhook adds.
pub const CREATE_RUNTIME: &str = "create-runtime";
pub const POSTSTOP: &str = "poststop";
/// `createContainer`: gpuhook's own `create-symlinks` and `update-ldcache` in the rootfs.
pub const CDI: &str = "cdi";

/// What gpuhook's `cdi` hook does in the container's root (its one argument, as JSON).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CdiWork {
    /// The container's root filesystem (absolute, as the runtime mounts it).
    pub root: String,
    pub links: Vec<crate::cdi::Link>,
    pub folders: Vec<String>,
}

/// What the runtime passes an OCI hook on stdin (runtime-spec "state").
#[derive(Debug, serde::Deserialize)]
pub struct HookState {
    pub id: String,
    #[serde(default)]
    pub pid: Option<i32>,
}

/// gpuhook's own hook: `[PATH, "oci-hook", …]` run by the program `gpuhook` itself.
pub(super) fn is_our_hook(h: &Value) -> bool {
    let path = h.get("path").and_then(Value::as_str);
    h.pointer("/args/1") == Some(&json!(HOOK_WORD))
        && h.pointer("/args/0").and_then(Value::as_str) == path
        && path.is_some_and(|p| std::path::Path::new(p).file_name() == Some("gpuhook".as_ref()))
}

/// gpuhook's hooks in the config.
pub(super) fn our_hooks(config: &Value) -> Vec<&Value> {
    crate::cdi::STAGES
        .iter()
        .filter_map(|s| {
            config
                .pointer(&format!("/hooks/{s}"))
                .and_then(Value::as_array)
        })
        .flatten()
        .filter(|h| is_our_hook(h))
        .collect()
}
