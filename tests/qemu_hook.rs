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

/// A GPU parked on `vfio-pci` (or with no driver) is free for a VM, never for a container.
#[test]
fn vfio_bound_gpus_are_for_vms_only() {
    let fake = FakeHost::dgx8().with_audio();
    let g: Vec<String> = fake
        .devices
        .iter()
        .filter(|d| d.class == 0x030200)
        .map(|d| d.pci.clone())
        .collect();
    let h = Host::new(
        fake.bound_to(&g[0], "vfio-pci")
            .bound_to(&audio(&g[0]), "vfio-pci"),
    );
    let named = |pci: &str| {
        domain(
            "web1",
            1,
            &format!(
                r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"><gpu:device pci="{pci}"/></gpu:gpus>"#
            ),
        )
    };
    assert_fails(
        &h.hook("web1", "prepare", &named(&g[0])),
        "web1",
        &format!(
            "GPU {} (pci {}) cannot be used: bound to vfio-pci, not to the nvidia driver",
            g[0], g[0]
        ),
    );
    assert_fails(
        &h.hook("web1", "prepare", &domain("web1", 1, &gpus(r#"count="8""#))),
        "web1",
        "only 7 of the host's 8 matching GPUs are free",
    );
    let xml = vm_domain(
        "vm1",
        1,
        &[pci_hostdev(&g[0]), pci_hostdev(&audio(&g[0]))].concat(),
        "",
    );
    ok(&h.qemu("vm1", "prepare", &xml));
    assert_eq!(holder(&h, &g[0])["kind"], "vm");
    // The other seven are the containers'.
    assert_ok(&h.hook("web1", "prepare", &domain("web1", 1, &gpus(r#"count="7""#))));
}

/// A VM named like an LXC domain, and one defined with its UUID: holders of their own; a
/// VM's stop frees only its own reservation, never the domain's.
#[test]
fn a_vm_with_an_lxc_domains_name_or_uuid() {
    let (h, p) = dgx();
    assert_ok(&h.hook("x", "prepare", &domain("x", 1, &gpus(""))));
    // vm `x` (another UUID), vm `y` with domain x's UUID.
    let vx = vm_domain("x", 2, &pci_hostdev(&p[1]), "");
    let vy = vm_domain("y", 3, &pci_hostdev(&p[2]), "").replace(&vm_uuid(3), &uuid(1));
    ok(&h.qemu("x", "prepare", &vx));
    ok(&h.qemu("y", "prepare", &vy));
    let kinds: Vec<(String, String)> = h.list()["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| !g["holder"].is_null())
        .map(|g| {
            (
                g["holder"]["kind"].as_str().unwrap().into(),
                g["holder"]["domain"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("libvirt".into(), "x".into()),
            ("vm".into(), "x".into()),
            ("vm".into(), "y".into())
        ]
    );
    // Stopping vm y (domain x's UUID) and vm x frees theirs; the domain keeps its GPU.
    ok(&h.qemu("y", "release", &vy));
    ok(&h.qemu("x", "release", &vx));
    assert_eq!(holder(&h, &p[0])["kind"], "libvirt");
    assert!(holder(&h, &p[1]).is_null() && holder(&h, &p[2]).is_null());
    // And the domain's stop does not free a VM's.
    ok(&h.qemu("y", "prepare", &vy));
    assert_ok(&h.hook("x", "release", &domain("x", 1, &gpus(""))));
    assert_eq!(holder(&h, &p[2])["domain"], "y");
}

/// The VM's XML is untrusted: a hostdev naming someone else's GPU is refused at `prepare`,
/// and the stop hooks libvirt then runs free only the VM's own reservation (by its key),
/// never the GPU it named.
#[test]
fn a_hostdev_naming_anothers_gpu_frees_nothing() {
    let (h, p) = dgx();
    assert_ok(&h.hook("web1", "prepare", &domain("web1", 1, &gpus(""))));
    let before = state_bytes(&h);
    // Named like the domain, with its UUID, with the GPU's companion only.
    let evil = vm_domain("web1", 1, &pci_hostdev(&audio(&p[0])), "").replace(&vm_uuid(1), &uuid(1));
    assert_eq!(h.qemu("web1", "prepare", &evil).status.code(), Some(1));
    for op in ["stopped", "release"] {
        ok(&h.qemu("web1", op, &evil));
    }
    assert_eq!(state_bytes(&h), before);
    // A VM that held a GPU and names the domain's at its stop frees its own only.
    let vm = vm_domain("vm1", 2, &pci_hostdev(&p[1]), "");
    ok(&h.qemu("vm1", "prepare", &vm));
    ok(&h.qemu(
        "vm1",
        "release",
        &vm_domain("vm1", 2, &pci_hostdev(&p[0]), ""),
    ));
    assert!(holder(&h, &p[1]).is_null());
    assert_eq!(holder(&h, &p[0])["domain"], "web1");
}

/// A VM that died without a `release` (its QEMU gone while libvirtd was down) is stale:
/// listed so, and reclaimed by the next request that needs its GPU; its late `release`
/// then frees nothing of the new holder's.
#[test]
fn a_vm_that_died_without_release_is_stale() {
    let (h, p) = dgx();
    let xml = vm_domain("vm1", 1, &pci_hostdev(&p[0]), "");
    let mut vm = h.start_vm("vm1", &xml).unwrap();
    assert_eq!(holder(&h, &p[0])["stale"], false);
    vm.kill();
    let hd = holder(&h, &p[0]);
    assert_eq!(
        (hd["kind"].as_str(), hd["stale"].as_bool()),
        (Some("vm"), Some(true))
    );
    let l = h.list();
    assert_eq!(
        l["reservations"][0]["stale"],
        format!("its QEMU process (pid {}) is gone", vm.pid())
    );
    let named = domain(
        "web1",
        1,
        &format!(
            r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"><gpu:device pci="{}"/></gpu:gpus>"#,
            p[0]
        ),
    );
    assert_ok(&h.hook("web1", "prepare", &named));
    assert_eq!(holder(&h, &p[0])["domain"], "web1");
    ok(&h.qemu("vm1", "stopped", &xml));
    ok(&h.qemu("vm1", "release", &xml));
    assert_eq!(holder(&h, &p[0])["domain"], "web1");
    // The same for a VM: a dead VM's GPU is reclaimed by another VM's prepare.
    let mut vm2 = h
        .start_vm("vm2", &vm_domain("vm2", 2, &pci_hostdev(&p[1]), ""))
        .unwrap();
    vm2.kill();
    ok(&h.qemu(
        "vm3",
        "prepare",
        &vm_domain("vm3", 3, &pci_hostdev(&p[1]), ""),
    ));
    assert_eq!(holder(&h, &p[1])["domain"], "vm3");
}

/// `started` records the QEMU process libvirt's pid file names; with none that runs the
/// start fails in one line (a VM whose GPUs could be taken while it runs is not started).
#[test]
fn started_needs_the_qemu_process() {
    let (h, p) = dgx();
    let xml = vm_domain("vm1", 1, &pci_hostdev(&p[0]), "");
    ok(&h.qemu("vm1", "prepare", &xml));
    ok(&h.qemu("vm1", "start", &xml));
    let o = h.qemu("vm1", "started", &xml);
    let pidfile = h.qemu_dir().join("vm1.pid");
    refused(
        &o,
        &format!("gpuhook: vm 'vm1': started: its QEMU process is not found ({} names none that runs; config libvirt_qemu_dir): without it the VM's GPUs would be taken for free once libvirtd restarts", pidfile.display()),
    );
    // `start` after the reservation was released: refused.
    ok(&h.qemu("vm1", "release", &xml));
    refused(
        &h.qemu("vm1", "start", &xml),
        &format!("gpuhook: vm 'vm1': its GPUs are not reserved any more ({} were asked; released or reclaimed since prepare)", p[0]),
    );
}

/// libvirtd restarted while the VM runs: `reconnect` keeps its reservation and records its
/// QEMU; a state that lost it re-adopts what no one else holds; a GPU someone else holds
/// meanwhile stays theirs. Never a non-zero exit (libvirt would kill the VM).
#[test]
fn reconnect_keeps_and_readopts() {
    let (h, p) = dgx();
    let xml = vm_domain(
        "vm1",
        1,
        &[pci_hostdev(&p[0]), pci_hostdev(&p[1])].concat(),
        "",
    );
    let vm = h.start_vm("vm1", &xml).unwrap();
    let before = state_bytes(&h);
    ok(&h.qemu("vm1", "reconnect", &xml));
    let l = h.list();
    assert_eq!(l["reservations"][0]["phase"], "running");
    assert_eq!(l["reservations"][0]["init_pid"], vm.pid());
    assert!(before.is_some());
    // The state lost it, and holds a container's reservation of one of its GPUs (a file
    // put back by hand): the container keeps that one.
    let me = gpuhook::host::procfs::ProcRef::of(std::process::id() as i32).unwrap();
    let st = json!({"version": 1, "reservations": {"c1": {
        "kind": "oci", "domain": "c1", "uuid": "c1", "gpus": [p[1]], "phase": "running",
        "request": "1 GPU", "created": "2026-12-01T00:00:00Z", "updated": "2026-12-01T00:00:00Z",
        "init": {"pid": me.pid, "start_time": me.start_time},
    }}});
    std::fs::write(&h.state, st.to_string()).unwrap();
    let o = h.qemu("vm1", "reconnect", &xml);
    ok(&o);
    assert!(
        stderr(&o).contains(&format!(
            "GPU {} (hostdev {}) is held by container 'c1': left to its holder",
            p[1], p[1]
        )),
        "{}",
        stderr(&o)
    );
    let l = h.list();
    let r = l["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "vm")
        .unwrap()
        .clone();
    assert_eq!(r["gpus"], json!([p[0]]));
    assert_eq!(r["phase"], "running");
    assert_eq!(r["init_pid"], vm.pid());
    assert_eq!(holder(&h, &p[1])["domain"], "c1");
    // A broken config: still exit 0 (said on stderr).
    std::fs::write(&h.config, "{").unwrap();
    let o = h.qemu("vm1", "reconnect", &xml);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(o.stdout.is_empty());
}

/// `restore` reserves as `prepare` does; `migrate` of a VM passing GPUs through is refused in
/// one line; a GPU-less VM migrates. Nothing on stdout at either (libvirt would read it as
/// the domain's new XML).
#[test]
fn restore_and_migrate() {
    let (h, p) = dgx();
    let xml = vm_domain("vm1", 1, &pci_hostdev(&p[0]), "");
    ok(&h.qemu("vm1", "restore", &xml));
    assert_eq!(holder(&h, &p[0])["domain"], "vm1");
    ok(&h.qemu("vm1", "prepare", &xml));
    refused(
        &h.qemu(
            "vm2",
            "restore",
            &vm_domain("vm2", 2, &pci_hostdev(&p[0]), ""),
        ),
        &format!(
            "gpuhook: vm 'vm2': GPU {} (hostdev {}) is held by vm 'vm1'",
            p[0], p[0]
        ),
    );
    refused(
        &h.qemu("vm3", "migrate", &vm_domain("vm3", 3, &pci_hostdev(&audio(&p[5])), "")),
        &format!("gpuhook: vm 'vm3': migrate: it passes GPUs through ({}): a VM holding GPUs is not migrated", p[5]),
    );
    assert!(holder(&h, &p[5]).is_null());
    ok(&h.qemu("vm4", "migrate", &vm_domain("vm4", 4, "", "")));
    // A NIC passed through is no GPU: migrate is libvirt's to judge.
    ok(&h.qemu(
        "vm4",
        "migrate",
        &vm_domain("vm4", 4, &pci_hostdev("0000:70:00.0"), ""),
    ));
}

/// A container's `<gpu:gpus>` request in a QEMU domain fails its start in one line naming
/// the command that writes hostdevs.
#[test]
fn a_gpuhook_request_in_a_vm_is_refused() {
    let (h, _) = dgx();
    let xml = vm_domain("vm1", 1, "", &gpus(r#"count="2""#));
    refused(
        &h.qemu("vm1", "prepare", &xml),
        "gpuhook: vm 'vm1': a <gpu:gpus> request in <metadata> is for containers; a VM gets GPUs as <hostdev> elements: write them with 'gpuhook-libvirt request vm1 --count N' (or by hand)",
    );
    assert!(state_bytes(&h).is_none());
    ok(&h.qemu("vm1", "release", &xml));
}

/// A VM with no GPU hostdev is never touched: a broken config and state do not matter, no
/// state file is made, nothing is said; a NIC hostdev is left alone.
#[test]
fn a_vm_without_gpus_is_left_alone() {
    let (h, _) = dgx();
    std::fs::write(&h.config, "not json").unwrap();
    let plain = vm_domain("web", 1, "", "");
    for op in [
        "prepare",
        "start",
        "started",
        "stopped",
        "release",
        "reconnect",
        "restore",
        "migrate",
        "attach",
    ] {
        let o = h.qemu("web", op, &plain);
        ok(&o);
        assert!(o.stderr.is_empty(), "{op}: {}", stderr(&o));
    }
    let nic = vm_domain("nic", 2, &pci_hostdev("0000:80:00.1"), "");
    // With a readable config: a NIC hostdev reserves nothing.
    let h2 = Host::new(FakeHost::dgx8().with_other_functions(8));
    ok(&h2.qemu("nic", "prepare", &nic));
    assert!(state_bytes(&h2).is_none());
    // Malformed hostdevs fail the start in one line.
    refused(
        &h2.qemu(
            "bad",
            "prepare",
            &vm_domain(
                "bad",
                3,
                "<hostdev mode='subsystem' type='pci'><source/></hostdev>",
                "",
            ),
        ),
        "gpuhook: vm 'bad': <hostdev type='pci'> #1: <source> has no <address>",
    );
}

/// A GPU hot-plugged into a running VM (`virsh attach-device`: no hook runs) is found in
/// libvirt's live status XML: `list` names the VM (`"reserved": false`), a container and
/// another VM are refused it naming the VM, and nothing is reserved or freed by it; once the
/// VM's QEMU is gone it counts no more.
#[test]
fn a_hot_plugged_gpu_is_the_vms() {
    let (h, p) = dgx();
    // vm1 started with GPU 0 through the hook, then GPU 3 hot-plugged.
    let boot = vm_domain("vm1", 1, &pci_hostdev(&p[0]), "");
    let mut vm = h.start_vm("vm1", &boot).unwrap();
    let live = vm_domain(
        "vm1",
        1,
        &[
            pci_hostdev(&p[0]),
            pci_hostdev(&p[3]),
            pci_hostdev(&audio(&p[3])),
        ]
        .concat(),
        "",
    );
    std::fs::write(&vm.xml, status_xml(&live, vm.pid() as u32)).unwrap();
    let before = state_bytes(&h);
    assert_eq!(
        holder(&h, &p[3]),
        json!({"kind": "vm", "domain": "vm1", "uuid": vm_uuid(1), "reserved": false})
    );
    assert_eq!(holder(&h, &p[0])["phase"], "running");
    let named = domain(
        "web1",
        1,
        &format!(
            r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"><gpu:device pci="{}"/></gpu:gpus>"#,
            p[3]
        ),
    );
    assert_fails(
        &h.hook("web1", "prepare", &named),
        "web1",
        &format!("GPU {} (pci {}) cannot be used: passed through to vm 'vm1' (running; libvirt's status XML, not reserved through gpuhook)", p[3], p[3]),
    );
    assert_fails(
        &h.hook("web1", "prepare", &domain("web1", 1, &gpus(r#"count="8""#))),
        "web1",
        &format!("{}: passed through to vm 'vm1'", p[3]),
    );
    refused(
        &h.qemu("vm2", "prepare", &vm_domain("vm2", 2, &pci_hostdev(&p[3]), "")),
        &format!("gpuhook: vm 'vm2': GPU {} (hostdev {}) is passed through to vm 'vm1', which runs (libvirt's status XML; not reserved through gpuhook)", p[3], p[3]),
    );
    assert_eq!(state_bytes(&h), before, "read only");
    // The text table names it too.
    let o = h.cmd().arg("list").output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("vm vm1 (passed through, not reserved)"));
    // Its QEMU gone: the GPU is free again for anyone.
    vm.kill();
    assert!(holder(&h, &p[3]).is_null());
    assert_ok(&h.hook("web1", "prepare", &named));
}

/// `release --vm` frees a VM that no longer runs (a prepared one, or one whose QEMU is gone),
/// refuses one that runs; `attach` and `detach` of a VM are refused in one line pointing to
/// `virsh attach-device`.
#[test]
fn release_and_hotplug_of_a_vm() {
    let (h, p) = dgx();
    let xml = vm_domain("vm1", 1, &pci_hostdev(&p[0]), "");
    let mut vm = h.start_vm("vm1", &xml).unwrap();
    let o = h.cmd().args(["release", "vm1", "--vm"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).starts_with("gpuhook: vm 'vm1' still runs"),
        "{}",
        stderr(&o)
    );
    for cmd in [vec!["attach", "vm1"], vec!["detach", "vm1", "--all"]] {
        let o = h.cmd().args(&cmd).output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert_eq!(
            stderr(&o).trim_end(),
            "gpuhook: vm 'vm1' is a virtual machine: attach and detach change running containers; a VM's GPUs are its <hostdev>s: use 'virsh attach-device' or 'virsh detach-device' (gpuhook finds a GPU hot-plugged so in libvirt's status XML)"
        );
    }
    // A running VM with no GPU at all is refused the same way.
    let _plain = h.run_vm("vm9", &vm_domain("vm9", 9, "", ""));
    let o = h.cmd().args(["attach", "vm9"]).output().unwrap();
    assert!(
        stderr(&o).contains("'vm9' is a virtual machine"),
        "{}",
        stderr(&o)
    );
    vm.kill();
    let o = h.cmd().args(["release", "vm1", "--vm"]).output().unwrap();
    assert_ok(&o);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("released {} of vm 'vm1' ({})\n", p[0], vm_uuid(1))
    );
    // A prepared VM whose start never came.
    ok(&h.qemu(
        "vm2",
        "prepare",
        &vm_domain("vm2", 2, &pci_hostdev(&p[1]), ""),
    ));
    let o = h.cmd().args(["release", &vm_uuid(2)]).output().unwrap();
    assert_ok(&o);
    assert!(h.holders().is_empty());
}

/// Metrics and Placement count what VMs hold: reserved GPUs (whole and by mediated devices)
/// and one a running VM passes through unreserved.
#[test]
fn metrics_and_placement_count_vms() {
    let fake = FakeHost::dgx8().with_audio();
    let g: Vec<String> = fake
        .devices
        .iter()
        .filter(|d| d.class == 0x030200)
        .map(|d| d.pci.clone())
        .collect();
    let h = Host::new(fake.with_mdev(&g[2], M1));
    ok(&h.qemu("a", "prepare", &vm_domain("a", 1, &pci_hostdev(&g[0]), "")));
    let _b = h
        .start_vm("b", &vm_domain("b", 2, &mdev_hostdev(M1), ""))
        .unwrap();
    let _hot = h.run_vm("hot", &vm_domain("hot", 3, &pci_hostdev(&g[4]), ""));
    let o = h.cmd().arg("metrics").output().unwrap();
    assert_ok(&o);
    let m = String::from_utf8_lossy(&o.stdout).into_owned();
    for line in [
        format!(
            "gpuhook_gpu_reserved{{pci=\"{}\",kind=\"vm\",holder=\"a\"}} 1",
            g[0]
        ),
        format!(
            "gpuhook_gpu_reserved{{pci=\"{}\",kind=\"vm\",holder=\"b\"}} 1",
            g[2]
        ),
        format!(
            "gpuhook_gpu_reserved{{pci=\"{}\",kind=\"vm\",holder=\"hot\"}} 1",
            g[4]
        ),
        format!(
            "gpuhook_gpu_reserved{{pci=\"{}\",kind=\"\",holder=\"\"}} 0",
            g[1]
        ),
        "gpuhook_reservations{kind=\"vm\",phase=\"prepared\"} 1".to_string(),
        "gpuhook_reservations{kind=\"vm\",phase=\"running\"} 1".to_string(),
        format!("gpuhook_gpu_usable{{pci=\"{}\"}} 0", g[4]),
    ] {
        assert!(m.contains(&line), "{line} not in:\n{m}");
    }
    let o = h.cmd().arg("placement").output().unwrap();
    assert_ok(&o);
    let y = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        y.contains("        - CUSTOM_GPU_HOPPER:\n            total: 8\n            reserved: 3\n"),
        "{y}"
    );
}

/// Health: a GPU a VM holds, or a running VM passes through without a reservation, is not
/// reset (QEMU holds its VFIO group, none of its nodes); a quarantined GPU refuses a VM's
/// start as it refuses a container's.
#[test]
fn health_counts_vms() {
    let (h, p) = dgx();
    ok(&h.qemu(
        "vm1",
        "prepare",
        &vm_domain("vm1", 1, &pci_hostdev(&p[0]), ""),
    ));
    let _hot = h.run_vm("hot", &vm_domain("hot", 2, &pci_hostdev(&p[1]), ""));
    for (pci, who) in [(&p[0], "vm 'vm1'"), (&p[1], "vm 'hot'")] {
        let o = h.cmd().args(["health", "reset", pci]).output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert_eq!(
            stderr(&o).trim_end(),
            format!("gpuhook: GPU {pci} is held by {who}: it is reset only when nothing holds it")
        );
    }
    // A quarantine (as `health scan` records one) refuses a VM's start.
    let mut st: Value = serde_json::from_slice(&std::fs::read(&h.state).unwrap()).unwrap();
    st["quarantine"] = json!({ p[2].clone(): {
        "xid": 79, "reason": "GPU has fallen off the bus", "message": "NVRM: Xid (PCI:0000:40:00): 79, pid=0",
        "since": "2026-12-01T00:00:00Z", "action": "reboot",
    }});
    std::fs::write(&h.state, st.to_string()).unwrap();
    let o = h.qemu(
        "vm2",
        "prepare",
        &vm_domain("vm2", 3, &pci_hostdev(&p[2]), ""),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).starts_with(&format!(
            "gpuhook: vm 'vm2': GPU {} (hostdev {}) cannot be used: quarantined",
            p[2], p[2]
        )),
        "{}",
        stderr(&o)
    );
}
