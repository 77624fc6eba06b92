//! The few `bpf(2)` commands gpuhook needs, called directly through `libc::syscall`.
//!
//! For a libvirt domain gpuhook only *updates* the map of the device program libvirt
//! attached (`map_create` is here for the tests, which attach a program of libvirt's layout
//! to a cgroup of their own). For an OCI container it replaces the runtime's program
//! (`prog_xlated`, `prog_load`, `prog_attach`, `prog_detach`: [`super::runtime_program`]).

use nix::errno::Errno;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_PROG_QUERY: libc::c_long = 16;

pub const BPF_MAP_TYPE_HASH: u32 = 1;
pub const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
pub const BPF_CGROUP_DEVICE: u32 = 6;
pub const BPF_F_QUERY_EFFECTIVE: u32 = 1;
/// Attach flags: several programs on one cgroup, all of which must allow.
pub const BPF_F_ALLOW_MULTI: u32 = 2;
const BPF_ANY: u64 = 0;

/// Zeroed attribute block large enough for every command used here.
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 128])
    }
    fn u32(&mut self, off: usize, v: u32) -> &mut Self {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, off: usize, v: u64) -> &mut Self {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn get_u32(&self, off: usize) -> u32 {
        u32::from_ne_bytes(self.0[off..off + 4].try_into().expect("4 bytes"))
    }
}

fn sys(cmd: libc::c_long, attr: &mut Attr) -> Result<libc::c_long, Errno> {
    // SAFETY: attr is a valid, zero-padded bpf_attr of the size passed; pointers inside it
    // point at live buffers of the caller for the duration of the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut Attr,
            std::mem::size_of::<Attr>(),
        )
    };
    Errno::result(r)
}

fn fd_result(r: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(r as i32) }
}

/// IDs of the programs attached to a cgroup for `attach_type` (`flags`: 0 for the ones
/// attached to this cgroup, `BPF_F_QUERY_EFFECTIVE` for all that apply).
pub fn prog_query(cgroup: BorrowedFd, attach_type: u32, flags: u32) -> Result<Vec<u32>, Errno> {
    prog_query_flags(cgroup, attach_type, flags).map(|(ids, _)| ids)
}

/// [`prog_query`], with the attach flags the programs attached to this cgroup were attached
/// with (`BPF_F_ALLOW_MULTI`, `BPF_F_ALLOW_OVERRIDE` or none).
pub fn prog_query_flags(
    cgroup: BorrowedFd,
    attach_type: u32,
    flags: u32,
) -> Result<(Vec<u32>, u32), Errno> {
    let mut ids = [0u32; 64];
    let mut a = Attr::new();
    a.u32(0, cgroup.as_raw_fd() as u32)
        .u32(4, attach_type)
        .u32(8, flags)
        .u64(16, ids.as_mut_ptr() as u64)
        .u32(24, ids.len() as u32);
    sys(BPF_PROG_QUERY, &mut a)?;
    let n = (a.get_u32(24) as usize).min(ids.len());
    Ok((ids[..n].to_vec(), a.get_u32(12)))
}

pub fn prog_get_fd_by_id(id: u32) -> Result<OwnedFd, Errno> {
    let mut a = Attr::new();
    a.u32(0, id);
    sys(BPF_PROG_GET_FD_BY_ID, &mut a).map(fd_result)
}

pub fn map_get_fd_by_id(id: u32) -> Result<OwnedFd, Errno> {
    let mut a = Attr::new();
    a.u32(0, id);
    sys(BPF_MAP_GET_FD_BY_ID, &mut a).map(fd_result)
}

/// Map IDs a program uses (`bpf_prog_info.nr_map_ids` / `map_ids`).
pub fn prog_map_ids(prog: BorrowedFd) -> Result<Vec<u32>, Errno> {
    let mut ids = [0u32; 16];
    // struct bpf_prog_info up to map_ids: nr_map_ids at 52, map_ids at 56.
    let mut info = [0u8; 64];
    info[52..56].copy_from_slice(&(ids.len() as u32).to_ne_bytes());
    info[56..64].copy_from_slice(&(ids.as_mut_ptr() as u64).to_ne_bytes());
    let mut a = Attr::new();
    a.u32(0, prog.as_raw_fd() as u32)
        .u32(4, info.len() as u32)
        .u64(8, info.as_mut_ptr() as u64);
    sys(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
    let n = u32::from_ne_bytes(info[52..56].try_into().expect("4 bytes")) as usize;
    Ok(ids[..n.min(ids.len())].to_vec())
}

/// A program's name (`bpf_prog_info.name`): empty for one loaded without (runc's, crun's,
/// gpuhook's), `sd_devices` for systemd's device programs.
pub fn prog_name(prog: BorrowedFd) -> Result<String, Errno> {
    // struct bpf_prog_info up to name: name[BPF_OBJ_NAME_LEN = 16] at 64.
    let mut info = [0u8; 80];
    let mut a = Attr::new();
    a.u32(0, prog.as_raw_fd() as u32)
        .u32(4, info.len() as u32)
        .u64(8, info.as_mut_ptr() as u64);
    sys(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
    let name = &info[64..80];
    let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// The most instructions of a program gpuhook reads back (the kernel's own limit for a
/// privileged program is a million; a runtime's device program has a few hundred).
pub const MAX_INSNS: usize = 1 << 16;

/// A program's instructions as the verifier left them (`bpf_prog_info.xlated_prog_insns`),
/// and how many maps it uses.
pub fn prog_xlated(prog: BorrowedFd) -> Result<(Vec<Insn>, u32), Errno> {
    // struct bpf_prog_info: xlated_prog_len at 20, xlated_prog_insns at 32, nr_map_ids at 52.
    let len_of = |info: &[u8; 64], o: usize| {
        u32::from_ne_bytes(info[o..o + 4].try_into().expect("4 bytes")) as usize
    };
    let get = |info: &mut [u8; 64]| {
        let mut a = Attr::new();
        a.u32(0, prog.as_raw_fd() as u32)
            .u32(4, info.len() as u32)
            .u64(8, info.as_mut_ptr() as u64);
        sys(BPF_OBJ_GET_INFO_BY_FD, &mut a).map(|_| ())
    };
    let mut info = [0u8; 64];
    get(&mut info)?;
    let bytes = len_of(&info, 20);
    let size = std::mem::size_of::<Insn>();
    if bytes % size != 0 || bytes / size > MAX_INSNS {
        return Err(Errno::E2BIG);
    }
    let mut insns = vec![
        Insn {
            code: 0,
            regs: 0,
            off: 0,
            imm: 0
        };
        bytes / size
    ];
    let mut info = [0u8; 64];
    info[20..24].copy_from_slice(&(bytes as u32).to_ne_bytes());
    info[32..40].copy_from_slice(&(insns.as_mut_ptr() as u64).to_ne_bytes());
    get(&mut info)?;
    if len_of(&info, 20) != bytes {
        // Another program under the same fd cannot be; a kernel that says a new length
        // gave no consistent copy.
        return Err(Errno::EAGAIN);
    }
    Ok((insns, len_of(&info, 52) as u32))
}

/// (type, key_size, value_size, max_entries) of a map.
pub fn map_info(map: BorrowedFd) -> Result<(u32, u32, u32, u32), Errno> {
    let mut info = [0u8; 24];
    let mut a = Attr::new();
    a.u32(0, map.as_raw_fd() as u32)
        .u32(4, info.len() as u32)
        .u64(8, info.as_mut_ptr() as u64);
    sys(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
    let f = |o: usize| u32::from_ne_bytes(info[o..o + 4].try_into().expect("4 bytes"));
    Ok((f(0), f(8), f(12), f(16)))
}

fn elem(
    cmd: libc::c_long,
    map: BorrowedFd,
    key: *const u8,
    val: u64,
    flags: u64,
) -> Result<libc::c_long, Errno> {
    let mut a = Attr::new();
    a.u32(0, map.as_raw_fd() as u32)
        .u64(8, key as u64)
        .u64(16, val)
        .u64(24, flags);
    sys(cmd, &mut a)
}

pub fn map_lookup_u32(map: BorrowedFd, key: u64) -> Result<Option<u32>, Errno> {
    let mut v = 0u32;
    match elem(
        BPF_MAP_LOOKUP_ELEM,
        map,
        &key as *const u64 as *const u8,
        &mut v as *mut u32 as u64,
        0,
    ) {
        Ok(_) => Ok(Some(v)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

pub fn map_update_u32(map: BorrowedFd, key: u64, value: u32) -> Result<(), Errno> {
    elem(
        BPF_MAP_UPDATE_ELEM,
        map,
        &key as *const u64 as *const u8,
        &value as *const u32 as u64,
        BPF_ANY,
    )
    .map(|_| ())
}

pub fn map_delete(map: BorrowedFd, key: u64) -> Result<(), Errno> {
    elem(
        BPF_MAP_DELETE_ELEM,
        map,
        &key as *const u64 as *const u8,
        0,
        0,
    )
    .map(|_| ())
}

/// Every key of a map with 8-byte keys.
pub fn map_keys(map: BorrowedFd) -> Result<Vec<u64>, Errno> {
    let mut keys = Vec::new();
    let mut next = 0u64;
    let mut prev: Option<u64> = None;
    loop {
        let kp = prev
            .as_ref()
            .map_or(std::ptr::null(), |k| k as *const u64 as *const u8);
        match elem(
            BPF_MAP_GET_NEXT_KEY,
            map,
            kp,
            &mut next as *mut u64 as u64,
            0,
        ) {
            Ok(_) => {
                keys.push(next);
                prev = Some(next);
                if keys.len() > 1 << 20 {
                    return Err(Errno::E2BIG);
                }
            }
            Err(Errno::ENOENT) => return Ok(keys),
            Err(e) => return Err(e),
        }
    }
}

pub fn map_create(
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
) -> Result<OwnedFd, Errno> {
    let mut a = Attr::new();
    a.u32(0, map_type)
        .u32(4, key_size)
        .u32(8, value_size)
        .u32(12, max_entries);
    sys(BPF_MAP_CREATE, &mut a).map(fd_result)
}

/// One eBPF instruction.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    /// dst in the low nibble, src in the high nibble
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

pub fn prog_load(prog_type: u32, insns: &[Insn], license: &str) -> Result<OwnedFd, Errno> {
    prog_load_named(prog_type, insns, license, "")
}

/// [`prog_load`] with a name (`bpf_attr.prog_name`, at most 15 bytes): for the tests'
/// stand-ins of programs others name (systemd's `sd_devices`).
pub fn prog_load_named(
    prog_type: u32,
    insns: &[Insn],
    license: &str,
    name: &str,
) -> Result<OwnedFd, Errno> {
    let lic = std::ffi::CString::new(license).map_err(|_| Errno::EINVAL)?;
    if name.len() > 15 || name.contains('\0') {
        return Err(Errno::EINVAL);
    }
    // No verifier log: a log buffer too small for a long program fails the load (ENOSPC).
    let mut a = Attr::new();
    a.u32(0, prog_type)
        .u32(4, insns.len() as u32)
        .u64(8, insns.as_ptr() as u64)
        .u64(16, lic.as_ptr() as u64);
    // prog_name[BPF_OBJ_NAME_LEN] at 48.
    a.0[48..48 + name.len()].copy_from_slice(name.as_bytes());
    sys(BPF_PROG_LOAD, &mut a).map(fd_result)
}

pub fn prog_attach(
    cgroup: BorrowedFd,
    prog: BorrowedFd,
    attach_type: u32,
    flags: u32,
) -> Result<(), Errno> {
    let mut a = Attr::new();
    a.u32(0, cgroup.as_raw_fd() as u32)
        .u32(4, prog.as_raw_fd() as u32)
        .u32(8, attach_type)
        .u32(12, flags);
    sys(BPF_PROG_ATTACH, &mut a).map(|_| ())
}

pub fn prog_detach(cgroup: BorrowedFd, prog: BorrowedFd, attach_type: u32) -> Result<(), Errno> {
    let mut a = Attr::new();
    a.u32(0, cgroup.as_raw_fd() as u32)
        .u32(4, prog.as_raw_fd() as u32)
        .u32(8, attach_type);
    sys(BPF_PROG_DETACH, &mut a).map(|_| ())
}
