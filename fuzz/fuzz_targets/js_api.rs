//! The JS API (`Trainer`) with random argument sequences. wasm-bindgen's `JsValue` cannot exist off
//! wasm, so this drives what every JS method calls — `frugal_wasm::Session` — through the same argument
//! conversions the bindings apply (`integer`, `parse_policy`, budgets as f64 with `Infinity` for none).
//! A rejected call must leave the trainer usable; nothing may panic (a panic is a trap in the browser).
//! Step counts are capped at 3 per call so a run explores sequences rather than long training.
//! The sequence build's calls (`addTokens`, `evaluateTokens`, `suggest`, feature `seq`) run on the
//! "learn my phrases" model and on every other model (which must refuse them).
#![no_main]
use arbitrary::Arbitrary;
use frugal_wasm::session::text::MAX_TOKENS_PER_CALL;
use frugal_wasm::session::{integer, parse_policy, MAX_BATCH, MAX_CLASSES, MAX_STEPS_PER_CALL};
use frugal_wasm::{Options, Session};
use libfuzzer_sys::fuzz_target;

const MLP: &[u8] = include_bytes!("../../examples/digits-mlp.frgm");
const CNN: &[u8] = include_bytes!("../../examples/digits-cnn.frgm");
const TRANSFER: &[u8] = include_bytes!("../../examples/transfer.frgm");
const BACKBONE: &[u8] = include_bytes!("../../examples/digits-backbone.safetensors");
const CHAR_GPT: &[u8] = include_bytes!("../../examples/char-gpt-small-lora.frgm");
const CHAR_BASE: &[u8] = include_bytes!("../../examples/char-gpt-small.safetensors");

#[derive(Arbitrary, Debug)]
enum Model {
    Mlp,
    Cnn,
    Transfer,
    CharGpt,
    Bytes(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum Weights {
    None,
    Backbone,
    CharBase,
    Bytes(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct Create {
    model: Model,
    weights: Weights,
    batch: Option<f64>,
    budget: Option<f64>,
    seed: Option<f64>,
    classes: Option<f64>,
    policy: Option<String>,
}

#[derive(Arbitrary, Debug)]
enum Call {
    AddSample {
        fill: f32,
        len_delta: i8,
        label: f64,
    },
    AddRandom {
        values: Vec<f32>,
        label: f64,
    },
    ClearSamples,
    TrainSteps(f64),
    Predict {
        fill: f32,
        samples: u8,
        extra: u8,
    },
    SetBudget(f64),
    PlanInfo,
    ExportWeights,
    AddTokens {
        tokens: Vec<u16>,
        repeat: u8,
        stride: Option<f64>,
    },
    EvaluateTokens {
        tokens: Vec<u16>,
        repeat: u8,
    },
    Suggest {
        context: Vec<u16>,
        k: f64,
    },
}

/// `tokens` repeated (so short fuzz inputs still make windows), as the bindings' `Uint32Array`.
fn token_ids(tokens: &[u16], repeat: u8) -> Vec<u32> {
    let n = (tokens.len() * (repeat as usize % 8 + 1)).min(MAX_TOKENS_PER_CALL + 1);
    tokens.iter().cycle().take(n).map(|&t| t as u32).collect()
}

#[derive(Arbitrary, Debug)]
struct Script {
    create: Create,
    calls: Vec<Call>,
}

fn budget(v: f64) -> Option<Option<usize>> {
    if v == f64::INFINITY {
        return Some(None);
    }
    integer("bytes", v, 0, 1 << 53)
        .ok()
        .map(|b| Some(b as usize))
}

fn options(c: &Create) -> Option<Options> {
    let mut o = Options::default();
    // Small batches keep each run fast: the bindings allow up to MAX_BATCH, and default to 32.
    if let Some(b) = c.batch {
        o.batch = integer("options.batch", b, 1, MAX_BATCH as u64).ok()? as usize;
    }
    o.batch = o.batch.min(16);
    if let Some(b) = c.budget {
        o.budget = budget(b)?;
    }
    if let Some(s) = c.seed {
        o.seed = Some(integer("options.seed", s, 0, 1 << 53).ok()?);
    }
    if let Some(k) = c.classes {
        o.classes = Some(integer("options.classes", k, 1, MAX_CLASSES as u64).ok()? as u32);
    }
    if let Some(p) = &c.policy {
        o.policy = parse_policy(p).ok()?;
    }
    Some(o)
}

fuzz_target!(|script: Script| {
    let Some(opts) = options(&script.create) else {
        return;
    };
    let model: &[u8] = match &script.create.model {
        Model::Mlp => MLP,
        Model::Cnn => CNN,
        Model::Transfer => TRANSFER,
        Model::CharGpt => CHAR_GPT,
        Model::Bytes(b) => b,
    };
    let weights: &[u8] = match &script.create.weights {
        Weights::None => &[],
        Weights::Backbone => BACKBONE,
        Weights::CharBase => CHAR_BASE,
        Weights::Bytes(b) => b,
    };
    // Fuzzed model bytes can describe huge layers; the bindings refuse those with a budget or
    // out-of-memory error, which is what a bounded budget tests here without exhausting the fuzzer.
    let mut opts = opts;
    if matches!(script.create.model, Model::Bytes(_)) {
        opts.budget = Some(opts.budget.unwrap_or(64 << 20).min(64 << 20));
    }
    let Ok(mut s) = Session::new(model, weights, opts) else {
        return;
    };
    let per = s.input_size();
    for call in script.calls.iter().take(32) {
        let before = s.steps();
        match call {
            Call::AddSample {
                fill,
                len_delta,
                label,
            } => {
                let n = (per as isize + *len_delta as isize).max(0) as usize;
                let _ = s.add_sample(&vec![*fill; n], *label);
            }
            Call::AddRandom { values, label } => {
                let _ = s.add_sample(values, *label);
            }
            Call::ClearSamples => s.clear_samples(),
            Call::TrainSteps(n) => {
                if let Ok(n) = integer("steps", *n, 0, MAX_STEPS_PER_CALL as u64) {
                    let mut losses = Vec::new();
                    let r = s.train_steps(n.min(3) as u32, &mut losses);
                    if r.is_ok() {
                        assert_eq!(losses.len() as u64, n.min(3));
                        assert!(losses.iter().all(|l| l.is_finite()));
                    }
                }
            }
            Call::Predict {
                fill,
                samples,
                extra,
            } => {
                let n = (*samples as usize % 5) * per + (*extra as usize % 3);
                if let Ok(p) = s.predict(&vec![*fill; n]) {
                    assert_eq!(p.len(), n / per * s.tokens() * s.classes());
                }
            }
            Call::SetBudget(b) => {
                if let Some(b) = budget(*b) {
                    let info = s.plan_info();
                    if s.set_budget(b).is_err() {
                        assert_eq!(s.plan_info(), info, "a refused budget keeps the plan");
                    }
                }
            }
            Call::PlanInfo => {
                let _ = s.plan_info();
            }
            Call::ExportWeights => {
                if let Ok(w) = s.export_weights() {
                    frugal_wasm::weights::parse(&w).expect("exported weights parse");
                }
            }
            Call::AddTokens {
                tokens,
                repeat,
                stride,
            } => {
                // The bindings' default stride and check.
                let stride = match stride {
                    None => Ok((s.tokens() / 4).max(1) as u64),
                    Some(v) => integer("stride", *v, 1, s.tokens() as u64),
                };
                if let Ok(st) = stride {
                    let count = s.sample_count();
                    match s.add_tokens(&token_ids(tokens, *repeat), st as usize) {
                        Ok(n) => assert_eq!(s.sample_count(), count + n),
                        Err(_) => assert_eq!(s.sample_count(), count, "a refused call adds nothing"),
                    }
                }
            }
            Call::EvaluateTokens { tokens, repeat } => {
                if let Ok(l) = s.evaluate_tokens(&token_ids(tokens, *repeat)) {
                    assert!(l.is_finite() && l >= 0.0, "{l}");
                }
            }
            Call::Suggest { context, k } => {
                if let Ok(k) = integer("k", *k, 1, s.classes() as u64) {
                    if let Ok(top) = s.suggest(&token_ids(context, 0), k as usize) {
                        assert_eq!(top.len(), k as usize);
                        assert!(top.windows(2).all(|w| w[0].1 >= w[1].1));
                    }
                }
            }
        }
        assert!(s.steps() >= before);
    }
});
