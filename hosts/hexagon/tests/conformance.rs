//! Every DSP kernel through `QemuHexagon`, bit-exact against the portable CPU int8 kernels of
//! `frugal_core::kernels::int8` (random shapes, strides and values, plus saturation and rounding edge
//! cases). Reported *skipped* without clang/qemu-hexagon; fails then under `FRUGAL_REQUIRE_DSP=1`.
use frugal_core::kernels::int8::{
    self as k8, igemm_reference, maxpool2x2, maxpool2x2_grad, quantize_f32, rescale_i32_to_i8,
    MatRef, Rounding,
};
use frugal_core::ops::ConvGeom;
use frugal_core::rng::Rng;
use frugal_hexagon::{qemu_or_skip, Dsp, QemuHexagon};

fn dsp() -> Option<Dsp<QemuHexagon>> {
    qemu_or_skip().expect("DSP required").map(Dsp::new)
}

fn bytes(rng: &mut Rng, n: usize, edge: bool) -> Vec<i8> {
    (0..n)
        .map(|_| {
            if edge {
                // Only the extremes: every product at its largest magnitude.
                [-128i8, 127, -127][rng.below(3) as usize]
            } else {
                rng.below(256) as u8 as i8
            }
        })
        .collect()
}

#[test]
fn ping() {
    let Some(mut d) = dsp() else { return };
    assert_eq!(d.ping().unwrap(), frugal_hexagon::proto::VERSION);
}

#[test]
fn gemm_matches_cpu_for_every_layout() {
    let Some(mut d) = dsp() else { return };
    let mut rng = Rng::new(15);
    let mut cbuf = Vec::new();
    // Random shapes around the HVX tile (32 columns, 4 rows, depth groups of 4), one with a depth
    // over a VTCM tile (8192) so the depth split runs, and the backward pass's transposed layouts.
    let mut shapes: Vec<(usize, usize, usize)> = (0..24)
        .map(|_| {
            (
                1 + rng.below(40) as usize,
                1 + rng.below(80) as usize,
                1 + rng.below(70) as usize,
            )
        })
        .collect();
    shapes.extend([
        (1, 1, 1),
        (4, 32, 4),
        (5, 33, 9000),
        (9, 64, 128),
        (3, 7, 0),
    ]);
    for (case, &(m, n, k)) in shapes.iter().enumerate() {
        for layout in 0..4 {
            let (ta, tb) = (layout & 1 == 1, layout & 2 == 2);
            let edge = case % 5 == 4;
            let a = bytes(&mut rng, m * k, edge);
            let b = bytes(&mut rng, k * n, edge);
            let am = if ta {
                MatRef {
                    data: &a,
                    rs: 1,
                    cs: m,
                }
            } else {
                MatRef {
                    data: &a,
                    rs: k,
                    cs: 1,
                }
            };
            let bm = if tb {
                MatRef {
                    data: &b,
                    rs: 1,
                    cs: k,
                }
            } else {
                MatRef {
                    data: &b,
                    rs: n,
                    cs: 1,
                }
            };
            // A row stride wider than n, and accumulation onto existing values, on odd layouts.
            let ldc = n + layout;
            let acc = layout % 2 == 1;
            let init: Vec<i32> = (0..m * ldc)
                .map(|_| rng.below(2001) as i32 - 1000)
                .collect();
            let mut want = init.clone();
            igemm_reference(m, n, k, am, bm, &mut want, ldc, acc);
            let mut got = init.clone();
            d.igemm(m, n, k, am, bm, &mut got, ldc, acc, &mut cbuf)
                .unwrap_or_else(|e| panic!("case {case} ({m}x{n}x{k}, layout {layout}): {e}"));
            assert_eq!(got, want, "case {case} ({m}x{n}x{k}, layout {layout})");
        }
    }
}

#[test]
fn rescale_matches_cpu_nearest_and_stochastic() {
    let Some(mut d) = dsp() else { return };
    let mut rng = Rng::new(7);
    for case in 0..40 {
        let len = 1 + rng.below(300) as usize;
        let shift = (case % 32) as u32;
        let mut src: Vec<i32> = (0..len)
            .map(|_| (rng.next_u64() as i32) >> rng.below(31))
            .collect();
        // Edge values: the extremes, exact halves at this shift (both signs), ±127/±128 after it.
        let half = (1i64 << shift) / 2;
        let edges = [
            i32::MIN,
            i32::MAX,
            0,
            -1,
            1,
            (half as i32).wrapping_mul(3),
            (half as i32).wrapping_mul(-3),
            (127i64 << shift).min(i32::MAX as i64) as i32,
            (-(128i64 << shift)).max(i32::MIN as i64) as i32,
        ];
        for (s, e) in src.iter_mut().zip(edges) {
            *s = e;
        }
        let stochastic = case % 2 == 1;
        let rounding = if stochastic {
            Rounding::Stochastic(rng.next_u64())
        } else {
            Rounding::Nearest
        };
        // Offsets just below 2^32 make the stochastic stream change key inside the call.
        let offset = if case % 4 == 3 {
            (1u64 << 32) - 5
        } else {
            rng.below(1 << 40)
        };
        let mut want = vec![0i8; len];
        let cw = rescale_i32_to_i8(&src, shift, rounding, offset, &mut want);
        let mut got = vec![0i8; len];
        let cg = d.rescale(&src, shift, rounding, offset, &mut got).unwrap();
        assert_eq!(got, want, "case {case} (shift {shift}, {rounding:?})");
        assert_eq!(cg, cw, "clamped count, case {case}");
    }
}

#[test]
fn max_abs_matches_cpu() {
    let Some(mut d) = dsp() else { return };
    let mut rng = Rng::new(3);
    for len in [0usize, 1, 31, 32, 33, 100, 257] {
        let mut x: Vec<i32> = (0..len).map(|_| rng.next_u64() as i32 >> 3).collect();
        assert_eq!(d.max_abs(&x).unwrap(), k8::max_abs_i32(&x), "len {len}");
        if len > 0 {
            x[len / 2] = i32::MIN;
            assert_eq!(d.max_abs(&x).unwrap(), 1 << 31, "len {len} with i32::MIN");
        }
    }
}

#[test]
fn maxpool_matches_cpu_with_ties_and_saturation() {
    let Some(mut d) = dsp() else { return };
    let mut rng = Rng::new(11);
    for case in 0..20 {
        let w = 2 * (1 + rng.below(20) as usize);
        let pairs = 1 + rng.below(12) as usize;
        let ow = w / 2;
        // A few distinct values: many ties, whose first-in-order index must win.
        let x: Vec<i8> = (0..pairs * 2 * w)
            .map(|_| {
                if case % 2 == 0 {
                    (rng.below(3) as i32 - 1) as i8
                } else {
                    rng.below(256) as u8 as i8
                }
            })
            .collect();
        let (mut y, mut idx) = (vec![0i8; pairs * ow], vec![0u8; pairs * ow]);
        maxpool2x2(&x, w, pairs, &mut y, &mut idx);
        let (mut yd, mut id) = (vec![0i8; pairs * ow], vec![0u8; pairs * ow]);
        d.maxpool2x2(&x, w, pairs, &mut yd, &mut id).unwrap();
        assert_eq!((&yd, &id), (&y, &idx), "forward, case {case}");
        // Backward onto values near ±127: the sums saturate.
        let dy = bytes(&mut rng, pairs * ow, case % 3 == 0);
        let dx0: Vec<i8> = (0..pairs * 2 * w)
            .map(|_| (rng.below(255) as i32 - 127) as i8)
            .collect();
        let mut want = dx0.clone();
        maxpool2x2_grad(&dy, &idx, w, pairs, &mut want);
        let mut got = dx0.clone();
        d.maxpool2x2_grad(&dy, &idx, w, pairs, &mut got).unwrap();
        assert_eq!(got, want, "backward, case {case}");
    }
}

#[test]
fn quantize_matches_cpu_with_halves_and_non_finite() {
    let Some(mut d) = dsp() else { return };
    let mut rng = Rng::new(5);
    let mut x: Vec<f32> = (0..500).map(|_| rng.uniform(-300.0, 300.0)).collect();
    x.extend([
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.5,
        -0.5,
        1.5,
        -2.5,
        126.5,
        -126.5,
        127.49,
        -0.0,
        1e-30,
        3e38,
    ]);
    for k in [1.0f32, 0.5, 0.25, 64.0, 2f32.powi(-10)] {
        let mut want = vec![0i8; x.len()];
        quantize_f32(&x, k, &mut want);
        let mut got = vec![0i8; x.len()];
        d.quantize(&x, k, &mut got).unwrap();
        assert_eq!(got, want, "k = {k}");
    }
}

#[test]
fn im2col_matches_cpu() {
    let Some(mut d) = dsp() else { return };
    let mut rng = Rng::new(9);
    let geoms = [
        (1, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1),
        (3, 7, 5, 6, 3, 2, 2, 1, 0, 1, 3),
        (4, 6, 6, 8, 5, 5, 2, 2, 2, 2, 2),
        (2, 5, 9, 2, 1, 1, 1, 3, 0, 0, 1),
    ];
    for (case, &(cin, h, w, cout, kh, kw, sh, sw, ph, pw, groups)) in geoms.iter().enumerate() {
        let g = ConvGeom::new(cin, h, w, cout, kh, kw, sh, sw, ph, pw, groups).unwrap();
        let samples = 1 + case;
        let x = bytes(&mut rng, samples * cin * h * w, false);
        let kg = cin / groups * kh * kw;
        let span = samples * g.oh * g.ow;
        for grp in 0..groups {
            let mut want = vec![7i8; kg * span];
            frugal_core::quant::ops::im2col(&g, &x, samples, grp, &mut want, span);
            let mut got = vec![0i8; kg * span];
            d.im2col(&g, &x, samples, grp, &mut got).unwrap();
            assert_eq!(got, want, "case {case}, group {grp}");
        }
    }
}

/// The skel's DSP-space requests: a space is mapped per PREPARE (the old one freed), writes and
/// in-space calls out of its bounds, or nesting a space operation, are refused with a status (never a
/// crash), and an in-space GEMM gives the CPU's integers and leaves them in the space.
#[test]
fn space_requests_are_checked_and_an_in_space_gemm_matches_cpu() {
    use frugal_hexagon::proto::Op;
    use frugal_hexagon::DspError;
    let Some(mut d) = dsp() else { return };
    let refused = |e: DspError| matches!(e, DspError::Refused { status: 4, .. });
    assert_eq!(d.prepare_space(1024).unwrap(), (1, 1));
    assert_eq!(
        d.prepare_space(4096).unwrap(),
        (2, 1),
        "the old space freed"
    );
    assert_eq!(d.space_sum().unwrap().1, 4096);
    // Out of bounds: a write past the end, a span past the end, an inner op that is a space op. (A
    // refused call makes the transport start a fresh skel: the space is mapped again before each.)
    d.write_space(4088, &[1; 8]).unwrap();
    let e = d.write_space(4090, &[1; 8]).unwrap_err();
    assert!(refused(e), "write past the end");
    assert_eq!(d.prepare_space(4096).unwrap(), (1, 1));
    d.in_space(Op::MaxAbs, false, &[[3896, 200, 1, 200]], &[], &[], 0, 1)
        .unwrap();
    let e = d
        .in_space(Op::MaxAbs, false, &[[3900, 200, 1, 200]], &[], &[], 0, 1)
        .err()
        .unwrap();
    assert!(refused(e), "span past the end");
    assert_eq!(d.prepare_space(4096).unwrap(), (1, 1));
    let e = d
        .in_space(Op::Prepare, false, &[], &[], &[16], 0, 3)
        .err()
        .unwrap();
    assert!(
        matches!(e, DspError::Refused { status: 3, .. }),
        "nested space op: {e}"
    );
    assert_eq!(d.prepare_space(4096).unwrap(), (1, 1));
    // C[3×5] = A[3×4]·B[4×5], A at 0, B at 64, C (i32, row stride 8) at 256, all in the space.
    let mut rng = Rng::new(4);
    let (a, b) = (bytes(&mut rng, 12, false), bytes(&mut rng, 20, false));
    let as_u8 = |v: &[i8]| v.iter().map(|&x| x as u8).collect::<Vec<u8>>();
    d.write_space(0, &as_u8(&a)).unwrap();
    d.write_space(64, &as_u8(&b)).unwrap();
    let params = [3, 5, 4, 4, 1, 5, 1, 0, 12, 20];
    let c_span = [256, 20, 3, 32];
    let r = d
        .in_space(
            Op::Gemm,
            false,
            &[[0, 12, 1, 12], [64, 20, 1, 20]],
            &[c_span],
            &params,
            60,
            0,
        )
        .unwrap();
    let got: Vec<i32> = r
        .payload
        .chunks_exact(4)
        .map(|v| i32::from_le_bytes([v[0], v[1], v[2], v[3]]))
        .collect();
    let mut want = [0i32; 15];
    let (am, bm) = (
        MatRef {
            data: &a,
            rs: 4,
            cs: 1,
        },
        MatRef {
            data: &b,
            rs: 5,
            cs: 1,
        },
    );
    igemm_reference(3, 5, 4, am, bm, &mut want, 5, false);
    assert_eq!(got, want);
    // The space now holds A, B and C's rows (8 words apart), zeros elsewhere.
    let mut space = vec![0u8; 4096];
    space[..12].copy_from_slice(&as_u8(&a));
    space[64..84].copy_from_slice(&as_u8(&b));
    for (i, row) in want.chunks_exact(5).enumerate() {
        for (j, v) in row.iter().enumerate() {
            let at = 256 + 32 * i + 4 * j;
            space[at..at + 4].copy_from_slice(&v.to_le_bytes());
        }
    }
    let sum = frugal_hexagon::proto::fnv(frugal_hexagon::proto::FNV_INIT, &space);
    assert_eq!(d.space_sum().unwrap(), (sum, 4096));
}
