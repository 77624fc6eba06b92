//! The lifecycle tests of `attach`, over the fake host of [`super`].

use super::*;

#[test]
fn attach_adds_to_a_running_reservation_only_the_new_nodes() {
    let mut h = host();
    with_controls(&mut h);
    let fake = running_on_gpu0(&h, &req(1));
    let got = h.attach(&fake, &req(1)).unwrap();
    assert_eq!(got.units.len(), 1);
    let u = got.units[0];
    assert_ne!(u, pci(0));
    let n = h.inv.by_unit(&u).unwrap().nodes[0].1.node.clone();
    // nvidiactl: granted and made at started, neither again (nor taken back by a rollback).
    assert_eq!(
        fake.calls(),
        [format!("allow {}", num(&n)), format!("create {}", n.path)]
    );
    assert_eq!(paths(&got.nodes), n.path);
    let r = &h.state().reservations[ID];
    assert_eq!(r.gpus, [pci(0), u]);
    assert_eq!(
        (r.phase, r.init, r.hotplugged),
        (Phase::Running, Some(INIT), true)
    );
    assert_eq!(
        r.nodes.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(),
        ["/dev/nvidia0", "/dev/nvidiactl", n.path.as_str()]
    );
    // A second attach does not take what it holds again.
    let more = h.attach(&fake, &req(2)).unwrap();
    assert!(more.units.iter().all(|m| *m != pci(0) && *m != u));
    assert_eq!(h.state().reservations[ID].gpus.len(), 4);
}

#[test]
fn attach_to_a_container_without_a_reservation_makes_a_running_one() {
    let h = host();
    let fake = h.fake(Fake::default());
    let got = h.attach(&fake, &req_of(&[3, 4])).unwrap();
    assert_eq!(got.units, [pci(3), pci(4)]);
    assert_eq!(
        fake.calls(),
        [
            "allow 195:3",
            "allow 195:4",
            "create /dev/nvidia3 /dev/nvidia4"
        ]
    );
    let r = h.state().reservations[ID].clone();
    assert_eq!(
        (r.kind(), r.phase, r.init, r.controller, r.hotplugged),
        (
            HolderKind::Libvirt,
            Phase::Running,
            Some(INIT),
            Some(CTRL),
            true
        )
    );
    assert_eq!(
        r.nodes.iter().map(num).collect::<Vec<_>>(),
        ["195:3", "195:4"]
    );
    // Its init lives: not stale; once it is gone, it is.
    let alive = |_: &str| true;
    assert_eq!(stale_on(&r, Proc { root: &h.proc }, &alive), None);
    std::fs::remove_file(h.cfg.proc.join(INIT.pid.to_string()).join("stat")).unwrap();
    assert!(stale_on(&r, Proc { root: &h.proc }, &alive).is_some());
    // A stop frees it with the rest.
    assert!(free_held(&h.cfg, HolderKind::Libvirt, ID)
        .unwrap()
        .is_some());
    assert!(h.state().reservations.is_empty());
}

#[test]
fn attach_refused_when_not_enough_units_changes_nothing() {
    let h = host();
    h.other_running(&(1..7).map(pci).collect::<Vec<_>>());
    h.seed(ID, "web1", &[pci(0)], Phase::Running, Some(INIT));
    let before = state_bytes(&h);
    let fake = h.fake(Fake::default());
    let e = h.attach(&fake, &req(2)).unwrap_err();
    assert_eq!(e.to_string(), "cannot reserve 2 GPUs: only 1 of the host's 8 matching GPUs is free: 7 held by domain 'web1', domain 'web2'");
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    assert_eq!(state_bytes(&h), before);
    // A GPU it names that another holds: that holder named.
    let e = h.attach(&fake, &req_of(&[2])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "GPU 0000:12:00.0 (index 2) is held by domain 'web2'"
    );
    assert_eq!(state_bytes(&h), before);
}

#[test]
fn attach_refused_to_a_prepared_or_other_reservation() {
    let h = host();
    h.seed(ID, "web1", &[pci(0)], Phase::Prepared, None);
    let before = state_bytes(&h);
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let attach = |r: &Request| h.attach(&fake, r).unwrap_err().to_string();
    assert_eq!(
        attach(&req(1)),
        "its GPU reservation is prepared but not running: attach gives GPUs to a running container"
    );
    assert_eq!(state_bytes(&h), before);
    // A reservation recording another init (the container restarted, reconnect did not run).
    let old = Some(ProcRef { pid: 4100, ..INIT });
    h.seed(ID, "web1", &[pci(0)], Phase::Running, old);
    let before_other = state_bytes(&h);
    assert_eq!(
        attach(&req(1)),
        "its GPU reservation records container init 4100, but its init now is 4242: not the running container (did reconnect run?)"
    );
    assert_eq!(state_bytes(&h), before_other);
    // Not running: what finding it said.
    let e = h
        .with(&fake, |f| {
            super::attach(f, &holder(&idmap), &req(1), || {
                Err(ContainerError::Other("domain is not running".into()))
            })
        })
        .unwrap_err();
    assert_eq!(e.to_string(), "domain is not running");
    // An OCI container's key.
    let e = h
        .with(&fake, |f| {
            let oci = Holder::oci(ID, &idmap);
            super::attach(f, &oci, &req(1), found)
        })
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("its id {ID} is already the key of domain 'web1''s reservation")
    );
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
}

#[test]
fn attach_rolls_back_when_a_grant_fails() {
    let h = host();
    h.seed(ID, "web1", &[pci(0)], Phase::Running, Some(INIT));
    let before = h.state().reservations[ID].nodes.clone();
    let fake = h.fake(Fake {
        fail_allow: Some(4),
        ..Default::default()
    });
    let e = h.attach(&fake, &req_of(&[3, 4])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cgroup /fake: granting /dev/nvidia4 (195:4): Operation not permitted"
    );
    assert_eq!(fake.calls(), ["allow 195:3", "allow 195:4", "revoke 195:3"]);
    assert!(fake.allowed.borrow().is_empty());
    let r = &h.state().reservations[ID];
    assert_eq!((r.gpus.clone(), r.hotplugged), (vec![pci(0)], false));
    assert_eq!(
        r.nodes, before,
        "the nodes the reserve recorded go with the units"
    );
    // A reservation the attach made is deleted.
    let h = host();
    let e = h.attach(&fake, &req_of(&[4]));
    assert!(e.is_err());
    assert!(h.state().reservations.is_empty());
}

#[test]
fn attach_rolls_back_when_a_node_cannot_be_made() {
    let h = host();
    let fake = h.fake(Fake {
        fail_create: Some(ContainerError::Refused(
            "/dev/nvidia2: a symlink is in the way".into(),
        )),
        ..Default::default()
    });
    let e = h.attach(&fake, &req_of(&[2])).unwrap_err();
    assert_eq!(e.to_string(), "/dev/nvidia2: a symlink is in the way");
    assert_eq!(
        fake.calls(),
        ["allow 195:2", "create /dev/nvidia2", "revoke 195:2"]
    );
    assert!(h.state().reservations.is_empty());
}

#[test]
fn attach_keeps_the_units_reserved_while_a_grant_could_not_be_revoked() {
    let h = host();
    let fake = h.fake(Fake {
        fail_create: Some(ContainerError::Refused("no space".into())),
        fail_revoke: true,
        ..Default::default()
    });
    let e = h.attach(&fake, &req_of(&[2])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "no space; rollback incomplete: cgroup /fake: No such file or directory; GPUs 0000:12:00.0 stay reserved for domain 'web1'"
    );
    assert!(matches!(e, Error::RollbackIncomplete { .. }), "{e:?}");
    // The container may still open it: no one else may get it.
    assert_eq!(h.state().reservations[ID].gpus, [pci(2)]);
}

#[test]
fn attach_killed_at_its_grant_leaves_the_grant_for_detach_to_take_back() {
    let h = host_with_controls();
    h.running_with(&[pci(0)], &req(1));
    let fake = h.fake(Fake {
        state_at_allow: Some(h.cfg.state_file.clone()),
        ..Default::default()
    });
    h.attach(&fake, &req_of(&[1])).unwrap();
    // Killed at the grant: the state as it found it, the grant made.
    std::fs::write(&h.cfg.state_file, fake.seen_at_allow.take().unwrap()).unwrap();
    let r = &h.state().reservations[ID];
    assert_eq!(r.gpus, [pci(0), pci(1)]);
    assert!(r.nodes.iter().any(|n| n.path == "/dev/nvidia1"), "{r:?}");
    let (fake, out) = h.detach(Fake::default(), sel(pci(1)), false);
    assert_eq!(out.unwrap().units, [pci(1)]);
    assert_eq!(denied(&fake), ["deny 195:1"]);
    assert!(!fake.allowed.borrow().contains(&(195, 1)));
    assert_eq!(h.state().reservations[ID].gpus, [pci(0)]);
}

#[test]
fn attach_whose_grant_stays_records_it_for_detach_to_take_back() {
    let h = host();
    h.in_ns(INIT.pid, CT_NS);
    let fake = h.fake(Fake {
        fail_create: Some(ContainerError::Refused("no space".into())),
        fail_revoke: true,
        ..Default::default()
    });
    assert!(h.attach(&fake, &req_of(&[2])).is_err());
    assert_eq!(*fake.allowed.borrow(), [(195, 2)]);
    let r = &h.state().reservations[ID];
    assert_eq!(r.gpus, [pci(2)]);
    assert_eq!(r.nodes.iter().map(num).collect::<Vec<_>>(), ["195:2"]);
    let (fake, out) = h.detach(Fake::default(), Which::All, false);
    assert_eq!(out.unwrap().units, [pci(2)]);
    assert_eq!(denied(&fake), ["deny 195:2"]);
}

#[test]
fn attach_leaves_the_containers_own_nodes_to_it() {
    // The container's own `--device /dev/nvidiactl` (195:255): allowed before gpuhook.
    let h = host_with_controls();
    h.in_ns(INIT.pid, CT_NS);
    let fake = h.fake(Fake {
        allowed: RefCell::new(vec![(195, 255)]),
        state_at_allow: Some(h.cfg.state_file.clone()),
        ..Default::default()
    });
    let got = h.attach(&fake, &req_of(&[3])).unwrap();
    assert_eq!(
        fake.calls(),
        [
            "allow 195:3",
            "allow 510:0",
            "create /dev/nvidia3 /dev/nvidia-uvm"
        ]
    );
    assert_eq!(paths(&got.nodes), "/dev/nvidia3 /dev/nvidia-uvm");
    let recorded = |st: &State| {
        let r = &st.reservations[ID];
        r.nodes.iter().map(num).collect::<Vec<_>>()
    };
    assert_eq!(recorded(&h.state()), ["195:3", "510:0"]);
    // Recorded before the grant (a kill there leaves them for detach), its own not.
    let seen = State::parse(&fake.seen_at_allow.take().unwrap(), "seen").unwrap();
    assert_eq!(recorded(&seen), ["195:3", "510:0"]);
    // Detach takes back only what gpuhook granted: the container keeps its nvidiactl.
    let own = Fake {
        allowed: RefCell::new(vec![(195, 255)]),
        ..Default::default()
    };
    let (fake, out) = h.detach(own, Which::All, false);
    assert_eq!(out.unwrap().units, [pci(3)]);
    assert_eq!(
        fake.calls(),
        [
            "deny 195:3",
            "deny 510:0",
            "remove /dev/nvidia3 /dev/nvidia-uvm"
        ]
    );
    assert_eq!(*fake.allowed.borrow(), [(195, 255)]);
}

#[test]
fn attach_under_a_wildcard_rule_grants_makes_and_records_none_of_its_nodes() {
    // `c 195:* rwm` of the container's own: every NVIDIA node of major 195 is its already.
    let h = host_with_controls();
    h.in_ns(INIT.pid, CT_NS);
    let wild = || Fake {
        wildcard: Some(195),
        ..Default::default()
    };
    let fake = h.fake(wild());
    let got = h.attach(&fake, &req_of(&[3])).unwrap();
    assert_eq!(got.units, [pci(3)]);
    assert_eq!(fake.calls(), ["allow 510:0", "create /dev/nvidia-uvm"]);
    let r = &h.state().reservations[ID];
    assert_eq!(r.nodes.iter().map(num).collect::<Vec<_>>(), ["510:0"]);
    // Detach takes back only the grant gpuhook made, and frees the GPU: nothing of
    // gpuhook's lets the container open it (its own rule did before gpuhook, as any GPU).
    let (fake, out) = h.detach(wild(), Which::All, false);
    assert_eq!(out.unwrap().units, [pci(3)]);
    assert_eq!(fake.calls(), ["deny 510:0", "remove /dev/nvidia-uvm"]);
}

#[test]
fn mig_attach_gives_free_instances_and_their_capabilities() {
    use crate::reserve::alloc::tests::with_migs;
    let mut h = host();
    h.inv.gpus[0] = with_migs(h.inv.gpus[0].clone(), &[(1, 0), (2, 0)]);
    let gi = |g: u32| Unit::Mig {
        pci: pci(0).pci(),
        gi: g,
        ci: 0,
    };
    let mut r = req(1);
    r.mig = true;
    h.seed(ID, "web1", &[gi(1)], Phase::Prepared, None);
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    h.with(&fake, |f| activate(f, &holder(&idmap), &r, found))
        .unwrap();
    let fake = h.fake(Fake {
        allowed: RefCell::new(fake.allowed.borrow().clone()),
        ..Default::default()
    });
    let got = h.attach(&fake, &r).unwrap();
    // Its own gi1 counts as held: gi2, with its two capabilities; the GPU's node, granted
    // and made for gi1, neither again.
    assert_eq!(got.units, [gi(2)]);
    assert_eq!(
        fake.calls(),
        [
            "allow 236:18",
            "allow 236:19",
            "create /dev/nvidia-caps/nvidia-cap18 /dev/nvidia-caps/nvidia-cap19"
        ]
    );
    assert_eq!(h.state().reservations[ID].gpus, [gi(1), gi(2)]);
    // None left: refused, naming the holder.
    let e = h.attach(&fake, &r).unwrap_err();
    assert_eq!(e.to_string(), "cannot reserve 1 MIG instance: only 0 of the host's 2 MIG instances on matching GPUs are free: held by domain 'web1'");
}

#[test]
fn attach_cdi_gives_the_new_gpus_driver_files_and_detach_takes_them_with_the_last() {
    let h = cdi_host();
    h.in_ns(INIT.pid, CT_NS);
    let fake = h.fake(Fake::default());
    h.attach(&fake, &cdi_req_of(&[0])).unwrap();
    // The GPU's node and the spec's common one granted and made, then its mount.
    assert_eq!(
        fake.calls(),
        [
            "allow 1:3",
            "allow 1:7",
            "create /dev/null /dev/full",
            &format!("inject {LIBCUDA}")
        ]
    );
    let r = &h.state().reservations[ID];
    assert_eq!(r.nodes.iter().map(num).collect::<Vec<_>>(), ["1:3", "1:7"]);
    // Recorded as made (the fake helper's identity).
    assert_eq!(mount_targets(&h), [format!("{LIBCUDA} (9:99)")]);
    // A second GPU: its node; the driver's mount is there already (no second mount).
    let fake = h.fake(Fake {
        allowed: RefCell::new(vec![(1, 3), (1, 7)]),
        ..Default::default()
    });
    h.attach(&fake, &cdi_req_of(&[1])).unwrap();
    assert_eq!(fake.calls(), ["allow 1:5", "create /dev/zero"]);
    assert_eq!(h.state().reservations[ID].gpus, [pci(0), pci(1)]);
    assert_eq!(mount_targets(&h), [format!("{LIBCUDA} (9:99)")]);
    // Detach of one: GPU 0 keeps the driver.
    let (fake, out) = h.detach(Fake::default(), sel(pci(1)), false);
    assert_eq!(out.unwrap().units, [pci(1)]);
    assert_eq!(fake.calls(), ["deny 1:5", "remove /dev/zero"]);
    assert_eq!(mount_targets(&h), [format!("{LIBCUDA} (9:99)")]);
    // Detach of the last: every node, and the driver's mount.
    let (fake, out) = h.detach(Fake::default(), sel(pci(0)), false);
    assert_eq!(out.unwrap().units, [pci(0)]);
    assert_eq!(
        fake.calls(),
        [
            "deny 1:3",
            "deny 1:7",
            "remove /dev/null /dev/full",
            &format!("uninject {LIBCUDA} (9:99)")
        ]
    );
    let r = &h.state().reservations[ID];
    assert!(
        r.gpus.is_empty() && r.nodes.is_empty() && r.mounts.is_empty(),
        "{r:?}"
    );
}

#[test]
fn attach_cdi_to_a_container_started_with_the_driver_adds_only_the_gpus_node() {
    let h = cdi_host();
    h.in_ns(INIT.pid, CT_NS);
    h.activated(&[pci(0)], &cdi_req(1));
    let fake = h.fake(Fake {
        allowed: RefCell::new(vec![(1, 3), (1, 7)]),
        ..Default::default()
    });
    h.attach(&fake, &cdi_req_of(&[1])).unwrap();
    assert_eq!(fake.calls(), ["allow 1:5", "create /dev/zero"]);
    // Detach of the GPU `started` gave: the attached one keeps the driver's mount.
    let (fake, out) = h.detach(Fake::default(), sel(pci(0)), false);
    assert_eq!(out.unwrap().units, [pci(0)]);
    assert_eq!(fake.calls(), ["deny 1:3", "remove /dev/null"]);
    assert_eq!(mount_targets(&h), [format!("{LIBCUDA} (9:99)")]);
}

#[test]
fn attach_cdi_whose_driver_files_fail_takes_everything_back() {
    let h = cdi_host();
    h.in_ns(INIT.pid, CT_NS);
    h.seed(ID, "web1", &[], Phase::Running, Some(INIT));
    let fake = h.fake(Fake {
        fail_inject: true,
        ..Default::default()
    });
    let e = h.attach(&fake, &cdi_req_of(&[0])).unwrap_err();
    assert_eq!(e.to_string(), "mount over /usr/lib: Permission denied");
    assert_eq!(
        fake.calls(),
        [
            "allow 1:3",
            "allow 1:7",
            "create /dev/null /dev/full",
            &format!("inject {LIBCUDA}"),
            "remove /dev/null /dev/full",
            "revoke 1:7",
            "revoke 1:3",
        ]
    );
    assert!(fake.allowed.borrow().is_empty());
    let r = &h.state().reservations[ID];
    assert!(
        r.gpus.is_empty() && r.nodes.is_empty() && r.mounts.is_empty(),
        "{r:?}"
    );
    assert!(!r.hotplugged);
}

#[test]
fn attach_cdi_killed_before_its_mounts_leaves_them_recorded_for_detach() {
    let h = cdi_host();
    h.in_ns(INIT.pid, CT_NS);
    let fake = h.fake(Fake {
        state_at_allow: Some(h.cfg.state_file.clone()),
        ..Default::default()
    });
    h.attach(&fake, &cdi_req_of(&[0])).unwrap();
    // Killed at the grant: the mount is recorded as planned (its source's identity), before
    // anything was granted or mounted.
    std::fs::write(&h.cfg.state_file, fake.seen_at_allow.take().unwrap()).unwrap();
    let planned = format!("{LIBCUDA} ({})", source_identity());
    assert_eq!(mount_targets(&h), std::slice::from_ref(&planned));
    let (fake, out) = h.detach(Fake::default(), Which::All, false);
    assert_eq!(out.unwrap().units, [pci(0)]);
    assert_eq!(
        fake.calls(),
        [
            "deny 1:3",
            "deny 1:7",
            "remove /dev/null /dev/full",
            &format!("uninject {planned}")
        ]
    );
    assert!(h.state().reservations[ID].mounts.is_empty());
}

/// `gpuhook attach --share`: a slot of another shared GPU, never a second of one it shares;
/// its GPU's nodes granted and made as a whole GPU's are; detached, the slot is free again.
#[test]
fn attach_share_takes_a_slot_of_another_gpu_only() {
    let mut h = host();
    let share = |n| Some(crate::host::config::Sharing::timeslice(n));
    h.inv.gpus[6].sharing = share(2);
    h.inv.gpus[7].sharing = share(2);
    let fake = running_on_gpu0(&h, &req(1));
    let shared = Request {
        share: true,
        ..req(1)
    };
    let got = h.attach(&fake, &shared).unwrap();
    let first = got.units[0];
    assert!(first.is_slot(), "{first:?}");
    let n = h.inv.by_unit(&first).unwrap().nodes[0].1.node.clone();
    assert_eq!(
        fake.calls(),
        [format!("allow {}", num(&n)), format!("create {}", n.path)]
    );
    let second = h.attach(&fake, &shared).unwrap().units[0];
    assert!(
        second.is_slot() && second.pci() != first.pci(),
        "{second:?}"
    );
    // Both shared GPUs have a slot of it: no third.
    let e = h.attach(&fake, &shared).unwrap_err().to_string();
    assert!(
        e.contains("only 0 of the host's 2 matching shared GPUs"),
        "{e}"
    );
    let mut named = shared.clone();
    named.devices = vec![crate::request::DeviceSel::Pci(first.pci().to_string())];
    let e = h.attach(&fake, &named).unwrap_err().to_string();
    assert!(e.contains("holds a slot of it already"), "{e}");
    assert_eq!(h.state().reservations[ID].gpus, [pci(0), first, second]);
}

/// `attach --share` of an MPS GPU's slot to a running container: its daemon is started and
/// its directories mounted, recorded before they are made; a container with them already
/// gets no second set.
#[test]
fn attach_of_an_mps_slot_mounts_its_daemons_directories_once() {
    let mut h = mps_host();
    h.inv.gpus[2].sharing = h.inv.gpus[1].sharing;
    let fake = running_on_gpu0(&h, &req(1));
    let got = h.attach(&fake, &shared(1)).unwrap();
    assert_eq!(got.units, [mps_slot(0)]);
    let calls = fake.calls();
    assert_eq!(calls[0], "mps start 0000:11:00.0");
    assert_eq!(calls.last().unwrap(), "inject /tmp/nvidia-mps /dev/shm");
    let targets = |h: &FakeHost| -> Vec<String> {
        h.state().reservations[ID]
            .mounts
            .iter()
            .map(|m| m.target.clone())
            .collect()
    };
    assert_eq!(targets(&h), ["/tmp/nvidia-mps", "/dev/shm"]);
    let fake2 = h.fake(Fake {
        allowed: RefCell::new(fake.allowed.borrow().clone()),
        ..Default::default()
    });
    let got = h.attach(&fake2, &shared(1)).unwrap();
    assert_eq!(got.units[0].pci(), pci(2).pci());
    assert_eq!(fake2.calls()[0], "mps start 0000:12:00.0");
    assert!(
        !fake2.calls().iter().any(|c| c.starts_with("inject")),
        "{:?}",
        fake2.calls()
    );
    assert_eq!(targets(&h), ["/tmp/nvidia-mps", "/dev/shm"]);
}

/// An attach of an MPS slot that fails (its grant) gives the slot back and stops the daemon
/// it started (review finding 9: it ran on without sharers).
#[test]
fn failed_attach_of_an_mps_slot_stops_the_daemon_it_started() {
    let h = mps_host();
    let ok = running_on_gpu0(&h, &req(1));
    let fake = h.fake(Fake {
        allowed: RefCell::new(ok.allowed.borrow().clone()),
        fail_allow: Some(1),
        ..Default::default()
    });
    h.attach(&fake, &shared(1)).unwrap_err();
    let calls = fake.calls();
    assert_eq!(
        calls.first().map(String::as_str),
        Some("mps start 0000:11:00.0")
    );
    assert_eq!(
        calls.last().map(String::as_str),
        Some("mps quit 0000:11:00.0"),
        "{calls:?}"
    );
    let st = h.state();
    assert!(st.mps.is_empty());
    assert_eq!(st.reservations[ID].gpus, [pci(0)]);
    assert!(st.reservations[ID].mounts.is_empty());
}

/// Under systemd's cgroup manager, attach lists the new nodes in the scope's policy before it
/// grants them, and says `attached` only once every rule in force lets them through.
#[test]
fn attach_tells_the_scopes_manager_before_it_grants() {
    let h = host();
    let fake = managed_on_gpu0(&h);
    let got = h.attach(&fake, &req_of(&[1])).unwrap();
    assert_eq!(got.units, [pci(1)]);
    assert_eq!(
        fake.calls(),
        ["policy allow 195:1", "allow 195:1", "create /dev/nvidia1"]
    );
    assert_eq!(
        fake.managed.borrow().clone().unwrap(),
        [(1, 3), (195, 0), (195, 1)]
    );
    // Without a manager's policy: nothing of it.
    let fake = running_on_gpu0(&h, &req(1));
    h.attach(&fake, &req_of(&[2])).unwrap();
    assert!(
        fake.calls().iter().all(|c| !c.starts_with("policy")),
        "{:?}",
        fake.calls()
    );
}

/// A manager that cannot be told refuses the attach: nothing granted, made or reserved.
#[test]
fn attach_refused_when_the_manager_cannot_be_told() {
    let h = host();
    let fake = managed_on_gpu0(&h);
    let fake = h.fake(Fake {
        allowed: RefCell::new(fake.allowed.borrow().clone()),
        managed: RefCell::new(fake.managed.borrow().clone()),
        manager_fails: true,
        ..Default::default()
    });
    let before = h.state().reservations[ID].gpus.clone();
    let e = h.attach(&fake, &req_of(&[1])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cgroup /fake.scope: Failed to connect to bus"
    );
    assert_eq!(fake.calls(), ["policy allow 195:1"]);
    assert_eq!(h.state().reservations[ID].gpus, before);
    assert_eq!(h.state().reservations[ID].nodes.len(), 1);
}

/// A node a rule in force still refuses after the grant (a program of a cgroup above): not
/// attached; grant, node and the manager's entry taken back, the unit free again.
#[test]
fn attach_that_a_rule_in_force_still_refuses_is_taken_back() {
    let h = host();
    let fake = managed_on_gpu0(&h);
    let fake = h.fake(Fake {
        allowed: RefCell::new(fake.allowed.borrow().clone()),
        managed: RefCell::new(fake.managed.borrow().clone()),
        refused_above: Some(1),
        ..Default::default()
    });
    let e = h.attach(&fake, &req_of(&[1])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cgroup /fake: /dev/nvidia1 (195:1) is still refused by a device rule in force for the container after the grant (its systemd unit fake.scope was told)"
    );
    assert_eq!(
        fake.calls(),
        [
            "policy allow 195:1",
            "allow 195:1",
            "create /dev/nvidia1",
            "remove /dev/nvidia1",
            "revoke 195:1",
            "policy restore 195:1"
        ]
    );
    assert_eq!(fake.managed.borrow().clone().unwrap(), [(1, 3), (195, 0)]);
    assert_eq!(h.state().reservations[ID].gpus, [pci(0)]);
    // Without a manager the rules are read once, and the same holds.
    let fake = h.fake(Fake {
        allowed: RefCell::new(fake.allowed.borrow().clone()),
        refused_above: Some(1),
        ..Default::default()
    });
    let e = h.attach(&fake, &req_of(&[1])).unwrap_err();
    assert!(e.to_string().ends_with("after the grant"), "{e}");
    assert_eq!(h.state().reservations[ID].gpus, [pci(0)]);
}

/// The scope's `DeviceAllow=` of an attach whose change went through but whose read-back
/// failed or timed out is put back as it was before the unit is free again (issue 39: the
/// old code freed it with the entry left, which systemd puts in force at the next reload).
#[test]
fn attach_whose_read_back_failed_restores_the_scopes_list_before_the_free() {
    for why in [
        "systemd unit fake.scope: systemctl show: exit status: 1: Failed to get properties: Connection timed out",
        "systemd unit fake.scope: systemctl show: /usr/bin/systemctl did not finish within 30s",
    ] {
        let h = host();
        let fake = managed_on_gpu0(&h);
        let fake = h.fake(Fake {
            allowed: RefCell::new(fake.allowed.borrow().clone()),
            managed: RefCell::new(fake.managed.borrow().clone()),
            manager_script: RefCell::new([Told::Unsure(why)].into()),
            ..Default::default()
        });
        let e = h.attach(&fake, &req_of(&[1])).unwrap_err();
        assert_eq!(e.to_string(), format!("cgroup /fake.scope: {why}"));
        // Restored, then freed: nothing granted or made.
        assert_eq!(
            fake.calls(),
            ["policy allow 195:1", "policy restore 195:1"]
        );
        assert_eq!(fake.managed.borrow().clone().unwrap(), [(1, 3), (195, 0)]);
        let r = &h.state().reservations[ID];
        assert_eq!(r.gpus, [pci(0)]);
        assert_eq!(r.nodes.len(), 1);
    }
}

/// A restore that fails too (systemd cannot be reached any more): the scope may still list
/// the unit's node, so the unit stays reserved for the container (listed as its), and the one
/// line says so; a later detach takes it back.
#[test]
fn attach_whose_restore_failed_keeps_the_unit_reserved() {
    let h = host();
    let fake = managed_on_gpu0(&h);
    let fake = h.fake(Fake {
        allowed: RefCell::new(fake.allowed.borrow().clone()),
        managed: RefCell::new(fake.managed.borrow().clone()),
        manager_script: RefCell::new(
            [
                Told::Unsure("systemctl show: Connection timed out"),
                Told::Lost("Failed to connect to bus"),
            ]
            .into(),
        ),
        ..Default::default()
    });
    let e = h.attach(&fake, &req_of(&[1])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cgroup /fake.scope: systemctl show: Connection timed out; rollback incomplete: systemd unit fake.scope: cgroup /fake.scope: Failed to connect to bus (it may still list 195:1); GPUs 0000:11:00.0 stay reserved for domain 'web1'"
    );
    assert_eq!(fake.calls(), ["policy allow 195:1", "policy restore 195:1"]);
    // Listed by the scope still; never granted or made here, but held: no one else gets it.
    assert_eq!(
        fake.managed.borrow().clone().unwrap(),
        [(1, 3), (195, 0), (195, 1)]
    );
    let r = &h.state().reservations[ID];
    assert_eq!(r.gpus, [pci(0), pci(1)]);
    assert!(r.nodes.iter().any(|n| (n.major, n.minor) == (195, 1)));
    // A detach takes it back: out of the scope's list, then freed.
    h.in_ns(INIT.pid, CT_NS);
    let (fake, out) = h.detach(
        Fake {
            managed: RefCell::new(fake.managed.borrow().clone()),
            ..Default::default()
        },
        sel(pci(1)),
        false,
    );
    assert_eq!(out.unwrap().units, [pci(1)]);
    assert_eq!(fake.calls()[0], "policy remove 195:1");
    assert_eq!(fake.managed.borrow().clone().unwrap(), [(1, 3), (195, 0)]);
    assert_eq!(h.state().reservations[ID].gpus, [pci(0)]);
}
