//! The one sandbox gpuhook runs a program in (the host's static `ldconfig`, over a
//! container's root): what a forked child does between `fork` and `exec`, as Firecracker's
//! jailer does it. The program runs from an exec-only copy (so it is not dumpable: no
//! `ptrace`, no `/proc/PID/mem`), with a clean descriptor table (`close_range`), no
//! environment, lowered resource limits, no capabilities in any set, the given ids,
//! `no_new_privs`, a parent-death signal, and a seccomp filter that refuses every way to
//! make a process or run another program (`clone`, `clone3`, `fork`, `vfork`, `execve`;
//! `execveat` stays for the exec itself).
//!
//! Every child gpuhook forks and waits on (the container helper, `ldconfig`'s first child,
//! a GPU's reset) goes through [`fork_and_wait`]: a pipe read to its end within a deadline,
//! the child (and its process group, when it made one) killed when it runs over, and
//! reaped. A host program gpuhook runs (the GPU reset command) goes through
//! [`run_program`]: the same, with standard input from `/dev/null`, no descriptor but the
//! pipe, a fixed environment, the signals as a fresh process has them, and a process group
//! of its own; [`run_program_fd`] (`nvidia-smi`) runs one checked by
//! `host::program::trusted_program` from its descriptor.

use crate::host::child::close_from;
use crate::host::syserr::{IoErr, SysErr};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::resource::Resource;
use nix::sys::wait::WaitStatus;
use seccompiler::{BpfProgram, SeccompAction, SeccompFilter};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// Why the program could not be readied (each says which step, of which program). A value
/// (serde): it crosses the fork in the container helper's reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum SandboxError {
    #[error("{0}: NUL in name")]
    NulInName(String),
    #[error("memfd for {0}: {1}")]
    Memfd(String, #[source] SysErr),
    #[error("copying {0}: {1}")]
    Copy(String, #[source] IoErr),
    #[error("chmod of the copy of {0}: {1}")]
    Chmod(String, #[source] SysErr),
    #[error("sealing the copy of {0}: {1}")]
    Seal(String, #[source] SysErr),
    #[error("reopening the copy of {0}: {1}")]
    Reopen(String, #[source] SysErr),
    /// What seccompiler said (its errors are neither `Clone` nor serde).
    #[error("seccomp: {0}")]
    Seccomp(String),
}

/// Who the program runs as, and what it may use.
pub struct Confinement<'a> {
    pub uid: u32,
    pub gid: u32,
    /// Each lowered to at most this (soft and hard).
    pub limits: &'a [(Resource, u64)],
    /// From [`no_fork_filter`] (built before the fork: the child only installs it).
    pub filter: &'a BpfProgram,
}

/// An exec-only copy of a program (a sealed memfd, mode 0111, open read-only): executed
/// from it, the process is not dumpable (the kernel marks a process that could not read
/// its own program so), so no process of the same uid — a container's root among them —
/// can `ptrace` it or read its memory.
pub fn exec_only_copy(f: &std::fs::File, name: &str) -> Result<OwnedFd, SandboxError> {
    const MFD_EXEC: libc::c_uint = 0x10;
    let cname = CString::new(name).map_err(|_| SandboxError::NulInName(name.into()))?;
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: memfd_create with a valid C string; the descriptor is owned below.
    let mut fd = unsafe { libc::memfd_create(cname.as_ptr(), flags | MFD_EXEC) };
    if fd < 0 && Errno::last() == Errno::EINVAL {
        // (Kernels before 6.3 know no MFD_EXEC: there a memfd is executable anyway.)
        // SAFETY: as above.
        fd = unsafe { libc::memfd_create(cname.as_ptr(), flags) };
    }
    if fd < 0 {
        return Err(SandboxError::Memfd(name.into(), Errno::last().into()));
    }
    // SAFETY: a fresh descriptor the kernel just returned.
    let mut copy = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mut src = f;
    std::io::copy(&mut src, &mut copy).map_err(|e| SandboxError::Copy(name.into(), e.into()))?;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    nix::sys::stat::fchmod(
        copy.as_fd(),
        nix::sys::stat::Mode::from_bits_truncate(0o111),
    )
    .map_err(|e| SandboxError::Chmod(name.into(), e.into()))?;
    // SAFETY: fcntl on our descriptor.
    if unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(SandboxError::Seal(name.into(), Errno::last().into()));
    }
    // The program must not be executed through a writable descriptor (ETXTBSY): reopened
    // read-only, the writable one closed.
    let ro = nix::fcntl::open(
        format!("/proc/self/fd/{}", copy.as_raw_fd()).as_str(),
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| SandboxError::Reopen(name.into(), e.into()))?;
    Ok(ro)
}

/// The seccomp filter of [`confine_and_exec`]: `EPERM` for every call that makes a process
/// or runs a program (`execveat` aside, which runs the program itself).
pub fn no_fork_filter() -> Result<BpfProgram, SandboxError> {
    let mut denied: Vec<libc::c_long> = vec![libc::SYS_clone, libc::SYS_clone3, libc::SYS_execve];
    #[cfg(target_arch = "x86_64")]
    denied.extend([libc::SYS_fork, libc::SYS_vfork]);
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> =
        denied.into_iter().map(|n| (n, Vec::new())).collect();
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|e| SandboxError::Seccomp(format!("{e:?}")))?;
    let f = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| SandboxError::Seccomp(e.to_string()))?;
    f.try_into()
        .map_err(|e| SandboxError::Seccomp(format!("{e:?}")))
}

/// In a forked child: confines this process as `c` says and executes `exe` (an
/// [`exec_only_copy`]) with `argv` and no environment. Standard output and error are what
/// the caller left at 1 and 2; standard input is closed. Returns only on failure.
pub fn confine_and_exec(exe: &OwnedFd, argv: &[CString], c: &Confinement) -> (String, Errno) {
    // The program at 3 (closed again by its exec), nothing else past 2.
    // SAFETY: dup2/fcntl/close on descriptors this process owns.
    unsafe {
        libc::close(0);
        if exe.as_raw_fd() != 3 && libc::dup2(exe.as_raw_fd(), 3) < 0 {
            return ("dup2".into(), Errno::last());
        }
        libc::fcntl(3, libc::F_SETFD, libc::FD_CLOEXEC);
    }
    close_from(4);
    for (r, v) in c.limits {
        // Lowered only (raising a hard limit would need a capability it lacks).
        let hard = nix::sys::resource::getrlimit(*r).map_or(*v, |(_, h)| h);
        if let Err(e) = nix::sys::resource::setrlimit(*r, (*v).min(hard), (*v).min(hard)) {
            return ("setrlimit".into(), e);
        }
    }
    // No capabilities survive the exec, whatever the uid.
    for cap in caps::all() {
        if caps::has_cap(None, caps::CapSet::Bounding, cap).unwrap_or(false)
            && caps::drop(None, caps::CapSet::Bounding, cap).is_err()
        {
            return ("dropping the bounding set".into(), Errno::EPERM);
        }
    }
    let _ = caps::clear(None, caps::CapSet::Ambient);
    let _ = caps::clear(None, caps::CapSet::Inheritable);
    if let Err(e) = nix::unistd::setgroups(&[]) {
        return ("setgroups".into(), e);
    }
    if let Err(e) = nix::unistd::setgid(c.gid.into()) {
        return ("setgid".into(), e);
    }
    if let Err(e) = nix::unistd::setuid(c.uid.into()) {
        return ("setuid".into(), e);
    }
    if caps::clear(None, caps::CapSet::Effective).is_err()
        || caps::clear(None, caps::CapSet::Permitted).is_err()
    {
        return ("dropping capabilities".into(), Errno::EPERM);
    }
    // SAFETY: plain prctl calls. The parent-death signal is set after the id change (which
    // resets it).
    unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    if let Err(e) = seccompiler::apply_filter(c.filter) {
        return (format!("seccomp: {e}"), Errno::EPERM);
    }
    let env: [CString; 0] = [];
    // SAFETY: descriptor 3 is the program (set above).
    let exe = unsafe { std::os::fd::BorrowedFd::borrow_raw(3) };
    let e = nix::unistd::fexecve(exe, argv, &env).unwrap_err();
    ("exec".into(), e)
}

/// What kept [`fork_and_wait`] from the child's whole output (each caller says it for its
/// own child). A value (serde): it crosses the fork in the container helper's reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ForkError {
    /// The pipe could not be made.
    Pipe(SysErr),
    /// The child could not be forked.
    Fork(SysErr),
    /// Its output did not end within the limit (the child was killed and reaped).
    TimedOut,
    /// Reading its output failed (the child was killed and reaped).
    Read(PipeError),
}

/// Why a pipe could not be read to its end ([`read_pipe`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum PipeError {
    #[error("poll: {0}")]
    Poll(#[source] SysErr),
    #[error("{0}")]
    Read(#[source] IoErr),
}

/// How a child waited for ended (or why the wait failed), as a value: reads as the
/// `waitpid` result's `Debug` (`Ok(Signaled(Pid(7), SIGKILL, false))`, `Err(ECHILD)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Waited {
    Exited { pid: i32, code: i32 },
    Signaled { pid: i32, signal: i32, core: bool },
    Stopped { pid: i32, signal: i32 },
    PtraceEvent { pid: i32, signal: i32, event: i32 },
    PtraceSyscall { pid: i32 },
    Continued { pid: i32 },
    StillAlive,
    Failed(SysErr),
}

impl From<nix::Result<WaitStatus>> for Waited {
    fn from(r: nix::Result<WaitStatus>) -> Waited {
        let raw = |p: nix::unistd::Pid| p.as_raw();
        match r {
            Ok(WaitStatus::Exited(p, code)) => Waited::Exited { pid: raw(p), code },
            Ok(WaitStatus::Signaled(p, s, core)) => Waited::Signaled {
                pid: raw(p),
                signal: s as i32,
                core,
            },
            Ok(WaitStatus::Stopped(p, s)) => Waited::Stopped {
                pid: raw(p),
                signal: s as i32,
            },
            Ok(WaitStatus::PtraceEvent(p, s, event)) => Waited::PtraceEvent {
                pid: raw(p),
                signal: s as i32,
                event,
            },
            Ok(WaitStatus::PtraceSyscall(p)) => Waited::PtraceSyscall { pid: raw(p) },
            Ok(WaitStatus::Continued(p)) => Waited::Continued { pid: raw(p) },
            Ok(WaitStatus::StillAlive) => Waited::StillAlive,
            Err(e) => Waited::Failed(e.into()),
        }
    }
}

impl std::fmt::Display for Waited {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        // A signal as nix names it (`SIGKILL`); a number no signal has, as that number.
        let sig = |s: i32| {
            nix::sys::signal::Signal::try_from(s)
                .map_or_else(|_| s.to_string(), |s| format!("{s:?}"))
        };
        match *self {
            Waited::Exited { pid, code } => write!(f, "Ok(Exited(Pid({pid}), {code}))"),
            Waited::Signaled { pid, signal, core } => {
                write!(f, "Ok(Signaled(Pid({pid}), {}, {core}))", sig(signal))
            }
            Waited::Stopped { pid, signal } => {
                write!(f, "Ok(Stopped(Pid({pid}), {}))", sig(signal))
            }
            Waited::PtraceEvent { pid, signal, event } => {
                write!(f, "Ok(PtraceEvent(Pid({pid}), {}, {event}))", sig(signal))
            }
            Waited::PtraceSyscall { pid } => write!(f, "Ok(PtraceSyscall(Pid({pid})))"),
            Waited::Continued { pid } => write!(f, "Ok(Continued(Pid({pid})))"),
            Waited::StillAlive => f.write_str("Ok(StillAlive)"),
            Waited::Failed(e) => write!(f, "Err({:?})", e.errno()),
        }
    }
}

/// Forks a child that runs `child` with the write end of a pipe (the read end closed there)
/// and leaves with `_exit` of what `child` returns. The parent drops its copy of `child`
/// (what the closure owns is closed there), reads the pipe to its end within `limit`
/// keeping at most `max` bytes ([`read_pipe`]), kills the child when it could not, and
/// reaps it: its output and its status.
///
/// # Safety
///
/// `fork`: in a process with other threads, the child may find locks held by threads that
/// do not exist in it. `child` must only make syscalls, allocate (glibc makes malloc
/// fork-safe) and serialize, taking no other lock, and must return (never unwind) into
/// the `_exit` that follows.
pub unsafe fn fork_and_wait(
    limit: Duration,
    max: usize,
    child: impl FnOnce(OwnedFd) -> i32,
) -> Result<(Vec<u8>, nix::Result<WaitStatus>), ForkError> {
    // SAFETY: the caller's promise.
    unsafe { fork_and_wait_with(limit, max, false, child) }
}

/// How long a child killed at its deadline is waited for: one stuck in the kernel (a device
/// reset in D state) dies only when the kernel lets it; it is left to its new parent then.
const REAP_AFTER_KILL: Duration = Duration::from_secs(5);

/// Reaps `pid`: blocking, or (`until`) polling until then (`StillAlive` past it).
fn reap(pid: nix::unistd::Pid, until: Option<Instant>) -> nix::Result<WaitStatus> {
    let Some(until) = until else {
        return nix::sys::wait::waitpid(pid, None);
    };
    let mut nap = Duration::from_micros(100);
    loop {
        match nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if Instant::now() < until => {
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(10));
            }
            r => return r,
        }
    }
}

/// Kills `pid` and its process group (a child that made one of its own, [`run_program`],
/// takes what it started with it; no group of that id otherwise: ESRCH, nothing done).
fn kill_all(pid: nix::unistd::Pid) {
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
}

/// [`fork_and_wait`]; with `bounded`, the child must also have ended within `limit` (one
/// that closed its output and lives on is killed: [`ForkError::TimedOut`]), and a killed
/// child is waited for at most [`REAP_AFTER_KILL`]: the whole is bounded, whatever the child.
///
/// # Safety
///
/// As [`fork_and_wait`].
unsafe fn fork_and_wait_with(
    limit: Duration,
    max: usize,
    bounded: bool,
    child: impl FnOnce(OwnedFd) -> i32,
) -> Result<(Vec<u8>, nix::Result<WaitStatus>), ForkError> {
    let start = Instant::now();
    let (rd, wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| ForkError::Pipe(e.into()))?;
    // SAFETY: the caller's promise (above) on what `child` does.
    match unsafe { nix::unistd::fork() }.map_err(|e| ForkError::Fork(e.into()))? {
        nix::unistd::ForkResult::Child => {
            drop(rd);
            let code = child(wr);
            // SAFETY: leave without running the parent's destructors or atexit handlers.
            unsafe { libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child: pid } => {
            drop(wr);
            drop(child);
            let after_kill = || bounded.then(|| Instant::now() + REAP_AFTER_KILL);
            let out = match read_pipe(rd, limit, max) {
                Ok(out) => out,
                Err(e) => {
                    kill_all(pid);
                    let _ = reap(pid, after_kill());
                    return Err(match e {
                        None => ForkError::TimedOut,
                        Some(e) => ForkError::Read(e),
                    });
                }
            };
            let status = reap(pid, bounded.then(|| start + limit));
            if status == Ok(WaitStatus::StillAlive) {
                kill_all(pid);
                let _ = reap(pid, after_kill());
                return Err(ForkError::TimedOut);
            }
            Ok((out, status))
        }
    }
}

/// The environment of every host program gpuhook runs ([`run_program`]): a fixed `PATH`,
/// nothing of gpuhook's own.
pub const CHILD_ENV: [&str; 1] = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"];

/// What a program run by [`run_program`] (or work done by [`run_child`]) did: how it ended
/// and what it wrote (standard output and error together, bounded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
    pub status: Waited,
    pub output: Vec<u8>,
}

impl Ran {
    /// Exited with status 0.
    pub fn ok(&self) -> bool {
        matches!(self.status, Waited::Exited { code: 0, .. })
    }

    /// The last line it wrote that is not blank (for a one-line message).
    pub fn last_line(&self) -> String {
        String::from_utf8_lossy(&self.output)
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(|l| l.trim().to_owned())
            .unwrap_or_default()
    }
}

/// Why a program could not be run to its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    #[error("{0}: NUL in an argument")]
    Nul(String),
    #[error("no program to run")]
    Empty,
    #[error("cannot make the pipe: {0}")]
    Pipe(#[source] SysErr),
    #[error("cannot fork: {0}")]
    Fork(#[source] SysErr),
    #[error("it did not end within {0:?} (killed)")]
    TimedOut(Duration),
    #[error("reading its output: {0}")]
    Read(#[source] PipeError),
}

impl RunError {
    fn of(e: ForkError, limit: Duration) -> RunError {
        match e {
            ForkError::Pipe(e) => RunError::Pipe(e),
            ForkError::Fork(e) => RunError::Fork(e),
            ForkError::TimedOut => RunError::TimedOut(limit),
            ForkError::Read(e) => RunError::Read(e),
        }
    }
}

/// In a forked child: standard input from `/dev/null`, standard output and error into
/// `out`, nothing else open (but `exe` at 3, when given), a process group of its own, the
/// signals' default dispositions with none blocked, and SIGKILL when its parent dies.
fn plain_child(out: OwnedFd, parent: i32, exe: Option<i32>) -> Result<(), Errno> {
    use std::os::fd::IntoRawFd;
    let out = out.into_raw_fd();
    // SAFETY: descriptor and signal calls on this (child) process only.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
        if null < 0 || libc::dup2(null, 0) < 0 {
            return Err(Errno::last());
        }
        if libc::dup2(out, 1) < 0 || libc::dup2(out, 2) < 0 {
            return Err(Errno::last());
        }
    }
    // The program to run from its descriptor, at 3 across the exec (a script's interpreter
    // reads it at /dev/fd/3).
    if let Some(fd) = exe {
        // SAFETY: as above.
        let r = unsafe {
            if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            }
        };
        if r < 0 {
            return Err(Errno::last());
        }
    }
    close_from(if exe.is_some() { 4 } else { 3 });
    // SAFETY: as above.
    unsafe {
        libc::setpgid(0, 0);
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        // (Rust's runtime ignores SIGPIPE: an ignored signal stays so across exec.)
        for sig in 1..libc::SIGRTMIN() {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        // The parent died before the death signal was asked for.
        if libc::getppid() != parent {
            return Err(Errno::ESRCH);
        }
    }
    Ok(())
}

/// Writes `msg` to standard error, from a forked child (set up or not); a failed write is
/// ignored.
fn to_stderr(msg: &str) {
    let _ = nix::unistd::write(
        // SAFETY: standard error of this process, only written to.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(2) },
        msg.as_bytes(),
    );
}

/// Runs `argv` (`argv[0]` an absolute path) as gpuhook runs every host program (see the
/// module's comment), its output read within `limit` (at most `max` bytes kept); past
/// `limit` it and its process group are killed.
pub fn run_program(argv: &[String], limit: Duration, max: usize) -> Result<Ran, RunError> {
    run(None, argv, limit, max)
}

/// [`run_program`] of the program open at `exe` (a `host::program::TrustedProgram`'s
/// descriptor: the file checked), executed from that descriptor (`fexecve`), never looked up
/// by a path again: `argv[0]` only names it.
pub fn run_program_fd(
    exe: &OwnedFd,
    argv: &[String],
    limit: Duration,
    max: usize,
) -> Result<Ran, RunError> {
    run(Some(exe), argv, limit, max)
}

fn run(
    exe: Option<&OwnedFd>,
    argv: &[String],
    limit: Duration,
    max: usize,
) -> Result<Ran, RunError> {
    let c: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_str()).map_err(|_| RunError::Nul(a.clone())))
        .collect::<Result<_, _>>()?;
    let path = c.first().cloned().ok_or(RunError::Empty)?;
    let env: Vec<CString> = CHILD_ENV
        .iter()
        .map(|e| CString::new(*e).expect("no NUL"))
        .collect();
    let parent = std::process::id() as i32;
    let exe = exe.map(|f| f.as_raw_fd());
    let child = move |out: OwnedFd| -> i32 {
        if let Err(e) = plain_child(out, parent, exe) {
            to_stderr(&format!("cannot set up the child: {e}\n"));
            return 126;
        }
        let e = match exe {
            Some(_) => {
                // SAFETY: descriptor 3 is the program (set by plain_child).
                let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(3) };
                nix::unistd::fexecve(fd, &c, &env)
            }
            None => nix::unistd::execve(&path, &c, &env),
        }
        .unwrap_err();
        to_stderr(&format!("cannot run {}: {e}\n", path.to_string_lossy()));
        127
    };
    // SAFETY: the child makes syscalls and formats a message, then execs or returns.
    let (output, status) = unsafe { fork_and_wait_with(limit, max, true, child) }
        .map_err(|e| RunError::of(e, limit))?;
    Ok(Ran {
        status: status.into(),
        output,
    })
}

/// Does `work` in a child set up as [`run_program`]'s (no exec): for a write that can
/// block in the kernel (a PCI reset), bounded by `limit` like a program. Its error is the
/// child's exit status (1) and message.
pub fn run_child(
    limit: Duration,
    work: impl FnOnce() -> Result<(), String>,
) -> Result<Ran, RunError> {
    let parent = std::process::id() as i32;
    let child = move |out: OwnedFd| -> i32 {
        if let Err(e) = plain_child(out, parent, None) {
            to_stderr(&format!("cannot set up the child: {e}\n"));
            return 126;
        }
        match work() {
            Ok(()) => 0,
            Err(m) => {
                to_stderr(&format!("{m}\n"));
                1
            }
        }
    };
    // SAFETY: the child makes syscalls and formats a message, then returns.
    let (output, status) = unsafe { fork_and_wait_with(limit, 4096, true, child) }
        .map_err(|e| RunError::of(e, limit))?;
    Ok(Ran {
        status: status.into(),
        output,
    })
}

/// Reads a pipe to its end within `limit`, keeping at most `max` bytes (the rest is read
/// and dropped, so the writer never blocks). `Err(None)`: the time ran out.
pub fn read_pipe(fd: OwnedFd, limit: Duration, max: usize) -> Result<Vec<u8>, Option<PipeError>> {
    use std::io::Read;
    let deadline = Instant::now() + limit;
    let mut f = std::fs::File::from(fd);
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(None);
        }
        let mut pfd = libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if r < 0 {
            if Errno::last() == Errno::EINTR {
                continue;
            }
            return Err(Some(PipeError::Poll(Errno::last().into())));
        }
        if r == 0 {
            continue;
        }
        match f.read(&mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) if out.len() < max => out.extend_from_slice(&buf[..n]),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Some(PipeError::Read(e.into()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::wait::waitpid;
    use nix::unistd::{fork, ForkResult};

    /// A child confined as `c` execs `prog` with `args`; its exit status.
    fn run(prog: &str, args: &[&str], uid: u32) -> (WaitStatus, i32) {
        let f = std::fs::File::open(prog).unwrap();
        let exe = exec_only_copy(&f, "test").unwrap();
        let filter = no_fork_filter().unwrap();
        let argv: Vec<CString> = std::iter::once(prog)
            .chain(args.iter().copied())
            .map(|a| CString::new(a).unwrap())
            .collect();
        let limits = [(Resource::RLIMIT_CORE, 0)];
        let c = Confinement {
            uid,
            gid: uid,
            limits: &limits,
            filter: &filter,
        };
        // SAFETY: the test child only makes syscalls and execs or _exits.
        match unsafe { fork() }.unwrap() {
            ForkResult::Child => {
                let _ = confine_and_exec(&exe, &argv, &c);
                // SAFETY: leave the forked test child at once.
                unsafe { libc::_exit(126) }
            }
            ForkResult::Parent { child } => {
                let pid = child.as_raw();
                std::thread::sleep(std::time::Duration::from_millis(300));
                use std::os::unix::fs::MetadataExt;
                let owner = std::fs::metadata(format!("/proc/{pid}/stat"))
                    .map(|m| m.uid() as i32)
                    .unwrap_or(-1);
                let _ = nix::sys::signal::kill(child, nix::sys::signal::SIGKILL);
                (waitpid(child, None).unwrap(), owner)
            }
        }
    }

    /// A host program runs with the time it is given, whatever it does: one that closes its
    /// output and lives on is killed at the deadline too (and what it started with it).
    #[test]
    fn run_program_is_bounded() {
        let ok = run_program(
            &[
                "/bin/sh".into(),
                "-c".into(),
                "echo one; echo two >&2".into(),
            ],
            Duration::from_secs(10),
            1024,
        )
        .unwrap();
        assert!(ok.ok());
        assert_eq!(String::from_utf8_lossy(&ok.output), "one\ntwo\n");
        assert_eq!(ok.last_line(), "two");
        let t = Instant::now();
        let e = run_program(
            &[
                "/bin/sh".into(),
                "-c".into(),
                "exec >&- 2>&-; sleep 30".into(),
            ],
            Duration::from_millis(300),
            1024,
        )
        .unwrap_err();
        assert_eq!(e, RunError::TimedOut(Duration::from_millis(300)));
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        let bad = run_program(&["/bin/x\0".into()], Duration::from_secs(1), 10).unwrap_err();
        assert_eq!(bad, RunError::Nul("/bin/x\0".into()));
        assert_eq!(
            run_program(&[], Duration::from_secs(1), 10).unwrap_err(),
            RunError::Empty
        );
    }

    /// A child's end reads as nix's `Debug` of the `waitpid` result said it.
    #[test]
    fn waited_reads_as_the_wait_result() {
        use nix::sys::signal::Signal;
        use nix::unistd::Pid;
        for r in [
            Ok(WaitStatus::Exited(Pid::from_raw(7), 3)),
            Ok(WaitStatus::Signaled(
                Pid::from_raw(7),
                Signal::SIGKILL,
                false,
            )),
            Ok(WaitStatus::Stopped(Pid::from_raw(7), Signal::SIGSTOP)),
            Ok(WaitStatus::PtraceEvent(
                Pid::from_raw(7),
                Signal::SIGTRAP,
                4,
            )),
            Ok(WaitStatus::PtraceSyscall(Pid::from_raw(7))),
            Ok(WaitStatus::Continued(Pid::from_raw(7))),
            Ok(WaitStatus::StillAlive),
            Err(Errno::ECHILD),
        ] {
            let w = Waited::from(r);
            assert_eq!(w.to_string(), format!("{r:?}"));
            let back: Waited = serde_json::from_str(&serde_json::to_string(&w).unwrap()).unwrap();
            assert_eq!(back, w);
        }
    }

    /// A program run from the exec-only copy is not dumpable (its /proc files are root's,
    /// not its uid's, so no process of that uid may trace it); it cannot make a process
    /// (seccomp: the shell's fork fails); no descriptor of ours reaches it.
    #[test]
    fn confined_program_is_not_dumpable_and_cannot_fork() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("needs root (setuid): skipped");
            return;
        }
        // Not dumpable: /proc/PID is owned by root while the process runs as 65534.
        let (_, owner) = run("/bin/sleep", &["5"], 65534);
        assert_eq!(owner, 0, "the process is dumpable");
        // The exec itself works (the shell's own exit status comes back) ...
        let (st, _) = run("/bin/sh", &["-c", "exit 7"], 65534);
        assert!(matches!(st, WaitStatus::Exited(_, 7)), "{st:?}");
        // ... but it cannot make a process: an external command fails.
        let (st, _) = run("/bin/sh", &["-c", "/bin/true && exit 0; exit 9"], 65534);
        assert!(
            matches!(st, WaitStatus::Exited(_, c) if c != 0 && c != 126),
            "{st:?}"
        );
        // No inherited descriptor beyond 0-2: fd 777 kept open here is gone there.
        let keep = std::fs::File::open("/dev/null").unwrap();
        // SAFETY: dup2 onto a descriptor number this test owns; closed below.
        assert_eq!(unsafe { libc::dup2(keep.as_raw_fd(), 777) }, 777);
        let (st, _) = run(
            "/bin/sh",
            &["-c", "[ -e /proc/self/fd/777 ] && exit 43; exit 0"],
            65534,
        );
        // SAFETY: closes the descriptor made above.
        unsafe { libc::close(777) };
        assert!(matches!(st, WaitStatus::Exited(_, 0)), "{st:?}");
    }
}
