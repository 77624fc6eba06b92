//! The GPU request in a libvirt domain's `<metadata>` (namespace `urn:gpuhook:gpu:1`), and
//! the few other facts of the domain XML the hook needs: name, UUID, `id` (the controller's
//! PID while running) and `<idmap>`.
//!
//! Parsing is strict inside gpuhook's own element (unknown attributes, children, duplicate
//! or contradictory values are errors) and blind to every other namespace but one: Nova's
//! flavor metadata (`<nova:instance><nova:flavor><nova:extraSpecs><nova:extraSpec name=…>`),
//! whose GPU keys (the blueprint's `gpus`, `gpu_arch`, `gpu_model`, `gpu_vendor` and
//! Placement's `resources[N]:CUSTOM_GPU_<ARCH>`) are a request when the domain has no gpuhook
//! element. Everything else of Nova's is left unread.

use crate::ids::normalize_uuid;
use error::{err, ParseFault};
use parser::Parser;

mod attrs;
mod domain;
pub(crate) mod error;
mod limits;
mod parser;

pub use domain::{Domain, Source, NOVA_NS_PREFIX, NS, NS_FAMILY};
pub use error::{AttrError, ParseError};
pub use limits::{IDMAP, MAX_XML};

/// Whether the document mentions gpuhook's namespace.
pub fn mentions_gpuhook(xml: &[u8]) -> bool {
    find(xml, NS.as_bytes()).is_some()
}

/// Whether the document mentions a namespace of gpuhook's family (`urn:gpuhook:…`), its own
/// or one that only looks like it.
pub fn mentions_family(xml: &[u8]) -> bool {
    find(xml, NS_FAMILY.as_bytes()).is_some()
}

/// The warning for a domain whose `<metadata>` has elements in namespaces that look like
/// gpuhook's and are not (`urn:gpuhook:gpu:2`): they ask for nothing; `None` when it has none.
pub fn unknown_ns_warning(dom: &Domain) -> Option<String> {
    if dom.unknown_ns.is_empty() {
        return None;
    }
    Some(format!(
        "domain '{}': <metadata> has {} in namespace {}, which gpuhook does not read (its namespace is {NS}): {}",
        dom.name,
        if dom.unknown_ns.len() == 1 { "an element" } else { "elements" },
        dom.unknown_ns
            .iter()
            .map(|n| format!("'{n}'"))
            .collect::<Vec<_>>()
            .join(", "),
        match &dom.request {
            Some(_) => "only its <gpus> element in that namespace is the request",
            None => "the domain asks for no GPUs and starts without any",
        }
    ))
}

/// Whether the document may ask for GPUs: it mentions gpuhook's namespace, or Nova's and a
/// GPU key of a flavor (`"gpus"`, `"gpu_…`, `"resources…:CUSTOM_GPU_…`). libvirt formats the
/// XML itself (no DTD, no entities; libxml2 writes attribute values as they are, quoted), so
/// a document without these strings has no request: the hook can leave at once without
/// parsing anything. A false positive only costs a parse.
pub fn may_request(xml: &[u8]) -> bool {
    if mentions_gpuhook(xml) {
        return true;
    }
    let Some(nova) = find(xml, NOVA_NS_PREFIX.as_bytes()) else {
        return false;
    };
    // One pass over what follows Nova's namespace: an attribute value (or text) that opens
    // with a GPU key. Nova's elements come after the declaration of its namespace.
    let rest = &xml[nova..];
    rest.iter()
        .enumerate()
        .any(|(i, &q)| (q == b'"' || q == b'\'') && nova_gpu_key_at(&rest[i + 1..], q))
}

/// Whether `v` (what follows a quote `q`) opens with a flavor's GPU key: `gpus` closed by
/// the quote, `gpu_`, or `resources[GROUP]:CUSTOM_GPU_`.
fn nova_gpu_key_at(v: &[u8], q: u8) -> bool {
    if let Some(r) = v.strip_prefix(b"gpu") {
        return r.first() == Some(&b'_') || (r.first() == Some(&b's') && r.get(1) == Some(&q));
    }
    let Some(group) = v.strip_prefix(b"resources") else {
        return false;
    };
    let n = group
        .iter()
        .take(65)
        .take_while(|&&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        .count();
    group[n..].starts_with(b":CUSTOM_GPU_")
}

/// Where `needle` first occurs in `hay`. A plain scan: SIMD search crates detect CPU
/// features at first use, and on VMs where CPUID traps to the hypervisor that alone costs
/// more than scanning a domain XML (measured: +190 µs per hook run, docs/BENCHMARKS.md).
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let last = hay.len().checked_sub(needle.len())?;
    let mut i = 0;
    while i <= last {
        let at = i + hay[i..=last].iter().position(|&b| b == first)?;
        if hay[at + 1..at + needle.len()] == *rest {
            return Some(at);
        }
        i = at + 1;
    }
    None
}

/// The domain's UUID without parsing the document: the text of its first `<uuid>` element.
/// libvirt formats `<name>` and `<uuid>` before `<title>`, `<description>`, `<metadata>` and
/// everything else a user writes (text there is escaped), so the first one is the domain's.
/// `None` when there is none or it is not a UUID.
pub fn domain_uuid(xml: &[u8]) -> Option<String> {
    let start = find(xml, b"<uuid>")? + b"<uuid>".len();
    let len = find(&xml[start..xml.len().min(start + 64)], b"</uuid>")?;
    normalize_uuid(std::str::from_utf8(&xml[start..start + len]).ok()?)
}

/// Parses a domain XML. Errors are one line, without the domain name (callers add it).
pub fn parse_domain(xml: &[u8]) -> Result<Domain, ParseError> {
    if xml.len() > MAX_XML {
        return err(ParseFault::TooLarge);
    }
    let text = std::str::from_utf8(xml).map_err(ParseFault::NotUtf8)?;
    Parser::default().run(text)
}

#[cfg(test)]
mod tests;
