//! The world a lifecycle step works in, passed in (as youki's `syscall` trait is) so that each
//! step is unit-tested over doubles that record what they were asked: what it reads (the
//! config, the `/proc` to read processes from, the GPU inventory, the CDI specs, the running
//! driver's files for `driver="host"`, whether a libvirt controller runs) and the actors that
//! change things for it (the container's device cgroup and its service manager's device
//! policy, the work inside the container, the MPS daemons). [`World::real`] is this host,
//! [`RealEnter`] its real work inside containers.

use crate::cdi;
use crate::cgroup::{self, CgroupError, DeviceCgroup, ManagedPolicy};
use crate::enter::container::{self, Container, ContainerError, ContainerMade as Made};
use crate::enter::devdir::Bound;
use crate::enter::rootfs::{Done, Mounted, Owner};
use crate::host::config::Config;
use crate::host::inventory::{self, Inventory, InventoryError, Scan};
use crate::host::procfs::{self, Proc};
use crate::leftovers::Leftovers;
use crate::node::NodeSpec;
use std::path::PathBuf;

/// The work gpuhook does inside a running container (a helper that enters its mount
/// namespace): its nodes, and the CDI driver files in its root.
pub trait Enter {
    /// Creates the nodes in the container's `/dev`; on failure none is left.
    fn create_nodes(&self, ct: &Container, nodes: &[NodeSpec]) -> Result<Made, ContainerError>;
    /// Removes nodes (and directories) this gpuhook created; in a user-namespaced container
    /// their mounts (`bound`: those gpuhook made).
    fn remove_nodes(
        &self,
        ct: &Container,
        nodes: &[NodeSpec],
        dirs: &[String],
        bound: &[Bound],
    ) -> Result<(), ContainerError>;
    /// Applies a CDI plan's mounts, links and linker cache in the container's root.
    fn inject(
        &self,
        ct: &Container,
        plan: &cdi::Plan,
        owner: Owner,
    ) -> Result<Done, ContainerError>;
    /// Takes back what `inject` did; returns what could not be.
    fn uninject(
        &self,
        ct: &Container,
        done: &Done,
        owner: Owner,
    ) -> Result<Leftovers, ContainerError>;
    /// The mounts of `mounted` no longer in place in the container.
    fn check_mounts(
        &self,
        ct: &Container,
        mounted: &[Mounted],
    ) -> Result<Vec<String>, ContainerError>;
}

/// The real work inside containers: [`crate::enter::container`].
pub struct RealEnter;

impl Enter for RealEnter {
    fn create_nodes(&self, ct: &Container, nodes: &[NodeSpec]) -> Result<Made, ContainerError> {
        container::create_nodes(ct, nodes)
    }
    fn remove_nodes(
        &self,
        ct: &Container,
        nodes: &[NodeSpec],
        dirs: &[String],
        bound: &[Bound],
    ) -> Result<(), ContainerError> {
        container::remove_nodes(ct, nodes, dirs, bound)
    }
    fn inject(
        &self,
        ct: &Container,
        plan: &cdi::Plan,
        owner: Owner,
    ) -> Result<Done, ContainerError> {
        container::inject(ct, plan, owner)
    }
    fn uninject(
        &self,
        ct: &Container,
        done: &Done,
        owner: Owner,
    ) -> Result<Leftovers, ContainerError> {
        container::uninject(ct, done, owner)
    }
    fn check_mounts(
        &self,
        ct: &Container,
        mounted: &[Mounted],
    ) -> Result<Vec<String>, ContainerError> {
        container::check_mounts(ct, mounted)
    }
}

/// Reads the host's GPUs (the real one: [`inventory::scan_with`]).
pub type ScanFn<'a> = &'a dyn Fn(&Config, Scan) -> Result<Inventory, InventoryError>;
/// The device cgroup of a running container (the real one: [`cgroup::for_container`]).
pub type CgroupFn<'a> =
    &'a dyn Fn(&Config, &Container) -> Result<Box<dyn DeviceCgroup>, CgroupError>;

/// The device rules a service manager keeps for a running container's cgroup, where it keeps
/// any (the real one: [`cgroup::managed_policy`], systemd's scope of its init's cgroup).
pub type ManagerFn<'a> =
    &'a dyn Fn(&Config, &Container) -> Result<Option<Box<dyn ManagedPolicy>>, CgroupError>;

/// Reads the CDI specs of these kinds from these directories (the real one: [`cdi::load`]).
pub type CdiSpecsFn<'a> =
    &'a dyn Fn(&[PathBuf], &[&str]) -> Result<Vec<cdi::Loaded>, cdi::LoadError>;

/// The running driver's user space on the host, for `driver="host"` (the real one:
/// [`crate::reserve::driver::host_driver`], cached under the state directory).
pub type HostDriverFn<'a> =
    &'a dyn Fn(
        &Config,
    ) -> Result<crate::reserve::driver::Discovered, crate::host::driver::DriverError>;

fn real_host_driver(
    cfg: &Config,
) -> Result<crate::reserve::driver::Discovered, crate::host::driver::DriverError> {
    crate::reserve::driver::host_driver(cfg).map(|(d, _)| d)
}

/// Everything a lifecycle step reads or changes outside the state file: what it reads, and
/// the actors that change things (`cgroup`, `manager`, `enter`, `mps`).
#[derive(Clone, Copy)]
pub struct World<'a> {
    /// The config, loaded once by the front door (never inside a step).
    pub cfg: &'a Config,
    /// Where processes are read (liveness of inits, reservers, openers of GPUs).
    pub proc: Proc<'a>,
    /// Reads the host's GPUs.
    pub scan: ScanFn<'a>,
    /// Actor: opens the container's device cgroup, which grants and revokes.
    pub cgroup: CgroupFn<'a>,
    /// Actor: opens systemd's device policy of the container's scope (attach and detach
    /// change it too).
    pub manager: ManagerFn<'a>,
    /// Actor: the work inside the container (nodes, driver files).
    pub enter: &'a dyn Enter,
    /// Reads the CDI specs.
    pub cdi_specs: CdiSpecsFn<'a>,
    /// Whether libvirt's controller for a domain (by name) runs.
    pub controller_running: &'a dyn Fn(&str) -> bool,
    /// Actor: starts and stops the MPS control daemons of GPUs shared with MPS.
    pub mps: &'a dyn crate::reserve::mps::Mps,
    /// Reads the running driver's files on the host (`driver="host"`).
    pub host_driver: HostDriverFn<'a>,
    /// The door's own process (left out where a step looks for processes holding a GPU).
    pub me: i32,
    /// Who asked (the door's real uid), for the log.
    pub uid: u32,
}

fn real_cgroup(_: &Config, ct: &Container) -> Result<Box<dyn DeviceCgroup>, CgroupError> {
    cgroup::for_container(ct.controller, ct.init.pid)
}

fn real_manager(
    cfg: &Config,
    ct: &Container,
) -> Result<Option<Box<dyn ManagedPolicy>>, CgroupError> {
    cgroup::managed_policy(ct.init.pid, cfg.state_dir())
}

impl<'a> World<'a> {
    /// This host: its `/proc`, sysfs, cgroups and containers.
    pub fn real(cfg: &'a Config) -> World<'a> {
        World {
            cfg,
            proc: procfs::REAL,
            scan: &inventory::scan_with,
            cgroup: &real_cgroup,
            manager: &real_manager,
            enter: &RealEnter,
            cdi_specs: &cdi::load,
            controller_running: &crate::reserve::reconcile::controller_running,
            mps: &crate::reserve::mps::NvidiaMps,
            host_driver: &real_host_driver,
            me: std::process::id() as i32,
            uid: nix::unistd::getuid().as_raw(),
        }
    }
}
