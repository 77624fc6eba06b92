//! `gpuhook-testbed`: fake GPU hosts and the end-to-end demo.
//!
//! ```text
//! gpuhook-testbed fakehost PROFILE DIR     blueprint | dgx8 | dgx8-mig | mixed | mi300 | wideN, each -mig7 for 7 MIG instances per GPU and +M for M other PCI functions; writes DIR/config.json
//! gpuhook-testbed demo --hook BIN [--workdir DIR]
//! gpuhook-testbed cri scenarios|up|down|runp|create|start|exec|… (gpuhook-testbed cri --help)
//! gpuhook-testbed kubelet scenarios|serve|up|checkpoint (gpuhook-testbed kubelet --help)
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;
use testbed::{profile, Daemon, DomainSpec, FakeHost, Hook};

fn usage() -> ! {
    eprintln!("usage: gpuhook-testbed fakehost blueprint|dgx8|dgx8-mig|mixed|mi300|wideN[-mig7][+M] DIR\n       gpuhook-testbed demo --hook BIN [--workdir DIR]\n       gpuhook-testbed cri --help\n       gpuhook-testbed kubelet --help");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("cri") => std::process::exit(testbed::cri::cli::main(&args[1..])),
        Some("kubelet") => std::process::exit(testbed::kubelet::cli::main(&args[1..])),
        Some("fakehost") if args.len() == 3 => fakehost(&args[1], Path::new(&args[2])),
        Some("demo") => {
            let mut hook = None;
            let mut workdir = PathBuf::from("/var/tmp/gpuhook-demo");
            let mut it = args[1..].iter();
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--hook" => hook = it.next().map(PathBuf::from),
                    "--workdir" => {
                        workdir = it.next().map(PathBuf::from).unwrap_or_else(|| usage())
                    }
                    _ => usage(),
                }
            }
            demo(&hook.unwrap_or_else(|| usage()), &workdir)
        }
        _ => usage(),
    };
    if let Err(e) = r {
        eprintln!("gpuhook-testbed: {e}");
        std::process::exit(1);
    }
}

fn fakehost(name: &str, dir: &Path) -> Result<(), String> {
    let host = profile(name).ok_or_else(|| format!("unknown profile {name}"))?;
    let p = host
        .create(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let cfg = p.config(&dir.join("state/state.json"));
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec_pretty(&cfg).expect("json"),
    )
    .map_err(|e| e.to_string())?;
    println!("{}", dir.join("config.json").display());
    Ok(())
}

fn show(cmd: &mut Command) -> Result<String, String> {
    let shown: Vec<String> = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    println!("$ {}", shown.join(" "));
    let o = cmd.output().map_err(|e| e.to_string())?;
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    print!("{out}");
    eprint!("{}", String::from_utf8_lossy(&o.stderr));
    if !o.status.success() {
        return Err(format!("{} failed ({})", shown.join(" "), o.status));
    }
    Ok(out)
}

/// The main job, end to end: a real libvirtd with gpuhook as its LXC hook starts a
/// container that asks for two Fermi GPUs the way the blueprint's cg1 flavor did, and
/// stops it again. Uses the host's GPUs when it has any, else the blueprint's fake host.
fn demo(hook: &Path, workdir: &Path) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(workdir);
    std::fs::create_dir_all(workdir).map_err(|e| format!("{}: {e}", workdir.display()))?;
    let state = workdir.join("state/state.json");
    let real = gpuhook::host::inventory::scan(&gpuhook::host::config::Config::default())
        .map(|i| i.gpus.iter().filter(|g| g.usable()).count())
        .unwrap_or(0);
    let (cfg, metadata) = if real > 0 {
        println!("== this host has {real} usable GPU(s): the demo reserves one of them");
        (
            serde_json::json!({"state_file": state}),
            r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1" count="1"/>"#.to_owned(),
        )
    } else {
        println!(
            "== no GPU here: describing the blueprint's host (2x Tesla M2050, Fermi) under {}",
            workdir.join("host").display()
        );
        let p = FakeHost::blueprint()
            .create(&workdir.join("host"))
            .map_err(|e| e.to_string())?;
        (
            p.config(&state),
            "\n    <gpu:gpus xmlns:gpu=\"urn:gpuhook:gpu:1\">\n      <gpu:extra_spec name=\"gpus\">= 2</gpu:extra_spec>\n      <gpu:extra_spec name=\"gpu_arch\">s== fermi</gpu:extra_spec>\n    </gpu:gpus>\n  ".to_owned(),
        )
    };
    let mut d = Daemon::new(&workdir.join("libvirt"), Hook::Binary(hook.to_path_buf()))?;
    d.write_config(&cfg)?;
    let cfg_path = workdir.join("config.json");
    std::fs::write(&cfg_path, serde_json::to_vec_pretty(&cfg).expect("json"))
        .map_err(|e| e.to_string())?;
    println!(
        "== starting a private libvirtd with gpuhook as its hooks/lxc (uri {})",
        d.uri
    );
    d.start()?;
    let result = (|| {
        let spec = DomainSpec::new("gpuhook-demo", &metadata);
        println!("== domain XML:\n{}", spec.xml());
        d.define(&spec.xml())?;
        show(Command::new("virsh").args(["-c", &d.uri, "start", "gpuhook-demo"]))?;
        let gh = |args: &[&str]| {
            let mut c = Command::new(hook);
            c.args(args).env("GPUHOOK_CONFIG", &cfg_path);
            c
        };
        show(&mut gh(&["list"]))?;
        let ct = d.container("gpuhook-demo")?;
        println!("== inside the container (init pid {}):", ct.init.pid);
        show(&mut testbed::shell_in(
            ct.init.pid,
            "ls -l /dev | grep -E 'nvidia|dri|kfd'",
        ))?;
        let cg = gpuhook::cgroup::for_pid(ct.init.pid).map_err(|e| e.to_string())?;
        println!("== its device cgroup {}:", cg.path().display());
        if let Ok(list) = std::fs::read_to_string(cg.path().join("devices.list")) {
            print!("{list}");
        }
        show(Command::new("virsh").args(["-c", &d.uri, "destroy", "gpuhook-demo"]))?;
        show(&mut gh(&["list"]))?;
        Ok::<(), String>(())
    })();
    d.cleanup("gpuhook-demo");
    d.stop()?;
    result?;
    println!("== done: the container got its GPUs at start and gave them back at stop");
    Ok(())
}
