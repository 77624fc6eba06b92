//! The host's `/dev/char/MAJ:MIN` links for the nodes gpuhook hands to an OCI runtime.
//!
//! runc's systemd cgroup driver (Debian's runc 1.1.5) passes a device rule to systemd as
//! `DeviceAllow=/dev/char/MAJ:MIN` and drops, with a warning ("skipping device
//! /dev/char/195:0 for systemd"), every rule whose `/dev/char` entry does not exist. NVIDIA's
//! nodes have none (nvidia-modprobe makes them, not udev): systemd's device program then lacks
//! the GPU, and the next `systemctl daemon-reload` (which re-applies it) takes the GPU away
//! from a running container. gpuhook makes the entry: a symlink to the host's node, as udev
//! would. It never replaces an entry that is there (udev's own `../nvidia0`, a different
//! link), and refuses one that is not a link to the right node: a link is made only to the
//! GPU's own node, checked to be the character device of that number.

use nix::errno::Errno;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// What became of a node's `/dev/char` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Linked {
    /// gpuhook made the link.
    Created,
    /// An entry that leads to the node was there already; left as it was.
    Existing,
}

/// Why a node's `/dev/char` entry could not be made or trusted.
#[derive(Debug, thiserror::Error)]
pub enum CharLinkError {
    #[error("host node {} is not the character device {major}:{minor}", path.display())]
    NotTheNode {
        path: PathBuf,
        major: u32,
        minor: u32,
    },
    #[error("{} is not a directory; refusing to make device links in it", path.display())]
    NotADir { path: PathBuf },
    #[error("{} exists and is not a link to the character device {major}:{minor}; left as it is", path.display())]
    Foreign {
        path: PathBuf,
        major: u32,
        minor: u32,
    },
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The host's node for a container path under `/dev` (`/dev/nvidia0` → `DEV/nvidia0`).
pub fn host_node(dev_root: &Path, container_path: &str) -> Option<PathBuf> {
    let rest = container_path.strip_prefix("/dev/")?;
    if rest.is_empty()
        || rest
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return None;
    }
    Some(dev_root.join(rest))
}

fn is_chr(md: &std::fs::Metadata, major: u32, minor: u32) -> bool {
    md.file_type().is_char_device() && md.rdev() == libc::makedev(major, minor)
}

/// Makes sure `DEV/char/MAJ:MIN` exists and leads to the host's node `DEV/…` for
/// `container_path` (the config's device root: `/dev` on a real host). A missing entry
/// becomes a symlink to the node's absolute path; an entry that leads to that node stays;
/// anything else is refused (and left as it is).
pub fn ensure(
    dev_root: &Path,
    container_path: &str,
    major: u32,
    minor: u32,
) -> Result<Linked, CharLinkError> {
    let io = |what: &'static str, path: &Path, source: std::io::Error| CharLinkError::Io {
        what,
        path: path.to_path_buf(),
        source,
    };
    let node = host_node(dev_root, container_path).ok_or_else(|| CharLinkError::NotTheNode {
        path: PathBuf::from(container_path),
        major,
        minor,
    })?;
    match std::fs::symlink_metadata(&node) {
        Ok(md) if is_chr(&md, major, minor) => {}
        _ => {
            return Err(CharLinkError::NotTheNode {
                path: node,
                major,
                minor,
            })
        }
    }
    let dir = dev_root.join("char");
    match std::fs::symlink_metadata(&dir) {
        Ok(md) if md.is_dir() => {}
        Ok(_) => return Err(CharLinkError::NotADir { path: dir }),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            match std::fs::DirBuilder::new().mode(0o755).create(&dir) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
                        return Err(CharLinkError::NotADir { path: dir });
                    }
                }
                Err(e) => return Err(io("create", &dir, e)),
            }
        }
        Err(e) => return Err(io("read", &dir, e)),
    }
    let link = dir.join(format!("{major}:{minor}"));
    // Twice at most: an entry made meanwhile (udev) is judged as one found.
    for _ in 0..2 {
        match std::fs::symlink_metadata(&link) {
            Ok(md) => {
                // A link (udev's relative `../nvidia0`, or ours) that leads to the node stays;
                // runc only asks that the entry leads to a device of that number.
                let leads = md.file_type().is_symlink()
                    && std::fs::metadata(&link).is_ok_and(|m| is_chr(&m, major, minor));
                return if leads {
                    Ok(Linked::Existing)
                } else {
                    Err(CharLinkError::Foreign {
                        path: link,
                        major,
                        minor,
                    })
                };
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(io("read", &link, e)),
        }
        match std::os::unix::fs::symlink(&node, &link) {
            Ok(()) => return Ok(Linked::Created),
            Err(e) if e.raw_os_error() == Some(Errno::EEXIST as i32) => continue,
            Err(e) => return Err(io("create", &link, e)),
        }
    }
    Err(CharLinkError::Foreign {
        path: link,
        major,
        minor,
    })
}

/// [`ensure`] for a node handed to a runtime or to systemd, what it did logged: a link it
/// made, or a node with no host node of that number to link to (nothing is made: the
/// runtime's own rule stands, systemd's program will lack it). An entry that leads elsewhere
/// is the error: systemd would allow that other device.
pub fn ensure_logged(
    dev_root: &Path,
    container_path: &str,
    major: u32,
    minor: u32,
) -> Result<(), CharLinkError> {
    match ensure(dev_root, container_path, major, minor) {
        Ok(Linked::Created) => crate::log::info(&format!(
            "made {}/char/{major}:{minor} for {container_path}",
            dev_root.display()
        )),
        Ok(Linked::Existing) => {}
        Err(e @ CharLinkError::NotTheNode { .. }) => {
            crate::log::info(&format!("no /dev/char link for {container_path}: {e}"))
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn host_node_paths() {
        let d = Path::new("/x/dev");
        assert_eq!(
            host_node(d, "/dev/nvidia0"),
            Some(PathBuf::from("/x/dev/nvidia0"))
        );
        assert_eq!(
            host_node(d, "/dev/dri/renderD128"),
            Some(PathBuf::from("/x/dev/dri/renderD128"))
        );
        assert_eq!(host_node(d, "/dev/../etc/passwd"), None);
        assert_eq!(host_node(d, "/dev/"), None);
        assert_eq!(host_node(d, "/tmp/x"), None);
        assert_eq!(host_node(d, "/dev//x"), None);
    }

    /// A host node that is not a character device, or one of another number (the machine's
    /// /dev/null, only read), gets no link.
    #[test]
    fn refuses_a_node_of_another_number_or_kind() {
        let r = root();
        std::fs::write(r.path().join("nvidia0"), "").unwrap();
        let e = ensure(r.path(), "/dev/nvidia0", 195, 0).unwrap_err();
        assert!(matches!(e, CharLinkError::NotTheNode { .. }), "{e}");
        assert!(!r.path().join("char").exists());
        let e = ensure(Path::new("/dev"), "/dev/null", 1, 5).unwrap_err();
        assert!(matches!(e, CharLinkError::NotTheNode { .. }), "{e}");
    }

    /// A device root whose `nvidia0` is a symlink to /dev/null is not trusted either: the host
    /// node must be the device itself.
    #[test]
    fn refuses_a_node_that_is_a_link() {
        let r = root();
        std::os::unix::fs::symlink("/dev/null", r.path().join("nvidia0")).unwrap();
        let e = ensure(r.path(), "/dev/nvidia0", 1, 3).unwrap_err();
        assert!(matches!(e, CharLinkError::NotTheNode { .. }), "{e}");
    }

    /// A device root holding a char device 1:3 (a hard link of /dev/null where /dev is the
    /// same filesystem, else a node made as root; without either the case cannot be set up
    /// and only the other tests run): the link is made, kept, udev's relative one kept, a
    /// foreign link or file refused and left, a `char` that is a symlink not written through.
    #[test]
    fn makes_keeps_and_refuses_entries() {
        let r = root();
        if std::fs::hard_link("/dev/null", r.path().join("null")).is_err() {
            // /dev is another filesystem (devtmpfs): the whole sequence needs a char node in
            // a writable directory, which only root can make.
            if !nix::unistd::geteuid().is_root() {
                return;
            }
            nix::sys::stat::mknod(
                &r.path().join("null"),
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o666),
                libc::makedev(1, 3),
            )
            .unwrap();
        }
        let link = r.path().join("char/1:3");
        assert_eq!(
            ensure(r.path(), "/dev/null", 1, 3).unwrap(),
            Linked::Created
        );
        assert_eq!(std::fs::read_link(&link).unwrap(), r.path().join("null"));
        assert_eq!(
            ensure(r.path(), "/dev/null", 1, 3).unwrap(),
            Linked::Existing
        );
        // udev's relative form stays.
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink("../null", &link).unwrap();
        assert_eq!(
            ensure(r.path(), "/dev/null", 1, 3).unwrap(),
            Linked::Existing
        );
        assert_eq!(std::fs::read_link(&link).unwrap(), PathBuf::from("../null"));
        // A link elsewhere, and a non-link, are refused and left.
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
        let e = ensure(r.path(), "/dev/null", 1, 3).unwrap_err();
        assert!(matches!(e, CharLinkError::Foreign { .. }), "{e}");
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            PathBuf::from("/etc/passwd")
        );
        std::fs::remove_file(&link).unwrap();
        std::fs::write(&link, "x").unwrap();
        let e = ensure(r.path(), "/dev/null", 1, 3).unwrap_err();
        assert!(matches!(e, CharLinkError::Foreign { .. }), "{e}");
        assert_eq!(std::fs::read(&link).unwrap(), b"x");
        // A `char` that is not a directory (a link to one elsewhere) is not written through.
        std::fs::remove_dir_all(r.path().join("char")).unwrap();
        let other = root();
        std::os::unix::fs::symlink(other.path(), r.path().join("char")).unwrap();
        let e = ensure(r.path(), "/dev/null", 1, 3).unwrap_err();
        assert!(matches!(e, CharLinkError::NotADir { .. }), "{e}");
        assert_eq!(std::fs::read_dir(other.path()).unwrap().count(), 0);
    }
}
