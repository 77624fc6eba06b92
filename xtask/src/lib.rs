//! Developer tasks that are tested: the structure check.

pub mod structure;
