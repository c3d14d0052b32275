//! The models and data the GPU suites train (natively and in the browser), every layer kind the GPU
//! step runs among them.
#![allow(dead_code)] // each suite uses a part

use frugal_core::backend::Backend;
use frugal_core::exec::{Executor, Target};
use frugal_core::graph::Graph;
use frugal_core::model::{Dims, LayerKind, LayerSpec, LossKind, ModelSpec, OptimizerSpec, Src};
use frugal_core::plan::{Plan, PlanShape};

/// `len` values in [-scale, scale) from `seed` (xorshift).
pub fn data(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

pub fn layer(name: &str, kind: LayerKind, inputs: &[Src]) -> LayerSpec {
    LayerSpec {
        name: name.into(),
        kind,
        inputs: inputs.to_vec(),
        trainable: true,
        update: frugal_core::model::Update::All,
    }
}

/// Flatten of the input (a view of the host's batch), linear + ReLU, a residual block (linear, Add),
/// sigmoid, linear to `outs`: every layer kind the GPU step runs.
pub fn mlp(loss: LossKind, optimizer: OptimizerSpec, outs: u32) -> ModelSpec {
    use LayerKind as K;
    use Src::{Input, Layer};
    ModelSpec {
        input: Dims { c: 1, h: 4, w: 5 },
        layers: vec![
            layer("flat", K::Flatten, &[Input]),
            layer(
                "fc1",
                K::Linear {
                    out: 24,
                    bias: true,
                },
                &[Layer(0)],
            ),
            layer("relu1", K::Relu, &[Layer(1)]),
            layer(
                "fc2",
                K::Linear {
                    out: 24,
                    bias: false,
                },
                &[Layer(2)],
            ),
            layer("res", K::Add, &[Layer(3), Layer(2)]),
            layer("sig", K::Sigmoid, &[Layer(4)]),
            layer(
                "fc3",
                K::Linear {
                    out: outs,
                    bias: true,
                },
                &[Layer(5)],
            ),
            layer("tanh", K::Tanh, &[Layer(6)]),
            layer(
                "out",
                K::Linear {
                    out: outs,
                    bias: true,
                },
                &[Layer(7)],
            ),
        ],
        loss,
        optimizer,
        seed: 7,
    }
}

/// Convolutions (padding, stride, depthwise and grouped, with and without bias), max, average and global
/// average pooling, ReLU6 and tanh, then a linear head: every CNN layer kind the GPU step runs but
/// BatchNorm.
pub fn cnn(optimizer: OptimizerSpec) -> ModelSpec {
    use LayerKind as K;
    use Src::{Input, Layer};
    let conv = |out, k: u32, s: u32, pad: u32, groups, bias| K::Conv2d {
        out,
        kernel: [k, k],
        stride: [s, s],
        padding: [pad, pad],
        groups,
        bias,
    };
    ModelSpec {
        input: Dims { c: 3, h: 12, w: 12 },
        layers: vec![
            layer("c1", conv(8, 3, 1, 1, 1, true), &[Input]),
            layer("r1", K::Relu, &[Layer(0)]),
            layer(
                "mp",
                K::MaxPool2d {
                    kernel: [2, 2],
                    stride: [2, 2],
                },
                &[Layer(1)],
            ),
            layer("dw", conv(8, 3, 2, 1, 8, false), &[Layer(2)]),
            layer("r2", K::Relu6, &[Layer(3)]),
            layer(
                "ap",
                K::AvgPool2d {
                    kernel: [1, 2],
                    stride: [1, 1],
                },
                &[Layer(4)],
            ),
            layer("pw", conv(16, 1, 1, 0, 2, true), &[Layer(5)]),
            layer("t", K::Tanh, &[Layer(6)]),
            layer("gap", K::GlobalAvgPool, &[Layer(7)]),
            layer("flat", K::Flatten, &[Layer(8)]),
            layer("fc", K::Linear { out: 5, bias: true }, &[Layer(9)]),
        ],
        loss: LossKind::SoftmaxCrossEntropy,
        optimizer,
        seed: 5,
    }
}

pub const SGD: OptimizerSpec = OptimizerSpec::Sgd {
    lr: 0.1,
    momentum: 0.9,
    weight_decay: 1e-3,
};
pub const ADAM: OptimizerSpec = OptimizerSpec::Adam {
    lr: 0.01,
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-8,
    weight_decay: 0.0,
};

pub fn plan(spec: &ModelSpec, mb: usize, micro_batches: u16) -> Plan {
    let g = Graph::new(spec, mb).unwrap();
    Plan::shaped(
        g,
        PlanShape {
            micro_batches,
            ..Default::default()
        },
    )
}

/// Inputs, class labels and regression targets for `n` samples.
pub fn batch(spec: &ModelSpec, n: usize, seed: u64, outs: usize) -> (Vec<f32>, Vec<u32>, Vec<f32>) {
    let per = spec.input.c as usize * spec.input.h as usize * spec.input.w as usize;
    let x = data(n * per, seed, 1.0);
    let y = (0..n)
        .map(|i| ((i * 7 + seed as usize) % outs) as u32)
        .collect();
    let t = data(n * outs, seed + 1, 0.5);
    (x, y, t)
}

pub fn target<'a>(loss: LossKind, y: &'a [u32], t: &'a [f32]) -> Target<'a> {
    match loss {
        LossKind::SoftmaxCrossEntropy => Target::Classes(y),
        LossKind::Mse => Target::Values(t),
    }
}

/// A residual block with BatchNorm in training mode (batch statistics, running statistics, the
/// parameters' and the input's gradients), and a frozen BatchNorm in evaluation mode.
pub fn bn_cnn() -> ModelSpec {
    use LayerKind as K;
    use Src::{Input, Layer};
    let conv = |out, groups, bias| K::Conv2d {
        out,
        kernel: [3, 3],
        stride: [1, 1],
        padding: [1, 1],
        groups,
        bias,
    };
    let bn = K::BatchNorm2d {
        eps: 1e-5,
        momentum: 0.1,
    };
    let mut frozen = layer("bn3", bn.clone(), &[Layer(7)]);
    frozen.trainable = false;
    ModelSpec {
        input: Dims { c: 2, h: 6, w: 6 },
        layers: vec![
            layer("c1", conv(6, 1, false), &[Input]),
            layer("bn1", bn.clone(), &[Layer(0)]),
            layer("r1", K::Relu, &[Layer(1)]),
            layer("c2", conv(6, 3, false), &[Layer(2)]),
            layer("bn2", bn.clone(), &[Layer(3)]),
            layer("res", K::Add, &[Layer(4), Layer(2)]),
            layer("r2", K::Relu, &[Layer(5)]),
            layer("c3", conv(4, 2, true), &[Layer(6)]),
            frozen,
            layer("gap", K::GlobalAvgPool, &[Layer(8)]),
            layer("flat", K::Flatten, &[Layer(9)]),
            layer("fc", K::Linear { out: 3, bias: true }, &[Layer(10)]),
        ],
        loss: LossKind::SoftmaxCrossEntropy,
        optimizer: ADAM,
        seed: 9,
    }
}

/// What training measured: the loss of every step and every persistent tensor at the end.
pub struct Trained {
    pub losses: Vec<f32>,
    pub correct: Vec<usize>,
    pub state: Vec<Vec<f32>>,
    pub eval: (f32, usize),
}

/// `steps` steps of `p` on `backend` (a GPU backend gets the plan moved to the GPU); batch sizes from
/// `sizes` in turn (a partial batch among them); then an evaluation and every persistent tensor, read
/// through the executor from wherever it lives.
pub fn train<B: Backend>(
    p: &Plan,
    backend: B,
    spec: &ModelSpec,
    sizes: &[usize],
    steps: usize,
    outs: usize,
) -> Trained {
    let mut arena = vec![0u8; p.needed_bytes()];
    let mut ex = Executor::with_backend(p, &arena, backend).unwrap();
    ex.init_params(&mut arena, 3).unwrap();
    let (mut losses, mut correct) = (Vec::new(), Vec::new());
    for s in 0..steps {
        let n = sizes[s % sizes.len()];
        let (x, y, t) = batch(spec, n, s as u64, outs);
        let st = ex
            .train_step(&mut arena, &x, target(spec.loss, &y, &t))
            .unwrap();
        losses.push(st.loss);
        correct.push(st.correct);
    }
    let (x, y, t) = batch(spec, p.graph.batch, 99, outs);
    let ev = ex
        .evaluate(&mut arena, &x, target(spec.loss, &y, &t))
        .unwrap();
    let state = ex
        .state_tensors()
        .collect::<Vec<_>>()
        .into_iter()
        .map(|(_, _, t)| ex.read_vec(&mut arena, t).unwrap())
        .collect();
    Trained {
        losses,
        correct,
        state,
        eval: (ev.loss, ev.correct),
    }
}
