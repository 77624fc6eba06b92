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

/// What a rollback could not undo, each in its own words: the one record every step that
/// takes back its work keeps (device-cgroup grants, nodes in a container's `/dev`, CDI
/// mounts, links and files), said on the failure's one line. It crosses the fork from the
/// container helper as a serde value.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Leftovers(Vec<String>);

impl Leftovers {
    /// One more thing not undone.
    pub fn push(&mut self, what: impl std::fmt::Display) {
        self.0.push(what.to_string());
    }
    /// Another step's leftovers, after these.
    pub fn append(&mut self, mut other: Leftovers) {
        self.0.append(&mut other.0);
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }
    /// `""`, or `"; rollback incomplete: …"`: said after the failure the rollback followed.
    pub fn note(&self) -> String {
        if self.is_empty() {
            String::new()
        } else {
            format!("; rollback incomplete: {self}")
        }
    }
}

/// The leftovers, `; `-separated.
impl std::fmt::Display for Leftovers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join("; "))
    }
}

impl FromIterator<String> for Leftovers {
    fn from_iter<I: IntoIterator<Item = String>>(it: I) -> Self {
        Leftovers(it.into_iter().collect())
    }
}

#[cfg(test)]
mod leftovers_tests {
    use super::Leftovers;

    #[test]
    fn leftovers_read_as_before() {
        let mut l = Leftovers::default();
        assert_eq!(l.note(), "");
        l.push("cgroup /fake: No such file or directory");
        l.append(
            ["mount /usr/lib/x: EBUSY".to_string()]
                .into_iter()
                .collect(),
        );
        assert_eq!(
            l.note(),
            "; rollback incomplete: cgroup /fake: No such file or directory; mount /usr/lib/x: EBUSY"
        );
        assert_eq!(
            serde_json::to_string(&l).unwrap(),
            r#"["cgroup /fake: No such file or directory","mount /usr/lib/x: EBUSY"]"#
        );
    }
}
