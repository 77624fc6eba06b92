//! Forged Xid records through the built binary (issue 39's first hole): the records the
//! kernel's netfilter LOG target really writes when a container with `CAP_NET_ADMIN` names an
//! Xid as its rule's prefix (`tests/fixtures/kmsg/netfilter-forged-xid.kmsg`, captured with
//! `testbed/scripts/netfilter-xid-records`, and made again live here) quarantine, escalate
//! and reset nothing; a genuine 79 or memory error waits for the GPU's own state (its config
//! space; nvidia-smi's counters, the test bed's stand-in).

use super::{health, kmsg, standin_calls, standin_command};
use crate::common::{self, assert_ok, gpu_of as gpu, Host};
use serde_json::Value;
use testbed::health::{
    config_all_ones, install_smi, netfilter_records, smi_answers, smi_calls, smi_mode, xid_record,
    xid_text,
};
use testbed::FakeHost;

/// The real records.
const NETFILTER: &str = include_str!("../fixtures/kmsg/netfilter-forged-xid.kmsg");
/// The GPU the forged records name.
const G: &str = "0000:3b:00.0";

/// The dgx8 host with its first H100 at 0000:3b:00.0 (the bus the forged records name),
/// `auto_reset` on with the reset stand-in; with `smi`, the nvidia-smi stand-in as its
/// `nvidia_smi` (without it the config is one a gpuhook before that key reads too, so these
/// tests run against an older binary through `GPUHOOK_TEST_BIN`).
fn host_3b(smi: bool) -> Host {
    let mut fake = FakeHost::dgx8();
    let d = fake
        .devices
        .iter_mut()
        .find(|d| d.pci == "0000:18:00.0")
        .unwrap();
    d.pci = G.into();
    let h = Host::new(fake);
    let root = h.paths.root.clone();
    let smi = smi.then(|| install_smi(&h.paths));
    h.edit_config(|c| {
        c["reset_command"] = standin_command(&root);
        c["auto_reset"] = true.into();
        if let Some(p) = smi {
            c["nvidia_smi"] = p.display().to_string().into();
        }
    });
    h
}

/// `health scan` with `-v`: its standard output and error.
fn scan(h: &Host) -> (String, String) {
    let o = h.cmd().args(["-v", "health", "scan"]).output().unwrap();
    assert_ok(&o);
    let err = common::stderr(&o);
    (String::from_utf8(o.stdout).unwrap(), err)
}

/// Nothing of GPU `pci` in the state's quarantine or health, `list` shows it free.
fn untouched(h: &Host, pci: &str) {
    let st: Value = serde_json::from_slice(&std::fs::read(&h.state).unwrap()).unwrap();
    assert_eq!(st["quarantine"].get(pci), None, "{st}");
    assert_eq!(st["health"].get(pci), None, "{st}");
    let l = h.list();
    assert_eq!(gpu(&l, pci)["quarantine"], Value::Null);
    assert_eq!(gpu(&l, pci)["problem"], Value::Null);
}

/// The reviewer's scenario: `iptables -j LOG --log-prefix "NVRM: Xid (3b:00): 79 "` and the
/// other captured rules (iptables, ip6tables, nft; short and long prefixes), their records
/// logged three times over (the reset-class ones among them): GPU 0000:3b:00.0 is never
/// quarantined, escalated or reset; each record is reported as not the driver's.
#[test]
fn forged_netfilter_records_quarantine_nothing() {
    let h = host_3b(false);
    let mut text = String::new();
    for round in 0..3u64 {
        // The same rules' records again, later in the log.
        for line in NETFILTER.lines() {
            match line.split_once(',') {
                Some((prio, rest)) if prio.parse::<u32>().is_ok() => {
                    let (seq, rest) = rest.split_once(',').unwrap();
                    let seq: u64 = seq.parse().unwrap();
                    text.push_str(&format!("{prio},{},{rest}\n", seq + round * 1000));
                }
                _ => text.push_str(&format!("{line}\n")),
            }
        }
        std::fs::write(kmsg(&h), &text).unwrap();
        let (out, err) = scan(&h);
        assert_eq!(
            out, "23 new kernel log records read, 0 GPUs quarantined\n",
            "round {round}: {err}"
        );
        assert_eq!(
            err.matches("a kernel log record that begins like an NVIDIA Xid is not the driver's (it carries netfilter's packet log field IN= (a LOG rule's prefix: iptables -j LOG, nft log)), ignored: NVRM: Xid (").count(),
            22,
            "{err}"
        );
        assert!(
            err.contains(
                "ignored: NVRM: Xid (3b:00): 79 IN= OUT=lo SRC=127.0.0.1 DST=127.0.0.1 LEN=29 "
            ),
            "{err}"
        );
        // The second review's: a prefix ending at `name=`, netfilter's fields in the process
        // name, a reset class the GPU's state cannot confirm.
        assert!(
            err.contains(
                "ignored: NVRM: Xid (PCI:0000:3b:00): 109, pid=40114, name=IN= OUT=b, TRUNCATED\n"
            ),
            "{err}"
        );
        assert!(!err.contains("quarantined"), "{err}");
        untouched(&h, G);
    }
    assert!(standin_calls(&h.paths).is_empty(), "a reset ran");
    let m = h.cmd().arg("metrics").output().unwrap();
    let m = String::from_utf8_lossy(&m.stdout);
    assert!(
        !m.contains(r#"gpuhook_gpu_xid_total{pci="0000:3b:00.0""#),
        "{m}"
    );
    assert!(
        m.contains(r#"gpuhook_gpu_usable{pci="0000:3b:00.0"} 1"#),
        "{m}"
    );
    // Every request still gets it.
    assert_ok(&h.hook(
        "all",
        "prepare",
        &common::domain("all", 1, &common::gpus(r#"count="8""#)),
    ));
}

/// The same, live: the capture script makes netfilter write its records now (a network
/// namespace of its own, `nf_log_all_netns` on for the while), they are copied from the
/// real /dev/kmsg into the fake host's kernel log, and the scan takes none as an Xid. They
/// are the fixture's records but for what changes with each packet (and the ports and
/// process ids, counted from the port given).
#[test]
fn live_netfilter_records_quarantine_nothing() {
    let port = 41000 + (std::process::id() % 20000) as u16;
    let live = netfilter_records(port).expect("netfilter's records");
    let fixture: Vec<&str> = NETFILTER.lines().filter(|l| !l.starts_with('#')).collect();
    let now: Vec<&str> = live.lines().collect();
    assert_eq!(now.len(), fixture.len(), "{live}");
    let head = |l: &str, first: u16| -> String {
        let msg = l.split_once(';').unwrap().1;
        let prio = l.split(',').next().unwrap();
        let mut msg = msg.split(" SRC=").next().unwrap().to_string();
        for i in 0..fixture.len() as u16 {
            msg = msg.replace(&format!(", pid={}, ", first + i), &format!(", pid=P{i}, "));
        }
        format!("{prio};{msg}")
    };
    for (a, b) in now.iter().zip(&fixture) {
        assert_eq!(head(a, port), head(b, 40100));
    }
    let h = host_3b(false);
    std::fs::write(kmsg(&h), &live).unwrap();
    let (out, err) = scan(&h);
    assert_eq!(
        out, "23 new kernel log records read, 0 GPUs quarantined\n",
        "{err}"
    );
    assert_eq!(
        err.matches("is not the driver's (it carries netfilter's")
            .count(),
        22,
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "ignored: NVRM: Xid (PCI:0000:3b:00): 109, pid={}, name=IN= OUT=b, TRUNCATED\n",
            port + 14
        )),
        "{err}"
    );
    untouched(&h, G);
    assert!(standin_calls(&h.paths).is_empty());
}

/// A record in the driver's shape from a process whose own name holds netfilter's `IN=…
/// OUT=` cannot be told from a LOG rule's prefix that ends at `name=`: it is not taken as an
/// Xid (nothing quarantined, counted or reset, though its class would quarantine), and the
/// scan warns naming the GPU and its holder, so that an operator can look at it.
#[test]
fn a_process_named_like_netfilter_gets_a_warning_naming_the_gpu() {
    let h = host_3b(false);
    assert_ok(&h.hook(
        "train",
        "prepare",
        &common::domain("train", 1, &common::gpus(r#"count="8""#)),
    ));
    let mut log = String::new();
    for seq in 1..=3 {
        // Logged again and again: a reset class, auto_reset on.
        log.push_str(&format!("4,{seq},{seq}000,-;NVRM: Xid (PCI:0000:3b:00): 109, pid=7, name=IN= OUT=lo, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x3c046\n"));
        std::fs::write(kmsg(&h), &log).unwrap();
        let (out, err) = scan(&h);
        assert_eq!(
            out, "1 new kernel log record read, 0 GPUs quarantined\n",
            "{err}"
        );
        assert!(err.contains("gpuhook: warning: GPU 0000:3b:00.0 (held by domain 'train'): a kernel log record in the NVIDIA driver's shape, Xid 109 (context switch timeout), has netfilter's packet log fields IN= and OUT= in its process name: a LOG rule's prefix (iptables -j LOG, nft log) or the driver's record of a process named so; not taken as an Xid (nothing counted or quarantined): look at the GPU if it misbehaves: NVRM: Xid (PCI:0000:3b:00): 109, pid=7, name=IN= OUT=lo, Ch 00000008"), "{err}");
    }
    let st: Value = serde_json::from_slice(&std::fs::read(&h.state).unwrap()).unwrap();
    assert_eq!(st["quarantine"].get(G), None, "{st}");
    assert_eq!(st["health"].get(G), None, "{st}");
    assert!(standin_calls(&h.paths).is_empty());
}

/// A genuine 79 quarantines only a GPU whose config space reads as all ones: one that
/// answers is counted (`ignore`) and logged as unconfirmed.
#[test]
fn a_genuine_79_waits_for_its_config_space() {
    let h = host_3b(false);
    std::fs::write(kmsg(&h), xid_record(1, G, 79, xid_text(79))).unwrap();
    let (out, err) = scan(&h);
    assert_eq!(out, "1 new kernel log record read, 0 GPUs quarantined\n");
    assert!(err.contains("GPU 0000:3b:00.0: Xid 79 (GPU has fallen off the bus), action reboot: unconfirmed: its PCI config space reads, not as all ones; counted and logged only, not quarantined: NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."), "{err}");
    let l = h.list();
    assert_eq!(gpu(&l, G)["quarantine"], Value::Null);
    let m = h.cmd().arg("metrics").output().unwrap();
    assert!(String::from_utf8_lossy(&m.stdout)
        .contains(r#"gpuhook_gpu_xid_total{pci="0000:3b:00.0",xid="79",action="ignore"} 1"#));
    // It fell off the bus: the next one quarantines it until a reboot.
    config_all_ones(&h.paths, G);
    std::fs::write(
        kmsg(&h),
        [
            xid_record(1, G, 79, xid_text(79)),
            xid_record(2, G, 79, xid_text(79)),
        ]
        .concat(),
    )
    .unwrap();
    let (out, err) = scan(&h);
    assert_eq!(
        out, "1 new kernel log record read, 1 GPU quarantined\n",
        "{err}"
    );
    assert!(err.contains("GPU 0000:3b:00.0: Xid 79 confirmed by the GPU's own state: its PCI config space reads as all ones"), "{err}");
    assert_eq!(gpu(&h.list(), G)["quarantine"]["action"], "reboot");
}

/// A genuine reset-class memory error quarantines when nvidia-smi (the stand-in, run as
/// every child: its arguments, only PATH) shows an uncorrected error, a row remapping
/// pending or failed; all clear, it is unconfirmed. Where nvidia-smi cannot tell (it fails,
/// hangs past 10 s, reports no counter, is not root's, is missing) the record is trusted.
#[test]
fn a_genuine_memory_error_waits_for_nvidia_smi() {
    let h = host_3b(true);
    let mut recs = vec![xid_record(1, G, 48, xid_text(48))];
    std::fs::write(kmsg(&h), recs.concat()).unwrap();
    let (out, err) = scan(&h);
    assert_eq!(
        out, "1 new kernel log record read, 0 GPUs quarantined\n",
        "{err}"
    );
    assert!(err.contains("GPU 0000:3b:00.0: Xid 48 (double-bit ECC error), action reset: unconfirmed: nvidia-smi shows ecc.errors.uncorrected.volatile.total 0, retired_pages.pending No, remapped_rows.pending No, remapped_rows.failure No; counted and logged only, not quarantined"), "{err}");
    let calls = smi_calls(&h.paths);
    assert_eq!(calls.len(), 1);
    // Run from the descriptor checked, not by its path: the kernel hands a script's
    // interpreter that descriptor as /dev/fd/3; it is the file at the configured path.
    assert_eq!(calls[0]["argv"][0], "/dev/fd/3");
    assert_eq!(
        calls[0]["exe"],
        h.paths.root.join("bin/nvidia-smi").display().to_string()
    );
    assert_eq!(
        calls[0]["argv"].as_array().unwrap()[1..],
        [
            "--query-gpu=pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending,remapped_rows.failure",
            "--format=csv,noheader,nounits",
            "-i",
            G
        ]
    );
    assert_eq!(
        calls[0]["env"],
        serde_json::json!({"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    );
    assert_eq!(gpu(&h.list(), G)["quarantine"], Value::Null);
    let mut seq = 1;
    let mut again = |h: &Host, xid: u32| {
        seq += 1;
        recs.push(xid_record(seq, G, xid, xid_text(xid)));
        std::fs::write(kmsg(h), recs.concat()).unwrap();
        let r = scan(h);
        // Each quarantine lifted again (a free GPU, auto_reset) or cleared for the next.
        let _ = health(h, &["clear", G]);
        r
    };
    // Confirmed: each counter on its own.
    for (xid, field, value) in [
        (48, "ecc.errors.uncorrected.volatile.total", "2"),
        (95, "remapped_rows.pending", "Yes"),
        (64, "remapped_rows.failure", "Yes"),
        (140, "retired_pages.pending", "Yes"),
    ] {
        smi_answers(&h.paths, G, &[(field, value)]);
        let (out, err) = again(&h, xid);
        assert!(
            out.starts_with("1 new kernel log record read, 1 GPU quarantined\n"),
            "{xid}: {out}{err}"
        );
        assert!(
            err.contains(&format!(
                "GPU 0000:3b:00.0: Xid {xid} confirmed by the GPU's own state: nvidia-smi shows "
            )) && err.contains(&format!("{field} {value}")),
            "{xid}: {err}"
        );
    }
    // Cannot tell: the record is trusted.
    smi_answers(&h.paths, G, &[]);
    let smi = h.paths.root.join("bin/nvidia-smi");
    use std::os::unix::fs::PermissionsExt;
    type Setup<'a> = Box<dyn Fn() + 'a>;
    let cases: [(&str, Setup); 5] = [
        ("exited with status 15: Unable to determine the device handle for GPU 00000000:3B:00.0: Unknown Error", Box::new(|| smi_mode(&h.paths, "fail"))),
        ("reports none of its memory error counters", Box::new(|| {
            smi_mode(&h.paths, "ok");
            smi_answers(&h.paths, G, &[
                ("ecc.errors.uncorrected.volatile.total", "[N/A]"),
                ("retired_pages.pending", "[N/A]"),
                ("remapped_rows.pending", "[N/A]"),
                ("remapped_rows.failure", "[N/A]"),
            ]);
        })),
        ("it did not end within 10s (killed)", Box::new(|| smi_mode(&h.paths, "hang"))),
        ("may be written by group or others (mode 775): not run", Box::new(|| {
            smi_mode(&h.paths, "ok");
            std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o775)).unwrap();
        })),
        ("no /nonexistent/nvidia-smi: No such file or directory", Box::new(|| {
            h.edit_config(|c| c["nvidia_smi"] = "/nonexistent/nvidia-smi".into());
        })),
    ];
    for (why, set) in cases {
        set();
        let before = smi_calls(&h.paths).len();
        let t = std::time::Instant::now();
        let (out, err) = again(&h, 48);
        assert!(t.elapsed() < std::time::Duration::from_secs(25), "{why}");
        assert!(
            out.starts_with("1 new kernel log record read, 1 GPU quarantined\n"),
            "{why}: {out}{err}"
        );
        assert!(
            err.contains(
                "GPU 0000:3b:00.0: Xid 48 could not be confirmed by the GPU's own state ("
            ) && err.contains(why)
                && err.contains("): the NVIDIA driver's record is trusted"),
            "{why}: {err}"
        );
        if why.contains("not run") || why.starts_with("no /") {
            assert_eq!(smi_calls(&h.paths).len(), before, "{why}: it ran");
        }
    }
}
