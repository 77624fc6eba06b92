//! Work inside a container: finding a libvirt container and the helper that joins its
//! mount namespace ([`container`]), the `/dev` walk ([`devdir`]), CDI's work in its root
//! filesystem ([`rootfs`]), the one sandbox gpuhook runs a program in ([`sandbox`]), and
//! the one atomic file writer ([`replace`]); the host's `/dev/char` links of the nodes an OCI
//! runtime is handed ([`charlink`]); the host-side nodes of a user-namespaced OCI container
//! ([`private_nodes`]).

pub mod charlink;
pub mod container;
pub mod devdir;
pub mod private_nodes;
pub mod replace;
pub mod rootfs;
pub mod sandbox;
