//! `frugal`: train a model inside a memory budget, or show the plans of its arena.
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use frugal_cli::report;
use frugal_cli::spec_toml::{load_model, DatasetSource};
use frugal_cli::svg::{arena_svg, curves_svg, human_bytes, timeline_svg, TimelinePanel};
use frugal_cli::train::{self, parse_size, TrainOptions};
use frugal_cli::{checkpoint, devmem, fsutil, measure};
use frugal_core::budget::Budget;
use frugal_core::graph::Graph;
use frugal_core::plan::Plan;
use frugal_core::policy::{self, Approximations, CostModel, PolicyKind};
use frugal_core::pool::ThreadPool;

#[derive(Parser)]
#[command(
    name = "frugal",
    version,
    about = "Train neural networks inside a planned, fixed memory budget"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

fn parse_policy(s: &str) -> Result<PolicyKind, String> {
    PolicyKind::parse(s).ok_or_else(|| {
        format!(
            "unknown policy {s:?} (auto, plain, micro-batch, recompute, hybrid, recompute-first)"
        )
    })
}

#[derive(Subcommand)]
enum Cmd {
    /// Train a model (TOML) on its data set under a memory budget.
    Train {
        /// Model description (see docs/model-format.md).
        model: PathBuf,
        /// Arena budget, e.g. 2MiB, 600KiB (default: the memory this device can give now — the
        /// smaller of MemAvailable and the cgroup's limit minus its usage; unlimited when neither can
        /// be read). Batches that do not fit are micro-batched and/or recomputed, with the same
        /// gradients.
        #[arg(long, value_parser = parse_size)]
        budget: Option<usize>,
        /// Memory policy when the plain plan does not fit the budget.
        #[arg(long, default_value = "auto", value_parser = parse_policy)]
        policy: PolicyKind,
        /// Rank plans by instruction times measured on this device instead of the FLOPs estimate.
        #[arg(long)]
        profile: bool,
        /// Opt in to ghost batch norm: BatchNorm models may micro-batch, each micro-batch normalised with
        /// its own statistics (an approximation; never chosen without this flag).
        #[arg(long)]
        ghost_batch_norm: bool,
        /// Samples per step (default: the model file's [train] batch, else 32).
        #[arg(long)]
        batch: Option<usize>,
        /// Epochs (default: the model file's, else 10).
        #[arg(long)]
        epochs: Option<u32>,
        /// Shuffling seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Where to save the checkpoint (default: checkpoints/<model>.safetensors).
        #[arg(long)]
        save: Option<PathBuf>,
        /// Also draw loss and accuracy per epoch as SVG.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Weights to load before training (overrides the model file's).
        #[arg(long)]
        weights: Option<PathBuf>,
        /// A model file with a [lora] section: also write the adapters alone here (safetensors with
        /// PEFT's tensor names, and an adapter_config.json beside it). --save then holds the base
        /// weights with the adapters merged in, loadable by the base model file.
        #[arg(long)]
        save_adapters: Option<PathBuf>,
        /// Numeric precision: f32, int8 (pure integer: int8 weights, NITI update), int8-master (int8
        /// compute, f32 master weights and the model's optimizer), or f16-storage (f32 compute, the
        /// activations kept for the backward pass stored as IEEE half). int8 runs the plain plan.
        #[arg(long, default_value = "f32")]
        precision: String,
        /// int8 pure-integer update: bit width of the largest weight step (the learning rate's role).
        #[arg(long, default_value_t = train::DEFAULT_UPDATE_BITS)]
        update_bits: u8,
        /// int8: recompute every scale every step instead of self-adaptively (Mandheling §3.4).
        #[arg(long)]
        rescale_every_step: bool,
        /// int8: batch splitting (Mandheling §3.5) — profile every weight gradient on the first batch
        /// and run the ones whose cost per FLOP jumps with batch size in smaller chunks.
        #[arg(long)]
        batch_split: bool,
        /// CPU threads for f32 training (default: the cores this process may use). GEMM, convolution
        /// and large element-wise work are split by output ranges, so the results are the same, bit for
        /// bit, for any count. With `--device auto` the layers placed on the CPU run on them.
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
        threads: Option<u16>,
        /// Where f32 steps run: cpu, or gpu (wgpu: Vulkan/Metal/DX12, Mesa's lavapipe without a GPU;
        /// needs a build with `--features gpu`), or auto (each layer on the CPU or the GPU, chosen by
        /// dynamic programming over per-layer times and host-GPU transfer costs measured on this
        /// machine first; the placement is printed). On the GPU the budget bounds the plan's GPU
        /// memory; with auto it bounds the host arena and the GPU memory each.
        #[arg(long = "device", default_value = "cpu", value_parser = parse_device)]
        on: train::Device,
        /// Frozen parameters (LoRA's base weights, a sparse update's frozen layers) read from a
        /// parameter image outside the arena instead of the arena: f32, fp16 or int8 (Linear weights
        /// rounded to IEEE half, or int8 with a scale per output channel; biases and norms stay f32).
        /// The arena shrinks by their bytes and the budget bounds the arena; the frozen tensors come
        /// from --weights. fp16/int8 are approximations of the base (the saved, merged checkpoint
        /// holds the rounded base); CPU only.
        #[arg(long, value_parser = train::parse_frozen)]
        frozen: Option<frugal_core::plan::params::ParamEncoding>,
    },
    /// Print the plan of one training step: every tensor, its lifetime and offset; or, with --budgets,
    /// a table of plans for a ladder of budgets.
    Plan {
        /// Model description.
        model: PathBuf,
        /// Samples per step.
        #[arg(long, default_value_t = 32)]
        batch: usize,
        /// Budgets to plan for, e.g. 64KiB,128KiB,1MiB: prints budget → feasible, micro-batch,
        /// recomputes, extra FLOPs, predicted and measured ms/step.
        #[arg(long, value_delimiter = ',', value_parser = parse_size)]
        budgets: Vec<usize>,
        /// Policy for --budgets.
        #[arg(long, default_value = "auto", value_parser = parse_policy)]
        policy: PolicyKind,
        /// Draw the arena (execution order × address) as SVG; with --budgets one file per budget
        /// (`<name>-<budget>.svg`).
        #[arg(long)]
        svg: Option<PathBuf>,
        /// Draw the memory timeline (bytes in use per instruction, the budget, recomputes marked).
        #[arg(long)]
        timeline: Option<PathBuf>,
        /// Also list the program (instructions in execution order).
        #[arg(long)]
        program: bool,
        /// Rank plans by instruction times measured on this device.
        #[arg(long)]
        profile: bool,
        /// With --budgets: store the feasible plans as a plan table (versioned, checksummed binary) that
        /// a device loads beside the model.
        #[arg(long)]
        save_table: Option<PathBuf>,
    },
    /// Sample text from a trained sequence model (an embedding first; bytes as tokens).
    Generate {
        /// Model description.
        model: PathBuf,
        /// Trained weights (safetensors; for a LoRA model file, the base weights and adapters).
        #[arg(long)]
        weights: PathBuf,
        /// Text to continue.
        #[arg(long, default_value = "")]
        prompt: String,
        /// Bytes to generate.
        #[arg(long, default_value_t = 200)]
        length: usize,
        /// Softmax temperature (> 0; lower is greedier).
        #[arg(long, default_value_t = 0.8)]
        temperature: f32,
        /// Sampling seed (the same seed, weights and prompt give the same text).
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Convert a model (TOML) to frugal's binary model format (`.frgm`, versioned and checksummed), the
    /// form devices, the browser and the wasm sandbox load.
    Convert {
        /// Model description.
        model: PathBuf,
        /// Output file (default: the model's path with the extension `.frgm`).
        #[arg(short, long)]
        out: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

type Res = Result<(), Box<dyn std::error::Error>>;

fn cost_model(
    spec: &frugal_core::model::ModelSpec,
    batch: usize,
    profile: bool,
) -> Result<CostModel, Box<dyn std::error::Error>> {
    if profile {
        eprintln!(
            "profiling instruction times at batch {batch} and {} …",
            (batch / 4).max(1)
        );
        Ok(measure::profile(spec, batch)?)
    } else {
        Ok(CostModel::estimate(&Graph::new(spec, batch)?))
    }
}

fn save_tensors(path: &Path, t: &[(String, Vec<usize>, Vec<f32>)]) -> Res {
    let named: Vec<(&str, &[usize], &[f32])> = t
        .iter()
        .map(|(n, s, v)| (n.as_str(), s.as_slice(), v.as_slice()))
        .collect();
    checkpoint::save_safetensors(path, &named, None)?;
    Ok(())
}

fn run(cli: Cli) -> Res {
    match cli.cmd {
        Cmd::Generate {
            model,
            weights,
            prompt,
            length,
            temperature,
            seed,
        } => {
            let mf = load_model(&model)?;
            let text = frugal_cli::generate::generate(
                &mf.spec,
                |ex, arena| {
                    let n = train::load_weights(ex, arena, &weights)?;
                    if n == 0 {
                        return Err(
                            format!("{}: no tensor of the model in it", weights.display()).into(),
                        );
                    }
                    Ok(())
                },
                prompt.as_bytes(),
                frugal_cli::generate::Sampling {
                    length,
                    temperature,
                    seed,
                },
            )?;
            println!("{prompt}{}", String::from_utf8_lossy(&text));
        }
        Cmd::Convert { model, out } => {
            let mf = load_model(&model)?;
            let bytes = frugal_core::format::encode_model(&mf.spec);
            let out = out.unwrap_or_else(|| model.with_extension("frgm"));
            fsutil::write_atomic(&out, &bytes)?;
            println!(
                "{} → {} ({} bytes)",
                model.display(),
                out.display(),
                bytes.len()
            );
        }
        Cmd::Train {
            model,
            budget,
            policy,
            profile,
            ghost_batch_norm,
            batch,
            epochs,
            seed,
            save,
            plot,
            weights,
            precision,
            update_bits,
            rescale_every_step,
            batch_split,
            threads,
            on,
            save_adapters,
            frozen,
        } => {
            let mf = load_model(&model)?;
            if save_adapters.is_some() && mf.lora.is_none() {
                return Err(
                    format!("--save-adapters: {} has no [lora] section", model.display()).into(),
                );
            }
            // fp16 storage is an opt-in approximation of the f32 plan (compute stays f32).
            let f16_storage = precision == "f16-storage";
            let precision = if f16_storage {
                frugal_core::model::Precision::F32
            } else {
                train::parse_precision(&precision, update_bits)?
            };
            let batch = batch.or(mf.train.batch.map(|b| b as usize)).unwrap_or(32);
            let epochs = epochs.or(mf.train.epochs).unwrap_or(10);
            let source = mf.train.dataset.clone().unwrap_or(DatasetSource::Digits);
            let (train_set, test_set) = train::load_data(&source, mf.spec.input.numel())?;
            // No --budget: what the device can give now (available memory, the cgroup's room).
            let (budget_v, device) = match budget {
                Some(b) => (Budget::new(b), None),
                None => devmem::default_budget(),
            };
            let budget = budget.or((budget_v != Budget::UNLIMITED).then_some(budget_v.bytes));
            if let Some(m) = &device {
                println!(
                    "budget: {} — the memory this device can give ({}); set one with --budget",
                    human_bytes(budget_v.bytes),
                    m.source
                );
            }
            println!(
                "model {}: {} layers, {} train / {} test samples",
                model.display(),
                mf.spec.layers.len(),
                train_set.len(),
                test_set.len()
            );
            if frozen.is_some() && (precision != frugal_core::model::Precision::F32 || f16_storage)
            {
                return Err("--frozen trains in f32 (--precision f32)".into());
            }
            if precision != frugal_core::model::Precision::F32 {
                if on != train::Device::Cpu {
                    return Err(
                        "--device gpu/auto trains in f32 (int8 runs on the CPU backend)".into(),
                    );
                }
                return train_int8_cli(
                    &mf,
                    &model,
                    (&train_set, &test_set),
                    (batch, epochs, seed, budget_v),
                    precision,
                    (rescale_every_step, batch_split),
                    (save, plot, weights),
                );
            }
            let cost = cost_model(&mf.spec, batch, profile)?;
            let approx = Approximations {
                ghost_batch_norm,
                f16_storage,
            };
            let threads = threads.map_or_else(ThreadPool::available, usize::from);
            let opts = TrainOptions {
                batch,
                epochs,
                budget: budget_v,
                seed,
                progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
                quiet: false,
                policy,
                approx,
                threads,
                device: on,
                frozen,
            };
            let chosen =
                train::plan_run(&mf, &opts, Some(&cost)).map_err(|e| match (&e, &device) {
                    (train::TrainError::Budget(_), Some(m)) => format!(
                        "{e} (no --budget: {} bytes is what this device can give, by {})",
                        m.bytes, m.source
                    )
                    .into(),
                    _ => Box::<dyn std::error::Error>::from(e),
                })?;
            println!("{}", report::summary(&chosen.plan, budget));
            if let Some((enc, bytes)) = chosen.plan.params_space() {
                println!(
                    "frozen parameters: {} parameter image of {} ({} B) outside the arena: {} tensors, {} B in f32",
                    train::frozen_name(enc),
                    human_bytes(bytes + frugal_core::plan::params::IMAGE_HEADER),
                    bytes + frugal_core::plan::params::IMAGE_HEADER,
                    frugal_core::plan::params::read_only_tensors(&chosen.plan.graph).count(),
                    frugal_core::plan::params::read_only_tensors(&chosen.plan.graph)
                        .map(|t| chosen.plan.graph.tensors[t as usize].bytes)
                        .sum::<usize>()
                );
            }
            if f16_storage {
                let f32_plan = Plan::new(Graph::new(&mf.spec, batch)?);
                let (full, half) = policy::half::packed_bytes(&chosen.plan);
                println!(
                    "fp16 storage: layer outputs kept for the backward pass {} → {}; all activations kept {} → {} (arena {} → {})",
                    human_bytes(full),
                    human_bytes(half),
                    human_bytes(policy::half::saved_activation_bytes(&f32_plan)),
                    human_bytes(policy::half::saved_activation_bytes(&chosen.plan)),
                    human_bytes(f32_plan.arena_bytes),
                    human_bytes(chosen.plan.arena_bytes)
                );
            }
            println!(
                "policy: {}, micro-batch {} × {}, {} recomputes per step (+{:.2} MFLOP), predicted {:.2} ms/step",
                chosen.policy.name(),
                chosen.plan.graph.batch,
                chosen.plan.micro_batches,
                chosen.recomputes,
                chosen.extra_flops as f64 / 1e6,
                chosen.predicted_ms
            );
            if on == train::Device::Cpu {
                println!(
                    "cpu: {threads} thread{}",
                    if threads == 1 { "" } else { "s" }
                );
            }
            let w = weights.or(mf.train.weights.clone());
            let rep = train::train(&mf, &train_set, &test_set, &opts, w.as_ref())?;
            if train_set.tokens > 1 {
                let (b, a) = rep.test_loss;
                println!(
                    "held-out next-token accuracy: {:.2}% over {} tokens; perplexity {:.3} before training → {:.3} ({:+.1}%)",
                    rep.test_accuracy * 100.0,
                    rep.test_samples * train_set.tokens,
                    b.exp(),
                    a.exp(),
                    (a.exp() / b.exp() - 1.0) * 100.0
                );
            } else {
                let correct = (rep.test_accuracy * rep.test_samples as f32).round() as usize;
                println!(
                    "held-out accuracy: {:.2}% ({correct}/{})",
                    rep.test_accuracy * 100.0,
                    rep.test_samples
                );
            }
            let save = save.unwrap_or_else(|| default_checkpoint(&model));
            if let Some(dir) = save.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            let tensors = match &mf.lora {
                Some(l) => {
                    if let Some(path) = &save_adapters {
                        let a = frugal_cli::lora::adapters(&mf.spec, &rep.tensors)?;
                        save_tensors(path, &a)?;
                        let cfg = path.with_file_name("adapter_config.json");
                        fsutil::write_atomic(
                            &cfg,
                            frugal_cli::lora::adapter_config(l.rank, l.alpha, &l.targets)
                                .as_bytes(),
                        )?;
                        println!("adapters: {} (+ {})", path.display(), cfg.display());
                    }
                    frugal_cli::lora::merge(&mf.spec, &rep.tensors)?
                }
                None => rep.tensors.clone(),
            };
            save_tensors(&save, &tensors)?;
            println!(
                "checkpoint: {}{}",
                save.display(),
                if mf.lora.is_some() {
                    " (adapters merged into the base weights)"
                } else {
                    ""
                }
            );
            if let Some(p) = plot {
                fsutil::write_atomic(&p, curves_svg(&rep.epochs).as_bytes())?;
                println!("curves: {}", p.display());
            }
            println!(
                "arena used: {} of budget {}{}",
                human_bytes(rep.arena_bytes),
                budget.map_or("unlimited".into(), human_bytes),
                match (frozen, rep.image_bytes) {
                    (Some(e), b) if b > 0 => format!(
                        "; frozen parameters: {} image ({}) outside it, {} in all",
                        human_bytes(b),
                        train::frozen_name(e),
                        human_bytes(rep.arena_bytes + b)
                    ),
                    _ => String::new(),
                }
            );
        }
        Cmd::Plan {
            model,
            batch,
            budgets,
            policy,
            svg,
            timeline,
            program,
            profile,
            save_table,
        } => {
            let mf = load_model(&model)?;
            if budgets.is_empty() {
                let plan = Plan::new(Graph::new(&mf.spec, batch)?);
                print!("{}", report::tensor_table(&plan));
                if program {
                    println!("program: {}", report::program_listing(&plan));
                }
                println!("{}", report::summary(&plan, None));
                if let Some(p) = svg {
                    let title = format!(
                        "{} — batch {batch}, arena {}",
                        model.display(),
                        human_bytes(plan.arena_bytes)
                    );
                    fsutil::write_atomic(
                        &p,
                        arena_svg(
                            &report::arena_rects(&plan),
                            plan.arena_bytes,
                            plan.n_eo(),
                            &title,
                        )
                        .as_bytes(),
                    )?;
                    println!("arena picture: {}", p.display());
                }
                if let Some(p) = timeline {
                    let panel = report::timeline_panel(&plan, None, "plain plan".into());
                    fsutil::write_atomic(&p, timeline_svg(&[panel]).as_bytes())?;
                    println!("memory timeline: {}", p.display());
                }
                return Ok(());
            }
            plan_table(
                &mf.spec,
                &model,
                batch,
                &budgets,
                policy,
                profile,
                svg.as_deref(),
                timeline.as_deref(),
                program,
                save_table.as_deref(),
            )?;
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn plan_table(
    spec: &frugal_core::model::ModelSpec,
    model: &Path,
    batch: usize,
    budgets: &[usize],
    policy: PolicyKind,
    profile: bool,
    svg: Option<&Path>,
    timeline: Option<&Path>,
    program: bool,
    save_table: Option<&Path>,
) -> Res {
    let cost = cost_model(spec, batch, profile)?;
    let plain = Plan::new(Graph::new(spec, batch)?);
    println!(
        "{} at batch {batch}: unconstrained arena {} ({} B)",
        model.display(),
        human_bytes(plain.arena_bytes),
        plain.arena_bytes
    );
    println!("| budget | feasible | policy | micro-batch | recomputes | extra MFLOP | arena | predicted ms/step | measured ms/step |");
    println!("|---|---|---|---|---:|---:|---|---:|---:|");
    let mut panels: Vec<TimelinePanel> = Vec::new();
    let mut table = frugal_core::format::PlanTable {
        entries: Vec::new(),
    };
    for &b in budgets {
        match policy::plan_for_budget(spec, batch, Budget::new(b), policy, &cost) {
            Ok(c) => {
                let measured = measure::step_ms(&c.plan, batch, 3)?;
                println!(
                    "| {} | yes | {} | {} × {} | {} | {:.2} | {} | {:.2} | {:.2} |",
                    human_bytes(b),
                    c.policy.name(),
                    c.plan.graph.batch,
                    c.plan.micro_batches,
                    c.recomputes,
                    c.extra_flops as f64 / 1e6,
                    human_bytes(c.plan.arena_bytes),
                    c.predicted_ms,
                    measured
                );
                if program {
                    println!("  program: {}", report::program_listing(&c.plan));
                }
                if let Some(p) = svg {
                    let path = suffixed(p, &human_bytes(b).replace(' ', ""));
                    let title = format!(
                        "{} — batch {batch}, budget {}, {} plan, arena {}",
                        model.display(),
                        human_bytes(b),
                        c.policy.name(),
                        human_bytes(c.plan.arena_bytes)
                    );
                    fsutil::write_atomic(
                        &path,
                        arena_svg(
                            &report::arena_rects(&c.plan),
                            c.plan.arena_bytes,
                            c.plan.n_eo(),
                            &title,
                        )
                        .as_bytes(),
                    )?;
                }
                table.entries.push(frugal_core::format::PlanEntry {
                    budget: b,
                    plan: c.plan.clone(),
                });
                panels.push(report::timeline_panel(
                    &c.plan,
                    Some(b),
                    format!(
                        "budget {} — {} ({} recomputes, micro-batch {})",
                        human_bytes(b),
                        c.policy.name(),
                        c.recomputes,
                        c.plan.graph.batch
                    ),
                ));
            }
            Err(e) => println!("| {} | no: {e} | | | | | | | |", human_bytes(b)),
        }
    }
    if let Some(p) = svg {
        println!("arena pictures: {}", suffixed(p, "<budget>").display());
    }
    if let Some(p) = save_table {
        table.entries.sort_by_key(|e| e.budget);
        fsutil::write_atomic(p, &frugal_core::format::encode_plan_table(spec, &table))?;
        println!(
            "plan table ({} plans): {}",
            table.entries.len(),
            p.display()
        );
    }
    if let Some(p) = timeline {
        fsutil::write_atomic(p, timeline_svg(&panels).as_bytes())?;
        println!("memory timeline: {}", p.display());
    }
    Ok(())
}

fn suffixed(p: &Path, tag: &str) -> PathBuf {
    let stem = p
        .file_stem()
        .map_or_else(|| "plan".into(), |s| s.to_string_lossy().into_owned());
    let ext = p
        .extension()
        .map_or_else(|| "svg".into(), |s| s.to_string_lossy().into_owned());
    p.with_file_name(format!("{stem}-{tag}.{ext}"))
}

fn default_checkpoint(model: &Path) -> PathBuf {
    let stem = model
        .file_stem()
        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    PathBuf::from("checkpoints").join(format!("{stem}.safetensors"))
}

/// `frugal train --precision int8|int8-master`: the int8 plan, per-epoch rescale counters, the
/// held-out accuracy and a dequantised checkpoint.
#[allow(clippy::type_complexity)]
fn train_int8_cli(
    mf: &frugal_cli::spec_toml::ModelFile,
    model: &Path,
    (train_set, test_set): (&frugal_cli::data::Dataset, &frugal_cli::data::Dataset),
    (batch, epochs, seed, budget): (usize, u32, u64, Budget),
    precision: frugal_core::model::Precision,
    (every_step, batch_split): (bool, bool),
    (save, plot, weights): (Option<PathBuf>, Option<PathBuf>, Option<PathBuf>),
) -> Res {
    use frugal_core::quant::Rescale;
    let plan = Plan::new(frugal_core::graph::Graph::with_precision(
        &mf.spec, batch, precision,
    )?);
    let f32_plan = Plan::new(Graph::new(&mf.spec, batch)?);
    println!(
        "precision {precision:?}: int8 arena {} (lower bound {}), f32 arena {} — ratio {:.3}",
        human_bytes(plan.arena_bytes),
        human_bytes(plan.lower_bound),
        human_bytes(f32_plan.arena_bytes),
        plan.arena_bytes as f64 / f32_plan.arena_bytes.max(1) as f64
    );
    let opts = TrainOptions {
        batch,
        epochs,
        budget,
        seed,
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        quiet: false,
        policy: PolicyKind::Plain,
        approx: Approximations::default(),
        threads: 1,
        device: Default::default(),
        frozen: None,
    };
    let rescale = if every_step {
        Rescale::EveryStep
    } else {
        Rescale::Adaptive
    };
    let w = weights.or(mf.train.weights.clone());
    let rep = train::train_int8_with(
        mf,
        train_set,
        test_set,
        &opts,
        precision,
        rescale,
        w.as_ref(),
        batch_split.then_some(train::SPLIT_THRESHOLD),
        |p, c| println!("  epoch {}: {c}", p.epoch),
    )?;
    if batch_split {
        println!(
            "batch splitting (whole batch vs best chunk, same FLOPs; split above {:.2}×):",
            train::SPLIT_THRESHOLD
        );
        for (name, full, chunk, best) in &rep.split {
            let verdict = if *chunk < batch {
                format!("split into chunks of {chunk}")
            } else {
                "kept whole".to_string()
            };
            println!(
                "  {name}: {:.1} µs whole, {:.1} µs in chunks — {verdict}",
                *full as f64 / 1e3,
                *best as f64 / 1e3
            );
        }
    }
    println!("{}", rep.counts);
    let r = &rep.report;
    let correct = (r.test_accuracy * r.test_samples as f32).round() as usize;
    println!(
        "held-out accuracy: {:.2}% ({correct}/{})",
        r.test_accuracy * 100.0,
        r.test_samples
    );
    let save = save.unwrap_or_else(|| suffixed(&default_checkpoint(model), "int8"));
    if let Some(dir) = save.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let named: Vec<(&str, &[usize], &[f32])> = r
        .tensors
        .iter()
        .map(|(n, s, v)| (n.as_str(), s.as_slice(), v.as_slice()))
        .collect();
    checkpoint::save_safetensors(&save, &named, None)?;
    println!("checkpoint (dequantised f32): {}", save.display());
    if let Some(p) = plot {
        fsutil::write_atomic(&p, curves_svg(&r.epochs).as_bytes())?;
        println!("curves: {}", p.display());
    }
    println!("arena used: {}", human_bytes(r.arena_bytes));
    Ok(())
}

fn parse_device(s: &str) -> Result<train::Device, String> {
    match s {
        "cpu" => Ok(train::Device::Cpu),
        "gpu" => Ok(train::Device::Gpu),
        "auto" => Ok(train::Device::Auto),
        _ => Err(format!("unknown device {s:?}: cpu, gpu or auto")),
    }
}
