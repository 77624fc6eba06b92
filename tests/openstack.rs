//! OpenStack, against its own code (Nova 34.0.0 and openstack-placement 16.0.0 from PyPI,
//! in a virtualenv made once under `target/openstack-venv`):
//! - domain XML written by Nova's own metadata classes drives the hook (the blueprint's
//!   extra specs, Placement's `resources:CUSTOM_GPU_FERMI=2`, a flavor without GPUs);
//! - `gpuhook placement`'s provider config is read by Nova's own loader;
//! - a real Placement service gets three fake hosts' provider configs as Nova's resource
//!   tracker applies them, and its allocation candidates are exactly the hosts with the
//!   GPUs free, before and after the scheduler's claims.

mod common;

use common::{assert_ok, Host};
use serde_json::Value;
use std::process::Command;
use testbed::FakeHost;

/// Loads the provider configs of `dir` with Nova's own code; returns them as JSON.
const LOAD: &str = r#"
import json, sys
from nova import conf as nova_conf
from nova.compute import provider_config
nova_conf.CONF([], project='nova', default_config_files=[])
print(json.dumps(provider_config.get_provider_configs(sys.argv[1]), default=str))
"#;

#[test]
fn nova_loads_the_provider_config() {
    let py = common::openstack_venv().join("bin/python");
    let h = Host::with(FakeHost::mixed(), |c| {
        c["exclude"] = serde_json::json!(["0000:31:00.0"]);
    });
    let list = h.list();
    let dir = h.root().join("provider_config");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("gpuhook.yaml");
    assert_ok(
        &h.cmd()
            .args(["placement", "--output"])
            .arg(&out)
            .output()
            .unwrap(),
    );
    let o = Command::new(&py)
        .args(["-c", LOAD])
        .arg(&dir)
        .output()
        .unwrap();
    assert_ok(&o);
    let pcs: Value = serde_json::from_slice(&o.stdout).unwrap();
    let pc = &pcs["$COMPUTE_NODE"];
    assert_eq!(pc["identification"]["name"], "$COMPUTE_NODE", "{pcs}");
    // Each architecture's inventory: its GPUs, the excluded or unusable ones reserved.
    let mut want: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    for g in list["gpus"].as_array().unwrap() {
        let Some(arch) = g["arch"].as_str() else {
            continue;
        };
        let rc = format!("CUSTOM_GPU_{}", arch.to_uppercase().replace('-', "_"));
        let e = want.entry(rc).or_default();
        e.0 += 1;
        if g["excluded"] == true || !g["problem"].is_null() {
            e.1 += 1;
        }
    }
    assert!(
        want.values().any(|(_, r)| *r > 0),
        "the test host has a reserved GPU"
    );
    let mut got: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    for inv in pc["inventories"]["additional"].as_array().unwrap() {
        for (rc, v) in inv.as_object().unwrap() {
            assert_eq!(v["max_unit"], v["total"]);
            assert_eq!(
                (v["min_unit"].as_u64(), v["step_size"].as_u64()),
                (Some(1), Some(1))
            );
            got.insert(
                rc.clone(),
                (
                    v["total"].as_u64().unwrap(),
                    v["reserved"].as_u64().unwrap(),
                ),
            );
        }
    }
    assert_eq!(got, want);
    let traits: Vec<&str> = pc["traits"]["additional"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    for t in [
        "CUSTOM_GPU_VENDOR_NVIDIA",
        "CUSTOM_GPU_VENDOR_AMD",
        "CUSTOM_GPU_VENDOR_INTEL",
        "CUSTOM_GPU_ARCH_AMPERE",
    ] {
        assert!(traits.contains(&t), "{traits:?}");
    }
    // Nova refuses what Placement would: a lower-case trait makes its loader fail.
    let text = std::fs::read_to_string(&out).unwrap();
    std::fs::write(
        &out,
        text.replace("CUSTOM_GPU_VENDOR_AMD", "custom_gpu_vendor_amd"),
    )
    .unwrap();
    let o = Command::new(&py)
        .args(["-c", LOAD])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!o.status.success(), "Nova accepted a bad trait");
}

/// Nova's XML for an instance of `flavor` with these extra specs, as domain `n`.
fn nova_xml(name: &str, n: u32, flavor: &str, specs: Value) -> String {
    common::nova_domain(name, &common::uuid(n), "/bin/sh", flavor, &specs)
}

/// `hook NAME OP` with GPUHOOK_VERBOSE (information on stderr too).
fn hook_verbose(h: &Host, name: &str, op: &str, xml: &str) -> std::process::Output {
    let subop = if op == "stopped" { "end" } else { "begin" };
    common::run_with_stdin(
        h.cmd()
            .env("GPUHOOK_VERBOSE", "1")
            .args(["hook", name, op, subop, "-"]),
        xml,
    )
}

#[test]
fn nova_flavors_are_requests() {
    let h = Host::new(FakeHost::blueprint());
    let both = ["0000:07:00.0", "0000:08:00.0"];
    // The blueprint's flavor, verbatim, among Nova's other extra specs.
    let cg1 = nova_xml(
        "instance-00000001",
        1,
        "cg1.xlarge",
        serde_json::json!({"gpus": "= 2", "gpu_arch": "s== fermi", "hw:cpu_policy": "shared",
                           "hypervisor_type": "s== lxc"}),
    );
    assert!(
        cg1.contains("<nova:extraSpec name=\"gpus\">= 2</nova:extraSpec>"),
        "{cg1}"
    );
    let o = hook_verbose(&h, "instance-00000001", "prepare", &cg1);
    assert_ok(&o);
    let log = common::stderr(&o);
    assert!(
        log.contains("domain 'instance-00000001': GPU request from Nova flavor 'cg1.xlarge' extra specs: 2 GPUs, arch == fermi"),
        "{log}"
    );
    assert_eq!(h.holders()["instance-00000001"], both);
    // Placement's form: the flavor's resource class, while the GPUs are held: refused, one line.
    let g1 = nova_xml(
        "instance-00000002",
        2,
        "g1.fermi2",
        serde_json::json!({"resources:CUSTOM_GPU_FERMI": "2", "hw:mem_page_size": "any"}),
    );
    common::assert_fails(
        &h.hook("instance-00000002", "prepare", &g1),
        "instance-00000002",
        "arch in resource class CUSTOM_GPU_FERMI",
    );
    assert_ok(&h.hook("instance-00000001", "stopped", &cg1));
    assert_ok(&h.hook("instance-00000002", "prepare", &g1));
    assert_eq!(h.holders()["instance-00000002"], both);
    let list = h.list();
    assert_eq!(
        list["reservations"][0]["request"],
        "2 GPUs, arch in resource class CUSTOM_GPU_FERMI"
    );
    assert_ok(&h.hook("instance-00000002", "stopped", &g1));
    // A class this host has none of.
    common::assert_fails(
        &h.hook(
            "instance-00000003",
            "prepare",
            &nova_xml(
                "instance-00000003",
                3,
                "g1.hopper1",
                serde_json::json!({"resources1:CUSTOM_GPU_HOPPER": "1"}),
            ),
        ),
        "instance-00000003",
        "CUSTOM_GPU_HOPPER",
    );
    // A flavor's bad GPU key: one line naming the flavor; nothing reserved.
    common::assert_fails(
        &h.hook(
            "instance-00000004",
            "prepare",
            &nova_xml(
                "instance-00000004",
                4,
                "g1.bad",
                serde_json::json!({"gpus": "!= 2"}),
            ),
        ),
        "instance-00000004",
        "Nova flavor 'g1.bad': extra_spec 'gpus' ('!= 2')",
    );
    // A Nova instance without GPU keys: left alone, not a word, nothing held; at every step.
    let m1 = nova_xml(
        "instance-00000005",
        5,
        "m1.small",
        serde_json::json!({"hw:cpu_policy": "shared", "trait:CUSTOM_GPU_ARCH_FERMI": "forbidden",
                           "resources:VCPU": "1"}),
    );
    for op in ["prepare", "start", "started", "stopped", "release"] {
        let o = hook_verbose(&h, "instance-00000005", op, &m1);
        assert_ok(&o);
        assert_eq!(common::stderr(&o), "", "{op}");
    }
    assert!(h.holders().is_empty());
}

/// Four Tesla M2090 (Fermi) on a host of `wide`'s shape.
/// Each host's `gpuhook placement` output as its provider config, then the plan's steps
/// against Placement's own code (tests/openstack/placement.py).
fn run_placement(hosts: &[(&str, &Host)], plan: &Value) -> Value {
    let work = tempfile::Builder::new()
        .prefix("gpuhook-placement-")
        .tempdir()
        .unwrap();
    let mut argv = vec![work.path().to_str().unwrap().to_owned(), plan.to_string()];
    for (name, h) in hosts {
        let dir = work.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        assert_ok(
            &h.cmd()
                .args(["placement", "--output"])
                .arg(dir.join("gpuhook.yaml"))
                .output()
                .unwrap(),
        );
        argv.push(format!("{name}={}", dir.display()));
    }
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    serde_json::from_str(&common::openstack_script("placement.py", &argv)).unwrap()
}

fn fermi4() -> FakeHost {
    let mut f = FakeHost::wide(4);
    f.name = "fermi4".into();
    for d in &mut f.devices {
        d.device = 0x1091;
        if let testbed::fakehost::Driver::Nvidia { model, .. } = &mut d.driver {
            *model = "Tesla M2090".into();
        }
    }
    f
}

#[test]
fn placement_schedules_by_free_gpus() {
    // cn-a: two Fermi; cn-b: four Fermi, one excluded by the operator; cn-c: eight Hopper.
    let a = Host::new(FakeHost::blueprint());
    let b4 = fermi4();
    let excluded = b4.devices[0].pci.clone();
    let b = Host::with(b4, |c| c["exclude"] = serde_json::json!([excluded]));
    let c = Host::new(FakeHost::dgx8());
    let step = |op: &str, host: &str, res: &str| serde_json::json!({"op": op, "host": host, "resources": res});
    let plan = Value::Array(vec![
        step("candidates", "", "CUSTOM_GPU_FERMI:2"),
        step("claim", "cn-a", "CUSTOM_GPU_FERMI:2"),
        step("candidates", "", "CUSTOM_GPU_FERMI:2"),
        step("claim", "cn-b", "CUSTOM_GPU_FERMI:2"),
        step("candidates", "", "CUSTOM_GPU_FERMI:2"),
        step("candidates", "", "CUSTOM_GPU_FERMI:1"),
        step("claim", "cn-a", "CUSTOM_GPU_FERMI:1"),
        step("candidates", "", "CUSTOM_GPU_HOPPER:8"),
        step("candidates", "", "CUSTOM_GPU_HOPPER:9"),
    ]);
    let out = run_placement(&[("cn-a", &a), ("cn-b", &b), ("cn-c", &c)], &plan);
    assert_eq!(
        out["steps"],
        serde_json::json!([
            ["cn-a", "cn-b"], // two Fermi free on cn-a, three on cn-b
            true,
            ["cn-b"], // cn-a's two are allocated
            true,
            [], // cn-b has one left
            ["cn-b"],
            false, // nothing left on cn-a
            ["cn-c"],
            []
        ]),
        "{out}"
    );
    let p = &out["providers"];
    assert_eq!(p["cn-b"]["inventories"]["CUSTOM_GPU_FERMI"]["total"], 4);
    assert_eq!(p["cn-b"]["inventories"]["CUSTOM_GPU_FERMI"]["reserved"], 1);
    assert_eq!(p["cn-c"]["inventories"]["CUSTOM_GPU_HOPPER"]["total"], 8);
    for t in [
        "CUSTOM_GPU_VENDOR_NVIDIA",
        "CUSTOM_GPU_ARCH_FERMI",
        "COMPUTE_NODE",
    ] {
        assert!(
            p["cn-a"]["traits"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x == t),
            "{p}"
        );
    }
    assert!(p["cn-c"]["traits"]
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x == "CUSTOM_GPU_ARCH_HOPPER"));
    // The instance Placement put on cn-a: its hook reserves the two Fermi GPUs.
    let xml = nova_xml(
        "instance-0000000a",
        10,
        "g1.fermi2",
        serde_json::json!({"resources:CUSTOM_GPU_FERMI": "2"}),
    );
    assert_ok(&a.hook("instance-0000000a", "prepare", &xml));
    assert_eq!(
        a.holders()["instance-0000000a"],
        ["0000:07:00.0", "0000:08:00.0"]
    );
}

/// Shared GPUs in Placement's own code: a host's shared GPUs count only in
/// `CUSTOM_GPU_<ARCH>_SHARED`, their replicas each; one request takes at most one slot of
/// each GPU (`max_unit`); the instance Placement puts there gets its slots from the hook.
#[test]
fn placement_schedules_shared_slots() {
    // cn-a: two Fermi, whole; cn-s: four Fermi, two of them shared by three.
    let a = Host::new(FakeHost::blueprint());
    let s4 = fermi4();
    let shared: Vec<String> = s4.devices[2..].iter().map(|d| d.pci.clone()).collect();
    let s = Host::with(s4, |c| {
        c["sharing"] = serde_json::json!({
            shared[0].clone(): {"replicas": 3},
            shared[1].clone(): {"replicas": 3},
        });
    });
    let step = |op: &str, host: &str, res: &str| serde_json::json!({"op": op, "host": host, "resources": res});
    let plan = Value::Array(vec![
        step("candidates", "", "CUSTOM_GPU_FERMI_SHARED:2"),
        step("candidates", "", "CUSTOM_GPU_FERMI_SHARED:3"),
        step("candidates", "", "CUSTOM_GPU_FERMI:3"),
        step("candidates", "", "CUSTOM_GPU_FERMI:2"),
        step("claim", "cn-s", "CUSTOM_GPU_FERMI_SHARED:2"),
        step("claim", "cn-s", "CUSTOM_GPU_FERMI_SHARED:2"),
        step("claim", "cn-s", "CUSTOM_GPU_FERMI_SHARED:2"),
        step("candidates", "", "CUSTOM_GPU_FERMI_SHARED:1"),
    ]);
    let out = run_placement(&[("cn-a", &a), ("cn-s", &s)], &plan);
    assert_eq!(
        out["steps"],
        serde_json::json!([
            ["cn-s"], // only cn-s has shared slots
            [],       // three slots would need three shared GPUs (max_unit 2)
            [],       // cn-s has two whole Fermi, cn-a two: no host three
            ["cn-a", "cn-s"],
            true,
            true,
            true,
            [] // 6 of 6 slots allocated
        ]),
        "{out}"
    );
    let inv = &out["providers"]["cn-s"]["inventories"];
    assert_eq!(inv["CUSTOM_GPU_FERMI_SHARED"]["total"], 6, "{out}");
    assert_eq!(inv["CUSTOM_GPU_FERMI_SHARED"]["max_unit"], 2, "{out}");
    assert_eq!(inv["CUSTOM_GPU_FERMI"]["total"], 2, "{out}");
    // The instance Placement put on cn-s: one slot of each shared GPU.
    let xml = nova_xml(
        "instance-0000000b",
        11,
        "g1.fermi-shared2",
        serde_json::json!({"resources:CUSTOM_GPU_FERMI_SHARED": "2"}),
    );
    assert_ok(&s.hook("instance-0000000b", "prepare", &xml));
    assert_eq!(
        s.holders()["instance-0000000b"],
        [
            format!("{}/slot0", shared[0]),
            format!("{}/slot0", shared[1])
        ]
    );
}
