//! A virtual machine's steps, as libvirt's QEMU hook drives them: what its hostdevs hold
//! ([`crate::reserve::vm::VmAsk`]) reserved at `prepare` and `restore` ([`vm_prepare`]), still
//! standing at `start` ([`vm_confirm`]), its QEMU process recorded at `started`
//! ([`vm_started`]: the reservation is stale once that process is gone), kept and completed at
//! `reconnect` and `attach` ([`vm_adopt`]); `stopped` and `release` free it by its key
//! ([`super::free_key`]). A VM is keyed `vm:UUID`: nothing it names reaches another holder's
//! reservation.

use super::holder::{new_reservation, Holder};
use super::prepare::reclaim_for;
use crate::host::inventory::Scan;
use crate::host::procfs::ProcRef;
use crate::ids::Unit;
use crate::log;
use crate::reserve::error::Error;
use crate::reserve::reconcile::stale_on;
use crate::reserve::state::{now_rfc3339, Found, Reservation, Started, State, Store, Transition};
use crate::reserve::vm::{self, PassedThrough, VmAsk, VmError};
use crate::reserve::world::World;

/// `prepare` (and `restore`): reserves every unit the VM's hostdevs hold, all or nothing, for
/// the VM (`by`: libvirtd, the hook's parent). A unit held by someone else, passed through to
/// another running VM, or not usable refuses the start in one line naming the GPU and its
/// holder, and nothing is reserved; stale reservations (holders gone) are reclaimed only when
/// the VM does not fit otherwise. A reservation the VM had (a run that ended without a
/// `release`) is replaced.
pub fn vm_prepare(f: &World, h: &Holder, a: &VmAsk, by: Option<ProcRef>) -> Result<(), Error> {
    let passed = vm::passed_through(f.cfg, f.proc);
    let uuid = h.id.uuid().unwrap_or_default().to_string();
    let now = now_rfc3339();
    let notes = Store::new(&f.cfg.state_file).update(|st| -> Result<Vec<String>, Error> {
        let mut notes = Vec::new();
        if let Err(e) = fits(f, st, h, &passed, &uuid, a) {
            if !held_by_another(&e) || !any_stale(f, st) {
                return Err(e.into());
            }
            let mut inv = (f.scan)(f.cfg, Scan::FULL)?;
            notes = reclaim_for(f, st, &mut inv).0;
            fits(f, st, h, &passed, &uuid, a)?;
        }
        let found = st.reservations.get(&h.key).map(|r| Found {
            phase: r.phase,
            live: false,
        });
        // libvirt runs one step of a domain at a time: its prepare meets no live holder of
        // its own.
        if Transition::Prepare.from(found).is_err() {
            return Err(super::error::LifecycleError::AlreadyRuns {
                gpus: a.units.clone(),
                init: 0,
            }
            .into());
        }
        if let Some(old) = st.reservations.remove(&h.key) {
            let gone: Vec<Unit> = old
                .gpus
                .iter()
                .filter(|u| !a.units.contains(u))
                .copied()
                .collect();
            if !gone.is_empty() {
                let mut inv = (f.scan)(f.cfg, Scan::FULL)?;
                crate::reserve::drain::after_free_in(&mut inv, f.cfg, st, &[old], f.proc);
            }
        }
        st.insert(Reservation {
            prepared_by: by,
            ..new_reservation(h, a, &a.units, &now)
        });
        Ok(notes)
    })?;
    for n in notes {
        log::info(&n);
    }
    log::info(&format!(
        "{}: reserved {} for its hostdevs: {a}",
        h.id.who_exactly(),
        Unit::join(&a.units, ",")
    ));
    Ok(())
}

/// Whether the VM may hold `a`'s units in `st` now: nobody else's reservation (nor a
/// draining unit) in the way.
fn fits(
    f: &World,
    st: &State,
    h: &Holder,
    passed: &PassedThrough,
    uuid: &str,
    a: &VmAsk,
) -> Result<(), VmError> {
    vm::check(f.cfg, st, &st.held(Some(&h.key)), passed, uuid, a)
}

/// A refusal that a stale reservation could be behind.
fn held_by_another(e: &VmError) -> bool {
    matches!(
        e,
        VmError::Held { .. } | VmError::MdevOnHeld { .. } | VmError::MdevHeld { .. }
    )
}

fn any_stale(f: &World, st: &State) -> bool {
    st.reservations
        .values()
        .any(|r| stale_on(r, f.proc, f.controller_running).is_some())
}

/// `start`: the VM's reservation still stands: every unit its hostdevs hold is in it, and
/// none has become unusable since `prepare` (quarantined, excluded, gone from the bus).
pub fn vm_confirm(f: &World, h: &Holder, a: &VmAsk) -> Result<(), Error> {
    let st = Store::new(&f.cfg.state_file).read()?;
    let r = st.reservations.get(&h.key);
    let missing: Vec<Unit> = a
        .units
        .iter()
        .filter(|u| !r.is_some_and(|r| r.gpus.contains(u)))
        .copied()
        .collect();
    if !missing.is_empty() {
        return Err(VmError::NotReserved {
            units: Unit::join(&missing, ","),
        }
        .into());
    }
    // Only the GPUs' own state: the reservation is the VM's, so nobody else's is in the way.
    let alone = crate::reserve::alloc::Held::new();
    vm::check(f.cfg, &st, &alone, &PassedThrough::default(), "", a)?;
    Ok(())
}

/// `started`: the VM runs; its QEMU process (`qemu`: libvirt's pid file, its start time) is
/// recorded, so that the reservation is stale once that process is gone. No reservation to
/// record it in (released since `prepare`): an error (libvirt then stops the VM).
pub fn vm_started(f: &World, h: &Holder, a: &VmAsk, qemu: ProcRef) -> Result<(), Error> {
    let now = now_rfc3339();
    Store::new(&f.cfg.state_file).update(|st| -> Result<(), Error> {
        let found = st.reservations.get(&h.key).map(|r| Found {
            phase: r.phase,
            live: false,
        });
        let (Ok(_), Some(r)) = (
            Transition::Start.from(found),
            st.reservations.get_mut(&h.key),
        ) else {
            return Err(VmError::NotReserved {
                units: Unit::join(&a.units, ","),
            }
            .into());
        };
        r.set_running(started(qemu), &now);
        Ok(())
    })?;
    log::info(&format!(
        "{}: started with {} (QEMU pid {})",
        h.id.who_exactly(),
        Unit::join(&a.units, ","),
        qemu.pid
    ));
    Ok(())
}

/// What a VM's reservation records of it once it runs: its QEMU process.
fn started(qemu: ProcRef) -> Started {
    Started {
        controller: None,
        init: qemu,
        nodes: Vec::new(),
        cgroup: None,
        namespaces: None,
    }
}

/// How a `reconnect` or `attach` ended.
#[derive(Debug, Default)]
pub struct Adopted {
    /// Units added to the VM's reservation (it had none, or they were hot-plugged).
    pub added: Vec<Unit>,
    /// Units its hostdevs hold that another holder has: left to them (said in the log).
    pub others: Vec<(Unit, VmError)>,
}

/// `reconnect` (libvirtd restarted while the VM runs) and `attach` (libvirt took over a QEMU
/// it did not start): keeps what the running VM holds and records its QEMU process; the
/// units its hostdevs hold that no one else has are added (a reservation lost with the state,
/// a GPU hot-plugged while it ran); those another holder has stay theirs. Never fails the VM
/// for gpuhook's sake: whatever cannot be done is said in the log.
pub fn vm_adopt(f: &World, h: &Holder, a: &VmAsk, qemu: Option<ProcRef>) -> Result<Adopted, Error> {
    let passed = vm::passed_through(f.cfg, f.proc);
    let uuid = h.id.uuid().unwrap_or_default().to_string();
    let now = now_rfc3339();
    let out = Store::new(&f.cfg.state_file).update(|st| -> Result<Adopted, Error> {
        let mut out = Adopted::default();
        let mine: Vec<Unit> = st
            .reservations
            .get(&h.key)
            .map(|r| r.gpus.clone())
            .unwrap_or_default();
        let held = st.held(Some(&h.key));
        for u in a.units.iter().filter(|u| !mine.contains(u)) {
            let one = VmAsk {
                units: vec![*u],
                named: a
                    .named
                    .iter()
                    .filter(|(k, _)| *k == u)
                    .map(|(k, v)| (*k, v.clone()))
                    .collect(),
            };
            match vm::check(f.cfg, st, &held, &passed, &uuid, &one) {
                Ok(()) => out.added.push(*u),
                Err(e) => out.others.push((*u, e)),
            }
        }
        if mine.is_empty() && out.added.is_empty() {
            return Ok(out);
        }
        let r = st
            .reservations
            .entry(h.key.clone())
            .or_insert_with(|| new_reservation(h, a, &[], &now));
        r.gpus.extend(out.added.iter().copied());
        r.gpus.sort();
        if let Some(q) = qemu {
            r.set_running(started(q), &now);
        }
        Ok(out)
    })?;
    if !out.added.is_empty() {
        log::info(&format!(
            "{}: adopted {} (its hostdevs, not reserved before)",
            h.id.who_exactly(),
            Unit::join(&out.added, ",")
        ));
    }
    for (_, e) in &out.others {
        log::warn(&format!("{}: {e}: left to its holder", h.who()));
    }
    Ok(out)
}
