//! Planning: the schedule of one training step (execution orders), every tensor's lifetime, storage
//! sharing by NNTrainer's Algorithm 1, and the layout of all storages in one arena. The result is a
//! [`Plan`]: a flat program of [`Instr`]s plus an offset for every tensor — what the executor runs.
mod layout;
#[cfg(test)]
mod tests;

use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

pub use layout::{
    lower_bound, strategies, BestFitBySize, FirstUseOrder, Layout, LayoutStrategy,
    LongestLifetimeFirst,
};

use crate::backend::Placement;
use crate::budget::{Budget, BudgetError};
use crate::graph::{scratch_slot, Graph, Node, NodeOp, Share, TensorId, TensorKind};

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
        }
    }
}

/// One instruction of a plan. `node` + `phase` + `mb` is its stable logical id, so two plans can be lined
/// up when the budget changes.
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
}

/// Node index used by the loss instruction.
pub const LOSS_NODE: u16 = u16::MAX;

/// The ordered program of one training step.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// Instructions; an instruction's index is its execution order.
    pub program: Vec<Instr>,
}

impl Schedule {
    /// NNTrainer's order: F for every layer, the loss, then per layer in reverse: CG, CD, apply. Applying
    /// right after a layer's derivative frees its gradient early.
    pub fn new(g: &Graph) -> Schedule {
        let mut program = Vec::new();
        let ins = |node: usize, phase| Instr {
            node: node as u16,
            phase,
            mb: 0,
            placement: Placement::Cpu,
        };
        for i in 0..g.nodes.len() {
            program.push(ins(i, Phase::Forward));
        }
        program.push(Instr {
            node: LOSS_NODE,
            phase: Phase::Loss,
            mb: 0,
            placement: Placement::Cpu,
        });
        for i in (0..g.nodes.len()).rev() {
            let n = &g.nodes[i];
            if n.has_grad_w() {
                program.push(ins(i, Phase::GradW));
            }
            if n.has_grad_x(g) {
                program.push(ins(i, Phase::GradX));
            }
            if n.has_grad_w() {
                program.push(ins(i, Phase::Apply));
            }
        }
        Schedule { program }
    }
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
    let n: &Node = &g.nodes[ins.node as usize];
    let weights = || n.params.iter().map(|p| p.value);
    match ins.phase {
        Phase::Forward => {
            out.extend(n.inputs.iter().copied());
            out.push(n.out);
            out.extend(weights());
            out.extend(n.stats.iter().copied());
            out.extend(n.saved.iter().copied());
            out.extend(n.scratch[scratch_slot::FWD]);
        }
        Phase::GradW => {
            out.extend(n.d_out);
            out.extend(n.params.iter().filter_map(|p| p.grad));
            out.extend(n.saved.iter().copied());
            out.extend(n.inputs.iter().copied());
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
        Phase::Loss => {}
    }
}

/// One storage of the arena: a tensor and everything merged into it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorLife {
    /// Name of the representative tensor.
    pub name: String,
    /// Kind of the representative tensor.
    pub kind: TensorKind,
    /// Bytes (aligned to [`ALIGN`]).
    pub bytes: usize,
    /// First execution order at which it must hold valid data.
    pub first: Eo,
    /// Last execution order (inclusive).
    pub last: Eo,
}

/// Result of lifetime analysis: storages and the tensor → storage map.
#[derive(Clone, Debug)]
pub struct Lifetimes {
    /// One entry per storage.
    pub lives: Vec<TensorLife>,
    /// For each tensor, its storage (None: external or never used).
    pub storage_of: Vec<Option<u32>>,
}

fn align_up(v: usize) -> usize {
    v.div_ceil(ALIGN) * ALIGN
}

/// Computes execution-order ranges per tensor and merges in-place and view tensors by NNTrainer's
/// Algorithm 1: a read-only view always merges with its target; a modify view merges only when its first
/// use is not before the target group's last use (the in-place write destroys nothing still needed).
pub fn lifetimes(g: &Graph, s: &Schedule) -> Lifetimes {
    lifetimes_with(g, s, true)
}

/// [`lifetimes`] with in-place sharing switchable off (`merge = false`: modify views get their own
/// storage; read-only views still merge, they are zero-byte by definition), which tests use as the oracle
/// for in-place correctness.
pub fn lifetimes_with(g: &Graph, s: &Schedule, merge: bool) -> Lifetimes {
    let nt = g.tensors.len();
    let end = s.program.len().saturating_sub(1) as Eo;
    let mut first = vec![Eo::MAX; nt];
    let mut last = vec![0 as Eo; nt];
    let mut buf = Vec::new();
    for (eo, ins) in s.program.iter().enumerate() {
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
    // Union-find over tensors; group range tracked at the root.
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
    order.sort_by_key(|&t| (first[t], t));
    for &t in &order {
        let (target, modify) = match g.tensors[t].share {
            Share::ModifyView(j) if merge => (j, true),
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
    let mut storage_of = vec![None; nt];
    let mut lives: Vec<TensorLife> = Vec::new();
    let mut root_storage: alloc::collections::BTreeMap<u32, u32> =
        alloc::collections::BTreeMap::new();
    for &t in &order {
        if g.tensors[t].kind == TensorKind::External || g.tensors[t].bytes == 0 {
            continue;
        }
        let r = root(&mut parent, t as u32);
        let sid = *root_storage.entry(r).or_insert_with(|| {
            let info = &g.tensors[r as usize];
            lives.push(TensorLife {
                name: info.name.clone(),
                kind: info.kind,
                bytes: 0,
                first: gfirst[r as usize],
                last: glast[r as usize],
            });
            (lives.len() - 1) as u32
        });
        let l = &mut lives[sid as usize];
        l.bytes = l.bytes.max(align_up(g.tensors[t].bytes));
        storage_of[t] = Some(sid);
    }
    Lifetimes { lives, storage_of }
}

/// A complete, runnable plan for one batch size.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The realised model.
    pub graph: Graph,
    /// The step's program.
    pub program: Vec<Instr>,
    /// Storages with lifetimes.
    pub lives: Vec<TensorLife>,
    /// Tensor → storage.
    pub storage_of: Vec<Option<u32>>,
    /// Storage offsets in the arena.
    pub offsets: Vec<usize>,
    /// Arena size in bytes (the layout's high-water mark).
    pub arena_bytes: usize,
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

    /// Like [`Plan::new`]; `sharing = false` disables in-place and view merging (a test oracle).
    pub fn with_sharing(g: Graph, sharing: bool) -> Plan {
        let sched = Schedule::new(&g);
        let lt = lifetimes_with(&g, &sched, sharing);
        let lb = lower_bound(&lt.lives);
        let mut best: Option<(Layout, &'static str)> = None;
        for s in strategies() {
            let l = s.layout(&lt.lives);
            if best
                .as_ref()
                .is_none_or(|(b, _)| l.arena_bytes < b.arena_bytes)
            {
                best = Some((l, s.name()));
            }
        }
        let (layout, strategy) = best.unwrap_or((
            Layout {
                offsets: Vec::new(),
                arena_bytes: 0,
            },
            "none",
        ));
        Plan {
            graph: g,
            program: sched.program,
            lives: lt.lives,
            storage_of: lt.storage_of,
            offsets: layout.offsets,
            arena_bytes: layout.arena_bytes,
            lower_bound: lb,
            strategy,
        }
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

    /// Arena byte range of tensor `t` (None if external).
    pub fn region(&self, t: TensorId) -> Option<(usize, usize)> {
        let s = self.storage_of.get(t as usize).copied().flatten()? as usize;
        Some((self.offsets[s], self.graph.tensors[t as usize].bytes))
    }

    /// Every tensor with its storage: (tensor id, storage id).
    pub fn placed(&self) -> impl Iterator<Item = (TensorId, u32)> + '_ {
        self.storage_of
            .iter()
            .enumerate()
            .filter_map(|(t, s)| s.map(|s| (t as TensorId, s)))
    }

    /// Number of execution orders in one step.
    pub fn n_eo(&self) -> u32 {
        self.program.len() as u32
    }
}
