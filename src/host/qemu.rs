//! libvirt's QEMU status directory (config `libvirt_qemu_dir`, `/run/libvirt/qemu` on a
//! system instance): for each running virtual machine its pid file `NAME.pid` (the QEMU
//! process) and its live status XML `NAME.xml` (`<domstatus>` wrapping the live `<domain>`,
//! hostdevs hot-plugged with `virsh attach-device` included).
//!
//! The files are libvirt's (root's), their content partly the tenant's: each is opened once
//! without following a link, must be a regular file, and is read bounded; the XML is parsed
//! strictly ([`crate::request::hostdev`]). Only a VM whose QEMU process runs counts.

use crate::host::config::Config;
use crate::host::procfs::{Proc, ProcRef};
use crate::request::hostdev::{self, HostdevError, QemuStatus};
use crate::request::metadata::MAX_XML;
use nix::fcntl::{open, OFlag};
use nix::sys::stat::{fstat, Mode, SFlag};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Why a file of libvirt's QEMU status directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum QemuFileError {
    #[error("'{name}' cannot name a file of {}", dir.display())]
    UnsafeName { name: String, dir: PathBuf },
    #[error("{}: {errno}", path.display())]
    Open {
        path: PathBuf,
        errno: nix::errno::Errno,
    },
    #[error("{} is not a regular file", path.display())]
    NotAFile { path: PathBuf },
    #[error("{} is larger than {limit} bytes", path.display())]
    TooLarge { path: PathBuf, limit: usize },
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} holds no process id", path.display())]
    NoPid { path: PathBuf },
    #[error("{}: {source}", path.display())]
    Status {
        path: PathBuf,
        #[source]
        source: HostdevError,
    },
}

/// A domain name that names a file in the directory (libvirt refuses `/` in names).
fn safe_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

/// Reads a regular file of at most `limit` bytes, opened once without following a link;
/// `Ok(None)` when it is not there.
fn read_file(path: &Path, limit: usize) -> Result<Option<Vec<u8>>, QemuFileError> {
    let fd = match open(
        path,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(errno) => {
            return Err(QemuFileError::Open {
                path: path.into(),
                errno,
            })
        }
    };
    let st = fstat(&fd).map_err(|errno| QemuFileError::Open {
        path: path.into(),
        errno,
    })?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(QemuFileError::NotAFile { path: path.into() });
    }
    let mut buf = Vec::with_capacity((st.st_size.max(0) as usize).min(limit) + 1);
    std::fs::File::from(fd)
        .take(limit as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|source| QemuFileError::Read {
            path: path.into(),
            source,
        })?;
    if buf.len() > limit {
        return Err(QemuFileError::TooLarge {
            path: path.into(),
            limit,
        });
    }
    Ok(Some(buf))
}

/// The PID in the VM's pid file, `None` when there is none (the VM does not run).
pub fn pid(cfg: &Config, name: &str) -> Result<Option<i32>, QemuFileError> {
    if !safe_name(name) {
        return Err(QemuFileError::UnsafeName {
            name: name.into(),
            dir: cfg.libvirt_qemu_dir.clone(),
        });
    }
    let path = cfg.libvirt_qemu_dir.join(format!("{name}.pid"));
    let Some(text) = read_file(&path, 64)? else {
        return Ok(None);
    };
    match std::str::from_utf8(&text)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
    {
        Some(p) if p > 0 => Ok(Some(p)),
        _ => Err(QemuFileError::NoPid { path }),
    }
}

/// The VM's QEMU process (its PID and start time) when its pid file names one that lives.
pub fn process(cfg: &Config, proc: Proc, name: &str) -> Result<Option<ProcRef>, QemuFileError> {
    Ok(pid(cfg, name)?.and_then(|p| proc.proc_ref(p)))
}

/// A running VM as libvirt's status directory shows it.
#[derive(Debug, Clone)]
pub struct RunningVm {
    /// Its QEMU process.
    pub qemu: ProcRef,
    pub status: QemuStatus,
}

/// The VMs whose QEMU process runs and whose live status XML passes a PCI or mdev device
/// through (`<hostdev`), and the status files that could not be read (for the log). A VM
/// without a pid file, or whose pid file names no live process, or whose status names
/// another process or domain, does not count.
pub fn running_with_hostdevs(cfg: &Config, proc: Proc) -> (Vec<RunningVm>, Vec<QemuFileError>) {
    running(cfg, proc, true)
}

/// Every VM whose QEMU process runs, by libvirt's status directory (as
/// [`running_with_hostdevs`], with or without hostdevs).
pub fn running_all(cfg: &Config, proc: Proc) -> (Vec<RunningVm>, Vec<QemuFileError>) {
    running(cfg, proc, false)
}

fn running(cfg: &Config, proc: Proc, with_hostdevs: bool) -> (Vec<RunningVm>, Vec<QemuFileError>) {
    let (mut vms, mut unread) = (Vec::new(), Vec::new());
    let Ok(rd) = std::fs::read_dir(&cfg.libvirt_qemu_dir) else {
        return (vms, unread);
    };
    let mut names: Vec<String> = rd
        .flatten()
        .filter_map(|e| {
            let n = e.file_name();
            let n = n.to_str()?;
            n.strip_suffix(".xml").map(str::to_owned)
        })
        .filter(|n| safe_name(n))
        .collect();
    names.sort();
    for name in names {
        let qemu = match process(cfg, proc, &name) {
            Ok(Some(q)) if proc.alive(&q) => q,
            Ok(_) => continue,
            Err(e) => {
                unread.push(e);
                continue;
            }
        };
        let path = cfg.libvirt_qemu_dir.join(format!("{name}.xml"));
        let xml = match read_file(&path, MAX_XML) {
            Ok(Some(x)) => x,
            Ok(None) => continue,
            Err(e) => {
                unread.push(e);
                continue;
            }
        };
        if with_hostdevs && !hostdev::may_hold(&xml) {
            continue;
        }
        match hostdev::parse_status(&xml) {
            Ok(status)
                if status.domain.name == name && status.pid.is_none_or(|p| p == qemu.pid) =>
            {
                vms.push(RunningVm { qemu, status })
            }
            Ok(_) => {}
            Err(source) => unread.push(QemuFileError::Status { path, source }),
        }
    }
    (vms, unread)
}
