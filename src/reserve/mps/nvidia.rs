//! The real daemons: `nvidia-cuda-mps-control` run in a mount namespace of its own with a
//! private `/dev/shm`, its limits set through its client mode, told to `quit`; and the sweep
//! of what a killed start left, found by the pipe directory in its environment.

use super::daemon::{dir_for, limit_commands, Daemon, DEADLINE, PID_FILE};
use super::error::MpsError;
use super::work::{Mps, Swept};
use crate::host::config::{Config, Sharing};
use crate::ids::Pci;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How often a wait for the daemon (its PID file, its exit, a client's) looks again.
const POLL: Duration = Duration::from_millis(2);
/// How long one pass of a sweep (under the state lock) waits for what it killed to be gone.
pub const SWEEP_GRACE: Duration = Duration::from_millis(20);

/// The real daemons.
pub struct NvidiaMps;

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
pub(super) fn read_pid(path: &Path) -> Option<i32> {
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
pub(super) fn in_namespace(pid: i32, ns: u64) -> bool {
    nix::sys::stat::stat(format!("/proc/{pid}/ns/mnt").as_str()).is_ok_and(|st| st.st_ino == ns)
}

/// The processes of host root (real uid 0, this process's root directory, a mount namespace
/// other than this process's: the daemon and its `-d` run in the one made for them) whose
/// environment names `pipe` as the MPS pipe directory: a daemon started for it and the
/// processes of its start (a container's process, under its own root, is none of them, nor
/// is an operator's shell on the host that exported the same variable).
pub(super) fn started_for(pipe: &Path) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me && is_started_for(*pid, pipe))
        .collect()
}

/// Whether process `pid` is one [`started_for`] `pipe` looks for.
pub(super) fn is_started_for(pid: i32, pipe: &Path) -> bool {
    let want = format!("CUDA_MPS_PIPE_DIRECTORY={}", pipe.display()).into_bytes();
    let id = |p: &str| nix::sys::stat::stat(p).ok().map(|s| (s.st_dev, s.st_ino));
    let p = format!("/proc/{pid}");
    let same_root = id("/").is_some() && id(&format!("{p}/root")) == id("/");
    let own_ns = id(&format!("{p}/ns/mnt")).is_some_and(|n| Some(n) != id("/proc/self/ns/mnt"));
    // The real uid (`/proc/PID` is owned by root for any process that is not dumpable).
    let by_root = std::fs::read_to_string(format!("{p}/status")).is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().next())
            == Some("0")
    });
    same_root
        && own_ns
        && by_root
        && std::fs::read(format!("{p}/environ"))
            .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == want))
}

impl NvidiaMps {
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

    fn failed(pci: Pci, uuid: &str, what: String) -> MpsError {
        MpsError::Failed {
            pci,
            uuid: uuid.into(),
            what,
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
        crate::host::child::std_fds_only(&mut c);
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
            return Err(Self::failed(
                pci,
                uuid,
                format!(
                    "{} did not answer {cmds:?} within {DEADLINE:?}",
                    cfg.mps_control.display()
                ),
            ));
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
            return Err(Self::failed(
                pci,
                uuid,
                format!("{cmds:?}: {status}: {}", e.trim()),
            ));
        }
        Ok(out)
    }

    /// Runs `MPS -d` in a mount namespace of its own (shm over `/dev/shm`) until it returns;
    /// the inode of that namespace.
    fn daemonize(cfg: &Config, pci: Pci, uuid: &str, dir: &Path) -> Result<u64, MpsError> {
        let shm = std::ffi::CString::new(dir.join("shm").as_os_str().as_encoded_bytes())
            .map_err(|_| Self::failed(pci, uuid, "its directory has a NUL".into()))?;
        // The child says the inode of the mount namespace made for it, so that the PID the
        // daemon writes can be checked to be of a process in it.
        let (ns_rd, ns_wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| Self::err(pci, uuid, "pipe")(e.into()))?;
        let mut c = Command::new(&cfg.mps_control);
        c.arg("-d")
            .env_clear()
            .envs(env(uuid, dir))
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        crate::host::child::mps_daemon(&mut c, shm, std::os::fd::AsRawFd::as_raw_fd(&ns_wr));
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
        // `-d` returns once the daemon is forked: within the deadline, or it is killed.
        let Some(status) = wait_within(&mut ch, DEADLINE) else {
            return Err(Self::failed(
                pci,
                uuid,
                format!(
                    "{} -d did not return within {DEADLINE:?}",
                    cfg.mps_control.display()
                ),
            ));
        };
        if !status.success() {
            return Err(Self::failed(
                pci,
                uuid,
                format!("{} -d: {status}", cfg.mps_control.display()),
            ));
        }
        Ok(u64::from_ne_bytes(ino))
    }

    /// The daemon's PID from its PID file (within the deadline), checked to be of a process
    /// in the mount namespace `ns` made for it.
    fn daemon_pid(pci: Pci, uuid: &str, dir: &Path, ns: u64) -> Result<Daemon, MpsError> {
        let pid_file = &dir.join("pipe").join(PID_FILE);
        let end = Instant::now() + DEADLINE;
        let pid = loop {
            if let Some(p) = read_pid(pid_file) {
                break p;
            }
            if Instant::now() >= end {
                return Err(Self::failed(
                    pci,
                    uuid,
                    format!("no PID in {} within {DEADLINE:?}", pid_file.display()),
                ));
            }
            std::thread::sleep(POLL);
        };
        let proc = crate::host::procfs::REAL.proc_ref(pid).ok_or_else(|| {
            Self::failed(
                pci,
                uuid,
                format!("pid {pid} of {} is not running", pid_file.display()),
            )
        })?;
        // The daemon runs in the mount namespace made for it: a PID of a process anywhere
        // else (one a sharer wrote there) is no daemon gpuhook started.
        if !in_namespace(pid, ns) {
            return Err(Self::failed(
                pci,
                uuid,
                format!(
                    "pid {pid} of {} is not in the mount namespace made for the daemon: not the daemon gpuhook started",
                    pid_file.display()
                ),
            ));
        }
        Ok(Daemon {
            proc,
            uuid: uuid.into(),
            dir: dir.to_path_buf(),
            starting: false,
            stopping: None,
        })
    }
}

impl Mps for NvidiaMps {
    fn dirs(&self, cfg: &Config, pci: Pci, uuid: &str) -> Result<PathBuf, MpsError> {
        let dir = dir_for(cfg, uuid);
        Self::mkdirs(pci, uuid, &dir)?;
        Ok(dir)
    }

    fn start(
        &self,
        cfg: &Config,
        pci: Pci,
        uuid: &str,
        sharing: &Sharing,
    ) -> Result<Daemon, MpsError> {
        let dir = self.dirs(cfg, pci, uuid)?;
        let pid_file = dir.join("pipe").join(PID_FILE);
        let _ = std::fs::remove_file(&pid_file);
        let ns = Self::daemonize(cfg, pci, uuid, &dir)?;
        let d = Self::daemon_pid(pci, uuid, &dir, ns)?;
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
        while crate::host::procfs::REAL.alive(&d.proc) {
            if Instant::now() >= end {
                return Err(Self::failed(
                    pci,
                    &d.uuid,
                    format!("pid {} still runs {DEADLINE:?} after quit", d.proc.pid),
                ));
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }

    /// [`Mps::kill`] for [`SWEEP_GRACE`] at most: this runs under the state lock, and a
    /// process that takes longer to die (stuck in the driver) is left to the next pass.
    fn sweep(&self, cfg: &Config, pci: Pci, d: &Daemon) -> Swept {
        self.kill(cfg, pci, d, SWEEP_GRACE)
    }

    /// Kills (SIGKILL, through a descriptor of each process, looked at again through it)
    /// every process [`started_for`] the daemon's pipe directory, looking again until two
    /// looks in a row find none (one may fork while it is killed), for `grace` at most.
    fn kill(&self, _: &Config, _: Pci, d: &Daemon, grace: Duration) -> Swept {
        let pipe = d.pipe();
        let end = Instant::now() + grace;
        let mut swept = Swept::default();
        let mut quiet = false;
        loop {
            let found = started_for(&pipe);
            if found.is_empty() {
                if quiet {
                    break;
                }
                quiet = true;
                continue;
            }
            quiet = false;
            for &pid in &found {
                // By a descriptor of the process, looked at again through it: a PID reused
                // since the look is not signalled.
                let Ok(fd) = crate::host::sys::pidfd_open(pid) else {
                    continue;
                };
                if !is_started_for(pid, &pipe) {
                    continue;
                }
                let _ = crate::host::sys::pidfd_kill(
                    std::os::fd::AsFd::as_fd(&fd),
                    nix::sys::signal::SIGKILL,
                );
                if !swept.killed.contains(&pid) {
                    swept.killed.push(pid);
                }
            }
            if Instant::now() >= end {
                swept.left = found;
                return swept;
            }
            std::thread::sleep(POLL);
        }
        let _ = std::fs::remove_file(pipe.join(PID_FILE));
        swept
    }
}
