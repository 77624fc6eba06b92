//! World of the host, read through the config's roots: the config itself, the GPU
//! inventory (sysfs, procfs, `/dev`), the running driver's user space ([`driver`]), the
//! architecture table, process facts (`/proc`), libvirt's QEMU status directory ([`qemu`]),
//! OS errors as values ([`syserr`]), the one atomic file writer ([`atomic`]), and the host's
//! `/dev/char` links of the nodes an OCI runtime is handed ([`charlink`]).

pub mod arch;
pub mod atomic;
pub mod charlink;
pub mod child;
pub mod config;
pub mod driver;
pub mod inventory;
pub mod procfs;
pub mod qemu;
pub mod sys;
pub mod syserr;
