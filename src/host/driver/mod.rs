//! The running NVIDIA driver's user space, found on the host (`driver="host"`, SPEC "Driver
//! user space found on the host"): the kernel module's version `V` from
//! `<proc>/driver/nvidia/version`; every regular file `lib*.so.V` in each directory that
//! holds `libcuda.so.V` or `libnvidia-ml.so.V` (the directories of those libraries in the
//! host's `<root>/etc/ld.so.cache` first, then the fixed ones), `vdpau/libvdpau_nvidia.so.V`
//! there; the firmware of `V`; the programs, sockets and ICD/config files the SPEC lists.
//! Nothing of another version: a library or firmware file of another driver left on the
//! host is never taken. The same file found twice (merged `/usr`) is taken once, at the
//! path found first.
//!
//! NVIDIA's own recipe (nvidia-container-toolkit `pkg/nvcdi/driver-nvml.go`,
//! `internal/lookup`, `internal/discover`) asks NVML for the version and looks libraries up
//! through `ldconfig -p` and a list of directories; here the version comes from procfs (no
//! library of the host is loaded) and the cache is read by [`ldcache`], never by running the
//! host's `ldconfig`.
//!
//! Paths are looked for under the config's `root` (`/` on a real host): each symlink on the
//! way is followed as if `root` were `/` — but for sockets, which are never reached through
//! a link ([`socket`]). A file's `path` is where it was found without that prefix (where
//! containers get it); its `source` is the host file, links resolved.
//! [`check_trust`] (every start, cached or not) refuses a file that is not root's or that
//! group or others may write, or whose directory is; a socket as [`socket::open`] says.

pub mod cachefile;
pub mod ldcache;
pub mod socket;

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The directories searched for the libraries after those `ld.so.cache` names, in order.
pub const LIB_DIRS: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib64",
    "/usr/lib",
];

/// Where programs are looked for, in order (the first of each name is taken).
pub const PROGRAM_DIRS: [&str; 4] = ["/usr/bin", "/usr/sbin", "/bin", "/sbin"];

/// The driver's programs.
pub const PROGRAMS: [&str; 5] = [
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

/// The driver's sockets.
pub const SOCKETS: [&str; 2] = [
    "/run/nvidia-persistenced/socket",
    "/run/nvidia-fabricmanager/socket",
];

/// The ICD and config files, each where present.
pub const CONFIGS: [&str; 4] = [
    "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    "/usr/share/vulkan/icd.d/nvidia_icd.json",
    "/etc/vulkan/icd.d/nvidia_icd.json",
    "/etc/OpenCL/vendors/nvidia.icd",
];

/// The directory of EGL external platform files (`*nvidia*.json` there are taken).
pub const EGL_PLATFORMS: &str = "/usr/share/egl/egl_external_platform.d";

/// Where the module says its version, under the config's `proc` root.
pub const VERSION_FILE: &str = "driver/nvidia/version";

/// What a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriverFileKind {
    Library,
    Firmware,
    Program,
    Socket,
    Config,
}

/// How a file was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FoundBy {
    /// In a directory the host's linker cache names.
    #[serde(rename = "ld.so.cache")]
    LdCache,
    /// In one of the fixed library directories ([`LIB_DIRS`]).
    #[serde(rename = "directory")]
    Directory,
    /// At a fixed path (firmware, programs, sockets, config files).
    #[serde(rename = "fixed")]
    Fixed,
}

/// One file of the driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverFile {
    /// Where it was found, without the root: where a container gets it.
    pub path: String,
    /// The host's file (under the root, symlinks resolved).
    pub source: PathBuf,
    pub kind: DriverFileKind,
    pub found_by: FoundBy,
}

/// The identity of a file or directory: what changes when it is replaced or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ident {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: i64,
}

impl Ident {
    /// `stat` of `p` (links followed); `None` when there is nothing there.
    pub fn of(p: &Path) -> Option<Ident> {
        std::fs::metadata(p).ok().map(|m| Self::from(&m))
    }

    /// `lstat` of `p` (a link is itself); `None` when there is nothing there.
    pub fn of_link(p: &Path) -> Option<Ident> {
        std::fs::symlink_metadata(p).ok().map(|m| Self::from(&m))
    }

    fn from(m: &std::fs::Metadata) -> Ident {
        Ident {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
        }
    }
}

/// A place looked at, and what was there then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Searched {
    /// Under the root.
    pub path: PathBuf,
    pub ident: Option<Ident>,
    /// Whether `ident` is of `path` itself, a link not followed (a socket's directory: a
    /// link put there or taken away is a change).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub link_itself: bool,
}

impl Searched {
    fn ident_now(&self) -> Option<Ident> {
        if self.link_itself {
            Ident::of_link(&self.path)
        } else {
            Ident::of(&self.path)
        }
    }
}

/// What was found for the running driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverFound {
    /// The kernel module's version.
    pub version: String,
    /// In the order they were found: libraries (then `vdpau`), firmware, programs, sockets,
    /// config files.
    pub files: Vec<DriverFile>,
    /// The directories the libraries are in, as containers see them (their linker cache
    /// folders), in order.
    pub lib_dirs: Vec<String>,
    /// `ld.so.cache` and every directory looked in, with their identity then.
    pub searched: Vec<Searched>,
}

impl DriverFound {
    /// Whether what was looked at is still as it was (`ld.so.cache`, each directory): then a
    /// new look would find the same.
    pub fn unchanged(&self) -> bool {
        self.searched.iter().all(|s| s.ident_now() == s.ident)
    }

    /// The files of a kind.
    pub fn of(&self, k: DriverFileKind) -> impl Iterator<Item = &DriverFile> {
        self.files.iter().filter(move |f| f.kind == k)
    }
}

/// Why the driver's user space cannot be given. Each message is one line naming the file.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("driver \"host\": no NVIDIA kernel module is loaded ({} does not exist)", .path.display())]
    NoModule { path: PathBuf },
    #[error("driver \"host\": {}: {source}", .path.display())]
    ModuleUnreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("driver \"host\": {} has no \"NVRM version: … Kernel Module VERSION\" line", .path.display())]
    NoVersion { path: PathBuf },
    #[error("driver \"host\": the loaded NVIDIA kernel module is {version}, but no libcuda.so.{version} is installed (looked in {dirs}); install that driver's user space")]
    NoLibcuda { version: String, dirs: String },
    #[error("driver \"host\": {} is owned by uid {uid}, not root; refusing to give it", .path.display())]
    NotRoots { path: PathBuf, uid: u32 },
    #[error("driver \"host\": {} has mode {mode:04o}: group or others may write it; refusing to give it", .path.display())]
    Writable { path: PathBuf, mode: u32 },
    #[error("driver \"host\": a directory on the way to {} ({}) is owned by uid {uid}, not root; refusing to give it", .path.display(), .dir.display())]
    DirNotRoots {
        path: PathBuf,
        dir: PathBuf,
        uid: u32,
    },
    #[error("driver \"host\": a directory on the way to {} ({}) has mode {mode:04o}: group or others may write it; refusing to give it", .path.display(), .dir.display())]
    DirWritable {
        path: PathBuf,
        dir: PathBuf,
        mode: u32,
    },
    #[error("driver \"host\": {}: {source}", .path.display())]
    Gone {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("driver \"host\": {} is no longer a {want}", .path.display())]
    Changed { path: PathBuf, want: &'static str },
    #[error("driver \"host\": the socket {} is a symbolic link; a socket is never given through one: refusing to give it", .path.display())]
    SocketLink { path: PathBuf },
    #[error("driver \"host\": a directory on the way to the socket {} ({}) is a symbolic link; a socket is never given through one: refusing to give it", .path.display(), .dir.display())]
    SocketDirLink { path: PathBuf, dir: PathBuf },
    #[error("driver \"host\": {} is owned by {owner}, not root: name it in driver_socket_owners to give it", .path.display())]
    SocketOwner {
        path: PathBuf,
        owner: socket::Account,
    },
    #[error("driver \"host\": the directory of the socket {} ({}) is owned by {owner}, not root: name it in driver_socket_owners to give it", .path.display(), .dir.display())]
    SocketDirOwner {
        path: PathBuf,
        dir: PathBuf,
        owner: socket::Account,
    },
    #[error("driver \"host\": the socket {} is root's, but its directory ({}) is {owner}'s, who cannot bind a socket of root's there, only hard-link one (/run/docker.sock?): refusing to give it", .path.display(), .dir.display())]
    SocketRootsInAccountDir {
        path: PathBuf,
        dir: PathBuf,
        owner: socket::Account,
    },
    #[error("driver \"host\": the socket {} in a directory of {owner} has {links} links, a name elsewhere besides its path and gpuhook's own link: a hard link the account made to another socket? refusing to give it", .path.display())]
    SocketLinks {
        path: PathBuf,
        owner: socket::Account,
        links: u64,
    },
    #[error("driver \"host\": {}: {source}; the names in driver_socket_owners cannot be looked up", .path.display())]
    Accounts {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("driver \"host\": the socket {} is in a directory of {owner}, so it is given only through gpuhook's own link in {}, and that is on another file system: put state_file on the socket's file system to give it", .path.display(), .dir.display())]
    SocketOtherFs {
        path: PathBuf,
        dir: PathBuf,
        owner: socket::Account,
    },
    #[error("driver \"host\": the socket {} is in a directory of {owner}, so it is given only through gpuhook's own link in {}, which cannot be made: {source}; refusing to give it", .path.display(), .dir.display())]
    SocketPin {
        path: PathBuf,
        dir: PathBuf,
        owner: socket::Account,
        source: std::io::Error,
    },
    #[error("driver \"host\": linker cache {}: {fault}; refusing to read it", .path.display())]
    LdCache {
        path: PathBuf,
        fault: cachefile::CacheFault,
    },
}

/// Whether `w` looks like a driver version: digits in two or more parts joined by dots.
pub fn version_shaped(w: &str) -> bool {
    w.split('.').count() >= 2
        && w.split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// The kernel module's version from the text of `/proc/driver/nvidia/version`: the first
/// version-shaped word after `Kernel Module` on the `NVRM version:` line, as both the
/// proprietary (`… x86_64 Kernel Module  550.54.15  Tue Mar  5 …`) and the open module
/// (`… Open Kernel Module for x86_64  560.28.03  Release Build …`) write it.
pub fn parse_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    let (_, after) = line.split_once("Kernel Module")?;
    after
        .split_whitespace()
        .find(|w| version_shaped(w))
        .map(str::to_owned)
}

/// The running module's version (`<proc>/driver/nvidia/version`).
pub fn module_version(proc: &Path) -> Result<String, DriverError> {
    let path = proc.join(VERSION_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(DriverError::NoModule { path })
        }
        Err(source) => return Err(DriverError::ModuleUnreadable { path, source }),
    };
    parse_version(&text).ok_or(DriverError::NoVersion { path })
}

/// `p` (absolute, as on the host) under `root`, each symlink on the way followed as if
/// `root` were `/` (40 at most): the path it leads to, without the root. `None` when
/// something on the way is missing or the links go round.
pub fn resolve(root: &Path, p: &str) -> Option<String> {
    let mut todo: Vec<String> = p
        .split('/')
        .filter(|c| !c.is_empty())
        .rev()
        .map(str::to_owned)
        .collect();
    let mut at: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(c) = todo.pop() {
        match c.as_str() {
            "." => continue,
            ".." => {
                at.pop();
                continue;
            }
            _ => {}
        }
        at.push(c);
        let here = root.join(at.join("/"));
        let md = std::fs::symlink_metadata(&here).ok()?;
        if md.file_type().is_symlink() {
            hops += 1;
            if hops > 40 {
                return None;
            }
            let target = std::fs::read_link(&here).ok()?;
            let t = target.to_str()?.to_owned();
            at.pop();
            if t.starts_with('/') {
                at.clear();
            }
            todo.extend(
                t.split('/')
                    .filter(|c| !c.is_empty())
                    .rev()
                    .map(str::to_owned),
            );
        }
    }
    Some(format!("/{}", at.join("/")))
}

/// A search under `root`: what was found, each host file once (by identity), and what was
/// looked at.
struct Search<'a> {
    root: &'a Path,
    found: DriverFound,
    seen: BTreeSet<(u64, u64)>,
}

impl Search<'_> {
    fn under(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    /// Records a directory (or file) looked at, under the root.
    fn looked(&mut self, p: &str) {
        self.record(p, false);
    }

    /// Records a directory looked at, under the root; `link_itself`: its identity is that
    /// of a link there, not followed.
    fn record(&mut self, p: &str, link_itself: bool) {
        let path = self.under(p);
        if !self
            .found
            .searched
            .iter()
            .any(|s| s.path == path && s.link_itself == link_itself)
        {
            let s = Searched {
                path,
                ident: None,
                link_itself,
            };
            let ident = s.ident_now();
            self.found.searched.push(Searched { ident, ..s });
        }
    }

    /// Takes the file at `resolved` (under the root, links resolved) as `path`, unless that
    /// host file was taken already; `want` says what it must be.
    fn take(
        &mut self,
        path: String,
        resolved: &str,
        kind: DriverFileKind,
        found_by: FoundBy,
        want: fn(&std::fs::FileType) -> bool,
    ) -> bool {
        let source = self.under(resolved);
        let Ok(md) = std::fs::symlink_metadata(&source) else {
            return false;
        };
        if !want(&md.file_type()) || !self.seen.insert((md.dev(), md.ino())) {
            return false;
        }
        self.found.files.push(DriverFile {
            path,
            source,
            kind,
            found_by,
        });
        true
    }

    /// A fixed path: taken (links followed) when it is there and of the wanted type.
    fn fixed(&mut self, p: &str, kind: DriverFileKind, want: fn(&std::fs::FileType) -> bool) {
        if let Some((dir, _)) = p.rsplit_once('/') {
            self.looked(dir);
        }
        if let Some(r) = resolve(self.root, p) {
            self.take(p.to_string(), &r, kind, FoundBy::Fixed, want);
        }
    }

    /// A socket at fixed path `p`: looked for without following a link. Taken when a socket
    /// is there, or when a link is anywhere on its way (for [`check_trust`] to refuse, naming
    /// it: something is at work where the driver's daemon should be).
    fn socket(&mut self, p: &str) {
        if let Some((dir, _)) = p.rsplit_once('/') {
            self.record(dir, true);
        }
        let mut at = self.root.to_path_buf();
        for c in p.split('/').filter(|c| !c.is_empty()) {
            at.push(c);
            let Ok(md) = std::fs::symlink_metadata(&at) else {
                return;
            };
            if md.file_type().is_symlink() || (at == self.under(p) && md.file_type().is_socket()) {
                self.found.files.push(DriverFile {
                    path: p.to_string(),
                    source: self.under(p),
                    kind: DriverFileKind::Socket,
                    found_by: FoundBy::Fixed,
                });
                return;
            }
        }
    }

    /// The regular files of directory `dir` (as found, under the root) whose names pass
    /// `keep`, sorted by name: (name, its resolved path).
    fn files_in(&mut self, dir: &str, keep: impl Fn(&str) -> bool) -> Vec<(String, String)> {
        self.looked(dir);
        let Some(real) = resolve(self.root, dir) else {
            return Vec::new();
        };
        let Ok(rd) = std::fs::read_dir(self.under(&real)) else {
            return Vec::new();
        };
        let mut names: Vec<String> = rd
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| keep(n))
            .collect();
        names.sort();
        let base = real.trim_end_matches('/').to_string();
        names
            .into_iter()
            .map(|n| {
                let r = format!("{base}/{n}");
                (n, r)
            })
            .collect()
    }
}

fn is_file(t: &std::fs::FileType) -> bool {
    t.is_file()
}

/// The directories of the driver's two key libraries in the linker cache, in its order
/// (64-bit x86-64 entries only).
fn cache_dirs(entries: &[ldcache::CacheEntry]) -> Vec<String> {
    let mut dirs: Vec<String> = Vec::new();
    for e in entries.iter().filter(|e| e.is_x86_64()) {
        if !(e.soname.starts_with("libcuda.so") || e.soname.starts_with("libnvidia-ml.so")) {
            continue;
        }
        let Some((d, _)) = e.path.rsplit_once('/') else {
            continue;
        };
        let d = if d.is_empty() { "/" } else { d };
        if d.starts_with('/') && !dirs.iter().any(|x| x == d) {
            dirs.push(d.to_string());
        }
    }
    dirs
}

/// The directories of the driver's libraries that the linker cache names (none when there is
/// no cache). A cache that may not be trusted, or cannot be read, is refused in one line
/// naming it: the search does not go on without it, since the directories it would have
/// named first might then give another copy of the driver than the host's loader uses.
fn ldcache_dirs(s: &mut Search) -> Result<Vec<String>, DriverError> {
    let path = s.under("/etc/ld.so.cache");
    let refused = |fault: cachefile::CacheFault| DriverError::LdCache {
        path: path.clone(),
        fault,
    };
    // A root that is not there has no cache (and no driver: `NoLibcuda` says where it looked).
    let read = match std::fs::canonicalize(s.root) {
        Ok(real) => cachefile::read(&real).map_err(refused)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(DriverError::Gone {
                path: s.root.to_path_buf(),
                source,
            })
        }
    };
    // The root and each directory above it are trusted before the bytes are used.
    if read.is_some() {
        check_root(s.root)?;
    }
    s.found.searched.push(Searched {
        path: path.clone(),
        ident: read.as_ref().map(|r| Ident {
            dev: r.stat.st_dev,
            ino: r.stat.st_ino,
            size: r.stat.st_size as u64,
            mtime: r.stat.st_mtime,
            mtime_nsec: r.stat.st_mtime_nsec,
        }),
        // The cache is opened without following a link: a link put in its place is a change.
        link_itself: true,
    });
    let Some(r) = read else {
        return Ok(Vec::new());
    };
    let (_, entries) = ldcache::parse(&r.bytes).map_err(|e| refused(e.into()))?;
    Ok(cache_dirs(&entries))
}

/// The driver's files at fixed places: firmware of this version, programs (the first of
/// each name), sockets, config files.
fn fixed_files(s: &mut Search, version: &str) {
    let root = s.root;
    // Firmware of this version.
    let fw = format!("/lib/firmware/nvidia/{version}");
    for (n, r) in s.files_in(&fw, |n| n.ends_with(".bin")) {
        s.take(
            format!("{fw}/{n}"),
            &r,
            DriverFileKind::Firmware,
            FoundBy::Fixed,
            is_file,
        );
    }
    // Programs: the first of each name.
    for p in PROGRAMS {
        for d in PROGRAM_DIRS {
            s.looked(d);
            let path = format!("{d}/{p}");
            let Some(r) = resolve(root, &path) else {
                continue;
            };
            if s.take(path, &r, DriverFileKind::Program, FoundBy::Fixed, is_file) {
                break;
            }
        }
    }
    for p in SOCKETS {
        s.socket(p);
    }
    for p in CONFIGS {
        s.fixed(p, DriverFileKind::Config, is_file);
    }
    for (n, _) in s.files_in(EGL_PLATFORMS, |n| {
        n.contains("nvidia") && n.ends_with(".json")
    }) {
        s.fixed(
            &format!("{EGL_PLATFORMS}/{n}"),
            DriverFileKind::Config,
            is_file,
        );
    }
}

/// Finds the files of driver `version` under `root` (SPEC: libraries, firmware, programs,
/// sockets, config files, in that order). An error when no `libcuda.so.VERSION` is there.
pub fn discover(root: &Path, version: &str) -> Result<DriverFound, DriverError> {
    let mut s = Search {
        root,
        found: DriverFound {
            version: version.to_string(),
            files: Vec::new(),
            lib_dirs: Vec::new(),
            searched: Vec::new(),
        },
        seen: BTreeSet::new(),
    };
    // The libraries: the linker cache's directories, then the fixed ones.
    let suffix = format!(".so.{version}");
    let mut dirs: Vec<(String, FoundBy)> = ldcache_dirs(&mut s)?
        .into_iter()
        .map(|d| (d, FoundBy::LdCache))
        .collect();
    dirs.extend(LIB_DIRS.iter().map(|d| (d.to_string(), FoundBy::Directory)));
    let mut dir_ids: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut looked_in = Vec::new();
    for (dir, by) in dirs {
        looked_in.push(dir.clone());
        let libs = s.files_in(&dir, |n| {
            n.starts_with("lib") && n.len() > 3 + suffix.len() && n.ends_with(&suffix)
        });
        let key = [format!("libcuda{suffix}"), format!("libnvidia-ml{suffix}")];
        if !libs.iter().any(|(n, _)| key.contains(n)) {
            continue;
        }
        let Some(id) = Ident::of(&s.under(&dir)) else {
            continue;
        };
        if !dir_ids.insert((id.dev, id.ino)) {
            continue;
        }
        let base = dir.trim_end_matches('/');
        let mut any = false;
        for (n, r) in libs {
            any |= s.take(
                format!("{base}/{n}"),
                &r,
                DriverFileKind::Library,
                by,
                is_file,
            );
        }
        let vdpau = format!("{base}/vdpau/libvdpau_nvidia{suffix}");
        s.looked(&format!("{base}/vdpau"));
        if let Some(r) = resolve(root, &vdpau) {
            s.take(vdpau, &r, DriverFileKind::Library, by, is_file);
        }
        if any {
            s.found.lib_dirs.push(base.to_string());
        }
    }
    let libcuda = format!("/libcuda{suffix}");
    if !s.found.files.iter().any(|f| f.path.ends_with(&libcuda)) {
        return Err(DriverError::NoLibcuda {
            version: version.to_string(),
            dirs: format!(
                "{}{}",
                looked_in.join(", "),
                if root == Path::new("/") {
                    String::new()
                } else {
                    format!(" under {}", root.display())
                }
            ),
        });
    }
    fixed_files(&mut s, version);
    Ok(s.found)
}

/// Every file is root's and not writable by group or others, nor is any directory on the way
/// to it from `/` (through the host's root, the config's `root`; a sticky one above `root`
/// may be, `/tmp`): a user who may write one could swap the file after this check, before it
/// is mounted. Below `root` each is a directory, not a link. A socket as [`socket::open`]
/// says (no link anywhere on its way; root's, or an account's `owners` names); those that
/// may be given only from the descriptor checked come back. Checked at every start: a file
/// changed since it was found (gone, or another type) is an error too.
pub fn check_trust(
    root: &Path,
    files: &[DriverFile],
    owners: &socket::Owners,
) -> Result<Vec<socket::HeldSocket>, DriverError> {
    check_root(root)?;
    let mut held = Vec::new();
    let mut dirs_ok: BTreeSet<PathBuf> = BTreeSet::new();
    for f in files {
        if f.kind == DriverFileKind::Socket {
            held.extend(socket::open(root, f, owners)?);
            continue;
        }
        let path = &f.source;
        let md = std::fs::symlink_metadata(path).map_err(|source| DriverError::Gone {
            path: path.clone(),
            source,
        })?;
        if !md.file_type().is_file() {
            return Err(DriverError::Changed {
                path: path.clone(),
                want: "regular file",
            });
        }
        if md.uid() != 0 {
            return Err(DriverError::NotRoots {
                path: path.clone(),
                uid: md.uid(),
            });
        }
        if md.mode() & 0o022 != 0 {
            return Err(DriverError::Writable {
                path: path.clone(),
                mode: md.mode() & 0o7777,
            });
        }
        // Its directory and each above it, below the root (found with every link
        // resolved: each a directory, not a link); or its directory alone where the file is
        // not under the root.
        let mut dirs: Vec<&Path> = path
            .ancestors()
            .skip(1)
            .take_while(|d| d.starts_with(root) && *d != root)
            .collect();
        if dirs.is_empty() && !path.starts_with(root) {
            dirs.extend(path.parent());
        }
        for dir in dirs {
            if !dirs_ok.insert(dir.to_path_buf()) {
                break;
            }
            trusted_dir(path, dir, false)?;
        }
    }
    Ok(held)
}

/// The root and each directory above it, as it really is (its links resolved): root's, not
/// writable by group or others — but for one above the root with the sticky bit (`/tmp`),
/// where no one else may rename what is root's.
fn check_root(root: &Path) -> Result<(), DriverError> {
    let real = std::fs::canonicalize(root).map_err(|source| DriverError::Gone {
        path: root.to_path_buf(),
        source,
    })?;
    for (i, dir) in real.ancestors().enumerate() {
        trusted_dir(root, dir, i > 0)?;
    }
    Ok(())
}

/// A directory `dir` on the way to `path`: a directory (not a link), root's, not writable by
/// group or others (`sticky_ok`: unless its sticky bit is set).
fn trusted_dir(path: &Path, dir: &Path, sticky_ok: bool) -> Result<(), DriverError> {
    let dm = std::fs::symlink_metadata(dir).map_err(|source| DriverError::Gone {
        path: dir.to_path_buf(),
        source,
    })?;
    if !dm.is_dir() {
        return Err(DriverError::Changed {
            path: dir.to_path_buf(),
            want: "directory",
        });
    }
    if dm.uid() != 0 {
        return Err(DriverError::DirNotRoots {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
            uid: dm.uid(),
        });
    }
    if dm.mode() & 0o022 != 0 && !(sticky_ok && dm.mode() & 0o1000 != 0) {
        return Err(DriverError::DirWritable {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
            mode: dm.mode() & 0o7777,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
