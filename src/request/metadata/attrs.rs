//! The domain XML's side of a request: `<gpus>`'s attributes and children, and Nova's extra
//! specs, into the one grammar ([`crate::request::attrs`]).

use super::error::{err, ParseError, ParseFault, SpecFault};
use super::limits::{MAX_DEVICES, MAX_VALUE};
use crate::ids::{normalize_pci, Vendor};
use crate::request::attrs::{parse_u32, set_attr, GpusBuilder};
use crate::request::extra_specs::{self, Op};
use crate::request::{DeviceSel, Field, Filter, IdRange, MigSel};
use quick_xml::events::BytesStart;
use quick_xml::name::ResolveResult;
use quick_xml::reader::NsReader;
use quick_xml::XmlVersion;

pub(super) fn attr_value(
    a: &quick_xml::events::attributes::Attribute,
) -> Result<String, ParseError> {
    let v = a
        .normalized_value(XmlVersion::Implicit1_0)
        .map_err(ParseFault::AttrValue)?;
    if v.len() > MAX_VALUE {
        return err(ParseFault::AttrTooLong {
            key: a.key.as_ref().into(),
        });
    }
    Ok(v.into_owned())
}

/// Adds a `<device>` or `<mig>` child's selector: each at most once, at most
/// [`MAX_DEVICES`] of them.
pub(super) fn push_unique<T: PartialEq + std::fmt::Display>(
    v: &mut Vec<T>,
    x: T,
    what: &'static str,
) -> Result<(), ParseError> {
    if v.len() >= MAX_DEVICES {
        return err(ParseFault::TooManyChildren { what });
    }
    if v.contains(&x) {
        return err(ParseFault::NamedTwice {
            what,
            sel: x.to_string(),
        });
    }
    v.push(x);
    Ok(())
}

pub(super) fn is_xmlns(key: &str) -> bool {
    key == "xmlns" || key.starts_with("xmlns:")
}

pub(super) fn parse_idmap_entry(e: &BytesStart) -> Result<IdRange, ParseError> {
    let (mut start, mut target, mut count) = (None, None, None);
    for a in e.attributes() {
        let a = a.map_err(ParseFault::XmlAttr)?;
        let v = attr_value(&a)?;
        match a.key.as_ref() {
            "start" => start = Some(parse_u32("idmap start", &v)?),
            "target" => target = Some(parse_u32("idmap target", &v)?),
            "count" => count = Some(parse_u32("idmap count", &v)?),
            _ => {}
        }
    }
    match (start, target, count) {
        (Some(start), Some(target), Some(count)) => Ok(IdRange {
            start,
            target,
            count,
        }),
        _ => err(ParseFault::IdmapEntry),
    }
}

/// Each attribute of gpuhook's element `<elem>` but namespace declarations: one in another
/// namespace is an error naming the element; `f` gets the local name and the attribute.
pub(super) fn each_attr(
    reader: &NsReader<&[u8]>,
    e: &BytesStart,
    elem: &'static str,
    mut f: impl FnMut(&str, &quick_xml::events::attributes::Attribute) -> Result<(), ParseError>,
) -> Result<(), ParseError> {
    for a in e.attributes() {
        let a = a.map_err(ParseFault::XmlAttr)?;
        if is_xmlns(a.key.as_ref()) {
            continue;
        }
        let (ans, key) = reader.resolver().resolve_attribute(a.key);
        if !matches!(ans, ResolveResult::Unbound) {
            return err(ParseFault::UnknownAttr {
                key: a.key.as_ref().into(),
                elem,
            });
        }
        f(key.as_ref(), &a)?;
    }
    Ok(())
}

pub(super) fn parse_gpus_attrs(
    reader: &NsReader<&[u8]>,
    e: &BytesStart,
    g: &mut GpusBuilder,
) -> Result<(), ParseError> {
    each_attr(reader, e, "gpus", |key, a| {
        let v = attr_value(a)?;
        match set_attr(g, key, &v) {
            Ok(true) => Ok(()),
            Ok(false) => err(ParseFault::UnknownGpusAttr { key: key.into() }),
            Err(source) => err(ParseFault::GpusAttr {
                key: key.into(),
                source,
            }),
        }
    })
}

pub(super) fn parse_device(
    reader: &NsReader<&[u8]>,
    e: &BytesStart,
) -> Result<DeviceSel, ParseError> {
    let mut sel = None;
    for a in e.attributes() {
        let a = a.map_err(ParseFault::XmlAttr)?;
        if is_xmlns(a.key.as_ref()) {
            continue;
        }
        let (ans, key) = reader.resolver().resolve_attribute(a.key);
        let v = attr_value(&a)?;
        let named = match ans {
            ResolveResult::Unbound => device_sel(key.as_ref(), &v)?,
            _ => None,
        };
        let Some(this) = named else {
            return err(ParseFault::UnknownDeviceAttr {
                key: a.key.as_ref().into(),
            });
        };
        if sel.is_some() {
            return err(ParseFault::DeviceTwoNames);
        }
        sel = Some(this);
    }
    Ok(sel.ok_or(ParseFault::DeviceNoName)?)
}

/// The GPU a `pci`, `uuid` or `index` attribute (of `<device>` or `<mig>`) names; `None` for
/// another attribute.
pub(super) fn device_sel(key: &str, v: &str) -> Result<Option<DeviceSel>, ParseError> {
    Ok(Some(match key {
        "pci" => {
            DeviceSel::Pci(normalize_pci(v).ok_or_else(|| ParseFault::BadPci { value: v.into() })?)
        }
        "uuid" => {
            let u = v.trim();
            if u.is_empty() || !u.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return err(ParseFault::BadGpuUuid { value: v.into() });
            }
            DeviceSel::Uuid(u.to_ascii_lowercase())
        }
        "index" => DeviceSel::Index(parse_u32("device index", v)?),
        _ => return Ok(None),
    }))
}

/// `<gpu:mig pci|uuid|index="…" gi="G" ci="C"/>`.
pub(super) fn parse_mig(reader: &NsReader<&[u8]>, e: &BytesStart) -> Result<MigSel, ParseError> {
    let (mut gpu, mut gi, mut ci) = (None, None, None);
    each_attr(reader, e, "mig", |key, a| {
        let v = attr_value(a)?;
        match key {
            "gi" => gi = Some(parse_u32("mig gi", &v)?),
            "ci" => ci = Some(parse_u32("mig ci", &v)?),
            _ => match device_sel(key, &v)? {
                Some(_) if gpu.is_some() => return err(ParseFault::MigTwoGpus),
                Some(sel) => gpu = Some(sel),
                None => return err(ParseFault::UnknownMigAttr { key: key.into() }),
            },
        }
        Ok(())
    })?;
    let gpu = gpu.ok_or(ParseFault::MigNoGpu)?;
    match (gi, ci) {
        (Some(gi), Some(ci)) => Ok(MigSel { gpu, gi, ci }),
        _ => err(ParseFault::MigNeedsGiCi),
    }
}

pub(super) fn apply_extra_spec(
    g: &mut GpusBuilder,
    key: &str,
    value: &str,
) -> Result<(), ParseError> {
    let bad = |fault: SpecFault| -> ParseError {
        ParseFault::Spec {
            key: key.into(),
            value: value.trim().into(),
            source: fault,
        }
        .into()
    };
    if let Some(class) = extra_specs::gpu_resource_class(key) {
        if !crate::request::extra_specs::valid_custom_name(class) {
            return Err(bad(SpecFault::NotAClass {
                class: class.into(),
            }));
        }
        let n = extra_specs::parse_amount(value).map_err(|e| bad(e.into()))?;
        if n > 0 {
            g.resources.push((key.to_owned(), class.to_owned(), n));
        }
        return Ok(());
    }
    match key {
        "gpus" => {
            let (n, at_least) = extra_specs::parse_count_bound(value).map_err(|e| bad(e.into()))?;
            g.spec_count = Some((n, value.trim().to_owned(), at_least));
        }
        "gpu_arch" | "gpu_model" | "gpu_vendor" => {
            let op = extra_specs::parse_string_op(value).map_err(|e| bad(e.into()))?;
            let field = match key {
                "gpu_arch" => Field::Arch,
                "gpu_model" => Field::Model,
                _ => Field::Vendor,
            };
            if field == Field::Vendor {
                let names: Vec<&String> = match &op {
                    Op::Eq(v) | Op::Ne(v) => vec![v],
                    Op::OneOf(vs) => vs.iter().collect(),
                    _ => vec![],
                };
                if let Some(v) = names.iter().find(|v| Vendor::from_name(v).is_none()) {
                    return Err(bad(SpecFault::Vendor {
                        vendor: v.to_string(),
                    }));
                }
            }
            g.filters.push(Filter { field, op });
        }
        // Nova flavors carry many other keys (hypervisor_type, cpu_arch, …): not ours.
        _ => {}
    }
    Ok(())
}
