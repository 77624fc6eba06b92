//! GPU health: Xid quarantine from the kernel log (`gpuhook health scan` / `clear`), GPUs
//! that fell off the bus or that their driver no longer lists, the driver's own exclusion,
//! and degraded PCIe links; on fake hosts, with a kmsg-format fixture and with a real
//! `/dev/kmsg` node. `health/forged.rs`: forged Xid records (netfilter's LOG target) and the
//! GPU's own state that confirms a genuine one.

mod common;
#[path = "health/forged.rs"]
mod forged;

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
/// error in the older format without `PCI:`, a 79 for an NVSwitch's bus (no GPU there: its
/// config space reads, so it is not confirmed), a 79 for a bus gone from the host (a GPU the
/// kernel removed).
const RECORDS: &str = "6,1520,4213561000,-;nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  535.129.03\n\
4,1523,4213563121,-;NVRM: Xid (PCI:0000:1a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:1a:00.0\n\
4,1524,4213563200,-;NVRM: GPU 0000:1a:00.0: GPU has fallen off the bus.\n\
3,1530,4213999000,-;NVRM: Xid (PCI:0000:40:00): 13, pid=2811, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address\n\
4,1531,4214000100,-;NVRM: Xid (0000:42:00): 48, pid=2811, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.\n\
4,1532,4214000900,-;NVRM: Xid (PCI:0000:07:00): 79, pid=0, GPU has fallen off the bus.\n\
4,1533,4214001000,-;NVRM: Xid (PCI:0000:b3:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n";

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
    // The H100 fell off the bus: its config space reads as all ones (what confirms a 79).
    let config_1a = config_all_ones(&h.paths, "0000:1a:00.0");
    let o = health(&h, &["scan"]);
    assert_ok(&o);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "7 new kernel log records read, 3 GPUs quarantined\n"
    );
    let e = common::stderr(&o);
    assert!(
        e.contains("GPU 0000:1a:00.0 quarantined: Xid 79 (GPU has fallen off the bus)"),
        "{e}"
    );
    assert!(e.contains("GPU 0000:42:00.0 quarantined: Xid 48 (double-bit ECC error)"));
    // A bus gone from the host (a GPU the kernel removed): kept for when it is one again.
    assert!(
        e.contains("0000:b3:00.0 is not a GPU this host lists now"),
        "{e}"
    );
    // The NVSwitch's bus answers: not fallen off it.
    assert!(
        e.contains("GPU 0000:07:00.0: Xid 79 (GPU has fallen off the bus), action reboot: unconfirmed: its PCI config space reads, not as all ones; counted and logged only, not quarantined"),
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
    // Reseated: it answers again.
    config_back(&h.paths, "0000:1a:00.0", &config_1a);
    assert_ok(&health(&h, &["clear", "0000:1A:00.0"]));
    let o = health(&h, &["clear", "0000:1a:00.0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(common::stderr(&o).contains("GPU 0000:1a:00.0 is not quarantined"));
    let o = health(&h, &["clear", "../../x"]);
    assert!(common::stderr(&o).contains(
        "'../../x' is neither a PCI address (0000:3b:00.0), a GPU UUID (GPU-…) nor an index"
    ));
    assert_ok(&health(&h, &["scan"]));
    assert_eq!(gpu(&h.list(), "0000:1a:00.0")["quarantine"], Value::Null);
    // (Best fit: the GPU whose switch partner is quarantined.)
    assert_ok(&h.hook("one", "prepare", &domain("one", 2, &gpus(""))));
    assert_eq!(h.holders()["one"], ["0000:40:00.0"]);

    // Xid 94 (contained ECC error): the program that got it must restart; the GPU stays in
    // service, the warning names its holder (docs/guides/health.md: not quarantined).
    let mut text = RECORDS.to_string();
    text.push_str("4,1540,4215000000,-;NVRM: Xid (PCI:0000:40:00): 94, pid=3001, name=python3, Contained: SM (0x1). RST: No, D-RST: No\n");
    std::fs::write(kmsg(&h), &text).unwrap();
    let o = health(&h, &["scan"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "1 new kernel log record read, 0 GPUs quarantined\n"
    );
    let e = common::stderr(&o);
    assert!(
        e.contains("GPU 0000:40:00.0: Xid 94 (contained ECC error), action restart: the program that got it must restart; held by domain 'one'; not quarantined"),
        "{e}"
    );
    assert_eq!(gpu(&h.list(), "0000:40:00.0")["quarantine"], Value::Null);
    // A new record of an uncontained one: quarantined (a GPU already held keeps running; new
    // holders skip it).
    text.push_str("4,1541,4215000100,-;NVRM: Xid (PCI:0000:40:00): 95, pid=3001, name=python3, Uncontained: FBHUB. RST: Yes, D-RST: No\n");
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
        m.contains(r#"gpuhook_gpu_quarantined{pci="0000:40:00.0",xid="95"} 1"#),
        "{m}"
    );
    assert!(m.contains(r#"gpuhook_gpu_quarantined{pci="0000:1a:00.0",xid=""} 0"#));
    assert!(m.contains(r#"gpuhook_gpu_usable{pci="0000:40:00.0"} 0"#));
    for line in [
        r#"gpuhook_gpu_xid_total{pci="0000:40:00.0",xid="13",action="restart"} 1"#,
        r#"gpuhook_gpu_xid_total{pci="0000:40:00.0",xid="94",action="restart"} 1"#,
        r#"gpuhook_gpu_xid_total{pci="0000:40:00.0",xid="95",action="reset"} 1"#,
        r#"gpuhook_gpu_xid_total{pci="0000:1a:00.0",xid="79",action="reboot"} 1"#,
    ] {
        assert!(m.contains(line), "{line}: {m}");
    }

    // Another boot: sequence numbers start again, the new log is read whole; the reboot
    // quarantine of the boot before ends (0000:07:00.0's Xid 79), the reset ones stay.
    std::fs::write(
        h.root().join("host/proc/sys/kernel/random/boot_id"),
        "7b1c3f0e-2d4a-4c55-8e61-90a1b2c3d4e5\n",
    )
    .unwrap();
    config_all_ones(&h.paths, "0000:1a:00.0");
    std::fs::write(
        kmsg(&h),
        "6,1,1000,-;Linux version 6.1.0-27-amd64\n4,1523,4213563121,-;NVRM: Xid (PCI:0000:1a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n",
    )
    .unwrap();
    let o = health(&h, &["scan"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "2 new kernel log records read, 1 GPU quarantined\n"
    );
    let l = h.list();
    assert_eq!(gpu(&l, "0000:1a:00.0")["quarantine"]["xid"], 79);
    assert_eq!(gpu(&l, "0000:42:00.0")["quarantine"]["xid"], 48);
    assert_eq!(gpu(&l, "0000:40:00.0")["quarantine"]["xid"], 95);
    let st: Value = serde_json::from_slice(&std::fs::read(&h.state).unwrap()).unwrap();
    assert_eq!(st["quarantine"].get("0000:07:00.0"), None, "{st}");
    assert_eq!(st["quarantine"].get("0000:b3:00.0"), None, "{st}");
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
    config_all_ones(&h.paths, "0000:1a:00.0");
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

// ---- docs/guides/health.md, through the binary ----

use testbed::health::{
    config_all_ones, config_back, reboot, standin_calls, standin_command, standin_mode, xid_154,
    xid_record, xid_text,
};

/// A dgx8 fake host whose `reset_command` is the stand-in (`testbed/scripts/gpu-reset-standin`).
fn standin_host(edit: impl FnOnce(&mut Value)) -> Host {
    let h = Host::new(FakeHost::dgx8());
    let root = h.paths.root.clone();
    h.edit_config(|c| {
        c["reset_command"] = standin_command(&root);
        edit(c);
    });
    h
}

/// The kernel log holds these records (sequence numbers from 1).
fn log_xids(h: &Host, xids: &[(&str, u32, &str)]) {
    let text: String = xids
        .iter()
        .enumerate()
        .map(|(i, (pci, x, t))| xid_record(i as u64 + 1, pci, *x, t))
        .collect();
    std::fs::write(kmsg(h), text).unwrap();
}

fn metrics(h: &Host) -> String {
    let o = h.cmd().arg("metrics").output().unwrap();
    assert_ok(&o);
    String::from_utf8(o.stdout).unwrap()
}

fn placement(h: &Host) -> String {
    let o = h.cmd().arg("placement").output().unwrap();
    assert_ok(&o);
    String::from_utf8(o.stdout).unwrap()
}

/// What a refusal must leave as it was: the state file's bytes, `list --json`, metrics.
fn snapshot(h: &Host) -> (Option<Vec<u8>>, Value, String) {
    (std::fs::read(&h.state).ok(), h.list(), metrics(h))
}

/// `gpuhook health reset PCI`, asserted to fail in one line that says `needle` (after the
/// lines that say where a reset that ran was: what it ran, then the probes).
fn reset_fails(h: &Host, pci: &str, needle: &str) -> String {
    let o = health(h, &["reset", pci]);
    let e = common::stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    let said: Vec<&str> = e
        .lines()
        .filter(|l| !(l.contains(": resetting: ") && l.ends_with("(30 s at most)")))
        .filter(|l| !l.contains(" s; probing it (config space, driver, not excluded)"))
        .collect();
    assert_eq!(said.len(), 1, "not one line: {e}");
    assert!(said[0].contains(needle), "{e:?} lacks {needle:?}");
    said[0].to_string()
}

fn reset_ok(h: &Host, pci: &str) -> String {
    let o = health(h, &["reset", pci]);
    assert_ok(&o);
    String::from_utf8(o.stdout).unwrap()
}

const A: &str = "0000:18:00.0";
const B: &str = "0000:1a:00.0";
const C: &str = "0000:40:00.0";
const D: &str = "0000:42:00.0";

/// Every class of Xid through the kernel log: ignore (and unknown) counted and logged
/// only, restart a warning naming the GPU's holder, reset and reboot quarantined with their
/// action, 154 as its text says; `list --json`'s quarantine with `action`, `count_24h`,
/// `needs_inspection`; the counts in metrics by Xid and action.
#[test]
fn each_class_of_xid_by_the_catalog() {
    let h = Host::new(FakeHost::dgx8());
    let exact = |p: &str| {
        format!(r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"><gpu:device pci="{p}"/></gpu:gpus>"#)
    };
    assert_ok(&h.hook("web1", "prepare", &domain("web1", 1, &exact(C))));
    log_xids(
        &h,
        &[
            (A, 63, xid_text(63)),
            (A, 92, xid_text(92)),
            (C, 13, xid_text(13)),
            (C, 31, xid_text(31)),
            (B, 48, xid_text(48)),
            (D, 79, xid_text(79)),
            (A, 999, "pid=0, something new"),
            ("0000:9a:00.0", 154, &xid_154("GPU Reset Required")),
            ("0000:9c:00.0", 154, &xid_154("Node Reboot Required")),
            ("0000:c8:00.0", 154, &xid_154("Drain and Reset")),
            ("0000:ca:00.0", 154, &xid_154("None")),
        ],
    );
    // D fell off the bus (what confirms its 79); no nvidia-smi here: B's 48 is trusted.
    config_all_ones(&h.paths, D);
    let o = h.cmd().args(["-v", "health", "scan"]).output().unwrap();
    assert_ok(&o);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "11 new kernel log records read, 5 GPUs quarantined\n"
    );
    let e = common::stderr(&o);
    for needle in [
        "GPU 0000:40:00.0: Xid 13 (graphics engine exception), action restart: the program that got it must restart; held by domain 'web1'; not quarantined",
        "GPU 0000:40:00.0: Xid 31 (GPU memory page fault), action restart",
        "GPU 0000:18:00.0: Xid 63 (ECC page retirement or row remapping recorded), action ignore: counted, nothing else",
        "GPU 0000:18:00.0: Xid 999 (not in gpuhook's Xid catalog), action ignore: counted and logged only",
        "GPU 0000:1a:00.0 quarantined: Xid 48 (double-bit ECC error), action reset",
        "GPU 0000:42:00.0 quarantined: Xid 79 (GPU has fallen off the bus), action reboot",
        "GPU 0000:9a:00.0 quarantined: Xid 154 (GPU Reset Required), action reset",
        "GPU 0000:9c:00.0 quarantined: Xid 154 (Node Reboot Required), action reboot",
        "GPU 0000:c8:00.0 quarantined: Xid 154 (Drain and Reset), action reset",
        "GPU 0000:ca:00.0: Xid 154 (no recovery action stated), action ignore",
    ] {
        assert!(e.contains(needle), "{needle}: {e}");
    }
    let l = h.list();
    for (pci, action) in [
        (B, "reset"),
        (D, "reboot"),
        ("0000:9a:00.0", "reset"),
        ("0000:9c:00.0", "reboot"),
        ("0000:c8:00.0", "reset"),
    ] {
        let q = &gpu(&l, pci)["quarantine"];
        assert_eq!(q["action"], action, "{pci}: {q}");
        assert_eq!(q["count_24h"], 1, "{pci}");
        assert_eq!(q["needs_inspection"], false, "{pci}");
        assert_eq!(gpu(&l, pci)["scrub_pending"], false);
    }
    for pci in [A, C, "0000:ca:00.0"] {
        assert_eq!(gpu(&l, pci)["quarantine"], Value::Null, "{pci}");
        assert_eq!(gpu(&l, pci)["problem"], Value::Null, "{pci}");
    }
    assert!(gpu(&l, B)["problem"]
        .as_str()
        .unwrap()
        .ends_with("; `gpuhook health reset 0000:1a:00.0` returns it"));
    assert!(gpu(&l, D)["problem"]
        .as_str()
        .unwrap()
        .ends_with("; a reboot returns it (or `gpuhook health clear 0000:42:00.0`)"));
    let m = metrics(&h);
    for line in [
        "# TYPE gpuhook_gpu_xid_total counter",
        r#"gpuhook_gpu_xid_total{pci="0000:18:00.0",xid="63",action="ignore"} 1"#,
        r#"gpuhook_gpu_xid_total{pci="0000:18:00.0",xid="999",action="ignore"} 1"#,
        r#"gpuhook_gpu_xid_total{pci="0000:40:00.0",xid="13",action="restart"} 1"#,
        r#"gpuhook_gpu_xid_total{pci="0000:1a:00.0",xid="48",action="reset"} 1"#,
        r#"gpuhook_gpu_xid_total{pci="0000:42:00.0",xid="79",action="reboot"} 1"#,
        r#"gpuhook_gpu_xid_total{pci="0000:9c:00.0",xid="154",action="reboot"} 1"#,
        r#"gpuhook_gpu_xid_total{pci="0000:ca:00.0",xid="154",action="ignore"} 1"#,
        r#"gpuhook_gpu_usable{pci="0000:1a:00.0"} 0"#,
        r#"gpuhook_gpu_usable{pci="0000:18:00.0"} 1"#,
    ] {
        assert!(m.contains(line), "{line}: {m}");
    }
    // Prometheus's promtool finds nothing to say of the counters.
    let check = common::run_with_stdin(
        std::process::Command::new("promtool").args(["check", "metrics"]),
        &m,
    );
    assert!(
        check.status.success() && check.stdout.is_empty(),
        "promtool: {} {}",
        String::from_utf8_lossy(&check.stdout),
        common::stderr(&check)
    );
    // Placement: 8 H100s, 5 quarantined, reserved there.
    assert!(
        placement(&h)
            .contains("- CUSTOM_GPU_HOPPER:\n            total: 8\n            reserved: 5\n"),
        "{}",
        placement(&h)
    );
}

/// `health reset` with the stand-in: the reset command as gpuhook runs every child
/// (`{pci}` replaced, only PATH in its environment, no descriptor but 0-2, standard input
/// /dev/null); every probe passes: the quarantine is lifted, counted ok. A failing reset, a
/// config space that reads all ones after it, an excluded or unlisted GPU: it stays
/// quarantined with the failed probe as its reason, counted failed, every reservation as it
/// was.
#[test]
fn health_reset_with_the_stand_in() {
    // (Each failed reset counts as a quarantine: escalation has its own test.)
    let h = standin_host(|c| c["max_quarantines"] = 100.into());
    let info = h
        .root()
        .join("host/proc/driver/nvidia/gpus/0000:1a:00.0/information");
    let info_text = std::fs::read(&info).unwrap();
    log_xids(&h, &[(B, 48, xid_text(48))]);
    assert_ok(&health(&h, &["scan"]));
    assert_ok(&h.hook("web1", "prepare", &domain("web1", 1, &gpus(""))));
    let held = h.holders();
    let out = reset_ok(&h, "0000:1A:00.0");
    assert!(
        out.starts_with("GPU 0000:1a:00.0 reset in ")
            && out.ends_with(" s: every probe passes (config space, driver, not excluded); back in service (its quarantine after Xid 48 is lifted)\n"),
        "{out}"
    );
    let calls = standin_calls(&h.paths);
    assert_eq!(calls.len(), 1);
    let c = &calls[0];
    assert_eq!(
        c["argv"].as_array().unwrap()[1..],
        [
            json_str("--root"),
            json_str(h.paths.root.to_str().unwrap()),
            json_str("--gpu-reset"),
            json_str("-i"),
            json_str(B)
        ]
    );
    assert_eq!(
        c["env"],
        serde_json::json!({"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    );
    assert_eq!(
        c["fds"],
        serde_json::json!([0, 1, 2, 3, 4]),
        "3: the program checked, run from its descriptor (a script's interpreter reads it \
         as /dev/fd/3); 4: its own listing"
    );
    assert_eq!(c["stdin"], "/dev/null");
    assert_eq!(c["pgid"], c["pid"], "a process group of its own");
    let l = h.list();
    assert_eq!(gpu(&l, B)["quarantine"], Value::Null);
    assert_eq!(gpu(&l, B)["problem"], Value::Null);
    assert!(metrics(&h).contains(r#"gpuhook_gpu_resets_total{pci="0000:1a:00.0",result="ok"} 1"#));

    for (mode, reason) in [
        ("fail", "reset failed: '"),
        (
            "allones",
            "reset failed: its PCI config space reads as all ones: fallen off the bus",
        ),
        (
            "exclude",
            "reset failed: excluded by the NVIDIA driver (GPU Excluded: Yes)",
        ),
        (
            "unlist",
            "reset failed: bound to the nvidia driver, which no longer lists it (no ",
        ),
    ] {
        standin_mode(&h.paths, mode);
        let e = reset_fails(&h, B, "gpuhook: GPU 0000:1a:00.0: reset failed after ");
        assert!(e.contains(&reason["reset failed: ".len()..]), "{mode}: {e}");
        assert!(
            e.trim_end()
                .ends_with("quarantined: `gpuhook health reset 0000:1a:00.0` tries again"),
            "{mode}: {e}"
        );
        let l = h.list();
        let q = &gpu(&l, B)["quarantine"];
        assert!(
            q["reason"].as_str().unwrap().starts_with(reason),
            "{mode}: {q}"
        );
        assert_eq!(q["action"], "reset", "{mode}");
        assert_eq!(h.holders(), held, "{mode}: reservations as they were");
        assert!(gpu(&l, B)["problem"]
            .as_str()
            .unwrap()
            .starts_with("quarantined"));
        // The driver lists it again, not excluded; the stand-in's reset brings its config
        // space back.
        std::fs::write(&info, &info_text).unwrap();
        standin_mode(&h.paths, "ok");
        assert!(reset_ok(&h, B).contains("back in service"), "{mode}");
    }
    let m = metrics(&h);
    assert!(
        m.contains(r#"gpuhook_gpu_resets_total{pci="0000:1a:00.0",result="ok"} 5"#),
        "{m}"
    );
    assert!(
        m.contains(r#"gpuhook_gpu_resets_total{pci="0000:1a:00.0",result="failed"} 4"#),
        "{m}"
    );
    assert_eq!(h.holders(), held);
}

fn json_str(s: &str) -> Value {
    Value::String(s.to_string())
}

/// Refused in one line while a holder holds the GPU (whole, or its shared slot) or a process
/// has one of its nodes open (named, as draining names them): nothing changes (the state
/// file, `list --json`, metrics), the reset program never runs.
#[test]
fn refused_resets_change_nothing() {
    let h = standin_host(|c| {
        c["sharing"] = serde_json::json!({"0000:42:00.0": {"replicas": 2}});
    });
    log_xids(&h, &[(B, 48, xid_text(48)), (D, 95, xid_text(95))]);
    assert_ok(&health(&h, &["scan"]));
    let exact = |p: &str| {
        format!(r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"><gpu:device pci="{p}"/></gpu:gpus>"#)
    };
    assert_ok(&h.hook("web1", "prepare", &domain("web1", 1, &exact(A))));
    // A sharer of D before its quarantine: it keeps its slot.
    let st: Value = serde_json::from_slice(&std::fs::read(&h.state).unwrap()).unwrap();
    let mut st = st;
    st["reservations"][common::uuid(2)] = serde_json::json!({
        "domain": "s1", "uuid": common::uuid(2), "gpus": ["0000:42:00.0/slot1"],
        "phase": "running", "request": "1 shared GPU slot",
        "created": "2026-12-01T00:00:00Z", "updated": "2026-12-01T00:00:00Z"
    });
    std::fs::write(&h.state, serde_json::to_vec(&st).unwrap()).unwrap();
    // A process outside any container with B's node open.
    let node = h.root().join("host/dev/nvidia3");
    common::openable(&node);
    let mut holder = common::hold_open(&node);
    let before = snapshot(&h);
    for (pci, needle) in [
        (A, "gpuhook: GPU 0000:18:00.0 is held by domain 'web1': it is reset only when nothing holds it"),
        (D, "gpuhook: GPU 0000:42:00.0 is held by domain 's1': it is reset only when nothing holds it"),
        (B, &format!("gpuhook: GPU 0000:1a:00.0 is open: pid {} (sleep) has /dev/nvidia3 open; it is reset only when no process has it open", holder.id())),
        ("0000:07:00.0", "gpuhook: 0000:07:00.0 is not a GPU this host lists"),
        ("zz", "gpuhook: no GPU with uuid zz on this host"),
        (
            "0000:zz",
            "gpuhook: '0000:zz' is neither a PCI address (0000:3b:00.0), a GPU UUID (GPU-…) nor an index",
        ),
    ] {
        reset_fails(&h, pci, needle);
        assert_eq!(snapshot(&h), before, "{pci}: something changed");
    }
    assert!(standin_calls(&h.paths).is_empty(), "the reset ran");
    // Let go: the reset runs.
    holder.kill();
    assert!(reset_ok(&h, B).contains("back in service"));
}

/// `reset_command: "pci"`: `1` written to the function's sysfs `reset`, then the probes; a
/// GPU whose config space still reads all ones after it stays quarantined with that reason.
#[test]
fn pci_function_level_reset() {
    let h = Host::with(FakeHost::dgx8(), |c| c["reset_command"] = "pci".into());
    log_xids(&h, &[(B, 119, xid_text(119)), (C, 120, xid_text(120))]);
    assert_ok(&health(&h, &["scan"]));
    let out = reset_ok(&h, B);
    assert!(
        out.contains("back in service (its quarantine after Xid 119 is lifted)"),
        "{out}"
    );
    assert_eq!(std::fs::read_to_string(sys(&h, B, "reset")).unwrap(), "1");
    // The function did not come back.
    config_all_ones(&h.paths, C);
    reset_fails(&h, C, "gpuhook: GPU 0000:40:00.0: reset failed after ");
    assert_eq!(std::fs::read_to_string(sys(&h, C, "reset")).unwrap(), "1");
    let l = h.list();
    let q = &gpu(&l, C)["quarantine"];
    assert_eq!(
        q["reason"],
        "reset failed: its PCI config space reads as all ones: fallen off the bus"
    );
    assert_eq!(q["xid"], 120);
    // A function the kernel offers no reset for: the config cannot reset it, said before
    // anything is marked (no quarantine made or counted).
    std::fs::remove_file(sys(&h, A, "reset")).unwrap();
    let before = snapshot(&h);
    let e = reset_fails(&h, A, "not reset: the config's reset_command cannot run: ");
    assert!(
        e.contains(&format!(
            "{}: No such file or directory (os error 2): the kernel offers no function-level reset for it; a configuration fault, so nothing was marked and the GPU keeps its state: name a reset program in reset_command",
            sys(&h, A, "reset").display()
        )),
        "{e}"
    );
    assert_eq!(snapshot(&h), before, "the refusal changed something");
}

/// `auto_reset`: the scan resets a free GPU quarantined with the reset action; a GPU
/// quarantined `max_quarantines` times within 24 hours needs inspection: listed so, not
/// reset by the scan, not lifted by `health reset`; `health clear` lifts it and counts anew.
#[test]
fn auto_reset_and_escalation() {
    let h = standin_host(|c| {
        c["auto_reset"] = true.into();
        c["max_quarantines"] = 2.into();
    });
    let mut recs = vec![(B, 48, xid_text(48)), (D, 79, xid_text(79))];
    log_xids(&h, &recs);
    config_all_ones(&h.paths, D);
    let o = health(&h, &["scan"]);
    assert_ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with("2 new kernel log records read, 2 GPUs quarantined\nGPU 0000:1a:00.0 reset (auto_reset) in "), "{out}");
    assert!(
        out.contains("back in service (its quarantine after Xid 48 is lifted)"),
        "{out}"
    );
    let l = h.list();
    assert_eq!(gpu(&l, B)["quarantine"], Value::Null);
    assert_eq!(gpu(&l, D)["quarantine"]["action"], "reboot", "not reset");
    // Again: the second within 24 hours.
    recs.push((B, 74, xid_text(74)));
    log_xids(&h, &recs);
    let o = health(&h, &["scan"]);
    assert_ok(&o);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "1 new kernel log record read, 1 GPU quarantined\n",
        "escalated: not reset"
    );
    assert!(common::stderr(&o).contains("GPU 0000:1a:00.0 was quarantined 2 times within 24 hours: it needs inspection, and stays quarantined until `gpuhook health clear 0000:1a:00.0`"));
    let l = h.list();
    let q = &gpu(&l, B)["quarantine"];
    assert_eq!(
        (q["count_24h"].as_u64(), q["needs_inspection"].as_bool()),
        (Some(2), Some(true))
    );
    assert!(gpu(&l, B)["problem"].as_str().unwrap().ends_with(
        "; quarantined 2 times within 24 hours: needs inspection; `gpuhook health clear 0000:1a:00.0` returns it"
    ));
    let t = h.cmd().arg("list").output().unwrap();
    let t = String::from_utf8_lossy(&t.stdout);
    let row = t.lines().find(|l| l.contains(B)).unwrap();
    assert!(
        row.contains("unusable: quarantined after Xid 74") && row.contains("needs inspection"),
        "{row}"
    );
    assert!(metrics(&h).contains(r#"gpuhook_gpu_needs_inspection{pci="0000:1a:00.0"} 1"#));
    // A reset that passes lifts nothing.
    let out = reset_ok(&h, B);
    assert!(out.contains("still quarantined after Xid 74 (it needs inspection: `gpuhook health clear 0000:1a:00.0` returns it)"), "{out}");
    // health clear: lifted, counted anew.
    assert_ok(&health(&h, &["clear", B]));
    recs.push((B, 46, "pid=0, GPU stopped processing"));
    log_xids(&h, &recs);
    assert_ok(&health(&h, &["scan"]));
    let l = h.list();
    assert_eq!(
        gpu(&l, B)["quarantine"],
        Value::Null,
        "the first after clear: reset"
    );
    let m = metrics(&h);
    assert!(
        m.contains(r#"gpuhook_gpu_needs_inspection{pci="0000:1a:00.0"} 0"#),
        "{m}"
    );
    assert!(
        m.contains(r#"gpuhook_gpu_resets_total{pci="0000:1a:00.0",result="ok"} 3"#),
        "{m}"
    );
}

/// The reboot action ends with a new boot id (a reset does not end it; `health clear` does).
#[test]
fn a_new_boot_id_ends_a_reboot_quarantine() {
    let h = standin_host(|_| {});
    log_xids(
        &h,
        &[
            (B, 79, xid_text(79)),
            (C, 154, &xid_154("Node Reboot Required")),
            (D, 48, xid_text(48)),
        ],
    );
    config_all_ones(&h.paths, B);
    assert_ok(&health(&h, &["scan"]));
    let out = reset_ok(&h, B);
    assert!(
        out.contains("; still quarantined after Xid 79 (a reboot ends it)"),
        "{out}"
    );
    assert_eq!(gpu(&h.list(), B)["quarantine"]["action"], "reboot");
    reboot(
        &h.paths,
        "7b1c3f0e-2d4a-4c55-8e61-90a1b2c3d4e5",
        "6,1,1000,-;Linux version 6.1.0-27-amd64 (debian-kernel@lists.debian.org)\n",
    );
    let o = h.cmd().args(["-v", "health", "scan"]).output().unwrap();
    assert_ok(&o);
    let e = common::stderr(&o);
    assert!(
        e.contains("GPU 0000:1a:00.0: its quarantine after Xid 79 ended: the host rebooted"),
        "{e}"
    );
    let l = h.list();
    assert_eq!(gpu(&l, B)["quarantine"], Value::Null);
    assert_eq!(gpu(&l, C)["quarantine"], Value::Null);
    assert_eq!(
        gpu(&l, D)["quarantine"]["action"],
        "reset",
        "a reset quarantine stays"
    );
}

/// `reset_on_release`: every free marks a GPU its last holder let go of scrub pending
/// (unusable: `list`, `--json`, metrics, Placement); no request gets it; `health scan`
/// resets it, and it is free again.
#[test]
fn reset_on_release_scrubs_freed_gpus() {
    let h = standin_host(|c| c["reset_on_release"] = true.into());
    let xml = domain("web1", 1, &gpus(r#"count="2""#));
    assert_ok(&h.hook("web1", "prepare", &xml));
    let mine = h.holders()["web1"].clone();
    assert_ok(&h.hook("web1", "stopped", &xml));
    assert_ok(&h.hook("web2", "prepare", &domain("web2", 2, &gpus(""))));
    let theirs = h.holders()["web2"].clone();
    assert!(
        !mine.contains(&theirs[0]),
        "web2 got a GPU web1 left: {theirs:?}"
    );
    assert_ok(&h.cmd().args(["release", "web2"]).output().unwrap());
    let l = h.list();
    for p in mine.iter().chain(&theirs) {
        assert_eq!(gpu(&l, p)["scrub_pending"], true, "{p}");
        assert!(
            gpu(&l, p)["problem"]
                .as_str()
                .unwrap()
                .starts_with("scrub pending: "),
            "{p}"
        );
    }
    let t = h.cmd().arg("list").output().unwrap();
    let t = String::from_utf8_lossy(&t.stdout);
    assert_eq!(t.matches("unusable: scrub pending").count(), 3, "{t}");
    let m = metrics(&h);
    assert!(
        m.contains(&format!(
            "gpuhook_gpu_scrub_pending{{pci=\"{}\"}} 1",
            mine[0]
        )),
        "{m}"
    );
    assert!(placement(&h)
        .contains("- CUSTOM_GPU_HOPPER:\n            total: 8\n            reserved: 3\n"));
    assert_fails(
        &h.hook("big", "prepare", &domain("big", 3, &gpus(r#"count="6""#))),
        "big",
        "only 5 of the host's 8 matching GPUs are free: 3 unusable (",
    );
    // The timer's scan resets them.
    std::fs::write(kmsg(&h), "").unwrap();
    let o = health(&h, &["scan"]);
    assert_ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.matches("(scrub after release) in ").count(), 3, "{out}");
    assert_eq!(out.matches("; scrubbed, free again").count(), 3, "{out}");
    assert_eq!(standin_calls(&h.paths).len(), 3);
    let l = h.list();
    for p in mine.iter().chain(&theirs) {
        assert_eq!(gpu(&l, p)["scrub_pending"], false, "{p}");
        assert_eq!(gpu(&l, p)["problem"], Value::Null, "{p}");
    }
    assert_ok(&h.hook("big", "prepare", &domain("big", 3, &gpus(r#"count="8""#))));
}

/// A reset SIGKILLed at each step (strace's fault injection: at the entry of the N-th call
/// of a syscall) leaves the GPU quarantined or resetting, never free and unprobed, and
/// every reservation as it was; the next `health reset` brings it back.
#[test]
fn a_killed_reset_never_frees_an_unprobed_gpu() {
    // `gpuhook health reset`, step by step (`strace -f`): the state lock (flock 1), the mark
    // written (renameat 1), the reset's child forked (clone 1), its output read (poll 1),
    // reaped (wait4 1), the outcome's lock (flock 2) and write (renameat 2).
    let steps: [(&str, &str, u32, bool); 7] = [
        ("before the mark", "flock", 1, false),
        ("mark written, not renamed", "renameat", 1, false),
        ("marked, the reset not started", "clone", 1, true),
        ("the reset running", "poll", 1, true),
        ("the reset done, not reaped", "wait4", 1, true),
        ("probed, the outcome not locked", "flock", 2, true),
        ("the outcome written, not renamed", "renameat", 2, true),
    ];
    for (at, call, when, resetting) in steps {
        let h = standin_host(|_| {});
        standin_mode(&h.paths, "slow");
        log_xids(&h, &[(B, 48, xid_text(48))]);
        assert_ok(&health(&h, &["scan"]));
        assert_ok(&h.hook("web1", "prepare", &domain("web1", 1, &gpus(""))));
        let held = h.holders();
        let o = std::process::Command::new("strace")
            .args(["-e", &format!("trace={call}"), "-e"])
            .arg(format!("inject={call}:signal=SIGKILL:when={when}"))
            .arg(common::bin())
            .args(["health", "reset", B])
            .env("GPUHOOK_CONFIG", &h.config)
            .output()
            .expect("strace");
        let err = common::stderr(&o);
        assert!(err.contains("killed by SIGKILL"), "{at}: not killed: {err}");
        // The stand-in died with it (its parent-death signal), or never ran.
        for c in standin_calls(&h.paths) {
            common::wait_gone(
                c["pid"].as_i64().unwrap() as i32,
                std::time::Duration::from_secs(5),
            );
        }
        let l = h.list();
        let g = gpu(&l, B);
        assert_eq!(g["quarantine"]["xid"], 48, "{at}: {g}");
        assert_eq!(!g["resetting"].is_null(), resetting, "{at}: {g}");
        assert!(
            g["problem"]
                .as_str()
                .unwrap()
                .starts_with("quarantined after Xid 48"),
            "{at}"
        );
        assert!(
            metrics(&h).contains(r#"gpuhook_gpu_usable{pci="0000:1a:00.0"} 0"#),
            "{at}"
        );
        assert_eq!(h.holders(), held, "{at}");
        // Never handed out.
        let exact = format!(
            r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"><gpu:device pci="{B}"/></gpu:gpus>"#
        );
        assert_fails(
            &h.hook("web2", "prepare", &domain("web2", 2, &exact)),
            "web2",
            "cannot be used: quarantined after Xid 48",
        );
        // The next reset takes over and brings it back.
        standin_mode(&h.paths, "ok");
        let out = reset_ok(&h, B);
        assert!(out.contains("back in service"), "{at}: {out}");
        assert_eq!(out.contains("taken over"), resetting, "{at}: {out}");
        let l = h.list();
        assert_eq!(gpu(&l, B)["problem"], Value::Null, "{at}");
        assert_eq!(gpu(&l, B)["resetting"], Value::Null, "{at}");
    }
}

/// A reset that never ends is killed at the 30 s deadline: failed, the GPU stays
/// quarantined.
#[test]
fn a_hung_reset_is_killed_at_30_s() {
    let h = standin_host(|_| {});
    standin_mode(&h.paths, "hang");
    log_xids(&h, &[(B, 48, xid_text(48))]);
    assert_ok(&health(&h, &["scan"]));
    let t = std::time::Instant::now();
    let e = reset_fails(&h, B, "it did not end within 30s (killed)");
    let took = t.elapsed();
    assert!(
        took >= std::time::Duration::from_secs(30) && took < std::time::Duration::from_secs(40),
        "{took:?}: {e}"
    );
    let pid = standin_calls(&h.paths)[0]["pid"].as_i64().unwrap() as i32;
    common::wait_gone(pid, std::time::Duration::from_secs(5));
    assert_eq!(gpu(&h.list(), B)["quarantine"]["action"], "reset");
}

/// A state file written by an earlier gpuhook (quarantines without an action) keeps its
/// meaning: quarantined until `health clear` (a reset or a new boot does not end it), listed
/// with `action: null`; the file is read and written back unchanged but for what changes.
#[test]
fn state_files_written_before_keep_their_meaning() {
    let h = standin_host(|_| {});
    std::fs::create_dir_all(h.state.parent().unwrap()).unwrap();
    let old = "{\"version\":1,\"reservations\":{\n},\n\"quarantine\":{\"0000:1a:00.0\":{\"xid\":92,\"reason\":\"high single-bit ECC error rate\",\"message\":\"NVRM: Xid (PCI:0000:1a:00): 92, pid=0, High single-bit ECC error rate\",\"since\":\"2026-11-30T18:31:07Z\"}},\n\"kmsg\":{\"boot_id\":\"0f4a9a4e-5a4c-4b61-9d3b-2b1c0f5e8a71\",\"seq\":1532}}\n";
    std::fs::write(&h.state, old).unwrap();
    std::os::unix::fs::chown(h.state.parent().unwrap(), Some(0), Some(0)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&h.state, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(
        h.state.parent().unwrap(),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    let l = h.list();
    let q = &gpu(&l, B)["quarantine"];
    assert_eq!(q["xid"], 92);
    assert_eq!(q["action"], Value::Null);
    assert_eq!(
        gpu(&l, B)["problem"],
        "quarantined after Xid 92 (high single-bit ECC error rate) at 2026-11-30T18:31:07Z; `gpuhook health clear 0000:1a:00.0` returns it"
    );
    // A scan with nothing new leaves the file as it was.
    std::fs::write(kmsg(&h), "").unwrap();
    assert_ok(&health(&h, &["scan"]));
    assert_eq!(std::fs::read_to_string(&h.state).unwrap(), old);
    // A reset does not end it; a new boot does not.
    let out = reset_ok(&h, B);
    assert!(
        out.contains(
            "still quarantined after Xid 92 (`gpuhook health clear 0000:1a:00.0` ends it)"
        ),
        "{out}"
    );
    reboot(&h.paths, "7b1c3f0e-2d4a-4c55-8e61-90a1b2c3d4e5", "");
    assert_ok(&health(&h, &["scan"]));
    assert_eq!(gpu(&h.list(), B)["quarantine"]["xid"], 92);
    assert_ok(&health(&h, &["clear", B]));
    assert_eq!(gpu(&h.list(), B)["quarantine"], Value::Null);
}
