//! The bundle's `config.json` on disk: the one bounded read of a `create`, the container's
//! root as the runtime will mount it, and the edited file written back atomically.

use super::edit::{edit, edit_mps};
use super::hooks::{HookCmd, HookToken};
use super::parse::{mentions_request, parse, Bundle, Policy};
use super::strip::strip;
use crate::doors::error::RuntimeError;
use crate::host::atomic::{replace, AtomicWrite};
use crate::host::procfs::ProcRef;
use crate::node::NodeSpec;
use crate::request::Request;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

const MAX_CONFIG: u64 = 64 << 20;

/// `create`/`run`: the bundle and its request when `config.json` asks for GPUs. One read; a
/// bundle the runtime cannot read either is the runtime's to report, one without a request
/// goes through (used again without its request: what gpuhook added before goes).
pub fn read(path: &Path, policy: Policy) -> Result<Option<(Bundle, Request)>, RuntimeError> {
    let Some((bytes, whole)) = read_bounded(path) else {
        return Ok(None);
    };
    if !mentions_request(&bytes) {
        return Ok(None);
    }
    if !whole {
        return Err(RuntimeError::TooLarge {
            path: path.to_path_buf(),
            max_mib: MAX_CONFIG >> 20,
        });
    }
    let mut b = parse(&bytes, policy).map_err(RuntimeError::Bundle)?;
    let Some(req) = b.request.take() else {
        if b.edited && strip(&mut b.config) {
            replace_config(path, &b.config)?;
        }
        return Ok(None);
    };
    Ok(Some((b, req)))
}

/// The container's root filesystem as the runtime will mount it (`root.path`, relative to the
/// bundle), checked for what the CDI plan puts there: a directory on the way to a mount or a
/// link that is a symlink (the image pointed it elsewhere) is refused, as in the libvirt door.
pub fn container_root(
    config_path: &Path,
    config: &serde_json::Value,
    plan: &crate::cdi::Plan,
) -> Result<String, RuntimeError> {
    let root = config
        .pointer("/root/path")
        .and_then(serde_json::Value::as_str)
        .ok_or(RuntimeError::NoRootPath)?;
    let bundle = config_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let root = bundle.join(root);
    let root = std::fs::canonicalize(&root)
        .map_err(|source| RuntimeError::RootUnresolved { path: root, source })?;
    let fd = nix::fcntl::open(
        &root,
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|source| RuntimeError::RootUnopened {
        path: root.clone(),
        source,
    })?;
    use crate::enter::rootfs::{check_path, split};
    for m in &plan.mounts {
        let (dir, leaf) = split(&m.target);
        check_path(&fd, dir, Some(leaf))?;
    }
    for l in &plan.links {
        check_path(&fd, split(&l.link).0, None)?;
    }
    for f in &plan.ld_folders {
        check_path(&fd, f, None)?;
    }
    Ok(root.to_string_lossy().into_owned())
}

/// Reads a regular file up to [`MAX_CONFIG`] (opened without blocking: a FIFO in its place
/// is not waited on); `true` when that was all of it. `None` when it cannot be read, or is
/// not a regular file.
fn read_bounded(path: &Path) -> Option<(Vec<u8>, bool)> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut v = Vec::with_capacity(32 * 1024);
    f.take(MAX_CONFIG + 1).read_to_end(&mut v).ok()?;
    let whole = v.len() as u64 <= MAX_CONFIG;
    Some((v, whole))
}

/// Edits the config and replaces it atomically (temp file in the same directory, rename),
/// with the old file's permissions.
pub fn write_config(
    path: &Path,
    mut config: serde_json::Value,
    nodes: &[NodeSpec],
    binds: Option<&[String]>,
    by: ProcRef,
    cdi: Option<(&crate::cdi::Plan, &str)>,
    mps: Option<&Path>,
) -> Result<(), RuntimeError> {
    let exe = own_path()?;
    let mut env = Vec::new();
    if let Some(c) =
        std::env::var_os(crate::host::config::ENV).filter(|c| Path::new(c).is_absolute())
    {
        env.push(format!(
            "{}={}",
            crate::host::config::ENV,
            c.to_string_lossy()
        ));
    }
    let hook = HookCmd {
        path: exe,
        env,
        token: HookToken(by).to_string(),
    };
    edit(&mut config, nodes, binds, &hook, cdi).map_err(RuntimeError::Bundle)?;
    if let Some(dir) = mps {
        edit_mps(&mut config, dir).map_err(RuntimeError::Bundle)?;
    }
    replace_config(path, &config)
}

/// This binary's path for the hooks: `/proc/self/exe` (during a package upgrade the running
/// file may be replaced: the kernel then appends " (deleted)", and the path names the new one).
fn own_path() -> Result<String, RuntimeError> {
    let exe = std::env::current_exe().map_err(RuntimeError::OwnPath)?;
    let exe = exe.to_string_lossy();
    Ok(exe.strip_suffix(" (deleted)").unwrap_or(&exe).to_string())
}

/// Replaces `config.json` atomically (temp file beside it, the old mode, rename).
fn replace_config(path: &Path, config: &serde_json::Value) -> Result<(), RuntimeError> {
    let bytes = serde_json::to_vec(config).map_err(RuntimeError::Serialize)?;
    let io = |what: &'static str, source: std::io::Error| RuntimeError::Io {
        what,
        path: path.to_path_buf(),
        source,
    };
    let md = std::fs::metadata(path).map_err(|e| io("read", e))?;
    let mode = md.permissions().mode();
    let owner = (md.uid(), md.gid());
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".gpuhook.tmp");
    let tmp = PathBuf::from(tmp);
    let r = AtomicWrite {
        dir: nix::fcntl::AT_FDCWD,
        tmp: &tmp,
        name: path,
        mode: 0o666,
        chmod: Some(mode & 0o7777),
        owner: Some(owner),
        clear_stale: true,
        // No fsync: the rename is what makes the edit atomic for the runtime reading it;
        // a bundle does not outlive a host crash (engines make a new one).
        durable: false,
    };
    replace(&r, &bytes).map_err(|(_, e)| io("write", e.into()))
}
