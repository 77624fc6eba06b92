//! `reconnect`: re-adopting a running container's reservation, from the state or from its
//! device cgroup's exact grants.

use super::activate::apply;
use super::error::LifecycleError;
use super::holder::{new_reservation, Holder};
use super::nodes::{as_nodes, node_specs, owned};
use super::plan::{wants_driver, with_plan};
use crate::cgroup::{CgroupError, DeviceCgroup};
use crate::enter::container::{Container, ContainerError};
use crate::enter::rootfs::Mounted;
use crate::host::inventory::{Inventory, Scan};
use crate::ids::{Pci, Unit};
use crate::log;
use crate::node::NodeSpec;
use crate::request::{DeviceSel, Request};
use crate::reserve::alloc;
use crate::reserve::drain;
use crate::reserve::error::Error;
use crate::reserve::reconcile::reclaim_stale;
use crate::reserve::state::Store;
use crate::reserve::state::{now_rfc3339, Node, Started, State};
use crate::reserve::world::World;

/// How [`readopt`] ended; the front door decides what it means for the container (libvirt
/// kills it when it is inconsistent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readopted {
    /// Reservation, grants and nodes are as they should be.
    Consistent,
    /// gpuhook's own files (config, state, inventory) could not be read: logged, and the
    /// running container left alone (stopping it would not fix them).
    LeftAlone,
    /// The container cannot be made consistent (its GPU is another's, its `/dev` refuses a
    /// node, its init is gone).
    Inconsistent,
}

/// gpuhook's own files could not be read: said, and the container left alone.
fn soft(h: &Holder, what: &str, e: &dyn std::fmt::Display) -> Readopted {
    log::error(&format!(
        "{}: reconnect: {what}: {e}; container left as it is",
        h.who()
    ));
    Readopted::LeftAlone
}

/// The container cannot be made consistent: said.
fn fatal(h: &Holder, e: Error) -> Readopted {
    log::error(&format!(
        "{}: reconnect: container cannot be made consistent: {e}",
        h.who()
    ));
    Readopted::Inconsistent
}

/// `reconnect` of a holder whose door could not read the config: said, and the container
/// left alone.
pub fn config_unreadable(h: &Holder, e: &dyn std::fmt::Display) -> Readopted {
    soft(h, "cannot read the config", e)
}

/// The container's device cgroup, when it could be opened.
type Cgroup = Option<Box<dyn DeviceCgroup>>;

/// What the locked step decided: the GPUs, the nodes, the driver mounts recorded.
struct Decided {
    gpus: Vec<Unit>,
    specs: Vec<NodeSpec>,
    mounts: Vec<Mounted>,
}

/// `reconnect`: re-adopts a running container's reservation (from its device cgroup when
/// the state lost it), re-grants and re-makes what it lost.
pub fn readopt(
    f: &World,
    h: &Holder,
    req: &Request,
    find: impl FnOnce() -> Result<Container, ContainerError>,
) -> Readopted {
    let mut inv = match (f.scan)(f.cfg, Scan::FULL) {
        Ok(mut i) => {
            // Reconnect is rare: settle every GPU (adoption looks at all of them).
            let all: Vec<Pci> = i.gpus.iter().map(|g| g.pci).collect();
            i.settle(f.cfg, &all);
            i
        }
        Err(e) => return soft(h, "cannot read the GPU inventory", &e),
    };
    let ct = match find() {
        Ok(c) => c,
        Err(e) => return fatal(h, e.into()),
    };
    // What the container's device cgroup grants, read now, before the lock: adoption decides
    // from it under the lock without touching the container (whose /dev could stall us).
    let (mut cg, granted) = match (f.cgroup)(f.cfg, &ct) {
        Ok(c) => {
            let g = granted_gpus(&*c, &inv);
            (Some(c), g)
        }
        Err(e) => (None, Err(e)),
    };
    let now = now_rfc3339();
    let mut adopted = None;
    let decided =
        Store::new(&f.cfg.state_file).update(|st| -> Result<Result<Decided, Error>, Error> {
            let (notes, freed) = reclaim_stale(f.proc, f.controller_running, st);
            for n in notes {
                log::info(&n);
            }
            drain::after_free_in(&mut inv, f.cfg, st, &freed, f.proc);
            Ok(decide(
                f,
                st,
                h,
                req,
                &inv,
                granted,
                &mut cg,
                &ct,
                &now,
                &mut adopted,
            ))
        });
    let Decided {
        gpus,
        specs,
        mounts,
    } = match decided {
        Err(e) => return soft(h, "cannot update the state", &e),
        Ok(Err(e)) => return fatal(h, e),
        Ok(Ok(d)) => d,
    };
    if let Some(ignored) = adopted.as_ref().filter(|i| !i.is_empty()) {
        warn_ignored(h, req, &inv, &cg, ignored);
    }
    // The driver files mounted at `started`: a container's root may unmount them (its own
    // business); said, never a reason to stop it.
    if !mounts.is_empty() {
        match f.enter.check_mounts(&ct, &mounts) {
            Ok(gone) if gone.is_empty() => {}
            Ok(gone) => log::warn(&format!(
                "{}: reconnect: {} of {} CDI driver mount(s) are no longer in place: {}",
                h.who(),
                gone.len(),
                mounts.len(),
                gone.join(" ")
            )),
            Err(e) => log::warn(&format!(
                "{}: reconnect: cannot check its CDI driver mounts: {e}",
                h.who()
            )),
        }
    }
    match apply(f, &ct, &specs) {
        Ok(a) => {
            log::info(&format!(
                "{}: reconnect: {} GPUs {}; re-granted {} and re-created {} node(s)",
                h.who(),
                if adopted.is_some() {
                    "re-adopted"
                } else {
                    "kept"
                },
                Unit::join(&gpus, ","),
                a.granted.len(),
                a.created.len()
            ));
            Readopted::Consistent
        }
        Err(e) => fatal(h, e),
    }
}

/// Under the state lock: the holder's GPUs (kept, or adopted from the cgroup's grants, the
/// granted ones it does not hold denied, `adopted`), its nodes, and the reservation made
/// running with this container.
#[allow(clippy::too_many_arguments)]
fn decide(
    f: &World,
    st: &mut State,
    h: &Holder,
    req: &Request,
    inv: &Inventory,
    granted: Result<Vec<Unit>, CgroupError>,
    cg: &mut Cgroup,
    ct: &Container,
    now: &str,
    adopted: &mut Option<Vec<Unit>>,
) -> Result<Decided, Error> {
    // A reservation changed in the running container (attach, detach) holds what it holds,
    // whatever the request says: its units, and the nodes recorded for them.
    let (gpus, recorded) = match st.reservations.get(&h.key) {
        Some(r) => (r.gpus.clone(), r.hotplugged.then(|| r.nodes.clone())),
        None => {
            let held = st.held(Some(&h.key));
            // A top-up never takes a quarantined GPU.
            let mut healthy = inv.clone();
            crate::reserve::health::apply(&mut healthy, st);
            let (g, ignored) = adopt(req, &healthy, &held, &granted?)?;
            // Access the state does not account for would let two containers
            // share a GPU: taken away before the lock lets anyone reserve it.
            // (`granted` came from the cgroup: it is open.)
            if let Some(c) = cg.as_mut() {
                deny_left_out(&mut **c, inv, &ignored, &g)?;
            }
            *adopted = Some(ignored);
            (g, None)
        }
    };
    let mut specs = node_specs(h, req, inv, &gpus)?;
    if let Some(nodes) = recorded {
        let more = recorded_beyond(h, req, inv, &nodes, &specs)?;
        specs.extend(more);
    }
    // The nodes a CDI spec gives come back too (a spec that went bad since is said,
    // and the container keeps what it has). The host's driver gives no nodes of its own.
    if wants_driver(f.cfg, req) == Some(crate::request::Driver::Cdi) {
        match with_plan(f, h, req, inv, &gpus, specs.clone()) {
            Ok(e) => specs = e.nodes,
            Err(e) => log::warn(&format!(
                "{}: reconnect: its CDI spec's nodes are not re-made: {e}",
                h.who()
            )),
        }
    }
    let r = st
        .reservations
        .entry(h.key.clone())
        .or_insert_with(|| new_reservation(h, req, &gpus, now));
    // A reconnect runs it whatever it was (the table's `Reconnect` row refuses nothing).
    let started = Started {
        controller: Some(ct.controller),
        init: ct.init,
        nodes: as_nodes(&specs),
        cgroup: None,
        namespaces: None,
    };
    r.set_running(started, now);
    Ok(Decided {
        gpus,
        specs,
        mounts: r.mounts.clone(),
    })
}

/// The nodes recorded for a hotplugged reservation beyond those its request gives its units
/// (an attach asked for other capabilities): the host's nodes of those numbers, owned as the
/// request's are. A recorded node the host no longer has is not made again (a CDI spec's
/// nodes come back through the spec).
fn recorded_beyond(
    h: &Holder,
    req: &Request,
    inv: &Inventory,
    recorded: &[Node],
    specs: &[NodeSpec],
) -> Result<Vec<NodeSpec>, Error> {
    let host = inv
        .gpus
        .iter()
        .flat_map(|g| {
            g.nodes
                .iter()
                .map(|(_, n)| n)
                .chain(g.migs.iter().flat_map(|m| [&m.gi_cap, &m.ci_cap]))
        })
        .chain(inv.controls.iter().map(|(_, n)| n));
    let mut more: Vec<(Node, u32)> = Vec::new();
    for n in host {
        if recorded.contains(&n.node)
            && !specs.iter().any(|s| s.node == n.node)
            && !more.iter().any(|(m, _)| *m == n.node)
        {
            more.push((n.node.clone(), n.mode));
        }
    }
    owned(h, req, more)
}

/// The cgroup granted GPUs beyond what the container holds: said, with what a wildcard rule
/// still allows of them.
fn warn_ignored(h: &Holder, req: &Request, inv: &Inventory, cg: &Cgroup, ignored: &[Unit]) {
    let open = match cg {
        Some(c) => still_allowed(&**c, inv, ignored),
        None => Vec::new(),
    };
    log::warn(&format!(
        "{}: reconnect: its device cgroup also granted GPU(s) {} beyond what it holds for {req}; access taken away{}",
        h.who(),
        Unit::join(ignored, ","),
        if open.is_empty() {
            String::new()
        } else {
            format!(
                " (a wildcard rule of its cgroup still allows {})",
                open.join(", ")
            )
        }
    ));
}

/// The GPUs of which the container's device cgroup grants any of their own nodes by an
/// exact rule (an AMD or Intel GPU's render node alone gives compute). The cgroup is kernel
/// state the container cannot widen for itself; the nodes in its `/dev` are not evidence (it
/// can make them), and a wildcard rule names no GPU.
fn granted_gpus(cg: &dyn DeviceCgroup, inv: &Inventory) -> Result<Vec<Unit>, CgroupError> {
    let mut out = Vec::new();
    for g in &inv.gpus {
        // A GPU in MIG mode: its instances, by their compute instance's capability (the
        // parent's node comes with every instance of it).
        if !g.migs.is_empty() {
            for m in &g.migs {
                if cg.grants_exactly(&m.ci_cap.node)? {
                    out.push(m.id(g.pci));
                }
            }
            continue;
        }
        for (_, n) in &g.nodes {
            if cg.grants_exactly(&n.node)? {
                out.push(Unit::Gpu(g.pci));
                break;
            }
        }
    }
    Ok(out)
}

/// Of the granted GPUs, none is another holder's (whole, by an instance, or through a
/// compute instance of the same GPU instance): else the container cannot be reconciled.
fn none_anothers(
    req: &Request,
    inv: &Inventory,
    held: &alloc::Held,
    granted: &[Unit],
) -> Result<(), Error> {
    for p in granted {
        // An instance held, or its GPU held whole; a GPU held whole or by an instance.
        let h = if p.is_mig() {
            held.get(p)
                .or_else(|| held.get(&Unit::Gpu(p.pci())))
                .map(String::as_str)
        } else if req.share && inv.by_unit(p).is_some_and(|g| g.sharing.is_some()) {
            // Its other sharers are no obstacle: allocating a slot of it decides.
            None
        } else {
            alloc::busy(held, p.pci())
        };
        if let Some(h) = h {
            return Err(LifecycleError::UsedByAnother {
                unit: *p,
                holder: h.to_string(),
            }
            .into());
        }
        // Another holder's compute instance of the same GPU instance: they would share it.
        if let Some(((other, h), gi)) = inv
            .mig(p)
            .and_then(|(g, m)| alloc::gi_holder(held, g.pci, m.gi).map(|x| (x, m.gi)))
        {
            return Err(LifecycleError::GpuInstanceShared {
                unit: *p,
                gi,
                holder: h.to_string(),
                through: other.to_string(),
            }
            .into());
        }
    }
    Ok(())
}

/// The state lost a running container's reservation: take back the GPUs its device cgroup
/// grants (`granted`), as far as they fit the request and never more than it asks for, and
/// top up to the request's count; or reserve afresh when it has none. GPUs the request names
/// come first, then granted ones fill the other places. A granted GPU that another domain
/// holds cannot be reconciled. Pure: it reads neither the container nor the host. Returns
/// the GPUs and the granted ones it does not hold (their access must be taken away).
fn adopt(
    req: &Request,
    inv: &Inventory,
    held: &alloc::Held,
    granted: &[Unit],
) -> Result<(Vec<Unit>, Vec<Unit>), Error> {
    none_anothers(req, inv, held, granted)?;
    if req.mig {
        let named: Vec<Unit> = req
            .migs
            .iter()
            .filter_map(|s| {
                alloc::resolve(&inv.gpus, &s.gpu).map(|g| Unit::Mig {
                    pci: g.pci,
                    gi: s.gi,
                    ci: s.ci,
                })
            })
            .collect();
        let room = (req.count as usize).saturating_sub(req.migs.len());
        let mut want = req.clone();
        want.migs.extend(
            granted
                .iter()
                .filter(|p| !named.contains(p))
                .filter_map(|p| inv.mig(p))
                .filter(|(g, _)| g.usable() && alloc::matches(g, &req.filters))
                .take(room)
                .map(|(g, m)| crate::request::MigSel {
                    gpu: DeviceSel::Pci(g.pci.to_string()),
                    gi: m.gi,
                    ci: m.ci,
                }),
        );
        let units = alloc::allocate(&inv.gpus, held, &want)?;
        let left_out = granted
            .iter()
            .filter(|p| !units.contains(p))
            .copied()
            .collect();
        return Ok((units, left_out));
    }
    let named: Vec<Pci> = req
        .devices
        .iter()
        .filter_map(|s| alloc::resolve(&inv.gpus, s).map(|g| g.pci))
        .collect();
    let room = (req.count as usize).saturating_sub(req.devices.len());
    let fill: Vec<&Unit> = granted
        .iter()
        .filter(|p| !p.is_mig() && !named.contains(&p.pci()))
        .filter(|p| {
            inv.by_unit(p)
                .is_some_and(|g| g.usable() && alloc::matches(g, &req.filters))
        })
        .take(room)
        .collect();
    let mut want = req.clone();
    want.devices
        .extend(fill.iter().map(|p| DeviceSel::Pci(p.to_string())));
    let gpus = alloc::allocate(&inv.gpus, held, &want)?;
    // A slot of a shared GPU keeps what the whole GPU was granted.
    let left_out = granted
        .iter()
        .filter(|p| !gpus.iter().any(|u| u.pci() == p.pci()))
        .copied()
        .collect();
    Ok((gpus, left_out))
}

/// The own nodes of these units: a whole GPU's nodes; a MIG instance's two capabilities
/// (its GPU's node serves every instance of it).
fn own_nodes<'a>(inv: &'a Inventory, gpus: &'a [Unit]) -> impl Iterator<Item = Node> + 'a {
    gpus.iter().flat_map(move |p| -> Vec<Node> {
        match inv.mig(p) {
            Some((_, m)) => vec![m.gi_cap.node.clone(), m.ci_cap.node.clone()],
            None if p.is_mig() => vec![],
            None => inv.by_unit(p).map(|g| g.own_nodes()).unwrap_or_default(),
        }
    })
}

/// Takes away the container's access to GPUs it was granted but does not hold: every node of
/// their own (shared control nodes stay). One deny each on the domain cgroup (v1 passes it
/// down to every cgroup below): cheap enough to run under the state lock. An error when one
/// fails (the container cannot then be made consistent).
fn deny_left_out(
    cg: &mut dyn DeviceCgroup,
    inv: &Inventory,
    gpus: &[Unit],
    kept: &[Unit],
) -> Result<(), Error> {
    if gpus.is_empty() {
        return Ok(());
    }
    // A GPU instance's capability that a kept compute instance of it still needs stays.
    let keep: Vec<Node> = own_nodes(inv, kept).collect();
    for node in own_nodes(inv, gpus).filter(|n| !keep.contains(n)) {
        cg.deny(&node)
            .map_err(|source| LifecycleError::CannotDeny {
                gpus: gpus.to_vec(),
                source,
            })?;
    }
    Ok(())
}

/// Which of those GPUs' nodes a rule of the container's cgroup still allows after the deny
/// (a wildcard, `c 226:* rwm`, which an exact deny cannot take back): for the log.
fn still_allowed(cg: &dyn DeviceCgroup, inv: &Inventory, gpus: &[Unit]) -> Vec<String> {
    own_nodes(inv, gpus)
        .filter(|n| cg.is_allowed(n).unwrap_or(false))
        .map(|n| n.path)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reserve::alloc::tests::{cap_node, dgx, req, with_migs};

    /// The whole GPU of index `i` in [`dgx`].
    fn pci(i: usize) -> Unit {
        format!("0000:{:02x}:00.0", 0x10 + i).parse().unwrap()
    }

    fn pcis(ix: &[usize]) -> Vec<Unit> {
        ix.iter().map(|i| pci(*i)).collect()
    }

    #[test]
    fn adoption_takes_what_the_cgroup_grants_never_more_than_asked() {
        let inv = Inventory {
            gpus: dgx(),
            controls: vec![],
            deferred: 0,
        };
        let none = alloc::Held::new();
        // Nothing granted: reserve afresh.
        let (g, out) = adopt(&req(2), &inv, &none, &[]).unwrap();
        assert_eq!((g.len(), out.len()), (2, 0));
        // Granted 5 and 6 for a 2-GPU request: those two, whatever is placed better.
        let (g, out) = adopt(&req(2), &inv, &none, &pcis(&[5, 6])).unwrap();
        assert_eq!((g, out), (pcis(&[5, 6]), vec![]));
        // Granted three for a 1-GPU request: one kept, the others to be taken away.
        let (g, out) = adopt(&req(1), &inv, &none, &pcis(&[3, 5, 6])).unwrap();
        assert_eq!((g, out), (pcis(&[3]), pcis(&[5, 6])));
        // Granted one for a 2-GPU request: topped up.
        let (g, out) = adopt(&req(2), &inv, &none, &pcis(&[7])).unwrap();
        assert!(
            g.contains(&pci(7)) && g.len() == 2 && out.is_empty(),
            "{g:?}"
        );
        // Held by another domain: cannot be reconciled.
        let mut held = alloc::Held::new();
        held.insert(pci(5), "domain 'other'".into());
        let e = adopt(&req(1), &inv, &held, &pcis(&[5])).unwrap_err();
        assert!(e.to_string().contains("reserved by domain 'other'"), "{e}");
    }

    /// The state lost a MIG container's reservation: its grants name the instance it uses
    /// (by the compute instance's capability), never another, and a held one is a conflict.
    #[test]
    fn mig_adoption_takes_the_granted_instances() {
        let mut gpus = dgx();
        gpus[0] = with_migs(gpus[0].clone(), &[(1, 0), (2, 0), (7, 0)]);
        let inv = Inventory {
            gpus,
            controls: vec![],
            deferred: 0,
        };
        let unit = |gi: u32| Unit::Mig {
            pci: pci(0).pci(),
            gi,
            ci: 0,
        };
        let mut r = req(1);
        r.mig = true;
        let mut held = alloc::Held::new();
        held.insert(unit(1), "domain 'other'".into());
        // It uses gi2: exactly that one, whatever packing would prefer.
        let (g, out) = adopt(&r, &inv, &held, &[unit(2)]).unwrap();
        assert_eq!((g, out), (vec![unit(2)], vec![]));
        // It uses an instance another holds: cannot be reconciled.
        let e = adopt(&r, &inv, &held, &[unit(1)]).unwrap_err();
        assert!(e.to_string().contains("reserved by domain 'other'"), "{e}");
        // Two granted for one asked: one kept, the other's capabilities to take away.
        let (g, out) = adopt(&r, &inv, &held, &[unit(2), unit(7)]).unwrap();
        assert_eq!((g, out), (vec![unit(2)], vec![unit(7)]));
        let gone: Vec<Node> = own_nodes(&inv, &[unit(7)]).collect();
        assert_eq!(
            gone,
            [cap_node(63).node, cap_node(64).node],
            "not the GPU's own node"
        );
        // The GPU held whole by another: its instances are no one else's.
        let mut whole = alloc::Held::new();
        whole.insert(pci(0), "domain 'w'".into());
        assert!(adopt(&r, &inv, &whole, &[unit(2)]).is_err());
    }

    /// The state lost a MIG container's reservation and its cgroup grants a compute instance
    /// of a GPU instance another holder uses: a conflict (they would share its memory and
    /// engines); a top-up never takes such an instance either.
    #[test]
    fn mig_adoption_refuses_a_shared_gpu_instance() {
        let mut gpus = dgx();
        gpus[0] = with_migs(gpus[0].clone(), &[(7, 0), (7, 1), (8, 0)]);
        let inv = Inventory {
            gpus,
            controls: vec![],
            deferred: 0,
        };
        let unit = |gi: u32, ci: u32| Unit::Mig {
            pci: pci(0).pci(),
            gi,
            ci,
        };
        let mut r = req(1);
        r.mig = true;
        let mut held = alloc::Held::new();
        held.insert(unit(7, 0), "domain 'other'".into());
        let e = adopt(&r, &inv, &held, &[unit(7, 1)]).unwrap_err();
        assert!(
            e.to_string().contains(&format!(
                "it uses MIG instance {}, whose GPU instance gi 7 is reserved by domain 'other' (through {})",
                unit(7, 1),
                unit(7, 0)
            )),
            "{e}"
        );
        // Nothing granted: a fresh choice is the other GPU instance.
        let (g, _) = adopt(&r, &inv, &held, &[]).unwrap();
        assert_eq!(g, [unit(8, 0)]);
        // Both compute instances of gi 7 granted to one container: its own, adopted.
        r.count = 2;
        let none = alloc::Held::new();
        let (g, out) = adopt(&r, &inv, &none, &[unit(7, 0), unit(7, 1)]).unwrap();
        assert_eq!((g, out), (vec![unit(7, 0), unit(7, 1)], vec![]));
    }

    /// A request naming index 0 with count 2 was topped up with GPU 2 (GPU 1 was held then);
    /// the state is lost: GPU 2 is re-adopted, not GPU 1 (nearer), which would leave GPU 2
    /// granted to the container and free in the state.
    #[test]
    fn adoption_fills_unnamed_places_from_the_grants() {
        let inv = Inventory {
            gpus: dgx(),
            controls: vec![],
            deferred: 0,
        };
        let mut r = req(2);
        r.devices = vec![DeviceSel::Index(0)];
        let (g, out) = adopt(&r, &inv, &alloc::Held::new(), &pcis(&[0, 2])).unwrap();
        assert_eq!((g, out), (pcis(&[0, 2]), vec![]));
        // A granted GPU that does not fit the filters is not adopted, and is reported.
        let mut r = req(1);
        r.filters = vec![crate::request::Filter {
            field: crate::request::Field::Arch,
            op: crate::request::extra_specs::Op::Eq("ampere".into()),
        }];
        let mut inv2 = inv.clone();
        inv2.gpus[4].arch = Some("ampere".into());
        let (g, out) = adopt(&r, &inv2, &alloc::Held::new(), &pcis(&[1])).unwrap();
        assert_eq!((g, out), (pcis(&[4]), pcis(&[1])));
    }
}
