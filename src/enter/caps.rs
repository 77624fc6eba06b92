//! Lowering this process's capabilities to what a step needs ([`keep_only`]): the container
//! helper's and the CDI work's in a container's root.

use serde::{Deserialize, Serialize};

/// Why this process's capabilities could not be lowered (`0`: what the caps crate said; its
/// error is neither `Clone` nor serde).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum CapsError {
    #[error("reading capabilities: {0}")]
    Read(String),
    #[error("dropping capabilities: {0}")]
    Drop(String),
}

/// Keeps of this process's capabilities only `want` (those it has), effective and
/// permitted; none inheritable.
pub fn keep_only(want: &[caps::Capability]) -> Result<(), CapsError> {
    use caps::CapSet;
    // (The caps crate's errors are text: said as they are.)
    let have = caps::read(None, CapSet::Permitted).map_err(|e| CapsError::Read(e.to_string()))?;
    let keep: caps::CapsHashSet = want.iter().filter(|c| have.contains(c)).copied().collect();
    let dropping = |e: caps::errors::CapsError| CapsError::Drop(e.to_string());
    caps::set(None, CapSet::Effective, &keep).map_err(dropping)?;
    caps::set(None, CapSet::Permitted, &keep).map_err(dropping)?;
    caps::clear(None, CapSet::Inheritable).map_err(dropping)?;
    Ok(())
}
