//! Forged Xid records through the scan: the real records netfilter's LOG target wrote
//! (`tests/fixtures/kmsg/netfilter-forged-xid.kmsg`) quarantine, count and reset nothing;
//! a driver's record of a reset or reboot Xid waits for the GPU's own state, asked once per
//! GPU and check, without the state lock.

use super::*;
use crate::host::program::ProgramError;
use crate::reserve::health::confirm::{GpuState, MemoryCounters, Unreadable};

const NETFILTER: &str = include_str!("../../../../tests/fixtures/kmsg/netfilter-forged-xid.kmsg");

/// The captured records, their bus (3b:00) made one of the bed's GPUs (10:00), their
/// sequence numbers moved on by `shift` (the same rules' records logged again later).
fn on_g0(text: &str, shift: u64) -> String {
    let mut out = String::new();
    for line in text.replace("3b:00", "10:00").lines() {
        match line.split_once(',') {
            Some((prio, rest)) if prio.parse::<u32>().is_ok() => {
                let (seq, rest) = rest.split_once(',').unwrap();
                let seq: u64 = seq.parse().unwrap();
                out.push_str(&format!("{prio},{},{rest}\n", seq + shift));
            }
            _ => out.push_str(&format!("{line}\n")),
        }
    }
    out
}

/// Every real netfilter record, logged again and again (three scans, the reset-class ones
/// among them), with auto_reset on: nothing quarantined, escalated, counted or reset, the
/// GPU's state never asked; each one that begins like an Xid reported.
#[test]
fn netfilter_records_quarantine_nothing() {
    let b = Bed::new(|c| c.auto_reset = true);
    let fake = Fake::default();
    let mut text = String::new();
    for round in 0..3 {
        text.push_str(&on_g0(NETFILTER, round * 1000));
        b.kmsg(&text);
        let r = b.scan(&fake);
        assert_eq!(
            (r.new_records, r.imitations.len()),
            (23, 22),
            "round {round}"
        );
        assert!(r.quarantined.is_empty() && r.escalated.is_empty() && r.resets.is_empty());
        assert!(r.doubtful.is_empty(), "{:?}", r.doubtful);
    }
    let st = b.state();
    assert!(st.quarantine.is_empty(), "{:?}", st.quarantine);
    assert!(st.health.is_empty(), "{:?}", st.health);
    assert!(fake.calls.borrow().is_empty(), "reset or probed");
    assert!(fake.confirmed.borrow().is_empty(), "confirmation asked");
    // A fresh scan of them all: what it reports.
    let b = Bed::new(|_| {});
    b.kmsg(&on_g0(NETFILTER, 0));
    let r = b.scan(&Fake::default());
    assert_eq!(r.new_records, 23);
    assert!(r.quarantined.is_empty() && r.escalated.is_empty());
    assert!(r.ignored.is_empty() && r.restart.is_empty() && r.unconfirmed.is_empty());
    assert_eq!(r.imitations.len(), 22, "the 14th begins with another line");
    assert!(r
        .imitations
        .iter()
        .all(|(why, _)| *why == Imitation::Netfilter("IN=")));
    assert!(r.imitations[0]
        .1
        .starts_with("NVRM: Xid (10:00): 79 IN= OUT=lo SRC=127.0.0.1"));
    // The second review's: a prefix ending at `name=` on the interface `b,`.
    assert_eq!(
        r.imitations[13].1,
        "NVRM: Xid (PCI:0000:10:00): 109, pid=40114, name=IN= OUT=b, TRUNCATED"
    );
    assert_eq!(b.problem(G0), None);
}

/// A record in the driver's shape whose process name holds netfilter's `IN=… OUT=` (a
/// tenant's program named so, or a LOG rule's prefix that ends at `name=`): not an Xid,
/// reported with its GPU and who holds it; nothing counted, quarantined or asked of the
/// GPU, whatever its class.
#[test]
fn a_process_named_like_netfilter_is_reported_with_its_gpu_and_counts_nothing() {
    let b = Bed::new(|c| c.auto_reset = true);
    b.hold("train", &[G0]);
    let text = [
        "4,1,1000,-;NVRM: Xid (PCI:0000:10:00): 48, pid=7, name=IN= OUT=lo, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.\n",
        "4,2,2000,-;NVRM: Xid (PCI:0000:11:00): 109, pid=7, name=IN= OUT=b, \n",
    ]
    .concat();
    b.kmsg(&text);
    let fake = Fake::default();
    let r = b.scan(&fake);
    assert_eq!(r.new_records, 2);
    let d: Vec<(&str, u32, &[String])> = r
        .doubtful
        .iter()
        .map(|s| (s.pci.as_str(), s.xid, s.holders.as_slice()))
        .collect();
    assert_eq!(
        d,
        [
            (G0, 48, &["domain 'train'".to_string()][..]),
            (G1, 109, &[][..])
        ]
    );
    assert!(r.quarantined.is_empty() && r.imitations.is_empty() && r.resets.is_empty());
    assert!(fake.confirmed.borrow().is_empty(), "confirmation asked");
    let st = b.state();
    assert!(st.quarantine.is_empty() && st.health.is_empty(), "{st:?}");
}

/// A reboot or reset Xid whose class the GPU's state confirms: refuted, it is counted with
/// the action `ignore` and logged, not quarantined; confirmed, it quarantines; unreadable,
/// the driver's record is trusted. Asked once per GPU and check, without the lock; a class
/// it cannot confirm (62) and the classes that quarantine nothing are never asked.
#[test]
fn reset_and_reboot_xids_wait_for_the_gpus_own_state() {
    let text = [
        rec(1, "0000:10:00", 79, "GPU has fallen off the bus."),
        rec(2, "0000:10:00", 79, "GPU has fallen off the bus."),
        rec(3, "0000:11:00", 48, "DBE"),
        rec(
            4,
            "0000:11:00",
            95,
            "Uncontained: FBHUB. RST: Yes, D-RST: No",
        ),
        rec(5, "0000:12:00", 62, "223b6a66 00002100"),
        rec(
            6,
            "0000:13:00",
            63,
            "Row Remapper: New row marked for remapping",
        ),
        rec(
            7,
            "0000:13:00",
            94,
            "Contained: SM (0x1). RST: No, D-RST: No",
        ),
    ]
    .concat();
    let clear = MemoryCounters {
        uncorrected_volatile: Some(0),
        retired_pages_pending: None,
        remapped_rows_pending: Some(false),
        remapped_rows_failure: Some(false),
    };
    // Refuted.
    let b = Bed::new(|_| {});
    b.kmsg(&text);
    let fake = Fake {
        says: Some(Confirmation::Refuted(GpuState::Counters(clear))),
        ..Default::default()
    };
    let r = b.scan(&fake);
    let asked = fake.confirmed.borrow().clone();
    assert_eq!(
        asked,
        [
            (G0.to_string(), Check::ConfigSpace, true),
            (G1.to_string(), Check::MemoryCounters, true)
        ],
        "once per GPU and check, the lock free"
    );
    let q: Vec<&str> = r.quarantined.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(q, [G2], "62: no check, the record counts");
    let un: Vec<(&str, u32)> = r
        .unconfirmed
        .iter()
        .map(|(s, _)| (s.pci.as_str(), s.xid))
        .collect();
    assert_eq!(un, [(G0, 79), (G0, 79), (G1, 48), (G1, 95)]);
    let st = b.state();
    let counts: Vec<(u32, Action, u64)> = st.health[G0]
        .xids
        .iter()
        .map(|c| (c.xid, c.action, c.count))
        .collect();
    assert_eq!(counts, [(79, Action::Ignore, 2)]);
    assert!(!st.quarantine.contains_key(G0) && !st.quarantine.contains_key(G1));
    assert_eq!(b.problem(G0), None);
    // Confirmed.
    let b = Bed::new(|_| {});
    b.kmsg(&text);
    let r = b.scan(&Fake::default());
    let q: Vec<(&str, Option<u32>)> = r
        .quarantined
        .iter()
        .map(|(p, q)| (p.as_str(), q.xid))
        .collect();
    assert_eq!(q, [(G0, Some(79)), (G1, Some(48)), (G2, Some(62))]);
    assert_eq!(r.confirmed.len(), 4);
    assert_eq!(r.confirmed[0].1, GpuState::ConfigAllOnes);
    assert!(r.unconfirmed.is_empty() && r.trusted.is_empty());
    // Unreadable: trusted.
    let b = Bed::new(|_| {});
    b.kmsg(&text);
    let why = Unreadable::Program(ProgramError::Missing {
        path: "/usr/bin/nvidia-smi".into(),
        source: std::io::Error::from_raw_os_error(2).into(),
    });
    let r = b.scan(&Fake {
        says: Some(Confirmation::Unavailable(why.clone())),
        ..Default::default()
    });
    assert_eq!(r.quarantined.len(), 3);
    assert_eq!(r.trusted.len(), 4);
    assert_eq!(r.trusted[2].1, why);
    assert_eq!(
        why.to_string(),
        "no /usr/bin/nvidia-smi: No such file or directory (os error 2)"
    );
}
