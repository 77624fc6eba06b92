//! The host's linker cache reader: never panics; what it accepts is within its bounds (each
//! string at most PATH_MAX, borrowed from the input, no more entries and string bytes than
//! allowed) and reads the same again.
#![no_main]
use gpuhook::host::driver::ldcache;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((format, entries)) = ldcache::parse(data) {
        assert!(entries.len() <= ldcache::MAX_ENTRIES as usize);
        let within = data.as_ptr_range();
        let mut named = 0;
        for e in &entries {
            for s in [e.soname, e.path] {
                assert!(s.len() <= ldcache::MAX_STRING);
                assert!(within.contains(&s.as_ptr()) || s.is_empty());
                named += s.len() + 1;
            }
        }
        assert!(named <= ldcache::string_budget(data.len()));
        assert_eq!(ldcache::parse(data), Ok((format, entries)));
    }
});
