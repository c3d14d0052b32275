//! The PyTorch golden cases (`tests/golden`, made by `tests/golden/gen.py`) trained on the GPU backend:
//! 3 steps from PyTorch's initial weights reproduce PyTorch's losses and every weight after the third
//! step. Tolerance as the CPU's golden suite: 1e-5 relative, norm-wise per tensor — the GPU's GEMM sums
//! in tile order and WGSL's exp/log are a few ULP from correctly rounded, ~1e-7 after 3 steps.
//!
#![cfg(not(target_arch = "wasm32"))] // natively; the browser suite is tests/web.rs
mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use frugal_cli::checkpoint::load_safetensors;
use frugal_cli::spec_toml::load_model;
use frugal_core::exec::{Executor, Target};
use frugal_core::graph::Graph;
use frugal_core::plan::Plan;
use frugal_wgpu::gpu_plan;

const TOL: f64 = 1e-5;

fn rel(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "length");
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    num.sqrt() / den.sqrt().max(1e-30)
}

fn check_case(name: &str) {
    let Some(backend) = common::backend() else {
        return;
    };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden");
    let model = load_model(&dir.join(format!("{name}.toml"))).expect("golden model parses");
    let data: HashMap<String, (Vec<usize>, Vec<f32>)> =
        load_safetensors(&dir.join(format!("{name}.safetensors")))
            .expect("golden data loads")
            .into_iter()
            .map(|(n, s, v)| (n, (s, v)))
            .collect();
    let x = &data["x"].1;
    let y: Vec<u32> = data["y"].1.iter().map(|&v| v as u32).collect();
    let plan = gpu_plan(Plan::new(Graph::new(&model.spec, y.len()).expect("graph")));
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::with_backend(&plan, &arena, backend).expect("the GPU runs the case");
    let state: Vec<_> = ex.state_tensors().collect();
    for (pname, shape, t) in &state {
        let (s, v) = &data[&format!("init.{pname}")];
        assert_eq!(s, shape, "shape of {pname}");
        // Through the executor: a tensor in the GPU's space is written by its backend.
        ex.write(&mut arena, *t, v).unwrap();
    }
    for (step, &want) in data["losses"].1.iter().enumerate() {
        let stats = ex
            .train_step(&mut arena, x, Target::Classes(&y))
            .expect("step");
        let e = ((stats.loss - want) / want).abs() as f64;
        assert!(
            e <= TOL,
            "{name}: loss at step {} is {} but PyTorch has {want} (rel {e:.2e})",
            step + 1,
            stats.loss
        );
    }
    for (pname, _, t) in &state {
        let got = ex.read_vec(&mut arena, *t).unwrap();
        let e = rel(&got, &data[&format!("final.{pname}")].1);
        assert!(e <= TOL, "{name}: {pname} after 3 steps rel error {e:.2e}");
    }
}

#[test]
fn mlp_matches_pytorch_on_the_gpu() {
    check_case("mlp");
}

#[test]
fn small_cnn_matches_pytorch_on_the_gpu() {
    check_case("cnn");
}

#[test]
fn small_cnn_with_sgd_momentum_and_weight_decay_matches_pytorch_on_the_gpu() {
    check_case("cnn_sgd");
}

#[test]
fn residual_bn_cnn_matches_pytorch_on_the_gpu() {
    check_case("residual_bn");
}
