//! cgroup v1 devices controller.
//!
//! An exception added to a v1 devices cgroup reaches the cgroups created below it later,
//! but not those that already exist (systemd's, or a nested container manager's, inside a
//! container with a writable devices hierarchy): their processes would get EPERM while the
//! grant looked done. So a grant goes to the cgroup and then to every existing descendant,
//! parents first; a cgroup created meanwhile copies its parent's rules, which were already
//! written. A revoke takes the rule back from exactly the cgroups this grant added it to.

use super::{CgroupError, DeviceCgroup};
use crate::state::Node;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// At most this many cgroups below the container's are granted to: a container that makes
/// more cannot make the hook's work unbounded (its start fails with a clear line instead).
pub const MAX_DESCENDANTS: usize = 4096;

pub struct V1 {
    dir: PathBuf,
    /// For each node this run granted: the cgroups it was added to, parents first.
    added: HashMap<(u32, u32), Vec<PathBuf>>,
}

impl V1 {
    pub fn new(dir: PathBuf) -> V1 {
        V1 {
            dir,
            added: HashMap::new(),
        }
    }

    fn write(&self, dir: &Path, file: &str, line: &str) -> Result<(), CgroupError> {
        let p = dir.join(file);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .map_err(|e| CgroupError::new(dir, format!("open {file}: {e}")))?;
        f.write_all(line.as_bytes())
            .map_err(|e| CgroupError::new(dir, format!("write '{line}' to {file}: {e}")))
    }

    fn list(dir: &Path) -> Result<String, CgroupError> {
        std::fs::read_to_string(dir.join("devices.list"))
            .map_err(|e| CgroupError::new(dir, format!("read devices.list: {e}")))
    }

    fn allows(dir: &Path, n: &Node) -> Result<bool, CgroupError> {
        Ok(Self::list(dir)?
            .lines()
            .any(|l| line_allows(l, n.major, n.minor)))
    }

    /// The cgroups directly below `dir` (a cgroup that vanishes meanwhile is skipped).
    fn children(dir: &Path) -> Result<Vec<PathBuf>, CgroupError> {
        let rd = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(CgroupError::new(dir, format!("list sub-cgroups: {e}"))),
        };
        let mut out: Vec<PathBuf> = rd
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        out.sort();
        Ok(out)
    }

    /// Runs `f` on the cgroup and then on each existing descendant, parents first. `f` runs
    /// on a parent before its children are listed, so a child created after the listing
    /// inherits what `f` wrote.
    fn each_parent_first(
        &self,
        mut f: impl FnMut(&Path) -> Result<(), CgroupError>,
    ) -> Result<(), CgroupError> {
        let mut todo = vec![self.dir.clone()];
        let mut seen = 0usize;
        while let Some(d) = todo.pop() {
            f(&d)?;
            if d != self.dir {
                seen += 1;
                if seen > MAX_DESCENDANTS {
                    return Err(CgroupError::new(
                        &self.dir,
                        format!("more than {MAX_DESCENDANTS} cgroups below it; refusing"),
                    ));
                }
            }
            let kids = match Self::children(&d) {
                Ok(k) => k,
                // A sub-cgroup removed while we walk has no processes left to grant to.
                Err(_) if d != self.dir && !d.exists() => vec![],
                Err(e) => return Err(e),
            };
            todo.extend(kids.into_iter().rev());
        }
        Ok(())
    }
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

    /// Allowed in the cgroup and in every cgroup below it.
    fn is_allowed(&self, n: &Node) -> Result<bool, CgroupError> {
        let mut all = true;
        self.each_parent_first(|d| {
            if all && !Self::allows(d, n)? {
                all = false;
            }
            Ok(())
        })?;
        Ok(all)
    }

    fn grants_exactly(&self, n: &Node) -> Result<bool, CgroupError> {
        Ok(Self::list(&self.dir)?
            .lines()
            .any(|l| line_grants_exactly(l, n.major, n.minor)))
    }

    fn allow(&mut self, n: &Node) -> Result<(), CgroupError> {
        let line = format!("c {}:{} rw", n.major, n.minor);
        let mut added = Vec::new();
        let r = self.each_parent_first(|d| {
            if !Self::allows(d, n)? {
                self.write(d, "devices.allow", &line)?;
                added.push(d.to_path_buf());
            }
            Ok(())
        });
        if r.is_err() {
            // Leave nothing of a half-done grant: a deny on the top cgroup reaches all below.
            for d in added.iter().rev() {
                let _ = self.write(d, "devices.deny", &line);
            }
        } else if !added.is_empty() {
            self.added
                .entry((n.major, n.minor))
                .or_default()
                .extend(added);
        }
        r
    }

    fn revoke(&mut self, n: &Node) -> Result<(), CgroupError> {
        let line = format!("c {}:{} rw", n.major, n.minor);
        let dirs = self
            .added
            .remove(&(n.major, n.minor))
            .unwrap_or_else(|| vec![self.dir.clone()]);
        let mut first_err = None;
        for d in dirs.iter().rev() {
            match self.write(d, "devices.deny", &line) {
                // A sub-cgroup removed since the grant took its rule with it.
                Err(_) if d != &self.dir && !d.exists() => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
                Ok(()) => {}
            }
        }
        first_err.map_or(Ok(()), Err)
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

    fn node() -> Node {
        Node {
            path: "/dev/nvidia0".into(),
            major: 195,
            minor: 0,
        }
    }

    /// A real v1 devices cgroup: allow, list, deny.
    #[test]
    fn real_devices_cgroup() {
        let dir = PathBuf::from(format!(
            "/sys/fs/cgroup/devices/gpuhook-unit-{}",
            std::process::id()
        ));
        std::fs::create_dir(&dir).unwrap();
        let mut cg = V1::new(dir.clone());
        // Start from nothing allowed, as libvirt does.
        cg.write(&dir, "devices.deny", "a").unwrap();
        let n = node();
        assert!(!cg.is_allowed(&n).unwrap());
        cg.allow(&n).unwrap();
        assert!(cg.is_allowed(&n).unwrap() && cg.grants_exactly(&n).unwrap());
        let list = std::fs::read_to_string(dir.join("devices.list")).unwrap();
        assert_eq!(list.trim(), "c 195:0 rw");
        cg.revoke(&n).unwrap();
        assert!(!cg.is_allowed(&n).unwrap());
        std::fs::remove_dir(&dir).unwrap();
    }

    /// Sub-cgroups that exist before the grant get it too (v1 does not pass a parent's new
    /// exception down to existing children); a revoke takes it back from all of them and
    /// leaves what a sub-cgroup had before alone.
    #[test]
    fn grants_reach_existing_sub_cgroups() {
        let dir = PathBuf::from(format!(
            "/sys/fs/cgroup/devices/gpuhook-unit-sub-{}",
            std::process::id()
        ));
        std::fs::create_dir(&dir).unwrap();
        let mut cg = V1::new(dir.clone());
        cg.write(&dir, "devices.deny", "a").unwrap();
        cg.write(&dir, "devices.allow", "c 1:3 rwm").unwrap();
        let a = dir.join("system.slice");
        let b = a.join("inner.scope");
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let n = node();
        assert!(!cg.is_allowed(&n).unwrap());
        cg.allow(&n).unwrap();
        for d in [&dir, &a, &b] {
            let l = std::fs::read_to_string(d.join("devices.list")).unwrap();
            assert!(l.lines().any(|x| x == "c 195:0 rw"), "{}: {l}", d.display());
        }
        assert!(cg.is_allowed(&n).unwrap());
        // A grandchild that lost it makes the whole tree not allowed (reconnect re-grants).
        cg.write(&b, "devices.deny", "c 195:0 rw").unwrap();
        assert!(!cg.is_allowed(&n).unwrap());
        // A fresh run grants only where it is missing, and its revoke takes back only that.
        let mut again = V1::new(dir.clone());
        again.allow(&n).unwrap();
        assert_eq!(again.added[&(195, 0)], vec![b.clone()]);
        again.revoke(&n).unwrap();
        assert!(V1::allows(&a, &n).unwrap() && !V1::allows(&b, &n).unwrap());
        cg.revoke(&n).unwrap();
        for d in [&dir, &a, &b] {
            assert!(!V1::allows(d, &n).unwrap(), "{}", d.display());
            assert!(V1::allows(
                d,
                &Node {
                    path: "/dev/null".into(),
                    major: 1,
                    minor: 3
                }
            )
            .unwrap());
        }
        std::fs::remove_dir(&b).unwrap();
        std::fs::remove_dir(&a).unwrap();
        std::fs::remove_dir(&dir).unwrap();
    }
}
