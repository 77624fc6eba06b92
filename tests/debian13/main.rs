//! gpuhook on a real Debian 13 host: trixie's kernel 6.12 and systemd 257 booted under qemu
//! (software emulation) from an image built from Debian's archive
//! (`scripts/debian13-image.sh`, cached by its stamp), cgroup v2 only with every controller,
//! libvirt 11, podman 5, crun 1.2x, runc 1.1.15, containerd 1.7; gpuhook installed in it from
//! its own `.deb` with apt.
//!
//! One binary, two sides. On the host (`cargo test --test debian13`, after
//! `packaging/build.sh`) it builds or reuses the image, writes a job disk (the packages, this
//! very binary, the repository files the scenarios read), boots the VM once, and reads the
//! results back from its second serial port: one `GPUHOOK-VM: RESULT` line per scenario and
//! a closing `GPUHOOK-VM: DONE`; each scenario's log comes back from the job disk. In the VM
//! (`--inside`, started by the image's `gpuhook-vm.service`) it runs the scenarios.
//!
//! The suite fails when the image cannot be built, the VM never reaches a scenario, or any
//! scenario fails. Arguments filter scenarios by substring (the package steps always run:
//! the others use the installed package). Root only.

#[path = "../common/mod.rs"]
mod common;
mod inside;
mod vm;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filters: Vec<String> = args
        .iter()
        .filter(|a| !a.starts_with('-'))
        .cloned()
        .collect();
    if args.iter().any(|a| a == "--inside") {
        inside::main(&filters)
    } else if args.iter().any(|a| a == "--list") {
        for s in inside::SCENARIOS {
            println!("{}: test", s.name);
        }
    } else {
        vm::main(&filters)
    }
}
