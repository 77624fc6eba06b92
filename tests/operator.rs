//! An operator's day on fake hosts (issue 42): the built binary driven as an operator drives
//! it, with the faults an operator makes.
//!
//! - A reset program that is missing, not root's, writable by others or not executable is a
//!   configuration fault: refused in one line before anything is marked (no quarantine made
//!   or counted, however often it is tried), the GPU keeps its state.
//! - Each door refuses a request in the words its user typed: the domain XML's attributes and
//!   children, the OCI annotations and environment variables (a bundle through
//!   `gpuhook-runtime create`, the real runtime a script that records whether it ran), the
//!   command line's options.
//! - Typos are said: an unknown architecture (with the known ones), metadata in a namespace
//!   that only looks like gpuhook's (a warning; the domain starts untouched), `check` of an
//!   OCI bundle's `config.json` (checked as a bundle) or of other JSON (said what it is not).
//! - The rough edges: `check` on a terminal (a pty), `detach` without `--device` or `--all`,
//!   `health reset` and `clear` by index and UUID with progress on stderr, `health scan`
//!   without a kernel log, `poststop` with an unreadable config, `--json` of `check`,
//!   `health` and `release`, `gpuhook completions SHELL`, `gpuhook show NAME` for each kind.

mod common;
use common::*;
use serde_json::{json, Value};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::PathBuf;
use std::process::{Child, Command, Output};
use testbed::FakeHost;

const A: &str = "0000:18:00.0";
const B: &str = "0000:1a:00.0";

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Exit `code`, exactly one line on stderr, which is `line`; nothing on stdout.
fn refused_with(o: &Output, code: i32, line: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(code), "{e}");
    assert_eq!(e.trim_end().lines().count(), 1, "not one line: {e:?}");
    assert_eq!(e.trim_end(), line);
    assert!(o.stdout.is_empty(), "{}", out(o));
}

/// What a refusal must leave as it was: the state file's bytes and `list --json`.
fn snapshot(h: &Host) -> (Option<Vec<u8>>, Value) {
    (std::fs::read(&h.state).ok(), h.list())
}

fn health(h: &Host, args: &[&str]) -> Output {
    h.cmd().arg("health").args(args).output().unwrap()
}

fn kmsg(h: &Host) -> PathBuf {
    h.root().join("host/dev/kmsg")
}

/// A container init (or QEMU process) that lives until dropped.
struct Init(Child);

impl Init {
    fn start() -> Init {
        Init(Command::new("sleep").arg("600").spawn().expect("sleep"))
    }
    fn record(&self) -> Value {
        let p = gpuhook::host::procfs::ProcRef::of(self.0.id() as i32).expect("its /proc entry");
        json!({"pid": p.pid, "start_time": p.start_time})
    }
}

impl Drop for Init {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Files a reservation as its door records it (the state file written as the door writes
/// it): `kind` `oci` under its ID, `vm` under `vm:UUID`.
fn record(h: &Host, kind: &str, name: &str, uuid: &str, gpu: &str, init: Value) {
    let mut st: Value = match std::fs::read(&h.state) {
        Ok(b) => serde_json::from_slice(&b).unwrap(),
        Err(_) => json!({"version": 1, "reservations": {}}),
    };
    let key = match kind {
        "vm" => format!("vm:{uuid}"),
        _ => uuid.to_string(),
    };
    st["reservations"][key] = json!({
        "kind": kind, "domain": name, "uuid": uuid, "gpus": [gpu], "phase": "running",
        "request": "1 GPU", "created": "2026-12-01T00:00:00Z", "updated": "2026-12-01T00:00:05Z",
        "prepared_by": init, "init": init,
    });
    std::fs::create_dir_all(h.state.parent().unwrap()).unwrap();
    std::fs::write(&h.state, serde_json::to_vec(&st).unwrap()).unwrap();
}

// Item 2: a configuration fault is not a GPU fault.

/// A reset program that cannot run (missing, owned by another account, writable by others,
/// not executable, under a directory others may write): each `health reset` is refused in
/// one line saying so, before anything is marked; tried three times over, no quarantine is
/// made or counted (never `needs inspection`), a quarantined GPU keeps its quarantine as it
/// was, and the state file is byte for byte what it was. Once the program is right, the
/// same command resets.
#[test]
fn a_reset_program_that_cannot_run_is_a_configuration_fault() {
    let h = Host::new(FakeHost::dgx8());
    let bin_dir = h.root().join("sbin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::fs::set_permissions(&bin_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let prog = bin_dir.join("gpu-reset");
    h.edit_config(|c| {
        c["reset_command"] = json!([prog, "--root", h.paths.root, "--gpu-reset", "-i", "{pci}"])
    });
    // B quarantined by an Xid the driver logged.
    std::fs::write(
        kmsg(&h),
        testbed::health::xid_record(1, B, 79, testbed::health::xid_text(79)),
    )
    .unwrap();
    testbed::health::config_all_ones(&h.paths, B);
    assert_ok(&health(&h, &["scan"]));
    let quarantined = |h: &Host| gpu_of(&h.list(), B)["quarantine"].clone();
    let q = quarantined(&h);
    assert_eq!(
        (q["xid"].clone(), q["count_24h"].clone()),
        (json!(79), json!(1))
    );
    let tail = "a configuration fault, so nothing was marked and the GPU keeps its state: install the program as root's, or name another in reset_command (\"pci\" is the kernel's function-level reset)";
    let refused = |h: &Host, gpu: &str, pci: &str, why: &str| {
        let before = snapshot(h);
        for _ in 0..3 {
            refused_with(
                &health(h, &["reset", gpu]),
                1,
                &format!("gpuhook: GPU {pci} not reset: the config's reset_command cannot run: {why}; {tail}"),
            );
            assert_eq!(snapshot(h), before, "{why}: the state changed");
        }
    };
    let p = prog.display();
    // Missing (the health guide's own test of a reset command).
    refused(
        &h,
        A,
        A,
        &format!("no {p}: No such file or directory (os error 2)"),
    );
    refused(
        &h,
        B,
        B,
        &format!("no {p}: No such file or directory (os error 2)"),
    );
    // A GPU a domain holds is refused as held, not for the program (it would not run
    // either way): the holder is what the operator must act on.
    let pinned =
        r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1" count="1"><gpu:device index="2"/></gpu:gpus>"#;
    assert_ok(&h.hook("web9", "prepare", &domain("web9", 9, pinned)));
    let c = h.list()["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .find(|g| g["index"] == 2)
        .and_then(|g| g["pci"].as_str())
        .expect("GPU 2's address")
        .to_string();
    let before = snapshot(&h);
    refused_with(
        &health(&h, &["reset", "2"]),
        1,
        &format!(
            "gpuhook: GPU {c} is held by domain 'web9': it is reset only when nothing holds it"
        ),
    );
    assert_eq!(snapshot(&h), before, "held: the state changed");
    // The stand-in, as another account's file; as others may write it; not executable.
    std::fs::copy(testbed::health::reset_standin(), &prog).unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&prog, Some(1000), None).unwrap();
    refused(
        &h,
        "0",
        A,
        &format!("{p} is owned by uid 1000, not root: not run"),
    );
    std::os::unix::fs::chown(&prog, Some(0), None).unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o757)).unwrap();
    refused(
        &h,
        A,
        A,
        &format!("{p} may be written by group or others (mode 757): not run"),
    );
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o644)).unwrap();
    refused(&h, A, A, &format!("{p} may not be executed (mode 644)"));
    // A directory on its way that its group may write.
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&bin_dir, std::fs::Permissions::from_mode(0o775)).unwrap();
    refused(
        &h,
        B,
        B,
        &format!(
            "{p}: a directory on the way to it ({}) may be written by group or others (mode 775): not run",
            bin_dir.display()
        ),
    );
    assert!(
        testbed::health::standin_calls(&h.paths).is_empty(),
        "it ran"
    );
    let q2 = quarantined(&h);
    assert_eq!(q2, q, "the quarantine changed");
    assert_eq!(q2["needs_inspection"], false);
    // Right now: the reset runs (the GPU answers again), the quarantine of a reboot stays.
    std::fs::set_permissions(&bin_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = health(&h, &["reset", A]);
    assert_ok(&o);
    assert_eq!(testbed::health::standin_calls(&h.paths).len(), 1);
}

/// `auto_reset` with a reset program that is missing: each scan warns and counts no
/// quarantine (a failed reset used to count one each scan: `needs inspection` after three).
#[test]
fn the_scan_counts_no_quarantine_for_a_missing_reset_program() {
    let h = Host::with(FakeHost::dgx8(), |c| {
        c["auto_reset"] = json!(true);
        c["reset_command"] = json!(["/nonexistent/gpu-reset", "{pci}"]);
    });
    std::fs::write(
        kmsg(&h),
        testbed::health::xid_record(1, B, 95, testbed::health::xid_text(95)),
    )
    .unwrap();
    for _ in 1..=4 {
        let o = health(&h, &["scan"]);
        assert_ok(&o);
        let e = stderr(&o);
        assert!(
            e.contains(&format!("gpuhook: warning: GPU {B} not reset: the config's reset_command cannot run: no /nonexistent/gpu-reset: No such file or directory")),
            "{e}"
        );
        let l = h.list();
        let q = &gpu_of(&l, B)["quarantine"];
        assert_eq!(q["count_24h"], json!(1), "{q}");
        assert_eq!(q["needs_inspection"], json!(false), "{q}");
    }
}

// Item 4: each door in its own words.

/// The same conflicts through each door: the domain XML keeps its words; `gpuhook attach`
/// names its options; an OCI bundle names its annotations or variables (the runtime never
/// runs); `check` of that bundle says the same.
#[test]
fn each_door_refuses_in_its_own_words() {
    let h = Host::new(FakeHost::dgx8());
    let devices = r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1" count="1"><gpu:device index="0"/><gpu:device index="1"/></gpu:gpus>"#;
    assert_fails(
        &h.hook("web1", "prepare", &domain("web1", 1, devices)),
        "web1",
        "count 1 is less than the 2 <device> children",
    );
    refused_with(
        &h.cmd()
            .args([
                "attach", "web1", "--count", "1", "--device", "0", "--device", "1",
            ])
            .output()
            .unwrap(),
        1,
        "gpuhook: --count asks for 1 GPU, fewer than the 2 named by --device",
    );
    refused_with(
        &h.cmd()
            .args([
                "attach",
                "web1",
                "--device",
                "0",
                "--device",
                "0000:18:00.0",
                "--device",
                "0",
            ])
            .output()
            .unwrap(),
        1,
        "gpuhook: --device: '0' is named twice",
    );
    let o = h
        .cmd()
        .args(["attach", "web1", "--mig", "--share"])
        .output()
        .unwrap();
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("'--mig' cannot be used with '--share'")
            || e.contains("'--share' cannot be used with '--mig'"),
        "{e}"
    );
    assert!(!e.contains("mig='") && !e.contains("share='"), "{e}");
    // The OCI door.
    let rt = Runtime::new(&h);
    for (annotations, env, said) in [
        (
            json!({"gpuhook.io/devices": "0,0"}),
            vec![],
            "annotation 'gpuhook.io/devices': '0' is named twice",
        ),
        (
            json!({"gpuhook.io/gpus": "1", "gpuhook.io/devices": "0,1"}),
            vec![],
            "annotation 'gpuhook.io/gpus' asks for 1 GPU, fewer than the 2 named by annotation 'gpuhook.io/devices'",
        ),
        (
            json!({}),
            vec!["GPUHOOK_GPUS=1", "GPUHOOK_DEVICES=0,1"],
            "environment variable GPUHOOK_GPUS asks for 1 GPU, fewer than the 2 named by environment variable GPUHOOK_DEVICES",
        ),
        (
            json!({"gpuhook.io/mig": "yes", "gpuhook.io/share": "yes"}),
            vec![],
            "MIG instances are never shared: annotation 'gpuhook.io/mig' and annotation 'gpuhook.io/share' cannot be asked for together",
        ),
        (
            json!({}),
            vec!["GPUHOOK_MIG=yes", "GPUHOOK_DEVICES=1"],
            "environment variable GPUHOOK_DEVICES names whole GPUs and environment variable GPUHOOK_MIG asks for MIG instances: a request is one or the other",
        ),
    ] {
        let before = snapshot(&h);
        let (o, config) = rt.create(&h, "ctr1", annotations.clone(), &env);
        refused_with(&o, 1, &format!("gpuhook: container 'ctr1': {said}"));
        assert!(!rt.called.exists(), "the runtime ran");
        assert_eq!(snapshot(&h), before, "{said}");
        let c = h.cmd().arg("check").arg(&config).output().unwrap();
        refused_with(&c, 1, &format!("gpuhook: {}: {said}", config.display()));
    }
}

/// `gpuhook-runtime` on a host whose real runtime is a script that only records it ran.
struct Runtime {
    link: PathBuf,
    called: PathBuf,
}

impl Runtime {
    fn new(h: &Host) -> Runtime {
        let link = h.root().join("gpuhook-runtime");
        symlink(bin(), &link).unwrap();
        let called = h.root().join("runtime-was-called");
        let fake = h.root().join("fake-runtime");
        std::fs::write(&fake, format!("#!/bin/sh\ntouch {}\n", called.display())).unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        h.edit_config(|c| c["oci_runtime"] = json!(fake));
        Runtime { link, called }
    }

    /// A bundle (runc's own `runc spec`) with these annotations and `process.env` entries.
    fn bundle(h: &Host, id: &str, annotations: Value, env: &[&str]) -> PathBuf {
        let b = h.root().join(format!("bundle-{id}"));
        std::fs::create_dir_all(b.join("rootfs")).unwrap();
        let _ = std::fs::remove_file(b.join("config.json"));
        assert_ok(
            &Command::new("/usr/sbin/runc")
                .args(["spec", "--bundle"])
                .arg(&b)
                .output()
                .unwrap(),
        );
        let p = b.join("config.json");
        let mut c: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        c["root"] = json!({"path": b.join("rootfs"), "readonly": false});
        c["process"]["terminal"] = json!(false);
        c["annotations"] = annotations;
        for e in env {
            c["process"]["env"].as_array_mut().unwrap().push(json!(e));
        }
        std::fs::write(&p, serde_json::to_vec_pretty(&c).unwrap()).unwrap();
        p
    }

    /// `gpuhook-runtime create` of such a bundle: its output, and its `config.json`.
    fn create(&self, h: &Host, id: &str, annotations: Value, env: &[&str]) -> (Output, PathBuf) {
        let p = Self::bundle(h, id, annotations, env);
        let o = Command::new(&self.link)
            .env("GPUHOOK_CONFIG", &h.config)
            .arg("--root")
            .arg(h.root().join("runc-root"))
            .args([
                "create",
                "--bundle",
                p.parent().unwrap().to_str().unwrap(),
                id,
            ])
            .output()
            .unwrap();
        (o, p)
    }
}

/// A GPU in MIG mode and a shared GPU, named whole (and one not shared named for a slot),
/// through each door: each refusal says what to ask for instead in the words its user typed:
/// the domain XML's attributes, the bundle's annotations or its variables (through
/// `gpuhook-runtime create` and `check`). Nothing is reserved.
#[test]
fn each_door_says_what_to_ask_for_in_its_own_words() {
    const SHARED: &str = "0000:42:00.0";
    let h = Host::with(FakeHost::dgx8_mig(), |c| {
        c["sharing"] = json!({ SHARED: {"replicas": 3} });
    });
    let mig = |hint: &str| {
        format!("GPU {A} (pci {A}) is in MIG mode with 7 instances: ask for them ({hint})")
    };
    let shared = |hint: &str| {
        format!("GPU {SHARED} (pci {SHARED}) is shared (3 slots): ask for a slot ({hint})")
    };
    let whole = |hint: &str| {
        format!("GPU 0000:9a:00.0 (pci 0000:9a:00.0) is not shared by the host config (\"sharing\"): ask for it whole ({hint})")
    };
    let short = |mig: &str, share: &str| {
        format!("cannot reserve 8 GPUs: only 4 of the host's 8 matching GPUs are free: 3 in MIG mode (handed out as instances: {mig}), 1 shared (handed out as slots: {share})")
    };
    // The domain XML (the LXC hook): its attributes, as ever.
    let xml = |inner: &str| format!(r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"{inner}</gpu:gpus>"#);
    for (n, inner, said) in [
        (1, format!(r#"><gpu:device pci="{A}"/>"#), mig("mig='yes'")),
        (
            2,
            format!(r#"><gpu:device pci="{SHARED}"/>"#),
            shared("share='yes'"),
        ),
        (
            3,
            r#" share="yes"><gpu:device pci="0000:9a:00.0"/>"#.to_string(),
            whole("no share='yes'"),
        ),
        (
            4,
            r#" count="8">"#.to_string(),
            short("mig='yes'", "share='yes'"),
        ),
    ] {
        let name = format!("web{n}");
        assert_fails(
            &h.hook(&name, "prepare", &domain(&name, n, &xml(&inner))),
            &name,
            &said,
        );
    }
    // An OCI bundle: its annotations, or its variables.
    let rt = Runtime::new(&h);
    for (annotations, env, said) in [
        (
            json!({"gpuhook.io/devices": A}),
            vec![],
            mig("annotation gpuhook.io/mig: \"yes\""),
        ),
        (
            json!({"gpuhook.io/devices": SHARED}),
            vec![],
            shared("annotation gpuhook.io/share: \"yes\""),
        ),
        (
            json!({"gpuhook.io/share": "yes", "gpuhook.io/devices": "0000:9a:00.0"}),
            vec![],
            whole("without annotation gpuhook.io/share: \"yes\""),
        ),
        (
            json!({"gpuhook.io/gpus": "8"}),
            vec![],
            short(
                "annotation gpuhook.io/mig: \"yes\"",
                "annotation gpuhook.io/share: \"yes\"",
            ),
        ),
        (
            json!({}),
            vec![format!("GPUHOOK_DEVICES={A}")],
            mig("GPUHOOK_MIG=yes"),
        ),
        (
            json!({}),
            vec![format!("GPUHOOK_DEVICES={SHARED}")],
            shared("GPUHOOK_SHARE=yes"),
        ),
        (
            json!({}),
            vec![
                "GPUHOOK_SHARE=yes".into(),
                "GPUHOOK_DEVICES=0000:9a:00.0".into(),
            ],
            whole("without GPUHOOK_SHARE=yes"),
        ),
        (
            json!({}),
            vec!["GPUHOOK_GPUS=8".into()],
            short("GPUHOOK_MIG=yes", "GPUHOOK_SHARE=yes"),
        ),
    ] {
        let env: Vec<&str> = env.iter().map(String::as_str).collect();
        let before = snapshot(&h);
        let (o, config) = rt.create(&h, "ctr1", annotations, &env);
        refused_with(&o, 1, &format!("gpuhook: container 'ctr1': {said}"));
        assert!(!rt.called.exists(), "the runtime ran");
        assert_eq!(snapshot(&h), before, "{said}");
        let c = h.cmd().arg("check").arg(&config).output().unwrap();
        assert_eq!(c.status.code(), Some(1), "{}", stderr(&c));
        assert!(out(&c).contains(&said), "{said}: {}", out(&c));
        assert!(!out(&c).contains("='yes'"), "{}", out(&c));
    }
}

// Item 5: typos are said.

/// `arch="fermy"` through each door is refused as an unknown architecture, naming the known
/// ones; a name the config's overrides give is known (then it is only not free); a
/// Placement class of no known architecture is said so. Nothing is reserved.
#[test]
fn an_unknown_architecture_is_said_with_the_known_ones() {
    let h = Host::with(FakeHost::blueprint(), |c| {
        c["overrides"] = json!({"0000:99:00.0": {"arch": "Tesla-X"}});
    });
    let known = "(known: ada, ampere, blackwell, cdna, cdna2, cdna3, fermi, gcn5, hopper, kepler, maxwell, pascal, tesla, tesla-x, turing, volta, xe-hpc, xe-hpg; others can be named in the config's \"overrides\")";
    let o = h.hook(
        "web1",
        "prepare",
        &domain("web1", 1, &gpus(r#"arch="fermy""#)),
    );
    refused_with(
        &o,
        1,
        &format!("gpuhook: domain 'web1': unknown architecture 'fermy' {known}"),
    );
    assert!(!h.state.exists() || h.holders().is_empty());
    let xml = h.root().join("web1.xml");
    std::fs::write(&xml, domain("web1", 1, &gpus(r#"arch="fermy""#))).unwrap();
    refused_with(
        &h.cmd().arg("check").arg(&xml).output().unwrap(),
        1,
        &format!(
            "gpuhook: {}: domain 'web1': unknown architecture 'fermy' {known}",
            xml.display()
        ),
    );
    let rt = Runtime::new(&h);
    let (o, _) = rt.create(&h, "ctr1", json!({}), &["GPUHOOK_ARCH=fermy"]);
    refused_with(
        &o,
        1,
        &format!("gpuhook: container 'ctr1': unknown architecture 'fermy' {known}"),
    );
    // The override's name is known: the request is only not met.
    let o = h.hook(
        "web2",
        "prepare",
        &domain("web2", 2, &gpus(r#"arch="TESLA-X""#)),
    );
    assert_fails(
        &o,
        "web2",
        "cannot reserve 1 GPU, arch == tesla-x: only 0 of the host's 0 matching GPUs are free",
    );
    // Placement's class.
    let nova = r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"><gpu:extra_spec name="resources:CUSTOM_GPU_FERMY">1</gpu:extra_spec></gpu:gpus>"#;
    refused_with(
        &h.hook("web3", "prepare", &domain("web3", 3, nova)),
        1,
        &format!("gpuhook: domain 'web3': resource class CUSTOM_GPU_FERMY names no known architecture {known}"),
    );
    assert!(!h.state.exists() || h.holders().is_empty());
}

/// Metadata in `urn:gpuhook:gpu:2` (or another `urn:gpuhook:` URI): `prepare` warns on
/// stderr naming the namespace and exits 0, the domain untouched (no state file made); the
/// other steps say nothing; `check` warns too. A domain with a request beside such an element
/// gets its request and the warning.
#[test]
fn a_lookalike_namespace_is_warned_about() {
    let h = Host::new(FakeHost::blueprint());
    let meta = r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:2" count="1"/>"#;
    let xml = domain("web1", 1, meta);
    let o = h.hook("web1", "prepare", &xml);
    assert_ok(&o);
    assert_eq!(
        stderr(&o).trim_end(),
        "gpuhook: warning: domain 'web1': <metadata> has an element in namespace 'urn:gpuhook:gpu:2', which gpuhook does not read (its namespace is urn:gpuhook:gpu:1): the domain asks for no GPUs and starts without any"
    );
    assert!(!h.state.exists(), "the state was touched");
    for op in ["start", "started", "stopped", "release"] {
        let o = h.hook("web1", op, &xml);
        assert_ok(&o);
        assert_eq!(stderr(&o), "", "{op}");
    }
    let f = h.root().join("web1.xml");
    std::fs::write(&f, &xml).unwrap();
    let o = h.cmd().arg("check").arg(&f).output().unwrap();
    assert_ok(&o);
    assert!(
        stderr(&o).contains("namespace 'urn:gpuhook:gpu:2'"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        out(&o),
        "domain 'web1' asks for no GPUs: gpuhook leaves it alone\n"
    );
    // Beside a request: both.
    let both = format!(
        r#"{meta}<x:gpus xmlns:x="urn:gpuhook:gpus" count="2"/>{}"#,
        gpus("")
    );
    let o = h.hook("web2", "prepare", &domain("web2", 2, &both));
    assert_ok(&o);
    assert!(
        stderr(&o).contains("namespace 'urn:gpuhook:gpu:2', 'urn:gpuhook:gpus', which gpuhook does not read (its namespace is urn:gpuhook:gpu:1): only its <gpus> element in that namespace is the request"),
        "{}",
        stderr(&o)
    );
    assert_eq!(h.holders().len(), 1);
}

/// `gpuhook check config.json`: an OCI bundle's config is checked as a bundle (its
/// annotations, else its env), with `--json`; other JSON is said not to be one.
#[test]
fn check_reads_a_bundle_as_a_bundle() {
    let h = Host::new(FakeHost::blueprint());
    let p = Runtime::bundle(
        &h,
        "ctr1",
        json!({"gpuhook.io/gpus": "1", "gpuhook.io/arch": "fermi"}),
        &[],
    );
    let o = h.cmd().arg("check").arg(&p).output().unwrap();
    assert_ok(&o);
    let text = out(&o);
    assert!(
        text.starts_with(&format!(
            "bundle {} asks for 1 GPU, arch == fermi (gpuhook.io/ annotations)\nit would get:\n  0 0000:07:00.0 Tesla M2050 fermi",
            p.display()
        )),
        "{text}"
    );
    let o = h.cmd().args(["check", "--json"]).arg(&p).output().unwrap();
    assert_ok(&o);
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (
            &j["kind"],
            &j["request"],
            &j["source"],
            &j["satisfiable"],
            &j["gpus"][0]["unit"]
        ),
        (
            &json!("bundle"),
            &json!("1 GPU, arch == fermi"),
            &json!("gpuhook.io/ annotations"),
            &json!(true),
            &json!("0000:07:00.0")
        )
    );
    let env = Runtime::bundle(&h, "ctr2", json!({}), &["GPUHOOK_GPUS=2"]);
    let o = h.cmd().arg("check").arg(&env).output().unwrap();
    assert_ok(&o);
    assert!(
        out(&o).contains("asks for 2 GPUs (GPUHOOK_ variables of process.env)"),
        "{}",
        out(&o)
    );
    let none = Runtime::bundle(&h, "ctr3", json!({}), &[]);
    let o = h.cmd().arg("check").arg(&none).output().unwrap();
    assert_ok(&o);
    assert_eq!(
        out(&o),
        format!(
            "bundle {} asks for no GPUs: gpuhook-runtime passes it to the real runtime untouched\n",
            none.display()
        )
    );
    // gpuhook's own config is JSON, and no bundle's.
    refused_with(
        &h.cmd().arg("check").arg(&h.config).output().unwrap(),
        1,
        &format!("gpuhook: {}: JSON without \"ociVersion\": not an OCI bundle's config.json (check takes a domain XML or a bundle's config.json; gpuhook's own config is checked by every command that loads it)", h.config.display()),
    );
    // A domain's check in JSON: what it would get.
    let xml = h.root().join("web1.xml");
    std::fs::write(&xml, domain("web1", 1, &gpus(r#"count="3""#))).unwrap();
    let o = h
        .cmd()
        .args(["check", "--json"])
        .arg(&xml)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["satisfiable"], false);
    assert!(
        j["refusal"]
            .as_str()
            .unwrap()
            .starts_with("cannot reserve 3 GPUs"),
        "{j}"
    );
}

// Item 7: the rough edges.

/// `gpuhook check` with no FILE on a terminal says what it reads and exits 2 at once (it
/// used to wait without a word); `check -` on a terminal says it reads the terminal.
#[test]
fn check_on_a_terminal_says_so() {
    let h = Host::new(FakeHost::blueprint());
    let t = std::time::Instant::now();
    let o = Command::new("timeout")
        .args(["10", "script", "-qec"])
        .arg(format!("{} check", bin().display()))
        .arg("/dev/null")
        .env("GPUHOOK_CONFIG", &h.config)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let said = out(&o);
    assert!(t.elapsed() < std::time::Duration::from_secs(8), "it waited");
    assert_eq!(o.status.code(), Some(2), "{said}");
    assert!(
        said.contains("gpuhook: check reads a domain XML or an OCI bundle's config.json from FILE, or from standard input, which is a terminal here: give a FILE (gpuhook check domain.xml), or pipe one in (virsh dumpxml NAME | gpuhook check -)"),
        "{said}"
    );
}

/// `detach NAME` with neither `--device` nor `--all` names both; `--device` with `--all`
/// is refused.
#[test]
fn detach_says_device_or_all() {
    let h = Host::new(FakeHost::blueprint());
    let o = h.cmd().args(["detach", "web1"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("<--device <SEL>|--all>"),
        "{}",
        stderr(&o)
    );
    let o = h
        .cmd()
        .args(["detach", "web1", "--all", "--device", "0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
}

/// `health reset` and `clear` take an index or a UUID as `attach` does; a reset says on
/// stderr what it runs and when it probes; `--json` of reset, clear and scan; `health scan`
/// without a kernel log names the file, what it is for and what to do.
#[test]
fn health_by_index_and_uuid_said_as_it_goes() {
    let h = Host::new(FakeHost::dgx8());
    h.edit_config(|c| c["reset_command"] = testbed::health::standin_command(&h.paths.root));
    let o = health(&h, &["scan"]);
    refused_with(
        &o,
        1,
        &format!("gpuhook: cannot read the kernel log {} (No such file or directory (os error 2)): health scan finds the NVIDIA driver's Xid records there; it is the kmsg under the config's \"dev\" root (/dev/kmsg on a host): a \"dev\" that names another tree, or a container or fake host without one (run the scan on the host)", kmsg(&h).display()),
    );
    std::fs::write(
        kmsg(&h),
        testbed::health::xid_record(1, B, 48, testbed::health::xid_text(48)),
    )
    .unwrap();
    let o = health(&h, &["scan", "--json"]);
    assert_ok(&o);
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["records"], 1);
    assert_eq!(j["quarantined"][0]["pci"], B);
    assert_eq!(j["quarantined"][0]["xid"], 48);
    assert_eq!(j["quarantined"][0]["action"], "reset");
    // B by its index (1), A by its UUID.
    let l = h.list();
    assert_eq!(gpu_of(&l, B)["index"], 1);
    let uuid_a = gpu_of(&l, A)["uuid"].as_str().unwrap().to_string();
    let o = health(&h, &["reset", "1"]);
    assert_ok(&o);
    let e = stderr(&o);
    let lines: Vec<&str> = e.lines().collect();
    assert_eq!(lines.len(), 2, "{e}");
    assert_eq!(
        lines[0],
        format!(
            "gpuhook: GPU {B}: resetting: '{} --root {} --gpu-reset -i {B}' (30 s at most)",
            testbed::health::reset_standin().display(),
            h.paths.root.display()
        )
    );
    assert!(
        lines[1].starts_with(&format!("gpuhook: GPU {B}: reset ran in "))
            && lines[1].ends_with(" s; probing it (config space, driver, not excluded)"),
        "{e}"
    );
    assert!(
        out(&o).contains("back in service (its quarantine after Xid 48 is lifted)"),
        "{}",
        out(&o)
    );
    let o = health(&h, &["reset", &uuid_a.to_uppercase(), "--json"]);
    assert_ok(&o);
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (&j["pci"], &j["ok"], &j["why"], &j["lifted"]),
        (&json!(A), &json!(true), &json!("operator"), &Value::Null)
    );
    assert!(j["took_s"].as_f64().is_some());
    // clear by index, with JSON.
    std::fs::write(
        kmsg(&h),
        testbed::health::xid_record(2, B, 79, testbed::health::xid_text(79)),
    )
    .unwrap();
    testbed::health::config_all_ones(&h.paths, B);
    assert_ok(&health(&h, &["scan"]));
    let o = health(&h, &["clear", "1", "--json"]);
    assert_ok(&o);
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (&j["pci"], &j["lifted"]["xid"], &j["lifted"]["action"]),
        (&json!(B), &json!(79), &json!("reboot"))
    );
    refused_with(
        &health(&h, &["clear", "9"]),
        1,
        "gpuhook: no GPU with index 9 on this host (gpuhook list shows them)",
    );
}

/// `poststop` (the runtime's hook) with a config that cannot be read: one line naming the
/// container and why its GPUs stay held; exit 0 (the runtime goes on either way).
#[test]
fn poststop_with_an_unreadable_config_says_so() {
    let h = Host::new(FakeHost::blueprint());
    std::fs::write(&h.config, "{not json").unwrap();
    let o = run_with_stdin(
        h.cmd().args(["oci-hook", "poststop", "1.2"]),
        r#"{"ociVersion": "1.0.2", "id": "ctr1", "status": "stopped", "bundle": "/x"}"#,
    );
    assert_ok(&o);
    let e = stderr(&o);
    assert_eq!(e.trim_end().lines().count(), 1, "{e}");
    assert!(
        e.starts_with(&format!("gpuhook: container 'ctr1': poststop: cannot free its GPUs: config {}: ", h.config.display()))
            && e.trim_end().ends_with("; they stay reserved until the config reads again (then its delete, `gpuhook release ctr1`, or a request that needs them as stale frees them)"),
        "{e}"
    );
}

/// `release --json`: the holder and what it held; a container named once.
#[test]
fn release_in_json() {
    let h = Host::new(FakeHost::blueprint());
    let gone = {
        let mut c = Command::new("true").spawn().unwrap();
        let p = gpuhook::host::procfs::ProcRef::of(c.id() as i32);
        c.wait().unwrap();
        p.map_or(
            json!({"pid": 999_999, "start_time": 1}),
            |p| json!({"pid": p.pid, "start_time": p.start_time}),
        )
    };
    record(&h, "oci", "cx", "cx", "0000:08:00.0", gone.clone());
    let o = h.cmd().args(["release", "cx"]).output().unwrap();
    assert_ok(&o);
    assert_eq!(out(&o), "released 0000:08:00.0 of container 'cx'\n");
    record(&h, "oci", "cx", "cx", "0000:08:00.0", gone);
    let o = h.cmd().args(["release", "cx", "--json"]).output().unwrap();
    assert_ok(&o);
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        j,
        json!({"holder": {"kind": "oci", "name": "cx", "uuid": null}, "released": ["0000:08:00.0"], "draining": []})
    );
}

/// `gpuhook completions SHELL` prints the script for bash, zsh and fish: every command.
#[test]
fn completions_for_each_shell() {
    for (shell, head) in [
        ("bash", "_gpuhook() {"),
        ("zsh", "#compdef gpuhook"),
        ("fish", "complete -c gpuhook"),
    ] {
        let o = Command::new(bin())
            .args(["completions", shell])
            .output()
            .unwrap();
        assert_ok(&o);
        let s = out(&o);
        assert!(s.contains(head), "{shell}: {s}");
        for cmd in [
            "list",
            "check",
            "attach",
            "detach",
            "release",
            "show",
            "health",
            "completions",
        ] {
            assert!(s.contains(cmd), "{shell} lacks {cmd}");
        }
    }
    let o = Command::new(bin())
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

/// `gpuhook show NAME`: one holder's story whatever its kind: an LXC domain the hook
/// prepared, an OCI container that runs, a VM; the JSON's keys; a name nobody answers to
/// exits 1; a name two kinds share is refused naming each.
#[test]
fn show_tells_one_holders_story() {
    let h = Host::new(FakeHost::dgx8());
    assert_ok(&h.hook(
        "web1",
        "prepare",
        &domain("web1", 1, &gpus(r#"arch="hopper""#)),
    ));
    let o = h.cmd().args(["show", "web1"]).output().unwrap();
    assert_ok(&o);
    let text = out(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], format!("domain 'web1' ({})", uuid(1)));
    assert!(
        lines[1].starts_with("  reserved  ")
            && lines[1].ends_with(" through the libvirt LXC hook (prepare)"),
        "{text}"
    );
    assert!(
        lines[2].starts_with("  phase     prepared (last changed "),
        "{text}"
    );
    assert_eq!(lines[3], "  request   1 GPU, arch == hopper");
    assert!(
        lines[4].starts_with("  gpus      0000:") && lines[4].contains("(index "),
        "{text}"
    );
    assert!(
        text.contains("\n  driver    none (device nodes only)\n"),
        "{text}"
    );
    let init = Init::start();
    record(&h, "oci", "c1", "c1", B, init.record());
    let o = h.cmd().args(["show", "c1", "--json"]).output().unwrap();
    assert_ok(&o);
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        j["holder"],
        json!({"kind": "oci", "name": "c1", "uuid": null})
    );
    assert_eq!(j["door"], "oci-runtime");
    assert_eq!(j["phase"], "running");
    assert_eq!(j["stale"], Value::Null);
    assert_eq!(j["init"], init.record());
    assert_eq!(j["gpus"][0]["unit"], B);
    assert_eq!(j["gpus"][0]["index"], 1);
    for k in [
        "hotplugged",
        "request",
        "created",
        "updated",
        "nodes",
        "controller",
        "prepared_by",
        "cgroup",
        "driver",
        "driver_version",
        "driver_outdated",
        "mounts",
    ] {
        assert!(j.get(k).is_some(), "no {k}: {j}");
    }
    // A VM, and a name two kinds share.
    let vm = Init::start();
    record(&h, "vm", "c1", &uuid(7), "0000:40:00.0", vm.record());
    let o = h.cmd().args(["show", "c1"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("container 'c1'") && stderr(&o).contains("vm 'c1'"),
        "{}",
        stderr(&o)
    );
    let o = h
        .cmd()
        .args(["show", "c1", "--vm", "--json"])
        .output()
        .unwrap();
    assert_ok(&o);
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (&j["holder"]["kind"], &j["door"]),
        (&json!("vm"), &json!("qemu-hook"))
    );
    drop(init);
    let o = h
        .cmd()
        .args(["show", "c1", "--container"])
        .output()
        .unwrap();
    assert_ok(&o);
    assert!(
        out(&o).contains("\n  stale     its container init"),
        "{}",
        out(&o)
    );
    refused_with(
        &h.cmd().args(["show", "nobody"]).output().unwrap(),
        1,
        "gpuhook: no domain, container or vm named 'nobody' holds GPUs: nothing to show (gpuhook list shows who holds what)",
    );
}
