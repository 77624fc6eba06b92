//! A VM's life under the QEMU hook: without GPUs it is never touched (start, stop, save and
//! restore, libvirtd restarts, death while libvirtd is down); with a GPU hostdev whose start
//! libvirt fails after `prepare`, nothing stays reserved; GPU metadata in a VM is refused.

use super::{common, gpuhook_line, holders_of, hostdev, lxc_pinned, Bed};
use serde_json::Value;
use std::time::Duration;
use testbed::watch::Opens;
use testbed::FakeHost;

/// The pool's directory, watched: a VM without GPU hostdevs must not open, read or write
/// anything in it (no state lock, no state read), even while another holder's state is there.
fn watch_pool(b: &Bed) -> Opens {
    let dir = b.state().parent().expect("state dir").to_path_buf();
    std::fs::create_dir_all(&dir).expect("state dir");
    Opens::watch(&dir).expect("inotify")
}

/// A VM without a GPU hostdev starts and stops with gpuhook as its hook, its calls in
/// libvirt's order: its start never opens the pool's files, its stop only reads the state
/// (no lock, no write), the other holder's GPU untouched; with a broken config it still
/// starts and stops.
pub fn plain_vm_untouched(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    b.define_lxc(&lxc_pinned("gh-lx", &["0000:07:00.0"]));
    b.start_lxc("gh-lx").expect("gh-lx");
    let before = std::fs::read(b.state()).expect("the LXC domain's state");
    let pool = watch_pool(b);
    b.define_vm(&b.vm("gh-plain"));
    let t = std::time::Instant::now();
    b.start_vm("gh-plain")
        .expect("a VM without GPUs starts under gpuhook's hook");
    let started = t.elapsed();
    assert_eq!(b.vm_state("gh-plain"), "running");
    let at_start = pool.seen();
    let t = std::time::Instant::now();
    b.d.virsh_qemu_ok(&["destroy", "gh-plain"]).unwrap();
    println!(
        "  virsh start {:.2}s, destroy {:.2}s",
        started.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
    let at_stop = pool.seen();
    assert_eq!(
        b.calls_of("gh-plain"),
        [
            "prepare begin -",
            "start begin -",
            "started begin -",
            "stopped end -",
            "release end -"
        ]
    );
    assert!(
        at_start.is_empty(),
        "the hook touched the pool's files at a start without GPUs: {at_start:?}"
    );
    // At its stop the hook looks once, without the lock, whether the state names the VM (a
    // GPU it held may have been hot-unplugged from its XML): reads of the state file, never
    // its lock, never a write.
    let reads_only = |seen: &[String]| {
        seen.iter().all(|e| {
            e.ends_with(" state.json") && (e.contains("IN_OPEN") || e.contains("IN_ACCESS"))
        })
    };
    assert!(
        reads_only(&at_stop),
        "the hook locked or wrote the pool at a stop without GPUs: {at_stop:?}"
    );
    assert_eq!(std::fs::read(b.state()).unwrap(), before);
    let h = b.holders();
    assert_eq!(
        h.get("gh-lx"),
        Some(&("libvirt".to_string(), vec!["0000:07:00.0".to_string()])),
        "{h:?}"
    );
    assert_eq!(h.len(), 1, "{h:?}");

    // (`list` above read the state: not the hook's doing.)
    let _ = pool.seen();
    // A broken config: a VM without GPUs still starts and stops.
    std::fs::write(b.config(), "{ \"sysfs\": ").unwrap();
    b.start_vm("gh-plain")
        .expect("a VM without GPUs starts with a broken config");
    b.d.virsh_qemu_ok(&["destroy", "gh-plain"]).unwrap();
    assert!(reads_only(&pool.seen()));
    assert_eq!(std::fs::read(b.state()).unwrap(), before);
}

/// `virsh save` and `virsh restore` of a VM without GPUs: libvirt reads the hook's output at
/// `restore` as a new domain XML, so a hook that printed anything there would fail the
/// restore; it runs, and the pool is never touched.
pub fn plain_vm_save_restore(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    let pool = watch_pool(b);
    b.define_vm(&b.vm("gh-sr"));
    b.start_vm("gh-sr").expect("start");
    let saved = b.work.join("gh-sr.save");
    let _ = std::fs::remove_file(&saved);
    b.d.virsh_qemu_ok(&["save", "gh-sr", saved.to_str().unwrap()])
        .expect("save");
    assert_eq!(b.vm_state("gh-sr"), "shut off");
    b.reset_probe();
    b.d.virsh_qemu_ok(&["restore", saved.to_str().unwrap()])
        .expect("restore: the hook printed nothing at `restore`");
    assert_eq!(b.vm_state("gh-sr"), "running");
    let calls = b.calls_of("gh-sr");
    assert_eq!(
        calls.first().map(String::as_str),
        Some("restore begin -"),
        "{calls:?}"
    );
    assert!(calls.contains(&"started begin -".to_string()), "{calls:?}");
    b.d.virsh_qemu_ok(&["destroy", "gh-sr"]).unwrap();
    assert!(pool.seen().is_empty());
    let _ = std::fs::remove_file(&saved);
}

/// libvirtd restarts while a VM without GPUs runs: `reconnect` keeps it (a failing hook there
/// would have libvirt kill it), its QEMU the same process, the pool untouched. Then its QEMU
/// dies while libvirtd is down: the next daemon finds it gone.
pub fn plain_vm_reconnect_and_stale(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    let pool = watch_pool(b);
    b.define_vm(&b.vm("gh-rc"));
    b.start_vm("gh-rc").expect("start");
    let pid = b.qemu_pid("gh-rc");
    b.reset_probe();
    let t = std::time::Instant::now();
    b.d.restart().expect("libvirtd restart");
    println!("  libvirtd restarted in {:.1}s", t.elapsed().as_secs_f64());
    assert!(
        b.wait(20, || b
            .calls_of("gh-rc")
            .contains(&"reconnect begin -".to_string())),
        "no reconnect call: {:?}",
        b.calls()
    );
    assert_eq!(b.vm_state("gh-rc"), "running");
    assert_eq!(b.qemu_pid("gh-rc"), pid, "the VM was restarted");
    assert_eq!(b.calls_of("gh-rc"), ["reconnect begin -"]);

    // Killed while libvirtd is down.
    b.d.stop().unwrap();
    b.reset_probe();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill QEMU");
    common::wait_gone(pid, Duration::from_secs(10));
    b.d.start().unwrap();
    assert!(
        b.wait(30, || b.vm_state("gh-rc") == "shut off"),
        "libvirt still thinks gh-rc runs"
    );
    println!(
        "  after a death while libvirtd was down: {:?}",
        b.calls_of("gh-rc")
    );
    assert!(pool.seen().is_empty(), "{:?}", pool.seen());
}

/// A VM with a hostdev naming a GPU: `prepare` reserves it (the probe's snapshot, taken
/// after gpuhook's hook ran), libvirt then fails the start (this host has no IOMMU) and runs
/// `stopped` and `release`, which free it: nothing is left reserved, and an LXC domain gets
/// that GPU next.
pub fn failed_start_after_prepare_frees(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    for op in ["prepare", "release"] {
        std::fs::write(b.probe().join(format!("snap-{op}")), "").unwrap();
    }
    b.define_vm(&b.vm("gh-pt").with(hostdev("0000:07:00.0")));
    let e = b
        .start_vm("gh-pt")
        .expect_err("no passthrough on this host");
    assert!(
        e.contains("host doesn't support passthrough of host PCI devices"),
        "not libvirt's own failure after prepare: {e}"
    );
    assert!(!e.contains("gpuhook: "), "{e}");
    assert_eq!(
        b.calls_of("gh-pt"),
        ["prepare begin -", "stopped end -", "release end -"]
    );
    let at = |op: &str| -> Value {
        let f = b.probe().join(format!("list-gh-pt-{op}.json"));
        let t = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        serde_json::from_str(&t).unwrap_or_else(|e| panic!("{}: {e}: {t}", f.display()))
    };
    let h = holders_of(&at("prepare"));
    assert_eq!(
        h.get("gh-pt"),
        Some(&("vm".to_string(), vec!["0000:07:00.0".to_string()])),
        "prepare did not reserve the VM's GPU: {h:?}"
    );
    assert!(holders_of(&at("release")).is_empty());
    let l = b.list();
    assert!(holders_of(&l).is_empty(), "{l}");
    assert_eq!(l["reservations"], serde_json::json!([]), "{l}");
    b.define_lxc(&lxc_pinned("gh-lx", &["0000:07:00.0"]));
    b.start_lxc("gh-lx")
        .expect("the GPU is free again after the failed VM start");
}

/// GPUs asked for in a VM's metadata (the LXC door's way) cannot be honoured (the hook
/// cannot add hostdevs): the start fails in one line naming the VM and the command that
/// writes hostdevs, and nothing is reserved.
pub fn gpu_metadata_in_a_vm_refused(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    let mut vm = b.vm("gh-meta");
    vm.metadata = r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1" count="1"/>"#.into();
    b.define_vm(&vm);
    let e = b.start_vm("gh-meta").expect_err("GPU metadata in a VM");
    let line = gpuhook_line(&e);
    assert!(line.contains("'gh-meta'"), "{line}");
    assert!(line.contains("gpuhook-libvirt request"), "{line}");
    assert!(b.holders().is_empty());
}
