//! The lifecycle tests of the driver found on the host (`driver="host"`), over the fake host of [`super`].

use super::*;

#[test]
fn host_driver_at_started_is_mounted_and_recorded_with_its_version() {
    let h = host();
    let fake = h.activated(&[pci(0)], &host_req_of(&[0]));
    assert_eq!(
        fake.calls(),
        [
            "allow 195:0".to_string(),
            "create /dev/nvidia0".to_string(),
            host_targets(HOST_V)
        ]
    );
    let r = &h.state().reservations[ID];
    assert_eq!(r.driver, Some(Driver::Host));
    assert_eq!(r.driver_version.as_deref(), Some(HOST_V));
    assert_eq!(r.mounts.len(), 2);
}

#[test]
fn host_driver_without_a_module_reserves_nothing() {
    let h = host();
    *h.module.borrow_mut() = None;
    h.this_process();
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let who = oci_holder(&idmap);
    let e = h
        .with(&fake, |f| prepare_oci(f, &who, &host_req_of(&[0])))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "driver \"host\": no NVIDIA kernel module is loaded (/proc/driver/nvidia/version does not exist)"
    );
    assert!(h.state().reservations.is_empty());
    // Without the driver (nodes only) the same request is met.
    h.with(&fake, |f| prepare_oci(f, &who, &req_of(&[0])))
        .unwrap();
}

#[test]
fn host_driver_for_an_oci_create_is_its_plan_and_recorded() {
    let h = host();
    h.this_process();
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let who = oci_holder(&idmap);
    let (Given { plan, .. }, _) = h
        .with(&fake, |f| prepare_oci(f, &who, &host_req_of(&[0])))
        .unwrap();
    let plan = plan.expect("a plan");
    assert_eq!(plan.nvidia_version.as_deref(), Some(HOST_V));
    assert!(plan.mounts.iter().all(|m| !m.rw));
    assert_eq!(
        plan.links,
        [
            cdi::Link {
                target: format!("libcuda.so.{HOST_V}"),
                link: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into()
            },
            cdi::Link {
                target: "libcuda.so.1".into(),
                link: "/usr/lib/x86_64-linux-gnu/libcuda.so".into()
            }
        ]
    );
    assert_eq!(plan.ld_folders, ["/usr/lib/x86_64-linux-gnu"]);
    let r = &h.state().reservations["ctr1"];
    assert_eq!(
        (r.driver, r.driver_version.as_deref()),
        (Some(Driver::Host), Some(HOST_V))
    );
}

#[test]
fn host_driver_gives_amd_gpus_their_nodes_only() {
    let mut h = host();
    h.inv.gpus[7].vendor = crate::ids::Vendor::Amd;
    *h.module.borrow_mut() = None;
    let fake = h.activated(&[pci(7)], &host_req_of(&[7]));
    assert!(
        fake.calls().iter().all(|c| !c.starts_with("inject")),
        "{:?}",
        fake.calls()
    );
    let r = &h.state().reservations[ID];
    assert_eq!((r.driver, r.driver_version.clone()), (None, None));
}

#[test]
fn host_driver_attach_after_an_upgrade_is_refused_and_detach_keeps_the_files_it_needs() {
    let h = host();
    h.in_ns(INIT.pid, CT_NS);
    let started = h.activated(&[pci(0)], &host_req_of(&[0]));
    let allowed = started.allowed.borrow().clone();
    // The same driver: the new GPU's node only (its files are there).
    let fake = h.fake(Fake {
        allowed: RefCell::new(allowed.clone()),
        ..Default::default()
    });
    h.attach(&fake, &host_req_of(&[1])).unwrap();
    assert_eq!(fake.calls()[..2], ["allow 195:1", "create /dev/nvidia1"]);
    assert!(
        fake.calls().iter().all(|c| c != &host_targets(HOST_V)),
        "{:?}",
        fake.calls()
    );
    // The driver upgraded under it: another GPU with the new driver's files is refused.
    *h.module.borrow_mut() = Some("560.28.03");
    let before = state_bytes(&h);
    let fake = h.fake(Fake::default());
    let e = h.attach(&fake, &host_req_of(&[2])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "its driver files are of NVIDIA driver 550.54.15, the host runs 560.28.03 now: attaching would mix two drivers' files; restart the container to get 560.28.03"
    );
    assert!(fake.calls().is_empty());
    assert_eq!(state_bytes(&h), before);
    // Another source of driver files is refused too.
    let e = h.attach(&fake, &cdi_req_of(&[2])).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("its driver files came from host; attach --driver cdi would mix"),
        "{e}"
    );
    // Nodes only: fine.
    h.attach(&fake, &req_of(&[2])).unwrap();
    // Detach of GPU 0: GPUs 1 and 2 are NVIDIA's, the files stay (whatever the host runs).
    let (fake, out) = h.detach(Fake::default(), sel(pci(0)), false);
    out.unwrap();
    assert!(
        fake.calls().iter().all(|c| !c.starts_with("uninject")),
        "{:?}",
        fake.calls()
    );
    assert_eq!(
        h.state().reservations[ID].driver_version.as_deref(),
        Some(HOST_V)
    );
    // The last NVIDIA GPUs: the files go, and nothing of a driver is recorded.
    let (fake, out) = h.detach(Fake::default(), Which::All, false);
    out.unwrap();
    assert!(
        fake.calls().iter().any(|c| c.starts_with(&format!(
            "uninject /usr/lib/x86_64-linux-gnu/libcuda.so.{HOST_V}"
        ))),
        "{:?}",
        fake.calls()
    );
    let r = &h.state().reservations[ID];
    assert_eq!((r.driver, r.driver_version.clone()), (None, None));
    assert!(r.mounts.is_empty());
}
