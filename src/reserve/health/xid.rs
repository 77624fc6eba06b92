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
//! begin like an Xid. Such a record is never one: netfilter writes `IN=DEV OUT=DEV ` right
//! after the prefix, every time, whatever follows (the packet's fields, or for a packet too
//! short for its header only `TRUNCATED`, or nothing), and an interface's name holds no
//! space. So `IN=`, a run without a space, then ` OUT=` anywhere after the head refuses a
//! record, the process name included: a prefix that ends at `name=` on an interface whose
//! name ends in `,` (`…, name=IN= OUT=b, TRUNCATED`) reads as a process `IN= OUT=b` and
//! a message. The driver's messages carry none of netfilter's fields either. A process
//! *named* `IN= OUT=…` whose record reads as the driver's otherwise cannot be told from
//! such a prefix: its record is [`Shape::Doubtful`], not an Xid, and named with its GPU.

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
    /// The driver's shape, but its process name holds netfilter's `IN=… OUT=`: the driver's
    /// record of a process named so, or a LOG rule's prefix ending at `name=` on an interface
    /// whose name ends in `,`. Which one cannot be told: not an Xid; the scan names the GPU.
    Doubtful(Xid),
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

/// The packet fields netfilter's LOG target writes (`nf_log_syslog`: IPv4, IPv6, ARP,
/// bridge, netdev, with every option; and ebtables' own `log`), each a word of its record:
/// `IN=` comes right after the rule's prefix, the others after a space.
pub const NETFILTER_FIELDS: [&str; 45] = [
    "IN=",
    "OUT=",
    "PHYSIN=",
    "PHYSOUT=",
    "MAC=",
    "MACSRC=",
    "MACDST=",
    "MACPROTO=",
    "VPROTO=",
    "VID=",
    "TUNNEL=",
    "SRC=",
    "DST=",
    "LEN=",
    "TOS=",
    "PREC=",
    "TTL=",
    "ID=",
    "FRAG:",
    "PROTO=",
    "SPT=",
    "DPT=",
    "SEQ=",
    "ACK=",
    "WINDOW=",
    "RES=",
    "URGP=",
    "TYPE=",
    "CODE=",
    "PARAMETER=",
    "GATEWAY=",
    "MTU=",
    "POINTER=",
    "SPI=",
    "TC=",
    "HOPLIMIT=",
    "FLOWLBL=",
    "UID=",
    "GID=",
    "MARK=",
    "IPSRC=",
    "IPDST=",
    "HTYPE=",
    "PTYPE=",
    "OPCODE=",
];

/// The words netfilter writes for a packet too short for a header (`TRUNCATED`, `OPT
/// (TRUNCATED)`, `INCOMPLETE [N bytes]`), each a whole word of its record.
pub const NETFILTER_WORDS: [&str; 3] = ["TRUNCATED", "(TRUNCATED)", "INCOMPLETE"];

/// Where netfilter's `IN=DEV OUT=` begins in `text`, if it is there: `IN=` (glued to what
/// comes before it or not), a run without a space (an interface's name: none holds one),
/// then ` OUT=`. Every record netfilter's LOG target writes has it right after the rule's
/// prefix.
pub fn in_out(text: &str) -> Option<usize> {
    text.match_indices("IN=").map(|(i, _)| i).find(|&i| {
        let dev = text[i + 3..].split(' ').next().unwrap_or("");
        text[i + 3 + dev.len()..].starts_with(" OUT=")
    })
}

/// The first of netfilter's fields in `text`: its `IN=DEV OUT=` anywhere ([`in_out`]), a
/// word that begins with one of [`NETFILTER_FIELDS`], or one of [`NETFILTER_WORDS`].
pub fn netfilter_field(text: &str) -> Option<&'static str> {
    if in_out(text).is_some() {
        return Some("IN=");
    }
    for w in text.split(' ') {
        if let Some(k) = NETFILTER_FIELDS.iter().find(|k| w.starts_with(**k)) {
            return Some(k);
        }
        if let Some(k) = NETFILTER_WORDS.iter().find(|k| w == **k) {
            return Some(k);
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
        Ok(rec) if in_out(msg).is_some() => match rec.named_in_out() {
            true => Shape::Doubtful(rec.xid),
            false => Shape::Imitation(Imitation::Netfilter("IN=")),
        },
        Ok(rec) => match netfilter_field(rec.text) {
            Some(k) => Shape::Imitation(Imitation::Netfilter(k)),
            None => Shape::Driver(rec.xid),
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

/// A record in the driver's shape, field by field.
struct DriverRecord<'a> {
    xid: Xid,
    /// What follows `name=`, when the record has that field.
    name: Option<&'a str>,
    /// Its message: after `pid=` and `name=` (the longest process name it may hold).
    text: &'a str,
}

impl DriverRecord<'_> {
    /// Whether a process name (at most 15 bytes, then `, ` or the record's end) may hold
    /// netfilter's whole `IN=… OUT=` with a message after it that carries none of its
    /// fields: the driver's record of a process named so would read like this.
    fn named_in_out(&self) -> bool {
        let Some(r) = self.name else {
            return false;
        };
        name_ends(r)
            .into_iter()
            .any(|(name, text)| in_out(name).is_some() && netfilter_field(text).is_none())
    }
}

/// The driver's record, field by field: its Xid, its `name=` and its message (after `pid=`
/// and `name=`).
fn driver_record(msg: &str) -> Result<DriverRecord<'_>, Malformed> {
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
    let name = rest.strip_prefix("name=");
    if let Some(r) = name {
        // The longest name followed by `, `; else the whole rest, when it ends in time.
        let ends = name_ends(r);
        let comma = ends.iter().rfind(|(n, _)| n.len() < r.len());
        rest = comma.or(ends.last()).ok_or(Malformed::Name)?.1;
    }
    Ok(DriverRecord {
        xid: Xid { bus, code },
        name,
        text: rest,
    })
}

/// Every way to read `r` (what follows `name=`) as a process name and a message: the name
/// is at most 15 bytes (`/dev/kmsg` writes a byte it escapes as `\xNN`), then `, ` or the
/// record's end. In order, the longest name last (the whole rest, when it ends in time).
fn name_ends(r: &str) -> Vec<(&str, &str)> {
    let mut ends = Vec::new();
    let mut bytes = 0usize;
    let mut i = 0usize;
    let b = r.as_bytes();
    while i <= b.len() && bytes <= 15 {
        if r[i..].starts_with(", ") {
            ends.push((&r[..i], &r[i + 2..]));
        }
        if i == b.len() {
            ends.push((r, ""));
            break;
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
    ends
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
