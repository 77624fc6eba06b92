//! What gpuhook does for each NVIDIA Xid: the one table, after NVIDIA's Xid catalog
//! (<https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html>, "Resolution
//! Bucket (Immediate Action)": `IGNORE`, `RESTART_APP`, `RESET_GPU`, `RESTART_BM` / node
//! reboot; Xid 154 "GPU recovery action changed": the driver states the action in its
//! record). docs/guides/health.md.

use serde::{Deserialize, Serialize};

/// What an Xid calls for. The words (`ignore`, `restart`, `reset`, `reboot`) are those of
/// `list --json`, the metrics' `action` label and the messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Counted and logged; nothing else.
    Ignore,
    /// The program that got it must restart: counted, a warning naming the GPU's holder;
    /// the GPU stays in service.
    Restart,
    /// Quarantined until a reset (`gpuhook health reset`, or `auto_reset`).
    Reset,
    /// Quarantined until the host reboots (a new `boot_id`).
    Reboot,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Ignore => "ignore",
            Action::Restart => "restart",
            Action::Reset => "reset",
            Action::Reboot => "reboot",
        }
    }

    /// Whether the GPU is taken out of service for it.
    pub fn quarantines(self) -> bool {
        matches!(self, Action::Reset | Action::Reboot)
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the table gives an Xid its action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XidRule {
    /// Always this action.
    Is(Action),
    /// The action the driver's record states (Xid 154).
    DriverSays,
}

/// One row of the table: the Xid, its action, what it means (NVIDIA's description, short).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidEntry {
    pub xid: u32,
    pub rule: XidRule,
    pub what: &'static str,
}

const fn e(xid: u32, action: Action, what: &'static str) -> XidEntry {
    XidEntry {
        xid,
        rule: XidRule::Is(action),
        what,
    }
}

use Action::{Ignore, Reboot, Reset, Restart};

/// NVIDIA's Xid catalog, as gpuhook acts on it (the table of docs/guides/health.md), in Xid order. An Xid that is
/// not here is counted and logged only.
pub const CATALOG: &[XidEntry] = &[
    e(13, Restart, "graphics engine exception"),
    e(31, Restart, "GPU memory page fault"),
    e(
        43,
        Ignore,
        "GPU stopped processing (reset channel verification error)",
    ),
    e(46, Reset, "GPU stopped processing"),
    e(48, Reset, "double-bit ECC error"),
    e(62, Reset, "internal micro-controller halt"),
    e(63, Ignore, "ECC page retirement or row remapping recorded"),
    e(64, Reset, "ECC page retirement or row remapping failed"),
    e(68, Restart, "video processor exception"),
    e(69, Restart, "graphics engine class error"),
    e(74, Reset, "NVLink error"),
    e(79, Reboot, "GPU has fallen off the bus"),
    e(92, Ignore, "high single-bit ECC error rate"),
    e(94, Restart, "contained ECC error"),
    e(95, Reset, "uncontained ECC error"),
    e(109, Reset, "context switch timeout"),
    e(119, Reset, "GSP RPC timeout"),
    e(120, Reset, "GSP error"),
    e(121, Ignore, "C2C link corrected error"),
    e(
        136,
        Reset,
        "a fault NVIDIA's catalog resolves by resetting the GPU",
    ),
    e(140, Reset, "unrecovered ECC error"),
    e(143, Reset, "GPU initialization failure"),
    XidEntry {
        xid: 154,
        rule: XidRule::DriverSays,
        what: "GPU recovery action changed",
    },
];

/// The table's row for `xid`.
pub fn entry(xid: u32) -> Option<&'static XidEntry> {
    CATALOG.iter().find(|e| e.xid == xid)
}

/// How the GPU's own state can confirm an Xid's class before it quarantines the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Check {
    /// Fallen off the bus (79): its PCI config space reads as all ones, or the function is
    /// gone from the bus.
    ConfigSpace,
    /// A memory error ([`MEMORY_ERRORS`]): the driver's ECC and row-remapping counters, read
    /// through `nvidia-smi`, show an uncorrected error, a pending or failed row remapping, or
    /// a pending page retirement.
    MemoryCounters,
}

/// The reset-class Xids NVIDIA's catalog gives for GPU memory errors: 48 (double-bit ECC
/// error), 64 (ECC page retirement or row remapping failed), 95 (uncontained ECC error),
/// 140 (unrecovered ECC error). The memory Xids of the other classes (63, 92 ignore; 94
/// restart) quarantine nothing, so nothing waits for them.
pub const MEMORY_ERRORS: [u32; 4] = [48, 64, 95, 140];

/// What the GPU's own state can confirm of Xid `xid`; `None` for the classes it cannot
/// (the driver shows nothing of them that gpuhook can read: the record alone counts).
pub fn check(xid: u32) -> Option<Check> {
    match xid {
        79 => Some(Check::ConfigSpace),
        x if MEMORY_ERRORS.contains(&x) => Some(Check::MemoryCounters),
        _ => None,
    }
}

/// What one Xid record calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidVerdict {
    pub action: Action,
    /// What the Xid means (for 154, the action its record states).
    pub what: &'static str,
    /// Not in the table: counted and logged only.
    pub unknown: bool,
}

/// The recovery actions an Xid 154 record can state, as the driver words them
/// (`NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1
/// (GPU Reset Required)`), and gpuhook's action for each.
pub const DRIVER_ACTIONS: [(&str, Action); 3] = [
    ("GPU Reset Required", Reset),
    ("Node Reboot Required", Reboot),
    ("Drain and Reset", Reset),
];

/// The action the text of an Xid 154 record states: the one it changed *to* (the part after
/// the last ` to `, when there is one); `None` (`… to 0x0 (None)`) or a wording gpuhook
/// does not know is [`Action::Ignore`].
pub fn driver_says(msg: &str) -> (Action, &'static str) {
    let to = msg.rfind(" to ").map_or(msg, |i| &msg[i + 4..]);
    DRIVER_ACTIONS
        .iter()
        .find(|(w, _)| to.contains(w))
        .map_or((Ignore, "no recovery action stated"), |(w, a)| (*a, *w))
}

/// The action for an Xid record with this number and message.
pub fn verdict(xid: u32, msg: &str) -> XidVerdict {
    match entry(xid) {
        Some(XidEntry {
            rule: XidRule::Is(action),
            what,
            ..
        }) => XidVerdict {
            action: *action,
            what,
            unknown: false,
        },
        Some(XidEntry {
            rule: XidRule::DriverSays,
            ..
        }) => {
            let (action, what) = driver_says(msg);
            XidVerdict {
                action,
                what,
                unknown: false,
            }
        }
        None => XidVerdict {
            action: Ignore,
            what: "not in gpuhook's Xid catalog",
            unknown: true,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table of docs/guides/health.md, row by row: each Xid gets the action it names there.
    #[test]
    fn the_table_is_the_specs() {
        let spec: [(Action, &[u32]); 4] = [
            (Ignore, &[43, 63, 92, 121]),
            (Restart, &[13, 31, 68, 69, 94]),
            (
                Reset,
                &[46, 48, 62, 64, 74, 95, 109, 119, 120, 136, 140, 143],
            ),
            (Reboot, &[79]),
        ];
        let mut n = 0;
        for (action, xids) in spec {
            for &x in xids {
                assert_eq!(verdict(x, "").action, action, "Xid {x}");
                assert!(!verdict(x, "").unknown, "Xid {x}");
                n += 1;
            }
        }
        // 154 besides: nothing else is in the table.
        assert_eq!(CATALOG.len(), n + 1);
        assert_eq!(entry(154).unwrap().rule, XidRule::DriverSays);
        // In Xid order, each once.
        assert!(CATALOG.windows(2).all(|w| w[0].xid < w[1].xid));
        // Only reset and reboot quarantine.
        assert!(Reset.quarantines() && Reboot.quarantines());
        assert!(!Ignore.quarantines() && !Restart.quarantines());
    }

    /// Xid 154 takes the action its record changed to, as the driver words it; an action
    /// changed back to none, or one gpuhook does not know, is ignored.
    #[test]
    fn xid_154_reads_the_drivers_words() {
        let rec = |s: &str| {
            format!("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to {s}")
        };
        assert_eq!(verdict(154, &rec("0x1 (GPU Reset Required)")).action, Reset);
        assert_eq!(
            verdict(154, &rec("0x2 (Node Reboot Required)")).action,
            Reboot
        );
        assert_eq!(verdict(154, &rec("0x4 (Drain and Reset)")).action, Reset);
        assert_eq!(
            verdict(154, &rec("0x4 (Drain and Reset)")).what,
            "Drain and Reset"
        );
        // Back to none: the earlier action's words come before " to ".
        let back = "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)";
        assert_eq!(verdict(154, back).action, Ignore);
        assert_eq!(verdict(154, &rec("0x3 (Drain P2P)")).action, Ignore);
        // Without "from … to": the words anywhere.
        assert_eq!(
            verdict(154, "NVRM: Xid (PCI:0000:01:00): 154, Node Reboot Required").action,
            Reboot
        );
        assert!(!verdict(154, back).unknown);
    }

    /// 79 is confirmed by the config space, the reset-class memory errors by the counters;
    /// every memory error is a reset in the table; nothing else has a check.
    #[test]
    fn which_xids_the_gpus_state_confirms() {
        assert_eq!(check(79), Some(Check::ConfigSpace));
        for x in MEMORY_ERRORS {
            assert_eq!(check(x), Some(Check::MemoryCounters), "Xid {x}");
            assert_eq!(verdict(x, "").action, Reset, "Xid {x}");
        }
        for x in [
            13, 31, 46, 62, 63, 74, 92, 94, 109, 119, 120, 136, 143, 154, 999,
        ] {
            assert_eq!(check(x), None, "Xid {x}");
        }
    }

    #[test]
    fn unknown_xids_are_counted_only() {
        for x in [0, 1, 8, 45, 999] {
            let v = verdict(x, "");
            assert!(v.unknown && v.action == Ignore, "Xid {x}");
        }
        assert_eq!(Action::Reset.to_string(), "reset");
        assert_eq!(
            serde_json::to_string(&Action::Reboot).unwrap(),
            "\"reboot\""
        );
    }
}
