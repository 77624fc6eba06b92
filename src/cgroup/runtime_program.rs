//! cgroup v2 for an OCI container: the runtime's device program replaced by one that allows
//! exactly what it allowed plus (attach) or minus (detach) exact GPU nodes (docs/guides/hotplug.md).
//!
//! runc (`libcontainer/cgroups/devices/devicefilter.go`) and crun (`src/libcrun/ebpf.c`)
//! compile the container's device rules (`linux.resources.devices` of its `config.json`,
//! with their defaults and `linux.devices` entries) into one `BPF_PROG_TYPE_CGROUP_DEVICE`
//! program of plain code: no maps, no helper calls. gpuhook does not compile the rules again
//! (a runtime's defaults and order change between versions): it reads the program the runtime
//! attached, as the verifier kept it (`xlated_prog_insns`), and puts a prologue of its own in
//! front: an exact deny or allow per GPU node, then the runtime's code unchanged (its jumps
//! are relative, so they still land where they did). The prologue describes itself, so a later
//! attach or detach recovers the runtime's code and gpuhook's entries from the program alone.
//!
//! The new program is attached (`BPF_F_ALLOW_MULTI`, as runc and crun attach theirs) before
//! the old one is detached: while both are attached an access needs both to allow it, so at
//! no moment is more allowed than either program allows. A program attached without
//! `BPF_F_ALLOW_MULTI` is refused (an attach would replace whatever is there then, also a
//! program a third party put there after gpuhook read the old one). Changes to one cgroup's
//! program are serialized by a `flock` of a file of root's named by the cgroup's inode.
//!
//! What the program allows is read by running it, here, on the access in question: a small
//! interpreter of the instructions such programs use ([`eval`](super::interp::eval)); a program with anything else
//! (a map, a call, a store) is refused as one gpuhook cannot read.

use super::bpf::{self, Insn};
use super::device::{open_dir, prog_fd, programs_allow, DeviceCgroup};
use super::error::{CgroupError, Fault};
use super::interp::asm::*;
use super::interp::{eval, DevCtx, ACC_READ, ACC_WRITE, DEV_CHAR};
use crate::node::Node;
use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;
use std::collections::BTreeSet;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The prologue's first instruction's immediate: "GPUH".
pub const MAGIC: i32 = 0x4750_5548;

// ---- gpuhook's prologue ----

/// gpuhook's entries in front of the runtime's code: exact char devices denied (checked
/// first) and allowed (`rw`, never `mknod`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prologue {
    pub allow: BTreeSet<(u32, u32)>,
    pub deny: BTreeSet<(u32, u32)>,
}

/// Instructions of the prologue's fixed head.
const HEAD: usize = 9;
const DENY_LEN: usize = 4;
const ALLOW_LEN: usize = 7;

impl Prologue {
    fn len(&self) -> usize {
        HEAD + DENY_LEN * self.deny.len() + ALLOW_LEN * self.allow.len()
    }

    /// The whole program: this prologue, then `runtime`'s code. r1 (the context) is left
    /// as it came; r0 and r2–r5 are set before the runtime's code, which sets every register
    /// it reads (the verifier made sure of it when the runtime loaded it).
    pub fn compile(&self, runtime: &[Insn]) -> Vec<Insn> {
        let len = self.len();
        let entries = (len - HEAD) as i16;
        let mut p = Vec::with_capacity(len + runtime.len());
        p.extend([
            mov64_imm(0, MAGIC),
            mov64_imm(0, len as i32),
            ldx_w(2, 1, 0),
            mov32_reg(3, 2),
            and32_imm(3, 0xffff),
            rsh32_imm(2, 16),
            ldx_w(4, 1, 4),
            ldx_w(5, 1, 8),
            jne32_imm(3, DEV_CHAR, entries),
        ]);
        for &(ma, mi) in &self.deny {
            p.extend([
                jne32_imm(4, ma as i32, 3),
                jne32_imm(5, mi as i32, 2),
                mov64_imm(0, 0),
                exit(),
            ]);
        }
        for &(ma, mi) in &self.allow {
            p.extend([
                jne32_imm(4, ma as i32, 6),
                jne32_imm(5, mi as i32, 5),
                mov32_reg(0, 2),
                and32_imm(0, !((ACC_READ | ACC_WRITE) as i32)),
                jne32_imm(0, 0, 2),
                mov64_imm(0, 1),
                exit(),
            ]);
        }
        p.extend_from_slice(runtime);
        p
    }

    /// A program's prologue and the runtime's code after it; a program without gpuhook's
    /// prologue is the runtime's alone. `None`: it starts as gpuhook's do but is not one
    /// gpuhook would write.
    pub fn split(prog: &[Insn]) -> Option<(Prologue, &[Insn])> {
        if prog.first() != Some(&mov64_imm(0, MAGIC)) {
            return Some((Prologue::default(), prog));
        }
        let len = usize::try_from(prog.get(1)?.imm).ok()?;
        let head = prog.get(..len)?;
        let mut p = Prologue::default();
        let mut at = HEAD;
        while at < len {
            let e = &head.get(at..at + DENY_LEN.min(len - at))?;
            let (ma, mi) = (e.first()?.imm as u32, e.get(1)?.imm as u32);
            if e.get(2) == Some(&mov64_imm(0, 0)) {
                p.deny.insert((ma, mi));
                at += DENY_LEN;
            } else {
                p.allow.insert((ma, mi));
                at += ALLOW_LEN;
            }
        }
        let runtime = &prog[len..];
        // Exactly what gpuhook writes, or not gpuhook's.
        (p.compile(runtime) == prog).then_some((p, runtime))
    }
}

// ---- the backend ----

/// Where gpuhook's locks of cgroups whose program it replaces (and of systemd scopes whose
/// policy it changes) are, in the state file's directory: root's alone (a lock on the cgroup
/// directory itself could be taken by anyone who can open it, the container included,
/// through its cgroup namespace), and the pool's own (never a fixed path another pool, or a
/// package's removal, shares).
pub const LOCK_DIR: &str = "cgroup-locks";

/// What stands for the runtime's code in a cgroup where no runtime attached a program: every
/// device passes.
fn allow_all() -> Vec<Insn> {
    vec![mov64_imm(0, 1), exit()]
}

/// The name systemd gives its device programs (`bpf-devices.c`), which it keeps on a unit's
/// cgroup for the unit's `DevicePolicy=`/`DeviceAllow=`.
pub const SYSTEMD_PROGRAM: &str = "sd_devices";

/// The device programs in `ids` (attached to `dir`) that are not systemd's, with their
/// descriptors.
fn not_systemds(dir: &Path, ids: &[u32]) -> Result<Vec<(u32, OwnedFd)>, CgroupError> {
    let mut out = Vec::new();
    for &id in ids {
        let prog = prog_fd(dir, id)?;
        let name = bpf::prog_name(prog.as_fd()).map_err(|x| {
            let errno = x.into();
            CgroupError::new(dir, Fault::ProgInfo { id, errno })
        })?;
        if name != SYSTEMD_PROGRAM {
            out.push((id, prog));
        }
    }
    Ok(out)
}

/// How many device programs not systemd's (a runtime's, or gpuhook's replacement of one)
/// are attached to the cgroup `dir`.
pub fn runtime_programs(dir: &Path) -> Result<usize, CgroupError> {
    let cg = open_dir(dir)?;
    let all = bpf::prog_query(cg.as_fd(), bpf::BPF_CGROUP_DEVICE, 0)
        .map_err(|x| CgroupError::new(dir, Fault::ProgQuery(x.into())))?;
    Ok(not_systemds(dir, &all)?.len())
}

/// How long a replacement waits for another gpuhook's on the same cgroup.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The most entries gpuhook puts in front of a runtime's program (the verifier's limits
/// refuse a program of about a thousand; a container holds a few GPUs).
pub const MAX_ENTRIES: usize = 256;

/// What a node was in gpuhook's entries before this run allowed it.
#[derive(Debug, Clone, Copy)]
struct Before {
    denied: bool,
    allowed: bool,
}

/// An OCI container's cgroup on the unified hierarchy with the runtime's device program,
/// which gpuhook widens or narrows by replacing it.
pub struct RuntimeProgram {
    dir: PathBuf,
    cg: OwnedFd,
    /// gpuhook's lock of this cgroup, held for as long as this value lives.
    _lock: Flock<std::fs::File>,
    /// The programs attached now: one, or two where a gpuhook was killed between attaching
    /// its replacement and detaching the program it replaced (both rule, see [`RuntimeProgram::open`]).
    current: Vec<OwnedFd>,
    prologue: Prologue,
    runtime: Vec<Insn>,
    /// Devices this run turned from denied to allowed, with what gpuhook's entries said of
    /// them before (what `revoke` puts back).
    added: std::collections::BTreeMap<(u32, u32), Before>,
}

/// A directory of root's that no one else may write, made if missing.
fn root_dir(parent: &OwnedFd, name: &str) -> Result<OwnedFd, nix::errno::Errno> {
    use nix::errno::Errno;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = match nix::fcntl::openat(parent, name, flags, Mode::empty()) {
        Err(Errno::ENOENT) => {
            match nix::sys::stat::mkdirat(parent, name, Mode::from_bits_truncate(0o700)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(x) => return Err(x),
            }
            nix::fcntl::openat(parent, name, flags, Mode::empty())?
        }
        r => r?,
    };
    let st = nix::sys::stat::fstat(&fd)?;
    if st.st_uid != 0 || st.st_mode & 0o022 != 0 {
        return Err(Errno::EPERM);
    }
    Ok(fd)
}

/// gpuhook's lock of the cgroup whose directory is `cg`: a file named by the cgroup's
/// device and inode in [`LOCK_DIR`] of `state_dir`, taken within [`LOCK_WAIT`].
fn lock(cg: &OwnedFd, state_dir: &Path) -> Result<Flock<std::fs::File>, Fault> {
    let st = nix::sys::stat::fstat(cg).map_err(|x| Fault::Lock {
        dir: state_dir.join(LOCK_DIR),
        errno: x.into(),
    })?;
    lock_named(state_dir, &format!("{:x}-{:x}", st.st_dev, st.st_ino))
}

/// The state directory, opened without following a link, made (0700) when missing, root's
/// and closed to others.
fn state_dir_fd(dir: &Path) -> Result<OwnedFd, nix::errno::Errno> {
    use nix::errno::Errno;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = match nix::fcntl::open(dir, flags, Mode::empty()) {
        Err(Errno::ENOENT) => {
            match nix::unistd::mkdir(dir, Mode::from_bits_truncate(0o700)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(x) => return Err(x),
            }
            nix::fcntl::open(dir, flags, Mode::empty())?
        }
        r => r?,
    };
    let st = nix::sys::stat::fstat(&fd)?;
    if st.st_uid != 0 || st.st_mode & 0o022 != 0 {
        return Err(Errno::EPERM);
    }
    Ok(fd)
}

/// gpuhook's lock named `name` (a file name) in [`LOCK_DIR`] of `state_dir`, taken within
/// [`LOCK_WAIT`].
pub(super) fn lock_named(state_dir: &Path, name: &str) -> Result<Flock<std::fs::File>, Fault> {
    use nix::errno::Errno;
    let locks = state_dir.join(LOCK_DIR);
    let fault = |x: Errno| Fault::Lock {
        dir: locks.clone(),
        errno: x.into(),
    };
    let dir = state_dir_fd(state_dir)
        .and_then(|d| root_dir(&d, LOCK_DIR))
        .map_err(fault)?;
    let fd = nix::fcntl::openat(
        &dir,
        name,
        OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(fault)?;
    let mut file = std::fs::File::from(fd);
    let until = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(l),
            Err((f, Errno::EWOULDBLOCK)) if std::time::Instant::now() < until => {
                file = f;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err((_, x)) => return Err(fault(x)),
        }
    }
}

impl RuntimeProgram {
    /// The device program attached to cgroup `dir` (exactly one, attached as runc and crun
    /// attach theirs, of plain code that [`eval`] can read), locked against another
    /// gpuhook's replacement. systemd's own programs there ([`SYSTEMD_PROGRAM`]: a scope's
    /// `DeviceAllow=`, which runc's cgroup shares under systemd's cgroup manager, put back
    /// beside the runtime's at each `systemctl daemon-reload`) are systemd's: left in place,
    /// never replaced. They rule too (an access needs every program to allow it), which
    /// [`DeviceCgroup::effective`] reads.
    pub fn open(dir: &Path, state_dir: &Path) -> Result<RuntimeProgram, CgroupError> {
        let e = |f: Fault| CgroupError::new(dir, f);
        let cg = open_dir(dir)?;
        let lock = lock(&cg, state_dir).map_err(e)?;
        let (all, flags) = bpf::prog_query_flags(cg.as_fd(), bpf::BPF_CGROUP_DEVICE, 0)
            .map_err(|x| e(Fault::ProgQuery(x.into())))?;
        // Without BPF_F_ALLOW_MULTI an attach replaces whatever program is there at that
        // moment, also one a third party put there after gpuhook read the old one: no
        // replacement can be bounded by both. runc and crun attach with it.
        if !all.is_empty() && flags & bpf::BPF_F_ALLOW_MULTI == 0 {
            return Err(e(Fault::NotMulti { flags }));
        }
        let ids = not_systemds(dir, &all)?;
        if ids.len() > 2 {
            return Err(e(Fault::NotOneProgram {
                programs: ids.len(),
            }));
        }
        // None: every device passes here (crun attaches none for a container with a user
        // namespace; a cgroup an init moved itself to has none of its own, its runtime's
        // program ruling from above). Read as a program that allows everything: an attach
        // then adds nothing here (what rules from above is what the attach checks before it
        // says `attached`), a detach a program of gpuhook's that denies the node.
        if ids.is_empty() {
            return Ok(RuntimeProgram {
                dir: dir.to_path_buf(),
                cg,
                _lock: lock,
                current: Vec::new(),
                runtime: allow_all(),
                prologue: Prologue::default(),
                added: Default::default(),
            });
        }
        let programs = ids.len();
        let several = || e(Fault::NotOneProgram { programs });
        let mut current = Vec::new();
        let mut read: Vec<(Prologue, Vec<Insn>)> = Vec::new();
        for (id, prog) in ids {
            let (insns, maps) = bpf::prog_xlated(prog.as_fd()).map_err(|x| {
                let errno = x.into();
                e(Fault::ProgInfo { id, errno })
            })?;
            let unreadable = || e(Fault::UnreadableProgram { id, maps });
            if maps != 0 {
                return Err(unreadable());
            }
            let (prologue, runtime) = Prologue::split(&insns).ok_or_else(unreadable)?;
            // A program gpuhook cannot run here is one it cannot say it keeps.
            eval(&insns, DevCtx::rw_char(1, 3)).ok_or_else(unreadable)?;
            read.push((prologue, runtime.to_vec()));
            current.push(prog);
        }
        // Two: a gpuhook killed between its attach and its detach left its replacement beside
        // the program it replaced. Both rule (an access needs both), which is one program with
        // the same runtime code, the denials of either and the grants of both. Two that do
        // not share the runtime's code are not gpuhook's doing.
        let (mut prologue, runtime) = read.swap_remove(0);
        if let Some((other, code)) = read.pop() {
            if code != runtime || prologue == Prologue::default() && other == Prologue::default() {
                return Err(several());
            }
            prologue.deny.extend(other.deny.iter().copied());
            prologue.allow.retain(|k| other.allow.contains(k));
            let deny = prologue.deny.clone();
            prologue.allow.retain(|k| !deny.contains(k));
        }
        Ok(RuntimeProgram {
            dir: dir.to_path_buf(),
            cg,
            _lock: lock,
            current,
            runtime,
            prologue,
            added: Default::default(),
        })
    }

    fn program(&self) -> Vec<Insn> {
        self.prologue.compile(&self.runtime)
    }

    /// Loads the program of `next` and puts it in the current one's place: attached first
    /// (`BPF_F_ALLOW_MULTI`), the old one detached after.
    fn replace(&mut self, next: Prologue) -> Result<(), CgroupError> {
        let e = |f: Fault| CgroupError::new(&self.dir, f);
        let entries = next.allow.len() + next.deny.len();
        if entries > MAX_ENTRIES {
            let max = MAX_ENTRIES;
            return Err(e(Fault::TooManyEntries { entries, max }));
        }
        let insns = next.compile(&self.runtime);
        let prog = bpf::prog_load(bpf::BPF_PROG_TYPE_CGROUP_DEVICE, &insns, "GPL")
            .map_err(|x| e(Fault::ProgLoad(x.into())))?;
        let cg = self.cg.as_fd();
        bpf::prog_attach(
            cg,
            prog.as_fd(),
            bpf::BPF_CGROUP_DEVICE,
            bpf::BPF_F_ALLOW_MULTI,
        )
        .map_err(|x| e(Fault::ProgAttach(x.into())))?;
        let old = std::mem::take(&mut self.current);
        for (k, p) in old.iter().enumerate() {
            if let Err(x) = bpf::prog_detach(cg, p.as_fd(), bpf::BPF_CGROUP_DEVICE) {
                // What is attached allows no more than the old ones together: the new one
                // is taken away again where none of the old ones is gone yet.
                let undo = if k == 0 {
                    bpf::prog_detach(cg, prog.as_fd(), bpf::BPF_CGROUP_DEVICE).err()
                } else {
                    None
                };
                self.current = old.into_iter().skip(k).collect();
                if undo.is_some() || k > 0 {
                    self.current.push(prog);
                }
                let fault = Fault::ProgDetach(x.into());
                let left = undo
                    .map(|u| e(Fault::ProgDetach(u.into())).to_string())
                    .into_iter()
                    .collect();
                return Err(e(fault).with_left(left));
            }
        }
        self.current = vec![prog];
        self.prologue = next;
        Ok(())
    }

    /// Puts `next` in place where it changes anything (and where two programs left by a
    /// killed gpuhook become one).
    fn settle(&mut self, next: Prologue) -> Result<(), CgroupError> {
        if next != self.prologue || self.current.len() > 1 {
            self.replace(next)?;
        }
        Ok(())
    }

    fn runtime_allows(&self, n: &Node) -> Option<bool> {
        eval(&self.runtime, DevCtx::rw_char(n.major, n.minor))
    }
}

impl DeviceCgroup for RuntimeProgram {
    fn path(&self) -> &Path {
        &self.dir
    }

    fn is_allowed(&self, n: &Node) -> Result<bool, CgroupError> {
        eval(&self.program(), DevCtx::rw_char(n.major, n.minor)).ok_or_else(|| {
            let (major, minor) = (n.major, n.minor);
            CgroupError::new(&self.dir, Fault::UnreadableVerdict { major, minor })
        })
    }

    fn grants_exactly(&self, n: &Node) -> Result<bool, CgroupError> {
        Ok(self.prologue.allow.contains(&(n.major, n.minor)))
    }

    /// Not where no runtime attached a program (what gpuhook put there since is its own).
    fn confines(&self) -> bool {
        self.runtime != allow_all()
    }

    /// Every program in force for the cgroup: the one gpuhook keeps, systemd's beside it, and
    /// those of the cgroups above (a scope's, above crun's `container` cgroup).
    fn effective(&self, n: &Node) -> Result<bool, CgroupError> {
        programs_allow(&self.dir, self.cg.as_fd(), n)
    }

    fn allow(&mut self, n: &Node) -> Result<(), CgroupError> {
        let k = (n.major, n.minor);
        let was = self.is_allowed(n)?;
        let before = Before {
            denied: self.prologue.deny.contains(&k),
            allowed: self.prologue.allow.contains(&k),
        };
        let mut next = self.prologue.clone();
        next.deny.remove(&k);
        // An entry only where the runtime's rules do not allow it already.
        if self.runtime_allows(n) != Some(true) {
            next.allow.insert(k);
        }
        self.settle(next)?;
        if !was {
            self.added.entry(k).or_insert(before);
        }
        Ok(())
    }

    fn revoke(&mut self, n: &Node) -> Result<(), CgroupError> {
        let k = (n.major, n.minor);
        let Some(before) = self.added.remove(&k) else {
            return Ok(());
        };
        // What gpuhook's entries said before this run allowed it: a deny put back too (a
        // node the runtime's rules allow, which an earlier detach had denied).
        let mut next = self.prologue.clone();
        if before.allowed {
            next.allow.insert(k);
        } else {
            next.allow.remove(&k);
        }
        if before.denied {
            next.deny.insert(k);
        }
        self.settle(next)
    }

    fn deny(&mut self, n: &Node) -> Result<(), CgroupError> {
        let k = (n.major, n.minor);
        self.added.remove(&k);
        let mut next = self.prologue.clone();
        next.allow.remove(&k);
        // The runtime's rules allow it (a GPU given at create, in `config.json`), or may:
        // denied.
        if self.runtime_allows(n) != Some(false) {
            next.deny.insert(k);
        }
        self.settle(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::interp::{runc_like, DeviceRule};

    const RWM: u32 = 7;
    const RW: u32 = 6;

    fn rule(
        allow: bool,
        kind: u8,
        major: Option<u32>,
        minor: Option<u32>,
        access: u32,
    ) -> DeviceRule {
        DeviceRule {
            allow,
            kind,
            major,
            minor,
            access,
        }
    }

    /// What podman asks runc for, with one GPU (195:0) of gpuhook's at create.
    fn podman_rules() -> Vec<DeviceRule> {
        vec![
            rule(false, b'a', None, None, RWM),
            rule(true, b'c', None, None, 1),
            rule(true, b'b', None, None, 1),
            rule(true, b'c', Some(1), Some(3), RWM),
            rule(true, b'c', Some(1), Some(5), RWM),
            rule(true, b'c', Some(136), None, RWM),
            rule(true, b'c', Some(195), Some(0), RW),
        ]
    }

    fn allows(p: &[Insn], ma: u32, mi: u32) -> Option<bool> {
        eval(p, DevCtx::rw_char(ma, mi))
    }

    #[test]
    fn a_runtime_program_is_read_as_its_rules() {
        let p = runc_like(&podman_rules());
        assert_eq!(allows(&p, 1, 3), Some(true));
        assert_eq!(allows(&p, 136, 7), Some(true));
        assert_eq!(allows(&p, 195, 0), Some(true));
        assert_eq!(allows(&p, 195, 1), Some(false));
        assert_eq!(allows(&p, 195, 255), Some(false));
        // mknod of any char device, but not reading one not listed.
        let mknod = DevCtx {
            access_type: (1 << 16) | 2,
            major: 195,
            minor: 1,
        };
        assert_eq!(eval(&p, mknod), Some(true));
        let block = DevCtx {
            access_type: (6 << 16) | 1,
            major: 1,
            minor: 3,
        };
        assert_eq!(eval(&p, block), Some(false));
        // Later rules win: a deny after an allow.
        let mut rules = podman_rules();
        rules.push(rule(false, b'c', Some(1), Some(3), RWM));
        assert_eq!(allows(&runc_like(&rules), 1, 3), Some(false));
    }

    #[test]
    fn the_prologue_adds_and_takes_exactly_and_reads_back() {
        let rt = runc_like(&podman_rules());
        let mut pro = Prologue::default();
        pro.allow.insert((195, 1));
        pro.allow.insert((195, 255));
        pro.deny.insert((195, 0));
        let p = pro.compile(&rt);
        assert_eq!(allows(&p, 195, 1), Some(true));
        assert_eq!(allows(&p, 195, 255), Some(true));
        assert_eq!(allows(&p, 195, 0), Some(false));
        assert_eq!(allows(&p, 195, 2), Some(false));
        assert_eq!(allows(&p, 1, 3), Some(true));
        // rw only: no mknod, and no block device, by gpuhook's entries.
        let mknod = DevCtx {
            access_type: (7 << 16) | 2,
            major: 195,
            minor: 1,
        };
        assert_eq!(eval(&p, mknod), Some(false));
        let block = DevCtx {
            access_type: (6 << 16) | 1,
            major: 195,
            minor: 1,
        };
        assert_eq!(eval(&p, block), Some(false));
        let (back, runtime) = Prologue::split(&p).unwrap();
        assert_eq!(back, pro);
        assert_eq!(runtime, &rt[..]);
        // The runtime's program alone is its own.
        assert_eq!(Prologue::split(&rt), Some((Prologue::default(), &rt[..])));
        // A program that starts as gpuhook's but is not one: not read.
        let mut bad = p.clone();
        bad[3] = mov64_imm(3, 1);
        assert_eq!(Prologue::split(&bad), None);
        let mut short = p.clone();
        short[1] = mov64_imm(0, 10_000);
        assert_eq!(Prologue::split(&short), None);
    }

    #[test]
    fn majors_and_minors_past_31_bits_compare_exactly() {
        let rt = runc_like(&[rule(false, b'a', None, None, RWM)]);
        let mut pro = Prologue::default();
        pro.allow.insert((0xffff_fff0, 0x8000_0001));
        let p = pro.compile(&rt);
        assert_eq!(allows(&p, 0xffff_fff0, 0x8000_0001), Some(true));
        assert_eq!(allows(&p, 0xffff_fff0, 1), Some(false));
    }

    #[test]
    fn what_the_interpreter_does_not_model_is_unknown() {
        let call = insn(0x85, 0, 0, 0, 1);
        assert_eq!(allows(&[call, exit()], 1, 3), None);
        // r0 never set
        assert_eq!(allows(&[exit()], 1, 3), None);
        // a load that is not from the context
        assert_eq!(allows(&[ldx_w(0, 2, 0), exit()], 1, 3), None);
        // a load past its end
        assert_eq!(allows(&[ldx_w(0, 1, 12), exit()], 1, 3), None);
        // a jump out of the program
        assert_eq!(allows(&[jne_imm(1, 0, 5), exit()], 1, 3), None);
        // a map load (ld_imm64 with a pseudo source)
        let ld = insn(0x18, 1, 1, 0, 3);
        assert_eq!(allows(&[ld, insn(0, 0, 0, 0, 0), exit()], 1, 3), None);
        // running off the end
        assert_eq!(allows(&[mov64_imm(0, 1)], 1, 3), None);
        // a store
        assert_eq!(allows(&[insn(0x63, 10, 1, -4, 0), exit()], 1, 3), None);
        // cpu v4: a sign-extending mov (off 8), a signed div (off 1)
        let movsx = insn(0xbf, 2, 1, 8, 0);
        assert_eq!(allows(&[mov64_imm(1, 5), movsx, exit()], 1, 3), None);
        let sdiv = insn(0x37, 0, 0, 1, 2);
        assert_eq!(allows(&[mov64_imm(0, 2), sdiv, exit()], 1, 3), None);
        // returns 1 / 0
        assert_eq!(allows(&[mov64_imm(0, 1), exit()], 1, 3), Some(true));
        assert_eq!(allows(&[mov64_imm(0, 0), exit()], 1, 3), Some(false));
    }
}
