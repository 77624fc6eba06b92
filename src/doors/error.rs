//! The doors' own failures, around the crate's [`Error`]: one line each, naming the file, the
//! path or the cause, as the front door prints it.

use crate::host::config::ConfigError;
use crate::host::inventory::InventoryError;
use crate::request::metadata::ParseError;
use crate::reserve::error::Error;
use crate::reserve::state::StateError;
use std::path::PathBuf;

/// What the operator's command line could not do.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Reserve(#[from] Error),
    /// An `--output` file could not be written.
    #[error("{}: {source}", path.display())]
    Output {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: names no file", path.display())]
    OutputNoFile { path: PathBuf },
    #[error("reading stdin: {0}")]
    Stdin(#[source] std::io::Error),
    /// `check`'s domain XML could not be read.
    #[error("{file}: {source}")]
    ReadXml {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: {source}")]
    DomainXml {
        file: String,
        #[source]
        source: ParseError,
    },
    /// `attach`/`detach`: the container's device cgroup could not be taken or changed.
    #[error("{who}: {source}")]
    HotplugCgroup {
        who: String,
        #[source]
        source: crate::cgroup::CgroupError,
    },
    /// `attach`/`detach`: nothing runs under that name.
    #[error("no running libvirt domain or OCI container named '{name}'")]
    NoContainer { name: String },
    /// `attach`/`detach --domain`: no running domain by that name or UUID.
    #[error("no running libvirt domain named '{name}'")]
    NoDomain { name: String },
    /// `attach`/`detach --container`: no running OCI container of that ID.
    #[error("no running OCI container named '{name}'")]
    NoOciContainer { name: String },
    /// `attach`/`detach --vm`: no VM of that name or UUID holds GPUs.
    #[error("no vm named '{name}' holds GPUs")]
    NoVm { name: String },
    /// `attach`/`detach` of a VM: its GPUs are its `<hostdev>`s, not nodes in a container.
    #[error("{who} is a virtual machine: attach and detach change running containers; a VM's GPUs are its <hostdev>s: use 'virsh attach-device' or 'virsh detach-device' (gpuhook finds a GPU hot-plugged so in libvirt's status XML)")]
    HotplugVm { who: String },
    /// `release`: no holder of that name (or UUID, or container ID) of the kinds said.
    #[error("no {kinds} named '{name}' holds GPUs: nothing to release")]
    NothingToRelease { name: String, kinds: String },
    /// `release`/`attach`/`detach NAME` where more than one holder answers to NAME (an LXC
    /// domain, a VM, an OCI container): the operator says which.
    #[error(transparent)]
    Ambiguous(#[from] crate::reserve::lifecycle::Ambiguous),
    /// `attach`/`detach` of a Kubernetes pod's sandbox ("pause") container.
    #[error("container '{id}' is a Kubernetes pod's sandbox (pause) container: it gets no GPUs")]
    OciSandbox { id: String },
    /// The runtime's state names an init that is gone (or whose PID another process has).
    #[error("container '{id}' is not running (its init, pid {pid}, is gone)")]
    OciNotRunning { id: String, pid: i32 },
    /// The runtime's state names an init without its start time.
    #[error("container '{id}': its runtime's state records no start time of its init (pid {pid}): gpuhook cannot tell it from a later process with that PID")]
    OciNoStartTime { id: String, pid: i32 },
    /// The runtime's state names a process that is no PID namespace's init.
    #[error("container '{id}': pid {pid}, which its runtime's state names, is not the init of a PID namespace of its own")]
    OciNotInit { id: String, pid: i32 },
    /// The init is no longer in the user or mount namespace its runtime made (it unshared
    /// its own): gpuhook would act in namespaces the container chose.
    #[error("container '{id}': its init (pid {pid}) has left the {which} namespace its runtime made; refusing to change it")]
    OciLeftNamespace {
        id: String,
        pid: i32,
        which: &'static str,
    },
    /// An OCI runtime's state file cannot be read.
    #[error("{}: {source}", path.display())]
    ReadOciState {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An OCI runtime's state file names no init.
    #[error("{}: {source}", path.display())]
    OciState {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A container init's `uid_map` or `gid_map` cannot be read.
    #[error("{}: {source}", path.display())]
    ReadIdMap {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not an id mapping (ID-INSIDE ID-OUTSIDE LENGTH lines)", path.display())]
    IdMap { path: PathBuf },
    /// A libvirt status file cannot be read.
    #[error("{}: {source}", path.display())]
    ReadStatus {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A libvirt status file holds no domain gpuhook can read.
    #[error("{}: {source}", path.display())]
    StatusXml {
        path: PathBuf,
        #[source]
        source: ParseError,
    },
    /// An `attach` option is refused (it says which).
    #[error(transparent)]
    Request(#[from] crate::request::oci::OciError),
    /// A `detach --device` is no GPU selector.
    #[error("--device {sel}: {source}")]
    Selector {
        sel: String,
        #[source]
        source: crate::request::oci::DevicesError,
    },
    /// `gpuhook cdi-hook` with arguments it does not do.
    #[error("cdi-hook: {0}")]
    CdiHook(#[source] crate::cdi::HookError),
    /// `gpuhook cdi-hook`: the container's state (stdin) or its bundle's `config.json` is not
    /// JSON.
    #[error("cdi-hook: {0}")]
    CdiHookState(#[source] serde_json::Error),
    #[error("cdi-hook: the container's state names no bundle with a root.path")]
    CdiHookNoBundle,
    #[error("cdi-hook: {}: {source}", path.display())]
    ReadBundle {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `gpuhook cdi-hook`: the work in the container's root.
    #[error("cdi-hook: {0}")]
    CdiHookRoot(#[from] RuntimeError),
}

/// What the OCI runtime wrapper and its hooks could not do.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Reserve(#[from] Error),
    #[error("oci_runtime {} is not an executable file (or is gpuhook itself)", path.display())]
    NotExecutable { path: PathBuf },
    #[error("no OCI runtime found (crun or runc in {}); set \"oci_runtime\" in the config", search.join(", "))]
    NoRuntime { search: &'static [&'static str] },
    #[error("{} is larger than {max_mib} MiB", path.display())]
    TooLarge { path: PathBuf, max_mib: u64 },
    /// The bundle's `config.json` cannot be read or edited ([`crate::doors::bundle`]'s words).
    #[error(transparent)]
    Bundle(#[from] crate::doors::bundle::error::BundleError),
    #[error("no valid container ID on the runtime's command line")]
    NoContainerId,
    #[error("config.json has no root.path")]
    NoRootPath,
    #[error("container root {}: {source}", path.display())]
    RootUnresolved {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("container root {}: {source}", path.display())]
    RootUnopened {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("container root {root} is not absolute")]
    RootRelative { root: String },
    /// The container's root refuses a CDI edit ([`crate::enter::rootfs`]'s words).
    #[error(transparent)]
    Rootfs(#[from] crate::enter::rootfs::RootfsError),
    /// A path of the hook's work is not a container path ([`crate::cdi::container_path`]'s words).
    #[error(transparent)]
    CdiPath(#[from] crate::cdi::PathError),
    #[error("no work given")]
    NoWork,
    #[error("bad work: {0}")]
    BadWork(#[source] serde_json::Error),
    /// `config.json` (`what`: read, write).
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot find gpuhook's own path: {0}")]
    OwnPath(#[source] std::io::Error),
    #[error(transparent)]
    Serialize(serde_json::Error),
    #[error("the runtime passed no live container init PID")]
    NoInitPid,
    /// The host side of a create: `/dev/char` links, the private nodes, the reservation
    /// released meanwhile ([`crate::reserve::lifecycle::oci_create`]'s words).
    #[error(transparent)]
    OciCreate(#[from] crate::reserve::lifecycle::OciCreateError),
}

/// The crate's errors a door meets directly, as the crate's [`Error`] says them.
macro_rules! through_reserve {
    ($door:ident: $($e:ty),*) => {
        $(impl From<$e> for $door {
            fn from(e: $e) -> Self {
                $door::Reserve(e.into())
            }
        })*
    };
}

through_reserve!(CliError: ConfigError, InventoryError, StateError);
through_reserve!(RuntimeError: StateError);

#[cfg(test)]
mod tests {
    use super::*;

    /// The words are the product's: as they were when each was built in place.
    #[test]
    fn messages_read_as_before() {
        assert_eq!(
            RuntimeError::NoRuntime {
                search: &["/usr/bin", "/usr/sbin"]
            }
            .to_string(),
            "no OCI runtime found (crun or runc in /usr/bin, /usr/sbin); set \"oci_runtime\" in the config"
        );
        assert_eq!(
            RuntimeError::TooLarge {
                path: "/b/config.json".into(),
                max_mib: 64
            }
            .to_string(),
            "/b/config.json is larger than 64 MiB"
        );
        assert_eq!(
            RuntimeError::Io {
                what: "chmod",
                path: "/run/gpuhook/nodes/x/0-nvidia0".into(),
                source: std::io::Error::from_raw_os_error(libc::EPERM),
            }
            .to_string(),
            format!(
                "cannot chmod /run/gpuhook/nodes/x/0-nvidia0: {}",
                std::io::Error::from_raw_os_error(libc::EPERM)
            )
        );
        assert_eq!(
            RuntimeError::RootUnopened {
                path: "/c/root".into(),
                source: nix::Error::ENOENT,
            }
            .to_string(),
            format!("container root /c/root: {}", nix::Error::ENOENT)
        );
        assert_eq!(
            CliError::OutputNoFile { path: "/".into() }.to_string(),
            "/: names no file"
        );
    }
}
