//! cgroup v1 devices controller.

use super::{CgroupError, DeviceCgroup};
use crate::state::Node;
use std::io::Write;
use std::path::{Path, PathBuf};

pub struct V1 {
    dir: PathBuf,
}

impl V1 {
    pub fn new(dir: PathBuf) -> V1 {
        V1 { dir }
    }

    fn write(&self, file: &str, line: &str) -> Result<(), CgroupError> {
        let p = self.dir.join(file);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .map_err(|e| CgroupError::new(&self.dir, format!("open {file}: {e}")))?;
        f.write_all(line.as_bytes())
            .map_err(|e| CgroupError::new(&self.dir, format!("write '{line}' to {file}: {e}")))
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

impl DeviceCgroup for V1 {
    fn path(&self) -> &Path {
        &self.dir
    }

    fn is_allowed(&self, n: &Node) -> Result<bool, CgroupError> {
        let list = std::fs::read_to_string(self.dir.join("devices.list"))
            .map_err(|e| CgroupError::new(&self.dir, format!("read devices.list: {e}")))?;
        Ok(list.lines().any(|l| line_allows(l, n.major, n.minor)))
    }

    fn allow(&mut self, n: &Node) -> Result<(), CgroupError> {
        self.write("devices.allow", &format!("c {}:{} rw", n.major, n.minor))
    }

    fn revoke(&mut self, n: &Node) -> Result<(), CgroupError> {
        self.write("devices.deny", &format!("c {}:{} rw", n.major, n.minor))
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
        cg.write("devices.deny", "a").unwrap();
        let n = Node {
            path: "/dev/nvidia0".into(),
            major: 195,
            minor: 0,
        };
        assert!(!cg.is_allowed(&n).unwrap());
        cg.allow(&n).unwrap();
        assert!(cg.is_allowed(&n).unwrap());
        let list = std::fs::read_to_string(dir.join("devices.list")).unwrap();
        assert_eq!(list.trim(), "c 195:0 rw");
        cg.revoke(&n).unwrap();
        assert!(!cg.is_allowed(&n).unwrap());
        std::fs::remove_dir(&dir).unwrap();
    }
}
