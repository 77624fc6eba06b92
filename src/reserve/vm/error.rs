//! Why a virtual machine does not get the GPUs its hostdevs name ([`VmError`]): each refusal
//! names the GPU, the hostdevs that name it and, when it is held, its holder.

use crate::host::inventory::MdevParentError;
use crate::ids::{Pci, Unit};

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// A GPU passed through whole and as one of its mediated devices at once.
    #[error("GPU {pci} is passed through whole ({whole}) and as a mediated device ({mdev}): a GPU goes to a VM either whole or as mediated devices")]
    WholeAndMdev {
        pci: Pci,
        whole: String,
        mdev: String,
    },
    #[error(transparent)]
    MdevParent(#[from] MdevParentError),
    #[error("GPU {pci} ({by}) is excluded by the host config")]
    Excluded { pci: Pci, by: String },
    #[error("GPU {pci} ({by}) cannot be used: {problem}")]
    Unusable {
        pci: Pci,
        by: String,
        problem: String,
    },
    #[error("GPU {pci} ({by}) is held by {holder}")]
    Held {
        pci: Pci,
        by: String,
        holder: String,
    },
    /// Another running VM has it, by libvirt's status XML, with no reservation.
    #[error("GPU {pci} ({by}) is passed through to {vm}, which runs (libvirt's status XML; not reserved through gpuhook)")]
    PassedThrough { pci: Pci, by: String, vm: String },
    #[error("GPU {pci} ({by}) is shared by the host config ({replicas} slots): it is given to containers as slots, never whole to a VM")]
    Shareable { pci: Pci, by: String, replicas: u32 },
    /// A mediated device's GPU is held by someone who is not a VM's mediated device.
    #[error("GPU {pci} ({by}) is held by {holder}: its mediated devices go to VMs only while no one else holds it")]
    MdevOnHeld {
        pci: Pci,
        by: String,
        holder: String,
    },
    #[error("{unit} ({by}) is held by {holder}")]
    MdevHeld {
        unit: Unit,
        by: String,
        holder: String,
    },
    /// `start`/`started`: the reservation `prepare` made is gone.
    #[error("its GPUs are not reserved any more ({units} were asked; released or reclaimed since prepare)")]
    NotReserved { units: String },
    /// A `<gpu:gpus>` element: a container's request, which a VM cannot make.
    #[error("a <gpu:gpus> request in <metadata> is for containers; a VM gets GPUs as <hostdev> elements: write them with 'gpuhook-libvirt request {name} --count N' (or by hand)")]
    GpuhookRequest { name: String },
    /// `started`: libvirt's pid file of the VM names no live process.
    #[error("started: its QEMU process is not found ({} names none that runs; config libvirt_qemu_dir): without it the VM's GPUs would be taken for free once libvirtd restarts", pidfile.display())]
    NoQemu { pidfile: std::path::PathBuf },
    /// `migrate` of a VM with GPUs passed through.
    #[error("migrate: it passes GPUs through ({units}): a VM holding GPUs is not migrated")]
    Migrate { units: String },
}
