//! The SONAME links `update-ldcache` would make, from the host libraries' ELF headers.

use super::model::{Link, Plan};
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

/// One program header of an ELF file: (type, file offset, virtual address, file size).
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    pub kind: u32,
    pub offset: u64,
    pub vaddr: u64,
    pub filesz: u64,
}

/// Why a file's program headers cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// The file's header or its program headers cannot be read.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a 64-bit little-endian ELF file")]
    NotElf64,
    #[error("bad program header size")]
    HeaderSize,
    #[error("more than 256 program headers")]
    TooManyHeaders,
}

/// The program headers of a 64-bit little-endian ELF file (at most 256).
pub fn program_headers(f: &std::fs::File) -> Result<Vec<Segment>, ElfError> {
    use std::os::unix::fs::FileExt;
    let mut h = [0u8; 64];
    f.read_exact_at(&mut h, 0)?;
    if &h[..4] != b"\x7fELF" || h[4] != 2 || h[5] != 1 {
        return Err(ElfError::NotElf64);
    }
    let (phoff, phentsize, phnum) = (u64_at(&h, 0x20), u16_at(&h, 0x36), u16_at(&h, 0x38));
    if phentsize < 56 {
        return Err(ElfError::HeaderSize);
    }
    if phnum > 256 {
        return Err(ElfError::TooManyHeaders);
    }
    let mut ph = vec![0u8; (phentsize * phnum) as usize];
    f.read_exact_at(&mut ph, phoff)?;
    Ok(ph
        .chunks(phentsize as usize)
        .map(|p| Segment {
            kind: u32::from_le_bytes(p[..4].try_into().expect("4")),
            offset: u64_at(p, 8),
            vaddr: u64_at(p, 16),
            filesz: u64_at(p, 32),
        })
        .collect())
}

fn u16_at(b: &[u8], o: usize) -> u64 {
    u16::from_le_bytes([b[o], b[o + 1]]) as u64
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8"))
}

/// The `DT_SONAME` of a 64-bit little-endian ELF shared object (`None`: not one, or none).
pub fn soname(path: &Path) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).ok()?;
    let headers = program_headers(&f).ok()?;
    let d = headers.iter().find(|s| s.kind == 2)?;
    if d.filesz > 1 << 20 {
        return None;
    }
    let mut dynamic = vec![0u8; d.filesz as usize];
    f.read_exact_at(&mut dynamic, d.offset).ok()?;
    let (mut strtab, mut so) = (None, None);
    for e in dynamic.chunks_exact(16) {
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
        .find(|s| s.kind == 1 && s.vaddr <= strtab && strtab < s.vaddr + s.filesz)
        .map(|s| strtab - s.vaddr + s.offset)?;
    let mut name = [0u8; 256];
    let n = f.read_at(&mut name, off.checked_add(so)?).ok()?;
    let end = name[..n].iter().position(|&c| c == 0)?;
    let so = std::str::from_utf8(&name[..end]).ok()?;
    (!so.is_empty()).then(|| so.to_string())
}
