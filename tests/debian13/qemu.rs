//! libvirt 11's QEMU driver (the system's libvirtd, `virsh -c qemu:///system`) with the
//! installed hook, and real PCI passthrough: this VM is a q35 machine with an emulated
//! IOMMU (`intel_iommu=on`) and two emulated PCI functions (QEMU's `edu` device, at
//! 0000:00:10.0 and 0000:00:11.0, each in an IOMMU group of its own). The fake inventory
//! describes them as two NVIDIA GPUs bound to `nvidia` at those addresses; libvirt binds the
//! real functions to `vfio-pci` and hands them to a nested QEMU (software emulation, no
//! disk). A probe in `/etc/libvirt/hooks/qemu.d` records libvirt's hook calls.

use super::{last_line, text, Vm};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use testbed::{DomainSpec, FakeHost, Hostdev, VmSpec};

const URI: &str = "qemu:///system";
const LXC: &str = "lxc:///system";
const EMULATOR: &str = "/usr/bin/qemu-system-x86_64";
/// The two `edu` functions, as tests/debian13's boot places them.
pub const EDU: [&str; 2] = ["0000:00:10.0", "0000:00:11.0"];
const PROBE: &str = "/var/tmp/gh-probe";
const IMAGE: &str = "localhost/gh-busybox";

/// The blueprint's two Tesla M2050 moved to the `edu` functions' addresses (on the root
/// bus, as the functions are).
fn edu_host() -> FakeHost {
    let mut f = FakeHost::blueprint();
    for (from, to) in [("0000:07:00.0", EDU[0]), ("0000:08:00.0", EDU[1])] {
        let d = f
            .devices
            .iter_mut()
            .find(|d| d.pci == from)
            .expect("a blueprint GPU");
        d.pci = to.into();
        d.upstream = vec!["pci0000:00".into()];
    }
    f.name = "edu".into();
    f
}

fn virsh_at(vm: &mut Vm, uri: &str, args: &[&str]) -> Output {
    vm.cmd(
        Command::new("virsh")
            .arg("-q")
            .arg("-c")
            .arg(uri)
            .args(args),
    )
}

fn virsh_ok(vm: &mut Vm, args: &[&str]) -> String {
    let o = virsh_at(vm, URI, args);
    assert!(o.status.success(), "virsh {args:?}: {}", last_line(&o));
    text(&o)
}

fn define_at(vm: &mut Vm, uri: &str, name: &str, xml: &str) {
    let f = format!("/var/tmp/{name}.xml");
    std::fs::write(&f, xml).expect("xml");
    let o = virsh_at(vm, uri, &["define", &f]);
    assert!(o.status.success(), "define {name}: {}", last_line(&o));
}

fn cleanup(vm: &mut Vm, prefix: &str) {
    for uri in [URI, LXC] {
        let list = text(&virsh_at(vm, uri, &["list", "--all", "--name"]));
        for name in list
            .lines()
            .map(str::trim)
            .filter(|n| n.starts_with(prefix))
        {
            let _ = virsh_at(vm, uri, &["destroy", name]);
            let _ = virsh_at(vm, uri, &["undefine", name]);
        }
    }
}

/// The probe in `hooks/qemu.d` (libvirtd restarted to see it, the first time), its records
/// cleared.
fn probe(vm: &mut Vm) {
    let dir = Path::new("/etc/libvirt/hooks/qemu.d");
    let f = dir.join("90-gh-probe");
    let fresh = !f.exists();
    std::fs::create_dir_all(dir).expect("qemu.d");
    let script = testbed::vm::probe_script(
        Path::new(PROBE),
        Path::new(super::CONFIG),
        Path::new(super::GPUHOOK),
    );
    std::fs::write(&f, script).expect("probe");
    vm.ok(&format!("chmod 755 {}", f.display()));
    vm.ok(&format!("rm -rf {PROBE} && mkdir -p {PROBE}"));
    if fresh {
        restart_libvirtd(vm);
    }
}

/// libvirt's hook calls for the domain, `OP SUBOP EXTRA` each.
fn calls_of(name: &str) -> Vec<String> {
    std::fs::read_to_string(format!("{PROBE}/calls"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{name} ")).map(str::to_owned))
        .collect()
}

/// The calls' `OP SUBOP` (libvirt 11 passes a reason as `release`'s EXTRA, not `-`).
fn ops_of(vm: &mut Vm, name: &str) -> Vec<String> {
    let calls = calls_of(name);
    vm.note(&format!("{name}: hook calls {calls:?}"));
    calls
        .iter()
        .map(|c| c.split(' ').take(2).collect::<Vec<_>>().join(" "))
        .collect()
}

fn restart_libvirtd(vm: &mut Vm) {
    let t = Instant::now();
    vm.ok("systemctl restart libvirtd");
    while !virsh_at(vm, URI, &["uri"]).status.success() {
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "libvirtd never came back"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    vm.note(&format!(
        "libvirtd restarted in {:.1}s",
        t.elapsed().as_secs_f64()
    ));
}

/// `virsh start`, timed; the error's text on failure.
fn start(vm: &mut Vm, uri: &str, name: &str) -> Result<(), String> {
    let t = Instant::now();
    let o = virsh_at(vm, uri, &["start", name]);
    vm.note(&format!("start {name}: {:.1}s", t.elapsed().as_secs_f64()));
    if o.status.success() {
        Ok(())
    } else {
        Err(super::err(&o))
    }
}

fn gpuhook_line(e: &str) -> String {
    let ours: Vec<&str> = e.lines().filter(|l| l.contains("gpuhook: ")).collect();
    assert_eq!(ours.len(), 1, "not one gpuhook line: {e}");
    let l = ours[0];
    l[l.find("gpuhook: ").expect("gpuhook")..].to_owned()
}

fn state_of(vm: &mut Vm, name: &str) -> String {
    virsh_ok(vm, &["domstate", name]).trim().to_owned()
}

fn qemu_pid(name: &str) -> i32 {
    let p = format!("/run/libvirt/qemu/{name}.pid");
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{p}: {e}"))
        .trim()
        .parse()
        .expect("pid")
}

/// The PCI function's driver in the real sysfs (`-` when none).
fn real_driver(pci: &str) -> String {
    std::fs::read_link(format!("/sys/bus/pci/devices/{pci}/driver"))
        .ok()
        .and_then(|l| l.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "-".into())
}

/// Whether process `pid` holds the function's VFIO group (`/dev/vfio/GROUP`).
fn holds_group(pid: i32, pci: &str) -> bool {
    let g = std::fs::read_link(format!("/sys/bus/pci/devices/{pci}/iommu_group"))
        .expect("the function has an IOMMU group (intel_iommu=on)");
    let want = Path::new("/dev/vfio").join(g.file_name().expect("group"));
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .any(|e| std::fs::read_link(e.path()).ok().as_deref() == Some(want.as_path()))
        })
        .unwrap_or(false)
}

/// `list --json`'s holder of a GPU.
fn holder_of(l: &Value, pci: &str) -> Value {
    l["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .find(|g| g["pci"] == pci)
        .unwrap_or_else(|| panic!("{pci} is not in the inventory: {l}"))["holder"]
        .clone()
}

fn vm_spec(name: &str) -> VmSpec {
    VmSpec::new(name, Path::new(EMULATOR))
}

fn lxc_pinned(vm: &mut Vm, name: &str, pci: &str) {
    let spec = DomainSpec::new(
        name,
        &format!(r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"><gpu:device pci="{pci}"/></gpu:gpus>"#),
    );
    define_at(vm, LXC, name, &spec.xml());
}

/// A podman container through gpuhook-runtime asking for `n` GPUs: its output.
fn podman(vm: &mut Vm, n: u32) -> Output {
    super::oci::image(vm);
    vm.sh(&format!(
        "podman --runtime /usr/bin/gpuhook-runtime run --rm --network none --annotation gpuhook.io/gpus={n} {IMAGE} true"
    ))
}

/// A VM without GPU hostdevs under the installed hook, while an LXC domain holds a GPU: it
/// starts and stops, libvirt's calls in order; its start never opens the pool's files, its
/// stop only reads the state (no lock, no write).
pub fn plain(vm: &mut Vm) {
    vm.host(edu_host(), |_| {});
    probe(vm);
    cleanup(vm, "gh-q");
    vm.on_exit("virsh -c qemu:///system destroy gh-qplain; virsh -c qemu:///system undefine gh-qplain; virsh -c lxc:///system destroy gh-qlxp; virsh -c lxc:///system undefine gh-qlxp");
    lxc_pinned(vm, "gh-qlxp", EDU[1]);
    start(vm, LXC, "gh-qlxp").expect("gh-qlxp");
    let before = std::fs::read(super::STATE).expect("the LXC domain's state");
    let dir = Path::new(super::STATE).parent().expect("state dir");
    let pool = testbed::watch::Opens::watch(dir).expect("inotify");
    define_at(vm, URI, "gh-qplain", &vm_spec("gh-qplain").xml());
    start(vm, URI, "gh-qplain").expect("a VM without GPUs starts");
    assert_eq!(state_of(vm, "gh-qplain"), "running");
    let at_start = pool.seen();
    virsh_ok(vm, &["destroy", "gh-qplain"]);
    let at_stop = pool.seen();
    assert_eq!(
        ops_of(vm, "gh-qplain"),
        [
            "prepare begin",
            "start begin",
            "started begin",
            "stopped end",
            "release end"
        ]
    );
    assert!(
        at_start.is_empty(),
        "the hook touched the pool at a start without GPUs: {at_start:?}"
    );
    assert!(
        at_stop
            .iter()
            .all(|e| e.ends_with(" state.json")
                && (e.contains("IN_OPEN") || e.contains("IN_ACCESS"))),
        "the hook locked or wrote the pool at a stop without GPUs: {at_stop:?}"
    );
    assert_eq!(std::fs::read(super::STATE).expect("state"), before);
    assert_eq!(vm.holders()["gh-qlxp"], [EDU[1]]);
}

/// The passthrough: a VM with one `edu` as a managed hostdev starts (libvirt binds it to
/// vfio-pci, the nested QEMU holds its group), `list` shows it held by the VM; an LXC domain
/// and a container asking for it are refused naming the VM; `virsh attach-device` of the
/// other (no hook runs) makes `list` attribute it to the VM (`"reserved": false`) and the
/// pool refuse it to a domain; libvirtd restarts (`reconnect`) and keeps the reservation;
/// destroy frees both, and the domain gets the GPU.
pub fn passthrough(vm: &mut Vm) {
    vm.host(edu_host(), |c| {
        c["oci_runtime"] = serde_json::json!("/usr/bin/crun")
    });
    probe(vm);
    cleanup(vm, "gh-q");
    vm.on_exit("for d in gh-qpv; do virsh -c qemu:///system destroy $d; virsh -c qemu:///system undefine $d; done; for d in gh-qlx gh-qlx2; do virsh -c lxc:///system destroy $d; virsh -c lxc:///system undefine $d; done");
    for pci in EDU {
        vm.note(&format!("{pci}: real driver {}", real_driver(pci)));
    }
    define_at(
        vm,
        URI,
        "gh-qpv",
        &vm_spec("gh-qpv").with(Hostdev::pci(EDU[0])).xml(),
    );
    start(vm, URI, "gh-qpv").expect("the passthrough VM starts");
    let pid = qemu_pid("gh-qpv");
    assert_eq!(real_driver(EDU[0]), "vfio-pci");
    assert!(
        holds_group(pid, EDU[0]),
        "QEMU {pid} does not hold {}'s group",
        EDU[0]
    );
    let uuid = virsh_ok(vm, &["domuuid", "gh-qpv"]).trim().to_owned();
    let l = vm.list();
    let h = holder_of(&l, EDU[0]);
    assert_eq!(
        (&h["kind"], &h["domain"]),
        (&"vm".into(), &"gh-qpv".into()),
        "{l}"
    );
    assert_eq!(h["uuid"], uuid.as_str(), "{l}");
    assert!(holder_of(&l, EDU[1]).is_null(), "{l}");

    lxc_pinned(vm, "gh-qlx", EDU[0]);
    let e = start(vm, LXC, "gh-qlx").expect_err("the VM's GPU");
    let line = gpuhook_line(&e);
    for w in ["gh-qlx", EDU[0], "gh-qpv"] {
        assert!(line.contains(w), "the refusal does not name {w}: {line}");
    }
    let o = podman(vm, 2);
    assert!(!o.status.success(), "a container got the VM's GPU");
    assert!(super::err(&o).contains("gh-qpv"), "{}", super::err(&o));

    // Hot-plugged: libvirt runs no hook; the pool still knows.
    let calls = calls_of("gh-qpv").len();
    let dev = "/var/tmp/gh-qpv-edu1.xml";
    std::fs::write(dev, Hostdev::pci(EDU[1]).xml()).expect("hostdev xml");
    let t = Instant::now();
    virsh_ok(vm, &["attach-device", "gh-qpv", dev, "--live"]);
    vm.note(&format!("attach-device: {:.1}s", t.elapsed().as_secs_f64()));
    assert_eq!(
        calls_of("gh-qpv").len(),
        calls,
        "a hook ran at attach-device"
    );
    assert_eq!(real_driver(EDU[1]), "vfio-pci");
    assert!(holds_group(pid, EDU[1]));
    let l = vm.list();
    let h = holder_of(&l, EDU[1]);
    assert_eq!(
        (&h["kind"], &h["domain"]),
        (&"vm".into(), &"gh-qpv".into()),
        "{l}"
    );
    assert_eq!(h["reserved"], false, "{l}");
    lxc_pinned(vm, "gh-qlx2", EDU[1]);
    let e = start(vm, LXC, "gh-qlx2").expect_err("the hot-plugged GPU");
    let line = gpuhook_line(&e);
    assert!(line.contains(EDU[1]) && line.contains("gh-qpv"), "{line}");
    let o = podman(vm, 1);
    assert!(!o.status.success(), "a container got a GPU of the VM");

    // libvirtd restarts: reconnect keeps the VM and what it holds.
    restart_libvirtd(vm);
    let t = Instant::now();
    while !virsh_ok(vm, &["list", "--name"]).contains("gh-qpv") {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "gh-qpv gone after the restart"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(qemu_pid("gh-qpv"), pid, "the VM was restarted");
    assert_eq!(
        ops_of(vm, "gh-qpv").last().map(String::as_str),
        Some("reconnect begin")
    );
    let l = vm.list();
    assert_eq!(holder_of(&l, EDU[0])["domain"], "gh-qpv", "{l}");
    assert_eq!(holder_of(&l, EDU[1])["domain"], "gh-qpv", "{l}");
    let r: Vec<&Value> = l["reservations"]
        .as_array()
        .expect("reservations")
        .iter()
        .collect();
    assert_eq!(r.len(), 1, "{l}");
    assert_eq!(r[0]["phase"], "running", "{l}");

    let t = Instant::now();
    virsh_ok(vm, &["destroy", "gh-qpv"]);
    vm.note(&format!("destroy: {:.1}s", t.elapsed().as_secs_f64()));
    let l = vm.list();
    for pci in EDU {
        assert!(
            holder_of(&l, pci).is_null(),
            "{pci} still held after destroy: {l}"
        );
        assert_ne!(
            real_driver(pci),
            "vfio-pci",
            "libvirt did not give {pci} back"
        );
    }
    start(vm, LXC, "gh-qlx").expect("the domain gets the VM's GPU after destroy");
    assert_eq!(vm.holders()["gh-qlx"], [EDU[0]]);
    let _ = virsh_at(vm, LXC, &["destroy", "gh-qlx"]);
}

/// The VM's QEMU killed (`kill -9`): while libvirtd runs, libvirt's `stopped`/`release` free
/// its GPU; while libvirtd is down, the reservation is stale (its QEMU is gone) and a
/// container gets the GPU; libvirtd back, its `release` for the dead VM frees nothing of the
/// container's.
pub fn killed(vm: &mut Vm) {
    vm.host(edu_host(), |c| {
        c["oci_runtime"] = serde_json::json!("/usr/bin/crun")
    });
    probe(vm);
    cleanup(vm, "gh-q");
    vm.on_exit("systemctl start libvirtd; virsh -c qemu:///system destroy gh-qk; virsh -c qemu:///system undefine gh-qk; podman rm -f -t 0 gh-qk-oci");
    define_at(
        vm,
        URI,
        "gh-qk",
        &vm_spec("gh-qk").with(Hostdev::pci(EDU[0])).xml(),
    );
    start(vm, URI, "gh-qk").expect("start");
    let pid = qemu_pid("gh-qk");
    vm.ok(&format!("kill -9 {pid}"));
    let t = Instant::now();
    while state_of(vm, "gh-qk") != "shut off" {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "libvirt never saw QEMU die"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    vm.note(&format!(
        "killed: shut off after {:.1}s",
        t.elapsed().as_secs_f64()
    ));
    assert!(
        holder_of(&vm.list(), EDU[0]).is_null(),
        "the killed VM's GPU is held"
    );

    start(vm, URI, "gh-qk").expect("start again");
    let pid = qemu_pid("gh-qk");
    vm.ok("systemctl stop libvirtd");
    vm.ok(&format!("kill -9 {pid}"));
    let t = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "QEMU {pid} still there"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let l = vm.list();
    let h = holder_of(&l, EDU[0]);
    assert_eq!(h["domain"], "gh-qk", "{l}");
    assert_eq!(
        h["stale"], true,
        "a dead VM's reservation is not stale: {l}"
    );
    super::oci::image(vm);
    let o = vm.sh(&format!(
        "podman --runtime /usr/bin/gpuhook-runtime run -d --name gh-qk-oci --network none --annotation gpuhook.io/gpus=2 {IMAGE} sleep 600"
    ));
    assert!(
        o.status.success(),
        "the stale VM's GPU is not free: {}",
        last_line(&o)
    );
    let id = text(&o).trim().to_owned();
    assert_eq!(vm.holders()[&id].len(), 2);
    vm.ok("systemctl start libvirtd");
    let t = Instant::now();
    while state_of(vm, "gh-qk") != "shut off" {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "libvirt still thinks gh-qk runs"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let _ = ops_of(vm, "gh-qk");
    assert_eq!(
        vm.holders()[&id].len(),
        2,
        "libvirt's release of the dead VM freed the container's GPUs"
    );
    vm.ok(&format!("podman rm -f -t 0 {id}"));
    assert!(vm.holders().is_empty());
}
