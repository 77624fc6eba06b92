//! gpuhook's cost, as whole-process latency, against baselines measured in the same run:
//! a static no-op (`int main(){return 0;}`, `gcc -static`) started the same way, and the
//! hand-written shell hook `hooks/lxc-shell-baseline.sh` doing the same work.
//!
//! Run with `make bench` (benches/run.sh builds the static hook and the no-op, then
//! `cargo bench --bench hook`). Needs root (fake hosts with mknod, a tmpfs for the state,
//! a real libvirtd for `started`). Prints a Markdown report; no assertion on time.

use gpuhook::procfs::ProcRef;
use gpuhook::state::{Phase, Reservation, Store};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use testbed::{Daemon, DomainSpec, FakeHost, Hook};

struct Sample {
    wall: Duration,
    maxrss_kb: i64,
    ok: bool,
    err: String,
}

/// Spawns, feeds stdin, waits with wait4 for the child's peak RSS.
fn run(bin: &Path, args: &[&str], env: &[(&str, &Path)], stdin: &[u8]) -> Sample {
    let t = Instant::now();
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn");
    {
        let mut si = child.stdin.take().expect("stdin");
        let _ = si.write_all(stdin);
    }
    let mut status = 0;
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child, with valid out-pointers.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    let wall = t.elapsed();
    assert!(r > 0, "wait4");
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    std::mem::forget(child);
    Sample {
        wall,
        maxrss_kb: ru.ru_maxrss,
        ok: libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        err,
    }
}

#[derive(Clone, Copy, Debug, serde::Serialize)]
struct Stats {
    median_us: f64,
    p90_us: f64,
    maxrss_kb: i64,
}

/// `n` timed runs, each after an untimed `setup`.
fn measure(n: usize, mut setup: impl FnMut(), mut once: impl FnMut() -> Sample) -> Stats {
    for _ in 0..n.min(20) / 4 {
        setup();
        let _ = once();
    }
    let mut walls = Vec::with_capacity(n);
    let mut rss = 0;
    for _ in 0..n {
        setup();
        let s = once();
        assert!(s.ok, "a measured run failed: {}", s.err);
        walls.push(s.wall.as_secs_f64() * 1e6);
        rss = rss.max(s.maxrss_kb);
    }
    walls.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    Stats {
        median_us: walls[n / 2],
        p90_us: walls[n * 9 / 10],
        maxrss_kb: rss,
    }
}

fn env_path(k: &str) -> PathBuf {
    PathBuf::from(
        std::env::var_os(k)
            .unwrap_or_else(|| panic!("{k} is not set: run benches/run.sh (make bench)")),
    )
}

fn domain(name: &str, n: u32, meta: &str, id: Option<i32>) -> String {
    let id = id.map(|i| format!(" id='{i}'")).unwrap_or_default();
    // As libvirt formats an LXC domain for its hook (about 1.5 KiB).
    format!(
        "<domain type='lxc'{id}>\n  <name>{name}</name>\n  <uuid>{n:08x}-0000-4000-8000-{n:012x}</uuid>\n  <metadata>\n    {meta}\n  </metadata>\n  <memory unit='KiB'>1048576</memory>\n  <currentMemory unit='KiB'>1048576</currentMemory>\n  <vcpu placement='static'>2</vcpu>\n  <resource>\n    <partition>/machine</partition>\n  </resource>\n  <os>\n    <type arch='x86_64'>exe</type>\n    <init>/sbin/init</init>\n  </os>\n  <clock offset='utc'/>\n  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>restart</on_reboot>\n  <on_crash>destroy</on_crash>\n  <devices>\n    <emulator>/usr/lib/libvirt/libvirt_lxc</emulator>\n    <filesystem type='mount' accessmode='passthrough'>\n      <source dir='/var/lib/lxc/{name}/rootfs'/>\n      <target dir='/'/>\n    </filesystem>\n    <interface type='network'>\n      <mac address='52:54:00:4a:1b:2c'/>\n      <source network='default'/>\n    </interface>\n    <console type='pty'>\n      <target type='lxc' port='0'/>\n    </console>\n  </devices>\n</domain>\n"
    )
}

struct Host {
    config: PathBuf,
    state: PathBuf,
    dev: PathBuf,
    sh_state: PathBuf,
}

fn host(work: &Path, name: &str, fake: FakeHost) -> Host {
    let dir = work.join(name);
    let p = fake.create(&dir).expect("fake host");
    let state = work.join("run").join(name).join("state.json");
    let config = dir.join("config.json");
    std::fs::write(&config, p.config(&state).to_string()).unwrap();
    Host {
        config,
        state,
        dev: p.dev,
        sh_state: work.join("run").join(name).join("sh-state"),
    }
}

/// `n` reservations of other domains on PCI addresses the host lacks, held by a live
/// process (never stale), so they only cost parsing and writing.
fn bulk(h: &Host, n: u32) {
    let me = ProcRef::of(std::process::id() as i32).unwrap();
    Store::new(&h.state)
        .update(|st| {
            for i in 0..n {
                let u = format!("{:08x}-1111-4000-8000-{i:012x}", 0xb0b0_0000u32 + i);
                st.reservations.insert(
                    u.clone(),
                    Reservation {
                        domain: format!("bulk{i}"),
                        uuid: u,
                        gpus: vec![format!("0001:{:02x}:{:02x}.0", i / 32, i % 32)],
                        phase: Phase::Running,
                        request: "1 GPU".into(),
                        created: gpuhook::state::now_rfc3339(),
                        updated: gpuhook::state::now_rfc3339(),
                        prepared_by: None,
                        controller: Some(1),
                        init: Some(me),
                        nodes: vec![],
                    },
                );
            }
            Ok::<_, gpuhook::Error>(())
        })
        .unwrap();
}

struct Report {
    rows: Vec<String>,
    json: Vec<serde_json::Value>,
}

impl Report {
    fn row(&mut self, what: &str, hook: Stats, noop: Option<Stats>, shell: Option<Stats>) {
        let r = |a: f64, b: f64| format!("{:.2}×", a / b);
        self.rows.push(format!(
            "| {what} | {:.0} | {:.0} | {} | {} | {} | {} | {:.1} |",
            hook.median_us,
            hook.p90_us,
            noop.map_or("".into(), |n| format!("{:.0}", n.median_us)),
            noop.map_or("".into(), |n| r(hook.median_us, n.median_us)),
            shell.map_or("".into(), |s| format!("{:.0}", s.median_us)),
            shell.map_or("".into(), |s| r(s.median_us, hook.median_us)),
            hook.maxrss_kb as f64 / 1024.0,
        ));
        self.json
            .push(serde_json::json!({"what": what, "gpuhook": hook, "noop": noop, "shell": shell}));
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("hook: benchmark");
        return;
    }
    assert!(nix::unistd::geteuid().is_root(), "benchmarks need root");
    let hook = env_path("BENCH_HOOK");
    let noop = env_path("BENCH_NOOP");
    let shell = env_path("BENCH_SHELL");
    let n: usize = std::env::var("BENCH_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let work = PathBuf::from("/var/tmp/gpuhook-bench");
    let _ = Command::new("umount").arg(work.join("run")).status();
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(work.join("run")).unwrap();
    // The state lives in /run on a real host: a tmpfs.
    assert!(Command::new("mount")
        .args(["-t", "tmpfs", "-o", "mode=0700", "bench-run"])
        .arg(work.join("run"))
        .status()
        .unwrap()
        .success());
    let mut rep = Report {
        rows: vec![],
        json: vec![],
    };
    let meta2 = r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1" count="2"/>"#;
    let h16 = host(&work, "wide16", FakeHost::wide(16));
    let genv = |h: &Host| vec![("GPUHOOK_CONFIG", h.config.clone())];
    let senv = |h: &Host| {
        vec![
            ("GPUHOOK_SH_DEV", h.dev.clone()),
            ("GPUHOOK_SH_STATE", h.sh_state.clone()),
        ]
    };
    let args = |name: &str, op: &'static str| -> Vec<String> {
        vec![
            "hook".into(),
            name.into(),
            op.into(),
            if matches!(op, "release" | "stopped") {
                "end".into()
            } else {
                "begin".into()
            },
            "-".into(),
        ]
    };
    let go = |bin: &Path, a: &[String], env: &[(&'static str, PathBuf)], xml: &str| {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let e: Vec<(&str, &Path)> = env.iter().map(|(k, v)| (*k, v.as_path())).collect();
        run(bin, &a, &e, xml.as_bytes())
    };
    // libvirt calls hooks/lxc as `lxc NAME OP SUBOP EXTRA`: the shell and no-op get those args.
    let bare = |name: &str, op: &'static str| -> Vec<String> { args(name, op)[1..].to_vec() };

    // 1. A domain without GPU metadata (every LXC start and stop on the host).
    let plain = domain(
        "web",
        1,
        r#"<nova:instance xmlns:nova="http://openstack.org/xmlns/libvirt/nova/1.1"><nova:name>web</nova:name></nova:instance>"#,
        None,
    );
    let ge = genv(&h16);
    let se = senv(&h16);
    let s_hook = measure(n, || {}, || go(&hook, &args("web", "prepare"), &ge, &plain));
    let s_noop = measure(n, || {}, || go(&noop, &bare("web", "prepare"), &ge, &plain));
    let s_sh = measure(
        n,
        || {},
        || go(&shell, &bare("web", "prepare"), &se, &plain),
    );
    rep.row(
        "domain without GPUs (`prepare`)",
        s_hook,
        Some(s_noop),
        Some(s_sh),
    );

    // 2. prepare / release of a 2-GPU request on a 16-GPU host.
    let g2 = domain("gpu2", 2, meta2, None);
    let p_hook = measure(
        n,
        || assert!(go(&hook, &args("gpu2", "release"), &ge, &g2).ok),
        || go(&hook, &args("gpu2", "prepare"), &ge, &g2),
    );
    let p_sh = measure(
        n,
        || assert!(go(&shell, &bare("gpu2", "release"), &se, &g2).ok),
        || go(&shell, &bare("gpu2", "prepare"), &se, &g2),
    );
    let p_noop = measure(n, || {}, || go(&noop, &bare("gpu2", "prepare"), &ge, &g2));
    rep.row("`prepare`, 2 of 16 GPUs", p_hook, Some(p_noop), Some(p_sh));
    let r_hook = measure(
        n,
        || assert!(go(&hook, &args("gpu2", "prepare"), &ge, &g2).ok),
        || go(&hook, &args("gpu2", "release"), &ge, &g2),
    );
    let r_sh = measure(
        n,
        || assert!(go(&shell, &bare("gpu2", "prepare"), &se, &g2).ok),
        || go(&shell, &bare("gpu2", "release"), &se, &g2),
    );
    rep.row("`release`, 2 GPUs", r_hook, Some(p_noop), Some(r_sh));
    let _ = go(&hook, &args("gpu2", "release"), &ge, &g2);

    // 3. How cost grows: existing reservations, and GPUs on the host.
    for k in [200u32, 1000] {
        let hk = host(&work, &format!("res{k}"), FakeHost::wide(16));
        bulk(&hk, k);
        let e = genv(&hk);
        let s = measure(
            n / 2,
            || assert!(go(&hook, &args("gpu2", "release"), &e, &g2).ok),
            || go(&hook, &args("gpu2", "prepare"), &e, &g2),
        );
        rep.row(
            &format!("`prepare`, 16-GPU host, {k} reservations held"),
            s,
            Some(p_noop),
            None,
        );
    }
    let mut flat = Vec::new();
    for g in [1usize, 4, 8, 16] {
        let hg = host(&work, &format!("gpus{g}"), FakeHost::wide(g));
        let e = genv(&hg);
        let g1 = domain(
            "gpu1",
            3,
            r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"/>"#,
            None,
        );
        let s = measure(
            n,
            || assert!(go(&hook, &args("gpu1", "release"), &e, &g1).ok),
            || go(&hook, &args("gpu1", "prepare"), &e, &g1),
        );
        flat.push((g, s));
        rep.row(
            &format!("`prepare`, 1 GPU, host with {g} GPUs"),
            s,
            Some(p_noop),
            None,
        );
    }

    // 4. 64 concurrent prepares (distinct domains, 1 GPU each) on a 64-GPU host.
    let h64 = host(&work, "wide64", FakeHost::wide(64));
    let conc = |bin: &Path,
                env: &[(&'static str, PathBuf)],
                argf: &dyn Fn(&str) -> Vec<String>,
                release: bool| {
        let xmls: Vec<(String, String)> = (0..64u32)
            .map(|i| {
                (
                    format!("c{i}"),
                    domain(
                        &format!("c{i}"),
                        100 + i,
                        r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"/>"#,
                        None,
                    ),
                )
            })
            .collect();
        let t = Instant::now();
        let kids: Vec<_> = xmls
            .iter()
            .map(|(name, xml)| {
                let mut c = Command::new(bin);
                c.args(argf(name))
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                for (k, v) in env {
                    c.env(k, v);
                }
                let mut ch = c.spawn().unwrap();
                ch.stdin.take().unwrap().write_all(xml.as_bytes()).unwrap();
                ch
            })
            .collect();
        let ok = kids
            .into_iter()
            .map(|mut k| k.wait().unwrap().success())
            .filter(|b| *b)
            .count();
        let wall = t.elapsed();
        assert_eq!(ok, 64);
        if release {
            for (name, xml) in &xmls {
                let mut a = argf(name);
                let l = a.len();
                a[l - 3] = "release".into();
                a[l - 2] = "end".into();
                let a: Vec<&str> = a.iter().map(String::as_str).collect();
                let e: Vec<(&str, &Path)> = env.iter().map(|(k, v)| (*k, v.as_path())).collect();
                assert!(run(bin, &a, &e, xml.as_bytes()).ok);
            }
        }
        wall
    };
    let ge64 = genv(&h64);
    let se64 = senv(&h64);
    let mut best = (Duration::MAX, Duration::MAX);
    for _ in 0..5 {
        best.0 = best
            .0
            .min(conc(&hook, &ge64, &|n| args(n, "prepare"), true));
        best.1 = best
            .1
            .min(conc(&shell, &se64, &|n| bare(n, "prepare"), true));
    }
    let tput = format!(
        "64 concurrent `prepare`s (64-GPU host): gpuhook {:.1} ms in all ({:.0}/s, {:.0} µs per reservation under the lock), shell hook {:.1} ms ({:.0}/s): {:.1}× the throughput",
        best.0.as_secs_f64() * 1e3,
        64.0 / best.0.as_secs_f64(),
        best.0.as_secs_f64() * 1e6 / 64.0,
        best.1.as_secs_f64() * 1e3,
        64.0 / best.1.as_secs_f64(),
        best.1.as_secs_f64() / best.0.as_secs_f64()
    );

    // 5. started under a real libvirtd: device nodes + cgroup grants in a live container.
    let hl = host(&work, "lv", FakeHost::wide(16));
    let mut d = Daemon::new(&work.join("libvirt"), Hook::Binary(hook.clone())).expect("libvirtd");
    d.write_config(&serde_json::from_str(&std::fs::read_to_string(&hl.config).unwrap()).unwrap())
        .unwrap();
    d.start().expect("libvirtd start");
    let spec = DomainSpec::new("bench-started", meta2);
    d.define(&spec.xml()).unwrap();
    d.virsh_ok(&["start", "bench-started"]).unwrap();
    let live = d.virsh_ok(&["dumpxml", "bench-started"]).unwrap();
    let dom = gpuhook::metadata::parse_domain(live.as_bytes()).unwrap();
    let ct = gpuhook::container::find(&dom.name, dom.id).unwrap();
    let cg = gpuhook::cgroup::for_pid(ct.init.pid)
        .unwrap()
        .path()
        .to_path_buf();
    let le = genv(&hl);
    let lse = senv(&hl);
    assert!(go(&shell, &bare("bench-started", "prepare"), &lse, &live).ok);
    // Before each run: the container loses its nodes and grants (untimed), as at a fresh start.
    let reset = || {
        let o = Command::new("nsenter")
            .args([
                "-t",
                &ct.init.pid.to_string(),
                "-m",
                "--",
                "sh",
                "-c",
                "rm -f /dev/nvidia*",
            ])
            .status()
            .unwrap();
        assert!(o.success());
        for (ma, mi) in [(195, 0), (195, 1), (195, 255), (509, 0), (509, 1)] {
            let _ = std::fs::write(cg.join("devices.deny"), format!("c {ma}:{mi} rw"));
        }
    };
    let st_hook = measure(n / 2, reset, || {
        go(&hook, &args("bench-started", "started"), &le, &live)
    });
    let st_sh = measure(n / 4, reset, || {
        go(&shell, &bare("bench-started", "started"), &lse, &live)
    });
    let st_noop = measure(
        n / 2,
        || {},
        || go(&noop, &bare("bench-started", "started"), &le, &live),
    );
    rep.row(
        "`started`: 5 nodes + 5 grants in a live container",
        st_hook,
        Some(st_noop),
        Some(st_sh),
    );
    d.cleanup("bench-");
    d.stop().unwrap();

    let size = std::fs::metadata(&hook).unwrap().len();
    let rss = rep
        .json
        .iter()
        .filter_map(|j| j["gpuhook"]["maxrss_kb"].as_i64())
        .max()
        .unwrap_or(0);
    let flat_ratio = flat.last().unwrap().1.median_us / flat[0].1.median_us;
    println!("\n## Results ({n} runs per row; µs; medians unless noted)\n");
    println!("| what | gpuhook median | p90 | static no-op | gpuhook ÷ no-op | shell hook | shell ÷ gpuhook | gpuhook peak RSS MiB |");
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rep.rows {
        println!("{r}");
    }
    println!("\n- {tput}");
    println!("- cost in the number of GPUs: 16-GPU host ÷ 1-GPU host = {flat_ratio:.2}×");
    println!(
        "- peak RSS of any gpuhook run: {:.2} MiB; static binary: {:.2} MiB ({size} bytes)",
        rss as f64 / 1024.0,
        size as f64 / 1048576.0
    );
    let out = serde_json::json!({"iterations": n, "rows": rep.json, "concurrent": tput, "flat_16_vs_1": flat_ratio, "binary_bytes": size, "peak_rss_kb": rss});
    std::fs::create_dir_all("target/bench").unwrap();
    std::fs::write(
        "target/bench/results.json",
        serde_json::to_vec_pretty(&out).unwrap(),
    )
    .unwrap();
    let _ = Command::new("umount").arg(work.join("run")).status();
    let _ = std::fs::remove_dir_all(&work);
}
