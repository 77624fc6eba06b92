//! OpenStack: `gpuhook placement`'s provider config read by Nova's own loader
//! (`nova.compute.provider_config.get_provider_configs`, Nova 34.0.0 from PyPI, in a
//! virtualenv this test makes once under `target/openstack-venv`).

mod common;

use common::{assert_ok, Host};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use testbed::FakeHost;

const NOVA: &str = "nova==34.0.0";

/// The cached virtualenv with Nova (made on first use; a marker says it is complete).
fn venv() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/openstack-venv");
    let marker = dir.join(NOVA);
    if !marker.exists() {
        let _ = std::fs::remove_dir_all(&dir);
        let o = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&dir)
            .output()
            .expect("python3");
        assert_ok(&o);
        let o = Command::new(dir.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check", NOVA])
            .output()
            .expect("pip");
        assert_ok(&o);
        std::fs::write(&marker, "").unwrap();
    }
    dir
}

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
    let py = venv().join("bin/python");
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
