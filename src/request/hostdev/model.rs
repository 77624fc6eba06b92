//! The values read from a QEMU domain's XML: the hostdevs, the domain, libvirt's status.

use crate::ids::{MdevId, Pci};
use std::fmt;

/// At most this many GPU-capable hostdevs (`type='pci'` and `type='mdev'`) in one domain.
pub const MAX_HOSTDEVS: usize = 1024;

/// A PCI function as a hostdev's `<source><address>` names it, read as libvirt reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourceAddr {
    pub domain: u32,
    pub bus: u32,
    pub slot: u32,
    pub function: u32,
}

impl SourceAddr {
    /// The function as the kernel names it; `None` for a PCI domain above `0xffff` (a VMD
    /// domain: never a GPU of the inventory).
    pub fn pci(&self) -> Option<Pci> {
        if self.domain > 0xffff {
            return None;
        }
        self.to_string().parse().ok()
    }

    /// The same PCI device (domain, bus and slot): one of its functions.
    pub fn same_device(&self, p: Pci) -> bool {
        self.pci()
            .is_some_and(|a| a.as_str()[..10] == p.as_str()[..10])
    }
}

impl fmt::Display for SourceAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.slot, self.function
        )
    }
}

/// A hostdev that can pass a GPU (or part of one) through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hostdev {
    /// `<hostdev mode='subsystem' type='pci'>`: a PCI function; `managed`: libvirt binds it
    /// to `vfio-pci` itself (and back after).
    Pci { addr: SourceAddr, managed: bool },
    /// `<hostdev mode='subsystem' type='mdev'>`: a mediated device (a vGPU), by its UUID.
    Mdev { uuid: MdevId },
}

impl fmt::Display for Hostdev {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hostdev::Pci { addr, .. } => write!(f, "hostdev {addr}"),
            Hostdev::Mdev { uuid } => write!(f, "mdev {uuid}"),
        }
    }
}

/// What gpuhook reads of a QEMU domain's XML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QemuDomain {
    pub name: String,
    /// Its UUID, lowercase.
    pub uuid: String,
    /// Its PCI and mdev hostdevs, in document order.
    pub hostdevs: Vec<Hostdev>,
    /// Whether `<metadata>` holds gpuhook's `<gpus>` element.
    pub gpuhook_request: bool,
}

/// What gpuhook reads of libvirt's live status XML of a QEMU domain
/// (`<domstatus state='running' pid='…'><domain>…</domain></domstatus>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QemuStatus {
    /// `pid` of `<domstatus>`: the QEMU process, as libvirt recorded it.
    pub pid: Option<i32>,
    pub domain: QemuDomain,
}

/// Reads a number of a PCI address as libvirt does (`virStrToLong_uip`, base 0): `0x` and
/// hex digits, `0` and octal digits, or decimal digits; nothing before or after.
pub fn libvirt_number(s: &str) -> Option<u32> {
    let (digits, radix) = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        (h, 16)
    } else if s.len() > 1 && s.starts_with('0') {
        (&s[1..], 8)
    } else {
        (s, 10)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u32::from_str_radix(digits, radix).ok()
}
