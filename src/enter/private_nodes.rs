//! The nodes gpuhook makes on the host for a user-namespaced OCI container (the runtime
//! bind-mounts them: it cannot make them there, and a bind of the host's own node would be
//! owned by host root): one directory per container under a root beside the state. The nodes
//! are made and changed through descriptors of their directory ([`crate::enter::devdir`]'s
//! [`DirOps`]), never through a path that could lead elsewhere.

use crate::enter::devdir::{DirOps, Sys};
use crate::node::NodeSpec;
use nix::fcntl::OFlag;
use nix::sys::stat::{fchmodat, FchmodatFlags, Mode};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// What could not be done to a node directory or a node in it.
#[derive(Debug, thiserror::Error)]
pub enum PrivateNodeError {
    /// A node directory or a node (`what`: create, mount a tmpfs at, chown, chmod).
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot make node {}: {source}", path.display())]
    Mknod {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
}

fn io(what: &'static str, path: &Path, source: impl Into<std::io::Error>) -> PrivateNodeError {
    PrivateNodeError::Io {
        what,
        path: path.to_path_buf(),
        source: source.into(),
    }
}

/// Makes `root` (mode 0700, with its parents) a filesystem the runtime can bind nodes from
/// into a user namespace (a tmpfs of its own where it lies on a `nodev` or non-`relatime`
/// mount).
pub fn prepare_root(root: &Path) -> Result<(), PrivateNodeError> {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(root)
        .map_err(|e| io("create", root, e))?;
    nodes_mount(root).map_err(|e| io("mount a tmpfs at", root, e))
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

/// Removes the directories under `root` whose name `keep` does not keep.
pub fn sweep(root: &Path, keep: impl Fn(&str) -> bool) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !keep(&name) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Makes `dir` afresh (mode 0700; what was there goes) and in it the nodes: `I-NAME` for the
/// `I`th node, its number the host node's, owner and mode the node's. Returns their paths.
pub fn make(dir: &Path, nodes: &[NodeSpec]) -> Result<Vec<String>, PrivateNodeError> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(|e| io("create", dir, e))?;
    let fd = nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io("create", dir, e))?;
    let ops = Sys;
    let mut out = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let base = Path::new(&n.path)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let name = format!("{i}-{base}");
        let p = dir.join(&name);
        ops.mknod_chr(&fd, &name, 0o600, libc::makedev(n.major, n.minor))
            .map_err(|source| PrivateNodeError::Mknod {
                path: p.clone(),
                source,
            })?;
        let obj = ops.open_obj(&fd, &name).map_err(|e| io("chown", &p, e))?;
        ops.chown_obj(&obj, n.uid, n.gid)
            .map_err(|e| io("chown", &p, e))?;
        fchmodat(
            &fd,
            name.as_str(),
            Mode::from_bits_truncate(n.mode & 0o777),
            FchmodatFlags::FollowSymlink,
        )
        .map_err(|e| io("chmod", &p, e))?;
        out.push(p.to_string_lossy().into_owned());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    /// The nodes as the runtime.rs of before made them: `I-NAME`, the host's number, the
    /// request's owner and mode (whatever the umask), in a fresh 0700 directory.
    #[test]
    fn makes_numbered_nodes_with_owner_and_mode() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root (mknod, chown)");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("ctr");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("stale"), b"x").unwrap();
        let node = |path: &str, minor, mode, uid| NodeSpec {
            node: crate::node::Node::new(path, 1, minor),
            mode,
            uid,
            gid: uid + 1,
        };
        let nodes = [
            node("/dev/null", 3, 0o666, 1000),
            node("/dev/dri/zero", 5, 0o640, 2000),
        ];
        let old = nix::sys::stat::umask(Mode::from_bits_truncate(0o077));
        let made = make(&dir, &nodes);
        nix::sys::stat::umask(old);
        let made = made.unwrap();
        assert_eq!(
            made,
            [
                dir.join("0-null").to_string_lossy(),
                dir.join("1-zero").to_string_lossy()
            ]
        );
        assert!(!dir.join("stale").exists());
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o7777, 0o700);
        for (p, n) in made.iter().zip(&nodes) {
            let md = std::fs::symlink_metadata(p).unwrap();
            assert!(md.file_type().is_char_device());
            assert_eq!(md.rdev(), libc::makedev(n.major, n.minor));
            assert_eq!((md.uid(), md.gid()), (n.uid, n.gid));
            assert_eq!(md.mode() & 0o7777, n.mode);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A sweep keeps what `keep` names, and nothing else.
    #[test]
    fn sweep_keeps_what_it_is_told() {
        let t = tempfile::tempdir().unwrap();
        for d in ["a", "b"] {
            std::fs::create_dir(t.path().join(d)).unwrap();
        }
        sweep(t.path(), |n| n == "a");
        assert!(t.path().join("a").exists());
        assert!(!t.path().join("b").exists());
    }
}
