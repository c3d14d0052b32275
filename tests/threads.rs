//! Threads change nothing but speed: training steps on a `ThreadPool` of 2, 3 and 4 workers leave every
//! weight, optimizer state and loss bit-identical to one thread, on every reference workload (kernels split
//! output ranges, never a reduction). Bit-exact on purpose: no tolerance.
use frugal_cli::workloads;
use frugal_core::backend::{Backend, CpuBackend};
use frugal_core::exec::{Executor, Target};
use frugal_core::graph::{Graph, GraphOptions};
use frugal_core::model::LossKind;
use frugal_core::plan::Plan;
use frugal_core::pool::{SingleThread, ThreadPool, WorkerPool};
use frugal_core::rng::Rng;

/// Trains `steps` steps of workload `id` at `batch` on `pool`; returns (losses, every state tensor's bits).
fn run<P: WorkerPool>(id: &str, batch: usize, steps: usize, pool: P) -> (Vec<u32>, Vec<Vec<u32>>) {
    let w = workloads::all().into_iter().find(|w| w.id == id).unwrap();
    // Scratch for every worker, as a host that knows its thread count plans.
    let options = GraphOptions {
        threads: pool.threads(),
        ..GraphOptions::default()
    };
    let plan = Plan::new(Graph::with_options(&w.spec, batch, options).unwrap());
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::with_backend(&plan, &arena, CpuBackend::with_pool(pool)).unwrap();
    ex.init_params(&mut arena, 7).unwrap();
    let per = w.spec.input.numel();
    let outs = plan.graph.pred_dims().numel();
    let mut rng = Rng::new(3);
    let x: Vec<f32> = (0..batch * per).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let tv: Vec<f32> = (0..batch * outs).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let tc: Vec<u32> = (0..batch).map(|i| (i % outs) as u32).collect();
    let mut losses = Vec::new();
    for _ in 0..steps {
        let t = if w.spec.loss == LossKind::Mse {
            Target::Values(&tv)
        } else {
            Target::Classes(&tc)
        };
        losses.push(ex.train_step(&mut arena, &x, t).unwrap().loss.to_bits());
    }
    (losses, state_bits(&ex, &mut arena))
}

fn state_bits<B: Backend>(ex: &Executor<'_, B>, arena: &mut [u8]) -> Vec<Vec<u32>> {
    let ids: Vec<_> = ex.state_tensors().map(|(_, _, t)| t).collect();
    ids.into_iter()
        .map(|t| {
            ex.read(arena, t)
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect()
}

#[test]
fn threaded_steps_are_bit_identical_to_one_thread() {
    // Small batches keep the debug build quick; odd sizes exercise the edge tiles of the split.
    let rows = [
        ("mlp", 33),
        ("lenet5", 7),
        ("small_cnn", 5),
        ("fc3", 19),
        ("fc3_frozen_mid", 9),
        ("conv2d", 2),
        ("conv_ac_fl", 2),
    ];
    let pools: Vec<ThreadPool> = [2, 3, 4]
        .into_iter()
        .map(|n| ThreadPool::new(n).unwrap())
        .collect();
    for (id, batch) in rows {
        let one = run(id, batch, 2, SingleThread);
        for pool in &pools {
            let many = run(id, batch, 2, pool);
            assert!(
                one == many,
                "{id} b{batch}: {} threads differ from one thread",
                pool.threads()
            );
        }
    }
}
