//! `ModelSpec`: what a model is — input shape, layers (a DAG), which layers train, loss and optimizer.
//! Hosts build it from TOML; `no_std` targets decode it from the binary format in [`crate::format`].
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

/// Per-sample shape `C×H×W` (a vector of `F` features is `F×1×1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dims {
    /// Channels (or features).
    pub c: u32,
    /// Height.
    pub h: u32,
    /// Width.
    pub w: u32,
}

impl Dims {
    /// `c×h×w`.
    pub const fn new(c: u32, h: u32, w: u32) -> Self {
        Self { c, h, w }
    }
    /// A flat vector of `f` features.
    pub const fn flat(f: u32) -> Self {
        Self { c: f, h: 1, w: 1 }
    }
    /// Elements per sample, saturating at `usize::MAX` (three `u32`s can overflow even a 64-bit
    /// product; shapes are checked to fit where tensors are sized, [`crate::graph::Graph::new`]).
    pub fn numel(&self) -> usize {
        (self.c as usize)
            .saturating_mul(self.h as usize)
            .saturating_mul(self.w as usize)
    }
}

impl fmt::Display for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}×{}×{}", self.c, self.h, self.w)
    }
}

/// Where a layer reads an input from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Src {
    /// The model input batch.
    Input,
    /// The output of layer `i` (which must come earlier in the list).
    Layer(u32),
}

/// A 2-D window parameter (height, width).
pub type Pair = [u32; 2];

/// The kind of a layer with its hyper-parameters. Weight layouts follow PyTorch: Linear `[out, in]`,
/// Conv2d `[out, in/groups, kh, kw]`.
#[derive(Clone, Debug, PartialEq)]
pub enum LayerKind {
    /// Fully connected over the flattened per-sample features.
    Linear {
        /// Output features.
        out: u32,
        /// Has a bias.
        bias: bool,
    },
    /// 2-D convolution (dilation 1). `groups == in_channels == out` is depthwise.
    Conv2d {
        /// Output channels.
        out: u32,
        /// Kernel (h, w).
        kernel: Pair,
        /// Stride (h, w).
        stride: Pair,
        /// Zero padding (h, w).
        padding: Pair,
        /// Channel groups.
        groups: u32,
        /// Has a bias.
        bias: bool,
    },
    /// Max pooling (no padding).
    MaxPool2d {
        /// Window.
        kernel: Pair,
        /// Stride.
        stride: Pair,
    },
    /// Average pooling (no padding).
    AvgPool2d {
        /// Window.
        kernel: Pair,
        /// Stride.
        stride: Pair,
    },
    /// Mean over H×W per channel → `C×1×1`.
    GlobalAvgPool,
    /// max(0, x).
    Relu,
    /// min(max(0, x), 6).
    Relu6,
    /// 1 / (1 + e^-x).
    Sigmoid,
    /// tanh(x).
    Tanh,
    /// `C×H×W` → `(CHW)×1×1`; a view, zero bytes.
    Flatten,
    /// Any shape with the same element count; a view, zero bytes.
    Reshape {
        /// New per-sample shape.
        to: Dims,
    },
    /// Element-wise sum of two inputs of equal shape (residual connections).
    Add,
    /// Batch normalisation over (N, H, W) per channel; running statistics updated in training mode.
    /// A frozen BatchNorm runs in eval mode (running statistics, no update).
    BatchNorm2d {
        /// Added to the variance.
        eps: f32,
        /// Running-statistics momentum (PyTorch convention: new = (1-m)·old + m·batch).
        momentum: f32,
    },
    /// Inverted dropout with probability `p`; masks are regenerated from a seed, never stored.
    Dropout {
        /// Drop probability in [0, 1).
        p: f32,
    },
    /// Token embedding: the model input is `seq` token ids (`[seq]`, f32 values holding integers below
    /// `vocab`); the output is the sequence `[seq, dim]` (per-sample `Dims { c: seq, h: 1, w: dim }`).
    /// Layers after it work on sequences: Linear acts on the last axis of each token. Weight
    /// `[vocab, dim]`.
    Embedding {
        /// Vocabulary size.
        vocab: u32,
        /// Embedding width.
        dim: u32,
    },
    /// Learned positional embedding added to a sequence: weight `[seq, dim]`.
    PosEmbedding,
    /// LayerNorm over the last axis (weight γ, bias β).
    LayerNorm {
        /// Added to the variance.
        eps: f32,
    },
    /// RMSNorm over the last axis (weight γ).
    RmsNorm {
        /// Added to the mean square.
        eps: f32,
    },
    /// GELU, exact (erf) form: `x·Φ(x)`.
    Gelu,
    /// SiLU: `x·σ(x)`.
    Silu,
    /// Causal multi-head self-attention on a `[seq, 3·dim]` input (queries, keys and values side by
    /// side, as a Linear to `3·dim` gives them), output `[seq, dim]`; no parameters.
    Attention {
        /// Heads (dividing `dim`).
        heads: u32,
    },
    /// Linear with frozen base weights and trainable LoRA adapters:
    /// `y = x·Wᵀ + b + (alpha/rank)·x·Aᵀ·Bᵀ`, `A [rank, in]`, `B [out, rank]` (B starts at zero).
    LoraLinear {
        /// Output features.
        out: u32,
        /// Has a (frozen) bias.
        bias: bool,
        /// Adapter rank.
        rank: u32,
        /// Scale numerator (`alpha / rank` multiplies the adapter's output).
        alpha: f32,
    },
    /// The recurrent part of a one-layer LSTM (PyTorch's `nn.LSTM`, `batch_first`, zero initial
    /// state): the input is the gate pre-activations `[seq, 4·hidden]` of every time step in the gate
    /// order i, f, g, o (`x·W_ihᵀ + b_ih`, a Linear before it: the TOML's `lstm` entry writes both);
    /// the output is every hidden state `[seq, hidden]`. Weight `weight_hh [4·hidden, hidden]`, bias
    /// `bias_hh [4·hidden]`.
    Lstm {
        /// Hidden width.
        hidden: u32,
    },
    /// The recurrent part of a one-layer GRU (`nn.GRU`), as [`LayerKind::Lstm`] with gates r, z, n
    /// (`[seq, 3·hidden]` in; `b_hn` inside the reset product). Weight `weight_hh [3·hidden, hidden]`,
    /// bias `bias_hh [3·hidden]`.
    Gru {
        /// Hidden width.
        hidden: u32,
    },
}

impl LayerKind {
    /// Name used in the text format and in messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            LayerKind::Linear { .. } => "linear",
            LayerKind::Conv2d { .. } => "conv2d",
            LayerKind::MaxPool2d { .. } => "maxpool2d",
            LayerKind::AvgPool2d { .. } => "avgpool2d",
            LayerKind::GlobalAvgPool => "global_avgpool",
            LayerKind::Relu => "relu",
            LayerKind::Relu6 => "relu6",
            LayerKind::Sigmoid => "sigmoid",
            LayerKind::Tanh => "tanh",
            LayerKind::Flatten => "flatten",
            LayerKind::Reshape { .. } => "reshape",
            LayerKind::Add => "add",
            LayerKind::BatchNorm2d { .. } => "batchnorm2d",
            LayerKind::Dropout { .. } => "dropout",
            LayerKind::Embedding { .. } => "embedding",
            LayerKind::PosEmbedding => "pos_embedding",
            LayerKind::LayerNorm { .. } => "layernorm",
            LayerKind::RmsNorm { .. } => "rmsnorm",
            LayerKind::Gelu => "gelu",
            LayerKind::Silu => "silu",
            LayerKind::Attention { .. } => "attention",
            LayerKind::LoraLinear { .. } => "lora_linear",
            LayerKind::Lstm { .. } => "lstm",
            LayerKind::Gru { .. } => "gru",
        }
    }

    /// Whether it is one of the sequence layers, whose kernels the core's `seq` feature builds.
    pub fn is_sequence_layer(&self) -> bool {
        matches!(
            self,
            LayerKind::Embedding { .. }
                | LayerKind::PosEmbedding
                | LayerKind::LayerNorm { .. }
                | LayerKind::RmsNorm { .. }
                | LayerKind::Gelu
                | LayerKind::Silu
                | LayerKind::Attention { .. }
                | LayerKind::LoraLinear { .. }
                | LayerKind::Lstm { .. }
                | LayerKind::Gru { .. }
        )
    }
}

/// One layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerSpec {
    /// Unique name; parameters are called `{name}.weight`, `{name}.bias`, and for BatchNorm also
    /// `{name}.running_mean`, `{name}.running_var` (PyTorch `state_dict` names).
    pub name: String,
    /// Kind and hyper-parameters.
    pub kind: LayerKind,
    /// Inputs (one, or two for `Add`).
    pub inputs: Vec<Src>,
    /// Whether its parameters train. A frozen layer computes no weight gradient and saves no input for one.
    pub trainable: bool,
    /// Which part of a trainable layer's parameters a step updates (sparse update); ignored when the
    /// layer is frozen.
    pub update: Update,
}

/// Which part of a trainable layer's parameters a step updates — the sparse updates of tiny-training
/// (Lin et al., NeurIPS'22) and TinyTrain (Kwon et al., ICML'24). The graph gives a part that is not
/// updated no gradient and no optimizer state; its values stay bit-identical through training.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum Update {
    /// Every parameter (the default).
    #[default]
    All,
    /// Only the bias (Linear/Conv2d `bias`, BatchNorm `bias` = β): the weight stays frozen, so the
    /// weight-gradient phase reads no saved input (Linear/Conv2d) — tiny-training's bias-only update.
    Bias,
    /// The leading `⌈fraction × C⌉` output channels (rows of dimension 0 of every parameter: a prefix
    /// of each tensor in PyTorch's layout), `fraction` in (0, 1] — tiny-training's channel subset.
    Channels(f32),
}

impl Update {
    /// Rows (leading output channels) of a parameter with `c` rows that a step updates; `is_bias` says
    /// whether the parameter is the layer's bias (β for BatchNorm). `None`: the parameter is frozen.
    pub fn rows(self, c: usize, is_bias: bool) -> Option<usize> {
        match self {
            Update::All => Some(c),
            Update::Bias => is_bias.then_some(c),
            Update::Channels(f) => {
                // f in (0, 1] (checked where the graph is built): 1 ≤ ⌈f·c⌉ ≤ c.
                let r = libm::ceilf(f * c as f32) as usize;
                Some(r.clamp(1, c.max(1)))
            }
        }
    }
    /// A valid setting: a channel fraction in (0, 1].
    pub fn valid(self) -> bool {
        match self {
            Update::Channels(f) => f.is_finite() && f > 0.0 && f <= 1.0,
            _ => true,
        }
    }
}

impl fmt::Display for Update {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Update::All => write!(f, "all"),
            Update::Bias => write!(f, "bias"),
            Update::Channels(x) => write!(f, "{{channels = {x}}}"),
        }
    }
}

/// The training loss, fused with the last layer's derivative.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossKind {
    /// Mean squared error over all output elements (targets are f32 of the output shape).
    Mse,
    /// Softmax + cross-entropy, mean over the batch (targets are class indices).
    SoftmaxCrossEntropy,
}

/// The optimizer and its hyper-parameters (PyTorch semantics).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptimizerSpec {
    /// SGD with optional momentum (dampening 0, not Nesterov) and L2 weight decay.
    Sgd {
        /// Learning rate.
        lr: f32,
        /// Momentum (0 = none, no state).
        momentum: f32,
        /// L2 weight decay added to the gradient.
        weight_decay: f32,
    },
    /// Adam (not AdamW): L2 weight decay added to the gradient; eps added after bias correction.
    Adam {
        /// Learning rate.
        lr: f32,
        /// β₁.
        beta1: f32,
        /// β₂.
        beta2: f32,
        /// ε.
        eps: f32,
        /// L2 weight decay.
        weight_decay: f32,
    },
    /// AdamW (`torch.optim.AdamW`): decoupled weight decay `p ← p·(1 − lr·wd)` before the Adam step.
    AdamW {
        /// Learning rate.
        lr: f32,
        /// β₁.
        beta1: f32,
        /// β₂.
        beta2: f32,
        /// ε.
        eps: f32,
        /// Decoupled weight decay.
        weight_decay: f32,
    },
}

impl OptimizerSpec {
    /// How many f32 state tensors of a parameter's size the optimizer keeps.
    pub fn state_slots(&self) -> usize {
        match self {
            OptimizerSpec::Sgd { momentum, .. } if *momentum != 0.0 => 1,
            OptimizerSpec::Sgd { .. } => 0,
            OptimizerSpec::Adam { .. } | OptimizerSpec::AdamW { .. } => 2,
        }
    }
    /// Learning rate.
    pub fn lr(&self) -> f32 {
        match self {
            OptimizerSpec::Sgd { lr, .. }
            | OptimizerSpec::Adam { lr, .. }
            | OptimizerSpec::AdamW { lr, .. } => *lr,
        }
    }
}

/// A whole model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    /// Per-sample input shape.
    pub input: Dims,
    /// Layers in a topological order; the last one's output is the prediction.
    pub layers: Vec<LayerSpec>,
    /// Loss.
    pub loss: LossKind,
    /// Optimizer.
    pub optimizer: OptimizerSpec,
    /// Seed for weight initialisation and dropout.
    pub seed: u64,
}

/// How the weights of an int8 run are updated (see [`crate::quant`] for the memory of each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Int8Update {
    /// NITI: int8 weights only, no float copy. The int8 weight gradient is shifted down to
    /// `update_bits` bits with stochastic rounding and subtracted with saturation; `update_bits` plays
    /// the learning rate's role (the optimizer's `lr` is not used).
    Integer {
        /// Bit width of the largest update step (1..=7).
        update_bits: u8,
    },
    /// f32 master weights updated by the model's optimizer from the dequantised int8 gradient, re-quantised
    /// to int8 (power-of-two scale) for compute.
    FloatMaster,
}

/// Numeric precision of a training run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Precision {
    /// f32 everywhere (the default).
    #[default]
    F32,
    /// int8 weights, activations and errors with int32 accumulation and power-of-two scales.
    Int8(Int8Update),
}
