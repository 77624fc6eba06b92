//! Why a request gets no GPUs ([`AllocError`]).

use crate::ids::{Pci, Unit, Vendor};
use crate::request::{DeviceSel, Filter, MigSel, Request, Wording};

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
    /// A named GPU is handed out as its MIG instances only (what to ask for instead, in
    /// `wording`).
    #[error(
        "GPU {pci} ({sel}) is in MIG mode with {instances} instances: {}",
        ask_mig(*.wording)
    )]
    InMigMode {
        pci: Pci,
        sel: DeviceSel,
        instances: usize,
        wording: Wording,
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
    /// A named GPU is shared: it is given as slots only (what to ask for instead, in
    /// `wording`).
    #[error("GPU {pci} ({sel}) is shared ({replicas} slots): {}", ask_slot(*.wording))]
    Shareable {
        pci: Pci,
        sel: DeviceSel,
        replicas: u32,
        wording: Wording,
    },
    /// A shared request names a GPU the host config does not share.
    #[error("GPU {pci} ({sel}) is not shared by the host config (\"sharing\"): {}", ask_whole(*.wording))]
    NotShareable {
        pci: Pci,
        sel: DeviceSel,
        wording: Wording,
    },
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

impl AllocError {
    /// The refusal in `w`, the words of the door its request came through: what it tells
    /// its user to ask for instead (MIG instances, a slot, the GPU whole). The allocator
    /// words its refusals in the domain XML's.
    pub fn in_words(mut self, w: Wording) -> AllocError {
        match &mut self {
            AllocError::InMigMode { wording, .. }
            | AllocError::Shareable { wording, .. }
            | AllocError::NotShareable { wording, .. } => *wording = w,
            AllocError::Shortage { why, .. } => {
                for y in why {
                    if let WhyNoGpu::InMigMode { wording, .. } | WhyNoGpu::Shared { wording, .. } =
                        y
                    {
                        *wording = w;
                    }
                }
            }
            _ => {}
        }
        self
    }
}

/// What to ask for instead of a GPU in MIG mode: its instances (a VM cannot).
fn ask_mig(w: Wording) -> &'static str {
    match w {
        Wording::Xml => "ask for them (mig='yes')",
        Wording::Annotation => "ask for them (annotation gpuhook.io/mig: \"yes\")",
        Wording::Env => "ask for them (GPUHOOK_MIG=yes)",
        Wording::Flag => "ask for them (--mig)",
        Wording::Vm => "its instances go to containers, and request chooses no GPU in MIG mode for a VM (a <hostdev> written by hand passes it through whole)",
    }
}

/// What to ask for instead of a shared GPU whole: a slot of it (a VM cannot).
fn ask_slot(w: Wording) -> &'static str {
    match w {
        Wording::Xml => "ask for a slot (share='yes')",
        Wording::Annotation => "ask for a slot (annotation gpuhook.io/share: \"yes\")",
        Wording::Env => "ask for a slot (GPUHOOK_SHARE=yes)",
        Wording::Flag => "ask for a slot (--share)",
        Wording::Vm => "it is given to containers as slots, never whole to a VM",
    }
}

/// What to ask for instead of a slot of a GPU the config does not share: the GPU whole.
fn ask_whole(w: Wording) -> &'static str {
    match w {
        Wording::Xml => "ask for it whole (no share='yes')",
        Wording::Annotation => "ask for it whole (without annotation gpuhook.io/share: \"yes\")",
        Wording::Env => "ask for it whole (without GPUHOOK_SHARE=yes)",
        Wording::Flag => "ask for it whole (without --share)",
        // A VM never asks for a slot.
        Wording::Vm => "ask for it whole",
    }
}

/// How GPUs in MIG mode are handed out, said in a shortage of whole GPUs.
fn as_instances(w: Wording) -> &'static str {
    match w {
        Wording::Xml => "handed out as instances: mig='yes'",
        Wording::Annotation => "handed out as instances: annotation gpuhook.io/mig: \"yes\"",
        Wording::Env => "handed out as instances: GPUHOOK_MIG=yes",
        Wording::Flag => "handed out as instances: --mig",
        Wording::Vm => "handed out to containers as instances",
    }
}

/// How shared GPUs are handed out, said in a shortage of whole GPUs.
fn as_slots(w: Wording) -> &'static str {
    match w {
        Wording::Xml => "handed out as slots: share='yes'",
        Wording::Annotation => "handed out as slots: annotation gpuhook.io/share: \"yes\"",
        Wording::Env => "handed out as slots: GPUHOOK_SHARE=yes",
        Wording::Flag => "handed out as slots: --share",
        Wording::Vm => "handed out to containers as slots",
    }
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
    /// `count` are in MIG mode (how they are asked for, in `wording`).
    #[error("{count} in MIG mode ({})", as_instances(*.wording))]
    InMigMode { count: usize, wording: Wording },
    /// `count` are shared (how they are asked for, in `wording`).
    #[error("{count} shared ({})", as_slots(*.wording))]
    Shared { count: usize, wording: Wording },
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
