//! `gpuhook check [FILE|-] [--json]`: what a domain XML, or an OCI bundle's `config.json`,
//! asks for, and what it would get now (a dry run: nothing is reserved or written).
//!
//! The file says what it is: JSON with `ociVersion` is a bundle's `config.json` (its request
//! from the `gpuhook.io/` annotations, else the `GPUHOOK_` variables of `process.env`,
//! checked as `gpuhook-runtime create` checks it); anything else is read as a domain XML.
//! Other JSON is named as what it is not. No FILE and a terminal on standard input is a
//! usage error (said at once, not waited on).

use super::common::load;
use crate::doors::bundle::{self, parse::Policy};
use crate::doors::error::CliError;
use crate::doors::hook;
use crate::host::inventory::Inventory;
use crate::ids::Unit;
use crate::request::metadata::{self, Domain};
use crate::request::oci::{self, KeyFrom};
use crate::request::{IdMap, Request, Wording};
use crate::reserve::alloc;
use crate::reserve::error::Error;
use crate::reserve::lifecycle::Holder;
use crate::reserve::world::World;
use serde_json::{json, Value};
use std::io::IsTerminal;

/// What `check` was given to read.
pub(super) enum Input<'a> {
    /// A file by its path.
    File(&'a str),
    /// Standard input: named `-` (`true`), or no FILE at all (`false`).
    Stdin(bool),
}

/// What the file asks for, whichever kind of file it is.
struct Asked {
    /// `domain` or `bundle`, as `--json`'s `kind` says.
    kind: &'static str,
    /// How the text names it: `domain 'web1'`, `bundle config.json`.
    who: String,
    name: Option<String>,
    uuid: Option<String>,
    request: Option<Request>,
    /// Where its request came from, in the file's own terms.
    source: Option<String>,
    /// What the operator should know that is no error (a namespace that looks like
    /// gpuhook's and is not read).
    warnings: Vec<String>,
    /// Its holder's identity: a domain's name and UUID, a container's ID.
    id: (String, String),
    idmap: IdMap,
    /// The words its request was written in: a refusal says what to ask for instead in them.
    wording: Wording,
}

impl Asked {
    fn holder(&self) -> Holder<'_> {
        match self.kind {
            "domain" => Holder::libvirt(&self.id.0, &self.id.1, &self.idmap),
            _ => Holder::oci(&self.id.0, &self.idmap),
        }
    }
}

/// Usage: no FILE, and standard input is a terminal (nothing would ever come).
pub(super) const ON_A_TERMINAL: &str = "check reads a domain XML or an OCI bundle's config.json from FILE, or from standard input, which is a terminal here: give a FILE (gpuhook check domain.xml), or pipe one in (virsh dumpxml NAME | gpuhook check -)";

/// Whether `check` with this input would only wait on a terminal.
pub(super) fn waits_on_a_terminal(input: &Input) -> bool {
    matches!(input, Input::Stdin(false)) && std::io::stdin().is_terminal()
}

pub(super) fn check(input: Input, as_json: bool) -> Result<i32, CliError> {
    let (file, bytes) = match input {
        Input::File(f) => (
            f.to_string(),
            std::fs::read(f).map_err(|source| CliError::ReadXml {
                file: f.to_string(),
                source,
            })?,
        ),
        Input::Stdin(named) => {
            if named && std::io::stdin().is_terminal() {
                eprintln!("gpuhook: reading a domain XML or a bundle's config.json from the terminal; end it with Ctrl-D");
            }
            (
                "-".to_string(),
                hook::read_stdin().map_err(CliError::Stdin)?,
            )
        }
    };
    let asked = match first_byte(&bytes) {
        Some(b'{') | Some(b'[') => bundle_asks(&file, &bytes)?,
        _ => domain_asks(&file, &bytes)?,
    };
    // A dry run: said to the operator, not logged.
    for w in &asked.warnings {
        eprintln!("gpuhook: warning: {}", crate::log::one_line(w, 2000));
    }
    let out = dry_run(&file, &asked)?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&out.json).expect("json"));
    } else {
        print!("{}", out.text);
    }
    Ok(if out.ok { 0 } else { 1 })
}

fn first_byte(b: &[u8]) -> Option<u8> {
    b.iter().copied().find(|c| !c.is_ascii_whitespace())
}

/// A domain XML's request.
fn domain_asks(file: &str, xml: &[u8]) -> Result<Asked, CliError> {
    let dom: Domain = metadata::parse_domain(xml).map_err(|source| CliError::DomainXml {
        file: file.to_string(),
        source,
    })?;
    let warnings = metadata::unknown_ns_warning(&dom).into_iter().collect();
    Ok(Asked {
        kind: "domain",
        who: format!("domain '{}'", dom.name),
        name: Some(dom.name.clone()),
        uuid: Some(dom.uuid.clone()),
        source: dom.request.as_ref().map(|_| dom.source.to_string()),
        request: dom.request,
        warnings,
        id: (dom.name, dom.uuid),
        idmap: dom.idmap,
        wording: Wording::Xml,
    })
}

/// An OCI bundle's `config.json`: its request as `gpuhook-runtime create` reads it. JSON
/// that is not one is said to be what it is not.
fn bundle_asks(file: &str, bytes: &[u8]) -> Result<Asked, CliError> {
    let v: Value = serde_json::from_slice(bytes).map_err(|source| CliError::CheckJson {
        file: file.to_string(),
        source,
    })?;
    if v.get("ociVersion").is_none() {
        return Err(CliError::NotARequestFile {
            file: file.to_string(),
        });
    }
    let cfg = crate::host::config::Config::load().map_err(Error::from)?;
    let policy = Policy {
        env_requests: cfg.oci_env_requests,
    };
    let b = bundle::parse::parse(bytes, policy).map_err(|source| CliError::CheckBundle {
        file: file.to_string(),
        source,
    })?;
    let from = oci::pairs(&b.config, policy.env_requests)
        .ok()
        .and_then(|p| p.values().next().map(|(k, _)| k.clone()));
    let source = b.request.as_ref().map(|_| match from {
        Some(KeyFrom::Env(_)) => "GPUHOOK_ variables of process.env".to_string(),
        _ => "gpuhook.io/ annotations".to_string(),
    });
    let mut warnings = Vec::new();
    if b.request.is_none() && bundle::parse::is_sandbox(&b.config) {
        warnings.push(format!(
            "{file}: a Kubernetes pod's sandbox (pause) container: it never gets GPUs"
        ));
    }
    // The container's ID is not in its config: its bundle directory's name stands in.
    let id = std::path::Path::new(file)
        .parent()
        .and_then(|d| d.file_name())
        .and_then(|n| n.to_str())
        .filter(|n| bundle::parse::valid_id(n))
        .unwrap_or("bundle")
        .to_string();
    Ok(Asked {
        kind: "bundle",
        who: format!("bundle {file}"),
        name: None,
        uuid: None,
        request: b.request,
        source,
        warnings,
        id: (id.clone(), id),
        idmap: b.idmap,
        wording: b.wording,
    })
}

/// What the dry run says, as text and as JSON, and whether the request is met.
struct Said {
    text: String,
    json: Value,
    ok: bool,
}

/// The request against the host now: the units it would get (or holds), their nodes, the
/// driver files; or why not.
fn dry_run(file: &str, a: &Asked) -> Result<Said, CliError> {
    let mut json = json!({
        "file": file, "kind": a.kind, "name": a.name, "uuid": a.uuid,
        "request": a.request.as_ref().map(|r| r.to_string()), "source": a.source,
        "warnings": a.warnings, "holds": false, "satisfiable": true, "refusal": null,
        "gpus": [], "nodes": [], "driver": null,
    });
    let Some(req) = &a.request else {
        let text = match a.kind {
            "domain" => format!("{} asks for no GPUs: gpuhook leaves it alone\n", a.who),
            _ => format!(
                "{} asks for no GPUs: gpuhook-runtime passes it to the real runtime untouched\n",
                a.who
            ),
        };
        return Ok(Said {
            text,
            json,
            ok: true,
        });
    };
    let (cfg, inv, st) = load()?;
    // A typo in an architecture is an error in the request, not a shortage.
    alloc::known_arch(req, &alloc::known_archs(&cfg, &inv.gpus)).map_err(|source| {
        CliError::CheckRequest {
            file: file.to_string(),
            who: a.who.clone(),
            source: Box::new(source),
        }
    })?;
    let mut text = format!(
        "{} asks for {req} ({})\n",
        a.who,
        a.source.as_deref().unwrap_or("")
    );
    let h = a.holder();
    let held = (a.kind == "domain")
        .then(|| st.reservations.get(&h.key))
        .flatten();
    let (gpus, verb) = match held {
        Some(r) => (r.gpus.clone(), "holds"),
        None => match alloc::allocate(&inv.gpus, &st.held(None), req) {
            Ok(g) => (g, "would get"),
            Err(e) => {
                let e = e.in_words(a.wording);
                return Ok(refused(text, json, &e.to_string(), "not satisfiable now"));
            }
        },
    };
    json["holds"] = json!(verb == "holds");
    text.push_str(&format!("it {verb}:\n"));
    let mut units = Vec::new();
    for p in &gpus {
        if let Some(g) = inv.by_unit(p) {
            text.push_str(&format!(
                "  {} {} {} {} (NUMA {})\n",
                g.index,
                p,
                g.model,
                g.arch.as_deref().unwrap_or("-"),
                g.numa_node.map_or("-".into(), |n| n.to_string())
            ));
            units.push(json!({
                "unit": p, "index": g.index, "pci": g.pci, "model": g.model, "arch": g.arch,
                "numa_node": g.numa_node,
            }));
        }
    }
    json["gpus"] = json!(units);
    let nodes = inv.nodes_for(&gpus, req.capabilities);
    text.push_str(&format!(
        "nodes: {}\n",
        nodes
            .iter()
            .map(|n| format!("{} ({}:{})", n.path, n.major, n.minor))
            .collect::<Vec<_>>()
            .join(" ")
    ));
    json["nodes"] = json!(nodes);
    driver_part(&cfg, &h, req, &inv, &gpus, text, json)
}

/// The driver files the request would get (`driver="cdi"` or `"host"`), or why not.
fn driver_part(
    cfg: &crate::host::config::Config,
    h: &Holder,
    req: &Request,
    inv: &Inventory,
    gpus: &[Unit],
    mut text: String,
    mut json: Value,
) -> Result<Said, CliError> {
    match crate::reserve::lifecycle::cdi_preview(&World::real(cfg), h, req, inv, gpus) {
        Ok(None) => {}
        Ok(Some(p)) => {
            text.push_str(&cdi_text(&p));
            json["driver"] = cdi_json(&p);
        }
        // The host's driver says "driver \"host\": …" itself.
        Err(e @ Error::Driver(_)) => return Ok(refused(text, json, &e.to_string(), "")),
        Err(e) => return Ok(refused(text, json, &e.to_string(), "driver cdi")),
    }
    Ok(Said {
        text,
        json,
        ok: true,
    })
}

/// A request that cannot be met now: the line that says why.
fn refused(mut text: String, mut json: Value, why: &str, head: &str) -> Said {
    match head {
        "" => text.push_str(&format!("{why}\n")),
        h => text.push_str(&format!("{h}: {why}\n")),
    }
    json["satisfiable"] = json!(false);
    json["refusal"] = json!(why);
    Said {
        text,
        json,
        ok: false,
    }
}

/// What a container gets from the CDI specs (or the host's driver), for `check --json`.
fn cdi_json(p: &crate::cdi::Plan) -> Value {
    json!({
        "from": if p.host_driver.is_some() { "host" } else { "cdi" },
        "host": p.host_driver,
        "specs": p.specs,
        "devices": p.devices,
        "mounts": p.mounts.iter().map(|m| json!({"target": m.target, "source": m.source, "rw": m.rw})).collect::<Vec<_>>(),
        "nodes": p.nodes.iter().map(|n| &n.node).collect::<Vec<_>>(),
        "links": p.links.iter().map(|l| json!({"link": l.link, "target": l.target})).collect::<Vec<_>>(),
        "ld_folders": p.ld_folders,
        "hooks": p.hooks.iter().map(|k| json!({"stage": k.stage, "path": k.path, "args": k.args})).collect::<Vec<_>>(),
        "env": p.env,
    })
}

/// What a container gets from the CDI specs, for `check`.
fn cdi_text(p: &crate::cdi::Plan) -> String {
    let mut t = match &p.host_driver {
        Some(d) => format!("driver host: {d}\n"),
        None => format!(
            "driver cdi: from {} ({})\n",
            p.specs.join(", "),
            p.devices.join(" ")
        ),
    };
    let rw = p.mounts.iter().filter(|m| m.rw).count();
    t.push_str(&format!(
        "  {} mount(s), read-only, nosuid, nodev{}\n",
        p.mounts.len(),
        if rw > 0 {
            format!(" ({rw} read-write as the spec says)")
        } else {
            String::new()
        }
    ));
    for m in &p.mounts {
        t.push_str(&format!(
            "    {} <- {}{}\n",
            m.target,
            m.source,
            if m.rw { " (rw)" } else { "" }
        ));
    }
    if !p.nodes.is_empty() {
        t.push_str(&format!(
            "  more nodes: {}\n",
            p.nodes
                .iter()
                .map(|n| format!("{} ({}:{})", n.node.path, n.node.major, n.node.minor))
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    for l in &p.links {
        t.push_str(&format!("  link {} -> {}\n", l.link, l.target));
    }
    if !p.ld_folders.is_empty() {
        t.push_str(&format!("  linker cache for {}\n", p.ld_folders.join(" ")));
    }
    for k in &p.hooks {
        t.push_str(&format!(
            "  hook {} {} (passed to an OCI runtime; logged for libvirt)\n",
            k.stage,
            k.args.join(" ")
        ));
    }
    if !p.env.is_empty() {
        t.push_str(&format!("  env {}\n", p.env.join(" ")));
    }
    t
}
