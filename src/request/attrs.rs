//! A request's attributes, whichever front door they came through (the libvirt domain's
//! `<gpus KEY='…'>`, the OCI annotation `gpuhook.io/KEY`, the env variable `GPUHOOK_KEY`), and
//! the [`Request`] they build: the one grammar both parsers use.

use crate::ids::Vendor;
use crate::request::extra_specs::{self, Op};
use crate::request::metadata::error::{
    err, AttrError, Conflict, CountFrom, ParseError, ParseFault, Resources,
};
use crate::request::{Capabilities, DeviceSel, Field, Filter, MigSel, Request};

#[derive(Default)]
pub(crate) struct GpusBuilder {
    pub(crate) count_attr: Option<u32>,
    /// The `gpus` key: (N, its text, whether Nova reads it as "at least N").
    pub(crate) spec_count: Option<(u32, String, bool)>,
    pub(crate) filters: Vec<Filter>,
    pub(crate) devices: Vec<DeviceSel>,
    pub(crate) capabilities: Option<Capabilities>,
    pub(crate) mode: Option<u32>,
    pub(crate) uid: Option<u32>,
    pub(crate) gid: Option<u32>,
    pub(crate) spec_keys: Vec<String>,
    pub(crate) current_spec: Option<String>,
    pub(crate) text: String,
    /// `resources[N]:CUSTOM_GPU_<ARCH>` keys: (key, class, amount > 0).
    pub(crate) resources: Vec<(String, String, u32)>,
    /// `mig="yes|no"`.
    pub(crate) mig: Option<bool>,
    /// `<mig>` children.
    pub(crate) migs: Vec<MigSel>,
    /// `driver="none|cdi|host"`.
    pub(crate) driver: Option<crate::request::Driver>,
    /// `share="yes|no"`.
    pub(crate) share: Option<bool>,
}

/// A yes/no attribute's value.
fn yes_no(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "yes" | "true" | "1" => Some(true),
        "no" | "false" | "0" => Some(false),
        _ => None,
    }
}

pub(crate) fn parse_u32(what: &'static str, s: &str) -> Result<u32, ParseError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return err(ParseFault::NotWhole {
            what,
            value: s.into(),
        });
    }
    s.parse::<u32>().or_else(|source| {
        err(ParseFault::OutOfRange {
            what,
            value: s.into(),
            source,
        })
    })
}

pub(crate) fn parse_mode(s: &str) -> Result<u32, ParseError> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    if digits.is_empty() || digits.len() > 4 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
    {
        return err(ParseFault::ModeNotOctal { value: s.into() });
    }
    let m = u32::from_str_radix(digits, 8).map_err(|source| ParseFault::BadMode {
        value: s.into(),
        source,
    })?;
    if m & !0o777 != 0 {
        return err(ParseFault::ModeSpecialBits { value: s.into() });
    }
    Ok(m)
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

/// The request the keys make together, or what in them conflicts (each door words it).
pub(crate) fn build_request(mut g: GpusBuilder) -> Result<Request, Conflict> {
    if g.mig == Some(false) && !g.migs.is_empty() {
        return Err(Conflict::MigNo);
    }
    let mig = g.mig.unwrap_or(false) || !g.migs.is_empty();
    if mig && !g.devices.is_empty() {
        return Err(Conflict::MigAndDevices);
    }
    if mig && !g.resources.is_empty() {
        return Err(Conflict::MigAndResources);
    }
    // `resources:CUSTOM_GPU_<ARCH>_SHARED`: slots of shareable GPUs of that architecture.
    let shared_class = g.resources.first().and_then(|(_, c, _)| {
        c.strip_suffix(extra_specs::SHARED_SUFFIX)
            .map(|b| (c.clone(), b.to_owned()))
    });
    if let (Some(false), Some((class, _))) = (g.share, &shared_class) {
        return Err(Conflict::ShareNo {
            class: class.clone(),
        });
    }
    let share = g.share.unwrap_or(false) || shared_class.is_some();
    if share && mig {
        return Err(Conflict::ShareAndMig);
    }
    let n = (g.devices.len() + g.migs.len()) as u32;
    let resources = placement(&mut g, shared_class)?;
    // Beside Placement's number, `gpus = N` / `>= N` is what Nova makes of it: at least N.
    let spec = match (&g.spec_count, &resources) {
        (Some((s, raw, true)), Some((t, keys))) => {
            if t < s {
                return Err(Conflict::FewerThanSpec {
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
                return Err(Conflict::Contradicts {
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
        return Err(Conflict::CountBelowChildren { count, n, mig });
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

/// Placement's resources: one class (one architecture), amounts added up; the class's
/// architecture (without `_SHARED`) becomes a filter. `None`: no resources.
fn placement(
    g: &mut GpusBuilder,
    shared_class: Option<(String, String)>,
) -> Result<Option<(u32, Resources)>, Conflict> {
    let Some((_, class, _)) = g.resources.first() else {
        return Ok(None);
    };
    let class = class.clone();
    if let Some((_, other, _)) = g.resources.iter().find(|(_, c, _)| *c != class) {
        return Err(Conflict::TwoClasses {
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
        return Err(Conflict::TooManyResources { keys, total });
    }
    g.filters.push(Filter {
        field: Field::Arch,
        op: Op::Class(shared_class.map_or(class, |(_, base)| base)),
    });
    Ok(Some((total, keys)))
}
