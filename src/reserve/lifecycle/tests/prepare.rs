//! The lifecycle tests of `prepare` and OCI `create`, `confirm`, over the fake host of [`super`].

use super::*;

#[test]
fn reserve_confirm_activate_free_in_memory() {
    let h = host();
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let who = holder(&idmap);
    h.with(&fake, |f| prepare_by_parent(f, &who, &req(2)))
        .unwrap();
    let gpus = h.state().reservations[ID].gpus.clone();
    assert_eq!(gpus.len(), 2);
    h.with(&fake, |f| confirm(f, &who, &req(2))).unwrap();
    h.with(&fake, |f| activate(f, &who, &req(2), found))
        .unwrap();
    // A reserve again with the same request keeps the GPUs.
    h.with(&fake, |f| prepare_by_parent(f, &who, &req(2)))
        .unwrap();
    assert_eq!(h.state().reservations[ID].gpus, gpus);
    assert!(free_held(&h.cfg, HolderKind::Oci, ID).unwrap().is_none());
    assert!(free_held(&h.cfg, HolderKind::Libvirt, ID)
        .unwrap()
        .is_some());
    assert!(h.state().reservations.is_empty());
}

#[test]
fn reserve_reclaims_a_stale_reservation_only_when_needed() {
    let h = host();
    let gone = ProcRef {
        pid: 6161,
        start_time: 1,
    };
    let all: Vec<Unit> = (0..8).map(pci).collect();
    h.seed(OTHER, "web2", &all, Phase::Running, Some(gone));
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    h.with(&fake, |f| prepare_by_parent(f, &holder(&idmap), &req(1)))
        .unwrap();
    let st = h.state();
    assert!(!st.reservations.contains_key(OTHER));
    assert_eq!(st.reservations[ID].gpus.len(), 1);
}

#[test]
fn oci_reserve_is_held_by_the_create_that_made_it() {
    let h = host();
    let me = h.this_process();
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let who = oci_holder(&idmap);
    let (Given { nodes: specs, .. }, by) =
        h.with(&fake, |f| prepare_oci(f, &who, &req(1))).unwrap();
    // The token its hooks carry is this process, as the fake /proc knows it.
    assert_eq!(by, me);
    let r = h.state().reservations["ctr1"].clone();
    assert_eq!(
        (r.kind(), r.phase, r.prepared_by),
        (HolderKind::Oci, Phase::Prepared, Some(me))
    );
    assert_eq!(r.nodes, as_nodes(&specs));
    assert_eq!(r.gpus.len(), 1);
    // The same create again keeps its GPU; another live create of the ID is refused.
    h.with(&fake, |f| prepare_oci(f, &who, &req(1))).unwrap();
    assert_eq!(h.state().reservations["ctr1"].gpus, r.gpus);
    let other = ProcRef {
        pid: 4300,
        start_time: 900,
    };
    h.process(other, 1);
    Store::new(&h.cfg.state_file)
        .update(|st| {
            st.reservations.get_mut("ctr1").unwrap().prepared_by = Some(other);
            Ok::<_, Error>(())
        })
        .unwrap();
    let e = h
        .with(&fake, |f| prepare_oci(f, &who, &req(1)))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "another create of this container ID holds GPUs {} (runtime pid 4300)",
            r.gpus[0]
        )
    );
    // A libvirt domain may not take the OCI container's key.
    let e = h
        .with(&fake, |f| {
            prepare_by_parent(f, &holder_with_id(&idmap, "ctr1"), &req(1))
        })
        .unwrap_err();
    assert!(e.to_string().contains("ctr1"), "{e}");
}

/// A VM defined with an LXC domain's UUID is a holder of its own: a reservation under its own
/// key (`vm:UUID`), beside the domain's, which it neither reaches nor changes.
#[test]
fn a_vm_with_a_domains_uuid_has_its_own_reservation() {
    let h = host();
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    h.with(&fake, |f| prepare_by_parent(f, &holder(&idmap), &req(1)))
        .unwrap();
    let domains = h.state().reservations[ID].clone();
    let vm = Holder::vm("web1", ID);
    h.with(&fake, |f| prepare_by_parent(f, &vm, &req(1)))
        .unwrap();
    let st = h.state();
    assert_eq!(st.reservations[ID], domains);
    let key = format!("vm:{ID}");
    let theirs = &st.reservations[key.as_str()];
    assert_eq!((theirs.kind(), theirs.nodes.len()), (HolderKind::Vm, 0));
    assert_ne!(theirs.gpus, domains.gpus);
    // Each one's free frees its own.
    h.with(&fake, |f| free_key(f, &vm.key)).unwrap();
    assert_eq!(h.state().reservations.keys().count(), 1);
    assert_eq!(h.state().reservations[ID], domains);
}

#[test]
fn mig_reserve_and_activate_give_the_instances_capabilities() {
    use crate::reserve::alloc::tests::with_migs;
    let mut h = host();
    h.inv.gpus[0] = with_migs(h.inv.gpus[0].clone(), &[(1, 0), (2, 0), (2, 1)]);
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let mut r = req(2);
    r.mig = true;
    h.with(&fake, |f| prepare_by_parent(f, &holder(&idmap), &r))
        .unwrap();
    let gpus = h.state().reservations[ID].gpus.clone();
    assert!(
        gpus.iter().all(|u| u.is_mig() && u.pci() == pci(0).pci()),
        "{gpus:?}"
    );
    assert_eq!(gpus.len(), 2);
    h.with(&fake, |f| activate(f, &holder(&idmap), &r, found))
        .unwrap();
    let calls = fake.calls();
    // The parent GPU's node and each instance's GPU-instance and compute-instance
    // capabilities are granted and made.
    for cap in gpus.iter().flat_map(|u| {
        let (gi, ci) = (u.gi().unwrap(), u.to_string());
        let ci: u32 = ci.rsplit("/ci").next().unwrap().parse().unwrap();
        [gi * 9, gi * 9 + 1 + ci]
    }) {
        assert!(
            calls.iter().any(|c| c == &format!("allow 236:{cap}")),
            "cap {cap} not granted: {calls:?}"
        );
    }
    assert!(
        calls
            .iter()
            .any(|c| c.starts_with("create ") && c.contains("nvidia-caps")),
        "{calls:?}"
    );
    // Freed, nothing of it is left reserved.
    assert!(free_held(&h.cfg, HolderKind::Libvirt, ID)
        .unwrap()
        .is_some());
    assert!(h.state().reservations.is_empty());
}

/// An OCI container's create: its MPS directories (mounted by its runtime from config.json)
/// are recorded with the reservation, so a detach takes them back and an attach of another
/// MPS slot mounts no second set (review finding 7).
#[test]
fn oci_create_of_an_mps_sharer_records_its_directories() {
    let h = mps_host();
    h.this_process();
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let who = oci_holder(&idmap);
    h.with(&fake, |f| prepare_oci(f, &who, &shared(1))).unwrap();
    let st = h.state();
    let r = &st.reservations["ctr1"];
    let targets: Vec<&str> = r.mounts.iter().map(|m| m.target.as_str()).collect();
    assert_eq!(targets, ["/tmp/nvidia-mps", "/dev/shm"]);
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(st.mps[&pci(1).pci()].pipe()).unwrap();
    assert_eq!((r.mounts[0].dev, r.mounts[0].ino), (md.dev(), md.ino()));
}
