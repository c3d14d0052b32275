//! `cargo xtask bench swap`: proactive swap (NNTrainer §4.3) on the VGG-16 / CIFAR-shape workload NNTrainer
//! used (batch 64, 3×32×32; conv stack 64-64-M-128-128-M-256×3-M-512×3-M-512×3-M; linear 512→512→10;
//! `--scale S` divides every width by S). Each variant runs in a fresh child process:
//! - no swap (the plain plan);
//! - on-demand swap: `plan_swap(g, 0, budget)`, a [`FileSpill`] without prefetch;
//! - proactive swap: the same plan, the store asking for each swap-in `L` instructions early and reading
//!   it in the background;
//! - proactive swap with the swap-ins also placed `L` instructions early in the arena
//!   (`plan_swap(g, L, budget)`, NNTrainer's reservation), to show what that costs.
//!
//! The store writes swapped tensors back to disk and drops them from the page cache (`--keep-cache`
//! turns that off), so their bytes really leave RAM. Measured like `bench memory`: baseline RSS after
//! the model, data, arena and spill file exist; kernel high-water mark reset; 2 warm-up steps, then timed
//! steps; peak = high-water mark − baseline; ms/step = the median. Every variant also prints a hash of
//! its losses and final weights: swapping only moves bytes, so the hashes must be equal.
use crate::bench::{arg, status_kib};
use std::process::Command;
use std::time::Instant;

use frugal_cli::spill::FileSpill;
use frugal_core::exec::{Executor, Target};
use frugal_core::graph::Graph;
use frugal_core::model::{Dims, LayerKind, LayerSpec, LossKind, ModelSpec, OptimizerSpec, Src};
use frugal_core::plan::Plan;
use frugal_core::policy::swap::{plan_swap, swap_volume};
use frugal_core::rng::Rng;
use frugal_core::spill::{Spill, SpillError};

const MIB: f64 = 1024.0 * 1024.0;

/// VGG-16 for 3×32×32 inputs with every width divided by `scale` (1 = the real network).
pub fn vgg16(scale: u32) -> ModelSpec {
    const CFG: [u32; 18] = [
        64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0,
    ];
    let mut layers: Vec<LayerSpec> = Vec::new();
    let mut add = |name: String, kind: LayerKind| {
        let src = match layers.len() {
            0 => Src::Input,
            n => Src::Layer(n as u32 - 1),
        };
        layers.push(LayerSpec {
            name,
            kind,
            inputs: vec![src],
            trainable: true,
            update: frugal_core::model::Update::All,
        });
    };
    let (mut block, mut k) = (1, 1);
    for c in CFG {
        if c == 0 {
            add(
                format!("pool{block}"),
                LayerKind::MaxPool2d {
                    kernel: [2, 2],
                    stride: [2, 2],
                },
            );
            block += 1;
            k = 1;
            continue;
        }
        add(
            format!("conv{block}_{k}"),
            LayerKind::Conv2d {
                out: (c / scale).max(1),
                kernel: [3, 3],
                stride: [1, 1],
                padding: [1, 1],
                groups: 1,
                bias: true,
            },
        );
        add(format!("relu{block}_{k}"), LayerKind::Relu);
        k += 1;
    }
    add("flatten".into(), LayerKind::Flatten);
    let fc = (512 / scale).max(1);
    add(
        "fc1".into(),
        LayerKind::Linear {
            out: fc,
            bias: true,
        },
    );
    add("relu_fc1".into(), LayerKind::Relu);
    add(
        "fc2".into(),
        LayerKind::Linear {
            out: 10,
            bias: true,
        },
    );
    ModelSpec {
        input: Dims::new(3, 32, 32),
        layers,
        loss: LossKind::SoftmaxCrossEntropy,
        optimizer: OptimizerSpec::Sgd {
            lr: 0.01,
            momentum: 0.0,
            weight_decay: 0.0,
        },
        seed: 0,
    }
}

fn num<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> Result<T, String> {
    match arg(args, name) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| format!("{name}: bad value {v}")),
    }
}

/// Times the calls the executor makes into the store (its foreground cost of swapping).
struct Timed<S> {
    inner: S,
    ns: u64,
}

impl<S: Spill> Spill for Timed<S> {
    fn write(&mut self, key: u32, data: &[u8]) -> Result<(), SpillError> {
        let t = Instant::now();
        let r = self.inner.write(key, data);
        self.ns += t.elapsed().as_nanos() as u64;
        r
    }
    fn read(&mut self, key: u32, out: &mut [u8]) -> Result<(), SpillError> {
        let t = Instant::now();
        let r = self.inner.read(key, out);
        self.ns += t.elapsed().as_nanos() as u64;
        r
    }
    fn prefetch(&mut self, key: u32, len: usize) {
        let t = Instant::now();
        self.inner.prefetch(key, len);
        self.ns += t.elapsed().as_nanos() as u64;
    }
    fn lookahead(&self) -> usize {
        self.inner.lookahead()
    }
}

fn fnv(h: &mut u64, bits: u32) {
    for b in bits.to_le_bytes() {
        *h = (*h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
}

/// The measuring child: prints one `RESULT` line. `--plan-lookahead none` is the plain plan.
pub fn child(args: &[String]) -> Result<(), String> {
    let scale: u32 = num(args, "--scale", 1)?;
    let batch: usize = num(args, "--batch", 64)?;
    let steps: usize = num(args, "--steps", 5)?;
    let budget: usize = num(args, "--budget", 0)?;
    let store_lookahead: usize = num(args, "--store-lookahead", 0)?;
    let evict = num::<u8>(args, "--evict", 1)? != 0;
    let plan_lookahead: Option<usize> = match arg(args, "--plan-lookahead") {
        None | Some("none") => None,
        Some(v) => Some(
            v.parse()
                .map_err(|_| format!("--plan-lookahead: bad value {v}"))?,
        ),
    };
    let spec = vgg16(scale);
    let g = Graph::new(&spec, batch).map_err(|e| e.to_string())?;
    let (plan, fits) = match plan_lookahead {
        None => (Plan::new(g.clone()), true),
        Some(l) => match plan_swap(&g, l, budget) {
            Ok(p) => (p, true),
            Err(p) => (p, false),
        },
    };
    let (pairs, swapped) = swap_volume(&plan);
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(&plan, &arena).map_err(|e| e.to_string())?;
    ex.init_params(&mut arena, 0).map_err(|e| e.to_string())?;
    let mut spill = Timed {
        inner: FileSpill::new()
            .map_err(|e| format!("spill file: {e}"))?
            .with_lookahead(store_lookahead)
            .evicting(evict),
        ns: 0,
    };
    let per = spec.input.numel();
    let mut rng = Rng::new(0);
    let x: Vec<f32> = (0..batch * per).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let y: Vec<u32> = (0..batch as u32).map(|i| i % 10).collect();
    let mut step = |arena: &mut [u8]| -> Result<f32, String> {
        let r = match plan_lookahead {
            None => ex.train_step(arena, &x, Target::Classes(&y)),
            Some(_) => ex.train_step_spilled(arena, &x, Target::Classes(&y), &mut spill),
        };
        r.map(|s| s.loss).map_err(|e| e.to_string())
    };

    let baseline = status_kib("VmRSS:");
    std::fs::write("/proc/self/clear_refs", "5").map_err(|e| format!("cannot reset VmHWM: {e}"))?;
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for _ in 0..2 {
        fnv(&mut hash, step(&mut arena)?.to_bits());
    }
    let mut times = Vec::new();
    for _ in 0..steps {
        let t = Instant::now();
        let loss = step(&mut arena)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        fnv(&mut hash, loss.to_bits());
    }
    let peak = status_kib("VmHWM:");
    let st = spill.inner.stats();
    let store_ms = spill.ns as f64 / 1e6 / (steps + 2) as f64;
    for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
        for v in ex.read(&mut arena, t).map_err(|e| e.to_string())? {
            fnv(&mut hash, v.to_bits());
        }
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let median = times[times.len() / 2];
    let n = (steps + 2) as f64;
    println!(
        "RESULT {} {} {baseline} {peak} {median:.3} {pairs} {swapped} {} {} {:.3} {} {hash:016x} {store_ms:.3}",
        plan.arena_bytes,
        fits as u8,
        st.prefetched_reads as f64 / n,
        st.direct_reads as f64 / n,
        st.wait_ns as f64 / 1e6 / n,
        (st.evicted as f64 / n) as u64,
    );
    Ok(())
}

struct Row {
    name: String,
    arena: usize,
    fits: bool,
    peak_mib: f64,
    ms: f64,
    pairs: usize,
    swapped: usize,
    prefetched: f64,
    direct: f64,
    wait_ms: f64,
    evicted: usize,
    hash: String,
    store_ms: f64,
}

fn run_child(exe: &std::path::Path, name: &str, args: &[String]) -> Result<Row, String> {
    let out = Command::new(exe)
        .arg("__bench-swap-one")
        .args(args)
        .output()
        .map_err(|e| format!("cannot start the benchmark child: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .ok_or_else(|| {
            format!(
                "{name}: child failed: {text}{}",
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
        name: name.to_string(),
        arena: p(1)? as usize,
        fits: p(2)? != 0.0,
        peak_mib: (p(4)? - p(3)?).max(0.0) / 1024.0,
        ms: p(5)?,
        pairs: p(6)? as usize,
        swapped: p(7)? as usize,
        prefetched: p(8)?,
        direct: p(9)?,
        wait_ms: p(10)?,
        evicted: p(11)? as usize,
        hash: f.get(12).unwrap_or(&"?").to_string(),
        store_ms: p(13)?,
    })
}

/// The parent: `cargo xtask bench swap [--scale S] [--batch B] [--lookahead L] [--budget-mib M]
/// [--steps N] [--keep-cache]`. Without `--budget-mib`, the budget is the smallest arena the on-demand
/// planner reaches.
pub fn main(args: &[String]) -> Result<(), String> {
    let scale: u32 = num(args, "--scale", 4)?;
    let batch: usize = num(args, "--batch", 64)?;
    let lookahead: usize = num(args, "--lookahead", 3)?;
    let steps: usize = num(args, "--steps", 5)?;
    let rounds: usize = num::<usize>(args, "--rounds", 5)?.max(1);
    let evict = !args.iter().any(|a| a == "--keep-cache");
    let spec = vgg16(scale);
    let g = Graph::new(&spec, batch).map_err(|e| e.to_string())?;
    let plain = Plan::new(g.clone());
    let budget = match arg(args, "--budget-mib") {
        Some(m) => {
            let m: f64 = m
                .parse()
                .map_err(|_| format!("--budget-mib: bad value {m}"))?;
            (m * MIB) as usize
        }
        None => {
            let t = Instant::now();
            let (Ok(p) | Err(p)) = plan_swap(&g, 0, 0);
            eprintln!(
                "smallest swap arena: {:.2} MiB (planned in {:.0} ms)",
                p.arena_bytes as f64 / MIB,
                t.elapsed().as_secs_f64() * 1e3
            );
            p.needed_bytes()
        }
    };
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let child_args = |plan: &str, store: usize| -> Vec<String> {
        [
            "--scale",
            &scale.to_string(),
            "--batch",
            &batch.to_string(),
            "--steps",
            &steps.to_string(),
            "--budget",
            &budget.to_string(),
            "--plan-lookahead",
            plan,
            "--store-lookahead",
            &store.to_string(),
            "--evict",
            if evict { "1" } else { "0" },
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let l = lookahead.to_string();
    let variants = [
        ("no swap".to_string(), child_args("none", 0)),
        ("on-demand swap".to_string(), child_args("0", 0)),
        (
            format!("proactive swap (lookahead {lookahead})"),
            child_args("0", lookahead),
        ),
        (
            format!("proactive, swap-ins placed {lookahead} early"),
            child_args(&l, lookahead),
        ),
    ];
    // Rounds run the variants in turn, so a noisy neighbour slows all of them alike; each variant
    // reports the median of its rounds' median steps (peak RSS and store time too), and its time against
    // no swap is the median over rounds of the ratio within one round.
    let mut runs: Vec<Vec<Row>> = (0..variants.len()).map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for (k, (name, a)) in variants.iter().enumerate() {
            eprint!("round {}/{rounds}: {name} … ", round + 1);
            let r = run_child(&exe, name, a)?;
            eprintln!("{:.1} ms/step", r.ms);
            runs[k].push(r);
        }
    }
    fn median(mut x: Vec<f64>) -> f64 {
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    }
    // Per variant: (ms range over rounds, median over rounds of ms / no swap's ms in the same round).
    let mut spread = Vec::new();
    for v in &runs {
        let ms: Vec<f64> = v.iter().map(|r| r.ms).collect();
        let lo = ms.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ms.iter().copied().fold(0.0, f64::max);
        let ratio = median(v.iter().zip(&runs[0]).map(|(r, b)| r.ms / b.ms).collect());
        spread.push((lo, hi, ratio));
    }
    let mut rows = Vec::new();
    for mut v in runs {
        let (ms, peak, store) = (
            median(v.iter().map(|r| r.ms).collect()),
            median(v.iter().map(|r| r.peak_mib).collect()),
            median(v.iter().map(|r| r.store_ms).collect()),
        );
        let mut r = v.swap_remove(0);
        r.ms = ms;
        r.peak_mib = peak;
        r.store_ms = store;
        rows.push(r);
    }
    let widths = if scale == 1 {
        "full widths".to_string()
    } else {
        format!("channels ÷{scale}")
    };
    println!(
        "\n`cargo xtask bench swap{}` — VGG-16 ({widths}), batch {batch}, 3×32×32, SGD; executor on 1 thread, the store's I/O thread beside it; fresh process per row; MiB = 2^20 bytes.",
        args.iter().map(|a| format!(" {a}")).collect::<String>()
    );
    println!(
        "Plain arena {:.2} MiB; swap budget {:.2} MiB; store: FileSpill (a temporary file{}).",
        plain.arena_bytes as f64 / MIB,
        budget as f64 / MIB,
        if evict {
            "; swapped bytes written back and dropped from the page cache"
        } else {
            "; the kernel may keep swapped bytes cached"
        }
    );
    println!("Peak = VmHWM over the baseline (model, data, arena allocated, weights written); ms/step = median of {steps} steps after 2 warm-up steps, median of {rounds} rounds run in turn (range of the rounds in brackets; other processes share this machine); time vs no swap = median over rounds of the ratio within a round; store ms/step = time inside the store's calls on the executor's thread (median round).\n");
    println!("| variant | arena MiB | swaps/step | swapped MiB/step (each way) | peak over baseline MiB | peak vs no swap | ms/step | time vs no swap | store ms/step | prefetched / on-demand reads per step | wait for prefetch ms/step | evicted MiB/step | result hash |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let base = &rows[0];
    for (r, (lo, hi, ratio)) in rows.iter().zip(&spread) {
        println!(
            "| {}{} | {:.2} | {} | {:.2} | {:.2} | {:.2}× smaller | {:.1} [{lo:.0}–{hi:.0}] | {:+.1}% | {:.2} | {:.0} / {:.0} | {:.2} | {:.2} | {} |",
            r.name,
            if r.fits { "" } else { " (over budget: smallest reached)" },
            r.arena as f64 / MIB,
            r.pairs,
            r.swapped as f64 / MIB,
            r.peak_mib,
            base.peak_mib / r.peak_mib.max(1e-9),
            r.ms,
            (ratio - 1.0) * 100.0,
            r.store_ms,
            r.prefetched,
            r.direct,
            r.wait_ms,
            r.evicted as f64 / MIB,
            r.hash
        );
    }
    let same = rows.iter().all(|r| r.hash == base.hash);
    let pro = &rows[2];
    let mem = base.peak_mib / pro.peak_mib.max(1e-9);
    let time = spread[2].2 - 1.0;
    println!(
        "\nresults {}; proactive swap: peak {mem:.2}× smaller (target ≥ 2×), {:+.1}% time (target ≤ +25%) — {}",
        if same {
            "bit-identical across variants"
        } else {
            "DIFFER across variants"
        },
        time * 100.0,
        if mem >= 2.0 && time <= 0.25 {
            "target met"
        } else {
            "target missed"
        }
    );
    if same {
        Ok(())
    } else {
        Err("swap variants gave different results".into())
    }
}
