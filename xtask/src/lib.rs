//! What xtask's binaries share. `frugal-bench-child` is the memory benchmark's measuring child: a binary
//! of its own that links only the core and the workloads, so the baseline it measures (the process
//! before training: code, libc, heap, the model, data and arena) is small and does not grow with xtask.
pub mod measure;
