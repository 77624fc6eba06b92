//! `driver="host"` under a real libvirtd: LXC domains with their own root get the running
//! driver's user space, found on the fake host at `started` (mounted into the running
//! container, links and linker cache made there); one keeps its files across a driver
//! upgrade and is listed as outdated, and its next start gets the new driver; the refusals
//! and a hostile root; `attach --driver host` and `detach`.

use super::{host_mounts_under, with_rootfs, Bed};
use crate::common::{self, assert_host_probe, host_probe, set_module, HOST_V, HOST_V2};
use serde_json::{json, Value};
use std::path::PathBuf;
use testbed::{DomainSpec, FakeHost};

/// An older driver whose files an upgrade left on the host.
const OLD: &str = "535.129.03";

/// A blueprint host whose driver (at its own root, the config's `root`) was upgraded from
/// `OLD` to `HOST_V`, module loaded; a fresh root filesystem `rootfs` for containers.
fn upgraded_host(
    b: &mut Bed,
    rootfs: &str,
) -> (testbed::driver::FakeDriver, PathBuf, testbed::HostPaths) {
    let old = common::host_driver_root(&b.work.join(format!("driver{}", b.hosts + 1)), OLD);
    let d = testbed::driver::FakeDriver::install_host(&old.root, HOST_V).unwrap();
    let p = b.use_host_with(FakeHost::blueprint(), |c| c["root"] = json!(d.root));
    set_module(&p.proc, Some(HOST_V), false);
    let dir = b.work.join(rootfs);
    let _ = std::fs::remove_dir_all(&dir);
    (d, testbed::driver::rootfs(&dir).expect("rootfs"), p)
}

fn reservation(b: &Bed, name: &str) -> Value {
    b.reservation(name)
        .unwrap_or_else(|| panic!("no reservation of {name}"))
}

/// A domain with its own root asks `driver="host"`: at `started` it gets the running driver's
/// files and nothing of the older one left on the host; `reconnect` finds them in place. The
/// driver is upgraded while it runs: nothing is taken from it, `list` and the metrics say
/// it runs on the old one; its next start gets the new driver (the old one's link in its
/// root replaced) and is up to date.
pub fn host_driver_own_rootfs_across_an_upgrade(b: &mut Bed) {
    let (d, rootfs, p) = upgraded_host(b, "host-rootfs");
    b.define_start(&with_rootfs("gh-host", r#"driver="host""#, &rootfs, false));
    let ct = b.ct("gh-host");
    let o = b.sh_in(&ct, &host_probe(HOST_V));
    assert_host_probe(&String::from_utf8_lossy(&o.stdout), HOST_V);
    assert!(host_mounts_under(&rootfs).is_empty());
    let r = reservation(b, "gh-host");
    assert_eq!(r["driver"], "host");
    assert_eq!(r["driver_version"], HOST_V);
    assert_eq!(r["driver_outdated"], false);
    common::assert_ok(&b.hook_direct("gh-host", "reconnect"));
    // The upgrade.
    testbed::driver::FakeDriver::install_host(&d.root, HOST_V2).unwrap();
    set_module(&p.proc, Some(HOST_V2), false);
    let r = reservation(b, "gh-host");
    assert_eq!(r["driver_version"], HOST_V);
    assert_eq!(r["driver_outdated"], true);
    let t = String::from_utf8_lossy(&b.gh(&["list"]).stdout).into_owned();
    assert!(
        t.contains(&format!(
            "gh-host [driver {HOST_V}, host now {HOST_V2}] (running)"
        )),
        "{t}"
    );
    let m = String::from_utf8_lossy(&b.gh(&["metrics"]).stdout).into_owned();
    let uuid = r["uuid"].as_str().unwrap();
    assert!(
        m.contains(&format!(
            "gpuhook_container_driver_outdated{{kind=\"libvirt\",domain=\"gh-host\",uuid=\"{uuid}\"}} 1\n"
        )),
        "{m}"
    );
    // Nothing taken away: reconnect keeps it, its files are the old driver's.
    common::assert_ok(&b.hook_direct("gh-host", "reconnect"));
    let o = b.sh_in(&ct, &host_probe(HOST_V));
    assert_host_probe(&String::from_utf8_lossy(&o.stdout), HOST_V);
    // Its next start: the new driver, nothing of the old.
    b.d.virsh_ok(&["destroy", "gh-host"]).unwrap();
    assert!(b.wait_shut_off("gh-host"));
    b.start("gh-host").expect("start after the upgrade");
    let ct = b.ct("gh-host");
    let o = b.sh_in(&ct, &host_probe(HOST_V2));
    assert_host_probe(&String::from_utf8_lossy(&o.stdout), HOST_V2);
    let r = reservation(b, "gh-host");
    assert_eq!(r["driver_version"], HOST_V2);
    assert_eq!(r["driver_outdated"], false);
    b.d.virsh_ok(&["destroy", "gh-host"]).unwrap();
    assert!(b.wait_shut_off("gh-host"));
    assert!(b.holders().is_empty());
}

/// Refused at `started` (or `prepare`) in one line, the domain not started, nothing reserved:
/// no module loaded, a library others may write, a root whose `/usr/lib` is a symlink (nothing
/// lands where it leads). A block node planted where ldconfig writes its cache is never
/// written; the container gets a working cache.
pub fn host_driver_refusals_and_hostile_rootfs(b: &mut Bed) {
    let (d, rootfs, p) = upgraded_host(b, "host-refused");
    b.define(&with_rootfs(
        "gh-host-no",
        r#"driver="host""#,
        &rootfs,
        false,
    ));
    set_module(&p.proc, None, false);
    let e = b.start("gh-host-no").unwrap_err();
    assert!(
        e.contains("driver \"host\": no NVIDIA kernel module is loaded ("),
        "{e}"
    );
    assert!(b.wait_shut_off("gh-host-no"));
    assert!(b.holders().is_empty(), "{:?}", b.holders());
    set_module(&p.proc, Some(HOST_V), false);
    let lib = d.root.join(format!(
        "usr/lib/x86_64-linux-gnu/libnvidia-cfg.so.{HOST_V}"
    ));
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o666)).unwrap();
    let e = b.start("gh-host-no").unwrap_err();
    assert!(
        e.contains(&format!(
            "{} has mode 0666: group or others may write it; refusing to give it",
            lib.display()
        )),
        "{e}"
    );
    assert!(b.wait_shut_off("gh-host-no"));
    assert!(b.holders().is_empty(), "{:?}", b.holders());
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o644)).unwrap();
    // A hostile root: /usr/lib a symlink into itself.
    let evil = b.work.join("host-evil");
    let _ = std::fs::remove_dir_all(&evil);
    testbed::driver::rootfs(&evil).unwrap();
    std::fs::create_dir_all(evil.join("elsewhere")).unwrap();
    std::fs::remove_dir_all(evil.join("usr/lib")).unwrap();
    std::os::unix::fs::symlink("/elsewhere", evil.join("usr/lib")).unwrap();
    b.define(&with_rootfs(
        "gh-host-evil",
        r#"driver="host""#,
        &evil,
        false,
    ));
    let e = b.start("gh-host-evil").unwrap_err();
    assert!(
        e.contains("container /usr/lib is a symlink; refusing to follow it"),
        "{e}"
    );
    assert!(b.wait_shut_off("gh-host-evil"));
    assert!(b.holders().is_empty(), "{:?}", b.holders());
    assert!(std::fs::read_dir(evil.join("elsewhere"))
        .unwrap()
        .next()
        .is_none());
    assert!(host_mounts_under(&evil).is_empty());
    // A planted block node where ldconfig writes.
    let lo = common::PlantedLoop::new(&b.work);
    lo.plant(&rootfs.join("etc/ld.so.cache~"));
    b.start("gh-host-no").expect("start with the node planted");
    let ct = b.ct("gh-host-no");
    let o = b.sh_in(&ct, &host_probe(HOST_V));
    assert_host_probe(&String::from_utf8_lossy(&o.stdout), HOST_V);
    assert!(lo.untouched(), "ldconfig wrote through the planted node");
    b.d.virsh_ok(&["destroy", "gh-host-no"]).unwrap();
    assert!(b.wait_shut_off("gh-host-no"));
}

/// The driver's mounts of libcuda of `v` and nvidia-smi in the container.
fn host_driver_mounts(b: &Bed, ct: &gpuhook::enter::container::Container, v: &str) -> Vec<String> {
    let o = b.sh_in(ct, "cat /proc/1/mounts");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains(&format!("libcuda.so.{v} ")) || l.contains("/usr/bin/nvidia-smi "))
        .map(str::to_owned)
        .collect()
}

/// A domain with its own root and no GPU gets one with `attach --driver host`: the running
/// driver's files, links and linker cache in the running container; a second GPU adds its
/// node only; detach of one keeps the files, detach of the last takes them out.
pub fn attach_host_driver_in_a_domain_with_its_own_root(b: &mut Bed) {
    let (_d, rootfs, _) = upgraded_host(b, "host-hp");
    let mut s = DomainSpec::new("gh-hphost", "");
    s.rootfs = Some((rootfs.clone(), false));
    b.define_start(&s);
    let ct = b.ct("gh-hphost");
    assert!(host_driver_mounts(b, &ct, HOST_V).is_empty());
    let attach =
        |dev: &str| b.gh_host_ok(&["attach", "gh-hphost", "--driver", "host", "--device", dev]);
    let out = attach("0000:07:00.0");
    assert!(out.contains("attached 0000:07:00.0"), "{out}");
    let o = b.sh_in(&ct, &host_probe(HOST_V));
    assert_host_probe(&String::from_utf8_lossy(&o.stdout), HOST_V);
    let mounts = host_driver_mounts(b, &ct, HOST_V);
    assert_eq!(mounts.len(), 2, "{mounts:?}");
    assert_eq!(reservation(b, "gh-hphost")["driver_version"], HOST_V);
    attach("0000:08:00.0");
    assert_eq!(b.nodes(&ct)["/dev/nvidia1"], (195, 1));
    assert_eq!(host_driver_mounts(b, &ct, HOST_V), mounts);
    b.gh_host_ok(&["detach", "gh-hphost", "--device", "0000:07:00.0"]);
    assert_eq!(host_driver_mounts(b, &ct, HOST_V), mounts);
    let o = b.sh_in(&ct, "cuda-probe");
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(
        said.contains(&format!("driver version: {HOST_V}")),
        "{said}"
    );
    b.gh_host_ok(&["detach", "gh-hphost", "--device", "0000:08:00.0"]);
    assert!(host_driver_mounts(b, &ct, HOST_V).is_empty());
    let o = b.sh_in(&ct, "ls -l /usr/lib/x86_64-linux-gnu/");
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(!said.contains("libcuda.so.1 ->"), "{said}");
    assert!(reservation(b, "gh-hphost")["driver_version"].is_null());
    assert!(host_mounts_under(&rootfs).is_empty());
    b.d.virsh_ok(&["destroy", "gh-hphost"]).unwrap();
    assert!(b.wait_shut_off("gh-hphost"));
    assert!(b.holders().is_empty(), "{:?}", b.holders());
}

/// Issue 39 under libvirtd: stock `nvidia-persistenced --user nvidia-persistenced` (its
/// directory and socket the account's), a root socket listening beside it. A domain with its
/// own root asking `driver="host"` is refused at its start in one line saying what to set;
/// once `driver_socket_owners` names the account, `started` mounts gpuhook's own link to the
/// socket checked (a path in a directory of root's, beside the state), and inside the
/// container the socket reaches persistenced, not the other.
pub fn host_driver_service_account_socket(b: &mut Bed) {
    let d = common::host_driver_root(&b.work.join(format!("driver{}", b.hosts + 1)), HOST_V);
    common::serve(
        d.persistenced_as("nvidia-persistenced", 999).unwrap(),
        "persistenced",
    );
    common::serve(
        testbed::driver::listen(&d.root.join("run/docker.sock")).unwrap(),
        "docker",
    );
    let p = b.use_host_with(FakeHost::blueprint(), |c| c["root"] = json!(d.root));
    set_module(&p.proc, Some(HOST_V), false);
    let dir = b.work.join("host-socket");
    let _ = std::fs::remove_dir_all(&dir);
    let rootfs = testbed::driver::rootfs(&dir).expect("rootfs");
    common::sock_probe(&rootfs);
    b.define(&with_rootfs(
        "gh-host-sock",
        r#"driver="host""#,
        &rootfs,
        false,
    ));
    let e = b.start("gh-host-sock").unwrap_err();
    let sock = d.root.join("run/nvidia-persistenced/socket");
    assert!(
        e.contains(&format!(
            "gpuhook: domain 'gh-host-sock': driver \"host\": {} is owned by nvidia-persistenced (uid 999), not root: name it in driver_socket_owners to give it",
            sock.display()
        )),
        "{e}"
    );
    assert!(b.wait_shut_off("gh-host-sock"));
    assert!(b.holders().is_empty(), "{:?}", b.holders());
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(b.config()).unwrap()).unwrap();
    cfg["driver_socket_owners"] = json!(["nvidia-persistenced"]);
    b.d.write_config(&cfg).expect("config");
    b.start("gh-host-sock")
        .expect("start with the account named");
    let ct = b.ct("gh-host-sock");
    let o = b.sh_in(
        &ct,
        "sock-probe /run/nvidia-persistenced/socket; grep ' /run/nvidia-persistenced/socket ' /proc/1/mounts",
    );
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("reached persistenced\n"), "{s}");
    assert!(!s.contains("docker"), "{s}");
    assert!(s.contains(" ro,nosuid,nodev,noexec"), "{s}");
    assert!(host_mounts_under(&rootfs).is_empty());
    b.d.virsh_ok(&["destroy", "gh-host-sock"]).unwrap();
    assert!(b.wait_shut_off("gh-host-sock"));
    assert!(b.holders().is_empty());
}
