//! cgroup v2 for an OCI container: the runtime's device program replaced by one that allows
//! exactly what it allowed plus (attach) or minus (detach) exact GPU nodes (SPEC "Hotplug").
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
//! interpreter of the instructions such programs use ([`eval`]); a program with anything else
//! (a map, a call, a store) is refused as one gpuhook cannot read.

use super::bpf::{self, Insn};
use super::{CgroupError, DeviceCgroup, Fault};
use crate::node::Node;
use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;
use std::collections::BTreeSet;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

// ---- instructions ----

const CLASS_LD: u8 = 0x00;
const CLASS_LDX: u8 = 0x01;
const CLASS_ALU: u8 = 0x04;
const CLASS_JMP: u8 = 0x05;
const CLASS_JMP32: u8 = 0x06;
const CLASS_ALU64: u8 = 0x07;
const SRC_X: u8 = 0x08;

const DEV_CHAR: i32 = 2;
const ACC_MKNOD: u32 = 1;
const ACC_READ: u32 = 2;
const ACC_WRITE: u32 = 4;

/// The prologue's first instruction's immediate: "GPUH".
pub const MAGIC: i32 = 0x4750_5548;

/// The instructions gpuhook writes (and the tests' runtime-like and libvirt programs).
pub mod asm {
    use super::Insn;
    /// One instruction: opcode, registers, offset, immediate.
    pub fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            regs: dst | (src << 4),
            off,
            imm,
        }
    }
    pub fn mov64_imm(d: u8, imm: i32) -> Insn {
        insn(0xb7, d, 0, 0, imm)
    }
    pub fn mov32_imm(d: u8, imm: i32) -> Insn {
        insn(0xb4, d, 0, 0, imm)
    }
    pub fn mov32_reg(d: u8, s: u8) -> Insn {
        insn(0xbc, d, s, 0, 0)
    }
    pub fn and32_imm(d: u8, imm: i32) -> Insn {
        insn(0x54, d, 0, 0, imm)
    }
    pub fn and32_reg(d: u8, s: u8) -> Insn {
        insn(0x5c, d, s, 0, 0)
    }
    pub fn rsh32_imm(d: u8, imm: i32) -> Insn {
        insn(0x74, d, 0, 0, imm)
    }
    pub fn ldx_w(d: u8, s: u8, off: i16) -> Insn {
        insn(0x61, d, s, off, 0)
    }
    /// `if (u32)d != imm goto +off`
    pub fn jne32_imm(d: u8, imm: i32, off: i16) -> Insn {
        insn(0x56, d, 0, off, imm)
    }
    /// `if d != imm goto +off` (64 bits, imm sign-extended)
    pub fn jne_imm(d: u8, imm: i32, off: i16) -> Insn {
        insn(0x55, d, 0, off, imm)
    }
    pub fn jne_reg(d: u8, s: u8, off: i16) -> Insn {
        insn(0x5d, d, s, off, 0)
    }
    pub fn exit() -> Insn {
        insn(0x95, 0, 0, 0, 0)
    }
}
use asm::*;

fn dst(i: &Insn) -> usize {
    usize::from(i.regs & 0x0f)
}
fn src(i: &Insn) -> usize {
    usize::from(i.regs >> 4)
}

// ---- what a program allows ----

/// An access as a device program sees it (`struct bpf_cgroup_dev_ctx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevCtx {
    /// `access << 16 | type` (access: mknod 1, read 2, write 4; type: block 1, char 2).
    pub access_type: u32,
    pub major: u32,
    pub minor: u32,
}

impl DevCtx {
    /// Read and write of a char device: what a GPU's holder needs.
    pub fn rw_char(major: u32, minor: u32) -> DevCtx {
        DevCtx {
            access_type: ((ACC_READ | ACC_WRITE) << 16) | DEV_CHAR as u32,
            major,
            minor,
        }
    }

    fn bytes(&self) -> [u8; 12] {
        let mut b = [0u8; 12];
        b[0..4].copy_from_slice(&self.access_type.to_ne_bytes());
        b[4..8].copy_from_slice(&self.major.to_ne_bytes());
        b[8..12].copy_from_slice(&self.minor.to_ne_bytes());
        b
    }
}

/// A register: a number, or the context pointer (only `r1` at entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reg {
    Unset,
    Ctx,
    Val(u64),
}

/// The most instructions one run may execute (a device program has no loops; a run longer
/// than its length is one gpuhook does not understand).
const MAX_STEPS: usize = 1 << 16;

/// Whether the program allows the access: `Some(true)`/`Some(false)` as it returns 1/0,
/// `None` when it does something this interpreter does not model (a map, a call, a store, a
/// load outside the context, a jump outside the program, a register read before it is set).
pub fn eval(prog: &[Insn], ctx: DevCtx) -> Option<bool> {
    // The context's bytes are read as the kernel lays them out on a little-endian host.
    if cfg!(target_endian = "big") {
        return None;
    }
    let mut r = [Reg::Unset; 11];
    r[1] = Reg::Ctx;
    let cb = ctx.bytes();
    let mut pc = 0usize;
    for _ in 0..MAX_STEPS {
        let i = prog.get(pc)?;
        let class = i.code & 0x07;
        let (d, s) = (dst(i), src(i));
        if d > 10 || s > 10 {
            return None;
        }
        let val = |x: Reg| match x {
            Reg::Val(v) => Some(v),
            _ => None,
        };
        match class {
            CLASS_ALU | CLASS_ALU64 => {
                let op = i.code & 0xf0;
                let wide = class == CLASS_ALU64;
                // cpu v4's signed div/mod and sign-extending mov (`off`), an address-space
                // cast (`imm` of a register mov): not modelled.
                if i.off != 0 || (i.code & SRC_X != 0 && i.imm != 0) {
                    return None;
                }
                if op == 0xb0 && i.code & SRC_X != 0 && r[s] == Reg::Ctx {
                    // A copy of the context pointer stays one (64-bit mov only).
                    r[d] = if wide { Reg::Ctx } else { return None };
                    pc += 1;
                    continue;
                }
                let operand = if i.code & SRC_X != 0 {
                    val(r[s])?
                } else if wide {
                    i.imm as i64 as u64
                } else {
                    i.imm as u32 as u64
                };
                if op == 0xb0 {
                    r[d] = Reg::Val(if wide { operand } else { operand & 0xffff_ffff });
                } else {
                    let a = val(r[d])?;
                    let v = alu(op, a, operand, wide)?;
                    r[d] = Reg::Val(if wide { v } else { v & 0xffff_ffff });
                }
                pc += 1;
            }
            CLASS_LDX => {
                // Only loads from the context, of 1, 2 or 4 bytes inside it.
                if i.code & 0xe0 != 0x60 || r[s] != Reg::Ctx {
                    return None;
                }
                let size = match i.code & 0x18 {
                    0x00 => 4,
                    0x08 => 2,
                    0x10 => 1,
                    _ => return None,
                };
                let off = usize::try_from(i.off).ok()?;
                let bytes = cb.get(off..off.checked_add(size)?)?;
                let mut v = [0u8; 8];
                v[..size].copy_from_slice(bytes);
                r[d] = Reg::Val(u64::from_le_bytes(v));
                if i.imm != 0 {
                    return None;
                }
                pc += 1;
            }
            CLASS_LD => {
                // `ld_imm64` of a plain number; a map or other pseudo source is not modelled.
                let next = prog.get(pc + 1)?;
                if i.code != 0x18 || s != 0 {
                    return None;
                }
                r[d] = Reg::Val(u64::from(i.imm as u32) | (u64::from(next.imm as u32) << 32));
                pc += 2;
            }
            CLASS_JMP | CLASS_JMP32 => {
                let op = i.code & 0xf0;
                match op {
                    0x90 if class == CLASS_JMP => return val(r[0]).map(|v| v & 0xffff_ffff == 1),
                    0x80 => return None,
                    0x00 if class == CLASS_JMP => {
                        pc = jump(pc, i.off, prog.len())?;
                        continue;
                    }
                    _ => {}
                }
                let wide = class == CLASS_JMP;
                let a = val(r[d])?;
                let b = if i.code & SRC_X != 0 {
                    val(r[s])?
                } else {
                    i.imm as i64 as u64
                };
                let (a, b) = if wide {
                    (a, b)
                } else {
                    (a & 0xffff_ffff, b & 0xffff_ffff)
                };
                let (sa, sb) = if wide {
                    (a as i64, b as i64)
                } else {
                    (i64::from(a as u32 as i32), i64::from(b as u32 as i32))
                };
                let taken = match op {
                    0x10 => a == b,
                    0x20 => a > b,
                    0x30 => a >= b,
                    0x40 => a & b != 0,
                    0x50 => a != b,
                    0x60 => sa > sb,
                    0x70 => sa >= sb,
                    0xa0 => a < b,
                    0xb0 => a <= b,
                    0xc0 => sa < sb,
                    0xd0 => sa <= sb,
                    _ => return None,
                };
                pc = if taken {
                    jump(pc, i.off, prog.len())?
                } else {
                    pc + 1
                };
            }
            _ => return None,
        }
    }
    None
}

fn jump(pc: usize, off: i16, len: usize) -> Option<usize> {
    let to = (pc as i64) + 1 + i64::from(off);
    usize::try_from(to).ok().filter(|&t| t < len)
}

fn alu(op: u8, a: u64, b: u64, wide: bool) -> Option<u64> {
    let bits = if wide { 64 } else { 32 };
    let (a32, b32) = (a as u32, b as u32);
    Some(match op {
        0x00 => a.wrapping_add(b),
        0x10 => a.wrapping_sub(b),
        0x20 => a.wrapping_mul(b),
        0x30 if wide => a.checked_div(b).unwrap_or(0),
        0x30 => u64::from(a32.checked_div(b32).unwrap_or(0)),
        0x40 => a | b,
        0x50 => a & b,
        0x60 => a.wrapping_shl((b % bits) as u32),
        0x70 if wide => a.wrapping_shr((b % bits) as u32),
        0x70 => u64::from(a32.wrapping_shr((b % bits) as u32)),
        0x80 => a.wrapping_neg(),
        0x90 if wide => a.checked_rem(b).unwrap_or(a),
        0x90 => u64::from(a32.checked_rem(b32).unwrap_or(a32)),
        0xa0 => a ^ b,
        0xc0 if wide => ((a as i64) >> (b % 64)) as u64,
        0xc0 => u64::from(((a32 as i32) >> (b % 32)) as u32),
        _ => return None,
    })
}

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

/// Where gpuhook's locks of cgroups whose program it replaces are: root's alone (a lock on
/// the cgroup directory itself could be taken by anyone who can open it, the container
/// included, through its cgroup namespace).
const LOCK_DIR: [&str; 3] = ["/run", "gpuhook", "cgroup-locks"];

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
        let prog = super::prog_fd(dir, id)?;
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
    let cg = super::open_dir(dir)?;
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
pub struct Replace {
    dir: PathBuf,
    cg: OwnedFd,
    /// gpuhook's lock of this cgroup, held for as long as this value lives.
    _lock: Flock<std::fs::File>,
    /// The programs attached now: one, or two where a gpuhook was killed between attaching
    /// its replacement and detaching the program it replaced (both rule, see [`Replace::open`]).
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
/// device and inode in [`LOCK_DIR`], taken within [`LOCK_WAIT`].
fn lock(cg: &OwnedFd) -> Result<Flock<std::fs::File>, Fault> {
    let st = nix::sys::stat::fstat(cg).map_err(|x| Fault::Lock(x.into()))?;
    lock_named(&format!("{:x}-{:x}", st.st_dev, st.st_ino))
}

/// gpuhook's lock named `name` (a file name) in [`LOCK_DIR`], taken within [`LOCK_WAIT`].
pub(super) fn lock_named(name: &str) -> Result<Flock<std::fs::File>, Fault> {
    use nix::errno::Errno;
    let mut dir = nix::fcntl::open(
        "/",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|x| Fault::Lock(x.into()))?;
    for name in &LOCK_DIR[..] {
        let name = name.trim_start_matches('/');
        dir = root_dir(&dir, name).map_err(|x| Fault::Lock(x.into()))?;
    }
    let fd = nix::fcntl::openat(
        &dir,
        name,
        OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(|x| Fault::Lock(x.into()))?;
    let mut file = std::fs::File::from(fd);
    let until = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(l),
            Err((f, Errno::EWOULDBLOCK)) if std::time::Instant::now() < until => {
                file = f;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err((_, x)) => return Err(Fault::Lock(x.into())),
        }
    }
}

impl Replace {
    /// The device program attached to cgroup `dir` (exactly one, attached as runc and crun
    /// attach theirs, of plain code that [`eval`] can read), locked against another
    /// gpuhook's replacement. systemd's own programs there ([`SYSTEMD_PROGRAM`]: a scope's
    /// `DeviceAllow=`, which runc's cgroup shares under systemd's cgroup manager, put back
    /// beside the runtime's at each `systemctl daemon-reload`) are systemd's: left in place,
    /// never replaced. They rule too (an access needs every program to allow it), which
    /// [`DeviceCgroup::effective`] reads.
    pub fn open(dir: &Path) -> Result<Replace, CgroupError> {
        let e = |f: Fault| CgroupError::new(dir, f);
        let cg = super::open_dir(dir)?;
        let lock = lock(&cg).map_err(e)?;
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
            return Ok(Replace {
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
        Ok(Replace {
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

impl DeviceCgroup for Replace {
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
        super::programs_allow(&self.dir, self.cg.as_fd(), n)
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

/// A device rule as runc's `devicefilter` and crun compile it: the last rule that matches
/// decides. For tests: a program of the runtimes' own shape.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub allow: bool,
    /// `b'a'` (all), `b'c'`, `b'b'`
    pub kind: u8,
    pub major: Option<u32>,
    pub minor: Option<u32>,
    /// mknod 1 | read 2 | write 4
    pub access: u32,
}

/// A program as runc's `devicefilter.go` emits it for `rules` (default deny).
#[doc(hidden)]
pub fn runc_like(rules: &[Rule]) -> Vec<Insn> {
    let mut p = vec![
        ldx_w(2, 1, 0),
        and32_imm(2, 0xffff),
        ldx_w(3, 1, 0),
        rsh32_imm(3, 16),
        ldx_w(4, 1, 4),
        ldx_w(5, 1, 8),
    ];
    for r in rules.iter().rev() {
        let mut block = Vec::new();
        if r.kind != b'a' {
            let t = if r.kind == b'b' { 1 } else { DEV_CHAR };
            block.push(("next", jne_imm(2, t, 0)));
        }
        if r.access != ACC_MKNOD | ACC_READ | ACC_WRITE {
            block.push(("", mov32_reg(1, 3)));
            block.push(("", and32_imm(1, r.access as i32)));
            block.push(("next", jne_reg(1, 3, 0)));
        }
        if let Some(m) = r.major {
            block.push(("next", jne_imm(4, m as i32, 0)));
        }
        if let Some(m) = r.minor {
            block.push(("next", jne_imm(5, m as i32, 0)));
        }
        block.push(("", mov32_imm(0, i32::from(r.allow))));
        block.push(("", exit()));
        let n = block.len();
        let catch_all = n == 2;
        for (k, (label, mut i)) in block.into_iter().enumerate() {
            if label == "next" {
                i.off = (n - k - 1) as i16;
            }
            p.push(i);
        }
        // Nothing after a rule that matches every access is reachable (the verifier refuses
        // unreachable code; runc stops there too).
        if catch_all {
            return p;
        }
    }
    p.extend([mov32_imm(0, 0), exit()]);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    const RWM: u32 = 7;
    const RW: u32 = 6;

    fn rule(allow: bool, kind: u8, major: Option<u32>, minor: Option<u32>, access: u32) -> Rule {
        Rule {
            allow,
            kind,
            major,
            minor,
            access,
        }
    }

    /// What podman asks runc for, with one GPU (195:0) of gpuhook's at create.
    fn podman_rules() -> Vec<Rule> {
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
