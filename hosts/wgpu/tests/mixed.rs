//! Mixed CPU/GPU plans (`policy::mixed` through `MixedBackend`): some layers on the CPU, some on the
//! GPU, in one step, with the planned moves between the host arena and the GPU buffer. Training
//! matches all-CPU training within the GPU suites' tolerance (alternating and random placements; an
//! MLP, a CNN with micro-batches and a partial batch, a BatchNorm CNN), a non-finite loss leaves the
//! weights of both devices unchanged, a step creates no GPU object and submits once per move between
//! host and GPU plus once at its end, and what a mixed plan may not be is refused at creation.
#![cfg(not(target_arch = "wasm32"))]
mod common;
mod models;

use frugal_core::backend::{CpuBackend, ExecError, Placement};
use frugal_core::exec::{Executor, Target};
use frugal_core::model::{LossKind, ModelSpec, OptimizerSpec};
use frugal_core::plan::{Phase, Plan, SpaceId};
use frugal_core::pool::ThreadPool;
use frugal_wgpu::{mixed_plan, MixedBackend, GPU_SPACE};
use models::{batch, bn_cnn, cnn, mlp, plan, train, Trained, ADAM, SGD};

/// Mixed and all-CPU training agree within `tests/backend.rs`'s bound (1e-5 norm-wise; see its
/// `agree`: the GPU layers differ from the CPU's by a few ULP per step, the CPU layers and the moves
/// not at all, so a mixed run is no further from the CPU than an all-GPU one).
fn agree(got: &Trained, cpu: &Trained, what: &str) {
    common::close_norm(&format!("{what}: losses"), &got.losses, &cpu.losses, 1e-5);
    assert_eq!(got.correct, cpu.correct, "{what}: correct counts");
    for (k, (g, c)) in got.state.iter().zip(&cpu.state).enumerate() {
        common::close_norm(&format!("{what}: state tensor {k}"), g, c, 1e-5);
    }
    common::close_norm(
        &format!("{what}: eval loss"),
        &[got.eval.0],
        &[cpu.eval.0],
        1e-5,
    );
    assert_eq!(got.eval.1, cpu.eval.1, "{what}: eval correct");
}

fn alternating(n: usize, first_on_gpu: bool) -> Vec<Placement> {
    (0..n)
        .map(|i| {
            if (i % 2 == 0) == first_on_gpu {
                Placement::Gpu
            } else {
                Placement::Cpu
            }
        })
        .collect()
}

fn random(n: usize, seed: u64) -> Vec<Placement> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if s >> 63 == 1 {
                Placement::Gpu
            } else {
                Placement::Cpu
            }
        })
        .collect()
}

/// Every placement set of the suite for `n` nodes: alternating both ways, and three random ones.
fn placements(n: usize) -> Vec<(String, Vec<Placement>)> {
    let mut out = vec![
        ("alternating, GPU first".to_string(), alternating(n, true)),
        ("alternating, CPU first".to_string(), alternating(n, false)),
    ];
    for seed in 1..=3 {
        out.push((format!("random placement {seed}"), random(n, seed)));
    }
    out
}

/// Trains `p` placed every way of [`placements`] on the GPU and the CPU, against the CPU alone. The
/// random placements run their CPU side on a 2-worker pool (`--threads` beside a GPU), the alternating
/// ones on one thread.
fn check_model(spec: &ModelSpec, p: &Plan, sizes: &[usize], steps: usize, outs: usize, what: &str) {
    let cpu = train(p, CpuBackend::new(), spec, sizes, steps, outs);
    let pool = ThreadPool::new(2).unwrap();
    for (how, devices) in placements(p.graph.nodes.len()) {
        let Some(backend) = common::backend() else {
            return;
        };
        let mp = mixed_plan(p.clone(), &devices).unwrap();
        let on_gpu = mp
            .program
            .iter()
            .filter(|i| i.placement == Placement::Gpu)
            .count();
        assert!(
            on_gpu > 0 || !devices.contains(&Placement::Gpu),
            "{what}, {how}"
        );
        let got = if how.starts_with("random") {
            let mixed = MixedBackend::with_cpu(CpuBackend::with_pool(&pool), backend);
            train(&mp, mixed, spec, sizes, steps, outs)
        } else {
            train(&mp, MixedBackend::new(backend), spec, sizes, steps, outs)
        };
        agree(&got, &cpu, &format!("{what}, {how} {devices:?}"));
    }
}

#[test]
fn an_mlp_with_layers_on_both_devices_trains_as_on_the_cpu() {
    let spec = mlp(LossKind::SoftmaxCrossEntropy, ADAM, 5);
    let p = plan(&spec, 16, 1);
    check_model(&spec, &p, &[16], 5, 5, "MLP");
    let spec = mlp(LossKind::Mse, SGD, 3);
    let p = plan(&spec, 8, 1);
    check_model(&spec, &p, &[8], 4, 3, "MLP, MSE");
}

#[test]
fn a_cnn_with_layers_on_both_devices_trains_as_on_the_cpu() {
    // Plain, then 2 micro-batches with a partial batch (moves of the empty micro-batch skipped).
    let spec = cnn(SGD);
    for (mb, m, sizes) in [(12, 1, vec![12]), (6, 2, vec![12, 7])] {
        let p = plan(&spec, mb, m);
        check_model(
            &spec,
            &p,
            &sizes,
            3,
            5,
            &format!("CNN, {m} micro-batch(es)"),
        );
    }
}

#[test]
fn a_batchnorm_cnn_with_layers_on_both_devices_trains_as_on_the_cpu() {
    // Running statistics live with their layer, on either device, and are compared.
    let spec = bn_cnn();
    let p = plan(&spec, 10, 1);
    check_model(&spec, &p, &[10, 7], 3, 3, "BatchNorm CNN");
}

#[test]
fn a_non_finite_loss_leaves_the_weights_of_both_devices_unchanged() {
    let huge = OptimizerSpec::Sgd {
        lr: 1e30,
        momentum: 0.0,
        weight_decay: 0.0,
    };
    let spec = mlp(LossKind::Mse, huge, 3);
    for first_on_gpu in [true, false] {
        let Some(backend) = common::backend() else {
            return;
        };
        let base = plan(&spec, 8, 1);
        let mp = mixed_plan(
            base.clone(),
            &alternating(base.graph.nodes.len(), first_on_gpu),
        )
        .unwrap();
        let mut arena = vec![0u8; mp.needed_bytes()];
        let mut ex = Executor::with_backend(&mp, &arena, MixedBackend::new(backend)).unwrap();
        ex.init_params(&mut arena, 3).unwrap();
        let (x, _, t) = batch(&spec, 8, 1, 3);
        let tensors: Vec<_> = ex.state_tensors().map(|(_, _, t)| t).collect();
        // Both devices hold weights.
        let spaces: Vec<SpaceId> = tensors
            .iter()
            .map(|&t| mp.lives[mp.storage_at(t, 0).unwrap()].space)
            .collect();
        assert!(spaces.contains(&SpaceId::HOST) && spaces.contains(&GPU_SPACE));
        let mut refused = None;
        for step in 0..6 {
            let before: Vec<Vec<u32>> = tensors
                .iter()
                .map(|&t| {
                    let v = ex.read_vec(&mut arena, t).unwrap();
                    v.iter().map(|v| v.to_bits()).collect()
                })
                .collect();
            if let Err(e) = ex.train_step(&mut arena, &x, Target::Values(&t)) {
                assert_eq!(e, ExecError::NonFinite("the loss"));
                let after: Vec<Vec<u32>> = tensors
                    .iter()
                    .map(|&t| {
                        let v = ex.read_vec(&mut arena, t).unwrap();
                        v.iter().map(|v| v.to_bits()).collect()
                    })
                    .collect();
                assert_eq!(after, before, "weights unchanged on the CPU and the GPU");
                refused = Some(step);
                break;
            }
        }
        let step = refused.expect("an lr of 1e30 drives the loss to infinity within 6 steps");
        assert_eq!(ex.steps() as usize, step, "a refused step is not counted");
    }
}

#[test]
fn mixed_steps_create_no_gpu_objects_and_submit_once_per_crossing() {
    let Some(backend) = common::backend() else {
        return;
    };
    let spec = mlp(LossKind::SoftmaxCrossEntropy, ADAM, 5);
    let base = plan(&spec, 16, 2);
    let mp = mixed_plan(base.clone(), &alternating(base.graph.nodes.len(), true)).unwrap();
    let crossings = (0..mp.n_eo())
        .filter_map(|eo| mp.move_storages(eo))
        .filter(|&(a, b)| mp.lives[a].space != mp.lives[b].space)
        .count() as u64;
    assert!(crossings > 0);
    let before = backend.counters().hal;
    let mut arena = vec![0u8; mp.needed_bytes()];
    let mut ex = Executor::with_backend(&mp, &arena, MixedBackend::new(backend)).unwrap();
    let prepared = ex.backend().gpu().counters().hal;
    let bytes = ex.backend().gpu().bytes();
    assert_eq!(
        bytes.space as usize,
        mp.space_bytes(GPU_SPACE).div_ceil(4) * 4
    );
    assert!(bytes.moves > 0, "a landing buffer for moves to the host");
    assert_eq!(
        prepared.buffers.read() - before.buffers.read(),
        5,
        "space, I/O, uniforms, losses' readback, moves' landing"
    );
    ex.init_params(&mut arena, 3).unwrap();
    let (x, y, _) = batch(&spec, 32, 1, 5);
    ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
    let after_first = ex.backend().gpu().counters();
    let s0 = ex.backend().gpu().submissions();
    ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
    assert_eq!(
        ex.backend().gpu().submissions() - s0,
        crossings + 1,
        "one submission per move between host and GPU, one at the end"
    );
    for _ in 0..4 {
        ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
        ex.evaluate(&mut arena, &x[..16 * 20], Target::Classes(&y[..16]))
            .unwrap();
    }
    common::assert_no_new_gpu_objects(&after_first, &ex.backend().gpu().counters());
}

#[test]
fn what_a_mixed_plan_may_not_be_is_refused_at_creation() {
    let spec = mlp(LossKind::SoftmaxCrossEntropy, SGD, 5);
    let base = plan(&spec, 4, 1);
    let mp = mixed_plan(base.clone(), &alternating(base.graph.nodes.len(), true)).unwrap();
    let arena = vec![0u8; mp.needed_bytes()];
    // The GPU backend alone serves no CPU instruction.
    let Some(backend) = common::backend() else {
        return;
    };
    assert!(matches!(
        Executor::with_backend(&mp, &arena, backend),
        Err(ExecError::Placement(Placement::Cpu))
    ));
    // A mixed plan's loss on the GPU.
    let mut gpu_loss = mp.clone();
    for i in &mut gpu_loss.program {
        if i.phase == Phase::Loss {
            i.placement = Placement::Gpu;
        }
    }
    let Some(backend) = common::backend() else {
        return;
    };
    match Executor::with_backend(&gpu_loss, &arena, MixedBackend::new(backend)) {
        Err(ExecError::Unsupported(why)) => assert!(why.contains("loss"), "{why}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a mixed plan with its loss on the GPU was accepted"),
    }
    // The whole-GPU plan still runs through the mixed backend (its loss on the GPU).
    let Some(backend) = common::backend() else {
        return;
    };
    let gp = frugal_wgpu::gpu_plan(base.clone());
    let cpu = train(&base, CpuBackend::new(), &spec, &[4], 2, 5);
    let got = train(&gp, MixedBackend::new(backend), &spec, &[4], 2, 5);
    agree(&got, &cpu, "whole-GPU plan through MixedBackend");
}
