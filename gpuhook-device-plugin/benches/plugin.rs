//! The device plugin's cost, on a fake host (the 8×H100 `dgx8`) with a kubelet stand-in
//! (registration only): the time from a change of the pool (a libvirt domain's reservation
//! written into the state file under its lock, as the hook does; then taken out) to the
//! `ListAndWatch` update that shows it, median and worst of `BENCH_N` (100) changes; the
//! plugin's CPU time while idle over `BENCH_IDLE_S` (60) seconds; its resident memory.
//! Needs root (fake hosts make device nodes). Prints a Markdown table; no assertion on time.

use gpuhook::reserve::state::{Reservation, State, StateError, Store};
use kubelet_api::v1beta1::device_plugin_client::DevicePluginClient;
use kubelet_api::v1beta1::registration_server::{Registration, RegistrationServer};
use kubelet_api::v1beta1::{Empty, RegisterRequest};
use kubelet_api::{unix_channel, unix_incoming};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};
use testbed::FakeHost;
use tonic::{Request, Response, Status};

struct Kubelet;

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(&self, _: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        Ok(Response::new(Empty {}))
    }
}

fn env_n(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

/// The process's user + system CPU time, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn status_kb(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap()
}

fn domain(st: &mut State, pci: &str) {
    let mut r: Reservation = serde_json::from_value(serde_json::json!({
        "domain": "bench", "uuid": "4c7f30aa-ffe6-489b-80ff-0f27ece176a3", "gpus": [pci],
        "phase": "running", "request": "1 GPU",
        "created": "2026-01-01T00:00:00Z", "updated": "2026-01-01T00:00:00Z",
    }))
    .unwrap();
    r.init = gpuhook::host::procfs::ProcRef::of(std::process::id() as i32);
    st.insert(r);
}

fn main() {
    let n = env_n("BENCH_N", 100) as usize;
    let idle_s = env_n("BENCH_IDLE_S", 60);
    let dir = tempfile::Builder::new()
        .prefix("gpuhook-dp-bench-")
        .tempdir_in(testbed::trusted_tmp())
        .unwrap();
    let root = dir.path();
    let paths = FakeHost::dgx8().create(&root.join("host")).unwrap();
    let run = root.join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
    let state = run.join("state.json");
    let plugins = root.join("kubelet/device-plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let mut cfg = paths.config(&state);
    cfg["kubelet_plugin_dir"] = serde_json::json!(plugins);
    let config = root.join("config.json");
    std::fs::write(&config, cfg.to_string()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let reg = unix_incoming(tokio::net::UnixListener::bind(plugins.join("kubelet.sock")).unwrap());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(Kubelet))
                .serve_with_incoming(reg),
        );
        let mut plugin = std::process::Command::new(env!("CARGO_BIN_EXE_gpuhook-device-plugin"))
            .arg("--config")
            .arg(&config)
            .spawn()
            .unwrap();
        let pid = plugin.id();
        let sock = plugins.join("gpuhook-gpu.sock");
        let t0 = Instant::now();
        while !sock.exists() {
            assert!(t0.elapsed() < Duration::from_secs(20), "the plugin made no socket");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut c = DevicePluginClient::new(unix_channel(&sock).unwrap());
        let mut s = c.list_and_watch(Empty {}).await.unwrap().into_inner();
        s.message().await.unwrap().unwrap();
        let store = Store::new(&state);
        let pci = "0000:1a:00.0";
        let mut took = Vec::with_capacity(n);
        for i in 0..n {
            let taking = i % 2 == 0;
            let t = Instant::now();
            store
                .update(|st| -> Result<(), StateError> {
                    if taking {
                        domain(st, pci);
                    } else {
                        st.reservations.clear();
                    }
                    Ok(())
                })
                .unwrap();
            let want = if taking { "Unhealthy" } else { "Healthy" };
            loop {
                let m = tokio::time::timeout(Duration::from_secs(10), s.message())
                    .await
                    .expect("an update within 10 s")
                    .unwrap()
                    .unwrap();
                if m.devices.iter().any(|d| d.id == pci && d.health == want) {
                    break;
                }
            }
            took.push(t.elapsed());
        }
        took.sort();
        let median = took[n / 2];
        let worst = took[n - 1];
        // Idle: nothing changes; what it spends is its own ticks (the host rescanned, kubelet
        // asked) and nothing else.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (c0, w0) = (cpu_ticks(pid), Instant::now());
        tokio::time::sleep(Duration::from_secs(idle_s)).await;
        let (c1, wall) = (cpu_ticks(pid), w0.elapsed());
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100) as f64;
        let cpu_s = (c1 - c0) as f64 / hz;
        let rss = status_kb(pid, "VmRSS:");
        let hwm = status_kb(pid, "VmHWM:");
        println!("## gpuhook-device-plugin (dgx8 fake host, {n} pool changes)\n");
        println!("| what | value |");
        println!("|---|---|");
        println!(
            "| a pool change (a domain takes or frees a GPU) to the ListAndWatch update, median | {:.1} ms |",
            median.as_secs_f64() * 1e3
        );
        println!(
            "| the same, worst of {n} | {:.1} ms |",
            worst.as_secs_f64() * 1e3
        );
        println!(
            "| CPU while idle, {:.0} s | {:.2} s ({:.3} % of one CPU) |",
            wall.as_secs_f64(),
            cpu_s,
            100.0 * cpu_s / wall.as_secs_f64()
        );
        println!("| resident memory (VmRSS), peak (VmHWM) | {rss} KiB, {hwm} KiB |");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = plugin.wait();
    });
}
