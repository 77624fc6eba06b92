//! Host configuration: `/etc/gpuhook/config.json`, or the file named by `GPUHOOK_CONFIG`.
//!
//! Every key is optional; unknown keys are an error. The roots (`sysfs`, `proc`, `dev`) let a
//! whole fake host be described; they are used for the GPU inventory only. Finding and entering
//! containers always uses the real `/proc` and cgroup mounts.

use crate::ids::normalize_pci;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub const DEFAULT_PATH: &str = "/etc/gpuhook/config.json";
pub const ENV: &str = "GPUHOOK_CONFIG";
pub const DEFAULT_STATE_FILE: &str = "/run/gpuhook/state.json";
/// libvirt's QEMU driver status directory (system instance).
pub const DEFAULT_LIBVIRT_QEMU_DIR: &str = "/run/libvirt/qemu";

pub const CDI_DEFAULT_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// Where the OCI runtimes keep their containers' state as root (`--root`): runc's
/// `ROOT/ID/state.json` (podman runs runc with its default root), crun's `ROOT/ID/status`;
/// containerd's runc v2 shim runs runc under `/run/containerd/runc/NAMESPACE`: `k8s.io` for
/// Kubernetes' containers (the CRI plugin), `default` for `ctr`'s.
pub const OCI_STATE_DEFAULT_ROOTS: [&str; 4] = [
    "/run/runc",
    "/run/crun",
    "/run/containerd/runc/k8s.io",
    "/run/containerd/runc/default",
];

/// What becomes of a spec's hooks that gpuhook does not do itself (config key
/// `cdi_foreign_hooks`): they run as root against the container's image (OCI: the runtime
/// runs them), so a host can refuse them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForeignHooks {
    /// Passed to the OCI runtime, listed in the log for libvirt.
    #[default]
    Pass,
    /// A request whose edits have one is refused.
    Refuse,
}

/// A `cdi_foreign_hooks` value that is neither `pass` nor `refuse`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown value '{0}' (known: pass, refuse)")]
pub struct UnknownForeignHooks(pub String);

impl ForeignHooks {
    pub fn parse(v: &str) -> Result<ForeignHooks, UnknownForeignHooks> {
        match v {
            "pass" => Ok(ForeignHooks::Pass),
            "refuse" => Ok(ForeignHooks::Refuse),
            other => Err(UnknownForeignHooks(other.to_string())),
        }
    }
}

/// Why a config file was refused: the file, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("config {}: {problem}", .path.display())]
pub struct ConfigError {
    pub path: PathBuf,
    #[source]
    pub problem: ConfigProblem,
}

/// What is wrong with a config file (the key, the value, the error it came from).
#[derive(Debug, thiserror::Error)]
pub enum ConfigProblem {
    // ---- reading the file ----
    #[error("{0}")]
    Io(#[source] std::io::Error),
    #[error("not a regular file")]
    NotRegularFile,
    #[error("owned by uid {uid}, not root; refusing to trust it")]
    Owner { uid: u32 },
    #[error("mode {mode:04o} lets group or others write it; refusing to trust it (chmod go-w)")]
    Writable { mode: u32 },
    // ---- its text ----
    #[error("must be a JSON object ({{...}})")]
    NotAnObject,
    #[error("{0}")]
    Json(#[source] serde_json::Error),
    // ---- its keys ----
    #[error("\"{key}\" must be an absolute path, not {path:?}")]
    RelativePath { key: &'static str, path: PathBuf },
    #[error("\"{key}\" must hold absolute paths, not {path:?}")]
    RelativeInList { key: &'static str, path: PathBuf },
    #[error("\"state_file\" {0:?} names no file")]
    StateFileNamesNoFile(PathBuf),
    #[error("\"cdi_foreign_hooks\": {0}")]
    ForeignHooks(#[source] UnknownForeignHooks),
    #[error("\"driver\": {0}")]
    Driver(#[source] crate::request::WordError),
    #[error("\"exclude\": '{0}' is not a PCI address like 0000:af:00.0")]
    Exclude(String),
    #[error("\"overrides\".\"{key}\".{field} is empty or too long")]
    OverrideLength { key: String, field: &'static str },
    #[error("\"overrides\".\"{key}\".arch '{arch}' would be Placement's {class}, the class of shared GPUs' slots: name it otherwise")]
    OverrideSharedClass {
        key: String,
        arch: String,
        class: String,
    },
    #[error("\"overrides\": key '{0}' is neither a PCI id like 10de:06de nor a PCI address like 0000:3b:00.0")]
    OverrideKey(String),
    #[error("\"sharing\".\"{key}\": {problem}")]
    Sharing {
        key: String,
        #[source]
        problem: SharingProblem,
    },
    #[error("\"reset_command\" {0}")]
    ResetCommand(#[source] ResetCommandError),
    #[error("\"max_quarantines\" must be at least 1")]
    NoQuarantines,
    #[error("\"driver_socket_owners\": {0} is neither an account name nor a uid")]
    SocketOwner(serde_json::Value),
}

/// What is wrong with one `sharing` entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SharingProblem {
    #[error("unknown mode '{0}' (known: timeslice, mps)")]
    UnknownMode(String),
    #[error("replicas {replicas} is out of range ({}-{})", REPLICAS.start(), REPLICAS.end())]
    Replicas { replicas: u32 },
    #[error("{0} is only for mode \"mps\"")]
    OnlyForMps(&'static str),
    #[error("active_thread_percentage {0} is out of range (1-100)")]
    ThreadPercentage(u32),
    #[error("memory_limit_mib must be at least 1")]
    NoMemory,
    #[error("the key is neither a PCI id like 10de:1028 nor a PCI address like 0000:04:00.0")]
    Key,
}

/// What is wrong with a `reset_command`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResetCommandError {
    #[error("must be {}", RESET_COMMAND_WANTED)]
    NotAList,
    #[error("is empty: it must be {}", RESET_COMMAND_WANTED)]
    Empty,
    #[error("its program must be an absolute path, not {0:?}")]
    RelativeProgram(String),
    #[error("an argument has a NUL")]
    Nul,
}

/// What a `reset_command` must be, for messages.
const RESET_COMMAND_WANTED: &str = "a list of a program's absolute path and its arguments ([\"/usr/bin/nvidia-smi\", \"--gpu-reset\", \"-i\", \"{pci}\"]), or \"pci\"";

/// What a config may say of one GPU or of one PCI id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Override {
    pub arch: Option<String>,
    pub model: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    sysfs: Option<PathBuf>,
    proc: Option<PathBuf>,
    dev: Option<PathBuf>,
    root: Option<PathBuf>,
    state_file: Option<PathBuf>,
    #[serde(default)]
    exclude: Vec<String>,
    #[serde(default)]
    overrides: BTreeMap<String, Override>,
    pci_ids: Option<PathBuf>,
    oci_runtime: Option<PathBuf>,
    oci_env_requests: Option<bool>,
    oci_state_roots: Option<Vec<PathBuf>>,
    cdi_spec_dirs: Option<Vec<PathBuf>>,
    cdi_foreign_hooks: Option<String>,
    driver: Option<String>,
    #[serde(default)]
    sharing: BTreeMap<String, RawSharing>,
    mps_control: Option<PathBuf>,
    nvidia_smi: Option<PathBuf>,
    reset_command: Option<serde_json::Value>,
    auto_reset: Option<bool>,
    max_quarantines: Option<u32>,
    reset_on_release: Option<bool>,
    driver_socket_owners: Option<Vec<serde_json::Value>>,
    libvirt_qemu_dir: Option<PathBuf>,
    kubelet_plugin_dir: Option<PathBuf>,
    kubelet_claim_s: Option<u64>,
}

/// An account whose sockets `driver="host"` may give though they are not root's (config
/// `driver_socket_owners`; `nvidia-persistenced --user NAME`): by name, looked up in the
/// host's `<root>/etc/passwd` at each start that meets a socket not root's, or by uid (a
/// JSON number, or a string of digits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketOwner {
    Name(String),
    Uid(u32),
}

impl SocketOwner {
    /// An entry as written: a name (letters, digits, `_`, `-`, `.`, a final `$`; not
    /// starting with `-`; at most 32 bytes), a uid as a number or a string of digits.
    fn parse(v: serde_json::Value) -> Result<SocketOwner, ConfigProblem> {
        let uid = |n: u64| u32::try_from(n).ok().filter(|u| *u != u32::MAX);
        let owner = match &v {
            serde_json::Value::Number(n) => n.as_u64().and_then(uid).map(SocketOwner::Uid),
            serde_json::Value::String(s)
                if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) =>
            {
                s.parse().ok().and_then(uid).map(SocketOwner::Uid)
            }
            serde_json::Value::String(s) => {
                let body = s.strip_suffix('$').unwrap_or(s);
                let ok = !body.is_empty()
                    && s.len() <= 32
                    && !body.starts_with('-')
                    && body
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
                ok.then(|| SocketOwner::Name(s.clone()))
            }
            _ => None,
        };
        owner.ok_or(ConfigProblem::SocketOwner(v))
    }
}

/// One `sharing` entry as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSharing {
    replicas: u32,
    mode: Option<String>,
    memory_limit_mib: Option<u64>,
    active_thread_percentage: Option<u32>,
}

/// How a shareable GPU is shared (docs/guides/sharing.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShareMode {
    /// The sharers take turns as CUDA schedules them: nothing is started.
    #[default]
    Timeslice,
    /// NVIDIA's MPS control daemon, one per GPU, started by gpuhook.
    Mps,
}

impl ShareMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ShareMode::Timeslice => "timeslice",
            ShareMode::Mps => "mps",
        }
    }
}

/// A GPU that may be shared: given only as one of its `replicas` slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Sharing {
    pub mode: ShareMode,
    pub replicas: u32,
    /// MPS only: `set_default_device_pinned_mem_limit 0 <M>M`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_limit_mib: Option<u64>,
    /// MPS only: `set_default_active_thread_percentage <P>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_thread_percentage: Option<u32>,
}

impl Sharing {
    /// Time-sliced, by `replicas`.
    pub fn timeslice(replicas: u32) -> Sharing {
        Sharing {
            mode: ShareMode::Timeslice,
            replicas,
            memory_limit_mib: None,
            active_thread_percentage: None,
        }
    }
}

/// The bounds of `replicas`.
pub const REPLICAS: std::ops::RangeInclusive<u32> = 2..=64;

/// kubelet's device plugin directory (config `kubelet_plugin_dir`): its registration socket
/// `kubelet.sock` and checkpoint `kubelet_internal_checkpoint` are there, and the device
/// plugin's sockets go there; its pod resources socket is `../pod-resources/kubelet.sock`.
pub const DEFAULT_KUBELET_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins/";

/// How long a pod's allocation that kubelet never listed is kept (config `kubelet_claim_s`).
pub const DEFAULT_KUBELET_CLAIM_S: u64 = 300;

/// NVIDIA's MPS control program (config `mps_control`).
pub const DEFAULT_MPS_CONTROL: &str = "/usr/bin/nvidia-cuda-mps-control";

/// NVIDIA's `nvidia-smi` (config `nvidia_smi`): `health scan` reads a GPU's ECC and
/// row-remapping counters with it to confirm a memory error's Xid.
pub const DEFAULT_NVIDIA_SMI: &str = "/usr/bin/nvidia-smi";

/// How `gpuhook health reset` resets a GPU (config `reset_command`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetCommand {
    /// A program and its arguments, `{pci}` in any of them replaced by the GPU's address.
    Argv(Vec<String>),
    /// The kernel's function-level reset: `1` written to `<sysfs>/bus/pci/devices/PCI/reset`.
    Pci,
}

/// The default `reset_command`: NVIDIA's own reset.
pub const DEFAULT_RESET_COMMAND: [&str; 4] = ["/usr/bin/nvidia-smi", "--gpu-reset", "-i", "{pci}"];

/// The default `max_quarantines`: quarantined this often within 24 hours, a GPU needs
/// inspection.
pub const DEFAULT_MAX_QUARANTINES: u32 = 3;

impl ResetCommand {
    /// The argument list for the GPU at `pci` (`None` for [`ResetCommand::Pci`]).
    pub fn argv(&self, pci: &str) -> Option<Vec<String>> {
        match self {
            ResetCommand::Argv(a) => Some(a.iter().map(|x| x.replace("{pci}", pci)).collect()),
            ResetCommand::Pci => None,
        }
    }

    fn parse(v: serde_json::Value) -> Result<ResetCommand, ResetCommandError> {
        match v {
            serde_json::Value::String(s) if s == "pci" => Ok(ResetCommand::Pci),
            serde_json::Value::Array(items) => {
                let argv: Vec<String> = items
                    .into_iter()
                    .map(|x| match x {
                        serde_json::Value::String(s) => Ok(s),
                        _ => Err(ResetCommandError::NotAList),
                    })
                    .collect::<Result<_, _>>()?;
                match argv.first() {
                    None => Err(ResetCommandError::Empty),
                    Some(p) if !Path::new(p).is_absolute() => {
                        Err(ResetCommandError::RelativeProgram(p.clone()))
                    }
                    Some(_) if argv.iter().any(|a| a.contains('\0')) => Err(ResetCommandError::Nul),
                    Some(_) => Ok(ResetCommand::Argv(argv)),
                }
            }
            _ => Err(ResetCommandError::NotAList),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Where this config came from (for messages); `None` for built-in defaults.
    pub source: Option<PathBuf>,
    pub sysfs: PathBuf,
    pub proc: PathBuf,
    pub dev: PathBuf,
    /// Where the host's files are looked for (`driver="host"`: the driver's libraries,
    /// programs, firmware, `etc/ld.so.cache`); `/` on a real host, a fake host's tree in
    /// tests. Files are given to containers at their path without this prefix.
    pub root: PathBuf,
    pub state_file: PathBuf,
    /// Normalized PCI addresses never to allocate.
    pub exclude: Vec<String>,
    /// Keyed by normalized PCI address.
    pub by_address: BTreeMap<String, Override>,
    /// Keyed by (vendor, device) PCI id.
    pub by_id: BTreeMap<(u16, u16), Override>,
    /// The PCI id database; `None`: search the usual places.
    pub pci_ids: Option<PathBuf>,
    /// The real OCI runtime `gpuhook-runtime` runs; `None`: the first crun, runc found.
    pub oci_runtime: Option<PathBuf>,
    /// Whether `GPUHOOK_…` variables in an OCI container's env are a request (default yes).
    pub oci_env_requests: bool,
    /// Where `gpuhook attach`/`detach` look for an OCI container's state (its init) when
    /// gpuhook recorded none: the runtimes' roots (`/run/runc`, `/run/crun`).
    pub oci_state_roots: Vec<PathBuf>,
    /// Where CDI specs are, lowest priority first (`/etc/cdi`, `/var/run/cdi`).
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// CDI hooks gpuhook does not do itself: passed on (`pass`, the default) or refused.
    pub cdi_foreign_hooks: ForeignHooks,
    /// The driver user space a request gets when it does not say (`none`).
    pub driver: crate::request::Driver,
    /// Shareable GPUs by normalized PCI address, and by (vendor, device) PCI id.
    pub share_by_address: BTreeMap<String, Sharing>,
    pub share_by_id: BTreeMap<(u16, u16), Sharing>,
    /// NVIDIA's MPS control program.
    pub mps_control: PathBuf,
    /// NVIDIA's `nvidia-smi`, run by `health scan` to read a GPU's memory error counters.
    pub nvidia_smi: PathBuf,
    /// How `health reset` resets a GPU.
    pub reset_command: ResetCommand,
    /// Whether `health scan` resets every GPU quarantined with the reset action that is free
    /// and not open.
    pub auto_reset: bool,
    /// Quarantined this many times within 24 hours, a GPU needs inspection.
    pub max_quarantines: u32,
    /// Whether a GPU freed by its last holder is reset (by `health scan`) before anyone else
    /// gets it.
    pub reset_on_release: bool,
    /// The accounts whose sockets `driver="host"` gives though they are not root's (in a
    /// directory chain root's above the socket's own directory).
    pub driver_socket_owners: Vec<SocketOwner>,
    /// libvirt's QEMU status directory: each running VM's pid file (`NAME.pid`, the QEMU
    /// process) and live status XML (`NAME.xml`).
    pub libvirt_qemu_dir: PathBuf,
    /// kubelet's device plugin directory.
    pub kubelet_plugin_dir: PathBuf,
    /// Seconds a pod's allocation kubelet never listed is kept.
    pub kubelet_claim_s: u64,
}

impl Config {
    /// kubelet's pod resources socket: `pod-resources/kubelet.sock` beside its plugin
    /// directory.
    pub fn pod_resources_socket(&self) -> PathBuf {
        let dir = self.kubelet_plugin_dir.components().as_path();
        dir.parent()
            .unwrap_or(Path::new("/"))
            .join("pod-resources/kubelet.sock")
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            source: None,
            sysfs: "/sys".into(),
            proc: "/proc".into(),
            dev: "/dev".into(),
            root: "/".into(),
            state_file: DEFAULT_STATE_FILE.into(),
            exclude: vec![],
            by_address: BTreeMap::new(),
            by_id: BTreeMap::new(),
            pci_ids: None,
            oci_runtime: None,
            oci_env_requests: true,
            oci_state_roots: OCI_STATE_DEFAULT_ROOTS.iter().map(PathBuf::from).collect(),
            cdi_spec_dirs: CDI_DEFAULT_DIRS.iter().map(PathBuf::from).collect(),
            cdi_foreign_hooks: ForeignHooks::Pass,
            driver: crate::request::Driver::None,
            share_by_address: BTreeMap::new(),
            share_by_id: BTreeMap::new(),
            mps_control: DEFAULT_MPS_CONTROL.into(),
            nvidia_smi: DEFAULT_NVIDIA_SMI.into(),
            reset_command: ResetCommand::Argv(
                DEFAULT_RESET_COMMAND
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
            ),
            auto_reset: false,
            max_quarantines: DEFAULT_MAX_QUARANTINES,
            reset_on_release: false,
            driver_socket_owners: Vec::new(),
            libvirt_qemu_dir: DEFAULT_LIBVIRT_QEMU_DIR.into(),
            kubelet_plugin_dir: DEFAULT_KUBELET_PLUGIN_DIR.into(),
            kubelet_claim_s: DEFAULT_KUBELET_CLAIM_S,
        }
    }
}

/// `p` if it is absolute (`key` names it in the error).
fn absolute(key: &'static str, p: PathBuf) -> Result<PathBuf, ConfigProblem> {
    if p.is_absolute() {
        Ok(p)
    } else {
        Err(ConfigProblem::RelativePath { key, path: p })
    }
}

fn parse_pci_id(s: &str) -> Option<(u16, u16)> {
    let (v, d) = s.split_once(':')?;
    if v.len() != 4 || d.len() != 4 {
        return None;
    }
    Some((
        u16::from_str_radix(v, 16).ok()?,
        u16::from_str_radix(d, 16).ok()?,
    ))
}

impl Config {
    /// The state file's directory: everything of this pool lies there (the state and its
    /// lock, the driver cache, the MPS daemons' directories, private nodes, the cgroup
    /// locks), so a second pool (another config's) shares nothing with it.
    pub fn state_dir(&self) -> &Path {
        self.state_file.parent().unwrap_or(Path::new("/"))
    }

    /// Parses config text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let e = |problem: ConfigProblem| ConfigError {
            path: path.to_path_buf(),
            problem,
        };
        if !text.trim_start().starts_with('{') {
            return Err(e(ConfigProblem::NotAnObject));
        }
        let raw: Raw = serde_json::from_str(text).map_err(|x| e(ConfigProblem::Json(x)))?;
        Config::from_raw(raw, path).map_err(e)
    }

    /// The config a parsed file says (`path`: where it came from).
    fn from_raw(raw: Raw, path: &Path) -> Result<Config, ConfigProblem> {
        let mut c = Config {
            source: Some(path.to_path_buf()),
            ..Config::default()
        };
        for (key, val, slot) in [
            ("sysfs", raw.sysfs, &mut c.sysfs),
            ("proc", raw.proc, &mut c.proc),
            ("dev", raw.dev, &mut c.dev),
            ("root", raw.root, &mut c.root),
            ("state_file", raw.state_file, &mut c.state_file),
            (
                "libvirt_qemu_dir",
                raw.libvirt_qemu_dir,
                &mut c.libvirt_qemu_dir,
            ),
        ] {
            if let Some(p) = val {
                *slot = absolute(key, p)?;
            }
        }
        if c.state_file.file_name().is_none() || c.state_file.parent().is_none() {
            return Err(ConfigProblem::StateFileNamesNoFile(c.state_file));
        }
        c.oci_env_requests = raw.oci_env_requests.unwrap_or(true);
        for (key, val, slot) in [
            ("pci_ids", raw.pci_ids, &mut c.pci_ids),
            ("oci_runtime", raw.oci_runtime, &mut c.oci_runtime),
        ] {
            if let Some(p) = val {
                *slot = Some(absolute(key, p)?);
            }
        }
        for (key, val, slot) in [
            ("cdi_spec_dirs", raw.cdi_spec_dirs, &mut c.cdi_spec_dirs),
            (
                "oci_state_roots",
                raw.oci_state_roots,
                &mut c.oci_state_roots,
            ),
        ] {
            if let Some(dirs) = val {
                if let Some(d) = dirs.iter().find(|d| !d.is_absolute()) {
                    return Err(ConfigProblem::RelativeInList {
                        key,
                        path: d.clone(),
                    });
                }
                *slot = dirs;
            }
        }
        if let Some(v) = raw.cdi_foreign_hooks {
            c.cdi_foreign_hooks = ForeignHooks::parse(&v).map_err(ConfigProblem::ForeignHooks)?;
        }
        if let Some(d) = raw.driver {
            c.driver = crate::request::Driver::parse(&d).map_err(ConfigProblem::Driver)?;
        }
        for x in &raw.exclude {
            let a = normalize_pci(x).ok_or_else(|| ConfigProblem::Exclude(x.clone()))?;
            c.exclude.push(a);
        }
        c.set_overrides(raw.overrides)?;
        c.set_sharing(raw.sharing)?;
        if let Some(p) = raw.mps_control {
            c.mps_control = absolute("mps_control", p)?;
        }
        if let Some(p) = raw.nvidia_smi {
            c.nvidia_smi = absolute("nvidia_smi", p)?;
        }
        if let Some(v) = raw.reset_command {
            c.reset_command = ResetCommand::parse(v).map_err(ConfigProblem::ResetCommand)?;
        }
        c.auto_reset = raw.auto_reset.unwrap_or(false);
        c.reset_on_release = raw.reset_on_release.unwrap_or(false);
        for v in raw.driver_socket_owners.unwrap_or_default() {
            c.driver_socket_owners.push(SocketOwner::parse(v)?);
        }
        if let Some(n) = raw.max_quarantines {
            if n == 0 {
                return Err(ConfigProblem::NoQuarantines);
            }
            c.max_quarantines = n;
        }
        if let Some(p) = raw.kubelet_plugin_dir {
            c.kubelet_plugin_dir = absolute("kubelet_plugin_dir", p)?;
        }
        if let Some(n) = raw.kubelet_claim_s {
            c.kubelet_claim_s = n;
        }
        Ok(c)
    }

    /// The `sharing` entries, each keyed by a PCI id or a PCI address.
    fn set_sharing(&mut self, raw: BTreeMap<String, RawSharing>) -> Result<(), ConfigProblem> {
        for (key, r) in raw {
            let at = |problem: SharingProblem| ConfigProblem::Sharing {
                key: key.clone(),
                problem,
            };
            let mode = match r.mode.as_deref() {
                None | Some("timeslice") => ShareMode::Timeslice,
                Some("mps") => ShareMode::Mps,
                Some(o) => return Err(at(SharingProblem::UnknownMode(o.to_owned()))),
            };
            if !REPLICAS.contains(&r.replicas) {
                return Err(at(SharingProblem::Replicas {
                    replicas: r.replicas,
                }));
            }
            if mode != ShareMode::Mps {
                for (k, set) in [
                    ("memory_limit_mib", r.memory_limit_mib.is_some()),
                    (
                        "active_thread_percentage",
                        r.active_thread_percentage.is_some(),
                    ),
                ] {
                    if set {
                        return Err(at(SharingProblem::OnlyForMps(k)));
                    }
                }
            }
            if let Some(p) = r.active_thread_percentage {
                if !(1..=100).contains(&p) {
                    return Err(at(SharingProblem::ThreadPercentage(p)));
                }
            }
            if r.memory_limit_mib == Some(0) {
                return Err(at(SharingProblem::NoMemory));
            }
            let s = Sharing {
                mode,
                replicas: r.replicas,
                memory_limit_mib: r.memory_limit_mib,
                active_thread_percentage: r.active_thread_percentage,
            };
            if let Some(id) = parse_pci_id(&key.to_ascii_lowercase()) {
                self.share_by_id.insert(id, s);
            } else if let Some(a) = normalize_pci(&key) {
                self.share_by_address.insert(a, s);
            } else {
                return Err(at(SharingProblem::Key));
            }
        }
        Ok(())
    }

    /// Whether and how a GPU may be shared: its PCI address wins over its PCI id.
    pub fn sharing_for(&self, pci: &str, vendor: u16, device: u16) -> Option<Sharing> {
        self.share_by_address
            .get(pci)
            .or_else(|| self.share_by_id.get(&(vendor, device)))
            .copied()
    }

    /// The `overrides`, each keyed by a PCI id or a PCI address.
    fn set_overrides(&mut self, raw: BTreeMap<String, Override>) -> Result<(), ConfigProblem> {
        let c = self;
        for (key, o) in raw {
            for (what, v) in [("arch", &o.arch), ("model", &o.model)] {
                if let Some(v) = v {
                    if v.trim().is_empty() || v.len() > 128 {
                        return Err(ConfigProblem::OverrideLength {
                            key: key.clone(),
                            field: what,
                        });
                    }
                }
            }
            if let Some(a) = &o.arch {
                let class = crate::request::extra_specs::custom_name("GPU_", a.trim());
                if class.ends_with(crate::request::extra_specs::SHARED_SUFFIX) {
                    return Err(ConfigProblem::OverrideSharedClass {
                        key: key.clone(),
                        arch: a.clone(),
                        class,
                    });
                }
            }
            let o = Override {
                arch: o.arch.map(|a| a.trim().to_ascii_lowercase()),
                model: o.model.map(|m| m.trim().to_owned()),
            };
            if let Some(id) = parse_pci_id(&key.to_ascii_lowercase()) {
                c.by_id.insert(id, o);
            } else if let Some(a) = normalize_pci(&key) {
                c.by_address.insert(a, o);
            } else {
                return Err(ConfigProblem::OverrideKey(key));
            }
        }
        Ok(())
    }

    /// Loads the host config: `$GPUHOOK_CONFIG` if set (it must exist), else
    /// `/etc/gpuhook/config.json` if present, else built-in defaults.
    ///
    /// The file must be a regular file owned by root (or by the caller) and not writable by
    /// group or others: it decides where the hook looks for device nodes and writes state.
    pub fn load() -> Result<Config, ConfigError> {
        match std::env::var_os(ENV) {
            Some(p) if !p.is_empty() => Self::load_file(Path::new(&p), true),
            _ => Self::load_file(Path::new(DEFAULT_PATH), false),
        }
    }

    pub fn load_file(path: &Path, must_exist: bool) -> Result<Config, ConfigError> {
        let e = |problem: ConfigProblem| ConfigError {
            path: path.to_path_buf(),
            problem,
        };
        let mut f = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(x) if x.kind() == std::io::ErrorKind::NotFound && !must_exist => {
                return Ok(Config::default())
            }
            Err(x) => return Err(e(ConfigProblem::Io(x))),
        };
        let md = f.metadata().map_err(|x| e(ConfigProblem::Io(x)))?;
        if !md.is_file() {
            return Err(e(ConfigProblem::NotRegularFile));
        }
        let euid = nix::unistd::geteuid().as_raw();
        if md.uid() != 0 && md.uid() != euid {
            return Err(e(ConfigProblem::Owner { uid: md.uid() }));
        }
        if md.mode() & 0o022 != 0 {
            return Err(e(ConfigProblem::Writable {
                mode: md.mode() & 0o7777,
            }));
        }
        let mut text = String::with_capacity(md.len() as usize);
        std::io::Read::read_to_string(&mut f, &mut text).map_err(|x| e(ConfigProblem::Io(x)))?;
        Self::parse(&text, path)
    }

    pub fn is_excluded(&self, pci: &str) -> bool {
        self.exclude.iter().any(|x| x == pci)
    }

    /// The architectures the `overrides` name (lowercase).
    pub fn override_archs(&self) -> impl Iterator<Item = &str> {
        self.by_id
            .values()
            .chain(self.by_address.values())
            .filter_map(|o| o.arch.as_deref())
    }

    /// The override for a GPU: its PCI address wins over its PCI id.
    pub fn override_for(&self, pci: &str, vendor: u16, device: u16) -> Override {
        let by_addr = self.by_address.get(pci);
        let by_id = self.by_id.get(&(vendor, device));
        Override {
            arch: by_addr
                .and_then(|o| o.arch.clone())
                .or_else(|| by_id.and_then(|o| o.arch.clone())),
            model: by_addr
                .and_then(|o| o.model.clone())
                .or_else(|| by_id.and_then(|o| o.model.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each problem reads word for word as the message it replaced.
    #[test]
    fn problems_read_word_for_word() {
        let cfg = |problem| {
            ConfigError {
                path: "/etc/gpuhook/config.json".into(),
                problem,
            }
            .to_string()
        };
        let sharing = |problem| {
            cfg(ConfigProblem::Sharing {
                key: "10de:1028".into(),
                problem,
            })
        };
        for (got, want) in [
            (cfg(ConfigProblem::NotAnObject), "config /etc/gpuhook/config.json: must be a JSON object ({...})".to_string()),
            (cfg(ConfigProblem::NotRegularFile), "config /etc/gpuhook/config.json: not a regular file".into()),
            (cfg(ConfigProblem::Owner { uid: 1000 }), "config /etc/gpuhook/config.json: owned by uid 1000, not root; refusing to trust it".into()),
            (cfg(ConfigProblem::Writable { mode: 0o666 }), "config /etc/gpuhook/config.json: mode 0666 lets group or others write it; refusing to trust it (chmod go-w)".into()),
            (cfg(ConfigProblem::RelativePath { key: "sysfs", path: "sys".into() }), "config /etc/gpuhook/config.json: \"sysfs\" must be an absolute path, not \"sys\"".into()),
            (cfg(ConfigProblem::StateFileNamesNoFile("/".into())), "config /etc/gpuhook/config.json: \"state_file\" \"/\" names no file".into()),
            (cfg(ConfigProblem::Exclude("x".into())), "config /etc/gpuhook/config.json: \"exclude\": 'x' is not a PCI address like 0000:af:00.0".into()),
            (cfg(ConfigProblem::OverrideLength { key: "k".into(), field: "arch" }), "config /etc/gpuhook/config.json: \"overrides\".\"k\".arch is empty or too long".into()),
            (cfg(ConfigProblem::OverrideKey("k".into())), "config /etc/gpuhook/config.json: \"overrides\": key 'k' is neither a PCI id like 10de:06de nor a PCI address like 0000:3b:00.0".into()),
            (cfg(ConfigProblem::ResetCommand(ResetCommandError::Nul)), "config /etc/gpuhook/config.json: \"reset_command\" an argument has a NUL".into()),
            (cfg(ConfigProblem::ResetCommand(ResetCommandError::Empty)), "config /etc/gpuhook/config.json: \"reset_command\" is empty: it must be a list of a program's absolute path and its arguments ([\"/usr/bin/nvidia-smi\", \"--gpu-reset\", \"-i\", \"{pci}\"]), or \"pci\"".into()),
            (sharing(SharingProblem::UnknownMode("x".into())), "config /etc/gpuhook/config.json: \"sharing\".\"10de:1028\": unknown mode 'x' (known: timeslice, mps)".into()),
            (sharing(SharingProblem::Replicas { replicas: 1 }), "config /etc/gpuhook/config.json: \"sharing\".\"10de:1028\": replicas 1 is out of range (2-64)".into()),
            (sharing(SharingProblem::NoMemory), "config /etc/gpuhook/config.json: \"sharing\".\"10de:1028\": memory_limit_mib must be at least 1".into()),
        ] {
            assert_eq!(got, want);
        }
    }

    fn p(t: &str) -> Result<Config, ConfigError> {
        Config::parse(t, Path::new("/etc/gpuhook/config.json"))
    }

    #[test]
    fn spec_example() {
        let c = p(r#"{
  "sysfs": "/sys", "proc": "/proc", "dev": "/dev",
  "state_file": "/run/gpuhook/state.json",
  "exclude": ["0000:af:00.0"],
  "overrides": {
    "10de:06de": {"arch": "fermi", "model": "Tesla M2050"},
    "0000:3b:00.0": {"arch": "Fermi"}
  }
}"#)
        .unwrap();
        assert_eq!(c.exclude, vec!["0000:af:00.0"]);
        assert!(c.is_excluded("0000:af:00.0"));
        let o = c.override_for("0000:3b:00.0", 0x10de, 0x06de);
        assert_eq!(o.arch.as_deref(), Some("fermi"));
        assert_eq!(o.model.as_deref(), Some("Tesla M2050"));
        let o = c.override_for("0000:3c:00.0", 0x10de, 0x1091);
        assert_eq!(o, Override::default());
    }

    /// The health keys: `reset_command` an argument list (`{pci}` replaced) or `"pci"`,
    /// The device plugin's keys: kubelet's plugin directory (absolute; its pod resources
    /// socket beside it) and the claim of an allocation kubelet never lists.
    #[test]
    fn kubelet_keys() {
        let d = p("{}").unwrap();
        assert_eq!(
            d.kubelet_plugin_dir,
            Path::new("/var/lib/kubelet/device-plugins/")
        );
        assert_eq!(
            d.pod_resources_socket(),
            Path::new("/var/lib/kubelet/pod-resources/kubelet.sock")
        );
        assert_eq!(d.kubelet_claim_s, 300);
        let c =
            p(r#"{"kubelet_plugin_dir": "/srv/kubelet/device-plugins", "kubelet_claim_s": 30}"#)
                .unwrap();
        assert_eq!(
            c.pod_resources_socket(),
            Path::new("/srv/kubelet/pod-resources/kubelet.sock")
        );
        assert_eq!(c.kubelet_claim_s, 30);
        assert!(p(r#"{"kubelet_plugin_dir": "device-plugins"}"#)
            .unwrap_err()
            .to_string()
            .contains("\"kubelet_plugin_dir\" must be an absolute path"));
        assert!(p(r#"{"kubelet_claim_s": -1}"#).is_err());
    }

    /// `auto_reset`, `max_quarantines` (at least 1), `reset_on_release`, `nvidia_smi` (an
    /// absolute path); their defaults.
    #[test]
    fn health_keys() {
        let d = p("{}").unwrap();
        assert_eq!(
            d.reset_command.argv("0000:3b:00.0").unwrap(),
            ["/usr/bin/nvidia-smi", "--gpu-reset", "-i", "0000:3b:00.0"]
        );
        assert!(!d.auto_reset && !d.reset_on_release);
        assert_eq!(d.max_quarantines, 3);
        assert_eq!(d.nvidia_smi, Path::new("/usr/bin/nvidia-smi"));
        let c = p(r#"{"reset_command": ["/usr/local/bin/reset-gpu", "--bus={pci}", "x"], "auto_reset": true, "max_quarantines": 5, "reset_on_release": true, "nvidia_smi": "/opt/nvidia/bin/nvidia-smi"}"#).unwrap();
        assert_eq!(c.nvidia_smi, Path::new("/opt/nvidia/bin/nvidia-smi"));
        assert_eq!(
            c.reset_command.argv("0000:3b:00.0").unwrap(),
            ["/usr/local/bin/reset-gpu", "--bus=0000:3b:00.0", "x"]
        );
        assert!(c.auto_reset && c.reset_on_release);
        assert_eq!(c.max_quarantines, 5);
        let pci = p(r#"{"reset_command": "pci"}"#).unwrap();
        assert_eq!(pci.reset_command, ResetCommand::Pci);
        assert_eq!(pci.reset_command.argv("0000:3b:00.0"), None);
        for (bad, says) in [
            (r#"{"reset_command": []}"#, "\"reset_command\" is empty"),
            (
                r#"{"reset_command": ["nvidia-smi", "-r"]}"#,
                "its program must be an absolute path, not \"nvidia-smi\"",
            ),
            (
                r#"{"reset_command": "flr"}"#,
                "\"reset_command\" must be a list of a program's absolute path and its arguments",
            ),
            (
                r#"{"reset_command": ["/bin/x", 3]}"#,
                "\"reset_command\" must be",
            ),
            (
                r#"{"max_quarantines": 0}"#,
                "\"max_quarantines\" must be at least 1",
            ),
            (
                r#"{"nvidia_smi": "nvidia-smi"}"#,
                "\"nvidia_smi\" must be an absolute path",
            ),
            (r#"{"auto_reset": "yes"}"#, "invalid type"),
        ] {
            let e = p(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
            assert!(e.starts_with("config /etc/gpuhook/config.json: "), "{e}");
        }
    }

    /// `driver_socket_owners`: account names and uids (a number or a string of digits); none
    /// by default; anything else refused naming the entry.
    #[test]
    fn driver_socket_owners() {
        assert!(p("{}").unwrap().driver_socket_owners.is_empty());
        let c = p(
            r#"{"driver_socket_owners": ["nvidia-persistenced", 998, "997", "svc_1.x", "host$"]}"#,
        )
        .unwrap();
        assert_eq!(
            c.driver_socket_owners,
            [
                SocketOwner::Name("nvidia-persistenced".into()),
                SocketOwner::Uid(998),
                SocketOwner::Uid(997),
                SocketOwner::Name("svc_1.x".into()),
                SocketOwner::Name("host$".into()),
            ]
        );
        for bad in [
            r#""""#,
            r#""-x""#,
            r#""a:b""#,
            r#""a b""#,
            r#""../x""#,
            "-1",
            "1.5",
            "4294967295",
            "true",
            r#"["x"]"#,
            r#""0123456789012345678901234567890123""#,
        ] {
            let e = p(&format!(r#"{{"driver_socket_owners": [{bad}]}}"#))
                .unwrap_err()
                .to_string();
            assert_eq!(
                e,
                format!("config /etc/gpuhook/config.json: \"driver_socket_owners\": {bad} is neither an account name nor a uid"),
            );
        }
        assert!(p(r#"{"driver_socket_owners": "nvidia-persistenced"}"#).is_err());
    }

    #[test]
    fn cdi_foreign_hooks() {
        use ForeignHooks;
        assert_eq!(p("{}").unwrap().cdi_foreign_hooks, ForeignHooks::Pass);
        for (v, want) in [
            ("pass", ForeignHooks::Pass),
            ("refuse", ForeignHooks::Refuse),
        ] {
            let c = p(&format!(r#"{{"cdi_foreign_hooks": "{v}"}}"#)).unwrap();
            assert_eq!(c.cdi_foreign_hooks, want);
        }
    }

    #[test]
    fn empty_object_is_defaults() {
        let c = p("{}").unwrap();
        assert_eq!(c.state_file, PathBuf::from(DEFAULT_STATE_FILE));
        assert_eq!(c.sysfs, PathBuf::from("/sys"));
        assert_eq!(
            c.oci_state_roots,
            [
                "/run/runc",
                "/run/crun",
                "/run/containerd/runc/k8s.io",
                "/run/containerd/runc/default"
            ]
            .map(PathBuf::from)
        );
        let c = p(r#"{"oci_state_roots": ["/run/containerd/runc/k8s.io"]}"#).unwrap();
        assert_eq!(
            c.oci_state_roots,
            [PathBuf::from("/run/containerd/runc/k8s.io")]
        );
    }

    /// libvirt's QEMU status directory: `/run/libvirt/qemu` unless the config says (an
    /// absolute path).
    #[test]
    fn libvirt_qemu_dir() {
        assert_eq!(
            p("{}").unwrap().libvirt_qemu_dir,
            PathBuf::from("/run/libvirt/qemu")
        );
        let c = p(r#"{"libvirt_qemu_dir": "/tmp/q"}"#).unwrap();
        assert_eq!(c.libvirt_qemu_dir, PathBuf::from("/tmp/q"));
        assert!(p(r#"{"libvirt_qemu_dir": "q"}"#)
            .unwrap_err()
            .to_string()
            .contains("libvirt_qemu_dir"));
    }

    #[test]
    fn errors() {
        for (t, needle) in [
            (
                r#"{"sysfs": "/sys", "colour": 1}"#,
                "unknown field `colour`",
            ),
            (r#"{"sysfs": "sys"}"#, "absolute"),
            (r#"{"state_file": "/"}"#, "names no file"),
            (r#"{"exclude": ["af:00"]}"#, "not a PCI address"),
            (
                r#"{"overrides": {"nvidia": {"arch": "x"}}}"#,
                "neither a PCI id",
            ),
            (
                r#"{"overrides": {"10de:06de": {"arch": "x", "speed": 1}}}"#,
                "unknown field `speed`",
            ),
            (r#"{"overrides": {"10de:06de": {"arch": " "}}}"#, "empty"),
            (
                r#"{"cdi_foreign_hooks": "skip"}"#,
                "\"cdi_foreign_hooks\": unknown value 'skip' (known: pass, refuse)",
            ),
            (
                r#"{"cdi_foreign_hooks": true}"#,
                "invalid type: boolean `true`, expected a string",
            ),
            (
                r#"{"oci_state_roots": ["run/runc"]}"#,
                "\"oci_state_roots\" must hold absolute paths, not \"run/runc\"",
            ),
            (
                r#"{"sharing": {"0000:04:00.0": {"replicas": 1}}}"#,
                "\"sharing\".\"0000:04:00.0\": replicas 1 is out of range (2-64)",
            ),
            (
                r#"{"sharing": {"0000:04:00.0": {"replicas": 65}}}"#,
                "replicas 65 is out of range (2-64)",
            ),
            (
                r#"{"sharing": {"0000:04:00.0": {"mode": "mps"}}}"#,
                "missing field `replicas`",
            ),
            (
                r#"{"sharing": {"10de:1028": {"replicas": 2, "mode": "mig"}}}"#,
                "\"sharing\".\"10de:1028\": unknown mode 'mig' (known: timeslice, mps)",
            ),
            (
                r#"{"sharing": {"10de:1028": {"replicas": 2, "memory_limit_mib": 512}}}"#,
                "memory_limit_mib is only for mode \"mps\"",
            ),
            (
                r#"{"sharing": {"10de:1028": {"replicas": 2, "mode": "mps", "active_thread_percentage": 0}}}"#,
                "active_thread_percentage 0 is out of range (1-100)",
            ),
            (
                r#"{"sharing": {"10de:1028": {"replicas": 2, "mode": "mps", "active_thread_percentage": 101}}}"#,
                "out of range (1-100)",
            ),
            (
                r#"{"sharing": {"gpu0": {"replicas": 2}}}"#,
                "\"sharing\".\"gpu0\": the key is neither a PCI id",
            ),
            (
                r#"{"sharing": {"10de:1028": {"replicas": 2, "slots": 3}}}"#,
                "unknown field `slots`",
            ),
            (
                r#"{"sharing": {"10de:1028": {"replicas": -2}}}"#,
                "invalid value",
            ),
            (
                r#"{"overrides": {"10de:06de": {"arch": "fermi-shared"}}}"#,
                "arch 'fermi-shared' would be Placement's CUSTOM_GPU_FERMI_SHARED",
            ),
            (
                r#"{"mps_control": "nvidia-cuda-mps-control"}"#,
                "\"mps_control\" must be an absolute path",
            ),
            ("{", "EOF"),
            ("[]", "must be a JSON object"),
            ("", "must be a JSON object"),
        ] {
            let e = p(t).expect_err(t);
            let s = e.to_string();
            assert!(s.contains(needle), "{t}: {s}");
            assert!(s.starts_with("config /etc/gpuhook/config.json: "), "{s}");
            assert!(!s.contains('\n'));
        }
    }

    #[test]
    fn sharing_by_address_wins_over_id() {
        let c = p(r#"{"sharing": {
            "0000:04:00.0": {"replicas": 3},
            "10de:1028": {"replicas": 2, "mode": "mps", "memory_limit_mib": 2048, "active_thread_percentage": 50}
        }, "mps_control": "/opt/mps/control"}"#)
        .unwrap();
        let a = c.sharing_for("0000:04:00.0", 0x10de, 0x1028).unwrap();
        assert_eq!(
            (a.mode, a.replicas, a.memory_limit_mib),
            (ShareMode::Timeslice, 3, None)
        );
        let b = c.sharing_for("0000:05:00.0", 0x10de, 0x1028).unwrap();
        assert_eq!(b.mode, ShareMode::Mps);
        assert_eq!(
            (b.memory_limit_mib, b.active_thread_percentage),
            (Some(2048), Some(50))
        );
        assert_eq!(c.sharing_for("0000:05:00.0", 0x10de, 0x1091), None);
        assert_eq!(c.mps_control, Path::new("/opt/mps/control"));
        assert_eq!(
            Config::default().mps_control,
            Path::new(DEFAULT_MPS_CONTROL)
        );
    }

    #[test]
    fn file_trust() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("c.json");
        std::fs::write(&f, "{}").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(Config::load_file(&f, true).is_ok());
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = Config::load_file(&f, true).unwrap_err().to_string();
        assert!(e.contains("refusing to trust"), "{e}");
        let missing = d.path().join("none.json");
        assert!(Config::load_file(&missing, false).unwrap().source.is_none());
        assert!(Config::load_file(&missing, true).is_err());
    }
}
