//! MPS sharing (docs/guides/sharing.md, "MPS") through the real binary on a fake host, with the test
//! bed's stand-in for nvidia-cuda-mps-control (testbed/scripts/mps-control-standin): the
//! daemon started at the first slot with its environment, private /dev/shm and limits, one
//! daemon for two sharers, quit at the last free, started again after a SIGKILL behind
//! gpuhook's back, and stopped by the next free when left without sharers.

mod common;

use common::{alive, assert_ok, domain, gpus, Host};
use serde_json::Value;
use std::path::{Path, PathBuf};
use testbed::FakeHost;

const GPU: &str = "0000:1a:00.0";

fn mps_host() -> Host {
    Host::with(FakeHost::dgx8(), |c| {
        c["sharing"] = serde_json::json!({GPU: {"replicas": 3, "mode": "mps",
            "memory_limit_mib": 2048, "active_thread_percentage": 50}});
        c["mps_control"] = serde_json::json!(common::mps_standin());
    })
}

fn state(h: &Host) -> Value {
    serde_json::from_slice(&std::fs::read(&h.state).expect("state")).expect("state json")
}

/// The recorded daemon of GPU: its PID and directory.
fn daemon(h: &Host) -> Option<(i32, PathBuf)> {
    common::mps_daemon(&h.state, GPU)
}

fn wait_gone(pid: i32) {
    common::wait_gone(pid, std::time::Duration::from_secs(5));
}

#[test]
fn daemon_started_shared_limited_and_quit() {
    let h = mps_host();
    let share = gpus(r#"share="yes""#);
    assert_ok(&h.hook("s1", "prepare", &domain("s1", 11, &share)));
    let (pid, dir) = daemon(&h).expect("a daemon recorded");
    assert!(alive(pid));
    assert_eq!(
        dir,
        h.state
            .parent()
            .unwrap()
            .join("mps")
            .join(dir.file_name().unwrap())
    );
    let uuid = dir.file_name().unwrap().to_str().unwrap().to_string();
    assert!(uuid.starts_with("GPU-"), "{uuid}");
    // Exactly its three variables.
    let env: Value =
        serde_json::from_slice(&std::fs::read(dir.join("log/env.json")).unwrap()).unwrap();
    let keys: Vec<&str> = env
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert!(
        keys.iter()
            .all(|k| k.starts_with("CUDA_") || *k == "LC_CTYPE"),
        "{env}"
    );
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], uuid.as_str());
    assert_eq!(
        env["CUDA_MPS_PIPE_DIRECTORY"],
        dir.join("pipe").to_str().unwrap()
    );
    assert_eq!(
        env["CUDA_MPS_LOG_DIRECTORY"],
        dir.join("log").to_str().unwrap()
    );
    // Its /dev/shm is DIR/shm: the marker it wrote there is in DIR/shm, not the host's.
    assert!(dir.join("shm/gpuhook-mps-standin").exists());
    assert!(!Path::new("/dev/shm/gpuhook-mps-standin").exists());
    assert!(dir.join("pipe/control").exists());
    assert!(dir.join("pipe/nvidia-cuda-mps-control.pid").exists());
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| std::fs::metadata(dir.join(p)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(
        (mode("pipe"), mode("log"), mode("shm")),
        (0o755, 0o755, 0o1777)
    );
    for _ in 0..200 {
        if common::mps_commands(&dir).len() >= 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(
        common::mps_commands(&dir),
        [
            "set_default_device_pinned_mem_limit 0 2048M",
            "set_default_active_thread_percentage 50"
        ]
    );
    // A second sharer: the same daemon.
    assert_ok(&h.hook("s2", "prepare", &domain("s2", 12, &share)));
    assert_eq!(daemon(&h).unwrap().0, pid);
    assert_ok(&h.hook("s1", "stopped", &domain("s1", 11, &share)));
    assert!(alive(pid), "one sharer left");
    assert_ok(&h.hook("s2", "stopped", &domain("s2", 12, &share)));
    wait_gone(pid);
    assert_eq!(
        common::mps_commands(&dir).last().map(String::as_str),
        Some("quit")
    );
    assert!(daemon(&h).is_none());
    assert!(!dir.join("pipe/nvidia-cuda-mps-control.pid").exists());
}

#[test]
fn killed_daemon_restarted_and_orphan_stopped_by_next_free() {
    let h = mps_host();
    let share = gpus(r#"share="yes""#);
    assert_ok(&h.hook("s1", "prepare", &domain("s1", 11, &share)));
    let (pid, dir) = daemon(&h).unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL).unwrap();
    wait_gone(pid);
    assert_ok(&h.hook("s2", "prepare", &domain("s2", 12, &share)));
    let (again, _) = daemon(&h).expect("started again");
    assert_ne!(again, pid);
    assert!(alive(again));
    // Left without sharers behind gpuhook's back (the reservations gone from the state, as
    // after a free whose quit failed): the next free of anything stops it (`gpuhook-libvirt
    // reconcile` frees through the same step).
    let mut s = state(&h);
    s["reservations"] = serde_json::json!({});
    std::fs::write(&h.state, s.to_string()).unwrap();
    assert_ok(&h.hook("s3", "stopped", &domain("s3", 13, &share)));
    wait_gone(again);
    assert!(daemon(&h).is_none());
    assert_eq!(
        common::mps_commands(&dir).last().map(String::as_str),
        Some("quit")
    );
}

/// A stand-in for nvidia-cuda-mps-control whose `-d` touches `begun` and then takes 3 s
/// before the real stand-in starts the daemon (client mode is not slowed).
fn slow_standin(dir: &Path) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let begun = dir.join("begun");
    let slow = dir.join("slow-mps-control");
    let sleep = ["/usr/bin/sleep", "/bin/sleep"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("sleep");
    std::fs::write(
        &slow,
        format!(
            "#!/bin/sh\nif [ \"$1\" = -d ]; then : > {}; {sleep} 3; fi\nexec {} \"$@\"\n",
            begun.display(),
            common::mps_standin().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
    (slow, begun)
}

fn slow_host(slow: &Path) -> Host {
    Host::with(FakeHost::dgx8(), |c| {
        c["sharing"] = serde_json::json!({GPU: {"replicas": 3, "mode": "mps",
            "memory_limit_mib": 2048, "active_thread_percentage": 50}});
        c["mps_control"] = serde_json::json!(slow);
    })
}

/// How many daemons the stand-in started for `dir` (its log's start lines).
fn starts(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("log/control.log"))
        .unwrap_or_default()
        .matches("Starting control daemon")
        .count()
}

/// Issue 35: the first sharer's daemon start (here 3 s) does not hold the state lock, so
/// another domain's unrelated `prepare` does not wait for it; a second sharer waits for the
/// same daemon (no second start).
#[test]
fn a_slow_daemon_start_holds_no_other_prepare() {
    let t = tempfile::tempdir().unwrap();
    let (slow, begun) = slow_standin(t.path());
    let h = slow_host(&slow);
    let share = gpus(r#"share="yes""#);
    std::thread::scope(|s| {
        let first = s.spawn(|| h.hook("s1", "prepare", &domain("s1", 11, &share)));
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !begun.exists() {
            assert!(
                std::time::Instant::now() < end,
                "the daemon's start never began"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let t0 = std::time::Instant::now();
        assert_ok(&h.hook("other", "prepare", &domain("other", 13, &gpus(""))));
        let took = t0.elapsed();
        assert!(
            took < std::time::Duration::from_secs(1),
            "another domain's prepare waited {took:?} behind the MPS daemon's start"
        );
        let second = s.spawn(|| h.hook("s2", "prepare", &domain("s2", 12, &share)));
        assert_ok(&first.join().unwrap());
        assert_ok(&second.join().unwrap());
    });
    let (pid, dir) = daemon(&h).expect("a daemon recorded");
    assert!(alive(pid));
    assert_eq!(starts(&dir), 1);
    assert!(!state(&h)["mps"][GPU]
        .as_object()
        .unwrap()
        .contains_key("starting"));
    assert_ok(&h.hook("s1", "stopped", &domain("s1", 11, &share)));
    assert_ok(&h.hook("s2", "stopped", &domain("s2", 12, &share)));
    wait_gone(pid);
}

/// The processes of host root whose environment names `pipe` as the MPS pipe directory (a
/// daemon started for it, or a part of its start).
fn started_for(pipe: &Path) -> Vec<i32> {
    let want = format!("CUDA_MPS_PIPE_DIRECTORY={}", pipe.display()).into_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| alive(*pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == want))
        })
        .collect()
}

/// Issue 35: a hook SIGKILLed at each point of a daemon's start (strace's fault injection at
/// the entry of the N-th call of a syscall) leaves no daemon the state does not record: the
/// next sharer's `prepare` sweeps what the killed start left and starts one daemon, the only
/// one running; its last free stops it.
#[test]
fn a_killed_start_leaves_no_unrecorded_daemon() {
    // `gpuhook hook s1 prepare` (no `-f`: the hook alone): its locked step (flock 1), the
    // look after it (flock 2), `-d` spawned (clone 1), `-d` waited for (wait4 1, 2 ms
    // apart), the limits' client spawned (clone 2), the record's lock (flock 3) and write
    // (renameat 2).
    let steps: [(&str, &str, u32); 7] = [
        ("marked, not looked at", "flock", 2),
        ("looked at, -d not spawned", "clone", 1),
        ("-d spawned", "wait4", 1),
        ("-d running", "wait4", 5),
        ("daemon up, limits not set", "clone", 2),
        ("started, not recorded", "flock", 3),
        ("recorded, not renamed", "renameat", 2),
    ];
    for (at, call, when) in steps {
        let h = mps_host();
        let share = gpus(r#"share="yes""#);
        let o = std::process::Command::new("strace")
            .args(["-e", &format!("trace={call}"), "-e"])
            .arg(format!("inject={call}:signal=SIGKILL:when={when}"))
            .arg(common::bin())
            .args(["hook", "s1", "prepare", "begin", "-"])
            .env("GPUHOOK_CONFIG", &h.config)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin
                    .take()
                    .unwrap()
                    .write_all(domain("s1", 11, &share).as_bytes())?;
                c.wait_with_output()
            })
            .expect("strace");
        let err = common::stderr(&o);
        assert!(err.contains("killed by SIGKILL"), "{at}: not killed: {err}");
        let dir = h.state.parent().unwrap().join("mps");
        // The next sharer sweeps what was left and starts (or keeps) one daemon.
        assert_ok(&h.hook("s2", "prepare", &domain("s2", 12, &share)));
        let (pid, d) = daemon(&h).expect("a daemon recorded");
        assert!(d.starts_with(&dir), "{at}");
        assert!(alive(pid), "{at}");
        let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let running = started_for(&d.join("pipe"));
            if running == [pid] {
                break;
            }
            assert!(
                std::time::Instant::now() < end,
                "{at}: running {running:?}, recorded {pid}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!state(&h)["mps"][GPU]
            .as_object()
            .unwrap()
            .contains_key("starting"));
        // Its sharers gone (the killed one's reservation with them), it is stopped.
        for (n, id) in [(11, "s1"), (12, "s2")] {
            assert_ok(&h.hook(id, "stopped", &domain(id, n, &share)));
        }
        wait_gone(pid);
        assert!(started_for(&d.join("pipe")).is_empty(), "{at}");
    }
}

/// A stand-in whose daemons are slow to die: its `-d` starts the stand-in's daemon, then
/// `hold-at-exit` (testbed/scripts) holds that daemon `secs` seconds at its exit, touching
/// `dying` when it begins (a SIGKILL'd MPS daemon stuck in the driver, as on a hung GPU).
fn dying_standin(dir: &Path, secs: u32) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dying = dir.join("dying");
    let attached = dir.join("attached");
    let script = dir.join("dying-mps-control");
    let hold = common::mps_standin().with_file_name("hold-at-exit");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nif [ \"$1\" = -d ]; then\n  {standin} -d || exit $?\n  pid=$(/bin/cat \"$CUDA_MPS_PIPE_DIRECTORY/{pid_file}\")\n  /usr/bin/env -i {hold} \"$pid\" {secs} {dying} {attached} </dev/null >/dev/null 2>&1 &\n  n=0\n  while [ ! -e {attached} ] && [ $n -lt 500 ]; do /bin/sleep 0.01; n=$((n+1)); done\n  [ -e {attached} ]; exit $?\nfi\nexec {standin} \"$@\"\n",
            standin = common::mps_standin().display(),
            pid_file = "nvidia-cuda-mps-control.pid",
            hold = hold.display(),
            dying = dying.display(),
            attached = attached.display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (script, dying)
}

/// `gpuhook hook NAME prepare` for `xml`, SIGKILLed (strace's fault injection) at the entry
/// of the `when`-th `call`.
fn hook_killed_at(h: &Host, name: &str, xml: &str, call: &str, when: u32) {
    let o = std::process::Command::new("strace")
        .args(["-e", &format!("trace={call}"), "-e"])
        .arg(format!("inject={call}:signal=SIGKILL:when={when}"))
        .arg(common::bin())
        .args(["hook", name, "prepare", "begin", "-"])
        .env("GPUHOOK_CONFIG", &h.config)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(xml.as_bytes())?;
            c.wait_with_output()
        })
        .expect("strace");
    let err = common::stderr(&o);
    assert!(err.contains("killed by SIGKILL"), "not killed: {err}");
}

/// Issue 39: the sweep of a killed start whose daemon takes 3 s to die holds the state lock
/// for one bounded pass, not until it is gone: another domain's `prepare` (another GPU)
/// does not wait for it; the sharer that needs the GPU waits outside the lock, then starts
/// one daemon once the old one is gone (never one beside it).
#[test]
fn a_sweep_of_a_daemon_slow_to_die_holds_no_other_prepare() {
    let t = tempfile::tempdir().unwrap();
    let (standin, dying) = dying_standin(t.path(), 3);
    let h = slow_host(&standin);
    let share = gpus(r#"share="yes""#);
    let t0 = std::time::Instant::now();
    assert_ok(&h.hook("base", "prepare", &domain("base", 14, &gpus(""))));
    eprintln!("a prepare alone: {:?}", t0.elapsed());
    // s1's hook killed once its daemon runs, before it is recorded (its third `flock`).
    hook_killed_at(&h, "s1", &domain("s1", 11, &share), "flock", 3);
    let mark = state(&h)["mps"][GPU].clone();
    assert_eq!(mark["starting"], true, "{mark}");
    let dir = PathBuf::from(mark["dir"].as_str().unwrap());
    let old = started_for(&dir.join("pipe"));
    assert_eq!(old.len(), 1, "{old:?}");
    std::thread::scope(|s| {
        let second = s.spawn(|| h.hook("s2", "prepare", &domain("s2", 12, &share)));
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !dying.exists() {
            assert!(
                std::time::Instant::now() < end,
                "the old daemon was never killed"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let t0 = std::time::Instant::now();
        assert_ok(&h.hook("other", "prepare", &domain("other", 13, &gpus(""))));
        let took = t0.elapsed();
        eprintln!("another domain's prepare beside the sweep: {took:?}");
        assert!(
            took < std::time::Duration::from_secs(1),
            "another domain's prepare waited {took:?} behind the sweep of a daemon slow to die"
        );
        assert!(alive(old[0]), "the old daemon is still dying");
        assert_ok(&second.join().unwrap());
    });
    let (pid, d) = daemon(&h).expect("a daemon recorded");
    assert_eq!(d, dir);
    assert!(!alive(old[0]) && alive(pid) && pid != old[0]);
    assert_eq!(started_for(&dir.join("pipe")), [pid]);
    assert_eq!(starts(&dir), 2);
    for (n, id) in [(12, "s2"), (11, "s1")] {
        assert_ok(&h.hook(id, "stopped", &domain(id, n, &share)));
    }
    wait_gone(pid);
}

/// Issue 39's hostile review: the last sharer's free marks its daemon `stopping` under the
/// state lock and tells it to quit after the lock; here the daemon takes 12 s to exit (held
/// at its exit, longer than the 10 s a quit is waited for), so the free kills it and leaves
/// it marked. Meanwhile another domain's `prepare` (another GPU) is not held (the base
/// binary waited the whole quit under the lock: 10 s); a new sharer of the GPU waits,
/// outside the lock, for the old daemon to be gone, then starts one daemon, never one
/// beside it.
#[test]
fn a_slow_quit_holds_no_other_prepare() {
    let t = tempfile::tempdir().unwrap();
    let (standin, dying) = dying_standin(t.path(), 12);
    let h = slow_host(&standin);
    let share = gpus(r#"share="yes""#);
    assert_ok(&h.hook("s1", "prepare", &domain("s1", 11, &share)));
    let (old, dir) = daemon(&h).expect("a daemon recorded");
    std::thread::scope(|s| {
        let stopped = s.spawn(|| {
            let t0 = std::time::Instant::now();
            let o = h.hook("s1", "stopped", &domain("s1", 11, &share));
            (o, t0.elapsed())
        });
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !dying.exists() {
            assert!(
                std::time::Instant::now() < end,
                "the daemon was never told to quit"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let t0 = std::time::Instant::now();
        assert_ok(&h.hook("other", "prepare", &domain("other", 13, &gpus(""))));
        let took = t0.elapsed();
        eprintln!("another domain's prepare beside a slow quit: {took:?}");
        assert!(
            took < std::time::Duration::from_secs(1),
            "another domain's prepare waited {took:?} behind the quit of a daemon slow to exit"
        );
        // Marked while it dies.
        let mark = state(&h)["mps"][GPU].clone();
        assert_eq!(mark["proc"]["pid"], old, "{mark}");
        assert!(mark["stopping"].is_object(), "{mark}");
        assert!(alive(old), "the old daemon is still dying");
        // A new sharer waits for it to be gone (outside the lock), then starts one.
        let t0 = std::time::Instant::now();
        assert_ok(&h.hook("s2", "prepare", &domain("s2", 12, &share)));
        eprintln!("a new sharer's prepare beside it: {:?}", t0.elapsed());
        assert!(!alive(old));
        let (o, took) = stopped.join().unwrap();
        assert_ok(&o);
        eprintln!("the last sharer's stopped: {took:?}");
    });
    let (pid, d) = daemon(&h).expect("a daemon recorded");
    assert_eq!(d, dir);
    assert!(pid != old && alive(pid));
    assert_eq!(started_for(&dir.join("pipe")), [pid]);
    assert!(!state(&h)["mps"][GPU]
        .as_object()
        .unwrap()
        .contains_key("stopping"));
    assert_ok(&h.hook("s2", "stopped", &domain("s2", 12, &share)));
}
