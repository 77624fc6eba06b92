//! Facts of the host, read through the config's roots: the config itself, the GPU
//! inventory (sysfs, procfs, `/dev`), the running driver's user space ([`driver`]), the
//! architecture table, process facts (`/proc`), and
//! OS errors as values ([`syserr`]).

pub mod arch;
pub mod child;
pub mod config;
pub mod driver;
pub mod inventory;
pub mod procfs;
pub mod syserr;
