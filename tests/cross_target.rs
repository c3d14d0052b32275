//! The cross-target reference run: the same model, data and seed must give the same losses natively, in
//! wasmtime (`hosts/wasmtime`) and in Chromium (`wasm/`, `web-demo/`). This test pins the native losses in
//! `tests/golden/cross_target_mlp.json`, which the other targets' tests compare against.
//!
//! The run: `examples/digits-mlp.toml` (Adam, lr 0.003), `Executor::init_params(seed 1)`, the plain plan at
//! batch 32, step `i` on training samples `[32·i, 32·i + 32)` of the bundled digits in file order, 20 steps.
//! Regenerate with `FRUGAL_BLESS=1 cargo test -p frugal-tests --test cross_target`.
use std::path::PathBuf;

use frugal_cli::spec_toml::load_model;
use frugal_core::exec::{Executor, Target};
use frugal_core::graph::Graph;
use frugal_core::plan::Plan;

/// Steps, batch and seed of the reference run.
const STEPS: usize = 20;
const BATCH: usize = 32;
const SEED: u64 = 1;

fn native_losses() -> Vec<f32> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let m = load_model(&root.join("examples/digits-mlp.toml")).unwrap();
    let plan = Plan::new(Graph::new(&m.spec, BATCH).unwrap());
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(&plan, &arena).unwrap();
    ex.init_params(&mut arena, SEED).unwrap();
    let (train, _) = frugal_cli::data::digits();
    let per = m.spec.input.numel();
    let mut x = vec![0f32; BATCH * per];
    let mut y = vec![0u32; BATCH];
    (0..STEPS)
        .map(|i| {
            let idx: Vec<usize> = (i * BATCH..(i + 1) * BATCH).collect();
            train.batch(&idx, &mut x, &mut y);
            ex.train_step(&mut arena, &x, Target::Classes(&y))
                .unwrap()
                .loss
        })
        .collect()
}

fn golden_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden/cross_target_mlp.json")
}

/// Parses the `"losses": [...]` array of the golden file.
fn read_golden() -> Vec<f32> {
    let text = std::fs::read_to_string(golden_path()).expect("golden file");
    let start = text.find("\"losses\"").expect("losses key");
    let open = start + text[start..].find('[').unwrap();
    let close = open + text[open..].find(']').unwrap();
    text[open + 1..close]
        .split(',')
        .map(|v| v.trim().parse::<f32>().unwrap())
        .collect()
}

#[test]
fn native_losses_match_the_cross_target_golden() {
    let got = native_losses();
    if std::env::var_os("FRUGAL_BLESS").is_some() {
        let list: Vec<String> = got.iter().map(|l| format!("{l:?}")).collect();
        let json = format!(
            "{{\n  \"model\": \"examples/digits-mlp.toml\",\n  \"batch\": {BATCH},\n  \"seed\": {SEED},\n  \"steps\": {STEPS},\n  \"data\": \"bundled digits, training split, file order, step i = samples [32i, 32i+32)\",\n  \"losses\": [{}]\n}}\n",
            list.join(", ")
        );
        std::fs::write(golden_path(), json).unwrap();
    }
    let want = read_golden();
    assert_eq!(want.len(), STEPS);
    // Natively the kernels are deterministic, but the SIMD kernel chosen at run time (AVX-512, AVX2,
    // portable) changes the summation order; f32 losses over 20 steps stay within 1e-5 relative.
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs(),
            "step {i}: native loss {g} vs golden {w}"
        );
    }
    // The run trains: the loss falls.
    assert!(want[STEPS - 1] < 0.8 * want[0], "losses {want:?}");
}
