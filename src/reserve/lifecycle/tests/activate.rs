//! The lifecycle tests of `started`, over the fake host of [`super`].

use super::*;

#[test]
fn activate_grants_creates_and_records_the_container() {
    let h = host();
    h.seed(ID, "web1", &[pci(0), pci(1)], Phase::Prepared, None);
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    h.with(&fake, |f| activate(f, &holder(&idmap), &req(2), found))
        .unwrap();
    assert_eq!(
        fake.calls(),
        [
            "allow 195:0",
            "allow 195:1",
            "create /dev/nvidia0 /dev/nvidia1"
        ]
    );
    let r = &h.state().reservations[ID];
    assert_eq!(
        (r.phase, r.init, r.controller),
        (Phase::Running, Some(INIT), Some(CTRL))
    );
    assert_eq!(r.nodes.len(), 2);
}

#[test]
fn activate_grant_failure_leaves_nothing() {
    let h = host();
    h.seed(ID, "web1", &[pci(0), pci(1)], Phase::Prepared, None);
    let fake = h.fake(Fake {
        fail_allow: Some(1),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let e = h
        .with(&fake, |f| activate(f, &holder(&idmap), &req(2), found))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "cgroup /fake: granting /dev/nvidia1 (195:1): Operation not permitted"
    );
    assert_eq!(fake.calls(), ["allow 195:0", "allow 195:1", "revoke 195:0"]);
    assert!(fake.allowed.borrow().is_empty());
    assert_eq!(h.state().reservations[ID].phase, Phase::Prepared);
}

#[test]
fn activate_node_failure_revokes_the_grants() {
    let h = host();
    h.seed(ID, "web1", &[pci(0)], Phase::Prepared, None);
    let fake = h.fake(Fake {
        fail_create: Some(ContainerError::Refused(
            "/dev/nvidia0: a symlink is in the way".into(),
        )),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let e = h
        .with(&fake, |f| activate(f, &holder(&idmap), &req(1), found))
        .unwrap_err();
    assert_eq!(e.to_string(), "/dev/nvidia0: a symlink is in the way");
    assert_eq!(
        fake.calls(),
        ["allow 195:0", "create /dev/nvidia0", "revoke 195:0"]
    );
    assert!(fake.allowed.borrow().is_empty());
    let r = &h.state().reservations[ID];
    assert_eq!((r.phase, r.init), (Phase::Prepared, None));
}

#[test]
fn activate_says_what_a_failed_rollback_left() {
    let h = host();
    h.seed(ID, "web1", &[pci(0)], Phase::Prepared, None);
    let fake = h.fake(Fake {
        fail_create: Some(ContainerError::Refused("no space".into())),
        fail_revoke: true,
        ..Default::default()
    });
    let idmap = IdMap::default();
    let e = h
        .with(&fake, |f| activate(f, &holder(&idmap), &req(1), found))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "no space; rollback incomplete: cgroup /fake: No such file or directory"
    );
    assert!(matches!(e, Error::RollbackIncomplete { .. }), "{e:?}");
}

#[test]
fn activate_cdi_inject_failure_removes_nodes_and_revokes() {
    let h = cdi_host();
    h.seed(ID, "web1", &[pci(0)], Phase::Prepared, None);
    let fake = h.fake(Fake {
        fail_inject: true,
        ..Default::default()
    });
    let idmap = IdMap::default();
    let e = h
        .with(&fake, |f| activate(f, &holder(&idmap), &cdi_req(1), found))
        .unwrap_err();
    assert_eq!(e.to_string(), "mount over /usr/lib: Permission denied");
    assert_eq!(
        fake.calls(),
        [
            "allow 1:3",
            "allow 1:7",
            "create /dev/null /dev/full",
            "inject /usr/lib/x86_64-linux-gnu/libcuda.so.535.129.03",
            "remove /dev/null /dev/full",
            "revoke 1:7",
            "revoke 1:3",
        ]
    );
    assert!(fake.allowed.borrow().is_empty());
    assert_eq!(h.state().reservations[ID].phase, Phase::Prepared);
}

#[test]
fn activate_cdi_records_the_driver_mounts() {
    let h = cdi_host();
    h.activated(&[pci(0)], &cdi_req(1));
    let r = &h.state().reservations[ID];
    assert_eq!(r.phase, Phase::Running);
    assert_eq!(
        r.mounts
            .iter()
            .map(|m| m.target.as_str())
            .collect::<Vec<_>>(),
        ["/usr/lib/x86_64-linux-gnu/libcuda.so.535.129.03"]
    );
    assert_eq!(r.nodes.iter().map(num).collect::<Vec<_>>(), ["1:3", "1:7"]);
}

#[test]
fn activate_init_gone_says_so_without_a_rollback_note() {
    let h = host();
    h.seed(ID, "web1", &[pci(0)], Phase::Prepared, None);
    // The helper found the init gone, and its cgroup went with it (the revoke fails).
    let fake = h.fake(Fake {
        fail_create: Some(ContainerError::InitGone {
            pid: INIT.pid,
            cause: Some("setns: No such process".into()),
        }),
        fail_revoke: true,
        init_exits_in: Some("create"),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let e = h
        .with(&fake, |f| activate(f, &holder(&idmap), &req(1), found))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "container init 4242 exited during started (setns: No such process)"
    );
    assert_eq!(
        fake.calls(),
        ["allow 195:0", "create /dev/nvidia0", "revoke 195:0"]
    );
}

#[test]
fn activate_init_exit_seen_from_proc_is_said_first() {
    let h = host();
    h.seed(ID, "web1", &[pci(0)], Phase::Prepared, None);
    // Not said by the helper: the init is looked at (gone from the fake /proc).
    let fake = h.fake(Fake {
        fail_create: Some(ContainerError::Other("reply: broken pipe".into())),
        init_exits_in: Some("create"),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let e = h
        .with(&fake, |f| activate(f, &holder(&idmap), &req(1), found))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "container init 4242 exited during started (reply: broken pipe)"
    );
}

#[test]
fn activate_init_gone_during_inject_leaves_no_rollback_note() {
    let h = cdi_host();
    h.seed(ID, "web1", &[pci(0)], Phase::Prepared, None);
    let fake = h.fake(Fake {
        fail_inject: true,
        fail_revoke: true,
        init_exits_in: Some("inject"),
        ..Default::default()
    });
    let idmap = IdMap::default();
    let e = h
        .with(&fake, |f| activate(f, &holder(&idmap), &cdi_req(1), found))
        .unwrap_err();
    // The undo is tried, but what it could not do went with the init's cgroup and /dev.
    assert_eq!(e.to_string(), "mount over /usr/lib: Permission denied");
    assert!(fake
        .calls()
        .contains(&"remove /dev/null /dev/full".to_string()));
}

#[test]
fn activate_without_a_reservation_touches_nothing() {
    let h = host();
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let e = h
        .with(&fake, |f| activate(f, &holder(&idmap), &req(1), found))
        .unwrap_err();
    assert!(e.to_string().starts_with("holds no GPU reservation"), "{e}");
    assert!(fake.calls().is_empty());
    // Nor when the container cannot be found.
    h.seed(ID, "web1", &[pci(0)], Phase::Prepared, None);
    let e = h
        .with(&fake, |f| {
            activate(f, &holder(&idmap), &req(1), || {
                Err(ContainerError::Other("no libvirt_lxc controller".into()))
            })
        })
        .unwrap_err();
    assert_eq!(e.to_string(), "no libvirt_lxc controller");
    assert!(fake.calls().is_empty());
}
