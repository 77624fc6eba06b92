//! Why a request gets no GPUs ([`AllocError`]).

use crate::ids::{Pci, Unit, Vendor};
use crate::request::{DeviceSel, Filter, MigSel, Request};

/// Why a request gets no GPUs: each refusal with what it names, printed as one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// The request names an architecture no GPU has (nor the config's overrides name).
    #[error("unknown architecture '{arch}' (known: {}; others can be named in the config's \"overrides\")", .known.join(", "))]
    UnknownArch { arch: String, known: Vec<String> },
    /// Placement's class names an architecture no GPU has.
    #[error("resource class {class} names no known architecture (known: {}; others can be named in the config's \"overrides\")", .known.join(", "))]
    UnknownClass { class: String, known: Vec<String> },
    /// A `<gpu:device>` (or a MIG selector's GPU) names no GPU of this host.
    #[error("no GPU with {sel} on this host")]
    NoGpu { sel: DeviceSel },
    /// Two `<gpu:device>` selectors name one GPU.
    #[error("{sel} names GPU {pci} a second time")]
    NamedTwice { sel: DeviceSel, pci: Pci },
    /// A named GPU is excluded by the host config.
    #[error("GPU {pci} ({sel}) is excluded by the host config")]
    Excluded { pci: Pci, sel: DeviceSel },
    /// A named GPU has a problem (no driver, quarantined…).
    #[error("GPU {pci} ({sel}) cannot be used: {problem}")]
    Unusable {
        pci: Pci,
        sel: DeviceSel,
        problem: String,
    },
    /// A named GPU is handed out as its MIG instances only.
    #[error(
        "GPU {pci} ({sel}) is in MIG mode with {instances} instances: ask for them (mig='yes')"
    )]
    InMigMode {
        pci: Pci,
        sel: DeviceSel,
        instances: usize,
    },
    /// A named GPU, or one of its MIG instances, is held by `holder`.
    #[error("GPU {pci} ({sel}) is held by {holder}")]
    Held {
        pci: Pci,
        sel: DeviceSel,
        holder: String,
    },
    /// A named GPU fails one of the request's filters.
    #[error(
        "GPU {pci} ({sel}) does not match {filter} (it is {vendor} {} {model})",
        .arch.as_deref().unwrap_or("unknown-arch")
    )]
    Mismatch {
        pci: Pci,
        sel: DeviceSel,
        filter: Box<Filter>,
        vendor: Vendor,
        arch: Option<String>,
        model: String,
    },
    /// Fewer usable, free, matching GPUs than asked: `free` of the `matching` ones, and why
    /// the others are not (`why`: one reason per cause).
    #[error(
        "cannot reserve {req}: only {free} of the host's {matching} matching GPU{} {} free{}",
        plural(*.matching),
        is_are(*.free),
        detail(.why, ", ")
    )]
    Shortage {
        req: Box<Request>,
        free: usize,
        matching: usize,
        why: Vec<WhyNoGpu>,
    },
    /// A named GPU is shared: it is given as slots only.
    #[error("GPU {pci} ({sel}) is shared ({replicas} slots): ask for a slot (share='yes')")]
    Shareable {
        pci: Pci,
        sel: DeviceSel,
        replicas: u32,
    },
    /// A shared request names a GPU the host config does not share.
    #[error("GPU {pci} ({sel}) is not shared by the host config (\"sharing\"): ask for it whole (no share='yes')")]
    NotShareable { pci: Pci, sel: DeviceSel },
    /// A named shared GPU of which the holder has a slot already.
    #[error(
        "GPU {pci} ({sel}): the container holds a slot of it already (one slot of a GPU each)"
    )]
    SharesAlready { pci: Pci, sel: DeviceSel },
    /// Every slot of a named shared GPU is taken.
    #[error("GPU {pci} ({sel}): all {replicas} slots are taken, by {}", .holders.join(", "))]
    SlotsFull {
        pci: Pci,
        sel: DeviceSel,
        replicas: u32,
        holders: Vec<String>,
    },
    /// Fewer shared GPUs with a free slot than asked (one slot each): `free` of the
    /// `shareable` matching ones, and why the others are not (`why`).
    #[error(
        "cannot reserve {req}: only {free} of the host's {shareable} matching shared GPU{} {} a free slot{}",
        plural(*.shareable),
        if *.free == 1 { "has" } else { "have" },
        detail(.why, "; ")
    )]
    SlotShortage {
        req: Box<Request>,
        free: usize,
        shareable: usize,
        why: Vec<WhyNoSlot>,
    },
    /// A `<gpu:mig>` names an instance its GPU does not have.
    #[error("GPU {pci} has no MIG instance gi {} ci {} ({sel})", .sel.gi, .sel.ci)]
    NoMig { pci: Pci, sel: MigSel },
    #[error("{sel} is named twice")]
    MigNamedTwice { sel: MigSel },
    /// The GPU of a named MIG instance has a problem, or is excluded.
    #[error("GPU {pci} ({sel}) cannot be used: {problem}")]
    MigUnusable {
        pci: Pci,
        sel: MigSel,
        problem: String,
    },
    /// The GPU of a named MIG instance is held whole.
    #[error("GPU {pci} ({sel}) is held whole by {holder}")]
    HeldWhole {
        pci: Pci,
        sel: MigSel,
        holder: String,
    },
    /// A named MIG instance is held.
    #[error("{unit} ({sel}) is held by {holder}")]
    MigHeld {
        unit: Unit,
        sel: MigSel,
        holder: String,
    },
    /// Another holder uses the named instance's GPU instance (`sel.gi`), through `through`.
    #[error("{unit} ({sel}): its GPU instance gi {} is held by {holder} (through {through}); compute instances of one GPU instance share its memory and engines", .sel.gi)]
    GiHeld {
        unit: Unit,
        sel: MigSel,
        holder: String,
        through: Unit,
    },
    /// The GPU of a named MIG instance fails one of the request's filters.
    #[error("GPU {pci} ({sel}) does not match {filter}")]
    MigMismatch {
        pci: Pci,
        sel: MigSel,
        filter: Box<Filter>,
    },
    /// Fewer free MIG instances than asked: `free` (the named ones included) of the `total`
    /// on matching GPUs, and why the others are not (`why`).
    #[error(
        "cannot reserve {req}: only {free} of the host's {total} MIG instance{} on matching GPUs {} free{}",
        plural(*.total),
        is_are(*.free),
        detail(.why, "; ")
    )]
    MigShortage {
        req: Box<Request>,
        free: usize,
        total: usize,
        why: Vec<WhyNoMig>,
    },
}

/// Why matching GPUs are not free for a request of whole GPUs: one per cause, each with how
/// many GPUs it keeps.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WhyNoGpu {
    /// Held whole or as slots, by `holders` (each named once in a row).
    #[error("{count} held by {}", .holders.join(", "))]
    Held { count: usize, holders: Vec<String> },
    #[error("{0} excluded")]
    Excluded(usize),
    #[error("{0} in MIG mode (handed out as instances: mig='yes')")]
    InMigMode(usize),
    #[error("{0} shared (handed out as slots: share='yes')")]
    Shared(usize),
    /// `count` have a problem; the `first` of them has `problem`.
    #[error("{count} unusable ({first}: {problem})")]
    Unusable {
        count: usize,
        first: Pci,
        problem: String,
    },
}

/// Why a matching shared GPU has no slot for a shared request (one per GPU), or how many
/// matching GPUs are not shared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WhyNoSlot {
    #[error("{pci} held whole by {holder}")]
    HeldWhole { pci: Pci, holder: String },
    #[error("{0} excluded")]
    Excluded(Pci),
    #[error("{pci} unusable ({problem})")]
    Unusable { pci: Pci, problem: String },
    /// The asking holder has a slot of it already.
    #[error("{0} has a slot of this holder's already")]
    OursAlready(Pci),
    /// Every slot is taken (`taken` of `replicas`), by `holders`.
    #[error("{pci} has {taken}/{replicas} slots taken by {}", .holders.join(", "))]
    Full {
        pci: Pci,
        taken: usize,
        replicas: u32,
        holders: Vec<String>,
    },
    #[error("{count} matching GPU{} {} not shared by the host config", plural(*.count), is_are(*.count))]
    NotShared { count: usize },
}

/// Why matching MIG instances are not free for a MIG request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WhyNoMig {
    /// Held, by these holders (sorted, each once).
    #[error("held by {}", .0.join(", "))]
    Held(Vec<String>),
    /// A matching GPU in MIG mode cannot be used (`problem`, else excluded).
    #[error("{pci} unusable: {problem}")]
    Unusable { pci: Pci, problem: String },
}

/// The plural ending for `n` things.
fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// The verb for `n` things.
fn is_are(n: usize) -> &'static str {
    if n == 1 {
        "is"
    } else {
        "are"
    }
}

/// A shortage's reasons after a colon, joined by `sep`; nothing when there are none.
fn detail<'a, T: std::fmt::Display>(why: &'a [T], sep: &'static str) -> Detail<'a, T> {
    Detail(why, sep)
}

/// [`detail`]'s words, written as they are displayed.
struct Detail<'a, T>(&'a [T], &'static str);

impl<T: std::fmt::Display> std::fmt::Display for Detail<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut sep = ": ";
        for w in self.0 {
            write!(f, "{sep}{w}")?;
            sep = self.1;
        }
        Ok(())
    }
}
