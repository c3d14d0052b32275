//! The wasmtime host's contract: training under a budget works; a budget below the minimum is a typed
//! error naming a minimum that works; a guest that grows past its limit, or runs out of fuel, is
//! stopped with a typed error while the host carries on; garbage model bytes are a typed error; and
//! the sandbox reproduces the native cross-target reference run.
use std::path::PathBuf;
use std::sync::OnceLock;

use frugal_cli::data::digits;
use frugal_cli::spec_toml::load_model;
use frugal_core::format::encode_model;
use frugal_core::model::{Int8Update, Precision};
use frugal_core::policy::PolicyKind;
use frugal_wasmtime::{DatasetBatches, Order, Sandbox, SandboxError, Session, SessionOptions};

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;
/// A wasm page.
const PAGE: usize = 64 * KIB;

fn sandbox() -> &'static Sandbox {
    static S: OnceLock<Sandbox> = OnceLock::new();
    S.get_or_init(|| Sandbox::new().expect("the bundled guest compiles"))
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The binary ModelSpec of an example model.
fn model(name: &str) -> Vec<u8> {
    let m = load_model(&root().join("examples").join(name)).expect("example model loads");
    encode_model(&m.spec)
}

fn opts(budget: usize) -> SessionOptions {
    SessionOptions {
        budget,
        batch: 32,
        seed: 1,
        policy: PolicyKind::Auto,
        fuel: None,
        precision: Precision::F32,
    }
}

fn digits_batches(order: Order) -> DatasetBatches {
    let (train, test) = digits();
    DatasetBatches::new(train, test, order)
}

fn start(model: &[u8], o: &SessionOptions) -> Result<Session, SandboxError> {
    sandbox().session(model, digits_batches(Order::Shuffled { seed: 7 }), o)
}

#[test]
fn digits_mlp_trains_within_a_512kib_sandbox_and_generalises() {
    let budget = 512 * KIB;
    let mut s = start(&model("digits-mlp.toml"), &opts(budget)).expect("512 KiB is enough");
    let plan = s.plan();
    // The plan fits what remains after the guest's own memory, and the arena holds the plan.
    assert!(
        plan.overhead_bytes + plan.arena_pages_bytes <= budget,
        "{plan:?}"
    );
    assert!(plan.arena_bytes <= plan.arena_pages_bytes, "{plan:?}");
    assert!(plan.lower_bound <= plan.arena_bytes, "{plan:?}");
    assert_eq!(plan.step_batch, 32);
    let per_epoch = 1437usize.div_ceil(32) as u32;
    let first = s.train(per_epoch).unwrap();
    assert_eq!(first.len(), per_epoch as usize);
    let rest = s.train(4 * per_epoch).unwrap();
    let mean = |v: &[frugal_core::exec::StepStats]| {
        v.iter().map(|s| s.loss as f64).sum::<f64>() / v.len() as f64
    };
    let tail = &rest[rest.len() - per_epoch as usize..];
    assert!(
        mean(tail) < 0.5 * mean(&first),
        "loss {} → {}",
        mean(&first),
        mean(tail)
    );
    let ev = s.evaluate().unwrap();
    assert_eq!(ev.samples, 360, "the whole held-out split is evaluated");
    // Natively this MLP passes 95% on the held-out digits after 5 epochs; 90% leaves room for the
    // shuffle and the micro-batched plan while still failing if training were broken (10% is chance).
    assert!(ev.accuracy() >= 0.90, "held-out accuracy {}", ev.accuracy());
    // The sandbox never used more than its budget (the store limit enforces it; this checks the
    // bookkeeping the CLI reports).
    assert!(
        s.memory_bytes() <= budget,
        "{} > {budget}",
        s.memory_bytes()
    );
    assert_eq!(
        s.memory_bytes(),
        plan.overhead_bytes + plan.arena_pages_bytes
    );
}

#[test]
fn a_budget_below_the_minimum_names_a_minimum_that_works() {
    let m = model("digits-mlp.toml");
    let needed = match start(&m, &opts(256 * KIB)) {
        Err(SandboxError::BudgetTooSmall { needed, given }) => {
            assert_eq!(given, 256 * KIB);
            needed
        }
        Err(e) => panic!("expected BudgetTooSmall, got {e}"),
        Ok(s) => panic!("256 KiB should be too small, got {:?}", s.plan()),
    };
    assert!(needed > 256 * KIB && needed % PAGE == 0, "needed {needed}");
    // One page less is still too small, and names the same minimum (it is the smallest, to a page).
    match start(&m, &opts(needed - PAGE)) {
        Err(SandboxError::BudgetTooSmall { needed: n, .. }) => assert_eq!(n, needed),
        Err(e) => panic!("expected BudgetTooSmall, got {e}"),
        Ok(s) => panic!("{} should be too small, got {:?}", needed - PAGE, s.plan()),
    }
    // A budget below even the guest's static memory gets the same answer (probed, not trapped).
    match start(&m, &opts(64 * KIB)) {
        Err(SandboxError::BudgetTooSmall { needed: n, given }) => {
            assert_eq!((n, given), (needed, 64 * KIB))
        }
        Err(e) => panic!("expected BudgetTooSmall, got {e}"),
        Ok(s) => panic!("64 KiB should be too small, got {:?}", s.plan()),
    }
    // The minimum works: it plans, trains and stays within it.
    let mut s = start(&m, &opts(needed)).expect("the named minimum works");
    let steps = s.train(3).unwrap();
    assert!(steps
        .iter()
        .all(|st| st.loss.is_finite() && st.samples == 32));
    assert!(s.memory_bytes() <= needed);
}

#[test]
fn a_guest_growing_past_its_limit_is_stopped_and_the_host_carries_on() {
    let m = model("digits-mlp.toml");
    let mut s = start(&m, &opts(MIB)).unwrap();
    s.train(2).unwrap();
    match s.test_allocate(4 * MIB as u32) {
        Err(SandboxError::MemoryLimit { limit, requested }) => {
            assert_eq!(limit, MIB);
            assert!(requested > MIB, "requested {requested}");
        }
        other => panic!("expected MemoryLimit, got {other:?}"),
    }
    // The trapped session is unusable but reports so instead of misbehaving.
    assert_eq!(s.train(1).unwrap_err(), SandboxError::Poisoned);
    assert!(s.memory_bytes() <= MIB);
    // The same sandbox (engine, compiled module) starts a fresh session that trains normally.
    let mut again = start(&m, &opts(MIB)).unwrap();
    let steps = again.train(5).unwrap();
    assert_eq!(steps.len(), 5);
    assert!(steps.iter().all(|st| st.loss.is_finite()));
    // Within its limit the hook works (it allocates on the heap and touches every page).
    let mut ok = start(&m, &opts(MIB)).unwrap();
    assert_eq!(ok.test_allocate(64 * KIB as u32).unwrap(), 16);
}

#[test]
fn running_out_of_fuel_is_a_typed_error() {
    let m = model("digits-mlp.toml");
    // Enough for planning and initialisation, far too little for 10,000 steps (each step of this MLP
    // is ~10^6 wasm instructions).
    let fuel = 200_000_000;
    let mut s = start(
        &m,
        &SessionOptions {
            fuel: Some(fuel),
            ..opts(MIB)
        },
    )
    .expect("init fits in the fuel");
    assert_eq!(
        s.train(10_000).unwrap_err(),
        SandboxError::OutOfFuel { fuel }
    );
    assert_eq!(s.train(1).unwrap_err(), SandboxError::Poisoned);
    // Fuel is per call: a fresh session with the same bound trains a few steps fine.
    let mut t = start(
        &m,
        &SessionOptions {
            fuel: Some(fuel),
            ..opts(MIB)
        },
    )
    .unwrap();
    assert_eq!(t.train(3).unwrap().len(), 3);
}

#[test]
fn garbage_model_bytes_are_a_typed_error_not_a_trap() {
    let good = model("digits-mlp.toml");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("text", b"this is not a model".to_vec()),
        ("empty", Vec::new()),
        ("truncated", good[..good.len() / 2].to_vec()),
        ("flipped byte", {
            let mut b = good.clone();
            let i = b.len() - 3;
            b[i] ^= 0x5a;
            b
        }),
    ];
    for (what, bytes) in cases {
        match start(&bytes, &opts(MIB)) {
            Err(SandboxError::Model(msg)) => assert!(!msg.is_empty(), "{what}: empty message"),
            Err(e) => panic!("{what}: expected a Model error, got {e}"),
            Ok(_) => panic!("{what}: garbage was accepted"),
        }
    }
    // And the sandbox still works.
    assert!(start(&good, &opts(MIB)).is_ok());
}

#[test]
fn data_that_does_not_fit_the_model_is_a_typed_error() {
    // The digits are 1×8×8; a model for 3×8×8 inputs does not fit them.
    let mut m = load_model(&root().join("examples/digits-mlp.toml")).unwrap();
    m.spec.input = frugal_core::model::Dims::new(3, 8, 8);
    match start(&encode_model(&m.spec), &opts(MIB)) {
        Err(SandboxError::Data(msg)) => assert!(msg.contains("192"), "{msg}"),
        other => panic!("expected a Data error, got {:?}", other.err()),
    }
}

/// The cross-target golden file.
fn golden() -> serde_json::Value {
    let text = std::fs::read_to_string(root().join("tests/golden/cross_target_mlp.json"))
        .expect("golden file");
    serde_json::from_str(&text).expect("golden JSON")
}

/// Its numbers under `key`.
fn numbers(key: &str) -> Vec<f64> {
    golden()[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key}: an array"))
        .iter()
        .map(|v| v.as_f64().expect("a number"))
        .collect()
}

/// The `"losses"` of the cross-target golden file.
fn golden_losses() -> Vec<f32> {
    numbers("losses").iter().map(|&v| v as f32).collect()
}

#[test]
fn sandbox_reproduces_the_native_cross_target_losses() {
    // The reference run of tests/cross_target.rs: digits-mlp, init seed 1, the plain plan at batch 32,
    // step i on training samples [32i, 32i + 32) in file order, 20 steps.
    let want = golden_losses();
    assert_eq!(want.len(), 20);
    let o = SessionOptions {
        policy: PolicyKind::Plain,
        ..opts(16 * MIB)
    };
    let mut s = sandbox()
        .session(
            &model("digits-mlp.toml"),
            digits_batches(Order::Sequential),
            &o,
        )
        .unwrap();
    assert_eq!((s.plan().micro_batch, s.plan().recomputes), (32, 0));
    let got: Vec<f32> = s.train(20).unwrap().iter().map(|st| st.loss).collect();
    // Natively the SIMD kernel (AVX-512/AVX2 with FMA) sums in another order than the guest's
    // portable kernel (wasm simd128, no FMA); over 20 f32 Adam steps the losses stay within 1e-5
    // relative (the tolerance issue 5 sets for f32 cross-target equality).
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs(),
            "step {i}: wasmtime loss {g} vs native golden {w}"
        );
    }
}

/// The golden int8 run's loss bit patterns and its update precision.
fn golden_int8() -> (Vec<u32>, u8) {
    let bits = numbers("int8_loss_bits")
        .iter()
        .map(|&b| b as u32)
        .collect();
    let update = golden()["int8_update_bits"]
        .as_u64()
        .expect("int8_update_bits");
    (bits, update as u8)
}

#[test]
fn sandbox_int8_losses_equal_the_native_golden_bit_for_bit() {
    // The reference run in int8 (pure-integer update): the core compiled to wasm and run by wasmtime
    // must give exactly the native loss bits.
    let (want, update_bits) = golden_int8();
    assert_eq!(want.len(), 20);
    let o = SessionOptions {
        policy: PolicyKind::Plain,
        precision: Precision::Int8(Int8Update::Integer { update_bits }),
        ..opts(16 * MIB)
    };
    let mut s = sandbox()
        .session(
            &model("digits-mlp.toml"),
            digits_batches(Order::Sequential),
            &o,
        )
        .unwrap();
    let got: Vec<u32> = s
        .train(20)
        .unwrap()
        .iter()
        .map(|st| st.loss.to_bits())
        .collect();
    assert_eq!(got, want, "int8 loss bits in wasmtime vs the native golden");
    // And the int8 session evaluates.
    let e = s.evaluate().unwrap();
    assert!(e.samples > 0 && e.accuracy() > 0.3, "{e:?}");
}
