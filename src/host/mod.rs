//! Facts of the host, read through the config's roots: the config itself, the GPU
//! inventory (sysfs, procfs, `/dev`), the architecture table, and process facts (`/proc`).

pub mod arch;
pub mod config;
pub mod inventory;
pub mod procfs;
