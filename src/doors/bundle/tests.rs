//! The bundle's parse, edits and strip, on `config.json` values.

use super::edit::{edit, edit_mps};
use super::hooks::{BadToken, HookCmd, HookToken};
use super::parse::{has_user_namespace, parse, valid_id, Policy};
use super::strip::{strip, Added};
use crate::node::NodeSpec;
use crate::request::Request;
use crate::request::{DeviceSel, Field};
use serde_json::{json, Value};

/// The token reads back as written; anything else is no token.
#[test]
fn hook_token_round_trips() {
    let t = HookToken(crate::host::procfs::ProcRef {
        pid: 42,
        start_time: 7,
    });
    assert_eq!(t.to_string(), "42.7");
    assert_eq!("42.7".parse::<HookToken>(), Ok(t));
    for bad in ["", "42", "42.", ".7", "a.7", "42.7.1", "-1.x"] {
        assert_eq!(bad.parse::<HookToken>(), Err(BadToken), "{bad}");
    }
}

/// The list an edit's hooks carry, read back; an entry it cannot read is skipped.
#[test]
fn added_list_parses() {
    let lists = vec![
        "n:195:0:/dev/nvidia0,r:195:255,m:0:0:/usr/lib/x:y".to_string(),
        "e:0:0:NVIDIA_X,g:44:0,bogus,n:x:0:/dev/a,r:1:2:3".to_string(),
    ];
    assert_eq!(
        Added::parse(&lists),
        Added {
            nodes: vec![(195, 0, "/dev/nvidia0".into())],
            rules: vec![(195, 255)],
            binds: vec!["/usr/lib/x:y".into()],
            envs: vec!["NVIDIA_X".into()],
            gids: vec![44],
        }
    );
}

fn cfg(annotations: Value, env: &[&str]) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "ociVersion": "1.0.2",
        "process": {"args": ["sh"], "env": env, "cwd": "/"},
        "root": {"path": "rootfs"},
        "annotations": annotations,
        "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]},
                  "namespaces": [{"type": "pid"}, {"type": "mount"}]}
    }))
    .unwrap()
}

/// An NVIDIA node (major 195) for a container, mode 0666, owned by root.
fn n(path: &str, minor: u32) -> NodeSpec {
    NodeSpec {
        node: crate::node::Node::new(path, 195, minor),
        mode: 0o666,
        uid: 0,
        gid: 0,
    }
}

fn req(annotations: Value, env: &[&str]) -> Result<Option<Request>, String> {
    parse(&cfg(annotations, env), Policy::default())
        .map(|b| b.request)
        .map_err(|e| e.to_string())
}

#[test]
fn annotations_are_the_xml_vocabulary() {
    let r = req(
        json!({"gpuhook.io/gpus": "2", "gpuhook.io/arch": "Hopper", "gpuhook.io/vendor": "nvidia",
               "gpuhook.io/mode": "0660", "gpuhook.io/uid": "1000", "gpuhook.io/capabilities": "compute",
               "gpuhook.io/driver": "none", "io.podman.annotations.label": "x"}),
        &[],
    )
    .unwrap()
    .unwrap();
    assert_eq!(r.count, 2);
    assert_eq!((r.mode, r.uid, r.gid), (Some(0o660), 1000, 0));
    assert!(!r.capabilities.utility);
    assert!(r.filters.iter().any(|f| f.field == Field::Arch));
    assert!(r.filters.iter().any(|f| f.field == Field::Vendor));
    assert!(!r.mig);
    // MIG instances, as annotation or env.
    let r = req(
        json!({"gpuhook.io/mig": "yes", "gpuhook.io/gpus": "3"}),
        &[],
    )
    .unwrap()
    .unwrap();
    assert!(r.mig && r.count == 3);
    assert_eq!(r.to_string(), "3 MIG instances");
    let r = req(json!({}), &["GPUHOOK_MIG=yes"]).unwrap().unwrap();
    assert!(r.mig && r.count == 1);
    assert!(req(json!({"gpuhook.io/mig": "some"}), &[])
        .unwrap_err()
        .to_string()
        .contains("annotation 'gpuhook.io/mig': mig 'some' is not yes or no"));
    assert!(req(
        json!({"gpuhook.io/mig": "yes", "gpuhook.io/devices": "0000:3b:00.0"}),
        &[]
    )
    .unwrap_err()
    .to_string()
    .contains("names whole GPUs and annotation 'gpuhook.io/mig' asks for MIG instances"));
    let r = req(
        json!({"gpuhook.io/devices": "0000:3B:00.0, GPU-ABC-1,3"}),
        &[],
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        r.devices,
        vec![
            DeviceSel::Pci("0000:3b:00.0".into()),
            DeviceSel::Uuid("gpu-abc-1".into()),
            DeviceSel::Index(3)
        ]
    );
    assert_eq!(r.count, 3);
}

#[test]
fn env_only_without_annotations() {
    let r = req(
        json!({}),
        &[
            "PATH=/bin",
            "GPUHOOK_GPUS=1",
            "GPUHOOK_GPUS=3",
            "GPUHOOK_ARCH=ampere",
        ],
    )
    .unwrap()
    .unwrap();
    assert_eq!(r.count, 3);
    // Annotations win: the env is not read then.
    let r = req(
        json!({"gpuhook.io/gpus": "1"}),
        &["GPUHOOK_GPUS=5", "GPUHOOK_BOGUS=1"],
    )
    .unwrap()
    .unwrap();
    assert_eq!(r.count, 1);
    assert_eq!(
        req(json!({"other": "gpuhook.io/"}), &["A=GPUHOOK_GPUS"]).unwrap(),
        None
    );
}

#[test]
fn bad_requests_are_one_line_errors() {
    for (a, env, needle) in [
        (
            json!({"gpuhook.io/gpu": "1"}),
            vec![],
            "unknown key: annotation 'gpuhook.io/gpu'",
        ),
        (
            json!({"gpuhook.io/gpus": "0"}),
            vec![],
            "annotation 'gpuhook.io/gpus'",
        ),
        (
            json!({"gpuhook.io/gpus": "two"}),
            vec![],
            "annotation 'gpuhook.io/gpus'",
        ),
        (json!({"gpuhook.io/count": "1"}), vec![], "unknown key"),
        (
            json!({"gpuhook.io/vendor": "3dfx"}),
            vec![],
            "unknown vendor '3dfx'",
        ),
        (json!({"gpuhook.io/mode": "4755"}), vec![], "setuid"),
        (json!({"gpuhook.io/gpus": 2}), vec![], "is not a string"),
        (
            json!({"gpuhook.io/devices": "0000:3b:00.0,,1"}),
            vec![],
            "empty entry",
        ),
        (
            json!({"gpuhook.io/devices": "../x"}),
            vec![],
            "neither a PCI address",
        ),
        (
            json!({"gpuhook.io/gpus": "1", "gpuhook.io/devices": "0,1"}),
            vec![],
            "fewer than the 2",
        ),
        (
            json!({"gpuhook.io/driver": "nvidia"}),
            vec![],
            "unknown driver 'nvidia' (known: none, cdi, host)",
        ),
        (
            json!({}),
            vec!["GPUHOOK_ARCH="],
            "environment variable GPUHOOK_ARCH: empty architecture",
        ),
        (
            json!({}),
            vec!["GPUHOOK_FOO=1"],
            "unknown key: environment variable GPUHOOK_FOO",
        ),
    ] {
        let env: Vec<&str> = env;
        let e = req(a.clone(), &env).expect_err(&format!("{a} {env:?} accepted"));
        assert!(e.contains(needle), "{e:?} lacks {needle:?}");
        assert!(!e.contains('\n'));
    }
    let p = Policy::default();
    assert!(parse(b"{not json", p)
        .unwrap_err()
        .to_string()
        .contains("not valid JSON"));
    assert!(parse(b"[]", p)
        .unwrap_err()
        .to_string()
        .contains("not a JSON object"));
}

/// A request's keys that conflict are refused in the words of the door they came through:
/// the annotations' keys, the environment's variables (never the domain XML's `count='1'`,
/// `<device>` children or `mig='yes'`).
#[test]
fn each_door_words_a_conflict_in_its_own_keys() {
    let said = |a: Value, env: &[&str]| req(a, env).unwrap_err();
    // The same GPU twice: the duplicate named, before any count is compared.
    assert_eq!(
        said(json!({"gpuhook.io/devices": "0,0"}), &[]),
        "annotation 'gpuhook.io/devices': '0' is named twice"
    );
    assert_eq!(
        said(
            json!({"gpuhook.io/gpus": "1", "gpuhook.io/devices": "0, 1,0"}),
            &[]
        ),
        "annotation 'gpuhook.io/devices': '0' is named twice"
    );
    assert_eq!(
        said(json!({}), &["GPUHOOK_DEVICES=0000:3b:00.0,3B:00.0"]),
        "environment variable GPUHOOK_DEVICES: '3B:00.0' is named twice"
    );
    assert_eq!(
        said(json!({"gpuhook.io/gpus": "1", "gpuhook.io/devices": "0,1"}), &[]),
        "annotation 'gpuhook.io/gpus' asks for 1 GPU, fewer than the 2 named by annotation 'gpuhook.io/devices'"
    );
    assert_eq!(
        said(json!({}), &["GPUHOOK_GPUS=2", "GPUHOOK_DEVICES=0,1,2"]),
        "environment variable GPUHOOK_GPUS asks for 2 GPUs, fewer than the 3 named by environment variable GPUHOOK_DEVICES"
    );
    assert_eq!(
        said(json!({"gpuhook.io/mig": "yes", "gpuhook.io/share": "yes"}), &[]),
        "MIG instances are never shared: annotation 'gpuhook.io/mig' and annotation 'gpuhook.io/share' cannot be asked for together"
    );
    assert_eq!(
        said(json!({}), &["GPUHOOK_MIG=yes", "GPUHOOK_SHARE=1"]),
        "MIG instances are never shared: environment variable GPUHOOK_MIG and environment variable GPUHOOK_SHARE cannot be asked for together"
    );
    assert_eq!(
        said(json!({}), &["GPUHOOK_MIG=yes", "GPUHOOK_DEVICES=1"]),
        "environment variable GPUHOOK_DEVICES names whole GPUs and environment variable GPUHOOK_MIG asks for MIG instances: a request is one or the other"
    );
    for e in [
        said(json!({"gpuhook.io/devices": "0,0"}), &[]),
        said(
            json!({"gpuhook.io/mig": "yes", "gpuhook.io/share": "yes"}),
            &[],
        ),
        said(json!({}), &["GPUHOOK_GPUS=1", "GPUHOOK_DEVICES=0,1"]),
    ] {
        for xml in ["<device>", "mig='", "share='", "count '", "count="] {
            assert!(!e.contains(xml), "{e}: the domain XML's words");
        }
    }
}

#[test]
fn user_namespace_maps_the_owner() {
    let mut c: Value =
        serde_json::from_slice(&cfg(json!({"gpuhook.io/uid": "1000"}), &[])).unwrap();
    c["linux"]["uidMappings"] = json!([{"containerID": 0, "hostID": 100000, "size": 65536}]);
    c["linux"]["gidMappings"] = json!([{"containerID": 0, "hostID": 100000, "size": 65536}]);
    let p = Policy::default();
    let b = parse(&serde_json::to_vec(&c).unwrap(), p).unwrap();
    assert_eq!(b.idmap.host_uid(1000), Some(101000));
    c["annotations"]["gpuhook.io/uid"] = json!("70000");
    let e = parse(&serde_json::to_vec(&c).unwrap(), p)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("uid 70000 is not mapped by linux.uidMappings"),
        "{e}"
    );
    c["linux"]["uidMappings"] = json!("x");
    assert!(parse(&serde_json::to_vec(&c).unwrap(), p).is_err());
}

#[test]
fn mps_sharer_gets_pipe_shm_and_env_and_strip_takes_them_out() {
    let mut c: Value =
        serde_json::from_slice(&cfg(json!({"gpuhook.io/share": "yes"}), &["A=1"])).unwrap();
    c["mounts"] = json!([{"destination": "/dev/shm", "type": "tmpfs", "source": "shm"}]);
    let hook = HookCmd {
        path: "/usr/bin/gpuhook".into(),
        env: vec![],
        token: "42.7".into(),
    };
    edit(&mut c, &[n("/dev/nvidia0", 0)], None, &hook, None).unwrap();
    edit_mps(&mut c, std::path::Path::new("/run/gpuhook/mps/GPU-1")).unwrap();
    let m = c["mounts"].as_array().unwrap();
    assert_eq!(m.len(), 2, "{m:?}");
    assert_eq!(
        m[0],
        json!({"destination": "/tmp/nvidia-mps", "type": "bind",
               "source": "/run/gpuhook/mps/GPU-1/pipe",
               "options": ["rbind", "ro", "nosuid", "nodev"]})
    );
    assert_eq!(m[1]["destination"], "/dev/shm");
    assert_eq!(m[1]["source"], "/run/gpuhook/mps/GPU-1/shm");
    assert_eq!(m[1]["options"], json!(["rbind", "rw", "nosuid", "nodev"]));
    assert_eq!(
        c["process"]["env"],
        json!(["A=1", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"])
    );
    let args = c["hooks"]["poststop"][0]["args"].as_array().unwrap();
    assert!(args
        .last()
        .unwrap()
        .as_str()
        .unwrap()
        .ends_with("m:0:0:/tmp/nvidia-mps,m:0:0:/dev/shm,e:0:0:CUDA_MPS_PIPE_DIRECTORY"));
    assert!(strip(&mut c));
    assert_eq!(c["mounts"], json!([]));
    assert_eq!(c["process"]["env"], json!(["A=1"]));
}

#[test]
fn edit_adds_nodes_rules_and_hooks_and_keeps_the_rest() {
    let mut c: Value = serde_json::from_slice(&cfg(json!({"gpuhook.io/gpus": "1"}), &[])).unwrap();
    let hook = HookCmd {
        path: "/usr/bin/gpuhook".into(),
        env: vec!["GPUHOOK_CONFIG=/etc/x.json".into()],
        token: "42.7".into(),
    };
    // A device of the user's at a node's path with another number is refused: it would
    // shadow the reserved GPU.
    c["linux"]["devices"] = json!([{"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 3}]);
    let e = edit(&mut c, &[n("/dev/nvidia0", 0)], None, &hook, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("already has a device at /dev/nvidia0 (1:3)"),
        "{e}"
    );
    c["linux"]["devices"] = json!([{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}]);
    let before = c.clone();
    edit(
        &mut c,
        &[n("/dev/nvidia0", 0), n("/dev/nvidiactl", 255)],
        None,
        &hook,
        None,
    )
    .unwrap();
    let devs = c["linux"]["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 3, "{devs:?}");
    let listed = "n:195:0:/dev/nvidia0,n:195:255:/dev/nvidiactl,r:195:0,r:195:255";
    assert!(devs.contains(&json!({"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229})));
    assert!(devs.contains(
        &json!({"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0,
                                  "fileMode": 438, "uid": 0, "gid": 0})
    ));
    let rules = c["linux"]["resources"]["devices"].as_array().unwrap();
    assert_eq!(rules[0], json!({"allow": false, "access": "rwm"}));
    assert_eq!(
        rules[2],
        json!({"allow": true, "type": "c", "major": 195, "minor": 255, "access": "rw"})
    );
    assert_eq!(
        c["hooks"]["createRuntime"][0]["args"],
        json!([
            "/usr/bin/gpuhook",
            "oci-hook",
            "create-runtime",
            "42.7",
            listed
        ])
    );
    assert_eq!(
        c["hooks"]["poststop"][0]["env"],
        json!(["GPUHOOK_CONFIG=/etc/x.json"])
    );
    assert_eq!(c["hooks"]["poststop"][0]["args"][4], json!(listed));
    for k in ["process", "root", "annotations", "ociVersion"] {
        assert_eq!(c[k], before[k]);
    }
    assert_eq!(c["linux"]["namespaces"], before["linux"]["namespaces"]);
    let mut bad = json!({"linux": []});
    assert!(edit(&mut bad, &[], None, &hook, None).is_err());
    // A user-namespaced container: bind mounts of gpuhook's nodes instead of devices.
    let mut c: Value = serde_json::from_slice(&cfg(json!({}), &[])).unwrap();
    c["linux"]["namespaces"] = json!([{"type": "user"}, {"type": "mount"}]);
    c["mounts"] = json!([{"destination": "/proc", "type": "proc", "source": "proc"},
                         {"destination": "/dev/nvidia0", "type": "bind", "source": "/x"}]);
    assert!(has_user_namespace(&c));
    let srcs = vec!["/run/gpuhook/nodes/c1/0-nvidia0".to_string()];
    let e = edit(&mut c, &[n("/dev/nvidia0", 0)], Some(&srcs), &hook, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("already mounts something at /dev/nvidia0"),
        "{e}"
    );
    c["mounts"] = json!([{"destination": "/proc", "type": "proc", "source": "proc"}]);
    edit(&mut c, &[n("/dev/nvidia0", 0)], Some(&srcs), &hook, None).unwrap();
    assert_eq!(
        c["mounts"],
        json!([{"destination": "/proc", "type": "proc", "source": "proc"},
               {"destination": "/dev/nvidia0", "type": "bind", "source": srcs[0],
                "options": ["bind", "nosuid", "noexec"]}])
    );
    assert_eq!(c["linux"]["devices"], json!([]));
    assert_eq!(c["linux"]["resources"]["devices"][1]["minor"], json!(0));
}

/// A bundle edited before (`runc run` of the same directory again) is cleaned of every
/// earlier addition before the new ones: no access to the GPU of the last run.
#[test]
fn a_second_edit_replaces_the_first() {
    let mut c: Value = serde_json::from_slice(&cfg(json!({"gpuhook.io/gpus": "1"}), &[])).unwrap();
    c["linux"]["resources"]["devices"]
        .as_array_mut()
        .unwrap()
        .push(json!({"allow": true, "type": "c", "major": 10, "minor": 200, "access": "rw"}));
    // The user's own rule and device for the control node: theirs, kept through strips.
    c["linux"]["resources"]["devices"]
        .as_array_mut()
        .unwrap()
        .push(json!({"allow": true, "type": "c", "major": 195, "minor": 255, "access": "rw"}));
    c["linux"]["devices"] =
        json!([{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}]);
    let before = c.clone();
    let hook = |t: &str| HookCmd {
        path: "/usr/bin/gpuhook".into(),
        env: vec![],
        token: t.into(),
    };
    edit(
        &mut c,
        &[n("/dev/nvidia0", 0), n("/dev/nvidiactl", 255)],
        None,
        &hook("1.1"),
        None,
    )
    .unwrap();
    // The control node's device and rule were the user's already: not listed as ours.
    assert_eq!(
        c["hooks"]["poststop"][0]["args"][4],
        json!("n:195:0:/dev/nvidia0,r:195:0")
    );
    edit(
        &mut c,
        &[n("/dev/nvidia1", 1), n("/dev/nvidiactl", 255)],
        None,
        &hook("2.2"),
        None,
    )
    .unwrap();
    let text = c.to_string();
    assert!(!text.contains("\"minor\":0,"), "GPU 0 left: {text}");
    assert_eq!(c["hooks"]["createRuntime"].as_array().unwrap().len(), 1);
    assert_eq!(c["hooks"]["poststop"][0]["args"][3], json!("2.2"));
    assert_eq!(c["linux"]["devices"].as_array().unwrap().len(), 2);
    assert_eq!(
        c["linux"]["resources"]["devices"].as_array().unwrap().len(),
        4
    );
    // Stripped, the config is what it was (a bundle whose request was taken away).
    assert!(strip(&mut c));
    assert_eq!(c["hooks"], json!({"createRuntime": [], "poststop": []}));
    c.as_object_mut().unwrap().remove("hooks");
    assert_eq!(c, before, "the user's own device and rules are kept");
    assert!(!strip(&mut c));
}

#[test]
fn sandboxes_host_pid_namespaces_and_env_policy() {
    let mut c: Value = serde_json::from_slice(&cfg(json!({"gpuhook.io/gpus": "1"}), &[])).unwrap();
    let p = Policy::default();
    let bytes = |c: &Value| serde_json::to_vec(c).unwrap();
    // A pod's sandbox gets no GPU, whatever the pod's annotations say.
    let mut sb = c.clone();
    sb["annotations"]["io.kubernetes.cri.container-type"] = json!("sandbox");
    assert!(parse(&bytes(&sb), p).unwrap().request.is_none());
    sb["annotations"]["io.kubernetes.cri.container-type"] = json!("container");
    assert!(parse(&bytes(&sb), p).unwrap().request.is_some());
    // The host's PID namespace, or a joined one: refused.
    c["linux"]["namespaces"] = json!([{"type": "mount"}]);
    assert!(parse(&bytes(&c), p)
        .unwrap_err()
        .to_string()
        .contains("PID namespace of its own"));
    c["linux"]["namespaces"] = json!([{"type": "pid", "path": "/proc/1/ns/pid"}]);
    assert!(parse(&bytes(&c), p).is_err());
    // A pod's app container: the pod's shared PID namespace (shareProcessNamespace) or
    // the host's (hostPID), said so, in containerd's and CRI-O's words.
    for key in [
        "io.kubernetes.cri.container-type",
        "io.kubernetes.cri-o.ContainerType",
    ] {
        let mut app = c.clone();
        app["annotations"][key] = json!("container");
        assert_eq!(
            parse(&bytes(&app), p).unwrap_err().to_string(),
            "the pod shares one PID namespace among its containers (shareProcessNamespace: true): its containers have no PID namespace of their own, which a GPU container needs (gpuhook frees its GPUs when its init exits)"
        );
        app["linux"]["namespaces"] = json!([{"type": "mount"}]);
        assert!(parse(&bytes(&app), p)
            .unwrap_err()
            .to_string()
            .starts_with("the pod runs in the host's PID namespace (hostPID: true): "));
    }
    // Env requests off: the env is not a request; gpuhook's own variables never are.
    let env = cfg(json!({}), &["GPUHOOK_GPUS=1"]);
    let off = Policy {
        env_requests: false,
    };
    assert!(parse(&env, off).unwrap().request.is_none());
    assert!(parse(&env, p).unwrap().request.is_some());
    let own = cfg(json!({}), &["GPUHOOK_CONFIG=/x", "GPUHOOK_VERBOSE=1"]);
    assert!(parse(&own, p).unwrap().request.is_none());
}

#[test]
fn container_ids() {
    for ok in ["abc", "0123456789abcdef", "my_ctr-1.2+x"] {
        assert!(valid_id(ok), "{ok}");
    }
    for bad in ["", ".", "..", "a/b", "a b", "x\n", &"a".repeat(1025)] {
        assert!(!valid_id(bad), "{bad:?}");
    }
}

/// kubelet's device plugin's annotation: the allocation and the container's pod (containerd's
/// and CRI-O's annotations); only an annotation (an image's env cannot name one); the keys
/// that choose units contradict it; a sandbox never takes one.
#[test]
fn an_allocation_annotation_names_the_pods_units() {
    const A: &str = "0123456789abcdef0123456789abcdef";
    let p = Policy::default();
    let bytes = |c: &Value| serde_json::to_vec(c).unwrap();
    let mut c: Value = serde_json::from_slice(&cfg(
        json!({
            "gpuhook.io/allocation": A,
            "gpuhook.io/capabilities": "compute,utility,video",
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.sandbox-id": "sb1",
            "io.kubernetes.cri.sandbox-namespace": "ml",
            "io.kubernetes.cri.sandbox-name": "trainer",
            "io.kubernetes.cri.sandbox-uid": "u-1",
            "io.kubernetes.cri.container-name": "main",
        }),
        &[],
    ))
    .unwrap();
    let b = parse(&bytes(&c), p).unwrap();
    let (alloc, pod) = b.allocation.unwrap();
    assert_eq!(alloc, A);
    let pod = pod.unwrap();
    assert_eq!(
        (
            pod.sandbox.as_str(),
            pod.namespace.as_deref(),
            pod.name.as_deref(),
            pod.uid.as_deref(),
            pod.container.as_deref()
        ),
        (
            "sb1",
            Some("ml"),
            Some("trainer"),
            Some("u-1"),
            Some("main")
        )
    );
    assert!(b.request.unwrap().capabilities.video);
    // CRI-O's words.
    let crio = cfg(
        json!({
            "gpuhook.io/allocation": A,
            "io.kubernetes.cri-o.SandboxID": "sb9",
            "io.kubernetes.pod.namespace": "ns",
            "io.kubernetes.pod.name": "p",
        }),
        &[],
    );
    let pod = parse(&crio, p).unwrap().allocation.unwrap().1.unwrap();
    assert_eq!(
        (pod.sandbox.as_str(), pod.who()),
        ("sb9", "'ns/p'".to_string())
    );
    // No CRI sandbox: the allocation is read, the pod is not (the create refuses it).
    let bare = cfg(json!({"gpuhook.io/allocation": A}), &[]);
    assert_eq!(
        parse(&bare, p).unwrap().allocation,
        Some((A.to_string(), None))
    );
    // With a key that chooses units: refused.
    c["annotations"]["gpuhook.io/gpus"] = json!("2");
    assert_eq!(
        parse(&bytes(&c), p).unwrap_err().to_string(),
        "annotation 'gpuhook.io/allocation' (kubelet's device plugin's allocation) cannot be combined with annotation 'gpuhook.io/gpus': the allocation's units are the container's"
    );
    // As an environment variable: no such key.
    let env = cfg(json!({}), &[&format!("GPUHOOK_ALLOCATION={A}")]);
    assert!(parse(&env, p)
        .unwrap_err()
        .to_string()
        .starts_with("unknown key: environment variable GPUHOOK_ALLOCATION"));
    // The pod's sandbox: nothing.
    let mut sb: Value = serde_json::from_slice(&bare).unwrap();
    sb["annotations"]["io.kubernetes.cri.container-type"] = json!("sandbox");
    let b = parse(&bytes(&sb), p).unwrap();
    assert!(b.allocation.is_none() && b.request.is_none());
}
