//! Facts of the host, read through the config's roots: the config itself, the GPU
//! inventory (sysfs, procfs, `/dev`), the architecture table, process facts (`/proc`), and
//! OS errors as values ([`syserr`]).

pub mod arch;
pub mod config;
pub mod inventory;
pub mod procfs;
pub mod syserr;
