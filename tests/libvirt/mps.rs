//! MPS sharing (docs/guides/sharing.md, "MPS") under the real libvirtd: two LXC domains on slots of
//! one fake GPU shared with MPS, its daemon the test bed's stand-in
//! (testbed/scripts/mps-control-standin) started by the hook. At `started` each container
//! gets the daemon's pipe directory at /tmp/nvidia-mps and its shm at /dev/shm (one
//! directory seen by both, not the host's, and by a podman container through
//! gpuhook-runtime on the third slot); a symlink at /tmp/nvidia-mps refuses the start;
//! `gpuhook detach` takes them out, `attach
//! --share` puts them back (with the daemon, SIGKILLed behind gpuhook's back, started again
//! in the same directories, which the other sharer keeps); the last destroy sends `quit`.

use super::{spec, Bed};
use crate::common::{alive, wait_gone};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;
use testbed::FakeHost;

const SHARED: &str = "0000:07:00.0";
/// What the stand-in writes into its /dev/shm (its PID): in a sharer's /dev/shm too.
const MARKER: &str = "/dev/shm/gpuhook-mps-standin";

impl Bed {
    /// The blueprint host with 0000:07:00.0 shared with MPS in 3 slots, the stand-in as
    /// its control program.
    fn mps_host(&mut self) {
        self.use_host_with(FakeHost::blueprint(), |c| {
            c["sharing"] = json!({ SHARED: {"replicas": 3, "mode": "mps",
                "active_thread_percentage": 50} });
            c["mps_control"] = json!(crate::common::mps_standin());
            c["oci_runtime"] = json!("/usr/sbin/runc");
        });
    }

    /// The daemon the state records for the shared GPU: (PID, directory).
    fn mps_daemon(&self) -> Option<(i32, PathBuf)> {
        crate::common::mps_daemon(&self.state(), SHARED)
    }

    /// What a shell in the domain's container prints for `script`.
    fn in_domain(&self, name: &str, script: &str) -> String {
        let o = self.sh_in(&self.ct(name), script);
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    /// Whether the domain sees the daemon: its control FIFO at /tmp/nvidia-mps, and the
    /// daemon's own /dev/shm (the marker holding `pid`).
    fn sees_daemon(&self, name: &str, pid: i32) -> bool {
        let got = self.in_domain(
            name,
            &format!("[ -p /tmp/nvidia-mps/control ] && cat {MARKER}"),
        );
        got == pid.to_string()
    }
}

pub fn mps_two_domains_one_daemon(b: &mut Bed) {
    b.mps_host();
    // A symlink at /tmp/nvidia-mps (the host's /tmp: the domain shares the host's root) is
    // never followed: the start is refused naming it, the slot freed, the daemon stopped.
    let _ = std::fs::remove_dir("/tmp/nvidia-mps");
    std::os::unix::fs::symlink("/root", "/tmp/nvidia-mps").unwrap();
    b.define(&spec("gh-mp1", r#"share="yes""#));
    let e = b.start("gh-mp1").expect_err("a symlink at /tmp/nvidia-mps");
    std::fs::remove_file("/tmp/nvidia-mps").unwrap();
    assert!(
        e.contains("gpuhook: domain 'gh-mp1': ") && e.contains("/tmp/nvidia-mps"),
        "{e}"
    );
    assert!(b.reservation("gh-mp1").is_none(), "nothing left reserved");
    assert!(
        b.mps_daemon().is_none(),
        "the daemon stopped with its only slot"
    );
    assert!(!Path::new("/root/control").exists());
    b.start("gh-mp1").expect("without the symlink");
    let (pid, dir) = b.mps_daemon().expect("the first slot starts a daemon");
    assert!(alive(pid), "daemon {pid}");
    b.define_start(&spec("gh-mp2", r#"share="yes""#));
    assert_eq!(
        b.mps_daemon(),
        Some((pid, dir.clone())),
        "one daemon for both"
    );
    // The refused start's daemon was told to quit; this one got the limit, once.
    let c = crate::common::mps_commands(&dir);
    assert_eq!(
        c,
        [
            "set_default_active_thread_percentage 50",
            "quit",
            "set_default_active_thread_percentage 50"
        ],
        "the limit, once per daemon"
    );
    for n in ["gh-mp1", "gh-mp2"] {
        assert!(b.sees_daemon(n, pid), "{n} sees the daemon's pipes and shm");
    }
    // The pipe directory is read-only in the container, its FIFO still open for writing: a
    // client's command reaches the daemon; nothing can be planted beside it.
    assert_eq!(
        b.in_domain(
            "gh-mp1",
            "echo get_default_active_thread_percentage > /tmp/nvidia-mps/control && echo sent; touch /tmp/nvidia-mps/planted 2>/dev/null || echo refused"
        ),
        "sent\nrefused"
    );
    assert!(!dir.join("pipe/planted").exists());
    for _ in 0..200 {
        if crate::common::mps_commands(&dir).last().map(String::as_str)
            == Some("get_default_active_thread_percentage")
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(
        crate::common::mps_commands(&dir).last().map(String::as_str),
        Some("get_default_active_thread_percentage"),
        "the client's command reached the daemon"
    );
    // One /dev/shm for both sharers and the daemon: its directory, not the host's.
    assert_eq!(
        b.in_domain("gh-mp1", "echo from-mp1 > /dev/shm/gh-mps && echo ok"),
        "ok"
    );
    assert_eq!(b.in_domain("gh-mp2", "cat /dev/shm/gh-mps"), "from-mp1");
    assert_eq!(
        std::fs::read_to_string(dir.join("shm/gh-mps")).unwrap(),
        "from-mp1\n"
    );
    assert!(!Path::new("/dev/shm/gh-mps").exists(), "not the host's shm");
    // A podman container on the third slot: the same daemon, the same shm, across doors.
    let (rt, rootfs) = super::sharing::podman_bed(b, "oci-mps");
    let r = super::sharing::podman(
        &rt,
        &rootfs,
        &["--rm", "--annotation", "gpuhook.io/share=yes"],
        &format!("[ -p /tmp/nvidia-mps/control ] && cat {MARKER} && echo && cat /dev/shm/gh-mps && echo $CUDA_MPS_PIPE_DIRECTORY && (touch /tmp/nvidia-mps/p 2>/dev/null || echo ro)"),
    );
    assert!(r.status.success(), "{}", crate::common::stderr(&r));
    assert_eq!(
        String::from_utf8_lossy(&r.stdout)
            .split_whitespace()
            .collect::<Vec<_>>(),
        [
            pid.to_string().as_str(),
            "from-mp1",
            "/tmp/nvidia-mps",
            "ro"
        ],
        "{}",
        crate::common::stderr(&r)
    );
    assert!(
        !Path::new("/tmp/nvidia-mps/control").exists(),
        "the pipe mount stays in the container"
    );
    // Detached, the directories leave the container; the daemon stays for the other sharer.
    // gh-mp1 made the host's /tmp/nvidia-mps (it shares the host's root): its detach leaves
    // that directory, and with it gh-mp2's mount over it (review: removing it would take
    // gh-mp2's mount away, in its namespace too).
    b.gh_host_ok(&["detach", "gh-mp1", "--all"]);
    assert_eq!(
        b.in_domain(
            "gh-mp1",
            "[ -e /tmp/nvidia-mps/control ] || [ -e /dev/shm/gh-mps ] || echo gone"
        ),
        "gone"
    );
    assert!(
        Path::new("/tmp/nvidia-mps").is_dir(),
        "the mount point stays"
    );
    assert!(b.sees_daemon("gh-mp2", pid));
    assert!(alive(pid));
    // The daemon killed behind gpuhook's back: the next reservation (an attach) starts it
    // again, in the same directories, which the sharer that kept its slot still has.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_gone(pid, Duration::from_secs(2));
    b.gh_host_ok(&["attach", "gh-mp1", "--share"]);
    let (pid2, dir2) = b.mps_daemon().expect("a daemon again");
    assert!(pid2 != pid && alive(pid2) && dir2 == dir, "{pid} {pid2}");
    for n in ["gh-mp1", "gh-mp2"] {
        assert!(b.sees_daemon(n, pid2), "{n} sees the new daemon");
    }
    let r = b.reservation("gh-mp1").expect("gh-mp1 holds a slot");
    let slots: Vec<&str> = r["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(slots.len(), 1, "{r}");
    assert!(slots[0].starts_with(&format!("{SHARED}/slot")), "{r}");
    // The documented limit (docs/guides/sharing.md, MPS): a domain without <idmap> keeps
    // CAP_SYS_ADMIN of the host's user namespace (its init's effective set), so it
    // could remount the read-only pipe directory writable, as it could mount anything.
    let init = b.ct("gh-mp1").init;
    let cap = std::fs::read_to_string(format!("/proc/{}/status", init.pid)).unwrap();
    let eff = cap
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    assert!(eff & (1 << 21) != 0, "CAP_SYS_ADMIN in {cap}");
    // Both gone: `quit` at the last free. The host's /tmp/nvidia-mps, made for the first
    // domain (sharing the host's root), is left there: others may have mounts over it.
    b.d.virsh_ok(&["destroy", "gh-mp1"]).unwrap();
    assert!(alive(pid2), "the daemon stays while gh-mp2 shares");
    b.d.virsh_ok(&["destroy", "gh-mp2"]).unwrap();
    assert_eq!(
        crate::common::mps_commands(&dir).last().map(String::as_str),
        Some("quit")
    );
    assert!(b.mps_daemon().is_none(), "forgotten");
    wait_gone(pid2, Duration::from_secs(2));
}
