//! The one node type: a character device as a container sees it (its path under `/dev`)
//! and its number. The inventory adds the host node's mode ([`crate::host::inventory::DevNode`]),
//! a container's node its mode and owner ([`crate::enter::container::NodeSpec`]); both are a
//! `Node` and more, and dereference to it. The state records `Node`s; the cgroup grants them.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    /// Path inside the container, e.g. `/dev/nvidia0`, `/dev/dri/renderD128`.
    pub path: String,
    pub major: u32,
    pub minor: u32,
}

impl Node {
    pub fn new(path: impl Into<String>, major: u32, minor: u32) -> Node {
        Node {
            path: path.into(),
            major,
            minor,
        }
    }
}
