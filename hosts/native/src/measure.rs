//! Measuring plans on this device: ms/step on synthetic data, per-instruction times, and the profiled
//! [`CostModel`] the policy search uses (fitted from instruction times at two batch sizes).
use std::time::Instant;

use frugal_core::exec::{ExecError, Executor, Target};
use frugal_core::graph::{Graph, GraphError, NodeOp};
use frugal_core::model::{LossKind, ModelSpec};
use frugal_core::plan::{Instr, Plan};
use frugal_core::policy::CostModel;
use frugal_core::rng::Rng;

/// This thread's CPU time in ns (Linux: `CLOCK_THREAD_CPUTIME_ID`, which adds the running slice to the
/// scheduler's sum; `/proc/thread-self/schedstat` shows the sum as of the last scheduler tick, so over
/// tens of milliseconds it is off by up to a tick, 4 ms on a 250 Hz kernel), None elsewhere. Unlike the
/// wall clock it does not count time spent waiting for a core on a shared machine.
#[cfg(target_os = "linux")]
pub fn thread_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: FFI: clock_gettime with a valid clock id writes one `timespec` through the pointer, which
    // points at a local of that type.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    let (s, ns) = (
        u64::try_from(ts.tv_sec).ok()?,
        u64::try_from(ts.tv_nsec).ok()?,
    );
    (r == 0).then(|| s * 1_000_000_000 + ns)
}

/// This thread's CPU time: not reported on this OS.
#[cfg(not(target_os = "linux"))]
pub fn thread_cpu_ns() -> Option<u64> {
    None
}

/// Synthetic batch for `plan`: inputs uniform in [-1, 1) (token ids below the vocabulary for a model
/// that starts at an embedding), labels cycling through the classes (one per token for a sequence
/// prediction).
pub struct Batch {
    /// Inputs.
    pub x: Vec<f32>,
    /// Class labels (cross-entropy).
    pub classes: Vec<u32>,
    /// Regression targets (MSE).
    pub values: Vec<f32>,
    loss: LossKind,
}

impl Batch {
    /// A batch of `n` samples for `plan`.
    pub fn new(plan: &Plan, n: usize) -> Batch {
        let g = &plan.graph;
        let per = g.input_dims.numel();
        let outs = plan.graph.pred_dims().numel();
        let mut rng = Rng::new(7);
        let vocab = g.nodes.iter().find_map(|n| match n.op {
            NodeOp::Embedding { vocab, .. } => Some(vocab as u64),
            _ => None,
        });
        let x = match vocab {
            Some(v) => (0..n * per).map(|_| rng.below(v) as f32).collect(),
            None => (0..n * per).map(|_| rng.uniform(-1.0, 1.0)).collect(),
        };
        // A class per token over the last axis for a sequence prediction, else one over all outputs.
        let (labels, classes) = if g.tokens > 1 {
            (n * g.tokens, outs / g.tokens)
        } else {
            (n, outs)
        };
        let loss = plan.graph.loss;
        let values = if loss == LossKind::Mse {
            (0..n * outs).map(|_| rng.uniform(-1.0, 1.0)).collect()
        } else {
            Vec::new()
        };
        Batch {
            x,
            classes: (0..labels).map(|i| (i % classes) as u32).collect(),
            values,
            loss,
        }
    }
    /// The targets.
    pub fn target(&self) -> Target<'_> {
        if self.loss == LossKind::Mse {
            Target::Values(&self.values)
        } else {
            Target::Classes(&self.classes)
        }
    }
}

/// Median milliseconds per training step of `plan` on `n` samples (the batch asked for: a micro-batched
/// plan may hold a few more) over `steps` steps (after one warm-up).
pub fn step_ms(plan: &Plan, n: usize, steps: usize) -> Result<f64, ExecError> {
    Ok(steps_ms_interleaved(&[(plan, n)], steps)?[0])
}

/// Median milliseconds per training step of each `(plan, samples)`, measured in `rounds` interleaved
/// rounds (one step of every plan per round, after one warm-up step each, every plan in its own
/// pre-touched arena): a slow spell of a shared machine then hits all plans alike, so the ratios between
/// them hold even where the absolute times drift.
pub fn steps_ms_interleaved(
    plans: &[(&Plan, usize)],
    rounds: usize,
) -> Result<Vec<f64>, ExecError> {
    struct Run<'p> {
        ex: Executor<'p>,
        arena: Vec<u8>,
        batch: Batch,
        times: Vec<f64>,
    }
    let mut runs = Vec::with_capacity(plans.len());
    for &(plan, n) in plans {
        let n = n.clamp(1, plan.batch());
        let mut arena = vec![0u8; plan.needed_bytes()];
        let mut ex = Executor::new(plan, &arena)?;
        ex.init_params(&mut arena, 1)?;
        let batch = Batch::new(plan, n);
        ex.train_step(&mut arena, &batch.x, batch.target())?;
        runs.push(Run {
            ex,
            arena,
            batch,
            times: Vec::with_capacity(rounds),
        });
    }
    for _ in 0..rounds.max(1) {
        for r in runs.iter_mut() {
            let s = Instant::now();
            r.ex.train_step(&mut r.arena, &r.batch.x, r.batch.target())?;
            r.times.push(s.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(runs
        .into_iter()
        .map(|mut r| {
            r.times.sort_by(|a, b| a.total_cmp(b));
            r.times[r.times.len() / 2]
        })
        .collect())
}

/// Nanoseconds of each instruction of `plan` (median over `steps` steps).
pub fn instr_ns(plan: &Plan, steps: usize) -> Result<Vec<f64>, ExecError> {
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(plan, &arena)?;
    ex.init_params(&mut arena, 1)?;
    let b = Batch::new(plan, plan.batch());
    let n = plan.program.len();
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); n];
    for step in 0..steps + 1 {
        let mut last = Instant::now();
        let mut obs = |eo: usize, _: &Instr, _: &[u8]| {
            let now = Instant::now();
            if step > 0 {
                samples[eo].push((now - last).as_secs_f64() * 1e9);
            }
            last = now;
        };
        ex.train_step_observed(&mut arena, &b.x, b.target(), &mut obs)?;
    }
    Ok(samples
        .into_iter()
        .map(|mut v| {
            v.sort_by(|a, b| a.total_cmp(b));
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        })
        .collect())
}

/// Why profiling failed.
#[derive(Debug)]
pub enum ProfileError {
    /// The model does not realise.
    Graph(GraphError),
    /// A step failed.
    Exec(ExecError),
}

impl std::fmt::Display for ProfileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProfileError::Graph(e) => write!(f, "{e}"),
            ProfileError::Exec(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ProfileError {}

/// Profiles `spec` on this device: instruction times of the plain plan at `batch` and at a quarter of it,
/// fitted per node and phase as `fixed + per_sample × n`.
pub fn profile(spec: &ModelSpec, batch: usize) -> Result<CostModel, ProfileError> {
    let small = (batch / 4).max(1);
    let g = Graph::new(spec, batch).map_err(ProfileError::Graph)?;
    let pa = Plan::new(g.clone());
    let pb = Plan::new(Graph::new(spec, small).map_err(ProfileError::Graph)?);
    let ta = instr_ns(&pa, 3).map_err(ProfileError::Exec)?;
    let tb = instr_ns(&pb, 3).map_err(ProfileError::Exec)?;
    Ok(CostModel::fit(&g, (&pa, batch, &ta), (&pb, small, &tb)))
}

/// Where a profiled cost model is cached: `$XDG_CACHE_HOME/frugal` or `~/.cache/frugal`, keyed by the
/// model's binary encoding and the batch.
pub fn cache_path(spec: &ModelSpec, batch: usize) -> Option<std::path::PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))?;
    let key = frugal_core::format::crc32(&frugal_core::format::encode_model(spec));
    Some(
        base.join("frugal")
            .join(format!("cost-{key:08x}-b{batch}.txt")),
    )
}

fn encode_cost(c: &CostModel) -> String {
    let mut s = format!("frugal-cost 1 {}\n", c.costs.len());
    for row in &c.costs {
        let cells: Vec<String> = row.iter().map(|(f, p)| format!("{f} {p}")).collect();
        s.push_str(&cells.join(" "));
        s.push('\n');
    }
    s
}

fn decode_cost(text: &str, rows: usize) -> Option<CostModel> {
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next()?.split_whitespace().collect();
    if head.len() != 3
        || head[0] != "frugal-cost"
        || head[1] != "1"
        || head[2].parse::<usize>().ok()? != rows
    {
        return None;
    }
    let mut costs = Vec::with_capacity(rows);
    for line in lines.take(rows) {
        let v: Vec<f64> = line
            .split_whitespace()
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        if v.len() != 10 || v.iter().any(|x| !x.is_finite() || *x < 0.0) {
            return None;
        }
        costs.push([
            (v[0], v[1]),
            (v[2], v[3]),
            (v[4], v[5]),
            (v[6], v[7]),
            (v[8], v[9]),
        ]);
    }
    (costs.len() == rows).then_some(CostModel {
        costs,
        measured: true,
    })
}

/// [`profile`] with a cache: the first call measures and stores, later calls read (a corrupt or stale
/// cache file is ignored and rewritten). Returns the model and whether it came from the cache.
pub fn profile_cached(spec: &ModelSpec, batch: usize) -> Result<(CostModel, bool), ProfileError> {
    let rows = spec.layers.len() + 1;
    let path = cache_path(spec, batch);
    if let Some(c) = path
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| decode_cost(&t, rows))
    {
        return Ok((c, true));
    }
    let c = profile(spec, batch)?;
    if let Some(p) = path {
        if let Some(dir) = p.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let _ = crate::fsutil::write_atomic(&p, encode_cost(&c).as_bytes());
    }
    Ok((c, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_cache_round_trips_and_rejects_garbage() {
        let c = CostModel {
            costs: vec![[(1.0, 2.0), (3.0, 4.0), (5.0, 6.0), (7.0, 8.0), (9.0, 10.5)]; 3],
            measured: true,
        };
        assert_eq!(decode_cost(&encode_cost(&c), 3), Some(c.clone()));
        assert_eq!(decode_cost(&encode_cost(&c), 4), None);
        assert_eq!(decode_cost("frugal-cost 1 3\n1 2 nan", 3), None);
        assert_eq!(decode_cost("", 3), None);
    }

    /// The thread clock resolves far below a scheduler tick (the bench's on-CPU times span 20–40 ms,
    /// where a tick-granular clock was off by up to 4 ms) and counts this thread's time only.
    #[cfg(target_os = "linux")]
    #[test]
    fn thread_cpu_time_is_finer_than_a_tick_and_follows_the_work() {
        let reads: Vec<u64> = (0..1000)
            .map(|_| thread_cpu_ns().expect("Linux reports thread CPU time"))
            .collect();
        let mut distinct = reads.clone();
        distinct.dedup();
        // Each read costs a system call (≥ tens of ns of this thread's time), so nearly every read
        // differs; a tick-granular source gives one value, or a few if ticks fall inside the loop.
        assert!(distinct.len() > 500, "{} distinct of 1000", distinct.len());
        assert!(reads.windows(2).all(|w| w[0] <= w[1]), "monotonic");
        let (c0, t0) = (thread_cpu_ns().unwrap(), Instant::now());
        let mut x = 0u64;
        while t0.elapsed().as_millis() < 20 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let (cpu, wall) = (
            thread_cpu_ns().unwrap() - c0,
            t0.elapsed().as_nanos() as u64,
        );
        // On-CPU time cannot exceed the wall time it was taken over (1 ms of slack for the reads'
        // own order), and a spinning thread gets some CPU in 20 ms even on a loaded machine.
        assert!(
            cpu > 0 && cpu <= wall + 1_000_000,
            "cpu {cpu} ns, wall {wall} ns"
        );
    }

    /// A sequence model gets token ids below its vocabulary and a label per token, so its plans can be
    /// timed (`frugal plan --budgets`, `bench seq`): uniform inputs in [-1, 1) are refused as ids.
    #[test]
    fn a_sequence_model_is_timed_on_token_ids() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let m = crate::spec_toml::load_model(&dir.join("char-gpt.toml")).unwrap();
        let plan = Plan::new(Graph::new(&m.spec, 2).unwrap());
        let b = Batch::new(&plan, 2);
        assert_eq!(b.x.len(), 2 * 64);
        assert!(b
            .x
            .iter()
            .all(|&t| t.fract() == 0.0 && (0.0..256.0).contains(&t)));
        assert_eq!(b.classes.len(), 2 * 64);
        assert!(b.classes.iter().all(|&c| c < 256));
        assert!(step_ms(&plan, 2, 1).unwrap() > 0.0);
    }
}
