//! The libvirt LXC hook: `NAME OP SUBOP EXTRA`, domain XML on stdin.
//!
//! | call | what gpuhook does |
//! |---|---|
//! | `prepare begin -` | parse the request, reserve GPUs (or fail the start with one line) |
//! | `start begin -` | check the reservation still stands |
//! | `started begin -` | grant the nodes in the container's device cgroup, then create them in its `/dev`; on failure undo both and fail (libvirt stops the container) |
//! | `stopped end -`, `release end …` | free the reservation held under the domain's UUID, whatever its XML says now; always exit 0 |
//! | `reconnect begin -` | re-adopt the reservation, re-grant and re-create what was lost; exit non-zero only when the container cannot be made consistent (libvirt then kills it) |
//!
//! This module is the libvirt front door only: it turns the XML into a [`Holder`] and a
//! request and calls [`crate::reserve::lifecycle`]. A domain whose XML does not mention gpuhook's
//! namespace leaves at once with 0, before the config or state is even opened, except at the
//! stop hooks, which look at the state's bytes for its UUID (its live XML may have lost the
//! request) and are silent about a broken config or state.

use crate::enter::container;
use crate::host::config::Config;
use crate::host::procfs;
use crate::log;
use crate::request::metadata::{self, Domain};
use crate::request::Request;
use crate::reserve::error::Error;
use crate::reserve::lifecycle::{self, Holder, Readopted};
use crate::reserve::state::{HolderId, Store};
use crate::reserve::world::World;
use std::ffi::OsStr;
use std::io::Read;
use std::path::Path;

/// Whether the program was started as a libvirt hook: `…/hooks/lxc` or `…/hooks/lxc.d/*`.
pub fn invoked_as_hook(argv0: &OsStr) -> bool {
    let p = Path::new(argv0);
    p.file_name() == Some(OsStr::new("lxc"))
        || p.parent().and_then(Path::file_name) == Some(OsStr::new("lxc.d"))
}

/// Reads the domain XML from stdin (bounded).
pub fn read_stdin() -> std::io::Result<Vec<u8>> {
    let mut xml = Vec::with_capacity(16 * 1024);
    std::io::stdin()
        .lock()
        .take(metadata::MAX_XML as u64 + 1)
        .read_to_end(&mut xml)?;
    Ok(xml)
}

/// Runs one hook call; returns the exit status.
pub fn run(name: &str, op: &str, xml: &[u8]) -> i32 {
    if matches!(op, "stopped" | "release") {
        stop(name, op, xml);
        return 0;
    }
    if !metadata::may_request(xml) {
        // A domain that asked for nothing may hold GPUs `gpuhook attach` gave it: a
        // reconnect re-adopts those (and only then is the state looked at).
        if op == "reconnect" {
            return reconnect_attached(name, xml);
        }
        // Metadata in a namespace that only looks like gpuhook's (a typo, another version):
        // said once, at `prepare`; the domain starts untouched.
        if op == "prepare" && metadata::mentions_family(xml) {
            if let Some(w) = metadata::parse_domain(xml)
                .ok()
                .as_ref()
                .and_then(metadata::unknown_ns_warning)
            {
                log::warn(&w);
            }
        }
        return 0;
    }
    let must_succeed = matches!(op, "prepare" | "start" | "started");
    let dom = match metadata::parse_domain(xml) {
        Ok(d) => d,
        Err(e) => {
            log::error(&format!("domain '{name}': {e}"));
            return if must_succeed { 1 } else { 0 };
        }
    };
    if op == "prepare" {
        if let Some(w) = metadata::unknown_ns_warning(&dom) {
            log::warn(&w);
        }
    }
    let Some(req) = dom.request.clone() else {
        return 0;
    };
    if op == "prepare" {
        match &dom.source {
            metadata::Source::Nova { .. } => log::info(&format!(
                "domain '{}': GPU request from {}: {req}",
                dom.name, dom.source
            )),
            metadata::Source::Gpuhook {
                nova_ignored: Some(flavor),
            } => log::warn(&format!(
                "domain '{}': the gpuhook <gpus> element is the request; Nova flavor '{flavor}' GPU extra specs are not read (Placement may have allocated otherwise)",
                dom.name
            )),
            _ => {}
        }
    }
    let h = holder(&dom);
    let find = || container::find(&dom.name, dom.id);
    let result = match op {
        "prepare" | "start" | "started" => step(op, &h, &req, find),
        // A non-zero exit at reconnect makes libvirt kill the container: only when it cannot
        // be made consistent.
        "reconnect" => {
            let readopted = match Config::load() {
                Ok(cfg) => lifecycle::readopt(&World::real(&cfg), &h, &req, find),
                Err(e) => lifecycle::config_unreadable(&h, &e),
            };
            return match readopted {
                Readopted::Inconsistent => 1,
                Readopted::Consistent | Readopted::LeftAlone => 0,
            };
        }
        other => {
            log::warn(&format!(
                "domain '{}': unknown hook operation '{other}'; nothing done",
                dom.name
            ));
            Ok(())
        }
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            log::error(&format!("domain '{}': {e}", dom.name));
            1
        }
    }
}

/// `prepare`, `start`, `started`: the step on this host's facts, with the config loaded
/// here; `prepare`'s reserving process is libvirtd, the hook's parent.
fn step(
    op: &str,
    h: &Holder,
    req: &Request,
    find: impl FnOnce() -> Result<container::Container, container::ContainerError>,
) -> Result<(), Error> {
    let cfg = Config::load()?;
    let f = World::real(&cfg);
    match op {
        "prepare" => lifecycle::prepare(&f, h, req, procfs::parent()).map(drop),
        "start" => lifecycle::confirm(&f, h, req),
        _ => lifecycle::activate(&f, h, req, find),
    }
}

/// `reconnect` of a domain whose XML asks for no GPU: when the state holds a reservation
/// under its UUID (GPUs attached while it ran), it is re-adopted as a request-less domain's
/// (the reservation's units, nodes owned by the container's root). Anything unreadable here
/// (config, state, XML) leaves the domain alone: it asked gpuhook for nothing.
fn reconnect_attached(name: &str, xml: &[u8]) -> i32 {
    let Some(uuid) = metadata::domain_uuid(xml) else {
        return 0;
    };
    let Ok(cfg) = Config::load() else { return 0 };
    let store = Store::new(&cfg.state_file);
    let id = HolderId::Libvirt {
        name: name.to_string(),
        uuid,
    };
    if !store.mentions(&id) {
        return 0;
    }
    // Only a libvirt reservation under exactly this UUID is re-adopted (the bytes matched
    // anywhere); never one allocated afresh for a domain that asked for nothing.
    let held = store.update(|st| {
        Ok::<_, crate::reserve::state::StateError>(st.reservations.contains_key(&id.key()))
    });
    if !matches!(held, Ok(true)) {
        return 0;
    }
    let (Ok(dom), Ok(req)) = (
        metadata::parse_domain(xml),
        crate::request::oci::request(&Default::default()),
    ) else {
        return 0;
    };
    let h = holder(&dom);
    let find = || container::find(&dom.name, dom.id);
    match lifecycle::readopt(&World::real(&cfg), &h, &req, find) {
        Readopted::Inconsistent => 1,
        Readopted::Consistent | Readopted::LeftAlone => 0,
    }
}

/// A libvirt domain as a holder of GPUs: keyed by its UUID; its nodes owned per `<idmap>`.
fn holder(dom: &Domain) -> Holder<'_> {
    Holder::libvirt(&dom.name, &dom.uuid, &dom.idmap)
}

/// `stopped`/`release`: frees what the state holds for the domain's UUID, whatever its live
/// XML says now (`gpuhook-libvirt request --clear --live` drops the request from a running
/// domain's live definition, and the stop hooks then get XML without it). A domain the state
/// does not name costs a config read and one look at the state's bytes; trouble with either
/// is said only for a domain whose XML asks for GPUs (others are none of gpuhook's business).
fn stop(name: &str, op: &str, xml: &[u8]) {
    let asks = metadata::may_request(xml);
    let fail = |e: &dyn std::fmt::Display| {
        if asks {
            log::error(&format!("domain '{name}': {op}: cannot free its GPUs: {e}"));
        }
    };
    let Some(uuid) = metadata::domain_uuid(xml) else {
        return fail(&"domain XML has no valid <uuid>");
    };
    let cfg = match Config::load() {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let id = HolderId::Libvirt {
        name: name.to_string(),
        uuid,
    };
    if !asks && !Store::new(&cfg.state_file).mentions(&id) {
        return;
    }
    match lifecycle::free_key(&World::real(&cfg), &id.key()) {
        Ok(Some(r)) => log::info(&format!(
            "{}: {op}: freed {}{}",
            id.who_exactly(),
            crate::ids::Unit::join(&r.gpus, ","),
            if asks {
                ""
            } else {
                " (its XML no longer asks for GPUs)"
            }
        )),
        Ok(None) => {}
        // The state names this domain: say why its GPUs stay held, whatever its XML says.
        Err(e) => log::error(&format!("domain '{name}': {op}: cannot free its GPUs: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_names() {
        assert!(invoked_as_hook(OsStr::new("/etc/libvirt/hooks/lxc")));
        assert!(invoked_as_hook(OsStr::new("lxc")));
        assert!(invoked_as_hook(OsStr::new(
            "/etc/libvirt/hooks/lxc.d/50-gpuhook"
        )));
        assert!(!invoked_as_hook(OsStr::new("/usr/bin/gpuhook")));
        assert!(!invoked_as_hook(OsStr::new("/etc/libvirt/hooks/qemu")));
    }
}
