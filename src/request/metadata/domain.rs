//! What the hook reads of a libvirt domain ([`Domain`]), where its request came from
//! ([`Source`]), and the two XML namespaces it reads.

use crate::request::{IdMap, Request};

/// gpuhook's XML namespace.
pub const NS: &str = "urn:gpuhook:gpu:1";
/// What every gpuhook namespace URI begins with: one in `<metadata>` that is not [`NS`]
/// (`urn:gpuhook:gpu:2`, a typo) asks for nothing, and is said so.
pub const NS_FAMILY: &str = "urn:gpuhook:";
/// Nova's metadata namespace without its version (`…/nova/1.1` since 2015): the elements
/// gpuhook reads have kept their shape across versions.
pub const NOVA_NS_PREFIX: &str = "http://openstack.org/xmlns/libvirt/nova/";

/// The facts of a domain XML that gpuhook uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    pub name: String,
    pub uuid: String,
    /// `<domain id=…>`: the libvirt_lxc controller's PID while the domain runs.
    pub id: Option<i32>,
    pub idmap: IdMap,
    pub request: Option<Request>,
    /// Where the request came from.
    pub source: Source,
    /// Namespaces of `<metadata>` elements that look like gpuhook's and are not
    /// (`urn:gpuhook:gpu:2`): not read, said in a warning.
    pub unknown_ns: Vec<String>,
}

/// Which part of the domain XML asked for GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// No request.
    None,
    /// gpuhook's `<gpus>` element; `Some(flavor)` when a Nova flavor's GPU keys were there
    /// too and were not read (the element wins).
    Gpuhook { nova_ignored: Option<String> },
    /// The extra specs of this Nova flavor.
    Nova { flavor: String },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::None => write!(f, "no request"),
            Source::Gpuhook { .. } => write!(f, "gpuhook <gpus> element"),
            Source::Nova { flavor } => write!(f, "Nova flavor '{flavor}' extra specs"),
        }
    }
}
