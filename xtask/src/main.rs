//! Developer tasks: `cargo run -p xtask -- dist DIR` writes the man pages (gpuhook,
//! gpuhook-libvirt, gpuhook-runtime, and one per visible subcommand: gpuhook-attach, …) and
//! the shell completions of both binaries, generated from their clap definitions; `cargo run -p xtask -- structure` checks the code's structure
//! (see `xtask::structure`).

use clap::CommandFactory;
use std::path::Path;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [cmd, dir] if cmd == "dist" => {
            if let Err(e) = dist(Path::new(dir)) {
                eprintln!("xtask: {e}");
                std::process::exit(1);
            }
        }
        [cmd, rest @ ..] if cmd == "structure" => std::process::exit(structure(rest)),
        _ => {
            eprintln!(
                "usage: cargo run -p xtask -- dist DIR | structure [--root DIR] [--deny KIND,...]"
            );
            std::process::exit(2);
        }
    }
}

/// `structure [--root DIR] [--deny KIND,...]`: prints every finding; exits 1 when one is of a
/// denied kind (default: all; `--deny ''` denies none), 2 on bad arguments.
fn structure(args: &[String]) -> i32 {
    use xtask::structure::{check, KINDS};
    let mut root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut deny: Vec<String> = KINDS.iter().map(|k| k.to_string()).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f, Some(v.to_owned())),
            None => (a.as_str(), None),
        };
        let value = inline.or_else(|| it.next().cloned());
        match (flag, value) {
            ("--root", Some(v)) => root = v.into(),
            ("--deny", Some(v)) => {
                deny = v
                    .split(',')
                    .map(str::trim)
                    .filter(|k| !k.is_empty())
                    .map(str::to_owned)
                    .collect();
                if deny.iter().any(|k| k == "all") {
                    deny = KINDS.iter().map(|k| k.to_string()).collect();
                }
                if let Some(k) = deny.iter().find(|k| !KINDS.contains(&k.as_str())) {
                    eprintln!(
                        "xtask structure: unknown kind {k} (kinds: {})",
                        KINDS.join(",")
                    );
                    return 2;
                }
            }
            _ => {
                eprintln!("usage: cargo run -p xtask -- structure [--root DIR] [--deny KIND,...]");
                return 2;
            }
        }
    }
    let findings = match check(&root) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("xtask structure: {}: {e}", root.display());
            return 2;
        }
    };
    for f in &findings {
        println!("{f}");
    }
    let denied = findings
        .iter()
        .filter(|f| deny.iter().any(|k| k == f.kind))
        .count();
    eprintln!(
        "structure: {} findings, {denied} of a denied kind ({})",
        findings.len(),
        if deny.is_empty() {
            "none".to_owned()
        } else {
            deny.join(",")
        }
    );
    i32::from(denied > 0)
}

/// Writes `dir/man/`: a page for each program (`gpuhook(1)`, `gpuhook-libvirt(1)`,
/// `gpuhook-runtime(1)`) and for each of their visible subcommands (`gpuhook-attach(1)`,
/// `gpuhook-health-reset(1)`, `gpuhook-libvirt-request(1)`, …: the pages a program's page
/// names), and `dir/completions/` for bash, zsh and fish.
fn dist(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("man"))?;
    std::fs::create_dir_all(dir.join("completions"))?;
    for cmd in [
        gpuhook::doors::cli::Cli::command(),
        gpuhook::doors::cli::LibvirtCli::command(),
    ] {
        let name = cmd.get_name().to_owned();
        let mut built = cmd.clone().disable_help_subcommand(true);
        built.build();
        pages(&built, &dir.join("man"))?;
        for sh in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut c = cmd.clone();
            clap_complete::generate_to(sh, &mut c, &name, dir.join("completions"))?;
        }
    }
    page(gpuhook::doors::cli::runtime_command(), &dir.join("man"))
}

/// The page of `cmd` and of each visible subcommand below it.
fn pages(cmd: &clap::Command, dir: &Path) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        pages(sub, dir)?;
    }
    page(cmd.clone(), dir)
}

fn page(cmd: clap::Command, dir: &Path) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(cmd)
        .date("2026-11-30")
        .source(format!("gpuhook {}", env!("CARGO_PKG_VERSION")))
        .manual("gpuhook");
    let mut buf = Vec::new();
    man.render(&mut buf)?;
    std::fs::write(dir.join(man.get_filename()), buf)
}
