//! Which kernel log records are the NVIDIA driver's Xid records: only a record whose whole
//! text has the driver's shape, from its first byte to its last.
//!
//! The driver (`krcReportXid`) prints `NVRM: Xid (PCI:DDDD:BB:DD): N, pid=P, name=C, TEXT`,
//! with ` GPU-I:GG` and ` GPU-CI:CC` inside the parenthesis when a MIG instance is named;
//! `P` is a number or `'<unknown>'`, `C` a process name (the kernel's `comm`: at most 15
//! bytes) or `<unknown>`. Older drivers left out `name=`, or `pid=` too, and wrote the
//! address without `PCI:` (`NVRM: Xid (0000:3b:00): 48, …`).
//!
//! Not every facility-0 record that begins `NVRM: Xid (` is the driver's: netfilter's LOG
//! target puts the prefix a rule names (`iptables -j LOG --log-prefix`, 29 characters;
//! `nft log prefix`, 127) at the very start of a kernel record and its packet fields after
//! it (`IN=… OUT=… MAC=… SRC=… DST=… LEN=… PROTO=… SPT=… DPT=…`), so a container with
//! `CAP_NET_ADMIN` over a network namespace whose packets are logged writes records that
//! begin like an Xid. Such a record is never one: its fields are always there (netfilter
//! writes `IN=` right after the prefix and ` OUT=` after it), and the driver's messages
//! carry none of them.

use crate::ids::normalize_pci;

/// An NVIDIA Xid event: `NVRM: Xid (PCI:0000:3b:00): 79, pid=…, name=…, GPU has fallen off
/// the bus.` (older drivers: `NVRM: Xid (0000:3b:00): 79, …`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xid {
    /// Domain, bus and device of the GPU, as `0000:3b:00`: the GPU is function 0 of it.
    pub bus: String,
    pub code: u32,
}

/// What one kernel record's text is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// It does not begin `NVRM: Xid`: no concern of the scan.
    Other,
    /// The driver's whole record.
    Driver(Xid),
    /// It begins like an Xid but is not the driver's.
    Imitation(Imitation),
}

/// Why a record that begins like an Xid is not the driver's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Imitation {
    /// It carries one of netfilter's packet log fields (this one): a LOG rule's prefix.
    #[error("it carries netfilter's packet log field {0} (a LOG rule's prefix: iptables -j LOG, nft log)")]
    Netfilter(&'static str),
    /// It is not in the driver's shape.
    #[error("not the NVIDIA driver's record shape: {0}")]
    Malformed(Malformed),
}

/// Where a record that begins `NVRM: Xid` leaves the driver's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("no `NVRM: Xid (ADDRESS): ` head")]
    Head,
    #[error("not a PCI address the driver writes")]
    Address,
    #[error("no Xid number followed by `, `")]
    Number,
    #[error("a `pid=` field the driver does not write")]
    Pid,
    #[error("a `name=` field longer than a process name")]
    Name,
}

/// The packet fields netfilter's LOG target writes (IPv4, IPv6, ARP, bridge, netdev, with
/// every option), each a word of its record: `IN=` comes right after the rule's prefix,
/// the others after a space.
pub const NETFILTER_FIELDS: [&str; 28] = [
    "IN=",
    "OUT=",
    "PHYSIN=",
    "PHYSOUT=",
    "MAC=",
    "SRC=",
    "DST=",
    "LEN=",
    "TOS=",
    "PREC=",
    "TTL=",
    "ID=",
    "PROTO=",
    "SPT=",
    "DPT=",
    "TC=",
    "HOPLIMIT=",
    "FLOWLBL=",
    "UID=",
    "GID=",
    "MARK=",
    "MACSRC=",
    "MACDST=",
    "IPSRC=",
    "IPDST=",
    "HTYPE=",
    "PTYPE=",
    "OPCODE=",
];

/// The first of netfilter's fields in `text`: a word that begins with one, or `IN=` glued
/// to the prefix before it (`…the bus.IN= OUT=lo …`) and followed by ` OUT=`.
pub fn netfilter_field(text: &str) -> Option<&'static str> {
    let words: Vec<&str> = text.split(' ').collect();
    for (i, w) in words.iter().enumerate() {
        if let Some(k) = NETFILTER_FIELDS.iter().find(|k| w.starts_with(**k)) {
            return Some(k);
        }
        if w.contains("IN=") && words.get(i + 1).is_some_and(|n| n.starts_with("OUT=")) {
            return Some("IN=");
        }
    }
    None
}

/// What the record text `msg` is (see [`Shape`]).
pub fn shape(msg: &str) -> Shape {
    if !msg.starts_with("NVRM: Xid") {
        return Shape::Other;
    }
    match driver_record(msg) {
        Ok((xid, text)) => match netfilter_field(text) {
            Some(k) => Shape::Imitation(Imitation::Netfilter(k)),
            None => Shape::Driver(xid),
        },
        Err(why) => Shape::Imitation(match netfilter_field(msg) {
            Some(k) => Imitation::Netfilter(k),
            None => Imitation::Malformed(why),
        }),
    }
}

/// The Xid of a record whose whole text is the driver's, else `None`: a kernel message that
/// echoes a user's string (`tmpfs: Unknown parameter 'NVRM: Xid …'`) does not begin so, and
/// one that does but carries netfilter's fields is a LOG rule's prefix.
pub fn parse_xid(msg: &str) -> Option<Xid> {
    match shape(msg) {
        Shape::Driver(x) => Some(x),
        _ => None,
    }
}

/// The driver's record, field by field: its Xid and its message (after `pid=` and `name=`).
fn driver_record(msg: &str) -> Result<(Xid, &str), Malformed> {
    let rest = msg.strip_prefix("NVRM: Xid (").ok_or(Malformed::Head)?;
    let (inside, rest) = rest.split_once("): ").ok_or(Malformed::Head)?;
    let bus = bus_of(inside).ok_or(Malformed::Address)?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let rest_after = rest[digits..].strip_prefix(", ");
    let (code, mut rest) = match rest_after {
        Some(r) if (1..=5).contains(&digits) => (rest[..digits].parse().ok(), r),
        _ => (None, ""),
    };
    let code = code.ok_or(Malformed::Number)?;
    if let Some(r) = rest.strip_prefix("pid=") {
        let (pid, r) = r.split_once(", ").ok_or(Malformed::Pid)?;
        let number = !pid.is_empty() && pid.len() <= 10 && pid.bytes().all(|b| b.is_ascii_digit());
        if !number && pid != "'<unknown>'" && pid != "<unknown>" {
            return Err(Malformed::Pid);
        }
        rest = r;
    }
    if let Some(r) = rest.strip_prefix("name=") {
        rest = after_name(r).ok_or(Malformed::Name)?;
    }
    Ok((Xid { bus, code }, rest))
}

/// What follows a `name=` value: the process name is at most 15 bytes (`/dev/kmsg` writes
/// a byte it escapes as `\xNN`), then `, ` (the longest such name) or the record's end.
fn after_name(r: &str) -> Option<&str> {
    let mut bytes = 0usize;
    let mut end = None;
    let mut i = 0usize;
    let b = r.as_bytes();
    while i <= b.len() && bytes <= 15 {
        if r[i..].starts_with(", ") {
            end = Some(i);
        }
        if i == b.len() {
            return Some(end.map_or("", |e| &r[e + 2..]));
        }
        let escaped = b[i] == b'\\'
            && b.get(i + 1) == Some(&b'x')
            && b.len() >= i + 4
            && b[i + 2..i + 4].iter().all(u8::is_ascii_hexdigit);
        let step = if escaped {
            4
        } else {
            r[i..].chars().next().map_or(1, char::len_utf8)
        };
        i += step;
        bytes += if escaped { 1 } else { step };
    }
    end.map(|e| &r[e + 2..])
}

/// The GPU's bus from the parenthesis: `PCI:` or not, the domain or not, the function or
/// not, then ` GPU-I:GG` and ` GPU-CI:CC` where the driver names a MIG instance.
fn bus_of(inside: &str) -> Option<String> {
    let mut parts = inside.split(' ');
    let addr = parts.next()?;
    let mig: Vec<&str> = parts.collect();
    let ok_mig = match mig.as_slice() {
        [] => true,
        [gi] => number_after(gi, "GPU-I:"),
        [gi, ci] => number_after(gi, "GPU-I:") && number_after(ci, "GPU-CI:"),
        _ => false,
    };
    if !ok_mig {
        return None;
    }
    let addr = addr.strip_prefix("PCI:").unwrap_or(addr);
    // With the function or without it, with the domain or without it.
    let bdf = if addr.matches(':').count() == 1 {
        format!("0000:{addr}")
    } else {
        addr.to_owned()
    };
    let pci = if bdf.contains('.') {
        bdf
    } else {
        format!("{bdf}.0")
    };
    let pci = normalize_pci(&pci)?;
    Some(pci[..pci.len() - 2].to_owned())
}

fn number_after(s: &str, head: &str) -> bool {
    s.strip_prefix(head)
        .is_some_and(|n| (1..=3).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests;
