//! The workloads whose instructions `cargo xtask bench aarch64` counts under `qemu-aarch64` (a TCG
//! plugin adds up the instructions of every translated block each time it runs):
//!
//! ```text
//! insn_workload sgemm KERNEL REPS    # REPS products 512×512×512 (row-major), KERNEL = neon | portable
//! insn_workload step f32|int8 STEPS  # one warm-up step, then STEPS training steps of the digits CNN
//! ```
//!
//! Everything else the process does (loading, allocating, packing scratch, the warm-up step) is the same
//! for any `REPS`/`STEPS`, so the bench runs each workload twice (`N` and `0` repetitions) and divides the
//! difference by `N`. Builds for any std target; prints a checksum so nothing is optimised away.
use frugal_core::exec::int8::Int8Executor;
use frugal_core::exec::{Executor, Target};
use frugal_core::format::decode_model;
use frugal_core::graph::Graph;
use frugal_core::kernels::gemm::{gemm_scratch_len, sgemm_with, MatRef, SgemmKernel};
use frugal_core::model::{Int8Update, Precision};
use frugal_core::plan::Plan;
use frugal_core::rng::Rng;

/// Batch of the digits-CNN steps (the int8 bench's ms/step row uses the same).
const BATCH: usize = 64;
/// SGEMM size.
const N: usize = 512;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: insn_workload sgemm neon|portable REPS | step f32|int8 STEPS";
    let (what, which, reps) = match args.as_slice() {
        [w, k, r] => (w.as_str(), k.as_str(), r.parse::<usize>().expect(usage)),
        _ => panic!("{usage}"),
    };
    let sum = match what {
        "sgemm" => sgemm(which, reps),
        "step" => step(which, reps),
        _ => panic!("{usage}"),
    };
    println!("{what} {which} {reps}: checksum {sum}");
}

fn sgemm(kernel: &str, reps: usize) -> f64 {
    let kernel = match kernel {
        "neon" => SgemmKernel::Neon,
        "portable" => SgemmKernel::Portable,
        k => panic!("unknown kernel {k}"),
    };
    assert!(kernel.is_available(), "{kernel:?} is not available here");
    let mut rng = Rng::new(1);
    let a: Vec<f32> = (0..N * N).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let b: Vec<f32> = (0..N * N).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let mut c = vec![0.0f32; N * N];
    let mut scratch = vec![0.0f32; gemm_scratch_len(N, N, N)];
    for _ in 0..reps {
        let (a, b) = (MatRef::row_major(&a, N), MatRef::row_major(&b, N));
        sgemm_with(kernel, N, N, N, a, b, &mut c, N, false, &mut scratch);
    }
    c.iter().map(|&v| f64::from(v)).sum()
}

fn step(precision: &str, steps: usize) -> f64 {
    let spec = decode_model(include_bytes!("../../examples/digits-cnn.frgm")).expect("model");
    let per = spec.input.numel();
    let mut rng = Rng::new(2);
    let x: Vec<f32> = (0..BATCH * per).map(|_| rng.uniform(0.0, 1.0)).collect();
    let y: Vec<u32> = (0..BATCH).map(|_| rng.below(10) as u32).collect();
    let mut losses = 0.0f64;
    match precision {
        "f32" => {
            let plan = Plan::new(Graph::new(&spec, BATCH).expect("graph"));
            let mut arena = vec![0u8; plan.needed_bytes()];
            let mut ex = Executor::new(&plan, &arena).expect("executor");
            ex.init_params(&mut arena, 1).expect("init");
            for _ in 0..=steps {
                let s = ex.train_step(&mut arena, &x, Target::Classes(&y));
                losses += f64::from(s.expect("step").loss);
            }
        }
        "int8" => {
            // Pure-integer training with the CLI's default update width (`DEFAULT_UPDATE_BITS`).
            let p = Precision::Int8(Int8Update::Integer { update_bits: 4 });
            let plan = Plan::new(Graph::with_precision(&spec, BATCH, p).expect("graph"));
            let mut arena = vec![0u8; plan.needed_bytes()];
            let mut ex = Int8Executor::new(&plan, &arena).expect("executor");
            ex.init_params(&mut arena, 1).expect("init");
            for _ in 0..=steps {
                let s = ex.train_step(&mut arena, &x, Target::Classes(&y));
                losses += f64::from(s.expect("step").loss);
            }
        }
        p => panic!("unknown precision {p}"),
    }
    losses
}
