//! The host itself: what it runs, the packages' lifecycle, the install the other scenarios
//! use, `make demo`'s scenario.

use super::{manifest, Vm};

/// What this host is (logged for the README's table), and that it is the host the suite
/// promises: cgroup v2 alone with its controllers, systemd 257.
pub fn facts(vm: &mut Vm) {
    let fs = vm.ok("stat -fc %T /sys/fs/cgroup");
    assert_eq!(fs.trim(), "cgroup2fs", "not a cgroup v2 host");
    let ctl = vm.ok("cat /sys/fs/cgroup/cgroup.controllers");
    for c in ["cpu", "memory", "pids"] {
        assert!(ctl.split_whitespace().any(|x| x == c), "no {c}: {ctl}");
    }
    let v = vm.ok(
        "uname -r; systemctl --version | head -n1; libvirtd --version; podman --version; \
         crun --version | head -n1; runc --version | head -n1; containerd --version; \
         dpkg-query -W libvirt-daemon podman crun runc containerd systemd",
    );
    assert!(v.contains("systemd 257"), "{v}");
    std::fs::write("/job/results/host-facts.txt", v).expect("facts");
}

fn packages(vm: &mut Vm, kind: &str) {
    let script = manifest("scripts/vm/packages.sh");
    let o = vm.cmd(std::process::Command::new("sh").arg(script).args([
        kind,
        "/job/pkgs",
        "/job/bin/gpuhook-testbed",
    ]));
    assert!(
        o.status.success(),
        "scripts/vm/packages.sh {kind}: {}",
        super::last_line(&o)
    );
}

/// The .deb: install, upgrade keeping config and live reservations, remove, purge, beside a
/// foreign hook (scripts/vm/packages.sh).
pub fn deb_lifecycle(vm: &mut Vm) {
    packages(vm, "deb");
}

/// The .rpm with rpm itself (scripts/vm/packages.sh).
pub fn rpm_lifecycle(vm: &mut Vm) {
    packages(vm, "rpm");
}

/// The .deb installed with apt for the scenarios that follow; libvirtd running with its LXC
/// and QEMU hooks.
pub fn install(vm: &mut Vm) {
    vm.ok("DEBIAN_FRONTEND=noninteractive apt-get install -y -q /job/pkgs/gpuhook-1.deb");
    for h in ["lxc", "qemu"] {
        assert_eq!(
            vm.ok(&format!("readlink /etc/libvirt/hooks/{h}")).trim(),
            "/usr/bin/gpuhook"
        );
    }
    assert_eq!(vm.ok("readlink /usr/bin/gpuhook-runtime").trim(), "gpuhook");
    vm.ok("systemctl restart libvirtd && systemctl is-active libvirtd");
    vm.ok("systemctl is-enabled gpuhook-reconcile.timer");
}

/// `make demo`'s scenario with the installed hook: a private libvirtd, the blueprint's
/// flavor, two GPUs at start, free at stop.
pub fn demo(vm: &mut Vm) {
    let out = vm.ok(
        "/job/bin/gpuhook-testbed demo --hook /usr/bin/gpuhook --workdir /var/tmp/gpuhook-demo 2>&1",
    );
    assert!(out.contains("== done"), "{out}");
    assert!(out.contains("gpuhook-demo (running)"), "{out}");
}

/// Kubernetes' path on containerd 1.7: the test bed's CRI client against a private containerd
/// with the installed package's snippet and RuntimeClass (`gpuhook-testbed cri scenarios`,
/// the scenarios of tests/cri.rs).
pub fn cri(vm: &mut Vm) {
    let out = vm.ok("/job/bin/gpuhook-testbed cri scenarios 2>&1");
    let last = out.lines().rfind(|l| l.contains("passed")).unwrap_or("");
    assert!(last.contains(" 0 failed"), "{out}");
    assert!(!last.starts_with("0 passed"), "{out}");
}
