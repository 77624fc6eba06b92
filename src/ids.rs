//! Identifiers of GPUs and domains, shared by every part that reads or prints them:
//! GPU vendors, PCI addresses, the units GPUs are reserved in (whole or MIG instance), UUIDs.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Vendor {
    Nvidia,
    Amd,
    Intel,
}

impl Vendor {
    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
            Vendor::Intel => "intel",
        }
    }
    pub fn from_name(s: &str) -> Option<Vendor> {
        match s.to_ascii_lowercase().as_str() {
            "nvidia" => Some(Vendor::Nvidia),
            "amd" => Some(Vendor::Amd),
            "intel" => Some(Vendor::Intel),
            _ => None,
        }
    }
    pub fn from_pci_id(id: u16) -> Option<Vendor> {
        match id {
            0x10de => Some(Vendor::Nvidia),
            0x1002 => Some(Vendor::Amd),
            0x8086 => Some(Vendor::Intel),
            _ => None,
        }
    }
}

impl fmt::Display for Vendor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Normalizes a PCI address to `dddd:bb:dd.f`, lowercase; accepts `bb:dd.f`.
pub fn normalize_pci(s: &str) -> Option<String> {
    Pci::normalize(s).map(|p| p.to_string())
}

/// The length of a pod allocation's ID (`gpuhook.io/allocation`): 128 random bits in hex.
pub const ALLOC_ID_LEN: usize = 32;

/// Whether `s` is a pod allocation's ID as kubelet's device plugin makes them: 32 lowercase
/// hex digits.
pub fn is_alloc_id(s: &str) -> bool {
    s.len() == ALLOC_ID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Normalizes a UUID to lowercase `8-4-4-4-12` hex; `None` when it is not one.
pub fn normalize_uuid(s: &str) -> Option<String> {
    let s = s.trim().to_ascii_lowercase();
    let b = s.as_bytes();
    let ok = b.len() == 36
        && b.iter().enumerate().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                *c == b'-'
            } else {
                c.is_ascii_hexdigit()
            }
        });
    ok.then_some(s)
}

/// A PCI address as the kernel names it (`dddd:bb:dd.f`, lowercase hex): the name of a GPU in
/// every listing, message and file.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pci([u8; 12]);

/// A name that is not a GPU unit (a PCI address, `PCI/giG/ciC`, `PCI/slotN`, `PCI/mdev-UUID`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a GPU unit (PCI address, PCI/giG/ciC, PCI/slotN or PCI/mdev-UUID): {0:?}")]
pub struct UnitError(pub String);

impl Pci {
    /// A PCI address as the user or a file may write it: trimmed, any case, `bb:dd.f` for
    /// domain 0 (see [`normalize_pci`]).
    pub fn normalize(s: &str) -> Option<Pci> {
        let s = s.trim().to_ascii_lowercase();
        let full = if s.len() == 7 { format!("0000:{s}") } else { s };
        full.parse().ok()
    }

    pub fn as_str(&self) -> &str {
        // The bytes are checked ASCII when the address is made (`FromStr`).
        std::str::from_utf8(&self.0).expect("a PCI address is ASCII")
    }
}

impl std::str::FromStr for Pci {
    type Err = UnitError;
    /// Exactly the kernel's form: `0000:3b:00.0`.
    fn from_str(s: &str) -> Result<Pci, UnitError> {
        let b = s.as_bytes();
        let hex = |r: std::ops::Range<usize>| {
            b[r].iter()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
        };
        let ok = b.len() == 12
            && hex(0..4)
            && b[4] == b':'
            && hex(5..7)
            && b[7] == b':'
            && hex(8..10)
            && b[10] == b'.'
            && (b'0'..=b'7').contains(&b[11]);
        match b.try_into() {
            Ok(a) if ok => Ok(Pci(a)),
            _ => Err(UnitError(s.to_owned())),
        }
    }
}

impl std::ops::Deref for Pci {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Pci {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for Pci {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl fmt::Debug for Pci {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl PartialEq<str> for Pci {
    fn eq(&self, o: &str) -> bool {
        self.as_str() == o
    }
}

impl PartialEq<&str> for Pci {
    fn eq(&self, o: &&str) -> bool {
        self.as_str() == *o
    }
}

impl PartialEq<String> for Pci {
    fn eq(&self, o: &String) -> bool {
        self.as_str() == o
    }
}

impl serde::Serialize for Pci {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Pci {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Pci, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What a container is given, reserved and freed as: a whole GPU, or one MIG compute
/// instance of a GPU (compute instance `ci` of GPU instance `gi`). Written as the GPU's PCI
/// address (`0000:3b:00.0`) or `0000:3b:00.0/gi1/ci0`, in the state file, listings and
/// messages alike; ordered as those names are (so maps of units keep the order of their
/// names, and the units of one GPU, or of one GPU instance, are neighbours).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Gpu(Pci),
    Mig {
        pci: Pci,
        gi: u32,
        ci: u32,
    },
    /// One of the `replicas` slots of a shareable GPU (docs/guides/sharing.md), written
    /// `0000:04:00.0/slot1`: its holder gets the GPU's nodes, as a whole GPU's would.
    Slot {
        pci: Pci,
        slot: u32,
    },
    /// A mediated device (vGPU) of the GPU, held by the virtual machine it is passed
    /// through to, written `0000:3b:00.0/mdev-4b20d080-1b54-4048-85b3-a6a62d165c01`: the
    /// GPU's mediated devices are shared among virtual machines, and while one is held the
    /// GPU is given to no one else (whole, as a slot or as MIG instances).
    Mdev {
        gpu: PciKey,
        mdev: MdevId,
    },
}

/// A PCI address in four bytes (domain, bus, device, function: a real function's device
/// number is below 32), so that a unit that also carries a mediated device's UUID stays as
/// small as the others; ordered as the addresses are.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciKey(u32);

impl PciKey {
    /// The address's key; `None` for a device number above `0x1f` (no real function).
    pub fn of(p: Pci) -> Option<PciKey> {
        let s = p.as_str();
        let hex = |r: std::ops::Range<usize>| u32::from_str_radix(&s[r], 16).ok();
        let (d, b, dev, f) = (hex(0..4)?, hex(5..7)?, hex(8..10)?, hex(11..12)?);
        (dev < 32).then_some(PciKey(d << 16 | b << 8 | dev << 3 | f))
    }

    pub fn pci(self) -> Pci {
        let k = self.0;
        format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            k >> 16,
            (k >> 8) & 0xff,
            (k >> 3) & 0x1f,
            k & 7
        )
        .parse()
        .expect("a key's address is one")
    }
}

/// A mediated device's UUID (`/sys/bus/mdev/devices/UUID`), kept as its 16 bytes so that a
/// [`Unit`] stays `Copy` and small; written in libvirt's lowercase `8-4-4-4-12` form.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MdevId([u8; 16]);

impl MdevId {
    /// A UUID in any case (trimmed); `None` when it is not one.
    pub fn parse(s: &str) -> Option<MdevId> {
        let u = normalize_uuid(s)?;
        let hex: String = u.chars().filter(|c| *c != '-').collect();
        u128::from_str_radix(&hex, 16)
            .ok()
            .map(|n| MdevId(n.to_be_bytes()))
    }
}

impl fmt::Display for MdevId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = format!("{:032x}", u128::from_be_bytes(self.0));
        write!(
            f,
            "{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        )
    }
}

impl fmt::Debug for MdevId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Unit {
    /// The GPU's PCI address (a MIG instance's is its GPU's).
    pub fn pci(&self) -> Pci {
        match *self {
            Unit::Gpu(p) | Unit::Mig { pci: p, .. } | Unit::Slot { pci: p, .. } => p,
            Unit::Mdev { gpu, .. } => gpu.pci(),
        }
    }

    /// Mediated device `mdev` of the GPU at `pci`; `None` for an address no real function
    /// has.
    pub fn mdev(pci: Pci, mdev: MdevId) -> Option<Unit> {
        PciKey::of(pci).map(|gpu| Unit::Mdev { gpu, mdev })
    }

    /// Whether it is a mediated device of a GPU (a VM's vGPU).
    pub fn is_mdev(&self) -> bool {
        matches!(self, Unit::Mdev { .. })
    }

    /// The first mediated device of `pci` in [`Unit`]'s order: every mediated device of the
    /// GPU follows it.
    pub fn first_mdev(pci: Pci) -> Unit {
        // An address no real function has: every unit of its GPU but the GPU follows this.
        Unit::mdev(pci, MdevId([0; 16])).unwrap_or(Unit::first_mig(pci))
    }

    /// Whether it is a slot of a shared GPU.
    pub fn is_slot(&self) -> bool {
        matches!(self, Unit::Slot { .. })
    }

    /// The first slot of `pci` in [`Unit`]'s order: every slot of the GPU follows it.
    pub fn first_slot(pci: Pci) -> Unit {
        Unit::Slot { pci, slot: 0 }
    }

    pub fn is_mig(&self) -> bool {
        matches!(self, Unit::Mig { .. })
    }

    /// The part of a MIG unit's name after its GPU's, `gi1/ci0` (listings under its GPU).
    pub fn instance(&self) -> Option<Instance> {
        match *self {
            Unit::Gpu(_) | Unit::Slot { .. } | Unit::Mdev { .. } => None,
            Unit::Mig { gi, ci, .. } => Some(Instance { gi, ci }),
        }
    }

    /// The GPU instance of a MIG unit.
    pub fn gi(&self) -> Option<u32> {
        match *self {
            Unit::Gpu(_) | Unit::Slot { .. } | Unit::Mdev { .. } => None,
            Unit::Mig { gi, .. } => Some(gi),
        }
    }

    /// The first unit of GPU instance `gi` of `pci` in [`Unit`]'s order: the units of that
    /// GPU instance follow it.
    pub fn first_of_gi(pci: Pci, gi: u32) -> Unit {
        Unit::Mig { pci, gi, ci: 0 }
    }

    /// The first MIG unit of `pci` in [`Unit`]'s order: every MIG unit of the GPU follows it.
    pub fn first_mig(pci: Pci) -> Unit {
        Unit::first_of_gi(pci, 0)
    }

    /// Units as messages list them: `0000:3b:00.0,0000:3c:00.0/gi1/ci0` (with `sep` `,`).
    pub fn join(units: &[Unit], sep: &str) -> String {
        let mut s = String::with_capacity(units.len() * 24);
        for (i, u) in units.iter().enumerate() {
            if i > 0 {
                s.push_str(sep);
            }
            fmt::Write::write_fmt(&mut s, format_args!("{u}")).expect("a String takes any text");
        }
        s
    }
}

/// A unit and a name: whether the name is the unit's (exactly as the unit writes it).
impl PartialEq<str> for Unit {
    fn eq(&self, o: &str) -> bool {
        o.parse::<Unit>().is_ok_and(|u| u == *self)
    }
}

impl PartialEq<&str> for Unit {
    fn eq(&self, o: &&str) -> bool {
        *self == **o
    }
}

/// A MIG unit's compute instance `ci` of GPU instance `gi`, named `gi1/ci0` (its GPU's
/// address left out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instance {
    pub gi: u32,
    pub ci: u32,
}

impl fmt::Display for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gi{}/ci{}", self.gi, self.ci)
    }
}

impl From<Pci> for Unit {
    fn from(p: Pci) -> Unit {
        Unit::Gpu(p)
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unit::Gpu(p) => f.pad(p.as_str()),
            Unit::Mig { pci, gi, ci } if f.width().is_none() && f.precision().is_none() => {
                write!(f, "{pci}/{}", Instance { gi: *gi, ci: *ci })
            }
            Unit::Mig { pci, gi, ci } => f.pad(&format!("{pci}/{}", Instance { gi: *gi, ci: *ci })),
            Unit::Slot { pci, slot } if f.width().is_none() && f.precision().is_none() => {
                write!(f, "{pci}/slot{slot}")
            }
            Unit::Slot { pci, slot } => f.pad(&format!("{pci}/slot{slot}")),
            Unit::Mdev { gpu, mdev } => f.pad(&format!("{}/mdev-{mdev}", gpu.pci())),
        }
    }
}

impl fmt::Debug for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_string(), f)
    }
}

impl std::str::FromStr for Unit {
    type Err = UnitError;
    /// Exactly what [`Unit`]'s `Display` writes: `0000:3b:00.0`, `0000:3b:00.0/gi1/ci0`
    /// (decimal numbers without leading zeros).
    fn from_str(s: &str) -> Result<Unit, UnitError> {
        let bad = || UnitError(s.to_owned());
        let Some((pci, rest)) = s.split_once('/') else {
            return s.parse().map(Unit::Gpu).map_err(|_| bad());
        };
        let pci: Pci = pci.parse().map_err(|_| bad())?;
        let num = |d: &str| {
            let canonical = !d.is_empty()
                && d.bytes().all(|c| c.is_ascii_digit())
                && (d == "0" || !d.starts_with('0'));
            canonical.then(|| d.parse::<u32>().ok()).flatten()
        };
        if let Some(n) = rest.strip_prefix("slot") {
            return num(n).map(|slot| Unit::Slot { pci, slot }).ok_or_else(bad);
        }
        if let Some(u) = rest.strip_prefix("mdev-") {
            // Exactly as it is written: lowercase, no space.
            return match MdevId::parse(u) {
                Some(mdev) if mdev.to_string() == u => Unit::mdev(pci, mdev).ok_or_else(bad),
                _ => Err(bad()),
            };
        }
        let (gi, ci) = rest
            .strip_prefix("gi")
            .and_then(|r| r.split_once("/ci"))
            .ok_or_else(bad)?;
        match (num(gi), num(ci)) {
            (Some(gi), Some(ci)) => Ok(Unit::Mig { pci, gi, ci }),
            _ => Err(bad()),
        }
    }
}

/// Compares two numbers as their decimal names compare (`10` before `2`).
fn cmp_decimal(a: u32, b: u32) -> std::cmp::Ordering {
    fn digits(mut n: u32, buf: &mut [u8; 10]) -> &[u8] {
        let mut i = buf.len();
        loop {
            i -= 1;
            buf[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return &buf[i..];
            }
        }
    }
    let (mut x, mut y) = ([0; 10], [0; 10]);
    digits(a, &mut x).cmp(digits(b, &mut y))
}

impl Ord for Unit {
    /// The order of the names: a GPU, then its MIG units (`PCI/gi…` follows `PCI`), by GPU
    /// instance then compute instance, each number ordered as its decimal name (a `/` sorts
    /// before any digit, so `gi1/…` comes before `gi10/…`, which comes before `gi2/…`).
    /// A GPU's mediated devices (`PCI/mdev-…`, by UUID) come before its slots (`m` sorts
    /// before `s`), and its slots (`PCI/slot…`) follow its MIG units (`g` sorts before `s`).
    fn cmp(&self, o: &Unit) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        let key = |u: &Unit| match *u {
            Unit::Gpu(p) => (p, 0, 0, 0, [0; 16]),
            Unit::Mig { pci, gi, ci } => (pci, 1, gi, ci, [0; 16]),
            Unit::Mdev { gpu, mdev } => (gpu.pci(), 2, 0, 0, mdev.0),
            Unit::Slot { pci, slot } => (pci, 3, slot, 0, [0; 16]),
        };
        let ((pa, ka, a1, a2, am), (pb, kb, b1, b2, bm)) = (key(self), key(o));
        pa.cmp(&pb).then(ka.cmp(&kb)).then_with(|| match ka {
            0 => Ordering::Equal,
            2 => am.cmp(&bm),
            _ => cmp_decimal(a1, b1).then(cmp_decimal(a2, b2)),
        })
    }
}

impl PartialOrd for Unit {
    fn partial_cmp(&self, o: &Unit) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl serde::Serialize for Unit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Unit {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Unit, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(s: &str) -> Unit {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn units_print_and_parse_as_before() {
        for s in [
            "0000:3b:00.0",
            "0000:3b:00.0/gi1/ci0",
            "abcd:ff:1f.7/gi0/ci0",
            "0000:3b:00.0/gi14/ci7",
            "0000:3b:00.0/gi4294967295/ci0",
            "0000:04:00.0/slot0",
            "0000:04:00.0/slot63",
        ] {
            assert_eq!(u(s).to_string(), s);
            let j = serde_json::to_string(&u(s)).unwrap();
            assert_eq!(j, format!("\"{s}\""));
            assert_eq!(serde_json::from_str::<Unit>(&j).unwrap(), u(s));
        }
        let m = u("0000:3b:00.0/gi1/ci2");
        assert_eq!(
            m,
            Unit::Mig {
                pci: "0000:3b:00.0".parse().unwrap(),
                gi: 1,
                ci: 2
            }
        );
        assert_eq!(m.pci(), "0000:3b:00.0");
        assert!(m.is_mig() && !u("0000:3b:00.0").is_mig());
        assert_eq!((m.gi(), u("0000:3b:00.0").gi()), (Some(1), None));
        assert_eq!(
            format!("{m:?} {:>14}|", u("0000:3b:00.0")),
            "\"0000:3b:00.0/gi1/ci2\"   0000:3b:00.0|"
        );
    }

    /// A VM's mediated device of a GPU: written with the mdev's UUID in lowercase, parsed
    /// only so; ordered after the GPU's MIG units and before its slots, as the names are.
    #[test]
    fn mdev_units() {
        // No larger than the other units.
        assert_eq!(std::mem::size_of::<Unit>(), 24);
        let m = "0000:3b:00.0/mdev-4b20d080-1b54-4048-85b3-a6a62d165c01";
        assert_eq!(u(m).to_string(), m);
        assert!(u(m).is_mdev() && !u("0000:3b:00.0").is_mdev());
        assert_eq!(u(m).pci(), "0000:3b:00.0");
        assert_eq!((u(m).gi(), u(m).instance()), (None, None));
        assert_eq!(serde_json::to_string(&u(m)).unwrap(), format!("\"{m}\""));
        for bad in [
            "0000:3b:00.0/mdev-4B20D080-1b54-4048-85b3-a6a62d165c01",
            "0000:3b:00.0/mdev-4b20d080-1b54-4048-85b3-a6a62d165c0",
            "0000:3b:00.0/mdev- 4b20d080-1b54-4048-85b3-a6a62d165c01",
            "0000:3b:20.0/mdev-4b20d080-1b54-4048-85b3-a6a62d165c01",
            "0000:3b:00.0/mdev-",
            "0000:3b:00.0/mdev4b20d080-1b54-4048-85b3-a6a62d165c01",
        ] {
            assert!(bad.parse::<Unit>().is_err(), "{bad}");
        }
        let names = [
            "0000:3b:00.0/slot1",
            "0000:3b:00.0/mdev-ff000000-0000-4000-8000-000000000000",
            "0000:3b:00.0",
            "0000:3b:00.0/mdev-0a000000-0000-4000-8000-000000000000",
            "0000:3b:00.0/gi1/ci0",
            "0000:3b:00.1",
        ];
        let mut by_name = names.to_vec();
        by_name.sort();
        let mut units: Vec<Unit> = names.iter().map(|s| u(s)).collect();
        units.sort();
        let printed: Vec<String> = units.iter().map(Unit::to_string).collect();
        assert_eq!(printed, by_name);
        let p: Pci = "0000:3b:00.0".parse().unwrap();
        let mdevs: Vec<&Unit> = units
            .iter()
            .filter(|x| **x >= Unit::first_mdev(p))
            .take_while(|x| x.is_mdev())
            .collect();
        assert_eq!(mdevs.len(), 2);
        assert_eq!(
            MdevId::parse(" 4B20D080-1b54-4048-85b3-a6a62d165c01")
                .unwrap()
                .to_string(),
            "4b20d080-1b54-4048-85b3-a6a62d165c01"
        );
    }

    #[test]
    fn anything_else_is_refused() {
        for s in [
            "",
            "0000:3b:00.0/gi1",
            "0000:3b:00.0/",
            "0000:3b:00.0/gi1/ci",
            "0000:3b:00.0/gi/ci0",
            "0000:3b:00.0/gi1/ci0/",
            "0000:3b:00.0/gi1/ci0/x",
            "0000:3b:00.0/gi01/ci0",
            "0000:3b:00.0/gi1/ci00",
            "0000:3b:00.0/gi+1/ci0",
            "0000:3b:00.0/gi-1/ci0",
            "0000:3b:00.0/gi4294967296/ci0",
            "0000:3b:00.0/ci0/gi1",
            "0000:3b:00.0/GI1/CI0",
            "x/gi1/ci0",
            "3b:00.0/gi1/ci0",
            "3b:00.0",
            "0000:3B:00.0",
            " 0000:3b:00.0",
            "0000:3b:00.8",
            "0000:3b:00:0",
            "0000:3g:00.0",
            "../../etc/x",
            "0000:3b:00.0é",
            "0000:04:00.0/slot",
            "0000:04:00.0/slot01",
            "0000:04:00.0/slot-1",
            "0000:04:00.0/slot1/",
            "0000:04:00.0/SLOT1",
        ] {
            let e = s.parse::<Unit>().unwrap_err();
            assert_eq!(e, UnitError(s.to_owned()), "{s:?}");
            assert!(
                serde_json::from_value::<Unit>(serde_json::json!(s)).is_err(),
                "{s:?}"
            );
        }
        assert_eq!(
            "x/gi1/ci0".parse::<Unit>().unwrap_err().to_string(),
            "not a GPU unit (PCI address, PCI/giG/ciC, PCI/slotN or PCI/mdev-UUID): \"x/gi1/ci0\""
        );
        assert!(serde_json::from_str::<Unit>("7").is_err());
        assert!("0000:3b:00.0/gi1/ci0".parse::<Pci>().is_err());
        assert_eq!(Pci::normalize(" 3B:00.1").unwrap(), "0000:3b:00.1");
    }

    #[test]
    fn units_order_as_their_names() {
        let names = [
            "0000:3b:00.0/gi2/ci0",
            "0000:3b:00.0",
            "0000:3b:00.0/gi10/ci0",
            "0000:3b:00.0/gi1/ci10",
            "0000:3b:00.0/gi1/ci0",
            "0000:3b:00.0/gi1/ci2",
            "0000:3b:00.1",
            "0000:3a:00.0/gi0/ci0",
            "0000:3b:00.0/gi0/ci1",
            "0000:3b:00.0/gi100/ci3",
            "0000:3b:00.0/gi19/ci0",
            "0000:3b:00.0/slot10",
            "0000:3b:00.0/slot2",
            "0000:3b:00.0/slot0",
        ];
        let mut by_name = names.to_vec();
        by_name.sort();
        let mut units: Vec<Unit> = names.iter().map(|s| u(s)).collect();
        units.sort();
        let printed: Vec<String> = units.iter().map(Unit::to_string).collect();
        assert_eq!(printed, by_name);
        let p: Pci = "0000:3b:00.0".parse().unwrap();
        for w in units.windows(2) {
            assert!(w[0] < w[1]);
        }
        // The units of a GPU, and of a GPU instance, follow their first.
        let of_gpu: Vec<&Unit> = units
            .iter()
            .filter(|x| **x >= Unit::first_mig(p))
            .take_while(|x| x.pci() == p)
            .collect();
        // Its MIG units, then its slots.
        assert!(of_gpu[..8].iter().all(|x| x.is_mig()) && of_gpu.len() == 11);
        assert!(of_gpu[8..].iter().all(|x| x.is_slot()));
        assert_eq!(
            units
                .iter()
                .filter(|x| **x >= Unit::first_slot(p))
                .take_while(|x| x.pci() == p)
                .count(),
            3
        );
        let of_gi: Vec<&Unit> = units
            .iter()
            .filter(|x| **x >= Unit::first_of_gi(p, 1))
            .take_while(|x| x.gi() == Some(1))
            .collect();
        assert_eq!(of_gi.len(), 3);
    }
}
