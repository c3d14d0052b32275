//! A training step allocates nothing: a counting global allocator sees zero allocations while the
//! executor trains, evaluates and predicts (after planning, which may allocate).
use frugal_cli::workloads;
use frugal_core::backend::CpuBackend;
use frugal_core::budget::Budget;
use frugal_core::exec::int8::Int8Executor;
use frugal_core::exec::{Adapted, Executor, Target};
use frugal_core::graph::{Graph, GraphOptions};
use frugal_core::kernels::int8::KernelFamily;
use frugal_core::model::{
    Dims, Int8Update, LayerKind, LayerSpec, LossKind, ModelSpec, OptimizerSpec, Precision, Src,
};
use frugal_core::plan::params::{split_state, ParamEncoding};
use frugal_core::plan::table::{PlanEntry, PlanTable};
use frugal_core::plan::{Phase, Plan, SpaceId};
use frugal_tests::counting::{allocations, run, Counting};

#[global_allocator]
static A: Counting = Counting;

fn main() {
    run(&[
        (
            "training_steps_allocate_nothing",
            training_steps_allocate_nothing,
        ),
        (
            "every_plan_kind_steps_without_allocating",
            every_plan_kind_steps_without_allocating,
        ),
        (
            "int8_training_steps_allocate_nothing",
            int8_training_steps_allocate_nothing,
        ),
        (
            "threaded_steps_allocate_nothing",
            threaded_steps_allocate_nothing,
        ),
        (
            "adaptive_steps_switch_plans_without_allocating",
            adaptive_steps_switch_plans_without_allocating,
        ),
        (
            "micro_batched_adaptive_steps_switch_without_allocating",
            micro_batched_adaptive_steps_switch_without_allocating,
        ),
        (
            "transformer_steps_allocate_nothing",
            transformer_steps_allocate_nothing,
        ),
        (
            "attention_recompute_steps_allocate_nothing",
            attention_recompute_steps_allocate_nothing,
        ),
        (
            "sparse_update_steps_allocate_nothing",
            sparse_update_steps_allocate_nothing,
        ),
    ]);
}

/// A transformer step with its attention in recompute mode (`GraphOptions::attn_recompute`: the
/// backward recomputes the probabilities tile by tile into its planned scratch) allocates nothing, whole
/// batch and micro-batched.
fn attention_recompute_steps_allocate_nothing() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden");
    let spec = frugal_cli::spec_toml::load_model(&dir.join("gpt.toml"))
        .unwrap()
        .spec;
    let (batch, seq) = (4, spec.input.numel());
    let x: Vec<f32> = (0..batch * seq).map(|i| ((i * 7) % 128) as f32).collect();
    let y: Vec<u32> = (0..batch * seq).map(|i| ((i * 5) % 128) as u32).collect();
    for m in [1usize, 2] {
        let options = GraphOptions {
            attn_recompute: true,
            ..GraphOptions::default()
        };
        let g = Graph::with_options(&spec, batch / m, options).unwrap();
        assert!(g.attn_recompute());
        let plan = Plan::shaped(
            g,
            frugal_core::plan::PlanShape {
                micro_batches: m as u16,
                in_place: true,
            },
        );
        let mut arena = vec![0u8; plan.needed_bytes()];
        let mut ex = Executor::new(&plan, &arena).unwrap();
        ex.init_params(&mut arena, 1).unwrap();
        let ((), n) = allocations(|| {
            for _ in 0..2 {
                ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
            }
        });
        assert_eq!(
            n, 0,
            "recompute-mode attention, {m} micro-batch(es): heap allocations"
        );
    }
}

/// A transformer step (embedding, positions, LayerNorm/RMSNorm, causal attention, GELU/SiLU, residual
/// adds, sequence cross-entropy, AdamW) allocates nothing — trained in full and with LoRA adapters,
/// whole batch and micro-batched, plus evaluation and prediction; likewise an LSTM and a GRU language
/// model step (the golden `lstm` and `gru` cases: two stacked recurrent layers each, every time step
/// its own forward and backward instruction).
fn transformer_steps_allocate_nothing() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden");
    for case in ["gpt", "gpt_lora", "lstm", "gru"] {
        let spec = frugal_cli::spec_toml::load_model(&dir.join(format!("{case}.toml")))
            .unwrap()
            .spec;
        let (batch, seq) = (4, spec.input.numel());
        let x: Vec<f32> = (0..batch * seq).map(|i| ((i * 7) % 128) as f32).collect();
        let y: Vec<u32> = (0..batch * seq).map(|i| ((i * 5) % 128) as u32).collect();
        for m in [1usize, 2] {
            let plan = Plan::shaped(
                Graph::new(&spec, batch / m).unwrap(),
                frugal_core::plan::PlanShape {
                    micro_batches: m as u16,
                    in_place: true,
                },
            );
            // The recurrent layers run one instruction per time step.
            let steps = plan
                .program
                .iter()
                .filter(|i| i.phase == frugal_core::plan::Phase::StepBwd)
                .count();
            assert_eq!(steps > 0, matches!(case, "lstm" | "gru"), "{case}");
            let mut arena = vec![0u8; plan.needed_bytes()];
            let mut ex = Executor::new(&plan, &arena).unwrap();
            ex.init_params(&mut arena, 1).unwrap();
            let ((), n) = allocations(|| {
                for _ in 0..2 {
                    ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
                }
                if m == 1 {
                    ex.evaluate(&mut arena, &x, Target::Classes(&y)).unwrap();
                    ex.predict(&mut arena, &x).unwrap();
                }
            });
            assert_eq!(n, 0, "{case}, {m} micro-batch(es): heap allocations");
        }
    }
}

fn training_steps_allocate_nothing() {
    // Every layer kind: the small CNN plus BatchNorm, residual add, dropout, depthwise conv, Adam.
    let mut spec = workloads::all()
        .into_iter()
        .find(|w| w.id == "small_cnn")
        .unwrap()
        .spec;
    let extra = [
        (
            "bn",
            LayerKind::BatchNorm2d {
                eps: 1e-5,
                momentum: 0.1,
            },
        ),
        (
            "dw",
            LayerKind::Conv2d {
                out: 8,
                kernel: [3, 3],
                stride: [1, 1],
                padding: [1, 1],
                groups: 8,
                bias: false,
            },
        ),
        ("act", LayerKind::Relu6),
    ];
    // Insert after pool1 (index 2): bn → dw → relu6 → add(pool1, relu6) → dropout, then conv2 continues.
    let mut layers = spec.layers[..3].to_vec();
    for (name, k) in extra {
        layers.push(LayerSpec {
            name: name.into(),
            kind: k,
            inputs: vec![Src::Layer(layers.len() as u32 - 1)],
            trainable: true,
            update: frugal_core::model::Update::All,
        });
    }
    layers.push(LayerSpec {
        name: "add".into(),
        kind: LayerKind::Add,
        inputs: vec![Src::Layer(2), Src::Layer(5)],
        trainable: true,
        update: frugal_core::model::Update::All,
    });
    layers.push(LayerSpec {
        name: "drop".into(),
        kind: LayerKind::Dropout { p: 0.2 },
        inputs: vec![Src::Layer(6)],
        trainable: true,
        update: frugal_core::model::Update::All,
    });
    for l in &spec.layers[3..] {
        let mut l = l.clone();
        l.inputs = vec![Src::Layer(layers.len() as u32 - 1)];
        layers.push(l);
    }
    spec.layers = layers;
    spec.optimizer = OptimizerSpec::Adam {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 1e-4,
    };

    let batch = 16;
    let plan = Plan::new(Graph::new(&spec, batch).unwrap());
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(&plan, &arena).unwrap();
    ex.init_params(&mut arena, 1).unwrap();
    let x: Vec<f32> = (0..batch * 784).map(|i| (i % 17) as f32 / 17.0).collect();
    let y: Vec<u32> = (0..batch as u32).map(|i| i % 10).collect();

    // The very first step counts too: nothing is warmed up.
    let ((), n) = allocations(|| {
        for _ in 0..3 {
            ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
        }
        ex.train_step(&mut arena, &x[..7 * 784], Target::Classes(&y[..7]))
            .unwrap();
        ex.evaluate(&mut arena, &x, Target::Classes(&y)).unwrap();
        ex.predict(&mut arena, &x).unwrap();
    });
    assert_eq!(n, 0, "heap allocations during training steps");
}

/// A spill store whose far memory is allocated up front (a host's file or flash region): swapping
/// allocates nothing.
struct Preallocated {
    slots: Vec<(u32, Vec<u8>)>,
}

impl frugal_core::spill::Spill for Preallocated {
    fn write(&mut self, key: u32, data: &[u8]) -> Result<(), frugal_core::spill::SpillError> {
        let (_, buf) = self
            .slots
            .iter_mut()
            .find(|(k, b)| *k == key && b.len() >= data.len())
            .expect("a slot sized for every swapped tensor");
        buf[..data.len()].copy_from_slice(data);
        Ok(())
    }
    fn read(&mut self, key: u32, out: &mut [u8]) -> Result<(), frugal_core::spill::SpillError> {
        let (_, buf) = self.slots.iter().find(|(k, _)| *k == key).unwrap();
        let n = out.len();
        out.copy_from_slice(&buf[..n]);
        Ok(())
    }
}

/// Every plan kind the policies make — micro-batched, recomputing, fp16 storage, spilled — trains its
/// very first step (nothing warmed up) and every later one without a heap allocation.
fn every_plan_kind_steps_without_allocating() {
    use frugal_core::policy::{half, recompute, spaces, swap, CostModel};
    let spec = workloads::all()
        .into_iter()
        .find(|w| w.id == "small_cnn")
        .unwrap()
        .spec;
    let g = Graph::new(&spec, 8).unwrap();
    let cost = CostModel::estimate(&g);
    let plain_bytes = Plan::new(g.clone()).arena_bytes;
    let plans: Vec<(&str, Plan)> = vec![
        (
            "micro-batched ×3",
            recompute(&g, 3, usize::MAX, &cost).unwrap(),
        ),
        (
            "recompute at the smallest budget",
            recompute(&g, 1, 0, &cost).unwrap_or_else(|p| p),
        ),
        ("fp16 storage", half::f16_storage(&g)),
        (
            "spilled",
            swap::plan_swap(&g, 2, plain_bytes / 2).unwrap_or_else(|p| p),
        ),
        (
            "moved (within the host arena)",
            spaces::offload(&g, SpaceId::HOST, 64, |_, _| true),
        ),
    ];
    let x: Vec<f32> = (0..24 * 784).map(|i| (i % 13) as f32 / 13.0).collect();
    let y: Vec<u32> = (0..24u32).map(|i| i % 10).collect();
    for (what, plan) in &plans {
        let n = plan.batch();
        let mut arena = vec![0u8; plan.needed_bytes()];
        let mut ex = Executor::new(plan, &arena).unwrap();
        ex.init_params(&mut arena, 1).unwrap();
        let swaps: Vec<u32> = plan.program.iter().filter_map(|i| i.spilled()).collect();
        let mut spill = Preallocated {
            slots: swaps
                .iter()
                .map(|&t| {
                    (
                        t,
                        vec![0u8; plan.graph.tensors[t as usize].bytes.max(1) * 2],
                    )
                })
                .collect(),
        };
        let (x, y) = (&x[..n * 784], &y[..n]);
        let ((), n) = allocations(|| {
            for _ in 0..2 {
                if swaps.is_empty() {
                    ex.train_step(&mut arena, x, Target::Classes(y)).unwrap();
                } else {
                    ex.train_step_spilled(&mut arena, x, Target::Classes(y), &mut spill)
                        .unwrap();
                }
            }
        });
        assert_eq!(n, 0, "{what}: allocations during steps");
        if *what == "spilled" {
            assert!(!swaps.is_empty(), "the spilled plan swaps");
        }
        if what.starts_with("moved") {
            assert!(spaces::move_volume(plan).0 > 0, "the moving plan moves");
        }
    }
}

fn int8_training_steps_allocate_nothing() {
    // The small CNN plus a residual add, a depthwise conv and average pooling: every int8 op.
    let mut spec = workloads::all()
        .into_iter()
        .find(|w| w.id == "small_cnn")
        .unwrap()
        .spec;
    let k = spec.layers.len();
    let first_pool = spec
        .layers
        .iter()
        .position(|l| matches!(l.kind, LayerKind::MaxPool2d { .. }))
        .unwrap();
    let c = match spec.layers[0].kind {
        LayerKind::Conv2d { out, .. } => out,
        _ => panic!("small_cnn starts with a conv"),
    };
    // Insert after the first pool: dw conv (same shape), add(pool, dw), avgpool 1×1 stride 1.
    let extra = vec![
        LayerSpec {
            name: "dw".into(),
            kind: LayerKind::Conv2d {
                out: c,
                kernel: [3, 3],
                stride: [1, 1],
                padding: [1, 1],
                groups: c,
                bias: true,
            },
            inputs: vec![Src::Layer(first_pool as u32)],
            trainable: true,
            update: frugal_core::model::Update::All,
        },
        LayerSpec {
            name: "res".into(),
            kind: LayerKind::Add,
            inputs: vec![
                Src::Layer(first_pool as u32),
                Src::Layer(first_pool as u32 + 1),
            ],
            trainable: true,
            update: frugal_core::model::Update::All,
        },
        LayerSpec {
            name: "avg".into(),
            kind: LayerKind::AvgPool2d {
                kernel: [1, 1],
                stride: [1, 1],
            },
            inputs: vec![Src::Layer(first_pool as u32 + 2)],
            trainable: true,
            update: frugal_core::model::Update::All,
        },
    ];
    let rest: Vec<LayerSpec> = spec.layers.drain(first_pool + 1..).collect();
    spec.layers.extend(extra);
    let shift = 3u32;
    for mut l in rest {
        for s in l.inputs.iter_mut() {
            if let Src::Layer(j) = s {
                if *j as usize >= first_pool {
                    *j += shift;
                }
            }
        }
        spec.layers.push(l);
    }
    assert_eq!(spec.layers.len(), k + 3);
    let batch = 8;
    let updates = [
        Int8Update::FloatMaster,
        Int8Update::Integer { update_bits: 4 },
    ];
    // Whole weight gradients with scratch for any kernel (hosts), and the microcontroller's sizing:
    // the portable kernel's scratch and Linear weight gradients in tiles of 64 elements.
    let sizings = [(KernelFamily::Any, 0), (KernelFamily::Portable, 64)];
    for (update, (kernels, grad_tile)) in updates.into_iter().flat_map(|u| sizings.map(|s| (u, s)))
    {
        let options = GraphOptions {
            precision: Precision::Int8(update),
            kernels,
            grad_tile,
            ..GraphOptions::default()
        };
        let plan = Plan::new(Graph::with_options(&spec, batch, options).unwrap());
        let mut arena = vec![0u8; plan.needed_bytes()];
        let mut ex = Int8Executor::new(&plan, &arena).unwrap();
        ex.init_params(&mut arena, 1).unwrap();
        let per = spec.input.numel();
        let x: Vec<f32> = (0..batch * per).map(|i| (i % 13) as f32 / 13.0).collect();
        let y: Vec<u32> = (0..batch as u32).map(|i| i % 10).collect();
        let mut pred = vec![0f32; batch * plan.graph.pred_dims().numel()];
        // The very first step counts: nothing is warmed up.
        let ((), n) = allocations(|| {
            for _ in 0..3 {
                ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
            }
            ex.evaluate(&mut arena, &x, Target::Classes(&y)).unwrap();
            ex.predict_into(&mut arena, &x, &mut pred).unwrap();
        });
        assert_eq!(
            n,
            0,
            "{update:?}, {} kernels, grad_tile {grad_tile}: an int8 step, evaluation or prediction allocated",
            kernels.name()
        );
        assert!(ex.counts().passes() > 0);
    }
}

/// A step on a 2- and a 3-worker `ThreadPool` allocates nothing on any thread (the pool exists before the
/// step, as a host keeps it): the workloads with the largest GEMMs and convolutions, where work is split.
fn threaded_steps_allocate_nothing() {
    use frugal_core::backend::CpuBackend;
    use frugal_core::pool::{ThreadPool, WorkerPool};
    for threads in [2, 3] {
        let pool = ThreadPool::new(threads).unwrap();
        for (id, batch) in [
            ("fc3", 64),
            ("conv2d", 2),
            ("small_cnn", 16),
            ("lenet5", 16),
        ] {
            let w = workloads::all().into_iter().find(|w| w.id == id).unwrap();
            let options = GraphOptions {
                threads,
                ..GraphOptions::default()
            };
            let plan = Plan::new(Graph::with_options(&w.spec, batch, options).unwrap());
            let mut arena = vec![0u8; plan.needed_bytes()];
            let mut ex =
                Executor::with_backend(&plan, &arena, CpuBackend::with_pool(&pool)).unwrap();
            ex.init_params(&mut arena, 1).unwrap();
            let per = w.spec.input.numel();
            let outs = plan.graph.pred_dims().numel();
            let x: Vec<f32> = (0..batch * per).map(|i| (i % 11) as f32 / 11.0).collect();
            let tv: Vec<f32> = (0..batch * outs).map(|i| (i % 5) as f32 / 5.0).collect();
            let tc: Vec<u32> = (0..batch).map(|i| (i % outs) as u32).collect();
            let mse = w.spec.loss == frugal_core::model::LossKind::Mse;
            // The very first step counts.
            let ((), n) = allocations(|| {
                for _ in 0..2 {
                    let t = if mse {
                        Target::Values(&tv)
                    } else {
                        Target::Classes(&tc)
                    };
                    ex.train_step(&mut arena, &x, t).unwrap();
                }
            });
            assert_eq!(
                n,
                0,
                "{id} b{batch} on {} threads: allocations during steps",
                pool.threads()
            );
        }
    }
}

/// Where one adaptive step's host reports budgets (`big`, `mid`, `small`: what the table's largest,
/// middle and smallest plans need). Decided from the plan in force and its next instruction only, so
/// the schedule itself allocates nothing.
#[derive(Clone, Copy)]
enum Drops<'e> {
    /// Budgets `(eo, bytes)`, in order: each before instruction `eo` of the plan then in force.
    At(&'e [(usize, usize)]),
    /// Down to `mid` in the middle of the forward pass, then down to `small` inside a recompute chain.
    ForwardThenInRecompute,
    /// Up to `big` mid-step: the plan in force still fits, so the switch is lazy, after the step.
    Rise,
    /// Down to `mid`, then to `small`, each before an instruction of the second micro-batch (inside the
    /// micro-batch loop), then back up to `big` near the end (a lazy switch).
    InMicroBatch,
}

/// Runs one adaptive step with the drops of `how`; the step must succeed.
fn adaptive_step<'p>(
    ex: &mut Executor<'p>,
    arena: &mut [u8],
    x: &[f32],
    y: &[u32],
    table: &'p PlanTable,
    (big, mid, small): (usize, usize, usize),
    how: Drops<'_>,
) -> Adapted {
    let mut stage = 0u8;
    let mut budget_at = |eo: usize, p: &Plan| {
        let ins = p.program[eo];
        let in_recompute =
            eo > 0 && ins.phase == Phase::Recompute && p.program[eo - 1].phase == Phase::Recompute;
        let b = match (how, stage) {
            (Drops::At(at), s) if at.get(s as usize).is_some_and(|a| a.0 == eo) => {
                Some(at[s as usize].1)
            }
            (Drops::ForwardThenInRecompute, 0) if eo == p.program.len() / 5 => Some(mid),
            (Drops::ForwardThenInRecompute, 1) if in_recompute => Some(small),
            (Drops::Rise, 0) if eo == p.program.len() / 3 => Some(big),
            (Drops::InMicroBatch, 0 | 1) if ins.mb == 1 && ins.phase != Phase::Recompute => {
                Some(if stage == 0 { mid } else { small })
            }
            (Drops::InMicroBatch, 2) if eo + 3 == p.program.len() => Some(big),
            _ => None,
        };
        stage += u8::from(b.is_some());
        b.map(Budget::new)
    };
    let (_, ad) = ex
        .train_step_adaptive(arena, x, Target::Classes(y), table, &mut budget_at, &mut ())
        .unwrap();
    ad
}

/// An adaptive step switches plans mid-step (before its first instruction, in the forward pass, inside
/// chains of recomputations, with regeneration) and lazily after the step — and none of it allocates,
/// from the very first step, once the executor has sized its switches' scratch for the table.
fn adaptive_steps_switch_plans_without_allocating() {
    use frugal_core::policy::ladder::ladder;
    use frugal_core::policy::{recompute, CostModel};
    let spec = bn_residual_cnn(2);
    let batch = 16;
    let g = Graph::new(&spec, batch).unwrap();
    let cost = CostModel::estimate(&g);
    let plain = Plan::new(g.clone()).needed_bytes();
    let (Ok(least) | Err(least)) = recompute(&g, 1, 0, &cost);
    let least = least.needed_bytes();
    let mut budgets: Vec<usize> = (0..=8).map(|k| least + (plain - least) * k / 8).collect();
    budgets.push(plain / 2);
    let table = ladder(&spec, batch, &budgets, &cost).unwrap();
    assert!(table.entries.len() >= 3, "a ladder of at least three plans");
    let need = |i: usize| table.entries[i].plan.needed_bytes();
    let levels = (
        need(table.entries.len() - 1),
        need(table.entries.len() / 2),
        need(0),
    );
    assert!(
        table.entries[0]
            .plan
            .program
            .iter()
            .any(|i| i.phase == Phase::Recompute),
        "the smallest plan recomputes"
    );
    let x: Vec<f32> = (0..batch * 64).map(|i| (i % 13) as f32 / 13.0).collect();
    let y: Vec<u32> = (0..batch as u32).map(|i| i % 3).collect();
    let mut arena = vec![0u8; levels.0];
    let start = &table.entries.last().unwrap().plan;
    let mid = &table.entries[table.entries.len() / 2].plan;
    // A step that starts on the largest plan, switches to the middle one before its first instruction
    // and drops to the smallest one inside the middle plan's recomputations, regenerating values (found
    // by trying, before anything is counted; the switch depends on the plans and the position only).
    let trial = |events: &[(usize, usize)], arena: &mut [u8]| {
        let mut ex = Executor::new(start, arena).unwrap();
        ex.init_params(arena, 1).unwrap();
        ex.prepare_adaptive(&table);
        adaptive_step(&mut ex, arena, &x, &y, &table, levels, Drops::At(events))
    };
    let recomputing = (1..mid.program.len()).filter(|&r| mid.program[r].phase == Phase::Recompute);
    let regen = recomputing
        .chain(1..mid.program.len())
        .map(|r| [(0, levels.1), (r, levels.2)])
        .find(|ev| {
            let ad = trial(ev, &mut arena);
            ad.switches == 2 && ad.recomputed > 0
        })
        .expect("a drop that regenerates");
    let steps = [
        Drops::At(&regen),
        Drops::Rise,
        Drops::ForwardThenInRecompute,
        Drops::Rise,
        Drops::At(&regen),
    ];

    // The counter sees a switch's allocations: without the scratch sized up front, the first adaptive
    // step sizes it (and allocates).
    let mut cold = Executor::new(start, &arena).unwrap();
    cold.init_params(&mut arena, 1).unwrap();
    let (_, n) =
        allocations(|| adaptive_step(&mut cold, &mut arena, &x, &y, &table, levels, steps[0]));
    assert!(n > 0, "sizing the scratch in the first step allocates");

    let mut ex = Executor::new(start, &arena).unwrap();
    ex.init_params(&mut arena, 1).unwrap();
    ex.prepare_adaptive(&table);
    let mut ads = [Adapted::default(); 5];
    // The very first step counts: nothing is warmed up.
    let ((), n) = allocations(|| {
        for (ad, how) in ads.iter_mut().zip(steps) {
            *ad = adaptive_step(&mut ex, &mut arena, &x, &y, &table, levels, how);
        }
    });
    assert_eq!(n, 0, "heap allocations during adaptive steps: {ads:?}");
    // The switches did happen: before the first instruction, mid-step inside recomputations (with
    // regeneration) and lazily after the step.
    for i in [0, 4] {
        assert!(ads[i].switches == 2 && ads[i].recomputed > 0, "{ads:?}");
    }
    assert!(ads[1].switched_after && ads[3].switched_after, "{ads:?}");
    assert!(ads[2].switches >= 2, "{ads:?}");
    assert!(
        std::ptr::eq(ex.plan(), &table.entries[0].plan),
        "ends on the smallest plan"
    );
}

/// conv-bn-relu, `blocks` residual blocks (depthwise conv-bn-relu, pointwise conv-bn, add, relu),
/// global average pool, flatten and a linear layer, on 1×8×8 with 4 channels: deep enough for a ladder
/// of recomputing plans, with BatchNorm (a restart after its first forward would update its running
/// statistics twice, so switches must line up).
fn bn_residual_cnn(blocks: u32) -> ModelSpec {
    let layer = |kind: LayerKind, from: u32| LayerSpec {
        name: String::new(),
        kind,
        inputs: vec![Src::Layer(from)],
        trainable: true,
        update: frugal_core::model::Update::All,
    };
    let conv = |out: u32, k: u32, groups: u32| LayerKind::Conv2d {
        out,
        kernel: [k, k],
        stride: [1, 1],
        padding: [k / 2, k / 2],
        groups,
        bias: false,
    };
    let bn = LayerKind::BatchNorm2d {
        eps: 1e-5,
        momentum: 0.1,
    };
    let mut layers = vec![LayerSpec {
        inputs: vec![Src::Input],
        ..layer(conv(4, 3, 1), 0)
    }];
    layers.push(layer(bn.clone(), 0));
    layers.push(layer(LayerKind::Relu, 1));
    for _ in 0..blocks {
        let x = layers.len() as u32 - 1;
        layers.push(layer(conv(4, 3, 4), x));
        layers.push(layer(bn.clone(), x + 1));
        layers.push(layer(LayerKind::Relu, x + 2));
        layers.push(layer(conv(4, 1, 1), x + 3));
        layers.push(layer(bn.clone(), x + 4));
        layers.push(LayerSpec {
            inputs: vec![Src::Layer(x), Src::Layer(x + 5)],
            ..layer(LayerKind::Add, x)
        });
        layers.push(layer(LayerKind::Relu, x + 6));
    }
    let x = layers.len() as u32 - 1;
    layers.push(layer(LayerKind::GlobalAvgPool, x));
    layers.push(layer(LayerKind::Flatten, x + 1));
    layers.push(layer(LayerKind::Linear { out: 3, bias: true }, x + 2));
    for (i, l) in layers.iter_mut().enumerate() {
        l.name = format!("l{i}");
    }
    ModelSpec {
        input: Dims::new(1, 8, 8),
        layers,
        loss: LossKind::SoftmaxCrossEntropy,
        optimizer: OptimizerSpec::Adam {
            lr: 1e-2,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        },
        seed: 5,
    }
}

/// A sparse update (frozen stem, BatchNorm β only, a channel fraction of the depthwise and pointwise
/// convolutions, the classifier's bias only), plain and micro-batched, allocates nothing per step.
fn sparse_update_steps_allocate_nothing() {
    use frugal_core::model::Update;
    let mut spec = bn_residual_cnn(2);
    for (i, l) in spec.layers.iter_mut().enumerate() {
        match (&l.kind, i) {
            (_, 0) => l.trainable = false,
            (LayerKind::BatchNorm2d { .. }, _) => l.update = Update::Bias,
            (LayerKind::Conv2d { .. }, _) => l.update = Update::Channels(0.5),
            (LayerKind::Linear { .. }, _) => l.update = Update::Bias,
            _ => {}
        }
    }
    let batch = 8;
    let g = Graph::new(&spec, batch).unwrap();
    assert!(g
        .params()
        .any(|(_, p)| p.grad.is_some() && p.updated < p.shape.iter().product()));
    let shape = frugal_core::plan::PlanShape {
        micro_batches: 2,
        ..Default::default()
    };
    // Frozen parameters read from a parameter image, f32 and int8 (dequantised per instruction).
    let plain = Plan::new(g.clone());
    let state: Vec<u8> = {
        let mut arena = vec![0u8; plain.needed_bytes()];
        let mut ex = Executor::new(&plain, &arena).unwrap();
        ex.init_params(&mut arena, 1).unwrap();
        let ids: Vec<_> = ex.state_ids().collect();
        ids.into_iter()
            .flat_map(|t| ex.read_vec(&mut arena, t).unwrap())
            .flat_map(f32::to_le_bytes)
            .collect()
    };
    let mut images = Vec::new();
    let mut plans = vec![plain.clone(), Plan::shaped(g, shape)];
    for enc in [ParamEncoding::F32, ParamEncoding::Int8] {
        let mut ro = plain.clone();
        assert!(ro.read_only_params(enc).unwrap() > 0);
        images.push(split_state(&ro, &state).unwrap());
        plans.push(ro);
    }
    for (k, plan) in plans.iter().enumerate() {
        let (image, rest) = match k.checked_sub(2) {
            Some(i) => (images[i].0.as_slice(), images[i].1.as_slice()),
            None => (&[][..], state.as_slice()),
        };
        let mut arena = vec![0u8; plan.needed_bytes()];
        let mut ex = Executor::with_params(plan, &arena, CpuBackend::new(), image).unwrap();
        ex.init_params(&mut arena, 1).unwrap();
        ex.write_state(&mut arena, rest).unwrap();
        let x: Vec<f32> = (0..batch * 64).map(|i| (i % 13) as f32 / 13.0).collect();
        let y: Vec<u32> = (0..batch as u32).map(|i| i % 3).collect();
        let ((), n) = allocations(|| {
            for _ in 0..3 {
                ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
            }
            ex.evaluate(&mut arena, &x, Target::Classes(&y)).unwrap();
        });
        assert_eq!(
            n, 0,
            "heap allocations during sparse-update steps (plan {k})"
        );
    }
}

/// The same inside the micro-batch loop: plans of two micro-batches at three budgets, budget drops at
/// instructions of the second micro-batch (moves, or a restart on the smaller plan) and a rise near the
/// end (a lazy switch), from the very first step, allocate nothing.
fn micro_batched_adaptive_steps_switch_without_allocating() {
    use frugal_core::policy::{recompute, CostModel};
    let spec = workloads::all()
        .into_iter()
        .find(|w| w.id == "small_cnn")
        .unwrap()
        .spec;
    let g = Graph::new(&spec, 4).unwrap();
    let cost = CostModel::estimate(&g);
    let (Ok(big) | Err(big)) = recompute(&g, 2, usize::MAX, &cost);
    let (Ok(least) | Err(least)) = recompute(&g, 2, 0, &cost);
    let (lo, hi) = (least.needed_bytes(), big.needed_bytes());
    let mut entries: Vec<PlanEntry> = Vec::new();
    for budget in [lo, (lo + hi) / 2, hi] {
        let (Ok(plan) | Err(plan)) = recompute(&g, 2, budget, &cost);
        if entries
            .last()
            .is_none_or(|e| e.plan.needed_bytes() < plan.needed_bytes())
        {
            entries.push(PlanEntry { budget, plan });
        }
    }
    let table = PlanTable { entries };
    assert!(
        table.entries.len() >= 2,
        "plans of two micro-batches at two budgets at least"
    );
    let need = |i: usize| table.entries[i].plan.needed_bytes();
    let k = table.entries.len();
    let levels = (need(k - 1), need(k / 2), need(0));
    let n = table.entries[0].plan.batch();
    let x: Vec<f32> = (0..n * 784).map(|i| (i % 7) as f32 / 7.0).collect();
    let y: Vec<u32> = (0..n as u32).map(|i| i % 10).collect();
    let mut arena = vec![0u8; levels.0];
    let mut ex = Executor::new(&table.entries[k - 1].plan, &arena).unwrap();
    ex.init_params(&mut arena, 1).unwrap();
    ex.prepare_adaptive(&table);
    let mut ads = [Adapted::default(); 3];
    let ((), allocs) = allocations(|| {
        for ad in ads.iter_mut() {
            *ad = adaptive_step(
                &mut ex,
                &mut arena,
                &x,
                &y,
                &table,
                levels,
                Drops::InMicroBatch,
            );
        }
    });
    assert_eq!(
        allocs, 0,
        "heap allocations during micro-batched adaptive steps: {ads:?}"
    );
    assert!(
        ads.iter().all(|a| a.switches >= 1 && a.switched_after),
        "{ads:?}"
    );
}
