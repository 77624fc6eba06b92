//! The running driver's user space for `driver="host"` ([`crate::host::driver`]), cached
//! beside the state file (`driver-cache.json`): keyed by the kernel module's version, the
//! config's `root`, and the identity (device, inode, size, modification time) of the host's
//! `ld.so.cache` and of every directory looked in, so a start after the first costs a read
//! of the module's version, that file and a `stat` of each; a driver upgrade, a module
//! reload of another version, a library added or removed, `ldconfig` run again: looked for
//! anew. Whether each file may be given (root's, not writable by group or others, nor its
//! directory; a socket reached with no link) is checked at every start, cached or not, and
//! a socket in a directory of a service account's is then given through gpuhook's own hard
//! link to the very socket checked, in `driver-sockets/` beside the state file
//! ([`crate::host::driver::socket`]).

use crate::host::config::Config;
use crate::host::driver::socket::{self, HeldSocket};
use crate::host::driver::{self, DriverError, DriverFileKind, DriverFound};
use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, Mode};
use nix::unistd::mkdir;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The cache's file name, beside the state file.
pub const CACHE_FILE: &str = "driver-cache.json";

/// Where sockets in a directory not root's are linked from, beside the state file.
pub const SOCKETS_DIR: &str = "driver-sockets";

/// What the cache file holds; another `format` is not read (1: a socket's `source` had its
/// links resolved; 2: sockets are found without following a link).
const FORMAT: u32 = 2;

/// A cache larger than this is not read (a driver's few hundred files are a few tens of KB).
const MAX_CACHE: u64 = 8 << 20;

/// The driver's files and what a plan needs of them beyond their paths.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Discovered {
    pub found: DriverFound,
    /// The `DT_SONAME` of each library in a library directory, by its path (in containers).
    pub sonames: BTreeMap<String, String>,
    /// The sockets (paths in containers) given through gpuhook's own link, their directory
    /// being a service account's; set at each start, never cached.
    #[serde(skip)]
    pub pinned: Vec<String>,
}

/// Where a [`Discovered`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The cache: nothing looked at had changed.
    Cache,
    /// Looked for now (and cached, if the state directory can be written).
    Discovery,
}

#[derive(Serialize, Deserialize)]
struct CacheFile {
    format: u32,
    root: PathBuf,
    discovered: Discovered,
}

/// The running NVIDIA driver's files on this host (the config's `proc` and `root`): from the
/// cache while nothing it was found through has changed, else found again; each checked for
/// trust, and each socket given by its path or, in a directory of a service account's,
/// through gpuhook's link to the socket checked. One line naming the cause when there is
/// none to give: no module loaded, no `libcuda.so.V`, a file that may not be given.
pub fn host_driver(cfg: &Config) -> Result<(Discovered, Origin), DriverError> {
    let (mut d, from) = found(cfg)?;
    let held = check(cfg, &d)?;
    give_sockets(cfg, &mut d, held)?;
    Ok((d, from))
}

/// What was found: the cache's, or looked for now (and cached).
fn found(cfg: &Config) -> Result<(Discovered, Origin), DriverError> {
    let version = driver::module_version(&cfg.proc)?;
    if let Some(d) = read_cache(cfg, &version) {
        return Ok((d, Origin::Cache));
    }
    let d = discover(cfg, &version)?;
    if let Err(e) = write_cache(cfg, &d) {
        crate::log::info(&format!(
            "driver \"host\": its files are not cached ({e}); each start looks for them"
        ));
    }
    Ok((d, Origin::Discovery))
}

/// [`driver::check_trust`] with the config's `driver_socket_owners`.
fn check(cfg: &Config, d: &Discovered) -> Result<Vec<HeldSocket>, DriverError> {
    let owners = socket::Owners::new(&cfg.root, &cfg.driver_socket_owners);
    driver::check_trust(&cfg.root, &d.found.files, &owners)
}

/// Where each socket is mounted from: its path under the root, or for one in `held`
/// (checked, in a directory of a service account's) gpuhook's hard link to it in
/// `driver-sockets/` beside the state file, made from the descriptor checked. Never a path
/// the account could change after the check.
fn give_sockets(
    cfg: &Config,
    d: &mut Discovered,
    held: Vec<HeldSocket>,
) -> Result<(), DriverError> {
    d.pinned.clear();
    for f in d
        .found
        .files
        .iter_mut()
        .filter(|f| f.kind == DriverFileKind::Socket)
    {
        f.source = socket::by_path(&cfg.root, f);
    }
    if held.is_empty() {
        return Ok(());
    }
    let dir_path = state_dir(cfg).join(SOCKETS_DIR);
    let fail = |h: &HeldSocket, e: Errno| {
        let (path, dir, owner) = (
            cfg.root.join(h.path.trim_start_matches('/')),
            dir_path.clone(),
            h.dir_owner.clone(),
        );
        match e {
            Errno::EXDEV => DriverError::SocketOtherFs { path, dir, owner },
            e => DriverError::SocketPin {
                path,
                dir,
                owner,
                source: e.into(),
            },
        }
    };
    let dir = sockets_dir(cfg).map_err(|e| fail(&held[0], e))?;
    for h in &held {
        let name = socket::pin_name(&h.path);
        // Its second name must be gpuhook's own link, made by an earlier start.
        if h.links > 1 && !socket::pinned(&h.fd, &dir, &name) {
            return Err(DriverError::SocketLinks {
                path: cfg.root.join(h.path.trim_start_matches('/')),
                owner: h.dir_owner.clone(),
                links: h.links,
            });
        }
        socket::pin(&h.fd, &dir, &name).map_err(|e| fail(h, e))?;
        if let Some(f) = d
            .found
            .files
            .iter_mut()
            .find(|f| f.kind == DriverFileKind::Socket && f.path == h.path)
        {
            f.source = dir_path.join(&name);
        }
        d.pinned.push(h.path.clone());
    }
    Ok(())
}

/// `driver-sockets/` in the state directory: made (0755) when missing, opened without
/// following a link, root's and closed to others.
fn sockets_dir(cfg: &Config) -> Result<OwnedFd, Errno> {
    let state = open_state_dir(cfg, true)?.ok_or(Errno::ENOENT)?;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = match openat(&state, SOCKETS_DIR, flags, Mode::empty()) {
        Err(Errno::ENOENT) => {
            match nix::sys::stat::mkdirat(&state, SOCKETS_DIR, Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(e),
            }
            openat(&state, SOCKETS_DIR, flags, Mode::empty())?
        }
        r => r?,
    };
    let st = fstat(&fd)?;
    if st.st_uid != nix::unistd::geteuid().as_raw() || st.st_mode & 0o022 != 0 {
        return Err(Errno::EPERM);
    }
    Ok(fd)
}

/// Looks for the driver's files now (no cache read or written) and reads their SONAMEs.
pub fn discover(cfg: &Config, version: &str) -> Result<Discovered, DriverError> {
    let found = driver::discover(&cfg.root, version)?;
    let sonames = found
        .of(DriverFileKind::Library)
        .filter(|f| {
            f.path
                .rsplit_once('/')
                .is_some_and(|(d, _)| found.lib_dirs.iter().any(|x| x == d))
        })
        .filter_map(|f| crate::cdi::soname(&f.source).map(|s| (f.path.clone(), s)))
        .collect();
    Ok(Discovered {
        found,
        sonames,
        pinned: Vec::new(),
    })
}

/// The cache's path: beside the state file.
pub fn cache_path(cfg: &Config) -> PathBuf {
    state_dir(cfg).join(CACHE_FILE)
}

fn state_dir(cfg: &Config) -> PathBuf {
    cfg.state_file
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| "/".into())
}

/// The state directory, opened without following a link, ours and closed to others;
/// made (0700) when `create` and missing.
fn open_state_dir(cfg: &Config, create: bool) -> Result<Option<OwnedFd>, Errno> {
    let dir = state_dir(cfg);
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = match nix::fcntl::open(&dir, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) if create => {
            match mkdir(&dir, Mode::from_bits_truncate(0o700)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(e),
            }
            nix::fcntl::open(&dir, flags, Mode::empty())?
        }
        Err(Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    let st = fstat(&fd)?;
    if st.st_uid != nix::unistd::geteuid().as_raw() || st.st_mode & 0o022 != 0 {
        return Err(Errno::EPERM);
    }
    Ok(Some(fd))
}

/// The cached files, when the cache is of this version and root and nothing it was found
/// through changed since.
fn read_cache(cfg: &Config, version: &str) -> Option<Discovered> {
    let dir = open_state_dir(cfg, false).ok()??;
    let fd = openat(
        &dir,
        CACHE_FILE,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let st = fstat(&fd).ok()?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG
        || st.st_uid != nix::unistd::geteuid().as_raw()
        || st.st_mode & 0o022 != 0
        || st.st_size as u64 > MAX_CACHE
    {
        return None;
    }
    let mut buf = Vec::with_capacity(st.st_size as usize);
    std::fs::File::from(fd)
        .take(MAX_CACHE)
        .read_to_end(&mut buf)
        .ok()?;
    let c: CacheFile = serde_json::from_slice(&buf).ok()?;
    let fits = c.format == FORMAT
        && c.root == cfg.root
        && c.discovered.found.version == version
        && c.discovered.found.unchanged();
    fits.then_some(c.discovered)
}

/// Replaces the cache (a temporary file renamed over it).
fn write_cache(cfg: &Config, d: &Discovered) -> Result<(), std::io::Error> {
    let dir = open_state_dir(cfg, true)?.ok_or(Errno::ENOENT)?;
    let c = CacheFile {
        format: FORMAT,
        root: cfg.root.clone(),
        discovered: d.clone(),
    };
    let bytes = serde_json::to_vec(&c).map_err(std::io::Error::other)?;
    let tmp = format!(".{CACHE_FILE}.{}", std::process::id());
    let r = crate::host::atomic::AtomicWrite {
        dir: dir.as_fd(),
        tmp: Path::new(&tmp),
        name: Path::new(CACHE_FILE),
        mode: 0o600,
        chmod: None,
        owner: None,
        clear_stale: true,
        durable: false,
    };
    crate::host::atomic::replace(&r, &bytes).map_err(|(_, e)| std::io::Error::from(e))
}

/// Removes the cache (the next start looks again); `Ok` when there was none.
pub fn forget(cfg: &Config) -> Result<(), std::io::Error> {
    match std::fs::remove_file(cache_path(cfg)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::net::UnixListener;

    const V: &str = "550.54.15";
    const LIB: &str = "usr/lib/x86_64-linux-gnu";

    /// A fake host: `root` with a driver of `V` (real ELF libraries with SONAMEs, built by
    /// `cc`), `proc` saying that version, a state directory.
    struct Fake {
        _t: tempfile::TempDir,
        cfg: Config,
    }

    fn fake() -> Fake {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        let lib = root.join(LIB);
        std::fs::create_dir_all(&lib).unwrap();
        let src = t.path().join("f.c");
        std::fs::write(&src, "int f(void) { return 1; }\n").unwrap();
        for (stem, so) in [
            ("libcuda", "libcuda.so.1"),
            ("libnvidia-ml", "libnvidia-ml.so.1"),
        ] {
            let ok = std::process::Command::new("cc")
                .args(["-shared", "-fPIC"])
                .arg(format!("-Wl,-soname,{so}"))
                .arg("-o")
                .arg(lib.join(format!("{stem}.so.{V}")))
                .arg(&src)
                .status()
                .expect("cc")
                .success();
            assert!(ok);
        }
        let proc = t.path().join("proc");
        std::fs::create_dir_all(proc.join("driver/nvidia")).unwrap();
        std::fs::write(
            proc.join("driver/nvidia/version"),
            format!("NVRM version: NVIDIA UNIX x86_64 Kernel Module  {V}  Tue Mar  5 22:23:56 UTC 2024\n"),
        )
        .unwrap();
        let run = t.path().join("run");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
        let cfg = Config {
            root,
            proc,
            state_file: run.join("state.json"),
            ..Config::default()
        };
        Fake { _t: t, cfg }
    }

    #[test]
    fn the_second_look_is_a_cache_read_until_something_changes() {
        let f = fake();
        let (d, from) = host_driver(&f.cfg).unwrap();
        assert_eq!(from, Origin::Discovery);
        assert_eq!(
            d.sonames
                .get(&format!("/{LIB}/libcuda.so.{V}"))
                .map(String::as_str),
            Some("libcuda.so.1")
        );
        assert!(cache_path(&f.cfg).exists());
        let (again, from) = host_driver(&f.cfg).unwrap();
        assert_eq!(from, Origin::Cache);
        assert_eq!(again, d);
        // A library added: looked for again, and found.
        std::thread::sleep(std::time::Duration::from_millis(10));
        let lib = f.cfg.root.join(LIB);
        std::fs::copy(
            lib.join(format!("libnvidia-ml.so.{V}")),
            lib.join(format!("libnvidia-cfg.so.{V}")),
        )
        .unwrap();
        let (more, from) = host_driver(&f.cfg).unwrap();
        assert_eq!(from, Origin::Discovery);
        assert_eq!(more.found.files.len(), d.found.files.len() + 1);
        assert_eq!(host_driver(&f.cfg).unwrap().1, Origin::Cache);
        // Another module version: looked for again (and there is no libcuda of it).
        std::fs::write(
            f.cfg.proc.join("driver/nvidia/version"),
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.28.03  Release Build\n",
        )
        .unwrap();
        let e = host_driver(&f.cfg).unwrap_err();
        assert!(matches!(e, DriverError::NoLibcuda { .. }), "{e}");
        // Another root: not this cache's.
        std::fs::write(
            f.cfg.proc.join("driver/nvidia/version"),
            format!("NVRM version: NVIDIA UNIX x86_64 Kernel Module  {V}  Tue\n"),
        )
        .unwrap();
        assert_eq!(host_driver(&f.cfg).unwrap().1, Origin::Cache);
        let other = Config {
            root: f.cfg.root.join("nowhere"),
            ..f.cfg.clone()
        };
        assert!(matches!(
            host_driver(&other),
            Err(DriverError::NoLibcuda { .. })
        ));
    }

    #[test]
    fn trust_is_checked_on_a_cache_hit_too() {
        let f = fake();
        host_driver(&f.cfg).unwrap();
        let lib = f.cfg.root.join(LIB).join(format!("libcuda.so.{V}"));
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o775)).unwrap();
        // chmod does not change the directory: still a cache hit, and refused.
        let e = host_driver(&f.cfg).unwrap_err();
        assert!(
            matches!(e, DriverError::Writable { mode: 0o775, .. }),
            "{e}"
        );
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(host_driver(&f.cfg).unwrap().1, Origin::Cache);
    }

    #[test]
    fn a_cache_that_is_not_ours_is_not_read() {
        let f = fake();
        host_driver(&f.cfg).unwrap();
        let p = cache_path(&f.cfg);
        // Corrupt: looked for again (and written anew).
        std::fs::write(&p, b"{").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(host_driver(&f.cfg).unwrap().1, Origin::Discovery);
        assert_eq!(host_driver(&f.cfg).unwrap().1, Origin::Cache);
        // Writable by others: not trusted.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(host_driver(&f.cfg).unwrap().1, Origin::Discovery);
        // A link in its place is not followed.
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &p).unwrap();
        assert_eq!(host_driver(&f.cfg).unwrap().1, Origin::Discovery);
        assert!(std::fs::symlink_metadata(&p).unwrap().is_file());
        forget(&f.cfg).unwrap();
        assert!(!p.exists());
        forget(&f.cfg).unwrap();
    }

    // ---- a service account's socket ----

    const SVC: u32 = 999;
    const SOCK: &str = "run/nvidia-persistenced/socket";

    /// `nvidia-persistenced --user nvidia-persistenced` on the fake host: its directory and
    /// socket the account's, the host's passwd naming it; `run/docker.sock` (root's) beside.
    /// The listeners: persistenced's, docker's.
    fn service(f: &Fake) -> (UnixListener, UnixListener) {
        let sock = f.cfg.root.join(SOCK);
        let dir = sock.parent().unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let real = UnixListener::bind(&sock).unwrap();
        std::os::unix::fs::lchown(&sock, Some(SVC), Some(SVC)).unwrap();
        std::os::unix::fs::chown(dir, Some(SVC), Some(SVC)).unwrap();
        let docker = UnixListener::bind(f.cfg.root.join("run/docker.sock")).unwrap();
        std::fs::create_dir_all(f.cfg.root.join("etc")).unwrap();
        std::fs::write(
            f.cfg.root.join("etc/passwd"),
            format!("root:x:0:0:root:/root:/bin/sh\nnvidia-persistenced:x:{SVC}:{SVC}::/:/usr/sbin/nologin\n"),
        )
        .unwrap();
        (real, docker)
    }

    fn named(cfg: &Config) -> Config {
        Config {
            driver_socket_owners: vec![crate::host::config::SocketOwner::Name(
                "nvidia-persistenced".into(),
            )],
            ..cfg.clone()
        }
    }

    fn id(p: &Path) -> (u64, u64) {
        let m = std::fs::symlink_metadata(p).unwrap();
        (m.dev(), m.ino())
    }

    /// Which of `ls` a client connecting at `path` reaches.
    fn reached(path: &Path, ls: &[&UnixListener]) -> Vec<bool> {
        let _c = std::os::unix::net::UnixStream::connect(path).unwrap();
        ls.iter()
            .map(|l| {
                l.set_nonblocking(true).unwrap();
                l.accept().is_ok()
            })
            .collect()
    }

    fn socket_of(d: &Discovered) -> &crate::host::driver::DriverFile {
        d.found
            .of(DriverFileKind::Socket)
            .next()
            .expect("the socket is given")
    }

    /// Stock packaging: refused until `driver_socket_owners` names the account (cached or
    /// not); then given through gpuhook's own hard link beside the state file, the same
    /// socket, in a directory of root's; the cache holds no such link.
    #[test]
    fn a_service_accounts_socket_is_given_through_gpuhooks_own_link() {
        let f = fake();
        let (real, docker) = service(&f);
        let sock = f.cfg.root.join(SOCK);
        let e = host_driver(&f.cfg).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("driver \"host\": {} is owned by nvidia-persistenced (uid {SVC}), not root: name it in driver_socket_owners to give it", sock.display())
        );
        let cfg = named(&f.cfg);
        let (d, from) = host_driver(&cfg).unwrap();
        assert_eq!(
            from,
            Origin::Cache,
            "the refused start cached what it found"
        );
        let s = socket_of(&d);
        let link = f
            .cfg
            .state_file
            .parent()
            .unwrap()
            .join("driver-sockets/run_nvidia-persistenced_socket");
        assert_eq!(
            (s.path.as_str(), &s.source),
            ("/run/nvidia-persistenced/socket", &link)
        );
        assert_eq!(d.pinned, ["/run/nvidia-persistenced/socket"]);
        assert_eq!(id(&link), id(&sock));
        assert_eq!(reached(&link, &[&real, &docker]), [true, false]);
        let dm = std::fs::symlink_metadata(link.parent().unwrap()).unwrap();
        assert_eq!((dm.uid(), dm.mode() & 0o7777), (0, 0o755));
        let cached = std::fs::read_to_string(cache_path(&f.cfg)).unwrap();
        assert!(!cached.contains("driver-sockets"), "{cached}");
        assert!(cached.contains(&sock.display().to_string()), "{cached}");
        // Again: the same link; and refused again once the key is gone (a cache hit).
        assert_eq!(host_driver(&cfg).unwrap().0, d);
        assert!(matches!(
            host_driver(&f.cfg),
            Err(DriverError::SocketOwner { .. })
        ));
        // A root socket in a root directory is given by its path, as before.
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::lchown(&sock, Some(0), Some(0)).unwrap();
        std::os::unix::fs::chown(sock.parent().unwrap(), Some(0), Some(0)).unwrap();
        let (d, _) = host_driver(&f.cfg).unwrap();
        assert_eq!(socket_of(&d).source, sock);
        assert!(d.pinned.is_empty());
        assert!(!link.exists());
    }

    /// A socket of the account's with a second name: given only when that name is gpuhook's
    /// own link (an earlier start's); one the account linked in from elsewhere (or linked
    /// elsewhere) is refused, and so is a third name beside gpuhook's link.
    #[test]
    fn a_socket_with_another_name_than_gpuhooks_link_is_refused() {
        let f = fake();
        let (_real, _docker) = service(&f);
        let cfg = named(&f.cfg);
        let sock = f.cfg.root.join(SOCK);
        let aside = f.cfg.root.join("run/aside.sock");
        std::fs::hard_link(&sock, &aside).unwrap();
        let e = host_driver(&cfg).unwrap_err();
        assert!(
            matches!(e, DriverError::SocketLinks { links: 2, .. }),
            "{e}"
        );
        let link = state_dir(&cfg).join("driver-sockets/run_nvidia-persistenced_socket");
        assert!(!link.exists());
        // Without it, given (and linked by gpuhook); again with gpuhook's link its second.
        std::fs::remove_file(&aside).unwrap();
        host_driver(&cfg).unwrap();
        assert_eq!(id(&link), id(&sock));
        host_driver(&cfg).unwrap();
        // A third name beside gpuhook's link.
        std::fs::hard_link(&sock, &aside).unwrap();
        let e = host_driver(&cfg).unwrap_err();
        assert!(
            matches!(e, DriverError::SocketLinks { links: 3, .. }),
            "{e}"
        );
    }

    /// The race, with the account's swap done between the check and the use: what is given
    /// is the socket checked, never what the account put at the path after.
    #[test]
    fn a_swap_between_the_check_and_the_mount_gives_the_socket_checked() {
        let f = fake();
        let (real, docker) = service(&f);
        let cfg = named(&f.cfg);
        let sock = f.cfg.root.join(SOCK);
        let (mut d, _) = found(&cfg).unwrap();
        let held = check(&cfg, &d).unwrap();
        assert_eq!(held.len(), 1);
        // The account's move: its socket aside, a link to docker's in its place.
        let aside = sock.with_file_name("was");
        std::fs::rename(&sock, &aside).unwrap();
        std::os::unix::fs::symlink("../docker.sock", &sock).unwrap();
        give_sockets(&cfg, &mut d, held).unwrap();
        let given = &socket_of(&d).source;
        assert_eq!(id(given), id(&aside));
        assert_eq!(reached(given, &[&real, &docker]), [true, false]);
        // And the next start sees the link: refused.
        assert!(matches!(
            host_driver(&cfg),
            Err(DriverError::SocketLink { .. })
        ));
        // What the container was given still reaches the socket checked.
        assert_eq!(reached(given, &[&real, &docker]), [true, false]);
    }

    /// The account can keep its directory's identity (it owns it: `utimensat` puts the old
    /// time back) so that the cache still fits: the socket is checked anew all the same.
    #[test]
    fn a_cached_discovery_does_not_skip_the_socket_check() {
        let f = fake();
        let _l = service(&f);
        let cfg = named(&f.cfg);
        let sock = f.cfg.root.join(SOCK);
        let dir = sock.parent().unwrap().to_path_buf();
        host_driver(&cfg).unwrap();
        let before = std::fs::metadata(&dir).unwrap();
        std::fs::remove_file(&sock).unwrap();
        std::os::unix::fs::symlink("/run/docker.sock", &sock).unwrap();
        let ts = |s: i64, ns: i64| nix::sys::time::TimeSpec::new(s, ns);
        nix::sys::stat::utimensat(
            nix::fcntl::AT_FDCWD,
            &dir,
            &ts(before.atime(), before.atime_nsec()),
            &ts(before.mtime(), before.mtime_nsec()),
            nix::sys::stat::UtimensatFlags::NoFollowSymlink,
        )
        .unwrap();
        assert_eq!(found(&cfg).unwrap().1, Origin::Cache);
        let e = host_driver(&cfg).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("driver \"host\": the socket {} is a symbolic link; a socket is never given through one: refusing to give it", sock.display())
        );
    }

    /// gpuhook's link must be on the socket's file system: a state directory elsewhere
    /// (`/dev/shm`, a tmpfs, here beside a disk) refuses in one line saying what to do.
    #[test]
    fn a_state_directory_on_another_file_system_refuses_the_held_socket() {
        let f = fake();
        let _l = service(&f);
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        let cfg = Config {
            state_file: shm.path().join("state.json"),
            ..named(&f.cfg)
        };
        assert_ne!(
            id(shm.path()).0,
            id(&f.cfg.root).0,
            "this test needs /dev/shm on another file system than the temporary directory"
        );
        let e = host_driver(&cfg).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "driver \"host\": the socket {} is in a directory of nvidia-persistenced (uid {SVC}), so it is given only through gpuhook's own link in {}, and that is on another file system: put state_file on the socket's file system to give it",
                f.cfg.root.join(SOCK).display(),
                shm.path().join("driver-sockets").display()
            )
        );
        assert_eq!(e.to_string().lines().count(), 1);
    }

    /// A cache of the format before sockets were found without following links (its socket's
    /// `source` is where a link led) is not read.
    #[test]
    fn a_cache_of_the_old_format_is_not_read() {
        let f = fake();
        host_driver(&f.cfg).unwrap();
        let p = cache_path(&f.cfg);
        let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        assert_eq!(c["format"], 2);
        c["format"] = 1.into();
        std::fs::write(&p, serde_json::to_vec(&c).unwrap()).unwrap();
        assert_eq!(host_driver(&f.cfg).unwrap().1, Origin::Discovery);
    }
}
