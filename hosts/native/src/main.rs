//! `frugal`: train a model inside a memory budget, or show the plan of its arena.
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use frugal_cli::report;
use frugal_cli::spec_toml::{load_model, DatasetSource};
use frugal_cli::svg::{arena_svg, curves_svg, human_bytes};
use frugal_cli::train::{self, parse_size, TrainOptions};
use frugal_cli::{checkpoint, fsutil};
use frugal_core::budget::Budget;
use frugal_core::graph::Graph;
use frugal_core::plan::Plan;

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

#[derive(Subcommand)]
enum Cmd {
    /// Train a model (TOML) on its data set under a memory budget.
    Train {
        /// Model description (see docs/model-format.md).
        model: PathBuf,
        /// Arena budget, e.g. 2MiB, 600KiB (default: unlimited).
        #[arg(long, value_parser = parse_size)]
        budget: Option<usize>,
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
    },
    /// Print the plan of one training step: every tensor, its lifetime and offset; optionally draw it.
    Plan {
        /// Model description.
        model: PathBuf,
        /// Samples per step.
        #[arg(long, default_value_t = 32)]
        batch: usize,
        /// Draw the arena (execution order × address) as SVG.
        #[arg(long)]
        svg: Option<PathBuf>,
        /// Also list the program (instructions in execution order).
        #[arg(long)]
        program: bool,
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

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.cmd {
        Cmd::Train {
            model,
            budget,
            batch,
            epochs,
            seed,
            save,
            plot,
            weights,
        } => {
            let mf = load_model(&model)?;
            let batch = batch.or(mf.train.batch.map(|b| b as usize)).unwrap_or(32);
            let epochs = epochs.or(mf.train.epochs).unwrap_or(10);
            let source = mf.train.dataset.clone().unwrap_or(DatasetSource::Digits);
            let (train_set, test_set) = train::load_data(&source)?;
            let budget_v = budget.map(Budget::new).unwrap_or(Budget::UNLIMITED);
            let plan = Plan::new(Graph::new(&mf.spec, batch)?);
            println!(
                "model {}: {} layers, {} train / {} test samples",
                model.display(),
                mf.spec.layers.len(),
                train_set.len(),
                test_set.len()
            );
            println!("{}", report::summary(&plan, budget));
            plan.check_budget(budget_v)?;
            let opts = TrainOptions {
                batch,
                epochs,
                budget: budget_v,
                seed,
                progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
                quiet: false,
            };
            let w = weights.or(mf.train.weights.clone());
            let rep = train::train(&mf, &train_set, &test_set, &opts, w.as_ref())?;
            let correct = (rep.test_accuracy * rep.test_samples as f32).round() as usize;
            println!(
                "held-out accuracy: {:.2}% ({correct}/{})",
                rep.test_accuracy * 100.0,
                rep.test_samples
            );
            let save = save.unwrap_or_else(|| default_checkpoint(&model));
            if let Some(dir) = save.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            let named: Vec<(&str, &[usize], &[f32])> = rep
                .tensors
                .iter()
                .map(|(n, s, v)| (n.as_str(), s.as_slice(), v.as_slice()))
                .collect();
            checkpoint::save_safetensors(&save, &named, None)?;
            println!("checkpoint: {}", save.display());
            if let Some(p) = plot {
                fsutil::write_atomic(&p, curves_svg(&rep.epochs).as_bytes())?;
                println!("curves: {}", p.display());
            }
            println!(
                "arena used: {} of budget {}",
                human_bytes(rep.arena_bytes),
                budget.map_or("unlimited".into(), human_bytes)
            );
        }
        Cmd::Plan {
            model,
            batch,
            svg,
            program,
        } => {
            let mf = load_model(&model)?;
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
        }
    }
    Ok(())
}

fn default_checkpoint(model: &Path) -> PathBuf {
    let stem = model
        .file_stem()
        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    PathBuf::from("checkpoints").join(format!("{stem}.safetensors"))
}
