//! The `gpuhook` binary: a libvirt LXC hook when started as `hooks/lxc` or from
//! `hooks/lxc.d/`, the operator's CLI otherwise.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.is_empty() {
        args.push("gpuhook".into());
    }
    let code = if gpuhook::hook::invoked_as_hook(&args[0]) {
        // Hook mode: `NAME OP SUBOP EXTRA`, no clap on this path (it runs for every domain).
        let name = args
            .get(1)
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let op = args
            .get(2)
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        match gpuhook::hook::read_stdin() {
            Ok(xml) => gpuhook::hook::run(&name, &op, &xml),
            Err(e) => {
                gpuhook::log::error(&format!(
                    "domain '{name}': reading the domain XML from stdin: {e}"
                ));
                u8::from(matches!(op.as_str(), "prepare" | "start" | "started")) as i32
            }
        }
    } else {
        gpuhook::cli::main(args)
    };
    ExitCode::from(code.clamp(0, 255) as u8)
}
