//! The domain XML's reader: one pass of events over a stack of contexts.

use super::attrs::{
    apply_extra_spec, attr_value, each_attr, parse_device, parse_gpus_attrs, parse_idmap_entry,
    parse_mig, push_unique,
};
use super::domain::{Domain, Source, NOVA_NS_PREFIX, NS, NS_FAMILY};
use super::error::{err, ParseError, ParseFault};
use super::limits::{IDMAP, MAX_EXTRA_SPECS, MAX_VALUE};
use crate::ids::normalize_uuid;
use crate::request::attrs::{build_request, GpusBuilder};
use crate::request::extra_specs;
use crate::request::{IdMap, Request};
use quick_xml::escape::resolve_predefined_entity;
use quick_xml::events::{BytesRef, BytesStart, Event};
use quick_xml::name::{Namespace, ResolveResult};
use quick_xml::reader::NsReader;
use quick_xml::XmlVersion;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ctx {
    Domain,
    Name,
    Uuid,
    Metadata,
    Gpus,
    Device,
    Mig,
    ExtraSpec,
    Idmap,
    IdmapEntry,
    NovaInstance,
    NovaFlavor,
    NovaExtraSpecs,
    /// A flavor extra spec with a GPU key: its text is read.
    NovaExtraSpec,
    /// Anything else: skipped, with its whole subtree.
    Other,
}

/// A Nova flavor's GPU extra specs, as read from `<nova:extraSpecs>`.
#[derive(Default)]
struct NovaSpecs {
    flavor: Option<String>,
    specs: Vec<(String, String)>,
    current: Option<String>,
    text: String,
}

/// Whether a flavor extra spec is one gpuhook reads.
fn nova_gpu_key(key: &str) -> bool {
    matches!(key, "gpus" | "gpu_arch" | "gpu_model" | "gpu_vendor")
        || extra_specs::gpu_resource_class(key).is_some()
}

#[derive(Default)]
pub(super) struct Parser {
    stack: Vec<Ctx>,
    name: Option<String>,
    uuid: Option<String>,
    id: Option<i32>,
    idmap: IdMap,
    gpus: Option<GpusBuilder>,
    seen_gpus: bool,
    nova: NovaSpecs,
    text: String,
    saw_root: bool,
    /// gpuhook-like namespaces of `<metadata>`'s elements that are not gpuhook's.
    unknown_ns: Vec<String>,
}

impl Parser {
    fn top(&self) -> Option<Ctx> {
        self.stack.last().copied()
    }

    fn in_ns(ns: &ResolveResult) -> bool {
        matches!(ns, ResolveResult::Bound(Namespace(n)) if *n == NS)
    }

    fn in_nova_ns(ns: &ResolveResult) -> bool {
        matches!(ns, ResolveResult::Bound(Namespace(n)) if n.starts_with(NOVA_NS_PREFIX))
    }

    pub(super) fn run(mut self, text: &str) -> Result<Domain, ParseError> {
        let mut reader = NsReader::from_str(text);
        reader.config_mut().check_end_names = true;
        loop {
            let (ns, ev) = reader.read_resolved_event().map_err(ParseFault::Xml)?;
            if matches!(ev, Event::Start(_) | Event::Empty(_)) && self.top() == Some(Ctx::Metadata)
            {
                self.note_lookalike(&ns);
            }
            let ns = Self::ns_of(&ns);
            if !self.event(&reader, ev, ns)? {
                break;
            }
        }
        self.finish()
    }

    /// A `<metadata>` element in a namespace that looks like gpuhook's and is not: noted (at
    /// most a few, each once).
    fn note_lookalike(&mut self, ns: &ResolveResult) {
        let ResolveResult::Bound(Namespace(n)) = ns else {
            return;
        };
        if *n == NS || !n.starts_with(NS_FAMILY) {
            return;
        }
        let uri: String = n.chars().take(100).collect();
        if self.unknown_ns.len() < 4 && !self.unknown_ns.contains(&uri) {
            self.unknown_ns.push(uri);
        }
    }

    fn ns_of(ns: &ResolveResult) -> Ns {
        if Self::in_ns(ns) {
            Ns::Ours
        } else if matches!(ns, ResolveResult::Unbound) {
            Ns::None
        } else if Self::in_nova_ns(ns) {
            Ns::Nova
        } else {
            Ns::Other
        }
    }

    /// One event of the document; `Ok(false)` at its end.
    fn event(&mut self, reader: &NsReader<&[u8]>, ev: Event, ns: Ns) -> Result<bool, ParseError> {
        match ev {
            Event::Start(e) => {
                let ctx = self.open(reader, &e, ns)?;
                self.stack.push(ctx);
            }
            Event::Empty(e) => {
                let ctx = self.open(reader, &e, ns)?;
                self.stack.push(ctx);
                self.close()?;
            }
            Event::End(_) => self.close()?,
            Event::Text(t) => self.text_in(&t.xml10_content())?,
            Event::CData(c) => {
                let s: &str = &c;
                self.text_in(s)?
            }
            Event::GeneralRef(r) => self.text_in(&general_ref(&r)?)?,
            Event::DocType(_) => return err(ParseFault::DocType),
            Event::Decl(_) | Event::PI(_) | Event::Comment(_) => {}
            Event::Eof => return Ok(false),
        }
        Ok(true)
    }

    /// The domain, once the whole document is read.
    fn finish(mut self) -> Result<Domain, ParseError> {
        if !self.saw_root {
            return err(ParseFault::EmptyDocument);
        }
        if !self.stack.is_empty() {
            return err(ParseFault::UnexpectedEnd);
        }
        let (request, source) = self.request()?;
        let name = self.name.take().ok_or(ParseFault::NoName)?;
        let uuid = self.uuid.take().ok_or(ParseFault::NoUuid)?;
        if let Some(r) = &request {
            self.idmap
                .owner(r.uid, r.gid, (IDMAP, IDMAP))
                .map_err(ParseFault::Unmapped)?;
        }
        Ok(Domain {
            name,
            uuid,
            id: self.id,
            idmap: self.idmap,
            request,
            source,
            unknown_ns: self.unknown_ns,
        })
    }

    /// The request (gpuhook's element, else Nova's flavor) and where it came from.
    fn request(&mut self) -> Result<(Option<Request>, Source), ParseError> {
        let nova_flavor = self
            .nova
            .flavor
            .take()
            .unwrap_or_else(|| "(unnamed)".into());
        Ok(match self.gpus.take() {
            Some(g) => (
                Some(build_request(g)?),
                Source::Gpuhook {
                    nova_ignored: (!self.nova.specs.is_empty()).then_some(nova_flavor),
                },
            ),
            None => match nova_request(&self.nova.specs).map_err(|source| ParseFault::Nova {
                flavor: nova_flavor.clone(),
                source,
            })? {
                Some(r) => (
                    Some(r),
                    Source::Nova {
                        flavor: nova_flavor,
                    },
                ),
                None => (None, Source::None),
            },
        })
    }

    fn text_in(&mut self, s: &str) -> Result<(), ParseError> {
        match self.top() {
            Some(Ctx::Name) | Some(Ctx::Uuid) => {
                if self.text.len() + s.len() > 1024 {
                    return err(ParseFault::NameTooLong);
                }
                self.text.push_str(s)
            }
            Some(Ctx::ExtraSpec) => {
                let g = self.gpus.as_mut().expect("extra_spec inside gpus");
                if g.text.len() + s.len() > MAX_VALUE {
                    return err(ParseFault::SpecTooLong);
                }
                g.text.push_str(s);
            }
            Some(Ctx::NovaExtraSpec) => {
                if self.nova.text.len() + s.len() > MAX_VALUE {
                    return err(ParseFault::NovaSpecTooLong {
                        key: self.nova.current.clone().unwrap_or_default(),
                    });
                }
                self.nova.text.push_str(s);
            }
            Some(Ctx::Gpus) | Some(Ctx::Device) | Some(Ctx::Mig) if !s.trim().is_empty() => {
                return err(ParseFault::Text {
                    text: s.trim().chars().take(40).collect(),
                });
            }
            _ => {}
        }
        Ok(())
    }

    fn open(
        &mut self,
        reader: &NsReader<&[u8]>,
        e: &BytesStart,
        ns: Ns,
    ) -> Result<Ctx, ParseError> {
        let (ours, no_ns, nova) = (ns == Ns::Ours, ns == Ns::None, ns == Ns::Nova);
        let local = e.local_name();
        let local = local.as_ref();
        let ctx = match self.top() {
            None => self.open_root(e, no_ns, local)?,
            Some(Ctx::Domain) if no_ns => self.open_in_domain(local),
            Some(Ctx::Idmap) if no_ns && (local == "uid" || local == "gid") => {
                let r = parse_idmap_entry(e)?;
                if local == "uid" {
                    self.idmap.uid.push(r)
                } else {
                    self.idmap.gid.push(r)
                }
                Ctx::IdmapEntry
            }
            Some(Ctx::Metadata) if ours => self.open_gpus(reader, e, local)?,
            Some(Ctx::Gpus) => {
                let g = self.gpus.as_mut().expect("inside gpus");
                open_in_gpus(g, reader, e, ours, local)?
            }
            Some(Ctx::Device) | Some(Ctx::Mig) | Some(Ctx::ExtraSpec) => {
                return err(ParseFault::ElementInside {
                    name: e.name().as_ref().into(),
                })
            }
            // Nova's flavor metadata: only the path to its extra specs is followed, leniently
            // (Nova's elements are Nova's business); nothing else of Nova's is read.
            Some(Ctx::Metadata) if nova && local == "instance" => Ctx::NovaInstance,
            Some(Ctx::NovaInstance) if nova && local == "flavor" => {
                if self.nova.flavor.is_none() {
                    self.nova.flavor = lenient_attr(e, "name");
                }
                Ctx::NovaFlavor
            }
            Some(Ctx::NovaFlavor) if nova && local == "extraSpecs" => Ctx::NovaExtraSpecs,
            Some(Ctx::NovaExtraSpecs) if nova && local == "extraSpec" => self.open_nova_spec(e)?,
            Some(Ctx::NovaExtraSpec) => {
                return err(ParseFault::ElementInNovaSpec {
                    name: e.name().as_ref().into(),
                    key: self.nova.current.clone().unwrap_or_default(),
                })
            }
            _ => Ctx::Other,
        };
        Ok(ctx)
    }

    /// The root element: `<domain>`, its `id`.
    fn open_root(&mut self, e: &BytesStart, no_ns: bool, local: &str) -> Result<Ctx, ParseError> {
        if self.saw_root {
            return err(ParseFault::MoreThanOneRoot);
        }
        self.saw_root = true;
        if !(no_ns && local == "domain") {
            return err(ParseFault::Root {
                name: e.name().as_ref().into(),
            });
        }
        for a in e.attributes() {
            let a = a.map_err(ParseFault::XmlAttr)?;
            if a.key.as_ref() == "id" {
                let v = attr_value(&a)?;
                match v.parse::<i32>() {
                    Ok(id) => self.id = Some(id),
                    Err(source) => return err(ParseFault::DomainId { value: v, source }),
                }
            }
        }
        Ok(Ctx::Domain)
    }

    /// A child of `<domain>`.
    fn open_in_domain(&mut self, local: &str) -> Ctx {
        match local {
            "name" => {
                self.text.clear();
                Ctx::Name
            }
            "uuid" => {
                self.text.clear();
                Ctx::Uuid
            }
            "metadata" => Ctx::Metadata,
            "idmap" => Ctx::Idmap,
            _ => Ctx::Other,
        }
    }

    /// gpuhook's element in `<metadata>`: `<gpus>`, once.
    fn open_gpus(
        &mut self,
        reader: &NsReader<&[u8]>,
        e: &BytesStart,
        local: &str,
    ) -> Result<Ctx, ParseError> {
        if local != "gpus" {
            return err(ParseFault::NotGpus { name: local.into() });
        }
        if self.seen_gpus {
            return err(ParseFault::MoreThanOneGpus);
        }
        self.seen_gpus = true;
        let mut g = GpusBuilder::default();
        parse_gpus_attrs(reader, e, &mut g)?;
        self.gpus = Some(g);
        Ok(Ctx::Gpus)
    }

    /// A `<nova:extraSpec>`: read when its key is a GPU key.
    fn open_nova_spec(&mut self, e: &BytesStart) -> Result<Ctx, ParseError> {
        Ok(match lenient_attr(e, "name") {
            Some(key) if nova_gpu_key(&key) => {
                if self.nova.specs.len() >= MAX_EXTRA_SPECS {
                    return err(ParseFault::TooManyNovaSpecs);
                }
                self.nova.current = Some(key);
                self.nova.text.clear();
                Ctx::NovaExtraSpec
            }
            _ => Ctx::Other,
        })
    }

    fn close(&mut self) -> Result<(), ParseError> {
        let ctx = self.stack.pop().ok_or(ParseFault::UnexpectedClose)?;
        match ctx {
            Ctx::Name => {
                let n = self.text.trim().to_owned();
                if n.is_empty() {
                    return err(ParseFault::EmptyName);
                }
                self.name = Some(n);
            }
            Ctx::Uuid => {
                let u = normalize_uuid(&self.text).ok_or_else(|| ParseFault::BadUuid {
                    value: self.text.trim().into(),
                })?;
                self.uuid = Some(u);
            }
            Ctx::ExtraSpec => {
                let g = self.gpus.as_mut().expect("inside gpus");
                let key = g.current_spec.take().unwrap_or_default();
                let value = std::mem::take(&mut g.text);
                apply_extra_spec(g, &key, &value)?;
            }
            Ctx::NovaExtraSpec => {
                let key = self.nova.current.take().unwrap_or_default();
                if self.nova.specs.iter().any(|(k, _)| *k == key) {
                    return err(ParseFault::NovaSpecTwice { key });
                }
                let value = std::mem::take(&mut self.nova.text);
                self.nova.specs.push((key, value));
            }
            _ => {}
        }
        Ok(())
    }
}

/// The namespace of an element, as the parser tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ns {
    Ours,
    Nova,
    None,
    Other,
}

/// An unqualified attribute of someone else's element, unescaped; `None` when absent or not
/// readable (Nova's elements never fail a domain: only their GPU keys are gpuhook's).
fn lenient_attr(e: &BytesStart, name: &str) -> Option<String> {
    let a = e.try_get_attribute(name).ok()??;
    let v = a.normalized_value(XmlVersion::Implicit1_0).ok()?;
    (v.len() <= MAX_VALUE).then(|| v.into_owned())
}

/// The request a Nova flavor's GPU extra specs make, read as the same keys in a gpuhook
/// `<extra_spec>` are; `None` when they ask for nothing (`resources:CUSTOM_GPU_X=0`).
fn nova_request(specs: &[(String, String)]) -> Result<Option<Request>, ParseError> {
    let mut g = GpusBuilder::default();
    for (k, v) in specs {
        apply_extra_spec(&mut g, k, v)?;
    }
    // A flavor asks for GPUs by a number: `gpus`, or a `resources…` key that is not 0.
    // The other keys only narrow such a request (Nova treats them as scheduling filters).
    if g.spec_count.is_none() && g.resources.is_empty() {
        return Ok(None);
    }
    Ok(Some(build_request(g)?))
}

/// The text of a character or predefined entity reference; other entities are refused.
fn general_ref(r: &BytesRef) -> Result<String, ParseError> {
    if r.is_char_ref() {
        match r.resolve_char_ref() {
            Ok(Some(c)) => Ok(c.to_string()),
            res => err(ParseFault::BadCharRef {
                name: (**r).into(),
                source: res.err(),
            }),
        }
    } else {
        match resolve_predefined_entity(r) {
            Some(s) => Ok(s.to_owned()),
            None => err(ParseFault::UnknownEntity { name: (**r).into() }),
        }
    }
}

/// A child of gpuhook's `<gpus>`: `<device>`, `<mig>` or `<extra_spec>`.
fn open_in_gpus(
    g: &mut GpusBuilder,
    reader: &NsReader<&[u8]>,
    e: &BytesStart,
    ours: bool,
    local: &str,
) -> Result<Ctx, ParseError> {
    if !ours {
        return err(ParseFault::ForeignInGpus {
            name: e.name().as_ref().into(),
        });
    }
    match local {
        "device" => {
            push_unique(&mut g.devices, parse_device(reader, e)?, "device")?;
            Ok(Ctx::Device)
        }
        "mig" => {
            push_unique(&mut g.migs, parse_mig(reader, e)?, "mig")?;
            Ok(Ctx::Mig)
        }
        "extra_spec" => open_extra_spec(g, reader, e),
        other => err(ParseFault::UnknownInGpus { name: other.into() }),
    }
}

/// `<extra_spec name='…'>`: each name once, at most [`MAX_EXTRA_SPECS`] of them.
fn open_extra_spec(
    g: &mut GpusBuilder,
    reader: &NsReader<&[u8]>,
    e: &BytesStart,
) -> Result<Ctx, ParseError> {
    if g.spec_keys.len() >= MAX_EXTRA_SPECS {
        return err(ParseFault::TooManySpecs);
    }
    let mut name = None;
    each_attr(reader, e, "extra_spec", |key, a| {
        if key != "name" {
            return err(ParseFault::UnknownAttr {
                key: key.into(),
                elem: "extra_spec",
            });
        }
        name = Some(attr_value(a)?);
        Ok(())
    })?;
    let name = name.ok_or(ParseFault::SpecWithoutName)?;
    if g.spec_keys.contains(&name) {
        return err(ParseFault::SpecTwice { name });
    }
    g.spec_keys.push(name.clone());
    g.current_spec = Some(name);
    g.text.clear();
    Ok(Ctx::ExtraSpec)
}
