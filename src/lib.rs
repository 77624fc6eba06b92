//! gpuhook: hand whole GPUs to libvirt LXC domains and OCI containers from one pool, and take them back.
//!
//! The rooms, from the top down (a module imports only from the rooms below it; nothing
//! imports a door; docs/ARCHITECTURE.md draws it):
//!
//! - [`doors`]: the libvirt hook, the OCI runtime wrapper with its hooks and bundle edits,
//!   the operator's command line;
//! - [`openstack`]: Placement's provider config and the Prometheus metrics;
//! - [`reserve`]: the reservation and its lifecycle: holders, the state file, choosing
//!   GPUs, staleness, draining, health quarantine, the lifecycle steps;
//! - [`enter`]: work inside a container: the `setns` helper, the `/dev` walk, the root
//!   filesystem work of CDI, the one process sandbox;
//! - [`cdi`]: the vendors' CDI specs and what they give a container;
//! - [`cgroup`]: device access, cgroup v1 and v2 behind one trait;
//! - [`host`]: facts of the host: config, inventory, the architecture table, procfs;
//! - [`request`]: what a container asks for, and its sources (domain XML, Nova's extra
//!   specs, OCI annotations and env);
//! - [`node`], [`ids`], [`log`]: the types and the logging everything shares.

pub mod cdi;
pub mod cgroup;
pub mod doors;
pub mod enter;
pub mod host;
pub mod ids;
pub mod leftovers;
pub mod log;
pub mod node;
pub mod openstack;
pub mod request;
pub mod reserve;

pub use reserve::error::Error;
