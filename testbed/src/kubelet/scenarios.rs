//! The kubelet bed's scenarios (filled in below).
