//! The pool as kubelet sees it, over in-memory inventories and states: device IDs, resource
//! names, the health of a unit in every state of the pool, kubelet's checkpoint, nvidia-smi's
//! MIG table, and the preferred choice. (`Allocate`, kubelet's word and a container's create
//! with an allocation run over a fake host: `reserve/lifecycle/tests/pods.rs`.)

use super::*;
use crate::host::inventory::Inventory;
use crate::host::procfs::ProcRef;
use crate::ids::Unit;
use crate::reserve::alloc::tests::{dgx, with_migs};
use crate::reserve::state::{
    Draining, GpuHealth, HolderId, HolderKind, Opener, Phase, PodOf, Quarantine, Reservation, State,
};
use std::collections::BTreeMap;

fn u(s: &str) -> Unit {
    s.parse().unwrap()
}

fn inv() -> Inventory {
    Inventory {
        gpus: dgx(),
        controls: vec![],
        deferred: 0,
    }
}

const A: &str = "0123456789abcdef0123456789abcdef";

fn pod_res(alloc: &str, units: &[&str]) -> Reservation {
    Reservation {
        holder: HolderId::Pod {
            alloc: alloc.into(),
            pod: Box::new(PodOf {
                resource: "gpuhook.io/gpu".into(),
                ..PodOf::default()
            }),
        },
        phase: Phase::Prepared,
        ..Reservation::for_test(HolderKind::Libvirt, "x", "x", units)
    }
}

fn health_map(inv: &Inventory, st: &State, profiles: &Profiles) -> BTreeMap<String, Health> {
    let stale =
        |r: &Reservation| (r.holder.name() == "gone").then(|| "its init is gone".to_string());
    advertise(inv, st, profiles, &stale, &BTreeMap::new())
        .into_values()
        .flatten()
        .map(|d| (d.id, d.health))
        .collect()
}

#[test]
fn device_ids_name_units_and_nothing_else() {
    for (unit, id) in [
        ("0000:3b:00.0", "0000:3b:00.0"),
        ("0000:18:00.0/gi7/ci0", "0000:18:00.0:7:0"),
        ("0000:04:00.0/slot2", "0000:04:00.0/slot-2"),
    ] {
        assert_eq!(device_id(&u(unit)), id);
        assert_eq!(unit_of(id), Some(u(unit)), "{id}");
        assert!(id.len() <= 63);
    }
    for bad in [
        "3b:00.0",
        "0000:3B:00.0",
        "0000:18:00.0:7",
        "0000:18:00.0:x:0",
        "0000:18:00.0:+7:0",
        "0000:04:00.0/slot-",
        "0000:04:00.0/slot--1",
        "GPU-1234",
        "",
    ] {
        assert_eq!(unit_of(bad), None, "{bad}");
    }
}

#[test]
fn resources_are_named_and_socketed() {
    for (r, name, sock) in [
        (Resource::Gpu, "gpuhook.io/gpu", "gpuhook-gpu.sock"),
        (
            Resource::Shared,
            "gpuhook.io/gpu-shared",
            "gpuhook-gpu-shared.sock",
        ),
        (
            Resource::Mig("1g.10gb".into()),
            "gpuhook.io/mig-1g.10gb",
            "gpuhook-mig-1g.10gb.sock",
        ),
    ] {
        assert_eq!(r.name(), name);
        assert_eq!(r.socket(), sock);
        assert_eq!(Resource::parse(name), Some(r));
    }
    for bad in [
        "nvidia.com/gpu",
        "gpuhook.io/mig-",
        "gpuhook.io/mig-1g/10gb",
        "gpuhook.io/tpu",
    ] {
        assert_eq!(Resource::parse(bad), None, "{bad}");
    }
}

/// Health follows the pool: free or a pod's allocation, healthy; any other holder, a
/// quarantine, a reset under way, scrub pending, draining, a GPU problem, or gone, not.
#[test]
fn health_of_each_state_of_the_pool() {
    let mut inv = inv();
    let mut st = State::default();
    let gpus: Vec<String> = inv.gpus.iter().map(|g| g.pci.to_string()).collect();
    // 0: free. 1: a libvirt domain. 2: a pod's allocation. 3: a domain whose init is gone.
    st.insert(Reservation::for_test(
        HolderKind::Libvirt,
        "web1",
        "6f1c0a4e-1111-4222-8333-000000000001",
        &[&gpus[1]],
    ));
    st.insert(pod_res(A, &[&gpus[2]]));
    st.insert(Reservation::for_test(
        HolderKind::Oci,
        "gone",
        "gone",
        &[&gpus[3]],
    ));
    // 4: quarantined. 5: scrub pending. 6: draining. 7: the driver no longer lists it.
    st.quarantine.insert(
        gpus[4].clone(),
        serde_json::from_value::<Quarantine>(serde_json::json!({
            "xid": 79, "reason": "fallen off the bus", "message": "NVRM: Xid 79", "since": "2026-01-01T00:00:00Z"
        }))
        .unwrap(),
    );
    st.health.insert(
        gpus[5].clone(),
        GpuHealth {
            scrub_pending: true,
            ..GpuHealth::default()
        },
    );
    st.draining.insert(
        u(&gpus[6]),
        Draining {
            nodes: vec![],
            holders: vec![Opener {
                proc: ProcRef {
                    pid: 4711,
                    start_time: 1,
                },
                comm: "python3".into(),
            }],
            unread: vec![],
            unread_total: 0,
            after: "container 'c9'".into(),
            since: "2026-01-01T00:00:00Z".into(),
        },
    );
    inv.gpus[7].problem = Some("the nvidia driver does not list it".into());
    crate::reserve::health::apply(&mut inv, &st);
    let h = health_map(&inv, &st, &Profiles::default());
    assert_eq!(h.len(), 8);
    let word = |i: usize| h[&gpus[i]].word();
    let why = |i: usize| match &h[&gpus[i]] {
        Health::Unhealthy(w) => w.clone(),
        Health::Healthy => String::new(),
    };
    assert_eq!(
        (0..8).map(word).collect::<Vec<_>>(),
        [
            "Healthy",
            "Unhealthy",
            "Healthy",
            "Healthy",
            "Unhealthy",
            "Unhealthy",
            "Unhealthy",
            "Unhealthy"
        ]
    );
    assert_eq!(why(1), "held by domain 'web1'");
    assert!(why(4).contains("quarantined"), "{}", why(4));
    assert!(why(5).contains("scrub pending"), "{}", why(5));
    assert!(why(6).starts_with("draining: "), "{}", why(6));
    assert_eq!(why(7), "the nvidia driver does not list it");
    // An excluded GPU is not the pool's; one the host lost stays listed, unhealthy.
    inv.gpus[0].excluded = true;
    let seen: BTreeMap<Unit, Resource> = [(u(&gpus[0]), Resource::Gpu)].into();
    let all = advertise(&inv, &st, &Profiles::default(), &|_| None, &seen);
    let d0 = all[&Resource::Gpu]
        .iter()
        .find(|d| d.id == gpus[0])
        .unwrap();
    assert_eq!(d0.health, Health::Unhealthy("gone from the host".into()));
    assert_eq!(d0.numa, None);
    // A pod's allocation of a GPU the host lost: still listed.
    inv.gpus.retain(|g| g.pci != gpus[2].as_str());
    let all = advertise(&inv, &st, &Profiles::default(), &|_| None, &BTreeMap::new());
    assert!(all[&Resource::Gpu]
        .iter()
        .any(|d| d.id == gpus[2] && d.health.word() == "Unhealthy"));
}

/// A GPU in MIG mode is its instances, by profile (unknown profile: not advertised); a
/// compute instance whose GPU instance another holder uses is not free; a shared GPU is its
/// slots; every device carries its GPU's NUMA node.
#[test]
fn mig_instances_and_slots_are_resources_of_their_own() {
    let mut inv = inv();
    inv.gpus[0] = with_migs(inv.gpus[0].clone(), &[(1, 0), (1, 1), (7, 0)]);
    inv.gpus[1].sharing = Some(crate::host::config::Sharing::timeslice(3));
    let p0 = inv.gpus[0].pci;
    let mut profiles = Profiles::default();
    profiles.set(
        p0,
        vec![(1, 0), (1, 1)],
        [
            ((1, 0), "2c.4g.40gb".to_string()),
            ((1, 1), "2c.4g.40gb".to_string()),
        ]
        .into(),
    );
    let mut st = State::default();
    st.insert(Reservation::for_test(
        HolderKind::Oci,
        "c1",
        "c1",
        &[&format!("{p0}/gi1/ci1")],
    ));
    st.insert(pod_res(A, &[&format!("{}/slot1", inv.gpus[1].pci)]));
    let all = advertise(&inv, &st, &profiles, &|_| None, &BTreeMap::new());
    let mig = &all[&Resource::Mig("2c.4g.40gb".into())];
    assert_eq!(
        mig.iter()
            .map(|d| (d.id.as_str(), d.health.word()))
            .collect::<Vec<_>>(),
        [
            (format!("{p0}:1:0").as_str(), "Unhealthy"),
            (format!("{p0}:1:1").as_str(), "Unhealthy"),
        ]
    );
    assert_eq!(
        mig[0].health,
        Health::Unhealthy("held by container 'c1'".into())
    );
    assert_eq!(mig[0].numa, Some(0));
    // gi7's profile is not known: not advertised; nor is the GPU whole.
    assert!(!all
        .values()
        .flatten()
        .any(|d| d.id.starts_with(&format!("{p0}:7")) || d.id == p0.as_str()));
    let shared = &all[&Resource::Shared];
    assert_eq!(shared.len(), 3);
    assert!(
        shared.iter().all(|d| d.health == Health::Healthy),
        "{shared:?}"
    );
    assert_eq!(all[&Resource::Gpu].len(), 6);
}

#[test]
fn nvidia_smi_mig_table_gives_each_instances_profile() {
    let table = "\
+--------------------------------------------------------------------+
| Compute instances:                                                 |
| GPU     GPU       Name             Profile   Instance   Placement  |
|       Instance                       ID        ID       Start:Size |
|         ID                                                         |
|====================================================================|
|   0      1       MIG 2c.4g.40gb        1         0          0:2     |
+--------------------------------------------------------------------+
|   0      1       MIG 2c.4g.40gb        1         1          2:2     |
+--------------------------------------------------------------------+
|   0      13      MIG 1g.10gb           0         0          0:1     |
+--------------------------------------------------------------------+
";
    let m = profiles::parse_lci(table);
    assert_eq!(
        m,
        [
            ((1, 0), "2c.4g.40gb".to_string()),
            ((1, 1), "2c.4g.40gb".to_string()),
            ((13, 0), "1g.10gb".to_string())
        ]
        .into()
    );
    assert!(profiles::parse_lci("No MIG-enabled devices found.\n").is_empty());
    assert!(profiles::parse_lci("|   0   1   MIG  BAD/NAME  1  0  0:1 |").is_empty());
}

#[test]
fn profiles_are_read_once_per_layout() {
    let mut inv = inv();
    inv.gpus[0] = with_migs(inv.gpus[0].clone(), &[(7, 0)]);
    let reads = std::cell::Cell::new(0);
    let read = |_: crate::ids::Pci| {
        reads.set(reads.get() + 1);
        Ok([((7, 0), "1g.10gb".to_string())].into())
    };
    let mut p = Profiles::default();
    assert!(p.refresh(&inv.gpus, &read).is_empty());
    assert!(p.refresh(&inv.gpus, &read).is_empty());
    assert_eq!(reads.get(), 1);
    assert_eq!(
        p.of(&u(&format!("{}/gi7/ci0", inv.gpus[0].pci))),
        Some("1g.10gb")
    );
    inv.gpus[0] = with_migs(inv.gpus[0].clone(), &[(7, 0), (8, 0)]);
    let fail = |_: crate::ids::Pci| Err("nvidia-smi: no such file".to_string());
    let unknown = p.refresh(&inv.gpus, &fail);
    assert_eq!(
        unknown[0].to_string(),
        format!(
            "MIG profiles of GPU {} unknown (its instances are not advertised): nvidia-smi: no such file",
            inv.gpus[0].pci
        )
    );
    assert_eq!(p.of(&u(&format!("{}/gi7/ci0", inv.gpus[0].pci))), None);
}

#[test]
fn kubelets_checkpoint_in_both_forms() {
    let new = br#"{"Data":{"PodDeviceEntries":[
        {"PodUID":"u1","ContainerName":"main","ResourceName":"gpuhook.io/gpu","DeviceIDs":{"0":["0000:3b:00.0"],"1":["0000:af:00.0"]},"AllocResp":"CgA="},
        {"PodUID":"u2","ContainerName":"side","ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":["GPU-x"]},"AllocResp":""}
      ],"RegisteredDevices":{"gpuhook.io/gpu":["0000:3b:00.0","0000:af:00.0"]}},"Checksum":2718281828}"#;
    let v = KubeletView::from_checkpoint(new, &|_| None).unwrap();
    assert_eq!(v.source, KubeletSource::Checkpoint);
    assert_eq!(v.pods[0].uid.as_deref(), Some("u1"));
    assert_eq!(v.pods[0].container, "main");
    assert_eq!(v.pods[0].ids, ["0000:3b:00.0", "0000:af:00.0"]);
    assert_eq!(v.pods[1].resource, "nvidia.com/gpu");
    let old = br#"{"Data":{"PodDeviceEntries":[{"PodUID":"u1","ContainerName":"c","ResourceName":"gpuhook.io/gpu","DeviceIDs":["0000:3b:00.0"],"AllocResp":""}],"RegisteredDevices":{}},"Checksum":1}"#;
    assert_eq!(
        KubeletView::from_checkpoint(old, &|_| None).unwrap().pods[0].ids,
        ["0000:3b:00.0"]
    );
    assert!(KubeletView::from_checkpoint(b"{\"Data\":{}}", &|_| None)
        .unwrap_err()
        .to_string()
        .contains("no Data.PodDeviceEntries"));
    assert!(KubeletView::from_checkpoint(b"\x00garbage", &|_| None).is_err());
}

/// GetPreferredAllocation: gpuhook's topology choice among what kubelet offers (one NUMA
/// node), slots on different GPUs; what it cannot choose from, kubelet's order.
#[test]
fn preferred_choice_keeps_to_one_numa_node() {
    let mut inv = inv();
    let st = State::default();
    let ids: Vec<String> = inv.gpus.iter().map(|g| g.pci.to_string()).collect();
    // Offered: GPU 3 (NUMA 0) and 4, 5, 6 (NUMA 1): two of one node.
    let offer = vec![
        ids[3].clone(),
        ids[4].clone(),
        ids[5].clone(),
        ids[6].clone(),
    ];
    let got = preferred(&inv, &st, &Resource::Gpu, &offer, &[], 2);
    assert_eq!(got, [ids[4].clone(), ids[5].clone()]);
    // What it must include comes first.
    let got = preferred(&inv, &st, &Resource::Gpu, &offer, &[ids[3].clone()], 2);
    assert_eq!(got[0], ids[3]);
    assert_eq!(got.len(), 2);
    // Slots: one per GPU.
    inv.gpus[0].sharing = Some(crate::host::config::Sharing::timeslice(2));
    inv.gpus[1].sharing = Some(crate::host::config::Sharing::timeslice(2));
    let slots: Vec<String> = ["/slot-0", "/slot-1"]
        .iter()
        .flat_map(|s| [format!("{}{s}", ids[0]), format!("{}{s}", ids[1])])
        .collect();
    let got = preferred(&inv, &st, &Resource::Shared, &slots, &[], 2);
    let gpus: std::collections::BTreeSet<_> =
        got.iter().map(|i| unit_of(i).unwrap().pci()).collect();
    assert_eq!(gpus.len(), 2, "{got:?}");
}
