//! `prepare` and OCI `create`: choosing GPUs for a holder, or keeping what it has.

use super::error::LifecycleError;
use super::holder::{new_reservation, Holder};
use super::nodes::as_nodes;
use super::plan::{driver_record, given, scan_for, wants_driver, Given};
use crate::host::config::Config;
use crate::host::inventory::{Inventory, Scan};
use crate::host::procfs::ProcRef;
use crate::ids::{Pci, Unit};
use crate::log;
use crate::request::Request;
use crate::reserve::alloc;
use crate::reserve::drain;
use crate::reserve::error::Error;
use crate::reserve::reconcile::{reclaim_stale, stale_on};
use crate::reserve::state::Store;
use crate::reserve::state::{
    now_rfc3339, Blocked, Found, HolderKind, Phase, Reservation, State, Transition,
};
use crate::reserve::world::World;

/// Whether a reserved unit can still be given: a whole GPU that is usable and not in MIG
/// mode, or a MIG instance that exists on a usable GPU.
pub(crate) fn unit_ok(inv: &Inventory, unit: &Unit) -> bool {
    match *unit {
        Unit::Mig { .. } => inv.mig(unit).is_some_and(|(g, _)| g.usable()),
        // A slot: its GPU is still shared, with this slot among its replicas.
        Unit::Slot { slot, .. } => inv.by_unit(unit).is_some_and(|g| {
            g.usable() && g.migs.is_empty() && g.sharing.is_some_and(|s| slot < s.replicas)
        }),
        Unit::Gpu(_) => inv
            .by_unit(unit)
            .is_some_and(|g| g.usable() && g.migs.is_empty() && g.sharing.is_none()),
        // A VM's mediated device: never a container's unit.
        Unit::Mdev { .. } => false,
    }
}

/// Whether an existing reservation still fits the request on this inventory.
pub(super) fn satisfies(inv: &Inventory, gpus: &[Unit], req: &Request) -> bool {
    gpus.len() == req.count as usize
        && gpus.iter().all(|p| {
            p.is_mig() == req.mig
                && p.is_slot() == req.share
                && unit_ok(inv, p)
                && inv
                    .by_unit(p)
                    .is_some_and(|g| alloc::matches(g, &req.filters))
        })
        && req.devices.iter().all(|sel| {
            alloc::resolve(&inv.gpus, sel)
                .is_some_and(|g| gpus.iter().any(|u| !u.is_mig() && u.pci() == g.pci))
        })
        && req.migs.iter().all(|sel| {
            alloc::resolve(&inv.gpus, &sel.gpu).is_some_and(|g| {
                gpus.contains(&Unit::Mig {
                    pci: g.pci,
                    gi: sel.gi,
                    ci: sel.ci,
                })
            })
        })
}

/// A reserve that does not fit: reclaims stale reservations (their GPUs that a process still
/// has open become draining) and looks again at the draining GPUs (one pass over `/proc` for
/// both). Returns what was done, for the log, and whether the state changed (the choice is
/// then made again, and a refusal says what holds the GPUs now).
pub(super) fn reclaim_for(f: &World, st: &mut State, inv: &mut Inventory) -> (Vec<String>, bool) {
    let (mut notes, freed) = reclaim_stale(f.proc, f.controller_running, st);
    let units: Vec<Unit> = freed.iter().flat_map(|r| r.gpus.iter().copied()).collect();
    inv.settle(f.cfg, &units);
    let fresh = drain::freed_units(inv, st, &freed);
    // With `reset_on_release`, a reclaimed GPU no one holds now is scrub pending: the
    // request that reclaimed it does not get it before a reset.
    for p in crate::reserve::health::scrub::scrub_freed(f.cfg, st, Some(inv), &freed) {
        notes.push(format!(
            "GPU {p} reclaimed: scrub pending (reset_on_release)"
        ));
    }
    let recheck = !st.draining.is_empty();
    if fresh.is_empty() && !recheck {
        return (notes, !freed.is_empty());
    }
    let s = drain::settle(st, fresh, recheck, f.proc, &now_rfc3339(), drain::BUDGET);
    notes.extend(drain::notes(&s));
    (notes, !freed.is_empty() || recheck)
}

/// A MIG request looks at GPUs' instances (the driver's details) one GPU at a time, the
/// GPUs it names first, until it knows enough free instances: not at every GPU's.
fn settle_for_migs(cfg: &Config, inv: &mut Inventory, held: &alloc::Held, req: &Request) {
    let named: Vec<Pci> = req
        .migs
        .iter()
        .filter_map(|m| alloc::resolve(&inv.gpus, &m.gpu).map(|g| g.pci))
        .collect();
    inv.settle(cfg, &named);
    let free_on = |inv: &Inventory, p: Pci| {
        inv.by_pci(&p).map_or(0, |g| {
            g.migs
                .iter()
                .filter(|m| alloc::gi_holder(held, g.pci, m.gi).is_none())
                .count()
        })
    };
    let mut free: usize = named.iter().map(|p| free_on(inv, *p)).sum();
    let order: Vec<Pci> = inv
        .gpus
        .iter()
        .filter(|g| {
            g.vendor == crate::ids::Vendor::Nvidia
                && g.usable()
                && !held.contains_key(&Unit::Gpu(g.pci))
                && alloc::slots_of(held, g.pci).next().is_none()
                && !named.contains(&g.pci)
                && alloc::matches(g, &req.filters)
        })
        .map(|g| g.pci)
        .collect();
    for p in order {
        if free >= req.count as usize {
            break;
        }
        inv.settle(cfg, &[p]);
        free += free_on(inv, p);
    }
}

/// `prepare` (libvirt) and OCI `create`: reserves GPUs for the holder (or keeps the
/// reservation it has, if it still fits), reclaiming stale reservations only when the request
/// does not fit otherwise. `by` is the process that reserved, as the door read it: libvirtd
/// (the hook's parent; the reservation is abandoned when it is gone with no container) or
/// the OCI wrapper, which becomes the runtime (when it is gone with no init recorded, the
/// reservation is stale; it is the token the container's hooks carry). Returns the nodes an
/// OCI container gets, owned by the request's container-side uid and gid (the runtime makes
/// them), and its CDI edits. Nothing is reserved on error.
pub fn prepare(f: &World, h: &Holder, req: &Request, by: Option<ProcRef>) -> Result<Given, Error> {
    let mut inv = (f.scan)(f.cfg, scan_for(f.cfg, req))?;
    // GPUs running VMs pass through without a reservation (libvirt's status XML).
    let passed = crate::reserve::vm::passed_through(f.cfg, f.proc);
    let now = now_rfc3339();
    let mut fresh = false;
    let mut stops = Vec::new();
    let chosen = Store::new(&f.cfg.state_file).update(|st| -> Result<_, Error> {
        crate::reserve::vm::mark_passed_through(&mut inv, st, &passed);
        // A quarantined GPU is given to no one (its Xid is the reason a refusal names).
        crate::reserve::health::apply(&mut inv, st);
        refuse_takeover(f, st, h, by)?;
        if let Some(mut kept) = keep_or_free(f, st, &mut inv, h, req, by, &now)? {
            // A daemon that died since is started again.
            kept.notes.extend(crate::reserve::mps::claim(
                f.cfg,
                f.mps,
                f.proc,
                st,
                &inv,
                &kept.units,
            )?);
            // A create again of a kept container: its MPS directories come again.
            record_oci_mps(st, h)?;
            return Ok(kept);
        }
        let (gpus, notes) = choose(f, st, &mut inv, req, &[], &passed)?;
        let edits = prepared_edits(f, h, req, &inv, &gpus)?;
        let (driver, driver_version) = driver_record(f.cfg, req, edits.plan.as_ref());
        st.reservations.insert(
            h.key.clone(),
            Reservation {
                prepared_by: by,
                nodes: as_nodes(&edits.nodes),
                driver,
                driver_version,
                ..new_reservation(h, req, &gpus, &now)
            },
        );
        let mut notes = notes;
        // Stale sharers reclaimed for this choice may have left a daemon without sharers:
        // marked to stop (told to quit after the lock).
        let s = crate::reserve::mps::stop_unused(f.cfg, f.mps, f.proc, st);
        notes.extend(s.notes);
        stops = s.marked;
        notes.extend(crate::reserve::mps::claim(
            f.cfg, f.mps, f.proc, st, &inv, &gpus,
        )?);
        record_oci_mps(st, h)?;
        fresh = true;
        Ok(Chosen {
            units: gpus,
            notes,
            edits,
        })
    });
    let Chosen {
        units: gpus,
        mut notes,
        edits,
    } = match chosen {
        Ok(c) => c,
        Err(e) => {
            keep_reclaimed(f, &mut inv);
            return Err(e);
        }
    };
    notes.extend(crate::reserve::mps::finish_stops(
        f.cfg, f.mps, f.proc, stops,
    ));
    // The daemons marked `starting` above start now, outside the state lock; when one
    // fails, the reservation this call made is taken back with its mark.
    let undo = |st: &mut State| {
        let mine = st
            .reservations
            .get(&h.key)
            .is_some_and(|r| r.phase == Phase::Prepared && r.prepared_by == by);
        if fresh && mine {
            st.reservations.remove(&h.key);
        }
    };
    let up = crate::reserve::mps::bring_up(f.cfg, f.mps, f.proc, &inv, &gpus, &undo)?;
    notes.extend(up.notes);
    for n in notes {
        log::info(&n);
    }
    log::info(&format!(
        "{}: reserved {} for {req}",
        h.id.who_exactly(),
        Unit::join(&gpus, ",")
    ));
    Ok(edits)
}

/// An OCI container's MPS directories, which its runtime mounts from `config.json`, recorded
/// (their targets and the identity of their sources) before they are made, as `attach`
/// records its mounts: a `detach` of the slot takes them back, and an `attach` of another
/// slot mounts no second set.
fn record_oci_mps(st: &mut State, h: &Holder) -> Result<(), Error> {
    if h.kind() != HolderKind::Oci {
        return Ok(());
    }
    let units = st
        .reservations
        .get(&h.key)
        .map(|r| r.gpus.clone())
        .unwrap_or_default();
    super::mounts::record_mps_mounts(st, &h.key, &units).map(drop)
}

/// The transition table's `Prepare` row: an OCI `create` of an ID whose container runs, or
/// is being created by another `create` that lives, is refused (an engine's retry, another
/// runtime root, a race: neither takes over nor moves that reservation; a stale one is taken
/// over). libvirt runs one step of a domain at a time: its `prepare` meets no live holder of
/// its own.
fn refuse_takeover(f: &World, st: &State, h: &Holder, by: Option<ProcRef>) -> Result<(), Error> {
    no_twin(st, h)?;
    let Some(r) = st.reservations.get(&h.key) else {
        return Ok(());
    };
    let found = match h.kind() {
        HolderKind::Oci => r.found(|p| f.proc.alive(p), by),
        _ => Found {
            phase: r.phase,
            live: false,
        },
    };
    match Transition::Prepare.from(Some(found)) {
        Err(Blocked::Runs) => Err(LifecycleError::AlreadyRuns {
            gpus: r.gpus.clone(),
            init: r.init.map_or(0, |i| i.pid),
        }
        .into()),
        Err(_) => Err(LifecycleError::AnotherCreate {
            gpus: r.gpus.clone(),
            pid: r.prepared_by.map_or(0, |p| p.pid),
        }
        .into()),
        Ok(_) => Ok(()),
    }
}

/// A container whose ID is a domain's UUID holding GPUs, or the reverse: refused, as before
/// holders had keys of their own kinds (the one name would be two holders').
pub(super) fn no_twin(st: &State, h: &Holder) -> Result<(), Error> {
    for key in h.id.twins() {
        if let Some(r) = st.reservations.get(&key) {
            return Err(LifecycleError::KeyOfAnother {
                id: h.id.domain_and_uuid().1.to_string(),
                holder: r.who(),
            }
            .into());
        }
    }
    Ok(())
}

/// What the locked step of `prepare` settled on: the units, what was done for them (for the
/// log), and what the container gets.
struct Chosen {
    units: Vec<Unit>,
    notes: Vec<String>,
    edits: Given,
}

/// The holder's reservation, kept (prepared again) when it still fits the request; else
/// removed, its GPUs freed for the new choice (one a process still has open drains).
fn keep_or_free(
    f: &World,
    st: &mut State,
    inv: &mut Inventory,
    h: &Holder,
    req: &Request,
    by: Option<ProcRef>,
    now: &str,
) -> Result<Option<Chosen>, Error> {
    let Some(r) = st.reservations.get_mut(&h.key) else {
        return Ok(None);
    };
    inv.settle(f.cfg, &r.gpus);
    if satisfies(inv, &r.gpus, req) {
        r.set_prepared(by, now);
        r.holder = h.id.clone();
        r.request = req.to_string();
        let gpus = r.gpus.clone();
        let edits = prepared_edits(f, h, req, inv, &gpus)?;
        if let Some(r) = st.reservations.get_mut(&h.key) {
            r.nodes = as_nodes(&edits.nodes);
            r.mounts.clear();
            r.rootfs = Default::default();
            (r.driver, r.driver_version) = driver_record(f.cfg, req, edits.plan.as_ref());
        }
        return Ok(Some(Chosen {
            units: gpus,
            notes: Vec::new(),
            edits,
        }));
    }
    if let Some(old) = st.reservations.remove(&h.key) {
        drain::after_free_in(inv, f.cfg, st, std::slice::from_ref(&old), f.proc);
    }
    Ok(None)
}

/// With `reset_on_release`, a request refused after it reclaimed stale reservations still
/// lets go of them, in a locked step of its own: their GPUs are scrub pending, and the next
/// `health scan` resets them. (Else a stale reservation would be reclaimed and rolled back
/// with each refused request, its GPUs never scrubbed, never free.)
pub(super) fn keep_reclaimed(f: &World, inv: &mut Inventory) {
    if !f.cfg.reset_on_release {
        return;
    }
    let r = Store::new(&f.cfg.state_file).update(|st| -> Result<Vec<String>, Error> {
        let any = st
            .reservations
            .values()
            .any(|r| stale_on(r, f.proc, f.controller_running).is_some());
        Ok(if any {
            reclaim_for(f, st, inv).0
        } else {
            Vec::new()
        })
    });
    match r {
        Ok(notes) => notes.iter().for_each(|n| log::info(n)),
        Err(e) => log::warn(&format!("stale reservations not let go of: {e}")),
    }
}

/// The choice: GPUs for the request, and what reclaiming for it did (for the log).
pub(super) fn choose(
    f: &World,
    st: &mut State,
    inv: &mut Inventory,
    req: &Request,
    sharing: &[crate::ids::Pci],
    passed: &crate::reserve::vm::PassedThrough,
) -> Result<(Vec<Unit>, Vec<String>), Error> {
    // A typo in an architecture's name is said as such (no GPU could ever match it).
    alloc::known_arch(req, &alloc::known_archs(f.cfg, &inv.gpus))?;
    let mut notes = Vec::new();
    // Stale reservations (holder gone) are reclaimed only when the request does not fit
    // otherwise: the common path reads no /proc file per reservation.
    // A lazy scan left the NVIDIA driver's details of the chosen GPUs for now: a chosen
    // GPU that turns out unusable (or in MIG mode) is marked, and the choice made again
    // without it.
    if req.mig {
        settle_for_migs(f.cfg, inv, &st.held(None), req);
    }
    let mut reclaimed = false;
    // Each retry marks at least one more GPU unusable: never more than the GPUs, plus the
    // reclaim's.
    let mut tries = inv.gpus.len() + 2;
    let gpus = loop {
        let g = match alloc::allocate_beside(&inv.gpus, &st.held(None), req, sharing) {
            Ok(g) => g,
            Err(e) => {
                // Stale reservations (holder gone) are reclaimed, and draining GPUs
                // looked at again, only when the request does not fit otherwise: the
                // common path reads no /proc file per reservation.
                if !reclaimed {
                    reclaimed = true;
                    let (n, changed) = reclaim_for(f, st, inv);
                    notes = n;
                    if changed {
                        continue;
                    }
                }
                return Err(refusal(f, req, st, e, inv.deferred, passed).into());
            }
        };
        inv.settle(f.cfg, &g);
        if g.iter().all(|p| unit_ok(inv, p)) {
            break g;
        }
        tries -= 1;
        if tries == 0 {
            return Err(LifecycleError::Unsettled {
                units: Unit::join(&g, ","),
            }
            .into());
        }
    };
    Ok((gpus, notes))
}

/// An OCI container's nodes (and driver files) are decided at `create` (the runtime makes
/// them from its config); a libvirt domain's at `started`, in the running container — but
/// its driver files (CDI specs, or the host's driver) are looked for at `prepare` too, so
/// that a request that cannot get them reserves nothing.
fn prepared_edits(
    f: &World,
    h: &Holder,
    req: &Request,
    inv: &Inventory,
    gpus: &[Unit],
) -> Result<Given, Error> {
    // A libvirt domain's nodes are made at `started`; a VM gets none.
    let libvirt = matches!(h.kind(), HolderKind::Libvirt | HolderKind::Vm);
    let driver = wants_driver(f.cfg, req).is_some();
    if libvirt && !driver {
        return Ok(Given::default());
    }
    let e = given(f, h, req, inv, gpus)?;
    if libvirt {
        return Ok(Given {
            nodes: Vec::new(),
            plan: e.plan,
        });
    }
    Ok(e)
}

/// The refusal for a request that does not fit. A lazy scan left out the functions that can
/// be no usable GPU: their reasons belong in the refusal, so the host is looked at whole
/// (only on this path) and the choice made again for its words.
fn refusal(
    f: &World,
    req: &Request,
    st: &State,
    e: alloc::AllocError,
    deferred: usize,
    passed: &crate::reserve::vm::PassedThrough,
) -> alloc::AllocError {
    // A MIG request looked at the instances of only as many GPUs as it needed.
    if deferred == 0 && !req.mig {
        return e;
    }
    let full = Scan {
        caps: Some(req.capabilities),
        lazy: false,
    };
    match (f.scan)(f.cfg, full) {
        Ok(mut inv) => {
            crate::reserve::vm::mark_passed_through(&mut inv, st, passed);
            crate::reserve::health::apply(&mut inv, st);
            alloc::allocate(&inv.gpus, &st.held(None), req)
                .err()
                .unwrap_or(e)
        }
        Err(_) => e,
    }
}
