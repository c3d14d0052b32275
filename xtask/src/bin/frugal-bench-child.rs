//! `frugal-bench-child --workload ID --batch N [--steps N] [--threads N] [--min-seconds S]`: the measuring
//! child of `cargo xtask bench memory` (which builds and runs it, one fresh process per row). A binary
//! apart from xtask so that its baseline RSS is that of the core and the workloads alone.
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match xtask::measure::memory_child(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("frugal-bench-child: {e}");
            ExitCode::FAILURE
        }
    }
}
