//! A Kubernetes pod's allocation through the OCI door, on a fake host (the 8×H100 `dgx8`):
//! the pool's `Allocate` (what kubelet's device plugin does) reserves for a pod, then
//! `gpuhook-runtime create` of a bundle whose annotations carry `gpuhook.io/allocation` and
//! the CRI sandbox's (as containerd writes them) turns it into the container's reservation;
//! another pod's container naming it, or a container of no pod, is refused in one line with
//! the runtime never run; `delete` gives the units back to the pod; `gpuhook list` names the
//! pod. The real runtime is a script that only records that it ran (no engine).

mod common;

use common::{bin, Host};
use gpuhook::reserve::pods::{self, Profiles, Resource};
use serde_json::{json, Value};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::PathBuf;
use testbed::FakeHost;

struct Runtime {
    link: PathBuf,
    called: PathBuf,
}

fn runtime(h: &Host) -> Runtime {
    let link = h.root().join("gpuhook-runtime");
    symlink(bin(), &link).unwrap();
    let called = h.root().join("runtime-was-called");
    let fake = h.root().join("fake-runtime");
    std::fs::write(
        &fake,
        format!("#!/bin/sh\necho \"$@\" >> {}\n", called.display()),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    h.edit_config(|c| c["oci_runtime"] = json!(fake));
    Runtime { link, called }
}

/// The annotations containerd's CRI plugin writes for an app container of pod `ns/name`
/// (sandbox `sandbox`), with `alloc` as kubelet's device plugin answered.
fn cri_annotations(alloc: &str, sandbox: &str, name: &str) -> Value {
    json!({
        "gpuhook.io/allocation": alloc,
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.container-name": "main",
        "io.kubernetes.cri.sandbox-id": sandbox,
        "io.kubernetes.cri.sandbox-namespace": "ml",
        "io.kubernetes.cri.sandbox-name": name,
        "io.kubernetes.cri.sandbox-uid": format!("uid-{name}"),
    })
}

impl Runtime {
    /// `gpuhook-runtime create` of a bundle (`runc spec`'s, an empty root) with these
    /// annotations: its output and the bundle's `config.json` after.
    fn create(&self, h: &Host, id: &str, annotations: Value) -> (std::process::Output, Value) {
        let b = h.root().join(format!("bundle-{id}"));
        std::fs::create_dir_all(b.join("rootfs")).unwrap();
        let _ = std::fs::remove_file(b.join("config.json"));
        let spec = std::process::Command::new("/usr/sbin/runc")
            .args(["spec", "--bundle"])
            .arg(&b)
            .output()
            .unwrap();
        assert!(spec.status.success(), "runc spec");
        let p = b.join("config.json");
        let mut c: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        c["root"] = json!({"path": b.join("rootfs"), "readonly": false});
        c["process"]["terminal"] = json!(false);
        c["annotations"] = annotations;
        std::fs::write(&p, serde_json::to_vec_pretty(&c).unwrap()).unwrap();
        let o = self.run(h, &["create", "--bundle", b.to_str().unwrap(), id]);
        let after = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        (o, after)
    }

    fn run(&self, h: &Host, args: &[&str]) -> std::process::Output {
        std::process::Command::new(&self.link)
            .env("GPUHOOK_CONFIG", &h.config)
            .arg("--root")
            .arg(h.root().join("runc-root"))
            .args(args)
            .output()
            .unwrap()
    }

    fn calls(&self) -> String {
        std::fs::read_to_string(&self.called).unwrap_or_default()
    }
}

/// What `Allocate` does for kubelet: reserve `units` (device IDs) of `gpuhook.io/gpu` for a
/// pod, on this host; returns the allocation's ID.
fn allocate(h: &Host, units: &[&str]) -> String {
    let cfg = gpuhook::host::config::Config::load_file(&h.config, true).unwrap();
    let f = gpuhook::reserve::world::World::real(&cfg);
    let req = vec![units.iter().map(|s| s.to_string()).collect()];
    pods::allocate(&f, &Resource::Gpu, &req, &Profiles::default())
        .unwrap()
        .remove(0)
        .alloc
}

/// The pod's reservation of `alloc` in `list --json`'s holders.
fn holder_of(h: &Host, pci: &str) -> Value {
    h.list()["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["pci"] == pci)
        .unwrap()["holder"]
        .clone()
}

#[test]
fn a_pods_container_gets_its_allocation_and_gives_it_back() {
    let h = Host::new(FakeHost::dgx8());
    let rt = runtime(&h);
    let alloc = allocate(&h, &["0000:18:00.0"]);
    let pending = holder_of(&h, "0000:18:00.0");
    assert_eq!(
        (&pending["kind"], &pending["pod"]["pending"]),
        (&json!("pod"), &json!(true))
    );

    // The pod's container: the allocation's GPU (/dev/nvidia2), its rules and hooks.
    let (o, after) = rt.create(&h, "ctr1", cri_annotations(&alloc, "sb1", "trainer"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(rt.calls().starts_with("--root"), "the real runtime ran");
    let devices: Vec<&str> = after["linux"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    assert!(devices.contains(&"/dev/nvidia2"), "{devices:?}");
    assert!(!devices.contains(&"/dev/nvidia3"), "{devices:?}");
    assert!(after["hooks"]["poststop"]
        .as_array()
        .is_some_and(|a| !a.is_empty()));
    let held = holder_of(&h, "0000:18:00.0");
    assert_eq!(held["pod"]["container"], "ctr1");
    assert_eq!(held["pod"]["name"], "trainer");
    assert_eq!(held["pod"]["namespace"], "ml");

    // Another pod's container naming the same allocation: refused, the runtime not run,
    // the bundle untouched; a container of no pod: refused too.
    std::fs::remove_file(&rt.called).unwrap();
    let (o, after) = rt.create(&h, "evil", cri_annotations(&alloc, "sb2", "thief"));
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.trim_end(),
        format!("gpuhook: container 'evil': gpuhook.io/allocation '{alloc}' belongs to pod 'ml/trainer' container 'main', not to this container's pod 'ml/thief'")
    );
    assert_eq!(rt.calls(), "");
    assert!(after
        .get("hooks")
        .is_none_or(|h| h.get("poststop").is_none()));
    let (o, _) = rt.create(&h, "bare", json!({"gpuhook.io/allocation": alloc}));
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("needs a Kubernetes pod's container"));
    // An allocation this node never made.
    let (o, _) = rt.create(
        &h,
        "lost",
        cri_annotations("0123456789abcdef0123456789abcdef", "sb3", "lost"),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("names no allocation of this node's pool"));
    assert_eq!(rt.calls(), "");

    // `delete` (its runtime gone: the fake one exits at once): the units back to the pod.
    let o = rt.run(&h, &["delete", "ctr1"]);
    assert!(o.status.success());
    let back = holder_of(&h, "0000:18:00.0");
    assert_eq!(
        (&back["kind"], &back["pod"]["pending"], &back["pod"]["name"]),
        (&json!("pod"), &json!(true), &json!("trainer"))
    );
    // The pod's container again (kubelet restarted it): the same GPU.
    let (o, _) = rt.create(&h, "ctr1b", cri_annotations(&alloc, "sb1", "trainer"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(holder_of(&h, "0000:18:00.0")["pod"]["container"], "ctr1b");
    // The text table names the pod.
    let o = h.cmd().args(["list"]).output().unwrap();
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("pod ml/trainer/main in container ctr1b"),
        "{table}"
    );
}
