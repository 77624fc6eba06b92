//! libvirt 11's LXC driver (the system's libvirtd, `virsh -c lxc:///system`) with the
//! installed hook, on cgroup v2 with systemd: libvirt's own BPF device program.

use super::{gpus, last_line, Vm};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use testbed::{DomainSpec, FakeHost};

const URI: &str = "lxc:///system";

fn virsh(vm: &mut Vm, args: &[&str]) -> Output {
    vm.cmd(Command::new("virsh").arg("-c").arg(URI).args(args))
}

fn virsh_ok(vm: &mut Vm, args: &[&str]) -> String {
    let o = virsh(vm, args);
    assert!(o.status.success(), "virsh {args:?}: {}", last_line(&o));
    super::text(&o)
}

fn cleanup(vm: &mut Vm, prefix: &str) {
    let list = virsh_ok(vm, &["list", "--all", "--name"]);
    for name in list
        .lines()
        .map(str::trim)
        .filter(|n| n.starts_with(prefix))
    {
        let _ = virsh(vm, &["destroy", name]);
        let _ = virsh(vm, &["undefine", name]);
    }
}

fn define(vm: &mut Vm, spec: &DomainSpec) {
    let f = format!("/var/tmp/{}.xml", spec.name);
    std::fs::write(&f, spec.xml()).expect("xml");
    virsh_ok(vm, &["define", &f]);
}

/// The container's init (the controller's child that is PID 1 of its PID namespace).
fn init_of(vm: &mut Vm, name: &str) -> i32 {
    let xml = virsh_ok(vm, &["dumpxml", name]);
    let dom = gpuhook::request::metadata::parse_domain(xml.as_bytes()).expect("domain xml");
    let ct = gpuhook::enter::container::find(&dom.name, dom.id)
        .unwrap_or_else(|e| panic!("container of {name}: {e}"));
    vm.note(&format!("{name}: init {}", ct.init.pid));
    ct.init.pid
}

/// `stat` of a node as the container sees it (its mount namespace, as host root).
fn stat_in(vm: &mut Vm, pid: i32, path: &str) -> String {
    vm.sh(&format!(
        "nsenter -t {pid} -m -- stat -c '%F %t:%T' {path} 2>&1"
    ))
    .stdout
    .iter()
    .map(|&b| b as char)
    .collect::<String>()
    .trim()
    .to_string()
}

/// A domain asks for one GPU: it gets it (node in its `/dev`, libvirt's map allows it, the
/// other GPU's number stays denied); a second domain asking for that GPU is refused in one
/// line; `systemctl restart libvirtd` (the hook's `reconnect`) keeps the reservation and the
/// grant; destroy frees.
pub fn domains(vm: &mut Vm) {
    let p = vm.host(FakeHost::blueprint(), |_| {});
    let (n0, n1) = (p.dev.join("nvidia0"), p.dev.join("nvidia1"));
    cleanup(vm, "gh-d");
    define(vm, &DomainSpec::new("gh-d1", &gpus(r#"count="1""#)));
    virsh_ok(vm, &["start", "gh-d1"]);
    let init = init_of(vm, "gh-d1");
    assert_eq!(
        stat_in(vm, init, "/dev/nvidia0"),
        "character special file c3:0"
    );
    assert_eq!(vm.access(init, &[&n0, &n1]), ["open", "denied"]);
    assert_eq!(vm.holders()["gh-d1"], ["0000:07:00.0"]);

    define(
        vm,
        &DomainSpec::new(
            "gh-d2",
            r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"><gpu:device pci="0000:07:00.0"/></gpu:gpus>"#,
        ),
    );
    let o = virsh(vm, &["start", "gh-d2"]);
    assert!(!o.status.success(), "a second domain got a held GPU");
    let e = super::err(&o);
    let ours: Vec<&str> = e.lines().filter(|l| l.contains("gpuhook: ")).collect();
    assert_eq!(ours.len(), 1, "not one gpuhook line: {e}");
    assert!(ours[0].contains("gpuhook: domain 'gh-d2': "), "{e}");
    assert!(
        ours[0].contains("gh-d1"),
        "the refusal does not name the holder: {e}"
    );
    assert!(!vm.holders().contains_key("gh-d2"));

    vm.ok("systemctl restart libvirtd");
    let t = Instant::now();
    while !virsh_ok(vm, &["list", "--name"]).contains("gh-d1") {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "gh-d1 gone after the restart"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(init_of(vm, "gh-d1"), init, "the container was restarted");
    assert_eq!(vm.holders()["gh-d1"], ["0000:07:00.0"]);
    assert_eq!(vm.access(init, &[&n0, &n1]), ["open", "denied"]);
    let l = vm.list();
    let r = &l["reservations"][0];
    assert_eq!(r["phase"], "running", "{l}");

    virsh_ok(vm, &["destroy", "gh-d1"]);
    assert!(vm.holders().is_empty(), "destroy did not free");
    virsh_ok(vm, &["start", "gh-d2"]);
    assert_eq!(vm.holders()["gh-d2"], ["0000:07:00.0"]);
    virsh_ok(vm, &["destroy", "gh-d2"]);
    assert!(vm.holders().is_empty());
    cleanup(vm, "gh-d");
}

/// `gpuhook attach`/`detach` into a running domain: the second GPU's node made and allowed,
/// then taken away; the stop frees both.
pub fn hotplug(vm: &mut Vm) {
    let p = vm.host(FakeHost::blueprint(), |_| {});
    let (n0, n1) = (p.dev.join("nvidia0"), p.dev.join("nvidia1"));
    cleanup(vm, "gh-hp");
    define(vm, &DomainSpec::new("gh-hp1", &gpus(r#"count="1""#)));
    virsh_ok(vm, &["start", "gh-hp1"]);
    let init = init_of(vm, "gh-hp1");
    assert_eq!(vm.access(init, &[&n0, &n1]), ["open", "denied"]);
    let o = vm.gh(&["attach", "gh-hp1", "--device", "0000:08:00.0"]);
    assert!(o.status.success(), "attach: {}", last_line(&o));
    assert_eq!(
        stat_in(vm, init, "/dev/nvidia1"),
        "character special file c3:1"
    );
    assert_eq!(vm.access(init, &[&n0, &n1]), ["open", "open"]);
    assert_eq!(vm.holders()["gh-hp1"], ["0000:07:00.0", "0000:08:00.0"]);
    let o = vm.gh(&["detach", "gh-hp1", "--device", "0000:08:00.0"]);
    assert!(o.status.success(), "detach: {}", last_line(&o));
    assert_eq!(vm.access(init, &[&n0, &n1]), ["open", "denied"]);
    assert!(stat_in(vm, init, "/dev/nvidia1").contains("No such file"));
    assert_eq!(vm.holders()["gh-hp1"], ["0000:07:00.0"]);
    let o = vm.gh(&["attach", "gh-hp1", "--device", "0000:08:00.0"]);
    assert!(o.status.success(), "attach again: {}", last_line(&o));
    virsh_ok(vm, &["destroy", "gh-hp1"]);
    assert!(
        vm.holders().is_empty(),
        "destroy did not free the attached GPU"
    );
    cleanup(vm, "gh-hp");
}
