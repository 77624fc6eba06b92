//! A private containerd with its CRI plugin on, as a Kubernetes node runs it but in a
//! directory of its own: its own root, state, socket and config, the runc v2 shim's runc
//! state under it (option `Root`), pods on the host's network (no CNI), and images imported
//! from tarballs (no registry). Its config is the bed's few settings, the default `runc`
//! handler, and the **shipped** gpuhook handler snippet (`hooks/containerd-config.toml`,
//! installed as `/usr/share/gpuhook/engines/containerd-config.toml`) as it is, but for the
//! `BinaryName` path when the gpuhook under test is not `/usr/bin/gpuhook`.

use super::{Cri, CriError};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The containerd namespace the CRI plugin keeps Kubernetes' containers in.
pub const K8S_NAMESPACE: &str = "k8s.io";
/// The sandbox ("pause") image the bed builds and names in its config.
pub const PAUSE_IMAGE: &str = "docker.io/library/gh-pause:test";
/// The image the bed's containers run.
pub const BUSYBOX_IMAGE: &str = "docker.io/library/gh-busybox:test";
/// The path the shipped snippet names for the wrapper.
pub const SHIPPED_BINARY: &str = "/usr/bin/gpuhook-runtime";
/// The table the shipped snippet ends with (the bed adds the runc root to it).
const OPTIONS_TABLE: &str =
    "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpuhook.options]";

/// What the private containerd is made of.
#[derive(Debug, Clone)]
pub struct Options {
    /// Everything of it lives here (made if missing).
    pub dir: PathBuf,
    /// The gpuhook binary under test (`gpuhook-runtime` is a link to it).
    pub gpuhook: PathBuf,
    /// gpuhook's config, given to containerd (and so to its shims and the runtime) as
    /// `GPUHOOK_CONFIG`.
    pub gpuhook_config: PathBuf,
    /// The shipped containerd snippet.
    pub snippet: PathBuf,
}

/// A running (or stopped, to be started again) private containerd.
pub struct Containerd {
    pub opts: Options,
    /// Its gRPC socket (CRI and containerd's own API).
    pub sock: PathBuf,
    /// The runc v2 shim's runc root (`ROOT/k8s.io/ID/state.json`).
    pub runc_root: PathBuf,
    /// The gpuhook-runtime path the handler's `BinaryName` names.
    pub runtime: PathBuf,
    child: Option<Child>,
    /// Its PID when this process did not start it (`gpuhook-testbed cri down`).
    adopted: Option<i32>,
}

fn io_err(p: &Path, e: std::io::Error) -> String {
    format!("{}: {e}", p.display())
}

/// A TOML basic string.
fn toml_str(s: &Path) -> String {
    format!("{:?}", s.to_string_lossy())
}

impl Containerd {
    /// The config the bed gives containerd: the bed's settings, then the snippet.
    pub fn config_text(o: &Options, runtime: &Path, runc_root: &Path) -> Result<String, String> {
        let snippet = std::fs::read_to_string(&o.snippet).map_err(|e| io_err(&o.snippet, e))?;
        if !snippet.contains(SHIPPED_BINARY) {
            return Err(format!(
                "{}: the snippet names no {SHIPPED_BINARY}",
                o.snippet.display()
            ));
        }
        // The runc root goes into the snippet's own options table, which must be its last.
        let last = snippet
            .lines()
            .rfind(|l| l.trim_start().starts_with('['))
            .map(str::trim);
        if last != Some(OPTIONS_TABLE) {
            return Err(format!(
                "{}: its last table is {last:?}, not {OPTIONS_TABLE}",
                o.snippet.display()
            ));
        }
        let snippet = if runtime == Path::new(SHIPPED_BINARY) {
            snippet
        } else {
            snippet.replace(SHIPPED_BINARY, &runtime.to_string_lossy())
        };
        let d = &o.dir;
        Ok(format!(
            r#"# gpuhook's CRI test bed (testbed/src/cri/containerd.rs): a private containerd.
version = 2

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # The bed's pods need no profile of the host's (Debian 13 enables AppArmor).
  disable_apparmor = true
  restrict_oom_score_adj = {restrict_oom}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {cni_bin}
    conf_dir = {cni_conf}
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = {runc_root}

# ---- {snippet_path}, as shipped{binary_note}
{snippet}
# ---- the bed's runc root, in the snippet's options table
        Root = {runc_root}
"#,
            // Without CAP_SYS_RESOURCE (a sandboxed CI machine) the sandbox's -998 cannot be
            // set: containerd then keeps its containers' at or above its own.
            restrict_oom = !has_cap(CAP_SYS_RESOURCE),
            opt = toml_str(&d.join("opt")),
            cni_bin = toml_str(&d.join("cni/bin")),
            cni_conf = toml_str(&d.join("cni/net.d")),
            runc_root = toml_str(runc_root),
            snippet_path = o.snippet.display(),
            binary_note = if runtime == Path::new(SHIPPED_BINARY) {
                String::new()
            } else {
                format!(" but for BinaryName: {}", runtime.display())
            },
            snippet = snippet.trim_end(),
        ))
    }

    /// Writes the config, starts containerd and waits for its CRI service; imports nothing.
    pub fn start(o: &Options) -> Result<Containerd, String> {
        let d = &o.dir;
        for sub in ["bin", "cni/bin", "cni/net.d", "opt", "runc", "pods"] {
            std::fs::create_dir_all(d.join(sub)).map_err(|e| io_err(&d.join(sub), e))?;
        }
        // The shipped path when the binary under test is the installed one, else a link of
        // that name (gpuhook knows itself as the wrapper by its name) in the bed.
        let shipped = Path::new(SHIPPED_BINARY);
        let runtime =
            if std::fs::canonicalize(shipped).ok() == std::fs::canonicalize(&o.gpuhook).ok() {
                shipped.to_path_buf()
            } else {
                let link = d.join("bin/gpuhook-runtime");
                let _ = std::fs::remove_file(&link);
                std::os::unix::fs::symlink(&o.gpuhook, &link).map_err(|e| io_err(&link, e))?;
                link
            };
        let runc_root = d.join("runc");
        let text = Self::config_text(o, &runtime, &runc_root)?;
        std::fs::write(d.join("config.toml"), text)
            .map_err(|e| io_err(&d.join("config.toml"), e))?;
        let mut c = Containerd {
            opts: o.clone(),
            sock: d.join("containerd.sock"),
            runc_root,
            runtime,
            child: None,
            adopted: None,
        };
        c.up()?;
        Ok(c)
    }

    /// The containerd process, started with the bed's config.
    fn up(&mut self) -> Result<(), String> {
        let d = &self.opts.dir;
        let log_path = d.join("containerd.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| io_err(&log_path, e))?;
        let err = log.try_clone().map_err(|e| io_err(&log_path, e))?;
        let child = Command::new("containerd")
            .arg("--config")
            .arg(d.join("config.toml"))
            .arg("--root")
            .arg(d.join("root"))
            .arg("--state")
            .arg(d.join("state"))
            .arg("--address")
            .arg(&self.sock)
            .env("GPUHOOK_CONFIG", &self.opts.gpuhook_config)
            .env_remove("GPUHOOK_VERBOSE")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            // Its own process group: a terminal's ^C to a CLI that started it stops neither it
            // nor its shims.
            .process_group(0)
            .spawn()
            .map_err(|e| format!("containerd (Debian package containerd): {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(format!("containerd exited ({st}): {}", self.log_tail()));
            }
            let last = match Cri::connect(&self.sock).and_then(|mut c| c.version()) {
                Ok(_) => return Ok(()),
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                return Err(format!(
                    "containerd's CRI service did not answer in 60 s ({last}): {}",
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The last lines of containerd's log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.opts.dir.join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Whether containerd runs.
    pub fn running(&mut self) -> bool {
        if let Some(p) = self.adopted {
            return alive(p);
        }
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Its PID while it runs.
    pub fn pid(&self) -> Option<i32> {
        self.adopted.or(self.child.as_ref().map(|c| c.id() as i32))
    }

    /// The containerd a bed left running (`gpuhook-testbed cri up`), to tear it down.
    pub fn adopt(opts: &Options, pid: i32) -> Containerd {
        Containerd {
            opts: opts.clone(),
            sock: opts.dir.join("containerd.sock"),
            runc_root: opts.dir.join("runc"),
            runtime: opts.dir.join("bin/gpuhook-runtime"),
            child: None,
            adopted: Some(pid).filter(|p| {
                alive(*p)
                    && cmdline(*p)
                        .first()
                        .is_some_and(|a| a.ends_with("containerd"))
            }),
        }
    }

    /// Leaves containerd running when this handle goes (`gpuhook-testbed cri up`).
    pub fn detach(&mut self) {
        self.child = None;
    }

    /// A new CRI connection.
    pub fn cri(&self) -> Result<Cri, CriError> {
        Cri::connect(&self.sock)
    }

    /// Stops containerd with `sig` (SIGTERM: as systemd stops it; SIGKILL: a crash) and waits
    /// for it; its shims and containers go on.
    pub fn stop(&mut self, sig: nix::sys::signal::Signal) -> Result<(), String> {
        if let Some(pid) = self.adopted.take() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
            let deadline = Instant::now() + Duration::from_secs(20);
            while alive(pid) {
                if Instant::now() > deadline {
                    return Err(format!("containerd (pid {pid}) did not stop in 20 s"));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            return Ok(());
        }
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, sig);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err("containerd did not stop in 20 s (killed)".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts containerd again, with the same config, root and state.
    pub fn restart(&mut self) -> Result<(), String> {
        if self.running() {
            return Ok(());
        }
        self.up()
    }

    /// `ctr --address SOCK --namespace k8s.io ARGS…`.
    pub fn ctr(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ctr");
        c.arg("--address")
            .arg(&self.sock)
            .args(["--namespace", K8S_NAMESPACE])
            .args(args);
        c
    }

    /// Imports an image tarball into the CRI plugin's namespace.
    pub fn import(&self, tarball: &Path) -> Result<(), String> {
        let o = self
            .ctr(&["images", "import", &tarball.to_string_lossy()])
            .output()
            .map_err(|e| format!("ctr: {e}"))?;
        if !o.status.success() {
            return Err(format!(
                "ctr images import {}: {}",
                tarball.display(),
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(())
    }

    /// The bundle's `config.json` the shim handed the runtime for a container or sandbox.
    pub fn bundle_config(&self, id: &str) -> PathBuf {
        self.opts
            .dir
            .join("state/io.containerd.runtime.v2.task")
            .join(K8S_NAMESPACE)
            .join(id)
            .join("config.json")
    }

    /// The runc state root of the CRI plugin's containers (what `oci_state_roots` must hold).
    pub fn state_root(&self) -> PathBuf {
        self.runc_root.join(K8S_NAMESPACE)
    }

    /// The init PID runc's state names for a container or sandbox.
    pub fn init_pid(&self, id: &str) -> Option<i32> {
        let p = self.state_root().join(id).join("state.json");
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(p).ok()?).ok()?;
        v["init_process_pid"].as_i64().map(|p| p as i32)
    }

    /// Removes every pod (stopping its containers), stops containerd, kills what is left of
    /// its shims, unmounts what is left under its directory. Errors are said, not fatal.
    pub fn teardown(&mut self) -> Vec<String> {
        let mut notes = Vec::new();
        if !self.running() {
            if let Err(e) = self.up() {
                notes.push(format!("restart for teardown: {e}"));
            }
        }
        if self.running() {
            match self.cri() {
                Ok(mut cri) => {
                    for p in cri.list_pod_sandbox().unwrap_or_default() {
                        let _ = cri.stop_pod_sandbox(&p.id);
                        if let Err(e) = cri.remove_pod_sandbox(&p.id) {
                            notes.push(format!("RemovePodSandbox {}: {e}", p.id));
                        }
                    }
                }
                Err(e) => notes.push(e.to_string()),
            }
        }
        if let Err(e) = self.stop(nix::sys::signal::Signal::SIGTERM) {
            notes.push(e);
        }
        for pid in shims_of(&self.sock) {
            notes.push(format!("killed a shim left running (pid {pid})"));
            for kid in children(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(kid),
                    nix::sys::signal::SIGKILL,
                );
            }
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
        }
        unmount_under(&self.opts.dir);
        notes
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.stop(nix::sys::signal::Signal::SIGTERM);
        }
    }
}

const CAP_SYS_RESOURCE: u32 = 24;

/// Whether this process has a capability in its effective set.
fn has_cap(bit: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << bit) != 0)
}

/// A process's command line, its arguments.
fn cmdline(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a process runs (not a zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim_start().to_string()))
        .is_some_and(|r| !r.starts_with('Z') && !r.starts_with('X'))
}

fn pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A process's parent.
pub fn ppid(pid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn children(pid: i32) -> Vec<i32> {
    pids()
        .into_iter()
        .filter(|p| ppid(*p) == Some(pid))
        .collect()
}

/// The runc v2 shims of the containerd at `sock` (started with `-address SOCK`).
pub fn shims_of(sock: &Path) -> Vec<i32> {
    let sock = sock.to_string_lossy();
    pids()
        .into_iter()
        .filter(|p| {
            let a = cmdline(*p);
            a.first().is_some_and(|x| x.contains("containerd-shim"))
                && a.windows(2).any(|w| w[0] == "-address" && w[1] == sock)
        })
        .collect()
}

/// Lazily unmounts every mount at or under `dir`, deepest first.
pub fn unmount_under(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(dir: &Path, snippet: &str) -> Options {
        std::fs::create_dir_all(dir).unwrap();
        let s = dir.join("snippet.toml");
        std::fs::write(&s, snippet).unwrap();
        Options {
            dir: dir.to_path_buf(),
            gpuhook: "/x/gpuhook".into(),
            gpuhook_config: "/x/config.json".into(),
            snippet: s,
        }
    }

    /// The shipped snippet goes in as it is but for the binary's path; the runc root lands in
    /// its options table.
    #[test]
    fn the_shipped_snippet_goes_in_as_it_is() {
        let shipped = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../hooks/containerd-config.toml"),
        )
        .unwrap();
        let t = std::env::temp_dir().join(format!("gh-cri-unit-{}", std::process::id()));
        let o = opts(&t, &shipped);
        let text = Containerd::config_text(
            &o,
            Path::new("/bed/bin/gpuhook-runtime"),
            Path::new("/bed/runc"),
        )
        .unwrap();
        assert!(text.contains(
            &shipped
                .trim_end()
                .replace(SHIPPED_BINARY, "/bed/bin/gpuhook-runtime")
        ));
        assert!(text.ends_with(&format!("{OPTIONS_TABLE}\n    BinaryName = \"/bed/bin/gpuhook-runtime\"\n# ---- the bed's runc root, in the snippet's options table\n        Root = \"/bed/runc\"\n")), "{text}");
        let same =
            Containerd::config_text(&o, Path::new(SHIPPED_BINARY), Path::new("/bed/runc")).unwrap();
        assert!(same.contains(shipped.trim_end()));
        // A snippet that does not end with the options table is refused, not patched.
        let o = opts(&t, &format!("{shipped}[plugins.\"x\"]\n"));
        let e = Containerd::config_text(&o, Path::new("/b"), Path::new("/r")).unwrap_err();
        assert!(e.contains("its last table is"), "{e}");
        let o = opts(&t, "[plugins]\n");
        assert!(Containerd::config_text(&o, Path::new("/b"), Path::new("/r")).is_err());
        let _ = std::fs::remove_dir_all(&t);
    }
}
