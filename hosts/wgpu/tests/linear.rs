//! The linear layer on the GPU against frugal-core's CPU `ops::linear` (forward, weight and bias
//! gradients, input gradient, plain and accumulating), on every adapter the machine has.
#![cfg(not(target_arch = "wasm32"))] // natively; the browser suite is tests/web.rs
mod common;
use common::gpu;

fn data(len: usize, seed: u64) -> Vec<f32> {
    common::data(len, seed, 1.0)
}
use frugal_core::ops;

/// Norm-wise: ‖gpu − cpu‖ ≤ 1e-5·‖cpu‖. Both sum the same k products in different orders (the CPU's
/// blocked GEMM, the GPU's 16-wide tiles): each element is within 2·k·2⁻²⁴·Σ|products| of the exact
/// value; for k ≤ 784 and values of one sign-mixed magnitude that is far below 1e-5 of the norm.
fn close(what: &str, gpu: &[f32], cpu: &[f32]) {
    common::close_norm(what, gpu, cpu, 1e-5);
}

#[test]
fn linear_forward_and_gradients_match_the_cpu() {
    let Some(g) = gpu() else { return };
    for &(n, fin, fout) in &[(32, 784, 64), (7, 13, 10), (1, 1, 1), (65, 100, 3)] {
        let x = data(n * fin, 1);
        let w = data(fout * fin, 2);
        let b = data(fout, 3);
        let dy = data(n * fout, 4);
        let mut scratch = vec![0f32; ops::linear_scratch_len(n, fin, fout)];

        let mut y = vec![0f32; n * fout];
        ops::linear_fwd(n, fin, fout, &x, &w, Some(&b), &mut y, &mut scratch);
        close(
            "y",
            &g.linear_fwd(n, fin, fout, &x, &w, Some(&b)).unwrap(),
            &y,
        );

        for acc in [false, true] {
            let (old_w, old_b, old_x) = (data(fout * fin, 5), data(fout, 6), data(n * fin, 7));
            let (mut dw, mut db, mut dx) = (old_w.clone(), old_b.clone(), old_x.clone());
            ops::linear_grad_w(
                n,
                fin,
                fout,
                &x,
                &dy,
                &mut dw,
                Some(&mut db),
                acc,
                &mut scratch,
            );
            ops::linear_grad_x(n, fin, fout, &dy, &w, &mut dx, acc, &mut scratch);
            let old = acc.then_some((&old_w[..], &old_b[..]));
            let (gdw, gdb) = g.linear_grad_w(n, fin, fout, &x, &dy, old, true).unwrap();
            let gdx = g
                .linear_grad_x(n, fin, fout, &dy, &w, acc.then_some(&old_x[..]))
                .unwrap();
            close(&format!("dW (accumulate {acc})"), &gdw, &dw);
            close(&format!("db (accumulate {acc})"), &gdb, &db);
            close(&format!("dx (accumulate {acc})"), &gdx, &dx);
        }
    }
}
