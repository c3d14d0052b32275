//! Max and average pooling on the GPU against frugal-core's CPU `ops::pool`, bit for bit: the kernels
//! compare and add in the CPU's order. Overlapping windows (stride below the window) included, so the
//! backward passes' gathers meet several windows per input element.
#![cfg(not(target_arch = "wasm32"))] // natively; the browser suite is tests/web.rs
mod common;
use common::{gpu, grid};
use frugal_core::ops::{self, PoolGeom};
use frugal_wgpu::GpuError;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn pooling_forward_and_backward_match_the_cpu_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    // (channels, h, w, kh, kw, sh, sw): the usual 2×2/2, overlapping 3×3/1 and 3×2/2, one window.
    for (c, h, w, kh, kw, sh, sw) in [
        (3, 8, 8, 2, 2, 2, 2),
        (2, 7, 9, 3, 3, 1, 1),
        (4, 9, 7, 3, 2, 2, 2),
        (1, 5, 5, 5, 5, 1, 1),
    ] {
        let g = PoolGeom::new(c, h, w, kh, kw, sh, sw).unwrap();
        let n = 3;
        let x = grid(n * c * h * w, (h * w + kh) as u64);
        let dy = grid(n * c * g.oh * g.ow, 99);
        let old = grid(x.len(), 7);

        let mut y = vec![0f32; dy.len()];
        let mut arg = vec![0u32; dy.len()];
        ops::maxpool_fwd(&g, n, &x, &mut y, &mut arg);
        let (gy, garg) = gpu.maxpool_fwd(&g, n, &x).unwrap();
        assert_eq!(bits(&gy), bits(&y), "max forward {g:?}");
        assert_eq!(garg, arg, "argmax {g:?}");
        for acc in [false, true] {
            let mut dx = old.clone();
            ops::maxpool_grad_x(&g, n, &dy, &arg, &mut dx, acc);
            let gdx = gpu
                .maxpool_grad_x(&g, n, &dy, &arg, acc.then_some(&old[..]))
                .unwrap();
            assert_eq!(
                bits(&gdx),
                bits(&dx),
                "max backward {g:?}, accumulate {acc}"
            );
        }

        ops::avgpool_fwd(&g, n, &x, &mut y);
        assert_eq!(
            bits(&gpu.avgpool_fwd(&g, n, &x).unwrap()),
            bits(&y),
            "avg forward {g:?}"
        );
        for acc in [false, true] {
            let mut dx = old.clone();
            ops::avgpool_grad_x(&g, n, &dy, &mut dx, acc);
            let gdx = gpu
                .avgpool_grad_x(&g, n, &dy, acc.then_some(&old[..]))
                .unwrap();
            assert_eq!(
                bits(&gdx),
                bits(&dx),
                "avg backward {g:?}, accumulate {acc}"
            );
        }
    }
}

/// Global average pooling: the forward sums a plane in another order than the CPU's (which may keep
/// several accumulators): within 2·hw·2⁻²⁴ of the plane's Σ|x|/hw; the backward is one division per
/// element, bit for bit.
#[test]
fn global_average_pooling_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    for (n, c, hw) in [(3, 4, 49), (1, 1, 1), (2, 8, 300)] {
        let x = common::data(n * c * hw, 11, 2.0);
        let mut y = vec![0f32; n * c];
        ops::global_avgpool_fwd(n, c, hw, &x, &mut y);
        let gy = gpu.global_avgpool_fwd(n, c, hw, &x).unwrap();
        for (p, (&g, &w)) in gy.iter().zip(&y).enumerate() {
            let mag: f32 = x[p * hw..(p + 1) * hw].iter().map(|v| v.abs()).sum::<f32>() / hw as f32;
            let bound = 2.0 * hw as f32 * 2f32.powi(-24) * mag;
            assert!(
                (g - w).abs() <= bound,
                "plane {p}: GPU {g}, CPU {w}, bound {bound}"
            );
        }
        let dy = common::data(n * c, 12, 1.0);
        let old = common::data(x.len(), 13, 1.0);
        for acc in [false, true] {
            let mut dx = old.clone();
            ops::global_avgpool_grad_x(n, c, hw, &dy, &mut dx, acc);
            let gdx = gpu
                .global_avgpool_grad_x(n, c, hw, &dy, acc.then_some(&old[..]))
                .unwrap();
            assert_eq!(
                bits(&gdx),
                bits(&dx),
                "global average backward, accumulate {acc}"
            );
        }
    }
}

#[test]
fn pooling_operands_of_the_wrong_size_are_errors() {
    let Some(gpu) = gpu() else { return };
    let g = PoolGeom::new(1, 4, 4, 2, 2, 2, 2).unwrap();
    assert!(matches!(
        gpu.maxpool_fwd(&g, 1, &[0.0; 15]),
        Err(GpuError::Shape(_))
    ));
    assert!(matches!(
        gpu.avgpool_grad_x(&g, 1, &[0.0; 4], Some(&[0.0; 3])),
        Err(GpuError::Shape(_))
    ));
}
