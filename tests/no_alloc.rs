//! A training step allocates nothing: a counting global allocator sees zero allocations while the
//! executor trains, evaluates and predicts (after planning, which may allocate).
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use frugal_cli::workloads;
use frugal_core::exec::{Executor, Target};
use frugal_core::graph::Graph;
use frugal_core::model::{LayerKind, LayerSpec, OptimizerSpec, Src};
use frugal_core::plan::Plan;

struct Counting;
static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: defers to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

#[test]
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

    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
    }
    ex.train_step(&mut arena, &x[..7 * 784], Target::Classes(&y[..7]))
        .unwrap();
    ex.evaluate(&mut arena, &x, Target::Classes(&y)).unwrap();
    ex.predict(&mut arena, &x).unwrap();
    COUNTING.store(false, Ordering::SeqCst);
    assert_eq!(
        ALLOCS.load(Ordering::SeqCst),
        0,
        "heap allocations during training steps"
    );
}
