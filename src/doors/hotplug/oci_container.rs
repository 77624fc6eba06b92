//! An OCI container for `attach` and `detach` (docs/guides/hotplug.md): its init through gpuhook's
//! own record (the init its `createRuntime` hook recorded), else the runtime's state under the
//! config's `oci_state_roots` (runc: `ROOT/ID/state.json`, crun: `ROOT/ID/status`); its user
//! namespace's id map from the init's `/proc/PID/uid_map` and `gid_map`; its device cgroup
//! the init's v1 devices cgroup, else (cgroup v2) the runtime's device program on the init's
//! unified cgroup, which attach and detach replace ([`crate::cgroup::runtime_program`]).

use crate::cgroup::{self, CgroupError, DeviceCgroup, Fault};
use crate::doors::error::CliError;
use crate::enter::container::Container;
use crate::host::config::Config;
use crate::host::procfs::{self, ProcRef};
use crate::request::{IdMap, IdRange};
use crate::reserve::state::{HolderId, State};
use crate::reserve::world::World;
use serde::Deserialize;
use std::io::Read;
use std::path::{Path, PathBuf};

/// A running OCI container: its ID, its init, its user namespace's id map, the cgroup its
/// runtime put it in, the user and mount namespaces its runtime made (gpuhook's record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Oci {
    pub id: String,
    pub init: ProcRef,
    pub idmap: IdMap,
    pub made: cgroup::Made,
    /// Those its init must still be in ([`crate::enter::container::find_oci`] compares them on
    /// the namespaces it opens, and joins that mount namespace); `None`: not recorded.
    pub namespaces: Option<procfs::Namespaces>,
}

impl Oci {
    /// Its root's host ids when it runs in a user namespace of its own (its `/dev` is that
    /// namespace's: nodes are bind mounts made as its root); `None` without one.
    pub fn userns(&self) -> Option<crate::enter::rootfs::Owner> {
        (self.idmap != IdMap::default()).then(|| crate::enter::rootfs::Owner {
            uid: self.idmap.host_uid(0).unwrap_or(65534),
            gid: self.idmap.host_gid(0).unwrap_or(65534),
        })
    }
}

/// What a runtime's state says of its container's init: its PID and, where the runtime
/// records it, its start time (so a reused PID is not taken for it); the cgroup it put it in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitOf {
    pub pid: i32,
    pub start_time: Option<u64>,
    pub made: cgroup::Made,
}

/// runc's `ROOT/ID/state.json` (libcontainer's `State`), what gpuhook reads of it.
#[derive(Deserialize)]
struct RuncState {
    init_process_pid: i32,
    #[serde(default)]
    init_process_start: Option<u64>,
    /// The container's cgroup directory on each hierarchy, by controller (`""`: the unified
    /// one), as runc mounts them.
    #[serde(default)]
    cgroup_paths: std::collections::BTreeMap<String, String>,
}

/// crun's `ROOT/ID/status` (`libcrun_container_status_t`), what gpuhook reads of it.
#[derive(Deserialize)]
struct CrunStatus {
    pid: i32,
    #[serde(default, rename = "process-start-time")]
    process_start_time: Option<u64>,
    /// The container's cgroup, the same path on each hierarchy.
    #[serde(default, rename = "cgroup-path")]
    cgroup_path: Option<String>,
}

/// The path of runc's cgroup directory `dir` on the hierarchy runc mounts at `mount`
/// (runc's own mount points: `/sys/fs/cgroup` for the unified hierarchy, fs2's
/// `UnifiedMountpoint`; `/sys/fs/cgroup/devices` on the hosts that mount v1).
fn runc_path(dir: Option<&String>, mount: &str) -> Option<String> {
    let rest = dir?.strip_prefix(mount)?;
    if !(rest.is_empty() || rest.starts_with('/')) {
        return None;
    }
    cgroup::clean_path(if rest.is_empty() { "/" } else { rest })
}

/// A runtime's state file, by its name in `ROOT/ID/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFile {
    /// runc's `state.json`.
    Runc,
    /// crun's `status`.
    Crun,
}

impl StateFile {
    const ALL: [StateFile; 2] = [StateFile::Runc, StateFile::Crun];

    fn name(self) -> &'static str {
        match self {
            StateFile::Runc => "state.json",
            StateFile::Crun => "status",
        }
    }

    /// The init the file names.
    pub fn parse(self, bytes: &[u8]) -> Result<InitOf, serde_json::Error> {
        Ok(match self {
            StateFile::Runc => {
                let s: RuncState = serde_json::from_slice(bytes)?;
                InitOf {
                    pid: s.init_process_pid,
                    start_time: s.init_process_start,
                    made: cgroup::Made {
                        unified: runc_path(s.cgroup_paths.get(""), "/sys/fs/cgroup"),
                        devices: runc_path(s.cgroup_paths.get("devices"), "/sys/fs/cgroup/devices"),
                    },
                }
            }
            StateFile::Crun => {
                let s: CrunStatus = serde_json::from_slice(bytes)?;
                let path = s.cgroup_path.as_deref().and_then(cgroup::clean_path);
                InitOf {
                    pid: s.pid,
                    start_time: s.process_start_time,
                    made: cgroup::Made {
                        unified: path.clone(),
                        devices: path,
                    },
                }
            }
        })
    }
}

/// The most of a state file read (runc's holds the container's whole config).
const MAX_STATE: u64 = 16 << 20;

/// The init the runtime's state of container `id` names, under the first of `roots` that
/// has it, with the file it came from; `None` when none has it.
pub fn runtime_init(roots: &[PathBuf], id: &str) -> Result<Option<(PathBuf, InitOf)>, CliError> {
    for root in roots {
        for f in StateFile::ALL {
            let p = root.join(id).join(f.name());
            let Some(bytes) = read_state(&p)? else {
                continue;
            };
            let init = f.parse(&bytes).map_err(|source| CliError::OciState {
                path: p.clone(),
                source,
            })?;
            return Ok(Some((p, init)));
        }
    }
    Ok(None)
}

/// A state file's bytes, `None` when there is none.
fn read_state(p: &Path) -> Result<Option<Vec<u8>>, CliError> {
    let io = |source| CliError::ReadOciState {
        path: p.to_path_buf(),
        source,
    };
    let f = match std::fs::File::open(p) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    let mut bytes = Vec::new();
    f.take(MAX_STATE).read_to_end(&mut bytes).map_err(io)?;
    Ok(Some(bytes))
}

/// The running init the runtime's state names: alive, started when the state says (a state
/// that records no start time names no process gpuhook can tell from a later one with its
/// PID), and PID 1 of a PID namespace of its own, as an OCI container's init is.
fn running(id: &str, of: InitOf) -> Result<ProcRef, CliError> {
    let Some(start_time) = of.start_time else {
        return Err(CliError::OciNoStartTime {
            id: id.to_string(),
            pid: of.pid,
        });
    };
    let p = procfs::REAL
        .proc_ref(of.pid)
        .filter(|p| p.start_time == start_time && p.alive())
        .ok_or_else(|| CliError::OciNotRunning {
            id: id.to_string(),
            pid: of.pid,
        })?;
    let ns = procfs::REAL.nspid(p.pid);
    if ns.len() < 2 || ns.last() != Some(&1) {
        return Err(CliError::OciNotInit {
            id: id.to_string(),
            pid: p.pid,
        });
    }
    Ok(p)
}

/// The running OCI container `id`: the init gpuhook recorded for it while that init lives,
/// else the one its runtime's state names (which must run); `None` when neither knows it.
pub fn find(cfg: &Config, st: &State, id: &str) -> Result<Option<Oci>, CliError> {
    let recorded = st
        .reservations
        .get(&container(id).key())
        .and_then(|r| Some((r.init?, r.cgroup.clone(), r.namespaces)))
        .filter(|(i, _, _)| i.alive());
    // An init that left the namespaces its runtime made (unshared its own) is refused when the
    // container is found (`find_oci`): gpuhook would make nodes and mounts in namespaces the
    // container chose. Compared there on the namespaces opened, which are those joined.
    let namespaces = recorded.as_ref().and_then(|(_, _, n)| *n);
    let recorded = recorded.map(|(i, c, _)| (i, c));
    // Where the runtime put the init: as its createRuntime hook read it (gpuhook-runtime's
    // create), else as the runtime's state says while it names that very init; else unknown,
    // and hotplug is refused ([`init_cgroup`]).
    let (init, made) = match recorded {
        Some((i, Some(made))) => (i, made),
        Some((i, None)) => {
            let of = runtime_init(&cfg.oci_state_roots, id)?.map(|(_, of)| of);
            let made = of
                .filter(|of| of.pid == i.pid && of.start_time == Some(i.start_time))
                .map(|of| of.made)
                .unwrap_or_default();
            (i, made)
        }
        None => match runtime_init(&cfg.oci_state_roots, id)? {
            Some((path, _)) if is_sandbox(&path)? => {
                return Err(CliError::OciSandbox { id: id.to_string() })
            }
            Some((_, of)) => {
                let made = of.made.clone();
                (running(id, of)?, made)
            }
            None => return Ok(None),
        },
    };
    // With a user namespace its `/dev` tmpfs is that namespace's: nodes are bind mounts
    // ([`Oci::userns`]).
    let idmap = id_map(init.pid)?;
    Ok(Some(Oci {
        id: id.to_string(),
        init,
        idmap,
        made,
        namespaces,
    }))
}

/// The OCI container of ID `id`, as the state names its holder.
pub fn container(id: &str) -> HolderId {
    HolderId::Oci { id: id.to_string() }
}

/// Whether an OCI container of ID `id` is known here: gpuhook holds a reservation for it
/// that is not stale, or a runtime keeps its state (running or not) under one of the
/// `oci_state_roots`.
pub fn known(cfg: &Config, st: &State, id: &str) -> bool {
    st.reservations
        .get(&container(id).key())
        .is_some_and(|r| crate::reserve::reconcile::stale_reason(r).is_none())
        || cfg.oci_state_roots.iter().any(|root| {
            StateFile::ALL
                .iter()
                .any(|f| root.join(id).join(f.name()).exists())
        })
}

/// Whether the runtime's state file at `p` is a Kubernetes pod's sandbox ("pause")
/// container's: runc's records the bundle's annotations among its config's `labels`
/// (`KEY=VALUE`), crun's names the bundle, whose `config.json` holds them.
fn is_sandbox(p: &Path) -> Result<bool, CliError> {
    let Some(bytes) = read_state(p)? else {
        return Ok(false);
    };
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|source| CliError::OciState {
            path: p.to_path_buf(),
            source,
        })?;
    let annotations = if let Some(labels) = v.pointer("/config/labels") {
        labels
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l.as_str()?.split_once('='))
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(v)))
            .collect()
    } else {
        let config = v
            .get("bundle")
            .and_then(serde_json::Value::as_str)
            .map(|b| Path::new(b).join("config.json"));
        match config.map(|c| read_state(&c)).transpose()?.flatten() {
            Some(b) => serde_json::from_slice::<serde_json::Value>(&b)
                .ok()
                .and_then(|c| c.get("annotations").and_then(|a| a.as_object()).cloned())
                .unwrap_or_default(),
            None => serde_json::Map::new(),
        }
    };
    Ok(crate::doors::bundle::parse::is_sandbox(
        &serde_json::json!({ "annotations": annotations }),
    ))
}

/// An OCI container's device cgroup: its init's v1 devices cgroup, or where its devices
/// controller is on no v1 hierarchy its runtime's device program on the init's unified cgroup;
/// read from its `/proc/PID/cgroup` and taken only while that very init (PID and start time)
/// still runs: a PID reused after the init exited (by a process of another container) gets
/// nothing.
fn init_cgroup(cfg: &Config, ct: &Container) -> Result<Box<dyn DeviceCgroup>, CgroupError> {
    let made = &ct.made;
    let cg = match cgroup::v1_for_pid(ct.init.pid, made.devices.as_deref()) {
        Err(CgroupError {
            fault: Fault::NoV1Devices,
            ..
        }) => cgroup::program_for_pid(ct.init.pid, made.unified.as_deref(), cfg.state_dir())?,
        r => r?,
    };
    if !ct.init.alive() {
        let what = PathBuf::from(format!("/proc/{}/cgroup", ct.init.pid));
        return Err(CgroupError::new(
            &what,
            Fault::InitLeft { pid: ct.init.pid },
        ));
    }
    Ok(cg)
}

/// This host's facts, with an OCI container's device cgroup.
pub fn facts(cfg: &Config) -> World<'_> {
    World {
        cgroup: &init_cgroup,
        ..World::real(cfg)
    }
}

/// The id map of the init's user namespace (`/proc/PID/uid_map`, `gid_map`): empty (ids as
/// they are) for the host's.
fn id_map(pid: i32) -> Result<IdMap, CliError> {
    let read = |which: &str| {
        let path = PathBuf::from(format!("/proc/{pid}/{which}"));
        let text = std::fs::read_to_string(&path).map_err(|source| CliError::ReadIdMap {
            path: path.clone(),
            source,
        })?;
        parse_id_map(&text).ok_or(CliError::IdMap { path })
    };
    Ok(IdMap {
        uid: read("uid_map")?,
        gid: read("gid_map")?,
    })
}

/// A `uid_map`/`gid_map` (`ID-INSIDE ID-OUTSIDE LENGTH` a line) as id ranges; the identity
/// of the host's user namespace (`0 0 4294967295`) is no mapping. `None` when a line is not
/// three numbers, or there is none (a namespace with no map written maps no id).
pub fn parse_id_map(text: &str) -> Option<Vec<IdRange>> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let n: Vec<u32> = line
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let [start, target, count] = n[..] else {
            return None;
        };
        out.push(IdRange {
            start,
            target,
            count,
        });
    }
    let identity = IdRange {
        start: 0,
        target: 0,
        count: u32::MAX,
    };
    if out == [identity] {
        out.clear();
    } else if out.is_empty() {
        return None;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// runc 1.1's `state.json`, as this host's podman leaves it (the config cut short).
    const RUNC_STATE: &str = r#"{"id":"b1238305c630f7efb71369966e00592a2cf7cb92ac527b45f153f7af3eeb2b06","init_process_pid":14797,"init_process_start":1265849,"created":"2026-12-02T00:24:09.619135877Z","config":{"no_pivot_root":false,"parent_death_signal":0,"rootfs":"/tmp/probe/rootfs","umask":18,"readonlyfs":false,"rootPropagation":0,"mounts":[{"source":"tmpfs","destination":"/dev","device":"tmpfs","flags":16777226,"data":"mode=755,size=65536k"}]},"rootless":false,"cgroup_paths":{"devices":"/sys/fs/cgroup/devices/libpod_parent/libpod-b123"},"namespace_paths":{"NEWNS":"/proc/14797/ns/mnt"},"external_descriptors":["/dev/null","pipe:[3]","pipe:[4]"],"intel_rdt_path":""}"#;

    /// crun's `status`, as `libcrun_write_container_status` writes it.
    const CRUN_STATUS: &str = r#"{
    "pid": 139179,
    "process-start-time": 263473330,
    "cgroup-path": "/busybox1",
    "scope": "",
    "rootfs": "rootfs",
    "systemd-cgroup": false,
    "bundle": "/home/u/my_container",
    "created": "2021-08-29T14:34:52.000293421Z",
    "owner": "root",
    "detached": true,
    "external_descriptors": "[\"/dev/pts/1\",\"/dev/pts/1\",\"/dev/pts/1\"]"
}"#;

    #[test]
    fn runtime_state_files() {
        assert_eq!(
            StateFile::Runc.parse(RUNC_STATE.as_bytes()).unwrap(),
            InitOf {
                pid: 14797,
                start_time: Some(1265849),
                made: cgroup::Made {
                    unified: None,
                    devices: Some("/libpod_parent/libpod-b123".into())
                }
            }
        );
        assert_eq!(
            StateFile::Crun.parse(CRUN_STATUS.as_bytes()).unwrap(),
            InitOf {
                pid: 139179,
                start_time: Some(263473330),
                made: cgroup::Made {
                    unified: Some("/busybox1".into()),
                    devices: Some("/busybox1".into())
                }
            }
        );
        // runc on cgroup v2 (fs2: the unified hierarchy at /sys/fs/cgroup); a directory
        // elsewhere, or a path with `..`, says nothing.
        let made = |paths: &str| {
            let json = format!(
                r#"{{"init_process_pid":1,"init_process_start":2,"cgroup_paths":{paths}}}"#
            );
            StateFile::Runc.parse(json.as_bytes()).unwrap().made
        };
        assert_eq!(
            made(r#"{"":"/sys/fs/cgroup/system.slice/runc-c1.scope"}"#)
                .unified
                .as_deref(),
            Some("/system.slice/runc-c1.scope")
        );
        assert_eq!(
            made(r#"{"":"/sys/fs/cgroup/"}"#).unified.as_deref(),
            Some("/")
        );
        assert_eq!(made(r#"{"":"/sys/fs/cgroupx/a"}"#), cgroup::Made::default());
        assert_eq!(
            made(r#"{"":"/sys/fs/cgroup/a/../b"}"#),
            cgroup::Made::default()
        );
        assert_eq!(
            made(r#"{"devices":"/cg/devices/a"}"#),
            cgroup::Made::default()
        );
        // crun keeps a path as written (`run.oci.systemd.subgroup=./container`): cleaned.
        let crun = StateFile::Crun
            .parse(br#"{"pid": 7, "cgroup-path": "/s.scope/./container//"}"#)
            .unwrap();
        assert_eq!(crun.made.unified.as_deref(), Some("/s.scope/container"));
        let crun = StateFile::Crun
            .parse(br#"{"pid": 7, "cgroup-path": "/s.scope/../x"}"#)
            .unwrap();
        assert_eq!(crun.made, cgroup::Made::default());
        // Older crun wrote no start time.
        assert_eq!(
            StateFile::Crun
                .parse(br#"{"pid": 7, "bundle": "/b"}"#)
                .unwrap(),
            InitOf {
                pid: 7,
                start_time: None,
                made: cgroup::Made::default()
            }
        );
        assert!(StateFile::Runc.parse(CRUN_STATUS.as_bytes()).is_err());
        assert!(StateFile::Crun.parse(b"7").is_err());
    }

    /// Under the roots in order, runc's file before crun's; a broken one is said with its path.
    #[test]
    fn runtime_init_under_the_roots() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("runc"), t.path().join("crun"));
        std::fs::create_dir_all(a.join("c1")).unwrap();
        std::fs::create_dir_all(b.join("c2")).unwrap();
        std::fs::write(a.join("c1/state.json"), RUNC_STATE).unwrap();
        std::fs::write(b.join("c2/status"), CRUN_STATUS).unwrap();
        let roots = [a.clone(), b.clone()];
        let (p, i) = runtime_init(&roots, "c1").unwrap().unwrap();
        assert_eq!((p, i.pid), (a.join("c1/state.json"), 14797));
        let (p, i) = runtime_init(&roots, "c2").unwrap().unwrap();
        assert_eq!((p, i.pid), (b.join("c2/status"), 139179));
        assert!(runtime_init(&roots, "c3").unwrap().is_none());
        std::fs::write(b.join("c2/status"), "{").unwrap();
        let e = runtime_init(&roots, "c2").unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("{}: ", b.join("c2/status").display())),
            "{e}"
        );
    }

    /// The runtime's init must run, started when the state says, and be PID 1 of a PID
    /// namespace of its own.
    #[test]
    fn the_runtimes_init_must_run() {
        let mut ns = std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child", "sleep", "30"])
            .spawn()
            .expect("unshare (as root)");
        let child = || {
            let kids =
                std::fs::read_to_string(format!("/proc/{}/task/{}/children", ns.id(), ns.id()))
                    .ok()?;
            let pid: i32 = kids.split_whitespace().next()?.parse().ok()?;
            (procfs::comm(pid).as_deref() == Some("sleep")).then_some(pid)
        };
        let mut init = None;
        for _ in 0..400 {
            init = child();
            if init.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let init = procfs::REAL
            .proc_ref(init.expect("the namespace's init"))
            .unwrap();
        let of = |pid, start_time| InitOf {
            pid,
            start_time,
            made: Default::default(),
        };
        assert_eq!(
            running("c1", of(init.pid, Some(init.start_time))).unwrap(),
            init
        );
        let e = running("c1", of(init.pid, None)).unwrap_err().to_string();
        assert!(e.contains("records no start time"), "{e}");
        let e = running("c1", of(init.pid, Some(init.start_time + 1))).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "container 'c1' is not running (its init, pid {}, is gone)",
                init.pid
            )
        );
        // A process that is no namespace's init (this test) is no container's.
        let me = procfs::REAL.proc_ref(std::process::id() as i32).unwrap();
        let e = running("c1", of(me.pid, Some(me.start_time)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not the init of a PID namespace"), "{e}");
        let _ = ns.kill();
        let _ = ns.wait();
    }

    /// A pod's sandbox, by runc's labels or crun's bundle; an app container and a plain one
    /// are not.
    #[test]
    fn sandboxes_by_the_runtimes_state() {
        let t = tempfile::tempdir().unwrap();
        let runc = |labels: &str| {
            let p = t.path().join("state.json");
            std::fs::write(
                &p,
                RUNC_STATE.replace(
                    r#""no_pivot_root":false,"#,
                    &format!(r#""no_pivot_root":false,"labels":{labels},"#),
                ),
            )
            .unwrap();
            is_sandbox(&p).unwrap()
        };
        assert!(runc(
            r#"["io.kubernetes.cri.container-type=sandbox","io.kubernetes.cri.sandbox-id=ab","bundle=/b"]"#
        ));
        assert!(runc(
            r#"["io.kubernetes.cri-o.ContainerType=sandbox","bundle=/b"]"#
        ));
        assert!(!runc(
            r#"["io.kubernetes.cri.container-type=container","bundle=/b"]"#
        ));
        assert!(!runc(r#"["bundle=/b"]"#));
        assert!(!is_sandbox(&t.path().join("none.json")).unwrap());
        // crun: the bundle's annotations.
        let bundle = t.path().join("bundle");
        std::fs::create_dir(&bundle).unwrap();
        let status = t.path().join("status");
        std::fs::write(
            &status,
            CRUN_STATUS.replace("/home/u/my_container", bundle.to_str().unwrap()),
        )
        .unwrap();
        assert!(
            !is_sandbox(&status).unwrap(),
            "no config.json: not a sandbox"
        );
        std::fs::write(
            bundle.join("config.json"),
            r#"{"annotations": {"io.kubernetes.cri.container-type": "sandbox"}}"#,
        )
        .unwrap();
        assert!(is_sandbox(&status).unwrap());
        std::fs::write(&status, "{").unwrap();
        assert!(is_sandbox(&status).is_err());
    }

    /// Known: a reservation gpuhook holds for it, or a runtime's state under the roots.
    #[test]
    fn known_containers() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("runc/c1")).unwrap();
        std::fs::write(t.path().join("runc/c1/state.json"), RUNC_STATE).unwrap();
        let cfg = Config {
            oci_state_roots: vec![t.path().join("runc"), t.path().join("crun")],
            ..Config::default()
        };
        let empty = State::default();
        assert!(known(&cfg, &empty, "c1"));
        assert!(!known(&cfg, &empty, "c2"));
        let held = |kind: &str, init: Option<ProcRef>| -> State {
            let key = if kind == "vm" { "vm:c2" } else { "c2" };
            let text = serde_json::json!({
                "version": 1,
                "reservations": {key: {"kind": kind, "domain": "c2", "uuid": "c2", "gpus": [],
                    "phase": "running", "request": "", "created": "", "updated": ""}}
            });
            let mut st = State::parse(text.to_string().as_bytes(), "x").unwrap();
            for r in st.reservations.values_mut() {
                r.init = init;
            }
            st
        };
        let me = ProcRef::of(std::process::id() as i32);
        assert!(me.is_some());
        assert!(known(&cfg, &held("oci", me), "c2"));
        // Stale (its init gone): no container any more.
        let gone = me.map(|p| ProcRef {
            start_time: p.start_time + 1,
            ..p
        });
        assert!(!known(&cfg, &held("oci", gone), "c2"));
        // A libvirt domain whose UUID (in a file, any string) is the container's ID, or a VM.
        assert!(!known(&cfg, &held("libvirt", me), "c2"), "a domain's UUID");
        assert!(!known(&cfg, &held("vm", me), "c2"), "a VM's UUID");
    }

    #[test]
    fn user_namespace_id_maps() {
        assert_eq!(
            parse_id_map("         0          0 4294967295\n"),
            Some(vec![])
        );
        assert_eq!(
            parse_id_map("         0     100000      65536\n     65536          0          1\n"),
            Some(vec![
                IdRange {
                    start: 0,
                    target: 100000,
                    count: 65536
                },
                IdRange {
                    start: 65536,
                    target: 0,
                    count: 1
                },
            ])
        );
        // A namespace with no map written yet maps nothing: not the identity.
        assert_eq!(parse_id_map(""), None);
        assert_eq!(parse_id_map("0 0\n"), None);
        assert_eq!(parse_id_map("0 x 1\n"), None);
        let m = IdMap {
            uid: parse_id_map("0 100000 65536").unwrap(),
            gid: parse_id_map("0 200000 65536").unwrap(),
        };
        assert_eq!(m.host_uid(0), Some(100000));
        assert_eq!(m.host_gid(5), Some(200005));
        assert_eq!(m.host_uid(70000), None);
    }
}
