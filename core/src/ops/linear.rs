//! Fully connected layer, PyTorch layout: `W` is `[fout, fin]` row-major, `y = x·Wᵀ + b` for `x` of
//! shape `[n, fin]`. All three phases are one GEMM each.
use crate::kernels::{gemm_par, gemm_scratch_len, gemm_scratch_len_threads, MatRef, Real};
use crate::pool::{SingleThread, WorkerPool};

/// Scratch elements the three phases need (the largest GEMM packing requirement).
pub fn linear_scratch_len(n: usize, fin: usize, fout: usize) -> usize {
    gemm_scratch_len(n, fout, fin)
        .max(gemm_scratch_len(fout, fin, n))
        .max(gemm_scratch_len(n, fin, fout))
}

/// Scratch elements the three phases need on `threads` workers (each packs its own A panels; see
/// [`gemm_scratch_len_threads`]); [`linear_scratch_len`] for `threads ≤ 1`.
pub fn linear_scratch_len_threads(n: usize, fin: usize, fout: usize, threads: usize) -> usize {
    gemm_scratch_len_threads(n, fout, fin, threads)
        .max(gemm_scratch_len_threads(fout, fin, n, threads))
        .max(gemm_scratch_len_threads(n, fin, fout, threads))
}

/// `y[n, fout] = x[n, fin]·Wᵀ + b`.
#[allow(clippy::too_many_arguments)]
pub fn linear_fwd<T: Real>(
    n: usize,
    fin: usize,
    fout: usize,
    x: &[T],
    w: &[T],
    b: Option<&[T]>,
    y: &mut [T],
    scratch: &mut [T],
) {
    linear_fwd_par(&SingleThread, n, fin, fout, x, w, b, y, scratch)
}

/// [`linear_fwd`] on the workers of `pool`: the GEMM's output rows are split, so the result is the
/// same bits for any pool.
#[allow(clippy::too_many_arguments)]
pub fn linear_fwd_par<T: Real>(
    pool: &dyn WorkerPool,
    n: usize,
    fin: usize,
    fout: usize,
    x: &[T],
    w: &[T],
    b: Option<&[T]>,
    y: &mut [T],
    scratch: &mut [T],
) {
    let y = &mut y[..n * fout];
    if let Some(b) = b {
        // Pre-fill with the bias and let the GEMM accumulate: one pass over y instead of two.
        for row in y.chunks_exact_mut(fout.max(1)) {
            row.copy_from_slice(&b[..fout]);
        }
    }
    gemm_par(
        pool,
        n,
        fout,
        fin,
        MatRef::row_major(x, fin),
        MatRef::row_major_t(w, fin),
        y,
        fout,
        b.is_some(),
        scratch,
    );
}

/// `dW[fout, fin] = dYᵀ·X`, `db = Σ_rows dY` (both overwritten).
#[allow(clippy::too_many_arguments)]
pub fn linear_grad_w<T: Real>(
    n: usize,
    fin: usize,
    fout: usize,
    x: &[T],
    dy: &[T],
    dw: &mut [T],
    db: Option<&mut [T]>,
    accumulate: bool,
    scratch: &mut [T],
) {
    linear_grad_w_par(
        &SingleThread,
        n,
        fin,
        fout,
        x,
        dy,
        dw,
        db,
        accumulate,
        scratch,
    )
}

/// [`linear_grad_w`] on the workers of `pool` (rows of dW split; `db` summed on the calling thread in
/// row order), the same bits for any pool.
#[allow(clippy::too_many_arguments)]
pub fn linear_grad_w_par<T: Real>(
    pool: &dyn WorkerPool,
    n: usize,
    fin: usize,
    fout: usize,
    x: &[T],
    dy: &[T],
    dw: &mut [T],
    db: Option<&mut [T]>,
    accumulate: bool,
    scratch: &mut [T],
) {
    linear_grad_w_rows_par(
        pool,
        n,
        fin,
        fout,
        fout,
        x,
        dy,
        Some(dw),
        db,
        accumulate,
        scratch,
    )
}

/// [`linear_grad_w_par`] for the leading `rows` outputs only (a sparse update): `dw` holds
/// `rows × fin` elements and `db` `rows` — or none, when only the bias trains (then `x` is not read and
/// may be empty). The updated rows' values are the full gradient's.
#[allow(clippy::too_many_arguments)]
pub fn linear_grad_w_rows_par<T: Real>(
    pool: &dyn WorkerPool,
    n: usize,
    fin: usize,
    fout: usize,
    rows: usize,
    x: &[T],
    dy: &[T],
    dw: Option<&mut [T]>,
    db: Option<&mut [T]>,
    accumulate: bool,
    scratch: &mut [T],
) {
    let rows = rows.min(fout);
    match dw {
        None => {}
        // Do not rely on the GEMM's k = 0 convention: the gradient of an empty batch is zero.
        Some(dw) if n == 0 && !accumulate => dw[..rows * fin].iter_mut().for_each(|v| *v = T::ZERO),
        Some(_) if n == 0 => {}
        Some(dw) => gemm_par(
            pool,
            rows,
            fin,
            n,
            MatRef::row_major_t(dy, fout),
            MatRef::row_major(x, fin),
            &mut dw[..rows * fin],
            fin,
            accumulate,
            scratch,
        ),
    }
    if let Some(db) = db {
        let db = &mut db[..rows];
        if !accumulate {
            db.iter_mut().for_each(|v| *v = T::ZERO);
        }
        if fout > 0 {
            for row in dy[..n * fout].chunks_exact(fout) {
                for (d, &g) in db.iter_mut().zip(row) {
                    *d += g;
                }
            }
        }
    }
}

/// `dX[n, fin] = dY·W` (added into `dx` when `accumulate`).
#[allow(clippy::too_many_arguments)]
pub fn linear_grad_x<T: Real>(
    n: usize,
    fin: usize,
    fout: usize,
    dy: &[T],
    w: &[T],
    dx: &mut [T],
    accumulate: bool,
    scratch: &mut [T],
) {
    linear_grad_x_par(&SingleThread, n, fin, fout, dy, w, dx, accumulate, scratch)
}

/// [`linear_grad_x`] on the workers of `pool` (rows of dX split), the same bits for any pool.
#[allow(clippy::too_many_arguments)]
pub fn linear_grad_x_par<T: Real>(
    pool: &dyn WorkerPool,
    n: usize,
    fin: usize,
    fout: usize,
    dy: &[T],
    w: &[T],
    dx: &mut [T],
    accumulate: bool,
    scratch: &mut [T],
) {
    gemm_par(
        pool,
        n,
        fin,
        fout,
        MatRef::row_major(dy, fout),
        MatRef::row_major(w, fin),
        &mut dx[..n * fin],
        fin,
        accumulate,
        scratch,
    );
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;
    use crate::rng::Rng;

    struct Case {
        n: usize,
        fin: usize,
        fout: usize,
        x: Vec<f64>,
        w: Vec<f64>,
        b: Vec<f64>,
    }

    fn case(rng: &mut Rng, n: usize, fin: usize, fout: usize) -> Case {
        Case {
            n,
            fin,
            fout,
            x: rand_vec(rng, n * fin, -1.0, 1.0),
            w: rand_vec(rng, fout * fin, -1.0, 1.0),
            b: rand_vec(rng, fout, -1.0, 1.0),
        }
    }

    fn fwd<T: Real>(c: &Case, x: &[T], w: &[T], b: Option<&[T]>) -> Vec<T> {
        let mut y = vec![T::ZERO; c.n * c.fout];
        let mut s = vec![T::ZERO; linear_scratch_len(c.n, c.fin, c.fout)];
        linear_fwd(c.n, c.fin, c.fout, x, w, b, &mut y, &mut s);
        y
    }

    #[test]
    fn fd_gradients() {
        let mut rng = Rng::new(50);
        for (n, fin, fout) in [(3, 5, 4), (1, 7, 2), (4, 1, 3)] {
            let c = case(&mut rng, n, fin, fout);
            let r = rand_vec(&mut rng, n * fout, -1.0, 1.0);
            let mut s = vec![0.0; linear_scratch_len(n, fin, fout)];
            let (mut dw, mut db, mut dx) =
                (vec![9.0; fout * fin], vec![9.0; fout], vec![9.0; n * fin]);
            linear_grad_w(
                n,
                fin,
                fout,
                &c.x,
                &r,
                &mut dw,
                Some(&mut db),
                false,
                &mut s,
            );
            linear_grad_x(n, fin, fout, &r, &c.w, &mut dx, false, &mut s);
            let pre = rand_vec(&mut rng, n * fin, -1.0, 1.0);
            let mut dacc = pre.clone();
            linear_grad_x(n, fin, fout, &r, &c.w, &mut dacc, true, &mut s);

            let fx = fd_grad(&c.x, |x| dotf(&fwd(&c, x, &c.w, Some(&c.b)), &r));
            let fw = fd_grad(&c.w, |w| dotf(&fwd(&c, &c.x, w, Some(&c.b)), &r));
            let fb = fd_grad(&c.b, |b| dotf(&fwd(&c, &c.x, &c.w, Some(b)), &r));
            assert_close("linear dx", &dx, &fx, FD_TOL, FD_FLOOR);
            assert_close("linear dx acc", &sub(&dacc, &pre), &fx, FD_TOL, FD_FLOOR);
            assert_close("linear dw", &dw, &fw, FD_TOL, FD_FLOOR);
            assert_close("linear db", &db, &fb, FD_TOL, FD_FLOOR);
        }
    }

    #[test]
    fn exact_and_no_bias() {
        // x = [1 2], W = [[1 0], [2 -1], [0 3]], b = [0.5 0 -1] → y = [1.5, 0, 5].
        let w = [1.0f32, 0.0, 2.0, -1.0, 0.0, 3.0];
        let mut y = [0.0f32; 3];
        let mut s = vec![0.0f32; linear_scratch_len(1, 2, 3)];
        linear_fwd(
            1,
            2,
            3,
            &[1.0, 2.0],
            &w,
            Some(&[0.5, 0.0, -1.0]),
            &mut y,
            &mut s,
        );
        assert_eq!(y, [1.5, 0.0, 5.0]);
        linear_fwd(1, 2, 3, &[1.0, 2.0], &w, None, &mut y, &mut s);
        assert_eq!(y, [1.0, 0.0, 6.0]);
        // n = 0 (an empty final batch) writes zero gradients and touches nothing else.
        let (mut dw, mut db) = ([5.0f32; 6], [5.0f32; 3]);
        linear_grad_w(0, 2, 3, &[], &[], &mut dw, Some(&mut db), false, &mut s);
        assert_eq!((dw, db), ([0.0; 6], [0.0; 3]));
    }

    #[test]
    fn f32_matches_f64() {
        // Dot products of ≤ 40 O(1) terms: the f32 error is ≲ 40·2^-24·Σ|terms| ≈ 1e-5·Σ|terms|,
        // typically √40 times less. Compared per element with a 1e-2-of-max floor (cancellation).
        let mut rng = Rng::new(51);
        let (n, fin, fout) = (6, 40, 9);
        let c = case(&mut rng, n, fin, fout);
        let r = rand_vec(&mut rng, n * fout, -1.0, 1.0);
        let y = fwd(&c, &c.x, &c.w, Some(&c.b));
        let (x32, w32, b32, r32) = (to_f32(&c.x), to_f32(&c.w), to_f32(&c.b), to_f32(&r));
        let y32 = fwd(&c, &x32, &w32, Some(&b32));
        assert_close("linear y f32", &widen(&y32), &y, 2e-5, 1e-2);
        let mut s = vec![0.0; linear_scratch_len(n, fin, fout)];
        let mut s32 = vec![0.0f32; linear_scratch_len(n, fin, fout)];
        let (mut dw, mut db, mut dx) = (vec![0.0; fout * fin], vec![0.0; fout], vec![0.0; n * fin]);
        let (mut dw32, mut db32, mut dx32) = (
            vec![0f32; fout * fin],
            vec![0f32; fout],
            vec![0f32; n * fin],
        );
        linear_grad_w(
            n,
            fin,
            fout,
            &c.x,
            &r,
            &mut dw,
            Some(&mut db),
            false,
            &mut s,
        );
        linear_grad_w(
            n,
            fin,
            fout,
            &x32,
            &r32,
            &mut dw32,
            Some(&mut db32),
            false,
            &mut s32,
        );
        linear_grad_x(n, fin, fout, &r, &c.w, &mut dx, false, &mut s);
        linear_grad_x(n, fin, fout, &r32, &w32, &mut dx32, false, &mut s32);
        assert_close("linear dw f32", &widen(&dw32), &dw, 2e-5, 1e-2);
        assert_close("linear db f32", &widen(&db32), &db, 2e-5, 1e-2);
        assert_close("linear dx f32", &widen(&dx32), &dx, 2e-5, 1e-2);
    }

    /// All three phases on 2, 3 and 4 workers equal one worker bit for bit (odd sizes: edge tiles in
    /// both directions), with one worker's scratch and with the threaded scratch.
    #[test]
    fn threads_give_identical_bits() {
        use crate::kernels::par::testing::Scoped;
        let mut rng = Rng::new(5);
        for (n, fin, fout) in [(1, 3, 2), (37, 29, 13), (130, 67, 101), (9, 300, 70)] {
            let c = case(&mut rng, n, fin, fout);
            let (x, w, b) = (to_f32(&c.x), to_f32(&c.w), to_f32(&c.b));
            let dy = to_f32(&rand_vec(&mut rng, n * fout, -1.0, 1.0));
            let run = |pool: &dyn WorkerPool, len: usize| {
                let mut s = vec![0.0f32; len];
                let mut y = vec![f32::NAN; n * fout];
                linear_fwd_par(pool, n, fin, fout, &x, &w, Some(&b), &mut y, &mut s);
                let mut dw = vec![f32::NAN; fout * fin];
                let mut db = vec![f32::NAN; fout];
                linear_grad_w_par(
                    pool,
                    n,
                    fin,
                    fout,
                    &x,
                    &dy,
                    &mut dw,
                    Some(&mut db),
                    false,
                    &mut s,
                );
                let mut dx = x.clone();
                linear_grad_x_par(pool, n, fin, fout, &dy, &w, &mut dx, true, &mut s);
                [y, dw, db, dx]
            };
            let base = linear_scratch_len(n, fin, fout);
            let want = run(&SingleThread, base);
            for t in [2usize, 3, 4] {
                for len in [base, linear_scratch_len_threads(n, fin, fout, t)] {
                    let got = run(&Scoped(t), len);
                    for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                        assert!(
                            a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits()),
                            "{n}x{fin}x{fout} t={t} len={len} output {i}"
                        );
                    }
                }
            }
        }
    }
}
