//! `gpuhook-testbed cri …`: the CRI scenarios, a bed left running, and the CRI calls one by
//! one (as `crictl` makes them, for a bed's containerd), so that the tests' scenarios can be
//! run and driven by hand on another machine (a Debian 13 VM with containerd 1.7).

use super::bed::{Bed, Files};
use super::containerd::{self, Containerd, BUSYBOX_IMAGE};
use super::pod::PodSpec;
use super::{api, state_name, Cri};
use clap::{Parser, Subcommand};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

#[derive(Debug, Parser)]
#[command(
    name = "gpuhook-testbed cri",
    about = "Kubernetes' CRI against a private containerd with gpuhook's shipped handler",
    after_help = "Files: the gpuhook binary is --bin, else $GPUHOOK_TEST_BIN, else /usr/bin/gpuhook; \
the containerd snippet $GPUHOOK_CRI_SNIPPET, the RuntimeClass $GPUHOOK_CRI_RUNTIMECLASS, else the \
source tree's hooks/, else /usr/share/gpuhook/engines/. Needs root, containerd (ctr, \
containerd-shim-runc-v2), runc, busybox-static."
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
        /// List the scenarios only
        #[arg(long)]
        list: bool,
        names: Vec<String>,
    },
    /// Start a bed in DIR and leave it running (a fake host, gpuhook's config, containerd)
    Up {
        dir: PathBuf,
        #[arg(long)]
        bin: Option<PathBuf>,
        /// Fake host profile (as `gpuhook-testbed fakehost`)
        #[arg(long, default_value = "blueprint")]
        profile: String,
    },
    /// Remove a bed's pods, stop its containerd, remove DIR
    Down { dir: PathBuf },
    /// CRI Version and the runtime's Status
    Version {
        #[arg(long)]
        dir: PathBuf,
    },
    /// RunPodSandbox: prints the pod ID
    Runp {
        #[arg(long)]
        dir: PathBuf,
        name: String,
        /// Runtime handler (default: the RuntimeClass's; "" for the runtime's default)
        #[arg(long)]
        handler: Option<String>,
        /// KEY=VALUE, a pod annotation (repeatable)
        #[arg(long = "annotation", short = 'a')]
        annotations: Vec<String>,
        /// shareProcessNamespace: true
        #[arg(long)]
        share_pid: bool,
    },
    /// CreateContainer (busybox) running CMD…: prints the container ID
    Create {
        #[arg(long)]
        dir: PathBuf,
        pod: String,
        name: String,
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// StartContainer
    Start {
        #[arg(long)]
        dir: PathBuf,
        id: String,
    },
    /// ExecSync: CMD… in a running container; its output, its exit code
    Exec {
        #[arg(long)]
        dir: PathBuf,
        id: String,
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// StopContainer
    Stop {
        #[arg(long)]
        dir: PathBuf,
        id: String,
        #[arg(long, default_value_t = 10)]
        timeout: i64,
    },
    /// RemoveContainer
    Rm {
        #[arg(long)]
        dir: PathBuf,
        id: String,
    },
    /// StopPodSandbox
    Stopp {
        #[arg(long)]
        dir: PathBuf,
        id: String,
    },
    /// RemovePodSandbox
    Rmp {
        #[arg(long)]
        dir: PathBuf,
        id: String,
    },
    /// ListPodSandbox
    Pods {
        #[arg(long)]
        dir: PathBuf,
    },
    /// ListContainers
    Ps {
        #[arg(long)]
        dir: PathBuf,
    },
    /// ContainerStatus
    Inspect {
        #[arg(long)]
        dir: PathBuf,
        id: String,
    },
}

fn gpuhook_bin(bin: Option<PathBuf>) -> PathBuf {
    bin.or_else(|| std::env::var_os("GPUHOOK_TEST_BIN").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/usr/bin/gpuhook"))
}

/// `gpuhook-testbed cri ARGS…` (ARGS after `cri`); the exit status.
pub fn main(args: &[String]) -> i32 {
    let a = match Args::try_parse_from(
        std::iter::once("gpuhook-testbed cri".to_string()).chain(args.iter().cloned()),
    ) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    match run(a.cmd) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpuhook-testbed cri: {e}");
            1
        }
    }
}

fn scenarios(bin: Option<PathBuf>, list: bool, names: &[String]) -> i32 {
    let files = Files::with(gpuhook_bin(bin));
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
    println!(
        "gpuhook {}; snippet {}; RuntimeClass {}",
        files.gpuhook.display(),
        files.snippet.display(),
        files.runtimeclass.display()
    );
    let (mut passed, mut failed) = (0, Vec::new());
    for (name, f) in &chosen {
        let t0 = std::time::Instant::now();
        match std::panic::catch_unwind(|| f(&files)) {
            Ok(()) => {
                passed += 1;
                println!(
                    "scenario {name} ... ok ({:.1}s)",
                    t0.elapsed().as_secs_f64()
                );
            }
            Err(_) => {
                println!("scenario {name} ... FAILED");
                failed.push(*name);
            }
        }
    }
    if chosen.is_empty() {
        eprintln!("no scenario matched {names:?}");
        return 1;
    }
    if !failed.is_empty() {
        println!("failed: {failed:?}");
    }
    println!("{passed} passed, {} failed", failed.len());
    i32::from(!failed.is_empty())
}

/// What `up` leaves in DIR/bed.json for the other commands.
fn bed_record(dir: &Path) -> Result<Value, String> {
    let p = dir.join("bed.json");
    let b = std::fs::read(&p).map_err(|e| {
        format!(
            "{}: {e} (no bed: `cri up {}` first)",
            p.display(),
            dir.display()
        )
    })?;
    serde_json::from_slice(&b).map_err(|e| format!("{}: {e}", p.display()))
}

fn connect(dir: &Path) -> Result<(Cri, Value), String> {
    let rec = bed_record(dir)?;
    let sock = rec["socket"].as_str().ok_or("bed.json: no socket")?;
    let cri = Cri::connect(Path::new(sock)).map_err(|e| e.to_string())?;
    Ok((cri, rec))
}

fn pod_record(dir: &Path, id: &str) -> Result<(PodSpec, api::PodSandboxConfig), String> {
    let p = dir.join("cli-pods").join(format!("{id}.json"));
    let b =
        std::fs::read(&p).map_err(|e| format!("{}: {e} (a pod `cri runp` made?)", p.display()))?;
    let v: Value = serde_json::from_slice(&b).map_err(|e| e.to_string())?;
    let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
    let mut spec = PodSpec::new(&s("name"));
    spec.uid = s("uid");
    spec.namespace = s("namespace");
    spec.share_process_namespace = v["share_pid"] == json!(true);
    for (k, val) in v["annotations"].as_object().into_iter().flatten() {
        spec = spec.annotate(k, val.as_str().unwrap_or_default());
    }
    let config = spec.sandbox_config(&s("cgroup_parent"), Path::new(&s("log_dir")));
    Ok((spec, config))
}

fn run(cmd: Cmd) -> Result<i32, String> {
    let e = |e: super::CriError| e.to_string();
    match cmd {
        Cmd::Scenarios { bin, list, names } => Ok(scenarios(bin, list, &names)),
        Cmd::Up { dir, bin, profile } => {
            let fake =
                crate::profile(&profile).ok_or_else(|| format!("unknown profile {profile}"))?;
            let files = Files::with(gpuhook_bin(bin));
            let dir = std::path::absolute(&dir).map_err(|e| e.to_string())?;
            let tag = format!("up-{}", std::process::id());
            let mut bed = Bed::at(&files, &dir, &tag, fake)?;
            let rec = json!({
                "socket": bed.ctd.sock,
                "gpuhook_config": bed.config,
                "gpuhook": files.gpuhook,
                "snippet": files.snippet,
                "runtimeclass": files.runtimeclass,
                "handler": bed.handler,
                "cgroup_parent": bed.cgroup_parent,
                "containerd_pid": bed.ctd.pid(),
                "state_root": bed.ctd.state_root(),
            });
            std::fs::write(
                dir.join("bed.json"),
                serde_json::to_vec_pretty(&rec).expect("json"),
            )
            .map_err(|e| e.to_string())?;
            println!("CRI endpoint: unix://{}", bed.ctd.sock.display());
            println!(
                "handler: {} (RuntimeClass {})",
                bed.handler, bed.runtimeclass
            );
            println!("export GPUHOOK_CONFIG={}", bed.config.display());
            println!(
                "containerd log: {}",
                bed.ctd.opts.dir.join("containerd.log").display()
            );
            // Leave it running: no teardown on the way out.
            bed.ctd.detach();
            bed.keep = true;
            std::mem::forget(bed);
            Ok(0)
        }
        Cmd::Down { dir } => {
            let rec = bed_record(&dir)?;
            let opts = containerd::Options {
                dir: dir.join("containerd"),
                gpuhook: PathBuf::from(rec["gpuhook"].as_str().unwrap_or_default()),
                gpuhook_config: PathBuf::from(rec["gpuhook_config"].as_str().unwrap_or_default()),
                snippet: PathBuf::from(rec["snippet"].as_str().unwrap_or_default()),
            };
            let pid = rec["containerd_pid"].as_i64().unwrap_or(0) as i32;
            let mut c = Containerd::adopt(&opts, pid);
            for n in c.teardown() {
                eprintln!("{n}");
            }
            std::mem::forget(c);
            super::bed::remove_cgroups(
                rec["cgroup_parent"].as_str().unwrap_or("/gpuhook-cri/none"),
            );
            containerd::unmount_under(&dir);
            std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            Ok(0)
        }
        Cmd::Version { dir } => {
            let (mut cri, _) = connect(&dir)?;
            let v = cri.version().map_err(e)?;
            println!(
                "{} {} (CRI {})",
                v.runtime_name, v.runtime_version, v.runtime_api_version
            );
            let s = cri.status().map_err(e)?;
            for c in s.status.map(|s| s.conditions).unwrap_or_default() {
                println!("{}: {} {}", c.r#type, c.status, c.message);
            }
            Ok(0)
        }
        Cmd::Runp {
            dir,
            name,
            handler,
            annotations,
            share_pid,
        } => {
            let (mut cri, rec) = connect(&dir)?;
            let mut spec = PodSpec::new(&name);
            if share_pid {
                spec = spec.share_pid();
            }
            for a in &annotations {
                let (k, v) = a
                    .split_once('=')
                    .ok_or_else(|| format!("--annotation {a}: not KEY=VALUE"))?;
                spec = spec.annotate(k, v);
            }
            let handler =
                handler.unwrap_or_else(|| rec["handler"].as_str().unwrap_or_default().to_string());
            let cg = format!(
                "{}/pod{}",
                rec["cgroup_parent"].as_str().unwrap_or("/gpuhook-cri/cli"),
                spec.uid
            );
            let log_dir = dir
                .join("containerd/pods")
                .join(format!("{}_{}_{}", spec.namespace, spec.name, spec.uid));
            let _ = std::fs::create_dir_all(&log_dir);
            let id = cri
                .run_pod_sandbox(&spec.sandbox_config(&cg, &log_dir), &handler)
                .map_err(e)?;
            let pods = dir.join("cli-pods");
            let _ = std::fs::create_dir_all(&pods);
            let r = json!({
                "name": spec.name, "uid": spec.uid, "namespace": spec.namespace,
                "annotations": spec.annotations, "share_pid": share_pid,
                "cgroup_parent": cg, "log_dir": log_dir,
            });
            std::fs::write(pods.join(format!("{id}.json")), r.to_string())
                .map_err(|e| e.to_string())?;
            println!("{id}");
            Ok(0)
        }
        Cmd::Create {
            dir,
            pod,
            name,
            cmd,
        } => {
            let (mut cri, _) = connect(&dir)?;
            let (spec, config) = pod_record(&dir, &pod)?;
            let words: Vec<&str> = cmd.iter().map(String::as_str).collect();
            let c = spec.container_config(&name, BUSYBOX_IMAGE, &words);
            println!("{}", cri.create_container(&pod, &c, &config).map_err(e)?);
            Ok(0)
        }
        Cmd::Start { dir, id } => connect(&dir)?.0.start_container(&id).map(|_| 0).map_err(e),
        Cmd::Exec { dir, id, cmd } => {
            let words: Vec<&str> = cmd.iter().map(String::as_str).collect();
            let r = connect(&dir)?.0.exec_sync(&id, &words, 60).map_err(e)?;
            print!("{}", String::from_utf8_lossy(&r.stdout));
            eprint!("{}", String::from_utf8_lossy(&r.stderr));
            Ok(r.exit_code)
        }
        Cmd::Stop { dir, id, timeout } => connect(&dir)?
            .0
            .stop_container(&id, timeout)
            .map(|_| 0)
            .map_err(e),
        Cmd::Rm { dir, id } => connect(&dir)?.0.remove_container(&id).map(|_| 0).map_err(e),
        Cmd::Stopp { dir, id } => connect(&dir)?.0.stop_pod_sandbox(&id).map(|_| 0).map_err(e),
        Cmd::Rmp { dir, id } => connect(&dir)?
            .0
            .remove_pod_sandbox(&id)
            .map(|_| 0)
            .map_err(e),
        Cmd::Pods { dir } => {
            for p in connect(&dir)?.0.list_pod_sandbox().map_err(e)? {
                let m = p.metadata.unwrap_or_default();
                println!(
                    "{}  {}  {}  {}",
                    p.id,
                    m.name,
                    if p.state == 0 { "Ready" } else { "NotReady" },
                    p.runtime_handler
                );
            }
            Ok(0)
        }
        Cmd::Ps { dir } => {
            for c in connect(&dir)?.0.list_containers(None).map_err(e)? {
                let m = c.metadata.unwrap_or_default();
                println!(
                    "{}  {}  {}  pod {}",
                    c.id,
                    m.name,
                    state_name(c.state),
                    c.pod_sandbox_id
                );
            }
            Ok(0)
        }
        Cmd::Inspect { dir, id } => {
            let r = connect(&dir)?.0.container_status(&id).map_err(e)?;
            let s = r.status.unwrap_or_default();
            println!(
                "{}  {}  exit {}  reason {:?}  message {:?}",
                s.id,
                state_name(s.state),
                s.exit_code,
                s.reason,
                s.message
            );
            for (k, v) in r.info {
                println!("{k}: {v}");
            }
            Ok(0)
        }
    }
}
