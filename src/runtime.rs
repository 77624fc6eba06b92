//! The OCI front door: `gpuhook-runtime`, a wrapper around the real runtime (runc, crun) that
//! podman, docker, containerd and CRI-O call exactly as they call runc.
//!
//! | call | what gpuhook does |
//! |---|---|
//! | `create`/`run` of a bundle asking for GPUs | reserve (key: the container ID), add the nodes, their allow rules and two hooks to `config.json` (atomically), then `exec` the real runtime; on any error one line, exit 1, nothing reserved, the runtime not called |
//! | hook `createRuntime` (`gpuhook oci-hook create-runtime`) | record the container's init: the reservation is running (stale once that init is gone) |
//! | hook `poststop` (`gpuhook oci-hook poststop`), `delete` | free the container's reservation (idempotent) |
//! | anything else | `exec` the real runtime, nothing read but `config.json` on `create`/`run` |
//!
//! The wrapper becomes the real runtime by `exec` (same PID, arguments, environment, stdio
//! and inherited descriptors: console sockets, `--preserve-fds`), so a reservation made by a
//! `create` whose runtime died before recording an init is stale. Only `delete` runs the
//! runtime as a child, to free after it.

use crate::config::Config;
use crate::container::NodeSpec;
use crate::error::Error;
use crate::lifecycle::{self, Holder, HolderKind};
use crate::log;
use crate::oci::{self, HookCmd};
use crate::procfs::ProcRef;
use crate::request::IdMap;
use std::ffi::{CString, OsStr, OsString};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The file name engines are pointed at.
pub const NAME: &str = "gpuhook-runtime";
const MAX_CONFIG: u64 = 64 << 20;
/// Where the real runtime is looked for, first `crun` then `runc` in each.
const SEARCH: [&str; 4] = ["/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"];

/// Whether the program was started as `gpuhook-runtime`.
pub fn invoked_as_runtime(argv0: &OsStr) -> bool {
    Path::new(argv0).file_name() == Some(OsStr::new(NAME))
}

/// What the wrapper needs from a runtime command line: the command, the container ID and
/// where its config is. Options are runc's and crun's; an unknown `--opt` is taken for a
/// flag (`--opt=value` carries its value).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Invocation {
    pub command: Option<String>,
    pub id: Option<String>,
    pub bundle: Option<PathBuf>,
    /// crun's `--config FILE` (`-f`): the config instead of `BUNDLE/config.json`.
    pub config: Option<PathBuf>,
    /// The global `--log FILE` and `--log-format` (`text`, `json`): where engines read the
    /// runtime's error from (containerd's shim reads nothing else).
    pub log: Option<PathBuf>,
    pub log_format: Option<String>,
}

/// Global options that take a value (runc, crun).
const GLOBAL_VALUED: [&str; 7] = [
    "--root",
    "--log",
    "--log-format",
    "--log-level",
    "--criu",
    "--cgroup-manager",
    "--rootless",
];
/// `create`/`run`/`delete` options that take a value.
const COMMAND_VALUED: [&str; 8] = [
    "-b",
    "--bundle",
    "--console-socket",
    "--pid-file",
    "--preserve-fds",
    "-f",
    "--config",
    "--criu",
];

impl Invocation {
    pub fn parse(args: &[OsString]) -> Invocation {
        let mut inv = Invocation::default();
        let mut it = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .peekable();
        // Global options, up to the command.
        while let Some(a) = it.next() {
            let (name, inline) = match a.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
                _ => (a.as_str(), None),
            };
            if matches!(name, "--log" | "--log-format") {
                let v = if inline.is_some() { inline } else { it.next() };
                if name == "--log" {
                    inv.log = v.map(PathBuf::from);
                } else {
                    inv.log_format = v;
                }
            } else if a == "--rootless" {
                // runc: `--rootless VALUE`; crun: `--rootless[=VALUE]`.
                if it
                    .peek()
                    .is_some_and(|v| matches!(v.as_str(), "true" | "false" | "auto"))
                {
                    it.next();
                }
            } else if GLOBAL_VALUED.contains(&a.as_str()) {
                it.next();
            } else if !a.starts_with('-') {
                inv.command = Some(a);
                break;
            }
        }
        let mut positional_only = false;
        while let Some(a) = it.next() {
            if positional_only || !a.starts_with('-') || a == "-" {
                if inv.id.is_none() {
                    inv.id = Some(a);
                }
                continue;
            }
            if a == "--" {
                positional_only = true;
                continue;
            }
            let (name, inline) = match a.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
                _ => (a.clone(), None),
            };
            if !COMMAND_VALUED.contains(&name.as_str()) {
                continue;
            }
            let value = inline.or_else(|| it.next());
            match name.as_str() {
                "-b" | "--bundle" => inv.bundle = value.map(PathBuf::from),
                "-f" | "--config" => inv.config = value.map(PathBuf::from),
                _ => {}
            }
        }
        inv
    }

    /// Appends the refusal to the runtime's `--log` as runc writes its own errors there
    /// (logrus JSON or text lines): docker and containerd show the last error of that file.
    pub fn log_error(&self, msg: &str) {
        let Some(path) = &self.log else { return };
        let msg = format!("gpuhook: {}", crate::error::one_line(msg, 2000));
        let time = crate::state::now_rfc3339();
        let line = if self.log_format.as_deref() == Some("json") {
            serde_json::json!({"level": "error", "msg": msg, "time": time}).to_string()
        } else {
            format!(
                "time=\"{time}\" level=error msg={}",
                serde_json::Value::from(msg)
            )
        };
        let _ = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .and_then(|mut f| writeln!(f, "{line}"));
    }

    /// The bundle's `config.json` (relative paths are the runtime's working directory's).
    pub fn config_path(&self) -> PathBuf {
        match (&self.config, &self.bundle) {
            (Some(c), Some(b)) if c.is_relative() => b.join(c),
            (Some(c), _) => c.clone(),
            (None, Some(b)) => b.join("config.json"),
            (None, None) => PathBuf::from("config.json"),
        }
    }
}

/// `gpuhook-runtime ARGS…` (or `gpuhook runtime -- ARGS…`): `args` are the runtime's.
pub fn main(args: &[OsString]) -> i32 {
    let inv = Invocation::parse(args);
    let cfg = Config::load();
    let runtime = match real_runtime(cfg.as_ref().ok()) {
        Ok(r) => r,
        Err(e) => {
            // Without a config the default runtime still runs other containers.
            log::error(&match &cfg {
                Err(c) => format!("{e} ({c})"),
                Ok(_) => e,
            });
            return 127;
        }
    };
    match inv.command.as_deref() {
        Some("create") | Some("run") => {
            if let Err(e) = prepare_bundle(&inv) {
                let who = HolderKind::Oci.who(inv.id.as_deref().unwrap_or("?"));
                let msg = format!("{who}: {e}");
                log::error(&msg);
                inv.log_error(&msg);
                return 1;
            }
            let code = exec(&runtime, args);
            // exec returned: the runtime could not be started; nothing may stay reserved.
            if let (Some(id), Ok(c)) = (&inv.id, &cfg) {
                let _ = lifecycle::free(c, HolderKind::Oci, id);
            }
            code
        }
        Some("delete") => delete(&runtime, args, &inv),
        _ => exec(&runtime, args),
    }
}

/// The real runtime: config `oci_runtime`, else the first `crun`, `runc` in the usual places.
/// Never gpuhook itself (that would exec in a loop).
fn real_runtime(cfg: Option<&Config>) -> Result<PathBuf, String> {
    let me = std::fs::canonicalize("/proc/self/exe").ok();
    let usable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            && std::fs::canonicalize(p).ok() != me
    };
    if let Some(p) = cfg.and_then(|c| c.oci_runtime.as_ref()) {
        return if usable(p) {
            Ok(p.clone())
        } else {
            Err(format!(
                "oci_runtime {} is not an executable file (or is gpuhook itself)",
                p.display()
            ))
        };
    }
    for name in ["crun", "runc"] {
        for dir in SEARCH {
            let p = Path::new(dir).join(name);
            if usable(&p) {
                return Ok(p);
            }
        }
    }
    Err(format!(
        "no OCI runtime found (crun or runc in {}); set \"oci_runtime\" in the config",
        SEARCH.join(", ")
    ))
}

/// Becomes the real runtime with the same arguments; returns only when that fails.
fn exec(runtime: &Path, args: &[OsString]) -> i32 {
    let c = |s: &OsStr| CString::new(s.as_bytes());
    let argv: Result<Vec<CString>, _> = std::iter::once(runtime.as_os_str())
        .chain(args.iter().map(OsString::as_os_str))
        .map(c)
        .collect();
    let (Ok(path), Ok(argv)) = (c(runtime.as_os_str()), argv) else {
        log::error("an argument contains a NUL byte");
        return 127;
    };
    let e = nix::unistd::execv(&path, &argv).unwrap_err();
    log::error(&format!(
        "cannot run the OCI runtime {}: {e}",
        runtime.display()
    ));
    127
}

/// `create`/`run`: when the bundle asks for GPUs, reserve them and hand them to the runtime
/// through `config.json`. Nothing is left reserved or written on error.
fn prepare_bundle(inv: &Invocation) -> Result<(), Error> {
    let path = inv.config_path();
    // One read; a bundle the runtime cannot read either is the runtime's to report.
    let Ok(bytes) = read_bounded(&path) else {
        return Ok(());
    };
    if !oci::mentions_request(&bytes) {
        return Ok(());
    }
    let b = oci::parse(&bytes).map_err(Error::Other)?;
    let Some(req) = b.request else {
        return Ok(());
    };
    let id = inv
        .id
        .as_deref()
        .filter(|i| oci::valid_id(i))
        .ok_or_else(|| Error::other("no valid container ID on the runtime's command line"))?;
    // The runtime makes the nodes: the owner is the container-side id (it maps them).
    let ids = IdMap::default();
    let h = Holder {
        kind: HolderKind::Oci,
        name: id,
        id,
        idmap: &ids,
    };
    let nodes = lifecycle::reserve_nodes(&h, &req)?;
    let written = write_config(&path, b.config, &nodes);
    if let Err(e) = written {
        let cfg = Config::load()?;
        lifecycle::free(&cfg, HolderKind::Oci, id)?;
        return Err(e);
    }
    log::info(&format!(
        "{}: added {} to {}",
        h.who(),
        nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        path.display()
    ));
    Ok(())
}

fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut v = Vec::with_capacity(32 * 1024);
    std::fs::File::open(path)?
        .take(MAX_CONFIG)
        .read_to_end(&mut v)?;
    Ok(v)
}

/// Edits the config and replaces it atomically (temp file in the same directory, rename),
/// with the old file's permissions.
fn write_config(
    path: &Path,
    mut config: serde_json::Value,
    nodes: &[NodeSpec],
) -> Result<(), Error> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::other(format!("cannot find gpuhook's own path: {e}")))?;
    let mut env = Vec::new();
    if let Some(c) = std::env::var_os(crate::config::ENV).filter(|c| Path::new(c).is_absolute()) {
        env.push(format!("{}={}", crate::config::ENV, c.to_string_lossy()));
    }
    let hook = HookCmd {
        path: exe.to_string_lossy().into_owned(),
        env,
    };
    oci::edit(&mut config, nodes, &hook).map_err(Error::Other)?;
    let bytes = serde_json::to_vec(&config).map_err(|e| Error::other(e.to_string()))?;
    let io = |what: &str, e: std::io::Error| {
        Error::other(format!("cannot {what} {}: {e}", path.display()))
    };
    let mode = std::fs::metadata(path)
        .map_err(|e| io("read", e))?
        .permissions()
        .mode();
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".gpuhook.tmp");
    let tmp = PathBuf::from(tmp);
    let result = (|| {
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))?;
        f.write_all(&bytes)?;
        // No fsync: the rename is what makes the edit atomic for the runtime reading it;
        // a bundle does not outlive a host crash (engines make a new one).
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(io("write", e));
    }
    Ok(())
}

/// `delete`: runs the real runtime, then frees the container's reservation when the runtime
/// deleted it, or when its holder is gone anyway (stale). The runtime's status is returned.
fn delete(runtime: &Path, args: &[OsString], inv: &Invocation) -> i32 {
    let status = std::process::Command::new(runtime).args(args).status();
    let code = match &status {
        Ok(s) => s
            .code()
            .unwrap_or_else(|| 128 + std::os::unix::process::ExitStatusExt::signal(s).unwrap_or(0)),
        Err(e) => {
            log::error(&format!(
                "cannot run the OCI runtime {}: {e}",
                runtime.display()
            ));
            127
        }
    };
    if let Some(id) = inv.id.as_deref().filter(|i| oci::valid_id(i)) {
        release(id, code == 0, "delete");
    }
    code
}

/// Frees the container's reservation (`deleted`: its runtime says it is gone; otherwise only
/// when the reservation is stale). Errors are logged: the caller's status stands.
fn release(id: &str, deleted: bool, stage: &str) {
    let Ok(cfg) = Config::load() else {
        return;
    };
    if !lifecycle::may_hold(&cfg, id) {
        return;
    }
    let who = HolderKind::Oci.who(id);
    if !deleted {
        let stale = crate::state::Store::new(&cfg.state_file)
            .read()
            .ok()
            .and_then(|st| st.reservations.get(id).cloned())
            .filter(|r| r.kind == HolderKind::Oci)
            .and_then(|r| lifecycle::stale_reason(&r));
        if stale.is_none() {
            return;
        }
    }
    match lifecycle::free(&cfg, HolderKind::Oci, id) {
        Ok(Some(r)) => log::info(&format!("{who}: {stage}: freed {}", r.gpus.join(","))),
        Ok(None) => {}
        Err(e) => log::error(&format!("{who}: {stage}: cannot free its GPUs: {e}")),
    }
}

/// `gpuhook oci-hook STAGE`: the hooks gpuhook adds to a GPU container's config; the
/// runtime's state JSON (`id`, `pid`) on stdin.
pub fn oci_hook(stage: &str) -> i32 {
    let mut buf = Vec::new();
    if let Err(e) = std::io::stdin().take(1 << 20).read_to_end(&mut buf) {
        log::error(&format!(
            "oci-hook {stage}: reading the container state: {e}"
        ));
        return 1;
    }
    let state: oci::HookState = match serde_json::from_slice(&buf) {
        Ok(s) => s,
        Err(e) => {
            log::error(&format!(
                "oci-hook {stage}: the container state is not valid: {e}"
            ));
            return 1;
        }
    };
    if !oci::valid_id(&state.id) {
        log::error(&format!("oci-hook {stage}: invalid container ID"));
        return 1;
    }
    let who = HolderKind::Oci.who(&state.id);
    match stage {
        oci::CREATE_RUNTIME => {
            let ids = IdMap::default();
            let h = Holder {
                kind: HolderKind::Oci,
                name: &state.id,
                id: &state.id,
                idmap: &ids,
            };
            let recorded = state
                .pid
                .and_then(ProcRef::of)
                .ok_or_else(|| Error::other("the runtime passed no live container init PID"))
                .and_then(|init| lifecycle::record_init(&h, init));
            match recorded {
                Ok(()) => 0,
                Err(e) => {
                    log::error(&format!("{who}: createRuntime: {e}"));
                    1
                }
            }
        }
        oci::POSTSTOP => {
            release(&state.id, true, "poststop");
            0
        }
        other => {
            log::error(&format!("{who}: unknown oci-hook stage '{other}'"));
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Invocation {
        Invocation::parse(&args.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn finds_command_id_and_bundle_as_engines_call() {
        // podman (conmon) with runc.
        let i = p(&[
            "--root",
            "/run/runc",
            "--systemd-cgroup",
            "--log",
            "/x/log.json",
            "--log-format",
            "json",
            "create",
            "--bundle",
            "/b/userdata",
            "--pid-file",
            "/b/pidfile",
            "--console-socket",
            "/b/sock",
            "--preserve-fds",
            "2",
            "abc123",
        ]);
        assert_eq!(i.command.as_deref(), Some("create"));
        assert_eq!(i.id.as_deref(), Some("abc123"));
        assert_eq!(i.config_path(), PathBuf::from("/b/userdata/config.json"));
        assert_eq!(i.log, Some(PathBuf::from("/x/log.json")));
        assert_eq!(i.log_format.as_deref(), Some("json"));
        // docker/containerd (shim) style, with = forms; crun's --config.
        let i = p(&[
            "--root=/r",
            "--log-format=json",
            "run",
            "-d",
            "-b",
            "/bb",
            "--config=c2.json",
            "ctr",
        ]);
        assert_eq!(
            (i.command.as_deref(), i.id.as_deref()),
            (Some("run"), Some("ctr"))
        );
        assert_eq!(i.config_path(), PathBuf::from("/bb/c2.json"));
        // runc's --rootless VALUE, then no bundle: the working directory's config.
        let i = p(&["--rootless", "false", "create", "--no-pivot", "x1"]);
        assert_eq!(
            (i.command.as_deref(), i.id.as_deref()),
            (Some("create"), Some("x1"))
        );
        assert_eq!(i.config_path(), PathBuf::from("config.json"));
        let i = p(&["delete", "--force", "x2"]);
        assert_eq!(
            (i.command.as_deref(), i.id.as_deref()),
            (Some("delete"), Some("x2"))
        );
        let i = p(&["--version"]);
        assert_eq!(i, Invocation::default());
        let i = p(&["state", "--", "-odd"]);
        assert_eq!(i.id.as_deref(), Some("-odd"));
    }

    #[test]
    fn runtime_name() {
        assert!(invoked_as_runtime(OsStr::new("/usr/bin/gpuhook-runtime")));
        assert!(invoked_as_runtime(OsStr::new("gpuhook-runtime")));
        assert!(!invoked_as_runtime(OsStr::new("/usr/bin/gpuhook")));
    }
}
