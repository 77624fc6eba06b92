//! `gpuhook attach` / `gpuhook detach` on running libvirt LXC domains (docs/guides/hotplug.md): the
//! CLI run in libvirtd's mount namespace (where its `/run/libvirt/lxc` is), real grants in
//! the container's device cgroup, real nodes in its `/dev`.

use super::{spec, Bed};
use crate::common;
use gpuhook::enter::container::Container;
use nix::errno::Errno;
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::{Command, Output};
use testbed::{DomainSpec, FakeHost};

impl Bed {
    /// The CLI as an operator runs it on this host: in libvirtd's mount namespace.
    fn gh_host(&self, args: &[&str]) -> Output {
        self.gh_host_under(&[], args)
    }

    /// [`Bed::gh_host`] with the binary run by `wrap` (a command and its arguments).
    fn gh_host_under(&self, wrap: &[&str], args: &[&str]) -> Output {
        let pid = self.d.pid().expect("libvirtd runs");
        Command::new("nsenter")
            .arg(format!("--mount=/proc/{pid}/ns/mnt"))
            .arg("--")
            .args(wrap)
            .arg(common::bin())
            .args(args)
            .env("GPUHOOK_CONFIG", self.config())
            .output()
            .expect("nsenter gpuhook")
    }

    pub(crate) fn gh_host_ok(&self, args: &[&str]) -> String {
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

/// The blueprint's GPUs and the minor of each one's node (major 195).
const GPUS: [(&str, u32); 2] = [("0000:07:00.0", 0), ("0000:08:00.0", 1)];

/// A step at which strace kills the CLI: at the entry of the `when`-th call of `syscall`
/// (not made) in the CLI's own process, or with `helper` in the one it forks into the
/// container's mount namespace.
struct Kill {
    /// The step, in words.
    at: &'static str,
    syscall: &'static str,
    when: u32,
    helper: bool,
    /// Right after the kill: whether the domain holds the attached (or detached) GPU, and
    /// whether its cgroup lets it open that GPU.
    held: bool,
    open: bool,
}

impl Kill {
    const fn at(
        at: &'static str,
        syscall: &'static str,
        when: u32,
        held: bool,
        open: bool,
    ) -> Kill {
        Kill {
            at,
            syscall,
            when,
            helper: false,
            held,
            open,
        }
    }
}

/// `gpuhook attach` of the second GPU, step by step (see `strace -f` of it): the state
/// lock (flock 1), reserve written (write 1) and renamed (renameat 1), the grant (write 2 to
/// `devices.allow`), the helper forked (clone 1) makes the node (mknodat), the record under
/// the lock (flock 2; written only when it changes the file: the reserve recorded the nodes).
const ATTACH_KILLS: &[Kill] = &[
    Kill::at("before the reserve", "flock", 1, false, false),
    Kill::at("reserve written, not renamed", "renameat", 1, false, false),
    Kill::at("reserved, not granted", "write", 2, true, false),
    Kill::at("granted, no node made", "clone", 1, true, true),
    Kill {
        helper: true,
        ..Kill::at(
            "helper killed making the node (attach takes it all back)",
            "mknodat",
            1,
            false,
            false,
        )
    },
    Kill::at("node made, not recorded", "flock", 2, true, true),
];

/// `gpuhook detach` of the attached GPU: under the state lock the deny (write 1 to
/// `devices.deny`) and the state written and renamed (renameat 1); then the helper forked
/// (clone 1) removes the node.
const DETACH_KILLS: &[Kill] = &[
    Kill::at("locked, nothing denied", "write", 1, true, true),
    Kill::at("denied, state not updated", "renameat", 1, true, false),
    Kill::at("freed, node not removed", "clone", 1, false, false),
];

/// SIGKILL of `gpuhook attach` at each step never leaves a GPU usable by a container that
/// does not hold it, and what a kill leaves is cleaned up by detach, attach and destroy.
pub fn attach_killed_at_each_step(b: &mut Bed) {
    for k in ATTACH_KILLS {
        killed(b, &["attach", "gh-hpk1"], false, k);
    }
}

/// The same for `gpuhook detach`, with a second domain waiting for the detached GPU.
pub fn detach_killed_at_each_step(b: &mut Bed) {
    for k in DETACH_KILLS {
        killed(b, &["detach", "gh-hpk1", "--device", GPUS[1].0], true, k);
    }
}

/// Domain gh-hpk1 holds GPU 0 (and GPU 1 when `attached`); `args` killed at `k`; then
/// checked: what the kill left, and the invariant ([`assert_safe`]) after each of: domain
/// gh-hpk2 (one GPU) started (refused while gh-hpk1 holds GPU 1), a detach of GPU 1, gh-hpk2
/// started, gh-hpk2 destroyed and GPU 1 attached to gh-hpk1 again, gh-hpk1 destroyed.
fn killed(b: &mut Bed, args: &[&str], attached: bool, k: &Kill) {
    let (gpu, at) = (GPUS[1].0, k.at);
    b.d.cleanup("gh-hpk");
    b.use_host(FakeHost::blueprint());
    b.define_start(&spec("gh-hpk1", r#"count="1""#));
    b.define(&spec("gh-hpk2", r#"count="1""#));
    let c1 = b.ct("gh-hpk1");
    if attached {
        b.gh_host_ok(&["attach", "gh-hpk1"]);
    }
    let inject = format!("inject={}:signal=SIGKILL:when={}", k.syscall, k.when);
    let trace = format!("trace={}", k.syscall);
    let mut wrap = vec!["strace", "-e", &trace, "-e", &inject];
    if k.helper {
        wrap.push("-f");
    }
    let err = common::stderr(&b.gh_host_under(&wrap, args));
    assert!(err.contains("killed by SIGKILL"), "{at}: not killed: {err}");
    let holds = |b: &Bed| {
        b.holders()
            .get("gh-hpk1")
            .is_some_and(|g| g.iter().any(|p| p == gpu))
    };
    assert_eq!(holds(b), k.held, "{at}: held? {:?}", b.holders());
    assert_eq!(b.can_open(&c1, GPUS[1].1), k.open, "{at}: open?");
    assert_safe(b, &[("gh-hpk1", &c1)], at);
    assert_eq!(
        b.start("gh-hpk2").is_ok(),
        !k.held,
        "{at}: gh-hpk2 waits for GPU 1"
    );
    if k.held {
        b.gh_host_ok(&["detach", "gh-hpk1", "--device", gpu]);
        assert_safe(b, &[("gh-hpk1", &c1)], at);
        let left = b.nodes(&c1);
        assert!(!left.contains_key("/dev/nvidia1"), "{at}: {left:?}");
        b.start("gh-hpk2")
            .unwrap_or_else(|e| panic!("{at}: gh-hpk2: {e}"));
    }
    assert_safe(b, &[("gh-hpk1", &c1), ("gh-hpk2", &b.ct("gh-hpk2"))], at);
    b.d.virsh_ok(&["destroy", "gh-hpk2"]).unwrap();
    assert!(b.wait_shut_off("gh-hpk2"));
    b.gh_host_ok(&["attach", "gh-hpk1"]);
    assert!(b.can_open(&c1, GPUS[1].1), "{at}: attached again");
    assert_eq!(b.nodes(&c1).get("/dev/nvidia1"), Some(&(195, 1)), "{at}");
    assert_safe(b, &[("gh-hpk1", &c1)], at);
    b.d.virsh_ok(&["destroy", "gh-hpk1"]).unwrap();
    assert!(b.wait_shut_off("gh-hpk1"));
    assert!(b.holders().is_empty(), "{at}: {:?}", b.holders());
}

/// The safety invariant: no GPU is in two reservations of the state, and each container's
/// cgroup lets it open a GPU only when its domain's reservation holds it.
fn assert_safe(b: &Bed, cts: &[(&str, &Container)], at: &str) {
    let st: Value = std::fs::read(b.state())
        .map(|s| serde_json::from_slice(&s).expect("state"))
        .unwrap_or(Value::Null);
    let mut held: BTreeMap<String, String> = BTreeMap::new();
    for r in st["reservations"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.values())
    {
        let name = r["domain"].as_str().expect("domain");
        for g in r["gpus"].as_array().expect("gpus") {
            let g = g.as_str().expect("unit").to_owned();
            let other = held.insert(g.clone(), name.to_owned());
            assert!(other.is_none(), "{at}: {g} held by {other:?} and {name}");
        }
    }
    for (name, ct) in cts {
        for (pci, minor) in GPUS {
            if b.can_open(ct, minor) {
                assert_eq!(
                    held.get(pci).map(String::as_str),
                    Some(*name),
                    "{at}: {name} can open {pci}, held by {:?}",
                    held.get(pci)
                );
            }
        }
    }
}

impl Bed {
    /// Whether the container's cgroup lets it open c 195:`minor` (through a node of its own
    /// made for the probe: ENXIO, no driver behind it, is allowed; EPERM refused).
    fn can_open(&self, ct: &Container, minor: u32) -> bool {
        let probe = format!("/dev/.gh-probe-{minor}");
        common::assert_ok(&self.sh_in(ct, &format!("rm -f {probe}; mknod {probe} c 195 {minor}")));
        let r = self.open_in(ct, &[&probe]);
        common::assert_ok(&self.sh_in(ct, &format!("rm -f {probe}")));
        match r[0] {
            Err(Errno::ENXIO) => true,
            Err(Errno::EPERM) => false,
            e => panic!("open of c 195:{minor} in the container: {e:?}"),
        }
    }
}

/// MIG instances attached to a running domain that asked for none (`--mig --count 2`): each
/// instance's capability nodes and its GPU's `/dev/nvidiaN` are made and granted (openable
/// past the cgroup); detach by the GPU's PCI address takes back every instance of it held,
/// with their nodes and grants; destroy frees the rest.
pub fn mig_attach_and_detach(b: &mut Bed) {
    b.use_host(FakeHost::dgx8_mig());
    b.define_start(&DomainSpec::new("gh-hp-mig", ""));
    let ct = b.ct("gh-hp-mig");
    let j: Value = serde_json::from_str(&b.gh_host_ok(&[
        "attach",
        "gh-hp-mig",
        "--mig",
        "--count",
        "2",
        "--json",
    ]))
    .expect("attach --json");
    let ids: Vec<String> = j["attached"]
        .as_array()
        .expect("attached")
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 2, "{j}");
    assert!(ids.iter().all(|i| i.contains("/gi")), "MIG instances: {j}");
    let devices: Vec<String> = j["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert!(
        devices.iter().any(|d| d.starts_with("/dev/nvidia-caps/")),
        "{j}"
    );
    assert!(
        devices
            .iter()
            .any(|d| d.starts_with("/dev/nvidia") && d[11..].parse::<u32>().is_ok()),
        "the parent GPU's node: {j}"
    );
    let made = b.nodes(&ct);
    let rules = b.devices_list(&ct);
    for d in &devices {
        let (ma, mi) = made
            .get(d)
            .unwrap_or_else(|| panic!("{d} not made: {made:?}"));
        assert!(
            rules.iter().any(|l| *l == format!("c {ma}:{mi} rw")),
            "{d} not granted: {rules:?}"
        );
    }
    let paths: Vec<&str> = devices.iter().map(String::as_str).collect();
    assert!(
        b.open_in(&ct, &paths)
            .iter()
            .all(|r| *r == Err(Errno::ENXIO)),
        "{:?}",
        b.open_in(&ct, &paths)
    );
    // Held by the domain, instance by instance.
    let list = b.list();
    let held: Vec<String> = list["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["migs"].as_array().unwrap().iter())
        .filter(|m| m["holder"]["domain"] == "gh-hp-mig")
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(held, ids);

    let pci = ids[0].split('/').next().unwrap().to_owned();
    let out = b.gh_host_ok(&["detach", "gh-hp-mig", "--device", &pci]);
    assert!(out.contains("detached"), "{out}");
    let left: Vec<String> = b.reservation("gh-hp-mig").expect("reservation")["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert!(left.iter().all(|u| !u.starts_with(&pci)), "{left:?}");
    let rules = b.devices_list(&ct);
    let nodes = b.nodes(&ct);
    let gone: Vec<&String> = devices.iter().filter(|d| !nodes.contains_key(*d)).collect();
    assert!(!gone.is_empty(), "detach removed no node: {nodes:?}");
    for d in gone {
        let (ma, mi) = made[d];
        assert!(
            !rules.iter().any(|l| *l == format!("c {ma}:{mi} rw")),
            "{d} still granted: {rules:?}"
        );
    }
    b.d.virsh_ok(&["destroy", "gh-hp-mig"]).unwrap();
    assert!(b.wait_shut_off("gh-hp-mig"));
    assert!(b
        .reservation("gh-hp-mig")
        .is_none_or(|r| r["gpus"] == serde_json::json!([])));
}

/// The driver's mounts of the container's init (`/proc/1/mounts` inside) under `lib`.
fn driver_mounts(b: &Bed, ct: &Container) -> Vec<String> {
    let o = b.sh_in(ct, "cat /proc/1/mounts");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains("libcuda.so.535.129.03 ") || l.contains("/usr/bin/nvidia-smi "))
        .map(str::to_owned)
        .collect()
}

/// The driver mounts the state records for the domain.
fn recorded_mounts(b: &Bed, name: &str) -> usize {
    let st: Value = serde_json::from_slice(&std::fs::read(b.state()).unwrap()).unwrap();
    st["reservations"]
        .as_object()
        .and_then(|m| m.values().find(|r| r["domain"] == name))
        .and_then(|r| r["mounts"].as_array().map(Vec::len))
        .unwrap_or(0)
}

/// A domain with its own root and no GPU gets one with `attach --driver cdi`: the driver's
/// files, links and linker cache from the CDI spec in the running container (as at
/// `started`); a second GPU keeps the same mounts; detach of one keeps what the other needs;
/// detach of the last takes them out (nothing left mounted, no link).
pub fn attach_cdi_in_a_domain_with_its_own_root(b: &mut Bed) {
    let (_drv, rootfs) = super::cdi_host(b, "cdi-hp");
    let mut s = DomainSpec::new("gh-hpcdi", "");
    s.rootfs = Some((rootfs.clone(), false));
    b.define_start(&s);
    let ct = b.ct("gh-hpcdi");
    assert!(driver_mounts(b, &ct).is_empty());
    let out = b.gh_host_ok(&[
        "attach",
        "gh-hpcdi",
        "--driver",
        "cdi",
        "--device",
        "0000:07:00.0",
    ]);
    assert!(out.contains("attached 0000:07:00.0"), "{out}");
    let o = b.sh_in(&ct, common::CDI_PROBE);
    common::assert_cdi_probe(&String::from_utf8_lossy(&o.stdout));
    let cache = std::fs::read(rootfs.join("etc/ld.so.cache")).unwrap();
    assert!(cache.starts_with(b"glibc-ld.so.cache"), "not a cache");
    let mounts = driver_mounts(b, &ct);
    assert_eq!(mounts.len(), 2, "{mounts:?}");
    let recorded = recorded_mounts(b, "gh-hpcdi");
    assert!(recorded > 10, "{recorded}");
    // A second GPU: its node; the driver's mounts stay as they are (none twice).
    b.gh_host_ok(&[
        "attach",
        "gh-hpcdi",
        "--driver",
        "cdi",
        "--device",
        "0000:08:00.0",
    ]);
    assert_eq!(b.nodes(&ct)["/dev/nvidia1"], (195, 1));
    assert_eq!(driver_mounts(b, &ct), mounts);
    assert_eq!(recorded_mounts(b, "gh-hpcdi"), recorded);
    // Detach of the first: the second keeps the driver.
    b.gh_host_ok(&["detach", "gh-hpcdi", "--device", "0000:07:00.0"]);
    assert_eq!(driver_mounts(b, &ct), mounts);
    assert_eq!(recorded_mounts(b, "gh-hpcdi"), recorded);
    let o = b.sh_in(&ct, "/sbin/ldconfig -p | grep libcuda.so.1; cuda-probe");
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains("dlopen libcuda.so.1: ok"), "{said}");
    // Detach of the last: the mounts and links go.
    b.gh_host_ok(&["detach", "gh-hpcdi", "--device", "0000:08:00.0"]);
    assert!(
        driver_mounts(b, &ct).is_empty(),
        "{:?}",
        driver_mounts(b, &ct)
    );
    assert_eq!(recorded_mounts(b, "gh-hpcdi"), 0);
    let o = b.sh_in(
        &ct,
        "ls /usr/lib/x86_64-linux-gnu/; grep -c . /proc/1/mounts",
    );
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(!said.contains("libcuda"), "{said}");
    assert!(host_mounts_empty(&rootfs));
    b.d.virsh_ok(&["destroy", "gh-hpcdi"]).unwrap();
    assert!(b.wait_shut_off("gh-hpcdi"));
    assert!(b.holders().is_empty(), "{:?}", b.holders());
}

fn host_mounts_empty(dir: &std::path::Path) -> bool {
    super::host_mounts_under(dir).is_empty()
}

/// A runc container run detached (`runc run -d`) from a busybox root, killed and deleted when
/// dropped.
struct RuncContainer {
    root: std::path::PathBuf,
    id: String,
}

impl RuncContainer {
    fn start(dir: &std::path::Path, root: &std::path::Path, id: &str) -> RuncContainer {
        std::fs::create_dir_all(dir).unwrap();
        testbed::image::busybox_rootfs(dir).expect("busybox rootfs");
        let o = Command::new("runc")
            .arg("spec")
            .arg("--bundle")
            .arg(dir)
            .output()
            .expect("runc spec");
        common::assert_ok(&o);
        let p = dir.join("config.json");
        let mut spec: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        spec["process"]["terminal"] = Value::Bool(false);
        spec["process"]["args"] = serde_json::json!(["sleep", "1000"]);
        std::fs::write(&p, spec.to_string()).unwrap();
        let c = RuncContainer {
            root: root.to_path_buf(),
            id: id.to_string(),
        };
        // The detached container keeps runc's stdio: a file, not a pipe waited on to its end.
        let log = dir.join("runc.log");
        let f = std::fs::File::create(&log).unwrap();
        let st = Command::new("runc")
            .arg("--root")
            .arg(root)
            .args(["run", "-d", "--bundle"])
            .arg(dir)
            .arg(id)
            .stdin(std::process::Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .status()
            .expect("runc run");
        assert!(
            st.success(),
            "runc run: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        c
    }

    fn pid(&self) -> i32 {
        let s: Value = serde_json::from_slice(
            &std::fs::read(self.root.join(&self.id).join("state.json")).unwrap(),
        )
        .unwrap();
        s["init_process_pid"].as_i64().unwrap() as i32
    }
}

impl Drop for RuncContainer {
    fn drop(&mut self) {
        let _ = Command::new("runc")
            .arg("--root")
            .arg(&self.root)
            .args(["delete", "--force", &self.id])
            .output();
    }
}

/// A running libvirt domain named like a running OCI container's ID: `attach`/`detach NAME`
/// is refused in one line naming both, nothing changed; `--domain` and `--container` say which,
/// and each gets (and gives back) only what was meant for it.
pub fn a_name_both_domain_and_container(b: &mut Bed) {
    let roots = b.work.join("twin-runc");
    b.use_host_with(FakeHost::blueprint(), |c| {
        c["oci_state_roots"] = serde_json::json!([roots])
    });
    b.define_start(&DomainSpec::new("gh-twin", ""));
    let ct = b.ct("gh-twin");
    let oci = RuncContainer::start(&b.work.join("twin-bundle"), &roots, "gh-twin");
    for args in [
        &["attach", "gh-twin"][..],
        &["attach", "gh-twin", "--device", "0000:07:00.0"],
        &["detach", "gh-twin", "--all"],
    ] {
        let e = b.gh_host_err(args);
        assert_eq!(e.trim_end().lines().count(), 1, "{e}");
        let uuid = b.xml("gh-twin");
        let uuid = uuid
            .split("<uuid>")
            .nth(1)
            .and_then(|u| u.split("</uuid>").next())
            .expect("uuid");
        assert_eq!(
            e.trim_end(),
            format!("gpuhook: 'gh-twin' names both libvirt domain 'gh-twin' ({uuid}) and OCI container 'gh-twin': say which with --domain or --container"),
        );
        assert!(b.holders().is_empty(), "{:?}", b.holders());
    }
    let out = b.gh_host_ok(&["attach", "gh-twin", "--domain", "--device", "0000:07:00.0"]);
    assert!(
        out.contains("attached 0000:07:00.0 to domain 'gh-twin'"),
        "{out}"
    );
    let out = b.gh_host_ok(&[
        "attach",
        "gh-twin",
        "--container",
        "--device",
        "0000:08:00.0",
    ]);
    assert!(
        out.contains("attached 0000:08:00.0 to container 'gh-twin'"),
        "{out}"
    );
    let l = b.list();
    let kind = |pci: &str| common::gpu_of(&l, pci)["holder"]["kind"].clone();
    assert_eq!(
        (kind("0000:07:00.0"), kind("0000:08:00.0")),
        (Value::from("libvirt"), Value::from("oci")),
        "{l}"
    );
    assert_eq!(b.nodes(&ct).get("/dev/nvidia0"), Some(&(195, 0)));
    assert!(!b.nodes(&ct).contains_key("/dev/nvidia1"));
    let o = testbed::shell_in(oci.pid(), "ls /dev")
        .output()
        .expect("nsenter");
    let dev = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        dev.contains("nvidia1") && !dev.lines().any(|l| l == "nvidia0"),
        "{dev}"
    );
    // Each detach takes back only its own.
    b.gh_host_ok(&["detach", "gh-twin", "--container", "--all"]);
    assert_eq!(b.holders()["gh-twin"], ["0000:07:00.0"]);
    assert_eq!(
        common::gpu_of(&b.list(), "0000:07:00.0")["holder"]["kind"],
        "libvirt"
    );
    b.gh_host_ok(&["detach", "gh-twin", "--domain", "--all"]);
    assert!(b.holders().is_empty());
    // Said which, and there is none of that kind.
    let e = b.gh_host_err(&["attach", "gh-nodomain", "--domain"]);
    assert!(
        e.contains("no running libvirt domain named 'gh-nodomain'"),
        "{e}"
    );
    b.define_start(&DomainSpec::new("gh-twin2", ""));
    let e = b.gh_host_err(&["attach", "gh-twin2", "--container"]);
    assert!(
        e.contains("no running OCI container named 'gh-twin2'"),
        "{e}"
    );
    let e = b.gh_host_err(&["attach", "gh-twin", "--domain", "--container"]);
    assert!(e.contains("cannot be used with"), "{e}");
    drop(oci);
    // The container gone, the name is the domain's alone again.
    b.gh_host_ok(&["attach", "gh-twin", "--device", "0000:07:00.0"]);
    assert_eq!(b.holders()["gh-twin"], ["0000:07:00.0"]);
}
