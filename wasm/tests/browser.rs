//! The JS API's error paths, in Chromium (wasm-bindgen-test through chromedriver; `cargo xtask web
//! --test` runs it). Every bad call must throw a JS `Error` with a message, never trap, and leave the
//! trainer usable.
#![cfg(target_arch = "wasm32")]

use frugal_wasm::js::{Trainer, TrainerOptions};
use js_sys::{Error, Object, Reflect};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

const TRANSFER: &[u8] = include_bytes!("../../examples/transfer.frgm");
const BACKBONE: &[u8] = include_bytes!("../../examples/digits-backbone.safetensors");

fn options(pairs: &[(&str, JsValue)]) -> TrainerOptions {
    let o = Object::new();
    for (k, v) in pairs {
        Reflect::set(&o, &JsValue::from_str(k), v).unwrap();
    }
    o.unchecked_into()
}

/// The thrown value as (name, message), asserting it is an `Error`.
fn thrown(v: JsValue) -> (String, String) {
    let e: &Error = v.dyn_ref().expect("a JS Error");
    (e.name().into(), e.message().into())
}

fn trainer() -> Trainer {
    Trainer::create(
        TRANSFER,
        BACKBONE,
        Some(options(&[("classes", 3.into()), ("batch", 8.into())])),
    )
    .unwrap()
}

/// A sequence model's bytes: token embedding, then a vocabulary head.
#[cfg(not(feature = "seq"))]
fn sequence_model() -> Vec<u8> {
    use frugal_core::model::*;
    let layer = |name: &str, kind, inputs| LayerSpec {
        name: name.into(),
        kind,
        inputs,
        trainable: true,
        update: Update::All,
    };
    frugal_core::format::encode_model(&ModelSpec {
        input: Dims::flat(8),
        layers: vec![
            layer(
                "tok",
                LayerKind::Embedding { vocab: 16, dim: 4 },
                vec![Src::Input],
            ),
            layer(
                "head",
                LayerKind::Linear {
                    out: 16,
                    bias: false,
                },
                vec![Src::Layer(0)],
            ),
        ],
        loss: LossKind::SoftmaxCrossEntropy,
        optimizer: OptimizerSpec::Sgd {
            lr: 0.1,
            momentum: 0.0,
            weight_decay: 0.0,
        },
        seed: 1,
    })
}

/// The CPU module is built without the core's `seq` feature (its size limit): a sequence model is a
/// `ModelError` naming its first sequence layer, never a trap.
#[cfg(not(feature = "seq"))]
#[wasm_bindgen_test]
fn the_cpu_module_refuses_sequence_layers_by_name() {
    let e = Trainer::create(&sequence_model(), &[], None)
        .err()
        .expect("an error");
    let (name, msg) = thrown(e);
    assert_eq!(name, "ModelError");
    assert!(
        msg.contains("layers[0] (\"tok\")") && msg.contains("embedding is a sequence layer"),
        "{msg}"
    );
    assert!(msg.contains("`seq` feature"), "{msg}");
}

#[wasm_bindgen_test]
fn bad_samples_throw_errors_and_keep_the_trainer_usable() {
    let mut t = trainer();
    let (name, msg) = thrown(t.add_sample(&[0.0; 10], 0.0).unwrap_err());
    assert_eq!(name, "ArgumentError");
    assert!(msg.contains("has 10 values"), "{msg}");
    let mut x = [0.25f32; 64];
    x[3] = f32::INFINITY;
    assert!(thrown(t.add_sample(&x, 0.0).unwrap_err())
        .1
        .contains("value 3 is inf"));
    for label in [3.0, -1.0, 1.5, f64::NAN, f64::INFINITY] {
        let (_, msg) = thrown(t.add_sample(&[0.0; 64], label).unwrap_err());
        assert!(msg.starts_with("label:"), "{label}: {msg}");
    }
    assert!(thrown(t.train_steps(1.0).unwrap_err())
        .1
        .contains("no samples"));
    assert!(thrown(t.train_steps(f64::NAN).unwrap_err())
        .1
        .contains("steps"));
    assert!(thrown(t.predict(&[0.0; 65]).unwrap_err())
        .1
        .contains("65 values"));
    assert!(thrown(t.predict(&[]).unwrap_err()).1.contains("0 values"));
    assert_eq!(t.sample_count(), 0);
    t.add_sample(&[0.5; 64], 2.0).unwrap();
    let losses = t.train_steps(3.0).unwrap();
    assert_eq!(losses.len(), 3);
    assert!(losses.iter().all(|l| l.is_finite()));
    assert_eq!(t.predict(&[0.5; 128]).unwrap().len(), 6);
}

#[wasm_bindgen_test]
fn budget_errors_carry_the_smallest_feasible_budget() {
    let mut t = trainer();
    let before = t.plan_info();
    let e = t.set_budget(100.0).unwrap_err();
    let (name, msg) = thrown(e.clone());
    assert_eq!(name, "BudgetError");
    let needed = Reflect::get(&e, &"neededBytes".into())
        .unwrap()
        .as_f64()
        .unwrap();
    let given = Reflect::get(&e, &"givenBytes".into())
        .unwrap()
        .as_f64()
        .unwrap();
    assert_eq!(given, 100.0);
    assert!(
        needed > 100.0 && msg.contains(&format!("{needed}")),
        "{msg}"
    );
    // The trainer kept its plan; the named budget works.
    let arena = |p: &JsValue, k: &str| Reflect::get(p, &k.into()).unwrap().as_f64().unwrap();
    assert_eq!(
        arena(&before, "allocatedBytes"),
        arena(&t.plan_info(), "allocatedBytes")
    );
    t.set_budget(needed).unwrap();
    assert!(arena(&t.plan_info(), "allocatedBytes") <= needed);
    assert_eq!(arena(&t.plan_info(), "budgetBytes"), needed);
    for bad in [f64::NAN, -1.0, 1.5] {
        assert_eq!(thrown(t.set_budget(bad).unwrap_err()).0, "ArgumentError");
    }
    t.set_budget(f64::INFINITY).unwrap();
    assert_eq!(arena(&t.plan_info(), "budgetBytes"), f64::INFINITY);
    // Creating under a budget that is too small throws the same kind of error.
    let e = Trainer::create(TRANSFER, BACKBONE, Some(options(&[("budget", 64.into())])))
        .err()
        .unwrap();
    assert_eq!(thrown(e).0, "BudgetError");
}

#[wasm_bindgen_test]
fn corrupt_bytes_and_bad_options_throw_errors() {
    let create = |m: &[u8], w: &[u8], o: Option<TrainerOptions>| {
        thrown(Trainer::create(m, w, o).err().expect("an error"))
    };
    assert_eq!(create(&[], &[], None).0, "ModelError");
    assert!(create(b"FRGM\x01\x00", &[], None).1.contains("truncated"));
    let mut m = TRANSFER.to_vec();
    m[30] ^= 0xff;
    assert!(create(&m, &[], None).1.contains("checksum"));
    assert_eq!(create(TRANSFER, &BACKBONE[..50], None).0, "WeightsError");
    assert_eq!(
        create(TRANSFER, b"\x08\0\0\0\0\0\0\0{}", None).0,
        "WeightsError"
    );
    let opt = |k: &str, v: JsValue| create(TRANSFER, BACKBONE, Some(options(&[(k, v)])));
    assert!(opt("bacth", 4.into())
        .1
        .contains("unknown option \"bacth\""));
    assert!(opt("batch", 0.into()).1.contains("options.batch"));
    assert!(opt("batch", "8".into()).1.contains("must be a number"));
    assert!(opt("classes", 0.5.into()).1.contains("options.classes"));
    assert!(opt("policy", "fast".into()).1.contains("unknown policy"));
    assert!(opt("seed", (-1).into()).1.contains("options.seed"));
    let not_object: TrainerOptions = JsValue::from(7).unchecked_into();
    assert!(create(TRANSFER, BACKBONE, Some(not_object))
        .1
        .contains("must be an object"));
    // Valid options still work afterwards.
    let t = Trainer::create(
        TRANSFER,
        BACKBONE,
        Some(options(&[
            ("policy", "recompute".into()),
            ("classes", 2.into()),
        ])),
    )
    .unwrap();
    assert_eq!(t.classes(), 2);
    assert_eq!(t.loaded_tensors(), 4);
}

/// Cross-target equality for integer training: the reference run of `tests/cross_target.rs` (digits
/// MLP, batch 32, seed 1, pure-integer update, training samples in file order) run by the core compiled
/// to wasm inside Chromium gives the golden loss bit patterns that the native run pins.
#[wasm_bindgen_test]
fn int8_losses_in_chromium_equal_the_native_golden_bit_for_bit() {
    use frugal_core::exec::int8::Int8Executor;
    use frugal_core::exec::Target;
    use frugal_core::format::decode_model;
    use frugal_core::graph::Graph;
    use frugal_core::model::{Int8Update, Precision};
    use frugal_core::plan::Plan;

    const MODEL: &[u8] = include_bytes!("../../examples/digits-mlp.frgm");
    const IMAGES: &[u8] = include_bytes!("../../data/digits/digits-train-images.idx");
    const LABELS: &[u8] = include_bytes!("../../data/digits/digits-train-labels.idx");
    const GOLDEN: &str = include_str!("../../tests/golden/cross_target_mlp.json");
    let golden: serde_json::Value = serde_json::from_str(GOLDEN).expect("golden JSON");
    let want: Vec<u64> = golden["int8_loss_bits"]
        .as_array()
        .expect("int8_loss_bits")
        .iter()
        .map(|v| v.as_u64().expect("an integer"))
        .collect();
    let update_bits = golden["int8_update_bits"]
        .as_u64()
        .expect("int8_update_bits") as u8;
    let (steps, batch) = (want.len(), 32);
    // IDX: a big-endian u32 magic (its low byte is the rank), the dimensions, then u8 data.
    let body = |idx: &'static [u8]| &idx[4 + 4 * idx[3] as usize..];
    let (pixels, labels) = (body(IMAGES), body(LABELS));
    let spec = decode_model(MODEL).unwrap();
    let per = spec.input.numel();
    let p = Precision::Int8(Int8Update::Integer { update_bits });
    let plan = Plan::new(Graph::with_precision(&spec, batch, p).unwrap());
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Int8Executor::new(&plan, &arena).unwrap();
    ex.init_params(&mut arena, 1).unwrap();
    let got: Vec<u64> = (0..steps)
        .map(|i| {
            let s = i * batch;
            // The bundled digits' pixels are 0..=16, scaled to [0, 1] as the native reader does.
            let x: Vec<f32> = pixels[s * per..(s + batch) * per]
                .iter()
                .map(|&p| p as f32 / 16.0)
                .collect();
            let y: Vec<u32> = labels[s..s + batch].iter().map(|&l| l as u32).collect();
            let st = ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
            st.loss.to_bits() as u64
        })
        .collect();
    assert_eq!(got, want, "int8 loss bits in Chromium vs the native golden");
}
