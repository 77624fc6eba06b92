//! The reservation state file.
//!
//! Every change: open the lock file, `flock(LOCK_EX)`, read the state, modify, write a temp
//! file, fsync, rename over the state file, fsync the directory. Readers that only look
//! (`list`, `check`) read without the lock: the rename makes every version whole.
//!
//! The lock is a separate file (`<state>.lock`) because the state file itself is replaced
//! by each rename. Nothing is followed through a symlink, the directory and files must be
//! owned by root (the caller) and not writable by group or others, and a file that does not
//! parse, or has another version, is an error naming it — never silently reset.

use crate::host::procfs::ProcRef;
use crate::ids::Unit;
use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, Mode};
use nix::unistd::mkdir;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

mod draining;
mod error;
mod health;
mod holder;
mod phase;
mod time;
pub use draining::{Draining, Opener};
pub use error::{Corruption, Unsafety};
pub use health::{GpuHealth, KmsgMark, Quarantine, Resetting, XidCount};
pub use holder::{Alias, By, HolderId, HolderKey, HolderKind, PodOf};
pub use phase::{Blocked, Found, Phase, Started, Transition};
pub use time::{now_rfc3339, parse_rfc3339, rfc3339};

pub const VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state file {path} is corrupt ({why}); gpuhook never resets it: fix it, or remove it when no GPU domain runs")]
    Corrupt { path: String, why: Corruption },
    #[error("state file {path} has version {found}, this gpuhook reads version {VERSION}; refusing to touch it")]
    Version { path: String, found: String },
    #[error("state {path}: {why}; refusing to use it")]
    Unsafe { path: String, why: Unsafety },
    #[error("state {path}: {op}: {errno}")]
    Io {
        path: String,
        op: &'static str,
        errno: Errno,
    },
    #[error("state directory {path} was removed or replaced while a change was written to it: the change is not kept")]
    Replaced { path: String },
}

/// A node granted and created for a container: the one node type.
pub use crate::node::Node;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reservation {
    /// Who holds it, each kind with its own identity; in the file `kind` (absent for a
    /// libvirt LXC domain), `domain` and `uuid` (an OCI container's ID in both), as before.
    #[serde(flatten)]
    pub holder: HolderId,
    /// Its units (whole GPUs, or MIG instances), in index order.
    pub gpus: Vec<Unit>,
    pub phase: Phase,
    /// The request as the domain stated it, for operators.
    pub request: String,
    pub created: String,
    pub updated: String,
    /// libvirtd (the hook's parent) at `prepare`: a prepared reservation whose libvirtd is
    /// gone, and whose domain has no controller, was abandoned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepared_by: Option<ProcRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<i32>,
    /// The container's init once running: when it is gone the reservation is stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<ProcRef>,
    /// Where the runtime put an OCI container's init, read at its `createRuntime` hook
    /// (before anything of the container ran): its device cgroup for hotplug.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<crate::cgroup::Made>,
    /// The user and mount namespaces its init was in then: hotplug refuses an init that left
    /// them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<crate::host::procfs::Namespaces>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<Node>,
    /// The driver files gpuhook mounted into a libvirt container from CDI specs (`reconnect`
    /// checks they are still in place).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<crate::enter::rootfs::Mounted>,
    /// The rest of what gpuhook made in its root from CDI specs (links, directories, files,
    /// the linker cache's folders): what `detach` takes back once no GPU it keeps needs it.
    #[serde(default, skip_serializing_if = "crate::enter::rootfs::Files::is_empty")]
    pub rootfs: crate::enter::rootfs::Files,
    /// Changed in the running container by `gpuhook attach` or `detach`: its units and nodes
    /// are what it holds, whatever its request says (`reconnect` keeps them). Absent in the
    /// file when not (files written before load unchanged).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hotplugged: bool,
    /// The nodes `attach` bind-mounted into a user-namespaced OCI container (its `/dev` is its
    /// user namespace's), by identity: what `detach` takes off again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_mounts: Vec<crate::enter::devdir::Bound>,
    /// Where its driver files came from (`cdi` or `host`), when it got any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<crate::request::Driver>,
    /// The NVIDIA driver version of the files it got (`driver="host"` or `cdi`): after a
    /// driver upgrade, `list` and the metrics show it still uses the old one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
}

impl Reservation {
    /// Prepared (again) by `by`, as of `now`: a `prepare` or `create` that keeps it; no
    /// container, init or node recorded until it runs.
    pub fn set_prepared(&mut self, by: Option<ProcRef>, now: &str) {
        self.phase = Phase::Prepared;
        self.prepared_by = by;
        self.init = None;
        self.controller = None;
        self.nodes.clear();
        self.updated = now.to_string();
    }

    /// A pod's allocation back to its pod, pending (its container removed, or gone): no
    /// container, init, nodes or driver files recorded; its units stay its own.
    pub fn to_pending(&mut self, now: &str) {
        if let HolderId::Pod { pod, .. } = &mut self.holder {
            pod.container = None;
        }
        self.phase = Phase::Prepared;
        self.prepared_by = None;
        self.controller = None;
        self.init = None;
        self.cgroup = None;
        self.namespaces = None;
        self.nodes.clear();
        self.mounts.clear();
        self.rootfs = Default::default();
        self.hotplugged = false;
        self.node_mounts.clear();
        self.driver = None;
        self.driver_version = None;
        self.updated = now.to_string();
    }

    /// Running (`started`, `reconnect`, an OCI `createRuntime`, a first `attach`): what it
    /// records of its container, as of `now`. The one way into [`Phase::Running`].
    pub fn set_running(&mut self, s: Started, now: &str) {
        self.phase = Phase::Running;
        self.controller = s.controller;
        self.init = Some(s.init);
        self.nodes = s.nodes;
        self.cgroup = s.cgroup;
        self.namespaces = s.namespaces;
        self.updated = now.to_string();
    }

    /// As a step finds it, for the transition table ([`Transition::from`]): its phase, and whether
    /// its holder lives (`alive`): a running one's init; a prepared one's reserving process,
    /// unless it is `me` (the step's own).
    pub fn found(&self, alive: impl Fn(&ProcRef) -> bool, me: Option<ProcRef>) -> Found {
        let live = match self.phase {
            Phase::Running => self.init.is_some_and(|i| alive(&i)),
            Phase::Prepared => self.prepared_by.is_some_and(|p| Some(p) != me && alive(&p)),
        };
        Found {
            phase: self.phase,
            live,
        }
    }

    /// A running reservation of `units` for tests: nothing recorded but its holder.
    #[cfg(test)]
    pub(crate) fn for_test(kind: HolderKind, domain: &str, uuid: &str, units: &[&str]) -> Self {
        Reservation {
            holder: HolderId::for_test(kind, domain, uuid),
            gpus: units
                .iter()
                .map(|s| s.parse().expect("a unit name"))
                .collect(),
            phase: Phase::Running,
            request: "1 GPU".into(),
            created: "2026-12-01T00:00:00Z".into(),
            updated: "2026-12-01T00:00:00Z".into(),
            prepared_by: None,
            controller: None,
            init: None,
            cgroup: None,
            namespaces: None,
            nodes: vec![],
            mounts: vec![],
            rootfs: Default::default(),
            hotplugged: false,
            node_mounts: Vec::new(),
            driver: None,
            driver_version: None,
        }
    }

    /// How messages name its holder: `domain 'web1'`, `container 'ID'`, `vm 'vm1'`.
    pub fn who(&self) -> String {
        self.holder.who()
    }

    /// Its holder's kind.
    pub fn kind(&self) -> HolderKind {
        self.holder.kind()
    }

    /// The key the state files it under.
    pub fn key(&self) -> HolderKey {
        self.holder.key()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub version: u32,
    /// Keyed by their holders' keys ([`HolderId::key`]: a libvirt domain's UUID, a
    /// container's ID, `vm:UUID`, …).
    pub reservations: BTreeMap<HolderKey, Reservation>,
    /// GPUs out of service after an Xid error (`gpuhook health scan`), by PCI address.
    pub quarantine: BTreeMap<String, Quarantine>,
    /// Where `gpuhook health scan` stopped reading the kernel log.
    pub kmsg: Option<KmsgMark>,
    /// GPUs and MIG instances freed while a process still had one of their own nodes open,
    /// by unit id (PCI address, `PCI/giG/ciC`): given to no one until none has (files
    /// written before have none).
    pub draining: BTreeMap<Unit, Draining>,
    /// The MPS control daemons gpuhook started, by their GPU's PCI address (files written
    /// before have none).
    pub mps: BTreeMap<crate::ids::Pci, crate::reserve::mps::daemon::Daemon>,
    /// GPUs' health records beyond quarantine, by PCI address (files written before have
    /// none).
    pub health: BTreeMap<String, GpuHealth>,
}

/// The state as its file has it: what [`State::parse`] reads before it checks the keys.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileState {
    version: u32,
    /// Under the keys the file names them by (checked against their holders).
    reservations: BTreeMap<String, Reservation>,
    #[serde(default)]
    quarantine: BTreeMap<String, Quarantine>,
    #[serde(default)]
    kmsg: Option<KmsgMark>,
    #[serde(default)]
    draining: BTreeMap<Unit, Draining>,
    #[serde(default)]
    mps: BTreeMap<crate::ids::Pci, crate::reserve::mps::daemon::Daemon>,
    #[serde(default)]
    health: BTreeMap<String, GpuHealth>,
}

impl Default for State {
    fn default() -> Self {
        State {
            version: VERSION,
            reservations: BTreeMap::new(),
            quarantine: BTreeMap::new(),
            kmsg: None,
            draining: BTreeMap::new(),
            mps: BTreeMap::new(),
            health: BTreeMap::new(),
        }
    }
}

impl State {
    /// Unit → its holder as messages name it (`domain 'web1'`), leaving out the
    /// reservation of `except` (a holder's key). A draining unit is held by the processes
    /// that keep it open.
    pub fn held(&self, except: Option<&HolderKey>) -> crate::reserve::alloc::Held {
        let mut h = crate::reserve::alloc::Held::new();
        for (unit, d) in &self.draining {
            h.insert(*unit, d.holder(unit));
        }
        for (key, r) in &self.reservations {
            if Some(key) == except {
                continue;
            }
            for g in &r.gpus {
                h.insert(*g, r.who());
            }
        }
        h
    }

    /// Files `r` under its holder's key ([`HolderId::key`]); returns the one it replaces.
    pub fn insert(&mut self, r: Reservation) -> Option<Reservation> {
        self.reservations.insert(r.key(), r)
    }

    /// The key of the reservation OCI container `id` holds: its own, or a pod's allocation
    /// it was created with.
    pub fn container_key(&self, id: &str) -> Option<HolderKey> {
        let own = HolderId::Oci { id: id.into() }.key();
        if self.reservations.contains_key(&own) {
            return Some(own);
        }
        self.reservations
            .iter()
            .find(|(_, r)| r.holder.pod().and_then(|p| p.container.as_deref()) == Some(id))
            .map(|(k, _)| k.clone())
    }

    pub fn holder_of(&self, unit: &Unit) -> Option<&Reservation> {
        self.reservations.values().find(|r| r.gpus.contains(unit))
    }

    /// The slots of GPU `pci` held (docs/guides/sharing.md), each with its reservation, in slot
    /// order: what listing, metrics and draining count a GPU's sharers by.
    pub fn slots_of(&self, pci: crate::ids::Pci) -> Vec<(Unit, &Reservation)> {
        let mut v: Vec<(Unit, &Reservation)> = self
            .reservations
            .values()
            .flat_map(|r| r.gpus.iter().map(move |u| (*u, r)))
            .filter(|(u, _)| u.is_slot() && u.pci() == pci)
            .collect();
        v.sort_by_key(|(u, _)| *u);
        v
    }

    /// Parses state text; `path` names the file in errors. Each reservation must be under
    /// its holder's key ([`HolderId::key`]), or, as files written before holders had keys of
    /// their own, under its `uuid` (a container ID shaped like a UUID); it is kept under its
    /// holder's key.
    pub fn parse(text: &[u8], path: &str) -> Result<State, StateError> {
        let corrupt = |why| StateError::Corrupt {
            path: path.into(),
            why,
        };
        let file = match serde_json::from_slice::<FileState>(text) {
            Ok(f) if f.version == VERSION => f,
            Ok(f) => {
                return Err(StateError::Version {
                    path: path.into(),
                    found: f.version.to_string(),
                })
            }
            Err(e) => {
                #[derive(Deserialize)]
                struct V {
                    version: serde_json::Value,
                }
                return Err(match serde_json::from_slice::<V>(text) {
                    Ok(v) if v.version != serde_json::json!(VERSION) => StateError::Version {
                        path: path.into(),
                        found: v.version.to_string(),
                    },
                    _ => corrupt(Corruption::Json(e)),
                });
            }
        };
        let mut reservations = BTreeMap::new();
        for (k, r) in file.reservations {
            let key = r.key();
            if k != key.as_str() && Some(k.as_str()) != r.holder.legacy_key() {
                return Err(corrupt(Corruption::NotItsKey {
                    key: k,
                    holder: r.who(),
                    its: key,
                }));
            }
            if let Some(first) = reservations.insert(key.clone(), r) {
                return Err(corrupt(Corruption::TwiceKeyed {
                    key,
                    holder: first.who(),
                }));
            }
        }
        // One holder per unit (a slot is a unit of its own).
        let mut seen: BTreeMap<&Unit, &Reservation> = BTreeMap::new();
        for r in reservations.values() {
            for u in &r.gpus {
                if let Some(other) = seen.insert(u, r) {
                    return Err(corrupt(Corruption::TwiceReserved {
                        unit: *u,
                        first: other.who(),
                        second: r.who(),
                    }));
                }
            }
        }
        Ok(State {
            version: file.version,
            reservations,
            quarantine: file.quarantine,
            kmsg: file.kmsg,
            draining: file.draining,
            mps: file.mps,
            health: file.health,
        })
    }

    /// Compact JSON with one reservation per line: small and fast to write and parse (it is
    /// rewritten at every change), still readable with `less` and diffable.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(64 + 400 * self.reservations.len());
        v.extend_from_slice(
            format!("{{\"version\":{},\"reservations\":{{", self.version).as_bytes(),
        );
        for (i, (k, r)) in self.reservations.iter().enumerate() {
            v.extend_from_slice(if i == 0 { b"\n" } else { b",\n" });
            serde_json::to_writer(&mut v, k).expect("state serializes");
            v.push(b':');
            serde_json::to_writer(&mut v, r).expect("state serializes");
        }
        v.extend_from_slice(b"\n}");
        if !self.quarantine.is_empty() {
            v.extend_from_slice(b",\n\"quarantine\":");
            serde_json::to_writer(&mut v, &self.quarantine).expect("state serializes");
        }
        if let Some(m) = &self.kmsg {
            v.extend_from_slice(b",\n\"kmsg\":");
            serde_json::to_writer(&mut v, m).expect("state serializes");
        }
        if !self.draining.is_empty() {
            v.extend_from_slice(b",\n\"draining\":");
            serde_json::to_writer(&mut v, &self.draining).expect("state serializes");
        }
        if !self.mps.is_empty() {
            v.extend_from_slice(b",\n\"mps\":");
            serde_json::to_writer(&mut v, &self.mps).expect("state serializes");
        }
        if !self.health.is_empty() {
            v.extend_from_slice(b",\n\"health\":");
            serde_json::to_writer(&mut v, &self.health).expect("state serializes");
        }
        v.extend_from_slice(b"}\n");
        v
    }
}

/// The state file and its lock.
#[derive(Debug, Clone)]
pub struct Store {
    path: PathBuf,
    dir: PathBuf,
    name: String,
}

fn io<'a>(path: &'a Path, op: &'static str) -> impl Fn(Errno) -> StateError + 'a {
    move |errno| StateError::Io {
        path: path.display().to_string(),
        op,
        errno,
    }
}

impl Store {
    /// The state file at `path` (a door's and step's: the config's `state_file`) and its
    /// lock: the one way to read the state ([`Store::read`]) or change it under its lock
    /// ([`Store::update`]).
    pub fn new(path: &Path) -> Store {
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| "/".into());
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Store {
            path: path.to_path_buf(),
            dir,
            name,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock_name(&self) -> String {
        format!("{}.lock", self.name)
    }

    fn tmp_name(&self) -> String {
        format!(".{}.tmp", self.name)
    }

    fn unsafe_(&self, p: &Path, why: Unsafety) -> StateError {
        StateError::Unsafe {
            path: p.display().to_string(),
            why,
        }
    }

    /// Checks that an open file or directory belongs to us and is not writable by others.
    fn check_owner(&self, fd: &OwnedFd, p: &Path, want_dir: bool) -> Result<(), StateError> {
        let st = fstat(fd).map_err(io(p, "fstat"))?;
        let fmt = st.st_mode & libc::S_IFMT;
        if want_dir && fmt != libc::S_IFDIR {
            return Err(self.unsafe_(p, Unsafety::NotDirectory));
        }
        if !want_dir && fmt != libc::S_IFREG {
            return Err(self.unsafe_(p, Unsafety::NotRegularFile));
        }
        let euid = nix::unistd::geteuid().as_raw();
        if st.st_uid != euid {
            return Err(self.unsafe_(
                p,
                Unsafety::Owner {
                    owner: st.st_uid,
                    euid,
                },
            ));
        }
        if st.st_mode & 0o022 != 0 {
            return Err(self.unsafe_(
                p,
                Unsafety::Writable {
                    mode: st.st_mode & 0o7777,
                },
            ));
        }
        Ok(())
    }

    fn open_dir(&self, create: bool) -> Result<Option<OwnedFd>, StateError> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = match nix::fcntl::open(&self.dir, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) if create => {
                match mkdir(&self.dir, Mode::from_bits_truncate(0o700)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(io(&self.dir, "create state directory")(e)),
                }
                nix::fcntl::open(&self.dir, flags, Mode::empty())
                    .map_err(io(&self.dir, "open state directory"))?
            }
            Err(Errno::ENOENT) => return Ok(None),
            Err(Errno::ELOOP) | Err(Errno::ENOTDIR) => {
                return Err(self.unsafe_(&self.dir, Unsafety::SymlinkOrNotDirectory))
            }
            Err(e) => return Err(io(&self.dir, "open state directory")(e)),
        };
        self.check_owner(&fd, &self.dir, true)?;
        Ok(Some(fd))
    }

    fn read_at(&self, dir: &OwnedFd) -> Result<State, StateError> {
        self.read_raw_at(dir).map(|(s, _)| s)
    }

    /// The state and the bytes it was parsed from (`None`: no file).
    fn read_raw_at(&self, dir: &OwnedFd) -> Result<(State, Option<Vec<u8>>), StateError> {
        let fd = match openat(
            dir,
            self.name.as_str(),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok((State::default(), None)),
            Err(Errno::ELOOP) => return Err(self.unsafe_(&self.path, Unsafety::Symlink)),
            Err(e) => return Err(io(&self.path, "open")(e)),
        };
        self.check_owner(&fd, &self.path, false)?;
        let mut buf = Vec::new();
        File::from(fd).read_to_end(&mut buf).map_err(|e| {
            io(&self.path, "read")(Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
        })?;
        let st = State::parse(&buf, &self.path.display().to_string())?;
        Ok((st, Some(buf)))
    }

    /// Whether the state file's bytes may hold a reservation of `holder`: whether they
    /// contain its `uuid` field's value in quotes (a domain's UUID, a container's ID: in the
    /// file whatever its key), a look without the lock, parse or checks, for a hook call that
    /// has nothing to do unless the state names it. Any trouble reading is `false`: the
    /// caller then has nothing of its own to free.
    pub fn mentions(&self, holder: &HolderId) -> bool {
        use std::os::unix::fs::OpenOptionsExt;
        let Ok(mut f) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.path)
        else {
            return false;
        };
        let mut buf = Vec::new();
        if f.read_to_end(&mut buf).is_err() {
            return false;
        }
        let needle = format!("\"{}\"", holder.domain_and_uuid().1);
        buf.windows(needle.len()).any(|w| w == needle.as_bytes())
    }

    /// The current state, without taking the lock. A missing file or directory is an empty
    /// state.
    pub fn read(&self) -> Result<State, StateError> {
        match self.open_dir(false)? {
            Some(dir) => self.read_at(&dir),
            None => Ok(State::default()),
        }
    }

    /// Whether the directory `dir` (opened by path) is still the one at that path: not
    /// removed, nor renamed away with another made in its place.
    fn still_at_path(&self, dir: &OwnedFd) -> Result<bool, StateError> {
        let open = fstat(dir).map_err(io(&self.dir, "fstat state directory"))?;
        Ok(nix::sys::stat::lstat(&self.dir)
            .is_ok_and(|now| (now.st_dev, now.st_ino) == (open.st_dev, open.st_ino)))
    }

    /// The state directory, opened and locked: taken again (a few times) when it was removed
    /// or replaced between its opening and the lock (a lock in a directory no longer at the
    /// path excludes no one who opens it now).
    fn open_locked(&self) -> Result<(OwnedFd, OwnedFd), StateError> {
        let mut tries = 0;
        loop {
            let dir = self.open_dir(true)?.expect("created");
            match self.lock_in(&dir) {
                Ok(lock) if self.still_at_path(&dir)? => return Ok((dir, lock)),
                // Removed before its lock was made in it.
                Err(StateError::Io {
                    errno: Errno::ENOENT,
                    ..
                })
                | Ok(_) => {}
                Err(e) => return Err(e),
            }
            tries += 1;
            if tries == 3 {
                return Err(StateError::Replaced {
                    path: self.dir.display().to_string(),
                });
            }
        }
    }

    /// Runs `f` on the state under the exclusive lock and writes the result back if it
    /// changed. The lock dies with the process, so a crash never leaves it held. A change
    /// whose directory was removed or replaced before it was written in full (a package's
    /// purge, an operator's `rm -rf`) is an error, never a success whose state is gone.
    pub fn update<T, E: From<StateError>>(
        &self,
        f: impl FnOnce(&mut State) -> Result<T, E>,
    ) -> Result<T, E> {
        let (dir, lock) = self.open_locked()?;
        let (mut state, before) = self.read_raw_at(&dir)?;
        let out = f(&mut state)?;
        // Written only when it changed (no file and nothing reserved: nothing to write).
        let bytes = state.to_bytes();
        let changed = match &before {
            None => state != State::default(),
            Some(old) => *old != bytes,
        };
        if changed {
            let written = self.write_at(&dir, &bytes);
            if !self.still_at_path(&dir)? {
                return Err(StateError::Replaced {
                    path: self.dir.display().to_string(),
                }
                .into());
            }
            written?;
        }
        drop(lock);
        Ok(out)
    }

    /// The lock file in `dir`, opened (made if missing) and locked exclusively.
    fn lock_in(&self, dir: &OwnedFd) -> Result<OwnedFd, StateError> {
        let lock_path = self.dir.join(self.lock_name());
        let lock = openat(
            dir,
            self.lock_name().as_str(),
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| match e {
            Errno::ELOOP => self.unsafe_(&lock_path, Unsafety::Symlink),
            e => io(&lock_path, "open lock")(e),
        })?;
        self.check_owner(&lock, &lock_path, false)?;
        loop {
            // flock(2) on a descriptor the update keeps open until it is done.
            match crate::host::sys::flock(lock.as_fd(), libc::LOCK_EX) {
                Ok(_) => break,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(io(&lock_path, "flock")(e)),
            }
        }
        Ok(lock)
    }

    fn write_at(&self, dir: &OwnedFd, bytes: &[u8]) -> Result<(), StateError> {
        use crate::host::atomic::{replace, AtomicWrite, Step};
        let tmp = self.tmp_name();
        let tmp_path = self.dir.join(&tmp);
        let r = AtomicWrite {
            dir: dir.as_fd(),
            tmp: Path::new(&tmp),
            name: Path::new(&self.name),
            mode: 0o600,
            chmod: None,
            owner: None,
            clear_stale: true,
            durable: true,
        };
        replace(&r, bytes).map_err(|(step, e)| match step {
            Step::Create => io(&tmp_path, "create temp file")(e),
            Step::Write => io(&tmp_path, "write")(e),
            Step::Fsync => io(&tmp_path, "fsync")(e),
            Step::Rename => io(&self.path, "rename")(e),
            Step::FsyncDir => io(&self.dir, "fsync directory")(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn res(uuid: &str, gpus: &[&str]) -> Reservation {
        Reservation {
            phase: Phase::Prepared,
            created: now_rfc3339(),
            updated: now_rfc3339(),
            ..Reservation::for_test(
                HolderKind::Libvirt,
                &format!("d-{}", &uuid[..4]),
                uuid,
                gpus,
            )
        }
    }

    const U1: &str = "11111111-1111-1111-1111-111111111111";
    const U2: &str = "22222222-2222-2222-2222-222222222222";

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_063_467), "2026-11-30T18:31:07Z");
        for t in [0, 951_782_400, 1_796_063_467, 4_102_444_799] {
            assert_eq!(parse_rfc3339(&rfc3339(t)), Some(t));
        }
        assert_eq!(parse_rfc3339("2026-11-30 18:31:07"), None);
    }

    #[test]
    fn roundtrip_and_update() {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let store = Store::new(&d.path().join("gpuhook/state.json"));
        assert_eq!(
            store.read().unwrap(),
            State::default(),
            "missing dir reads empty"
        );
        store
            .update(|s| {
                s.insert(res(U1, &["0000:07:00.0"]));
                Ok::<_, StateError>(())
            })
            .unwrap();
        let dir_mode = std::fs::metadata(d.path().join("gpuhook"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        let s = store.read().unwrap();
        assert_eq!(s.reservations[U1].gpus, vec!["0000:07:00.0"]);
        assert_eq!(
            s.held(None)
                .get(&"0000:07:00.0".parse().unwrap())
                .map(String::as_str),
            Some("domain 'd-1111'")
        );
        assert!(s.held(Some(&s.reservations[U1].key())).is_empty());
        let file_mode = std::fs::metadata(store.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(file_mode & 0o777, 0o600);
        // An update that changes nothing does not rewrite the file.
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(store.path()).unwrap());
        store.update(|_| Ok::<_, StateError>(())).unwrap();
        let ino2 = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(store.path()).unwrap());
        assert_eq!(ino, ino2);
        // No temp file left behind.
        let names: Vec<_> = std::fs::read_dir(d.path().join("gpuhook"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    /// A reservation changed by attach or detach says so in the file; one that was not is
    /// written as before (no key).
    #[test]
    fn hotplugged_is_written_only_when_set() {
        let mut st = State::default();
        st.insert(res(U1, &["0000:3b:00.0"]));
        let plain = String::from_utf8(st.to_bytes()).unwrap();
        assert!(!plain.contains("hotplugged"), "{plain}");
        st.reservations.get_mut(U1).unwrap().hotplugged = true;
        let text = st.to_bytes();
        assert!(String::from_utf8_lossy(&text).contains(",\"hotplugged\":true}"));
        assert_eq!(State::parse(&text, "x").unwrap(), st);
        let old = State::parse(plain.as_bytes(), "x").unwrap();
        assert!(!old.reservations[U1].hotplugged);
    }

    /// A state file written before units were typed (their names as strings): whole GPUs,
    /// MIG instances (gi 10 sorts before gi 2, as names do), an OCI holder, draining units;
    /// it loads, and is written back byte for byte.
    #[test]
    fn mps_daemons_roundtrip_on_their_own_line() {
        let mut st = State::default();
        st.mps.insert(
            "0000:04:00.0".parse().unwrap(),
            crate::reserve::mps::daemon::Daemon {
                proc: ProcRef {
                    pid: 500,
                    start_time: 9,
                },
                uuid: "GPU-1".into(),
                dir: "/run/gpuhook/mps/GPU-1".into(),
                starting: false,
                stopping: None,
            },
        );
        let text = String::from_utf8(st.to_bytes()).unwrap();
        assert!(text.contains("\n\"mps\":{\"0000:04:00.0\":{\"proc\":{\"pid\":500,\"start_time\":9},\"uuid\":\"GPU-1\",\"dir\":\"/run/gpuhook/mps/GPU-1\"}}"), "{text}");
        assert_eq!(State::parse(text.as_bytes(), "x").unwrap(), st);
        assert!(!String::from_utf8(State::default().to_bytes())
            .unwrap()
            .contains("mps"));
    }

    #[test]
    fn a_file_written_before_loads_and_is_written_back_unchanged() {
        let old = concat!(
            "{\"version\":1,\"reservations\":{\n",
            "\"11111111-1111-1111-1111-111111111111\":{\"domain\":\"web1\",\"uuid\":\"11111111-1111-1111-1111-111111111111\",\"gpus\":[\"0000:07:00.0\",\"0000:3b:00.0\"],\"phase\":\"running\",\"request\":\"2 GPUs\",\"created\":\"2026-12-01T00:00:00Z\",\"updated\":\"2026-12-01T00:00:01Z\",\"controller\":1200,\"init\":{\"pid\":1201,\"start_time\":99},\"nodes\":[{\"path\":\"/dev/nvidia0\",\"major\":195,\"minor\":0}]},\n",
            "\"ctr-a\":{\"kind\":\"oci\",\"domain\":\"ctr-a\",\"uuid\":\"ctr-a\",\"gpus\":[\"0000:1a:00.0/gi10/ci0\",\"0000:1a:00.0/gi2/ci1\"],\"phase\":\"prepared\",\"request\":\"2 MIG instances\",\"created\":\"2026-12-01T00:00:00Z\",\"updated\":\"2026-12-01T00:00:00Z\",\"prepared_by\":{\"pid\":77,\"start_time\":5}}\n",
            "},\n\"draining\":{",
            "\"0000:1a:00.0/gi1/ci0\":{\"nodes\":[{\"path\":\"/dev/nvidia-caps/nvidia-cap11\",\"major\":236,\"minor\":11}],\"holders\":[{\"proc\":{\"pid\":42,\"start_time\":7},\"comm\":\"sleep\"}],\"after\":\"domain 'web2'\",\"since\":\"2026-12-01T00:00:00Z\"},",
            "\"0000:1a:00.0/gi14/ci0\":{\"nodes\":[],\"holders\":[],\"unread\":[{\"proc\":{\"pid\":43,\"start_time\":8},\"comm\":\"x\"}],\"unread_total\":3,\"after\":\"container 'c'\",\"since\":\"2026-12-01T00:00:00Z\"},",
            "\"0000:1a:00.0/gi3/ci0\":{\"nodes\":[],\"holders\":[],\"after\":\"domain 'web3'\",\"since\":\"2026-12-01T00:00:00Z\"},",
            "\"0000:3c:00.0\":{\"nodes\":[{\"path\":\"/dev/nvidia1\",\"major\":195,\"minor\":1}],\"holders\":[],\"after\":\"domain 'web4'\",\"since\":\"2026-12-01T00:00:00Z\"}",
            "}}\n"
        );
        let st = State::parse(old.as_bytes(), "x").unwrap();
        assert_eq!(String::from_utf8(st.to_bytes()).unwrap(), old);
        let web1 = &st.reservations[U1];
        assert_eq!(web1.gpus, ["0000:07:00.0", "0000:3b:00.0"]);
        assert!(web1.gpus.iter().all(|u| !u.is_mig()));
        let ctr = &st.reservations["ctr-a"];
        assert_eq!(
            ctr.gpus,
            [
                Unit::Mig {
                    pci: "0000:1a:00.0".parse().unwrap(),
                    gi: 10,
                    ci: 0
                },
                Unit::Mig {
                    pci: "0000:1a:00.0".parse().unwrap(),
                    gi: 2,
                    ci: 1
                }
            ]
        );
        let draining: Vec<String> = st.draining.keys().map(Unit::to_string).collect();
        assert_eq!(
            draining,
            [
                "0000:1a:00.0/gi1/ci0",
                "0000:1a:00.0/gi14/ci0",
                "0000:1a:00.0/gi3/ci0",
                "0000:3c:00.0"
            ]
        );
        // Who holds what, as messages name them.
        let held = st.held(None);
        let names: Vec<(String, &str)> = held
            .iter()
            .map(|(u, w)| (u.to_string(), w.as_str()))
            .collect();
        assert_eq!(names[0], ("0000:07:00.0".into(), "domain 'web1'"));
        assert_eq!(
            names[2],
            ("0000:1a:00.0/gi10/ci0".into(), "container 'ctr-a'")
        );
        assert_eq!(
            st.holder_of(&"0000:1a:00.0/gi2/ci1".parse().unwrap())
                .map(|r| r.holder.name()),
            Some("ctr-a")
        );
        // A unit of any other shape is a corrupt file, as a wrong type is.
        for bad in [
            "0000:07:00.0/gi1",
            "x/gi1/ci0",
            "0000:07:00.0/gi01/ci0",
            "GPU0",
        ] {
            let text = old.replace("0000:3b:00.0", bad);
            let e = State::parse(text.as_bytes(), "x").unwrap_err().to_string();
            assert!(e.contains("is corrupt") && e.contains(bad), "{e}");
        }
    }

    /// A file written by the gpuhook before holders had kinds and keys of their own (a
    /// package upgrade while containers run): a libvirt domain (no `kind`), OCI containers
    /// (`domain` and `uuid` both their ID), one of them with an ID shaped like a UUID, under
    /// that ID. It loads with the same meaning; written back, only the UUID-shaped container
    /// moves to a key of its own kind (`oci:ID`), and that loads again as the same.
    #[test]
    fn holders_written_before_keep_their_meaning() {
        const C: &str = "33333333-3333-3333-3333-333333333333";
        let line = |key: &str, body: &str| format!("\"{key}\":{body}");
        let web1 = format!("{{\"domain\":\"web1\",\"uuid\":\"{U1}\",\"gpus\":[\"0000:07:00.0\"],\"phase\":\"running\",\"request\":\"1 GPU\",\"created\":\"x\",\"updated\":\"x\",\"init\":{{\"pid\":1201,\"start_time\":99}}}}");
        let ctr = "{\"kind\":\"oci\",\"domain\":\"ctr-a\",\"uuid\":\"ctr-a\",\"gpus\":[\"0000:08:00.0\"],\"phase\":\"running\",\"request\":\"1 GPU\",\"created\":\"x\",\"updated\":\"x\"}".to_string();
        let uuidish = format!("{{\"kind\":\"oci\",\"domain\":\"{C}\",\"uuid\":\"{C}\",\"gpus\":[\"0000:09:00.0\"],\"phase\":\"prepared\",\"request\":\"1 GPU\",\"created\":\"x\",\"updated\":\"x\"}}");
        let old = format!(
            "{{\"version\":1,\"reservations\":{{\n{},\n{},\n{}\n}}}}\n",
            line(U1, &web1),
            line(C, &uuidish),
            line("ctr-a", &ctr)
        );
        let st = State::parse(old.as_bytes(), "x").unwrap();
        let holders: Vec<(&str, HolderId)> = st
            .reservations
            .iter()
            .map(|(k, r)| (k.as_str(), r.holder.clone()))
            .collect();
        let c_key = format!("oci:{C}");
        assert_eq!(
            holders,
            [
                (U1, HolderId::for_test(HolderKind::Libvirt, "web1", U1)),
                ("ctr-a", HolderId::Oci { id: "ctr-a".into() }),
                (c_key.as_str(), HolderId::Oci { id: C.into() }),
            ]
        );
        let held = st.held(None);
        let who = |u: &str| held[&u.parse::<Unit>().unwrap()].clone();
        assert_eq!(who("0000:07:00.0"), "domain 'web1'");
        assert_eq!(who("0000:08:00.0"), "container 'ctr-a'");
        assert_eq!(who("0000:09:00.0"), format!("container '{C}'"));
        let new = String::from_utf8(st.to_bytes()).unwrap();
        assert_eq!(
            new,
            format!(
                "{{\"version\":1,\"reservations\":{{\n{},\n{},\n{}\n}}}}\n",
                line(U1, &web1),
                line("ctr-a", &ctr),
                line(&c_key, &uuidish)
            )
        );
        assert_eq!(State::parse(new.as_bytes(), "x").unwrap(), st);
    }

    /// Holders of different kinds with the same name, UUID or ID (a VM defined with an LXC
    /// domain's UUID, a container named like it): each under a key of its own kind, none
    /// reached through another's.
    #[test]
    fn kinds_never_share_a_key() {
        let mut st = State::default();
        for (kind, name, id, unit) in [
            (HolderKind::Libvirt, "x", U1, "0000:07:00.0"),
            (HolderKind::Vm, "x", U1, "0000:08:00.0"),
            (HolderKind::Oci, U1, U1, "0000:09:00.0"),
            (HolderKind::Oci, "x", "x", "0000:0a:00.0"),
        ] {
            assert!(st
                .insert(Reservation::for_test(kind, name, id, &[unit]))
                .is_none());
        }
        let text = String::from_utf8(st.to_bytes()).unwrap();
        for key in [
            U1.to_string(),
            format!("vm:{U1}"),
            format!("oci:{U1}"),
            "x".into(),
        ] {
            assert!(text.contains(&format!("\n\"{key}\":{{")), "{key}: {text}");
        }
        assert!(text.contains("\"kind\":\"vm\",\"domain\":\"x\""), "{text}");
        let back = State::parse(text.as_bytes(), "x").unwrap();
        assert_eq!(back, st);
        let who: Vec<String> = back.reservations.values().map(Reservation::who).collect();
        // In the order of their keys' text, as files list them.
        let c = format!("container '{U1}'");
        assert_eq!(who, ["domain 'x'", c.as_str(), "vm 'x'", "container 'x'"]);
    }

    /// What a file may not say of its holders: a key that is not its holder's, one holder
    /// twice (under its old key and its new one), a container named twice, a field no
    /// gpuhook wrote.
    #[test]
    fn holders_a_file_may_not_have() {
        const C: &str = "33333333-3333-3333-3333-333333333333";
        let r = |kind: &str, domain: &str, uuid: &str, extra: &str| {
            format!("{{\"kind\":\"{kind}\",\"domain\":\"{domain}\",\"uuid\":\"{uuid}\",\"gpus\":[],\"phase\":\"running\",\"request\":\"1\",\"created\":\"x\",\"updated\":\"x\"{extra}}}")
        };
        for (reservations, needle) in [
            (
                format!("\"{U1}\":{}", r("vm", "v", U1, "")),
                format!("reservation key {U1} is not its holder's (vm 'v': vm:{U1})"),
            ),
            (
                format!(
                    "\"{C}\":{},\"oci:{C}\":{}",
                    r("oci", C, C, ""),
                    r("oci", C, C, "")
                ),
                format!("two reservations are container '{C}''s (key oci:{C})"),
            ),
            (
                format!("\"c1\":{}", r("oci", "c1", "c2", "")),
                "names its container 'c1' in `domain` but 'c2' in `uuid`".to_string(),
            ),
            (
                format!(
                    "\"c1\":{}",
                    r("oci", "c1", "c1", ",\"pod\":{\"resource\":\"gpuhook.io/gpu\"}")
                ),
                "a reservation of kind 'oci' has a `pod` object".to_string(),
            ),
            // A pod's allocation without what it is of, or not under an allocation's ID.
            (
                format!("\"pod:c1\":{}", r("pod", "c1", "c1", "")),
                "a pod's reservation names its allocation 'c1' in `domain` but 'c1' in `uuid`, or has no `pod`".to_string(),
            ),
            (
                format!(
                    "\"c1\":{}",
                    r("pod", "c1", "c1", ",\"pod\":{\"resource\":\"gpuhook.io/gpu\"}")
                ),
                "names its allocation 'c1'".to_string(),
            ),
            (
                format!("\"c1\":{}", r("vmm", "c1", "c1", "")),
                "unknown variant `vmm`".to_string(),
            ),
        ] {
            let text = format!("{{\"version\":1,\"reservations\":{{{reservations}}}}}");
            let e = State::parse(text.as_bytes(), "/run/gpuhook/state.json")
                .unwrap_err()
                .to_string();
            assert!(e.contains(&needle), "{e}");
            assert!(
                e.starts_with("state file /run/gpuhook/state.json is corrupt"),
                "{e}"
            );
        }
    }

    #[test]
    fn quarantine_and_kmsg_mark_roundtrip() {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let store = Store::new(&d.path().join("state.json"));
        // Only a quarantine, no reservation: still written.
        store
            .update(|st| -> Result<(), StateError> {
                st.quarantine.insert(
                    "0000:1a:00.0".into(),
                    Quarantine {
                        xid: Some(79),
                        reason: "GPU has fallen off the bus".into(),
                        message: "NVRM: Xid (PCI:0000:1a:00): 79, \"quoted\"".into(),
                        since: "2026-12-01T00:00:00Z".into(),
                        action: None,
                        boot_id: None,
                        needs_inspection: false,
                    },
                );
                st.kmsg = Some(KmsgMark {
                    boot_id: "b".into(),
                    seq: 42,
                });
                Ok(())
            })
            .unwrap();
        let st = store.read().unwrap();
        assert_eq!(st.quarantine["0000:1a:00.0"].xid, Some(79));
        assert_eq!(st.kmsg.as_ref().map(|m| m.seq), Some(42));
        assert_eq!(State::parse(&st.to_bytes(), "x").unwrap(), st);
        // Without them the file keeps its old shape.
        assert_eq!(
            State::default().to_bytes(),
            b"{\"version\":1,\"reservations\":{\n}}\n"
        );
    }

    /// A quarantine written before NVIDIA's Xid catalog (no action, no boot id): it loads
    /// with no action (it ends only with `health clear`) and is written back byte for byte;
    /// the health fields, when there are some, are written on their own line and read back.
    #[test]
    fn quarantines_written_before_keep_their_bytes() {
        let old = concat!(
            "{\"version\":1,\"reservations\":{\n},\n",
            "\"quarantine\":{\"0000:1a:00.0\":{\"xid\":79,\"reason\":\"GPU has fallen off the bus\",\"message\":\"NVRM: Xid (PCI:0000:1a:00): 79, x\",\"since\":\"2026-11-30T18:31:07Z\"}},\n",
            "\"kmsg\":{\"boot_id\":\"b\",\"seq\":1532}}\n"
        );
        let mut st = State::parse(old.as_bytes(), "x").unwrap();
        let q = &st.quarantine["0000:1a:00.0"];
        assert_eq!(
            (q.xid, q.action, q.needs_inspection),
            (Some(79), None, false)
        );
        assert!(st.health.is_empty());
        assert_eq!(String::from_utf8(st.to_bytes()).unwrap(), old);
        let h = st.health.entry("0000:1a:00.0".into()).or_default();
        h.scrub_pending = true;
        h.resets_failed = 2;
        h.xids.push(XidCount {
            xid: 79,
            action: crate::reserve::health::catalog::Action::Reboot,
            count: 1,
        });
        let text = String::from_utf8(st.to_bytes()).unwrap();
        assert!(text.ends_with("\n\"health\":{\"0000:1a:00.0\":{\"scrub_pending\":true,\"xids\":[{\"xid\":79,\"action\":\"reboot\",\"count\":1}],\"resets_failed\":2}}}\n"), "{text}");
        assert_eq!(State::parse(text.as_bytes(), "x").unwrap(), st);
    }

    #[test]
    fn corrupt_and_version_are_errors_and_untouched() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state.json");
        let store = Store::new(&p);
        for (text, needle) in [
            (&b"{not json"[..], "is corrupt"),
            (b"", "is corrupt"),
            (b"{\"version\": 2, \"reservations\": {}}", "has version 2"),
            (
                b"{\"version\": \"x\", \"reservations\": []}",
                "has version \"x\"",
            ),
            (
                b"{\"version\": 1, \"reservations\": {}, \"extra\": 1}",
                "unknown field",
            ),
            (
                b"{\"version\": 1, \"reservations\": {\"a\": 5}}",
                "is corrupt",
            ),
            (
                br#"{"version": 1, "reservations": {
                    "a": {"domain": "a", "uuid": "a", "gpus": ["0000:04:00.0/slot1"], "phase": "running", "request": "1", "created": "x", "updated": "x"},
                    "b": {"domain": "b", "uuid": "b", "gpus": ["0000:04:00.0/slot1"], "phase": "running", "request": "1", "created": "x", "updated": "x"}}}"#,
                "0000:04:00.0/slot1 is in two reservations, domain 'a' and domain 'b'",
            ),
        ] {
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
            let e = store.read().unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
            assert!(e.contains(&p.display().to_string()));
            let e = store
                .update(|s| {
                    s.reservations.clear();
                    Ok::<_, StateError>(())
                })
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{e}");
            assert_eq!(std::fs::read(&p).unwrap(), text, "file must be left alone");
        }
        let mut good = State::default();
        good.insert(res(U1, &[]));
        std::fs::write(
            &p,
            String::from_utf8(good.to_bytes())
                .unwrap()
                .replacen(U1, U2, 1),
        )
        .unwrap();
        let e = store.read().unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "reservation key {U2} is not its holder's (domain 'd-1111': {U1})"
            )),
            "{e}"
        );
    }

    #[test]
    fn unsafe_paths_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state.json");
        let store = Store::new(&p);
        std::os::unix::fs::symlink("/etc/passwd", &p).unwrap();
        assert!(store
            .read()
            .unwrap_err()
            .to_string()
            .contains("is a symlink"));
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, State::default().to_bytes()).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(store
            .read()
            .unwrap_err()
            .to_string()
            .contains("lets group or others write"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(store
            .read()
            .unwrap_err()
            .to_string()
            .contains("lets group or others write"));
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        nix::unistd::chown(&p, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        assert!(store
            .read()
            .unwrap_err()
            .to_string()
            .contains("owned by uid 65534"));
        std::fs::remove_file(&p).unwrap();
        let lock = d.path().join("state.json.lock");
        std::os::unix::fs::symlink("/etc/shadow", &lock).unwrap();
        let e = store
            .update(|_| Ok::<_, StateError>(()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("state.json.lock") && e.contains("symlink"),
            "{e}"
        );
        let dlink = d.path().join("link");
        std::os::unix::fs::symlink(d.path(), &dlink).unwrap();
        let e = Store::new(&dlink.join("state.json"))
            .read()
            .unwrap_err()
            .to_string();
        assert!(e.contains("symlink or not a directory"), "{e}");
    }

    /// A change whose directory is removed, or renamed away with another made in its place
    /// (a package's purge and install, an operator), while it is made is an error: never a
    /// success whose state is not at the path the next step reads.
    #[test]
    fn a_state_directory_removed_or_replaced_during_a_change_is_an_error() {
        let t = tempfile::tempdir().unwrap();
        let run = t.path().join("run");
        let store = Store::new(&run.join("state.json"));
        store
            .update(|st| -> Result<(), StateError> {
                st.insert(res(U1, &["0000:01:00.0"]));
                Ok(())
            })
            .unwrap();
        type Swap = fn(&Path);
        let swaps: [(&str, Swap); 2] = [
            ("replaced", |d| {
                std::fs::rename(d, d.with_extension("old")).unwrap();
                std::fs::create_dir(d).unwrap();
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
            }),
            ("removed", |d| std::fs::remove_dir_all(d).unwrap()),
        ];
        for (how, swap) in swaps {
            let e = store
                .update(|st| -> Result<(), StateError> {
                    st.insert(res(U2, &["0000:02:00.0"]));
                    swap(&run);
                    Ok(())
                })
                .unwrap_err();
            assert!(matches!(e, StateError::Replaced { .. }), "{how}: {e}");
            assert_eq!(
                e.to_string(),
                format!(
                    "state directory {} was removed or replaced while a change was written to it: the change is not kept",
                    run.display()
                )
            );
            // What the path holds now is what the next step reads: the change is not there.
            assert!(
                !store.read().unwrap().reservations.contains_key(U2),
                "{how}"
            );
            let _ = std::fs::remove_dir_all(run.with_extension("old"));
        }
        // The directory made anew is used as any.
        store
            .update(|st| -> Result<(), StateError> {
                st.insert(res(U2, &["0000:02:00.0"]));
                Ok(())
            })
            .unwrap();
        assert!(store.read().unwrap().reservations.contains_key(U2));
    }

    #[test]
    fn lock_excludes_concurrent_updates() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::new(&d.path().join("state.json"));
        let n = 8;
        std::thread::scope(|sc| {
            for i in 0..n {
                let store = store.clone();
                sc.spawn(move || {
                    for j in 0..20 {
                        store
                            .update(|s| {
                                let u = format!("{i:08}-0000-0000-0000-{j:012}");
                                s.insert(res(&u, &[]));
                                Ok::<_, StateError>(())
                            })
                            .unwrap();
                    }
                });
            }
        });
        assert_eq!(
            store.read().unwrap().reservations.len(),
            n * 20,
            "no update lost"
        );
    }
}
