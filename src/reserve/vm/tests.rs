//! A VM's hostdevs over a sysfs tree written in a temporary directory (functions with their
//! `uevent` and config space, mediated devices under `bus/mdev/devices`, a virtual function's
//! `physfn`): as any user.

use super::*;
use crate::host::inventory::Inventory;
use crate::request::hostdev::{Hostdev, QemuDomain, SourceAddr};
use crate::reserve::state::{HolderKind, Quarantine, Reservation};

const VM: &str = "9f0c9a5e-2f4b-4c51-8e7a-1d2c3b4a5f60";
const M1: &str = "4b20d080-1b54-4048-85b3-a6a62d165c01";
const M2: &str = "4b20d080-1b54-4048-85b3-a6a62d165c02";

/// A sysfs with two NVIDIA GPUs (3b:00.0 with its audio function 3b:00.1, 3c:00.0), a
/// NIC (5e:00.0), a virtual function 3c:00.4 of 3c:00.0, mediated devices M1 and M2 on
/// 3b:00.0, one on the virtual function, one on the NIC.
fn host() -> (tempfile::TempDir, Config) {
    let d = tempfile::tempdir().unwrap();
    let sys = d.path().join("sys");
    let fun = |pci: &str, class: u32, id: &str, physfn: Option<&str>, config: [u8; 4]| {
        let dir = sys.join("devices/pci0000:00").join(pci);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("uevent"),
            format!("PCI_CLASS={class:X}\nPCI_ID={id}\nPCI_SLOT_NAME={pci}\n"),
        )
        .unwrap();
        std::fs::write(dir.join("config"), config).unwrap();
        std::fs::create_dir_all(sys.join("bus/pci/devices")).unwrap();
        std::os::unix::fs::symlink(
            format!("../../../devices/pci0000:00/{pci}"),
            sys.join("bus/pci/devices").join(pci),
        )
        .unwrap();
        if let Some(pf) = physfn {
            std::os::unix::fs::symlink(format!("../{pf}"), dir.join("physfn")).unwrap();
        }
    };
    let ok = [0xde, 0x10, 0x30, 0x23];
    fun("0000:3b:00.0", 0x030200, "10DE:2330", None, ok);
    fun("0000:3b:00.1", 0x040300, "10DE:22E8", None, ok);
    fun("0000:3c:00.0", 0x030200, "10DE:2330", None, ok);
    fun(
        "0000:3c:00.4",
        0x030200,
        "10DE:2330",
        Some("0000:3c:00.0"),
        ok,
    );
    fun("0000:5e:00.0", 0x020000, "15B3:101D", None, ok);
    fun("0000:5f:00.0", 0x030200, "10DE:2330", None, [0xff; 4]);
    let mdev = |uuid: &str, parent: &str| {
        let dir = sys.join("devices/pci0000:00").join(parent).join(uuid);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(sys.join("bus/mdev/devices")).unwrap();
        std::os::unix::fs::symlink(
            format!("../../../devices/pci0000:00/{parent}/{uuid}"),
            sys.join("bus/mdev/devices").join(uuid),
        )
        .unwrap();
    };
    mdev(M1, "0000:3b:00.0");
    mdev(M2, "0000:3b:00.0");
    mdev("4b20d080-1b54-4048-85b3-a6a62d165c04", "0000:3c:00.4");
    mdev("4b20d080-1b54-4048-85b3-a6a62d165c05", "0000:5e:00.0");
    let cfg = Config {
        sysfs: sys,
        state_file: d.path().join("run/state.json"),
        libvirt_qemu_dir: d.path().join("qemu"),
        ..Config::default()
    };
    (d, cfg)
}

fn pci(bus: u32, slot: u32, function: u32) -> Hostdev {
    Hostdev::Pci {
        addr: SourceAddr {
            domain: 0,
            bus,
            slot,
            function,
        },
        managed: true,
    }
}

fn mdev(uuid: &str) -> Hostdev {
    Hostdev::Mdev {
        uuid: crate::ids::MdevId::parse(uuid).unwrap(),
    }
}

fn dom(hostdevs: &[Hostdev]) -> QemuDomain {
    QemuDomain {
        name: "vm1".into(),
        uuid: VM.into(),
        hostdevs: hostdevs.to_vec(),
        gpuhook_request: false,
    }
}

fn u(s: &str) -> Unit {
    s.parse().unwrap()
}

fn units(a: &VmAsk) -> Vec<String> {
    a.units.iter().map(ToString::to_string).collect()
}

/// A GPU, its companion function alone (the whole GPU), a NIC (nothing), mediated devices of
/// a GPU, of a virtual function (its physical function's), of a NIC (nothing).
#[test]
fn what_hostdevs_hold() {
    let (_d, cfg) = host();
    let a = ask(&cfg, &dom(&[pci(0x3b, 0, 0), pci(0x3b, 0, 1)])).unwrap();
    assert_eq!(units(&a), ["0000:3b:00.0"]);
    assert_eq!(
        a.by(&a.units[0]),
        "hostdev 0000:3b:00.0, hostdev 0000:3b:00.1"
    );
    let a = ask(&cfg, &dom(&[pci(0x3b, 0, 1)])).unwrap();
    assert_eq!(units(&a), ["0000:3b:00.0"], "a companion holds its GPU");
    assert!(ask(&cfg, &dom(&[pci(0x5e, 0, 0), pci(0x70, 0, 0)]))
        .unwrap()
        .is_empty());
    let a = ask(
        &cfg,
        &dom(&[
            mdev(M1),
            mdev("4b20d080-1b54-4048-85b3-a6a62d165c04"),
            mdev("4b20d080-1b54-4048-85b3-a6a62d165c05"),
            mdev("4b20d080-1b54-4048-85b3-a6a62d165c09"),
        ]),
    )
    .unwrap();
    assert_eq!(
        units(&a),
        [
            format!("0000:3b:00.0/mdev-{M1}"),
            "0000:3c:00.0/mdev-4b20d080-1b54-4048-85b3-a6a62d165c04".into()
        ]
    );
    assert_eq!(
        a.to_string(),
        format!("mdev {M1} of GPU 0000:3b:00.0, mdev 4b20d080-1b54-4048-85b3-a6a62d165c04 of GPU 0000:3c:00.0")
    );
    let e = ask(&cfg, &dom(&[pci(0x3b, 0, 1), mdev(M1)])).unwrap_err();
    assert_eq!(e.to_string(), format!("GPU 0000:3b:00.0 is passed through whole (hostdev 0000:3b:00.1) and as a mediated device (mdev {M1}): a GPU goes to a VM either whole or as mediated devices"));
}

fn state(rs: &[Reservation]) -> State {
    let mut st = State::default();
    for r in rs {
        st.insert(r.clone());
    }
    st
}

fn res(kind: HolderKind, name: &str, id: &str, units: &[&str]) -> Reservation {
    Reservation::for_test(kind, name, id, units)
}

fn check_one(cfg: &Config, st: &State, passed: &PassedThrough, hostdevs: &[Hostdev]) -> String {
    let a = ask(cfg, &dom(hostdevs)).unwrap();
    let key = crate::reserve::state::HolderId::Vm {
        name: "vm1".into(),
        uuid: VM.into(),
    }
    .key();
    match check(cfg, st, &st.held(Some(&key)), passed, VM, &a) {
        Ok(()) => "ok".into(),
        Err(e) => e.to_string(),
    }
}

/// Whole GPUs: another holder of any kind, a draining unit, another running VM, the host's
/// config and the GPU's health each refuse, naming the GPU, the hostdev and the holder.
#[test]
fn whole_gpus_refused_when_anyone_else_has_them() {
    let (_d, mut cfg) = host();
    let none = PassedThrough::default();
    let ct = res(HolderKind::Oci, "c1", "c1", &["0000:3b:00.0"]);
    assert_eq!(
        check_one(&cfg, &state(&[ct]), &none, &[pci(0x3b, 0, 1)]),
        "GPU 0000:3b:00.0 (hostdev 0000:3b:00.1) is held by container 'c1'"
    );
    let slot = res(HolderKind::Libvirt, "web1", "u1", &["0000:3b:00.0/slot1"]);
    assert_eq!(
        check_one(&cfg, &state(&[slot]), &none, &[pci(0x3b, 0, 0)]),
        "GPU 0000:3b:00.0 (hostdev 0000:3b:00.0) is held by domain 'web1'"
    );
    let other_vm = res(
        HolderKind::Vm,
        "vm2",
        "u2",
        &[&format!("0000:3b:00.0/mdev-{M2}")],
    );
    assert_eq!(
        check_one(&cfg, &state(&[other_vm]), &none, &[pci(0x3b, 0, 0)]),
        "GPU 0000:3b:00.0 (hostdev 0000:3b:00.0) is held by vm 'vm2'"
    );
    // The VM's own reservation is no obstacle.
    let mine = res(HolderKind::Vm, "vm1", VM, &["0000:3b:00.0"]);
    assert_eq!(
        check_one(&cfg, &state(&[mine]), &none, &[pci(0x3b, 0, 0)]),
        "ok"
    );
    let passed = PassedThrough::of([(
        u("0000:3b:00.0"),
        PassedVm {
            name: "hot".into(),
            uuid: "u3".into(),
        },
    )]);
    assert_eq!(
        check_one(&cfg, &State::default(), &passed, &[pci(0x3b, 0, 0)]),
        "GPU 0000:3b:00.0 (hostdev 0000:3b:00.0) is passed through to vm 'hot', which runs (libvirt's status XML; not reserved through gpuhook)"
    );
    let mut st = State::default();
    st.quarantine.insert(
        "0000:3c:00.0".into(),
        Quarantine {
            xid: Some(79),
            reason: "fallen off the bus".into(),
            message: "NVRM: Xid (PCI:0000:3c:00): 79".into(),
            since: "2026-12-01T00:00:00Z".into(),
            action: None,
            boot_id: None,
            needs_inspection: false,
        },
    );
    assert!(check_one(&cfg, &st, &none, &[pci(0x3c, 0, 0)])
        .starts_with("GPU 0000:3c:00.0 (hostdev 0000:3c:00.0) cannot be used: quarantined"));
    assert_eq!(
        check_one(&cfg, &State::default(), &none, &[pci(0x5f, 0, 0)]),
        "GPU 0000:5f:00.0 (hostdev 0000:5f:00.0) cannot be used: its PCI config space reads as all ones: fallen off the bus"
    );
    cfg.exclude.push("0000:3c:00.0".into());
    assert_eq!(
        check_one(&cfg, &State::default(), &none, &[pci(0x3c, 0, 0)]),
        "GPU 0000:3c:00.0 (hostdev 0000:3c:00.0) is excluded by the host config"
    );
    cfg.share_by_address.insert(
        "0000:3b:00.0".into(),
        crate::host::config::Sharing::timeslice(3),
    );
    assert_eq!(
        check_one(&cfg, &State::default(), &none, &[pci(0x3b, 0, 0)]),
        "GPU 0000:3b:00.0 (hostdev 0000:3b:00.0) is shared by the host config (3 slots): it is given to containers as slots, never whole to a VM"
    );
}

/// Mediated devices: VMs share their GPU; anyone else on it (whole, a slot, a MIG
/// instance, a container) refuses them; the same mediated device twice is refused.
#[test]
fn mediated_devices_share_their_gpu_among_vms_only() {
    let (_d, cfg) = host();
    let none = PassedThrough::default();
    let vm2 = res(
        HolderKind::Vm,
        "vm2",
        "u2",
        &[&format!("0000:3b:00.0/mdev-{M2}")],
    );
    assert_eq!(
        check_one(&cfg, &state(std::slice::from_ref(&vm2)), &none, &[mdev(M1)]),
        "ok"
    );
    let same = res(
        HolderKind::Vm,
        "vm2",
        "u2",
        &[&format!("0000:3b:00.0/mdev-{M1}")],
    );
    assert_eq!(
        check_one(&cfg, &state(&[same]), &none, &[mdev(M1)]),
        format!("0000:3b:00.0/mdev-{M1} (mdev {M1}) is held by vm 'vm2'")
    );
    for (holder, unit) in [
        (
            res(HolderKind::Oci, "c1", "c1", &["0000:3b:00.0"]),
            "container 'c1'",
        ),
        (
            res(HolderKind::Libvirt, "web1", "u1", &["0000:3b:00.0/slot0"]),
            "domain 'web1'",
        ),
        (
            res(HolderKind::Libvirt, "web1", "u1", &["0000:3b:00.0/gi1/ci0"]),
            "domain 'web1'",
        ),
        (
            res(HolderKind::Vm, "vm3", "u3", &["0000:3b:00.0"]),
            "vm 'vm3'",
        ),
    ] {
        assert_eq!(
            check_one(&cfg, &state(&[holder, vm2.clone()]), &none, &[mdev(M1)]),
            format!("GPU 0000:3b:00.0 (mdev {M1}) is held by {unit}: its mediated devices go to VMs only while no one else holds it")
        );
    }
    // Another running VM with another mediated device of the GPU: shared; with the GPU
    // whole, or the same one: refused.
    let vm = |unit: &str| {
        PassedThrough::of([(
            u(unit),
            PassedVm {
                name: "hot".into(),
                uuid: "u3".into(),
            },
        )])
    };
    assert_eq!(
        check_one(
            &cfg,
            &State::default(),
            &vm(&format!("0000:3b:00.0/mdev-{M2}")),
            &[mdev(M1)]
        ),
        "ok"
    );
    for unit in [
        format!("0000:3b:00.0/mdev-{M1}"),
        "0000:3b:00.0".to_string(),
    ] {
        assert!(
            check_one(&cfg, &State::default(), &vm(&unit), &[mdev(M1)])
                .contains("is passed through to vm 'hot'"),
            "{unit}"
        );
    }
}

/// A GPU a running VM passes through unreserved is unusable for a container, naming the VM;
/// one a reservation holds is its holder's to name.
#[test]
fn passed_through_gpus_are_named_for_containers() {
    let mut inv = Inventory {
        gpus: crate::reserve::alloc::tests::dgx(),
        ..Default::default()
    };
    let a = inv.gpus[0].pci;
    let b = inv.gpus[1].pci;
    let passed = PassedThrough::of([
        (
            Unit::Gpu(a),
            PassedVm {
                name: "hot".into(),
                uuid: "u3".into(),
            },
        ),
        (
            Unit::Gpu(b),
            PassedVm {
                name: "vm2".into(),
                uuid: "u2".into(),
            },
        ),
    ]);
    let st = state(&[res(HolderKind::Vm, "vm2", "u2", &[b.as_str()])]);
    mark_passed_through(&mut inv, &st, &passed);
    assert_eq!(
        inv.gpus[0].problem.as_deref(),
        Some("passed through to vm 'hot' (running; libvirt's status XML, not reserved through gpuhook)")
    );
    assert_eq!(inv.gpus[1].problem, None);
}

/// The status directory: a running VM (pid file of a live process, status XML naming it)
/// counts; a VM whose QEMU is gone, a status naming another process or domain, a link, a
/// file that does not parse do not.
#[test]
fn running_vms_from_the_status_directory() {
    let (d, cfg) = host();
    let q = &cfg.libvirt_qemu_dir;
    std::fs::create_dir_all(q).unwrap();
    let me = std::process::id() as i32;
    let status = |name: &str, pid: i32, bus: &str| {
        format!("<domstatus state='running' reason='booted' pid='{pid}'>\n  <domain type='kvm' id='1'>\n    <name>{name}</name>\n    <uuid>{VM}</uuid>\n    <devices>\n      <hostdev mode='subsystem' type='pci' managed='yes'>\n        <source>\n          <address domain='0x0000' bus='{bus}' slot='0x00' function='0x1'/>\n        </source>\n      </hostdev>\n    </devices>\n  </domain>\n</domstatus>\n")
    };
    let put = |name: &str, pid: i32, xml: &str| {
        std::fs::write(q.join(format!("{name}.pid")), format!("{pid}\n")).unwrap();
        std::fs::write(q.join(format!("{name}.xml")), xml).unwrap();
    };
    put("live", me, &status("live", me, "0x3b"));
    put("gone", 999_999_999, &status("gone", 999_999_999, "0x3c"));
    put("liar", me, &status("other", me, "0x3c"));
    put("bad", me, "<domstatus pid='x'><hostdev/></domstatus>");
    std::fs::write(q.join("nopid.xml"), status("nopid", me, "0x3c")).unwrap();
    std::os::unix::fs::symlink(d.path().join("elsewhere.xml"), q.join("link.xml")).unwrap();
    std::fs::write(q.join("link.pid"), format!("{me}\n")).unwrap();
    std::fs::write(d.path().join("elsewhere.xml"), status("link", me, "0x3c")).unwrap();
    let passed = passed_through(&cfg, crate::host::procfs::REAL);
    let got: Vec<(String, String)> = passed
        .iter()
        .map(|(u, v)| (u.to_string(), v.name.clone()))
        .collect();
    assert_eq!(got, [("0000:3b:00.0".to_string(), "live".to_string())]);
    let (vms, unread) = crate::host::qemu::running_with_hostdevs(&cfg, crate::host::procfs::REAL);
    assert_eq!(vms.len(), 1);
    let said: Vec<String> = unread.iter().map(ToString::to_string).collect();
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(
        said.iter()
            .any(|s| s.contains("bad.xml: <domstatus pid='x'>")),
        "{said:?}"
    );
    assert!(said.iter().any(|s| s.contains("link.xml")), "{said:?}");
    assert!(
        passed
            .of_gpu("0000:3b:00.0".parse().unwrap(), Some(VM))
            .is_none(),
        "its own"
    );
    // A pid file of a name that cannot be a file's, or holding no pid.
    assert!(crate::host::qemu::pid(&cfg, "../x").is_err());
    std::fs::write(q.join("junk.pid"), "x\n").unwrap();
    assert!(crate::host::qemu::pid(&cfg, "junk").is_err());
    assert_eq!(crate::host::qemu::pid(&cfg, "none").unwrap(), None);
    assert_eq!(crate::host::qemu::pid(&cfg, "live").unwrap(), Some(me));
}

/// `gpuhook-libvirt request` naming a GPU in MIG mode or a shared one (or asking for more
/// GPUs than there are whole ones) is refused in a VM's words: never told to ask for MIG
/// instances or a slot, which a VM cannot have.
#[test]
fn a_vm_is_refused_instances_and_slots_in_its_own_words() {
    let (_d, cfg) = host();
    let mut gpus = crate::reserve::alloc::tests::dgx();
    gpus.truncate(2);
    gpus[0].pci = "0000:3b:00.0".parse().unwrap();
    gpus[1].pci = "0000:3c:00.0".parse().unwrap();
    gpus[0] = crate::reserve::alloc::tests::with_migs(gpus[0].clone(), &[(1, 0), (2, 0)]);
    gpus[1].sharing = Some(crate::host::config::Sharing::timeslice(3));
    let inv = Inventory {
        gpus,
        ..Default::default()
    };
    let said = |count: u32, dev: Option<&str>| {
        let req = crate::request::Request {
            count,
            devices: dev
                .map(|d| vec![crate::request::DeviceSel::Pci(d.into())])
                .unwrap_or_default(),
            ..Default::default()
        };
        let vm = ForVm {
            uuid: VM,
            numa: None,
            taken: &[],
        };
        choose(
            &cfg,
            &inv,
            &State::default(),
            &PassedThrough::default(),
            vm,
            &req,
        )
        .unwrap_err()
        .to_string()
    };
    assert_eq!(
        said(1, Some("0000:3b:00.0")),
        "GPU 0000:3b:00.0 (pci 0000:3b:00.0) is in MIG mode with 2 instances: its instances go to containers, and request chooses no GPU in MIG mode for a VM (a <hostdev> written by hand passes it through whole)"
    );
    assert_eq!(
        said(1, Some("0000:3c:00.0")),
        "GPU 0000:3c:00.0 (pci 0000:3c:00.0) is shared (3 slots): it is given to containers as slots, never whole to a VM"
    );
    assert_eq!(
        said(1, None),
        "cannot reserve 1 GPU: only 0 of the host's 2 matching GPUs are free: 1 in MIG mode (handed out to containers as instances), 1 shared (handed out to containers as slots)"
    );
}
