//! Sequence models in the planner and executor: a small GPT (embedding, positions, pre-LayerNorm
//! blocks with causal attention and a GELU MLP, residual adds, a vocabulary head, sequence
//! cross-entropy) planned and run like every other model — in place where valid, micro-batched,
//! recomputing — and a LoRA variant whose base weights carry no gradient.
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use crate::exec::{ExecError, Executor, Target};
use crate::graph::{Graph, GraphError, TensorKind};
use crate::model::{Dims, LayerKind, LayerSpec, LossKind, ModelSpec, OptimizerSpec, Src, Update};
use crate::plan::tests::check_layout;
use crate::plan::{Phase, Plan, PlanShape};
use crate::policy::{self, CostModel};

/// A GPT of `blocks` pre-LayerNorm blocks (`rms`: RMSNorm and SiLU instead of LayerNorm and GELU);
/// `lora`: every qkv/proj Linear is a LoRA Linear of rank 2.
pub(crate) fn gpt(
    vocab: u32,
    seq: u32,
    dim: u32,
    heads: u32,
    blocks: usize,
    rms: bool,
    lora: bool,
) -> ModelSpec {
    let mut layers: Vec<LayerSpec> = Vec::new();
    let mut push = |name: String, kind: LayerKind, inputs: Vec<Src>| -> u32 {
        layers.push(LayerSpec {
            name,
            kind,
            inputs,
            trainable: true,
            update: Default::default(),
        });
        layers.len() as u32 - 1
    };
    let prev = |i: u32| vec![Src::Layer(i)];
    let norm = || {
        if rms {
            LayerKind::RmsNorm { eps: 1e-5 }
        } else {
            LayerKind::LayerNorm { eps: 1e-5 }
        }
    };
    // No bias on qkv: a key bias shifts every score of a row equally, which softmax ignores, so its true
    // gradient is zero and its computed one rounding noise that Adam would amplify to ±lr steps.
    let lin = |out: u32, bias: bool| {
        if lora {
            LayerKind::LoraLinear {
                out,
                bias,
                rank: 2,
                alpha: 4.0,
            }
        } else {
            LayerKind::Linear { out, bias }
        }
    };
    let e = push(
        "tok".into(),
        LayerKind::Embedding { vocab, dim },
        vec![Src::Input],
    );
    let mut x = push("pos".into(), LayerKind::PosEmbedding, prev(e));
    for b in 0..blocks {
        let n1 = push(alloc::format!("h{b}.ln1"), norm(), prev(x));
        let q = push(alloc::format!("h{b}.qkv"), lin(3 * dim, false), prev(n1));
        let a = push(
            alloc::format!("h{b}.attn"),
            LayerKind::Attention { heads },
            prev(q),
        );
        let p = push(alloc::format!("h{b}.proj"), lin(dim, true), prev(a));
        let r1 = push(
            alloc::format!("h{b}.res1"),
            LayerKind::Add,
            vec![Src::Layer(p), Src::Layer(x)],
        );
        let n2 = push(alloc::format!("h{b}.ln2"), norm(), prev(r1));
        let f1 = push(
            alloc::format!("h{b}.fc1"),
            LayerKind::Linear {
                out: 2 * dim,
                bias: true,
            },
            prev(n2),
        );
        let act = if rms {
            LayerKind::Silu
        } else {
            LayerKind::Gelu
        };
        let g = push(alloc::format!("h{b}.act"), act, prev(f1));
        let f2 = push(
            alloc::format!("h{b}.fc2"),
            LayerKind::Linear {
                out: dim,
                bias: true,
            },
            prev(g),
        );
        x = push(
            alloc::format!("h{b}.res2"),
            LayerKind::Add,
            vec![Src::Layer(f2), Src::Layer(r1)],
        );
    }
    let nf = push("ln_f".into(), norm(), prev(x));
    push(
        "head".into(),
        LayerKind::Linear {
            out: vocab,
            bias: false,
        },
        prev(nf),
    );
    if lora {
        // LoRA fine-tuning: everything but the adapters frozen.
        for l in layers.iter_mut() {
            l.trainable = matches!(l.kind, LayerKind::LoraLinear { .. });
        }
    }
    ModelSpec {
        input: Dims::flat(seq),
        layers,
        loss: LossKind::SoftmaxCrossEntropy,
        optimizer: OptimizerSpec::AdamW {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        },
        seed: 7,
    }
}

/// `n` sequences of `seq` token ids below `vocab` and their next-token labels.
pub(crate) fn tokens(n: usize, seq: usize, vocab: usize) -> (Vec<f32>, Vec<u32>) {
    let mut rng = crate::rng::Rng::new(11);
    let all: Vec<u32> = (0..n * seq + 1)
        .map(|_| rng.below(vocab as u64) as u32)
        .collect();
    let x = all[..n * seq].iter().map(|&t| t as f32).collect();
    let y = all[1..].to_vec();
    (x, y)
}

/// Losses of `steps` steps then every persistent tensor, on `n` fixed sequences.
fn run(p: &Plan, steps: usize, n: usize) -> Vec<f32> {
    let mut arena = vec![0xA5u8; p.needed_bytes()];
    let mut ex = Executor::new(p, &arena).unwrap();
    ex.init_params(&mut arena, 5).unwrap();
    let seq = p.graph.input_dims.numel();
    let vocab = p.graph.pred_dims().w as usize;
    let (x, y) = tokens(n, seq, vocab);
    let mut out = Vec::new();
    for _ in 0..steps {
        out.push(
            ex.train_step(&mut arena, &x, Target::Classes(&y))
                .unwrap()
                .loss,
        );
    }
    for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
        out.extend_from_slice(ex.read(&mut arena, t).unwrap());
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn transformer_trains_and_sharing_is_bit_exact() {
    for rms in [false, true] {
        let spec = gpt(11, 6, 8, 2, 2, rms, false);
        let g = Graph::new(&spec, 3).unwrap();
        assert_eq!(g.tokens, 6);
        let shared = Plan::new(g.clone());
        check_layout(&shared);
        // The positional embedding adds in place on the token embedding: its weight gradient reads
        // no input, so nothing keeps the token embedding's own value alive.
        let (tok, pos) = (g.nodes[0].out, g.nodes[1].out);
        assert_eq!(shared.group(tok), shared.group(pos));
        assert!(!crate::plan::grad_w_reads_input(&g.nodes[1].op));
        let unshared = Plan::with_sharing(g.clone(), false);
        // In place, no instruction has more bytes live and some have fewer (the arenas themselves
        // are within the layout's slack of each other at this size: the peak is an instruction
        // where nothing runs in place).
        let live = |p: &Plan, eo: usize| -> usize {
            let eo = eo as crate::plan::Eo;
            p.lives
                .iter()
                .filter(|l| l.first <= eo && eo <= l.last)
                .map(|l| l.bytes)
                .sum()
        };
        let (a, b): (Vec<usize>, Vec<usize>) = (0..shared.program.len())
            .map(|eo| (live(&shared, eo), live(&unshared, eo)))
            .unzip();
        assert!(a.iter().zip(&b).all(|(a, b)| a <= b), "{a:?}\n{b:?}");
        assert!(a.iter().zip(&b).any(|(a, b)| a < b));
        let a = run(&shared, 4, 3);
        assert_eq!(bits(&a), bits(&run(&unshared, 4, 3)));
        // It learns: AdamW at lr 0.01 on fixed data lowers the loss over 4 steps; the first loss is
        // near ln(11) (random init, 11 classes).
        assert!((a[0] - 11f32.ln()).abs() < 0.5, "first loss {}", a[0]);
        assert!(a[3] < a[0], "losses {:?}", &a[..4]);
    }
}

/// Linear → GELU/SiLU → Linear keeps only the pre-activation for the backward pass: the second
/// Linear's weight gradient recomputes the activation from it (`Node::act_in`), so the activation's
/// output dies at that Linear's forward — a smaller arena, and the same bits as keeping the output
/// (18 token rows: one tile, the same GEMM); a LoRA Linear there likewise.
#[test]
fn linear_after_gelu_recomputes_it_and_trains_the_same_bits() {
    for rms in [false, true] {
        let spec = gpt(11, 6, 8, 2, 2, rms, false);
        let g = Graph::new(&spec, 3).unwrap();
        let p = Plan::new(g.clone());
        check_layout(&p);
        let mut kept = g.clone();
        let mut seen = 0;
        let mut t = Vec::new();
        for (i, nd) in g.nodes.iter().enumerate() {
            let crate::graph::NodeOp::Smooth(k) = nd.op else {
                continue;
            };
            assert_eq!(g.nodes[i + 1].act_in, Some((k, nd.inputs[0])));
            kept.nodes[i + 1].act_in = None;
            let last = p.program.iter().rposition(|ins| {
                crate::plan::touches(&g, ins, &mut t);
                t.contains(&nd.out)
            });
            let last = p.program[last.unwrap()];
            assert_eq!((last.node as usize, last.phase), (i + 1, Phase::Forward));
            seen += 1;
        }
        assert_eq!(seen, 2);
        assert_eq!(g.nodes.iter().filter(|n| n.act_in.is_some()).count(), 2);
        let kept = Plan::new(kept);
        assert!(
            p.arena_bytes < kept.arena_bytes,
            "{} vs {}",
            p.arena_bytes,
            kept.arena_bytes
        );
        assert_eq!(bits(&run(&p, 3, 3)), bits(&run(&kept, 3, 3)));
    }
    // LoRA fine-tuning with adapters on the second MLP Linear too: its adapter gradient recomputes the
    // activation the same way.
    let mut spec = gpt(11, 6, 8, 2, 2, false, true);
    for l in spec.layers.iter_mut().filter(|l| l.name.ends_with(".fc2")) {
        l.kind = LayerKind::LoraLinear {
            out: 8,
            bias: true,
            rank: 2,
            alpha: 4.0,
        };
        l.trainable = true;
    }
    let g = Graph::new(&spec, 3).unwrap();
    let fused: Vec<usize> = (0..g.nodes.len())
        .filter(|&i| g.nodes[i].act_in.is_some())
        .collect();
    assert_eq!(fused.len(), 2);
    let mut kept = g.clone();
    for &i in &fused {
        assert!(matches!(g.nodes[i].op, crate::graph::NodeOp::Lora(_)));
        kept.nodes[i].act_in = None;
    }
    let (p, kept) = (Plan::new(g), Plan::new(kept));
    assert!(
        p.arena_bytes < kept.arena_bytes,
        "{} vs {}",
        p.arena_bytes,
        kept.arena_bytes
    );
    assert_eq!(bits(&run(&p, 3, 3)), bits(&run(&kept, 3, 3)));
}

#[test]
fn transformer_micro_batches_match_the_whole_batch() {
    let spec = gpt(11, 6, 8, 2, 2, false, false);
    let whole = Plan::new(Graph::new(&spec, 4).unwrap());
    let split = Plan::shaped(
        Graph::new(&spec, 1).unwrap(),
        PlanShape {
            micro_batches: 4,
            in_place: true,
        },
    );
    assert!(split.arena_bytes < whole.arena_bytes);
    let (a, b) = (run(&whole, 3, 4), run(&split, 3, 4));
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(&b) {
        num += (*x as f64 - *y as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    // Only the gradient summation order changes (per micro-batch, then accumulated): a few ulps a
    // step; Adam's normalised step keeps 3 steps far below 1e-5.
    assert!((num / den).sqrt() < 1e-5);
}

#[test]
fn transformer_recompute_plans_are_bit_exact_and_smaller() {
    let spec = gpt(11, 6, 8, 2, 1, false, false);
    // One micro-batch: the greedy's search over two takes ~12 s here (micro-batched recomputation is
    // covered by the policy's property tests on random models).
    let g = Graph::new(&spec, 4).unwrap();
    let plain = Plan::new(g.clone());
    let cost = CostModel::estimate(&g);
    let (Ok(min) | Err(min)) = policy::recompute(&g, 1, 0, &cost);
    assert!(min.program.iter().any(|i| i.phase == Phase::Recompute));
    assert!(
        min.arena_bytes < plain.arena_bytes,
        "{} vs {}",
        min.arena_bytes,
        plain.arena_bytes
    );
    let mid = (min.needed_bytes() + plain.needed_bytes()) / 2;
    let Ok(p) = policy::recompute(&g, 1, mid, &cost) else {
        panic!("no recompute plan within {mid}")
    };
    let want = bits(&run(&plain, 3, 4));
    assert_eq!(bits(&run(&min, 3, 4)), want, "minimal recompute plan");
    assert_eq!(bits(&run(&p, 3, 4)), want, "recompute plan at {mid} B");
}

/// The bounded smallest-budget search on the transformer: its plan lies between the lower bound and
/// the plain micro-batch-1 plan, trains bit-identically to that plain plan, and every plan of that
/// micro-batching (plain, and the unbounded greedy's) respects the lower bound.
#[test]
fn transformer_min_budget_search_is_bounded_and_bit_exact() {
    let spec = gpt(11, 6, 8, 2, 1, false, false);
    let g = Graph::new(&spec, 3).unwrap();
    let cost = CostModel::estimate(&g);
    let min = policy::search_min_budget(&spec, 3, &cost, 4).unwrap();
    assert!(min.plannings <= 4);
    let plain = Plan::shaped(
        Graph::new(&spec, 1).unwrap(),
        PlanShape {
            micro_batches: 3,
            in_place: true,
        },
    );
    assert_eq!((min.plan.graph.batch, min.plan.micro_batches), (1, 3));
    assert!(min.lower_bound <= min.plan.needed_bytes());
    assert!(min.plan.needed_bytes() <= plain.needed_bytes());
    assert!(min.lower_bound <= plain.needed_bytes());
    let want = bits(&run(&plain, 3, 3));
    assert_eq!(bits(&run(&min.plan, 3, 3)), want, "smallest-budget plan");
    // The unbounded greedy at budget 0 cannot go under the bound either.
    let g1 = Graph::new(&spec, 1).unwrap();
    let (Ok(p) | Err(p)) = policy::recompute(&g1, 3, 0, &cost);
    assert!(
        policy::arena_lower_bound(&g1, 3) <= p.arena_bytes,
        "{} > {}",
        policy::arena_lower_bound(&g1, 3),
        p.arena_bytes
    );
}

/// Attention in recompute mode (`GraphOptions::attn_recompute`) saves each block's row statistics
/// instead of its probabilities — a smaller arena — and trains the same bits as the saving mode
/// (losses and every persistent tensor after 4 steps), over sequences of two full tiles and a short
/// one, whole batch, micro-batched and with the recompute policy; its plans keep the layout
/// invariants and the recompute policy's plans in that mode stay bit-exact too.
#[test]
fn attention_recompute_mode_trains_the_same_bits() {
    use crate::graph::GraphOptions;
    use crate::ops::seq::ATTN_TILE_ROWS;
    let seq = 2 * ATTN_TILE_ROWS + 3;
    let spec = gpt(11, seq as u32, 8, 2, 2, false, false);
    let graph = |batch: usize, attn_recompute: bool| {
        let o = GraphOptions {
            attn_recompute,
            ..GraphOptions::default()
        };
        Graph::with_options(&spec, batch, o).unwrap()
    };
    let (save, rec) = (graph(3, false), graph(3, true));
    assert!(!save.attn_recompute() && rec.attn_recompute());
    let saved = |g: &Graph| -> Vec<(String, usize)> {
        g.nodes
            .iter()
            .filter(|n| matches!(n.op, crate::graph::NodeOp::Attention(_)))
            .map(|n| {
                let t = &g.tensors[n.saved[0] as usize];
                (t.name.clone(), t.bytes)
            })
            .collect()
    };
    // 3 samples × 2 heads × seq rows: seq² probabilities or 2 statistics each.
    assert_eq!(
        saved(&save),
        vec![
            ("h0.attn.probs".into(), 4 * 3 * 2 * seq * seq),
            ("h1.attn.probs".into(), 4 * 3 * 2 * seq * seq)
        ]
    );
    assert_eq!(
        saved(&rec),
        vec![
            ("h0.attn.rowstats".into(), 4 * 3 * 2 * seq * 2),
            ("h1.attn.rowstats".into(), 4 * 3 * 2 * seq * 2)
        ]
    );
    let (ps, pr) = (Plan::new(save.clone()), Plan::new(rec.clone()));
    check_layout(&pr);
    assert!(
        pr.arena_bytes < ps.arena_bytes,
        "{} vs {}",
        pr.arena_bytes,
        ps.arena_bytes
    );
    let want = run(&ps, 4, 3);
    let got = run(&pr, 4, 3);
    assert!(want[3] < want[0], "it learns: {:?}", &want[..4]);
    assert_eq!(bits(&got), bits(&want), "plain plans");
    // Micro-batched (3 × 1) in both modes: the same bits as each other.
    let shape = PlanShape {
        micro_batches: 3,
        in_place: true,
    };
    let ms = Plan::shaped(graph(1, false), shape);
    let mr = Plan::shaped(graph(1, true), shape);
    assert_eq!(
        bits(&run(&mr, 4, 3)),
        bits(&run(&ms, 4, 3)),
        "micro-batched"
    );
    // The recompute policy at its smallest in recompute mode: still the plain plan's bits.
    let cost = CostModel::estimate(&rec);
    let (Ok(min) | Err(min)) = policy::recompute(&rec, 1, 0, &cost);
    check_layout(&min);
    assert_eq!(bits(&run(&min, 4, 3)), bits(&want), "recompute policy");
}

/// The budget policies try the saving mode first and fall back to the recompute mode: a budget the
/// plain plan fits keeps the probabilities; the bounded smallest-budget search ends in recompute
/// mode (the probabilities, 3.2 KB a sample here, dominate what a sample saves).
#[test]
fn budget_policies_fall_back_to_recomputed_attention() {
    use crate::budget::Budget;
    let spec = gpt(11, 20, 8, 2, 1, false, false);
    let g = Graph::new(&spec, 3).unwrap();
    let cost = CostModel::estimate(&g);
    let plain = Plan::new(g.clone());
    let c = policy::plan_for_budget(
        &spec,
        3,
        Budget::new(plain.needed_bytes()),
        policy::PolicyKind::Auto,
        &cost,
    )
    .unwrap();
    assert!(!c.plan.graph.attn_recompute());
    let min = policy::search_min_budget(&spec, 3, &cost, 6).unwrap();
    assert!(min.plan.graph.attn_recompute());
    assert!(min.lower_bound <= min.plan.needed_bytes());
    // plan_for_budget plans for that budget too, in recompute mode.
    let c = policy::plan_for_budget(
        &spec,
        3,
        Budget::new(min.plan.needed_bytes()),
        policy::PolicyKind::Auto,
        &cost,
    )
    .unwrap();
    assert!(c.plan.graph.attn_recompute());
    assert!(c.plan.needed_bytes() <= min.plan.needed_bytes());
}

#[test]
fn lora_trains_only_the_adapters() {
    let spec = gpt(11, 6, 8, 2, 2, false, true);
    let g = Graph::new(&spec, 2).unwrap();
    let mut adapters = 0;
    for (_, p) in g.params() {
        let is_adapter = p.name.contains(".lora_");
        assert_eq!(p.grad.is_some(), is_adapter, "{}", p.name);
        assert_eq!(p.state.len(), if is_adapter { 2 } else { 0 }, "{}", p.name);
        adapters += usize::from(is_adapter);
    }
    assert_eq!(adapters, 8);
    // No gradient or optimizer state in the plan but the adapters'.
    for t in &g.tensors {
        if matches!(t.kind, TensorKind::Gradient | TensorKind::OptState) {
            assert!(t.name.contains(".lora_"), "{}", t.name);
        }
    }
    let p = Plan::new(g.clone());
    let mut arena = vec![0u8; p.needed_bytes()];
    let mut ex = Executor::new(&p, &arena).unwrap();
    ex.init_params(&mut arena, 5).unwrap();
    let state: Vec<_> = ex.state_tensors().collect();
    let before: Vec<Vec<f32>> = state
        .iter()
        .map(|s| ex.read(&mut arena, s.2).unwrap().to_vec())
        .collect();
    let (x, y) = tokens(2, 6, 11);
    let l0 = ex
        .train_step(&mut arena, &x, Target::Classes(&y))
        .unwrap()
        .loss;
    for _ in 0..5 {
        ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
    }
    let l6 = ex
        .train_step(&mut arena, &x, Target::Classes(&y))
        .unwrap()
        .loss;
    assert!(l6 < l0, "{l0} → {l6}");
    for (s, b) in state.iter().zip(&before) {
        let now = ex.read(&mut arena, s.2).unwrap();
        let changed = now != &b[..];
        assert_eq!(changed, s.0.contains(".lora_"), "{}", s.0);
    }
}

#[test]
fn bad_token_ids_are_typed_errors() {
    let spec = gpt(11, 6, 8, 2, 1, false, false);
    let p = Plan::new(Graph::new(&spec, 2).unwrap());
    let mut arena = vec![0u8; p.needed_bytes()];
    let mut ex = Executor::new(&p, &arena).unwrap();
    ex.init_params(&mut arena, 5).unwrap();
    let (mut x, y) = tokens(2, 6, 11);
    for bad in [11.0, 2.5, -1.0] {
        x[7] = bad;
        match ex.train_step(&mut arena, &x, Target::Classes(&y)) {
            Err(ExecError::BadBatch(_, 7)) => {}
            other => panic!("{bad}: {other:?}"),
        }
    }
    x[7] = 1.0;
    // One label per token.
    assert!(matches!(
        ex.train_step(&mut arena, &x, Target::Classes(&y[..2])),
        Err(ExecError::BadBatch(..))
    ));
    ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
}

/// A partial (sparse) update of an embedding, positional table, norm or LoRA layer is refused by
/// name: their gradient kernels write whole tensors.
#[test]
fn sequence_layers_refuse_a_partial_update() {
    for (layer, lora) in [
        ("tok", false),
        ("pos", false),
        ("h0.ln1", false),
        ("h0.qkv", true),
    ] {
        for update in [Update::Bias, Update::Channels(0.5)] {
            let mut spec = gpt(11, 6, 8, 2, 1, false, lora);
            let i = spec.layers.iter().position(|l| l.name == layer).unwrap();
            spec.layers[i].update = update;
            match Graph::new(&spec, 2) {
                Err(GraphError::Layer {
                    index,
                    name,
                    reason,
                    ..
                }) => {
                    assert_eq!((index, name.as_str()), (i, layer));
                    assert!(reason.contains("not supported"), "{layer}: {reason}");
                }
                other => panic!("{layer} {update:?}: {:?}", other.map(|_| ())),
            }
        }
    }
}

/// A refused budget names one figure whatever budget was refused, and that figure plans, in every
/// policy. For the transformer (both attention modes, micro-batching and recomputation) the figure is
/// found by bisection between the working-set bound and the smallest plain plan; it may exceed the
/// exhaustive search's smallest plan by at most the bisection's bracket (1/128) plus what the greedy's
/// non-monotonicity gives away, which 1% covers with room (0.03% on the browser's model at batch 32).
#[test]
fn a_refusal_names_one_figure_that_plans() {
    use crate::budget::{Budget, BudgetError};
    use crate::policy::{PlanError, PolicyKind};
    let spec = gpt(11, 12, 8, 2, 2, false, true);
    let batch = 4;
    let g = Graph::new(&spec, batch).unwrap();
    let cost = CostModel::estimate(&g);
    let plan =
        |b: usize, k: PolicyKind| policy::plan_for_budget(&spec, batch, Budget::new(b), k, &cost);
    for kind in PolicyKind::ALL {
        let needed_at = |b: usize| match plan(b, kind) {
            Err(PlanError::Budget(BudgetError::TooSmall { needed, given })) => {
                assert_eq!(given, b);
                needed
            }
            other => panic!(
                "{kind:?} at {b}: expected a refusal, got {:?}",
                other.map(|c| c.policy)
            ),
        };
        let n = needed_at(0);
        assert_eq!(needed_at(64), n, "{kind:?}");
        assert_eq!(needed_at(n / 2), n, "{kind:?}");
        let c = plan(n, kind)
            .unwrap_or_else(|e| panic!("{kind:?}: the named {n} B does not plan: {e}"));
        assert!(c.plan.needed_bytes() <= n, "{kind:?}");
        if kind == PolicyKind::Plain {
            assert_eq!(n, Plan::new(g.clone()).needed_bytes());
        }
        if kind == PolicyKind::Auto {
            let exhaustive = policy::min_budget(&spec, batch, &cost).unwrap();
            assert!(
                n as f64 <= exhaustive as f64 * 1.01,
                "{n} B named, the exhaustive search reaches {exhaustive} B"
            );
            let bound = [false, true]
                .map(|a| policy::working_set_bound(&policy::graph_in_mode(&spec, 1, a).unwrap()));
            assert!(
                n >= bound[0].min(bound[1]),
                "{n} B named, below the proven bound {bound:?}"
            );
        }
    }
}
