//! The host's GPUs, read from sysfs, the NVIDIA driver's procfs and the device nodes, under
//! the roots of the config (so a whole fake host can be described). Read at every hook run:
//! no daemon, no cache that can go stale.

mod devroot;
mod gpu;
mod nvidia;
mod passthrough;
mod pci;
mod probe;
mod scan;

pub use gpu::{Control, DevNode, Gpu, Inventory, InventoryError, Mig, PcieLink, Role};
pub use nvidia::{parse_nvidia_information, NvidiaInfo};
pub use passthrough::{
    functions_of_device, gpus_of_device, mdev_parent, DeviceGpu, MdevParentError,
};
pub use probe::{config_probe, own_nodes_of, probe, ProbeFailure};
pub use scan::{scan, scan_with, Scan};
