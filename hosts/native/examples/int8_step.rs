//! Profiling harness for the int8 step: `cargo run --release -p frugal-cli --example int8_step --
//! f32|pure|master [steps]` trains the small CNN (`examples/digits-cnn.toml`) at batch 64 for `steps`
//! steps (default 2000) from initialisation and prints ms/step and the rescale counters — the workload of
//! `cargo xtask bench int8`'s speed row, as one binary to run under `valgrind --tool=callgrind` (repeatable
//! instruction counts; perf has no hardware counters on this kind of VM) or `perf record -e cpu-clock`.
use std::path::PathBuf;
use std::time::Instant;

use frugal_cli::spec_toml::load_model;
use frugal_cli::train::DEFAULT_UPDATE_BITS;
use frugal_core::exec::int8::Int8Executor;
use frugal_core::exec::{Executor, Target};
use frugal_core::graph::Graph;
use frugal_core::model::{Int8Update, Precision};
use frugal_core::plan::Plan;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("pure");
    let steps: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2000);
    let p = match mode {
        "f32" => Precision::F32,
        "master" => Precision::Int8(Int8Update::FloatMaster),
        _ => Precision::Int8(Int8Update::Integer {
            update_bits: DEFAULT_UPDATE_BITS,
        }),
    };
    let m = load_model(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/digits-cnn.toml"),
    )
    .unwrap();
    let (data, _) = frugal_cli::data::digits();
    let batch = 64;
    let per = m.spec.input.numel();
    let g = Graph::with_precision(&m.spec, batch, p).unwrap();
    let plan = Plan::new(g);
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut xb = vec![0f32; batch * per];
    let mut yb = vec![0u32; batch];
    let order: Vec<usize> = (0..data.len()).collect();
    let mut f32ex = None;
    let mut i8ex = None;
    if p == Precision::F32 {
        let mut e = Executor::new(&plan, &arena).unwrap();
        e.init_params(&mut arena, 1).unwrap();
        f32ex = Some(e);
    } else {
        let mut e = Int8Executor::new(&plan, &arena).unwrap();
        e.init_params(&mut arena, 1).unwrap();
        i8ex = Some(e);
    }
    let t = Instant::now();
    let mut loss = 0.0;
    for s in 0..steps {
        let start = (s * batch) % (data.len() - batch);
        data.batch(&order[start..start + batch], &mut xb, &mut yb);
        let st = if let Some(e) = f32ex.as_mut() {
            e.train_step(&mut arena, &xb, Target::Classes(&yb)).unwrap()
        } else {
            i8ex.as_mut()
                .unwrap()
                .train_step(&mut arena, &xb, Target::Classes(&yb))
                .unwrap()
        };
        loss = st.loss;
    }
    let ms = t.elapsed().as_secs_f64() * 1e3 / steps as f64;
    println!("{mode}: {ms:.4} ms/step, last loss {loss:.4}");
    if let Some(e) = i8ex {
        println!("{}", e.counts());
    }
}
