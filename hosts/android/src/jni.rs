//! The JNI binding: the `native` methods of `ai.frugal.Trainer` and `ai.frugal.MemoryBudget`
//! (`hosts/android/java`, `hosts/android/kotlin`). Each is a thin shim over [`crate::registry`] —
//! the same code the C ABI calls — inside `catch_unwind`; a failure is thrown as
//! `ai.frugal.FrugalException(int code, String message, long neededBytes)` with the C ABI's status
//! code, and the method returns 0 / null (ignored by the JVM once an exception is pending).
//!
//! Budgets are Java `long`s: `-1` is unlimited (`Trainer.UNLIMITED`), other negative values are
//! argument errors. Handles are the registry's `u64` as a `long`.
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::null_mut;

use jni::objects::{JByteArray, JClass, JFloatArray, JThrowable, JValue};
use jni::sys::{jboolean, jbyteArray, jfloatArray, jint, jlong, jlongArray};
use jni::JNIEnv;

use crate::error::Error;
use crate::memory::{budget_for, FrugalMemorySignal};
use crate::registry;
use crate::trainer::{Options, UNLIMITED};

const EXCEPTION: &str = "ai/frugal/FrugalException";

fn jni_error(e: jni::errors::Error) -> Error {
    Error::Argument("jni", e.to_string())
}

/// Throws `e` as a `FrugalException` (a `RuntimeException` if that class cannot be made).
fn throw(env: &mut JNIEnv<'_>, e: &Error) {
    // An exception already pending (from a failed JNI call) is replaced by ours.
    let _ = env.exception_clear();
    let msg = e.to_string();
    let made = env.new_string(&msg).and_then(|m| {
        env.new_object(
            EXCEPTION,
            "(ILjava/lang/String;J)V",
            &[
                JValue::Int(e.status() as i32),
                JValue::Object(&m),
                JValue::Long(e.needed_bytes().map_or(0, |n| n as i64)),
            ],
        )
    });
    let thrown = match made {
        Ok(obj) => env.throw(JThrowable::from(obj)),
        Err(_) => {
            let _ = env.exception_clear();
            env.throw_new("java/lang/RuntimeException", &msg)
        }
    };
    // If even that failed, the JVM is out of memory and has an exception pending already.
    let _ = thrown;
}

/// Runs `f` with panics caught; a failure is thrown and `failed` returned (0 or null: the JVM ignores
/// a native method's value once an exception is pending).
fn run<'l, T>(
    env: &mut JNIEnv<'l>,
    failed: T,
    f: impl FnOnce(&mut JNIEnv<'l>) -> Result<T, Error>,
) -> T {
    let r = catch_unwind(AssertUnwindSafe(|| f(env))).unwrap_or_else(|p| {
        Err(Error::Panic(
            p.downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default(),
        ))
    });
    r.unwrap_or_else(|e| {
        throw(env, &e);
        failed
    })
}

fn bytes(env: &JNIEnv<'_>, a: &JByteArray<'_>, name: &'static str) -> Result<Vec<u8>, Error> {
    if a.is_null() {
        return Err(Error::Null(name));
    }
    env.convert_byte_array(a).map_err(jni_error)
}

fn floats(env: &JNIEnv<'_>, a: &JFloatArray<'_>, name: &'static str) -> Result<Vec<f32>, Error> {
    if a.is_null() {
        return Err(Error::Null(name));
    }
    let n = env.get_array_length(a).map_err(jni_error)? as usize;
    let mut v = vec![0f32; n];
    env.get_float_array_region(a, 0, &mut v)
        .map_err(jni_error)?;
    Ok(v)
}

fn float_array(env: &mut JNIEnv<'_>, v: &[f32]) -> Result<jfloatArray, Error> {
    let n = i32::try_from(v.len()).map_err(|_| Error::OutOfMemory(v.len() * 4))?;
    let a = env.new_float_array(n).map_err(jni_error)?;
    env.set_float_array_region(&a, 0, v).map_err(jni_error)?;
    Ok(a.into_raw())
}

fn budget(b: jlong) -> Result<u64, Error> {
    match b {
        -1 => Ok(UNLIMITED),
        b if b < 0 => Err(Error::Argument(
            "budget",
            format!("must be a byte count or -1 (unlimited), got {b}"),
        )),
        b => Ok(b as u64),
    }
}

fn handle(h: jlong) -> u64 {
    h as u64
}

/// `Trainer.nativeCreate(byte[] model, byte[] weights, long budget, int batch, int classes,
/// long seed, boolean hasSeed)`: a new handle.
#[no_mangle]
pub extern "system" fn Java_ai_frugal_Trainer_nativeCreate<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    model: JByteArray<'l>,
    weights: JByteArray<'l>,
    budget_bytes: jlong,
    batch: jint,
    classes: jint,
    seed: jlong,
    has_seed: jboolean,
) -> jlong {
    run(&mut env, 0, |env| {
        let model = bytes(env, &model, "model")?;
        let weights = if weights.is_null() {
            Vec::new()
        } else {
            bytes(env, &weights, "weights")?
        };
        let opts = Options {
            batch: usize::try_from(batch)
                .map_err(|_| Error::Argument("batch", format!("must be positive, got {batch}")))?,
            classes: match classes {
                0 => None,
                c if c < 0 => {
                    return Err(Error::Argument(
                        "classes",
                        format!("must be positive (0: the model's), got {c}"),
                    ))
                }
                c => Some(c as u32),
            },
            seed: (has_seed != 0).then_some(seed as u64),
        };
        let h = registry::create(&model, &weights, budget(budget_bytes)?, opts)?;
        Ok(h as jlong)
    })
}

/// `Trainer.nativeAddSample(long handle, float[] x, int label)`.
#[no_mangle]
pub extern "system" fn Java_ai_frugal_Trainer_nativeAddSample<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    h: jlong,
    x: JFloatArray<'l>,
    label: jint,
) {
    run(&mut env, (), |env| {
        let x = floats(env, &x, "x")?;
        let label = u32::try_from(label)
            .map_err(|_| Error::Argument("label", format!("must not be negative, got {label}")))?;
        registry::with_trainer(handle(h), |t, _| t.add_sample(&x, label))
    })
}

/// `Trainer.nativeTrainSteps(long handle, int steps)`: the steps' losses. A failing step throws;
/// the steps before it stand.
#[no_mangle]
pub extern "system" fn Java_ai_frugal_Trainer_nativeTrainSteps<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    h: jlong,
    steps: jint,
) -> jfloatArray {
    run(&mut env, null_mut(), |env| {
        let n = u32::try_from(steps)
            .map_err(|_| Error::Argument("steps", format!("must not be negative, got {steps}")))?;
        let mut losses = Vec::new();
        let (_, r) = registry::train_steps(handle(h), n, |_, l| losses.push(l));
        r?;
        float_array(env, &losses)
    })
}

/// `Trainer.nativePredict(long handle, float[] x)`: class probabilities, samples × classes.
#[no_mangle]
pub extern "system" fn Java_ai_frugal_Trainer_nativePredict<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    h: jlong,
    x: JFloatArray<'l>,
) -> jfloatArray {
    run(&mut env, null_mut(), |env| {
        let x = floats(env, &x, "x")?;
        let p = registry::with_trainer(handle(h), |t, _| t.predict(&x))?;
        float_array(env, &p)
    })
}

/// `Trainer.nativeSetBudget(long handle, long budget)`.
#[no_mangle]
pub extern "system" fn Java_ai_frugal_Trainer_nativeSetBudget<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    h: jlong,
    budget_bytes: jlong,
) {
    run(&mut env, (), |_| {
        registry::set_budget(handle(h), budget(budget_bytes)?)
    })
}

/// The fields of `Trainer.nativePlanInfo`'s array, in order (`Trainer.PlanInfo` reads them).
pub const PLAN_INFO_FIELDS: [&str; 13] = [
    "arenaBytes",
    "allocatedBytes",
    "lowerBound",
    "floorBytes",
    "budget",
    "switches",
    "midStepSwitches",
    "microBatch",
    "microBatches",
    "recomputes",
    "rung",
    "rungs",
    "steps",
];

/// `Trainer.nativePlanInfo(long handle)`: [`PLAN_INFO_FIELDS`] as a `long[]` (budget -1: unlimited).
#[no_mangle]
pub extern "system" fn Java_ai_frugal_Trainer_nativePlanInfo<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    h: jlong,
) -> jlongArray {
    run(&mut env, null_mut(), |env| {
        let p = crate::capi::FrugalPlanInfo::from(registry::plan_info(handle(h))?);
        let v: [i64; 13] = [
            p.arena_bytes as i64,
            p.allocated_bytes as i64,
            p.lower_bound as i64,
            p.floor_bytes as i64,
            p.budget as i64, // UNLIMITED (u64::MAX) reads as -1
            p.switches as i64,
            p.mid_step_switches as i64,
            p.micro_batch.into(),
            p.micro_batches.into(),
            p.recomputes.into(),
            p.rung.into(),
            p.rungs.into(),
            p.steps.into(),
        ];
        let a = env.new_long_array(v.len() as i32).map_err(jni_error)?;
        env.set_long_array_region(&a, 0, &v).map_err(jni_error)?;
        Ok(a.into_raw())
    })
}

/// `Trainer.nativeExportWeights(long handle)`: safetensors bytes.
#[no_mangle]
pub extern "system" fn Java_ai_frugal_Trainer_nativeExportWeights<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    h: jlong,
) -> jbyteArray {
    run(&mut env, null_mut(), |env| {
        let b = registry::with_trainer(handle(h), |t, _| t.export_weights())?;
        Ok(env.byte_array_from_slice(&b).map_err(jni_error)?.into_raw())
    })
}

/// `Trainer.nativeDestroy(long handle)`.
#[no_mangle]
pub extern "system" fn Java_ai_frugal_Trainer_nativeDestroy<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    h: jlong,
) {
    run(&mut env, (), |_| registry::remove(handle(h)))
}

/// `Trainer.nativeLiveTrainers()`: trainers alive in the process.
#[no_mangle]
pub extern "system" fn Java_ai_frugal_Trainer_nativeLiveTrainers<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
) -> jint {
    run(&mut env, 0, |_| Ok(registry::live_count() as jint))
}

/// `MemoryBudget.nativeBudgetFor(long ceiling, long floor, int trimLevel, long availMem,
/// long threshold, boolean lowMemory)`: [`crate::memory::budget_for`] (-1: unlimited).
#[no_mangle]
pub extern "system" fn Java_ai_frugal_MemoryBudget_nativeBudgetFor<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    ceiling: jlong,
    floor: jlong,
    trim_level: jint,
    avail_mem: jlong,
    threshold: jlong,
    low_memory: jboolean,
) -> jlong {
    run(&mut env, 0, |_| {
        let nonneg = |v: jlong, name: &'static str| {
            u64::try_from(v)
                .map_err(|_| Error::Argument(name, format!("must not be negative, got {v}")))
        };
        let s = FrugalMemorySignal {
            ceiling: budget(ceiling)?,
            floor: nonneg(floor, "floor")?,
            trim_level,
            low_memory: u32::from(low_memory != 0),
            avail_mem: nonneg(avail_mem, "availMem")?,
            threshold: nonneg(threshold, "threshold")?,
        };
        Ok(budget_for(&s) as jlong)
    })
}
