//! `driver="host"` on fake hosts, without a container engine: `gpuhook driver`, `gpuhook cdi
//! generate` and `gpuhook cdi check`, `list` and `metrics` after a driver upgrade, and the
//! refusals the hook makes at `prepare` (no module, no libcuda, a file others may write);
//! the sockets' own rules (`driver/sockets.rs`).
//! The fake driver is real ELF libraries with SONAMEs (gcc), an `ld.so.cache` written by the
//! real `ldconfig -r`, a module version line as the driver writes it. (Containers with the
//! driver: tests/oci.rs under podman, tests/libvirt/driver.rs under libvirtd.)

mod common;
#[path = "driver/sockets.rs"]
mod sockets;

use common::*;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use testbed::FakeHost;

/// An older driver whose files an upgrade left on the host.
const OLD: &str = "535.129.03";

fn gh(h: &Host, args: &[&str]) -> std::process::Output {
    h.cmd().args(args).output().expect("gpuhook")
}

fn json_of(o: &std::process::Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}{}", out(o), stderr(o)))
}

fn out(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// One line on stderr, exit 1, containing `needle`.
fn assert_one_line(o: &std::process::Output, needle: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{e}{}", out(o));
    assert_eq!(e.trim_end().lines().count(), 1, "{e}");
    assert!(e.contains(needle), "{e:?} lacks {needle:?}");
}

/// Prometheus's `promtool check metrics` (Debian package prometheus) finds nothing to say.
fn promtool_is_silent(text: &str) {
    let check = run_with_stdin(
        std::process::Command::new("promtool").args(["check", "metrics"]),
        text,
    );
    assert!(
        check.status.success() && check.stdout.is_empty(),
        "promtool: {} {}",
        out(&check),
        stderr(&check)
    );
}

/// A host that ran driver `OLD` and was upgraded to `HOST_V`: the old libraries and firmware
/// are still there (the new ones' programs replaced the old).
fn upgraded_host() -> (Host, testbed::driver::FakeDriver) {
    let h = Host::new(FakeHost::blueprint());
    let old = h.with_host_driver(OLD);
    let d = testbed::driver::FakeDriver::install_host(&old.root, HOST_V).unwrap();
    set_module(&h.paths.proc, Some(HOST_V), false);
    (h, d)
}

#[test]
fn driver_lists_the_running_drivers_files_and_none_of_the_old() {
    let (h, d) = upgraded_host();
    assert!(d
        .root
        .join(format!("usr/lib/x86_64-linux-gnu/libcuda.so.{OLD}"))
        .exists());
    let o = gh(&h, &["driver", "--json"]);
    assert_ok(&o);
    let j = json_of(&o);
    assert_eq!(j["vendor"], "nvidia");
    assert_eq!(j["version"], HOST_V);
    assert_eq!(j["cached"], false);
    let files = j["files"].as_array().unwrap();
    let has = |path: &str, kind: &str, by: &str| {
        files
            .iter()
            .any(|f| f["path"] == path && f["kind"] == kind && f["found_by"] == by)
    };
    assert!(
        has(
            &format!("/usr/lib/x86_64-linux-gnu/libcuda.so.{HOST_V}"),
            "library",
            "ld.so.cache"
        ),
        "{j:#}"
    );
    assert!(has(
        &format!("/lib/firmware/nvidia/{HOST_V}/gsp_ga10x.bin"),
        "firmware",
        "fixed"
    ));
    assert!(has("/usr/bin/nvidia-smi", "program", "fixed"));
    assert!(has("/run/nvidia-persistenced/socket", "socket", "fixed"));
    assert!(has("/etc/OpenCL/vendors/nvidia.icd", "config", "fixed"));
    assert!(has(
        "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
        "config",
        "fixed"
    ));
    // Every library of the directory of that version (9 of the fake driver), none of the old.
    let libs: Vec<&str> = files
        .iter()
        .filter(|f| f["kind"] == "library")
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(libs.len(), 9, "{libs:?}");
    assert!(files
        .iter()
        .all(|f| !f["path"].as_str().unwrap().contains(OLD)));
    // Sources are under the root; the SONAME of libcuda is read from the ELF file.
    let cuda = files
        .iter()
        .find(|f| f["path"].as_str().unwrap().contains("libcuda.so."))
        .unwrap();
    assert!(cuda["source"]
        .as_str()
        .unwrap()
        .starts_with(&d.root.display().to_string()));
    assert_eq!(cuda["soname"], "libcuda.so.1");
    // The second look is the cache's.
    let again = json_of(&gh(&h, &["driver", "--json"]));
    assert_eq!(again["cached"], true);
    assert_eq!(again["files"], j["files"]);
    let text = out(&gh(&h, &["driver"]));
    assert!(
        text.starts_with(&format!(
            "NVIDIA driver {HOST_V} (the loaded kernel module's)"
        )),
        "{text}"
    );
    assert!(
        text.contains("library   ld.so.cache  /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"),
        "{text}"
    );
    // The open module's version line reads the same.
    set_module(&h.paths.proc, Some(HOST_V), true);
    assert_eq!(json_of(&gh(&h, &["driver", "--json"]))["version"], HOST_V);
}

#[test]
fn no_module_no_libcuda_and_a_writable_library_are_one_line_each_and_reserve_nothing() {
    let h = Host::new(FakeHost::blueprint());
    let d = h.with_host_driver(HOST_V);
    let xml = domain("dh", 1, &gpus(r#"driver="host""#));
    // No module loaded.
    set_module(&h.paths.proc, None, false);
    assert_one_line(
        &gh(&h, &["driver"]),
        "driver \"host\": no NVIDIA kernel module is loaded",
    );
    assert_fails(
        &h.hook("dh", "prepare", &xml),
        "dh",
        "driver \"host\": no NVIDIA kernel module is loaded",
    );
    assert!(h.holders().is_empty());
    // A module whose libraries are not installed.
    set_module(&h.paths.proc, Some(HOST_V2), false);
    assert_fails(
        &h.hook("dh", "prepare", &xml),
        "dh",
        "driver \"host\": the loaded NVIDIA kernel module is 560.28.03, but no libcuda.so.560.28.03 is installed",
    );
    assert!(h.holders().is_empty());
    // A library group-writable: refused naming it (cached or not).
    set_module(&h.paths.proc, Some(HOST_V), false);
    assert_ok(&h.hook("dh", "prepare", &xml));
    assert_ok(&h.hook("dh", "release", &xml));
    let lib = d
        .root
        .join(format!("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{HOST_V}"));
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o775)).unwrap();
    assert_fails(
        &h.hook("dh", "prepare", &xml),
        "dh",
        &format!(
            "driver \"host\": {} has mode 0775: group or others may write it; refusing to give it",
            lib.display()
        ),
    );
    assert!(h.holders().is_empty());
    // The request without the driver is met: only `host` needs the files.
    assert_ok(&h.hook("dh", "prepare", &domain("dh", 1, &gpus(""))));
}

#[test]
fn every_request_source_names_host() {
    let h = Host::new(FakeHost::blueprint());
    h.with_host_driver(HOST_V);
    // XML attribute (checked as libvirt runs it), gpuhook check.
    let xml = domain("ds", 2, &gpus(r#"driver="HOST""#));
    let o = run_with_stdin(h.cmd().args(["check", "-"]), &xml);
    assert_ok(&o);
    let t = out(&o);
    assert!(t.contains("asks for 1 GPU, driver host"), "{t}");
    assert!(
        t.contains(&format!("driver host: the host's NVIDIA driver {HOST_V}")),
        "{t}"
    );
    assert!(
        t.contains(&format!(
            "    /usr/lib/x86_64-linux-gnu/libcuda.so.{HOST_V} <- "
        )),
        "{t}"
    );
    assert!(
        t.contains(&format!(
            "  link /usr/lib/x86_64-linux-gnu/libcuda.so.1 -> libcuda.so.{HOST_V}"
        )),
        "{t}"
    );
    // An unknown driver names the known ones.
    let o = run_with_stdin(
        h.cmd().args(["check", "-"]),
        &domain("ds", 2, &gpus(r#"driver="nvidia""#)),
    );
    assert!(
        stderr(&o).contains("unknown driver 'nvidia' (known: none, cdi, host)"),
        "{}",
        stderr(&o)
    );
    // The host default.
    h.edit_config(|c| c["driver"] = serde_json::json!("host"));
    let o = run_with_stdin(h.cmd().args(["check", "-"]), &domain("ds", 2, &gpus("")));
    assert!(out(&o).contains("driver host: "), "{}", out(&o));
    // The host default and a request saying none: nodes only.
    let o = run_with_stdin(
        h.cmd().args(["check", "-"]),
        &domain("ds", 2, &gpus(r#"driver="none""#)),
    );
    assert!(!out(&o).contains("driver host"), "{}", out(&o));
}

/// The generated spec's devices by name, and its common edits.
fn names(spec: &Value) -> Vec<String> {
    spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn cdi_generate_writes_the_running_driver_and_check_finds_specs_gone_stale() {
    let (h, d) = upgraded_host();
    let etc = h.root().join("cdi/etc");
    let run = h.root().join("cdi/run");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::create_dir_all(&run).unwrap();
    h.edit_config(|c| c["cdi_spec_dirs"] = serde_json::json!([etc, run]));
    // Printed (YAML), and written atomically (JSON for a .json name).
    let o = gh(&h, &["cdi", "generate"]);
    assert_ok(&o);
    let y: Value = serde_yaml_ng::from_slice(&o.stdout).expect("YAML");
    let spec_file = run.join("gpuhook.json");
    assert_ok(&gh(
        &h,
        &["cdi", "generate", "--output", spec_file.to_str().unwrap()],
    ));
    let j: Value = serde_json::from_slice(&std::fs::read(&spec_file).unwrap()).unwrap();
    assert_eq!(j, y);
    assert_eq!(
        std::fs::read_dir(&run).unwrap().count(),
        1,
        "a temporary file left"
    );
    assert_eq!(j["cdiVersion"], "0.5.0");
    assert_eq!(j["kind"], "nvidia.com/gpu");
    let l = h.list();
    let g = l["gpus"].as_array().unwrap();
    let mut want = vec![];
    for x in g {
        want.push(x["index"].to_string());
        want.push(x["uuid"].as_str().unwrap().to_string());
    }
    want.push("all".into());
    assert_eq!(names(&j), want);
    let dev0 = &j["devices"][0]["containerEdits"]["deviceNodes"][0];
    assert_eq!(dev0["path"], "/dev/nvidia0");
    assert_eq!(
        dev0["hostPath"],
        h.paths.dev.join("nvidia0").display().to_string()
    );
    let mounts = j["containerEdits"]["mounts"].as_array().unwrap();
    assert!(mounts.iter().any(|m| m["containerPath"]
        == format!("/usr/lib/x86_64-linux-gnu/libcuda.so.{HOST_V}")
        && m["hostPath"]
            == d.root
                .join(format!("usr/lib/x86_64-linux-gnu/libcuda.so.{HOST_V}"))
                .display()
                .to_string()
        && m["options"] == serde_json::json!(["ro", "nosuid", "nodev", "bind"])));
    assert!(mounts
        .iter()
        .all(|m| !m["hostPath"].as_str().unwrap().contains(OLD)));
    let hooks = j["containerEdits"]["hooks"].as_array().unwrap();
    assert_eq!(hooks.len(), 2);
    let exe = std::fs::canonicalize(bin()).unwrap();
    assert_eq!(hooks[0]["path"], exe.display().to_string());
    assert_eq!(hooks[0]["args"][1], "cdi-hook");
    assert_eq!(hooks[0]["args"][2], "create-symlinks");
    assert_eq!(hooks[1]["args"][2], "update-ldcache");
    // gpuhook's own driver="cdi" reads it, doing the two hooks itself.
    let o = run_with_stdin(
        h.cmd().args(["check", "-"]),
        &domain("dc", 3, &gpus(r#"driver="cdi""#)),
    );
    assert_ok(&o);
    let t = out(&o);
    assert!(
        t.contains(&format!("driver cdi: from {}", spec_file.display())),
        "{t}"
    );
    assert!(
        t.contains("linker cache for /usr/lib/x86_64-linux-gnu"),
        "{t}"
    );
    assert!(!t.contains("hook createContainer"), "{t}");
    // Up to date; the vendor's spec of the old driver (nvidia-ctk's shape) is stale.
    let o = gh(&h, &["cdi", "check"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", out(&o), stderr(&o));
    assert!(
        out(&o).contains("gpuhook.json (nvidia.com/gpu): up to date"),
        "{}",
        out(&o)
    );
    let old = testbed::driver::FakeDriver {
        root: d.root.clone(),
        version: OLD.into(),
    };
    write_config(
        &etc.join("nvidia.yaml"),
        &old.nvidia_spec(&FakeHost::blueprint(), &h.paths),
    );
    let o = gh(&h, &["cdi", "check"]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    let t = out(&o);
    assert!(
        t.contains(&format!(
            "  mount {}/usr/lib/x86_64-linux-gnu/libcuda.so.{OLD} is of NVIDIA driver {OLD}, the host runs {HOST_V}",
            d.root.display()
        )),
        "{t}"
    );
    assert!(
        t.contains(&format!(
            "hook {}",
            d.root.join("usr/bin/nvidia-cdi-hook").display()
        )),
        "{t}"
    );
    assert!(t.contains("1 of 2 spec(s) stale"), "{t}");
    let j = json_of(&gh(&h, &["cdi", "check", "--json"]));
    assert_eq!(j["stale"], true);
    assert_eq!(j["driver"]["version"], HOST_V);
    let by_path = |j: &Value, p: &Path| {
        j["specs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["path"] == p.display().to_string())
            .cloned()
            .unwrap()
    };
    assert_eq!(by_path(&j, &spec_file)["stale"], false);
    assert_eq!(by_path(&j, &etc.join("nvidia.yaml"))["stale"], true);
    let m = out(&gh(&h, &["metrics"]));
    assert!(
        m.contains(&format!(
            "gpuhook_cdi_spec_stale{{spec=\"{}\"}} 1\n",
            etc.join("nvidia.yaml").display()
        )),
        "{m}"
    );
    assert!(
        m.contains(&format!(
            "gpuhook_cdi_spec_stale{{spec=\"{}\"}} 0\n",
            spec_file.display()
        )),
        "{m}"
    );
    promtool_is_silent(&m);
    // Upgraded again: the generated spec is stale too, until generated again.
    testbed::driver::FakeDriver::install_host(&d.root, HOST_V2).unwrap();
    set_module(&h.paths.proc, Some(HOST_V2), false);
    let j = json_of(&gh(&h, &["cdi", "check", "--json"]));
    let s = by_path(&j, &spec_file);
    assert_eq!(s["stale"], true, "{j:#}");
    assert!(s["entries"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["what"] == "mount"
            && e["why"] == format!("is of NVIDIA driver {HOST_V}, the host runs {HOST_V2}")));
    assert_ok(&gh(
        &h,
        &["cdi", "generate", "--output", spec_file.to_str().unwrap()],
    ));
    let j = json_of(&gh(&h, &["cdi", "check", "--json"]));
    assert_eq!(by_path(&j, &spec_file)["stale"], false, "{j:#}");
    // A GPU gone: its devices are stale.
    std::fs::remove_file(h.paths.dev.join("nvidia1")).unwrap();
    let j = json_of(&gh(&h, &["cdi", "check", "--json"]));
    let s = by_path(&j, &spec_file);
    assert!(
        s["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["what"] == "node" && e["path"].as_str().unwrap().ends_with("/nvidia1")),
        "{j:#}"
    );
}

#[test]
fn cdi_generate_names_mig_instances_by_index_and_gpu_instance() {
    let h = Host::new(FakeHost::dgx8_mig());
    h.with_host_driver(HOST_V);
    let o = gh(&h, &["cdi", "generate"]);
    assert_ok(&o);
    let y: Value = serde_yaml_ng::from_slice(&o.stdout).unwrap();
    let n = names(&y);
    let migs: Vec<&String> = n.iter().filter(|x| x.contains(':')).collect();
    assert!(!migs.is_empty(), "{n:?}");
    let l = h.list();
    for g in l["gpus"].as_array().unwrap() {
        for m in g["migs"].as_array().unwrap() {
            let name = format!("{}:{}", g["index"], m["gi"]);
            let d = y["devices"]
                .as_array()
                .unwrap()
                .iter()
                .find(|d| d["name"] == name)
                .unwrap_or_else(|| panic!("no device {name}: {n:?}"));
            let nodes: Vec<&str> = d["containerEdits"]["deviceNodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x["path"].as_str().unwrap())
                .collect();
            for want in m["nodes"].as_array().unwrap() {
                assert!(
                    nodes.contains(&want["path"].as_str().unwrap()),
                    "{name}: {nodes:?}"
                );
            }
        }
    }
    assert_eq!(n.last().unwrap(), "all");
}

#[test]
fn list_and_metrics_show_a_reservation_on_an_older_driver() {
    let h = Host::new(FakeHost::blueprint());
    let d = h.with_host_driver(HOST_V);
    let xml = domain("old1", 4, &gpus(r#"driver="host""#));
    assert_ok(&h.hook("old1", "prepare", &xml));
    let r = |l: &Value| {
        l["reservations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["domain"] == "old1")
            .cloned()
            .unwrap()
    };
    let l = h.list();
    assert_eq!(r(&l)["driver"], "host");
    assert_eq!(r(&l)["driver_version"], HOST_V);
    assert_eq!(r(&l)["driver_outdated"], false);
    // The driver upgraded.
    testbed::driver::FakeDriver::install_host(&d.root, HOST_V2).unwrap();
    set_module(&h.paths.proc, Some(HOST_V2), false);
    let l = h.list();
    assert_eq!(r(&l)["driver_version"], HOST_V);
    assert_eq!(r(&l)["driver_outdated"], true);
    let t = out(&gh(&h, &["list"]));
    assert!(
        t.contains(&format!("old1 [driver {HOST_V}, host now {HOST_V2}]")),
        "{t}"
    );
    let m = out(&gh(&h, &["metrics"]));
    assert!(
        m.contains(&format!(
            "gpuhook_container_driver_outdated{{kind=\"libvirt\",domain=\"old1\",uuid=\"{}\"}} 1\n",
            uuid(4)
        )),
        "{m}"
    );
    promtool_is_silent(&m);
    // A reservation without the driver is not listed as outdated.
    assert_ok(&h.hook("plain", "prepare", &domain("plain", 5, &gpus(""))));
    let l = h.list();
    let p = l["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["domain"] == "plain")
        .unwrap();
    assert_eq!(p["driver_outdated"], false);
    assert!(p["driver_version"].is_null());
    assert!(!out(&gh(&h, &["metrics"])).contains("domain=\"plain\""));
}

#[test]
fn amd_and_intel_gpus_get_their_nodes_as_with_none() {
    let h = Host::new(FakeHost::mixed());
    h.with_host_driver(HOST_V);
    // No NVIDIA module: an AMD or Intel request with driver="host" needs none.
    set_module(&h.paths.proc, None, false);
    for (n, vendor) in [(6, "amd"), (7, "intel")] {
        let name = format!("d{vendor}");
        let xml = domain(
            &name,
            n,
            &gpus(&format!(r#"vendor="{vendor}" driver="host""#)),
        );
        let o = run_with_stdin(h.cmd().args(["check", "-"]), &xml);
        assert_ok(&o);
        assert!(!out(&o).contains("driver host:"), "{}", out(&o));
        assert_ok(&h.hook(&name, "prepare", &xml));
        let l = h.list();
        let r = l["reservations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["domain"] == name.as_str())
            .cloned()
            .unwrap();
        assert!(r["driver_version"].is_null(), "{r}");
    }
    // An NVIDIA one does.
    assert_fails(
        &h.hook(
            "dnv",
            "prepare",
            &domain("dnv", 8, &gpus(r#"vendor="nvidia" driver="host""#)),
        ),
        "dnv",
        "no NVIDIA kernel module is loaded",
    );
}

/// The security review's crafted linker cache: `size` bytes in glibc's new format, half of
/// them entries whose name and path all point at one long string, the other half that string.
/// A reader that copies each entry's strings makes `size²/48` bytes of them (320 KB: 2 GB);
/// `gpuhook driver` runs with its address space limited to 1 GiB.
fn crafted_cache(size: usize) -> Vec<u8> {
    let n = size / 48;
    let at = 48 + n * 24;
    let long = size - at - 1;
    let mut b = b"glibc-ld.so.cache1.1".to_vec();
    b.extend((n as u32).to_le_bytes());
    b.extend(((long + 1) as u32).to_le_bytes());
    b.extend([2, 0, 0, 0]);
    b.extend([0u8; 16]);
    for _ in 0..n {
        b.extend(0x0303i32.to_le_bytes());
        b.extend((at as u32).to_le_bytes());
        b.extend((at as u32).to_le_bytes());
        b.extend([0u8; 12]);
    }
    b.push(b'/');
    b.resize(size - 1, b'a');
    b.push(0);
    b
}

#[test]
fn a_crafted_or_untrusted_linker_cache_is_refused_in_one_line_in_bounded_memory_and_time() {
    let h = Host::new(FakeHost::blueprint());
    let d = h.with_host_driver(HOST_V);
    let cache = d.root.join("etc/ld.so.cache");
    let real = std::fs::read(&cache).unwrap();
    let xml = domain("dc", 1, &gpus(r#"driver="host""#));
    for size in [320 << 10, 1 << 20] {
        std::fs::write(&cache, crafted_cache(size)).unwrap();
        let t = std::time::Instant::now();
        let o = std::process::Command::new("sh")
            .arg("-c")
            .arg("ulimit -v 1048576; exec \"$0\" driver")
            .arg(bin())
            .env("GPUHOOK_CONFIG", &h.config)
            .output()
            .expect("sh");
        let took = t.elapsed();
        assert_one_line(
            &o,
            &format!(
                "driver \"host\": linker cache {}: entry 0: its name at offset {} is longer than 4095 bytes (PATH_MAX); refusing to read it",
                cache.display(),
                48 + size / 48 * 24
            ),
        );
        assert!(took.as_secs() < 3, "{size} bytes: {took:?}");
        assert_fails(
            &h.hook("dc", "prepare", &xml),
            "dc",
            &format!("linker cache {}: entry 0", cache.display()),
        );
        assert!(h.holders().is_empty());
    }
    // The real cache, but others may write it: refused too.
    std::fs::write(&cache, &real).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_fails(
        &h.hook("dc", "prepare", &xml),
        "dc",
        &format!(
            "driver \"host\": linker cache {}: has mode 0666: group or others may write it; refusing to read it",
            cache.display()
        ),
    );
    assert!(h.holders().is_empty());
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_ok(&h.hook("dc", "prepare", &xml));
    let o = gh(&h, &["driver", "--json"]);
    assert!(json_of(&o)["files"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["found_by"] == "ld.so.cache"));
}
