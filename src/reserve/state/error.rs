//! Why a state file is not used: what makes it corrupt, and what makes its file, directory or
//! lock unsafe to use (the causes the state's errors name).

use crate::ids::Unit;

/// What makes a state file corrupt.
#[derive(Debug, thiserror::Error)]
pub enum Corruption {
    #[error("reservation key {key} is not its holder's ({holder}: {its})")]
    NotItsKey {
        key: String,
        holder: String,
        its: super::holder::HolderKey,
    },
    #[error("two reservations are {holder}'s (key {key})")]
    TwiceKeyed {
        key: super::holder::HolderKey,
        holder: String,
    },
    #[error("{unit} is in two reservations, {first} and {second}")]
    TwiceReserved {
        unit: Unit,
        first: String,
        second: String,
    },
    #[error("{0}")]
    Json(serde_json::Error),
}

/// Why the state's file, directory or lock is not used.
#[derive(Debug, thiserror::Error)]
pub enum Unsafety {
    #[error("not a directory")]
    NotDirectory,
    #[error("not a regular file")]
    NotRegularFile,
    #[error("owned by uid {owner}, not {euid}")]
    Owner { owner: u32, euid: u32 },
    #[error("mode {mode:04o} lets group or others write it")]
    Writable { mode: u32 },
    #[error("is a symlink or not a directory")]
    SymlinkOrNotDirectory,
    #[error("is a symlink")]
    Symlink,
}
