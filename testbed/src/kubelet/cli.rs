//! `gpuhook-testbed kubelet …`: the kubelet scenarios, the stand-in alone on a plugin
//! directory (for a device plugin run by hand), a whole bed driven from standard input, and
//! kubelet's checkpoint decoded.

use super::bed::{Files, KubeletBed, RunningPod};
use super::checkpoint::Checkpoint;
use super::pods::{Container, Pod};
use super::{EventKind, Kubelet};
use clap::{Parser, Subcommand};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "gpuhook-testbed kubelet",
    about = "A kubelet stand-in speaking the device plugin API v1beta1 and pod resources v1, against gpuhook's device plugin",
    after_help = "Files: the gpuhook binary is --bin, else $GPUHOOK_TEST_BIN, else /usr/bin/gpuhook; the \
device plugin --plugin (a command line), else $GPUHOOK_DEVICE_PLUGIN, else gpuhook-device-plugin \
beside gpuhook, else `gpuhook device-plugin`; the containerd snippet and RuntimeClass as for \
`gpuhook-testbed cri`. Needs root, containerd, runc, busybox-static (and libvirtd, podman for \
the health scenario)."
)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the scenarios (all, or those whose name contains a NAME): `N passed, M failed`
    Scenarios {
        #[arg(long)]
        bin: Option<PathBuf>,
        #[arg(long)]
        plugin: Option<String>,
        /// List the scenarios only
        #[arg(long)]
        list: bool,
        names: Vec<String>,
    },
    /// Serve kubelet's sockets on the plugin directory DIR until killed, printing what
    /// plugins say (a device plugin started by hand registers with it)
    Serve {
        dir: PathBuf,
        /// Do not serve the pod resources API
        #[arg(long)]
        no_pod_resources: bool,
    },
    /// A whole bed (fake host, containerd, the stand-in, the plugin) in DIR, driven by lines
    /// on standard input: `pod NAME RESOURCE=N [gpuhook]`, `rm NAME`, `devices`,
    /// `restart-kubelet`, `restart-plugin`, `quit`
    Up {
        dir: PathBuf,
        #[arg(long)]
        bin: Option<PathBuf>,
        #[arg(long)]
        plugin: Option<String>,
        /// Fake host profile (as `gpuhook-testbed fakehost`)
        #[arg(long, default_value = "blueprint")]
        profile: String,
        #[arg(long)]
        no_pod_resources: bool,
    },
    /// kubelet's checkpoint in the plugin directory DIR, its checksum verified, decoded
    Checkpoint { dir: PathBuf },
}

fn files(bin: Option<PathBuf>, plugin: Option<String>) -> Files {
    let gpuhook = bin
        .or_else(|| std::env::var_os("GPUHOOK_TEST_BIN").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/usr/bin/gpuhook"));
    let mut f = Files::with(gpuhook);
    if let Some(p) = plugin {
        f.plugin = p.split_whitespace().map(str::to_string).collect();
    }
    f
}

/// `gpuhook-testbed kubelet ARGS…` (ARGS after `kubelet`); the exit status.
pub fn main(args: &[String]) -> i32 {
    let a = match Args::try_parse_from(
        std::iter::once("gpuhook-testbed kubelet".to_string()).chain(args.iter().cloned()),
    ) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let r = match a.cmd {
        Cmd::Scenarios {
            bin,
            plugin,
            list,
            names,
        } => Ok(scenarios(&files(bin, plugin), list, &names)),
        Cmd::Serve {
            dir,
            no_pod_resources,
        } => serve(&dir, !no_pod_resources),
        Cmd::Up {
            dir,
            bin,
            plugin,
            profile,
            no_pod_resources,
        } => up(&dir, &files(bin, plugin), &profile, !no_pod_resources),
        Cmd::Checkpoint { dir } => Checkpoint::read(&dir).map(|cp| {
            match cp {
                None => println!("no checkpoint in {}", dir.display()),
                Some(cp) => print_checkpoint(&cp),
            }
            0
        }),
    };
    r.unwrap_or_else(|e| {
        eprintln!("gpuhook-testbed kubelet: {e}");
        1
    })
}

fn print_checkpoint(cp: &Checkpoint) {
    use prost::Message;
    println!("checksum {} (verified)", cp.checksum());
    for (r, ids) in &cp.registered {
        println!("registered {r}: {ids:?}");
    }
    for e in &cp.entries {
        let resp = kubelet_api::v1beta1::ContainerAllocateResponse::decode(e.alloc_resp.as_slice());
        println!(
            "pod {} container {} {}: {:?}\n  {resp:?}",
            e.pod_uid, e.container, e.resource, e.device_ids
        );
    }
}

fn scenarios(files: &Files, list: bool, names: &[String]) -> i32 {
    let chosen: Vec<_> = super::scenarios::SCENARIOS
        .iter()
        .filter(|(n, _)| names.is_empty() || names.iter().any(|f| n.contains(f.as_str())))
        .collect();
    if list {
        for (n, _) in &chosen {
            println!("{n}");
        }
        return 0;
    }
    if chosen.is_empty() {
        eprintln!("no scenario matched {names:?}");
        return 1;
    }
    println!(
        "gpuhook {}; device plugin {:?}; snippet {}",
        files.cri.gpuhook.display(),
        files.plugin,
        files.cri.snippet.display()
    );
    let (mut passed, mut failed) = (0, Vec::new());
    for (name, f) in &chosen {
        let t0 = std::time::Instant::now();
        let secs = || t0.elapsed().as_secs_f64();
        match std::panic::catch_unwind(|| f(files)) {
            Ok(()) => {
                passed += 1;
                println!("scenario {name} ... ok ({:.1}s)", secs());
            }
            Err(_) => {
                println!("scenario {name} ... FAILED ({:.1}s)", secs());
                failed.push(*name);
            }
        }
    }
    if !failed.is_empty() {
        println!("failed: {failed:?}");
    }
    println!("{passed} passed, {} failed", failed.len());
    i32::from(!failed.is_empty())
}

/// Prints kubelet's events from `from` on; the next index.
fn print_events(k: &Kubelet, from: usize) -> usize {
    let st = k.shared.lock();
    for e in st.events.iter().skip(from) {
        let t =
            e.at.duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64();
        match &e.what {
            EventKind::Listed { resource, devices } => {
                let d: Vec<String> = devices
                    .iter()
                    .map(|d| format!("{} {} numa{:?}", d.id, d.health, d.numa))
                    .collect();
                println!("{t:.3} ListAndWatch {resource}: {}", d.join(", "));
            }
            other => println!("{t:.3} {other:?}"),
        }
    }
    st.events.len()
}

fn serve(dir: &std::path::Path, pod_resources: bool) -> Result<i32, String> {
    let k = Kubelet::start(dir, pod_resources)?;
    println!(
        "kubelet stand-in: {} (pod resources: {})",
        k.socket().display(),
        if pod_resources {
            super::pod_resources_socket(dir).display().to_string()
        } else {
            "not served".into()
        }
    );
    // Until killed, as kubelet (its sockets stay behind, as a killed kubelet's do).
    let mut seen = 0;
    loop {
        k.shared
            .wait(Duration::from_secs(1), |st| st.events.len() > seen);
        seen = print_events(&k, seen);
    }
}

fn up(dir: &std::path::Path, files: &Files, profile: &str, podres: bool) -> Result<i32, String> {
    let fake = crate::profile(profile).ok_or_else(|| format!("unknown profile {profile}"))?;
    let mut b = KubeletBed::new(files, "up", fake, podres, |_, _| {})?;
    println!(
        "bed in {} (asked for {}): gpuhook config {}, plugin dir {}, plugin log {}",
        b.dir().display(),
        dir.display(),
        b.cri.config.display(),
        b.plugin_dir.display(),
        b.plugin_log.display()
    );
    let mut pods: BTreeMap<String, RunningPod> = BTreeMap::new();
    let mut seen = print_events(&b.kubelet, 0);
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| e.to_string())?;
        let w: Vec<&str> = line.split_whitespace().collect();
        let r: Result<(), String> = match w.as_slice() {
            ["pod", name, req, rest @ ..] => {
                let (res, n) = req.split_once('=').ok_or("RESOURCE=N")?;
                let n: usize = n.parse().map_err(|_| "N: a number")?;
                let mut p = Pod::new(name)
                    .container(Container::new("app", super::scenarios::SLEEP).limit(res, n));
                if rest.contains(&"gpuhook") {
                    p = p.runtime_class(&b.cri.handler.clone());
                }
                b.run_pod(&p).map(|rp| {
                    println!("pod {name}: container {}", rp.id("app"));
                    pods.insert(name.to_string(), rp);
                })
            }
            ["rm", name] => match pods.remove(*name) {
                Some(rp) => {
                    b.delete_pod(&rp);
                    Ok(())
                }
                None => Err(format!("no pod {name}")),
            },
            ["devices"] => {
                let st = b.kubelet.shared.lock();
                println!(
                    "healthy {:?}\nallocated {:?}",
                    st.devices.healthy, st.devices.allocated
                );
                Ok(())
            }
            ["restart-kubelet"] => b.kubelet.restart(),
            ["restart-plugin"] => {
                b.kill_plugin();
                b.start_plugin()
            }
            ["quit"] => break,
            [] => Ok(()),
            _ => Err(format!("? {line}")),
        };
        if let Err(e) = r {
            println!("error: {e}");
        }
        seen = print_events(&b.kubelet, seen);
    }
    for rp in pods.values() {
        b.delete_pod(rp);
    }
    Ok(0)
}
