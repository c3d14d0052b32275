//! Proactive swap (NNTrainer §4.3): instead of keeping an activation in the arena from its forward use to
//! its backward use, move it out to the host's [`Spill`](crate::spill::Spill) store right after its last
//! use before the gap ([`Phase::SpillOut`]) and back in `lookahead` instructions before its next use
//! ([`Phase::SpillIn`], a fresh write that starts a new lifetime segment the layout places like any
//! other). In between, its bytes are free for other tensors. `lookahead = 0` is on-demand swapping (back
//! in right before the use); a larger lookahead lets the host read it in the background
//! ([`Spill::prefetch`](crate::spill::Spill::prefetch)) while earlier instructions compute, at the price
//! of holding the bytes a little longer.
//!
//! Run swap plans with [`Executor::train_step_spilled`](crate::exec::Executor::train_step_spilled).
//! Swapping only moves bytes: the results are bit-identical to the plain plan's.
use alloc::vec;
use alloc::vec::Vec;

use crate::graph::{Graph, TensorId, TensorKind};
use crate::plan::{Eo, GroupId, IdVec, Instr, Phase, Plan, Schedule, ALIGN};

use super::live_profile;
use crate::sort::heap_sort_by_key;

/// One gap of a storage that could be swapped: its value is needed again at `next` after `last`.
#[derive(Clone, Copy)]
pub(crate) struct Gap {
    /// The tensor the swap names (a member of the storage's group).
    pub(crate) tensor: TensorId,
    /// Last use before the gap.
    pub(crate) last: Eo,
    /// Where the swap-in goes (the instruction it precedes).
    pub(crate) at: Eo,
    /// Bytes of the storage.
    pub(crate) bytes: usize,
    /// Next use after the gap.
    pub(crate) next: Eo,
}

/// Plans one training step of `g` (whole batch, no micro-batching) that fits `budget` bytes (as
/// [`Plan::needed_bytes`]) by swapping activations out of the arena. Starting from the plain schedule, it
/// repeatedly picks, among the gaps between two uses of an activation storage that span the fullest
/// overflowing execution order (and end after the loss), the one with the largest bytes × gap, inserts a
/// swap-out right after its last use before the gap and a swap-in `lookahead` compute instructions before
/// its next use (as many as the gap allows, never before the loss), and lays the program out again, until
/// the arena fits. Returns `Err` with the smallest plan reached when nothing more can be swapped.
#[allow(clippy::result_large_err)] // like `policy::recompute`: both outcomes are whole plans
pub fn plan_swap(g: &Graph, lookahead: usize, budget: usize) -> Result<Plan, Plan> {
    let mut s = Schedule::new(g);
    let limit = budget.saturating_sub(ALIGN - 1);
    let mut best: Option<Plan> = None;
    // Each round swaps one more gap; a step has at most one gap per storage and use.
    for _ in 0..=s.program.len() {
        let plan = s.plan();
        if plan.arena_bytes <= limit {
            return Ok(plan);
        }
        let Some(gap) = pick_gap(&plan, lookahead, limit) else {
            return Err(smaller(best, plan));
        };
        best = Some(smaller(best, plan));
        let (Some(out), Some(inn)) = (
            Instr::spill(Phase::SpillOut, gap.tensor, 0),
            Instr::spill(Phase::SpillIn, gap.tensor, 0),
        ) else {
            break; // pick_gap only returns representable tensors
        };
        // Swap-in first (the later index), then the swap-out right after the last use.
        s.program.insert(gap.at as usize, inn);
        s.program.insert(gap.last as usize + 1, out);
    }
    Err(smaller(best, s.plan()))
}

fn smaller(best: Option<Plan>, p: Plan) -> Plan {
    match best {
        Some(b) if b.arena_bytes <= p.arena_bytes => b,
        _ => p,
    }
}

/// The gap to swap next: among the swappable gaps that would free their bytes at the fullest overflowing
/// execution order (by bytes live; then the next fullest), the largest bytes × gap.
fn pick_gap(p: &Plan, lookahead: usize, limit: usize) -> Option<Gap> {
    let gaps = gaps(p, lookahead);
    let live = live_profile(p);
    let pool = p.pool_profile();
    let mut points: Vec<Eo> = (0..p.n_eo())
        .filter(|&t| live[t as usize] > limit || pool[t as usize] > limit)
        .collect();
    heap_sort_by_key(&mut points, |&t| (core::cmp::Reverse(live[t as usize]), t));
    if points.is_empty() {
        // The layout overflows although no instruction does on its own: free the fullest point.
        points.extend(
            pool.iter()
                .enumerate()
                .max_by_key(|x| x.1)
                .map(|x| x.0 as Eo),
        );
    }
    for t in points {
        // The storage is free for the instructions between the swap-out and the swap-in.
        let covering = gaps.iter().filter(|gp| gp.last < t && t < gp.at);
        if let Some(gp) = covering.max_by_key(|gp| gp.bytes as u64 * (gp.next - gp.last) as u64) {
            return Some(*gp);
        }
    }
    None
}

/// Every swappable gap of `p`: consecutive uses `last < next` of an activation storage whose next use
/// comes after the loss, where the swap-in (`lookahead` compute instructions before `next`, fewer in a
/// short gap, and after the loss) leaves the storage free for at least one instruction.
pub(crate) fn gaps(p: &Plan, lookahead: usize) -> Vec<Gap> {
    let prog = &p.program;
    let Some(loss) = prog.iter().position(|i| i.phase == Phase::Loss) else {
        return Vec::new();
    };
    let loss = loss as Eo;
    // A member of each group to name in the swap (its root when possible).
    let mut member: IdVec<GroupId, Option<TensorId>> = vec![None; p.segments.len()].into();
    for (t, gid) in p.group_of.iter().enumerate() {
        if let Some(gid) = *gid {
            let m = &mut member[gid];
            if m.is_none() || p.roots[t] as usize == t {
                *m = Some(t as TensorId);
            }
        }
    }
    let mut out = Vec::new();
    for (gid, segs) in p.segments.iter_enumerated() {
        let Some(tensor) = member[gid] else { continue };
        if Instr::spill(Phase::SpillOut, tensor, 0).is_none() {
            continue; // the id does not fit in `Instr::node`
        }
        for &(_, s) in segs {
            let life = &p.lives[s];
            if life.kind != TensorKind::Activation {
                continue;
            }
            for w in p.touches[s].windows(2) {
                let (last, next) = (w[0], w[1]);
                let spill = |e: Eo| prog[e as usize].spilled().is_some();
                // Swap-ins go after the loss (evaluation runs the forward part only, without a store).
                if next <= loss + 1 || spill(last) || spill(next) {
                    continue;
                }
                // Back `lookahead` compute instructions from `next`; in a shorter gap, as early as still
                // frees the storage for one instruction; never before the loss.
                let mut at = next;
                let mut k = 0;
                while k < lookahead && at > (last + 2).max(loss + 1) {
                    at -= 1;
                    if !spill(at) {
                        k += 1;
                    }
                }
                if at >= last + 2 && at > loss {
                    out.push(Gap {
                        tensor,
                        last,
                        at,
                        bytes: life.bytes,
                        next,
                    });
                }
            }
        }
    }
    out
}

/// Swap pairs in one step of `plan` and the bytes each direction moves per step.
pub fn swap_volume(plan: &Plan) -> (usize, usize) {
    let mut pairs = 0;
    let mut bytes = 0;
    for (eo, ins) in plan.program.iter().enumerate() {
        if ins.phase == Phase::SpillOut {
            if let Some(s) = ins.spilled().and_then(|t| plan.storage_at(t, eo as Eo)) {
                pairs += 1;
                bytes += plan.lives[s].bytes;
            }
        }
    }
    (pairs, bytes)
}

#[cfg(test)]
mod tests {
    use alloc::vec::Vec;

    use proptest::prelude::*;

    use super::*;
    use crate::exec::{ExecError, Executor, Target};
    use crate::format::{decode_plan, encode_plan};
    use crate::model::{LayerKind, ModelSpec};
    use crate::plan::tests::{random_model, run_steps};
    use crate::spill::{MemSpill, Spill, SpillError};

    /// conv-relu-pool ×2 + linear on 16×16 (the small CNN shape), no BatchNorm.
    fn cnn() -> ModelSpec {
        random_model(
            &[
                (0, 2, true),
                (3, 0, true),
                (4, 0, true),
                (0, 2, true),
                (3, 0, true),
                (4, 0, true),
            ],
            1,
            16,
            1,
        )
    }

    fn data(p: &Plan, n: usize) -> (Vec<f32>, Vec<u32>) {
        let per = p.graph.input_dims.numel();
        let mut rng = crate::rng::Rng::new(3);
        let x: Vec<f32> = (0..n * per).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let y: Vec<u32> = (0..n).map(|i| (i % 3) as u32).collect();
        (x, y)
    }

    /// Like `plan::tests::run_steps`, through `spill`: the losses, then every persistent tensor.
    fn run_spilled(p: &Plan, steps: usize, spill: &mut dyn Spill) -> Vec<f32> {
        let mut arena = vec![0xA5u8; p.needed_bytes()];
        let mut ex = Executor::new(p, &arena).unwrap();
        ex.init_params(&mut arena, 9).unwrap();
        let (x, y) = data(p, p.batch());
        let mut out = Vec::new();
        for _ in 0..steps {
            let st = ex.train_step_spilled(&mut arena, &x, Target::Classes(&y), spill);
            out.push(st.unwrap().loss);
        }
        for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
            out.extend_from_slice(ex.read(&mut arena, t).unwrap());
        }
        out
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    fn swaps(p: &Plan, phase: Phase) -> usize {
        p.program.iter().filter(|i| i.phase == phase).count()
    }

    /// A spill store that fails its `n`-th write or read (counting from 0), like a full disk.
    struct Failing {
        inner: MemSpill,
        writes: usize,
        reads: usize,
        fail_write: Option<usize>,
        fail_read: Option<usize>,
    }

    impl Spill for Failing {
        fn write(&mut self, key: u32, data: &[u8]) -> Result<(), SpillError> {
            self.writes += 1;
            if self.fail_write == Some(self.writes - 1) {
                return Err(SpillError::Write { key, os: Some(28) });
            }
            self.inner.write(key, data)
        }
        fn read(&mut self, key: u32, out: &mut [u8]) -> Result<(), SpillError> {
            self.reads += 1;
            if self.fail_read == Some(self.reads - 1) {
                return Err(SpillError::Read { key, os: None });
            }
            self.inner.read(key, out)
        }
    }

    fn failing(fail_write: Option<usize>, fail_read: Option<usize>) -> Failing {
        Failing {
            inner: MemSpill::new(),
            writes: 0,
            reads: 0,
            fail_write,
            fail_read,
        }
    }

    #[test]
    fn swapping_is_bit_identical_and_shrinks_the_arena() {
        let g = Graph::new(&cnn(), 8).unwrap();
        let plain = Plan::new(g.clone());
        let want = run_steps(&plain, 3);
        for lookahead in [0, 1, 3] {
            let p = match plan_swap(&g, lookahead, 0) {
                Ok(p) | Err(p) => p,
            };
            assert!(swaps(&p, Phase::SpillOut) > 0);
            assert_eq!(swaps(&p, Phase::SpillOut), swaps(&p, Phase::SpillIn));
            assert!(
                p.arena_bytes < plain.arena_bytes,
                "lookahead {lookahead}: {} !< {}",
                p.arena_bytes,
                plain.arena_bytes
            );
            let (pairs, bytes) = swap_volume(&p);
            // The store's lookahead only decides when swap-ins are announced.
            for ahead in [0, 2, 5] {
                let mut spill = MemSpill::new();
                spill.lookahead = ahead;
                let got = run_spilled(&p, 3, &mut spill);
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "lookahead {lookahead}, ahead {ahead}"
                );
                assert_eq!(spill.written, 3 * bytes);
                assert_eq!(spill.read, 3 * bytes);
                // Every swap-in is announced once per step when the store asks, never on demand.
                let want_prefetches = if ahead == 0 { 0 } else { 3 * pairs };
                assert_eq!(spill.prefetches, want_prefetches, "lookahead {lookahead}");
            }
        }
    }

    /// Logs every call: prefetches come after the key's write and before its read, `lookahead`
    /// instructions ahead of the swap-in (as far as the swap-out allows).
    #[test]
    fn prefetches_follow_the_write_and_lead_the_read() {
        struct Log<'a> {
            inner: MemSpill,
            events: Vec<(char, u32, usize)>,
            eo: &'a core::cell::Cell<usize>,
        }
        impl Spill for Log<'_> {
            fn write(&mut self, key: u32, data: &[u8]) -> Result<(), SpillError> {
                self.events.push(('w', key, self.eo.get()));
                self.inner.write(key, data)
            }
            fn read(&mut self, key: u32, out: &mut [u8]) -> Result<(), SpillError> {
                self.events.push(('r', key, self.eo.get()));
                self.inner.read(key, out)
            }
            fn prefetch(&mut self, key: u32, _: usize) {
                self.events.push(('p', key, self.eo.get()));
            }
            fn lookahead(&self) -> usize {
                2
            }
        }
        let g = Graph::new(&cnn(), 8).unwrap();
        let (Ok(p) | Err(p)) = plan_swap(&g, 1, 0);
        let mut arena = vec![0u8; p.needed_bytes()];
        let mut ex = Executor::new(&p, &arena).unwrap();
        ex.init_params(&mut arena, 9).unwrap();
        let (x, y) = data(&p, 8);
        let now = core::cell::Cell::new(0);
        let mut log = Log {
            inner: MemSpill::new(),
            events: Vec::new(),
            eo: &now,
        };
        // The observer runs after each instruction: the next one's index is then `eo + 1`.
        let mut obs = |eo: usize, _: &Instr, _: &[u8]| now.set(eo + 1);
        ex.train_step_spilled_observed(&mut arena, &x, Target::Classes(&y), &mut log, &mut obs)
            .unwrap();
        let swaps = swaps(&p, Phase::SpillIn);
        assert_eq!(log.events.iter().filter(|e| e.0 == 'p').count(), swaps);
        for (i, &(op, key, eo)) in log.events.iter().enumerate() {
            let before = log.events[..i]
                .iter()
                .rev()
                .find(|e| e.1 == key)
                .map(|e| e.0);
            match op {
                'p' => {
                    assert_eq!(before, Some('w'));
                    // Announced exactly 2 instructions before its swap-in, or right after the swap-out.
                    let read = log.events[i..]
                        .iter()
                        .find(|e| e.1 == key && e.0 == 'r')
                        .unwrap()
                        .2;
                    let wrote = log.events[..i].iter().rev().find(|e| e.1 == key).unwrap().2;
                    assert!(
                        read - eo == 2 || eo == wrote + 1,
                        "{op} {key} at {eo}, read at {read}"
                    );
                }
                'r' => assert!(matches!(before, Some('w' | 'p'))),
                _ => {}
            }
        }
    }

    #[test]
    fn a_fitting_budget_is_met_and_the_swap_ins_lead_their_uses() {
        let g = Graph::new(&cnn(), 8).unwrap();
        let plain = Plan::new(g.clone());
        let (Ok(min) | Err(min)) = plan_swap(&g, 3, 0);
        let budget = (min.needed_bytes() + plain.needed_bytes()) / 2;
        let p = plan_swap(&g, 3, budget).unwrap();
        assert!(p.needed_bytes() <= budget);
        assert!(plan_swap(&g, 3, plain.needed_bytes()).unwrap().program == plain.program);
        let loss = p
            .program
            .iter()
            .position(|i| i.phase == Phase::Loss)
            .unwrap();
        for (eo, ins) in p.program.iter().enumerate() {
            let Some(t) = ins.spilled() else { continue };
            let s = p.storage_at(t, eo as Eo).unwrap();
            match ins.phase {
                // A swap-out is its segment's last use; a swap-in its first, after the loss, with
                // three compute instructions before the next use (fewer only in a short gap).
                Phase::SpillOut => assert_eq!(p.lives[s].last, eo as Eo),
                _ => {
                    assert!(eo > loss);
                    assert_eq!(p.lives[s].first, eo as Eo);
                    let next = p.touches[s][1] as usize;
                    let compute = p.program[eo + 1..next]
                        .iter()
                        .filter(|i| i.spilled().is_none())
                        .count();
                    let out = (0..eo)
                        .rev()
                        .find(|&e| {
                            p.program[e].phase == Phase::SpillOut && p.program[e].node == ins.node
                        })
                        .unwrap();
                    let short = p.program[out + 1..eo]
                        .iter()
                        .filter(|i| i.spilled().is_none())
                        .count()
                        == 1;
                    assert!(
                        compute == 3 || (compute < 3 && (short || eo == loss + 1)),
                        "{compute} at {eo}"
                    );
                }
            }
        }
    }

    #[test]
    fn swap_plans_round_trip_and_bad_swaps_are_rejected() {
        let spec = cnn();
        let g = Graph::new(&spec, 4).unwrap();
        let (Ok(p) | Err(p)) = plan_swap(&g, 2, 0);
        let (_, q) = decode_plan(&encode_plan(&spec, &p)).unwrap();
        assert_eq!(q.program, p.program);
        assert_eq!(q.offsets, p.offsets);
        assert_eq!(q.arena_bytes, p.arena_bytes);
        // A swap naming a weight, or a tensor that does not exist, is not a plan.
        let w = g.nodes[0].params[0].value;
        for t in [w, g.tensors.len() as TensorId] {
            let mut bad = p.clone();
            let i = bad
                .program
                .iter()
                .position(|i| i.spilled().is_some())
                .unwrap();
            bad.program[i].node = t as u16;
            assert!(decode_plan(&encode_plan(&spec, &bad)).is_err());
        }
    }

    #[test]
    fn failed_swap_out_rejects_the_step_and_leaves_the_weights() {
        let g = Graph::new(&cnn(), 8).unwrap();
        let plain = Plan::new(g.clone());
        let (Ok(p) | Err(p)) = plan_swap(&g, 3, 0);
        let mut arena = vec![0u8; p.needed_bytes()];
        let mut ex = Executor::new(&p, &arena).unwrap();
        ex.init_params(&mut arena, 9).unwrap();
        let before: Vec<Vec<f32>> = ex
            .state_tensors()
            .map(|(_, _, t)| ex.read(&mut arena, t).unwrap().to_vec())
            .collect::<Vec<_>>();
        let (x, y) = data(&p, 8);
        for k in 0..swaps(&p, Phase::SpillOut) {
            let mut f = failing(Some(k), None);
            let e = ex
                .train_step_spilled(&mut arena, &x, Target::Classes(&y), &mut f)
                .unwrap_err();
            assert_eq!(
                e,
                ExecError::Spill(SpillError::Write {
                    key: p
                        .program
                        .iter()
                        .filter(|i| i.phase == Phase::SpillOut)
                        .nth(k)
                        .unwrap()
                        .node as u32,
                    os: Some(28)
                })
            );
            assert_eq!(ex.steps(), 0);
            let now: Vec<Vec<f32>> = ex
                .state_tensors()
                .map(|(_, _, t)| ex.read(&mut arena, t).unwrap().to_vec())
                .collect();
            assert_eq!(now, before);
        }
        // The executor carries on: the next step equals the plain plan's first.
        let mut good = MemSpill::new();
        let l = ex
            .train_step_spilled(&mut arena, &x, Target::Classes(&y), &mut good)
            .unwrap()
            .loss;
        let mut got = vec![l];
        for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
            got.extend_from_slice(ex.read(&mut arena, t).unwrap());
        }
        assert_eq!(bits(&got), bits(&run_steps(&plain, 1)));
    }

    #[test]
    fn failed_or_missing_swap_in_is_an_error_not_a_panic() {
        let g = Graph::new(&cnn(), 8).unwrap();
        let (Ok(p) | Err(p)) = plan_swap(&g, 0, 0);
        let mut arena = vec![0u8; p.needed_bytes()];
        let mut ex = Executor::new(&p, &arena).unwrap();
        ex.init_params(&mut arena, 9).unwrap();
        let (x, y) = data(&p, 8);
        let mut f = failing(None, Some(0));
        let e = ex.train_step_spilled(&mut arena, &x, Target::Classes(&y), &mut f);
        assert!(
            matches!(e, Err(ExecError::Spill(SpillError::Read { .. }))),
            "{e:?}"
        );
        // A store that lost everything: the first swap-in finds nothing.
        struct Forgetful;
        impl Spill for Forgetful {
            fn write(&mut self, _: u32, _: &[u8]) -> Result<(), SpillError> {
                Ok(())
            }
            fn read(&mut self, key: u32, out: &mut [u8]) -> Result<(), SpillError> {
                Err(SpillError::Missing {
                    key,
                    len: out.len(),
                })
            }
        }
        let e = ex.train_step_spilled(&mut arena, &x, Target::Classes(&y), &mut Forgetful);
        assert!(
            matches!(e, Err(ExecError::Spill(SpillError::Missing { .. }))),
            "{e:?}"
        );
        // Without a spill store, a swap plan is refused (before any update) rather than run wrongly.
        let e = ex.train_step(&mut arena, &x, Target::Classes(&y));
        assert!(matches!(e, Err(ExecError::BadPlan(_))), "{e:?}");
        // Evaluation runs the forward part only and needs no store.
        assert!(ex.evaluate(&mut arena, &x, Target::Classes(&y)).is_ok());
    }

    #[test]
    fn partial_batches_swap_too() {
        let g = Graph::new(&cnn(), 8).unwrap();
        let plain = Plan::new(g.clone());
        let (Ok(p) | Err(p)) = plan_swap(&g, 3, 0);
        let (x, y) = data(&p, 5);
        let mut a1 = vec![0u8; plain.needed_bytes()];
        let mut a2 = vec![0u8; p.needed_bytes()];
        let mut e1 = Executor::new(&plain, &a1).unwrap();
        let mut e2 = Executor::new(&p, &a2).unwrap();
        e1.init_params(&mut a1, 1).unwrap();
        e2.init_params(&mut a2, 1).unwrap();
        let mut spill = MemSpill::new();
        for _ in 0..2 {
            let s1 = e1.train_step(&mut a1, &x, Target::Classes(&y)).unwrap();
            let s2 = e2
                .train_step_spilled(&mut a2, &x, Target::Classes(&y), &mut spill)
                .unwrap();
            assert_eq!(s1.loss.to_bits(), s2.loss.to_bits());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// On random models (BatchNorm, dropout, residual adds included), any lookahead and budget: the
        /// plan fits when it says so, its layout is valid, and training is bit-identical to the plain plan.
        #[test]
        fn swap_is_bit_identical_and_fits(
            choices in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<bool>()), 1..10),
            c0 in 1u32..3, hw in 2u32..7, batch in 2usize..6, opt in any::<u8>(),
            lookahead in 0usize..5, frac in 0.0f64..1.0,
        ) {
            let spec = random_model(&choices, c0, hw, opt);
            let Ok(g) = Graph::new(&spec, batch) else { return Ok(()) };
            let plain = Plan::new(g.clone());
            let (Ok(min) | Err(min)) = plan_swap(&g, lookahead, 0);
            prop_assert!(min.arena_bytes <= plain.arena_bytes);
            let budget = min.needed_bytes()
                + ((plain.needed_bytes() - min.needed_bytes()) as f64 * frac) as usize;
            let p = match plan_swap(&g, lookahead, budget) { Ok(p) => p, Err(_) => return Ok(()) };
            prop_assert!(p.needed_bytes() <= budget);
            // The decoder re-checks that no two live storages overlap.
            prop_assert!(decode_plan(&encode_plan(&spec, &p)).is_ok());
            let a = run_steps(&plain, 2);
            let b = run_spilled(&p, 2, &mut MemSpill::new());
            prop_assert_eq!(bits(&a), bits(&b));
        }
    }

    #[test]
    fn models_without_spillable_gaps_return_the_plain_plan_as_err() {
        // A single linear layer: its only activation is the prediction, used right before the loss.
        let spec = random_model(&[], 2, 4, 0);
        assert!(spec
            .layers
            .iter()
            .all(|l| matches!(l.kind, LayerKind::Linear { .. } | LayerKind::Flatten)));
        let g = Graph::new(&spec, 4).unwrap();
        let plain = Plan::new(g.clone());
        match plan_swap(&g, 3, 0) {
            Ok(_) => panic!("a zero budget cannot fit"),
            Err(p) => assert_eq!(p.arena_bytes, plain.arena_bytes),
        }
    }
}
