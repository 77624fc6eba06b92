//! The `gpuhook` binary: a libvirt LXC hook when started as `hooks/lxc` or from
//! `hooks/lxc.d/`, libvirt's QEMU hook as `hooks/qemu` or from `hooks/qemu.d/`, the OCI
//! runtime wrapper as `gpuhook-runtime`, the operator's CLI otherwise.
//!
//! libvirt runs the hook for every LXC domain, three times per start and twice per stop,
//! while it holds the domain lock: the binary defines C's `main` itself, skipping Rust's
//! runtime start-up (stack-guard probing of `/proc/self/maps`, signal stacks, the standard
//! descriptor check), which costs a measurable share of a short-lived process. Arguments
//! still come through `std::env::args_os` (glibc hands them to Rust at load time).
#![no_main]

#[no_mangle]
pub extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.is_empty() {
        args.push("gpuhook".into());
    }
    let code = if gpuhook::doors::runtime::invoked_as_runtime(&args[0]) {
        // The OCI runtime wrapper: runc's command line, no clap (it runs for every container).
        gpuhook::doors::runtime::main(&args[1..])
    } else if gpuhook::doors::hook::invoked_as_hook(&args[0]) {
        // Hook mode: `NAME OP SUBOP EXTRA`, no clap on this path (it runs for every domain).
        let (name, op) = hook_args(&args);
        match gpuhook::doors::hook::read_stdin() {
            Ok(xml) => gpuhook::doors::hook::run(&name, &op, &xml),
            Err(e) => {
                gpuhook::log::error(&format!(
                    "domain '{name}': reading the domain XML from stdin: {e}"
                ));
                i32::from(matches!(op.as_str(), "prepare" | "start" | "started"))
            }
        }
    } else if gpuhook::doors::qemu_hook::invoked_as_qemu_hook(&args[0]) {
        // libvirt's QEMU hook: the same, for every VM.
        let (name, op) = hook_args(&args);
        gpuhook::doors::qemu_hook::main(&name, &op)
    } else {
        gpuhook::doors::cli::main(args)
    };
    code.clamp(0, 255)
}

/// A hook's `NAME` and `OP`.
fn hook_args(args: &[std::ffi::OsString]) -> (String, String) {
    let at = |i: usize| {
        args.get(i)
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    (at(1), at(2))
}
