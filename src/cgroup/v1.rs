//! cgroup v1 devices controller.
//!
//! An exception added to a v1 devices cgroup reaches the cgroups created below it later,
//! but not those that already exist (systemd's, or a nested container manager's, inside a
//! container with a writable devices hierarchy): their processes would get EPERM while the
//! grant looked done. So a grant goes to the cgroup and then to the existing descendants
//! that **inherit** from it, parents first; a cgroup created meanwhile copies its parent's
//! rules, which were already written. A sub-cgroup whose rules lack one of its parent's was
//! narrowed on purpose (a service's `DevicePolicy=closed`, a nested container's own device
//! list) and is left alone with everything below it: gpuhook never widens what software in
//! the container took away. A revoke takes the rule back from exactly the cgroups the grant
//! wrote to.

use super::device::DeviceCgroup;
use super::error::{CgroupError, Fault};
use crate::node::Node;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// At most this many cgroups below the container's are looked at: a container that makes
/// more cannot make the hook's work unbounded. Past it, the ones not reached are left as they
/// are (and the log says so): a busy legitimate container (a nested Kubernetes) must not be
/// refused its GPUs, or killed at `reconnect`, for the cgroups it runs.
pub const MAX_DESCENDANTS: usize = 4096;

pub struct V1 {
    dir: PathBuf,
    limit: usize,
    /// For each node this run granted: the cgroups it was added to, parents first.
    added: HashMap<(u32, u32), Vec<PathBuf>>,
}

/// Whether an error means a sub-cgroup cannot be reached: removed while we walked, or so
/// deep that its path is longer than the kernel takes (`ENAMETOOLONG`). It is left as it is.
fn vanished(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::ENAMETOOLONG)
    )
}

impl V1 {
    pub fn new(dir: PathBuf) -> V1 {
        V1 {
            dir,
            limit: MAX_DESCENDANTS,
            added: HashMap::new(),
        }
    }

    fn write(dir: &Path, file: &str, line: &str) -> Result<(), std::io::Error> {
        std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join(file))?
            .write_all(line.as_bytes())
    }

    fn write_fault(file: &str, line: &str, e: std::io::Error) -> Fault {
        Fault::Write {
            file: file.to_owned(),
            line: line.to_owned(),
            error: e.into(),
        }
    }

    /// Denies the node in cgroup `d`; a sub-cgroup that cannot be reached (gone) is fine.
    fn deny_in(&self, d: &Path, n: &Node) -> Result<(), CgroupError> {
        let line = rule(n);
        match Self::write(d, "devices.deny", &line) {
            Err(e) if !(d != self.dir && vanished(&e)) => Err(CgroupError::new(
                d,
                Self::write_fault("devices.deny", &line, e),
            )),
            _ => Ok(()),
        }
    }

    /// The cgroup's rules, one `devices.list` line each.
    fn rules(dir: &Path) -> Result<Vec<String>, std::io::Error> {
        Ok(std::fs::read_to_string(dir.join("devices.list"))?
            .lines()
            .map(str::to_owned)
            .collect())
    }

    /// Walks the cgroup and the existing descendants that inherit from it, parents first:
    /// `f` gets each one's rules (as they were before `f`) and runs before its children are
    /// listed. A descendant that lacks a rule of its parent's, other than one for the nodes
    /// being granted (which it may just have lost: a `systemctl daemon-reload` inside rewrites
    /// a unit's rules), was narrowed on purpose and is skipped with its subtree; so is one
    /// removed meanwhile.
    fn walk(
        &self,
        granting: &[Node],
        mut f: impl FnMut(&Path, &[String]) -> Result<(), CgroupError>,
    ) -> Result<(), CgroupError> {
        let ours = |rule: &str| {
            granting
                .iter()
                .any(|n| line_grants_exactly(rule, n.major, n.minor))
        };
        let top = Self::rules(&self.dir)
            .map_err(|e| CgroupError::new(&self.dir, Fault::ReadList(e.into())))?;
        let mut todo: Vec<(PathBuf, Vec<String>)> = Vec::new();
        let mut seen = 0usize;
        let mut capped = false;
        let mut visit = |d: &Path,
                         rules: Vec<String>,
                         todo: &mut Vec<(PathBuf, Vec<String>)>|
         -> Result<(), CgroupError> {
            f(d, &rules)?;
            let rd = match std::fs::read_dir(d) {
                Ok(rd) => rd,
                Err(e) if d != self.dir && vanished(&e) => return Ok(()),
                Err(e) => return Err(CgroupError::new(d, Fault::ListSubCgroups(e.into()))),
            };
            for e in rd.flatten() {
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                if seen == self.limit {
                    capped = true;
                    break;
                }
                seen += 1;
                todo.push((e.path(), rules.clone()));
            }
            Ok(())
        };
        visit(&self.dir, top, &mut todo)?;
        while let Some((d, parent)) = todo.pop() {
            let rules = match Self::rules(&d) {
                Ok(r) => r,
                Err(e) if vanished(&e) => continue,
                Err(e) => return Err(CgroupError::new(&d, Fault::ReadList(e.into()))),
            };
            if parent.iter().all(|r| ours(r) || rules.contains(r)) {
                visit(&d, rules, &mut todo)?;
            }
        }
        if capped {
            crate::log::warn(&format!(
                "cgroup {}: more than {} cgroups below it; those past them were left as they are",
                self.dir.display(),
                self.limit
            ));
        }
        Ok(())
    }
}

/// The rule gpuhook writes for a node: exactly that char device, `rw`.
fn rule(n: &Node) -> String {
    format!("c {}:{} rw", n.major, n.minor)
}

/// Whether one `devices.list` line (`c 195:0 rw`, `c 136:* rwm`, `a *:* rwm`) covers `rw`
/// access to char device `major:minor`.
pub fn line_allows(line: &str, major: u32, minor: u32) -> bool {
    let mut it = line.split_whitespace();
    let (Some(kind), Some(num), Some(access)) = (it.next(), it.next(), it.next()) else {
        return false;
    };
    if kind != "a" && kind != "c" {
        return false;
    }
    let Some((ma, mi)) = num.split_once(':') else {
        return false;
    };
    let fits = |pat: &str, v: u32| pat == "*" || pat.parse::<u32>().ok() == Some(v);
    (kind == "a" || (fits(ma, major) && fits(mi, minor)))
        && access.contains('r')
        && access.contains('w')
}

/// Whether a `devices.list` line is a rule for exactly char device `major:minor` with `rw`.
fn line_grants_exactly(line: &str, major: u32, minor: u32) -> bool {
    let mut it = line.split_whitespace();
    it.next() == Some("c")
        && it.next() == Some(format!("{major}:{minor}").as_str())
        && it
            .next()
            .is_some_and(|a| a.contains('r') && a.contains('w'))
}

impl DeviceCgroup for V1 {
    fn path(&self) -> &Path {
        &self.dir
    }

    /// Allowed in the cgroup and in every descendant that inherits from it.
    fn is_allowed(&self, n: &Node) -> Result<bool, CgroupError> {
        let mut all = true;
        self.walk(std::slice::from_ref(n), |_, rules| {
            all &= rules.iter().any(|l| line_allows(l, n.major, n.minor));
            Ok(())
        })?;
        Ok(all)
    }

    fn grants_exactly(&self, n: &Node) -> Result<bool, CgroupError> {
        Ok(Self::rules(&self.dir)
            .map_err(|e| CgroupError::new(&self.dir, Fault::ReadList(e.into())))?
            .iter()
            .any(|l| line_grants_exactly(l, n.major, n.minor)))
    }

    fn allow(&mut self, n: &Node) -> Result<(), CgroupError> {
        self.grant_missing(std::slice::from_ref(n)).map(|_| ())
    }

    /// One walk for all nodes: each cgroup's rules are read once, and only the missing
    /// ones written.
    fn grant_missing(&mut self, nodes: &[Node]) -> Result<Vec<Node>, CgroupError> {
        let mut wrote: Vec<(PathBuf, &Node)> = Vec::new();
        let r = self.walk(nodes, |d, rules| {
            for n in nodes {
                if rules.iter().any(|l| line_allows(l, n.major, n.minor)) {
                    continue;
                }
                let line = rule(n);
                match Self::write(d, "devices.allow", &line) {
                    Ok(()) => wrote.push((d.to_path_buf(), n)),
                    // A sub-cgroup removed meanwhile has no process left to grant to.
                    Err(e) if d != self.dir && vanished(&e) => {}
                    Err(e) => {
                        let fault = Fault::Granting {
                            node: (*n).clone(),
                            fault: Box::new(Self::write_fault("devices.allow", &line, e)),
                        };
                        return Err(CgroupError::new(d, fault));
                    }
                }
            }
            Ok(())
        });
        if let Err(e) = r {
            // Leave nothing of a half-done grant.
            let left: crate::leftovers::Leftovers = wrote
                .iter()
                .rev()
                .filter_map(|(d, n)| self.deny_in(d, n).err().map(|x| x.to_string()))
                .collect();
            return Err(e.with_left(left));
        }
        let mut added: Vec<Node> = Vec::new();
        for (d, n) in wrote {
            self.added.entry((n.major, n.minor)).or_default().push(d);
            if !added.contains(n) {
                added.push(n.clone());
            }
        }
        Ok(added)
    }

    /// Takes the rule back from the cgroups this run's grant wrote it to (none: nothing to
    /// take back; access the cgroup had before is never revoked).
    fn revoke(&mut self, n: &Node) -> Result<(), CgroupError> {
        let dirs = self.added.remove(&(n.major, n.minor)).unwrap_or_default();
        let mut first_err = None;
        for d in dirs.iter().rev() {
            if let Err(e) = self.deny_in(d, n) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Denies in the cgroup itself (v1 passes a deny down to every cgroup below it).
    fn deny(&mut self, n: &Node) -> Result<(), CgroupError> {
        self.deny_in(&self.dir, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_lines() {
        assert!(line_allows("c 195:0 rw", 195, 0));
        assert!(line_allows("c 195:0 rwm", 195, 0));
        assert!(!line_allows("c 195:0 r", 195, 0));
        assert!(!line_allows("c 195:0 rw", 195, 1));
        assert!(line_allows("c 136:* rwm", 136, 7));
        assert!(line_allows("c *:* rwm", 1, 2));
        assert!(line_allows("a *:* rwm", 195, 0));
        assert!(!line_allows("b 195:0 rwm", 195, 0));
        assert!(!line_allows("garbage", 195, 0));
        assert!(line_grants_exactly("c 195:0 rw", 195, 0));
        assert!(line_grants_exactly("c 195:0 rwm", 195, 0));
        assert!(!line_grants_exactly("c 195:* rwm", 195, 0));
        assert!(!line_grants_exactly("a *:* rwm", 195, 0));
        assert!(!line_grants_exactly("c 195:0 r", 195, 0));
        assert!(!line_grants_exactly("c 195:01 rw", 195, 1));
    }

    fn node(minor: u32) -> Node {
        Node {
            path: format!("/dev/nvidia{minor}"),
            major: 195,
            minor,
        }
    }

    fn allows(d: &Path, n: &Node) -> bool {
        V1::rules(d)
            .unwrap()
            .iter()
            .any(|l| line_allows(l, n.major, n.minor))
    }

    /// A fresh v1 devices cgroup under the root, allowing only /dev/null, removed on drop.
    struct TestCg(PathBuf);
    impl TestCg {
        fn new(tag: &str) -> TestCg {
            let dir = PathBuf::from(format!(
                "/sys/fs/cgroup/devices/gpuhook-unit-{tag}-{}",
                std::process::id()
            ));
            std::fs::create_dir(&dir).unwrap();
            V1::write(&dir, "devices.deny", "a").unwrap();
            V1::write(&dir, "devices.allow", "c 1:3 rwm").unwrap();
            TestCg(dir)
        }
    }
    impl Drop for TestCg {
        fn drop(&mut self) {
            let mut dirs = vec![];
            let mut todo = vec![self.0.clone()];
            while let Some(d) = todo.pop() {
                for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        todo.push(e.path());
                    }
                }
                dirs.push(d);
            }
            for d in dirs.iter().rev() {
                let _ = std::fs::remove_dir(d);
            }
        }
    }

    /// A real v1 devices cgroup: allow, list, revoke, deny.
    #[test]
    fn real_devices_cgroup() {
        let t = TestCg::new("one");
        let mut cg = V1::new(t.0.clone());
        let n = node(0);
        assert!(!cg.is_allowed(&n).unwrap());
        assert_eq!(
            cg.grant_missing(std::slice::from_ref(&n)).unwrap(),
            vec![n.clone()]
        );
        assert!(cg.is_allowed(&n).unwrap() && cg.grants_exactly(&n).unwrap());
        let list = std::fs::read_to_string(t.0.join("devices.list")).unwrap();
        assert_eq!(list, "c 1:3 rwm\nc 195:0 rw\n");
        assert_eq!(
            cg.grant_missing(std::slice::from_ref(&n)).unwrap(),
            vec![],
            "nothing missing"
        );
        cg.revoke(&n).unwrap();
        assert!(!cg.is_allowed(&n).unwrap());
        // A revoke of what this run did not add takes nothing back.
        V1::write(&t.0, "devices.allow", "c 195:0 rw").unwrap();
        cg.revoke(&n).unwrap();
        assert!(allows(&t.0, &n));
        cg.deny(&n).unwrap();
        assert!(!allows(&t.0, &n));
    }

    /// Sub-cgroups that exist before the grant and inherit from their parent get it too (v1
    /// does not pass a parent's new exception down to existing children); one narrowed on
    /// purpose does not, nor anything below it; a revoke takes it back from all it was added to.
    #[test]
    fn grants_reach_inheriting_sub_cgroups() {
        let t = TestCg::new("sub");
        let a = t.0.join("system.slice");
        let b = a.join("inner.scope");
        let closed = t.0.join("closed.service");
        let below_closed = closed.join("x");
        for d in [&a, &b, &closed] {
            std::fs::create_dir(d).unwrap();
        }
        // DevicePolicy=closed-like: it took /dev/null away from itself.
        V1::write(&closed, "devices.deny", "c 1:3 rwm").unwrap();
        std::fs::create_dir(&below_closed).unwrap();
        let mut cg = V1::new(t.0.clone());
        let n = node(0);
        assert!(!cg.is_allowed(&n).unwrap());
        cg.grant_missing(&[n.clone(), node(1)]).unwrap();
        for d in [&t.0, &a, &b] {
            assert!(allows(d, &n) && allows(d, &node(1)), "{}", d.display());
        }
        for d in [&closed, &below_closed] {
            assert!(!allows(d, &n), "{} was narrowed on purpose", d.display());
        }
        assert!(cg.is_allowed(&n).unwrap());
        // A grandchild that lost it makes the tree not allowed (reconnect re-grants).
        V1::write(&b, "devices.deny", "c 195:0 rw").unwrap();
        assert!(!cg.is_allowed(&n).unwrap());
        // A fresh run grants only where it is missing, and its revoke takes back only that.
        let mut again = V1::new(t.0.clone());
        assert_eq!(
            again.grant_missing(std::slice::from_ref(&n)).unwrap(),
            vec![n.clone()]
        );
        assert_eq!(again.added[&(195, 0)], vec![b.clone()]);
        again.revoke(&n).unwrap();
        assert!(allows(&a, &n) && !allows(&b, &n));
        cg.revoke(&n).unwrap();
        for d in [&t.0, &a, &b] {
            assert!(!allows(d, &n), "{}", d.display());
            assert!(
                allows(d, &node(1))
                    && allows(
                        d,
                        &Node {
                            path: "/dev/null".into(),
                            major: 1,
                            minor: 3
                        }
                    )
            );
        }
    }

    /// More sub-cgroups than the limit: the grant still succeeds where it reached (the top
    /// first), the rest are left as they are.
    #[test]
    fn past_the_limit_the_rest_is_left() {
        let t = TestCg::new("cap");
        for i in 0..5 {
            std::fs::create_dir(t.0.join(format!("s{i}"))).unwrap();
        }
        let mut cg = V1::new(t.0.clone());
        cg.limit = 3;
        assert_eq!(cg.grant_missing(&[node(0)]).unwrap(), vec![node(0)]);
        assert!(allows(&t.0, &node(0)));
        let reached = (0..5)
            .filter(|i| allows(&t.0.join(format!("s{i}")), &node(0)))
            .count();
        assert_eq!(reached, 3);
        cg.revoke(&node(0)).unwrap();
        assert!(!allows(&t.0, &node(0)));
    }

    /// Sub-cgroups so deep that their paths are longer than the kernel takes are left as
    /// they are: the grant still succeeds where it can reach.
    #[test]
    fn too_deep_sub_cgroups_are_left() {
        use nix::fcntl::{open, openat, OFlag};
        use nix::sys::stat::{mkdirat, Mode};
        use nix::unistd::{unlinkat, UnlinkatFlags};
        let t = TestCg::new("deep");
        let name = "d".repeat(250);
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let mut fds = vec![open(&t.0, flags, Mode::empty()).unwrap()];
        for _ in 0..18 {
            let parent = fds.last().unwrap();
            mkdirat(parent, name.as_str(), Mode::from_bits_truncate(0o755)).unwrap();
            let fd = openat(parent, name.as_str(), flags, Mode::empty()).unwrap();
            fds.push(fd);
        }
        let mut cg = V1::new(t.0.clone());
        let r = cg.grant_missing(&[node(0)]);
        // Remove the chain through the descriptors (its paths are too long for TestCg's drop).
        fds.pop();
        while let Some(parent) = fds.pop() {
            unlinkat(&parent, name.as_str(), UnlinkatFlags::RemoveDir).unwrap();
        }
        assert_eq!(r.unwrap(), vec![node(0)]);
        assert!(allows(&t.0, &node(0)));
        cg.revoke(&node(0)).unwrap();
    }

    /// Busy containers make and remove sub-cgroups all the time: one that vanishes while the
    /// grant walks is skipped, never an error.
    #[test]
    fn sub_cgroups_vanishing_during_the_walk() {
        let t = TestCg::new("churn");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churn = {
            let (dir, stop) = (t.0.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let d = dir.join(format!("run-{}.scope", i % 8));
                    let _ = std::fs::create_dir(&d);
                    let _ = std::fs::remove_dir(&d);
                    i += 1;
                }
            })
        };
        let mut failures = Vec::new();
        for _ in 0..200 {
            let mut cg = V1::new(t.0.clone());
            match cg.grant_missing(&[node(0), node(1)]) {
                Ok(added) => {
                    for n in &added {
                        cg.revoke(n).unwrap();
                    }
                }
                Err(e) => failures.push(e.to_string()),
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        churn.join().unwrap();
        assert!(
            failures.is_empty(),
            "{} failed, e.g. {:?}",
            failures.len(),
            failures.first()
        );
    }
}
