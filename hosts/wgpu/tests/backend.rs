//! The GPU backend runs whole steps of a plan through frugal-core's executor, in one GPU buffer laid out
//! by the planner: training on it matches training on the CPU backend (the same plans, data and
//! initial weights), a non-finite loss is refused with the weights unchanged, a plan with a layer it has
//! no kernel for is refused when the executor is created, and a step creates no GPU object.
#![cfg(not(target_arch = "wasm32"))] // natively; the browser suite is tests/web.rs
mod common;
mod models;

use frugal_core::backend::{CpuBackend, ExecError};
use frugal_core::exec::{Executor, Target};
use frugal_core::graph::Graph;
use frugal_core::model::{LayerKind, LossKind, ModelSpec, OptimizerSpec};
use frugal_core::plan::Plan;
use frugal_wgpu::{gpu_plan, GpuBackend, GPU_SPACE};
use models::{batch, bn_cnn, cnn, mlp, plan, train, Trained, ADAM, SGD};

fn on_cpu(p: &Plan, spec: &ModelSpec, sizes: &[usize], steps: usize, outs: usize) -> Trained {
    train(p, CpuBackend::new(), spec, sizes, steps, outs)
}

fn on_gpu(
    p: &Plan,
    spec: &ModelSpec,
    sizes: &[usize],
    steps: usize,
    outs: usize,
) -> Option<Trained> {
    let backend = common::backend()?;
    Some(train(
        &gpu_plan(p.clone()),
        backend,
        spec,
        sizes,
        steps,
        outs,
    ))
}

/// GPU and CPU training agree. Why 1e-5: both compute in f32 with the same formulas; the GEMM tiles sum
/// k in the same order but the CPU's kernels may fuse differently (FMA vs multiply-add), and WGSL's
/// exp/log/tanh are not correctly rounded (a few ULP), so per-step differences are a few ULP of the
/// values (~1e-7 relative), compounding over a handful of steps to well under 1e-5 norm-wise.
fn agree(gpu: &Trained, cpu: &Trained, what: &str) {
    common::close_norm(&format!("{what}: losses"), &gpu.losses, &cpu.losses, 1e-5);
    assert_eq!(gpu.correct, cpu.correct, "{what}: correct counts");
    for (k, (g, c)) in gpu.state.iter().zip(&cpu.state).enumerate() {
        common::close_norm(&format!("{what}: state tensor {k}"), g, c, 1e-5);
    }
    common::close_norm(
        &format!("{what}: eval loss"),
        &[gpu.eval.0],
        &[cpu.eval.0],
        1e-5,
    );
    assert_eq!(gpu.eval.1, cpu.eval.1, "{what}: eval correct");
}

#[test]
fn an_mlp_trains_on_the_gpu_as_on_the_cpu() {
    let spec = mlp(LossKind::SoftmaxCrossEntropy, SGD, 5);
    let p = plan(&spec, 16, 1);
    let cpu = on_cpu(&p, &spec, &[16], 6, 5);
    let Some(gpu) = on_gpu(&p, &spec, &[16], 6, 5) else {
        return;
    };
    agree(&gpu, &cpu, "plain plan, cross-entropy, SGD");
    assert!(cpu.losses.last() < cpu.losses.first(), "the loss falls");
}

#[test]
fn a_cnn_trains_on_the_gpu_as_on_the_cpu() {
    // Plain, then 2 micro-batches with a partial batch (weight gradients of convolutions accumulated).
    let spec = cnn(SGD);
    for (mb, m, sizes) in [(12, 1, vec![12]), (6, 2, vec![12, 7])] {
        let p = plan(&spec, mb, m);
        let cpu = on_cpu(&p, &spec, &sizes, 4, 5);
        let Some(gpu) = on_gpu(&p, &spec, &sizes, 4, 5) else {
            return;
        };
        agree(&gpu, &cpu, &format!("CNN, {m} micro-batch(es)"));
    }
}

#[test]
fn batchnorm_trains_on_the_gpu_as_on_the_cpu() {
    let spec = bn_cnn();
    let p = plan(&spec, 10, 1);
    let cpu = on_cpu(&p, &spec, &[10, 7], 4, 3);
    let Some(gpu) = on_gpu(&p, &spec, &[10, 7], 4, 3) else {
        return;
    };
    // Running statistics are among the state tensors compared.
    agree(&gpu, &cpu, "BatchNorm CNN");
}

#[test]
fn layers_beyond_65535_weights_and_channels_train_on_the_gpu_as_on_the_cpu() {
    // WebGPU allows at most 65,535 workgroups per grid dimension, and the weight- and bias-gradient
    // and BatchNorm reductions run one workgroup per weight or channel: past 65,535 the grid folds into
    // rows (`wg_index`). A dense 3×3 convolution with 1024·8·9 = 73,728 weights, a grouped 1×1 one with
    // 66,560 weights and output channels (a bias, so 66,560 bias sums), and BatchNorm over those 66,560
    // channels (statistics and gradient sums); then a grouped 1×1 convolution back to 1024 channels
    // (a linear layer over 66,560 features would be a GEMM with k > 65,535, which lavapipe sums wrongly:
    // its shader loops stop after 65,535 iterations). A reduction that ignored the fold would leave
    // every output past the first row of workgroups unwritten and others overwritten, far beyond 1e-5.
    use frugal_core::model::{Dims, Src};
    let conv = |out, k: u32, pad: u32, groups, bias| LayerKind::Conv2d {
        out,
        kernel: [k, k],
        stride: [1, 1],
        padding: [pad, pad],
        groups,
        bias,
    };
    let bn = LayerKind::BatchNorm2d {
        eps: 1e-5,
        momentum: 0.1,
    };
    let spec = ModelSpec {
        input: Dims { c: 8, h: 3, w: 3 },
        layers: vec![
            models::layer("c1", conv(1024, 3, 1, 1, false), &[Src::Input]),
            models::layer("c2", conv(66_560, 1, 0, 1024, true), &[Src::Layer(0)]),
            models::layer("bn", bn, &[Src::Layer(1)]),
            models::layer("c3", conv(1024, 1, 0, 1024, false), &[Src::Layer(2)]),
            models::layer("gap", LayerKind::GlobalAvgPool, &[Src::Layer(3)]),
            models::layer("flat", LayerKind::Flatten, &[Src::Layer(4)]),
            models::layer(
                "fc",
                LayerKind::Linear { out: 3, bias: true },
                &[Src::Layer(5)],
            ),
        ],
        loss: LossKind::SoftmaxCrossEntropy,
        optimizer: SGD,
        seed: 4,
    };
    let p = plan(&spec, 3, 1);
    let cpu = on_cpu(&p, &spec, &[3], 2, 3);
    let Some(gpu) = on_gpu(&p, &spec, &[3], 2, 3) else {
        return;
    };
    // Losses and predictions as `agree`; the state tensors within 1e-4: BatchNorm's β moves by
    // −lr·Σdy, a sum of 27 terms that nearly cancel (‖β‖ ≈ 8e-4 against terms of ~1e-2), so the
    // few-ULP differences of its terms (the GPU's workgroup tree against the CPU's order) are ~1e-5 of
    // it; a wrong fold is off by O(1).
    let what = "over 65,535 weights and channels";
    common::close_norm(&format!("{what}: losses"), &gpu.losses, &cpu.losses, 1e-5);
    assert_eq!(gpu.correct, cpu.correct, "{what}: correct counts");
    for (k, (g, c)) in gpu.state.iter().zip(&cpu.state).enumerate() {
        common::close_norm(&format!("{what}: state tensor {k}"), g, c, 1e-4);
    }
    common::close_norm(&format!("{what}: eval"), &[gpu.eval.0], &[cpu.eval.0], 1e-5);
}

#[test]
fn fp16_storage_trains_on_the_gpu_as_on_the_cpu() {
    // The saved activations rounded to IEEE half between forward and backward on both backends: the
    // same rounding (nearest even, saturating at ±65504), so the runs agree as the f32 ones do.
    for spec in [mlp(LossKind::SoftmaxCrossEntropy, ADAM, 5), cnn(SGD)] {
        let p = frugal_core::policy::half::f16_storage(&Graph::new(&spec, 9).unwrap());
        assert!(
            p.program.iter().any(|i| i.packed().is_some()),
            "the plan packs"
        );
        let cpu = on_cpu(&p, &spec, &[9, 5], 4, 5);
        let Some(gpu) = on_gpu(&p, &spec, &[9, 5], 4, 5) else {
            return;
        };
        agree(&gpu, &cpu, "fp16 storage");
    }
}

#[test]
fn dropout_trains_on_the_gpu_as_on_the_cpu() {
    // The CPU's counter-based masks, keyed by each sample's index in the whole batch: 3 micro-batches
    // and a partial batch draw the same masks as the CPU. A wrong mask changes a unit's output wholesale
    // (0 vs x/(1−p)), far beyond the 1e-5 bound.
    let mut spec = mlp(LossKind::SoftmaxCrossEntropy, SGD, 5);
    spec.layers[7].kind = LayerKind::Dropout { p: 0.3 };
    let p = plan(&spec, 8, 3);
    let sizes = [24, 13];
    let cpu = on_cpu(&p, &spec, &sizes, 4, 5);
    let Some(gpu) = on_gpu(&p, &spec, &sizes, 4, 5) else {
        return;
    };
    agree(&gpu, &cpu, "dropout, 3 micro-batches");
}

#[test]
fn micro_batches_and_partial_batches_match_the_cpu() {
    // 3 micro-batches of 8: the derivative normalised by the whole batch, weight gradients
    // accumulated; then a partial batch of 13 (one micro-batch short, one partial) and one of 5.
    for (loss, opt, outs) in [
        (LossKind::SoftmaxCrossEntropy, ADAM, 4),
        (LossKind::Mse, SGD, 3),
    ] {
        let spec = mlp(loss, opt, outs);
        let p = plan(&spec, 8, 3);
        let sizes = [24, 13, 5];
        let cpu = on_cpu(&p, &spec, &sizes, 6, outs as usize);
        let Some(gpu) = on_gpu(&p, &spec, &sizes, 6, outs as usize) else {
            return;
        };
        agree(&gpu, &cpu, &format!("3 micro-batches, {loss:?}"));
    }
}

#[test]
fn a_non_finite_loss_is_refused_and_the_weights_stay() {
    let Some(backend) = common::backend() else {
        return;
    };
    let huge = OptimizerSpec::Sgd {
        lr: 1e30,
        momentum: 0.0,
        weight_decay: 0.0,
    };
    let spec = mlp(LossKind::Mse, huge, 3);
    let gp = gpu_plan(plan(&spec, 8, 1));
    let mut arena = vec![0u8; gp.needed_bytes()];
    let mut ex = Executor::with_backend(&gp, &arena, backend).unwrap();
    ex.init_params(&mut arena, 3).unwrap();
    let (x, _, t) = batch(&spec, 8, 1, 3);
    let tensors: Vec<_> = ex.state_tensors().map(|(_, _, t)| t).collect();
    let read = |ex: &Executor<'_, GpuBackend>| -> Vec<Vec<u32>> {
        tensors
            .iter()
            .map(|&t| {
                let v = ex.backend().read(&gp, t).unwrap();
                v.iter().map(|v| v.to_bits()).collect()
            })
            .collect()
    };
    let mut refused = None;
    for step in 0..6 {
        let before = read(&ex);
        match ex.train_step(&mut arena, &x, Target::Values(&t)) {
            Ok(_) => {}
            Err(e) => {
                assert_eq!(e, ExecError::NonFinite("the loss"));
                assert_eq!(
                    read(&ex),
                    before,
                    "weights and state unchanged by the refused step"
                );
                refused = Some(step);
                break;
            }
        }
    }
    let step = refused.expect("an lr of 1e30 drives the loss to infinity within 6 steps");
    assert_eq!(ex.steps() as usize, step, "a refused step is not counted");
}

/// A sparse update whose parts the GPU has kernels for (bias-only convolutions and classifier, a frozen
/// depthwise layer) trains on the GPU as on the CPU; a channel subset is refused when the executor is
/// created, with a typed error.
#[test]
fn a_bias_only_update_trains_on_the_gpu_and_a_channel_subset_is_refused() {
    use frugal_core::model::Update;
    let mut spec = cnn(SGD);
    for l in &mut spec.layers {
        match l.kind {
            LayerKind::Conv2d { bias: true, .. } | LayerKind::Linear { .. } => {
                l.update = Update::Bias
            }
            LayerKind::Conv2d { .. } => l.trainable = false,
            _ => {}
        }
    }
    let p = plan(&spec, 12, 1);
    let cpu = on_cpu(&p, &spec, &[12], 4, 5);
    let Some(gpu) = on_gpu(&p, &spec, &[12], 4, 5) else {
        return;
    };
    agree(&gpu, &cpu, "bias-only update");
    let Some(backend) = common::backend() else {
        return;
    };
    let mut spec = cnn(SGD);
    spec.layers[0].update = Update::Channels(0.5);
    let gp = gpu_plan(plan(&spec, 4, 1));
    let arena = vec![0u8; gp.needed_bytes()];
    match Executor::with_backend(&gp, &arena, backend) {
        Err(ExecError::Unsupported(why)) => assert!(why.contains("channel subset"), "{why}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a channel-subset update was accepted"),
    }
}

#[test]
fn a_plan_with_a_layer_without_gpu_kernels_is_refused_at_creation() {
    let Some(backend) = common::backend() else {
        return;
    };
    // Integer training stays on the CPU.
    use frugal_core::model::{LayerKind as K, Src};
    let mut spec = mlp(LossKind::SoftmaxCrossEntropy, SGD, 5);
    spec.layers = vec![
        models::layer("flat", K::Flatten, &[Src::Input]),
        models::layer("fc", K::Linear { out: 5, bias: true }, &[Src::Layer(0)]),
    ];
    let int8 = frugal_core::model::Precision::Int8(frugal_core::model::Int8Update::FloatMaster);
    let gp = gpu_plan(Plan::new(Graph::with_precision(&spec, 4, int8).unwrap()));
    let arena = vec![0u8; gp.needed_bytes()];
    match Executor::with_backend(&gp, &arena, backend) {
        Err(ExecError::Unsupported(why)) => assert!(why.contains("integer"), "{why}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("an int8 plan was accepted"),
    }
    // A plan left on the CPU is refused by placement.
    let Some(backend) = common::backend() else {
        return;
    };
    let cpu_plan = plan(&mlp(LossKind::SoftmaxCrossEntropy, SGD, 5), 4, 1);
    let arena = vec![0u8; cpu_plan.needed_bytes()];
    assert!(matches!(
        Executor::with_backend(&cpu_plan, &arena, backend),
        Err(ExecError::Placement(_))
    ));
    // Sequence layers and AdamW have no GPU kernels yet: refused, naming them.
    let seq = frugal_core::model::Dims::flat(4);
    let mut spec = mlp(LossKind::SoftmaxCrossEntropy, SGD, 5);
    spec.input = seq;
    spec.layers = vec![
        models::layer("tok", K::Embedding { vocab: 5, dim: 3 }, &[Src::Input]),
        models::layer("fc", K::Linear { out: 5, bias: true }, &[Src::Layer(0)]),
    ];
    for (opt, word) in [(SGD, "sequence layers"), (ADAM, "sequence layers")] {
        spec.optimizer = opt;
        let gp = gpu_plan(Plan::new(Graph::new(&spec, 2).unwrap()));
        let arena = vec![0u8; gp.needed_bytes()];
        let Some(backend) = common::backend() else {
            return;
        };
        match Executor::with_backend(&gp, &arena, backend) {
            Err(ExecError::Unsupported(why)) => assert!(why.contains(word), "{why}"),
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("a plan with an embedding was accepted"),
        }
    }
    let mut spec = mlp(LossKind::SoftmaxCrossEntropy, SGD, 5);
    spec.optimizer = OptimizerSpec::AdamW {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };
    let gp = gpu_plan(Plan::new(Graph::new(&spec, 4).unwrap()));
    let arena = vec![0u8; gp.needed_bytes()];
    let Some(backend) = common::backend() else {
        return;
    };
    match Executor::with_backend(&gp, &arena, backend) {
        Err(ExecError::Unsupported(why)) => assert!(why.contains("AdamW"), "{why}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("an AdamW plan was accepted"),
    }
}

#[test]
fn steps_create_no_gpu_objects_and_the_gpu_holds_the_planned_bytes() {
    let Some(backend) = common::backend() else {
        return;
    };
    let spec = mlp(LossKind::SoftmaxCrossEntropy, ADAM, 5);
    let gp = gpu_plan(plan(&spec, 16, 2));
    let before = backend.counters().hal;
    let mut arena = vec![0u8; gp.needed_bytes()];
    let mut ex = Executor::with_backend(&gp, &arena, backend).unwrap();
    let prepared = ex.backend().counters().hal;
    let bytes = ex.backend().bytes();
    // The tensors' buffer is the planner's GPU space, nothing more.
    assert_eq!(
        bytes.space as usize,
        gp.space_bytes(GPU_SPACE).div_ceil(4) * 4
    );
    assert!(gp.space_bytes(GPU_SPACE) > 0 && gp.arena_bytes == 0);
    // What wgpu allocated when the plan was prepared (nothing else runs in between): at least the
    // buffers' sizes; drivers may round each allocation up (to their alignment or pages), so at most
    // 64 KiB over for each of the 4 buffers.
    let allocated = prepared.buffer_memory.read() - before.buffer_memory.read();
    assert!(
        allocated >= bytes.total() as isize && allocated <= bytes.total() as isize + 4 * 65536,
        "GPU buffer memory {allocated} for {bytes:?}"
    );
    assert_eq!(
        prepared.buffers.read() - before.buffers.read(),
        4,
        "four buffers"
    );
    ex.init_params(&mut arena, 3).unwrap();
    let (x, y, _) = batch(&spec, 32, 1, 5);
    ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
    let after_first = ex.backend().counters();
    for _ in 0..5 {
        ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
        ex.evaluate(&mut arena, &x[..16 * 20], Target::Classes(&y[..16]))
            .unwrap();
    }
    common::assert_no_new_gpu_objects(&after_first, &ex.backend().counters());
}

/// An MLP whose layers are 64-multiples at batch 64: every GEMM of its step (forward, dX, dW in three
/// layouts) fits a generated tile kernel, bound to the planner's storages. It trains as on the CPU, and
/// the per-dispatch timestamps (where the adapter has them) name the generated kernels it ran.
#[test]
fn tile_multiple_layers_run_the_generated_gemm_and_train_as_on_the_cpu() {
    use frugal_core::model::{Dims, Src};
    use models::layer;
    if common::gpu().is_none() {
        return;
    }
    let lin = |out| LayerKind::Linear { out, bias: true };
    let spec = ModelSpec {
        input: Dims { c: 1, h: 8, w: 8 },
        layers: vec![
            layer("flat", LayerKind::Flatten, &[Src::Input]),
            layer("fc1", lin(128), &[Src::Layer(0)]),
            layer("relu1", LayerKind::Relu, &[Src::Layer(1)]),
            layer("fc2", lin(64), &[Src::Layer(2)]),
            layer("relu2", LayerKind::Relu, &[Src::Layer(3)]),
            layer("out", lin(64), &[Src::Layer(4)]),
        ],
        loss: LossKind::SoftmaxCrossEntropy,
        optimizer: SGD,
        seed: 7,
    };
    let p = plan(&spec, 64, 1);
    let cpu = on_cpu(&p, &spec, &[64], 4, 64);
    let Some(gpu) = on_gpu(&p, &spec, &[64], 4, 64) else {
        return;
    };
    agree(&gpu, &cpu, "tile-multiple MLP");

    let need = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
    let mut backend = GpuBackend::new(frugal_wgpu::Gpu::open_with_features(need).unwrap());
    if !backend.set_timestamps(true) {
        eprintln!("skipped the timestamps: the adapter has no timestamp queries");
        return;
    }
    let gp = gpu_plan(p.clone());
    let mut arena = vec![0u8; gp.needed_bytes()];
    let mut ex = Executor::with_backend(&gp, &arena, backend).unwrap();
    ex.init_params(&mut arena, 3).unwrap();
    let (x, y, _) = batch(&spec, 64, 1, 64);
    let d0 = ex.backend().dispatches();
    ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
    let dispatches = ex.backend().dispatches() - d0;
    let times = ex.backend_mut().timestamps(&gp).unwrap();
    assert_eq!(times.len() as u64, dispatches, "one time per dispatch");
    assert!(times
        .iter()
        .all(|t| t.micros >= 0.0 && t.micros.is_finite()));
    let generated: Vec<&str> = times
        .iter()
        .filter(|t| t.kernel.starts_with("f64x64") || t.kernel.starts_with("f128x64"))
        .map(|t| t.kernel.as_str())
        .collect();
    // 3 forward products, 3 weight gradients (A transposed), 2 input gradients (B transposed).
    assert!(generated.len() >= 8, "{times:#?}");
    assert!(times.iter().any(|t| t.kernel == "guard"));
}
