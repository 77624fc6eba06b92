//! What the state records of a unit that is draining: its own nodes, and the processes that
//! had one of them open at the last look.

use crate::host::procfs::ProcRef;
use crate::ids::Unit;
use crate::node::Node;
use serde::{Deserialize, Serialize};

/// A unit that is draining: its own nodes, and who had one of them open at the last look.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Draining {
    /// The unit's own nodes (their numbers are what `/proc/*/fd` is searched for).
    pub nodes: Vec<Node>,
    /// The processes that had one of them open.
    pub holders: Vec<Opener>,
    /// When the last look did not finish in time (`procfs::Budget`): processes whose
    /// descriptors it did not all read (the largest tables first, a few), any of which may
    /// have one open; the unit stays draining until a look reads them all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unread: Vec<Opener>,
    /// How many processes that look did not read to the end (`unread` names a few).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unread_total: usize,
    /// Whose reservation it was, as messages name it (`domain 'web1'`).
    pub after: String,
    pub since: String,
}

/// A process with a unit's node open (identified across PID reuse), and its command name
/// (`comm`) when it was seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Opener {
    pub proc: ProcRef,
    pub comm: String,
}

impl Opener {
    /// `pid 4242 (python3)`.
    pub fn describe(list: &[Opener]) -> String {
        Opener::describe_of(list, list.len())
    }

    /// [`Opener::describe`] of a list that names `total` processes but may have fewer.
    pub fn describe_of(list: &[Opener], total: usize) -> String {
        const SHOWN: usize = 4;
        let total = total.max(list.len());
        let mut s = format!(
            "{} {}",
            if total == 1 { "pid" } else { "pids" },
            list.iter()
                .take(SHOWN)
                .map(|o| format!("{} ({})", o.proc.pid, o.comm))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let shown = list.len().min(SHOWN);
        if total > shown {
            s.push_str(&format!(" and {} more", total - shown));
        }
        s
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Draining {
    /// How messages name what holds it: `pid 4242 (sleep), which still has 0000:3b:00.0 open
    /// after domain 'web1' (draining)`; when the last look did not finish, `pid 555 (x),
    /// whose descriptors were not all read in time (scan incomplete: 0000:3b:00.0 may be
    /// open there), after domain 'web1' (draining)`.
    pub fn holder(&self, unit: &Unit) -> String {
        let held = format!(
            "{}, which still {} {unit} open",
            Opener::describe(&self.holders),
            if self.holders.len() == 1 {
                "has"
            } else {
                "have"
            },
        );
        let unread = format!(
            "{}, whose descriptors were not all read in time (scan incomplete",
            self.unread_who()
        );
        let who = match (self.holders.is_empty(), self.unread_total == 0) {
            (_, true) => held,
            (true, false) => format!("{unread}: {unit} may be open there),"),
            (false, false) => format!("{held}, and {unread}),"),
        };
        format!("{who} after {} (draining)", self.after)
    }

    /// The processes not read, as messages name them: `pid 555 (x)`, `pids 555 (x), 556 (y)
    /// and 30 more`.
    pub fn unread_who(&self) -> String {
        match (self.unread.is_empty(), self.unread_total) {
            (true, 1) => "1 process".into(),
            (true, n) => format!("{n} processes"),
            (false, n) => Opener::describe_of(&self.unread, n),
        }
    }

    /// Short, for listings: `pid 4242 (sleep)`; `pid 555 (x) not read (scan incomplete)`.
    pub fn who(&self) -> String {
        let mut v = Vec::new();
        if !self.holders.is_empty() {
            v.push(Opener::describe(&self.holders));
        }
        if self.unread_total > 0 {
            v.push(format!("{} not read (scan incomplete)", self.unread_who()));
        }
        v.join("; ")
    }

    /// The PIDs that keep it draining: the holders, then those not read.
    pub fn pids(&self) -> impl Iterator<Item = i32> + '_ {
        self.holders.iter().chain(&self.unread).map(|o| o.proc.pid)
    }
}
