//! `gpuhook attach` / `gpuhook detach` on running libvirt LXC domains (SPEC "Hotplug"): the
//! CLI run in libvirtd's mount namespace (where its `/run/libvirt/lxc` is), real grants in
//! the container's device cgroup, real nodes in its `/dev`.

use super::{spec, Bed};
use crate::common;
use nix::errno::Errno;
use serde_json::Value;
use std::process::{Command, Output};
use testbed::{DomainSpec, FakeHost};

impl Bed {
    /// The CLI as an operator runs it on this host: in libvirtd's mount namespace.
    fn gh_host(&self, args: &[&str]) -> Output {
        let pid = self.d.pid().expect("libvirtd runs");
        Command::new("nsenter")
            .arg(format!("--mount=/proc/{pid}/ns/mnt"))
            .arg("--")
            .arg(common::bin())
            .args(args)
            .env("GPUHOOK_CONFIG", self.config())
            .output()
            .expect("nsenter gpuhook")
    }

    fn gh_host_ok(&self, args: &[&str]) -> String {
        let o = self.gh_host(args);
        common::assert_ok(&o);
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn gh_host_err(&self, args: &[&str]) -> String {
        let o = self.gh_host(args);
        assert!(
            !o.status.success(),
            "gpuhook {args:?} must fail: {}",
            String::from_utf8_lossy(&o.stdout)
        );
        common::stderr(&o)
    }
}

/// A domain asked for one of the blueprint's two GPUs; the other is attached while it runs,
/// detached again; reconnect keeps what it holds then; destroy frees everything.
pub fn attach_and_detach_in_a_running_domain(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    b.define_start(&spec("gh-hp1", r#"count="1""#));
    let ct = b.ct("gh-hp1");
    assert_eq!(b.holders()["gh-hp1"], ["0000:07:00.0"]);
    let out = b.gh_host_ok(&["attach", "gh-hp1"]);
    assert!(
        out.contains("attached 0000:08:00.0 to domain 'gh-hp1'"),
        "{out}"
    );
    assert_eq!(b.holders()["gh-hp1"], ["0000:07:00.0", "0000:08:00.0"]);
    assert_eq!(b.nodes(&ct)["/dev/nvidia1"], (195, 1));
    assert!(b.devices_list(&ct).iter().any(|l| l == "c 195:1 rw"));
    assert_eq!(
        b.open_in(&ct, &["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"]),
        vec![Err(Errno::ENXIO); 3],
        "both GPUs and the control node are allowed (ENXIO: no driver behind the fake node)"
    );
    // Reconnect (libvirtd restarted) keeps the attached GPU, though the XML asks for one.
    common::assert_ok(&b.hook_direct("gh-hp1", "reconnect"));
    assert_eq!(b.holders()["gh-hp1"].len(), 2, "{:?}", b.holders());
    let out = b.gh_host_ok(&["detach", "gh-hp1", "--device", "0000:08:00.0"]);
    assert!(
        out.contains("detached 0000:08:00.0 from domain 'gh-hp1'"),
        "{out}"
    );
    assert_eq!(b.holders()["gh-hp1"], ["0000:07:00.0"]);
    assert!(
        !b.nodes(&ct).contains_key("/dev/nvidia1"),
        "{:?}",
        b.nodes(&ct)
    );
    // Root in the container makes the node again: the cgroup refuses it; GPU 0 and the
    // control node it still needs stay.
    common::assert_ok(&b.sh_in(&ct, "mknod /dev/nvidia1 c 195 1"));
    assert_eq!(
        b.open_in(&ct, &["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"]),
        vec![Err(Errno::ENXIO), Err(Errno::EPERM), Err(Errno::ENXIO)]
    );
    common::assert_ok(&b.hook_direct("gh-hp1", "reconnect"));
    assert_eq!(
        b.holders()["gh-hp1"],
        ["0000:07:00.0"],
        "reconnect keeps the detach"
    );
    // The JSON form.
    let j: Value = serde_json::from_str(&b.gh_host_ok(&["attach", "gh-hp1", "--json"]))
        .expect("attach --json");
    assert_eq!(j["attached"], serde_json::json!(["0000:08:00.0"]), "{j}");
    assert_eq!(j["holder"]["name"], "gh-hp1", "{j}");
    b.d.virsh_ok(&["destroy", "gh-hp1"]).unwrap();
    assert!(b.wait_shut_off("gh-hp1"));
    assert!(
        b.holders().is_empty(),
        "stop frees the attached GPUs too: {:?}",
        b.holders()
    );
}

/// A domain that asked for no GPU at start gets one by name and by UUID; its stop frees it.
pub fn attach_to_a_domain_without_a_request(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    b.define_start(&DomainSpec::new("gh-hp0", ""));
    let ct = b.ct("gh-hp0");
    assert!(b.nodes(&ct).is_empty());
    b.gh_host_ok(&["attach", "gh-hp0", "--device", "0000:08:00.0"]);
    assert_eq!(b.holders()["gh-hp0"], ["0000:08:00.0"]);
    assert_eq!(b.nodes(&ct)["/dev/nvidia1"], (195, 1));
    let uuid = b.reservation("gh-hp0").expect("reservation")["uuid"]
        .as_str()
        .unwrap()
        .to_owned();
    b.gh_host_ok(&["attach", &uuid.to_ascii_uppercase()]);
    assert_eq!(b.holders()["gh-hp0"], ["0000:07:00.0", "0000:08:00.0"]);
    b.gh_host_ok(&["detach", "gh-hp0", "--all"]);
    assert!(b.holders().is_empty(), "{:?}", b.holders());
    assert!(b.nodes(&ct).is_empty(), "{:?}", b.nodes(&ct));
    b.gh_host_ok(&["attach", "gh-hp0"]);
    b.d.virsh_ok(&["destroy", "gh-hp0"]).unwrap();
    assert!(b.wait_shut_off("gh-hp0"));
    assert!(b.holders().is_empty(), "stop frees: {:?}", b.holders());
}

/// Refusals are one line and change nothing.
pub fn attach_refusals(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    b.define_start(&spec("gh-hp2", r#"count="2""#));
    let ct = b.ct("gh-hp2");
    let before = b.nodes(&ct);
    let e = b.gh_host_err(&["attach", "gh-nosuch"]);
    assert!(
        e.contains("no running libvirt domain or OCI container named 'gh-nosuch'"),
        "{e}"
    );
    let e = b.gh_host_err(&["attach", "gh-hp2"]);
    assert!(e.contains("cannot reserve"), "{e}");
    let e = b.gh_host_err(&["attach", "gh-hp2", "--capabilities", "teleport"]);
    assert!(e.contains("--capabilities: "), "{e}");
    let e = b.gh_host_err(&["detach", "gh-hp2", "--device", "0000:09:00.0"]);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert_eq!(b.holders()["gh-hp2"].len(), 2);
    assert_eq!(b.nodes(&ct), before);
}

/// Two attaches race for the last free GPU: exactly one gets it, and only its container can
/// open it.
pub fn attaches_race_for_the_last_gpu(b: &mut Bed) {
    b.use_host(FakeHost::blueprint());
    b.define_start(&spec("gh-hpr1", r#"count="1""#));
    b.define_start(&DomainSpec::new("gh-hpr2", ""));
    let (c1, c2) = (b.ct("gh-hpr1"), b.ct("gh-hpr2"));
    let (o1, o2) = std::thread::scope(|s| {
        let t1 = s.spawn(|| b.gh_host(&["attach", "gh-hpr1"]));
        let t2 = s.spawn(|| b.gh_host(&["attach", "gh-hpr2"]));
        (t1.join().unwrap(), t2.join().unwrap())
    });
    assert!(
        o1.status.success() != o2.status.success(),
        "exactly one wins: {} / {}",
        common::stderr(&o1),
        common::stderr(&o2)
    );
    let (won, lost, lost_name) = if o1.status.success() {
        (&c1, &c2, "gh-hpr2")
    } else {
        (&c2, &c1, "gh-hpr1")
    };
    let loser = if o1.status.success() { &o2 } else { &o1 };
    assert!(
        common::stderr(loser).contains("held by"),
        "{}",
        common::stderr(loser)
    );
    assert_eq!(b.open_in(won, &["/dev/nvidia1"]), vec![Err(Errno::ENXIO)]);
    common::assert_ok(&b.sh_in(lost, "[ -e /dev/nvidia1 ] || mknod /dev/nvidia1 c 195 1"));
    assert_eq!(b.open_in(lost, &["/dev/nvidia1"]), vec![Err(Errno::EPERM)]);
    let h = b.holders();
    assert_eq!(h.values().map(Vec::len).sum::<usize>(), 2, "{h:?}");
    assert!(!h
        .get(lost_name)
        .is_some_and(|g| g.contains(&"0000:08:00.0".to_string())));
}

/// A GPU a process of the container has open is not detached without --force; with it, it is,
/// the process keeps its file, and the GPU drains until closed.
pub fn detach_of_an_open_gpu(b: &mut Bed) {
    let p = b.use_host(common::blueprint_minors(241, 242));
    common::openable(&p.dev.join("nvidia241"));
    let mut s = DomainSpec::new(
        "gh-hpo",
        &format!(
            r#"<gpu:gpus {}><gpu:device index="0"/></gpu:gpus>"#,
            super::META_NS
        ),
    );
    s.init = "while [ ! -c /dev/nvidia241 ]; do sleep 0.1; done; exec 3</dev/nvidia241; while :; do sleep 1; done".into();
    b.define_start(&s);
    let ct = b.ct("gh-hpo");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !std::fs::read_link(format!("/proc/{}/fd/3", ct.init.pid))
        .is_ok_and(|l| l.ends_with("nvidia241"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the init never opened its GPU"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let e = b.gh_host_err(&["detach", "gh-hpo", "--all"]);
    assert!(
        e.contains(&format!("{}", ct.init.pid)),
        "names the PID: {e}"
    );
    assert!(e.contains("sh"), "names the command: {e}");
    assert_eq!(b.holders()["gh-hpo"], ["0000:07:00.0"], "nothing changed");
    let out = b.gh_host_ok(&["detach", "gh-hpo", "--all", "--force"]);
    assert!(out.contains("keeps its open file"), "{out}");
    assert!(b.holders().is_empty(), "{:?}", b.holders());
    let l = b.list();
    // The init, and the `sleep` it runs at that moment (which inherited the descriptor).
    let draining = common::gpu_of(&l, "0000:07:00.0")["draining"].clone();
    assert!(
        draining
            .as_array()
            .is_some_and(|d| d.contains(&serde_json::json!(ct.init.pid))),
        "{l}"
    );
    // A second domain cannot get the draining GPU.
    b.define(&spec("gh-hpo2", r#"count="2""#));
    assert!(b.start("gh-hpo2").is_err());
}
