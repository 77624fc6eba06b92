//! The host driver's user space from the vendors' CDI specs (Container Device Interface,
//! `cdiVersion` ≤ 1.1.0, JSON or YAML), as `nvidia-ctk cdi generate`, `amd-ctk cdi generate`
//! and Intel's generator write them to `/etc/cdi` and `/var/run/cdi`.
//!
//! Pure but for reading the spec files and `stat`ing the host paths they name: [`load`] reads
//! and checks the specs (unknown fields refused as the reference loader does; a device of a
//! later directory replaces one of the same name in an earlier one), [`plan()`] picks the edits
//! that belong to the GPUs a container was given — a CDI device is applied when its device
//! nodes contain one of the chosen units' own nodes and none of another GPU's; `all` never —
//! and turns them into a [`Plan`] both front doors apply: extra character nodes (granted and
//! made like gpuhook's own), read-only `nosuid,nodev` bind mounts, the two NVIDIA hooks
//! `create-symlinks` and `update-ldcache` done by gpuhook itself (`enter::rootfs`), other
//! hooks (passed to the OCI runtime, or listed in the log for libvirt) and environment.

mod edits;
mod error;
mod hooks;
pub mod host;
mod model;
mod plan;
pub mod soname;
mod spec;

pub use error::{EditError, HookError, PathError, PlanError};
pub use hooks::{parse_native, NativeHook};
pub use model::{
    generator, kind_of, BindMount, Device, DeviceNode, Edits, ExtraNode, Link, Loaded, PassedHook,
    Plan, Spec, SpecHook, SpecMount, CDI_HOOK, MAX_VERSION, MPS_TARGETS, STAGES,
};
pub use plan::{container_path, nvidia_version, plan, ChosenUnit, SpecHost, Units};
pub use soname::{soname, ElfError};
pub use spec::{load, parse, parse_checked, LoadError, SpecError, SpecParseError};

#[cfg(test)]
use hooks::{native, Native};

#[cfg(test)]
mod tests;
