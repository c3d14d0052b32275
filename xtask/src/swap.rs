//! `cargo xtask bench swap`: proactive swap (NNTrainer §4.3) on the VGG-16 / CIFAR-shape workload NNTrainer
//! used (batch 64, 3×32×32; conv stack 64-64-M-128-128-M-256×3-M-512×3-M-512×3-M; linear 512→512→10).
//! Three variants, each in a fresh child process: no swap, on-demand swap (lookahead 0) and proactive
//! swap (lookahead L, prefetched by [`FileSpill`]'s background thread). Measured like `bench memory`:
//! baseline RSS after the model, data, arena and spill file exist; kernel high-water mark reset; 2
//! warm-up steps, then timed steps; peak = high-water mark − baseline; ms/step = the median. Every
//! variant also prints a hash of its losses and final weights: swapping only moves bytes, so the hashes
//! must be equal.
use std::process::Command;
use std::time::Instant;

use frugal_cli::spill::FileSpill;
use frugal_core::exec::{Executor, Target};
use frugal_core::graph::Graph;
use frugal_core::model::{Dims, LayerKind, LayerSpec, LossKind, ModelSpec, OptimizerSpec, Src};
use frugal_core::plan::Plan;
use frugal_core::policy::swap::{plan_swap, swap_volume};
use frugal_core::rng::Rng;

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

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn num<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> Result<T, String> {
    match arg(args, name) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| format!("{name}: bad value {v}")),
    }
}

fn status_kib(field: &str) -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The plan of a variant: `None` = no swap, `Some(l)` = swap with lookahead `l` under `budget`. The bool
/// says whether the plan fits the budget.
fn variant_plan(g: &Graph, lookahead: Option<usize>, budget: usize) -> (Plan, bool) {
    match lookahead {
        None => (Plan::new(g.clone()), true),
        Some(l) => match plan_swap(g, l, budget) {
            Ok(p) => (p, true),
            Err(p) => (p, false),
        },
    }
}

fn fnv(h: &mut u64, bits: u32) {
    for b in bits.to_le_bytes() {
        *h = (*h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
}

/// The measuring child: prints one `RESULT` line.
pub fn child(args: &[String]) -> Result<(), String> {
    let scale: u32 = num(args, "--scale", 1)?;
    let batch: usize = num(args, "--batch", 64)?;
    let steps: usize = num(args, "--steps", 5)?;
    let budget: usize = num(args, "--budget", 0)?;
    let lookahead: Option<usize> = match arg(args, "--lookahead") {
        None | Some("none") => None,
        Some(v) => Some(
            v.parse()
                .map_err(|_| format!("--lookahead: bad value {v}"))?,
        ),
    };
    let spec = vgg16(scale);
    let g = Graph::new(&spec, batch).map_err(|e| e.to_string())?;
    let (plan, fits) = variant_plan(&g, lookahead, budget);
    let (pairs, swapped) = swap_volume(&plan);
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(&plan, &arena).map_err(|e| e.to_string())?;
    ex.init_params(&mut arena, 0).map_err(|e| e.to_string())?;
    let mut spill = FileSpill::new().map_err(|e| format!("spill file: {e}"))?;
    let per = spec.input.numel();
    let mut rng = Rng::new(0);
    let x: Vec<f32> = (0..batch * per).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let y: Vec<u32> = (0..batch as u32).map(|i| i % 10).collect();
    let mut step = |arena: &mut [u8]| -> Result<f32, String> {
        let r = match lookahead {
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
    drop(step);
    let st = spill.stats();
    for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
        for v in ex.read(&mut arena, t).map_err(|e| e.to_string())? {
            fnv(&mut hash, v.to_bits());
        }
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let median = times[times.len() / 2];
    let n = (steps + 2) as f64;
    println!(
        "RESULT {} {} {baseline} {peak} {median:.3} {pairs} {swapped} {} {} {:.3} {} {hash:016x}",
        plan.arena_bytes,
        fits as u8,
        st.prefetched_reads as f64 / n,
        st.direct_reads as f64 / n,
        st.wait_ns as f64 / 1e6 / n,
        st.peak_staged,
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
    staged: usize,
    hash: String,
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
        staged: p(11)? as usize,
        hash: f.get(12).unwrap_or(&"?").to_string(),
    })
}

/// The parent: `cargo xtask bench swap [--scale S] [--batch B] [--lookahead L] [--budget-mib M]
/// [--steps N]`. Without `--budget-mib`, the budget is the smallest arena the proactive planner reaches.
pub fn main(args: &[String]) -> Result<(), String> {
    let scale: u32 = num(args, "--scale", 4)?;
    let batch: usize = num(args, "--batch", 64)?;
    let lookahead: usize = num(args, "--lookahead", 3)?;
    let steps: usize = num(args, "--steps", 5)?;
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
            let (Ok(p) | Err(p)) = plan_swap(&g, lookahead, 0);
            eprintln!(
                "smallest proactive arena: {:.2} MiB (planned in {:.0} ms)",
                p.arena_bytes as f64 / MIB,
                t.elapsed().as_secs_f64() * 1e3
            );
            p.needed_bytes()
        }
    };
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let common = |l: &str| -> Vec<String> {
        [
            "--scale",
            &scale.to_string(),
            "--batch",
            &batch.to_string(),
            "--steps",
            &steps.to_string(),
            "--budget",
            &budget.to_string(),
            "--lookahead",
            l,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let variants = [
        ("no swap".to_string(), "none".to_string()),
        ("on-demand swap".to_string(), "0".to_string()),
        (
            format!("proactive swap (lookahead {lookahead})"),
            lookahead.to_string(),
        ),
    ];
    let mut rows = Vec::new();
    for (name, l) in &variants {
        eprint!("{name} … ");
        let r = run_child(&exe, name, &common(l))?;
        eprintln!("{:.1} ms/step", r.ms);
        rows.push(r);
    }
    let widths = if scale == 1 {
        "full widths".to_string()
    } else {
        format!("channels ÷{scale}")
    };
    println!(
        "\n`cargo xtask bench swap{}` — VGG-16 ({widths}), batch {batch}, 3×32×32, SGD; 1 thread; fresh process per row; MiB = 2^20 bytes.",
        args.iter().map(|a| format!(" {a}")).collect::<String>()
    );
    println!(
        "Plain arena {:.2} MiB; swap budget {:.2} MiB; swap store: a temporary file (FileSpill), prefetches read by a background thread.",
        plain.arena_bytes as f64 / MIB,
        budget as f64 / MIB
    );
    println!("Peak = VmHWM over the baseline (model, data, arena allocated, weights written); ms/step = median of {steps} steps after 2 warm-up steps.\n");
    println!("| variant | arena MiB | swaps/step | swapped MiB/step (each way) | peak over baseline MiB | peak vs no swap | ms/step | time vs no swap | prefetched / direct reads per step | wait ms/step | staging peak MiB | result hash |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let base = &rows[0];
    for r in &rows {
        println!(
            "| {}{} | {:.2} | {} | {:.2} | {:.2} | {:.2}× smaller | {:.1} | {:+.1}% | {:.0} / {:.0} | {:.2} | {:.2} | {} |",
            r.name,
            if r.fits { "" } else { " (over budget)" },
            r.arena as f64 / MIB,
            r.pairs,
            r.swapped as f64 / MIB,
            r.peak_mib,
            base.peak_mib / r.peak_mib.max(1e-9),
            r.ms,
            (r.ms / base.ms - 1.0) * 100.0,
            r.prefetched,
            r.direct,
            r.wait_ms,
            r.staged as f64 / MIB,
            r.hash
        );
    }
    let same = rows.iter().all(|r| r.hash == base.hash);
    let pro = &rows[2];
    let mem = base.peak_mib / pro.peak_mib.max(1e-9);
    let time = pro.ms / base.ms - 1.0;
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

/// Temporary: explain a plan.
pub fn explain(args: &[String]) -> Result<(), String> {
    let scale: u32 = num(args, "--scale", 4)?;
    let l: usize = num(args, "--lookahead", 0)?;
    let budget: usize = num(args, "--budget", 0)?;
    let g = Graph::new(&vgg16(scale), 64).map_err(|e| e.to_string())?;
    let (Ok(p) | Err(p)) = plan_swap(&g, l, budget);
    let live = frugal_core::policy::live_profile(&p);
    let pool = p.pool_profile();
    for (eo, ins) in p.program.iter().enumerate() {
        let name = if ins.spilled().is_some() {
            p.graph.tensors[ins.node as usize].name.clone()
        } else {
            p.graph
                .nodes
                .get(ins.node as usize)
                .map_or("loss".into(), |n| n.name.clone())
        };
        let lv: Vec<String> = p
            .lives
            .iter()
            .filter(|x| x.first <= eo as u32 && x.last >= eo as u32 && x.bytes > 100_000)
            .map(|x| format!("{}:{:.1}", x.name, x.bytes as f64 / MIB))
            .collect();
        println!(
            "{eo:3} {:4} {:20} live {:6.2} pool {:6.2}  {}",
            ins.phase.short(),
            name,
            live[eo] as f64 / MIB,
            pool[eo] as f64 / MIB,
            lv.join(" ")
        );
    }
    println!(
        "arena {:.2} lb {:.2}",
        p.arena_bytes as f64 / MIB,
        p.lower_bound as f64 / MIB
    );
    Ok(())
}
