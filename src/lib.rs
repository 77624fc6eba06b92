//! gpuhook: reserve whole GPUs for libvirt LXC containers and hand them in.
//!
//! A pure core and thin edges: [`request`] is what a container asks for and [`ids`] the
//! identifiers everything shares; [`metadata`] parses a request from the domain XML (and
//! [`extra_specs`] the blueprint's operators), [`inventory`] reads the host,
//! [`alloc`] chooses GPUs (pure functions), [`state`] keeps reservations in a locked file,
//! [`container`] enters the container, [`cgroup`] grants device access (v1 and v2 behind one
//! trait), [`lifecycle`] is what happens to a reservation whichever front door drives it,
//! [`hook`] is the libvirt front door, [`runtime`] the OCI one (with [`oci`], the bundle's
//! request and edits), and [`cli`] the operator's command line.

pub mod alloc;
pub mod arch;
pub mod cdi;
pub mod cgroup;
pub mod cli;
pub mod config;
pub mod container;
pub mod devdir;
pub mod drain;
pub mod error;
pub mod extra_specs;
pub mod health;
pub mod hook;
pub mod ids;
pub mod inventory;
pub mod lifecycle;
pub mod log;
pub mod metadata;
pub mod metrics;
pub mod node;
pub mod oci;
pub mod placement;
pub mod procfs;
pub mod reconcile;
pub mod request;
pub mod rootfs;
pub mod runtime;
pub mod sandbox;
pub mod state;

pub use error::Error;
