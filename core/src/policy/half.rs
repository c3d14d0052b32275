//! fp16 storage (issue 4 §7): activations kept for the backward pass are stored as IEEE half, compute
//! stays f32.
//!
//! It is a schedule transform, like swap: every activation storage whose value is needed again after the
//! loss (a gap from its last forward use to its first backward use) gets a [`Phase::Pack`] right after
//! the last forward use — the f32 value is rounded into a half copy ([`Graph::add_half`], half the bytes)
//! and its f32 storage ends — and a [`Phase::Unpack`] right before the backward use, which widens it back
//! into a fresh f32 segment that lives only through the backward instructions that read it. The planner
//! sizes every tensor by its dtype and lays the program out as usual, so the arena, its lower bound and
//! the budget check all see the half-size copies.
//!
//! Only the values are approximated (round to nearest even, |x| ≤ 65504 — larger magnitudes saturate);
//! masks that come from the sign (ReLU) and max-pool indices (kept as u32) are exact. Evaluation and
//! prediction run the forward instructions only and never read a half copy.
use alloc::vec::Vec;

use super::swap::gaps;
use crate::graph::{Graph, TensorKind};
use crate::plan::{share_groups, Instr, Phase, Plan};
use crate::sort::heap_sort_by_key;

/// The plain single-micro-batch plan of `g` with every saved activation stored in fp16 between its
/// forward and backward uses.
pub fn f16_storage(g: &Graph) -> Plan {
    let base = Plan::new(g.clone());
    let mut events: Vec<(usize, Instr)> = Vec::new();
    for gap in gaps(&base, 0) {
        let (Some(pack), Some(unpack)) = (
            Instr::half(Phase::Pack, gap.tensor),
            Instr::half(Phase::Unpack, gap.tensor),
        ) else {
            continue; // the id does not fit in `Instr::node`
        };
        // Only values of layer outputs: saved extras (max-pool indices kept as u32 bits, BatchNorm
        // statistics) keep their exact bytes.
        if g.tensors[gap.tensor as usize].kind != TensorKind::Activation
            || !g.nodes.iter().any(|n| n.out == gap.tensor)
        {
            continue;
        }
        // Unpack before the next use, pack right after the last use before the gap.
        events.push((gap.at as usize, unpack));
        events.push((gap.last as usize + 1, pack));
    }
    // Insert from the back so earlier positions stay valid; packs and unpacks never share a position
    // (packs come before the loss, unpacks after it).
    heap_sort_by_key(&mut events, |e| core::cmp::Reverse((e.0, e.1.node)));
    let mut program = base.program.clone();
    for (at, ins) in events {
        program.insert(at, ins);
    }
    // Half copies are added in program order, the order the plan decoder re-creates them in.
    let mut g = g.clone();
    for ins in &program {
        if ins.phase == Phase::Pack {
            g.add_half(ins.node as u32);
        }
    }
    let roots = share_groups(&g, true);
    Plan::from_program(g, 1, program, roots)
}

/// Bytes of the activations kept across the loss: (as f32 in `plain`, as stored in `half`) — the
/// storages alive at the loss instruction whose kind is activation.
pub fn saved_activation_bytes(plan: &Plan) -> usize {
    let Some(loss) = plan.program.iter().position(|i| i.phase == Phase::Loss) else {
        return 0;
    };
    let loss = loss as u32;
    plan.lives
        .iter()
        .filter(|l| l.kind == TensorKind::Activation && l.first < loss && l.last > loss)
        .map(|l| l.bytes)
        .sum()
}

/// (f32 bytes, stored bytes) of the layer outputs a plan keeps in fp16 between forward and backward.
pub fn packed_bytes(plan: &Plan) -> (usize, usize) {
    let g = &plan.graph;
    g.halves.iter().fold((0, 0), |(a, b), &(x, h)| {
        (
            a + g.tensors[x as usize].bytes,
            b + g.tensors[h as usize].bytes,
        )
    })
}

#[cfg(test)]
mod tests {
    use alloc::vec;

    use proptest::prelude::*;

    use super::*;
    use crate::format::{decode_plan, encode_plan};
    use crate::model::ModelSpec;
    use crate::plan::tests::{random_model, run_steps};

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

    #[test]
    fn halves_the_saved_activations_and_shrinks_the_arena() {
        let g = Graph::new(&cnn(), 16).unwrap();
        let plain = Plan::new(g.clone());
        let half = f16_storage(&g);
        let (a, b) = (
            saved_activation_bytes(&plain),
            saved_activation_bytes(&half),
        );
        // Every packed layer output is stored at 2 bytes per element.
        let g2 = &half.graph;
        assert!(!g2.halves.is_empty());
        for &(x, h) in &g2.halves {
            assert_eq!(
                g2.tensors[h as usize].bytes * 2,
                g2.tensors[x as usize].bytes
            );
        }
        // What stays f32 across the loss: max-pool indices (u32) — here two of them, a quarter of the
        // values (2×2 windows); the layer outputs saved in this CNN shrink to half.
        let packed: usize = g2
            .halves
            .iter()
            .map(|&(x, _)| g2.tensors[x as usize].bytes)
            .sum();
        assert!(
            b <= a - packed / 2 + 64 * half.lives.len(),
            "{a} → {b}, packed {packed}"
        );
        assert!(b < a * 3 / 4, "{a} → {b}");
        // The arena's peak may sit where the first layers' backward unpacks its f32 values (as here), so
        // fp16 storage never grows the arena but need not shrink it.
        assert!(half.arena_bytes <= plain.arena_bytes + 64 * half.lives.len());
        assert!(half.program.iter().any(|i| i.phase == Phase::Pack));
        assert_eq!(
            half.program
                .iter()
                .filter(|i| i.phase == Phase::Pack)
                .count(),
            half.program
                .iter()
                .filter(|i| i.phase == Phase::Unpack)
                .count()
        );
    }

    #[test]
    fn round_trips_through_the_plan_format() {
        let spec = cnn();
        let p = f16_storage(&Graph::new(&spec, 8).unwrap());
        let (_, q) = decode_plan(&encode_plan(&spec, &p)).unwrap();
        assert_eq!(p.program, q.program);
        assert_eq!(p.offsets, q.offsets);
        assert_eq!(p.graph.halves, q.graph.halves);
        assert_eq!(run_steps(&p, 2), run_steps(&q, 2));
    }

    /// Element-wise relative difference of two loss/weight vectors.
    fn max_rel(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs() / x.abs().max(y.abs()).max(1e-3))
            .fold(0.0, f32::max)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
        /// fp16 storage trains like f32: after 3 steps of Adam, losses and weights agree to 2e-2
        /// relative. Half precision has a 2^-11 relative rounding error per stored value; through a few
        /// layers of backward and three Adam steps (whose first updates are ±lr·sign) that stays within
        /// about 1e-2; the bound leaves room for a weight whose update nearly cancels.
        #[test]
        fn trains_like_f32(choices in prop::collection::vec((0u8..8, 0u8..4, any::<bool>()), 1..7),
                           batch in 2usize..6, opt in 0u8..3) {
            let spec = random_model(&choices, 2, 8, opt);
            let Ok(g) = Graph::new(&spec, batch) else { return Ok(()) };
            let plain = run_steps(&Plan::new(g.clone()), 3);
            let half = run_steps(&f16_storage(&g), 3);
            prop_assert_eq!(plain.len(), half.len());
            prop_assert!(max_rel(&plain[..3], &half[..3]) < 2e-2, "losses {:?} vs {:?}", &plain[..3], &half[..3]);
            let n = plain.len();
            let diff: f32 = plain[3..].iter().zip(&half[3..]).map(|(a, b)| (a - b).abs()).sum();
            let norm: f32 = plain[3..].iter().map(|a| a.abs()).sum::<f32>().max(1e-6);
            prop_assert!(diff / norm < 2e-2, "weights differ by {} (norm-wise) over {n}", diff / norm);
        }
    }

    #[test]
    fn predict_and_evaluate_ignore_the_half_copies() {
        let g = Graph::new(&cnn(), 4).unwrap();
        let plain = Plan::new(g.clone());
        let half = f16_storage(&g);
        let per = g.input_dims.numel();
        let x: Vec<f32> = (0..4 * per).map(|i| (i % 7) as f32 / 7.0).collect();
        let mut pa = vec![0u8; plain.needed_bytes()];
        let mut ha = vec![0u8; half.needed_bytes()];
        let mut pe = crate::exec::Executor::new(&plain, &pa).unwrap();
        let mut he = crate::exec::Executor::new(&half, &ha).unwrap();
        pe.init_params(&mut pa, 1).unwrap();
        he.init_params(&mut ha, 1).unwrap();
        // Forward only: no rounding happens, predictions are identical.
        let a = pe.predict(&mut pa, &x).unwrap().to_vec();
        let b = he.predict(&mut ha, &x).unwrap().to_vec();
        assert_eq!(a, b);
    }
}
