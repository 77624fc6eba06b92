//! Specs in a temporary directory; the host's own `/dev/null` (1:3), `/dev/zero` (1:5),
//! `/dev/full` (1:7) and `/dev/random` (1:8) stand in for two GPUs and a control node.

use super::*;

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
            u.own.push(Unit {
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

fn dirs(files: &[(usize, &str, &str)]) -> Dirs {
    let t = tempfile::tempdir().unwrap();
    let dirs = vec![t.path().join("etc-cdi"), t.path().join("run-cdi")];
    for d in &dirs {
        std::fs::create_dir_all(d).unwrap();
    }
    for (d, name, text) in files {
        std::fs::write(dirs[*d].join(name), text).unwrap();
    }
    Dirs { _t: t, dirs }
}

fn plan_for(d: &Dirs, chosen: &[(u32, u32)], version: Option<&str>) -> Result<Plan, String> {
    let loaded = load(&d.dirs, &["nvidia.com/gpu"])?;
    plan(
        &loaded,
        &units(chosen),
        &Host {
            dev: Path::new("/dev"),
            nvidia_version: version.map(str::to_owned),
            dirs: &d.dirs,
        },
    )
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
    let e = plan_for(&d, &[GPU0], None).unwrap_err();
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
        let e = plan_for(&d, &[GPU0], None).unwrap_err();
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
    let e = plan_for(&d, &[GPU0], Some("535.129.03")).unwrap_err();
    assert!(
        e.contains("is of NVIDIA driver 550.54.15, the host runs 535.129.03")
            && e.contains("nvidia-ctk cdi generate"),
        "{e}"
    );
}

#[test]
fn no_spec_names_dirs_and_generator() {
    let d = dirs(&[]);
    let e = plan_for(&d, &[GPU0], None).unwrap_err();
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
    assert!(plan_for(&d, &[GPU0], None)
        .unwrap_err()
        .contains("no CDI spec"));
    let d = dirs(&[(0, "x.yaml", "::: not yaml [")]);
    assert!(plan_for(&d, &[GPU0], None)
        .unwrap_err()
        .contains("CDI spec "));
}

#[test]
fn a_spec_without_the_gpus_device_is_stale() {
    let only1 = r#"    - name: "1"
      containerEdits:
        deviceNodes:
            - path: /dev/zero"#;
    let d = dirs(&[(0, "nvidia.yaml", &spec("", only1))]);
    let e = plan_for(&d, &[GPU0], None).unwrap_err();
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
        own: vec![Unit {
            id: "0000:3b:00.0/gi1/ci0".into(),
            vendor: Vendor::Nvidia,
            nodes: vec![(1, 5), (1, 7)],
        }],
        granted: [(1, 3), (1, 5), (1, 7)].into_iter().collect(),
        foreign: [(1, 8), (1, 9)].into_iter().collect(),
    };
    let loaded = load(&d.dirs, &["nvidia.com/gpu"]).unwrap();
    let host = Host {
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
    let e = plan_for(&d, &[GPU0], None).unwrap_err();
    assert!(
        e.contains("is a block device, not a character device"),
        "{e}"
    );
}
