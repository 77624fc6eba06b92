//! Device access of a container's cgroup: one interface, two backends (as youki's
//! libcgroups does), chosen by what the host runs for the container's init.
//!
//! - v1: `c MAJ:MIN rw` into `devices.allow` of the init's devices cgroup; `devices.deny`
//!   revokes; `devices.list` says what is allowed.
//! - v2: libvirt's own `BPF_PROG_TYPE_CGROUP_DEVICE` program on the init's cgroup keeps its
//!   rules in a hash map; gpuhook adds exact entries to that map (never a second program:
//!   [`LibvirtMap`]). An OCI runtime's program has no map: gpuhook replaces it with one that
//!   allows exactly what it allowed plus or minus exact GPU nodes ([`runtime_program`]), and
//!   reads what a program allows by running it ([`interp`]).
//!
//! The interface and what the backends share: `device.rs`.
//!
//! Least privilege: exact device numbers, `rw` only (no `m`, no wildcards).

pub mod bpf;
mod device;
mod error;
pub mod interp;
mod libvirt_map;
pub mod runtime_program;
pub mod systemd;
mod v1;

pub use device::{grant_all, revoke_all, DeviceCgroup, ManagedPolicy};
pub use error::{CgroupError, Fault, MapOp, OutsideDomain};
pub use libvirt_map::LibvirtMap;
pub use v1::V1;

use crate::host::procfs;

use std::path::{Path, PathBuf};

/// The managed device policy of a process's device cgroup (an OCI container's init; a libvirt
/// domain's): systemd's scope of it, where systemd keeps a device policy for it (locked by a
/// file in the state directory `state_dir`).
pub fn managed_policy(
    pid: i32,
    state_dir: &Path,
) -> Result<Option<Box<dyn ManagedPolicy>>, CgroupError> {
    let (v1, v2) = cgroup_paths(pid)?;
    // Its v1 devices cgroup where it has one; in the root one (a cgroup v2 host, whose kernel
    // still lists the v1 hierarchies), its unified cgroup.
    let Some(path) = v1.filter(|p| p != "/").or(v2) else {
        return Ok(None);
    };
    Ok(systemd::Scope::find(&path, state_dir)?.map(|s| Box::new(s) as Box<dyn ManagedPolicy>))
}

/// Joins a mount point and a cgroup path (relative to the mount's root).
fn under(mount: &Path, root: &str, cg: &str) -> Option<PathBuf> {
    let rel = if root == "/" {
        cg
    } else {
        cg.strip_prefix(root)?
    };
    let rel = rel.trim_start_matches('/');
    if rel.split('/').any(|c| c == ".." || c == ".") {
        return None;
    }
    Some(if rel.is_empty() {
        mount.to_path_buf()
    } else {
        mount.join(rel)
    })
}

/// The `cgroup.procs` file of each cgroup a process is in, one per hierarchy (v1 and v2),
/// as this process sees the cgroup mounts: writing `0` there moves the writer in.
pub fn procs_files(pid: i32) -> Result<Vec<PathBuf>, CgroupError> {
    let proc_path = PathBuf::from(format!("/proc/{pid}/cgroup"));
    let text = std::fs::read_to_string(&proc_path)
        .map_err(|e| CgroupError::new(&proc_path, Fault::Read(e.into())))?;
    let ms = procfs::mounts(None).unwrap_or_default();
    let mut out = Vec::new();
    for line in text.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(hier), Some(ctrls), Some(path)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let m = if hier == "0" && ctrls.is_empty() {
            ms.iter().find(|m| m.fs_type == "cgroup2")
        } else {
            let want: Vec<&str> = ctrls.split(',').collect();
            ms.iter().find(|m| {
                m.fs_type == "cgroup"
                    && want
                        .iter()
                        .all(|c| m.super_options.split(',').any(|o| o == *c))
            })
        };
        // A hierarchy not mounted here has no file to write.
        let Some(m) = m else { continue };
        let dir = under(Path::new(&m.mount_point), &m.root, path).ok_or_else(|| {
            let cgroup = path.to_owned();
            CgroupError::new(&proc_path, Fault::OutsideMount { cgroup })
        })?;
        out.push(dir.join("cgroup.procs"));
    }
    Ok(out)
}

/// A process's cgroup paths: (v1 devices hierarchy, v2 unified hierarchy).
fn cgroup_paths(pid: i32) -> Result<(Option<String>, Option<String>), CgroupError> {
    let proc_path = PathBuf::from(format!("/proc/{pid}/cgroup"));
    let text = std::fs::read_to_string(&proc_path)
        .map_err(|e| CgroupError::new(&proc_path, Fault::Read(e.into())))?;
    let mut v1_path = None;
    let mut v2_path = None;
    for line in text.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(hier), Some(ctrls), Some(path)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if hier == "0" && ctrls.is_empty() {
            v2_path = Some(path.to_owned());
        } else if ctrls.split(',').any(|c| c == "devices") {
            v1_path = Some(path.to_owned());
        }
    }
    if v1_path.is_none() && v2_path.is_none() {
        return Err(CgroupError::new(&proc_path, Fault::NoDeviceCgroup));
    }
    Ok((v1_path, v2_path))
}

/// The backend for a cgroup path: v1 when the devices controller is on a v1 hierarchy,
/// else v2.
fn open(
    v1: Option<String>,
    v2: Option<String>,
    what: &Path,
) -> Result<Box<dyn DeviceCgroup>, CgroupError> {
    let ms = procfs::mounts(None).unwrap_or_default();
    let dir_of = |m: &procfs::Mount, p: &str| {
        let mp = Path::new(&m.mount_point);
        under(mp, &m.root, p).ok_or_else(|| {
            let cgroup = p.to_owned();
            CgroupError::new(mp, Fault::OutsideMount { cgroup })
        })
    };
    if let Some(p) = v1 {
        let m = ms
            .iter()
            .find(|m| m.fs_type == "cgroup" && m.super_options.split(',').any(|o| o == "devices"))
            .ok_or_else(|| CgroupError::new(what, Fault::DevicesNotMounted))?;
        return Ok(Box::new(V1::new(dir_of(m, &p)?)));
    }
    let p = v2.unwrap_or_default();
    let m = ms
        .iter()
        .find(|m| m.fs_type == "cgroup2")
        .ok_or_else(|| CgroupError::new(what, Fault::NoCgroup2))?;
    Ok(Box::new(LibvirtMap::open(&dir_of(m, &p)?)?))
}

/// The device cgroup of a process: v1 if its devices controller is on a v1 hierarchy, else
/// v2 (its cgroup on the unified hierarchy).
pub fn for_pid(pid: i32) -> Result<Box<dyn DeviceCgroup>, CgroupError> {
    let (v1, v2) = cgroup_paths(pid)?;
    open(v1, v2, Path::new(&format!("/proc/{pid}/cgroup")))
}

/// Where an OCI runtime put a container's init at create (paths as `/proc/PID/cgroup` shows
/// them), as gpuhook-runtime's `createRuntime` hook read it or the runtime's state records
/// it: the container's device cgroup for attach and detach. The container may move its
/// processes, the init among them, below it where its cgroup is writable, never above; rules
/// changed below it would leave the runtime's in force for the processes that stayed.
/// `None`: not known (hotplug is refused).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Made {
    /// On the unified hierarchy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unified: Option<String>,
    /// On the v1 devices hierarchy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<String>,
}

impl Made {
    /// Where process `pid` is now (its devices cgroup on v1, its unified one): read when the
    /// runtime has put a container's init in its cgroup and nothing of the container has run
    /// yet (its `createRuntime` hook).
    pub fn of_pid(pid: i32) -> Result<Made, CgroupError> {
        let (devices, unified) = cgroup_paths(pid)?;
        Ok(Made { unified, devices })
    }
}

/// A cgroup path as `/proc/PID/cgroup` gives it, from one a runtime recorded: absolute,
/// empty and `.` components dropped (crun keeps them as written); `None` with a `..`.
pub fn clean_path(p: &str) -> Option<String> {
    if !p.starts_with('/') {
        return None;
    }
    let mut out = String::new();
    for c in p.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if c == ".." {
            return None;
        }
        out.push('/');
        out.push_str(c);
    }
    Some(if out.is_empty() { "/".into() } else { out })
}

/// The v1 devices cgroup of a process (an OCI container's init: the cgroup its runtime
/// made, `made`: the init must still be there; `None`: not known, refused); [`Fault::NoV1Devices`]
/// when its devices controller is not on a v1 hierarchy, or it is in the root devices cgroup
/// while its runtime placed it on the unified hierarchy (a cgroup v2 container on a hybrid
/// host), [`Fault::InitLeft`] when it is in no cgroup but the roots (an exiting init: the
/// root devices cgroup confines nothing).
pub fn v1_for_pid(pid: i32, made: Option<&str>) -> Result<Box<dyn DeviceCgroup>, CgroupError> {
    let what = PathBuf::from(format!("/proc/{pid}/cgroup"));
    match cgroup_paths(pid)? {
        (Some(v1), _) if v1 != "/" => {
            let Some(made) = made else {
                return Err(CgroupError::new(&what, Fault::MadeUnknown { pid }));
            };
            if made != v1 {
                let below = v1.starts_with(&format!("{}/", made.trim_end_matches('/')));
                return Err(CgroupError::new(
                    &what,
                    Fault::LeftItsCgroup {
                        pid,
                        now: v1,
                        made: made.to_string(),
                        below,
                    },
                ));
            }
            open(Some(v1), None, &what)
        }
        (Some(_), v2) if v2.as_deref().is_none_or(|p| p == "/") => {
            Err(CgroupError::new(&what, Fault::InitLeft { pid }))
        }
        _ => Err(CgroupError::new(&what, Fault::NoV1Devices)),
    }
}

/// The device cgroup of an OCI container's init on cgroup v2, where its runtime attached its
/// device program ([`runtime_program::RuntimeProgram`]): the cgroup `made`, where the runtime put the init
/// (`None`: not known, refused). The init must be there or below, and no program but
/// systemd's on the way from there to the init's: a program at `made` rules every process
/// below it. Never one above: a cgroup above rules other processes too (a program there is
/// one an attach checks lets the GPU through, [`DeviceCgroup::effective`]). Locked against
/// another gpuhook of the pool whose state directory is `state_dir`.
pub fn program_for_pid(
    pid: i32,
    made: Option<&str>,
    state_dir: &Path,
) -> Result<Box<dyn DeviceCgroup>, CgroupError> {
    let what = PathBuf::from(format!("/proc/{pid}/cgroup"));
    let (_, v2) = cgroup_paths(pid)?;
    let p = match v2 {
        Some(p) if p != "/" => p,
        Some(_) => return Err(CgroupError::new(&what, Fault::InitLeft { pid })),
        None => return Err(CgroupError::new(&what, Fault::NoCgroup2)),
    };
    let ms = procfs::mounts(None).unwrap_or_default();
    let m = ms
        .iter()
        .find(|m| m.fs_type == "cgroup2")
        .ok_or_else(|| CgroupError::new(&what, Fault::NoCgroup2))?;
    let mp = Path::new(&m.mount_point);
    let dir_of = |cg: &str| {
        under(mp, &m.root, cg).ok_or_else(|| {
            let cgroup = cg.to_string();
            CgroupError::new(mp, Fault::OutsideMount { cgroup })
        })
    };
    let dir = dir_of(&p)?;
    let Some(made) = made else {
        return Err(CgroupError::new(&what, Fault::MadeUnknown { pid }));
    };
    let top = dir_of(made)?;
    if !dir.starts_with(&top) {
        return Err(CgroupError::new(
            &what,
            Fault::LeftItsCgroup {
                pid,
                now: p,
                made: made.to_string(),
                below: false,
            },
        ));
    }
    // The runtime attaches its program where it put the init: one below that, on the way to
    // the init, is no runtime's, and would be the one that narrows what a detach leaves.
    for d in dir
        .ancestors()
        .take_while(|d| *d != top && d.starts_with(&top))
    {
        if runtime_program::runtime_programs(d)? > 0 {
            return Err(CgroupError::new(
                d,
                Fault::ProgramBelow {
                    dir: d.to_path_buf(),
                    made: made.to_string(),
                },
            ));
        }
    }
    Ok(Box::new(runtime_program::RuntimeProgram::open(
        &top, state_dir,
    )?))
}

/// The cgroup libvirt made for a container, given its controller's and its init's cgroup
/// paths on one hierarchy. libvirt's controller joins the domain's cgroup (under systemd the
/// nested `libvirt/` one where libvirt >= 7.1 keeps its rules: `virCgroupAddMachineProcess`),
/// and the container cannot move it (it is outside the container's PID namespace), while a
/// container with a writable hierarchy can move its init anywhere below, and make cgroups
/// there with any name. So: the controller's cgroup, never one below it; the init must be in
/// it or below. A controller in the root cgroup anchors nothing: then the init's own.
pub fn domain_path(ctrl: &str, init: &str) -> Result<String, OutsideDomain> {
    if ctrl == "/" {
        return Ok(init.to_owned());
    }
    if init == ctrl || init.starts_with(&format!("{ctrl}/")) {
        Ok(ctrl.to_owned())
    } else {
        Err(OutsideDomain {
            init: init.to_owned(),
            domain: ctrl.to_owned(),
        })
    }
}

/// The device cgroup of a running container: its domain cgroup ([`domain_path`]), whatever
/// cgroup its init moved itself to. Grants go there (and to the sub-cgroups that inherit from
/// it); what it grants is what `reconnect` adopts from.
pub fn for_container(controller: i32, init: i32) -> Result<Box<dyn DeviceCgroup>, CgroupError> {
    let (c1, c2) = cgroup_paths(controller)?;
    let (i1, i2) = cgroup_paths(init)?;
    let what = PathBuf::from(format!("/proc/{init}/cgroup"));
    // The kernel shows `/` for a task that has left its cgroups: an exiting init, or one whose
    // main thread exited while another thread goes on (then the container cannot be reached
    // through its init at all).
    if (i1.as_deref() == Some("/") && c1.as_deref().is_some_and(|c| c != "/"))
        || (i1.is_none() && i2.as_deref() == Some("/") && c2.as_deref().is_some_and(|c| c != "/"))
    {
        return Err(CgroupError::new(&what, Fault::InitLeft { pid: init }));
    }
    let pick = |c: Option<String>, i: Option<String>| match (c, i) {
        (Some(c), Some(i)) => domain_path(&c, &i)
            .map(Some)
            .map_err(|m| CgroupError::new(&what, m)),
        (_, i) => Ok(i),
    };
    // Where the devices controller is on a v1 hierarchy, that one rules and the unified
    // hierarchy is not looked at (on hybrid hosts the two can place processes differently).
    match pick(c1, i1)? {
        Some(v1) => open(Some(v1), None, &what),
        None => open(None, pick(c2, i2)?, &what),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leftovers::Leftovers;
    use crate::node::Node;

    /// A cgroup in memory, to test the grant/rollback logic.
    #[derive(Default)]
    struct Fake {
        allowed: Vec<(u32, u32)>,
        fail_on: Option<u32>,
        revoke_fails: bool,
        log: Vec<String>,
    }

    impl DeviceCgroup for Fake {
        fn path(&self) -> &Path {
            Path::new("/fake")
        }
        fn is_allowed(&self, n: &Node) -> Result<bool, CgroupError> {
            Ok(self.allowed.contains(&(n.major, n.minor)))
        }
        fn grants_exactly(&self, n: &Node) -> Result<bool, CgroupError> {
            self.is_allowed(n)
        }
        fn allow(&mut self, n: &Node) -> Result<(), CgroupError> {
            if self.fail_on == Some(n.minor) {
                return Err(CgroupError::new(
                    Path::new("/fake"),
                    "Operation not permitted",
                ));
            }
            self.log.push(format!("allow {}:{}", n.major, n.minor));
            self.allowed.push((n.major, n.minor));
            Ok(())
        }
        fn deny(&mut self, n: &Node) -> Result<(), CgroupError> {
            self.allowed.retain(|x| *x != (n.major, n.minor));
            Ok(())
        }
        fn revoke(&mut self, n: &Node) -> Result<(), CgroupError> {
            self.log.push(format!("revoke {}:{}", n.major, n.minor));
            if self.revoke_fails {
                return Err(CgroupError::new(Path::new("/fake"), "No such device"));
            }
            self.allowed.retain(|x| *x != (n.major, n.minor));
            Ok(())
        }
    }

    fn node(minor: u32) -> Node {
        Node {
            path: format!("/dev/nvidia{minor}"),
            major: 195,
            minor,
        }
    }

    #[test]
    fn grants_only_missing_and_rolls_back_only_own() {
        let mut cg = Fake {
            allowed: vec![(195, 255)],
            ..Default::default()
        };
        let nodes = vec![node(0), node(255), node(1)];
        let added = grant_all(&mut cg, &nodes).unwrap();
        assert_eq!(added, vec![node(0), node(1)]);
        let mut cg = Fake {
            allowed: vec![(195, 255)],
            fail_on: Some(1),
            ..Default::default()
        };
        let e = grant_all(&mut cg, &nodes).unwrap_err();
        assert!(
            e.to_string().contains("granting /dev/nvidia1 (195:1)"),
            "{e}"
        );
        assert_eq!(cg.log, vec!["allow 195:0", "revoke 195:0"]);
        assert_eq!(cg.allowed, vec![(195, 255)], "pre-existing access kept");
    }

    #[test]
    fn failed_rollback_is_said_on_the_same_line() {
        let mut cg = Fake {
            fail_on: Some(2),
            revoke_fails: true,
            ..Default::default()
        };
        let e = grant_all(&mut cg, &[node(0), node(1), node(2)])
            .unwrap_err()
            .to_string();
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(
            e.contains(
                "granting /dev/nvidia2 (195:2): Operation not permitted; rollback incomplete: "
            ) && e.contains("No such device"),
            "{e}"
        );
        assert_eq!(
            cg.log,
            vec!["allow 195:0", "allow 195:1", "revoke 195:1", "revoke 195:0"]
        );
        assert_eq!(Leftovers::default().note(), "");
    }

    #[test]
    fn domain_cgroup_from_the_controller() {
        let c = "/machine/lxc-7-t1.libvirt-lxc";
        assert_eq!(domain_path(c, c).unwrap(), c);
        // The init moved itself into a sub-cgroup, whatever its name: the domain's cgroup
        // still rules (a container can make a sub-cgroup called `libvirt` too).
        assert_eq!(domain_path(c, &format!("{c}/jail")).unwrap(), c);
        assert_eq!(domain_path(c, &format!("{c}/libvirt")).unwrap(), c);
        // systemd + libvirt >= 7.1: the controller itself is in the nested libvirt/ child.
        let s = "/machine.slice/machine-lxc\\x2d7\\x2dt1.scope/libvirt";
        assert_eq!(domain_path(s, s).unwrap(), s);
        assert_eq!(domain_path(s, &format!("{s}/libvirt")).unwrap(), s);
        // Elsewhere: refused (a prefix of the name is not a parent).
        assert!(domain_path(c, "/machine/lxc-7-t1.libvirt-lxc2").is_err());
        assert!(domain_path(c, "/")
            .unwrap_err()
            .to_string()
            .contains("outside the cgroup libvirt made"));
        // A controller in the root cgroup anchors nothing.
        assert_eq!(domain_path("/", "/x").unwrap(), "/x");
    }

    #[test]
    fn mount_paths() {
        assert_eq!(
            under(
                Path::new("/sys/fs/cgroup/devices"),
                "/",
                "/machine/lxc-1-t1.libvirt-lxc"
            ),
            Some(PathBuf::from(
                "/sys/fs/cgroup/devices/machine/lxc-1-t1.libvirt-lxc"
            ))
        );
        assert_eq!(
            under(Path::new("/m"), "/machine", "/machine/x"),
            Some(PathBuf::from("/m/x"))
        );
        assert_eq!(under(Path::new("/m"), "/machine", "/other"), None);
        assert_eq!(under(Path::new("/m"), "/", "/a/../b"), None);
        assert_eq!(under(Path::new("/m"), "/", "/"), Some(PathBuf::from("/m")));
    }

    #[test]
    fn own_process_backend() {
        // This host runs cgroup v1 with the devices controller: the test process gets V1.
        let cg = for_pid(std::process::id() as i32).unwrap();
        assert!(
            cg.path().starts_with("/sys/fs/cgroup"),
            "{}",
            cg.path().display()
        );
        assert!(cg
            .is_allowed(&Node {
                path: "/dev/null".into(),
                major: 1,
                minor: 3
            })
            .unwrap());
    }
}
