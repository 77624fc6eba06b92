//! The host's linker cache, `/etc/ld.so.cache`, in glibc's formats, read here (the host's
//! `ldconfig -p` is never run to read it): the old `ld.so-1.7.0` format, the new
//! `glibc-ld.so.cache1.1` one (glibc 2.32 and later write only it), and the two together
//! (`ldconfig -c compat`: the old table, then the new one at the next 8-byte boundary; the
//! new one is read when it is there, as glibc's loader does).
//!
//! The layouts (glibc `sysdeps/generic/dl-cache.h`), all little-endian on x86-64:
//!
//! - old: `"ld.so-1.7.0"` (11 bytes, padded to 12), `u32 nlibs`, then `nlibs` entries of
//!   `i32 flags, u32 key, u32 value` (12 bytes); strings follow the entries, and `key` and
//!   `value` are offsets from the end of the entries;
//! - new: `"glibc-ld.so.cache"` `"1.1"` (20 bytes), `u32 nlibs`, `u32 len_strings`, `u8
//!   flags` (2: little-endian, 3: big-endian), 3 bytes, `u32 extension_offset`, `3 × u32`
//!   (48 bytes in all), then `nlibs` entries of `i32 flags, u32 key, u32 value, u32
//!   osversion, u64 hwcap` (24 bytes); `key` and `value` are offsets from the new header.
//!
//! `key` is the library's SONAME, `value` the path of the link (or file) ldconfig found.

/// One library of the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    /// Its SONAME (`libcuda.so.1`).
    pub soname: String,
    /// Where ldconfig found it (`/usr/lib/x86_64-linux-gnu/libcuda.so.1`).
    pub path: String,
    /// glibc's flags: the type (`FLAG_ELF_LIBC6` 3) and the architecture (`0x0300`: x86-64).
    pub flags: i32,
}

/// glibc's `FLAG_ELF_LIBC6 | FLAG_X8664_LIB64`: a 64-bit x86-64 glibc library.
pub const X86_64_LIBC6: i32 = 0x0303;

impl CacheEntry {
    /// A 64-bit x86-64 library (not an i386 or x32 one).
    pub fn is_x86_64(&self) -> bool {
        self.flags == X86_64_LIBC6
    }
}

/// Which format a cache was read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Old,
    New,
    /// The old table followed by the new one (read: the new).
    Compat,
}

/// Why the bytes are no linker cache gpuhook can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LdCacheError {
    #[error("not a glibc linker cache (neither ld.so-1.7.0 nor glibc-ld.so.cache1.1)")]
    Magic,
    #[error("truncated: {0}")]
    Truncated(&'static str),
    #[error("a big-endian cache")]
    BigEndian,
    #[error("entry {index}: its {what} offset {offset} is outside the cache")]
    Offset {
        index: u32,
        what: &'static str,
        offset: u64,
    },
    #[error("entry {index}: its {what} is not UTF-8")]
    NotUtf8 { index: u32, what: &'static str },
    #[error("{0} entries: more than the cache can hold")]
    TooMany(u32),
}

const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const OLD_HEADER: usize = 16;
const OLD_ENTRY: usize = 12;
const NEW_HEADER: usize = 48;
const NEW_ENTRY: usize = 24;

fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    b.get(o..o + 4)
        .map(|x| u32::from_le_bytes(x.try_into().expect("4 bytes")))
}

/// The entries of a linker cache, in its order.
pub fn parse(b: &[u8]) -> Result<(Format, Vec<CacheEntry>), LdCacheError> {
    if b.starts_with(NEW_MAGIC) {
        return parse_new(b, 0).map(|e| (Format::New, e));
    }
    if !b.starts_with(OLD_MAGIC) {
        return Err(LdCacheError::Magic);
    }
    let n = u32_at(b, 12).ok_or(LdCacheError::Truncated("old header"))?;
    let end = (n as usize)
        .checked_mul(OLD_ENTRY)
        .and_then(|x| x.checked_add(OLD_HEADER))
        .filter(|e| *e <= b.len())
        .ok_or(LdCacheError::TooMany(n))?;
    // The new table, 8-byte aligned after the old entries (compat).
    let new_at = (end + 7) & !7;
    if b.get(new_at..).is_some_and(|r| r.starts_with(NEW_MAGIC)) {
        return parse_new(b, new_at).map(|e| (Format::Compat, e));
    }
    entries(b, OLD_HEADER, OLD_ENTRY, n, end).map(|e| (Format::Old, e))
}

/// The new table whose header is at `base`; its strings are at offsets from `base`.
fn parse_new(b: &[u8], base: usize) -> Result<Vec<CacheEntry>, LdCacheError> {
    let h = b
        .get(base..base + NEW_HEADER)
        .ok_or(LdCacheError::Truncated("new header"))?;
    let n = u32_at(h, 20).expect("in the header");
    if h[28] == 3 {
        return Err(LdCacheError::BigEndian);
    }
    let first = base + NEW_HEADER;
    (n as usize)
        .checked_mul(NEW_ENTRY)
        .and_then(|x| x.checked_add(first))
        .filter(|e| *e <= b.len())
        .ok_or(LdCacheError::TooMany(n))?;
    entries(b, first, NEW_ENTRY, n, base)
}

/// The `n` entries of `size` bytes from `first` (both formats begin an entry with its flags,
/// its name's and its path's offsets), their strings at offsets from `strings`.
fn entries(
    b: &[u8],
    first: usize,
    size: usize,
    n: u32,
    strings: usize,
) -> Result<Vec<CacheEntry>, LdCacheError> {
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let at = first + i as usize * size;
        let flags = u32_at(b, at).ok_or(LdCacheError::Truncated("entry"))? as i32;
        let key = u32_at(b, at + 4).ok_or(LdCacheError::Truncated("entry"))?;
        let value = u32_at(b, at + 8).ok_or(LdCacheError::Truncated("entry"))?;
        out.push(CacheEntry {
            soname: string(b, strings, key, i, "name")?,
            path: string(b, strings, value, i, "path")?,
            flags,
        });
    }
    Ok(out)
}

/// The NUL-terminated string at `base + off`.
fn string(
    b: &[u8],
    base: usize,
    off: u32,
    index: u32,
    what: &'static str,
) -> Result<String, LdCacheError> {
    let bad = || LdCacheError::Offset {
        index,
        what,
        offset: off as u64,
    };
    let start = base.checked_add(off as usize).ok_or_else(bad)?;
    let rest = b.get(start..).filter(|r| !r.is_empty()).ok_or_else(bad)?;
    let len = rest.iter().position(|&c| c == 0).ok_or_else(bad)?;
    String::from_utf8(rest[..len].to_vec()).map_err(|_| LdCacheError::NotUtf8 { index, what })
}

#[cfg(test)]
/// A cache in the new format with these (flags, name, path) entries, laid out as glibc's
/// ldconfig does (strings after the entries, offsets from the header).
pub(crate) fn new_cache(entries: &[(i32, &str, &str)]) -> Vec<u8> {
    let mut strings = Vec::new();
    let strings_at = NEW_HEADER + entries.len() * NEW_ENTRY;
    let mut offs = Vec::new();
    for (_, k, v) in entries {
        let ko = strings_at + strings.len();
        strings.extend_from_slice(k.as_bytes());
        strings.push(0);
        let vo = strings_at + strings.len();
        strings.extend_from_slice(v.as_bytes());
        strings.push(0);
        offs.push((ko as u32, vo as u32));
    }
    let mut b = NEW_MAGIC.to_vec();
    b.extend((entries.len() as u32).to_le_bytes());
    b.extend((strings.len() as u32).to_le_bytes());
    b.extend([2, 0, 0, 0]);
    b.extend([0u8; 16]);
    for ((f, _, _), (k, v)) in entries.iter().zip(offs) {
        b.extend(f.to_le_bytes());
        b.extend(k.to_le_bytes());
        b.extend(v.to_le_bytes());
        b.extend([0u8; 12]);
    }
    b.extend(strings);
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::Command;

    /// The same in the old format.
    fn old_cache(entries: &[(i32, &str, &str)]) -> Vec<u8> {
        let mut strings = Vec::new();
        let mut offs = Vec::new();
        for (_, k, v) in entries {
            let ko = strings.len();
            strings.extend_from_slice(k.as_bytes());
            strings.push(0);
            let vo = strings.len();
            strings.extend_from_slice(v.as_bytes());
            strings.push(0);
            offs.push((ko as u32, vo as u32));
        }
        let mut b = OLD_MAGIC.to_vec();
        b.push(0);
        b.extend((entries.len() as u32).to_le_bytes());
        for ((f, _, _), (k, v)) in entries.iter().zip(offs) {
            b.extend(f.to_le_bytes());
            b.extend(k.to_le_bytes());
            b.extend(v.to_le_bytes());
        }
        b.extend(strings);
        b
    }

    const LIBS: [(i32, &str, &str); 3] = [
        (
            0x0303,
            "libcuda.so.1",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        ),
        (
            0x0003,
            "libcuda.so.1",
            "/usr/lib/i386-linux-gnu/libcuda.so.1",
        ),
        (
            0x0303,
            "libnvidia-ml.so.1",
            "/usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.1",
        ),
    ];

    fn want() -> Vec<CacheEntry> {
        LIBS.iter()
            .map(|(f, k, v)| CacheEntry {
                soname: k.to_string(),
                path: v.to_string(),
                flags: *f,
            })
            .collect()
    }

    #[test]
    fn new_format_by_hand() {
        let (f, e) = parse(&new_cache(&LIBS)).unwrap();
        assert_eq!(f, Format::New);
        assert_eq!(e, want());
        assert!(e[0].is_x86_64() && !e[1].is_x86_64());
    }

    #[test]
    fn old_format_by_hand() {
        let (f, e) = parse(&old_cache(&LIBS)).unwrap();
        assert_eq!(f, Format::Old);
        assert_eq!(e, want());
    }

    #[test]
    fn broken_caches_are_errors_not_panics() {
        assert_eq!(parse(b"hello"), Err(LdCacheError::Magic));
        assert_eq!(parse(b""), Err(LdCacheError::Magic));
        let good = new_cache(&LIBS);
        // Every truncation is an error (or, cut inside the strings, a bad offset).
        for n in 0..good.len() {
            assert!(parse(&good[..n]).is_err(), "cut at {n}");
        }
        let old = old_cache(&LIBS);
        for n in 0..old.len() {
            assert!(parse(&old[..n]).is_err(), "old cut at {n}");
        }
        let mut huge = good.clone();
        huge[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(parse(&huge), Err(LdCacheError::TooMany(u32::MAX)));
        let mut big = good.clone();
        big[28] = 3;
        assert_eq!(parse(&big), Err(LdCacheError::BigEndian));
        let mut off = good;
        let at = NEW_HEADER + 8;
        off[at..at + 4].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
        assert!(matches!(
            parse(&off),
            Err(LdCacheError::Offset {
                index: 0,
                what: "path",
                ..
            })
        ));
    }

    /// A library built with `cc` (a SONAME) in `root/dir`, then the real `ldconfig -r root`
    /// writes the cache in `format`: what gpuhook reads is what `ldconfig -p` lists.
    fn ldconfig_cache(format: &str) -> Option<(Vec<u8>, String)> {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        let lib = root.join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        let src = root.join("f.c");
        std::fs::write(&src, "int f(void) { return 1; }\n").unwrap();
        for (so, file) in [
            ("libcuda.so.1", "libcuda.so.550.54.15"),
            ("libnvidia-ml.so.1", "libnvidia-ml.so.550.54.15"),
        ] {
            let ok = Command::new("cc")
                .args(["-shared", "-fPIC"])
                .arg(format!("-Wl,-soname,{so}"))
                .arg("-o")
                .arg(lib.join(file))
                .arg(&src)
                .status()
                .ok()?
                .success();
            assert!(ok, "cc");
        }
        let ldconfig = ["/sbin/ldconfig", "/usr/sbin/ldconfig"]
            .into_iter()
            .find(|p| Path::new(p).exists())?;
        let o = Command::new(ldconfig)
            .arg("-r")
            .arg(root)
            .args(["-c", format])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let p = Command::new(ldconfig)
            .arg("-r")
            .arg(root)
            .arg("-p")
            .output()
            .unwrap();
        Some((
            std::fs::read(root.join("etc/ld.so.cache")).unwrap(),
            String::from_utf8_lossy(&p.stdout).into_owned(),
        ))
    }

    #[test]
    fn what_the_real_ldconfig_writes_in_each_format() {
        for (format, want) in [
            ("new", Format::New),
            ("old", Format::Old),
            ("compat", Format::Compat),
        ] {
            let Some((bytes, listed)) = ldconfig_cache(format) else {
                panic!("cc and ldconfig are needed (build-essential, libc-bin)");
            };
            let (f, e) = parse(&bytes).unwrap_or_else(|x| panic!("{format}: {x}"));
            assert_eq!(f, want, "{format}");
            let mut got: Vec<(String, String)> = e
                .iter()
                .filter(|x| x.is_x86_64())
                .map(|x| (x.soname.clone(), x.path.clone()))
                .collect();
            got.sort();
            got.dedup();
            assert_eq!(
                got,
                vec![
                    (
                        "libcuda.so.1".to_string(),
                        "/usr/lib/x86_64-linux-gnu/libcuda.so.1".to_string()
                    ),
                    (
                        "libnvidia-ml.so.1".to_string(),
                        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1".to_string()
                    ),
                ],
                "{format}"
            );
            for (k, v) in &got {
                assert!(
                    listed.contains(&format!("{k} (libc6,x86-64) => {v}")),
                    "{format}: {listed}"
                );
            }
        }
    }
}
