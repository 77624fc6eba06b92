//! OpenStack and monitoring: the host's GPUs as a Nova provider config for Placement
//! ([`placement`]) and as Prometheus metrics ([`metrics`]).

pub mod metrics;
pub mod placement;
