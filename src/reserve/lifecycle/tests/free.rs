//! The lifecycle tests of `free` (every stop, `release`, `reconcile`), with `reset_on_release`, over the fake host of [`super`].

use super::*;

#[test]
fn free_drains_a_unit_a_process_keeps_open() {
    // GPU 0 is /dev/null here, GPU 1 /dev/zero: process 4300 has GPU 0 really open, 4301
    // holds only an O_PATH descriptor on GPU 1 (which holds nothing).
    let h = cdi_host();
    h.opener(4300, "/dev/null", "0100002");
    h.opener(4301, "/dev/zero", "010000000");
    h.seed(ID, "web1", &[pci(0), pci(1)], Phase::Running, Some(INIT));
    let fake = h.fake(Fake::default());
    let out = h.with(&fake, |f| free(f, all_of(ID), |_| {})).unwrap();
    assert_eq!(out.freed.len(), 1);
    assert_eq!(out.freed[0].0.gpus, vec![pci(0), pci(1)]);
    let st = h.state();
    assert!(st.reservations.is_empty());
    assert_eq!(crate::reserve::drain::unit_pids(&st, &pci(0)), vec![4300]);
    assert!(!st.draining.contains_key(&pci(1)), "{:?}", st.draining);
    assert_eq!(
        out.drained
            .draining
            .iter()
            .map(|(u, _)| *u)
            .collect::<Vec<_>>(),
        vec![pci(0)]
    );
    // Nothing the fake container was asked to do: a free touches no container.
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
}

#[test]
fn free_without_an_inventory_frees_and_drains_nothing() {
    let h = cdi_host();
    h.opener(4300, "/dev/null", "0100002");
    h.seed(ID, "web1", &[pci(0)], Phase::Running, Some(INIT));
    let fake = h.fake(Fake {
        no_inventory: true,
        ..Fake::default()
    });
    let out = h.with(&fake, |f| free(f, all_of(ID), |_| {})).unwrap();
    assert_eq!(out.freed.len(), 1);
    let st = h.state();
    assert!(st.reservations.is_empty() && st.draining.is_empty());
}

#[test]
fn free_takes_only_what_is_chosen_and_runs_then_in_the_same_step() {
    let h = host();
    h.seed(ID, "web1", &[pci(0)], Phase::Running, Some(INIT));
    h.seed(OTHER, "web2", &[pci(1)], Phase::Running, None);
    let fake = h.fake(Fake::default());
    let seen = Cell::new(false);
    let out = h
        .with(&fake, |f| {
            free(
                f,
                |st| {
                    let key = |k: &str| st.reservations.keys().find(|x| x.as_str() == k).cloned();
                    let no_such = crate::reserve::state::HolderId::for_test(
                        HolderKind::Libvirt,
                        "nobody",
                        "no-such-id",
                    )
                    .key();
                    vec![(key(ID).unwrap(), "why"), (no_such, "x")]
                },
                |st| {
                    // Under the same lock: the freed one is out, the other still in.
                    assert!(!st.reservations.contains_key(ID));
                    assert!(st.reservations.contains_key(OTHER));
                    seen.set(true);
                },
            )
        })
        .unwrap();
    assert!(seen.get());
    assert_eq!(out.freed.len(), 1);
    assert_eq!(out.freed[0].1, "why");
    assert_eq!(
        h.state()
            .reservations
            .keys()
            .map(HolderKey::as_str)
            .collect::<Vec<_>>(),
        vec![OTHER]
    );
}

/// The one free path (`free`: the stop hooks, `release`, `reconcile`, the OCI door's
/// `poststop` and `delete`), with and without an inventory; a detach; a stale reservation
/// reclaimed for a request (which then does not get the reclaimed GPU): each marks the GPUs
/// no one holds any more scrub pending. Off by default.
#[test]
fn reset_on_release_marks_what_every_free_path_frees() {
    let mut h = host();
    h.seed(ID, "web1", &[pci(0), pci(1)], Phase::Running, Some(INIT));
    let fake = h.fake(Fake::default());
    h.with(&fake, |f| free(f, all_of(ID), |_| {})).unwrap();
    assert!(scrub_pending(&h).is_empty(), "off by default");
    h.cfg.reset_on_release = true;
    h.seed(ID, "web1", &[pci(0), pci(1)], Phase::Running, Some(INIT));
    h.with(&fake, |f| free(f, all_of(ID), |_| {})).unwrap();
    assert_eq!(scrub_pending(&h), ["0000:10:00.0", "0000:11:00.0"]);
    // Without an inventory (no draining look): marked all the same.
    h.seed(ID, "web1", &[pci(2)], Phase::Running, Some(INIT));
    let blind = h.fake(Fake {
        no_inventory: true,
        ..Fake::default()
    });
    h.with(&blind, |f| free(f, all_of(ID), |_| {})).unwrap();
    assert!(scrub_pending(&h).contains(&"0000:12:00.0".to_string()));
    // A detach of one of two GPUs.
    let mut h = host_with_controls();
    h.cfg.reset_on_release = true;
    h.running_with(&[pci(0), pci(1)], &req(2));
    let (_, out) = h.detach(Fake::default(), sel(pci(1)), false);
    assert_eq!(out.unwrap().units, [pci(1)]);
    assert_eq!(scrub_pending(&h), ["0000:11:00.0"]);
    // A stale reservation reclaimed by a request: the reclaimed GPUs are scrub pending, the
    // request does not fit; the reclaim is kept all the same (else it would be rolled back
    // with each refusal, and its GPUs never scrubbed).
    let mut h = host();
    h.cfg.reset_on_release = true;
    let gone = ProcRef {
        pid: 6161,
        start_time: 1,
    };
    let all: Vec<Unit> = (0..8).map(pci).collect();
    h.seed(OTHER, "web2", &all, Phase::Running, Some(gone));
    let fake = h.fake(Fake::default());
    let idmap = IdMap::default();
    let e = h
        .with(&fake, |f| prepare_by_parent(f, &holder(&idmap), &req(1)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("scrub pending"), "{e}");
    let st = h.state();
    assert!(!st.reservations.contains_key(OTHER));
    assert_eq!(scrub_pending(&h).len(), 8);
}
