//! The bounds of what the domain XML's reader accepts (and how errors name the id mapping).

/// Upper bound on the domain XML the hook accepts (libvirt's own limit is 10 MiB).
pub const MAX_XML: usize = 16 << 20;
/// How errors name a domain's id mapping.
pub const IDMAP: &str = "the domain's <idmap>";
pub(crate) const MAX_DEVICES: usize = 256;
pub(crate) const MAX_EXTRA_SPECS: usize = 64;
pub(crate) const MAX_VALUE: usize = 256;
