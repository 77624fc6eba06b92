//! A small interpreter of the instructions an OCI runtime's cgroup v2 device program uses
//! ([`eval`]): what such a program allows is read by running it, here, on the access in
//! question; a program with anything else (a map, a call, a store) is refused as one gpuhook
//! cannot read. Also the instructions gpuhook writes ([`asm`]) and, for tests, a program of the
//! runtimes' own shape ([`runc_like`]).

use super::bpf::Insn;

// ---- instructions ----

const CLASS_LD: u8 = 0x00;
const CLASS_LDX: u8 = 0x01;
const CLASS_ALU: u8 = 0x04;
const CLASS_JMP: u8 = 0x05;
const CLASS_JMP32: u8 = 0x06;
const CLASS_ALU64: u8 = 0x07;
const SRC_X: u8 = 0x08;

pub(super) const DEV_CHAR: i32 = 2;
const ACC_MKNOD: u32 = 1;
pub(super) const ACC_READ: u32 = 2;
pub(super) const ACC_WRITE: u32 = 4;

/// The instructions gpuhook writes (and the tests' runtime-like and libvirt programs).
pub mod asm {
    use crate::cgroup::bpf::Insn;
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
        match class {
            CLASS_ALU | CLASS_ALU64 => {
                alu_insn(i, class == CLASS_ALU64, &mut r, d, s)?;
                pc += 1;
            }
            CLASS_LDX => {
                ldx_insn(i, &mut r, d, s, &cb)?;
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
            CLASS_JMP | CLASS_JMP32 => match jmp_insn(i, class, &r, d, s, pc, prog.len())? {
                Flow::Goto(to) => pc = to,
                Flow::Exit(allowed) => return Some(allowed),
            },
            _ => return None,
        }
    }
    None
}

/// A register's number (`None`: unset, or the context pointer).
fn val(x: Reg) -> Option<u64> {
    match x {
        Reg::Val(v) => Some(v),
        _ => None,
    }
}

/// One ALU instruction (`wide`: 64-bit) on the registers; `None`: not modelled.
fn alu_insn(i: &Insn, wide: bool, r: &mut [Reg; 11], d: usize, s: usize) -> Option<()> {
    let op = i.code & 0xf0;
    // cpu v4's signed div/mod and sign-extending mov (`off`), an address-space
    // cast (`imm` of a register mov): not modelled.
    if i.off != 0 || (i.code & SRC_X != 0 && i.imm != 0) {
        return None;
    }
    if op == 0xb0 && i.code & SRC_X != 0 && r[s] == Reg::Ctx {
        // A copy of the context pointer stays one (64-bit mov only).
        if !wide {
            return None;
        }
        r[d] = Reg::Ctx;
        return Some(());
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
    Some(())
}

/// One load from the context: only of 1, 2 or 4 bytes inside it; `None`: anything else.
fn ldx_insn(i: &Insn, r: &mut [Reg; 11], d: usize, s: usize, cb: &[u8; 12]) -> Option<()> {
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
    Some(())
}

/// Where a jump instruction leaves the run.
enum Flow {
    /// The next instruction to run.
    Goto(usize),
    /// The program returned: whether it allows the access.
    Exit(bool),
}

/// One jump-class instruction (a jump, `exit`); `None`: not modelled.
fn jmp_insn(
    i: &Insn,
    class: u8,
    r: &[Reg; 11],
    d: usize,
    s: usize,
    pc: usize,
    len: usize,
) -> Option<Flow> {
    let op = i.code & 0xf0;
    match op {
        0x90 if class == CLASS_JMP => return Some(Flow::Exit(val(r[0])? & 0xffff_ffff == 1)),
        0x80 => return None,
        0x00 if class == CLASS_JMP => return Some(Flow::Goto(jump(pc, i.off, len)?)),
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
    Some(Flow::Goto(if taken {
        jump(pc, i.off, len)?
    } else {
        pc + 1
    }))
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

/// A device rule as runc's `devicefilter` and crun compile it: the last rule that matches
/// decides. For tests: a program of the runtimes' own shape.
#[derive(Debug, Clone, Copy)]
pub struct DeviceRule {
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
pub fn runc_like(rules: &[DeviceRule]) -> Vec<Insn> {
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
