//! Loading the specs: the directories and files (trusted only when root's and not writable
//! by others), parsing, and the checks of a spec's shape and version.

use super::model::{Loaded, Spec, MAX_SPEC, MAX_VERSION, VERSIONS};
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, Mode};
use std::collections::BTreeSet;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

pub(super) fn dirs_list(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

// ---- loading ----

/// Why the specs could not be loaded. Each message is one line naming the directory or the
/// file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A spec directory cannot be resolved, opened or listed.
    #[error("CDI spec directory {dir}: {source}")]
    Dir { dir: String, source: std::io::Error },
    /// A directory on the way to a spec directory cannot be opened or looked at.
    #[error("CDI spec directory {dir}: {at}: {source}")]
    DirAt {
        dir: String,
        at: String,
        source: std::io::Error,
    },
    /// A spec directory (or a parent) is not root's.
    #[error("{what} is owned by uid {uid}, not root; refusing to read specs from it")]
    DirOwner { what: String, uid: u32 },
    /// A spec directory (or a parent) is writable by group or others.
    #[error(
        "{what} has mode {mode:04o}: group or others may write it; refusing to read specs from it"
    )]
    DirMode { what: String, mode: u32 },
    /// A spec file is a symlink.
    #[error("CDI spec {path} is a symlink; refusing to follow it")]
    Symlink { path: String },
    /// A spec file cannot be opened or read.
    #[error("CDI spec {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// A spec file is no regular file.
    #[error("CDI spec {path} is {kind}, not a regular file; refusing to read it")]
    NotFile { path: String, kind: &'static str },
    /// A spec file is not root's, or others may write it.
    #[error("CDI spec {path} is owned by uid {uid} with mode {mode:o}: it must be root's and not writable by others")]
    Untrusted { path: String, uid: u32, mode: u32 },
    /// A spec file is larger than gpuhook reads.
    #[error("CDI spec {path} is larger than {} MiB", MAX_SPEC >> 20)]
    TooBig { path: String },
    /// A spec file does not parse (the parser's message, on one line).
    #[error("CDI spec {path}: {}", one_line(&.source.to_string()))]
    Parse {
        path: String,
        source: SpecParseError,
    },
    /// A spec file parses but fails the reference loader's checks.
    #[error("CDI spec {path}: {source}")]
    Invalid { path: String, source: SpecError },
}

/// What the reference loader's checks find wrong with a spec as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("cdiVersion {0} is newer than the {MAX_VERSION} gpuhook reads")]
    NewerVersion(String),
    #[error("cdiVersion '{0}' is not a CDI version")]
    BadVersion(String),
    #[error("kind '{0}' is not VENDOR/CLASS")]
    BadKind(String),
    #[error("it defines no devices")]
    NoDevices,
    #[error("device name '{0}' is not valid")]
    BadDeviceName(String),
    #[error("device '{0}' is defined twice")]
    DeviceTwice(String),
}

/// Why a spec's text is no spec: the parser's message, or (checked) the reference loader's.
#[derive(Debug, thiserror::Error)]
pub enum SpecParseError {
    #[error("{0}")]
    Json(#[source] serde_json::Error),
    #[error("{0}")]
    Yaml(#[source] serde_yaml_ng::Error),
    #[error("{0}")]
    Invalid(#[from] SpecError),
}

/// Reads the specs of `kinds` in `dirs` (`*.json`, `*.yaml`, `*.yml`; a directory that does
/// not exist has none). A file that cannot be read or parsed is an error when it is (or may
/// be, for all its text says) of one of `kinds`; one of another kind is not looked at further.
/// Only root may have written what root acts on: a directory, or a parent of it, that is not
/// root's or that group or others may write is refused ([`open_dir`]); each file is opened
/// once, without following a link or waiting on a FIFO, and read from that descriptor.
pub fn load(dirs: &[PathBuf], kinds: &[&str]) -> Result<Vec<Loaded>, LoadError> {
    let mut out = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let Some(fd) = open_dir(dir)? else { continue };
        let listed = fd
            .try_clone()
            .and_then(|d| nix::dir::Dir::from_fd(d).map_err(io_err))
            .map_err(|source| LoadError::Dir {
                dir: dir.display().to_string(),
                source,
            })?;
        let mut files: Vec<PathBuf> = listed
            .into_iter()
            .filter_map(|e| e.ok())
            .map(|e| PathBuf::from(std::ffi::OsStr::from_bytes(e.file_name().to_bytes())))
            .filter(|p| {
                matches!(
                    p.extension().and_then(|x| x.to_str()),
                    Some("json" | "yaml" | "yml")
                )
            })
            .collect();
        files.sort();
        for f in files {
            let path = dir.join(&f);
            if let Some(spec) = read_spec(&fd, &f, &path, kinds)? {
                out.push(Loaded { path, dir: i, spec });
            }
        }
    }
    Ok(out)
}

/// A `nix` error as `std` says it (`Not a directory (os error 20)`), as messages did.
fn io_err(e: nix::Error) -> std::io::Error {
    std::io::Error::from_raw_os_error(e as i32)
}

/// A spec directory, opened from `/` one component at a time without following a link, each
/// checked on its descriptor: root's, not writable by group or others (a sticky `/tmp` is
/// writable by others: refused too). A link in the configured path (`/var/run` → `/run`) is
/// resolved first and the directories it leads to are the ones checked. `None` when the
/// directory does not exist (`/var/run/cdi` often does not).
fn open_dir(dir: &Path) -> Result<Option<OwnedFd>, LoadError> {
    let name = || dir.display().to_string();
    let real = match std::fs::canonicalize(dir) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(LoadError::Dir {
                dir: name(),
                source,
            })
        }
    };
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut at = PathBuf::from("/");
    let mut fd = nix::fcntl::open(&at, flags, Mode::empty()).map_err(|e| LoadError::DirAt {
        dir: name(),
        at: "/".into(),
        source: io_err(e),
    })?;
    trusted_dir(&fd, &at, dir, &real)?;
    for c in real.components() {
        let std::path::Component::Normal(c) = c else {
            continue;
        };
        at.push(c);
        fd = match openat(&fd, c, flags, Mode::empty()) {
            Ok(f) => f,
            Err(nix::Error::ENOENT) => return Ok(None),
            Err(e) if at == real => {
                return Err(LoadError::Dir {
                    dir: name(),
                    source: io_err(e),
                })
            }
            Err(e) => {
                return Err(LoadError::DirAt {
                    dir: name(),
                    at: at.display().to_string(),
                    source: io_err(e),
                })
            }
        };
        trusted_dir(&fd, &at, dir, &real)?;
    }
    Ok(Some(fd))
}

/// `at` (the spec directory `real`, which `dir` names, or a parent of it) is root's and not
/// writable by group or others.
fn trusted_dir(fd: &OwnedFd, at: &Path, dir: &Path, real: &Path) -> Result<(), LoadError> {
    let st = fstat(fd).map_err(|e| LoadError::DirAt {
        dir: dir.display().to_string(),
        at: at.display().to_string(),
        source: io_err(e),
    })?;
    let what = if at != real {
        format!(
            "CDI spec directory {}: its parent {}",
            dir.display(),
            at.display()
        )
    } else if real != dir {
        format!("CDI spec directory {} ({})", dir.display(), real.display())
    } else {
        format!("CDI spec directory {}", dir.display())
    };
    if st.st_uid != 0 {
        return Err(LoadError::DirOwner {
            what,
            uid: st.st_uid,
        });
    }
    if st.st_mode & 0o022 != 0 {
        return Err(LoadError::DirMode {
            what,
            mode: st.st_mode & 0o7777,
        });
    }
    Ok(())
}

/// One spec file, `file` in the directory `dir` (`path` names it); `None` when it is of
/// another kind than `kinds` (or a directory).
fn read_spec(
    dir: &OwnedFd,
    file: &Path,
    path: &Path,
    kinds: &[&str],
) -> Result<Option<Spec>, LoadError> {
    let name = || path.display().to_string();
    let io = |source| LoadError::Io {
        path: name(),
        source,
    };
    // Opened once: a symlink is refused (never followed), a FIFO does not block the open.
    let flags = OFlag::O_RDONLY
        | OFlag::O_NOFOLLOW
        | OFlag::O_NONBLOCK
        | OFlag::O_CLOEXEC
        | OFlag::O_NOCTTY;
    let fd = match openat(dir, file, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(nix::Error::ELOOP) => return Err(LoadError::Symlink { path: name() }),
        Err(e) => return Err(io(io_err(e))),
    };
    let mut f = std::fs::File::from(fd);
    let md = f.metadata().map_err(io)?;
    if md.is_dir() {
        return Ok(None);
    }
    if !md.is_file() {
        return Err(LoadError::NotFile {
            path: name(),
            kind: file_kind(md.file_type()),
        });
    }
    // Root reads it and acts on it as root: only root may have written it.
    if md.uid() != 0 || md.mode() & 0o022 != 0 {
        return Err(LoadError::Untrusted {
            path: name(),
            uid: md.uid(),
            mode: md.mode() & 0o7777,
        });
    }
    if md.len() > MAX_SPEC {
        return Err(LoadError::TooBig { path: name() });
    }
    let mut text = Vec::with_capacity(md.len() as usize);
    std::io::Read::read_to_end(&mut std::io::Read::take(&mut f, MAX_SPEC + 1), &mut text)
        .map_err(io)?;
    if text.len() as u64 > MAX_SPEC {
        return Err(LoadError::TooBig { path: name() });
    }
    let json = path.extension().is_some_and(|x| x == "json");
    let spec = match parse(&text, json) {
        Ok(s) => s,
        Err(source) => {
            // Another vendor's broken spec is not this container's business.
            let kind = loose_kind(&text, json);
            if kind.as_deref().is_some_and(|k| !kinds.contains(&k)) {
                return Ok(None);
            }
            return Err(LoadError::Parse {
                path: name(),
                source,
            });
        }
    };
    if !kinds.contains(&spec.kind.as_str()) {
        return Ok(None);
    }
    check_spec(&spec).map_err(|source| LoadError::Invalid {
        path: name(),
        source,
    })?;
    Ok(Some(spec))
}

fn file_kind(t: std::fs::FileType) -> &'static str {
    if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "of an unknown type"
    }
}

/// A spec's text, strictly (unknown fields refused): JSON, or YAML (which JSON also is).
pub fn parse(text: &[u8], json: bool) -> Result<Spec, SpecParseError> {
    if json {
        serde_json::from_slice(text).map_err(SpecParseError::Json)
    } else {
        serde_yaml_ng::from_slice(text).map_err(SpecParseError::Yaml)
    }
}

/// [`parse`], then the reference loader's checks of the whole spec (version, kind, device
/// names).
pub fn parse_checked(text: &[u8], json: bool) -> Result<Spec, SpecParseError> {
    let s = parse(text, json)?;
    check_spec(&s)?;
    Ok(s)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The `kind` of a spec that did not parse strictly, if its text has one.
fn loose_kind(text: &[u8], json: bool) -> Option<String> {
    let v: serde_json::Value = if json {
        serde_json::from_slice(text).ok()?
    } else {
        serde_yaml_ng::from_slice(text).ok()?
    };
    v.get("kind")?.as_str().map(str::to_owned)
}

/// What the reference loader checks of a spec as a whole.
fn check_spec(s: &Spec) -> Result<(), SpecError> {
    if !VERSIONS.contains(&s.cdi_version.as_str()) {
        let newer = parse_version(&s.cdi_version)
            .zip(parse_version(MAX_VERSION))
            .is_some_and(|(a, b)| a > b);
        return Err(if newer {
            SpecError::NewerVersion(s.cdi_version.clone())
        } else {
            SpecError::BadVersion(s.cdi_version.clone())
        });
    }
    let (vendor, class) = s
        .kind
        .split_once('/')
        .ok_or_else(|| SpecError::BadKind(s.kind.clone()))?;
    if vendor.is_empty() || class.is_empty() || class.contains('/') {
        return Err(SpecError::BadKind(s.kind.clone()));
    }
    let devices = s.devices.as_deref().unwrap_or_default();
    if devices.is_empty() {
        return Err(SpecError::NoDevices);
    }
    let mut names = BTreeSet::new();
    for d in devices {
        let ok = !d.name.is_empty()
            && d.name.len() <= 128
            && d.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
        if !ok {
            return Err(SpecError::BadDeviceName(d.name.clone()));
        }
        if !names.insert(d.name.as_str()) {
            return Err(SpecError::DeviceTwice(d.name.clone()));
        }
    }
    Ok(())
}

fn parse_version(v: &str) -> Option<(u32, u32, u32)> {
    let mut it = v.trim_start_matches('v').split('.');
    let r = (
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
    );
    it.next().is_none().then_some(r)
}
