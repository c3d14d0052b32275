//! int8 layer ops over slices: i8 in, i32 accumulation in tiles, i8 out with a power-of-two exponent.
//! Exponents are the caller's (the executor's); ops that rescale return the shift they used.
use core::convert::Infallible;

use super::flat::{self, Flat, MASKS};
use super::{align, conv_dims, pool_k, produce, sat8, tile_rows, Pass, Site, TileOut};
use crate::kernels::int8::{self as k8, igemm, igemm_dot, MatRef, Rounding};
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
    let dot = k8::has_simd_pairs(k8::IgemmKernel::selected());
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
            let xr = &x[r0 * fin..(r0 + rows) * fin];
            if dot {
                // x·Wᵀ reads both along `fin`: no packing.
                igemm_dot(rows, fout, 1, fin, xr, fin, 0, w, fin, 0, c, fout, false);
            } else {
                igemm(
                    rows,
                    fout,
                    fin,
                    MatRef {
                        data: xr,
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
            }
            if let Some(b) = bias {
                for row in c.chunks_exact_mut(fout) {
                    for (v, &bb) in row.iter_mut().zip(b) {
                        *v = v.saturating_add(bb);
                    }
                }
            }
            Ok(TileOut::flat(r0 * fout, rows * fout))
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
            Ok(TileOut::flat(r0 * fin, rows * fin))
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
    linear_grad_w_rows(n, fin, fout, 0, fout, x, dy, dw, gs);
    if let Some(db) = db {
        linear_grad_b(n, fout, dy, db);
    }
}

/// Rows `r0..r0 + rows` of the Linear weight gradient in i32, `dw[rows×fin] = dy[:, r0..r0+rows]ᵀ·x`:
/// one tile of [`linear_grad_w`]'s `dw` (the same values, exactly).
#[allow(clippy::too_many_arguments)]
pub fn linear_grad_w_rows(
    n: usize,
    fin: usize,
    fout: usize,
    r0: usize,
    rows: usize,
    x: &[i8],
    dy: &[i8],
    dw: &mut [i32],
    gs: &mut [i8],
) {
    igemm(
        rows,
        fin,
        n,
        MatRef {
            data: &dy[r0..n * fout],
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
}

/// Linear bias gradient in i32: `db = Σ dy` over the `n` rows.
pub fn linear_grad_b(n: usize, fout: usize, dy: &[i8], db: &mut [i32]) {
    db[..fout].fill(0);
    for row in dy[..n * fout].chunks_exact(fout) {
        for (b, &v) in db.iter_mut().zip(row) {
            *b += v as i32;
        }
    }
}

/// Output positions `o ∈ [lo, hi)` whose input coordinate `o·s + k − p` lies in `[0, len)` (kernel tap
/// `k`, padding `p`, stride `s`, `out` outputs); `lo ≤ hi`.
#[inline(always)]
fn valid_out(k: usize, p: usize, s: usize, len: usize, out: usize) -> (usize, usize) {
    if s == 1 {
        let lo = p.saturating_sub(k);
        let hi = (len + p).saturating_sub(k).min(out);
        return (lo.min(hi), hi);
    }
    let lo = if k >= p { 0 } else { (p - k).div_ceil(s) };
    let hi = if len + p > k {
        ((len + p - k - 1) / s + 1).min(out)
    } else {
        0
    };
    (lo.min(hi), hi)
}

/// `dst.copy_from_slice(src)` for the short rows of im2col (a few bytes): at most two fixed-size,
/// possibly overlapping moves that compile inline (no loop for LLVM to turn back into a `memcpy` call);
/// rows longer than 64 bytes use `copy_from_slice`.
#[inline(always)]
pub(super) fn copy_small(dst: &mut [i8], src: &[i8]) {
    let len = dst.len();
    let src = &src[..len];
    macro_rules! two {
        ($b:expr) => {{
            const B: usize = $b;
            let (a, z): ([i8; B], [i8; B]) = (
                src[..B].try_into().expect("B bytes"),
                src[len - B..].try_into().expect("B bytes"),
            );
            dst[..B].copy_from_slice(&a);
            dst[len - B..].copy_from_slice(&z);
        }};
    }
    match len {
        0 => {}
        1 => dst[0] = src[0],
        2..=3 => two!(2),
        4..=7 => two!(4),
        8..=16 => two!(8),
        17..=32 => two!(16),
        33..=64 => two!(32),
        _ => dst.copy_from_slice(src),
    }
}

/// Zeroes a slice that is usually one or two elements long (the clipped columns of a padded
/// convolution) without a `memset` call for those.
#[inline(always)]
fn zero_small<T: Copy + Default>(x: &mut [T]) {
    match x.len() {
        0 => {}
        1 => x[0] = T::default(),
        2 => {
            x[0] = T::default();
            x[1] = T::default();
        }
        _ => x.fill(T::default()),
    }
}

/// One kernel tap's rows of im2col: for every valid output row `oy` (input row `oy·sh + ki − ph` inside
/// the image), the valid output columns `[lo, lo + len)` start at input column `ix0`.
#[derive(Clone, Copy)]
struct Tap {
    oy: (usize, usize),
    lo: usize,
    len: usize,
    ix0: usize,
}

#[inline(always)]
fn tap(g: &ConvGeom, ki: usize, kj: usize) -> Option<Tap> {
    let oy = valid_out(ki, g.ph, g.sh, g.h, g.oh);
    let (lo, hi) = valid_out(kj, g.pw, g.sw, g.w, g.ow);
    (oy.0 < oy.1 && lo < hi).then(|| Tap {
        oy,
        lo,
        len: hi - lo,
        ix0: lo * g.sw + kj - g.pw,
    })
}

/// im2col of group `grp` of `samples` consecutive int8 samples `x`: `cols[kg × ld]` (row stride `ld ≥
/// samples·P`), sample `s` in columns `[s·P, (s+1)·P)`, zero padding.
pub fn im2col(g: &ConvGeom, x: &[i8], samples: usize, grp: usize, cols: &mut [i8], ld: usize) {
    #[cfg(any(test, feature = "std"))]
    if k8::offload::im2col(
        [
            g.cin, g.h, g.w, g.cout, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.groups, g.oh, g.ow,
        ],
        x,
        samples,
        grp,
        cols,
        ld,
    ) {
        return;
    }
    let (cin_g, _, kg, p) = conv_dims(g);
    let (hw, per_in) = (g.h * g.w, g.cin * g.h * g.w);
    let span = samples * p;
    let flat = g.sw == 1 && g.sh == 1 && g.w == g.ow;
    if span == ld {
        cols[..kg * ld].fill(0);
    } else {
        for row in cols[..kg * ld].chunks_exact_mut(ld) {
            row[..span].fill(0);
        }
    }
    for cl in 0..cin_g {
        let c = grp * cin_g + cl;
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let Some(t) = tap(g, ki, kj) else { continue };
                let row = (cl * g.kh + ki) * g.kw + kj;
                let dst_row = &mut cols[row * ld..row * ld + span];
                for (s, dst) in dst_row.chunks_exact_mut(p).enumerate() {
                    let xc = &x[s * per_in + c * hw..s * per_in + (c + 1) * hw];
                    if flat {
                        // Same row stride in and out: the tap's rows are one contiguous copy, whose
                        // bytes between the valid segments (the clipped columns) are zeroed again.
                        let (oy0, oy1) = t.oy;
                        let l = (oy1 - oy0 - 1) * g.ow + t.len;
                        let d0 = oy0 * g.ow + t.lo;
                        let s0 = (oy0 + ki - g.ph) * g.w + t.ix0;
                        copy_small(&mut dst[d0..d0 + l], &xc[s0..]);
                        for oy in oy0..oy1 - 1 {
                            zero_small(&mut dst[oy * g.ow + t.lo + t.len..(oy + 1) * g.ow + t.lo]);
                        }
                        continue;
                    }
                    for oy in t.oy.0..t.oy.1 {
                        let iy = oy * g.sh + ki - g.ph;
                        let d = &mut dst[oy * g.ow + t.lo..oy * g.ow + t.lo + t.len];
                        let src = &xc[iy * g.w + t.ix0..];
                        if g.sw == 1 {
                            copy_small(d, src);
                        } else {
                            for (v, &x) in d.iter_mut().zip(src.iter().step_by(g.sw)) {
                                *v = x;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Adds group `grp`'s column gradient `dcols[kg × ld]` of `samples` samples (sample `s` in columns
/// `[s·P, (s+1)·P)`) back into their `dx[samples][cin×h×w]` (i32).
pub fn col2im_add(
    g: &ConvGeom,
    dcols: &[i32],
    ld: usize,
    samples: usize,
    grp: usize,
    dx: &mut [i32],
) {
    let (cin_g, _, _, p) = conv_dims(g);
    let (hw, per_in) = (g.h * g.w, g.cin * g.h * g.w);
    let flat = g.sw == 1 && g.sh == 1 && g.w == g.ow;
    for cl in 0..cin_g {
        let c = grp * cin_g + cl;
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let Some(t) = tap(g, ki, kj) else { continue };
                let row = (cl * g.kh + ki) * g.kw + kj;
                let src_row = &dcols[row * ld..row * ld + samples * p];
                for (s, src) in src_row.chunks_exact(p).enumerate() {
                    let dc = &mut dx[s * per_in + c * hw..s * per_in + (c + 1) * hw];
                    if flat {
                        // Same row stride in and out: one contiguous add over the tap's rows, then the
                        // entries between the valid segments (clipped columns, which landed on the
                        // neighbouring row's edge) are taken out again. Wrapping: exact modulo 2^32,
                        // and the true sums fit i32. (Subtracting after the vector add, rather than
                        // zeroing the source before it, avoids a store-forwarding stall.)
                        let (oy0, oy1) = t.oy;
                        let l = (oy1 - oy0 - 1) * g.ow + t.len;
                        let s0 = oy0 * g.ow + t.lo;
                        let d0 = (oy0 + ki - g.ph) * g.w + t.ix0;
                        let (dr, sr) = (&mut dc[d0..d0 + l], &src[s0..s0 + l]);
                        for (dv, &v) in dr.iter_mut().zip(sr) {
                            *dv = dv.wrapping_add(v);
                        }
                        for r in 0..oy1 - oy0 - 1 {
                            for e in r * g.ow + t.len..(r + 1) * g.ow {
                                dr[e] = dr[e].wrapping_sub(sr[e]);
                            }
                        }
                        continue;
                    }
                    for oy in t.oy.0..t.oy.1 {
                        let iy = oy * g.sh + ki - g.ph;
                        let sv = &src[oy * g.ow + t.lo..oy * g.ow + t.lo + t.len];
                        let d = &mut dc[iy * g.w + t.ix0..];
                        if g.sw == 1 {
                            for (dv, &v) in d[..t.len].iter_mut().zip(sv) {
                                *dv += v;
                            }
                        } else {
                            for (dv, &v) in d.iter_mut().step_by(g.sw).zip(sv) {
                                *dv += v;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Copies group `grp` of `samples` samples of `dy` (`[samples][cout][P]`) into `dyc[cout_g × ld]`
/// (sample `s` in columns `[s·P, (s+1)·P)`), the layout whose columns match [`im2col`]'s.
pub(super) fn gather_dy(
    g: &ConvGeom,
    dy: &[i8],
    samples: usize,
    grp: usize,
    dyc: &mut [i8],
    ld: usize,
) {
    let (_, cout_g, _, p) = conv_dims(g);
    let per_out = g.cout * p;
    for co in 0..cout_g {
        let row = &mut dyc[co * ld..co * ld + samples * p];
        for (s, d) in row.chunks_exact_mut(p).enumerate() {
            let o = s * per_out + (grp * cout_g + co) * p;
            copy_small(d, &dy[o..o + p]);
        }
    }
}

/// Convolution forward, `blk` samples per tile: `acc` holds `cout × blk·P` i32; `work` is the im2col
/// and GEMM scratch (`kg·blk·P` bytes of columns, then [`igemm`]'s packing). One GEMM per tile and group,
/// `W_g · cols`, whose rows (output channels) run over the tile's samples; the rescale writes them back
/// in `[sample][channel][P]` order. Flat geometries take the packing-free path of `quant::flat` when it
/// applies and `work` holds its words and columns (same integers either way).
#[allow(clippy::too_many_arguments)]
pub fn conv_fwd(
    g: &ConvGeom,
    n: usize,
    blk: usize,
    x: &mut XSrc<'_>,
    w: &[i8],
    bias: Option<&[i32]>,
    y: &mut [i8],
    acc: &mut [i32],
    work: &mut [i8],
    site: &mut Site,
    pass: Pass,
) -> u32 {
    let (_, cout_g, kg, p) = conv_dims(g);
    let per_in = g.cin * g.h * g.w;
    let per_out = g.cout * p;
    let blk = blk.clamp(1, n.max(1));
    let add_bias = |acc: &mut [i32], ld: usize| {
        if let Some(b) = bias {
            for (row, &bb) in acc[..g.cout * ld].chunks_exact_mut(ld).zip(b) {
                add_saturating(row, bb);
            }
        }
    };
    let out = |s0: usize, sc: usize| TileOut {
        off: s0 * per_out,
        len: sc * per_out,
        rows: g.cout,
        inner: p,
    };
    if let Some((fl, words, x2, buf)) = Flat::new(g).and_then(|fl| {
        let (words, rest) = words_and_bytes(work, g.cout * fl.kp())?;
        let (x2, buf) = rest.split_at_mut_checked(fl.x2_len(blk))?;
        (buf.len() >= fl.planes_len(blk)).then_some((fl, words, x2, buf))
    }) {
        fl.weight_words(w, words);
        fl.clear_planes(buf, blk);
        let mut masks = [0i8; MASKS];
        fl.masks(&mut masks);
        let kp = fl.kp();
        // A bias that no sum of 2·kp products (each at most 2^14) can push past i32 starts the
        // accumulators instead of a saturating pass after them: the same values.
        let reach = 2 * kp as i64 * (1 << 14);
        let fold = bias.filter(|b| {
            b.iter()
                .all(|&v| i64::from(v).abs() + reach <= i64::from(i32::MAX))
        });
        return ok(produce(
            site,
            pass,
            n.div_ceil(blk),
            acc,
            y,
            Rounding::Nearest,
            |t, acc, _| {
                let s0 = t * blk;
                let sc = blk.min(n - s0);
                let ld = sc * p;
                let xs = x.rows(s0, sc, per_in);
                if let Some(b) = fold {
                    for (row, &bb) in acc[..g.cout * ld].chunks_exact_mut(ld).zip(b) {
                        row.fill(bb);
                    }
                }
                for grp in 0..g.groups {
                    fl.fwd_group(
                        xs,
                        sc,
                        grp,
                        &words[grp * cout_g * kp..(grp + 1) * cout_g * kp],
                        &masks,
                        buf,
                        x2,
                        &mut acc[grp * cout_g * ld..(grp + 1) * cout_g * ld],
                        fold.is_some(),
                    );
                }
                if fold.is_none() {
                    add_bias(acc, ld);
                }
                Ok(out(s0, sc))
            },
        ));
    }
    let (cols, gs) = work.split_at_mut(kg * blk * p);
    ok(produce(
        site,
        pass,
        n.div_ceil(blk),
        acc,
        y,
        Rounding::Nearest,
        |t, acc, _| {
            let s0 = t * blk;
            let sc = blk.min(n - s0);
            let ld = sc * p;
            let xs = x.rows(s0, sc, per_in);
            for grp in 0..g.groups {
                im2col(g, xs, sc, grp, cols, ld);
                igemm(
                    cout_g,
                    ld,
                    kg,
                    MatRef {
                        data: &w[grp * cout_g * kg..(grp + 1) * cout_g * kg],
                        rs: kg,
                        cs: 1,
                    },
                    MatRef {
                        data: &cols[..kg * ld],
                        rs: ld,
                        cs: 1,
                    },
                    &mut acc[grp * cout_g * ld..(grp + 1) * cout_g * ld],
                    ld,
                    false,
                    gs,
                );
            }
            add_bias(acc, ld);
            Ok(out(s0, sc))
        },
    ))
}

/// `v = v.saturating_add(b)` for every element, written so that it vectorises: the wrapping sum
/// overflowed exactly when both operands have the sign the sum lacks, and then saturates toward the
/// sign of `v`.
pub(super) fn add_saturating(row: &mut [i32], b: i32) {
    for v in row {
        let s = v.wrapping_add(b);
        let over = ((*v ^ s) & (b ^ s)) < 0;
        *v = if over { (*v >> 31) ^ i32::MAX } else { s };
    }
}

/// Splits `work` into at least `words` aligned i32 and the bytes after them; `None` when too short.
fn words_and_bytes(work: &mut [i8], words: usize) -> Option<(&mut [i32], &mut [i8])> {
    let head = work.as_ptr().align_offset(4);
    let bytes = head.checked_add(words.checked_mul(4)?)?;
    if head > 3 || bytes > work.len() {
        return None;
    }
    let (wb, rest) = work.split_at_mut(bytes);
    let w: &mut [i32] = bytemuck::try_cast_slice_mut(&mut wb[head..]).ok()?;
    Some((w, rest))
}

/// Convolution derivative, `blk` samples per tile: `dcols` holds `kg × blk·P` i32, `acc`
/// `blk·cin·h·w` i32, `dyc` `cout_g × blk·P` i8. One GEMM `W_gᵀ · dY` per tile and group, then col2im
/// per sample. Flat geometries whose derivative is a flat convolution (`quant::flat::transposed`) run
/// it as the convolution of `dY` with the flipped kernel when `dcols` holds its words and columns; the
/// tile then comes out channel-major like the forward's.
#[allow(clippy::too_many_arguments)]
pub fn conv_grad_x(
    g: &ConvGeom,
    n: usize,
    blk: usize,
    dy: &[i8],
    w: &[i8],
    dx: &mut [i8],
    old: Option<(i32, i32)>,
    dcols: &mut [i32],
    acc: &mut [i32],
    dyc: &mut [i8],
    gs: &mut [i8],
    site: &mut Site,
    pass: Pass,
) -> u32 {
    let (cin_g, cout_g, kg, p) = conv_dims(g);
    let hw = g.h * g.w;
    let per_in = g.cin * hw;
    let per_out = g.cout * p;
    let blk = blk.clamp(1, n.max(1));
    let fast = flat::transposed(g)
        .and_then(|t| Some((t, Flat::new(g)?, Flat::new(&t)?)))
        .and_then(|(t, _, ft)| {
            let kp = ft.kp();
            let (words, rest) = dcols.split_at_mut_checked(g.cin * kp)?;
            let rest: &mut [i8] = bytemuck::cast_slice_mut(rest);
            let (x2, buf) = rest.split_at_mut_checked(ft.x2_len(blk))?;
            (buf.len() >= ft.planes_len(blk)).then_some((t, ft, words, x2, buf))
        });
    if let Some((t, ft, words, x2, buf)) = fast {
        ft.transposed_words(g, w, words);
        ft.clear_planes(buf, blk);
        let mut masks = [0i8; MASKS];
        ft.masks(&mut masks);
        let kp = ft.kp();
        return ok(produce(
            site,
            pass,
            n.div_ceil(blk),
            acc,
            dx,
            Rounding::Nearest,
            |tile, acc, prev| {
                let s0 = tile * blk;
                let sc = blk.min(n - s0);
                let ld = sc * hw;
                let dys = &dy[s0 * per_out..(s0 + sc) * per_out];
                for grp in 0..t.groups {
                    ft.fwd_group(
                        dys,
                        sc,
                        grp,
                        &words[grp * cin_g * kp..(grp + 1) * cin_g * kp],
                        &masks,
                        buf,
                        x2,
                        &mut acc[grp * cin_g * ld..(grp + 1) * cin_g * ld],
                        false,
                    );
                }
                if let Some((e_old, e_acc)) = old {
                    // acc is [channel][sample][hw]; the old values are [sample][channel][hw].
                    for (ci, row) in acc[..g.cin * ld].chunks_exact_mut(ld).enumerate() {
                        for (s, part) in row.chunks_exact_mut(hw).enumerate() {
                            let o = (s0 + s) * per_in + ci * hw;
                            for (v, &q) in part.iter_mut().zip(&prev[o..o + hw]) {
                                *v = v.saturating_add(align(q as i32, e_old, e_acc));
                            }
                        }
                    }
                }
                Ok(TileOut {
                    off: s0 * per_in,
                    len: sc * per_in,
                    rows: g.cin,
                    inner: hw,
                })
            },
        ));
    }
    ok(produce(
        site,
        pass,
        n.div_ceil(blk),
        acc,
        dx,
        Rounding::Nearest,
        |t, acc, prev| {
            let s0 = t * blk;
            let sc = blk.min(n - s0);
            let ld = sc * p;
            let a = &mut acc[..sc * per_in];
            a.fill(0);
            for grp in 0..g.groups {
                gather_dy(g, &dy[s0 * per_out..], sc, grp, dyc, ld);
                igemm(
                    kg,
                    ld,
                    cout_g,
                    MatRef {
                        data: &w[grp * cout_g * kg..(grp + 1) * cout_g * kg],
                        rs: 1,
                        cs: kg,
                    },
                    MatRef {
                        data: &dyc[..cout_g * ld],
                        rs: ld,
                        cs: 1,
                    },
                    &mut dcols[..kg * ld],
                    ld,
                    false,
                    gs,
                );
                col2im_add(g, dcols, ld, sc, grp, a);
            }
            if let Some((e_old, e_acc)) = old {
                for (v, &q) in a.iter_mut().zip(&prev[s0 * per_in..(s0 + sc) * per_in]) {
                    *v = v.saturating_add(align(q as i32, e_old, e_acc));
                }
            }
            Ok(TileOut::flat(s0 * per_in, sc * per_in))
        },
    ))
}

/// Convolution weight gradient in i32 over `n` samples (`dy` from its first; `x` from sample `first`),
/// `blk` samples per GEMM (`cols` `kg × blk·P`, `dyc` `cout_g × blk·P`): `dw[cout × kg]`, `db[cout]`.
/// Flat geometries multiply the columns with `dY` in place (`quant::flat`: no packing).
#[allow(clippy::too_many_arguments)]
pub fn conv_grad_w(
    g: &ConvGeom,
    n: usize,
    first: usize,
    blk: usize,
    x: &mut XSrc<'_>,
    dy: &[i8],
    dw: &mut [i32],
    mut db: Option<&mut [i32]>,
    cols: &mut [i8],
    dyc: &mut [i8],
    gs: &mut [i8],
) {
    let (_, cout_g, kg, p) = conv_dims(g);
    let per_in = g.cin * g.h * g.w;
    let per_out = g.cout * p;
    let blk = blk.clamp(1, n.max(1));
    if let Some(db) = db.as_deref_mut() {
        db.fill(0);
    }
    // The padded planes go where the general path packs its operands.
    let fast = Flat::new(g).filter(|fl| {
        cols.len() >= kg * blk * p
            && dyc.len() >= cout_g * blk * p
            && gs.len() >= fl.planes_len(blk)
    });
    let mut masks = [0i8; MASKS];
    if let Some(fl) = fast {
        fl.masks(&mut masks);
        fl.clear_planes(gs, blk);
    }
    for s0 in (0..n).step_by(blk) {
        let sc = blk.min(n - s0);
        let ld = sc * p;
        let xs = x.rows(first + s0, sc, per_in);
        for grp in 0..g.groups {
            let dwg = &mut dw[grp * cout_g * kg..(grp + 1) * cout_g * kg];
            if let Some(fl) = fast {
                let dys = &dy[s0 * per_out..];
                fl.grad_w_group(xs, dys, sc, grp, &masks, gs, cols, dyc, dwg, s0 > 0);
            } else {
                im2col(g, xs, sc, grp, cols, ld);
                gather_dy(g, &dy[s0 * per_out..], sc, grp, dyc, ld);
                igemm(
                    cout_g,
                    kg,
                    ld,
                    MatRef {
                        data: &dyc[..cout_g * ld],
                        rs: ld,
                        cs: 1,
                    },
                    MatRef {
                        data: &cols[..kg * ld],
                        rs: 1,
                        cs: ld,
                    },
                    dwg,
                    kg,
                    s0 > 0,
                    gs,
                );
            }
            // Both paths leave the group's dY of the block in `dyc`, one row per channel.
            if let Some(db) = db.as_deref_mut() {
                let dbg = &mut db[grp * cout_g..(grp + 1) * cout_g];
                for (b, row) in dbg.iter_mut().zip(dyc.chunks_exact(ld)) {
                    *b += row.iter().map(|&v| v as i32).sum::<i32>();
                }
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
    let planes = x
        .chunks_exact(pin)
        .zip(y[..n * g.c * pout].chunks_exact_mut(pout));
    if (g.kh, g.kw, g.sh, g.sw) == (2, 2, 2, 2) && g.w.is_multiple_of(2) {
        // The common 2×2 / 2 window over whole row pairs: a plane of even height is its pairs back to
        // back, and so is a tensor of such planes.
        if g.h.is_multiple_of(2) {
            let pairs = n * g.c * g.oh;
            k8::maxpool2x2(&x[..n * g.c * pin], g.w, pairs, &mut y[..pairs * g.ow], idx);
        } else {
            for ((xs, ys), is) in planes.zip(idx.chunks_exact_mut(pout)) {
                k8::maxpool2x2(xs, g.w, g.oh, ys, is);
            }
        }
        return;
    }
    if (g.kh, g.kw, g.sh, g.sw) == (2, 2, 2, 2) {
        // The 2×2 / 2 window on odd widths: the same comparisons in the same order, without index
        // arithmetic.
        for ((xs, ys), is) in planes.zip(idx.chunks_exact_mut(pout)) {
            for oy in 0..g.oh {
                let r0 = &xs[2 * oy * g.w..2 * oy * g.w + 2 * g.ow];
                let r1 = &xs[(2 * oy + 1) * g.w..(2 * oy + 1) * g.w + 2 * g.ow];
                let yr = &mut ys[oy * g.ow..(oy + 1) * g.ow];
                let ir = &mut is[oy * g.ow..(oy + 1) * g.ow];
                for (((yv, iv), a), b) in yr
                    .iter_mut()
                    .zip(ir.iter_mut())
                    .zip(r0.chunks_exact(2))
                    .zip(r1.chunks_exact(2))
                {
                    let (mut best, mut bi) = (a[0], 0u8);
                    for (v, k) in [(a[1], 1u8), (b[0], 2), (b[1], 3)] {
                        if v > best {
                            best = v;
                            bi = k;
                        }
                    }
                    *yv = best;
                    *iv = bi;
                }
            }
        }
        return;
    }
    for ((xs, ys), is) in planes.zip(idx.chunks_exact_mut(pout)) {
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
                let o = oy * g.ow + ox;
                ys[o] = best;
                is[o] = bi;
            }
        }
    }
}

/// Max pooling derivative: `dx[argmax] += dy` moved from `e_dy` to `e_dx` (saturating). Not inlined:
/// its table of window offsets stays off the stack of steps that pool nothing.
#[inline(never)]
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
    // Input offset of each window index (windows hold at most 255 elements, checked at graph build).
    let mut woff = [0usize; 256];
    for (k, o) in woff.iter_mut().enumerate().take(g.kh * g.kw) {
        *o = (k / g.kw) * g.w + k % g.kw;
    }
    let same = e_dy == e_dx;
    if same && (g.kh, g.kw, g.sh, g.sw) == (2, 2, 2, 2) && g.w.is_multiple_of(2) {
        if g.h.is_multiple_of(2) {
            k8::maxpool2x2_grad(&dy[..n * g.c * pout], idx, g.w, n * g.c * g.oh, dx);
        } else {
            for ((ds, is), xs) in dy[..n * g.c * pout]
                .chunks_exact(pout)
                .zip(idx.chunks_exact(pout))
                .zip(dx.chunks_exact_mut(pin))
            {
                k8::maxpool2x2_grad(ds, is, g.w, g.oh, xs);
            }
        }
        return;
    }
    for ((ds, is), xs) in dy[..n * g.c * pout]
        .chunks_exact(pout)
        .zip(idx.chunks_exact(pout))
        .zip(dx.chunks_exact_mut(pin))
    {
        for oy in 0..g.oh {
            for ox in 0..g.ow {
                let o = oy * g.ow + ox;
                let i = oy * g.sh * g.w + ox * g.sw + woff[is[o] as usize];
                let v = if same {
                    ds[o] as i32
                } else {
                    align(ds[o] as i32, e_dy, e_dx)
                };
                xs[i] = sat8(xs[i] as i32 + v);
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
        // A select, not a conditional store: the loop vectorises.
        *d = if y > 0 { *d } else { 0 };
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
