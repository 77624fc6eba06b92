//! The edits that hand the reserved GPUs to the real runtime: `linux.devices` (or bind mounts
//! of nodes gpuhook made), exact allow rules, a CDI plan's mounts, environment, groups and
//! hooks, an MPS sharer's mounts, and gpuhook's own hooks listing what was added.

use super::error::BundleError;
use super::hooks::{
    is_our_hook, CdiWork, HookCmd, CDI, CDI_MARK, CREATE_RUNTIME, HOOK_WORD, POSTSTOP,
};
use super::json::{allow_rule, array, device_number, not_object, object};
use super::strip::strip;
use crate::node::NodeSpec;
use serde_json::{json, Map, Value};

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
