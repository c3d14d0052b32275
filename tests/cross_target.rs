//! The cross-target reference run: the same model, data and seed must give the same losses natively, in
//! wasmtime (`hosts/wasmtime`) and in Chromium (`wasm/`, `web-demo/`). This test pins the native losses in
//! `tests/golden/cross_target_mlp.json`, which the other targets' tests compare against.
//!
//! The run: `examples/digits-mlp.toml` (Adam, lr 0.003), `Executor::init_params(seed 1)`, the plain plan at
//! batch 32, step `i` on training samples `[32·i, 32·i + 32)` of the bundled digits in file order, 20 steps.
//! The int8 run (pure-integer update, `DEFAULT_UPDATE_BITS`) over the same data is pinned too, as loss bit
//! patterns: integer training must give the same bits on every target.
//! Regenerate with `FRUGAL_BLESS=1 cargo test -p frugal-tests --test cross_target`.
use std::path::PathBuf;

use frugal_cli::spec_toml::load_model;
use frugal_cli::train::DEFAULT_UPDATE_BITS;
use frugal_core::exec::int8::Int8Executor;
use frugal_core::exec::{Executor, Target};
use frugal_core::graph::Graph;
use frugal_core::model::{Int8Update, Precision};
use frugal_core::plan::Plan;

/// Steps, batch and seed of the reference run.
const STEPS: usize = 20;
const BATCH: usize = 32;
const SEED: u64 = 1;

/// The reference run's losses: f32 with `int8 = false`, else int8 with the pure-integer update.
fn native_losses(int8: bool) -> Vec<f32> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let m = load_model(&root.join("examples/digits-mlp.toml")).unwrap();
    let precision = if int8 {
        Precision::Int8(Int8Update::Integer {
            update_bits: DEFAULT_UPDATE_BITS,
        })
    } else {
        Precision::F32
    };
    let plan = Plan::new(Graph::with_precision(&m.spec, BATCH, precision).unwrap());
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut f32_ex = None;
    let mut int8_ex = None;
    if int8 {
        let mut ex = Int8Executor::new(&plan, &arena).unwrap();
        ex.init_params(&mut arena, SEED).unwrap();
        int8_ex = Some(ex);
    } else {
        let mut ex = Executor::new(&plan, &arena).unwrap();
        ex.init_params(&mut arena, SEED).unwrap();
        f32_ex = Some(ex);
    }
    let (train, _) = frugal_cli::data::digits();
    let per = m.spec.input.numel();
    let mut x = vec![0f32; BATCH * per];
    let mut y = vec![0u32; BATCH];
    (0..STEPS)
        .map(|i| {
            let idx: Vec<usize> = (i * BATCH..(i + 1) * BATCH).collect();
            train.batch(&idx, &mut x, &mut y);
            let t = Target::Classes(&y);
            match (&mut f32_ex, &mut int8_ex) {
                (Some(ex), _) => ex.train_step(&mut arena, &x, t).unwrap().loss,
                (_, Some(ex)) => ex.train_step(&mut arena, &x, t).unwrap().loss,
                _ => unreachable!("one executor exists"),
            }
        })
        .collect()
}

fn golden_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden/cross_target_mlp.json")
}

/// The `"<key>"` number array of the golden file.
fn read_array<T: FromF64>(key: &str) -> Vec<T> {
    let text = std::fs::read_to_string(golden_path()).expect("golden file");
    let v: serde_json::Value = serde_json::from_str(&text).expect("golden JSON");
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key}: an array"))
        .iter()
        .map(|x| T::from_f64(x.as_f64().expect("a number")))
        .collect()
}

/// A golden number as the type a test wants.
trait FromF64 {
    fn from_f64(v: f64) -> Self;
}

impl FromF64 for f32 {
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl FromF64 for u32 {
    fn from_f64(v: f64) -> Self {
        v as u32
    }
}

fn read_golden() -> Vec<f32> {
    read_array("losses")
}

#[test]
fn native_losses_match_the_cross_target_golden() {
    let got = native_losses(false);
    if std::env::var_os("FRUGAL_BLESS").is_some() {
        let list: Vec<String> = got.iter().map(|l| format!("{l:?}")).collect();
        let bits: Vec<String> = native_losses(true)
            .iter()
            .map(|l| l.to_bits().to_string())
            .collect();
        let json = format!(
            "{{\n  \"model\": \"examples/digits-mlp.toml\",\n  \"batch\": {BATCH},\n  \"seed\": {SEED},\n  \"steps\": {STEPS},\n  \"data\": \"bundled digits, training split, file order, step i = samples [32i, 32i+32)\",\n  \"losses\": [{}],\n  \"int8_update_bits\": {DEFAULT_UPDATE_BITS},\n  \"int8_loss_bits\": [{}]\n}}\n",
            list.join(", "),
            bits.join(", ")
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

#[test]
fn native_int8_losses_match_the_cross_target_golden_bit_for_bit() {
    let got: Vec<u32> = native_losses(true).iter().map(|l| l.to_bits()).collect();
    let want: Vec<u32> = read_array("int8_loss_bits");
    assert_eq!(want.len(), STEPS);
    let text = std::fs::read_to_string(golden_path()).unwrap();
    assert!(
        text.contains(&format!("\"int8_update_bits\": {DEFAULT_UPDATE_BITS},")),
        "the golden int8 run used another update precision"
    );
    // Integer training: every kernel on every target gives the same bits.
    assert_eq!(got, want, "int8 losses (bit patterns)");
    let first = f32::from_bits(want[0]);
    let last = f32::from_bits(want[STEPS - 1]);
    assert!(last < first, "the int8 run trains: {first} → {last}");
}
