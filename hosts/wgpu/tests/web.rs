//! The GPU backend in the browser, on WebGPU (headless Chromium with `--enable-unsafe-webgpu`: Dawn on
//! SwiftShader; `cargo xtask web --test` runs it through wasm-bindgen-test): whole training steps of an
//! MLP, a CNN and a BatchNorm CNN match the CPU backend in the same page, as natively
//! (`tests/backend.rs`; the same tolerance and reasons). Each step's loss is awaited
//! (`GpuBackend::loss`): the browser maps the read-back only when its event loop runs.
#![cfg(target_arch = "wasm32")]

mod models;

use frugal_core::backend::CpuBackend;
use frugal_core::exec::{Executor, Target};
use frugal_core::model::{LossKind, ModelSpec};
use frugal_core::plan::Plan;
use frugal_wgpu::{gpu_plan, GpuBackend};
use models::{batch, bn_cnn, cnn, mlp, plan, target, ADAM, SGD};
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

/// The page's WebGPU adapter, or None with *skipped* in the log (a browser without WebGPU); built with
/// `FRUGAL_REQUIRE_GPU=1` (the xtask's browser run) a missing adapter fails instead.
async fn backend() -> Option<GpuBackend> {
    match GpuBackend::open_async().await {
        Ok(b) => {
            console_log!("WebGPU adapter: {}", b.gpu().adapter());
            Some(b)
        }
        Err(e) => {
            assert!(
                option_env!("FRUGAL_REQUIRE_GPU") != Some("1"),
                "FRUGAL_REQUIRE_GPU=1 but: {e}"
            );
            console_log!("skipped: no WebGPU adapter in this browser: {e}");
            None
        }
    }
}

/// Losses of `steps` steps and the final state on the CPU backend.
fn on_cpu(
    p: &Plan,
    spec: &ModelSpec,
    n: usize,
    steps: usize,
    outs: usize,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let mut arena = vec![0u8; p.needed_bytes()];
    let mut ex = Executor::with_backend(p, &arena, CpuBackend::new()).unwrap();
    ex.init_params(&mut arena, 3).unwrap();
    let losses = (0..steps)
        .map(|s| {
            let (x, y, t) = batch(spec, n, s as u64, outs);
            ex.train_step(&mut arena, &x, target(spec.loss, &y, &t))
                .unwrap()
                .loss
        })
        .collect();
    let state = ex
        .state_tensors()
        .collect::<Vec<_>>()
        .into_iter()
        .map(|(_, _, t)| ex.read_vec(&mut arena, t).unwrap())
        .collect();
    (losses, state)
}

/// The same on the GPU backend, each step's loss awaited.
async fn on_gpu(
    p: &Plan,
    spec: &ModelSpec,
    n: usize,
    steps: usize,
    outs: usize,
) -> Option<(Vec<f32>, Vec<Vec<f32>>)> {
    let backend = backend().await?;
    let gp = gpu_plan(p.clone());
    let mut arena = vec![0u8; gp.needed_bytes()];
    let mut ex = Executor::with_backend(&gp, &arena, backend).unwrap();
    ex.init_params(&mut arena, 3).unwrap();
    let mut losses = Vec::new();
    for s in 0..steps {
        let (x, y, t) = batch(spec, n, s as u64, outs);
        let st = ex
            .train_step(&mut arena, &x, target(spec.loss, &y, &t))
            .unwrap();
        assert_eq!(
            st.loss, 0.0,
            "the step cannot know its loss before the GPU ran it"
        );
        let l = ex
            .backend_mut()
            .loss()
            .await
            .unwrap()
            .expect("the step's loss");
        losses.push((l.sum / n as f64) as f32);
    }
    let mut state = Vec::new();
    for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
        state.push(ex.backend().read_async(&gp, t).await.unwrap());
    }
    Some((losses, state))
}

/// ‖gpu − cpu‖₂ ≤ 1e-5·‖cpu‖₂ (see `tests/backend.rs`).
fn close(what: &str, gpu: &[f32], cpu: &[f32]) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths");
    let d: f64 = gpu
        .iter()
        .zip(cpu)
        .map(|(&a, &b)| ((a - b) as f64).powi(2))
        .sum::<f64>()
        .sqrt();
    let n: f64 = cpu.iter().map(|&b| (b as f64).powi(2)).sum::<f64>().sqrt();
    assert!(
        d <= 1e-5 * n.max(1e-30),
        "{what}: ‖Δ‖ = {d:e}, ‖cpu‖ = {n:e}"
    );
}

async fn check(spec: &ModelSpec, mb: usize, m: u16, outs: usize, what: &str) {
    let p = plan(spec, mb, m);
    let n = mb * m as usize;
    let (cl, cs) = on_cpu(&p, spec, n, 4, outs);
    let Some((gl, gs)) = on_gpu(&p, spec, n, 4, outs).await else {
        return;
    };
    close(&format!("{what}: losses"), &gl, &cl);
    for (k, (g, c)) in gs.iter().zip(&cs).enumerate() {
        close(&format!("{what}: state tensor {k}"), g, c);
    }
    console_log!("{what}: WebGPU losses {gl:?} = CPU {cl:?} within 1e-5");
}

#[wasm_bindgen_test]
async fn an_mlp_trains_on_webgpu_as_on_the_cpu() {
    check(
        &mlp(LossKind::SoftmaxCrossEntropy, SGD, 5),
        8,
        2,
        5,
        "MLP, 2 micro-batches",
    )
    .await;
}

#[wasm_bindgen_test]
async fn a_cnn_trains_on_webgpu_as_on_the_cpu() {
    check(&cnn(SGD), 6, 1, 5, "CNN").await;
}

#[wasm_bindgen_test]
async fn a_batchnorm_cnn_trains_on_webgpu_as_on_the_cpu() {
    check(&bn_cnn(), 10, 1, 3, "BatchNorm CNN").await;
}

#[wasm_bindgen_test]
async fn a_step_whose_loss_was_not_awaited_is_refused() {
    let Some(backend) = backend().await else {
        return;
    };
    let spec = mlp(LossKind::SoftmaxCrossEntropy, ADAM, 5);
    let gp = gpu_plan(plan(&spec, 4, 1));
    let mut arena = vec![0u8; gp.needed_bytes()];
    let mut ex = Executor::with_backend(&gp, &arena, backend).unwrap();
    ex.init_params(&mut arena, 3).unwrap();
    let (x, y, _) = batch(&spec, 4, 1, 5);
    ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
    let e = ex
        .train_step(&mut arena, &x, Target::Classes(&y))
        .unwrap_err();
    assert!(format!("{e}").contains("await"), "{e}");
    ex.backend_mut()
        .loss()
        .await
        .unwrap()
        .expect("the first step's loss");
    ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
    assert!(ex.backend_mut().loss().await.unwrap().is_some());
}
