//! LSTM and GRU language models in the planner and executor: embedding → (projection Linear →
//! recurrent layer) × layers → vocabulary head → sequence cross-entropy, planned and run like every
//! other model — micro-batched, recomputing — and the recurrent layer's typed graph errors.
use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use crate::exec::seq_tests::tokens;
use crate::exec::{Executor, Target};
use crate::graph::{Graph, GraphError, NodeOp};
use crate::model::{Dims, LayerKind, LayerSpec, LossKind, ModelSpec, OptimizerSpec, Src, Update};
use crate::plan::tests::check_layout;
use crate::plan::{Phase, Plan, PlanShape};
use crate::policy::{self, CostModel};

fn layer(name: String, kind: LayerKind, from: Src) -> LayerSpec {
    LayerSpec {
        name,
        kind,
        inputs: vec![from],
        trainable: true,
        update: Update::All,
    }
}

/// A character language model: embedding, `layers` recurrent layers of `hidden` (`gru`: GRU, else
/// LSTM; each a projection Linear `{name}_ih` and the recurrent layer), a vocabulary head.
pub(crate) fn rnn_lm(
    gru: bool,
    vocab: u32,
    seq: u32,
    dim: u32,
    hidden: u32,
    n: usize,
) -> ModelSpec {
    let mut layers = vec![layer(
        "tok".into(),
        LayerKind::Embedding { vocab, dim },
        Src::Input,
    )];
    let gates = if gru { 3 } else { 4 };
    for k in 0..n {
        let from = Src::Layer(layers.len() as u32 - 1);
        let name = format!("rnn{k}");
        layers.push(layer(
            format!("{name}_ih"),
            LayerKind::Linear {
                out: gates * hidden,
                bias: true,
            },
            from,
        ));
        let kind = if gru {
            LayerKind::Gru { hidden }
        } else {
            LayerKind::Lstm { hidden }
        };
        layers.push(layer(name, kind, Src::Layer(layers.len() as u32 - 1)));
    }
    layers.push(layer(
        "head".into(),
        LayerKind::Linear {
            out: vocab,
            bias: true,
        },
        Src::Layer(layers.len() as u32 - 1),
    ));
    ModelSpec {
        input: Dims::flat(seq),
        layers,
        loss: LossKind::SoftmaxCrossEntropy,
        optimizer: OptimizerSpec::Adam {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        },
        seed: 3,
    }
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

fn rel(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        num += (*x as f64 - *y as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den).sqrt()
}

#[test]
fn lstm_and_gru_train_stacked_and_sharing_is_bit_exact() {
    for gru in [false, true] {
        let spec = rnn_lm(gru, 11, 7, 6, 5, 2);
        let g = Graph::new(&spec, 3).unwrap();
        assert_eq!(g.tokens, 7);
        // PyTorch's parameter shapes; the derivative phase (through time) before the gradient's.
        let r = g.nodes.iter().find(|n| n.name == "rnn1").unwrap();
        assert!(matches!(r.op, NodeOp::Rnn(_)));
        let gw = if gru { 15 } else { 20 };
        assert_eq!(r.params[0].name, "rnn1.weight_hh_l0");
        assert_eq!(r.params[0].shape, vec![gw, 5]);
        assert_eq!(r.params[1].shape, vec![gw]);
        let shared = Plan::new(g.clone());
        check_layout(&shared);
        let ri = g.nodes.iter().position(|n| n.name == "rnn1").unwrap() as u16;
        let at = |ph| {
            shared
                .program
                .iter()
                .position(|i| i.node == ri && i.phase == ph)
        };
        // The backward through time (its last step first) before the weight gradient.
        assert_eq!(shared.program[at(Phase::StepBwd).unwrap()].step, 6);
        assert!(at(Phase::StepBwd).unwrap() < at(Phase::GradW).unwrap());
        let unshared = Plan::with_sharing(g, false);
        let a = run(&shared, 6, 3);
        assert_eq!(bits(&a), bits(&run(&unshared, 6, 3)));
        // It learns: Adam at lr 0.01 on fixed data lowers the loss; the first loss is near ln(11)
        // (random init, small outputs, 11 classes).
        assert!((a[0] - 11f32.ln()).abs() < 0.3, "first loss {}", a[0]);
        assert!(a[5] < a[0] - 0.05, "losses {:?}", &a[..6]);
    }
}

/// The recurrent layers unrolled over time: one forward instruction per step in order, one backward
/// instruction per step in reverse, each step's gates and state their own storage, alive exactly from
/// the step's forward to its backward (the LSTM's state also read by the next step's forward and
/// backward, both inside that span), the carried derivatives from the last step's backward to the
/// first's; and the planner reuses a finished step's bytes for a later tensor.
#[test]
fn rnn_steps_are_planned_one_by_one() {
    for gru in [false, true] {
        let seq = 7u16;
        let spec = rnn_lm(gru, 11, seq.into(), 6, 5, 2);
        let g = Graph::new(&spec, 3).unwrap();
        let p = Plan::new(g.clone());
        check_layout(&p);
        for (ri, n) in g.nodes.iter().enumerate() {
            let Some(b) = n.bptt else {
                assert!(!matches!(n.op, NodeOp::Rnn(_)));
                continue;
            };
            assert_eq!(b.steps, seq);
            assert_eq!(b.r.is_some(), gru);
            let eo = |ph: Phase, t: u16| {
                let mut it = p.program.iter().enumerate();
                let (e, _) = it
                    .find(|(_, i)| usize::from(i.node) == ri && i.phase == ph && i.step == t)
                    .unwrap();
                e as u32
            };
            // No whole-layer forward or derivative; the steps in order.
            assert!(!p.program.iter().any(|i| usize::from(i.node) == ri
                && matches!(i.phase, Phase::Forward | Phase::GradX | Phase::Recompute)));
            for t in 1..seq {
                assert_eq!(eo(Phase::StepFwd, t), eo(Phase::StepFwd, t - 1) + 1);
                assert_eq!(eo(Phase::StepBwd, t - 1), eo(Phase::StepBwd, t) + 1);
            }
            for t in 0..seq {
                assert_eq!(
                    g.tensors[b.gates(t) as usize].name,
                    format!("{}.t{t}.gates", n.name)
                );
                assert_eq!(
                    g.tensors[b.state(t) as usize].name,
                    format!("{}.t{t}.state", n.name)
                );
                for x in [b.gates(t), b.state(t)] {
                    let s = p.storage_at(x, eo(Phase::StepFwd, t)).unwrap();
                    let life = &p.lives[s];
                    assert_eq!(
                        (life.first, life.last),
                        (eo(Phase::StepFwd, t), eo(Phase::StepBwd, t))
                    );
                }
            }
            let carry = b.carry.unwrap();
            let s = p.storage_at(carry, eo(Phase::StepBwd, 0)).unwrap();
            let life = &p.lives[s];
            assert_eq!(
                (life.first, life.last),
                (eo(Phase::StepBwd, seq - 1), eo(Phase::StepBwd, 0))
            );
            // Some later storage takes bytes of a step's saved tensors once that step's backward ran.
            let step_bytes: Vec<(u32, usize, usize)> = (0..seq)
                .flat_map(|t| [b.gates(t), b.state(t)])
                .map(|x| {
                    let s = p.storage_at(x, eo(Phase::StepBwd, 0)).unwrap_or_else(|| {
                        let t = (x - b.first) as u16 / 2;
                        p.storage_at(x, eo(Phase::StepBwd, t)).unwrap()
                    });
                    (
                        p.lives[s].last,
                        p.offsets[s],
                        p.offsets[s] + p.lives[s].bytes,
                    )
                })
                .collect();
            let reused = p.lives.iter_enumerated().any(|(s, l)| {
                let (lo, hi) = (p.offsets[s], p.offsets[s] + l.bytes);
                step_bytes
                    .iter()
                    .any(|&(last, a, z)| l.first > last && lo < z && a < hi)
            });
            assert!(
                reused,
                "gru {gru}: no storage reuses a finished step's bytes"
            );
        }
    }
}

#[test]
fn rnn_micro_batches_match_the_whole_batch() {
    for gru in [false, true] {
        let spec = rnn_lm(gru, 11, 6, 6, 5, 1);
        let whole = Plan::new(Graph::new(&spec, 4).unwrap());
        let split = Plan::shaped(
            Graph::new(&spec, 1).unwrap(),
            PlanShape {
                micro_batches: 4,
                in_place: true,
            },
        );
        assert!(split.arena_bytes < whole.arena_bytes);
        // Only the gradient summation order changes (per micro-batch, then accumulated): a few ulps
        // a step; Adam's normalised step keeps 3 steps far below 1e-5.
        let e = rel(&run(&whole, 3, 4), &run(&split, 3, 4));
        assert!(e < 1e-5, "gru {gru}: {e:e}");
    }
}

#[test]
fn lstm_recompute_plans_are_bit_exact_and_smaller() {
    let spec = rnn_lm(false, 11, 6, 6, 5, 2);
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
    let want = bits(&run(&plain, 3, 4));
    assert_eq!(bits(&run(&min, 3, 4)), want, "minimal recompute plan");
    let mid = (min.needed_bytes() + plain.needed_bytes()) / 2;
    let Ok(p) = policy::recompute(&g, 1, mid, &cost) else {
        panic!("no recompute plan within {mid}")
    };
    assert_eq!(bits(&run(&p, 3, 4)), want, "recompute plan at {mid} B");
}

#[test]
fn rnn_layers_are_typed_errors_where_they_do_not_fit() {
    let expect = |spec: &ModelSpec, layer: &str, words: &str| match Graph::new(spec, 2) {
        Err(GraphError::Layer { name, reason, .. }) => {
            assert_eq!(name, layer);
            assert!(reason.contains(words), "{reason}");
        }
        other => panic!("{layer}: {:?}", other.map(|_| ())),
    };
    // The input must be the gate pre-activations: 4·hidden wide for the LSTM, 3·hidden for the GRU.
    let mut spec = rnn_lm(false, 11, 6, 6, 5, 1);
    spec.layers[2].kind = LayerKind::Gru { hidden: 5 };
    expect(&spec, "rnn0", "[seq, 3·hidden]");
    spec.layers[2].kind = LayerKind::Lstm { hidden: 0 };
    expect(&spec, "rnn0", "hidden ≥ 1");
    // A sequence input.
    let mut spec = rnn_lm(false, 11, 6, 6, 5, 1);
    spec.layers[1].inputs = vec![Src::Input];
    spec.layers.remove(0);
    for l in spec.layers.iter_mut() {
        if let Src::Layer(j) = &mut l.inputs[0] {
            *j -= 1;
        }
    }
    expect(&spec, "rnn0", "needs a sequence input");
    // A partial update is refused, as for the other sequence layers.
    let mut spec = rnn_lm(true, 11, 6, 6, 5, 1);
    spec.layers[2].update = Update::Bias;
    expect(&spec, "rnn0", "not supported");
    // Trainable recurrent weights need a derivative of the input: a frozen projection and embedding
    // leave none.
    let mut spec = rnn_lm(false, 11, 6, 6, 5, 1);
    spec.layers[0].trainable = false;
    spec.layers[1].trainable = false;
    expect(&spec, "rnn0", "trainable input projection");
    // Frozen as a whole below a trainable head, it is fine (no backward at all).
    spec.layers[2].trainable = false;
    Graph::new(&spec, 2).unwrap();
    // The gate pre-activations feed the recurrent layer alone.
    let mut spec = rnn_lm(false, 11, 6, 6, 5, 1);
    spec.layers.push(layer(
        "tap".into(),
        LayerKind::Linear {
            out: 11,
            bias: true,
        },
        Src::Layer(1),
    ));
    spec.layers.push(LayerSpec {
        name: "sum".into(),
        kind: LayerKind::Add,
        inputs: vec![Src::Layer(3), Src::Layer(4)],
        trainable: true,
        update: Update::All,
    });
    expect(&spec, "rnn0", "no other layer");
}
