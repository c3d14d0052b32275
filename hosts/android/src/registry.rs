//! Live trainers behind handles, for the C ABI and JNI. A handle is a `u64`: the slot index + 1 in the
//! low 32 bits and the slot's generation in the high 32 bits, so 0 is never a handle and a handle
//! whose trainer was destroyed (its slot reused or not) is an error ([`Error::Handle`]), never a
//! dangling pointer. (A slot's generation wraps after 2³² reuses; a handle that old could alias.)
//!
//! Each trainer has its own lock. A call that needs the trainer (`add_sample`, `train_steps`,
//! `predict`, `export_weights`) takes it with `try_lock`: a second thread calling while the first
//! holds it gets [`Error::Busy`] at once. Three calls never wait for it:
//!
//! - `set_budget` stores the new budget in the trainer's live budget (an atomic). When the trainer
//!   is idle it then applies it at once (switching plans between steps, resizing the arena); while a
//!   `train_steps` call runs on another thread, that call's step in flight reads the atomic before
//!   its next instruction and switches plans there (the adaptive executor), and the arena shrinks
//!   when that step ends. Whoever releases the trainer lock applies a budget stored meanwhile that
//!   the last step did not see ([`settle`]), so no budget is lost.
//! - `plan_info` reads a snapshot the lock holder refreshes after every step.
//! - `destroy` removes the handle at once; a call already running on another thread finishes on its
//!   own reference and the trainer is freed when it returns.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use crate::error::Error;
use crate::trainer::{Options, PlanInfo, Trainer, UNLIMITED};

/// One live trainer.
pub struct Entry {
    /// The budget the app asked for last (`UNLIMITED`: none); read by the step in flight.
    live: AtomicU64,
    /// The budget the trainer last applied (written under `trainer`'s lock).
    applied: AtomicU64,
    /// The smallest budget any plan of the trainer's ladder fits.
    floor: usize,
    trainer: Mutex<Trainer>,
    info: Mutex<PlanInfo>,
}

struct Slot {
    generation: u32,
    entry: Option<Arc<Entry>>,
}

struct Registry {
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: usize,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    slots: Vec::new(),
    free: Vec::new(),
    live: 0,
});

fn registry() -> MutexGuard<'static, Registry> {
    // Nothing panics while the registry is locked (pushes aside), so a poisoned lock's data is whole.
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

fn split(h: u64) -> Option<(usize, u32)> {
    let idx = (h & 0xffff_ffff) as usize;
    (idx > 0).then(|| (idx - 1, (h >> 32) as u32))
}

/// The entry of handle `h`.
pub fn lookup(h: u64) -> Result<Arc<Entry>, Error> {
    let r = registry();
    let (i, g) = split(h).ok_or(Error::Handle(h))?;
    match r.slots.get(i) {
        Some(Slot {
            generation,
            entry: Some(e),
        }) if *generation == g => Ok(Arc::clone(e)),
        _ => Err(Error::Handle(h)),
    }
}

/// Trainers alive now (handles created and not destroyed).
pub fn live_count() -> usize {
    registry().live
}

/// Registers a new trainer; returns its handle.
pub fn insert(trainer: Trainer, budget: u64) -> Result<u64, Error> {
    let info = trainer.plan_info();
    let floor = info.floor_bytes;
    let entry = Arc::new(Entry {
        live: AtomicU64::new(budget),
        applied: AtomicU64::new(budget),
        floor,
        trainer: Mutex::new(trainer),
        info: Mutex::new(info),
    });
    let mut guard = registry();
    let r = &mut *guard;
    let i = match r.free.pop() {
        Some(i) => i as usize,
        None => {
            if r.slots.len() >= u32::MAX as usize - 1 {
                return Err(Error::OutOfMemory(0));
            }
            r.slots
                .try_reserve(1)
                .map_err(|_| Error::OutOfMemory(std::mem::size_of::<Slot>()))?;
            let more = r.slots.len() + 1 - r.free.len();
            r.free
                .try_reserve(more)
                .map_err(|_| Error::OutOfMemory(4))?;
            r.slots.push(Slot {
                generation: 1,
                entry: None,
            });
            r.slots.len() - 1
        }
    };
    let slot = &mut r.slots[i];
    slot.entry = Some(entry);
    let h = (u64::from(slot.generation) << 32) | (i as u64 + 1);
    r.live += 1;
    Ok(h)
}

/// Removes handle `h`: later calls with it are [`Error::Handle`]. The trainer is freed now, or
/// when a call running on another thread returns.
pub fn remove(h: u64) -> Result<(), Error> {
    let entry = {
        let mut r = registry();
        let (i, g) = split(h).ok_or(Error::Handle(h))?;
        let slot = match r.slots.get_mut(i) {
            Some(s) if s.generation == g && s.entry.is_some() => s,
            _ => return Err(Error::Handle(h)),
        };
        let e = slot.entry.take();
        // Generation 0 is skipped so that no handle's high half is ever 0 after a wrap.
        slot.generation = slot.generation.wrapping_add(1).max(1);
        r.free.push(i as u32); // reserved when the slot was made: no allocation here
        r.live -= 1;
        e
    };
    drop(entry); // outside the registry lock: freeing a trainer takes a while
    Ok(())
}

/// Creates a trainer and registers it.
pub fn create(model: &[u8], weights: &[u8], budget: u64, opts: Options) -> Result<u64, Error> {
    let t = Trainer::new(model, weights, budget, opts)?;
    insert(t, budget)
}

impl Entry {
    /// The trainer, if no other thread holds it.
    fn try_trainer(&self) -> Result<MutexGuard<'_, Trainer>, Error> {
        match self.trainer.try_lock() {
            Ok(g) => Ok(g),
            Err(TryLockError::WouldBlock) => Err(Error::Busy),
            Err(TryLockError::Poisoned(_)) => Err(Error::Panic(
                "this trainer was left inconsistent by an earlier internal error; destroy it"
                    .into(),
            )),
        }
    }

    fn publish(&self, t: &Trainer) {
        let mut info = t.plan_info();
        let b = self.live.load(Ordering::Acquire);
        info.budget = (b != UNLIMITED).then(|| usize::try_from(b).unwrap_or(usize::MAX));
        *self.info.lock().unwrap_or_else(|e| e.into_inner()) = info;
    }
}

/// Applies, while no other thread holds the trainer, a budget stored that the trainer has not
/// applied yet. Called by every lock holder after releasing the lock and by `set_budget`: if the
/// lock is held, its holder settles when it releases it.
fn settle(e: &Entry) -> Result<(), Error> {
    loop {
        let want = e.live.load(Ordering::Acquire);
        if e.applied.load(Ordering::Acquire) == want {
            return Ok(());
        }
        let mut t = match e.try_trainer() {
            Ok(t) => t,
            Err(Error::Busy) => return Ok(()),
            Err(err) => return Err(err),
        };
        t.set_budget(want)?;
        e.applied.store(want, Ordering::Release);
        e.publish(&t);
    }
}

/// Runs `f` on the trainer of `h` holding its lock ([`Error::Busy`] if another thread holds it),
/// then publishes its plan info and applies a budget stored meanwhile.
pub fn with_trainer<R>(
    h: u64,
    f: impl FnOnce(&mut Trainer, &Entry) -> Result<R, Error>,
) -> Result<R, Error> {
    let e = lookup(h)?;
    let r = {
        let mut t = e.try_trainer()?;
        let r = f(&mut t, &e);
        e.publish(&t);
        r
    };
    let s = settle(&e);
    let r = r?;
    s.map(|()| r)
}

/// Runs up to `n` steps on `h`, calling `each(i, loss)` after step `i`; returns the steps done and
/// the error that ended the call early, if any.
pub fn train_steps(h: u64, n: u32, mut each: impl FnMut(usize, f32)) -> (u32, Result<(), Error>) {
    let mut done = 0u32;
    let r = with_trainer(h, |t, e| {
        if n > crate::trainer::MAX_STEPS_PER_CALL {
            return Err(Error::Argument(
                "steps",
                format!(
                    "at most {} steps per call, got {n}",
                    crate::trainer::MAX_STEPS_PER_CALL
                ),
            ));
        }
        t.ready()?;
        for i in 0..n {
            let loss = t.train_step(&e.live)?;
            e.applied.store(t.budget(), Ordering::Release);
            done += 1;
            each(i as usize, loss);
            e.publish(t);
        }
        Ok(())
    });
    (done, r)
}

/// Sets the budget of `h` (`UNLIMITED`: none): see the module docs. A budget below the trainer's
/// smallest plan is refused ([`Error::Budget`], naming it) and changes nothing.
pub fn set_budget(h: u64, budget: u64) -> Result<(), Error> {
    let e = lookup(h)?;
    // Validated without the trainer (another thread may hold it): any budget ≥ the floor has a
    // plan in the ladder (`policy::ladder::pick`).
    let given = usize::try_from(budget).unwrap_or(usize::MAX);
    if given < e.floor {
        return Err(Error::Budget(frugal_core::BudgetError::TooSmall {
            needed: e.floor,
            given,
        }));
    }
    let old = e.live.swap(budget, Ordering::AcqRel);
    match settle(&e) {
        Ok(()) => {
            if let Ok(t) = e.try_trainer() {
                e.publish(&t);
            }
            Ok(())
        }
        Err(err) => {
            // Applying it failed (out of memory): the trainer kept its plan; so does the budget.
            let _ = e
                .live
                .compare_exchange(budget, old, Ordering::AcqRel, Ordering::Acquire);
            Err(err)
        }
    }
}

/// The plan info of `h`: the plan as of the last step (a snapshot refreshed after every step) and the
/// budget set last; never [`Error::Busy`].
pub fn plan_info(h: u64) -> Result<PlanInfo, Error> {
    let e = lookup(h)?;
    let mut info = *e.info.lock().unwrap_or_else(|p| p.into_inner());
    // The budget asked for, even when the step in flight has not read it yet.
    let b = e.live.load(Ordering::Acquire);
    info.budget = (b != UNLIMITED).then(|| usize::try_from(b).unwrap_or(usize::MAX));
    Ok(info)
}
