//! Finite-difference checks of every sequence op (f64 path; tolerances in `testutil`), and the f32
//! path against the f64 one.
use super::*;
use crate::ops::testutil::*;
use crate::rng::Rng;

/// Checks `analytic` (the op's gradient w.r.t. `x`) against central differences of `loss(x)`.
fn fd_check(what: &str, x: &[f64], analytic: &[f64], loss: impl FnMut(&[f64]) -> f64) {
    let want = fd_grad(x, loss);
    assert_close(what, analytic, &want, FD_TOL, FD_FLOOR);
}

#[test]
fn embedding_and_positions() {
    let mut rng = Rng::new(1);
    let (n, t, d, vocab) = (2, 3, 4, 5);
    let ids: Vec<f32> = [0.0, 3.0, 3.0, 4.0, 1.0, 0.0].to_vec();
    assert!(check_ids(&ids, vocab).is_ok());
    assert_eq!(check_ids(&[1.0, 5.0], vocab), Err((1, 5.0)));
    assert_eq!(check_ids(&[1.5], vocab), Err((0, 1.5)));
    assert_eq!(check_ids(&[-1.0], vocab), Err((0, -1.0)));
    assert!(check_ids(&[f32::NAN], vocab).is_err());
    let table = rand_vec(&mut rng, vocab * d, -1.0, 1.0);
    let pos = rand_vec(&mut rng, t * d, -1.0, 1.0);
    let r = rand_vec(&mut rng, n * t * d, -1.0, 1.0);
    let f = |table: &[f64], pos: &[f64]| {
        let mut e = vec![0.0; n * t * d];
        embedding_fwd(&ids, table, d, &mut e);
        let mut y = vec![0.0; n * t * d];
        pos_fwd(n, t * d, &e, pos, &mut y);
        let mut y2 = e.clone();
        pos_fwd_inplace(n, t * d, pos, &mut y2);
        assert_eq!(y, y2);
        dotf(&y, &r)
    };
    let mut dw = vec![7.0; vocab * d];
    embedding_grad_w(&ids, &r, d, &mut dw, false);
    // Token 2 is never seen: its gradient row is zero.
    assert!(dw[2 * d..3 * d].iter().all(|&v| v == 0.0));
    fd_check("embedding dW", &table, &dw, |tb| f(tb, &pos));
    let mut dp = vec![0.0; t * d];
    pos_grad_w(n, t * d, &r, &mut dp, false);
    fd_check("positions dP", &pos, &dp, |p| f(&table, p));
}

#[test]
fn layernorm_and_rmsnorm() {
    let mut rng = Rng::new(2);
    let (rows, dim) = (5, 6);
    let x = rand_vec(&mut rng, rows * dim, -2.0, 2.0);
    let g = rand_vec(&mut rng, dim, 0.5, 1.5);
    let b = rand_vec(&mut rng, dim, -0.5, 0.5);
    let r = rand_vec(&mut rng, rows * dim, -1.0, 1.0);
    for rms in [false, true] {
        let fwd = |x: &[f64], g: &[f64], b: &[f64]| {
            let mut y = vec![0.0; rows * dim];
            let mut mean = vec![0.0; rows];
            let mut rstd = vec![0.0; rows];
            let bias = if rms { None } else { Some(b) };
            let m = if rms { None } else { Some(&mut mean[..]) };
            norm_fwd(rows, dim, 1e-5, x, g, bias, &mut y, m, &mut rstd);
            (y, mean, rstd)
        };
        let (_, mean, rstd) = fwd(&x, &g, &b);
        let m = if rms { None } else { Some(&mean[..]) };
        let mut dg = vec![0.0; dim];
        let mut db = vec![0.0; dim];
        let dbo = if rms { None } else { Some(&mut db[..]) };
        norm_grad_w(rows, dim, &x, &r, m, &rstd, &mut dg, dbo, false);
        let mut dx = vec![0.0; rows * dim];
        norm_grad_x(rows, dim, &x, &r, &g, m, &rstd, &mut dx, false);
        let what = if rms { "rmsnorm" } else { "layernorm" };
        fd_check(&format!("{what} dx"), &x, &dx, |x| {
            dotf(&fwd(x, &g, &b).0, &r)
        });
        fd_check(&format!("{what} dγ"), &g, &dg, |g| {
            dotf(&fwd(&x, g, &b).0, &r)
        });
        if !rms {
            fd_check("layernorm dβ", &b, &db, |b| dotf(&fwd(&x, &g, b).0, &r));
        }
        // Accumulation adds.
        let mut dx2 = dx.clone();
        norm_grad_x(rows, dim, &x, &r, &g, m, &rstd, &mut dx2, true);
        assert!(dx2
            .iter()
            .zip(&dx)
            .all(|(a, b)| (a - 2.0 * b).abs() < 1e-12));
    }
}

#[test]
fn gelu_and_silu() {
    let mut rng = Rng::new(3);
    let x = rand_vec(&mut rng, 40, -4.0, 4.0);
    let r = rand_vec(&mut rng, 40, -1.0, 1.0);
    for a in [Smooth::Gelu, Smooth::Silu] {
        let mut dx = vec![0.0; 40];
        smooth_grad(a, &x, &r, &mut dx, false);
        fd_check(&format!("{a:?}"), &x, &dx, |x| {
            let mut y = vec![0.0; 40];
            smooth_fwd(a, x, &mut y);
            dotf(&y, &r)
        });
        // f32 against f64: libm's erff/expf and three f32 products each round (ε = 6e-8); near the
        // zero crossing the floor (1e-2 of the largest output) turns those ulps into ~1e-6 relative.
        let x32 = to_f32(&x);
        let mut y32 = vec![0.0f32; 40];
        smooth_fwd(a, &x32, &mut y32);
        let mut y64 = vec![0.0; 40];
        smooth_fwd(a, &x, &mut y64);
        assert_close(&format!("{a:?} f32"), &widen(&y32), &y64, 1e-5, 1e-2);
    }
}

/// The weight gradient from the activation's input equals the plain Linear's on the activation's
/// output: bit for bit in f32 over whole tiles (the GEMM's depth blocks are the tiles), to f64
/// rounding over a partial last tile (only the blocking of the sums differs), for every output and a
/// sparse update's leading rows, overwriting and accumulating; the bias gradient is the plain one.
#[test]
fn linear_weight_gradient_recomputes_its_activation() {
    use crate::ops::{linear_grad_w_rows_par, linear_scratch_len};
    use crate::pool::SingleThread;
    let mut rng = Rng::new(9);
    let (fin, fout) = (12, 5);
    for a in [Smooth::Gelu, Smooth::Silu] {
        for (n, rows, acc) in [(2 * ACT_TILE_ROWS, 5, false), (2 * ACT_TILE_ROWS, 3, true)] {
            let h = to_f32(&rand_vec(&mut rng, n * fin, -3.0, 3.0));
            let dy = to_f32(&rand_vec(&mut rng, n * fout, -1.0, 1.0));
            let start = to_f32(&rand_vec(&mut rng, fout * fin + fout, -1.0, 1.0));
            let mut y = vec![0.0f32; n * fin];
            smooth_fwd(a, &h, &mut y);
            let mut s = vec![0.0f32; act_tile_len(n, fin) + linear_scratch_len(n, fin, fout)];
            let (mut dw, mut db) = (start[..fout * fin].to_vec(), start[fout * fin..].to_vec());
            let (mut dw2, mut db2) = (dw.clone(), db.clone());
            linear_act_grad_w_par(
                &SingleThread,
                a,
                n,
                fin,
                fout,
                rows,
                &h,
                &dy,
                Some(&mut dw),
                Some(&mut db),
                acc,
                &mut s,
            );
            linear_grad_w_rows_par(
                &SingleThread,
                n,
                fin,
                fout,
                rows,
                &y,
                &dy,
                Some(&mut dw2),
                Some(&mut db2),
                acc,
                &mut s,
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&dw), bits(&dw2), "{a:?} dW, n = {n}, rows = {rows}");
            assert_eq!(bits(&db), bits(&db2), "{a:?} db");
        }
        // A partial last tile, in f64: the sums' blocking differs, so rounding (≈ 1e-16 relative).
        let n = ACT_TILE_ROWS + 37;
        let h = rand_vec(&mut rng, n * fin, -3.0, 3.0);
        let dy = rand_vec(&mut rng, n * fout, -1.0, 1.0);
        let mut y = vec![0.0; n * fin];
        smooth_fwd(a, &h, &mut y);
        let mut s = vec![0.0f64; act_tile_len(n, fin)];
        let (mut dw, mut dw2) = (vec![0.0; fout * fin], vec![0.0; fout * fin]);
        linear_act_grad_w_par(
            &SingleThread,
            a,
            n,
            fin,
            fout,
            fout,
            &h,
            &dy,
            Some(&mut dw),
            None,
            false,
            &mut s,
        );
        linear_grad_w_rows_par(
            &SingleThread,
            n,
            fin,
            fout,
            fout,
            &y,
            &dy,
            Some(&mut dw2),
            None,
            false,
            &mut [],
        );
        assert_close(&format!("{a:?} dW f64"), &dw, &dw2, 1e-12, 1e-2);
        // LoRA's adapter gradients likewise (dA from the recomputed tiles, dB as before).
        let g = LoraGeom {
            fin,
            fout,
            rank: 3,
            scale: 0.5,
        };
        let n = 2 * ACT_TILE_ROWS;
        let h = to_f32(&rand_vec(&mut rng, n * fin, -3.0, 3.0));
        let dy = to_f32(&rand_vec(&mut rng, n * fout, -1.0, 1.0));
        let u = to_f32(&rand_vec(&mut rng, n * g.rank, -1.0, 1.0));
        let bm = to_f32(&rand_vec(&mut rng, fout * g.rank, -1.0, 1.0));
        let mut y = vec![0.0f32; n * fin];
        smooth_fwd(a, &h, &mut y);
        let mut s = vec![0.0f32; lora_bwd_scratch_len(&g, n) + act_tile_len(n, fin)];
        let (mut da, mut db) = (vec![0.0f32; g.rank * fin], vec![0.0f32; fout * g.rank]);
        let (mut da2, mut db2) = (da.clone(), db.clone());
        lora_act_grad_w(
            &g,
            Some(a),
            n,
            &h,
            &u,
            &dy,
            &bm,
            &mut da,
            &mut db,
            false,
            &mut s,
        );
        lora_grad_w(&g, n, &y, &u, &dy, &bm, &mut da2, &mut db2, false, &mut s);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&da), bits(&da2), "{a:?} LoRA dA");
        assert_eq!(bits(&db), bits(&db2), "{a:?} LoRA dB");
    }
}

#[test]
fn causal_attention() {
    // One tile, and two (a full one and a short one: the backward's cross-tile sums into dK, dV).
    for seq in [5, ATTN_TILE_ROWS + 3] {
        for recompute_probs in [false, true] {
            causal_attention_mode(seq, recompute_probs);
        }
    }
}

fn causal_attention_mode(seq: usize, recompute_probs: bool) {
    let mut rng = Rng::new(4);
    let g = AttnGeom {
        seq,
        dim: 6,
        heads: 2,
        recompute_probs,
    };
    let n = 2;
    let qkv = rand_vec(&mut rng, n * g.seq * 3 * g.dim, -1.0, 1.0);
    let r = rand_vec(&mut rng, n * g.seq * g.dim, -1.0, 1.0);
    let fwd = |x: &[f64]| {
        let mut p = vec![0.0; n * g.saved_per_sample()];
        let mut o = vec![0.0; n * g.seq * g.dim];
        let mut s = vec![0.0; attention_fwd_scratch_len(&g)];
        attention_fwd(&g, n, x, &mut p, &mut o, &mut s);
        (p, o)
    };
    let (p, o) = fwd(&qkv);
    // Causal: the first token's output is its own value.
    assert!((0..g.dim).all(|j| (o[j] - qkv[2 * g.dim + j]).abs() < 1e-12));
    if !recompute_probs {
        // Probabilities above the diagonal are zero, each row sums to 1.
        for h in 0..g.heads {
            for i in 0..g.seq {
                let row = &p[(h * g.seq + i) * g.seq..(h * g.seq + i + 1) * g.seq];
                assert!(row[i + 1..].iter().all(|&v| v == 0.0));
                assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-12);
            }
        }
    }
    let mut dx = vec![0.0; qkv.len()];
    let mut s = vec![0.0; attention_bwd_scratch_len(&g)];
    attention_grad_x(&g, n, &qkv, &p, &r, &mut dx, false, &mut s);
    fd_check("attention dqkv", &qkv, &dx, |x| dotf(&fwd(x).1, &r));
    // Changing a later token leaves earlier outputs unchanged (no look-ahead).
    let mut x2 = qkv.clone();
    let last = (g.seq - 1) * 3 * g.dim;
    x2[last..last + 3 * g.dim]
        .iter_mut()
        .for_each(|v| *v += 0.5);
    let o2 = fwd(&x2).1;
    assert_eq!(o[..(g.seq - 1) * g.dim], o2[..(g.seq - 1) * g.dim]);
    // The f32 path (SIMD GEMM) agrees with f64: O(1) values, sums of ≤ 19 terms (f32 rounding
    // ~1e-7 relative per term, far inside 1e-5 absolute).
    let mut p32 = vec![0.0f32; p.len()];
    let mut o32 = vec![0.0f32; o.len()];
    let mut s32 = vec![0.0f32; attention_fwd_scratch_len(&g)];
    attention_fwd(&g, n, &to_f32(&qkv), &mut p32, &mut o32, &mut s32);
    assert_close("attention f32", &widen(&o32), &o, 1e-5, 1e-2);
}

/// The two modes give the same bits, forward and backward, in f32 (the SIMD GEMM) over several tiles
/// of [`ATTN_TILE_ROWS`] rows and a short last tile, accumulating and not.
#[test]
fn attention_recompute_matches_saving_bitwise() {
    let mut rng = Rng::new(9);
    let save = AttnGeom {
        seq: 2 * ATTN_TILE_ROWS + 5,
        dim: 16,
        heads: 2,
        recompute_probs: false,
    };
    let rec = AttnGeom {
        recompute_probs: true,
        ..save
    };
    assert_eq!(rec.saved_per_sample(), 2 * 2 * save.seq);
    let n = 3;
    let qkv = to_f32(&rand_vec(&mut rng, n * save.seq * 3 * save.dim, -2.0, 2.0));
    let d_o = to_f32(&rand_vec(&mut rng, n * save.seq * save.dim, -1.0, 1.0));
    let init = to_f32(&rand_vec(&mut rng, qkv.len(), -1.0, 1.0));
    let run = |g: &AttnGeom, acc: bool| {
        let mut saved = vec![0.0f32; n * g.saved_per_sample()];
        let mut o = vec![0.0f32; n * g.seq * g.dim];
        let mut s = vec![0.0f32; attention_fwd_scratch_len(g)];
        attention_fwd(g, n, &qkv, &mut saved, &mut o, &mut s);
        let mut dx = init.clone();
        let mut s = vec![0.0f32; attention_bwd_scratch_len(g)];
        attention_grad_x(g, n, &qkv, &saved, &d_o, &mut dx, acc, &mut s);
        (o, dx)
    };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for acc in [false, true] {
        let (o1, dx1) = run(&save, acc);
        let (o2, dx2) = run(&rec, acc);
        assert_eq!(bits(&o1), bits(&o2), "attention output, accumulate {acc}");
        assert_eq!(bits(&dx1), bits(&dx2), "attention dqkv, accumulate {acc}");
    }
    // Recompute mode's scratch is not proportional to seq² beyond two tiles.
    assert!(attention_bwd_scratch_len(&rec) - attention_bwd_scratch_len(&save) == rec.tile_len());
}

#[test]
fn lora_linear() {
    let mut rng = Rng::new(5);
    let g = LoraGeom {
        fin: 5,
        fout: 4,
        rank: 2,
        scale: 1.5,
    };
    let rows = 6;
    let x = rand_vec(&mut rng, rows * g.fin, -1.0, 1.0);
    let w = rand_vec(&mut rng, g.fout * g.fin, -1.0, 1.0);
    let b = rand_vec(&mut rng, g.fout, -1.0, 1.0);
    let a = rand_vec(&mut rng, g.rank * g.fin, -1.0, 1.0);
    let bm = rand_vec(&mut rng, g.fout * g.rank, -1.0, 1.0);
    let r = rand_vec(&mut rng, rows * g.fout, -1.0, 1.0);
    let sl =
        lora_bwd_scratch_len(&g, rows).max(crate::ops::linear_scratch_len(rows, g.fin, g.fout));
    let fwd = |x: &[f64], a: &[f64], bm: &[f64]| {
        let mut u = vec![0.0; rows * g.rank];
        let mut y = vec![0.0; rows * g.fout];
        let mut s = vec![0.0; sl];
        lora_fwd(&g, rows, x, &w, Some(&b), a, bm, &mut u, &mut y, &mut s);
        (u, y)
    };
    let (u, _) = fwd(&x, &a, &bm);
    let mut s = vec![0.0; sl];
    let mut da = vec![0.0; a.len()];
    let mut db = vec![0.0; bm.len()];
    lora_grad_w(&g, rows, &x, &u, &r, &bm, &mut da, &mut db, false, &mut s);
    let mut dx = vec![0.0; x.len()];
    lora_grad_x(&g, rows, &r, &w, &a, &bm, &mut dx, false, &mut s);
    fd_check("lora dA", &a, &da, |a| dotf(&fwd(&x, a, &bm).1, &r));
    fd_check("lora dB", &bm, &db, |bm| dotf(&fwd(&x, &a, bm).1, &r));
    fd_check("lora dx", &x, &dx, |x| dotf(&fwd(x, &a, &bm).1, &r));
}
