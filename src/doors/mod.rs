//! The front doors: libvirt's LXC hook ([`hook`]), libvirt's QEMU hook ([`qemu_hook`]), the OCI runtime wrapper ([`runtime`],
//! with [`bundle`], its pure edits of a bundle's `config.json`), and the operator's command
//! line ([`cli`], with [`hotplug`]: `attach` and `detach`). Nothing imports a door.

pub mod bundle;
pub mod cli;
pub mod error;
pub mod hook;
pub mod hotplug;
pub mod qemu_hook;
pub mod runtime;
