//! `gpuhook-device-plugin` (also `gpuhook device-plugin`): kubelet's device plugin API
//! `v1beta1` over gpuhook's one GPU pool. One long-running process (the one exception to
//! gpuhook's "no daemon"): it serves one socket per resource in kubelet's plugin directory
//! (`gpuhook.io/gpu`, `gpuhook.io/gpu-shared`, `gpuhook.io/mig-PROFILE`), registers each
//! with kubelet (again whenever kubelet restarts), tells kubelet every unit with its health
//! as the pool changes (the state file's directory is watched), reserves what `Allocate`
//! names in the pool, and frees pod allocations kubelet no longer lists. It keeps nothing of
//! its own: the pool is the state file, so a restart loses nothing.
//!
//! It is a binary of its own because gRPC (tonic, hyper) would weigh on the hook's binary,
//! which libvirt and the OCI engines start at every container step.

mod kubelet;
mod pool;
mod register;
mod service;
mod watch;

use clap::Parser;
use gpuhook::host::config::Config;
use gpuhook::log;
use std::path::PathBuf;
use std::time::Duration;

/// How often the host is looked at again (what only a rescan shows: a GPU the driver stops
/// listing, draining that ends), kubelet's word read, and the sockets and registrations
/// checked, besides every change the watches see.
const TICK: Duration = Duration::from_secs(4);

#[derive(Debug, Parser)]
#[command(
    name = "gpuhook-device-plugin",
    version,
    about = "kubelet's device plugin API (v1beta1) over gpuhook's GPU pool",
    long_about = "Advertises this host's GPUs (gpuhook.io/gpu), MIG instances \
(gpuhook.io/mig-PROFILE) and shared slots (gpuhook.io/gpu-shared) to kubelet, with health \
that follows gpuhook's pool, and reserves in the pool what kubelet allocates to pods. \
Config: /etc/gpuhook/config.json, or the file named by $GPUHOOK_CONFIG or --config \
(kubelet_plugin_dir, kubelet_claim_s)."
)]
struct Args {
    /// Config file (default: $GPUHOOK_CONFIG, else /etc/gpuhook/config.json)
    #[arg(short, long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Also print informational messages on stderr
    #[arg(short, long)]
    verbose: bool,
}

fn main() {
    let args = Args::parse();
    log::set_verbose(args.verbose);
    if let Some(c) = &args.config {
        std::env::set_var(gpuhook::host::config::ENV, c);
    }
    let cfg = match Config::load() {
        Ok(c) => c,
        Err(e) => {
            log::error(&format!("device-plugin: {e}"));
            std::process::exit(1);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            log::error(&format!("device-plugin: cannot start: {e}"));
            std::process::exit(1);
        }
    };
    std::process::exit(rt.block_on(run(cfg)));
}

async fn run(cfg: Config) -> i32 {
    use tokio::signal::unix::{signal, SignalKind};
    let pool = pool::Pool::new(cfg);
    let mut watcher = match watch::Watcher::new(&pool.cfg.state_file, &pool.cfg.kubelet_plugin_dir)
    {
        Ok(w) => w,
        Err(e) => {
            log::error(&format!("device-plugin: inotify: {e}"));
            return 1;
        }
    };
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        log::error("device-plugin: cannot catch SIGTERM");
        return 1;
    };
    log::info(&format!(
        "device-plugin: serving {} (state {})",
        pool.cfg.kubelet_plugin_dir.display(),
        pool.cfg.state_file.display()
    ));
    pool.refresh();
    let mut servers = register::Servers::new(pool.clone());
    servers.reconcile().await;
    let mut kube = kubelet::Kubelet::new(pool.clone());
    kube.sync().await;
    let mut resources = pool.resources();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            c = watcher.next() => match c {
                Ok(c) => {
                    if c.state {
                        pool.refresh();
                    }
                    if c.sockets {
                        servers.reconcile().await;
                    }
                    if c.checkpoint {
                        kube.sync().await;
                    }
                }
                Err(e) => {
                    log::error(&format!("device-plugin: inotify: {e}"));
                    break;
                }
            },
            _ = tick.tick() => {
                if watcher.ensure() {
                    log::info("device-plugin: watching the state and kubelet's directories");
                }
                pool.refresh();
                servers.reconcile().await;
                kube.sync().await;
            },
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
        // A resource that appeared (a MIG profile made, sharing configured) gets its socket.
        let now = pool.resources();
        if now != resources {
            resources = now;
            servers.reconcile().await;
        }
    }
    servers.stop();
    log::info("device-plugin: stopped");
    0
}
