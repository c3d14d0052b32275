//! # frugal-firmware
//!
//! frugal training on a microcontroller, the shape of a wearable that learns its user's gestures:
//! - the **budget** is a static arena (`Board::arena` bytes, `arena_int8` with the `int8` feature, which
//!   trains in int8 from an int8 plan); the trainable weights, gradients, optimizer
//!   state and activations all live in it, at offsets the host's planner chose at build time;
//! - the **plan** (`FRGP`, with its `FRGM` model) was computed by `build.rs` with `frugal-core` for this
//!   budget and sits in flash; it is decoded at boot, without names, into a small static heap, which
//!   then receives the executor's state and is never touched again: every training step is checked to
//!   allocate nothing;
//! - a `heapless` ring buffer holds the most recent labelled samples of a stream (the bundled digits in
//!   flash stand in for a sensor); every `batch` arrivals it trains one step on them, and after each
//!   epoch it evaluates on a held-out slice;
//! - defmt logs (over semihosting) loss, accuracy, SysTick ticks per step and the RAM used; the run exits
//!   through semihosting with status 0 when the held-out accuracy reached the board's threshold and the
//!   RAM stayed within its limit.
//!
//! `unsafe` lives only in [`rt`] (board and runtime glue); the core is used exactly as on other targets.
#![no_std]
#![no_main]
#![deny(unsafe_code)]

extern crate alloc;

use alloc::boxed::Box;

mod boards;
mod rt;
mod stream;

use defmt::{error, info, Display2Format};
use defmt_semihosting as _;
#[cfg(feature = "int8")]
use frugal_core::exec::int8::Int8Executor;
#[cfg(not(feature = "int8"))]
use frugal_core::exec::Executor;
use frugal_core::exec::{ExecError, StepStats, Target};
use frugal_core::format::plan::decode_plan_unnamed;
use frugal_core::model::Precision;
use frugal_core::plan::Plan;
use heapless::Deque;

#[cfg(any(
    all(feature = "netduinoplus2", feature = "microbit"),
    all(feature = "netduinoplus2", feature = "mps2-an500"),
    all(feature = "microbit", feature = "mps2-an500")
))]
compile_error!("enable exactly one board feature: netduinoplus2, microbit or mps2-an500");
#[cfg(not(any(
    feature = "netduinoplus2",
    feature = "microbit",
    feature = "mps2-an500"
)))]
compile_error!("enable one board feature: netduinoplus2, microbit or mps2-an500");

/// The board this build is for.
#[cfg(feature = "netduinoplus2")]
pub const BOARD: boards::Board = boards::NETDUINOPLUS2;
/// The board this build is for.
#[cfg(all(feature = "microbit", not(feature = "netduinoplus2")))]
pub const BOARD: boards::Board = boards::MICROBIT;
/// The board this build is for.
#[cfg(all(
    feature = "mps2-an500",
    not(any(feature = "netduinoplus2", feature = "microbit"))
))]
pub const BOARD: boards::Board = boards::MPS2_AN500;

/// The numbers this build trains in.
pub const NUMERICS: boards::Numerics = if cfg!(feature = "int8") {
    boards::Numerics::Int8
} else {
    boards::Numerics::F32
};
/// Bytes of the static arena (the budget the baked plan was made for).
pub const ARENA: usize = BOARD.arena_for(NUMERICS);
/// Bytes of the boot heap.
pub const HEAP: usize = BOARD.heap_for(NUMERICS);

/// Samples per step (and the ring buffer's capacity).
const BATCH: usize = BOARD.batch;
/// Elements of one model input (the 8×8 digit upscaled by the board's factor).
const INPUT: usize = BOARD.input_len();
/// Steps whose loss is logged one by one (the xtask compares them with a native run).
const LOGGED_STEPS: u32 = 10;

static PLAN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/plan.frgp"));
static TRAIN_X: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/train_images.bin"));
static TRAIN_Y: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/train_labels.bin"));
static TEST_X: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/test_images.bin"));
static TEST_Y: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/test_labels.bin"));
/// Pretrained persistent tensors that live in the arena (little-endian f32, in
/// `Executor::state_tensors` order without those in the parameter image; empty when the board trains
/// from scratch). Read from flash once, into the arena.
static WEIGHTS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/weights.bin"));

/// Bytes at a 64-byte aligned address (the parameter image's f32 values are read in place).
#[cfg_attr(feature = "int8", allow(dead_code))]
#[repr(C, align(64))]
struct Aligned<T: ?Sized>(T);

/// The read-only parameter image (`frugal_core::plan::params`): the frozen parameters, read from flash
/// by every step and never copied into RAM (empty when the plan keeps them in the arena).
#[cfg_attr(feature = "int8", allow(dead_code))]
static PARAMS: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(env!("OUT_DIR"), "/params.bin")));

/// One labelled sample as the sensor delivers it.
#[derive(Clone, Copy)]
struct Sample {
    pixels: [u8; stream::PIXELS],
    label: u8,
}

fn sample(images: &[u8], labels: &[u8], i: usize) -> Sample {
    let mut pixels = [0u8; stream::PIXELS];
    pixels.copy_from_slice(&images[i * stream::PIXELS..(i + 1) * stream::PIXELS]);
    Sample {
        pixels,
        label: labels[i],
    }
}

/// The executor of this build's precision: only one is linked in (the micro:bit's 256 KiB of flash
/// hold the int8 one and the data, not both).
struct Ex<'p>(
    #[cfg(feature = "int8")] Int8Executor<'p>,
    #[cfg(not(feature = "int8"))] Executor<'p>,
);

impl<'p> Ex<'p> {
    fn new(plan: &'p Plan, arena: &[u8]) -> Result<Self, ExecError> {
        #[cfg(feature = "int8")]
        let ex = Int8Executor::new(plan, arena)?;
        #[cfg(not(feature = "int8"))]
        let ex = Executor::with_params(
            plan,
            arena,
            frugal_core::backend::CpuBackend::new(),
            &PARAMS.0,
        )?;
        Ok(Ex(ex))
    }
    fn init_params(&mut self, arena: &mut [u8], seed: u64) -> Result<(), ExecError> {
        self.0.init_params(arena, seed)
    }
    /// Loads the pretrained state from flash (f32 only: no int8 board is pretrained).
    fn load_weights(&mut self, arena: &mut [u8], bytes: &[u8]) -> Result<(), ExecError> {
        #[cfg(feature = "int8")]
        {
            let _ = (arena, bytes);
            Err(ExecError::Unsupported("pretrained weights in int8"))
        }
        #[cfg(not(feature = "int8"))]
        self.0.write_state(arena, bytes)
    }
    fn train_step(
        &mut self,
        arena: &mut [u8],
        x: &[f32],
        t: Target<'_>,
    ) -> Result<StepStats, ExecError> {
        self.0.train_step(arena, x, t)
    }
    fn evaluate(
        &mut self,
        arena: &mut [u8],
        x: &[f32],
        t: Target<'_>,
    ) -> Result<StepStats, ExecError> {
        self.0.evaluate(arena, x, t)
    }
}

#[cortex_m_rt::entry]
fn main() -> ! {
    rt::init();
    let ok = run();
    rt::exit(ok)
}

/// The whole run; true when the accuracy and RAM targets were met. Decoding and training are separate
/// frames, so the stack's peak is the larger of the two, not their sum (it matters on the micro:bit).
fn run() -> bool {
    match boot() {
        Some(plan) => train(&plan),
        None => false,
    }
}

/// Boot report, clock check and plan decoding. The plan goes to the heap, whose room after decoding
/// (decoding needs more at its peak than the plan it leaves) also holds the executor's state: they
/// cost no RAM beyond what decoding needs, and stay off the stack.
#[inline(never)]
fn boot() -> Option<Box<Plan>> {
    info!(
        "frugal-firmware on {=str} in {=str}: arena (budget) {=usize} B, heap {=usize} B, batch {=usize}, {=usize} training / {=usize} held-out samples in flash",
        BOARD.name, NUMERICS.name(), ARENA, HEAP, BATCH, BOARD.n_train, BOARD.n_test
    );
    // Clock check: `delay(n)` runs n + 1 iterations of `subs; bne`, 2(n + 1) instructions; under
    // `-icount shift=0` (1 instruction = 1 ns) that is 2(n + 1) × f / 1e9 SysTick ticks.
    let t0 = rt::ticks();
    cortex_m::asm::delay(1_000_000);
    info!(
        "clock check: cortex_m::asm::delay(1000000) (2000002 instructions) took {=u64} ticks; stack high-water before decoding: {=usize} B",
        rt::ticks() - t0,
        rt::stack_used()
    );
    let t0 = rt::ticks();
    let plan = decode()?;
    let h = rt::heap();
    info!(
        "plan decoded in {=u64} ticks: {=usize} instructions, micro-batch {=usize} x {=u16}, arena {=usize} B (lower bound {=usize} B, layout {=str}); heap {=usize} B in use, peak {=usize} B, {=u32} allocations",
        rt::ticks() - t0,
        plan.program.len(),
        plan.graph.batch,
        plan.micro_batches,
        plan.arena_bytes,
        plan.lower_bound,
        plan.strategy,
        h.in_use,
        h.peak,
        h.allocs
    );
    info!(
        "stack high-water after decoding: {=usize} B",
        rt::stack_used()
    );
    Some(plan)
}

/// The baked plan, decoded without names (the heap holds only what runs it), onto the heap. A frame of
/// its own, so the decoder's locals never add to the boot report's.
#[inline(never)]
fn decode() -> Option<Box<Plan>> {
    match decode_plan_unnamed(PLAN) {
        Ok(plan) => Some(Box::new(plan)),
        Err(e) => {
            error!("the baked plan does not decode: {}", Display2Format(&e));
            None
        }
    }
}

/// The executor, on the heap (in the room decoding left; an allocation at boot, before any step) rather
/// than in the training frame on the stack. A frame of its own, so the value built before the move
/// never adds to the training frame.
#[inline(never)]
fn executor<'p>(plan: &'p Plan, arena: &[u8]) -> Option<Box<Ex<'p>>> {
    match Ex::new(plan, arena) {
        Ok(ex) => Some(Box::new(ex)),
        Err(e) => {
            error!("{}", Display2Format(&e));
            None
        }
    }
}

/// Trains on the stream and evaluates after each epoch.
#[inline(never)]
fn train(plan: &Plan) -> bool {
    if plan.graph.input_dims.numel() != INPUT || plan.batch() != BATCH {
        error!("the plan's input or batch does not match the board's data");
        return false;
    }
    let arena = rt::arena();
    if (plan.graph.precision != Precision::F32) != (NUMERICS == boards::Numerics::Int8) {
        error!("the plan's precision is not this build's");
        return false;
    }
    let Some(mut ex) = executor(plan, arena) else {
        return false;
    };
    if let Err(e) = ex.init_params(arena, BOARD.seed) {
        error!("{}", Display2Format(&e));
        return false;
    }
    if let Some((enc, bytes)) = plan.params_space() {
        info!(
            "frozen parameters read from flash: {=usize} B parameter image ({=str}), none in the arena",
            bytes,
            match enc {
                frugal_core::plan::params::ParamEncoding::F32 => "f32",
                frugal_core::plan::params::ParamEncoding::Int8 => "int8 weights, per-channel scales",
                frugal_core::plan::params::ParamEncoding::F16 => "fp16 weights",
            }
        );
    }
    if !WEIGHTS.is_empty() {
        let t0 = rt::ticks();
        if let Err(e) = ex.load_weights(arena, WEIGHTS) {
            error!("pretrained weights: {}", Display2Format(&e));
            return false;
        }
        info!(
            "pretrained weights: {=usize} B copied from flash into the arena in {=u64} ticks",
            WEIGHTS.len(),
            rt::ticks() - t0
        );
    }

    let allocs_before = rt::heap().allocs;
    let mut ring: Deque<Sample, BATCH> = Deque::new();
    let mut x = [0f32; BATCH * INPUT];
    let mut y = [0u32; BATCH];
    let steps = stream::steps_per_epoch(BOARD.n_train, BATCH);
    let mut step: u32 = 0;
    let mut accuracy_pct = 0;
    let mut train_ticks = 0u64;
    for epoch in 0..BOARD.epochs {
        let (mut loss_sum, mut seen, mut correct) = (0f32, 0usize, 0usize);
        for _ in 0..steps {
            // The sensor delivers `BATCH` new samples; the ring keeps the most recent ones.
            for j in 0..BATCH {
                let k = step as usize * BATCH + j;
                let i = stream::sample_at(k, BOARD.n_train);
                if ring.is_full() {
                    ring.pop_front();
                }
                let _ = ring.push_back(sample(TRAIN_X, TRAIN_Y, i));
            }
            for (j, s) in ring.iter().enumerate() {
                stream::input(&s.pixels, BOARD.upscale, &mut x[j * INPUT..(j + 1) * INPUT]);
                y[j] = s.label as u32;
            }
            let t = rt::ticks();
            let stats = match ex.train_step(arena, &x, Target::Classes(&y)) {
                Ok(s) => s,
                Err(e) => {
                    error!("step {=u32}: {}", step, Display2Format(&e));
                    return false;
                }
            };
            let dt = rt::ticks() - t;
            train_ticks += dt;
            if step == 0 {
                info!(
                    "stack high-water after the first step: {=usize} B",
                    rt::stack_used()
                );
            }
            if step < LOGGED_STEPS {
                info!(
                    "step {=u32} loss {=f32} bits {=u32:#x} ticks {=u64}",
                    step,
                    stats.loss,
                    stats.loss.to_bits(),
                    dt
                );
            }
            loss_sum += stats.loss * stats.samples as f32;
            seen += stats.samples;
            correct += stats.correct;
            step += 1;
        }
        // Held-out accuracy, one planned micro-batch at a time.
        let (mut right, mut total) = (0usize, 0usize);
        let mb = plan.graph.batch;
        let mut i = 0;
        while i < BOARD.n_test {
            let n = mb.min(BOARD.n_test - i);
            for j in 0..n {
                let s = sample(TEST_X, TEST_Y, i + j);
                stream::input(&s.pixels, BOARD.upscale, &mut x[j * INPUT..(j + 1) * INPUT]);
                y[j] = s.label as u32;
            }
            match ex.evaluate(arena, &x[..n * INPUT], Target::Classes(&y[..n])) {
                Ok(s) => right += s.correct,
                Err(e) => {
                    error!("evaluate: {}", Display2Format(&e));
                    return false;
                }
            }
            total += n;
            i += n;
        }
        let allocs = rt::heap().allocs - allocs_before;
        accuracy_pct = right * 100 / total;
        info!(
            "epoch {=usize}: train loss {=f32}, train accuracy {=usize}/{=usize}, held-out accuracy {=usize}/{=usize} ({=usize}%), {=u64} ticks/step, heap allocations since boot decoding {=u32}",
            epoch,
            loss_sum / seen as f32,
            correct,
            seen,
            right,
            total,
            accuracy_pct,
            train_ticks / step as u64,
            allocs
        );
        if allocs != 0 {
            error!("training or evaluation allocated on the heap");
            return false;
        }
    }
    let statics = rt::statics_bytes();
    let stack = rt::stack_used();
    let ram = statics + stack;
    info!(
        "ticks per training step {=u64} at {=u64} Hz core clock; RAM: statics {=usize} B (arena {=usize}, heap {=usize}) + stack high-water {=usize} B = {=usize} B of limit {=usize} B",
        train_ticks / step.max(1) as u64,
        BOARD.sysclk_hz,
        statics,
        ARENA,
        HEAP,
        stack,
        ram,
        BOARD.ram_limit
    );
    let ok = accuracy_pct >= BOARD.threshold_pct && ram <= BOARD.ram_limit;
    info!(
        "result: held-out accuracy {=usize}% (threshold {=usize}%), RAM {=usize} B (limit {=usize} B): {=str}",
        accuracy_pct,
        BOARD.threshold_pct,
        ram,
        BOARD.ram_limit,
        if ok { "PASS" } else { "FAIL" }
    );
    ok
}
