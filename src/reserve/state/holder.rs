//! Who holds a reservation: each kind of holder with the identity of its own
//! ([`HolderId`]), the key the state files its reservation under ([`HolderKey`], never the
//! same for two kinds), and which holders a name answers to ([`By`]).
//!
//! In the state file a reservation still names its holder as it always did: `kind` (absent
//! for a libvirt LXC domain), `domain` and `uuid` (an OCI container's ID in both); a file
//! written before loads with the same meaning.

use crate::ids::normalize_uuid;
use serde::{Deserialize, Serialize};

/// Which kind of holder: a libvirt LXC domain, an OCI container, a libvirt QEMU domain (a
/// virtual machine). State files written before OCI support have no `kind`: their
/// reservations are libvirt's, and libvirt's are still written without it.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum HolderKind {
    #[default]
    Libvirt,
    Oci,
    Vm,
}

impl HolderKind {
    /// Every kind, in the order metrics and refusals name them.
    pub const ALL: [HolderKind; 3] = [HolderKind::Libvirt, HolderKind::Oci, HolderKind::Vm];

    /// As `list --json` and the metrics name it: `libvirt`, `oci`, `vm`.
    pub fn as_str(self) -> &'static str {
        match self {
            HolderKind::Libvirt => "libvirt",
            HolderKind::Oci => "oci",
            HolderKind::Vm => "vm",
        }
    }

    pub(super) fn is_libvirt(&self) -> bool {
        *self == HolderKind::Libvirt
    }

    /// How messages name a holder of this kind: `domain 'web1'`, `container 'ID'`, `vm 'vm1'`.
    pub fn who(self, name: &str) -> String {
        format!("{} '{name}'", self.word())
    }

    /// The word messages name this kind by: `domain`, `container`, `vm`.
    pub fn word(self) -> &'static str {
        match self {
            HolderKind::Libvirt => "domain",
            HolderKind::Oci => "container",
            HolderKind::Vm => "vm",
        }
    }

    /// The front door through which a holder of this kind reserves (`gpuhook show`): its
    /// word in JSON, and how the text says it.
    pub fn door(self) -> (&'static str, &'static str) {
        match self {
            HolderKind::Libvirt => ("lxc-hook", "the libvirt LXC hook (prepare)"),
            HolderKind::Oci => ("oci-runtime", "gpuhook-runtime (the OCI runtime's create)"),
            HolderKind::Vm => ("qemu-hook", "the libvirt QEMU hook (prepare)"),
        }
    }

    /// The option of the operator's commands that says a name is of this kind: `--domain`,
    /// `--container`, `--vm`.
    pub fn flag(self) -> &'static str {
        match self {
            HolderKind::Libvirt => "--domain",
            HolderKind::Oci => "--container",
            HolderKind::Vm => "--vm",
        }
    }
}

/// Who holds a reservation, each kind with the fields of its own.
///
/// A new kind (a Kubernetes pod's pending allocation: its namespace, name and UID, and the
/// container once one is created) is a variant here, its key a prefix of its own
/// ([`HolderId::key`]), its JSON `kind` a variant of [`HolderKind`], and a constructor of
/// `reserve/lifecycle/holder.rs`'s `Holder`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(try_from = "Named")]
pub enum HolderId {
    /// A libvirt LXC domain: its name, and its UUID (lowercase) that the state keys it by.
    Libvirt { name: String, uuid: String },
    /// An OCI container: its ID, its name and its key.
    Oci { id: String },
    /// A libvirt QEMU domain (a virtual machine): its name and its UUID.
    Vm { name: String, uuid: String },
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
        }
    }

    /// The name operators know it by: the domain's or VM's name, the container's ID.
    pub fn name(&self) -> &str {
        match self {
            HolderId::Libvirt { name, .. } | HolderId::Vm { name, .. } => name,
            HolderId::Oci { id } => id,
        }
    }

    /// Its UUID, for the kinds that have one (libvirt's domains).
    pub fn uuid(&self) -> Option<&str> {
        match self {
            HolderId::Libvirt { uuid, .. } | HolderId::Vm { uuid, .. } => Some(uuid),
            HolderId::Oci { .. } => None,
        }
    }

    /// `domain` and `uuid` as the state file and `list --json` write them: an OCI
    /// container's ID in both.
    pub fn domain_and_uuid(&self) -> (&str, &str) {
        match self {
            HolderId::Libvirt { name, uuid } | HolderId::Vm { name, uuid } => (name, uuid),
            HolderId::Oci { id } => (id, id),
        }
    }

    /// How messages name it: `domain 'web1'`, `container 'ID'`, `vm 'vm1'`.
    pub fn who(&self) -> String {
        self.kind().who(self.name())
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
            HolderId::Vm { .. } => self.who_exactly(),
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
            HolderId::Vm { .. } => Vec::new(),
        }
    }

    /// The key a file written before holders had keys of their own filed a holder of the
    /// kinds there were then under: its `uuid` field (a domain's UUID, a container's ID).
    pub(super) fn legacy_key(&self) -> Option<&str> {
        match self {
            HolderId::Libvirt { uuid, .. } => Some(uuid),
            HolderId::Oci { id } => Some(id),
            HolderId::Vm { .. } => None,
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

/// A holder as the state file names it (`kind`, `domain`, `uuid`).
#[derive(Deserialize)]
struct Named {
    #[serde(default)]
    kind: HolderKind,
    domain: String,
    uuid: String,
}

/// What a reservation's `kind`, `domain` and `uuid` cannot be.
#[derive(Debug, thiserror::Error)]
#[error("an OCI reservation names its container '{domain}' in `domain` but '{uuid}' in `uuid`")]
pub struct NamedTwice {
    domain: String,
    uuid: String,
}

impl TryFrom<Named> for HolderId {
    type Error = NamedTwice;
    fn try_from(n: Named) -> Result<HolderId, NamedTwice> {
        Ok(match n.kind {
            HolderKind::Libvirt => HolderId::Libvirt {
                name: n.domain,
                uuid: n.uuid,
            },
            HolderKind::Oci if n.domain == n.uuid => HolderId::Oci { id: n.uuid },
            HolderKind::Oci => {
                return Err(NamedTwice {
                    domain: n.domain,
                    uuid: n.uuid,
                })
            }
            HolderKind::Vm => HolderId::Vm {
                name: n.domain,
                uuid: n.uuid,
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
}

impl Serialize for HolderId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (domain, uuid) = self.domain_and_uuid();
        NamedRef {
            kind: self.kind(),
            domain,
            uuid,
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
}
