//! Processes that keep a GPU's node open, for the draining tests (unit and integration):
//! a `sleep` whose descriptor was opened between fork and exec, so that no other test's
//! child inherits it.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};

/// A child process killed (and reaped) when dropped: a holder left behind by a failed test
/// would keep its GPU number open for every later test.
pub struct Killed(pub Child);

impl Killed {
    pub fn id(&self) -> u32 {
        self.0.id()
    }
    /// Kills it and waits for it.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A `sleep 600` that really has `node` open (`O_RDONLY`).
pub fn hold_open(node: &Path) -> Killed {
    hold(node, libc::O_RDONLY)
}

/// A `sleep 600` that holds only an `O_PATH` descriptor on `node`: what any container can
/// make (`mknod` + `open(O_PATH)` need no device-cgroup access), which holds no GPU.
pub fn hold_path(node: &Path) -> Killed {
    hold(node, libc::O_PATH)
}

fn hold(node: &Path, flags: libc::c_int) -> Killed {
    let c = std::ffi::CString::new(node.as_os_str().as_encoded_bytes()).expect("path");
    let mut cmd = Command::new("sleep");
    cmd.arg("600");
    // SAFETY: between fork and exec the closure calls only open(2), async-signal-safe, on a
    // path allocated before the fork; the descriptor stays open (no O_CLOEXEC) for `sleep`.
    unsafe {
        cmd.pre_exec(move || {
            if libc::open(c.as_ptr(), flags) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = Killed(cmd.spawn().expect("sleep"));
    // Until it has exec'd, the child is a copy of the test process, not `sleep`.
    wait_exec(child.id() as i32, "sleep");
    child
}

/// Waits (up to 2 s) until process `pid` runs `comm` (after its exec).
pub fn wait_exec(pid: i32, comm: &str) {
    for _ in 0..400 {
        if std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    panic!("process {pid} never became {comm}");
}
