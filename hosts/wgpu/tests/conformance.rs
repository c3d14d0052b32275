//! The op conformance suite (issue 12): one list of cases run through the `Backend` seam of every
//! backend the test can open — the CPU always (on one thread and on a pool of three), wgpu when an
//! adapter opens (lavapipe in CI) — and compared with an independent f64 reference written here in
//! plain loops (not frugal-core's kernels).
//!
//! Each case is a tiny model (`ModelSpec`) whose layers are the ops under test, planned as any model is
//! (`Plan::shaped`; `gpu_plan` for the GPU) and run by `Executor::with_backend` for two training steps
//! (the second step sees momentum, Adam's t = 2 and updated running statistics) and one evaluation. The
//! plan is made *observable*: in-place merging is off and every storage lives to the end of the step,
//! so no two tensors share bytes and after a step every activation, derivative and weight gradient is
//! still where the plan put it; `Executor::read_vec` reads it back from the host arena or the GPU
//! buffer alike. Per step and per node the suite compares
//!
//! - the forward output (and, for Dropout, the keep-mask bit for bit against the CPU's counter-based
//!   rule `dropout_keep`),
//! - the loss the step reports and dL/d(prediction),
//! - every input derivative the plan computes (dL/dx) and every weight gradient (dL/dW, dL/db, dγ, dβ),
//! - the updated parameters and optimizer state (SGD with/without momentum, weight decay; Adam), from
//!   the backend's own weights, state and gradient before the update — so the update is checked on its
//!   own and a gradient error is not counted twice,
//! - BatchNorm's running statistics,
//! - fp16 storage: each half copy bit for bit against its f32 activation rounded to half (nearest
//!   even), the backward against a reference that reads those rounded values,
//!
//! and after the steps the evaluation loss (BatchNorm on running statistics, Dropout off). One case
//! splits its batch into micro-batches (the accumulating weight gradients, the loss normalised by the
//! whole batch, dropout keyed by the sample's index in the whole batch); there activations and
//! derivatives are compared for the first micro-batch (what the plan's first segment holds). A backend
//! that cannot be opened is reported *skipped* (`conformance: wgpu skipped: <reason>`), never passed;
//! with `FRUGAL_REQUIRE_GPU=1` it fails the test. The test prints a table: case × backend → worst error
//! against its tolerance, and how many tensors were compared bit for bit (dropout masks, half copies).
#![cfg(not(target_arch = "wasm32"))] // natively; the browser suite is tests/web.rs
mod models;

use std::collections::HashMap;
use std::io::Write;

use frugal_core::backend::{Backend, CpuBackend, ExecError};
use frugal_core::exec::{Executor, StepStats, Target};
use frugal_core::graph::{Graph, NodeOp};
use frugal_core::model::{Dims, LayerKind, LossKind, ModelSpec, OptimizerSpec, Src};
use frugal_core::ops::Act;
use frugal_core::plan::{share_groups, Plan, PlanShape, SpaceId, ALIGN};
use frugal_core::policy::half::f16_storage;
use frugal_core::pool::ThreadPool;
use frugal_core::rng::hash2;
use frugal_wgpu::{gpu_plan, GpuBackend};
use models::{data, layer};

type TensorId = frugal_core::graph::TensorId;

// ---------------------------------------------------------------------------------------------------
// Tolerances. All are norm-wise, ‖got − ref‖₂ ≤ tol·‖ref‖₂, with ref the f64 reference. f32 rounds at
// ε = 2⁻²⁴ ≈ 6e-8. A dot product of length K in f32 has a worst-case relative error of about K·ε and a
// typical (random-sign) one of about √K·ε; the longest reductions here are K ≈ 300 (a weight gradient
// summing batch × pixels, BatchNorm's channel statistics), so √K·ε ≈ 1e-6 per layer, and a value passes
// through at most ~8 such layers forward and back. WGSL's exp/tanh/sqrt are not correctly rounded
// (the spec allows a few ULP plus an absolute term near zero), which lavapipe's LLVM implementations
// stay well within.
// ---------------------------------------------------------------------------------------------------

/// Forward outputs: at most ~4 chained layers of f32 dot products (K ≤ 300) and the activations'
/// exp/tanh (a few ULP on the GPU): ~4·√300·ε ≈ 4e-6. Observed on this machine: ≤ 3e-7 (CPU and
/// lavapipe alike).
const TOL_FORWARD: f64 = 4e-6;
/// The step's and the evaluation's loss: a mean of per-sample log-sum-exp (or squares) over the forward
/// above; the log and exp add a few ULP, the mean over ≤ 9 samples a few more. Observed: ≤ 1.4e-7.
const TOL_LOSS: f64 = 4e-6;
/// Input derivatives and weight gradients: the backward chain is about twice the forward's length and
/// BatchNorm's input gradient subtracts two channel sums from N·dy (cancellation amplifies the relative
/// error a few times), so 5× the forward bound. Observed: ≤ 2.6e-6 (a bias gradient behind fp16
/// storage on lavapipe), ≤ 1.5e-6 elsewhere.
const TOL_BACKWARD: f64 = 2e-5;
/// Optimizer updates, relative to the size of the update (w_after − w_before): the reference applies
/// the f64 formula to the backend's own f32 weights, state and gradient, so the only error is the f32
/// evaluation of a handful of operations (Adam: a sqrt and a division, WGSL's sqrt 2.5 ULP): ≤ ~10 ULP
/// of the update, 1e-6. Plus the rounding of the stored weight, see [`update_slack`]. Observed (both
/// terms): ≤ 2.7e-6 of the update.
const TOL_UPDATE: f64 = 2e-6;
/// Optimizer state (momentum buffer, Adam's moments): two or three f32 operations per element, a few
/// ULP. Observed: ≤ 1.3e-7.
const TOL_STATE: f64 = 1e-6;
/// BatchNorm running statistics: a blend of the stored value and the batch statistic, whose two-pass
/// channel reduction (K = batch × pixels = 150) costs ~√K·ε ≈ 7e-7. Observed: ≤ 7e-8.
const TOL_STATS: f64 = 2e-6;

/// The part of an update error no f32 implementation can avoid: the stored weight is rounded to f32
/// (ε·|w| per element, twice — before and after the step), which is not small next to an update of
/// lr·|g|. Added as an absolute bound to [`TOL_UPDATE`]'s relative one.
fn update_slack(w: &[f64]) -> f64 {
    2.0 * f32::EPSILON as f64 * norm(w)
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

// ---------------------------------------------------------------------------------------------------
// The harnesses: the backends under test behind one interface.
// ---------------------------------------------------------------------------------------------------

/// An executor with its arena, as a case drives it.
trait Exec {
    fn read(&mut self, t: TensorId) -> Result<Vec<f32>, ExecError>;
    fn write(&mut self, t: TensorId, v: &[f32]) -> Result<(), ExecError>;
    fn step(&mut self, x: &[f32], y: Target<'_>) -> Result<StepStats, ExecError>;
    fn evaluate(&mut self, x: &[f32], y: Target<'_>) -> Result<StepStats, ExecError>;
    /// Optimizer steps taken (the dropout seed and Adam's t derive from it).
    fn steps(&self) -> u32;
}

struct Session<'p, B: Backend> {
    ex: Executor<'p, B>,
    arena: Vec<u8>,
}

impl<B: Backend> Exec for Session<'_, B> {
    fn read(&mut self, t: TensorId) -> Result<Vec<f32>, ExecError> {
        self.ex.read_vec(&mut self.arena, t)
    }
    fn write(&mut self, t: TensorId, v: &[f32]) -> Result<(), ExecError> {
        self.ex.write(&mut self.arena, t, v)
    }
    fn step(&mut self, x: &[f32], y: Target<'_>) -> Result<StepStats, ExecError> {
        self.ex.train_step(&mut self.arena, x, y)
    }
    fn evaluate(&mut self, x: &[f32], y: Target<'_>) -> Result<StepStats, ExecError> {
        self.ex.evaluate(&mut self.arena, x, y)
    }
    fn steps(&self) -> u32 {
        self.ex.steps()
    }
}

type Script<'a> = dyn FnMut(&mut dyn Exec) -> Result<(), String> + 'a;

/// A backend the suite can run a plan on.
trait Harness {
    fn name(&self) -> &'static str;
    /// Runs `script` on an executor of `plan` (moved to the backend's memory) with initialised
    /// parameters.
    fn run(&mut self, plan: &Plan, script: &mut Script<'_>) -> Result<(), String>;
}

fn session<B: Backend>(plan: &Plan, backend: B) -> Result<Session<'_, B>, (String, Option<B>)> {
    let arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::with_backend(plan, &arena, backend)
        .map_err(|e| (format!("executor: {e:?}"), None))?;
    let mut arena = arena;
    if let Err(e) = ex.init_params(&mut arena, 3) {
        return Err((format!("init_params: {e:?}"), Some(ex.into_backend())));
    }
    Ok(Session { ex, arena })
}

struct Cpu;

impl Harness for Cpu {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn run(&mut self, plan: &Plan, script: &mut Script<'_>) -> Result<(), String> {
        let mut s = session(plan, CpuBackend::new()).map_err(|e| e.0)?;
        script(&mut s)
    }
}

/// The CPU backend on a pool of threads (kernels split output ranges among them).
struct CpuThreads(ThreadPool);

impl Harness for CpuThreads {
    fn name(&self) -> &'static str {
        "cpu×3"
    }
    fn run(&mut self, plan: &Plan, script: &mut Script<'_>) -> Result<(), String> {
        let mut s = session(plan, CpuBackend::with_pool(&self.0)).map_err(|e| e.0)?;
        script(&mut s)
    }
}

/// The GPU backend, kept between cases (each case's plan is prepared on it again).
struct Wgpu {
    backend: Option<GpuBackend>,
}

impl Harness for Wgpu {
    fn name(&self) -> &'static str {
        "wgpu"
    }
    fn run(&mut self, plan: &Plan, script: &mut Script<'_>) -> Result<(), String> {
        let p = gpu_plan(plan.clone());
        let backend = match self.backend.take() {
            Some(b) => b,
            None => GpuBackend::open().map_err(|e| format!("reopening the GPU: {e}"))?,
        };
        let mut s = match session(&p, backend) {
            Ok(s) => s,
            Err((e, b)) => {
                self.backend = b;
                return Err(e);
            }
        };
        let r = script(&mut s);
        self.backend = Some(s.ex.into_backend());
        r
    }
}

// ---------------------------------------------------------------------------------------------------
// The cases.
// ---------------------------------------------------------------------------------------------------

struct Case {
    name: &'static str,
    spec: ModelSpec,
    batch: usize,
    /// Scale of the inputs (larger: ReLU6 clips).
    x_scale: f32,
    /// fp16 storage: saved activations packed to IEEE half between forward and backward.
    half: bool,
    /// Micro-batches the step's batch is split into (weight gradients accumulated over them).
    micro: u16,
}

fn conv(out: u32, k: [u32; 2], s: [u32; 2], p: [u32; 2], groups: u32, bias: bool) -> LayerKind {
    LayerKind::Conv2d {
        out,
        kernel: k,
        stride: s,
        padding: p,
        groups,
        bias,
    }
}

fn linear(out: u32, bias: bool) -> LayerKind {
    LayerKind::Linear { out, bias }
}

const SGD_MOMENTUM: OptimizerSpec = OptimizerSpec::Sgd {
    lr: 0.1,
    momentum: 0.9,
    weight_decay: 1e-2,
};
const SGD_PLAIN: OptimizerSpec = OptimizerSpec::Sgd {
    lr: 0.05,
    momentum: 0.0,
    weight_decay: 0.0,
};
const ADAM_WD: OptimizerSpec = OptimizerSpec::Adam {
    lr: 0.01,
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-8,
    weight_decay: 1e-2,
};
const ADAM: OptimizerSpec = OptimizerSpec::Adam {
    lr: 0.02,
    beta1: 0.8,
    beta2: 0.99,
    eps: 1e-6,
    weight_decay: 0.0,
};

fn spec(
    input: (u32, u32, u32),
    layers: Vec<frugal_core::model::LayerSpec>,
    loss: LossKind,
    optimizer: OptimizerSpec,
) -> ModelSpec {
    ModelSpec {
        input: Dims {
            c: input.0,
            h: input.1,
            w: input.2,
        },
        layers,
        loss,
        optimizer,
        seed: 11,
    }
}

/// Every op the CPU trains, each where a trainable layer precedes it (so its input derivative is
/// computed) and something follows it (so its output derivative is not just the loss's).
fn cases() -> Vec<Case> {
    use LayerKind as K;
    use Src::{Input, Layer};
    let bn = K::BatchNorm2d {
        eps: 1e-5,
        momentum: 0.1,
    };
    let mut frozen_bn = layer("bn_eval", bn.clone(), &[Layer(4)]);
    frozen_bn.trainable = false;
    vec![
        Case {
            name: "linear+relu, CE, SGD momentum+wd",
            spec: spec(
                (1, 3, 4),
                vec![
                    layer("flat", K::Flatten, &[Input]),
                    layer("fc1", linear(12, true), &[Layer(0)]),
                    layer("relu", K::Relu, &[Layer(1)]),
                    layer("fc2", linear(5, false), &[Layer(2)]),
                ],
                LossKind::SoftmaxCrossEntropy,
                SGD_MOMENTUM,
            ),
            batch: 8,
            x_scale: 1.0,
            half: false,
            micro: 1,
        },
        Case {
            name: "sigmoid+tanh, MSE, Adam+wd",
            spec: spec(
                (2, 2, 3),
                vec![
                    layer("flat", K::Flatten, &[Input]),
                    layer("fc1", linear(10, true), &[Layer(0)]),
                    layer("sig", K::Sigmoid, &[Layer(1)]),
                    layer("fc2", linear(10, true), &[Layer(2)]),
                    layer("tanh", K::Tanh, &[Layer(3)]),
                    layer("fc3", linear(3, true), &[Layer(4)]),
                ],
                LossKind::Mse,
                ADAM_WD,
            ),
            batch: 6,
            x_scale: 1.0,
            half: false,
            micro: 1,
        },
        Case {
            name: "conv stride/pad, grouped, relu6, SGD",
            spec: spec(
                (4, 7, 7),
                vec![
                    layer("c1", conv(6, [3, 3], [2, 2], [1, 1], 1, true), &[Input]),
                    layer("relu6", K::Relu6, &[Layer(0)]),
                    layer("c2", conv(4, [2, 3], [1, 2], [1, 0], 2, false), &[Layer(1)]),
                    layer("flat", K::Flatten, &[Layer(2)]),
                    layer("fc", linear(4, true), &[Layer(3)]),
                ],
                LossKind::SoftmaxCrossEntropy,
                SGD_PLAIN,
            ),
            batch: 5,
            // Pre-activations spread to about ±15: ReLU6 clips about one in ten above 6 (the mutation check
            // "clamp at 7" fails).
            x_scale: 10.0,
            half: false,
            micro: 1,
        },
        Case {
            name: "depthwise conv, tanh, GAP, Adam",
            spec: spec(
                (3, 6, 6),
                vec![
                    layer("pw", conv(6, [1, 1], [1, 1], [0, 0], 1, true), &[Input]),
                    layer("dw", conv(6, [3, 3], [1, 1], [1, 1], 6, false), &[Layer(0)]),
                    layer("tanh", K::Tanh, &[Layer(1)]),
                    layer("dw2", conv(6, [3, 3], [2, 2], [0, 0], 6, true), &[Layer(2)]),
                    layer("gap", K::GlobalAvgPool, &[Layer(3)]),
                    layer("flat", K::Flatten, &[Layer(4)]),
                    layer("fc", linear(3, true), &[Layer(5)]),
                ],
                LossKind::SoftmaxCrossEntropy,
                ADAM,
            ),
            batch: 4,
            x_scale: 1.0,
            half: false,
            micro: 1,
        },
        Case {
            name: "max/avg/global pooling, MSE, SGD momentum",
            spec: spec(
                (2, 8, 8),
                vec![
                    layer("c1", conv(4, [3, 3], [1, 1], [1, 1], 1, true), &[Input]),
                    layer(
                        "maxpool",
                        K::MaxPool2d {
                            kernel: [3, 3],
                            stride: [2, 2],
                        },
                        &[Layer(0)],
                    ),
                    layer(
                        "avgpool",
                        K::AvgPool2d {
                            kernel: [2, 2],
                            stride: [1, 1],
                        },
                        &[Layer(1)],
                    ),
                    layer("gap", K::GlobalAvgPool, &[Layer(2)]),
                    layer("flat", K::Flatten, &[Layer(3)]),
                    layer("fc", linear(3, true), &[Layer(4)]),
                ],
                LossKind::Mse,
                SGD_MOMENTUM,
            ),
            batch: 5,
            x_scale: 1.0,
            half: false,
            micro: 1,
        },
        Case {
            name: "add (residual), CE, Adam",
            spec: spec(
                (1, 2, 5),
                vec![
                    layer("flat", K::Flatten, &[Input]),
                    layer("fc1", linear(8, true), &[Layer(0)]),
                    layer("relu", K::Relu, &[Layer(1)]),
                    layer("fc2", linear(8, true), &[Layer(2)]),
                    layer("add", K::Add, &[Layer(3), Layer(2)]),
                    layer("tanh", K::Tanh, &[Layer(4)]),
                    layer("fc3", linear(4, true), &[Layer(5)]),
                ],
                LossKind::SoftmaxCrossEntropy,
                ADAM,
            ),
            batch: 7,
            x_scale: 1.0,
            half: false,
            micro: 1,
        },
        Case {
            name: "batchnorm train + frozen (eval), Adam",
            spec: spec(
                (2, 5, 5),
                vec![
                    layer("c1", conv(4, [3, 3], [1, 1], [1, 1], 1, false), &[Input]),
                    layer("bn", bn.clone(), &[Layer(0)]),
                    layer("relu", K::Relu, &[Layer(1)]),
                    layer("c2", conv(3, [3, 3], [1, 1], [1, 1], 1, true), &[Layer(2)]),
                    layer("tanh", K::Tanh, &[Layer(3)]),
                    frozen_bn,
                    layer("gap", K::GlobalAvgPool, &[Layer(5)]),
                    layer("flat", K::Flatten, &[Layer(6)]),
                    layer("fc", linear(3, true), &[Layer(7)]),
                ],
                LossKind::SoftmaxCrossEntropy,
                ADAM,
            ),
            batch: 6,
            x_scale: 1.0,
            half: false,
            micro: 1,
        },
        Case {
            name: "dropout, CE, SGD momentum+wd",
            spec: spec(
                (1, 4, 4),
                vec![
                    layer("flat", K::Flatten, &[Input]),
                    layer("fc1", linear(16, true), &[Layer(0)]),
                    layer("drop", K::Dropout { p: 0.3 }, &[Layer(1)]),
                    layer("fc2", linear(4, true), &[Layer(2)]),
                ],
                LossKind::SoftmaxCrossEntropy,
                SGD_MOMENTUM,
            ),
            batch: 8,
            x_scale: 1.0,
            half: false,
            micro: 1,
        },
        Case {
            name: "fp16 storage (pack/unpack), CE, Adam",
            spec: spec(
                (2, 6, 6),
                vec![
                    layer("c1", conv(4, [3, 3], [1, 1], [1, 1], 1, true), &[Input]),
                    layer("relu", K::Relu, &[Layer(0)]),
                    layer(
                        "maxpool",
                        K::MaxPool2d {
                            kernel: [2, 2],
                            stride: [2, 2],
                        },
                        &[Layer(1)],
                    ),
                    layer("c2", conv(4, [3, 3], [1, 1], [1, 1], 2, true), &[Layer(2)]),
                    layer("tanh", K::Tanh, &[Layer(3)]),
                    layer("flat", K::Flatten, &[Layer(4)]),
                    layer("fc", linear(3, true), &[Layer(5)]),
                ],
                LossKind::SoftmaxCrossEntropy,
                ADAM,
            ),
            batch: 6,
            x_scale: 1.0,
            half: true,
            micro: 1,
        },
        Case {
            // The accumulating kernels: weight gradients summed over micro-batches, the loss's
            // derivative normalised by the whole batch, dropout masks keyed by the sample's index in
            // the whole batch. (No BatchNorm: its statistics are per micro-batch by design.)
            name: "3 micro-batches: conv, dropout, MSE, SGD",
            spec: spec(
                (2, 5, 5),
                vec![
                    layer("c1", conv(3, [3, 3], [1, 1], [1, 1], 1, true), &[Input]),
                    layer("relu", K::Relu, &[Layer(0)]),
                    layer("c2", conv(4, [3, 3], [2, 2], [0, 0], 1, true), &[Layer(1)]),
                    layer("flat", K::Flatten, &[Layer(2)]),
                    layer("fc1", linear(6, true), &[Layer(3)]),
                    layer("drop", K::Dropout { p: 0.25 }, &[Layer(4)]),
                    layer("fc2", linear(3, true), &[Layer(5)]),
                ],
                LossKind::Mse,
                SGD_MOMENTUM,
            ),
            batch: 9,
            x_scale: 1.0,
            half: false,
            micro: 3,
        },
    ]
}

/// The case's plan, made observable: no in-place merging and every storage live to the end of the
/// step, so no two tensors share bytes and every tensor of the step can be read after it.
fn observable_plan(case: &Case) -> Plan {
    let micro = case.micro.max(1);
    assert!(
        case.batch.is_multiple_of(micro as usize) && !(case.half && micro > 1),
        "{}: a batch of whole micro-batches, fp16 storage on one",
        case.name
    );
    let g = Graph::new(&case.spec, case.batch / micro as usize).expect("the case's model realises");
    let mut p = if case.half {
        // fp16 storage's program and half copies, laid out without in-place merging.
        let h = f16_storage(&g);
        assert!(!h.graph.halves.is_empty(), "the fp16 case packs something");
        let roots = share_groups(&h.graph, false);
        Plan::from_program(h.graph, 1, h.program, roots)
    } else {
        Plan::shaped(
            g,
            PlanShape {
                micro_batches: micro,
                in_place: false,
            },
        )
    };
    let end = p.n_eo().saturating_sub(1);
    for l in &mut p.lives {
        l.last = end;
    }
    p.place_spaces(|_, _| SpaceId::HOST, |_| ALIGN);
    p
}

// ---------------------------------------------------------------------------------------------------
// The f64 reference: the graph's nodes interpreted with plain loops.
// ---------------------------------------------------------------------------------------------------

type Vals = HashMap<TensorId, Vec<f64>>;

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// Whether element `i` of sample `sample` of dropout layer `layer` is kept in the step with `seed`:
/// the CPU's counter-based rule (frugal-core `ops::dropout`'s module docs), restated here.
fn dropout_keep(p: f32, step_seed: u64, layer: u32, sample: usize, i: usize) -> bool {
    let s = hash2(hash2(step_seed, layer as u64), sample as u64);
    ((hash2(s, i as u64) >> 40) as f64) / (1u64 << 24) as f64 >= p as f64
}

/// `x` rounded to IEEE half (nearest even; magnitudes beyond the largest half saturate at ±65504, as
/// frugal's pack does), in f64.
fn round_f16(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let a = x.abs();
    // The exponent of a's binade, at least the smallest normal's (subnormals share its spacing).
    let e = a.log2().floor().max(-14.0);
    let ulp = (e - 10.0).exp2();
    let r = ((a / ulp).round_ties_even() * ulp).min(65504.0);
    r.copysign(x)
}

/// The value of IEEE half bits.
fn from_f16_bits(b: u16) -> f64 {
    let sign = if b >> 15 == 1 { -1.0 } else { 1.0 };
    let e = ((b >> 10) & 0x1f) as i32;
    let m = (b & 0x3ff) as f64;
    sign * match e {
        0 => m * (-24f64).exp2(),
        31 if m == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        _ => (1.0 + m / 1024.0) * ((e - 15) as f64).exp2(),
    }
}

/// What the reference computed for one step.
struct Reference {
    /// Every tensor's value after the forward (activations), at the step's start (weights, stats).
    vals: Vals,
    /// dL/d(tensor) for activations and parameters.
    grads: Vals,
    /// Running statistics after the step (BatchNorm in training mode).
    stats: Vals,
    /// Mean loss.
    loss: f64,
}

/// A batch: inputs, and the labels or targets (whichever the loss takes).
struct Batch {
    x: Vec<f32>,
    labels: Vec<u32>,
    targets: Vec<f32>,
}

impl Batch {
    /// `n` samples.
    fn new(g: &Graph, n: usize, seed: u64, x_scale: f32) -> Batch {
        let outs = g.pred_dims().numel();
        Batch {
            x: data(n * g.input_dims.numel(), seed, x_scale),
            labels: (0..n)
                .map(|i| ((i * 5 + seed as usize) % outs) as u32)
                .collect(),
            targets: data(n * outs, seed + 1, 0.8),
        }
    }
    fn target(&self, loss: LossKind) -> Target<'_> {
        match loss {
            LossKind::SoftmaxCrossEntropy => Target::Classes(&self.labels),
            LossKind::Mse => Target::Values(&self.targets),
        }
    }
}

/// One forward (and, when `train`, backward) of the graph on `b` with the persistent values `state`.
/// `packed`: for fp16 storage, what the backward reads of each packed activation (its half rounding).
fn reference(
    g: &Graph,
    state: &Vals,
    b: &Batch,
    train: bool,
    step_seed: u64,
    packed: &Vals,
) -> Reference {
    let (labels, targets) = (&b.labels, &b.targets);
    // The whole batch (every micro-batch at once).
    let n = labels.len();
    let mut v: Vals = state.clone();
    v.insert(g.input, f64s(&b.x));
    let mut stats: Vals = HashMap::new();
    // BatchNorm's batch statistics per node, (mean, biased variance) per channel: its backward uses
    // the forward's (a recomputation from fp16-rounded inputs would differ).
    let mut bn_stats: HashMap<usize, Vec<(f64, f64)>> = HashMap::new();
    // Max pooling's arg-max per output (input index), per node.
    let mut argmax: HashMap<usize, Vec<usize>> = HashMap::new();
    for (ni, node) in g.nodes.iter().enumerate() {
        let xs: Vec<&Vec<f64>> = node.inputs.iter().map(|t| &v[t]).collect();
        let x0 = xs[0];
        let pv = |k: usize| &v[&node.params[k].value];
        let y: Vec<f64> = match &node.op {
            NodeOp::Linear { fin, fout } => {
                let w = pv(0);
                let mut y = vec![0.0; n * fout];
                for s in 0..n {
                    for o in 0..*fout {
                        let mut acc = node.params.get(1).map_or(0.0, |b| v[&b.value][o]);
                        for i in 0..*fin {
                            acc += w[o * fin + i] * x0[s * fin + i];
                        }
                        y[s * fout + o] = acc;
                    }
                }
                y
            }
            NodeOp::Conv(c) => {
                let w = pv(0);
                let (cig, cog) = (c.cin / c.groups, c.cout / c.groups);
                assert_eq!(c.oh, (c.h + 2 * c.ph - c.kh) / c.sh + 1, "output height");
                assert_eq!(c.ow, (c.w + 2 * c.pw - c.kw) / c.sw + 1, "output width");
                let mut y = vec![0.0; n * c.cout * c.oh * c.ow];
                for s in 0..n {
                    for co in 0..c.cout {
                        let grp = co / cog;
                        for oy in 0..c.oh {
                            for ox in 0..c.ow {
                                let mut acc = node.params.get(1).map_or(0.0, |b| v[&b.value][co]);
                                for cl in 0..cig {
                                    let ci = grp * cig + cl;
                                    for ky in 0..c.kh {
                                        for kx in 0..c.kw {
                                            let iy = (oy * c.sh + ky) as isize - c.ph as isize;
                                            let ix = (ox * c.sw + kx) as isize - c.pw as isize;
                                            if iy < 0
                                                || ix < 0
                                                || iy >= c.h as isize
                                                || ix >= c.w as isize
                                            {
                                                continue;
                                            }
                                            let xi = ((s * c.cin + ci) * c.h + iy as usize) * c.w
                                                + ix as usize;
                                            let wi = ((co * cig + cl) * c.kh + ky) * c.kw + kx;
                                            acc += w[wi] * x0[xi];
                                        }
                                    }
                                }
                                y[((s * c.cout + co) * c.oh + oy) * c.ow + ox] = acc;
                            }
                        }
                    }
                }
                y
            }
            NodeOp::MaxPool(p) | NodeOp::AvgPool(p) => {
                let max = matches!(node.op, NodeOp::MaxPool(_));
                let mut y = vec![0.0; n * p.c * p.oh * p.ow];
                let mut am = vec![0usize; y.len()];
                for sc in 0..n * p.c {
                    for oy in 0..p.oh {
                        for ox in 0..p.ow {
                            let (mut best, mut at, mut sum) = (f64::NEG_INFINITY, 0, 0.0);
                            for ky in 0..p.kh {
                                for kx in 0..p.kw {
                                    let xi = (sc * p.h + oy * p.sh + ky) * p.w + ox * p.sw + kx;
                                    sum += x0[xi];
                                    // The first maximum in the window (strictly greater replaces).
                                    if x0[xi] > best {
                                        best = x0[xi];
                                        at = xi;
                                    }
                                }
                            }
                            let o = (sc * p.oh + oy) * p.ow + ox;
                            y[o] = if max {
                                best
                            } else {
                                sum / (p.kh * p.kw) as f64
                            };
                            am[o] = at;
                        }
                    }
                }
                argmax.insert(ni, am);
                y
            }
            NodeOp::GlobalAvgPool { c, hw } => (0..n * c)
                .map(|sc| x0[sc * hw..(sc + 1) * hw].iter().sum::<f64>() / *hw as f64)
                .collect(),
            NodeOp::Act(a) => x0
                .iter()
                .map(|&z| match a {
                    Act::Relu => z.max(0.0),
                    Act::Relu6 => z.clamp(0.0, 6.0),
                    Act::Sigmoid => 1.0 / (1.0 + (-z).exp()),
                    Act::Tanh => z.tanh(),
                })
                .collect(),
            NodeOp::View => x0.clone(),
            NodeOp::Add => (0..x0.len())
                .map(|i| xs.iter().map(|x| x[i]).sum())
                .collect(),
            NodeOp::BatchNorm {
                c,
                hw,
                eps,
                momentum,
                train: batch_stats,
            } => {
                let (gamma, beta) = (pv(0), pv(1));
                let (rm, rv) = (&v[&node.stats[0]], &v[&node.stats[1]]);
                let m = (n * hw) as f64;
                let mut y = vec![0.0; x0.len()];
                let (mut nrm, mut nrv) = (rm.clone(), rv.clone());
                let mut saved = Vec::new();
                for ch in 0..*c {
                    let idx = |s: usize, i: usize| (s * c + ch) * hw + i;
                    let (mean, var) = if *batch_stats && train {
                        let mut sum = 0.0;
                        for s in 0..n {
                            for i in 0..*hw {
                                sum += x0[idx(s, i)];
                            }
                        }
                        let mean = sum / m;
                        let mut sq = 0.0;
                        for s in 0..n {
                            for i in 0..*hw {
                                sq += (x0[idx(s, i)] - mean).powi(2);
                            }
                        }
                        let mo = *momentum as f64;
                        nrm[ch] = (1.0 - mo) * rm[ch] + mo * mean;
                        nrv[ch] = (1.0 - mo) * rv[ch] + mo * sq / (m - 1.0);
                        (mean, sq / m)
                    } else {
                        (rm[ch], rv[ch])
                    };
                    saved.push((mean, var));
                    let inv = 1.0 / (var + *eps as f64).sqrt();
                    for s in 0..n {
                        for i in 0..*hw {
                            y[idx(s, i)] = gamma[ch] * (x0[idx(s, i)] - mean) * inv + beta[ch];
                        }
                    }
                }
                bn_stats.insert(ni, saved);
                if *batch_stats && train {
                    stats.insert(node.stats[0], nrm);
                    stats.insert(node.stats[1], nrv);
                }
                y
            }
            NodeOp::Dropout { p } => {
                let per = x0.len() / n;
                let scale = 1.0 / (1.0 - *p as f64);
                (0..x0.len())
                    .map(|i| {
                        let keep =
                            !train || dropout_keep(*p, step_seed, node.layer, i / per, i % per);
                        if keep && train {
                            x0[i] * scale
                        } else if keep {
                            x0[i]
                        } else {
                            0.0
                        }
                    })
                    .collect()
            }
            op => unreachable!("{op:?}: no conformance case (the GPU refuses sequence layers)"),
        };
        v.insert(node.out, y);
    }

    // The loss and dL/d(prediction).
    let z = &v[&g.pred()];
    let k = z.len() / n;
    let mut dz = vec![0.0; z.len()];
    let loss = match g.loss {
        LossKind::SoftmaxCrossEntropy => {
            let mut total = 0.0;
            for s in 0..n {
                let row = &z[s * k..(s + 1) * k];
                let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let se: f64 = row.iter().map(|&a| (a - m).exp()).sum();
                total += se.ln() - (row[labels[s] as usize] - m);
                for j in 0..k {
                    let p = (row[j] - m).exp() / se;
                    dz[s * k + j] = (p - f64::from(j == labels[s] as usize)) / n as f64;
                }
            }
            total / n as f64
        }
        LossKind::Mse => {
            let len = z.len() as f64;
            let mut total = 0.0;
            for i in 0..z.len() {
                let d = z[i] - targets[i] as f64;
                total += d * d;
                dz[i] = 2.0 * d / len;
            }
            total / len
        }
    };
    let mut d: Vals = HashMap::new();
    let forward = v.clone();
    if train {
        // The backward reads packed activations as their half copies widened back.
        for (t, h) in packed {
            v.insert(*t, h.clone());
        }
        d.insert(g.pred(), dz);
        for (ni, node) in g.nodes.iter().enumerate().rev() {
            let Some(dy) = d.get(&node.out).cloned() else {
                continue;
            };
            let mut dxs: Vec<Vec<f64>> =
                node.inputs.iter().map(|t| vec![0.0; v[t].len()]).collect();
            let mut dps: Vec<Vec<f64>> = node
                .params
                .iter()
                .map(|p| vec![0.0; v[&p.value].len()])
                .collect();
            let x0 = &v[&node.inputs[0]];
            let y = &v[&node.out];
            match &node.op {
                NodeOp::Linear { fin, fout } => {
                    let w = &v[&node.params[0].value];
                    for s in 0..n {
                        for o in 0..*fout {
                            let g = dy[s * fout + o];
                            if dps.len() > 1 {
                                dps[1][o] += g;
                            }
                            for i in 0..*fin {
                                dps[0][o * fin + i] += g * x0[s * fin + i];
                                dxs[0][s * fin + i] += g * w[o * fin + i];
                            }
                        }
                    }
                }
                NodeOp::Conv(c) => {
                    let w = &v[&node.params[0].value];
                    let (cig, cog) = (c.cin / c.groups, c.cout / c.groups);
                    for s in 0..n {
                        for co in 0..c.cout {
                            let grp = co / cog;
                            for oy in 0..c.oh {
                                for ox in 0..c.ow {
                                    let g = dy[((s * c.cout + co) * c.oh + oy) * c.ow + ox];
                                    if dps.len() > 1 {
                                        dps[1][co] += g;
                                    }
                                    for cl in 0..cig {
                                        let ci = grp * cig + cl;
                                        for ky in 0..c.kh {
                                            for kx in 0..c.kw {
                                                let iy = (oy * c.sh + ky) as isize - c.ph as isize;
                                                let ix = (ox * c.sw + kx) as isize - c.pw as isize;
                                                if iy < 0
                                                    || ix < 0
                                                    || iy >= c.h as isize
                                                    || ix >= c.w as isize
                                                {
                                                    continue;
                                                }
                                                let xi = ((s * c.cin + ci) * c.h + iy as usize)
                                                    * c.w
                                                    + ix as usize;
                                                let wi = ((co * cig + cl) * c.kh + ky) * c.kw + kx;
                                                dps[0][wi] += g * x0[xi];
                                                dxs[0][xi] += g * w[wi];
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                NodeOp::MaxPool(_) => {
                    for (o, &at) in argmax[&ni].iter().enumerate() {
                        dxs[0][at] += dy[o];
                    }
                }
                NodeOp::AvgPool(p) => {
                    let area = (p.kh * p.kw) as f64;
                    for sc in 0..n * p.c {
                        for oy in 0..p.oh {
                            for ox in 0..p.ow {
                                let g = dy[(sc * p.oh + oy) * p.ow + ox] / area;
                                for ky in 0..p.kh {
                                    for kx in 0..p.kw {
                                        dxs[0]
                                            [(sc * p.h + oy * p.sh + ky) * p.w + ox * p.sw + kx] +=
                                            g;
                                    }
                                }
                            }
                        }
                    }
                }
                NodeOp::GlobalAvgPool { c, hw } => {
                    for sc in 0..n * c {
                        for i in 0..*hw {
                            dxs[0][sc * hw + i] = dy[sc] / *hw as f64;
                        }
                    }
                }
                NodeOp::Act(a) => {
                    for i in 0..dy.len() {
                        // From the output, with PyTorch's conventions at the kinks (ReLU'(0) = 0,
                        // ReLU6 passes the gradient only strictly inside (0, 6)).
                        dxs[0][i] = dy[i]
                            * match a {
                                Act::Relu => f64::from(y[i] > 0.0),
                                Act::Relu6 => f64::from(y[i] > 0.0 && y[i] < 6.0),
                                Act::Sigmoid => y[i] * (1.0 - y[i]),
                                Act::Tanh => 1.0 - y[i] * y[i],
                            };
                    }
                }
                NodeOp::View => dxs[0].copy_from_slice(&dy),
                NodeOp::Add => {
                    for dx in &mut dxs {
                        dx.copy_from_slice(&dy);
                    }
                }
                NodeOp::BatchNorm {
                    c,
                    hw,
                    eps,
                    train: batch_stats,
                    ..
                } => {
                    let gamma = &v[&node.params[0].value];
                    let m = (n * hw) as f64;
                    for ch in 0..*c {
                        let idx = |s: usize, i: usize| (s * c + ch) * hw + i;
                        let all = || (0..n).flat_map(|s| (0..*hw).map(move |i| (s, i)));
                        let (mean, var) = bn_stats[&ni][ch];
                        let inv = 1.0 / (var + *eps as f64).sqrt();
                        let xhat = |s: usize, i: usize| (x0[idx(s, i)] - mean) * inv;
                        let sdy: f64 = all().map(|(s, i)| dy[idx(s, i)]).sum();
                        let sdyx: f64 = all().map(|(s, i)| dy[idx(s, i)] * xhat(s, i)).sum();
                        dps[0][ch] = sdyx;
                        dps[1][ch] = sdy;
                        for (s, i) in all() {
                            dxs[0][idx(s, i)] = if *batch_stats {
                                gamma[ch] * inv / m * (m * dy[idx(s, i)] - sdy - xhat(s, i) * sdyx)
                            } else {
                                gamma[ch] * inv * dy[idx(s, i)]
                            };
                        }
                    }
                }
                NodeOp::Dropout { p } => {
                    let per = dy.len() / n;
                    let scale = 1.0 / (1.0 - *p as f64);
                    for i in 0..dy.len() {
                        if dropout_keep(*p, step_seed, node.layer, i / per, i % per) {
                            dxs[0][i] = dy[i] * scale;
                        }
                    }
                }
                op => unreachable!("{op:?}: no conformance case (the GPU refuses sequence layers)"),
            }
            for (t, dx) in node.inputs.iter().zip(dxs) {
                let e = d.entry(*t).or_insert_with(|| vec![0.0; dx.len()]);
                e.iter_mut().zip(&dx).for_each(|(a, b)| *a += b);
            }
            for (p, dp) in node.params.iter().zip(dps) {
                d.insert(p.value, dp);
            }
        }
    }
    Reference {
        vals: forward,
        grads: d,
        stats,
        loss,
    }
}

/// The optimizer's update in f64 (PyTorch's SGD and Adam, `foreach=False`): the new weight and
/// state slots from the weight, gradient and state before it, at step `t` (1-based).
fn reference_update(
    opt: &OptimizerSpec,
    t: u32,
    w: &[f64],
    g: &[f64],
    state: &[Vec<f64>],
) -> (Vec<f64>, Vec<Vec<f64>>) {
    let mut w = w.to_vec();
    let mut state = state.to_vec();
    match *opt {
        OptimizerSpec::Sgd {
            lr,
            momentum,
            weight_decay,
        } => {
            let (lr, mu, wd) = (lr as f64, momentum as f64, weight_decay as f64);
            for i in 0..w.len() {
                let d = g[i] + wd * w[i];
                let step = if mu != 0.0 {
                    state[0][i] = mu * state[0][i] + d;
                    state[0][i]
                } else {
                    d
                };
                w[i] -= lr * step;
            }
        }
        OptimizerSpec::AdamW { .. } => unreachable!("the GPU refuses AdamW"),
        OptimizerSpec::Adam {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } => {
            let (lr, b1, b2, eps, wd) = (
                lr as f64,
                beta1 as f64,
                beta2 as f64,
                eps as f64,
                weight_decay as f64,
            );
            let bc1 = 1.0 - b1.powi(t as i32);
            let bc2 = 1.0 - b2.powi(t as i32);
            for i in 0..w.len() {
                let g = g[i] + wd * w[i];
                state[0][i] = b1 * state[0][i] + (1.0 - b1) * g;
                state[1][i] = b2 * state[1][i] + (1.0 - b2) * g * g;
                w[i] -= lr / bc1 * state[0][i] / (state[1][i].sqrt() / bc2.sqrt() + eps);
            }
        }
    }
    (w, state)
}

// ---------------------------------------------------------------------------------------------------
// Running a case and comparing.
// ---------------------------------------------------------------------------------------------------

/// What a check compares (a column of the table).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Forward,
    Loss,
    /// Input derivatives and dL/d(prediction).
    Dx,
    /// Weight gradients.
    Grad,
    Update,
    State,
    Stats,
}

impl Kind {
    const ALL: [Kind; 7] = [
        Kind::Forward,
        Kind::Loss,
        Kind::Dx,
        Kind::Grad,
        Kind::Update,
        Kind::State,
        Kind::Stats,
    ];
    fn heading(self) -> &'static str {
        match self {
            Kind::Forward => "forward",
            Kind::Loss => "loss",
            Kind::Dx => "dL/dx",
            Kind::Grad => "dL/dW",
            Kind::Update => "update",
            Kind::State => "opt state",
            Kind::Stats => "run stats",
        }
    }
}

/// One comparison: the error norm, the scale it is relative to, and its bound.
struct Check {
    kind: Kind,
    what: String,
    /// ‖got − ref‖₂ / scale.
    rel: f64,
    tol: f64,
    passed: bool,
}

#[derive(Default)]
struct Report {
    checks: Vec<Check>,
    /// Errors that are not a tolerance (a mask bit that differs, a backend error).
    failures: Vec<String>,
    /// Tensors checked bit for bit: dropout masks, fp16 storage's half copies.
    exact: usize,
}

impl Report {
    /// `got` against `want`: ‖got − want‖ ≤ tol·‖scale‖ + slack (scale: `want` itself unless given).
    fn close(&mut self, kind: Kind, what: String, got: &[f32], want: &[f64], tol: f64) {
        self.close_scaled(kind, what, got, want, want, tol, 0.0)
    }

    #[allow(clippy::too_many_arguments)]
    fn close_scaled(
        &mut self,
        kind: Kind,
        what: String,
        got: &[f32],
        want: &[f64],
        scale: &[f64],
        tol: f64,
        slack: f64,
    ) {
        if got.len() != want.len() {
            self.failures.push(format!(
                "{what}: {} values, the reference {}",
                got.len(),
                want.len()
            ));
            return;
        }
        let err = got
            .iter()
            .zip(want)
            .map(|(&a, &b)| (a as f64 - b).powi(2))
            .sum::<f64>()
            .sqrt();
        // A scale of zero (an all-zero reference): only an exact zero passes.
        let s = norm(scale).max(f64::MIN_POSITIVE);
        let passed = err.is_finite() && err <= tol * s + slack;
        self.checks.push(Check {
            kind,
            what,
            rel: err / s,
            tol: tol + slack / s,
            passed,
        });
    }

    fn worst(&self) -> Option<&Check> {
        self.checks
            .iter()
            .max_by(|a, b| (a.rel / a.tol).total_cmp(&(b.rel / b.tol)))
    }

    fn passed(&self) -> bool {
        self.failures.is_empty() && self.checks.iter().all(|c| c.passed)
    }
}

/// The persistent tensors (parameters, optimizer state, statistics), read from the backend.
fn read_state(ex: &mut dyn Exec, g: &Graph) -> Result<Vals, String> {
    let mut ids = Vec::new();
    for node in &g.nodes {
        for p in &node.params {
            ids.push(p.value);
            ids.extend(&p.state);
        }
        ids.extend(&node.stats);
    }
    let mut out = HashMap::new();
    for t in ids {
        let v = ex
            .read(t)
            .map_err(|e| format!("reading tensor {t}: {e:?}"))?;
        out.insert(t, f64s(&v));
    }
    Ok(out)
}

/// Known starting values: every parameter and statistic from seeded data (BatchNorm's γ and running
/// variance around 1, not exactly 1, so a swapped or ignored term shows).
fn seed_state(ex: &mut dyn Exec, g: &Graph) -> Result<(), String> {
    let mut seed = 100;
    let mut put = |ex: &mut dyn Exec, t: TensorId, len_of: usize, f: &dyn Fn(f32) -> f32| {
        seed += 1;
        let v: Vec<f32> = data(len_of, seed, 1.0).into_iter().map(f).collect();
        ex.write(t, &v)
            .map_err(|e| format!("writing tensor {t}: {e:?}"))
    };
    for node in &g.nodes {
        let bn = matches!(node.op, NodeOp::BatchNorm { .. });
        let fan_in = node
            .params
            .first()
            .map_or(1, |p| p.shape.iter().skip(1).product::<usize>().max(1));
        for (k, p) in node.params.iter().enumerate() {
            let len = p.shape.iter().product();
            let scale = 1.5 / (fan_in as f32).sqrt();
            match (bn, k) {
                (true, 0) => put(ex, p.value, len, &|u| 1.0 + 0.5 * u)?,
                (true, _) => put(ex, p.value, len, &|u| 0.3 * u)?,
                (false, _) => put(ex, p.value, len, &|u| scale * u)?,
            }
        }
        if let [rm, rv] = node.stats[..] {
            let c = g.tensors[rm as usize].bytes / 4;
            put(ex, rm, c, &|u| 0.2 * u)?;
            put(ex, rv, c, &|u| 1.0 + 0.5 * u)?;
        }
    }
    Ok(())
}

const STEPS: u64 = 2;

/// The case on one backend: two training steps and an evaluation, every tensor compared.
fn run_case(h: &mut dyn Harness, case: &Case) -> Report {
    let plan = observable_plan(case);
    let g = &plan.graph;
    let n = case.batch;
    // With micro-batches, each micro-batch's activations and derivatives are a segment of their own
    // (a fresh write starts one), and a tensor read after the step is its first segment: the first
    // micro-batch, the batch's first `mb` samples, the head of the reference's values.
    let mb = g.batch;
    let head =
        |want: &[f64], got: &[f32]| -> Vec<f64> { want[..got.len().min(want.len())].to_vec() };
    let mut report = Report::default();
    let rd = |ex: &mut dyn Exec, t: TensorId| {
        ex.read(t).map_err(|e| format!("reading tensor {t}: {e:?}"))
    };
    let r = h.run(&plan, &mut |ex: &mut dyn Exec| {
        seed_state(ex, g)?;
        for step in 0..STEPS {
            let b = Batch::new(g, n, 10 * (step + 1), case.x_scale);
            let before = read_state(ex, g)?;
            let step_seed = hash2(g.seed, ex.steps() as u64);
            let t = ex.steps() + 1;
            let st = ex
                .step(&b.x, b.target(g.loss))
                .map_err(|e| format!("step {step}: {e:?}"))?;
            let at = |what: &str| format!("step {step}: {what}");
            // fp16 storage: each half copy holds its activation rounded to half, bit for bit, and the
            // reference's backward reads those values.
            let mut packed = HashMap::new();
            for &(t, half) in &g.halves {
                let y = rd(ex, t)?;
                let bits: Vec<u16> = rd(ex, half)?
                    .iter()
                    .flat_map(|w| {
                        let b = w.to_bits();
                        [b as u16, (b >> 16) as u16]
                    })
                    .collect();
                let want: Vec<f64> = y.iter().map(|&v| round_f16(v as f64)).collect();
                let wrong = want
                    .iter()
                    .zip(&bits)
                    .filter(|(w, b)| from_f16_bits(**b) != **w)
                    .count();
                if bits.len() != want.len() || wrong > 0 {
                    report.failures.push(at(&format!(
                        "{}: {wrong} of {} half values differ from the f32 value rounded to half",
                        g.tensors[half as usize].name,
                        want.len()
                    )));
                }
                report.exact += 1;
                packed.insert(t, want);
            }
            let rf = reference(g, &before, &b, true, step_seed, &packed);
            report.close(Kind::Loss, at("loss"), &[st.loss], &[rf.loss], TOL_LOSS);
            for node in &g.nodes {
                if plan.storage_at(node.out, 0).is_none() {
                    continue; // a view of the input batch: the host's bytes, not the plan's
                }
                let y = rd(ex, node.out)?;
                report.close(
                    Kind::Forward,
                    at(&format!("{} forward", node.name)),
                    &y,
                    &head(&rf.vals[&node.out], &y),
                    TOL_FORWARD,
                );
                if let NodeOp::Dropout { p } = node.op {
                    // The mask bit for bit: an element is zero exactly where the CPU's rule drops it
                    // (the layer's input is a linear layer's output, never exactly zero).
                    let per = y.len() / mb;
                    let x_in = rd(ex, node.inputs[0])?;
                    let dx = node.d_in[0].map(|(t, _)| rd(ex, t)).transpose()?;
                    let mut wrong = 0;
                    for i in 0..y.len() {
                        let keep = dropout_keep(p, step_seed, node.layer, i / per, i % per);
                        if x_in[i] == 0.0 {
                            return Err(at(
                                "a dropout input is exactly zero: the mask check is void",
                            ));
                        }
                        let dropped_dx = dx.as_ref().is_some_and(|d| d[i] == 0.0);
                        if keep == (y[i] == 0.0) || (!keep && dx.is_some() && !dropped_dx) {
                            wrong += 1;
                        }
                    }
                    report.exact += 1;
                    if wrong > 0 {
                        report.failures.push(at(&format!(
                            "{}: {wrong} of {} mask bits differ from the CPU's rule",
                            node.name,
                            y.len()
                        )));
                    }
                }
                for (k, d_in) in node.d_in.iter().enumerate() {
                    if let Some((t, _)) = d_in {
                        let got = rd(ex, *t)?;
                        report.close(
                            Kind::Dx,
                            at(&format!("{} dL/dx{k}", node.name)),
                            &got,
                            &head(&rf.grads[&node.inputs[k]], &got),
                            TOL_BACKWARD,
                        );
                    }
                }
                for p in &node.params {
                    let Some(gt) = p.grad else { continue };
                    let grad = rd(ex, gt)?;
                    report.close(
                        Kind::Grad,
                        at(&format!("{} grad", p.name)),
                        &grad,
                        &rf.grads[&p.value],
                        TOL_BACKWARD,
                    );
                    // The update from the backend's own weight, state and gradient.
                    let w0 = &before[&p.value];
                    let s0: Vec<Vec<f64>> = p.state.iter().map(|s| before[s].clone()).collect();
                    let (w1, s1) = reference_update(&g.optimizer, t, w0, &f64s(&grad), &s0);
                    let w = rd(ex, p.value)?;
                    let delta: Vec<f64> = w1.iter().zip(w0).map(|(a, b)| a - b).collect();
                    report.close_scaled(
                        Kind::Update,
                        at(&format!("{} update", p.name)),
                        &w,
                        &w1,
                        &delta,
                        TOL_UPDATE,
                        update_slack(&w1),
                    );
                    for (k, (&s, want)) in p.state.iter().zip(&s1).enumerate() {
                        let got = rd(ex, s)?;
                        report.close(
                            Kind::State,
                            at(&format!("{} optimizer state {k}", p.name)),
                            &got,
                            want,
                            TOL_STATE,
                        );
                    }
                }
                for &s in &node.stats {
                    let got = rd(ex, s)?;
                    // Frozen (evaluation-mode) BatchNorm leaves its statistics as they were.
                    let want = rf.stats.get(&s).unwrap_or(&before[&s]);
                    report.close(
                        Kind::Stats,
                        at(&format!(
                            "{} running statistics",
                            g.tensors[s as usize].name
                        )),
                        &got,
                        want,
                        TOL_STATS,
                    );
                }
            }
            // dL/d(prediction), the loss's own derivative.
            let dpred = rd(ex, g.d_pred)?;
            report.close(
                Kind::Dx,
                at("dL/d(prediction)"),
                &dpred,
                &head(&rf.grads[&g.pred()], &dpred),
                TOL_BACKWARD,
            );
        }
        // Evaluation: running statistics, no dropout, the loss only.
        // (At most one micro-batch: evaluation runs the first.)
        let b = Batch::new(g, mb, 99, case.x_scale);
        let state = read_state(ex, g)?;
        let rf = reference(g, &state, &b, false, 0, &HashMap::new());
        let ev = ex
            .evaluate(&b.x, b.target(g.loss))
            .map_err(|e| format!("evaluate: {e:?}"))?;
        report.close(
            Kind::Loss,
            "evaluation loss".into(),
            &[ev.loss],
            &[rf.loss],
            TOL_LOSS,
        );
        Ok(())
    });
    if let Err(e) = r {
        report.failures.push(e);
    }
    report
}

/// The wgpu harness, or why there is none (a missing adapter fails with `FRUGAL_REQUIRE_GPU=1`).
fn wgpu_harness() -> Result<Wgpu, String> {
    match GpuBackend::open() {
        Ok(b) => Ok(Wgpu { backend: Some(b) }),
        Err(e) => {
            let required = std::env::var("FRUGAL_REQUIRE_GPU").is_ok_and(|v| v == "1");
            assert!(!required, "FRUGAL_REQUIRE_GPU=1 but: {e}");
            Err(e.to_string())
        }
    }
}

/// The kind's worst relative error and its tolerance among `r`'s checks (by error/tolerance).
fn worst_of(r: &Report, kind: Kind) -> Option<&Check> {
    r.checks
        .iter()
        .filter(|c| c.kind == kind)
        .max_by(|a, b| (a.rel / a.tol).total_cmp(&(b.rel / b.tol)))
}

#[test]
fn every_op_conforms_to_the_f64_reference_on_every_backend() {
    let cases = cases();
    let pool = ThreadPool::new(3).expect("3 worker threads");
    let mut harnesses: Vec<Box<dyn Harness>> = vec![Box::new(Cpu), Box::new(CpuThreads(pool))];
    let mut skipped = None;
    match wgpu_harness() {
        Ok(w) => harnesses.push(Box::new(w)),
        Err(why) => skipped = Some(why),
    }
    // The table: per case and backend, each kind's worst relative error (‖got − ref‖/‖ref‖; updates
    // relative to the update's size), the kind's tolerance in the header.
    let mut out = String::from(
        "\nconformance: case × backend, worst relative error per kind against the f64 reference\n",
    );
    out += &format!("{:<42} {:<7}", "case", "backend");
    for k in Kind::ALL {
        out += &format!(" {:>9}", k.heading());
    }
    out += &format!(" {:>9}  result\n", "bit-exact");
    out += &format!("{:<42} {:<7}", "  (tolerance)", "");
    for tol in [
        TOL_FORWARD,
        TOL_LOSS,
        TOL_BACKWARD,
        TOL_BACKWARD,
        TOL_UPDATE,
        TOL_STATE,
        TOL_STATS,
    ] {
        out += &format!(" {tol:>9.0e}");
    }
    out += &format!(" {:>9}\n", "0 bits");
    let mut failed = Vec::new();
    let mut worst_overall: Option<(f64, String)> = None;
    for case in &cases {
        for h in harnesses.iter_mut() {
            let r = run_case(h.as_mut(), case);
            out += &format!("{:<42} {:<7}", case.name, h.name());
            for k in Kind::ALL {
                match worst_of(&r, k) {
                    Some(c) => out += &format!(" {:>9.2e}", c.rel),
                    None => out += &format!(" {:>9}", "-"),
                }
            }
            out += &format!(" {:>9}", r.exact);
            out += if r.passed() {
                "  passed\n"
            } else {
                "  FAILED\n"
            };
            if let Some(c) = r.worst() {
                let ratio = c.rel / c.tol;
                if worst_overall.as_ref().is_none_or(|w| ratio > w.0) {
                    worst_overall = Some((
                        ratio,
                        format!(
                            "{} on {}: {} ({:.2e} of {:.2e})",
                            case.name,
                            h.name(),
                            c.what,
                            c.rel,
                            c.tol
                        ),
                    ));
                }
            }
            for c in r.checks.iter().filter(|c| !c.passed) {
                failed.push(format!(
                    "{} on {}: {}: error {:.3e} > tolerance {:.3e}",
                    case.name,
                    h.name(),
                    c.what,
                    c.rel,
                    c.tol
                ));
            }
            for f in &r.failures {
                failed.push(format!("{} on {}: {f}", case.name, h.name()));
            }
        }
        if skipped.is_some() {
            out += &format!("{:<42} {:<7}  skipped\n", case.name, "wgpu");
        }
    }
    if let Some((ratio, what)) = worst_overall {
        out += &format!(
            "conformance: closest to its tolerance ({:.0}%): {what}\n",
            ratio * 100.0
        );
    }
    if let Some(why) = &skipped {
        out += &format!("conformance: wgpu skipped: {why}\n");
    }
    // Straight to stderr, past the harness's capture: the table shows in every `cargo test` run.
    let _ = std::io::stderr().write_all(out.as_bytes());
    assert!(
        failed.is_empty(),
        "conformance failures:\n{}",
        failed.join("\n")
    );
}
