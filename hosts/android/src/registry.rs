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
//! - `plan_info` reads a snapshot the lock holder refreshes when it changes (a step that switched
//!   plans or resized the arena, a budget applied) and the step count, stored after every step.
//! - `destroy` removes the handle at once; a call already running on another thread finishes on its
//!   own reference and the trainer is freed when it returns.
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
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
    /// The plan info as of its last change (`steps` aside: see `steps`).
    info: Mutex<PlanInfo>,
    /// Training steps taken, stored after every step.
    steps: AtomicU32,
    /// Budget calls holding (or about to take) `trainer`'s lock for a moment to apply a budget: a
    /// trainer call that finds the lock taken by one of them waits for it instead of failing with
    /// [`Error::Busy`], which is only for two trainer calls at once.
    settling: AtomicU32,
    /// Budget calls that have started applying (only grows): with `settling`, tells whether one held
    /// the lock at the moment a trainer call found it taken.
    settles: AtomicU32,
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
        steps: AtomicU32::new(info.steps),
        trainer: Mutex::new(trainer),
        info: Mutex::new(info),
        settling: AtomicU32::new(0),
        settles: AtomicU32::new(0),
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
    /// Counts a budget call in before it may take the trainer's lock (see `settling`); it counts
    /// itself out of `settling` after letting go.
    fn enter_settle(&self) {
        self.settles.fetch_add(1, Ordering::SeqCst);
        self.settling.fetch_add(1, Ordering::SeqCst);
    }

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

    /// Refreshes what [`plan_info`] reads: the step count always (one store), the snapshot only when
    /// it changed (a plan switch, an arena resize, a budget applied), so a step that changes nothing
    /// takes no lock here.
    fn publish(&self, t: &mut Trainer) {
        self.steps.store(t.steps(), Ordering::Release);
        if let Some(info) = t.plan_info_if_changed() {
            *self.info.lock().unwrap_or_else(|e| e.into_inner()) = info;
        }
    }
}

/// Applies, while no other thread holds the trainer, a budget stored that the trainer has not
/// applied yet. Called by every lock holder after releasing the lock and by `set_budget`: if the
/// lock is held, its holder settles when it releases it.
fn settle(e: &Entry) -> Result<(), Error> {
    e.enter_settle();
    let r = settle_now(e);
    e.settling.fetch_sub(1, Ordering::SeqCst);
    r
}

/// [`settle`] within its `settling` mark.
fn settle_now(e: &Entry) -> Result<(), Error> {
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
        e.publish(&mut t);
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
        let mut t = loop {
            // A budget call counts itself in before it takes the lock and out after it lets go, so
            // if one held the lock when `try_trainer` found it taken, it was in `settling` before
            // that or had started after the first reading: wait for it then, instead of `Busy`.
            let (n1, s1) = (
                e.settling.load(Ordering::SeqCst),
                e.settles.load(Ordering::SeqCst),
            );
            match e.try_trainer() {
                Err(Error::Busy)
                    if n1 > 0
                        || e.settling.load(Ordering::SeqCst) > 0
                        || e.settles.load(Ordering::SeqCst) != s1 =>
                {
                    std::thread::yield_now()
                }
                t => break t?,
            }
        };
        let r = f(&mut t, &e);
        e.publish(&mut t);
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
    e.enter_settle();
    let settled = settle_now(&e).map(|()| {
        if let Ok(mut t) = e.try_trainer() {
            e.publish(&mut t);
        }
    });
    e.settling.fetch_sub(1, Ordering::SeqCst);
    match settled {
        Ok(()) => Ok(()),
        Err(err) => {
            // Applying it failed (out of memory): the trainer kept its plan; so does the budget.
            let _ = e
                .live
                .compare_exchange(budget, old, Ordering::AcqRel, Ordering::Acquire);
            Err(err)
        }
    }
}

/// The plan info of `h`: the plan as of the last step (a snapshot refreshed when it changes), the
/// steps taken and the budget set last; never [`Error::Busy`].
pub fn plan_info(h: u64) -> Result<PlanInfo, Error> {
    let e = lookup(h)?;
    let mut info = *e.info.lock().unwrap_or_else(|p| p.into_inner());
    info.steps = e.steps.load(Ordering::Acquire);
    // The budget asked for, even when the step in flight has not read it yet.
    let b = e.live.load(Ordering::Acquire);
    info.budget = (b != UNLIMITED).then(|| usize::try_from(b).unwrap_or(usize::MAX));
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MLP: &[u8] = include_bytes!("../../../examples/digits-mlp.frgm");
    const X: &[u8] = include_bytes!("../../../data/digits/digits-train-images.idx");
    const Y: &[u8] = include_bytes!("../../../data/digits/digits-train-labels.idx");

    /// What `plan_info` answers equals the trainer's own plan info at that moment (the snapshot is
    /// republished only on changes: a missed change shows here).
    fn matches_trainer(h: u64) -> PlanInfo {
        let snap = plan_info(h).unwrap();
        let own = with_trainer(h, |t, _| Ok(t.plan_info())).unwrap();
        assert_eq!(snap, own);
        snap
    }

    /// A trainer of the digits MLP holding the first 40 training digits.
    fn mlp_with_samples() -> u64 {
        let h = create(MLP, &[], UNLIMITED, Options::default()).unwrap();
        with_trainer(h, |t, _| {
            for i in 0..40 {
                let x: Vec<f32> = X[16 + i * 64..16 + (i + 1) * 64]
                    .iter()
                    .map(|&p| f32::from(p) / 16.0)
                    .collect();
                t.add_sample(&x, u32::from(Y[8 + i]))?;
            }
            Ok(())
        })
        .unwrap();
        h
    }

    #[test]
    fn plan_info_follows_steps_switches_and_budgets() {
        let h = mlp_with_samples();
        let first = matches_trainer(h);
        assert_eq!((first.steps, first.rung), (0, first.rungs - 1));
        assert_eq!(train_steps(h, 3, |_, _| ()).0, 3);
        assert_eq!(matches_trainer(h).steps, 3);
        set_budget(h, first.floor_bytes as u64).unwrap();
        let low = matches_trainer(h);
        assert_eq!((low.rung, low.switches), (0, 1));
        assert_eq!(low.allocated_bytes, first.floor_bytes);
        assert_eq!(low.budget, Some(first.floor_bytes));
        assert_eq!(train_steps(h, 2, |_, _| ()).0, 2);
        let after = matches_trainer(h);
        assert_eq!((after.steps, after.rung, after.switches), (5, 0, 1));
        set_budget(h, UNLIMITED).unwrap();
        let back = matches_trainer(h);
        assert_eq!(
            (back.rung, back.switches, back.budget),
            (first.rung, 2, None)
        );
        assert_eq!(back.allocated_bytes, first.allocated_bytes);
        remove(h).unwrap();
        assert!(matches!(plan_info(h), Err(Error::Handle(_))));
    }

    /// Budgets set from another thread while the training thread starts call after call never make
    /// a call fail with `Busy` (the JNI test once stalled when a `trainSteps` call started while
    /// `setBudget` held the trainer for a moment to apply its budget).
    #[test]
    fn budgets_from_another_thread_never_make_a_training_call_busy() {
        let h = mlp_with_samples();
        let floor = plan_info(h).unwrap().floor_bytes as u64;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let setter = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut k = 0u64;
                while !stop.load(Ordering::Acquire) {
                    let b = if k.is_multiple_of(2) {
                        floor
                    } else {
                        UNLIMITED
                    };
                    set_budget(h, b).unwrap();
                    k += 1;
                }
                k
            })
        };
        for _ in 0..400 {
            let (done, r) = train_steps(h, 1, |_, _| ());
            assert!(r.is_ok(), "a training call failed: {r:?}");
            assert_eq!(done, 1);
        }
        stop.store(true, Ordering::Release);
        assert!(setter.join().unwrap() > 0);
        remove(h).unwrap();
    }
}
