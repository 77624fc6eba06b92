//! Building a [`Plan`], edit by edit: nodes, bind mounts, hooks, environment.

use super::hooks::{native, Native};
use super::plan::container_path;
use super::{
    generator, BindMount, Edits, ExtraNode, Host, PassedHook, Plan, SpecHook, SpecMount, Units,
    STAGES,
};
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
        host: &Host,
    ) -> Result<(), String> {
        if e.intel_rdt.is_some() {
            return Err("intelRdt edits are not supported by gpuhook".into());
        }
        if e.net_devices.as_ref().is_some_and(|n| !n.is_empty()) {
            return Err("netDevices edits are not supported by gpuhook".into());
        }
        for (n, mode) in nodes {
            let num = (n.major, n.minor);
            if units.granted.contains(&num) || self.nodes.iter().any(|x| x.node == n) {
                continue;
            }
            if let Some(o) = self.nodes.iter().find(|x| x.node.path == n.path) {
                return Err(format!(
                    "deviceNode {} is {}:{} here and {}:{} elsewhere",
                    n.path, n.major, n.minor, o.node.major, o.node.minor
                ));
            }
            self.nodes.push(ExtraNode { node: n, mode });
        }
        for m in e.mounts.as_deref().unwrap_or_default() {
            let bm = bind_mount(m, host)?;
            match self.mounts.iter().find(|x| x.target == bm.target) {
                Some(x) if *x == bm => {}
                Some(x) => {
                    return Err(format!(
                        "mount at {} is {} here and {} elsewhere",
                        bm.target, bm.source, x.source
                    ))
                }
                None => self.mounts.push(bm),
            }
        }
        for h in e.hooks.as_deref().unwrap_or_default() {
            self.hook(h, host.foreign_hooks)?;
        }
        for v in e.env.as_deref().unwrap_or_default() {
            let Some((k, _)) = v.split_once('=') else {
                return Err(format!("env '{v}' is not NAME=VALUE"));
            };
            if k.is_empty() {
                return Err(format!("env '{v}' is not NAME=VALUE"));
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

    pub(super) fn hook(&mut self, h: &SpecHook, foreign: ForeignHooks) -> Result<(), String> {
        if !STAGES.contains(&h.hook_name.as_str()) {
            return Err(format!("hook stage '{}' is not an OCI hook", h.hook_name));
        }
        if !Path::new(&h.path).is_absolute() {
            return Err(format!("hook path '{}' is not absolute", h.path));
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
                return Err(format!(
                    "{} hook {}{} is not one gpuhook does itself, and the host config refuses such hooks (\"cdi_foreign_hooks\": \"refuse\")",
                    h.hook_name,
                    h.path,
                    args.get(1).map(|a| format!(" {a}")).unwrap_or_default()
                ));
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

    pub(super) fn finish(mut self) -> Result<Plan, String> {
        self.soname_links();
        // A symlink, a mount and a node at one place would fight over it.
        for l in &self.links {
            if self.mounts.iter().any(|m| m.target == l.link) {
                return Err(format!(
                    "CDI specs both mount at and link {}; refusing",
                    l.link
                ));
            }
        }
        Ok(self)
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

pub(super) fn bind_mount(m: &SpecMount, host: &Host) -> Result<BindMount, String> {
    let opts = m.options.clone().unwrap_or_default();
    let is_bind = opts.iter().any(|o| o == "bind" || o == "rbind");
    match m.kind.as_deref().unwrap_or("") {
        "bind" => {}
        "" if is_bind => {}
        other => {
            return Err(format!(
                "mount at {} is of type '{}': only bind mounts are given",
                m.container_path,
                if other.is_empty() { "none" } else { other }
            ))
        }
    }
    for o in &opts {
        if !MOUNT_OPTIONS.contains(&o.as_str()) {
            return Err(format!(
                "mount at {}: option '{o}' is not one gpuhook applies",
                m.container_path
            ));
        }
    }
    container_path(&m.container_path, "mount containerPath")?;
    if !Path::new(&m.host_path).is_absolute() {
        return Err(format!("mount hostPath '{}' is not absolute", m.host_path));
    }
    let md = std::fs::metadata(&m.host_path).map_err(|e| {
        let mut msg = format!("mount source {}: {e}", m.host_path);
        if let Some(n) = stale_driver(&m.host_path, host) {
            msg = n;
        }
        msg
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
fn stale_driver(host_path: &str, host: &Host) -> Option<String> {
    let running = host.nvidia_version.as_deref()?;
    let file = Path::new(host_path).file_name()?.to_str()?;
    let ver = ["libcuda.so.", "libnvidia-ml.so."]
        .iter()
        .find_map(|p| file.strip_prefix(p))?;
    if ver.split('.').count() < 2 || ver == running {
        return None;
    }
    Some(format!(
        "mount source {host_path} is of NVIDIA driver {ver}, the host runs {running}: the spec is for another driver; regenerate it with `{}`",
        generator(Vendor::Nvidia)
    ))
}
