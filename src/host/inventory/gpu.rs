//! The GPU inventory's values: the GPUs, their nodes, MIG instances and links, what
//! controls them, and why a scan failed.

use crate::ids::{Pci, Unit, Vendor};
use crate::node::Node;
use crate::request::Capabilities;
use serde::Serialize;

/// The host's GPUs cannot be read at all (a GPU that cannot be used is a problem of that GPU,
/// not this).
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// The PCI devices directory (`SYSFS/bus/pci/devices`) cannot be listed.
    #[error("inventory: cannot list {}: {source}", path.display())]
    CannotList {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A host's device node: the [`Node`] a container gets (path in its `/dev`, number) and the
/// mode, as `stat` of the host node gives them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct DevNode {
    #[serde(flatten)]
    pub node: Node,
    /// Permission bits of the host node.
    #[serde(skip)]
    pub mode: u32,
}

impl std::ops::Deref for DevNode {
    type Target = Node;
    fn deref(&self) -> &Node {
        &self.node
    }
}

/// Why a node comes with a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `/dev/nvidiaN`
    Nvidia,
    /// `/dev/dri/renderD*`
    Render,
    /// `/dev/dri/card*`
    Card,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// Position in PCI address order among all GPUs found (excluded ones included).
    pub index: usize,
    pub pci: Pci,
    pub vendor: Vendor,
    pub vendor_id: u16,
    pub device_id: u16,
    pub model: String,
    pub arch: Option<String>,
    pub uuid: Option<String>,
    pub numa_node: Option<u32>,
    /// The PCI device (or root complex) the GPU hangs from: GPUs that share it are close.
    pub parent: Option<String>,
    /// The GPU's own nodes.
    pub nodes: Vec<(Role, DevNode)>,
    pub excluded: bool,
    /// Why this GPU cannot be given to a container (driver missing, node missing, …).
    pub problem: Option<String>,
    /// Driver details not read yet (lazy scan); see [`Inventory::settle`].
    pub pending: bool,
    /// The PCI driver bound to it (`nvidia`, `amdgpu`, `vfio-pci`, …).
    pub driver: Option<String>,
    /// Its MIG compute instances (read with the NVIDIA driver's details): while it has any,
    /// they are the units it is handed out in, never the whole GPU.
    pub migs: Vec<Mig>,
    /// Its PCIe link, read for listings only.
    pub link: Option<PcieLink>,
    /// Whether the host config lets it be shared (docs/guides/sharing.md): then it is only ever
    /// given as one of its slots, never whole.
    pub sharing: Option<crate::host::config::Sharing>,
}

/// A MIG compute instance: the parent GPU's node plus the access capabilities of its GPU
/// instance and compute instance (`/dev/nvidia-caps/nvidia-cap<m>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mig {
    pub gi: u32,
    pub ci: u32,
    pub gi_cap: DevNode,
    pub ci_cap: DevNode,
}

impl Mig {
    /// The instance as a unit of GPU `pci` (named `0000:3b:00.0/gi1/ci0`).
    pub fn id(&self, pci: Pci) -> Unit {
        Unit::Mig {
            pci,
            gi: self.gi,
            ci: self.ci,
        }
    }
}

/// A PCIe link as sysfs shows it (`current_link_speed` `16.0 GT/s PCIe`, `…_width` `16`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PcieLink {
    pub speed: String,
    pub max_speed: String,
    pub width: u32,
    pub max_width: u32,
}

impl PcieLink {
    fn gts(s: &str) -> Option<f64> {
        s.split_whitespace().next()?.parse().ok()
    }

    /// Below its maximum speed or width. (An idle NVIDIA GPU lowers its link speed to save
    /// power, so a slow link is shown, never held against the GPU.)
    pub fn degraded(&self) -> bool {
        self.width < self.max_width
            || matches!((Self::gts(&self.speed), Self::gts(&self.max_speed)), (Some(a), Some(b)) if a < b)
    }
}

impl std::fmt::Display for PcieLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let short = |s: &str| s.trim_end_matches(" PCIe").to_owned();
        write!(
            f,
            "PCIe {} x{} of {} x{}",
            short(&self.speed),
            self.width,
            short(&self.max_speed),
            self.max_width
        )
    }
}

impl Gpu {
    pub fn usable(&self) -> bool {
        !self.excluded && self.problem.is_none()
    }

    /// The GPU's nodes a container gets with the given capabilities.
    pub fn nodes_for(&self, caps: Capabilities) -> impl Iterator<Item = &DevNode> {
        self.nodes
            .iter()
            .filter(move |(role, _)| match (self.vendor, role) {
                (Vendor::Nvidia, Role::Nvidia) => true,
                (Vendor::Nvidia, _) => caps.graphics,
                (_, Role::Render) => true,
                (_, Role::Card) => caps.graphics,
                (_, Role::Nvidia) => false,
            })
            .map(|(_, n)| n)
    }

    /// The nodes a holder of its MIG instance `m` gets: the GPU's `/dev/nvidiaN` (none of its
    /// DRM nodes, which every holder of an instance would share), then the instance's two
    /// access capabilities.
    pub fn mig_nodes<'a>(&'a self, m: &'a Mig) -> impl Iterator<Item = &'a DevNode> {
        self.nodes
            .iter()
            .filter(|(r, _)| *r == Role::Nvidia)
            .map(|(_, n)| n)
            .chain([&m.gi_cap, &m.ci_cap])
    }

    /// The GPU's own nodes (`/dev/nvidiaN`, its DRM nodes): what a free or detach looks
    /// for in processes' descriptors.
    pub fn own_nodes(&self) -> Vec<crate::node::Node> {
        self.nodes.iter().map(|(_, n)| n.node.clone()).collect()
    }

    /// Every node of the GPU, for listings.
    pub fn paths(&self) -> Vec<String> {
        self.nodes.iter().map(|(_, n)| n.path.clone()).collect()
    }
}

/// Shared control nodes: one set per host, granted with a container's first GPU of the vendor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    NvidiaCtl,
    NvidiaUvm,
    NvidiaUvmTools,
    NvidiaModeset,
    Kfd,
}

impl Control {
    pub(super) const ALL: [(Control, &'static str); 5] = [
        (Control::NvidiaCtl, "nvidiactl"),
        (Control::NvidiaUvm, "nvidia-uvm"),
        (Control::NvidiaUvmTools, "nvidia-uvm-tools"),
        (Control::NvidiaModeset, "nvidia-modeset"),
        (Control::Kfd, "kfd"),
    ];

    fn wanted(self, vendor: Vendor, caps: Capabilities) -> bool {
        match (self, vendor) {
            (Control::NvidiaCtl, Vendor::Nvidia) => true,
            (Control::NvidiaUvm | Control::NvidiaUvmTools, Vendor::Nvidia) => caps.compute,
            (Control::NvidiaModeset, Vendor::Nvidia) => caps.graphics,
            (Control::Kfd, Vendor::Amd) => caps.compute,
            _ => false,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Inventory {
    pub gpus: Vec<Gpu>,
    pub controls: Vec<(Control, DevNode)>,
    /// PCI functions a lazy scan did not look at: unbound or passthrough functions of a GPU
    /// vendor, which may be GPUs that cannot be used. A full scan has none.
    pub deferred: usize,
}

impl Inventory {
    /// The GPU of a PCI address.
    pub fn by_pci(&self, pci: &str) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.pci == pci)
    }

    /// The GPU of a reserved unit (a MIG instance's is its GPU).
    pub fn by_unit(&self, unit: &Unit) -> Option<&Gpu> {
        let pci = unit.pci();
        self.gpus.iter().find(|g| g.pci == pci)
    }

    /// The MIG instance a unit names, with its GPU.
    pub fn mig(&self, unit: &Unit) -> Option<(&Gpu, &Mig)> {
        let Unit::Mig { pci, gi, ci } = *unit else {
            return None;
        };
        let g = self.gpus.iter().find(|g| g.pci == pci)?;
        g.migs
            .iter()
            .find(|m| m.gi == gi && m.ci == ci)
            .map(|m| (g, m))
    }

    /// Every node a container holding `gpus` (its units) gets: the GPUs' own nodes, then
    /// the control nodes their vendors need for the capabilities, each once, in a stable order.
    pub fn nodes_for(&self, gpus: &[Unit], caps: Capabilities) -> Vec<DevNode> {
        let chosen: Vec<&Gpu> = gpus.iter().filter_map(|u| self.by_unit(u)).collect();
        let mut out: Vec<DevNode> = Vec::new();
        for u in gpus {
            let Some(g) = self.by_unit(u) else { continue };
            if let Some((_, m)) = self.mig(u) {
                out.extend(g.mig_nodes(m).cloned());
                continue;
            }
            out.extend(g.nodes_for(caps).cloned());
        }
        for (ctl, node) in &self.controls {
            if chosen.iter().any(|g| ctl.wanted(g.vendor, caps)) {
                out.push(node.clone());
            }
        }
        let mut seen = std::collections::HashSet::new();
        out.retain(|n| seen.insert(n.path.clone()));
        out
    }
}
