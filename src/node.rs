//! The one node type: a character device as a container sees it (its path under `/dev`)
//! and its number. The inventory adds the host node's mode (`host::inventory::DevNode`), a
//! container's node its mode and owner ([`NodeSpec`]); both are a `Node` and more, and
//! dereference to it. The state records `Node`s; the cgroup grants them. [`Outcome`]: what
//! became of a node gpuhook was to make.

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

/// A node to create in the container: the [`Node`] (path there, number), its mode and
/// host-side owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSpec {
    pub node: Node,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl std::ops::Deref for NodeSpec {
    type Target = Node;
    fn deref(&self) -> &Node {
        &self.node
    }
}

impl NodeSpec {
    pub fn rdev(&self) -> u64 {
        libc::makedev(self.major, self.minor)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// gpuhook made the node.
    Created,
    /// The right character device was already there; left as it was.
    Existing,
}
