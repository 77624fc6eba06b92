//! The nodes a container gets for its units: their specs, their owner through the holder's
//! id map, the container root's host ids.

use super::error::LifecycleError;
use super::holder::Holder;
use crate::host::inventory::Inventory;
use crate::ids::Unit;
use crate::node::NodeSpec;
use crate::request::Request;
use crate::reserve::error::Error;
use crate::reserve::state::Node;

/// The nodes a container gets for its GPUs, with mode and host-side owner.
pub(super) fn node_specs(
    h: &Holder,
    req: &Request,
    inv: &Inventory,
    gpus: &[Unit],
) -> Result<Vec<NodeSpec>, Error> {
    for p in gpus {
        let g = inv
            .by_unit(p)
            .ok_or(LifecycleError::UnitGone { unit: *p })?;
        // An instance deleted (or MIG mode left) since: its GPU's node alone would be more.
        if p.is_mig() && inv.mig(p).is_none() {
            return Err(LifecycleError::MigGone { unit: *p }.into());
        }
        if g.nodes.is_empty() {
            return Err(LifecycleError::NoDeviceNode {
                unit: *p,
                why: g.problem.clone(),
            }
            .into());
        }
    }
    owned(
        h,
        req,
        inv.nodes_for(gpus, req.capabilities)
            .into_iter()
            .map(|n| (n.node, n.mode)),
    )
}

/// Nodes (each with its host node's mode) as the container gets them: the request's mode, if
/// it says one, and owned by the request's container-side uid and gid through the holder's
/// id map.
pub(super) fn owned(
    h: &Holder,
    req: &Request,
    nodes: impl IntoIterator<Item = (Node, u32)>,
) -> Result<Vec<NodeSpec>, Error> {
    let (uid, gid) = h.idmap.owner(req.uid, req.gid, h.idmap_names())?;
    Ok(nodes
        .into_iter()
        .map(|(node, mode)| NodeSpec {
            mode: req.mode.unwrap_or(mode),
            node,
            uid,
            gid,
        })
        .collect())
}

pub(super) fn as_nodes(specs: &[NodeSpec]) -> Vec<Node> {
    specs.iter().map(|s| s.node.clone()).collect()
}

/// The host ids of the container's root (through its `<idmap>`; unmapped: nobody).
pub(super) fn root_owner(h: &Holder) -> crate::enter::rootfs::Owner {
    crate::enter::rootfs::Owner {
        uid: h.idmap.host_uid(0).unwrap_or(65534),
        gid: h.idmap.host_gid(0).unwrap_or(65534),
    }
}
