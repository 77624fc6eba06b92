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

use crate::doors::bundle::{self, HookCmd};
use crate::doors::error::RuntimeError;
use crate::host::atomic::{replace, AtomicWrite};
use crate::host::config::Config;
use crate::host::procfs::ProcRef;
use crate::log;
use crate::node::NodeSpec;
use crate::request::IdMap;
use crate::reserve::error::Error;
use crate::reserve::facts::Facts;
use crate::reserve::lifecycle::{self, Holder, HolderKind};
use crate::reserve::state::Reservation;
use std::ffi::{CString, OsStr, OsString};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The file name engines are pointed at.
pub const NAME: &str = "gpuhook-runtime";
const MAX_CONFIG: u64 = 64 << 20;

mod invocation;
pub use invocation::Invocation;

/// Where the real runtime is looked for, first `crun` then `runc` in each.
const SEARCH: [&str; 4] = ["/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"];

/// Whether the program was started as `gpuhook-runtime`.
pub fn invoked_as_runtime(argv0: &OsStr) -> bool {
    Path::new(argv0).file_name() == Some(OsStr::new(NAME))
}

/// The holder of a container's reservation as this door builds it: the container ID is its
/// name and its key.
fn holder<'a>(id: &'a str, idmap: &'a IdMap) -> Holder<'a> {
    Holder {
        kind: HolderKind::Oci,
        name: id,
        id,
        idmap,
    }
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
            let reserved = match prepare_bundle(&inv, &cfg) {
                Ok(r) => r,
                Err(e) => {
                    let who = HolderKind::Oci.who(inv.id.as_deref().unwrap_or("?"));
                    return inv.fail(&format!("{who}: {e}"), 1);
                }
            };
            let code = exec(&runtime, args);
            // exec returned: the runtime could not be started; what this call reserved (and
            // only that: the ID may be another live container's) must not stay reserved.
            if let (Some(id), Some(by)) = (&inv.id, reserved) {
                let _ = free_oci(&cfg, id, |r| r.prepared_by == Some(by));
            }
            code
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
/// through `config.json`; returns the reserving process (the hooks' token) when it did.
/// Nothing is left reserved or written on error.
fn prepare_bundle(inv: &Invocation, cfg: &Config) -> Result<Option<ProcRef>, RuntimeError> {
    let path = inv.config_path();
    // One read; a bundle the runtime cannot read either is the runtime's to report.
    let Some((bytes, whole)) = read_bounded(&path) else {
        return Ok(None);
    };
    if !bundle::mentions_request(&bytes) {
        return Ok(None);
    }
    if !whole {
        return Err(RuntimeError::TooLarge {
            path,
            max_mib: MAX_CONFIG >> 20,
        });
    }
    let policy = bundle::Policy {
        env_requests: cfg.oci_env_requests,
    };
    let mut b = bundle::parse(&bytes, policy).map_err(RuntimeError::Bundle)?;
    let Some(req) = b.request else {
        // A bundle used again without its request: what gpuhook added before goes.
        if b.edited && bundle::strip(&mut b.config) {
            replace_config(&path, &b.config)?;
        }
        return Ok(None);
    };
    let id = inv
        .id
        .as_deref()
        .filter(|i| bundle::valid_id(i))
        .ok_or(RuntimeError::NoContainerId)?;
    // Without a user namespace the runtime makes the nodes, owned by the container-side ids.
    // With one it cannot (it would bind-mount the host's node, owned by host root): gpuhook
    // makes them, owned by the host ids the request's ids map to, as for libvirt's <idmap>.
    let userns = bundle::has_user_namespace(&b.config);
    let identity = IdMap::default();
    let h = holder(id, if userns { &b.idmap } else { &identity });
    let ((nodes, plan), by) = lifecycle::reserve_nodes(cfg, &h, &req)?;
    let cdi = match &plan {
        Some(p) => match container_root(&path, &b.config, p) {
            Ok(r) => Some((p, r)),
            Err(e) => {
                free_oci(cfg, id, |r| r.prepared_by == Some(by))?;
                return Err(e);
            }
        },
        None => None,
    };
    let cdi = cdi.as_ref().map(|(p, r)| (*p, r.as_str()));
    // runc's systemd driver hands systemd only the rules whose /dev/char entry exists: without
    // one, the GPU is gone from the container at the next `systemctl daemon-reload`.
    if let Err(e) = char_links(cfg, &nodes) {
        free_oci(cfg, id, |r| r.prepared_by == Some(by))?;
        return Err(e);
    }
    let mps = lifecycle::mps_dir(cfg, id);
    let written = if userns {
        make_private_nodes(cfg, id, by, &nodes).and_then(|srcs| {
            write_config(
                &path,
                b.config,
                &nodes,
                Some(&srcs),
                by,
                cdi,
                mps.as_deref(),
            )
        })
    } else {
        write_config(&path, b.config, &nodes, None, by, cdi, mps.as_deref())
    };
    if let Err(e) = written {
        free_oci(cfg, id, |r| r.prepared_by == Some(by))?;
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
    Ok(Some(by))
}

/// The host's `/dev/char/MAJ:MIN` entry of each node (under the config's device root), made
/// when missing ([`crate::host::charlink`]); a node with no host node of that number to link
/// to is left without one, an entry that leads elsewhere refuses the create.
fn char_links(cfg: &Config, nodes: &[NodeSpec]) -> Result<(), RuntimeError> {
    for n in nodes {
        crate::host::charlink::ensure_logged(&cfg.dev, &n.path, n.major, n.minor)?;
    }
    Ok(())
}

/// `createContainer` (the runtime has made the container's mounts, before it enters the
/// root): the CDI `create-symlinks` and `update-ldcache` in the container's root, as the
/// libvirt door does them ([`crate::enter::rootfs`]); undone on failure. Returns what was left as
/// it was, for the log.
fn cdi_hook(arg: Option<&str>) -> Result<Vec<String>, RuntimeError> {
    let work: bundle::CdiWork = arg
        .ok_or(RuntimeError::NoWork)
        .and_then(|a| serde_json::from_str(a).map_err(RuntimeError::BadWork))?;
    root_work(&work.root, work.links, work.folders)
}

/// The CDI links and linker cache in the container's root `root` (absolute: where the
/// runtime mounted it; the hook runs in the container's namespaces before it pivots into
/// it): what gpuhook's own `cdi` hook and `gpuhook cdi-hook` (a generated spec's hooks) do,
/// as the libvirt door does it ([`crate::enter::rootfs`]); undone on failure. Returns what
/// was left as it was, for the log.
pub(crate) fn root_work(
    root: &str,
    links: Vec<crate::cdi::Link>,
    folders: Vec<String>,
) -> Result<Vec<String>, RuntimeError> {
    if !Path::new(root).is_absolute() {
        return Err(RuntimeError::RootRelative { root: root.into() });
    }
    for p in links.iter().map(|l| &l.link).chain(&folders) {
        crate::cdi::container_path(p, "path").map_err(RuntimeError::CdiPath)?;
    }
    let root_fd = nix::fcntl::open(
        root,
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|source| RuntimeError::RootUnopened {
        path: PathBuf::from(root),
        source,
    })?;
    let plan = crate::cdi::Plan {
        links,
        ld_folders: folders,
        ..Default::default()
    };
    let ld = if plan.ld_folders.is_empty() {
        None
    } else {
        Some(crate::enter::rootfs::ldconfig::host_ldconfig().map_err(RuntimeError::Rootfs)?)
    };
    // The runtime runs this hook in the container's namespaces, user namespace included:
    // uid 0 here is the container's root, whether or not it is host root. (It runs from the
    // container's init, in its cgroups: ldconfig is there already. CAP_SYS_ADMIN of the
    // container's user namespace stays for ldconfig's own namespaces and nodev view.)
    let owner = crate::enter::rootfs::Owner { uid: 0, gid: 0 };
    crate::enter::rootfs::act_as(owner, ld.is_some()).map_err(RuntimeError::Rootfs)?;
    crate::enter::rootfs::apply(&root_fd, Vec::new(), &plan, ld.as_ref(), owner, &[])
        .map(|d| d.notes)
        .map_err(RuntimeError::Rootfs)
}

/// The container's root filesystem as the runtime will mount it (`root.path`, relative to the
/// bundle), checked for what the CDI plan puts there: a directory on the way to a mount or a
/// link that is a symlink (the image pointed it elsewhere) is refused, as in the libvirt door.
fn container_root(
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

/// Where gpuhook makes the nodes of user-namespaced containers: beside the state (root
/// only, on tmpfs), one directory per container ID.
fn nodes_root(cfg: &Config) -> PathBuf {
    cfg.state_file
        .parent()
        .unwrap_or(Path::new("/run/gpuhook"))
        .join("nodes")
}

/// Makes the nodes (numbers from the host's nodes, owner and mode from the request mapped
/// through the container's user namespace) for the runtime to bind-mount; returns their
/// paths. All under the state lock, so that no free or sweep races it: only while the ID's
/// reservation is still this create's (`by`); directories of IDs that hold no container
/// reservation are removed on the way.
fn make_private_nodes(
    cfg: &Config,
    id: &str,
    by: ProcRef,
    nodes: &[NodeSpec],
) -> Result<Vec<String>, RuntimeError> {
    use nix::sys::stat::{mknod, Mode, SFlag};
    lifecycle::with_state(cfg, |st| {
        if !st
            .reservations
            .get(id)
            .is_some_and(|r| r.kind == HolderKind::Oci && r.prepared_by == Some(by))
        {
            return Err(RuntimeError::Released);
        }
        let io = |what: &'static str, p: &Path, source: std::io::Error| RuntimeError::Io {
            what,
            path: p.to_path_buf(),
            source,
        };
        let root = nodes_root(cfg);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(&root)
            .map_err(|e| io("create", &root, e))?;
        nodes_mount(&root).map_err(|e| io("mount a tmpfs at", &root, e))?;
        sweep(cfg, st);
        let dir = root.join(id);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| io("create", &dir, e))?;
        let mut out = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            let base = Path::new(&n.path)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            let p = dir.join(format!("{i}-{base}"));
            mknod(
                &p,
                SFlag::S_IFCHR,
                Mode::from_bits_truncate(0o600),
                libc::makedev(n.major, n.minor),
            )
            .map_err(|source| RuntimeError::Mknod {
                path: p.clone(),
                source,
            })?;
            std::os::unix::fs::chown(&p, Some(n.uid), Some(n.gid))
                .map_err(|e| io("chown", &p, e))?;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(n.mode & 0o777))
                .map_err(|e| io("chmod", &p, e))?;
            out.push(p.to_string_lossy().into_owned());
        }
        Ok(out)
    })
}

/// Makes `root` a filesystem the runtime can bind nodes from into a user namespace: where it
/// lies on a `nodev` mount, or one without `relatime` (systemd mounts `/run` `nodev` and
/// `strictatime`), a tmpfs of its own (`nosuid,noexec`, relatime, mode 0700) is mounted there
/// once. A mount made in the user namespace keeps its source's flags locked: runc's remount
/// of the bind (`bind,nosuid,noexec`) would clear a locked `nodev` or change a locked atime
/// mode, and the kernel refuses it (EPERM: "error mounting … operation not permitted").
fn nodes_mount(root: &Path) -> std::io::Result<()> {
    use nix::sys::statvfs::{statvfs, FsFlags};
    let f = statvfs(root)?.flags();
    if !f.contains(FsFlags::ST_NODEV) && f.contains(FsFlags::ST_RELATIME) {
        return Ok(());
    }
    use nix::mount::{mount, MsFlags};
    mount(
        Some("gpuhook-nodes"),
        root,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC | MsFlags::MS_RELATIME,
        Some("mode=0700,size=64k,nr_inodes=65536"),
    )?;
    Ok(())
}

/// Removes the node directories of IDs that hold no container reservation (freed, released
/// by an operator, reclaimed as stale). Called under the state lock.
fn sweep(cfg: &Config, st: &crate::reserve::state::State) {
    let Ok(entries) = std::fs::read_dir(nodes_root(cfg)) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !st
            .reservations
            .get(&name)
            .is_some_and(|r| r.kind == HolderKind::Oci)
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Frees the container's reservation when `cond` holds for it, and removes node directories
/// nobody holds any more, in one locked step.
fn free_oci(
    cfg: &Config,
    id: &str,
    cond: impl FnOnce(&Reservation) -> bool,
) -> Result<Option<Reservation>, Error> {
    let mine = |st: &crate::reserve::state::State| match st.reservations.get(id) {
        Some(r) if r.kind == HolderKind::Oci && cond(r) => vec![(id.to_string(), ())],
        _ => Vec::new(),
    };
    let freed = lifecycle::free_with(&Facts::host(cfg), mine, |st| sweep(cfg, st))?;
    Ok(freed.freed.into_iter().next().map(|(r, ())| r))
}

/// Edits the config and replaces it atomically (temp file in the same directory, rename),
/// with the old file's permissions.
fn write_config(
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
        token: bundle::HookToken(by).to_string(),
    };
    bundle::edit(&mut config, nodes, binds, &hook, cdi).map_err(RuntimeError::Bundle)?;
    if let Some(dir) = mps {
        bundle::edit_mps(&mut config, dir).map_err(RuntimeError::Bundle)?;
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
    if let Some(id) = inv.id.as_deref().filter(|i| bundle::valid_id(i)) {
        release(cfg, id, "delete", |r| lifecycle::stale_reason(r).is_some());
    }
    code
}

/// Frees the container's reservation when `cond` holds for it (decided under the lock).
/// Errors are logged: the caller's status stands.
fn release(cfg: &Config, id: &str, stage: &str, cond: impl FnOnce(&Reservation) -> bool) {
    // Nothing held and no nodes left (an operator's `gpuhook release` frees the reservation
    // but cannot remove a running container's nodes): nothing to do.
    if !lifecycle::may_hold(cfg, id) && !nodes_root(cfg).join(id).exists() {
        return;
    }
    let who = HolderKind::Oci.who(id);
    match free_oci(cfg, id, cond) {
        Ok(Some(r)) => log::info(&format!(
            "{who}: {stage}: freed {}",
            crate::ids::Unit::join(&r.gpus, ",")
        )),
        Ok(None) => {}
        Err(e) => log::error(&format!("{who}: {stage}: cannot free its GPUs: {e}")),
    }
}

/// `gpuhook oci-hook STAGE`: the hooks gpuhook adds to a GPU container's config; the
/// runtime's state JSON (`id`, `pid`) on stdin.
pub fn oci_hook(stage: &str, token: Option<&str>, arg: Option<&str>) -> i32 {
    // The runtime runs its hooks inside the container's pid namespace, where the container's
    // processes may see this one (host root, its root the host's before the runtime enters
    // the container's): not dumpable, so none can reach through its /proc entries.
    // SAFETY: a plain prctl on this process.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0) };
    let mut buf = Vec::new();
    if let Err(e) = std::io::stdin().take(1 << 20).read_to_end(&mut buf) {
        log::error(&format!(
            "oci-hook {stage}: reading the container state: {e}"
        ));
        return 1;
    }
    let state: bundle::HookState = match serde_json::from_slice(&buf) {
        Ok(s) => s,
        Err(e) => {
            log::error(&format!(
                "oci-hook {stage}: the container state is not valid: {e}"
            ));
            return 1;
        }
    };
    if !bundle::valid_id(&state.id) {
        log::error(&format!("oci-hook {stage}: invalid container ID"));
        return 1;
    }
    let who = HolderKind::Oci.who(&state.id);
    // Which reservation the hook belongs to: the `create` that made it.
    let by = token
        .and_then(|t| t.parse::<bundle::HookToken>().ok())
        .map(|t| t.0);
    let Some(by) = by else {
        log::error(&format!(
            "{who}: oci-hook {stage}: no valid reservation token"
        ));
        return 1;
    };
    match stage {
        bundle::CREATE_RUNTIME => {
            let ids = IdMap::default();
            let h = holder(&state.id, &ids);
            let recorded = state
                .pid
                .and_then(ProcRef::of)
                .ok_or(RuntimeError::NoInitPid)
                .and_then(|init| {
                    // Where the runtime put it, before anything of the container runs: its
                    // device cgroup for hotplug, whatever the container does later.
                    let cgroup = crate::cgroup::Made::of_pid(init.pid)
                        .map_err(|e| log::warn(&format!("{who}: createRuntime: {e}")))
                        .ok();
                    let ns = crate::host::procfs::HOST.namespaces(init.pid);
                    Ok(lifecycle::record_init(&h, by, init, cgroup, ns)?)
                });
            match recorded {
                Ok(()) => 0,
                Err(e) => {
                    log::error(&format!("{who}: createRuntime: {e}"));
                    1
                }
            }
        }
        bundle::CDI => match cdi_hook(arg) {
            Ok(notes) => {
                for n in notes {
                    log::info(&format!("{who}: {n}"));
                }
                0
            }
            Err(e) => {
                log::error(&format!("{who}: createContainer: {e}"));
                1
            }
        },
        bundle::POSTSTOP => {
            // The runtime runs it once the container stopped; only for this create's own.
            if let Ok(cfg) = Config::load() {
                release(&cfg, &state.id, "poststop", |r| r.prepared_by == Some(by));
            }
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
