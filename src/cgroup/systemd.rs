//! systemd's device policy of a container's scope (docs/guides/hotplug.md, under systemd's cgroup
//! manager).
//!
//! Under systemd's cgroup manager (podman's default on today's hosts, runc's and crun's
//! `--systemd-cgroup`) the container's init is in a transient scope (`libpod-ID.scope`, its
//! init there or in `libpod-ID.scope/container`), and the runtime hands the container's device
//! rules to systemd as the scope's `DevicePolicy=strict` and `DeviceAllow=` entries
//! (`/dev/char/MAJ:MIN rwm`). systemd applies them itself, again at every `systemctl
//! daemon-reload` and every change of the unit's properties: on cgroup v2 as its own device
//! program (`sd_devices`) on the scope's cgroup, beside the runtime's or above it; on v1 by
//! rewriting the scope's `devices.list` (`a` denied, each entry allowed). A grant made behind
//! systemd's back is then never let through (v2: a device must pass every program from the
//! container's cgroup up to the root) or taken back at the next reload (v1); an entry left
//! for a GPU taken away gives it back (v1).
//!
//! So attach and detach tell systemd too: `systemctl set-property --runtime UNIT
//! DeviceAllow=…` (what runc does at create, kept by systemd in the transient unit's
//! drop-ins: a reload re-reads them), exactly `/dev/char/MAJ:MIN rw` entries for the GPU's
//! nodes, and only where the scope already has a device policy (a unit without one confines
//! nothing, and an entry would make it confine everything else). Removal takes out the entries
//! of exactly the nodes gpuhook takes back (a GPU it gave at create or attach; the container's
//! own rules are never its to take): the list is set again without them, in one call.
//!
//! `systemctl` runs as every child of gpuhook runs: its absolute path, no environment, no
//! descriptor but its standard ones, bounded in time, never under the state lock. Changes to
//! one unit's list are serialized by a lock of root's named after the unit.

use super::device::ManagedPolicy;
use super::error::{CgroupError, Fault};
use crate::node::Node;
use nix::fcntl::Flock;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where `systemctl` is (merged `/usr` and not).
const SYSTEMCTL: [&str; 2] = ["/usr/bin/systemctl", "/bin/systemctl"];

/// What tells that systemd manages this host (`sd_booted()`).
const BOOTED: &str = "/run/systemd/system";

/// How long one `systemctl` may take (systemd answers in milliseconds; a manager stuck in a
/// long job must not hang the command).
const DEADLINE: Duration = Duration::from_secs(30);

/// The most of `systemctl`'s output read (a unit lists a few dozen entries).
const MAX_OUTPUT: usize = 1 << 20;

/// One `DeviceAllow=` entry: the device (a path, `char-NAME`, `block-NAME`) and its access
/// (`r`, `w`, `m`), as systemd lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAllowEntry {
    pub device: String,
    pub access: String,
}

impl DeviceAllowEntry {
    /// The entry gpuhook writes for a node: `/dev/char/MAJ:MIN rw` (what runc writes, and
    /// what systemd reads the numbers from without the node existing).
    fn for_node(n: &Node) -> DeviceAllowEntry {
        DeviceAllowEntry {
            device: char_path(n),
            access: "rw".into(),
        }
    }

    fn text(&self) -> String {
        format!("{} {}", self.device, self.access)
    }

    /// Whether it lets the node be read and written (by its `/dev/char` name).
    fn allows(&self, n: &Node) -> bool {
        self.device == char_path(n) && self.access.contains('r') && self.access.contains('w')
    }
}

/// `/dev/char/MAJ:MIN`.
fn char_path(n: &Node) -> String {
    format!("/dev/char/{}:{}", n.major, n.minor)
}

/// The scope unit whose cgroup `cgroup` is or is in: its first component that names a scope
/// (systemd puts units of any kind only in slices, so what is below a scope is the scope's
/// own: crun's `container`, or cgroups a container made and named as it liked). The unit's
/// name and its cgroup path.
pub fn scope_of(cgroup: &str) -> Option<(String, String)> {
    let mut at = String::new();
    for c in cgroup.split('/').filter(|c| !c.is_empty()) {
        at.push('/');
        at.push_str(c);
        if c.len() > ".scope".len() && c.ends_with(".scope") {
            return Some((c.to_string(), at));
        }
        if !c.ends_with(".slice") {
            return None;
        }
    }
    None
}

/// Whether a unit name is one gpuhook passes on (systemd's own characters: no `/`, nothing
/// `systemctl` could read as an option).
fn valid_unit(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":_.-\\@".contains(&b))
}

/// What `systemctl show` says of a unit, as far as gpuhook reads it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Shown {
    pub load_state: String,
    pub control_group: String,
    pub policy: String,
    pub entries: Vec<DeviceAllowEntry>,
}

/// `systemctl show -p …` output: `Key=Value` lines, `DeviceAllow=` once per entry.
pub fn parse_show(text: &str) -> Shown {
    let mut s = Shown::default();
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        match k {
            "LoadState" => s.load_state = v.to_string(),
            "ControlGroup" => s.control_group = v.to_string(),
            "DevicePolicy" => s.policy = v.to_string(),
            "DeviceAllow" if !v.is_empty() => {
                let (device, access) = v.split_once(' ').unwrap_or((v, ""));
                s.entries.push(DeviceAllowEntry {
                    device: device.to_string(),
                    access: access.trim().to_string(),
                });
            }
            _ => {}
        }
    }
    s
}

/// How `systemctl ARGS…` is run: its standard output, or what went wrong. [`Installed`] runs
/// the host's; the tests pass a double that keeps a unit in memory and can fail any call.
pub(super) trait Systemctl {
    fn run(&self, args: &[String]) -> Result<String, String>;
}

/// The host's `systemctl` ([`systemctl`]).
struct Installed;

impl Systemctl for Installed {
    fn run(&self, args: &[String]) -> Result<String, String> {
        systemctl(args)
    }
}

/// A scope systemd keeps a device policy for: its entries as gpuhook last read or set them,
/// and as they were when first read (what [`ManagedPolicy::restore`] puts back). Holds the
/// unit's lock for as long as it lives.
pub struct Scope {
    unit: String,
    cgroup: PathBuf,
    entries: Vec<DeviceAllowEntry>,
    /// Whether `entries` are what systemd lists: not after a change whose outcome could not be
    /// read back (it may or may not have gone through), until one is read back.
    known: bool,
    original: Vec<DeviceAllowEntry>,
    ctl: Box<dyn Systemctl>,
    _lock: Option<Flock<std::fs::File>>,
}

impl Scope {
    /// The scope of the container cgroup `cgroup` (a path in the hierarchy, as
    /// `/proc/PID/cgroup` says it), when systemd runs this host, has that very scope for that
    /// cgroup, and keeps a device policy for it (`DevicePolicy=` other than `auto`, or
    /// `DeviceAllow=` entries); `None` otherwise.
    pub fn find(cgroup: &str, state_dir: &Path) -> Result<Option<Scope>, CgroupError> {
        let Some((unit, at)) = scope_of(cgroup) else {
            return Ok(None);
        };
        if !valid_unit(&unit) || !Path::new(BOOTED).is_dir() {
            return Ok(None);
        }
        let path = PathBuf::from(&at);
        let lock = super::runtime_program::lock_named(state_dir, &format!("systemd-{unit}"))
            .map_err(|f| CgroupError::new(&path, f))?;
        Scope::open(unit, &at, Box::new(Installed), Some(lock))
    }

    /// The unit `unit` whose cgroup is `at`, as `ctl` shows it, when it is loaded with that
    /// cgroup and keeps a device policy.
    fn open(
        unit: String,
        at: &str,
        ctl: Box<dyn Systemctl>,
        lock: Option<Flock<std::fs::File>>,
    ) -> Result<Option<Scope>, CgroupError> {
        let path = PathBuf::from(at);
        let shown = show(&*ctl, &unit, &path)?;
        if shown.load_state != "loaded" || shown.control_group != at {
            return Ok(None);
        }
        if shown.policy == "auto" && shown.entries.is_empty() {
            return Ok(None);
        }
        Ok(Some(Scope {
            unit,
            cgroup: path,
            original: shown.entries.clone(),
            entries: shown.entries,
            known: true,
            ctl,
            _lock: lock,
        }))
    }

    fn err(&self, what: String) -> CgroupError {
        CgroupError::new(
            &self.cgroup,
            Fault::Systemd {
                unit: self.unit.clone(),
                what,
            },
        )
    }

    /// Sets the unit's list to `next` (appending only, when that is all that changes and the
    /// list is known; else emptied and listed again in the same call), then reads back what
    /// systemd has, after a failure too. Done only when the read-back lists exactly `next`'s
    /// devices, each as `next` says.
    fn set(&mut self, next: Vec<DeviceAllowEntry>) -> Result<(), CgroupError> {
        if self.known && next == self.entries {
            return Ok(());
        }
        // Each entry set for a device replaces the one listed for it, else is added.
        let appended = self.known
            && self
                .entries
                .iter()
                .all(|e| next.iter().any(|x| x.device == e.device));
        let mut args = vec![
            "set-property".to_string(),
            "--runtime".into(),
            "--".into(),
            self.unit.clone(),
        ];
        if appended {
            args.extend(
                next.iter()
                    .filter(|e| !self.entries.contains(e))
                    .map(|e| format!("DeviceAllow={}", e.text())),
            );
        } else {
            args.push("DeviceAllow=".into());
            args.extend(next.iter().map(|e| format!("DeviceAllow={}", e.text())));
        }
        // From here on systemd may have taken the change in, whatever comes back (a refusal,
        // a timeout): what it lists is known again only once read back.
        self.known = false;
        let told = self
            .ctl
            .run(&args)
            .map_err(|w| self.err(format!("systemctl set-property: {w}")));
        // Read back: what systemd lists now (and, its answer coming after the change, a
        // change it has taken in).
        let shown = match show(&*self.ctl, &self.unit, &self.cgroup) {
            Ok(s) => s,
            Err(e) => return Err(told.err().unwrap_or(e)),
        };
        self.entries = shown.entries;
        self.known = true;
        told?;
        let missing: Vec<String> = next
            .iter()
            .filter(|e| !self.entries.contains(e))
            .map(DeviceAllowEntry::text)
            .collect();
        if !missing.is_empty() {
            return Err(self.err(format!(
                "DeviceAllow= lacks {} after systemctl set-property",
                missing.join(", ")
            )));
        }
        let extra: Vec<String> = self
            .entries
            .iter()
            .filter(|e| !next.iter().any(|x| x.device == e.device))
            .map(DeviceAllowEntry::text)
            .collect();
        if !extra.is_empty() {
            return Err(self.err(format!(
                "DeviceAllow= still lists {} after systemctl set-property",
                extra.join(", ")
            )));
        }
        Ok(())
    }
}

impl ManagedPolicy for Scope {
    fn name(&self) -> String {
        format!("systemd unit {}", self.unit)
    }

    fn allow(&mut self, nodes: &[Node]) -> Result<(), CgroupError> {
        let mut next = self.entries.clone();
        for n in nodes {
            if next.iter().any(|e| e.allows(n)) {
                continue;
            }
            let want = DeviceAllowEntry::for_node(n);
            match next.iter_mut().find(|e| e.device == want.device) {
                // An entry for it with less access: the union (systemd replaces an entry's
                // access by the one set for the same device).
                Some(e) => {
                    e.access = "rwm"
                        .chars()
                        .filter(|c| *c != 'm' || e.access.contains('m'))
                        .collect()
                }
                None => next.push(want),
            }
        }
        self.set(next)
    }

    fn remove(&mut self, nodes: &[Node]) -> Result<(), CgroupError> {
        let gone: Vec<String> = nodes.iter().map(char_path).collect();
        let next = self
            .entries
            .iter()
            .filter(|e| !gone.contains(&e.device))
            .cloned()
            .collect();
        self.set(next)
    }

    fn restore(&mut self, nodes: &[Node]) -> Result<(), CgroupError> {
        let paths: Vec<String> = nodes.iter().map(char_path).collect();
        let mut next: Vec<DeviceAllowEntry> = self
            .entries
            .iter()
            .filter(|e| !paths.contains(&e.device))
            .cloned()
            .collect();
        next.extend(
            self.original
                .iter()
                .filter(|e| paths.contains(&e.device))
                .cloned(),
        );
        self.set(next)
    }
}

/// `systemctl show` of the unit: its load state, cgroup, device policy and entries.
fn show(ctl: &dyn Systemctl, unit: &str, cgroup: &Path) -> Result<Shown, CgroupError> {
    let args = [
        "show",
        "--property=LoadState,ControlGroup,DevicePolicy,DeviceAllow",
        "--",
        unit,
    ]
    .map(String::from);
    let out = ctl.run(&args).map_err(|what| {
        CgroupError::new(
            cgroup,
            Fault::Systemd {
                unit: unit.to_string(),
                what: format!("systemctl show: {what}"),
            },
        )
    })?;
    Ok(parse_show(&out))
}

/// Runs `systemctl ARGS…` (absolute path, no environment, only the standard descriptors,
/// within [`DEADLINE`]); its standard output, or what went wrong (its standard error's last
/// line).
fn systemctl(args: &[String]) -> Result<String, String> {
    let bin = SYSTEMCTL
        .iter()
        .find(|p| Path::new(p).is_file())
        .ok_or_else(|| format!("no systemctl ({})", SYSTEMCTL.join(", ")))?;
    let mut c = Command::new(bin);
    c.args(["--no-pager", "--no-ask-password"])
        .args(args)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    crate::host::child::std_fds_only(&mut c);
    let mut ch = c.spawn().map_err(|e| format!("run {bin}: {e}"))?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let file = |fd: std::os::fd::OwnedFd| std::fs::File::from(fd);
    let mut pipes = [
        ch.stdout.take().map(|p| file(p.into())),
        ch.stderr.take().map(|p| file(p.into())),
    ];
    for p in pipes.iter().flatten() {
        let fd = std::os::fd::AsFd::as_fd(p);
        let fl = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL).map_err(|e| e.to_string())?;
        let fl = nix::fcntl::OFlag::from_bits_truncate(fl) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(fl)).map_err(|e| e.to_string())?;
    }
    let drain = |pipes: &mut [Option<std::fs::File>; 2], out: &mut Vec<u8>, err: &mut Vec<u8>| {
        for (p, buf) in pipes.iter_mut().zip([out, err]) {
            let Some(r) = p.as_mut() else { continue };
            let mut chunk = [0u8; 8192];
            loop {
                match Read::read(r, &mut chunk) {
                    Ok(0) => {
                        *p = None;
                        break;
                    }
                    Ok(k) if buf.len() < MAX_OUTPUT => buf.extend_from_slice(&chunk[..k]),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        }
    };
    let end = Instant::now() + DEADLINE;
    let status = loop {
        drain(&mut pipes, &mut out, &mut err);
        match ch.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(2)),
            _ => {
                let _ = ch.kill();
                let _ = ch.wait();
                return Err(format!("{bin} did not finish within {DEADLINE:?}"));
            }
        }
    };
    drain(&mut pipes, &mut out, &mut err);
    if !status.success() {
        let said = String::from_utf8_lossy(&err);
        let last = said.lines().rev().find(|l| !l.trim().is_empty());
        return Err(format!("{status}: {}", last.unwrap_or("").trim()));
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scope_of_a_cgroup() {
        let s = |p: &str| scope_of(p).map(|(u, c)| format!("{u} {c}"));
        assert_eq!(
            s("/machine.slice/libpod-ab12.scope/container").as_deref(),
            Some("libpod-ab12.scope /machine.slice/libpod-ab12.scope")
        );
        assert_eq!(
            s("/system.slice/gpuhook-test-c1.scope").as_deref(),
            Some("gpuhook-test-c1.scope /system.slice/gpuhook-test-c1.scope")
        );
        // What a container names below its scope is its own: the scope rules.
        assert_eq!(
            s("/machine.slice/libpod-ab12.scope/init.scope").as_deref(),
            Some("libpod-ab12.scope /machine.slice/libpod-ab12.scope")
        );
        // cgroupfs paths: no scope of systemd's.
        assert_eq!(s("/libpod_parent/libpod-ab12"), None);
        assert_eq!(s("/machine/lxc-7-t1.libvirt-lxc"), None);
        assert_eq!(s("/x.scope.d/y"), None);
        assert_eq!(s("/"), None);
        assert_eq!(s("/.scope"), None);
        assert!(valid_unit("libpod-ab12.scope"));
        assert!(valid_unit("machine-lxc\\x2d7\\x2dt1.scope"));
        assert!(!valid_unit("--help.scope"));
        assert!(!valid_unit("a b.scope"));
    }

    /// systemd 252's `systemctl show` of runc's scope (DeviceAllow= once per entry).
    #[test]
    fn what_systemctl_show_says() {
        let s = parse_show(
            "ControlGroup=/system.slice/hpx-r1.scope\nDevicePolicy=strict\nDeviceAllow=char-pts rwm\nDeviceAllow=/dev/char/1:3 rwm\nDeviceAllow=char-* m\nLoadState=loaded\n",
        );
        assert_eq!(s.load_state, "loaded");
        assert_eq!(s.control_group, "/system.slice/hpx-r1.scope");
        assert_eq!(s.policy, "strict");
        assert_eq!(
            s.entries
                .iter()
                .map(DeviceAllowEntry::text)
                .collect::<Vec<_>>(),
            ["char-pts rwm", "/dev/char/1:3 rwm", "char-* m"]
        );
        let none = parse_show("LoadState=not-found\nControlGroup=\nDevicePolicy=auto\n");
        assert_eq!(
            (none.load_state.as_str(), none.entries.len()),
            ("not-found", 0)
        );
        let n = Node::new("/dev/nvidia1", 195, 1);
        assert!(DeviceAllowEntry::for_node(&n).allows(&n));
        assert_eq!(DeviceAllowEntry::for_node(&n).text(), "/dev/char/195:1 rw");
        let m = DeviceAllowEntry {
            device: "/dev/char/195:1".into(),
            access: "m".into(),
        };
        assert!(!m.allows(&n));
        let whole = DeviceAllowEntry {
            device: "char-195".into(),
            access: "rwm".into(),
        };
        assert!(!whole.allows(&n), "gpuhook's entries are exact ones");
    }

    /// How the double answers one call of a verb (`set-property`, `show`), when not as asked.
    #[derive(Clone, Copy)]
    struct Answer {
        verb: &'static str,
        /// A change is made (`set-property` only).
        made: bool,
        /// What goes wrong (the call's error), if anything.
        fails: Option<&'static str>,
    }

    /// A unit of systemd's in memory, as `systemctl` shows and changes it: its `DeviceAllow=`
    /// list, every call, and how its next calls go.
    #[derive(Default)]
    struct Unit {
        list: std::cell::RefCell<Vec<String>>,
        calls: std::cell::RefCell<Vec<String>>,
        script: std::cell::RefCell<std::collections::VecDeque<Answer>>,
    }

    impl Unit {
        fn new(list: &[&str]) -> std::rc::Rc<Unit> {
            std::rc::Rc::new(Unit {
                list: std::cell::RefCell::new(list.iter().map(|e| e.to_string()).collect()),
                ..Default::default()
            })
        }
        fn list(&self) -> Vec<String> {
            self.list.borrow().clone()
        }
        /// `systemctl set-property`'s `DeviceAllow=`: empty clears the list, an entry replaces
        /// the one listed for its device, else is added.
        fn set(&self, args: &[String]) {
            let mut list = self.list.borrow_mut();
            for a in args.iter().filter_map(|a| a.strip_prefix("DeviceAllow=")) {
                if a.is_empty() {
                    list.clear();
                    continue;
                }
                let device = a.split(' ').next().unwrap_or("");
                match list
                    .iter_mut()
                    .find(|e| e.split(' ').next() == Some(device))
                {
                    Some(e) => *e = a.to_string(),
                    None => list.push(a.to_string()),
                }
            }
        }
    }

    struct Double(std::rc::Rc<Unit>);

    impl Systemctl for Double {
        fn run(&self, args: &[String]) -> Result<String, String> {
            let u = &self.0;
            let verb = args[0].as_str();
            u.calls.borrow_mut().push(args.join(" "));
            let answer = {
                let mut script = u.script.borrow_mut();
                match script.front() {
                    Some(a) if a.verb == verb => script.pop_front(),
                    _ => None,
                }
            };
            let made = answer.is_none_or(|a| a.made);
            if verb == "set-property" && made {
                u.set(args);
            }
            if let Some(why) = answer.and_then(|a| a.fails) {
                return Err(why.to_string());
            }
            Ok(match verb {
                "show" => {
                    let mut out = "LoadState=loaded\nControlGroup=/system.slice/t.scope\nDevicePolicy=strict\n".to_string();
                    for e in u.list.borrow().iter() {
                        out.push_str(&format!("DeviceAllow={e}\n"));
                    }
                    out
                }
                _ => String::new(),
            })
        }
    }

    /// The scope `t.scope` over the unit `u` (its container's own entries and GPU 0's).
    fn scope(u: &std::rc::Rc<Unit>) -> Scope {
        let s = Scope::open(
            "t.scope".into(),
            "/system.slice/t.scope",
            Box::new(Double(u.clone())),
            None,
        )
        .unwrap()
        .unwrap();
        u.calls.borrow_mut().clear();
        s
    }

    const BEFORE: [&str; 3] = ["char-pts rwm", "/dev/char/1:3 rwm", "/dev/char/195:0 rw"];

    fn gpu1() -> Node {
        Node::new("/dev/nvidia1", 195, 1)
    }

    /// An attach's change that went through but whose read-back failed or timed out, or that
    /// timed out itself, leaves the list unknown: the restore sets it again, whole, as it was
    /// before (issue 39: the old code took its own stale copy for the list and changed nothing,
    /// the new entry left for the next reload).
    #[test]
    fn a_restore_after_a_change_of_unknown_outcome_sets_the_list_again() {
        let failed = [
            (
                "show",
                true,
                "exit status: 1: Failed to get properties: Connection timed out",
            ),
            ("show", true, "/usr/bin/systemctl did not finish within 30s"),
            (
                "set-property",
                true,
                "/usr/bin/systemctl did not finish within 30s",
            ),
        ];
        for (verb, made, why) in failed {
            let u = Unit::new(&BEFORE);
            let mut s = scope(&u);
            u.script.borrow_mut().push_back(Answer {
                verb,
                made,
                fails: Some(why),
            });
            if verb == "set-property" {
                // Its read-back fails too: nothing tells what systemd lists.
                u.script.borrow_mut().push_back(Answer {
                    verb: "show",
                    made: false,
                    fails: Some("Connection timed out"),
                });
            }
            assert!(s.allow(&[gpu1()]).is_err(), "{verb}: {why}");
            assert!(u.list().contains(&"/dev/char/195:1 rw".to_string()));
            s.restore(&[gpu1()]).unwrap();
            assert_eq!(u.list(), BEFORE, "{verb}: {why}");
            let calls = u.calls.borrow().clone();
            assert_eq!(
                calls.last().map(String::as_str),
                Some("show --property=LoadState,ControlGroup,DevicePolicy,DeviceAllow -- t.scope"),
                "{calls:?}"
            );
            assert_eq!(
                calls[calls.len() - 2],
                "set-property --runtime -- t.scope DeviceAllow= DeviceAllow=char-pts rwm DeviceAllow=/dev/char/1:3 rwm DeviceAllow=/dev/char/195:0 rw",
                "{verb}: {why}"
            );
        }
    }

    /// A change systemd refused is read back too: the list is known as it was, and the restore
    /// has nothing to do (the old code read nothing back after a failed `set-property`).
    #[test]
    fn a_refused_change_read_back_needs_no_restore() {
        let u = Unit::new(&BEFORE);
        let mut s = scope(&u);
        u.script.borrow_mut().push_back(Answer {
            verb: "set-property",
            made: false,
            fails: Some("exit status: 1: Failed to set unit properties on t.scope: Access denied"),
        });
        let e = s.allow(&[gpu1()]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cgroup /system.slice/t.scope: t.scope: systemctl set-property: exit status: 1: Failed to set unit properties on t.scope: Access denied"
        );
        assert_eq!(u.list(), BEFORE);
        // Read back after the refusal: what systemd lists is known.
        assert_eq!(
            u.calls
                .borrow()
                .last()
                .map(|c| c.split(' ').next().unwrap_or("")),
            Some("show")
        );
        let n = u.calls.borrow().len();
        s.restore(&[gpu1()]).unwrap();
        assert_eq!(u.calls.borrow().len(), n, "{:?}", u.calls.borrow());
    }

    /// A restore (or a removal) is done only once the read-back shows the entry gone: one
    /// systemd still lists is an error, whatever `set-property` said (issue 39).
    #[test]
    fn an_entry_still_listed_after_a_restore_is_an_error() {
        let u = Unit::new(&BEFORE);
        let mut s = scope(&u);
        s.allow(&[gpu1()]).unwrap();
        assert!(u.list().contains(&"/dev/char/195:1 rw".to_string()));
        u.script.borrow_mut().push_back(Answer {
            verb: "set-property",
            made: false,
            fails: None,
        });
        let e = s.restore(&[gpu1()]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cgroup /system.slice/t.scope: t.scope: DeviceAllow= still lists /dev/char/195:1 rw after systemctl set-property"
        );
        // Tried again, it goes through.
        s.restore(&[gpu1()]).unwrap();
        assert_eq!(u.list(), BEFORE);
        // The same for a removal.
        u.script.borrow_mut().push_back(Answer {
            verb: "set-property",
            made: false,
            fails: None,
        });
        let gpu0 = Node::new("/dev/nvidia0", 195, 0);
        let e = s.remove(std::slice::from_ref(&gpu0)).unwrap_err();
        assert!(
            e.to_string().ends_with(
                "DeviceAllow= still lists /dev/char/195:0 rw after systemctl set-property"
            ),
            "{e}"
        );
        s.remove(&[gpu0]).unwrap();
        assert_eq!(u.list(), ["char-pts rwm", "/dev/char/1:3 rwm"]);
    }
}
