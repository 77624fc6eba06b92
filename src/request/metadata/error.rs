//! Why a domain XML (or a request from another front door) is refused: a [`ParseFault`] per fault,
//! carrying what it names, said on one bounded line by [`ParseError`].

use super::limits::{MAX_DEVICES, MAX_EXTRA_SPECS, MAX_VALUE, MAX_XML};
use crate::log::one_line;
use crate::request::extra_specs::{self, ValueError, MAX_COUNT};
use crate::request::{Unmapped, WordError};
use std::num::ParseIntError;

/// How long a message may be, in characters of its text before escaping.
const MAX_MESSAGE: usize = 400;

/// A refused domain XML or request. Its text is one line: input quoted in it may hold
/// newlines or control characters, which are escaped, and it is bounded in length. Two
/// errors are equal when they say the same.
#[derive(Debug, Clone)]
pub struct ParseError(Box<ParseFault>);

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&one_line(&self.0.to_string(), MAX_MESSAGE))
    }
}

impl std::error::Error for ParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&*self.0)
    }
}

impl PartialEq for ParseError {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for ParseError {}

impl From<ParseFault> for ParseError {
    fn from(kind: ParseFault) -> Self {
        ParseError(Box::new(kind))
    }
}

impl From<Conflict> for ParseError {
    fn from(c: Conflict) -> Self {
        ParseFault::Conflict(c).into()
    }
}

pub(crate) fn err<T>(kind: ParseFault) -> Result<T, ParseError> {
    Err(kind.into())
}

/// `GPU` or `GPUs`.
fn gpus(n: &u32) -> &'static str {
    if *n == 1 {
        "GPU"
    } else {
        "GPUs"
    }
}

/// Each fault, with its words (before [`ParseError`] makes them one bounded line).
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ParseFault {
    // The document.
    #[error("domain XML is larger than {} MiB", MAX_XML >> 20)]
    TooLarge,
    #[error("domain XML is not valid UTF-8 (byte {})", .0.valid_up_to())]
    NotUtf8(#[source] std::str::Utf8Error),
    #[error("malformed XML: {0}")]
    Xml(#[source] quick_xml::Error),
    #[error("malformed XML: {0}")]
    XmlAttr(#[source] quick_xml::events::attributes::AttrError),
    #[error("malformed XML: unexpected end of document")]
    UnexpectedEnd,
    #[error("malformed XML: unexpected closing tag")]
    UnexpectedClose,
    #[error("malformed XML: more than one root element")]
    MoreThanOneRoot,
    #[error("document type declarations are not allowed in domain XML")]
    DocType,
    #[error("bad character reference '&{name};'")]
    BadCharRef {
        name: String,
        #[source]
        source: Option<quick_xml::Error>,
    },
    #[error("unknown entity '&{name};' (entities are not allowed)")]
    UnknownEntity { name: String },
    #[error("empty document: no <domain> element")]
    EmptyDocument,
    #[error("root element is <{name}>, not <domain>")]
    Root { name: String },
    #[error("<domain id='{value}'> is not a number")]
    DomainId {
        value: String,
        #[source]
        source: ParseIntError,
    },
    #[error("domain XML has no <name>")]
    NoName,
    #[error("domain XML has no <uuid>")]
    NoUuid,
    #[error("<name>/<uuid> is too long")]
    NameTooLong,
    #[error("domain <name> is empty")]
    EmptyName,
    #[error("bad domain <uuid> '{value}'")]
    BadUuid { value: String },
    #[error(transparent)]
    Unmapped(#[from] Unmapped),
    // gpuhook's element.
    #[error("unknown gpuhook element <{name}> in <metadata> (expected <gpus>)")]
    NotGpus { name: String },
    #[error("more than one gpuhook <gpus> element in <metadata>")]
    MoreThanOneGpus,
    #[error(
        "unknown gpuhook element <{name}> inside <gpus> (expected <device>, <mig> or <extra_spec>)"
    )]
    UnknownInGpus { name: String },
    #[error("unexpected element <{name}> inside gpuhook <gpus> (only gpuhook <device>, <mig> and <extra_spec>)")]
    ForeignInGpus { name: String },
    #[error("unexpected element <{name}> inside a gpuhook element")]
    ElementInside { name: String },
    #[error("unexpected text '{text}' in gpuhook element")]
    Text { text: String },
    #[error("unknown attribute '{key}' on <{elem}>")]
    UnknownAttr { key: String, elem: &'static str },
    #[error("unknown attribute '{key}' on <gpus> (known: count, vendor, arch, model, capabilities, mode, uid, gid, mig, share, driver)")]
    UnknownGpusAttr { key: String },
    #[error("<gpus {key}>: {source}")]
    GpusAttr {
        key: String,
        #[source]
        source: AttrError,
    },
    #[error("bad attribute value: {0}")]
    AttrValue(#[source] quick_xml::Error),
    #[error("attribute '{key}' is longer than {MAX_VALUE} bytes")]
    AttrTooLong { key: String },
    #[error("{what} '{value}' is not a non-negative whole number")]
    NotWhole { what: &'static str, value: String },
    #[error("{what} '{value}' is out of range")]
    OutOfRange {
        what: &'static str,
        value: String,
        #[source]
        source: ParseIntError,
    },
    #[error("mode '{value}' is not an octal permission like 0660")]
    ModeNotOctal { value: String },
    #[error("bad mode '{value}'")]
    BadMode {
        value: String,
        #[source]
        source: ParseIntError,
    },
    #[error(
        "mode '{value}' sets setuid/setgid/sticky bits; only permission bits (0777) are allowed"
    )]
    ModeSpecialBits { value: String },
    #[error("<idmap> entry needs start, target and count")]
    IdmapEntry,
    // `<device>` and `<mig>`.
    #[error("more than {MAX_DEVICES} <{what}> children")]
    TooManyChildren { what: &'static str },
    #[error("{what} {sel} is named twice")]
    NamedTwice { what: &'static str, sel: String },
    #[error("unknown attribute '{key}' on <device> (known: pci, uuid, index)")]
    UnknownDeviceAttr { key: String },
    #[error("<device> must name exactly one of pci, uuid, index")]
    DeviceTwoNames,
    #[error("<device> must name one of pci, uuid, index")]
    DeviceNoName,
    #[error("<device pci='{value}'> is not a PCI address like 0000:3b:00.0")]
    BadPci { value: String },
    #[error("<device uuid='{value}'> is not a GPU UUID like GPU-…")]
    BadGpuUuid { value: String },
    #[error("unknown attribute '{key}' on <mig> (known: pci, uuid, index, gi, ci)")]
    UnknownMigAttr { key: String },
    #[error("<mig> must name its GPU by exactly one of pci, uuid, index")]
    MigTwoGpus,
    #[error("<mig> must name its GPU by one of pci, uuid, index")]
    MigNoGpu,
    #[error("<mig> needs gi and ci (its GPU instance and compute instance)")]
    MigNeedsGiCi,
    // Extra specs, gpuhook's and Nova's.
    #[error("more than {MAX_EXTRA_SPECS} <extra_spec> children")]
    TooManySpecs,
    #[error("<extra_spec> without name")]
    SpecWithoutName,
    #[error("extra_spec '{name}' is given twice")]
    SpecTwice { name: String },
    #[error("extra_spec value is longer than {MAX_VALUE} bytes")]
    SpecTooLong,
    #[error("extra_spec '{key}' ('{value}'): {source}")]
    Spec {
        key: String,
        /// The value, trimmed.
        value: String,
        #[source]
        source: SpecFault,
    },
    #[error("more than {MAX_EXTRA_SPECS} GPU extra specs in the Nova flavor")]
    TooManyNovaSpecs,
    #[error("Nova flavor extra spec '{key}' is given twice")]
    NovaSpecTwice { key: String },
    #[error("Nova flavor extra spec '{key}' is longer than {MAX_VALUE} bytes")]
    NovaSpecTooLong { key: String },
    #[error("unexpected element <{name}> inside Nova flavor extra spec '{key}'")]
    ElementInNovaSpec { name: String, key: String },
    #[error("Nova flavor '{flavor}': {source}")]
    Nova {
        flavor: String,
        #[source]
        source: ParseError,
    },
    // The request the attributes and children make together.
    #[error(transparent)]
    Conflict(#[from] Conflict),
}

/// Why a request's keys together are no request, with what was asked (typed): the same
/// check for every front door ([`crate::request::attrs::build_request`]), and each door
/// words it in the words its user typed. This `Display` is the domain XML's words
/// (`count='1'`, `<device>` children, `mig='yes'`); the OCI annotations, the environment
/// and `gpuhook attach`'s options say theirs (`crate::request::oci`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Conflict {
    #[error("<mig> children ask for MIG instances, but mig='no'")]
    MigNo,
    #[error(
        "a request is either whole GPUs (<device>) or MIG instances (mig='yes', <mig>), not both"
    )]
    MigAndDevices,
    #[error("Placement's CUSTOM_GPU_<ARCH> classes count whole GPUs, not MIG instances")]
    MigAndResources,
    #[error("MIG instances are never shared: a request is either MIG instances (mig='yes') or shared GPU slots (share='yes')")]
    ShareAndMig,
    #[error("resources ask for a _SHARED class ({class}), but share='no'")]
    ShareNo { class: String },
    #[error("resources ask for GPUs of two classes ({class}, {other}); one request takes GPUs of one class")]
    TwoClasses { class: String, other: String },
    #[error("resources ({keys}) ask for {total} GPUs (at most {MAX_COUNT})")]
    TooManyResources { keys: Resources, total: u32 },
    #[error("resources ({keys}) ask for {total} {}, fewer than extra_spec gpus '{raw}'", gpus(.total))]
    FewerThanSpec {
        keys: Resources,
        total: u32,
        raw: String,
    },
    #[error("{first} contradicts {then}")]
    Contradicts { first: CountFrom, then: CountFrom },
    /// `count` (from `count='…'`, the `gpus` key or option) is below the number of exact GPUs
    /// (`mig`: MIG instances) named.
    #[error("count {count} is less than the {n} <{}> children", if *.mig { "mig" } else { "device" })]
    CountBelowChildren { count: u32, n: u32, mig: bool },
}

/// Why an extra spec's value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SpecFault {
    #[error(transparent)]
    Value(#[from] ValueError),
    #[error("'{class}' is not a Placement resource class name (CUSTOM_[A-Z0-9_]+)")]
    NotAClass { class: String },
    #[error("unknown vendor '{vendor}' (known: nvidia, amd, intel)")]
    Vendor { vendor: String },
}

/// Placement's `resources[N]:CUSTOM_GPU_<ARCH>` keys and their amounts: `key=N, key=N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resources(pub(crate) Vec<(String, u32)>);

impl std::fmt::Display for Resources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (k, a)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k}={a}")?;
        }
        Ok(())
    }
}

/// What gave a request its count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CountFrom {
    Attr(u32),
    /// The `gpus` extra spec, as written.
    Spec(String),
    Resources(Resources),
}

impl std::fmt::Display for CountFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CountFrom::Attr(a) => write!(f, "count='{a}'"),
            CountFrom::Spec(raw) => write!(f, "extra_spec gpus '{raw}'"),
            CountFrom::Resources(keys) => write!(f, "resources ({keys})"),
        }
    }
}

/// Why a request attribute's value is refused (the caller names where it was).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttrError {
    /// `count` (or `gpus`).
    #[error(transparent)]
    Count(#[from] extra_specs::ValueError),
    #[error("unknown vendor '{0}' (known: nvidia, amd, intel)")]
    Vendor(String),
    /// An empty `arch` ("architecture") or `model`.
    #[error("empty {0}")]
    Empty(&'static str),
    /// `capabilities` or `driver`.
    #[error(transparent)]
    Word(#[from] WordError),
    #[error("mig '{0}' is not yes or no")]
    Mig(String),
    #[error("share '{0}' is not yes or no")]
    Share(String),
    /// `mode`, `uid` or `gid`.
    #[error(transparent)]
    Value(#[from] ParseError),
}
