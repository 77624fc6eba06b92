//! The running driver's user space for `driver="host"` ([`crate::host::driver`]), cached
//! beside the state file (`driver-cache.json`): keyed by the kernel module's version, the
//! config's `root`, and the identity (device, inode, size, modification time) of the host's
//! `ld.so.cache` and of every directory looked in, so a start after the first costs a read
//! of the module's version, that file and a `stat` of each; a driver upgrade, a module
//! reload of another version, a library added or removed, `ldconfig` run again: looked for
//! anew. Whether each file may be given (root's, not writable by group or others, nor its
//! directory) is checked at every start, cached or not.

use crate::host::config::Config;
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

/// What the cache file holds; another `format` is not read.
const FORMAT: u32 = 1;

/// A cache larger than this is not read (a driver's few hundred files are a few tens of KB).
const MAX_CACHE: u64 = 8 << 20;

/// The driver's files and what a plan needs of them beyond their paths.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Discovered {
    pub found: DriverFound,
    /// The `DT_SONAME` of each library in a library directory, by its path (in containers).
    pub sonames: BTreeMap<String, String>,
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
/// trust. One line naming the cause when there is none to give: no module loaded, no
/// `libcuda.so.V`, a file that may not be given.
pub fn host_driver(cfg: &Config) -> Result<(Discovered, Origin), DriverError> {
    let version = driver::module_version(&cfg.proc)?;
    let (d, from) = match read_cache(cfg, &version) {
        Some(d) => (d, Origin::Cache),
        None => {
            let d = discover(cfg, &version)?;
            if let Err(e) = write_cache(cfg, &d) {
                crate::log::info(&format!(
                    "driver \"host\": its files are not cached ({e}); each start looks for them"
                ));
            }
            (d, Origin::Discovery)
        }
    };
    driver::check_trust(&cfg.root, &d.found.files)?;
    Ok((d, from))
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
    Ok(Discovered { found, sonames })
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
    use std::os::unix::fs::PermissionsExt;

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
}
