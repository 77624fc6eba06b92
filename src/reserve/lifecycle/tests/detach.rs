//! The lifecycle tests of `detach`, over the fake host of [`super`].

use super::*;

#[test]
fn detach_one_of_two_gpus_takes_back_its_own_nodes_only() {
    let h = host_with_controls();
    h.running_with(&[pci(0), pci(1)], &req(2));
    let (fake, out) = h.detach(Fake::default(), sel(pci(1)), false);
    let out = out.unwrap();
    assert_eq!(out.units, [pci(1)]);
    assert!(out.kept_open.is_empty() && out.draining.is_empty());
    // Its own node: the control nodes the other GPU needs stay.
    assert_eq!(fake.calls(), ["deny 195:1", "remove /dev/nvidia1"]);
    assert_eq!(*fake.allowed.borrow(), [(195, 0), (195, 255), (510, 0)]);
    let r = &h.state().reservations[ID];
    assert_eq!(r.gpus, [pci(0)]);
    assert_eq!(
        r.nodes.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(),
        ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    );
    assert!(r.hotplugged && r.phase == Phase::Running && r.init == Some(INIT));
}

#[test]
fn detach_all_takes_back_every_node_and_keeps_the_reservation() {
    let h = host_with_controls();
    h.running_with(&[pci(0), pci(1)], &req(2));
    let (fake, out) = h.detach(Fake::default(), Which::All, false);
    assert_eq!(out.unwrap().units, [pci(0), pci(1)]);
    assert_eq!(
        fake.calls(),
        [
            "deny 195:0",
            "deny 195:1",
            "deny 195:255",
            "deny 510:0",
            "remove /dev/nvidia0 /dev/nvidia1 /dev/nvidiactl /dev/nvidia-uvm",
        ]
    );
    assert!(fake.allowed.borrow().is_empty());
    // The container keeps running: its (empty) reservation stays until it stops.
    let r = &h.state().reservations[ID];
    assert!(r.gpus.is_empty() && r.nodes.is_empty() && r.hotplugged);
    assert_eq!(r.phase, Phase::Running);
    // Nothing left to detach.
    let (fake, out) = h.detach(Fake::default(), Which::All, false);
    assert_eq!(out.unwrap_err().to_string(), "holds no GPU to detach");
    assert!(fake.calls().is_empty());
}

#[test]
fn detach_refuses_a_selector_of_a_gpu_it_does_not_hold() {
    let h = host_with_controls();
    h.running_with(&[pci(0), pci(1)], &req(2));
    let before = h.state();
    for (which, want) in [
        (
            Which::Units(vec![DeviceSel::Index(5)]),
            "index 5 names no GPU it holds (it holds 0000:10:00.0,0000:11:00.0)",
        ),
        (
            Which::Units(vec![
                DeviceSel::Pci(pci(0).to_string()),
                DeviceSel::Pci("0000:99:00.0".into()),
            ]),
            "pci 0000:99:00.0 names no GPU it holds (it holds 0000:10:00.0,0000:11:00.0)",
        ),
        (
            Which::Units(vec![DeviceSel::Uuid("gpu-00000003".into())]),
            "uuid gpu-00000003 names no GPU it holds (it holds 0000:10:00.0,0000:11:00.0)",
        ),
    ] {
        let (fake, out) = h.detach(Fake::default(), which, false);
        assert_eq!(out.unwrap_err().to_string(), want);
        assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    }
    assert_eq!(h.state(), before);
    // A UUID and an index of a GPU it holds are its.
    let (_, out) = h.detach(
        Fake::default(),
        Which::Units(vec![DeviceSel::Uuid("gpu-00000001".into())]),
        false,
    );
    assert_eq!(out.unwrap().units, [pci(1)]);
}

#[test]
fn detach_refuses_a_gpu_a_container_process_has_open() {
    let h = gpu1_open_by(4300, CT_NS, "python3");
    let before = h.state();
    let (fake, out) = h.detach(Fake::default(), sel(pci(1)), false);
    assert_eq!(
        out.unwrap_err().to_string(),
        "GPU 0000:11:00.0 is open in the container: process 4300 (python3); close it or detach with --force"
    );
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    assert_eq!(h.state(), before);
    // The other GPU is not open: it goes.
    let (_, out) = h.detach(Fake::default(), sel(pci(0)), false);
    assert_eq!(out.unwrap().units, [pci(0)]);
}

#[test]
fn detach_with_force_goes_ahead_and_the_open_gpu_drains() {
    let h = gpu1_open_by(4300, CT_NS, "python3");
    let (fake, out) = h.detach(Fake::default(), sel(pci(1)), true);
    let out = out.unwrap();
    let p = ProcRef {
        pid: 4300,
        start_time: 900,
    };
    assert_eq!(out.units, [pci(1)]);
    assert_eq!(out.kept_open, [(pci(1), vec![p])]);
    assert_eq!(out.draining, [pci(1)]);
    assert_eq!(fake.calls(), ["deny 1:5", "remove /dev/zero"]);
    let st = h.state();
    assert_eq!(st.reservations[ID].gpus, [pci(0)]);
    assert_eq!(crate::reserve::drain::unit_pids(&st, &pci(1)), [4300]);
    assert_eq!(st.draining[&pci(1)].holders[0].comm, "python3");
}

#[test]
fn detach_of_a_gpu_open_outside_the_container_goes_ahead_and_drains() {
    // Process 4301 of the host (another PID namespace) holds GPU 1 open (a descriptor
    // passed out of the container, say); 4302 has no namespace to read: not the container's.
    let h = gpu1_open_by(4301, HOST_NS, "sidecar");
    h.opener(4302, "/dev/zero", "0100002");
    let (fake, out) = h.detach(Fake::default(), sel(pci(1)), false);
    let out = out.unwrap();
    assert_eq!(out.units, [pci(1)]);
    assert!(out.kept_open.is_empty());
    assert_eq!(out.draining, [pci(1)]);
    assert_eq!(fake.calls(), ["deny 1:5", "remove /dev/zero"]);
    let st = h.state();
    assert_eq!(crate::reserve::drain::unit_pids(&st, &pci(1)), [4301, 4302]);
}

#[test]
fn detach_keeps_a_unit_whose_grant_cannot_be_taken_back() {
    let h = host_with_controls();
    h.running_with(&[pci(0), pci(1)], &req(2));
    let before = h.state();
    let fail = || Fake {
        fail_deny: Some(1),
        ..Fake::default()
    };
    let (fake, out) = h.detach(fail(), sel(pci(1)), false);
    assert_eq!(
        out.unwrap_err().to_string(),
        "the device-cgroup grants of GPU(s) 0000:11:00.0 cannot be taken back (cgroup /fake: Operation not permitted): they stay reserved"
    );
    assert_eq!(fake.calls(), ["deny 195:1"]);
    let r = &h.state().reservations[ID];
    assert_eq!(
        (&r.gpus, &r.nodes),
        (
            &before.reservations[ID].gpus,
            &before.reservations[ID].nodes
        )
    );
    // All of them: the other goes; the control nodes the kept one needs stay granted.
    let (fake, out) = h.detach(fail(), Which::All, false);
    assert_eq!(
        out.unwrap_err().to_string(),
        "the device-cgroup grants of GPU(s) 0000:11:00.0 cannot be taken back (cgroup /fake: Operation not permitted): they stay reserved; GPU(s) 0000:10:00.0 detached"
    );
    assert_eq!(
        fake.calls(),
        ["deny 195:0", "deny 195:1", "remove /dev/nvidia0"]
    );
    let r = &h.state().reservations[ID];
    assert_eq!(r.gpus, [pci(1)]);
    assert_eq!(
        r.nodes.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(),
        ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    );
}

#[test]
fn detach_keeps_a_unit_whose_node_another_rule_still_allows() {
    // Granted at started; then the container's cgroup has `c 195:* rwm` too: v1's deny of
    // `c 195:1 rw` succeeds and changes nothing.
    let h = host_with_controls();
    h.running_with(&[pci(0), pci(1)], &req(2));
    let before = h.state();
    let wild = || Fake {
        wildcard: Some(195),
        ..Default::default()
    };
    let (fake, out) = h.detach(wild(), sel(pci(1)), false);
    let e = out.unwrap_err();
    assert_eq!(
        e.to_string(),
        "the device-cgroup grants of GPU(s) 0000:11:00.0 cannot be taken back (cgroup /fake: /dev/nvidia1 (195:1) is still allowed by another rule of the container's cgroup): they stay reserved"
    );
    assert!(
        matches!(
            e,
            Error::Lifecycle(LifecycleError::CannotRevoke { ref detached, .. }) if detached.is_empty()
        ),
        "{e:?}"
    );
    // Not freed, its node neither unrecorded nor removed.
    assert_eq!(fake.calls(), ["deny 195:1"]);
    let r = &h.state().reservations[ID];
    let b = &before.reservations[ID];
    assert_eq!((&r.gpus, &r.nodes), (&b.gpus, &b.nodes));
    // All of them: both stay, and the control nodes they need are not denied.
    let (fake, out) = h.detach(wild(), Which::All, false);
    assert_eq!(
        out.unwrap_err().to_string(),
        "the device-cgroup grants of GPU(s) 0000:10:00.0,0000:11:00.0 cannot be taken back (cgroup /fake: /dev/nvidia0 (195:0) is still allowed by another rule of the container's cgroup; cgroup /fake: /dev/nvidia1 (195:1) is still allowed by another rule of the container's cgroup): they stay reserved"
    );
    assert_eq!(fake.calls(), ["deny 195:0", "deny 195:1"]);
    let r = &h.state().reservations[ID];
    assert_eq!((&r.gpus, &r.nodes), (&b.gpus, &b.nodes));
}

#[test]
fn detach_of_a_mig_instance_keeps_what_its_gpu_instance_still_needs() {
    use crate::reserve::alloc::tests::with_migs;
    let mut h = host();
    h.inv.gpus[0] = with_migs(h.inv.gpus[0].clone(), &[(1, 0), (2, 0), (2, 1)]);
    let mig = |gi, ci| Unit::Mig {
        pci: pci(0).pci(),
        gi,
        ci,
    };
    let mut r = req(3);
    r.mig = true;
    h.running_with(&[mig(1, 0), mig(2, 0), mig(2, 1)], &r);
    // gi2/ci0: its compute instance's capability only (gi2 stays, through ci1).
    let (fake, out) = h.detach(Fake::default(), sel(mig(2, 0)), false);
    assert_eq!(out.unwrap().units, [mig(2, 0)]);
    assert_eq!(
        fake.calls(),
        ["deny 236:19", "remove /dev/nvidia-caps/nvidia-cap19"]
    );
    // gi2/ci1 then: now its GPU instance's capability goes too, not the GPU's node.
    let (fake, out) = h.detach(Fake::default(), sel(mig(2, 1)), false);
    assert_eq!(out.unwrap().units, [mig(2, 1)]);
    assert_eq!(denied(&fake), ["deny 236:18", "deny 236:20"]);
    // The GPU's PCI address names every instance it still holds of it.
    let (fake, out) = h.detach(Fake::default(), sel(pci(0)), false);
    assert_eq!(out.unwrap().units, [mig(1, 0)]);
    assert_eq!(denied(&fake), ["deny 195:0", "deny 236:9", "deny 236:10"]);
    assert!(h.state().reservations[ID].gpus.is_empty());
}

#[test]
fn detach_refuses_a_container_not_running_as_recorded() {
    let h = host_with_controls();
    h.in_ns(INIT.pid, CT_NS);
    h.seed(ID, "web1", &[pci(0)], Phase::Prepared, None);
    let idmap = IdMap::default();
    let fake = h.fake(Fake::default());
    let run = |f: &World| detach(f, &holder(&idmap), &Which::All, false, found);
    let e = h.with(&fake, run).unwrap_err();
    assert_eq!(
        e.to_string(),
        "is not running (its GPU reservation is prepared): nothing to detach from"
    );
    let other = ProcRef {
        pid: 5151,
        start_time: 888,
    };
    h.seed(ID, "web1", &[pci(0)], Phase::Running, Some(other));
    let e = h.with(&fake, run).unwrap_err();
    assert_eq!(
        e.to_string(),
        "its GPU reservation is not for the container that runs now (init 4242): is it restarting?"
    );
    assert!(fake.calls().is_empty());
}

#[test]
fn detach_that_cannot_tell_the_containers_processes_refuses_unless_forced() {
    let h = cdi_host();
    h.running_with(&[pci(0)], &req(1));
    std::fs::remove_file(h.cfg.proc.join(INIT.pid.to_string()).join("ns/pid")).unwrap();
    let (fake, out) = h.detach(Fake::default(), Which::All, false);
    assert_eq!(
        out.unwrap_err().to_string(),
        "cannot tell which processes are the container's (the PID namespace of its init 4242 cannot be read), so whether its GPUs are open; detach with --force to go ahead"
    );
    assert!(fake.calls().is_empty());
    let (fake, out) = h.detach(Fake::default(), Which::All, true);
    assert_eq!(out.unwrap().units, [pci(0)]);
    assert_eq!(fake.calls(), ["deny 1:3", "remove /dev/null"]);
}

#[test]
fn detach_whose_nodes_cannot_be_removed_says_so_after_freeing() {
    let h = host_with_controls();
    h.running_with(&[pci(0), pci(1)], &req(2));
    let fake = Fake {
        fail_remove: true,
        ..Fake::default()
    };
    let (fake, out) = h.detach(fake, sel(pci(0)), false);
    assert_eq!(
        out.unwrap_err().to_string(),
        "detached GPU(s) 0000:10:00.0 (their grants taken back), but their nodes could not be removed from the container's /dev: /dev is not libvirt's tmpfs"
    );
    assert_eq!(fake.calls(), ["deny 195:0", "remove /dev/nvidia0"]);
    // No longer granted: freed.
    assert_eq!(h.state().reservations[ID].gpus, [pci(1)]);
}

#[test]
fn detach_whose_driver_files_cannot_be_taken_out_says_so_after_freeing() {
    let h = cdi_host();
    h.in_ns(INIT.pid, CT_NS);
    h.activated(&[pci(0)], &cdi_req(1));
    let (fake, out) = h.detach(
        Fake {
            fail_uninject: true,
            ..Default::default()
        },
        Which::All,
        false,
    );
    let e = out.unwrap_err().to_string();
    assert_eq!(
        e,
        "detached GPU(s) 0000:10:00.0 (their grants taken back), but the CDI driver files only they needed could not be taken out of the container's root: / is not the container's"
    );
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
    assert!(r.gpus.is_empty() && r.mounts.is_empty(), "{r:?}");
}

/// A slot of a GPU another domain still shares: detaching it is refused while a process of
/// the container has the GPU open, as for a whole GPU (review F2); it does not drain (the
/// other sharer has the GPU open by design), and with `--force` the opener is reported.
#[test]
fn detach_of_a_slot_waits_for_the_containers_own_openers() {
    let mut h = cdi_host();
    h.inv.gpus[1].sharing = Some(crate::host::config::Sharing::timeslice(2));
    let slot = |n| Unit::Slot {
        pci: pci(1).pci(),
        slot: n,
    };
    let shared = Request {
        share: true,
        ..req(1)
    };
    h.running_with(&[slot(0)], &shared);
    h.seed("other", "other", &[slot(1)], Phase::Running, None);
    h.opener_in(4300, "/dev/zero", CT_NS, "python3");
    let before = h.state();
    let (fake, out) = h.detach(Fake::default(), sel(slot(0)), false);
    assert_eq!(
        out.unwrap_err().to_string(),
        "GPU 0000:11:00.0/slot0 is open in the container: process 4300 (python3); close it or detach with --force"
    );
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    assert_eq!(h.state(), before);
    let (_, out) = h.detach(Fake::default(), sel(slot(0)), true);
    let out = out.unwrap();
    assert_eq!(out.units, [slot(0)]);
    assert_eq!(out.kept_open.len(), 1);
    assert!(out.draining.is_empty(), "{:?}", out.draining);
    assert!(h.state().draining.is_empty());
}

/// A container holding an MPS slot and a whole GPU, without CDI files: detaching the slot
/// takes the MPS directories out (review finding 4: they stayed when the CDI specs could
/// not be read, or a directory made for them was taken for CDI's).
#[test]
fn detach_of_the_mps_slot_beside_a_whole_gpu_takes_the_mps_directories() {
    let h = mps_host();
    let mut r = shared(1);
    r.devices = vec![DeviceSel::Index(1)];
    let fake = running_on_gpu0(&h, &req(1));
    let got = h.attach(&fake, &r).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got.units, [mps_slot(0)]);
    h.in_ns(INIT.pid, CT_NS);
    let (fake, out) = h.detach(Fake::default(), sel(mps_slot(0)), false);
    assert_eq!(out.unwrap().units, [mps_slot(0)]);
    let calls = fake.calls();
    assert!(
        calls
            .iter()
            .any(|c| c.starts_with("uninject /tmp/nvidia-mps")),
        "{calls:?}"
    );
    let st = h.state();
    let kept = &st.reservations[ID];
    assert_eq!(kept.gpus, [pci(0)]);
    assert!(kept.mounts.is_empty(), "{:?}", kept.mounts);
}

/// Detach takes the entries of exactly the nodes it takes back out of the scope's policy,
/// before it frees them (a reload then gives nothing back): GPU 0's, listed at create, too;
/// the container's own entry stays.
#[test]
fn detach_takes_its_nodes_out_of_the_scopes_policy_first() {
    let h = host();
    h.running_with(&[pci(0), pci(1)], &req(2));
    let (fake, out) = h.detach(
        Fake {
            managed: RefCell::new(Some(vec![(1, 3), (195, 0), (195, 1)])),
            ..Default::default()
        },
        sel(pci(0)),
        false,
    );
    assert_eq!(out.unwrap().units, [pci(0)]);
    assert_eq!(
        fake.calls(),
        ["policy remove 195:0", "deny 195:0", "remove /dev/nvidia0"]
    );
    assert_eq!(fake.managed.borrow().clone().unwrap(), [(1, 3), (195, 1)]);
}

/// A unit whose grant could not be taken back stays reserved, and its entry goes back into
/// the scope's policy; a detach refused under the lock puts every entry back.
#[test]
fn detach_puts_back_the_entries_of_what_it_keeps() {
    let h = host();
    h.running_with(&[pci(0), pci(1)], &req(2));
    let (fake, out) = h.detach(
        Fake {
            managed: RefCell::new(Some(vec![(1, 3), (195, 0), (195, 1)])),
            fail_deny: Some(1),
            ..Default::default()
        },
        Which::All,
        false,
    );
    assert!(out.is_err());
    assert_eq!(
        fake.calls()[..3],
        ["policy remove 195:0 195:1", "deny 195:0", "deny 195:1"]
    );
    assert!(
        fake.calls().contains(&"policy restore 195:1".to_string()),
        "{:?}",
        fake.calls()
    );
    assert_eq!(fake.managed.borrow().clone().unwrap(), [(1, 3), (195, 1)]);
    assert_eq!(h.state().reservations[ID].gpus, [pci(1)]);
    // The cgroup cannot be found after the entries went: they come back, nothing freed.
    let (fake, out) = h.detach(
        Fake {
            managed: RefCell::new(Some(vec![(1, 3), (195, 1)])),
            no_cgroup: true,
            ..Default::default()
        },
        Which::All,
        false,
    );
    assert!(out.is_err());
    assert_eq!(
        fake.calls(),
        ["policy remove 195:1", "policy restore 195:1"]
    );
    assert_eq!(fake.managed.borrow().clone().unwrap(), [(1, 3), (195, 1)]);
    assert_eq!(h.state().reservations[ID].gpus, [pci(1)]);
}

/// A detach whose change of the scope's list went through but whose read-back failed puts
/// the list back before it gives up: nothing is taken back or freed, and no reload takes the
/// GPU from the container that still holds it.
#[test]
fn detach_whose_read_back_failed_puts_the_scopes_list_back() {
    let h = host();
    h.running_with(&[pci(0), pci(1)], &req(2));
    let (fake, out) = h.detach(
        Fake {
            managed: RefCell::new(Some(vec![(1, 3), (195, 0), (195, 1)])),
            manager_script: RefCell::new(
                [Told::Unsure("systemctl show: Connection timed out")].into(),
            ),
            ..Default::default()
        },
        sel(pci(0)),
        false,
    );
    assert_eq!(
        out.unwrap_err().to_string(),
        "cgroup /fake.scope: systemctl show: Connection timed out"
    );
    assert_eq!(
        fake.calls(),
        ["policy remove 195:0", "policy restore 195:0"]
    );
    assert_eq!(
        fake.managed.borrow().clone().unwrap(),
        [(1, 3), (195, 1), (195, 0)]
    );
    assert_eq!(h.state().reservations[ID].gpus, [pci(0), pci(1)]);
}

/// A record that changed between the detach's look and its locked step so that it would take
/// back a node it did not take out of the scope's list first (here the control nodes, once
/// another detach freed the container's other GPU meanwhile) is refused, the list put back:
/// no node is ever denied and freed while the scope may still list it for the next reload.
#[test]
fn detach_refuses_nodes_it_did_not_take_out_of_the_scopes_list() {
    let h = host_with_controls();
    h.running_with(&[pci(0), pci(1)], &req(2));
    let cfg = h.cfg.clone();
    let (fake, out) = h.detach(
        Fake {
            managed: RefCell::new(Some(vec![(1, 3), (195, 0), (195, 1), (195, 255), (510, 0)])),
            on_told: Some(Box::new(move || {
                Store::new(&cfg.state_file)
                    .update(|st| -> Result<(), Error> {
                        let r = st.reservations.get_mut(ID).unwrap();
                        r.gpus.retain(|u| *u != pci(1));
                        r.nodes.retain(|n| n.minor != 1);
                        Ok(())
                    })
                    .unwrap();
            })),
            ..Default::default()
        },
        sel(pci(0)),
        false,
    );
    assert_eq!(
        out.unwrap_err().to_string(),
        "GPU reservation changed while detaching; try again"
    );
    assert!(denied(&fake).is_empty(), "{:?}", fake.calls());
    assert_eq!(
        fake.calls(),
        ["policy remove 195:0", "policy restore 195:0"]
    );
    assert_eq!(h.state().reservations[ID].gpus, [pci(0)]);
}
