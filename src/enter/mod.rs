//! Work inside a container: finding a libvirt container and the helper that joins its
//! mount namespace ([`container`]), its namespaces opened once ([`namespace`]), the `/dev`
//! walk ([`devdir`]), CDI's work in its root
//! filesystem ([`rootfs`]), the one sandbox gpuhook runs a program in ([`sandbox`]), the
//! capabilities a step keeps ([`caps`]), a detached mount moved in by descriptor
//! ([`tree`]), and the host-side nodes of a user-namespaced OCI container
//! ([`private_nodes`]).

pub mod caps;
pub mod container;
pub mod devdir;
pub mod namespace;
pub mod private_nodes;
pub mod rootfs;
pub mod sandbox;
pub mod tree;
