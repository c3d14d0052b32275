//! The memory benchmark's measuring child (`frugal-bench-child`) and the `/proc` and argument helpers
//! the other measuring children (`__bench-seq-one`, `__bench-swap-one`) share with it.
use std::time::Instant;

use frugal_cli::workloads;
use frugal_core::backend::CpuBackend;
use frugal_core::exec::{Executor, Target};
use frugal_core::graph::{Graph, GraphOptions};
use frugal_core::model::LossKind;
use frugal_core::plan::Plan;
use frugal_core::pool::ThreadPool;
use frugal_core::rng::Rng;

/// A `/proc/self/status` field in KiB (0 when it cannot be read).
pub fn status_kib(field: &str) -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The value after `--name` in `args`.
pub fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// The measuring child of `cargo xtask bench memory`: one workload at one batch and thread count;
/// prints one `RESULT` line.
pub fn memory_child(args: &[String]) -> Result<(), String> {
    let id = arg(args, "--workload").ok_or("--workload missing")?;
    let batch: usize = arg(args, "--batch")
        .ok_or("--batch missing")?
        .parse()
        .map_err(|e| format!("{e}"))?;
    let min_steps: usize = arg(args, "--steps")
        .unwrap_or("5")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let min_secs: f64 = arg(args, "--min-seconds")
        .unwrap_or("1")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let threads: usize = arg(args, "--threads")
        .unwrap_or("1")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let w = workloads::all()
        .into_iter()
        .find(|w| w.id == id)
        .ok_or_else(|| format!("unknown workload {id}"))?;
    // Scratch for every worker (per-worker packing and unfolding room): the memory columns of a
    // threaded row include it.
    let options = GraphOptions {
        threads,
        ..GraphOptions::default()
    };
    let plan = Plan::new(Graph::with_options(&w.spec, batch, options).map_err(|e| e.to_string())?);
    let mut arena = vec![0u8; plan.needed_bytes()];
    let pool =
        ThreadPool::new(threads).map_err(|e| format!("cannot start {threads} threads: {e}"))?;
    let mut ex = Executor::with_backend(&plan, &arena, CpuBackend::with_pool(&pool))
        .map_err(|e| e.to_string())?;
    ex.init_params(&mut arena, 0).map_err(|e| e.to_string())?;
    let per = w.spec.input.numel();
    let outs = plan.graph.pred_dims().numel();
    let mut rng = Rng::new(0);
    let x: Vec<f32> = (0..batch * per).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let tv: Vec<f32> = (0..if w.spec.loss == LossKind::Mse {
        batch * outs
    } else {
        0
    })
        .map(|_| rng.uniform(-1.0, 1.0))
        .collect();
    let tc: Vec<u32> = (0..batch).map(|i| (i % outs) as u32).collect();
    let target = || {
        if w.spec.loss == LossKind::Mse {
            Target::Values(&tv)
        } else {
            Target::Classes(&tc)
        }
    };
    let weights: usize = plan
        .graph
        .params()
        .map(|(_, p)| plan.graph.tensors[p.value as usize].bytes)
        .sum();
    let data = x.len() * 4 + tv.len() * 4 + tc.len() * 4;

    let baseline = status_kib("VmRSS:");
    // Reset the kernel's high-water mark to the current RSS (as the reference harness does).
    std::fs::write("/proc/self/clear_refs", "5").map_err(|e| format!("cannot reset VmHWM: {e}"))?;
    for _ in 0..2 {
        ex.train_step(&mut arena, &x, target())
            .map_err(|e| e.to_string())?;
    }
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < min_steps || (start.elapsed().as_secs_f64() < min_secs && times.len() < 200)
    {
        let t = Instant::now();
        ex.train_step(&mut arena, &x, target())
            .map_err(|e| e.to_string())?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let peak = status_kib("VmHWM:");
    times.sort_by(|a, b| a.total_cmp(b));
    let median = times[times.len() / 2];
    println!(
        "RESULT {id} {batch} {} {} {baseline} {peak} {median:.4} {weights} {data} {}",
        plan.arena_bytes,
        plan.lower_bound,
        times.len()
    );
    Ok(())
}
