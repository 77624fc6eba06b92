//! Identifiers of GPUs and domains, shared by every part that reads or prints them:
//! GPU vendors, PCI addresses, UUIDs.

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
    let s = s.trim().to_ascii_lowercase();
    let full = if s.len() == 7 { format!("0000:{s}") } else { s };
    let b = full.as_bytes();
    let hex = |r: std::ops::Range<usize>| b[r].iter().all(|c| c.is_ascii_hexdigit());
    let ok = b.len() == 12
        && hex(0..4)
        && b[4] == b':'
        && hex(5..7)
        && b[7] == b':'
        && hex(8..10)
        && b[10] == b'.'
        && (b'0'..=b'7').contains(&b[11]);
    ok.then_some(full)
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
