//! The GPU backend: whole training steps of a plan in one GPU buffer laid out by the planner.
//!
//! [`gpu_plan`] puts every instruction of a plan on [`Placement::Gpu`] and every storage in
//! [`GPU_SPACE`] at [`GPU_ALIGN`] bytes (the largest storage-binding alignment WebGPU allows): the
//! space's layout *is* the GPU buffer's layout, so the planner's peak is the GPU memory the tensors use,
//! known before the first step. [`GpuBackend`] then runs the plan through frugal-core's executor:
//!
//! - [`Backend::prepare`] (once per plan) creates everything a step needs — the space's buffer, an I/O
//!   buffer (the batch's inputs and targets per micro-batch, the per-sample losses, the step's guard
//!   word), one uniform slot per kernel dispatch of the program, and one bind group per dispatch binding
//!   ranges of those buffers — and refuses, with [`ExecError::Unsupported`], a plan with a layer it has
//!   no kernel for.
//! - A step records every instruction's dispatches into one compute pass and submits it once, in
//!   [`Backend::end_step`], where the losses (and nothing else) are read back. No buffer, bind group or
//!   pipeline is created during a step (`tests/backend.rs` counts them with wgpu's own counters).
//! - The loss is known only after the submission, so a step whose loss is not finite cannot be refused
//!   before its updates the way the CPU does; instead a `guard` kernel, dispatched before the first
//!   update, writes whether any loss value is not finite, and the SGD/Adam kernels then leave weights and
//!   state unchanged. The executor reports [`ExecError::NonFinite`] as for the CPU.
//!
//! Layers: every kind the CPU trains — Linear (the tiled GEMM), convolution (direct kernels: stride,
//! padding, groups), max/average/global-average pooling, ReLU/ReLU6/sigmoid/tanh, views, Add, Dropout
//! (the CPU's counter-based masks, bit for bit), BatchNorm (training, recompute, evaluation, frozen; its
//! statistics block fed by copies between passes); fused softmax cross-entropy and MSE; SGD and Adam.
//! Plain, micro-batched, recomputing and partial batches; fp16 storage (the plan's pack/unpack
//! instructions, WGSL's `pack2x16float`: core WGSL, no `shader-f16` needed). Integer precision is refused
//! when the executor is created.
use std::num::NonZeroU64;

#[cfg(not(target_arch = "wasm32"))]
use frugal_core::backend::Region;
use frugal_core::backend::{
    Backend, Cx, ExecError, LayerOps, LossOps, LossOut, MoveOps, OptimOps, Placement, StepStart,
    Target,
};
use frugal_core::graph::{Node, NodeOp, TensorId, TensorKind};
use frugal_core::model::LossKind;
use frugal_core::ops::Act;
use frugal_core::plan::{Eo, Phase, Plan, SpaceId, LOSS_NODE};

use crate::elementwise::{entry, optim_params, per_workgroup, workgroups, Params};
use crate::{bn, conv, pool, Dims, Gpu, GpuError, Mapping, TILE};

/// Entry points of `pool.wgsl` (the order of `pool::ENTRIES`).
const POOL_MAX_FWD: usize = 0;
const POOL_MAX_GRAD: usize = 1;
const POOL_AVG_FWD: usize = 2;
const POOL_AVG_GRAD: usize = 3;
const POOL_GAP_FWD: usize = 4;
const POOL_GAP_GRAD: usize = 5;

/// The memory space of a GPU plan.
pub const GPU_SPACE: SpaceId = SpaceId(1);
/// Alignment of every storage in it: WebGPU's largest `minStorageBufferOffsetAlignment` (and
/// `minUniformBufferOffsetAlignment`), so a storage can be bound on any adapter.
pub const GPU_ALIGN: usize = 256;
/// Bytes of one uniform slot (one per dispatch).
const SLOT: usize = 256;

/// `plan` run wholly on the GPU: every instruction placed there, every storage in [`GPU_SPACE`].
pub fn gpu_plan(plan: Plan) -> Plan {
    frugal_core::policy::spaces::on_device(plan, GPU_SPACE, GPU_ALIGN, Placement::Gpu)
}

/// An operand of a dispatch, before it is a buffer range.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Opnd {
    /// A tensor of the plan (the model input: the micro-batch's input slot).
    T(TensorId),
    /// The instruction's micro-batch of targets.
    Y,
    /// The instruction's micro-batch's loss values.
    L,
    /// Every micro-batch's loss values.
    LAll,
    /// BatchNorm's statistics rows (`bn.wgsl`'s S: 8 rows of the channels), gathered from and
    /// scattered to the plan's tensors around its kernels.
    Bn,
    /// BatchNorm's parameter-gradient rows ([dγ | dβ]).
    Bn2,
    /// An in-place kernel's output before its copy into place.
    Tmp,
    /// A second read of one tensor, copied here first.
    TmpIn,
    /// The step's guard word.
    Guard,
    /// Nothing (an unused binding).
    Nil,
}

/// The pipeline families (each a WGSL module after `prelude.wgsl`, with its own parameter block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Set {
    Ew,
    Pool,
    Conv,
    Bn,
}

/// Words of a family's parameter block (the largest, convolution's, has 16).
const PARAM_WORDS: usize = 16;

#[derive(Clone, Copy)]
enum Kernel {
    Gemm(Dims),
    Set(Set, usize, [u32; PARAM_WORDS]),
}

fn words<P: bytemuck::Pod>(p: &P) -> [u32; PARAM_WORDS] {
    let mut w = [0u32; PARAM_WORDS];
    let b = bytemuck::bytes_of(p);
    bytemuck::cast_slice_mut::<u32, u8>(&mut w)[..b.len()].copy_from_slice(b);
    w
}

#[derive(Clone, Copy)]
struct Step {
    kernel: Kernel,
    ops: [Opnd; 5],
    /// Workgroups (x, y).
    groups: (u32, u32),
}

/// A copy of `bytes` from `src` at byte `src_off` to `dst` at `dst_off` (between passes: BatchNorm's
/// gathers and scatters).
#[derive(Clone, Copy, Debug)]
struct CopyStep {
    src: Opnd,
    src_off: u64,
    dst: Opnd,
    dst_off: u64,
    bytes: u64,
}

#[derive(Clone, Copy)]
enum Op {
    Dispatch(Step),
    Copy(CopyStep),
}

/// Most dispatches and copies one instruction has (BatchNorm's training forward: 4 gathers, 2
/// kernels, 4 scatters).
const MAX_OPS: usize = 16;

/// The dispatches and copies of one instruction (no allocation).
struct Steps {
    len: usize,
    all: [Option<Op>; MAX_OPS],
}

impl Steps {
    fn new() -> Self {
        Steps {
            len: 0,
            all: [None; MAX_OPS],
        }
    }
    fn push(&mut self, s: Step) -> Result<(), ExecError> {
        self.push_op(Op::Dispatch(s))
    }
    fn push_op(&mut self, s: Op) -> Result<(), ExecError> {
        let slot = self.all.get_mut(self.len).ok_or(ExecError::BadPlan(
            "too many GPU dispatches for one instruction",
        ))?;
        *slot = Some(s);
        self.len += 1;
        Ok(())
    }
    /// Copies `c` values: row `src_row` of `src` (a tensor: its start) to row `dst_row` of `dst`.
    fn copy(
        &mut self,
        src: Opnd,
        src_row: usize,
        dst: Opnd,
        dst_row: usize,
        c: usize,
    ) -> Result<(), ExecError> {
        let row = (c * 4) as u64;
        self.push_op(Op::Copy(CopyStep {
            src,
            src_off: src_row as u64 * row,
            dst,
            dst_off: dst_row as u64 * row,
            bytes: row,
        }))
    }
    fn iter(&self) -> impl Iterator<Item = &Op> {
        self.all[..self.len].iter().flatten()
    }
}

fn u32_of(v: usize) -> Result<u32, ExecError> {
    u32::try_from(v).map_err(|_| ExecError::Unsupported("a dimension beyond 2^32 on the GPU"))
}

fn ew(entry: usize, p: Params, invocations: usize, ops: [Opnd; 5]) -> Result<Step, ExecError> {
    set_step(Set::Ew, entry, &p, invocations, ops)
}

fn bn_step(
    p: &bn::Params,
    entry: usize,
    invocations: usize,
    ops: [Opnd; 5],
) -> Result<Step, ExecError> {
    set_step(Set::Bn, entry, p, invocations, ops)
}

fn set_step<P: bytemuck::Pod>(
    set: Set,
    entry: usize,
    p: &P,
    invocations: usize,
    ops: [Opnd; 5],
) -> Result<Step, ExecError> {
    Ok(Step {
        kernel: Kernel::Set(set, entry, words(p)),
        ops,
        groups: workgroups(u32_of(invocations)?),
    })
}

fn shape_err(e: GpuError) -> ExecError {
    match e {
        GpuError::Shape(_) => ExecError::Unsupported("a dimension beyond 2^32 on the GPU"),
        e => gpu_err(e),
    }
}

/// C (+)= op(A)·op(B) with C m×n.
#[allow(clippy::too_many_arguments)]
fn gemm(
    m: usize,
    n: usize,
    k: usize,
    trans_a: bool,
    trans_b: bool,
    accumulate: bool,
    a: Opnd,
    b: Opnd,
    c: Opnd,
) -> Result<Step, ExecError> {
    let (m, n, k) = (u32_of(m)?, u32_of(n)?, u32_of(k)?);
    Ok(Step {
        kernel: Kernel::Gemm(Dims {
            m,
            n,
            k,
            accumulate: accumulate as u32,
            trans_a: trans_a as u32,
            trans_b: trans_b as u32,
            pad: [0; 2],
        }),
        ops: [a, b, c, Opnd::Nil, Opnd::Nil],
        groups: (n.div_ceil(TILE), m.div_ceil(TILE)),
    })
}

fn act_code(a: Act) -> u32 {
    match a {
        Act::Relu => 0,
        Act::Relu6 => 1,
        Act::Sigmoid => 2,
        Act::Tanh => 3,
    }
}

/// Why a layer cannot run on the GPU backend yet.
fn unsupported(op: &NodeOp) -> Option<&'static str> {
    match op {
        NodeOp::Linear { .. }
        | NodeOp::Act(_)
        | NodeOp::View
        | NodeOp::Add
        | NodeOp::Dropout { .. }
        | NodeOp::Conv(_)
        | NodeOp::MaxPool(_)
        | NodeOp::AvgPool(_)
        | NodeOp::GlobalAvgPool { .. }
        | NodeOp::BatchNorm { .. } => None,
        NodeOp::Embedding { .. }
        | NodeOp::PosEmbedding { .. }
        | NodeOp::Norm { .. }
        | NodeOp::Smooth(_)
        | NodeOp::Attention(_)
        | NodeOp::Lora(_)
        | NodeOp::Rnn(_) => Some(
            "sequence layers (embedding, norms, GELU/SiLU, attention, LoRA, LSTM/GRU) have no GPU kernels yet",
        ),
    }
}

/// What an instruction needs to know of its run (the step loop's [`Cx`] without the borrowed batch).
#[derive(Clone, Copy)]
struct Run {
    eo: Eo,
    n: usize,
    mb: u16,
    t: u32,
    /// Samples the loss's derivative is normalised by (the whole batch).
    norm: usize,
    /// The step's seed, the batch index of the run's first sample, train/eval/recompute (dropout).
    seed: u64,
    start: usize,
    eval: bool,
    recompute: bool,
}

fn node_of(plan: &Plan, node: u16) -> Result<&Node, ExecError> {
    if node == LOSS_NODE {
        return Err(ExecError::BadPlan("loss instruction in the wrong place"));
    }
    plan.graph
        .nodes
        .get(node as usize)
        .ok_or(ExecError::BadPlan("node index out of range"))
}

fn same(plan: &Plan, eo: Eo, a: TensorId, b: TensorId) -> bool {
    matches!((plan.storage_at(a, eo), plan.storage_at(b, eo)), (Some(x), Some(y)) if x == y)
}

fn is_ext(plan: &Plan, t: TensorId) -> bool {
    plan.graph
        .tensors
        .get(t as usize)
        .is_some_and(|x| x.kind == TensorKind::External)
}

/// The dispatches of instruction `r.eo` (not the guard). The same operands for every run of it; the
/// parameters and workgroups follow the run's samples.
/// The dispatches and copies of instruction `r.eo`, no two operands of a dispatch bound to one
/// storage: WebGPU forbids overlapping ranges of one buffer in a dispatch where one of them is writable
/// (and every binding here is read_write, see `prelude.wgsl`). An in-place kernel (dx = dy, an
/// activation over its own input, the loss's derivative over the logits) writes into `Tmp` and a copy
/// puts the result in place; a tensor read twice (x + x) is read once from `TmpIn`, copied there first.
fn steps_of(plan: &Plan, r: Run) -> Result<Steps, ExecError> {
    let raw = raw_steps(plan, r)?;
    let storage = |o: Opnd| match o {
        Opnd::T(t) if !is_ext(plan, t) => plan.storage_at(t, r.eo),
        _ => None,
    };
    let bytes = |o: Opnd| -> Result<u64, ExecError> {
        let s = storage(o).ok_or(ExecError::BadPlan("a redirected operand without storage"))?;
        Ok(plan.lives[s].bytes as u64)
    };
    let mut out = Steps::new();
    for op in raw.iter() {
        let mut st = match *op {
            Op::Copy(c) => {
                out.push_op(Op::Copy(c))?;
                continue;
            }
            Op::Dispatch(st) => st,
        };
        let used = match st.kernel {
            Kernel::Gemm(_) => 3,
            Kernel::Set(..) => 5,
        };
        let (mut before, mut after) = (None, None);
        for j in 1..used {
            for i in 0..j {
                let (si, sj) = (storage(st.ops[i]), storage(st.ops[j]));
                if si.is_none() || si != sj {
                    continue;
                }
                if i == 2 || j == 2 {
                    // The written operand (c) goes through Tmp.
                    let target = st.ops[2];
                    if after.is_some() {
                        return Err(ExecError::Unsupported("a kernel writing one tensor twice"));
                    }
                    after = Some(CopyStep {
                        src: Opnd::Tmp,
                        src_off: 0,
                        dst: target,
                        dst_off: 0,
                        bytes: bytes(target)?,
                    });
                    st.ops[2] = Opnd::Tmp;
                } else {
                    let source = st.ops[j];
                    if before.is_some() {
                        return Err(ExecError::Unsupported("a kernel reading one tensor thrice"));
                    }
                    before = Some(CopyStep {
                        src: source,
                        src_off: 0,
                        dst: Opnd::TmpIn,
                        dst_off: 0,
                        bytes: bytes(source)?,
                    });
                    st.ops[j] = Opnd::TmpIn;
                }
            }
        }
        if let Some(c) = before {
            out.push_op(Op::Copy(c))?;
        }
        out.push(st)?;
        if let Some(c) = after {
            out.push_op(Op::Copy(c))?;
        }
    }
    Ok(out)
}

/// Tensor `k` of `list` as an operand (`what` names the list when it is short).
fn nth(list: &[TensorId], k: usize, what: &'static str) -> Result<Opnd, ExecError> {
    list.get(k)
        .copied()
        .map(Opnd::T)
        .ok_or(ExecError::BadPlan(what))
}

/// BatchNorm's saved statistic `k` (0 batch mean, 1 inverse deviation).
fn bn_saved(node: &Node, k: usize) -> Result<Opnd, ExecError> {
    nth(&node.saved, k, "BatchNorm without saved statistics")
}

/// BatchNorm's running statistic `k` (0 mean, 1 variance).
fn bn_stat(node: &Node, k: usize) -> Result<Opnd, ExecError> {
    nth(&node.stats, k, "BatchNorm without running statistics")
}

/// The dispatches and copies of instruction `r.eo` as the kernels want them (see [`steps_of`]).
fn raw_steps(plan: &Plan, r: Run) -> Result<Steps, ExecError> {
    let mut out = Steps::new();
    let ins = plan
        .program
        .get(r.eo as usize)
        .ok_or(ExecError::BadPlan("execution order out of range"))?;
    let n = r.n;
    let nil = Opnd::Nil;
    use Opnd::T;
    if ins.phase == Phase::Loss {
        let g = &plan.graph;
        let outs = g.pred_dims().numel();
        let (pred, dp) = (T(g.pred()), T(g.d_pred));
        let step = match g.loss {
            LossKind::SoftmaxCrossEntropy => ew(
                entry::SOFTMAX_CE,
                Params {
                    n: u32_of(n)?,
                    classes: u32_of(outs)?,
                    // The derivative's divisor: the whole batch (micro-batches sum to its gradient).
                    kind: u32_of(r.norm)?,
                    ..Default::default()
                },
                n,
                [pred, Opnd::Y, dp, Opnd::L, nil],
            )?,
            LossKind::Mse => ew(
                entry::MSE,
                Params {
                    n: u32_of(n * outs)?,
                    lr: (2.0 / (r.norm * outs) as f64) as f32,
                    ..Default::default()
                },
                n * outs,
                [pred, Opnd::Y, dp, Opnd::L, nil],
            )?,
        };
        out.push(step)?;
        return Ok(out);
    }
    if let Some(x) = ins.packed() {
        // fp16 storage: the activation's IEEE-half copy, two values per word (`pack_half`).
        let bad = ExecError::BadPlan("a pack/unpack names a tensor without a half copy");
        let h = plan.graph.half_of(x).ok_or(bad.clone())?;
        let elems = (tensor_bytes(plan, x)? / 4).min(tensor_bytes(plan, h)? / 2);
        let p = Params {
            n: u32_of(elems)?,
            ..Default::default()
        };
        let (entry, ops) = if ins.phase == Phase::Pack {
            (entry::PACK_HALF, [T(x), nil, T(h), nil, nil])
        } else {
            (entry::UNPACK_HALF, [T(h), nil, T(x), nil, nil])
        };
        out.push(ew(entry, p, elems.div_ceil(2), ops)?)?;
        return Ok(out);
    }
    let node = node_of(plan, ins.node)?;
    if let Some(why) = unsupported(&node.op) {
        return Err(ExecError::Unsupported(why));
    }
    let xin = node.inputs[0];
    let in_elems = n * node.in_dims[0].numel();
    let out_elems = n * node.out_dims.numel();
    let w = node.params.first().map(|p| p.value);
    let b = node.params.get(1).map(|p| p.value);
    let d_in = |k: usize| node.d_in.get(k).copied().flatten();
    let need = |what| ExecError::BadPlan(what);
    match (ins.phase, &node.op) {
        (Phase::Forward | Phase::Recompute, NodeOp::Linear { fin, fout }) => {
            let w = T(w.ok_or(need("a linear layer without weights"))?);
            if let Some(b) = b {
                // As the CPU: the bias in every row first, the product accumulated onto it.
                let p = Params {
                    n: u32_of(out_elems)?,
                    classes: u32_of(*fout)?,
                    ..Default::default()
                };
                out.push(ew(
                    entry::BIAS_ROWS,
                    p,
                    out_elems,
                    [T(b), nil, T(node.out), nil, nil],
                )?)?;
            }
            out.push(gemm(
                n,
                *fout,
                *fin,
                false,
                true,
                b.is_some(),
                T(xin),
                w,
                T(node.out),
            )?)?;
        }
        (Phase::Forward | Phase::Recompute, NodeOp::Act(a)) => {
            let p = Params {
                n: u32_of(out_elems)?,
                kind: act_code(*a),
                ..Default::default()
            };
            out.push(ew(
                entry::ACT_FWD,
                p,
                out_elems,
                [T(xin), nil, T(node.out), nil, nil],
            )?)?;
        }
        (Phase::Forward | Phase::Recompute, NodeOp::View) => {
            if !is_ext(plan, node.out) && !same(plan, r.eo, xin, node.out) {
                return Err(ExecError::BadPlan("a view is not merged with its input"));
            }
        }
        (Phase::Forward | Phase::Recompute, NodeOp::Conv(g)) => {
            let w = T(w.ok_or(need("a convolution without weights"))?);
            let p = conv::direct_params(g, n, b.is_some(), false).map_err(shape_err)?;
            let bias = b.map_or(nil, T);
            out.push(set_step(
                Set::Conv,
                conv::entry::FWD,
                &p,
                out_elems,
                [T(xin), w, T(node.out), bias, nil],
            )?)?;
        }
        (Phase::Forward | Phase::Recompute, NodeOp::MaxPool(g)) => {
            let arg = node
                .saved
                .first()
                .copied()
                .ok_or(need("max pooling without its saved argmax"))?;
            let p = pool::params(g, n, false).map_err(shape_err)?;
            out.push(set_step(
                Set::Pool,
                POOL_MAX_FWD,
                &p,
                out_elems,
                [T(xin), nil, T(node.out), T(arg), nil],
            )?)?;
        }
        (Phase::Forward | Phase::Recompute, NodeOp::AvgPool(g)) => {
            let p = pool::params(g, n, false).map_err(shape_err)?;
            out.push(set_step(
                Set::Pool,
                POOL_AVG_FWD,
                &p,
                out_elems,
                [T(xin), nil, T(node.out), nil, nil],
            )?)?;
        }
        (Phase::Forward | Phase::Recompute, NodeOp::GlobalAvgPool { c, hw }) => {
            let p = pool::gap_params(n * c, *hw, false).map_err(shape_err)?;
            out.push(set_step(
                Set::Pool,
                POOL_GAP_FWD,
                &p,
                n * c,
                [T(xin), nil, T(node.out), nil, nil],
            )?)?;
        }
        (
            Phase::Forward | Phase::Recompute,
            &NodeOp::BatchNorm {
                c,
                hw,
                eps,
                momentum,
                train,
            },
        ) => {
            let g = T(w.ok_or(need("BatchNorm without γ"))?);
            let be = T(b.ok_or(need("BatchNorm without β"))?);
            let stat = |k: usize| bn_stat(node, k);
            let saved = |k: usize| bn_saved(node, k);
            let (rm, rv) = (stat(0)?, stat(1)?);
            let p = bn::params(n, c, hw, false, momentum, eps).map_err(shape_err)?;
            let (x, y, s) = (T(xin), T(node.out), Opnd::Bn);
            if train && !r.eval && !r.recompute {
                for (t, row) in [(g, 2), (be, 3), (rm, 4), (rv, 5)] {
                    out.copy(t, 0, s, row, c)?;
                }
                out.push(bn_step(&p, bn::entry::STATS, per_workgroup(c), [x, nil, nil, s, nil])?)?;
                out.push(bn_step(
                    &p,
                    bn::entry::AFFINE,
                    out_elems,
                    [x, nil, y, s, nil],
                )?)?;
                for (row, t) in [(0, saved(0)?), (1, saved(1)?), (4, rm), (5, rv)] {
                    out.copy(s, row, t, 0, c)?;
                }
            } else if train && r.recompute {
                for (t, row) in [(saved(0)?, 0), (saved(1)?, 1), (g, 2), (be, 3)] {
                    out.copy(t, 0, s, row, c)?;
                }
                out.push(bn_step(
                    &p,
                    bn::entry::AFFINE,
                    out_elems,
                    [x, nil, y, s, nil],
                )?)?;
            } else {
                for (t, row) in [(g, 2), (be, 3), (rm, 4), (rv, 5)] {
                    out.copy(t, 0, s, row, c)?;
                }
                out.push(bn_step(
                    &p,
                    bn::entry::EVAL_FWD,
                    out_elems,
                    [x, nil, y, s, nil],
                )?)?;
            }
        }
        (Phase::Forward | Phase::Recompute, NodeOp::Dropout { p }) => {
            let params = dropout_params(node, *p, r, out_elems, false)?;
            out.push(ew(
                entry::DROPOUT_ROWS,
                params,
                out_elems,
                [T(xin), nil, T(node.out), nil, nil],
            )?)?;
        }
        (Phase::Forward | Phase::Recompute, NodeOp::Add) => {
            let p = Params {
                n: u32_of(out_elems)?,
                ..Default::default()
            };
            out.push(ew(
                entry::ADD,
                p,
                out_elems,
                [T(xin), T(node.inputs[1]), T(node.out), nil, nil],
            )?)?;
        }
        (Phase::GradW, NodeOp::Linear { fin, fout }) => {
            let dy = T(node
                .d_out
                .ok_or(need("gradient without an output derivative"))?);
            let acc = r.mb > 0;
            if let Some(dw) = node.params.first().and_then(|p| p.grad) {
                out.push(gemm(*fout, *fin, n, true, false, acc, dy, T(xin), T(dw))?)?;
            }
            if let Some(db) = node.params.get(1).and_then(|p| p.grad) {
                let p = Params {
                    n: u32_of(*fout)?,
                    kind: u32_of(n)?,
                    accumulate: acc as u32,
                    ..Default::default()
                };
                out.push(ew(entry::COL_SUM, p, *fout, [dy, nil, T(db), nil, nil])?)?;
            }
        }
        (Phase::GradW, NodeOp::Conv(g)) => {
            let dy = T(node
                .d_out
                .ok_or(need("gradient without an output derivative"))?);
            let acc = r.mb > 0;
            let db = node.params.get(1).and_then(|p| p.grad);
            if let Some(dw) = node.params.first().and_then(|p| p.grad) {
                // One dispatch: the weights' workgroups, then (with a bias) the bias's.
                let p = conv::direct_params(g, n, db.is_some(), acc).map_err(shape_err)?;
                let bias = if db.is_some() { g.cout } else { 0 };
                out.push(set_step(
                    Set::Conv,
                    conv::entry::DW,
                    &p,
                    per_workgroup(g.weight_len() + bias),
                    [dy, T(xin), T(dw), db.map_or(nil, T), nil],
                )?)?;
            } else if let Some(db) = db {
                let p = conv::direct_params(g, n, false, acc).map_err(shape_err)?;
                out.push(set_step(
                    Set::Conv,
                    conv::entry::DB,
                    &p,
                    per_workgroup(g.cout),
                    [dy, nil, T(db), nil, nil],
                )?)?;
            }
        }
        (Phase::GradW, &NodeOp::BatchNorm { c, hw, train, .. }) => {
            if !train {
                return Err(ExecError::Unsupported(
                    "trainable γ and β of a BatchNorm in evaluation mode on the GPU",
                ));
            }
            let dy = T(node
                .d_out
                .ok_or(need("gradient without an output derivative"))?);
            let grad = |k: usize| {
                node.params
                    .get(k)
                    .and_then(|p| p.grad)
                    .map(T)
                    .ok_or(need("BatchNorm's γ and β train together"))
            };
            let saved = |k: usize| bn_saved(node, k);
            let (dg, db) = (grad(0)?, grad(1)?);
            let acc = r.mb > 0;
            let p = bn::params(n, c, hw, acc, 0.0, 0.0).map_err(shape_err)?;
            let s = Opnd::Bn;
            out.copy(saved(0)?, 0, s, 0, c)?;
            out.copy(saved(1)?, 0, s, 1, c)?;
            if acc {
                out.copy(dg, 0, Opnd::Bn2, 0, c)?;
                out.copy(db, 0, Opnd::Bn2, 1, c)?;
            }
            out.push(bn_step(&p, bn::entry::SUMS, per_workgroup(c), [T(xin), dy, nil, s, nil])?)?;
            out.push(bn_step(
                &p,
                bn::entry::DPARAMS,
                c,
                [nil, nil, Opnd::Bn2, s, nil],
            )?)?;
            out.copy(Opnd::Bn2, 0, dg, 0, c)?;
            out.copy(Opnd::Bn2, 1, db, 0, c)?;
        }
        (Phase::GradW, _) => {
            return Err(ExecError::BadPlan(
                "gradient phase on a layer without parameters",
            ))
        }
        (Phase::GradX, op) => {
            let dy = node
                .d_out
                .ok_or(need("derivative without an output derivative"))?;
            let copy = |from: TensorId, to: TensorId, acc: bool| {
                let p = Params {
                    n: u32_of(in_elems)?,
                    accumulate: acc as u32,
                    ..Default::default()
                };
                ew(entry::COPY, p, in_elems, [T(from), nil, T(to), nil, nil])
            };
            match op {
                NodeOp::Linear { fin, fout } => {
                    let (dx, acc) = d_in(0).ok_or(need(
                        "an input derivative of a layer whose input needs none",
                    ))?;
                    let w = T(w.ok_or(need("a linear layer without weights"))?);
                    out.push(gemm(n, *fin, *fout, false, false, acc, T(dy), w, T(dx))?)?;
                }
                NodeOp::Conv(g) => {
                    let (dx, acc) = d_in(0).ok_or(need(
                        "an input derivative of a layer whose input needs none",
                    ))?;
                    let w = T(w.ok_or(need("a convolution without weights"))?);
                    let p = conv::direct_params(g, n, false, acc).map_err(shape_err)?;
                    out.push(set_step(
                        Set::Conv,
                        conv::entry::DX,
                        &p,
                        in_elems,
                        [T(dy), w, T(dx), nil, nil],
                    )?)?;
                }
                NodeOp::MaxPool(g) => {
                    let (dx, acc) = d_in(0).ok_or(need(
                        "an input derivative of a layer whose input needs none",
                    ))?;
                    let arg = node
                        .saved
                        .first()
                        .copied()
                        .ok_or(need("max pooling without its saved argmax"))?;
                    let p = pool::params(g, n, acc).map_err(shape_err)?;
                    out.push(set_step(
                        Set::Pool,
                        POOL_MAX_GRAD,
                        &p,
                        in_elems,
                        [T(dy), T(arg), T(dx), nil, nil],
                    )?)?;
                }
                NodeOp::AvgPool(g) => {
                    let (dx, acc) = d_in(0).ok_or(need(
                        "an input derivative of a layer whose input needs none",
                    ))?;
                    let p = pool::params(g, n, acc).map_err(shape_err)?;
                    out.push(set_step(
                        Set::Pool,
                        POOL_AVG_GRAD,
                        &p,
                        in_elems,
                        [T(dy), nil, T(dx), nil, nil],
                    )?)?;
                }
                NodeOp::GlobalAvgPool { c, hw } => {
                    let (dx, acc) = d_in(0).ok_or(need(
                        "an input derivative of a layer whose input needs none",
                    ))?;
                    let p = pool::gap_params(n * c, *hw, acc).map_err(shape_err)?;
                    out.push(set_step(
                        Set::Pool,
                        POOL_GAP_GRAD,
                        &p,
                        in_elems,
                        [T(dy), nil, T(dx), nil, nil],
                    )?)?;
                }
                &NodeOp::BatchNorm {
                    c, hw, eps, train, ..
                } => {
                    let (dx, acc) = d_in(0).ok_or(need(
                        "an input derivative of a layer whose input needs none",
                    ))?;
                    let g = T(w.ok_or(need("BatchNorm without γ"))?);
                    let s = Opnd::Bn;
                    // In place (dx = dy) the CPU overwrites.
                    let acc = acc && !same(plan, r.eo, dy, dx);
                    let p = bn::params(n, c, hw, acc, 0.0, eps).map_err(shape_err)?;
                    if train {
                        let saved = |k: usize| bn_saved(node, k);
                        out.copy(saved(0)?, 0, s, 0, c)?;
                        out.copy(saved(1)?, 0, s, 1, c)?;
                        out.copy(g, 0, s, 2, c)?;
                        let ops = [T(xin), T(dy), nil, s, nil];
                        out.push(bn_step(&p, bn::entry::SUMS, per_workgroup(c), ops)?)?;
                        let ops = [T(xin), T(dy), T(dx), s, nil];
                        out.push(bn_step(&p, bn::entry::DX, in_elems, ops)?)?;
                    } else {
                        let rv = bn_stat(node, 1)?;
                        out.copy(g, 0, s, 2, c)?;
                        out.copy(rv, 0, s, 5, c)?;
                        let ops = [T(dy), nil, T(dx), s, nil];
                        out.push(bn_step(&p, bn::entry::EVAL_DX, in_elems, ops)?)?;
                    }
                }
                NodeOp::Act(a) => {
                    let (dx, acc) =
                        d_in(0).ok_or(need("activation derivative without a target"))?;
                    let p = Params {
                        n: u32_of(in_elems)?,
                        kind: act_code(*a),
                        // In place (dx = dy) the CPU overwrites; the kernel reads dy before writing.
                        accumulate: (acc && !same(plan, r.eo, dy, dx)) as u32,
                        ..Default::default()
                    };
                    out.push(ew(
                        entry::ACT_GRAD,
                        p,
                        in_elems,
                        [T(node.out), T(dy), T(dx), nil, nil],
                    )?)?;
                }
                NodeOp::Dropout { p } => {
                    let (dx, acc) = d_in(0).ok_or(need("dropout derivative without a target"))?;
                    // In place (dx = dy) the CPU overwrites.
                    let acc = acc && !same(plan, r.eo, dy, dx);
                    let params = dropout_params(node, *p, r, in_elems, acc)?;
                    out.push(ew(
                        entry::DROPOUT_ROWS,
                        params,
                        in_elems,
                        [T(dy), nil, T(dx), nil, nil],
                    )?)?;
                }
                NodeOp::View => {
                    let (dx, acc) = d_in(0).ok_or(need("view derivative without a target"))?;
                    if !same(plan, r.eo, dy, dx) {
                        out.push(copy(dy, dx, acc)?)?;
                    }
                }
                NodeOp::Add => {
                    if let Some((db, acc)) = d_in(1) {
                        out.push(copy(dy, db, acc)?)?;
                    }
                    if let Some((da, acc)) = d_in(0) {
                        if !same(plan, r.eo, dy, da) {
                            out.push(copy(dy, da, acc)?)?;
                        }
                    }
                }
                op => {
                    return Err(ExecError::Unsupported(
                        unsupported(op).unwrap_or("a layer without a GPU derivative kernel"),
                    ))
                }
            }
        }
        (Phase::Apply, _) => {
            for p in &node.params {
                let Some(g) = p.grad else { continue };
                let len = plan
                    .graph
                    .tensors
                    .get(p.value as usize)
                    .ok_or(need("a parameter outside the graph"))?
                    .bytes
                    / 4;
                let (kernel, params, states) =
                    optim_params(&plan.graph.optimizer, r.t, u32_of(len)?);
                if p.state.len() != states {
                    return Err(need("optimizer state slots differ from the optimizer's"));
                }
                let st = |k: usize| p.state.get(k).map_or(nil, |&s| T(s));
                out.push(ew(
                    kernel,
                    params,
                    len,
                    [T(g), Opnd::Guard, T(p.value), st(0), st(1)],
                )?)?;
            }
        }
        _ => {
            return Err(ExecError::Unsupported(
                "an instruction kind the GPU backend does not run (swaps to a spill store, moves between spaces)",
            ))
        }
    }
    Ok(out)
}

/// Byte offsets of the I/O buffer's sections (each a multiple of [`GPU_ALIGN`]).
#[derive(Clone, Copy, Debug, Default)]
struct IoLayout {
    /// Micro-batches.
    mbs: usize,
    /// Samples per micro-batch.
    mb: usize,
    x_slot: usize,
    y_slot: usize,
    l_slot: usize,
    /// Start of the inputs, targets, losses; the guard word; the unused-binding filler; the end.
    x: usize,
    y: usize,
    l: usize,
    guard: usize,
    nil: usize,
    /// BatchNorm's statistics rows (8 × the most channels) and parameter-gradient rows (2 ×).
    bn: usize,
    bn2: usize,
    /// The in-place kernels' output and the second reads (each the largest redirected storage).
    tmp: usize,
    tmp_in: usize,
    bytes: usize,
}

fn round(v: usize) -> usize {
    v.max(1).div_ceil(GPU_ALIGN) * GPU_ALIGN
}

impl IoLayout {
    /// The layout for `plan` whose redirected operands need `tmp` and `tmp_in` bytes.
    fn of(plan: &Plan, tmp: usize, tmp_in: usize) -> IoLayout {
        let g = &plan.graph;
        let (mbs, mb) = (plan.micro_batches.max(1) as usize, g.batch);
        let per = g.input_dims.numel();
        let outs = g.pred_dims().numel();
        let x_slot = round(mb * per * 4);
        let y_slot = round(mb * outs * 4);
        // Cross-entropy: each sample's loss, then whether it was right; MSE: each squared error.
        let l_slot = round(mb * outs.max(2) * 4);
        let x = 0;
        let y = x + mbs * x_slot;
        let l = y + mbs * y_slot;
        let guard = l + mbs * l_slot;
        let nil = guard + GPU_ALIGN;
        let channels = g
            .nodes
            .iter()
            .map(|n| match n.op {
                NodeOp::BatchNorm { c, .. } => c,
                _ => 0,
            })
            .max()
            .unwrap_or(0);
        // One filler range per binding: WebGPU refuses two writable bindings of one range.
        let bn = nil + 5 * GPU_ALIGN;
        let bn2 = bn + round(8 * channels * 4);
        IoLayout {
            mbs,
            mb,
            x_slot,
            y_slot,
            l_slot,
            x,
            y,
            l,
            guard,
            nil,
            bn,
            bn2,
            tmp: bn2 + round(2 * channels * 4),
            tmp_in: bn2 + round(2 * channels * 4) + round(tmp),
            bytes: bn2 + round(2 * channels * 4) + round(tmp) + round(tmp_in),
        }
    }
}

/// A copy between the space's buffer and the I/O buffer, in bytes.
#[derive(Clone, Copy, Debug)]
struct Resolved {
    src_io: bool,
    src: u64,
    dst_io: bool,
    dst: u64,
    bytes: u64,
}

/// The next pair of timestamp queries for dispatch `what`, if timestamps are on and queries are left.
fn stamp(
    stamps: &mut Option<Stamps>,
    what: (Eo, Stamped, (u32, u32)),
) -> Option<(&wgpu::QuerySet, u32)> {
    let st = stamps.as_mut()?;
    let q = u32::try_from(st.what.len() * 2).ok()?;
    if q + 2 > STAMPS {
        return None;
    }
    st.what.push(what);
    Some((&st.set, q))
}

/// The step's compute pass, opened when none is (a copy closes it).
fn pass_of(prep: &mut Prepared) -> Result<&mut wgpu::ComputePass<'static>, ExecError> {
    if prep.pass.is_none() {
        let enc = prep
            .encoder
            .as_mut()
            .ok_or(ExecError::BadPlan("an instruction outside a step"))?;
        prep.pass = Some(
            enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("step"),
                timestamp_writes: None,
            })
            .forget_lifetime(),
        );
    }
    prep.pass
        .as_mut()
        .ok_or(ExecError::BadPlan("an instruction outside a step"))
}

/// What a prepared plan holds on the GPU.
struct Prepared {
    mem: wgpu::Buffer,
    io: wgpu::Buffer,
    io_layout: IoLayout,
    params: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// One bind group per dispatch (None for a copy), in program order; the guard's is last.
    groups: Vec<Option<wgpu::BindGroup>>,
    /// The copies, resolved (None for a dispatch).
    copies: Vec<Option<Resolved>>,
    /// Bytes bound for A, B and C of each GEMM dispatch (zeros elsewhere): what picks its kernel
    /// (`Gpu::gemm_default`).
    gemm_bytes: Vec<[u64; 3]>,
    /// The first dispatch or copy of each instruction and how many it has, in training and in
    /// evaluation.
    first: Vec<[(u32, u8); 2]>,
    /// The uniform slots' contents for this step (uploaded once, at its end).
    staging: Vec<u8>,
    /// The executing step: its encoder and pass.
    encoder: Option<wgpu::CommandEncoder>,
    pass: Option<wgpu::ComputePass<'static>>,
    /// Samples of the step (0: no step), whether the guard ran, samples of each micro-batch's loss.
    samples: usize,
    guarded: bool,
    loss_n: Vec<usize>,
    /// The losses' mapping in flight (the web: awaited by `GpuBackend::loss`).
    pending: Option<Mapping>,
    /// Loss values a sample leaves in its slot: its loss (cross-entropy, whose slot then holds whether
    /// each sample was right), or its squared errors (MSE).
    loss_per_sample: usize,
    /// The loss kind.
    kind: LossKind,
    /// Where a move to the host lands before it is copied into the arena (a mixed plan's; None when
    /// nothing moves off the GPU; mixed plans run natively only).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    moves: Option<wgpu::Buffer>,
}

/// Bytes a [`GpuBackend`] allocates on the GPU for a plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuBytes {
    /// The plan's GPU space (its tensors): the planner's layout.
    pub space: u64,
    /// Inputs and targets of every micro-batch, per-sample losses, the guard word (256-byte slots).
    pub io: u64,
    /// One 256-byte uniform slot per dispatch of the program, plus the guard's.
    pub params: u64,
    /// The losses' readback copy.
    pub readback: u64,
    /// A mixed plan's landing buffer for moves to the host (its largest such move; 0 for none).
    pub moves: u64,
}

impl GpuBytes {
    /// All of it.
    pub fn total(&self) -> u64 {
        self.space + self.io + self.params + self.readback + self.moves
    }
}

/// frugal's GPU backend over wgpu (see the [module](self) docs).
pub struct GpuBackend {
    gpu: Gpu,
    prep: Option<Prepared>,
    bytes: GpuBytes,
    /// What the prepared plan looked like ([`fingerprint`]).
    fingerprint: Option<u64>,
    /// Whether a plan may place instructions on the CPU (a [`MixedBackend`](crate::MixedBackend)
    /// runs them): only the GPU-placed ones are prepared and recorded here.
    pub(crate) beside_cpu: bool,
    /// Submissions so far (a mixed step submits at every move between host and GPU).
    submits: u64,
    /// Compute dispatches recorded so far (the guard's included), and buffer copies between passes.
    dispatched: u64,
    copied: u64,
    /// Profiling ([`GpuBackend::set_profiling`]): seconds per execution order, summed over steps.
    profile: Option<Vec<f64>>,
    /// Per-dispatch GPU timestamps ([`GpuBackend::set_timestamps`]).
    stamps: Option<Stamps>,
}

/// Queries of the timestamp set: two per dispatch (wgpu's largest query set).
const STAMPS: u32 = wgpu::QUERY_SET_MAX_QUERIES;

/// A timed dispatch's kernel: a GEMM (its dimensions and bound bytes pick the kernel) or a family's
/// entry point.
#[derive(Clone, Copy)]
enum Stamped {
    Gemm(Dims, [u64; 3]),
    Entry(&'static str),
}

/// The step's timestamps: a query before and after each dispatch, resolved at the step's end.
struct Stamps {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
    /// (execution order, kernel, workgroups) of each timed dispatch of the last step, in order.
    what: Vec<(Eo, Stamped, (u32, u32))>,
    /// Queries the last step resolved into `read`.
    resolved: u32,
}

/// One dispatch of a step and its GPU time ([`GpuBackend::timestamps`]).
#[derive(Clone, Debug)]
pub struct DispatchTime {
    /// The instruction: its node, layer kind and phase, e.g. `#3 Conv Backward`.
    pub instruction: String,
    /// The kernel: an entry point of a WGSL family, `sgemm.wgsl`, or a generated GEMM's name.
    pub kernel: String,
    /// Workgroups (x, y).
    pub workgroups: (u32, u32),
    /// Microseconds between the timestamps written before and after it.
    pub micros: f64,
}

fn entry_name(set: Set, e: usize) -> &'static str {
    let names: &[&'static str] = match set {
        Set::Ew => &crate::elementwise::ENTRIES,
        Set::Pool => &pool::ENTRIES,
        Set::Conv => &conv::ENTRIES,
        Set::Bn => &bn::ENTRIES,
    };
    names.get(e).copied().unwrap_or("?")
}

/// A hash of everything `prepare` builds from: the program, the storages' lifetimes, spaces and
/// offsets, the batch and the graph's layer kinds and sizes. Equal for a plan prepared again.
fn fingerprint(plan: &Plan) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |v: u64| {
        h = (h ^ v).wrapping_mul(0x0100_0000_01b3);
    };
    eat(plan.graph.batch as u64);
    eat(plan.micro_batches as u64);
    for i in &plan.program {
        eat(i.node as u64
            | (i.phase as u64) << 16
            | (i.mb as u64) << 24
            | (i.placement as u64) << 40);
    }
    for (l, &o) in plan.lives.iter().zip(&plan.offsets) {
        eat(l.bytes as u64);
        eat(l.first as u64 | (l.last as u64) << 32);
        eat(l.space.0 as u64);
        eat(o as u64);
    }
    for t in &plan.graph.tensors {
        eat(t.bytes as u64);
    }
    for n in &plan.graph.nodes {
        eat(n.inputs.len() as u64);
        eat(n.out as u64);
        eat(n.out_dims.numel() as u64);
        // The layer and its hyper-parameters (geometry, activation, probabilities).
        for b in format!("{:?}", n.op).bytes() {
            eat(b as u64);
        }
    }
    eat(plan.graph.loss as u64);
    for b in format!("{:?}", plan.graph.optimizer).bytes() {
        eat(b as u64);
    }
    h
}

fn gpu_err(e: GpuError) -> ExecError {
    // ExecError carries static text; the adapter's own words go to stderr once.
    eprintln!("frugal-wgpu: {e}");
    ExecError::Unsupported("the GPU failed (see the message above)")
}

impl GpuBackend {
    /// The backend on `gpu`.
    pub fn new(gpu: Gpu) -> GpuBackend {
        GpuBackend {
            gpu,
            prep: None,
            bytes: GpuBytes::default(),
            fingerprint: None,
            beside_cpu: false,
            submits: 0,
            dispatched: 0,
            copied: 0,
            profile: None,
            stamps: None,
        }
    }

    /// Per-dispatch GPU timestamps: with `on`, every dispatch of a step (up to 2,048) is bracketed by
    /// timestamp queries inside the step's pass, resolved and copied at the step's end, and
    /// [`GpuBackend::timestamps`] reads them after the step. Needs a device opened with
    /// `TIMESTAMP_QUERY` and `TIMESTAMP_QUERY_INSIDE_PASSES` ([`Gpu::open_with_features`]); false
    /// (and off) without them. For measuring (`bench_gpu --profile`): it allocates per step.
    pub fn set_timestamps(&mut self, on: bool) -> bool {
        let need = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        if !on || !self.gpu.features().contains(need) {
            self.stamps = None;
            return !on;
        }
        let dev = &self.gpu.device;
        let bytes = STAMPS as u64 * 8;
        let buffer = |label, usage| {
            dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        self.stamps = Some(Stamps {
            set: dev.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("frugal stamps"),
                ty: wgpu::QueryType::Timestamp,
                count: STAMPS,
            }),
            resolve: buffer(
                "frugal stamps",
                wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            ),
            read: buffer(
                "frugal stamps read",
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            ),
            what: Vec::new(),
            resolved: 0,
        });
        true
    }

    /// The last step's dispatches in order with their GPU times (empty without
    /// [`GpuBackend::set_timestamps`]), natively: waits for the GPU.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn timestamps(&mut self, plan: &Plan) -> Result<Vec<DispatchTime>, ExecError> {
        let Some(st) = self.stamps.as_ref() else {
            return Ok(Vec::new());
        };
        if st.resolved == 0 {
            return Ok(Vec::new());
        }
        let slice = st.read.slice(..st.resolved as u64 * 8);
        let mapping = Mapping::start(&slice);
        self.gpu.wait().map_err(gpu_err)?;
        crate::block_on(mapping).map_err(gpu_err)?;
        let ticks: Vec<u64> = {
            let view = slice
                .get_mapped_range()
                .map_err(|e| gpu_err(GpuError::Readback(e.to_string())))?;
            bytemuck::pod_collect_to_vec(&view)
        };
        st.read.unmap();
        let ns = f64::from(self.gpu.queue.get_timestamp_period());
        let mut out = Vec::with_capacity(st.what.len());
        for (i, &(eo, k, groups)) in st.what.iter().enumerate() {
            let (Some(&t0), Some(&t1)) = (ticks.get(2 * i), ticks.get(2 * i + 1)) else {
                break;
            };
            let instruction = match plan.program.get(eo as usize) {
                Some(ins) => {
                    let op = plan
                        .graph
                        .nodes
                        .get(ins.node as usize)
                        .map(|n| format!("{:?}", n.op))
                        .unwrap_or_default();
                    let kind: String = op.chars().take_while(|c| c.is_alphanumeric()).collect();
                    format!("#{} {kind} {:?}", ins.node, ins.phase)
                }
                None => "guard".to_string(),
            };
            let kernel = match k {
                Stamped::Entry(e) => e.to_string(),
                Stamped::Gemm(d, bytes) => self.gpu.gemm_default_name_bound(&d, bytes),
            };
            out.push(DispatchTime {
                instruction,
                kernel,
                workgroups: groups,
                micros: t1.saturating_sub(t0) as f64 * ns / 1e3,
            });
        }
        Ok(out)
    }

    /// Profiling (natively): every instruction is then submitted on its own and waited for, and its
    /// time — the submission's wall time less an empty submission's measured just before — is added
    /// to [`GpuBackend::profile`] at its execution order. Slow: for measuring per-layer costs
    /// (`auto::measure`), never for training.
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(Vec::new);
    }

    /// Seconds per execution order summed over the profiled steps (empty when not profiling).
    pub fn profile(&self) -> &[f64] {
        self.profile.as_deref().unwrap_or(&[])
    }

    /// Records instruction `eo` through `f`, timed when profiling.
    fn timed(
        &mut self,
        eo: Eo,
        f: impl FnOnce(&mut Self) -> Result<(), ExecError>,
    ) -> Result<(), ExecError> {
        #[cfg(not(target_arch = "wasm32"))]
        if self.profile.is_some() {
            let drain = |b: &mut Self| -> Result<std::time::Instant, ExecError> {
                b.flush(None)?;
                b.gpu.wait().map_err(gpu_err)?;
                Ok(std::time::Instant::now())
            };
            let t0 = drain(self)?;
            let t1 = drain(self)?; // an empty submission: the fixed cost
            f(self)?;
            let t2 = drain(self)?;
            let secs = ((t2 - t1).as_secs_f64() - (t1 - t0).as_secs_f64()).max(0.0);
            if let Some(p) = self.profile.as_mut() {
                if p.len() <= eo as usize {
                    p.resize(eo as usize + 1, 0.0);
                }
                p[eo as usize] += secs;
            }
            return Ok(());
        }
        let _ = eo;
        f(self)
    }

    /// Command-buffer submissions so far: one per step for a GPU plan; a mixed plan's step adds one
    /// per move between the host and the GPU.
    pub fn submissions(&self) -> u64 {
        self.submits
    }

    /// Compute dispatches recorded so far, the step's guard included (copies between passes are not
    /// dispatches): their count per step is the number of kernel launches a step costs.
    pub fn dispatches(&self) -> u64 {
        self.dispatched
    }

    /// Buffer copies recorded so far within steps (BatchNorm's gathers and scatters, in-place
    /// kernels' results put in place): each one ends a compute pass.
    pub fn copies(&self) -> u64 {
        self.copied
    }

    /// Submits the work recorded so far in this step (with the uniform slots it uses) and opens a new
    /// encoder for the rest; `then_read` appends a copy of `(offset, bytes)` of the GPU space to the
    /// moves' landing buffer first. A move between host and GPU must see every earlier instruction's
    /// effect on the GPU and none of a later one's.
    #[cfg(not(target_arch = "wasm32"))]
    fn flush(&mut self, then_read: Option<(u64, u64)>) -> Result<(), ExecError> {
        let gpu = &self.gpu;
        let prep = self
            .prep
            .as_mut()
            .ok_or(ExecError::BadPlan("the GPU backend has no prepared plan"))?;
        prep.pass = None; // ends the pass
        let mut enc = prep
            .encoder
            .take()
            .ok_or(ExecError::BadPlan("a move outside a step"))?;
        if let Some((off, bytes)) = then_read {
            let moves = prep.moves.as_ref().ok_or(ExecError::BadPlan(
                "a move to the host the plan did not prepare",
            ))?;
            if bytes > moves.size() {
                return Err(ExecError::BadPlan("a move larger than the plan prepared"));
            }
            enc.copy_buffer_to_buffer(&prep.mem, off, moves, 0, bytes);
        }
        gpu.queue.write_buffer(&prep.params, 0, &prep.staging);
        gpu.queue.submit([enc.finish()]);
        self.submits += 1;
        prep.encoder = Some(
            gpu.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("step"),
                }),
        );
        Ok(())
    }

    /// [`Phase::Move`] between the host arena and the GPU space: the work recorded so far is
    /// submitted first; host to GPU is then a queue write (ordered after that work, before anything
    /// recorded later), GPU to host a copy into the landing buffer, mapped and waited for.
    #[cfg(not(target_arch = "wasm32"))]
    fn move_host_gpu(
        &mut self,
        host: &mut [u8],
        from: Region,
        to: Region,
    ) -> Result<(), ExecError> {
        let outside = ExecError::BadPlan("a move outside the arena");
        let host_range = |r: Region| -> Result<std::ops::Range<usize>, ExecError> {
            let end = r.end().ok_or(outside.clone())?;
            if end > host.len() {
                return Err(outside.clone());
            }
            Ok(r.offset..end)
        };
        let space = self.bytes.space;
        let in_space = |r: Region| -> Result<(), ExecError> {
            match r.end() {
                Some(e)
                    if (e as u64) <= space
                        && r.offset.is_multiple_of(4)
                        && r.bytes.is_multiple_of(4) =>
                {
                    Ok(())
                }
                _ => Err(ExecError::BadPlan("a move outside the GPU space")),
            }
        };
        match (from.space, to.space) {
            (SpaceId::HOST, GPU_SPACE) => {
                let src = host_range(from)?;
                in_space(to)?;
                self.flush(None)?;
                let prep = self.prepared()?;
                let mem = prep.mem.clone();
                self.gpu
                    .queue
                    .write_buffer(&mem, to.offset as u64, &host[src]);
                Ok(())
            }
            (GPU_SPACE, SpaceId::HOST) => {
                let dst = host_range(to)?;
                in_space(from)?;
                let bytes = from.bytes as u64;
                self.flush(Some((from.offset as u64, bytes)))?;
                let gpu = &self.gpu;
                let prep = self
                    .prep
                    .as_mut()
                    .ok_or(ExecError::BadPlan("the GPU backend has no prepared plan"))?;
                let moves = prep.moves.as_ref().ok_or(ExecError::BadPlan(
                    "a move to the host the plan did not prepare",
                ))?;
                let slice = moves.slice(..bytes);
                let mapping = Mapping::start(&slice);
                gpu.wait().map_err(gpu_err)?;
                crate::block_on(mapping).map_err(gpu_err)?;
                {
                    let view = slice
                        .get_mapped_range()
                        .map_err(|e| gpu_err(GpuError::Readback(e.to_string())))?;
                    host[dst].copy_from_slice(&view);
                }
                moves.unmap();
                Ok(())
            }
            (a, _) if a != GPU_SPACE && a != SpaceId::HOST => Err(ExecError::Space(a.0)),
            (_, b) if b != GPU_SPACE && b != SpaceId::HOST => Err(ExecError::Space(b.0)),
            _ => Err(ExecError::BadPlan(
                "a move within one space of a mixed plan",
            )),
        }
    }

    /// Opens the first adapter (see [`Gpu::open`]).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open() -> Result<GpuBackend, GpuError> {
        Gpu::open().map(GpuBackend::new)
    }

    /// [`GpuBackend::open`] as a future (the browser's way).
    pub async fn open_async() -> Result<GpuBackend, GpuError> {
        Gpu::open_async().await.map(GpuBackend::new)
    }

    /// The loss of the step just run, read back once the GPU has run it. On the web a step's
    /// [`Backend::end_step`] cannot wait for the GPU (the mapping completes only once the page's event
    /// loop runs), so the executor's step reports zeros and the host awaits this before the next step;
    /// natively the step already waited, and this returns None. A non-finite loss is
    /// [`ExecError::NonFinite`]: the step's updates were skipped on the GPU (the guard), and the host
    /// should not count the step (`Executor::set_steps`).
    pub async fn loss(&mut self) -> Result<Option<LossOut>, ExecError> {
        let Some(prep) = self.prep.as_mut() else {
            return Ok(None);
        };
        let Some(mapping) = prep.pending.take() else {
            return Ok(None);
        };
        mapping.await.map_err(gpu_err)?;
        let out = totals(prep)?;
        if !(out.sum.is_finite() && out.mean.is_finite()) {
            return Err(ExecError::NonFinite("the loss"));
        }
        Ok(Some(out))
    }

    /// [`GpuBackend::read`] awaiting the GPU (the browser's way).
    pub async fn read_async(&self, plan: &Plan, t: TensorId) -> Result<Vec<f32>, ExecError> {
        let prep = self
            .prep
            .as_ref()
            .ok_or(ExecError::BadPlan("the GPU backend has no prepared plan"))?;
        let (off, _) = range_of(plan, t, 0)?;
        let len = tensor_bytes(plan, t)?;
        self.gpu
            .read_range_async(&prep.mem, off as u64, len / 4)
            .await
            .map_err(gpu_err)
    }

    /// The GPU.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// GPU bytes allocated for the prepared plan.
    pub fn bytes(&self) -> GpuBytes {
        self.bytes
    }

    /// wgpu's own counts of live objects (buffers, bind groups, pipelines) and buffer memory.
    pub fn counters(&self) -> wgpu::InternalCounters {
        self.gpu.device.get_internal_counters()
    }

    fn prepared(&mut self) -> Result<&mut Prepared, ExecError> {
        self.prep
            .as_mut()
            .ok_or(ExecError::BadPlan("the GPU backend has no prepared plan"))
    }

    /// A persistent tensor's values (weights, BatchNorm statistics) read back from the GPU, waiting for
    /// it (natively; on the web use [`GpuBackend::read_async`]).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read(&self, plan: &Plan, t: TensorId) -> Result<Vec<f32>, ExecError> {
        let prep = self
            .prep
            .as_ref()
            .ok_or(ExecError::BadPlan("the GPU backend has no prepared plan"))?;
        let (off, _) = range_of(plan, t, 0)?;
        let len = tensor_bytes(plan, t)?;
        self.gpu
            .read_range(&prep.mem, off as u64, len / 4)
            .map_err(gpu_err)
    }

    /// Overwrites a persistent tensor on the GPU (loading weights); `data` must have its exact length.
    pub fn write(&mut self, plan: &Plan, t: TensorId, data: &[f32]) -> Result<(), ExecError> {
        let (off, _) = range_of(plan, t, 0)?;
        if data.len() * 4 != tensor_bytes(plan, t)? {
            return Err(ExecError::Tensor("length differs from the planned tensor"));
        }
        let prep = self.prepared()?;
        let mem = prep.mem.clone();
        self.gpu
            .queue
            .write_buffer(&mem, off as u64, bytemuck::cast_slice(data));
        Ok(())
    }

    /// Records instruction `r.eo`'s dispatches into the step's pass.
    fn record(&mut self, plan: &Plan, r: Run) -> Result<(), ExecError> {
        let steps = steps_of(plan, r)?;
        let gpu = &self.gpu;
        let prep = self
            .prep
            .as_mut()
            .ok_or(ExecError::BadPlan("the GPU backend has no prepared plan"))?;
        let &(first, count) = prep
            .first
            .get(r.eo as usize)
            .ok_or(ExecError::BadPlan("execution order out of range"))?
            .get(r.eval as usize)
            .ok_or(ExecError::BadPlan("execution order out of range"))?;
        if count as usize != steps.len {
            return Err(ExecError::BadPlan(
                "the instruction differs from its prepared form",
            ));
        }
        let (mut dispatched, mut copied) = (0, 0);
        for (i, op) in steps.iter().enumerate() {
            let slot = first as usize + i;
            match op {
                Op::Dispatch(st) => {
                    write_params(&mut prep.staging, slot, &st.kernel);
                    let group = prep.groups[slot].clone().ok_or(ExecError::BadPlan(
                        "the instruction differs from its prepared form",
                    ))?;
                    // A GEMM runs the fastest kernel that fits its dimensions and bindings.
                    let (pipe, groups) = match &st.kernel {
                        Kernel::Gemm(d) => gpu.gemm_default(d, prep.gemm_bytes[slot]),
                        k => (pipeline(gpu, k), st.groups),
                    };
                    let stamped = match &st.kernel {
                        Kernel::Gemm(d) => Stamped::Gemm(*d, prep.gemm_bytes[slot]),
                        Kernel::Set(set, e, _) => Stamped::Entry(entry_name(*set, *e)),
                    };
                    let pass = pass_of(prep)?;
                    pass.set_pipeline(pipe);
                    pass.set_bind_group(0, &group, &[]);
                    if groups.0 > 0 && groups.1 > 0 {
                        let q = stamp(&mut self.stamps, (r.eo, stamped, groups));
                        if let Some((set, q)) = q {
                            pass.write_timestamp(set, q);
                        }
                        pass.dispatch_workgroups(groups.0, groups.1, 1);
                        if let Some((set, q)) = q {
                            pass.write_timestamp(set, q + 1);
                        }
                        dispatched += 1;
                    }
                }
                Op::Copy(_) => {
                    let c = prep.copies[slot].ok_or(ExecError::BadPlan(
                        "the instruction differs from its prepared form",
                    ))?;
                    prep.pass = None; // copies go between passes
                    let enc = prep
                        .encoder
                        .as_mut()
                        .ok_or(ExecError::BadPlan("an instruction outside a step"))?;
                    let buf = |io: bool| if io { &prep.io } else { &prep.mem };
                    enc.copy_buffer_to_buffer(buf(c.src_io), c.src, buf(c.dst_io), c.dst, c.bytes);
                    copied += 1;
                }
            }
        }
        self.dispatched += dispatched;
        self.copied += copied;
        Ok(())
    }

    /// Before the first update of a step: the guard over the losses so far.
    fn guard(&mut self) -> Result<(), ExecError> {
        let gpu = &self.gpu;
        let prep = self
            .prep
            .as_mut()
            .ok_or(ExecError::BadPlan("the GPU backend has no prepared plan"))?;
        if prep.guarded {
            return Ok(());
        }
        prep.guarded = true;
        let io = prep.io_layout;
        let per_slot = io.l_slot / 4;
        let ran = prep.loss_n.iter().take_while(|&&n| n > 0).count();
        let last = ran.checked_sub(1).map_or(0, |k| prep.loss_n[k]);
        let vals = |n: usize| n * prep.loss_per_sample;
        let p = Params {
            n: u32_of(vals(io.mb))?,
            classes: u32_of(per_slot)?,
            kind: u32_of(ran)?,
            accumulate: u32_of(vals(last))?,
            ..Default::default()
        };
        let slot = prep.groups.len() - 1;
        let kernel = Kernel::Set(Set::Ew, entry::GUARD, words(&p));
        write_params(&mut prep.staging, slot, &kernel);
        let group = prep.groups[slot]
            .clone()
            .ok_or(ExecError::BadPlan("the guard has no bind group"))?;
        let q = stamp(&mut self.stamps, (Eo::MAX, Stamped::Entry("guard"), (1, 1)));
        let pass = pass_of(prep)?;
        pass.set_pipeline(pipeline(gpu, &kernel));
        pass.set_bind_group(0, &group, &[]);
        if let Some((set, q)) = q {
            pass.write_timestamp(set, q);
        }
        pass.dispatch_workgroups(1, 1, 1);
        if let Some((set, q)) = q {
            pass.write_timestamp(set, q + 1);
        }
        self.dispatched += 1;
        Ok(())
    }
}

/// The step's loss totals from the mapped readback buffer (then unmapped): per micro-batch as the CPU
/// computes them, its mean in f32 (sample order), the sum in f64.
fn totals(prep: &mut Prepared) -> Result<LossOut, ExecError> {
    let io = prep.io_layout;
    let ran = prep.loss_n.iter().take_while(|&&n| n > 0).count();
    let read = (io.nil - io.l) as u64;
    let slice = prep.readback.slice(..read);
    // Read in place: a copy would be a host allocation every step.
    let view = slice
        .get_mapped_range()
        .map_err(|e| gpu_err(GpuError::Readback(e.to_string())))?;
    let vals: &[f32] = bytemuck::cast_slice(&view);
    let slot = io.l_slot / 4;
    let mut out = LossOut::default();
    for (k, &n) in prep.loss_n[..ran].iter().enumerate() {
        let s = &vals[k * slot..(k + 1) * slot];
        let (mean, correct) = match prep.kind {
            LossKind::SoftmaxCrossEntropy => {
                let sum: f32 = s[..n].iter().sum();
                (
                    sum / n as f32,
                    s[n..2 * n].iter().filter(|&&c| c != 0.0).count(),
                )
            }
            LossKind::Mse => {
                let m = n * prep.loss_per_sample;
                let sum: f32 = s[..m].iter().sum();
                (sum / m as f32, 0)
            }
        };
        out.sum += mean as f64 * n as f64;
        out.mean = mean;
        out.correct += correct;
    }
    drop(view);
    prep.readback.unmap();
    Ok(out)
}

/// (offset, bytes) in the GPU space of tensor `t`'s storage at `eo`.
fn range_of(plan: &Plan, t: TensorId, eo: Eo) -> Result<(usize, usize), ExecError> {
    let s = plan
        .storage_at(t, eo)
        .ok_or(ExecError::Tensor("tensor is not in the GPU's memory"))?;
    let life = plan
        .lives
        .get(s)
        .ok_or(ExecError::BadPlan("storage index out of range"))?;
    if life.space != GPU_SPACE {
        return Err(ExecError::Space(life.space.0));
    }
    let off = *plan
        .offsets
        .get(s)
        .ok_or(ExecError::BadPlan("storage index out of range"))?;
    Ok((off, life.bytes))
}

/// Bytes of tensor `t` itself (its storage may be larger: a storage holds the largest tensor sharing it).
fn tensor_bytes(plan: &Plan, t: TensorId) -> Result<usize, ExecError> {
    plan.graph
        .tensors
        .get(t as usize)
        .map(|x| x.bytes)
        .ok_or(ExecError::Tensor("no such tensor"))
}

fn write_params(staging: &mut [u8], slot: usize, k: &Kernel) {
    let bytes: &[u8] = match k {
        Kernel::Gemm(d) => bytemuck::bytes_of(d),
        Kernel::Set(_, _, w) => bytemuck::cast_slice(w),
    };
    staging[slot * SLOT..slot * SLOT + bytes.len()].copy_from_slice(bytes);
}

fn family(gpu: &Gpu, set: Set) -> &crate::elementwise::Pipelines {
    match set {
        Set::Ew => &gpu.elementwise,
        Set::Pool => &gpu.pool,
        Set::Conv => &gpu.conv,
        Set::Bn => &gpu.bn,
    }
}

fn pipeline<'g>(gpu: &'g Gpu, k: &Kernel) -> &'g wgpu::ComputePipeline {
    match k {
        Kernel::Gemm(_) => &gpu.sgemm,
        Kernel::Set(set, e, _) => &family(gpu, *set).all[*e],
    }
}

/// The checks `prepare` makes before creating anything.
fn check(plan: &Plan, beside_cpu: bool) -> Result<(), ExecError> {
    let served = |p: Placement| p == Placement::Gpu || (beside_cpu && p == Placement::Cpu);
    if let Some(i) = plan.program.iter().find(|i| !served(i.placement)) {
        return Err(ExecError::Placement(i.placement));
    }
    // A sparse update of a channel subset (gradients of the leading rows only) has no GPU kernels.
    if plan.graph.params().any(|(_, p)| {
        p.grad.is_some()
            && p.updated
                < plan.graph.tensors[p.value as usize].bytes
                    / plan.graph.tensors[p.value as usize].dtype.size()
    }) {
        return Err(ExecError::Unsupported(
            "a sparse update of a channel subset (update = {channels = f}) on the GPU",
        ));
    }
    let mixed = plan.program.iter().any(|i| i.placement != Placement::Gpu);
    if mixed {
        // The host arena and the GPU space; the loss on the CPU (policy::mixed), which rejects a
        // non-finite step before any update of either device.
        if let Some(l) = plan
            .lives
            .iter()
            .find(|l| l.space != GPU_SPACE && l.space != SpaceId::HOST)
        {
            return Err(ExecError::Space(l.space.0));
        }
        if plan
            .program
            .iter()
            .any(|i| i.phase == Phase::Loss && i.placement != Placement::Cpu)
        {
            return Err(ExecError::Unsupported(
                "a loss on the GPU in a plan that also runs on the CPU (a mixed plan's loss runs on the CPU)",
            ));
        }
        if plan.program.iter().any(|i| {
            matches!(
                i.phase,
                Phase::SpillOut | Phase::SpillIn | Phase::Pack | Phase::Unpack
            )
        }) {
            return Err(ExecError::Unsupported(
                "swaps or fp16 storage in a mixed CPU/GPU plan",
            ));
        }
    } else if let Some(l) = plan.lives.iter().find(|l| l.space != GPU_SPACE) {
        return Err(ExecError::Space(l.space.0));
    }
    if plan.graph.precision != frugal_core::model::Precision::F32 {
        return Err(ExecError::Unsupported(
            "integer precision (the GPU backend trains in f32, with fp16 storage where the plan asks)",
        ));
    }
    for n in &plan.graph.nodes {
        if let Some(why) = unsupported(&n.op) {
            return Err(ExecError::Unsupported(why));
        }
    }
    if matches!(
        plan.graph.optimizer,
        frugal_core::model::OptimizerSpec::AdamW { .. }
    ) {
        return Err(ExecError::Unsupported("AdamW has no GPU kernel yet"));
    }
    let last_loss = plan.program.iter().rposition(|i| i.phase == Phase::Loss);
    let first_apply = plan.program.iter().position(|i| i.phase == Phase::Apply);
    if let (Some(l), Some(a)) = (last_loss, first_apply) {
        if a < l {
            return Err(ExecError::Unsupported(
                "an update before the step's last loss (the GPU guards updates by the whole step's loss)",
            ));
        }
    }
    Ok(())
}

impl Backend for GpuBackend {
    fn name(&self) -> &'static str {
        "gpu (wgpu)"
    }

    fn serves(&self, p: Placement) -> bool {
        p == Placement::Gpu
    }

    fn prepare(&mut self, plan: &Plan) -> Result<(), ExecError> {
        check(plan, self.beside_cpu)?;
        // The same plan again (a host that keeps the backend between calls): keep what is on the GPU.
        let fp = fingerprint(plan);
        if self.prep.is_some() && self.fingerprint == Some(fp) {
            return Ok(());
        }
        self.prep = None;
        self.fingerprint = None;
        let dev = &self.gpu.device;
        let limits = dev.limits();
        let mem_bytes = (plan.space_bytes(GPU_SPACE).max(4) as u64).div_ceil(4) * 4;
        if mem_bytes > limits.max_buffer_size {
            return Err(ExecError::Unsupported(
                "the plan's GPU space exceeds the adapter's largest buffer",
            ));
        }
        // Every instruction's dispatches and copies with the operands they bind (the batch's first
        // samples stand for any run: operands do not depend on the sample count), in training and,
        // for a forward, in evaluation (BatchNorm runs other kernels there), each with its
        // micro-batch and instruction.
        let mut ops: Vec<(Op, u16, usize)> = Vec::new();
        let mut first = Vec::with_capacity(plan.program.len());
        for (eo, ins) in plan.program.iter().enumerate() {
            let mut at = [(0u32, 0u8); 2];
            if ins.placement != Placement::Gpu || ins.phase == Phase::Move {
                // The CPU's (a mixed plan), or a move between spaces: no dispatch of its own.
                first.push(at);
                continue;
            }
            for (k, eval) in [false, true].into_iter().enumerate() {
                if eval && ins.phase != Phase::Forward {
                    at[1] = at[0];
                    continue;
                }
                let r = Run {
                    eo: eo as Eo,
                    n: plan.graph.batch,
                    mb: ins.mb,
                    t: 1,
                    norm: plan.batch(),
                    seed: 0,
                    start: 0,
                    eval,
                    recompute: ins.phase == Phase::Recompute,
                };
                let st = steps_of(plan, r)?;
                at[k] = (u32_of(ops.len())?, st.len as u8);
                for op in st.iter() {
                    ops.push((*op, ins.mb, eo));
                }
            }
            first.push(at);
        }
        // The guard: every loss value in, the guard word out.
        let guard = ew(
            entry::GUARD,
            Params::default(),
            1,
            [Opnd::LAll, Opnd::Nil, Opnd::Guard, Opnd::Nil, Opnd::Nil],
        )?;
        ops.push((Op::Dispatch(guard), 0, 0));
        let tmp_bytes = |which: Opnd| {
            ops.iter()
                .filter_map(|(op, _, _)| match op {
                    Op::Copy(c) if c.src == which || c.dst == which => Some(c.bytes as usize),
                    _ => None,
                })
                .max()
                .unwrap_or(0)
        };
        let io_layout = IoLayout::of(plan, tmp_bytes(Opnd::Tmp), tmp_bytes(Opnd::TmpIn));
        let usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        let buffer = |label, size: u64, usage| {
            dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation: false,
            })
        };
        let mem = buffer("frugal space", mem_bytes, usage);
        let io = buffer("frugal io", io_layout.bytes as u64, usage);
        let params_bytes = (ops.len() * SLOT) as u64;
        let params = buffer(
            "frugal params",
            params_bytes,
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        );
        let readback_bytes = (io_layout.nil - io_layout.l) as u64;
        let readback = buffer(
            "frugal losses",
            readback_bytes,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        );
        // A mixed plan's moves to the host land here: its largest one.
        let moves_bytes = (0..plan.n_eo())
            .filter_map(|eo| plan.move_storages(eo))
            .filter(|&(from, _)| plan.lives[from].space == GPU_SPACE)
            .map(|(from, _)| plan.lives[from].bytes as u64)
            .max()
            .unwrap_or(0);
        let moves = (moves_bytes > 0).then(|| {
            buffer(
                "frugal moves",
                moves_bytes,
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            )
        });
        let max_bind = limits.max_storage_buffer_binding_size;
        let mut groups = Vec::with_capacity(ops.len());
        // Where an operand of a dispatch or copy of micro-batch `mb` at `eo` lives: (buffer, offset,
        // bytes).
        let place =
            |o: Opnd, eo: Eo, mb: usize| -> Result<(&wgpu::Buffer, usize, usize), ExecError> {
                let io_l = &io_layout;
                Ok(match o {
                    Opnd::T(t) if is_ext(plan, t) => (&io, io_l.x + mb * io_l.x_slot, io_l.x_slot),
                    Opnd::T(t) => {
                        let (off, bytes) = range_of(plan, t, eo)?;
                        (&mem, off, bytes.max(4).div_ceil(4) * 4)
                    }
                    Opnd::Y => (&io, io_l.y + mb * io_l.y_slot, io_l.y_slot),
                    Opnd::L => (&io, io_l.l + mb * io_l.l_slot, io_l.l_slot),
                    Opnd::LAll => (&io, io_l.l, io_l.mbs * io_l.l_slot),
                    Opnd::Guard => (&io, io_l.guard, GPU_ALIGN),
                    Opnd::Nil => (&io, io_l.nil, GPU_ALIGN),
                    Opnd::Bn => (&io, io_l.bn, io_l.bn2 - io_l.bn),
                    Opnd::Bn2 => (&io, io_l.bn2, io_l.tmp - io_l.bn2),
                    Opnd::Tmp => (&io, io_l.tmp, io_l.tmp_in - io_l.tmp),
                    Opnd::TmpIn => (&io, io_l.tmp_in, io_l.bytes - io_l.tmp_in),
                })
            };
        let mut copies = Vec::with_capacity(ops.len());
        let mut gemm_bytes = vec![[0u64; 3]; ops.len()];
        for (slot, (op, mb, eo)) in ops.iter().enumerate() {
            let eo = *eo as Eo;
            let mbu = *mb as usize;
            let st = match op {
                Op::Copy(c) => {
                    let (sb, so, ss) = place(c.src, eo, mbu)?;
                    let (db, d_o, ds) = place(c.dst, eo, mbu)?;
                    if c.src_off + c.bytes > ss as u64 || c.dst_off + c.bytes > ds as u64 {
                        return Err(ExecError::BadPlan("a copy beyond its tensor"));
                    }
                    copies.push(Some(Resolved {
                        src_io: std::ptr::eq(sb, &io),
                        src: so as u64 + c.src_off,
                        dst_io: std::ptr::eq(db, &io),
                        dst: d_o as u64 + c.dst_off,
                        bytes: c.bytes,
                    }));
                    groups.push(None);
                    continue;
                }
                Op::Dispatch(st) => st,
            };
            copies.push(None);
            let set = match st.kernel {
                Kernel::Gemm(_) => None,
                Kernel::Set(set, _, _) => Some(set),
            };
            let mut bound: Vec<(&wgpu::Buffer, u64, u64)> = Vec::with_capacity(5);
            let used = if set.is_none() { 3 } else { 5 };
            for (k, o) in st.ops[..used].iter().enumerate() {
                let (buf, off, size) = match o {
                    Opnd::Nil => (&io, io_layout.nil + k * GPU_ALIGN, GPU_ALIGN),
                    _ => place(*o, eo, mbu)?,
                };
                if off % GPU_ALIGN != 0 {
                    return Err(ExecError::BadPlan(
                        "a GPU storage below the binding alignment",
                    ));
                }
                if size as u64 > max_bind {
                    return Err(ExecError::Unsupported(
                        "a tensor larger than the adapter's largest storage binding",
                    ));
                }
                if (off + size) as u64 > buf.size() {
                    return Err(ExecError::BadPlan("a tensor outside the GPU space"));
                }
                // No two bindings of a dispatch overlap (WebGPU's rule for writable bindings).
                let (lo, hi) = (off as u64, (off + size) as u64);
                let overlaps = bound
                    .iter()
                    .any(|&(b, o, sz)| std::ptr::eq(b, buf) && o < hi && lo < o + sz);
                if overlaps {
                    return Err(ExecError::BadPlan("two bindings of one dispatch overlap"));
                }
                bound.push((buf, off as u64, size as u64));
            }
            if set.is_none() {
                for (i, &(_, _, size)) in bound.iter().enumerate() {
                    gemm_bytes[slot][i] = size;
                }
            }
            let uniform_size = match set {
                None => std::mem::size_of::<Dims>(),
                Some(_) => PARAM_WORDS * 4,
            } as u64;
            let mut entries = Vec::with_capacity(6);
            entries.push(wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &params,
                    offset: (slot * SLOT) as u64,
                    size: NonZeroU64::new(uniform_size),
                }),
            });
            for (i, &(buf, off, size)) in bound.iter().enumerate() {
                entries.push(wgpu::BindGroupEntry {
                    binding: i as u32 + 1,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: buf,
                        offset: off,
                        size: NonZeroU64::new(size),
                    }),
                });
            }
            let layout = match set {
                None => &self.gpu.layout,
                Some(set) => &family(&self.gpu, set).layout,
            };
            groups.push(Some(dev.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout,
                entries: &entries,
            })));
        }
        let g = &plan.graph;
        let (loss_per_sample, kind) = match g.loss {
            LossKind::SoftmaxCrossEntropy => (1, g.loss),
            LossKind::Mse => (g.pred_dims().numel(), g.loss),
        };
        self.bytes = GpuBytes {
            space: mem_bytes,
            io: io_layout.bytes as u64,
            params: params_bytes,
            readback: readback_bytes,
            moves: moves_bytes,
        };
        self.prep = Some(Prepared {
            mem,
            io,
            io_layout,
            params,
            readback,
            groups,
            copies,
            gemm_bytes,
            first,
            staging: vec![0u8; ops.len() * SLOT],
            encoder: None,
            pass: None,
            samples: 0,
            guarded: false,
            loss_n: vec![0; io_layout.mbs],
            loss_per_sample,
            kind,
            pending: None,
            moves,
        });
        self.fingerprint = Some(fp);
        Ok(())
    }

    fn begin_step(&mut self, plan: &Plan, step: &StepStart<'_>) -> Result<(), ExecError> {
        let gpu = &self.gpu;
        let prep = self
            .prep
            .as_mut()
            .ok_or(ExecError::BadPlan("the GPU backend has no prepared plan"))?;
        if prep.pending.is_some() {
            return Err(ExecError::BadPlan(
                "the previous step's loss is still being read back: await GpuBackend::loss first",
            ));
        }
        // A step that failed midway left its pass open: discard it.
        prep.pass = None;
        prep.encoder = None;
        let per = plan.graph.input_dims.numel();
        let io = prep.io_layout;
        let n = step.x.len() / per.max(1);
        if n > io.mbs * io.mb {
            return Err(ExecError::BadBatch(
                "more samples than the planned batch",
                n,
            ));
        }
        for (k, chunk) in step.x.chunks(io.mb * per).enumerate() {
            gpu.queue.write_buffer(
                &prep.io,
                (io.x + k * io.x_slot) as u64,
                bytemuck::cast_slice(chunk),
            );
        }
        prep.samples = n;
        prep.guarded = false;
        prep.loss_n.fill(0);
        if let Some(st) = self.stamps.as_mut() {
            st.what.clear();
            st.resolved = 0;
        }
        let enc = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("step"),
            });
        // The pass opens at the first dispatch (`pass_of`).
        prep.encoder = Some(enc);
        Ok(())
    }

    fn end_step(&mut self, _plan: &Plan) -> Result<Option<LossOut>, ExecError> {
        let gpu = &self.gpu;
        let prep = self
            .prep
            .as_mut()
            .ok_or(ExecError::BadPlan("the GPU backend has no prepared plan"))?;
        prep.pass = None; // ends the pass
        let Some(mut enc) = prep.encoder.take() else {
            return Ok(None);
        };
        let io = prep.io_layout;
        let ran = prep.loss_n.iter().take_while(|&&n| n > 0).count();
        let read = (io.nil - io.l) as u64;
        if ran > 0 {
            enc.copy_buffer_to_buffer(&prep.io, io.l as u64, &prep.readback, 0, read);
        }
        if let Some(st) = self.stamps.as_mut() {
            let q = st.what.len() as u32 * 2;
            if q > 0 {
                enc.resolve_query_set(&st.set, 0..q, &st.resolve, 0);
                enc.copy_buffer_to_buffer(&st.resolve, 0, &st.read, 0, q as u64 * 8);
            }
            st.resolved = q;
        }
        gpu.queue.write_buffer(&prep.params, 0, &prep.staging);
        gpu.queue.submit([enc.finish()]);
        self.submits += 1;
        if ran == 0 {
            // A mixed plan (its loss on the CPU) still waits for its last GPU updates, natively: the
            // step is done when it returns, and wgpu frees the step's upload staging then, so every
            // step ends with the same GPU objects alive.
            #[cfg(not(target_arch = "wasm32"))]
            if self.beside_cpu {
                gpu.wait().map_err(gpu_err)?;
            }
            return Ok(None);
        }
        let mapping = Mapping::start(&prep.readback.slice(..read));
        #[cfg(target_arch = "wasm32")]
        {
            // The browser maps it when its event loop runs: the host awaits `GpuBackend::loss`.
            let _ = gpu;
            prep.pending = Some(mapping);
            Ok(None)
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            gpu.wait().map_err(gpu_err)?;
            crate::block_on(mapping).map_err(gpu_err)?;
            totals(prep).map(Some)
        }
    }

    #[cfg(target_arch = "wasm32")]
    fn read_tensor(&mut self, _: &Plan, _: TensorId, _: &mut [f32]) -> Result<(), ExecError> {
        Err(ExecError::Unsupported(
            "a synchronous read-back in the browser (await GpuBackend::read_async)",
        ))
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn read_tensor(&mut self, plan: &Plan, t: TensorId, out: &mut [f32]) -> Result<(), ExecError> {
        let v = self.read(plan, t)?;
        if v.len() != out.len() {
            return Err(ExecError::Tensor("length differs from the planned tensor"));
        }
        out.copy_from_slice(&v);
        Ok(())
    }

    fn write_tensor(&mut self, plan: &Plan, t: TensorId, data: &[f32]) -> Result<(), ExecError> {
        self.write(plan, t, data)
    }

    fn init_params(&mut self, plan: &Plan, host: &mut [u8], seed: u64) -> Result<(), ExecError> {
        // The CPU's initialisation (PyTorch's defaults, the same values for a seed) into a host copy
        // of both spaces (the host arena's storages, then the GPU space's), whose GPU part is uploaded
        // whole and whose host part (a mixed plan's) goes into the arena.
        let (both, base) = frugal_core::policy::mixed::host_view(plan, GPU_SPACE);
        let mut shadow = vec![0u8; both.arena_bytes.max(base + 4).div_ceil(4) * 4 + 64];
        let at = shadow.as_ptr().align_offset(64);
        let shadow = &mut shadow[at..];
        frugal_core::backend::CpuBackend::new().init_params(&both, shadow, seed)?;
        let h = plan.arena_bytes;
        host.get_mut(..h)
            .ok_or(ExecError::BadPlan("the arena is smaller than the plan"))?
            .copy_from_slice(&shadow[..h]);
        let gpu_part = &shadow[base..base + plan.space_bytes(GPU_SPACE).max(4).div_ceil(4) * 4];
        let prep = self.prepared()?;
        let mem = prep.mem.clone();
        self.gpu.queue.write_buffer(&mem, 0, gpu_part);
        Ok(())
    }
}

impl LayerOps for GpuBackend {
    fn forward(&mut self, cx: &Cx<'_>, _host: &mut [u8]) -> Result<(), ExecError> {
        self.timed(cx.eo, |b| b.record(cx.plan, run_of(cx, 0)))
    }
    fn grad_w(&mut self, cx: &Cx<'_>, _host: &mut [u8]) -> Result<(), ExecError> {
        self.timed(cx.eo, |b| b.record(cx.plan, run_of(cx, 0)))
    }
    fn grad_x(&mut self, cx: &Cx<'_>, _host: &mut [u8]) -> Result<(), ExecError> {
        self.timed(cx.eo, |b| b.record(cx.plan, run_of(cx, 0)))
    }
}

fn run_of(cx: &Cx<'_>, norm: usize) -> Run {
    Run {
        eo: cx.eo,
        n: cx.n,
        mb: cx.ins.mb,
        t: cx.t,
        norm,
        seed: cx.seed,
        start: cx.start,
        eval: cx.mode == frugal_core::backend::Mode::Eval,
        recompute: cx.mode == frugal_core::backend::Mode::Recompute,
    }
}

/// Dropout's kernel parameters for `elems` values of the run (see `dropout_rows` in the shader).
fn dropout_params(
    node: &Node,
    p: f32,
    r: Run,
    elems: usize,
    accumulate: bool,
) -> Result<Params, ExecError> {
    // The CPU's seeds: the layer's from the step's, each sample's from the layer's and its batch index.
    let seed = frugal_core::rng::hash2(r.seed, node.layer as u64);
    Ok(Params {
        n: u32_of(elems)?,
        classes: seed as u32,
        kind: (seed >> 32) as u32,
        accumulate: accumulate as u32,
        lr: if r.eval { 0.0 } else { p },
        momentum: crate::elementwise::keep_scale(if r.eval { 0.0 } else { p }),
        beta2: f32::from_bits(u32_of(node.out_dims.numel())?),
        eps: f32::from_bits(u32_of(r.start)?),
        ..Default::default()
    })
}

impl LossOps for GpuBackend {
    fn loss(
        &mut self,
        cx: &Cx<'_>,
        _host: &mut [u8],
        target: Target<'_>,
        norm: usize,
    ) -> Result<LossOut, ExecError> {
        let gpu = &self.gpu;
        let prep = self
            .prep
            .as_mut()
            .ok_or(ExecError::BadPlan("the GPU backend has no prepared plan"))?;
        let io = prep.io_layout;
        let mb = cx.ins.mb as usize;
        if mb >= io.mbs {
            return Err(ExecError::BadPlan("a micro-batch beyond the plan's"));
        }
        let bytes: &[u8] = match target {
            Target::Classes(y) => bytemuck::cast_slice(y),
            Target::Values(v) => bytemuck::cast_slice(v),
        };
        gpu.queue
            .write_buffer(&prep.io, (io.y + mb * io.y_slot) as u64, bytes);
        prep.loss_n[mb] = cx.n;
        // In evaluation the derivative is written too, into its own planned storage, and never read.
        self.record(cx.plan, run_of(cx, norm))?;
        // The values are read back when the step's one submission has run (`end_step`).
        Ok(LossOut::default())
    }
}

impl OptimOps for GpuBackend {
    fn apply(&mut self, cx: &Cx<'_>, _host: &mut [u8]) -> Result<(), ExecError> {
        self.timed(cx.eo, |b| {
            b.guard()?;
            b.record(cx.plan, run_of(cx, 0))
        })
    }
}

impl MoveOps for GpuBackend {
    fn convert_half(&mut self, cx: &Cx<'_>, _host: &mut [u8]) -> Result<(), ExecError> {
        self.record(cx.plan, run_of(cx, 0))
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn move_between(
        &mut self,
        _cx: &Cx<'_>,
        host: &mut [u8],
        from: Region,
        to: Region,
    ) -> Result<(), ExecError> {
        self.move_host_gpu(host, from, to)
    }
}
