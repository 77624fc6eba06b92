//! libvirt's QEMU hook: `NAME OP SUBOP EXTRA`, the domain XML on stdin; the same binary
//! installed as `/etc/libvirt/hooks/qemu` (or `hooks/qemu.d/50-gpuhook`), or run as `gpuhook
//! hook --qemu NAME OP SUBOP EXTRA`.
//!
//! | call | what gpuhook does |
//! |---|---|
//! | `prepare begin -`, `restore begin -` | reserve every GPU the VM's PCI hostdevs name (with the other functions of its device) and every mediated device of a GPU, all or nothing; or fail the start in one line naming the GPU and its holder |
//! | `start begin -` | check the reservation still stands |
//! | `started begin -` | record the QEMU process (libvirt's pid file, its start time): once it is gone the reservation is stale |
//! | `stopped end -`, `release end …` | free the reservation under the VM's key, whatever its XML says now; always exit 0 |
//! | `reconnect begin -`, `attach begin -` | keep what the running VM holds, add what its hostdevs hold that no one else has; exit 0 |
//! | `migrate begin -` | refused in one line for a VM that passes GPUs through |
//!
//! Nothing is ever printed on standard output: libvirt reads it at `migrate` and `restore`
//! as the domain's new XML. A domain whose XML has no `<hostdev` and does not mention
//! gpuhook's namespace leaves at once with 0, before the config or the state is touched; at
//! the stop hooks such a domain costs a config read and one look at the state's bytes (a GPU
//! hot-unplugged while it ran is still reserved until it stops).

use crate::host::config::Config;
use crate::host::procfs;
use crate::log;
use crate::request::hostdev::{self, QemuDomain};
use crate::request::metadata;
use crate::reserve::error::Error;
use crate::reserve::lifecycle::{self, Holder};
use crate::reserve::state::{HolderId, Store};
use crate::reserve::vm::{self, VmError};
use crate::reserve::world::World;
use std::ffi::OsStr;
use std::path::Path;

/// Whether the program was started as libvirt's QEMU hook: `…/hooks/qemu` or
/// `…/hooks/qemu.d/*`.
pub fn invoked_as_qemu_hook(argv0: &OsStr) -> bool {
    let p = Path::new(argv0);
    p.file_name() == Some(OsStr::new("qemu"))
        || p.parent().and_then(Path::file_name) == Some(OsStr::new("qemu.d"))
}

/// The hook as libvirt (or `gpuhook hook --qemu`) runs it: the domain XML read from stdin
/// (bounded), then [`run`].
pub fn main(name: &str, op: &str) -> i32 {
    match crate::doors::hook::read_stdin() {
        Ok(xml) => run(name, op, &xml),
        Err(e) => {
            log::error(&format!(
                "vm '{name}': reading the domain XML from stdin: {e}"
            ));
            i32::from(must_succeed(op))
        }
    }
}

/// The calls whose failure fails the VM's start (or its restore, its incoming migration).
fn must_succeed(op: &str) -> bool {
    matches!(op, "prepare" | "start" | "started" | "restore" | "migrate")
}

/// Runs one hook call; returns the exit status.
pub fn run(name: &str, op: &str, xml: &[u8]) -> i32 {
    if matches!(op, "stopped" | "release") {
        stop(name, op, xml);
        return 0;
    }
    if !hostdev::may_hold(xml) {
        return 0;
    }
    let dom = match hostdev::parse_domain(xml) {
        Ok(d) => d,
        Err(e) => {
            log::error(&format!("vm '{name}': {e}"));
            return i32::from(must_succeed(op));
        }
    };
    let fail = |e: &dyn std::fmt::Display| {
        log::error(&format!("vm '{}': {e}", dom.name));
        i32::from(must_succeed(op))
    };
    if dom.gpuhook_request && matches!(op, "prepare" | "restore") {
        return fail(&VmError::GpuhookRequest {
            name: dom.name.clone(),
        });
    }
    if dom.hostdevs.is_empty() {
        return 0;
    }
    let cfg = match Config::load() {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let a = match vm::ask(&cfg, &dom) {
        Ok(a) => a,
        Err(e) => return fail(&e),
    };
    if a.is_empty() {
        // No hostdev of this VM is a GPU's.
        return 0;
    }
    match step(&cfg, op, &dom, &a) {
        Ok(()) => 0,
        Err(e) => fail(&e),
    }
}

/// One call for a VM whose hostdevs hold `a`.
fn step(cfg: &Config, op: &str, dom: &QemuDomain, a: &vm::VmAsk) -> Result<(), Error> {
    let h = Holder::vm(&dom.name, &dom.uuid);
    let w = World::real(cfg);
    match op {
        "prepare" | "restore" => lifecycle::vm_prepare(&w, &h, a, procfs::parent()),
        "start" => lifecycle::vm_confirm(&w, &h, a),
        "started" => match crate::host::qemu::process(cfg, w.proc, &dom.name)? {
            Some(q) => lifecycle::vm_started(&w, &h, a, q),
            None => Err(VmError::NoQemu {
                pidfile: cfg.libvirt_qemu_dir.join(format!("{}.pid", dom.name)),
            }
            .into()),
        },
        // libvirt stops a VM whose reconnect hook fails: whatever cannot be done is said in
        // the log, and the VM keeps running.
        "reconnect" | "attach" => {
            let qemu = match crate::host::qemu::process(cfg, w.proc, &dom.name) {
                Ok(q) => q,
                Err(e) => {
                    log::warn(&format!("vm '{}': {op}: {e}", dom.name));
                    None
                }
            };
            if let Err(e) = lifecycle::vm_adopt(&w, &h, a, qemu) {
                log::error(&format!("vm '{}': {op}: {e}", dom.name));
            }
            Ok(())
        }
        "migrate" => Err(VmError::Migrate {
            units: crate::ids::Unit::join(&a.units, ","),
        }
        .into()),
        other => {
            log::warn(&format!(
                "vm '{}': unknown hook operation '{other}'; nothing done",
                dom.name
            ));
            Ok(())
        }
    }
}

/// `stopped`/`release`: frees what the state holds under the VM's key, whatever its live XML
/// says now (a GPU hot-unplugged while it ran is still in its reservation). A VM the state
/// does not name costs a config read and one look at the state's bytes; trouble with either
/// is said only for a VM whose XML passes something through.
fn stop(name: &str, op: &str, xml: &[u8]) {
    let asks = hostdev::may_hold(xml);
    let fail = |e: &dyn std::fmt::Display| {
        if asks {
            log::error(&format!("vm '{name}': {op}: cannot free its GPUs: {e}"));
        }
    };
    let Some(uuid) = metadata::domain_uuid(xml) else {
        return fail(&"domain XML has no valid <uuid>");
    };
    let cfg = match Config::load() {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let id = HolderId::Vm {
        name: name.to_string(),
        uuid,
    };
    if !Store::new(&cfg.state_file).mentions(&id) {
        return;
    }
    match lifecycle::free_key(&World::real(&cfg), &id.key()) {
        Ok(Some(r)) => log::info(&format!(
            "{}: {op}: freed {}",
            id.who_exactly(),
            crate::ids::Unit::join(&r.gpus, ",")
        )),
        Ok(None) => {}
        Err(e) => log::error(&format!("vm '{name}': {op}: cannot free its GPUs: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_names() {
        assert!(invoked_as_qemu_hook(OsStr::new("/etc/libvirt/hooks/qemu")));
        assert!(invoked_as_qemu_hook(OsStr::new("qemu")));
        assert!(invoked_as_qemu_hook(OsStr::new(
            "/etc/libvirt/hooks/qemu.d/50-gpuhook"
        )));
        assert!(!invoked_as_qemu_hook(OsStr::new("/usr/bin/gpuhook")));
        assert!(!invoked_as_qemu_hook(OsStr::new("/etc/libvirt/hooks/lxc")));
        assert!(!invoked_as_qemu_hook(OsStr::new(
            "/etc/libvirt/hooks/lxc.d/50-gpuhook"
        )));
        assert!(!invoked_as_qemu_hook(OsStr::new(
            "/usr/bin/qemu-system-x86_64"
        )));
    }
}
