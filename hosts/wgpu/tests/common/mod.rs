//! What the GPU suites share: the adapter (opened once per test binary) and deterministic data.
#![allow(dead_code)] // each suite uses a part

use frugal_wgpu::{Gpu, GpuError};

/// The machine's adapter, or None with *skipped* on stderr; with `FRUGAL_REQUIRE_GPU=1` (the `gpu` leg
/// of `cargo xtask test`, where setup installed lavapipe) a missing adapter fails the test instead.
pub fn gpu() -> Option<&'static Gpu> {
    static GPU: std::sync::OnceLock<Result<Gpu, GpuError>> = std::sync::OnceLock::new();
    match GPU.get_or_init(Gpu::open) {
        Ok(g) => Some(g),
        Err(e) => {
            let required = std::env::var("FRUGAL_REQUIRE_GPU").is_ok_and(|v| v == "1");
            assert!(!required, "FRUGAL_REQUIRE_GPU=1 but: {e}");
            // Straight to stderr, past the harness's capture, once per suite: the skip shows in every
            // `cargo test` run.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "skipped: the wgpu suites: {e}");
            });
            None
        }
    }
}

/// `len` xorshift values from `seed`, as raw 24-bit fractions in [0, 1).
fn unit(len: usize, seed: u64) -> impl Iterator<Item = f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len).map(move |_| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    })
}

/// `len` values in [-scale, scale).
pub fn data(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    unit(len, seed).map(|u| (u * 2.0 - 1.0) * scale).collect()
}

/// `len` values on a grid of quarter steps in [-2, 2): ties are common.
pub fn grid(len: usize, seed: u64) -> Vec<f32> {
    unit(len, seed)
        .map(|u| (u * 16.0).floor() / 4.0 - 2.0)
        .collect()
}

/// Norm-wise closeness: ‖gpu − cpu‖₂ ≤ `rel`·‖cpu‖₂ (each suite says why its `rel` holds).
pub fn close_norm(what: &str, gpu: &[f32], cpu: &[f32], rel: f64) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths");
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    let d = norm(&mut gpu.iter().zip(cpu).map(|(&a, &b)| (a - b) as f64));
    let n = norm(&mut cpu.iter().map(|&b| b as f64));
    assert!(
        d <= rel * n.max(1e-30),
        "{what}: ‖Δ‖ = {d:e}, ‖cpu‖ = {n:e}"
    );
}

/// A GPU backend on its own device, or None (skipped, as [`gpu`]).
pub fn backend() -> Option<frugal_wgpu::GpuBackend> {
    gpu()?;
    Some(frugal_wgpu::GpuBackend::open().expect("a second device on the adapter that opened"))
}

/// Asserts that between two readings of wgpu's own counters no buffer, bind group, compute pipeline or
/// pipeline layout was created and no buffer memory allocated — and that the counters are on.
pub fn assert_no_new_gpu_objects(before: &wgpu::InternalCounters, after: &wgpu::InternalCounters) {
    let (a, b) = (&before.hal, &after.hal);
    let same =
        |what: &str, x: isize, y: isize| assert_eq!(x, y, "{what} after the first step vs later");
    same("buffers", a.buffers.read(), b.buffers.read());
    same("bind groups", a.bind_groups.read(), b.bind_groups.read());
    same(
        "compute pipelines",
        a.compute_pipelines.read(),
        b.compute_pipelines.read(),
    );
    same(
        "pipeline layouts",
        a.pipeline_layouts.read(),
        b.pipeline_layouts.read(),
    );
    same(
        "buffer memory",
        a.buffer_memory.read(),
        b.buffer_memory.read(),
    );
    assert!(a.bind_groups.read() > 0, "wgpu's counters are on");
}
