//! `frugal-sandbox`: trains a model inside a wasmtime sandbox whose memory limit is the budget.
//!
//! `frugal-sandbox train examples/digits-mlp.toml --budget 512KiB` shows the guest's plan, progress,
//! loss, held-out accuracy and its peak linear memory against the budget. `--bench N` instead times N
//! training steps in the sandbox and natively (the same core, same plan policy, same batches) and
//! prints ms/step for both.
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use frugal_cli::progress::{interactive, EpochBar};
use frugal_cli::spec_toml::{load_model, ModelFile};
use frugal_cli::svg::human_bytes;
use frugal_cli::train::{load_data, parse_size};
use frugal_core::budget::Budget;
use frugal_core::exec::{Executor, Target};
use frugal_core::format::encode_model;
use frugal_core::policy::{Approximations, PolicyKind};
use frugal_wasmtime::{
    Batches, DatasetBatches, Order, PlanInfo, Sandbox, SessionOptions, GUEST_WASM,
};

#[derive(Parser)]
#[command(
    name = "frugal-sandbox",
    version,
    about = "Train inside a wasmtime sandbox whose memory limit is the budget"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Train a model (TOML) on its data set inside the sandbox.
    Train {
        /// Model description (see docs/model-format.md).
        model: PathBuf,
        /// The guest's whole linear memory (code data, stack, heap and arena), e.g. 512KiB.
        #[arg(long, default_value = "64MiB", value_parser = parse_size)]
        budget: usize,
        /// Memory policy when the plain plan does not fit.
        #[arg(long, default_value = "auto", value_parser = parse_policy)]
        policy: PolicyKind,
        /// Samples per step (default: the model file's [train] batch, else 32).
        #[arg(long)]
        batch: Option<usize>,
        /// Epochs (default: the model file's, else 10).
        #[arg(long)]
        epochs: Option<u32>,
        /// Seed of the weight initialisation (default: the model's) and of the shuffle.
        #[arg(long)]
        seed: Option<u64>,
        /// Fuel each call into the guest may burn (default: unbounded, and the guest is compiled
        /// without fuel metering).
        #[arg(long)]
        fuel: Option<u64>,
        /// Numbers: f32, int8 (int8 weights, pure-integer update), int8-master (f32 master weights).
        /// int8 runs the plain plan, which must fit the budget.
        #[arg(long, default_value = "f32")]
        precision: String,
        /// int8 pure-integer update: bit width of the largest weight step.
        #[arg(long, default_value_t = frugal_cli::train::DEFAULT_UPDATE_BITS)]
        update_bits: u8,
        /// Time this many training steps in the sandbox and natively instead of training.
        #[arg(long)]
        bench: Option<u32>,
        /// Print only the final summary.
        #[arg(long)]
        quiet: bool,
    },
}

fn parse_policy(s: &str) -> Result<PolicyKind, String> {
    PolicyKind::parse(s).ok_or_else(|| {
        format!(
            "unknown policy {s:?} (auto, plain, micro-batch, recompute, hybrid, recompute-first)"
        )
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cmd: Cmd) -> Result<(), Box<dyn std::error::Error>> {
    let Cmd::Train {
        model,
        budget,
        policy,
        batch,
        epochs,
        seed,
        fuel,
        precision,
        update_bits,
        bench,
        quiet,
    } = cmd;
    let precision = frugal_cli::train::parse_precision(&precision, update_bits)?;
    let mf = load_model(&model)?;
    let batch = batch.or(mf.train.batch.map(|b| b as usize)).unwrap_or(32);
    let epochs = epochs.or(mf.train.epochs).unwrap_or(10);
    let dataset = mf.train.dataset.clone().ok_or_else(|| {
        format!(
            "{}: no [train] dataset to train on (e.g. dataset = \"digits\")",
            model.display()
        )
    })?;
    let (train, test) = load_data(&dataset, mf.spec.input.numel())?;
    let seed = seed.unwrap_or(mf.spec.seed);
    let opts = SessionOptions {
        budget,
        batch,
        seed,
        policy,
        fuel,
        precision,
    };
    let t0 = Instant::now();
    // Fuel metering costs speed; compile it in only when a bound is asked for.
    let sandbox = if fuel.is_some() {
        Sandbox::new()?
    } else {
        Sandbox::unmetered()?
    };
    let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
    let bytes = encode_model(&mf.spec);
    if let Some(steps) = bench {
        if precision != frugal_core::model::Precision::F32 {
            return Err(
                "--bench compares f32 steps with native ones; leave out --precision".into(),
            );
        }
        return bench_steps(&sandbox, &mf, &bytes, train, test, &opts, steps);
    }
    let data = DatasetBatches::new(train, test, Order::Shuffled { seed });
    let steps_per_epoch = data.steps_per_epoch(batch);
    let mut s = sandbox.session(&bytes, data, &opts)?;
    let plan = s.plan();
    if !quiet {
        println!(
            "guest: {} of wasm, compiled in {compile_ms:.0} ms",
            human_bytes(GUEST_WASM.len())
        );
        print_plan(&plan, budget);
    }
    let mut last = None;
    for epoch in 0..epochs {
        let bar = (!quiet).then(|| EpochBar::new(epoch + 1, epochs, steps_per_epoch));
        let (mut loss_sum, mut correct, mut seen) = (0f64, 0usize, 0usize);
        for _ in 0..steps_per_epoch {
            for st in s.train(1)? {
                loss_sum += st.loss as f64 * st.samples as f64;
                correct += st.correct;
                seen += st.samples;
            }
            if let Some(b) = &bar {
                b.step(
                    (loss_sum / seen.max(1) as f64) as f32,
                    correct as f32 / seen.max(1) as f32,
                );
            }
        }
        let ev = s.evaluate()?;
        let loss = (loss_sum / seen.max(1) as f64) as f32;
        if let Some(b) = bar {
            b.finish(
                loss,
                correct as f32 / seen.max(1) as f32,
                Some(ev.accuracy()),
            );
        }
        last = Some((loss, ev));
    }
    let peak = s.memory_bytes();
    if let Some((loss, ev)) = last {
        println!(
            "trained {epochs} epochs in the sandbox: final loss {loss:.4}, held-out accuracy {:.1}% ({}/{})",
            ev.accuracy() * 100.0,
            ev.correct,
            ev.samples
        );
    }
    println!(
        "peak linear memory {} of the {} budget ({:.1}%)",
        human_bytes(peak),
        human_bytes(budget),
        100.0 * peak as f64 / budget.max(1) as f64
    );
    Ok(())
}

fn print_plan(p: &PlanInfo, budget: usize) {
    println!(
        "plan: {} policy, micro-batch {} × {}, {} recomputes; arena {} (lower bound {}, ratio {:.3})",
        p.policy.name(),
        p.micro_batch,
        p.micro_batches,
        p.recomputes,
        human_bytes(p.arena_bytes),
        human_bytes(p.lower_bound),
        p.arena_bytes as f64 / p.lower_bound.max(1) as f64,
    );
    println!(
        "linear memory: {} overhead (static data, stack, heap) + {} arena pages = {} of {} budget",
        human_bytes(p.overhead_bytes),
        human_bytes(p.arena_pages_bytes),
        human_bytes(p.overhead_bytes + p.arena_pages_bytes),
        human_bytes(budget),
    );
}

/// Times `steps` training steps (after a warm-up) in the sandbox and natively on the same sequential
/// batches, and prints both.
fn bench_steps(
    sandbox: &Sandbox,
    mf: &ModelFile,
    bytes: &[u8],
    train: frugal_cli::data::Dataset,
    test: frugal_cli::data::Dataset,
    opts: &SessionOptions,
    steps: u32,
) -> Result<(), Box<dyn std::error::Error>> {
    const WARMUP: u32 = 5;
    let steps = steps.max(1);
    let mut native_data = DatasetBatches::new(train.clone(), test.clone(), Order::Sequential);
    let mut s = sandbox.session(
        bytes,
        DatasetBatches::new(train, test, Order::Sequential),
        opts,
    )?;
    let plan = s.plan();
    print_plan(&plan, opts.budget);
    s.train(WARMUP)?;
    let t = Instant::now();
    let wasm_losses = s.train(steps)?;
    let wasm_ms = t.elapsed().as_secs_f64() * 1e3 / steps as f64;

    // Native: the same policy search, for the arena the guest got.
    let chosen = frugal_cli::train::plan_for(
        mf,
        opts.batch,
        Budget::new(plan.arena_pages_bytes),
        opts.policy,
        None,
        Approximations::default(),
    )?;
    let np = chosen.plan;
    let mut arena = vec![0u8; np.needed_bytes()];
    let mut ex = Executor::new(&np, &arena)?;
    ex.init_params(&mut arena, opts.seed)?;
    let per = native_data.sample_len();
    let mut x = vec![0f32; opts.batch * per];
    let mut y = vec![0u32; opts.batch];
    let mut step = |i: u32, ex: &mut Executor<'_>, arena: &mut [u8]| {
        let n = native_data.train_batch(i as u64, &mut x, &mut y);
        ex.train_step(arena, &x[..n * per], Target::Classes(&y[..n]))
    };
    for i in 0..WARMUP {
        step(i, &mut ex, &mut arena)?;
    }
    let t = Instant::now();
    let mut native_last = 0.0;
    for i in WARMUP..WARMUP + steps {
        native_last = step(i, &mut ex, &mut arena)?.loss;
    }
    let native_ms = t.elapsed().as_secs_f64() * 1e3 / steps as f64;
    let wasm_last = wasm_losses.last().map_or(f32::NAN, |s| s.loss);
    println!(
        "native plan: {} policy, micro-batch {} × {}, arena {}",
        chosen.policy.name(),
        np.graph.batch,
        np.micro_batches,
        human_bytes(np.arena_bytes)
    );
    println!("| where    | ms/step | last loss |");
    println!("|----------|--------:|----------:|");
    println!("| wasmtime | {wasm_ms:7.3} | {wasm_last:9.5} |");
    println!("| native   | {native_ms:7.3} | {native_last:9.5} |");
    println!(
        "wasmtime / native: {:.2}× ({steps} steps of batch {} after {WARMUP} warm-up steps; guest {} of wasm; peak linear memory {} of {})",
        wasm_ms / native_ms,
        opts.batch,
        human_bytes(GUEST_WASM.len()),
        human_bytes(s.memory_bytes()),
        human_bytes(opts.budget)
    );
    if !interactive() {
        // Keep CI logs self-describing.
        println!(
            "command: frugal-sandbox train <model> --bench {steps} --budget {}",
            opts.budget
        );
    }
    Ok(())
}
