//! MPS sharing (SPEC "Sharing", MPS) through the real binary on a fake host, with the test
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
