//! Process facts from a `/proc` ([`Proc`]; [`REAL`] is the real one, never the config's
//! `proc` root, which describes GPU drivers): identity (PID + start time, so a reused PID is
//! not mistaken for the old process), children, PID-namespace ids, mounts. The root is passed
//! in, so that the decisions made from these facts (which child is a container's init, whether
//! a holder is gone) are tested on written-out `/proc` trees. The free functions read [`REAL`].

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A process, identified across PID reuse by its start time (clock ticks since boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcRef {
    pub pid: i32,
    pub start_time: u64,
}

/// A process's user and mount namespaces, by inode: those an OCI container's init was in when
/// its runtime had made them (its `createRuntime` hook), which hotplug acts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespaces {
    pub user: u64,
    pub mnt: u64,
}

/// A `/proc` to read process facts from.
#[derive(Debug, Clone, Copy)]
pub struct Proc<'a> {
    pub root: &'a str,
}

/// The host's `/proc`.
pub const REAL: Proc<'static> = Proc { root: "/proc" };

mod fds;
mod mountinfo;
mod raw;
use fds::{denied, really_open, same_files, statx_chr};
pub use mountinfo::{parse_mountinfo, Mount};
use raw::read_raw;

/// The mounts of a process's mount namespace (`/proc/PID/mountinfo`, or our own for `None`).
pub fn mounts(pid: Option<i32>) -> Option<Vec<Mount>> {
    REAL.mounts(pid)
}

impl Proc<'_> {
    fn path(&self, pid: i32, file: &str) -> String {
        format!("{}/{pid}/{file}", self.root)
    }

    fn pid_stat(&self, pid: i32) -> Option<Vec<String>> {
        match self.stat_of(pid) {
            TaskStat::Fields(f) => Some(f),
            TaskStat::Gone | TaskStat::Unparsed => None,
        }
    }

    fn stat_of(&self, pid: i32) -> TaskStat {
        if pid <= 0 {
            return TaskStat::Gone;
        }
        stat_fields(&self.path(pid, "stat"))
    }

    pub fn start_time(&self, pid: i32) -> Option<u64> {
        self.pid_stat(pid)?.get(19)?.parse().ok()
    }

    /// The parent PID (`stat` field 4).
    pub fn ppid(&self, pid: i32) -> Option<i32> {
        self.pid_stat(pid)?.get(1)?.parse().ok()
    }

    pub fn proc_ref(&self, pid: i32) -> Option<ProcRef> {
        self.start_time(pid)
            .map(|start_time| ProcRef { pid, start_time })
    }

    /// See [`ProcRef::alive`].
    pub fn alive(&self, r: &ProcRef) -> bool {
        let f = match self.stat_of(r.pid) {
            TaskStat::Fields(f) => f,
            TaskStat::Gone => return false,
            // There, but not understood: never taken for gone (its GPUs would go to the
            // next tenant while it runs).
            TaskStat::Unparsed => return true,
        };
        if f.get(19).and_then(|s| s.parse().ok()) != Some(r.start_time) {
            return false;
        }
        running(&f) || self.other_thread_runs(r.pid)
    }

    fn other_thread_runs(&self, pid: i32) -> bool {
        let Ok(tasks) = std::fs::read_dir(self.path(pid, "task")) else {
            return false;
        };
        tasks.flatten().any(|t| {
            t.file_name().to_str() != Some(&pid.to_string())
                && match stat_fields(&t.path().join("stat").to_string_lossy()) {
                    TaskStat::Fields(f) => running(&f),
                    TaskStat::Unparsed => true,
                    TaskStat::Gone => false,
                }
        })
    }

    /// Direct children of a process (all its threads').
    pub fn children(&self, pid: i32) -> Vec<i32> {
        let mut out = Vec::new();
        if let Ok(tasks) = std::fs::read_dir(self.path(pid, "task")) {
            for t in tasks.flatten() {
                if let Some(s) = read(t.path().join("children")) {
                    out.extend(s.split_whitespace().filter_map(|x| x.parse::<i32>().ok()));
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// `NSpid:` of `status`: the PID in each nested PID namespace, outermost first.
    pub fn nspid(&self, pid: i32) -> Vec<i32> {
        read(self.path(pid, "status"))
            .and_then(|s| {
                s.lines().find_map(|l| {
                    l.strip_prefix("NSpid:").map(|v| {
                        v.split_whitespace()
                            .filter_map(|x| x.parse().ok())
                            .collect()
                    })
                })
            })
            .unwrap_or_default()
    }

    /// The inode of a process's PID namespace (`ns/pid`, a link to `pid:[INODE]`).
    pub fn pid_ns(&self, pid: i32) -> Option<u64> {
        self.ns(pid, "pid")
    }

    /// The inode of a process's namespace of `kind` (`ns/KIND`, a link to `KIND:[INODE]`).
    pub fn ns(&self, pid: i32, kind: &str) -> Option<u64> {
        let l = std::fs::read_link(self.path(pid, &format!("ns/{kind}"))).ok()?;
        let inode = l
            .to_str()?
            .strip_prefix(kind)?
            .strip_prefix(":[")?
            .strip_suffix(']')?;
        inode.parse().ok()
    }

    /// The user and mount namespaces a process is in.
    pub fn namespaces(&self, pid: i32) -> Option<Namespaces> {
        Some(Namespaces {
            user: self.ns(pid, "user")?,
            mnt: self.ns(pid, "mnt")?,
        })
    }

    pub fn comm(&self, pid: i32) -> Option<String> {
        read(self.path(pid, "comm")).map(|s| s.trim_end().to_owned())
    }

    /// A process's mount table (`None`: this process's own).
    pub fn mounts(&self, pid: Option<i32>) -> Option<Vec<Mount>> {
        let p = match pid {
            Some(pid) => self.path(pid, "mountinfo"),
            None => format!("{}/self/mountinfo", self.root),
        };
        // Any user may mount (FUSE) at a path that is not UTF-8, and mounts propagate: such
        // a line must not hide the others.
        read_bytes(p).map(|t| parse_mountinfo(&String::from_utf8_lossy(&t)))
    }
}

/// Device numbers (`st_rdev`) → the processes that have such a char device open.
pub type Openers = BTreeMap<u64, Vec<ProcRef>>;

/// What one bounded pass over `/proc` found ([`Proc::openers`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OpenersFound {
    /// Who has one of the wanted numbers open.
    pub openers: Openers,
    /// Processes whose descriptor tables were not all read before the budget ran out (the
    /// largest tables first, at most [`UNREAD_KEPT`]): any of them may have one open.
    pub unread: Vec<ProcRef>,
    /// How many processes were not read to the end.
    pub unread_total: usize,
}

/// How many of the processes a look did not finish [`OpenersFound::unread`] names.
pub const UNREAD_KEPT: usize = 16;

impl OpenersFound {
    /// Whether every process was read to the end.
    pub fn complete(&self) -> bool {
        self.unread_total == 0
    }
}

/// The time a look at `/proc` may take: past it, the look stops and says what it did not
/// read (a process can hold a million descriptors; the look runs under the state lock).
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    until: std::time::Instant,
}

impl Budget {
    pub fn new(d: std::time::Duration) -> Budget {
        Budget {
            until: std::time::Instant::now() + d,
        }
    }
    fn spent(&self) -> bool {
        std::time::Instant::now() >= self.until
    }
}

/// How a look at one process's descriptors ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Look {
    /// Every table read (or not ours to read: see [`Proc::open_wanted`]).
    Done,
    /// A table larger than the limit asked for: not read.
    Large(u64),
    /// The budget ran out on the way.
    Stopped,
    /// Read to the end, but some descriptor could not be looked at: a file whose own
    /// `getattr` refuses even root (FUSE without `allow_sys_admin_access`) while its link
    /// can be read. What it holds is not known: as if not read. (A process whose links may
    /// not be read at all, ptrace access refused, is not ours to look at: `Done`.)
    Unknown,
}

/// A table with more descriptors than this is read after every smaller one (`stat` of
/// `/proc/PID/fd` counts them, Linux 6.2 and later): one process with a million
/// descriptors cannot use up the budget before the others were looked at.
const LARGE: u64 = 10_000;

impl Proc<'_> {
    /// The processes of this `/proc`: its numeric entries (thread groups; the threads that
    /// do not share their group's descriptor table are looked at by [`Proc::open_wanted`]).
    pub fn pids(&self) -> Vec<i32> {
        let Ok(d) = std::fs::read_dir(self.root) else {
            return Vec::new();
        };
        d.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|p| *p > 0)
            .collect()
    }

    /// The descriptor tables of process `pid`, as `fd` directories: its own (the thread
    /// group leader's), and that of each thread with a table of its own. A leader that
    /// exited (`pthread_exit` in `main`: a zombie while another thread runs) has an empty
    /// `PID/fd`, its threads still the table; a thread that `unshare(CLONE_FILES)` has a
    /// table of its own. `kcmp(KCMP_FILES)` says whether two tasks share one, so a process
    /// of many threads that share one table costs one `kcmp` per thread, and one of a single
    /// thread one `statx` (`nlink` of `PID/task` counts the threads). Where `kcmp` cannot
    /// tell (not the host's `/proc`, an error), the thread's table is read anyway.
    fn tables(&self, pid: i32) -> Vec<String> {
        let mut out = vec![self.path(pid, "fd")];
        let task = self.path(pid, "task");
        use std::os::unix::fs::MetadataExt;
        // One thread (its task directory holds `.`, `..` and itself): one table.
        if !std::fs::symlink_metadata(&task).is_ok_and(|m| m.nlink() > 3) {
            return out;
        }
        let Ok(d) = std::fs::read_dir(&task) else {
            return out;
        };
        let host = self.root == "/proc";
        let mut reps = vec![pid];
        for t in d.flatten() {
            let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if tid == pid {
                continue;
            }
            if host && reps.iter().any(|r| same_files(*r, tid) == Some(true)) {
                continue;
            }
            reps.push(tid);
            out.push(format!("{task}/{tid}/fd"));
        }
        out
    }

    /// Calls `f` with each of `wanted` that process `pid` (any of its descriptor tables,
    /// see [`Proc::tables`]) has open, really open: a `statx` of every `fd/N`, which follows
    /// the magic link to the open file whatever path opened it (a node in a container's
    /// `/dev`, one received over a unix socket); for a wanted number, `fdinfo/N` says
    /// whether it is an `O_PATH` descriptor, which is not counted (it needs no device-cgroup
    /// access, `mknod` in a container makes the node, and it can never become a real open
    /// without that access). `AT_STATX_DONT_SYNC`: a descriptor on a network or FUSE file
    /// system answers from the cache, never waits on its server. Unreadable (gone, not ours
    /// to look at): nothing. Stops when `budget` is spent, or (with `large`) before a table
    /// of more descriptors than that.
    fn open_wanted(
        &self,
        pid: i32,
        wanted: &BTreeSet<u64>,
        budget: &Budget,
        large: Option<u64>,
        f: &mut impl FnMut(u64),
    ) -> Look {
        let mut unknown = false;
        for fd in self.tables(pid) {
            match self.table(&fd, wanted, budget, large, f) {
                Look::Done => {}
                Look::Unknown => unknown = true,
                other => return other,
            }
        }
        if unknown {
            Look::Unknown
        } else {
            Look::Done
        }
    }

    fn table(
        &self,
        fd_dir: &str,
        wanted: &BTreeSet<u64>,
        budget: &Budget,
        large: Option<u64>,
        f: &mut impl FnMut(u64),
    ) -> Look {
        use std::os::fd::AsRawFd;
        let mut dir = match nix::dir::Dir::open(
            fd_dir,
            nix::fcntl::OFlag::O_RDONLY
                | nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        ) {
            Ok(d) => d,
            // Gone: it holds nothing; or not ours to look at (ptrace access refused).
            Err(
                nix::errno::Errno::ENOENT
                | nix::errno::Errno::ESRCH
                | nix::errno::Errno::EACCES
                | nix::errno::Errno::EPERM,
            ) => return Look::Done,
            Err(_) => return Look::Unknown,
        };
        let dfd = dir.as_raw_fd();
        // SAFETY: `dfd` is the descriptor of `dir`, open for this whole call.
        let at = unsafe { std::os::fd::BorrowedFd::borrow_raw(dfd) };
        // Not ours to look at (ptrace access refused: its first link does not read): the
        // table (of a thread too) is not listed for nothing.
        if denied(nix::fcntl::readlinkat(at, "0")) {
            return Look::Done;
        }
        if let Some(limit) = large {
            // procfs counts the open descriptors as the directory's size (Linux 6.2+; 0
            // before, so every table is then read in PID order).
            if let Ok(st) = nix::sys::stat::fstat(&dir) {
                let n = u64::try_from(st.st_size).unwrap_or(0);
                if n > limit {
                    return Look::Large(n);
                }
            }
        }
        let info_dir = format!("{}info", fd_dir);
        let mut unknown = false;
        for e in dir.iter().flatten() {
            if budget.spent() {
                return Look::Stopped;
            }
            let name = e.file_name();
            if name.to_bytes().first().is_none_or(|c| !c.is_ascii_digit()) {
                continue;
            }
            let seen = match statx_chr(dfd, name) {
                Ok(Some(s)) => s,
                Ok(None) => continue,
                // A descriptor whose file refuses to say what it is (its own getattr:
                // FUSE refuses even root): the rest of the table is still read, and what
                // this one is stays unknown.
                Err(nix::errno::Errno::EACCES | nix::errno::Errno::EPERM) => {
                    if nix::fcntl::readlinkat(at, name).is_err() {
                        // Not even its link may be read: the process is not ours to look
                        // at (ptrace access refused: one beyond our namespace, or an
                        // LSM's), as the rest of its table.
                        return Look::Done;
                    }
                    unknown = true;
                    continue;
                }
                // Closed meanwhile.
                Err(_) => continue,
            };
            if !wanted.contains(&seen.rdev) {
                continue;
            }
            let n = String::from_utf8_lossy(name.to_bytes()).into_owned();
            if really_open(dfd, name, &format!("{info_dir}/{n}"), seen, wanted) {
                f(seen.rdev);
            }
        }
        if unknown {
            Look::Unknown
        } else {
            Look::Done
        }
    }

    /// Whether process `pid` has any of `wanted` open: `Some(false)` only when all its
    /// descriptors were read.
    pub fn holds_any(&self, pid: i32, wanted: &BTreeSet<u64>, budget: &Budget) -> Option<bool> {
        let mut hit = false;
        let look = self.open_wanted(pid, wanted, budget, None, &mut |_| hit = true);
        if hit {
            Some(true)
        } else if look == Look::Done {
            Some(false)
        } else {
            None
        }
    }

    /// One pass over the processes `keep` takes (all but ourselves; no kernel thread): which
    /// have one of `wanted` open, within `budget`. The tables larger than [`LARGE`] are read
    /// last, smallest first; those the budget did not reach (or finish) are in [`OpenersFound::unread`].
    pub fn openers(
        &self,
        wanted: &BTreeSet<u64>,
        keep: impl Fn(i32) -> bool,
        budget: &Budget,
    ) -> OpenersFound {
        let mut out = OpenersFound::default();
        if wanted.is_empty() {
            return out;
        }
        // Kernel threads (kthreadd, PID 2, and its children: most PIDs of a big host) have
        // no descriptors: one read names them all.
        let mut kernel = BTreeSet::new();
        if self.comm(2).as_deref() == Some("kthreadd") {
            kernel.insert(2);
            kernel.extend(self.children(2));
        }
        let pids: Vec<i32> = self
            .pids()
            .into_iter()
            .filter(|p| !kernel.contains(p) && keep(*p))
            .collect();
        let mut large = Vec::new();
        // Not read to the end: the large tables the budget did not reach first.
        let (mut unread_large, mut unread) = (Vec::new(), Vec::new());
        // Read, but with descriptors that could not be looked at.
        let mut unknown = Vec::new();
        let record = |pid: i32, hits: BTreeSet<u64>, out: &mut OpenersFound| {
            if hits.is_empty() {
                return;
            }
            // Its identity, read after: a process that exited meanwhile holds nothing.
            let Some(r) = self.proc_ref(pid) else {
                return;
            };
            for n in hits {
                out.openers.entry(n).or_default().push(r);
            }
        };
        for (i, pid) in pids.iter().copied().enumerate() {
            let mut hits = BTreeSet::new();
            let look = self.open_wanted(pid, wanted, budget, Some(LARGE), &mut |n| {
                hits.insert(n);
            });
            record(pid, hits, &mut out);
            match look {
                Look::Done => {}
                Look::Unknown => unknown.push(pid),
                Look::Large(n) => large.push((n, pid)),
                Look::Stopped => {
                    unread.extend_from_slice(&pids[i..]);
                    break;
                }
            }
        }
        large.sort_unstable();
        for (_, pid) in large {
            let mut hits = BTreeSet::new();
            let done = !budget.spent()
                && self.open_wanted(pid, wanted, budget, None, &mut |n| {
                    hits.insert(n);
                }) == Look::Done;
            record(pid, hits, &mut out);
            if !done {
                unread_large.push(pid);
            }
        }
        unread_large.reverse();
        unread_large.extend(unknown);
        unread_large.extend(unread);
        out.unread_total = unread_large.len();
        out.unread = unread_large
            .into_iter()
            .filter_map(|p| self.proc_ref(p))
            .take(UNREAD_KEPT)
            .collect();
        out
    }
}

impl ProcRef {
    pub fn of(pid: i32) -> Option<ProcRef> {
        REAL.proc_ref(pid)
    }
    /// Whether this very process still exists and is not on its way out: one of its threads
    /// runs, not a zombie and not exiting (`PF_EXITING`, set before the kernel takes a task
    /// out of its cgroups and namespaces, so a half-exited init is never mistaken for a live
    /// one). Its main thread alone is not enough: PID 1 of a container can `pthread_exit` it
    /// and go on in another thread (the leader then shows as a zombie), and such a container
    /// must not look gone.
    pub fn alive(&self) -> bool {
        REAL.alive(self)
    }
}

/// A task's `stat` fields say it runs: not a zombie (or dead), not exiting.
fn running(f: &[String]) -> bool {
    const PF_EXITING: u64 = 0x4;
    !matches!(f.first().map(String::as_str), Some("Z") | Some("X"))
        && f.get(6)
            .and_then(|s| s.parse::<u64>().ok())
            .is_some_and(|flags| flags & PF_EXITING == 0)
}

/// Reads a procfs text file: no stat (procfs reports size 0), one buffer, until end of file.
/// Not UTF-8 is no failure: a process names itself with any bytes (`comm`, `status`'s
/// `Name:`), and the fields read after it must still be read.
fn read(p: impl AsRef<Path>) -> Option<String> {
    read_bytes(p).map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn read_bytes(p: impl AsRef<Path>) -> Option<Vec<u8>> {
    read_raw(p).ok()
}

/// What a task's `stat` file says.
enum TaskStat {
    /// No such task (the file cannot be opened or read: ENOENT, ESRCH).
    Gone,
    /// The fields after the command name: [0] is the state, [1] the parent, [6] the flags,
    /// [19] the start time.
    Fields(Vec<String>),
    /// There, but not in the kernel's format.
    Unparsed,
}

/// Reads a `stat` file as bytes: the command name (`comm`, any bytes the process chose,
/// `)` and spaces included) ends at the last `)`; what follows is the kernel's ASCII.
fn stat_fields(path: &str) -> TaskStat {
    let b = match read_raw(path) {
        Ok(b) => b,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH)) => {
            return TaskStat::Gone
        }
        Err(_) => return TaskStat::Unparsed,
    };
    let Some(close) = b.iter().rposition(|&c| c == b')') else {
        return TaskStat::Unparsed;
    };
    let Ok(rest) = std::str::from_utf8(&b[close + 1..]) else {
        return TaskStat::Unparsed;
    };
    let f: Vec<String> = rest.split_whitespace().map(str::to_owned).collect();
    if f.len() < 20 {
        return TaskStat::Unparsed;
    }
    TaskStat::Fields(f)
}

pub fn comm(pid: i32) -> Option<String> {
    REAL.comm(pid)
}

/// The process that ran us (libvirtd when we are its hook).
pub fn parent() -> Option<ProcRef> {
    ProcRef::of(nix::unistd::getppid().as_raw())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines() {
        let m = parse_mountinfo(concat!(
            "24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,size=123k,mode=755\n",
            "310 300 0:61 / /run/libvirt/lxc/t1.dev rw,nosuid,relatime shared:9 master:2 - tmpfs devfs rw,size=64k,mode=755\n",
            "77 27 254:0 /srv/a\\040b /mnt/x\\134y rw - ext4 /dev/vda rw\n",
            "garbage\n",
        ));
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].mount_point, "/run/libvirt/lxc/t1.dev");
        assert_eq!((m[1].fs_type.as_str(), m[1].root.as_str()), ("tmpfs", "/"));
        assert_eq!(m[1].dev, libc::makedev(0, 61));
        assert_eq!(m[0].super_options, "rw,size=123k,mode=755");
        assert_eq!(
            (m[2].root.as_str(), m[2].mount_point.as_str()),
            ("/srv/a b", "/mnt/x\\y")
        );
        assert_eq!(m[2].dev, libc::makedev(254, 0));
        // Our own mount namespace has a root.
        assert!(mounts(None).unwrap().iter().any(|m| m.mount_point == "/"));
    }

    /// A process's namespaces by inode, from the `ns/KIND` links (`KIND:[INODE]`); a link of
    /// another kind, or none, gives none.
    #[test]
    fn namespaces_by_inode() {
        let dir = tempfile::tempdir().unwrap();
        let ns = dir.path().join("7/ns");
        std::fs::create_dir_all(&ns).unwrap();
        std::os::unix::fs::symlink("user:[4026531837]", ns.join("user")).unwrap();
        std::os::unix::fs::symlink("mnt:[4026532210]", ns.join("mnt")).unwrap();
        std::os::unix::fs::symlink("mnt:[4026532211]", ns.join("pid")).unwrap();
        let p = Proc {
            root: dir.path().to_str().unwrap(),
        };
        assert_eq!(
            p.namespaces(7),
            Some(Namespaces {
                user: 4026531837,
                mnt: 4026532210
            })
        );
        assert_eq!(p.pid_ns(7), None);
        assert_eq!(p.namespaces(8), None);
        // This process's own, as the kernel shows them.
        let me = REAL.namespaces(std::process::id() as i32).unwrap();
        let ino = |k: &str| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(format!("/proc/self/ns/{k}"))
                .unwrap()
                .ino()
        };
        assert_eq!((me.user, me.mnt), (ino("user"), ino("mnt")));
    }

    /// A process whose main thread exited while another goes on (what a container's PID 1
    /// can do to look gone) is alive until its last thread ends.
    #[test]
    fn alive_while_any_thread_runs() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("leader.c");
        std::fs::write(
            &src,
            "#include <pthread.h>\n#include <unistd.h>\nstatic void *body(void *a) { sleep(20); _exit(0); }\nint main(void) { pthread_t t; pthread_create(&t, 0, body, 0); pthread_exit(0); }\n",
        )
        .unwrap();
        let bin = dir.path().join("leader");
        let cc = std::process::Command::new("cc")
            .arg("-o")
            .arg(&bin)
            .arg(&src)
            .arg("-lpthread")
            .status()
            .unwrap();
        assert!(cc.success(), "cc");
        let mut child = std::process::Command::new(&bin).spawn().unwrap();
        let pid = child.id() as i32;
        let p = ProcRef::of(pid).unwrap();
        // Wait until the main thread is gone (the leader shows as a zombie).
        let mut leader_gone = false;
        for _ in 0..200 {
            if REAL
                .pid_stat(pid)
                .and_then(|f| f.first().cloned())
                .as_deref()
                == Some("Z")
            {
                leader_gone = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(leader_gone, "the main thread did not exit");
        assert!(p.alive(), "a thread still runs");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!p.alive());
    }

    /// A process that names itself with bytes that are not UTF-8 (any process may: its own
    /// `comm`) is still read: its identity, liveness and PID-namespace ids. (Read as text,
    /// its `stat` failed to parse and a running container's init looked gone.)
    #[test]
    fn a_name_that_is_not_utf8_is_read() {
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(r"printf '\377\376) Z 1 ' > /proc/self/comm; while :; do sleep 1; done")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let mut renamed = false;
        for _ in 0..200 {
            if std::fs::read(format!("/proc/{pid}/comm")).unwrap_or_default() == b"\xff\xfe) Z 1 \n"
            {
                renamed = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(renamed, "the child did not rename itself");
        let r = ProcRef::of(pid).expect("identity read");
        assert!(r.alive(), "a running process with a strange name is alive");
        assert_eq!(REAL.ppid(pid), Some(std::process::id() as i32));
        assert_eq!(REAL.nspid(pid), vec![pid]);
        assert!(REAL.comm(pid).is_some());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!r.alive());
    }

    /// A `stat` that is there but not in the kernel's format means alive, never gone; a
    /// missing one means gone.
    /// A descriptor whose file refuses to say what it is (EACCES from its `statx`: a FUSE
    /// file refuses even root) does not end the look at its table: the process is "not read
    /// to the end", so a GPU it may hold behind that descriptor stays draining. (Before, the
    /// look stopped at that descriptor and called the process read and holding nothing.)
    #[test]
    fn an_unreadable_descriptor_leaves_the_process_unread() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("needs root (to become another uid): skipped");
            return;
        }
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // (Readable to the unprivileged child that looks.)
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let proc = dir.path().join("proc");
        let fd = proc.join("100/fd");
        std::fs::create_dir_all(&fd).unwrap();
        std::fs::create_dir_all(proc.join("100/fdinfo")).unwrap();
        std::fs::write(
            proc.join("100/stat"),
            "100 (holder) S 1 100 100 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 4242 1 1",
        )
        .unwrap();
        // fd 3: a file the looker may not look at (a directory only root may enter).
        let secret = dir.path().join("secret");
        std::fs::create_dir(&secret).unwrap();
        std::fs::write(secret.join("f"), "").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(secret.join("f"), fd.join("3")).unwrap();
        // fd 4: something else, readable.
        std::os::unix::fs::symlink("/dev/null", fd.join("4")).unwrap();
        for p in [&proc, &proc.join("100"), &fd] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let root = proc.to_str().unwrap().to_owned();
        // SAFETY: the child only makes syscalls, reads files and _exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let code = (|| {
                    nix::unistd::setgid(65534.into()).ok()?;
                    nix::unistd::setuid(65534.into()).ok()?;
                    let p = Proc { root: &root };
                    let wanted: BTreeSet<u64> = [libc::makedev(195, 0)].into();
                    let f = p.openers(
                        &wanted,
                        |_| true,
                        &Budget::new(std::time::Duration::from_secs(5)),
                    );
                    Some(if !f.complete() && f.unread.iter().any(|r| r.pid == 100) {
                        0
                    } else {
                        1
                    })
                })()
                .unwrap_or(2);
                // SAFETY: leave the forked test child at once.
                unsafe { libc::_exit(code) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let st = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(
                    st,
                    nix::sys::wait::WaitStatus::Exited(child, 0),
                    "the process was taken as read (1) or the child failed (2)"
                );
            }
        }
    }

    #[test]
    fn unparsed_stat_is_alive() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        std::fs::create_dir_all(dir.path().join("7")).unwrap();
        std::fs::write(dir.path().join("7/stat"), b"7 (\xff no close paren").unwrap();
        let p = Proc { root };
        assert!(p.alive(&ProcRef {
            pid: 7,
            start_time: 1
        }));
        assert!(!p.alive(&ProcRef {
            pid: 8,
            start_time: 1
        }));
    }

    #[test]
    fn identity_of_self_and_children() {
        let me = ProcRef::of(std::process::id() as i32).unwrap();
        assert!(me.alive());
        assert!(!ProcRef {
            start_time: me.start_time + 1,
            ..me
        }
        .alive());
        assert!(!ProcRef {
            pid: -1,
            start_time: 0
        }
        .alive());
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let kids = REAL.children(std::process::id() as i32);
        assert!(kids.contains(&(child.id() as i32)), "{kids:?}");
        let c = ProcRef::of(child.id() as i32).unwrap();
        assert_eq!(REAL.nspid(child.id() as i32), vec![child.id() as i32]);
        assert_eq!(comm(child.id() as i32).as_deref(), Some("sleep"));
        assert_eq!(
            REAL.ppid(child.id() as i32),
            Some(std::process::id() as i32)
        );
        child.kill().unwrap();
        // A zombie is not alive.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!c.alive());
        child.wait().unwrap();
        assert!(!c.alive());
    }
}
