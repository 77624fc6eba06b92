//! OCI `create` and the OCI door's frees: the reservation a `create` makes, held by a guard
//! ([`OciCreate`]) that frees it once, on the first error or when the runtime could not be
//! started (the wrapper `exec`s it: a guard never dropped is a reservation kept); what the
//! host gives the runtime beside `config.json` ([`OciCreate::host_side`]: `/dev/char` links,
//! the MPS daemon's directory, the nodes of a user-namespaced container, made under the state
//! lock); the frees of `delete` and `poststop`, which take the node directories nobody holds
//! any more in the same locked step.

use super::free::free;
use super::holder::Holder;
use super::plan::Given;
use super::prepare::prepare;
use super::store::mps_dir;
use crate::cdi;
use crate::enter::private_nodes::{self, PrivateNodeError};
use crate::host::charlink::{self, CharLinkError};
use crate::host::config::Config;
use crate::host::procfs::ProcRef;
use crate::log;
use crate::node::NodeSpec;
use crate::request::Request;
use crate::reserve::error::Error;
use crate::reserve::state::{HolderId, Reservation, State, StateError, Store};
use crate::reserve::world::World;
use std::path::{Path, PathBuf};

/// Why the host side of a create could not be made ready.
#[derive(Debug, thiserror::Error)]
pub enum OciCreateError {
    /// A node's host `/dev/char` entry ([`crate::host::charlink`]'s words).
    #[error(transparent)]
    CharLink(#[from] CharLinkError),
    #[error("its reservation was released meanwhile")]
    Released,
    #[error(transparent)]
    Nodes(#[from] PrivateNodeError),
    #[error(transparent)]
    State(#[from] StateError),
}

/// What one `create` reserved: the nodes the container gets, the CDI plan, and the reserving
/// process (the token its hooks carry). Freed when dropped (only while it is still this
/// create's: the ID may be another live container's by then), unless [`OciCreate::roll_back`]
/// freed it already.
pub struct OciCreate<'a> {
    f: World<'a>,
    /// Its reservation's holder: the container, or the pod's allocation it holds.
    holder: HolderId,
    /// The container's ID.
    container: String,
    pub by: ProcRef,
    pub nodes: Vec<NodeSpec>,
    pub plan: Option<cdi::Plan>,
    armed: bool,
}

/// `create` of an OCI container: reserves for the holder ([`prepare`]), `by` the wrapper
/// (the door's own process); the guard returned frees it on the way out of anything but an
/// `exec` of the runtime.
pub fn oci_create<'a>(
    f: &World<'a>,
    h: &Holder,
    req: &Request,
    by: ProcRef,
) -> Result<OciCreate<'a>, Error> {
    let Given { nodes, plan } = prepare(f, h, req, Some(by))?;
    Ok(OciCreate {
        f: *f,
        holder: h.id.clone(),
        container: h.name().to_string(),
        by,
        nodes,
        plan,
        armed: true,
    })
}

/// What the host gives the runtime beside the nodes' numbers.
#[derive(Debug, Default)]
pub struct HostSide {
    /// The directory of the MPS daemon serving the container's slots, if one does.
    pub mps: Option<PathBuf>,
    /// The nodes gpuhook made for a user-namespaced container, for the runtime to bind.
    pub binds: Option<Vec<String>>,
}

impl<'a> OciCreate<'a> {
    /// The guard of a container's create with a pod's allocation (`holder`): its units go
    /// back to the pod when it frees.
    pub(super) fn for_pod(
        f: &World<'a>,
        holder: HolderId,
        container: &str,
        by: ProcRef,
        nodes: Vec<NodeSpec>,
        plan: Option<cdi::Plan>,
    ) -> OciCreate<'a> {
        OciCreate {
            f: *f,
            holder,
            container: container.to_string(),
            by,
            nodes,
            plan,
            armed: true,
        }
    }

    /// The host's `/dev/char/MAJ:MIN` entry of each node (under the config's device root),
    /// made when missing ([`crate::host::charlink`]; a node with no host node of that number
    /// to link to is left without one, an entry that leads elsewhere refuses the create);
    /// the MPS daemon's directory; with a user namespace (`userns`) the nodes
    /// ([`OciCreate::private_nodes`]).
    pub fn host_side(&self, userns: bool) -> Result<HostSide, OciCreateError> {
        let cfg = self.f.cfg;
        // runc's systemd driver hands systemd only the rules whose /dev/char entry exists:
        // without one, the GPU is gone from the container at the next `systemctl
        // daemon-reload`.
        for n in &self.nodes {
            charlink::ensure_logged(&cfg.dev, &n.path, n.major, n.minor)?;
        }
        let mps = mps_dir(cfg, &self.holder.key());
        let binds = if userns {
            Some(self.private_nodes()?)
        } else {
            None
        };
        Ok(HostSide { mps, binds })
    }

    /// Makes the nodes (numbers from the host's nodes, owner and mode from the request
    /// mapped through the container's user namespace) for the runtime to bind-mount; returns
    /// their paths. All under the state lock, so that no free or sweep races it: only while
    /// the ID's reservation is still this create's; directories of IDs that hold no container
    /// reservation are removed on the way.
    pub fn private_nodes(&self) -> Result<Vec<String>, OciCreateError> {
        let cfg = self.f.cfg;
        Store::new(&cfg.state_file).update(|st| {
            if st
                .reservations
                .get(&self.holder.key())
                .is_none_or(|r| r.prepared_by != Some(self.by))
            {
                return Err(OciCreateError::Released);
            }
            let root = nodes_root(cfg);
            private_nodes::prepare_root(&root)?;
            sweep(cfg, st);
            Ok(private_nodes::make(
                &root.join(&self.container),
                &self.nodes,
            )?)
        })
    }

    /// Frees what this create reserved, now, because of `e`: returns `e`, or the free's own
    /// error when the free failed.
    pub fn roll_back<E: From<Error>>(mut self, e: E) -> E {
        self.armed = false;
        match self.free() {
            Ok(_) => e,
            Err(fe) => fe.into(),
        }
    }

    fn free(&self) -> Result<Option<Reservation>, Error> {
        let by = self.by;
        free_oci(&self.f, &self.holder, |r| r.prepared_by == Some(by))
    }
}

impl Drop for OciCreate<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.free();
        }
    }
}

/// Where gpuhook makes the nodes of user-namespaced containers: beside the state (root
/// only, on tmpfs), one directory per container ID.
fn nodes_root(cfg: &Config) -> PathBuf {
    cfg.state_file
        .parent()
        .unwrap_or(Path::new("/run/gpuhook"))
        .join("nodes")
}

/// Removes the node directories of IDs that hold no container reservation (freed, released
/// by an operator, reclaimed as stale). Called under the state lock.
fn sweep(cfg: &Config, st: &State) {
    private_nodes::sweep(&nodes_root(cfg), |name| st.container_key(name).is_some());
}

/// Frees the container's reservation when `cond` holds for it, and removes node directories
/// nobody holds any more, in one locked step. A container that holds a pod's allocation
/// (`ctr` that allocation, or the container) gives its units back to the pod instead.
pub fn free_oci(
    f: &World,
    ctr: &HolderId,
    cond: impl Fn(&Reservation) -> bool,
) -> Result<Option<Reservation>, Error> {
    let pod_key = match ctr {
        HolderId::Pod { .. } => Some(ctr.key()),
        HolderId::Oci { id } => Store::new(&f.cfg.state_file)
            .read()
            .ok()
            .and_then(|st| st.container_key(id))
            .filter(|k| k.as_str().starts_with("pod:")),
        _ => None,
    };
    if let Some(key) = pod_key {
        return back_to_pod(f, &key, cond);
    }
    let key = ctr.key();
    let mine = |st: &State| match st.reservations.get(&key) {
        Some(r) if cond(r) => vec![(key.clone(), ())],
        _ => Vec::new(),
    };
    let freed = free(f, mine, |st| sweep(f.cfg, st))?;
    Ok(freed.freed.into_iter().next().map(|(r, ())| r))
}

/// A pod's allocation under `key`, held by a container, back to the pod (pending) when `cond`
/// holds for it, and the node directories nobody holds swept, in one locked step. Returns
/// the reservation as it was.
fn back_to_pod(
    f: &World,
    key: &crate::reserve::state::HolderKey,
    cond: impl Fn(&Reservation) -> bool,
) -> Result<Option<Reservation>, Error> {
    let now = crate::reserve::state::now_rfc3339();
    Store::new(&f.cfg.state_file).update(|st| -> Result<_, Error> {
        let out = match st.reservations.get_mut(key) {
            Some(r) if cond(r) && r.holder.pod().is_some_and(|p| p.container.is_some()) => {
                let was = r.clone();
                r.to_pending(&now);
                Some(was)
            }
            _ => None,
        };
        sweep(f.cfg, st);
        Ok(out)
    })
}

/// `delete`, `poststop`: frees the container's reservation when `cond` holds for it (decided
/// under the lock); a pod's allocation goes back to the pod. Errors are logged: the caller's
/// status stands.
pub fn release_oci(f: &World, id: &str, stage: &str, cond: impl Fn(&Reservation) -> bool) {
    let ctr = HolderId::Oci { id: id.into() };
    // Nothing held and no nodes left (an operator's `gpuhook release` frees the reservation
    // but cannot remove a running container's nodes): nothing to do.
    if !Store::new(&f.cfg.state_file).mentions(&ctr) && !nodes_root(f.cfg).join(id).exists() {
        return;
    }
    let who = ctr.who();
    match free_oci(f, &ctr, cond) {
        Ok(Some(r)) if r.kind() == crate::reserve::state::HolderKind::Pod => log::info(&format!(
            "{who}: {stage}: {} back to {}, pending",
            crate::ids::Unit::join(&r.gpus, ","),
            r.holder.who_exactly()
        )),
        Ok(Some(r)) => log::info(&format!(
            "{who}: {stage}: freed {}",
            crate::ids::Unit::join(&r.gpus, ",")
        )),
        Ok(None) => {}
        Err(e) => log::error(&format!("{who}: {stage}: cannot free its GPUs: {e}")),
    }
}
