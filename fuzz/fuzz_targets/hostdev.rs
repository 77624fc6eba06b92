//! A QEMU domain's XML and libvirt's status XML (what a VM's hostdevs are read from): never
//! panics; what is accepted is bounded, has no duplicate, and is seen by the cheap exit;
//! errors are one line.
#![no_main]
use gpuhook::request::hostdev::{self, Hostdev, MAX_HOSTDEVS};
use libfuzzer_sys::fuzz_target;

fn check(data: &[u8], d: &hostdev::QemuDomain) {
    assert!(!d.name.is_empty() && d.uuid.len() == 36);
    assert!(d.hostdevs.len() <= MAX_HOSTDEVS);
    for (i, a) in d.hostdevs.iter().enumerate() {
        assert!(!d.hostdevs[..i].contains(a), "a duplicate was accepted");
        if let Hostdev::Pci { addr, .. } = a {
            assert!(addr.bus <= 0xff && addr.slot <= 0x1f && addr.function <= 7);
        }
    }
    // The hook's cheap exit skips only documents without a hostdev (libvirt writes none
    // with entity references).
    if !d.hostdevs.is_empty() && !data.contains(&b'&') {
        assert!(hostdev::may_hold(data), "cheap exit would skip a hostdev");
    }
}

fn one_line(e: &hostdev::HostdevError) {
    let s = e.to_string();
    assert!(!s.contains('\n') && !s.contains('\r'), "multi-line error {s:?}");
}

fuzz_target!(|data: &[u8]| {
    match hostdev::parse_domain(data) {
        Ok(d) => check(data, &d),
        Err(e) => one_line(&e),
    }
    match hostdev::parse_status(data) {
        Ok(s) => {
            check(data, &s.domain);
            assert!(s.pid.map_or(true, |p| p > 0));
        }
        Err(e) => one_line(&e),
    }
});
