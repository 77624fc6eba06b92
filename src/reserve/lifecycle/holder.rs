//! Who holds GPUs, as every door names it: [`Holder::libvirt`] for an LXC domain,
//! [`Holder::oci`] for an OCI container, [`Holder::vm`] for a QEMU domain, [`Holder::pod`]
//! for a Kubernetes pod's allocation; and the reservation a step makes for one.

use crate::ids::Unit;
use crate::request::IdMap;
use crate::reserve::state::{HolderId, HolderKey, HolderKind, Phase, PodOf, Reservation};

/// A holder with no user namespace of its own (a VM: nothing is made in it).
static NO_IDMAP: IdMap = IdMap {
    uid: Vec::new(),
    gid: Vec::new(),
};

/// Who holds GPUs: its identity (each kind with its own fields), the key the state files
/// its reservation under, and how its container's user namespace maps ids (nodes are owned
/// by its root).
#[derive(Debug, Clone)]
pub struct Holder<'a> {
    pub id: HolderId,
    pub key: HolderKey,
    pub idmap: &'a IdMap,
}

impl<'a> Holder<'a> {
    fn of(id: HolderId, idmap: &'a IdMap) -> Holder<'a> {
        Holder {
            key: id.key(),
            id,
            idmap,
        }
    }

    /// A libvirt LXC domain: keyed by its UUID, named by its name, its nodes owned per its
    /// `<idmap>`.
    pub fn libvirt(name: &str, uuid: &str, idmap: &'a IdMap) -> Holder<'a> {
        Holder::of(
            HolderId::Libvirt {
                name: name.to_string(),
                uuid: uuid.to_string(),
            },
            idmap,
        )
    }

    /// An OCI container: its ID is its name and (but for one shaped like another kind's
    /// key) its key.
    pub fn oci(id: &str, idmap: &'a IdMap) -> Holder<'a> {
        Holder::of(HolderId::Oci { id: id.to_string() }, idmap)
    }

    /// A libvirt QEMU domain (a virtual machine): named by its name, keyed `vm:UUID`; it has
    /// no container, so no id map.
    pub fn vm(name: &str, uuid: &str) -> Holder<'static> {
        Holder::of(
            HolderId::Vm {
                name: name.to_string(),
                uuid: uuid.to_string(),
            },
            &NO_IDMAP,
        )
    }

    /// A Kubernetes pod's allocation, made by kubelet's device plugin: keyed `pod:ALLOC`,
    /// with what is known of its pod (at first only the resource kubelet asked for); no
    /// container, so no id map (the container created with it is an OCI container's, built
    /// with [`Holder::from_id`] and its own map).
    pub fn pod(alloc: &str, pod: PodOf) -> Holder<'static> {
        Holder::of(
            HolderId::Pod {
                alloc: alloc.to_string(),
                pod: Box::new(pod),
            },
            &NO_IDMAP,
        )
    }

    /// The holder a resolved identity is, with its container's id map.
    pub fn from_id(id: HolderId, idmap: &'a IdMap) -> Holder<'a> {
        Holder::of(id, idmap)
    }

    pub fn kind(&self) -> HolderKind {
        self.id.kind()
    }

    /// The name operators know it by.
    pub fn name(&self) -> &str {
        self.id.name()
    }

    /// How messages name it: `domain 'web1'`, `container 'ID'`, `vm 'vm1'`.
    pub fn who(&self) -> String {
        self.id.who()
    }

    /// How messages name its uid and gid mappings.
    pub(super) fn idmap_names(&self) -> (&'static str, &'static str) {
        match self.kind() {
            HolderKind::Libvirt | HolderKind::Vm => (
                crate::request::metadata::IDMAP,
                crate::request::metadata::IDMAP,
            ),
            HolderKind::Oci | HolderKind::Pod => ("linux.uidMappings", "linux.gidMappings"),
        }
    }
}

/// A new reservation of these units for the holder, prepared as of `now`; what a step knows
/// of its container it fills in (one that runs at once: [`Reservation::set_running`]).
pub(crate) fn new_reservation(
    h: &Holder,
    req: &dyn std::fmt::Display,
    gpus: &[Unit],
    now: &str,
) -> Reservation {
    Reservation {
        holder: h.id.clone(),
        gpus: gpus.to_vec(),
        phase: Phase::Prepared,
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
