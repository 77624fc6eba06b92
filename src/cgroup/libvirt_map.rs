//! cgroup v2: entries in the map of libvirt's device program.
//!
//! libvirt (`src/util/vircgroupv2devices.c`) attaches one `BPF_PROG_TYPE_CGROUP_DEVICE`
//! program with a `BPF_MAP_TYPE_HASH` map: key `u64` = `major << 32 | minor` (`0xffffffff`
//! in either half is a wildcard), value `u32` = `access << 16 | type` (access: mknod 1,
//! read 2, write 4; type: block 1, char 2). The program allows an access when
//! `(ctx & value) == ctx` for the first of the exact, `major:*`, `*:minor`, `*:*` keys
//! present. A second program can never widen access, so the only additive path is an update
//! of that map: found by `BPF_PROG_QUERY` on the cgroup, then the program's map ids.

use super::bpf;
use super::device::{open_dir, prog_fd, DeviceCgroup};
use super::error::{CgroupError, Fault, MapOp};
use crate::node::Node;
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

const TYPE_CHAR: u32 = 2;
const ACC_READ: u32 = 2;
const ACC_WRITE: u32 = 4;
/// `rw` on a char device, as libvirt's program sees the access.
pub const RW_CHAR: u32 = ((ACC_READ | ACC_WRITE) << 16) | TYPE_CHAR;
const WILD: u64 = 0xffff_ffff;

pub fn key(major: u32, minor: u32) -> u64 {
    (u64::from(major) << 32) | u64::from(minor)
}

pub struct LibvirtMap {
    dir: PathBuf,
    /// libvirt's map and its capacity; `None`: no device program applies at all, so every
    /// device is already allowed.
    map: Option<(OwnedFd, u32)>,
    /// Entries this run changed: key → value before (None: absent).
    changed: HashMap<u64, Option<u32>>,
}

impl LibvirtMap {
    /// Opens the device map of the program attached to cgroup `dir`.
    pub fn open(dir: &Path) -> Result<LibvirtMap, CgroupError> {
        let e = |f: Fault| CgroupError::new(dir, f);
        let cg = open_dir(dir)?;
        let progs = bpf::prog_query(cg.as_fd(), bpf::BPF_CGROUP_DEVICE, 0)
            .map_err(|x| e(Fault::ProgQuery(x.into())))?;
        let mut found: Vec<(OwnedFd, u32)> = Vec::new();
        for &id in &progs {
            let prog = prog_fd(dir, id)?;
            let mids = bpf::prog_map_ids(prog.as_fd()).map_err(|x| {
                let errno = x.into();
                e(Fault::ProgInfo { id, errno })
            })?;
            for id in mids {
                let map = bpf::map_get_fd_by_id(id).map_err(|x| {
                    let errno = x.into();
                    e(Fault::MapFd { id, errno })
                })?;
                let (ty, ks, vs, max) = bpf::map_info(map.as_fd()).map_err(|x| {
                    let errno = x.into();
                    e(Fault::MapInfo { id, errno })
                })?;
                if ty == bpf::BPF_MAP_TYPE_HASH && ks == 8 && vs == 4 {
                    found.push((map, max));
                }
            }
        }
        match found.len() {
            1 => Ok(LibvirtMap {
                dir: dir.to_path_buf(),
                map: found.pop(),
                changed: HashMap::new(),
            }),
            0 if progs.is_empty() => {
                let eff = bpf::prog_query(
                    cg.as_fd(),
                    bpf::BPF_CGROUP_DEVICE,
                    bpf::BPF_F_QUERY_EFFECTIVE,
                )
                .map_err(|x| e(Fault::ProgQueryEffective(x.into())))?;
                if eff.is_empty() {
                    Ok(LibvirtMap {
                        dir: dir.to_path_buf(),
                        map: None,
                        changed: HashMap::new(),
                    })
                } else {
                    Err(e(Fault::ParentPrograms {
                        programs: eff.len(),
                    }))
                }
            }
            0 => Err(e(Fault::NoLibvirtMap {
                programs: progs.len(),
            })),
            maps => Err(e(Fault::SeveralMaps { maps })),
        }
    }

    fn entry_error(&self, op: MapOp, n: &Node, x: nix::errno::Errno) -> CgroupError {
        let (major, minor, errno) = (n.major, n.minor, x.into());
        let fault = Fault::MapEntry {
            op,
            major,
            minor,
            errno,
        };
        CgroupError::new(&self.dir, fault)
    }

    fn lookup(&self, k: u64) -> Result<Option<u32>, CgroupError> {
        let Some((map, _)) = &self.map else {
            return Ok(None);
        };
        bpf::map_lookup_u32(map.as_fd(), k)
            .map_err(|x| CgroupError::new(&self.dir, Fault::MapLookup(x.into())))
    }
}

impl DeviceCgroup for LibvirtMap {
    fn path(&self) -> &Path {
        &self.dir
    }

    fn is_allowed(&self, n: &Node) -> Result<bool, CgroupError> {
        if self.map.is_none() {
            return Ok(true);
        }
        // The program's order: first present key decides.
        for k in [
            key(n.major, n.minor),
            (u64::from(n.major) << 32) | WILD,
            (WILD << 32) | u64::from(n.minor),
            u64::MAX,
        ] {
            if let Some(v) = self.lookup(k)? {
                return Ok(v & RW_CHAR == RW_CHAR);
            }
        }
        Ok(false)
    }

    fn grants_exactly(&self, n: &Node) -> Result<bool, CgroupError> {
        Ok(self
            .lookup(key(n.major, n.minor))?
            .is_some_and(|v| v & RW_CHAR == RW_CHAR))
    }

    fn allow(&mut self, n: &Node) -> Result<(), CgroupError> {
        let k = key(n.major, n.minor);
        let before = self.lookup(k)?;
        let Some((map, max)) = &self.map else {
            return Ok(());
        };
        if before.is_none() {
            let used = bpf::map_keys(map.as_fd())
                .map_err(|x| CgroupError::new(&self.dir, Fault::MapCount(x.into())))?
                .len();
            if used as u32 >= *max {
                let max = *max;
                return Err(CgroupError::new(&self.dir, Fault::MapFull { used, max }));
            }
        }
        let value = before.unwrap_or(TYPE_CHAR) | RW_CHAR;
        bpf::map_update_u32(map.as_fd(), k, value)
            .map_err(|x| self.entry_error(MapOp::Update, n, x))?;
        self.changed.entry(k).or_insert(before);
        Ok(())
    }

    fn deny(&mut self, n: &Node) -> Result<(), CgroupError> {
        let k = key(n.major, n.minor);
        let Some((map, _)) = &self.map else {
            return Ok(());
        };
        self.changed.remove(&k);
        match bpf::map_delete(map.as_fd(), k) {
            Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
            Err(x) => Err(self.entry_error(MapOp::Delete, n, x)),
        }
    }

    fn revoke(&mut self, n: &Node) -> Result<(), CgroupError> {
        let k = key(n.major, n.minor);
        let Some((map, _)) = &self.map else {
            return Ok(());
        };
        let r = match self.changed.remove(&k) {
            Some(Some(old)) => bpf::map_update_u32(map.as_fd(), k, old),
            Some(None) => match bpf::map_delete(map.as_fd(), k) {
                Err(nix::errno::Errno::ENOENT) => Ok(()),
                r => r,
            },
            // Not added by this run: nothing of ours to take back.
            None => Ok(()),
        };
        r.map_err(|x| self.entry_error(MapOp::Revoke, n, x))
    }
}
