//! The file names the CDI work in a container's root uses: the `ld.so.conf.d` file it writes
//! there ([`LD_CONF`]) and where a host's static `ldconfig` is ([`LDCONFIGS`]).

/// The file gpuhook writes into the container's `/etc/ld.so.conf.d` (LXD writes
/// `00-lxdcdi.conf`, nvidia-cdi-hook `00-nvcr-*.conf`).
pub const LD_CONF: &str = "00-gpuhook-cdi.conf";

/// Where a host's static `ldconfig` is (Ubuntu's `/sbin/ldconfig` is a script around
/// `ldconfig.real`).
pub(crate) const LDCONFIGS: [&str; 4] = [
    "/sbin/ldconfig.real",
    "/usr/sbin/ldconfig.real",
    "/sbin/ldconfig",
    "/usr/sbin/ldconfig",
];
