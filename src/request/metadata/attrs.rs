//! A request's attributes and children, whichever front door they came through, and the
//! [`Request`] they build.

use super::error::{CountFrom, Resources, SpecFault};
use super::{err, AttrError, Kind, ParseError, MAX_DEVICES, MAX_VALUE};
use crate::ids::{normalize_pci, Vendor};
use crate::request::extra_specs::{self, Op};
use crate::request::{Capabilities, DeviceSel, Field, Filter, IdRange, MigSel, Request};
use quick_xml::events::BytesStart;
use quick_xml::name::ResolveResult;
use quick_xml::reader::NsReader;
use quick_xml::XmlVersion;

#[derive(Default)]
pub(crate) struct GpusBuilder {
    pub(super) count_attr: Option<u32>,
    /// The `gpus` key: (N, its text, whether Nova reads it as "at least N").
    pub(super) spec_count: Option<(u32, String, bool)>,
    pub(super) filters: Vec<Filter>,
    pub(crate) devices: Vec<DeviceSel>,
    pub(super) capabilities: Option<Capabilities>,
    pub(super) mode: Option<u32>,
    pub(super) uid: Option<u32>,
    pub(super) gid: Option<u32>,
    pub(super) spec_keys: Vec<String>,
    pub(super) current_spec: Option<String>,
    pub(super) text: String,
    /// `resources[N]:CUSTOM_GPU_<ARCH>` keys: (key, class, amount > 0).
    pub(super) resources: Vec<(String, String, u32)>,
    /// `mig="yes|no"`.
    pub(super) mig: Option<bool>,
    /// `<mig>` children.
    pub(super) migs: Vec<MigSel>,
    /// `driver="none|cdi|host"`.
    pub(super) driver: Option<crate::request::Driver>,
    /// `share="yes|no"`.
    pub(super) share: Option<bool>,
}

/// A yes/no attribute's value.
fn yes_no(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "yes" | "true" | "1" => Some(true),
        "no" | "false" | "0" => Some(false),
        _ => None,
    }
}

pub(super) fn attr_value(
    a: &quick_xml::events::attributes::Attribute,
) -> Result<String, ParseError> {
    let v = a
        .normalized_value(XmlVersion::Implicit1_0)
        .map_err(Kind::AttrValue)?;
    if v.len() > MAX_VALUE {
        return err(Kind::AttrTooLong {
            key: a.key.as_ref().into(),
        });
    }
    Ok(v.into_owned())
}

pub(super) fn parse_u32(what: &'static str, s: &str) -> Result<u32, ParseError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return err(Kind::NotWhole {
            what,
            value: s.into(),
        });
    }
    s.parse::<u32>().or_else(|source| {
        err(Kind::OutOfRange {
            what,
            value: s.into(),
            source,
        })
    })
}

pub(super) fn parse_mode(s: &str) -> Result<u32, ParseError> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    if digits.is_empty() || digits.len() > 4 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
    {
        return err(Kind::ModeNotOctal { value: s.into() });
    }
    let m = u32::from_str_radix(digits, 8).map_err(|source| Kind::BadMode {
        value: s.into(),
        source,
    })?;
    if m & !0o777 != 0 {
        return err(Kind::ModeSpecialBits { value: s.into() });
    }
    Ok(m)
}

/// Adds a `<device>` or `<mig>` child's selector: each at most once, at most
/// [`MAX_DEVICES`] of them.
pub(super) fn push_unique<T: PartialEq + std::fmt::Display>(
    v: &mut Vec<T>,
    x: T,
    what: &'static str,
) -> Result<(), ParseError> {
    if v.len() >= MAX_DEVICES {
        return err(Kind::TooManyChildren { what });
    }
    if v.contains(&x) {
        return err(Kind::NamedTwice {
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
        let a = a.map_err(Kind::XmlAttr)?;
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
        _ => err(Kind::IdmapEntry),
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
        let a = a.map_err(Kind::XmlAttr)?;
        if is_xmlns(a.key.as_ref()) {
            continue;
        }
        let (ans, key) = reader.resolver().resolve_attribute(a.key);
        if !matches!(ans, ResolveResult::Unbound) {
            return err(Kind::UnknownAttr {
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
            Ok(false) => err(Kind::UnknownGpusAttr { key: key.into() }),
            Err(source) => err(Kind::GpusAttr {
                key: key.into(),
                source,
            }),
        }
    })
}

/// Applies one request attribute, whichever front door it came through (`<gpus KEY='…'>`,
/// the OCI annotation `gpuhook.io/KEY`, the env variable `GPUHOOK_KEY`); the same validation
/// for all. `Ok(false)`: not an attribute of a request. The error names only the fault (the
/// caller names where it was).
pub(crate) fn set_attr(g: &mut GpusBuilder, key: &str, v: &str) -> Result<bool, AttrError> {
    match key {
        "count" => g.count_attr = Some(extra_specs::parse_positive_count(v)?),
        "vendor" => {
            let vendor = Vendor::from_name(v).ok_or_else(|| AttrError::Vendor(v.to_string()))?;
            g.filters.push(Filter {
                field: Field::Vendor,
                op: Op::Eq(vendor.as_str().into()),
            });
        }
        "arch" | "model" => {
            let x = v.trim().to_ascii_lowercase();
            if x.is_empty() {
                return Err(AttrError::Empty(if key == "arch" {
                    "architecture"
                } else {
                    "model"
                }));
            }
            g.filters.push(if key == "arch" {
                Filter {
                    field: Field::Arch,
                    op: Op::Eq(x),
                }
            } else {
                Filter {
                    field: Field::Model,
                    op: Op::Contains(x),
                }
            });
        }
        "capabilities" => g.capabilities = Some(Capabilities::parse(v)?),
        "mig" => g.mig = Some(yes_no(v).ok_or_else(|| AttrError::Mig(v.to_string()))?),
        "share" => g.share = Some(yes_no(v).ok_or_else(|| AttrError::Share(v.to_string()))?),
        "mode" => g.mode = Some(parse_mode(v)?),
        "driver" => g.driver = Some(crate::request::Driver::parse(v)?),
        "uid" => g.uid = Some(parse_u32("uid", v)?),
        "gid" => g.gid = Some(parse_u32("gid", v)?),
        _ => return Ok(false),
    }
    Ok(true)
}

pub(super) fn parse_device(
    reader: &NsReader<&[u8]>,
    e: &BytesStart,
) -> Result<DeviceSel, ParseError> {
    let mut sel = None;
    for a in e.attributes() {
        let a = a.map_err(Kind::XmlAttr)?;
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
            return err(Kind::UnknownDeviceAttr {
                key: a.key.as_ref().into(),
            });
        };
        if sel.is_some() {
            return err(Kind::DeviceTwoNames);
        }
        sel = Some(this);
    }
    Ok(sel.ok_or(Kind::DeviceNoName)?)
}

/// The GPU a `pci`, `uuid` or `index` attribute (of `<device>` or `<mig>`) names; `None` for
/// another attribute.
pub(super) fn device_sel(key: &str, v: &str) -> Result<Option<DeviceSel>, ParseError> {
    Ok(Some(match key {
        "pci" => DeviceSel::Pci(normalize_pci(v).ok_or_else(|| Kind::BadPci { value: v.into() })?),
        "uuid" => {
            let u = v.trim();
            if u.is_empty() || !u.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return err(Kind::BadGpuUuid { value: v.into() });
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
                Some(_) if gpu.is_some() => return err(Kind::MigTwoGpus),
                Some(sel) => gpu = Some(sel),
                None => return err(Kind::UnknownMigAttr { key: key.into() }),
            },
        }
        Ok(())
    })?;
    let gpu = gpu.ok_or(Kind::MigNoGpu)?;
    match (gi, ci) {
        (Some(gi), Some(ci)) => Ok(MigSel { gpu, gi, ci }),
        _ => err(Kind::MigNeedsGiCi),
    }
}

pub(super) fn apply_extra_spec(
    g: &mut GpusBuilder,
    key: &str,
    value: &str,
) -> Result<(), ParseError> {
    let bad = |fault: SpecFault| -> ParseError {
        Kind::Spec {
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

pub(crate) fn build_request(mut g: GpusBuilder) -> Result<Request, ParseError> {
    if g.mig == Some(false) && !g.migs.is_empty() {
        return err(Kind::MigNo);
    }
    let mig = g.mig.unwrap_or(false) || !g.migs.is_empty();
    if mig && !g.devices.is_empty() {
        return err(Kind::MigAndDevices);
    }
    if mig && !g.resources.is_empty() {
        return err(Kind::MigAndResources);
    }
    // `resources:CUSTOM_GPU_<ARCH>_SHARED`: slots of shareable GPUs of that architecture.
    let shared_class = g.resources.first().and_then(|(_, c, _)| {
        c.strip_suffix(extra_specs::SHARED_SUFFIX)
            .map(|b| (c.clone(), b.to_owned()))
    });
    if let (Some(false), Some((class, _))) = (g.share, &shared_class) {
        return err(Kind::ShareNo {
            class: class.clone(),
        });
    }
    let share = g.share.unwrap_or(false) || shared_class.is_some();
    if share && mig {
        return err(Kind::ShareAndMig);
    }
    let n = (g.devices.len() + g.migs.len()) as u32;
    // Placement's resources: one class (one architecture), amounts added up.
    let mut resources: Option<(u32, Resources)> = None;
    if let Some((_, class, _)) = g.resources.first() {
        let class = class.clone();
        if let Some((_, other, _)) = g.resources.iter().find(|(_, c, _)| *c != class) {
            return err(Kind::TwoClasses {
                class,
                other: other.clone(),
            });
        }
        let total: u32 = g.resources.iter().map(|(_, _, a)| *a).sum();
        let keys = Resources(
            g.resources
                .iter()
                .map(|(k, _, a)| (k.clone(), *a))
                .collect(),
        );
        if total > extra_specs::MAX_COUNT {
            return err(Kind::TooManyResources { keys, total });
        }
        g.filters.push(Filter {
            field: Field::Arch,
            op: Op::Class(shared_class.map_or(class, |(_, base)| base)),
        });
        resources = Some((total, keys));
    }
    // Beside Placement's number, `gpus = N` / `>= N` is what Nova makes of it: at least N.
    let spec = match (&g.spec_count, &resources) {
        (Some((s, raw, true)), Some((t, keys))) => {
            if t < s {
                return err(Kind::FewerThanSpec {
                    keys: keys.clone(),
                    total: *t,
                    raw: raw.clone(),
                });
            }
            None
        }
        (Some((s, raw, _)), _) => Some((*s, CountFrom::Spec(raw.clone()))),
        (None, _) => None,
    };
    let mut count: Option<(u32, CountFrom)> = None;
    for (c, what) in [
        g.count_attr.map(|a| (a, CountFrom::Attr(a))),
        spec,
        resources.map(|(t, keys)| (t, CountFrom::Resources(keys))),
    ]
    .into_iter()
    .flatten()
    {
        match &count {
            Some((c0, first)) if *c0 != c => {
                return err(Kind::Contradicts {
                    first: first.clone(),
                    then: what,
                })
            }
            Some(_) => {}
            None => count = Some((c, what)),
        }
    }
    let count = count.map_or(n.max(1), |(c, _)| c);
    if count < n {
        return err(Kind::CountBelowChildren {
            count,
            n,
            what: if mig { "mig" } else { "device" },
        });
    }
    Ok(Request {
        count,
        filters: g.filters,
        devices: g.devices,
        capabilities: g.capabilities.unwrap_or_default(),
        mode: g.mode,
        uid: g.uid.unwrap_or(0),
        gid: g.gid.unwrap_or(0),
        mig,
        migs: g.migs,
        driver: g.driver,
        share,
    })
}
