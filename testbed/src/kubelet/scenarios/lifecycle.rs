//! Restarts of kubelet and of the plugin, and pods that go before their containers exist.

use super::super::bed::{Files, KubeletBed};
use super::super::pods::{Container, Pod};
use super::super::EventKind;
use super::health::{domain_xml, hook};
use super::*;
use crate::FakeHost;
use kubelet_api::v1beta1 as api;
use std::time::{Duration, Instant, SystemTime};

/// Holder of each of the blueprint's GPUs: (kind, name), empty when free.
fn holders(b: &KubeletBed) -> Vec<(String, String)> {
    [GPU0, GPU1].iter().map(|g| who(&b.holder(g))).collect()
}

/// The registrations of `resource` since `since`.
fn registrations_since(b: &KubeletBed, resource: &str, since: SystemTime) -> Vec<SystemTime> {
    b.kubelet
        .shared
        .lock()
        .events
        .iter()
        .filter(|e| e.at >= since)
        .filter_map(|e| match &e.what {
            EventKind::Registered { resource: r, .. } if r == resource => Some(e.at),
            _ => None,
        })
        .collect()
}

/// Two pods hold the blueprint's GPUs: one running on the `gpuhook` RuntimeClass, one
/// admitted whose container is not created yet.
fn two_pods(b: &mut KubeletBed) -> (Pod, super::super::bed::RunningPod, Pod) {
    let handler = b.cri.handler.clone();
    let a = Pod::new("keep-a")
        .runtime_class(&handler)
        .container(Container::new("app", SLEEP).limit(GPU, 1));
    let ra = b.run_pod(&a).unwrap_or_else(|e| panic!("{e}"));
    let p = Pod::new("keep-b").container(Container::new("app", SLEEP).limit(GPU, 1));
    b.kubelet.admit(&p).unwrap_or_else(|e| panic!("{e}"));
    (a, ra, p)
}

/// kubelet restarted (its sockets removed, `kubelet.sock` made anew, its state read back from
/// its checkpoint): the plugin registers again within 5 s; the pool keeps both pods'
/// reservations, both GPUs `Healthy` (held through the plugin's allocations); kubelet, from
/// its checkpoint, gives neither to a third pod; the second pod's container is created after
/// the restart with its devices.
pub fn kubelet_restarted_the_plugin_registers_again_and_keeps_the_pool(files: &Files) {
    let mut b = bed(files, "krestart", FakeHost::blueprint(), |_, _| {});
    let (_a, ra, p) = two_pods(&mut b);
    let before = holders(&b);
    assert!(before.iter().all(|(k, _)| k == "pod"), "{before:?}");
    let since = SystemTime::now();
    b.kubelet.restart().unwrap_or_else(|e| panic!("{e}"));
    let restarted = Instant::now();
    b.wait_registered(&[GPU], Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("after kubelet's restart: {e}"));
    let again = registrations_since(&b, GPU, since);
    assert!(!again.is_empty(), "{again:?}");
    eprintln!(
        "registered again {:?} after kubelet's restart",
        restarted.elapsed()
    );
    assert_eq!(holders(&b), before);
    for g in [GPU0, GPU1] {
        assert_eq!(b.health(GPU)[g], HEALTHY, "{g}");
    }
    let c = Pod::new("third").container(Container::new("app", SLEEP).limit(GPU, 1));
    let e = b.kubelet.admit(&c).expect_err("a third pod");
    assert!(e.0.ends_with("Requested: 1, Available: 0"), "{e}");
    // The admitted pod's container, after the restart: its GPU.
    let rp = b.start_pod(&p).unwrap_or_else(|e| panic!("{e}"));
    let g = super::pods::held_by(&b, &rp, "app", GPU);
    let (open, denied) = if g == GPU0 {
        ("195:0", "195:1")
    } else {
        ("195:1", "195:0")
    };
    b.cri.probe(rp.id("app"), &[open], &[denied]);
    b.delete_pod(&ra);
    b.delete_pod(&rp);
    for g in [GPU0, GPU1] {
        assert!(
            b.wait_free(g, Duration::from_secs(10)).is_some(),
            "{g}: {}",
            b.holder(g)
        );
    }
}

/// The plugin killed (SIGKILL) and started again: kubelet sees its stream end (its devices
/// unhealthy), the plugin registers again, and nothing is lost: the same holders, both GPUs
/// `Healthy` again, kubelet still gives neither away; a pod deleted while the plugin was down
/// is freed once it is back.
pub fn plugin_restarted_loses_nothing(files: &Files) {
    let mut b = bed(files, "prestart", FakeHost::blueprint(), |_, _| {});
    let (_a, ra, p) = two_pods(&mut b);
    let before = holders(&b);
    let list_before = b.list()["reservations"].clone();
    b.kill_plugin();
    let ended = b.kubelet.shared.wait(Duration::from_secs(5), |st| {
        st.events
            .iter()
            .any(|e| matches!(&e.what, EventKind::Ended { resource, .. } if resource == GPU))
    });
    assert!(ended, "kubelet did not see the plugin's stream end");
    assert!(b.kubelet.shared.lock().devices.healthy[GPU].is_empty());
    assert_eq!(
        holders(&b),
        before,
        "the pool changed while the plugin was down"
    );
    b.kubelet.delete(&p);
    let since = SystemTime::now();
    b.start_plugin().unwrap_or_else(|e| panic!("{e}"));
    let t = Instant::now();
    b.kubelet.shared.wait(Duration::from_secs(10), |st| {
        st.events.iter().any(|e| {
            e.at >= since
                && matches!(&e.what, EventKind::Registered { resource, .. } if resource == GPU)
        })
    });
    b.wait_registered(&[GPU], Duration::from_secs(1))
        .unwrap_or_else(|e| panic!("after the plugin's restart: {e}"));
    eprintln!(
        "the plugin registered again {:?} after its start",
        t.elapsed()
    );
    let ga = super::pods::held_by(&b, &ra, "app", GPU);
    assert_eq!(who(&b.holder(&ga)).0, "pod", "{}", b.holder(&ga));
    assert_eq!(b.health(GPU)[ga.as_str()], HEALTHY);
    // The pod deleted while the plugin was down: its GPU free within 10 s of the plugin's
    // return.
    let gp = if ga == GPU0 { GPU1 } else { GPU0 };
    assert!(
        b.wait_free(gp, Duration::from_secs(10)).is_some(),
        "{gp} still held: {} (before: {list_before})",
        b.holder(gp)
    );
    b.delete_pod(&ra);
    assert!(b.wait_free(&ga, Duration::from_secs(10)).is_some());
}

/// A pod admitted (the plugin's `Allocate` reserved its GPU: a holder of kind `pod`,
/// pending) and deleted before its container was created: the GPU is free within 10 s, by
/// the pod resources API's word.
pub fn a_pod_deleted_before_its_container_frees_through_pod_resources(files: &Files) {
    let b = bed(files, "deleted", FakeHost::blueprint(), |_, _| {});
    let p = Pod::new("gone").container(Container::new("app", SLEEP).limit(GPU, 1));
    b.kubelet.admit(&p).unwrap_or_else(|e| panic!("{e}"));
    let st = b.kubelet.shared.lock();
    let g = st
        .devices
        .container_devices(p.uid(), "app", GPU)
        .expect("allocated");
    drop(st);
    let g = g.into_iter().next().expect("one");
    assert_eq!(who(&b.holder(&g)).0, "pod", "{}", b.holder(&g));
    b.kubelet.delete(&p);
    let t = b
        .wait_free(&g, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("{g} not freed in 10 s: {}", b.holder(&g)));
    eprintln!("freed {t:?} after the pod's deletion (pod resources)");
}

/// Without the pod resources API, kubelet's checkpoint is the plugin's only word, and
/// kubelet does not rewrite it when a pod goes. With GPU1 held by a domain, a pod gets
/// GPU0 and is deleted before its container: the checkpoint still names it. A second pod is
/// admitted: kubelet forgets the first, picks GPU0 again and calls `Allocate` while its
/// checkpoint still names the first pod; the plugin gives GPU0 over, and kubelet's next
/// checkpoint names only the second. An `Allocate` kubelet never made (a client of the
/// plugin's socket, not kubelet) is freed after `kubelet_claim_s` (3 s here), within 10 s.
pub fn a_pod_deleted_before_its_container_frees_through_the_checkpoint(files: &Files) {
    let b = bed_with(files, "checkpoint", FakeHost::blueprint(), false, |c, _| {
        c["kubelet_claim_s"] = serde_json::json!(3);
    });
    let xml = domain_xml("kb-hold", 7, 1);
    let o = hook(&b, "kb-hold", "prepare", &xml);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let free = [GPU0, GPU1]
        .into_iter()
        .find(|g| b.holder(g).is_null())
        .expect("a free GPU");
    let held = if free == GPU0 { GPU1 } else { GPU0 };
    assert!(b
        .first_listed(
            GPU,
            held,
            UNHEALTHY,
            SystemTime::UNIX_EPOCH,
            Duration::from_secs(5)
        )
        .is_some());
    let first = Pod::new("first").container(Container::new("app", SLEEP).limit(GPU, 1));
    b.kubelet.admit(&first).unwrap_or_else(|e| panic!("{e}"));
    b.kubelet.delete(&first);
    std::thread::sleep(Duration::from_secs(2));
    let cp = b.checkpoint();
    assert!(
        cp.entries.iter().any(|e| e.pod_uid == first.uid()),
        "{cp:?}"
    );
    let second = Pod::new("second").container(Container::new("app", SLEEP).limit(GPU, 1));
    b.kubelet
        .admit(&second)
        .unwrap_or_else(|e| panic!("kubelet's second pod on {free}: {e}"));
    let cp = b.checkpoint();
    assert!(
        cp.entries.iter().all(|e| e.pod_uid == second.uid()),
        "{cp:?}"
    );
    assert_eq!(who(&b.holder(free)).0, "pod", "{}", b.holder(free));
    assert_eq!(b.health(GPU)[free], HEALTHY);

    // A reservation kubelet never made: the plugin's Allocate called by someone else.
    let o = hook(&b, "kb-hold", "release", &xml);
    assert!(o.status.success());
    let endpoint = b.kubelet.shared.lock().endpoints[GPU].endpoint.clone();
    let sock = b.plugin_dir.join(endpoint);
    let r = b.kubelet.rt.block_on(async {
        let mut c = super::super::plugin::dial(&sock).await?;
        c.allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec![held.to_string()],
            }],
        })
        .await
        .map_err(|s| s.to_string())
    });
    r.unwrap_or_else(|e| panic!("Allocate of {held} outside kubelet: {e}"));
    assert_eq!(who(&b.holder(held)).0, "pod", "{}", b.holder(held));
    let t = b
        .wait_free(held, Duration::from_secs(3 + 10))
        .unwrap_or_else(|| panic!("{held} never freed: {}", b.holder(held)));
    assert!(
        t >= Duration::from_secs(2),
        "freed before kubelet_claim_s: {t:?}"
    );
    eprintln!("an allocation kubelet never made freed after {t:?}");
}
