//! Optimizers, PyTorch semantics (`foreach=False` single-tensor paths). Their state tensors are planned in
//! the arena like any other tensor; the executor passes slices.
use crate::kernels::vector;
use crate::model::OptimizerSpec;

/// Per-step scalars the update needs (Adam's step count).
#[derive(Clone, Copy, Debug)]
pub struct StepCtx {
    /// 1-based step number.
    pub t: u32,
}

/// Updates `w` in place from its gradient `g` and optimizer `state` slices (as many as
/// [`OptimizerSpec::state_slots`]).
pub fn apply(
    spec: &OptimizerSpec,
    ctx: StepCtx,
    w: &mut [f32],
    g: &[f32],
    state: &mut [&mut [f32]],
) {
    match *spec {
        OptimizerSpec::Sgd {
            lr,
            momentum,
            weight_decay,
        } => {
            if momentum != 0.0 {
                let [buf] = state else { return };
                for ((w, &g), b) in w.iter_mut().zip(g).zip(buf.iter_mut()) {
                    let d = if weight_decay != 0.0 {
                        g + weight_decay * *w
                    } else {
                        g
                    };
                    // The first step's buffer is zero, so μ·0 + d = d: PyTorch's clone of d, bit for bit.
                    *b = *b * momentum + d;
                    *w += -lr * *b;
                }
            } else {
                for (w, &g) in w.iter_mut().zip(g) {
                    let d = if weight_decay != 0.0 {
                        g + weight_decay * *w
                    } else {
                        g
                    };
                    *w += -lr * d;
                }
            }
        }
        OptimizerSpec::Adam {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } => adam(ctx, w, g, state, lr, beta1, beta2, eps, weight_decay, 0.0),
        OptimizerSpec::AdamW {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } => adam(ctx, w, g, state, lr, beta1, beta2, eps, 0.0, weight_decay),
    }
}

/// Adam with L2 decay `weight_decay` added to the gradient, or AdamW with decoupled decay `decoupled` (PyTorch
/// `p.mul_(1 − lr·wd)` before the moments).
#[allow(clippy::too_many_arguments)]
fn adam(
    ctx: StepCtx,
    w: &mut [f32],
    g: &[f32],
    state: &mut [&mut [f32]],
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    decoupled: f32,
) {
    let [m, v] = state else { return };
    // PyTorch computes the bias corrections in Python floats (f64).
    let t = ctx.t as i32;
    let bc1 = 1.0 - libm::pow(beta1 as f64, t as f64);
    let bc2 = 1.0 - libm::pow(beta2 as f64, t as f64);
    let step_size = (lr as f64 / bc1) as f32;
    let bc2_sqrt = libm::sqrt(bc2) as f32;
    // PyTorch computes 1 − lr·wd in Python floats (f64).
    let shrink = (1.0 - lr as f64 * decoupled as f64) as f32;
    let step = vector::AdamStep {
        shrink: (decoupled != 0.0).then_some(shrink),
        weight_decay: (weight_decay != 0.0).then_some(weight_decay),
        w1: 1.0 - beta1,
        beta2,
        w2: 1.0 - beta2,
        bc2_sqrt,
        eps,
        step_size,
    };
    vector::adam(&step, w, g, m, v);
}
