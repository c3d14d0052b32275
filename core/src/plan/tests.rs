//! Planner properties on random DAG models.
use alloc::format;
use alloc::vec;
use alloc::vec::Vec;

use proptest::prelude::*;

use super::*;
use crate::exec::{Executor, Target};
use crate::model::{Dims, LayerKind, LayerSpec, LossKind, ModelSpec, OptimizerSpec, Src};

/// Builds a random but valid model from a list of choices: conv/bn/act/pool/residual blocks on a small
/// image, then flatten and a linear head.
pub(crate) fn random_model(
    choices: &[(u8, u8, bool)],
    c0: u32,
    hw: u32,
    optimizer: u8,
) -> ModelSpec {
    let mut layers: Vec<LayerSpec> = Vec::new();
    let mut shape = Dims::new(c0, hw, hw);
    let mut same_shape: Vec<(usize, Dims)> = Vec::new();
    let push = |layers: &mut Vec<LayerSpec>, kind: LayerKind, inputs: Vec<Src>, trainable: bool| {
        let name = format!("l{}", layers.len());
        // Some trainable layers take a sparse update (a channel half, the bias alone), so every
        // property over random models covers sparse plans too.
        use crate::model::Update;
        let bias = matches!(
            kind,
            LayerKind::Conv2d { bias: true, .. } | LayerKind::BatchNorm2d { .. }
        );
        let params = bias || matches!(kind, LayerKind::Conv2d { .. });
        let update = match (layers.len() * 5 + 3) % 7 {
            0 if params => Update::Channels(0.5),
            1 if bias => Update::Bias,
            _ => Update::All,
        };
        layers.push(LayerSpec {
            name,
            kind,
            inputs,
            trainable,
            update,
        });
        Src::Layer(layers.len() as u32 - 1)
    };
    let mut cur = Src::Input;
    for &(op, arg, trainable) in choices {
        match op % 8 {
            0 => {
                let out = 1 + (arg % 4) as u32;
                let k = if arg % 2 == 0 { 3 } else { 1 };
                cur = push(
                    &mut layers,
                    LayerKind::Conv2d {
                        out,
                        kernel: [k, k],
                        stride: [1, 1],
                        padding: [k / 2, k / 2],
                        groups: 1,
                        bias: arg % 3 != 0,
                    },
                    vec![cur],
                    trainable,
                );
                shape = Dims::new(out, shape.h, shape.w);
            }
            1 => {
                let c = shape.c;
                cur = push(
                    &mut layers,
                    LayerKind::Conv2d {
                        out: c,
                        kernel: [3, 3],
                        stride: [1, 1],
                        padding: [1, 1],
                        groups: c,
                        bias: false,
                    },
                    vec![cur],
                    trainable,
                );
            }
            2 => {
                cur = push(
                    &mut layers,
                    LayerKind::BatchNorm2d {
                        eps: 1e-5,
                        momentum: 0.1,
                    },
                    vec![cur],
                    trainable,
                )
            }
            3 => {
                let k = [
                    LayerKind::Relu,
                    LayerKind::Relu6,
                    LayerKind::Sigmoid,
                    LayerKind::Tanh,
                ][(arg % 4) as usize]
                    .clone();
                cur = push(&mut layers, k, vec![cur], true);
            }
            4 if shape.h >= 2 => {
                let k = if arg % 2 == 0 {
                    LayerKind::MaxPool2d {
                        kernel: [2, 2],
                        stride: [2, 2],
                    }
                } else {
                    LayerKind::AvgPool2d {
                        kernel: [2, 2],
                        stride: [2, 2],
                    }
                };
                cur = push(&mut layers, k, vec![cur], true);
                shape = Dims::new(shape.c, shape.h / 2, shape.w / 2);
                same_shape.clear();
            }
            5 => {
                if let Some(&(j, d)) = same_shape.iter().rev().nth((arg % 2) as usize) {
                    if d == shape && Src::Layer(j as u32) != cur {
                        cur = push(
                            &mut layers,
                            LayerKind::Add,
                            vec![Src::Layer(j as u32), cur],
                            true,
                        );
                    }
                }
            }
            6 => cur = push(&mut layers, LayerKind::Dropout { p: 0.25 }, vec![cur], true),
            _ => {}
        }
        if let Src::Layer(j) = cur {
            same_shape.push((j as usize, shape));
        }
    }
    cur = push(&mut layers, LayerKind::Flatten, vec![cur], true);
    push(
        &mut layers,
        LayerKind::Linear { out: 3, bias: true },
        vec![cur],
        true,
    );
    let optimizer = match optimizer % 3 {
        0 => OptimizerSpec::Sgd {
            lr: 0.05,
            momentum: 0.0,
            weight_decay: 0.0,
        },
        1 => OptimizerSpec::Sgd {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 1e-3,
        },
        _ => OptimizerSpec::Adam {
            lr: 1e-2,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        },
    };
    ModelSpec {
        input: Dims::new(c0, hw, hw),
        layers,
        loss: LossKind::SoftmaxCrossEntropy,
        optimizer,
        seed: 5,
    }
}

pub(crate) fn check_layout(p: &Plan) {
    assert!(
        p.arena_bytes >= p.lower_bound,
        "arena {} below lower bound {}",
        p.arena_bytes,
        p.lower_bound
    );
    for (i, a) in p.lives.iter_enumerated() {
        assert_eq!(p.offsets[i] % ALIGN, 0);
        assert!(p.offsets[i] + a.bytes <= p.arena_bytes);
        for (j, b) in p.lives.iter_enumerated().skip(i.index() + 1) {
            let live_together = a.first <= b.last && b.first <= a.last;
            let disjoint =
                p.offsets[i] + a.bytes <= p.offsets[j] || p.offsets[j] + b.bytes <= p.offsets[i];
            assert!(
                !live_together || disjoint,
                "{} and {} overlap while both live",
                a.name,
                b.name
            );
        }
    }
}

pub(crate) fn run_steps(p: &Plan, steps: usize) -> Vec<f32> {
    run_steps_n(p, steps, p.batch())
}

/// Trains `steps` steps on `n` fixed samples and returns the losses followed by every persistent tensor.
pub(crate) fn run_steps_n(p: &Plan, steps: usize, n: usize) -> Vec<f32> {
    let mut arena = vec![0xA5u8; p.needed_bytes()];
    let mut ex = Executor::new(p, &arena).unwrap();
    ex.init_params(&mut arena, 9).unwrap();
    let per = p.graph.input_dims.numel();
    let mut rng = crate::rng::Rng::new(3);
    let x: Vec<f32> = (0..n * per).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let y: Vec<u32> = (0..n).map(|i| (i % 3) as u32).collect();
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// No two storages alive at the same execution order overlap; the arena is never below the bound.
    #[test]
    fn random_dags_never_overlap_live_tensors(
        choices in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<bool>()), 1..12),
        c0 in 1u32..4, hw in 2u32..7, batch in 2usize..6, opt in any::<u8>(),
    ) {
        let spec = random_model(&choices, c0, hw, opt);
        let g = match Graph::new(&spec, batch) { Ok(g) => g, Err(_) => return Ok(()) };
        check_layout(&Plan::new(g));
    }

    /// A schedule's measured size is its plan's (the policies' pruning accepts candidates by it), for
    /// plain and micro-batched schedules and programs with recomputations inserted at random places.
    #[test]
    fn schedule_arena_bytes_is_its_plans(
        choices in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<bool>()), 1..12),
        c0 in 1u32..4, hw in 2u32..7, batch in 2usize..6, opt in any::<u8>(), m in 1u16..4,
        recomputes in proptest::collection::vec((any::<u16>(), any::<u16>()), 0..4),
    ) {
        let spec = random_model(&choices, c0, hw, opt);
        let g = match Graph::new(&spec, batch) { Ok(g) => g, Err(_) => return Ok(()) };
        let mut s = Schedule::shaped(&g, PlanShape { micro_batches: m, in_place: true });
        for (node, at) in recomputes {
            let node = node % g.nodes.len() as u16;
            let at = at as usize % (s.program.len() + 1);
            s.program.insert(at, Instr { node, phase: Phase::Recompute, mb: 0, placement: Placement::Cpu, step: 0 });
        }
        let p = s.plan();
        prop_assert_eq!(s.arena_bytes(), p.arena_bytes);
        prop_assert_eq!(&p.program, &s.program);
        prop_assert_eq!(&p.roots, &s.roots);
        check_layout(&p);
    }

    /// In-place and view sharing never changes the maths: bit-identical losses and weights to a plan where
    /// every tensor has its own storage.
    #[test]
    fn sharing_is_bit_exact(
        choices in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<bool>()), 1..10),
        c0 in 1u32..3, hw in 2u32..6, batch in 2usize..5, opt in any::<u8>(),
    ) {
        let spec = random_model(&choices, c0, hw, opt);
        let g = match Graph::new(&spec, batch) { Ok(g) => g, Err(_) => return Ok(()) };
        let shared = Plan::new(g.clone());
        let unshared = Plan::with_sharing(g, false);
        // Merging can only shrink what is live at once (layout heuristics need not be monotone).
        prop_assert!(shared.lower_bound <= unshared.lower_bound);
        let a = run_steps(&shared, 3);
        let b = run_steps(&unshared, 3);
        prop_assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            prop_assert_eq!(x.to_bits(), y.to_bits());
        }
    }
}

#[test]
fn relu_after_conv_shares_its_input_and_derivative() {
    let spec = random_model(&[(0, 2, true), (3, 0, true)], 1, 4, 0);
    let g = Graph::new(&spec, 2).unwrap();
    let p = Plan::new(g);
    let conv = &p.graph.nodes[0];
    let relu = &p.graph.nodes[1];
    assert_eq!(p.group_of[conv.out as usize], p.group_of[relu.out as usize]);
    let d_relu_in = relu.d_in[0].unwrap().0;
    assert_eq!(
        p.group_of[d_relu_in as usize],
        p.group_of[relu.d_out.unwrap() as usize]
    );
}

#[test]
fn in_place_is_refused_when_the_input_is_still_needed() {
    // conv → relu → add(conv.out, relu.out): relu may not overwrite conv.out, the add reads it later.
    let mut spec = random_model(&[(0, 2, true)], 1, 4, 0);
    spec.layers.truncate(1);
    spec.layers.push(LayerSpec {
        name: "r".into(),
        kind: LayerKind::Relu,
        inputs: vec![Src::Layer(0)],
        trainable: true,
        update: crate::model::Update::All,
    });
    spec.layers.push(LayerSpec {
        name: "a".into(),
        kind: LayerKind::Add,
        inputs: vec![Src::Layer(0), Src::Layer(1)],
        trainable: true,
        update: crate::model::Update::All,
    });
    spec.layers.push(LayerSpec {
        name: "f".into(),
        kind: LayerKind::Flatten,
        inputs: vec![Src::Layer(2)],
        trainable: true,
        update: crate::model::Update::All,
    });
    spec.layers.push(LayerSpec {
        name: "fc".into(),
        kind: LayerKind::Linear { out: 3, bias: true },
        inputs: vec![Src::Layer(3)],
        trainable: true,
        update: crate::model::Update::All,
    });
    let p = Plan::new(Graph::new(&spec, 2).unwrap());
    let (c, r) = (&p.graph.nodes[0], &p.graph.nodes[1]);
    assert_ne!(p.group_of[c.out as usize], p.group_of[r.out as usize]);
    check_layout(&p);
}

#[test]
fn frozen_layers_keep_no_gradient_and_no_saved_input() {
    let mut spec = random_model(&[(0, 2, false), (3, 0, true)], 1, 4, 0);
    spec.layers[0].trainable = false;
    let g = Graph::new(&spec, 2).unwrap();
    let conv = &g.nodes[0];
    assert!(conv
        .params
        .iter()
        .all(|p| p.grad.is_none() && p.state.is_empty()));
    assert!(conv.d_in.iter().all(|d| d.is_none()));
    let sched = Schedule::new(&g);
    assert!(!sched
        .program
        .iter()
        .any(|i| i.node == 0 && i.phase != Phase::Forward));
}

#[test]
fn lower_bound_counts_peak_of_overlapping_lives() {
    let l = |first, last, bytes| TensorLife {
        name: "t".into(),
        kind: TensorKind::Activation,
        bytes,
        first,
        last,
        space: SpaceId::HOST,
    };
    let lives = [l(0, 2, 64), l(1, 3, 128), l(3, 4, 64), l(5, 5, 512)];
    assert_eq!(lower_bound(&lives), 512);
    assert_eq!(lower_bound(&lives[..3]), 192);
}

/// A second (test) memory space: its storages are laid out on their own, at its alignment, with its own
/// lifetimes; the host arena shrinks; budgets are checked per space; the plan format carries it; and the
/// CPU backend, which owns no such space, refuses the plan when an executor is created.
#[test]
fn a_second_memory_space_is_laid_out_on_its_own() {
    use crate::exec::ExecError;
    use crate::format::{decode_plan, encode_plan};
    let spec = random_model(
        &[
            (0, 2, true),
            (3, 0, true),
            (4, 0, true),
            (0, 2, true),
            (3, 0, true),
        ],
        1,
        12,
        1,
    );
    let mut p = Plan::new(Graph::new(&spec, 8).unwrap());
    let host_before = p.arena_bytes;
    let test_space = SpaceId(7);
    let in_test =
        |l: &TensorLife| matches!(l.kind, TensorKind::Activation | TensorKind::Derivative);
    p.place_spaces(
        |_, l| {
            if in_test(l) {
                test_space
            } else {
                SpaceId::HOST
            }
        },
        |_| 256,
    );
    assert_eq!(p.spaces.len(), 1);
    let sp = p.spaces[0];
    assert_eq!((sp.space, sp.align), (test_space, 256));
    assert!(sp.bytes > 0 && sp.bytes >= sp.lower_bound);
    assert!(
        p.arena_bytes < host_before,
        "the host arena gave up the moved storages"
    );
    assert!(p.arena_bytes >= p.lower_bound);
    for (i, l) in p.lives.iter_enumerated() {
        let (size, align) = if l.space == SpaceId::HOST {
            (p.arena_bytes, ALIGN)
        } else {
            (sp.bytes, sp.align)
        };
        assert_eq!(l.space == test_space, in_test(l));
        assert_eq!(p.offsets[i] % align, 0, "storage {i} aligned to its space");
        assert!(
            p.offsets[i] + l.bytes <= size,
            "storage {i} inside its space"
        );
        for (j, m) in p.lives.iter_enumerated().skip(i.index() + 1) {
            let together = l.first <= m.last && m.first <= l.last;
            let overlap =
                p.offsets[i] < p.offsets[j] + m.bytes && p.offsets[j] < p.offsets[i] + l.bytes;
            assert!(
                !(together && overlap && l.space == m.space),
                "storages {i} and {j} overlap in one space"
            );
        }
    }
    // Some pair shares bytes across spaces (each space starts at 0): the spaces really are separate.
    assert!(p
        .lives
        .iter_enumerated()
        .any(|(i, l)| l.space == test_space && p.offsets[i] == 0));
    assert!(p
        .lives
        .iter_enumerated()
        .any(|(i, l)| l.space == SpaceId::HOST && p.offsets[i] == 0));
    // Budgets per space: the host's budget never pays for the test space's bytes.
    let host = (SpaceId::HOST, Budget::new(p.needed_bytes()));
    assert!(p.check_budgets(&[host]).is_ok());
    assert!(p
        .check_budgets(&[host, (test_space, Budget::new(sp.bytes))])
        .is_ok());
    assert_eq!(
        p.check_budgets(&[host, (test_space, Budget::new(sp.bytes - 1))]),
        Err(BudgetError::TooSmall {
            needed: sp.bytes,
            given: sp.bytes - 1
        })
    );
    // The plan format carries the spaces.
    let (_, q) = decode_plan(&encode_plan(&spec, &p)).unwrap();
    assert_eq!(q.spaces, p.spaces);
    assert_eq!(q.lives, p.lives);
    assert_eq!(q.offsets, p.offsets);
    // A corrupt space byte is a typed error, not a panic.
    let bytes = encode_plan(&spec, &p);
    let (v, payload) =
        crate::format::unframe(*b"FRGP", crate::format::plan::PLAN_VERSION, &bytes).unwrap();
    let mut payload = payload.to_vec();
    *payload.last_mut().unwrap() = 9; // the last storage's space byte: an undeclared space
    let bad = crate::format::frame(*b"FRGP", v, &payload);
    assert!(decode_plan(&bad).is_err());
    // No backend of a CPU executor owns space 7.
    let arena = vec![0u8; p.needed_bytes()];
    assert!(matches!(
        Executor::new(&p, &arena).map(|_| ()),
        Err(ExecError::Space(7))
    ));
}

/// Random models carry sparse updates (a channel half, a bias alone), so the properties above cover
/// sparse plans.
#[test]
fn random_models_include_sparse_updates() {
    let choices: Vec<(u8, u8, bool)> = (0..12).map(|i| (i % 3, 2, true)).collect();
    let g = crate::graph::Graph::new(&random_model(&choices, 2, 6, 0), 2).unwrap();
    let partial =
        |p: &crate::graph::Param| p.grad.is_some() && p.updated < p.shape.iter().product();
    assert!(g.params().any(|(_, p)| partial(p)), "no channel subset");
    assert!(
        g.nodes.iter().any(|n| n.params.len() == 2
            && n.params[0].grad.is_none()
            && n.params[1].grad.is_some()),
        "no bias-only layer"
    );
}
