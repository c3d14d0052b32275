//! `cargo xtask bench budget`: what the memory policies buy, measured in one run on this machine.
//! - Melon's headline: at a budget equal to the unconstrained arena at batch 32, the largest batch that
//!   trains (any exact policy) and its samples/s relative to the unconstrained batch 32.
//! - The smallest feasible budget relative to the unconstrained arena, and ms/step at ½ and ¼ of it.
//! - MobileNetV2 (examples/mobilenetv2.toml, width 0.35, 32×32, BatchNorm after every conv, exact):
//!   Melon's own benchmark model.
//! - Sage's orderings side by side at fixed budgets: micro-batch only, recompute only, hybrid,
//!   recompute-first.
use std::path::Path;

use crate::stats::median;

use frugal_cli::measure::{profile, steps_ms_interleaved, Batch};
use frugal_cli::spec_toml::load_model;
use frugal_core::budget::Budget;
use frugal_core::exec::{ladder, pick, Executor};
use frugal_core::graph::Graph;
use frugal_core::model::ModelSpec;
use frugal_core::plan::Plan;
use frugal_core::policy::{self, Approximations, CostModel, PolicyKind};

/// Interleaved rounds per comparison (one step of every plan compared per round; medians).
const STEPS: usize = 21;

/// MobileNetV2's headline: repetitions of the interleaved comparison (each of [`MOBILENET_ROUNDS`]
/// rounds), reported as the median ratio and its spread.
const MOBILENET_REPS: usize = 5;
const MOBILENET_ROUNDS: usize = 3;

/// Melon's batch factor: the headline batch is at least this many times 32.
const MELON_FACTOR: f64 = 4.33;

/// The MobileNetV2 example (a step of batch 128 takes about a second here: fewer rounds).
const MOBILENET: &str = "mobilenetv2.toml";

/// The cost model the policies rank plans by: the FLOP estimate, or for MobileNetV2 instruction times
/// measured here at `batch` and `batch / 4` (`frugal train --profile`'s; Melon profiles one batch
/// too). On MobileNetV2 the estimate prices its narrow 1×1 expansions like the depthwise convolutions
/// (about 16 FLOPs per output each at width 0.35), which a GEMM with K = 8 does not run at; with the
/// profile the greedy's recomputations add fewer FLOPs.
fn cost_model(spec: &ModelSpec, batch: usize, profiled: bool) -> Result<CostModel, String> {
    if profiled {
        profile(spec, batch).map_err(|e| e.to_string())
    } else {
        Ok(CostModel::estimate(
            &Graph::new(spec, batch).map_err(|e| e.to_string())?,
        ))
    }
}

fn steps_for(file: &str) -> usize {
    if file == MOBILENET {
        9
    } else {
        STEPS
    }
}

fn model(name: &str) -> Result<ModelSpec, String> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name);
    Ok(load_model(&p).map_err(|e| e.to_string())?.spec)
}

fn fmt_kib(b: usize) -> String {
    format!("{:.1} KiB", b as f64 / 1024.0)
}

/// `cargo xtask bench budget [--mobilenet | --mobilenet-fusion [--batches B,B…] [--reps N]]`: every
/// table, or (`--mobilenet`) only MobileNetV2's rows of the headline and the smallest-budget tables (a
/// few minutes), or (`--mobilenet-fusion`) the CPU backend's fused BatchNorm backward on MobileNetV2's
/// headline plans against the same plans without it ([`mobilenet_fusion`]).
pub fn main(args: &[String]) -> Result<(), String> {
    const USAGE: &str =
        "usage: cargo xtask bench budget [--mobilenet | --mobilenet-fusion [--batches B,B…] [--reps N]]";
    if args.first().map(String::as_str) == Some("--mobilenet-fusion") {
        let (mut batches, mut reps) = (vec![139, 160], MOBILENET_REPS);
        let mut it = args[1..].iter();
        while let Some(a) = it.next() {
            let v = it.next().ok_or(USAGE)?;
            match a.as_str() {
                "--batches" => {
                    batches = v
                        .split(',')
                        .map(|b| b.trim().parse::<usize>().map_err(|e| format!("{b}: {e}")))
                        .collect::<Result<_, _>>()?
                }
                "--reps" => reps = v.parse().map_err(|e| format!("--reps {v}: {e}"))?,
                _ => return Err(USAGE.into()),
            }
        }
        return mobilenet_fusion(&batches, reps.max(1));
    }
    let only_mobilenet = match args {
        [] => false,
        [a] if a == "--mobilenet" => true,
        _ => return Err(USAGE.into()),
    };
    println!("`cargo xtask bench budget` — 1 thread, synthetic data; ms/step = median of {STEPS} steps, the plans of one row measured in interleaved rounds (one step of each per round), so a row's ratios come from the same moments of the machine.\n");
    let models = [
        ("digits-cnn.toml", "small CNN"),
        ("residual-bn.toml", "residual-BN CNN"),
    ];
    let headline = [
        ("digits-cnn.toml", "small CNN", false),
        ("residual-bn.toml", "residual-BN CNN (exact)", false),
        (
            "residual-bn.toml",
            "residual-BN CNN (ghost BN, opt-in)",
            true,
        ),
        (
            MOBILENET,
            "MobileNetV2 0.35, 32×32 (exact BN, profiled costs)",
            false,
        ),
    ];

    println!(
        "### Melon's headline: largest batch at the budget of the unconstrained batch-32 arena\n"
    );
    println!("MobileNetV2: batches ⌈4.33 × 32⌉ = 139, 144, 160, 176, 192 up to the first that does not fit, each plan's step checked bit-identical to the plain plan's at its batch; × samples/s is the median of {MOBILENET_REPS} repetitions of {MOBILENET_ROUNDS} interleaved rounds (all batches and batch 32 alternating) with the spread (min–max); the headline batch is the one with the best median.\n");
    println!("| model | budget | b32 ms/step | b32 samples/s | largest batch | its plan | samples/s | × batch | × samples/s |");
    println!("|---|---|---:|---:|---:|---|---:|---:|---:|");
    for (file, name, ghost) in headline {
        let approx = Approximations {
            ghost_batch_norm: ghost,
            ..Default::default()
        };
        let spec = model(file)?;
        let base = Plan::new(Graph::new(&spec, 32).map_err(|e| e.to_string())?);
        let budget = base.needed_bytes();
        // MobileNetV2: several batches from Melon's 4.33× up, repeated measurements, the best batch.
        let mobilenet = file == MOBILENET;
        if only_mobilenet && !mobilenet {
            continue;
        }
        if mobilenet {
            mobilenet_headline(&spec, name, budget)?;
            continue;
        }
        let batches: &[usize] = &[48, 64, 96, 128, 160, 192, 256, 384, 512];
        let mut fitting: Vec<(usize, policy::Chosen)> = Vec::new();
        for &batch in batches {
            let cost = cost_model(&spec, batch, false)?;
            if let Ok(c) = policy::plan_for_budget_with(
                &spec,
                batch,
                Budget::new(budget),
                PolicyKind::Auto,
                &cost,
                approx,
            ) {
                fitting.push((batch, c));
            }
        }
        if fitting.len() > 1 {
            fitting.drain(..fitting.len() - 1);
        }
        let mut runs = vec![(&base, 32)];
        runs.extend(fitting.iter().map(|(b, c)| (&c.plan, *b)));
        let t = steps_ms_interleaved(&runs, STEPS).map_err(|e| e.to_string())?;
        let base_ms = t[0];
        let base_sps = 32.0 / base_ms * 1e3;
        if fitting.is_empty() {
            println!(
                "| {name} | {} | {base_ms:.2} | {base_sps:.0} | 32 | — | — | 1.0× | — |",
                fmt_kib(budget),
            );
        }
        for (k, (b, c)) in fitting.iter().enumerate() {
            let ms = t[k + 1];
            let sps = *b as f64 / ms * 1e3;
            println!(
                "| {name} | {} | {base_ms:.2} | {base_sps:.0} | {b} | {} (micro-batch {} × {}, {} recomputes) | {sps:.0} | {:.2}× | {:.2} |",
                fmt_kib(budget),
                c.policy.name(),
                c.plan.graph.batch,
                c.plan.micro_batches,
                c.recomputes,
                *b as f64 / 32.0,
                sps / base_sps
            );
        }
    }

    println!("\n### Smallest feasible budget, and the time at ½ and ¼ of the unconstrained arena (batch 128)\n");
    println!("Smallest budget: `policy::floor`, bisection over budgets with the policy search to 1 % (the policy plans at the smallest budget, is refused at the bracket's lower end); proven bound: persistent storages plus the largest working set of one instruction (`policy::working_set_bound`), which no plan of these policies can go below.\n");
    println!("| model | unconstrained arena | ms/step | smallest budget | ÷ arena | refused at | proven bound ÷ arena | search | at ½ arena: plan | × time | at ¼ arena: plan | ÷ arena | × time |");
    println!("|---|---|---:|---|---:|---:|---:|---:|---|---:|---|---:|---:|");
    for (file, name) in [
        ("digits-cnn.toml", "small CNN"),
        ("residual-bn.toml", "residual-BN CNN"),
        (MOBILENET, "MobileNetV2 0.35, 32×32 (profiled costs)"),
    ] {
        if only_mobilenet && file != MOBILENET {
            continue;
        }
        let spec = model(file)?;
        let batch = 128;
        let g = Graph::new(&spec, batch).map_err(|e| e.to_string())?;
        let cost = cost_model(&spec, batch, file == MOBILENET)?;
        let plain = Plan::new(g.clone());
        let arena = plain.needed_bytes();
        let at = |frac: f64| {
            policy::plan_for_budget(
                &spec,
                batch,
                Budget::new((arena as f64 * frac) as usize),
                PolicyKind::Auto,
                &cost,
            )
        };
        let (half, quarter) = (at(0.5), at(0.25));
        let started = std::time::Instant::now();
        let floor = policy::floor(&spec, batch, PolicyKind::Auto, &cost, 0.01)
            .map_err(|e| e.to_string())?;
        let search_s = started.elapsed().as_secs_f64();
        let mut runs = vec![(&plain, batch)];
        runs.extend(
            [&half, &quarter]
                .into_iter()
                .flatten()
                .map(|c| (&c.plan, batch)),
        );
        let t = steps_ms_interleaved(&runs, steps_for(file)).map_err(|e| e.to_string())?;
        let mut next = 0;
        let mut cell = |c: &Result<policy::Chosen, policy::PlanError>| match c {
            Ok(c) => {
                next += 1;
                (
                    format!(
                        "{} (micro-batch {} × {}, {} recomputes)",
                        c.policy.name(),
                        c.plan.graph.batch,
                        c.plan.micro_batches,
                        c.recomputes
                    ),
                    c.plan.needed_bytes() as f64 / arena as f64,
                    t[next] / t[0],
                )
            }
            Err(e) => (format!("infeasible: {e}"), f64::NAN, f64::NAN),
        };
        let (hd, _, ht) = cell(&half);
        let (qd, qf, qt) = cell(&quarter);
        let frac = |b: usize| b as f64 / arena as f64;
        println!(
            "| {name} | {} | {:.2} | {} ({} recomputes) | {:.3} | {:.3} | {:.3} | {search_s:.1} s, {} probes | {hd} | {ht:.2} | {qd} | {qf:.3} | {qt:.2} |",
            fmt_kib(arena),
            t[0],
            fmt_kib(floor.budget),
            floor.chosen.recomputes,
            frac(floor.budget),
            frac(floor.refused_below),
            frac(floor.lower_bound),
            floor.probes,
        );
    }

    if only_mobilenet {
        return Ok(());
    }
    println!(
        "\n### Policy orderings (Sage §3.4.3) at fractions of the unconstrained arena, batch 128\n"
    );
    println!("time × the unconstrained plan's, measured in the same interleaved rounds (micro-batch × count, recomputes)\n");
    println!(
        "| model | budget | unconstrained ms/step | micro-batch only | recompute only | hybrid (Sage) | recompute-first |"
    );
    println!("|---|---|---:|---|---|---|---|");
    for (file, name) in models {
        let spec = model(file)?;
        let g = Graph::new(&spec, 128).map_err(|e| e.to_string())?;
        let cost = CostModel::estimate(&g);
        let plain = Plan::new(g);
        for frac in [0.75, 0.5, 0.25] {
            let b = (plain.needed_bytes() as f64 * frac) as usize;
            let chosen: Vec<Option<policy::Chosen>> = [
                PolicyKind::MicroBatch,
                PolicyKind::Recompute,
                PolicyKind::Hybrid,
                PolicyKind::RecomputeFirst,
            ]
            .into_iter()
            .map(|k| policy::plan_for_budget(&spec, 128, Budget::new(b), k, &cost).ok())
            .collect();
            let mut runs = vec![(&plain, 128)];
            runs.extend(chosen.iter().flatten().map(|c| (&c.plan, 128)));
            let t = steps_ms_interleaved(&runs, STEPS).map_err(|e| e.to_string())?;
            let mut next = 1;
            let cells: Vec<String> = chosen
                .iter()
                .map(|c| match c {
                    Some(c) => {
                        next += 1;
                        format!(
                            "{:.2}× ({}×{}, {} rc)",
                            t[next - 1] / t[0],
                            c.plan.graph.batch,
                            c.plan.micro_batches,
                            c.recomputes
                        )
                    }
                    None => "infeasible".into(),
                })
                .collect();
            println!(
                "| {name} | {frac} × ({}) | {:.2} | {} |",
                fmt_kib(b),
                t[0],
                cells.join(" | ")
            );
        }
    }
    // Halving the budget mid-step: from 1.2× the unconstrained arena (the plain plan runs) to 0.6× (just
    // above the model's recompute floor, 0.57×: the deepest halving there is), and from 1.5× to 0.75×.
    adaptation(1.2)?;
    adaptation(1.5)?;
    Ok(())
}

/// Melon's headline on MobileNetV2: every batch from ⌈4.33 × 32⌉ up that plans within the budget of
/// the batch-32 arena (profiled costs), each plan's step checked bit-identical to the plain plan's at
/// its batch, then all of them against batch 32 in [`MOBILENET_REPS`] repetitions of interleaved
/// rounds: the median samples/s ratio per batch and its spread (min–max over the repetitions). The
/// headline batch is the one with the best median, not necessarily the largest.
fn mobilenet_headline(spec: &ModelSpec, name: &str, budget: usize) -> Result<(), String> {
    let least = (MELON_FACTOR * 32.0).ceil() as usize;
    let base = Plan::new(Graph::new(spec, 32).map_err(|e| e.to_string())?);
    let mut fitting: Vec<(usize, policy::Chosen, f64)> = Vec::new();
    for batch in [least, 144, 160, 176, 192] {
        let cost = cost_model(spec, batch, true)?;
        let started = std::time::Instant::now();
        match policy::plan_for_budget(spec, batch, Budget::new(budget), PolicyKind::Auto, &cost) {
            Ok(c) => fitting.push((batch, c, started.elapsed().as_secs_f64())),
            Err(_) => break,
        }
    }
    // The policy never changes the maths: each plan's step against the plain plan's, same batch, bit
    // for bit (the tests check this on a smaller MobileNetV2 at several budgets).
    for (b, c, _) in &fitting {
        let plain = Plan::new(Graph::new(spec, *b).map_err(|e| e.to_string())?);
        if one_step_bits(&plain, *b)? != one_step_bits(&c.plan, *b)? {
            return Err(format!(
                "{name}: the batch-{b} plan's step differs from the plain plan's"
            ));
        }
    }
    let mut runs = vec![(&base, 32)];
    runs.extend(fitting.iter().map(|(b, c, _)| (&c.plan, *b)));
    // ratios[k][r]: batch k's samples/s over batch 32's in repetition r.
    let mut ratios = vec![Vec::new(); fitting.len()];
    let mut base_ms = Vec::new();
    for _ in 0..MOBILENET_REPS {
        let t = steps_ms_interleaved(&runs, MOBILENET_ROUNDS).map_err(|e| e.to_string())?;
        base_ms.push(t[0]);
        for (k, (b, _, _)) in fitting.iter().enumerate() {
            ratios[k].push((*b as f64 / t[k + 1]) / (32.0 / t[0]));
        }
    }
    let base_ms = median(base_ms);
    let base_sps = 32.0 / base_ms * 1e3;
    let best = (0..fitting.len())
        .max_by(|&a, &b| median(ratios[a].clone()).total_cmp(&median(ratios[b].clone())));
    for (k, (b, c, plan_s)) in fitting.iter().enumerate() {
        let r = &ratios[k];
        let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = r.iter().copied().fold(0.0, f64::max);
        let med = median(r.clone());
        println!(
            "| {name}{} | {} | {base_ms:.2} | {base_sps:.0} | {b} | {} ({} recomputes, planned in {plan_s:.1} s) | {:.0} | {:.2}× | {med:.2} ({lo:.2}–{hi:.2}, {MOBILENET_REPS} reps) |",
            if Some(k) == best { " **headline**" } else { "" },
            fmt_kib(budget),
            c.policy.name(),
            c.recomputes,
            med * base_sps,
            *b as f64 / 32.0,
        );
    }
    if fitting.is_empty() {
        println!("| {name} | {} | {base_ms:.2} | {base_sps:.0} | 32 | — (no batch from {least} fits) | — | 1.0× | — |", fmt_kib(budget));
    }
    Ok(())
}

/// The CPU backend's fused BatchNorm backward (a ReLU6's derivative, the BatchNorm's gradient and input
/// derivative as one kernel) on MobileNetV2's plans at `batches` for the budget of the batch-32 arena
/// (the headline's plans, profiled costs), against the same plans without it (the forward's BatchNorm +
/// ReLU6 pass kept in both): each batch's step checked bit-identical both ways, then `reps`
/// repetitions of [`MOBILENET_ROUNDS`] interleaved rounds (batch 32 with the fusion, then every batch
/// fused and unfused, alternating), reported as median ms/step, the fused/unfused step-time ratio and
/// samples/s relative to batch 32, each with its spread over the repetitions.
fn mobilenet_fusion(batches: &[usize], reps: usize) -> Result<(), String> {
    use frugal_core::backend::CpuBackend;
    let spec = model(MOBILENET)?;
    let base = Plan::new(Graph::new(&spec, 32).map_err(|e| e.to_string())?);
    let budget = base.needed_bytes();
    let mut plans = Vec::new();
    for &b in batches {
        let cost = cost_model(&spec, b, true)?;
        let c = policy::plan_for_budget(&spec, b, Budget::new(budget), PolicyKind::Auto, &cost)
            .map_err(|e| format!("batch {b}: no plan within {}: {e}", fmt_kib(budget)))?;
        let f = step_bits_on(&c.plan, b, CpuBackend::new())?;
        if f.0 != step_bits_on(&c.plan, b, CpuBackend::new().without_backward_fusion())?.0 {
            return Err(format!("batch {b}: the fused backward changed the step"));
        }
        plans.push((b, c, f.1));
    }
    struct Run<'p> {
        ex: Executor<'p, CpuBackend>,
        arena: Vec<u8>,
        batch: Batch,
        times: Vec<f64>,
    }
    let mut runs = Vec::new();
    fn mk(
        plan: &Plan,
        n: usize,
        backend: CpuBackend,
    ) -> Result<(Executor<'_, CpuBackend>, Vec<u8>, Batch), String> {
        let mut arena = vec![0u8; plan.needed_bytes()];
        let mut ex = Executor::with_backend(plan, &arena, backend).map_err(|e| e.to_string())?;
        ex.init_params(&mut arena, 1).map_err(|e| e.to_string())?;
        let batch = Batch::new(plan, n);
        // Warm-up: the arena touched, the code paged in.
        ex.train_step(&mut arena, &batch.x, batch.target())
            .map_err(|e| e.to_string())?;
        Ok((ex, arena, batch))
    }
    let (ex, arena, batch) = mk(&base, 32, CpuBackend::new())?;
    runs.push(Run {
        ex,
        arena,
        batch,
        times: Vec::new(),
    });
    for (b, c, _) in &plans {
        for backend in [
            CpuBackend::new(),
            CpuBackend::new().without_backward_fusion(),
        ] {
            let (ex, arena, batch) = mk(&c.plan, *b, backend)?;
            runs.push(Run {
                ex,
                arena,
                batch,
                times: Vec::new(),
            });
        }
    }
    // Per repetition: each run's median ms/step over its rounds.
    let mut per_rep: Vec<Vec<f64>> = vec![Vec::new(); runs.len()];
    for _ in 0..reps {
        for r in runs.iter_mut() {
            r.times.clear();
        }
        for _ in 0..MOBILENET_ROUNDS {
            for r in runs.iter_mut() {
                let s = std::time::Instant::now();
                r.ex.train_step(&mut r.arena, &r.batch.x, r.batch.target())
                    .map_err(|e| e.to_string())?;
                r.times.push(s.elapsed().as_secs_f64() * 1e3);
            }
        }
        for (k, r) in runs.iter().enumerate() {
            per_rep[k].push(median(r.times.clone()));
        }
    }
    let spread = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        format!("{:.2} ({lo:.2}–{hi:.2})", median(v.to_vec()))
    };
    let b32 = &per_rep[0];
    println!("MobileNetV2 0.35, 32×32 (exact BN), plans for the budget of the batch-32 arena ({}), 1 thread: the fused BatchNorm backward against the same plan without it (the forward's BatchNorm + ReLU6 pass in both); medians of {reps} repetitions of {MOBILENET_ROUNDS} interleaved rounds (batch 32, then each batch fused and unfused), spread min–max over the repetitions.\n", fmt_kib(budget));
    println!("| batch | its plan | fused backwards / step | b32 ms/step | fused ms/step | unfused ms/step | fused / unfused time | × samples/s fused | × samples/s unfused |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for (k, (b, c, fused)) in plans.iter().enumerate() {
        let (f, u) = (&per_rep[1 + 2 * k], &per_rep[2 + 2 * k]);
        let ratio: Vec<f64> = f.iter().zip(u).map(|(f, u)| f / u).collect();
        let sps = |t: &[f64]| -> Vec<f64> {
            t.iter()
                .zip(b32)
                .map(|(t, t32)| (*b as f64 / t) / (32.0 / t32))
                .collect()
        };
        println!(
            "| {b} | {} ({} recomputes) | {fused} | {:.1} | {:.1} | {:.1} | {} | {} | {} |",
            c.policy.name(),
            c.recomputes,
            median(b32.clone()),
            median(f.clone()),
            median(u.clone()),
            spread(&ratio),
            spread(&sps(f)),
            spread(&sps(u)),
        );
    }
    Ok(())
}

/// [`one_step_bits`] on `backend`, and how many fused BatchNorm backwards the step ran.
fn step_bits_on(
    plan: &Plan,
    n: usize,
    backend: frugal_core::backend::CpuBackend,
) -> Result<(Vec<u32>, u64), String> {
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::with_backend(plan, &arena, backend).map_err(|e| e.to_string())?;
    ex.init_params(&mut arena, 1).map_err(|e| e.to_string())?;
    let b = Batch::new(plan, n);
    let loss = ex
        .train_step(&mut arena, &b.x, b.target())
        .map_err(|e| e.to_string())?
        .loss;
    let mut bits = vec![loss.to_bits()];
    for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
        let v = ex.read(&mut arena, t).map_err(|e| e.to_string())?;
        bits.extend(v.iter().map(|x| x.to_bits()));
    }
    Ok((bits, ex.backend().fused_backward()))
}

/// One training step of `plan` on `n` synthetic samples: the loss and every persistent tensor
/// (weights, optimizer state, BatchNorm statistics) as bits.
fn one_step_bits(plan: &Plan, n: usize) -> Result<Vec<u32>, String> {
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(plan, &arena).map_err(|e| e.to_string())?;
    ex.init_params(&mut arena, 1).map_err(|e| e.to_string())?;
    let b = Batch::new(plan, n);
    let loss = ex
        .train_step(&mut arena, &b.x, b.target())
        .map_err(|e| e.to_string())?
        .loss;
    let mut bits = vec![loss.to_bits()];
    for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
        let v = ex.read(&mut arena, t).map_err(|e| e.to_string())?;
        bits.extend(v.iter().map(|x| x.to_bits()));
    }
    Ok(bits)
}

/// Melon §4.4: the budget halves at 25/50/75 % of a step, from `from` × the unconstrained arena to half
/// that. On-the-fly adaptation (switch plans between two ops, move what both plans keep) against
/// stop-and-restart of the step on the smaller plan; overhead = step time minus the uninterrupted step on
/// the plan for the first budget.
fn adaptation(from: f64) -> Result<(), String> {
    let spec = model("residual-bn.toml")?;
    // A larger batch than the other tables: the switch and restart costs must dominate timer noise.
    let batch = 512;
    let g = Graph::new(&spec, batch).map_err(|e| e.to_string())?;
    let cost = CostModel::estimate(&g);
    let plain = Plan::new(g.clone()).needed_bytes();
    let high = (plain as f64 * from) as usize;
    let low = high / 2;
    let table = ladder(&spec, batch, &[high, low], &cost).map_err(|e| e.to_string())?;
    let top = &pick(&table, high)
        .ok_or("no plan for the higher budget")?
        .plan;
    let small = &pick(&table, low)
        .ok_or("no plan for the lower budget")?
        .plan;
    let b = Batch::new(top, batch);
    // One arena, touched once: first-touch page faults would otherwise swamp the differences.
    let mut arena = vec![1u8; top.needed_bytes()];
    // One step in `mode` (0 uninterrupted, 1 on-the-fly switch at `at`, 2 stop-restart at `at`): ms.
    let mut once = |mode: u8, at: usize| -> Result<f64, String> {
        let arena = &mut arena[..];
        let mut ex = Executor::new(top, arena).map_err(|e| e.to_string())?;
        ex.init_params(arena, 1).map_err(|e| e.to_string())?;
        if mode == 1 {
            // The switch's scratch is sized once per table, before any step (as a host does).
            ex.prepare_adaptive(&table);
        }
        let t = std::time::Instant::now();
        match mode {
            0 => {
                ex.train_step(arena, &b.x, b.target())
                    .map_err(|e| e.to_string())?;
            }
            1 => {
                let mut fired = false;
                let mut budget_at = |eo: usize, _: &Plan| {
                    (eo == at && !fired).then(|| {
                        fired = true;
                        Budget::new(low)
                    })
                };
                ex.train_step_adaptive(arena, &b.x, b.target(), &table, &mut budget_at, &mut ())
                    .map_err(|e| e.to_string())?;
            }
            _ => {
                ex.train_step_restart_at(arena, &b.x, b.target(), at, small, &mut ())
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(t.elapsed().as_secs_f64() * 1e3)
    };
    let fracs = [0.25, 0.5, 0.75];
    let ats: Vec<usize> = fracs
        .iter()
        .map(|f| (top.program.len() as f64 * f) as usize)
        .collect();
    // Interleaved: every round runs the uninterrupted step and both ways of handling each drop once.
    let mut base = Vec::new();
    let mut fly = vec![Vec::new(); fracs.len()];
    let mut restart = vec![Vec::new(); fracs.len()];
    once(0, 0)?; // warm-up
    for _ in 0..3 * STEPS {
        base.push(once(0, 0)?);
        for (i, &at) in ats.iter().enumerate() {
            fly[i].push(once(1, at)?);
            restart[i].push(once(2, at)?);
        }
    }
    let base = median(base);
    println!(
        "\n### Budget halved mid-step (Melon §4.4): residual-BN CNN, batch 512, {} → {} ({from}× → {}× the unconstrained arena)\n",
        fmt_kib(high),
        fmt_kib(low),
        from / 2.0
    );
    println!(
        "uninterrupted step on the first budget's plan ({} recomputes): {base:.2} ms; the halved budget's plan has {} recomputes; medians of {} interleaved rounds\n",
        top.program
            .iter()
            .filter(|i| i.phase == frugal_core::plan::Phase::Recompute)
            .count(),
        small
            .program
            .iter()
            .filter(|i| i.phase == frugal_core::plan::Phase::Recompute)
            .count(),
        3 * STEPS
    );
    println!("| drop at | on-the-fly ms | stop-restart ms | on-the-fly overhead | restart overhead | on-the-fly / restart |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (i, frac) in fracs.iter().enumerate() {
        let a = median(std::mem::take(&mut fly[i]));
        let r = median(std::mem::take(&mut restart[i]));
        println!(
            "| {:.0}% | {a:.2} | {r:.2} | {:.2} | {:.2} | {:.0}% |",
            frac * 100.0,
            a - base,
            r - base,
            100.0 * (a - base).max(0.0) / (r - base).max(1e-9)
        );
    }
    Ok(())
}

/// `cargo xtask bench planning [--reps R] [--batches B,B]`: how long `plan_for_budget` takes (Auto policy) for the example
/// models at growing batches and budgets: 0 (nothing fits: the whole search runs), the smallest plan's
/// budget, and the plain plan's half. The median of `R` runs (default 3) per cell; batches 32, 128 and
/// 1024 unless `--batches` says otherwise.
pub fn planning(args: &[String]) -> Result<(), String> {
    let mut reps = 3usize;
    let mut batches = vec![32usize, 128, 1024];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--refusals" {
            return refusals(reps);
        }
        let v = it.next().ok_or(format!("{a} needs a value"))?;
        match a.as_str() {
            "--reps" => reps = v.parse().map_err(|_| "--reps needs a number")?,
            "--batches" => {
                batches = v
                    .split(',')
                    .map(|b| b.parse().map_err(|_| format!("bad batch {b:?}")))
                    .collect::<Result<_, _>>()?
            }
            _ => {
                return Err(
                    "usage: cargo xtask bench planning [--reps R] [--batches B,B] [--refusals]"
                        .into(),
                )
            }
        }
    }
    let reps = reps.max(1);
    println!("`cargo xtask bench planning` — plan_for_budget (auto) wall time, median of {reps}\n");
    println!("| model | batch | budget 0 | smallest plan | ms | at the smallest | ms | at ½ plain | ms |");
    println!("|---|---:|---|---:|---:|---|---:|---|---:|");
    for file in ["digits-mlp.toml", "digits-cnn.toml", "transfer.toml"] {
        let spec = model(file)?;
        for &batch in &batches {
            let g = Graph::new(&spec, batch).map_err(|e| e.to_string())?;
            let cost = CostModel::estimate(&g);
            let plain = Plan::new(g).needed_bytes();
            let time = |b: usize| {
                let mut ms = Vec::with_capacity(reps);
                let mut out = String::new();
                for _ in 0..reps {
                    let t = std::time::Instant::now();
                    let r = policy::plan_for_budget(
                        &spec,
                        batch,
                        Budget::new(b),
                        PolicyKind::Auto,
                        &cost,
                    );
                    ms.push(t.elapsed().as_secs_f64() * 1e3);
                    out = match r {
                        Ok(c) => format!("{} ×{}", c.policy.name(), c.plan.micro_batches),
                        Err(_) => "refused".into(),
                    };
                }
                ms.sort_by(f64::total_cmp);
                (out, ms[ms.len() / 2])
            };
            let (r0, t0) = time(0);
            let smallest = policy::min_budget(&spec, batch, &cost).map_err(|e| e.to_string())?;
            let (r1, t1) = time(smallest);
            let (r2, t2) = time(plain / 2);
            println!(
                "| {file} | {batch} | {r0} | {} | {t0:.1} | {r1} | {t1:.1} | {r2} | {t2:.1} |",
                fmt_kib(smallest)
            );
        }
    }
    Ok(())
}

/// `bench planning --refusals`: how long `plan_for_budget` takes to refuse a budget of zero — what
/// it costs to size the figure the refusal names (`policy::refusal_floor`) — on the models of the
/// browser, the microcontroller and the sequence benchmarks at batch 32, by policy. Median of `reps`.
fn refusals(reps: usize) -> Result<(), String> {
    let reps = reps.max(1);
    println!(
        "`cargo xtask bench planning --refusals` — plan_for_budget at a budget of 0, median of {reps}\n"
    );
    println!("| model | batch | policy | figure named (B) | ms |");
    println!("|---|---:|---|---:|---:|");
    for file in [
        "digits-cnn.toml",
        "residual-bn.toml",
        "char-gpt-small-lora.toml",
        "char-lstm.toml",
        "mcu-mbv2.toml",
    ] {
        let spec = model(file)?;
        let batch = 32;
        let cost = CostModel::estimate(&Graph::new(&spec, batch).map_err(|e| e.to_string())?);
        for kind in [PolicyKind::Auto, PolicyKind::Recompute] {
            let mut ms = Vec::with_capacity(reps);
            let mut needed = 0;
            for _ in 0..reps {
                let t = std::time::Instant::now();
                let r = policy::plan_for_budget(&spec, batch, Budget::new(0), kind, &cost);
                ms.push(t.elapsed().as_secs_f64() * 1e3);
                needed = match r {
                    Err(policy::PlanError::Budget(
                        frugal_core::budget::BudgetError::TooSmall { needed, .. },
                    )) => needed,
                    Err(e) => return Err(format!("{file}: {e}")),
                    Ok(_) => return Err(format!("{file}: a budget of 0 planned")),
                };
            }
            ms.sort_by(f64::total_cmp);
            println!(
                "| {file} | {batch} | {} | {needed} | {:.1} |",
                kind.name(),
                ms[ms.len() / 2]
            );
        }
    }
    Ok(())
}
