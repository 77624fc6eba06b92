//! Nova's extra_specs operators: never panic; counts stay in range; a parsed string operator
//! can be evaluated on any value.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(n) = gpuhook::request::extra_specs::parse_count(s) {
        assert!((1..=gpuhook::request::extra_specs::MAX_COUNT).contains(&n));
    }
    if let Ok(op) = gpuhook::request::extra_specs::parse_string_op(s) {
        let _ = op.matches(Some(s));
        let _ = op.matches(None);
        let _ = op.to_string();
    }
});
