//! NVIDIA MPS control daemons for GPUs shared in `mps` mode (docs/guides/sharing.md, "MPS"): one per
//! GPU, started when its first slot is reserved and told to `quit` when its last is freed.
//!
//! Layout, beside the state file: `mps/<UUID>/pipe` (the daemon's pipe directory, 0755:
//! the daemon makes its own control and client pipes in it, with the modes it chooses),
//! `mps/<UUID>/log` (0755) and `mps/<UUID>/shm` (1777, as `/dev/shm`: clients in containers,
//! any user, create their segments there). All are root's. The daemon runs in a mount
//! namespace of its own where `shm` is bind-mounted over `/dev/shm`; each sharer's container
//! gets `pipe` at `/tmp/nvidia-mps` and `shm` at `/dev/shm`.
//!
//! - [`daemon`]: what the state records of a daemon, its directories, a sharer's mounts;
//! - [`plan`]: what is decided on the state alone (start, stop, sweep), and stopping;
//! - [`start`]: a start in two locked steps with the daemon's start between them, outside
//!   the state lock;
//! - [`work`]: the host work ([`Mps`]), passed in through the lifecycle's facts;
//! - [`nvidia`]: the real daemons ([`NvidiaMps`]);
//! - [`error`]: why a daemon could not be started or stopped.

pub mod daemon;
pub mod error;
pub mod nvidia;
pub mod plan;
pub mod start;
pub mod work;

#[cfg(test)]
mod tests;

pub use daemon::{
    dir_for, is_target, limit_commands, mounts, Daemon, CONTAINER_PIPE, CONTAINER_SHM, DEADLINE,
    PID_FILE,
};
pub use error::MpsError;
pub use nvidia::NvidiaMps;
pub use plan::{daemon_for, finish_stops, mps_gpus, plan, stop_unused, DaemonPlan, Stop, Stops};
pub use start::{bring_up, claim, Up};
pub use work::{Mps, Swept};
