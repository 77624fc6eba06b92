//! The QEMU domain XML's reader: one pass of events over a stack of contexts, reading only
//! the name, the UUID, gpuhook's element in `<metadata>` and the PCI and mdev hostdevs.

use super::error::{HostdevError, HostdevFault};
use super::model::{libvirt_number, Hostdev, QemuDomain, SourceAddr, MAX_HOSTDEVS};
use crate::ids::{normalize_uuid, MdevId};
use crate::request::metadata::{MAX_XML, NS};
use quick_xml::escape::resolve_predefined_entity;
use quick_xml::events::{BytesRef, BytesStart, Event};
use quick_xml::name::{Namespace, ResolveResult};
use quick_xml::reader::NsReader;
use quick_xml::XmlVersion;

/// Which document is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Root {
    /// A domain XML, `<domain>` at its root.
    Domain,
    /// libvirt's status XML, `<domstatus>` wrapping one `<domain>`.
    Status,
}

/// A hostdev's kind, as far as gpuhook reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pci,
    Mdev,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::Pci => "pci",
            Kind::Mdev => "mdev",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QemuCtx {
    Status,
    Domain,
    Name,
    Uuid,
    Metadata,
    Devices,
    /// A PCI or mdev hostdev (its number, 1-based among those).
    Hostdev(Kind, usize),
    Source(Kind, usize),
    /// Anything else: skipped with its subtree.
    Other,
}

/// A hostdev being read.
struct Open {
    kind: Kind,
    n: usize,
    managed: bool,
    sources: usize,
    addresses: usize,
    found: Option<Hostdev>,
}

#[derive(Default)]
struct QemuParser {
    stack: Vec<QemuCtx>,
    saw_root: bool,
    domains: usize,
    pid: Option<i32>,
    name: Option<String>,
    uuid: Option<String>,
    text: String,
    hostdevs: Vec<(usize, Hostdev)>,
    open: Option<Open>,
    count: usize,
    gpuhook_request: bool,
}

/// Parses the document: `(pid of <domstatus>, the domain)`.
pub(super) fn parse(xml: &[u8], root: Root) -> Result<(Option<i32>, QemuDomain), HostdevError> {
    if xml.len() > MAX_XML {
        return Err(HostdevFault::TooLarge.into());
    }
    let text = std::str::from_utf8(xml).map_err(HostdevFault::NotUtf8)?;
    let mut p = QemuParser::default();
    let mut reader = NsReader::from_str(text);
    reader.config_mut().check_end_names = true;
    loop {
        let (ns, ev) = reader.read_resolved_event().map_err(HostdevFault::Xml)?;
        let ours = matches!(ns, ResolveResult::Bound(Namespace(n)) if n == NS);
        let plain = matches!(ns, ResolveResult::Unbound);
        match ev {
            Event::Start(e) => {
                let c = p.open(&e, root, plain, ours)?;
                p.stack.push(c);
            }
            Event::Empty(e) => {
                let c = p.open(&e, root, plain, ours)?;
                p.stack.push(c);
                p.close()?;
            }
            Event::End(_) => p.close()?,
            Event::Text(t) => p.text_in(&t.xml10_content())?,
            Event::CData(c) => {
                let s: &str = &c;
                p.text_in(s)?
            }
            Event::GeneralRef(r) => p.text_in(&general_ref(&r)?)?,
            Event::DocType(_) => return Err(HostdevFault::DocType.into()),
            Event::Decl(_) | Event::PI(_) | Event::Comment(_) => {}
            Event::Eof => break,
        }
    }
    p.finish(root)
}

fn attr_value(a: &quick_xml::events::attributes::Attribute) -> Result<String, HostdevError> {
    let v = a
        .normalized_value(XmlVersion::Implicit1_0)
        .map_err(HostdevFault::AttrValue)?;
    if v.len() > 256 {
        return Err(HostdevFault::AttrTooLong {
            key: a.key.as_ref().into(),
        }
        .into());
    }
    Ok(v.into_owned())
}

/// An unprefixed attribute's value, if there is one.
fn attr(e: &BytesStart, name: &str) -> Result<Option<String>, HostdevError> {
    for a in e.attributes() {
        let a = a.map_err(HostdevFault::XmlAttr)?;
        if a.key.as_ref() == name {
            return attr_value(&a).map(Some);
        }
    }
    Ok(None)
}

impl QemuParser {
    fn top(&self) -> Option<QemuCtx> {
        self.stack.last().copied()
    }

    fn open(
        &mut self,
        e: &BytesStart,
        root: Root,
        plain: bool,
        ours: bool,
    ) -> Result<QemuCtx, HostdevError> {
        let local = e.local_name();
        let local: &str = local.as_ref();
        Ok(match self.top() {
            None => self.open_root(e, root, plain, local)?,
            Some(QemuCtx::Status) if plain && local == "domain" => {
                self.domains += 1;
                if self.domains > 1 {
                    return Err(HostdevFault::MoreThanOneDomain.into());
                }
                QemuCtx::Domain
            }
            Some(QemuCtx::Domain) if plain => match local {
                "name" | "uuid" => {
                    self.text.clear();
                    if local == "name" {
                        QemuCtx::Name
                    } else {
                        QemuCtx::Uuid
                    }
                }
                "metadata" => QemuCtx::Metadata,
                "devices" => QemuCtx::Devices,
                _ => QemuCtx::Other,
            },
            Some(QemuCtx::Metadata) if ours && local == "gpus" => {
                self.gpuhook_request = true;
                QemuCtx::Other
            }
            Some(QemuCtx::Devices) if plain && local == "hostdev" => self.open_hostdev(e)?,
            Some(QemuCtx::Hostdev(kind, n)) if plain && local == "source" => {
                let o = self.open.as_mut().expect("inside a hostdev");
                o.sources += 1;
                if o.sources > 1 {
                    return Err(HostdevFault::TwoSources {
                        kind: kind.word(),
                        n,
                    }
                    .into());
                }
                QemuCtx::Source(kind, n)
            }
            Some(QemuCtx::Source(kind, n)) if plain && local == "address" => {
                let o = self.open.as_mut().expect("inside a hostdev");
                o.addresses += 1;
                if o.addresses > 1 {
                    return Err(HostdevFault::TwoAddresses {
                        kind: kind.word(),
                        n,
                    }
                    .into());
                }
                o.found = Some(match kind {
                    Kind::Pci => Hostdev::Pci {
                        addr: pci_address(e, n)?,
                        managed: o.managed,
                    },
                    Kind::Mdev => Hostdev::Mdev {
                        uuid: mdev_address(e, n)?,
                    },
                });
                QemuCtx::Other
            }
            _ => QemuCtx::Other,
        })
    }

    fn open_root(
        &mut self,
        e: &BytesStart,
        root: Root,
        plain: bool,
        local: &str,
    ) -> Result<QemuCtx, HostdevError> {
        if self.saw_root {
            return Err(HostdevFault::MoreThanOneRoot.into());
        }
        self.saw_root = true;
        let expected = match root {
            Root::Domain => "domain",
            Root::Status => "domstatus",
        };
        if !(plain && local == expected) {
            return Err(HostdevFault::Root {
                name: e.name().as_ref().into(),
                expected,
            }
            .into());
        }
        if root == Root::Domain {
            self.domains = 1;
            return Ok(QemuCtx::Domain);
        }
        if let Some(v) = attr(e, "pid")? {
            match v.parse::<i32>() {
                Ok(pid) if pid > 0 => self.pid = Some(pid),
                _ => return Err(HostdevFault::StatusPid { value: v }.into()),
            }
        }
        Ok(QemuCtx::Status)
    }

    /// A `<hostdev>` in `<devices>`: a PCI or mdev one of mode `subsystem` (the default) is
    /// read; any other is skipped.
    fn open_hostdev(&mut self, e: &BytesStart) -> Result<QemuCtx, HostdevError> {
        let mode = attr(e, "mode")?;
        let kind = match attr(e, "type")?.as_deref() {
            Some("pci") => Kind::Pci,
            Some("mdev") => Kind::Mdev,
            _ => return Ok(QemuCtx::Other),
        };
        if mode.as_deref().is_some_and(|m| m != "subsystem") {
            return Ok(QemuCtx::Other);
        }
        self.count += 1;
        if self.count > MAX_HOSTDEVS {
            return Err(HostdevFault::TooMany.into());
        }
        let n = self.count;
        let managed = match (kind, attr(e, "managed")?.as_deref()) {
            (Kind::Pci, Some("yes")) => true,
            (Kind::Pci, Some("no") | None) | (Kind::Mdev, _) => false,
            (Kind::Pci, Some(other)) => {
                return Err(HostdevFault::BadManaged {
                    n,
                    value: other.into(),
                }
                .into())
            }
        };
        self.open = Some(Open {
            kind,
            n,
            managed,
            sources: 0,
            addresses: 0,
            found: None,
        });
        Ok(QemuCtx::Hostdev(kind, n))
    }

    fn text_in(&mut self, s: &str) -> Result<(), HostdevError> {
        if matches!(self.top(), Some(QemuCtx::Name) | Some(QemuCtx::Uuid)) {
            if self.text.len() + s.len() > 1024 {
                return Err(HostdevFault::NameTooLong.into());
            }
            self.text.push_str(s);
        }
        Ok(())
    }

    fn close(&mut self) -> Result<(), HostdevError> {
        let ctx = self.stack.pop().ok_or(HostdevFault::UnexpectedEnd)?;
        match ctx {
            // Only the domain's own name and UUID (the first of each).
            QemuCtx::Name if self.name.is_none() => {
                let n = self.text.trim().to_owned();
                if n.is_empty() {
                    return Err(HostdevFault::EmptyName.into());
                }
                self.name = Some(n);
            }
            QemuCtx::Uuid if self.uuid.is_none() => {
                let u = normalize_uuid(&self.text).ok_or_else(|| HostdevFault::BadUuid {
                    value: self.text.trim().chars().take(64).collect(),
                })?;
                self.uuid = Some(u);
            }
            QemuCtx::Hostdev(kind, n) => {
                let o = self.open.take().expect("inside a hostdev");
                let found = match (o.sources, o.found) {
                    (0, _) => {
                        return Err(HostdevFault::NoSource {
                            kind: kind.word(),
                            n,
                        }
                        .into())
                    }
                    (_, None) => {
                        return Err(HostdevFault::NoAddress {
                            kind: kind.word(),
                            n,
                        }
                        .into())
                    }
                    (_, Some(h)) => h,
                };
                debug_assert_eq!((o.kind, o.n), (kind, n));
                if let Some((first, _)) = self.hostdevs.iter().find(|(_, h)| same(h, &found)) {
                    return Err(HostdevFault::Twice {
                        what: found.to_string(),
                        first: *first,
                        n,
                    }
                    .into());
                }
                self.hostdevs.push((n, found));
            }
            _ => {}
        }
        Ok(())
    }

    fn finish(mut self, root: Root) -> Result<(Option<i32>, QemuDomain), HostdevError> {
        if !self.saw_root {
            return Err(HostdevFault::EmptyDocument {
                expected: match root {
                    Root::Domain => "domain",
                    Root::Status => "domstatus",
                },
            }
            .into());
        }
        if !self.stack.is_empty() {
            return Err(HostdevFault::UnexpectedEnd.into());
        }
        if self.domains == 0 {
            return Err(HostdevFault::NoDomain.into());
        }
        let name = self.name.take().ok_or(HostdevFault::NoName)?;
        let uuid = self.uuid.take().ok_or(HostdevFault::NoUuid)?;
        Ok((
            self.pid,
            QemuDomain {
                name,
                uuid,
                hostdevs: self.hostdevs.into_iter().map(|(_, h)| h).collect(),
                gpuhook_request: self.gpuhook_request,
            },
        ))
    }
}

/// Two hostdevs that pass the same thing through: the same PCI function, or the same
/// mediated device.
fn same(a: &Hostdev, b: &Hostdev) -> bool {
    match (a, b) {
        (Hostdev::Pci { addr: x, .. }, Hostdev::Pci { addr: y, .. }) => x == y,
        (Hostdev::Mdev { uuid: x }, Hostdev::Mdev { uuid: y }) => x == y,
        _ => false,
    }
}

/// A PCI hostdev's source `<address domain=… bus=… slot=… function=…/>` (libvirt writes
/// `type='pci'` on some; nothing else is one of its attributes).
fn pci_address(e: &BytesStart, n: usize) -> Result<SourceAddr, HostdevError> {
    let mut v: [Option<u32>; 4] = [None; 4];
    const NAMES: [(&str, u32); 4] = [
        ("domain", 0xffff_ffff),
        ("bus", 0xff),
        ("slot", 0x1f),
        ("function", 7),
    ];
    for a in e.attributes() {
        let a = a.map_err(HostdevFault::XmlAttr)?;
        let key: &str = a.key.as_ref();
        let value = attr_value(&a)?;
        if key == "type" && value == "pci" {
            continue;
        }
        let Some(i) = NAMES.iter().position(|(k, _)| *k == key) else {
            return Err(HostdevFault::UnknownAttr {
                kind: "pci",
                n,
                attr: key.into(),
            }
            .into());
        };
        let (attr, max) = NAMES[i];
        let x = libvirt_number(&value).ok_or_else(|| HostdevFault::BadNumber {
            n,
            attr,
            value: value.clone(),
        })?;
        if x > max {
            return Err(HostdevFault::OutOfRange {
                n,
                attr,
                value,
                max,
            }
            .into());
        }
        v[i] = Some(x);
    }
    let need = |i: usize| {
        v[i].ok_or(HostdevFault::MissingAttr {
            n,
            attr: NAMES[i].0,
        })
    };
    Ok(SourceAddr {
        domain: v[0].unwrap_or(0),
        bus: need(1)?,
        slot: need(2)?,
        function: need(3)?,
    })
}

/// An mdev hostdev's source `<address uuid='…'/>`.
fn mdev_address(e: &BytesStart, n: usize) -> Result<MdevId, HostdevError> {
    let mut uuid = None;
    for a in e.attributes() {
        let a = a.map_err(HostdevFault::XmlAttr)?;
        let key: &str = a.key.as_ref();
        if key != "uuid" {
            return Err(HostdevFault::UnknownAttr {
                kind: "mdev",
                n,
                attr: key.into(),
            }
            .into());
        }
        let value = attr_value(&a)?;
        uuid = Some(MdevId::parse(&value).ok_or(HostdevFault::BadMdevUuid { n, value })?);
    }
    uuid.ok_or_else(|| HostdevFault::NoMdevUuid { n }.into())
}

/// The text of a character or predefined entity reference; other entities are refused.
fn general_ref(r: &BytesRef) -> Result<String, HostdevError> {
    if r.is_char_ref() {
        match r.resolve_char_ref() {
            Ok(Some(c)) => Ok(c.to_string()),
            _ => Err(HostdevFault::BadCharRef { name: (**r).into() }.into()),
        }
    } else {
        match resolve_predefined_entity(r) {
            Some(s) => Ok(s.to_owned()),
            None => Err(HostdevFault::UnknownEntity { name: (**r).into() }.into()),
        }
    }
}
