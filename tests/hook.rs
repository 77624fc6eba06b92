//! The hook driven as libvirt drives it (`gpuhook hook NAME OP SUBOP -`, XML on stdin),
//! against fake hosts: every request form of docs/guides/libvirt.md, idempotency, release safety,
//! malformed input, broken config and state, stale reservations, contention.

mod common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use testbed::FakeHost;

const NS: &str = r#"xmlns:gpu="urn:gpuhook:gpu:1""#;

#[test]
fn blueprint_flavor_reserves_two_fermi() {
    let h = Host::new(FakeHost::blueprint());
    let meta = format!(
        r#"<gpu:gpus {NS}><gpu:extra_spec name="gpus">= 2</gpu:extra_spec><gpu:extra_spec name="gpu_arch">s== fermi</gpu:extra_spec><gpu:extra_spec name="hypervisor_type">s== LXC</gpu:extra_spec></gpu:gpus>"#
    );
    let xml = domain("cg1", 1, &meta);
    assert_ok(&h.hook("cg1", "prepare", &xml));
    assert_ok(&h.hook("cg1", "start", &xml));
    let l = h.list();
    for g in l["gpus"].as_array().unwrap() {
        assert_eq!(g["holder"]["domain"], "cg1");
        assert_eq!(g["holder"]["uuid"], uuid(1));
        assert_eq!(g["arch"], "fermi");
        assert_eq!(g["model"], "Tesla M2050");
    }
    assert_ok(&h.hook("cg1", "stopped", &xml));
    assert_ok(&h.hook("cg1", "release", &xml));
    assert!(h.holders().is_empty());
}

#[test]
fn every_request_form() {
    let h = Host::new(FakeHost::dgx8());
    let l = h.list();
    let g = l["gpus"].as_array().unwrap().clone();
    let uuid5 = g[5]["uuid"].as_str().unwrap().to_owned();
    let cases: Vec<(String, Vec<usize>)> = vec![
        (gpus(""), vec![0]),
        (gpus(r#"count="3""#), vec![0, 1, 2]),
        (
            gpus(r#"count="2" vendor="nvidia" arch="HOPPER" model="h100""#),
            vec![0, 1],
        ),
        (
            format!(r#"<gpu:gpus {NS}><gpu:device pci="0000:9c:00.0"/></gpu:gpus>"#),
            vec![5],
        ),
        (
            format!(r#"<gpu:gpus {NS}><gpu:device uuid="{uuid5}"/></gpu:gpus>"#),
            vec![5],
        ),
        (
            format!(r#"<gpu:gpus {NS}><gpu:device index="6"/><gpu:device index="7"/></gpu:gpus>"#),
            vec![6, 7],
        ),
        (
            format!(r#"<gpu:gpus {NS} count="2"><gpu:device index="4"/></gpu:gpus>"#),
            vec![4, 5],
        ),
        (
            r#"<gpus xmlns="urn:gpuhook:gpu:1" count="2"/>"#.to_string(),
            vec![0, 1],
        ),
        (
            format!(
                r#"<gpu:gpus {NS}><gpu:extra_spec name="gpus">== 4</gpu:extra_spec><gpu:extra_spec name="gpu_vendor">&lt;or&gt; amd &lt;or&gt; nvidia</gpu:extra_spec></gpu:gpus>"#
            ),
            vec![0, 1, 2, 3],
        ),
        (
            format!(
                r#"<gpu:gpus {NS}><gpu:extra_spec name="gpus">&gt;= 1</gpu:extra_spec><gpu:extra_spec name="gpu_model">&lt;in&gt; H100</gpu:extra_spec><gpu:extra_spec name="gpu_arch">s!= fermi</gpu:extra_spec></gpu:gpus>"#
            ),
            vec![0],
        ),
    ];
    for (i, (meta, want)) in cases.iter().enumerate() {
        let name = format!("form{i}");
        let xml = domain(&name, 100 + i as u32, meta);
        let o = h.hook(&name, "prepare", &xml);
        assert_ok(&o);
        let held = h.holders();
        let got: Vec<usize> = held[&name]
            .iter()
            .map(|p| g.iter().position(|x| x["pci"] == *p).unwrap())
            .collect();
        assert_eq!(&got, want, "case {i}: {meta}");
        assert_ok(&h.hook(&name, "release", &xml));
        assert!(h.holders().is_empty());
    }
}

#[test]
fn second_domain_beyond_free_fails_and_frees_nothing() {
    let h = Host::new(FakeHost::blueprint());
    let a = domain("a", 1, &gpus(r#"count="1""#));
    let b = domain("b", 2, &gpus(r#"count="2""#));
    assert_ok(&h.hook("a", "prepare", &a));
    let before = std::fs::read(&h.state).unwrap();
    let o = h.hook("b", "prepare", &b);
    assert_fails(
        &o,
        "b",
        "cannot reserve 2 GPUs: only 1 of the host's 2 matching GPUs is free: 1 held by domain 'a'",
    );
    assert_eq!(
        std::fs::read(&h.state).unwrap(),
        before,
        "a failed prepare changes nothing"
    );
    // libvirt then calls stopped + release for b: a's reservation must survive.
    assert_ok(&h.hook("b", "stopped", &b));
    assert_ok(&h.hook("b", "release", &b));
    assert_eq!(h.holders().get("a").map(Vec::len), Some(1));
    assert_eq!(h.holders().len(), 1);
}

#[test]
fn prepare_is_idempotent_and_release_of_unknown_is_noop() {
    let h = Host::new(FakeHost::dgx8());
    let x = domain("x", 1, &gpus(r#"count="2""#));
    assert_ok(&h.hook("x", "prepare", &x));
    let first = h.holders()["x"].clone();
    assert_ok(&h.hook("x", "prepare", &x));
    assert_eq!(h.holders()["x"], first);
    let ghost = domain("ghost", 9, &gpus(""));
    let before = std::fs::read(&h.state).unwrap();
    assert_ok(&h.hook("ghost", "release", &ghost));
    assert_ok(&h.hook("ghost", "stopped", &ghost));
    assert_eq!(std::fs::read(&h.state).unwrap(), before);
    // The request changed while stopped: a second prepare follows it.
    let x3 = domain("x", 1, &gpus(r#"count="3""#));
    assert_ok(&h.hook("x", "prepare", &x3));
    assert_eq!(h.holders()["x"].len(), 3);
}

#[test]
fn start_checks_the_reservation() {
    let h = Host::new(FakeHost::blueprint());
    let x = domain("x", 1, &gpus(""));
    assert_fails(&h.hook("x", "start", &x), "x", "holds no GPU reservation");
    assert_ok(&h.hook("x", "prepare", &x));
    assert_ok(&h.hook("x", "start", &x));
    // The GPU vanished between prepare and start (driver unloaded): start refuses.
    let pci = &h.holders()["x"][0];
    std::fs::remove_file(
        h.root()
            .join(format!("host/proc/driver/nvidia/gpus/{pci}/information")),
    )
    .unwrap();
    assert_fails(
        &h.hook("x", "start", &x),
        "x",
        &format!("reserved GPU {pci} cannot be used"),
    );
}

#[test]
fn excluded_and_unusable_are_never_given() {
    let h = Host::with(FakeHost::mixed(), |c| {
        c["exclude"] = serde_json::json!(["0000:17:00.0"])
    });
    let o = h.hook("n", "prepare", &domain("n", 1, &gpus(r#"vendor="nvidia""#)));
    assert_fails(&o, "n", "only 0 of the host's 2 matching GPUs are free: 1 excluded, 1 unusable (0000:65:00.0: NVIDIA driver has no");
    let o = h.hook(
        "n",
        "prepare",
        &domain(
            "n",
            1,
            &format!(r#"<gpu:gpus {NS}><gpu:device pci="0000:17:00.0"/></gpu:gpus>"#),
        ),
    );
    assert_fails(
        &o,
        "n",
        "GPU 0000:17:00.0 (pci 0000:17:00.0) is excluded by the host config",
    );
    let l = h.list();
    assert_eq!(l["gpus"][1]["excluded"], true);
    assert!(l["gpus"][4]["problem"]
        .as_str()
        .unwrap()
        .contains("driver not loaded"));
    assert_ok(&h.hook("a", "prepare", &domain("a", 2, &gpus(r#"vendor="amd""#))));
    assert_eq!(h.holders()["a"], vec!["0000:31:00.0"]);
}

#[test]
fn malformed_requests_are_one_line_and_reserve_nothing() {
    let h = Host::new(FakeHost::blueprint());
    let cases = [
        (gpus(r#"count="0""#), "count must be at least 1"),
        (gpus(r#"count="-1""#), "negative"),
        (gpus(r#"count="100000""#), "too large"),
        (gpus(r#"count="3""#), "cannot reserve 3 GPUs"),
        (gpus(r#"size="2""#), "unknown attribute 'size'"),
        (gpus(r#"vendor="nvidia" vendor="amd""#), "malformed XML"),
        (
            gpus(r#"arch="kepler""#),
            "only 0 of the host's 0 matching GPUs",
        ),
        (
            format!(r#"<gpu:gpus {NS}/><gpu:gpus {NS}/>"#),
            "more than one gpuhook <gpus>",
        ),
        (
            format!(
                r#"<gpu:gpus {NS} count="1"><gpu:device index="0"/><gpu:device index="1"/></gpu:gpus>"#
            ),
            "less than the 2",
        ),
        (
            format!(r#"<gpu:gpus {NS}><gpu:device index="7"/></gpu:gpus>"#),
            "no GPU with index 7",
        ),
        (
            format!(
                r#"<gpu:gpus {NS}><gpu:extra_spec name="gpus">= two</gpu:extra_spec></gpu:gpus>"#
            ),
            "not a whole number",
        ),
        (
            format!(
                r#"<gpu:gpus {NS}><gpu:extra_spec name="gpu_arch">== fermi</gpu:extra_spec></gpu:gpus>"#
            ),
            "compares numbers",
        ),
        (
            format!(
                r#"<gpu:gpus {NS} count="2"><gpu:extra_spec name="gpus">= 1</gpu:extra_spec></gpu:gpus>"#
            ),
            "contradicts",
        ),
        (
            format!(r#"<gpu:gpus {NS}><gpu:gpus/></gpu:gpus>"#),
            "unknown gpuhook element <gpus> inside",
        ),
        (
            format!(r#"<gpu:gpus {NS}>&xxe;</gpu:gpus>"#),
            "entities are not allowed",
        ),
        (format!(r#"<gpu:gpus {NS}>"#), "malformed XML"),
    ];
    for (meta, needle) in cases {
        let o = h.hook("bad", "prepare", &domain("bad", 7, &meta));
        assert_fails(&o, "bad", needle);
    }
    let o = h.hook("bad", "prepare", "<!DOCTYPE x [<!ENTITY a SYSTEM 'file:///etc/shadow'>]><domain><name>&a;</name><metadata><gpu:gpus xmlns:gpu='urn:gpuhook:gpu:1'/></metadata></domain>");
    assert_fails(&o, "bad", "document type declarations are not allowed");
    let bytes = domain("bad", 7, &gpus(""))
        .replace("<name>bad</name>", "<name>b\u{1}ad</name>")
        .into_bytes();
    let bytes: Vec<u8> = bytes
        .into_iter()
        .map(|b| if b == 1 { 0xff } else { b })
        .collect();
    let o = run_with_bytes(
        h.cmd().args(["hook", "bad", "prepare", "begin", "-"]),
        &bytes,
    );
    assert_fails(&o, "bad", "domain XML is not valid UTF-8");
    assert!(h.holders().is_empty());
    assert!(
        !h.state.exists(),
        "nothing was ever reserved, so no state file"
    );
}

#[test]
fn non_gpu_domains_untouched_by_broken_config_and_state() {
    let h = Host::new(FakeHost::blueprint());
    let plain = "<domain type='lxc'><name>plain</name><uuid>11111111-2222-4333-8444-555555555555</uuid><metadata><nova:instance xmlns:nova='http://openstack.org/xmlns/libvirt/nova/1.1'/></metadata></domain>";
    write_config(&h.config, "{ this is not json");
    std::fs::create_dir_all(h.state.parent().unwrap()).unwrap();
    std::fs::write(&h.state, "garbage").unwrap();
    for op in [
        "prepare",
        "start",
        "started",
        "stopped",
        "release",
        "reconnect",
    ] {
        let o = h.hook("plain", op, plain);
        assert_ok(&o);
        assert!(o.stderr.is_empty(), "{op}: {}", stderr(&o));
    }
    // The same with no config file at all and an unreadable state directory.
    let o = run_with_stdin(
        std::process::Command::new(bin())
            .env("GPUHOOK_CONFIG", "/nonexistent/config.json")
            .args(["hook", "plain", "prepare", "begin", "-"]),
        plain,
    );
    assert_ok(&o);
    // A GPU domain gets the config's error, naming the file.
    let o = h.hook("g", "prepare", &domain("g", 1, &gpus("")));
    assert_fails(&o, "g", &format!("config {}: ", h.config.display()));
    assert_eq!(std::fs::read(&h.state).unwrap(), b"garbage");
}

#[test]
fn corrupt_state_fails_gpu_starts_and_is_never_reset() {
    let h = Host::new(FakeHost::blueprint());
    std::fs::create_dir_all(h.state.parent().unwrap()).unwrap();
    std::fs::set_permissions(
        h.state.parent().unwrap(),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    let xml = domain("g", 1, &gpus(""));
    for (text, needle) in [
        ("{\"version\": 1, \"reserv", "is corrupt"),
        ("{\"version\": 7, \"reservations\": {}}", "has version 7"),
        ("", "is corrupt"),
    ] {
        std::fs::write(&h.state, text).unwrap();
        std::fs::set_permissions(&h.state, std::fs::Permissions::from_mode(0o600)).unwrap();
        let o = h.hook("g", "prepare", &xml);
        assert_fails(&o, "g", needle);
        assert!(stderr(&o).contains(&h.state.display().to_string()));
        // stopped/release exit 0 but do not touch it either.
        assert_ok(&h.hook("g", "release", &xml));
        assert_eq!(std::fs::read_to_string(&h.state).unwrap(), text);
        let o = h.cmd().args(["list"]).output().unwrap();
        assert_eq!(o.status.code(), Some(1));
    }
    std::fs::remove_file(&h.state).unwrap();
    assert_ok(&h.hook("g", "prepare", &xml));
}

#[test]
fn unsafe_state_paths_refused() {
    let h = Host::new(FakeHost::blueprint());
    let dir = h.state.parent().unwrap();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let xml = domain("g", 1, &gpus(""));
    std::os::unix::fs::symlink("/etc/passwd", &h.state).unwrap();
    assert_fails(&h.hook("g", "prepare", &xml), "g", "is a symlink");
    std::fs::remove_file(&h.state).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_fails(
        &h.hook("g", "prepare", &xml),
        "g",
        "lets group or others write it",
    );
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_ok(&h.hook("g", "prepare", &xml));
    nix::unistd::chown(&h.state, Some(nix::unistd::Uid::from_raw(1000)), None).unwrap();
    // release always exits 0 (the error is logged); the next start names the cause.
    assert_ok(&h.hook("g", "release", &xml));
    assert_fails(
        &h.hook("g2", "prepare", &domain("g2", 2, &gpus(""))),
        "g2",
        "owned by uid 1000",
    );
}

#[test]
fn stale_prepared_reservation_is_reclaimed() {
    let h = Host::new(FakeHost::blueprint());
    // Prepared by a parent that is gone (a shell that exits), no container: abandoned.
    let xml = domain("gone", 1, &gpus(r#"count="2""#));
    let o = run_with_stdin(
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "{} hook gone prepare begin - ; exit $?",
                bin().display()
            ))
            .env("GPUHOOK_CONFIG", &h.config),
        &xml,
    );
    assert_ok(&o);
    assert_eq!(h.holders()["gone"].len(), 2);
    let l = h.list();
    assert!(
        l["reservations"][0]["stale"]
            .as_str()
            .unwrap()
            .contains("which is gone"),
        "{l}"
    );
    // Listed as stale, never as a live holder: in the JSON and in the table.
    for g in l["gpus"].as_array().unwrap() {
        assert_eq!(g["holder"]["domain"], "gone", "{g}");
        assert_eq!(g["holder"]["stale"], true, "{g}");
    }
    let text = h.cmd().arg("list").output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert_eq!(
        text.matches("stale: gone (it was prepared by pid ").count(),
        2,
        "{text}"
    );
    assert!(!text.contains("gone (prepared)"), "{text}");
    // A new prepare reclaims it.
    assert_ok(&h.hook("new", "prepare", &domain("new", 2, &gpus(r#"count="2""#))));
    assert_eq!(h.holders().keys().collect::<Vec<_>>(), vec!["new"]);
    assert_eq!(h.list()["gpus"][0]["holder"]["stale"], false);
    // A reservation whose preparer is alive is never reclaimed.
    assert_fails(
        &h.hook("third", "prepare", &domain("third", 3, &gpus(""))),
        "third",
        "held by domain 'new'",
    );
}

#[test]
fn cli_check_and_release() {
    let h = Host::new(FakeHost::blueprint());
    let dir = h.root();
    let f = dir.join("d.xml");
    std::fs::write(&f, domain("c", 1, &gpus(r#"count="2""#))).unwrap();
    let o = h
        .cmd()
        .args(["check", f.to_str().unwrap()])
        .output()
        .unwrap();
    assert_ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("would get:")
            && out.contains("0000:07:00.0")
            && out.contains("/dev/nvidia1 (195:1)")
            && out.contains("/dev/nvidiactl (195:255)"),
        "{out}"
    );
    assert!(h.holders().is_empty(), "check is a dry run");
    assert_ok(&h.hook("c", "prepare", &std::fs::read_to_string(&f).unwrap()));
    let o = run_with_stdin(h.cmd().args(["check", "-"]), &domain("d", 2, &gpus("")));
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains("not satisfiable now"));
    let o = run_with_stdin(
        h.cmd().args(["check"]),
        "<domain><name>p</name><uuid>11111111-2222-4333-8444-555555555555</uuid></domain>",
    );
    assert_ok(&o);
    assert!(String::from_utf8_lossy(&o.stdout).contains("asks for no GPUs"));
    let o = h.cmd().args(["release", &uuid(1)]).output().unwrap();
    assert_ok(&o);
    assert!(String::from_utf8_lossy(&o.stdout)
        .contains("released 0000:07:00.0,0000:08:00.0 of domain 'c'"));
    assert!(h.holders().is_empty());
    assert_ok(&h.hook("c", "prepare", &std::fs::read_to_string(&f).unwrap()));
    assert_ok(&h.cmd().args(["release", "c"]).output().unwrap());
    assert!(h.holders().is_empty());
    // A name no holder answers to: non-zero, one line.
    let o = h.cmd().args(["release", "nobody"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "gpuhook: no domain, container or vm named 'nobody' holds GPUs: nothing to release\n"
    );
}

#[test]
fn cli_basics() {
    let o = std::process::Command::new(bin())
        .arg("--version")
        .output()
        .unwrap();
    assert_ok(&o);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("gpuhook {}", env!("CARGO_PKG_VERSION"))
    );
    let o = std::process::Command::new(bin())
        .arg("--help")
        .output()
        .unwrap();
    assert_ok(&o);
    for w in ["list", "check", "release", "hook"] {
        assert!(String::from_utf8_lossy(&o.stdout).contains(w));
    }
    let o = std::process::Command::new(bin())
        .arg("frobnicate")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    // argv[0] = …/lxc: hook mode without the `hook` word.
    let dir = tempfile::tempdir().unwrap();
    let lxc = dir.path().join("lxc");
    std::os::unix::fs::symlink(bin(), &lxc).unwrap();
    let o = run_with_stdin(
        std::process::Command::new(&lxc)
            .args(["x", "prepare", "begin", "-"])
            .env("GPUHOOK_CONFIG", "/nonexistent"),
        "<domain/>",
    );
    assert_ok(&o);
    std::fs::create_dir(dir.path().join("lxc.d")).unwrap();
    let d = dir.path().join("lxc.d/50-gpuhook");
    std::os::unix::fs::symlink(bin(), &d).unwrap();
    let o = run_with_stdin(
        std::process::Command::new(&d)
            .args(["x", "prepare", "begin", "-"])
            .env("GPUHOOK_CONFIG", "/nonexistent"),
        &domain("x", 1, &gpus("")),
    );
    assert_fails(&o, "x", "config /nonexistent");
}

#[test]
fn list_json_schema() {
    let h = Host::new(FakeHost::mixed());
    assert_ok(&h.hook("m", "prepare", &domain("m", 1, &gpus(r#"vendor="amd""#))));
    let l = h.list();
    let g = &l["gpus"][2];
    for k in [
        "index",
        "pci",
        "vendor",
        "model",
        "arch",
        "uuid",
        "numa_node",
        "devices",
        "excluded",
        "holder",
    ] {
        assert!(g.get(k).is_some(), "missing {k}: {g}");
    }
    assert_eq!(g["index"], 2);
    assert_eq!(g["pci"], "0000:31:00.0");
    assert_eq!(g["vendor"], "amd");
    assert_eq!(g["model"], "Instinct MI210");
    assert_eq!(g["arch"], "cdna2");
    assert_eq!(g["uuid"], serde_json::Value::Null);
    assert_eq!(g["numa_node"], 0);
    assert_eq!(
        g["devices"],
        serde_json::json!(["/dev/dri/card1", "/dev/dri/renderD129"])
    );
    assert_eq!(
        g["holder"],
        serde_json::json!({"kind": "libvirt", "domain": "m", "uuid": uuid(1), "phase": "prepared", "stale": false})
    );
    assert_eq!(l["gpus"][1]["uuid"].as_str().unwrap().len(), 40);
    assert_eq!(l["gpus"][1]["holder"], serde_json::Value::Null);
}

#[test]
fn concurrent_prepares_never_double_allocate() {
    let h = Host::new(FakeHost::dgx8());
    let n = 64;
    let children: Vec<_> = (0..n)
        .map(|i| {
            let name = format!("c{i}");
            let xml = domain(&name, 1000 + i, &gpus(""));
            let mut child = h
                .cmd()
                .args(["hook", &name, "prepare", "begin", "-"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(xml.as_bytes())
                .unwrap();
            child
        })
        .collect();
    let outs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let ok = outs.iter().filter(|o| o.status.success()).count();
    assert_eq!(ok, 8, "exactly the satisfiable ones succeed");
    for o in outs.iter().filter(|o| !o.status.success()) {
        let e = stderr(o);
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(
            e.contains(
                "cannot reserve 1 GPU: only 0 of the host's 8 matching GPUs are free: 8 held by"
            ),
            "{e}"
        );
    }
    let held = h.holders();
    let mut all: Vec<String> = held.values().flatten().cloned().collect();
    all.sort();
    let before = all.len();
    all.dedup();
    assert_eq!(all.len(), before, "a GPU in two reservations");
    assert_eq!(all.len(), 8);
}

/// The hook runs nothing: with every tool an operator's hook would call shadowed on PATH by
/// a trap, a whole GPU lifecycle leaves no trace of any of them.
#[test]
fn executes_nothing() {
    let h = Host::new(FakeHost::blueprint());
    let trap = h.root().join("trap");
    std::fs::create_dir(&trap).unwrap();
    let marker = h.root().join("executed");
    for tool in [
        "sh",
        "bash",
        "mknod",
        "nsenter",
        "chmod",
        "chown",
        "ln",
        "stat",
        "flock",
        "systemctl",
        "virsh",
        "modprobe",
        "nvidia-modprobe",
        "ldconfig",
        "mount",
    ] {
        let p = trap.join(tool);
        std::fs::write(
            &p,
            format!("#!/bin/sh\necho {tool} >> {}\n", marker.display()),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let xml = domain("x", 1, &gpus(r#"count="2""#));
    for op in ["prepare", "start", "stopped", "release", "reconnect"] {
        let subop = if matches!(op, "stopped" | "release") {
            "end"
        } else {
            "begin"
        };
        let _ = run_with_stdin(
            h.cmd()
                .args(["hook", "x", op, subop, "-"])
                .env("PATH", &trap),
            &xml,
        );
    }
    let _ = h.cmd().args(["list"]).env("PATH", &trap).output().unwrap();
    assert!(
        !marker.exists(),
        "the hook executed {}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
}

/// reconnect must not kill a running container over gpuhook's own files: a broken config
/// is logged and the call exits 0.
#[test]
fn reconnect_survives_broken_config() {
    let h = Host::new(FakeHost::blueprint());
    write_config(&h.config, "{ not json");
    let o = h.hook(
        "x",
        "reconnect",
        &domain("x", 1, &gpus("")).replace("<domain type='lxc'>", "<domain type='lxc' id='1'>"),
    );
    assert_ok(&o);
    assert!(
        stderr(&o).contains("reconnect: cannot read the config")
            && stderr(&o).contains("container left as it is"),
        "{}",
        stderr(&o)
    );
}

/// The hook reads the NVIDIA driver's details only for the GPUs it chooses: one that turns
/// out unusable is skipped, and a shortage names it.
#[test]
fn unusable_gpu_found_late_is_skipped() {
    let h = Host::new(FakeHost::dgx8());
    // The GPU a 1-GPU request would get first (index 0) lost its driver entry: still bound
    // to the nvidia driver, which no longer lists it (what a GPU that fell off the bus shows).
    std::fs::remove_file(
        h.root()
            .join("host/proc/driver/nvidia/gpus/0000:18:00.0/information"),
    )
    .unwrap();
    assert_ok(&h.hook("a", "prepare", &domain("a", 1, &gpus(""))));
    assert_eq!(h.holders()["a"], ["0000:1a:00.0"]);
    let o = h.hook("b", "prepare", &domain("b", 2, &gpus(r#"count="7""#)));
    assert_fails(
        &o,
        "b",
        "1 unusable (0000:18:00.0: bound to the nvidia driver, which no longer lists it",
    );
    // A model filter needs the driver's model names: read for every GPU up front.
    assert_ok(&h.hook(
        "c",
        "prepare",
        &domain("c", 3, &gpus(r#"model="H100 80GB HBM3""#)),
    ));
    assert_eq!(h.holders()["c"].len(), 1);
}

/// A GPU without its driver, among 200 other PCI functions: `prepare` does not look at it
/// (the kernel's PCI list says it is unbound), yet indices stay those of `list` and a
/// refusal still names it with its reason.
#[test]
fn unbound_gpu_skipped_but_counted() {
    let mut fake = FakeHost::wide(8).with_other_functions(200);
    let d = fake
        .devices
        .iter_mut()
        .find(|d| d.pci == "0000:10:00.0")
        .unwrap();
    d.driver = testbed::fakehost::Driver::None;
    let h = Host::new(fake);
    let list = h.list();
    assert_eq!(list["gpus"][0]["pci"], "0000:10:00.0");
    assert!(list["gpus"][0]["problem"]
        .as_str()
        .unwrap()
        .contains("driver not loaded"));
    assert_eq!(list["gpus"][1]["pci"], "0000:13:00.0");
    let by_index = format!(r#"<gpu:gpus {NS}><gpu:device index="1"/></gpu:gpus>"#);
    assert_ok(&h.hook("i", "prepare", &domain("i", 1, &by_index)));
    assert_eq!(h.holders()["i"], ["0000:13:00.0"]);
    assert_ok(&h.hook("a", "prepare", &domain("a", 2, &gpus(""))));
    assert_fails(
        &h.hook("b", "prepare", &domain("b", 3, &gpus(r#"count="7""#))),
        "b",
        "only 5 of the host's 8 matching GPUs are free: 2 held by domain 'i', domain 'a', 1 unusable (0000:10:00.0: NVIDIA driver has no",
    );
}

/// `gpuhook metrics`: what Prometheus's own checker accepts, with the values the host and
/// the state hold (a model name that needs escaping included), written atomically.
#[test]
fn metrics_for_node_exporter() {
    let h = Host::with(FakeHost::blueprint(), |c| {
        c["overrides"] = serde_json::json!({"0000:08:00.0": {"model": "Tesla \"M2050\" \\ rev"}});
    });
    assert_ok(&h.hook("a", "prepare", &domain("a", 1, &gpus("count='1'"))));
    let o = h.cmd().arg("metrics").output().unwrap();
    assert_ok(&o);
    let text = String::from_utf8(o.stdout).unwrap();
    for line in [
        r#"gpuhook_gpu_info{pci="0000:07:00.0",index="0",vendor="nvidia",model="Tesla M2050",arch="fermi",numa_node=""} 1"#,
        r#"gpuhook_gpu_info{pci="0000:08:00.0",index="1",vendor="nvidia",model="Tesla \"M2050\" \\ rev",arch="fermi",numa_node=""} 1"#,
        r#"gpuhook_gpu_reserved{pci="0000:07:00.0",kind="libvirt",holder="a"} 1"#,
        r#"gpuhook_gpu_reserved{pci="0000:08:00.0",kind="",holder=""} 0"#,
        r#"gpuhook_gpu_usable{pci="0000:08:00.0"} 1"#,
        r#"gpuhook_reservations{kind="libvirt",phase="prepared"} 1"#,
        r#"gpuhook_reservations{kind="oci",phase="running"} 0"#,
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
    }
    // Prometheus's promtool (Debian package prometheus) finds nothing to say.
    let check = run_with_stdin(
        std::process::Command::new("promtool").args(["check", "metrics"]),
        &text,
    );
    assert!(
        check.status.success() && check.stdout.is_empty(),
        "promtool: {} {}",
        String::from_utf8_lossy(&check.stdout),
        stderr(&check)
    );
    // --output replaces the file atomically: mode 0644, no temp file left.
    let dir = h.root().join("textfile");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("gpuhook.prom");
    std::fs::write(&out, "old").unwrap();
    assert_ok(
        &h.cmd()
            .args(["metrics", "--output"])
            .arg(&out)
            .output()
            .unwrap(),
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), text);
    assert_eq!(
        std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o644
    );
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names, [std::ffi::OsString::from("gpuhook.prom")]);
}

/// `driver="cdi"` through the hook: without a spec `prepare` is refused in one line naming
/// the directories and the generator, nothing reserved; `gpuhook check` shows what the
/// container would get from the nvidia-ctk-shaped spec; a spec with an unknown field is
/// refused naming the file.
#[test]
fn cdi_check_and_prepare() {
    let fake = FakeHost::blueprint();
    let h = Host::new(fake.clone());
    let xml = domain("cdi1", 1, &gpus(r#"count="1" driver="cdi""#));
    assert_fails(
        &h.hook("cdi1", "prepare", &xml),
        "cdi1",
        "driver \"cdi\": no CDI spec for nvidia.com/gpu in /etc/cdi, /var/run/cdi; write one with `nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml`",
    );
    assert!(h.holders().is_empty());
    h.with_cdi(&fake);
    let o = run_with_stdin(h.cmd().args(["check", "-"]), &xml);
    assert_ok(&o);
    let s = String::from_utf8_lossy(&o.stdout);
    for want in [
        "asks for 1 GPU, driver cdi",
        "driver cdi: from ",
        "nvidia.com/gpu=0 nvidia.com/gpu=GPU-",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.535.129.03 <- ",
        "more nodes: /dev/nvidia-modeset (195:254)",
        "link /usr/lib/x86_64-linux-gnu/libcuda.so -> libcuda.so.1",
        "linker cache for /usr/lib/x86_64-linux-gnu",
        "hook createContainer nvidia-cdi-hook enable-cuda-compat",
        "env NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu NVIDIA_VISIBLE_DEVICES=void",
    ] {
        assert!(s.contains(want), "{want}: {s}");
    }
    assert!(
        !s.contains("nvidia.com/gpu=1") && !s.contains("=all"),
        "{s}"
    );
    assert_ok(&h.hook("cdi1", "prepare", &xml));
    assert_eq!(h.holders().len(), 1);
    assert_ok(&h.hook("cdi1", "release", &xml));
    let spec = h.root().join("cdi/run/nvidia.yaml");
    let text = std::fs::read_to_string(&spec).unwrap();
    write_config(&spec, &text.replacen("    env:\n", "    environment:\n", 1));
    assert_fails(
        &h.hook("cdi1", "prepare", &xml),
        "cdi1",
        "nvidia.yaml: containerEdits: unknown field `environment`",
    );
    assert!(h.holders().is_empty());
}

/// CDI spec trust through the hook: a spec directory that group may write, a parent of it
/// that others may write, a symlinked spec file: `prepare` of a `driver="cdi"` domain is
/// refused in one line naming the directory (or the file), nothing reserved; a domain
/// without CDI on the same host is not affected; with the modes back it is granted.
#[test]
fn cdi_spec_trust_refuses_only_cdi_requests() {
    use std::os::unix::fs::PermissionsExt;
    let fake = FakeHost::blueprint();
    let h = Host::new(fake.clone());
    h.with_cdi(&fake);
    let (cdi, run) = (h.root().join("cdi"), h.root().join("cdi/run"));
    let mode = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    let with_cdi = domain("cdi1", 1, &gpus(r#"count="1" driver="cdi""#));
    let plain = domain("plain1", 2, &gpus(r#"count="1""#));
    let refused = |needle: &str| {
        assert_fails(&h.hook("cdi1", "prepare", &with_cdi), "cdi1", needle);
        assert!(!h.holders().contains_key("cdi1"));
        assert_ok(&h.hook("plain1", "prepare", &plain));
        assert_eq!(h.holders()["plain1"].len(), 1);
        assert_ok(&h.hook("plain1", "release", &plain));
    };
    mode(&run, 0o775);
    refused(&format!(
        "CDI spec directory {} has mode 0775: group or others may write it; refusing to read specs from it",
        run.display()
    ));
    mode(&run, 0o755);
    mode(&cdi, 0o757);
    refused(&format!(
        "CDI spec directory {}: its parent {} has mode 0757: group or others may write it; refusing to read specs from it",
        h.root().join("cdi/etc").display(),
        cdi.display()
    ));
    mode(&cdi, 0o755);
    let spec = run.join("nvidia.yaml");
    let elsewhere = h.root().join("nvidia.yaml");
    std::fs::rename(&spec, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &spec).unwrap();
    refused(&format!(
        "CDI spec {} is a symlink; refusing to follow it",
        spec.display()
    ));
    std::fs::remove_file(&spec).unwrap();
    std::fs::rename(&elsewhere, &spec).unwrap();
    assert_ok(&h.hook("cdi1", "prepare", &with_cdi));
    assert_eq!(h.holders()["cdi1"].len(), 1);
}

/// Hole 3: a GPU freed while a process outside the container still has its node open (a
/// descriptor passed over a unix socket) is draining: listed with the PID, refused to the
/// next domain naming the PID and its command, counted as not free by metrics and
/// Placement; once the holder exits the next request gets it. The holder really has the
/// node open: the fake GPU is given the numbers of `/dev/full` ([`openable`]), since a
/// driverless fake node cannot be opened and an `O_PATH` descriptor holds no GPU.
#[test]
fn gpu_kept_open_after_stop_drains_until_closed() {
    let h = Host::new(blueprint_minors(221, 222));
    openable(&h.paths.dev.join("nvidia221"));
    let a = domain("a", 1, &gpus(r#"count="1""#));
    assert_ok(&h.hook("a", "prepare", &a));
    assert_ok(&h.hook("a", "start", &a));
    assert_eq!(h.holders()["a"], vec!["0000:07:00.0"]);
    let mut holder = hold_open(&h.paths.dev.join("nvidia221"));
    let pid = holder.id();
    assert_ok(&h.hook("a", "stopped", &a));
    assert_ok(&h.hook("a", "release", &a));
    assert!(h.holders().is_empty(), "freed");
    let l = h.list();
    let g = gpu_of(&l, "0000:07:00.0");
    assert_eq!(g["draining"], serde_json::json!([pid]), "{l}");
    assert_eq!(g["holder"], serde_json::Value::Null);
    assert_eq!(
        gpu_of(&l, "0000:08:00.0")["draining"],
        serde_json::json!([])
    );
    let text = h.cmd().arg("list").output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(
        text.contains(&format!("draining: pid {pid} (sleep)")),
        "{text}"
    );
    // A domain asking for that GPU is refused, naming the process.
    let b = domain(
        "b",
        2,
        &format!(r#"<gpu:gpus {NS}><gpu:device index="0"/></gpu:gpus>"#),
    );
    let before = std::fs::read(&h.state).unwrap();
    assert_fails(
        &h.hook("b", "prepare", &b),
        "b",
        &format!("GPU 0000:07:00.0 (index 0) is held by pid {pid} (sleep), which still has 0000:07:00.0 open after domain 'a' (draining)"),
    );
    assert_eq!(
        std::fs::read(&h.state).unwrap(),
        before,
        "refusal changes nothing"
    );
    let c = domain("c", 3, &gpus(r#"count="2""#));
    assert_fails(
        &h.hook("c", "prepare", &c),
        "c",
        &format!("only 1 of the host's 2 matching GPUs is free: 1 held by pid {pid} (sleep)"),
    );
    // Not free for metrics and Placement either.
    let m = h.cmd().arg("metrics").output().unwrap();
    let m = String::from_utf8_lossy(&m.stdout).into_owned();
    assert!(
        m.contains(r#"gpuhook_gpu_draining{pci="0000:07:00.0"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"gpuhook_gpu_draining{pci="0000:08:00.0"} 0"#),
        "{m}"
    );
    assert!(
        m.contains(r#"gpuhook_gpu_usable{pci="0000:07:00.0"} 0"#),
        "{m}"
    );
    let p = h.cmd().arg("placement").output().unwrap();
    let p = String::from_utf8_lossy(&p.stdout).into_owned();
    assert!(p.contains("total: 2\n            reserved: 1\n"), "{p}");
    // Another GPU is still given.
    let d = domain("d", 4, &gpus(r#"count="1""#));
    assert_ok(&h.hook("d", "prepare", &d));
    assert_eq!(h.holders()["d"], vec!["0000:08:00.0"]);
    assert_ok(&h.hook("d", "release", &d));
    // The holder exits: listings look again (without writing), the next request gets it.
    holder.kill();
    assert_eq!(
        gpu_of(&h.list(), "0000:07:00.0")["draining"],
        serde_json::json!([])
    );
    assert!(std::fs::read_to_string(&h.state)
        .unwrap()
        .contains("\"draining\""));
    assert_ok(&h.hook("b", "prepare", &b));
    assert!(!std::fs::read_to_string(&h.state)
        .unwrap()
        .contains("\"draining\""));
    assert_eq!(h.holders()["b"], vec!["0000:07:00.0"]);
    assert_eq!(
        gpu_of(&h.list(), "0000:07:00.0")["draining"],
        serde_json::json!([])
    );
    // A stop with nothing left open frees at once.
    assert_ok(&h.hook("b", "release", &b));
    let l = h.list();
    assert!(l["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .all(|g| g["draining"] == serde_json::json!([])));
}

/// An `O_PATH` descriptor on a GPU's node holds nothing: any container can `mknod` the node
/// and open it so without its device cgroup's leave, and it never becomes a real open.
/// A GPU freed while a process holds one only so is free at once. (Before, it drained as
/// long as that process lived: any container could keep every GPU from everyone.)
#[test]
fn gpu_held_by_o_path_only_is_free() {
    let h = Host::new(blueprint_minors(223, 224));
    let a = domain("a", 1, &gpus(r#"count="1""#));
    assert_ok(&h.hook("a", "prepare", &a));
    assert_ok(&h.hook("a", "start", &a));
    assert_eq!(h.holders()["a"], vec!["0000:07:00.0"]);
    // The fake node, 195:223, is the GPU's own number (driverless: an O_PATH open works).
    let _holder = hold_path(&h.paths.dev.join("nvidia223"));
    assert_ok(&h.hook("a", "stopped", &a));
    assert_ok(&h.hook("a", "release", &a));
    assert_eq!(
        gpu_of(&h.list(), "0000:07:00.0")["draining"],
        serde_json::json!([])
    );
    assert!(!std::fs::read_to_string(&h.state)
        .unwrap()
        .contains("\"draining\""));
    let b = domain(
        "b",
        2,
        &format!(r#"<gpu:gpus {NS}><gpu:device index="0"/></gpu:gpus>"#),
    );
    assert_ok(&h.hook("b", "prepare", &b));
    assert_eq!(h.holders()["b"], vec!["0000:07:00.0"]);
}

/// Bad `sharing` entries through the real binary, with a sharer holding a slot: each is
/// refused in one line naming the config file and the entry, `list` fails the same way, the
/// state file is untouched, and with the config mended the sharer still holds its slot.
#[test]
fn bad_sharing_configs_refused_nothing_lost() {
    let h = Host::with(FakeHost::blueprint(), |c| {
        c["sharing"] = serde_json::json!({"0000:07:00.0": {"replicas": 2}});
    });
    let a = domain("a", 1, &gpus(r#"share="yes""#));
    assert_ok(&h.hook("a", "prepare", &a));
    assert_eq!(h.holders()["a"], ["0000:07:00.0/slot0"]);
    let before = std::fs::read(&h.state).unwrap();
    let good = std::fs::read(&h.config).unwrap();
    for (sharing, needle) in [
        (
            serde_json::json!({"0000:07:00.0": {"replicas": 1}}),
            "\"sharing\".\"0000:07:00.0\": replicas 1 is out of range (2-64)",
        ),
        (
            serde_json::json!({"0000:07:00.0": {"replicas": 2, "mode": "vgpu"}}),
            "\"sharing\".\"0000:07:00.0\": unknown mode 'vgpu' (known: timeslice, mps)",
        ),
        (
            serde_json::json!({"10de:06de": {"replicas": 2, "memory_limit_mib": 512}}),
            "\"sharing\".\"10de:06de\": memory_limit_mib is only for mode \"mps\"",
        ),
        (
            serde_json::json!({"10de:06de": {"replicas": 2, "mode": "timeslice", "active_thread_percentage": 50}}),
            "\"sharing\".\"10de:06de\": active_thread_percentage is only for mode \"mps\"",
        ),
    ] {
        h.edit_config(|c| c["sharing"] = sharing.clone());
        let config = format!("config {}: ", h.config.display());
        let o = h.hook("b", "prepare", &domain("b", 2, &gpus(r#"share="yes""#)));
        assert_fails(&o, "b", &config);
        assert!(stderr(&o).contains(needle), "{sharing}: {}", stderr(&o));
        let l = h.cmd().args(["list", "--json"]).output().unwrap();
        let e = stderr(&l);
        assert!(!l.status.success(), "{sharing}: list under a bad config");
        assert_eq!(e.trim_end().lines().count(), 1, "{e}");
        assert!(e.contains(&config) && e.contains(needle), "{e}");
        assert_eq!(std::fs::read(&h.state).unwrap(), before, "{sharing}");
        std::fs::write(&h.config, &good).unwrap();
    }
    assert_eq!(h.holders()["a"], ["0000:07:00.0/slot0"]);
    assert_ok(&h.hook("b", "prepare", &domain("b", 2, &gpus(r#"share="yes""#))));
    assert_eq!(h.holders()["b"], ["0000:07:00.0/slot1"]);
}
