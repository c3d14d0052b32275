//! Max, average and global-average pooling (no padding, floor mode: PyTorch defaults). NCHW; every
//! `(sample, channel)` plane is pooled independently.
use super::elementwise::{fill, sum};
use crate::kernels::Real;

/// Pooling window geometry for one sample (`c` planes of `h×w` → `c` planes of `oh×ow`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolGeom {
    /// Channels.
    pub c: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Window height.
    pub kh: usize,
    /// Window width.
    pub kw: usize,
    /// Vertical stride.
    pub sh: usize,
    /// Horizontal stride.
    pub sw: usize,
    /// Output height `(h − kh)/sh + 1`.
    pub oh: usize,
    /// Output width `(w − kw)/sw + 1`.
    pub ow: usize,
}

impl PoolGeom {
    /// Validates and derives the output size. `None` for zero sizes, a window larger than the input,
    /// or a plane too large for `u32` argmax indices.
    pub fn new(
        c: usize,
        h: usize,
        w: usize,
        kh: usize,
        kw: usize,
        sh: usize,
        sw: usize,
    ) -> Option<Self> {
        if c == 0
            || h == 0
            || w == 0
            || kh == 0
            || kw == 0
            || sh == 0
            || sw == 0
            || kh > h
            || kw > w
        {
            return None;
        }
        if h.checked_mul(w)? > u32::MAX as usize {
            return None;
        }
        let oh = (h - kh) / sh + 1;
        let ow = (w - kw) / sw + 1;
        Some(Self {
            c,
            h,
            w,
            kh,
            kw,
            sh,
            sw,
            oh,
            ow,
        })
    }
    /// Input elements per sample.
    pub fn in_len(&self) -> usize {
        self.c * self.h * self.w
    }
    /// Output elements per sample (also the argmax elements per sample).
    pub fn out_len(&self) -> usize {
        self.c * self.oh * self.ow
    }
}

/// Max pooling of `n` samples. `argmax[o]` receives the index of the chosen element within its
/// `h×w` plane (`iy·w + ix`); the first maximum in row-major window order wins, and a NaN wins
/// (PyTorch semantics: `val > max || isnan(val)`).
///
/// Works one output row at a time, sweeping the window taps in row-major order over the whole row:
/// every step is a branch-free select over contiguous (or strided) data, which vectorises, instead of a
/// data-dependent branch per element (unpredictable on real activations).
pub fn maxpool_fwd<T: Real>(g: &PoolGeom, n: usize, x: &[T], y: &mut [T], argmax: &mut [u32]) {
    let (hw, ohow) = (g.h * g.w, g.oh * g.ow);
    let planes = n * g.c;
    let span = (g.ow - 1) * g.sw + 1;
    let xs = x[..planes * hw].chunks_exact(hw);
    let ys = y[..planes * ohow].chunks_exact_mut(ohow);
    let is = argmax[..planes * ohow].chunks_exact_mut(ohow);
    for ((xp, yp), ap) in xs.zip(ys).zip(is) {
        let rows = yp.chunks_exact_mut(g.ow).zip(ap.chunks_exact_mut(g.ow));
        for (oy, (yr, ar)) in rows.enumerate() {
            let row0 = oy * g.sh * g.w;
            if g.kh == 2 && g.kw == 2 && g.sw == 2 {
                // The common 2×2/stride-2 window: one fused pass, pairs read with `chunks_exact(2)`
                // (2·ow ≤ w, so both rows hold exactly the pairs needed).
                let a = &xp[row0..row0 + 2 * g.ow];
                let b = &xp[row0 + g.w..row0 + g.w + 2 * g.ow];
                max_2x2_row(a, b, row0 as u32, g.w as u32, yr, ar);
                continue;
            }
            for i in 0..g.kh {
                for j in 0..g.kw {
                    let base = row0 + i * g.w + j;
                    let xr = &xp[base..base + span];
                    if i == 0 && j == 0 {
                        init_row(xr, g.sw, base as u32, yr, ar);
                    } else if g.sw == 1 {
                        max_row(xr.iter(), 1, base as u32, yr, ar);
                    } else {
                        max_row(xr.iter().step_by(g.sw), g.sw as u32, base as u32, yr, ar);
                    }
                }
            }
        }
    }
}

/// `take` for max pooling: `v > m`, or `v` is NaN (the only value unordered with itself).
#[inline(always)]
fn takes<T: Real>(v: T, m: T) -> bool {
    (v > m) | v.partial_cmp(&v).is_none()
}

/// One 2×2/stride-2 output row: `a`, `b` are the two input rows (2·ow values each), `row0` the plane
/// index of `a[0]`, `w` the plane width.
///
/// Rows are short (7 outputs on a 14-wide map), so a vectorised loop would spend most of its time in
/// the scalar remainder, where the compiler turns the selects back into branches — unpredictable on
/// real data. Instead the row is covered by fixed chunks of [`PCH`] outputs (straight-line code the
/// SLP vectoriser turns into blends), the last chunk overlapping the previous one: recomputing an output
/// is idempotent. Rows shorter than a chunk use the scalar loop.
#[inline(always)]
fn max_2x2_row<T: Real>(a: &[T], b: &[T], row0: u32, w: u32, yr: &mut [T], ar: &mut [u32]) {
    let ow = yr.len();
    if ow < PCH {
        max_2x2_span(a, b, row0, w, yr, ar);
        return;
    }
    let mut o = 0;
    loop {
        let s = o.min(ow - PCH);
        let (ya, aa) = (&mut yr[s..s + PCH], &mut ar[s..s + PCH]);
        max_2x2_span(
            &a[2 * s..2 * s + 2 * PCH],
            &b[2 * s..2 * s + 2 * PCH],
            row0 + 2 * s as u32,
            w,
            ya,
            aa,
        );
        o += PCH;
        if o >= ow {
            break;
        }
    }
}

/// Outputs per chunk of [`max_2x2_row`] (one SSE vector of f32).
const PCH: usize = 4;

#[inline(always)]
fn max_2x2_span<T: Real>(a: &[T], b: &[T], row0: u32, w: u32, yr: &mut [T], ar: &mut [u32]) {
    let mut i0 = row0;
    for (((yo, ao), pa), pb) in yr
        .iter_mut()
        .zip(ar.iter_mut())
        .zip(a.chunks_exact(2))
        .zip(b.chunks_exact(2))
    {
        let (mut m, mut id) = (pa[0], i0);
        let t = takes(pa[1], m);
        m = if t { pa[1] } else { m };
        id = if t { i0 + 1 } else { id };
        let t = takes(pb[0], m);
        m = if t { pb[0] } else { m };
        id = if t { i0 + w } else { id };
        let t = takes(pb[1], m);
        m = if t { pb[1] } else { m };
        id = if t { i0 + w + 1 } else { id };
        *yo = m;
        *ao = id;
        i0 = i0.wrapping_add(2);
    }
}

#[inline(always)]
fn init_row<T: Real>(xr: &[T], sw: usize, base: u32, yr: &mut [T], ar: &mut [u32]) {
    let mut idx = base;
    for ((yo, ao), &v) in yr.iter_mut().zip(ar.iter_mut()).zip(xr.iter().step_by(sw)) {
        *yo = v;
        *ao = idx;
        idx = idx.wrapping_add(sw as u32);
    }
}

#[inline(always)]
fn max_row<'a, T: Real>(
    xr: impl Iterator<Item = &'a T>,
    sw: u32,
    base: u32,
    yr: &mut [T],
    ar: &mut [u32],
) {
    let mut idx = base;
    for ((yo, ao), &v) in yr.iter_mut().zip(ar.iter_mut()).zip(xr) {
        let take = takes(v, *yo);
        *yo = if take { v } else { *yo };
        *ao = if take { idx } else { *ao };
        idx = idx.wrapping_add(sw);
    }
}

/// Max-pooling backward: routes each `dy` to its argmax (`dx` zeroed first unless `accumulate`).
/// Out-of-plane argmax values are ignored.
pub fn maxpool_grad_x<T: Real>(
    g: &PoolGeom,
    n: usize,
    dy: &[T],
    argmax: &[u32],
    dx: &mut [T],
    accumulate: bool,
) {
    let (hw, ohow) = (g.h * g.w, g.oh * g.ow);
    let planes = n * g.c;
    let dx = &mut dx[..planes * hw];
    if !accumulate {
        fill(dx, T::ZERO);
    }
    let ds = dy[..planes * ohow].chunks_exact(ohow);
    let is = argmax[..planes * ohow].chunks_exact(ohow);
    for ((dp, ap), xp) in ds.zip(is).zip(dx.chunks_exact_mut(hw)) {
        for (&d, &a) in dp.iter().zip(ap) {
            if let Some(t) = xp.get_mut(a as usize) {
                *t += d;
            }
        }
    }
}

/// Average pooling: each output is the window sum divided by `kh·kw` (no padding, so PyTorch's
/// `count_include_pad` is moot). Row-at-a-time like [`maxpool_fwd`].
pub fn avgpool_fwd<T: Real>(g: &PoolGeom, n: usize, x: &[T], y: &mut [T]) {
    let (hw, ohow) = (g.h * g.w, g.oh * g.ow);
    let planes = n * g.c;
    // Multiplied by the reciprocal, not divided: a GPU's division need not round correctly, so the
    // GPU backend multiplies by the same f32 reciprocal and matches bit for bit.
    let inv = T::ONE / T::from_usize(g.kh * g.kw);
    let span = (g.ow - 1) * g.sw + 1;
    let xs = x[..planes * hw].chunks_exact(hw);
    let ys = y[..planes * ohow].chunks_exact_mut(ohow);
    for (xp, yp) in xs.zip(ys) {
        for (oy, yr) in yp.chunks_exact_mut(g.ow).enumerate() {
            let row0 = oy * g.sh * g.w;
            fill(yr, T::ZERO);
            for i in 0..g.kh {
                for j in 0..g.kw {
                    let base = row0 + i * g.w + j;
                    let xr = &xp[base..base + span];
                    if g.sw == 1 {
                        yr.iter_mut().zip(xr).for_each(|(y, &v)| *y += v);
                    } else {
                        yr.iter_mut()
                            .zip(xr.iter().step_by(g.sw))
                            .for_each(|(y, &v)| *y += v);
                    }
                }
            }
            yr.iter_mut().for_each(|y| *y *= inv);
        }
    }
}

/// Average-pooling backward: `dx[window] += dy/(kh·kw)` (`dx` zeroed first unless `accumulate`).
pub fn avgpool_grad_x<T: Real>(g: &PoolGeom, n: usize, dy: &[T], dx: &mut [T], accumulate: bool) {
    let (hw, ohow) = (g.h * g.w, g.oh * g.ow);
    let planes = n * g.c;
    // Multiplied by the reciprocal, not divided: a GPU's division need not round correctly, so the
    // GPU backend multiplies by the same f32 reciprocal and matches bit for bit.
    let inv = T::ONE / T::from_usize(g.kh * g.kw);
    let span = (g.ow - 1) * g.sw + 1;
    let dx = &mut dx[..planes * hw];
    if !accumulate {
        fill(dx, T::ZERO);
    }
    let ds = dy[..planes * ohow].chunks_exact(ohow);
    for (dp, xp) in ds.zip(dx.chunks_exact_mut(hw)) {
        for (oy, dr) in dp.chunks_exact(g.ow).enumerate() {
            let row0 = oy * g.sh * g.w;
            for i in 0..g.kh {
                for j in 0..g.kw {
                    let base = row0 + i * g.w + j;
                    let xr = &mut xp[base..base + span];
                    if g.sw == 1 {
                        xr.iter_mut().zip(dr).for_each(|(t, &d)| *t += d * inv);
                    } else {
                        xr.iter_mut()
                            .step_by(g.sw)
                            .zip(dr)
                            .for_each(|(t, &d)| *t += d * inv);
                    }
                }
            }
        }
    }
}

/// Global average pooling: `y[s, c] = mean over the h·w plane` (`x` is `[n, c, hw]`, `y` is `[n, c]`).
pub fn global_avgpool_fwd<T: Real>(n: usize, c: usize, hw: usize, x: &[T], y: &mut [T]) {
    if hw == 0 {
        return;
    }
    let inv = T::ONE / T::from_usize(hw);
    for (xp, yo) in x[..n * c * hw].chunks_exact(hw).zip(&mut y[..n * c]) {
        *yo = sum(xp) * inv;
    }
}

/// Global average pooling backward: `dx = dy/hw` broadcast over each plane (or added when `accumulate`).
pub fn global_avgpool_grad_x<T: Real>(
    n: usize,
    c: usize,
    hw: usize,
    dy: &[T],
    dx: &mut [T],
    accumulate: bool,
) {
    if hw == 0 {
        return;
    }
    let inv = T::ONE / T::from_usize(hw);
    for (xp, &d) in dx[..n * c * hw].chunks_exact_mut(hw).zip(&dy[..n * c]) {
        let v = d * inv;
        if accumulate {
            xp.iter_mut().for_each(|t| *t += v);
        } else {
            fill(xp, v);
        }
    }
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;
    use crate::rng::Rng;

    fn geoms() -> Vec<(PoolGeom, usize)> {
        vec![
            (PoolGeom::new(2, 6, 8, 2, 2, 2, 2).unwrap(), 3), // non-overlapping
            (PoolGeom::new(3, 7, 6, 3, 2, 2, 1).unwrap(), 2), // overlapping, non-square, ragged edge
            (PoolGeom::new(1, 5, 5, 3, 3, 1, 1).unwrap(), 2), // heavily overlapping
        ]
    }

    #[test]
    fn geometry() {
        let g = PoolGeom::new(3, 7, 6, 3, 2, 2, 1).unwrap();
        assert_eq!((g.oh, g.ow), (3, 5));
        assert!(PoolGeom::new(1, 2, 2, 3, 1, 1, 1).is_none());
        assert!(PoolGeom::new(1, 2, 2, 1, 1, 0, 1).is_none());
        assert!(PoolGeom::new(0, 2, 2, 1, 1, 1, 1).is_none());
    }

    #[test]
    fn maxpool_fd_exact_accumulate_f32() {
        let mut rng = Rng::new(40);
        for (g, n) in geoms() {
            let x = distinct_vec(&mut rng, n * g.in_len());
            let r = rand_vec(&mut rng, n * g.out_len(), -1.0, 1.0);
            let mut y = vec![0.0; n * g.out_len()];
            let mut am = vec![0u32; n * g.out_len()];
            maxpool_fwd(&g, n, &x, &mut y, &mut am);
            let mut dx = vec![7.0; n * g.in_len()];
            maxpool_grad_x(&g, n, &r, &am, &mut dx, false);
            let pre = rand_vec(&mut rng, n * g.in_len(), -1.0, 1.0);
            let mut dacc = pre.clone();
            maxpool_grad_x(&g, n, &r, &am, &mut dacc, true);
            let fd = fd_grad(&x, |x| {
                let mut y = vec![0.0; n * g.out_len()];
                let mut am = vec![0u32; n * g.out_len()];
                maxpool_fwd(&g, n, x, &mut y, &mut am);
                dotf(&y, &r)
            });
            assert_close("maxpool dx", &dx, &fd, FD_TOL, FD_FLOOR);
            assert_close("maxpool dx acc", &sub(&dacc, &pre), &fd, FD_TOL, FD_FLOOR);
            // f32: max selection is exact, so outputs and gradients are bit-identical.
            let mut y32 = vec![0.0f32; n * g.out_len()];
            let mut am32 = vec![0u32; n * g.out_len()];
            maxpool_fwd(&g, n, &to_f32(&x), &mut y32, &mut am32);
            assert_eq!(widen(&y32), y);
            assert_eq!(am32, am);
            // The backward only routes values (sums where windows overlap: ≤ 9 terms, a few ulps).
            let mut dx32 = vec![0.0f32; n * g.in_len()];
            maxpool_grad_x(&g, n, &to_f32(&r), &am32, &mut dx32, false);
            assert_close("maxpool grad f32", &widen(&dx32), &dx, 1e-6, 1e-2);
        }
    }

    #[test]
    fn maxpool_first_max_wins() {
        let g = PoolGeom::new(1, 2, 4, 2, 2, 2, 2).unwrap();
        let x = [1.0f32, 3.0, 5.0, 5.0, 3.0, 2.0, 5.0, 4.0];
        let (mut y, mut am) = ([0.0f32; 2], [0u32; 2]);
        maxpool_fwd(&g, 1, &x, &mut y, &mut am);
        assert_eq!(y, [3.0, 5.0]);
        assert_eq!(am, [1, 2]);
    }

    #[test]
    fn avgpool_fd_accumulate_f32() {
        let mut rng = Rng::new(41);
        for (g, n) in geoms() {
            let x = rand_vec(&mut rng, n * g.in_len(), -1.0, 1.0);
            let r = rand_vec(&mut rng, n * g.out_len(), -1.0, 1.0);
            let mut dx = vec![7.0; n * g.in_len()];
            avgpool_grad_x(&g, n, &r, &mut dx, false);
            let pre = rand_vec(&mut rng, n * g.in_len(), -1.0, 1.0);
            let mut dacc = pre.clone();
            avgpool_grad_x(&g, n, &r, &mut dacc, true);
            let fd = fd_grad(&x, |x| {
                let mut y = vec![0.0; n * g.out_len()];
                avgpool_fwd(&g, n, x, &mut y);
                dotf(&y, &r)
            });
            assert_close("avgpool dx", &dx, &fd, FD_TOL, FD_FLOOR);
            assert_close("avgpool dx acc", &sub(&dacc, &pre), &fd, FD_TOL, FD_FLOOR);
            // f32: ≤ 9-term sums of O(1) values then a division: ≤ ~10 ulps of the largest term;
            // 1e-5 relative with a 1e-2 floor covers cancellation in near-zero averages.
            let mut y = vec![0.0; n * g.out_len()];
            avgpool_fwd(&g, n, &x, &mut y);
            let mut y32 = vec![0.0f32; n * g.out_len()];
            avgpool_fwd(&g, n, &to_f32(&x), &mut y32);
            assert_close("avgpool f32", &widen(&y32), &y, 1e-5, 1e-2);
            let mut dx32 = vec![0.0f32; n * g.in_len()];
            avgpool_grad_x(&g, n, &to_f32(&r), &mut dx32, false);
            assert_close("avgpool grad f32", &widen(&dx32), &dx, 1e-5, 1e-2);
        }
        // Exact: 2×2 mean.
        let g = PoolGeom::new(1, 2, 2, 2, 2, 1, 1).unwrap();
        let mut y = [0.0f32];
        avgpool_fwd(&g, 1, &[1.0, 2.0, 3.0, 6.0], &mut y);
        assert_eq!(y, [3.0]);
    }

    #[test]
    fn global_avgpool_fd_accumulate_f32() {
        let mut rng = Rng::new(42);
        let (n, c, hw) = (3, 4, 13);
        let x = rand_vec(&mut rng, n * c * hw, -1.0, 1.0);
        let r = rand_vec(&mut rng, n * c, -1.0, 1.0);
        let mut dx = vec![0.0; n * c * hw];
        global_avgpool_grad_x(n, c, hw, &r, &mut dx, false);
        let pre = rand_vec(&mut rng, n * c * hw, -1.0, 1.0);
        let mut dacc = pre.clone();
        global_avgpool_grad_x(n, c, hw, &r, &mut dacc, true);
        let fd = fd_grad(&x, |x| {
            let mut y = vec![0.0; n * c];
            global_avgpool_fwd(n, c, hw, x, &mut y);
            dotf(&y, &r)
        });
        assert_close("gap dx", &dx, &fd, FD_TOL, FD_FLOOR);
        assert_close("gap dx acc", &sub(&dacc, &pre), &fd, FD_TOL, FD_FLOOR);
        let mut y = vec![0.0; n * c];
        global_avgpool_fwd(n, c, hw, &x, &mut y);
        let mut y32 = vec![0.0f32; n * c];
        global_avgpool_fwd(n, c, hw, &to_f32(&x), &mut y32);
        // 13-term sums: as for avgpool.
        assert_close("gap f32", &widen(&y32), &y, 1e-5, 1e-2);
        // dx = dy/hw: one rounding.
        let mut dx32 = vec![0.0f32; n * c * hw];
        global_avgpool_grad_x(n, c, hw, &to_f32(&r), &mut dx32, false);
        assert_close("gap grad f32", &widen(&dx32), &dx, 1e-7, 1e-3);
        let mut y1 = [0.0f64];
        global_avgpool_fwd(1, 1, 4, &[1.0, 2.0, 3.0, 6.0], &mut y1);
        assert_eq!(y1, [3.0]);
    }
}
