//! A real libvirtd for tests and demos, isolated from the host's.
//!
//! It runs in a private mount namespace where its own directories are bind-mounted over
//! `/run/libvirt` (sockets, LXC and QEMU state), `/etc/libvirt` (LXC and QEMU domain
//! definitions, `qemu.conf`, and, unless the installed hook is tested, `hooks/lxc` and
//! `hooks/qemu`), `/var/lib/libvirt`, `/var/cache/libvirt`, `/var/log/libvirt` (the QEMU
//! driver's per-domain files, capabilities cache and logs) and `/etc/gpuhook` (the hook's
//! config). The host's libvirtd, domains and gpuhook config are untouched; clients reach this
//! daemon through `lxc:///system?socket=…` and `qemu:///system?socket=…`.
//!
//! The QEMU driver runs QEMU as root, without a mount namespace of its own, without
//! virtlogd (QEMU's output goes to `/var/log/libvirt/qemu/NAME.log`) and without a security
//! driver: a VM here needs no more than an emulator (see [`crate::vm`]).
//!
//! A bind mount in the daemon's namespace stands on the host's directory it covers: when
//! something on the host removes that directory (a package's purge runs `rm -rf
//! /etc/gpuhook`), the kernel detaches the mount from the daemon's namespace, and the
//! daemon's hook then reads the host's `/etc/gpuhook` (none: gpuhook's built-in defaults, the
//! host's state file), not the test bed's. [`Daemon::check_mounts`] says so, by name, and
//! [`Daemon::start`] makes the mount points again.
//!
//! On a hybrid cgroup host the unified mount is hidden from the daemon (libvirt_lxc fails
//! with `Unable to create directory /sys/fs/cgroup/unified` otherwise), giving it a pure
//! cgroup-v1 host, the layout libvirt 9.0's LXC driver runs on here.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const LIBVIRTD: &str = "/usr/sbin/libvirtd";

/// The QEMU driver's settings in the test bed: QEMU as root (the bed's directories and the
/// unpacked emulator need no ownership games), no private `/dev` for it, its output to a file
/// (no virtlogd), no security driver (no AppArmor or SELinux profiles here).
const QEMU_CONF: &str = r#"# Written by the test bed (testbed/src/libvirtd.rs).
user = "root"
group = "root"
namespaces = [ ]
stdio_handler = "file"
security_driver = "none"
"#;

#[derive(Debug, Clone)]
pub enum Hook {
    /// Install this binary as the daemon's `hooks/lxc` and `hooks/qemu`.
    Binary(PathBuf),
    /// Use the host's `/etc/libvirt/hooks` as installed (e.g. by the .deb).
    Installed,
}

pub struct Daemon {
    pub dir: PathBuf,
    /// `lxc:///system?socket=…`
    pub uri: String,
    /// `qemu:///system?socket=…`: the same daemon's QEMU driver.
    pub qemu_uri: String,
    hook: Hook,
    child: Option<Child>,
}

fn run(cmd: &mut Command) -> Result<Output, String> {
    cmd.output().map_err(|e| format!("{cmd:?}: {e}"))
}

/// Whether process `pid` (in a mount namespace of its own) still sees each `(ours, at)`: its
/// `at` is the directory `ours` bind-mounted there. An error naming each that is not (its
/// mount detached when the host removed `at`).
pub fn detached_mounts(pid: i32, mounts: &[(PathBuf, &str)]) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &Path| fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let gone: Vec<&str> = mounts
        .iter()
        .filter(|(ours, at)| {
            id(&PathBuf::from(format!("/proc/{pid}/root{at}"))) != id(ours) || id(ours).is_none()
        })
        .map(|(_, at)| *at)
        .collect();
    if gone.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the test bed's bind mount over {} is gone from libvirtd's namespace (pid {pid}): something on this host removed that directory (a package's purge removes /etc/gpuhook), and the hook now reads the host's config, state and hooks",
        gone.join(", ")
    ))
}

/// Creates the accounts libvirt's QEMU driver (a hard dependency of libvirtd) insists on.
pub fn ensure_accounts() -> Result<(), String> {
    let has = |db: &str, name: &str| {
        run(Command::new("getent").args([db, name])).map(|o| o.status.success())
    };
    for g in ["kvm", "libvirt-qemu"] {
        if !has("group", g)? {
            let o = run(Command::new("groupadd").args(["-r", g]))?;
            if !o.status.success() {
                return Err(format!(
                    "groupadd {g}: {}",
                    String::from_utf8_lossy(&o.stderr)
                ));
            }
        }
    }
    if !has("passwd", "libvirt-qemu")? {
        let o = run(Command::new("useradd").args([
            "-r",
            "-g",
            "kvm",
            "-d",
            "/var/lib/libvirt",
            "-s",
            "/usr/sbin/nologin",
            "libvirt-qemu",
        ]))?;
        if !o.status.success() {
            return Err(format!(
                "useradd libvirt-qemu: {}",
                String::from_utf8_lossy(&o.stderr)
            ));
        }
    }
    Ok(())
}

impl Daemon {
    /// Prepares the daemon's directories under `dir`.
    pub fn new(dir: &Path, hook: Hook) -> Result<Daemon, String> {
        if !Path::new(LIBVIRTD).exists() {
            return Err(format!(
                "{LIBVIRTD} is missing: install libvirt-daemon libvirt-daemon-driver-lxc libvirt-clients"
            ));
        }
        if !nix::unistd::geteuid().is_root() {
            return Err("a real libvirtd with LXC containers needs root".into());
        }
        ensure_accounts()?;
        for d in [
            "run-libvirt",
            "etc-libvirt/lxc",
            "etc-libvirt/qemu",
            "etc-libvirt/hooks",
            "etc-gpuhook",
            "var-lib-libvirt",
            "var-cache-libvirt",
            "var-log-libvirt",
        ] {
            fs::create_dir_all(dir.join(d))
                .map_err(|e| format!("{}: {e}", dir.join(d).display()))?;
        }
        let conf = dir.join("etc-libvirt/qemu.conf");
        fs::write(&conf, QEMU_CONF).map_err(|e| format!("{}: {e}", conf.display()))?;
        if let Hook::Binary(bin) = &hook {
            for name in ["lxc", "qemu"] {
                let dst = dir.join("etc-libvirt/hooks").join(name);
                fs::copy(bin, &dst)
                    .map_err(|e| format!("copy {} to {}: {e}", bin.display(), dst.display()))?;
            }
        }
        let sock = dir.join("run-libvirt/libvirt-sock");
        Ok(Daemon {
            dir: dir.to_path_buf(),
            uri: format!("lxc:///system?socket={}", sock.display()),
            qemu_uri: format!("qemu:///system?socket={}", sock.display()),
            hook,
            child: None,
        })
    }

    /// The hook's config file as the daemon's children see it at `/etc/gpuhook/config.json`.
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("etc-gpuhook/config.json")
    }

    pub fn write_config(&self, cfg: &serde_json::Value) -> Result<(), String> {
        let p = self.config_path();
        let tmp = p.with_extension("tmp");
        fs::write(&tmp, serde_json::to_vec_pretty(cfg).expect("json"))
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        fs::rename(&tmp, &p).map_err(|e| format!("{}: {e}", p.display()))
    }

    /// `/run/libvirt/lxc` of this daemon, seen from the host.
    pub fn lxc_state_dir(&self) -> PathBuf {
        self.dir.join("run-libvirt/lxc")
    }

    /// `/run/libvirt/qemu` of this daemon, seen from the host (and from the daemon's hooks:
    /// the same directory): a running VM's `NAME.pid` and live `NAME.xml`.
    pub fn qemu_state_dir(&self) -> PathBuf {
        self.dir.join("run-libvirt/qemu")
    }

    /// The daemon's `/etc/libvirt/hooks`, seen from the host (the test bed's copy; with
    /// [`Hook::Installed`] the daemon sees the host's instead).
    pub fn hooks_dir(&self) -> PathBuf {
        self.dir.join("etc-libvirt/hooks")
    }

    /// `/var/log/libvirt/lxc/NAME.log` of this daemon: the LXC controller's log.
    pub fn lxc_log(&self, name: &str) -> PathBuf {
        self.dir
            .join("var-log-libvirt/lxc")
            .join(format!("{name}.log"))
    }

    /// `/var/log/libvirt/qemu/NAME.log` of this daemon: QEMU's command line and output.
    pub fn qemu_log(&self, name: &str) -> PathBuf {
        self.dir
            .join("var-log-libvirt/qemu")
            .join(format!("{name}.log"))
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("libvirtd.log")
    }

    fn pid_file(&self) -> PathBuf {
        self.dir.join("libvirtd.pid")
    }

    /// The host paths the daemon's namespace covers with the test bed's directories.
    fn covered(&self) -> Vec<(PathBuf, &'static str)> {
        vec![
            (self.dir.join("run-libvirt"), "/run/libvirt"),
            (self.dir.join("etc-libvirt"), "/etc/libvirt"),
            (self.dir.join("etc-gpuhook"), "/etc/gpuhook"),
            (self.dir.join("var-lib-libvirt"), "/var/lib/libvirt"),
            (self.dir.join("var-cache-libvirt"), "/var/cache/libvirt"),
            (self.dir.join("var-log-libvirt"), "/var/log/libvirt"),
        ]
    }

    /// Whether each of the daemon's bind mounts is still in its namespace (the host path, seen
    /// through the daemon's `/proc/PID/root`, is the test bed's directory): an error naming
    /// those whose host directory was removed behind the test bed's back.
    pub fn check_mounts(&self) -> Result<(), String> {
        match self.pid() {
            Some(pid) => detached_mounts(pid, &self.covered()),
            None => Ok(()),
        }
    }

    /// After a test case: the daemon as the next case needs it. Its bind mounts detached
    /// behind its back: restarted with them, and the error (that case proved nothing); a
    /// daemon that no longer answers `virsh uri`: started again.
    pub fn recover(&mut self) -> Result<(), String> {
        let mounts = self.check_mounts();
        if mounts.is_err() {
            let _ = self.restart();
        }
        if self
            .virsh(&["uri"])
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            let _ = self.start();
        }
        mounts
    }

    pub fn start(&mut self) -> Result<(), String> {
        // Mount points on the host (empty directories; libvirt's packages create most), made
        // again at each start: something on the host may have removed one.
        for (_, d) in self.covered() {
            fs::create_dir_all(d).map_err(|e| format!("{d}: {e}"))?;
        }
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| format!("{}: {e}", self.log_path().display()))?;
        if matches!(self.hook, Hook::Installed) {
            fs::create_dir_all("/etc/libvirt/hooks")
                .map_err(|e| format!("/etc/libvirt/hooks: {e}"))?;
        }
        let hooks = matches!(self.hook, Hook::Binary(_));
        // The installed hooks: the host's directory, mounted on the bed's before the bed's
        // /etc/libvirt (with it) covers the host's.
        let script = r#"set -e
if mountpoint -q /sys/fs/cgroup/unified; then umount /sys/fs/cgroup/unified; fi
if [ "$HOOKS" = 0 ]; then mount --bind /etc/libvirt/hooks "$D/etc-libvirt/hooks"; fi
mount --bind "$D/run-libvirt" /run/libvirt
mount --rbind "$D/etc-libvirt" /etc/libvirt
mount --bind "$D/etc-gpuhook" /etc/gpuhook
mount --bind "$D/var-lib-libvirt" /var/lib/libvirt
mount --bind "$D/var-cache-libvirt" /var/cache/libvirt
mount --bind "$D/var-log-libvirt" /var/log/libvirt
exec /usr/sbin/libvirtd --pid-file "$D/libvirtd.pid"
"#;
        let child = Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                script,
            ])
            .env("D", &self.dir)
            .env("HOOKS", if hooks { "1" } else { "0" })
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting libvirtd: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    self.child = None;
                    return Err(format!(
                        "libvirtd exited at start ({st}); its log ({}):\n{}",
                        self.log_path().display(),
                        tail(&self.log_path(), 30)
                    ));
                }
            }
            if self
                .virsh(&["uri"])
                .map(|o| o.status.success())
                .unwrap_or(false)
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = self.stop();
                return Err(format!(
                    "libvirtd did not answer within 20 s; its log:\n{}",
                    tail(&self.log_path(), 30)
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The daemon's process (in its private mount namespace), while it runs.
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    /// Stops the daemon (running containers stay, as on a real host).
    pub fn stop(&mut self) -> Result<(), String> {
        let pid = match self.child.as_ref() {
            Some(c) => Some(c.id() as i32),
            None => fs::read_to_string(self.pid_file())
                .ok()
                .and_then(|s| s.trim().parse().ok()),
        };
        let Some(pid) = pid else { return Ok(()) };
        let p = nix::unistd::Pid::from_raw(pid);
        let _ = nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let gone = match self.child.as_mut() {
                Some(c) => c.try_wait().map(|s| s.is_some()).unwrap_or(true),
                None => nix::sys::signal::kill(p, None).is_err(),
            };
            if gone {
                break;
            }
            if Instant::now() > deadline {
                let _ = nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGKILL);
                if let Some(c) = self.child.as_mut() {
                    let _ = c.wait();
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child = None;
        let _ = fs::remove_file(self.pid_file());
        Ok(())
    }

    pub fn restart(&mut self) -> Result<(), String> {
        self.stop()?;
        self.start()
    }

    pub fn virsh(&self, args: &[&str]) -> Result<Output, String> {
        virsh_at(&self.uri, args)
    }

    /// `virsh` that must succeed; returns stdout.
    pub fn virsh_ok(&self, args: &[&str]) -> Result<String, String> {
        virsh_ok_at(&self.uri, args)
    }

    /// `virsh` on the daemon's QEMU driver.
    pub fn virsh_qemu(&self, args: &[&str]) -> Result<Output, String> {
        virsh_at(&self.qemu_uri, args)
    }

    /// `virsh` on the daemon's QEMU driver, which must succeed; returns stdout.
    pub fn virsh_qemu_ok(&self, args: &[&str]) -> Result<String, String> {
        virsh_ok_at(&self.qemu_uri, args)
    }

    /// Defines a QEMU domain (a VM) from XML text.
    pub fn define_vm(&self, xml: &str) -> Result<(), String> {
        let f = self
            .dir
            .join(format!("define-vm-{}.xml", std::process::id()));
        fs::write(&f, xml).map_err(|e| e.to_string())?;
        self.virsh_qemu_ok(&["define", f.to_str().unwrap_or_default()])
            .map(|_| ())
    }

    /// Defines a domain from XML text.
    pub fn define(&self, xml: &str) -> Result<(), String> {
        let f = self.dir.join(format!("define-{}.xml", std::process::id()));
        fs::write(&f, xml).map_err(|e| e.to_string())?;
        self.virsh_ok(&["define", f.to_str().unwrap_or_default()])
            .map(|_| ())
    }

    /// The running container of a domain: its live XML's `id` (the controller), its init.
    pub fn container(&self, name: &str) -> Result<gpuhook::enter::container::Container, String> {
        let xml = self.virsh_ok(&["dumpxml", name])?;
        let dom =
            gpuhook::request::metadata::parse_domain(xml.as_bytes()).map_err(|e| e.to_string())?;
        gpuhook::enter::container::find(&dom.name, dom.id).map_err(|e| e.to_string())
    }

    /// Destroys (if running) and undefines every domain, LXC or QEMU, whose name starts with
    /// `prefix`.
    pub fn cleanup(&self, prefix: &str) {
        for uri in [&self.uri, &self.qemu_uri] {
            if let Ok(list) = virsh_ok_at(uri, &["list", "--all", "--name"]) {
                for name in list
                    .lines()
                    .map(str::trim)
                    .filter(|n| n.starts_with(prefix))
                {
                    let _ = virsh_at(uri, &["destroy", name]);
                    let _ = virsh_at(uri, &["undefine", name]);
                }
            }
        }
    }
}

fn virsh_at(uri: &str, args: &[&str]) -> Result<Output, String> {
    run(Command::new("virsh")
        .arg("-q")
        .arg("-c")
        .arg(uri)
        .args(args)
        .env("LC_ALL", "C"))
}

fn virsh_ok_at(uri: &str, args: &[&str]) -> Result<String, String> {
    let o = virsh_at(uri, args)?;
    if !o.status.success() {
        return Err(format!(
            "virsh {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.stop();
        }
    }
}

/// `sh -c SCRIPT` inside the mount namespace of process `pid` (a container's init), as
/// host root: how tests look into, or tamper with, a container's `/dev`.
pub fn shell_in(pid: i32, script: &str) -> Command {
    let mut c = Command::new("nsenter");
    c.args(["-t", &pid.to_string(), "-m", "--", "sh", "-c", script]);
    c
}

pub fn tail(p: &Path, n: usize) -> String {
    let s = fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A domain definition for tests: shares the host root (libvirt's default), runs `init`.
#[derive(Debug, Clone)]
pub struct DomainSpec {
    pub name: String,
    pub uuid: Option<String>,
    /// Raw children of `<metadata>`.
    pub metadata: String,
    /// Shell script run as the container's init.
    pub init: String,
    /// `<idmap>` mapping container 0.. to this host id (65536 ids).
    pub idmap: Option<u32>,
    /// A root filesystem of its own (`<filesystem type='mount'>` at `/`), read-only when
    /// the flag says so.
    pub rootfs: Option<(PathBuf, bool)>,
}

impl DomainSpec {
    pub fn new(name: &str, metadata: &str) -> DomainSpec {
        DomainSpec {
            name: name.into(),
            uuid: None,
            metadata: metadata.into(),
            init: "while :; do sleep 1; done".into(),
            idmap: None,
            rootfs: None,
        }
    }

    pub fn xml(&self) -> String {
        let esc = |s: &str| {
            s.replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
        };
        let uuid = self
            .uuid
            .as_ref()
            .map(|u| format!("  <uuid>{u}</uuid>\n"))
            .unwrap_or_default();
        let idmap = self
            .idmap
            // A user namespace cannot mount sysfs for a network namespace it does not own.
            .map(|t| format!("  <features><privnet/></features>\n  <idmap>\n    <uid start='0' target='{t}' count='65536'/>\n    <gid start='0' target='{t}' count='65536'/>\n  </idmap>\n"))
            .unwrap_or_default();
        let fs = self
            .rootfs
            .as_ref()
            .map(|(dir, ro)| {
                format!(
                    "<filesystem type='mount'><source dir='{}'/><target dir='/'/>{}</filesystem>",
                    esc(&dir.to_string_lossy()),
                    if *ro { "<readonly/>" } else { "" }
                )
            })
            .unwrap_or_default();
        format!(
            "<domain type='lxc'>\n  <name>{}</name>\n{uuid}  <memory unit='KiB'>65536</memory>\n  <vcpu>1</vcpu>\n  <metadata>{}</metadata>\n  <os>\n    <type>exe</type>\n    <init>/bin/sh</init>\n    <initarg>-c</initarg>\n    <initarg>{}</initarg>\n  </os>\n{idmap}  <devices>{fs}<console type='pty'/></devices>\n</domain>\n",
            self.name,
            self.metadata,
            esc(&self.init)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What made a libvirt test fail once: a directory bind-mounted over a host path in a
    /// private mount namespace is detached from it when the host removes that path (Linux
    /// 3.18 and later), as a package's purge removes `/etc/gpuhook`; the check names it.
    #[test]
    fn a_mount_point_removed_on_the_host_is_named() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("needs root (a mount namespace)");
            return;
        }
        let t = std::env::temp_dir().join(format!("gpuhook-testbed-mounts-{}", std::process::id()));
        let _ = fs::remove_dir_all(&t);
        fs::create_dir(&t).unwrap();
        let (ours, at) = (t.join("ours"), t.join("at"));
        fs::create_dir(&ours).unwrap();
        fs::create_dir(&at).unwrap();
        fs::write(ours.join("config.json"), "{}").unwrap();
        let ready = t.join("ready");
        let mut ns = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg("mount --bind \"$1\" \"$2\" && : > \"$3\" && exec sleep 30")
            .args(["sh", ours.to_str().unwrap(), at.to_str().unwrap()])
            .arg(&ready)
            .spawn()
            .unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        while !ready.exists() {
            assert!(Instant::now() < end, "the namespace never mounted");
            std::thread::sleep(Duration::from_millis(10));
        }
        let pid = ns.id() as i32;
        let at_s = at.to_str().unwrap();
        let pair = [(ours.clone(), at_s)];
        let seen = detached_mounts(pid, &pair);
        // The host removes its (empty) directory: allowed, and the mount is gone there.
        fs::remove_dir(&at).unwrap();
        let after = detached_mounts(pid, &pair);
        let inside = Path::new(&format!("/proc/{pid}/root{at_s}/config.json")).exists();
        let _ = ns.kill();
        let _ = ns.wait();
        let _ = fs::remove_dir_all(&t);
        assert_eq!(seen, Ok(()));
        let e = after.unwrap_err();
        assert!(
            e.contains(&format!("bind mount over {at_s} is gone")),
            "{e}"
        );
        assert!(!inside, "the namespace still sees the bed's config");
    }
}
