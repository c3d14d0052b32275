//! `cargo xtask bench memory`: the reference workloads, each in a fresh child process (so one run's pages
//! never count for another), measured like `../shared/reference/pytorch-harness`: baseline RSS after the
//! model, data and arena exist; kernel high-water mark reset; 2 warm-up steps and timed steps; peak = the
//! high-water mark minus the baseline; ms/step = the median step.
use std::process::Command;
use std::time::Instant;

use frugal_cli::workloads;
use frugal_core::exec::{Executor, Target};
use frugal_core::graph::Graph;
use frugal_core::model::LossKind;
use frugal_core::plan::Plan;
use frugal_core::rng::Rng;

const MIB: f64 = 1024.0 * 1024.0;

/// Reference numbers measured on this machine kind (1 thread), copied from the repository's
/// `tests/bench/README.md` sources (`shared/reference/pytorch-cpu.md` and `peers.md`, 2026-11-22):
/// (id, batch, ideal over baseline MiB, PyTorch peak over baseline MiB, PyTorch ms/step, best peer MiB, best peer name).
const REFERENCE: &[(&str, usize, f64, f64, f64, f64, &str)] = &[
    ("linear", 64, 172.4, 181.4, 254.70, 181.4, "PyTorch"),
    ("conv2d", 64, 18.4, 111.7, 99.49, 68.0, "Burn ndarray"),
    ("fc3", 2048, 40.2, 76.7, 236.43, 39.4, "NNTrainer"),
    (
        "fc3_frozen_mid",
        2048,
        28.2,
        68.5,
        164.61,
        37.4,
        "NNTrainer",
    ),
    ("conv_ac_fl", 64, 27.6, 141.0, 94.74, 68.0, "Burn ndarray"),
    ("lenet5", 32, 2.6, 23.5, 7.33, 2.9, "NNTrainer"),
    ("lenet5", 64, 4.9, 27.4, 11.97, 27.4, "PyTorch"),
    ("lenet5", 128, 9.6, 39.9, 21.21, 9.4, "NNTrainer"),
    ("mlp", 32, 1.0, 10.5, 0.96, 1.8, "NNTrainer"),
    ("mlp", 128, 1.3, 10.6, 2.50, 10.6, "PyTorch"),
    ("mlp", 512, 2.7, 15.1, 7.74, 5.5, "NNTrainer"),
    ("small_cnn", 32, 3.3, 23.8, 8.52, 23.8, "PyTorch"),
    ("small_cnn", 128, 13.1, 42.3, 20.90, 20.0, "Burn ndarray"),
];

pub(crate) fn status_kib(field: &str) -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub(crate) fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// The measuring child: prints one `RESULT` line.
pub fn child(args: &[String]) -> Result<(), String> {
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
    let w = workloads::all()
        .into_iter()
        .find(|w| w.id == id)
        .ok_or_else(|| format!("unknown workload {id}"))?;
    let plan = Plan::new(Graph::new(&w.spec, batch).map_err(|e| e.to_string())?);
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(&plan, &arena).map_err(|e| e.to_string())?;
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

struct Row {
    id: String,
    batch: usize,
    arena: usize,
    lower: usize,
    baseline_kib: usize,
    peak_kib: usize,
    ms: f64,
    weights: usize,
    data: usize,
}

fn run_child(
    exe: &std::path::Path,
    id: &str,
    batch: usize,
    steps: usize,
    min_secs: f64,
) -> Result<Row, String> {
    let out = Command::new(exe)
        .args([
            "__bench-one",
            "--workload",
            id,
            "--batch",
            &batch.to_string(),
            "--steps",
            &steps.to_string(),
        ])
        .args(["--min-seconds", &min_secs.to_string()])
        .output()
        .map_err(|e| format!("cannot start the benchmark child: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .ok_or_else(|| {
            format!(
                "{id} b{batch}: child failed: {}{}",
                text,
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    let f: Vec<&str> = line.split_whitespace().collect();
    let p = |i: usize| {
        f.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("bad RESULT line: {line}"))
    };
    Ok(Row {
        id: f[1].to_string(),
        batch: p(2)? as usize,
        arena: p(3)? as usize,
        lower: p(4)? as usize,
        baseline_kib: p(5)? as usize,
        peak_kib: p(6)? as usize,
        ms: p(7)?,
        weights: p(8)? as usize,
        data: p(9)? as usize,
    })
}

/// The parent: runs every selected workload and prints the table.
pub fn main(args: &[String]) -> Result<(), String> {
    if args.first().map(String::as_str) != Some("memory") {
        return Err("usage: cargo xtask bench memory [--only id,id] [--steps N] [--check]".into());
    }
    // --check: fewest steps, and fail unless the memory targets hold (peak RSS is deterministic enough
    // to assert in CI; time is not, so it is only reported).
    let check = args.iter().any(|a| a == "--check");
    let min_secs = if check { 0.0 } else { 1.0 };
    let only: Option<Vec<&str>> = arg(args, "--only").map(|s| s.split(',').collect());
    let steps: usize = arg(args, "--steps")
        .unwrap_or(if check { "1" } else { "5" })
        .parse()
        .map_err(|e| format!("{e}"))?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for w in workloads::all() {
        if only.as_ref().is_some_and(|o| !o.contains(&w.id)) {
            continue;
        }
        for &b in w.batches {
            eprint!("{} b{b} … ", w.id);
            let r = run_child(&exe, w.id, b, steps, min_secs)?;
            eprintln!("{:.2} ms/step", r.ms);
            rows.push(r);
        }
    }
    println!("\n`cargo xtask bench memory{}` — 1 thread, SGD lr 0.01, fresh process per row; MiB = 2^20 bytes.", if steps != 5 { format!(" --steps {steps}") } else { String::new() });
    println!("Peak = VmHWM over the baseline (model, data, arena allocated; weights written). Ideal and the");
    println!("PyTorch/peer columns are the reference measurements of this machine kind (tests/bench/README.md).\n");
    println!("| workload | batch | arena MiB | lower bound MiB | arena/bound | peak over baseline MiB | ideal MiB | peak/ideal | best peer MiB | ms/step | PyTorch ms/step | ms vs PyTorch | base RSS − weights − data MiB |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut failures = Vec::new();
    for r in &rows {
        let reference = REFERENCE.iter().find(|x| x.0 == r.id && x.1 == r.batch);
        let peak = r.peak_kib.saturating_sub(r.baseline_kib) as f64 / 1024.0;
        let ratio = r.arena as f64 / r.lower.max(1) as f64;
        let own = (r.baseline_kib as f64 * 1024.0 - r.weights as f64 - r.data as f64) / MIB;
        let (ideal, pt_ms, best, best_name) = reference
            .map_or((f64::NAN, f64::NAN, f64::NAN, "-"), |x| {
                (x.2, x.4, x.5, x.6)
            });
        println!(
            "| {} | {} | {:.2} | {:.2} | {ratio:.3} | {peak:.2} | {ideal:.1} | {:.2} | {best:.1} ({best_name}) | {:.2} | {pt_ms:.2} | {:.2}× | {own:.2} |",
            r.id,
            r.batch,
            r.arena as f64 / MIB,
            r.lower as f64 / MIB,
            peak / ideal,
            r.ms,
            r.ms / pt_ms
        );
        if ratio > 1.05 {
            failures.push(format!(
                "{} b{}: arena/bound {ratio:.3} > 1.05",
                r.id, r.batch
            ));
        }
        let component =
            ["linear", "conv2d", "fc3", "fc3_frozen_mid", "conv_ac_fl"].contains(&r.id.as_str());
        if component && peak > 1.15 * ideal {
            failures.push(format!(
                "{} b{}: peak {peak:.2} MiB > 1.15 × ideal {ideal}",
                r.id, r.batch
            ));
        }
        if peak > best {
            failures.push(format!(
                "{} b{}: peak {peak:.2} MiB > best peer {best} MiB",
                r.id, r.batch
            ));
        }
        if own > 4.0 {
            failures.push(format!(
                "{} b{}: own baseline {own:.2} MiB > 4 MiB",
                r.id, r.batch
            ));
        }
    }
    if failures.is_empty() {
        println!("\nmemory targets met: arena ≤ 1.05 × bound, component peaks ≤ 1.15 × ideal, every peak ≤ the best peer, own baseline ≤ 4 MiB");
        Ok(())
    } else {
        println!("\nover target: {}", failures.join("; "));
        if check {
            Err(format!("{} memory target(s) missed", failures.len()))
        } else {
            Ok(())
        }
    }
}
