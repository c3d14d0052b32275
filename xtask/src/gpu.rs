//! `cargo xtask bench gpu [--placement] [--reps R]`: the wgpu tiled SGEMM on this machine's adapter
//! beside frugal's CPU SGEMM (or, with `--placement`, ms/step of all-CPU, all-GPU, the DP's measured
//! placement and alternating layers), measured by `hosts/wgpu/examples/bench_gpu.rs` in its own process (the xtask binary, whose
//! process the memory benchmark measures, does not link wgpu).
use std::process::Command;

pub fn main(args: &[String]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .args([
            "run",
            "--release",
            "-p",
            "frugal-wgpu",
            "--example",
            "bench_gpu",
            "--",
        ])
        .args(args)
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("the GPU benchmark failed ({st})"))
    }
}
