//! One pool, three doors: a VM's GPU hostdev against an LXC domain of the same daemon and a
//! podman container (gpuhook-runtime), both ways; `gpuhook-libvirt request` writing a VM's
//! hostdevs from what is free.

use super::{common, gpuhook_line, holders_of, hostdev, lxc_pinned, Bed};
use std::path::PathBuf;
use std::process::{Command, Output};
use testbed::{DomainSpec, FakeHost};

const OCI: &str = "gh-qemu-oci";

/// A podman container through gpuhook-runtime (the bed's config) asking for `gpus`; runs
/// `sleep 60` detached when `detach`. Its output.
fn podman(b: &Bed, gpus: &str, detach: bool) -> Output {
    let dir = b.work.join("oci");
    let rootfs = dir.join("rootfs");
    if !rootfs.join("bin/sh").exists() {
        for d in ["bin", "dev", "proc", "sys", "tmp", "etc", "run"] {
            std::fs::create_dir_all(rootfs.join(d)).unwrap();
        }
        std::fs::copy("/usr/bin/busybox", rootfs.join("bin/busybox")).expect("busybox-static");
        for a in ["sh", "sleep", "true"] {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(a)).unwrap();
        }
        let link = dir.join("gpuhook-runtime");
        std::os::unix::fs::symlink(common::bin(), &link).unwrap();
        std::fs::write(
            dir.join("runtime.sh"),
            format!(
                "#!/bin/sh\nGPUHOOK_CONFIG={} exec {} \"$@\"\n",
                b.config().display(),
                link.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(
            dir.join("runtime.sh"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
    }
    let _ = Command::new("podman")
        .args(["rm", "-f", "-t", "0", OCI])
        .output();
    let mut c = Command::new("podman");
    c.arg("--runtime")
        .arg(dir.join("runtime.sh"))
        .args(["run", "--network", "none", "--ulimit", "nofile=1024:1024"])
        .args(["--ulimit", "nproc=1024:1024", "--name", OCI])
        .args(["--annotation", &format!("gpuhook.io/gpus={gpus}")]);
    if detach {
        c.arg("-d");
    } else {
        c.arg("--rm");
    }
    c.arg("--rootfs")
        .arg(&rootfs)
        .args(["sh", "-c", if detach { "sleep 60" } else { "true" }]);
    c.output().expect("podman")
}

fn runc_host(b: &mut Bed) {
    b.use_host_with(FakeHost::blueprint(), |c| {
        c["oci_runtime"] = serde_json::json!("/usr/sbin/runc")
    });
}

/// A VM whose hostdev is a GPU an LXC domain holds is refused at `prepare` in gpuhook's one
/// line (in `virsh start`'s error) naming the VM, the GPU and its holder; libvirt's
/// `release` after the refusal frees nothing of the holder's.
pub fn vm_refused_gpu_of_lxc(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    std::fs::write(b.probe().join("snap-release"), "").unwrap();
    b.define_lxc(&lxc_pinned("gh-lx", &["0000:07:00.0"]));
    b.start_lxc("gh-lx").expect("gh-lx");
    b.define_vm(&b.vm("gh-v").with(hostdev("0000:07:00.0")));
    let e = b.start_vm("gh-v").expect_err("a held GPU");
    assert!(e.contains("Hook script execution failed"), "{e}");
    assert!(
        e.contains("/etc/libvirt/hooks/qemu gh-v prepare begin -"),
        "{e}"
    );
    let line = gpuhook_line(&e);
    for w in ["'gh-v'", "0000:07:00.0", "'gh-lx'"] {
        assert!(line.contains(w), "the refusal does not name {w}: {line}");
    }
    assert_eq!(
        b.calls_of("gh-v"),
        ["prepare begin -", "stopped end -", "release end -"]
    );
    let f = b.probe().join("list-gh-v-release.json");
    let at_release: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&f).expect("snapshot")).expect("json");
    let want = Some(("libvirt".to_string(), vec!["0000:07:00.0".to_string()]));
    assert_eq!(holders_of(&at_release).get("gh-lx").cloned(), want);
    let h = b.holders();
    assert_eq!(h.get("gh-lx").cloned(), want, "{h:?}");
    assert_eq!(h.len(), 1, "{h:?}");
}

/// A VM whose hostdev is a GPU a podman container holds is refused naming the container;
/// once the container is gone gpuhook lets the VM's start through (libvirt then fails it
/// here, after `prepare`), and nothing stays reserved.
pub fn vm_refused_gpu_of_container(b: &mut Bed) {
    runc_host(b);
    let o = podman(b, "2", true);
    assert!(o.status.success(), "podman: {}", common::stderr(&o));
    let id = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert_eq!(b.holders().get(&id).map(|h| h.1.len()), Some(2));
    b.define_vm(&b.vm("gh-v").with(hostdev("0000:08:00.0")));
    let e = b.start_vm("gh-v").expect_err("a held GPU");
    let line = gpuhook_line(&e);
    for w in ["'gh-v'", "0000:08:00.0", &id] {
        assert!(line.contains(w), "the refusal does not name {w}: {line}");
    }
    assert_eq!(b.holders().get(&id).map(|h| h.1.len()), Some(2));
    let _ = Command::new("podman")
        .args(["rm", "-f", "-t", "0", &id])
        .output();
    assert!(b.holders().is_empty());
    let e = b.start_vm("gh-v").expect_err("no passthrough on this host");
    assert!(
        e.contains("host doesn't support passthrough"),
        "gpuhook refused a free GPU: {e}"
    );
    assert!(b.holders().is_empty());
}

/// While a VM holds a GPU (its start held by the probe after gpuhook's `prepare`), an LXC
/// domain pinned to it and a container asking for every GPU are refused naming the VM, and
/// another domain gets the other GPU; once the VM's start ends (libvirt fails it here),
/// the GPU is the LXC domain's.
pub fn lxc_refused_gpu_of_vm(b: &mut Bed) {
    runc_host(b);
    let hold = b.probe().join("hold-gh-v-prepare");
    std::fs::write(&hold, "").unwrap();
    b.define_vm(&b.vm("gh-v").with(hostdev("0000:07:00.0")));
    let uri = b.d.qemu_uri.clone();
    let starting = std::thread::spawn(move || {
        Command::new("virsh")
            .args(["-q", "-c", &uri, "start", "gh-v"])
            .env("LC_ALL", "C")
            .output()
            .expect("virsh")
    });
    let held = b.probe().join("held-gh-v-prepare");
    let reached = b.wait(30, || held.exists());
    let checks = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert!(reached, "the VM's start never reached prepare");
        let h = b.holders();
        assert_eq!(
            h.get("gh-v"),
            Some(&("vm".to_string(), vec!["0000:07:00.0".to_string()])),
            "{h:?}"
        );
        b.define_lxc(&lxc_pinned("gh-lx", &["0000:07:00.0"]));
        let e = b.start_lxc("gh-lx").expect_err("the VM's GPU");
        let line = gpuhook_line(&e);
        for w in ["'gh-lx'", "0000:07:00.0", "gh-v"] {
            assert!(line.contains(w), "the refusal does not name {w}: {line}");
        }
        let o = podman(b, "2", false);
        assert!(!o.status.success(), "a container got the VM's GPU");
        let e = common::stderr(&o);
        assert!(e.contains("gh-v"), "the refusal does not name the VM: {e}");
        b.define_lxc(&DomainSpec::new(
            "gh-lx2",
            r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1" count="1"/>"#,
        ));
        b.start_lxc("gh-lx2").expect("the other GPU is free");
        assert_eq!(
            b.holders().get("gh-lx2").map(|h| h.1.clone()),
            Some(vec!["0000:08:00.0".to_string()])
        );
        b.d.virsh_ok(&["destroy", "gh-lx2"]).unwrap();
    }));
    let _ = std::fs::remove_file(&hold);
    let o = starting.join().expect("virsh start");
    if let Err(p) = checks {
        std::panic::resume_unwind(p);
    }
    let e = common::stderr(&o);
    assert!(
        e.contains("host doesn't support passthrough"),
        "the held start did not end in libvirt's own failure: {e}"
    );
    assert!(b.holders().is_empty(), "{:?}", b.holders());
    b.start_lxc("gh-lx").expect("the GPU is free after the VM");
}

fn libvirt_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("GPUHOOK_TEST_LIBVIRT_BIN") {
        return p.into();
    }
    let p = common::bin().with_file_name("gpuhook-libvirt");
    assert!(
        p.exists(),
        "{} is missing: cargo build -p gpuhook-libvirt (cargo test --workspace builds it)",
        p.display()
    );
    p
}

/// `gpuhook-libvirt request VM --count 1` on the QEMU driver writes the free GPU (not the
/// one an LXC domain holds) as a managed PCI hostdev into the VM's persistent definition,
/// reserving nothing until `prepare` does; `--clear` takes it out again.
pub fn request_writes_hostdevs(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    std::fs::write(b.probe().join("snap-prepare"), "").unwrap();
    b.define_lxc(&lxc_pinned("gh-lx", &["0000:07:00.0"]));
    b.start_lxc("gh-lx").expect("gh-lx");
    b.define_vm(&b.vm("gh-req"));
    let glv = |args: &[&str]| -> Output {
        Command::new(libvirt_bin())
            .arg("-c")
            .arg(&b.d.qemu_uri)
            .arg("--config")
            .arg(b.config())
            .args(args)
            .output()
            .expect("gpuhook-libvirt")
    };
    let o = glv(&["request", "gh-req", "--count", "1"]);
    assert!(o.status.success(), "request: {}", common::stderr(&o));
    let xml =
        b.d.virsh_qemu_ok(&["dumpxml", "--inactive", "gh-req"])
            .unwrap();
    let hostdevs: Vec<&str> = xml.lines().filter(|l| l.contains("<hostdev")).collect();
    assert_eq!(hostdevs.len(), 1, "{xml}");
    assert!(hostdevs[0].contains("managed='yes'"), "{xml}");
    assert!(
        xml.contains("bus='0x08' slot='0x00' function='0x0'"),
        "{xml}"
    );
    assert_eq!(b.holders().len(), 1, "request reserved: {:?}", b.holders());
    let e = b
        .start_vm("gh-req")
        .expect_err("no passthrough on this host");
    assert!(e.contains("host doesn't support passthrough"), "{e}");
    let f = b.probe().join("list-gh-req-prepare.json");
    let at: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&f).expect("snapshot")).expect("json");
    assert_eq!(
        holders_of(&at).get("gh-req"),
        Some(&("vm".to_string(), vec!["0000:08:00.0".to_string()]))
    );
    let o = glv(&["request", "gh-req", "--clear"]);
    assert!(
        o.status.success(),
        "request --clear: {}",
        common::stderr(&o)
    );
    let xml =
        b.d.virsh_qemu_ok(&["dumpxml", "--inactive", "gh-req"])
            .unwrap();
    assert!(!xml.contains("<hostdev"), "{xml}");
}

/// The first VM's start held after gpuhook's `prepare` (the probe) while `check` runs; the
/// start's `virsh` output once let go.
fn while_preparing(b: &Bed, name: &str, check: impl FnOnce()) -> Output {
    let hold = b.probe().join(format!("hold-{name}-prepare"));
    std::fs::write(&hold, "").unwrap();
    let uri = b.d.qemu_uri.clone();
    let n = name.to_string();
    let starting = std::thread::spawn(move || {
        Command::new("virsh")
            .args(["-q", "-c", &uri, "start", &n])
            .env("LC_ALL", "C")
            .output()
            .expect("virsh")
    });
    let held = b.probe().join(format!("held-{name}-prepare"));
    let reached = b.wait(30, || held.exists());
    let checks = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert!(reached, "{name}'s start never reached prepare");
        check()
    }));
    let _ = std::fs::remove_file(&hold);
    let o = starting.join().expect("virsh start");
    if let Err(p) = checks {
        std::panic::resume_unwind(p);
    }
    o
}

const MDEV1: &str = "4b20d080-1b54-4048-85b3-a6a62d165c01";
const MDEV2: &str = "4b20d080-1b54-4048-85b3-a6a62d165c02";

/// vGPUs: two VMs with mediated devices of one GPU share it (the second's `prepare` sees
/// the first's), while an LXC domain pinned to that GPU and a VM passing the whole GPU
/// through are refused naming the mdev VM; the other GPU stays free; the failed starts
/// (libvirt then finds no mediated device on this host) free everything.
pub fn mdev_vms_share_a_gpu(b: &mut Bed) {
    b.use_host(
        FakeHost::blueprint()
            .with_mdev("0000:07:00.0", MDEV1)
            .with_mdev("0000:07:00.0", MDEV2),
    );
    std::fs::write(b.probe().join("snap-prepare"), "").unwrap();
    b.define_vm(
        &b.vm("gh-m1")
            .with(testbed::Hostdev::Mdev { uuid: MDEV1.into() }),
    );
    b.define_vm(
        &b.vm("gh-m2")
            .with(testbed::Hostdev::Mdev { uuid: MDEV2.into() }),
    );
    b.define_vm(&b.vm("gh-whole").with(hostdev("0000:07:00.0")));
    b.define_lxc(&lxc_pinned("gh-lx", &["0000:07:00.0"]));
    let o = while_preparing(b, "gh-m1", || {
        let l = b.list();
        let g = &l["gpus"][0];
        assert_eq!(g["pci"], "0000:07:00.0", "{l}");
        assert_eq!(g["sharing"]["mode"], "mdev", "{l}");
        let e = b
            .start_vm("gh-m2")
            .expect_err("no mediated devices on this host");
        println!("  gh-m2's start: {}", e.lines().last().unwrap_or(""));
        let f = b.probe().join("list-gh-m2-prepare.json");
        let at: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&f).expect("snapshot")).expect("json");
        let sharers: Vec<&str> = at["gpus"][0]["sharing"]["holders"]
            .as_array()
            .unwrap_or_else(|| panic!("no sharers at gh-m2's prepare: {at}"))
            .iter()
            .filter_map(|h| h["domain"].as_str())
            .collect();
        assert_eq!(sharers, ["gh-m1", "gh-m2"], "{at}");
        let e = b.start_lxc("gh-lx").expect_err("a GPU VMs share by mdev");
        let line = gpuhook_line(&e);
        assert!(line.contains("gh-m1"), "{line}");
        let e = b.start_vm("gh-whole").expect_err("a GPU VMs share by mdev");
        let line = gpuhook_line(&e);
        assert!(
            line.contains("gh-m1") && line.contains("'gh-whole'"),
            "{line}"
        );
        let h = b.holders();
        assert!(
            !h.contains_key("gh-whole") && !h.contains_key("gh-lx"),
            "{h:?}"
        );
    });
    println!(
        "  gh-m1's start: {}",
        common::stderr(&o).lines().last().unwrap_or("")
    );
    assert!(
        !o.status.success(),
        "an mdev VM started on a host without mdevs"
    );
    let l = b.list();
    assert!(
        l["gpus"][0]["sharing"].is_null()
            || l["gpus"][0]["sharing"]["holders"] == serde_json::json!([]),
        "{l}"
    );
    assert!(holders_of(&l).is_empty(), "{l}");
    b.start_lxc("gh-lx")
        .expect("the GPU is free after the mdev VMs");
}
