//! The training driver behind `frugal train`: data in, plan within the budget, epochs with progress,
//! held-out evaluation, checkpoint out. The core does the work; this only moves bytes.
use std::fmt;
use std::path::{Path, PathBuf};

use frugal_core::backend::{Backend, CpuBackend};
use frugal_core::budget::{Budget, BudgetError};
use frugal_core::exec::int8::Int8Executor;
use frugal_core::exec::{ExecError, Executor, Target};
use frugal_core::graph::{Graph, GraphError};
use frugal_core::model::{Int8Update, Precision};
use frugal_core::plan::params::{self, ParamEncoding, ParamsError};
use frugal_core::plan::Plan;
use frugal_core::policy::{self, Approximations, Chosen, CostModel, PlanError, PolicyKind};
use frugal_core::pool::ThreadPool;
use frugal_core::quant::{Rescale, RescaleCounts};

use crate::checkpoint::{self, CheckpointError};
use crate::data::{self, DataError, Dataset};
use crate::devmem::{alloc_zeroed, MemoryError};
use crate::progress::EpochBar;
use crate::spec_toml::{DatasetSource, ModelFile};
use crate::svg::EpochPoint;

/// Options of one training run (CLI flags override the model file's `[train]`).
#[derive(Clone, Debug)]
pub struct TrainOptions {
    /// Samples per step.
    pub batch: usize,
    /// Passes over the training set.
    pub epochs: u32,
    /// Arena budget.
    pub budget: Budget,
    /// Seed for shuffling (weights use the model's seed).
    pub seed: u64,
    /// Show progress bars (else one line per epoch).
    pub progress: bool,
    /// Print nothing.
    pub quiet: bool,
    /// Memory policy when the plain plan does not fit.
    pub policy: PolicyKind,
    /// Opt-in approximations (ghost batch norm).
    pub approx: Approximations,
    /// CPU threads for the f32 backend (1 = the calling thread only; results are identical for any count).
    pub threads: usize,
    /// Where the f32 steps run.
    pub device: Device,
    /// Frozen parameters (LoRA's base, the frozen layers of a sparse update) read from a parameter
    /// image in this encoding, outside the arena (None: in the arena, f32). CPU only.
    pub frozen: Option<ParamEncoding>,
}

/// Where f32 training runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// frugal's CPU backend (over `threads` threads).
    #[default]
    Cpu,
    /// The GPU backend (wgpu: Vulkan, Metal, DX12; Mesa's lavapipe without a GPU). Needs the `gpu`
    /// feature; the budget then bounds the plan's GPU memory.
    Gpu,
    /// Each layer on the CPU or the GPU by measured cost (`frugal_wgpu::auto`: per-layer times on both
    /// and the host-GPU link measured first, placed by the DP of `policy::placement`), in one mixed
    /// plan. Needs the `gpu` feature; the budget bounds the host arena and the GPU memory each.
    Auto,
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct TrainReport {
    /// Per-epoch curves.
    pub epochs: Vec<EpochPoint>,
    /// Final held-out accuracy in [0, 1].
    pub test_accuracy: f32,
    /// Held-out samples.
    pub test_samples: usize,
    /// Held-out mean loss before the first update (after loading weights) and after training: for a
    /// text data set, `exp` of each is the held-out perplexity.
    pub test_loss: (f32, f32),
    /// Arena size of the plan.
    pub arena_bytes: usize,
    /// Bytes of the frozen parameters' image outside the arena (0 without `--frozen`).
    pub image_bytes: usize,
    /// Lower bound of the plan.
    pub lower_bound: usize,
    /// The trained persistent tensors (name, shape, values), ready to save.
    pub tensors: Vec<(String, Vec<usize>, Vec<f32>)>,
    /// The policy of the plan used.
    pub policy: PolicyKind,
    /// Its micro-batch size.
    pub micro_batch: usize,
    /// Recompute instructions per step.
    pub recomputes: usize,
    /// Training steps taken and the seconds they took (the steps alone: no evaluation, no loading;
    /// (0, 0) from an int8 run).
    pub steps: (u64, f64),
}

/// Why a run failed.
#[derive(Debug)]
pub enum TrainError {
    /// Data could not be loaded.
    Data(DataError),
    /// The model does not realise.
    Graph(GraphError),
    /// The plan does not fit the budget.
    Budget(BudgetError),
    /// A step failed.
    Exec(ExecError),
    /// Weights could not be loaded or saved.
    Checkpoint(CheckpointError),
    /// The data does not fit the model.
    Mismatch(String),
    /// The system refused the memory the plan needs.
    Memory(MemoryError),
    /// The frozen parameters cannot be read from an image.
    Params(ParamsError),
}

impl fmt::Display for TrainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrainError::Data(e) => write!(f, "{e}"),
            TrainError::Graph(e) => write!(f, "model: {e}"),
            TrainError::Budget(e) => write!(f, "{e}"),
            TrainError::Exec(e) => write!(f, "training step: {e}"),
            TrainError::Checkpoint(e) => write!(f, "{e}"),
            TrainError::Mismatch(e) => write!(f, "{e}"),
            TrainError::Memory(e) => write!(f, "{e}"),
            TrainError::Params(e) => write!(f, "--frozen: {e}"),
        }
    }
}

impl std::error::Error for TrainError {}

macro_rules! from {
    ($v:ident, $t:ty) => {
        impl From<$t> for TrainError {
            fn from(e: $t) -> Self {
                TrainError::$v(e)
            }
        }
    };
}
from!(Data, DataError);
from!(Graph, GraphError);
from!(Budget, BudgetError);
from!(Exec, ExecError);
from!(Checkpoint, CheckpointError);
from!(Memory, MemoryError);
from!(Params, ParamsError);

impl From<PlanError> for TrainError {
    fn from(e: PlanError) -> Self {
        match e {
            PlanError::Graph(g) => TrainError::Graph(g),
            PlanError::Budget(b) => TrainError::Budget(b),
        }
    }
}

/// Splits a data set deterministically: sample i is held out iff `i % 5 == 0` (the digits' rule).
pub fn split(ds: Dataset) -> Result<(Dataset, Dataset), DataError> {
    let per = ds.dims.numel();
    let (mut tx, mut ty, mut vx, mut vy) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..ds.len() {
        let (x, y) = ds.sample(i);
        if i % 5 == 0 {
            vx.extend_from_slice(x);
            vy.push(y);
        } else {
            tx.extend_from_slice(x);
            ty.push(y);
        }
    }
    debug_assert_eq!(tx.len(), ty.len() * per);
    Ok((
        Dataset::new(ds.dims, ds.classes, tx, ty, "train split")?,
        Dataset::new(ds.dims, ds.classes, vx, vy, "test split")?,
    ))
}

/// Loads the model file's data set as (train, test).
/// `seq` is the model's input length (a text data set's window).
pub fn load_data(src: &DatasetSource, seq: usize) -> Result<(Dataset, Dataset), DataError> {
    match src {
        DatasetSource::Digits => Ok(data::digits()),
        DatasetSource::Idx { images, labels } => split(data::load_idx(images, labels, 255.0)?),
        DatasetSource::Csv { path, label_column } => {
            split(data::load_csv(path, *label_column, None)?)
        }
        DatasetSource::Text { path } => crate::text::load(path, seq),
    }
}

/// Plans `model` for steps of `batch` samples within `budget`: the plain plan when it fits, else the
/// fastest plan `policy` finds (a typed error names the smallest budget that works).
pub fn plan_for(
    model: &ModelFile,
    batch: usize,
    budget: Budget,
    policy: PolicyKind,
    cost: Option<&CostModel>,
    approx: Approximations,
) -> Result<Chosen, TrainError> {
    let g = Graph::new(&model.spec, batch)?;
    let estimate;
    let cost = match cost {
        Some(c) => c,
        None => {
            estimate = CostModel::estimate(&g);
            &estimate
        }
    };
    Ok(policy::plan_for_budget_with(
        &model.spec,
        batch,
        budget,
        policy,
        cost,
        approx,
    )?)
}

/// Parses `--frozen`: `f32`, `fp16` (or `f16`) or `int8`.
pub fn parse_frozen(s: &str) -> Result<ParamEncoding, String> {
    match s {
        "f32" => Ok(ParamEncoding::F32),
        "fp16" | "f16" => Ok(ParamEncoding::F16),
        "int8" => Ok(ParamEncoding::Int8),
        _ => Err(format!(
            "unknown encoding {s:?} of the frozen weights (f32, fp16, int8)"
        )),
    }
}

/// The name `--frozen` takes for an encoding.
pub fn frozen_name(e: ParamEncoding) -> &'static str {
    match e {
        ParamEncoding::F32 => "f32",
        ParamEncoding::F16 => "fp16",
        ParamEncoding::Int8 => "int8",
    }
}

/// The plan of a run: [`plan_for`] within the budget, and with `opts.frozen` its frozen parameters
/// moved out of the arena into a parameter image of that encoding ([`Plan::read_only_params`]). The
/// budget bounds the arena alone: the policies first plan for the budget plus the frozen f32 bytes
/// (what leaves the arena), and when the smaller arena still does not fit, for the budget itself.
pub fn plan_run(
    model: &ModelFile,
    opts: &TrainOptions,
    cost: Option<&CostModel>,
) -> Result<Chosen, TrainError> {
    let plan = |b: Budget| plan_for(model, opts.batch, b, opts.policy, cost, opts.approx);
    let Some(enc) = opts.frozen else {
        return plan(opts.budget);
    };
    if opts.device != Device::Cpu {
        return Err(TrainError::Mismatch(
            "--frozen reads the frozen weights on the CPU backend (--device cpu)".into(),
        ));
    }
    let g = Graph::new(&model.spec, opts.batch)?;
    let frozen: usize = params::read_only_tensors(&g)
        .map(|t| g.tensors[t as usize].bytes)
        .sum();
    if frozen == 0 {
        return Err(TrainError::Params(ParamsError::Unsupported(
            "the model trains every parameter (nothing is frozen)",
        )));
    }
    let mut needed = usize::MAX;
    for b in [opts.budget.bytes.saturating_add(frozen), opts.budget.bytes] {
        let mut c = match plan(Budget::new(b)) {
            Ok(c) => c,
            Err(TrainError::Budget(BudgetError::TooSmall { needed: n, .. })) => {
                needed = needed.min(n.saturating_sub(frozen));
                continue;
            }
            Err(e) => return Err(e),
        };
        c.plan.read_only_params(enc)?;
        if c.plan.needed_bytes() <= opts.budget.bytes {
            return Ok(c);
        }
        needed = needed.min(c.plan.needed_bytes());
    }
    Err(TrainError::Budget(BudgetError::TooSmall {
        needed,
        given: opts.budget.bytes,
    }))
}

/// The parameter image of `plan` (aligned as [`Executor::with_params`] needs: the slice `at..at+len`
/// of the buffer): the frozen tensors from `weights`, in the plan's encoding. Every frozen tensor must
/// be there (frozen random weights teach nothing).
fn frozen_image(
    plan: &Plan,
    weights: Option<&PathBuf>,
) -> Result<(Vec<u8>, std::ops::Range<usize>), TrainError> {
    let path = weights.ok_or_else(|| {
        TrainError::Mismatch("--frozen needs --weights holding the frozen tensors".into())
    })?;
    let tensors = checkpoint::load_safetensors(path)?;
    let g = &plan.graph;
    let mut state = Vec::new();
    for n in &g.nodes {
        let named = n.params.iter().map(|p| (p.name.as_str(), p.value)).chain(
            n.stats
                .iter()
                .map(|&s| (g.tensors[s as usize].name.as_str(), s)),
        );
        for (name, t) in named {
            let elems = g.tensors[t as usize].bytes / 4;
            if !plan.in_params_space(t) {
                // In the arena: loaded there after initialisation ([`load_weights`]).
                state.resize(state.len() + elems * 4, 0);
                continue;
            }
            let v = match tensors.iter().find(|(n, _, _)| n == name) {
                Some((_, _, v)) if v.len() == elems => v,
                Some((_, s, _)) => {
                    return Err(TrainError::Mismatch(format!(
                        "{}: tensor {name} has shape {s:?}, the model needs {elems} values",
                        path.display()
                    )))
                }
                None => {
                    return Err(TrainError::Mismatch(format!(
                        "--frozen: {name} is frozen but {} does not hold it",
                        path.display()
                    )))
                }
            };
            state.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        }
    }
    drop(tensors);
    let (image, _) = params::split_state(plan, &state)?;
    drop(state);
    // The same bytes at a 64-byte aligned address (f32 values are read in place).
    let mut buf = vec![0u8; image.len() + 64];
    let at = buf.as_ptr().align_offset(64);
    buf[at..at + image.len()].copy_from_slice(&image);
    Ok((buf, at..at + image.len()))
}

/// Loads named tensors into the executor's persistent tensors; returns how many were loaded.
pub fn load_weights<B: Backend>(
    ex: &mut Executor<'_, B>,
    arena: &mut [u8],
    path: &Path,
) -> Result<usize, TrainError> {
    let tensors = checkpoint::load_safetensors(path)?;
    let state: Vec<_> = ex.state_tensors().collect();
    let mut loaded = 0;
    for (name, shape, t) in state {
        if ex.plan().in_params_space(t) {
            // In the parameter image, made from the same file ([`plan_run`]).
            loaded += usize::from(tensors.iter().any(|(n, _, _)| *n == name));
            continue;
        }
        if let Some((_, s, v)) = tensors.iter().find(|(n, _, _)| *n == name) {
            if *s != shape {
                return Err(TrainError::Mismatch(format!(
                    "{}: tensor {name} has shape {s:?}, the model needs {shape:?}",
                    path.display()
                )));
            }
            ex.write(arena, t, v)?;
            loaded += 1;
        }
    }
    Ok(loaded)
}

/// Fraction correct on `ds`, evaluated in batches of the plan's size.
pub fn evaluate<B: Backend>(
    ex: &mut Executor<'_, B>,
    arena: &mut [u8],
    ds: &Dataset,
) -> Result<(f32, f32), TrainError> {
    let batch = ex.plan().graph.batch;
    let per = ds.dims.numel();
    let (mut correct, mut loss) = (0usize, 0f64);
    let mut i = 0;
    while i < ds.len() {
        let n = batch.min(ds.len() - i);
        let s = ex.evaluate(
            arena,
            &ds.x[i * per..(i + n) * per],
            Target::Classes(ds.labels(i, n)),
        )?;
        correct += s.correct;
        loss += s.loss as f64 * n as f64;
        i += n;
    }
    // A text data set counts a prediction per token.
    Ok((
        correct as f32 / (ds.len() * ds.tokens).max(1) as f32,
        (loss / ds.len().max(1) as f64) as f32,
    ))
}

/// Trains `model` on (train, test) with `opts`; `weights` are loaded first if given.
pub fn train(
    model: &ModelFile,
    train: &Dataset,
    test: &Dataset,
    opts: &TrainOptions,
    weights: Option<&PathBuf>,
) -> Result<TrainReport, TrainError> {
    let spec = &model.spec;
    if train.dims.numel() != spec.input.numel() {
        return Err(TrainError::Mismatch(format!(
            "the data has samples of {} but the model's input is {}",
            train.dims, spec.input
        )));
    }
    let chosen = plan_run(model, opts, None)?;
    let how = (chosen.policy, chosen.recomputes);
    let plan = chosen.plan;
    let outputs = plan.graph.pred_dims().numel();
    if train.classes as usize > outputs {
        return Err(TrainError::Mismatch(format!(
            "the data has {} classes but the model outputs {outputs}",
            train.classes
        )));
    }
    match opts.device {
        Device::Cpu => {
            let (image, at) = match plan.params_space() {
                Some(_) => frozen_image(&plan, weights)?,
                None => (Vec::new(), 0..0),
            };
            let mut arena = alloc_zeroed::<u8>(plan.needed_bytes(), "the arena")?;
            let pool = ThreadPool::new(opts.threads).map_err(|e| {
                TrainError::Mismatch(format!("cannot start {} CPU threads: {e}", opts.threads))
            })?;
            let backend = CpuBackend::with_pool(&pool);
            let ex = Executor::with_params(&plan, &arena, backend, &image[at])?;
            run(ex, &mut arena, how, model, (train, test), opts, weights)
        }
        Device::Gpu => train_gpu(plan, how, model, (train, test), opts, weights),
        Device::Auto => train_auto(plan, how, model, (train, test), opts, weights),
    }
}

#[cfg(feature = "gpu")]
fn train_auto(
    plan: Plan,
    how: (PolicyKind, usize),
    model: &ModelFile,
    data: (&Dataset, &Dataset),
    opts: &TrainOptions,
    weights: Option<&PathBuf>,
) -> Result<TrainReport, TrainError> {
    use frugal_core::backend::Placement;
    use frugal_wgpu::{GpuBackend, MixedBackend, GPU_SPACE};
    let backend = GpuBackend::open().map_err(|e| TrainError::Mismatch(e.to_string()))?;
    // Measure on the first planned batch of the training data.
    let (train, _) = data;
    let n = plan.batch().min(train.len()).max(1);
    let per = model.spec.input.numel();
    let idx: Vec<usize> = (0..n).collect();
    let mut x = alloc_zeroed::<f32>(n * per, "the batch buffer")?;
    let mut y = alloc_zeroed::<u32>(n * train.tokens, "the label buffer")?;
    train.batch(&idx, &mut x, &mut y);
    // The CPU side runs on `threads` workers: measured so, trained so.
    let pool = ThreadPool::new(opts.threads).map_err(|e| {
        TrainError::Mismatch(format!("cannot start {} CPU threads: {e}", opts.threads))
    })?;
    let cpu = CpuBackend::with_pool(&pool);
    let (auto, backend) =
        frugal_wgpu::auto::auto_plan(&plan, &cpu, backend, &x, Target::Classes(&y), 3)?;
    let mixed = auto.plan.clone();
    // The budget bounds each space on its own: the host arena, the GPU memory.
    for needed in [mixed.needed_bytes(), mixed.space_bytes(GPU_SPACE)] {
        if needed > opts.budget.bytes {
            return Err(TrainError::Budget(BudgetError::TooSmall {
                needed,
                given: opts.budget.bytes,
            }));
        }
    }
    if !opts.quiet {
        let l = auto.measured.link;
        println!(
            "auto placement on {} — link: host→GPU {:.1} µs + {:.2} GB/s, GPU→host {:.1} µs + {:.2} GB/s",
            backend.gpu().adapter(),
            l.up_latency * 1e6,
            l.up_bandwidth / 1e9,
            l.down_latency * 1e6,
            l.down_bandwidth / 1e9
        );
        for (i, node) in mixed.graph.nodes.iter().enumerate() {
            let [c, g] = auto.measured.node[i];
            let on = match auto.devices[i] {
                Placement::Gpu => "gpu",
                _ => "cpu",
            };
            println!(
                "  {:<16} {on}   (cpu {:.3} ms, gpu {:.3} ms per step)",
                node.name,
                c * 1e3,
                g * 1e3
            );
        }
        let moves = frugal_core::policy::spaces::move_volume(&mixed);
        println!(
            "predicted {:.3} ms/step (all-CPU {:.3}); {} moves, {} bytes per step; host arena {} bytes, GPU {} bytes",
            auto.predicted * 1e3,
            auto.all_cpu * 1e3,
            moves.0,
            moves.1,
            mixed.arena_bytes,
            mixed.space_bytes(GPU_SPACE)
        );
    }
    if auto.devices.iter().all(|&d| d == Placement::Cpu) {
        // Nothing on the GPU: the CPU backend alone (no GPU submission per step), on `threads`.
        if !opts.quiet {
            println!(
                "every layer on the CPU: the CPU backend, {} thread(s)",
                opts.threads
            );
        }
        drop(backend);
        let mut arena = alloc_zeroed::<u8>(plan.needed_bytes(), "the arena")?;
        let ex = Executor::with_backend(&plan, &arena, cpu)?;
        return run(ex, &mut arena, how, model, data, opts, weights);
    }
    let mut arena = alloc_zeroed::<u8>(mixed.needed_bytes(), "the arena")?;
    let ex = Executor::with_backend(&mixed, &arena, MixedBackend::with_cpu(cpu, backend))?;
    run(ex, &mut arena, how, model, data, opts, weights)
}

/// `--device DEVICE` asked of a frugal built without the GPU backend.
#[cfg(not(feature = "gpu"))]
fn no_gpu(device: &str) -> TrainError {
    TrainError::Mismatch(format!(
        "this frugal was built without the GPU backend: build it with `--features gpu` \
         (cargo run --release -p frugal-cli --features gpu -- train … --device {device})"
    ))
}

#[cfg(not(feature = "gpu"))]
fn train_auto(
    _: Plan,
    _: (PolicyKind, usize),
    _: &ModelFile,
    _: (&Dataset, &Dataset),
    _: &TrainOptions,
    _: Option<&PathBuf>,
) -> Result<TrainReport, TrainError> {
    Err(no_gpu("auto"))
}

#[cfg(feature = "gpu")]
fn train_gpu(
    plan: Plan,
    how: (PolicyKind, usize),
    model: &ModelFile,
    data: (&Dataset, &Dataset),
    opts: &TrainOptions,
    weights: Option<&PathBuf>,
) -> Result<TrainReport, TrainError> {
    use frugal_wgpu::{gpu_plan, GpuBackend, GPU_SPACE};
    let plan = gpu_plan(plan);
    // The budget bounds the GPU memory the plan lays out (its tensors at 256-byte alignment).
    let needed = plan.space_bytes(GPU_SPACE);
    if needed > opts.budget.bytes {
        return Err(TrainError::Budget(BudgetError::TooSmall {
            needed,
            given: opts.budget.bytes,
        }));
    }
    let backend = GpuBackend::open().map_err(|e| TrainError::Mismatch(e.to_string()))?;
    if !opts.quiet {
        println!(
            "gpu: {} — the plan's GPU memory {} bytes",
            backend.gpu().adapter(),
            needed
        );
    }
    let mut arena = alloc_zeroed::<u8>(plan.needed_bytes(), "the arena")?;
    let ex = Executor::with_backend(&plan, &arena, backend)?;
    run(ex, &mut arena, how, model, data, opts, weights)
}

#[cfg(not(feature = "gpu"))]
fn train_gpu(
    _: Plan,
    _: (PolicyKind, usize),
    _: &ModelFile,
    _: (&Dataset, &Dataset),
    _: &TrainOptions,
    _: Option<&PathBuf>,
) -> Result<TrainReport, TrainError> {
    Err(no_gpu("gpu"))
}

/// The training loop on any backend.
fn run<B: Backend>(
    mut ex: Executor<'_, B>,
    arena: &mut [u8],
    (policy, recomputes): (PolicyKind, usize),
    model: &ModelFile,
    (train, test): (&Dataset, &Dataset),
    opts: &TrainOptions,
    weights: Option<&PathBuf>,
) -> Result<TrainReport, TrainError> {
    let spec = &model.spec;
    let plan = ex.plan();
    ex.init_params(arena, spec.seed)?;
    if let Some(w) = weights {
        let n = load_weights(&mut ex, arena, w)?;
        if !opts.quiet {
            println!("loaded {n} tensors from {}", w.display());
        }
    }
    let (_, loss_before) = evaluate(&mut ex, arena, test)?;
    let per = spec.input.numel();
    let rows = opts.batch.max(plan.batch());
    let mut xbuf = alloc_zeroed::<f32>(rows.saturating_mul(per), "the batch buffer")?;
    let mut ybuf = alloc_zeroed::<u32>(rows * train.tokens, "the label buffer")?;
    let steps = train.len().div_ceil(opts.batch) as u64;
    let mut curves = Vec::new();
    let (mut taken, mut secs) = (0u64, 0f64);
    for epoch in 0..opts.epochs {
        let order = train.shuffle_indices(opts.seed, epoch as u64);
        let bar = (!opts.quiet)
            .then(|| EpochBar::with_terminal(epoch + 1, opts.epochs, steps, opts.progress));
        let (mut loss_sum, mut correct, mut seen) = (0f64, 0usize, 0usize);
        for chunk in order.chunks(opts.batch) {
            let n = chunk.len();
            train.batch(chunk, &mut xbuf, &mut ybuf);
            let t0 = std::time::Instant::now();
            let s = ex.train_step(
                arena,
                &xbuf[..n * per],
                Target::Classes(&ybuf[..n * train.tokens]),
            )?;
            secs += t0.elapsed().as_secs_f64();
            taken += 1;
            loss_sum += s.loss as f64 * n as f64;
            correct += s.correct;
            seen += n;
            if let Some(b) = &bar {
                b.step(
                    (loss_sum / seen as f64) as f32,
                    correct as f32 / (seen * train.tokens) as f32,
                );
            }
        }
        let (test_acc, _) = evaluate(&mut ex, arena, test)?;
        let p = EpochPoint {
            epoch: epoch + 1,
            train_loss: (loss_sum / seen.max(1) as f64) as f32,
            train_acc: correct as f32 / (seen * train.tokens).max(1) as f32,
            test_acc: Some(test_acc),
        };
        if let Some(b) = bar {
            b.finish(p.train_loss, p.train_acc, p.test_acc);
        }
        curves.push(p);
    }
    let (test_accuracy, loss_after) = evaluate(&mut ex, arena, test)?;
    let mut tensors = Vec::new();
    for (name, shape, t) in ex.state_tensors().collect::<Vec<_>>() {
        // Read back from wherever it lives (the GPU's memory for a GPU plan).
        tensors.push((name, shape, ex.read_vec(arena, t)?));
    }
    Ok(TrainReport {
        epochs: curves,
        test_accuracy,
        test_samples: test.len(),
        test_loss: (loss_before, loss_after),
        // The memory the tensors need where they run (a GPU plan's host arena is empty); the
        // frozen parameters' image apart.
        arena_bytes: plan.arena_bytes.max(device_bytes(plan, |s| s.bytes)),
        lower_bound: plan.lower_bound.max(device_bytes(plan, |s| s.lower_bound)),
        image_bytes: plan
            .params_space()
            .map_or(0, |(_, b)| b + params::IMAGE_HEADER),
        tensors,
        policy,
        micro_batch: plan.graph.batch,
        recomputes,
        steps: (taken, secs),
    })
}

/// Bytes of the plan's memory spaces other than the parameter image, by `f`.
fn device_bytes(plan: &Plan, f: impl Fn(&frugal_core::plan::SpaceLayout) -> usize) -> usize {
    plan.spaces
        .iter()
        .filter(|s| ParamEncoding::of_space(s.space).is_none())
        .map(f)
        .sum()
}

/// Default bit width of the pure-integer update (best of 1–4 on the digits MLP and CNN: 4).
pub const DEFAULT_UPDATE_BITS: u8 = 4;

/// Parses `--precision`: `f32`, `int8` (pure integer, NITI update) or `int8-master` (int8 compute, f32
/// master weights and the model's optimizer). `update_bits` is the integer update's bit width.
pub fn parse_precision(s: &str, update_bits: u8) -> Result<Precision, String> {
    match s {
        "f32" => Ok(Precision::F32),
        "int8" | "int8-integer" => Ok(Precision::Int8(Int8Update::Integer { update_bits })),
        "int8-master" => Ok(Precision::Int8(Int8Update::FloatMaster)),
        _ => Err(format!(
            "unknown precision {s:?} (f32, int8 = pure integer, int8-master = f32 master weights)"
        )),
    }
}

/// What an int8 run produced besides the usual report.
#[derive(Clone, Debug)]
pub struct Int8Report {
    /// Accuracy, curves, arena, trained tensors (dequantised to f32).
    pub report: TrainReport,
    /// Rescale counters over the whole run.
    pub counts: RescaleCounts,
    /// Rescale counters per epoch.
    pub per_epoch: Vec<RescaleCounts>,
    /// Batch splitting (Mandheling §3.5), when profiled: per weight-gradient op, (layer name,
    /// whole-batch ns, chunk chosen (the batch when not split), that chunk size's ns for the same FLOPs).
    pub split: Vec<(String, u64, usize, u64)>,
}

/// Threshold of `--batch-split`: an op's weight gradient is split when the whole batch takes more than
/// this × its best chunked time for the same work (below ~10% the gain is within timing noise).
pub const SPLIT_THRESHOLD: f64 = 1.1;

/// Nanoseconds since the first call: the clock the int8 executor's profiling step reads.
fn clock_ns() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

/// Fraction correct on `ds` with an int8 executor.
pub fn evaluate_int8(
    ex: &mut Int8Executor<'_>,
    arena: &mut [u8],
    ds: &Dataset,
) -> Result<(f32, f32), TrainError> {
    let batch = ex.plan().graph.batch;
    let per = ds.dims.numel();
    let (mut correct, mut loss) = (0usize, 0f64);
    let mut i = 0;
    while i < ds.len() {
        let n = batch.min(ds.len() - i);
        let s = ex.evaluate(
            arena,
            &ds.x[i * per..(i + n) * per],
            Target::Classes(ds.labels(i, n)),
        )?;
        correct += s.correct;
        loss += s.loss as f64 * n as f64;
        i += n;
    }
    // A text data set counts a prediction per token.
    Ok((
        correct as f32 / (ds.len() * ds.tokens).max(1) as f32,
        (loss / ds.len().max(1) as f64) as f32,
    ))
}

/// Trains `model` in int8 (`precision` must be [`Precision::Int8`]) on the plain plan of its int8 graph
/// (tensors sized in int8 bytes); the budget is checked against it. `on_epoch` sees each epoch's point
/// and rescale counters.
#[allow(clippy::too_many_arguments)]
pub fn train_int8(
    model: &ModelFile,
    train: &Dataset,
    test: &Dataset,
    opts: &TrainOptions,
    precision: Precision,
    rescale: Rescale,
    weights: Option<&PathBuf>,
    on_epoch: impl FnMut(&EpochPoint, &RescaleCounts),
) -> Result<Int8Report, TrainError> {
    train_int8_with(
        model, train, test, opts, precision, rescale, weights, None, on_epoch,
    )
}

/// [`train_int8`] with batch splitting: with `split = Some(threshold)`, one profiling step on a copy of
/// the arena (the first batch; the real run is untouched) times every weight gradient on the whole batch
/// and in chunks, and splits the ops whose whole-batch time exceeds `threshold` × their best chunked
/// time. Split ops combine their chunks' int8 gradients by Mandheling's Eq. 4, so results then depend on
/// this machine's timings (not bit-exact across machines): opt-in.
#[allow(clippy::too_many_arguments)]
pub fn train_int8_with(
    model: &ModelFile,
    train: &Dataset,
    test: &Dataset,
    opts: &TrainOptions,
    precision: Precision,
    rescale: Rescale,
    weights: Option<&PathBuf>,
    split: Option<f64>,
    mut on_epoch: impl FnMut(&EpochPoint, &RescaleCounts),
) -> Result<Int8Report, TrainError> {
    let spec = &model.spec;
    if train.dims.numel() != spec.input.numel() {
        return Err(TrainError::Mismatch(format!(
            "the data has samples of {} but the model's input is {}",
            train.dims, spec.input
        )));
    }
    let plan = Plan::new(Graph::with_precision(spec, opts.batch, precision)?);
    plan.check_budget(opts.budget)?;
    let outputs = plan.graph.pred_dims().numel();
    if train.classes as usize > outputs {
        return Err(TrainError::Mismatch(format!(
            "the data has {} classes but the model outputs {outputs}",
            train.classes
        )));
    }
    let mut arena = alloc_zeroed::<u8>(plan.needed_bytes(), "the arena")?;
    let mut ex = Int8Executor::new(&plan, &arena)?;
    ex.set_rescale(rescale);
    ex.init_params(&mut arena, spec.seed)?;
    if let Some(w) = weights {
        let tensors = checkpoint::load_safetensors(w)?;
        let mut loaded = 0;
        for (name, shape, t) in ex.state_tensors().collect::<Vec<_>>() {
            if let Some((_, s, v)) = tensors.iter().find(|(n, _, _)| *n == name) {
                if *s != shape {
                    return Err(TrainError::Mismatch(format!(
                        "{}: tensor {name} has shape {s:?}, the model needs {shape:?}",
                        w.display()
                    )));
                }
                ex.write_f32(&mut arena, t, v)?;
                loaded += 1;
            }
        }
        if !opts.quiet {
            println!("loaded {loaded} tensors from {}", w.display());
        }
    }
    let per = spec.input.numel();
    let mut xbuf = alloc_zeroed::<f32>(opts.batch.saturating_mul(per), "the batch buffer")?;
    let mut ybuf = alloc_zeroed::<u32>(opts.batch, "the label buffer")?;
    let mut split_profile = Vec::new();
    if let Some(threshold) = split {
        let n = opts.batch.min(train.len());
        let first: Vec<usize> = (0..n).collect();
        train.batch(&first, &mut xbuf, &mut ybuf);
        let mut scratch = alloc_zeroed::<u8>(arena.len(), "the profiling arena")?;
        scratch.copy_from_slice(&arena);
        let mut probe = Int8Executor::new(&plan, &scratch)?;
        probe.set_rescale(rescale);
        let prof = probe.profile_split(
            &mut scratch,
            &xbuf[..n * per],
            Target::Classes(&ybuf[..n]),
            clock_ns,
            threshold,
        )?;
        for &(node, full, chunk, best) in &prof {
            if chunk < n {
                ex.set_split(node, chunk as u16);
            }
            let name = plan.graph.nodes[node].name.clone();
            split_profile.push((name, full, chunk, best));
        }
    }
    let steps = train.len().div_ceil(opts.batch) as u64;
    let mut curves = Vec::new();
    let mut per_epoch = Vec::new();
    for epoch in 0..opts.epochs {
        let before = ex.counts();
        let order = train.shuffle_indices(opts.seed, epoch as u64);
        let bar = (!opts.quiet)
            .then(|| EpochBar::with_terminal(epoch + 1, opts.epochs, steps, opts.progress));
        let (mut loss_sum, mut correct, mut seen) = (0f64, 0usize, 0usize);
        for chunk in order.chunks(opts.batch) {
            let n = chunk.len();
            train.batch(chunk, &mut xbuf, &mut ybuf);
            let s = ex.train_step(&mut arena, &xbuf[..n * per], Target::Classes(&ybuf[..n]))?;
            loss_sum += s.loss as f64 * n as f64;
            correct += s.correct;
            seen += n;
            if let Some(b) = &bar {
                b.step(
                    (loss_sum / seen as f64) as f32,
                    correct as f32 / seen as f32,
                );
            }
        }
        let (test_acc, _) = evaluate_int8(&mut ex, &mut arena, test)?;
        let p = EpochPoint {
            epoch: epoch + 1,
            train_loss: (loss_sum / seen.max(1) as f64) as f32,
            train_acc: correct as f32 / seen.max(1) as f32,
            test_acc: Some(test_acc),
        };
        if let Some(b) = bar {
            b.finish(p.train_loss, p.train_acc, p.test_acc);
        }
        let c = ex.counts().since(&before);
        on_epoch(&p, &c);
        per_epoch.push(c);
        curves.push(p);
    }
    let (test_accuracy, test_loss) = evaluate_int8(&mut ex, &mut arena, test)?;
    let mut tensors = Vec::new();
    for (name, shape, t) in ex.state_tensors().collect::<Vec<_>>() {
        tensors.push((name, shape, ex.read_f32(&mut arena, t)?));
    }
    Ok(Int8Report {
        report: TrainReport {
            epochs: curves,
            test_accuracy,
            test_samples: test.len(),
            // Int8 runs never carry a text data set (int8 refuses sequence layers): no before.
            test_loss: (f32::NAN, test_loss),
            arena_bytes: plan.arena_bytes,
            image_bytes: 0,
            lower_bound: plan.lower_bound,
            tensors,
            policy: PolicyKind::Plain,
            micro_batch: plan.graph.batch,
            recomputes: 0,
            steps: (0, 0.0),
        },
        counts: ex.counts(),
        per_epoch,
        split: split_profile,
    })
}

/// Parses sizes like `2MiB`, `600KiB`, `1.5MB`, `4096`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a size (try 2MiB, 600KiB, 1048576)"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "kb" => 1000.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "mb" => 1e6,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "gb" => 1e9,
        u => {
            return Err(format!(
                "unknown size unit {u:?} in {s:?} (use B, KiB, MiB, GiB, KB, MB, GB)"
            ))
        }
    };
    let bytes = v * mult;
    if !(bytes.is_finite() && bytes >= 0.0 && bytes < usize::MAX as f64) {
        return Err(format!("{s:?} is not a valid size"));
    }
    Ok(bytes as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        assert_eq!(parse_size("2MiB"), Ok(2 << 20));
        assert_eq!(parse_size("600KiB"), Ok(600 * 1024));
        assert_eq!(parse_size("1.5MB"), Ok(1_500_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("2 parsecs").is_err());
    }
}
