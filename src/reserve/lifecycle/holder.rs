//! Who holds GPUs, as every door names it: [`Holder::libvirt`] for a domain,
//! [`Holder::oci`] for an OCI container; and the reservation a step makes for one.

use crate::ids::Unit;
use crate::request::{IdMap, Request};
use crate::reserve::state::{HolderKind, Phase, Reservation};

/// Who holds GPUs: what the state keys a reservation by (`id`), the name operators know it
/// by, and how its container's user namespace maps ids (nodes are owned by its root).
#[derive(Debug, Clone, Copy)]
pub struct Holder<'a> {
    pub kind: HolderKind,
    pub name: &'a str,
    pub id: &'a str,
    pub idmap: &'a IdMap,
}

impl<'a> Holder<'a> {
    /// A libvirt domain: keyed by its UUID, named by its name, its nodes owned per its
    /// `<idmap>`.
    pub fn libvirt(name: &'a str, uuid: &'a str, idmap: &'a IdMap) -> Holder<'a> {
        Holder {
            kind: HolderKind::Libvirt,
            name,
            id: uuid,
            idmap,
        }
    }

    /// An OCI container: its ID is its name and its key.
    pub fn oci(id: &'a str, idmap: &'a IdMap) -> Holder<'a> {
        Holder {
            kind: HolderKind::Oci,
            name: id,
            id,
            idmap,
        }
    }

    /// How messages name it: `domain 'web1'`, `container 'ID'`.
    pub fn who(&self) -> String {
        self.kind.who(self.name)
    }

    /// How messages name its uid and gid mappings.
    pub(super) fn idmap_names(&self) -> (&'static str, &'static str) {
        match self.kind {
            HolderKind::Libvirt => (
                crate::request::metadata::IDMAP,
                crate::request::metadata::IDMAP,
            ),
            HolderKind::Oci => ("linux.uidMappings", "linux.gidMappings"),
        }
    }
}

/// A new reservation of these units for the holder, in this phase, as of `now`; what a step
/// knows of its container it fills in.
pub(super) fn new_reservation(
    h: &Holder,
    req: &Request,
    gpus: &[Unit],
    phase: Phase,
    now: &str,
) -> Reservation {
    Reservation {
        kind: h.kind,
        domain: h.name.to_string(),
        uuid: h.id.to_string(),
        gpus: gpus.to_vec(),
        phase,
        request: req.to_string(),
        created: now.to_string(),
        updated: now.to_string(),
        prepared_by: None,
        controller: None,
        init: None,
        cgroup: None,
        namespaces: None,
        nodes: Vec::new(),
        mounts: Vec::new(),
        rootfs: Default::default(),
        hotplugged: false,
        node_mounts: Vec::new(),
        driver: None,
        driver_version: None,
    }
}
