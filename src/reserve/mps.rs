//! NVIDIA MPS control daemons for GPUs shared in `mps` mode (SPEC "Sharing", MPS): one per
//! GPU, started when its first slot is reserved and told to `quit` when its last is freed.
//!
//! Layout, beside the state file: `mps/<UUID>/pipe` (the daemon's pipe directory, 0755:
//! the daemon makes its own control and client pipes in it, with the modes it chooses),
//! `mps/<UUID>/log` (0755) and `mps/<UUID>/shm` (1777, as `/dev/shm`: clients in containers,
//! any user, create their segments there). All are root's. The daemon runs in a mount
//! namespace of its own where `shm` is bind-mounted over `/dev/shm`; each sharer's container
//! gets `pipe` at `/tmp/nvidia-mps` and `shm` at `/dev/shm`.
//!
//! What is decided (which daemons to start, which to stop) is [`plan`], on the state alone;
//! what is done to the host is [`Mps`], passed in through the lifecycle's facts.

use crate::host::config::{Config, ShareMode, Sharing};
use crate::host::inventory::Inventory;
use crate::host::procfs::{Proc, ProcRef};
use crate::ids::{Pci, Unit};
use crate::reserve::state::State;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where a container finds the daemon's pipes (the MPS clients' default).
pub const CONTAINER_PIPE: &str = crate::cdi::MPS_TARGETS[0];
/// Where a container finds the daemon's shared memory.
pub const CONTAINER_SHM: &str = crate::cdi::MPS_TARGETS[1];
/// The file the real daemon writes its PID to, in its pipe directory.
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// How long the daemon may take to be ready, and a client command to answer.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// How often a wait for the daemon (its PID file, its exit, a client's) looks again: each
/// first sharer and last free waits on it under the state lock.
const POLL: Duration = Duration::from_millis(2);

/// A daemon gpuhook started, as the state records it (keyed by its GPU's PCI address).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Daemon {
    pub proc: ProcRef,
    pub uuid: String,
    pub dir: PathBuf,
}

impl Daemon {
    pub fn pipe(&self) -> PathBuf {
        self.dir.join("pipe")
    }
    pub fn shm(&self) -> PathBuf {
        self.dir.join("shm")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    #[error("GPU {pci} is shared with MPS but has no UUID: cannot start its MPS daemon")]
    NoUuid { pci: Pci },
    #[error("MPS daemon of GPU {pci} ({uuid}): {what}: {cause}")]
    Io {
        pci: Pci,
        uuid: String,
        what: String,
        cause: std::io::Error,
    },
    #[error("MPS daemon of GPU {pci} ({uuid}): {what}")]
    Failed {
        pci: Pci,
        uuid: String,
        what: String,
    },
}

/// The daemon serving a holder of `units` (the first of its slots with one recorded: a
/// container has one `/tmp/nvidia-mps`), with its GPU.
pub fn daemon_for<'s>(st: &'s State, units: &[Unit]) -> Option<(Pci, &'s Daemon)> {
    units
        .iter()
        .filter(|u| u.is_slot())
        .find_map(|u| st.mps.get(&u.pci()).map(|d| (u.pci(), d)))
}

/// What a sharer's container gets of its daemon, as bind mounts (made by the container
/// helper at `started` and `attach`, as the CDI mounts are): `pipe` at `/tmp/nvidia-mps`,
/// **read-only** (clients open the daemon's FIFOs and sockets there, which a read-only
/// mount allows; they create nothing in it, and a sharer must not plant anything where the
/// daemon and gpuhook, both host root, look: its PID file, its `control`), and `shm` at
/// `/dev/shm`, writable (clients create their segments there); `nosuid` and `nodev` as
/// every mount gpuhook makes.
pub fn mounts(d: &Daemon) -> Vec<crate::cdi::BindMount> {
    [
        (d.pipe(), CONTAINER_PIPE, false),
        (d.shm(), CONTAINER_SHM, true),
    ]
    .into_iter()
    .map(|(src, dst, rw)| crate::cdi::BindMount {
        source: src.display().to_string(),
        target: dst.into(),
        rw,
        recursive: false,
        noexec: false,
        dir: true,
    })
    .collect()
}

/// Whether a recorded mount target is one of a daemon's (not a CDI spec's).
pub fn is_target(t: &str) -> bool {
    crate::cdi::MPS_TARGETS.contains(&t)
}

/// The directory of a GPU's daemon: `mps/<UUID>` beside the state file.
pub fn dir_for(cfg: &Config, uuid: &str) -> PathBuf {
    cfg.state_file
        .parent()
        .unwrap_or(Path::new("/"))
        .join("mps")
        .join(uuid)
}

/// What to do: daemons to start (a GPU shared with MPS, a slot of it held, no live daemon
/// recorded) and to stop (a recorded daemon whose GPU no reservation holds a slot of).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub start: Vec<Pci>,
    pub stop: Vec<Pci>,
}

/// [`Plan`] on the state; `mps`: the GPUs shared with MPS; `alive`: whether a process runs.
pub fn plan(st: &State, mps: &BTreeSet<Pci>, alive: &dyn Fn(&ProcRef) -> bool) -> Plan {
    let used: BTreeSet<Pci> = st
        .reservations
        .values()
        .flat_map(|r| r.gpus.iter())
        .filter(|u| u.is_slot())
        .map(Unit::pci)
        .collect();
    Plan {
        start: used
            .iter()
            .filter(|p| mps.contains(p))
            .filter(|p| !st.mps.get(p).is_some_and(|d| alive(&d.proc)))
            .copied()
            .collect(),
        stop: st
            .mps
            .keys()
            .filter(|p| !used.contains(p))
            .copied()
            .collect(),
    }
}

/// The GPUs of the inventory shared with MPS.
pub fn mps_gpus(inv: &Inventory) -> BTreeSet<Pci> {
    inv.gpus
        .iter()
        .filter(|g| g.sharing.is_some_and(|s| s.mode == ShareMode::Mps))
        .map(|g| g.pci)
        .collect()
}

/// The host work: starting a daemon (and setting its limits), telling one to quit.
pub trait Mps {
    fn start(
        &self,
        cfg: &Config,
        pci: Pci,
        uuid: &str,
        sharing: &Sharing,
    ) -> Result<Daemon, MpsError>;
    fn quit(&self, cfg: &Config, pci: Pci, d: &Daemon) -> Result<(), MpsError>;
}

/// Starts the daemons the plan says (first under the state lock: the caller's step fails,
/// and nothing is reserved, when one cannot be started) and records them.
pub fn start_needed(
    cfg: &Config,
    m: &dyn Mps,
    proc: Proc,
    st: &mut State,
    inv: &Inventory,
) -> Result<Vec<String>, MpsError> {
    let p = plan(st, &mps_gpus(inv), &|r| proc.alive(r));
    let mut notes = Vec::new();
    let mut started: Vec<(Pci, Daemon)> = Vec::new();
    for pci in p.start {
        let Some(g) = inv.by_pci(&pci) else { continue };
        let Some(sharing) = g.sharing else { continue };
        let d = g
            .uuid
            .clone()
            .ok_or(MpsError::NoUuid { pci })
            .and_then(|uuid| m.start(cfg, pci, &uuid, &sharing));
        match d {
            Ok(d) => started.push((pci, d)),
            Err(e) => {
                // The step fails and its state is not written: the daemons this call
                // started would run unrecorded.
                for (pci, d) in &started {
                    let _ = m.quit(cfg, *pci, d);
                }
                return Err(e);
            }
        }
    }
    for (pci, d) in started {
        notes.push(format!(
            "started MPS daemon pid {} for GPU {pci} ({})",
            d.proc.pid, d.uuid
        ));
        st.mps.insert(pci, d);
    }
    Ok(notes)
}

/// Tells the daemons without sharers to quit and forgets them (one that died is forgotten
/// too); one that cannot be told stays recorded, for the next free or `reconcile`.
pub fn stop_unused(cfg: &Config, m: &dyn Mps, proc: Proc, st: &mut State) -> Vec<String> {
    let p = plan(st, &BTreeSet::new(), &|r| proc.alive(r));
    let mut notes = Vec::new();
    for pci in p.stop {
        let Some(d) = st.mps.get(&pci).cloned() else {
            continue;
        };
        if !proc.alive(&d.proc) {
            st.mps.remove(&pci);
            notes.push(format!(
                "MPS daemon pid {} of GPU {pci} had already exited",
                d.proc.pid
            ));
            continue;
        }
        match m.quit(cfg, pci, &d) {
            Ok(()) => {
                st.mps.remove(&pci);
                notes.push(format!(
                    "stopped MPS daemon pid {} of GPU {pci} (no sharer left)",
                    d.proc.pid
                ));
            }
            Err(e) => notes.push(format!("{e}; it stays recorded")),
        }
    }
    notes
}

/// The real daemons.
pub struct Host;

/// The environment the daemon and its clients get, and nothing else.
fn env(uuid: &str, dir: &Path) -> Vec<(String, String)> {
    vec![
        ("CUDA_VISIBLE_DEVICES".into(), uuid.into()),
        (
            "CUDA_MPS_PIPE_DIRECTORY".into(),
            dir.join("pipe").display().to_string(),
        ),
        (
            "CUDA_MPS_LOG_DIRECTORY".into(),
            dir.join("log").display().to_string(),
        ),
    ]
}

/// The client commands that set the configured limits.
pub fn limit_commands(s: &Sharing) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(m) = s.memory_limit_mib {
        v.push(format!("set_default_device_pinned_mem_limit 0 {m}M"));
    }
    if let Some(p) = s.active_thread_percentage {
        v.push(format!("set_default_active_thread_percentage {p}"));
    }
    v
}

/// Marks every descriptor from 3 on close-on-exec (the child of a `Command` needs its own
/// until exec), so that the program starts with 0, 1 and 2 only.
fn cloexec_from_3() {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 4;
    // SAFETY: marks descriptors of this (child) process; closes none.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) };
}

/// The child's exit status, when it exits within `limit`; otherwise it is killed (and
/// reaped) and `None`.
fn wait_within(ch: &mut std::process::Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let end = Instant::now() + limit;
    loop {
        match ch.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() < end => std::thread::sleep(POLL),
            _ => {
                let _ = ch.kill();
                let _ = ch.wait();
                return None;
            }
        }
    }
}

/// The PID in the daemon's PID file: at most 32 bytes of a regular file, opened without
/// following a link and without blocking (a FIFO at its name is not read), since the file is
/// in the directory the daemon's clients reach.
fn read_pid(path: &Path) -> Option<i32> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    f.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok().filter(|p: &i32| *p > 1)
}

/// Whether process `pid` runs in the mount namespace whose inode is `ns`.
fn in_namespace(pid: i32, ns: u64) -> bool {
    nix::sys::stat::stat(format!("/proc/{pid}/ns/mnt").as_str()).is_ok_and(|st| st.st_ino == ns)
}

impl Host {
    fn err(
        pci: Pci,
        uuid: &str,
        what: impl Into<String>,
    ) -> impl FnOnce(std::io::Error) -> MpsError {
        let (uuid, what) = (uuid.to_string(), what.into());
        move |cause| MpsError::Io {
            pci,
            uuid,
            what,
            cause,
        }
    }

    fn mkdirs(pci: Pci, uuid: &str, dir: &Path) -> Result<(), MpsError> {
        for (d, mode) in [
            (dir.to_path_buf(), 0o755),
            (dir.join("pipe"), 0o755),
            (dir.join("log"), 0o755),
            (dir.join("shm"), 0o1777),
        ] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(&d)
                .map_err(Self::err(pci, uuid, format!("mkdir {}", d.display())))?;
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode))
                .map_err(Self::err(pci, uuid, format!("chmod {}", d.display())))?;
        }
        Ok(())
    }

    /// Runs `MPS` in client mode with these commands on its standard input; its replies.
    fn client(
        cfg: &Config,
        pci: Pci,
        uuid: &str,
        dir: &Path,
        cmds: &[String],
    ) -> Result<String, MpsError> {
        let mut c = Command::new(&cfg.mps_control);
        c.env_clear()
            .envs(env(uuid, dir))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: only a raw syscall between fork and exec.
        unsafe {
            c.pre_exec(|| {
                cloexec_from_3();
                Ok(())
            })
        };
        let mut ch = c.spawn().map_err(Self::err(
            pci,
            uuid,
            format!("run {}", cfg.mps_control.display()),
        ))?;
        if let Some(mut i) = ch.stdin.take() {
            let text: String = cmds.iter().map(|l| format!("{l}\n")).collect();
            let _ = i.write_all(text.as_bytes());
        }
        let Some(status) = wait_within(&mut ch, DEADLINE) else {
            return Err(MpsError::Failed {
                pci,
                uuid: uuid.into(),
                what: format!(
                    "{} did not answer {cmds:?} within {DEADLINE:?}",
                    cfg.mps_control.display()
                ),
            });
        };
        let mut out = String::new();
        if let Some(mut o) = ch.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        if !status.success() {
            let mut e = String::new();
            if let Some(mut s) = ch.stderr.take() {
                let _ = s.read_to_string(&mut e);
            }
            return Err(MpsError::Failed {
                pci,
                uuid: uuid.into(),
                what: format!("{cmds:?}: {status}: {}", e.trim()),
            });
        }
        Ok(out)
    }
}

impl Mps for Host {
    fn start(
        &self,
        cfg: &Config,
        pci: Pci,
        uuid: &str,
        sharing: &Sharing,
    ) -> Result<Daemon, MpsError> {
        let dir = dir_for(cfg, uuid);
        Self::mkdirs(pci, uuid, &dir)?;
        let pid_file = dir.join("pipe").join(PID_FILE);
        let _ = std::fs::remove_file(&pid_file);
        let shm = std::ffi::CString::new(dir.join("shm").as_os_str().as_encoded_bytes()).map_err(
            |_| MpsError::Failed {
                pci,
                uuid: uuid.into(),
                what: "its directory has a NUL".into(),
            },
        )?;
        // The child says the inode of the mount namespace made for it (below), so that the
        // PID the daemon writes can be checked to be of a process in it.
        let (ns_rd, ns_wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| Self::err(pci, uuid, "pipe")(e.into()))?;
        let ns_wr_fd = std::os::fd::AsRawFd::as_raw_fd(&ns_wr);
        let mut c = Command::new(&cfg.mps_control);
        c.arg("-d")
            .env_clear()
            .envs(env(uuid, &dir))
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let pre = move || -> std::io::Result<()> {
            cloexec_from_3();
            // SAFETY: raw syscalls in the child before exec, on its own mount namespace.
            unsafe {
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
                if libc::write(ns_wr_fd, ino.as_ptr().cast(), ino.len()) != ino.len() as isize {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        };
        // SAFETY: `pre` makes raw syscalls only.
        unsafe { c.pre_exec(pre) };
        let mut ch = c.spawn().map_err(Self::err(
            pci,
            uuid,
            format!("start {} -d", cfg.mps_control.display()),
        ))?;
        drop(ns_wr);
        let mut ino = [0u8; 8];
        std::fs::File::from(ns_rd)
            .read_exact(&mut ino)
            .map_err(Self::err(pci, uuid, "read the daemon's mount namespace"))?;
        let ns = u64::from_ne_bytes(ino);
        // `-d` returns once the daemon is forked: within the deadline, or it is killed (the
        // caller holds the state lock).
        let Some(status) = wait_within(&mut ch, DEADLINE) else {
            return Err(MpsError::Failed {
                pci,
                uuid: uuid.into(),
                what: format!(
                    "{} -d did not return within {DEADLINE:?}",
                    cfg.mps_control.display()
                ),
            });
        };
        if !status.success() {
            return Err(MpsError::Failed {
                pci,
                uuid: uuid.into(),
                what: format!("{} -d: {status}", cfg.mps_control.display()),
            });
        }
        let end = Instant::now() + DEADLINE;
        let pid = loop {
            if let Some(p) = read_pid(&pid_file) {
                break p;
            }
            if Instant::now() >= end {
                return Err(MpsError::Failed {
                    pci,
                    uuid: uuid.into(),
                    what: format!("no PID in {} within {DEADLINE:?}", pid_file.display()),
                });
            }
            std::thread::sleep(POLL);
        };
        let proc = crate::host::procfs::HOST
            .proc_ref(pid)
            .ok_or_else(|| MpsError::Failed {
                pci,
                uuid: uuid.into(),
                what: format!("pid {pid} of {} is not running", pid_file.display()),
            })?;
        // The daemon runs in the mount namespace made for it above: a PID of a process
        // anywhere else (one a sharer wrote there) is no daemon gpuhook started.
        if !in_namespace(pid, ns) {
            return Err(MpsError::Failed {
                pci,
                uuid: uuid.into(),
                what: format!(
                    "pid {pid} of {} is not in the mount namespace made for the daemon: not the daemon gpuhook started",
                    pid_file.display()
                ),
            });
        }
        let d = Daemon {
            proc,
            uuid: uuid.into(),
            dir: dir.clone(),
        };
        let cmds = limit_commands(sharing);
        if !cmds.is_empty() {
            if let Err(e) = Self::client(cfg, pci, uuid, &dir, &cmds) {
                let _ = self.quit(cfg, pci, &d);
                return Err(e);
            }
        }
        Ok(d)
    }

    fn quit(&self, cfg: &Config, pci: Pci, d: &Daemon) -> Result<(), MpsError> {
        Self::client(cfg, pci, &d.uuid, &d.dir, &["quit".into()])?;
        let end = Instant::now() + DEADLINE;
        while crate::host::procfs::HOST.alive(&d.proc) {
            if Instant::now() >= end {
                return Err(MpsError::Failed {
                    pci,
                    uuid: d.uuid.clone(),
                    what: format!("pid {} still runs {DEADLINE:?} after quit", d.proc.pid),
                });
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reserve::state::{HolderKind, Reservation};

    fn pci(s: &str) -> Pci {
        s.parse().expect("a PCI address")
    }

    fn daemon(pid: i32) -> Daemon {
        Daemon {
            proc: ProcRef { pid, start_time: 7 },
            uuid: "GPU-1".into(),
            dir: "/run/gpuhook/mps/GPU-1".into(),
        }
    }

    fn state(slots: &[(&str, &str)]) -> State {
        let mut st = State::default();
        for (id, unit) in slots {
            st.reservations.insert(
                id.to_string(),
                Reservation::for_test(HolderKind::Oci, id, id, &[unit]),
            );
        }
        st
    }

    const A: &str = "0000:04:00.0";
    const B: &str = "0000:05:00.0";

    #[test]
    fn first_slot_starts_later_ones_do_not() {
        let mps: BTreeSet<Pci> = [pci(A)].into();
        let mut st = state(&[("c1", "0000:04:00.0/slot0")]);
        assert_eq!(plan(&st, &mps, &|_| true).start, vec![pci(A)]);
        st.mps.insert(pci(A), daemon(10));
        st.reservations.insert(
            "c2".into(),
            Reservation::for_test(HolderKind::Oci, "c2", "c2", &["0000:04:00.0/slot1"]),
        );
        assert_eq!(plan(&st, &mps, &|_| true), Plan::default());
    }

    #[test]
    fn a_dead_daemon_is_started_again() {
        let mps: BTreeSet<Pci> = [pci(A)].into();
        let mut st = state(&[("c1", "0000:04:00.0/slot0")]);
        st.mps.insert(pci(A), daemon(10));
        assert_eq!(plan(&st, &mps, &|_| false).start, vec![pci(A)]);
    }

    #[test]
    fn timeslice_and_whole_gpus_start_nothing() {
        let mps: BTreeSet<Pci> = [pci(A)].into();
        let st = state(&[("c1", "0000:05:00.0/slot0"), ("c2", A)]);
        assert_eq!(plan(&st, &mps, &|_| true), Plan::default());
    }

    #[test]
    fn a_daemon_without_sharers_is_stopped() {
        let mps: BTreeSet<Pci> = [pci(A), pci(B)].into();
        let mut st = state(&[("c1", "0000:05:00.0/slot1")]);
        st.mps.insert(pci(A), daemon(10));
        st.mps.insert(pci(B), daemon(11));
        let p = plan(&st, &mps, &|_| true);
        assert_eq!(p.stop, vec![pci(A)]);
        assert!(p.start.is_empty());
    }

    #[test]
    fn limits_become_client_commands() {
        let s = Sharing {
            mode: ShareMode::Mps,
            replicas: 2,
            memory_limit_mib: Some(2048),
            active_thread_percentage: Some(50),
        };
        assert_eq!(
            limit_commands(&s),
            vec![
                "set_default_device_pinned_mem_limit 0 2048M",
                "set_default_active_thread_percentage 50"
            ]
        );
        assert!(limit_commands(&Sharing {
            mode: ShareMode::Mps,
            ..Sharing::timeslice(2)
        })
        .is_empty());
    }

    #[test]
    fn dir_is_beside_the_state_file() {
        let cfg = Config::default();
        assert_eq!(
            dir_for(&cfg, "GPU-1"),
            cfg.state_file.parent().expect("a dir").join("mps/GPU-1")
        );
    }

    /// Stops what plan says, forgets a dead one, keeps one that cannot be told.
    struct Fake(std::cell::RefCell<Vec<String>>, bool);
    impl Mps for Fake {
        fn start(&self, _: &Config, pci: Pci, uuid: &str, _: &Sharing) -> Result<Daemon, MpsError> {
            self.0.borrow_mut().push(format!("start {pci} {uuid}"));
            Ok(daemon(99))
        }
        fn quit(&self, _: &Config, pci: Pci, _: &Daemon) -> Result<(), MpsError> {
            self.0.borrow_mut().push(format!("quit {pci}"));
            if self.1 {
                Ok(())
            } else {
                Err(MpsError::Failed {
                    pci,
                    uuid: "GPU-1".into(),
                    what: "no answer".into(),
                })
            }
        }
    }

    #[test]
    fn stop_unused_quits_and_forgets() {
        let cfg = Config::default();
        let me = crate::host::procfs::HOST
            .proc_ref(std::process::id() as i32)
            .expect("own start time");
        for ok in [true, false] {
            let mut st = State::default();
            st.mps.insert(
                pci(A),
                Daemon {
                    proc: me,
                    ..daemon(1)
                },
            );
            let f = Fake(Default::default(), ok);
            let notes = stop_unused(&cfg, &f, crate::host::procfs::HOST, &mut st);
            assert_eq!(*f.0.borrow(), vec![format!("quit {A}")]);
            assert_eq!(st.mps.is_empty(), ok, "{notes:?}");
        }
        // A dead one is forgotten without a quit.
        let mut st = State::default();
        st.mps.insert(pci(A), daemon(i32::MAX));
        let f = Fake(Default::default(), true);
        stop_unused(&cfg, &f, crate::host::procfs::HOST, &mut st);
        assert!(f.0.borrow().is_empty());
        assert!(st.mps.is_empty());
    }

    /// A start that fails (here: a GPU without a UUID) fails the step, whose state is not
    /// written: the daemons the same call started are told to quit, not left unrecorded.
    #[test]
    fn a_failed_start_quits_the_daemons_started_with_it() {
        let cfg = Config::default();
        let mps = Sharing {
            mode: ShareMode::Mps,
            replicas: 2,
            memory_limit_mib: None,
            active_thread_percentage: None,
        };
        let mut gpus = crate::reserve::alloc::tests::dgx();
        for (g, p) in gpus.iter_mut().zip([A, B]) {
            g.pci = pci(p);
            g.sharing = Some(mps);
        }
        gpus[1].uuid = None;
        let inv = Inventory {
            gpus,
            controls: vec![],
            deferred: 0,
        };
        let mut st = state(&[("c1", "0000:04:00.0/slot0"), ("c2", "0000:05:00.0/slot0")]);
        let f = Fake(Default::default(), true);
        let e = start_needed(&cfg, &f, crate::host::procfs::HOST, &mut st, &inv).unwrap_err();
        assert!(e.to_string().contains("has no UUID"), "{e}");
        assert_eq!(
            *f.0.borrow(),
            vec![format!("start {A} GPU-00000000"), format!("quit {A}")]
        );
        assert!(st.mps.is_empty());
    }

    /// The PID file is read only as a small regular file: a FIFO planted at its name does not
    /// block, a link is not followed, PID 1 and junk are no PID.
    #[test]
    fn pid_file_read_neither_blocks_nor_follows() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join(PID_FILE);
        std::fs::write(&p, "4242\n").unwrap();
        assert_eq!(read_pid(&p), Some(4242));
        for junk in ["1\n", "x", ""] {
            std::fs::write(&p, junk).unwrap();
            assert_eq!(read_pid(&p), None, "{junk:?}");
        }
        std::fs::remove_file(&p).unwrap();
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert_eq!(read_pid(&p), None, "a FIFO");
        std::fs::remove_file(&p).unwrap();
        std::fs::write(t.path().join("real"), "4242").unwrap();
        std::os::unix::fs::symlink("real", &p).unwrap();
        assert_eq!(read_pid(&p), None, "a link");
        let me = std::process::id() as i32;
        let ours = nix::sys::stat::stat("/proc/self/ns/mnt").unwrap().st_ino as u64;
        assert!(in_namespace(me, ours));
        assert!(!in_namespace(me, ours + 1));
    }
}
