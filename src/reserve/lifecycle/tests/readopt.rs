//! The lifecycle tests of `reconnect`, over the fake host of [`super`].

use super::*;

#[test]
fn readopt_consistent_keeps_the_reservation_and_remakes_nodes() {
    let h = host();
    h.seed(ID, "web1", &[pci(2)], Phase::Running, Some(INIT));
    let fake = h.fake(Fake {
        allowed: RefCell::new(vec![(195, 2)]),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let r = h.with(&fake, |f| readopt(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::Consistent);
    // Already granted: not granted again; the node is made again.
    assert_eq!(fake.calls(), ["create /dev/nvidia2"]);
    let r = &h.state().reservations[ID];
    assert_eq!((r.gpus.clone(), r.init), (vec![pci(2)], Some(INIT)));
}

#[test]
fn readopt_regrants_what_the_cgroup_lost() {
    let h = host();
    h.seed(ID, "web1", &[pci(2)], Phase::Running, Some(INIT));
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let r = h.with(&fake, |f| readopt(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::Consistent);
    assert_eq!(fake.calls(), ["allow 195:2", "create /dev/nvidia2"]);
}

#[test]
fn readopt_readopts_from_the_cgroups_exact_grants() {
    let h = host();
    // The state lost it; the cgroup grants GPU 5 exactly.
    let fake = h.fake(Fake {
        allowed: RefCell::new(vec![(195, 5)]),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let r = h.with(&fake, |f| readopt(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::Consistent);
    assert_eq!(fake.calls(), ["create /dev/nvidia5"]);
    let r = &h.state().reservations[ID];
    assert_eq!(
        (r.gpus.clone(), r.phase, r.init, r.controller),
        (vec![pci(5)], Phase::Running, Some(INIT), Some(CTRL))
    );
}

#[test]
fn readopt_takes_away_grants_beyond_the_request() {
    let h = host();
    let fake = h.fake(Fake {
        allowed: RefCell::new(vec![(195, 3), (195, 6)]),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let r = h.with(&fake, |f| readopt(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::Consistent);
    assert_eq!(fake.calls(), ["deny 195:6", "create /dev/nvidia3"]);
    assert_eq!(*fake.allowed.borrow(), [(195, 3)]);
    assert_eq!(h.state().reservations[ID].gpus, [pci(3)]);
}

#[test]
fn readopt_inconsistent_when_its_gpu_is_anothers() {
    let h = host();
    h.other_running(&[pci(3)]);
    let fake = h.fake(Fake {
        allowed: RefCell::new(vec![(195, 3)]),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let r = h.with(&fake, |f| readopt(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::Inconsistent);
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    let st = h.state();
    assert!(!st.reservations.contains_key(ID));
    assert_eq!(st.reservations[OTHER].gpus, [pci(3)]);
}

#[test]
fn readopt_reclaims_a_stale_holder_of_its_gpu() {
    let h = host();
    // The other domain's init is gone (not in the fake /proc): its reservation is stale.
    let gone = ProcRef {
        pid: 6161,
        start_time: 1,
    };
    h.seed(OTHER, "web2", &[pci(3)], Phase::Running, Some(gone));
    let fake = h.fake(Fake {
        allowed: RefCell::new(vec![(195, 3)]),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let r = h.with(&fake, |f| readopt(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::Consistent);
    let st = h.state();
    assert!(!st.reservations.contains_key(OTHER));
    assert_eq!(st.reservations[ID].gpus, [pci(3)]);
}

#[test]
fn readopt_inconsistent_when_its_dev_refuses_a_node() {
    let h = host();
    h.seed(ID, "web1", &[pci(2)], Phase::Running, Some(INIT));
    let fake = h.fake(Fake {
        fail_create: Some(ContainerError::Refused(
            "/dev is not libvirt's tmpfs".into(),
        )),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let r = h.with(&fake, |f| readopt(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::Inconsistent);
    assert_eq!(
        fake.calls(),
        ["allow 195:2", "create /dev/nvidia2", "revoke 195:2"]
    );
}

#[test]
fn readopt_inconsistent_when_the_container_is_not_found() {
    let h = host();
    h.seed(ID, "web1", &[pci(2)], Phase::Running, Some(INIT));
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let r = h.with(&fake, |f| {
        readopt(f, &holder(&idmap), &req(1), || {
            Err(ContainerError::InitGone {
                pid: INIT.pid,
                cause: None,
            })
        })
    });
    assert_eq!(r, Readopted::Inconsistent);
    assert!(fake.calls().is_empty());
}

#[test]
fn readopt_leaves_it_alone_when_gpuhooks_own_files_are_broken() {
    // The inventory cannot be read.
    let h = host();
    h.seed(ID, "web1", &[pci(2)], Phase::Running, Some(INIT));
    let fake = h.fake(Fake {
        no_inventory: true,
        ..Default::default()
    });
    let idmap = IdMap::default();
    let r = h.with(&fake, |f| readopt(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::LeftAlone);
    assert!(fake.calls().is_empty());
    // The state file is not gpuhook's JSON.
    std::fs::write(&h.cfg.state_file, "{ not json").unwrap();
    let fake = h.fake(Fake::default());
    let r = h.with(&fake, |f| readopt(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::LeftAlone);
    assert!(fake.calls().is_empty());
    assert_eq!(
        std::fs::read_to_string(&h.cfg.state_file).unwrap(),
        "{ not json"
    );
}

#[test]
fn readopt_checks_the_driver_mounts_it_recorded() {
    let h = cdi_host();
    h.activated(&[pci(0)], &cdi_req(1));
    let idmap = IdMap::default();
    let fake = h.fake(Fake {
        allowed: RefCell::new(vec![(1, 3), (1, 7)]),
        ..Default::default()
    });
    let r = h.with(&fake, |f| readopt(f, &holder(&idmap), &cdi_req(1), found));
    assert_eq!(r, Readopted::Consistent);
    assert_eq!(
        fake.calls(),
        ["check 1 mount(s)", "create /dev/null /dev/full"]
    );
}

#[test]
fn readopt_keeps_a_hotplugged_reservation_as_it_is() {
    let mut h = host();
    with_controls(&mut h);
    let fake = running_on_gpu0(&h, &req(1));
    let idmap = IdMap::default();
    // Attached with graphics: the GPU and /dev/nvidia-modeset, beyond what the XML asks.
    let mut gfx = req_of(&[5]);
    gfx.capabilities.graphics = true;
    h.attach(&fake, &gfx).unwrap();
    let kept = h.state().reservations[ID].clone();
    // libvirtd restarted and the cgroup lost its grants: the XML asks for 1 GPU.
    let fake = h.fake(Fake::default());
    let r = h.with(&fake, |f| readopt(f, &holder(&idmap), &req(1), found));
    assert_eq!(r, Readopted::Consistent);
    assert_eq!(
        fake.calls(),
        [
            "allow 195:0",
            "allow 195:5",
            "allow 195:255",
            "allow 195:254",
            "create /dev/nvidia0 /dev/nvidia5 /dev/nvidiactl /dev/nvidia-modeset"
        ]
    );
    let r = &h.state().reservations[ID];
    assert_eq!(r.gpus, [pci(0), pci(5)]);
    assert!(r.hotplugged);
    let mut want = kept.nodes.clone();
    want.sort();
    let mut got = r.nodes.clone();
    got.sort();
    assert_eq!(got, want);
}
