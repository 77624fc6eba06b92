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
        // A tenant's process named like some of netfilter's fields (not its `IN=… OUT=`):
        // still the driver's record (its name is not its message).
        ("NVRM: Xid (PCI:0000:40:00): 48, pid=7, name=x, SRC=1 ID=2, An uncorrectable double bit error (DBE)", xid("0000:40:00", 48)),
        ("NVRM: Xid (PCI:0000:40:00): 48, pid=7, name=OUT=lo, An uncorrectable double bit error (DBE)", xid("0000:40:00", 48)),
        // The address: no domain, the function, upper case.
        ("NVRM: Xid (PCI:3b:00): 94, pid=1, Contained", xid("0000:3b:00", 94)),
        ("NVRM: Xid (PCI:0000:3b:00.0): 79, pid=0, GPU has fallen off the bus.", xid("0000:3b:00", 79)),
        ("NVRM: Xid (PCI:0000:3B:00): 79, pid=0, GPU has fallen off the bus.", xid("0000:3b:00", 79)),
    ] {
        assert_eq!(parse_xid(msg), want, "{msg}");
    }
}

/// Every record netfilter's LOG target wrote (iptables, ip6tables, nft; input, output,
/// netdev ingress and egress; IPv4, IPv6, ARP, others; levels warning, error, emerg;
/// prefixes of 22 to 127 characters; with and without a space before `IN=`; prefixes that
/// end at the driver's `name=` on an interface named `b,`) is never an Xid: those that begin
/// like one are told apart by netfilter's `IN=… OUT=`; the one whose prefix begins with
/// another line does not begin like one at all.
#[test]
fn every_real_netfilter_record_is_refused() {
    let recs = parse_records(NETFILTER);
    assert_eq!(recs.len(), 23);
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
    // Netfilter's `IN=… OUT=` is in each, glued to the prefix or after a space, after the
    // message or in the process name.
    let mut want = vec!["IN="; 23];
    want[13] = "-";
    assert_eq!(kinds, want);
    // The first reviewer's record, word for word: it quarantined GPU 0000:3b:00.0 before.
    assert_eq!(
        recs[0].msg,
        "NVRM: Xid (3b:00): 79 IN= OUT=lo SRC=127.0.0.1 DST=127.0.0.1 LEN=29 TOS=0x00 PREC=0x00 TTL=64 ID=2217 DF PROTO=UDP SPT=60400 DPT=40100 LEN=9 "
    );
    // A prefix that is a whole driver record (nft, 93 characters): the driver's shape up to
    // netfilter's fields, which no driver record carries.
    assert!(recs[6].msg.starts_with(
        "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus. IN= OUT=lo "
    ));
    assert_eq!(driver_record(&recs[6].msg).map(|r| r.xid.code), Ok(79));
    // The second reviewer's record, word for word: a prefix that ends at `name=`, an egress
    // rule on the interface `b,`, an ARP frame too short for its header. The old parser
    // read a process `IN= OUT=b` and the message `TRUNCATED`, and took Xid 109.
    assert_eq!(
        recs[14].msg,
        "NVRM: Xid (PCI:0000:3b:00): 109, pid=40114, name=IN= OUT=b, TRUNCATED"
    );
    let rec = driver_record(&recs[14].msg).unwrap();
    assert_eq!((rec.xid.code, rec.text), (109, "TRUNCATED"));
    assert_eq!(rec.name, Some("IN= OUT=b, TRUNCATED"));
    // Every one of the nine reads as the driver's head with a process name.
    for r in &recs[14..] {
        assert!(driver_record(&r.msg).is_ok(), "{}", r.msg);
        assert!(
            r.msg.contains(", name=") && r.msg.contains("OUT="),
            "{}",
            r.msg
        );
    }
}

/// Whatever netfilter writes after `IN=DEV OUT=DEV ` (every form of `nf_log_syslog` and
/// of ebtables' own `log`: a packet's fields, a header too short, a MAC, nothing), behind
/// a prefix that ends anywhere in the driver's `name=` field, on interfaces whose names end
/// in a comma or hold one, on ingress or egress: never an Xid, for any Xid that
/// quarantines.
#[test]
fn no_prefix_ending_in_the_name_field_makes_an_xid() {
    let tails = [
        "TRUNCATED",
        "",
        "MAC= ",
        "MAC=02:00:00:00:00:01:02:00:00:00:00:02:88:b5 ",
        "MACSRC=02:00:00:00:00:02 MACDST=02:00:00:00:00:01 MACPROTO=0806 TRUNCATED",
        "MACSRC=02:00:00:00:00:02 MACDST=02:00:00:00:00:01 VPROTO=8100 VID=5 MACPROTO=88b5 ",
        "ARP HTYPE=1 PTYPE=0x0800 OPCODE=1 INCOMPLETE [16 bytes]",
        "ARP HTYPE=1 PTYPE=0x0800 OPCODE=1 MACSRC=02:00:00:00:00:02 IPSRC=10.0.0.2 MACDST=00:00:00:00:00:00 IPDST=10.0.0.1",
        "SRC=10.0.0.2 DST=10.0.0.1 LEN=20 TOS=0x00 PREC=0x00 TTL=64 ID=1 PROTO=255 ",
        "SRC=10.0.0.2 DST=10.0.0.1 LEN=28 TOS=0x00 PREC=0x00 TTL=64 ID=1 PROTO=ICMP INCOMPLETE [2 bytes] ",
        "SRC=10.0.0.2 DST=10.0.0.1 LEN=24 TOS=0x00 PREC=0x00 TTL=64 ID=1 OPT (TRUNCATED)",
        "SRC=0000:0000:0000:0000:0000:0000:0000:0001 DST=0000:0000:0000:0000:0000:0000:0000:0001 LEN=48 TC=0 HOPLIMIT=64 FLOWLBL=0 FRAG:TRUNCATED ",
        "PHYSIN=veth0 MAC= SRC=10.0.0.2 DST=10.0.0.1 LEN=20 TOS=0x00 PREC=0x00 TTL=64 ID=1 PROTO=255 ",
        "MAC= TUNNEL=10.0.0.1->10.0.0.2 TRUNCATED",
        // ebtables' own log target.
        "MAC source = 02:00:00:00:00:02 MAC dest = 02:00:00:00:00:01 proto = 0x0806 INCOMPLETE ARP header",
    ];
    let mut doubtful = 0;
    let mut n = 0;
    for xid in [
        46, 48, 62, 64, 74, 79, 95, 109, 119, 120, 136, 140, 143, 154,
    ] {
        for end in ["", "a", "python3, ", "abcdefghijklm", "x, y, "] {
            for (i, o) in [
                ("", "b,"),
                ("b,", ""),
                ("", ","),
                ("x,y,", "lo"),
                ("", "b,,,,,,,,,,,,,,"),
            ] {
                for sep in ["", " "] {
                    for tail in tails {
                        let rec = format!(
                            "NVRM: Xid (PCI:0000:3b:00): {xid}, pid=0, name={end}{sep}IN={i} OUT={o} {tail}"
                        );
                        n += 1;
                        match shape(&rec) {
                            Shape::Imitation(Imitation::Netfilter(_)) => {}
                            // Nothing after netfilter's fields but what a process name may
                            // hold: a process named so would read the same. Not an Xid either.
                            Shape::Doubtful(x) => {
                                assert_eq!(x.code, xid);
                                let name = rec.split_once("name=").unwrap().1;
                                assert!(tail.is_empty() || name.len() <= 15, "{rec}");
                                doubtful += 1;
                            }
                            other => panic!("{other:?}: {rec}"),
                        }
                    }
                }
            }
        }
    }
    assert!(n > 10_000 && doubtful > 0, "{n} {doubtful}");
}

/// A process whose own name holds `IN=… OUT=`: its record reads as the driver's, but so
/// would a LOG rule's prefix that ends at `name=`. Not an Xid; [`Shape::Doubtful`], with
/// the GPU, so the scan names it. Where the message after the name carries netfilter's
/// fields, no process name makes it the driver's: an imitation.
#[test]
fn a_process_named_like_netfilters_in_and_out_is_doubtful() {
    for (msg, code) in [
        ("NVRM: Xid (PCI:0000:40:00): 48, pid=7, name=IN= OUT=lo, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.", 48),
        ("NVRM: Xid (PCI:0000:40:00): 109, pid=7, name=IN= OUT=b, ", 109),
        ("NVRM: Xid (PCI:0000:40:00): 109, pid=7, name=IN= OUT=b,", 109),
        ("NVRM: Xid (PCI:0000:40:00): 62, pid=7, name=aIN=x OUT=, Ch 00000010", 62),
    ] {
        assert_eq!(shape(msg), Shape::Doubtful(xid("0000:40:00", code).unwrap()), "{msg}");
        assert_eq!(parse_xid(msg), None, "{msg}");
    }
    for msg in [
        "NVRM: Xid (PCI:0000:40:00): 109, pid=7, name=IN= OUT=b, TRUNCATED",
        "NVRM: Xid (PCI:0000:40:00): 109, pid=7, name=IN= OUT=b, MAC= ",
        // The name longer than a process's: the message is netfilter's.
        "NVRM: Xid (PCI:0000:40:00): 109, pid=7, name=python3, IN= OUT=lo, x",
        // No name field: the message is netfilter's.
        "NVRM: Xid (PCI:0000:40:00): 109, pid=7, IN= OUT=b, x",
    ] {
        assert_eq!(
            shape(msg),
            Shape::Imitation(Imitation::Netfilter("IN=")),
            "{msg}"
        );
    }
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
        // Short packets, and the fields the first version of this check did not list.
        "TRUNCATED",
        "INCOMPLETE [16 bytes]",
        "MACPROTO=0806 ",
        "x OPT (TRUNCATED)",
        "SEQ=1 ACK=2 WINDOW=3 RES=0x00 URGP=0 ",
        "TYPE=8 CODE=0 ID=1 SEQ=1 ",
        "ab,IN=x,y OUT= ",
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
        "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).",
        "NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
        "xIN=x, OUT",
        "xIN=x  xOUT=y",
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
