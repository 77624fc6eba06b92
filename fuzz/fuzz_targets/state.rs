//! The state file parser: never panics; what it accepts round-trips unchanged.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(st) = gpuhook::reserve::state::State::parse(data, "/run/gpuhook/state.json") {
        let again = gpuhook::reserve::state::State::parse(&st.to_bytes(), "x").expect("own output parses");
        assert_eq!(again, st);
    }
});
