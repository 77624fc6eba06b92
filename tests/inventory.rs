//! Inventory of fake hosts through `gpuhook list --json`: PCI order, NUMA, parents, device
//! numbers from `stat` of the host nodes, overrides, exclusion, the PCI id database fallback,
//! and hosts whose files are missing or odd.

mod common;
use common::*;
use testbed::fakehost::{self, Driver, FakeDevice};
use testbed::FakeHost;

fn pcis(l: &serde_json::Value) -> Vec<String> {
    l["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["pci"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn dgx8_order_numa_minors() {
    let h = Host::new(FakeHost::dgx8());
    let l = h.list();
    assert_eq!(
        pcis(&l),
        [
            "0000:18:00.0",
            "0000:1a:00.0",
            "0000:40:00.0",
            "0000:42:00.0",
            "0000:9a:00.0",
            "0000:9c:00.0",
            "0000:c8:00.0",
            "0000:ca:00.0"
        ]
    );
    let g = l["gpus"].as_array().unwrap();
    // Device minors are the driver's, not PCI order.
    assert_eq!(g[0]["devices"], serde_json::json!(["/dev/nvidia2"]));
    assert_eq!(
        g[2]["nodes"][0],
        serde_json::json!({"path": "/dev/nvidia0", "major": 195, "minor": 0})
    );
    assert_eq!(g[3]["numa_node"], 0);
    assert_eq!(g[4]["numa_node"], 1);
    assert_eq!(g[0]["parent"], "0000:15:01.0");
    assert_eq!(g[1]["parent"], "0000:15:01.0");
    assert_eq!(g[2]["parent"], "0000:3f:01.0");
    assert_eq!(g[7]["arch"], "hopper");
    let controls: Vec<&str> = l["controls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        controls,
        [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia-modeset"
        ]
    );
    assert_eq!(
        l["controls"][1]["major"],
        fakehost::UVM_MAJOR,
        "uvm major from stat, not assumed"
    );
}

#[test]
fn overrides_and_exclusion() {
    let h = Host::with(FakeHost::blueprint(), |c| {
        c["exclude"] = serde_json::json!(["0000:08:00.0"]);
        c["overrides"] = serde_json::json!({
            "10de:06de": {"arch": "Fermi-GF100", "model": "Tesla M2050 (cg1)"},
            "0000:08:00.0": {"model": "Spare M2050"}
        });
    });
    let l = h.list();
    assert_eq!(l["gpus"][0]["arch"], "fermi-gf100");
    assert_eq!(l["gpus"][0]["model"], "Tesla M2050 (cg1)");
    assert_eq!(
        l["gpus"][1]["model"], "Spare M2050",
        "the address wins over the id"
    );
    assert_eq!(l["gpus"][1]["arch"], "fermi-gf100");
    assert_eq!(l["gpus"][1]["excluded"], true);
    assert_eq!(l["gpus"][1]["index"], 1, "excluded GPUs keep their index");
}

#[test]
fn pci_ids_fallback_and_unknown() {
    let mut host = FakeHost::blueprint();
    // P102-100 (10de:1b07) is not in the built-in table: its arch comes from the chip name.
    host.devices.push(FakeDevice {
        pci: "0000:0a:00.0".into(),
        vendor: 0x10de,
        device: 0x1b07,
        class: 0x030000,
        subsystem: (0x10de, 0),
        numa: -1,
        upstream: vec!["pci0000:00".into(), "0000:00:09.0".into()],
        driver: Driver::Nvidia {
            minor: 2,
            model: "".into(),
            uuid: "GPU-00000000-1111-2222-3333-444444444444".into(),
            old_format: false,
        },
    });
    let h = Host::new(host.clone());
    let l = h.list();
    assert_eq!(l["gpus"][2]["arch"], "pascal");
    assert_eq!(l["gpus"][2]["model"], "P102-100");
    // With a database that lacks it, arch is unknown (null) and the id is the model.
    let ids = h.root().join("pci.ids");
    std::fs::write(
        &ids,
        "10de  NVIDIA Corporation\n\t06de  GF100GL [Tesla T20 Processor]\n",
    )
    .unwrap();
    let h2 = Host::with(host, |c| c["pci_ids"] = serde_json::json!(ids));
    let l = h2.list();
    assert_eq!(l["gpus"][2]["arch"], serde_json::Value::Null);
    assert_eq!(l["gpus"][2]["model"], "10de:1b07");
    // An unknown arch never matches an arch request.
    let o = h2.hook("p", "prepare", &domain("p", 1, r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"><gpu:device index="2"/><gpu:extra_spec name="gpu_arch">s== pascal</gpu:extra_spec></gpu:gpus>"#));
    assert_fails(
        &o,
        "p",
        "does not match arch == pascal (it is nvidia unknown-arch 10de:1b07)",
    );
}

#[test]
fn odd_hosts() {
    // A node that is not a character device, a missing node, a symlinked node: unusable, with the reason.
    let h = Host::new(FakeHost::dgx8());
    let dev = h.root().join("host/dev");
    std::fs::remove_file(dev.join("nvidia2")).unwrap();
    std::fs::write(dev.join("nvidia2"), "").unwrap();
    std::fs::remove_file(dev.join("nvidia3")).unwrap();
    std::fs::remove_file(dev.join("nvidia0")).unwrap();
    std::os::unix::fs::symlink("nvidia1", dev.join("nvidia0")).unwrap();
    let l = h.list();
    let g = l["gpus"].as_array().unwrap();
    assert!(
        g[0]["problem"]
            .as_str()
            .unwrap()
            .ends_with("/dev/nvidia2 is not a character device"),
        "{}",
        g[0]
    );
    assert!(
        g[1]["problem"]
            .as_str()
            .unwrap()
            .contains("nvidia3: No such file"),
        "{}",
        g[1]
    );
    assert!(
        g[2]["problem"]
            .as_str()
            .unwrap()
            .ends_with("/dev/nvidia0 is not a character device"),
        "{}",
        g[2]
    );
    assert_eq!(g[3]["problem"], serde_json::Value::Null);
    // Allocation skips them and says why when short.
    let o = h.hook("x", "prepare", &domain("x", 1, &gpus(r#"count="6""#)));
    assert_fails(
        &o,
        "x",
        "only 5 of the host's 8 matching GPUs are free: 3 unusable",
    );
    // A missing sysfs root is an error for GPU domains, naming the path.
    let h = Host::with(FakeHost::blueprint(), |c| {
        c["sysfs"] = serde_json::json!("/nonexistent/sys")
    });
    assert_fails(
        &h.hook("x", "prepare", &domain("x", 1, &gpus(""))),
        "x",
        "inventory: cannot list /nonexistent/sys/bus/pci/devices",
    );
    // Plain directories instead of sysfs symlinks, no numa_node: still found, parent unknown.
    let h = Host::new(FakeHost::blueprint());
    let devs = h.root().join("host/sys/bus/pci/devices");
    for e in std::fs::read_dir(&devs).unwrap() {
        let p = e.unwrap().path();
        let target = std::fs::canonicalize(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        std::process::Command::new("cp")
            .arg("-a")
            .arg(&target)
            .arg(&p)
            .status()
            .unwrap();
        let _ = std::fs::remove_file(p.join("numa_node"));
    }
    let l = h.list();
    assert_eq!(pcis(&l), ["0000:07:00.0", "0000:08:00.0"]);
    assert_eq!(l["gpus"][0]["parent"], serde_json::Value::Null);
    assert_eq!(l["gpus"][0]["numa_node"], serde_json::Value::Null);
}

/// Hosts whose sysfs lacks `uevent` read the same through `class`/`vendor`/`device`.
#[test]
fn without_uevent() {
    let with = Host::new(FakeHost::mixed());
    let without = Host::new(FakeHost::mixed());
    let mut removed = 0;
    for e in std::fs::read_dir(without.root().join("host/sys/bus/pci/devices")).unwrap() {
        let u = e.unwrap().path().join("uevent");
        assert!(u.exists(), "the fake host has uevent files");
        std::fs::remove_file(u).unwrap();
        removed += 1;
    }
    assert_eq!(removed, 5);
    let strip = |mut l: serde_json::Value| {
        for g in l["gpus"].as_array_mut().unwrap() {
            g.as_object_mut().unwrap().remove("problem");
        }
        l["gpus"].clone()
    };
    assert_eq!(strip(with.list()), strip(without.list()));
    // A uevent that disagrees with nothing else but is garbled: fall back, same result.
    let garbled = Host::new(FakeHost::blueprint());
    for e in std::fs::read_dir(garbled.root().join("host/sys/bus/pci/devices")).unwrap() {
        std::fs::write(e.unwrap().path().join("uevent"), "PCI_CLASS=zz\n").unwrap();
    }
    assert_eq!(pcis(&garbled.list()), ["0000:07:00.0", "0000:08:00.0"]);
}

#[test]
fn wide16() {
    let h = Host::new(FakeHost::wide(16));
    let l = h.list();
    assert_eq!(l["gpus"].as_array().unwrap().len(), 16);
    assert_eq!(l["gpus"][15]["numa_node"], 1);
    assert_eq!(l["gpus"][0]["arch"], "ampere");
}

#[test]
fn other_pci_functions_are_not_gpus() {
    // Bridges, NICs and NVMe bound to their drivers (skipped on the driver link alone), and
    // unbound Intel chipset functions (vendor 0x8086, so only the class tells).
    let bare = Host::new(FakeHost::wide(4)).list();
    let mut host = FakeHost::wide(4).with_other_functions(40);
    let h = Host::new(host.clone());
    let l = h.list();
    assert_eq!(pcis(&l), pcis(&bare));
    assert_eq!(pcis(&l).len(), 4);
    let idx: Vec<u64> = l["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, [0, 1, 2, 3]);
    // A GPU parked on vfio-pci (for a VM) is still a GPU: it keeps its index, never given.
    host.devices.push(FakeDevice {
        pci: "0000:05:00.0".into(),
        vendor: 0x10de,
        device: 0x20b0,
        class: 0x030200,
        subsystem: (0x10de, 0x134f),
        numa: 0,
        upstream: vec!["pci0000:00".into(), "0000:00:01.1".into()],
        driver: Driver::Other("vfio-pci"),
    });
    let hv = Host::new(host);
    let lv = hv.list();
    assert_eq!(pcis(&lv)[0], "0000:05:00.0");
    assert_eq!(pcis(&lv)[1..], pcis(&bare)[..]);
    assert!(lv["gpus"][0]["problem"].is_string(), "{}", lv["gpus"][0]);
    let xml = domain(
        "gh-other",
        1,
        r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1" count="4"/>"#,
    );
    assert!(h.hook("gh-other", "prepare", &xml).status.success());
    assert_eq!(h.holders()["gh-other"], pcis(&bare));
}

/// AMD Instinct MI300X enumerates as a processing accelerator (class 0x1200), not a display
/// device: it is a GPU (arch cdna3), and the GPUs after it keep their indices. Intel's NPU
/// (class 0x1200 too) is not.
#[test]
fn mi300_accelerators_are_gpus() {
    let h = Host::new(FakeHost::mi300());
    let l = h.list();
    assert_eq!(
        pcis(&l),
        [
            "0000:05:00.0",
            "0000:0c:00.0",
            "0000:8c:00.0",
            "0000:c1:00.0"
        ],
        "both MI300X (class 0x1200) are GPUs, the Intel NPU 0000:00:0b.0 (class 0x1200 too) is not"
    );
    let g = l["gpus"].as_array().unwrap();
    assert_eq!(
        (
            g[1]["arch"].as_str(),
            g[1]["model"].as_str(),
            g[1]["vendor"].as_str()
        ),
        (Some("cdna3"), Some("Instinct MI300X"), Some("amd"))
    );
    assert_eq!(
        g[1]["devices"],
        serde_json::json!(["/dev/dri/card2", "/dev/dri/renderD130"])
    );
    assert_eq!(g[2]["numa_node"], 1);
    assert_eq!(
        (g[3]["index"].as_u64(), g[3]["arch"].as_str()),
        (Some(3), Some("ada"))
    );
    let xml = domain(
        "gh-mi300",
        1,
        r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1" count="2" arch="CDNA3"/>"#,
    );
    let o = h.hook("gh-mi300", "prepare", &xml);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(h.holders()["gh-mi300"], ["0000:0c:00.0", "0000:8c:00.0"]);
    // By index: the L40S is still index 3.
    let xml = domain(
        "gh-idx3",
        2,
        r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"><gpu:device index="3"/></gpu:gpus>"#,
    );
    let o = h.hook("gh-idx3", "prepare", &xml);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(h.holders()["gh-idx3"], ["0000:c1:00.0"]);
}
