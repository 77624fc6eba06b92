//! The SONAME links `update-ldcache` would make, from the host libraries' ELF headers.

use super::{Link, Plan};
use std::path::Path;

impl Plan {
    /// `update-ldcache` makes each library's SONAME link in its folder (`libcuda.so.1 ->
    /// libcuda.so.535.129.03`), as `ldconfig` does. gpuhook makes these links itself, for the
    /// libraries the specs mount into a cache folder, from the SONAME of the host's own file
    /// (the spec's `hostPath`, trusted as the spec is): the container's `ldconfig` then runs
    /// with `-X` and writes nothing in the container's root.
    pub(super) fn soname_links(&mut self) {
        if self.ld_folders.is_empty() {
            return;
        }
        let mut add = Vec::new();
        for m in self.mounts.iter().filter(|m| !m.dir) {
            let Some((folder, file)) = m.target.rsplit_once('/') else {
                continue;
            };
            if !self
                .ld_folders
                .iter()
                .any(|f| f.trim_end_matches('/') == folder)
            {
                continue;
            }
            let Some(so) = soname(Path::new(&m.source)) else {
                continue;
            };
            let link = format!("{folder}/{so}");
            if so == file
                || so.contains('/')
                || self.links.iter().chain(&add).any(|l: &Link| l.link == link)
                || self.mounts.iter().any(|x| x.target == link)
            {
                continue;
            }
            add.push(Link {
                target: file.to_string(),
                link,
            });
        }
        self.links.extend(add);
    }
}

/// The `DT_SONAME` of a 64-bit little-endian ELF shared object (`None`: not one, or none).
pub fn soname(path: &Path) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).ok()?;
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as u64;
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
    let mut h = [0u8; 64];
    f.read_exact_at(&mut h, 0).ok()?;
    if &h[..4] != b"\x7fELF" || h[4] != 2 || h[5] != 1 {
        return None;
    }
    let (phoff, phentsize, phnum) = (u64_at(&h, 0x20), u16_at(&h, 0x36), u16_at(&h, 0x38));
    if phentsize < 56 || phnum > 256 {
        return None;
    }
    let mut ph = vec![0u8; (phentsize * phnum) as usize];
    f.read_exact_at(&mut ph, phoff).ok()?;
    let headers: Vec<&[u8]> = ph.chunks(phentsize as usize).collect();
    // (type, offset, vaddr, filesz) of each program header.
    let seg = |p: &[u8]| {
        (
            u32::from_le_bytes(p[..4].try_into().expect("4")),
            u64_at(p, 8),
            u64_at(p, 16),
            u64_at(p, 32),
        )
    };
    let (_, dyn_off, _, dyn_size) = headers.iter().map(|p| seg(p)).find(|s| s.0 == 2)?;
    if dyn_size > 1 << 20 {
        return None;
    }
    let mut d = vec![0u8; dyn_size as usize];
    f.read_exact_at(&mut d, dyn_off).ok()?;
    let (mut strtab, mut so) = (None, None);
    for e in d.chunks_exact(16) {
        match u64_at(e, 0) {
            0 => break,
            5 => strtab = Some(u64_at(e, 8)),
            14 => so = Some(u64_at(e, 8)),
            _ => {}
        }
    }
    let (strtab, so) = (strtab?, so?);
    // The string table's address → its place in the file, through the load segment.
    let off = headers
        .iter()
        .map(|p| seg(p))
        .find(|s| s.0 == 1 && s.2 <= strtab && strtab < s.2 + s.3)
        .map(|s| strtab - s.2 + s.1)?;
    let mut name = [0u8; 256];
    let n = f.read_at(&mut name, off.checked_add(so)?).ok()?;
    let end = name[..n].iter().position(|&c| c == 0)?;
    let so = std::str::from_utf8(&name[..end]).ok()?;
    (!so.is_empty()).then(|| so.to_string())
}
