//! # frugal-wasmtime
//!
//! Runs frugal's training core *compiled to wasm* inside wasmtime, one isolated instance per
//! session: an app can train for many users or plug-ins side by side, each bounded in memory and
//! time, none able to take the host down.
//!
//! * **The memory limit is the budget.** [`SessionOptions::budget`] becomes the store's
//!   [`wasmtime::StoreLimits`] memory limit *and* is passed to the guest, which plans within what
//!   remains after its own static data, stack and heap (see `guest/src/lib.rs`). When nothing fits,
//!   the guest answers with a safe bound on the total it needs, and the host narrows it to the
//!   smallest budget (in whole pages) that starts a session: [`SandboxError::BudgetTooSmall`].
//! * **Growing past it fails cleanly.** A guest that tries anyway is refused by the limiter, traps,
//!   and the host gets [`SandboxError::MemoryLimit`]; the [`Sandbox`] keeps working.
//! * **Fuel bounds run time.** [`SessionOptions::fuel`] is the fuel each call into the guest may burn;
//!   running out gives [`SandboxError::OutOfFuel`].
//! * **Thin host.** Decoding, planning and training are the core's, inside the guest. The host moves
//!   bytes: the model in, batches in through the `next_batch` import (so the data set never counts
//!   against the guest's memory), losses and the plan out.
//!
//! The guest `.wasm` is built by this crate's build script from `guest/` ([`GUEST_WASM`]).
#![warn(missing_docs)]

mod data;
mod error;

use frugal_core::exec::StepStats;
use frugal_core::model::{Int8Update, Precision};
use frugal_core::policy::PolicyKind;
use wasmtime::{
    Caller, Config, Engine, Instance, Linker, Module, ResourceLimiter, Store, StoreLimits,
    StoreLimitsBuilder, Trap, TypedFunc,
};

pub use data::{Batches, DatasetBatches, Order};
pub use error::SandboxError;

/// The guest module: the frugal core for `wasm32-unknown-unknown`, built by `build.rs`.
pub static GUEST_WASM: &[u8] = include_bytes!(env!("FRUGAL_GUEST_WASM"));

/// Linear-memory limit of the probe instance that measures the smallest budget when the real one
/// could not even plan (the probe plans only; it never grows an arena).
const PROBE_LIMIT: usize = 1 << 30;

/// Bytes in a wasm page.
const PAGE: usize = 65536;

/// The data source of probe sessions: the right sample size, no samples.
struct NoData(usize);

impl Batches for NoData {
    fn sample_len(&self) -> usize {
        self.0
    }
    fn train_batch(&mut self, _: u64, _: &mut [f32], _: &mut [u32]) -> usize {
        0
    }
    fn eval_batch(&mut self, _: u64, _: &mut [f32], _: &mut [u32]) -> usize {
        0
    }
}

/// Guest status codes (`guest/src/lib.rs`, `Status`).
mod status {
    pub const OK: i32 = 0;
    pub const BAD_ARGUMENT: i32 = 3;
    pub const MODEL: i32 = 4;
    pub const GRAPH: i32 = 5;
    pub const BUDGET: i32 = 6;
    pub const EXEC: i32 = 7;
    pub const DATA: i32 = 8;
    pub const OUT_OF_MEMORY: i32 = 9;
    pub const UNSUPPORTED: i32 = 10;
}

/// Guest `frugal_info` fields (`guest/src/lib.rs`, `info`).
mod field {
    pub const ARENA_BYTES: u32 = 0;
    pub const LOWER_BOUND: u32 = 1;
    pub const MICRO_BATCH: u32 = 2;
    pub const MICRO_BATCHES: u32 = 3;
    pub const RECOMPUTES: u32 = 4;
    pub const POLICY: u32 = 5;
    pub const OVERHEAD_BYTES: u32 = 6;
    pub const ARENA_PAGES_BYTES: u32 = 7;
    pub const STEP_BATCH: u32 = 8;
    pub const EVAL_CORRECT: u32 = 10;
    pub const EVAL_SAMPLES: u32 = 11;
    pub const EVAL_LOSS_BITS: u32 = 12;
    pub const SAMPLE_LEN: u32 = 14;
}

/// How one session runs.
#[derive(Clone, Copy, Debug)]
pub struct SessionOptions {
    /// The whole linear memory the guest may use, in bytes (wasm pages are 64 KiB, so only whole
    /// pages below it are usable).
    pub budget: usize,
    /// Samples per training step.
    pub batch: usize,
    /// Seed of the parameter initialisation.
    pub seed: u64,
    /// Memory policy when the plain plan does not fit (f32 only: int8 trains on the plain plan).
    pub policy: PolicyKind,
    /// Fuel (roughly, wasm instructions) each call into the guest may use; `None`: unbounded.
    pub fuel: Option<u64>,
    /// The numbers to train in: f32, or int8 with either weight update.
    pub precision: Precision,
}

/// The plan the guest chose, and where its memory goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanInfo {
    /// Arena bytes of the plan.
    pub arena_bytes: usize,
    /// Max over execution orders of the live bytes: no layout can be smaller.
    pub lower_bound: usize,
    /// Samples per micro-batch.
    pub micro_batch: usize,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Recompute instructions per step.
    pub recomputes: usize,
    /// The policy that produced the plan.
    pub policy: PolicyKind,
    /// Linear memory in use before the arena: static data, stack and heap (model, plan, buffers).
    pub overhead_bytes: usize,
    /// Linear memory grown for the arena (whole pages).
    pub arena_pages_bytes: usize,
    /// Samples per training step.
    pub step_batch: usize,
    /// `f32` values per input sample.
    pub sample_len: usize,
}

/// Result of an evaluation on the held-out batches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EvalStats {
    /// Correct predictions.
    pub correct: usize,
    /// Samples seen.
    pub samples: usize,
    /// Mean loss.
    pub loss: f32,
}

impl EvalStats {
    /// Fraction correct in [0, 1].
    pub fn accuracy(&self) -> f32 {
        self.correct as f32 / self.samples.max(1) as f32
    }
}

/// The store limiter: wasmtime's [`StoreLimits`] (whose memory limit is the budget), recording the
/// high-water mark and any refused growth so the host can say why a guest stopped.
struct Limiter {
    limits: StoreLimits,
    limit: usize,
    peak: usize,
    refused: Option<usize>,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let ok = self.limits.memory_growing(current, desired, maximum)?;
        if ok {
            self.peak = self.peak.max(desired);
        } else {
            self.refused = Some(desired);
        }
        Ok(ok)
    }
    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.limits.table_growing(current, desired, maximum)
    }
    fn instances(&self) -> usize {
        self.limits.instances()
    }
    fn tables(&self) -> usize {
        self.limits.tables()
    }
    fn memories(&self) -> usize {
        self.limits.memories()
    }
}

/// What the store carries for the host imports.
struct HostState {
    limiter: Limiter,
    data: Box<dyn Batches>,
    steps: Vec<StepStats>,
    panic: Option<String>,
    /// Why the last `next_batch` failed, host side.
    data_error: Option<String>,
    xs: Vec<f32>,
    ys: Vec<u32>,
}

/// A compiled guest, ready to start isolated sessions. Cheap to share; compile once per process.
pub struct Sandbox {
    metered: bool,
    engine: Engine,
    module: Module,
    linker: Linker<HostState>,
}

impl Sandbox {
    /// Compiles the bundled guest ([`GUEST_WASM`]) with fuel metering on, so sessions may set
    /// [`SessionOptions::fuel`].
    pub fn new() -> Result<Self, SandboxError> {
        Self::from_wasm(GUEST_WASM, true)
    }

    /// Compiles the bundled guest without fuel metering: faster code, but sessions must leave
    /// [`SessionOptions::fuel`] at `None`.
    pub fn unmetered() -> Result<Self, SandboxError> {
        Self::from_wasm(GUEST_WASM, false)
    }

    /// Compiles a guest module (the bundled one, or a build of `guest/` with other flags), with or
    /// without fuel metering.
    pub fn from_wasm(wasm: &[u8], metered: bool) -> Result<Self, SandboxError> {
        let mut config = Config::new();
        config.consume_fuel(metered);
        let engine = Engine::new(&config).map_err(wt)?;
        let module = Module::new(&engine, wasm).map_err(wt)?;
        let mut linker = Linker::new(&engine);
        linker
            .func_wrap("frugal", "next_batch", next_batch)
            .map_err(wt)?;
        linker
            .func_wrap(
                "frugal",
                "on_step",
                |mut c: Caller<'_, HostState>,
                 _step: u32,
                 loss: f32,
                 correct: u32,
                 samples: u32| {
                    c.data_mut().steps.push(StepStats {
                        loss,
                        correct: correct as usize,
                        samples: samples as usize,
                    });
                },
            )
            .map_err(wt)?;
        linker
            .func_wrap(
                "frugal",
                "panicked",
                |mut c: Caller<'_, HostState>, ptr: u32, len: u32| {
                    let msg = read_string(&mut c, ptr, len);
                    c.data_mut().panic = Some(msg);
                },
            )
            .map_err(wt)?;
        Ok(Self {
            metered,
            engine,
            module,
            linker,
        })
    }

    /// Starts a session: instantiates the guest with its memory limited to `opts.budget`, hands it
    /// the model (frugal's binary `ModelSpec`, as written by `frugal convert`), and lets it plan and
    /// initialise. Batches come from `data`.
    pub fn session(
        &self,
        model: &[u8],
        data: impl Batches,
        opts: &SessionOptions,
    ) -> Result<Session, SandboxError> {
        if opts.fuel.is_some() && !self.metered {
            return Err(SandboxError::BadArgument(
                "fuel needs a metered sandbox (Sandbox::new)".into(),
            ));
        }
        let sample_len = data.sample_len();
        let bound = match self.start(model, Box::new(data), opts, opts.budget) {
            Ok(s) => return Ok(s),
            Err((SandboxError::BudgetTooSmall { needed, .. }, _)) => needed,
            // Refused growth while planning or instantiating: too small even to plan. A probe with
            // room to plan (but told the same budget) reports the guest's bound.
            Err((SandboxError::MemoryLimit { .. }, data)) => {
                match self.start(model, data, opts, PROBE_LIMIT.max(opts.budget)) {
                    Err((SandboxError::BudgetTooSmall { needed, .. }, _)) => needed,
                    Err((e, _)) => return Err(e),
                    Ok(_) => {
                        return Err(SandboxError::Guest(format!(
                            "the guest could not start within {} bytes but planned within them \
                             when given more room",
                            opts.budget
                        )))
                    }
                }
            }
            Err((e, _)) => return Err(e),
        };
        Err(SandboxError::BudgetTooSmall {
            needed: self.smallest_budget(model, sample_len, opts, bound),
            given: opts.budget,
        })
    }

    /// The smallest budget (whole pages) that starts a session, by bisection between the budget that
    /// failed and the guest's bound. The guest's bound is safe but loose: it includes the heap its
    /// exhaustive (failed) policy search grew, which a search that succeeds early never needs.
    fn smallest_budget(
        &self,
        model: &[u8],
        sample_len: usize,
        opts: &SessionOptions,
        bound: usize,
    ) -> usize {
        let works = |budget: usize| {
            let o = SessionOptions { budget, ..*opts };
            self.start(model, Box::new(NoData(sample_len)), &o, budget)
                .is_ok()
        };
        let mut lo = opts.budget / PAGE * PAGE; // fails (only whole pages are usable)
        let mut hi = bound.div_ceil(PAGE) * PAGE;
        if hi <= lo || !works(hi) {
            return bound;
        }
        while hi - lo > PAGE {
            let mid = lo + (hi - lo) / PAGE / 2 * PAGE;
            if works(mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }

    /// One attempt; on failure the data source comes back for a retry. Any refused memory growth
    /// during set-up (a trap, or an allocation the guest saw fail) is reported as
    /// [`SandboxError::MemoryLimit`].
    #[allow(clippy::result_large_err)]
    fn start(
        &self,
        model: &[u8],
        data: Box<dyn Batches>,
        opts: &SessionOptions,
        limit: usize,
    ) -> Result<Session, (SandboxError, Box<dyn Batches>)> {
        let state = HostState {
            limiter: Limiter {
                limits: StoreLimitsBuilder::new()
                    .memory_size(limit)
                    .instances(1)
                    .memories(1)
                    .tables(1)
                    .build(),
                limit,
                peak: 0,
                refused: None,
            },
            data,
            steps: Vec::new(),
            panic: None,
            data_error: None,
            xs: Vec::new(),
            ys: Vec::new(),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        let metered = self.metered;
        let give_back = |store: Store<HostState>, e: SandboxError| (e, store.into_data().data);
        let instance = match self.linker.instantiate(&mut store, &self.module) {
            Ok(i) => i,
            Err(e) => {
                let e = match store.data().limiter.refused {
                    Some(requested) => SandboxError::MemoryLimit { limit, requested },
                    None => wt(e),
                };
                return Err(give_back(store, e));
            }
        };
        let mut s = match Session::bind(store, instance, opts, metered) {
            Ok(s) => s,
            Err((store, e)) => return Err(give_back(store, e)),
        };
        let r = s.init(model, opts);
        match r {
            Ok(()) => Ok(s),
            Err(e) => {
                let e = match (e, s.store.data().limiter.refused) {
                    (SandboxError::BudgetTooSmall { needed, .. }, _) => {
                        SandboxError::BudgetTooSmall {
                            needed,
                            given: opts.budget,
                        }
                    }
                    // Refused growth while setting up: the caller probes for the smallest budget.
                    (_, Some(requested)) => SandboxError::MemoryLimit { limit, requested },
                    (e, None) => e,
                };
                Err(give_back(s.store, e))
            }
        }
    }
}

/// One guest instance: a plan, its arena, the weights. Dropping it frees everything.
pub struct Session {
    store: Store<HostState>,
    instance: Instance,
    fuel: Option<u64>,
    metered: bool,
    poisoned: bool,
    plan: Option<PlanInfo>,
    train: TypedFunc<u32, i32>,
    evaluate: TypedFunc<(), i32>,
    info: TypedFunc<u32, u64>,
}

impl Session {
    #[allow(clippy::result_large_err)]
    fn bind(
        mut store: Store<HostState>,
        instance: Instance,
        opts: &SessionOptions,
        metered: bool,
    ) -> Result<Session, (Store<HostState>, SandboxError)> {
        macro_rules! func {
            ($name:literal) => {
                match instance.get_typed_func(&mut store, $name) {
                    Ok(f) => f,
                    Err(e) => {
                        return Err((store, SandboxError::Guest(format!("export {}: {e}", $name))))
                    }
                }
            };
        }
        let train = func!("frugal_train");
        let evaluate = func!("frugal_evaluate");
        let info = func!("frugal_info");
        Ok(Session {
            store,
            instance,
            fuel: opts.fuel,
            metered,
            poisoned: false,
            plan: None,
            train,
            evaluate,
            info,
        })
    }

    fn init(&mut self, model: &[u8], opts: &SessionOptions) -> Result<(), SandboxError> {
        let len = u32::try_from(model.len())
            .map_err(|_| SandboxError::BadArgument("the model is larger than 4 GiB".into()))?;
        let batch = u32::try_from(opts.batch)
            .ok()
            .filter(|&b| b > 0)
            .ok_or_else(|| {
                SandboxError::BadArgument(format!("batch {} (must be 1..=2^32-1)", opts.batch))
            })?;
        let input: TypedFunc<u32, u32> = self.func("frugal_input")?;
        let ptr = self.call(|st| input.call(st, len))?;
        if ptr == 0 {
            return Err(self.failure(status::OUT_OF_MEMORY));
        }
        let memory = self.memory()?;
        memory
            .write(&mut self.store, ptr as usize, model)
            .map_err(|e| {
                SandboxError::Guest(format!("frugal_input returned a bad pointer: {e}"))
            })?;
        let (code, bits) = match opts.precision {
            Precision::F32 => (0, 0),
            Precision::Int8(Int8Update::Integer { update_bits }) => (1, update_bits as u32),
            Precision::Int8(Int8Update::FloatMaster) => (2, 0),
        };
        if code != 0 {
            let set: TypedFunc<(u32, u32), i32> = self.func("frugal_set_precision")?;
            let st = self.call(|st| set.call(st, (code, bits)))?;
            if st != status::OK {
                return Err(self.failure(st));
            }
        }
        let init: TypedFunc<(u64, u32, u64, u32), i32> = self.func("frugal_init")?;
        let code = policy_code(opts.policy);
        let budget = opts.budget as u64;
        let st = self.call(|st| init.call(st, (budget, batch, opts.seed, code)))?;
        if st != status::OK {
            return Err(self.failure(st));
        }
        let plan = self.read_plan()?;
        let data_len = self.store.data().data.sample_len();
        if data_len != plan.sample_len {
            return Err(SandboxError::Data(format!(
                "the data has samples of {data_len} values but the model's input has {}",
                plan.sample_len
            )));
        }
        self.plan = Some(plan);
        Ok(())
    }

    fn func<P: wasmtime::WasmParams, R: wasmtime::WasmResults>(
        &mut self,
        name: &str,
    ) -> Result<TypedFunc<P, R>, SandboxError> {
        self.instance
            .get_typed_func(&mut self.store, name)
            .map_err(|e| SandboxError::Guest(format!("export {name}: {e}")))
    }

    fn memory(&mut self) -> Result<wasmtime::Memory, SandboxError> {
        self.instance
            .get_memory(&mut self.store, "memory")
            .ok_or_else(|| SandboxError::Guest("the guest exports no memory".into()))
    }

    /// Calls into the guest with this session's fuel, turning traps into typed errors (and poisoning
    /// the session after one).
    fn call<R>(
        &mut self,
        f: impl FnOnce(&mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<R, SandboxError> {
        if self.poisoned {
            return Err(SandboxError::Poisoned);
        }
        if self.metered {
            self.store
                .set_fuel(self.fuel.unwrap_or(u64::MAX))
                .map_err(wt)?;
        }
        {
            let st = self.store.data_mut();
            st.panic = None;
            st.limiter.refused = None;
        }
        match f(&mut self.store) {
            Ok(r) => Ok(r),
            Err(e) => {
                self.poisoned = true;
                let st = self.store.data();
                Err(if let Some(requested) = st.limiter.refused {
                    SandboxError::MemoryLimit {
                        limit: st.limiter.limit,
                        requested,
                    }
                } else if e.downcast_ref::<Trap>() == Some(&Trap::OutOfFuel) {
                    SandboxError::OutOfFuel {
                        fuel: self.fuel.unwrap_or(u64::MAX),
                    }
                } else if let Some(m) = &st.panic {
                    SandboxError::Trap(format!("guest panicked: {m}"))
                } else {
                    SandboxError::Trap(format!("{e:#}"))
                })
            }
        }
    }

    /// The guest's last error as a typed error.
    fn failure(&mut self, code: i32) -> SandboxError {
        let msg = self.error_message();
        let detail = |s: &mut Self, i: u32| -> u64 {
            let f: Result<TypedFunc<u32, u64>, _> = s.func("frugal_error_detail");
            f.ok()
                .and_then(|f| f.call(&mut s.store, i).ok())
                .unwrap_or(0)
        };
        match code {
            status::BUDGET => SandboxError::BudgetTooSmall {
                needed: detail(self, 0) as usize,
                given: detail(self, 1) as usize,
            },
            status::MODEL => SandboxError::Model(msg),
            status::GRAPH | status::UNSUPPORTED => SandboxError::Graph(msg),
            status::EXEC => SandboxError::Exec(msg),
            status::DATA => SandboxError::Data(match self.store.data_mut().data_error.take() {
                Some(host) => format!("{host} ({msg})"),
                None => msg,
            }),
            status::BAD_ARGUMENT => SandboxError::BadArgument(msg),
            status::OUT_OF_MEMORY => {
                let asked = detail(self, 0) as usize;
                let lim = &self.store.data().limiter;
                SandboxError::MemoryLimit {
                    limit: lim.limit,
                    requested: lim.refused.unwrap_or(asked),
                }
            }
            c => SandboxError::Guest(format!("status {c}: {msg}")),
        }
    }

    fn error_message(&mut self) -> String {
        let ptr: Option<TypedFunc<(), u32>> = self.func("frugal_error_message").ok();
        let len: Option<TypedFunc<(), u32>> = self.func("frugal_error_len").ok();
        let (Some(ptr), Some(len)) = (ptr, len) else {
            return String::new();
        };
        let (Ok(p), Ok(n)) = (ptr.call(&mut self.store, ()), len.call(&mut self.store, ())) else {
            return String::new();
        };
        let Ok(memory) = self.memory() else {
            return String::new();
        };
        let mut buf = vec![0u8; n.min(4096) as usize];
        match memory.read(&self.store, p as usize, &mut buf) {
            Ok(()) => String::from_utf8_lossy(&buf).into_owned(),
            Err(_) => String::new(),
        }
    }

    fn read_plan(&mut self) -> Result<PlanInfo, SandboxError> {
        let info = self.info.clone();
        let mut get = |f: u32| -> Result<usize, SandboxError> {
            Ok(self.call(|st| info.call(st, f))? as usize)
        };
        let policy = match get(field::POLICY)? {
            1 => PolicyKind::Plain,
            2 => PolicyKind::MicroBatch,
            3 => PolicyKind::Recompute,
            4 => PolicyKind::Hybrid,
            5 => PolicyKind::RecomputeFirst,
            _ => PolicyKind::Auto,
        };
        Ok(PlanInfo {
            arena_bytes: get(field::ARENA_BYTES)?,
            lower_bound: get(field::LOWER_BOUND)?,
            micro_batch: get(field::MICRO_BATCH)?,
            micro_batches: get(field::MICRO_BATCHES)?,
            recomputes: get(field::RECOMPUTES)?,
            policy,
            overhead_bytes: get(field::OVERHEAD_BYTES)?,
            arena_pages_bytes: get(field::ARENA_PAGES_BYTES)?,
            step_batch: get(field::STEP_BATCH)?,
            sample_len: get(field::SAMPLE_LEN)?,
        })
    }

    /// The plan the guest chose.
    pub fn plan(&self) -> PlanInfo {
        self.plan
            .expect("a session exists only after a successful init")
    }

    /// The memory limit (the budget), in bytes.
    pub fn budget(&self) -> usize {
        self.store.data().limiter.limit
    }

    /// The guest's linear memory now, in bytes. Linear memory never shrinks, so this is also the peak.
    pub fn memory_bytes(&self) -> usize {
        self.store.data().limiter.peak
    }

    /// Runs `steps` training steps; returns each step's loss, correct count and samples.
    pub fn train(&mut self, steps: u32) -> Result<Vec<StepStats>, SandboxError> {
        self.store.data_mut().steps.clear();
        let f = self.train.clone();
        let st = self.call(|st| f.call(st, steps))?;
        if st != status::OK {
            return Err(self.failure(st));
        }
        Ok(std::mem::take(&mut self.store.data_mut().steps))
    }

    /// Evaluates on the data source's held-out batches.
    pub fn evaluate(&mut self) -> Result<EvalStats, SandboxError> {
        let f = self.evaluate.clone();
        let st = self.call(|st| f.call(st, ()))?;
        if st != status::OK {
            return Err(self.failure(st));
        }
        let info = self.info.clone();
        let mut get = |f: u32| -> Result<u64, SandboxError> { self.call(|st| info.call(st, f)) };
        Ok(EvalStats {
            correct: get(field::EVAL_CORRECT)? as usize,
            samples: get(field::EVAL_SAMPLES)? as usize,
            loss: f32::from_bits(get(field::EVAL_LOSS_BITS)? as u32),
        })
    }

    /// Test hook: asks the guest to allocate and touch `bytes` bytes on its heap. Past the memory
    /// limit the guest is stopped ([`SandboxError::MemoryLimit`]) and this session is poisoned.
    pub fn test_allocate(&mut self, bytes: u32) -> Result<u32, SandboxError> {
        let f: TypedFunc<u32, u32> = self.func("frugal_test_allocate")?;
        self.call(|st| f.call(st, bytes))
    }
}

fn wt(e: wasmtime::Error) -> SandboxError {
    SandboxError::Wasmtime(format!("{e:#}"))
}

fn policy_code(p: PolicyKind) -> u32 {
    match p {
        PolicyKind::Auto => 0,
        PolicyKind::Plain => 1,
        PolicyKind::MicroBatch => 2,
        PolicyKind::Recompute => 3,
        PolicyKind::Hybrid => 4,
        PolicyKind::RecomputeFirst => 5,
    }
}

fn read_string(c: &mut Caller<'_, HostState>, ptr: u32, len: u32) -> String {
    let Some(mem) = c.get_export("memory").and_then(|e| e.into_memory()) else {
        return String::new();
    };
    let data = mem.data(&c);
    let (start, end) = (ptr as usize, ptr as usize + len.min(4096) as usize);
    data.get(start..end)
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default()
}

/// The `next_batch` import: fills the guest's buffers from the data source. Every pointer and length
/// comes from the guest and is checked; a bad one is answered with a negative count, not a panic.
fn next_batch(
    mut c: Caller<'_, HostState>,
    split: u32,
    index: u32,
    x: u32,
    y: u32,
    capacity: u32,
    sample_len: u32,
) -> i32 {
    let (cap, per) = (capacity as usize, sample_len as usize);
    let fail = |c: &mut Caller<'_, HostState>, why: String| {
        c.data_mut().data_error = Some(why);
        -1
    };
    let st = c.data_mut();
    if per != st.data.sample_len() {
        let why = format!(
            "the guest asked for samples of {per} values; the data has {}",
            st.data.sample_len()
        );
        return fail(&mut c, why);
    }
    let Some(xn) = cap.checked_mul(per) else {
        return fail(&mut c, format!("capacity {cap} × {per} overflows"));
    };
    let mut xs = std::mem::take(&mut st.xs);
    let mut ys = std::mem::take(&mut st.ys);
    xs.clear();
    xs.resize(xn, 0.0);
    ys.clear();
    ys.resize(cap, 0);
    let n = match split {
        0 => st.data.train_batch(index as u64, &mut xs, &mut ys),
        1 => st.data.eval_batch(index as u64, &mut xs, &mut ys),
        s => return fail(&mut c, format!("unknown split {s}")),
    };
    let result = (|| {
        if n > cap {
            return Err(format!(
                "the data source returned {n} samples for a capacity of {cap}"
            ));
        }
        let mem = c
            .get_export("memory")
            .and_then(|e| e.into_memory())
            .ok_or_else(|| "the guest exports no memory".to_string())?;
        let bytes = mem.data_mut(&mut c);
        let xr = region(x, n * per * 4, bytes.len())
            .ok_or_else(|| format!("x buffer at {x} outside guest memory"))?;
        let yr = region(y, n * 4, bytes.len())
            .ok_or_else(|| format!("y buffer at {y} outside guest memory"))?;
        for (d, v) in bytes[xr].chunks_exact_mut(4).zip(&xs[..n * per]) {
            d.copy_from_slice(&v.to_le_bytes());
        }
        for (d, v) in bytes[yr].chunks_exact_mut(4).zip(&ys[..n]) {
            d.copy_from_slice(&v.to_le_bytes());
        }
        Ok(n as i32)
    })();
    let st = c.data_mut();
    st.xs = xs;
    st.ys = ys;
    match result {
        Ok(n) => n,
        Err(why) => fail(&mut c, why),
    }
}

/// `[ptr, ptr + len)` if it lies within `size` bytes.
fn region(ptr: u32, len: usize, size: usize) -> Option<std::ops::Range<usize>> {
    let start = ptr as usize;
    let end = start.checked_add(len)?;
    (end <= size).then_some(start..end)
}
