//! Why the specs give no [`Plan`](super::Plan): the plan's errors name the spec file, an
//! edit's say what is wrong with it.

use std::path::PathBuf;

/// Why a plan cannot be made. Each message is one line naming the spec file.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// No spec of the chosen GPUs' kind.
    #[error("driver \"cdi\": no CDI spec for {kind} in {dirs}; write one with `{generator}`")]
    NoSpec {
        kind: &'static str,
        dirs: String,
        generator: &'static str,
    },
    /// Two files of one directory define the same device.
    #[error("CDI device {kind}={name} is defined in both {} and {}", .first.display(), .second.display())]
    DefinedTwice {
        kind: &'static str,
        name: String,
        first: PathBuf,
        second: PathBuf,
    },
    /// A chosen unit has no device of its own in the specs.
    #[error("CDI specs for {kind} ({specs}) have no device for {unit} ({nodes}); regenerate them with `{generator}`")]
    Uncovered {
        kind: &'static str,
        specs: String,
        unit: String,
        nodes: String,
        generator: &'static str,
    },
    /// A device's edits.
    #[error("CDI spec {} device {name}: {source}", .spec.display())]
    Device {
        spec: PathBuf,
        name: String,
        source: Box<EditError>,
    },
    /// A spec's common edits.
    #[error("CDI spec {}: {source}", .spec.display())]
    Common {
        spec: PathBuf,
        source: Box<EditError>,
    },
    /// A link and a mount at one place.
    #[error("CDI specs both mount at and link {0}; refusing")]
    MountAndLink(String),
}

/// What is wrong with one edit of a spec.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    /// A container path of the spec that is not a plain absolute one.
    #[error(transparent)]
    Path(#[from] PathError),
    /// An argument of a hook gpuhook does itself that is not what it must be.
    #[error(transparent)]
    Hook(#[from] HookError),
    #[error("deviceNode {0} is not under /dev")]
    NodeNotUnderDev(String),
    #[error("deviceNode {path} is of type '{kind}': only character devices are given")]
    NodeType { path: String, kind: String },
    #[error("hostPath '{0}' is not absolute")]
    HostPathRelative(String),
    #[error("deviceNode {path}: host node {}: {source}", .host.display())]
    HostNode {
        path: String,
        host: PathBuf,
        source: std::io::Error,
    },
    #[error("deviceNode {path}: host node {} is {what}, not a character device", .host.display())]
    HostNodeNotChar {
        path: String,
        host: PathBuf,
        what: &'static str,
    },
    #[error("deviceNode {path} says {}:{}, the host node {} is {major}:{minor}", .said.0, .said.1, .host.display())]
    NumberMismatch {
        path: String,
        said: (i64, i64),
        host: PathBuf,
        major: u32,
        minor: u32,
    },
    #[error("deviceNode {path}: permissions '{perms}' are not rwm")]
    Permissions { path: String, perms: String },
    /// A spec's common edits give another GPU's node.
    #[error("its common edits give {path} ({major}:{minor}), another GPU's node")]
    ForeignNode {
        path: String,
        major: u32,
        minor: u32,
    },
    #[error("intelRdt edits are not supported by gpuhook")]
    IntelRdt,
    #[error("netDevices edits are not supported by gpuhook")]
    NetDevices,
    #[error("deviceNode {path} is {}:{} here and {}:{} elsewhere", .here.0, .here.1, .there.0, .there.1)]
    NodeConflict {
        path: String,
        here: (u32, u32),
        there: (u32, u32),
    },
    #[error("mount at {target} is {from} here and {other} elsewhere")]
    MountConflict {
        target: String,
        from: String,
        other: String,
    },
    #[error("env '{0}' is not NAME=VALUE")]
    Env(String),
    #[error("mount at {target} is of type '{kind}': only bind mounts are given")]
    MountType { target: String, kind: String },
    #[error("mount at {target}: option '{option}' is not one gpuhook applies")]
    MountOption { target: String, option: String },
    #[error("mount hostPath '{0}' is not absolute")]
    MountHostRelative(String),
    #[error("mount at {0}: that is where gpuhook mounts an MPS daemon's directories; refusing")]
    MpsTarget(String),
    #[error("mount source {path}: {source}")]
    MountSource {
        path: String,
        source: std::io::Error,
    },
    /// A mounted library of another NVIDIA driver than the running one.
    #[error("mount source {path} is of NVIDIA driver {ver}, the host runs {running}: the spec is for another driver; regenerate it with `{generator}`")]
    StaleDriver {
        path: String,
        ver: String,
        running: String,
        generator: &'static str,
    },
    #[error("hook stage '{0}' is not an OCI hook")]
    HookStage(String),
    #[error("hook path '{0}' is not absolute")]
    HookPath(String),
    /// A hook gpuhook does not do itself, refused by the host config.
    #[error("{stage} hook {path}{arg} is not one gpuhook does itself, and the host config refuses such hooks (\"cdi_foreign_hooks\": \"refuse\")")]
    ForeignHook {
        stage: String,
        path: String,
        arg: String,
    },
}

/// A container path that is not absolute, or not plain (`what` names whose path it is).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("{what} '{path}' is not absolute")]
    NotAbsolute { what: &'static str, path: String },
    #[error("{what} '{path}' is not a plain absolute path")]
    NotPlain { what: &'static str, path: String },
}

/// What is wrong with the arguments of an NVIDIA hook gpuhook does itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookError {
    /// A flag given without its value (`update-ldcache: --folder needs a value`).
    #[error("{sub}: --{flag} needs a value")]
    NoValue {
        sub: &'static str,
        flag: &'static str,
    },
    #[error("create-symlinks: --link '{0}' is not TARGET::LINK")]
    NotTargetLink(String),
    #[error("create-symlinks: target '{0}' is not valid")]
    BadTarget(String),
    /// `gpuhook cdi-hook` with arguments that are neither of the two hooks.
    #[error("'{0}' is not create-symlinks --link TARGET::LINK… or update-ldcache --folder DIR…")]
    NotNative(String),
    /// A link or a cache folder that is not a plain container path.
    #[error(transparent)]
    Path(#[from] PathError),
}
