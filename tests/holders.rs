//! Holders as an operator meets them on a fake host: one name, one holder (`release` of a
//! name that an LXC domain, a VM and an OCI container share is refused naming each, and
//! `--domain`, `--vm`, `--container` say which; a name nobody answers to fails); a holder
//! that still runs is not released (its device access would outlive its reservation); and a
//! state file that cannot be read fails every reader closed (`list`, `metrics`, `placement`,
//! `check`, `release`, `attach`): one line naming the file, nothing printed, no output file
//! replaced.
//!
//! The LXC domains come through the hook as libvirt runs it; the OCI containers and VMs
//! are written into the state file as their doors record them (a container's `create` and
//! its `createRuntime` hook; a VM's QEMU hook), their inits real processes of this test.

mod common;
use common::*;
use serde_json::{json, Value};
use std::process::{Child, Command, Output};
use testbed::FakeHost;

/// A container init (or QEMU process) that lives until dropped.
struct Init(Child);

impl Init {
    fn start() -> Init {
        Init(Command::new("sleep").arg("600").spawn().expect("sleep"))
    }
    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
    /// As the state records a process: its PID and start time.
    fn record(&self) -> Value {
        let p = gpuhook::host::procfs::ProcRef::of(self.pid()).expect("its /proc entry");
        json!({"pid": p.pid, "start_time": p.start_time})
    }
}

impl Drop for Init {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process that is gone (a `create` whose runtime exited): its record.
fn gone() -> Value {
    let mut c = Command::new("true").spawn().expect("true");
    let pid = c.id() as i32;
    let p = gpuhook::host::procfs::ProcRef::of(pid);
    c.wait().unwrap();
    match p {
        Some(p) => json!({"pid": p.pid, "start_time": p.start_time}),
        None => json!({"pid": pid, "start_time": 1}),
    }
}

/// Files a reservation into the state as its door records it: `kind` `oci` (under its ID)
/// or `vm` (under `vm:UUID`), running with `init`, or prepared by `by`.
fn record(h: &Host, kind: &str, name: &str, uuid: &str, gpu: &str, run: Option<Value>, by: Value) {
    let mut st: Value = match std::fs::read(&h.state) {
        Ok(b) => serde_json::from_slice(&b).unwrap(),
        Err(_) => json!({"version": 1, "reservations": {}}),
    };
    let key = match kind {
        "vm" => format!("vm:{uuid}"),
        _ => uuid.to_string(),
    };
    let mut r = json!({
        "kind": kind, "domain": name, "uuid": uuid, "gpus": [gpu],
        "phase": if run.is_some() { "running" } else { "prepared" },
        "request": "1 GPU", "created": "2026-12-01T00:00:00Z", "updated": "2026-12-01T00:00:00Z",
        "prepared_by": by,
    });
    if let Some(init) = run {
        r["init"] = init;
    }
    st["reservations"][key] = r;
    std::fs::create_dir_all(h.state.parent().unwrap()).unwrap();
    std::fs::write(&h.state, serde_json::to_vec(&st).unwrap()).unwrap();
}

fn release(h: &Host, args: &[&str]) -> Output {
    h.cmd().arg("release").args(args).output().unwrap()
}

/// Exit 1, one line on stderr, `line` exactly; nothing on stdout.
fn refused(o: &Output, line: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert_eq!(e.trim_end().lines().count(), 1, "not one line: {e:?}");
    assert_eq!(e.trim_end(), line);
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Who holds each GPU, as `list --json` says: (kind, domain) per PCI address.
fn held(h: &Host) -> Vec<(String, String, String)> {
    let l = h.list();
    l["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| !g["holder"].is_null())
        .map(|g| {
            (
                g["pci"].as_str().unwrap().to_string(),
                g["holder"]["kind"].as_str().unwrap().to_string(),
                g["holder"]["domain"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn pcis(h: &Host) -> Vec<String> {
    h.list()["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["pci"].as_str().unwrap().to_string())
        .collect()
}

/// `gpuhook release cx` where an LXC domain `cx` and an OCI container `cx` both hold GPUs:
/// refused in one line naming both, nothing freed; `--container` frees the container's
/// alone (named once), `--domain` the domain's; a name nobody answers to fails.
#[test]
fn release_of_a_shared_name_names_each_and_frees_nothing() {
    let h = Host::new(FakeHost::dgx8());
    let p = pcis(&h);
    let xml = domain("cx", 1, &gpus(""));
    assert_ok(&h.hook("cx", "prepare", &xml));
    // A container `cx` whose create is gone (stale: releasable).
    record(&h, "oci", "cx", "cx", &p[1], None, gone());
    let before = std::fs::read(&h.state).unwrap();
    let u = uuid(1);
    refused(
        &release(&h, &["cx"]),
        &format!("gpuhook: 'cx' names both libvirt domain 'cx' ({u}) and OCI container 'cx': say which with --domain or --container"),
    );
    assert_eq!(std::fs::read(&h.state).unwrap(), before, "nothing freed");
    let o = release(&h, &["cx", "--container"]);
    assert_ok(&o);
    assert_eq!(stdout(&o), format!("released {} of container 'cx'\n", p[1]));
    assert_eq!(held(&h), [(p[0].clone(), "libvirt".into(), "cx".into())]);
    // The container gone, the name is the domain's alone.
    let o = release(&h, &["cx"]);
    assert_ok(&o);
    assert_eq!(
        stdout(&o),
        format!("released {} of domain 'cx' ({u})\n", p[0])
    );
    assert!(held(&h).is_empty());
    // Nobody answers: non-zero, one line, whatever was said of the kind.
    refused(
        &release(&h, &["cx"]),
        "gpuhook: no domain, container or vm named 'cx' holds GPUs: nothing to release",
    );
    refused(
        &release(&h, &["nosuch", "--vm"]),
        "gpuhook: no vm named 'nosuch' holds GPUs: nothing to release",
    );
    let e = release(&h, &["cx", "--domain", "--container"]);
    assert_eq!(e.status.code(), Some(2));
    assert!(stderr(&e).contains("cannot be used with"), "{}", stderr(&e));
}

/// An LXC domain, a VM and an OCI container named alike, and a VM defined with the LXC
/// domain's UUID: each a holder of its own (none reaches another's reservation); a name or
/// UUID that several answer to is refused naming each with its kind; each option frees its
/// own only.
#[test]
fn three_kinds_one_name() {
    let h = Host::new(FakeHost::dgx8());
    let p = pcis(&h);
    let (u1, u2) = (uuid(1), uuid(2));
    assert_ok(&h.hook("x", "prepare", &domain("x", 1, &gpus(""))));
    // A VM `x`, and a VM `y` with the domain's UUID, both stopped without a release (their
    // QEMU gone); a container `x` whose create is gone.
    record(&h, "vm", "x", &u2, &p[1], Some(gone()), gone());
    record(&h, "vm", "y", &u1, &p[2], Some(gone()), gone());
    record(&h, "oci", "x", "x", &p[3], None, gone());
    let kinds: Vec<String> = held(&h)
        .into_iter()
        .map(|(_, k, d)| format!("{k} {d}"))
        .collect();
    assert_eq!(kinds, ["libvirt x", "vm x", "vm y", "oci x"]);
    let before = std::fs::read(&h.state).unwrap();
    refused(
        &release(&h, &["x"]),
        &format!("gpuhook: 'x' names libvirt domain 'x' ({u1}), OCI container 'x' and vm 'x' ({u2}): say which with --domain, --container or --vm"),
    );
    refused(
        &release(&h, &[&u1.to_uppercase()]),
        &format!("gpuhook: '{}' names both libvirt domain 'x' ({u1}) and vm 'y' ({u1}): say which with --domain or --vm", u1.to_uppercase()),
    );
    assert_eq!(std::fs::read(&h.state).unwrap(), before, "nothing freed");
    let o = release(&h, &[&u1, "--vm"]);
    assert_ok(&o);
    assert_eq!(stdout(&o), format!("released {} of vm 'y' ({u1})\n", p[2]));
    let o = release(&h, &["x", "--vm"]);
    assert_ok(&o);
    assert_eq!(stdout(&o), format!("released {} of vm 'x' ({u2})\n", p[1]));
    let kinds: Vec<String> = held(&h)
        .into_iter()
        .map(|(_, k, d)| format!("{k} {d}"))
        .collect();
    assert_eq!(kinds, ["libvirt x", "oci x"]);
    // `list --json` names a VM's holder with its kind.
    record(&h, "vm", "v", &uuid(3), &p[4], None, gone());
    let l = h.list();
    assert_eq!(
        common::gpu_of(&l, &p[4])["holder"],
        json!({"kind": "vm", "domain": "v", "uuid": uuid(3), "phase": "prepared", "stale": true})
    );
    let t = stdout(&h.cmd().arg("list").output().unwrap());
    assert!(t.contains("stale: vm v ("), "{t}");
}

/// A holder whose container still runs is not released: its device access is gpuhook's
/// grant, and a GPU is never free while someone can use it. Refused in one line saying how
/// to stop it or take its GPUs back; nothing freed. Once its init is gone it is released.
#[test]
fn a_running_holder_is_not_released() {
    let h = Host::new(FakeHost::dgx8());
    let p = pcis(&h);
    let (ctr, dom) = (Init::start(), Init::start());
    record(&h, "oci", "live", "live", &p[0], Some(ctr.record()), gone());
    // A running LXC domain, as `started` records it.
    let mut st: Value = serde_json::from_slice(&std::fs::read(&h.state).unwrap()).unwrap();
    st["reservations"][uuid(5)] = json!({
        "domain": "web", "uuid": uuid(5), "gpus": [p[1]], "phase": "running",
        "request": "1 GPU", "created": "x", "updated": "x", "controller": 1, "init": dom.record(),
    });
    std::fs::write(&h.state, serde_json::to_vec(&st).unwrap()).unwrap();
    let before = std::fs::read(&h.state).unwrap();
    refused(
        &release(&h, &["live"]),
        &format!("gpuhook: container 'live' still runs (init {}) with GPUs {}: release frees only what no running container holds; stop it, or take its GPUs back with 'gpuhook detach live --container --all'", ctr.pid(), p[0]),
    );
    refused(
        &release(&h, &[&uuid(5)]),
        &format!("gpuhook: domain 'web' still runs (init {}) with GPUs {}: release frees only what no running container holds; stop it, or take its GPUs back with 'gpuhook detach web --domain --all'", dom.pid(), p[1]),
    );
    assert_eq!(std::fs::read(&h.state).unwrap(), before, "nothing freed");
    // No one else gets its GPU meanwhile.
    assert_fails(
        &h.hook(
            "other",
            "prepare",
            &domain(
                "other",
                6,
                &format!(
                    r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"><gpu:device pci="{}"/></gpu:gpus>"#,
                    p[0]
                ),
            ),
        ),
        "other",
        "held by container 'live'",
    );
    drop(ctr);
    drop(dom);
    let o = release(&h, &["live"]);
    assert_ok(&o);
    assert_eq!(
        stdout(&o),
        format!("released {} of container 'live'\n", p[0])
    );
    assert_ok(&release(&h, &["web"]));
    assert!(held(&h).is_empty());
}

/// A state file that cannot be read: every reader fails closed, in one line naming the
/// file, exit 1, nothing on stdout; `--output` files keep what they had; `release` and
/// `attach` change nothing.
#[test]
fn a_corrupt_state_fails_every_reader_closed() {
    let h = Host::new(FakeHost::dgx8());
    assert_ok(&h.hook("web", "prepare", &domain("web", 1, &gpus(""))));
    let good_metrics = stdout(&h.cmd().arg("metrics").output().unwrap());
    let good_placement = stdout(
        &h.cmd()
            .arg("placement")
            .env("COMPUTE_NODE", "n1")
            .output()
            .unwrap(),
    );
    assert!(good_placement.contains("CUSTOM_GPU_"), "{good_placement}");
    let (prom, yaml) = (h.root().join("gpuhook.prom"), h.root().join("gpuhook.yaml"));
    std::fs::write(&prom, &good_metrics).unwrap();
    std::fs::write(&yaml, &good_placement).unwrap();
    let xml = h.root().join("d.xml");
    std::fs::write(&xml, domain("d", 2, &gpus(""))).unwrap();
    let state = h.state.display().to_string();
    for (what, text) in [
        ("not JSON", "{\"version\":1,\"reservations\":{\n"),
        ("another version", "{\"version\":2,\"reservations\":{}}"),
        (
            "a holder under another's key",
            &format!("{{\"version\":1,\"reservations\":{{\"{}\":{{\"kind\":\"vm\",\"domain\":\"v\",\"uuid\":\"{}\",\"gpus\":[],\"phase\":\"running\",\"request\":\"1\",\"created\":\"x\",\"updated\":\"x\"}}}}}}", uuid(1), uuid(1)),
        ),
    ] {
        std::fs::write(&h.state, text).unwrap();
        for args in [
            &["list"][..],
            &["list", "--json"],
            &["metrics"],
            &["metrics", "--output", prom.to_str().unwrap()],
            &["placement"],
            &["placement", "--output", yaml.to_str().unwrap()],
            &["check", xml.to_str().unwrap()],
            &["release", "web"],
            &["attach", "web"],
            &["detach", "web", "--all"],
        ] {
            let o = h.cmd().args(args).env("COMPUTE_NODE", "n1").output().unwrap();
            let e = stderr(&o);
            assert_eq!(o.status.code(), Some(1), "{what}: {args:?}: {e}");
            assert_eq!(e.trim_end().lines().count(), 1, "{what}: {args:?}: {e:?}");
            assert!(
                e.starts_with(&format!("gpuhook: state file {state} ")),
                "{what}: {args:?}: {e}"
            );
            assert!(o.stdout.is_empty(), "{what}: {args:?}: {}", stdout(&o));
            assert_eq!(std::fs::read(&h.state).unwrap(), text.as_bytes(), "{what}: {args:?}");
        }
        assert_eq!(std::fs::read_to_string(&prom).unwrap(), good_metrics, "{what}");
        assert_eq!(std::fs::read_to_string(&yaml).unwrap(), good_placement, "{what}");
    }
    // A GPU start fails on it, naming the file; a domain without GPUs is left alone.
    assert_fails(
        &h.hook("d", "prepare", &domain("d", 2, &gpus(""))),
        "d",
        &state,
    );
    let plain = "<domain type='lxc'><name>p</name><uuid>11111111-2222-4333-8444-555555555555</uuid></domain>";
    let o = h.hook("p", "prepare", plain);
    assert_ok(&o);
    assert!(o.stderr.is_empty(), "{}", stderr(&o));
}
