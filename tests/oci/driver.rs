//! `driver="host"` under podman: containers with their own root get the running driver's
//! user space, found on the fake host (real ELF libraries with SONAMEs, an `ld.so.cache`
//! written by `ldconfig -r`, the module's version line), from every request source; a
//! container keeps its files across a driver upgrade and is listed as outdated, a new one
//! gets the new driver and nothing of the old; the refusals; `gpuhook cdi generate` read by
//! podman's own CDI (`--device nvidia.com/gpu=0`); attach and detach with `--driver host`.

use super::*;
use common::{assert_host_probe, host_probe, set_module, HOST_V, HOST_V2};

/// An older driver whose files an upgrade left on the host.
const OLD: &str = "535.129.03";

/// podman's arguments asking for one GPU with the host's driver.
const HOST_ONE_GPU: [&str; 4] = [
    "--annotation",
    "gpuhook.io/gpus=1",
    "--annotation",
    "gpuhook.io/driver=host",
];

/// A host that ran driver `OLD` and was upgraded to `HOST_V` (the old driver's libraries and
/// firmware left on it), with a root filesystem for containers.
fn upgraded(o: &Oci, rootfs: &str) -> (testbed::driver::FakeDriver, PathBuf) {
    let old = o.host.with_host_driver(OLD);
    let d = testbed::driver::FakeDriver::install_host(&old.root, HOST_V).unwrap();
    set_module(&o.host.paths.proc, Some(HOST_V), false);
    let r = testbed::driver::rootfs(&o.host.root().join(rootfs)).unwrap();
    (d, r)
}

/// The annotation, the environment and the host default each ask for the host's driver: the
/// container has exactly the running driver's files (dlopen of libcuda.so.1 reports its
/// version), none of the older one's left on the host.
#[test]
fn podman_rootfs_gets_the_running_driver_from_the_host() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    let (_d, rootfs) = upgraded(&o, "host-rootfs");
    let probe = host_probe(HOST_V);
    let r = podman_rootfs(&o, &rootfs, &HOST_ONE_GPU, &probe);
    assert!(r.status.success(), "{}{}", out(&r), stderr(&r));
    assert_host_probe(&out(&r), HOST_V);
    let env = ["--env", "GPUHOOK_GPUS=1", "--env", "GPUHOOK_DRIVER=host"];
    let r = podman_rootfs(&o, &rootfs, &env, &probe);
    assert!(r.status.success(), "{}{}", out(&r), stderr(&r));
    assert_host_probe(&out(&r), HOST_V);
    o.host.edit_config(|c| c["driver"] = json!("host"));
    let r = podman_rootfs(&o, &rootfs, &["--annotation", "gpuhook.io/gpus=1"], &probe);
    assert!(r.status.success(), "{}{}", out(&r), stderr(&r));
    assert_host_probe(&out(&r), HOST_V);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// The refusals, each one line before the runtime runs, nothing reserved: no module loaded,
/// a module whose libcuda is not installed, a library group or others may write, a root whose
/// `/usr/lib` is a symlink; and an image with a block node planted where ldconfig writes
/// its cache gets a working cache, the node never written.
#[test]
fn podman_host_driver_refusals_and_a_hostile_root() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    let d = o.host.with_host_driver(HOST_V);
    let rootfs = testbed::driver::rootfs(&o.host.root().join("host-refused")).unwrap();
    set_module(&o.host.paths.proc, None, false);
    let r = podman_rootfs(&o, &rootfs, &HOST_ONE_GPU, "echo STARTED");
    assert!(!out(&r).contains("STARTED"));
    assert_refused(&r, "driver \"host\": no NVIDIA kernel module is loaded (");
    assert!(o.reservations().is_empty());
    set_module(&o.host.paths.proc, Some(HOST_V2), true);
    let r = podman_rootfs(&o, &rootfs, &HOST_ONE_GPU, "echo STARTED");
    assert_refused(&r, "but no libcuda.so.560.28.03 is installed");
    assert!(o.reservations().is_empty());
    set_module(&o.host.paths.proc, Some(HOST_V), false);
    let lib = d.root.join(format!(
        "usr/lib/x86_64-linux-gnu/libcudadebugger.so.{HOST_V}"
    ));
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o664)).unwrap();
    let r = podman_rootfs(&o, &rootfs, &HOST_ONE_GPU, "echo STARTED");
    assert_refused(
        &r,
        &format!(
            "{} has mode 0664: group or others may write it",
            lib.display()
        ),
    );
    assert!(o.reservations().is_empty());
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o644)).unwrap();
    // A hostile root: /usr/lib a symlink to a directory of its own.
    let evil = testbed::driver::rootfs(&o.host.root().join("host-evil")).unwrap();
    std::fs::create_dir_all(evil.join("elsewhere")).unwrap();
    std::fs::remove_dir_all(evil.join("usr/lib")).unwrap();
    std::os::unix::fs::symlink("/elsewhere", evil.join("usr/lib")).unwrap();
    let r = podman_rootfs(&o, &evil, &HOST_ONE_GPU, "echo STARTED");
    assert!(!out(&r).contains("STARTED"));
    assert_refused(&r, "container /usr/lib is a symlink; refusing to follow it");
    assert!(std::fs::read_dir(evil.join("elsewhere"))
        .unwrap()
        .next()
        .is_none());
    assert!(o.reservations().is_empty());
    // A planted block node at ldconfig's temporary cache.
    let lo = common::PlantedLoop::new(o.host.root());
    lo.plant(&rootfs.join("etc/ld.so.cache~"));
    let r = podman_rootfs(&o, &rootfs, &HOST_ONE_GPU, &host_probe(HOST_V));
    assert!(r.status.success(), "{}{}", out(&r), stderr(&r));
    assert_host_probe(&out(&r), HOST_V);
    assert!(lo.untouched(), "ldconfig wrote through the planted node");
    assert!(o.reservations().is_empty());
}

/// A container runs while the driver is upgraded under it: it keeps its files (dlopen still
/// reports the old version), `list` and the metrics say it runs on the old driver; a new
/// container gets the new driver and nothing of the old; removing the first frees it.
#[test]
fn podman_container_keeps_its_driver_across_an_upgrade() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    let (d, rootfs) = upgraded(&o, "host-upgrade");
    let name = "gh-oci-host-up";
    podman_rm(name);
    let r = o
        .podman_with(
            Cgroup::V1,
            o.runtime.as_os_str(),
            &rootfs,
            &[&["-d", "--name", name][..], &HOST_ONE_GPU].concat(),
            "sleep 600",
        )
        .output()
        .unwrap();
    assert_ok(&r);
    let id = out(&r).trim().to_string();
    let mine = |l: &Value| {
        l["reservations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["domain"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("no reservation of {id}: {l:#}"))
    };
    let l = o.host.list();
    assert_eq!(mine(&l)["driver"], "host");
    assert_eq!(mine(&l)["driver_version"], HOST_V);
    assert_eq!(mine(&l)["driver_outdated"], false);
    // A second GPU by attach --driver host: its node; its files came with its create (the
    // runtime's mounts), none mounted twice; its detach leaves them.
    let libcuda = |id: &str| {
        out(&podman_exec(id, "cat /proc/1/mounts"))
            .lines()
            .filter(|l| l.contains(&format!(" /usr/lib/x86_64-linux-gnu/libcuda.so.{HOST_V} ")))
            .count()
    };
    assert_eq!(libcuda(&id), 1);
    let gh = |args: &[&str]| o.host.cmd().args(args).output().unwrap();
    assert_ok(&gh(&[
        "attach",
        &id,
        "--driver",
        "host",
        "--device",
        "0000:08:00.0",
    ]));
    assert_eq!(libcuda(&id), 1);
    assert_ok(&gh(&["detach", &id, "--device", "0000:08:00.0"]));
    assert_eq!(libcuda(&id), 1);
    let r = podman_exec(&id, "cuda-probe");
    assert!(out(&r).contains("dlopen libcuda.so.1: ok"), "{}", out(&r));
    // The upgrade: the new driver installed beside, its module loaded.
    testbed::driver::FakeDriver::install_host(&d.root, HOST_V2).unwrap();
    set_module(&o.host.paths.proc, Some(HOST_V2), false);
    let l = o.host.list();
    assert_eq!(mine(&l)["driver_version"], HOST_V);
    assert_eq!(mine(&l)["driver_outdated"], true);
    let t = o.host.cmd().arg("list").output().unwrap();
    assert!(
        out(&t).contains(&format!("[driver {HOST_V}, host now {HOST_V2}]")),
        "{}",
        out(&t)
    );
    let m = o.host.cmd().arg("metrics").output().unwrap();
    assert!(
        out(&m).contains(&format!(
            "gpuhook_container_driver_outdated{{kind=\"oci\",domain=\"{id}\",uuid=\"{id}\"}} 1\n"
        )),
        "{}",
        out(&m)
    );
    // More of the new driver's files would mix two drivers: refused, nothing changed.
    let a = gh(&[
        "attach",
        &id,
        "--driver",
        "host",
        "--device",
        "0000:08:00.0",
    ]);
    assert!(!a.status.success());
    assert!(
        stderr(&a).contains(&format!(
            "its driver files are of NVIDIA driver {HOST_V}, the host runs {HOST_V2} now"
        )),
        "{}",
        stderr(&a)
    );
    assert_eq!(o.host.holders()[&id], ["0000:07:00.0"]);
    // Nothing taken from it: its files, its cache, its programs.
    let r = podman_exec(&id, &host_probe(HOST_V));
    assert_host_probe(&out(&r), HOST_V);
    // A new container gets the new driver only.
    let r = podman_rootfs(
        &o,
        &testbed::driver::rootfs(&o.host.root().join("host-upgrade2")).unwrap(),
        &[
            "--annotation",
            "gpuhook.io/devices=1",
            "--annotation",
            "gpuhook.io/driver=host",
        ],
        &host_probe(HOST_V2).replace("GPU 0:", "GPU 1:"),
    );
    assert!(r.status.success(), "{}{}", out(&r), stderr(&r));
    let s = out(&r).replace("GPU 1: /dev/nvidia1", "GPU 0: /dev/nvidia0");
    assert_host_probe(&s, HOST_V2);
    podman_rm(&id);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// Runs `podman` (plain runc, no gpuhook-runtime) in a private mount namespace whose `/etc`
/// is an overlay with `spec` at `/etc/cdi/nvidia.json`: podman 4.3 reads CDI specs from
/// `/etc/cdi` and `/var/run/cdi` only, and the host's `/etc` is left as it was.
fn podman_with_cdi_spec(o: &Oci, spec: &Path, args: &[&str]) -> Output {
    let ov = o.host.root().join("etc-overlay");
    let (upper, work) = (ov.join("upper"), ov.join("work"));
    std::fs::create_dir_all(upper.join("cdi")).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    std::fs::copy(spec, upper.join("cdi/nvidia.json")).unwrap();
    let script = format!(
        "mount -t overlay overlay -o lowerdir=/etc,upperdir={},workdir={} /etc && exec podman \"$@\"",
        upper.display(),
        work.display()
    );
    Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            "sh",
        ])
        .args(args)
        .output()
        .unwrap()
}

/// The spec `gpuhook cdi generate` writes, read by podman's own CDI support: `podman run
/// --device nvidia.com/gpu=0` (runc, no gpuhook-runtime) gets GPU 0's node, the driver's
/// files, and (its hooks run `gpuhook cdi-hook`) the links and linker cache: dlopen of
/// libcuda.so.1 works and reports the running driver. The host's /etc/cdi is never written.
#[test]
fn podman_reads_the_spec_cdi_generate_writes() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    let (_d, rootfs) = upgraded(&o, "host-cdi-gen");
    let spec = o.host.root().join("generated.json");
    let g = o
        .host
        .cmd()
        .args(["cdi", "generate", "--output", spec.to_str().unwrap()])
        .output()
        .unwrap();
    assert_ok(&g);
    let etc_cdi_before = std::fs::symlink_metadata("/etc/cdi").is_ok();
    let script = format!("{}\nls /dev", host_probe(HOST_V));
    let rootfs_s = rootfs.to_str().unwrap().to_string();
    let r = podman_with_cdi_spec(
        &o,
        &spec,
        &[
            "--runtime",
            RUNC,
            "run",
            "--rm",
            "--network",
            "none",
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
            "--device",
            "nvidia.com/gpu=0",
            "--rootfs",
            &rootfs_s,
            "sh",
            "-c",
            &script,
        ],
    );
    let s = out(&r);
    assert!(r.status.success(), "{s}{}", stderr(&r));
    assert_host_probe(&s, HOST_V);
    assert!(s.lines().any(|l| l == "nvidiactl"), "{s}");
    assert!(!s.lines().any(|l| l == "nvidia1"), "{s}");
    assert_eq!(
        std::fs::symlink_metadata("/etc/cdi").is_ok(),
        etc_cdi_before
    );
    // Not through gpuhook's pool: nothing reserved.
    assert!(o.reservations().is_empty());
}

/// The driver's mounts (`/proc/1/mounts` in the container) of libcuda of `v` and nvidia-smi.
fn host_driver_mounts(id: &str, v: &str) -> Vec<String> {
    let r = podman_exec(id, "cat /proc/1/mounts");
    out(&r)
        .lines()
        .filter(|l| l.contains(&format!("libcuda.so.{v} ")) || l.contains("/usr/bin/nvidia-smi "))
        .map(str::to_owned)
        .collect()
}

/// A running podman container with its own root and no GPU gets one by `gpuhook attach
/// --driver host`: the running driver's files, links and linker cache inside; a second GPU
/// adds its node only; detach of one keeps the files the other needs, detach of the last
/// takes them out.
#[test]
fn oci_attach_host_driver_into_a_running_podman_container() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    let (_d, rootfs) = upgraded(&o, "host-hp");
    let name = "gh-oci-hphost";
    podman_rm(name);
    let r = o
        .podman_with(
            Cgroup::V1,
            o.runtime.as_os_str(),
            &rootfs,
            &["-d", "--name", name],
            "sleep 600",
        )
        .output()
        .unwrap();
    assert_ok(&r);
    let id = out(&r).trim().to_string();
    assert!(host_driver_mounts(&id, HOST_V).is_empty());
    let attach = |dev: &str| {
        let a = o
            .host
            .cmd()
            .args(["attach", &id, "--driver", "host", "--device", dev])
            .output()
            .unwrap();
        assert_ok(&a);
    };
    attach("0000:07:00.0");
    let r = podman_exec(&id, &host_probe(HOST_V));
    assert_host_probe(&out(&r), HOST_V);
    let mounts = host_driver_mounts(&id, HOST_V);
    assert_eq!(mounts.len(), 2, "{mounts:?}");
    attach("0000:08:00.0");
    assert_eq!(host_driver_mounts(&id, HOST_V), mounts);
    let detach = |dev: &str| {
        let r = o
            .host
            .cmd()
            .args(["detach", &id, "--device", dev])
            .output()
            .unwrap();
        assert_ok(&r);
    };
    detach("0000:07:00.0");
    assert_eq!(host_driver_mounts(&id, HOST_V), mounts);
    let r = podman_exec(&id, "cuda-probe");
    assert!(
        out(&r).contains(&format!("driver version: {HOST_V}")),
        "{}",
        out(&r)
    );
    detach("0000:08:00.0");
    assert!(host_driver_mounts(&id, HOST_V).is_empty());
    let ls = podman_exec(&id, "ls /usr/lib/x86_64-linux-gnu/");
    assert!(!out(&ls).contains("libcuda"), "{}", out(&ls));
    podman_rm(&id);
    assert!(o.reservations().is_empty(), "{:?}", o.reservations());
}

/// Issue 39 with the real parts: stock `nvidia-persistenced --user nvidia-persistenced`
/// (its directory and socket the account's) and `driver_socket_owners` naming it. The
/// account swaps its socket for a link to docker's root socket after gpuhook checked it and
/// before runc mounts it (the runtime gpuhook runs is a script that makes the swap, then
/// runs runc). Inside the podman container `/run/nvidia-persistenced/socket` still reaches
/// persistenced: runc mounted gpuhook's own link to the socket checked.
#[test]
fn podman_gets_the_socket_checked_though_the_account_swaps_it_before_the_mount() {
    let o = Oci::new(FakeHost::blueprint(), RUNC);
    let d = o.host.with_host_driver(HOST_V);
    common::serve(
        d.persistenced_as("nvidia-persistenced", 999).unwrap(),
        "persistenced",
    );
    let decoy = d.root.join("run/docker.sock");
    common::serve(testbed::driver::listen(&decoy).unwrap(), "docker");
    let sock = d.root.join("run/nvidia-persistenced/socket");
    let swap = o.host.root().join("swap-then-runc");
    std::fs::write(
        &swap,
        format!(
            "#!/bin/sh\nS={}\nif [ -S \"$S\" ] && [ ! -L \"$S\" ]; then mv \"$S\" \"$S.real\" && ln -s {} \"$S\"; fi\nexec {RUNC} \"$@\"\n",
            sock.display(),
            decoy.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&swap, std::fs::Permissions::from_mode(0o755)).unwrap();
    o.host.edit_config(|c| {
        c["oci_runtime"] = json!(swap);
        c["driver_socket_owners"] = json!(["nvidia-persistenced"]);
    });
    let rootfs = testbed::driver::rootfs(&o.host.root().join("host-socket")).unwrap();
    common::sock_probe(&rootfs);
    let r = podman_rootfs(
        &o,
        &rootfs,
        &HOST_ONE_GPU,
        "sock-probe /run/nvidia-persistenced/socket; grep ' /run/nvidia-persistenced/socket ' /proc/1/mounts",
    );
    let s = out(&r);
    assert!(r.status.success(), "{s}{}", stderr(&r));
    assert!(s.contains("reached persistenced\n"), "{s}");
    assert!(!s.contains("docker"), "{s}");
    assert!(s.contains(" ro,nosuid,nodev,noexec"), "{s}");
    // The swap was made before runc mounted: a mount by path would have given docker's.
    assert!(std::fs::symlink_metadata(&sock)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(o.reservations().is_empty());
}
