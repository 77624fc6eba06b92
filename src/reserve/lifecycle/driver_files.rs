//! What of the CDI driver files recorded for a container a `detach` takes back: the files the
//! units it keeps still need (by the CDI specs of those units, all of the host's driver while
//! an NVIDIA unit stays, an MPS daemon's directories while a slot of that daemon stays), and
//! the rest taken out of the record, to be taken out of its root after the lock.

use super::holder::Holder;
use super::plan::driver_plan;
use crate::enter::rootfs::Done;
use crate::host::inventory::Inventory;
use crate::ids::Unit;
use crate::log;
use crate::reserve::mps;
use crate::reserve::state::{Reservation, State};
use crate::reserve::world::World;
use std::collections::BTreeSet;

/// What of the CDI driver files recorded for `r` the units it keeps (all but `units`) need.
#[derive(Debug, Default)]
pub(super) struct Needed {
    /// Mount targets and link paths.
    paths: BTreeSet<String>,
    ld_folders: Vec<String>,
}

/// What the CDI specs give the units `r` keeps when `units` go: nothing once none stays (or
/// none was recorded); everything recorded when the specs cannot say it now (said in the
/// log: files of the driver stay rather than a GPU it keeps losing them).
pub(super) fn driver_needed(
    f: &World,
    h: &Holder,
    inv: &Inventory,
    st: &State,
    r: &Reservation,
    units: &[Unit],
) -> Needed {
    let stay: Vec<Unit> = r
        .gpus
        .iter()
        .filter(|u| !units.contains(u))
        .copied()
        .collect();
    if stay.is_empty() {
        return Needed::default();
    }
    let mut needed = Needed::default();
    // An MPS daemon's directories stay while the container keeps a slot of that daemon's GPU.
    if mps_kept(st, r, &stay) {
        needed
            .paths
            .extend([mps::CONTAINER_PIPE, mps::CONTAINER_SHM].map(String::from));
    }
    // CDI's files: its mounts, links, written files or linker cache (a directory made for a
    // mount alone is not one: the MPS mounts' parents may be).
    let cdi = r.mounts.iter().any(|m| !mps::is_target(&m.target))
        || !r.rootfs.links.is_empty()
        || !r.rootfs.written.is_empty()
        || !r.rootfs.ld_folders.is_empty();
    if !cdi {
        return needed;
    }
    // The host's driver files serve every NVIDIA GPU alike: all stay while one stays.
    if r.driver == Some(crate::request::Driver::Host) {
        let nvidia = stay.iter().any(|u| super::plan::is_nvidia(inv, u));
        return match nvidia {
            true => Needed {
                paths: recorded_paths(r).chain(needed.paths).collect(),
                ld_folders: r.rootfs.ld_folders.clone(),
            },
            false => needed,
        };
    }
    let granted = r.nodes.iter().map(|n| (n.major, n.minor)).collect();
    match driver_plan(f, inv, &stay, &[], granted) {
        Ok(p) => Needed {
            paths: p
                .mounts
                .iter()
                .map(|m| m.target.clone())
                .chain(p.links.iter().map(|l| l.link.clone()))
                .chain(needed.paths)
                .collect(),
            ld_folders: p.ld_folders,
        },
        Err(e) => {
            log::warn(&format!(
                "{}: cannot tell which CDI driver files the GPUs it keeps need ({e}): all stay",
                h.who()
            ));
            Needed {
                paths: recorded_paths(r).chain(needed.paths).collect(),
                ld_folders: r.rootfs.ld_folders.clone(),
            }
        }
    }
}

/// The driver files recorded for `r`: its mounts' targets (not an MPS daemon's) and links.
fn recorded_paths(r: &Reservation) -> impl Iterator<Item = String> + '_ {
    r.mounts
        .iter()
        .map(|m| m.target.clone())
        .filter(|t| !mps::is_target(t))
        .chain(r.rootfs.links.iter().cloned())
}

/// Whether the MPS pipe directory mounted in `r`'s container is the daemon's of a slot it
/// keeps (`stay`): the mount's source is that daemon's `pipe`, by identity.
fn mps_kept(st: &State, r: &Reservation, stay: &[Unit]) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(m) = r.mounts.iter().find(|m| m.target == mps::CONTAINER_PIPE) else {
        return false;
    };
    stay.iter()
        .filter(|u| u.is_slot())
        .filter_map(|u| st.mps.get(&u.pci()))
        .filter_map(|d| std::fs::metadata(d.pipe()).ok())
        .any(|md| (md.dev(), md.ino()) == (m.dev, m.ino))
}

/// Takes out of `r`'s record the driver files no kept unit needs, and returns them: mounts and
/// links not `needed`, the directories and mount-point files made for them (none a kept mount
/// or link is at or under), and gpuhook's linker-cache files once no folder is needed.
pub(super) fn take_files(r: &mut Reservation, needed: &Needed) -> Done {
    let mut out = Done::default();
    let (keep, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut r.mounts)
        .into_iter()
        .partition(|m| needed.paths.contains(&m.target));
    r.mounts = keep;
    out.mounted = gone;
    let (keep, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut r.rootfs.links)
        .into_iter()
        .partition(|l| needed.paths.contains(l));
    r.rootfs.links = keep;
    out.links = gone;
    let kept: Vec<&String> = r
        .mounts
        .iter()
        .map(|m| &m.target)
        .chain(&r.rootfs.links)
        .collect();
    let holds = |c: &String| {
        kept.iter().any(|k| {
            *k == c
                || k.strip_prefix(c.as_str())
                    .is_some_and(|t| t.starts_with('/'))
        })
    };
    let (keep, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut r.rootfs.created)
        .into_iter()
        .partition(holds);
    r.rootfs.created = keep;
    out.created = gone;
    r.rootfs
        .ld_folders
        .retain(|d| needed.ld_folders.contains(d));
    if r.rootfs.ld_folders.is_empty() {
        out.written = std::mem::take(&mut r.rootfs.written);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enter::rootfs::{Files, Mounted};
    use crate::host::procfs::ProcRef;

    fn mounted(t: &str) -> Mounted {
        Mounted {
            target: t.into(),
            dev: 1,
            ino: 2,
        }
    }

    /// What a kept unit needs stays recorded, with the directories and files it is at or
    /// under; the rest comes back to be taken out; the linker-cache files go with the last
    /// folder.
    #[test]
    fn only_what_no_kept_unit_needs_is_taken() {
        let idmap = crate::request::IdMap::default();
        let h = Holder::libvirt("web1", "11111111-1111-1111-1111-111111111111", &idmap);
        let req = crate::reserve::alloc::tests::req(1);
        let mut r = super::super::holder::new_reservation(&h, &req, &[], "now");
        r.mounts = vec![mounted("/usr/lib/a/libx.so.1"), mounted("/opt/y/bin/tool")];
        r.rootfs = Files {
            created: vec![
                "/usr/lib/a".into(),
                "/usr/lib/a/libx.so.1".into(),
                "/opt/y".into(),
                "/opt/y/bin".into(),
                "/opt/y/bin/tool".into(),
                "/opt/yy".into(),
            ],
            links: vec!["/usr/lib/a/libx.so".into(), "/opt/y/tool".into()],
            written: vec!["/etc/ld.so.conf.d/00-gpuhook-cdi.conf".into()],
            ld_folders: vec!["/usr/lib/a".into(), "/opt/y".into()],
        };
        let needed = Needed {
            paths: ["/usr/lib/a/libx.so.1", "/usr/lib/a/libx.so"]
                .map(String::from)
                .into(),
            ld_folders: vec!["/usr/lib/a".into()],
        };
        let gone = take_files(&mut r, &needed);
        assert_eq!(gone.mounted, [mounted("/opt/y/bin/tool")]);
        assert_eq!(gone.links, ["/opt/y/tool"]);
        assert_eq!(
            gone.created,
            ["/opt/y", "/opt/y/bin", "/opt/y/bin/tool", "/opt/yy"]
        );
        assert!(gone.written.is_empty());
        assert_eq!(r.rootfs.created, ["/usr/lib/a", "/usr/lib/a/libx.so.1"]);
        assert_eq!(r.rootfs.ld_folders, ["/usr/lib/a"]);
        // The last: everything, the linker cache's file too.
        let gone = take_files(&mut r, &Needed::default());
        assert_eq!(gone.mounted, [mounted("/usr/lib/a/libx.so.1")]);
        assert_eq!(gone.written, ["/etc/ld.so.conf.d/00-gpuhook-cdi.conf"]);
        assert!(r.mounts.is_empty() && r.rootfs.is_empty(), "{r:?}");
    }

    /// The MPS directories stay while a kept slot is of the daemon whose `pipe` is mounted
    /// (by identity), not for a slot of another daemon or a whole GPU.
    #[test]
    fn mps_directories_stay_with_a_slot_of_their_daemon() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let daemon = |name: &str| {
            let dir = t.path().join(name);
            std::fs::create_dir_all(dir.join("pipe")).unwrap();
            mps::Daemon {
                proc: ProcRef {
                    pid: 1,
                    start_time: 1,
                },
                uuid: name.into(),
                dir,
                starting: false,
                stopping: None,
            }
        };
        let (a, b): (crate::ids::Pci, crate::ids::Pci) = (
            "0000:04:00.0".parse().unwrap(),
            "0000:05:00.0".parse().unwrap(),
        );
        let mut st = State::default();
        st.mps.insert(a, daemon("GPU-A"));
        st.mps.insert(b, daemon("GPU-B"));
        let md = std::fs::metadata(st.mps[&a].pipe()).unwrap();
        let slot = |pci| Unit::Slot { pci, slot: 0 };
        let mut r = Reservation::for_test(
            crate::reserve::state::HolderKind::Libvirt,
            "web1",
            "id",
            &["0000:04:00.0/slot0", "0000:05:00.0/slot0", "0000:06:00.0"],
        );
        r.mounts = vec![Mounted {
            target: mps::CONTAINER_PIPE.into(),
            dev: md.dev(),
            ino: md.ino(),
        }];
        assert!(mps_kept(&st, &r, &[slot(a)]));
        assert!(!mps_kept(&st, &r, &[slot(b)]));
        let whole: Unit = "0000:06:00.0".parse().unwrap();
        assert!(!mps_kept(&st, &r, &[whole]));
        r.mounts.clear();
        assert!(!mps_kept(&st, &r, &[slot(a)]));
    }
}
