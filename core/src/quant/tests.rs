//! int8 ops against f64 references on the dequantised values, rescaling state, and the cross-target
//! bit-exactness pin (`quant_cross_target_bit_exact`, run by `cargo xtask cross` on aarch64 and wasm32).
use alloc::vec;
use alloc::vec::Vec;

use super::ops::{self as q, XSrc};
use super::*;
use crate::exec::int8::Int8Executor;
use crate::exec::Target;
use crate::graph::Graph;
use crate::graph::GraphError;
use crate::kernels::int8::igemm_scratch_len;
use crate::model::{
    Dims, Int8Update, LayerKind, LayerSpec, LossKind, ModelSpec, OptimizerSpec, Precision, Src,
};
use crate::plan::Plan;
use crate::rng::Rng;

fn rand_i8(rng: &mut Rng, len: usize, bound: i64) -> Vec<i8> {
    (0..len)
        .map(|_| (rng.below(2 * bound as u64 + 1) as i64 - bound) as i8)
        .collect()
}

fn deq(v: &[i8], e: i32) -> Vec<f64> {
    v.iter().map(|&x| x as f64 * (2f64).powi(e)).collect()
}

/// Nearest rounding of an exact integer result to `q · 2^s` errs by at most 2^s / 2 (halves away from
/// zero), so the dequantised output is within half a unit of its exponent of the f64 reference.
fn assert_close(got: &[i8], e: i32, want: &[f64], what: &str) {
    let unit = (2f64).powi(e);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let d = (g as f64 * unit - w).abs();
        assert!(
            d <= unit / 2.0 + 1e-12,
            "{what}[{i}]: got {} want {w} (unit {unit})",
            g as f64 * unit
        );
    }
}

#[test]
fn exp2_lut_matches_f64() {
    for (i, &v) in EXP2_LUT.iter().enumerate() {
        let want = (2f64).powf(i as f64 / 256.0) * 65536.0;
        assert!((v as f64 - want).abs() <= 0.5, "lut[{i}]");
    }
    // exp2_q16 with interpolation: relative error below 2^-15 plus one unit of the Q16 result.
    for t in (-20 * 65536i64..=0).step_by(977) {
        let want = (2f64).powf(t as f64 / 65536.0) * 65536.0;
        let got = exp2_q16(t) as f64;
        assert!(
            (got - want).abs() <= want / 32768.0 + 1.0,
            "t={t}: {got} vs {want}"
        );
    }
}

#[test]
fn linear_forward_matches_f64_within_half_a_unit() {
    let mut rng = Rng::new(3);
    let (n, fin, fout) = (5, 37, 300); // 300 outputs: several row tiles (TILE / 300 = 13 rows > n)
    let x = rand_i8(&mut rng, n * fin, 127);
    let w = rand_i8(&mut rng, fout * fin, 127);
    let b = rand_i8(&mut rng, fout, 127);
    let (ex, ew, eb) = (-7, -9, -10);
    let mut bias = vec![0i32; fout];
    q::bias_i8_to_acc(&b, eb, ex + ew, &mut bias);
    let mut y = vec![0i8; n * fout];
    let mut acc = vec![0i32; TILE];
    let mut gs = vec![0i8; igemm_scratch_len(n, fout, fin)];
    let mut site = Site::default();
    let s = q::linear_fwd(
        n,
        fin,
        fout,
        &x,
        &w,
        Some(&bias),
        &mut y,
        &mut acc,
        &mut gs,
        &mut site,
        Pass::Train(Rescale::Adaptive),
    );
    let (xd, wd, bd) = (deq(&x, ex), deq(&w, ew), deq(&b, eb));
    let mut want = vec![0f64; n * fout];
    for i in 0..n {
        for j in 0..fout {
            want[i * fout + j] = bd[j]
                + (0..fin)
                    .map(|k| xd[i * fin + k] * wd[j * fin + k])
                    .sum::<f64>();
        }
    }
    assert!(s > 0, "a 37-term sum of int8 products needs a shift");
    assert_close(&y, ex + ew + s as i32, &want, "linear");
    assert_eq!(site.counts.exact, 1, "the first pass is exact");
    assert!(
        y.iter().any(|&v| v.unsigned_abs() >= 64),
        "exact shift uses the range"
    );
}

#[test]
fn reused_shift_skips_and_saturation_forces_an_exact_redo() {
    let (n, fin, fout) = (4, 8, 3);
    let mut x = vec![10i8; n * fin];
    let w = vec![3i8; fout * fin];
    let mut y = vec![0i8; n * fout];
    let mut acc = vec![0i32; TILE];
    let mut gs = vec![0i8; igemm_scratch_len(n, fout, fin)];
    let mut site = Site::default();
    let pass = Pass::Train(Rescale::Adaptive);
    let run = |x: &[i8], y: &mut [i8], acc: &mut [i32], gs: &mut [i8], site: &mut Site| {
        q::linear_fwd(n, fin, fout, x, &w, None, y, acc, gs, site, pass)
    };
    // 8·10·3 = 240: bit width 8 → shift 1.
    assert_eq!(run(&x, &mut y, &mut acc, &mut gs, &mut site), 1);
    assert_eq!(site.period, 1);
    assert_eq!(run(&x, &mut y, &mut acc, &mut gs, &mut site), 1);
    assert_eq!(
        (site.counts.exact, site.period),
        (2, 2),
        "unchanged: period doubles"
    );
    // Not due: the same inputs reuse the shift in one pass.
    assert_eq!(run(&x, &mut y, &mut acc, &mut gs, &mut site), 1);
    assert_eq!(site.counts.skipped, 1);
    // The period is up: exact again, still unchanged, so the period doubles to 4.
    assert_eq!(run(&x, &mut y, &mut acc, &mut gs, &mut site), 1);
    assert_eq!((site.counts.exact, site.period, site.since), (3, 4, 0));
    // Larger inputs saturate with the reused shift 1: forced exact redo with shift 3 (8·40·3 = 960).
    x.fill(40);
    let s = run(&x, &mut y, &mut acc, &mut gs, &mut site);
    assert_eq!((s, site.counts.forced, site.counts.changed), (3, 1, 1));
    assert!(
        y.iter().all(|&v| v == 120),
        "960 / 8 = 120, no clamp after the redo"
    );
    assert_eq!(site.period, 2, "a change halves the period");
    // EveryStep never skips.
    let mut s2 = Site::default();
    for _ in 0..5 {
        q::linear_fwd(
            n,
            fin,
            fout,
            &x,
            &w,
            None,
            &mut y,
            &mut acc,
            &mut gs,
            &mut s2,
            Pass::Train(Rescale::EveryStep),
        );
    }
    assert_eq!((s2.counts.exact, s2.counts.skipped), (5, 0));
}

fn conv_ref(g: &ConvGeom, n: usize, x: &[f64], w: &[f64]) -> Vec<f64> {
    let (cin_g, cout_g, _, _) = conv_dims(g);
    let mut y = vec![0f64; n * g.cout * g.oh * g.ow];
    for s in 0..n {
        for co in 0..g.cout {
            let grp = co / cout_g;
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    let mut acc = 0.0;
                    for cl in 0..cin_g {
                        let ci = grp * cin_g + cl;
                        for ki in 0..g.kh {
                            for kj in 0..g.kw {
                                let iy = (oy * g.sh + ki) as isize - g.ph as isize;
                                let ix = (ox * g.sw + kj) as isize - g.pw as isize;
                                if iy < 0 || ix < 0 || iy >= g.h as isize || ix >= g.w as isize {
                                    continue;
                                }
                                acc += x
                                    [((s * g.cin + ci) * g.h + iy as usize) * g.w + ix as usize]
                                    * w[((co * cin_g + cl) * g.kh + ki) * g.kw + kj];
                            }
                        }
                    }
                    y[((s * g.cout + co) * g.oh + oy) * g.ow + ox] = acc;
                }
            }
        }
    }
    y
}

fn geoms() -> Vec<ConvGeom> {
    vec![
        ConvGeom::new(3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1).unwrap(),
        ConvGeom::new(4, 9, 9, 6, 3, 2, 2, 1, 1, 0, 2).unwrap(),
        ConvGeom::new(5, 6, 6, 5, 3, 3, 1, 1, 1, 1, 5).unwrap(), // depthwise
    ]
}

#[test]
fn conv_forward_and_gradients_match_f64() {
    let mut rng = Rng::new(11);
    let n = 3;
    // Sample blocks of 1, 2 (the last one ragged) and 3 (the whole batch): one GEMM per block, the
    // transposed rescale of the forward and col2im from strided columns must not change the result.
    for (g, blk) in geoms()
        .into_iter()
        .flat_map(|g| [1, 2, 3].map(move |b| (g, b)))
    {
        let (_, cout_g, kg, p) = conv_dims(&g);
        let x = rand_i8(&mut rng, n * g.cin * g.h * g.w, 127);
        let w = rand_i8(&mut rng, g.cout * kg, 127);
        let dy = rand_i8(&mut rng, n * g.cout * p, 127);
        let (ex, ew, edy) = (-6, -8, -12);
        let (xd, wd, dyd) = (deq(&x, ex), deq(&w, ew), deq(&dy, edy));
        let bp = blk * p;
        let gs_len = igemm_scratch_len(cout_g, bp, kg)
            .max(igemm_scratch_len(kg, bp, cout_g))
            .max(igemm_scratch_len(cout_g, kg, bp));
        let mut gs = vec![0i8; gs_len];
        let mut cols = vec![0i8; kg * bp];
        let mut work = vec![0i8; kg * bp + gs_len];
        let mut dyc = vec![0i8; cout_g * bp];
        // Forward.
        let mut y = vec![0i8; n * g.cout * p];
        let mut acc = vec![0i32; g.cout * bp];
        let mut site = Site::default();
        let s = q::conv_fwd(
            &g,
            n,
            blk,
            &mut XSrc::I8(&x),
            &w,
            None,
            &mut y,
            &mut acc,
            &mut work,
            &mut site,
            Pass::Eval,
        );
        assert_close(
            &y,
            ex + ew + s as i32,
            &conv_ref(&g, n, &xd, &wd),
            "conv fwd",
        );
        // Derivative: dx = Σ over outputs dy · w (the adjoint of the forward), checked through the
        // identity <conv(x), dy> = <x, conv_grad_x(dy)> per input element via a basis-free reference.
        let mut dx = vec![0i8; n * g.cin * g.h * g.w];
        let mut dcols = vec![0i32; kg * bp];
        let mut acc_x = vec![0i32; blk * g.cin * g.h * g.w];
        let mut site = Site::default();
        let s = q::conv_grad_x(
            &g,
            n,
            blk,
            &dy,
            &w,
            &mut dx,
            None,
            &mut dcols,
            &mut acc_x,
            &mut dyc,
            &mut gs,
            &mut site,
            Pass::Eval,
        );
        let mut want = vec![0f64; dx.len()];
        for i in 0..want.len() {
            let mut basis = vec![0f64; dx.len()];
            basis[i] = 1.0;
            let yb = conv_ref(&g, n, &basis, &wd);
            want[i] = yb.iter().zip(&dyd).map(|(a, b)| a * b).sum();
        }
        assert_close(&dx, edy + ew + s as i32, &want, "conv grad_x");
        // Weight gradient in i32 is exact: compare before rescaling.
        let mut dw = vec![0i32; g.cout * kg];
        let mut db = vec![0i32; g.cout];
        q::conv_grad_w(
            &g,
            n,
            0,
            blk,
            &mut XSrc::I8(&x),
            &dy,
            &mut dw,
            Some(&mut db),
            &mut cols,
            &mut dyc,
            &mut gs,
        );
        for i in 0..dw.len() {
            let mut basis = vec![0f64; dw.len()];
            basis[i] = 1.0;
            let yb = conv_ref(&g, n, &xd, &basis);
            let want: f64 = yb.iter().zip(&dyd).map(|(a, b)| a * b).sum();
            let got = dw[i] as f64 * (2f64).powi(ex + edy);
            assert!(
                (got - want).abs() < 1e-9,
                "conv grad_w[{i}]: {got} vs {want}"
            );
        }
        for (c, &b) in db.iter().enumerate() {
            let want: i32 = (0..n)
                .map(|s| {
                    dy[(s * g.cout + c) * p..(s * g.cout + c + 1) * p]
                        .iter()
                        .map(|&v| v as i32)
                        .sum::<i32>()
                })
                .sum();
            assert_eq!(b, want, "bias gradient of channel {c}");
        }
    }
}

/// One run of the three conv ops (forward from f32 and from int8, weight gradient, derivative with
/// and without accumulation) with the kernel the thread is forced to: every output and shift.
fn conv_ops_outputs(g: &ConvGeom, n: usize, blk: usize, seed: u64) -> Vec<Vec<i64>> {
    let mut rng = Rng::new(seed);
    let (_, cout_g, kg, p) = conv_dims(g);
    let per_in = g.cin * g.h * g.w;
    let x = rand_i8(&mut rng, n * per_in, 127);
    let xf: Vec<f32> = x.iter().map(|&v| v as f32 * 0.37).collect();
    let w = rand_i8(&mut rng, g.cout * kg, 127);
    let dy = rand_i8(&mut rng, n * g.cout * p, 127);
    let bias: Vec<i32> = (0..g.cout).map(|i| i as i32 * 977 - 3000).collect();
    let bp = blk * p;
    let gs_len = igemm_scratch_len(cout_g, bp, kg)
        .max(igemm_scratch_len(kg, bp, cout_g))
        .max(igemm_scratch_len(cout_g, kg, bp));
    let mut out = Vec::new();
    let widen = |v: &[i8]| v.iter().map(|&x| x as i64).collect::<Vec<_>>();
    for from_f32 in [false, true] {
        let mut work = vec![0i8; kg * bp + gs_len];
        let mut y = vec![0i8; n * g.cout * p];
        let mut acc = vec![0i32; g.cout * bp];
        let mut xq = vec![0i8; blk * per_in];
        let mut src = if from_f32 {
            XSrc::F32 {
                x: &xf,
                e: -2,
                buf: &mut xq,
            }
        } else {
            XSrc::I8(&x)
        };
        let mut site = Site::default();
        // A bias near the i32 limits saturates (the flat path adds it after the product), a small
        // one starts the accumulators.
        let huge: Vec<i32> = (0..g.cout)
            .map(|i| {
                if i % 2 == 0 {
                    i32::MAX - 5
                } else {
                    i32::MIN + 7
                }
            })
            .collect();
        for (pass, bias) in [
            (Pass::Eval, &huge),
            (Pass::Eval, &bias),
            (Pass::Train(Rescale::Adaptive), &bias),
            (Pass::Train(Rescale::Adaptive), &bias),
        ] {
            let sh = q::conv_fwd(
                g,
                n,
                blk,
                &mut src,
                &w,
                Some(bias.as_slice()),
                &mut y,
                &mut acc,
                &mut work,
                &mut site,
                pass,
            );
            out.push(widen(&y));
            out.push(vec![sh as i64]);
        }
        let mut dw = vec![0i32; g.cout * kg];
        let mut db = vec![0i32; g.cout];
        let mut cols = vec![0i8; kg * bp];
        let mut dyc = vec![0i8; cout_g * bp];
        let mut gs = vec![0i8; gs_len];
        q::conv_grad_w(
            g,
            n,
            0,
            blk,
            &mut src,
            &dy,
            &mut dw,
            Some(&mut db),
            &mut cols,
            &mut dyc,
            &mut gs,
        );
        out.push(dw.iter().chain(&db).map(|&v| v as i64).collect());
    }
    let mut dx = rand_i8(&mut rng, n * per_in, 127);
    for old in [None, Some((-3, -5)), Some((-9, -5))] {
        let mut dcols = vec![0i32; kg * bp];
        let mut acc = vec![0i32; blk * per_in];
        let mut dyc = vec![0i8; cout_g * bp];
        let mut gs = vec![0i8; gs_len];
        let mut site = Site::default();
        let sh = q::conv_grad_x(
            g,
            n,
            blk,
            &dy,
            &w,
            &mut dx,
            old,
            &mut dcols,
            &mut acc,
            &mut dyc,
            &mut gs,
            &mut site,
            Pass::Eval,
        );
        out.push(widen(&dx));
        out.push(vec![sh as i64]);
    }
    out
}

#[test]
fn flat_conv_path_matches_the_general_path_bit_for_bit() {
    use crate::kernels::int8::IgemmKernel;
    // The SIMD pair products of this target (AVX2 on x86-64, NEON on aarch64).
    let Some(simd) = [IgemmKernel::Avx2, IgemmKernel::Neon]
        .into_iter()
        .find(|&k| crate::kernels::int8::has_simd_pairs(k))
    else {
        std::eprintln!(
            "skipping: no SIMD pair products here (both runs would take the general path)"
        );
        return;
    };
    // (cin, h, w, cout, kh, kw, ph, pw, groups): flat geometries — 3×3 and 5×5, odd and even depth,
    // rows cut vertically (ph = 0, ph = 2), a padding the derivative cannot flip (ph ≥ kh: general
    // derivative), 1×1, 1-wide images, groups, and planes too large for one window (sliding window).
    let cases = [
        (1, 8, 8, 8, 3, 3, 1, 1, 1),
        (8, 4, 4, 16, 3, 3, 1, 1, 1),
        (3, 7, 6, 4, 3, 3, 1, 1, 1),
        (2, 5, 7, 3, 5, 5, 2, 2, 1),
        (4, 6, 5, 6, 3, 3, 0, 1, 2),
        (3, 5, 4, 5, 3, 1, 2, 0, 1),
        (2, 4, 4, 3, 2, 3, 3, 1, 1),
        (5, 3, 3, 5, 1, 1, 0, 0, 5),
        (2, 6, 1, 3, 3, 1, 1, 0, 1),
        (6, 6, 6, 4, 3, 3, 1, 1, 2),
        (5, 24, 24, 3, 3, 3, 1, 1, 1),
    ];
    for (i, &(cin, h, w, cout, kh, kw, ph, pw, groups)) in cases.iter().enumerate() {
        let g = ConvGeom::new(cin, h, w, cout, kh, kw, 1, 1, ph, pw, groups).unwrap();
        assert!(super::flat::Flat::new(&g).is_some(), "case {i} is flat");
        for (n, blk) in [(1, 1), (3, 2), (5, 5)] {
            IgemmKernel::force(Some(IgemmKernel::Portable));
            let general = conv_ops_outputs(&g, n, blk, i as u64);
            IgemmKernel::force(Some(simd));
            let fast = conv_ops_outputs(&g, n, blk, i as u64);
            IgemmKernel::force(None);
            for (k, (a, b)) in general.iter().zip(&fast).enumerate() {
                assert_eq!(a, b, "case {i} {g:?}, n {n}, blk {blk}: output {k} differs");
            }
        }
    }
}

#[test]
fn reciprocal_division_is_exact() {
    let mut rng = Rng::new(77);
    let ds = [
        1u64,
        2,
        3,
        7,
        65_536,
        65_537,
        655_360,
        (1 << 31) - 1,
        1 << 32,
        u64::MAX / 3,
        u64::MAX,
    ];
    for &d in ds.iter().chain(&[0]) {
        let div = super::Divider::new(d);
        let mut ns = vec![
            0u64,
            1,
            d.wrapping_sub(1),
            d,
            d.wrapping_add(1),
            u64::MAX,
            u64::MAX - 1,
        ];
        ns.extend((0..200).map(|_| rng.next_u64() >> (rng.below(64) as u32)));
        ns.extend((0..50).map(|_| d.wrapping_mul(rng.below(1 << 20))));
        for n in ns {
            assert_eq!(div.div(n), n.checked_div(d).unwrap_or(0), "{n} / {d}");
        }
    }
}

#[test]
fn vectorised_bias_add_saturates_like_saturating_add() {
    let edge = [
        i32::MIN,
        i32::MIN + 1,
        -2,
        -1,
        0,
        1,
        2,
        i32::MAX - 1,
        i32::MAX,
        1 << 30,
        -(1 << 30),
    ];
    for &b in &edge {
        let mut row: Vec<i32> = edge.iter().chain(&[12345, -98765]).copied().collect();
        let want: Vec<i32> = row.iter().map(|v| v.saturating_add(b)).collect();
        super::ops::add_saturating(&mut row, b);
        assert_eq!(row, want, "bias {b}");
    }
}

#[test]
fn linear_gradients_are_exact_in_i32_and_accumulate_with_alignment() {
    let mut rng = Rng::new(5);
    let (n, fin, fout) = (6, 10, 7);
    let x = rand_i8(&mut rng, n * fin, 127);
    let w = rand_i8(&mut rng, fout * fin, 127);
    let dy = rand_i8(&mut rng, n * fout, 127);
    let mut gs = vec![0i8; 4096];
    let mut dw = vec![0i32; fout * fin];
    let mut db = vec![0i32; fout];
    q::linear_grad_w(n, fin, fout, &x, &dy, &mut dw, Some(&mut db), &mut gs);
    for j in 0..fout {
        for k in 0..fin {
            let want: i32 = (0..n)
                .map(|i| dy[i * fout + j] as i32 * x[i * fin + k] as i32)
                .sum();
            assert_eq!(dw[j * fin + k], want);
        }
        assert_eq!(db[j], (0..n).map(|i| dy[i * fout + j] as i32).sum::<i32>());
    }
    // Derivative accumulated onto an existing one with another exponent.
    let (edy, ew, eold) = (-10, -7, -12);
    let old = rand_i8(&mut rng, n * fin, 127);
    let mut dx = old.clone();
    let mut acc = vec![0i32; TILE];
    let mut site = Site::default();
    let s = q::linear_grad_x(
        n,
        fin,
        fout,
        &dy,
        &w,
        &mut dx,
        Some((eold, edy + ew)),
        &mut acc,
        &mut gs,
        &mut site,
        Pass::Train(Rescale::EveryStep),
    );
    let (dyd, wd, od) = (deq(&dy, edy), deq(&w, ew), deq(&old, eold));
    let mut want = vec![0f64; n * fin];
    for i in 0..n {
        for k in 0..fin {
            want[i * fin + k] = od[i * fin + k]
                + (0..fout)
                    .map(|j| dyd[i * fout + j] * wd[j * fin + k])
                    .sum::<f64>();
        }
    }
    // Two roundings: the old value aligned to the accumulator (half a unit of 2^(edy+ew), which is
    // finer than the output unit) and the final rescale (half an output unit): below one output unit.
    let unit = (2f64).powi(edy + ew + s as i32);
    for (i, (&g, &w)) in dx.iter().zip(&want).enumerate() {
        assert!((g as f64 * unit - w).abs() <= unit, "dx[{i}]");
    }
}

#[test]
fn softmax_cross_entropy_in_fixed_point_matches_f64() {
    let mut rng = Rng::new(9);
    let (n, c, e) = (4, 10, -4);
    let logits = rand_i8(&mut rng, n * c, 100);
    let y = [3u32, 0, 9, 5];
    let mut pred = logits.clone();
    let mut buf = vec![0i32; c];
    let (loss, correct, ed) = softmax_ce(n, c, &mut pred, e, &y, n, None, &mut buf);
    let mut want_loss = 0f64;
    let mut want_correct = 0;
    for s in 0..n {
        let z: Vec<f64> = logits[s * c..(s + 1) * c]
            .iter()
            .map(|&v| v as f64 * (2f64).powi(e))
            .collect();
        let m = z.iter().cloned().fold(f64::MIN, f64::max);
        let sum: f64 = z.iter().map(|v| (v - m).exp()).sum();
        let p: Vec<f64> = z.iter().map(|v| (v - m).exp() / sum).collect();
        want_loss -= p[y[s] as usize].ln();
        let arg = (0..c).fold(0, |b, j| if z[j] > z[b] { j } else { b });
        want_correct += (arg == y[s] as usize) as usize;
        for j in 0..c {
            let want = (p[j] - if j == y[s] as usize { 1.0 } else { 0.0 }) / n as f64;
            let got = pred[s * c + j] as f64 * (2f64).powi(ed);
            // Q16 probabilities (LUT error < 2^-15 relative, division rounding 2^-16) are far finer
            // than the int8 output unit; the output rounding is half a unit: allow one unit.
            assert!(
                (got - want).abs() <= (2f64).powi(ed),
                "d[{s},{j}]: {got} vs {want}"
            );
        }
    }
    assert_eq!(correct, want_correct);
    assert!(
        (loss as f64 - want_loss).abs() < 1e-3 * n as f64,
        "{loss} vs {want_loss}"
    );
}

#[test]
fn eq4_combines_to_the_larger_scale_and_skips_when_equal() {
    let mut a = vec![10i8, -20, 100];
    let (e, skipped) = combine_eq4(&mut a, -5, &[4, 4, 4], -7);
    assert!(!skipped);
    assert_eq!(e, -5);
    assert_eq!(a, vec![11, -19, 101]); // 4·2^-7 = 1·2^-5
    let (e, skipped) = combine_eq4(&mut a, -5, &[100, 0, 100], -5);
    assert!(skipped);
    assert_eq!(e, -4, "201 saturates: one more bit");
    assert_eq!(a, vec![56, -10, 101]); // round((11+100)/2) = 56 (55.5 away from zero), −9.5 → −10
}

#[test]
fn integer_update_moves_by_at_most_the_update_bits() {
    let mut w = vec![0i8; 512];
    let g: Vec<i8> = (0..512).map(|i| (i % 255 - 127) as i8).collect();
    integer_update(&mut w, &g, 2, 7);
    assert!(
        w.iter().all(|&v| v.abs() <= 4),
        "|Δ| < 2^2 after stochastic rounding"
    );
    assert!(w
        .iter()
        .zip(&g)
        .all(|(&v, &gv)| v == 0 || v.signum() == -gv.signum()));
    // Stochastic rounding is unbiased: the mean step over many small gradients is g / 2^s.
    let mut w = vec![0i8; 4096];
    let g = vec![32i8; 4096]; // bit width 6, update bits 2: shift 4, 32/16 = 2 exactly
    integer_update(&mut w, &g, 2, 1);
    assert!(w.iter().all(|&v| v == -2));
    let mut w = vec![0i8; 4096];
    let mut g = vec![24i8; 4096]; // 24/16 = 1.5: half the steps −1, half −2
    g[0] = 32;
    integer_update(&mut w, &g, 2, 1);
    let mean = w[1..].iter().map(|&v| v as f64).sum::<f64>() / 4095.0;
    assert!((mean + 1.5).abs() < 0.05, "mean step {mean}");
}

#[test]
fn unsupported_layers_and_losses_are_typed_errors() {
    let mut spec = tiny_spec();
    spec.layers.insert(
        1,
        LayerSpec {
            name: "bn".into(),
            kind: LayerKind::BatchNorm2d {
                eps: 1e-5,
                momentum: 0.1,
            },
            inputs: vec![Src::Layer(0)],
            trainable: true,
            update: crate::model::Update::All,
        },
    );
    let p = Precision::Int8(Int8Update::FloatMaster);
    match Graph::with_precision(&spec, 4, p) {
        Err(GraphError::Layer { name, reason, .. }) => {
            assert_eq!(name, "bn");
            assert!(reason.contains("batchnorm2d"), "{reason}");
        }
        other => panic!("expected a layer error, got {other:?}"),
    }
    let mut spec = tiny_spec();
    spec.loss = LossKind::Mse;
    assert!(matches!(
        Graph::with_precision(&spec, 4, p),
        Err(GraphError::Loss(_))
    ));
    // f32 realisation of the same model is unaffected.
    assert!(Graph::new(&spec, 4).is_ok());
}

fn layer(name: &str, kind: LayerKind, from: Src) -> LayerSpec {
    LayerSpec {
        name: name.into(),
        kind,
        inputs: vec![from],
        trainable: true,
        update: crate::model::Update::All,
    }
}

/// conv(4, 3×3, pad 1) → relu → maxpool 2 → flatten → linear 5 on 1×6×6 inputs.
pub(crate) fn tiny_spec() -> ModelSpec {
    ModelSpec {
        input: Dims::new(1, 6, 6),
        layers: vec![
            layer(
                "conv",
                LayerKind::Conv2d {
                    out: 4,
                    kernel: [3, 3],
                    stride: [1, 1],
                    padding: [1, 1],
                    groups: 1,
                    bias: true,
                },
                Src::Input,
            ),
            layer("relu", LayerKind::Relu, Src::Layer(0)),
            layer(
                "pool",
                LayerKind::MaxPool2d {
                    kernel: [2, 2],
                    stride: [2, 2],
                },
                Src::Layer(1),
            ),
            layer("flat", LayerKind::Flatten, Src::Layer(2)),
            layer(
                "fc",
                LayerKind::Linear { out: 5, bias: true },
                Src::Layer(3),
            ),
        ],
        loss: LossKind::SoftmaxCrossEntropy,
        optimizer: OptimizerSpec::Sgd {
            lr: 0.1,
            momentum: 0.0,
            weight_decay: 0.0,
        },
        seed: 42,
    }
}

/// Synthetic data: class k lights up a k-dependent pixel pattern; values are multiples of 1/8 (exact
/// in f32 and in the input quantisation).
pub(crate) fn synthetic(batch: usize, step: usize) -> (Vec<f32>, Vec<u32>) {
    let mut x = vec![0f32; batch * 36];
    let mut y = vec![0u32; batch];
    for s in 0..batch {
        let k = (s * 7 + step * 3) % 5;
        y[s] = k as u32;
        for i in 0..36 {
            let on = (i + k).is_multiple_of(5) || i / 6 == k;
            x[s * 36 + i] = if on {
                1.0
            } else {
                ((i * 3 + s) % 8) as f32 / 8.0 - 0.5
            };
        }
    }
    (x, y)
}

fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Ten pure-integer steps of a tiny CNN; hash of every weight byte and exponent. Pinned so that x86-64,
/// aarch64 and wasm32 (`cargo xtask cross`) must agree bit for bit: the integer path has no float in it
/// (input quantisation scales by powers of two, exact for these inputs).
fn integer_run_hash() -> (u64, f32, f32) {
    let spec = tiny_spec();
    let p = Precision::Int8(Int8Update::Integer { update_bits: 2 });
    let plan = Plan::new(Graph::with_precision(&spec, 8, p).unwrap());
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Int8Executor::new(&plan, &arena).unwrap();
    ex.init_params(&mut arena, spec.seed).unwrap();
    let (mut first, mut last) = (0f32, 0f32);
    for step in 0..10 {
        let (x, y) = synthetic(8, step);
        let s = ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
        if step == 0 {
            first = s.loss;
        }
        last = s.loss;
    }
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let base = arena
        .as_ptr()
        .align_offset(crate::plan::ALIGN)
        .min(crate::plan::ALIGN);
    for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
        let (off, len) = plan.region(t).unwrap();
        h = fnv1a(&arena[base + off..base + off + len], h);
        h = fnv1a(&ex.exponent(t).to_le_bytes(), h);
    }
    (h, first, last)
}

#[test]
fn quant_cross_target_bit_exact() {
    let (h, first, last) = integer_run_hash();
    assert!(last < first, "training lowers the loss: {first} → {last}");
    assert_eq!(
        h, QUANT_PINNED_HASH,
        "weights after 10 integer steps: {h:#018x}"
    );
    // The same run with every int8 kernel this machine has (GEMM, max-abs and rescale flavours): the
    // result may not depend on the kernel chosen.
    use crate::kernels::int8::IgemmKernel;
    for k in IgemmKernel::ALL.into_iter().filter(|k| k.is_available()) {
        IgemmKernel::force(Some(k));
        let (hk, _, _) = integer_run_hash();
        IgemmKernel::force(None);
        assert_eq!(hk, QUANT_PINNED_HASH, "kernel {}: {hk:#018x}", k.name());
    }
}

/// The digits CNN's shape (1×8×8 → conv 8 → relu → pool → conv 16 → relu → pool → flatten → linear
/// 10): both convolutions, the second with a derivative, every phase of the fast conv path.
fn two_conv_spec() -> ModelSpec {
    let conv = |name: &str, out: u32, from: u32| {
        layer(
            name,
            LayerKind::Conv2d {
                out,
                kernel: [3, 3],
                stride: [1, 1],
                padding: [1, 1],
                groups: 1,
                bias: true,
            },
            if from == 0 {
                Src::Input
            } else {
                Src::Layer(from - 1)
            },
        )
    };
    let pool = |name: &str, from: u32| {
        layer(
            name,
            LayerKind::MaxPool2d {
                kernel: [2, 2],
                stride: [2, 2],
            },
            Src::Layer(from),
        )
    };
    ModelSpec {
        input: Dims::new(1, 8, 8),
        layers: vec![
            conv("conv1", 8, 0),
            layer("relu1", LayerKind::Relu, Src::Layer(0)),
            pool("pool1", 1),
            conv("conv2", 16, 3),
            layer("relu2", LayerKind::Relu, Src::Layer(3)),
            pool("pool2", 4),
            layer("flat", LayerKind::Flatten, Src::Layer(5)),
            layer(
                "fc",
                LayerKind::Linear {
                    out: 10,
                    bias: true,
                },
                Src::Layer(6),
            ),
        ],
        ..tiny_spec()
    }
}

/// Per step: the loss bits, then a hash of every weight byte and exponent, for `steps` steps of
/// [`two_conv_spec`] at batch 24 in `p`.
fn two_conv_run(p: Precision, steps: usize) -> Vec<u64> {
    let spec = two_conv_spec();
    let plan = Plan::new(Graph::with_precision(&spec, 24, p).unwrap());
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Int8Executor::new(&plan, &arena).unwrap();
    ex.init_params(&mut arena, 3).unwrap();
    let mut out = Vec::new();
    for step in 0..steps {
        let mut rng = Rng::new(step as u64);
        let x: Vec<f32> = (0..24 * 64).map(|_| rng.uniform(-1.0, 2.0)).collect();
        let y: Vec<u32> = (0..24).map(|_| rng.below(10) as u32).collect();
        let s = ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
        out.push(s.loss.to_bits() as u64);
    }
    let base = arena
        .as_ptr()
        .align_offset(crate::plan::ALIGN)
        .min(crate::plan::ALIGN);
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
        let (off, len) = plan.region(t).unwrap();
        h = fnv1a(&arena[base + off..base + off + len], h);
        h = fnv1a(&ex.exponent(t).to_le_bytes(), h);
    }
    out.push(h);
    out
}

#[test]
fn two_conv_training_does_not_depend_on_the_kernel() {
    use crate::kernels::int8::IgemmKernel;
    for p in [
        Precision::Int8(Int8Update::Integer { update_bits: 4 }),
        Precision::Int8(Int8Update::FloatMaster),
    ] {
        IgemmKernel::force(Some(IgemmKernel::Portable));
        let want = two_conv_run(p, 12);
        IgemmKernel::force(None);
        for k in IgemmKernel::ALL.into_iter().filter(|k| k.is_available()) {
            IgemmKernel::force(Some(k));
            let got = two_conv_run(p, 12);
            IgemmKernel::force(None);
            assert_eq!(got, want, "{p:?}, kernel {}", k.name());
        }
    }
}

/// The pinned hash of [`integer_run_hash`] (first computed on x86-64).
const QUANT_PINNED_HASH: u64 = 0xd468_c893_0530_9b4d;

#[test]
fn quant_float_master_learns_and_rescale_modes_count() {
    let spec = tiny_spec();
    let p = Precision::Int8(Int8Update::FloatMaster);
    let plan = Plan::new(Graph::with_precision(&spec, 8, p).unwrap());
    let f32_plan = Plan::new(Graph::new(&spec, 8).unwrap());
    assert!(plan.arena_bytes < f32_plan.arena_bytes);
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Int8Executor::new(&plan, &arena).unwrap();
    ex.init_params(&mut arena, spec.seed).unwrap();
    let mut losses = Vec::new();
    for step in 0..60 {
        let (x, y) = synthetic(8, step);
        losses.push(
            ex.train_step(&mut arena, &x, Target::Classes(&y))
                .unwrap()
                .loss,
        );
    }
    let head: f32 = losses[..5].iter().sum();
    let tail: f32 = losses[55..].iter().sum();
    assert!(tail < 0.5 * head, "loss falls: {head} → {tail}");
    let c = ex.counts();
    assert!(c.skipped > 0 && c.exact > 0, "{c}");
    assert_eq!(
        c.passes(),
        60 * 3,
        "conv out, fc out, d(flat) each once per step: {c}"
    );
}

#[test]
fn quant_batch_split_combines_chunk_gradients_by_eq4() {
    let spec = tiny_spec();
    let p = Precision::Int8(Int8Update::FloatMaster);
    let plan = Plan::new(Graph::with_precision(&spec, 8, p).unwrap());
    let run = |split: Option<u16>| {
        let mut arena = vec![0u8; plan.needed_bytes()];
        let mut ex = Int8Executor::new(&plan, &arena).unwrap();
        ex.init_params(&mut arena, spec.seed).unwrap();
        if let Some(c) = split {
            for ni in 0..plan.graph.nodes.len() {
                ex.set_split(ni, c);
            }
        }
        let mut last = 0.0;
        for step in 0..40 {
            let (x, y) = synthetic(8, step);
            last = ex
                .train_step(&mut arena, &x, Target::Classes(&y))
                .unwrap()
                .loss;
        }
        (last, ex.counts())
    };
    let (whole, c0) = run(None);
    let (split, c1) = run(Some(2));
    assert_eq!(c0.combine_skipped + c0.combine_rescaled, 0);
    // Two parameterised layers × two tensors × three later chunks × 40 steps.
    assert_eq!(
        c1.combine_skipped + c1.combine_rescaled,
        2 * 2 * 3 * 40,
        "{c1}"
    );
    assert!(split < 1.0 && whole < 1.0, "both learn: {whole} vs {split}");

    // Profiling with a host clock: one step, every weight-gradient node timed.
    static T: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
    fn clock() -> u64 {
        T.fetch_add(1000, core::sync::atomic::Ordering::Relaxed)
    }
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Int8Executor::new(&plan, &arena).unwrap();
    ex.init_params(&mut arena, spec.seed).unwrap();
    let (x, y) = synthetic(8, 0);
    let prof = ex
        .profile_split(&mut arena, &x, Target::Classes(&y), clock, 1.15)
        .unwrap();
    assert_eq!(prof.len(), 2, "conv and fc have weight gradients");
    // This clock ticks once per reading: every chunking costs the same, so nothing is abnormal.
    assert!(ex.split().iter().all(|&c| c == 0));
}

/// Losses of `steps` steps and a hash of every parameter byte and exponent afterwards, every node's
/// weight gradient in chunks of `split` samples (0: whole batch).
fn run_hash(plan: &Plan, split: u16, steps: usize) -> (Vec<u32>, u64) {
    let batch = plan.batch();
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Int8Executor::new(plan, &arena).unwrap();
    ex.init_params(&mut arena, plan.graph.seed).unwrap();
    for ni in 0..plan.graph.nodes.len() {
        ex.set_split(ni, split);
    }
    let mut losses = Vec::new();
    for step in 0..steps {
        let (x, y) = synthetic(batch, step);
        let s = ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
        losses.push(s.loss.to_bits());
    }
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
        for v in ex.read_f32(&mut arena, t).unwrap() {
            h = fnv1a(&v.to_le_bytes(), h);
        }
        h = fnv1a(&ex.exponent(t).to_le_bytes(), h);
    }
    (losses, h)
}

#[test]
fn quant_tiled_weight_gradients_train_bit_for_bit_like_whole_ones() {
    use crate::graph::GraphOptions;
    use crate::kernels::int8::KernelFamily;
    use crate::plan::PlanShape;
    let spec = tiny_spec();
    // The Linear is 5 × 36: tiles of 1, 2 (2 + 2 + 1) and 5 rows, and a cap below one row.
    for update in [
        Int8Update::Integer { update_bits: 2 },
        Int8Update::FloatMaster,
    ] {
        let plan = |kernels, grad_tile, micro_batches| {
            let options = GraphOptions {
                precision: Precision::Int8(update),
                kernels,
                grad_tile,
                ..GraphOptions::default()
            };
            let g = Graph::with_options(&spec, 8 / micro_batches as usize, options).unwrap();
            Plan::shaped(
                g,
                PlanShape {
                    micro_batches,
                    in_place: true,
                },
            )
        };
        for (split, micro_batches) in [(0, 1), (2, 1), (0, 2)] {
            let want = run_hash(&plan(KernelFamily::Any, 0, micro_batches), split, 12);
            for (kernels, tile) in [
                (KernelFamily::Portable, 0),
                (KernelFamily::Any, 36),
                (KernelFamily::Portable, 72),
                (KernelFamily::Portable, 10),
                (KernelFamily::Portable, 180),
            ] {
                let p = plan(kernels, tile, micro_batches);
                assert_eq!(
                    run_hash(&p, split, 12),
                    want,
                    "{update:?}, {} kernels, tile {tile}, split {split}, {micro_batches} micro-batches",
                    kernels.name()
                );
            }
        }
    }
    // Tiles shrink the gradient's scratch: 4 bytes per weight become 4 per tile element.
    let options = |grad_tile| GraphOptions {
        precision: Precision::Int8(Int8Update::Integer { update_bits: 2 }),
        grad_tile,
        ..GraphOptions::default()
    };
    let whole = Plan::new(Graph::with_options(&spec, 8, options(0)).unwrap());
    let tiled = Plan::new(Graph::with_options(&spec, 8, options(36)).unwrap());
    let fc = |p: &Plan| {
        let s = p.graph.nodes[4].scratch[crate::graph::scratch_slot::GRAD_W].unwrap();
        p.graph.tensors[s as usize].bytes
    };
    assert!(
        fc(&whole) >= fc(&tiled) + 4 * 4 * 36,
        "{} vs {}",
        fc(&whole),
        fc(&tiled)
    );
}

/// The inline rounding of [`quantize`] equals `clamp(roundf(v / 2^e), ±127)` (halves away from zero)
/// on halves, their neighbours one ulp away, the clamp edges, huge values and NaN.
#[test]
fn quantize_rounds_like_roundf() {
    let mut vals = vec![
        0.0f32,
        -0.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e30,
        -1e30,
    ];
    for i in -300..=300 {
        let h = i as f32 + 0.5;
        for v in [h, -h, i as f32] {
            vals.extend([
                v,
                f32::from_bits(v.to_bits() + 1),
                f32::from_bits(v.to_bits().max(1) - 1),
            ]);
        }
    }
    let mut rng = Rng::new(5);
    vals.extend((0..2000).map(|_| rng.uniform(-200.0, 200.0)));
    for e in [-3, 0, 2] {
        let mut got = vec![0i8; vals.len()];
        quantize(&vals, e, &mut got);
        let k = pow2(-e);
        for (&v, &g) in vals.iter().zip(&got) {
            let want = libm::roundf(v * k).clamp(-127.0, 127.0) as i8;
            assert_eq!(g, want, "quantize({v}, e = {e})");
        }
    }
}

/// Every persistent tensor (parameters, optimizer state, statistics): its arena bytes and exponent.
fn persistent_state(plan: &Plan, ex: &Int8Executor<'_>, arena: &[u8]) -> Vec<(Vec<u8>, i32)> {
    use crate::graph::TensorKind;
    let base = crate::exec::base_of(arena);
    (0..plan.graph.tensors.len() as crate::graph::TensorId)
        .filter(|&t| {
            matches!(
                plan.graph.tensors[t as usize].kind,
                TensorKind::Weight | TensorKind::OptState | TensorKind::Stat
            )
        })
        .map(|t| {
            let (off, len) = plan.region(t).unwrap();
            (arena[base + off..base + off + len].to_vec(), ex.exponent(t))
        })
        .collect()
}

/// Index of the first maximum (the rule `softmax_ce_eval` counts a sample correct by).
fn first_argmax(row: &[f32]) -> u32 {
    row.iter()
        .enumerate()
        .fold(0, |b, (j, &v)| if v > row[b] { j } else { b }) as u32
}

#[test]
fn int8_predict_is_the_dequantised_output_that_evaluate_scores() {
    let spec = tiny_spec();
    let classes = 5;
    for p in [
        Precision::Int8(Int8Update::Integer { update_bits: 4 }),
        Precision::Int8(Int8Update::FloatMaster),
    ] {
        let plan = Plan::new(Graph::with_precision(&spec, 8, p).unwrap());
        let mut arena = vec![0u8; plan.needed_bytes()];
        let mut ex = Int8Executor::new(&plan, &arena).unwrap();
        ex.init_params(&mut arena, spec.seed).unwrap();
        for step in 0..20 {
            let (x, y) = synthetic(8, step);
            ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
        }
        // A full micro-batch and a partial one.
        for n in [8, 3] {
            let (x, y) = synthetic(8, 100 + n);
            let (x, y) = (&x[..n * 36], &y[..n]);
            let before = (
                persistent_state(&plan, &ex, &arena),
                ex.counts(),
                ex.steps(),
            );
            let mut pred = vec![f32::NAN; n * classes];
            assert_eq!(ex.predict_into(&mut arena, x, &mut pred).unwrap(), n);
            let after = (
                persistent_state(&plan, &ex, &arena),
                ex.counts(),
                ex.steps(),
            );
            assert!(before == after, "{p:?}, n {n}: predict changed the state");
            // The values are the output tensor, dequantised by its exponent (read_f32 reads the
            // whole planned batch; the first n samples are this call's).
            let out = ex.read_f32(&mut arena, plan.graph.pred()).unwrap();
            assert_eq!(pred[..], out[..n * classes], "{p:?}, n {n}");
            assert!(
                pred.iter().any(|&v| v != 0.0),
                "{p:?}: a trained model's logits"
            );
            // Evaluate on the same samples scores exactly the samples whose arg-max is their label,
            // and every sample when labelled with its arg-max.
            let arg: Vec<u32> = pred.chunks_exact(classes).map(first_argmax).collect();
            let hits = arg.iter().zip(y).filter(|(a, b)| a == b).count();
            let s = ex.evaluate(&mut arena, x, Target::Classes(y)).unwrap();
            assert_eq!(s.correct, hits, "{p:?}, n {n}: {arg:?} vs {y:?}");
            let s = ex.evaluate(&mut arena, x, Target::Classes(&arg)).unwrap();
            assert_eq!(s.correct, n, "{p:?}, n {n}");
            // Per sample: the other labels are scored wrong.
            for (i, &a) in arg.iter().enumerate() {
                let mut other = arg.clone();
                other[i] = (a + 1) % classes as u32;
                let s = ex.evaluate(&mut arena, x, Target::Classes(&other)).unwrap();
                assert_eq!(s.correct, n - 1, "{p:?}, n {n}, sample {i}");
            }
        }
    }
}

#[test]
fn int8_predict_refuses_bad_batches_and_outputs() {
    let spec = tiny_spec();
    let p = Precision::Int8(Int8Update::Integer { update_bits: 4 });
    let plan = Plan::new(Graph::with_precision(&spec, 4, p).unwrap());
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Int8Executor::new(&plan, &arena).unwrap();
    ex.init_params(&mut arena, spec.seed).unwrap();
    let (x, _) = synthetic(5, 0);
    let mut out = vec![0f32; 25];
    use crate::exec::ExecError::{BadBatch, NonFinite};
    let e = |ex: &mut Int8Executor<'_>, a: &mut [u8], x: &[f32], o: &mut [f32]| {
        ex.predict_into(a, x, o).unwrap_err()
    };
    assert!(
        matches!(e(&mut ex, &mut arena, &x, &mut out), BadBatch(m, 5) if m.contains("more samples"))
    );
    assert!(
        matches!(e(&mut ex, &mut arena, &x[..35], &mut out[..5]), BadBatch(m, 35) if m.contains("multiple"))
    );
    assert!(matches!(
        e(&mut ex, &mut arena, &[], &mut []),
        BadBatch(_, 0)
    ));
    let mut bad = x[..36].to_vec();
    bad[7] = f32::NAN;
    assert!(matches!(
        e(&mut ex, &mut arena, &bad, &mut out[..5]),
        NonFinite(_)
    ));
    assert!(
        matches!(e(&mut ex, &mut arena, &x[..36], &mut out[..4]), BadBatch(m, 4) if m.contains("output"))
    );
    let mut small = vec![0u8; 16];
    assert!(matches!(
        e(&mut ex, &mut small, &x[..36], &mut out[..5]),
        crate::exec::ExecError::Budget(_)
    ));
}
