//! The lifecycle tests of sharers of a GPU shared with MPS: the daemon's directories, over the fake host of [`super`].

use super::*;

/// `prepare` then `started` of a sharer: the first slot starts the GPU's daemon, and the
/// container gets its `pipe` at /tmp/nvidia-mps and `shm` at /dev/shm, recorded with the
/// mounts; `detach` of the slot takes them out again and the daemon, left without sharers,
/// is told to quit.
#[test]
fn mps_sharer_gets_the_daemons_directories_and_loses_them_at_detach() {
    let h = mps_host();
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    h.with(&fake, |f| prepare_by_parent(f, &holder(&idmap), &shared(1)))
        .unwrap();
    assert_eq!(fake.calls(), ["mps start 0000:11:00.0"]);
    h.with(&fake, |f| activate(f, &holder(&idmap), &shared(1), found))
        .unwrap();
    assert_eq!(
        fake.calls()[1..],
        [
            "allow 195:1",
            "create /dev/nvidia1",
            "inject /tmp/nvidia-mps /dev/shm"
        ]
    );
    let st = h.state();
    let r = &st.reservations[ID];
    assert_eq!(r.gpus, [mps_slot(0)]);
    let targets: Vec<&str> = r.mounts.iter().map(|m| m.target.as_str()).collect();
    assert_eq!(targets, ["/tmp/nvidia-mps", "/dev/shm"]);
    let d = &st.mps[&pci(1).pci()];
    assert!(d
        .dir
        .starts_with(h.cfg.state_file.parent().unwrap().join("mps")));
    h.in_ns(INIT.pid, CT_NS);
    let (fake, out) = h.detach(Fake::default(), sel(mps_slot(0)), false);
    assert_eq!(out.unwrap().units, [mps_slot(0)]);
    assert_eq!(
        fake.calls(),
        [
            "deny 195:1",
            "mps quit 0000:11:00.0",
            "remove /dev/nvidia1",
            "uninject /tmp/nvidia-mps (9:99) /dev/shm (9:99)"
        ]
    );
    assert!(h.state().mps.is_empty());
}

/// A timeslice sharer, a whole GPU, and a sharer of an MPS GPU whose daemon is not recorded
/// get no MPS directories.
#[test]
fn only_a_slot_with_a_daemon_gets_mps_directories() {
    let mut h = mps_host();
    h.inv.gpus[2].sharing = Some(crate::host::config::Sharing::timeslice(2));
    let ts = Unit::Slot {
        pci: pci(2).pci(),
        slot: 0,
    };
    let fake = h.activated(&[pci(0), ts, mps_slot(0)], &shared(3));
    assert!(
        !fake.calls().iter().any(|c| c.starts_with("inject")),
        "{:?}",
        fake.calls()
    );
    assert!(h.state().reservations[ID].mounts.is_empty());
}
