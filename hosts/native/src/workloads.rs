//! The benchmark workloads of `../shared/reference/pytorch-harness` (NNTrainer's component workloads plus
//! LeNet-5, an MLP and a small CNN on 28×28), built as `ModelSpec`s with exactly the harness's shapes.
use frugal_core::model::{Dims, LayerKind, LayerSpec, LossKind, ModelSpec, OptimizerSpec, Src};

/// One benchmark row.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Harness id (`linear`, `conv2d`, …).
    pub id: &'static str,
    /// Title as in the reference tables.
    pub title: &'static str,
    /// The model.
    pub spec: ModelSpec,
    /// Batch sizes the reference measured.
    pub batches: &'static [usize],
}

struct B {
    layers: Vec<LayerSpec>,
}

impl B {
    fn new() -> Self {
        Self { layers: Vec::new() }
    }
    fn add(mut self, name: &str, kind: LayerKind) -> Self {
        let src = if self.layers.is_empty() {
            Src::Input
        } else {
            Src::Layer(self.layers.len() as u32 - 1)
        };
        self.layers.push(LayerSpec {
            name: name.into(),
            kind,
            inputs: vec![src],
            trainable: true,
            update: frugal_core::model::Update::All,
        });
        self
    }
    fn frozen(mut self, name: &str) -> Self {
        if let Some(l) = self.layers.iter_mut().find(|l| l.name == name) {
            l.trainable = false;
        }
        self
    }
    fn spec(self, input: Dims, loss: LossKind) -> ModelSpec {
        ModelSpec {
            input,
            layers: self.layers,
            loss,
            optimizer: OptimizerSpec::Sgd {
                lr: 0.01,
                momentum: 0.0,
                weight_decay: 0.0,
            },
            seed: 0,
        }
    }
}

fn linear(out: u32) -> LayerKind {
    LayerKind::Linear { out, bias: true }
}

fn conv(out: u32, k: u32, s: u32, p: u32) -> LayerKind {
    LayerKind::Conv2d {
        out,
        kernel: [k, k],
        stride: [s, s],
        padding: [p, p],
        groups: 1,
        bias: true,
    }
}

fn pool2() -> LayerKind {
    LayerKind::MaxPool2d {
        kernel: [2, 2],
        stride: [2, 2],
    }
}

/// All workloads in the reference's order.
pub fn all() -> Vec<Workload> {
    use LossKind::{Mse, SoftmaxCrossEntropy as Ce};
    let fc3 = || {
        B::new()
            .add("fc1", linear(1024))
            .add("fc2", linear(1024))
            .add("fc3", linear(100))
    };
    vec![
        Workload {
            id: "linear",
            title: "Linear 150528->300 (MSE)",
            spec: B::new()
                .add("fc", linear(300))
                .spec(Dims::flat(150528), Mse),
            batches: &[64],
        },
        Workload {
            id: "conv2d",
            title: "Conv2D 3->3 k3 s2 p1 (MSE)",
            spec: B::new()
                .add("conv", conv(3, 3, 2, 1))
                .spec(Dims::new(3, 224, 224), Mse),
            batches: &[64],
        },
        Workload {
            id: "fc3",
            title: "FC-FC-FC 784-1024-1024-100 (MSE)",
            spec: fc3().spec(Dims::flat(784), Mse),
            batches: &[2048],
        },
        Workload {
            id: "fc3_frozen_mid",
            title: "FC-FC-FC, middle frozen (MSE)",
            spec: fc3().frozen("fc2").spec(Dims::flat(784), Mse),
            batches: &[2048],
        },
        Workload {
            id: "conv_ac_fl",
            title: "Conv-Sigmoid-Flatten (MSE)",
            spec: B::new()
                .add("conv", conv(3, 3, 2, 1))
                .add("sigmoid", LayerKind::Sigmoid)
                .add("flat", LayerKind::Flatten)
                .spec(Dims::new(3, 224, 224), Mse),
            batches: &[64],
        },
        Workload {
            id: "lenet5",
            title: "LeNet-5 28x28 (CE)",
            spec: B::new()
                .add("conv1", conv(6, 5, 1, 2))
                .add("relu1", LayerKind::Relu)
                .add("pool1", pool2())
                .add("conv2", conv(16, 5, 1, 0))
                .add("relu2", LayerKind::Relu)
                .add("pool2", pool2())
                .add("flat", LayerKind::Flatten)
                .add("fc1", linear(120))
                .add("relu3", LayerKind::Relu)
                .add("fc2", linear(84))
                .add("relu4", LayerKind::Relu)
                .add("fc3", linear(10))
                .spec(Dims::new(1, 28, 28), Ce),
            batches: &[32, 64, 128],
        },
        Workload {
            id: "mlp",
            title: "MLP 784-256-128-10 (CE)",
            spec: B::new()
                .add("fc1", linear(256))
                .add("relu1", LayerKind::Relu)
                .add("fc2", linear(128))
                .add("relu2", LayerKind::Relu)
                .add("fc3", linear(10))
                .spec(Dims::flat(784), Ce),
            batches: &[32, 128, 512],
        },
        Workload {
            id: "small_cnn",
            title: "SmallCNN c8-c16-fc10 (CE)",
            spec: B::new()
                .add("conv1", conv(8, 3, 1, 1))
                .add("relu1", LayerKind::Relu)
                .add("pool1", pool2())
                .add("conv2", conv(16, 3, 1, 1))
                .add("relu2", LayerKind::Relu)
                .add("pool2", pool2())
                .add("flat", LayerKind::Flatten)
                .add("fc", linear(10))
                .spec(Dims::new(1, 28, 28), Ce),
            batches: &[32, 128],
        },
    ]
}
