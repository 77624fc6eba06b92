//! gpuhook's cost, as whole-process latency, against baselines measured in the same run:
//! a static no-op (`int main(){return 0;}`, `gcc -static`) started the same way, and the
//! hand-written shell hook `hooks/lxc-shell-baseline.sh` doing the same work.
//!
//! Run with `make bench` (benches/run.sh builds the static hook, the no-op and the RSS
//! trampoline, then `cargo bench --bench hook`). Needs root (fake hosts with mknod, a tmpfs
//! for the state, a real libvirtd for `started`). Prints a Markdown report and writes
//! target/bench/results.json; no assertion on time.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use testbed::{Daemon, DomainSpec, FakeHost, Hook};

/// One command to run: binary, arguments, environment, stdin.
#[derive(Clone)]
struct Cmd {
    bin: PathBuf,
    args: Vec<String>,
    env: Vec<(&'static str, PathBuf)>,
    stdin: String,
}

struct Sample {
    wall: Duration,
    maxrss_kb: i64,
    ok: bool,
    err: String,
}

/// Runs `c` once and waits with wait4. With `rss`, runs it through the trampoline
/// (benches/rss.c: fork, exec, wait4, print ru_maxrss): a child spawned straight from this
/// large process keeps the bench's memory high-water mark until exec, so its own ru_maxrss
/// would report the bench, not the hook.
fn run(c: &Cmd, rss: Option<&Path>) -> Sample {
    let t = Instant::now();
    let mut cmd = match rss {
        Some(tramp) => {
            let mut x = Command::new(tramp);
            x.arg(&c.bin);
            x
        }
        None => Command::new(&c.bin),
    };
    cmd.args(&c.args)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.stdout(if rss.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    for (k, v) in &c.env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn");
    {
        let mut si = child.stdin.take().expect("stdin");
        let _ = si.write_all(c.stdin.as_bytes());
    }
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value; we wait for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child, writing into two locals that outlive the call.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    let wall = t.elapsed();
    assert!(r > 0, "wait4");
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let mut maxrss_kb = -1;
    if let Some(mut o) = child.stdout.take() {
        let mut out = String::new();
        let _ = o.read_to_string(&mut out);
        maxrss_kb = out
            .lines()
            .filter_map(|l| l.strip_prefix("maxrss_kb="))
            .next_back()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(-1);
    }
    std::mem::forget(child);
    Sample {
        wall,
        maxrss_kb,
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

struct Bench {
    tramp: PathBuf,
}

impl Bench {
    /// `n` timed runs of `c`, each after an untimed `setup`, then 5 through the trampoline.
    fn measure(&self, n: usize, mut setup: impl FnMut(), c: &Cmd) -> Stats {
        for _ in 0..n.min(20) / 4 {
            setup();
            let _ = run(c, None);
        }
        let mut walls = Vec::with_capacity(n);
        for _ in 0..n {
            setup();
            let s = run(c, None);
            assert!(s.ok, "a measured run failed: {}", s.err);
            walls.push(s.wall.as_secs_f64() * 1e6);
        }
        let mut rss = 0;
        for _ in 0..5 {
            setup();
            let s = run(c, Some(&self.tramp));
            assert!(s.ok && s.maxrss_kb > 0, "an RSS run failed: {}", s.err);
            rss = rss.max(s.maxrss_kb);
        }
        walls.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
        Stats {
            median_us: walls[n / 2],
            p90_us: walls[n * 9 / 10],
            maxrss_kb: rss,
        }
    }
}

/// `n` runs of `a` and of `b` taken in turn (each after an untimed `setup`), so that what
/// the machine does meanwhile weighs on both alike: medians of `a` and `b`, in µs.
fn interleaved(n: usize, setup: impl FnMut(), a: &Cmd, b: &Cmd) -> (f64, f64) {
    let (a, b) = interleaved_stats(n, setup, a, b);
    (a.median_us, b.median_us)
}

/// [`interleaved`], with the 90th percentiles (peak RSS is left to [`Bench::measure`]).
fn interleaved_stats(n: usize, mut setup: impl FnMut(), a: &Cmd, b: &Cmd) -> (Stats, Stats) {
    let (mut wa, mut wb) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n + 4 {
        // Which goes first alternates: on this VM the second of two back-to-back process
        // runs is measurably slower (two builds that run the same instructions within 1 %
        // read 1.07–1.10× apart when always run in the same order).
        let mut round = [(a, &mut wa), (b, &mut wb)];
        if i % 2 == 1 {
            round.reverse();
        }
        for (c, w) in round {
            setup();
            let s = run(c, None);
            assert!(s.ok, "a measured run failed: {}", s.err);
            if i >= 4 {
                w.push(s.wall.as_secs_f64() * 1e6);
            }
        }
    }
    let stats = |mut v: Vec<f64>| {
        v.sort_by(|x, y| x.partial_cmp(y).expect("no NaN"));
        Stats {
            median_us: v[v.len() / 2],
            p90_us: v[v.len() * 9 / 10],
            maxrss_kb: -1,
        }
    };
    (stats(wa), stats(wb))
}

/// Rows of the A/B table (`BENCH_BASELINE`): this build against another gpuhook binary.
#[derive(Default)]
struct Ab {
    rows: Vec<String>,
}

impl Ab {
    fn row(&mut self, what: &str, (base, this): (f64, f64)) {
        self.rows.push(format!(
            "| {what} | {base:.0} | {this:.0} | {:.2}× |",
            this / base
        ));
    }
}

fn env_path(k: &str) -> PathBuf {
    PathBuf::from(
        std::env::var_os(k)
            .unwrap_or_else(|| panic!("{k} is not set: run benches/run.sh (make bench)")),
    )
}

/// A domain XML as libvirt formats an LXC domain for its hook (about 1.5 KiB).
fn domain(name: &str, n: u32, meta: &str, id: Option<i32>) -> String {
    let id = id.map(|i| format!(" id='{i}'")).unwrap_or_default();
    format!(
        "<domain type='lxc'{id}>\n  <name>{name}</name>\n  <uuid>{n:08x}-0000-4000-8000-{n:012x}</uuid>\n  <metadata>\n    {meta}\n  </metadata>\n  <memory unit='KiB'>1048576</memory>\n  <currentMemory unit='KiB'>1048576</currentMemory>\n  <vcpu placement='static'>2</vcpu>\n  <resource>\n    <partition>/machine</partition>\n  </resource>\n  <os>\n    <type arch='x86_64'>exe</type>\n    <init>/sbin/init</init>\n  </os>\n  <clock offset='utc'/>\n  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>restart</on_reboot>\n  <on_crash>destroy</on_crash>\n  <devices>\n    <emulator>/usr/lib/libvirt/libvirt_lxc</emulator>\n    <filesystem type='mount' accessmode='passthrough'>\n      <source dir='/var/lib/lxc/{name}/rootfs'/>\n      <target dir='/'/>\n    </filesystem>\n    <interface type='network'>\n      <mac address='52:54:00:4a:1b:2c'/>\n      <source network='default'/>\n    </interface>\n    <console type='pty'>\n      <target type='lxc' port='0'/>\n    </console>\n  </devices>\n</domain>\n"
    )
}

/// A Nova instance's domain (tests/fixtures/nova-lxc-domain.xml: Nova 34's metadata as
/// libvirt formats it) of a flavor with these extra specs.
fn nova_domain(flavor: &str, specs: &[(&str, &str)]) -> String {
    let specs: String = specs
        .iter()
        .map(|(k, v)| format!("          <nova:extraSpec name=\"{k}\">{v}</nova:extraSpec>\n"))
        .collect();
    include_str!("../tests/fixtures/nova-lxc-domain.xml")
        .replace("@FLAVOR@", flavor)
        .replace("@EXTRA_SPECS@", &specs)
}

const ONE: &str = r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"/>"#;
const TWO: &str = r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1" count="2"/>"#;
const MIG_ONE: &str = r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1" mig="yes"/>"#;
/// PCI functions beside the GPUs on the "realistic server" row: a two-socket GPU server
/// lists 150–300 (root and switch ports, NICs, NVMe, chipset).
const OTHER_FUNCTIONS: usize = 200;

/// A fake host, with the commands of the three contenders against it.
struct Host {
    config: PathBuf,
    state: PathBuf,
    dev: PathBuf,
    sh_state: PathBuf,
}

struct Bins {
    hook: PathBuf,
    noop: PathBuf,
    shell: PathBuf,
    /// The hook binary again, as `hooks/qemu` (libvirt's QEMU hook is recognised by name).
    qemu: PathBuf,
}

impl Host {
    fn new(work: &Path, name: &str, fake: FakeHost) -> Host {
        let dir = work.join(name);
        let p = fake.create(&dir).expect("fake host");
        let state = work.join("run").join(name).join("state.json");
        let config = dir.join("config.json");
        let mut cfg = p.config(&state);
        // libvirt's QEMU status directory of this fake host: no VM runs. With a baseline
        // (BENCH_BASELINE) the config is one both builds read: the key is left out, and this
        // build looks at the default directory, as on a host (no VM runs here either).
        if std::env::var_os("BENCH_BASELINE").is_none() {
            cfg["libvirt_qemu_dir"] = serde_json::json!(dir.join("qemu"));
        }
        std::fs::write(&config, cfg.to_string()).unwrap();
        Host {
            config,
            state,
            dev: p.dev,
            sh_state: work.join("run").join(name).join("sh-state"),
        }
    }

    fn subop(op: &str) -> &'static str {
        if matches!(op, "release" | "stopped") {
            "end"
        } else {
            "begin"
        }
    }

    /// gpuhook as `gpuhook hook NAME OP SUBOP -`.
    fn hook(&self, b: &Bins, name: &str, op: &str, xml: &str) -> Cmd {
        Cmd {
            bin: b.hook.clone(),
            args: vec![
                "hook".into(),
                name.into(),
                op.into(),
                Self::subop(op).into(),
                "-".into(),
            ],
            env: vec![("GPUHOOK_CONFIG", self.config.clone())],
            stdin: xml.into(),
        }
    }

    /// The shell hook and the no-op, started as libvirt starts `hooks/lxc NAME OP SUBOP -`.
    fn shell(&self, b: &Bins, name: &str, op: &str, xml: &str) -> Cmd {
        Cmd {
            bin: b.shell.clone(),
            args: vec![name.into(), op.into(), Self::subop(op).into(), "-".into()],
            env: vec![
                ("GPUHOOK_SH_DEV", self.dev.clone()),
                ("GPUHOOK_SH_STATE", self.sh_state.clone()),
            ],
            stdin: xml.into(),
        }
    }

    /// gpuhook as libvirt starts its QEMU hook: `hooks/qemu NAME OP SUBOP -`.
    fn qemu(&self, b: &Bins, name: &str, op: &str, xml: &str) -> Cmd {
        Cmd {
            bin: b.qemu.clone(),
            args: vec![name.into(), op.into(), Self::subop(op).into(), "-".into()],
            env: vec![("GPUHOOK_CONFIG", self.config.clone())],
            stdin: xml.into(),
        }
    }

    fn noop(&self, b: &Bins, name: &str, op: &str, xml: &str) -> Cmd {
        Cmd {
            bin: b.noop.clone(),
            ..self.shell(b, name, op, xml)
        }
    }
}

fn must(c: &Cmd) {
    let s = run(c, None);
    assert!(s.ok, "{}: {}", c.args.join(" "), s.err);
}

struct Report {
    rows: Vec<String>,
    json: Vec<serde_json::Value>,
}

impl Report {
    fn row(&mut self, what: &str, hook: Stats, noop: Option<Stats>, shell: Option<Stats>) {
        let ratio = |a: f64, b: f64| format!("{:.2}×", a / b);
        self.rows.push(format!(
            "| {what} | {:.0} | {:.0} | {} | {} | {} | {} | {:.2} |",
            hook.median_us,
            hook.p90_us,
            noop.map_or(String::new(), |n| format!("{:.0}", n.median_us)),
            noop.map_or(String::new(), |n| ratio(hook.median_us, n.median_us)),
            shell.map_or(String::new(), |s| format!("{:.0}", s.median_us)),
            shell.map_or(String::new(), |s| ratio(s.median_us, hook.median_us)),
            hook.maxrss_kb as f64 / 1024.0,
        ));
        self.json
            .push(serde_json::json!({"what": what, "gpuhook": hook, "noop": noop, "shell": shell}));
    }
}

/// Wall time of `count` concurrent prepares (distinct domains, one GPU each), then released.
fn concurrent(mk: &dyn Fn(&str, u32, &str) -> Cmd, count: u32) -> Duration {
    let cmds: Vec<(Cmd, Cmd)> = (0..count)
        .map(|i| {
            let name = format!("c{i}");
            (mk(&name, 100 + i, "prepare"), mk(&name, 100 + i, "release"))
        })
        .collect();
    let t = Instant::now();
    let kids: Vec<_> = cmds
        .iter()
        .map(|(p, _)| {
            let mut c = Command::new(&p.bin);
            c.args(&p.args)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            for (k, v) in &p.env {
                c.env(k, v);
            }
            let mut ch = c.spawn().unwrap();
            ch.stdin
                .take()
                .unwrap()
                .write_all(p.stdin.as_bytes())
                .unwrap();
            ch
        })
        .collect();
    let ok = kids
        .into_iter()
        .map(|mut k| k.wait().unwrap().success())
        .filter(|b| *b)
        .count();
    let wall = t.elapsed();
    assert_eq!(ok, count as usize, "every concurrent prepare must succeed");
    for (_, r) in &cmds {
        must(r);
    }
    wall
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("hook: benchmark");
        return;
    }
    assert!(nix::unistd::geteuid().is_root(), "benchmarks need root");
    let bins = Bins {
        hook: env_path("BENCH_HOOK"),
        noop: env_path("BENCH_NOOP"),
        shell: env_path("BENCH_SHELL"),
        qemu: PathBuf::new(),
    };
    let n: usize = std::env::var("BENCH_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let bench = Bench {
        tramp: env_path("BENCH_RSS"),
    };
    // Not /var/tmp: its CDI spec directory would be refused (others may write /var/tmp).
    let work = PathBuf::from("/var/lib/gpuhook-bench");
    let _ = Command::new("umount")
        .arg(work.join("run"))
        .stderr(Stdio::null())
        .status();
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(work.join("run")).unwrap();
    // The state lives in /run on a real host: a tmpfs.
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "mode=0700", "bench-run"])
        .arg(work.join("run"))
        .status()
        .unwrap();
    assert!(mounted.success(), "mount tmpfs");
    // Every binary measured runs from one directory: on this VM the same binary started
    // from the source tree (/work/…) took 130–180 µs longer than a copy in /tmp, which
    // would bias any comparison between binaries kept in different places.
    std::fs::create_dir_all(work.join("bin")).unwrap();
    let place = |p: &Path, name: &str| -> PathBuf {
        let to = work.join("bin").join(name);
        std::fs::copy(p, &to).unwrap_or_else(|e| panic!("copy {}: {e}", p.display()));
        to
    };
    std::fs::create_dir_all(work.join("bin/hooks")).unwrap();
    let bins = Bins {
        hook: place(&bins.hook, "gpuhook"),
        noop: place(&bins.noop, "noop"),
        shell: place(&bins.shell, "lxc-shell-baseline.sh"),
        qemu: place(&bins.hook, "hooks/qemu"),
    };
    let baseline_path =
        std::env::var_os("BENCH_BASELINE").map(|p| place(Path::new(&p), "gpuhook-baseline"));
    let mut rep = Report {
        rows: vec![],
        json: vec![],
    };
    // Another gpuhook build to compare this one with, row by row, runs interleaved.
    let baseline = baseline_path.map(|p| Bins {
        hook: p,
        noop: bins.noop.clone(),
        shell: bins.shell.clone(),
        qemu: bins.qemu.clone(),
    });
    let mut ab = Ab::default();

    // BENCH_ONLY=qemu: only the QEMU hook's rows (section 1c), for a quick look.
    if std::env::var("BENCH_ONLY").as_deref() == Ok("qemu") {
        println!(
            "\n## libvirt's QEMU hook ({n} runs per row, interleaved with the static no-op; µs)\n"
        );
        println!("| what | gpuhook median | p90 | static no-op | gpuhook ÷ no-op | target |");
        println!("|---|---|---|---|---|---|");
        for l in qemu_rows(&work, &bins, n) {
            println!("{l}");
        }
        // With a baseline: the LXC hook's key rows, both builds in turn (what a container's
        // start pays for the VMs' pool: a look at libvirt's QEMU status directory).
        if let Some(base) = &baseline {
            let h = Host::new(&work, "ab16", FakeHost::wide(16));
            let plain = domain("web", 1, "", None);
            let g2 = domain("gpu2", 2, TWO, None);
            let r = h.hook(&bins, "gpu2", "release", &g2);
            let rows = [
                (
                    "LXC domain without GPUs (`prepare`)",
                    interleaved(
                        n,
                        || {},
                        &h.hook(base, "web", "prepare", &plain),
                        &h.hook(&bins, "web", "prepare", &plain),
                    ),
                ),
                (
                    "LXC `prepare`, 2 of 16 GPUs",
                    interleaved(
                        n,
                        || must(&r),
                        &h.hook(base, "gpu2", "prepare", &g2),
                        &h.hook(&bins, "gpu2", "prepare", &g2),
                    ),
                ),
            ];
            println!("\n| what | baseline | this build | this ÷ baseline |\n|---|---|---|---|");
            for (what, (b, t)) in rows {
                println!("| {what} | {b:.0} | {t:.0} | {:.2}× |", t / b);
            }
        }
        let _ = Command::new("umount").arg(work.join("run")).status();
        let _ = std::fs::remove_dir_all(&work);
        return;
    }

    // BENCH_ONLY=driver: only the driver="host" rows (section 7), for a quick look.
    if std::env::var("BENCH_ONLY").as_deref() == Ok("driver") {
        let mut d =
            Daemon::new(&work.join("libvirt"), Hook::Binary(bins.hook.clone())).expect("libvirtd");
        d.write_config(&serde_json::json!({})).unwrap();
        d.start().expect("libvirtd start");
        let lines = driver_rows(&work, &bins, &bench, &d, n);
        d.cleanup("bench-");
        d.stop().unwrap();
        println!("\n## driver=\"host\" ({} runs per row)\n", n / 4);
        for l in &lines {
            println!("- {l}");
        }
        let _ = Command::new("umount").arg(work.join("run")).status();
        let _ = std::fs::remove_dir_all(&work);
        return;
    }

    // 1. A domain without GPU metadata: every LXC start and stop on the host pays this.
    let h16 = Host::new(&work, "wide16", FakeHost::wide(16));
    let plain = domain(
        "web",
        1,
        r#"<nova:instance xmlns:nova="http://openstack.org/xmlns/libvirt/nova/1.1"><nova:name>web</nova:name></nova:instance>"#,
        None,
    );
    // The hook and the no-op in turn: their ratio is what matters here, and the VM's noise
    // moves sequential medians by more than the difference.
    let (noop_plain, mut hook_plain) = interleaved_stats(
        n,
        || {},
        &h16.noop(&bins, "web", "prepare", &plain),
        &h16.hook(&bins, "web", "prepare", &plain),
    );
    hook_plain.maxrss_kb = bench
        .measure(4, || {}, &h16.hook(&bins, "web", "prepare", &plain))
        .maxrss_kb;
    let noop_plain = Stats {
        maxrss_kb: bench
            .measure(4, || {}, &h16.noop(&bins, "web", "prepare", &plain))
            .maxrss_kb,
        ..noop_plain
    };
    let sh_plain = bench.measure(n, || {}, &h16.shell(&bins, "web", "prepare", &plain));
    rep.row(
        "domain without GPUs (`prepare`)",
        hook_plain,
        Some(noop_plain),
        Some(sh_plain),
    );
    if let Some(base) = &baseline {
        ab.row(
            "domain without GPUs (`prepare`)",
            interleaved(
                n,
                || {},
                &h16.hook(base, "web", "prepare", &plain),
                &h16.hook(&bins, "web", "prepare", &plain),
            ),
        );
    }

    // 1a. A Nova instance without GPU keys: Nova's whole metadata (flavor with its extra
    // specs, image properties, owner, ports) as Nova 34 writes it, in libvirt's formatting.
    let nova_plain = nova_domain(
        "m1.small",
        &[
            ("hw:cpu_policy", "shared"),
            ("hw_rng:allowed", "True"),
            ("quota:cpu_shares", "1024"),
            ("aggregate_instance_extra_specs:ssd", "true"),
            ("trait:CUSTOM_GPU_ARCH_FERMI", "forbidden"),
        ],
    );
    let nova_row = format!(
        "Nova instance without GPU keys (`prepare`, {:.1} KB XML)",
        nova_plain.len() as f64 / 1024.0
    );
    let (noop_nova, mut hook_nova) = interleaved_stats(
        n,
        || {},
        &h16.noop(&bins, "instance-0000002a", "prepare", &nova_plain),
        &h16.hook(&bins, "instance-0000002a", "prepare", &nova_plain),
    );
    hook_nova.maxrss_kb = bench
        .measure(
            4,
            || {},
            &h16.hook(&bins, "instance-0000002a", "prepare", &nova_plain),
        )
        .maxrss_kb;
    rep.row(&nova_row, hook_nova, Some(noop_nova), None);
    if let Some(base) = &baseline {
        ab.row(
            &nova_row,
            interleaved(
                n,
                || {},
                &h16.hook(base, "instance-0000002a", "prepare", &nova_plain),
                &h16.hook(&bins, "instance-0000002a", "prepare", &nova_plain),
            ),
        );
    }

    // 1b. Its stop hooks: gpuhook frees by UUID whatever the XML says, so it looks whether the
    // state names the domain (here: 16 other domains' reservations, none of it).
    testbed::fakehost::fill_state(&h16.state, 16).expect("state");
    for op in ["stopped", "release"] {
        let (noop, mut hook) = interleaved_stats(
            n,
            || {},
            &h16.noop(&bins, "web", op, &plain),
            &h16.hook(&bins, "web", op, &plain),
        );
        hook.maxrss_kb = bench
            .measure(4, || {}, &h16.hook(&bins, "web", op, &plain))
            .maxrss_kb;
        rep.row(
            &format!("domain without GPUs (`{op}`), 16 reservations held"),
            hook,
            Some(noop),
            None,
        );
        if let Some(base) = &baseline {
            ab.row(
                &format!("domain without GPUs (`{op}`), 16 reservations held"),
                interleaved(
                    n,
                    || {},
                    &h16.hook(base, "web", op, &plain),
                    &h16.hook(&bins, "web", op, &plain),
                ),
            );
        }
    }
    std::fs::remove_file(&h16.state).expect("state");
    // BENCH_ONLY=startup: only the rows every LXC start and stop pays (section 1), and their
    // A/B against `BENCH_BASELINE`: the quick check of a change that must not slow them.
    if std::env::var("BENCH_ONLY").as_deref() == Ok("startup") {
        println!("| what | gpuhook median | p90 | static no-op | gpuhook ÷ no-op | shell hook | shell ÷ gpuhook | gpuhook peak RSS (MiB) |");
        println!("|---|---|---|---|---|---|---|---|");
        for r in &rep.rows {
            println!("{r}");
        }
        if let Some(base) = &baseline {
            println!(
                "\n## This build against {} (runs interleaved, medians, µs)\n",
                base.hook.display()
            );
            println!("| what | baseline | this build | this ÷ baseline |");
            println!("|---|---|---|---|");
            for r in &ab.rows {
                println!("{r}");
            }
        }
        let _ = Command::new("umount").arg(work.join("run")).status();
        let _ = std::fs::remove_dir_all(&work);
        return;
    }

    // 1c. libvirt's QEMU hook: a VM without GPU hostdevs (every VM start on the host pays
    // this), and one passing two GPUs through with their audio functions.
    let qemu_lines = qemu_rows(&work, &bins, n);

    // 2. prepare / release of a 2-GPU request on a 16-GPU host.
    let g2 = domain("gpu2", 2, TWO, None);
    let noop_g2 = bench.measure(n, || {}, &h16.noop(&bins, "gpu2", "prepare", &g2));
    let (hp, hr) = (
        h16.hook(&bins, "gpu2", "prepare", &g2),
        h16.hook(&bins, "gpu2", "release", &g2),
    );
    let (sp, sr) = (
        h16.shell(&bins, "gpu2", "prepare", &g2),
        h16.shell(&bins, "gpu2", "release", &g2),
    );
    let hook_p = bench.measure(n, || must(&hr), &hp);
    let sh_p = bench.measure(n, || must(&sr), &sp);
    rep.row("`prepare`, 2 of 16 GPUs", hook_p, Some(noop_g2), Some(sh_p));
    let hook_r = bench.measure(n, || must(&hp), &hr);
    let sh_r = bench.measure(n, || must(&sp), &sr);
    rep.row("`release`, 2 GPUs", hook_r, Some(noop_g2), Some(sh_r));
    must(&hr);
    if let Some(base) = &baseline {
        ab.row(
            "`prepare`, 2 of 16 GPUs",
            interleaved(
                n,
                || must(&hr),
                &h16.hook(base, "gpu2", "prepare", &g2),
                &hp,
            ),
        );
        ab.row(
            "`release`, 2 GPUs",
            interleaved(
                n,
                || must(&hp),
                &h16.hook(base, "gpu2", "release", &g2),
                &hr,
            ),
        );
        must(&hr);
    }

    // 2a. A shared slot (docs/guides/sharing.md): 4 of the 16 GPUs shared by 4 each, 8 slots held
    // by other domains; `prepare` / `release` of one more, against the static no-op.
    let h16s = Host::new(&work, "wide16-shared", FakeHost::wide(16));
    {
        let mut c: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&h16s.config).unwrap()).unwrap();
        let mut sharing = serde_json::Map::new();
        for d in FakeHost::wide(16).devices.iter().take(4) {
            sharing.insert(d.pci.clone(), serde_json::json!({"replicas": 4}));
        }
        c["sharing"] = serde_json::Value::Object(sharing);
        std::fs::write(&h16s.config, c.to_string()).unwrap();
    }
    let share1 = r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1" share="yes"/>"#;
    for i in 0..8 {
        let name = format!("s{i}");
        must(&h16s.hook(
            &bins,
            &name,
            "prepare",
            &domain(&name, 100 + i, share1, None),
        ));
    }
    let sx = domain("sx", 200, share1, None);
    let (sp, sr) = (
        h16s.hook(&bins, "sx", "prepare", &sx),
        h16s.hook(&bins, "sx", "release", &sx),
    );
    let noop_s = bench.measure(n, || {}, &h16s.noop(&bins, "sx", "prepare", &sx));
    let hook_sp = bench.measure(n, || must(&sr), &sp);
    rep.row(
        "`prepare`, 1 shared slot (4 GPUs × 4 slots of 16 GPUs, 8 slots held)",
        hook_sp,
        Some(noop_s),
        None,
    );
    let hook_sr = bench.measure(n, || must(&sp), &sr);
    rep.row("`release`, 1 shared slot", hook_sr, Some(noop_s), None);
    must(&sr);

    // 2c. A slot of a GPU shared with MPS: the first sharer starts the GPU's control daemon
    // (here the test bed's stand-in, a Python program: its own start is most of the cost),
    // its release tells it to quit; a later sharer finds it running. Fewer runs: each first
    // sharer starts a process tree.
    let h16m = Host::new(&work, "wide16-mps", FakeHost::wide(16));
    {
        let mut c: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&h16m.config).unwrap()).unwrap();
        let gpu = FakeHost::wide(16).devices[0].pci.clone();
        c["sharing"] = serde_json::json!({ gpu: {"replicas": 4, "mode": "mps",
            "active_thread_percentage": 50} });
        c["mps_control"] = serde_json::json!(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("testbed/scripts/mps-control-standin")
        );
        std::fs::write(&h16m.config, c.to_string()).unwrap();
    }
    let nm = n.min(40);
    let (mp, mr) = (
        h16m.hook(&bins, "m0", "prepare", &domain("m0", 300, share1, None)),
        h16m.hook(&bins, "m0", "release", &domain("m0", 300, share1, None)),
    );
    let noop_m = bench.measure(nm, || {}, &h16m.noop(&bins, "m0", "prepare", &sx));
    let first = bench.measure(nm, || must(&mr), &mp);
    rep.row(
        "`prepare`, first slot of an MPS GPU (starts the stand-in daemon, sets 1 limit)",
        first,
        Some(noop_m),
        None,
    );
    let last = bench.measure(nm, || must(&mp), &mr);
    rep.row(
        "`release`, last slot of an MPS GPU (`quit`, waits for the daemon's exit)",
        last,
        Some(noop_m),
        None,
    );
    must(&mp);
    let (lp, lr) = (
        h16m.hook(&bins, "m1", "prepare", &domain("m1", 301, share1, None)),
        h16m.hook(&bins, "m1", "release", &domain("m1", 301, share1, None)),
    );
    let later = bench.measure(n, || must(&lr), &lp);
    rep.row(
        "`prepare`, a later slot of an MPS GPU (daemon running)",
        later,
        Some(noop_s),
        None,
    );
    must(&lr);
    must(&mr);

    // 2b. The same through a Nova flavor's Placement form, `resources:CUSTOM_GPU_AMPERE=2`.
    let nova_g2 = nova_domain(
        "g1.ampere2",
        &[
            ("hw:cpu_policy", "shared"),
            ("resources:CUSTOM_GPU_AMPERE", "2"),
        ],
    );
    let (np, nr) = (
        h16.hook(&bins, "instance-0000002a", "prepare", &nova_g2),
        h16.hook(&bins, "instance-0000002a", "release", &nova_g2),
    );
    let nova_p = bench.measure(n, || must(&nr), &np);
    rep.row(
        "`prepare`, 2 of 16 GPUs, Nova flavor `resources:CUSTOM_GPU_AMPERE=2`",
        nova_p,
        Some(noop_g2),
        None,
    );
    must(&nr);

    // 3. How cost grows: reservations in the state, GPUs on the host.
    for k in [200u32, 1000] {
        let hk = Host::new(&work, &format!("res{k}"), FakeHost::wide(16));
        testbed::fakehost::fill_state(&hk.state, k).unwrap();
        let (p, r) = (
            hk.hook(&bins, "gpu2", "prepare", &g2),
            hk.hook(&bins, "gpu2", "release", &g2),
        );
        let s = bench.measure(n / 2, || must(&r), &p);
        rep.row(
            &format!("`prepare`, 2 of 16 GPUs, {k} reservations held"),
            s,
            Some(noop_g2),
            None,
        );
    }
    // A realistic server lists far more PCI functions than GPUs; the kernel's list of them
    // is read once. These two rows (issue 14's targets) run the hook and the no-op in turn.
    let ho = Host::new(
        &work,
        "wide16-other",
        FakeHost::wide(16).with_other_functions(OTHER_FUNCTIONS),
    );
    let hm = Host::new(
        &work,
        "mig8x7-other",
        FakeHost::wide(8)
            .all_mig7()
            .with_other_functions(OTHER_FUNCTIONS),
    );
    let m1 = domain("mig1", 4, MIG_ONE, None);
    for (h, name, xml, what) in [
        (
            &ho,
            "gpu2",
            &g2,
            format!("`prepare`, 2 of 16 GPUs, host with {OTHER_FUNCTIONS} other PCI functions"),
        ),
        (
            &hm,
            "mig1",
            &m1,
            format!("`prepare`, 1 MIG instance, 8 GPUs × 7 instances, {OTHER_FUNCTIONS} other PCI functions"),
        ),
    ] {
        let (p, r) = (
            h.hook(&bins, name, "prepare", xml),
            h.hook(&bins, name, "release", xml),
        );
        let (noop, mut hook) =
            interleaved_stats(n, || must(&r), &h.noop(&bins, name, "prepare", xml), &p);
        hook.maxrss_kb = bench.measure(4, || must(&r), &p).maxrss_kb;
        must(&r);
        rep.row(&what, hook, Some(noop), None);
    }
    let g1 = domain("gpu1", 3, ONE, None);
    let mut per_gpus = Vec::new();
    for g in [1usize, 4, 8, 16] {
        let hg = Host::new(&work, &format!("gpus{g}"), FakeHost::wide(g));
        let (p, r) = (
            hg.hook(&bins, "gpu1", "prepare", &g1),
            hg.hook(&bins, "gpu1", "release", &g1),
        );
        let s = bench.measure(n, || must(&r), &p);
        per_gpus.push(s);
        rep.row(
            &format!("`prepare`, 1 GPU, host with {g} GPUs"),
            s,
            Some(noop_g2),
            None,
        );
    }

    // 4. 64 concurrent prepares on a 64-GPU host (best of 5).
    let h64 = Host::new(&work, "wide64", FakeHost::wide(64));
    let hook64 =
        |name: &str, i: u32, op: &str| h64.hook(&bins, name, op, &domain(name, i, ONE, None));
    let sh64 =
        |name: &str, i: u32, op: &str| h64.shell(&bins, name, op, &domain(name, i, ONE, None));
    let (mut best_hook, mut best_sh) = (Duration::MAX, Duration::MAX);
    for _ in 0..5 {
        best_hook = best_hook.min(concurrent(&hook64, 64));
        best_sh = best_sh.min(concurrent(&sh64, 64));
    }

    // 5. started under a real libvirtd: 5 nodes + 5 grants in a live container.
    let hl = Host::new(&work, "lv", FakeHost::wide(16));
    let mut d =
        Daemon::new(&work.join("libvirt"), Hook::Binary(bins.hook.clone())).expect("libvirtd");
    d.write_config(&serde_json::from_str(&std::fs::read_to_string(&hl.config).unwrap()).unwrap())
        .unwrap();
    d.start().expect("libvirtd start");
    d.define(&DomainSpec::new("bench-started", TWO).xml())
        .unwrap();
    d.virsh_ok(&["start", "bench-started"]).unwrap();
    let live = d.virsh_ok(&["dumpxml", "bench-started"]).unwrap();
    let ct = d.container("bench-started").unwrap();
    let cg = gpuhook::cgroup::for_pid(ct.init.pid)
        .unwrap()
        .path()
        .to_path_buf();
    must(&hl.shell(&bins, "bench-started", "prepare", &live));
    // Before each run the container loses its nodes and grants (untimed), as at a fresh start.
    let reset = || {
        let ok = testbed::shell_in(ct.init.pid, "rm -f /dev/nvidia*")
            .status()
            .unwrap();
        assert!(ok.success());
        for (ma, mi) in [(195, 0), (195, 1), (195, 255), (509, 0), (509, 1)] {
            let _ = std::fs::write(cg.join("devices.deny"), format!("c {ma}:{mi} rw"));
        }
    };
    let hook_st = bench.measure(
        n / 2,
        reset,
        &hl.hook(&bins, "bench-started", "started", &live),
    );
    let sh_st = bench.measure(
        n / 4,
        reset,
        &hl.shell(&bins, "bench-started", "started", &live),
    );
    let noop_st = bench.measure(
        n / 2,
        || {},
        &hl.noop(&bins, "bench-started", "started", &live),
    );
    rep.row(
        "`started`: 5 nodes + 5 grants in a live container",
        hook_st,
        Some(noop_st),
        Some(sh_st),
    );
    if let Some(base) = &baseline {
        ab.row(
            "`started`: 5 nodes + 5 grants in a live container",
            interleaved(
                n / 2,
                reset,
                &hl.hook(base, "bench-started", "started", &live),
                &hl.hook(&bins, "bench-started", "started", &live),
            ),
        );
    }
    // 5a. Hotplug: `gpuhook attach` of one GPU (reserve + grant + node) into that live
    // container and `gpuhook detach` of it (revoke + node + free), run as an operator runs
    // them: in libvirtd's mount namespace (its /run/libvirt/lxc), through nsenter. The static
    // no-op through the same nsenter is the baseline; the difference is gpuhook's own cost.
    let lv_pid = d.pid().expect("libvirtd runs");
    let in_lv = |bin: &Path, args: &[&str]| Cmd {
        bin: "/usr/bin/nsenter".into(),
        args: [
            format!("--mount=/proc/{lv_pid}/ns/mnt"),
            "--".into(),
            bin.display().to_string(),
        ]
        .into_iter()
        .chain(args.iter().map(|a| a.to_string()))
        .collect(),
        env: vec![("GPUHOOK_CONFIG", hl.config.clone())],
        stdin: String::new(),
    };
    let attach = in_lv(&bins.hook, &["attach", "bench-started", "--device", "15"]);
    let detach = in_lv(&bins.hook, &["detach", "bench-started", "--device", "15"]);
    let noop_ns = in_lv(&bins.noop, &[]);
    let quiet = |c: &Cmd| {
        let _ = run(c, None);
    };
    let noop_hp = bench.measure(n / 2, || {}, &noop_ns);
    let hook_at = bench.measure(n / 2, || quiet(&detach), &attach);
    let hook_de = bench.measure(n / 2, || quiet(&attach), &detach);
    quiet(&detach);
    rep.row(
        "`gpuhook attach` of 1 GPU into a live container (through nsenter)",
        hook_at,
        Some(noop_hp),
        None,
    );
    rep.row(
        "`gpuhook detach` of it (through nsenter)",
        hook_de,
        Some(noop_hp),
        None,
    );
    println!(
        "hotplug over nsenter + static no-op ({:.0} µs): attach +{:.2} ms, detach +{:.2} ms (target: under 5 ms each)",
        noop_hp.median_us,
        (hook_at.median_us - noop_hp.median_us) / 1000.0,
        (hook_de.median_us - noop_hp.median_us) / 1000.0
    );

    // 6. started with CDI: the driver's user space (≈40 mounts, the spec's links, the
    // linker cache) into a live container with its own root, against the node-only
    // `started` of the same container, runs interleaved.
    let cdi_line = cdi_started(&work, &bins, &d, n);
    // 7. driver="host" against driver="cdi" with a spec naming the same files, and
    // `gpuhook driver` with and without its cache.
    let driver_lines = driver_rows(&work, &bins, &bench, &d, n);
    d.cleanup("bench-");
    d.stop().unwrap();

    let size = std::fs::metadata(&bins.hook).unwrap().len();
    let rss = rep
        .json
        .iter()
        .filter_map(|j| j["gpuhook"]["maxrss_kb"].as_i64())
        .max()
        .unwrap_or(0);
    let noop_rss = noop_plain.maxrss_kb;
    let flat = per_gpus[3].median_us / per_gpus[0].median_us;
    let tput = format!(
        "64 concurrent `prepare`s on a 64-GPU host (best of 5): gpuhook {:.1} ms in all ({:.0} reservations/s, {:.0} µs each), shell hook {:.1} ms ({:.0}/s): {:.1}× the throughput",
        best_hook.as_secs_f64() * 1e3,
        64.0 / best_hook.as_secs_f64(),
        best_hook.as_secs_f64() * 1e6 / 64.0,
        best_sh.as_secs_f64() * 1e3,
        64.0 / best_sh.as_secs_f64(),
        best_sh.as_secs_f64() / best_hook.as_secs_f64()
    );
    println!("\n## Results ({n} runs per row, n/2 for 1,000 reservations and `started`; µs)\n");
    println!("| what | gpuhook median | p90 | static no-op | gpuhook ÷ no-op | shell hook | shell ÷ gpuhook | gpuhook peak RSS (MiB) |");
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rep.rows {
        println!("{r}");
    }
    println!("\n### libvirt's QEMU hook (interleaved with the static no-op)\n");
    println!("| what | gpuhook median | p90 | static no-op | gpuhook ÷ no-op | target |");
    println!("|---|---|---|---|---|---|");
    for l in &qemu_lines {
        println!("{l}");
    }
    println!("\n- {tput}");
    println!("- {cdi_line}");
    for l in &driver_lines {
        println!("- {l}");
    }
    println!(
        "- cost in the number of GPUs: `prepare` on a 16-GPU host ÷ on a 1-GPU host = {flat:.2}×"
    );
    println!(
        "- peak RSS of any gpuhook run: {:.2} MiB (the static no-op: {:.2} MiB); static binary: {:.2} MiB ({size} bytes)",
        rss as f64 / 1024.0,
        noop_rss as f64 / 1024.0,
        size as f64 / 1048576.0
    );
    if let Some(base) = &baseline {
        println!(
            "\n## This build against {} (runs interleaved, medians, µs)\n",
            base.hook.display()
        );
        println!("| what | baseline | this build | this ÷ baseline |");
        println!("|---|---|---|---|");
        for r in &ab.rows {
            println!("{r}");
        }
    }
    let out = serde_json::json!({"iterations": n, "rows": rep.json, "qemu": qemu_lines, "concurrent": tput, "cdi_started": cdi_line, "driver_host": driver_lines, "flat_16_vs_1": flat, "binary_bytes": size, "peak_rss_kb": rss});
    std::fs::create_dir_all("target/bench").unwrap();
    std::fs::write(
        "target/bench/results.json",
        serde_json::to_vec_pretty(&out).unwrap(),
    )
    .unwrap();
    let _ = Command::new("umount").arg(work.join("run")).status();
    let _ = std::fs::remove_dir_all(&work);
}

/// Mounts a full NVIDIA spec has beyond the fake driver's (libEGL_nvidia, libnvidia-glcore,
/// -eglcore, -tls, -rtcore, -ngx, -fbc, -encode, -opticalflow, vdpau, the Vulkan and EGL
/// ICD files …): as many copies of a library, mounted the same way.
const CDI_EXTRA_MOUNTS: usize = 23;

/// `started` with `driver="cdi"` and a spec of ≈40 mounts in a live container with its own
/// root, against the node-only `started` of the same container (runs interleaved, medians).
fn cdi_started(work: &Path, bins: &Bins, d: &Daemon, n: usize) -> String {
    let fake = FakeHost::blueprint();
    let hc = Host::new(work, "cdi", fake.clone());
    let paths = testbed::HostPaths {
        root: work.join("cdi"),
        sysfs: work.join("cdi/sys"),
        proc: work.join("cdi/proc"),
        dev: hc.dev.clone(),
    };
    let drv = testbed::driver::FakeDriver::install(&work.join("driver"), "535.129.03")
        .expect("fake driver");
    let lib = testbed::driver::LIBDIR;
    let mut spec = drv.nvidia_spec(&fake, &paths);
    let mut targets: Vec<String> = spec
        .lines()
        .filter_map(|l| l.trim().strip_prefix("containerPath: "))
        .map(str::to_owned)
        .collect();
    for i in 0..CDI_EXTRA_MOUNTS {
        let name = format!("libnvidia-bench{i}.so.535.129.03");
        let host = drv.root.join(&lib[1..]).join(&name);
        std::fs::copy(
            drv.root.join(&lib[1..]).join("libnvidia-ml.so.535.129.03"),
            &host,
        )
        .unwrap();
        spec.push_str(&format!(
            "        - hostPath: {}\n          containerPath: {lib}/{name}\n          options:\n            - ro\n            - nosuid\n            - nodev\n            - rbind\n            - rprivate\n",
            host.display()
        ));
        targets.push(format!("{lib}/{name}"));
    }
    let specs = work.join("cdi-specs");
    std::fs::create_dir_all(&specs).unwrap();
    std::fs::write(specs.join("nvidia.yaml"), &spec).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&hc.config).unwrap()).unwrap();
    cfg["cdi_spec_dirs"] = serde_json::json!([specs]);
    std::fs::write(&hc.config, cfg.to_string()).unwrap();
    let rootfs = testbed::driver::rootfs(&work.join("cdi-rootfs")).expect("rootfs");
    // libvirtd starts it without a request (its own config knows nothing of this host); the
    // measured hook runs with the request and this host's config.
    let mut ds = DomainSpec::new("bench-cdi", "");
    ds.rootfs = Some((rootfs, false));
    d.define(&ds.xml()).unwrap();
    d.virsh_ok(&["start", "bench-cdi"]).unwrap();
    let live = d.virsh_ok(&["dumpxml", "bench-cdi"]).unwrap();
    let with = |attrs: &str| {
        let meta = format!(
            "<metadata><gpu:gpus xmlns:gpu=\"urn:gpuhook:gpu:1\" {attrs}/></metadata>\n  <memory"
        );
        live.replace("<metadata/>", "")
            .replace("<metadata></metadata>", "")
            .replacen("<memory", &meta, 1)
    };
    let (xml_cdi, xml_nodes) = (with(r#"count="1" driver="cdi""#), with(r#"count="1""#));
    let ct = d.container("bench-cdi").unwrap();
    let cg = gpuhook::cgroup::for_pid(ct.init.pid)
        .unwrap()
        .path()
        .to_path_buf();
    must(&hc.hook(bins, "bench-cdi", "prepare", &xml_cdi));
    // Before each run (untimed): the mounts, links, gpuhook's ld.so.conf.d file, the nodes
    // and grants go; the mount points stay (a container's root keeps them across starts).
    let reset_script = format!(
        "for t in {}; do umount -l $t 2>/dev/null; done; rm -f {lib}/libcuda.so {lib}/*.so.1 {lib}/*.so.4 /etc/ld.so.conf.d/00-gpuhook-cdi.conf /etc/ld.so.cache /dev/nvidia*",
        targets.join(" ")
    );
    let reset = || {
        let ok = testbed::shell_in(ct.init.pid, &reset_script)
            .status()
            .unwrap();
        assert!(ok.success());
        for (ma, mi) in [(195, 0), (195, 254), (195, 255), (509, 0), (509, 1)] {
            let _ = std::fs::write(cg.join("devices.deny"), format!("c {ma}:{mi} rw"));
        }
    };
    // One run checked: the container sees the library, read-only.
    reset();
    must(&hc.hook(bins, "bench-cdi", "started", &xml_cdi));
    let o = testbed::shell_in(
        ct.init.pid,
        "grep -c ' ro,nosuid,nodev' /proc/1/mounts; cuda-probe",
    )
    .output()
    .unwrap();
    let seen = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(seen.contains("dlopen libcuda.so.1: ok"), "{seen}");
    let (cdi, nodes) = interleaved_stats(
        n / 4,
        reset,
        &hc.hook(bins, "bench-cdi", "started", &xml_cdi),
        &hc.hook(bins, "bench-cdi", "started", &xml_nodes),
    );
    format!(
        "`started` with `driver=\"cdi\"` ({} mounts, the spec's links, linker cache, own root): median {:.2} ms, p90 {:.2} ms (target ≤ 15 ms); node-only `started` of the same container {:.2} ms: {:.1}× ({} runs each, interleaved)",
        targets.len(),
        cdi.median_us / 1e3,
        cdi.p90_us / 1e3,
        nodes.median_us / 1e3,
        cdi.median_us / nodes.median_us,
        n / 4
    )
}

/// `started` with `driver="host"` (the running driver found on the host, from its cache)
/// against `started` with `driver="cdi"` and a spec naming the same files (the one `gpuhook
/// cdi generate` writes for that driver), in one live container with its own root, runs
/// interleaved; and `gpuhook driver` cold (no cache: discovery, the linker cache read, each
/// library's SONAME) and warm (the cache read, each file's trust checked). Lines for the
/// report.
fn driver_rows(work: &Path, bins: &Bins, bench: &Bench, d: &Daemon, n: usize) -> Vec<String> {
    const V: &str = "535.129.03";
    let fake = FakeHost::blueprint();
    let hh = Host::new(work, "drv", fake);
    let drv = testbed::driver::FakeDriver::install_host(&work.join("driver-host"), V)
        .expect("fake driver");
    // A distribution's multiarch directory and /usr/bin hold about 1,200 entries each (this
    // machine's: 1,161 and 1,175), which discovery lists: as many other files beside the
    // driver's.
    for (dir, stem) in [
        ("usr/lib/x86_64-linux-gnu", "libother"),
        ("usr/bin", "other"),
    ] {
        for i in 0..1200 {
            std::fs::write(drv.root.join(dir).join(format!("{stem}{i}.so.1")), b"").unwrap();
        }
    }
    let specs = work.join("drv-specs");
    std::fs::create_dir_all(&specs).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&hh.config).unwrap()).unwrap();
    cfg["root"] = serde_json::json!(drv.root);
    cfg["cdi_spec_dirs"] = serde_json::json!([specs]);
    std::fs::write(&hh.config, cfg.to_string()).unwrap();
    let gh = |args: &[&str]| Cmd {
        bin: bins.hook.clone(),
        args: args.iter().map(|a| a.to_string()).collect(),
        env: vec![("GPUHOOK_CONFIG", hh.config.clone())],
        stdin: String::new(),
    };
    let spec = specs.join("nvidia.json");
    must(&gh(&[
        "cdi",
        "generate",
        "--output",
        spec.to_str().unwrap(),
    ]));
    let listed = Command::new(&bins.hook)
        .args(["driver", "--json"])
        .env("GPUHOOK_CONFIG", &hh.config)
        .output()
        .unwrap();
    assert!(listed.status.success());
    let j: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let targets: Vec<String> = j["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect();
    let rootfs = testbed::driver::rootfs(&work.join("drv-rootfs")).expect("rootfs");
    let mut ds = DomainSpec::new("bench-drv", "");
    ds.rootfs = Some((rootfs, false));
    d.define(&ds.xml()).unwrap();
    d.virsh_ok(&["start", "bench-drv"]).unwrap();
    let live = d.virsh_ok(&["dumpxml", "bench-drv"]).unwrap();
    let with = |attrs: &str| {
        let meta = format!(
            "<metadata><gpu:gpus xmlns:gpu=\"urn:gpuhook:gpu:1\" {attrs}/></metadata>\n  <memory"
        );
        live.replace("<metadata/>", "")
            .replace("<metadata></metadata>", "")
            .replacen("<memory", &meta, 1)
    };
    let (xml_host, xml_cdi) = (
        with(r#"count="1" driver="host""#),
        with(r#"count="1" driver="cdi""#),
    );
    let ct = d.container("bench-drv").unwrap();
    let cg = gpuhook::cgroup::for_pid(ct.init.pid)
        .unwrap()
        .path()
        .to_path_buf();
    must(&hh.hook(bins, "bench-drv", "prepare", &xml_host));
    let lib = testbed::driver::LIBDIR;
    // Before each run (untimed): the mounts, links, gpuhook's ld.so.conf.d file, the nodes
    // and grants go; the mount points stay.
    let reset_script = format!(
        "for t in {}; do umount -l $t 2>/dev/null; done; rm -f {lib}/libcuda.so {lib}/*.so.1 {lib}/*.so.4 /etc/ld.so.conf.d/00-gpuhook-cdi.conf /etc/ld.so.cache /dev/nvidia*",
        targets.join(" ")
    );
    let reset = || {
        let ok = testbed::shell_in(ct.init.pid, &reset_script)
            .status()
            .unwrap();
        assert!(ok.success());
        for (ma, mi) in [
            (195, 0),
            (195, 1),
            (195, 254),
            (195, 255),
            (509, 0),
            (509, 1),
        ] {
            let _ = std::fs::write(cg.join("devices.deny"), format!("c {ma}:{mi} rw"));
        }
    };
    // One run of each checked: the container loads libcuda.
    for xml in [&xml_host, &xml_cdi] {
        reset();
        must(&hh.hook(bins, "bench-drv", "started", xml));
        let o = testbed::shell_in(ct.init.pid, "cuda-probe")
            .output()
            .unwrap();
        let seen = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(seen.contains("dlopen libcuda.so.1: ok"), "{seen}");
    }
    let (host, cdi) = interleaved_stats(
        n / 4,
        reset,
        &hh.hook(bins, "bench-drv", "started", &xml_host),
        &hh.hook(bins, "bench-drv", "started", &xml_cdi),
    );
    // The plan alone, no container: `gpuhook check` of each request (the host's driver from
    // the cache and its trust checked, against the spec read, checked and planned).
    let check = |xml: &str| Cmd {
        stdin: xml.to_string(),
        ..gh(&["check", "-"])
    };
    let (check_host, check_cdi) =
        interleaved_stats(n / 4, || {}, &check(&xml_host), &check(&xml_cdi));
    let cache = hh.state.with_file_name("driver-cache.json");
    let cold = bench.measure(
        n / 4,
        || {
            let _ = std::fs::remove_file(&cache);
        },
        &gh(&["driver"]),
    );
    let warm = bench.measure(n / 4, || {}, &gh(&["driver"]));
    vec![
        format!(
            "`started` with `driver=\"host\"` ({} files of the running driver found on the host, from the cache; links, linker cache, own root): median {:.2} ms, p90 {:.2} ms; with `driver=\"cdi\"` and a spec naming the same files (`gpuhook cdi generate`'s): {:.2} ms: host ÷ cdi {:.2}× (target ≤ 1.2×; {} runs each, interleaved)",
            targets.len(),
            host.median_us / 1e3,
            host.p90_us / 1e3,
            cdi.median_us / 1e3,
            host.median_us / cdi.median_us,
            n / 4
        ),
        format!(
            "the plan alone (`gpuhook check` of the same request, no container): `driver=\"host\"` median {:.2} ms, `driver=\"cdi\"` {:.2} ms: host ÷ cdi {:.2}× ({} runs each, interleaved)",
            check_host.median_us / 1e3,
            check_cdi.median_us / 1e3,
            check_host.median_us / check_cdi.median_us,
            n / 4
        ),
        format!(
            "`gpuhook driver`: cold (no cache: discovery, ld.so.cache, SONAMEs) median {:.2} ms, warm (the cache) {:.2} ms: cold ÷ warm {:.1}× ({} runs each)",
            cold.median_us / 1e3,
            warm.median_us / 1e3,
            cold.median_us / warm.median_us,
            n / 4
        ),
    ]
}

/// A QEMU domain as libvirt formats it for its hook (about 4 KiB: q35, virtio disk and
/// network, controllers, graphics), with `hostdevs` in `<devices>`.
fn qemu_domain(name: &str, n: u32, hostdevs: &str) -> String {
    let mut controllers = String::new();
    for i in 1..=8 {
        controllers.push_str(&format!("    <controller type='pci' index='{i}' model='pcie-root-port'>\n      <model name='pcie-root-port'/>\n      <target chassis='{i}' port='0x{:x}'/>\n      <alias name='pci.{i}'/>\n      <address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x{:x}'/>\n    </controller>\n", 0x10 + i - 1, i - 1));
    }
    format!(
        "<domain type='kvm' id='{n}'>\n  <name>{name}</name>\n  <uuid>{n:08x}-0000-4000-9000-{n:012x}</uuid>\n  <metadata>\n    <libosinfo:libosinfo xmlns:libosinfo=\"http://libosinfo.org/xmlns/libvirt/domain/1.0\">\n      <libosinfo:os id=\"http://debian.org/debian/12\"/>\n    </libosinfo:libosinfo>\n  </metadata>\n  <memory unit='KiB'>16777216</memory>\n  <currentMemory unit='KiB'>16777216</currentMemory>\n  <vcpu placement='static'>8</vcpu>\n  <resource>\n    <partition>/machine</partition>\n  </resource>\n  <os>\n    <type arch='x86_64' machine='pc-q35-7.2'>hvm</type>\n    <boot dev='hd'/>\n  </os>\n  <features>\n    <acpi/>\n    <apic/>\n    <vmport state='off'/>\n  </features>\n  <cpu mode='host-passthrough' check='none' migratable='on'/>\n  <clock offset='utc'>\n    <timer name='rtc' tickpolicy='catchup'/>\n    <timer name='pit' tickpolicy='delay'/>\n    <timer name='hpet' present='no'/>\n  </clock>\n  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>restart</on_reboot>\n  <on_crash>destroy</on_crash>\n  <devices>\n    <emulator>/usr/bin/qemu-system-x86_64</emulator>\n    <disk type='file' device='disk'>\n      <driver name='qemu' type='qcow2' discard='unmap'/>\n      <source file='/var/lib/libvirt/images/{name}.qcow2' index='1'/>\n      <backingStore/>\n      <target dev='vda' bus='virtio'/>\n      <alias name='virtio-disk0'/>\n      <address type='pci' domain='0x0000' bus='0x04' slot='0x00' function='0x0'/>\n    </disk>\n    <controller type='usb' index='0' model='qemu-xhci' ports='15'>\n      <alias name='usb'/>\n      <address type='pci' domain='0x0000' bus='0x02' slot='0x00' function='0x0'/>\n    </controller>\n    <controller type='pci' index='0' model='pcie-root'>\n      <alias name='pcie.0'/>\n    </controller>\n{controllers}    <interface type='network'>\n      <mac address='52:54:00:6b:3c:58'/>\n      <source network='default' portid='5f1e7a0c-2b6d-4c1e-9a3f-6d8e2c4b1a07' bridge='virbr0'/>\n      <target dev='vnet3'/>\n      <model type='virtio'/>\n      <alias name='net0'/>\n      <address type='pci' domain='0x0000' bus='0x01' slot='0x00' function='0x0'/>\n    </interface>\n    <serial type='pty'>\n      <source path='/dev/pts/3'/>\n      <target type='isa-serial' port='0'>\n        <model name='isa-serial'/>\n      </target>\n      <alias name='serial0'/>\n    </serial>\n    <channel type='unix'>\n      <source mode='bind' path='/run/libvirt/qemu/channel/{n}-{name}/org.qemu.guest_agent.0'/>\n      <target type='virtio' name='org.qemu.guest_agent.0' state='disconnected'/>\n      <alias name='channel0'/>\n      <address type='virtio-serial' controller='0' bus='0' port='1'/>\n    </channel>\n    <input type='tablet' bus='usb'>\n      <alias name='input0'/>\n      <address type='usb' bus='0' port='1'/>\n    </input>\n    <graphics type='vnc' port='5900' autoport='yes' listen='127.0.0.1'>\n      <listen type='address' address='127.0.0.1'/>\n    </graphics>\n    <video>\n      <model type='virtio' heads='1' primary='yes'/>\n      <alias name='video0'/>\n      <address type='pci' domain='0x0000' bus='0x00' slot='0x01' function='0x0'/>\n    </video>\n{hostdevs}    <memballoon model='virtio'>\n      <alias name='balloon0'/>\n      <address type='pci' domain='0x0000' bus='0x05' slot='0x00' function='0x0'/>\n    </memballoon>\n  </devices>\n  <seclabel type='dynamic' model='dac' relabel='yes'>\n    <label>+64055:+994</label>\n    <imagelabel>+64055:+994</imagelabel>\n  </seclabel>\n</domain>\n"
    )
}

/// A PCI hostdev of function `pci` as libvirt formats it.
fn qemu_hostdev(pci: &str, alias: usize) -> String {
    format!("    <hostdev mode='subsystem' type='pci' managed='yes'>\n      <driver name='vfio'/>\n      <source>\n        <address domain='0x{}' bus='0x{}' slot='0x{}' function='0x{}'/>\n      </source>\n      <alias name='hostdev{alias}'/>\n      <address type='pci' domain='0x0000' bus='0x0{}' slot='0x00' function='0x0'/>\n    </hostdev>\n", &pci[0..4], &pci[5..7], &pci[8..10], &pci[11..12], 6 + alias)
}

/// libvirt's QEMU hook against the static no-op, runs interleaved: a VM without GPU
/// hostdevs (`prepare`; `stopped` with 16 reservations held), and `prepare` / `release` of
/// a VM passing two GPUs through with their audio functions, on a 16-GPU host. Rows of
/// Markdown, with the issue's targets (≤ 1.2× and ≤ 2.5× the no-op).
fn qemu_rows(work: &Path, bins: &Bins, n: usize) -> Vec<String> {
    let fake = FakeHost::wide(16).with_audio();
    let gpus: Vec<String> = fake
        .devices
        .iter()
        .filter(|d| d.class == 0x030200)
        .map(|d| d.pci.clone())
        .collect();
    let h = Host::new(work, "qemu16", fake);
    let plain = qemu_domain("vm-plain", 1, "");
    let two: String = gpus[..2]
        .iter()
        .enumerate()
        .flat_map(|(i, g)| {
            [
                qemu_hostdev(g, 2 * i),
                qemu_hostdev(&format!("{}.1", &g[..10]), 2 * i + 1),
            ]
        })
        .collect();
    let vm2 = qemu_domain("vm-gpu2", 2, &two);
    let mut rows = Vec::new();
    let mut row = |what: String, (noop, hook): (Stats, Stats), target: Option<f64>| {
        let ratio = hook.median_us / noop.median_us;
        let judged = match target {
            Some(t) if ratio <= t => format!("≤ {t}× (met)"),
            Some(t) => format!("≤ {t}× (NOT met)"),
            None => "—".into(),
        };
        rows.push(format!(
            "| {what} | {:.0} | {:.0} | {:.0} | {ratio:.2}× | {judged} |",
            hook.median_us, hook.p90_us, noop.median_us,
        ));
    };
    row(
        format!(
            "QEMU domain without GPU hostdevs (`prepare`, {:.1} KB XML)",
            plain.len() as f64 / 1024.0
        ),
        interleaved_stats(
            n,
            || {},
            &h.noop(bins, "vm-plain", "prepare", &plain),
            &h.qemu(bins, "vm-plain", "prepare", &plain),
        ),
        Some(1.2),
    );
    let (p, r) = (
        h.qemu(bins, "vm-gpu2", "prepare", &vm2),
        h.qemu(bins, "vm-gpu2", "release", &vm2),
    );
    row(
        "QEMU `prepare`, 2 GPU hostdevs (+ their audio functions) of 16 GPUs".into(),
        interleaved_stats(
            n,
            || must(&r),
            &h.noop(bins, "vm-gpu2", "prepare", &vm2),
            &p,
        ),
        Some(2.5),
    );
    row(
        "QEMU `release`, 2 GPUs".into(),
        interleaved_stats(
            n,
            || must(&p),
            &h.noop(bins, "vm-gpu2", "release", &vm2),
            &r,
        ),
        None,
    );
    must(&r);
    testbed::fakehost::fill_state(&h.state, 16).expect("state");
    row(
        "QEMU domain without GPU hostdevs (`stopped`), 16 reservations held".into(),
        interleaved_stats(
            n,
            || {},
            &h.noop(bins, "vm-plain", "stopped", &plain),
            &h.qemu(bins, "vm-plain", "stopped", &plain),
        ),
        Some(1.2),
    );
    rows
}
