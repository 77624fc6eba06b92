//! The OCI front door: `gpuhook-runtime`, a wrapper around the real runtime (runc, crun) that
//! podman, docker, containerd and CRI-O call exactly as they call runc.
//!
//! | call | what gpuhook does |
//! |---|---|
//! | `create`/`run` of a bundle asking for GPUs | reserve (key: the container ID), add the nodes, their allow rules and two hooks to `config.json` (atomically), then `exec` the real runtime; on any error one line, exit 1, nothing reserved, the runtime not called |
//! | `create`/`run` of a bundle with `gpuhook.io/allocation` (kubelet's device plugin) | the pod's allocation becomes the container's reservation (`pod_create`), then as above; its removal gives the units back to the pod |
//! | hook `createRuntime` (`gpuhook oci-hook create-runtime`) | record the container's init: the reservation is running (stale once that init is gone) |
//! | hook `poststop` (`gpuhook oci-hook poststop`), `delete` | free the container's reservation (idempotent) |
//! | anything else | `exec` the real runtime, nothing read but `config.json` on `create`/`run` |
//!
//! The wrapper becomes the real runtime by `exec` (same PID, arguments, environment, stdio
//! and inherited descriptors: console sockets, `--preserve-fds`), so a reservation made by a
//! `create` whose runtime died before recording an init is stale. Only `delete` runs the
//! runtime as a child, to free after it.

use crate::doors::bundle::file;
use crate::doors::bundle::parse::{has_user_namespace, valid_id, Policy};
use crate::doors::error::RuntimeError;
use crate::host::config::Config;
use crate::host::procfs::ProcRef;
use crate::log;
use crate::request::IdMap;
use crate::reserve::lifecycle::{self, Holder, HolderKind, LifecycleError, OciCreate};
use crate::reserve::world::World;
use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The file name engines are pointed at.
pub const NAME: &str = "gpuhook-runtime";

mod invocation;
mod oci_hook;
pub use invocation::Invocation;
pub use oci_hook::{oci_hook, root_work};

/// Where the real runtime is looked for, first `crun` then `runc` in each.
const SEARCH: [&str; 4] = ["/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"];

/// Whether the program was started as `gpuhook-runtime`.
pub fn invoked_as_runtime(argv0: &OsStr) -> bool {
    Path::new(argv0).file_name() == Some(OsStr::new(NAME))
}

/// `gpuhook-runtime ARGS…` (or `gpuhook runtime -- ARGS…`): `args` are the runtime's.
pub fn main(args: &[OsString]) -> i32 {
    let inv = Invocation::parse(args);
    // A config that exists but cannot be trusted or read names no runtime: guessing one
    // (another sandbox, another state directory) would be worse than refusing.
    let cfg = match Config::load() {
        Ok(c) => c,
        Err(e) => {
            return inv.fail(
                &format!("{e}; refusing to guess which OCI runtime to run"),
                127,
            )
        }
    };
    let runtime = match real_runtime(&cfg) {
        Ok(r) => r,
        Err(e) => return inv.fail(&e.to_string(), 127),
    };
    match inv.command.as_deref() {
        Some("create") | Some("run") => {
            let f = World::real(&cfg);
            let _reserved = match prepare_bundle(&inv, &f) {
                Ok(r) => r,
                Err(e) => {
                    let who = HolderKind::Oci.who(inv.id.as_deref().unwrap_or("?"));
                    return inv.fail(&format!("{who}: {e}"), 1);
                }
            };
            // exec returns only when the runtime could not be started: what this call
            // reserved (and only that: the ID may be another live container's) must not stay
            // reserved, and `_reserved` frees it when it goes, after the exec.
            exec(&runtime, args)
        }
        Some("delete") => delete(&cfg, &runtime, args, &inv),
        _ => exec(&runtime, args),
    }
}

/// The real runtime: config `oci_runtime`, else the first `crun`, `runc` in the usual places.
/// Never gpuhook itself (that would exec in a loop).
fn real_runtime(cfg: &Config) -> Result<PathBuf, RuntimeError> {
    let me = std::fs::canonicalize("/proc/self/exe").ok();
    let usable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            && std::fs::canonicalize(p).ok() != me
    };
    if let Some(p) = &cfg.oci_runtime {
        return if usable(p) {
            Ok(p.clone())
        } else {
            Err(RuntimeError::NotExecutable { path: p.clone() })
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
    Err(RuntimeError::NoRuntime { search: &SEARCH })
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
/// through `config.json`; returns the reservation (a guard that frees it unless the runtime
/// is `exec`ed) when it did. Nothing is left reserved or written on error.
fn prepare_bundle<'a>(
    inv: &Invocation,
    f: &World<'a>,
) -> Result<Option<OciCreate<'a>>, RuntimeError> {
    let path = inv.config_path();
    let policy = Policy {
        env_requests: f.cfg.oci_env_requests,
    };
    let Some((b, req)) = file::read(&path, policy)? else {
        return Ok(None);
    };
    let id = inv
        .id
        .as_deref()
        .filter(|i| valid_id(i))
        .ok_or(RuntimeError::NoContainerId)?;
    // Without a user namespace the runtime makes the nodes, owned by the container-side ids.
    // With one it cannot (it would bind-mount the host's node, owned by host root): gpuhook
    // makes them, owned by the host ids the request's ids map to, as for libvirt's <idmap>.
    let userns = has_user_namespace(&b.config);
    let identity = IdMap::default();
    let h = Holder::oci(id, if userns { &b.idmap } else { &identity });
    let by = ProcRef::of(std::process::id() as i32).ok_or(crate::reserve::error::Error::from(
        LifecycleError::OwnStartTime,
    ))?;
    let created = match &b.allocation {
        // kubelet's device plugin allocated the units: the pod's allocation is the
        // container's reservation.
        Some((alloc, cri)) => lifecycle::pod_create(
            f,
            alloc,
            id,
            cri.as_ref(),
            if userns { &b.idmap } else { &identity },
            &req,
            by,
        ),
        None => lifecycle::oci_create(f, &h, &req, by),
    }
    // A refusal says what to ask for instead in the bundle's words.
    .map_err(|e| e.in_words(b.wording))?;
    if let Err(e) = hand_over(&created, &path, b.config, userns) {
        return Err(created.roll_back(e));
    }
    log::info(&format!(
        "{}: added {} to {}",
        h.who(),
        created
            .nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        path.display()
    ));
    Ok(Some(created))
}

/// Hands what `c` reserved to the runtime: the container's root checked for the CDI plan,
/// the host side ([`OciCreate::host_side`]), then the edited `config.json`.
fn hand_over(
    c: &OciCreate,
    path: &Path,
    config: serde_json::Value,
    userns: bool,
) -> Result<(), RuntimeError> {
    let cdi = match &c.plan {
        Some(p) => Some((p, file::container_root(path, &config, p)?)),
        None => None,
    };
    let cdi = cdi.as_ref().map(|(p, r)| (*p, r.as_str()));
    let host = c.host_side(userns)?;
    file::write_config(
        path,
        config,
        &c.nodes,
        host.binds.as_deref(),
        c.by,
        cdi,
        host.mps.as_deref(),
    )
}

/// `delete`: runs the real runtime, then frees the container's reservation if its holder is
/// gone (its init dead, or its `create` dead before recording one). The runtime's exit status
/// alone proves nothing (`runc delete --force` of an ID another runtime root holds exits 0).
/// The runtime's status is returned.
fn delete(cfg: &Config, runtime: &Path, args: &[OsString], inv: &Invocation) -> i32 {
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
    if let Some(id) = inv.id.as_deref().filter(|i| valid_id(i)) {
        lifecycle::release_oci(&World::real(cfg), id, "delete", |r| {
            crate::reserve::reconcile::stale_reason(r).is_some()
        });
    }
    code
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
