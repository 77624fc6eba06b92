//! The driver's sockets (`/run/nvidia-persistenced/socket`, `/run/nvidia-fabricmanager/socket`),
//! checked as nothing else is: a socket is a door into a daemon that runs as root or as a
//! service account, and a bind mount of the wrong one (`/run/docker.sock`) makes a
//! container's root the host's.
//!
//! A socket is given only when it is reached from the config's `root` with no symbolic link
//! at any component ([`open`] walks it one component at a time with `O_NOFOLLOW` and keeps a
//! descriptor of each), every directory on the way is root's and not writable by group or
//! others, and the socket is root's — or its owner, and its own directory's, is an account
//! the config's `driver_socket_owners` names ([`Owners`]). A socket whose own directory is
//! such an account's could be swapped by that account between this check and the mount (a
//! link to `/run/docker.sock` in its place): it is given through gpuhook's own hard link,
//! made from the descriptor checked ([`pin`]), in a directory of root's that no one else can
//! change; never by its path.
//!
//! An account that owns the socket's directory may also *hard-link* any socket it can see
//! there (the kernel stops a hard link to another's file only with
//! `fs.protected_hardlinks=1`, which the kernel does not set by default): `ln
//! /run/docker.sock /run/nvidia-persistenced/socket` leaves no link to refuse, only the same
//! inode under a second name. So in such a directory the socket must be a named account's
//! (a root socket there is refused: the account cannot have bound it), and have no name but
//! its path and gpuhook's own link (a hard link keeps the first name: docker's socket
//! linked there has two); whatever the sysctl says.

use super::{DriverError, DriverFile};
use crate::host::config::SocketOwner;
use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode};
use std::cell::OnceCell;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Where account names are looked up, under the config's `root`.
pub const PASSWD: &str = "etc/passwd";

/// A passwd larger than this is not read.
const MAX_PASSWD: u64 = 16 << 20;

/// An account that owns a socket or its directory, for messages: `nvidia-persistenced (uid
/// 999)`, or `uid 999` when the host's passwd names none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub uid: u32,
    pub name: Option<String>,
}

impl std::fmt::Display for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.name {
            Some(n) => write!(f, "{n} (uid {})", self.uid),
            None => write!(f, "uid {}", self.uid),
        }
    }
}

/// The accounts whose sockets may be given (config `driver_socket_owners`), their names
/// looked up in `<root>/etc/passwd` when first needed (a start that meets no socket of
/// another owner reads nothing).
pub struct Owners<'a> {
    root: &'a Path,
    named: &'a [SocketOwner],
    passwd: OnceCell<Vec<(String, u32)>>,
}

impl<'a> Owners<'a> {
    pub fn new(root: &'a Path, named: &'a [SocketOwner]) -> Owners<'a> {
        Owners {
            root,
            named,
            passwd: OnceCell::new(),
        }
    }

    /// The host's accounts (name, uid), from a passwd of root's that group and others may
    /// not write (anyone who could write it could name their uid after a trusted account).
    fn accounts(&self) -> Result<&[(String, u32)], DriverError> {
        if let Some(a) = self.passwd.get() {
            return Ok(a);
        }
        let path = self.root.join(PASSWD);
        let err = |source: std::io::Error| DriverError::Accounts {
            path: path.clone(),
            source,
        };
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(&path)
            .map_err(err)?;
        let md = f.metadata().map_err(err)?;
        if !md.is_file() || md.uid() != 0 || md.mode() & 0o022 != 0 {
            return Err(err(std::io::Error::other(format!(
                "not a regular file of root's closed to group and others (uid {}, mode {:04o})",
                md.uid(),
                md.mode() & 0o7777
            ))));
        }
        let mut text = Vec::new();
        f.take(MAX_PASSWD).read_to_end(&mut text).map_err(err)?;
        let list = parse_passwd(&String::from_utf8_lossy(&text));
        Ok(self.passwd.get_or_init(|| list))
    }

    /// Whether `uid` is named (by uid, or by a name the host's passwd gives that uid).
    fn allows(&self, uid: u32) -> Result<bool, DriverError> {
        if self.named.contains(&SocketOwner::Uid(uid)) {
            return Ok(true);
        }
        let names: Vec<&str> = self
            .named
            .iter()
            .filter_map(|o| match o {
                SocketOwner::Name(n) => Some(n.as_str()),
                SocketOwner::Uid(_) => None,
            })
            .collect();
        if names.is_empty() {
            return Ok(false);
        }
        Ok(self
            .accounts()?
            .iter()
            .any(|(n, u)| *u == uid && names.contains(&n.as_str())))
    }

    /// `uid` with its name, when the host's passwd can be read (for messages only).
    fn account(&self, uid: u32) -> Account {
        let name = self
            .accounts()
            .ok()
            .and_then(|a| a.iter().find(|(_, u)| *u == uid).map(|(n, _)| n.clone()));
        Account { uid, name }
    }
}

/// The (name, uid) of each well-formed line of a passwd file, in its order.
pub fn parse_passwd(text: &str) -> Vec<(String, u32)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let uid = f.nth(1)?.parse().ok()?;
            (!name.is_empty() && !name.starts_with(['#', '+', '-']))
                .then(|| (name.to_string(), uid))
        })
        .collect()
}

/// A socket that may be given only through gpuhook's own link ([`pin`]): its directory is
/// an account's, which could put something else at its path after this check.
#[derive(Debug)]
pub struct HeldSocket {
    /// Where containers get it (without the root).
    pub path: String,
    /// The socket checked (`O_PATH`).
    pub fd: OwnedFd,
    /// Who owns its directory.
    pub dir_owner: Account,
    /// Its links (`st_nlink`) when checked: 1, or 2 when the other is gpuhook's own
    /// ([`pinned`]).
    pub links: u64,
}

fn stat_of(fd: &OwnedFd) -> Result<FileStat, std::io::Error> {
    fstat(fd).map_err(std::io::Error::from)
}

fn kind(st: &FileStat) -> libc::mode_t {
    st.st_mode & libc::S_IFMT
}

/// One component of a socket's way, opened without following a link.
fn component(dir: &OwnedFd, name: &str, at: &Path) -> Result<(OwnedFd, FileStat), DriverError> {
    let gone = |source: std::io::Error| DriverError::Gone {
        path: at.to_path_buf(),
        source,
    };
    let fd = openat(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| gone(e.into()))?;
    let st = stat_of(&fd).map_err(gone)?;
    Ok((fd, st))
}

/// Checks the socket `f` (its `path` under `root`; `root` and the directories above it are
/// checked by the caller) and says how it may be given: `None`, by its path (a directory
/// chain of root's: no one else can change what is there); `Some`, only through a link
/// made from the descriptor checked ([`pin`]).
pub fn open(
    root: &Path,
    f: &DriverFile,
    owners: &Owners,
) -> Result<Option<HeldSocket>, DriverError> {
    let host = root.join(f.path.trim_start_matches('/'));
    let comps: Vec<&str> = f.path.split('/').filter(|c| !c.is_empty()).collect();
    let Some((name, dirs)) = comps.split_last() else {
        return Err(DriverError::Changed {
            path: host,
            want: "socket",
        });
    };
    if comps.iter().any(|c| *c == "." || *c == "..") {
        return Err(DriverError::Changed {
            path: host,
            want: "socket",
        });
    }
    let mut dir = nix::fcntl::open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| DriverError::Gone {
        path: root.to_path_buf(),
        source: e.into(),
    })?;
    let mut at = root.to_path_buf();
    // The owner of the socket's own directory, when not root (and whether it is named).
    let mut dir_owner: Option<(u32, bool)> = None;
    for (i, c) in dirs.iter().enumerate() {
        at.push(c);
        let (fd, st) = component(&dir, c, &at)?;
        if kind(&st) == libc::S_IFLNK {
            return Err(DriverError::SocketDirLink {
                path: host,
                dir: at,
            });
        }
        if kind(&st) != libc::S_IFDIR {
            return Err(DriverError::Changed {
                path: at,
                want: "directory",
            });
        }
        if st.st_uid != 0 {
            if i + 1 < dirs.len() {
                return Err(DriverError::DirNotRoots {
                    path: host,
                    dir: at,
                    uid: st.st_uid,
                });
            }
            dir_owner = Some((st.st_uid, owners.allows(st.st_uid)?));
        }
        if st.st_mode & 0o022 != 0 {
            return Err(DriverError::DirWritable {
                path: host,
                dir: at,
                mode: st.st_mode & 0o7777,
            });
        }
        dir = fd;
    }
    let (fd, st) = component(&dir, name, &host)?;
    if kind(&st) == libc::S_IFLNK {
        return Err(DriverError::SocketLink { path: host });
    }
    if kind(&st) != libc::S_IFSOCK {
        return Err(DriverError::Changed {
            path: host,
            want: "socket",
        });
    }
    if st.st_uid != 0 && !owners.allows(st.st_uid)? {
        return Err(DriverError::SocketOwner {
            path: host,
            owner: owners.account(st.st_uid),
        });
    }
    given_how(f, host, at, (fd, st), dir_owner, owners)
}

/// How the socket checked (`fd`, `st`; at `host`, in the directory `at`) may be given:
/// by its path when its directory is root's; from its descriptor when it is a named
/// account's, the socket being that account's, or another named one's, with no name but its
/// path and gpuhook's own link.
fn given_how(
    f: &DriverFile,
    host: PathBuf,
    at: PathBuf,
    (fd, st): (OwnedFd, FileStat),
    dir_owner: Option<(u32, bool)>,
    owners: &Owners,
) -> Result<Option<HeldSocket>, DriverError> {
    match dir_owner {
        None => Ok(None),
        Some((uid, false)) => Err(DriverError::SocketDirOwner {
            dir: at,
            path: host,
            owner: owners.account(uid),
        }),
        Some((uid, true)) => {
            let dir_owner = owners.account(uid);
            // The account could not have bound a socket of root's: it linked one.
            if st.st_uid == 0 {
                return Err(DriverError::SocketRootsInAccountDir {
                    path: host,
                    dir: at,
                    owner: dir_owner,
                });
            }
            #[allow(clippy::useless_conversion)] // nlink_t is u32 on some targets
            let links = u64::from(st.st_nlink);
            if links > 2 {
                return Err(DriverError::SocketLinks {
                    path: host,
                    owner: dir_owner,
                    links,
                });
            }
            Ok(Some(HeldSocket {
                path: f.path.clone(),
                fd,
                dir_owner,
                links,
            }))
        }
    }
}

/// Whether `name` in `dir` is already a link to the socket checked (`fd`).
pub fn pinned(fd: &OwnedFd, dir: &OwnedFd, name: &str) -> bool {
    match (fstat(fd), fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)) {
        (Ok(st), Ok(now)) => (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino),
        _ => false,
    }
}

/// The name of a socket's link in gpuhook's directory: its path, `/` as `_`
/// (`run_nvidia-persistenced_socket`).
pub fn pin_name(path: &str) -> String {
    path.trim_start_matches('/').replace('/', "_")
}

/// Makes `name` in `dir` (a directory of root's no one else may write) a hard link to the
/// socket checked, from its descriptor (`linkat(fd, "", …, AT_EMPTY_PATH)`: no path is looked
/// up again): a new link under a temporary name renamed over the old one, or nothing when
/// `name` already is that socket. `EXDEV` when `dir` is on another file system; `ENOENT`
/// when the socket was unlinked since it was checked.
pub fn pin(fd: &OwnedFd, dir: &OwnedFd, name: &str) -> Result<(), Errno> {
    if pinned(fd, dir, name) {
        return Ok(());
    }
    let tmp = format!(".{name}.{}", std::process::id());
    let unlink = |n: &str| {
        let _ = nix::unistd::unlinkat(dir, n, nix::unistd::UnlinkatFlags::NoRemoveDir);
    };
    unlink(&tmp);
    nix::unistd::linkat(fd, "", dir, tmp.as_str(), AtFlags::AT_EMPTY_PATH)?;
    let r = nix::fcntl::renameat(dir, tmp.as_str(), dir, name);
    // A rename onto another link of the same file does nothing: the temporary name stays.
    unlink(&tmp);
    r
}

/// The host path of `f` under `root`, as a socket given by its path is mounted from.
pub fn by_path(root: &Path, f: &DriverFile) -> PathBuf {
    root.join(f.path.trim_start_matches('/'))
}
