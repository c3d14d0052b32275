//! The element-wise layers, the fused softmax cross-entropy and the optimizer updates on the GPU against
//! frugal-core's CPU ops, on every adapter the machine has (lavapipe in CI). Without an adapter: *skipped*
//! on stderr; with `FRUGAL_REQUIRE_GPU=1` a missing adapter fails.
#![cfg(not(target_arch = "wasm32"))] // natively; the browser suite is tests/web.rs
mod common;
use common::{data, gpu};
use frugal_core::model::OptimizerSpec;
use frugal_core::ops::{self, Act};
use frugal_core::optim::{self, StepCtx};
use frugal_wgpu::GpuError;

fn close(what: &str, got: &[f32], want: &[f32], tol: impl Fn(f32) -> f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol(w),
            "{what}[{i}]: GPU {g}, CPU {w}, tolerance {}",
            tol(w)
        );
    }
}

const ACTS: [Act; 4] = [Act::Relu, Act::Relu6, Act::Sigmoid, Act::Tanh];

#[test]
fn activations_forward_and_backward_match_the_cpu() {
    let Some(g) = gpu() else { return };
    // Around the kinks and the saturating ends: values in [-8, 8], with exact 0 and 6 among them.
    let mut x = data(1000, 1, 8.0);
    x.extend([0.0, 6.0, -0.0, 1e-30, -1e-30]);
    let dy = data(x.len(), 2, 1.0);
    let old = data(x.len(), 3, 1.0);
    for act in ACTS {
        let mut y = vec![0f32; x.len()];
        ops::act_fwd(act, &x, &mut y);
        let gy = g.act_fwd(act, &x).unwrap();
        match act {
            // Comparisons and selects: bit for bit.
            Act::Relu | Act::Relu6 => assert_eq!(gy, y, "{act:?}"),
            // WGSL's exp is accurate to 3 + 2·|x| ULP (|x| ≤ 8 here: 19 ULP of a value ≤ 1, 1.2e-6) and
            // the CPU's polynomial to 2 ULP; tanh is inherited from sinh/cosh: 2e-6 absolute covers both.
            _ => close(&format!("{act:?} forward"), &gy, &y, |_| 2e-6),
        }
        for acc in [false, true] {
            let mut dx = old.clone();
            ops::act_grad(act, &y, &dy, &mut dx, acc);
            let gdx = g.act_grad(act, &y, &dy, &old, acc).unwrap();
            match act {
                Act::Relu | Act::Relu6 => assert_eq!(gdx, dx, "{act:?} backward"),
                // y·(1−y)·dy (+ old): each product may be fused on the GPU and not on the CPU: a few
                // roundings of values ≤ 2 in magnitude, 4 ULP of 2.
                _ => close(&format!("{act:?} backward"), &gdx, &dx, |_| {
                    4.0 * 2f32.powi(-22)
                }),
            }
        }
    }
}

#[test]
fn softmax_cross_entropy_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    let (n, k) = (37, 10);
    let logits = data(n * k, 4, 6.0);
    // One out-of-range label: ignored by both.
    let labels: Vec<u32> = (0..n as u32)
        .map(|i| if i == 5 { 99 } else { i * 7 % 10 })
        .collect();
    let mut dz = vec![0f32; n * k];
    let (loss, correct) = ops::softmax_ce(n, k, &logits, &labels, &mut dz);
    let (gl, gc, gdz) = g.softmax_ce(n, k, &logits, &labels).unwrap();
    assert_eq!(gc, correct);
    // exp to 3 + 2·|x| ULP (|z − max| ≤ 12: 27 ULP) and log's 3 ULP, summed over 10 classes: the loss
    // (≈ 2–10) within 1e-5 relative, each gradient entry (≤ 1/36) within 1e-7 absolute.
    assert!(
        (gl - loss).abs() <= 1e-5 * loss.abs(),
        "loss GPU {gl} CPU {loss}"
    );
    close("dlogits", &gdz, &dz, |_| 1e-7);
    assert!(
        gdz[5 * k..6 * k].iter().all(|&v| v == 0.0),
        "the ignored sample has no gradient"
    );
}

#[test]
fn add_matches_the_cpu_bit_for_bit() {
    let Some(g) = gpu() else { return };
    let (a, b) = (data(1001, 31, 4.0), data(1001, 32, 4.0));
    let mut y = vec![0f32; a.len()];
    ops::add_fwd(&a, &b, &mut y);
    assert_eq!(g.add(&a, &b).unwrap(), y);
    assert!(matches!(g.add(&a, &b[1..]), Err(GpuError::Shape(_))));
}

/// Dropout's masks are the CPU's bit for bit (the 64-bit hash emulated on u32 pairs), so outputs and
/// gradients are equal, for several seeds (including ones with high bits set) and probabilities.
#[test]
fn dropout_matches_the_cpu_bit_for_bit() {
    let Some(g) = gpu() else { return };
    let x = data(5000, 41, 3.0);
    let old = data(x.len(), 42, 1.0);
    for (p, seed) in [
        (0.5, 1u64),
        (0.1, 0xDEAD_BEEF_0123_4567),
        (0.9, u64::MAX),
        (0.0, 7),
    ] {
        let mut y = vec![0f32; x.len()];
        ops::dropout_fwd(p, seed, &x, &mut y);
        let gy = g.dropout(p, seed, &x, None).unwrap();
        assert_eq!(gy, y, "forward p {p} seed {seed:#x}");
        let mut dx = old.clone();
        ops::dropout_grad(p, seed, &x, &mut dx, true);
        assert_eq!(
            g.dropout(p, seed, &x, Some(&old)).unwrap(),
            dx,
            "backward p {p}"
        );
    }
    assert!(matches!(
        g.dropout(1.0, 1, &x, None),
        Err(GpuError::Shape(_))
    ));
}

#[test]
fn mean_squared_error_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    let pred = data(513, 21, 3.0);
    let target = data(513, 22, 3.0);
    let mut d = vec![0f32; pred.len()];
    let loss = ops::mse(&pred, &target, &mut d);
    let (gl, gd) = g.mse(&pred, &target).unwrap();
    // The gradient: one subtraction and one product per element (2/len rounded once on both sides, but
    // the CPU multiplies by 2/len too): 1 ULP. The loss: f32 dot product on the CPU, f64 sum of f32
    // squares here: 1e-5 relative.
    close("dpred", &gd, &d, |w| w.abs() * 2f32.powi(-23));
    assert!((gl - loss).abs() <= 1e-5 * loss, "loss GPU {gl} CPU {loss}");
    assert_eq!(g.mse(&[], &[]).unwrap(), (0.0, vec![]));
}

#[test]
fn sgd_and_adam_steps_match_the_cpu() {
    let Some(g) = gpu() else { return };
    let len = 777;
    let specs = [
        OptimizerSpec::Sgd {
            lr: 0.1,
            momentum: 0.0,
            weight_decay: 0.0,
        },
        OptimizerSpec::Sgd {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 1e-4,
        },
        OptimizerSpec::Adam {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        },
        OptimizerSpec::Adam {
            lr: 1e-2,
            beta1: 0.6,
            beta2: 0.99,
            eps: 1e-6,
            weight_decay: 1e-2,
        },
    ];
    for spec in specs {
        let slots = spec.state_slots();
        let (mut w, mut state) = (data(len, 5, 1.0), vec![0f32; slots * len]);
        let (mut gw, mut gs) = (w.clone(), state.clone());
        for t in 1..=3u32 {
            let grad = data(len, 10 + t as u64, 0.5);
            {
                let mut parts: Vec<&mut [f32]> = state.chunks_mut(len).collect();
                optim::apply(&spec, StepCtx { t }, &mut w, &grad, &mut parts);
            }
            (gw, gs) = g.optim_step(&spec, t, &gw, &grad, &gs).unwrap();
            // Each update is a few roundings of values ≤ 2 (contracted into fused multiply-adds on some
            // drivers), and Adam's sqrt and division are 2.5 ULP in WGSL: 1e-6 absolute after three
            // steps.
            close(&format!("{spec:?} w, step {t}"), &gw, &w, |_| 1e-6);
            close(&format!("{spec:?} state, step {t}"), &gs, &state, |s| {
                1e-6 * s.abs().max(1.0)
            });
        }
    }
}

#[test]
fn mismatched_operands_are_errors() {
    let Some(g) = gpu() else { return };
    assert!(matches!(
        g.act_grad(Act::Relu, &[1.0], &[1.0, 2.0], &[0.0], false),
        Err(GpuError::Shape(_))
    ));
    assert!(matches!(
        g.softmax_ce(2, 3, &[0.0; 5], &[0, 1]),
        Err(GpuError::Shape(_))
    ));
    let sgd = OptimizerSpec::Sgd {
        lr: 0.1,
        momentum: 0.9,
        weight_decay: 0.0,
    };
    assert!(matches!(
        g.optim_step(&sgd, 1, &[1.0; 4], &[1.0; 4], &[]),
        Err(GpuError::Shape(_))
    ));
}
