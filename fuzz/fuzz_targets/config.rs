//! The host config parser: never panics; accepted configs have absolute roots.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(c) = gpuhook::host::config::Config::parse(s, std::path::Path::new("/etc/gpuhook/config.json")) {
        assert!(c.sysfs.is_absolute() && c.proc.is_absolute() && c.dev.is_absolute() && c.state_file.is_absolute());
    }
});
