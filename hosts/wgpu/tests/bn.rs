//! BatchNorm (training mode) on the GPU against frugal-core's CPU `ops::bn`: output, batch and running
//! statistics, γ/β gradients and the input gradient, plain and accumulating.
#![cfg(not(target_arch = "wasm32"))] // natively; the browser suite is tests/web.rs
mod common;
use common::{data, gpu};
use frugal_core::ops;

/// Norm-wise 1e-5 (values) / elementwise 1e-5 relative (statistics): both use compensated sums of the
/// same terms in another order and the same formulas; what differs is WGSL's sqrt (2.5 ULP against the
/// CPU's correctly rounded one) and reassociation in a few products — a handful of ULP.
fn close(what: &str, gpu: &[f32], cpu: &[f32]) {
    common::close_norm(what, gpu, cpu, 1e-5);
}

#[test]
fn batchnorm_training_forward_and_backward_match_the_cpu() {
    let Some(gpu) = gpu() else { return };
    for (n, c, hw) in [(4, 3, 25), (1, 5, 7), (8, 16, 1), (2, 2, 300)] {
        // Offset and scaled inputs, so the variance is not trivially 1/3.
        let x: Vec<f32> = data(n * c * hw, 1, 2.0).iter().map(|v| v + 0.75).collect();
        let gamma = data(c, 2, 1.0);
        let beta = data(c, 3, 1.0);
        let (rm, rv) = (
            data(c, 4, 0.1),
            data(c, 5, 0.1).iter().map(|v| 1.0 + v).collect::<Vec<_>>(),
        );
        let (momentum, eps) = (0.1, 1e-5);
        let mut y = vec![0f32; x.len()];
        let (mut mean, mut invstd) = (vec![0f32; c], vec![0f32; c]);
        let (mut rm_c, mut rv_c) = (rm.clone(), rv.clone());
        ops::bn_fwd_train(
            n,
            c,
            hw,
            &x,
            &gamma,
            &beta,
            &mut y,
            &mut mean,
            &mut invstd,
            &mut rm_c,
            &mut rv_c,
            momentum,
            eps,
        );
        let f = gpu
            .bn_fwd_train((n, c, hw), &x, &gamma, &beta, &rm, &rv, momentum, eps)
            .unwrap();
        close("y", &f.y, &y);
        close("mean", &f.mean, &mean);
        close("invstd", &f.invstd, &invstd);
        close("running mean", &f.run_mean, &rm_c);
        close("running variance", &f.run_var, &rv_c);

        let dy = data(x.len(), 6, 1.0);
        for acc in [false, true] {
            let (og, ob, ox) = (data(c, 7, 1.0), data(c, 8, 1.0), data(x.len(), 9, 1.0));
            let (mut dg, mut db, mut dx) = (og.clone(), ob.clone(), ox.clone());
            ops::bn_grad_w(n, c, hw, &x, &dy, &mean, &invstd, &mut dg, &mut db, acc);
            ops::bn_grad_x(n, c, hw, &x, &dy, &mean, &invstd, &gamma, &mut dx, acc);
            let old = acc.then_some((&og[..], &ob[..], &ox[..]));
            let g = gpu
                .bn_grad((n, c, hw), &x, &dy, &mean, &invstd, &gamma, old)
                .unwrap();
            close(&format!("dgamma ({n},{c},{hw}) acc {acc}"), &g.dgamma, &dg);
            close(&format!("dbeta ({n},{c},{hw}) acc {acc}"), &g.dbeta, &db);
            close(&format!("dx ({n},{c},{hw}) acc {acc}"), &g.dx, &dx);
        }
    }
}

/// Evaluation mode: one affine map per channel from the running statistics, forward and input gradient.
/// WGSL's sqrt is 2.5 ULP against the CPU's correctly rounded one, and γ/√v is rounded once more before
/// the product on either side: 8 ULP of each value.
#[test]
fn batchnorm_evaluation_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let (n, c, hw) = (3, 4, 10);
    let x = data(n * c * hw, 1, 2.0);
    let (gamma, beta, rm) = (data(c, 2, 1.0), data(c, 3, 1.0), data(c, 4, 0.5));
    let rv: Vec<f32> = data(c, 5, 0.5).iter().map(|v| 1.0 + v).collect();
    let eps = 1e-5;
    let mut y = vec![0f32; x.len()];
    ops::bn_fwd_eval(n, c, hw, &x, &gamma, &beta, &rm, &rv, eps, &mut y);
    let gy = gpu
        .bn_fwd_eval((n, c, hw), &x, &gamma, &beta, &rm, &rv, eps)
        .unwrap();
    let ulps = |got: &[f32], want: &[f32], what: &str| {
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 8.0 * f32::EPSILON * w.abs().max(1.0),
                "{what}[{i}]: GPU {g}, CPU {w}"
            );
        }
    };
    ulps(&gy, &y, "y");
    let dy = data(x.len(), 6, 1.0);
    let old = data(x.len(), 7, 1.0);
    for acc in [false, true] {
        let mut dx = old.clone();
        ops::bn_grad_x_eval(n, c, hw, &dy, &gamma, &rv, eps, &mut dx, acc);
        let gdx = gpu
            .bn_grad_x_eval((n, c, hw), &dy, &gamma, &rv, eps, acc.then_some(&old[..]))
            .unwrap();
        ulps(&gdx, &dx, "dx");
    }
}
