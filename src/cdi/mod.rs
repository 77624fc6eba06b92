//! The host driver's user space from the vendors' CDI specs (Container Device Interface,
//! `cdiVersion` ≤ 1.1.0, JSON or YAML), as `nvidia-ctk cdi generate`, `amd-ctk cdi generate`
//! and Intel's generator write them to `/etc/cdi` and `/var/run/cdi`.
//!
//! Pure but for reading the spec files and `stat`ing the host paths they name: [`load`] reads
//! and checks the specs (unknown fields refused as the reference loader does; a device of a
//! later directory replaces one of the same name in an earlier one), [`plan`] picks the edits
//! that belong to the GPUs a container was given — a CDI device is applied when its device
//! nodes contain one of the chosen units' own nodes and none of another GPU's; `all` never —
//! and turns them into a [`Plan`] both front doors apply: extra character nodes (granted and
//! made like gpuhook's own), read-only `nosuid,nodev` bind mounts, the two NVIDIA hooks
//! `create-symlinks` and `update-ldcache` done by gpuhook itself (`enter::rootfs`), other
//! hooks (passed to the OCI runtime, or listed in the log for libvirt) and environment.

use crate::host::config::ForeignHooks;
use crate::ids::Vendor;
use crate::node::Node;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, Mode};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The CDI versions gpuhook reads (`specs-go/versions.go`).
const VERSIONS: [&str; 8] = [
    "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
];

/// The newest of them.
pub const MAX_VERSION: &str = "1.1.0";

/// A spec file larger than this is refused (a full NVIDIA spec is ~20 KB).
const MAX_SPEC: u64 = 4 << 20;

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

fn dirs_list(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

// ---- loading ----

/// Reads the specs of `kinds` in `dirs` (`*.json`, `*.yaml`, `*.yml`; a directory that does
/// not exist has none). A file that cannot be read or parsed is an error when it is (or may
/// be, for all its text says) of one of `kinds`; one of another kind is not looked at further.
/// Only root may have written what root acts on: a directory, or a parent of it, that is not
/// root's or that group or others may write is refused ([`open_dir`]); each file is opened
/// once, without following a link or waiting on a FIFO, and read from that descriptor.
pub fn load(dirs: &[PathBuf], kinds: &[&str]) -> Result<Vec<Loaded>, String> {
    let mut out = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let Some(fd) = open_dir(dir)? else { continue };
        let listed = fd
            .try_clone()
            .and_then(|d| nix::dir::Dir::from_fd(d).map_err(io_err))
            .map_err(|e| format!("CDI spec directory {}: {e}", dir.display()))?;
        let mut files: Vec<PathBuf> = listed
            .into_iter()
            .filter_map(|e| e.ok())
            .map(|e| PathBuf::from(std::ffi::OsStr::from_bytes(e.file_name().to_bytes())))
            .filter(|p| {
                matches!(
                    p.extension().and_then(|x| x.to_str()),
                    Some("json" | "yaml" | "yml")
                )
            })
            .collect();
        files.sort();
        for f in files {
            let path = dir.join(&f);
            if let Some(spec) = read_spec(&fd, &f, &path, kinds)? {
                out.push(Loaded { path, dir: i, spec });
            }
        }
    }
    Ok(out)
}

/// A `nix` error as `std` says it (`Not a directory (os error 20)`), as messages did.
fn io_err(e: nix::Error) -> std::io::Error {
    std::io::Error::from_raw_os_error(e as i32)
}

/// A spec directory, opened from `/` one component at a time without following a link, each
/// checked on its descriptor: root's, not writable by group or others (a sticky `/tmp` is
/// writable by others: refused too). A link in the configured path (`/var/run` → `/run`) is
/// resolved first and the directories it leads to are the ones checked. `None` when the
/// directory does not exist (`/var/run/cdi` often does not).
fn open_dir(dir: &Path) -> Result<Option<OwnedFd>, String> {
    let name = dir.display();
    let real = match std::fs::canonicalize(dir) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("CDI spec directory {name}: {e}")),
    };
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut at = PathBuf::from("/");
    let mut fd = nix::fcntl::open(&at, flags, Mode::empty())
        .map_err(|e| format!("CDI spec directory {name}: /: {}", io_err(e)))?;
    trusted_dir(&fd, &at, dir, &real)?;
    for c in real.components() {
        let std::path::Component::Normal(c) = c else {
            continue;
        };
        at.push(c);
        fd = match openat(&fd, c, flags, Mode::empty()) {
            Ok(f) => f,
            Err(nix::Error::ENOENT) => return Ok(None),
            Err(e) if at == real => {
                return Err(format!("CDI spec directory {name}: {}", io_err(e)))
            }
            Err(e) => {
                return Err(format!(
                    "CDI spec directory {name}: {}: {}",
                    at.display(),
                    io_err(e)
                ))
            }
        };
        trusted_dir(&fd, &at, dir, &real)?;
    }
    Ok(Some(fd))
}

/// `at` (the spec directory `real`, which `dir` names, or a parent of it) is root's and not
/// writable by group or others.
fn trusted_dir(fd: &OwnedFd, at: &Path, dir: &Path, real: &Path) -> Result<(), String> {
    let st = fstat(fd).map_err(|e| {
        format!(
            "CDI spec directory {}: {}: {}",
            dir.display(),
            at.display(),
            io_err(e)
        )
    })?;
    let what = if at != real {
        format!(
            "CDI spec directory {}: its parent {}",
            dir.display(),
            at.display()
        )
    } else if real != dir {
        format!("CDI spec directory {} ({})", dir.display(), real.display())
    } else {
        format!("CDI spec directory {}", dir.display())
    };
    if st.st_uid != 0 {
        return Err(format!(
            "{what} is owned by uid {}, not root; refusing to read specs from it",
            st.st_uid
        ));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(format!(
            "{what} has mode {:04o}: group or others may write it; refusing to read specs from it",
            st.st_mode & 0o7777
        ));
    }
    Ok(())
}

/// One spec file, `file` in the directory `dir` (`path` names it); `None` when it is of
/// another kind than `kinds` (or a directory).
fn read_spec(
    dir: &OwnedFd,
    file: &Path,
    path: &Path,
    kinds: &[&str],
) -> Result<Option<Spec>, String> {
    let name = path.display();
    // Opened once: a symlink is refused (never followed), a FIFO does not block the open.
    let flags = OFlag::O_RDONLY
        | OFlag::O_NOFOLLOW
        | OFlag::O_NONBLOCK
        | OFlag::O_CLOEXEC
        | OFlag::O_NOCTTY;
    let fd = match openat(dir, file, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(nix::Error::ELOOP) => {
            return Err(format!(
                "CDI spec {name} is a symlink; refusing to follow it"
            ))
        }
        Err(e) => return Err(format!("CDI spec {name}: {}", io_err(e))),
    };
    let mut f = std::fs::File::from(fd);
    let md = f.metadata().map_err(|e| format!("CDI spec {name}: {e}"))?;
    if md.is_dir() {
        return Ok(None);
    }
    if !md.is_file() {
        return Err(format!(
            "CDI spec {name} is {}, not a regular file; refusing to read it",
            file_kind(md.file_type())
        ));
    }
    // Root reads it and acts on it as root: only root may have written it.
    if md.uid() != 0 || md.mode() & 0o022 != 0 {
        return Err(format!(
            "CDI spec {name} is owned by uid {} with mode {:o}: it must be root's and not writable by others",
            md.uid(),
            md.mode() & 0o7777
        ));
    }
    let too_big = || format!("CDI spec {name} is larger than {} MiB", MAX_SPEC >> 20);
    if md.len() > MAX_SPEC {
        return Err(too_big());
    }
    let mut text = Vec::with_capacity(md.len() as usize);
    std::io::Read::read_to_end(&mut std::io::Read::take(&mut f, MAX_SPEC + 1), &mut text)
        .map_err(|e| format!("CDI spec {name}: {e}"))?;
    if text.len() as u64 > MAX_SPEC {
        return Err(too_big());
    }
    let json = path.extension().is_some_and(|x| x == "json");
    let spec = match parse(&text, json) {
        Ok(s) => s,
        Err(e) => {
            // Another vendor's broken spec is not this container's business.
            let kind = loose_kind(&text, json);
            if kind.as_deref().is_some_and(|k| !kinds.contains(&k)) {
                return Ok(None);
            }
            return Err(format!("CDI spec {name}: {}", one_line(&e)));
        }
    };
    if !kinds.contains(&spec.kind.as_str()) {
        return Ok(None);
    }
    check_spec(&spec).map_err(|e| format!("CDI spec {name}: {e}"))?;
    Ok(Some(spec))
}

fn file_kind(t: std::fs::FileType) -> &'static str {
    if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "of an unknown type"
    }
}

/// A spec's text, strictly (unknown fields refused): JSON, or YAML (which JSON also is).
pub fn parse(text: &[u8], json: bool) -> Result<Spec, String> {
    if json {
        serde_json::from_slice(text).map_err(|e| e.to_string())
    } else {
        serde_yaml_ng::from_slice(text).map_err(|e| e.to_string())
    }
}

/// [`parse`], then the reference loader's checks of the whole spec (version, kind, device
/// names).
pub fn parse_checked(text: &[u8], json: bool) -> Result<Spec, String> {
    let s = parse(text, json)?;
    check_spec(&s)?;
    Ok(s)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The `kind` of a spec that did not parse strictly, if its text has one.
fn loose_kind(text: &[u8], json: bool) -> Option<String> {
    let v: serde_json::Value = if json {
        serde_json::from_slice(text).ok()?
    } else {
        serde_yaml_ng::from_slice(text).ok()?
    };
    v.get("kind")?.as_str().map(str::to_owned)
}

/// What the reference loader checks of a spec as a whole.
fn check_spec(s: &Spec) -> Result<(), String> {
    if !VERSIONS.contains(&s.cdi_version.as_str()) {
        let newer = parse_version(&s.cdi_version)
            .zip(parse_version(MAX_VERSION))
            .is_some_and(|(a, b)| a > b);
        return Err(if newer {
            format!(
                "cdiVersion {} is newer than the {MAX_VERSION} gpuhook reads",
                s.cdi_version
            )
        } else {
            format!("cdiVersion '{}' is not a CDI version", s.cdi_version)
        });
    }
    let (vendor, class) = s
        .kind
        .split_once('/')
        .ok_or_else(|| format!("kind '{}' is not VENDOR/CLASS", s.kind))?;
    if vendor.is_empty() || class.is_empty() || class.contains('/') {
        return Err(format!("kind '{}' is not VENDOR/CLASS", s.kind));
    }
    let devices = s.devices.as_deref().unwrap_or_default();
    if devices.is_empty() {
        return Err("it defines no devices".into());
    }
    let mut names = BTreeSet::new();
    for d in devices {
        let ok = !d.name.is_empty()
            && d.name.len() <= 128
            && d.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
        if !ok {
            return Err(format!("device name '{}' is not valid", d.name));
        }
        if !names.insert(d.name.as_str()) {
            return Err(format!("device '{}' is defined twice", d.name));
        }
    }
    Ok(())
}

fn parse_version(v: &str) -> Option<(u32, u32, u32)> {
    let mut it = v.trim_start_matches('v').split('.');
    let r = (
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
    );
    it.next().is_none().then_some(r)
}

// ---- choosing and checking the edits ----

/// The chosen units, as device numbers (`(major, minor)`).
#[derive(Debug, Clone, Default)]
pub struct Units {
    /// The vendors of the chosen GPUs.
    pub vendors: Vec<Vendor>,
    /// Each chosen unit.
    pub own: Vec<Unit>,
    /// What gpuhook grants the container anyway (its units' nodes and control nodes).
    pub granted: BTreeSet<(u32, u32)>,
    /// Every other GPU's (or MIG instance's) own nodes: never granted through a spec.
    pub foreign: BTreeSet<(u32, u32)>,
}

/// A chosen unit (PCI address or MIG instance) with its vendor and its own nodes: a whole
/// GPU's nodes, a MIG instance's two access capabilities.
#[derive(Debug, Clone)]
pub struct Unit {
    pub id: String,
    pub vendor: Vendor,
    pub nodes: Vec<(u32, u32)>,
}

/// The host, as far as checking a spec goes.
#[derive(Debug, Clone)]
pub struct Host<'a> {
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
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|w| {
            w.split('.').count() >= 2
                && w.split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_owned)
}

/// The edits of `specs` that belong to `units`. Errors are one line naming the spec file.
pub fn plan(specs: &[Loaded], units: &Units, host: &Host) -> Result<Plan, String> {
    let mut b = Plan::default();
    let mut vendors = units.vendors.clone();
    vendors.sort();
    vendors.dedup();
    for v in vendors {
        let kind = kind_of(v);
        let of_kind: Vec<&Loaded> = specs.iter().filter(|l| l.spec.kind == kind).collect();
        if of_kind.is_empty() {
            return Err(format!(
                "driver \"cdi\": no CDI spec for {kind} in {}; write one with `{}`",
                dirs_list(host.dirs),
                generator(v)
            ));
        }
        // Devices by name: a later directory's replaces an earlier one's; two files of one
        // directory defining a name conflict.
        let mut by_name: BTreeMap<&str, (&Loaded, &Device)> = BTreeMap::new();
        for l in &of_kind {
            for d in l.spec.devices.as_deref().unwrap_or_default() {
                match by_name.get(d.name.as_str()) {
                    Some((o, _)) if o.dir == l.dir => {
                        return Err(format!(
                            "CDI device {kind}={} is defined in both {} and {}",
                            d.name,
                            o.path.display(),
                            l.path.display()
                        ))
                    }
                    _ => {
                        by_name.insert(d.name.as_str(), (l, d));
                    }
                }
            }
        }
        let mut used_specs: Vec<&Loaded> = Vec::new();
        let mut covered: BTreeSet<&str> = BTreeSet::new();
        for (name, (l, d)) in &by_name {
            if *name == "all" {
                continue;
            }
            let edits = d.container_edits.clone().unwrap_or_default();
            let what = |e: String| format!("CDI spec {} device {name}: {e}", l.path.display());
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
        for Unit {
            id: unit,
            nodes: own,
            ..
        } in units.own.iter().filter(|u| u.vendor == v)
        {
            if !covered.contains(unit.as_str()) {
                return Err(format!(
                    "CDI specs for {kind} ({}) have no device for {unit} ({}); regenerate them with `{}`",
                    of_kind
                        .iter()
                        .map(|l| l.path.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    own.iter()
                        .map(|(a, b)| format!("{a}:{b}"))
                        .collect::<Vec<_>>()
                        .join(" "),
                    generator(v)
                ));
            }
        }
        for l in used_specs {
            let edits = l.spec.container_edits.clone().unwrap_or_default();
            let what = |e: String| format!("CDI spec {}: {e}", l.path.display());
            let nodes = resolve_nodes(&edits, host).map_err(what)?;
            for (n, _) in &nodes {
                if units.foreign.contains(&(n.major, n.minor)) {
                    return Err(what(format!(
                        "its common edits give {} ({}:{}), another GPU's node",
                        n.path, n.major, n.minor
                    )));
                }
            }
            b.add(&edits, nodes, units, host).map_err(what)?;
            b.specs.push(l.path.display().to_string());
        }
    }
    b.finish()
}

/// A device node of a spec: where it is in the container, its number (the host node's),
/// and the spec's mode for it.
fn resolve_nodes(e: &Edits, host: &Host) -> Result<Vec<(Node, u32)>, String> {
    let mut out = Vec::new();
    for n in e.device_nodes.as_deref().unwrap_or_default() {
        let rel = container_path(&n.path, "deviceNode path")?;
        if !rel.starts_with("dev/") {
            return Err(format!("deviceNode {} is not under /dev", n.path));
        }
        if let Some(t) = n.kind.as_deref().filter(|t| !t.is_empty()) {
            if t != "c" && t != "u" {
                return Err(format!(
                    "deviceNode {} is of type '{t}': only character devices are given",
                    n.path
                ));
            }
        }
        let hp = n.host_path.as_deref().unwrap_or(&n.path);
        let host_path = host_node_path(hp, host.dev)?;
        let md = std::fs::metadata(&host_path).map_err(|e| {
            format!(
                "deviceNode {}: host node {}: {e}",
                n.path,
                host_path.display()
            )
        })?;
        if !md.file_type().is_char_device() {
            return Err(format!(
                "deviceNode {}: host node {} is {}, not a character device",
                n.path,
                host_path.display(),
                if md.file_type().is_block_device() {
                    "a block device"
                } else {
                    "no device"
                }
            ));
        }
        let rdev = md.rdev();
        let (major, minor) = (libc::major(rdev), libc::minor(rdev));
        let said = (n.major.unwrap_or(0), n.minor.unwrap_or(0));
        if said != (0, 0) && said != (i64::from(major), i64::from(minor)) {
            return Err(format!(
                "deviceNode {} says {}:{}, the host node {} is {major}:{minor}",
                n.path,
                said.0,
                said.1,
                host_path.display()
            ));
        }
        if let Some(p) = n.permissions.as_deref().filter(|p| !p.is_empty()) {
            if !p.chars().all(|c| "rwm".contains(c)) {
                return Err(format!(
                    "deviceNode {}: permissions '{p}' are not rwm",
                    n.path
                ));
            }
        }
        let mode = n.file_mode.map_or(md.mode() & 0o777, |m| m & 0o777);
        out.push((Node::new(format!("/{rel}"), major, minor), mode));
    }
    Ok(out)
}

/// Where a spec's host node is on this host: a `/dev/…` path under the config's `dev` root
/// (a path already under that root is taken as it is).
fn host_node_path(p: &str, dev: &Path) -> Result<PathBuf, String> {
    let path = Path::new(p);
    if !path.is_absolute() {
        return Err(format!("hostPath '{p}' is not absolute"));
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
pub fn container_path<'a>(p: &'a str, what: &str) -> Result<&'a str, String> {
    let rel = p
        .strip_prefix('/')
        .ok_or_else(|| format!("{what} '{p}' is not absolute"))?;
    let rel = rel.trim_end_matches('/');
    if rel.is_empty()
        || rel
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
        || p.contains(',')
        || p.chars().any(char::is_control)
        || p.len() > 4096
    {
        return Err(format!("{what} '{p}' is not a plain absolute path"));
    }
    Ok(rel)
}

/// Building a plan, edit by edit.
impl Plan {
    fn add(
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

    fn hook(&mut self, h: &SpecHook, foreign: ForeignHooks) -> Result<(), String> {
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

    fn finish(mut self) -> Result<Plan, String> {
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

impl Plan {
    /// `update-ldcache` makes each library's SONAME link in its folder (`libcuda.so.1 ->
    /// libcuda.so.535.129.03`), as `ldconfig` does. gpuhook makes these links itself, for the
    /// libraries the specs mount into a cache folder, from the SONAME of the host's own file
    /// (the spec's `hostPath`, trusted as the spec is): the container's `ldconfig` then runs
    /// with `-X` and writes nothing in the container's root.
    fn soname_links(&mut self) {
        if self.ld_folders.is_empty() {
            return;
        }
        let mut add = Vec::new();
        for m in self.mounts.iter().filter(|m| !m.dir) {
            let Some((folder, file)) = m.target.rsplit_once('/') else {
                continue;
            };
            if !self
                .ld_folders
                .iter()
                .any(|f| f.trim_end_matches('/') == folder)
            {
                continue;
            }
            let Some(so) = soname(Path::new(&m.source)) else {
                continue;
            };
            let link = format!("{folder}/{so}");
            if so == file
                || so.contains('/')
                || self.links.iter().chain(&add).any(|l: &Link| l.link == link)
                || self.mounts.iter().any(|x| x.target == link)
            {
                continue;
            }
            add.push(Link {
                target: file.to_string(),
                link,
            });
        }
        self.links.extend(add);
    }
}

/// The `DT_SONAME` of a 64-bit little-endian ELF shared object (`None`: not one, or none).
pub fn soname(path: &Path) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).ok()?;
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as u64;
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
    let mut h = [0u8; 64];
    f.read_exact_at(&mut h, 0).ok()?;
    if &h[..4] != b"\x7fELF" || h[4] != 2 || h[5] != 1 {
        return None;
    }
    let (phoff, phentsize, phnum) = (u64_at(&h, 0x20), u16_at(&h, 0x36), u16_at(&h, 0x38));
    if phentsize < 56 || phnum > 256 {
        return None;
    }
    let mut ph = vec![0u8; (phentsize * phnum) as usize];
    f.read_exact_at(&mut ph, phoff).ok()?;
    let headers: Vec<&[u8]> = ph.chunks(phentsize as usize).collect();
    // (type, offset, vaddr, filesz) of each program header.
    let seg = |p: &[u8]| {
        (
            u32::from_le_bytes(p[..4].try_into().expect("4")),
            u64_at(p, 8),
            u64_at(p, 16),
            u64_at(p, 32),
        )
    };
    let (_, dyn_off, _, dyn_size) = headers.iter().map(|p| seg(p)).find(|s| s.0 == 2)?;
    if dyn_size > 1 << 20 {
        return None;
    }
    let mut d = vec![0u8; dyn_size as usize];
    f.read_exact_at(&mut d, dyn_off).ok()?;
    let (mut strtab, mut so) = (None, None);
    for e in d.chunks_exact(16) {
        match u64_at(e, 0) {
            0 => break,
            5 => strtab = Some(u64_at(e, 8)),
            14 => so = Some(u64_at(e, 8)),
            _ => {}
        }
    }
    let (strtab, so) = (strtab?, so?);
    // The string table's address → its place in the file, through the load segment.
    let off = headers
        .iter()
        .map(|p| seg(p))
        .find(|s| s.0 == 1 && s.2 <= strtab && strtab < s.2 + s.3)
        .map(|s| strtab - s.2 + s.1)?;
    let mut name = [0u8; 256];
    let n = f.read_at(&mut name, off.checked_add(so)?).ok()?;
    let end = name[..n].iter().position(|&c| c == 0)?;
    let so = std::str::from_utf8(&name[..end]).ok()?;
    (!so.is_empty()).then(|| so.to_string())
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

fn bind_mount(m: &SpecMount, host: &Host) -> Result<BindMount, String> {
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

enum Native {
    Links(Vec<Link>),
    Ldcache(Vec<String>),
}

/// The two NVIDIA hooks gpuhook does itself: `nvidia-cdi-hook create-symlinks --link T::L …`
/// and `update-ldcache --folder D …` (also as `nvidia-ctk hook …`). Any other hook, or one
/// with flags gpuhook does not know, is `None` (passed on).
fn native(path: &str, args: &[String]) -> Result<Option<Native>, String> {
    let prog = Path::new(path).file_name().and_then(|f| f.to_str());
    let rest: &[String] = match prog {
        Some("nvidia-cdi-hook") if args.len() >= 2 => &args[1..],
        Some("nvidia-ctk") if args.len() >= 3 && args[1] == "hook" => &args[2..],
        _ => return Ok(None),
    };
    let (sub, flags) = (rest[0].as_str(), &rest[1..]);
    let want = match sub {
        "create-symlinks" => "link",
        "update-ldcache" => "folder",
        _ => return Ok(None),
    };
    let mut values = Vec::new();
    let mut it = flags.iter();
    while let Some(a) = it.next() {
        let name = a.trim_start_matches('-');
        let (name, value) = match name.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (name, None),
        };
        if !a.starts_with("--") {
            return Ok(None);
        }
        match name {
            n if n == want => {
                let v = match value {
                    Some(v) => v,
                    None => it
                        .next()
                        .cloned()
                        .ok_or_else(|| format!("{sub}: --{n} needs a value"))?,
                };
                values.push(v);
            }
            // The container's root is gpuhook's to find; ldconfig is the host's.
            "ldconfig-path" | "container-spec" => {
                if value.is_none() {
                    it.next();
                }
            }
            _ => return Ok(None),
        }
    }
    Ok(Some(match sub {
        "create-symlinks" => Native::Links(
            values
                .into_iter()
                .map(|v| {
                    let (target, link) = v.split_once("::").ok_or_else(|| {
                        format!("create-symlinks: --link '{v}' is not TARGET::LINK")
                    })?;
                    container_path(link, "create-symlinks link")?;
                    if target.is_empty() || target.contains('\0') || target.len() > 4096 {
                        return Err(format!("create-symlinks: target '{target}' is not valid"));
                    }
                    Ok(Link {
                        target: target.to_string(),
                        link: link.trim_end_matches('/').to_string(),
                    })
                })
                .collect::<Result<_, String>>()?,
        ),
        _ => Native::Ldcache(
            values
                .into_iter()
                .map(|v| container_path(&v, "update-ldcache folder").map(|r| format!("/{r}")))
                .collect::<Result<_, String>>()?,
        ),
    }))
}

#[cfg(test)]
mod tests;
