//! Which part of a network a sparse update trains ([`Update`]), chosen under a memory and a compute
//! budget.
//!
//! The importance of a layer's output channel is the **gradient-norm proxy** of TinyTrain (Kwon et al.,
//! "TinyTrain: Resource-Aware Task-Adaptive Sparse Training of DNNs at the Data-Scarce Edge", ICML'24,
//! §3.2, which uses the Fisher information of the activations; its appendix compares the cheaper
//! gradient-norm proxy): the squared norm of the loss gradient of the channel's parameters — weight row
//! and bias — summed over a few batches of the new task at the pretrained weights ([`Importance`], filled
//! by `exec::importance`). It is computed once, before fine-tuning.
//!
//! [`select`] then grows the update greedily, as TinyTrain's selection does by importance per unit of
//! cost: starting from nothing, each round raises one layer by one level — frozen → bias only → ⅛ → ¼ →
//! ½ → all of its output channels — the raise with the most importance gained per byte of arena it adds,
//! among those whose whole plan fits the memory budget ([`Plan::needed_bytes`], measured by planning it,
//! not estimated) and the compute budget (the backward pass's multiply-adds, [`backward_flops`]). It
//! stops when no raise fits.
use alloc::vec::Vec;

use crate::graph::{Graph, GraphError, NodeOp};
use crate::model::{LayerKind, ModelSpec, Update};
use crate::plan::Plan;

/// Per layer of the spec (index = layer index; empty for a layer without parameters): the importance of
/// each output channel, and of the bias alone.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Importance {
    /// Σ over batches of ‖∂L/∂(row c of every parameter)‖², per output channel c.
    pub rows: Vec<Vec<f64>>,
    /// Σ over batches of ‖∂L/∂bias‖² (β for BatchNorm; 0 without a bias).
    pub bias: Vec<f64>,
}

/// The budgets a selection must fit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SparseBudget {
    /// Most arena bytes of the fine-tuning plan at the batch size.
    pub arena_bytes: usize,
    /// Most multiply-adds of one step's backward pass ([`backward_flops`]).
    pub backward_flops: u64,
}

/// A layer's update as the selection sees it: `None` frozen, else its [`Update`].
pub type Choice = Option<Update>;

/// The channel fractions a layer is raised through, after "bias only".
const FRACTIONS: [f32; 3] = [0.125, 0.25, 0.5];

/// `spec` with layer `i` updated as `choices[i]` says (layers without parameters keep theirs).
pub fn apply(spec: &ModelSpec, choices: &[Choice]) -> ModelSpec {
    let mut s = spec.clone();
    for (l, c) in s.layers.iter_mut().zip(choices) {
        if has_params(&l.kind) {
            l.trainable = c.is_some();
            l.update = c.unwrap_or_default();
        }
    }
    s
}

/// The "last k layers" baseline: the last `k` layers with parameters update fully, the rest are frozen.
pub fn last_k(spec: &ModelSpec, k: usize) -> Vec<Choice> {
    let mut left = k;
    let mut out: Vec<Choice> = alloc::vec![None; spec.layers.len()];
    for (i, l) in spec.layers.iter().enumerate().rev() {
        if has_params(&l.kind) && left > 0 {
            out[i] = Some(Update::All);
            left -= 1;
        }
    }
    out
}

fn has_params(k: &LayerKind) -> bool {
    matches!(
        k,
        LayerKind::Linear { .. } | LayerKind::Conv2d { .. } | LayerKind::BatchNorm2d { .. }
    )
}

fn has_bias(k: &LayerKind) -> bool {
    match k {
        LayerKind::Linear { bias, .. } | LayerKind::Conv2d { bias, .. } => *bias,
        LayerKind::BatchNorm2d { .. } => true,
        _ => false,
    }
}

/// Multiply-adds of one step's backward pass: each weight gradient (its updated rows) and each input
/// derivative the graph computes; BatchNorm and element-wise layers count a few per element.
pub fn backward_flops(g: &Graph) -> u64 {
    let n = g.batch as u64;
    let mut total = 0u64;
    for node in &g.nodes {
        let gx = node.has_grad_x(g);
        let rows = node
            .params
            .iter()
            .find(|p| p.grad.is_some())
            .map_or(0, |p| {
                (p.updated / p.shape.iter().skip(1).product::<usize>().max(1)) as u64
            });
        let w_grad = node.params.first().is_some_and(|p| p.grad.is_some());
        let out = node.out_dims.numel() as u64;
        total += match &node.op {
            NodeOp::Linear { fin, fout } => {
                let (fin, fout) = (*fin as u64, *fout as u64);
                n * fin * (if w_grad { rows } else { 0 } + if gx { fout } else { 0 })
                    + if node.params.get(1).is_some_and(|p| p.grad.is_some()) {
                        n * rows
                    } else {
                        0
                    }
            }
            NodeOp::Conv(c) => {
                let per_row = n * (c.oh * c.ow) as u64 * (c.weight_len() / c.cout) as u64;
                per_row * (if w_grad { rows } else { 0 } + if gx { c.cout as u64 } else { 0 })
                    + n * out * (rows > 0) as u64
            }
            NodeOp::BatchNorm { .. } => n * out * (2 * (rows > 0) as u64 + 3 * gx as u64),
            _ => n * out * gx as u64,
        };
    }
    total
}

/// Why a selection failed.
#[derive(Clone, Debug, PartialEq)]
pub enum SelectError {
    /// The importance does not cover the model's layers.
    Importance,
    /// Not even the cheapest update (one layer's bias or smallest channel subset) fits the budgets.
    NothingFits,
    /// A candidate could not be realised.
    Graph(GraphError),
}

/// The levels layer `i` can be raised to, lowest first, with their importance.
fn levels(spec: &ModelSpec, imp: &Importance, i: usize) -> Vec<(Update, f64)> {
    let l = &spec.layers[i];
    let rows = &imp.rows[i];
    let c = rows.len();
    let mut out = Vec::new();
    if has_bias(&l.kind) {
        out.push((Update::Bias, imp.bias[i]));
    }
    let mut last = 0;
    for f in FRACTIONS {
        let r = Update::Channels(f).rows(c, false).unwrap_or(0);
        if r > last && r < c {
            out.push((Update::Channels(f), rows[..r].iter().sum()));
            last = r;
        }
    }
    out.push((Update::All, rows.iter().sum()));
    out
}

/// The plan's arena and backward multiply-adds of `spec` with `choices` at `batch`.
fn cost(spec: &ModelSpec, choices: &[Choice], batch: usize) -> Result<(usize, u64), GraphError> {
    let g = Graph::new(&apply(spec, choices), batch)?;
    let f = backward_flops(&g);
    Ok((Plan::new(g).needed_bytes(), f))
}

/// Picks each layer's update for fine-tuning `spec` at `batch` under `budget`, greedily by importance
/// per arena byte (module docs). Returns the choices (apply them with [`apply`]).
pub fn select(
    spec: &ModelSpec,
    batch: usize,
    imp: &Importance,
    budget: SparseBudget,
) -> Result<Vec<Choice>, SelectError> {
    let n = spec.layers.len();
    if imp.rows.len() != n || imp.bias.len() != n {
        return Err(SelectError::Importance);
    }
    let lv: Vec<Vec<(Update, f64)>> = (0..n)
        .map(|i| {
            if has_params(&spec.layers[i].kind) && !imp.rows[i].is_empty() {
                levels(spec, imp, i)
            } else {
                Vec::new()
            }
        })
        .collect();
    // Current level per layer: 0 frozen, k ≥ 1 the k-th entry of its levels.
    let mut at = alloc::vec![0usize; n];
    let mut choices: Vec<Choice> = alloc::vec![None; n];
    let (mut bytes, mut score) = (0usize, 0f64);
    loop {
        let mut best: Option<(f64, usize, usize, f64)> = None; // (gain, layer, bytes, score)
        for i in 0..n {
            let Some(&(u, s)) = lv[i].get(at[i]) else {
                continue;
            };
            let prev = if at[i] == 0 { 0.0 } else { lv[i][at[i] - 1].1 };
            let mut cand = choices.clone();
            cand[i] = Some(u);
            let (b, f) = match cost(spec, &cand, batch) {
                Ok(c) => c,
                Err(GraphError::Loss(_)) => continue,
                Err(e) => return Err(SelectError::Graph(e)),
            };
            if b > budget.arena_bytes || f > budget.backward_flops {
                continue;
            }
            // Importance gained per KiB added (a raise that adds no bytes counts as one KiB).
            let gain = (s - prev).max(0.0) / (b.saturating_sub(bytes).max(1024) as f64);
            if best.is_none_or(|x| gain > x.0) {
                best = Some((gain, i, b, score - prev + s));
            }
        }
        let Some((_, i, b, s)) = best else { break };
        choices[i] = Some(lv[i][at[i]].0);
        at[i] += 1;
        bytes = b;
        score = s;
    }
    if choices.iter().all(Option::is_none) {
        return Err(SelectError::NothingFits);
    }
    Ok(choices)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::sparse_tests::mbv2_like;

    fn imp(spec: &ModelSpec) -> Importance {
        let g = Graph::new(spec, 1).unwrap();
        let rows = g
            .nodes
            .iter()
            .map(|n| {
                let c = n.params.first().map_or(0, |p| p.shape[0]);
                // Later layers and leading channels matter more.
                (0..c)
                    .map(|r| (n.layer + 1) as f64 / (r + 1) as f64)
                    .collect()
            })
            .collect::<Vec<Vec<f64>>>();
        let bias = rows.iter().map(|r| r.iter().sum::<f64>() / 8.0).collect();
        Importance { rows, bias }
    }

    #[test]
    fn selection_fits_both_budgets_and_grows_with_them() {
        let spec = mbv2_like(&[]);
        let batch = 4;
        let full = Graph::new(&spec, batch).unwrap();
        let (full_flops, full_bytes) = (backward_flops(&full), Plan::new(full).needed_bytes());
        let imp = imp(&spec);
        let mut last_trained = 0usize;
        // Budgets between the classifier alone and the full update.
        let head = cost(&spec, &last_k(&spec, 1), batch).unwrap().0;
        assert!(head < full_bytes);
        for frac in [0.0, 0.3, 0.6, 1.0] {
            let budget = SparseBudget {
                arena_bytes: head + ((full_bytes - head) as f64 * frac) as usize,
                backward_flops: full_flops,
            };
            let c = select(&spec, batch, &imp, budget).unwrap();
            let (b, f) = cost(&spec, &c, batch).unwrap();
            assert!(b <= budget.arena_bytes && f <= budget.backward_flops);
            let trained = c.iter().flatten().count();
            assert!(trained >= last_trained, "a larger budget trains less");
            last_trained = trained;
        }
        // The whole budget: everything trains fully.
        let budget = SparseBudget {
            arena_bytes: full_bytes,
            backward_flops: full_flops,
        };
        let c = select(&spec, batch, &imp, budget).unwrap();
        assert_eq!(apply(&spec, &c), apply(&spec, &last_k(&spec, 9)));
        // A compute budget below the classifier's alone: nothing fits.
        let budget = SparseBudget {
            arena_bytes: full_bytes,
            backward_flops: 1,
        };
        assert_eq!(
            select(&spec, batch, &imp, budget),
            Err(SelectError::NothingFits)
        );
        // A compute budget bounds the backward pass.
        let budget = SparseBudget {
            arena_bytes: full_bytes,
            backward_flops: full_flops / 4,
        };
        let c = select(&spec, batch, &imp, budget).unwrap();
        assert!(cost(&spec, &c, batch).unwrap().1 <= full_flops / 4);
        assert_ne!(
            apply(&spec, &c),
            apply(&spec, &last_k(&spec, 9)),
            "a quarter of the compute trains everything"
        );
    }

    #[test]
    fn last_k_updates_the_last_layers_with_parameters() {
        let spec = mbv2_like(&[]);
        let c = last_k(&spec, 2);
        let on: Vec<usize> = (0..c.len()).filter(|&i| c[i].is_some()).collect();
        assert_eq!(on, [10, 14]);
        let g = Graph::new(&apply(&spec, &c), 2).unwrap();
        assert!(g.nodes[..10].iter().all(|n| !n.has_grad_w()));
    }

    #[test]
    fn backward_flops_shrink_with_the_update() {
        let spec = mbv2_like(&[]);
        let f = |c: &[Choice]| backward_flops(&Graph::new(&apply(&spec, c), 4).unwrap());
        let full = f(&last_k(&spec, 9));
        let head = f(&last_k(&spec, 1));
        let mut half = last_k(&spec, 9);
        for c in half.iter_mut().flatten() {
            *c = Update::Channels(0.5);
        }
        assert!(
            head < f(&half) && f(&half) < full,
            "{head} {} {full}",
            f(&half)
        );
    }
}
