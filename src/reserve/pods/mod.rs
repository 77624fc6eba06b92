//! Kubernetes' door onto the pool: what kubelet's device plugin advertises and allocates. A
//! pod asks for `gpuhook.io/gpu`, `gpuhook.io/gpu-shared` or `gpuhook.io/mig-PROFILE` in its
//! `resources.limits`; kubelet knows a node's units only from a device plugin, which
//! `gpuhook-device-plugin` is, over these functions:
//!
//! - [`units`]: every unit of the pool as kubelet sees it: its resource, device ID, NUMA node
//!   and health, which follows the pool (free, or held by a pod's allocation: healthy;
//!   anything else: unhealthy, with why);
//! - [`allocate`]: kubelet's `Allocate`: the units reserved at once for a pod (holder kind
//!   `pod`, pending until a container is created with them), or refused in one line naming
//!   who took one; what the container gets (device specs, the `gpuhook.io/allocation`
//!   annotation, CDI names); `GetPreferredAllocation`'s choice ([`allocate::preferred`]);
//! - [`kubelet`]: what kubelet says of its pods (its pod resources API, or its checkpoint
//!   file): pending allocations of pods it no longer lists are freed, the others named;
//! - [`profiles`]: the MIG profile of each compute instance, as the driver names it
//!   (`nvidia-smi mig -lci`);
//! - [`device`]: a unit's device ID, the allocation's ID and annotation.
//!
//! The OCI runtime's side (a container created with `gpuhook.io/allocation`) is the
//! lifecycle's `pod_create` step.

pub mod allocate;
pub mod device;
pub mod error;
pub mod kubelet;
pub mod profiles;
#[cfg(test)]
mod tests;
pub mod units;

pub use allocate::{allocate, preferred, Allocated};
pub use device::{device_id, new_alloc_id, unit_of, ANNOTATION};
pub use error::PodError;
pub use kubelet::{sync, KubeletSource, KubeletView, PodDevices};
pub use profiles::Profiles;
pub use units::{advertise, Advertised, Health, Resource};
