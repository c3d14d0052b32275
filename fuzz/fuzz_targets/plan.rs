//! Plan files (`FRGP`), outer and nested model frames repaired so mutations reach the plan body; a plan
//! that decodes must run: its executor is created over an arena of the plan's size and one step trains
//! on zeros (decoding claims to trust nothing, so a decoded plan never indexes outside its arena).
#![no_main]
use frugal_core::exec::{Executor, Target};
use frugal_core::format::plan::decode_plan_unnamed;
use frugal_core::format::{decode_plan, encode_plan};
use frugal_core::model::{LossKind, Precision};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_plan(data);
    let mut fixed = data.to_vec();
    if !frugal_fuzz::repair_nested(&mut fixed) {
        return;
    }
    let unnamed = decode_plan_unnamed(&fixed);
    let Ok((spec, plan)) = decode_plan(&fixed) else {
        assert!(
            unnamed.is_err(),
            "the unnamed decoder accepts what the named one refuses"
        );
        return;
    };
    assert!(
        unnamed.is_ok(),
        "the unnamed decoder refuses what the named one accepts"
    );
    // Re-encoding a decoded plan gives a plan that decodes.
    decode_plan(&encode_plan(&spec, &plan)).expect("a decoded plan re-encodes");
    if plan.graph.precision != Precision::F32 || plan.needed_bytes() > frugal_fuzz::MAX_RUN_ARENA {
        return;
    }
    let mut arena = vec![0u8; plan.needed_bytes()];
    let Ok(mut ex) = Executor::new(&plan, &arena) else {
        return;
    };
    if ex.init_params(&mut arena, 1).is_err() {
        return;
    }
    let n = plan.batch();
    let per = plan.graph.input_dims.numel();
    let outs = plan.graph.pred_dims().numel();
    if n.saturating_mul(per.max(outs)) > 1 << 20 {
        return;
    }
    let x = vec![0.5f32; n * per];
    let y = vec![0u32; n];
    let v = vec![0.25f32; n * outs];
    let target = match spec.loss {
        LossKind::Mse => Target::Values(&v),
        LossKind::SoftmaxCrossEntropy => Target::Classes(&y),
    };
    let _ = ex.train_step(&mut arena, &x, target);
});
