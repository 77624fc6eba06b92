//! Kubernetes' device plugin contract, each scenario on a bed of its own
//! ([`KubeletBed`]: one containerd, one kubelet stand-in, one gpuhook device plugin, a fake
//! GPU host). `tests/kubelet.rs` runs each as a test (containerd 1.6 here);
//! `gpuhook-testbed kubelet scenarios` runs them on any machine with the package (the Debian
//! 13 VM, containerd 1.7), printing `N passed, M failed`.
//!
//! Timing: each "within" is measured from the pool's change (the state file's modification
//! time once the command that changed it returned) to the arrival of kubelet's
//! `ListAndWatch` message that shows it.

mod health;
mod lifecycle;
mod pods;

use super::bed::{Files, KubeletBed};
use crate::FakeHost;
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, SystemTime};

pub use health::*;
pub use lifecycle::*;
pub use pods::*;

/// A scenario: its name and body (panics on failure, as a test does).
pub type Scenario = fn(&Files);

pub const SCENARIOS: &[(&str, Scenario)] = &[
    (
        "every_resource_registers_with_ids_and_numa",
        every_resource_registers_with_ids_and_numa,
    ),
    (
        "a_gpu_pod_gets_exactly_its_gpu_with_and_without_the_runtime_class",
        a_gpu_pod_gets_exactly_its_gpu_with_and_without_the_runtime_class,
    ),
    (
        "mig_and_shared_pods_get_their_units",
        mig_and_shared_pods_get_their_units,
    ),
    (
        "health_follows_a_libvirt_domain_and_a_podman_container",
        health_follows_a_libvirt_domain_and_a_podman_container,
    ),
    ("quarantine_and_recovery", quarantine_and_recovery),
    (
        "allocate_races_a_libvirt_prepare_for_the_last_gpu",
        allocate_races_a_libvirt_prepare_for_the_last_gpu,
    ),
    (
        "kubelet_restarted_the_plugin_registers_again_and_keeps_the_pool",
        kubelet_restarted_the_plugin_registers_again_and_keeps_the_pool,
    ),
    (
        "plugin_restarted_loses_nothing",
        plugin_restarted_loses_nothing,
    ),
    (
        "a_pod_deleted_before_its_container_frees_through_pod_resources",
        a_pod_deleted_before_its_container_frees_through_pod_resources,
    ),
    (
        "a_pod_deleted_before_its_container_frees_through_the_checkpoint",
        a_pod_deleted_before_its_container_frees_through_the_checkpoint,
    ),
    (
        "a_corrupt_state_file_makes_no_device_healthy",
        a_corrupt_state_file_makes_no_device_healthy,
    ),
];

pub const GPU: &str = "gpuhook.io/gpu";
pub const SHARED: &str = "gpuhook.io/gpu-shared";
/// The blueprint's two Tesla M2050.
pub const GPU0: &str = "0000:07:00.0";
pub const GPU1: &str = "0000:08:00.0";
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";
/// How soon a change of the pool must reach `ListAndWatch`.
pub const WITHIN: Duration = Duration::from_secs(1);
/// A container that runs until stopped.
pub const SLEEP: &str = "trap 'exit 0' TERM; while :; do sleep 1; done";

/// A bed kept for inspection when its scenario panics (with the logs on stderr).
pub fn bed(
    files: &Files,
    name: &str,
    fake: FakeHost,
    edit: impl FnOnce(&mut Value, &crate::HostPaths),
) -> KubeletBed {
    bed_with(files, name, fake, true, edit)
}

/// A bed, with or without the pod resources API; the plugin registered `gpuhook.io/gpu`.
pub fn bed_with(
    files: &Files,
    name: &str,
    fake: FakeHost,
    pod_resources: bool,
    edit: impl FnOnce(&mut Value, &crate::HostPaths),
) -> KubeletBed {
    let mut b = KubeletBed::new(files, name, fake, pod_resources, edit)
        .unwrap_or_else(|e| panic!("kubelet bed: {e}"));
    b.wait_registered(&[GPU], Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}"));
    b
}

/// The state file's last change.
pub fn state_changed(b: &KubeletBed) -> SystemTime {
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(&b.cri.config).expect("config")).expect("json");
    let p = Path::new(cfg["state_file"].as_str().expect("state_file"));
    std::fs::metadata(p)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

impl KubeletBed {
    /// The first `ListAndWatch` message since `since` that lists `id` of `resource` with
    /// `health`: when it came; `None` when none came within `limit`.
    pub fn first_listed(
        &self,
        resource: &str,
        id: &str,
        health: &str,
        since: SystemTime,
        limit: Duration,
    ) -> Option<SystemTime> {
        let mut at = None;
        self.kubelet.shared.wait(limit, |st| {
            at = st.events.iter().find_map(|e| match &e.what {
                super::EventKind::Listed {
                    resource: r,
                    devices,
                } if r == resource
                    && e.at >= since
                    && devices.iter().any(|d| d.id == id && d.health == health) =>
                {
                    Some(e.at)
                }
                _ => None,
            });
            at.is_some()
        });
        at
    }

    /// Asserts that `id` of `resource` is listed with `health` within [`WITHIN`] of the
    /// pool's change (`changed`), looking at the messages since `since`: the delay.
    pub fn assert_health_within(
        &self,
        resource: &str,
        id: &str,
        health: &str,
        since: SystemTime,
        changed: SystemTime,
        what: &str,
    ) -> Duration {
        let at = self
            .first_listed(resource, id, health, since, WITHIN + Duration::from_secs(4))
            .unwrap_or_else(|| {
                panic!(
                    "{what}: kubelet never saw {resource} {id} {health} (last list: {:?})",
                    self.listed(resource)
                )
            });
        let late = at.duration_since(changed).unwrap_or_default();
        assert!(
            late <= WITHIN,
            "{what}: {resource} {id} reached kubelet {health} {late:?} after the pool changed (over {WITHIN:?})"
        );
        late
    }

    /// Each device of `resource` kubelet knows now: ID → health.
    pub fn health(&self, resource: &str) -> std::collections::BTreeMap<String, String> {
        self.listed(resource)
            .map(|(_, d)| d.into_iter().map(|d| (d.id, d.health)).collect())
            .unwrap_or_default()
    }

    /// Who holds `unit` (a PCI address, a MIG ID, a slot ID) per `gpuhook list --json`: its
    /// holder object, `Null` when free.
    pub fn holder(&self, unit: &str) -> Value {
        holder_in(&self.list(), &list_id(unit))
    }

    /// Waits until `unit` is free (`limit` at most): how long it took.
    pub fn wait_free(&self, unit: &str, limit: Duration) -> Option<Duration> {
        let t = std::time::Instant::now();
        while t.elapsed() < limit {
            if self.holder(unit).is_null() {
                return Some(t.elapsed());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }
}

/// The holder of `unit` in a `list --json` answer.
pub fn holder_in(list: &Value, unit: &str) -> Value {
    for g in list["gpus"].as_array().into_iter().flatten() {
        if g["pci"] == unit {
            return g["holder"].clone();
        }
        for m in g["migs"].as_array().into_iter().flatten() {
            if m["id"] == unit {
                return m["holder"].clone();
            }
        }
        for s in g["sharing"]["holders"].as_array().into_iter().flatten() {
            if s["slot"] == unit {
                return s.clone();
            }
        }
    }
    Value::Null
}

/// The holder's kind and name.
pub fn who(h: &Value) -> (String, String) {
    (
        h["kind"].as_str().unwrap_or("").to_string(),
        h["domain"].as_str().unwrap_or("").to_string(),
    )
}

/// The one line a refusal must be: no line break inside.
pub fn assert_one_line(what: &str, text: &str) {
    assert!(
        !text.trim_end().contains('\n'),
        "{what}: not one line: {text:?}"
    );
}

/// A device ID the plugin advertises, as `gpuhook list --json` names the unit: a MIG unit's
/// `PCI:GI:CI` is `PCI/giGI/ciCI` there, a slot's `PCI/slot-N` is `PCI/slotN`.
pub fn list_id(id: &str) -> String {
    if let Some((pci, n)) = id.split_once("/slot-") {
        return format!("{pci}/slot{n}");
    }
    // 0000:18:00.0:7:0 — the PCI address has two colons of its own.
    let parts: Vec<&str> = id.split(':').collect();
    if parts.len() == 5 {
        return format!(
            "{}:{}:{}/gi{}/ci{}",
            parts[0], parts[1], parts[2], parts[3], parts[4]
        );
    }
    id.to_string()
}
