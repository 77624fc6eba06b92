//! One name, one holder: the holder an operator's command means by a name (`release`,
//! `attach`, `detach`), among those it answers to. An LXC domain, a VM and an OCI container
//! may share a name: such a name is refused, naming each, until `--domain`, `--vm` or
//! `--container` says which. Each door says where it looks for holders (`release`: the
//! state's reservations; `attach`/`detach`: the running containers and the VMs the state
//! holds), and what it says when no holder answers.

use crate::reserve::state::{By, HolderId, HolderKind};

/// Which kind of holder the operator said a name is (`--domain`, `--container`, `--vm`), or
/// any.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Pick {
    #[default]
    Any,
    Only(HolderKind),
}

impl Pick {
    /// From the command's options (clap lets at most one be given).
    pub fn of(domain: bool, container: bool, vm: bool) -> Pick {
        match (domain, container, vm) {
            (true, _, _) => Pick::Only(HolderKind::Libvirt),
            (_, true, _) => Pick::Only(HolderKind::Oci),
            (_, _, true) => Pick::Only(HolderKind::Vm),
            _ => Pick::Any,
        }
    }

    pub fn allows(self, k: HolderKind) -> bool {
        match self {
            Pick::Any => true,
            Pick::Only(only) => only == k,
        }
    }

    /// The kinds it allows, as a refusal names them: `domain, container or vm`, `domain`.
    pub fn words(self) -> String {
        let words: Vec<&str> = HolderKind::ALL
            .iter()
            .filter(|k| self.allows(**k))
            .map(|k| k.word())
            .collect();
        or_list(&words)
    }
}

/// A name that more than one holder answers to: the operator says which.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{name}' names {}: say which {}", both(holders), hint(holders))]
pub struct Ambiguous {
    pub name: String,
    /// Each holder it answers to, in the order of their kinds (domain, container, vm).
    pub holders: Vec<HolderId>,
}

/// The one holder of `found` that `name` answers to among the kinds `pick` allows (`None`:
/// none does). Within a kind, a holder whose UUID it is wins over one of that name (as
/// `virsh` looks domains up); holders of different kinds that it answers to are refused
/// together ([`Ambiguous`]).
pub fn resolve(
    name: &str,
    pick: Pick,
    found: impl IntoIterator<Item = HolderId>,
) -> Result<Option<HolderId>, Ambiguous> {
    let mut answers: Vec<(HolderKind, By, HolderId)> = Vec::new();
    for id in found {
        let Some(by) = id.answers_to(name).filter(|_| pick.allows(id.kind())) else {
            continue;
        };
        if !answers.iter().any(|(_, _, x)| *x == id) {
            answers.push((id.kind(), by, id));
        }
    }
    // A UUID first, within each kind: a domain named like another's UUID does not catch it.
    let firsts: Vec<(HolderKind, By)> = HolderKind::ALL
        .iter()
        .filter_map(|k| {
            let best = answers.iter().filter(|a| a.0 == *k).map(|a| a.1).min()?;
            Some((*k, best))
        })
        .collect();
    answers.retain(|(k, by, _)| firsts.contains(&(*k, *by)));
    answers.sort_by(|a, b| (a.0, &a.2).cmp(&(b.0, &b.2)));
    let mut holders: Vec<HolderId> = answers.into_iter().map(|(_, _, id)| id).collect();
    match holders.len() {
        0 => Ok(None),
        1 => Ok(holders.pop()),
        _ => Err(Ambiguous {
            name: name.to_string(),
            holders,
        }),
    }
}

/// `a`, `a or b`, `a, b or c`.
fn or_list(words: &[&str]) -> String {
    join(words, "or")
}

fn join(words: &[&str], last: &str) -> String {
    match words {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., end] => format!("{} {last} {end}", init.join(", ")),
    }
}

/// `both A and B`, `A, B and C`.
fn both(holders: &[HolderId]) -> String {
    let named: Vec<String> = holders.iter().map(HolderId::who_by_kind).collect();
    let named: Vec<&str> = named.iter().map(String::as_str).collect();
    match named.len() {
        2 => format!("both {}", join(&named, "and")),
        _ => join(&named, "and"),
    }
}

/// How the operator says which: the options of the kinds named, and a UUID where two of one
/// kind answer (by name both: a domain left in the state under an old UUID, say).
fn hint(holders: &[HolderId]) -> String {
    let kinds: Vec<HolderKind> = HolderKind::ALL
        .into_iter()
        .filter(|k| holders.iter().any(|h| h.kind() == *k))
        .collect();
    let flags: Vec<&str> = kinds.iter().map(|k| k.flag()).collect();
    let twice = kinds.len() < holders.len();
    match (kinds.len() > 1, twice) {
        (true, false) => format!("with {}", or_list(&flags)),
        (true, true) => format!("with {}, and by its UUID", or_list(&flags)),
        (false, _) => "by its UUID".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const U1: &str = "11111111-1111-1111-1111-111111111111";
    const U2: &str = "22222222-2222-2222-2222-222222222222";

    fn lxc(name: &str, uuid: &str) -> HolderId {
        HolderId::Libvirt {
            name: name.into(),
            uuid: uuid.into(),
        }
    }
    fn ctr(id: &str) -> HolderId {
        HolderId::Oci { id: id.into() }
    }
    fn vm(name: &str, uuid: &str) -> HolderId {
        HolderId::Vm {
            name: name.into(),
            uuid: uuid.into(),
        }
    }

    fn all() -> Vec<HolderId> {
        vec![
            ctr("cx"),
            vm("cx", U2),
            lxc("cx", U1),
            lxc("web1", U2),
            ctr("c2"),
        ]
    }

    #[test]
    fn one_holder_answers() {
        assert_eq!(resolve("web1", Pick::Any, all()), Ok(Some(lxc("web1", U2))));
        assert_eq!(resolve("c2", Pick::Any, all()), Ok(Some(ctr("c2"))));
        assert_eq!(resolve(U1, Pick::Any, all()), Ok(Some(lxc("cx", U1))));
        assert_eq!(
            resolve(&U1.to_uppercase(), Pick::Any, all()),
            Ok(Some(lxc("cx", U1)))
        );
    }

    #[test]
    fn nobody_answers() {
        assert_eq!(resolve("nosuch", Pick::Any, all()), Ok(None));
        assert_eq!(resolve("nosuch", Pick::Any, vec![]), Ok(None));
        // Said which, and there is none of that kind.
        assert_eq!(
            resolve("web1", Pick::Only(HolderKind::Oci), all()),
            Ok(None)
        );
        assert_eq!(resolve("c2", Pick::Only(HolderKind::Vm), all()), Ok(None));
        // A container's ID is matched exactly.
        assert_eq!(resolve("C2", Pick::Any, all()), Ok(None));
    }

    /// Every pair of kinds, and all three: refused, each named with its kind; the options
    /// say which.
    #[test]
    fn every_ambiguity_is_refused_naming_each() {
        let cases = [
            (
                vec![lxc("x", U1), ctr("x")],
                format!("'x' names both libvirt domain 'x' ({U1}) and OCI container 'x': say which with --domain or --container"),
            ),
            (
                vec![lxc("x", U1), vm("x", U2)],
                format!("'x' names both libvirt domain 'x' ({U1}) and vm 'x' ({U2}): say which with --domain or --vm"),
            ),
            (
                vec![vm("x", U2), ctr("x")],
                format!("'x' names both OCI container 'x' and vm 'x' ({U2}): say which with --container or --vm"),
            ),
            (
                vec![ctr("x"), vm("x", U2), lxc("x", U1)],
                format!("'x' names libvirt domain 'x' ({U1}), OCI container 'x' and vm 'x' ({U2}): say which with --domain, --container or --vm"),
            ),
        ];
        for (found, text) in cases {
            let e = resolve("x", Pick::Any, found.clone()).unwrap_err();
            assert_eq!(e.to_string(), text);
            assert_eq!(e.holders.len(), found.len());
            // Each option picks its own.
            for id in &found {
                assert_eq!(
                    resolve("x", Pick::Only(id.kind()), found.clone()),
                    Ok(Some(id.clone())),
                    "{id:?}"
                );
            }
        }
        // A VM and an LXC domain that share a UUID.
        let e = resolve(U1, Pick::Any, vec![lxc("a", U1), vm("b", U1)]).unwrap_err();
        assert!(e.to_string().contains("--domain or --vm"), "{e}");
    }

    #[test]
    fn a_uuid_wins_over_a_name_within_a_kind() {
        // A domain named like another's UUID: the UUID's domain is meant.
        let found = vec![lxc(U1, U2), lxc("web1", U1)];
        assert_eq!(resolve(U1, Pick::Any, found), Ok(Some(lxc("web1", U1))));
        // Across kinds it does not: a container with that ID is another holder.
        let found = vec![ctr(U1), lxc("web1", U1)];
        assert!(resolve(U1, Pick::Any, found).is_err());
        // Two of one kind by name (one left under an old UUID): only a UUID says which.
        let e = resolve("web1", Pick::Any, vec![lxc("web1", U1), lxc("web1", U2)]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("'web1' names both libvirt domain 'web1' ({U1}) and libvirt domain 'web1' ({U2}): say which by its UUID")
        );
        let e = resolve(
            "web1",
            Pick::Any,
            vec![lxc("web1", U1), lxc("web1", U2), ctr("web1")],
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .ends_with("say which with --domain or --container, and by its UUID"),
            "{e}"
        );
        // The same holder found twice (a running domain that also holds a reservation) is one.
        assert_eq!(
            resolve("web1", Pick::Any, vec![lxc("web1", U1), lxc("web1", U1)]),
            Ok(Some(lxc("web1", U1)))
        );
    }

    #[test]
    fn picks() {
        assert_eq!(Pick::of(false, false, false), Pick::Any);
        assert_eq!(
            Pick::of(true, false, false),
            Pick::Only(HolderKind::Libvirt)
        );
        assert_eq!(Pick::of(false, true, false), Pick::Only(HolderKind::Oci));
        assert_eq!(Pick::of(false, false, true), Pick::Only(HolderKind::Vm));
        assert_eq!(Pick::Any.words(), "domain, container or vm");
        assert_eq!(Pick::Only(HolderKind::Vm).words(), "vm");
    }
}
