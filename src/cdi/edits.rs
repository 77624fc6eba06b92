//! Building a [`Plan`], edit by edit: nodes, bind mounts, hooks, environment.

use super::error::{EditError, PlanError};
use super::hooks::{native, Native};
use super::model::{
    generator, BindMount, Edits, ExtraNode, PassedHook, Plan, SpecHook, SpecMount, MPS_TARGETS,
    STAGES,
};
use super::plan::container_path;
use super::plan::{SpecHost, Units};
use crate::host::config::ForeignHooks;
use crate::ids::Vendor;
use crate::node::Node;
use std::path::Path;

/// Building a plan, edit by edit.
impl Plan {
    pub(super) fn add(
        &mut self,
        e: &Edits,
        nodes: Vec<(Node, u32)>,
        units: &Units,
        host: &SpecHost,
    ) -> Result<(), EditError> {
        if e.intel_rdt.is_some() {
            return Err(EditError::IntelRdt);
        }
        if e.net_devices.as_ref().is_some_and(|n| !n.is_empty()) {
            return Err(EditError::NetDevices);
        }
        for (n, mode) in nodes {
            let num = (n.major, n.minor);
            if units.granted.contains(&num) || self.nodes.iter().any(|x| x.node == n) {
                continue;
            }
            if let Some(o) = self.nodes.iter().find(|x| x.node.path == n.path) {
                return Err(EditError::NodeConflict {
                    path: n.path.clone(),
                    here: (n.major, n.minor),
                    there: (o.node.major, o.node.minor),
                });
            }
            self.nodes.push(ExtraNode { node: n, mode });
        }
        for m in e.mounts.as_deref().unwrap_or_default() {
            let bm = bind_mount(m, host)?;
            match self.mounts.iter().find(|x| x.target == bm.target) {
                Some(x) if *x == bm => {}
                Some(x) => {
                    return Err(EditError::MountConflict {
                        target: bm.target.clone(),
                        from: bm.source.clone(),
                        other: x.source.clone(),
                    })
                }
                None => self.mounts.push(bm),
            }
        }
        for h in e.hooks.as_deref().unwrap_or_default() {
            self.hook(h, host.foreign_hooks)?;
        }
        for v in e.env.as_deref().unwrap_or_default() {
            let Some((k, _)) = v.split_once('=') else {
                return Err(EditError::Env(v.clone()));
            };
            if k.is_empty() {
                return Err(EditError::Env(v.clone()));
            }
            // The later value of a name wins, as in the reference.
            self.env
                .retain(|x| x.split_once('=').map(|(a, _)| a) != Some(k));
            self.env.push(v.clone());
        }
        for g in e.additional_gids.as_deref().unwrap_or_default() {
            if !self.additional_gids.contains(g) {
                self.additional_gids.push(*g);
            }
        }
        Ok(())
    }

    pub(super) fn hook(&mut self, h: &SpecHook, foreign: ForeignHooks) -> Result<(), EditError> {
        if !STAGES.contains(&h.hook_name.as_str()) {
            return Err(EditError::HookStage(h.hook_name.clone()));
        }
        if !Path::new(&h.path).is_absolute() {
            return Err(EditError::HookPath(h.path.clone()));
        }
        let args = h.args.clone().unwrap_or_default();
        match native(&h.path, &args)? {
            Some(Native::Links(l)) => {
                for x in l {
                    if !self.links.contains(&x) {
                        self.links.push(x);
                    }
                }
            }
            Some(Native::Ldcache(f)) => {
                for x in f {
                    if !self.ld_folders.contains(&x) {
                        self.ld_folders.push(x);
                    }
                }
            }
            None if foreign == ForeignHooks::Refuse => {
                return Err(EditError::ForeignHook {
                    stage: h.hook_name.clone(),
                    path: h.path.clone(),
                    arg: args.get(1).map(|a| format!(" {a}")).unwrap_or_default(),
                });
            }
            None => {
                let p = PassedHook {
                    stage: h.hook_name.clone(),
                    path: h.path.clone(),
                    args,
                    env: h.env.clone().unwrap_or_default(),
                    timeout: h.timeout,
                };
                if !self.hooks.contains(&p) {
                    self.hooks.push(p);
                }
            }
        }
        Ok(())
    }

    pub(super) fn finish(mut self) -> Result<Plan, PlanError> {
        self.soname_links();
        self.check()?;
        Ok(self)
    }

    /// A symlink, a mount and a node at one place would fight over it: refused.
    pub(super) fn check(&self) -> Result<(), PlanError> {
        for l in &self.links {
            if self.mounts.iter().any(|m| m.target == l.link) {
                return Err(PlanError::MountAndLink(l.link.clone()));
            }
        }
        Ok(())
    }
}

/// The mount options gpuhook understands; anything else is refused.
const MOUNT_OPTIONS: [&str; 14] = [
    "ro",
    "rw",
    "nosuid",
    "nodev",
    "noexec",
    "bind",
    "rbind",
    "private",
    "rprivate",
    "slave",
    "rslave",
    "relatime",
    "norelatime",
    "noatime",
];

pub(super) fn bind_mount(m: &SpecMount, host: &SpecHost) -> Result<BindMount, EditError> {
    let opts = m.options.clone().unwrap_or_default();
    let is_bind = opts.iter().any(|o| o == "bind" || o == "rbind");
    match m.kind.as_deref().unwrap_or("") {
        "bind" => {}
        "" if is_bind => {}
        other => {
            return Err(EditError::MountType {
                target: m.container_path.clone(),
                kind: if other.is_empty() { "none" } else { other }.to_string(),
            })
        }
    }
    for o in &opts {
        if !MOUNT_OPTIONS.contains(&o.as_str()) {
            return Err(EditError::MountOption {
                target: m.container_path.clone(),
                option: o.clone(),
            });
        }
    }
    container_path(&m.container_path, "mount containerPath")?;
    let target = m.container_path.trim_end_matches('/');
    if MPS_TARGETS.contains(&target) {
        return Err(EditError::MpsTarget(target.into()));
    }
    if !Path::new(&m.host_path).is_absolute() {
        return Err(EditError::MountHostRelative(m.host_path.clone()));
    }
    let md = std::fs::metadata(&m.host_path).map_err(|source| {
        stale_driver(&m.host_path, host).unwrap_or(EditError::MountSource {
            path: m.host_path.clone(),
            source,
        })
    })?;
    if let Some(n) = stale_driver(&m.host_path, host) {
        return Err(n);
    }
    let rw = opts.iter().any(|o| o == "rw") && !opts.iter().any(|o| o == "ro");
    Ok(BindMount {
        source: m.host_path.clone(),
        target: m.container_path.trim_end_matches('/').to_string(),
        rw,
        recursive: opts.iter().any(|o| o == "rbind"),
        noexec: opts.iter().any(|o| o == "noexec"),
        dir: md.is_dir(),
    })
}

/// When a mounted library names an NVIDIA driver version other than the running kernel
/// module's, the spec was written for another driver: the message that says so.
fn stale_driver(host_path: &str, host: &SpecHost) -> Option<EditError> {
    let running = host.nvidia_version.as_deref()?;
    let file = Path::new(host_path).file_name()?.to_str()?;
    let ver = ["libcuda.so.", "libnvidia-ml.so."]
        .iter()
        .find_map(|p| file.strip_prefix(p))?;
    if ver.split('.').count() < 2 || ver == running {
        return None;
    }
    Some(EditError::StaleDriver {
        path: host_path.to_string(),
        ver: ver.to_string(),
        running: running.to_string(),
        generator: generator(Vendor::Nvidia),
    })
}
