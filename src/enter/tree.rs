//! A detached mount ([`DetachedTree`]): what the CDI work and the container helper move into
//! a container, by descriptor.

use nix::errno::Errno;
use std::os::fd::{AsRawFd, OwnedFd};

pub(crate) const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
pub(crate) const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

/// A detached copy of a mount's source, its attributes set: ready to be moved into a
/// container. Call in the host's mount namespace.
pub struct DetachedTree {
    pub(super) fd: OwnedFd,
    pub(super) dev: u64,
    pub(super) ino: u64,
}

impl DetachedTree {
    /// Its filesystem and inode: what a `stat` where it is mounted shows.
    pub fn id(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }

    /// Moves it onto `target` (an `O_PATH` handle of the place), descriptors only.
    pub fn move_onto(&self, target: &OwnedFd) -> Result<(), Errno> {
        // SAFETY: move_mount between two descriptors we hold, with empty paths.
        let r = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                self.fd.as_raw_fd(),
                c"".as_ptr(),
                target.as_raw_fd(),
                c"".as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
            )
        };
        Errno::result(r).map(drop)
    }
}
