//! What the plugin advertises, and pods that ask for it through `resources.limits`.

use super::super::bed::{Files, KubeletBed, RunningPod};
use super::super::pods::{Container, Pod};
use super::super::EventKind;
use super::*;
use crate::fakehost::{mig_minor, CAPS_MAJOR};
use crate::FakeHost;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The dgx8-mig host's GPU shared in three slots (`gpuhook.io/gpu-shared`).
pub const SHARED_GPU: &str = "0000:9a:00.0";

/// The 8×H100 host with its three GPUs in MIG mode and one more shared in three slots;
/// `nvidia-smi` (the stand-in) names the MIG profiles.
pub fn mig_bed(files: &Files, name: &str) -> KubeletBed {
    bed(files, name, FakeHost::dgx8_mig(), |c, p| {
        c["sharing"] = json!({ SHARED_GPU: {"replicas": 3} });
        c["nvidia_smi"] = json!(crate::health::install_smi(p));
    })
}

/// NUMA node of each of the dgx8's GPUs, and its device minor.
const DGX8: [(&str, i64, u32); 8] = [
    ("0000:18:00.0", 0, 2),
    ("0000:1a:00.0", 0, 3),
    ("0000:40:00.0", 0, 0),
    ("0000:42:00.0", 0, 1),
    ("0000:9a:00.0", 1, 6),
    ("0000:9c:00.0", 1, 7),
    ("0000:c8:00.0", 1, 4),
    ("0000:ca:00.0", 1, 5),
];

/// The plugin advertises the pool's units as three kinds of resource, one device per unit
/// with its NUMA node, every one `Healthy` on an idle host: `gpuhook.io/gpu` for the whole
/// GPUs (not those in MIG mode, not the shared one), `gpuhook.io/gpu-shared` for the shared
/// GPU's three slots, and `gpuhook.io/mig-<profile>` for each MIG profile present, named
/// as the driver names it (an H100 80GB's seven 1g.10gb instances, its two 3g.40gb).
/// `GetPreferredAllocation` is offered, `PreStartContainer` not asked for.
pub fn every_resource_registers_with_ids_and_numa(files: &Files) {
    let b = mig_bed(files, "every");
    let mig = FakeHost::dgx8_mig().mig;
    let migged: BTreeSet<&str> = mig.iter().map(|(p, _)| p.as_str()).collect();
    let numa: BTreeMap<&str, i64> = DGX8.iter().map(|(p, n, _)| (*p, *n)).collect();
    // The host's four MIG profiles (1g.10gb, 2g.20gb, 3g.40gb, and a 4g.40gb split in two
    // compute instances), each registered and listed once.
    let ok = b.kubelet.shared.wait(Duration::from_secs(10), |st| {
        st.endpoints.keys().all(|r| st.devices.all.contains_key(r))
            && st.devices.all.contains_key(SHARED)
            && st
                .devices
                .all
                .keys()
                .filter(|r| r.starts_with("gpuhook.io/mig-"))
                .count()
                >= 4
    });
    assert!(ok, "resources registered: {:?}", b.registered());
    let whole: BTreeMap<String, Vec<i64>> = DGX8
        .iter()
        .filter(|(p, _, _)| !migged.contains(p) && *p != SHARED_GPU)
        .map(|(p, n, _)| (p.to_string(), vec![*n]))
        .collect();
    let listed = |r: &str| -> BTreeMap<String, (String, Vec<i64>)> {
        b.listed(r)
            .unwrap_or_else(|| panic!("{r} never listed"))
            .1
            .into_iter()
            .map(|d| (d.id, (d.health, d.numa)))
            .collect()
    };
    let gpus = listed(GPU);
    assert_eq!(
        gpus.iter()
            .map(|(id, (_, n))| (id.clone(), n.clone()))
            .collect::<BTreeMap<_, _>>(),
        whole,
        "{GPU}"
    );
    let slots = listed(SHARED);
    let want: BTreeMap<String, Vec<i64>> = (0..3)
        .map(|i| (format!("{SHARED_GPU}/slot-{i}"), vec![1]))
        .collect();
    assert_eq!(
        slots
            .iter()
            .map(|(id, (_, n))| (id.clone(), n.clone()))
            .collect::<BTreeMap<_, _>>(),
        want,
        "{SHARED}"
    );
    // MIG: every compute instance once, under its profile's resource.
    let mut units: BTreeMap<String, String> = BTreeMap::new();
    for r in b
        .registered()
        .iter()
        .filter(|r| r.starts_with("gpuhook.io/mig-"))
    {
        for (id, (h, n)) in listed(r) {
            assert_eq!(h, HEALTHY, "{r} {id}");
            let pci = id.rsplitn(3, ':').nth(2).unwrap_or("").to_string();
            assert_eq!(n, vec![numa[pci.as_str()]], "{r} {id}: NUMA");
            assert!(units.insert(id.clone(), r.clone()).is_none(), "{id} twice");
        }
    }
    let want: BTreeSet<String> = mig
        .iter()
        .flat_map(|(p, l)| {
            l.iter()
                .flat_map(move |(gi, cis)| cis.iter().map(move |ci| format!("{p}:{gi}:{ci}")))
        })
        .collect();
    assert_eq!(units.keys().cloned().collect::<BTreeSet<_>>(), want);
    for gi in 7..=13 {
        assert_eq!(
            units[&format!("0000:18:00.0:{gi}:0")],
            "gpuhook.io/mig-1g.10gb"
        );
    }
    for gi in [1, 2] {
        assert_eq!(
            units[&format!("0000:1a:00.0:{gi}:0")],
            "gpuhook.io/mig-3g.40gb"
        );
    }
    assert_eq!(units["0000:40:00.0:13:0"], "gpuhook.io/mig-1g.10gb");
    assert_eq!(units["0000:40:00.0:5:0"], "gpuhook.io/mig-2g.20gb");
    for ci in [0, 1] {
        let r = &units[&format!("0000:40:00.0:1:{ci}")];
        assert!(
            r.starts_with("gpuhook.io/mig-") && r.ends_with("4g.40gb"),
            "{r}"
        );
    }
    for (id, (h, _)) in gpus.iter().chain(slots.iter()) {
        assert_eq!(h, HEALTHY, "{id}");
    }
    // Each registration: v1beta1 options as the contract says, its socket in the directory.
    let st = b.kubelet.shared.lock();
    for e in &st.events {
        if let EventKind::Registered {
            resource,
            endpoint,
            options,
        } = &e.what
        {
            assert!(options.get_preferred_allocation_available, "{resource}");
            assert!(!options.pre_start_required, "{resource}");
            assert!(
                b.plugin_dir.join(endpoint).exists(),
                "{resource}: {endpoint}"
            );
        }
        assert!(
            !matches!(e.what, EventKind::Refused { .. }),
            "kubelet refused: {:?}",
            e.what
        );
    }
}

/// A pod with `resources.limits: {gpuhook.io/gpu: 1}`, running on the `gpuhook`
/// RuntimeClass, gets one GPU: its container opens that GPU's node, not the other's; the
/// annotation `gpuhook.io/allocation` reached the runtime; `gpuhook list --json` shows a
/// holder of kind `pod` with that allocation, held by that container, and (kubelet's word)
/// the pod's namespace/name/container. A second pod on the runtime's default handler (no
/// RuntimeClass) gets the other GPU through the `DeviceSpec`s alone, its allocation pending. A third is rejected by kubelet (none left). Both freed within
/// 10 s of their deletion.
pub fn a_gpu_pod_gets_exactly_its_gpu_with_and_without_the_runtime_class(files: &Files) {
    let mut b = bed(files, "pod", FakeHost::blueprint(), |_, _| {});
    let handler = b.cri.handler.clone();
    let a = Pod::new("gpu-a")
        .runtime_class(&handler)
        .container(Container::new("app", SLEEP).limit(GPU, 1));
    let ra = b.run_pod(&a).unwrap_or_else(|e| panic!("{e}"));
    let ga = held_by(&b, &ra, "app", GPU);
    let (oa, other) = if ga == GPU0 {
        ("195:0", "195:1")
    } else {
        ("195:1", "195:0")
    };
    let cid = ra.id("app").to_string();
    let out = b.cri.probe(&cid, &[oa, "195:255"], &[other]);
    assert!(!out.is_empty());
    let bundle = b.cri.bundle(&cid);
    let alloc = bundle["annotations"]["gpuhook.io/allocation"]
        .as_str()
        .unwrap_or_else(|| {
            panic!(
                "no gpuhook.io/allocation for the runtime: {}",
                bundle["annotations"]
            )
        })
        .to_string();
    // The pool: a pod holder, its allocation the annotation's, its container the CRI's, and,
    // once kubelet listed it, its pod and container by name.
    let h = wait_named(&b, &ga, "gpu-a");
    assert_eq!(who(&h).0, "pod", "{h}");
    assert_eq!(h["pod"]["allocation"], alloc.as_str(), "{h}");
    assert_eq!(h["pod"]["container"], cid.as_str(), "{h}");
    assert_eq!(h["pod"]["pending"], false, "{h}");

    let c = Pod::new("gpu-b").container(Container::new("app", SLEEP).limit(GPU, 1));
    let rb = b.run_pod(&c).unwrap_or_else(|e| panic!("{e}"));
    let gb = held_by(&b, &rb, "app", GPU);
    assert_ne!(ga, gb);
    let cb = rb.id("app").to_string();
    b.cri.probe(&cb, &[other, "195:255"], &[oa]);
    assert!(
        b.cri.bundle(&cb)["annotations"]["gpuhook.io/allocation"].is_null(),
        "the default handler is given no annotation: {}",
        b.cri.bundle(&cb)["annotations"]
    );
    // No gpuhook-runtime: the allocation stays the pod's, pending.
    let h = wait_named(&b, &gb, "gpu-b");
    assert_eq!(h["pod"]["pending"], true, "{h}");

    let d = Pod::new("gpu-c").container(Container::new("app", SLEEP).limit(GPU, 1));
    let e = b.kubelet.admit(&d).expect_err("a third GPU pod admitted");
    assert_eq!(
        e.0,
        "requested number of devices unavailable for gpuhook.io/gpu. Requested: 1, Available: 0"
    );
    b.delete_pod(&ra);
    b.delete_pod(&rb);
    for g in [&ga, &gb] {
        let t = b.wait_free(g, Duration::from_secs(10));
        assert!(t.is_some(), "{g} not freed in 10 s: {}", b.holder(g));
    }
}

/// The device IDs a container holds of a resource (kubelet's record); the one of them.
pub fn held_by(b: &KubeletBed, p: &RunningPod, container: &str, resource: &str) -> String {
    let ids = b
        .kubelet
        .shared
        .lock()
        .devices
        .container_devices(p.pod.uid(), container, resource)
        .unwrap_or_default();
    assert_eq!(ids.len(), 1, "{container} holds {ids:?} of {resource}");
    ids.into_iter().next().unwrap_or_default()
}

/// Waits (10 s) until the pool names the pod holding `unit` (`default/POD`, container
/// `app`), as kubelet's pod resources API told the plugin: the holder.
pub fn wait_named(b: &KubeletBed, unit: &str, pod: &str) -> serde_json::Value {
    let t = std::time::Instant::now();
    loop {
        let h = b.holder(unit);
        let p = &h["pod"];
        if p["namespace"] == "default" && p["name"] == pod && p["container_name"] == "app" {
            return h;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{unit}: the pool does not name default/{pod}/app: {h}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A pod asking for `gpuhook.io/mig-1g.10gb: 1` gets one MIG instance: its container
/// opens the parent GPU's node and the instance's two capability nodes, not another
/// instance's nor another GPU's; a pod asking for `gpuhook.io/gpu-shared: 1` gets a slot
/// of the shared GPU (its node opens). Both held by kind `pod`, both freed at deletion.
pub fn mig_and_shared_pods_get_their_units(files: &Files) {
    let mut b = mig_bed(files, "mig");
    let mig = "gpuhook.io/mig-1g.10gb";
    b.wait_registered(&[mig, SHARED], Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}"));
    let handler = b.cri.handler.clone();
    let m = Pod::new("mig-a")
        .runtime_class(&handler)
        .container(Container::new("app", SLEEP).limit(mig, 1));
    let rm = b.run_pod(&m).unwrap_or_else(|e| panic!("{e}"));
    let unit = held_by(&b, &rm, "app", mig);
    let parts: Vec<&str> = unit.rsplitn(3, ':').collect();
    let (ci, gi, pci) = (parts[0], parts[1], parts[2]);
    let (gi, ci): (u32, u32) = (gi.parse().expect("gi"), ci.parse().expect("ci"));
    let minor = DGX8
        .iter()
        .find(|(p, _, _)| *p == pci)
        .expect("a dgx8 GPU")
        .2;
    let mine = [
        format!("195:{minor}"),
        format!("{CAPS_MAJOR}:{}", mig_minor(minor, gi, None)),
        format!("{CAPS_MAJOR}:{}", mig_minor(minor, gi, Some(ci))),
    ];
    // Another 1g.10gb instance of the same GPU or of 0000:40:00.0, and a whole GPU.
    let other_gi = if (pci, gi) == ("0000:18:00.0", 8) {
        9
    } else {
        8
    };
    let others = [
        format!("{CAPS_MAJOR}:{}", mig_minor(2, other_gi, Some(0))),
        "195:1".to_string(),
    ];
    let mine: Vec<&str> = mine.iter().map(String::as_str).collect();
    let others: Vec<&str> = others.iter().map(String::as_str).collect();
    let id = rm.id("app").to_string();
    b.cri.probe(&id, &mine, &others);
    assert_eq!(
        who(&b.holder(&unit)).0,
        "pod",
        "{unit}: {}",
        b.holder(&unit)
    );

    let s = Pod::new("shared-a").container(Container::new("app", SLEEP).limit(SHARED, 1));
    let rs = b.run_pod(&s).unwrap_or_else(|e| panic!("{e}"));
    let slot = held_by(&b, &rs, "app", SHARED);
    assert!(slot.starts_with(&format!("{SHARED_GPU}/slot-")), "{slot}");
    b.cri.probe(rs.id("app"), &["195:6"], &["195:7"]);
    assert_eq!(
        who(&b.holder(&slot)).0,
        "pod",
        "{slot}: {}",
        b.holder(&slot)
    );
    b.delete_pod(&rm);
    b.delete_pod(&rs);
    for u in [&unit, &slot] {
        assert!(
            b.wait_free(u, Duration::from_secs(10)).is_some(),
            "{u} not freed: {}",
            b.holder(u)
        );
    }
}
