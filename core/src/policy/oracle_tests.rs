//! The chain oracle: on a chain of N equal layers, with memory for s checkpoints, Melon's progressive
//! recomputation ([`recompute`]) re-runs at most 10% more forward ops than the Revolve/binomial optimum
//! (Griewank & Walther, "Algorithm 799: revolve", ACM TOMS 26(1), 2000).
//!
//! # The oracle
//!
//! Reversing a chain `x_0 → x_1 → … → x_n` where the backward of step `i` needs its *input* `x_{i-1}`,
//! `x_0` is always available and `s` further states may be kept at once ("slots"; the state being advanced
//! is held apart and advanced in place), the fewest forward steps are (advance `k` steps, keep `x_k` in a
//! slot, reverse the last `n − k` steps with one slot fewer, then the first `k` with the slot back)
//!
//! ```text
//! opt(1, s) = 0,   opt(n, 0) = n(n−1)/2,   opt(n, s) = min_{1≤k<n} k + opt(n−k, s−1) + opt(k, s).
//! ```
//!
//! `opt` counts every advance, including the first sweep to `x_{n-1}`, but not the forward of the step
//! being reversed. Revolve's closed form counts the checkpoints *including* the one holding `x_0`: with
//! `β(c, t) = C(c + t, c)` and `r` the unique integer with `β(c, r−1) < n ≤ β(c, r)`, the minimum is
//! `r·n − β(c+1, r−1)`, so `opt(n, s)` is it at `c = s + 1` (checked below for n ≤ 60, s ≤ 10).
//!
//! A training step runs the `N` forwards once anyway (the sweep's `N − 1` advances plus the last layer's
//! forward, which feeds the loss), so the optimal number of *recomputed* forward ops is
//! `opt(N, s) − (N − 1)`.
//!
//! # The chain
//!
//! `N` trainable depthwise 1×1 convolutions without bias (a per-channel scale, `C` weights) on a `C×H×W`
//! input, softmax cross-entropy over the `C·H·W` outputs, plain SGD (no optimizer state). Why:
//! - The output of a convolution has its own storage (no in-place merge: only activations, dropout and
//!   add write into their input — a ReLU after a conv would merge into the conv's output and make "one
//!   activation" ambiguous), and its backward needs exactly its *input*: `CG` reads `x_{i-1}` and `d x_i`,
//!   `CD` only `d x_i` and the weight. That is Revolve's model: reversing step `i` needs `x_{i-1}`.
//! - The first layer's input is the external batch, never in the arena: Revolve's free `x_0`. (Layer 1
//!   has no `CD`: nothing upstream needs a derivative.)
//! - The loss's `d(pred)` merges into the prediction (nothing reads the prediction after the loss).
//! - Depthwise convolutions run the direct kernel: no scratch at all. Linear layers (and pointwise
//!   convolutions) reserve GEMM packing scratch per instruction that is several activations large at
//!   small sizes, which would blur "one activation per checkpoint".
//! - Trainable, not frozen: a frozen layer saves no input (its `CD` needs only the weight), so a frozen
//!   chain has nothing to recompute. The weights (64 B each after alignment) and the one gradient alive
//!   at a time are the whole fixed part; every activation and derivative is `A = batch·C·H·W·4` bytes.
//! - Every layer costs the same in [`CostModel::estimate`], so one recompute is one unit of work.
//!
//! # "Memory for s checkpoints"
//!
//! frugal's memory model is finer than Revolve's: a forward reads `x_{j-1}` and writes `x_j` into another
//! storage (two working activations, Revolve advances in place), and during the backward the pending
//! derivative `d x_i` is a third. So the Revolve schedule with `s` slots needs up to `s + 3` activations
//! (when it advances two or more steps with every slot full), but only `s + 2` where it never does.
//! Instead of guessing, the test *builds* the optimal Revolve schedule with `s` slots as a frugal program
//! (forwards in order, then the backward instructions with the DP's recompute chains before them), lays
//! it out with [`Plan::from_program`] (the memory model and layouts `recompute` itself uses), checks that it
//! trains bit-identically to the plain plan, and takes as the budget the fixed part plus its peak in
//! whole activations (`M`). At that budget a schedule with the Revolve optimum's recompute count provably
//! fits, so frugal's count must be within 10% of it.
//!
//! frugal may *beat* Revolve's count at that budget: `s` and `s + 1` slots can need the same `M` (e.g.
//! N = 8: s = 1 and s = 2 both need 4 activations), and a one-step advance costs one working activation,
//! not two. For the analysis the test also computes the optimum of nested (Revolve-shaped) schedules in
//! frugal's exact memory model at `M` activations ([`exact_dp`], checked by building and running its
//! programs); the table prints it but asserts only the Revolve bound the task asks for.
use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use std::println;

use super::*;
use crate::model::{Dims, LayerKind, LayerSpec, LossKind, ModelSpec, OptimizerSpec, Src};
use crate::plan::tests::run_steps;
use crate::plan::{Plan, LOSS_NODE};

// ---------------------------------------------------------------------------------------------------------
// The Revolve oracle
// ---------------------------------------------------------------------------------------------------------

/// `C(n, k)` exactly (small arguments).
fn binom(n: u64, k: u64) -> u64 {
    if k > n {
        return 0;
    }
    let k = k.min(n - k);
    let mut r: u128 = 1;
    for i in 0..k {
        r = r * (n - i) as u128 / (i + 1) as u128;
    }
    r as u64
}

/// Griewank's `β(c, t) = C(c + t, c)`; 0 for `t < 0`.
fn beta(c: u64, t: i64) -> u64 {
    if t < 0 {
        0
    } else {
        binom(c + t as u64, c)
    }
}

/// Revolve's minimal number of forward steps to reverse `n` steps with `c ≥ 1` checkpoints, counting the
/// one that holds the initial state.
fn revolve_forwards(n: u64, c: u64) -> u64 {
    assert!(n >= 1 && c >= 1);
    let mut r: i64 = 0;
    while beta(c, r) < n {
        r += 1;
    }
    assert!(beta(c, r - 1) < n && n <= beta(c, r));
    r as u64 * n - beta(c + 1, r - 1)
}

/// The dynamic programme: `(opt, split)` for `n ≤ max_n`, `s ≤ max_s`; `opt[n][s]` as in the module docs,
/// `split[n][s]` the `k` of an optimal first advance (0 when there is none: `n = 1` or `s = 0`).
fn revolve_dp(max_n: usize, max_s: usize) -> (Vec<Vec<u64>>, Vec<Vec<usize>>) {
    let mut opt = vec![vec![0u64; max_s + 1]; max_n + 1];
    let mut split = vec![vec![0usize; max_s + 1]; max_n + 1];
    for n in 2..=max_n {
        opt[n][0] = (n * (n - 1) / 2) as u64;
        for s in 1..=max_s {
            let (mut best, mut arg) = (u64::MAX, 0);
            for k in 1..n {
                let v = k as u64 + opt[n - k][s - 1] + opt[k][s];
                if v < best {
                    (best, arg) = (v, k);
                }
            }
            opt[n][s] = best;
            split[n][s] = arg;
        }
    }
    (opt, split)
}

/// Revolve's optimal number of recomputed forward ops in one training step of an `n`-layer chain with `s`
/// slots besides the input.
fn revolve_recomputes(n: usize, s: usize) -> u64 {
    revolve_forwards(n as u64, s as u64 + 1) - (n as u64 - 1)
}

#[test]
fn revolve_closed_form_matches_the_dynamic_programme() {
    let (opt, _) = revolve_dp(60, 10);
    for (n, row) in opt.iter().enumerate().skip(1) {
        for (s, &o) in row.iter().enumerate() {
            assert_eq!(
                revolve_forwards(n as u64, s as u64 + 1),
                o,
                "n = {n}, s = {s} slots besides the input"
            );
        }
    }
    // Only the input: quadratic. n − 1 slots: one sweep. Griewank's example: 24 steps, 2 checkpoints.
    assert_eq!(opt[10][0], 45);
    assert_eq!(opt[10][9], 9);
    assert_eq!(revolve_forwards(24, 2), 88);
}

// ---------------------------------------------------------------------------------------------------------
// The nested optimum in frugal's memory model (analysis only)
// ---------------------------------------------------------------------------------------------------------

const INF: u64 = u64::MAX / 4;

/// Nested schedules in frugal's exact memory model, counted in activations beyond the fixed part: a
/// forward `x_{j-1} → x_j` needs both (one when `x_{j-1}` is a kept checkpoint or the input), `CG_i` needs
/// `x_{i-1}` and `d x_i`, `CD_i` needs `d x_i` and `d x_{i-1}` (written where `x_{i-1}` was), the loss's
/// derivative is the prediction.
///
/// `back[n][m]`: recomputes to reverse layers `b+1 ..= b+n` with `x_b` kept and `d x_{b+n}` pending (both
/// outside `m`) and `m` free activations. Advance `k` steps (`k` recomputes; 1 free activation for `k = 1`,
/// 2 otherwise), keep `x_{b+k}`, reverse `b+k+1 ..= b+n` with `m − 1`, then `b+1 ..= b+k` with `m` (the
/// new pending `d x_{b+k}` took `x_{b+k}`'s place, `d x_{b+n}`'s is free). `back[1][m] = 0`.
///
/// `sweep[n][m]`: the same for the first sweep (`b + n = N`, nothing pending, forwards are not
/// recomputes): `sweep[1][m] = 0` for `m ≥ 1` (the last forward, the loss, `CG`, `CD`), else
/// `min_k sweep[n−k][m−1] + back[k][m−1]`.
///
/// Returns `(back, sweep, back_split, sweep_split)`.
#[allow(clippy::type_complexity)]
fn exact_dp(
    max_n: usize,
    max_m: usize,
) -> (
    Vec<Vec<u64>>,
    Vec<Vec<u64>>,
    Vec<Vec<usize>>,
    Vec<Vec<usize>>,
) {
    let need = |k: usize| if k == 1 { 1 } else { 2 };
    let mut back = vec![vec![INF; max_m + 1]; max_n + 1];
    let mut sweep = vec![vec![INF; max_m + 1]; max_n + 1];
    let mut bs = vec![vec![0usize; max_m + 1]; max_n + 1];
    let mut ss = vec![vec![0usize; max_m + 1]; max_n + 1];
    for m in 0..=max_m {
        back[1][m] = 0;
        if m >= 1 {
            sweep[1][m] = 0;
        }
    }
    for n in 2..=max_n {
        for m in 1..=max_m {
            for k in 1..n {
                if m < need(k) {
                    continue;
                }
                let v = k as u64 + back[n - k][m - 1] + back[k][m];
                if v < back[n][m] {
                    back[n][m] = v;
                    bs[n][m] = k;
                }
                let v = sweep[n - k][m - 1] + back[k][m - 1];
                if v < sweep[n][m] {
                    sweep[n][m] = v;
                    ss[n][m] = k;
                }
            }
            back[n][m] = back[n][m].min(INF);
            sweep[n][m] = sweep[n][m].min(INF);
        }
    }
    (back, sweep, bs, ss)
}

// ---------------------------------------------------------------------------------------------------------
// The chain and programs for it
// ---------------------------------------------------------------------------------------------------------

const C: u32 = 4;
const HW: u32 = 8;
const BATCH: usize = 4;

/// Bytes of one activation (and of one derivative) of the chain.
const A: usize = BATCH * (C * HW * HW) as usize * 4;

/// `n` trainable depthwise 1×1 convolutions without bias.
fn chain(n: usize) -> ModelSpec {
    let layers = (0..n)
        .map(|i| LayerSpec {
            name: format!("dw{i}"),
            kind: LayerKind::Conv2d {
                out: C,
                kernel: [1, 1],
                stride: [1, 1],
                padding: [0, 0],
                groups: C,
                bias: false,
            },
            inputs: vec![if i == 0 {
                Src::Input
            } else {
                Src::Layer(i as u32 - 1)
            }],
            trainable: true,
            update: crate::model::Update::All,
        })
        .collect();
    ModelSpec {
        input: Dims::new(C, HW, HW),
        layers,
        loss: LossKind::SoftmaxCrossEntropy,
        optimizer: OptimizerSpec::Sgd {
            lr: 0.05,
            momentum: 0.0,
            weight_decay: 0.0,
        },
        seed: 11,
    }
}

/// The fixed part of every plan of the chain: weights, plus the one weight gradient alive at a time.
fn fixed_bytes(p: &Plan) -> usize {
    let persistent: usize = p
        .lives
        .iter()
        .filter(|l| l.kind.persistent())
        .map(|l| l.bytes)
        .sum();
    let grad = p
        .lives
        .iter()
        .filter(|l| l.kind == TensorKind::Gradient)
        .map(|l| l.bytes)
        .max()
        .unwrap_or(0);
    persistent + grad
}

/// Emits a chain program. State `x_j` is the output of node `j − 1` (`x_0` the external input); reversing
/// layer `i` runs node `i − 1`'s CG, CD and apply, with `x_{i-1}` current.
struct Emitter<'a> {
    g: &'a Graph,
    ran: Vec<bool>,
    program: Vec<Instr>,
}

impl<'a> Emitter<'a> {
    fn new(g: &'a Graph) -> Self {
        Emitter {
            g,
            ran: vec![false; g.nodes.len()],
            program: Vec::new(),
        }
    }

    fn push(&mut self, node: u16, phase: Phase) {
        self.program.push(Instr {
            node,
            phase,
            mb: 0,
            placement: Default::default(),
            step: 0,
        });
    }

    /// Computes `x_{from+1} ..= x_to` from `x_from`.
    fn advance(&mut self, from: usize, to: usize) {
        for j in from + 1..=to {
            let phase = if self.ran[j - 1] {
                Phase::Recompute
            } else {
                Phase::Forward
            };
            self.ran[j - 1] = true;
            self.push(j as u16 - 1, phase);
        }
    }

    /// Reverses layer `i` with `x_{i-1}` current (the last layer's forward and the loss first).
    fn reverse_one(&mut self, i: usize) {
        let node = i - 1;
        if i == self.g.nodes.len() {
            assert!(!self.ran[node]);
            self.ran[node] = true;
            self.push(node as u16, Phase::Forward);
            self.push(LOSS_NODE, Phase::Loss);
        }
        let nd = &self.g.nodes[node];
        let (w, x) = (nd.has_grad_w(), nd.has_grad_x(self.g));
        if w {
            self.push(node as u16, Phase::GradW);
        }
        if x {
            self.push(node as u16, Phase::GradX);
        }
        if w {
            self.push(node as u16, Phase::Apply);
        }
    }

    fn finish(self) -> Vec<Instr> {
        assert!(self.ran.iter().all(|&r| r));
        self.program
    }
}

/// The optimal Revolve schedule with `s` slots as a frugal program.
fn revolve_program(g: &Graph, s: usize) -> Vec<Instr> {
    fn rev(e: &mut Emitter, split: &[Vec<usize>], base: usize, n: usize, s: usize) {
        if n == 1 {
            e.reverse_one(base + 1);
        } else if s == 0 {
            for j in (1..=n).rev() {
                e.advance(base, base + j - 1);
                e.reverse_one(base + j);
            }
        } else {
            let k = split[n][s];
            e.advance(base, base + k);
            rev(e, split, base + k, n - k, s - 1);
            rev(e, split, base, k, s);
        }
    }
    let n = g.nodes.len();
    let (_, split) = revolve_dp(n, s);
    let mut e = Emitter::new(g);
    rev(&mut e, &split, 0, n, s);
    e.finish()
}

/// The nested optimum of [`exact_dp`] with `m` free activations as a frugal program (None: infeasible).
fn exact_program(g: &Graph, m: usize) -> Option<Vec<Instr>> {
    struct T<'t> {
        bs: &'t [Vec<usize>],
        ss: &'t [Vec<usize>],
    }
    fn back(e: &mut Emitter, t: &T, b: usize, n: usize, m: usize) {
        if n == 1 {
            e.reverse_one(b + 1);
            return;
        }
        let k = t.bs[n][m];
        e.advance(b, b + k);
        back(e, t, b + k, n - k, m - 1);
        back(e, t, b, k, m);
    }
    fn sweep(e: &mut Emitter, t: &T, b: usize, n: usize, m: usize) {
        if n == 1 {
            e.reverse_one(b + 1);
            return;
        }
        let k = t.ss[n][m];
        e.advance(b, b + k);
        sweep(e, t, b + k, n - k, m - 1);
        back(e, t, b, k, m - 1);
    }
    let n = g.nodes.len();
    let (_, sw, bs, ss) = exact_dp(n, m);
    if sw[n][m] >= INF {
        return None;
    }
    let mut e = Emitter::new(g);
    sweep(&mut e, &T { bs: &bs, ss: &ss }, 0, n, m);
    Some(e.finish())
}

fn plan_of(g: &Graph, program: Vec<Instr>) -> Plan {
    Schedule::with_program(g, 1, program).plan()
}

fn recomputes(p: &Plan) -> usize {
    p.program
        .iter()
        .filter(|i| i.phase == Phase::Recompute)
        .count()
}

/// Analysis only, a prototype for the policy: removes recompute instructions, last first, while the plan
/// still fits `limit` (repeated until nothing more goes). On this chain dropping a recompute is always
/// correct — nothing but node `j − 1` writes `x_j`, so readers see the same value from an earlier
/// producer; in general a removal is valid only where that holds (in-place groups, BatchNorm statistics).
fn prune(g: &Graph, p: &Plan, limit: usize) -> Plan {
    let mut program = p.program.clone();
    loop {
        let mut changed = false;
        for i in (0..program.len()).rev() {
            if program[i].phase != Phase::Recompute {
                continue;
            }
            let mut q = program.clone();
            q.remove(i);
            if plan_of(g, q.clone()).arena_bytes <= limit {
                program = q;
                changed = true;
            }
        }
        if !changed {
            return plan_of(g, program);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Self-checks of the programs and the memory model
// ---------------------------------------------------------------------------------------------------------

#[test]
fn chain_memory_is_fixed_part_plus_whole_activations() {
    for n in [4, 8, 12] {
        let g = Graph::new(&chain(n), BATCH).unwrap();
        // No scratch, no in-place merges besides d(pred) into the prediction.
        assert!(g
            .nodes
            .iter()
            .all(|nd| nd.scratch.iter().all(Option::is_none)));
        let plain = Plan::new(g.clone());
        let fixed = fixed_bytes(&plain);
        assert_eq!(fixed, n * ALIGN + ALIGN);
        // The plain plan keeps x_1 … x_N (x_N turns into d x_N at the loss): N activations.
        assert_eq!(plain.arena_bytes, fixed + n * A, "N = {n}");
        assert_eq!(plain.arena_bytes, plain.lower_bound);
    }
}

#[test]
fn revolve_and_exact_programs_are_valid_and_match_their_oracles() {
    let n = 8;
    let g = Graph::new(&chain(n), BATCH).unwrap();
    let plain = Plan::new(g.clone());
    let fixed = fixed_bytes(&plain);
    let reference = run_steps(&plain, 2);
    let same = |p: &Plan| {
        run_steps(p, 2)
            .iter()
            .zip(&reference)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    };
    let (_, sweep, _, _) = exact_dp(n, n);
    for s in 0..n {
        let p = plan_of(&g, revolve_program(&g, s));
        assert_eq!(recomputes(&p) as u64, revolve_recomputes(n, s), "s = {s}");
        assert!(
            same(&p),
            "the Revolve program with s = {s} changed the result"
        );
        // Within s + 3 activations (s slots, the forward's two working activations, the derivative).
        assert!(p.arena_bytes <= fixed + (s + 3) * A, "s = {s}");
        println!(
            "revolve N={n} s={s}: {} activations, recomputes {}",
            (p.arena_bytes - fixed) as f64 / A as f64,
            recomputes(&p)
        );
    }
    for (m, &optimum) in sweep[n].iter().enumerate() {
        let Some(prog) = exact_program(&g, m) else {
            // Reversing needs the pending derivative and a forward's two activations.
            assert!(m < 3, "m = {m}");
            continue;
        };
        let p = plan_of(&g, prog);
        assert_eq!(recomputes(&p) as u64, optimum, "m = {m}");
        assert!(p.arena_bytes <= fixed + m * A, "m = {m}");
        assert!(
            same(&p),
            "the exact program with m = {m} changed the result"
        );
        println!("exact N={n} m={m}: recomputes {}", recomputes(&p));
    }
    // With N activations nothing is recomputed.
    assert_eq!(sweep[n][n], 0);
}

// ---------------------------------------------------------------------------------------------------------
// frugal against the oracle
// ---------------------------------------------------------------------------------------------------------

/// One row of the table.
#[derive(Clone, Copy, Debug)]
#[allow(dead_code)]
struct Row {
    n: usize,
    s: usize,
    /// Budget passed to `recompute`: the fixed part plus the Revolve program's activations.
    budget: usize,
    /// Activations that budget holds beyond the fixed part.
    units: usize,
    /// Revolve's optimal recomputes with `s` slots.
    revolve: u64,
    /// Nested optimum in frugal's memory model at `units`.
    exact: u64,
    /// frugal's recomputes (None: it found no plan within the budget).
    frugal: Option<usize>,
    /// frugal's plan after [`prune`] (analysis only).
    pruned: Option<usize>,
    /// Arena of frugal's plan (the smallest it reached when it found none).
    frugal_arena: usize,
}

impl Row {
    fn within(&self, percent: u64) -> bool {
        self.frugal
            .is_some_and(|c| c as u64 * 100 <= self.revolve * (100 + percent))
    }
    fn print(&self) {
        let ratio = |c: Option<usize>, o: u64| -> String {
            match (c, o) {
                (Some(0), 0) => "1.000".into(),
                (Some(_), 0) => "inf".into(),
                (Some(c), o) => format!("{:.3}", c as f64 / o as f64),
                (None, _) => "no fit".into(),
            }
        };
        let count = |c: Option<usize>| c.map_or(String::from("-"), |c| format!("{c}"));
        println!(
            "| {:>3} | {:>2} | {:>6} | {:>2} | {:>7} | {:>5} | {:>6} | {:>8} | {:>7} | {:>6} |",
            self.n,
            self.s,
            self.budget,
            self.units,
            self.revolve,
            self.exact,
            count(self.frugal),
            ratio(self.frugal, self.revolve),
            ratio(self.frugal, self.exact),
            count(self.pruned),
        );
    }
}

fn header() {
    println!("activation A = {A} B");
    println!("|   N |  s | budget |  M | revolve | exact | frugal | /revolve |  /exact | pruned |");
}

/// Runs frugal's recompute at the budget of the optimal Revolve schedule with `s` slots.
fn measure(n: usize, s: usize) -> Row {
    let g = Graph::new(&chain(n), BATCH).unwrap();
    let rev = plan_of(&g, revolve_program(&g, s));
    let revolve = revolve_recomputes(n, s);
    assert_eq!(recomputes(&rev) as u64, revolve, "N={n} s={s}");
    // Whole activations at every instruction: the fixed part (weights and one gradient) plus the most
    // activations and derivatives the Revolve program keeps at once.
    let fixed = fixed_bytes(&rev);
    let units = (rev.arena_bytes - fixed).div_ceil(A);
    let budget = fixed + units * A + ALIGN - 1;
    assert!(rev.needed_bytes() <= budget);
    let (_, sweep, _, _) = exact_dp(n, units);
    let exact = sweep[n][units];
    assert!(exact <= revolve);
    let cost = CostModel::estimate(&g);
    let (frugal, pruned, frugal_arena) = match recompute(&g, 1, budget, &cost) {
        Ok(p) => {
            assert!(p.needed_bytes() <= budget);
            let q = prune(&g, &p, budget - (ALIGN - 1));
            if n == 8 {
                let (a, b) = (run_steps(&p, 2), run_steps(&q, 2));
                assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
            }
            (Some(recomputes(&p)), Some(recomputes(&q)), p.arena_bytes)
        }
        Err(p) => (None, None, p.arena_bytes),
    };
    Row {
        n,
        s,
        budget,
        units,
        revolve,
        exact,
        frugal,
        pruned,
        frugal_arena,
    }
}

/// The task's grid.
const GRID: [(usize, usize); 16] = [
    (8, 1),
    (8, 2),
    (8, 3),
    (8, 4),
    (12, 1),
    (12, 2),
    (12, 3),
    (12, 4),
    (16, 1),
    (16, 2),
    (16, 3),
    (16, 4),
    (24, 1),
    (24, 2),
    (24, 3),
    (24, 4),
];

/// Prints the whole table; the two tests below assert the bound.
#[test]
fn chain_oracle_table() {
    header();
    for (n, s) in GRID {
        measure(n, s).print();
    }
}

/// Cases where frugal's recompute count is within 10% of the Revolve optimum.
const PASSING: &[(usize, usize)] = &[
    (8, 1),
    (8, 3),
    (8, 4),
    (12, 1),
    (12, 2),
    (16, 1),
    (16, 2),
    (16, 3),
    (24, 1),
    (24, 2),
    (24, 3),
];

/// Cases where it is not yet (frugal / Revolve: 5/4, 9/7, 7/6, 13/10, 25/21): the same 10% bound,
/// failing until the policy is fixed. Cause: Melon's loop never takes a recompute back. A value discarded
/// at an early overflow point (the forward/backward peak) is regenerated before its next use even when,
/// by then, later discards and freed checkpoints leave room to keep an earlier regeneration alive: the
/// plans contain `r5 r6 r7 CD8 CD7 r5` where the second `r5` is redundant. Dropping recomputes while the
/// plan still fits ([`prune`]) meets the bound in every case of the grid (the table's last column).
const FAILING: &[(usize, usize)] = &[(8, 2), (12, 3), (12, 4), (16, 4), (24, 4)];

#[test]
fn chain_recompute_within_10_percent_of_revolve() {
    header();
    for &(n, s) in PASSING {
        let r = measure(n, s);
        r.print();
        assert!(r.within(10), "{r:?}");
    }
}

#[test]
fn chain_recompute_within_10_percent_of_revolve_formerly_missed() {
    header();
    let mut bad = Vec::new();
    for &(n, s) in FAILING {
        let r = measure(n, s);
        r.print();
        if !r.within(10) {
            bad.push(r);
        }
    }
    assert!(bad.is_empty(), "beyond 10% of the Revolve optimum: {bad:?}");
}
