//! gpuhook's test bed: fake GPU hosts and an isolated real libvirtd, shared by the
//! integration tests, the demo (`gpuhook-testbed demo`) and the benchmarks.

pub mod fakehost;
pub mod health;
pub mod holder;
pub mod libvirtd;

pub use fakehost::{FakeHost, HostPaths};
pub use libvirtd::{shell_in, Daemon, DomainSpec, Hook};
pub mod bpfprog;
pub mod driver;
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
