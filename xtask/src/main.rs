//! Developer tasks: `cargo run -p xtask -- dist DIR` writes the man pages (gpuhook,
//! gpuhook-libvirt, gpuhook-runtime) and the shell completions of both binaries, generated
//! from their clap definitions.

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
        _ => {
            eprintln!("usage: cargo run -p xtask -- dist DIR");
            std::process::exit(2);
        }
    }
}

fn dist(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("man"))?;
    std::fs::create_dir_all(dir.join("completions"))?;
    for cmd in [
        gpuhook::doors::cli::Cli::command(),
        gpuhook::doors::cli::LibvirtCli::command(),
    ] {
        let name = cmd.get_name().to_owned();
        let mut buf = Vec::new();
        clap_mangen::Man::new(cmd.clone())
            .date("2026-11-30")
            .source(format!("gpuhook {}", env!("CARGO_PKG_VERSION")))
            .manual("gpuhook")
            .render(&mut buf)?;
        std::fs::write(dir.join("man").join(format!("{name}.1")), buf)?;
        for sh in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut c = cmd.clone();
            clap_complete::generate_to(sh, &mut c, &name, dir.join("completions"))?;
        }
    }
    let mut buf = Vec::new();
    clap_mangen::Man::new(gpuhook::doors::cli::runtime_command())
        .date("2026-11-30")
        .source(format!("gpuhook {}", env!("CARGO_PKG_VERSION")))
        .manual("gpuhook")
        .render(&mut buf)?;
    std::fs::write(dir.join("man/gpuhook-runtime.1"), buf)?;
    Ok(())
}
