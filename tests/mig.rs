//! MIG compute instances as the units of a GPU in MIG mode, on the 8×H100 fake host with
//! mixed layouts (`FakeHost::dgx8_mig`: the driver's capability files and nodes as
//! `nv-caps.c` and nvidia-modprobe make them), through the hook and the OCI door's parser.

mod common;

use common::{assert_fails, assert_ok, domain, gpus, Host};
use testbed::fakehost::{mig_minor, CAPS_MAJOR};
use testbed::FakeHost;

const NS: &str = r#"xmlns:gpu="urn:gpuhook:gpu:1""#;

use common::gpu_of as gpu;

fn held(h: &Host, name: &str) -> Vec<String> {
    h.list()["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["domain"] == name)
        .map(|r| {
            r["gpus"]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| g.as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn inventory_lists_instances_with_their_capability_nodes() {
    let h = Host::new(FakeHost::dgx8_mig());
    let list = h.list();
    let migs = gpu(&list, "0000:18:00.0")["migs"].as_array().unwrap();
    assert_eq!(migs.len(), 7);
    // /dev/nvidia2's GPU instance 7, compute instance 0: every node a holder gets, the
    // parent's /dev/nvidia2 first.
    assert_eq!(migs[0]["id"], "0000:18:00.0/gi7/ci0");
    assert_eq!(
        migs[0]["nodes"],
        serde_json::json!([
            {"path": "/dev/nvidia2", "major": 195, "minor": 2},
            {"path": format!("/dev/nvidia-caps/nvidia-cap{}", mig_minor(2, 7, None)), "major": CAPS_MAJOR, "minor": mig_minor(2, 7, None)},
            {"path": format!("/dev/nvidia-caps/nvidia-cap{}", mig_minor(2, 7, Some(0))), "major": CAPS_MAJOR, "minor": mig_minor(2, 7, Some(0))},
        ])
    );
    let m40: Vec<&str> = gpu(&list, "0000:40:00.0")["migs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        m40,
        [
            "0000:40:00.0/gi1/ci0",
            "0000:40:00.0/gi1/ci1",
            "0000:40:00.0/gi5/ci0",
            "0000:40:00.0/gi13/ci0"
        ]
    );
    assert_eq!(gpu(&list, "0000:42:00.0")["migs"], serde_json::json!([]));
    let text = h.cmd().arg("list").output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("MIG: 7 of 7 instances free"), "{text}");
    // A host without its capability nodes: numbers from /proc/devices' nvidia-caps major.
    std::fs::remove_dir_all(h.root().join("host/dev/nvidia-caps")).unwrap();
    let list = h.list();
    assert_eq!(
        gpu(&list, "0000:1a:00.0")["migs"][1]["nodes"][2]["minor"],
        mig_minor(3, 2, Some(0))
    );
    assert_eq!(
        gpu(&list, "0000:1a:00.0")["migs"][1]["nodes"][2]["major"],
        CAPS_MAJOR
    );
}

#[test]
fn whole_gpus_and_instances_never_mix() {
    let h = Host::new(FakeHost::dgx8_mig());
    // Whole GPUs: the five without MIG; a MIG GPU is never given whole.
    assert_fails(
        &h.hook("w", "prepare", &domain("w", 1, &gpus(r#"count="6""#))),
        "w",
        "only 5 of the host's 8 matching GPUs are free: 3 in MIG mode (handed out as instances: mig='yes')",
    );
    let exact = format!(r#"<gpu:gpus {NS}><gpu:device pci="0000:18:00.0"/></gpu:gpus>"#);
    assert_fails(
        &h.hook("x", "prepare", &domain("x", 2, &exact)),
        "x",
        "GPU 0000:18:00.0 (pci 0000:18:00.0) is in MIG mode with 7 instances: ask for them (mig='yes')",
    );
    assert_ok(&h.hook("w", "prepare", &domain("w", 1, &gpus(r#"count="5""#))));
    assert!(held(&h, "w").iter().all(|u| !u.contains('/')));

    // Instances: by count, and exact ones; each held once.
    assert_ok(&h.hook(
        "a",
        "prepare",
        &domain("a", 3, &gpus(r#"mig="yes" count="2""#)),
    ));
    let a = held(&h, "a");
    assert_eq!(a.len(), 2);
    assert!(a.iter().all(|u| u.starts_with("0000:18:00.0/gi")), "{a:?}");
    let one = format!(r#"<gpu:gpus {NS}><gpu:mig pci="0000:40:00.0" gi="1" ci="1"/></gpu:gpus>"#);
    assert_ok(&h.hook("b", "prepare", &domain("b", 4, &one)));
    assert_eq!(held(&h, "b"), ["0000:40:00.0/gi1/ci1"]);
    assert_fails(
        &h.hook("c", "prepare", &domain("c", 5, &one)),
        "c",
        "0000:40:00.0/gi1/ci1 (MIG pci 0000:40:00.0 gi 1 ci 1) is held by domain 'b'",
    );
    let missing = format!(r#"<gpu:gpus {NS}><gpu:mig index="2" gi="3" ci="0"/></gpu:gpus>"#);
    assert_fails(
        &h.hook("c", "prepare", &domain("c", 5, &missing)),
        "c",
        "GPU 0000:40:00.0 has no MIG instance gi 3 ci 0",
    );
    // 13 instances on the host, 3 held, and gi1/ci0 shares b's GPU instance: 9 free.
    assert_fails(
        &h.hook("c", "prepare", &domain("c", 5, &gpus(r#"mig="yes" count="10""#))),
        "c",
        "cannot reserve 10 MIG instances: only 9 of the host's 13 MIG instances on matching GPUs are free: held by domain 'a', domain 'b'",
    );
    assert_fails(
        &h.hook(
            "c",
            "prepare",
            &domain("c", 5, &gpus(r#"mig="yes" arch="ampere""#)),
        ),
        "c",
        "only 0 of the host's 0 MIG instances",
    );
    assert_ok(&h.hook(
        "c",
        "prepare",
        &domain("c", 5, &gpus(r#"mig="yes" count="9""#)),
    ));
    assert_eq!(held(&h, "c").len(), 9);
    // Freed at stop: the instances are free again.
    assert_ok(&h.hook(
        "a",
        "stopped",
        &domain("a", 3, &gpus(r#"mig="yes" count="2""#)),
    ));
    let list = h.list();
    let free_on_18 = gpu(&list, "0000:18:00.0")["migs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["holder"].is_null())
        .count();
    assert_eq!(free_on_18, 2);
    // Metrics: each instance and its holder; Prometheus's own checker accepts them.
    let m = h.cmd().arg("metrics").output().unwrap();
    assert_ok(&m);
    let text = String::from_utf8_lossy(&m.stdout).into_owned();
    assert!(
        text.contains(
            r#"gpuhook_mig_reserved{pci="0000:40:00.0",gi="1",ci="1",kind="libvirt",holder="b"} 1"#
        ),
        "{text}"
    );
    assert!(text
        .contains(r#"gpuhook_mig_reserved{pci="0000:18:00.0",gi="7",ci="0",kind="",holder=""} 0"#));
    let check = common::run_with_stdin(
        std::process::Command::new("promtool").args(["check", "metrics"]),
        &text,
    );
    assert!(
        check.status.success() && check.stdout.is_empty(),
        "promtool: {}",
        common::stderr(&check)
    );
}

/// Compute instances of one GPU instance share its memory, engines and fault domain: a GPU
/// instance serves one holder at a time. 0000:40:00.0's gi 1 has two compute instances: with
/// one held, the other is refused to an exact request (naming the holder) and never picked by
/// a packed one; one holder may take both.
#[test]
fn one_gpu_instance_serves_one_holder() {
    let h = Host::new(FakeHost::dgx8_mig());
    let mig = |sels: &[(u32, u32)]| {
        let kids: String = sels
            .iter()
            .map(|(gi, ci)| format!(r#"<gpu:mig pci="0000:40:00.0" gi="{gi}" ci="{ci}"/>"#))
            .collect();
        format!(r#"<gpu:gpus {NS}>{kids}</gpu:gpus>"#)
    };
    assert_ok(&h.hook("b", "prepare", &domain("b", 1, &mig(&[(1, 1)]))));
    assert_fails(
        &h.hook("c", "prepare", &domain("c", 2, &mig(&[(1, 0)]))),
        "c",
        "0000:40:00.0/gi1/ci0 (MIG pci 0000:40:00.0 gi 1 ci 0): its GPU instance gi 1 is held by domain 'b' (through 0000:40:00.0/gi1/ci1); compute instances of one GPU instance share its memory and engines",
    );
    assert!(held(&h, "c").is_empty());
    // 13 instances, b holds one and its GPU instance's other: 11 for a packed request.
    assert_fails(
        &h.hook("d", "prepare", &domain("d", 3, &gpus(r#"mig="yes" count="12""#))),
        "d",
        "cannot reserve 12 MIG instances: only 11 of the host's 13 MIG instances on matching GPUs are free: held by domain 'b'",
    );
    assert_ok(&h.hook(
        "d",
        "prepare",
        &domain("d", 3, &gpus(r#"mig="yes" count="11""#)),
    ));
    let d = held(&h, "d");
    assert_eq!(d.len(), 11);
    assert!(
        !d.iter().any(|u| u.starts_with("0000:40:00.0/gi1/")),
        "{d:?}"
    );
    // One holder, both compute instances of gi 1.
    assert_ok(&h.hook(
        "d",
        "stopped",
        &domain("d", 3, &gpus(r#"mig="yes" count="11""#)),
    ));
    assert_ok(&h.hook("b", "stopped", &domain("b", 1, &mig(&[(1, 1)]))));
    assert_ok(&h.hook("e", "prepare", &domain("e", 4, &mig(&[(1, 0), (1, 1)]))));
    assert_eq!(
        held(&h, "e"),
        ["0000:40:00.0/gi1/ci0", "0000:40:00.0/gi1/ci1"]
    );
    assert_fails(
        &h.hook("b", "prepare", &domain("b", 1, &mig(&[(1, 1)]))),
        "b",
        "0000:40:00.0/gi1/ci1 (MIG pci 0000:40:00.0 gi 1 ci 1) is held by domain 'e'",
    );
}

/// What a container holding an instance gets: its GPU's node, its two access capability
/// nodes and the control nodes; never the management capabilities (`nvidia-cap1` config,
/// `nvidia-cap2` monitor) nor another instance's.
#[test]
fn an_instance_gets_its_own_capabilities_only() {
    let h = Host::new(FakeHost::dgx8_mig());
    let one = format!(
        r#"<gpu:gpus {NS} mode="0640"><gpu:mig pci="0000:1a:00.0" gi="2" ci="0"/></gpu:gpus>"#
    );
    let o = common::run_with_stdin(h.cmd().args(["check", "-"]), &domain("a", 1, &one));
    assert_ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    let (gi, ci) = (mig_minor(3, 2, None), mig_minor(3, 2, Some(0)));
    assert!(
        out.contains("asks for 1 MIG instance, MIG pci 0000:1a:00.0 gi 2 ci 0"),
        "{out}"
    );
    assert!(out.contains("would get"), "{out}");
    assert!(
        out.contains(&format!(
            "nodes: /dev/nvidia3 (195:3) /dev/nvidia-caps/nvidia-cap{gi} ({CAPS_MAJOR}:{gi}) /dev/nvidia-caps/nvidia-cap{ci} ({CAPS_MAJOR}:{ci}) /dev/nvidiactl (195:255)"
        )),
        "{out}"
    );
    assert!(!out.contains("nvidia-cap1 ") && !out.contains("nvidia-cap2 "));
    assert!(!out.contains(&format!("nvidia-cap{} ", mig_minor(3, 1, None))));
}

#[test]
fn malformed_mig_requests() {
    let h = Host::new(FakeHost::dgx8_mig());
    for (meta, needle) in [
        (gpus(r#"mig="maybe""#), "mig 'maybe' is not yes or no"),
        (
            format!(r#"<gpu:gpus {NS}><gpu:mig pci="0000:18:00.0" gi="7"/></gpu:gpus>"#),
            "<mig> needs gi and ci",
        ),
        (
            format!(r#"<gpu:gpus {NS}><gpu:mig gi="7" ci="0"/></gpu:gpus>"#),
            "<mig> must name its GPU",
        ),
        (
            format!(
                r#"<gpu:gpus {NS}><gpu:mig pci="0000:18:00.0" index="0" gi="7" ci="0"/></gpu:gpus>"#
            ),
            "exactly one of pci, uuid, index",
        ),
        (
            format!(
                r#"<gpu:gpus {NS}><gpu:device pci="0000:42:00.0"/><gpu:mig pci="0000:18:00.0" gi="7" ci="0"/></gpu:gpus>"#
            ),
            "either whole GPUs (<device>) or MIG instances",
        ),
        (
            format!(
                r#"<gpu:gpus {NS} mig="no"><gpu:mig pci="0000:18:00.0" gi="7" ci="0"/></gpu:gpus>"#
            ),
            "but mig='no'",
        ),
        (
            format!(
                r#"<gpu:gpus {NS}><gpu:mig pci="0000:18:00.0" gi="7" ci="0" size="1g"/></gpu:gpus>"#
            ),
            "unknown attribute 'size' on <mig>",
        ),
    ] {
        assert_fails(&h.hook("m", "prepare", &domain("m", 1, &meta)), "m", needle);
    }
    assert!(h.holders().is_empty());
}

/// An instance whose holder is gone (prepared by a process that exited, no container) is
/// listed as stale in `list --json` and in the table, never as a live holder; a live
/// holder's is not. Its nodes are the ones a holder gets, the parent's `/dev/nvidiaN` first.
#[test]
fn a_gone_holder_of_an_instance_is_listed_stale() {
    let h = Host::new(FakeHost::dgx8_mig());
    let one = |gi: u32| {
        format!(r#"<gpu:gpus {NS}><gpu:mig pci="0000:40:00.0" gi="{gi}" ci="0"/></gpu:gpus>"#)
    };
    let o = common::run_with_stdin(
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "{} hook gone prepare begin - ; exit $?",
                common::bin().display()
            ))
            .env("GPUHOOK_CONFIG", &h.config),
        &domain("gone", 1, &one(1)),
    );
    assert_ok(&o);
    assert_ok(&h.hook("live", "prepare", &domain("live", 2, &one(5))));
    let list = h.list();
    let migs = gpu(&list, "0000:40:00.0")["migs"]
        .as_array()
        .unwrap()
        .clone();
    let by_id = |id: &str| migs.iter().find(|m| m["id"] == id).unwrap().clone();
    let gone = by_id("0000:40:00.0/gi1/ci0");
    assert_eq!(
        (&gone["holder"]["domain"], &gone["holder"]["stale"]),
        (&serde_json::json!("gone"), &serde_json::json!(true)),
        "{gone}"
    );
    let live = by_id("0000:40:00.0/gi5/ci0");
    assert_eq!(
        (&live["holder"]["domain"], &live["holder"]["stale"]),
        (&serde_json::json!("live"), &serde_json::json!(false)),
        "{live}"
    );
    assert_eq!(live["nodes"][0]["path"], "/dev/nvidia0", "{live}");
    assert_eq!(live["nodes"].as_array().unwrap().len(), 3, "{live}");
    let text = h.cmd().arg("list").output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("MIG: 2 of 4 instances free (gi1/ci0 stale: gone, gi5/ci0 live)"),
        "{text}"
    );
}
