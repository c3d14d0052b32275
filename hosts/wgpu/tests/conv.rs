//! Convolution on the GPU against frugal-core's CPU `ops::conv` — forward, weight and bias gradients,
//! input gradient, plain and accumulating — for strided, padded, grouped, depthwise and 1×1 geometries.
#![cfg(not(target_arch = "wasm32"))] // natively; the browser suite is tests/web.rs
mod common;
use common::gpu;
use frugal_core::ops::{self, ConvGeom};
use frugal_wgpu::GpuError;

fn data(len: usize, seed: u64) -> Vec<f32> {
    common::data(len, seed, 1.0)
}

/// Norm-wise: ‖gpu − cpu‖ ≤ 1e-5·‖cpu‖. Both sum the same products (k = cin/groups·kh·kw, or the
/// positions and samples for the weight gradient) in different orders; each element is within
/// 2·k·2⁻²⁴·Σ|products| of the exact value, far below 1e-5 of the norm for these sizes (k ≤ 400).
fn close(what: &str, gpu: &[f32], cpu: &[f32]) {
    common::close_norm(what, gpu, cpu, 1e-5);
}

#[test]
fn convolution_forward_and_gradients_match_the_cpu() {
    let Some(gpu) = gpu() else { return };
    // (cin, h, w, cout, kh, kw, sh, sw, ph, pw, groups)
    for (cin, h, w, cout, kh, kw, sh, sw, ph, pw, groups) in [
        (3, 9, 9, 8, 3, 3, 1, 1, 1, 1, 1),   // same padding
        (4, 10, 7, 6, 3, 2, 2, 2, 1, 0, 2),  // strided, asymmetric, two groups
        (6, 8, 8, 6, 3, 3, 2, 2, 1, 1, 6),   // depthwise, stride 2
        (5, 4, 4, 7, 1, 1, 1, 1, 0, 0, 1),   // pointwise
        (16, 8, 8, 16, 5, 5, 1, 1, 2, 2, 1), // k = 400
    ] {
        let g = ConvGeom::new(cin, h, w, cout, kh, kw, sh, sw, ph, pw, groups).unwrap();
        let n = 2;
        let x = data(n * g.in_len(), 1);
        let wt = data(g.weight_len(), 2);
        let b = data(cout, 3);
        let dy = data(n * g.out_len(), 4);
        let mut scratch = vec![0f32; ops::conv_scratch_len(&g, n)];

        let mut y = vec![0f32; n * g.out_len()];
        ops::conv_fwd(&g, n, &x, &wt, Some(&b), &mut y, &mut scratch);
        close(
            &format!("y {g:?}"),
            &gpu.conv_fwd(&g, n, &x, &wt, Some(&b)).unwrap(),
            &y,
        );

        for acc in [false, true] {
            let (ow, ob, ox) = (data(g.weight_len(), 5), data(cout, 6), data(x.len(), 7));
            let (mut dw, mut db, mut dx) = (ow.clone(), ob.clone(), ox.clone());
            ops::conv_grad_w(&g, n, &x, &dy, &mut dw, Some(&mut db), acc, &mut scratch);
            ops::conv_grad_x(&g, n, &dy, &wt, &mut dx, acc, &mut scratch);
            let old = acc.then_some((&ow[..], &ob[..]));
            let (gdw, gdb) = gpu.conv_grad_w(&g, n, &x, &dy, old, true).unwrap();
            let gdx = gpu
                .conv_grad_x(&g, n, &dy, &wt, acc.then_some(&ox[..]))
                .unwrap();
            close(&format!("dW {g:?} accumulate {acc}"), &gdw, &dw);
            close(&format!("db {g:?} accumulate {acc}"), &gdb, &db);
            close(&format!("dx {g:?} accumulate {acc}"), &gdx, &dx);
        }
    }
}

#[test]
fn convolution_operands_of_the_wrong_size_are_errors() {
    let Some(gpu) = gpu() else { return };
    let g = ConvGeom::new(1, 4, 4, 2, 3, 3, 1, 1, 0, 0, 1).unwrap();
    assert!(matches!(
        gpu.conv_fwd(&g, 1, &[0.0; 15], &[0.0; 18], None),
        Err(GpuError::Shape(_))
    ));
    assert!(matches!(
        gpu.conv_grad_x(&g, 1, &[0.0; 8], &[0.0; 17], None),
        Err(GpuError::Shape(_))
    ));
}
