//! cgroup v2: on a cgroup of the unified hierarchy, libvirt's own device program and map
//! (loaded here exactly as libvirt builds them) rule device access; gpuhook's v2 backend
//! widens it by updating that map, never by attaching a second program.

mod common;
use gpuhook::cgroup::bpf;
use gpuhook::cgroup::{grant_all, revoke_all, DeviceCgroup, LibvirtMap};
use gpuhook::reserve::state::Node;
use nix::errno::Errno;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use testbed::{bpfprog, probe};

const UNIFIED: &str = "/sys/fs/cgroup/unified";

/// The unified hierarchy: `/sys/fs/cgroup/unified` on a hybrid host, `/sys/fs/cgroup` on a
/// pure v2 one.
fn unified_root() -> PathBuf {
    for p in [UNIFIED, "/sys/fs/cgroup"] {
        if let Ok(st) = nix::sys::statfs::statfs(p) {
            if st.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC {
                return p.into();
            }
        }
    }
    panic!("no cgroup2 hierarchy mounted: mount -t cgroup2 none {UNIFIED}");
}

/// A state directory of the test's own (root's, 0700): gpuhook's cgroup locks go there
/// (`cgroup-locks`), beside the state as for any pool, never in the host's `/run/gpuhook`.
fn state_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("gpuhook-cgv2-state-")
        .tempdir()
        .unwrap()
}

struct Cg(PathBuf);
impl Drop for Cg {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn node(path: &str, major: u32, minor: u32) -> Node {
    Node {
        path: path.into(),
        major,
        minor,
    }
}

/// A descriptor of the cgroup directory (device programs attach to it).
fn dir_fd(p: &Path) -> std::os::fd::OwnedFd {
    nix::fcntl::open(
        p,
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap()
}

fn opens(cg: &Path, paths: &[&Path]) -> Vec<Result<(), Errno>> {
    probe::open_in_cgroup(&cg.join("cgroup.procs"), None, paths).expect("probe")
}

/// A temp directory with the fake nodes of two GPUs and the control node (195:0, 195:1,
/// 195:255: ENXIO when a cgroup lets an open through, no driver behind them).
fn fake_nodes() -> (tempfile::TempDir, [PathBuf; 3]) {
    let dir = tempfile::tempdir().unwrap();
    let nodes = [("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)].map(|(n, mi)| {
        let p = dir.path().join(n);
        testbed::fakehost::node(&p, 195, mi, 0o666, 0).unwrap();
        p
    });
    (dir, nodes)
}

#[test]
fn grant_through_libvirts_map() {
    common::require_root();
    let cg = Cg(unified_root().join(format!("gpuhook-test-v2-{}", std::process::id())));
    std::fs::create_dir(&cg.0).unwrap();
    let (_dir, [nv0, nv1, ctl]) = fake_nodes();
    let null = Path::new("/dev/null");

    // Before libvirt's program: v2 imposes nothing, and gpuhook sees nothing to do.
    let free = LibvirtMap::open(&cg.0).unwrap();
    assert!(free.is_allowed(&node("/dev/nvidia0", 195, 0)).unwrap());

    let cgfd = dir_fd(&cg.0);
    let (_prog, map) = bpfprog::attach_libvirt_program(cgfd.as_fd()).unwrap();
    assert_eq!(
        bpf::prog_query(cgfd.as_fd(), bpf::BPF_CGROUP_DEVICE, 0)
            .unwrap()
            .len(),
        1
    );

    // Refused before: EPERM from the device program; /dev/null (default list) opens.
    assert_eq!(
        opens(&cg.0, &[&nv0, &nv1, &ctl, null]),
        vec![
            Err(Errno::EPERM),
            Err(Errno::EPERM),
            Err(Errno::EPERM),
            Ok(())
        ]
    );

    let mut v2 = LibvirtMap::open(&cg.0).unwrap();
    let want = vec![
        node("/dev/nvidia0", 195, 0),
        node("/dev/nvidiactl", 195, 255),
    ];
    let added = grant_all(&mut v2, &want).unwrap();
    assert_eq!(added, want);
    // Allowed after: ENXIO (no driver behind 195:*), not EPERM. nvidia1 stays refused.
    assert_eq!(
        opens(&cg.0, &[&nv0, &nv1, &ctl]),
        vec![Err(Errno::ENXIO), Err(Errno::EPERM), Err(Errno::ENXIO)]
    );
    // Exact entries with rw (no mknod), no second program.
    let v = bpf::map_lookup_u32(map.as_fd(), 195u64 << 32).unwrap();
    assert_eq!(v, Some(((2 | 4) << 16) | 2));
    assert_eq!(
        bpf::map_lookup_u32(map.as_fd(), (195u64 << 32) | 0xffff_ffff).unwrap(),
        None
    );
    assert_eq!(
        bpf::prog_query(cgfd.as_fd(), bpf::BPF_CGROUP_DEVICE, 0)
            .unwrap()
            .len(),
        1
    );
    // Granting again adds nothing.
    let mut again = LibvirtMap::open(&cg.0).unwrap();
    assert!(grant_all(&mut again, &want).unwrap().is_empty());

    // Rollback takes back exactly what this run added.
    revoke_all(&mut v2, &added);
    assert_eq!(
        opens(&cg.0, &[&nv0, &ctl, null]),
        vec![Err(Errno::EPERM), Err(Errno::EPERM), Ok(())]
    );
    assert_eq!(
        bpf::map_keys(map.as_fd()).unwrap().len(),
        bpfprog::DEFAULT_ALLOW.len()
    );

    // A full map is a clear error, and a partial grant is undone.
    let mut k = 0u32;
    while bpf::map_keys(map.as_fd()).unwrap().len() < 63 {
        bpf::map_update_u32(map.as_fd(), (7u64 << 32) | u64::from(k), (7 << 16) | 2).unwrap();
        k += 1;
    }
    let mut full = LibvirtMap::open(&cg.0).unwrap();
    let e = grant_all(
        &mut full,
        &[node("/dev/nvidia0", 195, 0), node("/dev/nvidia1", 195, 1)],
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("libvirt's device map is full (64 of 64 entries)"),
        "{e}"
    );
    assert!(
        e.to_string().contains("granting /dev/nvidia1 (195:1)"),
        "{e}"
    );
    assert_eq!(
        bpf::map_lookup_u32(map.as_fd(), 195u64 << 32).unwrap(),
        None,
        "partial grant undone"
    );
    let _ = map.as_raw_fd();
}

#[test]
fn foreign_program_is_refused() {
    common::require_root();
    let cg = Cg(unified_root().join(format!("gpuhook-test-v2f-{}", std::process::id())));
    std::fs::create_dir(&cg.0).unwrap();
    let cgfd = dir_fd(&cg.0);
    // A deny-all program with no map: gpuhook cannot widen it and says so.
    let insns = [
        bpf::Insn {
            code: 0xb7,
            regs: 0,
            off: 0,
            imm: 0,
        },
        bpf::Insn {
            code: 0x95,
            regs: 0,
            off: 0,
            imm: 0,
        },
    ];
    let prog = bpf::prog_load(bpf::BPF_PROG_TYPE_CGROUP_DEVICE, &insns, "GPL").unwrap();
    bpf::prog_attach(cgfd.as_fd(), prog.as_fd(), bpf::BPF_CGROUP_DEVICE, 0).unwrap();
    let e = LibvirtMap::open(&cg.0).err().expect("must refuse");
    assert!(
        e.to_string().contains("none with libvirt's map layout"),
        "{e}"
    );
    // A child cgroup restricted only by the parent's program: also refused.
    let child = Cg(cg.0.join("child"));
    std::fs::create_dir(&child.0).unwrap();
    let e = LibvirtMap::open(&child.0).err().expect("must refuse");
    assert!(
        e.to_string()
            .contains("restricted by 1 program(s) of a parent cgroup"),
        "{e}"
    );
    drop(child);
}

/// Hotplug on cgroup v2 (libvirt's map): `gpuhook attach` grants in one process and
/// `gpuhook detach` takes a node back in another, by deleting its entry: the grants the
/// container keeps (another GPU's, the shared control node, libvirt's own defaults) stay.
#[test]
fn detach_denies_in_libvirts_map() {
    common::require_root();
    let cg = Cg(unified_root().join(format!("gpuhook-test-v2-hp-{}", std::process::id())));
    std::fs::create_dir(&cg.0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<PathBuf> = ["nvidia0", "nvidia1", "nvidiactl"]
        .iter()
        .map(|n| dir.path().join(n))
        .collect();
    for (p, minor) in paths.iter().zip([0, 1, 255]) {
        testbed::fakehost::node(p, 195, minor, 0o666, 0).unwrap();
    }
    let cgfd = dir_fd(&cg.0);
    let (_prog, map) = bpfprog::attach_libvirt_program(cgfd.as_fd()).unwrap();
    let nodes = [
        node("/dev/nvidia0", 195, 0),
        node("/dev/nvidia1", 195, 1),
        node("/dev/nvidiactl", 195, 255),
    ];
    // The attach (its own process, its own LibvirtMap).
    grant_all(&mut LibvirtMap::open(&cg.0).unwrap(), &nodes).unwrap();
    let all: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    let mut with_null = all.clone();
    with_null.push(Path::new("/dev/null"));
    assert_eq!(
        opens(&cg.0, &with_null),
        vec![
            Err(Errno::ENXIO),
            Err(Errno::ENXIO),
            Err(Errno::ENXIO),
            Ok(())
        ]
    );
    // The detach of GPU 1 (another process): only its entry goes.
    LibvirtMap::open(&cg.0).unwrap().deny(&nodes[1]).unwrap();
    assert_eq!(
        opens(&cg.0, &with_null),
        vec![
            Err(Errno::ENXIO),
            Err(Errno::EPERM),
            Err(Errno::ENXIO),
            Ok(())
        ]
    );
    assert_eq!(
        bpf::map_keys(map.as_fd()).unwrap().len(),
        bpfprog::DEFAULT_ALLOW.len() + 2
    );
    // Denying what is not there is no error (a detach after a killed one).
    LibvirtMap::open(&cg.0).unwrap().deny(&nodes[1]).unwrap();
}

/// An OCI runtime's device program (runc's shape, no map) replaced by gpuhook's: attached
/// with `BPF_F_ALLOW_MULTI` as runc and crun attach (new before old), and without flags
/// (replaced in one step); the kernel's verdicts are what the rules plus gpuhook's entries
/// say, exactly one program is attached after each change, the replacement reads back, a
/// revoke takes back only this run's grant, and a program gpuhook cannot read is refused.
#[test]
fn runtime_program_replaced_with_multi_and_without() {
    use gpuhook::cgroup::interp::{runc_like, DeviceRule as Rule};
    use gpuhook::cgroup::runtime_program::RuntimeProgram as Replace;
    common::require_root();
    let st = state_dir();
    let (_dir, [nv0, nv1, ctl]) = fake_nodes();
    let null = Path::new("/dev/null");
    let rule = |allow, kind, major, minor, access| Rule {
        allow,
        kind,
        major,
        minor,
        access,
    };
    // podman's rules for runc, with nvidia0 given at create.
    let rules = [
        rule(false, b'a', None, None, 7),
        rule(true, b'c', Some(1), Some(3), 7),
        rule(true, b'c', Some(195), Some(0), 6),
    ];
    {
        let flags = bpf::BPF_F_ALLOW_MULTI;
        let cg = Cg(unified_root().join(format!("gpuhook-test-v2r-{}", std::process::id())));
        std::fs::create_dir(&cg.0).unwrap();
        let cgfd = dir_fd(&cg.0);
        let prog =
            bpf::prog_load(bpf::BPF_PROG_TYPE_CGROUP_DEVICE, &runc_like(&rules), "GPL").unwrap();
        bpf::prog_attach(cgfd.as_fd(), prog.as_fd(), bpf::BPF_CGROUP_DEVICE, flags).unwrap();
        drop(prog);
        let progs = || bpf::prog_query(cgfd.as_fd(), bpf::BPF_CGROUP_DEVICE, 0).unwrap();
        let first = progs();
        assert_eq!(
            opens(&cg.0, &[&nv0, &nv1, &ctl, null]),
            vec![
                Err(Errno::ENXIO),
                Err(Errno::EPERM),
                Err(Errno::EPERM),
                Ok(())
            ]
        );

        let mut r = Replace::open(&cg.0, st.path()).unwrap();
        // Its lock is a file in the state directory's `cgroup-locks`: the pool's own.
        let locks = std::fs::read_dir(st.path().join("cgroup-locks")).unwrap();
        assert_eq!(locks.count(), 1);
        let n1 = node("/dev/nvidia1", 195, 1);
        let nctl = node("/dev/nvidiactl", 195, 255);
        assert!(!r.is_allowed(&n1).unwrap());
        assert!(r.is_allowed(&node("/dev/nvidia0", 195, 0)).unwrap());
        let added = grant_all(&mut r, &[n1.clone(), nctl.clone()]).unwrap();
        assert_eq!(added.len(), 2);
        assert_eq!(
            opens(&cg.0, &[&nv0, &nv1, &ctl, null]),
            vec![
                Err(Errno::ENXIO),
                Err(Errno::ENXIO),
                Err(Errno::ENXIO),
                Ok(())
            ],
            "flags {flags}"
        );
        let second = progs();
        assert_eq!(second.len(), 1, "flags {flags}: {second:?}");
        assert_ne!(second, first);
        drop(r);

        // Read back from the kernel: gpuhook's entries are known, a revoke of another run's
        // grant takes nothing, a deny of the runtime's own GPU takes it.
        let mut r = Replace::open(&cg.0, st.path()).unwrap();
        assert!(r.grants_exactly(&n1).unwrap());
        assert!(!r.grants_exactly(&node("/dev/nvidia0", 195, 0)).unwrap());
        revoke_all(&mut r, std::slice::from_ref(&n1));
        assert_eq!(opens(&cg.0, &[&nv1]), vec![Err(Errno::ENXIO)]);
        r.deny(&node("/dev/nvidia0", 195, 0)).unwrap();
        r.deny(&n1).unwrap();
        assert_eq!(
            opens(&cg.0, &[&nv0, &nv1, &ctl, null]),
            vec![
                Err(Errno::EPERM),
                Err(Errno::EPERM),
                Err(Errno::ENXIO),
                Ok(())
            ]
        );
        assert_eq!(progs().len(), 1);
        drop(r);
        // Taken back by this run: only what it added.
        let mut r = Replace::open(&cg.0, st.path()).unwrap();
        let again = grant_all(&mut r, &[n1.clone(), nctl.clone()]).unwrap();
        assert_eq!(
            again,
            std::slice::from_ref(&n1),
            "nvidiactl was allowed already"
        );
        revoke_all(&mut r, &again);
        assert_eq!(
            opens(&cg.0, &[&nv1, &ctl]),
            vec![Err(Errno::EPERM), Err(Errno::ENXIO)]
        );
        // The runtime's own GPU, denied by a detach, attached again and rolled back: denied
        // again (the deny is put back, not only the allow taken out).
        let n0 = node("/dev/nvidia0", 195, 0);
        assert!(!r.is_allowed(&n0).unwrap());
        let n0s = std::slice::from_ref(&n0);
        assert_eq!(grant_all(&mut r, n0s).unwrap(), n0s);
        assert_eq!(opens(&cg.0, &[&nv0]), vec![Err(Errno::ENXIO)]);
        assert!(revoke_all(&mut r, std::slice::from_ref(&n0)).is_empty());
        assert_eq!(opens(&cg.0, &[&nv0]), vec![Err(Errno::EPERM)]);
        assert!(!r.is_allowed(&n0).unwrap());
        drop(r);
        // A lock on the cgroup directory, which anyone who can open it may take (the
        // container too, through its cgroup namespace), holds nothing up.
        let held = nix::fcntl::Flock::lock(
            std::fs::File::open(&cg.0).unwrap(),
            nix::fcntl::FlockArg::LockExclusive,
        )
        .unwrap();
        let t = std::time::Instant::now();
        let mut r = Replace::open(&cg.0, st.path()).unwrap();
        r.allow(&n1).unwrap();
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
        drop(held);
    }

    // A program attached without BPF_F_ALLOW_MULTI (an attach would replace whatever is
    // there then, a third party's too): refused, nothing changed.
    let cg = Cg(unified_root().join(format!("gpuhook-test-v2r0-{}", std::process::id())));
    std::fs::create_dir(&cg.0).unwrap();
    let cgfd = dir_fd(&cg.0);
    let prog = bpf::prog_load(bpf::BPF_PROG_TYPE_CGROUP_DEVICE, &runc_like(&rules), "GPL").unwrap();
    bpf::prog_attach(cgfd.as_fd(), prog.as_fd(), bpf::BPF_CGROUP_DEVICE, 0).unwrap();
    let e = Replace::open(&cg.0, st.path())
        .err()
        .expect("flags 0 are refused");
    assert!(e.to_string().contains("not BPF_F_ALLOW_MULTI"), "{e}");
    assert_eq!(opens(&cg.0, &[&nv1]), vec![Err(Errno::EPERM)]);

    // A gpuhook killed between attaching its replacement and detaching the old program left
    // both: the kernel asks both, and so does the next gpuhook, which then leaves one.
    use gpuhook::cgroup::runtime_program::Prologue;
    let cg = Cg(unified_root().join(format!("gpuhook-test-v2rk-{}", std::process::id())));
    std::fs::create_dir(&cg.0).unwrap();
    let cgfd = dir_fd(&cg.0);
    let runtime = runc_like(&rules);
    let mut old = Prologue::default();
    old.allow.insert((195, 255));
    let mut new = old.clone();
    new.allow.insert((195, 1));
    new.deny.insert((195, 0));
    for p in [&old, &new] {
        let prog = bpf::prog_load(
            bpf::BPF_PROG_TYPE_CGROUP_DEVICE,
            &p.compile(&runtime),
            "GPL",
        )
        .unwrap();
        bpf::prog_attach(
            cgfd.as_fd(),
            prog.as_fd(),
            bpf::BPF_CGROUP_DEVICE,
            bpf::BPF_F_ALLOW_MULTI,
        )
        .unwrap();
    }
    let both = vec![
        Err(Errno::EPERM),
        Err(Errno::EPERM),
        Err(Errno::ENXIO),
        Ok(()),
    ];
    assert_eq!(opens(&cg.0, &[&nv0, &nv1, &ctl, null]), both);
    let mut r = Replace::open(&cg.0, st.path()).unwrap();
    assert!(!r.is_allowed(&node("/dev/nvidia0", 195, 0)).unwrap());
    assert!(!r.is_allowed(&node("/dev/nvidia1", 195, 1)).unwrap());
    assert!(r.is_allowed(&node("/dev/nvidiactl", 195, 255)).unwrap());
    r.deny(&node("/dev/nvidia1", 195, 1)).unwrap();
    assert_eq!(
        bpf::prog_query(cgfd.as_fd(), bpf::BPF_CGROUP_DEVICE, 0)
            .unwrap()
            .len(),
        1
    );
    assert_eq!(opens(&cg.0, &[&nv0, &nv1, &ctl, null]), both);

    // Two programs attached, or one with a map (libvirt's), or one gpuhook cannot run: refused.
    let cg = Cg(unified_root().join(format!("gpuhook-test-v2rx-{}", std::process::id())));
    std::fs::create_dir(&cg.0).unwrap();
    let cgfd = dir_fd(&cg.0);
    let (_p, _m) = bpfprog::attach_libvirt_program(cgfd.as_fd()).unwrap();
    // libvirt's (flags 0, a map)
    let e = Replace::open(&cg.0, st.path())
        .err()
        .expect("libvirt's program is refused");
    assert!(e.to_string().contains("not BPF_F_ALLOW_MULTI"), "{e}");
    // one with a map, attached as the runtimes attach
    let cg = Cg(unified_root().join(format!("gpuhook-test-v2rm-{}", std::process::id())));
    std::fs::create_dir(&cg.0).unwrap();
    let cgfd = dir_fd(&cg.0);
    let map = bpf::map_create(bpf::BPF_MAP_TYPE_HASH, 8, 4, 64).unwrap();
    let mprog = bpf::prog_load(
        bpf::BPF_PROG_TYPE_CGROUP_DEVICE,
        &bpfprog::libvirt_device_program(map.as_raw_fd()),
        "GPL",
    )
    .unwrap();
    bpf::prog_attach(
        cgfd.as_fd(),
        mprog.as_fd(),
        bpf::BPF_CGROUP_DEVICE,
        bpf::BPF_F_ALLOW_MULTI,
    )
    .unwrap();
    let e = Replace::open(&cg.0, st.path())
        .err()
        .expect("a map program is refused");
    assert!(
        e.to_string()
            .contains("is not plain code gpuhook can read (1 map(s)"),
        "{e}"
    );
    let cg = Cg(unified_root().join(format!("gpuhook-test-v2ry-{}", std::process::id())));
    std::fs::create_dir(&cg.0).unwrap();
    let cgfd = dir_fd(&cg.0);
    for _ in 0..2 {
        let p =
            bpf::prog_load(bpf::BPF_PROG_TYPE_CGROUP_DEVICE, &runc_like(&rules), "GPL").unwrap();
        bpf::prog_attach(
            cgfd.as_fd(),
            p.as_fd(),
            bpf::BPF_CGROUP_DEVICE,
            bpf::BPF_F_ALLOW_MULTI,
        )
        .unwrap();
    }
    let e = Replace::open(&cg.0, st.path())
        .err()
        .expect("two programs are refused");
    assert!(
        e.to_string().contains("2 device programs attached here"),
        "{e}"
    );
}

/// A device program as systemd names its own (`sd_devices`): runc-like rules, for the tests.
fn systemd_like(
    cgfd: std::os::fd::BorrowedFd,
    rules: &[gpuhook::cgroup::interp::DeviceRule],
) -> u32 {
    use gpuhook::cgroup::interp::runc_like;
    use gpuhook::cgroup::runtime_program::SYSTEMD_PROGRAM;
    let p = bpf::prog_load_named(
        bpf::BPF_PROG_TYPE_CGROUP_DEVICE,
        &runc_like(rules),
        "GPL",
        SYSTEMD_PROGRAM,
    )
    .unwrap();
    let before = bpf::prog_query(cgfd, bpf::BPF_CGROUP_DEVICE, 0).unwrap();
    bpf::prog_attach(
        cgfd,
        p.as_fd(),
        bpf::BPF_CGROUP_DEVICE,
        bpf::BPF_F_ALLOW_MULTI,
    )
    .unwrap();
    let ids = bpf::prog_query(cgfd, bpf::BPF_CGROUP_DEVICE, 0).unwrap();
    let id = *ids.iter().find(|id| !before.contains(id)).unwrap();
    let fd = bpf::prog_get_fd_by_id(id).unwrap();
    assert_eq!(bpf::prog_name(fd.as_fd()).unwrap(), SYSTEMD_PROGRAM);
    id
}

/// Under systemd's cgroup manager: systemd's own program (`sd_devices`, for the scope's
/// `DeviceAllow=`) beside the runtime's, as after `systemctl daemon-reload`, is left in place
/// (never replaced, never counted as a second runtime program), and rules: a grant in the
/// runtime's program alone is not in force until systemd's lets the node through too; a
/// program of a cgroup above rules as well. A cgroup with no program at all (crun's for a
/// user-namespaced container) lets everything through until a detach denies a node.
#[test]
fn systemds_program_and_those_above_rule_too() {
    use gpuhook::cgroup::interp::{runc_like, DeviceRule as Rule};
    use gpuhook::cgroup::runtime_program::RuntimeProgram as Replace;
    common::require_root();
    let st = state_dir();
    let (_dir, [nv0, nv1, ctl]) = fake_nodes();
    let null = Path::new("/dev/null");
    let rule = |allow, kind, major, minor, access| Rule {
        allow,
        kind,
        major,
        minor,
        access,
    };
    let runtime = [
        rule(false, b'a', None, None, 7),
        rule(true, b'c', Some(1), Some(3), 7),
        rule(true, b'c', Some(195), Some(0), 6),
    ];
    let cg = Cg(unified_root().join(format!("gpuhook-test-v2sd-{}", std::process::id())));
    std::fs::create_dir(&cg.0).unwrap();
    let cgfd = dir_fd(&cg.0);
    let prog = bpf::prog_load(
        bpf::BPF_PROG_TYPE_CGROUP_DEVICE,
        &runc_like(&runtime),
        "GPL",
    )
    .unwrap();
    bpf::prog_attach(
        cgfd.as_fd(),
        prog.as_fd(),
        bpf::BPF_CGROUP_DEVICE,
        bpf::BPF_F_ALLOW_MULTI,
    )
    .unwrap();
    drop(prog);
    // systemd's: what the scope's DeviceAllow= lists (the GPU given at create, /dev/null).
    let sd = systemd_like(cgfd.as_fd(), &runtime);
    let n0 = node("/dev/nvidia0", 195, 0);
    let n1 = node("/dev/nvidia1", 195, 1);
    let mut r =
        Replace::open(&cg.0, st.path()).expect("systemd's program is not a second runtime program");
    assert!(r.confines());
    let n1s = std::slice::from_ref(&n1);
    assert_eq!(grant_all(&mut r, n1s).unwrap(), n1s);
    assert!(r.is_allowed(&n1).unwrap());
    assert!(!r.effective(&n1).unwrap(), "systemd's program refuses it");
    assert!(r.effective(&n0).unwrap());
    assert_eq!(
        opens(&cg.0, &[&nv0, &nv1, null]),
        vec![Err(Errno::ENXIO), Err(Errno::EPERM), Ok(())]
    );
    let ids = bpf::prog_query(cgfd.as_fd(), bpf::BPF_CGROUP_DEVICE, 0).unwrap();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids.contains(&sd), "systemd's program stays: {ids:?}");
    drop(r);
    // systemd lists the GPU too (a new program of its own, its old one detached).
    let mut listed = runtime.to_vec();
    listed.push(rule(true, b'c', Some(195), Some(1), 6));
    let sd2 = systemd_like(cgfd.as_fd(), &listed);
    let old = bpf::prog_get_fd_by_id(sd).unwrap();
    bpf::prog_detach(cgfd.as_fd(), old.as_fd(), bpf::BPF_CGROUP_DEVICE).unwrap();
    let mut r = Replace::open(&cg.0, st.path()).unwrap();
    assert!(r.effective(&n1).unwrap());
    assert_eq!(opens(&cg.0, &[&nv1]), vec![Err(Errno::ENXIO)]);
    // A detach then denies it in the runtime's program; systemd's stays as it is.
    r.deny(&n1).unwrap();
    assert!(!r.effective(&n1).unwrap());
    assert_eq!(opens(&cg.0, &[&nv1]), vec![Err(Errno::EPERM)]);
    let ids = bpf::prog_query(cgfd.as_fd(), bpf::BPF_CGROUP_DEVICE, 0).unwrap();
    assert!(ids.contains(&sd2) && ids.len() == 2, "{ids:?}");
    drop(r);

    // A program of the cgroup above rules its children: a child's grant is not in force.
    let child = Cg(cg.0.join("container"));
    std::fs::create_dir(&child.0).unwrap();
    let chfd = dir_fd(&child.0);
    let prog = bpf::prog_load(
        bpf::BPF_PROG_TYPE_CGROUP_DEVICE,
        &runc_like(&runtime),
        "GPL",
    )
    .unwrap();
    bpf::prog_attach(
        chfd.as_fd(),
        prog.as_fd(),
        bpf::BPF_CGROUP_DEVICE,
        bpf::BPF_F_ALLOW_MULTI,
    )
    .unwrap();
    let mut r = Replace::open(&child.0, st.path()).unwrap();
    let nctl = node("/dev/nvidiactl", 195, 255);
    grant_all(&mut r, std::slice::from_ref(&nctl)).unwrap();
    assert!(r.is_allowed(&nctl).unwrap());
    assert!(!r.effective(&nctl).unwrap(), "refused above");
    assert_eq!(opens(&child.0, &[&ctl]), vec![Err(Errno::EPERM)]);
    drop(r);
    drop(child);

    // No program: everything passes, nothing is the container's own; a deny attaches one.
    let bare = Cg(unified_root().join(format!("gpuhook-test-v2none-{}", std::process::id())));
    std::fs::create_dir(&bare.0).unwrap();
    let bfd = dir_fd(&bare.0);
    let mut r = Replace::open(&bare.0, st.path()).expect("a cgroup without a program");
    assert!(!r.confines());
    assert!(r.is_allowed(&n1).unwrap() && r.effective(&n1).unwrap());
    assert!(grant_all(&mut r, std::slice::from_ref(&n1))
        .unwrap()
        .is_empty());
    assert!(bpf::prog_query(bfd.as_fd(), bpf::BPF_CGROUP_DEVICE, 0)
        .unwrap()
        .is_empty());
    r.deny(&n1).unwrap();
    assert_eq!(
        opens(&bare.0, &[&nv0, &nv1, null]),
        vec![Err(Errno::ENXIO), Err(Errno::EPERM), Ok(())]
    );
    drop(r);
    let r = Replace::open(&bare.0, st.path()).unwrap();
    assert!(
        !r.confines(),
        "gpuhook's own program over nothing confines nothing else"
    );
    assert!(!r.is_allowed(&n1).unwrap() && r.is_allowed(&n0).unwrap());
}
