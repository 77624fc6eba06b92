//! What a libvirt QEMU domain (a virtual machine) passes through: its `<hostdev>` elements,
//! read from the domain XML libvirt gives its QEMU hook, or from libvirt's live status XML of
//! a running VM (`<domstatus>` wrapping the `<domain>`).
//!
//! The XML is the tenant's: whoever may define domains may write any hostdev address. It is
//! read strictly and bounded, and only where libvirt reads it: `<domain><devices><hostdev
//! mode='subsystem' type='pci'|'mdev'><source><address …/>`. A PCI source address is read
//! as libvirt reads it (`domain`, `bus`, `slot`, `function`, each a number in C's notation:
//! `0x3b`, `59` or `073`; `domain` optional), so that the function gpuhook sees is the one
//! libvirt will pass through; a mediated device by its `uuid`. Anything malformed in such a
//! hostdev is an error. Other hostdevs (USB, SCSI, `mode='capabilities'`), `<interface
//! type='hostdev'>` and everything outside `<devices>` are left unread, but for the name, the
//! UUID and whether `<metadata>` holds gpuhook's `<gpus>` element (a container's request, which
//! a VM cannot make).

mod error;
mod model;
mod parser;

pub use error::{HostdevError, HostdevFault};
pub use model::{libvirt_number, Hostdev, QemuDomain, QemuStatus, SourceAddr, MAX_HOSTDEVS};

/// Whether the document may pass a GPU through or ask gpuhook for one: it has a `<hostdev`
/// element (libvirt writes it unprefixed) or mentions gpuhook's namespace. A document without
/// either is none of the QEMU hook's business: it leaves at once, with nothing read.
pub fn may_hold(xml: &[u8]) -> bool {
    find(xml, b"<hostdev").is_some() || crate::request::metadata::mentions_gpuhook(xml)
}

/// Parses a QEMU domain XML (`<domain>`). Errors are one line, without the domain name.
pub fn parse_domain(xml: &[u8]) -> Result<QemuDomain, HostdevError> {
    parser::parse(xml, parser::Root::Domain).map(|(_, d)| d)
}

/// Parses libvirt's live status XML of a QEMU domain (`<domstatus>`).
pub fn parse_status(xml: &[u8]) -> Result<QemuStatus, HostdevError> {
    parser::parse(xml, parser::Root::Status).map(|(pid, domain)| QemuStatus { pid, domain })
}

/// Where `needle` first occurs in `hay` (a plain scan, as the LXC hook's).
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let last = hay.len().checked_sub(needle.len())?;
    let mut i = 0;
    while i <= last {
        let at = i + hay[i..=last].iter().position(|&b| b == first)?;
        if hay[at + 1..at + needle.len()] == *rest {
            return Some(at);
        }
        i = at + 1;
    }
    None
}

#[cfg(test)]
mod tests;
