//! The domain XML parser: never panics; an accepted request is consistent; errors are one line.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match gpuhook::metadata::parse_domain(data) {
        Ok(d) => {
            if let Some(r) = d.request {
                assert!(r.count >= 1 && r.count <= gpuhook::extra_specs::MAX_COUNT);
                assert!(r.count as usize >= r.devices.len());
                assert!(r.mode.map_or(true, |m| m & !0o777 == 0));
                assert!(d.idmap.host_uid(r.uid).is_some() && d.idmap.host_gid(r.gid).is_some());
            }
            assert!(!d.name.is_empty() && d.uuid.len() == 36);
        }
        Err(e) => assert!(!e.0.contains('\n') && !e.0.contains('\r'), "multi-line error {e:?}"),
    }
});
