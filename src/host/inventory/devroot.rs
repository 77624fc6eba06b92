//! The host's device root, opened once per scan ([`DevRoot`]), and why a node cannot be had
//! there ([`NodeUnavailable`]).

use super::gpu::DevNode;
use crate::node::Node;
use nix::fcntl::AtFlags;
use nix::sys::stat::fstatat;
use std::fs;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// Why a device node, or a GPU's MIG capabilities, cannot be had: the message becomes the
/// GPU's problem.
#[derive(Debug, thiserror::Error)]
pub(super) enum NodeUnavailable {
    /// The device root did not open.
    #[error("{}: cannot open the device root", .root.display())]
    NoRoot { root: PathBuf },
    /// The node cannot be `stat`ed.
    #[error("{}: {source}", .path.display())]
    Stat {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The node is no character device (or a link to one).
    #[error("{} is not a character device", .path.display())]
    NotChar { path: PathBuf },
    /// No capability node, and no `nvidia-caps` major to make one from.
    #[error("no /dev/{rel} and no nvidia-caps major in {}", .devices.display())]
    NoCapsMajor { rel: String, devices: PathBuf },
    /// A driver file or directory cannot be read.
    #[error("{}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A capability's `access` file names no minor.
    #[error("{}: no DeviceFileMinor", .path.display())]
    NoMinor { path: PathBuf },
}

/// The host's device root, opened once per scan: nodes are looked up relative to it.
pub(super) struct DevRoot<'a> {
    pub(super) path: &'a Path,
    pub(super) fd: Option<OwnedFd>,
    /// The proc root (`/proc/devices` names the `nvidia-caps` major).
    pub(super) proc: &'a Path,
}

impl DevRoot<'_> {
    /// The host node behind container path `/dev/<rel>`: must be a character device (not a
    /// symlink to one).
    pub(super) fn node(&self, rel: &str) -> Result<DevNode, NodeUnavailable> {
        let p = self.path.join(rel);
        let fd = self.fd.as_ref().ok_or_else(|| NodeUnavailable::NoRoot {
            root: self.path.to_path_buf(),
        })?;
        let st =
            fstatat(fd, rel, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(|e| NodeUnavailable::Stat {
                path: p.clone(),
                source: std::io::Error::from(e),
            })?;
        if st.st_mode & libc::S_IFMT != libc::S_IFCHR {
            return Err(NodeUnavailable::NotChar { path: p });
        }
        Ok(DevNode {
            node: Node::new(
                format!("/dev/{rel}"),
                libc::major(st.st_rdev),
                libc::minor(st.st_rdev),
            ),
            mode: st.st_mode & 0o777,
        })
    }
}

impl DevRoot<'_> {
    /// `/dev/nvidia-caps/nvidia-cap<m>`: the host's node when it has one (`stat`), else the
    /// number from the `nvidia-caps` major of `/proc/devices` (nvidia-modprobe makes these
    /// nodes on demand: a host may lack them).
    pub(super) fn cap_node(&self, minor: u32, mode: u32) -> Result<DevNode, NodeUnavailable> {
        let rel = format!("nvidia-caps/nvidia-cap{minor}");
        if let Ok(n) = self.node(&rel) {
            return Ok(n);
        }
        let devices = self.proc.join("devices");
        let major = fs::read_to_string(&devices)
            .ok()
            .and_then(|t| {
                t.lines().find_map(|l| {
                    let (n, name) = l.trim().split_once(' ')?;
                    (name.trim() == "nvidia-caps").then(|| n.parse().ok())?
                })
            })
            .ok_or_else(|| NodeUnavailable::NoCapsMajor {
                rel: rel.clone(),
                devices: devices.clone(),
            })?;
        Ok(DevNode {
            node: Node::new(format!("/dev/{rel}"), major, minor),
            mode,
        })
    }
}
