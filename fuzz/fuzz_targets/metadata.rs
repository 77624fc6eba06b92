//! The domain XML parser: never panics; an accepted request is consistent and seen by the
//! cheap exit; errors are one line.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match gpuhook::request::metadata::parse_domain(data) {
        Ok(d) => {
            // The hook's cheap exit skips only documents without a request (those without
            // entity references, as libvirt writes them).
            if d.request.is_some() && !data.contains(&b'&') {
                assert!(gpuhook::request::metadata::may_request(data), "cheap exit would skip a request");
            }
            if let Some(r) = d.request {
                assert!(r.count >= 1 && r.count <= gpuhook::request::extra_specs::MAX_COUNT);
                assert!(r.count as usize >= r.devices.len());
                assert!(r.mode.map_or(true, |m| m & !0o777 == 0));
                assert!(d.idmap.host_uid(r.uid).is_some() && d.idmap.host_gid(r.gid).is_some());
            }
            assert!(!d.name.is_empty() && d.uuid.len() == 36);
        }
        Err(e) => assert!(!e.to_string().contains('\n') && !e.to_string().contains('\r'), "multi-line error {e:?}"),
    }
});
