//! What gpuhook's handler adds to a Kubernetes pod's start, measured through the CRI as
//! kubelet starts a container (`CreateContainer` + `StartContainer`), against the same pod on
//! containerd's default `runc` handler in the same run, interleaved:
//!
//! 1. `runc` handler, the pod annotated for one GPU (containerd passes no annotation to it:
//!    the baseline);
//! 2. `gpuhook` handler (the shipped snippet, the static gpuhook as gpuhook-runtime), no
//!    request: the wrapper's pass-through;
//! 3. `gpuhook` handler, one GPU: the reservation, the `config.json` edit, the hooks.
//!
//! Each round runs a fresh pod per variant (its sandbox started and removed untimed), in a
//! rotating order. A private containerd (Debian's 1.6) of the test bed on the blueprint's fake
//! host. Run with `make bench` (benches/run.sh); needs root, containerd, runc, busybox-static.
//! Prints a Markdown table; no assertion on time.

use std::path::PathBuf;
use std::time::{Duration, Instant};
use testbed::cri::bed::{Bed, Files};
use testbed::cri::pod::PodSpec;
use testbed::FakeHost;

const SLEEP: &str = "trap 'exit 0' TERM; while :; do sleep 1; done";

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn p90(v: &mut [Duration]) -> Duration {
    v.sort();
    v[(v.len() * 9 / 10).min(v.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn main() {
    let hook = PathBuf::from(
        std::env::var_os("BENCH_HOOK").expect("BENCH_HOOK is not set (run make bench)"),
    );
    let rounds: usize = std::env::var("BENCH_CRI_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let files = Files::with(hook);
    let mut b = Bed::new(&files, "bench", FakeHost::blueprint()).expect("the CRI bed");
    let handler = b.handler.clone();
    let variants: [(&str, &str, bool); 3] = [
        ("runc handler (baseline), pod annotated gpus=1", "", true),
        ("gpuhook handler, no request", handler.as_str(), false),
        ("gpuhook handler, gpus=1", handler.as_str(), true),
    ];
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    // One untimed round first: images unpacked, shim binaries in the page cache.
    for round in 0..=rounds {
        for k in 0..variants.len() {
            let v = (round + k) % variants.len();
            let (_, h, gpu) = variants[v];
            let mut spec = PodSpec::new(&format!("bench-{round}-{v}"));
            if gpu {
                spec = spec.annotate("gpuhook.io/gpus", "1");
            }
            let pod = b.pod_on(spec, h).expect("RunPodSandbox");
            let t = Instant::now();
            let id = b.create(&pod, "app", SLEEP).expect("CreateContainer");
            b.cri.start_container(&id).expect("StartContainer");
            let d = t.elapsed();
            if gpu && !h.is_empty() {
                assert_eq!(b.holders().get(&id).map(Vec::len), Some(1));
            }
            b.cri.stop_pod_sandbox(&pod.id).expect("StopPodSandbox");
            b.cri.remove_pod_sandbox(&pod.id).expect("RemovePodSandbox");
            if round > 0 {
                times[v].push(d);
            }
        }
    }
    let base = median(&mut times[0].clone());
    println!("\n## CRI: CreateContainer + StartContainer of one container ({rounds} pods each, interleaved)\n");
    println!("| variant | median | p90 | ÷ runc handler |");
    println!("|---|---|---|---|");
    let mut json = Vec::new();
    for (i, (name, _, _)) in variants.iter().enumerate() {
        let m = median(&mut times[i]);
        let p = p90(&mut times[i]);
        let ratio = m.as_secs_f64() / base.as_secs_f64();
        println!("| {name} | {} ms | {} ms | {ratio:.2}× |", ms(m), ms(p));
        json.push(
            serde_json::json!({"variant": name, "median_ms": m.as_secs_f64() * 1e3,
            "p90_ms": p.as_secs_f64() * 1e3, "ratio": ratio}),
        );
    }
    let _ = std::fs::create_dir_all("target/bench");
    let _ = std::fs::write(
        "target/bench/cri.json",
        serde_json::to_vec_pretty(&json).expect("json"),
    );
}
