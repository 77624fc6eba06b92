//! Why a QEMU domain's XML (or libvirt's status XML of one) is refused: a [`HostdevFault`]
//! per fault, said on one bounded line by [`HostdevError`].

use super::model::MAX_HOSTDEVS;
use crate::log::one_line;
use crate::request::metadata::MAX_XML;

/// How long a message may be, in characters of its text before escaping.
const MAX_MESSAGE: usize = 400;

/// A refused QEMU domain XML: one line (input quoted in it is escaped and bounded).
#[derive(Debug, Clone)]
pub struct HostdevError(Box<HostdevFault>);

impl fmt::Display for HostdevError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&one_line(&self.0.to_string(), MAX_MESSAGE))
    }
}

use std::fmt;

impl std::error::Error for HostdevError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&*self.0)
    }
}

impl From<HostdevFault> for HostdevError {
    fn from(f: HostdevFault) -> Self {
        HostdevError(Box::new(f))
    }
}

impl HostdevError {
    /// The fault, for tests and callers that tell them apart.
    pub fn fault(&self) -> &HostdevFault {
        &self.0
    }
}

/// Each fault, with its words.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HostdevFault {
    // The document.
    #[error("domain XML is larger than {} MiB", MAX_XML >> 20)]
    TooLarge,
    #[error("domain XML is not valid UTF-8 (byte {})", .0.valid_up_to())]
    NotUtf8(#[source] std::str::Utf8Error),
    #[error("malformed XML: {0}")]
    Xml(#[source] quick_xml::Error),
    #[error("malformed XML: {0}")]
    XmlAttr(#[source] quick_xml::events::attributes::AttrError),
    #[error("malformed XML: {0}")]
    AttrValue(#[source] quick_xml::Error),
    #[error("malformed XML: unexpected end of document")]
    UnexpectedEnd,
    #[error("malformed XML: more than one root element")]
    MoreThanOneRoot,
    #[error("document type declarations are not allowed in domain XML")]
    DocType,
    #[error("unknown entity '&{name};' (entities are not allowed)")]
    UnknownEntity { name: String },
    #[error("bad character reference '&{name};'")]
    BadCharRef { name: String },
    #[error("empty document: no <{expected}> element")]
    EmptyDocument { expected: &'static str },
    #[error("root element is <{name}>, not <{expected}>")]
    Root {
        name: String,
        expected: &'static str,
    },
    #[error("status XML has no <domain>")]
    NoDomain,
    #[error("status XML has more than one <domain>")]
    MoreThanOneDomain,
    #[error("<domstatus pid='{value}'> is not a process id")]
    StatusPid { value: String },
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
    #[error("attribute {key} is longer than 256 bytes")]
    AttrTooLong { key: String },
    // The hostdevs.
    #[error("more than {MAX_HOSTDEVS} PCI and mdev hostdevs")]
    TooMany,
    #[error("<hostdev type='{kind}'> #{n} has no <source>")]
    NoSource { kind: &'static str, n: usize },
    #[error("<hostdev type='{kind}'> #{n}: <source> has no <address>")]
    NoAddress { kind: &'static str, n: usize },
    #[error("<hostdev type='{kind}'> #{n}: <source> has more than one <address>")]
    TwoAddresses { kind: &'static str, n: usize },
    #[error("<hostdev type='{kind}'> #{n} has more than one <source>")]
    TwoSources { kind: &'static str, n: usize },
    #[error("<hostdev type='pci'> #{n}: its source <address> has no {attr}")]
    MissingAttr { n: usize, attr: &'static str },
    #[error("<hostdev type='{kind}'> #{n}: unknown attribute '{attr}' of its source <address>")]
    UnknownAttr {
        kind: &'static str,
        n: usize,
        attr: String,
    },
    #[error("<hostdev type='pci'> #{n}: {attr}='{value}' is not a number as libvirt reads it")]
    BadNumber {
        n: usize,
        attr: &'static str,
        value: String,
    },
    #[error("<hostdev type='pci'> #{n}: {attr}='{value}' is out of range (at most {max:#x})")]
    OutOfRange {
        n: usize,
        attr: &'static str,
        value: String,
        max: u32,
    },
    #[error("<hostdev type='mdev'> #{n}: its source <address> has no uuid")]
    NoMdevUuid { n: usize },
    #[error("<hostdev type='mdev'> #{n}: uuid='{value}' is not a UUID")]
    BadMdevUuid { n: usize, value: String },
    #[error("<hostdev type='pci'> #{n}: managed='{value}' is neither yes nor no")]
    BadManaged { n: usize, value: String },
    #[error("{what} is passed through twice (hostdevs #{first} and #{n})")]
    Twice {
        what: String,
        first: usize,
        n: usize,
    },
}
