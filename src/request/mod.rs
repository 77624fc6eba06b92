//! What a container asks for, whichever front door it came through: the domain XML's
//! attributes and `device` children, the blueprint's extra_specs (see [`metadata`]), OCI
//! annotations and env ([`oci`]) and Nova's flavor metadata ([`extra_specs`]); the one
//! attribute grammar they share ([`attrs`]). Choosing GPUs
//! (`reserve::alloc`) and the lifecycle (`reserve::lifecycle`) see only this.

pub(crate) mod attrs;
pub mod extra_specs;
pub mod hostdev;
pub mod metadata;
pub mod oci;

use extra_specs::Op;
use std::fmt;

/// Which GPU property a filter looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Vendor,
    Arch,
    Model,
}

impl Field {
    pub fn name(self) -> &'static str {
        match self {
            Field::Vendor => "vendor",
            Field::Arch => "arch",
            Field::Model => "model",
        }
    }
}

/// One constraint every chosen GPU must meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub field: Field,
    pub op: Op,
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.field.name(), self.op)
    }
}

/// The words a request was written in, by the door it came through: a refusal that says
/// what to ask for instead (MIG instances, a shared GPU's slot, a GPU whole) says it in them.
/// The allocator words its refusals in the domain XML's; each other door sets its own on the
/// refusal before it is shown (`reserve::alloc::AllocError::in_words`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wording {
    /// The domain XML's attributes (`mig='yes'`): the LXC hook, Nova's flavors through it.
    #[default]
    Xml,
    /// An OCI bundle's annotations (`gpuhook.io/mig: "yes"`).
    Annotation,
    /// An OCI bundle's `process.env` (`GPUHOOK_MIG=yes`).
    Env,
    /// An operator's command-line options (`gpuhook attach --mig`).
    Flag,
    /// A virtual machine's request (`gpuhook-libvirt request VM`): whole GPUs only.
    Vm,
}

/// An exact GPU named by a `<gpu:device>` child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSel {
    Pci(String),
    Uuid(String),
    Index(u32),
}

impl fmt::Display for DeviceSel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSel::Pci(p) => write!(f, "pci {p}"),
            DeviceSel::Uuid(u) => write!(f, "uuid {u}"),
            DeviceSel::Index(i) => write!(f, "index {i}"),
        }
    }
}

/// A MIG compute instance named by a `<gpu:mig>` child: its GPU, GPU instance (`gi`) and
/// compute instance (`ci`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigSel {
    pub gpu: DeviceSel,
    pub gi: u32,
    pub ci: u32,
}

impl fmt::Display for MigSel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MIG {} gi {} ci {}", self.gpu, self.gi, self.ci)
    }
}

/// Which control and extra nodes come with the GPUs (`capabilities`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    pub compute: bool,
    pub utility: bool,
    pub graphics: bool,
    pub video: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            compute: true,
            utility: true,
            graphics: false,
            video: false,
        }
    }
}

/// What is wrong with a `capabilities` or `driver` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WordError {
    #[error("empty entry in capabilities '{0}'")]
    EmptyCapability(String),
    #[error("unknown capability '{0}' (known: compute, utility, graphics, video)")]
    UnknownCapability(String),
    #[error("capabilities is empty")]
    NoCapabilities,
    #[error("unknown driver '{0}' (known: none, cdi, host)")]
    UnknownDriver(String),
}

impl Capabilities {
    pub fn parse(s: &str) -> Result<Self, WordError> {
        let mut c = Capabilities {
            compute: false,
            utility: false,
            graphics: false,
            video: false,
        };
        let mut any = false;
        for word in s.split(',').map(str::trim) {
            match word {
                "compute" => c.compute = true,
                "utility" => c.utility = true,
                "graphics" => c.graphics = true,
                "video" => c.video = true,
                "" => return Err(WordError::EmptyCapability(s.to_string())),
                other => return Err(WordError::UnknownCapability(other.to_string())),
            }
            any = true;
        }
        if !any {
            return Err(WordError::NoCapabilities);
        }
        Ok(c)
    }
}

/// What a domain asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub count: u32,
    pub filters: Vec<Filter>,
    pub devices: Vec<DeviceSel>,
    pub capabilities: Capabilities,
    /// Permission bits of the created nodes; `None`: the host node's.
    pub mode: Option<u32>,
    /// Container-side owner of the created nodes (mapped through `<idmap>`).
    pub uid: u32,
    pub gid: u32,
    /// MIG compute instances instead of whole GPUs (`mig="yes"`): `count` of them, from
    /// GPUs that match the filters, and the exact ones of `migs`.
    pub mig: bool,
    pub migs: Vec<MigSel>,
    /// The host driver's user space (`driver="cdi"`); `None`: the host config's default.
    pub driver: Option<Driver>,
    /// Slots of shareable GPUs instead of whole GPUs (`share="yes"`, docs/guides/sharing.md):
    /// `count` of them, each on a different GPU.
    pub share: bool,
}

impl Default for Request {
    /// One whole GPU, any, with the default capabilities (`compute,utility`), nodes as the
    /// host's: what a request that says nothing more asks for.
    fn default() -> Self {
        Request {
            count: 1,
            filters: Vec::new(),
            devices: Vec::new(),
            capabilities: Capabilities::default(),
            mode: None,
            uid: 0,
            gid: 0,
            mig: false,
            migs: Vec::new(),
            driver: None,
            share: false,
        }
    }
}

/// What of the host driver a container gets besides its GPUs' nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Driver {
    /// The nodes only (a container that shares the host's root filesystem has the rest).
    #[default]
    None,
    /// The vendor's CDI spec: driver libraries, binaries, firmware mounted in, its hooks.
    Cdi,
    /// The running driver's user space, found on the host by gpuhook at each start (NVIDIA:
    /// the kernel module's version, its libraries through `ld.so.cache`, firmware, programs,
    /// sockets, ICD files); AMD and Intel: their nodes, as `none`.
    Host,
}

impl Driver {
    /// The word requests and the state use (`none`, `cdi`, `host`).
    pub fn as_str(self) -> &'static str {
        match self {
            Driver::None => "none",
            Driver::Cdi => "cdi",
            Driver::Host => "host",
        }
    }

    pub fn parse(v: &str) -> Result<Driver, WordError> {
        match v.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(Driver::None),
            "cdi" => Ok(Driver::Cdi),
            "host" => Ok(Driver::Host),
            other => Err(WordError::UnknownDriver(other.to_string())),
        }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}{}",
            self.count,
            if self.mig {
                "MIG instance"
            } else if self.share {
                "shared GPU slot"
            } else {
                "GPU"
            },
            if self.count == 1 { "" } else { "s" }
        )?;
        for flt in &self.filters {
            write!(f, ", {flt}")?;
        }
        for d in &self.devices {
            write!(f, ", {d}")?;
        }
        for m in &self.migs {
            write!(f, ", {m}")?;
        }
        match self.driver {
            Some(Driver::Cdi) => write!(f, ", driver cdi")?,
            Some(Driver::Host) => write!(f, ", driver host")?,
            _ => {}
        }
        Ok(())
    }
}

/// One `<uid>` or `<gid>` line of `<idmap>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    pub start: u32,
    pub target: u32,
    pub count: u32,
}

/// A container user or group the id mapping does not map (`by` names the mapping).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{which} {id} is not mapped by {by}")]
pub struct Unmapped {
    /// `uid` or `gid`.
    pub which: &'static str,
    pub id: u32,
    pub by: &'static str,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdMap {
    pub uid: Vec<IdRange>,
    pub gid: Vec<IdRange>,
}

fn map_id(ranges: &[IdRange], id: u32) -> Option<u32> {
    if ranges.is_empty() {
        return Some(id);
    }
    ranges
        .iter()
        .find(|r| id >= r.start && (id - r.start) < r.count)
        .and_then(|r| r.target.checked_add(id - r.start))
}

impl IdMap {
    /// The host owner of nodes the container sees owned by `uid`:`gid`: the one id-mapping
    /// check of every front door. `what` names the mapping in the error (`<idmap>`,
    /// `linux.uidMappings`…): `uid 7 is not mapped by the domain's <idmap>`.
    pub fn owner(
        &self,
        uid: u32,
        gid: u32,
        what: (&'static str, &'static str),
    ) -> Result<(u32, u32), Unmapped> {
        let u = self.host_uid(uid).ok_or(Unmapped {
            which: "uid",
            id: uid,
            by: what.0,
        })?;
        let g = self.host_gid(gid).ok_or(Unmapped {
            which: "gid",
            id: gid,
            by: what.1,
        })?;
        Ok((u, g))
    }

    /// Host uid of container uid `id` (identity without `<idmap>`).
    pub fn host_uid(&self, id: u32) -> Option<u32> {
        map_id(&self.uid, id)
    }
    pub fn host_gid(&self, id: u32) -> Option<u32> {
        map_id(&self.gid, id)
    }
}
