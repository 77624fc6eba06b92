//! Time-slice sharing (docs/guides/sharing.md) under the real libvirtd: real LXC domains
//! (and a podman container through gpuhook-runtime) holding slots of one fake GPU, real
//! nodes and device-cgroup grants in each, refusals at `virsh start`.

use super::{spec, Bed, META_NS};
use crate::common;
use nix::errno::Errno;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};
use testbed::{DomainSpec, FakeHost};

const SHARED: &str = "0000:07:00.0";

impl Bed {
    /// The blueprint host (GPUs 0000:07:00.0 = nvidia0 and 0000:08:00.0 = nvidia1) with
    /// 0000:07:00.0 shared in `replicas` time slices.
    fn shared_host(&mut self, replicas: u32) {
        self.use_host_with(FakeHost::blueprint(), |c| {
            c["sharing"] = json!({ SHARED: {"replicas": replicas} });
            c["oci_runtime"] = json!("/usr/sbin/runc");
        });
    }

    /// Holder name → slots it holds, per `list --json`'s `sharing` of each GPU.
    fn sharers(&self) -> BTreeMap<String, Vec<String>> {
        let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for g in self.list()["gpus"].as_array().expect("gpus") {
            for s in g["sharing"]["holders"].as_array().into_iter().flatten() {
                m.entry(s["domain"].as_str().expect("domain").into())
                    .or_default()
                    .push(s["slot"].as_str().expect("slot").into());
            }
        }
        m
    }

    /// The slots the state file records, each with its reservation's name.
    fn state_slots(&self) -> Vec<(String, String)> {
        let st: Value =
            serde_json::from_slice(&std::fs::read(self.state()).expect("state")).expect("json");
        let mut v = Vec::new();
        for r in st["reservations"]
            .as_object()
            .map(|o| o.values().cloned().collect::<Vec<_>>())
            .or_else(|| st["reservations"].as_array().cloned())
            .unwrap_or_default()
        {
            for g in r["gpus"].as_array().into_iter().flatten() {
                v.push((
                    r["domain"].as_str().unwrap_or_default().to_owned(),
                    g.as_str().unwrap_or_default().to_owned(),
                ));
            }
        }
        v.sort();
        v
    }

    /// The shared GPU's node is in the container, and its cgroup lets it be opened (ENXIO:
    /// no driver behind the fake node); the other GPU, made inside by root, is refused.
    fn sees_shared_gpu(&self, name: &str) {
        let ct = self.ct(name);
        assert_eq!(
            self.nodes(&ct).get("/dev/nvidia0"),
            Some(&(195, 0)),
            "{name}"
        );
        assert!(
            self.devices_list(&ct).iter().any(|l| l == "c 195:0 rw"),
            "{name}"
        );
        let _ = self.sh_in(&ct, "[ -e /dev/nvidia1 ] || mknod /dev/nvidia1 c 195 1");
        assert_eq!(
            self.open_in(&ct, &["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia1"]),
            vec![Err(Errno::ENXIO), Err(Errno::ENXIO), Err(Errno::EPERM)],
            "{name}: its slot's GPU opens, the other GPU does not"
        );
    }
}

fn slot(n: u32) -> String {
    format!("{SHARED}/slot{n}")
}

/// Two domains share 0000:07:00.0 (2 slots); a third is refused naming both and leaves
/// nothing behind; one destroyed frees its slot, and the third then starts.
pub fn share_two_domains_one_gpu(b: &mut Bed) {
    b.shared_host(2);
    b.define_start(&spec("gh-sh1", r#"share="yes""#));
    b.define_start(&spec("gh-sh2", r#"share="yes""#));
    let want: BTreeMap<String, Vec<String>> = [
        ("gh-sh1".to_string(), vec![slot(0)]),
        ("gh-sh2".to_string(), vec![slot(1)]),
    ]
    .into_iter()
    .collect();
    assert_eq!(b.sharers(), want);
    assert_eq!(
        b.state_slots(),
        [("gh-sh1".into(), slot(0)), ("gh-sh2".into(), slot(1))]
    );
    assert!(b.holders().is_empty(), "nobody holds the GPU whole");
    b.sees_shared_gpu("gh-sh1");
    b.sees_shared_gpu("gh-sh2");
    b.define(&spec("gh-sh3", r#"share="yes""#));
    let e = b.start("gh-sh3").expect_err("a third sharer of 2 slots");
    let line = e
        .lines()
        .find(|l| l.contains("gpuhook: domain 'gh-sh3'"))
        .unwrap_or_else(|| panic!("{e}"));
    assert!(
        line.contains("cannot reserve 1 shared GPU slot: only 0 of the host's 1 matching shared GPU have a free slot: 0000:07:00.0 has 2/2 slots taken by domain 'gh-sh1', domain 'gh-sh2'"),
        "{e}"
    );
    assert_eq!(b.state_of("gh-sh3"), "shut off");
    assert!(b.reservation("gh-sh3").is_none(), "nothing left behind");
    assert_eq!(b.sharers(), want, "the refusal took no one's slot");
    b.d.virsh_ok(&["destroy", "gh-sh1"]).unwrap();
    assert_eq!(
        b.sharers().keys().collect::<Vec<_>>(),
        ["gh-sh2"],
        "destroy frees the slot"
    );
    b.start("gh-sh3").expect("the freed slot");
    assert_eq!(b.sharers()["gh-sh3"], [slot(0)]);
    b.sees_shared_gpu("gh-sh3");
    b.d.virsh_ok(&["destroy", "gh-sh2"]).unwrap();
    b.d.virsh_ok(&["destroy", "gh-sh3"]).unwrap();
    assert!(b.sharers().is_empty() && b.state_slots().is_empty());
}

/// The shared GPU is never given whole (a domain naming it without share='yes' is refused,
/// as is one asking for both GPUs), and a shared request on a host that shares nothing is
/// refused.
pub fn share_refusals(b: &mut Bed) {
    b.shared_host(2);
    b.define_start(&spec("gh-shw", r#"count="1""#));
    assert_eq!(b.holders()["gh-shw"], ["0000:08:00.0"], "the unshared GPU");
    b.define(&DomainSpec::new(
        "gh-shn",
        &format!(r#"<gpu:gpus {META_NS}><gpu:device pci="{SHARED}"/></gpu:gpus>"#),
    ));
    let e = b.start("gh-shn").expect_err("the shared GPU whole");
    assert!(
        e.contains("gpuhook: domain 'gh-shn': ")
            && e.contains(
                "GPU 0000:07:00.0 (pci 0000:07:00.0) is shared (2 slots): ask for a slot (share='yes')"
            ),
        "{e}"
    );
    b.define(&spec("gh-shc", r#"count="1""#));
    let e = b.start("gh-shc").expect_err("no whole GPU is left");
    assert!(
        e.contains("1 shared (handed out as slots: share='yes')"),
        "{e}"
    );
    for n in ["gh-shn", "gh-shc"] {
        assert_eq!(b.state_of(n), "shut off");
        assert!(b.reservation(n).is_none(), "{n}");
    }
    b.d.virsh_ok(&["destroy", "gh-shw"]).unwrap();
    // A host that shares nothing.
    b.use_host(FakeHost::blueprint());
    b.define(&spec("gh-shx", r#"share="yes""#));
    let e = b.start("gh-shx").expect_err("nothing is shared");
    assert!(
        e.contains("gpuhook: domain 'gh-shx': cannot reserve 1 shared GPU slot: only 0 of the host's 0 matching shared GPUs")
            && e.contains("2 matching GPUs are not shared by the host config"),
        "{e}"
    );
    assert!(b.reservation("gh-shx").is_none());
}

/// A busybox rootfs and a runtime script running gpuhook-runtime on the bed's config, in
/// `name` under the bed's work directory: (the script, the rootfs).
pub(crate) fn podman_bed(b: &Bed, name: &str) -> (PathBuf, PathBuf) {
    let dir = b.work.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    for d in ["bin", "dev", "proc", "sys", "tmp", "etc", "run"] {
        std::fs::create_dir_all(dir.join("rootfs").join(d)).unwrap();
    }
    std::fs::copy("/usr/bin/busybox", dir.join("rootfs/bin/busybox")).expect("busybox-static");
    for a in ["sh", "sleep", "ls", "true", "cat"] {
        std::os::unix::fs::symlink("busybox", dir.join("rootfs/bin").join(a)).unwrap();
    }
    let link = dir.join("gpuhook-runtime");
    std::os::unix::fs::symlink(common::bin(), &link).unwrap();
    let rt = dir.join("runtime.sh");
    std::fs::write(
        &rt,
        format!(
            "#!/bin/sh\nGPUHOOK_CONFIG={} exec {} \"$@\"\n",
            b.config().display(),
            link.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&rt, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (rt, dir.join("rootfs"))
}

pub(crate) fn podman(rt: &PathBuf, rootfs: &PathBuf, extra: &[&str], cmd: &str) -> Output {
    Command::new("podman")
        .arg("--runtime")
        .arg(rt)
        .args(["run", "--network", "none", "--ulimit", "nofile=1024:1024"])
        .args(["--ulimit", "nproc=1024:1024"])
        .args(extra)
        .arg("--rootfs")
        .arg(rootfs)
        .args(["sh", "-c", cmd])
        .output()
        .expect("podman")
}

/// A libvirt domain and a podman container share the GPU; a second container is refused
/// naming both; the container removed frees its slot.
pub fn share_libvirt_and_podman(b: &mut Bed) {
    b.shared_host(2);
    b.define_start(&spec("gh-shl", r#"share="yes""#));
    let (rt, rootfs) = podman_bed(b, "oci-share");
    let _ = Command::new("podman")
        .args(["rm", "-f", "-t", "0", "gh-sh-oci"])
        .output();
    let r = podman(
        &rt,
        &rootfs,
        &[
            "-d",
            "--name",
            "gh-sh-oci",
            "--annotation",
            "gpuhook.io/share=yes",
        ],
        "sleep 60",
    );
    assert!(r.status.success(), "{}", common::stderr(&r));
    let id = String::from_utf8_lossy(&r.stdout).trim().to_string();
    let s = b.sharers();
    assert_eq!(s.get("gh-shl"), Some(&vec![slot(0)]), "{s:?}");
    assert_eq!(s.get(&id), Some(&vec![slot(1)]), "{s:?}");
    b.sees_shared_gpu("gh-shl");
    let ls = Command::new("podman")
        .args(["exec", &id, "ls", "/dev/nvidia0"])
        .output()
        .expect("podman exec");
    assert!(ls.status.success(), "{}", common::stderr(&ls));
    let r = podman(
        &rt,
        &rootfs,
        &["--rm", "--annotation", "gpuhook.io/share=yes"],
        "true",
    );
    let e = common::stderr(&r);
    assert!(!r.status.success(), "{e}");
    assert!(
        e.contains(&format!(
            "0000:07:00.0 has 2/2 slots taken by domain 'gh-shl', container '{id}'"
        )),
        "{e}"
    );
    let _ = Command::new("podman")
        .args(["rm", "-f", "-t", "0", &id])
        .output();
    assert_eq!(b.sharers().keys().collect::<Vec<_>>(), ["gh-shl"]);
    b.d.virsh_ok(&["destroy", "gh-shl"]).unwrap();
    assert!(b.sharers().is_empty());
}

/// A sharer's controller and init SIGKILLed while libvirtd is down: its slot is reclaimed
/// (by libvirt's release, or the next reservation), the other sharer keeps its slot and its
/// access, and a new sharer gets the freed slot.
pub fn share_sharer_killed(b: &mut Bed) {
    b.shared_host(2);
    b.define_start(&spec("gh-shk", r#"share="yes""#));
    b.define_start(&spec("gh-shs", r#"share="yes""#));
    let ct = b.ct("gh-shk");
    b.d.stop().unwrap();
    for pid in [ct.controller, ct.init.pid] {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(b.reservation("gh-shk").unwrap()["stale"]
        .as_str()
        .unwrap()
        .contains("is gone"));
    b.d.start().unwrap();
    b.define_start(&spec("gh-shn2", r#"share="yes""#));
    let want: BTreeMap<String, Vec<String>> = [
        ("gh-shn2".to_string(), vec![slot(0)]),
        ("gh-shs".to_string(), vec![slot(1)]),
    ]
    .into_iter()
    .collect();
    assert_eq!(b.sharers(), want);
    assert_eq!(b.state_of("gh-shs"), "running");
    b.sees_shared_gpu("gh-shs");
    b.sees_shared_gpu("gh-shn2");
    b.d.virsh_ok(&["destroy", "gh-shs"]).unwrap();
    b.d.virsh_ok(&["destroy", "gh-shn2"]).unwrap();
    assert!(b.sharers().is_empty());
}
