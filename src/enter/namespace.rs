//! A running container's namespaces, opened once. gpuhook acts in a container's mount
//! namespace (its helper `setns`es into it) and, for an OCI container, first compares the
//! init's user and mount namespaces with those its runtime made (recorded by inode at the
//! `createRuntime` hook). Each namespace is opened once (`/proc/PID/ns/KIND`); the identity
//! compared is that descriptor's (`fstat`), and the descriptor kept is the one the helper joins:
//! an init that swaps its namespace after the look never has gpuhook enter the new one. The
//! operations sit behind [`NsOps`] (as youki puts its syscalls behind a trait): [`HostNs`] does
//! them; the tests drive a `/proc` whose links change between two opens.

use crate::host::procfs::Namespaces;
use nix::errno::Errno;
use serde::{Deserialize, Serialize};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

/// A kind of namespace gpuhook looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NsKind {
    User,
    Mnt,
}

impl NsKind {
    /// Its file under `/proc/PID/ns`.
    pub fn file(self) -> &'static str {
        match self {
            NsKind::User => "user",
            NsKind::Mnt => "mnt",
        }
    }

    /// As messages say it (`the mount namespace`).
    pub fn word(self) -> &'static str {
        match self {
            NsKind::User => "user",
            NsKind::Mnt => "mount",
        }
    }
}

/// A namespace's identity: its nsfs inode (what `/proc/PID/ns/KIND` links to, `KIND:[INODE]`)
/// and device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NsId {
    pub dev: u64,
    pub ino: u64,
}

/// The namespace operations gpuhook needs.
pub trait NsOps {
    /// An open namespace: it names that namespace whatever the process does afterwards.
    type Fd;
    /// Opens `/proc/PID/ns/KIND`.
    fn open(&self, pid: i32, kind: NsKind) -> Result<Self::Fd, Errno>;
    /// The identity of an open namespace (`fstat`).
    fn identity(&self, fd: &Self::Fd) -> Result<NsId, Errno>;
    /// Joins an open mount namespace (`setns`; in the helper, never in gpuhook itself).
    fn join(&self, fd: &Self::Fd) -> Result<(), Errno>;
}

/// The host's namespaces, through its `/proc`.
pub struct HostNs;

impl NsOps for HostNs {
    type Fd = OwnedFd;
    fn open(&self, pid: i32, kind: NsKind) -> Result<OwnedFd, Errno> {
        nix::fcntl::open(
            format!("/proc/{pid}/ns/{}", kind.file()).as_str(),
            nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
    }
    fn identity(&self, fd: &OwnedFd) -> Result<NsId, Errno> {
        nix::sys::stat::fstat(fd).map(|st| NsId {
            dev: st.st_dev,
            ino: st.st_ino,
        })
    }
    fn join(&self, fd: &OwnedFd) -> Result<(), Errno> {
        nix::sched::setns(fd.as_fd(), nix::sched::CloneFlags::CLONE_NEWNS)
    }
}

/// Why a process's namespaces could not be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinError {
    /// `/proc/PID/ns/KIND` could not be opened or read.
    Open { kind: NsKind, errno: Errno },
    /// The process is in another namespace of this kind than the one recorded.
    Left { kind: NsKind },
}

/// The mount namespace of `pid`, opened once, with its identity: when `want` is given, its
/// user and mount namespaces must be those (by inode), compared on the very descriptors
/// opened; the mount namespace's is the one returned, to be joined.
pub fn pin<O: NsOps>(
    ops: &O,
    pid: i32,
    want: Option<Namespaces>,
) -> Result<(O::Fd, NsId), PinError> {
    let open = |kind| {
        let fd = ops
            .open(pid, kind)
            .map_err(|errno| PinError::Open { kind, errno })?;
        let id = ops
            .identity(&fd)
            .map_err(|errno| PinError::Open { kind, errno })?;
        Ok((fd, id))
    };
    // Each namespace opened once; the identity compared is the descriptor's.
    let (mnt, id) = open(NsKind::Mnt)?;
    if let Some(w) = want {
        let (_user, user) = open(NsKind::User)?;
        if user.ino != w.user {
            return Err(PinError::Left { kind: NsKind::User });
        }
        if id.ino != w.mnt {
            return Err(PinError::Left { kind: NsKind::Mnt });
        }
    }
    Ok((mnt, id))
}

/// A container init's mount namespace, opened once ([`pin`]): what every helper of the
/// command joins. Shared by the copies of a `Container`; equal by identity.
#[derive(Clone)]
pub struct MntNs {
    fd: Arc<OwnedFd>,
    pub id: NsId,
}

impl MntNs {
    /// The mount namespace of `pid` ([`pin`] on the host).
    pub fn pin(pid: i32, want: Option<Namespaces>) -> Result<MntNs, PinError> {
        let (fd, id) = pin(&HostNs, pid, want)?;
        Ok(MntNs {
            fd: Arc::new(fd),
            id,
        })
    }

    /// Joins it ([`HostNs::join`]).
    pub fn join(&self) -> Result<(), Errno> {
        HostNs.join(&self.fd)
    }

    /// This process's own (a container the tests' doubles stand for).
    #[cfg(test)]
    pub fn own() -> MntNs {
        MntNs::pin(std::process::id() as i32, None).expect("/proc/self/ns/mnt")
    }
}

impl PartialEq for MntNs {
    fn eq(&self, other: &MntNs) -> bool {
        self.id == other.id
    }
}

impl Eq for MntNs {}

impl std::fmt::Debug for MntNs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "mnt:[{}]", self.id.ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    /// A `/proc` whose `ns` links are lists: each open takes the namespace at the front, and
    /// the next open the one after it (the process swapped its namespace in between), the
    /// last staying. Records every call.
    #[derive(Default)]
    struct Swapping {
        links: RefCell<BTreeMap<&'static str, Vec<u64>>>,
        calls: RefCell<Vec<String>>,
    }

    impl Swapping {
        fn new(user: &[u64], mnt: &[u64]) -> Swapping {
            let s = Swapping::default();
            s.links.borrow_mut().insert("user", user.to_vec());
            s.links.borrow_mut().insert("mnt", mnt.to_vec());
            s
        }
        fn calls(&self) -> Vec<String> {
            self.calls.borrow().clone()
        }
    }

    impl NsOps for Swapping {
        type Fd = u64;
        fn open(&self, pid: i32, kind: NsKind) -> Result<u64, Errno> {
            let mut links = self.links.borrow_mut();
            let l = links.get_mut(kind.file()).ok_or(Errno::ENOENT)?;
            let ns = l[0];
            if l.len() > 1 {
                l.remove(0);
            }
            self.calls
                .borrow_mut()
                .push(format!("open /proc/{pid}/ns/{} = {ns}", kind.file()));
            Ok(ns)
        }
        fn identity(&self, fd: &u64) -> Result<NsId, Errno> {
            self.calls.borrow_mut().push(format!("fstat {fd}"));
            Ok(NsId { dev: 4, ino: *fd })
        }
        fn join(&self, fd: &u64) -> Result<(), Errno> {
            self.calls.borrow_mut().push(format!("setns {fd}"));
            Ok(())
        }
    }

    const RECORDED: Namespaces = Namespaces {
        user: 4026531837,
        mnt: 4026532210,
    };

    /// The namespace compared is the namespace joined: an init whose mount namespace is
    /// swapped right after gpuhook's first look is entered in the one compared, the recorded
    /// one (issue 39: the old code compared the links, then opened the mount namespace again
    /// by path, and joined the new one).
    #[test]
    fn the_namespace_compared_is_the_one_joined() {
        let ns = Swapping::new(&[RECORDED.user], &[RECORDED.mnt, 4026532999]);
        let (fd, id) = pin(&ns, 4242, Some(RECORDED)).unwrap();
        assert_eq!(id.ino, RECORDED.mnt);
        ns.join(&fd).unwrap();
        let calls = ns.calls();
        assert_eq!(
            calls.last().map(String::as_str),
            Some("setns 4026532210"),
            "{calls:?}"
        );
        assert_eq!(
            calls.iter().filter(|c| c.contains("/ns/mnt")).count(),
            1,
            "opened once: {calls:?}"
        );
    }

    /// An init found in another namespace than the one recorded is refused, naming which;
    /// without a record, the one it is in is taken (and joined).
    #[test]
    fn an_init_in_another_namespace_is_refused() {
        let ns = Swapping::new(&[RECORDED.user], &[4026532999]);
        assert_eq!(
            pin(&ns, 4242, Some(RECORDED)).unwrap_err(),
            PinError::Left { kind: NsKind::Mnt }
        );
        let ns = Swapping::new(&[4026532000], &[RECORDED.mnt]);
        assert_eq!(
            pin(&ns, 4242, Some(RECORDED)).unwrap_err(),
            PinError::Left { kind: NsKind::User }
        );
        let ns = Swapping::new(&[4026532000], &[4026532999]);
        let (fd, _) = pin(&ns, 4242, None).unwrap();
        assert_eq!(fd, 4026532999);
    }

    /// The host's operations, and right after the first `fstat` that finds the mount namespace
    /// `moved_from`, the process moves to a new one (told on its standard input; waited for).
    struct MovesAfterLook {
        pid: i32,
        moved_from: u64,
        tell: RefCell<Option<std::process::ChildStdin>>,
    }

    impl NsOps for MovesAfterLook {
        type Fd = OwnedFd;
        fn open(&self, pid: i32, kind: NsKind) -> Result<OwnedFd, Errno> {
            HostNs.open(pid, kind)
        }
        fn identity(&self, fd: &OwnedFd) -> Result<NsId, Errno> {
            let id = HostNs.identity(fd)?;
            if id.ino == self.moved_from {
                if let Some(mut w) = self.tell.borrow_mut().take() {
                    use std::io::Write;
                    w.write_all(b"move\n").unwrap();
                    let t = std::time::Instant::now();
                    while crate::host::procfs::REAL.ns(self.pid, "mnt") == Some(self.moved_from) {
                        assert!(t.elapsed().as_secs() < 10, "the process never moved");
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                }
            }
            Ok(id)
        }
        fn join(&self, fd: &OwnedFd) -> Result<(), Errno> {
            HostNs.join(fd)
        }
    }

    /// On the kernel (root): a process in a mount namespace of its own whose namespace is
    /// swapped for another right after gpuhook compared it is entered in the one compared,
    /// never in the new one (issue 39: the old code opened the namespace again by its path
    /// after the comparison).
    #[test]
    fn on_the_kernel_the_namespace_entered_is_the_one_compared() {
        let mut p = std::process::Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c"])
            .arg("read x; exec unshare -m --propagation private sleep 30")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("unshare (util-linux), as root");
        let pid = p.id() as i32;
        let host = crate::host::procfs::REAL;
        let me = std::process::id() as i32;
        let own = host.namespaces(me).unwrap();
        let t = std::time::Instant::now();
        let first = loop {
            match host.ns(pid, "mnt") {
                Some(n) if n != own.mnt && host.comm(pid).as_deref() == Some("sh") => break n,
                _ => {}
            }
            assert!(t.elapsed().as_secs() < 10, "no namespace of its own");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        let ops = MovesAfterLook {
            pid,
            moved_from: first,
            tell: RefCell::new(p.stdin.take()),
        };
        let want = Namespaces {
            user: own.user,
            mnt: first,
        };
        let (fd, id) = pin(&ops, pid, Some(want)).unwrap();
        let now = host.ns(pid, "mnt").unwrap();
        assert_ne!(now, first, "it moved");
        assert_eq!(id.ino, first);
        // A process that joins what was compared: in the first namespace.
        let fd = Arc::new(fd);
        let joined = fd.clone();
        let mut c = std::process::Command::new("readlink");
        c.arg("/proc/self/ns/mnt");
        // SAFETY: between fork and exec the child only calls setns on a descriptor it
        // inherited.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut c, move || {
                HostNs.join(&joined).map_err(std::io::Error::from)
            });
        }
        let out = c.output().unwrap();
        let _ = p.kill();
        let _ = p.wait();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("mnt:[{first}]"),
            "not the namespace compared (it moved to mnt:[{now}])"
        );
    }
}
