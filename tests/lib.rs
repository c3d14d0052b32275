//! Shared helpers for the cross-crate test suites.
