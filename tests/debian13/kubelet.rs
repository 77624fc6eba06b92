//! Kubernetes' device plugin on containerd 1.7: the test bed's kubelet stand-in against the
//! installed package's device plugin, containerd snippet and RuntimeClass
//! (`gpuhook-testbed kubelet scenarios`, the scenarios of tests/kubelet.rs): registration of
//! every resource, pods with and without the RuntimeClass, health following this host's
//! libvirt LXC domains and podman 5 containers, quarantine, the race for the last GPU,
//! kubelet and plugin restarts, pods deleted before their containers, a corrupt state.

use super::Vm;

pub fn kubelet(vm: &mut Vm) {
    // The race runs 10 rounds here (software emulation is slow), 20 on the host.
    let out = vm.ok("GPUHOOK_KUBELET_RACES=10 /job/bin/gpuhook-testbed kubelet scenarios 2>&1");
    let last = out.lines().rfind(|l| l.contains("passed")).unwrap_or("");
    assert!(last.contains(" 0 failed"), "{out}");
    assert!(!last.starts_with("0 passed"), "{out}");
}
