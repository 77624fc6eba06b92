//! libvirt's QEMU hook driven as libvirt drives it (`hooks/qemu NAME OP SUBOP -`, the domain
//! XML on stdin; also `gpuhook hook --qemu …`) against fake hosts: a VM's PCI and mdev
//! hostdevs in the one pool with containers' GPUs, every hook operation, stale VMs, GPUs
//! running VMs pass through without a reservation (libvirt's status XML), and what `list`,
//! `metrics`, `placement` and `release` say of VMs.

mod common;
use common::*;
use serde_json::{json, Value};
use std::process::Output;
use testbed::FakeHost;

const M1: &str = "4b20d080-1b54-4048-85b3-a6a62d165c01";
const M2: &str = "4b20d080-1b54-4048-85b3-a6a62d165c02";
const M3: &str = "4b20d080-1b54-4048-85b3-a6a62d165c03";

/// dgx8 with each GPU's audio function; its GPUs in PCI order.
fn dgx() -> (Host, Vec<String>) {
    let h = Host::new(FakeHost::dgx8().with_audio());
    let p = pcis(&h);
    (h, p)
}

fn pcis(h: &Host) -> Vec<String> {
    h.list()["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["pci"].as_str().unwrap().to_string())
        .collect()
}

/// The audio function of GPU `pci` (`….1`).
fn audio(pci: &str) -> String {
    format!("{}.1", &pci[..10])
}

/// `list --json`'s holder of the GPU at `pci`.
fn holder(h: &Host, pci: &str) -> Value {
    h.list()["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["pci"] == pci)
        .unwrap_or_else(|| panic!("no GPU {pci}"))["holder"]
        .clone()
}

/// Exit 1 and one line on stderr, exactly `line`; nothing on stdout.
fn refused(o: &Output, line: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert_eq!(e.trim_end().lines().count(), 1, "not one line: {e:?}");
    assert_eq!(e.trim_end(), line);
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

/// Exit 0, nothing on stdout (libvirt reads it at `migrate` and `restore` as new XML).
fn ok(o: &Output) {
    assert_ok(o);
    assert!(
        o.stdout.is_empty(),
        "stdout: {}",
        String::from_utf8_lossy(&o.stdout)
    );
}

fn state_bytes(h: &Host) -> Option<Vec<u8>> {
    std::fs::read(&h.state).ok()
}

/// A VM's start and stop as libvirt runs them: `prepare` reserves the GPU its hostdevs name
/// (the GPU with its audio function), `start` confirms, `started` records the QEMU process,
/// `stopped` and `release` free (idempotent, exit 0). Nothing is printed on stdout.
#[test]
fn a_vms_start_and_stop() {
    let (h, p) = dgx();
    let devs = [pci_hostdev(&p[0]), pci_hostdev(&audio(&p[0]))].concat();
    let xml = vm_domain("vm1", 1, &devs, "");
    ok(&h.qemu("vm1", "prepare", &xml));
    assert_eq!(
        holder(&h, &p[0]),
        json!({"kind": "vm", "domain": "vm1", "uuid": vm_uuid(1), "phase": "prepared", "stale": false})
    );
    ok(&h.qemu("vm1", "start", &xml));
    let vm = h.run_vm("vm1", &xml);
    ok(&h.qemu("vm1", "started", &xml));
    assert_eq!(holder(&h, &p[0])["phase"], "running");
    let l = h.list();
    let r = &l["reservations"][0];
    assert_eq!(r["kind"], "vm");
    assert_eq!(r["gpus"], json!([p[0]]));
    assert_eq!(r["init_pid"], vm.pid());
    // Only that GPU.
    assert!(h.holders().keys().eq(["vm1"]), "{:?}", h.holders());
    assert_eq!(h.holders()["vm1"], [p[0].clone()]);
    let mut vm = vm;
    vm.stop();
    ok(&h.qemu("vm1", "stopped", &xml));
    ok(&h.qemu("vm1", "release", &xml));
    ok(&h.qemu("vm1", "release", &xml));
    assert!(holder(&h, &p[0]).is_null());
}

/// The binary as libvirt starts it: `hooks/qemu`, or `hooks/qemu.d/50-gpuhook` beside a
/// foreign hook.
#[test]
fn called_as_qemu_and_from_qemu_d() {
    let (h, p) = dgx();
    let hooks = h.root().join("hooks");
    std::fs::create_dir_all(hooks.join("qemu.d")).unwrap();
    std::os::unix::fs::symlink(bin(), hooks.join("qemu")).unwrap();
    std::os::unix::fs::symlink(bin(), hooks.join("qemu.d/50-gpuhook")).unwrap();
    let run = |hook: &str, name: &str, op: &str, xml: &str| {
        let subop = if matches!(op, "stopped" | "release") {
            "end"
        } else {
            "begin"
        };
        let mut c = std::process::Command::new(hooks.join(hook));
        c.env("GPUHOOK_CONFIG", &h.config)
            .args([name, op, subop, "-"]);
        run_with_stdin(&mut c, xml)
    };
    let a = vm_domain("a", 1, &pci_hostdev(&p[0]), "");
    let b = vm_domain("b", 2, &pci_hostdev(&p[1]), "");
    ok(&run("qemu", "a", "prepare", &a));
    ok(&run("qemu.d/50-gpuhook", "b", "prepare", &b));
    assert_eq!(holder(&h, &p[0])["domain"], "a");
    assert_eq!(holder(&h, &p[1])["domain"], "b");
    refused(
        &run(
            "qemu",
            "c",
            "prepare",
            &vm_domain("c", 3, &pci_hostdev(&p[1]), ""),
        ),
        &format!(
            "gpuhook: vm 'c': GPU {} (hostdev {}) is held by vm 'b'",
            p[1], p[1]
        ),
    );
    ok(&run("qemu", "a", "release", &a));
    ok(&run("qemu.d/50-gpuhook", "b", "release", &b));
    assert!(h.holders().is_empty());
}

/// One pool: a VM is refused a GPU an LXC domain or an OCI container holds (a hostdev of its
/// companion function alone too), naming the GPU and its holder, reserving nothing (all or
/// nothing); a container is refused the VM's GPU, naming the VM.
#[test]
fn a_vm_and_a_container_never_share_a_gpu() {
    let (h, p) = dgx();
    let web = domain("web1", 1, &gpus(""));
    assert_ok(&h.hook("web1", "prepare", &web));
    assert_eq!(holder(&h, &p[0])["domain"], "web1");
    let before = state_bytes(&h);
    let xml = vm_domain(
        "vm1",
        2,
        &[pci_hostdev(&p[1]), pci_hostdev(&audio(&p[0]))].concat(),
        "",
    );
    refused(
        &h.qemu("vm1", "prepare", &xml),
        &format!(
            "gpuhook: vm 'vm1': GPU {} (hostdev {}) is held by domain 'web1'",
            p[0],
            audio(&p[0])
        ),
    );
    assert_eq!(state_bytes(&h), before, "nothing reserved");
    assert!(holder(&h, &p[1]).is_null());
    // libvirt runs release after a failed start: the domain keeps its GPU.
    ok(&h.qemu("vm1", "stopped", &xml));
    ok(&h.qemu("vm1", "release", &xml));
    assert_eq!(holder(&h, &p[0])["domain"], "web1");
    // The VM on a free GPU; then a container that names it is refused, naming the VM.
    let xml = vm_domain("vm1", 2, &pci_hostdev(&p[1]), "");
    ok(&h.qemu("vm1", "prepare", &xml));
    let named = domain(
        "web2",
        3,
        &format!(
            r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"><gpu:device pci="{}"/></gpu:gpus>"#,
            p[1]
        ),
    );
    assert_fails(
        &h.hook("web2", "prepare", &named),
        "web2",
        &format!("GPU {} (pci {}) is held by vm 'vm1'", p[1], p[1]),
    );
    // A request for all eight: the VM's GPU is counted as held by it.
    assert_fails(
        &h.hook("web2", "prepare", &domain("web2", 3, &gpus(r#"count="8""#))),
        "web2",
        "held by domain 'web1', vm 'vm1'",
    );
}

/// Every GPU named or none: one held elsewhere refuses the other too.
#[test]
fn all_or_nothing() {
    let (h, p) = dgx();
    ok(&h.qemu("a", "prepare", &vm_domain("a", 1, &pci_hostdev(&p[3]), "")));
    let xml = vm_domain(
        "b",
        2,
        &[pci_hostdev(&p[1]), pci_hostdev(&p[2]), pci_hostdev(&p[3])].concat(),
        "",
    );
    refused(
        &h.qemu("b", "prepare", &xml),
        &format!(
            "gpuhook: vm 'b': GPU {} (hostdev {}) is held by vm 'a'",
            p[3], p[3]
        ),
    );
    assert_eq!(h.holders().len(), 1);
    assert_eq!(h.holders()["a"], [p[3].clone()]);
}

/// Mediated devices (vGPUs): VMs with mediated devices of one GPU share it (listed as its
/// sharers); no container, slot or whole-GPU VM gets that GPU until the last of them stops;
/// the same mediated device is one VM's.
#[test]
fn vgpus_share_their_gpu_among_vms_only() {
    let fake = FakeHost::dgx8().with_audio();
    let g = fake
        .devices
        .iter()
        .find(|d| d.vendor == 0x10de && d.class == 0x030200)
        .unwrap()
        .pci
        .clone();
    let h = Host::new(fake.with_mdev(&g, M1).with_mdev(&g, M2).with_mdev(&g, M3));
    let a = vm_domain("a", 1, &mdev_hostdev(M1), "");
    let b = vm_domain("b", 2, &mdev_hostdev(&M2.to_uppercase()), "");
    ok(&h.qemu("a", "prepare", &a));
    ok(&h.qemu("b", "prepare", &b));
    let l = h.list();
    let gpu = l["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["pci"] == g)
        .unwrap()
        .clone();
    assert!(gpu["holder"].is_null(), "{gpu}");
    assert_eq!(gpu["sharing"]["mode"], "mdev");
    let sharers: Vec<(String, String)> = gpu["sharing"]["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["domain"].as_str().unwrap().into(),
                s["slot"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        sharers,
        [
            ("a".to_string(), format!("{g}/mdev-{M1}")),
            ("b".to_string(), format!("{g}/mdev-{M2}"))
        ]
    );
    // The same mediated device for another VM; the GPU whole for a VM; the GPU for a
    // container (named, or among all eight).
    refused(
        &h.qemu("c", "prepare", &vm_domain("c", 3, &mdev_hostdev(M1), "")),
        &format!("gpuhook: vm 'c': {g}/mdev-{M1} (mdev {M1}) is held by vm 'a'"),
    );
    refused(
        &h.qemu(
            "c",
            "prepare",
            &vm_domain("c", 3, &pci_hostdev(&audio(&g)), ""),
        ),
        &format!(
            "gpuhook: vm 'c': GPU {g} (hostdev {}) is held by vm 'a'",
            audio(&g)
        ),
    );
    let named = domain(
        "web1",
        1,
        &format!(r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"><gpu:device pci="{g}"/></gpu:gpus>"#),
    );
    assert_fails(
        &h.hook("web1", "prepare", &named),
        "web1",
        &format!("GPU {g} (pci {g}) is held by vm 'a'"),
    );
    assert_fails(
        &h.hook("web1", "prepare", &domain("web1", 1, &gpus(r#"count="8""#))),
        "web1",
        "1 held by vm 'a'",
    );
    // The first stops: still shared by the other; the last stops: free for anyone.
    ok(&h.qemu("a", "release", &a));
    assert_fails(&h.hook("web1", "prepare", &named), "web1", "held by vm 'b'");
    ok(&h.qemu("c", "prepare", &vm_domain("c", 3, &mdev_hostdev(M3), "")));
    ok(&h.qemu("b", "release", &b));
    ok(&h.qemu("c", "release", &vm_domain("c", 3, &mdev_hostdev(M3), "")));
    assert_ok(&h.hook("web1", "prepare", &named));
    assert_eq!(holder(&h, &g)["domain"], "web1");
}
