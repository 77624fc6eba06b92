//! A process's descriptor tables, one descriptor at a time: what a `/proc/PID/fd` entry is
//! (`statx` through the magic link), whether it is a real open (`fdinfo`: `O_PATH` is none),
//! and whether two tasks share one table (`kcmp`).

use super::raw::read_raw;
use std::collections::BTreeSet;

/// `kcmp(2)`'s `KCMP_FILES`: whether two tasks share one descriptor table.
pub(super) const KCMP_FILES: libc::c_int = 2;

/// The statx fields a descriptor is told apart by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FdIdentity {
    pub(super) rdev: u64,
    pub(super) ino: u64,
    pub(super) mnt_id: u64,
}

/// `statx` of entry `name` of a `fd` directory: its numbers when it is a char device.
pub(super) fn statx_chr(
    dfd: libc::c_int,
    name: &std::ffi::CStr,
) -> Result<Option<FdIdentity>, nix::errno::Errno> {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `dfd` is the descriptor of a directory open for the caller's loop; `name` is a
    // NUL-terminated entry name that outlives the call; `stx` is a writable buffer of the
    // struct the kernel fills.
    let rc = unsafe {
        libc::statx(
            dfd,
            name.as_ptr(),
            libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE | libc::STATX_INO | libc::STATX_MNT_ID,
            stx.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(nix::errno::Errno::last());
    }
    // SAFETY: statx returned 0, so it filled the buffer (which was zeroed before).
    let st = unsafe { stx.assume_init() };
    if u32::from(st.stx_mode) & libc::S_IFMT != libc::S_IFCHR {
        return Ok(None);
    }
    Ok(Some(FdIdentity {
        rdev: libc::makedev(st.stx_rdev_major, st.stx_rdev_minor),
        ino: st.stx_ino,
        mnt_id: if st.stx_mask & libc::STATX_MNT_ID != 0 {
            st.stx_mnt_id
        } else {
            0
        },
    }))
}

/// `flags:`, `ino:` and `mnt_id:` of a `fdinfo/N` file.
pub(super) fn parse_fdinfo(text: &str) -> (Option<u64>, Option<u64>, Option<u64>) {
    let (mut flags, mut ino, mut mnt) = (None, None, None);
    for l in text.lines() {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let v = v.trim();
        match k {
            "flags" => flags = u64::from_str_radix(v, 8).ok(),
            "ino" => ino = v.parse().ok(),
            "mnt_id" => mnt = v.parse().ok(),
            _ => {}
        }
    }
    (flags, ino, mnt)
}

/// Whether descriptor `name` (seen as `seen`, a wanted number) is a real open, not an
/// `O_PATH` one. Its `fdinfo` must be of the same file (`ino:` and `mnt_id:`, Linux 5.14+;
/// before, a second `statx` after the read): a descriptor replaced between the two reads is
/// looked at again (three times; one that keeps changing is not counted, as a descriptor
/// moved during the pass is not). Gone meanwhile: not open. An `fdinfo` that cannot be read
/// or understood counts as open (the GPU is not given while it may be).
pub(super) fn really_open(
    dfd: libc::c_int,
    name: &std::ffi::CStr,
    info: &str,
    mut seen: FdIdentity,
    wanted: &BTreeSet<u64>,
) -> bool {
    const O_PATH: u64 = libc::O_PATH as u64;
    for _ in 0..3 {
        let text = match read_raw(info) {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH)) => {
                return false
            }
            Err(_) => return true,
        };
        let (flags, ino, mnt) = parse_fdinfo(&text);
        let Some(flags) = flags else {
            return true;
        };
        let same = match (ino, mnt) {
            (Some(i), Some(m)) => i == seen.ino && (seen.mnt_id == 0 || m == seen.mnt_id),
            _ => statx_chr(dfd, name).ok().flatten() == Some(seen),
        };
        if same {
            return flags & O_PATH == 0;
        }
        seen = match statx_chr(dfd, name) {
            Ok(Some(s)) if wanted.contains(&s.rdev) => s,
            _ => return false,
        };
    }
    false
}

/// Whether tasks `a` and `b` share one descriptor table (`kcmp(KCMP_FILES)`); `None` when
/// it cannot say (no `kcmp`, a task gone).
pub(super) fn same_files(a: i32, b: i32) -> Option<bool> {
    // SAFETY: kcmp(2) takes two PIDs, a type and two unused integers, and touches no memory
    // of ours.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            libc::c_long::from(a),
            libc::c_long::from(b),
            libc::c_long::from(KCMP_FILES),
            0 as libc::c_long,
            0 as libc::c_long,
        )
    };
    match rc {
        0 => Some(true),
        r if r > 0 => Some(false),
        _ => None,
    }
}

pub(super) fn denied<T>(r: nix::Result<T>) -> bool {
    matches!(r, Err(nix::errno::Errno::EACCES | nix::errno::Errno::EPERM))
}
