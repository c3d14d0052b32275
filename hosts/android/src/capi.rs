//! The C ABI (`include/frugal.h`, generated from this file by cbindgen). Every function returns a
//! [`FrugalStatus`] (0: success) and sets the calling thread's last-error message
//! ([`frugal_last_error`]); every body runs inside `catch_unwind`, so no panic crosses into C.
//!
//! Pointer arguments: a NULL pointer where one is required is `FRUGAL_STATUS_NULL_POINTER`; a
//! pointer with a length may be NULL when the length is 0; a misaligned pointer or a length whose
//! bytes overflow the address space is `FRUGAL_STATUS_ARGUMENT`. A non-NULL pointer must be valid for
//! the length given (C cannot tell a lying length; nothing here can check it).
//!
//! Trainers are named by handles (`FrugalTrainer`, a `uint64_t`; 0 is never one); a destroyed or
//! made-up handle is `FRUGAL_STATUS_HANDLE`, and a trainer busy in another thread's call is
//! `FRUGAL_STATUS_BUSY` (see [`crate::registry`]: `set_budget`, `plan_info` and `destroy` never
//! are). A budget is in bytes; `FRUGAL_BUDGET_UNLIMITED` means no limit.
use std::cell::{Cell, RefCell};
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::error::{Error, FrugalStatus};
use crate::memory::{budget_for, FrugalMemorySignal};
use crate::registry;
use crate::trainer::{Options, PlanInfo, UNLIMITED};

/// A trainer handle (0 is never a valid one).
pub type FrugalTrainer = u64;

/// The budget meaning "no limit".
pub const FRUGAL_BUDGET_UNLIMITED: u64 = u64::MAX;
/// `FrugalOptions.flags`: `seed` is set (else the model's own seed is used).
pub const FRUGAL_OPTION_SEED: u32 = 1;
/// The version of this ABI (incremented on any incompatible change).
pub const FRUGAL_ABI_VERSION: u32 = 1;
/// Bytes of the last-error buffer, NUL included (longer messages are cut at a character boundary).
pub const FRUGAL_ERROR_CAPACITY: usize = 512;

/// How to create a trainer; fill with [`frugal_options_default`] and change what you need.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrugalOptions {
    /// `sizeof(FrugalOptions)`: a mismatch (another version of the header) is an argument error.
    pub size: u32,
    /// Samples per training step, 1 to 4096 (default 32).
    pub batch: u32,
    /// Resize the model's last (linear) layer to this many classes; 0 keeps the model's.
    pub classes: u32,
    /// `FRUGAL_OPTION_SEED` or 0.
    pub flags: u32,
    /// The initialisation seed, used when `flags` has `FRUGAL_OPTION_SEED`.
    pub seed: u64,
}

/// The plan a trainer runs now ([`frugal_plan_info`]). Sizes are in bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrugalPlanInfo {
    /// Bytes of the plan's arena.
    pub arena_bytes: u64,
    /// Bytes allocated for it (arena plus alignment slack); never above the budget.
    pub allocated_bytes: u64,
    /// Most bytes live at any one moment of a step: no layout of this plan can use less.
    pub lower_bound: u64,
    /// The smallest budget the trainer accepts (its smallest plan).
    pub floor_bytes: u64,
    /// The budget set last (`FRUGAL_BUDGET_UNLIMITED`: none).
    pub budget: u64,
    /// Plan switches so far: mid-step, at a step's start or end, and between calls.
    pub switches: u64,
    /// Of those, switches made while a step was in flight (after its first instruction).
    pub mid_step_switches: u64,
    /// Samples per micro-batch.
    pub micro_batch: u32,
    /// Micro-batches per step.
    pub micro_batches: u32,
    /// Forward instructions re-run during backward, per step.
    pub recomputes: u32,
    /// This plan's rung in the trainer's ladder of plans (0: the smallest).
    pub rung: u32,
    /// Rungs in the ladder.
    pub rungs: u32,
    /// Training steps taken.
    pub steps: u32,
}

impl From<PlanInfo> for FrugalPlanInfo {
    fn from(p: PlanInfo) -> Self {
        let u = |v: usize| v as u64;
        let w = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        FrugalPlanInfo {
            arena_bytes: u(p.arena_bytes),
            allocated_bytes: u(p.allocated_bytes),
            lower_bound: u(p.lower_bound),
            floor_bytes: u(p.floor_bytes),
            budget: p.budget.map_or(UNLIMITED, u),
            switches: p.switches,
            mid_step_switches: p.mid_step_switches,
            micro_batch: w(p.micro_batch),
            micro_batches: w(p.micro_batches),
            recomputes: w(p.recomputes),
            rung: w(p.rung),
            rungs: w(p.rungs),
            steps: p.steps,
        }
    }
}

thread_local! {
    /// The last error's message, NUL-terminated (no heap: a fixed buffer per thread).
    static LAST_ERROR: RefCell<[u8; FRUGAL_ERROR_CAPACITY]> =
        const { RefCell::new([0; FRUGAL_ERROR_CAPACITY]) };
    static LAST_NEEDED: Cell<u64> = const { Cell::new(0) };
}

/// Records `e` as this thread's last error (`None`: clears it).
pub(crate) fn set_last_error(e: Option<&Error>) {
    use std::io::Write;
    LAST_ERROR.with(|b| {
        let mut b = b.borrow_mut();
        let cap = b.len() - 1;
        let mut w = &mut b[..cap];
        if let Some(e) = e {
            // Writing past the buffer stops the write; the message is cut there.
            let _ = write!(w, "{e}");
        }
        let mut n = cap - w.len();
        // Cut at a UTF-8 character boundary.
        while n > 0 && std::str::from_utf8(&b[..n]).is_err() {
            n -= 1;
        }
        b[n] = 0;
    });
    LAST_NEEDED.with(|c| c.set(e.and_then(Error::needed_bytes).map_or(0, |n| n as u64)));
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Runs `f` with panics caught; records the outcome as the thread's last error.
pub(crate) fn guard(f: impl FnOnce() -> Result<(), Error>) -> FrugalStatus {
    let r = catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(Error::Panic(panic_message(p.as_ref()))));
    match r {
        Ok(()) => {
            set_last_error(None);
            FrugalStatus::Ok
        }
        Err(e) => {
            set_last_error(Some(&e));
            e.status()
        }
    }
}

/// `len` elements at `p` as a slice: NULL only with length 0, aligned, not overflowing.
///
/// # Safety
/// A non-NULL `p` must be valid for reads of `len` elements for `'a`.
unsafe fn input<'a, T>(p: *const T, len: usize, name: &'static str) -> Result<&'a [T], Error> {
    if len == 0 {
        return Ok(&[]);
    }
    check_ptr(p, len, name)?;
    // SAFETY: non-NULL, aligned, `len × size_of::<T>()` fits in isize (checked above); the caller
    // promises `len` readable elements for 'a.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// As [`input`], for writing.
///
/// # Safety
/// A non-NULL `p` must be valid for writes of `len` elements for `'a`, and not aliased.
unsafe fn output<'a, T>(p: *mut T, len: usize, name: &'static str) -> Result<&'a mut [T], Error> {
    if len == 0 {
        return Ok(&mut []);
    }
    check_ptr(p, len, name)?;
    // SAFETY: as in `input`, and the caller promises exclusive writable elements for 'a.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

fn check_ptr<T>(p: *const T, len: usize, name: &'static str) -> Result<(), Error> {
    if p.is_null() {
        return Err(Error::Null(name));
    }
    if !p.is_aligned() {
        return Err(Error::Argument(
            name,
            format!("is not aligned to {} bytes", std::mem::align_of::<T>()),
        ));
    }
    if len > isize::MAX as usize / std::mem::size_of::<T>().max(1) {
        return Err(Error::Argument(
            name,
            format!("length {len} overflows the address space"),
        ));
    }
    Ok(())
}

/// Writes `v` through an out-pointer that must not be NULL.
///
/// # Safety
/// A non-NULL `p` must be valid for a write of one `T`.
unsafe fn put<T>(p: *mut T, v: T, name: &'static str) -> Result<(), Error> {
    check_ptr(p, 1, name)?;
    // SAFETY: non-NULL and aligned (checked); the caller promises it is writable.
    unsafe { p.write(v) };
    Ok(())
}

/// The default options: batch 32, the model's classes and seed.
#[no_mangle]
pub extern "C" fn frugal_options_default() -> FrugalOptions {
    FrugalOptions {
        size: std::mem::size_of::<FrugalOptions>() as u32,
        batch: 32,
        classes: 0,
        flags: 0,
        seed: 0,
    }
}

/// The ABI version (`FRUGAL_ABI_VERSION` of the library, to compare with the header's).
#[no_mangle]
pub extern "C" fn frugal_abi_version() -> u32 {
    FRUGAL_ABI_VERSION
}

fn options(o: &FrugalOptions) -> Result<Options, Error> {
    if o.size as usize != std::mem::size_of::<FrugalOptions>() {
        return Err(Error::Argument(
            "options.size",
            format!(
                "is {} but this library's FrugalOptions has {} bytes (header and library differ)",
                o.size,
                std::mem::size_of::<FrugalOptions>()
            ),
        ));
    }
    if o.flags & !FRUGAL_OPTION_SEED != 0 {
        return Err(Error::Argument(
            "options.flags",
            format!("unknown bits {:#x}", o.flags & !FRUGAL_OPTION_SEED),
        ));
    }
    Ok(Options {
        batch: o.batch as usize,
        seed: (o.flags & FRUGAL_OPTION_SEED != 0).then_some(o.seed),
        classes: (o.classes != 0).then_some(o.classes),
    })
}

/// Creates a trainer for the binary model `model` (a `.frgm` file's bytes) within `budget` bytes,
/// loading the safetensors `weights` by name over the seeded initialisation (`weights_len` 0: none).
/// `options` may be NULL (the defaults). On success `*out` is the new handle; on failure it is 0.
///
/// # Safety
/// `model`/`weights` must be readable for their lengths; `options` NULL or a valid `FrugalOptions`;
/// `out` writable.
#[no_mangle]
pub unsafe extern "C" fn frugal_create(
    model: *const u8,
    model_len: usize,
    weights: *const u8,
    weights_len: usize,
    budget: u64,
    options: *const FrugalOptions,
    out: *mut FrugalTrainer,
) -> FrugalStatus {
    guard(|| {
        // SAFETY: the caller's contract on `out`.
        unsafe { put(out, 0, "out") }?;
        // SAFETY: the caller's contract on `model` and `weights`.
        let model = unsafe { input(model, model_len, "model") }?;
        // SAFETY: as above.
        let weights = unsafe { input(weights, weights_len, "weights") }?;
        if model.is_empty() {
            return Err(Error::Argument("model", "is empty".into()));
        }
        let opts = if options.is_null() {
            Options::default()
        } else {
            // SAFETY: non-NULL; the caller's contract makes it a readable FrugalOptions.
            let o = unsafe { input(options, 1, "options") }?;
            self::options(&o[0])?
        };
        let h = registry::create(model, weights, budget, opts)?;
        // SAFETY: checked writable above.
        unsafe { put(out, h, "out") }
    })
}

/// Adds one training sample: `len` floats (the model's input size, finite) and a class label.
///
/// # Safety
/// `x` readable for `len` floats.
#[no_mangle]
pub unsafe extern "C" fn frugal_add_sample(
    trainer: FrugalTrainer,
    x: *const f32,
    len: usize,
    label: u32,
) -> FrugalStatus {
    guard(|| {
        // SAFETY: the caller's contract on `x`.
        let x = unsafe { input(x, len, "x") }?;
        registry::with_trainer(trainer, |t, _| t.add_sample(x, label))
    })
}

/// Forgets the samples added so far (the weights stay).
#[no_mangle]
pub extern "C" fn frugal_clear_samples(trainer: FrugalTrainer) -> FrugalStatus {
    guard(|| {
        registry::with_trainer(trainer, |t, _| {
            t.clear_samples();
            Ok(())
        })
    })
}

/// Runs `steps` training steps. Their mean losses go to `losses` (NULL with `losses_len` 0: not
/// wanted; else `losses_len` ≥ `steps`), the number of steps done to `*done` (may be NULL). A failing
/// step ends the call; the steps before it stand. The budget is read before every instruction: a
/// `frugal_set_budget` from another thread takes effect in the step in flight.
///
/// # Safety
/// `losses` writable for `losses_len` floats; `done` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn frugal_train_steps(
    trainer: FrugalTrainer,
    steps: u32,
    losses: *mut f32,
    losses_len: usize,
    done: *mut u32,
) -> FrugalStatus {
    guard(|| {
        if !done.is_null() {
            // SAFETY: the caller's contract on `done`.
            unsafe { put(done, 0, "done") }?;
        }
        // SAFETY: the caller's contract on `losses`.
        let out = unsafe { output(losses, losses_len, "losses") }?;
        if !out.is_empty() && out.len() < steps as usize {
            return Err(Error::BufferTooSmall {
                needed: steps as usize,
                given: out.len(),
            });
        }
        let (n, r) = registry::train_steps(trainer, steps, |i, loss| {
            if let Some(l) = out.get_mut(i) {
                *l = loss;
            }
        });
        if !done.is_null() {
            // SAFETY: as above.
            unsafe { put(done, n, "done") }?;
        }
        r
    })
}

/// Class probabilities for `len / input_size` samples laid end to end, written to `out`
/// (`out_len` = samples × classes).
///
/// # Safety
/// `x` readable for `len` floats, `out` writable for `out_len` floats.
#[no_mangle]
pub unsafe extern "C" fn frugal_predict(
    trainer: FrugalTrainer,
    x: *const f32,
    len: usize,
    out: *mut f32,
    out_len: usize,
) -> FrugalStatus {
    guard(|| {
        // SAFETY: the caller's contract on `x`.
        let x = unsafe { input(x, len, "x") }?;
        // SAFETY: the caller's contract on `out`.
        let out = unsafe { output(out, out_len, "out") }?;
        registry::with_trainer(trainer, |t, _| t.predict_into(x, out))
    })
}

/// Sets the budget in bytes (`FRUGAL_BUDGET_UNLIMITED`: none). Applied at once when the trainer is
/// idle; while `frugal_train_steps` runs on another thread, its step in flight switches plans before
/// its next instruction and gives the bytes back when that step ends. A budget below the trainer's
/// smallest plan is `FRUGAL_STATUS_BUDGET` (`frugal_last_error_needed_bytes()` names the smallest
/// that works) and changes nothing. Never `FRUGAL_STATUS_BUSY`.
#[no_mangle]
pub extern "C" fn frugal_set_budget(trainer: FrugalTrainer, budget: u64) -> FrugalStatus {
    guard(|| registry::set_budget(trainer, budget))
}

/// The plan the trainer runs now (never `FRUGAL_STATUS_BUSY`: a snapshot refreshed every step).
///
/// # Safety
/// `out` writable.
#[no_mangle]
pub unsafe extern "C" fn frugal_plan_info(
    trainer: FrugalTrainer,
    out: *mut FrugalPlanInfo,
) -> FrugalStatus {
    guard(|| {
        let info = FrugalPlanInfo::from(registry::plan_info(trainer)?);
        // SAFETY: the caller's contract on `out`.
        unsafe { put(out, info, "out") }
    })
}

/// The weights as F32 safetensors bytes. `*written` gets their length; when `buf` is NULL (with
/// `buf_len` 0) that is all it does, and when `buf_len` is smaller the call is
/// `FRUGAL_STATUS_BUFFER_TOO_SMALL` (nothing copied).
///
/// # Safety
/// `buf` writable for `buf_len` bytes; `written` writable.
#[no_mangle]
pub unsafe extern "C" fn frugal_export_weights(
    trainer: FrugalTrainer,
    buf: *mut u8,
    buf_len: usize,
    written: *mut usize,
) -> FrugalStatus {
    guard(|| {
        // SAFETY: the caller's contract on `written`.
        unsafe { put(written, 0, "written") }?;
        // SAFETY: the caller's contract on `buf`.
        let buf = unsafe { output(buf, buf_len, "buf") }?;
        let bytes = registry::with_trainer(trainer, |t, _| t.export_weights())?;
        // SAFETY: checked writable above.
        unsafe { put(written, bytes.len(), "written") }?;
        if buf.is_empty() {
            return Ok(());
        }
        let dst = buf.get_mut(..bytes.len()).ok_or(Error::BufferTooSmall {
            needed: bytes.len(),
            given: buf_len,
        })?;
        dst.copy_from_slice(&bytes);
        Ok(())
    })
}

/// Destroys the trainer: the handle is invalid from now on. A call running on another thread
/// finishes first on its own; the memory is freed when it returns.
#[no_mangle]
pub extern "C" fn frugal_destroy(trainer: FrugalTrainer) -> FrugalStatus {
    guard(|| registry::remove(trainer))
}

/// Trainers alive in this process (created and not destroyed).
#[no_mangle]
pub extern "C" fn frugal_live_trainers() -> usize {
    catch_unwind(registry::live_count).unwrap_or(0)
}

/// The budget Android's memory signals call for, under the policy documented at
/// `FrugalMemorySignal`; never below `floor`, so it can always be given to `frugal_set_budget`.
///
/// # Safety
/// `signal` readable; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn frugal_budget_for_memory(
    signal: *const FrugalMemorySignal,
    out: *mut u64,
) -> FrugalStatus {
    guard(|| {
        // SAFETY: the caller's contract on `signal`.
        let s = unsafe { input(signal, 1, "signal") }?;
        // SAFETY: the caller's contract on `out`.
        unsafe { put(out, budget_for(&s[0]), "out") }
    })
}

/// The message of this thread's last call that failed, NUL-terminated; "" after a call that
/// succeeded. Valid until this thread's next frugal call.
#[no_mangle]
pub extern "C" fn frugal_last_error() -> *const c_char {
    // The buffer is thread-local static storage: the pointer stays valid while the thread lives.
    LAST_ERROR.with(|b| b.as_ptr() as *const c_char)
}

/// For a `FRUGAL_STATUS_BUDGET` failure on this thread, the smallest budget that works; else 0.
#[no_mangle]
pub extern "C" fn frugal_last_error_needed_bytes() -> u64 {
    LAST_NEEDED.with(Cell::get)
}
