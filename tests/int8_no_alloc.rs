//! An int8 training step (both update modes, whole or tiled weight gradients) allocates nothing: a
//! counting global allocator sees zero allocations while the integer executor trains and evaluates
//! (after planning, which may allocate).
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use frugal_cli::workloads;
use frugal_core::exec::int8::Int8Executor;
use frugal_core::exec::Target;
use frugal_core::graph::{Graph, GraphOptions};
use frugal_core::kernels::int8::KernelFamily;
use frugal_core::model::{Int8Update, LayerKind, LayerSpec, Precision, Src};
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
        ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap(); // warm-up
        ALLOCS.store(0, Ordering::Relaxed);
        COUNTING.store(true, Ordering::Relaxed);
        for _ in 0..3 {
            ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
        }
        ex.evaluate(&mut arena, &x, Target::Classes(&y)).unwrap();
        COUNTING.store(false, Ordering::Relaxed);
        assert_eq!(
            ALLOCS.load(Ordering::Relaxed),
            0,
            "{update:?}, {} kernels, grad_tile {grad_tile}: an int8 step allocated",
            kernels.name()
        );
        assert!(ex.counts().passes() > 0);
    }
}
