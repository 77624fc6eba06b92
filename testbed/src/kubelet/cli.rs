//! `gpuhook-testbed kubelet …`.
