//! Graph: a [`ModelSpec`] realised for one batch size — ops with resolved geometry, every tensor a
//! training step touches (weights, gradients, activations, derivatives, scratch, optimizer state), and
//! which tensors may share storage (modify-view for in-place ops, read-only view for reshapes).
use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

use crate::kernels::int8::KernelFamily;
use crate::model::{Dims, LayerKind, LossKind, ModelSpec, OptimizerSpec, Precision, Src, Update};
use crate::ops::rnn::{Cell, RnnGeom};
use crate::ops::seq::{AttnGeom, LoraGeom, Smooth};
use crate::ops::{self, Act, ConvGeom, PoolGeom};

/// Index of a tensor in [`Graph::tensors`].
pub type TensorId = u32;

/// What a tensor holds; decides its lifetime class and its colour in pictures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorKind {
    /// Trainable or frozen parameter (lives across steps).
    Weight,
    /// Parameter gradient (compute-gradient → apply).
    Gradient,
    /// Forward output, or something saved from forward for backward.
    Activation,
    /// dL/d(activation) during backward.
    Derivative,
    /// Per-instruction workspace (im2col columns, GEMM packing).
    Scratch,
    /// Optimizer state (momentum, Adam moments; lives across steps).
    OptState,
    /// Non-trained persistent statistics (BatchNorm running mean/var).
    Stat,
    /// The input batch or the targets: held by the host, outside the arena.
    External,
}

impl TensorKind {
    /// Lower-case name for tables and pictures.
    pub fn name(self) -> &'static str {
        match self {
            TensorKind::Weight => "weight",
            TensorKind::Gradient => "gradient",
            TensorKind::Activation => "activation",
            TensorKind::Derivative => "derivative",
            TensorKind::Scratch => "scratch",
            TensorKind::OptState => "opt_state",
            TensorKind::Stat => "stat",
            TensorKind::External => "external",
        }
    }
    /// Lives across training steps (valid at every execution order).
    pub fn persistent(self) -> bool {
        matches!(
            self,
            TensorKind::Weight | TensorKind::OptState | TensorKind::Stat
        )
    }
}

/// How a tensor may share storage with another (NNTrainer's tensor create modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Share {
    /// Its own storage.
    Own,
    /// Modify view of the target: an in-place op writes it over the target, allowed only if the target is
    /// no longer read afterwards (NNTrainer Algorithm 1, line 17).
    ModifyView(TensorId),
    /// Read-only view of the target (same bytes, other shape): always merged.
    ReadView(TensorId),
    /// Held by the host, not in the arena (place-holder).
    External,
}

/// Element type of a tensor in the arena; its size decides the tensor's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 8-bit signed integer with a power-of-two scale (int8 training).
    I8,
    /// 32-bit signed integer (accumulators).
    I32,
    /// IEEE half (fp16 storage).
    F16,
    /// 32-bit unsigned integer (f32 max-pool arg-max indices).
    U32,
    /// Bytes (int8 max-pool window indices; int8 scratch carved by the op itself).
    U8,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 => 2,
            DType::I8 | DType::U8 => 1,
        }
    }
}

/// One tensor.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// Human-readable name, e.g. `conv1.weight`, `relu1.out`, `d(relu1.out)`.
    pub name: String,
    /// Role.
    pub kind: TensorKind,
    /// Size in bytes at the planned batch.
    pub bytes: usize,
    /// Element type (bytes = elements × its size).
    pub dtype: DType,
    /// Sharing request.
    pub share: Share,
}

/// A layer's computation with every shape resolved.
#[derive(Clone, Debug)]
pub enum NodeOp {
    /// Fully connected.
    Linear {
        /// Input features.
        fin: usize,
        /// Output features.
        fout: usize,
    },
    /// Convolution.
    Conv(ConvGeom),
    /// Max pooling.
    MaxPool(PoolGeom),
    /// Average pooling.
    AvgPool(PoolGeom),
    /// Global average pooling.
    GlobalAvgPool {
        /// Channels.
        c: usize,
        /// Pixels per channel.
        hw: usize,
    },
    /// Element-wise activation.
    Act(Act),
    /// Flatten/Reshape: no computation.
    View,
    /// Residual sum.
    Add,
    /// BatchNorm2d; `train` false means eval mode (frozen layer).
    BatchNorm {
        /// Channels.
        c: usize,
        /// Pixels per channel.
        hw: usize,
        /// Variance epsilon.
        eps: f32,
        /// Running-statistics momentum.
        momentum: f32,
        /// Training-mode statistics.
        train: bool,
    },
    /// Inverted dropout.
    Dropout {
        /// Drop probability.
        p: f32,
    },
    /// Token embedding (reads the model input's token ids).
    Embedding {
        /// Vocabulary size.
        vocab: usize,
        /// Width.
        dim: usize,
    },
    /// Learned positional embedding added to each sequence (`per = seq·dim` elements).
    PosEmbedding {
        /// Elements per sample.
        per: usize,
    },
    /// LayerNorm (`rms` false) or RMSNorm over the last axis of `dim`.
    Norm {
        /// Normalised width.
        dim: usize,
        /// Epsilon.
        eps: f32,
        /// RMSNorm (no mean, no bias).
        rms: bool,
    },
    /// GELU or SiLU (backward from the input).
    Smooth(Smooth),
    /// Causal multi-head self-attention.
    Attention(AttnGeom),
    /// Linear with frozen base weights and LoRA adapters.
    Lora(LoraGeom),
    /// The recurrent part of an LSTM or GRU (input: the gate pre-activations of every step). Its
    /// derivative phase runs first (back-propagation through time into the input derivative), its
    /// gradient phase after, reading that derivative ([`crate::plan::step_program`]).
    Rnn(RnnGeom),
}

impl NodeOp {
    /// Whether a forward (or recompute) rewrites the node's saved tensors from its inputs alone, so a
    /// recomputation regenerates them (all but BatchNorm, whose saved statistics are the batch's).
    pub fn saved_recomputable(&self) -> bool {
        !matches!(self, NodeOp::BatchNorm { .. })
    }
    /// Token rows per sample of a Linear, LoRA Linear or norm (1 unless applied to each token of a
    /// sequence) from its per-sample input size.
    pub fn rows_per_sample(&self, in_numel: usize) -> usize {
        let width = match self {
            NodeOp::Linear { fin, .. } => *fin,
            NodeOp::Lora(g) => g.fin,
            NodeOp::Norm { dim, .. } => *dim,
            _ => return 1,
        };
        in_numel / width.max(1)
    }
}

/// A trainable or frozen parameter of a node.
#[derive(Clone, Debug)]
pub struct Param {
    /// `state_dict` name, e.g. `conv1.weight`.
    pub name: String,
    /// PyTorch shape.
    pub shape: Vec<usize>,
    /// The values.
    pub value: TensorId,
    /// Its gradient (trainable only). Under a channel update ([`crate::model::Update::Channels`]) it
    /// holds only the updated rows: the first [`Param::updated`] elements of the value.
    pub grad: Option<TensorId>,
    /// Elements updated: a prefix of the value (its leading output channels in PyTorch's layout), the
    /// length of the gradient and of each optimizer state; 0 when the parameter is frozen.
    pub updated: usize,
    /// Optimizer state slots (trainable only).
    pub state: Vec<TensorId>,
}

pub mod precision;

/// Indices of the optional per-phase scratch tensors in [`Node::scratch`].
pub mod scratch_slot {
    /// Forward.
    pub const FWD: usize = 0;
    /// Compute gradient.
    pub const GRAD_W: usize = 1;
    /// Compute derivative.
    pub const GRAD_X: usize = 2;
}

/// A recurrent layer unrolled over time ([`NodeOp::Rnn`]): its forward and its backward through time
/// are one instruction per step ([`crate::plan::Phase::StepFwd`], [`crate::plan::Phase::StepBwd`]),
/// and each step saves tensors of its own, alive from its forward step to its backward step, so the
/// planner sees (and reuses) every step's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bptt {
    /// Time steps.
    pub steps: u16,
    /// Step `t`'s gates (`{name}.t{t}.gates`, `[n, G·hidden]`) are tensor `first + 2t`, its state
    /// (`{name}.t{t}.state`, `[n, hidden]`) tensor `first + 2t + 1`; all in [`Node::saved`].
    pub first: TensorId,
    /// The GRU's reset gates of every step (`{name}.rgate`, `[n, seq, hidden]`), which its weight
    /// gradient reads after the backward steps; also in [`Node::saved`].
    pub r: Option<TensorId>,
    /// The derivatives carried from each backward step to the one before it (`{name}.dcarry`: `dh`,
    /// and the LSTM's `dc`); None when the layer has no backward.
    pub carry: Option<TensorId>,
}

impl Bptt {
    /// Step `t`'s saved gates.
    pub fn gates(&self, t: u16) -> TensorId {
        self.first + 2 * TensorId::from(t)
    }
    /// Step `t`'s saved state.
    pub fn state(&self, t: u16) -> TensorId {
        self.first + 2 * TensorId::from(t) + 1
    }
}

/// One layer, realised.
#[derive(Clone, Debug)]
pub struct Node {
    /// Layer index in the spec.
    pub layer: u32,
    /// Layer name.
    pub name: String,
    /// Computation.
    pub op: NodeOp,
    /// Input activations (the model input is an external tensor).
    pub inputs: Vec<TensorId>,
    /// Per-sample shape of each input.
    pub in_dims: Vec<Dims>,
    /// Output activation.
    pub out: TensorId,
    /// Per-sample output shape.
    pub out_dims: Dims,
    /// Parameters: weight then bias (Linear/Conv), gamma then beta (BatchNorm).
    pub params: Vec<Param>,
    /// Persistent statistics (BatchNorm running mean, running var).
    pub stats: Vec<TensorId>,
    /// Tensors saved in forward for backward (max-pool argmax; BatchNorm mean, inverse std).
    pub saved: Vec<TensorId>,
    /// dL/d(out), when anything upstream needs gradients.
    pub d_out: Option<TensorId>,
    /// dL/d(input i) and whether this node accumulates into it (another consumer wrote it first).
    pub d_in: Vec<Option<(TensorId, bool)>>,
    /// Scratch per phase (see [`scratch_slot`]).
    pub scratch: [Option<TensorId>; 3],
    /// Parameters train.
    pub trainable: bool,
    /// A Linear or LoRA Linear whose input is the output of a GELU/SiLU layer (f32): that activation and its own
    /// input. The weight gradient recomputes the activation tile by tile from its input instead of
    /// reading it ([`crate::plan::grad_w_inputs`]), so the activation's output lives only from its
    /// forward to this layer's and Linear → GELU → Linear keeps only the pre-activation for the
    /// backward pass (which the activation's own derivative reads anyway).
    pub act_in: Option<(Smooth, TensorId)>,
    /// A recurrent layer's per-step tensors ([`Bptt`]); None for every other layer.
    pub bptt: Option<Bptt>,
}

impl Node {
    /// Has a compute-gradient phase.
    pub fn has_grad_w(&self) -> bool {
        self.params.iter().any(|p| p.grad.is_some())
    }
    /// Has a compute-derivative phase (some input needs a derivative and this node must compute it).
    /// A view whose input derivative is a read-only view of its output derivative needs no instruction.
    pub fn has_grad_x(&self, g: &Graph) -> bool {
        self.d_in.iter().flatten().any(|&(t, _)| {
            let zero_copy = matches!(self.op, NodeOp::View)
                && matches!((g.tensors[t as usize].share, self.d_out), (Share::ReadView(v), Some(d)) if v == d);
            !zero_copy
        })
    }
}

/// Why a [`ModelSpec`] cannot be realised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GraphError {
    /// The model has no layers.
    Empty,
    /// A layer's configuration does not fit its input.
    Layer {
        /// Layer index.
        index: usize,
        /// Layer name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The batch size is zero.
    ZeroBatch,
    /// A tensor's size overflows the address space.
    TooLarge {
        /// Which tensor.
        tensor: String,
    },
    /// The loss does not fit the last layer.
    Loss(String),
}

/// Layer `li` (`name`) is a sequence layer and the core was built without them.
fn no_seq(li: usize, name: &str, kind: &LayerKind) -> GraphError {
    GraphError::Layer {
        index: li,
        name: String::from(name),
        reason: format!(
            "{} is a sequence layer, and this build of frugal-core has none \
             (it was built without its `seq` feature)",
            kind.type_name()
        ),
    }
}

impl fmt::Display for GraphError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GraphError::Empty => write!(f, "the model has no layers"),
            GraphError::Layer {
                index,
                name,
                reason,
            } => write!(f, "layers[{index}] ({name:?}): {reason}"),
            GraphError::ZeroBatch => write!(f, "the batch size must be at least 1"),
            GraphError::TooLarge { tensor } => write!(
                f,
                "tensor {tensor} is too large for this machine's address space"
            ),
            GraphError::Loss(r) => write!(f, "loss: {r}"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for GraphError {}

/// A realised model for one batch size.
#[derive(Clone, Debug)]
pub struct Graph {
    /// Planned batch size (steps may run fewer samples).
    pub batch: usize,
    /// Every tensor.
    pub tensors: Vec<TensorInfo>,
    /// Layers in execution order.
    pub nodes: Vec<Node>,
    /// The input batch (external).
    pub input: TensorId,
    /// The targets (external): class indices or regression targets.
    pub target: TensorId,
    /// Per-sample input shape.
    pub input_dims: Dims,
    /// Loss.
    pub loss: LossKind,
    /// Optimizer.
    pub optimizer: OptimizerSpec,
    /// Seed (init, dropout).
    pub seed: u64,
    /// dL/d(prediction), written by the fused loss.
    pub d_pred: TensorId,
    /// Scratch of the loss instruction, if any.
    pub loss_scratch: Option<TensorId>,
    /// fp16 storage: (tensor, its IEEE-half copy) pairs added by [`Graph::add_half`] for
    /// [`Phase::Pack`](crate::plan::Phase::Pack)/[`Phase::Unpack`](crate::plan::Phase::Unpack).
    pub halves: Vec<(TensorId, TensorId)>,
    /// Numeric precision of training (f32 unless realised with [`Graph::with_precision`]).
    pub precision: Precision,
    /// The int8 GEMM kernels the scratch tensors are sized for (int8 graphs; always
    /// [`KernelFamily::Any`] in f32).
    pub kernels: KernelFamily,
    /// Most i32 elements an int8 Linear weight gradient accumulates at once (0: the whole gradient;
    /// always 0 in f32). See [`GraphOptions::grad_tile`].
    pub grad_tile: usize,
    /// Labels per sample: the sequence length when the prediction is a sequence (a class per token:
    /// sequence cross-entropy, the mean over every token), else 1.
    pub tokens: usize,
}

/// How a [`ModelSpec`] is realised besides its batch size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphOptions {
    /// The numbers training runs in.
    pub precision: Precision,
    /// The int8 GEMM kernels the scratch is sized for (ignored in f32): a target that runs only the
    /// portable kernel reserves a quarter of the packing room or less.
    pub kernels: KernelFamily,
    /// Most i32 elements the accumulator of an int8 Linear weight gradient holds at once; 0 (default)
    /// holds the whole gradient (ignored in f32). A smaller tile cuts the gradient's scratch from 4 bytes
    /// per weight to `4 × grad_tile` bytes and costs a second GEMM pass over the gradient (its scale
    /// needs the exact maximum first); the result is the same, bit for bit.
    pub grad_tile: usize,
    /// Give tensors, nodes and parameters their names (`fc1.weight`, `d(relu1.out)`). Without, every
    /// name is the empty string and costs no allocation: a microcontroller runs a plan in a few KiB of
    /// heap, where the names alone would take several hundred bytes.
    pub names: bool,
    /// Workers the f32 scratch is sized for (default 1): each worker of a threaded
    /// [`CpuBackend`](crate::backend::CpuBackend) gets its own packing room
    /// ([`crate::ops::linear_scratch_len_threads`], [`crate::ops::conv_scratch_len_threads`]). A plan
    /// sized for fewer workers than the pool has still runs and gives the same bits, with fewer workers
    /// on the convolutions' samples. Ignored in int8. Not stored in plan files: a decoded plan is sized
    /// for one worker.
    pub threads: usize,
    /// Attention in recompute mode ([`AttnGeom::recompute_probs`]): each attention layer saves its rows'
    /// softmax statistics (`{name}.rowstats`, `[n, heads, seq, 2]`) instead of its probabilities
    /// (`{name}.probs`, `[n, heads, seq, seq]`), and its backward recomputes the probabilities one tile
    /// of query rows at a time into its scratch. The same bits either way; the planner sees the smaller
    /// saved tensor (the budget policy tries this after the saving mode). Stored in plan files.
    pub attn_recompute: bool,
}

impl Default for GraphOptions {
    /// f32, scratch for any kernel, whole gradients, named tensors.
    fn default() -> Self {
        Self {
            precision: Precision::F32,
            kernels: KernelFamily::Any,
            grad_tile: 0,
            names: true,
            threads: 1,
            attn_recompute: false,
        }
    }
}

fn err(index: usize, name: &str, reason: impl Into<String>) -> GraphError {
    GraphError::Layer {
        index,
        name: String::from(name),
        reason: reason.into(),
    }
}

impl Graph {
    /// Realises `spec` for batches of `batch` samples.
    pub fn new(spec: &ModelSpec, batch: usize) -> Result<Graph, GraphError> {
        Builder::new(spec, batch)?.build()
    }

    /// Realises `spec` for batches of `batch` samples in `precision`: tensors are sized by their dtype
    /// (int8 activations, derivatives and gradients; see [`crate::quant`]). A layer or loss the precision
    /// does not support is a typed error naming it.
    pub fn with_precision(
        spec: &ModelSpec,
        batch: usize,
        precision: Precision,
    ) -> Result<Graph, GraphError> {
        Self::with_options(
            spec,
            batch,
            GraphOptions {
                precision,
                ..GraphOptions::default()
            },
        )
    }

    /// Realises `spec` for batches of `batch` samples as `options` say ([`Graph::with_precision`] with
    /// the int8 scratch sized for `options.kernels`, and names only when `options.names`). Every vector
    /// of the graph has exactly the capacity it uses.
    pub fn with_options(
        spec: &ModelSpec,
        batch: usize,
        options: GraphOptions,
    ) -> Result<Graph, GraphError> {
        let mut b = Builder::new(spec, batch)?;
        b.precision = options.precision;
        if options.precision != Precision::F32 {
            b.kernels = options.kernels;
            b.grad_tile = options.grad_tile;
        }
        b.names = options.names;
        b.threads = options.threads.max(1);
        b.attn_recompute = options.attn_recompute;
        b.build()
    }

    /// All parameters with their node index.
    pub fn params(&self) -> impl Iterator<Item = (usize, &Param)> {
        self.nodes
            .iter()
            .enumerate()
            .flat_map(|(i, n)| n.params.iter().map(move |p| (i, p)))
    }

    /// The prediction (last node's output).
    pub fn pred(&self) -> TensorId {
        self.nodes.last().map(|n| n.out).unwrap_or(self.input)
    }

    /// The IEEE-half copy of tensor `t` (fp16 storage), if it has one.
    pub fn half_of(&self, t: TensorId) -> Option<TensorId> {
        self.halves.iter().find(|h| h.0 == t).map(|h| h.1)
    }

    /// Adds an IEEE-half copy of activation `t` (half its bytes, rounded up to whole elements): where a
    /// plan keeps `t` in fp16 between its forward and backward uses. Returns the existing copy when `t`
    /// has one; None when `t` is not an activation.
    pub fn add_half(&mut self, t: TensorId) -> Option<TensorId> {
        if let Some(h) = self.half_of(t) {
            return Some(h);
        }
        let info = self.tensors.get(t as usize)?;
        if info.kind != TensorKind::Activation {
            return None;
        }
        let half = TensorInfo {
            name: format!("f16({})", info.name),
            kind: TensorKind::Activation,
            bytes: info.bytes / 4 * 2,
            dtype: DType::F16,
            share: Share::Own,
        };
        self.tensors.push(half);
        let h = (self.tensors.len() - 1) as TensorId;
        self.halves.push((t, h));
        Some(h)
    }

    /// Whether its attention layers run in recompute mode ([`GraphOptions::attn_recompute`]; false
    /// without attention).
    pub fn attn_recompute(&self) -> bool {
        self.nodes
            .iter()
            .any(|n| matches!(n.op, NodeOp::Attention(a) if a.recompute_probs))
    }

    /// Per-sample prediction shape.
    pub fn pred_dims(&self) -> Dims {
        self.nodes
            .last()
            .map(|n| n.out_dims)
            .unwrap_or(self.input_dims)
    }
}

struct Builder<'a> {
    spec: &'a ModelSpec,
    batch: usize,
    tensors: Vec<TensorInfo>,
    precision: Precision,
    kernels: KernelFamily,
    grad_tile: usize,
    names: bool,
    threads: usize,
    attn_recompute: bool,
}

impl<'a> Builder<'a> {
    fn new(spec: &'a ModelSpec, batch: usize) -> Result<Self, GraphError> {
        if spec.layers.is_empty() {
            return Err(GraphError::Empty);
        }
        if batch == 0 {
            return Err(GraphError::ZeroBatch);
        }
        Ok(Self {
            spec,
            batch,
            tensors: Vec::new(),
            precision: Precision::F32,
            kernels: KernelFamily::Any,
            grad_tile: 0,
            names: true,
            threads: 1,
            attn_recompute: false,
        })
    }

    fn tensor(
        &mut self,
        name: String,
        kind: TensorKind,
        elems: usize,
        share: Share,
    ) -> Result<TensorId, GraphError> {
        let dtype = precision::dtype_of(self.precision, kind);
        self.tensor_typed(name, kind, elems, share, dtype)
    }

    fn tensor_typed(
        &mut self,
        name: String,
        kind: TensorKind,
        elems: usize,
        share: Share,
        dtype: DType,
    ) -> Result<TensorId, GraphError> {
        let bytes = elems
            .checked_mul(dtype.size())
            .ok_or_else(|| GraphError::TooLarge {
                tensor: name.clone(),
            })?;
        if bytes > isize::MAX as usize / 2 {
            return Err(GraphError::TooLarge { tensor: name });
        }
        let name = self.name(name);
        self.tensors.push(TensorInfo {
            name,
            kind,
            bytes,
            dtype,
            share,
        });
        Ok((self.tensors.len() - 1) as TensorId)
    }

    /// `name`, or the empty string (no allocation) when the graph has no names.
    fn name(&self, name: String) -> String {
        if self.names {
            name
        } else {
            String::new()
        }
    }

    /// `batch × per-sample` elements, checked.
    fn batched(&self, d: Dims, name: &str) -> Result<usize, GraphError> {
        (d.c as usize)
            .checked_mul(d.h as usize)
            .and_then(|v| v.checked_mul(d.w as usize))
            .and_then(|v| v.checked_mul(self.batch))
            .ok_or_else(|| GraphError::TooLarge {
                tensor: String::from(name),
            })
    }

    fn build(mut self) -> Result<Graph, GraphError> {
        let spec = self.spec;
        let n = self.batch;
        if spec.input.numel() == 0 {
            return Err(GraphError::Loss(String::from(
                "the input shape has a zero dimension",
            )));
        }
        let in_elems = self.batched(spec.input, "input")?;
        let input = self.tensor(
            String::from("input"),
            TensorKind::External,
            in_elems,
            Share::External,
        )?;
        let target = self.tensor(
            String::from("target"),
            TensorKind::External,
            0,
            Share::External,
        )?;
        let slots = precision::state_slots(self.precision, &spec.optimizer);
        precision::check_supported(self.precision, spec)?;

        // Forward pass: resolve shapes, create outputs, parameters, saved tensors and scratch.
        let mut nodes: Vec<Node> = Vec::with_capacity(spec.layers.len());
        let mut requires_grad: Vec<bool> = Vec::with_capacity(spec.layers.len());
        // Whether each layer's output is a sequence `[seq, 1, dim]` (from an Embedding on): Linear and
        // the norms then act on the last axis of each token.
        let mut is_seq: Vec<bool> = Vec::with_capacity(spec.layers.len());
        for (li, l) in spec.layers.iter().enumerate() {
            let name = l.name.as_str();
            let arity = if matches!(l.kind, LayerKind::Add) {
                2
            } else {
                1
            };
            if l.inputs.len() != arity {
                return Err(err(
                    li,
                    name,
                    format!(
                        "{} takes {arity} input(s), got {}",
                        l.kind.type_name(),
                        l.inputs.len()
                    ),
                ));
            }
            if !cfg!(feature = "seq") && l.kind.is_sequence_layer() {
                return Err(no_seq(li, name, &l.kind));
            }
            let mut inputs = Vec::with_capacity(arity);
            let mut in_dims = Vec::with_capacity(arity);
            let mut in_rg = false;
            let mut x_seq = false;
            for s in &l.inputs {
                match *s {
                    Src::Input => {
                        inputs.push(input);
                        in_dims.push(spec.input);
                    }
                    Src::Layer(j) if (j as usize) < li => {
                        let p: &Node = &nodes[j as usize];
                        inputs.push(p.out);
                        in_dims.push(p.out_dims);
                        in_rg |= requires_grad[j as usize];
                        x_seq |= is_seq[j as usize];
                    }
                    Src::Layer(j) => {
                        return Err(err(
                            li,
                            name,
                            format!("input refers to layer {j}, which does not come before it"),
                        ))
                    }
                }
            }
            let x = in_dims[0];
            let fin = x.numel();
            let bad = |r: &str| err(li, name, String::from(r));
            #[cfg(feature = "seq")]
            let need_seq = |what: &str| {
                if x_seq {
                    Ok(())
                } else {
                    Err(err(
                        li,
                        name,
                        format!("{what} needs a sequence input (after an embedding), got {x}"),
                    ))
                }
            };
            let seq_out = |w: u32| Dims::new(x.c, 1, w);
            let (op, out_dims) = match &l.kind {
                LayerKind::Linear { out, .. } => {
                    if *out == 0 {
                        return Err(bad("out must be at least 1"));
                    }
                    let (fin, od) = if x_seq {
                        (x.w as usize, seq_out(*out))
                    } else {
                        (fin, Dims::flat(*out))
                    };
                    (
                        NodeOp::Linear {
                            fin,
                            fout: *out as usize,
                        },
                        od,
                    )
                }
                #[cfg(feature = "seq")]
                LayerKind::LoraLinear {
                    out, rank, alpha, ..
                } => {
                    if *out == 0 || *rank == 0 {
                        return Err(bad("lora_linear needs out ≥ 1 and rank ≥ 1"));
                    }
                    if !alpha.is_finite() {
                        return Err(bad("lora_linear needs a finite alpha"));
                    }
                    let (fin, od) = if x_seq {
                        (x.w as usize, seq_out(*out))
                    } else {
                        (fin, Dims::flat(*out))
                    };
                    let g = LoraGeom {
                        fin,
                        fout: *out as usize,
                        rank: *rank as usize,
                        scale: *alpha / *rank as f32,
                    };
                    (NodeOp::Lora(g), od)
                }
                #[cfg(feature = "seq")]
                LayerKind::Embedding { vocab, dim } => {
                    if l.inputs[0] != Src::Input || x.h != 1 || x.w != 1 {
                        return Err(bad(
                            "embedding reads the model input, which must be [seq] token ids",
                        ));
                    }
                    if *vocab == 0 || *dim == 0 {
                        return Err(bad("embedding needs vocab ≥ 1 and dim ≥ 1"));
                    }
                    (
                        NodeOp::Embedding {
                            vocab: *vocab as usize,
                            dim: *dim as usize,
                        },
                        seq_out(*dim),
                    )
                }
                #[cfg(feature = "seq")]
                LayerKind::PosEmbedding => {
                    need_seq("pos_embedding")?;
                    (NodeOp::PosEmbedding { per: fin }, x)
                }
                #[cfg(feature = "seq")]
                LayerKind::LayerNorm { eps } | LayerKind::RmsNorm { eps } => {
                    if !(eps.is_finite() && *eps > 0.0) {
                        return Err(bad("a norm needs eps > 0"));
                    }
                    let dim = if x_seq { x.w as usize } else { fin };
                    let rms = matches!(l.kind, LayerKind::RmsNorm { .. });
                    (
                        NodeOp::Norm {
                            dim,
                            eps: *eps,
                            rms,
                        },
                        x,
                    )
                }
                #[cfg(feature = "seq")]
                LayerKind::Gelu => (NodeOp::Smooth(Smooth::Gelu), x),
                #[cfg(feature = "seq")]
                LayerKind::Silu => (NodeOp::Smooth(Smooth::Silu), x),
                #[cfg(feature = "seq")]
                LayerKind::Attention { heads } => {
                    need_seq("attention")?;
                    let (heads, w) = (*heads as usize, x.w as usize);
                    if heads == 0 || w % 3 != 0 || (w / 3) % heads != 0 {
                        return Err(err(
                            li,
                            name,
                            format!(
                                "attention needs [seq, 3·dim] input (queries, keys, values) with dim divisible by heads = {heads}; got {x}"
                            ),
                        ));
                    }
                    let g = AttnGeom {
                        seq: x.c as usize,
                        dim: w / 3,
                        heads,
                        recompute_probs: self.attn_recompute,
                    };
                    (NodeOp::Attention(g), seq_out((w / 3) as u32))
                }
                LayerKind::Lstm { hidden } | LayerKind::Gru { hidden } => {
                    let ty = l.kind.type_name();
                    #[cfg(feature = "seq")]
                    need_seq(ty)?;
                    let cell = if matches!(l.kind, LayerKind::Lstm { .. }) {
                        Cell::Lstm
                    } else {
                        Cell::Gru
                    };
                    let g = RnnGeom {
                        cell,
                        seq: x.c as usize,
                        hidden: *hidden as usize,
                    };
                    // The gate width is checked before anything multiplies it (a 32-bit target).
                    let fits = cell.gates().checked_mul(g.hidden) == Some(x.w as usize);
                    if *hidden == 0 || !fits {
                        return Err(err(
                            li,
                            name,
                            format!(
                                "{ty} with hidden = {hidden} needs hidden ≥ 1 and its input the {gates} gate pre-activations of every step, [seq, {gates}·hidden] (a linear to {gates}·{hidden} before it); got {x}",
                                gates = cell.gates()
                            ),
                        ));
                    }
                    (NodeOp::Rnn(g), seq_out(*hidden))
                }
                LayerKind::Conv2d {
                    out,
                    kernel,
                    stride,
                    padding,
                    groups,
                    ..
                } => {
                    let g = ConvGeom::new(
                        x.c as usize,
                        x.h as usize,
                        x.w as usize,
                        *out as usize,
                        kernel[0] as usize,
                        kernel[1] as usize,
                        stride[0] as usize,
                        stride[1] as usize,
                        padding[0] as usize,
                        padding[1] as usize,
                        *groups as usize,
                    )
                    .ok_or_else(|| {
                        err(
                            li,
                            name,
                            format!(
                                "conv2d with out={out}, kernel={kernel:?}, stride={stride:?}, padding={padding:?}, groups={groups} does not fit input {x} (zero size, groups not dividing channels, or kernel larger than the padded input)"
                            ),
                        )
                    })?;
                    let od = Dims::new(g.cout as u32, g.oh as u32, g.ow as u32);
                    (NodeOp::Conv(g), od)
                }
                LayerKind::MaxPool2d { kernel, stride }
                | LayerKind::AvgPool2d { kernel, stride } => {
                    let g = PoolGeom::new(
                        x.c as usize,
                        x.h as usize,
                        x.w as usize,
                        kernel[0] as usize,
                        kernel[1] as usize,
                        stride[0] as usize,
                        stride[1] as usize,
                    )
                    .ok_or_else(|| err(li, name, format!("pooling window {kernel:?} stride {stride:?} does not fit input {x}")))?;
                    let od = Dims::new(g.c as u32, g.oh as u32, g.ow as u32);
                    if matches!(l.kind, LayerKind::MaxPool2d { .. }) {
                        (NodeOp::MaxPool(g), od)
                    } else {
                        (NodeOp::AvgPool(g), od)
                    }
                }
                LayerKind::GlobalAvgPool => (
                    NodeOp::GlobalAvgPool {
                        c: x.c as usize,
                        hw: x.h as usize * x.w as usize,
                    },
                    Dims::flat(x.c),
                ),
                LayerKind::Relu => (NodeOp::Act(Act::Relu), x),
                LayerKind::Relu6 => (NodeOp::Act(Act::Relu6), x),
                LayerKind::Sigmoid => (NodeOp::Act(Act::Sigmoid), x),
                LayerKind::Tanh => (NodeOp::Act(Act::Tanh), x),
                LayerKind::Flatten => (NodeOp::View, Dims::flat(fin as u32)),
                LayerKind::Reshape { to } => {
                    if to.numel() != fin {
                        return Err(err(
                            li,
                            name,
                            format!(
                                "reshape to {to} has {} elements, input {x} has {fin}",
                                to.numel()
                            ),
                        ));
                    }
                    (NodeOp::View, *to)
                }
                LayerKind::Add => {
                    if in_dims[0] != in_dims[1] {
                        return Err(err(
                            li,
                            name,
                            format!(
                                "add needs equal shapes, got {} and {}",
                                in_dims[0], in_dims[1]
                            ),
                        ));
                    }
                    if inputs[0] == inputs[1] {
                        return Err(bad("add needs two different inputs"));
                    }
                    (NodeOp::Add, x)
                }
                LayerKind::BatchNorm2d { eps, momentum } => {
                    if !(eps.is_finite() && *eps > 0.0 && (0.0..=1.0).contains(momentum)) {
                        return Err(bad("batchnorm2d needs eps > 0 and momentum in [0, 1]"));
                    }
                    let train = l.trainable;
                    (
                        NodeOp::BatchNorm {
                            c: x.c as usize,
                            hw: x.h as usize * x.w as usize,
                            eps: *eps,
                            momentum: *momentum,
                            train,
                        },
                        x,
                    )
                }
                LayerKind::Dropout { p } => {
                    if !(0.0..1.0).contains(p) {
                        return Err(bad("dropout p must be in [0, 1)"));
                    }
                    (NodeOp::Dropout { p: *p }, x)
                }
                // Refused above (`no_seq`); a build without `seq` has no arm for them.
                #[cfg(not(feature = "seq"))]
                _ => return Err(no_seq(li, name, &l.kind)),
            };
            let out_elems = self.batched(out_dims, name)?;
            let share = match op {
                NodeOp::View => Share::ReadView(inputs[0]),
                // A frozen BatchNorm is a per-channel affine map: it may overwrite its input (a
                // sparse update keeps no copy of a frozen layer's output).
                NodeOp::Act(_)
                | NodeOp::Dropout { .. }
                | NodeOp::Add
                | NodeOp::PosEmbedding { .. }
                | NodeOp::BatchNorm { train: false, .. } => Share::ModifyView(inputs[0]),
                _ => Share::Own,
            };
            // A view of the external input is itself external.
            let share = match share {
                Share::ReadView(t) | Share::ModifyView(t)
                    if self.tensors[t as usize].kind == TensorKind::External =>
                {
                    if matches!(op, NodeOp::View) {
                        Share::External
                    } else {
                        Share::Own
                    }
                }
                s => s,
            };
            let out_kind = if share == Share::External {
                TensorKind::External
            } else {
                TensorKind::Activation
            };
            let out = self.tensor(format!("{name}.out"), out_kind, out_elems, share)?;

            // Parameters.
            let mut stats = Vec::new();
            let mut saved = Vec::new();
            let mut bptt = None;
            let trainable = l.trainable;
            // (name, shape, frozen whatever the layer says: LoRA's base weights).
            let mut shapes: Vec<(&str, Vec<usize>, bool)> = Vec::new();
            match (&l.kind, &op) {
                (LayerKind::Linear { bias, .. }, NodeOp::Linear { fin, fout }) => {
                    shapes.push(("weight", vec![*fout, *fin], false));
                    if *bias {
                        shapes.push(("bias", vec![*fout], false));
                    }
                }
                #[cfg(feature = "seq")]
                (LayerKind::LoraLinear { bias, .. }, NodeOp::Lora(g)) => {
                    shapes.push(("weight", vec![g.fout, g.fin], true));
                    if *bias {
                        shapes.push(("bias", vec![g.fout], true));
                    }
                    shapes.push(("lora_A.weight", vec![g.rank, g.fin], false));
                    shapes.push(("lora_B.weight", vec![g.fout, g.rank], false));
                }
                (LayerKind::Conv2d { bias, .. }, NodeOp::Conv(g)) => {
                    shapes.push(("weight", vec![g.cout, g.cin / g.groups, g.kh, g.kw], false));
                    if *bias {
                        shapes.push(("bias", vec![g.cout], false));
                    }
                }
                (_, NodeOp::BatchNorm { c, .. }) => {
                    shapes.push(("weight", vec![*c], false));
                    shapes.push(("bias", vec![*c], false));
                }
                #[cfg(feature = "seq")]
                (_, NodeOp::Embedding { vocab, dim }) => {
                    shapes.push(("weight", vec![*vocab, *dim], false));
                }
                #[cfg(feature = "seq")]
                (_, NodeOp::PosEmbedding { .. }) => {
                    shapes.push(("weight", vec![x.c as usize, x.w as usize], false));
                }
                #[cfg(feature = "seq")]
                (_, NodeOp::Norm { dim, rms, .. }) => {
                    shapes.push(("weight", vec![*dim], false));
                    if !*rms {
                        shapes.push(("bias", vec![*dim], false));
                    }
                }
                (_, NodeOp::Rnn(g)) => {
                    shapes.push(("weight_hh_l0", vec![g.gate_width(), g.hidden], false));
                    shapes.push(("bias_hh_l0", vec![g.gate_width()], false));
                }
                _ => {}
            }
            if trainable && l.update != Update::All {
                if !l.update.valid() {
                    return Err(bad("update = {channels = f} needs a fraction f in (0, 1]"));
                }
                if shapes.is_empty() {
                    return Err(err(
                        li,
                        name,
                        format!(
                            "update = {} needs a layer with parameters ({} has none)",
                            l.update,
                            l.kind.type_name()
                        ),
                    ));
                }
                // The sequence layers' gradient kernels write whole tensors (an embedding scatters
                // into any row): they train in full or not at all.
                if matches!(
                    op,
                    NodeOp::Embedding { .. }
                        | NodeOp::PosEmbedding { .. }
                        | NodeOp::Norm { .. }
                        | NodeOp::Lora(_)
                        | NodeOp::Rnn(_)
                ) {
                    return Err(err(
                        li,
                        name,
                        format!(
                            "update = {} is not supported on a {} layer (it trains in full or is frozen)",
                            l.update,
                            l.kind.type_name()
                        ),
                    ));
                }
                if l.update == Update::Bias && !shapes.iter().any(|s| s.0 == "bias") {
                    return Err(bad(
                        "update = \"bias\" needs a layer with a bias (bias = true)",
                    ));
                }
            }
            let mut params = Vec::with_capacity(shapes.len());
            for (pname, shape, frozen) in shapes {
                let trainable = trainable && !frozen;
                let full = format!("{name}.{pname}");
                let elems = shape
                    .iter()
                    .try_fold(1usize, |a, &d| a.checked_mul(d))
                    .ok_or_else(|| GraphError::TooLarge {
                        tensor: full.clone(),
                    })?;
                let value = self.tensor(full.clone(), TensorKind::Weight, elems, Share::Own)?;
                // Rows (dimension 0: output channels) the sparse update trains; the rest stay frozen.
                let rows = shape[0];
                let upd_rows = if trainable {
                    l.update.rows(rows, pname == "bias")
                } else {
                    None
                };
                let updated = upd_rows.map_or(0, |r| elems / rows.max(1) * r);
                let (grad, state) = if updated > 0 {
                    let g = self.tensor(
                        format!("grad({full})"),
                        TensorKind::Gradient,
                        updated,
                        Share::Own,
                    )?;
                    let mut st = Vec::with_capacity(slots);
                    for s in 0..slots {
                        st.push(self.tensor(
                            format!("{full}.state{s}"),
                            TensorKind::OptState,
                            updated,
                            Share::Own,
                        )?);
                    }
                    (Some(g), st)
                } else {
                    (None, Vec::new())
                };
                params.push(Param {
                    name: self.name(full),
                    shape,
                    value,
                    grad,
                    updated,
                    state,
                });
            }
            match op {
                NodeOp::BatchNorm { c, train, .. } => {
                    stats.push(self.tensor(
                        format!("{name}.running_mean"),
                        TensorKind::Stat,
                        c,
                        Share::Own,
                    )?);
                    stats.push(self.tensor(
                        format!("{name}.running_var"),
                        TensorKind::Stat,
                        c,
                        Share::Own,
                    )?);
                    if train {
                        saved.push(self.tensor(
                            format!("{name}.mean"),
                            TensorKind::Activation,
                            c,
                            Share::Own,
                        )?);
                        saved.push(self.tensor(
                            format!("{name}.invstd"),
                            TensorKind::Activation,
                            c,
                            Share::Own,
                        )?);
                    }
                }
                #[cfg(feature = "seq")]
                NodeOp::Norm { dim, rms, .. } => {
                    let rows =
                        n.checked_mul(fin / dim.max(1))
                            .ok_or_else(|| GraphError::TooLarge {
                                tensor: format!("{name}.rstd"),
                            })?;
                    if !rms {
                        saved.push(self.tensor(
                            format!("{name}.mean"),
                            TensorKind::Activation,
                            rows,
                            Share::Own,
                        )?);
                    }
                    saved.push(self.tensor(
                        format!("{name}.rstd"),
                        TensorKind::Activation,
                        rows,
                        Share::Own,
                    )?);
                }
                #[cfg(feature = "seq")]
                NodeOp::Attention(g) => {
                    let what = if g.recompute_probs {
                        "rowstats"
                    } else {
                        "probs"
                    };
                    let elems = g.saved_per_sample().checked_mul(n).ok_or_else(|| {
                        GraphError::TooLarge {
                            tensor: format!("{name}.{what}"),
                        }
                    })?;
                    saved.push(self.tensor(
                        format!("{name}.{what}"),
                        TensorKind::Activation,
                        elems,
                        Share::Own,
                    )?);
                }
                #[cfg(feature = "seq")]
                NodeOp::Lora(g) => {
                    let elems = (fin / g.fin.max(1))
                        .checked_mul(n)
                        .and_then(|r| r.checked_mul(g.rank))
                        .ok_or_else(|| GraphError::TooLarge {
                            tensor: format!("{name}.lora_u"),
                        })?;
                    saved.push(self.tensor(
                        format!("{name}.lora_u"),
                        TensorKind::Activation,
                        elems,
                        Share::Own,
                    )?);
                }
                NodeOp::Rnn(g) => {
                    // Every step's gates (after their nonlinearities) and state (LSTM cell, GRU
                    // W_hn·h + b_hn), each its own tensor: written by the step's forward, read last by
                    // its backward, so the planner reuses their bytes as the backward walks back.
                    let steps = u16::try_from(g.seq).map_err(|_| {
                        err(
                            li,
                            name,
                            format!("a recurrent layer runs at most 65535 steps; got {}", g.seq),
                        )
                    })?;
                    let (gate_elems, state_elems) =
                        match (n.checked_mul(g.gate_width()), n.checked_mul(g.hidden)) {
                            (Some(a), Some(b)) => (a, b),
                            _ => {
                                return Err(GraphError::TooLarge {
                                    tensor: format!("{name}.t0.gates"),
                                })
                            }
                        };
                    let first = self.tensors.len() as TensorId;
                    for t in 0..g.seq {
                        for (what, elems) in [("gates", gate_elems), ("state", state_elems)] {
                            saved.push(self.tensor(
                                format!("{name}.t{t}.{what}"),
                                TensorKind::Activation,
                                elems,
                                Share::Own,
                            )?);
                        }
                    }
                    let r = if g.cell == Cell::Gru {
                        let elems = n.checked_mul(g.seq).and_then(|s| s.checked_mul(g.hidden));
                        let elems = elems.ok_or_else(|| GraphError::TooLarge {
                            tensor: format!("{name}.rgate"),
                        })?;
                        let r = self.tensor(
                            format!("{name}.rgate"),
                            TensorKind::Activation,
                            elems,
                            Share::Own,
                        )?;
                        saved.push(r);
                        Some(r)
                    } else {
                        None
                    };
                    bptt = Some(Bptt {
                        steps,
                        first,
                        r,
                        carry: None,
                    });
                }
                NodeOp::MaxPool(_) => {
                    let dtype = if self.precision == Precision::F32 {
                        DType::U32
                    } else {
                        DType::U8
                    };
                    saved.push(self.tensor_typed(
                        format!("{name}.argmax"),
                        TensorKind::Activation,
                        out_elems,
                        Share::Own,
                        dtype,
                    )?);
                }
                _ => {}
            }
            let rg = in_rg || params.iter().any(|p| p.grad.is_some());
            requires_grad.push(rg);
            is_seq.push(match op {
                NodeOp::View => false,
                NodeOp::Embedding { .. } => true,
                _ => x_seq,
            });
            stats.shrink_to_fit();
            saved.shrink_to_fit();
            // A Linear after GELU/SiLU recomputes that activation for its weight gradient (f32: the
            // integer kernels have neither layer).
            #[cfg(not(feature = "seq"))]
            let act_in = None;
            #[cfg(feature = "seq")]
            let act_in = match (&op, l.inputs[0]) {
                (NodeOp::Linear { .. } | NodeOp::Lora(_), Src::Layer(j))
                    if self.precision == Precision::F32 =>
                {
                    match nodes[j as usize].op {
                        NodeOp::Smooth(k) => Some((k, nodes[j as usize].inputs[0])),
                        _ => None,
                    }
                }
                _ => None,
            };
            nodes.push(Node {
                layer: li as u32,
                name: self.name(String::from(name)),
                op,
                inputs,
                in_dims,
                out,
                out_dims,
                params,
                stats,
                saved,
                d_out: None,
                d_in: Vec::new(),
                scratch: [None; 3],
                trainable,
                act_in,
                bptt,
            });
        }

        // Loss compatibility.
        let last = nodes
            .last()
            .map(|n| (n.out, n.out_dims))
            .ok_or(GraphError::Empty)?;
        let tokens = if is_seq.last().copied().unwrap_or(false) {
            last.1.c as usize
        } else {
            1
        };
        if spec.loss == LossKind::SoftmaxCrossEntropy && last.1.numel() / tokens.max(1) < 2 {
            return Err(GraphError::Loss(format!(
                "cross_entropy needs at least 2 classes, the last layer gives {}",
                last.1
            )));
        }
        if !requires_grad.last().copied().unwrap_or(false) {
            return Err(GraphError::Loss(String::from(
                "no layer is trainable: nothing to train",
            )));
        }

        // Backward pass: derivative tensors. d(t) exists for every activation t that requires grad.
        let mut deriv: alloc::collections::BTreeMap<TensorId, (TensorId, bool)> =
            alloc::collections::BTreeMap::new();
        let pred_elems = self.batched(last.1, "prediction")?;
        let d_pred = self.tensor(
            format!("d({})", self.tensors[last.0 as usize].name),
            TensorKind::Derivative,
            pred_elems,
            Share::ModifyView(last.0),
        )?;
        deriv.insert(last.0, (d_pred, false));
        // Number of consumers of each tensor (to decide whether a view's derivative can be a view).
        let mut consumers: alloc::collections::BTreeMap<TensorId, u32> =
            alloc::collections::BTreeMap::new();
        for nd in &nodes {
            for &t in &nd.inputs {
                *consumers.entry(t).or_insert(0) += 1;
            }
        }
        for ni in (0..nodes.len()).rev() {
            let d_out = deriv.get(&nodes[ni].out).map(|d| d.0);
            nodes[ni].d_out = d_out;
            if matches!(nodes[ni].op, NodeOp::Rnn(_)) && d_out.is_some() {
                // The backward through time writes the input derivative, which the weight gradient
                // then reads: the input must be this layer's alone and need a derivative whenever
                // the recurrent weights train.
                let l = &spec.layers[ni];
                let x = nodes[ni].inputs[0];
                let src_rg = match l.inputs[0] {
                    Src::Input => false,
                    Src::Layer(j) => requires_grad[j as usize],
                };
                if consumers.get(&x).copied() != Some(1) {
                    return Err(err(
                        ni,
                        &l.name,
                        format!(
                            "{}'s input (the gate pre-activations) must feed no other layer",
                            l.kind.type_name()
                        ),
                    ));
                }
                if nodes[ni].has_grad_w() && !src_rg {
                    return Err(err(
                        ni,
                        &l.name,
                        format!(
                            "a trainable {} needs a trainable input projection (the linear before it)",
                            l.kind.type_name()
                        ),
                    ));
                }
            }
            let mut d_in = Vec::with_capacity(nodes[ni].inputs.len());
            for (k, &t) in nodes[ni].inputs.clone().iter().enumerate() {
                let src_rg = match spec.layers[ni].inputs[k] {
                    Src::Input => false,
                    Src::Layer(j) => requires_grad[j as usize],
                };
                if !src_rg || d_out.is_none() {
                    d_in.push(None);
                    continue;
                }
                if let Some(&(dt, _)) = deriv.get(&t) {
                    // Another consumer (later in forward order) already writes it: accumulate.
                    d_in.push(Some((dt, true)));
                    continue;
                }
                let elems = self.batched(nodes[ni].in_dims[k], "derivative")?;
                let d_out_id = d_out.unwrap_or(d_pred);
                let share = match nodes[ni].op {
                    NodeOp::View if consumers.get(&t).copied() == Some(1) => {
                        Share::ReadView(d_out_id)
                    }
                    // GELU/SiLU: the derivative is element-wise from the input (in place when
                    // f32: the integer kernels have neither).
                    NodeOp::Smooth(_) if self.precision == Precision::F32 => {
                        Share::ModifyView(d_out_id)
                    }
                    NodeOp::Act(_)
                    | NodeOp::Dropout { .. }
                    | NodeOp::PosEmbedding { .. }
                    | NodeOp::BatchNorm { train: true, .. } => Share::ModifyView(d_out_id),
                    NodeOp::Add if k == 0 => Share::ModifyView(d_out_id),
                    _ => Share::Own,
                };
                let dt = self.tensor(
                    format!("d({})", self.tensors[t as usize].name),
                    TensorKind::Derivative,
                    elems,
                    share,
                )?;
                deriv.insert(t, (dt, false));
                d_in.push(Some((dt, false)));
            }
            nodes[ni].d_in = d_in;
        }

        // Scratch per phase.
        let int8 = self.precision != Precision::F32;
        for node in nodes.iter_mut() {
            let ext_in = node
                .inputs
                .first()
                .is_some_and(|&t| self.tensors[t as usize].kind == TensorKind::External);
            if int8 && !precision::scratch_fits(&node.op, n) {
                return Err(GraphError::TooLarge {
                    tensor: format!("{} (its int8 scratch)", node.name),
                });
            }
            let (fwd, gw, gx) = match &node.op {
                _ if int8 => precision::scratch_bytes(
                    self.precision,
                    self.kernels,
                    self.grad_tile,
                    &node.op,
                    n,
                    ext_in,
                ),
                NodeOp::Linear { fin, fout } => {
                    let rows = n * node.op.rows_per_sample(node.in_dims[0].numel());
                    let s = ops::linear_scratch_len_threads(rows, *fin, *fout, self.threads);
                    // The recomputed activation's tile beside the GEMM's room.
                    #[cfg(feature = "seq")]
                    let gw = match node.act_in {
                        Some(_) => s + ops::seq::act_tile_len(rows, *fin),
                        None => s,
                    };
                    #[cfg(not(feature = "seq"))]
                    let gw = s;
                    (s, gw, s)
                }
                #[cfg(feature = "seq")]
                NodeOp::Lora(g) => {
                    let rows = n * node.op.rows_per_sample(node.in_dims[0].numel());
                    let b = ops::seq::lora_bwd_scratch_len(g, rows);
                    let gw = match node.act_in {
                        Some(_) => b + ops::seq::act_tile_len(rows, g.fin),
                        None => b,
                    };
                    (ops::seq::lora_gemm_scratch_len(g, rows), gw, b)
                }
                #[cfg(feature = "seq")]
                NodeOp::Attention(g) => (
                    ops::seq::attention_fwd_scratch_len(g),
                    0,
                    ops::seq::attention_bwd_scratch_len(g),
                ),
                NodeOp::Rnn(g) => (
                    ops::rnn::rnn_fwd_scratch_len(g, n),
                    ops::rnn::rnn_grad_w_scratch_len(g, n),
                    ops::rnn::rnn_grad_x_scratch_len(g, n),
                ),
                NodeOp::Conv(g) => {
                    let s = ops::conv_scratch_len_threads(g, n, self.threads);
                    (s, s, s)
                }
                _ => (0, 0, 0),
            };
            let needed = [
                true,
                // A Linear/Conv2d weight gradient needs the GEMM's room; a bias-only one does not.
                // LoRA's weight is frozen: its adapters' gradients need the room.
                if matches!(node.op, NodeOp::Lora(_)) {
                    node.params.iter().any(|p| p.grad.is_some())
                } else {
                    node.params.first().is_some_and(|p| p.grad.is_some())
                },
                node.d_in.iter().any(|d| d.is_some()),
            ];
            for (slot, (elems, tag)) in [(fwd, "F"), (gw, "CG"), (gx, "CD")].into_iter().enumerate()
            {
                if elems > 0 && needed[slot] {
                    let name = format!("{}.scratch({tag})", node.name);
                    let dtype = if int8 { DType::U8 } else { DType::F32 };
                    node.scratch[slot] = Some(self.tensor_typed(
                        name,
                        TensorKind::Scratch,
                        elems,
                        Share::Own,
                        dtype,
                    )?);
                }
            }
            // The derivatives a recurrent layer's backward carries from step to step: a planned
            // tensor, alive from the last step's backward (the first to run) to the first step's.
            if let (NodeOp::Rnn(g), Some(b), true) = (&node.op, &mut node.bptt, needed[2]) {
                let elems = n
                    .checked_mul(g.hidden)
                    .and_then(|e| e.checked_mul(if g.cell == Cell::Lstm { 2 } else { 1 }))
                    .ok_or_else(|| GraphError::TooLarge {
                        tensor: format!("{}.dcarry", node.name),
                    })?;
                b.carry = Some(self.tensor(
                    format!("{}.dcarry", node.name),
                    TensorKind::Derivative,
                    elems,
                    Share::Own,
                )?);
            }
        }
        let loss_scratch = if int8 {
            let classes = last.1.numel();
            Some(self.tensor_typed(
                String::from("loss.scratch"),
                TensorKind::Scratch,
                classes,
                Share::Own,
                DType::I32,
            )?)
        } else {
            None
        };

        let mut tensors = self.tensors;
        tensors.shrink_to_fit();
        Ok(Graph {
            batch: n,
            tensors,
            nodes,
            input,
            target,
            input_dims: spec.input,
            loss: spec.loss,
            optimizer: spec.optimizer,
            seed: spec.seed,
            d_pred,
            loss_scratch,
            halves: Vec::new(),
            precision: self.precision,
            kernels: self.kernels,
            grad_tile: self.grad_tile,
            tokens,
        })
    }
}
