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
//!
//! The cache is input gpuhook does not write: it is read bounded, in time and memory linear
//! in its size. The cache is at most [`MAX_SIZE`] bytes (a big host's is a few hundred KB),
//! holds at most [`MAX_ENTRIES`] entries, each string at most [`MAX_STRING`] bytes (a path:
//! `PATH_MAX` with its NUL); the entries borrow their strings from the bytes read (none is
//! copied, however many entries point at it), and the strings all entries name may come to at
//! most [`string_budget`] bytes: a cache whose entries point at one long string over and
//! over is refused, not read for minutes. Anything else out of bounds (an offset outside the
//! cache, a string without its NUL, a count the cache cannot hold) is an error too, never a
//! panic.

/// The largest cache read: 16 MiB.
pub const MAX_SIZE: usize = 16 << 20;
/// The most entries read (a real cache has a few thousand).
pub const MAX_ENTRIES: u32 = 1 << 18;
/// The longest name or path: `PATH_MAX` (4096) with its NUL.
pub const MAX_STRING: usize = 4095;

/// How many bytes of strings (each with its NUL) the entries of a cache of `size` bytes may
/// name in all: four times its size, and 64 KiB. ldconfig writes each path once (a name is
/// its own string or the tail of its path), so a real cache names fewer than its size.
pub fn string_budget(size: usize) -> usize {
    size.saturating_mul(4).saturating_add(64 << 10)
}

/// One library of the cache, its strings borrowed from the cache's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheEntry<'a> {
    /// Its SONAME (`libcuda.so.1`).
    pub soname: &'a str,
    /// Where ldconfig found it (`/usr/lib/x86_64-linux-gnu/libcuda.so.1`).
    pub path: &'a str,
    /// glibc's flags: the type (`FLAG_ELF_LIBC6` 3) and the architecture (`0x0300`: x86-64).
    pub flags: i32,
}

/// glibc's `FLAG_ELF_LIBC6 | FLAG_X8664_LIB64`: a 64-bit x86-64 glibc library.
pub const X86_64_LIBC6: i32 = 0x0303;

impl CacheEntry<'_> {
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

/// Why the bytes are no linker cache gpuhook reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LdCacheError {
    #[error("not a glibc linker cache (neither ld.so-1.7.0 nor glibc-ld.so.cache1.1)")]
    Magic,
    #[error("{0} bytes: more than the 16 MiB a linker cache is read up to")]
    TooBig(usize),
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
    #[error("entry {index}: its {what} at offset {offset} has no NUL before the cache ends")]
    Unterminated {
        index: u32,
        what: &'static str,
        offset: u64,
    },
    #[error("entry {index}: its {what} at offset {offset} is longer than 4095 bytes (PATH_MAX)")]
    TooLong {
        index: u32,
        what: &'static str,
        offset: u64,
    },
    #[error("entry {index}: its {what} is not UTF-8")]
    NotUtf8 { index: u32, what: &'static str },
    #[error("{0} entries: more than the cache can hold")]
    TooMany(u32),
    #[error("{0} entries: more than the 262144 a linker cache is read with")]
    Entries(u32),
    #[error("its entries name more than {budget} bytes of strings (at entry {index}) in {size} bytes: strings pointed at over and over")]
    Shared {
        index: u32,
        budget: usize,
        size: usize,
    },
}

const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const OLD_HEADER: usize = 16;
const OLD_ENTRY: usize = 12;
const NEW_HEADER: usize = 48;
const NEW_ENTRY: usize = 24;

fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    b.get(o..o.checked_add(4)?)
        .map(|x| u32::from_le_bytes(x.try_into().expect("4 bytes")))
}

/// The entries of a linker cache, in its order.
pub fn parse(b: &[u8]) -> Result<(Format, Vec<CacheEntry<'_>>), LdCacheError> {
    if b.len() > MAX_SIZE {
        return Err(LdCacheError::TooBig(b.len()));
    }
    if b.starts_with(NEW_MAGIC) {
        return parse_new(b, 0).map(|e| (Format::New, e));
    }
    if !b.starts_with(OLD_MAGIC) {
        return Err(LdCacheError::Magic);
    }
    let n = u32_at(b, 12).ok_or(LdCacheError::Truncated("old header"))?;
    let end = table_end(b, OLD_HEADER, OLD_ENTRY, n)?;
    // The new table, 8-byte aligned after the old entries (compat).
    let new_at = (end + 7) & !7;
    if b.get(new_at..).is_some_and(|r| r.starts_with(NEW_MAGIC)) {
        return parse_new(b, new_at).map(|e| (Format::Compat, e));
    }
    entries(b, OLD_HEADER, OLD_ENTRY, n, end).map(|e| (Format::Old, e))
}

/// Where a table of `n` entries of `size` bytes from `first` ends: within the cache, and
/// no more than [`MAX_ENTRIES`].
fn table_end(b: &[u8], first: usize, size: usize, n: u32) -> Result<usize, LdCacheError> {
    let end = (n as usize)
        .checked_mul(size)
        .and_then(|x| x.checked_add(first))
        .filter(|e| *e <= b.len())
        .ok_or(LdCacheError::TooMany(n))?;
    if n > MAX_ENTRIES {
        return Err(LdCacheError::Entries(n));
    }
    Ok(end)
}

/// The new table whose header is at `base`; its strings are at offsets from `base`.
fn parse_new(b: &[u8], base: usize) -> Result<Vec<CacheEntry<'_>>, LdCacheError> {
    let h = b
        .get(base..base + NEW_HEADER)
        .ok_or(LdCacheError::Truncated("new header"))?;
    let n = u32_at(h, 20).expect("in the header");
    if h[28] == 3 {
        return Err(LdCacheError::BigEndian);
    }
    let first = base + NEW_HEADER;
    table_end(b, first, NEW_ENTRY, n)?;
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
) -> Result<Vec<CacheEntry<'_>>, LdCacheError> {
    let mut s = Strings {
        b,
        base: strings,
        named: 0,
        budget: string_budget(b.len()),
    };
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let at = first + i as usize * size;
        let flags = u32_at(b, at).ok_or(LdCacheError::Truncated("entry"))? as i32;
        let key = u32_at(b, at + 4).ok_or(LdCacheError::Truncated("entry"))?;
        let value = u32_at(b, at + 8).ok_or(LdCacheError::Truncated("entry"))?;
        out.push(CacheEntry {
            soname: s.at(key, i, "name")?,
            path: s.at(value, i, "path")?,
            flags,
        });
    }
    Ok(out)
}

/// The strings of a table: at offsets from `base`, each looked at no further than
/// [`MAX_STRING`] bytes, all of them no more than `budget` bytes.
struct Strings<'a> {
    b: &'a [u8],
    base: usize,
    named: usize,
    budget: usize,
}

impl<'a> Strings<'a> {
    /// The NUL-terminated string at `base + off`, borrowed.
    fn at(&mut self, off: u32, index: u32, what: &'static str) -> Result<&'a str, LdCacheError> {
        let offset = off as u64;
        let start = self
            .base
            .checked_add(off as usize)
            .filter(|s| *s < self.b.len())
            .ok_or(LdCacheError::Offset {
                index,
                what,
                offset,
            })?;
        let window = &self.b[start..self.b.len().min(start + MAX_STRING + 1)];
        let len = match window.iter().position(|&c| c == 0) {
            Some(len) => len,
            None if window.len() > MAX_STRING => {
                return Err(LdCacheError::TooLong {
                    index,
                    what,
                    offset,
                })
            }
            None => {
                return Err(LdCacheError::Unterminated {
                    index,
                    what,
                    offset,
                })
            }
        };
        self.named += len + 1;
        if self.named > self.budget {
            return Err(LdCacheError::Shared {
                index,
                budget: self.budget,
                size: self.b.len(),
            });
        }
        std::str::from_utf8(&window[..len]).map_err(|_| LdCacheError::NotUtf8 { index, what })
    }
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

    fn want() -> Vec<CacheEntry<'static>> {
        LIBS.iter()
            .map(|&(flags, soname, path)| CacheEntry {
                soname,
                path,
                flags,
            })
            .collect()
    }

    #[test]
    fn new_format_by_hand() {
        let b = new_cache(&LIBS);
        let (f, e) = parse(&b).unwrap();
        assert_eq!(f, Format::New);
        assert_eq!(e, want());
        assert!(e[0].is_x86_64() && !e[1].is_x86_64());
    }

    #[test]
    fn old_format_by_hand() {
        let b = old_cache(&LIBS);
        let (f, e) = parse(&b).unwrap();
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

    /// The security review's crafted cache (new format): `size` bytes, half of them entries
    /// whose name and path all point at one string, the other half that string (`long`
    /// bytes: the rest, or as given; no more entries than are read).
    pub(crate) fn crafted(size: usize, long: Option<usize>) -> Vec<u8> {
        let n = (size / 48).min(MAX_ENTRIES as usize);
        let at = NEW_HEADER + n * NEW_ENTRY;
        let long = long.unwrap_or(size - at - 1);
        let mut b = NEW_MAGIC.to_vec();
        b.extend((n as u32).to_le_bytes());
        b.extend(((long + 1) as u32).to_le_bytes());
        b.extend([2, 0, 0, 0]);
        b.extend([0u8; 16]);
        for _ in 0..n {
            b.extend(X86_64_LIBC6.to_le_bytes());
            b.extend((at as u32).to_le_bytes());
            b.extend((at as u32).to_le_bytes());
            b.extend([0u8; 12]);
        }
        b.push(b'/');
        b.resize(at + long, b'a');
        b.push(0);
        b.resize(size, 0);
        b
    }

    #[test]
    fn the_crafted_cache_is_refused_at_its_first_entry() {
        for size in [320 << 10, 1 << 20, MAX_SIZE] {
            let b = crafted(size, None);
            let n = (size / 48).min(MAX_ENTRIES as usize);
            let at = (NEW_HEADER + n * NEW_ENTRY) as u64;
            let t = std::time::Instant::now();
            assert_eq!(
                parse(&b),
                Err(LdCacheError::TooLong {
                    index: 0,
                    what: "name",
                    offset: at
                }),
                "{size}"
            );
            assert!(t.elapsed().as_millis() < 100, "{size}: {:?}", t.elapsed());
        }
    }

    #[test]
    fn strings_named_over_and_over_are_refused_past_the_budget_in_linear_time() {
        // Each string as long as a path may be, every entry naming it twice: the entries
        // would name 340 times the cache's size.
        for size in [64 << 10, 1 << 20, MAX_SIZE] {
            let b = crafted(size, Some(MAX_STRING));
            let t = std::time::Instant::now();
            let e = parse(&b).unwrap_err();
            let LdCacheError::Shared { index, budget, .. } = e else {
                panic!("{size}: {e}");
            };
            assert_eq!(budget, string_budget(size));
            assert_eq!(index as usize, budget / (2 * (MAX_STRING + 1)), "{size}");
            assert!(t.elapsed().as_secs() < 2, "{size}: {:?}", t.elapsed());
        }
        // Below the budget, the same string is borrowed, never copied.
        let b = crafted(4096, Some(100));
        let (_, e) = parse(&b).unwrap();
        assert_eq!(e.len(), 85);
        assert!(e.iter().all(|x| std::ptr::eq(x.path, e[0].path)));
        assert_eq!(e[0].path.len(), 100);
    }

    #[test]
    fn each_bound_is_an_error_naming_the_fault() {
        let long = "x".repeat(MAX_STRING);
        let b = new_cache(&[(X86_64_LIBC6, "libcuda.so.1", &format!("/{long}"))]);
        assert_eq!(
            parse(&b).unwrap_err().to_string(),
            "entry 0: its path at offset 85 is longer than 4095 bytes (PATH_MAX)"
        );
        // A path of exactly 4095 bytes is read.
        let b = new_cache(&[(X86_64_LIBC6, "libcuda.so.1", &long)]);
        assert_eq!(parse(&b).unwrap().1[0].path.len(), MAX_STRING);
        let mut cut = new_cache(&LIBS);
        cut.pop();
        assert_eq!(
            parse(&cut).unwrap_err().to_string(),
            "entry 2: its path at offset 240 has no NUL before the cache ends"
        );
        let big = vec![0u8; MAX_SIZE + 1];
        assert_eq!(
            parse(&big).unwrap_err().to_string(),
            "16777217 bytes: more than the 16 MiB a linker cache is read up to"
        );
        // More entries than read, in a cache that holds them.
        let n = MAX_ENTRIES + 1;
        let mut many = NEW_MAGIC.to_vec();
        many.extend(n.to_le_bytes());
        many.resize(NEW_HEADER + n as usize * NEW_ENTRY, 0);
        many[28] = 2;
        assert_eq!(
            parse(&many).unwrap_err().to_string(),
            "262145 entries: more than the 262144 a linker cache is read with"
        );
        // An offset past the end, an old cache whose count does not fit.
        let mut off = new_cache(&LIBS);
        let at = NEW_HEADER + 4;
        off[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            parse(&off).unwrap_err().to_string(),
            "entry 0: its name offset 4294967295 is outside the cache"
        );
        let mut old = old_cache(&LIBS);
        old[12..16].copy_from_slice(&1000u32.to_le_bytes());
        assert_eq!(
            parse(&old).unwrap_err().to_string(),
            "1000 entries: more than the cache can hold"
        );
    }

    #[test]
    fn this_machines_cache_reads_as_ldconfig_lists_it() {
        let Ok(b) = std::fs::read("/etc/ld.so.cache") else {
            panic!("/etc/ld.so.cache is needed (libc-bin)");
        };
        assert!(b.len() < MAX_SIZE);
        let (_, e) = parse(&b).unwrap();
        let ldconfig = ["/sbin/ldconfig", "/usr/sbin/ldconfig"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("ldconfig");
        let p = Command::new(ldconfig).arg("-p").output().unwrap();
        let listed = String::from_utf8_lossy(&p.stdout);
        // "N libs found in cache `/etc/ld.so.cache'"
        let n: usize = listed
            .lines()
            .next()
            .and_then(|l| l.split_whitespace().next())
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("{listed}"));
        assert_eq!(e.len(), n);
        for x in &e {
            assert!(listed.contains(&format!("\t{} (", x.soname)), "{x:?}");
            assert!(listed.contains(&format!(") => {}\n", x.path)), "{x:?}");
        }
        let named: usize = e.iter().map(|x| x.soname.len() + x.path.len() + 2).sum();
        assert!(named < b.len(), "{named} bytes named in {}", b.len());
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
                .map(|x| (x.soname.to_string(), x.path.to_string()))
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
