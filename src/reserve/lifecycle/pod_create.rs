//! OCI `create` of a Kubernetes container whose `config.json` carries the annotation
//! `gpuhook.io/allocation` (kubelet's device plugin put it there with `Allocate`'s answer):
//! the pod's allocation becomes the container's reservation. Its units stay the pod's: the
//! container holds them (its holder names it, no longer pending) until it is removed, when
//! they go back to the pod's pending allocation (`free_oci`), so a restarted container gets
//! them again and no one else does.
//!
//! Only the pod the allocation was made for gets it: the first container created with it
//! binds it to its CRI sandbox, and kubelet's word (the pod's namespace and name, or UID)
//! must agree with the container's; a container of another pod, or one that is no pod's
//! container at all, is refused (a pod's author can write any `gpuhook.io/` annotation).

use super::error::{LifecycleError, PodCreateError};
use super::holder::Holder;
use super::nodes::as_nodes;
use super::oci_create::OciCreate;
use super::plan::{driver_record, given, scan_for, Given};
use super::prepare::unit_ok;
use crate::host::procfs::ProcRef;
use crate::ids::Unit;
use crate::log;
use crate::request::oci::CriPod;
use crate::request::{IdMap, Request};
use crate::reserve::error::Error;
use crate::reserve::state::{now_rfc3339, HolderId, HolderKey, HolderKind, PodOf, State, Store};
use crate::reserve::world::World;

/// `create` of container `id` of pod `cri` with the pod allocation `alloc`: the allocation's
/// units are its reservation, with the nodes (owned per `idmap` and `req`'s mode, uid, gid)
/// and driver files `req` asks for (`req`'s selection is the allocation's; its capabilities,
/// mode, owner and driver apply). `by` is the wrapper's own process (the token its hooks
/// carry). The guard returned gives the units back to the pod on the way out of anything
/// but an `exec` of the runtime.
pub fn pod_create<'a>(
    f: &World<'a>,
    alloc: &str,
    id: &str,
    cri: Option<&CriPod>,
    idmap: &IdMap,
    req: &Request,
    by: ProcRef,
) -> Result<OciCreate<'a>, Error> {
    if !crate::ids::is_alloc_id(alloc) {
        return Err(LifecycleError::from(PodCreateError::NotAnId {
            alloc: alloc.to_string(),
        })
        .into());
    }
    let cri = cri.ok_or(LifecycleError::from(PodCreateError::NotPodContainer))?;
    let mut inv = (f.scan)(f.cfg, scan_for(f.cfg, req))?;
    let now = now_rfc3339();
    let (holder, edits, key) = Store::new(&f.cfg.state_file).update(|st| -> Result<_, Error> {
        crate::reserve::health::apply(&mut inv, st);
        let (key, only) = find_allocation(st, alloc)?;
        let r = &st.reservations[&key];
        let pod = bound_pod(st, &key, alloc, id, cri, f, by)?;
        // An earlier allocation kubelet gave on (an init container's, reused): its units.
        let units: Vec<Unit> = match &only {
            Some(us) => r.gpus.iter().filter(|u| us.contains(u)).copied().collect(),
            None => r.gpus.clone(),
        };
        inv.settle(f.cfg, &units);
        for u in &units {
            if !unit_ok(&inv, u) {
                let why = inv
                    .by_unit(u)
                    .and_then(|g| g.problem.clone())
                    .unwrap_or_else(|| "no longer on the host".into());
                return Err(LifecycleError::from(PodCreateError::Unusable {
                    alloc: alloc.to_string(),
                    unit: *u,
                    why,
                })
                .into());
            }
        }
        let holder = HolderId::Pod {
            alloc: r.holder.name().to_string(),
            pod: Box::new(pod),
        };
        let h = Holder::from_id(holder.clone(), idmap);
        let edits = given(f, &h, req, &inv, &units)?;
        let (driver, driver_version) = driver_record(f.cfg, req, edits.plan.as_ref());
        let r = st.reservations.get_mut(&key).expect("looked up");
        r.holder = holder.clone();
        r.set_prepared(Some(by), &now);
        r.nodes = as_nodes(&edits.nodes);
        r.driver = driver;
        r.driver_version = driver_version;
        for n in crate::reserve::mps::claim(f.cfg, f.mps, f.proc, st, &inv, &units)? {
            log::info(&n);
        }
        Ok((holder, edits, key))
    })?;
    let units = Store::new(&f.cfg.state_file)
        .read()
        .ok()
        .and_then(|st| st.reservations.get(&key).map(|r| r.gpus.clone()))
        .unwrap_or_default();
    // A daemon that died since the allocation is started again, outside the lock; when that
    // fails the units go back to the pod.
    let undo = |st: &mut State| {
        if let Some(r) = st.reservations.get_mut(&key) {
            if r.prepared_by == Some(by) {
                r.to_pending(&now_rfc3339());
            }
        }
    };
    for n in crate::reserve::mps::bring_up(f.cfg, f.mps, f.proc, &inv, &units, &undo)?.notes {
        log::info(&n);
    }
    log::info(&format!(
        "container '{id}': holds {} of {}",
        Unit::join(&units, ","),
        holder.who_exactly()
    ));
    let Given { nodes, plan } = edits;
    Ok(OciCreate::for_pod(f, holder, id, by, nodes, plan))
}

/// The reservation of pod allocation `alloc`: its own, or the one it lives on in as an alias
/// (with the units that were its own).
fn find_allocation(st: &State, alloc: &str) -> Result<(HolderKey, Option<Vec<Unit>>), Error> {
    let key = Holder::pod(alloc, PodOf::default()).key;
    if st
        .reservations
        .get(&key)
        .is_some_and(|r| r.kind() == HolderKind::Pod)
    {
        return Ok((key, None));
    }
    st.reservations
        .iter()
        .find_map(|(k, r)| {
            let a = r.holder.pod()?.alias(alloc)?;
            Some((k.clone(), Some(a.units.clone())))
        })
        .ok_or_else(|| no_allocation(alloc))
}

fn no_allocation(alloc: &str) -> Error {
    LifecycleError::from(PodCreateError::NoAllocation {
        alloc: alloc.to_string(),
    })
    .into()
}

/// What the allocation under `key` knows of its pod once container `id` of pod `cri` takes
/// it: bound to `cri`'s sandbox (the first container's), named from the container's pod where
/// kubelet has not named it yet. Refused when the allocation is another pod's, or another
/// container of it holds it and lives (or is being created).
fn bound_pod(
    st: &State,
    key: &HolderKey,
    alloc: &str,
    id: &str,
    cri: &CriPod,
    f: &World,
    by: ProcRef,
) -> Result<PodOf, Error> {
    let r = &st.reservations[key];
    let mut pod = r.holder.pod().cloned().unwrap_or_default();
    let ours = cri.who();
    let theirs = || r.holder.who();
    let _ = id;
    let differs =
        |a: &Option<String>, b: &Option<String>| matches!((a, b), (Some(x), Some(y)) if x != y);
    if differs(&pod.sandbox, &Some(cri.sandbox.clone()))
        || differs(&pod.namespace, &cri.namespace)
        || differs(&pod.name, &cri.name)
        || differs(&pod.uid, &cri.uid)
    {
        return Err(LifecycleError::from(PodCreateError::AnotherPod {
            alloc: alloc.to_string(),
            theirs: theirs(),
            ours,
        })
        .into());
    }
    if let Some(c) = pod.container.as_deref() {
        // Its container runs (a container of this ID too: an engine's retry), or another
        // create of one lives.
        if r.found(|p| f.proc.alive(p), Some(by)).live {
            return Err(LifecycleError::from(PodCreateError::InUse {
                alloc: alloc.to_string(),
                container: c.to_string(),
            })
            .into());
        }
    }
    pod.sandbox = Some(cri.sandbox.clone());
    pod.namespace = pod.namespace.or_else(|| cri.namespace.clone());
    pod.name = pod.name.or_else(|| cri.name.clone());
    pod.uid = pod.uid.or_else(|| cri.uid.clone());
    pod.container_name = pod.container_name.or_else(|| cri.container.clone());
    pod.container = Some(id.to_string());
    Ok(pod)
}
