//! Unit tests of the pods module.
