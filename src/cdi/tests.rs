//! Specs in a temporary directory; the host's own `/dev/null` (1:3), `/dev/zero` (1:5),
//! `/dev/full` (1:7) and `/dev/random` (1:8) stand in for two GPUs and a control node.

use super::*;
use crate::host::config::ForeignHooks;
use crate::ids::Vendor;
use crate::node::Node;
use std::path::{Path, PathBuf};

const GPU0: (u32, u32) = (1, 3);
const GPU1: (u32, u32) = (1, 5);
const CTL: (u32, u32) = (1, 7);

fn spec(extra_common: &str, devices: &str) -> String {
    format!(
        r#"---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
{devices}
containerEdits:
    env:
        - NVIDIA_VISIBLE_DEVICES=void
    deviceNodes:
        - path: /dev/full
    hooks:
        - hookName: createContainer
          path: /usr/bin/nvidia-cdi-hook
          args:
            - nvidia-cdi-hook
            - create-symlinks
            - --link
            - libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so
          env:
            - NVIDIA_CTK_DEBUG=false
        - hookName: createContainer
          path: /usr/bin/nvidia-cdi-hook
          args:
            - nvidia-cdi-hook
            - update-ldcache
            - --folder
            - /usr/lib/x86_64-linux-gnu
        - hookName: createContainer
          path: /usr/bin/nvidia-cdi-hook
          args:
            - nvidia-cdi-hook
            - enable-cuda-compat
            - --host-driver-version=535.129.03
    mounts:
        - hostPath: /etc/hostname
          containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.535.129.03
          options: [ro, nosuid, nodev, rbind, rprivate]
        - hostPath: /etc
          containerPath: /usr/share/nvidia
          options: [nosuid, nodev, rbind, rprivate, rw]
{extra_common}"#
    )
}

const DEVICES: &str = r#"    - name: "0"
      containerEdits:
        deviceNodes:
            - path: /dev/null
    - name: "1"
      containerEdits:
        deviceNodes:
            - path: /dev/zero
    - name: all
      containerEdits:
        deviceNodes:
            - path: /dev/null
            - path: /dev/zero"#;

fn units(chosen: &[(u32, u32)]) -> Units {
    let mut u = Units {
        vendors: vec![Vendor::Nvidia],
        ..Default::default()
    };
    for (i, n) in [GPU0, GPU1].iter().enumerate() {
        if chosen.contains(n) {
            u.own.push(ChosenUnit {
                id: format!("gpu{i}"),
                vendor: Vendor::Nvidia,
                nodes: vec![*n],
            });
            u.granted.insert(*n);
        } else {
            u.foreign.insert(*n);
        }
    }
    u
}

struct Dirs {
    _t: tempfile::TempDir,
    dirs: Vec<PathBuf>,
}

/// A temporary directory gpuhook trusts: root's, under `/var/lib` (not under `/tmp`, which
/// others may write).
fn trusted_tempdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let base = Path::new("/var/lib/gpuhook-tests");
    std::fs::create_dir_all(base).expect("/var/lib/gpuhook-tests (run the tests as root)");
    std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o755)).unwrap();
    tempfile::Builder::new()
        .prefix("cdi-unit-")
        .tempdir_in(base)
        .unwrap()
}

fn dirs(files: &[(usize, &str, &str)]) -> Dirs {
    let t = trusted_tempdir();
    let dirs = vec![t.path().join("etc-cdi"), t.path().join("run-cdi")];
    for d in &dirs {
        std::fs::create_dir_all(d).unwrap();
    }
    for (d, name, text) in files {
        std::fs::write(dirs[*d].join(name), text).unwrap();
    }
    Dirs { _t: t, dirs }
}

/// A load and a plan: either's error.
type Planned = Result<Plan, Box<dyn std::error::Error>>;

fn plan_for(d: &Dirs, chosen: &[(u32, u32)], version: Option<&str>) -> Planned {
    plan_with(d, chosen, version, ForeignHooks::Pass)
}

fn plan_err(d: &Dirs, chosen: &[(u32, u32)], version: Option<&str>) -> String {
    plan_for(d, chosen, version).unwrap_err().to_string()
}

fn load_err(dirs: &[PathBuf]) -> String {
    load(dirs, &["nvidia.com/gpu"]).unwrap_err().to_string()
}

fn plan_with(
    d: &Dirs,
    chosen: &[(u32, u32)],
    version: Option<&str>,
    foreign_hooks: ForeignHooks,
) -> Planned {
    let loaded = load(&d.dirs, &["nvidia.com/gpu"])?;
    Ok(plan(
        &loaded,
        &units(chosen),
        &SpecHost {
            foreign_hooks,
            dev: Path::new("/dev"),
            nvidia_version: version.map(str::to_owned),
            dirs: &d.dirs,
        },
    )?)
}

#[test]
fn one_gpu_gets_its_device_and_the_common_edits() {
    let d = dirs(&[(1, "nvidia.yaml", &spec("", DEVICES))]);
    let p = plan_for(&d, &[GPU0], Some("535.129.03")).unwrap();
    assert_eq!(p.devices, ["nvidia.com/gpu=0"]);
    // Its node is gpuhook's own; the control node is extra.
    assert_eq!(p.nodes.len(), 1);
    assert_eq!(p.nodes[0].node, Node::new("/dev/full", CTL.0, CTL.1));
    assert_eq!(p.mounts.len(), 2);
    let lib = &p.mounts[0];
    assert_eq!(
        (lib.target.as_str(), lib.rw, lib.dir, lib.recursive),
        (
            "/usr/lib/x86_64-linux-gnu/libcuda.so.535.129.03",
            false,
            false,
            true
        )
    );
    assert!(p.mounts[1].rw && p.mounts[1].dir, "{:?}", p.mounts[1]);
    assert_eq!(
        p.links,
        [Link {
            target: "libcuda.so.1".into(),
            link: "/usr/lib/x86_64-linux-gnu/libcuda.so".into()
        }]
    );
    assert_eq!(p.ld_folders, ["/usr/lib/x86_64-linux-gnu"]);
    // Only the hook gpuhook does not do itself is passed on.
    assert_eq!(p.hooks.len(), 1);
    assert_eq!(p.hooks[0].args[1], "enable-cuda-compat");
    assert_eq!(p.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
    // Both GPUs: both devices, never `all`.
    let p = plan_for(&d, &[GPU0, GPU1], None).unwrap();
    assert_eq!(p.devices, ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]);
}

#[test]
fn json_and_later_directory_wins() {
    // /etc/cdi has a stale spec (another driver); /var/run/cdi's devices replace it.
    let stale = spec("", DEVICES).replace("535.129.03", "550.54.15");
    let good = spec("", DEVICES);
    let d = dirs(&[(0, "nvidia.yaml", &stale), (1, "nvidia.yaml", &good)]);
    plan_for(&d, &[GPU0], Some("535.129.03")).unwrap();
    // One directory defining a device twice is a conflict.
    let d = dirs(&[(1, "a.yaml", &good), (1, "b.yaml", &good)]);
    let e = plan_err(&d, &[GPU0], None);
    assert!(
        e.contains("is defined in both") && e.contains("a.yaml"),
        "{e}"
    );
    // JSON, as amd-ctk writes it.
    let json = r#"{"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [
            {"path": "/dev/null", "type": "c", "major": 1, "minor": 3, "fileMode": 432,
             "permissions": "rwm", "uid": 0, "gid": 44}]}}],
        "containerEdits": {}}"#;
    let d = dirs(&[(0, "x.json", json)]);
    let p = plan_for(&d, &[GPU0], None).unwrap();
    assert_eq!(p.devices, ["nvidia.com/gpu=0"]);
    assert!(p.mounts.is_empty() && p.nodes.is_empty());
}

#[test]
fn bad_specs_are_one_line_errors() {
    let good = spec("", DEVICES);
    let cases: Vec<(String, &str)> = vec![
        (
            good.replace("    env:\n", "    envs:\n"),
            "unknown field `envs`",
        ),
        (
            good.replace("cdiVersion: 0.5.0", "cdiVersion: 1.2.0"),
            "cdiVersion 1.2.0 is newer than the 1.1.0 gpuhook reads",
        ),
        (
            good.replace("cdiVersion: 0.5.0", "cdiVersion: banana"),
            "cdiVersion 'banana' is not a CDI version",
        ),
        (
            good.replace("hostPath: /etc/hostname", "hostPath: etc/hostname"),
            "mount hostPath 'etc/hostname' is not absolute",
        ),
        (
            good.replace(
                "containerPath: /usr/share/nvidia",
                "containerPath: /usr/../etc",
            ),
            "is not a plain absolute path",
        ),
        (
            good.replace(
                "        - path: /dev/full",
                "        - path: /dev/full\n          type: b",
            ),
            "only character devices are given",
        ),
        (
            good.replace("        - path: /dev/full", "        - path: /etc/passwd"),
            "is not under /dev",
        ),
        (
            good.replace("        - path: /dev/full", "        - path: /dev/zero"),
            "another GPU's node",
        ),
        (
            good.replace(
                "options: [ro, nosuid, nodev, rbind, rprivate]",
                "type: tmpfs",
            ),
            "only bind mounts are given",
        ),
        (
            good.replace(
                "options: [ro, nosuid, nodev, rbind, rprivate]",
                "options: [ro, rbind, suid]",
            ),
            "option 'suid' is not one gpuhook applies",
        ),
        (
            good.replace("        - NVIDIA_VISIBLE_DEVICES=void", "        - =void"),
            "is not NAME=VALUE",
        ),
        (
            good.replace(
                "containerPath: /usr/share/nvidia",
                "containerPath: /dev/shm/",
            ),
            "mount at /dev/shm: that is where gpuhook mounts an MPS daemon's directories; refusing",
        ),
        (
            good.replace(
                "containerPath: /usr/share/nvidia",
                "containerPath: /tmp/nvidia-mps",
            ),
            "mount at /tmp/nvidia-mps: that is where",
        ),
        (
            good.replace("hookName: createContainer", "hookName: preStart"),
            "hook stage 'preStart' is not an OCI hook",
        ),
        (
            good.replace(
                "hostPath: /etc/hostname",
                "hostPath: /nonexistent/libcuda.so.535.129.03",
            ),
            "mount source /nonexistent/libcuda.so.535.129.03: No such file",
        ),
    ];
    for (text, want) in cases {
        let d = dirs(&[(0, "nvidia.yaml", &text)]);
        let e = plan_err(&d, &[GPU0], None);
        assert!(e.contains(want), "want {want:?}, got {e}");
        assert!(!e.contains('\n'), "{e}");
        assert!(e.contains("nvidia.yaml"), "names the file: {e}");
    }
}

#[test]
fn spec_for_another_driver_says_so() {
    // The host runs 535.129.03; a spec written for 550.54.15 names files that are not there.
    let d = dirs(&[(
        0,
        "nvidia.yaml",
        &spec("", DEVICES).replace(
            "hostPath: /etc/hostname\n          containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.535.129.03",
            "hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15\n          containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
        ),
    )]);
    let e = plan_err(&d, &[GPU0], Some("535.129.03"));
    assert!(
        e.contains("is of NVIDIA driver 550.54.15, the host runs 535.129.03")
            && e.contains("nvidia-ctk cdi generate"),
        "{e}"
    );
}

#[test]
fn no_spec_names_dirs_and_generator() {
    let d = dirs(&[]);
    let e = plan_err(&d, &[GPU0], None);
    assert!(
        e.starts_with("driver \"cdi\": no CDI spec for nvidia.com/gpu in "),
        "{e}"
    );
    assert!(e.contains("etc-cdi") && e.contains("run-cdi"), "{e}");
    assert!(
        e.contains("`nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml`"),
        "{e}"
    );
    // Another vendor's broken spec is not read further; a broken spec whose kind is unknown is.
    let d = dirs(&[(
        0,
        "amd.json",
        r#"{"cdiVersion": "0.6.0", "kind": "amd.com/gpu", "bogus": 1}"#,
    )]);
    assert!(plan_err(&d, &[GPU0], None).contains("no CDI spec"));
    let d = dirs(&[(0, "x.yaml", "::: not yaml [")]);
    assert!(plan_err(&d, &[GPU0], None).contains("CDI spec "));
}

#[test]
fn a_spec_without_the_gpus_device_is_stale() {
    let only1 = r#"    - name: "1"
      containerEdits:
        deviceNodes:
            - path: /dev/zero"#;
    let d = dirs(&[(0, "nvidia.yaml", &spec("", only1))]);
    let e = plan_err(&d, &[GPU0], None);
    assert!(e.contains("have no device for gpu0 (1:3)"), "{e}");
}

#[test]
fn native_hooks() {
    let a = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    match native(
        "/usr/bin/nvidia-cdi-hook",
        &a(&[
            "nvidia-cdi-hook",
            "create-symlinks",
            "--link",
            "a::/x/b",
            "--link=c::/y/d",
        ]),
    ) {
        Ok(Some(Native::Links(l))) => assert_eq!(l.len(), 2),
        _ => panic!(),
    }
    match native(
        "/usr/bin/nvidia-ctk",
        &a(&[
            "nvidia-ctk",
            "hook",
            "update-ldcache",
            "--folder",
            "/lib",
            "--ldconfig-path",
            "/sbin/ldconfig",
        ]),
    ) {
        Ok(Some(Native::Ldcache(f))) => assert_eq!(f, ["/lib"]),
        _ => panic!(),
    }
    // Unknown flags or other hooks are passed on.
    assert!(native(
        "/usr/bin/nvidia-cdi-hook",
        &a(&["nvidia-cdi-hook", "create-symlinks", "--mystery"])
    )
    .unwrap()
    .is_none());
    assert!(native("/usr/bin/other", &a(&["other", "create-symlinks"]))
        .unwrap()
        .is_none());
    // Bad values are errors.
    assert!(native(
        "/usr/bin/nvidia-cdi-hook",
        &a(&["nvidia-cdi-hook", "create-symlinks", "--link", "nocolons"])
    )
    .is_err());
    assert!(native(
        "/usr/bin/nvidia-cdi-hook",
        &a(&["nvidia-cdi-hook", "update-ldcache", "--folder", "relative"])
    )
    .is_err());
}

#[test]
fn driver_version_from_proc() {
    assert_eq!(
        nvidia_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023\nGCC version:  gcc\n").as_deref(),
        Some("535.129.03")
    );
    assert_eq!(
        nvidia_version(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build\n"
        )
        .as_deref(),
        Some("550.54.15")
    );
    assert_eq!(nvidia_version("garbage"), None);
}

#[test]
fn a_mig_instance_gets_its_own_device_only() {
    // GPU 0 (/dev/null) in MIG mode; instance A's capabilities /dev/zero + /dev/full,
    // instance B's /dev/random (1:8) + /dev/urandom (1:9). The container holds A: the
    // parent node is granted, A's capabilities are its own, B's are foreign.
    let devices = r#"    - name: "0"
      containerEdits:
        deviceNodes:
            - path: /dev/null
    - name: "0:0"
      containerEdits:
        deviceNodes:
            - path: /dev/null
            - path: /dev/zero
            - path: /dev/full
    - name: "0:1"
      containerEdits:
        deviceNodes:
            - path: /dev/null
            - path: /dev/random
            - path: /dev/urandom"#;
    let text = spec("", devices).replace("        - path: /dev/full\n    hooks:", "    hooks:");
    let d = dirs(&[(0, "nvidia.yaml", &text)]);
    let units = Units {
        vendors: vec![Vendor::Nvidia],
        own: vec![ChosenUnit {
            id: "0000:3b:00.0/gi1/ci0".into(),
            vendor: Vendor::Nvidia,
            nodes: vec![(1, 5), (1, 7)],
        }],
        granted: [(1, 3), (1, 5), (1, 7)].into_iter().collect(),
        foreign: [(1, 8), (1, 9)].into_iter().collect(),
    };
    let loaded = load(&d.dirs, &["nvidia.com/gpu"]).unwrap();
    let host = SpecHost {
        foreign_hooks: ForeignHooks::Pass,
        dev: Path::new("/dev"),
        nvidia_version: None,
        dirs: &d.dirs,
    };
    let p = plan(&loaded, &units, &host).unwrap();
    assert_eq!(p.devices, ["nvidia.com/gpu=0:0"]);
    assert!(p.nodes.is_empty(), "{:?}", p.nodes);
}

#[test]
fn a_block_device_on_the_host_is_refused() {
    // The spec says nothing of the type; the host node (made here, 7:0 like /dev/loop0)
    // is a block device.
    let d = dirs(&[]);
    let node = d.dirs[0].join("blk");
    nix::sys::stat::mknod(
        &node,
        nix::sys::stat::SFlag::S_IFBLK,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
        libc::makedev(7, 0),
    )
    .expect("mknod (the tests run as root)");
    let text = spec("", DEVICES).replace(
        "        - path: /dev/full",
        &format!(
            "        - path: /dev/loop9\n          hostPath: {}",
            node.display()
        ),
    );
    std::fs::write(d.dirs[1].join("nvidia.yaml"), text).unwrap();
    let e = plan_err(&d, &[GPU0], None);
    assert!(
        e.contains("is a block device, not a character device"),
        "{e}"
    );
}

/// A spec file that is a symlink is refused, never followed (its target, a good spec, is
/// not read), and the message names the link.
#[test]
fn a_symlinked_spec_is_refused_not_followed() {
    let d = dirs(&[]);
    let target = d._t.path().join("elsewhere.yaml");
    std::fs::write(&target, spec("", DEVICES)).unwrap();
    let link = d.dirs[1].join("nvidia.yaml");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let e = load_err(&d.dirs);
    assert_eq!(
        e,
        format!(
            "CDI spec {} is a symlink; refusing to follow it",
            link.display()
        )
    );
    // The same spec as a file is good.
    std::fs::remove_file(&link).unwrap();
    std::fs::rename(&target, &link).unwrap();
    assert_eq!(load(&d.dirs, &["nvidia.com/gpu"]).unwrap().len(), 1);
}

/// A FIFO in a spec's place (no writer) neither blocks the load nor is skipped: refused.
#[test]
fn a_fifo_spec_does_not_block_and_is_refused() {
    let d = dirs(&[]);
    let fifo = d.dirs[0].join("nvidia.yaml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let dirs = d.dirs.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(load(&dirs, &["nvidia.com/gpu"]).map(|l| l.len()));
    });
    let r = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("load blocked on a FIFO");
    assert_eq!(
        r.unwrap_err().to_string(),
        format!(
            "CDI spec {} is a FIFO, not a regular file; refusing to read it",
            fifo.display()
        )
    );
}

/// A spec directory that group or others may write, or that is not root's, is refused in one
/// line naming it (also through a symlink to it); a missing one is still skipped.
#[test]
fn a_spec_directory_others_may_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let d = dirs(&[(1, "nvidia.yaml", &spec("", DEVICES))]);
    let mode =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    let run = &d.dirs[1];
    mode(run, 0o775);
    let e = load_err(&d.dirs);
    assert_eq!(
        e,
        format!(
            "CDI spec directory {} has mode 0775: group or others may write it; refusing to read specs from it",
            run.display()
        )
    );
    let link = d._t.path().join("link");
    std::os::unix::fs::symlink(run, &link).unwrap();
    let e = load_err(std::slice::from_ref(&link));
    assert!(
        e.starts_with(&format!(
            "CDI spec directory {} ({}) has mode 0775",
            link.display(),
            run.display()
        )),
        "{e}"
    );
    mode(run, 0o755);
    nix::unistd::chown(run.as_path(), Some(nix::unistd::Uid::from_raw(1000)), None).unwrap();
    let e = load_err(&d.dirs);
    assert_eq!(
        e,
        format!(
            "CDI spec directory {} is owned by uid 1000, not root; refusing to read specs from it",
            run.display()
        )
    );
    nix::unistd::chown(run.as_path(), Some(nix::unistd::Uid::from_raw(0)), None).unwrap();
    assert_eq!(load(&d.dirs, &["nvidia.com/gpu"]).unwrap().len(), 1);
    let missing = vec![d._t.path().join("none"), run.clone()];
    assert_eq!(load(&missing, &["nvidia.com/gpu"]).unwrap().len(), 1);
}

/// A parent of a spec directory that others may write is refused, naming that parent: sticky
/// or not (whoever may write `/tmp` may make a directory there, or a spec directory path
/// through one that does not exist yet).
#[test]
fn a_parent_others_may_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let d = dirs(&[(1, "nvidia.yaml", &spec("", DEVICES))]);
    let parent = d._t.path();
    for m in [0o757, 0o1777] {
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(m)).unwrap();
        let e = load_err(&d.dirs);
        assert_eq!(
            e,
            format!(
                "CDI spec directory {}: its parent {} has mode {m:04o}: group or others may write it; refusing to read specs from it",
                d.dirs[0].display(),
                parent.display()
            )
        );
    }
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(load(&d.dirs, &["nvidia.com/gpu"]).unwrap().len(), 1);
    // A spec directory under /tmp.
    let t = tempfile::tempdir_in("/tmp").unwrap();
    let e = load_err(&[t.path().to_path_buf()]);
    assert!(
        e.ends_with(": its parent /tmp has mode 1777: group or others may write it; refusing to read specs from it"),
        "{e}"
    );
}

/// `"cdi_foreign_hooks": "refuse"`: a spec whose matched edits hold a hook gpuhook does not
/// do itself (`enable-cuda-compat` in the common edits; `chmod` in a device's) is refused in
/// one line naming the hook and the spec file; the two it does itself are still done, and
/// another GPU's device with such a hook is not this container's business.
#[test]
fn foreign_hooks_refused_on_request() {
    let d = dirs(&[(1, "nvidia.yaml", &spec("", DEVICES))]);
    let file = d.dirs[1].join("nvidia.yaml");
    assert_eq!(
        plan_with(&d, &[GPU0], None, ForeignHooks::Refuse).unwrap_err().to_string(),
        format!(
            "CDI spec {}: createContainer hook /usr/bin/nvidia-cdi-hook enable-cuda-compat is not one gpuhook does itself, and the host config refuses such hooks (\"cdi_foreign_hooks\": \"refuse\")",
            file.display()
        )
    );
    // Without it: the native hooks only, nothing refused.
    let native_only = spec("", DEVICES).replace(
        "        - hookName: createContainer\n          path: /usr/bin/nvidia-cdi-hook\n          args:\n            - nvidia-cdi-hook\n            - enable-cuda-compat\n            - --host-driver-version=535.129.03\n",
        "",
    );
    assert!(!native_only.contains("enable-cuda-compat"));
    let devices = DEVICES.replace(
        "    - name: \"1\"\n      containerEdits:\n",
        "    - name: \"1\"\n      containerEdits:\n        hooks:\n            - hookName: createContainer\n              path: /usr/bin/chmod\n              args: [chmod, \"777\", /dev/zero]\n",
    );
    assert!(devices.contains("/usr/bin/chmod"));
    std::fs::write(&file, native_only.replace(DEVICES, &devices)).unwrap();
    let p = plan_with(&d, &[GPU0], None, ForeignHooks::Refuse).unwrap();
    assert!(p.hooks.is_empty(), "{:?}", p.hooks);
    assert_eq!(p.ld_folders, ["/usr/lib/x86_64-linux-gnu"]);
    assert_eq!(p.links.len(), 1);
    let e = plan_with(&d, &[GPU1], None, ForeignHooks::Refuse)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!(
            "CDI spec {} device 1: createContainer hook /usr/bin/chmod 777 is not one gpuhook does itself, and the host config refuses such hooks (\"cdi_foreign_hooks\": \"refuse\")",
            file.display()
        )
    );
    // Passed on by default.
    let p = plan_with(&d, &[GPU1], None, ForeignHooks::Pass).unwrap();
    assert_eq!(p.hooks.len(), 1);
    assert_eq!(p.hooks[0].path, "/usr/bin/chmod");
}

/// The SONAME of a host library (what `update-ldcache`'s link is named after): read from
/// the ELF dynamic section; an executable without one, or a file that is not ELF, has none.
#[test]
fn soname_of_a_shared_object() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("x.c");
    std::fs::write(&src, "int gpuhook_x(void) { return 1; }\n").unwrap();
    let lib = dir.path().join("libx.so.535.129.03");
    let ok = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-Wl,-soname,libx.so.1", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .unwrap()
        .success();
    assert!(ok, "cc");
    assert_eq!(super::soname(&lib).as_deref(), Some("libx.so.1"));
    assert_eq!(super::soname(std::path::Path::new("/bin/sh")), None);
    std::fs::write(dir.path().join("text"), "not ELF").unwrap();
    assert_eq!(super::soname(&dir.path().join("text")), None);
}

/// The messages of errors no other test reaches, pinned as they were written before they were
/// types.
#[test]
fn error_messages_unchanged() {
    let cases: [(String, &str); 11] = [
        (
            EditError::Permissions {
                path: "/dev/x".into(),
                perms: "rwx".into(),
            }
            .to_string(),
            "deviceNode /dev/x: permissions 'rwx' are not rwm",
        ),
        (
            EditError::NodeConflict {
                path: "/dev/x".into(),
                here: (1, 3),
                there: (1, 5),
            }
            .to_string(),
            "deviceNode /dev/x is 1:3 here and 1:5 elsewhere",
        ),
        (
            EditError::MountConflict {
                target: "/a".into(),
                from: "/b".into(),
                other: "/c".into(),
            }
            .to_string(),
            "mount at /a is /b here and /c elsewhere",
        ),
        (
            PlanError::MountAndLink("/a".into()).to_string(),
            "CDI specs both mount at and link /a; refusing",
        ),
        (
            EditError::IntelRdt.to_string(),
            "intelRdt edits are not supported by gpuhook",
        ),
        (
            EditError::NetDevices.to_string(),
            "netDevices edits are not supported by gpuhook",
        ),
        (
            LoadError::TooBig {
                path: "/etc/cdi/x.yaml".into(),
            }
            .to_string(),
            "CDI spec /etc/cdi/x.yaml is larger than 4 MiB",
        ),
        (
            SpecError::DeviceTwice("gpu0".into()).to_string(),
            "device 'gpu0' is defined twice",
        ),
        (
            LoadError::DirMode {
                what: "CDI spec directory /x".into(),
                mode: 0o777,
            }
            .to_string(),
            "CDI spec directory /x has mode 0777: group or others may write it; refusing to read specs from it",
        ),
        (
            EditError::NumberMismatch {
                path: "/dev/x".into(),
                said: (1, 3),
                host: PathBuf::from("/dev/y"),
                major: 1,
                minor: 5,
            }
            .to_string(),
            "deviceNode /dev/x says 1:3, the host node /dev/y is 1:5",
        ),
        (
            PlanError::Device {
                spec: "/etc/cdi/n.yaml".into(),
                name: "0".into(),
                source: Box::new(EditError::Env("X".into())),
            }
            .to_string(),
            "CDI spec /etc/cdi/n.yaml device 0: env 'X' is not NAME=VALUE",
        ),
    ];
    for (got, want) in cases {
        assert_eq!(got, want);
    }
}
