//! Small safe wrappers of system calls the rooms above `host/` need, each with its `SAFETY`
//! reasoning here (`unsafe` lives only in `enter/`, `host/` and `cgroup/`).

use nix::errno::Errno;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

/// `flock(2)` of `fd` with `op` (`LOCK_EX`, `LOCK_NB`, …), once (an `EINTR` is the caller's
/// to retry).
pub fn flock(fd: BorrowedFd, op: libc::c_int) -> Result<(), Errno> {
    // SAFETY: flock(2) on a descriptor the caller keeps open for the call (a `BorrowedFd`);
    // it touches no memory of ours.
    Errno::result(unsafe { libc::flock(fd.as_raw_fd(), op) }).map(drop)
}

/// `statx` (`STATX_TYPE` only, `AT_STATX_DONT_SYNC`) of entry `name` of the directory open as
/// `dfd`: the device number when it is a char device; `None` for anything else or a failed
/// call.
pub fn statx_char_rdev(dfd: RawFd, name: &std::ffi::CStr) -> Option<u64> {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `dfd` is only a number to the kernel (a closed one fails with `EBADF`); `name`
    // is a NUL-terminated entry name that outlives the call; `stx` is a writable buffer of
    // the struct the kernel fills.
    let rc = unsafe {
        libc::statx(
            dfd,
            name.as_ptr(),
            libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE,
            stx.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return None;
    }
    // SAFETY: statx returned 0, so it filled the (zeroed) buffer.
    let st = unsafe { stx.assume_init() };
    (u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFCHR)
        .then(|| libc::makedev(st.stx_rdev_major, st.stx_rdev_minor))
}

/// `pidfd_open(2)` of `pid`: a descriptor that names that very process (never one that
/// reuses its PID later), closed when dropped.
pub fn pidfd_open(pid: i32) -> Result<std::os::fd::OwnedFd, Errno> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a PID and flags (none) and touches no memory of ours.
    let fd = Errno::result(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: the call returned a new descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `pidfd_send_signal(2)`: `sig` to the process `pidfd` names (gone: `ESRCH`).
pub fn pidfd_kill(pidfd: BorrowedFd, sig: nix::sys::signal::Signal) -> Result<(), Errno> {
    // SAFETY: the descriptor stays open for the call (a `BorrowedFd`); no siginfo (null),
    // no flags.
    Errno::result(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig as libc::c_int,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    })
    .map(drop)
}

/// `dup2(2)` of `fd` onto descriptor number `n`, which the caller owns (a test's fixed number
/// no one else uses): the new descriptor, closed when dropped. Not close-on-exec (`dup2`
/// clears it), so an exec inherits it.
#[cfg(test)]
pub fn dup_onto(fd: BorrowedFd, n: RawFd) -> Result<std::os::fd::OwnedFd, Errno> {
    use std::os::fd::FromRawFd;
    // SAFETY: dup2 on a descriptor the caller keeps open and a number the caller owns.
    let got = Errno::result(unsafe { libc::dup2(fd.as_raw_fd(), n) })?;
    // SAFETY: dup2 returned `n`, a descriptor now open and owned by nothing else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(got) })
}
