//! What kubelet says of its pods, and what the pool does with it: each pod's allocation is
//! matched to the pod and container kubelet lists with its devices (named from then on); a
//! pending allocation kubelet listed before and lists no more is freed (its pod is gone by
//! kubelet's own word), one it never listed is freed once the config's `kubelet_claim_s` has
//! passed since it was made (kubelet refused the pod after `Allocate`); an allocation whose
//! container is gone goes back to its pod, pending.
//!
//! kubelet says it through its pod resources API (`List`: each pod's namespace, name and
//! containers with their devices), or, where that is not served, through its checkpoint
//! file `kubelet_internal_checkpoint` in its plugin directory (JSON: `Data.PodDeviceEntries`,
//! each with `PodUID`, `ContainerName`, `ResourceName`, `DeviceIDs`; and a `Checksum`).

use super::device::device_id;
use super::error::PodError;
use crate::log;
use crate::reserve::lifecycle::free::free;
use crate::reserve::state::{
    now_rfc3339, parse_rfc3339, HolderKey, HolderKind, PodOf, Reservation, State, Store,
};
use crate::reserve::world::World;
use serde_json::Value;

/// Where kubelet's word came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeletSource {
    /// `PodResourcesLister.List` on `pod-resources/kubelet.sock`.
    PodResources,
    /// `kubelet_internal_checkpoint`.
    Checkpoint,
}

/// One container of a pod with its devices of one resource, as kubelet lists them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodDevices {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub uid: Option<String>,
    pub container: String,
    pub resource: String,
    pub ids: Vec<String>,
    /// The allocation kubelet recorded for it, where its word says (the checkpoint keeps
    /// each `Allocate` answer, whose `gpuhook.io/allocation` names it).
    pub alloc: Option<String>,
}

/// Every pod's devices, as kubelet says them now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletView {
    pub source: KubeletSource,
    pub pods: Vec<PodDevices>,
}

/// kubelet's checkpoint file that cannot be read as one.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("kubelet's checkpoint is not JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error("kubelet's checkpoint has no Data.PodDeviceEntries list")]
    NoEntries,
}

impl KubeletView {
    /// kubelet's checkpoint (`kubelet_internal_checkpoint`): `DeviceIDs` is a list (older
    /// kubelets) or a map of NUMA node to list (1.20 and later). Entries of other resources
    /// are kept (they are not gpuhook's and match nothing). `alloc_of` reads the allocation
    /// an entry's `AllocResp` (the `Allocate` answer kubelet kept, base64 protobuf) names.
    /// kubelet keeps a gone pod's entry until its next allocation: two entries may name one
    /// device, and the allocation's own ID tells them apart.
    pub fn from_checkpoint(
        bytes: &[u8],
        alloc_of: &dyn Fn(&str) -> Option<String>,
    ) -> Result<KubeletView, CheckpointError> {
        let v: Value = serde_json::from_slice(bytes).map_err(CheckpointError::Json)?;
        let entries = v
            .pointer("/Data/PodDeviceEntries")
            .and_then(Value::as_array)
            .ok_or(CheckpointError::NoEntries)?;
        let s = |e: &Value, k: &str| e.get(k).and_then(Value::as_str).map(str::to_owned);
        let pods = entries
            .iter()
            .map(|e| {
                let mut ids: Vec<String> = Vec::new();
                let strings = |l: &Value| {
                    l.as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect::<Vec<_>>()
                };
                match e.get("DeviceIDs") {
                    Some(Value::Object(m)) => m.values().for_each(|l| ids.extend(strings(l))),
                    Some(l) => ids.extend(strings(l)),
                    None => {}
                }
                PodDevices {
                    namespace: None,
                    name: None,
                    uid: s(e, "PodUID"),
                    container: s(e, "ContainerName").unwrap_or_default(),
                    resource: s(e, "ResourceName").unwrap_or_default(),
                    ids,
                    alloc: e
                        .get("AllocResp")
                        .and_then(Value::as_str)
                        .and_then(alloc_of),
                }
            })
            .collect();
        Ok(KubeletView {
            source: KubeletSource::Checkpoint,
            pods,
        })
    }

    /// The container kubelet lists with every unit of `r` (a pod's allocation) of its
    /// resource: the one that names this allocation, else one that names an allocation it
    /// took over whole (its alias), else the first that names none, in kubelet's order (an
    /// entry naming another allocation is another pod's).
    fn holder_of(&self, pod: &PodOf, r: &Reservation) -> Option<&PodDevices> {
        let ids: Vec<String> = r.gpus.iter().map(device_id).collect();
        let fits =
            |p: &&PodDevices| p.resource == pod.resource && ids.iter().all(|i| p.ids.contains(i));
        let naming = |ok: &dyn Fn(&str) -> bool| {
            self.pods
                .iter()
                .filter(fits)
                .find(|p| p.alloc.as_deref().is_some_and(ok))
        };
        naming(&|a| a == r.holder.name())
            .or_else(|| naming(&|a| pod.alias(a).is_some()))
            .or_else(|| self.pods.iter().filter(fits).find(|p| p.alloc.is_none()))
    }
}

/// What one pass over the pod allocations decided.
#[derive(Debug, Default, PartialEq, Eq)]
struct Pass {
    /// Allocations to free, each with why.
    free: Vec<(HolderKey, String)>,
    /// What was changed in place, for the log.
    notes: Vec<String>,
}

/// One pass of kubelet's word over the pod allocations: names them, gives the units of a
/// gone container back to its pod, and frees what kubelet no longer (or never) lists (see
/// the module's comment); `now` in seconds since the epoch, `claim_s` the config's
/// `kubelet_claim_s`. Without `view` (kubelet says nothing: no API, no checkpoint) nothing is
/// freed. Returns what was done, for the log.
pub fn sync(
    f: &World,
    view: Option<&KubeletView>,
    now: i64,
    claim_s: u64,
) -> Result<Vec<String>, PodError> {
    let st = Store::new(&f.cfg.state_file);
    // Most passes change nothing: a look without the lock first.
    let mut seen = st.read()?;
    if pass(f, &mut seen, view, now, claim_s, false) == Pass::default() {
        return Ok(Vec::new());
    }
    let plan =
        st.update(|st| -> Result<Pass, PodError> { Ok(pass(f, st, view, now, claim_s, true)) })?;
    let mut notes = plan.notes;
    if plan.free.is_empty() {
        return Ok(notes);
    }
    let chosen = plan.free;
    let released = free(
        f,
        |st: &State| {
            chosen
                .iter()
                .filter(|(k, _)| st.reservations.get(k).is_some_and(still_pending))
                .cloned()
                .collect()
        },
        |_| {},
    )?;
    for (r, why) in released.freed {
        notes.push(format!(
            "{}: freed {} ({why})",
            r.holder.who_exactly(),
            crate::ids::Unit::join(&r.gpus, ",")
        ));
    }
    for n in crate::reserve::drain::notes(&released.drained) {
        notes.push(n);
    }
    Ok(notes)
}

/// A pod's allocation that no container holds, nor is being created with.
fn still_pending(r: &Reservation) -> bool {
    r.kind() == HolderKind::Pod
        && r.prepared_by.is_none()
        && r.init.is_none()
        && r.holder.pod().is_some_and(|p| p.container.is_none())
}

/// Decides (and with `apply`, makes in `st`) what kubelet's word changes.
fn pass(
    f: &World,
    st: &mut State,
    view: Option<&KubeletView>,
    now: i64,
    claim_s: u64,
    apply: bool,
) -> Pass {
    let mut out = Pass::default();
    let now_text = now_rfc3339();
    let keys: Vec<HolderKey> = st
        .reservations
        .iter()
        .filter(|(_, r)| r.kind() == HolderKind::Pod)
        .map(|(k, _)| k.clone())
        .collect();
    for k in keys {
        let r = &st.reservations[&k];
        // Its container gone (or the create that made it): the units go back to the pod.
        if let Some(why) = crate::reserve::reconcile::stale_on(r, f.proc, f.controller_running) {
            out.notes.push(format!(
                "{}: its container is gone ({why}): {} back to the pod, pending",
                r.holder.who_exactly(),
                crate::ids::Unit::join(&r.gpus, ",")
            ));
            if apply {
                st.reservations
                    .get_mut(&k)
                    .expect("listed")
                    .to_pending(&now_text);
            }
        }
        let Some(view) = view else { continue };
        let r = &st.reservations[&k];
        let pod = r.holder.pod().cloned().unwrap_or_default();
        match view.holder_of(&pod, r) {
            Some(p) => {
                let named = PodOf {
                    namespace: p.namespace.clone().or(pod.namespace.clone()),
                    name: p.name.clone().or(pod.name.clone()),
                    uid: p.uid.clone().or(pod.uid.clone()),
                    container_name: Some(p.container.clone()),
                    listed: true,
                    ..pod.clone()
                };
                if named != pod {
                    out.notes.push(format!(
                        "kubelet lists allocation {} ({}) for pod {} container '{}'",
                        r.holder.shown_name(),
                        crate::ids::Unit::join(&r.gpus, ","),
                        named.pod_name().unwrap_or_default(),
                        p.container
                    ));
                    if apply {
                        if let Some(crate::reserve::state::HolderId::Pod { pod, .. }) =
                            st.reservations.get_mut(&k).map(|r| &mut r.holder)
                        {
                            **pod = named;
                        }
                    }
                }
            }
            // Held by a container, or being created with: its removal gives it back first.
            None if !still_pending(r) => {}
            None if pod.listed => out.free.push((
                k.clone(),
                format!(
                    "kubelet's {} no longer lists its pod",
                    source_word(view.source)
                ),
            )),
            None => {
                let age = parse_rfc3339(&r.created).map_or(i64::MAX, |t| now - t);
                if age >= 0 && age as u64 >= claim_s {
                    out.free.push((
                        k.clone(),
                        format!("kubelet never listed it in {claim_s} s (kubelet_claim_s)"),
                    ));
                }
            }
        }
    }
    out
}

fn source_word(s: KubeletSource) -> &'static str {
    match s {
        KubeletSource::PodResources => "pod resources API",
        KubeletSource::Checkpoint => "checkpoint",
    }
}

/// Logs what a pass did.
pub fn log_notes(notes: &[String]) {
    for n in notes {
        log::info(n);
    }
}
