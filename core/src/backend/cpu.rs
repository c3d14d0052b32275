//! The f32 CPU backend: every instruction of an f32 plan as slices of the host arena, run by the
//! portable kernels in [`crate::ops`] (SIMD where the target has it), GEMM and convolution split across a
//! host-provided [`WorkerPool`] when one is given.
use super::arena::{self, carve, f32s, u32s};
use super::{
    Backend, Cx, ExecError, LayerOps, LossOps, LossOut, Mode, MoveOps, OptimOps, Placement,
    StepStart, Target,
};
use crate::graph::{scratch_slot, Node, NodeOp, TensorId, TensorKind};
use crate::kernels::rows::dequantize_rows;
use crate::model::LossKind;
use crate::ops;
use crate::ops::Act;
use crate::optim::{self, StepCtx};
use crate::plan::params::{self, ParamEncoding, ReadOnly};
use crate::plan::{Eo, Instr, Phase, Plan, LOSS_NODE};
use crate::pool::{SingleThread, WorkerPool};
use crate::rng::{hash2, Rng};

/// A sequence layer in a build without the `seq` feature (the graph refuses such a model first,
/// naming the layer; this is for a plan that reached the backend some other way).
#[cfg(not(feature = "seq"))]
const NO_SEQ: ExecError =
    ExecError::Unsupported("a sequence layer: frugal-core was built without its `seq` feature");

/// The portable CPU backend (SIMD where the target has it), single-threaded unless given a pool.
///
/// It reads frozen parameters from the executor's read-only parameter image when the plan has a
/// parameter space ([`crate::plan::params`]); int8 and fp16 weights there are converted to f32, one
/// weight at a time, into the plan's dequantisation region ([`Plan::dequant_region`]).
///
/// With `std`, a BatchNorm forward (training or recompute) whose next instruction is a ReLU or ReLU6
/// over its output in place applies the activation as it writes its output, and that instruction then
/// does nothing ([`fused_act`]): one pass over the tensor instead of two, the same bits. Backward, the
/// derivative of such a ReLU or ReLU6 in place, when the BatchNorm's gradient and input derivative (in
/// place) follow it, runs as one kernel with them, the activation's derivative taken as the
/// BatchNorm's kernels read their output derivative ([`fused_bn_grad`]): the same bits, the
/// gradient read twice instead of six times and written once instead of twice.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend<P: WorkerPool = SingleThread> {
    pool: P,
    /// Run every instruction on its own (no BatchNorm + activation pass): the reference the fused
    /// steps are tested against.
    unfused: bool,
    /// The instruction (plan, execution order) whose work the last BatchNorm forward, or fused
    /// BatchNorm backward, did: skipped if it is the next one dispatched. Cleared by every other
    /// dispatch, at every step and plan switch.
    fused: Option<(usize, Eo)>,
    /// The step in progress may switch plans between instructions (an adaptive step): no backward
    /// fusion, whose work spans instructions and is not idempotent like the forward's activation.
    switchable: bool,
    /// No fused BatchNorm backward (the forward's BatchNorm + activation pass stays): what the
    /// backward fusion is measured against.
    no_backward_fusion: bool,
    /// Fused BatchNorm backwards run so far ([`CpuBackend::fused_backward`]).
    backward_fused: u64,
}

impl CpuBackend {
    /// The CPU backend on the calling thread alone.
    pub fn new() -> Self {
        Self::with_pool(SingleThread)
    }
}

impl<P: WorkerPool> CpuBackend<P> {
    /// The CPU backend splitting GEMM, convolution and large element-wise work across `pool`; results
    /// are bit-identical to one thread.
    pub fn with_pool(pool: P) -> Self {
        Self {
            pool,
            unfused: false,
            fused: None,
            switchable: false,
            no_backward_fusion: false,
            backward_fused: 0,
        }
    }

    /// This backend running every instruction on its own, without the BatchNorm + activation pass
    /// (the same results: the reference of the tests).
    pub fn unfused(self) -> Self {
        Self {
            unfused: true,
            ..self
        }
    }

    /// This backend without the fused BatchNorm backward, the forward's BatchNorm + activation pass
    /// kept (the same results: what `cargo xtask bench budget --mobilenet-fusion` compares with).
    pub fn without_backward_fusion(self) -> Self {
        Self {
            no_backward_fusion: true,
            ..self
        }
    }

    /// How many times an activation's derivative and the BatchNorm backward after it ran as one
    /// kernel (see [`CpuBackend`]), over this backend's life: what the tests check happens.
    pub fn fused_backward(&self) -> u64 {
        self.backward_fused
    }

    /// The worker pool.
    pub fn pool(&self) -> &P {
        &self.pool
    }
}

fn node_of<'a>(cx: &Cx<'a>) -> Result<&'a Node, ExecError> {
    if cx.ins.node == LOSS_NODE {
        return Err(ExecError::BadPlan("loss instruction in the wrong place"));
    }
    cx.plan
        .graph
        .nodes
        .get(cx.ins.node as usize)
        .ok_or(ExecError::BadPlan("node index out of range"))
}

fn seed_of(cx: &Cx<'_>) -> RunSeed {
    RunSeed {
        seed: cx.seed,
        start: cx.start,
    }
}

/// The plan's identity for [`CpuBackend::fused`]: its address (a plan switch also clears the mark).
fn plan_key(plan: &Plan) -> usize {
    plan as *const Plan as usize
}

/// The activation the BatchNorm forward at `cx` may apply as it writes (the ReLU or ReLU6 that the
/// next instruction runs over its output in place, in the same phase, micro-batch and placement), so
/// that instruction has nothing left to do. Nothing reads the BatchNorm's output in between: the two
/// instructions are adjacent, and the activation overwrites it in place.
///
/// Hosts with `std` only: the fused kernels would grow the CPU browser module and the firmware, whose
/// batches are small enough for the two passes to stay in cache (the results are the same bits).
#[cfg(not(feature = "std"))]
fn fused_act(_: &Cx<'_>, _: &Node) -> Option<Act> {
    None
}

#[cfg(feature = "std")]
fn fused_act(cx: &Cx<'_>, node: &Node) -> Option<Act> {
    if !matches!(node.op, NodeOp::BatchNorm { train: true, .. })
        || !matches!(cx.mode, Mode::Train | Mode::Recompute)
    {
        return None;
    }
    // Only the plan's own instruction (not one a plan switch synthesises to regenerate a value).
    if !core::ptr::eq(cx.ins, cx.plan.program.get(cx.eo as usize)?) {
        return None;
    }
    let next_eo = cx.eo.checked_add(1)?;
    let next = cx.plan.program.get(next_eo as usize)?;
    if next.mb != cx.ins.mb || next.phase != cx.ins.phase || next.placement != cx.ins.placement {
        return None;
    }
    let act_node = cx.plan.graph.nodes.get(next.node as usize)?;
    match act_node.op {
        NodeOp::Act(a @ (Act::Relu | Act::Relu6))
            if act_node.inputs.first() == Some(&node.out)
                && same(cx.plan, next_eo, node.out, act_node.out)
                && same(cx.plan, cx.eo, node.out, act_node.out) =>
        {
            Some(a)
        }
        _ => None,
    }
}

/// The BatchNorm backward a ReLU or ReLU6 derivative at `cx` may run with (see [`CpuBackend`]): the
/// activation's derivative is in place over the BatchNorm's output derivative, and the next
/// instructions are that BatchNorm's gradient (if it has one) and its input derivative in place, in
/// the same micro-batch and placement. Returns the activation, the BatchNorm node and the execution
/// order of its gradient (None: frozen parameters) and input derivative.
///
/// Hosts with `std` only, like [`fused_act`].
#[cfg(not(feature = "std"))]
fn fused_bn_grad<'a>(_: &Cx<'a>, _: &Node) -> Option<(Act, &'a Node, Option<Eo>, Eo)> {
    None
}

#[cfg(feature = "std")]
fn fused_bn_grad<'a>(cx: &Cx<'a>, node: &Node) -> Option<(Act, &'a Node, Option<Eo>, Eo)> {
    let (plan, eo) = (cx.plan, cx.eo);
    let act = match node.op {
        NodeOp::Act(a @ (Act::Relu | Act::Relu6)) => a,
        _ => return None,
    };
    // Only the plan's own instruction (not one a plan switch synthesises to regenerate a value).
    if !core::ptr::eq(cx.ins, plan.program.get(eo as usize)?) {
        return None;
    }
    let (dy, (d, _)) = (node.d_out?, node.d_in.first().copied().flatten()?);
    if !same(plan, eo, dy, d) {
        return None;
    }
    let along = |e: Eo| {
        plan.program
            .get(e as usize)
            .filter(|i| i.mb == cx.ins.mb && i.placement == cx.ins.placement)
    };
    let first = along(eo.checked_add(1)?)?;
    let bn = plan.graph.nodes.get(first.node as usize)?;
    if !matches!(bn.op, NodeOp::BatchNorm { train: true, .. })
        || node.inputs.first() != Some(&bn.out)
        || bn.d_out != Some(d)
    {
        return None;
    }
    let (w_eo, x_eo) = match first.phase {
        Phase::GradW => (Some(eo + 1), eo.checked_add(2)?),
        Phase::GradX => (None, eo + 1),
        _ => return None,
    };
    let gx = along(x_eo)?;
    let (bdx, _) = bn.d_in.first().copied().flatten()?;
    (gx.node == first.node && gx.phase == Phase::GradX && same(plan, x_eo, d, bdx))
        .then_some((act, bn, w_eo, x_eo))
}

impl<P: WorkerPool> LayerOps for CpuBackend<P> {
    fn forward(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        let node = node_of(cx)?;
        #[cfg(feature = "seq")]
        if let NodeOp::Rnn(g) = &node.op {
            self.fused = None;
            return rnn_step(cx, host, node, g);
        }
        if self.fused.take() == Some((plan_key(cx.plan), cx.eo))
            && matches!(node.op, NodeOp::Act(_))
        {
            return Ok(()); // the BatchNorm before it applied this activation
        }
        let post = if self.unfused {
            None
        } else {
            fused_act(cx, node)
        };
        if post.is_some() {
            bn_forward(
                cx.plan, cx.eo, host, node, cx.n, cx.x, cx.mode, cx.params, post,
            )?;
            self.fused = Some((plan_key(cx.plan), cx.eo + 1));
            return Ok(());
        }
        let pool: &dyn WorkerPool = &self.pool;
        let ro = Ro { body: cx.params };
        forward(
            pool,
            cx.plan,
            cx.eo,
            host,
            node,
            cx.n,
            cx.x,
            cx.mode,
            seed_of(cx),
            ro,
        )
    }
    fn grad_w(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        let node = node_of(cx)?;
        if self.fused.take() == Some((plan_key(cx.plan), cx.eo))
            && matches!(node.op, NodeOp::BatchNorm { .. })
        {
            // The fused BatchNorm backward wrote this gradient; its input derivative is next.
            self.fused = Some((plan_key(cx.plan), cx.eo + 1));
            return Ok(());
        }
        let pool: &dyn WorkerPool = &self.pool;
        grad_w(pool, cx.plan, cx.eo, host, node, cx.n, cx.x, cx.ins.mb > 0)
    }
    fn grad_x(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        let node = node_of(cx)?;
        #[cfg(feature = "seq")]
        if let NodeOp::Rnn(g) = &node.op {
            return rnn_step(cx, host, node, g);
        }
        if self.fused.take() == Some((plan_key(cx.plan), cx.eo))
            && matches!(node.op, NodeOp::BatchNorm { .. })
        {
            return Ok(()); // the fused BatchNorm backward wrote this input derivative
        }
        if !(self.unfused || self.no_backward_fusion || self.switchable) {
            if let Some((act, bn, w_eo, x_eo)) = fused_bn_grad(cx, node) {
                if bn_grad_fused(cx, host, node, act, bn, w_eo, x_eo)? {
                    self.fused = Some((plan_key(cx.plan), cx.eo + 1));
                    self.backward_fused += 1;
                    return Ok(());
                }
            }
        }
        let pool: &dyn WorkerPool = &self.pool;
        let ro = Ro { body: cx.params };
        grad_x(pool, cx.plan, cx.eo, host, node, cx.n, seed_of(cx), ro)
    }
}

impl<P: WorkerPool> LossOps for CpuBackend<P> {
    fn loss(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        target: Target<'_>,
        norm: usize,
    ) -> Result<LossOut, ExecError> {
        self.fused = None;
        let train = cx.mode == Mode::Train;
        let (mean, correct) = run_loss(cx.plan, cx.eo, host, cx.n, target, train, norm)?;
        Ok(LossOut {
            sum: mean as f64 * cx.n as f64,
            mean,
            correct,
        })
    }
}

impl<P: WorkerPool> OptimOps for CpuBackend<P> {
    fn apply(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.fused = None;
        let node = node_of(cx)?;
        apply(cx.plan, cx.eo, host, node, StepCtx { t: cx.t })
    }
}

impl<P: WorkerPool> MoveOps for CpuBackend<P> {
    fn convert_half(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.fused = None;
        convert_half(cx.plan, cx.eo, host, cx.ins)
    }
}

impl<P: WorkerPool> Backend for CpuBackend<P> {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn serves(&self, p: Placement) -> bool {
        p == Placement::Cpu
    }
    fn begin_step(&mut self, _plan: &Plan, step: &StepStart<'_>) -> Result<(), ExecError> {
        self.fused = None;
        self.switchable = step.switchable;
        Ok(())
    }
    /// Checks placements and spaces (the host arena and a read-only parameter space only).
    fn prepare(&mut self, plan: &Plan) -> Result<(), ExecError> {
        self.fused = None;
        if let Some(i) = plan.program.iter().find(|i| !self.serves(i.placement)) {
            return Err(ExecError::Placement(i.placement));
        }
        if let Some(s) = plan
            .spaces
            .iter()
            .find(|s| ParamEncoding::of_space(s.space).is_none())
        {
            return Err(ExecError::Space(s.space.0));
        }
        Ok(())
    }
}

/// What parameters are read from besides the arena: the parameter image's body (empty when the plan
/// has no parameter space).
#[derive(Clone, Copy)]
struct Ro<'r> {
    body: &'r [u8],
}

/// The arena range an int8 or fp16 weight operand is converted into (`(0, 0)` for any other operand).
fn dequant(plan: &Plan, ro: Option<ReadOnly<'_>>) -> Result<(usize, usize), ExecError> {
    match ro {
        Some(ReadOnly::I8 { .. } | ReadOnly::F16(_)) => plan.dequant_region().ok_or(
            ExecError::BadPlan("an int8 or fp16 weight in a plan without a dequantisation region"),
        ),
        _ => Ok((0, 0)),
    }
}

/// A parameter operand: the arena range to carve (`(0, 0)` when it is read from the image) and the
/// image's view of it.
fn param<'r>(
    plan: &Plan,
    eo: Eo,
    t: Option<TensorId>,
    body: &'r [u8],
) -> Result<((usize, usize), Option<ReadOnly<'r>>), ExecError> {
    match t {
        Some(t) if !body.is_empty() => match params::read_only(plan, body, t)? {
            Some(r) => Ok(((0, 0), Some(r))),
            None => Ok((whole(plan, eo, Some(t))?, None)),
        },
        _ => Ok((whole(plan, eo, t)?, None)),
    }
}

/// The f32 values of a parameter operand: carved from the arena, read from the image in place, or (an
/// int8 or fp16 weight) converted into `dq`, its carved dequantisation region.
fn values<'a>(
    carved: &'a mut [u8],
    ro: Option<ReadOnly<'a>>,
    dq: &'a mut [u8],
) -> Result<&'a [f32], ExecError> {
    match ro {
        None => Ok(f32s(carved)?),
        Some(ReadOnly::F32(v)) => Ok(v),
        Some(ReadOnly::I8 { scales, q }) => {
            let out = f32s(dq)?.get_mut(..q.len()).ok_or(ExecError::BadPlan(
                "an int8 weight larger than the dequantisation region",
            ))?;
            dequantize_rows(q, scales, out);
            Ok(out)
        }
        Some(ReadOnly::F16(h)) => {
            let out = f32s(dq)?.get_mut(..h.len()).ok_or(ExecError::BadPlan(
                "an fp16 weight larger than the dequantisation region",
            ))?;
            params::f16_to_f32(h, out);
            Ok(out)
        }
    }
}

/// A parameter operand that is never int8 (biases, BatchNorm parameters and statistics).
fn f32_param<'a>(carved: &'a mut [u8], ro: Option<ReadOnly<'a>>) -> Result<&'a [f32], ExecError> {
    values(carved, ro, &mut [])
}

/// Randomness of one instruction: the step's seed and the batch index of its first sample.
#[derive(Clone, Copy)]
struct RunSeed {
    seed: u64,
    start: usize,
}

/// Initialises every parameter like PyTorch's defaults (uniform ±1/√fan_in for weights and biases;
/// BatchNorm γ=1, β=0, running mean 0, running var 1) and zeroes the optimizer state.
pub(crate) fn init_params_f32(plan: &Plan, arena: &mut [u8], seed: u64) -> Result<(), ExecError> {
    let mut rng = Rng::new(seed);
    for node in &plan.graph.nodes {
        let fan_in = match &node.op {
            NodeOp::Linear { fin, .. } => *fin,
            NodeOp::Lora(g) => g.fin,
            // nn.LSTM/nn.GRU: every parameter uniform ±1/√hidden.
            NodeOp::Rnn(g) => g.hidden,
            NodeOp::Conv(g) => g.cin / g.groups * g.kh * g.kw,
            _ => 0,
        };
        for (k, p) in node.params.iter().enumerate() {
            if read_only(plan, p.value) {
                // In the parameter image (the caller's bytes); its draws are made all the same, so the
                // parameters in the arena start as in the plan that keeps every one there.
                let elems = plan.graph.tensors[p.value as usize].bytes / 4;
                if matches!(
                    node.op,
                    NodeOp::Embedding { .. } | NodeOp::PosEmbedding { .. }
                ) {
                    // Two uniform draws per value (Box–Muller below).
                    for _ in 0..2 * elems {
                        rng.uniform(0.0, 1.0);
                    }
                } else {
                    // Filled, not drawn: norms' γ and β, LoRA's B.
                    let lora_b = matches!(node.op, NodeOp::Lora(_)) && k + 1 == node.params.len();
                    if matches!(node.op, NodeOp::BatchNorm { .. } | NodeOp::Norm { .. }) || lora_b {
                        continue;
                    }
                    let bound = 1.0 / libm::sqrtf(fan_in.max(1) as f32);
                    for _ in 0..elems {
                        rng.uniform(-bound, bound);
                    }
                }
                continue;
            }
            let v = tensor_mut(plan, arena, p.value)?;
            let last = k + 1 == node.params.len();
            if let NodeOp::BatchNorm { .. } | NodeOp::Norm { .. } = node.op {
                v.fill(if k == 0 { 1.0 } else { 0.0 });
            } else if matches!(node.op, NodeOp::Lora(_)) && last {
                // LoRA's B starts at zero: the adapted layer starts as its base (PEFT's init).
                v.fill(0.0);
            } else if cfg!(feature = "seq")
                && matches!(
                    node.op,
                    NodeOp::Embedding { .. } | NodeOp::PosEmbedding { .. }
                )
            {
                // PyTorch's nn.Embedding: N(0, 1) (Box–Muller on the same uniform stream; not built
                // without `seq`, which has no embeddings: it is the core's only use of `cosf`).
                for x in v.iter_mut() {
                    let (u1, u2) = (rng.uniform(1e-7, 1.0), rng.uniform(0.0, 1.0));
                    *x = libm::sqrtf(-2.0 * libm::logf(u1))
                        * libm::cosf(2.0 * core::f32::consts::PI * u2);
                }
            } else {
                let bound = 1.0 / libm::sqrtf(fan_in.max(1) as f32);
                for x in v.iter_mut() {
                    *x = rng.uniform(-bound, bound);
                }
            }
            for &s in &p.state {
                tensor_mut(plan, arena, s)?.fill(0.0);
            }
        }
        for (k, &s) in node.stats.iter().enumerate() {
            if !read_only(plan, s) {
                tensor_mut(plan, arena, s)?.fill(if k == 0 { 0.0 } else { 1.0 });
            }
        }
    }
    Ok(())
}

/// Tensor `t` lives in the plan's read-only parameter space.
pub(crate) fn read_only(plan: &Plan, t: TensorId) -> bool {
    plan.storage_at(t, 0)
        .and_then(|s| plan.lives.get(s))
        .is_some_and(|l| ParamEncoding::of_space(l.space).is_some())
}

/// Whole tensor `t` as a mutable f32 slice.
pub(crate) fn tensor_mut<'a>(
    plan: &Plan,
    arena: &'a mut [u8],
    t: TensorId,
) -> Result<&'a mut [f32], ExecError> {
    let (off, len) = plan
        .region(t)
        .ok_or(ExecError::Tensor("tensor is not in the arena"))?;
    let s = arena
        .get_mut(off..off + len)
        .ok_or(ExecError::BadPlan("tensor outside the arena"))?;
    f32s(s)
}

/// Arena range (offset, bytes) of the whole storage a swap instruction at `eo` moves.
pub(crate) fn spill_region(plan: &Plan, eo: Eo) -> Result<(usize, usize), ExecError> {
    let bad = ExecError::BadPlan("a swap names a tensor that is not in the arena");
    let t = plan.program[eo as usize].spilled().ok_or(bad.clone())?;
    let s = plan.storage_at(t, eo).ok_or(bad.clone())?;
    let (off, len) = (plan.offsets[s], plan.lives[s].bytes);
    if off.checked_add(len).is_none_or(|e| e > plan.arena_bytes) {
        return Err(bad);
    }
    Ok((off, len))
}

/// (offset, bytes) of the first `elems` f32 elements of `t` at `eo` (see [`operand`](arena::operand)).
fn reg(
    plan: &Plan,
    eo: Eo,
    t: Option<TensorId>,
    elems: usize,
) -> Result<(usize, usize), ExecError> {
    arena::operand(plan, eo, t, elems * 4)
}

fn whole(plan: &Plan, eo: Eo, t: Option<TensorId>) -> Result<(usize, usize), ExecError> {
    arena::operand_whole(plan, eo, t)
}

fn same(plan: &Plan, eo: Eo, a: TensorId, b: TensorId) -> bool {
    matches!((plan.region_at(a, eo), plan.region_at(b, eo)), (Some(x), Some(y)) if x.0 == y.0)
}

fn is_ext(plan: &Plan, t: TensorId) -> bool {
    plan.graph.tensors[t as usize].kind == TensorKind::External
}

fn opt_f32(s: &mut [u8]) -> Result<Option<&mut [f32]>, ExecError> {
    if s.is_empty() {
        Ok(None)
    } else {
        f32s(s).map(Some)
    }
}

/// The fused loss on `n` samples; the derivative is normalised by `norm` samples (the whole batch when
/// micro-batching, so the accumulated gradient equals the whole batch's). Returns the micro-batch's mean
/// loss and correct count.
#[allow(clippy::too_many_arguments)]
fn run_loss(
    plan: &Plan,
    eo: Eo,
    a: &mut [u8],
    n: usize,
    target: Target<'_>,
    train: bool,
    norm: usize,
) -> Result<(f32, usize), ExecError> {
    let g = &plan.graph;
    let per = g.pred_dims().numel();
    let pred = g.pred();
    // Cross-entropy runs over every token of a sequence prediction (`tokens` rows of `classes`).
    let (rows, classes) = (n * g.tokens.max(1), per / g.tokens.max(1));
    let mismatch = ExecError::BadBatch("target kind does not match the loss", 0);
    if !train {
        let [p] = carve(a, [reg(plan, eo, Some(pred), n * per)?])?;
        let p = f32s(p)?;
        return match (g.loss, target) {
            (LossKind::SoftmaxCrossEntropy, Target::Classes(y)) => {
                let (sum, c) = ops::softmax_ce_eval(rows, classes, p, y);
                Ok((sum / rows as f32, c))
            }
            (LossKind::Mse, Target::Values(t)) => Ok((ops::mse_eval(p, t), 0)),
            _ => Err(mismatch),
        };
    }
    let (result, d) = if same(plan, eo, pred, g.d_pred) {
        let [p] = carve(a, [reg(plan, eo, Some(pred), n * per)?])?;
        let p = f32s(p)?;
        let r = match (g.loss, target) {
            (LossKind::SoftmaxCrossEntropy, Target::Classes(y)) => {
                ops::softmax_ce_inplace(rows, classes, p, y)
            }
            (LossKind::Mse, Target::Values(t)) => (ops::mse_inplace(p, t), 0),
            _ => return Err(mismatch),
        };
        (r, p)
    } else {
        let [p, d] = carve(
            a,
            [
                reg(plan, eo, Some(pred), n * per)?,
                reg(plan, eo, Some(g.d_pred), n * per)?,
            ],
        )?;
        let (p, d) = (f32s(p)?, f32s(d)?);
        let r = match (g.loss, target) {
            (LossKind::SoftmaxCrossEntropy, Target::Classes(y)) => {
                ops::softmax_ce(rows, classes, p, y, d)
            }
            (LossKind::Mse, Target::Values(t)) => (ops::mse(p, t, d), 0),
            _ => return Err(mismatch),
        };
        (r, d)
    };
    if norm != n {
        ops::scale(n as f32 / norm as f32, d);
    }
    Ok(result)
}

/// fp16 storage: [`Phase::Pack`] rounds the f32 tensor to IEEE half (nearest-even, saturating at ±65504
/// so a large activation never turns into infinity) into its half copy; [`Phase::Unpack`] widens it back.
fn convert_half(plan: &Plan, eo: Eo, a: &mut [u8], ins: &Instr) -> Result<(), ExecError> {
    let bad = ExecError::BadPlan("a pack/unpack names a tensor without a half copy in the arena");
    let x = ins.packed().ok_or(bad.clone())?;
    let h = plan.graph.half_of(x).ok_or(bad.clone())?;
    let (xr, hr) = (
        plan.region_at(x, eo).ok_or(bad.clone())?,
        plan.region_at(h, eo).ok_or(bad)?,
    );
    let elems = (xr.1 / 4).min(hr.1 / 2);
    let [xb, hb] = carve(a, [(xr.0, elems * 4), (hr.0, elems * 2)])?;
    if ins.phase == Phase::Pack {
        for (v, o) in xb.chunks_exact(4).zip(hb.chunks_exact_mut(2)) {
            let v = f32::from_le_bytes([v[0], v[1], v[2], v[3]]).clamp(-65504.0, 65504.0);
            o.copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
        }
    } else {
        for (v, o) in hb.chunks_exact(2).zip(xb.chunks_exact_mut(4)) {
            let v = half::f16::from_bits(u16::from_le_bytes([v[0], v[1]])).to_f32();
            o.copy_from_slice(&v.to_le_bytes());
        }
    }
    Ok(())
}

/// The input slice of a node: from the arena, or the host's batch for the model input.
fn input<'a>(
    plan: &Plan,
    t: TensorId,
    buf: &'a mut [u8],
    xext: &'a [f32],
    elems: usize,
) -> Result<&'a [f32], ExecError> {
    if is_ext(plan, t) {
        xext.get(..elems).ok_or(ExecError::BadBatch(
            "input shorter than the model input",
            xext.len(),
        ))
    } else {
        Ok(f32s(buf)?)
    }
}

#[cfg(feature = "seq")]
/// The model input's token ids for an embedding, checked (an id that is not an integer below `vocab`
/// is a typed error, never an index out of bounds).
fn token_ids(xext: &[f32], elems: usize, vocab: usize) -> Result<&[f32], ExecError> {
    let ids = xext.get(..elems).ok_or(ExecError::BadBatch(
        "input shorter than the model input",
        xext.len(),
    ))?;
    ops::seq::check_ids(ids, vocab).map_err(|(i, _)| {
        ExecError::BadBatch("token id is not an integer below the vocabulary size", i)
    })?;
    Ok(ids)
}

#[cfg(feature = "seq")]
/// A norm's saved tensors: (mean — LayerNorm only, rstd).
fn norm_saved(node: &Node, rms: bool) -> (Option<TensorId>, Option<TensorId>) {
    if rms {
        (None, node.saved.first().copied())
    } else {
        (node.saved.first().copied(), node.saved.get(1).copied())
    }
}

#[cfg(feature = "seq")]
/// A LoRA Linear's parameters: base weight, base bias, adapters A and B with their gradients.
struct LoraParams {
    w: TensorId,
    b: Option<TensorId>,
    a: TensorId,
    bm: TensorId,
    da: Option<TensorId>,
    dbm: Option<TensorId>,
}

#[cfg(feature = "seq")]
fn lora_params(node: &Node) -> Result<LoraParams, ExecError> {
    let bad = ExecError::BadPlan("a LoRA layer without its base weight and adapters");
    let p = &node.params;
    let (w, b, a, bm) = match p.as_slice() {
        [w, a, bm] => (w, None, a, bm),
        [w, b, a, bm] => (w, Some(b.value), a, bm),
        _ => return Err(bad),
    };
    Ok(LoraParams {
        w: w.value,
        b,
        a: a.value,
        bm: bm.value,
        da: a.grad,
        dbm: bm.grad,
    })
}

/// Why a recurrent layer's whole-layer forward or derivative instruction is refused.
#[cfg(feature = "seq")]
const RNN_STEPS: &str = "a recurrent layer runs as one instruction per time step (StepFwd/StepBwd)";

/// One time step of a recurrent layer: [`Phase::StepFwd`] (forward step `cx.ins.step`) or
/// [`Phase::StepBwd`] (its backward through time). Each step reads and writes its own saved tensors
/// (`{name}.t{t}.gates`, `.state`; the LSTM's previous cell), rows of the whole-sequence input, output
/// and derivatives, and the backward's carried derivatives (`{name}.dcarry`).
#[cfg(feature = "seq")]
fn rnn_step(
    cx: &Cx<'_>,
    a: &mut [u8],
    node: &Node,
    g: &ops::rnn::RnnGeom,
) -> Result<(), ExecError> {
    let (plan, eo, n, t) = (cx.plan, cx.eo, cx.n, cx.ins.step);
    let b = node.bptt.ok_or(ExecError::BadPlan(
        "a recurrent layer without its time steps",
    ))?;
    if t >= b.steps {
        return Err(ExecError::BadPlan("a time step beyond the sequence"));
    }
    let (gate_elems, state_elems) = (n * g.gate_width(), n * g.hidden);
    let in_elems = n * node.in_dims[0].numel();
    let out_elems = n * node.out_dims.numel();
    // The LSTM's previous cell (forward: c_{t−1}; backward: df reads it).
    let prev = (t > 0 && g.cell == ops::rnn::Cell::Lstm).then(|| b.state(t - 1));
    let w = node.params.first().map(|p| p.value);
    let tu = usize::from(t);
    match cx.ins.phase {
        Phase::StepFwd => {
            let xin = node.inputs[0];
            let [xb, wb, bb, gb, pb, stb, yb, rb, sb] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems)?,
                    whole(plan, eo, w)?,
                    whole(plan, eo, node.params.get(1).map(|p| p.value))?,
                    reg(plan, eo, Some(b.gates(t)), gate_elems)?,
                    reg(plan, eo, prev, state_elems)?,
                    reg(plan, eo, Some(b.state(t)), state_elems)?,
                    reg(plan, eo, Some(node.out), out_elems)?,
                    reg(plan, eo, b.r, out_elems)?,
                    whole(plan, eo, node.scratch[scratch_slot::FWD])?,
                ],
            )?;
            let x = input(plan, xin, xb, cx.x, in_elems)?;
            ops::rnn::rnn_fwd_step(
                g,
                n,
                tu,
                x,
                f32s(wb)?,
                f32s(bb)?,
                f32s(gb)?,
                f32s(pb)?,
                f32s(stb)?,
                f32s(yb)?,
                f32s(rb)?,
                f32s(sb)?,
            );
        }
        Phase::StepBwd => {
            let (dy, dx, acc) = derivatives(node)?;
            if acc {
                return Err(ExecError::BadPlan(
                    "a recurrent layer's input derivative is shared",
                ));
            }
            let y = (g.cell == ops::rnn::Cell::Gru).then_some(node.out);
            let [dyb, wb, gb, pb, stb, yb, dxb, cb, sb] = carve(
                a,
                [
                    reg(plan, eo, Some(dy), out_elems)?,
                    whole(plan, eo, w)?,
                    reg(plan, eo, Some(b.gates(t)), gate_elems)?,
                    reg(plan, eo, prev, state_elems)?,
                    reg(plan, eo, Some(b.state(t)), state_elems)?,
                    reg(plan, eo, y, out_elems)?,
                    reg(plan, eo, need(dx)?, in_elems)?,
                    reg(plan, eo, b.carry, ops::rnn::rnn_carry_len(g, n))?,
                    whole(plan, eo, node.scratch[scratch_slot::GRAD_X])?,
                ],
            )?;
            if b.carry.is_none() {
                return Err(ExecError::BadPlan(
                    "a backward step without its carried derivatives",
                ));
            }
            ops::rnn::rnn_grad_x_step(
                g,
                n,
                tu,
                f32s(dyb)?,
                f32s(wb)?,
                f32s(gb)?,
                f32s(pb)?,
                f32s(stb)?,
                f32s(yb)?,
                f32s(dxb)?,
                f32s(cb)?,
                f32s(sb)?,
            );
        }
        _ => return Err(ExecError::BadPlan(RNN_STEPS)),
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn forward(
    pool: &dyn WorkerPool,
    plan: &Plan,
    eo: Eo,
    a: &mut [u8],
    node: &Node,
    n: usize,
    xext: &[f32],
    mode: Mode,
    rs: RunSeed,
    ro: Ro<'_>,
) -> Result<(), ExecError> {
    let xin = node.inputs[0];
    let in_elems = n * node.in_dims[0].numel();
    let out_elems = n * node.out_dims.numel();
    let body = ro.body;
    // The sequence layers' parameters (their arms read them from the arena).
    #[cfg(feature = "seq")]
    let (w, b, s) = (
        node.params.first().map(|p| p.value),
        node.params.get(1).map(|p| p.value),
        node.scratch[scratch_slot::FWD],
    );
    match &node.op {
        NodeOp::Linear { .. } | NodeOp::Conv(_) => {
            return linear_conv_forward(pool, plan, eo, a, node, n, xext, body);
        }
        NodeOp::MaxPool(g) => {
            let [xb, yb, ib] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems)?,
                    reg(plan, eo, Some(node.out), out_elems)?,
                    reg(plan, eo, node.saved.first().copied(), out_elems)?,
                ],
            )?;
            let x = input(plan, xin, xb, xext, in_elems)?;
            ops::maxpool_fwd(g, n, x, f32s(yb)?, u32s(ib)?);
        }
        NodeOp::AvgPool(g) => {
            let [xb, yb] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems)?,
                    reg(plan, eo, Some(node.out), out_elems)?,
                ],
            )?;
            let x = input(plan, xin, xb, xext, in_elems)?;
            ops::avgpool_fwd(g, n, x, f32s(yb)?);
        }
        NodeOp::GlobalAvgPool { c, hw } => {
            let [xb, yb] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems)?,
                    reg(plan, eo, Some(node.out), out_elems)?,
                ],
            )?;
            let x = input(plan, xin, xb, xext, in_elems)?;
            ops::global_avgpool_fwd(n, *c, *hw, x, f32s(yb)?);
        }
        NodeOp::Act(act) => {
            if same(plan, eo, xin, node.out) {
                let [yb] = carve(a, [reg(plan, eo, Some(node.out), out_elems)?])?;
                let act = *act;
                ops::par_map(pool, f32s(yb)?, &|_, y| ops::act_fwd_inplace(act, y));
            } else {
                let [xb, yb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(xin), in_elems)?,
                        reg(plan, eo, Some(node.out), out_elems)?,
                    ],
                )?;
                let x = input(plan, xin, xb, xext, in_elems)?;
                let act = *act;
                ops::par_map(pool, f32s(yb)?, &|r, y| ops::act_fwd(act, &x[r], y));
            }
        }
        NodeOp::Dropout { p } => {
            let seed = hash2(rs.seed, node.layer as u64);
            let p = if mode == Mode::Eval { 0.0 } else { *p };
            let per = node.out_dims.numel();
            if same(plan, eo, xin, node.out) {
                let [yb] = carve(a, [reg(plan, eo, Some(node.out), out_elems)?])?;
                // One mask per sample, keyed by its index in the whole batch: micro-batching draws the
                // same masks as the whole batch.
                for (s, y) in f32s(yb)?.chunks_exact_mut(per).enumerate() {
                    ops::dropout_fwd_inplace(p, hash2(seed, (rs.start + s) as u64), y);
                }
            } else {
                let [xb, yb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(xin), in_elems)?,
                        reg(plan, eo, Some(node.out), out_elems)?,
                    ],
                )?;
                let x = input(plan, xin, xb, xext, in_elems)?;
                for (s, (x, y)) in x
                    .chunks_exact(per)
                    .zip(f32s(yb)?.chunks_exact_mut(per))
                    .enumerate()
                {
                    ops::dropout_fwd(p, hash2(seed, (rs.start + s) as u64), x, y);
                }
            }
        }
        NodeOp::View => {
            // Same bytes as the input: either merged (nothing to do) or the input is external and the
            // output is external too. A view that could not merge would be a planner bug.
            if !is_ext(plan, node.out) && !same(plan, eo, xin, node.out) {
                return Err(ExecError::BadPlan("a view is not merged with its input"));
            }
        }
        NodeOp::Add => {
            let bin = node.inputs[1];
            if same(plan, eo, xin, node.out) {
                let [yb, bb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(node.out), out_elems)?,
                        reg(plan, eo, Some(bin), in_elems)?,
                    ],
                )?;
                let bx = input(plan, bin, bb, xext, in_elems)?;
                ops::par_map(pool, f32s(yb)?, &|r, y| ops::add_fwd_inplace(y, &bx[r]));
            } else {
                let [ab, bb, yb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(xin), in_elems)?,
                        reg(plan, eo, Some(bin), in_elems)?,
                        reg(plan, eo, Some(node.out), out_elems)?,
                    ],
                )?;
                let ax = input(plan, xin, ab, xext, in_elems)?;
                // Only one input can be the external batch, so a second borrow of `xext` is fine.
                let bx = input(plan, bin, bb, xext, in_elems)?;
                ops::par_map(pool, f32s(yb)?, &|r, y| {
                    ops::add_fwd(&ax[r.clone()], &bx[r], y)
                });
            }
        }
        #[cfg(not(feature = "seq"))]
        NodeOp::Embedding { .. }
        | NodeOp::PosEmbedding { .. }
        | NodeOp::Norm { .. }
        | NodeOp::Smooth(_)
        | NodeOp::Attention(_)
        | NodeOp::Lora(_)
        | NodeOp::Rnn(_) => return Err(NO_SEQ),
        #[cfg(feature = "seq")]
        NodeOp::Embedding { vocab, dim } => {
            let (wr, wro) = param(plan, eo, w, body)?;
            let [tb, yb] = carve(a, [wr, reg(plan, eo, Some(node.out), out_elems)?])?;
            let ids = token_ids(xext, in_elems, *vocab)?;
            ops::seq::embedding_fwd(ids, f32_param(tb, wro)?, *dim, f32s(yb)?);
        }
        #[cfg(feature = "seq")]
        NodeOp::PosEmbedding { per } => {
            let (wr, wro) = param(plan, eo, w, body)?;
            if same(plan, eo, xin, node.out) {
                let [pb, yb] = carve(a, [wr, reg(plan, eo, Some(node.out), out_elems)?])?;
                ops::seq::pos_fwd_inplace(n, *per, f32_param(pb, wro)?, f32s(yb)?);
            } else {
                let [xb, pb, yb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(xin), in_elems)?,
                        wr,
                        reg(plan, eo, Some(node.out), out_elems)?,
                    ],
                )?;
                let x = input(plan, xin, xb, xext, in_elems)?;
                ops::seq::pos_fwd(n, *per, x, f32_param(pb, wro)?, f32s(yb)?);
            }
        }
        #[cfg(feature = "seq")]
        NodeOp::Norm { dim, eps, rms } => {
            let rows = n * node.op.rows_per_sample(node.in_dims[0].numel());
            let (mean, rstd) = norm_saved(node, *rms);
            let (gr, gro) = param(plan, eo, w, body)?;
            let (br, bro) = param(plan, eo, if *rms { None } else { b }, body)?;
            let [xb, gb, bb, yb, mb, rb] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems)?,
                    gr,
                    br,
                    reg(plan, eo, Some(node.out), out_elems)?,
                    reg(plan, eo, mean, rows)?,
                    reg(plan, eo, rstd, rows)?,
                ],
            )?;
            let x = input(plan, xin, xb, xext, in_elems)?;
            ops::seq::norm_fwd(
                rows,
                *dim,
                *eps,
                x,
                f32_param(gb, gro)?,
                match bro {
                    Some(r) => Some(f32_param(bb, Some(r))?),
                    None => opt_f32(bb)?.map(|b| &*b),
                },
                f32s(yb)?,
                opt_f32(mb)?,
                f32s(rb)?,
            );
        }
        #[cfg(feature = "seq")]
        NodeOp::Smooth(k) => {
            let [xb, yb] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems)?,
                    reg(plan, eo, Some(node.out), out_elems)?,
                ],
            )?;
            let x = input(plan, xin, xb, xext, in_elems)?;
            let k = *k;
            ops::par_map(pool, f32s(yb)?, &|r, y| ops::seq::smooth_fwd(k, &x[r], y));
        }
        #[cfg(feature = "seq")]
        NodeOp::Attention(g) => {
            let [xb, pb, yb, sb] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems)?,
                    reg(
                        plan,
                        eo,
                        node.saved.first().copied(),
                        n * g.saved_per_sample(),
                    )?,
                    reg(plan, eo, Some(node.out), out_elems)?,
                    whole(plan, eo, s)?,
                ],
            )?;
            let x = input(plan, xin, xb, xext, in_elems)?;
            ops::seq::attention_fwd(g, n, x, f32s(pb)?, f32s(yb)?, f32s(sb)?);
        }
        #[cfg(feature = "seq")]
        NodeOp::Lora(g) => {
            let rows = n * node.op.rows_per_sample(node.in_dims[0].numel());
            let l = lora_params(node)?;
            let (wr, wro) = param(plan, eo, Some(l.w), body)?;
            let (br, bro) = param(plan, eo, l.b, body)?;
            let [xb, wb, bb, ab, bmb, ub, yb, sb, qb] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems)?,
                    wr,
                    br,
                    whole(plan, eo, Some(l.a))?,
                    whole(plan, eo, Some(l.bm))?,
                    reg(plan, eo, node.saved.first().copied(), rows * g.rank)?,
                    reg(plan, eo, Some(node.out), out_elems)?,
                    whole(plan, eo, s)?,
                    dequant(plan, wro)?,
                ],
            )?;
            let x = input(plan, xin, xb, xext, in_elems)?;
            ops::seq::lora_fwd(
                g,
                rows,
                x,
                values(wb, wro, qb)?,
                match bro {
                    Some(r) => Some(f32_param(bb, Some(r))?),
                    None => opt_f32(bb)?.map(|b| &*b),
                },
                f32s(ab)?,
                f32s(bmb)?,
                f32s(ub)?,
                f32s(yb)?,
                f32s(sb)?,
            );
        }
        // A recurrent layer runs one instruction per time step ([`rnn_step`]).
        #[cfg(feature = "seq")]
        NodeOp::Rnn(_) => return Err(ExecError::BadPlan(RNN_STEPS)),
        NodeOp::BatchNorm { .. } => {
            return bn_forward(plan, eo, a, node, n, xext, mode, body, None);
        }
    }
    Ok(())
}

/// The Linear/Convolution forward, in a frame of its own (as [`bn_forward`]).
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn linear_conv_forward(
    pool: &dyn WorkerPool,
    plan: &Plan,
    eo: Eo,
    a: &mut [u8],
    node: &Node,
    n: usize,
    xext: &[f32],
    body: &[u8],
) -> Result<(), ExecError> {
    let xin = node.inputs[0];
    let in_elems = n * node.in_dims[0].numel();
    let out_elems = n * node.out_dims.numel();
    let w = node.params.first().map(|p| p.value);
    let b = node.params.get(1).map(|p| p.value);
    let s = node.scratch[scratch_slot::FWD];
    match &node.op {
        NodeOp::Linear { .. } | NodeOp::Conv(_) => {
            let (wr, wro) = param(plan, eo, w, body)?;
            let (br, bro) = param(plan, eo, b, body)?;
            let [xb, wb, bb, yb, sb, qb] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems)?,
                    wr,
                    br,
                    reg(plan, eo, Some(node.out), out_elems)?,
                    whole(plan, eo, s)?,
                    dequant(plan, wro)?,
                ],
            )?;
            let x = input(plan, xin, xb, xext, in_elems)?;
            let w = values(wb, wro, qb)?;
            let b = match bro {
                Some(r) => Some(f32_param(bb, Some(r))?),
                None => opt_f32(bb)?.map(|b| &*b),
            };
            let (y, s) = (f32s(yb)?, f32s(sb)?);
            match &node.op {
                NodeOp::Linear { fin, fout } => {
                    let rows = n * node.op.rows_per_sample(node.in_dims[0].numel());
                    ops::linear_fwd_par(pool, rows, *fin, *fout, x, w, b, y, s)
                }
                NodeOp::Conv(g) => ops::conv_fwd_par(pool, g, n, x, w, b, y, s),
                _ => return Err(ExecError::BadPlan("not a linear or convolution layer")),
            }
        }
        _ => return Err(ExecError::BadPlan("not a linear or convolution layer")),
    }
    Ok(())
}

/// The BatchNorm forward (training, recompute, evaluation, in place when frozen): a frame of its own,
/// so its operands (up to four read from the parameter image) never add to the deeper convolution
/// path's stack.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn bn_forward(
    plan: &Plan,
    eo: Eo,
    a: &mut [u8],
    node: &Node,
    n: usize,
    xext: &[f32],
    mode: Mode,
    body: &[u8],
    post: Option<Act>,
) -> Result<(), ExecError> {
    let xin = node.inputs[0];
    let in_elems = n * node.in_dims[0].numel();
    let out_elems = n * node.out_dims.numel();
    let w = node.params.first().map(|p| p.value);
    let b = node.params.get(1).map(|p| p.value);
    match &node.op {
        // A frozen BatchNorm merged in place with its input (the planner's choice).
        NodeOp::BatchNorm {
            c,
            hw,
            eps,
            train: false,
            ..
        } if same(plan, eo, xin, node.out) => {
            let (gr, gro) = param(plan, eo, w, body)?;
            let (br, bro) = param(plan, eo, b, body)?;
            let (mr, mro) = param(plan, eo, node.stats.first().copied(), body)?;
            let (vr, vro) = param(plan, eo, node.stats.get(1).copied(), body)?;
            let [gb, bb, rmb, rvb, yb] = carve(
                a,
                [gr, br, mr, vr, reg(plan, eo, Some(node.out), out_elems)?],
            )?;
            ops::bn_fwd_eval_inplace(
                n,
                *c,
                *hw,
                f32_param(gb, gro)?,
                f32_param(bb, bro)?,
                f32_param(rmb, mro)?,
                f32_param(rvb, vro)?,
                *eps,
                f32s(yb)?,
            );
        }
        NodeOp::BatchNorm {
            c,
            hw,
            eps,
            momentum,
            train,
        } => {
            let (gr, gro) = param(plan, eo, w, body)?;
            let (br, bro) = param(plan, eo, b, body)?;
            // Running statistics are read-only only in evaluation mode (the training forward updates
            // them), so a training BatchNorm always finds them in the arena.
            let (mr, mro) = param(plan, eo, node.stats.first().copied(), body)?;
            let (vr, vro) = param(plan, eo, node.stats.get(1).copied(), body)?;
            let [xb, gb, bb, rmb, rvb, yb, mb, ib] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems)?,
                    gr,
                    br,
                    mr,
                    vr,
                    reg(plan, eo, Some(node.out), out_elems)?,
                    whole(plan, eo, node.saved.first().copied())?,
                    whole(plan, eo, node.saved.get(1).copied())?,
                ],
            )?;
            let x = input(plan, xin, xb, xext, in_elems)?;
            let (gamma, beta) = (f32_param(gb, gro)?, f32_param(bb, bro)?);
            if *train && (mro.is_some() || vro.is_some()) {
                return Err(ExecError::BadPlan(
                    "a training BatchNorm's running statistics are read-only",
                ));
            }
            // The activation applied as the output is written ([`fused_act`]): one monomorphised
            // kernel per activation, so the inner loops stay branch-free.
            macro_rules! with_post {
                ($run:ident) => {
                    match post {
                        None => $run!(|v| v),
                        #[cfg(feature = "std")]
                        Some(Act::Relu) => $run!(ops::relu),
                        #[cfg(feature = "std")]
                        Some(Act::Relu6) => $run!(ops::relu6),
                        Some(_) => return Err(ExecError::BadPlan("no such fused activation")),
                    }
                };
            }
            if *train && mode == Mode::Recompute {
                let (mean, invstd, y) = (f32s(mb)?, f32s(ib)?, f32s(yb)?);
                macro_rules! run {
                    ($post:expr) => {
                        ops::bn_fwd_recompute_then(
                            n, *c, *hw, x, gamma, beta, mean, invstd, y, $post,
                        )
                    };
                }
                with_post!(run);
            } else if *train && mode == Mode::Train {
                let (y, mean, invstd) = (f32s(yb)?, f32s(mb)?, f32s(ib)?);
                let (run_mean, run_var) = (f32s(rmb)?, f32s(rvb)?);
                macro_rules! run {
                    ($post:expr) => {
                        ops::bn_fwd_train_then(
                            n, *c, *hw, x, gamma, beta, y, mean, invstd, run_mean, run_var,
                            *momentum, *eps, $post,
                        )
                    };
                }
                with_post!(run);
            } else {
                ops::bn_fwd_eval(
                    n,
                    *c,
                    *hw,
                    x,
                    gamma,
                    beta,
                    f32_param(rmb, mro)?,
                    f32_param(rvb, vro)?,
                    *eps,
                    f32s(yb)?,
                );
            }
        }
        _ => return Err(ExecError::BadPlan("not a BatchNorm layer")),
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn grad_w(
    pool: &dyn WorkerPool,
    plan: &Plan,
    eo: Eo,
    a: &mut [u8],
    node: &Node,
    n: usize,
    xext: &[f32],
    acc_w: bool,
) -> Result<(), ExecError> {
    let xin = node.inputs[0];
    let in_elems = n * node.in_dims[0].numel();
    let out_elems = n * node.out_dims.numel();
    let dw = node.params.first().and_then(|p| p.grad);
    let db = node.params.get(1).and_then(|p| p.grad);
    // Output channels updated (all but under a sparse update): the gradients' rows.
    let rows = node
        .params
        .iter()
        .find(|p| p.grad.is_some())
        .map_or(0, |p| {
            p.updated / (p.shape.iter().skip(1).product::<usize>().max(1))
        });
    let s = node.scratch[scratch_slot::GRAD_W];
    let dy = node
        .d_out
        .ok_or(ExecError::BadPlan("gradient without an output derivative"))?;
    match &node.op {
        NodeOp::Linear { .. } | NodeOp::Conv(_) => {
            // A bias-only update reads no input (the plan need not have kept it); a Linear after
            // GELU/SiLU reads the activation's input instead of its own ([`Node::act_in`]).
            let x_elems = if dw.is_some() { in_elems } else { 0 };
            let x_t = dw.and(Some(node.act_in.map_or(xin, |a| a.1)));
            let [xb, dyb, dwb, dbb, sb] = carve(
                a,
                [
                    reg(plan, eo, x_t, x_elems)?,
                    reg(plan, eo, Some(dy), out_elems)?,
                    whole(plan, eo, dw)?,
                    whole(plan, eo, db)?,
                    whole(plan, eo, s)?,
                ],
            )?;
            let x = match x_t {
                Some(xin) => input(plan, xin, xb, xext, in_elems)?,
                None => &[],
            };
            let (dy, dw, db, s) = (f32s(dyb)?, opt_f32(dwb)?, opt_f32(dbb)?, f32s(sb)?);
            match (&node.op, node.act_in) {
                #[cfg(feature = "seq")]
                (NodeOp::Linear { fin, fout }, Some((act, _))) => {
                    let m = n * node.op.rows_per_sample(node.in_dims[0].numel());
                    ops::seq::linear_act_grad_w_par(
                        pool, act, m, *fin, *fout, rows, x, dy, dw, db, acc_w, s,
                    )
                }
                #[cfg(not(feature = "seq"))]
                (NodeOp::Linear { .. }, Some(_)) => return Err(NO_SEQ),
                (NodeOp::Linear { fin, fout }, None) => {
                    let m = n * node.op.rows_per_sample(node.in_dims[0].numel());
                    ops::linear_grad_w_rows_par(pool, m, *fin, *fout, rows, x, dy, dw, db, acc_w, s)
                }
                (NodeOp::Conv(g), _) => {
                    ops::conv_grad_w_rows_par(pool, g, n, rows, x, dy, dw, db, acc_w, s)
                }
                _ => return Err(ExecError::BadPlan("not a linear or convolution layer")),
            }
        }
        #[cfg(not(feature = "seq"))]
        NodeOp::Embedding { .. }
        | NodeOp::PosEmbedding { .. }
        | NodeOp::Norm { .. }
        | NodeOp::Lora(_)
        | NodeOp::Rnn(_) => return Err(NO_SEQ),
        #[cfg(feature = "seq")]
        NodeOp::Embedding { vocab, dim } => {
            let [dyb, dwb] = carve(
                a,
                [reg(plan, eo, Some(dy), out_elems)?, whole(plan, eo, dw)?],
            )?;
            let ids = token_ids(xext, in_elems, *vocab)?;
            ops::seq::embedding_grad_w(ids, f32s(dyb)?, *dim, f32s(dwb)?, acc_w);
        }
        #[cfg(feature = "seq")]
        NodeOp::PosEmbedding { per } => {
            let [dyb, dwb] = carve(
                a,
                [reg(plan, eo, Some(dy), out_elems)?, whole(plan, eo, dw)?],
            )?;
            ops::seq::pos_grad_w(n, *per, f32s(dyb)?, f32s(dwb)?, acc_w);
        }
        #[cfg(feature = "seq")]
        NodeOp::Norm { dim, rms, .. } => {
            let rows = n * node.op.rows_per_sample(node.in_dims[0].numel());
            let (mean, rstd) = norm_saved(node, *rms);
            let [xb, dyb, mb, rb, dgb, dbb] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems)?,
                    reg(plan, eo, Some(dy), out_elems)?,
                    reg(plan, eo, mean, rows)?,
                    reg(plan, eo, rstd, rows)?,
                    whole(plan, eo, dw)?,
                    whole(plan, eo, if *rms { None } else { db })?,
                ],
            )?;
            let x = input(plan, xin, xb, xext, in_elems)?;
            ops::seq::norm_grad_w(
                rows,
                *dim,
                x,
                f32s(dyb)?,
                opt_f32(mb)?.map(|m| &*m),
                f32s(rb)?,
                f32s(dgb)?,
                opt_f32(dbb)?,
                acc_w,
            );
        }
        #[cfg(feature = "seq")]
        NodeOp::Lora(g) => {
            let rows = n * node.op.rows_per_sample(node.in_dims[0].numel());
            let l = lora_params(node)?;
            // After GELU/SiLU: the activation's input, recomputed tile by tile ([`Node::act_in`]).
            let xin = node.act_in.map_or(xin, |a| a.1);
            let [xb, ub, dyb, bmb, dab, dbmb, sb] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems)?,
                    reg(plan, eo, node.saved.first().copied(), rows * g.rank)?,
                    reg(plan, eo, Some(dy), out_elems)?,
                    whole(plan, eo, Some(l.bm))?,
                    whole(plan, eo, l.da)?,
                    whole(plan, eo, l.dbm)?,
                    whole(plan, eo, s)?,
                ],
            )?;
            let x = input(plan, xin, xb, xext, in_elems)?;
            ops::seq::lora_act_grad_w(
                g,
                node.act_in.map(|a| a.0),
                rows,
                x,
                f32s(ub)?,
                f32s(dyb)?,
                f32s(bmb)?,
                f32s(dab)?,
                f32s(dbmb)?,
                acc_w,
                f32s(sb)?,
            );
        }
        #[cfg(feature = "seq")]
        NodeOp::Rnn(g) => {
            let dxg = node.d_in.first().copied().flatten().map(|d| d.0);
            // The GRU's reset gates (the LSTM reads none).
            let r = node.bptt.and_then(|b| b.r);
            let [dxb, rb, yb, dwb, dbb, sb] = carve(
                a,
                [
                    reg(plan, eo, dxg, in_elems)?,
                    reg(plan, eo, r, out_elems)?,
                    reg(plan, eo, Some(node.out), out_elems)?,
                    whole(plan, eo, dw)?,
                    whole(plan, eo, db)?,
                    whole(plan, eo, s)?,
                ],
            )?;
            ops::rnn::rnn_grad_w(
                g,
                n,
                f32s(dxb)?,
                f32s(rb)?,
                f32s(yb)?,
                f32s(dwb)?,
                f32s(dbb)?,
                acc_w,
                f32s(sb)?,
            );
        }
        NodeOp::BatchNorm { c, hw, .. } => {
            let [xb, dyb, mb, ib, dgb, dbb] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems)?,
                    reg(plan, eo, Some(dy), out_elems)?,
                    whole(plan, eo, node.saved.first().copied())?,
                    whole(plan, eo, node.saved.get(1).copied())?,
                    // Exactly the updated channels: their count is the slices' length.
                    reg(plan, eo, dw, node.params.first().map_or(0, |p| p.updated))?,
                    reg(plan, eo, db, node.params.get(1).map_or(0, |p| p.updated))?,
                ],
            )?;
            let x = input(plan, xin, xb, xext, in_elems)?;
            ops::bn_grad_w_rows(
                n,
                *c,
                *hw,
                x,
                f32s(dyb)?,
                f32s(mb)?,
                f32s(ib)?,
                opt_f32(dgb)?,
                opt_f32(dbb)?,
                acc_w,
            );
        }
        _ => {
            return Err(ExecError::BadPlan(
                "gradient phase on a layer without parameters",
            ))
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn grad_x(
    pool: &dyn WorkerPool,
    plan: &Plan,
    eo: Eo,
    a: &mut [u8],
    node: &Node,
    n: usize,
    rs: RunSeed,
    ro: Ro<'_>,
) -> Result<(), ExecError> {
    let body = ro.body;
    let in_elems = n * node.in_dims[0].numel();
    let out_elems = n * node.out_dims.numel();
    let (dy, dx, acc) = derivatives(node)?;
    // Every layer but Add (whose inputs are optional one by one) writes its one input derivative.
    let need_dx = || need(dx);
    let w = node.params.first().map(|p| p.value);
    let s = node.scratch[scratch_slot::GRAD_X];
    match &node.op {
        NodeOp::Linear { .. } | NodeOp::Conv(_) => {
            let (wr, wro) = param(plan, eo, w, body)?;
            let [dyb, wb, dxb, sb, qb] = carve(
                a,
                [
                    reg(plan, eo, Some(dy), out_elems)?,
                    wr,
                    reg(plan, eo, need_dx()?, in_elems)?,
                    whole(plan, eo, s)?,
                    dequant(plan, wro)?,
                ],
            )?;
            let w = values(wb, wro, qb)?;
            let (dy, dx, s) = (f32s(dyb)?, f32s(dxb)?, f32s(sb)?);
            match &node.op {
                NodeOp::Linear { fin, fout } => {
                    let rows = n * node.op.rows_per_sample(node.in_dims[0].numel());
                    ops::linear_grad_x_par(pool, rows, *fin, *fout, dy, w, dx, acc, s)
                }
                NodeOp::Conv(g) => ops::conv_grad_x_par(pool, g, n, dy, w, dx, acc, s),
                _ => return Err(ExecError::BadPlan("not a linear or convolution layer")),
            }
        }
        NodeOp::MaxPool(g) => {
            let [dyb, ib, dxb] = carve(
                a,
                [
                    reg(plan, eo, Some(dy), out_elems)?,
                    reg(plan, eo, node.saved.first().copied(), out_elems)?,
                    reg(plan, eo, need_dx()?, in_elems)?,
                ],
            )?;
            ops::maxpool_grad_x(g, n, f32s(dyb)?, u32s(ib)?, f32s(dxb)?, acc);
        }
        NodeOp::AvgPool(g) => {
            let [dyb, dxb] = carve(
                a,
                [
                    reg(plan, eo, Some(dy), out_elems)?,
                    reg(plan, eo, need_dx()?, in_elems)?,
                ],
            )?;
            ops::avgpool_grad_x(g, n, f32s(dyb)?, f32s(dxb)?, acc);
        }
        NodeOp::GlobalAvgPool { c, hw } => {
            let [dyb, dxb] = carve(
                a,
                [
                    reg(plan, eo, Some(dy), out_elems)?,
                    reg(plan, eo, need_dx()?, in_elems)?,
                ],
            )?;
            ops::global_avgpool_grad_x(n, *c, *hw, f32s(dyb)?, f32s(dxb)?, acc);
        }
        NodeOp::Act(act) => {
            let dx = dx.ok_or(ExecError::BadPlan("activation derivative without a target"))?;
            if same(plan, eo, dy, dx) {
                let [yb, db] = carve(
                    a,
                    [
                        reg(plan, eo, Some(node.out), out_elems)?,
                        reg(plan, eo, Some(dx), in_elems)?,
                    ],
                )?;
                let (act, y) = (*act, &*f32s(yb)?);
                ops::par_map(pool, f32s(db)?, &|r, d| {
                    ops::act_grad_inplace(act, &y[r], d)
                });
            } else {
                let [yb, dyb, dxb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(node.out), out_elems)?,
                        reg(plan, eo, Some(dy), out_elems)?,
                        reg(plan, eo, Some(dx), in_elems)?,
                    ],
                )?;
                let (act, y, dy) = (*act, &*f32s(yb)?, &*f32s(dyb)?);
                ops::par_map(pool, f32s(dxb)?, &|r, dx| {
                    ops::act_grad(act, &y[r.clone()], &dy[r], dx, acc)
                });
            }
        }
        NodeOp::Dropout { p } => {
            let dx = dx.ok_or(ExecError::BadPlan("dropout derivative without a target"))?;
            let seed = hash2(rs.seed, node.layer as u64);
            let per = node.out_dims.numel();
            if same(plan, eo, dy, dx) {
                let [db] = carve(a, [reg(plan, eo, Some(dx), in_elems)?])?;
                for (s, d) in f32s(db)?.chunks_exact_mut(per).enumerate() {
                    ops::dropout_grad_inplace(*p, hash2(seed, (rs.start + s) as u64), d);
                }
            } else {
                let [dyb, dxb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(dy), out_elems)?,
                        reg(plan, eo, Some(dx), in_elems)?,
                    ],
                )?;
                for (s, (dy, dx)) in f32s(dyb)?
                    .chunks_exact(per)
                    .zip(f32s(dxb)?.chunks_exact_mut(per))
                    .enumerate()
                {
                    ops::dropout_grad(*p, hash2(seed, (rs.start + s) as u64), dy, dx, acc);
                }
            }
        }
        NodeOp::View => {
            let dx = dx.ok_or(ExecError::BadPlan("view derivative without a target"))?;
            if !same(plan, eo, dy, dx) {
                let [dyb, dxb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(dy), out_elems)?,
                        reg(plan, eo, Some(dx), in_elems)?,
                    ],
                )?;
                ops::copy_or_acc(f32s(dyb)?, f32s(dxb)?, acc);
            }
        }
        NodeOp::Add => {
            let (db_t, acc_b) = match node.d_in.get(1).copied().flatten() {
                Some(d) => (Some(d.0), d.1),
                None => (None, false),
            };
            // Second input first: the first one may be the output derivative itself (in place).
            if let Some(dbt) = db_t {
                let [dyb, dbb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(dy), out_elems)?,
                        reg(plan, eo, Some(dbt), in_elems)?,
                    ],
                )?;
                ops::copy_or_acc(f32s(dyb)?, f32s(dbb)?, acc_b);
            }
            if let Some(dat) = dx {
                if !same(plan, eo, dy, dat) {
                    let [dyb, dab] = carve(
                        a,
                        [
                            reg(plan, eo, Some(dy), out_elems)?,
                            reg(plan, eo, Some(dat), in_elems)?,
                        ],
                    )?;
                    ops::copy_or_acc(f32s(dyb)?, f32s(dab)?, acc);
                }
            }
        }
        #[cfg(not(feature = "seq"))]
        NodeOp::Embedding { .. }
        | NodeOp::PosEmbedding { .. }
        | NodeOp::Norm { .. }
        | NodeOp::Smooth(_)
        | NodeOp::Attention(_)
        | NodeOp::Lora(_)
        | NodeOp::Rnn(_) => return Err(NO_SEQ),
        #[cfg(feature = "seq")]
        NodeOp::Embedding { .. } => {
            return Err(ExecError::BadPlan(
                "an input derivative of an embedding (its input is token ids)",
            ))
        }
        #[cfg(feature = "seq")]
        NodeOp::PosEmbedding { .. } => {
            let dx = dx.ok_or(ExecError::BadPlan("derivative without a target"))?;
            if !same(plan, eo, dy, dx) {
                let [dyb, dxb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(dy), out_elems)?,
                        reg(plan, eo, Some(dx), in_elems)?,
                    ],
                )?;
                ops::copy_or_acc(f32s(dyb)?, f32s(dxb)?, acc);
            }
        }
        #[cfg(feature = "seq")]
        NodeOp::Norm { dim, rms, .. } => {
            let rows = n * node.op.rows_per_sample(node.in_dims[0].numel());
            let (mean, rstd) = norm_saved(node, *rms);
            let (gr, gro) = param(plan, eo, w, body)?;
            let [xb, dyb, gb, mb, rb, dxb] = carve(
                a,
                [
                    reg(plan, eo, Some(node.inputs[0]), in_elems)?,
                    reg(plan, eo, Some(dy), out_elems)?,
                    gr,
                    reg(plan, eo, mean, rows)?,
                    reg(plan, eo, rstd, rows)?,
                    reg(plan, eo, need_dx()?, in_elems)?,
                ],
            )?;
            ops::seq::norm_grad_x(
                rows,
                *dim,
                f32s(xb)?,
                f32s(dyb)?,
                f32_param(gb, gro)?,
                opt_f32(mb)?.map(|m| &*m),
                f32s(rb)?,
                f32s(dxb)?,
                acc,
            );
        }
        #[cfg(feature = "seq")]
        NodeOp::Smooth(k) if dx.is_some_and(|dx| same(plan, eo, dy, dx)) => {
            // In place over dL/d(out) (the plan merged the two: nothing reads it afterwards).
            let [xb, db] = carve(
                a,
                [
                    reg(plan, eo, Some(node.inputs[0]), in_elems)?,
                    reg(plan, eo, dx, in_elems)?,
                ],
            )?;
            let (k, x) = (*k, &*f32s(xb)?);
            ops::par_map(pool, f32s(db)?, &|r, d| {
                ops::seq::smooth_grad_inplace(k, &x[r], d)
            });
        }
        #[cfg(feature = "seq")]
        NodeOp::Smooth(k) => {
            let [xb, dyb, dxb] = carve(
                a,
                [
                    reg(plan, eo, Some(node.inputs[0]), in_elems)?,
                    reg(plan, eo, Some(dy), out_elems)?,
                    reg(plan, eo, need_dx()?, in_elems)?,
                ],
            )?;
            let (k, x, dy) = (*k, &*f32s(xb)?, &*f32s(dyb)?);
            ops::par_map(pool, f32s(dxb)?, &|r, dx| {
                ops::seq::smooth_grad(k, &x[r.clone()], &dy[r], dx, acc)
            });
        }
        #[cfg(feature = "seq")]
        NodeOp::Attention(g) => {
            let [xb, pb, dyb, dxb, sb] = carve(
                a,
                [
                    reg(plan, eo, Some(node.inputs[0]), in_elems)?,
                    reg(
                        plan,
                        eo,
                        node.saved.first().copied(),
                        n * g.saved_per_sample(),
                    )?,
                    reg(plan, eo, Some(dy), out_elems)?,
                    reg(plan, eo, need_dx()?, in_elems)?,
                    whole(plan, eo, s)?,
                ],
            )?;
            ops::seq::attention_grad_x(
                g,
                n,
                f32s(xb)?,
                f32s(pb)?,
                f32s(dyb)?,
                f32s(dxb)?,
                acc,
                f32s(sb)?,
            );
        }
        #[cfg(feature = "seq")]
        NodeOp::Lora(g) => {
            let rows = n * node.op.rows_per_sample(node.in_dims[0].numel());
            let l = lora_params(node)?;
            let (wr, wro) = param(plan, eo, Some(l.w), body)?;
            let [dyb, wb, ab, bmb, dxb, sb, qb] = carve(
                a,
                [
                    reg(plan, eo, Some(dy), out_elems)?,
                    wr,
                    whole(plan, eo, Some(l.a))?,
                    whole(plan, eo, Some(l.bm))?,
                    reg(plan, eo, need_dx()?, in_elems)?,
                    whole(plan, eo, s)?,
                    dequant(plan, wro)?,
                ],
            )?;
            ops::seq::lora_grad_x(
                g,
                rows,
                f32s(dyb)?,
                values(wb, wro, qb)?,
                f32s(ab)?,
                f32s(bmb)?,
                f32s(dxb)?,
                acc,
                f32s(sb)?,
            );
        }
        #[cfg(feature = "seq")]
        NodeOp::Rnn(_) => return Err(ExecError::BadPlan(RNN_STEPS)),
        NodeOp::BatchNorm { .. } => {
            return bn_grad_x(plan, eo, a, node, n, body);
        }
    }
    Ok(())
}

/// The output derivative a node's input-derivative instruction reads, the input derivative it writes
/// (none where its input needs none) and whether it adds to it.
fn derivatives(node: &Node) -> Result<(TensorId, Option<TensorId>, bool), ExecError> {
    let dy = node.d_out.ok_or(ExecError::BadPlan(
        "derivative without an output derivative",
    ))?;
    Ok(match node.d_in.first().copied().flatten() {
        Some(d) => (dy, Some(d.0), d.1),
        None => (dy, None, false),
    })
}

/// `dx` as a written input derivative: an error where the plan gives none.
fn need(dx: Option<TensorId>) -> Result<Option<TensorId>, ExecError> {
    dx.map(Some).ok_or(ExecError::BadPlan(
        "an input derivative of a layer whose input needs none",
    ))
}

/// The BatchNorm input derivative (training, in place, evaluation): a frame of its own, as
/// [`bn_forward`].
#[inline(never)]
fn bn_grad_x(
    plan: &Plan,
    eo: Eo,
    a: &mut [u8],
    node: &Node,
    n: usize,
    body: &[u8],
) -> Result<(), ExecError> {
    let in_elems = n * node.in_dims[0].numel();
    let out_elems = n * node.out_dims.numel();
    let (dy, dx, acc) = derivatives(node)?;
    let need_dx = || need(dx);
    let w = node.params.first().map(|p| p.value);
    match &node.op {
        NodeOp::BatchNorm {
            c, hw, eps, train, ..
        } => {
            let xin = node.inputs[0];
            let (gr, gro) = param(plan, eo, w, body)?;
            if *train && dx.is_some_and(|d| same(plan, eo, dy, d)) {
                let [xb, db, mb, ib, gb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(xin), in_elems)?,
                        reg(plan, eo, Some(dy), out_elems)?,
                        whole(plan, eo, node.saved.first().copied())?,
                        whole(plan, eo, node.saved.get(1).copied())?,
                        gr,
                    ],
                )?;
                ops::bn_grad_x_inplace(
                    n,
                    *c,
                    *hw,
                    f32s(xb)?,
                    f32s(db)?,
                    f32s(mb)?,
                    f32s(ib)?,
                    f32_param(gb, gro)?,
                );
            } else if *train {
                let [xb, dyb, mb, ib, gb, dxb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(xin), in_elems)?,
                        reg(plan, eo, Some(dy), out_elems)?,
                        whole(plan, eo, node.saved.first().copied())?,
                        whole(plan, eo, node.saved.get(1).copied())?,
                        gr,
                        reg(plan, eo, need_dx()?, in_elems)?,
                    ],
                )?;
                ops::bn_grad_x(
                    n,
                    *c,
                    *hw,
                    f32s(xb)?,
                    f32s(dyb)?,
                    f32s(mb)?,
                    f32s(ib)?,
                    f32_param(gb, gro)?,
                    f32s(dxb)?,
                    acc,
                );
            } else {
                let (vr, vro) = param(plan, eo, node.stats.get(1).copied(), body)?;
                let [dyb, gb, rvb, dxb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(dy), out_elems)?,
                        gr,
                        vr,
                        reg(plan, eo, need_dx()?, in_elems)?,
                    ],
                )?;
                ops::bn_grad_x_eval(
                    n,
                    *c,
                    *hw,
                    f32s(dyb)?,
                    f32_param(gb, gro)?,
                    f32_param(rvb, vro)?,
                    *eps,
                    f32s(dxb)?,
                    acc,
                );
            }
        }
        _ => return Err(ExecError::BadPlan("not a BatchNorm layer")),
    }
    Ok(())
}

/// Channels a fused BatchNorm backward takes at most: its parameter gradients are held on the stack
/// (16 KiB) until the kernel has read the activation's output, in whose bytes the plan may place them.
const FUSED_MAX_C: usize = 2048;

/// The ReLU/ReLU6 derivative at `cx` (over `act_node`), the gradient of BatchNorm `bn` (at `w_eo`,
/// if any) and its input derivative in place (at `x_eo`) as one kernel ([`ops::bn_grad_inplace_then`]):
/// each operand carved where the instruction that uses it finds it. The gradients are stored once the
/// kernel is done: only the activation's output may share their bytes (its life ends at `cx`, theirs
/// starts after it; everything else the kernel touches lives on). Returns false, having written
/// nothing, for a BatchNorm of more than [`FUSED_MAX_C`] channels or operands that overlap otherwise
/// (the instructions then run one by one).
#[inline(never)]
fn bn_grad_fused(
    cx: &Cx<'_>,
    a: &mut [u8],
    act_node: &Node,
    act: Act,
    bn: &Node,
    w_eo: Option<Eo>,
    x_eo: Eo,
) -> Result<bool, ExecError> {
    let (plan, eo, n) = (cx.plan, cx.eo, cx.n);
    let NodeOp::BatchNorm { c, hw, .. } = bn.op else {
        return Err(ExecError::BadPlan("not a BatchNorm layer"));
    };
    if c > FUSED_MAX_C {
        return Ok(false);
    }
    let in_elems = n * bn.in_dims[0].numel();
    let out_elems = n * bn.out_dims.numel();
    let xin = bn.inputs[0];
    let (gr, gro) = param(plan, x_eo, bn.params.first().map(|p| p.value), cx.params)?;
    // The gradients where the BatchNorm's gradient instruction writes them (none without one).
    let grads = |k: usize| match w_eo {
        Some(we) => {
            let p = bn.params.get(k);
            reg(plan, we, p.and_then(|p| p.grad), p.map_or(0, |p| p.updated))
        }
        None => Ok((0, 0)),
    };
    let reqs = [
        reg(plan, eo, Some(act_node.out), out_elems)?,
        reg(plan, eo, bn.d_out, out_elems)?,
        reg(plan, x_eo, Some(xin), in_elems)?,
        whole(plan, x_eo, bn.saved.first().copied())?,
        whole(plan, x_eo, bn.saved.get(1).copied())?,
        gr,
    ];
    let (greqs, acc_w) = (
        [grads(0)?, grads(1)?],
        w_eo.and_then(|e| plan.program.get(e as usize))
            .is_some_and(|i| i.mb > 0),
    );
    // The gradients may overlap the activation's output only; checked before anything is written.
    if carve(
        a,
        [
            reqs[1], reqs[2], reqs[3], reqs[4], reqs[5], greqs[0], greqs[1],
        ],
    )
    .is_err()
    {
        return Ok(false);
    }
    let Ok([yb, db, xb, mb, ib, gb]) = carve(a, reqs) else {
        return Ok(false);
    };
    let x = input(plan, xin, xb, cx.x, in_elems)?;
    let (mut sg, mut sb) = ([0f32; FUSED_MAX_C], [0f32; FUSED_MAX_C]);
    let (sg, sb) = (&mut sg[..c], &mut sb[..c]);
    // One monomorphised kernel per activation.
    macro_rules! run {
        ($act:expr) => {
            ops::bn_grad_inplace_then(
                n,
                c,
                hw,
                x,
                f32s(yb)?,
                f32s(db)?,
                f32s(mb)?,
                f32s(ib)?,
                f32_param(gb, gro)?,
                sg,
                sb,
                |y, d| ops::act_grad_one($act, y, d),
            )
        };
    }
    match act {
        Act::Relu => run!(Act::Relu),
        Act::Relu6 => run!(Act::Relu6),
        _ => return Err(ExecError::BadPlan("no such fused activation")),
    }
    // The activation's output is read no more: the gradients may take its bytes now.
    let [dgb, dbb] = carve(a, greqs)?;
    ops::bn_grad_w_store(sg, opt_f32(dgb)?, acc_w);
    ops::bn_grad_w_store(sb, opt_f32(dbb)?, acc_w);
    Ok(true)
}

fn apply(plan: &Plan, eo: Eo, a: &mut [u8], node: &Node, ctx: StepCtx) -> Result<(), ExecError> {
    let opt = &plan.graph.optimizer;
    for p in &node.params {
        let Some(g) = p.grad else { continue };
        // The updated prefix of the value (all of it but under a sparse update).
        let w = Some(p.value);
        match p.state.as_slice() {
            [] => {
                let [wb, gb] = carve(a, [reg(plan, eo, w, p.updated)?, whole(plan, eo, Some(g))?])?;
                optim::apply(opt, ctx, f32s(wb)?, f32s(gb)?, &mut []);
            }
            [s0] => {
                let [wb, gb, s0b] = carve(
                    a,
                    [
                        reg(plan, eo, w, p.updated)?,
                        whole(plan, eo, Some(g))?,
                        whole(plan, eo, Some(*s0))?,
                    ],
                )?;
                optim::apply(opt, ctx, f32s(wb)?, f32s(gb)?, &mut [f32s(s0b)?]);
            }
            [s0, s1] => {
                let [wb, gb, s0b, s1b] = carve(
                    a,
                    [
                        reg(plan, eo, w, p.updated)?,
                        whole(plan, eo, Some(g))?,
                        whole(plan, eo, Some(*s0))?,
                        whole(plan, eo, Some(*s1))?,
                    ],
                )?;
                optim::apply(
                    opt,
                    ctx,
                    f32s(wb)?,
                    f32s(gb)?,
                    &mut [f32s(s0b)?, f32s(s1b)?],
                );
            }
            _ => {
                return Err(ExecError::BadPlan(
                    "more optimizer state slots than any optimizer uses",
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod thread_tests {
    use alloc::vec;
    use alloc::vec::Vec;

    use super::CpuBackend;
    use crate::exec::{Executor, Target};
    use crate::graph::{Graph, GraphOptions};
    use crate::kernels::par::testing::Scoped;
    use crate::plan::tests::random_model;
    use crate::plan::Plan;
    use crate::pool::WorkerPool;

    /// Losses of three steps (each depends on every gradient of the steps before) and the arena's
    /// bytes outside scratch are compared through the losses.
    fn losses<P: WorkerPool>(plan: &Plan, pool: P, n: usize) -> Vec<u32> {
        let mut arena = vec![0u8; plan.needed_bytes()];
        let mut ex = Executor::with_backend(plan, &arena, CpuBackend::with_pool(pool)).unwrap();
        ex.init_params(&mut arena, 4).unwrap();
        let per = plan.graph.input_dims.numel();
        let mut rng = crate::rng::Rng::new(8);
        let x: Vec<f32> = (0..n * per).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let y: Vec<u32> = (0..n).map(|i| (i % 3) as u32).collect();
        (0..3)
            .map(|_| {
                let st = ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
                st.loss.to_bits()
            })
            .collect()
    }

    /// Whole training steps (convolutions, linear layers, activations, adds, pooling) on 2, 3 and 4
    /// workers give the same losses, bit for bit, as one worker, with a plan sized for the workers and
    /// with one sized for a single worker.
    #[test]
    fn threaded_steps_equal_one_thread() {
        let models = [
            random_model(
                &[
                    (0, 2, true),
                    (3, 0, true),
                    (4, 0, true),
                    (0, 1, true),
                    (7, 0, true),
                ],
                2,
                12,
                1,
            ),
            random_model(
                &[
                    (0, 3, true),
                    (1, 0, true),
                    (2, 1, true),
                    (5, 2, true),
                    (6, 0, true),
                    (4, 0, true),
                ],
                3,
                9,
                0,
            ),
        ];
        for spec in &models {
            let batch = 7;
            let one = Plan::new(Graph::new(spec, batch).unwrap());
            let want = losses(&one, crate::pool::SingleThread, batch);
            for t in [2usize, 3, 4] {
                let sized = GraphOptions {
                    threads: t,
                    ..GraphOptions::default()
                };
                let many = Plan::new(Graph::with_options(spec, batch, sized).unwrap());
                assert_eq!(losses(&many, Scoped(t), batch), want, "threads {t}, sized");
                assert_eq!(
                    losses(&one, Scoped(t), batch),
                    want,
                    "threads {t}, one worker's scratch"
                );
            }
        }
    }
}
