//! The driver's whole record shape, against every form the driver prints and against the
//! records netfilter's LOG target really wrote on the development machine (the fixtures
//! under `tests/fixtures/kmsg/`, with how each was made in their headers).

use super::*;
use crate::reserve::health::{parse_records, Record, RecordKind};

/// Built by hand in each form the driver prints (its header says which).
const DRIVER: &str = include_str!("../../../../tests/fixtures/kmsg/nvidia-driver-xid.kmsg");
/// Captured from /dev/kmsg: iptables, ip6tables and nft LOG rules whose prefixes imitate
/// Xid records.
const NETFILTER: &str = include_str!("../../../../tests/fixtures/kmsg/netfilter-forged-xid.kmsg");

fn xid(bus: &str, code: u32) -> Option<Xid> {
    Some(Xid {
        bus: bus.into(),
        code,
    })
}

/// Every genuine form is the driver's Xid, with its GPU and number.
#[test]
fn every_form_the_driver_prints_is_an_xid() {
    let recs = parse_records(DRIVER);
    assert_eq!(recs.len(), 22);
    let codes: Vec<u32> = recs
        .iter()
        .map(|r| match r.kind() {
            RecordKind::Xid(x) => {
                assert_eq!(x.bus, "0000:3b:00", "{}", r.msg);
                x.code
            }
            other => panic!("{other:?}: {}", r.msg),
        })
        .collect();
    assert_eq!(
        codes,
        [
            79, 79, 79, 13, 31, 48, 48, 62, 63, 64, 74, 94, 95, 109, 119, 120, 140, 154, 154, 94,
            43, 13
        ]
    );
    // Each field on its own.
    for (msg, want) in [
        // pid and name unknown, as the driver writes them.
        ("NVRM: Xid (PCI:0000:1a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", xid("0000:1a:00", 79)),
        ("NVRM: Xid (PCI:0000:1a:00): 79, pid=<unknown>, name=<unknown>, GPU has fallen off the bus.", xid("0000:1a:00", 79)),
        // The driver's message empty (its pointer NULL), the trailing space kept or not.
        ("NVRM: Xid (PCI:0002:00:00): 119, pid=1582259, name=nvc:[driver], ", xid("0002:00:00", 119)),
        ("NVRM: Xid (PCI:0002:00:00): 119, pid=1582259, name=nvc:[driver]", xid("0002:00:00", 119)),
        // A process name of 15 bytes, one with escaped bytes (a newline, a backslash).
        ("NVRM: Xid (PCI:0000:40:00): 13, pid=7, name=abcdefghijklmno, Graphics Exception", xid("0000:40:00", 13)),
        ("NVRM: Xid (PCI:0000:40:00): 13, pid=7, name=a\\x0ab\\x5cc, Graphics Exception", xid("0000:40:00", 13)),
        // A tenant's process named like netfilter's fields: still the driver's record (its
        // name is not its message).
        ("NVRM: Xid (PCI:0000:40:00): 48, pid=7, name=IN= OUT=lo, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.", xid("0000:40:00", 48)),
        ("NVRM: Xid (PCI:0000:40:00): 48, pid=7, name=x, SRC=1 ID=2, An uncorrectable double bit error (DBE)", xid("0000:40:00", 48)),
        // The address: no domain, the function, upper case.
        ("NVRM: Xid (PCI:3b:00): 94, pid=1, Contained", xid("0000:3b:00", 94)),
        ("NVRM: Xid (PCI:0000:3b:00.0): 79, pid=0, GPU has fallen off the bus.", xid("0000:3b:00", 79)),
        ("NVRM: Xid (PCI:0000:3B:00): 79, pid=0, GPU has fallen off the bus.", xid("0000:3b:00", 79)),
    ] {
        assert_eq!(parse_xid(msg), want, "{msg}");
    }
}

/// Every record netfilter's LOG target wrote (iptables, ip6tables, nft; input, output,
/// netdev ingress; IPv4, IPv6; levels warning, error, emerg; prefixes of 22 to 127
/// characters; with and without a space before `IN=`) is never an Xid: those that begin
/// like one are told apart by netfilter's fields; the one whose prefix begins with
/// another line does not begin like one at all.
#[test]
fn every_real_netfilter_record_is_refused() {
    let recs = parse_records(NETFILTER);
    assert_eq!(recs.len(), 14);
    assert!(
        recs.iter().all(Record::from_kernel),
        "facility 0, as the driver's"
    );
    assert_eq!(recs[8].prio, 0, "nft's level emerg");
    let mut kinds = Vec::new();
    for r in &recs {
        assert_eq!(parse_xid(&r.msg), None, "{}", r.msg);
        match r.kind() {
            RecordKind::Imitation(Imitation::Netfilter(k)) => kinds.push(k),
            RecordKind::Other => {
                assert!(r.msg.starts_with("x\\x0aNVRM: Xid (PCI:0000:3b:00): 79, "));
                kinds.push("-");
            }
            other => panic!("{other:?}: {}", r.msg),
        }
    }
    // The prefix's own words decide which field is seen first: `IN=` glued to it, or
    // after a space.
    assert_eq!(
        kinds,
        [
            "IN=", "IN=", "IN=", "IN=", "IN=", "IN=", "IN=", "IN=", "IN=", "IN=", "IN=", "IN=",
            "IN=", "-"
        ]
    );
    // The reviewer's record, word for word: it quarantined GPU 0000:3b:00.0 before.
    assert_eq!(
        recs[0].msg,
        "NVRM: Xid (3b:00): 79 IN= OUT=lo SRC=127.0.0.1 DST=127.0.0.1 LEN=29 TOS=0x00 PREC=0x00 TTL=64 ID=2217 DF PROTO=UDP SPT=60400 DPT=40100 LEN=9 "
    );
    // A prefix that is a whole driver record (nft, 93 characters): the driver's shape up to
    // netfilter's fields, which no driver record carries.
    assert!(recs[6].msg.starts_with(
        "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus. IN= OUT=lo "
    ));
    assert_eq!(driver_record(&recs[6].msg).map(|(x, _)| x.code), Ok(79));
}

/// Netfilter's fields in any of the shapes its loggers write, found in the message after the
/// driver's fields; a prefix that stops anywhere leaves the driver's shape or carries them.
#[test]
fn netfilter_fields_anywhere_in_the_message() {
    for text in [
        "IN=eth0 OUT= MAC=52:54:00:12:34:56:52:54:00:65:43:21:08:00 SRC=10.0.0.2 DST=10.0.0.1 LEN=60 TOS=0x00 PREC=0x00 TTL=64 ID=4242 DF PROTO=TCP SPT=40000 DPT=22 WINDOW=64240 RES=0x00 SYN URGP=0 ",
        "GPU has fallen off the bus.IN= OUT=lo SRC=127.0.0.1 ",
        "x PHYSIN=veth0 PHYSOUT=veth1 ",
        "ARP HTYPE=1 PTYPE=0x0800 OPCODE=1 MACSRC=52:54:00:12:34:56 IPSRC=10.0.0.2",
    ] {
        assert!(netfilter_field(text).is_some(), "{text}");
        let rec = format!("NVRM: Xid (PCI:0000:3b:00): 79, pid=0, name=<unknown>, {text}");
        assert!(
            matches!(shape(&rec), Shape::Imitation(Imitation::Netfilter(_))),
            "{rec}"
        );
    }
    for text in [
        "GPU has fallen off the bus.",
        "Ch 00000010, errorString CTX SWITCH TIMEOUT, Info 0x1c001",
        "Graphics Exception: ESR 0x405840=0x80000000",
        "MIN=3 LOGIN=x",
    ] {
        assert_eq!(netfilter_field(text), None, "{text}");
    }
    // A prefix cut short anywhere: never an Xid (the fields follow what is left of it).
    let whole = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus. ";
    for cut in 0..=whole.len() {
        let rec = format!(
            "{}IN= OUT=lo SRC=127.0.0.1 DST=127.0.0.1 LEN=29 PROTO=UDP SPT=1 DPT=2 LEN=9 ",
            &whole[..cut]
        );
        assert_eq!(parse_xid(&rec), None, "{rec}");
    }
}

/// What leaves the driver's shape, and why; a kernel message that only echoes a user's
/// string does not begin like an Xid.
#[test]
fn what_is_not_the_drivers_shape() {
    for (msg, why) in [
        ("NVRM: Xid (PCI:zz:00): 79, x", Malformed::Address),
        (
            "NVRM: Xid (PCI:0000:3b:00 GPU-X:1): 79, x",
            Malformed::Address,
        ),
        ("NVRM: Xid (PCI:0000:3b:00): x79, x", Malformed::Number),
        ("NVRM: Xid (PCI:0000:3b:00): 79 x", Malformed::Number),
        ("NVRM: Xid (PCI:0000:3b:00): 123456, x", Malformed::Number),
        ("NVRM: Xid (PCI:0000:3b:00) 79, x", Malformed::Head),
        ("NVRM: Xid", Malformed::Head),
        ("NVRM: Xid (PCI:0000:3b:00): 79, pid=12a, x", Malformed::Pid),
        ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1", Malformed::Pid),
        (
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=abcdefghijklmnop, x",
            Malformed::Name,
        ),
    ] {
        assert_eq!(
            shape(msg),
            Shape::Imitation(Imitation::Malformed(why)),
            "{msg}"
        );
    }
    for msg in [
        "tmpfs: Unknown parameter 'NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus.'",
        "Xid (PCI:0000:3b:00): 79, pid=0, x",
        " NVRM: Xid (PCI:0000:3b:00): 79, pid=0, x",
        "NVRM: GPU 0000:1a:00.0: GPU has fallen off the bus.",
    ] {
        assert_eq!(shape(msg), Shape::Other, "{msg}");
    }
    assert_eq!(
        Imitation::Netfilter("IN=").to_string(),
        "it carries netfilter's packet log field IN= (a LOG rule's prefix: iptables -j LOG, nft log)"
    );
    assert_eq!(
        Imitation::Malformed(Malformed::Number).to_string(),
        "not the NVIDIA driver's record shape: no Xid number followed by `, `"
    );
}
