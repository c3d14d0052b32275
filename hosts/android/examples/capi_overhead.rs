//! The C ABI's cost per `frugal_train_steps(h, 1)` call against the same step through the Rust
//! executor (`Executor::train_step_adaptive` on the same ladder, executor and scratch made once),
//! digits MLP at batch 32, alternating rounds in one process; run by `cargo xtask android --bench`
//! (release). Prints a table and the exact command.
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use frugal::capi::*;
use frugal::trainer::{Options, Trainer, UNLIMITED};
use frugal::FrugalStatus;
use frugal_core::budget::Budget;
use frugal_core::exec::{Executor, Target};
use frugal_core::plan::Plan;

const MLP: &[u8] = include_bytes!("../../../examples/digits-mlp.frgm");
const X: &[u8] = include_bytes!("../../../data/digits/digits-train-images.idx");
const Y: &[u8] = include_bytes!("../../../data/digits/digits-train-labels.idx");

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds = 41;
    let per_round = 200;
    let x: Vec<f32> = X[16..16 + 32 * 64]
        .iter()
        .map(|&p| p as f32 / 16.0)
        .collect();
    let y: Vec<u32> = Y[8..8 + 32].iter().map(|&l| l as u32).collect();

    // The C ABI: 32 samples, so every step trains the same batch.
    let mut h = 0u64;
    let o = frugal_options_default();
    // SAFETY: valid pointers and lengths.
    let s = unsafe {
        frugal_create(
            MLP.as_ptr(),
            MLP.len(),
            std::ptr::null(),
            0,
            UNLIMITED,
            &o,
            &mut h,
        )
    };
    assert_eq!(s, FrugalStatus::Ok);
    for i in 0..32 {
        // SAFETY: 64 floats.
        assert_eq!(
            unsafe { frugal_add_sample(h, x[i * 64..].as_ptr(), 64, y[i]) },
            FrugalStatus::Ok
        );
    }

    // The executor: the same ladder, plan and scratch, made once.
    let t = Trainer::new(MLP, &[], UNLIMITED, Options::default()).unwrap();
    let table = t.table();
    let plan = &table.entries.last().unwrap().plan;
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(plan, &arena).unwrap();
    ex.init_params(&mut arena, 1).unwrap();
    ex.prepare_adaptive(table);
    let _ = AtomicU64::new(0);

    let (mut capi, mut rust) = (Vec::new(), Vec::new());
    for r in 0..rounds + 1 {
        let t0 = Instant::now();
        for _ in 0..per_round {
            let mut loss = 0f32;
            // SAFETY: one float.
            let s = unsafe { frugal_train_steps(h, 1, &mut loss, 1, std::ptr::null_mut()) };
            assert_eq!(s, FrugalStatus::Ok);
        }
        let c = t0.elapsed().as_secs_f64() * 1e6 / per_round as f64;
        let t0 = Instant::now();
        for _ in 0..per_round {
            let mut first = true;
            let mut budget_at =
                |_: usize, _: &Plan| std::mem::take(&mut first).then_some(Budget::new(usize::MAX));
            ex.train_step_adaptive(
                &mut arena,
                &x,
                Target::Classes(&y),
                table,
                &mut budget_at,
                &mut (),
            )
            .unwrap();
        }
        let rs = t0.elapsed().as_secs_f64() * 1e6 / per_round as f64;
        if r > 0 {
            // Round 0 warms both up.
            capi.push(c);
            rust.push(rs);
        }
    }
    assert_eq!(frugal_destroy(h), FrugalStatus::Ok);
    let (c, r) = (median(capi), median(rust));
    println!("\n### C-ABI overhead per train_steps(1) call: digits MLP, batch 32 (medians of {rounds} alternating rounds of {per_round} steps)\n");
    println!("| path | µs/step |\n|---|---:|");
    println!("| Rust executor (train_step_adaptive, executor and scratch made once) | {r:.2} |");
    println!("| C ABI frugal_train_steps(h, 1) | {c:.2} |");
    println!(
        "\noverhead: {:.2} µs = {:.2} % of a step (target ≤ 1 %)",
        c - r,
        100.0 * (c - r) / r
    );
    println!("command: cargo xtask android --bench");
}
