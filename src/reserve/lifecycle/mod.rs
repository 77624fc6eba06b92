//! The lifecycle of a GPU reservation, whichever front door drives it (the libvirt hook, the
//! OCI runtime wrapper, `gpuhook attach`/`detach`, the operator's commands). Each door loads
//! the config once, builds [`World`](crate::reserve::world::World) and a [`Holder`]
//! ([`Holder::libvirt`], [`Holder::oci`], [`Holder::vm`]; an operator's command resolves the
//! name it was given to one holder first, [`resolve`]), and calls one step with them; a step
//! never loads the config nor reads its own process's identity. Each step asks the state's
//! transition table ([`crate::reserve::state::Transition`]) before it changes a
//! reservation's phase.
//!
//! | step | file | called at |
//! |---|---|---|
//! | [`prepare`] | `prepare.rs` | libvirt `prepare`, OCI `create`: choose GPUs, or keep the reservation |
//! | [`confirm`] | `confirm.rs` | libvirt `start`: the reservation still stands |
//! | [`activate`] | `activate.rs` | libvirt `started`: grants, nodes, driver files, undone on failure |
//! | [`record_init`] | `record_init.rs` | OCI `createRuntime`: the init runs |
//! | [`readopt`] | `readopt.rs` | libvirt `reconnect`: re-adopt, re-grant, re-make |
//! | [`attach`] | `attach.rs` | `gpuhook attach`: more units for a running container |
//! | [`detach`] | `detach.rs` | `gpuhook detach`: units back from a running container |
//! | [`free`], [`free_key`] | `free.rs` | every stop, `reconcile` |
//! | [`release`] | `free.rs` | `gpuhook release`: one holder, refused while its container runs |
//! | [`oci_create`] | `oci_create.rs` | OCI `create`: prepare, host-side nodes and links, one rollback guard |
//! | [`vm_prepare`], [`vm_confirm`], [`vm_started`], [`vm_adopt`] | `vm.rs` | libvirt's QEMU hook: a VM's hostdevs reserved, confirmed, its QEMU process recorded, kept at `reconnect` |
//! | [`pod_create`] | `pod_create.rs` | OCI `create` with a pod's allocation (`gpuhook.io/allocation`): the pod's units become the container's |
//!
//! Shared by the steps: the holder (`holder.rs`), the state file (`store.rs`), the nodes a
//! container gets (`nodes.rs`), the driver's user space (`plan.rs`), mounts recorded before
//! they are made (`mounts.rs`), the steps' errors (`error.rs`), one name for one holder
//! (`resolve.rs`); `detach`'s own helper: the
//! recorded driver files the units it keeps still need (`driver_files.rs`). Stale reservations
//! are [`crate::reserve::reconcile`]'s. Siblings import each other by path; this file only
//! names them.

pub mod activate;
pub mod attach;
pub mod confirm;
pub mod detach;
pub mod driver_files;
pub mod error;
pub mod free;
pub mod holder;
pub mod mounts;
pub mod nodes;
pub mod oci_create;
pub mod plan;
pub mod pod_create;
pub mod prepare;
pub mod readopt;
pub mod record_init;
pub mod resolve;
pub mod store;
#[cfg(test)]
mod tests;
pub mod vm;

pub use crate::reserve::state::HolderKind;
pub use activate::activate;
pub use attach::{attach, Attached};
pub use confirm::confirm;
pub use detach::{detach, Detached, Which};
pub use error::{LifecycleError, PodCreateError};
pub use free::{free, free_key, release, Released};
pub use holder::Holder;
pub use oci_create::{free_oci, oci_create, release_oci, HostSide, OciCreate, OciCreateError};
pub use plan::{cdi_preview, Given};
pub use pod_create::pod_create;
pub use prepare::prepare;
pub use readopt::{config_unreadable, readopt, Readopted};
pub use record_init::record_init;
pub use resolve::{resolve, Ambiguous, Pick};
pub use store::mps_dir;
pub use vm::{vm_adopt, vm_confirm, vm_prepare, vm_started, Adopted};
