//! gpuhook's test bed: fake GPU hosts, an isolated real libvirtd (LXC and QEMU drivers) and
//! minimal VMs for it, shared by the integration tests, the demo (`gpuhook-testbed demo`) and
//! the benchmarks.

pub mod fakehost;
pub mod health;
pub mod holder;
pub mod image;
pub mod libvirtd;
pub mod vm;
pub mod watch;

pub use fakehost::{FakeHost, HostPaths};
pub use libvirtd::{shell_in, Daemon, DomainSpec, Hook};
pub use vm::{Hostdev, VmSpec};
pub mod bpfprog;
pub mod cri;
pub mod driver;
pub mod kubelet;
pub mod probe;

/// Where tests put the temporary trees gpuhook must trust as root's (CDI spec directories:
/// one with a parent that group or others may write, as the sticky `/tmp` and `/var/tmp`,
/// is refused): `/var/lib/gpuhook-tests`, root's, mode 0755, made when missing.
pub fn trusted_tmp() -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = std::path::PathBuf::from("/var/lib/gpuhook-tests");
    std::fs::create_dir_all(&d).expect("/var/lib/gpuhook-tests (run the tests as root)");
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))
        .expect("chmod /var/lib/gpuhook-tests");
    d
}

/// A fake host profile by name, optionally `+M` (M other PCI functions beside the GPUs) and
/// `-mig7` (7 MIG instances per GPU): blueprint, dgx8, dgx8-mig, mixed, mi300, wideN.
pub fn profile(name: &str) -> Option<FakeHost> {
    if let Some((base, other)) = name.split_once('+') {
        return Some(profile(base)?.with_other_functions(other.parse().ok()?));
    }
    if let Some(base) = name.strip_suffix("-mig7") {
        return Some(profile(base)?.all_mig7());
    }
    Some(match name {
        "blueprint" => FakeHost::blueprint(),
        "dgx8" => FakeHost::dgx8(),
        "mixed" => FakeHost::mixed(),
        "mi300" => FakeHost::mi300(),
        "dgx8-mig" => FakeHost::dgx8_mig(),
        w if w.starts_with("wide") => FakeHost::wide(w[4..].parse().ok()?),
        _ => return None,
    })
}
