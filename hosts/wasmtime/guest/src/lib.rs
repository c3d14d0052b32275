//! frugal's training core as a sandboxed wasm guest: a plain C ABI over `frugal-core`, run by
//! `frugal-wasmtime` (`hosts/wasmtime`). All training logic is the core's; this file only moves bytes.
//!
//! # Why `no_std` + `alloc` (and not std)
//! The core is `no_std` already; std on `wasm32-unknown-unknown` would add its formatting, panic and
//! I/O shims (a larger module) for nothing a guest can use. Here the guest picks its own allocator
//! (dlmalloc, the one std itself uses on this target), its own panic handler (report the message to the
//! host, then trap) and sees every byte of linear memory it grows.
//!
//! # Memory: the budget is the whole linear memory
//! The host sets wasmtime's store limit to the budget and passes the same number to [`frugal_init`].
//! The guest decodes the model, allocates its batch buffers, then plans with the core's policy search
//! for what remains: `budget − (static data + stack + heap in use)`, measured as the linear memory's
//! size after planning. The arena is not a heap block: it is whole pages grown for it with
//! `memory.grow`, so allocator fragmentation cannot move the figure. When nothing fits, the typed
//! error carries a safe bound on the *total* linear memory needed (heap grown so far + the smallest
//! arena); the host bisects below it for the smallest budget that works.
//!
//! # ABI (all integers little-endian, pointers are offsets into the guest's memory)
//! Imports, module `frugal`:
//! * `next_batch(split, index, x, y, capacity, sample_len) -> i32` — the host writes up to `capacity`
//!   samples (`sample_len` `f32` inputs each at `x`, `u32` classes at `y`) of training step `index` (`split` 0) or of held-out
//!   batch `index` (`split` 1) and returns how many (0 ends an evaluation; negative is a host error).
//! * `on_step(step, loss, correct, samples)` — one training step finished.
//! * `panicked(msg, len)` — the guest is about to trap; `msg` says why.
//!
//! Exports: [`frugal_input`], [`frugal_set_precision`], [`frugal_init`], [`frugal_train`],
//! [`frugal_evaluate`], [`frugal_info`], [`frugal_error_detail`], [`frugal_error_message`],
//! [`frugal_error_len`], [`frugal_test_allocate`].
//! Status codes are [`Status`] values; `0` is success.
#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

#[cfg(not(target_arch = "wasm32"))]
compile_error!("frugal-guest builds only for wasm32-unknown-unknown (frugal-wasmtime's build script does this)");

extern crate alloc;

use alloc::vec::Vec;
use core::arch::wasm32;
use core::cell::RefCell;
use core::fmt::{self, Write};

use frugal_core::budget::{Budget, BudgetError};
use frugal_core::exec::int8::Int8Executor;
use frugal_core::exec::{ExecError, Executor, Target};
use frugal_core::format::decode_model;
use frugal_core::graph::Graph;
use frugal_core::model::{Int8Update, LossKind, Precision};
use frugal_core::plan::Plan;
use frugal_core::policy::{plan_for_budget, CostModel, PlanError, PolicyKind};

#[global_allocator]
static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

/// Bytes in a wasm page.
const PAGE: usize = 65536;

#[link(wasm_import_module = "frugal")]
extern "C" {
    fn next_batch(
        split: u32,
        index: u32,
        x: *mut f32,
        y: *mut u32,
        capacity: u32,
        sample_len: u32,
    ) -> i32;
    fn on_step(step: u32, loss: f32, correct: u32, samples: u32);
    fn panicked(msg: *const u8, len: u32);
}

/// Status codes returned by the exports (the host mirrors them).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// [`frugal_init`] has not succeeded yet.
    NotInitialised = 1,
    /// [`frugal_init`] was already called on this instance.
    AlreadyInitialised = 2,
    /// An argument is out of range (details: the value).
    BadArgument = 3,
    /// The model bytes do not decode.
    Model = 4,
    /// The model does not realise at this batch size.
    Graph = 5,
    /// No plan fits the budget (details: smallest total linear memory, the budget given).
    Budget = 6,
    /// A training or evaluation step failed.
    Exec = 7,
    /// The host's data callback misbehaved (details: what it returned).
    Data = 8,
    /// The guest could not allocate a buffer (details: bytes asked).
    OutOfMemory = 9,
    /// The model uses something this guest does not support.
    Unsupported = 10,
}

/// [`frugal_info`] fields.
pub mod info {
    /// Arena bytes of the plan.
    pub const ARENA_BYTES: u32 = 0;
    /// Lower bound of the plan (max live bytes over execution orders).
    pub const LOWER_BOUND: u32 = 1;
    /// Micro-batch size.
    pub const MICRO_BATCH: u32 = 2;
    /// Micro-batches per step.
    pub const MICRO_BATCHES: u32 = 3;
    /// Recompute instructions per step.
    pub const RECOMPUTES: u32 = 4;
    /// Policy of the plan (0 auto, 1 plain, 2 micro-batch, 3 recompute, 4 hybrid, 5 recompute-first).
    pub const POLICY: u32 = 5;
    /// Linear memory in use before the arena was grown (static data + stack + heap).
    pub const OVERHEAD_BYTES: u32 = 6;
    /// Bytes of linear memory grown for the arena (whole pages).
    pub const ARENA_PAGES_BYTES: u32 = 7;
    /// Samples per training step.
    pub const STEP_BATCH: u32 = 8;
    /// Optimizer steps taken.
    pub const STEPS: u32 = 9;
    /// Correct predictions of the last evaluation.
    pub const EVAL_CORRECT: u32 = 10;
    /// Samples of the last evaluation.
    pub const EVAL_SAMPLES: u32 = 11;
    /// Mean loss of the last evaluation (`f32` bits).
    pub const EVAL_LOSS_BITS: u32 = 12;
    /// Linear memory now, in bytes.
    pub const MEMORY_BYTES: u32 = 13;
    /// `f32` values per input sample.
    pub const SAMPLE_LEN: u32 = 14;
    /// Numbers of the session: 0 f32, 1 int8 with the pure-integer update, 2 int8 with f32 master
    /// weights (see [`frugal_set_precision`](super::frugal_set_precision)).
    pub const PRECISION: u32 = 15;
}

/// Single-threaded global cell.
struct Global<T>(RefCell<T>);

// SAFETY: this crate builds only for wasm32-unknown-unknown without the `atomics` feature, where an
// instance runs on exactly one thread; no reference to the cell's content ever crosses threads.
unsafe impl<T> Sync for Global<T> {}

/// One training session: the plan, its arena and the batch buffers.
struct Session {
    /// The plan, kept for the instance's lifetime (one session per instance), so that the int8
    /// executor, whose rescaling state lives across steps, can borrow it.
    plan: &'static Plan,
    /// The int8 executor (`None` in f32; the f32 executor keeps no state and is made per call).
    int8: Option<Int8Executor<'static>>,
    /// [`info::PRECISION`] code.
    precision: u32,
    policy: PolicyKind,
    recomputes: usize,
    arena: &'static mut [u8],
    /// Samples per step as asked (a micro-batched plan may cover a few more: `plan.batch()`).
    batch: usize,
    x: Vec<f32>,
    y: Vec<u32>,
    /// Optimizer steps taken (the executor's counter, kept across calls).
    steps: u32,
    overhead: usize,
    eval: (usize, usize, f32),
}

/// The last error: status, two details and a message.
struct ErrorRecord {
    status: Status,
    detail: [u64; 2],
    msg: [u8; 480],
    len: usize,
}

impl Write for ErrorRecord {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.msg.len() - self.len;
        let mut n = s.len().min(room);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.msg[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

static SESSION: Global<Option<Session>> = Global(RefCell::new(None));
/// The numbers [`frugal_init`] will train in: (precision code, int8 update bits).
static PRECISION: Global<(u32, u8)> = Global(RefCell::new((0, 0)));
static INPUT: Global<Vec<u8>> = Global(RefCell::new(Vec::new()));
static ERROR: Global<ErrorRecord> = Global(RefCell::new(ErrorRecord {
    status: Status::Ok,
    detail: [0; 2],
    msg: [0; 480],
    len: 0,
}));

/// A failure with what the host needs to report it.
struct Failure {
    status: Status,
    detail: [u64; 2],
    what: &'static str,
    cause: Option<Cause>,
}

enum Cause {
    Format(frugal_core::format::FormatError),
    Graph(frugal_core::graph::GraphError),
    Budget(BudgetError),
    Exec(ExecError),
}

impl Failure {
    fn new(status: Status, what: &'static str, detail: [u64; 2]) -> Self {
        Failure {
            status,
            detail,
            what,
            cause: None,
        }
    }
}

impl From<ExecError> for Failure {
    fn from(e: ExecError) -> Self {
        Failure {
            status: Status::Exec,
            detail: [0; 2],
            what: "step",
            cause: Some(Cause::Exec(e)),
        }
    }
}

/// Records `r`'s error (if any) and turns it into a status code.
fn finish(r: Result<(), Failure>) -> i32 {
    let mut rec = ERROR.0.borrow_mut();
    rec.len = 0;
    match r {
        Ok(()) => {
            rec.status = Status::Ok;
            rec.detail = [0; 2];
            0
        }
        Err(f) => {
            rec.status = f.status;
            rec.detail = f.detail;
            let _ = match &f.cause {
                None => write!(rec, "{}", f.what),
                Some(Cause::Format(e)) => write!(rec, "{}: {e}", f.what),
                Some(Cause::Graph(e)) => write!(rec, "{}: {e}", f.what),
                Some(Cause::Budget(e)) => write!(rec, "{}: {e}", f.what),
                Some(Cause::Exec(e)) => write!(rec, "{}: {e}", f.what),
            };
            f.status as i32
        }
    }
}

/// Linear memory size in bytes.
fn memory_bytes() -> usize {
    wasm32::memory_size(0) * PAGE
}

fn floor_page(n: usize) -> usize {
    n / PAGE * PAGE
}

/// A zeroed vector of `n` elements, or a typed error when the allocator (or the budget) says no.
fn try_zeroed<T: Copy + Default>(n: usize) -> Result<Vec<T>, Failure> {
    let bytes = n.saturating_mul(core::mem::size_of::<T>()) as u64;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        Failure::new(
            Status::OutOfMemory,
            "the guest could not allocate a buffer within its memory limit",
            [bytes, 0],
        )
    })?;
    v.resize(n, T::default());
    Ok(v)
}

fn policy_of(code: u32) -> Option<PolicyKind> {
    Some(match code {
        0 => PolicyKind::Auto,
        1 => PolicyKind::Plain,
        2 => PolicyKind::MicroBatch,
        3 => PolicyKind::Recompute,
        4 => PolicyKind::Hybrid,
        5 => PolicyKind::RecomputeFirst,
        _ => return None,
    })
}

fn policy_code(p: PolicyKind) -> u64 {
    match p {
        PolicyKind::Auto => 0,
        PolicyKind::Plain => 1,
        PolicyKind::MicroBatch => 2,
        PolicyKind::Recompute => 3,
        PolicyKind::Hybrid => 4,
        PolicyKind::RecomputeFirst => 5,
    }
}

/// Makes room for `len` bytes of input (the model) and returns where the host should write them
/// (0 when the guest cannot allocate them).
#[no_mangle]
pub extern "C" fn frugal_input(len: u32) -> u32 {
    let mut input = INPUT.0.borrow_mut();
    *input = Vec::new();
    match try_zeroed::<u8>(len as usize) {
        Ok(v) => {
            *input = v;
            input.as_mut_ptr() as u32
        }
        Err(f) => {
            finish(Err(f));
            0
        }
    }
}

/// Decodes the model written through [`frugal_input`], plans it for steps of `batch` samples so that
/// the whole linear memory stays within `budget` bytes, grows the arena and initialises the
/// parameters with `seed`. `policy`: see [`info::POLICY`]. In int8 (see [`frugal_set_precision`]) the
/// plan is the plain one: it must fit the budget as it is.
#[no_mangle]
pub extern "C" fn frugal_init(budget: u64, batch: u32, seed: u64, policy: u32) -> i32 {
    finish(init(budget, batch, seed, policy))
}

/// Sets the numbers [`frugal_init`] trains in: `code` 0 f32 (the default), 1 int8 with the pure-integer
/// update of `update_bits` (1..=7), 2 int8 with f32 master weights (`update_bits` ignored). Only before
/// [`frugal_init`].
#[no_mangle]
pub extern "C" fn frugal_set_precision(code: u32, update_bits: u32) -> i32 {
    finish((|| {
        if SESSION.0.borrow().is_some() {
            return Err(Failure::new(
                Status::AlreadyInitialised,
                "the precision is set before frugal_init",
                [0; 2],
            ));
        }
        if code > 2 || (code == 1 && !(1..=7).contains(&update_bits)) {
            return Err(Failure::new(
                Status::BadArgument,
                "precision code must be 0..=2, and update bits 1..=7 for the integer update",
                [code as u64, update_bits as u64],
            ));
        }
        *PRECISION.0.borrow_mut() = (code, update_bits as u8);
        Ok(())
    })())
}

fn precision_of(code: u32, update_bits: u8) -> Precision {
    match code {
        1 => Precision::Int8(Int8Update::Integer { update_bits }),
        2 => Precision::Int8(Int8Update::FloatMaster),
        _ => Precision::F32,
    }
}

fn init(budget: u64, batch: u32, seed: u64, policy: u32) -> Result<(), Failure> {
    if SESSION.0.borrow().is_some() {
        return Err(Failure::new(
            Status::AlreadyInitialised,
            "this instance already holds a session",
            [0; 2],
        ));
    }
    let policy = policy_of(policy).ok_or(Failure::new(
        Status::BadArgument,
        "unknown policy code",
        [policy as u64, 0],
    ))?;
    if batch == 0 {
        return Err(Failure::new(
            Status::BadArgument,
            "the batch must hold at least one sample",
            [0; 2],
        ));
    }
    let batch = batch as usize;
    let spec = {
        let input = core::mem::take(&mut *INPUT.0.borrow_mut());
        decode_model(&input).map_err(|e| Failure {
            status: Status::Model,
            detail: [0; 2],
            what: "model",
            cause: Some(Cause::Format(e)),
        })?
    };
    if spec.loss != LossKind::SoftmaxCrossEntropy {
        return Err(Failure::new(
            Status::Unsupported,
            "the sandbox trains classifiers (softmax cross-entropy) only",
            [0; 2],
        ));
    }
    let graph_err = |e| Failure {
        status: Status::Graph,
        detail: [0; 2],
        what: "model",
        cause: Some(Cause::Graph(e)),
    };
    let per = spec.input.numel();
    let x = try_zeroed::<f32>(batch.saturating_mul(per))?;
    let y = try_zeroed::<u32>(batch)?;
    let cost = CostModel::estimate(&Graph::new(&spec, batch).map_err(graph_err)?);
    // Linear memory is at most 4 GiB and grows in whole pages.
    let limit = floor_page(budget.min(u32::MAX as u64) as usize);
    let too_small = |needed: usize| Failure {
        status: Status::Budget,
        detail: [needed as u64, budget],
        what: "sandbox budget",
        cause: Some(Cause::Budget(BudgetError::TooSmall {
            needed,
            given: budget.min(usize::MAX as u64) as usize,
        })),
    };
    let (code, update_bits) = *PRECISION.0.borrow();
    if code != 0 {
        // int8: the plain plan (the memory policies plan f32 graphs).
        let g = Graph::with_precision(&spec, batch, precision_of(code, update_bits))
            .map_err(graph_err)?;
        let plan: &'static Plan = alloc::boxed::Box::leak(alloc::boxed::Box::new(Plan::new(g)));
        let heap = memory_bytes();
        let arena_pages = plan.needed_bytes().div_ceil(PAGE);
        if heap + arena_pages * PAGE > limit {
            return Err(too_small(heap + arena_pages * PAGE));
        }
        let arena = grow_arena(arena_pages).ok_or(too_small(heap + arena_pages * PAGE))?;
        let mut ex = Int8Executor::new(plan, arena)?;
        ex.init_params(arena, seed)?;
        *SESSION.0.borrow_mut() = Some(Session {
            plan,
            int8: Some(ex),
            precision: code,
            policy: PolicyKind::Plain,
            recomputes: 0,
            arena,
            batch,
            x,
            y,
            steps: 0,
            overhead: heap,
            eval: (0, 0, 0.0),
        });
        return Ok(());
    }
    // Plan for what is left after the heap; planning itself may grow the heap, so measure again and
    // re-plan for less until the arena's pages fit beside it (memory only grows, so this ends).
    let mut avail = floor_page(limit.saturating_sub(memory_bytes()));
    loop {
        match plan_for_budget(&spec, batch, Budget::new(avail), policy, &cost) {
            Ok(chosen) => {
                let heap = memory_bytes();
                let arena_pages = chosen.plan.needed_bytes().div_ceil(PAGE);
                if heap + arena_pages * PAGE <= limit {
                    let arena =
                        grow_arena(arena_pages).ok_or(too_small(heap + arena_pages * PAGE))?;
                    let plan: &'static Plan =
                        alloc::boxed::Box::leak(alloc::boxed::Box::new(chosen.plan));
                    let mut ex = Executor::new(plan, arena)?;
                    ex.init_params(arena, seed)?;
                    *SESSION.0.borrow_mut() = Some(Session {
                        plan,
                        int8: None,
                        precision: 0,
                        policy: chosen.policy,
                        recomputes: chosen.recomputes,
                        arena,
                        batch,
                        x,
                        y,
                        steps: 0,
                        overhead: heap,
                        eval: (0, 0, 0.0),
                    });
                    return Ok(());
                }
                let next = floor_page(limit.saturating_sub(heap));
                if next == 0 || next >= avail {
                    return Err(too_small(heap + arena_pages * PAGE));
                }
                avail = next;
            }
            Err(PlanError::Budget(BudgetError::TooSmall { needed, .. })) => {
                return Err(too_small(memory_bytes() + needed.div_ceil(PAGE) * PAGE));
            }
            Err(PlanError::Graph(e)) => return Err(graph_err(e)),
        }
    }
}

/// Grows linear memory by `pages` for the arena; `None` when the limit refuses.
fn grow_arena(pages: usize) -> Option<&'static mut [u8]> {
    let old = wasm32::memory_grow(0, pages);
    if old == usize::MAX {
        return None;
    }
    let ptr = (old * PAGE) as *mut u8;
    // SAFETY: `memory.grow` just appended `[old·PAGE, (old+pages)·PAGE)` to linear memory, zeroed.
    // Nothing else refers to it: the allocator only hands out memory it grew itself. Linear memory
    // never shrinks, so the region stays valid for the instance's lifetime, and it is stored once, in
    // the session, so there is exactly one mutable reference.
    Some(unsafe { core::slice::from_raw_parts_mut(ptr, pages * PAGE) })
}

/// Runs `steps` training steps, asking the host for each batch (`next_batch(0, step, …)`) and
/// reporting each loss (`on_step`).
#[no_mangle]
pub extern "C" fn frugal_train(steps: u32) -> i32 {
    finish(with_session(|s| {
        let per = s.plan.graph.input_dims.numel();
        // The buffers hold the asked batch; a micro-batched plan takes a short last micro-batch.
        let cap = s.batch;
        for _ in 0..steps {
            let step = s.steps;
            // SAFETY: `x` holds `cap·per` f32 and `y` `cap` u32 (allocated at init for the asked
            // batch); no Rust reference to them is alive during the call, and the host writes at most
            // `capacity` samples into them.
            let n = unsafe {
                next_batch(
                    0,
                    step,
                    s.x.as_mut_ptr(),
                    s.y.as_mut_ptr(),
                    cap as u32,
                    per as u32,
                )
            };
            let n = samples(n, cap)?;
            let (x, y) = (&s.x[..n * per], Target::Classes(&s.y[..n]));
            let st = match s.int8.as_mut() {
                Some(ex) => {
                    let st = ex.train_step(s.arena, x, y)?;
                    s.steps = ex.steps();
                    st
                }
                None => {
                    let mut ex = Executor::new(s.plan, s.arena)?;
                    ex.set_steps(s.steps);
                    let st = ex.train_step(s.arena, x, y)?;
                    s.steps = ex.steps();
                    st
                }
            };
            // SAFETY: a plain call into the host with scalar arguments.
            unsafe { on_step(step, st.loss, st.correct as u32, st.samples as u32) };
        }
        Ok(())
    }))
}

/// The host's sample count, checked.
fn samples(n: i32, cap: usize) -> Result<usize, Failure> {
    if n <= 0 || n as usize > cap {
        return Err(Failure::new(
            Status::Data,
            "the host's next_batch returned no samples, an error, or more than the capacity",
            [n as i64 as u64, cap as u64],
        ));
    }
    Ok(n as usize)
}

/// Evaluates on the host's held-out batches (`next_batch(1, 0..)`, until one has 0 samples); the
/// result is read with [`frugal_info`] ([`info::EVAL_CORRECT`], …).
#[no_mangle]
pub extern "C" fn frugal_evaluate() -> i32 {
    finish(with_session(|s| {
        let per = s.plan.graph.input_dims.numel();
        let cap = s.plan.graph.batch.min(s.batch);
        let (mut correct, mut seen, mut loss) = (0usize, 0usize, 0f64);
        let mut ex = match s.int8 {
            Some(_) => None,
            None => {
                let mut ex = Executor::new(s.plan, s.arena)?;
                ex.set_steps(s.steps);
                Some(ex)
            }
        };
        for index in 0.. {
            // SAFETY: as in `frugal_train`; the capacity is the micro-batch, which is ≤ the buffers.
            let n = unsafe {
                next_batch(
                    1,
                    index,
                    s.x.as_mut_ptr(),
                    s.y.as_mut_ptr(),
                    cap as u32,
                    per as u32,
                )
            };
            if n == 0 {
                break;
            }
            let n = samples(n, cap)?;
            let (x, y) = (&s.x[..n * per], Target::Classes(&s.y[..n]));
            let st = match (s.int8.as_mut(), ex.as_mut()) {
                (Some(ex8), _) => ex8.evaluate(s.arena, x, y)?,
                (None, Some(ex)) => ex.evaluate(s.arena, x, y)?,
                (None, None) => {
                    return Err(Failure::new(Status::Exec, "no executor for the session", [0; 2]))
                }
            };
            correct += st.correct;
            seen += n;
            loss += st.loss as f64 * n as f64;
        }
        s.eval = (correct, seen, (loss / seen.max(1) as f64) as f32);
        Ok(())
    }))
}

fn with_session(f: impl FnOnce(&mut Session) -> Result<(), Failure>) -> Result<(), Failure> {
    let mut cell = SESSION.0.borrow_mut();
    match cell.as_mut() {
        Some(s) => f(s),
        None => Err(Failure::new(
            Status::NotInitialised,
            "call frugal_init first",
            [0; 2],
        )),
    }
}

/// One [`info`] field of the session (0 when there is none or the field is unknown).
#[no_mangle]
pub extern "C" fn frugal_info(field: u32) -> u64 {
    if field == info::MEMORY_BYTES {
        return memory_bytes() as u64;
    }
    let cell = SESSION.0.borrow();
    let Some(s) = cell.as_ref() else { return 0 };
    (match field {
        info::ARENA_BYTES => s.plan.arena_bytes,
        info::LOWER_BOUND => s.plan.lower_bound,
        info::MICRO_BATCH => s.plan.graph.batch,
        info::MICRO_BATCHES => s.plan.micro_batches as usize,
        info::RECOMPUTES => s.recomputes,
        info::POLICY => return policy_code(s.policy),
        info::OVERHEAD_BYTES => s.overhead,
        info::ARENA_PAGES_BYTES => s.arena.len(),
        info::STEP_BATCH => s.batch,
        info::STEPS => s.steps as usize,
        info::EVAL_CORRECT => s.eval.0,
        info::EVAL_SAMPLES => s.eval.1,
        info::EVAL_LOSS_BITS => return s.eval.2.to_bits() as u64,
        info::SAMPLE_LEN => s.plan.graph.input_dims.numel(),
        info::PRECISION => s.precision as usize,
        _ => 0,
    }) as u64
}

/// Detail `i` (0 or 1) of the last error.
#[no_mangle]
pub extern "C" fn frugal_error_detail(i: u32) -> u64 {
    ERROR
        .0
        .borrow()
        .detail
        .get(i as usize)
        .copied()
        .unwrap_or(0)
}

/// Where the last error's message (UTF-8) starts.
#[no_mangle]
pub extern "C" fn frugal_error_message() -> u32 {
    ERROR.0.borrow().msg.as_ptr() as u32
}

/// The last error's message length in bytes.
#[no_mangle]
pub extern "C" fn frugal_error_len() -> u32 {
    ERROR.0.borrow().len as u32
}

/// Test hook: allocates and touches `bytes` bytes through the global allocator, which cannot fail
/// gracefully — past the memory limit the guest panics and traps, which is what the host's isolation
/// test needs. Returns a checksum so the work is not optimised away.
#[no_mangle]
pub extern "C" fn frugal_test_allocate(bytes: u32) -> u32 {
    let mut v: Vec<u8> = Vec::with_capacity(bytes as usize);
    v.resize(bytes as usize, 1);
    let sum = v.iter().step_by(4096).map(|&b| b as u32).sum();
    core::hint::black_box(&v);
    sum
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    let mut rec = ErrorRecord {
        status: Status::Ok,
        detail: [0; 2],
        msg: [0; 480],
        len: 0,
    };
    let _ = write!(rec, "{}", info.message());
    // SAFETY: `rec.msg[..rec.len]` is initialised UTF-8 on this stack frame for the whole call.
    unsafe { panicked(rec.msg.as_ptr(), rec.len as u32) };
    wasm32::unreachable()
}
