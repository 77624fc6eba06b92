//! `gpuhook check`: a domain XML's GPU request, and what it would get now (a dry run).

use super::common::load;
use crate::doors::error::CliError;
use crate::doors::hook;
use crate::request::metadata;
use crate::reserve::alloc;
use crate::reserve::error::Error;
use crate::reserve::world::World;

pub(super) fn check(file: &str) -> Result<i32, CliError> {
    let xml = if file == "-" {
        hook::read_stdin().map_err(CliError::Stdin)?
    } else {
        std::fs::read(file).map_err(|source| CliError::ReadXml {
            file: file.to_string(),
            source,
        })?
    };
    let dom = metadata::parse_domain(&xml).map_err(|source| CliError::DomainXml {
        file: file.to_string(),
        source,
    })?;
    let Some(req) = &dom.request else {
        println!(
            "domain '{}' asks for no GPUs: gpuhook leaves it alone",
            dom.name
        );
        return Ok(0);
    };
    let (cfg, inv, st) = load()?;
    println!("domain '{}' asks for {req} ({})", dom.name, dom.source);
    let h = crate::reserve::lifecycle::Holder::libvirt(&dom.name, &dom.uuid, &dom.idmap);
    let (gpus, verb) = match st.reservations.get(&h.key) {
        Some(r) => (r.gpus.clone(), "holds"),
        None => match alloc::allocate(&inv.gpus, &st.held(None), req) {
            Ok(g) => (g, "would get"),
            Err(e) => {
                println!("not satisfiable now: {e}");
                return Ok(1);
            }
        },
    };
    println!("it {verb}:");
    for p in &gpus {
        if let Some(g) = inv.by_unit(p) {
            println!(
                "  {} {} {} {} (NUMA {})",
                g.index,
                p,
                g.model,
                g.arch.as_deref().unwrap_or("-"),
                g.numa_node.map_or("-".into(), |n| n.to_string())
            );
        }
    }
    let nodes = inv.nodes_for(&gpus, req.capabilities);
    println!(
        "nodes: {}",
        nodes
            .iter()
            .map(|n| format!("{} ({}:{})", n.path, n.major, n.minor))
            .collect::<Vec<_>>()
            .join(" ")
    );
    match crate::reserve::lifecycle::cdi_preview(&World::real(&cfg), &h, req, &inv, &gpus) {
        Ok(None) => {}
        Ok(Some(p)) => print_cdi(&p),
        // The host's driver says "driver \"host\": …" itself.
        Err(e @ Error::Driver(_)) => {
            println!("{e}");
            return Ok(1);
        }
        Err(e) => {
            println!("driver cdi: {e}");
            return Ok(1);
        }
    }
    Ok(0)
}

/// What a container gets from the CDI specs, for `check`.
fn print_cdi(p: &crate::cdi::Plan) {
    match &p.host_driver {
        Some(d) => println!("driver host: {d}"),
        None => println!(
            "driver cdi: from {} ({})",
            p.specs.join(", "),
            p.devices.join(" ")
        ),
    }
    let rw = p.mounts.iter().filter(|m| m.rw).count();
    println!(
        "  {} mount(s), read-only, nosuid, nodev{}",
        p.mounts.len(),
        if rw > 0 {
            format!(" ({rw} read-write as the spec says)")
        } else {
            String::new()
        }
    );
    for m in &p.mounts {
        println!(
            "    {} <- {}{}",
            m.target,
            m.source,
            if m.rw { " (rw)" } else { "" }
        );
    }
    if !p.nodes.is_empty() {
        println!(
            "  more nodes: {}",
            p.nodes
                .iter()
                .map(|n| format!("{} ({}:{})", n.node.path, n.node.major, n.node.minor))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    for l in &p.links {
        println!("  link {} -> {}", l.link, l.target);
    }
    if !p.ld_folders.is_empty() {
        println!("  linker cache for {}", p.ld_folders.join(" "));
    }
    for k in &p.hooks {
        println!(
            "  hook {} {} (passed to an OCI runtime; logged for libvirt)",
            k.stage,
            k.args.join(" ")
        );
    }
    if !p.env.is_empty() {
        println!("  env {}", p.env.join(" "));
    }
}
