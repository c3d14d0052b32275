//! The cost model: time per instruction as `fixed + per_sample × n`, per node and phase. Estimated from
//! FLOPs and bytes by default; a host replaces it with measurements from a profiling step
//! ([`CostModel::fit`]), which is what makes the policy search pick the plan that is fastest *on this
//! device*.
use alloc::vec;
use alloc::vec::Vec;

use crate::graph::{Graph, NodeOp};
use crate::plan::{Instr, Phase, Plan};

/// Phases with their own costs (Recompute costs a Forward).
const PHASES: usize = 5;

fn slot(p: Phase) -> usize {
    match p {
        // A recurrent layer's time steps cost a step of its forward or derivative each.
        Phase::Forward | Phase::Recompute | Phase::StepFwd => 0,
        Phase::GradW => 1,
        Phase::GradX | Phase::StepBwd => 2,
        Phase::Apply => 3,
        Phase::Loss => 4,
        // Swaps are not modelled (`instr_ns` prices them at 0); any slot will do.
        Phase::SpillOut | Phase::SpillIn | Phase::Pack | Phase::Unpack | Phase::Move => 3,
    }
}

/// Whether instruction phase `p` is measured as phase `ph` by [`CostModel::fit`] (a recurrent layer's
/// time steps as its forward and derivative).
fn same(p: Phase, ph: Phase) -> bool {
    p == ph
        || matches!(
            (p, ph),
            (Phase::StepFwd, Phase::Forward) | (Phase::StepBwd, Phase::GradX)
        )
}

/// Per node (plus one for the loss) and phase: `(fixed ns, ns per sample)`.
#[derive(Clone, Debug, PartialEq)]
pub struct CostModel {
    /// `costs[node][phase] = (fixed_ns, per_sample_ns)`; the last row is the loss.
    pub costs: Vec<[(f64, f64); PHASES]>,
    /// Whether the numbers were measured on this device (else estimated).
    pub measured: bool,
}

/// FLOPs of one sample of `node` in `phase` (the estimate's basis, and the "extra FLOPs" of recomputes).
pub fn flops_per_sample(g: &Graph, node: usize, phase: Phase) -> u64 {
    let Some(n) = g.nodes.get(node) else {
        return 2 * g.pred_dims().numel() as u64 * 4;
    };
    let out = n.out_dims.numel() as u64;
    let inp = n.in_dims[0].numel() as u64;
    match (&n.op, phase) {
        (
            NodeOp::Linear { fin, fout },
            Phase::Forward | Phase::Recompute | Phase::GradW | Phase::GradX,
        ) => 2 * (*fin as u64) * (*fout as u64) * n.op.rows_per_sample(inp as usize) as u64,
        (NodeOp::Lora(l), Phase::Forward | Phase::Recompute | Phase::GradW | Phase::GradX) => {
            let rows = n.op.rows_per_sample(inp as usize) as u64;
            2 * rows * (l.fin * l.fout + l.rank * (l.fin + l.fout)) as u64
        }
        (NodeOp::Attention(a), Phase::Forward | Phase::Recompute | Phase::GradX) => {
            // Q·Kᵀ and P·V (forward); four products of the same size backward, five in recompute
            // mode (Q·Kᵀ again, tile by tile).
            let k = match phase {
                Phase::GradX if a.recompute_probs => 5,
                Phase::GradX => 4,
                _ => 2,
            };
            k * 2 * (a.seq * a.seq * a.dim) as u64
        }
        (NodeOp::Rnn(r), Phase::Forward | Phase::Recompute | Phase::GradW | Phase::GradX) => {
            // The recurrent GEMM of every step (h·W_hhᵀ forward, dg·W_hh and dgᵀ·h backward).
            2 * (r.seq * r.gate_width() * r.hidden) as u64
        }
        // One time step's recurrent GEMM.
        (NodeOp::Rnn(r), Phase::StepFwd | Phase::StepBwd) => 2 * (r.gate_width() * r.hidden) as u64,
        (NodeOp::Norm { .. }, _) => 8 * out,
        (NodeOp::Conv(c), Phase::Forward | Phase::Recompute | Phase::GradW | Phase::GradX) => {
            2 * (c.cin / c.groups * c.kh * c.kw) as u64 * out
        }
        (_, Phase::Apply) => 0,
        (NodeOp::BatchNorm { .. }, _) => 6 * out,
        (_, _) => out.max(inp),
    }
}

impl CostModel {
    /// An estimate: FLOPs at `gflops` GFLOP/s plus memory traffic, plus a fixed per-instruction overhead.
    pub fn estimate(g: &Graph) -> CostModel {
        const GFLOPS: f64 = 40.0;
        const FIXED_NS: f64 = 1500.0;
        let mut costs = Vec::with_capacity(g.nodes.len() + 1);
        for i in 0..=g.nodes.len() {
            let mut row = [(0.0, 0.0); PHASES];
            for (k, ph) in [
                Phase::Forward,
                Phase::GradW,
                Phase::GradX,
                Phase::Apply,
                Phase::Loss,
            ]
            .into_iter()
            .enumerate()
            {
                // A recurrent layer's forward and derivative run one instruction per time step:
                // their rows price one step.
                let steps = g
                    .nodes
                    .get(i)
                    .and_then(|n| n.bptt)
                    .map_or(1, |b| b.steps.max(1));
                let per_step = matches!(ph, Phase::Forward | Phase::GradX) && steps > 1;
                let ph = match (ph, per_step) {
                    (Phase::Forward, true) => Phase::StepFwd,
                    (Phase::GradX, true) => Phase::StepBwd,
                    _ => ph,
                };
                let f = flops_per_sample(g, i, ph) as f64;
                let bytes = g.nodes.get(i).map_or(0.0, |n| {
                    8.0 * (n.out_dims.numel() + n.in_dims[0].numel()) as f64
                        / if per_step { f64::from(steps) } else { 1.0 }
                });
                let params: f64 = g.nodes.get(i).map_or(0.0, |n| {
                    n.params
                        .iter()
                        .map(|p| p.shape.iter().product::<usize>() as f64)
                        .sum()
                });
                row[k] = if ph == Phase::Apply {
                    (FIXED_NS + params * 1.0, 0.0)
                } else {
                    (FIXED_NS, f / GFLOPS + bytes / 10.0)
                };
            }
            costs.push(row);
        }
        CostModel {
            costs,
            measured: false,
        }
    }

    /// Fits `fixed + per_sample × n` per node and phase from instruction times measured at two batch
    /// sizes `(n1, ns1)` and `(n2, ns2)` (`ns[i]` = nanoseconds of instruction i of the respective plan's
    /// single-micro-batch program). Instructions are matched by (node, phase).
    pub fn fit(g: &Graph, a: (&Plan, usize, &[f64]), b: (&Plan, usize, &[f64])) -> CostModel {
        let mut m = CostModel::estimate(g);
        let total = |p: &Plan, ns: &[f64], node: u16, ph: Phase| -> Option<f64> {
            let v: f64 = p
                .program
                .iter()
                .zip(ns)
                .filter(|(i, _)| i.node == node && same(i.phase, ph))
                .map(|(_, t)| *t)
                .sum();
            // A recurrent layer's time steps: the mean of its steps (its row prices one step).
            let k = p
                .program
                .iter()
                .filter(|i| i.node == node && same(i.phase, ph))
                .count()
                .max(1);
            (v > 0.0).then_some(v / k as f64)
        };
        for (i, row) in m.costs.iter_mut().enumerate() {
            let node = if i == g.nodes.len() {
                crate::plan::LOSS_NODE
            } else {
                i as u16
            };
            for ph in [
                Phase::Forward,
                Phase::GradW,
                Phase::GradX,
                Phase::Apply,
                Phase::Loss,
            ] {
                if let (Some(t1), Some(t2)) = (total(a.0, a.2, node, ph), total(b.0, b.2, node, ph))
                {
                    let (n1, n2) = (a.1 as f64, b.1 as f64);
                    let per = if n2 != n1 {
                        ((t2 - t1) / (n2 - n1)).max(0.0)
                    } else {
                        t1 / n1
                    };
                    let fixed = (t1 - per * n1).max(0.0);
                    row[slot(ph)] = (fixed, per);
                }
            }
        }
        m.measured = true;
        m
    }

    /// Predicted nanoseconds of one instruction on `n` samples.
    pub fn instr_ns(&self, ins: &Instr, n: usize) -> f64 {
        if ins.spilled().is_some() || ins.moved().is_some() {
            return 0.0; // moving bytes to the host's spill store or another space is not modelled
        }
        let row = if ins.phase == Phase::Loss {
            self.costs.last()
        } else {
            self.costs.get(ins.node as usize)
        };
        let (f, p) = row.map_or((0.0, 0.0), |r| r[slot(ins.phase)]);
        f + p * if ins.phase == Phase::Apply {
            0.0
        } else {
            n as f64
        }
    }

    /// Predicted milliseconds of one step of `plan` on its full batch.
    pub fn step_ms(&self, plan: &Plan) -> f64 {
        let b = plan.graph.batch;
        plan.program
            .iter()
            .map(|i| self.instr_ns(i, b))
            .sum::<f64>()
            / 1e6
    }

    /// Sage's tipping point: the smallest micro-batch size whose predicted samples/s is at least
    /// `efficiency` of the whole batch's, for a model realised as `g` (batch `full`).
    pub fn efficient_micro_batch(&self, g: &Graph, full: usize, efficiency: f64) -> usize {
        let step = |b: usize| -> f64 {
            let m = full.div_ceil(b);
            let mut t = 0.0;
            for (i, n) in g.nodes.iter().enumerate() {
                // A recurrent layer's forward and derivative rows price one time step.
                let steps = n.bptt.map_or(1.0, |b| f64::from(b.steps));
                for ph in [Phase::Forward, Phase::GradW, Phase::GradX] {
                    let (f, p) = self.costs[i][slot(ph)];
                    let k = if ph == Phase::GradW { 1.0 } else { steps };
                    t += m as f64 * k * (f + p * b as f64);
                }
            }
            let (f, p) = self.costs[g.nodes.len()][slot(Phase::Loss)];
            t + m as f64 * (f + p * b as f64)
        };
        // samples/s(b) = full / step(b): efficient iff step(b) ≤ step(full) / efficiency.
        let limit = step(full) / efficiency;
        (1..=full).find(|&b| step(b) <= limit).unwrap_or(full)
    }

    /// Nanoseconds to run `chain` (recompute instructions) on `n` samples.
    pub fn chain_ns(&self, chain: &[Instr], n: usize) -> f64 {
        chain.iter().map(|i| self.instr_ns(i, n)).sum()
    }
}

/// All zeros for a graph (used by tests that want only memory effects).
pub fn zero(g: &Graph) -> CostModel {
    CostModel {
        costs: vec![[(1.0, 1.0); PHASES]; g.nodes.len() + 1],
        measured: false,
    }
}
