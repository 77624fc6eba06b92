//! GPU health: Xid quarantine from the kernel log (`gpuhook health scan` / `clear`), GPUs
//! that fell off the bus or that their driver no longer lists, the driver's own exclusion,
//! and degraded PCIe links; on fake hosts, with a kmsg-format fixture and with a real
//! `/dev/kmsg` node.

mod common;

use common::{assert_fails, assert_ok, domain, gpus, Host};
use serde_json::Value;
use std::path::PathBuf;
use testbed::FakeHost;

fn sys(h: &Host, pci: &str, attr: &str) -> PathBuf {
    h.root()
        .join("host/sys/bus/pci/devices")
        .join(pci)
        .join(attr)
}

fn kmsg(h: &Host) -> PathBuf {
    h.root().join("host/dev/kmsg")
}

fn health(h: &Host, args: &[&str]) -> std::process::Output {
    h.cmd().arg("health").args(args).output().unwrap()
}

use common::gpu_of as gpu;

/// Kernel log records as `/dev/kmsg` shows them on an 8×H100 host (driver 535): an H100
/// that fell off the bus, an application's fault (Xid 13: not the GPU's), a double-bit ECC
/// error in the older format without `PCI:`, an Xid for an NVSwitch bus (no GPU there).
const RECORDS: &str = "6,1520,4213561000,-;nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  535.129.03\n\
4,1523,4213563121,-;NVRM: Xid (PCI:0000:1a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:1a:00.0\n\
4,1524,4213563200,-;NVRM: GPU 0000:1a:00.0: GPU has fallen off the bus.\n\
3,1530,4213999000,-;NVRM: Xid (PCI:0000:40:00): 13, pid=2811, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address\n\
4,1531,4214000100,-;NVRM: Xid (0000:42:00): 48, pid=2811, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.\n\
4,1532,4214000900,-;NVRM: Xid (PCI:0000:07:00): 79, pid=0, GPU has fallen off the bus.\n";

#[test]
fn xid_quarantine_and_clear() {
    let h = Host::new(FakeHost::dgx8());
    // No kernel log to read: one line naming it.
    let o = health(&h, &["scan"]);
    assert_eq!(o.status.code(), Some(1));
    let e = common::stderr(&o);
    assert!(
        e.contains("dev/kmsg") && e.trim_end().lines().count() == 1,
        "{e}"
    );

    std::fs::write(kmsg(&h), RECORDS).unwrap();
    let o = health(&h, &["scan"]);
    assert_ok(&o);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "6 new kernel log records read, 3 GPUs quarantined\n"
    );
    let e = common::stderr(&o);
    assert!(
        e.contains("GPU 0000:1a:00.0 quarantined: Xid 79 (GPU has fallen off the bus)"),
        "{e}"
    );
    assert!(e.contains("GPU 0000:42:00.0 quarantined: Xid 48 (double-bit ECC error)"));
    // An NVSwitch's bus here, or a GPU that is unbound or being reset: kept for when it is one.
    assert!(
        e.contains("0000:07:00.0 is not a GPU this host lists now"),
        "{e}"
    );
    let list = h.list();
    assert_eq!(gpu(&list, "0000:1a:00.0")["quarantine"]["xid"], 79);
    assert!(gpu(&list, "0000:1a:00.0")["problem"]
        .as_str()
        .unwrap()
        .starts_with("quarantined after Xid 79 (GPU has fallen off the bus) at "));
    assert_eq!(gpu(&list, "0000:40:00.0")["quarantine"], Value::Null);
    assert_eq!(gpu(&list, "0000:40:00.0")["problem"], Value::Null);

    // Never handed out: counted among the unusable, named when nothing else matches.
    assert_fails(
        &h.hook("all", "prepare", &domain("all", 1, &gpus(r#"count="7""#))),
        "all",
        "only 6 of the host's 8 matching GPUs are free: 2 unusable (0000:1a:00.0: quarantined after Xid 79",
    );
    let exact =
        r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"><gpu:device pci="0000:42:00.0"/></gpu:gpus>"#;
    assert_fails(
        &h.hook("one", "prepare", &domain("one", 2, exact)),
        "one",
        "GPU 0000:42:00.0 (pci 0000:42:00.0) cannot be used: quarantined after Xid 48",
    );
    assert_ok(&h.hook("six", "prepare", &domain("six", 3, &gpus(r#"count="6""#))));
    let held = &h.holders()["six"];
    assert!(
        !held.contains(&"0000:1a:00.0".to_string()) && !held.contains(&"0000:42:00.0".to_string()),
        "{held:?}"
    );
    assert_ok(&h.hook("six", "stopped", &domain("six", 3, &gpus(r#"count="6""#))));

    // The next scan reads only what is new; a cleared GPU stays in service.
    let o = health(&h, &["scan"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "0 new kernel log records read, 0 GPUs quarantined\n"
    );
    assert_ok(&health(&h, &["clear", "0000:1A:00.0"]));
    let o = health(&h, &["clear", "0000:1a:00.0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(common::stderr(&o).contains("GPU 0000:1a:00.0 is not quarantined"));
    let o = health(&h, &["clear", "../../x"]);
    assert!(common::stderr(&o).contains("is not a PCI address"));
    assert_ok(&health(&h, &["scan"]));
    assert_eq!(gpu(&h.list(), "0000:1a:00.0")["quarantine"], Value::Null);
    // (Best fit: the GPU whose switch partner is quarantined.)
    assert_ok(&h.hook("one", "prepare", &domain("one", 2, &gpus(""))));
    assert_eq!(h.holders()["one"], ["0000:40:00.0"]);

    // A new record: quarantined again (a GPU already held keeps running; new holders skip it).
    let mut text = RECORDS.to_string();
    text.push_str("4,1540,4215000000,-;NVRM: Xid (PCI:0000:40:00): 94, pid=3001, name=python3, Contained: SM (0x1). RST: No, D-RST: No\n");
    std::fs::write(kmsg(&h), &text).unwrap();
    let o = health(&h, &["scan"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "1 new kernel log record read, 1 GPU quarantined\n"
    );
    assert_eq!(h.holders()["one"], ["0000:40:00.0"]);
    let m = h.cmd().arg("metrics").output().unwrap();
    let m = String::from_utf8_lossy(&m.stdout);
    assert!(
        m.contains(r#"gpuhook_gpu_quarantined{pci="0000:40:00.0",xid="94"} 1"#),
        "{m}"
    );
    assert!(m.contains(r#"gpuhook_gpu_quarantined{pci="0000:1a:00.0",xid=""} 0"#));
    assert!(m.contains(r#"gpuhook_gpu_usable{pci="0000:40:00.0"} 0"#));

    // Another boot: sequence numbers start again, the whole log is read anew.
    std::fs::write(
        h.root().join("host/proc/sys/kernel/random/boot_id"),
        "7b1c3f0e-2d4a-4c55-8e61-90a1b2c3d4e5\n",
    )
    .unwrap();
    let o = health(&h, &["scan"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "7 new kernel log records read, 1 GPU quarantined\n"
    );
    assert_eq!(gpu(&h.list(), "0000:1a:00.0")["quarantine"]["xid"], 79);
}

/// The real kernel log: a `/dev/kmsg` node made with mknod in the fake host's /dev. The scan
/// reads it without blocking and to its end; an `NVRM: Xid` line written into it from
/// userspace (facility `user`, as the kernel marks every such write) quarantines nothing.
#[test]
fn real_kmsg_device() {
    let h = Host::new(FakeHost::dgx8());
    testbed::fakehost::node(&kmsg(&h), 1, 11, 0o644, 0).unwrap();
    let t = std::time::Instant::now();
    let o = health(&h, &["scan"]);
    assert_ok(&o);
    assert!(t.elapsed() < std::time::Duration::from_secs(10));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let n: usize = out.split_whitespace().next().unwrap().parse().unwrap();
    assert!(n > 0, "the kernel log has records: {out}");
    let marker = format!("gpuhook test {}", std::process::id());
    std::fs::write(
        kmsg(&h),
        format!(
            "<4>NVRM: Xid (PCI:0000:c8:00): 79, pid=0, {marker}, GPU has fallen off the bus.\n"
        ),
    )
    .unwrap();
    let o = health(&h, &["scan"]);
    assert_ok(&o);
    let e = common::stderr(&o);
    assert!(
        e.contains("an Xid line written into the kernel log from userspace, ignored")
            && e.contains(&marker),
        "{e}"
    );
    assert_eq!(gpu(&h.list(), "0000:c8:00.0")["quarantine"], Value::Null);
    // Read to its end: the next scan finds nothing new of ours.
    let o = health(&h, &["scan"]);
    assert!(!common::stderr(&o).contains(&marker));
}

#[test]
fn gone_gpus_are_unusable_with_their_reason() {
    let h = Host::new(FakeHost::dgx8());
    // Fell off the bus: every config read answers all ones.
    std::fs::write(sys(&h, "0000:18:00.0", "config"), [0xffu8; 256]).unwrap();
    // The driver excluded another (its own health check failed).
    let info = h
        .root()
        .join("host/proc/driver/nvidia/gpus/0000:9a:00.0/information");
    let text = std::fs::read_to_string(&info).unwrap();
    std::fs::write(
        &info,
        text.replace("GPU Excluded:\t No", "GPU Excluded:\t Yes"),
    )
    .unwrap();
    let list = h.list();
    assert_eq!(
        gpu(&list, "0000:18:00.0")["problem"],
        "its PCI config space reads as all ones: fallen off the bus"
    );
    assert_eq!(
        gpu(&list, "0000:9a:00.0")["problem"],
        "excluded by the NVIDIA driver (GPU Excluded: Yes)"
    );
    // The lazy path finds it when it is chosen, and chooses again.
    assert_ok(&h.hook("a", "prepare", &domain("a", 1, &gpus(""))));
    assert_eq!(h.holders()["a"], ["0000:1a:00.0"]);
    assert_fails(
        &h.hook("b", "prepare", &domain("b", 2, &gpus(r#"count="6""#))),
        "b",
        "only 5 of the host's 8 matching GPUs are free: 1 held by domain 'a', 2 unusable (0000:18:00.0: its PCI config space reads as all ones",
    );
    // `start` of a domain whose GPU fell off the bus after `prepare` fails, naming it.
    std::fs::write(sys(&h, "0000:1a:00.0", "config"), [0xffu8; 256]).unwrap();
    assert_fails(
        &h.hook("a", "start", &domain("a", 1, &gpus(""))),
        "a",
        "reserved GPU 0000:1a:00.0 cannot be used: its PCI config space reads as all ones",
    );
}

#[test]
fn degraded_link_is_shown_not_held_against_the_gpu() {
    let h = Host::new(FakeHost::dgx8());
    std::fs::write(sys(&h, "0000:40:00.0", "current_link_width"), "8\n").unwrap();
    std::fs::write(
        sys(&h, "0000:40:00.0", "current_link_speed"),
        "8.0 GT/s PCIe\n",
    )
    .unwrap();
    let list = h.list();
    let l = &gpu(&list, "0000:40:00.0")["link"];
    assert_eq!(
        (
            l["width"].as_u64(),
            l["max_width"].as_u64(),
            l["degraded"].as_bool()
        ),
        (Some(8), Some(16), Some(true))
    );
    assert_eq!(gpu(&list, "0000:42:00.0")["link"]["degraded"], false);
    let o = h.cmd().arg("list").output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let row = text.lines().find(|l| l.contains("0000:40:00.0")).unwrap();
    assert!(
        row.ends_with("free [link PCIe 8.0 GT/s x8 of 16.0 GT/s x16]"),
        "{row}"
    );
    let exact =
        r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"><gpu:device pci="0000:40:00.0"/></gpu:gpus>"#;
    assert_ok(&h.hook("a", "prepare", &domain("a", 1, exact)));
}

/// A shared GPU (config `sharing`) through the real binary: its slots in `list`, metrics and
/// Placement; quarantined, it names every sharer and takes no new one.
#[test]
fn shared_gpu_listed_counted_and_quarantined() {
    let h = Host::with(FakeHost::dgx8(), |c| {
        c["sharing"] = serde_json::json!({"0000:1a:00.0": {"replicas": 3}});
    });
    let share = gpus(r#"share="yes""#);
    for (name, n) in [("s1", 11), ("s2", 12)] {
        let o = h.hook(name, "prepare", &domain(name, n, &share));
        assert_ok(&o);
    }
    assert_eq!(h.holders()["s1"], ["0000:1a:00.0/slot0"]);
    assert_eq!(h.holders()["s2"], ["0000:1a:00.0/slot1"]);
    let l = h.list();
    let g = gpu(&l, "0000:1a:00.0");
    assert_eq!(g["holder"], Value::Null);
    assert_eq!(g["sharing"]["mode"], "timeslice");
    assert_eq!(g["sharing"]["replicas"], 3);
    let who: Vec<&str> = g["sharing"]["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["domain"].as_str().unwrap())
        .collect();
    assert_eq!(who, ["s1", "s2"]);
    let t = h.cmd().arg("list").output().unwrap();
    let t = String::from_utf8_lossy(&t.stdout);
    assert!(t.contains("2/3 shared: s1, s2"), "{t}");
    let m = h.cmd().arg("metrics").output().unwrap();
    let m = String::from_utf8_lossy(&m.stdout);
    assert!(
        m.contains(r#"gpuhook_gpu_shared_slots{pci="0000:1a:00.0",mode="timeslice"} 3"#),
        "{m}"
    );
    assert!(
        m.contains(r#"gpuhook_gpu_shared_used{pci="0000:1a:00.0"} 2"#),
        "{m}"
    );
    let p = h.cmd().arg("placement").output().unwrap();
    let p = String::from_utf8_lossy(&p.stdout);
    assert!(
        p.contains("- CUSTOM_GPU_HOPPER_SHARED:\n            total: 3\n"),
        "{p}"
    );
    assert!(
        p.contains("- CUSTOM_GPU_HOPPER:\n            total: 7\n"),
        "{p}"
    );
    // An exclusive request never gets it: 7 whole GPUs at most.
    assert_fails(
        &h.hook("big", "prepare", &domain("big", 13, &gpus(r#"count="8""#))),
        "big",
        "1 shared (handed out as slots: share='yes')",
    );

    std::fs::write(kmsg(&h), RECORDS).unwrap();
    let o = health(&h, &["scan"]);
    assert_ok(&o);
    let e = common::stderr(&o);
    assert!(
        e.contains("GPU 0000:1a:00.0 quarantined: Xid 79 (GPU has fallen off the bus)")
            && e.contains(
                "still held by domain 's1', domain 's2' (no new holder or sharer gets it)"
            ),
        "{e}"
    );
    assert_fails(
        &h.hook("s3", "prepare", &domain("s3", 14, &share)),
        "s3",
        "0000:1a:00.0 unusable (quarantined after Xid 79",
    );
    let p = h.cmd().arg("placement").output().unwrap();
    let p = String::from_utf8_lossy(&p.stdout);
    assert!(
        p.contains("- CUSTOM_GPU_HOPPER_SHARED:\n            total: 3\n            reserved: 3\n"),
        "{p}"
    );
    // The sharers keep their slots; freed, the GPU still takes no one.
    assert_eq!(h.holders()["s1"], ["0000:1a:00.0/slot0"]);
    assert_ok(&h.hook("s1", "release", &domain("s1", 11, &share)));
    assert!(!h.holders().contains_key("s1"));
}
