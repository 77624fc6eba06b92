//! The CDI spec parser (JSON and YAML through `serde_yaml_ng`/`unsafe-libyaml`): never
//! panics; an accepted spec has a known version and a VENDOR/CLASS kind.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for json in [true, false] {
        if let Ok(s) = gpuhook::cdi::parse_checked(data, json) {
            assert!(s.kind.contains('/'));
            assert!(s.cdi_version.starts_with(['0', '1']));
        }
    }
});
