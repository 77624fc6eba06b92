//! The ids gpuhook acts as in a container's root ([`Owner`]).

use serde::{Deserialize, Serialize};

/// The ids gpuhook acts as in a container's root: its root's (container uid and gid 0, mapped
/// through the container's user namespace; the host's root without one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}
