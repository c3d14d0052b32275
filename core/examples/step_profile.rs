//! Time per instruction of one training step (median over steps), for finding hot spots on a target:
//!
//! ```text
//! cargo run --release -p frugal-core --features std --example step_profile [-- MODEL.frgm BATCH STEPS]
//! ```
//!
//! Builds for any std target (`wasm32-wasip1` runs under Node's WASI: see `cargo xtask cross`).
use std::time::Instant;

use frugal_core::exec::{Executor, Observer, Target};
use frugal_core::format::decode_model;
use frugal_core::graph::Graph;
use frugal_core::plan::{Instr, Plan};

struct Times {
    last: Instant,
    ns: Vec<Vec<f64>>,
}

impl Observer for Times {
    fn after(&mut self, eo: usize, _: &Instr, _: &[u8]) {
        let now = Instant::now();
        self.ns[eo].push((now - self.last).as_secs_f64() * 1e9);
        self.last = now;
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bytes = match args.first() {
        Some(p) => std::fs::read(p).expect("model file"),
        None => include_bytes!("../../examples/digits-cnn.frgm").to_vec(),
    };
    let batch: usize = args.get(1).map_or(32, |v| v.parse().expect("batch"));
    let steps: usize = args.get(2).map_or(200, |v| v.parse().expect("steps"));
    let spec = decode_model(&bytes).expect("model");
    let plan = Plan::new(Graph::new(&spec, batch).expect("graph"));
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(&plan, &arena).expect("executor");
    ex.init_params(&mut arena, 1).expect("init");
    let per = spec.input.numel();
    let x: Vec<f32> = (0..batch * per)
        .map(|i| ((i * 7919) % 17) as f32 / 8.0 - 1.0)
        .collect();
    let classes = plan.graph.pred_dims().numel() as u32;
    let y: Vec<u32> = (0..batch as u32).map(|i| i % classes).collect();
    let mut t = Times {
        last: Instant::now(),
        ns: vec![Vec::new(); plan.program.len()],
    };
    let mut total = Vec::new();
    for s in 0..steps + 10 {
        if s == 10 {
            t.ns.iter_mut().for_each(Vec::clear);
        }
        let start = Instant::now();
        t.last = start;
        ex.train_step_observed(&mut arena, &x, Target::Classes(&y), &mut t)
            .expect("step");
        if s >= 10 {
            total.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    total.sort_by(f64::total_cmp);
    println!("ms/step (median of {steps}): {:.3}", total[total.len() / 2]);
    for (eo, v) in t.ns.iter_mut().enumerate() {
        v.sort_by(f64::total_cmp);
        let ins = &plan.program[eo];
        let name = plan
            .graph
            .nodes
            .get(ins.node as usize)
            .map_or("loss", |n| n.name.as_str());
        println!(
            "{eo:3} {:?}({name}) {:.1} us",
            ins.phase,
            v[v.len() / 2] / 1e3
        );
    }
}
