//! Planning: the schedule of one training step (execution orders), every tensor's lifetime, storage
//! sharing by NNTrainer's Algorithm 1, and the layout of all storages in one arena. The result is a
//! [`Plan`]: a flat program of [`Instr`]s plus an offset for every tensor — what the executor runs.
mod ids;
mod layout;
pub mod params;
pub mod space;
pub mod table;
#[cfg(test)]
pub(crate) mod tests;

use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

pub use ids::{GroupId, Id, IdVec, StorageId};
pub use layout::{
    lower_bound, strategies, BestFitBySize, FirstUseOrder, Layout, LayoutStrategy,
    LongestLifetimeFirst,
};
pub use space::{SpaceId, SpaceLayout};

use crate::backend::Placement;
use crate::budget::{Budget, BudgetError};
use crate::graph::{scratch_slot, Graph, Node, NodeOp, Share, TensorId, TensorKind};
use crate::ops::rnn::Cell;

/// An execution order: the index of an instruction in the step's program.
pub type Eo = u32;

/// Byte alignment of every storage in the arena (a cache line; enough for AVX-512 loads).
pub const ALIGN: usize = 64;

/// What part of a layer's work an instruction does (NNTrainer's F, CG, CD, apply + the fused loss).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Phase {
    /// Forward.
    Forward = 0,
    /// Loss and dL/d(prediction), fused.
    Loss = 1,
    /// Compute gradient (dL/dW).
    GradW = 2,
    /// Compute derivative (dL/dX).
    GradX = 3,
    /// Apply gradient (optimizer update).
    Apply = 4,
    /// Forward re-run to regenerate a discarded activation (no side effects on running statistics).
    Recompute = 5,
    /// Swap out (NNTrainer §4.3): reads a group's storage and hands it to the host's spill store; the
    /// storage's lifetime segment ends here. `Instr::node` holds the *tensor id*, not a node index.
    SpillOut = 6,
    /// Swap in: a fresh write of the group from the spill store, starting a new lifetime segment that the
    /// layout places like any other. `Instr::node` holds the *tensor id*.
    SpillIn = 7,
    /// fp16 storage: reads a group's storage (f32) and writes its IEEE-half copy
    /// ([`Graph::half_of`](crate::graph::Graph::half_of)), a fresh tensor; the f32 segment ends here.
    /// `Instr::node` holds the *tensor id*.
    Pack = 8,
    /// fp16 storage: a fresh write of the group (f32) from its half copy, starting a new lifetime segment;
    /// the half copy's life ends here. `Instr::node` holds the *tensor id*.
    Unpack = 9,
    /// A move between memory spaces ([`space`]): reads the group's current storage and writes its next
    /// one, which may live in another space (its [`TensorLife::space`]). Both are live here: the old
    /// segment ends at the move, the new one begins at it. `Instr::node` holds the *tensor id*.
    Move = 10,
    /// One time step of a recurrent layer's forward ([`crate::graph::Node::bptt`]): `Instr::step` says
    /// which. The layer has no [`Phase::Forward`]; its steps run in order, each writing its own saved
    /// tensors (and the step's rows of the output).
    StepFwd = 11,
    /// One time step of a recurrent layer's backward through time (its input derivative; steps in
    /// reverse order, `Instr::step` says which), reading that step's saved tensors for the last time.
    /// The layer has no [`Phase::GradX`].
    StepBwd = 12,
}

impl Phase {
    /// Short name (F, LOSS, CG, CD, AG).
    pub fn short(self) -> &'static str {
        match self {
            Phase::Forward => "F",
            Phase::Loss => "LOSS",
            Phase::GradW => "CG",
            Phase::GradX => "CD",
            Phase::Apply => "AG",
            Phase::Recompute => "RF",
            Phase::SpillOut => "SO",
            Phase::SpillIn => "SI",
            Phase::Pack => "PK",
            Phase::Unpack => "UP",
            Phase::Move => "MV",
            Phase::StepFwd => "SF",
            Phase::StepBwd => "SB",
        }
    }
}

/// One instruction of a plan. `node` + `phase` + `mb` + `step` is its stable logical id, so two plans can
/// be lined up when the budget changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Instr {
    /// Node index (`u16::MAX` for the loss).
    pub node: u16,
    /// Phase.
    pub phase: Phase,
    /// Micro-batch index (0 when the batch is not split).
    pub mb: u16,
    /// Backend that runs it.
    pub placement: Placement,
    /// The time step of a recurrent layer's [`Phase::StepFwd`]/[`Phase::StepBwd`]; 0 for every other
    /// phase.
    pub step: u16,
}

/// Node index used by the loss instruction.
pub const LOSS_NODE: u16 = u16::MAX;

impl Instr {
    /// A swap instruction ([`Phase::SpillOut`] or [`Phase::SpillIn`]) of tensor `t` in micro-batch `mb`;
    /// the tensor id is stored in `node` (None when it does not fit in 16 bits or `phase` is no swap).
    pub fn spill(phase: Phase, t: TensorId, mb: u16) -> Option<Instr> {
        let node = u16::try_from(t).ok().filter(|&n| n != LOSS_NODE)?;
        matches!(phase, Phase::SpillOut | Phase::SpillIn).then_some(Instr {
            node,
            phase,
            mb,
            placement: Placement::Cpu,
            step: 0,
        })
    }

    /// The tensor a swap instruction moves (None for every other phase).
    pub fn spilled(&self) -> Option<TensorId> {
        matches!(self.phase, Phase::SpillOut | Phase::SpillIn).then_some(self.node as TensorId)
    }

    /// An fp16-storage instruction ([`Phase::Pack`] or [`Phase::Unpack`]) of tensor `t` (stored in
    /// `node`; None when it does not fit in 16 bits or `phase` is neither).
    pub fn half(phase: Phase, t: TensorId) -> Option<Instr> {
        let node = u16::try_from(t).ok().filter(|&n| n != LOSS_NODE)?;
        matches!(phase, Phase::Pack | Phase::Unpack).then_some(Instr {
            node,
            phase,
            mb: 0,
            placement: Placement::Cpu,
            step: 0,
        })
    }

    /// The f32 tensor a pack/unpack instruction converts (None for every other phase).
    pub fn packed(&self) -> Option<TensorId> {
        matches!(self.phase, Phase::Pack | Phase::Unpack).then_some(self.node as TensorId)
    }

    /// A move ([`Phase::Move`]) of tensor `t`'s storage group to its next storage (stored in `node`;
    /// None when it does not fit in 16 bits).
    pub fn move_of(t: TensorId) -> Option<Instr> {
        let node = u16::try_from(t).ok().filter(|&n| n != LOSS_NODE)?;
        Some(Instr {
            node,
            phase: Phase::Move,
            mb: 0,
            placement: Placement::Cpu,
            step: 0,
        })
    }

    /// The tensor a move instruction names (None for every other phase).
    pub fn moved(&self) -> Option<TensorId> {
        (self.phase == Phase::Move).then_some(self.node as TensorId)
    }
}

/// What a plan is derived from: a realised graph, its micro-batch count, the storage-sharing roots and
/// the step's program. Policies derive every candidate plan through it: edit [`Schedule::program`]
/// (insert recomputations, swaps, packs, moves), then [`Schedule::arena_bytes`] (the layout's size, no
/// plan built) or [`Schedule::plan`]. The graph is borrowed and the roots computed once, however many
/// candidates a search lays out.
#[derive(Clone, Debug)]
pub struct Schedule<'g> {
    /// The realised model (at the micro-batch size).
    pub graph: &'g Graph,
    /// Micro-batches per step.
    pub micro_batches: u16,
    /// Root tensor of each tensor's sharing group ([`share_groups`]), by tensor id.
    pub roots: Vec<TensorId>,
    /// Instructions; an instruction's index is its execution order.
    pub program: Vec<Instr>,
}

impl<'g> Schedule<'g> {
    /// The plain single-micro-batch schedule of `g` ([`step_program`]), in-place sharing on.
    pub fn new(g: &'g Graph) -> Self {
        Self::shaped(g, PlanShape::default())
    }

    /// The schedule of `shape.micro_batches` micro-batches of `g.batch` samples ([`step_program`]).
    pub fn shaped(g: &'g Graph, shape: PlanShape) -> Self {
        Self {
            graph: g,
            micro_batches: shape.micro_batches,
            roots: share_groups(g, shape.in_place),
            program: step_program(g, shape.micro_batches),
        }
    }

    /// An explicit program of `g` (in-place sharing on).
    pub fn with_program(g: &'g Graph, micro_batches: u16, program: Vec<Instr>) -> Self {
        Self {
            graph: g,
            micro_batches,
            roots: share_groups(g, true),
            program,
        }
    }

    /// The schedule `p` was laid out from (its graph borrowed, its program and roots copied).
    pub fn of(p: &'g Plan) -> Self {
        Self {
            graph: &p.graph,
            micro_batches: p.micro_batches,
            roots: p.roots.clone(),
            program: p.program.clone(),
        }
    }

    /// The arena bytes [`Schedule::plan`] would give: the same storages and layout strategies, without
    /// building the plan.
    pub fn arena_bytes(&self) -> usize {
        let lt = lifetimes(self.graph, &self.program, &self.roots);
        best_layout(lt.lives.as_slice()).0.arena_bytes
    }

    /// Lays the program out: its storages and the smallest of all layout strategies.
    pub fn plan(&self) -> Plan {
        Plan::from_program(
            self.graph.clone(),
            self.micro_batches,
            self.program.clone(),
            self.roots.clone(),
        )
    }
}

/// The program of one step of `m` micro-batches, in NNTrainer's order: per micro-batch F for every
/// layer, the loss, then per layer in reverse CG (accumulating after the first micro-batch) and CD; the
/// updates right after a layer's derivative when `m = 1` (which frees its gradient early), else once,
/// after the last micro-batch.
pub fn step_program(g: &Graph, m: u16) -> Vec<Instr> {
    let m = m.max(1);
    let mut program = Vec::new();
    let ins = |node: usize, phase, mb| Instr {
        node: node as u16,
        phase,
        mb,
        placement: Placement::Cpu,
        step: 0,
    };
    let step = |node: usize, phase, mb, step| Instr {
        node: node as u16,
        phase,
        mb,
        placement: Placement::Cpu,
        step,
    };
    for mb in 0..m {
        for (i, n) in g.nodes.iter().enumerate() {
            match n.bptt {
                // A recurrent layer unrolled over time: one instruction per step.
                Some(b) => program.extend((0..b.steps).map(|t| step(i, Phase::StepFwd, mb, t))),
                None => program.push(ins(i, Phase::Forward, mb)),
            }
        }
        program.push(Instr {
            node: LOSS_NODE,
            phase: Phase::Loss,
            mb,
            placement: Placement::Cpu,
            step: 0,
        });
        for i in (0..g.nodes.len()).rev() {
            let n = &g.nodes[i];
            // A recurrent layer's derivative phase (the backward through time) writes what its
            // gradient phase reads.
            let x_first = matches!(n.op, NodeOp::Rnn(_));
            if x_first && n.has_grad_x(g) {
                match n.bptt {
                    // Back through time: the last step first.
                    Some(b) => {
                        program.extend((0..b.steps).rev().map(|t| step(i, Phase::StepBwd, mb, t)))
                    }
                    None => program.push(ins(i, Phase::GradX, mb)),
                }
            }
            if n.has_grad_w() {
                program.push(ins(i, Phase::GradW, mb));
            }
            if !x_first && n.has_grad_x(g) {
                program.push(ins(i, Phase::GradX, mb));
            }
            if m == 1 && n.has_grad_w() {
                program.push(ins(i, Phase::Apply, 0));
            }
        }
    }
    if m > 1 {
        for i in (0..g.nodes.len()).rev() {
            if g.nodes[i].has_grad_w() {
                program.push(ins(i, Phase::Apply, m - 1));
            }
        }
    }
    program
}

/// The tensors instruction `ins` reads or writes — the single source of truth for lifetimes.
pub fn touches(g: &Graph, ins: &Instr, out: &mut Vec<TensorId>) {
    out.clear();
    if ins.phase == Phase::Loss {
        out.push(g.pred());
        out.push(g.d_pred);
        out.extend(g.loss_scratch);
        return;
    }
    if let Some(t) = ins.spilled().or(ins.moved()) {
        // Swaps and moves carry a tensor id in `node`.
        if (t as usize) < g.tensors.len() {
            out.push(t);
        }
        return;
    }
    if let Some(t) = ins.packed() {
        // Pack/unpack carry the f32 tensor's id; they also touch its half copy.
        if let Some(h) = g.half_of(t) {
            out.push(t);
            out.push(h);
        }
        return;
    }
    let Some(n) = g.nodes.get(ins.node as usize) else {
        return;
    };
    match ins.phase {
        Phase::Forward => {
            out.extend(n.inputs.iter().copied());
            out.push(n.out);
            out.extend(n.params.iter().map(|p| p.value));
            out.extend(n.stats.iter().copied());
            out.extend(n.saved.iter().copied());
            out.extend(n.scratch[scratch_slot::FWD]);
        }
        Phase::Recompute => {
            out.extend(n.inputs.iter().copied());
            out.push(n.out);
            out.extend(n.params.iter().map(|p| p.value));
            match n.op {
                // Reads the saved statistics instead of recomputing (and re-accumulating) them.
                NodeOp::BatchNorm { train: true, .. } => out.extend(n.saved.iter().copied()),
                NodeOp::BatchNorm { .. } => out.extend(n.stats.iter().copied()),
                _ => out.extend(n.saved.iter().copied()),
            }
            out.extend(n.scratch[scratch_slot::FWD]);
        }
        Phase::StepFwd | Phase::StepBwd => {
            let (Some(b), NodeOp::Rnn(rg)) = (n.bptt, &n.op) else {
                return;
            };
            let t = ins.step;
            if t >= b.steps {
                return;
            }
            // The LSTM's step reads the previous step's cell (forward: c_{t−1}; backward: df).
            let prev = (t > 0 && rg.cell == Cell::Lstm).then(|| b.state(t - 1));
            if ins.phase == Phase::StepFwd {
                // The projection's rows t, h_{t−1} and h_t, W_hh and b_hh, the step's own saved
                // tensors and the GRU's reset gates.
                out.extend(n.inputs.iter().copied());
                out.push(n.out);
                out.extend(n.params.iter().map(|p| p.value));
                out.extend(prev);
                out.push(b.gates(t));
                out.push(b.state(t));
                out.extend(b.r);
                out.extend(n.scratch[scratch_slot::FWD]);
            } else {
                // dy_t, the input derivative's rows t, W_hh, the GRU's h_{t−1}, the step's saved
                // tensors (their last use) and the carried derivatives.
                out.extend(n.d_out);
                out.extend(n.d_in.iter().flatten().map(|d| d.0));
                out.extend(n.params.first().map(|p| p.value));
                if rg.cell == Cell::Gru {
                    out.push(n.out);
                }
                out.extend(prev);
                out.push(b.gates(t));
                out.push(b.state(t));
                out.extend(b.carry);
                out.extend(n.scratch[scratch_slot::GRAD_X]);
            }
        }
        Phase::GradW if matches!(n.op, NodeOp::Rnn(_)) => {
            // The input derivative (the gates' derivative, written by the backward steps before
            // it), every h_t and the GRU's reset gates; not the input.
            out.extend(n.d_in.iter().flatten().map(|d| d.0));
            out.push(n.out);
            out.extend(n.params.iter().filter_map(|p| p.grad));
            out.extend(n.bptt.and_then(|b| b.r));
            out.extend(n.scratch[scratch_slot::GRAD_W]);
        }
        Phase::GradW => {
            out.extend(n.d_out);
            out.extend(n.params.iter().filter_map(|p| p.grad));
            if matches!(n.op, NodeOp::Lora(_)) {
                // dA needs the adapter B.
                out.extend(n.params.last().map(|p| p.value));
            }
            out.extend(n.saved.iter().copied());
            // A bias-only update of a Linear/Conv2d (sparse update) sums dL/d(out) alone: its input
            // need not be saved for it.
            let bias_only = matches!(n.op, NodeOp::Linear { .. } | NodeOp::Conv(_))
                && n.params.first().is_some_and(|p| p.grad.is_none());
            if !bias_only {
                out.extend(grad_w_inputs(n).iter().copied());
            }
            out.extend(n.scratch[scratch_slot::GRAD_W]);
        }
        Phase::GradX => {
            out.extend(n.d_out);
            out.extend(n.d_in.iter().flatten().map(|d| d.0));
            out.extend(n.saved.iter().copied());
            match n.op {
                NodeOp::Linear { .. } | NodeOp::Conv(_) => {
                    out.extend(n.params.first().map(|p| p.value))
                }
                NodeOp::BatchNorm { train, .. } => {
                    out.extend(n.params.first().map(|p| p.value));
                    if train {
                        out.extend(n.inputs.iter().copied());
                    } else {
                        out.extend(n.stats.iter().copied());
                    }
                }
                NodeOp::Act(_) => out.push(n.out),
                NodeOp::Norm { .. } => {
                    out.extend(n.params.first().map(|p| p.value));
                    out.extend(n.inputs.iter().copied());
                }
                NodeOp::Smooth(_) | NodeOp::Attention(_) => out.extend(n.inputs.iter().copied()),
                NodeOp::Lora(_) => out.extend(n.params.iter().map(|p| p.value)),
                // W_hh and every h_t (the GRU's update reads h_{t−1}).
                NodeOp::Rnn(_) => {
                    out.extend(n.params.first().map(|p| p.value));
                    out.push(n.out);
                }
                _ => {}
            }
            out.extend(n.scratch[scratch_slot::GRAD_X]);
        }
        Phase::Apply => {
            for p in &n.params {
                out.push(p.value);
                out.extend(p.grad);
                out.extend(p.state.iter().copied());
            }
        }
        Phase::Loss
        | Phase::SpillOut
        | Phase::SpillIn
        | Phase::Pack
        | Phase::Unpack
        | Phase::Move => {}
    }
}

/// Whether a layer's weight gradient reads its input: not a positional embedding's (the sum of dL/d(out)
/// over the batch), so the token embedding it adds to dies after the forward and the addition may
/// overwrite it in place.
pub fn grad_w_reads_input(op: &NodeOp) -> bool {
    !matches!(op, NodeOp::PosEmbedding { .. })
}

/// The activations a layer's weight gradient reads as its input ([`grad_w_reads_input`]): none for a
/// positional embedding; for a Linear after GELU/SiLU ([`Node::act_in`]) the activation's input, from
/// which it recomputes its own input, so that input dies after this layer's forward; else its inputs.
pub fn grad_w_inputs(n: &Node) -> &[TensorId] {
    if !grad_w_reads_input(&n.op) {
        return &[];
    }
    match &n.act_in {
        Some((_, h)) => core::slice::from_ref(h),
        None => &n.inputs,
    }
}

/// Whether `ins` overwrites all of tensor `t` without reading it — the start of a new value (a new
/// lifetime segment) of `t`'s storage group. `root` tells whether `t` is its group's root (tensors merged
/// into another only ever continue the group's value).
pub fn fresh_write(g: &Graph, ins: &Instr, t: TensorId, root: bool) -> bool {
    let kind = g.tensors[t as usize].kind;
    if kind == TensorKind::Scratch {
        return true;
    }
    if matches!(ins.phase, Phase::SpillIn | Phase::Move) {
        // A swap-in rewrites the whole group (whichever member it names) from the spill store; a move
        // from the group's previous storage ([`lifetimes`] keeps that one live through the move too).
        return !kind.persistent() && ins.node as TensorId == t;
    }
    if let Some(x) = ins.packed() {
        // A pack writes the half copy; an unpack rewrites the whole group from it.
        return match ins.phase {
            Phase::Pack => g.half_of(x) == Some(t),
            _ => !kind.persistent() && x == t,
        };
    }
    if !root || kind.persistent() {
        return false;
    }
    if ins.phase == Phase::Loss {
        return t == g.d_pred;
    }
    let Some(n) = g.nodes.get(ins.node as usize) else {
        return false;
    };
    match ins.phase {
        Phase::Forward => t == n.out || n.saved.contains(&t),
        Phase::Recompute => {
            t == n.out || (n.saved.contains(&t) && !matches!(n.op, NodeOp::BatchNorm { .. }))
        }
        Phase::GradX => n.d_in.iter().flatten().any(|&(d, acc)| d == t && !acc),
        Phase::GradW => ins.mb == 0 && n.params.iter().any(|p| p.grad == Some(t)),
        // A step writes its own saved tensors; the first step begins the output and the GRU's reset
        // gates (later steps add their rows to the same value).
        Phase::StepFwd => n.bptt.is_some_and(|b| {
            let s = ins.step;
            s < b.steps
                && (t == b.gates(s)
                    || t == b.state(s)
                    || (s == 0 && (t == n.out || Some(t) == b.r)))
        }),
        // The last step (the first to run) begins the input derivative and the carried derivatives.
        Phase::StepBwd => n.bptt.is_some_and(|b| {
            u32::from(ins.step) + 1 == u32::from(b.steps)
                && (Some(t) == b.carry || n.d_in.iter().flatten().any(|&(d, acc)| d == t && !acc))
        }),
        _ => false,
    }
}

/// One storage of the arena: one lifetime segment of a group of tensors sharing bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorLife {
    /// Name of the group's root tensor.
    pub name: String,
    /// Kind of the root tensor.
    pub kind: TensorKind,
    /// Bytes (aligned to [`ALIGN`]).
    pub bytes: usize,
    /// First execution order at which it must hold valid data.
    pub first: Eo,
    /// Last execution order (inclusive).
    pub last: Eo,
    /// The memory space it lives in ([`SpaceId::HOST`]: the arena).
    pub space: SpaceId,
}

/// Result of lifetime analysis.
#[derive(Clone, Debug)]
pub struct Lifetimes {
    /// One entry per storage (group × segment).
    pub lives: IdVec<StorageId, TensorLife>,
    /// Group of each tensor, by tensor id (None: external or never used).
    pub group_of: Vec<Option<GroupId>>,
    /// Per group: its segments as (first execution order, storage), sorted.
    pub segments: IdVec<GroupId, Vec<(Eo, StorageId)>>,
    /// Per storage: the execution orders that touch it, ascending.
    pub touches: IdVec<StorageId, Vec<Eo>>,
}

fn align_up(v: usize) -> usize {
    v.div_ceil(ALIGN) * ALIGN
}

/// Groups tensors that share storage by NNTrainer's Algorithm 1 on the single-micro-batch schedule: a
/// read-only view always merges with its target; a modify view merges only when its first use is not
/// before the target group's last use (the in-place write destroys nothing still needed). `merge_in_place
/// = false` keeps modify views apart (a test oracle). Returns each tensor's root.
pub fn share_groups(g: &Graph, merge_in_place: bool) -> Vec<TensorId> {
    let nt = g.tensors.len();
    let base = step_program(g, 1);
    let end = base.len().saturating_sub(1) as Eo;
    let mut first = vec![Eo::MAX; nt];
    let mut last = vec![0 as Eo; nt];
    let mut buf = Vec::new();
    for (eo, ins) in base.iter().enumerate() {
        touches(g, ins, &mut buf);
        for &t in &buf {
            let t = t as usize;
            first[t] = first[t].min(eo as Eo);
            last[t] = last[t].max(eo as Eo);
        }
    }
    for (t, info) in g.tensors.iter().enumerate() {
        if info.kind.persistent() {
            first[t] = 0;
            last[t] = end;
        }
    }
    let mut parent: Vec<u32> = (0..nt as u32).collect();
    fn root(p: &mut [u32], mut x: u32) -> u32 {
        while p[x as usize] != x {
            p[x as usize] = p[p[x as usize] as usize];
            x = p[x as usize];
        }
        x
    }
    let mut gfirst = first.clone();
    let mut glast = last.clone();
    let mut order: Vec<usize> = (0..nt).filter(|&t| first[t] != Eo::MAX).collect();
    // A heapsort by unique keys: the stable order, in a few words of stack (decoders run this).
    crate::sort::heap_sort_by_key(&mut order, |&t| (first[t], t));
    for &t in &order {
        let (target, modify) = match g.tensors[t].share {
            Share::ModifyView(j) if merge_in_place => (j, true),
            Share::ReadView(j) => (j, false),
            _ => continue,
        };
        if first[target as usize] == Eo::MAX
            || g.tensors[target as usize].kind == TensorKind::External
        {
            continue;
        }
        let rt = root(&mut parent, target);
        let rs = root(&mut parent, t as u32);
        if rt == rs {
            continue;
        }
        if modify && gfirst[rs as usize] < glast[rt as usize] {
            continue; // Algorithm 1, line 17: the target is still read after the in-place write.
        }
        parent[rs as usize] = rt;
        gfirst[rt as usize] = gfirst[rt as usize].min(gfirst[rs as usize]);
        glast[rt as usize] = glast[rt as usize].max(glast[rs as usize]);
    }
    (0..nt as u32).map(|t| root(&mut parent, t)).collect()
}

/// Lifetime segments of every storage group over `program`: a group's value starts at a fresh write
/// ([`fresh_write`]) and lives until its last touch before the next fresh write. A [`Phase::Move`] ends one
/// segment and starts the next at the same instruction (both live there: the move copies one into the
/// other). Persistent tensors have one segment spanning the step.
pub fn lifetimes(g: &Graph, program: &[Instr], roots: &[TensorId]) -> Lifetimes {
    let nt = g.tensors.len();
    let end = program.len().saturating_sub(1) as Eo;
    // Dense group ids for used, in-arena tensors.
    let mut gid_of_root: Vec<Option<GroupId>> = vec![None; nt];
    let mut group_of: Vec<Option<GroupId>> = vec![None; nt];
    let mut groups: IdVec<GroupId, TensorId> = IdVec::new(); // root tensor per group
    let mut used = vec![false; nt];
    let mut buf = Vec::new();
    for ins in program {
        touches(g, ins, &mut buf);
        for &t in &buf {
            used[t as usize] = true;
        }
    }
    for t in 0..nt {
        let info = &g.tensors[t];
        if !used[t] || info.kind == TensorKind::External || info.bytes == 0 {
            continue;
        }
        let r = roots[t];
        let gid = *gid_of_root[r as usize].get_or_insert_with(|| groups.push(r));
        group_of[t] = Some(gid);
    }
    let ng = groups.len();
    let mut gbytes: IdVec<GroupId, usize> = vec![0usize; ng].into();
    for (t, gid) in group_of.iter().enumerate() {
        if let Some(gid) = *gid {
            gbytes[gid] = gbytes[gid].max(align_up(g.tensors[t].bytes));
        }
    }
    // Most groups have one segment: room for one storage per group, so a small plan never regrows
    // (a regrowth holds the old and the new vector at once, the decoder's peak on a microcontroller).
    let mut lives: IdVec<StorageId, TensorLife> = IdVec::with_capacity(ng);
    let mut seg_touches: IdVec<StorageId, Vec<Eo>> = IdVec::with_capacity(ng);
    let mut segments: IdVec<GroupId, Vec<(Eo, StorageId)>> = vec![Vec::new(); ng].into();
    let mut current: IdVec<GroupId, Option<StorageId>> = vec![None; ng].into();
    let new_seg = |lives: &mut IdVec<StorageId, TensorLife>,
                   seg_touches: &mut IdVec<StorageId, Vec<Eo>>,
                   gid: GroupId,
                   eo: Eo|
     -> StorageId {
        let r = groups[gid] as usize;
        seg_touches.push(Vec::new());
        lives.push(TensorLife {
            name: g.tensors[r].name.clone(),
            kind: g.tensors[r].kind,
            bytes: gbytes[gid],
            first: eo,
            last: eo,
            space: SpaceId::HOST,
        })
    };
    for (eo, ins) in program.iter().enumerate() {
        let eo = eo as Eo;
        touches(g, ins, &mut buf);
        crate::sort::heap_sort_by_key(&mut buf, |&t| t);
        buf.dedup();
        // A group touched by several tensors of one instruction starts at most one segment.
        let mut seen_groups: Vec<GroupId> = Vec::new();
        for &t in &buf {
            let Some(gid) = group_of[t as usize] else {
                continue;
            };
            let fresh = fresh_write(g, ins, t, roots[t as usize] == t);
            if seen_groups.contains(&gid) {
                if !fresh {
                    continue;
                }
                // a second fresh writer in the same instruction joins the segment already started
                continue;
            }
            seen_groups.push(gid);
            if fresh && ins.phase == Phase::Move {
                // A move reads the current storage (its segment ends here) and writes the next one
                // (which begins here): both are live at the move.
                if let Some(s) = current[gid] {
                    lives[s].last = eo;
                    seg_touches[s].push(eo);
                }
                let s = new_seg(&mut lives, &mut seg_touches, gid, eo);
                segments[gid].push((eo, s));
                current[gid] = Some(s);
                seg_touches[s].push(eo);
                continue;
            }
            let sid = match current[gid] {
                Some(s) if !fresh => s,
                Some(s) if lives[s].last == eo => s,
                _ => {
                    let s = new_seg(&mut lives, &mut seg_touches, gid, eo);
                    segments[gid].push((eo, s));
                    current[gid] = Some(s);
                    s
                }
            };
            lives[sid].last = eo;
            seg_touches[sid].push(eo);
        }
    }
    // Persistent groups: valid for the whole step (and across steps).
    for gi in groups.ids() {
        let r = groups[gi] as usize;
        if g.tensors[r].kind.persistent() {
            if segments[gi].is_empty() {
                let s = new_seg(&mut lives, &mut seg_touches, gi, 0);
                segments[gi].push((0, s));
            }
            for &(_, s) in &segments[gi] {
                lives[s].first = 0;
                lives[s].last = end;
            }
            segments[gi].truncate(1);
            segments[gi][0].0 = 0;
        }
    }
    // Exact capacities, trimmed once the scratch vectors are gone: a microcontroller keeps the result
    // for the whole run, and decodes it at a peak of not much more.
    drop((gid_of_root, groups, gbytes, current, used, buf));
    lives.shrink_to_fit();
    seg_touches.iter_mut().for_each(Vec::shrink_to_fit);
    seg_touches.shrink_to_fit();
    segments.iter_mut().for_each(Vec::shrink_to_fit);
    Lifetimes {
        lives,
        group_of,
        segments,
        touches: seg_touches,
    }
}

/// The smallest layout of `lives` among all strategies (the first of equals) and its strategy's name.
fn best_layout(lives: &[TensorLife]) -> (Layout, &'static str) {
    let mut best: Option<(Layout, &'static str)> = None;
    for s in strategies() {
        let l = s.layout(lives);
        if best
            .as_ref()
            .is_none_or(|(b, _)| l.arena_bytes < b.arena_bytes)
        {
            best = Some((l, s.name()));
        }
    }
    best.unwrap_or((
        Layout {
            offsets: Vec::new(),
            arena_bytes: 0,
        },
        "none",
    ))
}

/// Options that shape a plan besides the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanShape {
    /// Micro-batches per step (1 = whole batch at once).
    pub micro_batches: u16,
    /// Merge in-place tensors (false only for tests).
    pub in_place: bool,
}

impl Default for PlanShape {
    fn default() -> Self {
        Self {
            micro_batches: 1,
            in_place: true,
        }
    }
}

/// A complete, runnable plan.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The realised model (at the micro-batch size).
    pub graph: Graph,
    /// Micro-batches per step; the step's batch is `graph.batch × micro_batches`.
    pub micro_batches: u16,
    /// The step's program.
    pub program: Vec<Instr>,
    /// Root tensor of each tensor's sharing group, by tensor id.
    pub roots: Vec<TensorId>,
    /// Storages (group × lifetime segment).
    pub lives: IdVec<StorageId, TensorLife>,
    /// Tensor → group, by tensor id.
    pub group_of: Vec<Option<GroupId>>,
    /// Group → segments (first execution order, storage).
    pub segments: IdVec<GroupId, Vec<(Eo, StorageId)>>,
    /// Storage → execution orders touching it.
    pub touches: IdVec<StorageId, Vec<Eo>>,
    /// Storage offsets in their memory space (the arena for [`SpaceId::HOST`]).
    pub offsets: IdVec<StorageId, usize>,
    /// Arena (host space) size in bytes (the layout's high-water mark).
    pub arena_bytes: usize,
    /// The layouts of the other memory spaces (none for a host-only plan).
    pub spaces: Vec<SpaceLayout>,
    /// max over execution orders of the bytes live at once: no layout can be smaller.
    pub lower_bound: usize,
    /// Name of the layout strategy that won.
    pub strategy: &'static str,
}

impl Plan {
    /// Plans `g` with the default schedule and the smallest of all layout strategies.
    pub fn new(g: Graph) -> Plan {
        Self::with_sharing(g, true)
    }

    /// Like [`Plan::new`]; `sharing = false` disables in-place merging (a test oracle).
    pub fn with_sharing(g: Graph, sharing: bool) -> Plan {
        Self::shaped(
            g,
            PlanShape {
                micro_batches: 1,
                in_place: sharing,
            },
        )
    }

    /// A plan with `shape.micro_batches` micro-batches of `g.batch` samples.
    pub fn shaped(g: Graph, shape: PlanShape) -> Plan {
        let roots = share_groups(&g, shape.in_place);
        let program = step_program(&g, shape.micro_batches);
        Self::from_program(g, shape.micro_batches, program, roots)
    }

    /// Lays out an explicit program of an owned graph (what [`Schedule::plan`] does with a copy of its
    /// graph).
    pub fn from_program(
        g: Graph,
        micro_batches: u16,
        program: Vec<Instr>,
        roots: Vec<TensorId>,
    ) -> Plan {
        let lt = lifetimes(&g, &program, &roots);
        let lb = lower_bound(lt.lives.as_slice());
        let (layout, strategy) = best_layout(lt.lives.as_slice());
        Plan {
            graph: g,
            micro_batches: micro_batches.max(1),
            program,
            roots,
            lives: lt.lives,
            group_of: lt.group_of,
            segments: lt.segments,
            touches: lt.touches,
            offsets: layout.offsets.into(),
            arena_bytes: layout.arena_bytes,
            spaces: Vec::new(),
            lower_bound: lb,
            strategy,
        }
    }

    /// Samples per step (micro-batch size × micro-batches).
    pub fn batch(&self) -> usize {
        self.graph.batch * self.micro_batches as usize
    }

    /// Bytes a caller must provide for an arena of arbitrary alignment: `arena_bytes + ALIGN - 1`.
    pub fn needed_bytes(&self) -> usize {
        self.arena_bytes + ALIGN - 1
    }

    /// Checks the plan fits `budget` (as [`Plan::needed_bytes`]).
    pub fn check_budget(&self, budget: Budget) -> Result<(), BudgetError> {
        if self.needed_bytes() > budget.bytes {
            Err(BudgetError::TooSmall {
                needed: self.needed_bytes(),
                given: budget.bytes,
            })
        } else {
            Ok(())
        }
    }

    /// Storage holding tensor `t` at execution order `eo` (the segment that started last at or before it).
    pub fn storage_at(&self, t: TensorId, eo: Eo) -> Option<StorageId> {
        let segs = &self.segments[self.group(t)?];
        let i = segs.partition_point(|&(start, _)| start <= eo);
        Some(segs[i.saturating_sub(1)].1)
    }

    /// Arena byte range of tensor `t` at execution order `eo` (None if external, or held in another
    /// memory space there: only its backend can reach it).
    pub fn region_at(&self, t: TensorId, eo: Eo) -> Option<(usize, usize)> {
        let s = self.storage_at(t, eo)?;
        (self.lives[s].space == SpaceId::HOST)
            .then(|| (self.offsets[s], self.graph.tensors[t as usize].bytes))
    }

    /// Arena byte range of a tensor with a single segment (persistent tensors; the first segment otherwise).
    pub fn region(&self, t: TensorId) -> Option<(usize, usize)> {
        self.region_at(t, 0)
    }

    /// Every placed tensor with its first storage: (tensor id, storage id).
    pub fn placed(&self) -> impl Iterator<Item = (TensorId, StorageId)> + '_ {
        self.group_of
            .iter()
            .enumerate()
            .filter_map(|(t, gid)| gid.map(|gid| (t as TensorId, self.segments[gid][0].1)))
    }

    /// The storage group of tensor `t` (None: external, never used, or no tensor of this plan).
    pub fn group(&self, t: TensorId) -> Option<GroupId> {
        self.group_of.get(t as usize).copied().flatten()
    }

    /// Storages of the group of tensor `t`, in time order.
    pub fn storages_of(&self, t: TensorId) -> impl Iterator<Item = StorageId> + '_ {
        self.group(t)
            .into_iter()
            .flat_map(move |g| self.segments[g].iter().map(|s| s.1))
    }

    /// The storages a [`Phase::Move`] at `eo` reads and writes: (from, to) — the segment of its group
    /// that ends at `eo` and the one that begins there. None when `eo` is no move, or the move has no
    /// value to read (nothing wrote the group before it).
    pub fn move_storages(&self, eo: Eo) -> Option<(StorageId, StorageId)> {
        let t = self.program.get(eo as usize)?.moved()?;
        let segs = &self.segments[self.group(t)?];
        let k = segs.iter().position(|&(start, _)| start == eo)?;
        let from = segs[k.checked_sub(1)?].1;
        (self.lives[from].last == eo).then_some((from, segs[k].1))
    }

    /// Number of execution orders in one step.
    pub fn n_eo(&self) -> u32 {
        self.program.len() as u32
    }

    /// Bytes of the arena in use at each execution order: the highest end of any host storage live there.
    pub fn pool_profile(&self) -> Vec<usize> {
        let mut p = vec![0usize; self.program.len()];
        for (s, l) in self.lives.iter_enumerated() {
            if l.space != SpaceId::HOST {
                continue;
            }
            let top = self.offsets[s] + l.bytes;
            for v in &mut p
                [l.first as usize..=(l.last as usize).min(self.program.len().saturating_sub(1))]
            {
                *v = (*v).max(top);
            }
        }
        p
    }
}
