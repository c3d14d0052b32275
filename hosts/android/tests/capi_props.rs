//! Random argument combinations and call sequences thrown at the C ABI, in process: every call
//! returns one of the documented codes (the expected one where the arguments decide it), nothing
//! panics across the boundary or crashes, and after each sequence destroys its trainers the live
//! trainer count is back to zero and this thread's heap bytes are back where they were.
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use frugal::capi::*;
use frugal::FrugalStatus as S;
use proptest::prelude::*;

/// Counts the bytes this thread has allocated and not freed.
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the counter is a const-initialised thread-local Cell
// (no allocation, no destructor), so counting cannot recurse into the allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = LIVE.try_with(|c| c.set(c.get() + l.size() as isize));
        // SAFETY: the caller's contract, unchanged.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        let _ = LIVE.try_with(|c| c.set(c.get() - l.size() as isize));
        // SAFETY: the caller's contract, unchanged.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let _ = LIVE.try_with(|c| c.set(c.get() + new as isize - l.size() as isize));
        // SAFETY: the caller's contract, unchanged.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

const MLP: &[u8] = include_bytes!("../../../examples/digits-mlp.frgm");

#[derive(Clone, Debug)]
enum Op {
    Create {
        model_cut: usize,
        budget: u64,
        batch: u32,
        null_out: bool,
    },
    AddSample {
        who: usize,
        len: usize,
        label: u32,
        nan: bool,
        null: bool,
    },
    Train {
        who: usize,
        steps: u32,
        losses_len: usize,
    },
    Predict {
        who: usize,
        samples: usize,
        out_len: usize,
    },
    SetBudget {
        who: usize,
        budget: u64,
    },
    Info {
        who: usize,
        null: bool,
    },
    Export {
        who: usize,
        buf_len: usize,
    },
    Destroy {
        who: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let budget = prop_oneof![
        Just(FRUGAL_BUDGET_UNLIMITED),
        0u64..400_000,
        Just(301_375u64),
        Just(1u64 << 20)
    ];
    prop_oneof![
        (0usize..3, budget.clone(), 0u32..70, any::<bool>()).prop_map(|(m, budget, batch, n)| {
            Op::Create {
                model_cut: m,
                budget,
                batch,
                null_out: n && batch % 7 == 0,
            }
        }),
        (
            0usize..6,
            prop_oneof![Just(64usize), 0usize..130],
            0u32..12,
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(who, len, label, nan, null)| Op::AddSample {
                who,
                len,
                label,
                nan: nan && label % 3 == 0,
                null: null && label % 4 == 0
            }),
        (0usize..6, 0u32..4, 0usize..5).prop_map(|(who, steps, losses_len)| Op::Train {
            who,
            steps,
            losses_len
        }),
        (0usize..6, 0usize..4, 0usize..45).prop_map(|(who, samples, out_len)| Op::Predict {
            who,
            samples,
            out_len
        }),
        (0usize..6, budget).prop_map(|(who, budget)| Op::SetBudget { who, budget }),
        (0usize..6, any::<bool>()).prop_map(|(who, null)| Op::Info { who, null }),
        (0usize..6, prop_oneof![Just(0usize), 0usize..200_000])
            .prop_map(|(who, buf_len)| Op::Export { who, buf_len }),
        (0usize..6).prop_map(|who| Op::Destroy { who }),
    ]
}

/// Handles the sequence may use: live ones, destroyed ones and made-up ones.
struct World {
    live: Vec<u64>,
    dead: Vec<u64>,
    samples: Vec<usize>,
}

impl World {
    /// Handle `who`: a live one when there is one to pick, else a dead or made-up one.
    fn pick(&self, who: usize) -> (u64, Option<usize>) {
        if who < self.live.len() {
            (self.live[who], Some(who))
        } else if let Some(&d) = self.dead.get(who % self.dead.len().max(1)) {
            (d, None)
        } else {
            ((who as u64) << 33 | 7, None)
        }
    }
}

fn run(ops: &[Op]) {
    let x = [0.25f32; 4 * 64];
    let mut out = vec![0f32; 64];
    let mut buf = vec![0u8; 200_000];
    let mut w = World {
        live: Vec::new(),
        dead: Vec::new(),
        samples: Vec::new(),
    };
    for op in ops {
        match *op {
            Op::Create {
                model_cut,
                budget,
                batch,
                null_out,
            } => {
                let model = &MLP[..MLP.len() - model_cut];
                let mut o = frugal_options_default();
                o.batch = batch;
                let mut h = 0u64;
                let outp = if null_out {
                    std::ptr::null_mut()
                } else {
                    &mut h as *mut u64
                };
                // SAFETY: the pointers are valid for the lengths given (or NULL).
                let s = unsafe {
                    frugal_create(
                        model.as_ptr(),
                        model.len(),
                        std::ptr::null(),
                        0,
                        budget,
                        &o,
                        outp,
                    )
                };
                let want = if null_out {
                    S::NullPointer
                } else if model_cut > 0 {
                    S::Model
                } else if batch == 0 || batch > 4096 {
                    S::Argument
                } else {
                    // The budget decides: Ok or Budget.
                    if s == S::Ok {
                        S::Ok
                    } else {
                        S::Budget
                    }
                };
                assert_eq!(s, want, "{op:?}");
                if s == S::Ok {
                    assert_ne!(h, 0);
                    w.live.push(h);
                    w.samples.push(0);
                } else {
                    assert_eq!(h, 0, "a failed create leaves 0");
                }
            }
            Op::AddSample {
                who,
                len,
                label,
                nan,
                null,
            } => {
                let (h, i) = w.pick(who);
                let mut v = x[..len.min(x.len())].to_vec();
                if nan && !v.is_empty() {
                    v[0] = f32::NAN;
                }
                let p = if null { std::ptr::null() } else { v.as_ptr() };
                // SAFETY: `p` is NULL or valid for `v.len()` floats.
                let s = unsafe { frugal_add_sample(h, p, v.len(), label) };
                let want = match i {
                    _ if null && !v.is_empty() => S::NullPointer,
                    None => S::Handle,
                    Some(_) if v.len() != 64 || label > 9 || nan => S::Argument,
                    Some(_) => S::Ok,
                };
                assert_eq!(s, want, "{op:?}");
                if let (S::Ok, Some(i)) = (s, i) {
                    w.samples[i] += 1;
                }
            }
            Op::Train {
                who,
                steps,
                losses_len,
            } => {
                let (h, i) = w.pick(who);
                let mut l = vec![0f32; losses_len];
                let mut done = 0u32;
                // SAFETY: `l` holds `losses_len` floats; `done` is writable.
                let s = unsafe { frugal_train_steps(h, steps, l.as_mut_ptr(), l.len(), &mut done) };
                let want = match i {
                    _ if losses_len > 0 && losses_len < steps as usize => S::BufferTooSmall,
                    None => S::Handle,
                    Some(i) if w.samples[i] == 0 => S::Argument,
                    Some(_) => S::Ok,
                };
                assert_eq!(s, want, "{op:?}");
                assert_eq!(done, if s == S::Ok { steps } else { 0 });
            }
            Op::Predict {
                who,
                samples,
                out_len,
            } => {
                let (h, i) = w.pick(who);
                // SAFETY: `x` holds 4 × 64 floats, `out` 64.
                let s = unsafe {
                    frugal_predict(h, x.as_ptr(), samples * 64, out.as_mut_ptr(), out_len)
                };
                let want = match i {
                    _ if samples == 0 && out_len > 0 => S::Argument, // 0 values (after the handle)
                    None => S::Handle,
                    Some(_) if samples == 0 || out_len != samples * 10 => S::Argument,
                    Some(_) => S::Ok,
                };
                if i.is_none() {
                    assert_eq!(s, S::Handle, "{op:?}");
                } else {
                    assert_eq!(s, want, "{op:?}");
                }
            }
            Op::SetBudget { who, budget } => {
                let (h, i) = w.pick(who);
                let s = frugal_set_budget(h, budget);
                let needed = frugal_last_error_needed_bytes();
                match i {
                    None => assert_eq!(s, S::Handle),
                    Some(_) => {
                        let mut p = FrugalPlanInfo::default();
                        // SAFETY: `p` is writable.
                        assert_eq!(unsafe { frugal_plan_info(h, &mut p) }, S::Ok);
                        if budget < p.floor_bytes {
                            assert_eq!(s, S::Budget, "{op:?}");
                            assert_eq!(needed, p.floor_bytes);
                        } else {
                            assert_eq!(s, S::Ok, "{op:?}");
                            assert_eq!(p.budget, budget);
                            assert!(p.allocated_bytes <= budget, "{p:?}");
                        }
                    }
                }
            }
            Op::Info { who, null } => {
                let (h, i) = w.pick(who);
                let mut p = FrugalPlanInfo::default();
                let ptr = if null {
                    std::ptr::null_mut()
                } else {
                    &mut p as *mut _
                };
                // SAFETY: NULL or writable.
                let s = unsafe { frugal_plan_info(h, ptr) };
                let want = match i {
                    None => S::Handle,
                    Some(_) if null => S::NullPointer,
                    Some(_) => S::Ok,
                };
                assert_eq!(s, want, "{op:?}");
            }
            Op::Export { who, buf_len } => {
                let (h, i) = w.pick(who);
                let mut n = 0usize;
                // SAFETY: `buf` holds 200,000 bytes ≥ buf_len.
                let s = unsafe { frugal_export_weights(h, buf.as_mut_ptr(), buf_len, &mut n) };
                match i {
                    None => assert_eq!(s, S::Handle),
                    Some(_) => {
                        assert!(n > 0);
                        let want = if buf_len == 0 || buf_len >= n {
                            S::Ok
                        } else {
                            S::BufferTooSmall
                        };
                        assert_eq!(s, want, "{op:?} needs {n}");
                    }
                }
            }
            Op::Destroy { who } => {
                let (h, i) = w.pick(who);
                let s = frugal_destroy(h);
                match i {
                    None => assert_eq!(s, S::Handle),
                    Some(i) => {
                        assert_eq!(s, S::Ok);
                        w.live.remove(i);
                        w.samples.remove(i);
                        w.dead.push(h);
                    }
                }
            }
        }
        // Every failure leaves a message; every success clears it.
        // SAFETY: the pointer is to this thread's NUL-terminated buffer.
        let msg = unsafe { std::ffi::CStr::from_ptr(frugal_last_error()) };
        assert!(msg.to_str().is_ok(), "the message is UTF-8");
    }
    for h in w.live.drain(..) {
        assert_eq!(frugal_destroy(h), S::Ok);
    }
}

fn live_bytes() -> isize {
    LIVE.with(Cell::get)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn random_call_sequences_return_the_documented_codes_and_leak_nothing(
        ops in proptest::collection::vec(op(), 1..40)
    ) {
        // Warm the registry's slot table and this thread's buffers once, then measure.
        run(&ops);
        let before = live_bytes();
        run(&ops);
        prop_assert_eq!(frugal_live_trainers(), 0);
        prop_assert_eq!(live_bytes(), before, "heap bytes of this thread after a repeated sequence");
    }
}
