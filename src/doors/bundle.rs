//! The OCI side of a request (bytes in, values out, but for [`mod@file`]): what a bundle's
//! `config.json` asks for ([`parse`]), the edits that hand the reserved GPUs to the real
//! runtime ([`edit`]: `linux.devices`, `linux.resources.devices`, a `createRuntime` and a
//! `poststop` hook) and their undoing ([`strip`]), gpuhook's hooks ([`hooks`]), and the one
//! read and the atomic write of the file ([`mod@file`]). The runtime then makes the nodes and the
//! cgroup rules itself, in cgroup v1, v2 and through systemd alike. [`crate::doors::runtime`]
//! is the front door.

pub mod edit;
pub mod error;
pub mod file;
pub mod hooks;
mod json;
pub mod parse;
pub mod strip;
#[cfg(test)]
mod tests;
