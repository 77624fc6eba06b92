//! `gpuhook driver` (what `driver="host"` gives now), `gpuhook cdi generate` (the same as a
//! CDI spec, for engines that read CDI themselves), `gpuhook cdi check` (the vendors' specs
//! that no longer match the host), and `gpuhook cdi-hook` (the two NVIDIA hooks of a
//! generated spec, run by an OCI runtime).

use super::common::emit;
use crate::doors::error::CliError;
use crate::host::config::Config;
use crate::host::driver::{self, DriverFileKind as Kind};
use crate::ids::Vendor;
use crate::reserve::driver::{host_driver, Origin};
use crate::reserve::error::Error;
use serde_json::json;
use std::path::{Path, PathBuf};

/// What `gpuhook cdi` does.
#[derive(Debug, clap::Subcommand)]
pub enum CdiAction {
    /// Write what driver="host" gives now as a CDI spec (kind nvidia.com/gpu: a device per
    /// GPU by index and by UUID, per MIG GPU instance INDEX:GI, and all), for podman
    /// (--device nvidia.com/gpu=0) and containerd (enable_cdi)
    Generate {
        /// Replace this file atomically instead of printing (JSON when it ends in .json, else
        /// YAML), e.g. /var/run/cdi/nvidia.yaml
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// List the entries of the CDI specs in cdi_spec_dirs that no longer match the host (a
    /// file of another driver version, a file or node that is gone, a GPU it no longer
    /// has); exit 1 when any spec is stale
    Check {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
}

/// `gpuhook driver [--json]`.
pub(super) fn show(as_json: bool) -> Result<i32, Error> {
    let cfg = Config::load()?;
    let (d, from) = host_driver(&cfg)?;
    let f = &d.found;
    if as_json {
        let files: Vec<_> = f
            .files
            .iter()
            .map(|x| {
                json!({
                    "path": x.path, "kind": x.kind, "found_by": x.found_by,
                    "source": x.source, "soname": d.sonames.get(&x.path),
                })
            })
            .collect();
        let v = json!({
            "vendor": Vendor::Nvidia.as_str(),
            "version": f.version,
            "files": files,
            "root": cfg.root,
            "lib_dirs": f.lib_dirs,
            "cached": from == Origin::Cache,
        });
        println!("{}", serde_json::to_string_pretty(&v).expect("json"));
        return Ok(0);
    }
    println!(
        "NVIDIA driver {} (the loaded kernel module's), files under {}{}",
        f.version,
        cfg.root.display(),
        if from == Origin::Cache {
            " (from the cache)"
        } else {
            ""
        }
    );
    let word = |k: Kind| match k {
        Kind::Library => "library",
        Kind::Firmware => "firmware",
        Kind::Program => "program",
        Kind::Socket => "socket",
        Kind::Config => "config",
    };
    let by = |b: driver::FoundBy| match b {
        driver::FoundBy::LdCache => "ld.so.cache",
        driver::FoundBy::Directory => "directory",
        driver::FoundBy::Fixed => "fixed",
    };
    for x in &f.files {
        let through = if d.pinned.contains(&x.path) {
            format!("  (through {})", x.source.display())
        } else {
            String::new()
        };
        println!(
            "  {:<8}  {:<11}  {}{through}",
            word(x.kind),
            by(x.found_by),
            x.path
        );
    }
    let count = |k| f.of(k).count();
    println!(
        "{} files: {} libraries, {} firmware, {} programs, {} sockets, {} config files; linker cache for {}",
        f.files.len(),
        count(Kind::Library),
        count(Kind::Firmware),
        count(Kind::Program),
        count(Kind::Socket),
        count(Kind::Config),
        f.lib_dirs.join(" ")
    );
    Ok(0)
}

/// The program a generated spec's hooks run: this gpuhook.
fn own_path() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| std::fs::canonicalize(p).ok())
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| "/usr/bin/gpuhook".into())
}

pub(super) fn cdi(action: CdiAction) -> Result<i32, CliError> {
    match action {
        CdiAction::Generate { output } => generate(output.as_deref()),
        CdiAction::Check { json } => check(json),
    }
}

/// `gpuhook cdi generate [--output FILE]`.
fn generate(output: Option<&Path>) -> Result<i32, CliError> {
    let cfg = Config::load().map_err(Error::from)?;
    let (mut d, _) = host_driver(&cfg).map_err(Error::from)?;
    // A socket in a service account's directory: the engine would mount it by its path
    // whenever it starts a container, long after this check, and the account may have put
    // another socket there by then; gpuhook's own link to it would not follow a restart of
    // the daemon. Left out of the spec (driver="host" gives it).
    for p in std::mem::take(&mut d.pinned) {
        d.found.files.retain(|f| f.path != p);
        crate::log::warn(&format!(
            "{p} is left out of the spec: its directory is a service account's, which could put another socket in its place before an engine mounts it (driver=\"host\" gives it)"
        ));
    }
    let inv = crate::host::inventory::scan(&cfg).map_err(Error::from)?;
    let spec = crate::cdi::host::spec(&d.found, &d.sonames, &inv, &cfg.dev, &own_path())
        .map_err(Error::from)?;
    let json = output.is_some_and(|o| o.extension().is_some_and(|x| x == "json"));
    let text = if json {
        let mut t = serde_json::to_string_pretty(&spec).expect("json");
        t.push('\n');
        t
    } else {
        format!(
            "---\n{}",
            serde_yaml_ng::to_string(&spec).expect("a JSON value is YAML")
        )
    };
    emit(&text, output)
}

/// The specs of the three vendors' kinds in the config's spec directories, checked against
/// the host: the running NVIDIA module (if any) and the GPUs now.
pub(super) fn checked(cfg: &Config) -> Result<Vec<crate::cdi::host::Checked>, Error> {
    let kinds: Vec<&str> = [Vendor::Nvidia, Vendor::Amd, Vendor::Intel]
        .into_iter()
        .map(crate::cdi::kind_of)
        .collect();
    let specs = crate::cdi::load(&cfg.cdi_spec_dirs, &kinds)?;
    let version = driver::module_version(&cfg.proc).ok();
    let inv = crate::host::inventory::scan(cfg)?;
    Ok(crate::cdi::host::check(
        &specs,
        version.as_deref(),
        &inv,
        &cfg.dev,
    ))
}

/// `gpuhook cdi check [--json]`.
fn check(as_json: bool) -> Result<i32, CliError> {
    let cfg = Config::load().map_err(Error::from)?;
    let res = checked(&cfg)?;
    let version = driver::module_version(&cfg.proc).ok();
    let stale = res.iter().filter(|c| !c.stale.is_empty()).count();
    if as_json {
        let specs: Vec<_> = res
            .iter()
            .map(|c| {
                json!({
                    "path": c.spec, "kind": c.kind, "stale": !c.stale.is_empty(),
                    "entries": c.stale,
                })
            })
            .collect();
        let v = json!({
            "driver": version.as_ref().map(|v| json!({"vendor": "nvidia", "version": v})),
            "specs": specs,
            "stale": stale > 0,
        });
        println!("{}", serde_json::to_string_pretty(&v).expect("json"));
        return Ok(i32::from(stale > 0));
    }
    let dirs: Vec<String> = cfg
        .cdi_spec_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    if res.is_empty() {
        println!("no CDI specs in {}", dirs.join(", "));
        return Ok(0);
    }
    match &version {
        Some(v) => println!("the host runs NVIDIA driver {v}"),
        None => println!("no NVIDIA kernel module is loaded"),
    }
    for c in &res {
        if c.stale.is_empty() {
            println!("{} ({}): up to date", c.spec.display(), c.kind);
            continue;
        }
        println!(
            "{} ({}): stale, {} entr{}",
            c.spec.display(),
            c.kind,
            c.stale.len(),
            if c.stale.len() == 1 { "y" } else { "ies" }
        );
        for s in &c.stale {
            let dev = s
                .device
                .as_ref()
                .map(|d| format!("device {d}: "))
                .unwrap_or_default();
            println!("  {dev}{} {} {}", s.what, s.path, s.why);
        }
    }
    if stale > 0 {
        println!(
            "{stale} of {} spec(s) stale: regenerate them (`gpuhook cdi generate --output FILE` for NVIDIA's, or the vendor's generator), or use driver=\"host\"",
            res.len()
        );
    }
    Ok(i32::from(stale > 0))
}

/// `gpuhook cdi-hook create-symlinks|update-ldcache …`: run by an OCI runtime as a
/// `createContainer` hook of a spec `gpuhook cdi generate` wrote (the container's state on
/// stdin): the links and the linker cache in the container's root, as gpuhook's own `cdi`
/// hook makes them.
pub(super) fn cdi_hook(args: &[String]) -> Result<i32, CliError> {
    let what = crate::cdi::parse_native(args).map_err(CliError::CdiHook)?;
    let mut state = Vec::new();
    std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut state)
        .map_err(CliError::Stdin)?;
    let state: serde_json::Value =
        serde_json::from_slice(&state).map_err(CliError::CdiHookState)?;
    let bundle = state
        .get("bundle")
        .and_then(serde_json::Value::as_str)
        .ok_or(CliError::CdiHookNoBundle)?;
    let config = Path::new(bundle).join("config.json");
    let text = std::fs::read(&config).map_err(|source| CliError::ReadBundle {
        path: config.clone(),
        source,
    })?;
    let config: serde_json::Value =
        serde_json::from_slice(&text).map_err(CliError::CdiHookState)?;
    let root = config
        .pointer("/root/path")
        .and_then(serde_json::Value::as_str)
        .ok_or(CliError::CdiHookNoBundle)?;
    let root = Path::new(bundle).join(root);
    let (links, folders) = match what {
        crate::cdi::NativeHook::Links(l) => (l, Vec::new()),
        crate::cdi::NativeHook::Ldcache(f) => (Vec::new(), f),
    };
    let notes = crate::doors::runtime::root_work(&root.to_string_lossy(), links, folders)?;
    for n in notes {
        crate::log::info(&n);
    }
    Ok(0)
}
