//! Logging to syslog (facility daemon, ident `gpuhook`) and stderr.
//!
//! Warnings and errors go to both (libvirt shows the hook's stderr to the `virsh` user on
//! failure); information goes to syslog, and to stderr too when `GPUHOOK_VERBOSE` is set or
//! a CLI command asked for it. No syslog socket (containers, minimal hosts): stderr only.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use syslog::{Facility, Formatter3164, Logger, LoggerBackend};

static VERBOSE: AtomicBool = AtomicBool::new(false);
static SYSLOG: Mutex<Option<Option<Logger<LoggerBackend, Formatter3164>>>> = Mutex::new(None);

pub fn set_verbose(v: bool) {
    VERBOSE.store(v, Ordering::Relaxed);
}

fn with_syslog(f: impl FnOnce(&mut Logger<LoggerBackend, Formatter3164>)) {
    let Ok(mut guard) = SYSLOG.lock() else { return };
    let slot = guard.get_or_insert_with(|| {
        syslog::unix(Formatter3164 {
            facility: Facility::LOG_DAEMON,
            hostname: None,
            process: "gpuhook".into(),
            pid: std::process::id(),
        })
        .ok()
    });
    if let Some(l) = slot.as_mut() {
        f(l);
    }
}

fn clean(msg: &str) -> String {
    one_line(msg, 2000)
}

pub fn info(msg: &str) {
    let msg = &clean(msg);
    with_syslog(|l| {
        let _ = l.info(msg);
    });
    if VERBOSE.load(Ordering::Relaxed) || std::env::var_os("GPUHOOK_VERBOSE").is_some() {
        eprintln!("gpuhook: {msg}");
    }
}

pub fn warn(msg: &str) {
    let msg = &clean(msg);
    with_syslog(|l| {
        let _ = l.warning(msg);
    });
    eprintln!("gpuhook: warning: {msg}");
}

/// An error: one line on stderr (what libvirt shows the user) and in syslog.
pub fn error(msg: &str) {
    let msg = &clean(msg);
    with_syslog(|l| {
        let _ = l.err(msg);
    });
    eprintln!("gpuhook: {msg}");
}

/// Escapes control characters (so the text stays on one line) and truncates to `max` chars.
pub fn one_line(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max));
    for (i, c) in s.chars().enumerate() {
        if i == max {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}
