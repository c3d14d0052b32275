//! The wasm-bindgen bindings: `Trainer` for JavaScript. Checks every argument coming from JS (numbers
//! that must be integers, option objects, budgets) and turns every [`WebError`] into a thrown `Error`
//! whose `name` says the kind and whose `message` says what is wrong; budget errors carry
//! `neededBytes` (the smallest feasible budget) and `givenBytes`.
use js_sys::{Error, Object, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::error::WebError;
use crate::session::{integer, parse_policy, Options, Session, MAX_BATCH, MAX_CLASSES};

#[wasm_bindgen(typescript_custom_section)]
const TS_TYPES: &'static str = r#"
/** Options of `Trainer.create`; every field is optional. */
export interface TrainerOptions {
  /** Samples per training step (the plan's batch), 1 to 4096. Default 32. */
  batch?: number;
  /** Arena budget in bytes. Omitted or `Infinity`: no limit. */
  budget?: number;
  /** Seed of the weight initialisation (before `weightsBytes` are loaded). Default: the model's seed. */
  seed?: number;
  /** Resize the model's last (linear) layer to this many classes: a fresh head for transfer learning. */
  classes?: number;
  /** Memory policy when the plain plan does not fit the budget. Default `"auto"`. */
  policy?: "auto" | "plain" | "micro-batch" | "recompute" | "hybrid" | "recompute-first";
  /** Where steps run: `"cpu"` (default), `"webgpu"` (the WebGPU build, `frugal_wasm_webgpu.js`, on a page
   * with a WebGPU adapter) or `"auto"` (WebGPU when both hold, else the CPU; `backendInfo` says which and
   * why). In the WebGPU build `Trainer.create` returns a Promise. */
  backend?: "cpu" | "webgpu" | "auto";
}

/** Where a trainer's steps run, from `backendInfo`. */
export interface BackendInfo {
  backend: "cpu" | "webgpu";
  /** The WebGPU adapter, when on WebGPU. */
  adapter?: string;
  /** Why this backend (e.g. why "auto" fell back to the CPU). */
  reason: string;
}

/** The current plan, from `Trainer.planInfo()`. Sizes are in bytes. */
export interface PlanInfo {
  /** Bytes of the planned arena. */
  arenaBytes: number;
  /** Bytes allocated for it (arena plus alignment slack); never above the budget. */
  allocatedBytes: number;
  /** Most bytes live at any one moment of a step: no layout can use less. */
  lowerBound: number;
  /** Samples per micro-batch. */
  microBatch: number;
  /** Micro-batches per step. */
  microBatches: number;
  /** Forward instructions re-run during backward, per step. */
  recomputes: number;
  /** The budget; `Infinity` when unlimited. */
  budgetBytes: number;
  /** The policy that made the plan: "plain", "micro-batch", "recompute", "hybrid", … */
  policy: string;
  /** The cost model's estimate of milliseconds per step (not a measurement). */
  predictedMs: number;
}

/** Thrown by `Trainer.create` and `Trainer.setBudget` when no plan fits the budget. */
export interface BudgetError extends Error {
  name: "BudgetError";
  /** The smallest budget, in bytes, a plan was found for. */
  neededBytes: number;
  /** The budget that was given. */
  givenBytes: number;
}
"#;

#[wasm_bindgen]
extern "C" {
    /// `TrainerOptions` (see the TypeScript declaration).
    #[wasm_bindgen(typescript_type = "TrainerOptions")]
    pub type TrainerOptions;
    /// `PlanInfo` (see the TypeScript declaration).
    #[wasm_bindgen(typescript_type = "PlanInfo")]
    pub type PlanInfoObject;
}

/// A `WebError` as a JS `Error`.
pub(crate) fn js_error(e: WebError) -> JsValue {
    let err = Error::new(&e.to_string());
    err.set_name(e.kind());
    if let WebError::Budget(frugal_core::BudgetError::TooSmall { needed, given }) = e {
        set(&err, "neededBytes", needed as f64);
        set(&err, "givenBytes", given as f64);
    }
    err.into()
}

pub(crate) fn set(o: &JsValue, key: &str, v: impl Into<JsValue>) {
    // Setting a property on a fresh plain object or Error cannot fail.
    let _ = Reflect::set(o, &JsValue::from_str(key), &v.into());
}

fn arg(name: &'static str, why: &str) -> JsValue {
    js_error(WebError::Argument(name, why.into()))
}

/// A JS number (`Infinity`: unlimited) as a budget.
fn budget(name: &'static str, v: f64) -> Result<Option<usize>, JsValue> {
    if v == f64::INFINITY {
        return Ok(None);
    }
    let b = integer(name, v, 0, 1 << 53).map_err(js_error)?;
    Ok(Some(usize::try_from(b).unwrap_or(usize::MAX)))
}

const OPTION_KEYS: [&str; 6] = ["batch", "budget", "seed", "classes", "policy", "backend"];

fn parse_options(o: Option<TrainerOptions>) -> Result<Options, JsValue> {
    let mut opts = Options::default();
    let Some(o) = o else { return Ok(opts) };
    let v: JsValue = o.into();
    if v.is_undefined() || v.is_null() {
        return Ok(opts);
    }
    if !v.is_object() {
        return Err(arg("options", "must be an object"));
    }
    for k in Object::keys(v.unchecked_ref::<Object>()) {
        let k = k.as_string().unwrap_or_default();
        if !OPTION_KEYS.contains(&k.as_str()) {
            return Err(arg(
                "options",
                &format!("unknown option {k:?} (known: {})", OPTION_KEYS.join(", ")),
            ));
        }
    }
    let get = |k: &str| Reflect::get(&v, &JsValue::from_str(k));
    // An optional integer option `options.<k>` in [min, max].
    let int = |k: &'static str, min: u64, max: u64| -> Result<Option<u64>, JsValue> {
        let x = get(k.trim_start_matches("options."))?;
        if x.is_undefined() {
            return Ok(None);
        }
        let n = x.as_f64().ok_or_else(|| arg(k, "must be a number"))?;
        integer(k, n, min, max).map(Some).map_err(js_error)
    };
    if let Some(b) = int("options.batch", 1, MAX_BATCH as u64)? {
        opts.batch = b as usize;
    }
    let x = get("budget")?;
    if !x.is_undefined() {
        let n = x
            .as_f64()
            .ok_or_else(|| arg("options.budget", "must be a number"))?;
        opts.budget = budget("options.budget", n)?;
    }
    opts.seed = int("options.seed", 0, 1 << 53)?;
    opts.classes = int("options.classes", 1, MAX_CLASSES as u64)?.map(|c| c as u32);
    let x = get("policy")?;
    if !x.is_undefined() {
        let s = x
            .as_string()
            .ok_or_else(|| arg("options.policy", "must be a string"))?;
        opts.policy = parse_policy(&s).map_err(js_error)?;
    }
    Ok(opts)
}

/// Trains a frugal model in the page (or a worker): samples in, losses and predictions out, inside a
/// planned arena that never exceeds the budget.
#[wasm_bindgen]
pub struct Trainer {
    pub(crate) s: Session,
    /// Why the CPU (`backendInfo.reason`).
    reason: String,
}

#[wasm_bindgen]
impl Trainer {
    /// A trainer for a binary frugal model (`.frgm`, from `frugal convert model.toml`). `weightsBytes`
    /// are safetensors bytes loaded by name over the seeded initialisation (empty: initialisation
    /// only). Throws an `Error` for corrupt bytes or bad options, a `BudgetError` when no plan fits.
    #[cfg(not(feature = "webgpu"))]
    pub fn create(
        #[wasm_bindgen(js_name = "modelBytes")] model_bytes: &[u8],
        #[wasm_bindgen(js_name = "weightsBytes")] weights_bytes: &[u8],
        options: Option<TrainerOptions>,
    ) -> Result<Trainer, JsValue> {
        let reason = match backend_option(&options)?.as_str() {
            "webgpu" => {
                return Err(arg(
                    "options.backend",
                    "this build has no WebGPU backend: load frugal_wasm_webgpu.js",
                ))
            }
            "auto" => "this build has no WebGPU backend (frugal_wasm_webgpu.js has)",
            _ => "asked for",
        };
        Trainer::cpu(model_bytes, weights_bytes, options, reason)
    }

    /// The WebGPU build's `create`: a Promise of a `Trainer` (the CPU) or a `GpuTrainer`, as
    /// `options.backend` asks and the page allows.
    #[cfg(feature = "webgpu")]
    pub fn create(
        #[wasm_bindgen(js_name = "modelBytes")] model_bytes: Vec<u8>,
        #[wasm_bindgen(js_name = "weightsBytes")] weights_bytes: Vec<u8>,
        options: Option<TrainerOptions>,
    ) -> js_sys::Promise {
        wasm_bindgen_futures::future_to_promise(async move {
            let backend = backend_option(&options)?;
            if backend == "cpu" {
                return Trainer::cpu(&model_bytes, &weights_bytes, options, "asked for")
                    .map(JsValue::from);
            }
            match crate::gpu::Gpu::open().await {
                Ok(gpu) => {
                    let opts = parse_options(options)?;
                    let s = Session::new(&model_bytes, &weights_bytes, opts).map_err(js_error)?;
                    Ok(crate::js_gpu::GpuTrainer::new(s, gpu).into())
                }
                Err(e) if backend == "auto" => {
                    let why = format!("no WebGPU here ({e})");
                    Trainer::cpu(&model_bytes, &weights_bytes, options, &why).map(JsValue::from)
                }
                Err(e) => Err(js_error(e)),
            }
        })
    }

    fn cpu(
        model_bytes: &[u8],
        weights_bytes: &[u8],
        options: Option<TrainerOptions>,
        reason: &str,
    ) -> Result<Trainer, JsValue> {
        let opts = parse_options(options)?;
        Session::new(model_bytes, weights_bytes, opts)
            .map(|s| Trainer {
                s,
                reason: reason.into(),
            })
            .map_err(js_error)
    }

    /// Where the steps run (`{ backend: "cpu", reason }`).
    #[wasm_bindgen(getter, js_name = backendInfo)]
    pub fn backend_info(&self) -> JsValue {
        backend_info("cpu", None, &self.reason)
    }

    /// Adds a training sample: `input` has the model's input size (`inputSize`), finite values;
    /// `label` is a class index below `classes`.
    #[wasm_bindgen(js_name = addSample)]
    pub fn add_sample(&mut self, input: &[f32], label: f64) -> Result<(), JsValue> {
        self.s.add_sample(input, label).map_err(js_error)
    }

    /// Forgets all samples; the weights stay.
    #[wasm_bindgen(js_name = clearSamples)]
    pub fn clear_samples(&mut self) {
        self.s.clear_samples()
    }

    /// Runs `n` training steps; returns their losses. With at most `batch` samples every step trains
    /// on all of them; with more, consecutive steps take consecutive `batch`-sample windows (in the
    /// order added, wrapping around).
    #[wasm_bindgen(js_name = trainSteps)]
    pub fn train_steps(&mut self, n: f64) -> Result<Vec<f32>, JsValue> {
        let n =
            integer("steps", n, 0, crate::session::MAX_STEPS_PER_CALL as u64).map_err(js_error)?;
        let mut losses = Vec::new();
        self.s
            .train_steps(n as u32, &mut losses)
            .map_err(js_error)?;
        Ok(losses)
    }

    /// Class probabilities for one or more samples laid end to end (`n × classes` values).
    pub fn predict(&mut self, input: &[f32]) -> Result<Vec<f32>, JsValue> {
        self.s.predict(input).map_err(js_error)
    }

    /// Re-plans for a budget of `bytes` (`Infinity`: no limit), keeping weights and optimizer state.
    /// Throws a `BudgetError` with `neededBytes` when no plan fits; the trainer then keeps its plan.
    #[wasm_bindgen(js_name = setBudget)]
    pub fn set_budget(&mut self, bytes: f64) -> Result<(), JsValue> {
        let b = budget("bytes", bytes)?;
        self.s.set_budget(b).map_err(js_error)
    }

    /// The current plan: arena bytes, lower bound, micro-batch, recomputes, budget.
    #[wasm_bindgen(js_name = planInfo)]
    pub fn plan_info(&self) -> PlanInfoObject {
        plan_info_object(self.s.plan_info())
    }

    /// The parameters and statistics as F32 safetensors bytes (PyTorch `state_dict` names).
    #[wasm_bindgen(js_name = exportWeights)]
    pub fn export_weights(&mut self) -> Result<Vec<u8>, JsValue> {
        self.s.export_weights().map_err(js_error)
    }

    /// Samples added so far.
    #[wasm_bindgen(getter, js_name = sampleCount)]
    pub fn sample_count(&self) -> usize {
        self.s.sample_count()
    }

    /// Classes the model predicts.
    #[wasm_bindgen(getter)]
    pub fn classes(&self) -> usize {
        self.s.classes()
    }

    /// Values per input sample.
    #[wasm_bindgen(getter, js_name = inputSize)]
    pub fn input_size(&self) -> usize {
        self.s.input_size()
    }

    /// Samples per step.
    #[wasm_bindgen(getter)]
    pub fn batch(&self) -> usize {
        self.s.batch()
    }

    /// Tensors loaded from `weightsBytes` at creation.
    #[wasm_bindgen(getter, js_name = loadedTensors)]
    pub fn loaded_tensors(&self) -> usize {
        self.s.loaded_tensors()
    }

    /// Training steps taken.
    #[wasm_bindgen(getter)]
    pub fn steps(&self) -> u32 {
        self.s.steps()
    }
}

/// The plan as the JS `PlanInfo` object.
pub(crate) fn plan_info_object(p: crate::session::PlanInfo) -> PlanInfoObject {
    let o: JsValue = Object::new().into();
    set(&o, "arenaBytes", p.arena_bytes as f64);
    set(&o, "allocatedBytes", p.allocated_bytes as f64);
    set(&o, "lowerBound", p.lower_bound as f64);
    set(&o, "microBatch", p.micro_batch as f64);
    set(&o, "microBatches", p.micro_batches as f64);
    set(&o, "recomputes", p.recomputes as f64);
    set(
        &o,
        "budgetBytes",
        p.budget.map_or(f64::INFINITY, |b| b as f64),
    );
    set(&o, "policy", p.policy);
    set(&o, "predictedMs", p.predicted_ms);
    o.unchecked_into()
}

/// Which backend a trainer runs on, and why (`{ backend: "cpu" | "webgpu", adapter?, reason }`).
pub(crate) fn backend_info(backend: &str, adapter: Option<&str>, reason: &str) -> JsValue {
    let o: JsValue = Object::new().into();
    set(&o, "backend", backend);
    if let Some(a) = adapter {
        set(&o, "adapter", a);
    }
    set(&o, "reason", reason);
    o
}

/// `options.backend`: "cpu" (default), "webgpu" or "auto" (WebGPU when the page has an adapter and this
/// is the WebGPU build, else the CPU).
fn backend_option(o: &Option<TrainerOptions>) -> Result<String, JsValue> {
    let Some(o) = o else {
        return Ok("cpu".into());
    };
    let v: &JsValue = o.as_ref();
    if !v.is_object() {
        return Ok("cpu".into());
    }
    let b = Reflect::get(v, &JsValue::from_str("backend"))?;
    if b.is_undefined() {
        return Ok("cpu".into());
    }
    let s = b
        .as_string()
        .ok_or_else(|| arg("options.backend", "must be a string"))?;
    match s.as_str() {
        "cpu" | "webgpu" | "auto" => Ok(s),
        _ => Err(arg(
            "options.backend",
            &format!("must be \"cpu\", \"webgpu\" or \"auto\", got {s:?}"),
        )),
    }
}
