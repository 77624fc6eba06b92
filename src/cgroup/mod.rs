//! Device access of a container's cgroup: one interface, two backends (as youki's
//! libcgroups does), chosen by what the host runs for the container's init.
//!
//! - v1: `c MAJ:MIN rw` into `devices.allow` of the init's devices cgroup; `devices.deny`
//!   revokes; `devices.list` says what is allowed.
//! - v2: libvirt's own `BPF_PROG_TYPE_CGROUP_DEVICE` program on the init's cgroup keeps its
//!   rules in a hash map; gpuhook adds exact entries to that map (never a second program).
//!
//! Least privilege: exact device numbers, `rw` only (no `m`, no wildcards).

pub mod bpf;
mod v1;
mod v2;

pub use v1::V1;
pub use v2::V2;

use crate::procfs;
use crate::state::Node;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("cgroup {path}: {msg}")]
pub struct CgroupError {
    pub path: String,
    pub msg: String,
}

impl CgroupError {
    pub fn new(path: &Path, msg: impl Into<String>) -> Self {
        CgroupError {
            path: path.display().to_string(),
            msg: msg.into(),
        }
    }
}

/// A cgroup whose device access gpuhook can widen by exact character devices.
pub trait DeviceCgroup {
    /// The cgroup directory (for messages).
    fn path(&self) -> &Path;
    /// Whether `rw` access to the char device is already allowed.
    fn is_allowed(&self, node: &Node) -> Result<bool, CgroupError>;
    /// Whether a rule for exactly this char device grants `rw` (a wildcard rule is evidence
    /// of nothing: it names no GPU). What `reconnect` adopts from.
    fn grants_exactly(&self, node: &Node) -> Result<bool, CgroupError>;
    /// Allows `rw` access to exactly this char device.
    fn allow(&mut self, node: &Node) -> Result<(), CgroupError>;
    /// Takes back an access this gpuhook run added.
    fn revoke(&mut self, node: &Node) -> Result<(), CgroupError>;
}

/// Grants every node not yet allowed. Returns the ones this call added (the only ones a
/// rollback may take back: access the container had before, or that another owner gave, is
/// never revoked). On failure, revokes what it added and returns the error.
pub fn grant_all(cg: &mut dyn DeviceCgroup, nodes: &[Node]) -> Result<Vec<Node>, CgroupError> {
    let mut added = Vec::new();
    for n in nodes {
        let r = cg.is_allowed(n).and_then(|ok| {
            if ok {
                Ok(false)
            } else {
                cg.allow(n).map(|_| true)
            }
        });
        match r {
            Ok(true) => added.push(n.clone()),
            Ok(false) => {}
            Err(e) => {
                let left = revoke_all(cg, &added);
                return Err(CgroupError {
                    path: e.path,
                    msg: format!(
                        "granting {} ({}:{}): {}{}",
                        n.path,
                        n.major,
                        n.minor,
                        e.msg,
                        rollback_note(&left)
                    ),
                });
            }
        }
    }
    Ok(added)
}

/// Best-effort revoke, newest first; returns what could not be taken back, so the caller
/// can say it on its one error line.
pub fn revoke_all(cg: &mut dyn DeviceCgroup, nodes: &[Node]) -> Vec<String> {
    nodes
        .iter()
        .rev()
        .filter_map(|n| cg.revoke(n).err().map(|e| e.to_string()))
        .collect()
}

/// `""`, or `"; rollback incomplete: …"` naming what a rollback could not undo.
pub fn rollback_note(left: &[String]) -> String {
    if left.is_empty() {
        String::new()
    } else {
        format!("; rollback incomplete: {}", left.join("; "))
    }
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

/// The device cgroup of a process: v1 if its devices controller is on a v1 hierarchy, else
/// v2 (its cgroup on the unified hierarchy).
pub fn for_pid(pid: i32) -> Result<Box<dyn DeviceCgroup>, CgroupError> {
    let proc_path = PathBuf::from(format!("/proc/{pid}/cgroup"));
    let text = std::fs::read_to_string(&proc_path)
        .map_err(|e| CgroupError::new(&proc_path, format!("cannot read: {e}")))?;
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
    let ms = procfs::mounts(None).unwrap_or_default();
    let dir_of = |m: &procfs::Mount, p: &str| {
        let mp = Path::new(&m.mount_point);
        under(mp, &m.root, p)
            .ok_or_else(|| CgroupError::new(mp, format!("cgroup path {p} is outside the mount")))
    };
    if let Some(p) = v1_path {
        let m = ms
            .iter()
            .find(|m| m.fs_type == "cgroup" && m.super_options.split(',').any(|o| o == "devices"))
            .ok_or_else(|| CgroupError::new(&proc_path, "devices controller is not mounted"))?;
        return Ok(Box::new(V1::new(dir_of(m, &p)?)));
    }
    if let Some(p) = v2_path {
        let m = ms
            .iter()
            .find(|m| m.fs_type == "cgroup2")
            .ok_or_else(|| CgroupError::new(&proc_path, "no cgroup2 mount"))?;
        return Ok(Box::new(V2::open(&dir_of(m, &p)?)?));
    }
    Err(CgroupError::new(
        &proc_path,
        "process has no devices cgroup (v1) nor a unified cgroup (v2)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(rollback_note(&[]), "");
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
