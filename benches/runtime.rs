//! gpuhook-runtime's cost, against baselines measured in the same run, interleaved:
//!
//! 1. the wrapper alone: `create` through gpuhook-runtime vs the "real runtime" called
//!    directly, where the real runtime is a static no-op (so the difference is the
//!    wrapper's own work: the config read, and with a request the reservation and the
//!    `config.json` rewrite), with and without a request;
//! 2. the same with the real runc: `create` + `delete` of a busybox bundle, direct vs
//!    through the wrapper with a request;
//! 3. `podman run --rm` of a busybox rootfs (podman + runc), with one GPU vs without;
//! 4. hotplug into a running runc container, cgroup v1 and v2: `gpuhook attach` and
//!    `gpuhook detach` of one GPU vs the static no-op.
//!
//! Run with `make bench` (benches/run.sh). Needs root, runc, podman, busybox-static.
//! Prints a Markdown report; no assertion on time.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use testbed::FakeHost;

fn env_path(k: &str) -> PathBuf {
    PathBuf::from(std::env::var_os(k).unwrap_or_else(|| panic!("{k} is not set (run make bench)")))
}

/// Runs `c` to its exit (stdio to /dev/null: a created container's init keeps what it
/// inherits open until it starts), returns how long it took.
fn timed(c: &mut Command) -> Duration {
    let t = Instant::now();
    let st = c
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawn");
    let d = t.elapsed();
    assert!(st.success(), "{c:?} failed: {st}");
    d
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

struct Setup {
    dir: tempfile::TempDir,
    config: PathBuf,
    link: PathBuf,
    rootfs: PathBuf,
    /// The fake host's `/dev` (real nodes made by mknod).
    dev: PathBuf,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

fn setup(fake: FakeHost, hook: &Path) -> Setup {
    let dir = tempfile::Builder::new()
        .prefix("gpuhook-bench-rt-")
        .tempdir()
        .unwrap();
    // State and bundles live on tmpfs on a real host (/run/gpuhook; podman's and
    // containerd's bundles under /run): the same here.
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "mode=0700", "bench-rt"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(mounted.success(), "mount tmpfs");
    let paths = fake.create(&dir.path().join("host")).unwrap();
    let cfg = paths.config(&dir.path().join("run/state.json"));
    let config = dir.path().join("config.json");
    write_config(&config, &cfg);
    let link = dir.path().join("gpuhook-runtime");
    std::os::unix::fs::symlink(hook, &link).unwrap();
    let rootfs = dir.path().join("rootfs");
    for d in ["bin", "dev", "proc", "sys", "tmp", "etc"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    std::fs::copy("/usr/bin/busybox", rootfs.join("bin/busybox")).unwrap();
    for a in ["sh", "true", "ls", "sleep"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(a)).unwrap();
    }
    Setup {
        dir,
        config,
        link,
        rootfs,
        dev: paths.dev.clone(),
    }
}

fn write_config(p: &Path, v: &Value) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(p, v.to_string()).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).unwrap();
}

fn set_runtime(s: &Setup, runtime: &Path) {
    let mut c: Value = serde_json::from_slice(&std::fs::read(&s.config).unwrap()).unwrap();
    c["oci_runtime"] = json!(runtime);
    write_config(&s.config, &c);
}

/// A bundle from `runc spec`, running `true`, with these annotations.
fn bundle(s: &Setup, name: &str, annotations: Value) -> (PathBuf, Vec<u8>) {
    let b = s.dir.path().join(name);
    std::fs::create_dir_all(&b).unwrap();
    let o = Command::new("runc")
        .args(["spec", "--bundle"])
        .arg(&b)
        .output()
        .unwrap();
    assert!(o.status.success());
    let p = b.join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    c["root"] = json!({"path": s.rootfs, "readonly": true});
    c["process"]["terminal"] = json!(false);
    c["process"]["args"] = json!(["true"]);
    c["annotations"] = annotations;
    let bytes = serde_json::to_vec_pretty(&c).unwrap();
    std::fs::write(&p, &bytes).unwrap();
    (b, bytes)
}

fn main() {
    // `cargo bench` passes --bench; nothing to filter.
    let hook = env_path("BENCH_HOOK");
    let noop = env_path("BENCH_NOOP");
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    println!("## gpuhook-runtime (interleaved, medians)\n");

    // 1. The wrapper alone, over a no-op runtime.
    let s = setup(FakeHost::blueprint(), &hook);
    set_runtime(&s, &noop);
    let (plain, _) = bundle(&s, "plain", json!({"org.example/x": "1"}));
    let (gpu, gpu_bytes) = bundle(&s, "gpu", json!({"gpuhook.io/gpus": "1"}));
    let wrapper = |b: &Path, id: &str, cmd: &str| {
        let mut c = Command::new(&s.link);
        c.env("GPUHOOK_CONFIG", &s.config)
            .args(["--root", "/run/gpuhook-bench", cmd, "--bundle"])
            .arg(b)
            .arg(id);
        c
    };
    let (mut direct, mut pass, mut req) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        direct.push(timed(
            Command::new(&noop)
                .args(["--root", "/run/gpuhook-bench", "create", "--bundle"])
                .arg(&plain)
                .arg("c"),
        ));
        pass.push(timed(&mut wrapper(&plain, "c", "create")));
        std::fs::write(gpu.join("config.json"), &gpu_bytes).unwrap();
        let id = format!("bench-{i}");
        req.push(timed(&mut wrapper(&gpu, &id, "create")));
        // Untimed: the delete frees the reservation (the no-op made no container).
        timed(&mut wrapper(&gpu, &id, "delete"));
    }
    let (d, p, r) = (median(&mut direct), median(&mut pass), median(&mut req));
    println!("Over a static no-op runtime, {n} rounds (the wrapper's own cost):\n");
    println!("| `create` | median ms | over the runtime alone |");
    println!("|---|---|---|");
    println!("| the runtime called directly | {} | — |", ms(d));
    println!(
        "| gpuhook-runtime, bundle without a request | {} | +{} ms |",
        ms(p),
        ms(p.saturating_sub(d))
    );
    println!(
        "| gpuhook-runtime, bundle asking for 1 GPU (reserve + config.json rewrite) | {} | +{} ms |",
        ms(r),
        ms(r.saturating_sub(d))
    );
    // 1b. This build against another (`BENCH_BASELINE`): both wrappers in turn.
    if let Some(base) = std::env::var_os("BENCH_BASELINE") {
        // Both binaries copied afresh side by side (on the tmpfs): a binary the linker
        // wrote starts measurably slower than a copy of itself on this kernel (its page cache
        // in small folios), which an A/A run of one build against its copy shows (1.12-1.19×).
        let place = |from: &Path, sub: &str| {
            let dir = s.dir.path().join(sub);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::copy(from, dir.join("gpuhook")).unwrap();
            let link = dir.join("gpuhook-runtime");
            std::os::unix::fs::symlink(dir.join("gpuhook"), &link).unwrap();
            link
        };
        let base_link = place(Path::new(&base), "baseline");
        let this_link = place(&hook, "this");
        let run = |link: &Path, b: &Path, id: &str, cmd: &str| {
            let mut c = Command::new(link);
            c.env("GPUHOOK_CONFIG", &s.config)
                .args(["--root", "/run/gpuhook-bench", cmd, "--bundle"])
                .arg(b)
                .arg(id);
            c
        };
        let (mut bp, mut tp, mut br, mut tr) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for i in 0..n {
            // Each first in turn: neither gains from what the other left warm.
            let mut pair = [
                (&base_link, &mut bp, &mut br),
                (&this_link, &mut tp, &mut tr),
            ];
            if i % 2 == 1 {
                pair.reverse();
            }
            for (link, pass, req) in pair {
                pass.push(timed(&mut run(link, &plain, "c", "create")));
                std::fs::write(gpu.join("config.json"), &gpu_bytes).unwrap();
                let id = format!("ab-{i}");
                req.push(timed(&mut run(link, &gpu, &id, "create")));
                timed(&mut run(link, &gpu, &id, "delete"));
            }
        }
        let row = |what: &str, b: &mut [Duration], t: &mut [Duration]| {
            let (b, t) = (median(b), median(t));
            println!(
                "| {what} | {} | {} | {:.2}× |",
                ms(b),
                ms(t),
                t.as_secs_f64() / b.as_secs_f64()
            );
        };
        println!(
            "\nThis build against {} (`BENCH_BASELINE`), in turn, {n} rounds:\n",
            Path::new(&base).display()
        );
        println!(
            "| `create` over the no-op runtime | baseline ms | this build ms | this ÷ baseline |"
        );
        println!("|---|---|---|---|");
        row("bundle without a request", &mut bp, &mut tp);
        row("bundle asking for 1 GPU", &mut br, &mut tr);
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("startup") {
        return;
    }

    // 2. Real runc: create + delete.
    let runc = PathBuf::from("/usr/sbin/runc");
    set_runtime(&s, &runc);
    let rounds = (n / 4).max(10);
    let (mut rd, mut rw) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let id = format!("rd-{i}");
        let t = Instant::now();
        timed(
            Command::new(&runc)
                .args(["--root", "/run/gpuhook-bench", "create", "--bundle"])
                .arg(&plain)
                .arg(&id),
        );
        timed(Command::new(&runc).args(["--root", "/run/gpuhook-bench", "delete", "--force", &id]));
        rd.push(t.elapsed());
        std::fs::write(gpu.join("config.json"), &gpu_bytes).unwrap();
        let id = format!("rw-{i}");
        let t = Instant::now();
        timed(&mut wrapper(&gpu, &id, "create"));
        let mut del = Command::new(&s.link);
        del.env("GPUHOOK_CONFIG", &s.config).args([
            "--root",
            "/run/gpuhook-bench",
            "delete",
            "--force",
            &id,
        ]);
        timed(&mut del);
        rw.push(t.elapsed());
    }
    let (a, b) = (median(&mut rd), median(&mut rw));
    println!(
        "\nWith runc 1.1 (`create` + `delete --force` of a busybox bundle), {rounds} rounds:\n"
    );
    println!("| | median ms |");
    println!("|---|---|");
    println!("| runc directly, no GPU | {} |", ms(a));
    println!(
        "| gpuhook-runtime → runc, 1 GPU (nodes, rules, two hooks) | {} (+{} ms, {:.2}×) |",
        ms(b),
        ms(b.saturating_sub(a)),
        b.as_secs_f64() / a.as_secs_f64()
    );

    // 3. podman run --rm.
    let script = s.dir.path().join("runtime.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nGPUHOOK_CONFIG={} exec {} \"$@\"\n",
            s.config.display(),
            s.link.display()
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // Four kinds of run, one of each per round: runc directly; runc directly with the GPU's
    // node handed in by podman itself (`--device`: the node and its rule, podman's and runc's
    // own work); through gpuhook-runtime without a request; through it with one GPU. The
    // last minus the third is what a GPU costs through gpuhook; minus the second's extra,
    // what of it is gpuhook's own (reservation, bundle edit, its two hooks).
    let node = std::fs::read_dir(&s.dev)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.strip_prefix("nvidia")
                    .is_some_and(|d| d.parse::<u32>().is_ok())
            })
        })
        .expect("a GPU node in the fake host");
    // podman passes the runtime no environment of its own: the wrapper gets its config
    // through a shell script (`runtime.sh`), so runc is also measured through one.
    let runc_sh = s.dir.path().join("runc.sh");
    std::fs::write(
        &runc_sh,
        format!("#!/bin/sh\nexec {} \"$@\"\n", runc.display()),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&runc_sh, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    #[derive(Clone, Copy)]
    enum Kind {
        Runc,
        RuncDevice,
        Wrapper,
        WrapperGpu,
    }
    let podman = |k: Kind| {
        let mut c = Command::new("podman");
        match k {
            Kind::Runc | Kind::RuncDevice => c.arg("--runtime").arg(&runc_sh),
            Kind::Wrapper | Kind::WrapperGpu => c.arg("--runtime").arg(&script),
        };
        c.args([
            "run",
            "--rm",
            "--network",
            "none",
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
        ]);
        match k {
            Kind::WrapperGpu => {
                c.args(["--annotation", "gpuhook.io/gpus=1"]);
            }
            Kind::RuncDevice => {
                c.arg("--device")
                    .arg(format!("{}:/dev/nvidia0:rw", node.display()));
            }
            _ => {}
        }
        c.arg("--rootfs").arg(&s.rootfs).arg("true");
        c
    };
    let kinds = [
        Kind::Runc,
        Kind::RuncDevice,
        Kind::Wrapper,
        Kind::WrapperGpu,
    ];
    let rounds = (n / 4).max(10);
    let mut t: Vec<Vec<Duration>> = vec![Vec::new(); kinds.len()];
    for k in kinds {
        timed(&mut podman(k));
    }
    for _ in 0..rounds {
        for (i, k) in kinds.iter().enumerate() {
            t[i].push(timed(&mut podman(*k)));
        }
    }
    let m: Vec<Duration> = t.iter_mut().map(|v| median(v)).collect();
    let d = |a: Duration, b: Duration| (b.as_secs_f64() - a.as_secs_f64()) * 1000.0;
    println!("\n`podman run --rm` (podman 4.3 + runc 1.1, busybox rootfs), {rounds} rounds, the four kinds in turn:\n");
    println!("| | median ms | |");
    println!("|---|---|---|");
    println!(
        "| runc (through `exec runc` in a shell script, as the wrapper is) | {} | |",
        ms(m[0])
    );
    println!(
        "| runc, the GPU's node by podman `--device` | {} | {:+.1} ms: the node and its rule (podman's and runc's work) |",
        ms(m[1]),
        d(m[0], m[1])
    );
    println!(
        "| through gpuhook-runtime, no request | {} | {:+.1} ms over runc: the wrapper |",
        ms(m[2]),
        d(m[0], m[2])
    );
    println!(
        "| through gpuhook-runtime, 1 GPU | {} | {:+.1} ms over no request; of it gpuhook's own (less the `--device` row's extra): {:+.1} ms |",
        ms(m[3]),
        d(m[2], m[3]),
        d(m[2], m[3]) - d(m[0], m[1])
    );

    // 4. Hotplug into a running runc container (found through runc's state).
    hotplug(&s, &hook, &noop, &runc, (n / 4).max(10));
}

/// `gpuhook attach` (reserve + grant + node) and `gpuhook detach` (revoke + node removed +
/// free) of one GPU into a running runc container, on cgroup v1 (`devices.allow`) and v2
/// (runc's device program replaced), interleaved with the static no-op.
fn hotplug(s: &Setup, hook: &Path, noop: &Path, runc: &Path, rounds: usize) {
    let mut c: Value = serde_json::from_slice(&std::fs::read(&s.config).unwrap()).unwrap();
    c["oci_state_roots"] = json!(["/run/gpuhook-bench"]);
    write_config(&s.config, &c);
    println!("\nHotplug of 1 GPU into a running runc container, {rounds} rounds:\n");
    println!("| | median ms | over the no-op |");
    println!("|---|---|---|");
    for v2 in [false, true] {
        let id = format!("hp-v{}", if v2 { 2 } else { 1 });
        let (b, _) = bundle(s, &id, json!({}));
        let p = b.join("config.json");
        let mut c: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        c["process"]["args"] = json!(["sleep", "600"]);
        std::fs::write(&p, serde_json::to_vec(&c).unwrap()).unwrap();
        let mut run = if v2 {
            // runc on a cgroup2-only /sys/fs/cgroup, in a mount namespace of its own.
            let mut u = Command::new("unshare");
            u.args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                "umount -R /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup && exec \"$@\"",
                "sh",
            ])
            .arg(runc);
            u
        } else {
            Command::new(runc)
        };
        run.args(["--root", "/run/gpuhook-bench", "run", "-d", "--bundle"])
            .arg(&b)
            .arg(&id);
        timed(&mut run);
        let gh = |verb: &str| {
            let mut c = Command::new(hook);
            c.env("GPUHOOK_CONFIG", &s.config)
                .args([verb, &id, "--device", "0"]);
            c
        };
        let (mut base, mut at, mut de) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            base.push(timed(Command::new(noop).args(["attach", &id])));
            at.push(timed(&mut gh("attach")));
            de.push(timed(&mut gh("detach")));
        }
        timed(Command::new(runc).args(["--root", "/run/gpuhook-bench", "delete", "--force", &id]));
        let (z, a, d) = (median(&mut base), median(&mut at), median(&mut de));
        let cg = if v2 {
            "cgroup v2, runc's program replaced"
        } else {
            "cgroup v1, devices.allow"
        };
        println!("| static no-op | {} | — |", ms(z));
        println!(
            "| `gpuhook attach` ({cg}) | {} | +{} ms ({:.2}×) |",
            ms(a),
            ms(a.saturating_sub(z)),
            a.as_secs_f64() / z.as_secs_f64()
        );
        println!(
            "| `gpuhook detach` ({cg}) | {} | +{} ms ({:.2}×) |",
            ms(d),
            ms(d.saturating_sub(z)),
            d.as_secs_f64() / z.as_secs_f64()
        );
    }
}
