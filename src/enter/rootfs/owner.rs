//! What a container's root gets from gpuhook's CDI work, named: the ids it acts as there
//! ([`Owner`]) and the `ld.so.conf.d` file it writes ([`LD_CONF`]).

use serde::{Deserialize, Serialize};

/// The file gpuhook writes into the container's `/etc/ld.so.conf.d` (LXD writes
/// `00-lxdcdi.conf`, nvidia-cdi-hook `00-nvcr-*.conf`).
pub const LD_CONF: &str = "00-gpuhook-cdi.conf";

/// The ids gpuhook acts as in a container's root: its root's (container uid and gid 0, mapped
/// through the container's user namespace; the host's root without one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}
