//! The one set-up of a child process between `fork` and `exec`: its descriptor table
//! (nothing past 2 crosses the exec), and for the MPS control daemon its own mount
//! namespace with a private `/dev/shm`, tied to its starter's life until it daemonizes.
//! Every raw syscall of a child's set-up is here (the rooms above run programs through
//! these, with no `unsafe` of their own).

use std::ffi::CString;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Marks every descriptor from `first` on close-on-exec (closes none): for a child between
/// `fork` and `exec`, which needs its own until the exec.
pub fn cloexec_from(first: u32) {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 4;
    // SAFETY: marks descriptors of this process close-on-exec; closes none.
    unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, CLOSE_RANGE_CLOEXEC) };
}

/// Closes every descriptor from `first` on.
pub fn close_from(first: u32) {
    // SAFETY: close_range over descriptors this process owns; nothing uses them after.
    let r = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0) };
    if r < 0 {
        for fd in first..4096 {
            // SAFETY: as above (close_range is missing before Linux 5.9).
            unsafe { libc::close(fd as i32) };
        }
    }
}

/// The program `c` runs starts with descriptors 0, 1 and 2 only.
pub fn std_fds_only(c: &mut Command) -> &mut Command {
    // SAFETY: one raw syscall in the child between fork and exec.
    unsafe {
        c.pre_exec(|| {
            cloexec_from(3);
            Ok(())
        })
    }
}

/// The set-up of the MPS control daemon's starter (`nvidia-cuda-mps-control -d`): 0, 1 and 2
/// only; killed when the process that spawns it dies before it returns (so that a starter
/// killed at any point leaves no child that has not yet made itself known by its
/// environment); its own mount namespace, private below `/`, with `shm` bind-mounted over
/// `/dev/shm`; the inode of that namespace written to `ns_wr` (8 bytes, native order).
pub fn mps_daemon(c: &mut Command, shm: CString, ns_wr: RawFd) -> &mut Command {
    let parent = std::process::id() as libc::pid_t;
    let pre = move || -> std::io::Result<()> {
        cloexec_from(3);
        // SAFETY: raw syscalls in the child before exec, on its own mount namespace.
        unsafe {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The spawner died before the line above: nothing kills this child for it.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if libc::mount(
                shm.as_ptr(),
                c"/dev/shm".as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            let mut st: libc::stat = std::mem::zeroed();
            if libc::stat(c"/proc/self/ns/mnt".as_ptr(), &mut st) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let ino = (st.st_ino as u64).to_ne_bytes();
            if libc::write(ns_wr, ino.as_ptr().cast(), ino.len()) != ino.len() as isize {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // SAFETY: `pre` makes raw syscalls only.
    unsafe { c.pre_exec(pre) }
}
