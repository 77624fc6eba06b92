//! gpuhook's test bed: fake GPU hosts and an isolated real libvirtd, shared by the
//! integration tests, the demo (`gpuhook-testbed demo`) and the benchmarks.

pub mod fakehost;
pub mod libvirtd;

pub use fakehost::{FakeHost, HostPaths};
pub use libvirtd::{shell_in, Daemon, DomainSpec, Hook};
pub mod bpfprog;
pub mod driver;
pub mod probe;
