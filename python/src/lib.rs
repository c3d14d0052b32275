//! `frugal._frugal`: the Python binding (PyO3, abi3). A thin shim: arguments are checked and turned
//! into slices (NumPy arrays read in place where their layout allows), the work is
//! `frugal_android::Trainer`'s — the same trainer as the C ABI and JNI (a ladder of plans, a live
//! budget read before every instruction, plan info) — and every error becomes a Python exception
//! carrying the message the CLI prints. The GIL is released while a step runs, so another Python
//! thread may lower the budget mid-step (`set_budget`), as a phone's memory-pressure callback does.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use frugal_android::trainer::UNLIMITED;
use frugal_android::{Error, Options, Trainer as Core};
use frugal_cli::data;
use frugal_cli::spec_toml::{load_model, parse_model, ModelFile};
use frugal_cli::train::parse_size;
use frugal_core::budget::BudgetError as CoreBudgetError;
use frugal_core::model::Precision;
use numpy::{PyArray1, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

mod int8;

use int8::Int8Trainer;

/// The trainer behind a Python `Trainer`: f32 (a plan ladder and a live budget) or int8 (one plan).
enum Engine {
    F32(Core),
    Int8(Int8Trainer),
}

impl Engine {
    fn train_batch(&mut self, x: &[f32], y: &[u32], live: &AtomicU64) -> Result<f32, Error> {
        match self {
            Engine::F32(t) => t.train_batch(x, y, live),
            Engine::Int8(t) => t.train_batch(x, y),
        }
    }
    fn evaluate(&mut self, x: &[f32], y: &[u32]) -> Result<(f32, usize), Error> {
        match self {
            Engine::F32(t) => t.evaluate(x, y),
            Engine::Int8(t) => t.evaluate(x, y),
        }
    }
    fn predict(&mut self, x: &[f32]) -> Result<Vec<f32>, Error> {
        match self {
            Engine::F32(t) => t.predict(x),
            Engine::Int8(t) => t.predict(x),
        }
    }
    fn state(&mut self) -> Result<Vec<frugal_host::NamedTensor>, Error> {
        match self {
            Engine::F32(t) => t.state(),
            Engine::Int8(t) => t.state(),
        }
    }
    fn load_state(&mut self, w: &[frugal_host::NamedTensor]) -> Result<usize, Error> {
        match self {
            Engine::F32(t) => t.load_state(w),
            Engine::Int8(t) => t.load_state(w),
        }
    }
    fn plan_info(&self) -> frugal_android::PlanInfo {
        match self {
            Engine::F32(t) => t.plan_info(),
            Engine::Int8(t) => t.plan_info(),
        }
    }
    fn set_budget(&mut self, b: u64) -> Result<(), Error> {
        match self {
            Engine::F32(t) => t.set_budget(b),
            Engine::Int8(t) => t.set_budget(b),
        }
    }
}

create_exception!(
    _frugal,
    FrugalError,
    PyException,
    "Every error frugal reports (its message is the CLI's)."
);
create_exception!(
    _frugal,
    ModelError,
    FrugalError,
    "The model description is not valid (the message names the line, column and field)."
);
create_exception!(
    _frugal,
    WeightsError,
    FrugalError,
    "Weights that do not fit the model (a name, a shape, a non-finite value)."
);
create_exception!(
    _frugal,
    BudgetError,
    FrugalError,
    "No plan fits the memory budget; `needed_bytes` is the smallest budget that works."
);
create_exception!(
    _frugal,
    StepError,
    FrugalError,
    "A training or evaluation step failed (a non-finite loss, out of memory, ...)."
);

/// The Python exception for a trainer error: argument errors are `ValueError`s, the rest frugal's.
fn py_err(e: Error) -> PyErr {
    let msg = e.to_string();
    match &e {
        Error::Argument(..) | Error::BufferTooSmall { .. } | Error::Null(_) => {
            PyValueError::new_err(msg)
        }
        Error::Model(_) | Error::Graph(_) => ModelError::new_err(msg),
        Error::Weights(_) => WeightsError::new_err(msg),
        Error::Budget(_) => budget_err(msg, e.needed_bytes()),
        Error::Exec(_) if e.needed_bytes().is_some() => budget_err(msg, e.needed_bytes()),
        _ => StepError::new_err(msg),
    }
}

/// A `BudgetError` with `needed_bytes` set.
fn budget_err(msg: String, needed: Option<usize>) -> PyErr {
    Python::attach(|py| {
        let err = BudgetError::new_err(msg);
        if let Some(n) = needed {
            // Setting an attribute on a fresh exception object cannot fail short of out-of-memory,
            // in which case the exception keeps its message without the attribute.
            let _ = err.value(py).setattr("needed_bytes", n);
        }
        err
    })
}

/// A budget from Python: `None` (no limit), an int of bytes, or a size string ("512KiB", "2MiB").
fn budget_of(b: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
    let Some(b) = b else { return Ok(UNLIMITED) };
    if b.is_none() {
        return Ok(UNLIMITED);
    }
    if let Ok(n) = b.extract::<u64>() {
        return Ok(n);
    }
    if let Ok(s) = b.extract::<String>() {
        return parse_size(&s)
            .map(|n| n as u64)
            .map_err(|e| PyValueError::new_err(format!("budget: {e}")));
    }
    Err(PyTypeError::new_err(
        "budget must be None, a number of bytes or a size such as \"512KiB\"",
    ))
}

/// The model: TOML text, or the path of a `.toml` file (one line ending in `.toml`).
fn model_of(model: &str) -> PyResult<ModelFile> {
    let t = model.trim();
    let r = if !t.contains('\n') && t.ends_with(".toml") {
        load_model(std::path::Path::new(t))
    } else {
        parse_model(model)
    };
    r.map_err(|e| ModelError::new_err(e.to_string()))
}

/// `x` as a C-contiguous float32 array of `n` samples (read in place when it already is one).
fn inputs<'py>(
    x: &Bound<'py, PyAny>,
    per: usize,
    dims: &[usize],
) -> PyResult<PyReadonlyArrayDyn<'py, f32>> {
    // The common case first, without calling into NumPy: a C-contiguous float32 array.
    if let Ok(a) = x.extract::<PyReadonlyArrayDyn<'py, f32>>() {
        if a.is_c_contiguous() && sample_shape_ok(a.shape(), per, dims) && a.shape()[0] > 0 {
            return Ok(a);
        }
    }
    let py = x.py();
    let np = py.import("numpy")?;
    // `asarray` returns an ndarray itself unchanged (no copy); scalars and lists become arrays.
    let arr = np.call_method1("asarray", (x,))?;
    let dtype = arr.getattr("dtype")?.str()?.to_string();
    if dtype != "float32" {
        return Err(PyTypeError::new_err(format!(
            "x: has dtype {dtype}; frugal computes in float32 (convert with x.astype(numpy.float32))"
        )));
    }
    let mut a: PyReadonlyArrayDyn<'py, f32> = arr.extract()?;
    if !a.is_c_contiguous() {
        a = np.call_method1("ascontiguousarray", (arr,))?.extract()?;
    }
    let shape = a.shape();
    let ok = sample_shape_ok(shape, per, dims);
    if ok && shape[0] == 0 {
        return Err(PyValueError::new_err(format!(
            "x: has shape {}: no samples",
            py_shape(shape)
        )));
    }
    if !ok {
        return Err(PyValueError::new_err(format!(
            "x: has shape {}; samples of the model's input must be (n, {per}) or (n, {})",
            py_shape(shape),
            dims.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(a)
}

/// The samples of a checked input array (C-contiguous by construction).
fn samples<'a>(xa: &'a PyReadonlyArrayDyn<'_, f32>) -> PyResult<&'a [f32]> {
    xa.as_slice()
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Whether `shape` is `n` samples of the model's input: `(n, per)` or `(n, *dims)`.
fn sample_shape_ok(shape: &[usize], per: usize, dims: &[usize]) -> bool {
    match shape.len() {
        0 | 1 => false,
        2 => shape[1] == per,
        _ => shape[1..] == *dims,
    }
}

/// A shape as Python prints it: `(4, 63)`, `(10,)`.
fn py_shape(shape: &[usize]) -> String {
    let inner: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    match inner.len() {
        1 => format!("({},)", inner[0]),
        _ => format!("({})", inner.join(", ")),
    }
}

/// Class labels: a contiguous one-dimensional uint32 array read in place, or converted ones.
enum Labels<'py> {
    View(PyReadonlyArrayDyn<'py, u32>),
    Owned(Vec<u32>),
}

impl std::ops::Deref for Labels<'_> {
    type Target = [u32];
    fn deref(&self) -> &[u32] {
        match self {
            // Contiguity was checked when the view was taken (`labels`).
            Labels::View(a) => a.as_slice().unwrap_or(&[]),
            Labels::Owned(v) => v,
        }
    }
}

/// `y` as class labels (contiguous uint32 arrays are read in place; other integer arrays and
/// sequences are converted).
fn labels<'py>(y: &Bound<'py, PyAny>) -> PyResult<Labels<'py>> {
    if let Ok(a) = y.extract::<PyReadonlyArrayDyn<'py, u32>>() {
        if a.ndim() == 1 && a.is_c_contiguous() {
            return Ok(Labels::View(a));
        }
    }
    let py = y.py();
    let arr = py.import("numpy")?.call_method1("asarray", (y,))?;
    let kind: String = arr.getattr("dtype")?.getattr("kind")?.extract()?;
    if kind != "i" && kind != "u" {
        let dtype = arr.getattr("dtype")?.str()?.to_string();
        return Err(PyTypeError::new_err(format!(
            "y: has dtype {dtype}; labels must be integers (class indices)"
        )));
    }
    let a: PyReadonlyArrayDyn<'_, i64> = arr.call_method1("astype", ("int64",))?.extract()?;
    if a.ndim() != 1 {
        return Err(PyValueError::new_err(format!(
            "y: has shape {}; labels must be one-dimensional",
            py_shape(a.shape())
        )));
    }
    a.as_array()
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            u32::try_from(l).map_err(|_| {
                PyValueError::new_err(format!(
                    "y: label {i} is {l}; labels are class indices from 0"
                ))
            })
        })
        .collect::<PyResult<Vec<u32>>>()
        .map(Labels::Owned)
}

/// A trainer that fits a memory budget: the model's plans from the smallest to the plain one, and
/// the one the budget in force allows.
///
/// `Trainer(model, budget=None, precision="f32", batch=None, seed=None)`: `model` is TOML text or
/// the path of a `.toml` model file; `budget` a size such as "512KiB" or a number of bytes (None: no
/// limit); `precision` "f32", "int8" or "int8-master" (int8: one plan); `batch` samples per step (None: the model file's `[train] batch`, else 32); `seed` the
/// weight initialisation's seed (None: the model's).
#[pyclass(module = "frugal._frugal", frozen)]
struct Trainer {
    inner: Mutex<Engine>,
    /// "f32", "int8" or "int8-master".
    precision: String,
    /// The live budget (bytes; `UNLIMITED`: none), read before every instruction of a step.
    live: AtomicU64,
    /// The smallest budget any plan fits.
    floor: usize,
    per: usize,
    dims: Vec<usize>,
    classes: usize,
    batch: usize,
}

impl Trainer {
    /// `n` training steps on one batch (checked once), the GIL released: the last loss and the
    /// seconds the steps took. `train_step` is `n = 1`; the bench's Rust loop is the same call.
    fn steps(
        &self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        y: &Bound<'_, PyAny>,
        n: u32,
    ) -> PyResult<(f32, f64)> {
        let xa = inputs(x, self.per, &self.dims)?;
        let ya = labels(y)?;
        let ya: &[u32] = &ya;
        let xs = samples(&xa)?;
        py.detach(|| {
            let mut t = self.lock()?;
            let start = std::time::Instant::now();
            let mut loss = 0.0;
            for _ in 0..n {
                loss = t.train_batch(xs, ya, &self.live).map_err(py_err)?;
            }
            Ok((loss, start.elapsed().as_secs_f64()))
        })
    }

    fn lock(&self) -> PyResult<MutexGuard<'_, Engine>> {
        self.inner.lock().map_err(|_| {
            StepError::new_err("the trainer is unusable: a call on another thread panicked")
        })
    }
}

#[pymethods]
impl Trainer {
    #[new]
    #[pyo3(signature = (model, budget=None, precision="f32", batch=None, seed=None))]
    fn new(
        model: &str,
        budget: Option<&Bound<'_, PyAny>>,
        precision: &str,
        batch: Option<usize>,
        seed: Option<u64>,
    ) -> PyResult<Trainer> {
        let precision_name = match precision {
            "int8-integer" => "int8".to_string(),
            p => p.to_string(),
        };
        let precision =
            frugal_cli::train::parse_precision(precision, frugal_cli::train::DEFAULT_UPDATE_BITS)
                .map_err(|e| PyValueError::new_err(format!("precision: {e}")))?;
        let budget = budget_of(budget)?;
        let mf = model_of(model)?;
        let batch = batch.or(mf.train.batch.map(|b| b as usize)).unwrap_or(32);
        let dims = [mf.spec.input.c, mf.spec.input.h, mf.spec.input.w]
            .map(|d| d as usize)
            .to_vec();
        // The model file's `[train] weights` (a safetensors checkpoint), as `frugal train` loads them.
        let tensors = match &mf.train.weights {
            Some(w) => frugal_cli::checkpoint::load_safetensors(w)
                .map_err(|e| WeightsError::new_err(e.to_string()))?,
            None => Vec::new(),
        };
        let name = precision_name;
        let t = if precision == Precision::F32 {
            Engine::F32(
                Core::from_spec(
                    mf.spec,
                    &tensors,
                    budget,
                    Options {
                        batch,
                        seed,
                        classes: None,
                    },
                )
                .map_err(py_err)?,
            )
        } else {
            Engine::Int8(
                Int8Trainer::new(mf.spec, &tensors, budget, batch, seed, precision)
                    .map_err(py_err)?,
            )
        };
        let info = t.plan_info();
        let (per, classes) = match &t {
            Engine::F32(c) => (c.input_size(), c.classes()),
            Engine::Int8(c) => (dims.iter().product(), c.classes()),
        };
        Ok(Trainer {
            live: AtomicU64::new(budget),
            floor: info.floor_bytes,
            per,
            dims,
            classes,
            batch,
            precision: name,
            inner: Mutex::new(t),
        })
    }

    /// One training step on `x` (float32, `(n, *input)` or `(n, features)`, 1 ≤ n ≤ batch) with
    /// integer labels `y` (n,); returns the step's mean loss. A C-contiguous float32 `x` is read in
    /// place.
    fn train_step(
        &self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        y: &Bound<'_, PyAny>,
    ) -> PyResult<f32> {
        self.steps(py, x, y, 1).map(|(loss, _)| loss)
    }

    /// Trains `epochs` passes over `x`, `y` in batches of the trainer's batch (the last may be
    /// smaller); returns each epoch's mean loss. `shuffle`: a new order every epoch, fixed by
    /// `(seed, epoch)` (the CLI's); without it batches are read from `x` in place.
    #[pyo3(signature = (x, y, epochs=1, shuffle=true, seed=0))]
    fn fit(
        &self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        y: &Bound<'_, PyAny>,
        epochs: u32,
        shuffle: bool,
        seed: u64,
    ) -> PyResult<Vec<f32>> {
        let xa = inputs(x, self.per, &self.dims)?;
        let ya = labels(y)?;
        let ya: &[u32] = &ya;
        let xs = samples(&xa)?;
        let n = ya.len();
        if n == 0 || xs.len() != n * self.per {
            return Err(PyValueError::new_err(format!(
                "x and y: {} inputs and {n} labels (need the same number, at least 1)",
                xs.len() / self.per.max(1)
            )));
        }
        let (per, batch) = (self.per, self.batch);
        py.detach(|| {
            let mut t = self.lock()?;
            let mut out = Vec::with_capacity(epochs as usize);
            let (mut xb, mut yb) = (Vec::new(), Vec::new());
            for epoch in 0..epochs {
                let order = shuffle.then(|| data::shuffled(n, seed, u64::from(epoch)));
                let (mut sum, mut i) = (0f64, 0usize);
                while i < n {
                    let k = batch.min(n - i);
                    let loss = match &order {
                        None => {
                            t.train_batch(&xs[i * per..(i + k) * per], &ya[i..i + k], &self.live)
                        }
                        Some(o) => {
                            xb.clear();
                            yb.clear();
                            for &j in &o[i..i + k] {
                                xb.extend_from_slice(&xs[j * per..(j + 1) * per]);
                                yb.push(ya[j]);
                            }
                            t.train_batch(&xb, &yb, &self.live)
                        }
                    }
                    .map_err(py_err)?;
                    sum += f64::from(loss) * k as f64;
                    i += k;
                }
                out.push((sum / n as f64) as f32);
            }
            Ok(out)
        })
    }

    /// Mean loss and accuracy over `x`, `y` (any number of samples): `{"loss", "accuracy",
    /// "correct", "samples"}`. No update.
    fn evaluate<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        y: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let xa = inputs(x, self.per, &self.dims)?;
        let ya = labels(y)?;
        let ya: &[u32] = &ya;
        let xs = samples(&xa)?;
        let (loss, correct) = py.detach(|| self.lock()?.evaluate(xs, ya).map_err(py_err))?;
        let d = PyDict::new(py);
        d.set_item("loss", loss)?;
        d.set_item("accuracy", correct as f64 / ya.len() as f64)?;
        d.set_item("correct", correct)?;
        d.set_item("samples", ya.len())?;
        Ok(d)
    }

    /// Class probabilities (softmax), `(n, classes)` float32.
    fn predict<'py>(&self, py: Python<'py>, x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let xa = inputs(x, self.per, &self.dims)?;
        let xs = samples(&xa)?;
        let n = xs.len() / self.per.max(1);
        let p = py.detach(|| self.lock()?.predict(xs).map_err(py_err))?;
        Ok(PyArray1::from_vec(py, p)
            .reshape([n, self.classes])?
            .into_any())
    }

    /// The parameters and statistics as a dict of float32 arrays (PyTorch `state_dict` names, in
    /// the model's order: layer by layer, parameters then statistics).
    fn get_weights<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let state = py.detach(|| self.lock()?.state().map_err(py_err))?;
        let d = PyDict::new(py);
        for (name, shape, v) in state {
            d.set_item(name, PyArray1::from_vec(py, v).reshape(shape)?)?;
        }
        Ok(d)
    }

    /// Loads `weights` (a dict as `get_weights` returns; any subset of the tensors) and returns how
    /// many were loaded. Every tensor is checked (known name, same shape, finite values) before
    /// any is written: a refused call changes nothing.
    fn set_weights(&self, py: Python<'_>, weights: &Bound<'_, PyDict>) -> PyResult<usize> {
        let mut tensors = Vec::with_capacity(weights.len());
        for (k, v) in weights.iter() {
            let name: String = k.extract().map_err(|_| {
                PyTypeError::new_err("set_weights: keys must be tensor names (str)")
            })?;
            let dtype = v
                .getattr("dtype")
                .and_then(|d| d.str().map(|s| s.to_string()))
                .unwrap_or_else(|_| type_name(&v));
            let a: PyReadonlyArrayDyn<'_, f32> = v.extract().map_err(|_| {
                PyTypeError::new_err(format!(
                    "set_weights: tensor {name} is {dtype}; weights must be float32 arrays"
                ))
            })?;
            tensors.push((
                name,
                a.shape().to_vec(),
                a.as_array().iter().copied().collect(),
            ));
        }
        py.detach(|| self.lock()?.load_state(&tensors).map_err(py_err))
    }

    /// The plan in force and the budget: a dict with `arena_bytes`, `allocated_bytes`,
    /// `lower_bound`, `floor_bytes`, `budget` (None: unlimited), `micro_batch`, `micro_batches`,
    /// `recomputes`, `rung`, `rungs`, `steps`, `switches`, `mid_step_switches`, `batch`, `precision`.
    fn plan_info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let i = self.lock()?.plan_info();
        let d = PyDict::new(py);
        d.set_item("arena_bytes", i.arena_bytes)?;
        d.set_item("allocated_bytes", i.allocated_bytes)?;
        d.set_item("lower_bound", i.lower_bound)?;
        d.set_item("floor_bytes", i.floor_bytes)?;
        d.set_item("budget", i.budget)?;
        d.set_item("micro_batch", i.micro_batch)?;
        d.set_item("micro_batches", i.micro_batches)?;
        d.set_item("recomputes", i.recomputes)?;
        d.set_item("rung", i.rung)?;
        d.set_item("rungs", i.rungs)?;
        d.set_item("steps", i.steps)?;
        d.set_item("switches", i.switches)?;
        d.set_item("mid_step_switches", i.mid_step_switches)?;
        d.set_item("batch", self.batch)?;
        d.set_item("precision", &self.precision)?;
        Ok(d)
    }

    /// Sets the budget (a size string, bytes, or None for no limit). Between steps the trainer
    /// switches plans at once; called from another thread while a step runs, the step switches
    /// before its next instruction. A budget below the smallest plan raises `BudgetError` and
    /// changes nothing.
    #[pyo3(signature = (budget))]
    fn set_budget(&self, budget: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let b = budget_of(budget)?;
        if (b as u128) < self.floor as u128 {
            return Err(py_err(Error::Budget(CoreBudgetError::TooSmall {
                needed: self.floor,
                given: b as usize,
            })));
        }
        self.live.store(b, Ordering::Release);
        // At rest: switch now. Busy (a step on another thread): that step reads the new budget.
        match self.inner.try_lock() {
            Ok(mut t) => t.set_budget(b).map_err(py_err),
            Err(_) => Ok(()),
        }
    }

    /// Benchmark support (`python/bench/figures.py`): runs `n` steps on `x`, `y` from Rust — the same
    /// `train_batch` call `train_step` makes, without Python in between — and returns the seconds
    /// they took. The inputs are checked once, as one `train_step` checks them.
    fn _time_steps(
        &self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        y: &Bound<'_, PyAny>,
        n: u32,
    ) -> PyResult<f64> {
        self.steps(py, x, y, n).map(|(_, secs)| secs)
    }

    /// Samples per step.
    #[getter]
    fn batch(&self) -> usize {
        self.batch
    }

    /// The shape of one input sample (channels, height, width).
    #[getter]
    fn input_shape(&self) -> (usize, usize, usize) {
        (self.dims[0], self.dims[1], self.dims[2])
    }

    /// Classes the model predicts.
    #[getter]
    fn classes(&self) -> usize {
        self.classes
    }

    fn __repr__(&self) -> PyResult<String> {
        let i = self.lock()?.plan_info();
        Ok(format!(
            "Trainer(batch={}, arena_bytes={}, rung={}/{}, budget={})",
            self.batch,
            i.arena_bytes,
            i.rung,
            i.rungs,
            i.budget.map_or("None".into(), |b| b.to_string())
        ))
    }
}

fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The bundled UCI digits (1437 training and 360 held-out samples of 1×8×8 in [0, 1], 10 classes):
/// `(x_train, y_train, x_test, y_test)`, x float32 `(n, 1, 8, 8)`, y uint32 `(n,)`.
#[pyfunction]
fn digits(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
    let (train, test) = data::digits();
    let mut out: Vec<Bound<'_, PyAny>> = Vec::new();
    for ds in [train, test] {
        let n = ds.len();
        let d = ds.dims;
        out.push(
            PyArray1::from_vec(py, ds.x)
                .reshape([n, d.c as usize, d.h as usize, d.w as usize])?
                .into_any(),
        );
        out.push(PyArray1::from_vec(py, ds.y).into_any());
    }
    PyTuple::new(py, out)
}

/// Bytes in a size string such as "512KiB", "2MiB", "1.5MB" or "4096" (the CLI's `--budget`).
#[pyfunction]
fn parse_budget(size: &str) -> PyResult<usize> {
    parse_size(size).map_err(|e| PyValueError::new_err(format!("budget: {e}")))
}

#[pymodule]
fn _frugal(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Trainer>()?;
    m.add_function(wrap_pyfunction!(digits, m)?)?;
    m.add_function(wrap_pyfunction!(parse_budget, m)?)?;
    m.add("FrugalError", py.get_type::<FrugalError>())?;
    m.add("ModelError", py.get_type::<ModelError>())?;
    m.add("WeightsError", py.get_type::<WeightsError>())?;
    m.add("BudgetError", py.get_type::<BudgetError>())?;
    m.add("StepError", py.get_type::<StepError>())?;
    Ok(())
}
