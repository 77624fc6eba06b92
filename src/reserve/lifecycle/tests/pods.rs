//! kubelet's door over the fake host of [`super`]: `Allocate` (reserve for a pod, refuse in
//! one line naming the holder, take over from a pod kubelet gave up), kubelet's word (name,
//! free what it no longer lists or never listed, give a gone container's units back), and a
//! container created with `gpuhook.io/allocation` (`pod_create`: bound to its pod, refused to
//! another, its units back to the pod at its removal).

use super::*;
use crate::request::oci::CriPod;
use crate::reserve::pods::{self, KubeletSource, KubeletView, PodDevices, Profiles, Resource};
use crate::reserve::state::{HolderId, HolderKind};

fn ids(units: &[usize]) -> Vec<String> {
    units.iter().map(|i| pods::device_id(&pci(*i))).collect()
}

fn allocate(
    h: &FakeHost,
    fake: &Rc<Fake>,
    requests: &[&[usize]],
) -> Result<Vec<pods::Allocated>, pods::PodError> {
    let reqs: Vec<Vec<String>> = requests.iter().map(|r| ids(r)).collect();
    h.with(fake, |f| {
        pods::allocate(f, &Resource::Gpu, &reqs, &Profiles::default())
    })
}

fn pod_of<'a>(st: &'a State, alloc: &str) -> Option<&'a Reservation> {
    st.reservations
        .values()
        .find(|r| r.kind() == HolderKind::Pod && r.holder.name() == alloc)
}

fn cri(sandbox: &str, name: &str) -> CriPod {
    CriPod {
        sandbox: sandbox.into(),
        namespace: Some("ml".into()),
        name: Some(name.into()),
        uid: Some(format!("uid-{name}")),
        container: Some("main".into()),
    }
}

/// What kubelet lists: pod `name` (namespace `ml`), container `main`, with these units.
fn listing(name: &str, units: &[usize]) -> PodDevices {
    PodDevices {
        namespace: Some("ml".into()),
        name: Some(name.into()),
        uid: None,
        container: "main".into(),
        resource: "gpuhook.io/gpu".into(),
        ids: ids(units),
        alloc: None,
    }
}

fn now() -> i64 {
    crate::reserve::state::parse_rfc3339(&now_rfc3339()).unwrap()
}

/// `pod_create` of container `id` with allocation `alloc`, by `me`: the node paths it gets, or
/// its error's line. `keep`: the runtime is exec'ed (the guard kept); else the create fails
/// after (the guard dropped).
fn create(
    h: &FakeHost,
    fake: &Rc<Fake>,
    alloc: &str,
    id: &str,
    cri: Option<&CriPod>,
    me: ProcRef,
    keep: bool,
) -> Result<Vec<String>, String> {
    let idmap = IdMap::default();
    h.with(fake, |f| {
        match pod_create(f, alloc, id, cri, &idmap, &Request::default(), me) {
            Ok(c) => {
                let paths = c.nodes.iter().map(|n| n.path.clone()).collect();
                if keep {
                    std::mem::forget(c);
                } else {
                    drop(c);
                }
                Ok(paths)
            }
            Err(e) => Err(e.to_string()),
        }
    })
}

#[test]
fn allocate_reserves_each_container_apart_or_nothing() {
    let h = host();
    let fake = h.fake(Fake::default());
    let made = allocate(&h, &fake, &[&[0], &[1, 2]]).unwrap();
    assert_eq!(made.len(), 2);
    assert!(made.iter().all(|a| crate::ids::is_alloc_id(&a.alloc)));
    assert_ne!(made[0].alloc, made[1].alloc);
    assert_eq!(made[1].units, [pci(1), pci(2)]);
    assert_eq!(
        made[0].nodes,
        [("/dev/nvidia0".to_string(), "/dev/nvidia0".to_string())]
    );
    let st = h.state();
    let r = pod_of(&st, &made[1].alloc).unwrap();
    assert_eq!(
        (r.phase, r.gpus.clone()),
        (Phase::Prepared, vec![pci(1), pci(2)])
    );
    let p = r.holder.pod().unwrap();
    assert_eq!(
        (p.resource.as_str(), p.container.as_ref(), p.listed),
        ("gpuhook.io/gpu", None, false)
    );
    // All or nothing: the second container's unit is a domain's.
    h.other_running(&[pci(4)]);
    let e = allocate(&h, &fake, &[&[3], &[4]]).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("gpuhook.io/gpu: device 0000:14:00.0 was taken by domain 'web2' ({OTHER}) since the last ListAndWatch; nothing allocated")
    );
    assert!(h.state().holder_of(&pci(3)).is_none());
    // Unknown IDs, one twice, a unit of another resource.
    for (req, want) in [
        (
            vec![vec!["0000:99:00.0".to_string()]],
            "gpuhook.io/gpu: device 0000:99:00.0 is no longer on the host; nothing allocated",
        ),
        (
            vec![ids(&[5]), ids(&[5])],
            "gpuhook.io/gpu: device 0000:15:00.0 asked for twice",
        ),
        (
            vec![vec!["0000:15:00.0/slot-0".to_string()]],
            "gpuhook.io/gpu: no device '0000:15:00.0/slot-0' on this node",
        ),
    ] {
        let e = h
            .with(&fake, |f| {
                pods::allocate(f, &Resource::Gpu, &req, &Profiles::default())
            })
            .unwrap_err();
        assert_eq!(e.to_string(), want);
    }
}

#[test]
fn allocate_takes_over_from_a_pod_kubelet_gave_up_but_not_from_a_running_container() {
    let h = host();
    let fake = h.fake(Fake::default());
    let old = allocate(&h, &fake, &[&[0, 1]]).unwrap().remove(0);
    // kubelet gives GPU 0 anew (the old pod is gone by its books): taken over at once; the
    // old allocation keeps GPU 1.
    let new = allocate(&h, &fake, &[&[0]]).unwrap().remove(0);
    let st = h.state();
    assert_eq!(pod_of(&st, &new.alloc).unwrap().gpus, [pci(0)]);
    assert_eq!(pod_of(&st, &old.alloc).unwrap().gpus, [pci(1)]);
    // GPU 1's allocation has a running container: not taken.
    let me = h.this_process();
    h.with(&fake, |f| {
        Store::new(&f.cfg.state_file).update(|st| {
            let k = st
                .reservations
                .iter()
                .find(|(_, r)| r.holder.name() == old.alloc)
                .unwrap()
                .0
                .clone();
            let r = st.reservations.get_mut(&k).unwrap();
            if let HolderId::Pod { pod, .. } = &mut r.holder {
                pod.container = Some("ctr9".into());
            }
            r.set_running(
                crate::reserve::state::Started {
                    controller: None,
                    init: me,
                    nodes: vec![],
                    cgroup: None,
                    namespaces: None,
                },
                &now_rfc3339(),
            );
            Ok::<_, Error>(())
        })
    })
    .unwrap();
    let e = allocate(&h, &fake, &[&[1]]).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("gpuhook.io/gpu: device 0000:11:00.0 is held by pod allocation '{}…', whose container ctr9 still runs; nothing allocated", &old.alloc[..8])
    );
    // The refusal reaches the new pod's events: the other allocation's ID, the key to its
    // units, is not in it.
    assert!(!e.to_string().contains(&old.alloc));
    // A stale domain's GPU is reclaimed for kubelet.
    let gone = ProcRef {
        pid: 6262,
        start_time: 2,
    };
    h.seed(OTHER, "web2", &[pci(5)], Phase::Running, Some(gone));
    let r = allocate(&h, &fake, &[&[5]]).unwrap().remove(0);
    assert_eq!(pod_of(&h.state(), &r.alloc).unwrap().gpus, [pci(5)]);
}

/// A VM's mediated device of a GPU holds the GPU for everyone but VMs' other mediated
/// devices: kubelet's `Allocate` of that GPU whole is refused, naming the VM.
#[test]
fn allocate_refuses_a_gpu_a_vms_mediated_device_holds() {
    let h = host();
    let fake = h.fake(Fake::default());
    let mdev = crate::ids::MdevId::parse("6f1f6a4e-4c1b-4a3e-9f3e-2b0c8c1d7a01").unwrap();
    let me = h.this_process();
    h.seed(
        OTHER,
        "vm1",
        &[Unit::mdev(pci(4).pci(), mdev).unwrap()],
        Phase::Running,
        Some(me),
    );
    h.with(&fake, |f| {
        Store::new(&f.cfg.state_file).update(|st| {
            let r = st.reservations.values_mut().next().unwrap();
            r.holder = HolderId::Vm {
                name: "vm1".into(),
                uuid: OTHER.into(),
            };
            r.controller = None;
            let r = r.clone();
            st.reservations.clear();
            st.insert(r);
            Ok::<_, Error>(())
        })
    })
    .unwrap();
    let before = std::fs::read(&h.cfg.state_file).unwrap();
    let e = allocate(&h, &fake, &[&[4]]).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("gpuhook.io/gpu: device 0000:14:00.0 was taken by vm 'vm1' ({OTHER}) since the last ListAndWatch; nothing allocated")
    );
    assert_eq!(std::fs::read(&h.cfg.state_file).unwrap(), before);
}

#[test]
fn kubelets_word_names_frees_and_expires_allocations() {
    let h = host();
    let fake = h.fake(Fake::default());
    let a = allocate(&h, &fake, &[&[0], &[1], &[2]]).unwrap();
    let view = |pods: Vec<PodDevices>| KubeletView {
        source: KubeletSource::PodResources,
        pods,
    };
    // kubelet lists the first two.
    let v = view(vec![listing("trainer", &[0]), listing("eval", &[1])]);
    let notes = h
        .with(&fake, |f| pods::sync(f, Some(&v), now(), 300))
        .unwrap();
    assert_eq!(notes.len(), 2, "{notes:?}");
    let st = h.state();
    let p0 = pod_of(&st, &a[0].alloc)
        .unwrap()
        .holder
        .pod()
        .unwrap()
        .clone();
    assert_eq!(
        (p0.name.as_deref(), p0.container_name.as_deref(), p0.listed),
        (Some("trainer"), Some("main"), true)
    );
    assert_eq!(
        pod_of(&st, &a[0].alloc).unwrap().who(),
        "pod 'ml/trainer' container 'main'"
    );
    // Nothing to say again: nothing written.
    assert!(h
        .with(&fake, |f| pods::sync(f, Some(&v), now(), 300))
        .unwrap()
        .is_empty());
    // Without kubelet's word nothing is freed, even past the claim.
    assert!(h
        .with(&fake, |f| pods::sync(f, None, now() + 1000, 300))
        .unwrap()
        .is_empty());
    assert_eq!(h.state().reservations.len(), 3);
    // `eval` is gone from kubelet's list: freed; the third, never listed, only after the claim.
    let v = view(vec![listing("trainer", &[0])]);
    let notes = h
        .with(&fake, |f| pods::sync(f, Some(&v), now() + 10, 300))
        .unwrap();
    assert!(
        notes.iter().any(|n| n.contains("no longer lists its pod")),
        "{notes:?}"
    );
    assert!(pod_of(&h.state(), &a[1].alloc).is_none());
    assert!(pod_of(&h.state(), &a[2].alloc).is_some());
    let notes = h
        .with(&fake, |f| pods::sync(f, Some(&v), now() + 301, 300))
        .unwrap();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("kubelet never listed it in 300 s (kubelet_claim_s)")),
        "{notes:?}"
    );
    assert!(pod_of(&h.state(), &a[2].alloc).is_none());
    assert!(pod_of(&h.state(), &a[0].alloc).is_some());
    // The checkpoint's word: by the pod's UID.
    let cp = KubeletView::from_checkpoint(
        &br#"{"Data":{"PodDeviceEntries":[{"PodUID":"u-77","ContainerName":"main","ResourceName":"gpuhook.io/gpu","DeviceIDs":{"0":["0000:10:00.0"]}}]},"Checksum":0}"#[..],
        &|_| None,
    )
    .unwrap();
    h.with(&fake, |f| pods::sync(f, Some(&cp), now(), 300))
        .unwrap();
    assert_eq!(
        pod_of(&h.state(), &a[0].alloc)
            .unwrap()
            .holder
            .pod()
            .unwrap()
            .uid
            .as_deref(),
        Some("u-77")
    );
}

/// kubelet's checkpoint keeps a deleted pod's entry until it allocates again: pod A, deleted
/// before its container, still named with GPU 0 when kubelet gives GPU 0 to pod B. `Allocate`
/// takes it over; the checkpoint's two entries for GPU 0 are told apart by the allocation
/// each `Allocate` answer named, and B is freed once only A's stale entry names GPU 0.
#[test]
fn a_stale_checkpoint_entry_is_told_apart_by_its_allocation() {
    let h = host();
    let fake = h.fake(Fake::default());
    let a = allocate(&h, &fake, &[&[0]]).unwrap().remove(0);
    let entry = |uid: &str, alloc: &str| {
        format!(
            r#"{{"PodUID":"{uid}","ContainerName":"main","ResourceName":"gpuhook.io/gpu","DeviceIDs":{{"-1":["0000:10:00.0"]}},"AllocResp":"{alloc}"}}"#
        )
    };
    let cp = |entries: &[String]| {
        let text = format!(
            r#"{{"Data":{{"PodDeviceEntries":[{}]}},"Checksum":1}}"#,
            entries.join(",")
        );
        // The AllocResp here is the allocation's ID itself: what the plugin's decoder reads
        // out of kubelet's protobuf.
        KubeletView::from_checkpoint(text.as_bytes(), &|s| Some(s.to_string())).unwrap()
    };
    h.with(&fake, |f| {
        pods::sync(f, Some(&cp(&[entry("uid-a", &a.alloc)])), now(), 300)
    })
    .unwrap();
    // Pod A deleted; kubelet admits B for the same GPU: taken over.
    let b = allocate(&h, &fake, &[&[0]]).unwrap().remove(0);
    assert!(pod_of(&h.state(), &a.alloc).is_none());
    // The checkpoint names both (A's entry not pruned yet): B is B's.
    let v = cp(&[entry("uid-a", &a.alloc), entry("uid-b", &b.alloc)]);
    h.with(&fake, |f| pods::sync(f, Some(&v), now(), 300))
        .unwrap();
    let st = h.state();
    assert_eq!(
        pod_of(&st, &b.alloc)
            .unwrap()
            .holder
            .pod()
            .unwrap()
            .uid
            .as_deref(),
        Some("uid-b")
    );
    // kubelet writes its checkpoint anew without A; then without B too: B, listed
    // before, is freed.
    let v = cp(&[entry("uid-b", &b.alloc)]);
    h.with(&fake, |f| pods::sync(f, Some(&v), now(), 300))
        .unwrap();
    assert!(pod_of(&h.state(), &b.alloc).is_some());
    let v = cp(&[entry("uid-c", "ffffffffffffffffffffffffffffffff")]);
    h.with(&fake, |f| pods::sync(f, Some(&v), now(), 300))
        .unwrap();
    assert!(pod_of(&h.state(), &b.alloc).is_none());
}

/// A container created with the allocation holds its units (bound to its pod), runs, and at
/// its removal gives them back to the pod; a container of another pod, one with no pod, or
/// one beside a running holder is refused in one line; an unknown allocation too.
#[test]
fn a_container_with_the_allocation_holds_it_for_its_pod() {
    let h = host();
    let me = h.this_process();
    let fake = h.fake(Fake::default());
    let a = allocate(&h, &fake, &[&[3]]).unwrap().remove(0);
    let idmap = IdMap::default();
    let trainer = cri("sb1", "trainer");
    let paths = create(&h, &fake, &a.alloc, "ctr1", Some(&trainer), me, true).unwrap();
    assert_eq!(paths, ["/dev/nvidia3"]);
    let st = h.state();
    let r = pod_of(&st, &a.alloc).unwrap();
    let p = r.holder.pod().unwrap();
    assert_eq!(
        (
            p.container.as_deref(),
            p.sandbox.as_deref(),
            p.name.as_deref()
        ),
        (Some("ctr1"), Some("sb1"), Some("trainer"))
    );
    assert_eq!((r.phase, r.prepared_by), (Phase::Prepared, Some(me)));
    assert_eq!(st.container_key("ctr1"), Some(r.key()));
    // A create that fails after (its guard dropped): back to the pod, pending.
    create(&h, &fake, &a.alloc, "ctr1", Some(&trainer), me, false).unwrap();
    let st = h.state();
    let r = pod_of(&st, &a.alloc).unwrap();
    assert_eq!(
        (r.holder.pod().unwrap().container.as_deref(), r.prepared_by),
        (None, None)
    );
    assert_eq!(r.gpus, [pci(3)]);
    // A container of another pod (its sandbox), or with no pod at all: refused.
    let e = create(
        &h,
        &fake,
        &a.alloc,
        "evil",
        Some(&cri("sb2", "thief")),
        me,
        true,
    )
    .unwrap_err();
    assert_eq!(
        e,
        format!("gpuhook.io/allocation '{}' belongs to pod 'ml/trainer' container 'main', not to this container's pod 'ml/thief'", a.alloc)
    );
    let e = create(&h, &fake, &a.alloc, "evil", None, me, true).unwrap_err();
    assert_eq!(
        e,
        "gpuhook.io/allocation needs a Kubernetes pod's container (its CRI sandbox annotations are missing)"
    );
    let unknown = "ffffffffffffffffffffffffffffffff";
    let e = create(&h, &fake, unknown, "c", Some(&trainer), me, true).unwrap_err();
    assert_eq!(e, format!("gpuhook.io/allocation '{unknown}' names no allocation of this node's pool (kubelet's device plugin made none, or it was freed)"));
    assert!(pod_of(&h.state(), &a.alloc)
        .unwrap()
        .holder
        .pod()
        .unwrap()
        .container
        .is_none());
    // Created again, its init recorded (createRuntime): running, held by the container.
    create(&h, &fake, &a.alloc, "ctr2", Some(&trainer), me, true).unwrap();
    h.with(&fake, |f| {
        record_init(f, &Holder::oci("ctr2", &idmap), me, INIT, None, None)
    })
    .unwrap();
    let st = h.state();
    let r = pod_of(&st, &a.alloc).unwrap();
    assert_eq!((r.phase, r.init), (Phase::Running, Some(INIT)));
    assert!(stale_on(r, Proc { root: &h.proc }, &|_| false).is_none());
    // Another container of the same pod while it runs: refused.
    let e = create(&h, &fake, &a.alloc, "ctr3", Some(&trainer), me, true).unwrap_err();
    assert_eq!(
        e,
        format!("gpuhook.io/allocation '{}' is held by container ctr2, which still runs or is being created", a.alloc)
    );
    // Its removal (poststop): the units back to the pod, no one else's.
    let back = h
        .with(&fake, |f| {
            free_oci(f, &HolderId::Oci { id: "ctr2".into() }, |r| {
                r.prepared_by == Some(me)
            })
        })
        .unwrap()
        .unwrap();
    assert_eq!(back.kind(), HolderKind::Pod);
    let st = h.state();
    let r = pod_of(&st, &a.alloc).unwrap();
    assert_eq!(
        (
            r.phase,
            r.init,
            r.holder.pod().unwrap().container.as_deref()
        ),
        (Phase::Prepared, None, None)
    );
    assert_eq!(r.gpus, [pci(3)]);
}

/// A container that held the allocation and died without its hooks: stale; the next look
/// (a reserve that reclaims, kubelet's word) gives its units back to the pod, never to
/// another holder.
#[test]
fn a_gone_container_gives_its_units_back_to_the_pod() {
    let h = host();
    let me = h.this_process();
    let fake = h.fake(Fake::default());
    let a = allocate(&h, &fake, &[&[0, 1, 2, 3, 4, 5, 6, 7]])
        .unwrap()
        .remove(0);
    let idmap = IdMap::default();
    create(
        &h,
        &fake,
        &a.alloc,
        "ctr1",
        Some(&cri("sb1", "trainer")),
        me,
        true,
    )
    .unwrap();
    let init = ProcRef {
        pid: 7373,
        start_time: 5,
    };
    h.process(init, 1);
    h.with(&fake, |f| {
        record_init(f, &Holder::oci("ctr1", &idmap), me, init, None, None)
    })
    .unwrap();
    std::fs::remove_dir_all(h.cfg.proc.join("7373")).unwrap();
    // A domain asks for a GPU: the pool has none (the pod keeps them, whatever became of
    // its container).
    let e = h
        .with(&fake, |f| prepare_by_parent(f, &holder(&idmap), &req(1)))
        .unwrap_err();
    assert!(
        e.to_string().contains("pod 'ml/trainer' container 'main'"),
        "{e}"
    );
    assert_eq!(pod_of(&h.state(), &a.alloc).unwrap().gpus.len(), 8);
    // The plugin's next look (kubelet says nothing now): the units back to the pod, pending.
    let notes = h.with(&fake, |f| pods::sync(f, None, now(), 300)).unwrap();
    assert!(notes[0].contains("its container is gone"), "{notes:?}");
    let st = h.state();
    let r = pod_of(&st, &a.alloc).unwrap();
    assert_eq!(
        (
            r.phase,
            r.gpus.len(),
            r.holder.pod().unwrap().container.as_deref()
        ),
        (Phase::Prepared, 8, None)
    );
}

/// kubelet allocates a pod's containers at its admission, and gives an app container the
/// devices of an init container of the pod (device reuse), calling `Allocate` again: the
/// init container's allocation, taken over whole, lives on as the app container's alias, so
/// the init container (created first) still gets its own units, then the app container all.
#[test]
fn an_init_containers_allocation_reused_by_the_app_container() {
    let h = host();
    let me = h.this_process();
    let fake = h.fake(Fake::default());
    let init = allocate(&h, &fake, &[&[0]]).unwrap().remove(0);
    let app = allocate(&h, &fake, &[&[0, 1]]).unwrap().remove(0);
    let st = h.state();
    assert!(pod_of(&st, &init.alloc).is_none());
    let r = pod_of(&st, &app.alloc).unwrap();
    let aliases = &r.holder.pod().unwrap().aliases;
    assert_eq!(
        (
            aliases.len(),
            aliases[0].alloc.as_str(),
            aliases[0].units.clone()
        ),
        (1, init.alloc.as_str(), vec![pci(0)])
    );
    // The init container: its own unit only.
    let trainer = cri("sb1", "trainer");
    let paths = create(&h, &fake, &init.alloc, "ctr-init", Some(&trainer), me, true).unwrap();
    assert_eq!(paths, ["/dev/nvidia0"]);
    h.with(&fake, |f| {
        free_oci(
            f,
            &HolderId::Oci {
                id: "ctr-init".into(),
            },
            |r| r.prepared_by == Some(me),
        )
    })
    .unwrap();
    // The app container: both.
    let paths = create(&h, &fake, &app.alloc, "ctr-app", Some(&trainer), me, true).unwrap();
    assert_eq!(paths, ["/dev/nvidia0", "/dev/nvidia1"]);
    // Another pod's container naming the init container's allocation: refused.
    let e = create(
        &h,
        &fake,
        &init.alloc,
        "evil",
        Some(&cri("sb2", "thief")),
        me,
        true,
    )
    .unwrap_err();
    assert!(e.contains("belongs to pod 'ml/trainer'"), "{e}");
    // kubelet's checkpoint names the init container's entry by its allocation, the app
    // container's by its own: the app container's names the reservation.
    let text = format!(
        r#"{{"Data":{{"PodDeviceEntries":[{{"PodUID":"u1","ContainerName":"init","ResourceName":"gpuhook.io/gpu","DeviceIDs":{{"-1":["0000:10:00.0"]}},"AllocResp":"{}"}},{{"PodUID":"u1","ContainerName":"main","ResourceName":"gpuhook.io/gpu","DeviceIDs":{{"-1":["0000:10:00.0","0000:11:00.0"]}},"AllocResp":"{}"}}]}},"Checksum":1}}"#,
        init.alloc, app.alloc
    );
    let v = KubeletView::from_checkpoint(text.as_bytes(), &|s| Some(s.to_string())).unwrap();
    h.with(&fake, |f| pods::sync(f, Some(&v), now(), 300))
        .unwrap();
    let st = h.state();
    let p = pod_of(&st, &app.alloc)
        .unwrap()
        .holder
        .pod()
        .unwrap()
        .clone();
    assert_eq!(
        (p.uid.as_deref(), p.container_name.as_deref()),
        (Some("u1"), Some("main"))
    );
}
