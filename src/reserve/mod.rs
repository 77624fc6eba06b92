//! The reservation and its lifecycle: the state file ([`state`]), choosing GPUs
//! ([`alloc`]), staleness ([`reconcile`]), GPUs still open after a free ([`drain`]), health
//! quarantine ([`health`]), the running driver's files for `driver="host"`, cached ([`driver`]), the steps every front door drives ([`lifecycle`]), and the
//! error they report ([`error`]).

pub mod alloc;
pub mod drain;
pub mod driver;
pub mod error;
pub mod facts;
pub mod health;
pub mod lifecycle;
pub mod mps;
pub mod reconcile;
pub mod state;
