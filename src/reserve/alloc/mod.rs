//! Choosing GPUs for a request: pure functions over the inventory and the set of held GPUs.
//!
//! Exact count; vendor/arch/model filters; explicit devices; excluded and unusable GPUs never
//! given. Placement is deterministic and topology-aware: all GPUs on one NUMA node if one
//! can hold the request (best fit: the node with the fewest free GPUs that still suffices,
//! which keeps whole nodes free for large requests), then under one PCI parent (switch or
//! root port) the same way, then lowest index.
//!
//! The refusals ([`error`]), who holds what ([`held`]), what a request names and whether a GPU
//! matches it ([`select`]), whole GPUs ([`whole`]), slots of shared GPUs ([`slots`]), MIG
//! instances ([`migs`]), and placement by topology ([`place`]).

pub mod error;
pub mod held;
pub mod migs;
mod place;
pub mod select;
pub mod slots;
pub mod whole;

#[cfg(test)]
pub(crate) mod tests;

pub use error::AllocError;
pub use held::{busy, gi_holder, mdev_holder, sharers, slots_of, Held};
pub use migs::allocate_migs;
pub use select::{matches, resolve};
pub use slots::allocate_slots;
pub use whole::{allocate, allocate_beside};
