//! What the state records of GPUs' health: quarantines, each GPU's record beyond its
//! quarantine (Xid counts, a reset under way), and where the kernel log was last read.

use crate::host::procfs::ProcRef;
use serde::{Deserialize, Serialize};

/// Why a GPU is out of service, and since when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quarantine {
    /// The Xid that quarantined it; none when a failed reset did (a GPU that was not
    /// quarantined, or scrub pending).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid: Option<u32>,
    /// What the Xid means; after a reset that did not bring the GPU back, the probe that
    /// failed.
    pub reason: String,
    /// The kernel log line (bounded).
    pub message: String,
    pub since: String,
    /// What ends it (docs/guides/health.md): `reset` (a reset whose probes
    /// pass) or `reboot` (a new boot id). Absent in files written before: such a
    /// quarantine ends only with `gpuhook health clear`, as it did then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<crate::reserve::health::catalog::Action>,
    /// The boot it was recorded in (a `reboot` quarantine ends in another).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// Quarantined `max_quarantines` times within 24 hours: it stays until `health clear`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub needs_inspection: bool,
}

/// A GPU's health record beyond its quarantine (files written before have none): what
/// escalation counts, what is under way, and the counters metrics show.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuHealth {
    /// When it was quarantined, within the last 24 hours (escalation counts these;
    /// `health clear` starts again).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<String>,
    /// Freed with `reset_on_release`: unusable until `health scan` resets it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub scrub_pending: bool,
    /// A reset under way (or one whose process was killed): unusable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resetting: Option<Resetting>,
    /// Xids seen, by Xid and the action taken.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xids: Vec<XidCount>,
    /// Resets whose probes all passed, and resets that failed.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub resets_ok: u64,
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub resets_failed: u64,
}

impl GpuHealth {
    /// Nothing to keep.
    pub fn is_empty(&self) -> bool {
        *self == GpuHealth::default()
    }
}

/// How many times an Xid was seen on a GPU, with the action it was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XidCount {
    pub xid: u32,
    pub action: crate::reserve::health::catalog::Action,
    pub count: u64,
}

/// A reset under way: the process that runs it, since when, in which boot. When that
/// process is gone (killed) the GPU stays unusable until a reset runs again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resetting {
    pub by: ProcRef,
    pub since: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// The last kernel log record `health scan` read, in which boot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KmsgMark {
    pub boot_id: String,
    pub seq: u64,
}
