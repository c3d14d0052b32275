//! `Session`: the trainer behind the JS `Trainer`, in plain Rust (so it is tested natively too). It owns
//! the model, the plan chosen for the budget, the arena and the samples; every step is the core's
//! `Executor::train_step` over the arena. Nothing here decides maths or memory: planning is
//! `frugal_core::policy::plan_for_budget`, training is the executor.
use alloc::format;
use alloc::string::ToString;
use alloc::vec::Vec;

use frugal_core::budget::Budget;
use frugal_core::exec::{ExecError, Executor, Target};
use frugal_core::format::decode_model;
use frugal_core::graph::{Graph, TensorId};
use frugal_core::model::{LayerKind, LossKind, ModelSpec};
use frugal_core::plan::Plan;
use frugal_core::policy::{plan_for_budget, Chosen, CostModel, PolicyKind};

use crate::error::WebError;
use crate::weights::{self, NamedTensor};
use frugal_host::{load, persistent, SampleError, Samples};

#[cfg(feature = "seq")]
#[path = "text.rs"]
pub mod text;

/// Largest batch a trainer accepts (samples per step).
pub const MAX_BATCH: usize = 4096;
/// Most classes a resized head may have.
pub const MAX_CLASSES: u32 = 4096;
/// Most steps one `train_steps` call runs.
pub const MAX_STEPS_PER_CALL: u32 = 1 << 20;

/// How to build a [`Session`].
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Samples per step (the plan's batch). Default 32.
    pub batch: usize,
    /// Arena budget in bytes; `None` plans without a limit.
    pub budget: Option<usize>,
    /// Seed of the weight initialisation (before loading weights); `None` uses the model's seed.
    pub seed: Option<u64>,
    /// Resize the last layer (a linear layer) to this many classes: a fresh head for transfer learning.
    pub classes: Option<u32>,
    /// Memory policy when the plain plan does not fit the budget. Default [`PolicyKind::Auto`].
    pub policy: PolicyKind,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            batch: 32,
            budget: None,
            seed: None,
            classes: None,
            policy: PolicyKind::Auto,
        }
    }
}

/// What the current plan is (see `planInfo()` in JS).
#[derive(Clone, Debug, PartialEq)]
pub struct PlanInfo {
    /// Bytes of the planned arena.
    pub arena_bytes: usize,
    /// Bytes actually allocated for it (the arena plus alignment slack); never above the budget.
    pub allocated_bytes: usize,
    /// The lower bound: most bytes live at any one execution order.
    pub lower_bound: usize,
    /// Samples per micro-batch.
    pub micro_batch: usize,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Recompute instructions per step.
    pub recomputes: usize,
    /// The budget (`None`: unlimited).
    pub budget: Option<usize>,
    /// The policy that produced the plan.
    pub policy: &'static str,
    /// The cost model's predicted milliseconds per step (an estimate, not a measurement).
    pub predicted_ms: f64,
}

/// A trainer: model, plan, arena, samples.
pub struct Session {
    spec: ModelSpec,
    batch: usize,
    policy: PolicyKind,
    budget: Option<usize>,
    chosen: Chosen,
    arena: Vec<u8>,
    /// Optimizer steps taken (Adam's t), kept across re-plans.
    steps: u32,
    per: usize,
    classes: usize,
    /// Labels per sample: 1 for a classifier, the sequence length for a sequence model (a class per
    /// token: the next token).
    tokens: usize,
    /// The samples and each step's batch (shared with the Android host).
    samples: Samples,
    loaded: usize,
}

/// `v` as an integer in `[min, max]`, or an argument error naming `arg`.
pub fn integer(arg: &'static str, v: f64, min: u64, max: u64) -> Result<u64, WebError> {
    if !v.is_finite() || v.fract() != 0.0 || v < min as f64 || v > max as f64 {
        return Err(WebError::Argument(
            arg,
            format!("must be an integer from {min} to {max}, got {v}"),
        ));
    }
    Ok(v as u64)
}

/// A zeroed byte vector, or an out-of-memory error instead of an abort.
fn zeroed<T: Clone + Default>(n: usize) -> Result<Vec<T>, WebError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| WebError::OutOfMemory(n.saturating_mul(core::mem::size_of::<T>())))?;
    v.resize(n, T::default());
    Ok(v)
}

/// Plans `spec` at `batch` within `budget` with `policy`.
fn plan(
    spec: &ModelSpec,
    batch: usize,
    budget: Option<usize>,
    policy: PolicyKind,
) -> Result<Chosen, WebError> {
    let cost = CostModel::estimate(&Graph::new(spec, batch)?);
    let b = budget.map(Budget::new).unwrap_or(Budget::UNLIMITED);
    Ok(plan_for_budget(spec, batch, b, policy, &cost)?)
}

impl Session {
    /// A trainer for the binary model `model` (a `.frgm` file). `weights` are safetensors bytes loaded
    /// by name over the seeded initialisation (empty: initialisation only); tensors the model does not
    /// have are ignored, a tensor with another shape is an error.
    pub fn new(model: &[u8], weights: &[u8], opts: Options) -> Result<Session, WebError> {
        let spec = decode_model(model)?;
        Session::from_spec(spec, weights, opts)
    }

    /// [`Session::new`] from a decoded model.
    pub fn from_spec(
        mut spec: ModelSpec,
        weights: &[u8],
        opts: Options,
    ) -> Result<Session, WebError> {
        if spec.loss != LossKind::SoftmaxCrossEntropy {
            return Err(WebError::Argument(
                "modelBytes",
                "the browser trainer trains classifiers: the model's loss must be cross_entropy"
                    .into(),
            ));
        }
        if opts.batch == 0 || opts.batch > MAX_BATCH {
            return Err(WebError::Argument(
                "options.batch",
                format!("must be from 1 to {MAX_BATCH}, got {}", opts.batch),
            ));
        }
        if let Some(c) = opts.classes {
            if c == 0 || c > MAX_CLASSES {
                return Err(WebError::Argument(
                    "options.classes",
                    format!("must be from 1 to {MAX_CLASSES}, got {c}"),
                ));
            }
            match spec.layers.last_mut().map(|l| &mut l.kind) {
                Some(LayerKind::Linear { out, .. }) => *out = c,
                _ => {
                    return Err(WebError::Argument(
                        "options.classes",
                        "the model's last layer must be linear to resize it".into(),
                    ))
                }
            }
        }
        let chosen = plan(&spec, opts.batch, opts.budget, opts.policy)?;
        let per = spec.input.numel();
        // Without the core's sequence layers no graph has tokens (constant-folded: the CPU module's size).
        let tokens = if cfg!(feature = "seq") {
            chosen.plan.graph.tokens.max(1)
        } else {
            1
        };
        let classes = chosen.plan.graph.pred_dims().numel() / tokens;
        let mut s = Session {
            arena: zeroed(chosen.plan.needed_bytes())?,
            samples: Samples::with_tokens(per, classes, tokens, opts.batch),
            spec,
            batch: opts.batch,
            policy: opts.policy,
            budget: opts.budget,
            chosen,
            steps: 0,
            per,
            classes,
            tokens,
            loaded: 0,
        };
        let seed = opts.seed.unwrap_or(s.spec.seed);
        let mut ex = Executor::new(&s.chosen.plan, &s.arena)?;
        ex.init_params(&mut s.arena, seed)?;
        if !weights.is_empty() {
            s.loaded = load(
                &mut ex,
                &mut s.arena,
                &weights::parse(weights).map_err(WebError::Weights)?,
            )?;
        }
        Ok(s)
    }

    /// Adds one training sample: `x` of the model's input size, finite, and a class label.
    pub fn add_sample(&mut self, x: &[f32], label: f64) -> Result<(), WebError> {
        if self.tokens > 1 {
            return Err(WebError::Argument(
                "addSample",
                "a sequence model trains on token ids: use addTokens".into(),
            ));
        }
        // A label `integer` refuses goes to the store as u32::MAX, which no model has (at most
        // MAX_CLASSES classes): the store refuses it after checking the input, and `integer`'s error is
        // the one reported.
        let label = integer("label", label, 0, self.classes as u64 - 1);
        let l = label.as_ref().map_or(u32::MAX, |&v| v as u32);
        self.samples.add(x, l).map_err(|e| match (e, label) {
            (SampleError::Length { got, per }, _) => WebError::Argument(
                "input",
                format!(
                    "has {got} values but the model's input {} has {per}",
                    self.spec.input
                ),
            ),
            (SampleError::NonFinite { index, value }, _) => WebError::Argument(
                "input",
                format!("value {index} is {value} (must be finite)"),
            ),
            (_, Err(e)) => e,
            (SampleError::OutOfMemory(n), _) => WebError::OutOfMemory(n),
            // `integer` accepted the label, so the store did too.
            (SampleError::Label { .. }, Ok(_)) => WebError::OutOfMemory(0),
        })
    }

    /// Forgets all samples (the weights stay).
    pub fn clear_samples(&mut self) {
        self.samples.clear();
    }

    /// Runs `n` training steps and appends their losses to `losses`. With at most `batch` samples, every
    /// step trains on all of them in the order added; with more, step k trains on the `batch` samples
    /// after the previous step's (in the order added, wrapping around). A failing step is rejected
    /// without touching the weights and ends the call; earlier steps of the call stand.
    pub fn train_steps(&mut self, n: u32, losses: &mut Vec<f32>) -> Result<(), WebError> {
        self.check_steps(n, losses)?;
        let mut ex = Executor::new(&self.chosen.plan, &self.arena)?;
        ex.set_steps(self.steps);
        for _ in 0..n {
            let (x, y) = self.samples.next_batch();
            let r = ex.train_step(&mut self.arena, x, Target::Classes(y));
            self.steps = ex.steps();
            losses.push(r?.loss);
        }
        Ok(())
    }

    /// Checks a `trainSteps` call: samples exist, `n` is not too many, room for the losses.
    fn check_steps(&self, n: u32, losses: &mut Vec<f32>) -> Result<(), WebError> {
        if self.samples.is_empty() {
            return Err(WebError::Argument(
                "trainSteps",
                "there are no samples: add some with addSample first".into(),
            ));
        }
        if n > MAX_STEPS_PER_CALL {
            return Err(WebError::Argument(
                "steps",
                format!("at most {MAX_STEPS_PER_CALL} steps per call, got {n}"),
            ));
        }
        losses
            .try_reserve(n as usize)
            .map_err(|_| WebError::OutOfMemory(n as usize * 4))
    }

    /// [`Session::train_steps`] on WebGPU: the plan's tensors move into the GPU's buffer (the same plan,
    /// its storages in the GPU space), `n` steps run there — each one submission, its loss awaited —
    /// and the weights, optimizer state and statistics come back into the arena, which stays the
    /// trainer's state between calls (prediction, export and re-planning read it there).
    #[cfg(feature = "webgpu")]
    pub async fn train_steps_gpu(
        &mut self,
        n: u32,
        losses: &mut Vec<f32>,
        gpu: &mut crate::gpu::Gpu,
    ) -> Result<(), WebError> {
        self.check_steps(n, losses)?;
        // The budget bounds the arena in the page's memory, which holds the trainer's state between
        // calls; the GPU's buffer is the same plan laid out at WebGPU's 256-byte binding alignment
        // (a few hundred bytes more per storage), in the GPU's own memory.
        let gplan = frugal_wgpu::gpu_plan(self.chosen.plan.clone());
        let ids = persistent(&self.chosen.plan.graph);
        let saved = self.save(&ids)?;
        use frugal_core::backend::Backend;
        let mut backend = gpu.take()?;
        // Prepared here, so that a plan the GPU cannot run leaves the backend with the page.
        if let Err(e) = backend.prepare(&gplan) {
            gpu.put(backend);
            return Err(WebError::Exec(e));
        }
        let mut host = zeroed(gplan.needed_bytes())?;
        // Cannot fail now: the host arena fits and the plan is prepared (`prepare` keeps it).
        let mut ex = Executor::with_backend(&gplan, &host, backend)?;
        ex.set_steps(self.steps);
        let r = async {
            let mut at = 0;
            for &t in &ids {
                let len = gplan.graph.tensors[t as usize].bytes / 4;
                ex.write(&mut host, t, &saved[at..at + len])?;
                at += len;
            }
            for _ in 0..n {
                let (x, y) = self.samples.next_batch();
                let m = y.len();
                ex.train_step(&mut host, x, Target::Classes(y))?;
                match ex.backend_mut().loss().await {
                    Ok(l) => losses.push(l.map_or(0.0, |l| (l.sum / m as f64) as f32)),
                    Err(e) => {
                        // The GPU skipped the step's updates: it is not counted.
                        ex.set_steps(ex.steps() - 1);
                        return Err(WebError::Exec(e));
                    }
                }
            }
            let mut back = Vec::new();
            back.try_reserve_exact(saved.len())
                .map_err(|_| WebError::OutOfMemory(saved.len() * 4))?;
            for &t in &ids {
                back.extend_from_slice(&ex.backend().read_async(&gplan, t).await?);
            }
            Ok::<_, WebError>(back)
        }
        .await;
        self.steps = ex.steps();
        gpu.put(ex.into_backend());
        let back = r?;
        self.restore(&ids, &back)
    }

    /// Class probabilities (softmax of the model's output) for one or more samples laid end to end;
    /// `n × classes` values (`n × tokens × classes` for a sequence model: a distribution per position).
    pub fn predict(&mut self, x: &[f32]) -> Result<Vec<f32>, WebError> {
        if x.is_empty() || !x.len().is_multiple_of(self.per) {
            return Err(WebError::Argument(
                "input",
                format!(
                    "has {} values, not a positive multiple of the model's input size {}",
                    x.len(),
                    self.per
                ),
            ));
        }
        if let Some(i) = x.iter().position(|v| !v.is_finite()) {
            return Err(WebError::Argument(
                "input",
                format!("value {i} is {} (must be finite)", x[i]),
            ));
        }
        let n = x.len() / self.per;
        let outs = self.tokens * self.classes;
        let mut out = zeroed::<f32>(n.saturating_mul(outs))?;
        let mb = self.chosen.plan.graph.batch;
        let mut ex = Executor::new(&self.chosen.plan, &self.arena)?;
        ex.set_steps(self.steps);
        let mut i = 0;
        while i < n {
            let k = mb.min(n - i);
            let logits = ex.predict(&mut self.arena, &x[i * self.per..(i + k) * self.per])?;
            for (dst, z) in out[i * outs..(i + k) * outs]
                .chunks_exact_mut(self.classes)
                .zip(logits.chunks_exact(self.classes))
            {
                softmax(z, dst);
            }
            i += k;
        }
        Ok(out)
    }

    /// Re-plans for a new budget (`None`: unlimited) with the core's policy search, keeping the weights,
    /// optimizer state and statistics. When no plan fits, the error names the smallest budget that
    /// works and the trainer keeps its previous plan and budget.
    pub fn set_budget(&mut self, budget: Option<usize>) -> Result<(), WebError> {
        let chosen = plan(&self.spec, self.batch, budget, self.policy)?;
        // Save what lives across steps, free the old arena, then build the new one: the peak is one
        // arena plus the persistent tensors, not two arenas.
        let old_ids = persistent(&self.chosen.plan.graph);
        let new_ids = persistent(&chosen.plan.graph);
        let same = old_ids.len() == new_ids.len()
            && old_ids.iter().zip(&new_ids).all(|(&a, &b)| {
                self.chosen.plan.graph.tensors[a as usize].bytes
                    == chosen.plan.graph.tensors[b as usize].bytes
            });
        if !same {
            return Err(WebError::Exec(ExecError::BadPlan(
                "the new plan's persistent tensors do not match the old plan's",
            )));
        }
        let saved = self.save(&old_ids)?;
        self.arena = Vec::new();
        let arena = match zeroed(chosen.plan.needed_bytes()) {
            Ok(a) => a,
            Err(e) => {
                // Put the old plan back (its bytes were just freed).
                self.arena = zeroed(self.chosen.plan.needed_bytes())?;
                self.restore(&old_ids, &saved)?;
                return Err(e);
            }
        };
        self.arena = arena;
        self.chosen = chosen;
        self.budget = budget;
        self.restore(&new_ids, &saved)
    }

    fn save(&mut self, ids: &[TensorId]) -> Result<Vec<f32>, WebError> {
        let plan = &self.chosen.plan;
        let bytes: usize = ids
            .iter()
            .map(|&t| plan.graph.tensors[t as usize].bytes)
            .sum();
        let mut saved = Vec::new();
        saved
            .try_reserve_exact(bytes / 4)
            .map_err(|_| WebError::OutOfMemory(bytes))?;
        let ex = Executor::new(plan, &self.arena)?;
        for &t in ids {
            saved.extend_from_slice(ex.read(&mut self.arena, t)?);
        }
        Ok(saved)
    }

    fn restore(&mut self, ids: &[TensorId], saved: &[f32]) -> Result<(), WebError> {
        let plan = &self.chosen.plan;
        let mut ex = Executor::new(plan, &self.arena)?;
        let mut at = 0;
        for &t in ids {
            let len = plan.graph.tensors[t as usize].bytes / 4;
            let src = saved
                .get(at..at + len)
                .ok_or(WebError::Exec(ExecError::Tensor("saved state is short")))?;
            ex.write(&mut self.arena, t, src)?;
            at += len;
        }
        Ok(())
    }

    /// The current plan.
    pub fn plan_info(&self) -> PlanInfo {
        let p: &Plan = &self.chosen.plan;
        PlanInfo {
            arena_bytes: p.arena_bytes,
            allocated_bytes: self.arena.len(),
            lower_bound: p.lower_bound,
            micro_batch: p.graph.batch,
            micro_batches: p.micro_batches as usize,
            recomputes: self.chosen.recomputes,
            budget: self.budget,
            policy: self.chosen.policy.name(),
            predicted_ms: self.chosen.predicted_ms,
        }
    }

    /// The parameters and statistics as F32 safetensors bytes (PyTorch `state_dict` names).
    pub fn export_weights(&mut self) -> Result<Vec<u8>, WebError> {
        let plan = &self.chosen.plan;
        let ex = Executor::new(plan, &self.arena)?;
        let mut tensors: Vec<NamedTensor> = Vec::new();
        for (name, shape, t) in ex.state_tensors() {
            let v = ex.read(&mut self.arena, t)?.to_vec();
            tensors.push((name, shape, v));
        }
        weights::serialize(&tensors).map_err(WebError::Weights)
    }

    /// Samples added so far.
    pub fn sample_count(&self) -> usize {
        self.samples.len()
    }
    /// Classes the model predicts (per position, for a sequence model: its vocabulary).
    pub fn classes(&self) -> usize {
        self.classes
    }
    /// Labels per sample: 1, or a sequence model's length.
    pub fn tokens(&self) -> usize {
        self.tokens
    }
    /// Values per input sample.
    pub fn input_size(&self) -> usize {
        self.per
    }
    /// Tensors loaded from the weights bytes at creation.
    pub fn loaded_tensors(&self) -> usize {
        self.loaded
    }
    /// Training steps taken.
    pub fn steps(&self) -> u32 {
        self.steps
    }
    /// Samples per step.
    pub fn batch(&self) -> usize {
        self.batch
    }
}

/// Numerically stable softmax of `z` into `out`.
fn softmax(z: &[f32], out: &mut [f32]) {
    let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for (o, &v) in out.iter_mut().zip(z) {
        *o = (v - max).exp();
        sum += *o;
    }
    for o in out.iter_mut() {
        *o /= sum;
    }
}

impl core::fmt::Debug for Session {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Session")
            .field("batch", &self.batch)
            .field("samples", &self.samples.len())
            .field("steps", &self.steps)
            .field("plan", &self.plan_info())
            .finish()
    }
}

/// Parses a policy name (`auto`, `plain`, `micro-batch`, `recompute`, `hybrid`, `recompute-first`).
pub fn parse_policy(s: &str) -> Result<PolicyKind, WebError> {
    PolicyKind::parse(s).ok_or_else(|| {
        WebError::Argument(
            "options.policy",
            format!(
                "unknown policy {:?} (use auto, plain, micro-batch, recompute, hybrid, recompute-first)",
                s.to_string()
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    const MLP: &[u8] = include_bytes!("../../examples/digits-mlp.frgm");
    const TRANSFER: &[u8] = include_bytes!("../../examples/transfer.frgm");
    const BACKBONE: &[u8] = include_bytes!("../../examples/digits-backbone.safetensors");
    const IMAGES: &[u8] = include_bytes!("../../data/digits/digits-train-images.idx");
    const LABELS: &[u8] = include_bytes!("../../data/digits/digits-train-labels.idx");
    const GOLDEN: &str = include_str!("../../tests/golden/cross_target_mlp.json");

    /// The first `n` bundled training digits, scaled 0..16 → [0, 1] as `frugal_cli::data::digits`.
    fn digits(n: usize) -> (Vec<f32>, Vec<u32>) {
        // IDX: 16-byte image header (magic, count, 8, 8), 8-byte label header (magic, count).
        let x = IMAGES[16..16 + n * 64]
            .iter()
            .map(|&p| p as f32 / 16.0)
            .collect();
        let y = LABELS[8..8 + n].iter().map(|&l| l as u32).collect();
        (x, y)
    }

    fn golden() -> Vec<f32> {
        let v: serde_json::Value = serde_json::from_str(GOLDEN).expect("golden JSON");
        v["losses"]
            .as_array()
            .expect("losses")
            .iter()
            .map(|x| x.as_f64().expect("a number") as f32)
            .collect()
    }

    fn with_samples(model: &[u8], weights: &[u8], opts: Options, n: usize) -> Session {
        let mut s = Session::new(model, weights, opts).unwrap();
        let (x, y) = digits(n);
        for i in 0..n {
            let label = y[i] as usize % s.classes();
            s.add_sample(&x[i * 64..(i + 1) * 64], label as f64)
                .unwrap();
        }
        s
    }

    #[test]
    fn reference_run_gives_the_cross_target_golden_losses() {
        let opts = Options {
            batch: 32,
            seed: Some(1),
            ..Options::default()
        };
        let mut s = with_samples(MLP, &[], opts, 640);
        assert_eq!(s.plan_info().policy, "plain");
        let mut losses = Vec::new();
        s.train_steps(20, &mut losses).unwrap();
        let want = golden();
        assert_eq!(losses.len(), want.len());
        // Same kernels as the native reference up to the SIMD path chosen at run time, which changes
        // summation order only: 1e-5 relative over 20 steps (as tests/cross_target.rs).
        for (i, (g, w)) in losses.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs(),
                "step {i}: {g} vs golden {w}"
            );
        }
    }

    fn transfer(classes: u32, budget: Option<usize>) -> Result<Session, WebError> {
        let opts = Options {
            batch: 16,
            classes: Some(classes),
            budget,
            seed: Some(1),
            ..Options::default()
        };
        Session::new(TRANSFER, BACKBONE, opts)
    }

    #[test]
    fn a_budget_too_small_names_a_feasible_budget_and_keeps_the_plan() {
        let mut s = transfer(3, None).unwrap();
        assert_eq!(s.loaded_tensors(), 4, "conv1 and conv2 weights and biases");
        let before = s.plan_info();
        let needed = match s.set_budget(Some(0)) {
            Err(e @ WebError::Budget(_)) => e.needed_bytes().unwrap(),
            other => panic!("expected a budget error, got {other:?}"),
        };
        assert_eq!(s.plan_info(), before, "a rejected budget keeps the plan");
        assert!(needed < before.allocated_bytes, "{needed} vs {before:?}");
        // The smallest budget named is feasible, and the arena fits it.
        s.set_budget(Some(needed)).unwrap();
        let p = s.plan_info();
        assert!(p.allocated_bytes <= needed, "{p:?}");
        assert_ne!(p.policy, "plain");
        assert!(matches!(
            transfer(3, Some(needed - 1)),
            Err(WebError::Budget(_))
        ));
    }

    #[test]
    fn replanning_keeps_weights_and_optimizer_state() {
        // Two identical trainers; one is squeezed to its smallest budget halfway and widened again.
        let mut a = transfer(4, None).unwrap();
        let mut b = transfer(4, None).unwrap();
        let (x, y) = digits(16);
        for s in [&mut a, &mut b] {
            for i in 0..16 {
                s.add_sample(&x[i * 64..(i + 1) * 64], (y[i] % 4) as f64)
                    .unwrap();
            }
        }
        let (mut la, mut lb) = (Vec::new(), Vec::new());
        a.train_steps(5, &mut la).unwrap();
        b.train_steps(5, &mut lb).unwrap();
        let needed = b.set_budget(Some(0)).unwrap_err().needed_bytes().unwrap();
        b.set_budget(Some(needed)).unwrap();
        assert!(b.plan_info().micro_batch < 16 || b.plan_info().recomputes > 0);
        a.train_steps(5, &mut la).unwrap();
        b.train_steps(5, &mut lb).unwrap();
        b.set_budget(None).unwrap();
        a.train_steps(5, &mut la).unwrap();
        b.train_steps(5, &mut lb).unwrap();
        // Micro-batching sums gradients in another order (recompute is bit-exact): 1e-5 relative covers
        // f32 rounding differences compounded over 10 Adam steps on a 4-class head.
        for (i, (p, q)) in la.iter().zip(&lb).enumerate() {
            assert!(
                (p - q).abs() <= 1e-5 * p.abs().max(1e-3),
                "step {i}: {p} vs {q}"
            );
        }
        assert_eq!(a.steps(), 15);
        assert_eq!(b.steps(), 15);
        assert!(la[14] < la[0], "the head learns: {la:?}");
    }

    #[test]
    fn exported_weights_load_back_with_the_same_predictions() {
        let mut a = with_samples(
            TRANSFER,
            BACKBONE,
            Options {
                batch: 16,
                classes: Some(3),
                ..Options::default()
            },
            16,
        );
        a.train_steps(10, &mut Vec::new()).unwrap();
        let bytes = a.export_weights().unwrap();
        let mut b = Session::new(
            TRANSFER,
            &bytes,
            Options {
                batch: 16,
                classes: Some(3),
                seed: Some(99),
                ..Options::default()
            },
        )
        .unwrap();
        assert_eq!(b.loaded_tensors(), 8);
        let (x, _) = digits(5);
        let (pa, pb) = (a.predict(&x).unwrap(), b.predict(&x).unwrap());
        assert_eq!(pa, pb);
        assert_eq!(pa.len(), 5 * 3);
        for p in pa.chunks(3) {
            assert!(
                (p.iter().sum::<f32>() - 1.0).abs() < 1e-5,
                "probabilities: {p:?}"
            );
        }
    }

    #[test]
    fn bad_arguments_are_errors() {
        let mut s = transfer(2, None).unwrap();
        let arg = |r: Result<(), WebError>| match r {
            Err(WebError::Argument(a, why)) => alloc::format!("{a}: {why}"),
            other => panic!("expected an argument error, got {other:?}"),
        };
        assert!(arg(s.add_sample(&[0.0; 63], 0.0)).contains("has 63 values"));
        let mut nan = [0.0f32; 64];
        nan[7] = f32::NAN;
        assert!(arg(s.add_sample(&nan, 0.0)).contains("value 7 is NaN"));
        assert!(arg(s.add_sample(&[0.0; 64], 2.0)).contains("from 0 to 1, got 2"));
        assert!(arg(s.add_sample(&[0.0; 64], -1.0)).contains("got -1"));
        assert!(arg(s.add_sample(&[0.0; 64], 0.5)).contains("got 0.5"));
        assert!(arg(s.add_sample(&[0.0; 64], f64::NAN)).contains("got NaN"));
        assert!(arg(s.train_steps(1, &mut Vec::new())).contains("no samples"));
        assert!(arg(s.predict(&[0.0; 65]).map(|_| ())).contains("65 values"));
        assert!(arg(s.predict(&[]).map(|_| ())).contains("0 values"));
        assert!(arg(s.predict(&nan).map(|_| ())).contains("NaN"));
        assert_eq!(s.sample_count(), 0, "rejected samples are not kept");
        let bad = |o: Options| Session::new(TRANSFER, BACKBONE, o).unwrap_err();
        assert!(matches!(
            bad(Options {
                batch: 0,
                ..Options::default()
            }),
            WebError::Argument("options.batch", _)
        ));
        assert!(matches!(
            bad(Options {
                classes: Some(0),
                ..Options::default()
            }),
            WebError::Argument("options.classes", _)
        ));
        assert!(parse_policy("fastest").is_err());
        assert_eq!(parse_policy("hybrid"), Ok(PolicyKind::Hybrid));
    }

    #[test]
    fn corrupt_model_and_weights_bytes_are_errors_never_panics() {
        let o = Options::default;
        assert!(matches!(
            Session::new(&[], &[], o()),
            Err(WebError::Model(_))
        ));
        assert!(matches!(
            Session::new(&TRANSFER[..TRANSFER.len() - 3], &[], o()),
            Err(WebError::Model(_))
        ));
        assert!(matches!(
            Session::new(TRANSFER, b"not safetensors", o()),
            Err(WebError::Weights(_))
        ));
        // A weights file whose tensor has the wrong shape for the model.
        let wrong =
            weights::serialize(&[("conv1.weight".to_string(), vec![2, 2], vec![0.0; 4])]).unwrap();
        let e = Session::new(TRANSFER, &wrong, o()).unwrap_err();
        assert!(
            e.to_string().contains("conv1.weight has shape [2, 2]"),
            "{e}"
        );
        // Every single-byte change of the model or of the weights is accepted or an error.
        for i in (0..TRANSFER.len()).step_by(3) {
            let mut m = TRANSFER.to_vec();
            m[i] ^= 0x5a;
            let _ = Session::new(&m, &[], o());
        }
        for i in (0..BACKBONE.len()).step_by(97) {
            let mut w = BACKBONE.to_vec();
            w[i] = w[i].wrapping_add(0x41);
            let _ = Session::new(TRANSFER, &w, o());
        }
    }
}
