//! `cargo xtask bench seq`: the character transformer (`examples/char-gpt.toml`, ~0.87 M parameters)
//! against PyTorch (1 thread, alternating runs, each in a fresh process: median ms/step and peak RSS
//! over the baseline `bench memory` takes, once the model and data exist — on both sides the peak
//! holds optimizer state, gradients and activations, not the weights), the plain plan and the plan
//! frugal picks for a budget of half PyTorch's peak; the LoRA fine-tuning arena
//! (`examples/char-gpt-lora.toml`) against full fine-tuning at the same batch; the transformer under a
//! budget of a quarter of its unconstrained arena (times of the two plans interleaved step by step in
//! one process); the smallest budget the policies reach ([`policy::search_min_budget`]: a bounded
//! bisection); and LoRA's held-out perplexity after fine-tuning the model this bench pretrains
//! (`--no-ppl` skips the training runs), the fine-tune repeated in fresh processes with its frozen base
//! in the arena and read from a parameter image in f32, fp16 and int8 (`frugal train --frozen`): arena,
//! image, peak RSS, ms/step, perplexity (`--only-lora`: these rows alone; `--base PATH`: a base saved
//! before instead of pretraining it). A second row set: the character LSTM
//! (`examples/char-lstm.toml`) against PyTorch's `nn.LSTM`, the same harness.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use frugal_cli::spec_toml::load_model;
use frugal_core::budget::Budget;
use frugal_core::exec::{Executor, Target};
use frugal_core::graph::Graph;
use frugal_core::model::ModelSpec;
use frugal_core::plan::Plan;
use frugal_core::policy::{self, CostModel, PolicyKind};

use frugal_cli::measure::steps_ms_interleaved;

use crate::bench::{arg, status_kib};

/// Recomputation searches the smallest-budget bisection may run (each bounded by
/// [`policy::MIN_SEARCH_DISCARDS`]).
const MIN_PLANNINGS: usize = 6;

const USAGE: &str = "usage: cargo xtask bench seq [--batch N] [--repeat N] [--steps N] [--python PATH] [--no-torch] [--no-budget] [--no-ppl] [--only-lora] [--base PATH]";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn spec(file: &str) -> Result<ModelSpec, String> {
    Ok(load_model(&root().join("examples").join(file))
        .map_err(|e| e.to_string())?
        .spec)
}

/// `n` windows of the model's input length from the Genesis text, with next-byte labels.
fn data(spec: &ModelSpec, n: usize) -> Result<(Vec<f32>, Vec<u32>), String> {
    let bytes = std::fs::read(root().join("data/kjv/genesis.txt")).map_err(|e| e.to_string())?;
    let ds = frugal_cli::text::windows(&bytes, spec.input.numel(), "genesis")
        .map_err(|e| e.to_string())?;
    let per = spec.input.numel();
    Ok((ds.x[..n * per].to_vec(), ds.labels(0, n).to_vec()))
}

/// The plan's weights as `init_params` (seed 1) makes them, as the bytes `write_state` takes: made in
/// an arena of their own, freed before the measurement.
fn initial_weights(plan: &Plan) -> Result<Vec<u8>, String> {
    let mut a = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(plan, &a).map_err(|e| e.to_string())?;
    ex.init_params(&mut a, 1).map_err(|e| e.to_string())?;
    let ids: Vec<_> = ex.state_ids().collect();
    let mut out = Vec::new();
    for t in ids {
        let v = ex.read(&mut a, t).map_err(|e| e.to_string())?;
        out.extend(v.iter().flat_map(|x| x.to_le_bytes()));
    }
    Ok(out)
}

/// The child: one run of `--model` (an example file; the char transformer by default), printing
/// `RESULT <ms/step> <peak over baseline bytes> <arena bytes>`. Measured as `bench memory` measures
/// (the reference harness's method): the baseline is the RSS once the plan, the data and the arena
/// exist and the weights are written — into a zeroed arena whose optimizer state (zero at the start),
/// gradients and activations the steps touch first, as PyTorch's AdamW allocates its state in the
/// first step — then the kernel's high-water mark is reset, 2 warm-up and `--steps` timed steps run,
/// and the peak is the high-water mark over the baseline. With `--budget BYTES`, the plan the policies
/// choose for that budget and a `PLAN <policy> <micro-batch> <micro-batches> <recomputes>` line; else
/// the plain plan.
pub fn child(args: &[String]) -> Result<(), String> {
    let batch: usize = arg(args, "--batch")
        .unwrap_or("32")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let steps: usize = arg(args, "--steps")
        .unwrap_or("5")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let budget: Option<usize> = arg(args, "--budget")
        .map(|b| b.parse().map_err(|e| format!("--budget: {e}")))
        .transpose()?;
    let s = spec(arg(args, "--model").unwrap_or("char-gpt.toml"))?;
    let (x, y) = data(&s, batch)?;
    let g = Graph::new(&s, batch).map_err(|e| e.to_string())?;
    let plan = match budget {
        None => Plan::new(g),
        Some(b) => {
            let cost = CostModel::estimate(&g);
            drop(g);
            let c = policy::plan_for_budget(&s, batch, Budget::new(b), PolicyKind::Auto, &cost)
                .map_err(|e| e.to_string())?;
            println!(
                "PLAN {} {} {} {}",
                c.policy.name(),
                c.plan.graph.batch,
                c.plan.micro_batches,
                c.recomputes
            );
            c.plan
        }
    };
    let weights = initial_weights(&plan)?;
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(&plan, &arena).map_err(|e| e.to_string())?;
    ex.write_state(&mut arena, &weights)
        .map_err(|e| e.to_string())?;
    drop(weights);
    let baseline = status_kib("VmRSS:");
    std::fs::write("/proc/self/clear_refs", "5").map_err(|e| format!("cannot reset VmHWM: {e}"))?;
    for _ in 0..2 {
        ex.train_step(&mut arena, &x, Target::Classes(&y))
            .map_err(|e| e.to_string())?;
    }
    let mut t = Vec::new();
    for _ in 0..steps {
        let s = Instant::now();
        ex.train_step(&mut arena, &x, Target::Classes(&y))
            .map_err(|e| e.to_string())?;
        t.push(s.elapsed().as_secs_f64() * 1e3);
    }
    let peak = status_kib("VmHWM:");
    println!(
        "RESULT {:.3} {} {}",
        median(t),
        peak.saturating_sub(baseline) * 1024,
        plan.arena_bytes
    );
    Ok(())
}

/// One frugal run of `model` in a fresh process: (ms/step, peak over baseline, arena bytes, the `PLAN`
/// line's fields when `budget` is given).
fn run_frugal(
    model: &str,
    batch: usize,
    steps: usize,
    budget: Option<usize>,
) -> Result<(f64, f64, usize, Option<String>), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "__bench-seq-one",
        "--model",
        model,
        "--batch",
        &batch.to_string(),
        "--steps",
        &steps.to_string(),
    ]);
    if let Some(b) = budget {
        cmd.args(["--budget", &b.to_string()]);
    }
    let out = cmd.output().map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .ok_or_else(|| {
            format!(
                "frugal child failed: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    let plan = text
        .lines()
        .find_map(|l| l.strip_prefix("PLAN "))
        .map(String::from);
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    match f[..] {
        [ms, peak, arena] => Ok((ms, peak, arena as usize, plan)),
        _ => Err(format!("bad RESULT line: {line}")),
    }
}

fn run_torch(py: &str, model: &str, batch: usize, steps: usize) -> Result<(f64, f64), String> {
    let script = root().join("tests/bench/pytorch/seq_ref.py");
    let (b, st) = (batch.to_string(), steps.to_string());
    crate::bench::torch_summary(
        py,
        &[
            script.as_os_str(),
            "--model".as_ref(),
            model.as_ref(),
            "--batch".as_ref(),
            b.as_ref(),
            "--steps".as_ref(),
            st.as_ref(),
        ],
        1,
        "PyTorch",
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn mib(b: f64) -> String {
    format!("{:.2} MiB", b / (1u64 << 20) as f64)
}

/// A Python with torch: `--python`, `FRUGAL_TORCH_PYTHON`, the repository's venv, `python3`; None
/// (reported skipped) when none imports torch.
fn find_torch(args: &[String]) -> Option<String> {
    if args.iter().any(|a| a == "--no-torch") {
        return None;
    }
    let mut tried = Vec::new();
    for c in arg(args, "--python")
        .map(String::from)
        .into_iter()
        .chain(std::env::var("FRUGAL_TORCH_PYTHON").ok())
        .chain(
            std::env::var("HOME")
                .ok()
                .map(|h| format!("{h}/.cache/frugal-torch-venv/bin/python")),
        )
        .chain(Some("python3".into()))
    {
        if Command::new(&c)
            .args(["-c", "import torch"])
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return Some(c);
        }
        tried.push(c);
    }
    println!(
        "PyTorch: skipped (no Python with torch among {})",
        tried.join(", ")
    );
    None
}

/// frugal (plain plan, and the plan for a budget of half PyTorch's first measured peak) against
/// PyTorch, alternating fresh processes, `repeat` rounds; prints the table and the ratios of medians.
fn vs_torch(batch: usize, steps: usize, repeat: usize, torch: Option<&str>) -> Result<(), String> {
    // The non-arena part of frugal's peak (binary pages touched, plan, data): what the budget leaves
    // room for, so that the measured peak, not just the arena, stays within half.
    const OVERHEAD: usize = 1 << 20;
    let (mut fm, mut fp, mut tm, mut tp) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut hm, mut hp) = (Vec::new(), Vec::new());
    let (mut arena, mut half) = (0, None);
    for _ in 0..repeat {
        let (ms, peak, a, _) = run_frugal("char-gpt.toml", batch, steps, None)?;
        fm.push(ms);
        fp.push(peak);
        arena = a;
        if let Some(py) = torch {
            let (ms, peak) = run_torch(py, "char-gpt.toml", batch, steps)?;
            tm.push(ms);
            tp.push(peak);
            let budget = *half.get_or_insert((tp[0] / 2.0) as usize - OVERHEAD);
            let (ms, peak, a, plan) = run_frugal("char-gpt.toml", batch, steps, Some(budget))?;
            hm.push(ms);
            hp.push(peak);
            half = Some(budget);
            if hm.len() == 1 {
                let p: Vec<String> = plan
                    .unwrap_or_default()
                    .split_whitespace()
                    .map(String::from)
                    .collect();
                println!(
                    "frugal within half of PyTorch's first peak less {} ({}): policy {}, micro-batch {} × {}, {} recomputes, arena {}",
                    mib(OVERHEAD as f64),
                    mib(budget as f64),
                    p.first().map_or("?", |s| s.as_str()),
                    p.get(1).map_or("?", |s| s.as_str()),
                    p.get(2).map_or("?", |s| s.as_str()),
                    p.get(3).map_or("?", |s| s.as_str()),
                    mib(a as f64)
                );
            }
        }
    }
    println!("\n| | ms/step (median of {repeat}) | peak RSS over baseline | arena |");
    println!("|---|---|---|---|");
    println!(
        "| frugal, plain plan | {:.1} | {} | {} |",
        median(fm.clone()),
        mib(median(fp.clone())),
        mib(arena as f64)
    );
    if let Some(b) = half {
        println!(
            "| frugal, budget {} | {:.1} | {} | |",
            mib(b as f64),
            median(hm.clone()),
            mib(median(hp.clone()))
        );
    }
    if torch.is_some() {
        println!(
            "| PyTorch | {:.1} | {} | |",
            median(tm.clone()),
            mib(median(tp.clone()))
        );
        println!(
            "\nfrugal / PyTorch: plain plan time {:.2}×, peak memory {:.2}×; within the budget time {:.2}×, peak memory {:.2}×",
            median(fm) / median(tm.clone()),
            median(fp) / median(tp.clone()),
            median(hm) / median(tm),
            median(hp) / median(tp)
        );
    }
    Ok(())
}

/// The fine-tune `examples/char-gpt-lora.toml` as its file says from `--weights`, in this (fresh)
/// process, its frozen base in the arena (`--frozen` absent) or read from a parameter image (`--frozen
/// f32|fp16|int8`, as `frugal train --frozen`); prints `RESULT <ms/step> <peak RSS bytes> <arena
/// bytes> <image bytes> <perplexity before> <perplexity after> <steps>`. ms/step: the steps' own time
/// (no evaluation); the peak is the process's high-water mark (binary, corpus, the weights file and the
/// image made from it, arena): what a user's `frugal train` holds. 1 thread, unlimited budget.
pub fn lora_child(args: &[String]) -> Result<(), String> {
    use frugal_cli::train::{self, Device, TrainOptions};
    let weights = PathBuf::from(arg(args, "--weights").ok_or("--weights PATH")?);
    let frozen = arg(args, "--frozen").map(train::parse_frozen).transpose()?;
    let file = "char-gpt-lora.toml";
    let mf = load_model(&root().join("examples").join(file)).map_err(|e| e.to_string())?;
    let src = mf
        .train
        .dataset
        .as_ref()
        .ok_or_else(|| format!("{file}: no [train] dataset"))?;
    let (tr, te) = train::load_data(src, mf.spec.input.numel()).map_err(|e| e.to_string())?;
    let opts = TrainOptions {
        batch: mf.train.batch.map_or(32, |b| b as usize),
        epochs: mf.train.epochs.unwrap_or(10),
        budget: Budget::UNLIMITED,
        seed: 1,
        progress: false,
        quiet: true,
        policy: PolicyKind::Auto,
        approx: Default::default(),
        threads: 1,
        device: Device::Cpu,
        frozen,
    };
    let rep = train::train(&mf, &tr, &te, &opts, Some(&weights)).map_err(|e| e.to_string())?;
    let (b, a) = rep.test_loss;
    println!(
        "RESULT {:.3} {} {} {} {:.4} {:.4} {}",
        rep.steps.1 * 1e3 / rep.steps.0.max(1) as f64,
        status_kib("VmHWM:") * 1024,
        rep.arena_bytes,
        rep.image_bytes,
        b.exp(),
        a.exp(),
        rep.steps.0
    );
    Ok(())
}

/// One LoRA fine-tune in a fresh process ([`lora_child`]): its `RESULT` fields.
fn run_lora(weights: &Path, frozen: Option<&str>) -> Result<Vec<f64>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.arg("__bench-seq-lora").arg("--weights").arg(weights);
    if let Some(f) = frozen {
        cmd.args(["--frozen", f]);
    }
    let out = cmd.output().map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .ok_or_else(|| {
            format!(
                "LoRA child failed: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    let f: Vec<f64> = line
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    if f.len() != 7 {
        return Err(format!("bad RESULT line: {line}"));
    }
    Ok(f)
}

/// LoRA's held-out perplexity, as a user gets it: `examples/char-gpt.toml` trained as its file says
/// (the base model, in this process), then `examples/char-gpt-lora.toml` fine-tuned from it as its
/// file says (batch, epochs, rank, targets, optimizer) in fresh processes, its frozen base in the arena
/// and read from a parameter image in f32, fp16 and int8 (`frugal train --frozen`), `repeat` rounds
/// with the order rotated each round; the held-out text is the last tenth of the fine-tune file, never
/// trained on. 1 thread, unlimited budget. `base`: a base model saved by an earlier run (its
/// pretraining is minutes on a loaded machine), instead of training it here.
fn lora_perplexity(repeat: usize, base: Option<&str>) -> Result<(), String> {
    if let Some(path) = base {
        println!("the base: {path} (given with --base)");
        return lora_rows(Path::new(path), repeat);
    }
    use frugal_cli::train::{self, Device, TrainOptions};
    let mf = load_model(&root().join("examples/char-gpt.toml")).map_err(|e| e.to_string())?;
    let src = mf
        .train
        .dataset
        .as_ref()
        .ok_or("char-gpt.toml: no [train] dataset")?;
    let (tr, te) = train::load_data(src, mf.spec.input.numel()).map_err(|e| e.to_string())?;
    let opts = TrainOptions {
        batch: mf.train.batch.map_or(32, |b| b as usize),
        epochs: mf.train.epochs.unwrap_or(10),
        budget: Budget::UNLIMITED,
        seed: 1,
        progress: false,
        quiet: true,
        policy: PolicyKind::Auto,
        approx: Default::default(),
        threads: 1,
        device: Device::Cpu,
        frozen: None,
    };
    let s = Instant::now();
    let base = train::train(&mf, &tr, &te, &opts, None).map_err(|e| e.to_string())?;
    let (b, a) = base.test_loss;
    println!(
        "char-gpt.toml (the base): {} steps ({} epochs × {} windows of {} bytes / batch {}) in {:.0} s; held-out perplexity {:.3} → {:.3}",
        base.steps.0,
        opts.epochs,
        tr.len(),
        mf.spec.input.numel(),
        opts.batch,
        s.elapsed().as_secs_f64(),
        b.exp(),
        a.exp(),
    );
    let dir = std::env::temp_dir().join(format!("frugal-bench-seq-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let path = dir.join("char-gpt.safetensors");
    let named: Vec<(&str, &[usize], &[f32])> = base
        .tensors
        .iter()
        .map(|(n, s, v)| (n.as_str(), s.as_slice(), v.as_slice()))
        .collect();
    frugal_cli::checkpoint::save_safetensors(&path, &named, None).map_err(|e| e.to_string())?;
    drop(base);
    let r = lora_rows(&path, repeat);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// The fine-tune rows from the base model at `path`: in the arena and from f32, fp16 and int8
/// images, `repeat` rounds of fresh processes in rotated order.
fn lora_rows(path: &Path, repeat: usize) -> Result<(), String> {
    const VARIANTS: [(&str, Option<&str>); 4] = [
        ("in the arena (f32)", None),
        ("image, f32", Some("f32")),
        ("image, fp16", Some("fp16")),
        ("image, int8", Some("int8")),
    ];
    let mut got: Vec<Vec<Vec<f64>>> = vec![Vec::new(); VARIANTS.len()];
    let s = Instant::now();
    for r in 0..repeat {
        for k in 0..VARIANTS.len() {
            let v = (k + r) % VARIANTS.len();
            let f = run_lora(path, VARIANTS[v].1)?;
            // Each run as it ends (a sitting cut short still has its runs).
            println!(
                "round {}: {}: {:.1} ms/step, peak RSS {}, arena {}, image {}, perplexity {:.3} → {:.3}",
                r + 1,
                VARIANTS[v].0,
                f[0],
                mib(f[1]),
                mib(f[2]),
                mib(f[3]),
                f[4],
                f[5]
            );
            got[v].push(f);
        }
    }
    let steps = got[0].first().map_or(0.0, |f| f[6]);
    println!(
        "\nLoRA fine-tune (examples/char-gpt-lora.toml, {steps} steps, 1 thread) from that base, frozen base weights stored as below; {repeat} round(s) of fresh processes, order rotated, in {:.0} s (median, min–max):\n",
        s.elapsed().as_secs_f64()
    );
    println!("| frozen base | arena | image | arena + image | peak RSS | ms/step | held-out perplexity |");
    println!("|---|---|---|---|---|---|---|");
    let spread = |v: &[Vec<f64>], i: usize, scale: f64, prec: usize| {
        let mut x: Vec<f64> = v.iter().map(|f| f[i] * scale).collect();
        x.sort_by(|a, b| a.total_cmp(b));
        let (lo, hi) = (x[0], x[x.len() - 1]);
        let m = median(x);
        if (hi - lo).abs() < 1e-9 {
            format!("{m:.prec$}")
        } else {
            format!("{m:.prec$} ({lo:.prec$}–{hi:.prec$})")
        }
    };
    let mb = 1.0 / (1u64 << 20) as f64;
    for (v, (name, _)) in VARIANTS.iter().enumerate() {
        let f = &got[v];
        let (arena, image) = (f[0][2], f[0][3]);
        println!(
            "| {name} | {} | {} | {} | {} MiB | {} | {:.3} → {} ({:+.1} %) |",
            mib(arena),
            mib(image),
            mib(arena + image),
            spread(f, 1, mb, 2),
            spread(f, 0, 1.0, 1),
            f[0][4],
            spread(f, 5, 1.0, 3),
            (median(f.iter().map(|x| x[5]).collect()) / f[0][4] - 1.0) * 100.0
        );
    }
    Ok(())
}

pub fn main(args: &[String]) -> Result<(), String> {
    let num = |name: &str, d: usize| -> Result<usize, String> {
        arg(args, name).map_or(Ok(d), |v| {
            v.parse().map_err(|e| format!("{name}: {e}\n{USAGE}"))
        })
    };
    let batch = num("--batch", 32)?;
    let repeat = num("--repeat", 3)?.max(1);
    let steps = num("--steps", 5)?.max(1);
    let full = spec("char-gpt.toml")?;
    let lora = spec("char-gpt-lora.toml")?;
    let params: usize = Graph::new(&full, 1)
        .map_err(|e| e.to_string())?
        .params()
        .map(|(_, p)| p.shape.iter().product::<usize>())
        .sum();
    println!(
        "char transformer (examples/char-gpt.toml): {params} parameters, batch {batch}, 1 thread"
    );

    if args.iter().any(|a| a == "--only-lora") {
        // The LoRA fine-tune rows alone (frozen base in the arena / f32, fp16, int8 images).
        return lora_perplexity(repeat, arg(args, "--base"));
    }

    // 1. frugal vs PyTorch, alternating, fresh processes.
    let torch = find_torch(args);
    vs_torch(batch, steps, repeat, torch.as_deref())?;

    lstm_rows(torch.as_deref(), batch, repeat, steps)?;

    // 2. LoRA vs full fine-tuning arenas at the same batch (plain plans).
    let pf = Plan::new(Graph::new(&full, batch).map_err(|e| e.to_string())?);
    let pl = Plan::new(Graph::new(&lora, batch).map_err(|e| e.to_string())?);
    println!(
        "\nfine-tuning arena at batch {batch}: full {} , LoRA (examples/char-gpt-lora.toml) {} — {:.2}× of full",
        mib(pf.arena_bytes as f64),
        mib(pl.arena_bytes as f64),
        pl.arena_bytes as f64 / pf.arena_bytes as f64
    );

    // 3. LoRA within a third of full fine-tuning's arena (the plan the policies choose) and its time
    //    against LoRA's plain plan; then the full model within a quarter of its unconstrained arena;
    //    each pair of plans timed alternately in this process.
    if !args.iter().any(|a| a == "--no-budget") {
        // Steps of the two plans interleaved one by one (frugal_cli::measure, synthetic tokens).
        let rounds = steps * repeat;
        let third = pf.needed_bytes() / 3;
        let lcost = CostModel::estimate(&pl.graph);
        let s = Instant::now();
        match policy::plan_for_budget(&lora, batch, Budget::new(third), PolicyKind::Auto, &lcost) {
            Ok(c) => {
                let planned = s.elapsed().as_secs_f64();
                let t = steps_ms_interleaved(&[(&pl, batch), (&c.plan, batch)], rounds)
                    .map_err(|e| e.to_string())?;
                println!(
                    "LoRA within ⅓ of full fine-tuning's arena ({}; planned in {planned:.1} s): policy {}, micro-batch {} × {}, {} recomputes, arena {} ({:.2}× of full), {:.1} ms/step vs {:.1} for LoRA's plain plan ({:.2}×; medians of {rounds} interleaved steps)",
                    mib(third as f64),
                    c.policy.name(),
                    c.plan.graph.batch,
                    c.plan.micro_batches,
                    c.recomputes,
                    mib(c.plan.arena_bytes as f64),
                    c.plan.arena_bytes as f64 / pf.arena_bytes as f64,
                    t[1],
                    t[0],
                    t[1] / t[0]
                );
            }
            Err(e) => println!("LoRA within ⅓ of full fine-tuning's arena: no plan ({e})"),
        }
        // The plain plan with its attention in recompute mode (the probabilities recomputed tile by tile
        // in the backward) against the plain plan that saves them.
        let rec = policy::graph_in_mode(&full, batch, true).map_err(|e| e.to_string())?;
        let pr = Plan::new(rec);
        let t = steps_ms_interleaved(&[(&pf, batch), (&pr, batch)], rounds)
            .map_err(|e| e.to_string())?;
        println!(
            "plain plan, attention recomputed: arena {} ({:.3}× the saving plan's {}), {:.1} ms/step vs {:.1} ({:.2}×; medians of {rounds} interleaved steps)",
            mib(pr.arena_bytes as f64),
            pr.arena_bytes as f64 / pf.arena_bytes as f64,
            mib(pf.arena_bytes as f64),
            t[1],
            t[0],
            t[1] / t[0]
        );
        let cost = CostModel::estimate(&pf.graph);
        let quarter = pf.needed_bytes() / 4;
        let s = Instant::now();
        match policy::plan_for_budget(&full, batch, Budget::new(quarter), PolicyKind::Auto, &cost) {
            Ok(c) => {
                let planned = s.elapsed().as_secs_f64();
                let t = steps_ms_interleaved(&[(&pf, batch), (&c.plan, batch)], rounds)
                    .map_err(|e| e.to_string())?;
                println!(
                    "budget ¼ of the unconstrained arena ({}; planned in {planned:.1} s): policy {}, micro-batch {} × {}, attention {}, {} recomputes, arena {}, {:.1} ms/step vs {:.1} unconstrained ({:.2}×; medians of {rounds} interleaved steps)",
                    mib(quarter as f64),
                    c.policy.name(),
                    c.plan.graph.batch,
                    c.plan.micro_batches,
                    attn_mode(&c.plan),
                    c.recomputes,
                    mib(c.plan.arena_bytes as f64),
                    t[1],
                    t[0],
                    t[1] / t[0]
                );
            }
            Err(e) => println!(
                "budget ¼ of the unconstrained arena ({}): no plan ({e})",
                mib(quarter as f64)
            ),
        }
        let s = Instant::now();
        let min = policy::search_min_budget(&full, batch, &cost, MIN_PLANNINGS)
            .map_err(|e| e.to_string())?;
        let searched = s.elapsed().as_secs_f64();
        let t = steps_ms_interleaved(&[(&pf, batch), (&min.plan, batch)], steps)
            .map_err(|e| e.to_string())?;
        println!(
            "smallest budget the policies reach at batch {batch}: {} ({:.3}× the unconstrained {}): micro-batch {} × {}, attention {}, {} recomputes, {:.2}× the unconstrained time ({steps} interleaved steps); no plan of that micro-batching needs less than {} ({:.3}×) — bisection of {} plannings in {searched:.1} s",
            mib(min.plan.needed_bytes() as f64),
            min.plan.needed_bytes() as f64 / pf.needed_bytes() as f64,
            mib(pf.needed_bytes() as f64),
            min.plan.graph.batch,
            min.plan.micro_batches,
            attn_mode(&min.plan),
            min.plan
                .program
                .iter()
                .filter(|i| i.phase == frugal_core::plan::Phase::Recompute)
                .count(),
            t[1] / t[0],
            mib(min.lower_bound as f64),
            min.lower_bound as f64 / pf.needed_bytes() as f64,
            min.plannings,
        );
    }

    // 4. LoRA's held-out perplexity on the model pretrained here.
    if args.iter().any(|a| a == "--no-ppl") {
        println!("LoRA held-out perplexity: not measured (--no-ppl)");
    } else {
        println!();
        lora_perplexity(repeat, arg(args, "--base"))?;
    }
    Ok(())
}

/// How a plan's attention keeps its probabilities for the backward.
fn attn_mode(p: &Plan) -> &'static str {
    if p.graph.attn_recompute() {
        "recomputed"
    } else {
        "saved"
    }
}

/// The character LSTM (`examples/char-lstm.toml`) against PyTorch's `nn.LSTM` (tests/golden/gen.py's
/// module for an `lstm` entry): the transformer's harness — fresh processes, frugal and PyTorch
/// alternating, 1 thread, median ms/step and peak RSS over each process's baseline.
fn lstm_rows(torch: Option<&str>, batch: usize, repeat: usize, steps: usize) -> Result<(), String> {
    const MODEL: &str = "char-lstm.toml";
    let params: usize = Graph::new(&spec(MODEL)?, 1)
        .map_err(|e| e.to_string())?
        .params()
        .map(|(_, p)| p.shape.iter().product::<usize>())
        .sum();
    let (mut fm, mut fp, mut tm, mut tp) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut arena = 0;
    for _ in 0..repeat {
        let (ms, peak, a, _) = run_frugal(MODEL, batch, steps, None)?;
        fm.push(ms);
        fp.push(peak);
        arena = a;
        if let Some(py) = torch {
            let (ms, peak) = run_torch(py, MODEL, batch, steps)?;
            tm.push(ms);
            tp.push(peak);
        }
    }
    println!("\nchar LSTM (examples/{MODEL}): {params} parameters, batch {batch}, 1 thread");
    println!("\n| | ms/step (median of {repeat}) | peak RSS over baseline | arena |");
    println!("|---|---|---|---|");
    println!(
        "| frugal | {:.1} | {} | {} |",
        median(fm.clone()),
        mib(median(fp.clone())),
        mib(arena as f64)
    );
    if torch.is_some() {
        println!(
            "| PyTorch nn.LSTM | {:.1} | {} | |",
            median(tm.clone()),
            mib(median(tp.clone()))
        );
        println!(
            "\nfrugal / PyTorch (LSTM): time {:.2}×, peak memory {:.2}×",
            median(fm) / median(tm),
            median(fp) / median(tp)
        );
    }
    Ok(())
}
