//! Opening devices as a container's process would: a forked child joins a cgroup (and
//! optionally a container's mount namespace), then opens each path read-write.

use nix::errno::Errno;
use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// For each path: `Ok(())` when it opened, else the errno (EPERM: the device cgroup refused;
/// ENXIO: allowed, but no driver behind the number).
pub fn open_in_cgroup(
    procs: &Path,
    mnt_ns_of: Option<i32>,
    paths: &[&Path],
) -> Result<Vec<Result<(), Errno>>, String> {
    let procs_c = CString::new(procs.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let ns = match mnt_ns_of {
        Some(pid) => Some(
            std::fs::File::open(format!("/proc/{pid}/ns/mnt"))
                .map_err(|e| format!("ns of {pid}: {e}"))?,
        ),
        None => None,
    };
    let cpaths: Vec<CString> = paths
        .iter()
        .map(|p| CString::new(p.as_os_str().as_bytes()).expect("path"))
        .collect();
    let (rd, wr) = nix::unistd::pipe().map_err(|e| e.to_string())?;
    // SAFETY: the child makes raw syscalls only (no allocation) and leaves with _exit.
    match unsafe { nix::unistd::fork() }.map_err(|e| e.to_string())? {
        // SAFETY: raw syscalls on buffers and C strings prepared before the fork; the child
        // never returns (it ends in _exit).
        nix::unistd::ForkResult::Child => unsafe {
            let mut codes = [0i32; 64];
            let fd = libc::open(procs_c.as_ptr(), libc::O_WRONLY);
            let mut buf = [0u8; 16];
            let pid = libc::getpid();
            let mut n = 0;
            let mut v = pid;
            let mut tmp = [0u8; 16];
            let mut k = 0;
            while v > 0 {
                tmp[k] = b'0' + (v % 10) as u8;
                v /= 10;
                k += 1;
            }
            while k > 0 {
                k -= 1;
                buf[n] = tmp[k];
                n += 1;
            }
            if fd < 0 || libc::write(fd, buf.as_ptr().cast(), n) != n as isize {
                libc::_exit(101);
            }
            libc::close(fd);
            if let Some(f) = &ns {
                if libc::setns(f.as_raw_fd(), libc::CLONE_NEWNS) != 0 {
                    libc::_exit(102);
                }
            }
            for (i, p) in cpaths.iter().enumerate().take(64) {
                let r = libc::open(
                    p.as_ptr(),
                    libc::O_RDWR | libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC,
                );
                codes[i] = if r >= 0 { 0 } else { *libc::__errno_location() };
                if r >= 0 {
                    libc::close(r);
                }
            }
            libc::write(
                wr.as_raw_fd(),
                codes.as_ptr().cast(),
                4 * cpaths.len().min(64),
            );
            libc::_exit(0);
        },
        nix::unistd::ForkResult::Parent { child } => {
            drop(wr);
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut std::fs::File::from(rd), &mut out)
                .map_err(|e| e.to_string())?;
            let st = nix::sys::wait::waitpid(child, None).map_err(|e| e.to_string())?;
            if st != nix::sys::wait::WaitStatus::Exited(child, 0) {
                return Err(format!(
                    "probe child: {st:?} (101: cannot join cgroup, 102: cannot setns)"
                ));
            }
            Ok(out
                .chunks_exact(4)
                .map(|c| i32::from_ne_bytes(c.try_into().expect("4")))
                .map(|e| {
                    if e == 0 {
                        Ok(())
                    } else {
                        Err(Errno::from_raw(e))
                    }
                })
                .collect())
        }
    }
}
