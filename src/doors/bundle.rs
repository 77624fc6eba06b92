//! The OCI side of a request, pure (bytes in, values out): what a bundle's `config.json`
//! asks for (annotations `gpuhook.io/…`, else `GPUHOOK_…` in `process.env`), the container
//! user namespace's id mapping, and the edits that hand the reserved GPUs to the real runtime
//! (`linux.devices`, `linux.resources.devices`, a `createRuntime` and a `poststop` hook). The
//! runtime then makes the nodes and the cgroup rules itself, in cgroup v1, v2 and through
//! systemd alike. [`crate::doors::runtime`] is the front door that reads and writes the files.

use crate::node::NodeSpec;
use crate::request::oci::{self, OciError, ANNOTATION_PREFIX, ENV_PREFIX};
use crate::request::{IdMap, Request, Unmapped};
use serde_json::{json, Map, Value};

/// The word that marks gpuhook's hooks in a `config.json` (`[PATH, "oci-hook", STAGE, TOKEN,
/// ADDED]`): ADDED lists what that edit added (`MAJ:MIN:PATH`, comma-separated), so that a
/// bundle used again (`runc run` of the same directory) is cleaned of it before it is edited
/// again, or passed on without it.
pub const HOOK_WORD: &str = "oci-hook";

/// The mark on a CDI hook gpuhook passed on to the runtime (in its env), for [`strip`].
const CDI_MARK: &str = "GPUHOOK_CDI=1";

/// Whether `config.json`'s bytes could hold a request, or gpuhook's earlier edits, at all:
/// the pass-through path for every other container costs this one search.
pub fn mentions_request(config: &[u8]) -> bool {
    let has = |n: &[u8]| config.windows(n.len()).any(|w| w == n);
    has(ANNOTATION_PREFIX.as_bytes())
        || has(ENV_PREFIX.as_bytes())
        || has(format!("\"{HOOK_WORD}\"").as_bytes())
}

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
    let pairs = oci::pairs(&config, policy.env_requests)?;
    let idmap = IdMap {
        uid: oci::id_ranges(&config, "uidMappings")?,
        gid: oci::id_ranges(&config, "gidMappings")?,
    };
    let edited = !our_hooks(&config).is_empty();
    let request = if pairs.is_empty() || is_sandbox(&config) {
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
    })
}

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

fn not_object(at: impl Into<String>) -> BundleError {
    BundleError::NotObject { at: at.into() }
}

fn object<'a>(
    parent: &'a mut Value,
    key: &str,
    what: &str,
) -> Result<&'a mut Map<String, Value>, BundleError> {
    let m = parent.as_object_mut().ok_or_else(|| not_object(what))?;
    m.entry(key)
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| not_object(format!("{what}.{key}")))
}

fn array<'a>(
    parent: &'a mut Map<String, Value>,
    key: &str,
    what: &str,
) -> Result<&'a mut Vec<Value>, BundleError> {
    parent
        .entry(key)
        .or_insert_with(|| Value::Array(Vec::new()))
        .as_array_mut()
        .ok_or_else(|| BundleError::NotList {
            at: format!("{what}.{key}"),
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

/// Adds the nodes and gpuhook's two hooks; everything else is kept. Each node gets an exact
/// `c MAJ:MIN rw` allow rule (unless the config already has that very rule) and either a
/// `linux.devices` entry (the runtime makes it) or, when `binds` names a node gpuhook made for
/// it (a user-namespaced container, where the runtime cannot make nodes), a bind mount of
/// that node. A device already in the config with the same path and number is the user's and
/// stays; one with another number, or a mount at a node's path, is refused (it would shadow
/// the reserved GPU). The hooks list exactly what was added (`n:MAJ:MIN:PATH` for a device or
/// mount, `r:MAJ:MIN` for a rule), so that [`strip`] takes out that and nothing else.
pub fn edit(
    config: &mut Value,
    nodes: &[NodeSpec],
    binds: Option<&[String]>,
    hook: &HookCmd,
    cdi: Option<(&crate::cdi::Plan, &str)>,
) -> Result<(), BundleError> {
    strip(config);
    let mut added: Vec<String> = Vec::new();
    if let Some(srcs) = binds {
        let root = config
            .as_object_mut()
            .ok_or_else(|| not_object("the config"))?;
        let mounts = array(root, "mounts", "the config")?;
        for (n, src) in nodes.iter().zip(srcs) {
            if mounts
                .iter()
                .any(|m| m.get("destination").and_then(Value::as_str) == Some(n.path.as_str()))
            {
                return Err(BundleError::MountAtNode {
                    path: n.path.clone(),
                });
            }
            mounts.push(json!({"destination": n.path, "type": "bind", "source": src,
                               "options": ["bind", "nosuid", "noexec"]}));
            added.push(format!("n:{}:{}:{}", n.major, n.minor, n.path));
        }
    }
    let linux = object(config, "linux", "the config")?;
    let devs = array(linux, "devices", "linux")?;
    for n in nodes {
        let theirs = devs
            .iter()
            .find(|d| d.get("path").and_then(Value::as_str) == Some(n.path.as_str()));
        match theirs {
            Some(d) if device_number(d) == Some((n.major, n.minor)) && binds.is_none() => {}
            Some(d) => {
                return Err(BundleError::DeviceAtNode {
                    path: n.path.clone(),
                    theirs: device_number(d),
                })
            }
            None if binds.is_none() => {
                devs.push(
                    json!({"path": n.path, "type": "c", "major": n.major, "minor": n.minor,
                                 "fileMode": n.mode, "uid": n.uid, "gid": n.gid}),
                );
                added.push(format!("n:{}:{}:{}", n.major, n.minor, n.path));
            }
            None => {}
        }
    }
    let res = linux
        .entry("resources")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| not_object("linux.resources"))?;
    let rules = array(res, "devices", "linux.resources")?;
    for n in nodes {
        let rule = allow_rule(n.major, n.minor);
        if !rules.contains(&rule) {
            rules.push(rule);
            added.push(format!("r:{}:{}", n.major, n.minor));
        }
    }
    if let Some((plan, root)) = cdi {
        edit_cdi(config, plan, root, hook, &mut added)?;
    }
    let hooks = object(config, "hooks", "the config")?;
    for (stage, arg) in [("createRuntime", CREATE_RUNTIME), ("poststop", POSTSTOP)] {
        let mut h = json!({"path": hook.path,
                           "args": [hook.path, HOOK_WORD, arg, hook.token, added.join(",")]});
        if !hook.env.is_empty() {
            h["env"] = json!(hook.env);
        }
        array(hooks, stage, "hooks")?.push(h);
    }
    Ok(())
}

/// The plan's bind mounts, appended to `mounts` (listed in `added` as `m:0:0:PATH`); one
/// at a destination the config already mounts is refused.
fn cdi_mounts(
    mounts: &mut Vec<Value>,
    plan: &crate::cdi::Plan,
    added: &mut Vec<String>,
) -> Result<(), BundleError> {
    for m in &plan.mounts {
        if mounts
            .iter()
            .any(|x| x.get("destination").and_then(Value::as_str) == Some(m.target.as_str()))
        {
            return Err(BundleError::MountAtCdi {
                target: m.target.clone(),
                host: m.source.clone(),
            });
        }
        let mut opts = vec![
            if m.recursive { "rbind" } else { "bind" },
            if m.rw { "rw" } else { "ro" },
            "nosuid",
            "nodev",
            "rprivate",
        ];
        if m.noexec {
            opts.push("noexec");
        }
        // `ro,nosuid,nodev` reach the top mount only: submounts of an `rbind` get them
        // through the recursive attributes (runc ≥ 1.1, crun ≥ 1.4: mount_setattr).
        if m.recursive {
            opts.extend(["rnosuid", "rnodev"]);
            if !m.rw {
                opts.push("rro");
            }
            if m.noexec {
                opts.push("rnoexec");
            }
        }
        mounts.push(
            json!({"destination": m.target, "type": "bind", "source": m.source,
                           "options": opts}),
        );
        added.push(format!("m:0:0:{}", m.target));
    }
    Ok(())
}

/// A sharer of a GPU shared with MPS: its daemon's `pipe` at `/tmp/nvidia-mps` and `shm`
/// at `/dev/shm` (replacing the engine's own `/dev/shm` mount: the MPS clients' shared memory
/// must be the daemon's), `CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps` in `process.env`; added
/// to what gpuhook's hooks list (`m:0:0:PATH`, `e:0:0:NAME`) for [`strip`]. `dir`: the
/// daemon's directory.
pub fn edit_mps(config: &mut Value, dir: &std::path::Path) -> Result<(), BundleError> {
    use crate::reserve::mps::{CONTAINER_PIPE, CONTAINER_SHM};
    let mut added = Vec::new();
    let top = config
        .as_object_mut()
        .ok_or_else(|| not_object("the config"))?;
    let mounts = array(top, "mounts", "the config")?;
    mounts.retain(|m| {
        let d = m.get("destination").and_then(Value::as_str);
        d != Some(CONTAINER_PIPE) && d != Some(CONTAINER_SHM)
    });
    // The pipe directory read-only (its FIFOs and sockets still open for writing): a sharer
    // plants nothing where the daemon and gpuhook look ([`crate::reserve::mps::mounts`]).
    for (src, dst, mode) in [("pipe", CONTAINER_PIPE, "ro"), ("shm", CONTAINER_SHM, "rw")] {
        mounts.push(json!({"destination": dst, "type": "bind",
                           "source": dir.join(src).display().to_string(),
                           "options": ["rbind", mode, "nosuid", "nodev"]}));
        added.push(format!("m:0:0:{dst}"));
    }
    let process = object(config, "process", "the config")?;
    let env = array(process, "env", "process")?;
    env.retain(|e| {
        !e.as_str()
            .is_some_and(|e| e.starts_with("CUDA_MPS_PIPE_DIRECTORY="))
    });
    env.push(json!(format!("CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE}")));
    added.push("e:0:0:CUDA_MPS_PIPE_DIRECTORY".into());
    if let Some(hooks) = config.get_mut("hooks").and_then(Value::as_object_mut) {
        for h in hooks.values_mut().filter_map(Value::as_array_mut).flatten() {
            if !is_our_hook(h) {
                continue;
            }
            if let Some(last) = h
                .get_mut("args")
                .and_then(Value::as_array_mut)
                .and_then(|a| a.last_mut())
            {
                let mut l: Vec<String> = last
                    .as_str()
                    .filter(|s| !s.is_empty())
                    .map(|s| s.split(',').map(String::from).collect())
                    .unwrap_or_default();
                l.extend(added.iter().cloned());
                *last = json!(l.join(","));
            }
        }
    }
    Ok(())
}

/// A CDI plan's mounts (read-only unless the spec said `rw`, always `nosuid,nodev`), its
/// environment (a name the config already sets keeps the config's value), additional groups,
/// the hooks gpuhook passes on (marked), and gpuhook's own `cdi` hook first in
/// `createContainer` for the symlinks and the linker cache. `added` lists the mounts
/// (`m:0:0:PATH`) and variables (`e:0:0:NAME`) for [`strip`].
fn edit_cdi(
    config: &mut Value,
    plan: &crate::cdi::Plan,
    root: &str,
    hook: &HookCmd,
    added: &mut Vec<String>,
) -> Result<(), BundleError> {
    let top = config
        .as_object_mut()
        .ok_or_else(|| not_object("the config"))?;
    cdi_mounts(array(top, "mounts", "the config")?, plan, added)?;
    let process = object(config, "process", "the config")?;
    let env = array(process, "env", "process")?;
    for e in &plan.env {
        let name = e.split_once('=').map_or(e.as_str(), |(n, _)| n);
        let set = env.iter().any(|x| {
            x.as_str()
                .and_then(|x| x.split_once('='))
                .is_some_and(|(n, _)| n == name)
        });
        if !set {
            env.push(json!(e));
            added.push(format!("e:0:0:{name}"));
        }
    }
    if !plan.additional_gids.is_empty() {
        let user = object(config, "process", "the config").and_then(|p| {
            p.entry("user")
                .or_insert_with(|| json!({"uid": 0, "gid": 0}))
                .as_object_mut()
                .ok_or_else(|| not_object("process.user"))
        })?;
        let gids = array(user, "additionalGids", "process.user")?;
        for g in &plan.additional_gids {
            if !gids.contains(&json!(g)) {
                gids.push(json!(g));
                added.push(format!("g:{g}:0"));
            }
        }
    }
    let hooks = object(config, "hooks", "the config")?;
    for h in &plan.hooks {
        if !std::path::Path::new(&h.path).is_file() {
            return Err(BundleError::HookMissing {
                path: h.path.clone(),
                name: h.args.get(1).cloned().unwrap_or_default(),
            });
        }
        let mut env = h.env.clone();
        env.push(CDI_MARK.into());
        let mut v = json!({"path": h.path, "args": h.args, "env": env});
        if let Some(t) = h.timeout {
            v["timeout"] = json!(t);
        }
        array(hooks, &h.stage, "hooks")?.push(v);
    }
    if plan.writes_rootfs() {
        let work = CdiWork {
            root: root.to_string(),
            links: plan.links.clone(),
            folders: plan.ld_folders.clone(),
        };
        let arg = serde_json::to_string(&work).map_err(BundleError::Work)?;
        // A time limit the runtime enforces (gpuhook's own limit on ldconfig is 10 s).
        let mut h = json!({"path": hook.path, "timeout": 30,
                           "args": [hook.path, HOOK_WORD, CDI, hook.token, arg]});
        if !hook.env.is_empty() {
            h["env"] = json!(hook.env);
        }
        array(hooks, "createContainer", "hooks")?.insert(0, h);
    }
    Ok(())
}

fn allow_rule(major: u32, minor: u32) -> Value {
    json!({"allow": true, "type": "c", "major": major, "minor": minor, "access": "rw"})
}

fn device_number(d: &Value) -> Option<(u32, u32)> {
    let n = |k: &str| {
        d.get(k)
            .and_then(Value::as_u64)
            .and_then(|x| u32::try_from(x).ok())
    };
    Some((n("major")?, n("minor")?))
}

/// gpuhook's own hook: `[PATH, "oci-hook", …]` run by the program `gpuhook` itself.
fn is_our_hook(h: &Value) -> bool {
    let path = h.get("path").and_then(Value::as_str);
    h.pointer("/args/1") == Some(&json!(HOOK_WORD))
        && h.pointer("/args/0").and_then(Value::as_str) == path
        && path.is_some_and(|p| std::path::Path::new(p).file_name() == Some("gpuhook".as_ref()))
}

/// gpuhook's hooks in the config.
fn our_hooks(config: &Value) -> Vec<&Value> {
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

/// What earlier edits added, as their hooks list it (comma-separated `n:MAJ:MIN:PATH`
/// nodes, `r:MAJ:MIN` rules, `m:0:0:PATH` mounts, `e:0:0:NAME` variables, `g:GID:0`
/// groups): what [`strip`] takes out. An entry it cannot read is skipped.
#[derive(Debug, Default, PartialEq, Eq)]
struct Added {
    nodes: Vec<(u32, u32, String)>,
    rules: Vec<(u32, u32)>,
    binds: Vec<String>,
    envs: Vec<String>,
    gids: Vec<u32>,
}

impl Added {
    fn parse(lists: &[String]) -> Added {
        let mut added = Added::default();
        for e in lists.iter().flat_map(|l| l.split(',')) {
            let mut it = e.splitn(4, ':');
            let (kind, a, b) = (it.next(), it.next(), it.next());
            let (Some(a), Some(b)) = (
                a.and_then(|x| x.parse().ok()),
                b.and_then(|x| x.parse().ok()),
            ) else {
                continue;
            };
            match (kind, it.next()) {
                (Some("n"), Some(p)) => added.nodes.push((a, b, p.to_string())),
                (Some("m"), Some(p)) => added.binds.push(p.to_string()),
                (Some("e"), Some(p)) => added.envs.push(p.to_string()),
                (Some("r"), None) => added.rules.push((a, b)),
                (Some("g"), None) => added.gids.push(a),
                _ => {}
            }
        }
        added
    }
}

/// Takes out what earlier edits added, as their hooks list it: those devices and bind mounts
/// (at that path, with that number), one instance of each of those rules (the last: gpuhook
/// appended it), and the hooks themselves. Returns whether there was anything.
pub fn strip(config: &mut Value) -> bool {
    let ours = our_hooks(config);
    if ours.is_empty() {
        return false;
    }
    // Both hooks of an edit carry the same list: one hook's lists are all of them.
    let lists: Vec<String> = ours
        .iter()
        .filter(|h| h.pointer("/args/2") == Some(&json!(POSTSTOP)))
        .filter_map(|h| h.pointer("/args/4").and_then(Value::as_str))
        .map(str::to_owned)
        .collect();
    let Added {
        nodes,
        rules,
        binds,
        envs,
        gids,
    } = Added::parse(&lists);
    let is_node = |v: &Value, key: &str| {
        let p = v.get(key).and_then(Value::as_str);
        nodes.iter().any(|(_, _, a)| Some(a.as_str()) == p)
    };
    if let Some(a) = config.pointer_mut("/mounts").and_then(Value::as_array_mut) {
        a.retain(|m| {
            let dest = m.get("destination").and_then(Value::as_str);
            let ours = is_node(m, "destination") || binds.iter().any(|b| Some(b.as_str()) == dest);
            !(ours && m.get("type") == Some(&json!("bind")))
        });
    }
    if let Some(a) = config
        .pointer_mut("/process/user/additionalGids")
        .and_then(Value::as_array_mut)
    {
        a.retain(|g| {
            !g.as_u64()
                .is_some_and(|g| gids.iter().any(|x| u64::from(*x) == g))
        });
    }
    if let Some(a) = config
        .pointer_mut("/process/env")
        .and_then(Value::as_array_mut)
    {
        for name in &envs {
            let prefix = format!("{name}=");
            if let Some(k) = a
                .iter()
                .rposition(|v| v.as_str().is_some_and(|v| v.starts_with(&prefix)))
            {
                a.remove(k);
            }
        }
    }
    if let Some(a) = config
        .pointer_mut("/linux/devices")
        .and_then(Value::as_array_mut)
    {
        a.retain(|d| {
            !nodes.iter().any(|(ma, mi, p)| {
                d.get("path").and_then(Value::as_str) == Some(p.as_str())
                    && device_number(d) == Some((*ma, *mi))
            })
        });
    }
    if let Some(a) = config
        .pointer_mut("/linux/resources/devices")
        .and_then(Value::as_array_mut)
    {
        for (ma, mi) in &rules {
            let rule = allow_rule(*ma, *mi);
            if let Some(k) = a.iter().rposition(|r| *r == rule) {
                a.remove(k);
            }
        }
    }
    for stage in crate::cdi::STAGES {
        if let Some(a) = config
            .pointer_mut(&format!("/hooks/{stage}"))
            .and_then(Value::as_array_mut)
        {
            a.retain(|h| {
                let passed = h
                    .get("env")
                    .and_then(Value::as_array)
                    .is_some_and(|e| e.contains(&json!(CDI_MARK)));
                !is_our_hook(h) && !passed
            });
        }
    }
    true
}

/// What the runtime passes an OCI hook on stdin (runtime-spec "state").
#[derive(Debug, serde::Deserialize)]
pub struct HookState {
    pub id: String,
    #[serde(default)]
    pub pid: Option<i32>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{DeviceSel, Field};

    /// The token reads back as written; anything else is no token.
    #[test]
    fn hook_token_round_trips() {
        let t = HookToken(crate::host::procfs::ProcRef {
            pid: 42,
            start_time: 7,
        });
        assert_eq!(t.to_string(), "42.7");
        assert_eq!("42.7".parse::<HookToken>(), Ok(t));
        for bad in ["", "42", "42.", ".7", "a.7", "42.7.1", "-1.x"] {
            assert_eq!(bad.parse::<HookToken>(), Err(BadToken), "{bad}");
        }
    }

    /// The list an edit's hooks carry, read back; an entry it cannot read is skipped.
    #[test]
    fn added_list_parses() {
        let lists = vec![
            "n:195:0:/dev/nvidia0,r:195:255,m:0:0:/usr/lib/x:y".to_string(),
            "e:0:0:NVIDIA_X,g:44:0,bogus,n:x:0:/dev/a,r:1:2:3".to_string(),
        ];
        assert_eq!(
            Added::parse(&lists),
            Added {
                nodes: vec![(195, 0, "/dev/nvidia0".into())],
                rules: vec![(195, 255)],
                binds: vec!["/usr/lib/x:y".into()],
                envs: vec!["NVIDIA_X".into()],
                gids: vec![44],
            }
        );
    }

    fn cfg(annotations: Value, env: &[&str]) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sh"], "env": env, "cwd": "/"},
            "root": {"path": "rootfs"},
            "annotations": annotations,
            "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]},
                      "namespaces": [{"type": "pid"}, {"type": "mount"}]}
        }))
        .unwrap()
    }

    /// An NVIDIA node (major 195) for a container, mode 0666, owned by root.
    fn n(path: &str, minor: u32) -> NodeSpec {
        NodeSpec {
            node: crate::node::Node::new(path, 195, minor),
            mode: 0o666,
            uid: 0,
            gid: 0,
        }
    }

    fn req(annotations: Value, env: &[&str]) -> Result<Option<Request>, String> {
        parse(&cfg(annotations, env), Policy::default())
            .map(|b| b.request)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn annotations_are_the_xml_vocabulary() {
        let r = req(
            json!({"gpuhook.io/gpus": "2", "gpuhook.io/arch": "Hopper", "gpuhook.io/vendor": "nvidia",
                   "gpuhook.io/mode": "0660", "gpuhook.io/uid": "1000", "gpuhook.io/capabilities": "compute",
                   "gpuhook.io/driver": "none", "io.podman.annotations.label": "x"}),
            &[],
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.count, 2);
        assert_eq!((r.mode, r.uid, r.gid), (Some(0o660), 1000, 0));
        assert!(!r.capabilities.utility);
        assert!(r.filters.iter().any(|f| f.field == Field::Arch));
        assert!(r.filters.iter().any(|f| f.field == Field::Vendor));
        assert!(!r.mig);
        // MIG instances, as annotation or env.
        let r = req(
            json!({"gpuhook.io/mig": "yes", "gpuhook.io/gpus": "3"}),
            &[],
        )
        .unwrap()
        .unwrap();
        assert!(r.mig && r.count == 3);
        assert_eq!(r.to_string(), "3 MIG instances");
        let r = req(json!({}), &["GPUHOOK_MIG=yes"]).unwrap().unwrap();
        assert!(r.mig && r.count == 1);
        assert!(req(json!({"gpuhook.io/mig": "some"}), &[])
            .unwrap_err()
            .to_string()
            .contains("annotation 'gpuhook.io/mig': mig 'some' is not yes or no"));
        assert!(req(
            json!({"gpuhook.io/mig": "yes", "gpuhook.io/devices": "0000:3b:00.0"}),
            &[]
        )
        .unwrap_err()
        .to_string()
        .contains("either whole GPUs"));
        let r = req(
            json!({"gpuhook.io/devices": "0000:3B:00.0, GPU-ABC-1,3"}),
            &[],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            r.devices,
            vec![
                DeviceSel::Pci("0000:3b:00.0".into()),
                DeviceSel::Uuid("gpu-abc-1".into()),
                DeviceSel::Index(3)
            ]
        );
        assert_eq!(r.count, 3);
    }

    #[test]
    fn env_only_without_annotations() {
        let r = req(
            json!({}),
            &[
                "PATH=/bin",
                "GPUHOOK_GPUS=1",
                "GPUHOOK_GPUS=3",
                "GPUHOOK_ARCH=ampere",
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.count, 3);
        // Annotations win: the env is not read then.
        let r = req(
            json!({"gpuhook.io/gpus": "1"}),
            &["GPUHOOK_GPUS=5", "GPUHOOK_BOGUS=1"],
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.count, 1);
        assert_eq!(
            req(json!({"other": "gpuhook.io/"}), &["A=GPUHOOK_GPUS"]).unwrap(),
            None
        );
    }

    #[test]
    fn bad_requests_are_one_line_errors() {
        for (a, env, needle) in [
            (
                json!({"gpuhook.io/gpu": "1"}),
                vec![],
                "unknown key: annotation 'gpuhook.io/gpu'",
            ),
            (
                json!({"gpuhook.io/gpus": "0"}),
                vec![],
                "annotation 'gpuhook.io/gpus'",
            ),
            (
                json!({"gpuhook.io/gpus": "two"}),
                vec![],
                "annotation 'gpuhook.io/gpus'",
            ),
            (json!({"gpuhook.io/count": "1"}), vec![], "unknown key"),
            (
                json!({"gpuhook.io/vendor": "3dfx"}),
                vec![],
                "unknown vendor '3dfx'",
            ),
            (json!({"gpuhook.io/mode": "4755"}), vec![], "setuid"),
            (json!({"gpuhook.io/gpus": 2}), vec![], "is not a string"),
            (
                json!({"gpuhook.io/devices": "0000:3b:00.0,,1"}),
                vec![],
                "empty entry",
            ),
            (
                json!({"gpuhook.io/devices": "../x"}),
                vec![],
                "neither a PCI address",
            ),
            (
                json!({"gpuhook.io/gpus": "1", "gpuhook.io/devices": "0,1"}),
                vec![],
                "less than",
            ),
            (
                json!({"gpuhook.io/driver": "nvidia"}),
                vec![],
                "unknown driver 'nvidia' (known: none, cdi, host)",
            ),
            (
                json!({}),
                vec!["GPUHOOK_ARCH="],
                "environment variable GPUHOOK_ARCH: empty architecture",
            ),
            (
                json!({}),
                vec!["GPUHOOK_FOO=1"],
                "unknown key: environment variable GPUHOOK_FOO",
            ),
        ] {
            let env: Vec<&str> = env;
            let e = req(a.clone(), &env).expect_err(&format!("{a} {env:?} accepted"));
            assert!(e.contains(needle), "{e:?} lacks {needle:?}");
            assert!(!e.contains('\n'));
        }
        let p = Policy::default();
        assert!(parse(b"{not json", p)
            .unwrap_err()
            .to_string()
            .contains("not valid JSON"));
        assert!(parse(b"[]", p)
            .unwrap_err()
            .to_string()
            .contains("not a JSON object"));
    }

    #[test]
    fn user_namespace_maps_the_owner() {
        let mut c: Value =
            serde_json::from_slice(&cfg(json!({"gpuhook.io/uid": "1000"}), &[])).unwrap();
        c["linux"]["uidMappings"] = json!([{"containerID": 0, "hostID": 100000, "size": 65536}]);
        c["linux"]["gidMappings"] = json!([{"containerID": 0, "hostID": 100000, "size": 65536}]);
        let p = Policy::default();
        let b = parse(&serde_json::to_vec(&c).unwrap(), p).unwrap();
        assert_eq!(b.idmap.host_uid(1000), Some(101000));
        c["annotations"]["gpuhook.io/uid"] = json!("70000");
        let e = parse(&serde_json::to_vec(&c).unwrap(), p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("uid 70000 is not mapped by linux.uidMappings"),
            "{e}"
        );
        c["linux"]["uidMappings"] = json!("x");
        assert!(parse(&serde_json::to_vec(&c).unwrap(), p).is_err());
    }

    #[test]
    fn mps_sharer_gets_pipe_shm_and_env_and_strip_takes_them_out() {
        let mut c: Value =
            serde_json::from_slice(&cfg(json!({"gpuhook.io/share": "yes"}), &["A=1"])).unwrap();
        c["mounts"] = json!([{"destination": "/dev/shm", "type": "tmpfs", "source": "shm"}]);
        let hook = HookCmd {
            path: "/usr/bin/gpuhook".into(),
            env: vec![],
            token: "42.7".into(),
        };
        edit(&mut c, &[n("/dev/nvidia0", 0)], None, &hook, None).unwrap();
        edit_mps(&mut c, std::path::Path::new("/run/gpuhook/mps/GPU-1")).unwrap();
        let m = c["mounts"].as_array().unwrap();
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!(
            m[0],
            json!({"destination": "/tmp/nvidia-mps", "type": "bind",
                   "source": "/run/gpuhook/mps/GPU-1/pipe",
                   "options": ["rbind", "ro", "nosuid", "nodev"]})
        );
        assert_eq!(m[1]["destination"], "/dev/shm");
        assert_eq!(m[1]["source"], "/run/gpuhook/mps/GPU-1/shm");
        assert_eq!(m[1]["options"], json!(["rbind", "rw", "nosuid", "nodev"]));
        assert_eq!(
            c["process"]["env"],
            json!(["A=1", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"])
        );
        let args = c["hooks"]["poststop"][0]["args"].as_array().unwrap();
        assert!(args
            .last()
            .unwrap()
            .as_str()
            .unwrap()
            .ends_with("m:0:0:/tmp/nvidia-mps,m:0:0:/dev/shm,e:0:0:CUDA_MPS_PIPE_DIRECTORY"));
        assert!(strip(&mut c));
        assert_eq!(c["mounts"], json!([]));
        assert_eq!(c["process"]["env"], json!(["A=1"]));
    }

    #[test]
    fn edit_adds_nodes_rules_and_hooks_and_keeps_the_rest() {
        let mut c: Value =
            serde_json::from_slice(&cfg(json!({"gpuhook.io/gpus": "1"}), &[])).unwrap();
        let hook = HookCmd {
            path: "/usr/bin/gpuhook".into(),
            env: vec!["GPUHOOK_CONFIG=/etc/x.json".into()],
            token: "42.7".into(),
        };
        // A device of the user's at a node's path with another number is refused: it would
        // shadow the reserved GPU.
        c["linux"]["devices"] =
            json!([{"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 3}]);
        let e = edit(&mut c, &[n("/dev/nvidia0", 0)], None, &hook, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("already has a device at /dev/nvidia0 (1:3)"),
            "{e}"
        );
        c["linux"]["devices"] =
            json!([{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}]);
        let before = c.clone();
        edit(
            &mut c,
            &[n("/dev/nvidia0", 0), n("/dev/nvidiactl", 255)],
            None,
            &hook,
            None,
        )
        .unwrap();
        let devs = c["linux"]["devices"].as_array().unwrap();
        assert_eq!(devs.len(), 3, "{devs:?}");
        let listed = "n:195:0:/dev/nvidia0,n:195:255:/dev/nvidiactl,r:195:0,r:195:255";
        assert!(
            devs.contains(&json!({"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}))
        );
        assert!(devs.contains(
            &json!({"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0,
                                      "fileMode": 438, "uid": 0, "gid": 0})
        ));
        let rules = c["linux"]["resources"]["devices"].as_array().unwrap();
        assert_eq!(rules[0], json!({"allow": false, "access": "rwm"}));
        assert_eq!(
            rules[2],
            json!({"allow": true, "type": "c", "major": 195, "minor": 255, "access": "rw"})
        );
        assert_eq!(
            c["hooks"]["createRuntime"][0]["args"],
            json!([
                "/usr/bin/gpuhook",
                "oci-hook",
                "create-runtime",
                "42.7",
                listed
            ])
        );
        assert_eq!(
            c["hooks"]["poststop"][0]["env"],
            json!(["GPUHOOK_CONFIG=/etc/x.json"])
        );
        assert_eq!(c["hooks"]["poststop"][0]["args"][4], json!(listed));
        for k in ["process", "root", "annotations", "ociVersion"] {
            assert_eq!(c[k], before[k]);
        }
        assert_eq!(c["linux"]["namespaces"], before["linux"]["namespaces"]);
        let mut bad = json!({"linux": []});
        assert!(edit(&mut bad, &[], None, &hook, None).is_err());
        // A user-namespaced container: bind mounts of gpuhook's nodes instead of devices.
        let mut c: Value = serde_json::from_slice(&cfg(json!({}), &[])).unwrap();
        c["linux"]["namespaces"] = json!([{"type": "user"}, {"type": "mount"}]);
        c["mounts"] = json!([{"destination": "/proc", "type": "proc", "source": "proc"},
                             {"destination": "/dev/nvidia0", "type": "bind", "source": "/x"}]);
        assert!(has_user_namespace(&c));
        let srcs = vec!["/run/gpuhook/nodes/c1/0-nvidia0".to_string()];
        let e = edit(&mut c, &[n("/dev/nvidia0", 0)], Some(&srcs), &hook, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("already mounts something at /dev/nvidia0"),
            "{e}"
        );
        c["mounts"] = json!([{"destination": "/proc", "type": "proc", "source": "proc"}]);
        edit(&mut c, &[n("/dev/nvidia0", 0)], Some(&srcs), &hook, None).unwrap();
        assert_eq!(
            c["mounts"],
            json!([{"destination": "/proc", "type": "proc", "source": "proc"},
                   {"destination": "/dev/nvidia0", "type": "bind", "source": srcs[0],
                    "options": ["bind", "nosuid", "noexec"]}])
        );
        assert_eq!(c["linux"]["devices"], json!([]));
        assert_eq!(c["linux"]["resources"]["devices"][1]["minor"], json!(0));
    }

    /// A bundle edited before (`runc run` of the same directory again) is cleaned of every
    /// earlier addition before the new ones: no access to the GPU of the last run.
    #[test]
    fn a_second_edit_replaces_the_first() {
        let mut c: Value =
            serde_json::from_slice(&cfg(json!({"gpuhook.io/gpus": "1"}), &[])).unwrap();
        c["linux"]["resources"]["devices"]
            .as_array_mut()
            .unwrap()
            .push(json!({"allow": true, "type": "c", "major": 10, "minor": 200, "access": "rw"}));
        // The user's own rule and device for the control node: theirs, kept through strips.
        c["linux"]["resources"]["devices"]
            .as_array_mut()
            .unwrap()
            .push(json!({"allow": true, "type": "c", "major": 195, "minor": 255, "access": "rw"}));
        c["linux"]["devices"] =
            json!([{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}]);
        let before = c.clone();
        let hook = |t: &str| HookCmd {
            path: "/usr/bin/gpuhook".into(),
            env: vec![],
            token: t.into(),
        };
        edit(
            &mut c,
            &[n("/dev/nvidia0", 0), n("/dev/nvidiactl", 255)],
            None,
            &hook("1.1"),
            None,
        )
        .unwrap();
        // The control node's device and rule were the user's already: not listed as ours.
        assert_eq!(
            c["hooks"]["poststop"][0]["args"][4],
            json!("n:195:0:/dev/nvidia0,r:195:0")
        );
        edit(
            &mut c,
            &[n("/dev/nvidia1", 1), n("/dev/nvidiactl", 255)],
            None,
            &hook("2.2"),
            None,
        )
        .unwrap();
        let text = c.to_string();
        assert!(!text.contains("\"minor\":0,"), "GPU 0 left: {text}");
        assert_eq!(c["hooks"]["createRuntime"].as_array().unwrap().len(), 1);
        assert_eq!(c["hooks"]["poststop"][0]["args"][3], json!("2.2"));
        assert_eq!(c["linux"]["devices"].as_array().unwrap().len(), 2);
        assert_eq!(
            c["linux"]["resources"]["devices"].as_array().unwrap().len(),
            4
        );
        // Stripped, the config is what it was (a bundle whose request was taken away).
        assert!(strip(&mut c));
        assert_eq!(c["hooks"], json!({"createRuntime": [], "poststop": []}));
        c.as_object_mut().unwrap().remove("hooks");
        assert_eq!(c, before, "the user's own device and rules are kept");
        assert!(!strip(&mut c));
    }

    #[test]
    fn sandboxes_host_pid_namespaces_and_env_policy() {
        let mut c: Value =
            serde_json::from_slice(&cfg(json!({"gpuhook.io/gpus": "1"}), &[])).unwrap();
        let p = Policy::default();
        let bytes = |c: &Value| serde_json::to_vec(c).unwrap();
        // A pod's sandbox gets no GPU, whatever the pod's annotations say.
        let mut sb = c.clone();
        sb["annotations"]["io.kubernetes.cri.container-type"] = json!("sandbox");
        assert!(parse(&bytes(&sb), p).unwrap().request.is_none());
        sb["annotations"]["io.kubernetes.cri.container-type"] = json!("container");
        assert!(parse(&bytes(&sb), p).unwrap().request.is_some());
        // The host's PID namespace, or a joined one: refused.
        c["linux"]["namespaces"] = json!([{"type": "mount"}]);
        assert!(parse(&bytes(&c), p)
            .unwrap_err()
            .to_string()
            .contains("PID namespace of its own"));
        c["linux"]["namespaces"] = json!([{"type": "pid", "path": "/proc/1/ns/pid"}]);
        assert!(parse(&bytes(&c), p).is_err());
        // A pod's app container: the pod's shared PID namespace (shareProcessNamespace) or
        // the host's (hostPID), said so, in containerd's and CRI-O's words.
        for key in [
            "io.kubernetes.cri.container-type",
            "io.kubernetes.cri-o.ContainerType",
        ] {
            let mut app = c.clone();
            app["annotations"][key] = json!("container");
            assert_eq!(
                parse(&bytes(&app), p).unwrap_err().to_string(),
                "the pod shares one PID namespace among its containers (shareProcessNamespace: true): its containers have no PID namespace of their own, which a GPU container needs (gpuhook frees its GPUs when its init exits)"
            );
            app["linux"]["namespaces"] = json!([{"type": "mount"}]);
            assert!(parse(&bytes(&app), p)
                .unwrap_err()
                .to_string()
                .starts_with("the pod runs in the host's PID namespace (hostPID: true): "));
        }
        // Env requests off: the env is not a request; gpuhook's own variables never are.
        let env = cfg(json!({}), &["GPUHOOK_GPUS=1"]);
        let off = Policy {
            env_requests: false,
        };
        assert!(parse(&env, off).unwrap().request.is_none());
        assert!(parse(&env, p).unwrap().request.is_some());
        let own = cfg(json!({}), &["GPUHOOK_CONFIG=/x", "GPUHOOK_VERBOSE=1"]);
        assert!(parse(&own, p).unwrap().request.is_none());
    }

    #[test]
    fn container_ids() {
        for ok in ["abc", "0123456789abcdef", "my_ctr-1.2+x"] {
            assert!(valid_id(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "a b", "x\n", &"a".repeat(1025)] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }
}
