//! `cargo xtask bench memory`: the reference workloads, each in a fresh child process (so one run's pages
//! never count for another), measured like `../shared/reference/pytorch-harness`: baseline RSS after the
//! model, data and arena exist; kernel high-water mark reset; 2 warm-up steps and timed steps; peak = the
//! high-water mark minus the baseline; ms/step = the median step.
use std::process::Command;
use std::time::Instant;

use frugal_cli::workloads;
use frugal_core::backend::CpuBackend;
use frugal_core::exec::{Executor, Target};
use frugal_core::graph::{Graph, GraphOptions};
use frugal_core::model::LossKind;
use frugal_core::plan::Plan;
use frugal_core::pool::ThreadPool;
use frugal_core::rng::Rng;

const MIB: f64 = 1024.0 * 1024.0;

/// Reference numbers measured on this machine kind (1 thread), copied from the repository's
/// `tests/bench/README.md` sources (`shared/reference/pytorch-cpu.md` and `peers.md`, 2026-11-22):
/// (id, batch, ideal over baseline MiB, best peer MiB, best peer name). PyTorch's time is not taken from
/// here: it is measured in the same run.
const REFERENCE: &[(&str, usize, f64, f64, &str)] = &[
    ("linear", 64, 172.4, 181.4, "PyTorch"),
    ("conv2d", 64, 18.4, 68.0, "Burn ndarray"),
    ("fc3", 2048, 40.2, 39.4, "NNTrainer"),
    ("fc3_frozen_mid", 2048, 28.2, 37.4, "NNTrainer"),
    ("conv_ac_fl", 64, 27.6, 68.0, "Burn ndarray"),
    ("lenet5", 32, 2.6, 2.9, "NNTrainer"),
    ("lenet5", 64, 4.9, 27.4, "PyTorch"),
    ("lenet5", 128, 9.6, 9.4, "NNTrainer"),
    ("mlp", 32, 1.0, 1.8, "NNTrainer"),
    ("mlp", 128, 1.3, 10.6, "PyTorch"),
    ("mlp", 512, 2.7, 5.5, "NNTrainer"),
    ("small_cnn", 32, 3.3, 23.8, "PyTorch"),
    ("small_cnn", 128, 13.1, 20.0, "Burn ndarray"),
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
    threads: usize,
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
            "--threads",
            &threads.to_string(),
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

/// The repository's copy of the PyTorch reference harness (`tests/bench/pytorch/torch_ref.py`).
fn torch_script() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("tests/bench/pytorch/torch_ref.py")
}

/// A Python that can `import torch`: `--python`, then `$FRUGAL_TORCH_PYTHON`, then the virtual environment
/// `tests/bench/pytorch/setup_torch.sh` makes, then `python3`. `Err` says what was tried.
fn find_torch(args: &[String]) -> Result<String, String> {
    let mut tried = Vec::new();
    let mut candidates: Vec<String> = Vec::new();
    if let Some(p) = arg(args, "--python") {
        candidates.push(p.into());
    }
    if let Ok(p) = std::env::var("FRUGAL_TORCH_PYTHON") {
        candidates.push(p);
    }
    if let Ok(h) = std::env::var("HOME") {
        candidates.push(format!("{h}/.cache/frugal-torch-venv/bin/python"));
    }
    candidates.push("python3".into());
    for c in candidates {
        let ok = Command::new(&c)
            .args(["-c", "import torch"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Ok(c);
        }
        tried.push(c);
    }
    Err(tried.join(", "))
}

/// PyTorch's median ms/step and training peak over its baseline (bytes) for one row, in a fresh process.
fn run_torch(py: &str, id: &str, batch: usize, threads: usize) -> Result<(f64, f64), String> {
    let spec = format!(
        r#"{{"workload": "{id}", "batch": {batch}, "threads": {threads}, "lr": 0.01, "warmup": 2, "steps": 5, "max_steps": 200, "min_time": 1.0}}"#
    );
    let mut cmd = Command::new(py);
    cmd.arg(torch_script()).args(["--child", &spec]);
    for k in ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"] {
        cmd.env(k, threads.to_string());
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start PyTorch ({py}): {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("SUMMARY "))
        .ok_or_else(|| {
            format!(
                "PyTorch {id} b{batch}: no SUMMARY line: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            )
        })?;
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    match f[..] {
        [ms, peak] => Ok((ms, peak)),
        _ => Err(format!("bad SUMMARY line: {line}")),
    }
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// One (workload, batch, threads) row: frugal's first run (memory is deterministic) with the median
/// ms/step over the repeats, and PyTorch's median ms/step and peak when it was measured.
struct Measured {
    row: Row,
    threads: usize,
    torch: Option<(f64, f64)>,
}

const USAGE: &str = "usage: cargo xtask bench memory [--only id,id] [--threads 1,2] [--repeat N] [--steps N] [--python PATH] [--no-torch] [--check]";

/// The parent: runs every selected workload, alternating frugal and PyTorch per row, and prints the tables.
pub fn main(args: &[String]) -> Result<(), String> {
    if args.first().map(String::as_str) != Some("memory") {
        return Err(USAGE.into());
    }
    // --check: fewest steps, no PyTorch, and fail unless the memory targets hold (peak RSS is deterministic
    // enough to assert in CI; time is not, so it is only reported).
    let check = args.iter().any(|a| a == "--check");
    let min_secs = if check { 0.0 } else { 1.0 };
    let only: Option<Vec<&str>> = arg(args, "--only").map(|s| s.split(',').collect());
    let steps: usize = arg(args, "--steps")
        .unwrap_or(if check { "1" } else { "5" })
        .parse()
        .map_err(|e| format!("--steps: {e}"))?;
    let threads: Vec<usize> = arg(args, "--threads")
        .unwrap_or("1")
        .split(',')
        .map(|t| match t.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(format!("--threads: {t:?} is not a thread count ≥ 1")),
        })
        .collect::<Result<_, _>>()?;
    let repeat: usize = arg(args, "--repeat")
        .unwrap_or("1")
        .parse()
        .map_err(|e| format!("--repeat: {e}"))?;
    let repeat = repeat.max(1);
    let torch = if check || args.iter().any(|a| a == "--no-torch") {
        None
    } else {
        match find_torch(args) {
            Ok(py) => {
                eprintln!("PyTorch: {py} (alternating with frugal on every row)");
                Some(py)
            }
            Err(tried) => {
                eprintln!(
                    "PyTorch is not importable (tried {tried}): frugal is measured alone and no ratio is printed. \
                     tests/bench/pytorch/setup_torch.sh installs it."
                );
                None
            }
        }
    };
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut rows: Vec<Measured> = Vec::new();
    for w in workloads::all() {
        if only.as_ref().is_some_and(|o| !o.contains(&w.id)) {
            continue;
        }
        for &b in w.batches {
            for &t in &threads {
                eprint!("{} b{b} t{t} … ", w.id);
                let (mut ours, mut theirs, mut first) = (Vec::new(), Vec::new(), None);
                let mut torch_peak = f64::NAN;
                for r in 0..repeat {
                    // Alternate who goes first, so a drift in machine speed hits both alike.
                    let torch_first = r % 2 == 1;
                    let mut run_torch_now = |theirs: &mut Vec<f64>| -> Result<(), String> {
                        if let Some(py) = &torch {
                            let (ms, peak) = run_torch(py, w.id, b, t)?;
                            theirs.push(ms);
                            torch_peak = peak;
                        }
                        Ok(())
                    };
                    if torch_first {
                        run_torch_now(&mut theirs)?;
                    }
                    let row = run_child(&exe, w.id, b, t, steps, min_secs)?;
                    ours.push(row.ms);
                    first.get_or_insert(row);
                    if !torch_first {
                        run_torch_now(&mut theirs)?;
                    }
                }
                let mut row = first.expect("repeat ≥ 1");
                row.ms = median(&mut ours);
                let torch_ms = (!theirs.is_empty()).then(|| median(&mut theirs));
                match torch_ms {
                    Some(pt) => eprintln!(
                        "{:.2} ms/step, PyTorch {pt:.2} ({:.2}×)",
                        row.ms,
                        row.ms / pt
                    ),
                    None => eprintln!("{:.2} ms/step", row.ms),
                }
                rows.push(Measured {
                    row,
                    threads: t,
                    torch: torch_ms.map(|ms| (ms, torch_peak)),
                });
            }
        }
    }
    report(&rows, steps, repeat, torch.is_some(), check)
}

fn report(
    rows: &[Measured],
    steps: usize,
    repeat: usize,
    torch: bool,
    check: bool,
) -> Result<(), String> {
    let threads: Vec<usize> = {
        let mut t: Vec<usize> = rows.iter().map(|m| m.threads).collect();
        t.sort_unstable();
        t.dedup();
        t
    };
    println!(
        "\n`cargo xtask bench memory --threads {}{}{}` — SGD lr 0.01, fresh process per row; MiB = 2^20 bytes; ms/step = median over {repeat} run(s).",
        threads.iter().map(usize::to_string).collect::<Vec<_>>().join(","),
        if steps != 5 { format!(" --steps {steps}") } else { String::new() },
        if repeat != 1 { format!(" --repeat {repeat}") } else { String::new() },
    );
    println!("Peak = VmHWM over the baseline (model, data, arena allocated; weights written). Ideal and best peer are the");
    println!("reference measurements of this machine kind (tests/bench/README.md). PyTorch columns: measured in this run,");
    println!(
        "alternating with frugal per row (tests/bench/pytorch/torch_ref.py){}.\n",
        if torch {
            ""
        } else {
            " — not measured here (PyTorch not importable or --no-torch/--check)"
        }
    );
    println!("| workload | batch | threads | arena MiB | lower bound MiB | arena/bound | peak over baseline MiB | ideal MiB | peak/ideal | best peer MiB | ms/step | PyTorch ms/step | ms vs PyTorch | PyTorch peak MiB | base RSS − weights − data MiB |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut failures = Vec::new();
    for m in rows {
        let r = &m.row;
        let reference = REFERENCE.iter().find(|x| x.0 == r.id && x.1 == r.batch);
        let peak = r.peak_kib.saturating_sub(r.baseline_kib) as f64 / 1024.0;
        let ratio = r.arena as f64 / r.lower.max(1) as f64;
        let own = (r.baseline_kib as f64 * 1024.0 - r.weights as f64 - r.data as f64) / MIB;
        let (ideal, best, best_name) =
            reference.map_or((f64::NAN, f64::NAN, "-"), |x| (x.2, x.3, x.4));
        let (pt_ms, vs, pt_peak) = match m.torch {
            Some((ms, pk)) => (
                format!("{ms:.2}"),
                format!("{:.2}×", r.ms / ms),
                format!("{:.2}", pk / MIB),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "| {} | {} | {} | {:.2} | {:.2} | {ratio:.3} | {peak:.2} | {ideal:.1} | {:.2} | {best:.1} ({best_name}) | {:.2} | {pt_ms} | {vs} | {pt_peak} | {own:.2} |",
            r.id,
            r.batch,
            m.threads,
            r.arena as f64 / MIB,
            r.lower as f64 / MIB,
            peak / ideal,
            r.ms,
        );
        let what = format!("{} b{} t{}", r.id, r.batch, m.threads);
        if ratio > 1.05 {
            failures.push(format!("{what}: arena/bound {ratio:.3} > 1.05"));
        }
        let component =
            ["linear", "conv2d", "fc3", "fc3_frozen_mid", "conv_ac_fl"].contains(&r.id.as_str());
        if component && peak > 1.15 * ideal {
            failures.push(format!("{what}: peak {peak:.2} MiB > 1.15 × ideal {ideal}"));
        }
        if peak > best {
            failures.push(format!("{what}: peak {peak:.2} MiB > best peer {best} MiB"));
        }
        if own > 4.0 {
            failures.push(format!("{what}: own baseline {own:.2} MiB > 4 MiB"));
        }
    }
    // Scaling from 1 thread, for each system, when both were run.
    if threads.len() > 1 && threads[0] == 1 {
        println!("\n| workload | batch | threads | frugal speed-up over 1 thread | PyTorch speed-up over 1 thread |");
        println!("|---|---:|---:|---:|---:|");
        for m in rows.iter().filter(|m| m.threads != 1) {
            let Some(one) = rows
                .iter()
                .find(|o| o.threads == 1 && o.row.id == m.row.id && o.row.batch == m.row.batch)
            else {
                continue;
            };
            let pt = match (one.torch, m.torch) {
                (Some((a, _)), Some((b, _))) => format!("{:.2}×", a / b),
                _ => "-".into(),
            };
            println!(
                "| {} | {} | {} | {:.2}× | {pt} |",
                m.row.id,
                m.row.batch,
                m.threads,
                one.row.ms / m.row.ms
            );
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
