//! Process facts from the real `/proc` (never the config's `proc` root, which describes GPU
//! drivers): identity (PID + start time, so a reused PID is not mistaken for the old
//! process), children, PID-namespace ids.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// A process, identified across PID reuse by its start time (clock ticks since boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcRef {
    pub pid: i32,
    pub start_time: u64,
}

impl ProcRef {
    pub fn of(pid: i32) -> Option<ProcRef> {
        start_time(pid).map(|start_time| ProcRef { pid, start_time })
    }
    /// Whether this very process still exists (and is not a zombie).
    pub fn alive(&self) -> bool {
        match stat_fields(self.pid) {
            Some(f) => {
                f.first().map(String::as_str) != Some("Z")
                    && f.get(19).and_then(|s| s.parse().ok()) == Some(self.start_time)
            }
            None => false,
        }
    }
}

/// Reads a procfs file: no stat (procfs reports size 0), one buffer, until end of file.
fn read(p: impl AsRef<Path>) -> Option<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(p).ok()?;
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    loop {
        if n == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    buf.truncate(n);
    String::from_utf8(buf).ok()
}

/// Fields of `/proc/PID/stat` after the command name: [0] is the state, [19] the start time.
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    if pid <= 0 {
        return None;
    }
    let s = read(format!("/proc/{pid}/stat"))?;
    let rest = &s[s.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

pub fn start_time(pid: i32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// Direct children of a process (all its threads).
pub fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Some(s) = read(t.path().join("children")) {
                out.extend(s.split_whitespace().filter_map(|x| x.parse::<i32>().ok()));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// `NSpid:` of `/proc/PID/status`: the PID in each nested PID namespace, outermost first.
pub fn nspid(pid: i32) -> Vec<i32> {
    read(format!("/proc/{pid}/status"))
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("NSpid:").map(|v| {
                    v.split_whitespace()
                        .filter_map(|x| x.parse().ok())
                        .collect()
                })
            })
        })
        .unwrap_or_default()
}

pub fn comm(pid: i32) -> Option<String> {
    read(format!("/proc/{pid}/comm")).map(|s| s.trim_end().to_owned())
}

/// The process that ran us (libvirtd when we are its hook).
pub fn parent() -> Option<ProcRef> {
    ProcRef::of(nix::unistd::getppid().as_raw())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_of_self_and_children() {
        let me = ProcRef::of(std::process::id() as i32).unwrap();
        assert!(me.alive());
        assert!(!ProcRef {
            start_time: me.start_time + 1,
            ..me
        }
        .alive());
        assert!(!ProcRef {
            pid: -1,
            start_time: 0
        }
        .alive());
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let kids = children(std::process::id() as i32);
        assert!(kids.contains(&(child.id() as i32)), "{kids:?}");
        let c = ProcRef::of(child.id() as i32).unwrap();
        assert_eq!(nspid(child.id() as i32), vec![child.id() as i32]);
        assert_eq!(comm(child.id() as i32).as_deref(), Some("sleep"));
        child.kill().unwrap();
        // A zombie is not alive.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!c.alive());
        child.wait().unwrap();
        assert!(!c.alive());
    }
}
