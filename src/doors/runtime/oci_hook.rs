//! The hooks gpuhook adds to a GPU container's `config.json`, run by the runtime through
//! `gpuhook oci-hook STAGE`: `create-runtime` records the init, `cdi` does CDI's work in the
//! container's root, `poststop` frees.

use crate::doors::bundle::hooks::{CdiWork, HookState, HookToken, CDI, CREATE_RUNTIME, POSTSTOP};
use crate::doors::bundle::parse::valid_id;
use crate::doors::error::RuntimeError;
use crate::host::config::Config;
use crate::host::procfs::ProcRef;
use crate::log;
use crate::request::IdMap;
use crate::reserve::error::Error;
use crate::reserve::lifecycle::{self, Holder, HolderKind};
use crate::reserve::world::World;
use std::io::Read;
use std::path::{Path, PathBuf};

/// `gpuhook oci-hook STAGE`: the hooks gpuhook adds to a GPU container's config; the
/// runtime's state JSON (`id`, `pid`) on stdin.
pub fn oci_hook(stage: &str, token: Option<&str>, arg: Option<&str>) -> i32 {
    // The runtime runs its hooks inside the container's pid namespace, where the container's
    // processes may see this one (host root, its root the host's before the runtime enters
    // the container's): not dumpable, so none can reach through its /proc entries.
    let _ = nix::sys::prctl::set_dumpable(false);
    let mut buf = Vec::new();
    if let Err(e) = std::io::stdin().take(1 << 20).read_to_end(&mut buf) {
        log::error(&format!(
            "oci-hook {stage}: reading the container state: {e}"
        ));
        return 1;
    }
    let state: HookState = match serde_json::from_slice(&buf) {
        Ok(s) => s,
        Err(e) => {
            log::error(&format!(
                "oci-hook {stage}: the container state is not valid: {e}"
            ));
            return 1;
        }
    };
    if !valid_id(&state.id) {
        log::error(&format!("oci-hook {stage}: invalid container ID"));
        return 1;
    }
    let who = HolderKind::Oci.who(&state.id);
    // Which reservation the hook belongs to: the `create` that made it.
    let by = token.and_then(|t| t.parse::<HookToken>().ok()).map(|t| t.0);
    let Some(by) = by else {
        log::error(&format!(
            "{who}: oci-hook {stage}: no valid reservation token"
        ));
        return 1;
    };
    match stage {
        CREATE_RUNTIME => {
            let ids = IdMap::default();
            let h = Holder::oci(&state.id, &ids);
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
                    let ns = crate::host::procfs::REAL.namespaces(init.pid);
                    let cfg = Config::load().map_err(Error::from)?;
                    let f = World::real(&cfg);
                    Ok(lifecycle::record_init(&f, &h, by, init, cgroup, ns)?)
                });
            match recorded {
                Ok(()) => 0,
                Err(e) => {
                    log::error(&format!("{who}: createRuntime: {e}"));
                    1
                }
            }
        }
        CDI => match cdi_hook(arg) {
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
        POSTSTOP => {
            // The runtime runs it once the container stopped; only for this create's own. A
            // poststop hook's failure changes nothing for the runtime (it warns and goes on):
            // exit 0, and the reason in the log.
            match Config::load() {
                Ok(cfg) => {
                    let f = World::real(&cfg);
                    lifecycle::release_oci(&f, &state.id, "poststop", |r| {
                        r.prepared_by == Some(by)
                    });
                }
                Err(e) => log::error(&format!(
                    "{who}: poststop: cannot free its GPUs: {e}; they stay reserved until the config reads again (then its delete, `gpuhook release {}`, or a request that needs them as stale frees them)",
                    state.id
                )),
            }
            0
        }
        other => {
            log::error(&format!("{who}: unknown oci-hook stage '{other}'"));
            1
        }
    }
}

/// `createContainer` (the runtime has made the container's mounts, before it enters the
/// root): the CDI `create-symlinks` and `update-ldcache` in the container's root, as the
/// libvirt door does them ([`crate::enter::rootfs`]); undone on failure. Returns what was left as
/// it was, for the log.
fn cdi_hook(arg: Option<&str>) -> Result<Vec<String>, RuntimeError> {
    let work: CdiWork = arg
        .ok_or(RuntimeError::NoWork)
        .and_then(|a| serde_json::from_str(a).map_err(RuntimeError::BadWork))?;
    root_work(&work.root, work.links, work.folders)
}

/// The CDI links and linker cache in the container's root `root` (absolute: where the
/// runtime mounted it; the hook runs in the container's namespaces before it pivots into
/// it): what gpuhook's own `cdi` hook and `gpuhook cdi-hook` (a generated spec's hooks) do,
/// as the libvirt door does it ([`crate::enter::rootfs`]); undone on failure. Returns what
/// was left as it was, for the log.
pub fn root_work(
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
