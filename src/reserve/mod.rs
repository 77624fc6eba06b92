//! The reservation and its lifecycle: the state file ([`state`]), choosing GPUs
//! ([`alloc`]), staleness ([`reconcile`]), GPUs still open after a free ([`drain`]), health
//! quarantine ([`health`]), the running driver's files for `driver="host"`, cached
//! ([`driver`]), virtual machines' hostdevs in the pool ([`vm`]), the steps every front door drives ([`lifecycle`]) in the world a door hands
//! them ([`world`]), and the error they report ([`error`]).

pub mod alloc;
pub mod drain;
pub mod driver;
pub mod error;
pub mod health;
pub mod lifecycle;
pub mod mps;
pub mod pods;
pub mod reconcile;
pub mod state;
pub mod vm;
pub mod world;
