//! A training step allocates nothing: a counting global allocator sees zero allocations while the
//! executor trains, evaluates and predicts (after planning, which may allocate).
use frugal_cli::workloads;
use frugal_core::exec::int8::Int8Executor;
use frugal_core::exec::{Executor, Target};
use frugal_core::graph::{Graph, GraphOptions};
use frugal_core::kernels::int8::KernelFamily;
use frugal_core::model::{Int8Update, LayerKind, LayerSpec, OptimizerSpec, Precision, Src};
use frugal_core::plan::{Plan, SpaceId};
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
    ]);
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
        });
    }
    layers.push(LayerSpec {
        name: "add".into(),
        kind: LayerKind::Add,
        inputs: vec![Src::Layer(2), Src::Layer(5)],
        trainable: true,
    });
    layers.push(LayerSpec {
        name: "drop".into(),
        kind: LayerKind::Dropout { p: 0.2 },
        inputs: vec![Src::Layer(6)],
        trainable: true,
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
        },
        LayerSpec {
            name: "res".into(),
            kind: LayerKind::Add,
            inputs: vec![
                Src::Layer(first_pool as u32),
                Src::Layer(first_pool as u32 + 1),
            ],
            trainable: true,
        },
        LayerSpec {
            name: "avg".into(),
            kind: LayerKind::AvgPool2d {
                kernel: [1, 1],
                stride: [1, 1],
            },
            inputs: vec![Src::Layer(first_pool as u32 + 2)],
            trainable: true,
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
        // The very first step counts: nothing is warmed up.
        let ((), n) = allocations(|| {
            for _ in 0..3 {
                ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
            }
            ex.evaluate(&mut arena, &x, Target::Classes(&y)).unwrap();
        });
        assert_eq!(
            n,
            0,
            "{update:?}, {} kernels, grad_tile {grad_tile}: an int8 step allocated",
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
