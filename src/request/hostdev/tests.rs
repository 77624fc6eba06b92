use super::*;
use crate::ids::MdevId;

const U: &str = "9f0c9a5e-2f4b-4c51-8e7a-1d2c3b4a5f60";

/// A QEMU domain as libvirt formats it for its hook, with `devices` inside `<devices>` and
/// `meta` inside `<metadata>`.
fn vm(devices: &str, meta: &str) -> String {
    format!(
        "<domain type='kvm' id='3'>\n  <name>vm1</name>\n  <uuid>{U}</uuid>\n  <metadata>\n    {meta}\n  </metadata>\n  <memory unit='KiB'>1048576</memory>\n  <vcpu placement='static'>2</vcpu>\n  <os>\n    <type arch='x86_64' machine='pc-q35-7.2'>hvm</type>\n  </os>\n  <devices>\n    <emulator>/usr/bin/qemu-system-x86_64</emulator>\n    <disk type='file' device='disk'>\n      <source file='/var/lib/libvirt/images/vm1.qcow2'/>\n      <target dev='vda' bus='virtio'/>\n      <address type='pci' domain='0x0000' bus='0x04' slot='0x00' function='0x0'/>\n    </disk>\n{devices}  </devices>\n</domain>\n"
    )
}

fn pci_hostdev(bus: &str, slot: &str, func: &str, managed: &str) -> String {
    format!(
        "    <hostdev mode='subsystem' type='pci' managed='{managed}'>\n      <driver name='vfio'/>\n      <source>\n        <address domain='0x0000' bus='{bus}' slot='{slot}' function='{func}'/>\n      </source>\n      <alias name='hostdev0'/>\n      <address type='pci' domain='0x0000' bus='0x06' slot='0x00' function='0x0'/>\n    </hostdev>\n"
    )
}

fn mdev_hostdev(uuid: &str) -> String {
    format!("    <hostdev mode='subsystem' type='mdev' managed='no' model='vfio-pci' display='off'>\n      <source>\n        <address uuid='{uuid}'/>\n      </source>\n      <alias name='hostdev1'/>\n    </hostdev>\n")
}

fn addr(d: u32, b: u32, s: u32, f: u32) -> SourceAddr {
    SourceAddr {
        domain: d,
        bus: b,
        slot: s,
        function: f,
    }
}

fn fault(xml: &str) -> String {
    parse_domain(xml.as_bytes()).unwrap_err().to_string()
}

#[test]
fn libvirts_forms() {
    let m = "4b20d080-1b54-4048-85b3-a6a62d165c01";
    let xml = vm(
        &[
            pci_hostdev("0x3b", "0x00", "0x0", "yes"),
            pci_hostdev("0x3b", "0x00", "0x1", "no"),
            mdev_hostdev(&m.to_uppercase()),
        ]
        .concat(),
        "",
    );
    let d = parse_domain(xml.as_bytes()).unwrap();
    assert_eq!((d.name.as_str(), d.uuid.as_str()), ("vm1", U));
    assert!(!d.gpuhook_request);
    assert_eq!(
        d.hostdevs,
        [
            Hostdev::Pci {
                addr: addr(0, 0x3b, 0, 0),
                managed: true
            },
            Hostdev::Pci {
                addr: addr(0, 0x3b, 0, 1),
                managed: false
            },
            Hostdev::Mdev {
                uuid: MdevId::parse(m).unwrap()
            },
        ]
    );
    assert_eq!(addr(0, 0x3b, 0, 1).pci().unwrap(), "0000:3b:00.1");
    assert!(addr(0, 0x3b, 0, 1).same_device("0000:3b:00.0".parse().unwrap()));
    assert!(!addr(0, 0x3b, 1, 0).same_device("0000:3b:00.0".parse().unwrap()));
    assert_eq!(addr(0x10000, 1, 0, 0).pci(), None, "a VMD domain");
    assert!(may_hold(xml.as_bytes()));
}

/// Numbers as libvirt's own reader takes them (C's base 0): hex with `0x`, octal with a
/// leading `0`, else decimal; the domain optional; `type='pci'` on the source address.
#[test]
fn numbers_as_libvirt_reads_them() {
    for (s, v) in [
        ("0x3b", Some(0x3b)),
        ("0X3B", Some(0x3b)),
        ("59", Some(59)),
        ("073", Some(0o73)),
        ("0", Some(0)),
        ("0x0", Some(0)),
        ("08", None),
        ("0x", None),
        ("", None),
        (" 1", None),
        ("+1", None),
        ("-1", None),
        ("1 ", None),
        ("0x1g", None),
        ("99999999999", None),
    ] {
        assert_eq!(libvirt_number(s), v, "{s:?}");
    }
    let xml = vm(
        "    <hostdev mode='subsystem' type='pci'><source><address type='pci' bus='59' slot='0' function='1'/></source></hostdev>\n",
        "",
    );
    let d = parse_domain(xml.as_bytes()).unwrap();
    assert_eq!(
        d.hostdevs,
        [Hostdev::Pci {
            addr: addr(0, 0x3b, 0, 1),
            managed: false
        }]
    );
}

/// Other hostdevs, `<interface type='hostdev'>`, a guest-side `<address>`, and anything
/// named `hostdev` outside `<devices>` are left unread.
#[test]
fn only_pci_and_mdev_hostdevs_in_devices() {
    let devices = "    <hostdev mode='subsystem' type='usb' managed='yes'><source><vendor id='0x046d'/><product id='0xc077'/></source></hostdev>\n    <hostdev mode='capabilities' type='storage'><source><block>/dev/sdf1</block></source></hostdev>\n    <interface type='hostdev' managed='yes'><source><address type='pci' domain='0x0000' bus='0x3b' slot='0x00' function='0x0'/></source></interface>\n    <hostdev mode='subsystem' type='scsi'><source><adapter name='scsi_host0'/><address bus='0' target='0' unit='0'/></source></hostdev>\n";
    let meta = "<x:hostdev xmlns:x='urn:x' type='pci'><source><address bus='0x3b' slot='0' function='0'/></source></x:hostdev>";
    let d = parse_domain(vm(devices, meta).as_bytes()).unwrap();
    assert!(d.hostdevs.is_empty(), "{:?}", d.hostdevs);
    // No hostdev and no gpuhook element: the byte scan lets it go.
    let plain = vm("", "");
    assert!(!may_hold(plain.as_bytes()));
    assert!(parse_domain(plain.as_bytes()).unwrap().hostdevs.is_empty());
}

#[test]
fn gpuhooks_element_is_noticed() {
    let d = parse_domain(
        vm(
            "",
            r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1" count="2"><gpu:device pci="0000:3b:00.0"/></gpu:gpus>"#,
        )
        .as_bytes(),
    )
    .unwrap();
    assert!(d.gpuhook_request);
    assert!(may_hold(
        vm("", r#"<gpu:gpus xmlns:gpu="urn:gpuhook:gpu:1"/>"#).as_bytes()
    ));
}

/// Malformed hostdevs: one line each, naming the hostdev and the fault.
#[test]
fn malformed_hostdevs_are_refused() {
    let one = |inner: &str| {
        fault(&vm(
            &format!("    <hostdev mode='subsystem' type='pci'>{inner}</hostdev>\n"),
            "",
        ))
    };
    assert_eq!(one(""), "<hostdev type='pci'> #1 has no <source>");
    assert_eq!(
        one("<source/>"),
        "<hostdev type='pci'> #1: <source> has no <address>"
    );
    assert_eq!(
        one("<source><address bus='0x3b' slot='0' function='0'/><address bus='0x3c' slot='0' function='0'/></source>"),
        "<hostdev type='pci'> #1: <source> has more than one <address>"
    );
    assert_eq!(
        one("<source><address bus='0x3b' slot='0' function='0'/></source><source/>"),
        "<hostdev type='pci'> #1 has more than one <source>"
    );
    assert_eq!(
        one("<source><address bus='0x3b' function='0'/></source>"),
        "<hostdev type='pci'> #1: its source <address> has no slot"
    );
    assert_eq!(
        one("<source><address bus='0x3b' slot='0' function='8'/></source>"),
        "<hostdev type='pci'> #1: function='8' is out of range (at most 0x7)"
    );
    assert_eq!(
        one("<source><address bus='0x100' slot='0' function='0'/></source>"),
        "<hostdev type='pci'> #1: bus='0x100' is out of range (at most 0xff)"
    );
    assert_eq!(
        one("<source><address bus='0x3b' slot='0x20' function='0'/></source>"),
        "<hostdev type='pci'> #1: slot='0x20' is out of range (at most 0x1f)"
    );
    assert_eq!(
        one("<source><address bus='3b' slot='0' function='0'/></source>"),
        "<hostdev type='pci'> #1: bus='3b' is not a number as libvirt reads it"
    );
    assert_eq!(
        one("<source><address bus='0x3b' slot='0' function='0' multifunction='on'/></source>"),
        "<hostdev type='pci'> #1: unknown attribute 'multifunction' of its source <address>"
    );
    assert_eq!(
        fault(&vm(
            "<hostdev mode='subsystem' type='pci' managed='sure'><source><address bus='1' slot='0' function='0'/></source></hostdev>",
            ""
        )),
        "<hostdev type='pci'> #1: managed='sure' is neither yes nor no"
    );
    let m = |inner: &str| {
        fault(&vm(
            &format!("<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source>{inner}</source></hostdev>"),
            "",
        ))
    };
    assert_eq!(
        m("<address/>"),
        "<hostdev type='mdev'> #1: its source <address> has no uuid"
    );
    assert_eq!(
        m("<address uuid='not-a-uuid'/>"),
        "<hostdev type='mdev'> #1: uuid='not-a-uuid' is not a UUID"
    );
    // A hostile value is quoted on one line, bounded.
    let e = one(&format!(
        "<source><address bus='0x3b&#10;{}' slot='0' function='0'/></source>",
        "x".repeat(200)
    ));
    assert!(!e.contains('\n') && e.chars().count() <= 401, "{e}");
}

/// The same function or mediated device twice is refused; a GPU and its companion
/// function are two hostdevs, not a duplicate.
#[test]
fn duplicates() {
    let m = "4b20d080-1b54-4048-85b3-a6a62d165c01";
    assert_eq!(
        fault(&vm(
            &[
                pci_hostdev("0x3b", "0x00", "0x0", "yes"),
                pci_hostdev("0x3c", "0x00", "0x0", "yes"),
                pci_hostdev("59", "0", "0", "yes"),
            ]
            .concat(),
            ""
        )),
        "hostdev 0000:3b:00.0 is passed through twice (hostdevs #1 and #3)"
    );
    assert_eq!(
        fault(&vm(
            &[mdev_hostdev(m), mdev_hostdev(&m.to_uppercase())].concat(),
            ""
        )),
        format!("mdev {m} is passed through twice (hostdevs #1 and #2)")
    );
}

/// Huge documents, too many hostdevs, entities and DTDs, other roots: refused.
#[test]
fn hostile_documents() {
    let big = vec![b' '; MAX_XML_FOR_TEST + 1];
    assert_eq!(
        parse_domain(&big).unwrap_err().to_string(),
        "domain XML is larger than 16 MiB"
    );
    let many: String = (0..=MAX_HOSTDEVS)
        .map(|i| {
            format!(
                "<hostdev mode='subsystem' type='pci'><source><address bus='{}' slot='{}' function='{}'/></source></hostdev>",
                i / 256,
                (i / 8) % 32,
                i % 8
            )
        })
        .collect();
    assert_eq!(
        fault(&vm(&many, "")),
        "more than 1024 PCI and mdev hostdevs"
    );
    assert_eq!(
        fault("<!DOCTYPE d [<!ENTITY x 'y'>]><domain/>"),
        "document type declarations are not allowed in domain XML"
    );
    assert_eq!(
        fault(&vm("", "<x:a xmlns:x='urn:x'>&x;</x:a>")),
        "unknown entity '&x;' (entities are not allowed)"
    );
    assert_eq!(
        fault("<domstatus/>"),
        "root element is <domstatus>, not <domain>"
    );
    assert_eq!(fault(""), "empty document: no <domain> element");
    assert_eq!(
        fault(&vm("", "").replace(&format!("<uuid>{U}</uuid>"), "")),
        "domain XML has no <uuid>"
    );
    assert!(fault(&vm("<hostdev", "")).starts_with("malformed XML"));
    // Deep nesting is read without recursion; the reader's own bound refuses deeper.
    let deep = |n| format!("{}{}", "<a>".repeat(n), "</a>".repeat(n));
    let d = parse_domain(vm(&deep(10_000), "").as_bytes()).unwrap();
    assert!(d.hostdevs.is_empty());
    assert!(fault(&vm(&deep(100_000), "")).starts_with("malformed XML"));
}

const MAX_XML_FOR_TEST: usize = crate::request::metadata::MAX_XML;

/// libvirt's live status XML: `<domstatus>`'s pid, the domain inside, a PCI hostdev's
/// `<origstates>` in its source.
#[test]
fn status_xml() {
    let inner = vm(
        "    <hostdev mode='subsystem' type='pci' managed='yes'>\n      <driver name='vfio'/>\n      <source>\n        <address domain='0x0000' bus='0x3b' slot='0x00' function='0x0'/>\n        <origstates>\n          <unbind/>\n          <removeslot/>\n          <reprobe/>\n        </origstates>\n      </source>\n      <alias name='hostdev0'/>\n      <address type='pci' domain='0x0000' bus='0x06' slot='0x00' function='0x0'/>\n    </hostdev>\n",
        "",
    );
    let xml = format!("<!--\nWARNING: THIS IS AN AUTO-GENERATED FILE.\n-->\n<domstatus state='running' reason='booted' pid='4242'>\n  <taint flag='high-privileges'/>\n  <monitor path='/var/lib/libvirt/qemu/domain-3-vm1/monitor.sock' type='unix'/>\n  <vcpus>\n    <vcpu id='0' pid='4250'/>\n  </vcpus>\n  <qemuCaps><flag name='hda-duplex'/></qemuCaps>\n  {inner}</domstatus>\n");
    let s = parse_status(xml.as_bytes()).unwrap();
    assert_eq!(s.pid, Some(4242));
    assert_eq!(s.domain.name, "vm1");
    assert_eq!(
        s.domain.hostdevs,
        [Hostdev::Pci {
            addr: addr(0, 0x3b, 0, 0),
            managed: true
        }]
    );
    for (bad, e) in [
        (
            xml.replace("pid='4242'", "pid='x'"),
            "<domstatus pid='x'> is not a process id",
        ),
        (xml.replace(&inner, ""), "status XML has no <domain>"),
        (
            xml.replace(&inner, &format!("{inner}{inner}")),
            "status XML has more than one <domain>",
        ),
        (inner.clone(), "root element is <domain>, not <domstatus>"),
    ] {
        assert_eq!(parse_status(bad.as_bytes()).unwrap_err().to_string(), e);
    }
}
