//! int8 layer ops over slices: i8 in, i32 accumulation in tiles, i8 out with a power-of-two exponent.
//! Exponents are the caller's (the executor's); ops that rescale return the shift they used.
use core::convert::Infallible;

use super::{align, conv_dims, pool_k, produce, sat8, tile_rows, Pass, Site};
use crate::kernels::int8::{self as k8, igemm, MatRef, Rounding};
use crate::ops::{ConvGeom, PoolGeom};

/// Where a layer's input comes from: an int8 tensor, or the host's f32 batch quantised on the fly.
pub enum XSrc<'a> {
    /// Already int8.
    I8(&'a [i8]),
    /// f32 values quantised with exponent `e` into `buf` (one sample, or the whole micro-batch).
    F32 {
        /// The values.
        x: &'a [f32],
        /// Exponent.
        e: i32,
        /// Room for the quantised copy.
        buf: &'a mut [i8],
    },
}

impl XSrc<'_> {
    /// Samples `[s, s + count)` of `per` elements as int8.
    pub fn rows(&mut self, s: usize, count: usize, per: usize) -> &[i8] {
        match self {
            XSrc::I8(x) => &x[s * per..(s + count) * per],
            XSrc::F32 { x, e, buf } => {
                let b = &mut buf[..count * per];
                super::quantize(&x[s * per..(s + count) * per], *e, b);
                b
            }
        }
    }
}

fn ok<T>(r: Result<T, Infallible>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => match e {},
    }
}

/// Writes a bias as i32 at accumulator exponent `e_acc` into `out` (saturating).
pub fn bias_f32_to_acc(b: &[f32], e_acc: i32, out: &mut [i32]) {
    let k = super::pow2(-e_acc);
    for (o, &v) in out.iter_mut().zip(b) {
        *o = libm::roundf(v * k).clamp(-2.0e9, 2.0e9) as i32;
    }
}

/// Writes an int8 bias with exponent `e_b` as i32 at accumulator exponent `e_acc`.
pub fn bias_i8_to_acc(b: &[i8], e_b: i32, e_acc: i32, out: &mut [i32]) {
    for (o, &v) in out.iter_mut().zip(b) {
        *o = align(v as i32, e_b, e_acc);
    }
}

/// Rescales a whole i32 buffer exactly (one max pass), round to nearest; returns the shift.
pub fn rescale_exact(acc: &[i32], dst: &mut [i8]) -> u32 {
    let s = k8::shift_for(k8::max_abs_i32(acc));
    k8::rescale_i32_to_i8(acc, s, Rounding::Nearest, 0, dst);
    s
}

/// Linear forward `y[n×fout] = x·Wᵀ (+ b)` in row tiles; `bias` is already at `x`'s exponent + `w`'s.
#[allow(clippy::too_many_arguments)]
pub fn linear_fwd(
    n: usize,
    fin: usize,
    fout: usize,
    x: &[i8],
    w: &[i8],
    bias: Option<&[i32]>,
    y: &mut [i8],
    acc: &mut [i32],
    gs: &mut [i8],
    site: &mut Site,
    pass: Pass,
) -> u32 {
    let r = tile_rows(n, fout);
    ok(produce(
        site,
        pass,
        n.div_ceil(r),
        acc,
        y,
        Rounding::Nearest,
        |t, acc, _| {
            let r0 = t * r;
            let rows = r.min(n - r0);
            let c = &mut acc[..rows * fout];
            igemm(
                rows,
                fout,
                fin,
                MatRef {
                    data: &x[r0 * fin..(r0 + rows) * fin],
                    rs: fin,
                    cs: 1,
                },
                MatRef {
                    data: w,
                    rs: 1,
                    cs: fin,
                },
                c,
                fout,
                false,
                gs,
            );
            if let Some(b) = bias {
                for row in c.chunks_exact_mut(fout) {
                    for (v, &bb) in row.iter_mut().zip(b) {
                        *v = v.saturating_add(bb);
                    }
                }
            }
            Ok((r0 * fout, rows * fout))
        },
    ))
}

/// Linear derivative `dx[n×fin] = dy·W` in row tiles; with `old = Some((e_old, e_acc))` the previous
/// contents of `dx` (exponent `e_old`) are added at the accumulator exponent `e_acc` (pass an exact pass).
#[allow(clippy::too_many_arguments)]
pub fn linear_grad_x(
    n: usize,
    fin: usize,
    fout: usize,
    dy: &[i8],
    w: &[i8],
    dx: &mut [i8],
    old: Option<(i32, i32)>,
    acc: &mut [i32],
    gs: &mut [i8],
    site: &mut Site,
    pass: Pass,
) -> u32 {
    let r = tile_rows(n, fin);
    ok(produce(
        site,
        pass,
        n.div_ceil(r),
        acc,
        dx,
        Rounding::Nearest,
        |t, acc, prev| {
            let r0 = t * r;
            let rows = r.min(n - r0);
            let c = &mut acc[..rows * fin];
            igemm(
                rows,
                fin,
                fout,
                MatRef {
                    data: &dy[r0 * fout..(r0 + rows) * fout],
                    rs: fout,
                    cs: 1,
                },
                MatRef {
                    data: w,
                    rs: fin,
                    cs: 1,
                },
                c,
                fin,
                false,
                gs,
            );
            if let Some((e_old, e_acc)) = old {
                for (v, &p) in c.iter_mut().zip(&prev[r0 * fin..(r0 + rows) * fin]) {
                    *v = v.saturating_add(align(p as i32, e_old, e_acc));
                }
            }
            Ok((r0 * fin, rows * fin))
        },
    ))
}

/// Linear weight gradient in i32: `dw[fout×fin] = dyᵀ·x`, `db = Σ dy`.
#[allow(clippy::too_many_arguments)]
pub fn linear_grad_w(
    n: usize,
    fin: usize,
    fout: usize,
    x: &[i8],
    dy: &[i8],
    dw: &mut [i32],
    db: Option<&mut [i32]>,
    gs: &mut [i8],
) {
    igemm(
        fout,
        fin,
        n,
        MatRef {
            data: &dy[..n * fout],
            rs: 1,
            cs: fout,
        },
        MatRef {
            data: &x[..n * fin],
            rs: fin,
            cs: 1,
        },
        dw,
        fin,
        false,
        gs,
    );
    if let Some(db) = db {
        db.fill(0);
        for row in dy[..n * fout].chunks_exact(fout) {
            for (b, &v) in db.iter_mut().zip(row) {
                *b += v as i32;
            }
        }
    }
}

/// Output columns `[lo, hi)` whose input column `ox·sw + kj − pw` lies inside the image.
fn ox_range(g: &ConvGeom, kj: usize) -> (usize, usize) {
    let lo = g.pw.saturating_sub(kj).div_ceil(g.sw);
    let hi = if g.w + g.pw > kj {
        ((g.w - 1 + g.pw - kj) / g.sw + 1).min(g.ow)
    } else {
        0
    };
    (lo.min(g.ow), hi.max(lo.min(g.ow)))
}

/// im2col of group `grp` of one int8 sample: `cols[kg × P]`, zero padding.
pub fn im2col(g: &ConvGeom, x: &[i8], grp: usize, cols: &mut [i8]) {
    let (cin_g, _, _, p) = conv_dims(g);
    for cl in 0..cin_g {
        let c = grp * cin_g + cl;
        let xc = &x[c * g.h * g.w..(c + 1) * g.h * g.w];
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let row = (cl * g.kh + ki) * g.kw + kj;
                let dst = &mut cols[row * p..(row + 1) * p];
                for oy in 0..g.oh {
                    let iy = (oy * g.sh + ki) as isize - g.ph as isize;
                    let d = &mut dst[oy * g.ow..(oy + 1) * g.ow];
                    if iy < 0 || iy >= g.h as isize {
                        d.fill(0);
                        continue;
                    }
                    let src = &xc[iy as usize * g.w..(iy as usize + 1) * g.w];
                    let (lo, hi) = ox_range(g, kj);
                    d[..lo].fill(0);
                    d[hi..].fill(0);
                    if lo < hi {
                        let ix0 = lo * g.sw + kj - g.pw;
                        if g.sw == 1 {
                            d[lo..hi].copy_from_slice(&src[ix0..ix0 + (hi - lo)]);
                        } else {
                            for (v, &x) in d[lo..hi].iter_mut().zip(src[ix0..].iter().step_by(g.sw))
                            {
                                *v = x;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Adds group `grp`'s column gradient `dcols[kg × P]` back into one sample's `dx[cin×h×w]` (i32).
pub fn col2im_add(g: &ConvGeom, dcols: &[i32], grp: usize, dx: &mut [i32]) {
    let (cin_g, _, _, p) = conv_dims(g);
    for cl in 0..cin_g {
        let c = grp * cin_g + cl;
        let dc = &mut dx[c * g.h * g.w..(c + 1) * g.h * g.w];
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let row = (cl * g.kh + ki) * g.kw + kj;
                let src = &dcols[row * p..(row + 1) * p];
                for oy in 0..g.oh {
                    let iy = (oy * g.sh + ki) as isize - g.ph as isize;
                    if iy < 0 || iy >= g.h as isize {
                        continue;
                    }
                    let d = &mut dc[iy as usize * g.w..(iy as usize + 1) * g.w];
                    let (lo, hi) = ox_range(g, kj);
                    if lo < hi {
                        let ix0 = lo * g.sw + kj - g.pw;
                        let s = &src[oy * g.ow + lo..oy * g.ow + hi];
                        for (dv, &v) in d[ix0..].iter_mut().step_by(g.sw).zip(s) {
                            *dv += v;
                        }
                    }
                }
            }
        }
    }
}

/// Convolution forward, one sample per tile: `acc` holds `cout × P` i32, `cols` `kg × P` i8.
#[allow(clippy::too_many_arguments)]
pub fn conv_fwd(
    g: &ConvGeom,
    n: usize,
    x: &mut XSrc<'_>,
    w: &[i8],
    bias: Option<&[i32]>,
    y: &mut [i8],
    acc: &mut [i32],
    cols: &mut [i8],
    gs: &mut [i8],
    site: &mut Site,
    pass: Pass,
) -> u32 {
    let (_, cout_g, kg, p) = conv_dims(g);
    let per_in = g.cin * g.h * g.w;
    let per_out = g.cout * p;
    ok(produce(
        site,
        pass,
        n,
        acc,
        y,
        Rounding::Nearest,
        |s, acc, _| {
            let xs = x.rows(s, 1, per_in);
            for grp in 0..g.groups {
                im2col(g, xs, grp, cols);
                igemm(
                    cout_g,
                    p,
                    kg,
                    MatRef {
                        data: &w[grp * cout_g * kg..(grp + 1) * cout_g * kg],
                        rs: kg,
                        cs: 1,
                    },
                    MatRef {
                        data: &cols[..kg * p],
                        rs: p,
                        cs: 1,
                    },
                    &mut acc[grp * cout_g * p..(grp + 1) * cout_g * p],
                    p,
                    false,
                    gs,
                );
            }
            if let Some(b) = bias {
                for (row, &bb) in acc[..per_out].chunks_exact_mut(p).zip(b) {
                    for v in row {
                        *v = v.saturating_add(bb);
                    }
                }
            }
            Ok((s * per_out, per_out))
        },
    ))
}

/// Convolution derivative, one sample per tile: `dcols` holds `kg × P` i32, `acc` `cin×h×w` i32.
#[allow(clippy::too_many_arguments)]
pub fn conv_grad_x(
    g: &ConvGeom,
    n: usize,
    dy: &[i8],
    w: &[i8],
    dx: &mut [i8],
    old: Option<(i32, i32)>,
    dcols: &mut [i32],
    acc: &mut [i32],
    gs: &mut [i8],
    site: &mut Site,
    pass: Pass,
) -> u32 {
    let (_, cout_g, kg, p) = conv_dims(g);
    let per_in = g.cin * g.h * g.w;
    let per_out = g.cout * p;
    ok(produce(
        site,
        pass,
        n,
        acc,
        dx,
        Rounding::Nearest,
        |s, acc, prev| {
            let a = &mut acc[..per_in];
            a.fill(0);
            for grp in 0..g.groups {
                let off = s * per_out + grp * cout_g * p;
                igemm(
                    kg,
                    p,
                    cout_g,
                    MatRef {
                        data: &w[grp * cout_g * kg..(grp + 1) * cout_g * kg],
                        rs: 1,
                        cs: kg,
                    },
                    MatRef {
                        data: &dy[off..off + cout_g * p],
                        rs: p,
                        cs: 1,
                    },
                    &mut dcols[..kg * p],
                    p,
                    false,
                    gs,
                );
                col2im_add(g, dcols, grp, a);
            }
            if let Some((e_old, e_acc)) = old {
                for (v, &q) in a.iter_mut().zip(&prev[s * per_in..(s + 1) * per_in]) {
                    *v = v.saturating_add(align(q as i32, e_old, e_acc));
                }
            }
            Ok((s * per_in, per_in))
        },
    ))
}

/// Convolution weight gradient in i32 over `n` samples (`dy` from its first; `x` from sample `first`):
/// `dw[cout × kg]`, `db[cout]`.
#[allow(clippy::too_many_arguments)]
pub fn conv_grad_w(
    g: &ConvGeom,
    n: usize,
    first: usize,
    x: &mut XSrc<'_>,
    dy: &[i8],
    dw: &mut [i32],
    mut db: Option<&mut [i32]>,
    cols: &mut [i8],
    gs: &mut [i8],
) {
    let (_, cout_g, kg, p) = conv_dims(g);
    let per_in = g.cin * g.h * g.w;
    let per_out = g.cout * p;
    if let Some(db) = db.as_deref_mut() {
        db.fill(0);
    }
    for s in 0..n {
        let xs = x.rows(first + s, 1, per_in);
        for grp in 0..g.groups {
            im2col(g, xs, grp, cols);
            let off = s * per_out + grp * cout_g * p;
            igemm(
                cout_g,
                kg,
                p,
                MatRef {
                    data: &dy[off..off + cout_g * p],
                    rs: p,
                    cs: 1,
                },
                MatRef {
                    data: &cols[..kg * p],
                    rs: 1,
                    cs: p,
                },
                &mut dw[grp * cout_g * kg..(grp + 1) * cout_g * kg],
                kg,
                s > 0,
                gs,
            );
        }
        if let Some(db) = db.as_deref_mut() {
            for (b, row) in db
                .iter_mut()
                .zip(dy[s * per_out..(s + 1) * per_out].chunks_exact(p))
            {
                *b += row.iter().map(|&v| v as i32).sum::<i32>();
            }
        }
    }
}

/// Prepares a derivative for writing: without accumulation it is zeroed and takes `e_new`; with it, its
/// contents move to `max(e_old, e_new)` (rounding shift). Returns the exponent to add at.
pub fn prepare_acc(dst: &mut [i8], e_old: i32, e_new: i32, acc: bool) -> i32 {
    if !acc {
        dst.fill(0);
        return e_new;
    }
    let e = e_old.max(e_new);
    if e > e_old {
        for v in dst.iter_mut() {
            *v = sat8(align(*v as i32, e_old, e));
        }
    }
    e
}

/// Max pooling forward: same exponent; the window index of each maximum (first on ties) goes to `idx`.
pub fn maxpool_fwd(g: &PoolGeom, n: usize, x: &[i8], y: &mut [i8], idx: &mut [u8]) {
    let (pin, pout) = (g.h * g.w, g.oh * g.ow);
    for sc in 0..n * g.c {
        let xs = &x[sc * pin..(sc + 1) * pin];
        for oy in 0..g.oh {
            for ox in 0..g.ow {
                let (mut best, mut bi) = (i8::MIN, 0u8);
                for ki in 0..g.kh {
                    for kj in 0..g.kw {
                        let v = xs[(oy * g.sh + ki) * g.w + ox * g.sw + kj];
                        if v > best {
                            best = v;
                            bi = (ki * g.kw + kj) as u8;
                        }
                    }
                }
                let o = sc * pout + oy * g.ow + ox;
                y[o] = best;
                idx[o] = bi;
            }
        }
    }
}

/// Max pooling derivative: `dx[argmax] += dy` moved from `e_dy` to `e_dx` (saturating).
pub fn maxpool_grad_x(
    g: &PoolGeom,
    n: usize,
    dy: &[i8],
    idx: &[u8],
    dx: &mut [i8],
    e_dy: i32,
    e_dx: i32,
) {
    let (pin, pout) = (g.h * g.w, g.oh * g.ow);
    for sc in 0..n * g.c {
        for oy in 0..g.oh {
            for ox in 0..g.ow {
                let o = sc * pout + oy * g.ow + ox;
                let k = idx[o] as usize;
                let (ki, kj) = (k / g.kw, k % g.kw);
                let i = sc * pin + (oy * g.sh + ki) * g.w + ox * g.sw + kj;
                dx[i] = sat8(dx[i] as i32 + align(dy[o] as i32, e_dy, e_dx));
            }
        }
    }
}

/// `round(sum / k)`: a rounding shift for powers of two, else `(|sum|·round(2^16/k) + 2^15) >> 16`.
pub fn div_round(sum: i32, k: usize) -> i32 {
    let k = k.max(1);
    if k.is_power_of_two() {
        return align(sum, 0, -(k.trailing_zeros() as i32));
    }
    let m = ((1u64 << 16) + k as u64 / 2) / k as u64;
    let r = ((sum.unsigned_abs() as u64 * m + (1 << 15)) >> 16) as i32;
    if sum < 0 {
        -r
    } else {
        r
    }
}

/// `floor(log2 k)`: the exponent drop of an average's derivative.
pub fn avg_grad_shift(k: usize) -> i32 {
    (usize::BITS - 1 - k.max(1).leading_zeros()) as i32
}

/// `dy · 2^c / k` rounded (`c = floor(log2 k)`): the average's derivative at exponent `e_dy − c`.
pub fn avg_grad_value(dy: i8, k: usize) -> i32 {
    div_round((dy as i32) << avg_grad_shift(k), k)
}

/// Average pooling forward (same exponent).
pub fn avgpool_fwd(g: &PoolGeom, n: usize, x: &[i8], y: &mut [i8]) {
    let (pin, pout, k) = (g.h * g.w, g.oh * g.ow, pool_k(g));
    for sc in 0..n * g.c {
        let xs = &x[sc * pin..(sc + 1) * pin];
        for oy in 0..g.oh {
            for ox in 0..g.ow {
                let mut s = 0i32;
                for ki in 0..g.kh {
                    for kj in 0..g.kw {
                        s += xs[(oy * g.sh + ki) * g.w + ox * g.sw + kj] as i32;
                    }
                }
                y[sc * pout + oy * g.ow + ox] = sat8(div_round(s, k));
            }
        }
    }
}

/// Average pooling derivative: adds `avg_grad_value(dy)` (exponent `e_dy − c`) at `e_dx`.
pub fn avgpool_grad_x(g: &PoolGeom, n: usize, dy: &[i8], dx: &mut [i8], e_dy: i32, e_dx: i32) {
    let (pin, pout, k) = (g.h * g.w, g.oh * g.ow, pool_k(g));
    let e_v = e_dy - avg_grad_shift(k);
    for sc in 0..n * g.c {
        for oy in 0..g.oh {
            for ox in 0..g.ow {
                let v = align(avg_grad_value(dy[sc * pout + oy * g.ow + ox], k), e_v, e_dx);
                for ki in 0..g.kh {
                    for kj in 0..g.kw {
                        let i = sc * pin + (oy * g.sh + ki) * g.w + ox * g.sw + kj;
                        dx[i] = sat8(dx[i] as i32 + v);
                    }
                }
            }
        }
    }
}

/// Global average pooling forward (same exponent).
pub fn global_avgpool_fwd(n: usize, c: usize, hw: usize, x: &[i8], y: &mut [i8]) {
    for (o, xs) in y[..n * c].iter_mut().zip(x.chunks_exact(hw)) {
        *o = sat8(div_round(xs.iter().map(|&v| v as i32).sum(), hw));
    }
}

/// Global average pooling derivative (see [`avgpool_grad_x`]).
pub fn global_avgpool_grad_x(
    n: usize,
    c: usize,
    hw: usize,
    dy: &[i8],
    dx: &mut [i8],
    e_dy: i32,
    e_dx: i32,
) {
    let e_v = e_dy - avg_grad_shift(hw);
    for (&d, xs) in dy[..n * c].iter().zip(dx.chunks_exact_mut(hw)) {
        let v = align(avg_grad_value(d, hw), e_v, e_dx);
        for x in xs {
            *x = sat8(*x as i32 + v);
        }
    }
}

/// ReLU in place.
pub fn relu_inplace(x: &mut [i8]) {
    for v in x {
        *v = (*v).max(0);
    }
}

/// ReLU derivative in place: zero where the output is not positive.
pub fn relu_grad_inplace(y: &[i8], d: &mut [i8]) {
    for (d, &y) in d.iter_mut().zip(y) {
        if y <= 0 {
            *d = 0;
        }
    }
}

/// The exponent of `a + b` and the sum of element `i` at it (`a`, `b` aligned to the coarser exponent,
/// plus one bit when any sum would saturate).
pub fn add_exp(a: &[i8], ea: i32, b: &[i8], eb: i32) -> i32 {
    let e = ea.max(eb);
    let over = a
        .iter()
        .zip(b)
        .any(|(&x, &y)| (align(x as i32, ea, e) + align(y as i32, eb, e)).abs() > 127);
    e + over as i32
}

/// One element of `a + b` at exponent `e` (from [`add_exp`]).
pub fn add_at(x: i8, ea: i32, y: i8, eb: i32, e: i32) -> i8 {
    let m = ea.max(eb);
    sat8(align(align(x as i32, ea, m) + align(y as i32, eb, m), m, e))
}

/// Eq. 4 sum of two int8 values at exponents `ea`, `eb` brought to the larger one: (sum, saturates).
pub fn eq4_sum(a: i8, ea: i32, b: i8, eb: i32) -> (i32, bool) {
    let e = ea.max(eb);
    let v = align(a as i32, ea, e) + align(b as i32, eb, e);
    (v, v.abs() > 127)
}

/// One element of the Eq. 4 combination at output exponent `e` (`max(ea, eb)`, or one more when some
/// sum saturates).
pub fn eq4_at(a: i8, ea: i32, b: i8, eb: i32, e: i32) -> i8 {
    let (v, _) = eq4_sum(a, ea, b, eb);
    sat8(align(v, ea.max(eb), e))
}
