//! libvirt's cgroup v2 device program, instruction for instruction as
//! `src/util/vircgroupv2devices.c` (`virCgroupV2DevicesLoadProg`) builds it, so tests can
//! attach exactly what libvirt attaches on a cgroup-v2 host and let gpuhook update its map.

use gpuhook::cgroup::bpf::{self, Insn};
use nix::errno::Errno;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R6: u8 = 6;
const R10: u8 = 10;

use gpuhook::cgroup::interp::asm::{exit, insn as i, ldx_w, mov64_imm};

fn mov64_reg(d: u8, s: u8) -> Insn {
    i(0xbf, d, s, 0, 0)
}
fn stx_dw(d: u8, s: u8, off: i16) -> Insn {
    i(0x7b, d, s, off, 0)
}
fn lsh_imm(d: u8, imm: i32) -> Insn {
    i(0x67, d, 0, 0, imm)
}
fn add_imm(d: u8, imm: i32) -> Insn {
    i(0x07, d, 0, 0, imm)
}
fn or_reg(d: u8, s: u8) -> Insn {
    i(0x4f, d, s, 0, 0)
}
fn and_reg(d: u8, s: u8) -> Insn {
    i(0x5f, d, s, 0, 0)
}
fn jeq_imm(d: u8, imm: i32, off: i16) -> Insn {
    i(0x15, d, 0, off, imm)
}
fn jeq_reg(d: u8, s: u8, off: i16) -> Insn {
    i(0x1d, d, s, off, 0)
}
fn call(f: i32) -> Insn {
    i(0x85, 0, 0, 0, f)
}
fn ld_imm64(d: u8, v: u64) -> [Insn; 2] {
    [
        i(0x18, d, 0, 0, v as u32 as i32),
        i(0, 0, 0, 0, (v >> 32) as u32 as i32),
    ]
}
fn ld_map_fd(d: u8, fd: i32) -> [Insn; 2] {
    [i(0x18, d, 1, 0, fd), i(0, 0, 0, 0, 0)]
}

/// One lookup of `key` (left at r10-8) and the access check; jumps `to_exit` on allow.
fn lookup(p: &mut Vec<Insn>, map: i32, to_exit: i16) {
    p.push(stx_dw(R10, if p.len() == 5 { R2 } else { R1 }, -8));
    p.push(mov64_reg(R2, R10));
    p.push(add_imm(R2, -8));
    p.extend(ld_map_fd(R1, map));
    p.push(call(1)); // bpf_map_lookup_elem
    p.push(mov64_reg(R1, R0));
    p.push(jeq_imm(R1, 0, 5));
    p.push(mov64_imm(R0, 1));
    p.push(ldx_w(R2, R6, 0));
    p.push(ldx_w(R1, R1, 0));
    p.push(and_reg(R1, R2));
    p.push(jeq_reg(R1, R2, to_exit));
}

/// The program, bound to map `map_fd`.
pub fn libvirt_device_program(map_fd: i32) -> Vec<Insn> {
    let mut p = vec![
        mov64_reg(R6, R1),
        ldx_w(R1, R6, 8),
        ldx_w(R2, R6, 4),
        lsh_imm(R2, 32),
        or_reg(R2, R1),
    ];
    lookup(&mut p, map_fd, 50); // exact major:minor
    p.extend([ldx_w(R1, R6, 4), lsh_imm(R1, 32)]);
    p.extend(ld_imm64(R2, 0xffff_ffff));
    p.push(or_reg(R1, R2));
    lookup(&mut p, map_fd, 32); // major:*
    p.push(ldx_w(R1, R6, 8));
    p.extend(ld_imm64(R2, 0xffff_ffff_0000_0000));
    p.push(or_reg(R1, R2));
    lookup(&mut p, map_fd, 15); // *:minor
    p.push(mov64_imm(R1, -1));
    lookup(&mut p, map_fd, 1); // *:*
    p.push(mov64_imm(R0, 0));
    p.push(exit());
    assert_eq!(p.len(), 69, "libvirt's program has 69 instructions");
    p
}

/// libvirt's default allow-list for a container, as map entries (`rwm` char devices).
pub const DEFAULT_ALLOW: [(u32, u32); 9] = [
    (1, 3),
    (1, 5),
    (1, 7),
    (1, 8),
    (1, 9),
    (5, 0),
    (5, 2),
    (10, 229),
    (136, u32::MAX),
];

/// Creates libvirt's map (64 entries) with its default entries, loads the program and
/// attaches it to the cgroup directory `cg` (exclusive, flags 0) as libvirt does.
pub fn attach_libvirt_program(cg: BorrowedFd) -> Result<(OwnedFd, OwnedFd), Errno> {
    let map = bpf::map_create(bpf::BPF_MAP_TYPE_HASH, 8, 4, 64)?;
    for (ma, mi) in DEFAULT_ALLOW {
        let key = (u64::from(ma) << 32) | u64::from(mi);
        bpf::map_update_u32(map.as_fd(), key, (7 << 16) | 2)?;
    }
    let prog = bpf::prog_load(
        bpf::BPF_PROG_TYPE_CGROUP_DEVICE,
        &libvirt_device_program(map.as_raw_fd()),
        "GPL",
    )?;
    bpf::prog_attach(cg, prog.as_fd(), bpf::BPF_CGROUP_DEVICE, 0)?;
    Ok((prog, map))
}
