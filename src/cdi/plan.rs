//! Choosing the edits that belong to the chosen units, and checking their device nodes.

use super::error::{EditError, PathError, PlanError};
use super::model::{generator, kind_of, Device, Edits, Loaded, Plan};
use super::spec::dirs_list;
use crate::host::config::ForeignHooks;
use crate::ids::Vendor;
use crate::node::Node;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The chosen units, as device numbers (`(major, minor)`).
#[derive(Debug, Clone, Default)]
pub struct Units {
    /// The vendors of the chosen GPUs.
    pub vendors: Vec<Vendor>,
    /// Each chosen unit.
    pub own: Vec<ChosenUnit>,
    /// What gpuhook grants the container anyway (its units' nodes and control nodes).
    pub granted: BTreeSet<(u32, u32)>,
    /// Every other GPU's (or MIG instance's) own nodes: never granted through a spec.
    pub foreign: BTreeSet<(u32, u32)>,
}

/// A chosen unit (PCI address or MIG instance) with its vendor and its own nodes: a whole
/// GPU's nodes, a MIG instance's two access capabilities.
#[derive(Debug, Clone)]
pub struct ChosenUnit {
    pub id: String,
    pub vendor: Vendor,
    pub nodes: Vec<(u32, u32)>,
}

/// The host, as far as checking a spec goes.
#[derive(Debug, Clone)]
pub struct SpecHost<'a> {
    /// Whether hooks gpuhook does not do itself are passed on or refused.
    pub foreign_hooks: ForeignHooks,
    /// Where the host's `/dev` is (the config's `dev` root).
    pub dev: &'a Path,
    /// The NVIDIA kernel module's version (`/proc/driver/nvidia/version`), if loaded.
    pub nvidia_version: Option<String>,
    /// The spec directories, for messages.
    pub dirs: &'a [PathBuf],
}

/// The NVIDIA kernel module's version from the text of `/proc/driver/nvidia/version`
/// (`NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar …`).
pub fn nvidia_version(text: &str) -> Option<String> {
    crate::host::driver::parse_version(text)
}

/// The edits of `specs` that belong to `units`. Errors are one line naming the spec file.
pub fn plan(specs: &[Loaded], units: &Units, host: &SpecHost) -> Result<Plan, PlanError> {
    let mut b = Plan::default();
    let mut vendors = units.vendors.clone();
    vendors.sort();
    vendors.dedup();
    for v in vendors {
        plan_vendor(&mut b, specs, units, host, v)?;
    }
    if units.vendors.contains(&Vendor::Nvidia) {
        b.nvidia_version = b
            .mounts
            .iter()
            .find_map(|m| {
                let f = m.source.rsplit('/').next()?;
                ["libcuda.so.", "libnvidia-ml.so."]
                    .iter()
                    .find_map(|p| f.strip_prefix(p))
                    .filter(|v| crate::host::driver::version_shaped(v))
                    .map(str::to_owned)
            })
            .or_else(|| host.nvidia_version.clone());
    }
    b.finish()
}

/// The edits of one vendor's specs: its devices that hold its chosen units' nodes, then the
/// common edits of the specs those devices are in.
fn plan_vendor(
    b: &mut Plan,
    specs: &[Loaded],
    units: &Units,
    host: &SpecHost,
    v: Vendor,
) -> Result<(), PlanError> {
    let kind = kind_of(v);
    let of_kind: Vec<&Loaded> = specs.iter().filter(|l| l.spec.kind == kind).collect();
    if of_kind.is_empty() {
        return Err(PlanError::NoSpec {
            kind,
            dirs: dirs_list(host.dirs),
            generator: generator(v),
        });
    }
    let by_name = devices_by_name(&of_kind, kind)?;
    let mut used_specs: Vec<&Loaded> = Vec::new();
    let mut covered: BTreeSet<&str> = BTreeSet::new();
    for (name, (l, d)) in &by_name {
        if *name == "all" {
            continue;
        }
        let edits = d.container_edits.clone().unwrap_or_default();
        let what = |source| PlanError::Device {
            spec: l.path.clone(),
            name: name.to_string(),
            source: Box::new(source),
        };
        let nodes = resolve_nodes(&edits, host).map_err(what)?;
        let nums: Vec<(u32, u32)> = nodes.iter().map(|(n, _)| (n.major, n.minor)).collect();
        let mine: Vec<&str> = units
            .own
            .iter()
            .filter(|u| u.vendor == v && u.nodes.iter().any(|o| nums.contains(o)))
            .map(|u| u.id.as_str())
            .collect();
        if mine.is_empty() || nums.iter().any(|n| units.foreign.contains(n)) {
            continue;
        }
        covered.extend(mine);
        b.devices.push(format!("{kind}={name}"));
        b.add(&edits, nodes, units, host).map_err(what)?;
        if !used_specs.iter().any(|u| std::ptr::eq(*u, *l)) {
            used_specs.push(l);
        }
    }
    all_covered(units, v, &covered, &of_kind)?;
    for l in used_specs {
        add_common_edits(b, l, units, host)?;
    }
    Ok(())
}

/// One vendor's devices by name: a later directory's replaces an earlier one's; two files
/// of one directory defining a name conflict.
fn devices_by_name<'a>(
    of_kind: &[&'a Loaded],
    kind: &'static str,
) -> Result<BTreeMap<&'a str, (&'a Loaded, &'a Device)>, PlanError> {
    let mut by_name: BTreeMap<&str, (&Loaded, &Device)> = BTreeMap::new();
    for l in of_kind {
        for d in l.spec.devices.as_deref().unwrap_or_default() {
            match by_name.get(d.name.as_str()) {
                Some((o, _)) if o.dir == l.dir => {
                    return Err(PlanError::DefinedTwice {
                        kind,
                        name: d.name.clone(),
                        first: o.path.clone(),
                        second: l.path.clone(),
                    })
                }
                _ => {
                    by_name.insert(d.name.as_str(), (l, d));
                }
            }
        }
    }
    Ok(by_name)
}

/// Every chosen unit of vendor `v` has a device of its own in the specs.
fn all_covered(
    units: &Units,
    v: Vendor,
    covered: &BTreeSet<&str>,
    of_kind: &[&Loaded],
) -> Result<(), PlanError> {
    let kind = kind_of(v);
    for ChosenUnit {
        id: unit,
        nodes: own,
        ..
    } in units.own.iter().filter(|u| u.vendor == v)
    {
        if !covered.contains(unit.as_str()) {
            return Err(PlanError::Uncovered {
                kind,
                specs: of_kind
                    .iter()
                    .map(|l| l.path.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                unit: unit.clone(),
                nodes: own
                    .iter()
                    .map(|(a, b)| format!("{a}:{b}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                generator: generator(v),
            });
        }
    }
    Ok(())
}

/// A used spec's common edits: none of its nodes may be another GPU's.
fn add_common_edits(
    b: &mut Plan,
    l: &Loaded,
    units: &Units,
    host: &SpecHost,
) -> Result<(), PlanError> {
    let edits = l.spec.container_edits.clone().unwrap_or_default();
    let what = |source| PlanError::Common {
        spec: l.path.clone(),
        source: Box::new(source),
    };
    let nodes = resolve_nodes(&edits, host).map_err(what)?;
    for (n, _) in &nodes {
        if units.foreign.contains(&(n.major, n.minor)) {
            return Err(what(EditError::ForeignNode {
                path: n.path.clone(),
                major: n.major,
                minor: n.minor,
            }));
        }
    }
    b.add(&edits, nodes, units, host).map_err(what)?;
    b.specs.push(l.path.display().to_string());
    Ok(())
}

/// A device node of a spec: where it is in the container, its number (the host node's),
/// and the spec's mode for it.
pub(super) fn resolve_nodes(e: &Edits, host: &SpecHost) -> Result<Vec<(Node, u32)>, EditError> {
    let mut out = Vec::new();
    for n in e.device_nodes.as_deref().unwrap_or_default() {
        let rel = container_path(&n.path, "deviceNode path")?;
        if !rel.starts_with("dev/") {
            return Err(EditError::NodeNotUnderDev(n.path.clone()));
        }
        if let Some(t) = n.kind.as_deref().filter(|t| !t.is_empty()) {
            if t != "c" && t != "u" {
                return Err(EditError::NodeType {
                    path: n.path.clone(),
                    kind: t.to_string(),
                });
            }
        }
        let hp = n.host_path.as_deref().unwrap_or(&n.path);
        let host_path = host_node_path(hp, host.dev)?;
        let md = std::fs::metadata(&host_path).map_err(|source| EditError::HostNode {
            path: n.path.clone(),
            host: host_path.clone(),
            source,
        })?;
        if !md.file_type().is_char_device() {
            return Err(EditError::HostNodeNotChar {
                path: n.path.clone(),
                host: host_path,
                what: if md.file_type().is_block_device() {
                    "a block device"
                } else {
                    "no device"
                },
            });
        }
        let rdev = md.rdev();
        let (major, minor) = (libc::major(rdev), libc::minor(rdev));
        let said = (n.major.unwrap_or(0), n.minor.unwrap_or(0));
        if said != (0, 0) && said != (i64::from(major), i64::from(minor)) {
            return Err(EditError::NumberMismatch {
                path: n.path.clone(),
                said,
                host: host_path,
                major,
                minor,
            });
        }
        if let Some(p) = n.permissions.as_deref().filter(|p| !p.is_empty()) {
            if !p.chars().all(|c| "rwm".contains(c)) {
                return Err(EditError::Permissions {
                    path: n.path.clone(),
                    perms: p.to_string(),
                });
            }
        }
        let mode = n.file_mode.map_or(md.mode() & 0o777, |m| m & 0o777);
        out.push((Node::new(format!("/{rel}"), major, minor), mode));
    }
    Ok(out)
}

/// Where a spec's host node is on this host: a `/dev/…` path under the config's `dev` root
/// (a path already under that root is taken as it is).
pub(super) fn host_node_path(p: &str, dev: &Path) -> Result<PathBuf, EditError> {
    let path = Path::new(p);
    if !path.is_absolute() {
        return Err(EditError::HostPathRelative(p.to_string()));
    }
    if path.starts_with(dev) || dev == Path::new("/dev") {
        return Ok(path.to_path_buf());
    }
    match path.strip_prefix("/dev") {
        Ok(rest) => Ok(dev.join(rest)),
        Err(_) => Ok(path.to_path_buf()),
    }
}

/// A container path: absolute, no `.`/`..`/empty components, no comma (gpuhook lists
/// paths in its OCI hook arguments); returned without the leading `/`.
pub fn container_path<'a>(p: &'a str, what: &'static str) -> Result<&'a str, PathError> {
    let rel = p.strip_prefix('/').ok_or_else(|| PathError::NotAbsolute {
        what,
        path: p.to_string(),
    })?;
    let rel = rel.trim_end_matches('/');
    if rel.is_empty()
        || rel
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
        || p.contains(',')
        || p.chars().any(char::is_control)
        || p.len() > 4096
    {
        return Err(PathError::NotPlain {
            what,
            path: p.to_string(),
        });
    }
    Ok(rel)
}
