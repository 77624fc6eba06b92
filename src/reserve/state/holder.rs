//! Who holds a reservation: each kind of holder with the identity of its own
//! ([`HolderId`]), the key the state files its reservation under ([`HolderKey`], never the
//! same for two kinds), and which holders a name answers to ([`By`]).
//!
//! In the state file a reservation still names its holder as it always did: `kind` (absent
//! for a libvirt LXC domain), `domain` and `uuid` (an OCI container's ID in both); a file
//! written before loads with the same meaning. A Kubernetes pod's allocation (kind `pod`)
//! adds what kubelet and its container told of it in a `pod` object.

use crate::ids::normalize_uuid;
use serde::{Deserialize, Serialize};

/// How many characters of a pod allocation's ID output others may read shows.
const SHOWN_ALLOC: usize = 8;

/// Which kind of holder: a libvirt LXC domain, an OCI container, a libvirt QEMU domain (a
/// virtual machine), a Kubernetes pod's allocation (made by kubelet's device plugin). State
/// files written before OCI support have no `kind`: their reservations are libvirt's, and
/// libvirt's are still written without it.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum HolderKind {
    #[default]
    Libvirt,
    Oci,
    Vm,
    Pod,
}

impl HolderKind {
    /// The kinds an operator's command names by a name (`--domain`, `--container`, `--vm`),
    /// in the order refusals name them. A pod's allocation is kubelet's: freed by its word
    /// (or its claim's end), never by an operator's name.
    pub const ALL: [HolderKind; 3] = [HolderKind::Libvirt, HolderKind::Oci, HolderKind::Vm];
    /// Every kind, in the order metrics name them.
    pub const EVERY: [HolderKind; 4] = [
        HolderKind::Libvirt,
        HolderKind::Oci,
        HolderKind::Vm,
        HolderKind::Pod,
    ];

    /// As `list --json` and the metrics name it: `libvirt`, `oci`, `vm`.
    pub fn as_str(self) -> &'static str {
        match self {
            HolderKind::Libvirt => "libvirt",
            HolderKind::Oci => "oci",
            HolderKind::Vm => "vm",
            HolderKind::Pod => "pod",
        }
    }

    pub(super) fn is_libvirt(&self) -> bool {
        *self == HolderKind::Libvirt
    }

    /// How messages name a holder of this kind: `domain 'web1'`, `container 'ID'`, `vm 'vm1'`.
    pub fn who(self, name: &str) -> String {
        format!("{} '{name}'", self.word())
    }

    /// The word messages name this kind by: `domain`, `container`, `vm`, `pod`.
    pub fn word(self) -> &'static str {
        match self {
            HolderKind::Libvirt => "domain",
            HolderKind::Oci => "container",
            HolderKind::Vm => "vm",
            HolderKind::Pod => "pod",
        }
    }

    /// The front door through which a holder of this kind reserves (`gpuhook show`): its
    /// word in JSON, and how the text says it.
    pub fn door(self) -> (&'static str, &'static str) {
        match self {
            HolderKind::Libvirt => ("lxc-hook", "the libvirt LXC hook (prepare)"),
            HolderKind::Oci => ("oci-runtime", "gpuhook-runtime (the OCI runtime's create)"),
            HolderKind::Vm => ("qemu-hook", "the libvirt QEMU hook (prepare)"),
            HolderKind::Pod => ("device-plugin", "kubelet's device plugin (Allocate)"),
        }
    }

    /// The option of the operator's commands that says a name is of this kind: `--domain`,
    /// `--container`, `--vm`.
    pub fn flag(self) -> &'static str {
        match self {
            HolderKind::Libvirt => "--domain",
            HolderKind::Oci => "--container",
            HolderKind::Vm => "--vm",
            HolderKind::Pod => "--pod",
        }
    }
}

/// Who holds a reservation, each kind with the fields of its own.
///
/// A new kind is a variant here, its key a prefix of its own ([`HolderId::key`]), its JSON
/// `kind` a variant of [`HolderKind`], and a constructor of `reserve/lifecycle/holder.rs`'s
/// `Holder`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(try_from = "Named")]
pub enum HolderId {
    /// A libvirt LXC domain: its name, and its UUID (lowercase) that the state keys it by.
    Libvirt { name: String, uuid: String },
    /// An OCI container: its ID, its name and its key.
    Oci { id: String },
    /// A libvirt QEMU domain (a virtual machine): its name and its UUID.
    Vm { name: String, uuid: String },
    /// A Kubernetes pod's allocation, made by kubelet's device plugin: its ID (the
    /// `gpuhook.io/allocation` annotation's value, the key), and what kubelet and the
    /// container created with it told of it.
    Pod { alloc: String, pod: Box<PodOf> },
}

/// What is known of a pod's allocation beside its ID: the resource kubelet asked for; the
/// pod (namespace and name from kubelet's pod resources API, UID from its checkpoint) and
/// its container's name, once kubelet names them; the sandbox of the first container
/// created with it (the pod it is bound to); the OCI container that holds its units now
/// (none: pending).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodOf {
    /// The extended resource (`gpuhook.io/gpu`, `gpuhook.io/mig-1g.10gb`, …).
    pub resource: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The container of the pod, as the pod's spec names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_name: Option<String>,
    /// Whether kubelet has listed it (then a pod resources list or checkpoint without it
    /// frees it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub listed: bool,
    /// The CRI sandbox (pod) of the first container created with it: only that pod's
    /// containers get its units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// The OCI container that holds its units now (created through gpuhook-runtime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Allocations kubelet made before of units it then gave to this one, whole (a container
    /// of the pod reusing an init container's devices, as kubelet does): a container created
    /// with one of them gets this reservation, with those units.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<Alias>,
}

/// An earlier allocation of a pod's units, now another allocation's ([`PodOf::aliases`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Alias {
    pub alloc: String,
    pub units: Vec<crate::ids::Unit>,
}

impl PodOf {
    /// Whether the allocation `alloc` is one of its aliases, and its units if so.
    pub fn alias(&self, alloc: &str) -> Option<&Alias> {
        self.aliases.iter().find(|a| a.alloc == alloc)
    }

    /// How messages name the pod: `NAMESPACE/NAME`, else its UID, else nothing known.
    pub fn pod_name(&self) -> Option<String> {
        match (&self.namespace, &self.name, &self.uid) {
            (Some(ns), Some(n), _) => Some(format!("{ns}/{n}")),
            (_, _, Some(uid)) => Some(uid.clone()),
            _ => None,
        }
    }
}

/// How a name answers to a holder: by its UUID (a libvirt domain's or a VM's), or by its
/// name (an OCI container's ID is its name). A UUID wins over a name, as `virsh` looks a
/// domain up: one named like another's UUID does not catch what is meant for that one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum By {
    Uuid,
    Name,
}

impl HolderId {
    pub fn kind(&self) -> HolderKind {
        match self {
            HolderId::Libvirt { .. } => HolderKind::Libvirt,
            HolderId::Oci { .. } => HolderKind::Oci,
            HolderId::Vm { .. } => HolderKind::Vm,
            HolderId::Pod { .. } => HolderKind::Pod,
        }
    }

    /// The name operators know it by: the domain's or VM's name, the container's ID, a
    /// pod's allocation ID.
    pub fn name(&self) -> &str {
        match self {
            HolderId::Libvirt { name, .. } | HolderId::Vm { name, .. } => name,
            HolderId::Oci { id } => id,
            HolderId::Pod { alloc, .. } => alloc,
        }
    }

    /// Its name as output others may read shows it (metrics, messages that reach another
    /// tenant): [`Self::name`], but a pod's allocation by the first 8 characters of its ID
    /// only (`01234567…`). The whole ID is the key to the pod's units (a container naming
    /// it in `gpuhook.io/allocation` takes them): kubelet and root alone see it.
    pub fn shown_name(&self) -> std::borrow::Cow<'_, str> {
        match self {
            HolderId::Pod { alloc, .. } => {
                let head: String = alloc.chars().take(SHOWN_ALLOC).collect();
                std::borrow::Cow::Owned(format!("{head}…"))
            }
            _ => std::borrow::Cow::Borrowed(self.name()),
        }
    }

    /// Its UUID, for the kinds that have one (libvirt's domains).
    pub fn uuid(&self) -> Option<&str> {
        match self {
            HolderId::Libvirt { uuid, .. } | HolderId::Vm { uuid, .. } => Some(uuid),
            HolderId::Oci { .. } | HolderId::Pod { .. } => None,
        }
    }

    /// `domain` and `uuid` as the state file and `list --json` write them: an OCI
    /// container's ID in both, a pod's allocation ID in both.
    pub fn domain_and_uuid(&self) -> (&str, &str) {
        match self {
            HolderId::Libvirt { name, uuid } | HolderId::Vm { name, uuid } => (name, uuid),
            HolderId::Oci { id } => (id, id),
            HolderId::Pod { alloc, .. } => (alloc, alloc),
        }
    }

    /// What is known of a pod's allocation.
    pub fn pod(&self) -> Option<&PodOf> {
        match self {
            HolderId::Pod { pod, .. } => Some(pod),
            _ => None,
        }
    }

    /// How messages name it: `domain 'web1'`, `container 'ID'`, `vm 'vm1'`; a pod's
    /// allocation by its pod (`pod 'ns/name' container 'main'`) once kubelet named it, else
    /// by the head of its ID (`pod allocation '01234567…'`: [`Self::shown_name`]; messages
    /// reach other tenants).
    pub fn who(&self) -> String {
        match self {
            HolderId::Pod { pod, .. } => match pod.pod_name() {
                Some(p) => match &pod.container_name {
                    Some(c) => format!("pod '{p}' container '{c}'"),
                    None => format!("pod '{p}'"),
                },
                None => format!("pod allocation '{}'", self.shown_name()),
            },
            _ => self.kind().who(self.name()),
        }
    }

    /// As `release` and `reconcile` say what they freed: with its UUID where it has one
    /// (`domain 'web1' (UUID)`), a container by its ID once (`container 'ID'`).
    pub fn who_exactly(&self) -> String {
        match self.uuid() {
            Some(u) => format!("{} ({u})", self.who()),
            None => self.who(),
        }
    }

    /// As a refusal lists the holders a name answers to: `libvirt domain 'x' (UUID)`, `vm 'x'
    /// (UUID)`, `OCI container 'x'`.
    pub fn who_by_kind(&self) -> String {
        match self {
            HolderId::Libvirt { .. } => format!("libvirt {}", self.who_exactly()),
            HolderId::Oci { .. } => format!("OCI {}", self.who()),
            HolderId::Vm { .. } | HolderId::Pod { .. } => self.who_exactly(),
        }
    }

    /// Whether `name` names it, and how: a libvirt domain or VM by its UUID (any case) or its
    /// name, a container by its ID.
    pub fn answers_to(&self, name: &str) -> Option<By> {
        match self {
            HolderId::Libvirt { name: n, uuid } | HolderId::Vm { name: n, uuid } => {
                if normalize_uuid(name).as_deref() == Some(uuid.as_str()) {
                    Some(By::Uuid)
                } else {
                    (n == name).then_some(By::Name)
                }
            }
            HolderId::Oci { id } => (id == name).then_some(By::Name),
            // kubelet's to free, not an operator's name's.
            HolderId::Pod { .. } => None,
        }
    }

    /// The key the state files its reservation under. The two kinds that were there first
    /// keep the keys their files have always had: a libvirt LXC domain its UUID (in libvirt's
    /// lowercase form, as the domain XML's parser gives it), an OCI container its ID. Every
    /// other key carries its kind (`vm:UUID`), and so does an OCI ID that could be taken for
    /// another kind's key (one shaped like a UUID, or with a `:`), and a libvirt UUID that is
    /// not one (only a file written by hand has such): a key without a `:` is a libvirt
    /// domain's UUID or a container's ID that is no UUID, and no two kinds ever share one.
    pub fn key(&self) -> HolderKey {
        HolderKey(match self {
            HolderId::Libvirt { uuid, .. } if normalize_uuid(uuid).as_deref() == Some(uuid) => {
                uuid.clone()
            }
            HolderId::Libvirt { uuid, .. } => format!("libvirt:{uuid}"),
            HolderId::Oci { id } if normalize_uuid(id).is_none() && !id.contains(':') => id.clone(),
            HolderId::Oci { id } => format!("oci:{id}"),
            HolderId::Vm { uuid, .. } => format!("vm:{uuid}"),
            HolderId::Pod { alloc, .. } => format!("pod:{alloc}"),
        })
    }

    /// The keys of the holders of the other kind that was there first with this holder's ID
    /// (a container whose ID is this domain's UUID, a domain whose UUID is this container's
    /// ID): such a holder is not given a reservation beside theirs (as before keys had
    /// kinds; a VM and an LXC domain may share a UUID).
    pub fn twins(&self) -> Vec<HolderKey> {
        match self {
            HolderId::Libvirt { uuid, .. } => vec![HolderId::Oci { id: uuid.clone() }.key()],
            HolderId::Oci { id } => vec![HolderId::Libvirt {
                name: String::new(),
                uuid: id.clone(),
            }
            .key()],
            HolderId::Vm { .. } | HolderId::Pod { .. } => Vec::new(),
        }
    }

    /// The key a file written before holders had keys of their own filed a holder of the
    /// kinds there were then under: its `uuid` field (a domain's UUID, a container's ID).
    pub(super) fn legacy_key(&self) -> Option<&str> {
        match self {
            HolderId::Libvirt { uuid, .. } => Some(uuid),
            HolderId::Oci { id } => Some(id),
            HolderId::Vm { .. } | HolderId::Pod { .. } => None,
        }
    }

    /// A holder as tests write one: `id` a libvirt domain's or VM's UUID, or a container's ID
    /// (`name` then the same).
    #[cfg(test)]
    pub fn for_test(kind: HolderKind, name: &str, id: &str) -> HolderId {
        match kind {
            HolderKind::Libvirt => HolderId::Libvirt {
                name: name.into(),
                uuid: id.into(),
            },
            HolderKind::Oci => HolderId::Oci { id: id.into() },
            HolderKind::Vm => HolderId::Vm {
                name: name.into(),
                uuid: id.into(),
            },
            HolderKind::Pod => HolderId::Pod {
                alloc: id.into(),
                pod: Box::new(PodOf {
                    resource: "gpuhook.io/gpu".into(),
                    ..PodOf::default()
                }),
            },
        }
    }
}

/// The state's key of a holder's reservation ([`HolderId::key`]); ordered as its text, so
/// the file lists reservations as it always did.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct HolderKey(String);

impl HolderKey {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for HolderKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Unit tests look reservations up by the key's text (`reservations["c1"]`); the code never
/// does (a container's ID is not always its key).
#[cfg(test)]
impl std::borrow::Borrow<str> for HolderKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// A holder as the state file names it (`kind`, `domain`, `uuid`; a pod's allocation
/// also `pod`).
#[derive(Deserialize)]
struct Named {
    #[serde(default)]
    kind: HolderKind,
    domain: String,
    uuid: String,
    #[serde(default)]
    pod: Option<PodOf>,
}

/// What a reservation's `kind`, `domain`, `uuid` and `pod` cannot be.
#[derive(Debug, thiserror::Error)]
pub enum NamedTwice {
    #[error(
        "an OCI reservation names its container '{domain}' in `domain` but '{uuid}' in `uuid`"
    )]
    Container { domain: String, uuid: String },
    #[error("a pod's reservation names its allocation '{domain}' in `domain` but '{uuid}' in `uuid`, or has no `pod`")]
    Pod { domain: String, uuid: String },
    #[error("a reservation of kind '{kind}' has a `pod` object")]
    NotPod { kind: &'static str },
}

impl TryFrom<Named> for HolderId {
    type Error = NamedTwice;
    fn try_from(n: Named) -> Result<HolderId, NamedTwice> {
        if n.pod.is_some() && n.kind != HolderKind::Pod {
            return Err(NamedTwice::NotPod {
                kind: n.kind.as_str(),
            });
        }
        Ok(match n.kind {
            HolderKind::Libvirt => HolderId::Libvirt {
                name: n.domain,
                uuid: n.uuid,
            },
            HolderKind::Oci if n.domain == n.uuid => HolderId::Oci { id: n.uuid },
            HolderKind::Oci => {
                return Err(NamedTwice::Container {
                    domain: n.domain,
                    uuid: n.uuid,
                })
            }
            HolderKind::Vm => HolderId::Vm {
                name: n.domain,
                uuid: n.uuid,
            },
            HolderKind::Pod => match n.pod {
                Some(pod) if n.domain == n.uuid && crate::ids::is_alloc_id(&n.uuid) => {
                    HolderId::Pod {
                        alloc: n.uuid,
                        pod: Box::new(pod),
                    }
                }
                _ => {
                    return Err(NamedTwice::Pod {
                        domain: n.domain,
                        uuid: n.uuid,
                    })
                }
            },
        })
    }
}

/// The same fields, written: `kind` left out for a libvirt domain (as files have always had
/// it).
#[derive(Serialize)]
struct NamedRef<'a> {
    #[serde(skip_serializing_if = "HolderKind::is_libvirt")]
    kind: HolderKind,
    domain: &'a str,
    uuid: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod: Option<&'a PodOf>,
}

impl Serialize for HolderId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (domain, uuid) = self.domain_and_uuid();
        NamedRef {
            kind: self.kind(),
            domain,
            uuid,
            pod: self.pod(),
        }
        .serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: &str = "4c7f30aa-ffe6-489b-80ff-0f27ece176a3";

    fn lxc(name: &str, uuid: &str) -> HolderId {
        HolderId::Libvirt {
            name: name.into(),
            uuid: uuid.into(),
        }
    }
    fn oci(id: &str) -> HolderId {
        HolderId::Oci { id: id.into() }
    }
    fn vm(name: &str, uuid: &str) -> HolderId {
        HolderId::Vm {
            name: name.into(),
            uuid: uuid.into(),
        }
    }

    /// The kinds that were there first keep their keys; a VM's carries its kind; an OCI ID
    /// that looks like another kind's key carries its own.
    #[test]
    fn keys_keep_their_old_form_and_never_collide() {
        assert_eq!(lxc("web1", U).key().as_str(), U);
        assert_eq!(oci("ctr-a").key().as_str(), "ctr-a");
        // A libvirt UUID not in libvirt's own form (only a file written by hand has one).
        assert_eq!(lxc("x", "c1").key().as_str(), "libvirt:c1");
        assert_eq!(vm("web1", U).key().as_str(), format!("vm:{U}"));
        // A container named like a domain's UUID, or like a VM's key.
        assert_eq!(oci(U).key().as_str(), format!("oci:{U}"));
        assert_eq!(
            oci(&U.to_uppercase()).key().as_str(),
            format!("oci:{}", U.to_uppercase())
        );
        let vm_key = format!("vm:{U}");
        assert_eq!(oci(&vm_key).key().as_str(), format!("oci:{vm_key}"));
        // Every pair of kinds, with the same name and UUID or ID: distinct keys.
        let ids = [
            lxc(U, U),
            vm(U, U),
            oci(U),
            lxc("a", "x"),
            vm("a", "x"),
            oci("x"),
            oci(&format!("vm:{U}")),
            oci(&format!("libvirt:{U}")),
            oci(&format!("oci:{U}")),
        ];
        let keys: std::collections::BTreeSet<HolderKey> = ids.iter().map(HolderId::key).collect();
        assert_eq!(keys.len(), ids.len(), "{keys:?}");
    }

    #[test]
    fn a_name_answers_by_uuid_before_name() {
        assert_eq!(lxc("web1", U).answers_to("web1"), Some(By::Name));
        assert_eq!(lxc("web1", U).answers_to(&U.to_uppercase()), Some(By::Uuid));
        assert_eq!(vm("vm1", U).answers_to(U), Some(By::Uuid));
        assert_eq!(lxc("web1", U).answers_to("web2"), None);
        assert_eq!(oci("c1").answers_to("c1"), Some(By::Name));
        assert_eq!(oci("c1").answers_to("C1"), None);
        // A domain named like another's UUID answers to it by name only.
        assert_eq!(
            lxc(U, "11111111-1111-1111-1111-111111111111").answers_to(U),
            Some(By::Name)
        );
        assert!(By::Uuid < By::Name);
    }

    #[test]
    fn how_messages_name_each_kind() {
        assert_eq!(lxc("a", U).who(), "domain 'a'");
        assert_eq!(oci("a").who(), "container 'a'");
        assert_eq!(vm("a", U).who(), "vm 'a'");
        assert_eq!(lxc("a", U).who_exactly(), format!("domain 'a' ({U})"));
        assert_eq!(oci("a").who_exactly(), "container 'a'");
        assert_eq!(vm("a", U).who_by_kind(), format!("vm 'a' ({U})"));
        assert_eq!(oci("a").who_by_kind(), "OCI container 'a'");
        assert_eq!(
            lxc("a", U).who_by_kind(),
            format!("libvirt domain 'a' ({U})")
        );
    }

    /// As the state file names holders: libvirt without `kind`, a container's ID twice.
    #[test]
    fn the_file_names_holders_as_before() {
        for (id, text) in [
            (
                lxc("web1", U),
                format!("{{\"domain\":\"web1\",\"uuid\":\"{U}\"}}"),
            ),
            (
                oci("c1"),
                "{\"kind\":\"oci\",\"domain\":\"c1\",\"uuid\":\"c1\"}".into(),
            ),
            (
                vm("vm1", U),
                format!("{{\"kind\":\"vm\",\"domain\":\"vm1\",\"uuid\":\"{U}\"}}"),
            ),
        ] {
            assert_eq!(serde_json::to_string(&id).unwrap(), text);
            assert_eq!(serde_json::from_str::<HolderId>(&text).unwrap(), id);
        }
        let e = serde_json::from_str::<HolderId>(
            "{\"kind\":\"oci\",\"domain\":\"c1\",\"uuid\":\"c2\"}",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("names its container 'c1' in `domain` but 'c2'"),
            "{e}"
        );
        assert!(serde_json::from_str::<HolderId>(
            "{\"kind\":\"pod\",\"domain\":\"a\",\"uuid\":\"a\"}"
        )
        .is_err());
    }

    /// A pod's allocation: keyed `pod:ID`, written with what is known of its pod; named by
    /// its pod and container once kubelet named them; no operator's name reaches it.
    #[test]
    fn a_pods_allocation_round_trips_and_is_named_by_its_pod() {
        const A: &str = "0123456789abcdef0123456789abcdef";
        let mut id = HolderId::Pod {
            alloc: A.into(),
            pod: Box::new(PodOf {
                resource: "gpuhook.io/gpu".into(),
                ..PodOf::default()
            }),
        };
        assert_eq!(id.key().as_str(), format!("pod:{A}"));
        // The ID is the key to the pod's units (`gpuhook.io/allocation`): messages, which
        // reach other tenants (a refused container's pod events, a refused VM's start), show
        // its first 8 characters only.
        assert_eq!(id.who(), "pod allocation '01234567…'");
        assert!(!id.who().contains(A));
        assert_eq!(id.shown_name(), "01234567…");
        assert_eq!(id.answers_to(A), None);
        let text = format!(
            "{{\"kind\":\"pod\",\"domain\":\"{A}\",\"uuid\":\"{A}\",\"pod\":{{\"resource\":\"gpuhook.io/gpu\"}}}}"
        );
        assert_eq!(serde_json::to_string(&id).unwrap(), text);
        assert_eq!(serde_json::from_str::<HolderId>(&text).unwrap(), id);
        if let HolderId::Pod { pod, .. } = &mut id {
            pod.namespace = Some("ml".into());
            pod.name = Some("trainer".into());
            pod.container_name = Some("main".into());
            pod.container = Some("c0ffee".into());
            pod.listed = true;
        }
        assert_eq!(id.who(), "pod 'ml/trainer' container 'main'");
        let back: HolderId = serde_json::from_str(&serde_json::to_string(&id).unwrap()).unwrap();
        assert_eq!(back, id);
        // Another kind never has a `pod`; a pod's key is its allocation's ID.
        let bad = r#"{"kind":"pod","domain":"x","uuid":"x","pod":{"resource":"r"}}"#;
        assert!(serde_json::from_str::<HolderId>(bad).is_err());
    }
}
