//! `GpuTrainer` (the WebGPU build): the `Trainer` surface with steps on WebGPU. The session (samples,
//! plan, the weights between calls) is the CPU trainer's; `trainSteps` moves the state into the GPU's
//! planned buffer, runs the steps there — each one submission, its loss awaited — and brings the state
//! back, so prediction, export and re-planning work on the session as on the CPU. While a `trainSteps`
//! Promise is pending, every other call throws (the state is on the GPU).
use alloc::rc::Rc;
use alloc::vec::Vec;
use core::cell::{RefCell, RefMut};

use js_sys::Float32Array;
use wasm_bindgen::prelude::*;

use crate::error::WebError;
use crate::gpu::Gpu;
use crate::js::{backend_info, js_error as to_js, plan_info_object as plan_object, PlanInfoObject};
use crate::session::{integer, Session, MAX_STEPS_PER_CALL};

/// A trainer whose steps run on WebGPU (from `await Trainer.create(…, { backend: "webgpu" | "auto" })`).
#[wasm_bindgen]
pub struct GpuTrainer {
    s: Rc<RefCell<Session>>,
    gpu: Rc<RefCell<Gpu>>,
    adapter: alloc::string::String,
}

fn busy() -> JsValue {
    to_js(WebError::Argument(
        "trainer",
        "is training on the GPU: await the pending trainSteps first".into(),
    ))
}

impl GpuTrainer {
    pub(crate) fn new(s: Session, gpu: Gpu) -> GpuTrainer {
        GpuTrainer {
            adapter: gpu.adapter().into(),
            s: Rc::new(RefCell::new(s)),
            gpu: Rc::new(RefCell::new(gpu)),
        }
    }

    fn s(&self) -> Result<RefMut<'_, Session>, JsValue> {
        self.s.try_borrow_mut().map_err(|_| busy())
    }
}

#[wasm_bindgen]
impl GpuTrainer {
    /// As `Trainer.addSample`.
    #[wasm_bindgen(js_name = addSample)]
    pub fn add_sample(&self, input: &[f32], label: f64) -> Result<(), JsValue> {
        self.s()?.add_sample(input, label).map_err(to_js)
    }

    /// As `Trainer.clearSamples`.
    #[wasm_bindgen(js_name = clearSamples)]
    pub fn clear_samples(&self) -> Result<(), JsValue> {
        self.s()?.clear_samples();
        Ok(())
    }

    /// `n` training steps on WebGPU: a Promise of their losses (a `Float32Array`).
    #[wasm_bindgen(js_name = trainSteps)]
    // The borrows are held across the awaits on purpose: they are what makes every other call (which
    // only ever `try_borrow`s) throw "busy" instead of seeing the state while it is on the GPU.
    #[allow(clippy::await_holding_refcell_ref)]
    pub fn train_steps(&self, n: f64) -> js_sys::Promise {
        let (s, gpu) = (self.s.clone(), self.gpu.clone());
        wasm_bindgen_futures::future_to_promise(async move {
            let n = integer("steps", n, 0, MAX_STEPS_PER_CALL as u64).map_err(to_js)?;
            let mut s = s.try_borrow_mut().map_err(|_| busy())?;
            let mut gpu = gpu.try_borrow_mut().map_err(|_| busy())?;
            let mut losses: Vec<f32> = Vec::new();
            s.train_steps_gpu(n as u32, &mut losses, &mut gpu)
                .await
                .map_err(to_js)?;
            Ok(Float32Array::from(&losses[..]).into())
        })
    }

    /// As `Trainer.predict` (on the CPU, from the state the last `trainSteps` brought back).
    pub fn predict(&self, input: &[f32]) -> Result<Vec<f32>, JsValue> {
        self.s()?.predict(input).map_err(to_js)
    }

    /// As `Trainer.setBudget`; the next `trainSteps` plans the GPU's buffer from the new plan.
    #[wasm_bindgen(js_name = setBudget)]
    pub fn set_budget(&self, bytes: f64) -> Result<(), JsValue> {
        let b = if bytes == f64::INFINITY {
            None
        } else {
            Some(integer("bytes", bytes, 0, 1 << 53).map_err(to_js)? as usize)
        };
        self.s()?.set_budget(b).map_err(to_js)
    }

    /// As `Trainer.planInfo`.
    #[wasm_bindgen(js_name = planInfo)]
    pub fn plan_info(&self) -> Result<PlanInfoObject, JsValue> {
        Ok(plan_object(self.s()?.plan_info()))
    }

    /// As `Trainer.exportWeights`.
    #[wasm_bindgen(js_name = exportWeights)]
    pub fn export_weights(&self) -> Result<Vec<u8>, JsValue> {
        self.s()?.export_weights().map_err(to_js)
    }

    /// Where the steps run (`{ backend: "webgpu", adapter, reason }`).
    #[wasm_bindgen(getter, js_name = backendInfo)]
    pub fn backend_info(&self) -> JsValue {
        backend_info(
            "webgpu",
            Some(&self.adapter),
            "asked for, and the page has WebGPU",
        )
    }

    /// Samples added so far.
    #[wasm_bindgen(getter, js_name = sampleCount)]
    pub fn sample_count(&self) -> Result<usize, JsValue> {
        Ok(self.s()?.sample_count())
    }

    /// Classes the model predicts.
    #[wasm_bindgen(getter)]
    pub fn classes(&self) -> Result<usize, JsValue> {
        Ok(self.s()?.classes())
    }

    /// Values per input sample.
    #[wasm_bindgen(getter, js_name = inputSize)]
    pub fn input_size(&self) -> Result<usize, JsValue> {
        Ok(self.s()?.input_size())
    }

    /// Samples per step.
    #[wasm_bindgen(getter)]
    pub fn batch(&self) -> Result<usize, JsValue> {
        Ok(self.s()?.batch())
    }

    /// Tensors loaded from `weightsBytes` at creation.
    #[wasm_bindgen(getter, js_name = loadedTensors)]
    pub fn loaded_tensors(&self) -> Result<usize, JsValue> {
        Ok(self.s()?.loaded_tensors())
    }

    /// Training steps taken.
    #[wasm_bindgen(getter)]
    pub fn steps(&self) -> Result<u32, JsValue> {
        Ok(self.s()?.steps())
    }
}
