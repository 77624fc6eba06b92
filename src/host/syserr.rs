//! OS errors as values: an error that crosses the fork from a helper child to its parent (as
//! serde) keeps the OS's error number, and reads as the error it was made from.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A `nix` errno by its number; reads as nix says it (`ENOENT: No such file or directory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SysErr(pub i32);

impl SysErr {
    pub fn errno(self) -> nix::errno::Errno {
        nix::errno::Errno::from_raw(self.0)
    }
}

impl From<nix::errno::Errno> for SysErr {
    fn from(e: nix::errno::Errno) -> SysErr {
        SysErr(e as i32)
    }
}

impl fmt::Display for SysErr {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.errno().fmt(f)
    }
}

impl std::error::Error for SysErr {}

/// A `std::io::Error`: an OS error by its number, reading as std says it (`No such file or
/// directory (os error 2)`); any other (rare: bad UTF-8, a short write) by what it said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum IoErr {
    Os(i32),
    Said(String),
}

impl From<std::io::Error> for IoErr {
    fn from(e: std::io::Error) -> IoErr {
        match e.raw_os_error() {
            Some(n) => IoErr::Os(n),
            None => IoErr::Said(e.to_string()),
        }
    }
}

impl fmt::Display for IoErr {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            IoErr::Os(n) => std::io::Error::from_raw_os_error(*n).fmt(f),
            IoErr::Said(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for IoErr {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_as_the_errors_they_were_made_from() {
        let e = nix::errno::Errno::ENOENT;
        assert_eq!(SysErr::from(e).to_string(), e.to_string());
        let io = std::fs::read("/nonexistent/x").unwrap_err();
        let text = io.to_string();
        let v = IoErr::from(io);
        assert_eq!(v.to_string(), text);
        let back: IoErr = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
        assert_eq!(back, v);
        let said = std::io::Error::new(std::io::ErrorKind::InvalidData, "bad bytes");
        assert_eq!(IoErr::from(said).to_string(), "bad bytes");
    }
}
