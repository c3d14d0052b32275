//! 2-D convolution (dilation 1, zero padding, channel groups), PyTorch layout: `x` is `[n, cin, h, w]`,
//! `W` is `[cout, cin/groups, kh, kw]`, `y` is `[n, cout, oh, ow]`.
//!
//! Three execution paths, picked from the geometry alone (so the scratch size is known up front):
//!
//! * **Depthwise / channel-multiplier** (`groups > 1`, one input channel per group): a direct loop
//!   kernel. With stride 1 and a kernel or padding beyond 1×1 it works on *wide rows*: the input plane
//!   is copied into a zero-bordered buffer of width `wp = w + 2·pw`, and the output is computed at that
//!   width too (`oh × wp`, the extra `kw − 1` columns per row discarded), so that for every kernel tap
//!   the whole plane is one contiguous axpy (forward, input gradient) or dot (weight gradient) at offset
//!   `i·wp + j` — a few long vector loops per plane instead of one short one per row and tap (8×8
//!   planes ran at a fifth of the speed). Scratch: the padded plane and the wide output. Otherwise
//!   (strides, or 1×1 unpadded) every `(kernel tap, output row)` pair is one contiguous axpy/dot over
//!   the valid output columns, whose bounds are computed once per row — no per-element div/mod or
//!   padding tests — and there is no scratch. Per output element the taps add up in the same order on
//!   both ways.
//! * **Pointwise** (1×1 kernel, stride 1, no padding): the input plane block *is* the column matrix, so
//!   each phase is one GEMM per sample and group, no scratch beyond the GEMM's own.
//! * **General**: im2col + GEMM per sample, group and *block of output rows*: the column buffer holds
//!   `K = cin/groups·kh·kw` rows by `rows·ow` columns, with `rows` the largest count whose buffer fits
//!   in [`CONV_COL_CAP`] elements (at least one output row). The scratch is therefore bounded
//!   independently of the batch and of the image height. A padded conv first copies the input rows a
//!   block reads into a zero-bordered buffer, so that unfolding is unconditional row copies (no
//!   clipping per row). Weight gradient: `dW += dY_block·colᵀ` per block. Backward-data does
//!   `col = Wᵀ·dY` then col2im, which accumulates (overlapping windows and neighbouring row blocks add
//!   up) and clips to the image instead of padding.
//!
//! GEMM orientations (all with C row-major, as the GEMM requires): forward `W_g[cout_g×K]·col[K×cols]`
//! written straight into the NCHW output with `ldc = oh·ow`; weight gradient `dY[cout_g×cols]·colᵀ`;
//! data gradient `W_gᵀ·dY`. Per-sample (per-block) GEMMs are small for LeNet-sized layers; their cost
//! is dominated by the GEMM itself, whose packing of transposed operands matters most for the
//! weight-gradient shape (small m and n, long k).
use super::elementwise::{dot, fill, sum};
use crate::kernels::par::{tasks_for, Shards};
use crate::kernels::{gemm_par, gemm_scratch_len, MatRef, Real};
use crate::pool::{chunk, SingleThread, WorkerPool};

/// Largest im2col buffer, in elements, the general path uses (128 KiB of f32: stays in L2 while the
/// GEMM streams it). A single output row that needs more than this gets exactly one row.
pub const CONV_COL_CAP: usize = 1 << 15;

/// Convolution geometry for one sample. Build it with [`ConvGeom::new`], which validates it and
/// derives `oh = (h + 2ph − kh)/sh + 1` and `ow` likewise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvGeom {
    /// Input channels.
    pub cin: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub cout: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Vertical stride.
    pub sh: usize,
    /// Horizontal stride.
    pub sw: usize,
    /// Vertical zero padding (each side).
    pub ph: usize,
    /// Horizontal zero padding (each side).
    pub pw: usize,
    /// Channel groups (divides `cin` and `cout`).
    pub groups: usize,
    /// Output height.
    pub oh: usize,
    /// Output width.
    pub ow: usize,
}

/// Which kernel a geometry runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Direct,
    Pointwise,
    Im2col,
}

impl ConvGeom {
    /// Validates a geometry. `None` for zero sizes or strides, `groups` not dividing `cin` and `cout`,
    /// a kernel larger than the padded input, or sizes whose products overflow `usize`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cin: usize,
        h: usize,
        w: usize,
        cout: usize,
        kh: usize,
        kw: usize,
        sh: usize,
        sw: usize,
        ph: usize,
        pw: usize,
        groups: usize,
    ) -> Option<Self> {
        if [cin, h, w, cout, kh, kw, sh, sw, groups].contains(&0) {
            return None;
        }
        if !cin.is_multiple_of(groups) || !cout.is_multiple_of(groups) {
            return None;
        }
        let hp = h.checked_add(ph.checked_mul(2)?)?;
        let wp = w.checked_add(pw.checked_mul(2)?)?;
        if kh > hp || kw > wp {
            return None;
        }
        let oh = (hp - kh) / sh + 1;
        let ow = (wp - kw) / sw + 1;
        // Every buffer size derived below must be representable.
        cin.checked_mul(hp)?.checked_mul(wp)?;
        cout.checked_mul(oh)?.checked_mul(ow)?;
        (cin / groups)
            .checked_mul(kh)?
            .checked_mul(kw)?
            .checked_mul(cout)?
            .checked_mul(ow)?;
        Some(Self {
            cin,
            h,
            w,
            cout,
            kh,
            kw,
            sh,
            sw,
            ph,
            pw,
            groups,
            oh,
            ow,
        })
    }
    /// Input elements per sample, `cin·h·w`.
    pub fn in_len(&self) -> usize {
        self.cin * self.h * self.w
    }
    /// Output elements per sample, `cout·oh·ow`.
    pub fn out_len(&self) -> usize {
        self.cout * self.oh * self.ow
    }
    /// Weight elements, `cout·(cin/groups)·kh·kw`.
    pub fn weight_len(&self) -> usize {
        self.cout * self.k_g()
    }
    fn cin_g(&self) -> usize {
        self.cin / self.groups
    }
    fn cout_g(&self) -> usize {
        self.cout / self.groups
    }
    /// Rows of the per-group column matrix (= weight elements per output channel).
    fn k_g(&self) -> usize {
        self.cin_g() * self.kh * self.kw
    }
    /// Whether the direct path works on zero-bordered wide rows (see the module docs).
    fn wide(&self) -> bool {
        self.sh == 1 && self.sw == 1 && (self.kh > 1 || self.kw > 1 || self.ph > 0 || self.pw > 0)
    }
    /// Elements of the wide-row buffers: the padded plane and the wide output.
    fn wide_len(&self) -> usize {
        let wp = self.w + 2 * self.pw;
        (self.h + 2 * self.ph) * wp + self.oh * wp
    }
    fn path(&self) -> Path {
        if self.groups > 1 && self.cin_g() == 1 {
            Path::Direct
        } else if self.kh == 1
            && self.kw == 1
            && self.sh == 1
            && self.sw == 1
            && self.ph == 0
            && self.pw == 0
        {
            Path::Pointwise
        } else {
            Path::Im2col
        }
    }
    /// Output rows per im2col block for a column-buffer cap of `cap` elements.
    fn block_rows(&self, cap: usize) -> usize {
        (cap / (self.k_g() * self.ow)).clamp(1, self.oh)
    }
    /// Width of a zero-padded input row.
    fn wp(&self) -> usize {
        self.w + 2 * self.pw
    }
    /// Padded input rows that `rows` output rows read.
    fn pad_rows(&self, rows: usize) -> usize {
        (rows - 1) * self.sh + self.kh
    }
    /// Elements of the zero-padded copy of one block's input rows (0 without padding: im2col then
    /// reads the input planes directly).
    fn pad_len(&self, rows: usize) -> usize {
        if self.ph == 0 && self.pw == 0 {
            0
        } else {
            self.cin_g() * self.pad_rows(rows) * self.wp()
        }
    }
}

/// Scratch elements (`T`) any phase of [`conv_fwd`], [`conv_grad_w`], [`conv_grad_x`] needs:
///
/// * direct (depthwise) path: 0;
/// * pointwise path: `max(gemm_scratch_len(cout_g, hw, cin_g), gemm_scratch_len(cout_g, cin_g, hw),
///   gemm_scratch_len(cin_g, hw, cout_g))`;
/// * im2col path: `K·rows·ow + pad + max over the three GEMM shapes` with `K = cin_g·kh·kw`,
///   `rows = clamp(CONV_COL_CAP / (K·ow), 1, oh)` and, when the conv pads,
///   `pad = cin_g·((rows−1)·sh + kh)·(w + 2pw)` (a zero-padded copy of the input rows one block reads;
///   0 without padding).
///
/// Independent of the batch size `n` (kept in the signature for the planner's uniformity).
pub fn conv_scratch_len(g: &ConvGeom, _n: usize) -> usize {
    scratch_len_cap(g, CONV_COL_CAP)
}

/// Scratch elements for `threads` workers: each takes whole samples of the forward and input-gradient
/// passes with its own copy of [`conv_scratch_len`] (`threads ≤ 1`: exactly that). With less, fewer
/// workers take samples (down to one, which then splits each GEMM's rows); the result is the same bits.
pub fn conv_scratch_len_threads(g: &ConvGeom, n: usize, threads: usize) -> usize {
    conv_scratch_len(g, n)
        * threads
            .clamp(1, crate::kernels::par::MAX_TASKS)
            .min(n.max(1))
}

/// Multiply-adds below which a pass is not split across workers (tiny in tests, so that they split).
const PAR_MIN_WORK: usize = if cfg!(test) { 16 } else { 1 << 17 };

/// Workers that take samples: as many as the pool has, there are samples, and scratch copies of `per`
/// elements fit (1 when the conv needs no scratch per sample only if the pool has one worker).
fn sample_tasks(
    pool: &dyn WorkerPool,
    n: usize,
    per: usize,
    scratch_len: usize,
    work: usize,
) -> usize {
    let fit = scratch_len.checked_div(per).unwrap_or(usize::MAX);
    tasks_for(pool, work, PAR_MIN_WORK).min(n).min(fit).max(1)
}

/// One sample's pass: `(pool, source sample, destination sample, scratch)`.
type SampleFn<'a, T> = dyn Fn(&dyn WorkerPool, &[T], &mut [T], &mut [T]) + Sync + 'a;

/// Runs `one(pool, src_sample, dst_sample, scratch)` for each of the `n` samples of `src` (`src_len`
/// elements each) into `dst` (`dst_len` each). When the scratch holds a copy of `per` elements for
/// several workers, the samples are split across them (each sample on one worker, given
/// [`SingleThread`]); otherwise samples run in order, each with the whole pool. Samples are independent,
/// so the bits do not depend on the split.
#[allow(clippy::too_many_arguments)]
fn by_samples<T: Real>(
    pool: &dyn WorkerPool,
    n: usize,
    (src, src_len): (&[T], usize),
    (dst, dst_len): (&mut [T], usize),
    scratch: &mut [T],
    per: usize,
    work: usize,
    one: &SampleFn<'_, T>,
) {
    let tasks = sample_tasks(pool, n, per, scratch.len(), work);
    let dst = &mut dst[..n * dst_len];
    if tasks == 1 {
        let ss = src[..n * src_len].chunks_exact(src_len);
        for (s, d) in ss.zip(dst.chunks_exact_mut(dst_len)) {
            one(pool, s, d, scratch);
        }
        return;
    }
    let dsh = Shards::new(dst, tasks, |t| {
        let r = chunk(n, tasks, 1, t);
        r.start * dst_len..r.end * dst_len
    });
    let ssh = Shards::new(&mut scratch[..tasks * per], tasks, |t| {
        t * per..(t + 1) * per
    });
    pool.run(tasks, &|t| {
        let r = chunk(n, tasks, 1, t);
        let (ds, sc) = (dsh.take(t), ssh.take(t));
        let ss = src[r.start * src_len..r.end * src_len].chunks_exact(src_len);
        for (s, d) in ss.zip(ds.chunks_exact_mut(dst_len)) {
            one(&SingleThread, s, d, sc);
        }
    });
}

fn gemm3(m_out: usize, cols: usize, k: usize) -> usize {
    // Forward (m_out × cols × k), weight gradient (m_out × k × cols), data gradient (k × cols × m_out).
    gemm_scratch_len(m_out, cols, k)
        .max(gemm_scratch_len(m_out, k, cols))
        .max(gemm_scratch_len(k, cols, m_out))
}

fn scratch_len_cap(g: &ConvGeom, cap: usize) -> usize {
    match g.path() {
        Path::Direct if g.wide() => g.wide_len(),
        Path::Direct => 0,
        Path::Pointwise => gemm3(g.cout_g(), g.h * g.w, g.cin_g()),
        Path::Im2col => {
            let k = g.k_g();
            let rows = g.block_rows(cap);
            let last = g.oh - (g.oh - 1) / rows * rows;
            k * rows * g.ow
                + g.pad_len(rows)
                + gemm3(g.cout_g(), rows * g.ow, k).max(gemm3(g.cout_g(), last * g.ow, k))
        }
    }
}

/// Output positions `o ∈ [lo, hi)` whose input coordinate `o·s + k − p` lies in `[0, len)` (for kernel
/// tap `k`, padding `p`, stride `s`, `out` outputs). Always `lo ≤ hi`.
#[inline]
fn valid_out(k: usize, p: usize, s: usize, len: usize, out: usize) -> (usize, usize) {
    let lo = if k >= p { 0 } else { (p - k).div_ceil(s) };
    let hi = if len + p > k {
        ((len + p - k - 1) / s + 1).min(out)
    } else {
        0
    };
    (lo.min(hi), hi)
}

/// `dst.copy_from_slice(src)` for the short rows of im2col (tens of elements): fixed-size 8-element
/// moves that compile inline, the tail done as one overlapping 8-element move, instead of a `memcpy`
/// call per row whose overhead dominates at these lengths.
#[inline(always)]
fn copy_short<T: Copy>(dst: &mut [T], src: &[T]) {
    const B: usize = 8;
    let len = dst.len();
    let src = &src[..len];
    if len < B {
        // Still no variable-length copy: on wasm32 that is a `memory.copy`, which engines run out of line
        // (a call per row that costs more than the row).
        if len >= 4 {
            dst[..4].copy_from_slice(&src[..4]);
            dst[len - 4..].copy_from_slice(&src[len - 4..]);
        } else {
            // Written out: a loop would be turned back into a `memcpy`.
            if len > 0 {
                dst[0] = src[0];
            }
            if len > 1 {
                dst[1] = src[1];
            }
            if len > 2 {
                dst[2] = src[2];
            }
        }
        return;
    }
    let mut i = 0;
    while i + B <= len {
        dst[i..i + B].copy_from_slice(&src[i..i + B]);
        i += B;
    }
    if i < len {
        dst[len - B..].copy_from_slice(&src[len - B..]);
    }
}

/// For kernel tap `(i, j)` and output rows `[oy0, oy1)`: the valid rows `[lo, hi)`, the valid columns
/// `[oxl, oxl + len)`, and the first input offset `(lo·sh + i − ph)·w + oxl·sw + j − pw` (meaningful only
/// when `lo < hi` and `len > 0`).
#[inline(always)]
fn tap_span(
    g: &ConvGeom,
    i: usize,
    j: usize,
    oy0: usize,
    oy1: usize,
) -> (usize, usize, usize, usize, usize) {
    let (oyl, oyh) = valid_out(i, g.ph, g.sh, g.h, g.oh);
    let (oxl, oxh) = valid_out(j, g.pw, g.sw, g.w, g.ow);
    let (lo, hi) = (oy0.max(oyl), oy1.min(oyh));
    if lo >= hi || oxl >= oxh {
        return (oy0, oy0, 0, 0, 0);
    }
    let src = (lo * g.sh + i - g.ph) * g.w + oxl * g.sw + j - g.pw;
    (lo, hi, oxl, oxh - oxl, src)
}

/// Copies the input rows that output rows `[oy0, oy0 + rows)` read into `pbuf` with the zero border
/// made explicit: `cin_g` planes of `pad_rows(rows) × wp`, row `r` holding padded row `oy0·sh + r`.
fn pad_block<T: Real>(g: &ConvGeom, xg: &[T], oy0: usize, rows: usize, pbuf: &mut [T]) {
    let (hw, wp, prow) = (g.h * g.w, g.wp(), g.pad_rows(rows));
    let planes = pbuf[..g.cin_g() * prow * wp].chunks_exact_mut(prow * wp);
    for (xp, pp) in xg[..g.cin_g() * hw].chunks_exact(hw).zip(planes) {
        // One fill per plane, then the image rows: per-row fills of the (1-element) borders and row
        // copies of a few elements would each be a `memory.fill`/`memory.copy` call on wasm32.
        fill(pp, T::ZERO);
        for (r, row) in pp.chunks_exact_mut(wp).enumerate() {
            let t = oy0 * g.sh + r;
            if t >= g.ph && t - g.ph < g.h {
                let iy = t - g.ph;
                copy_short(&mut row[g.pw..g.pw + g.w], &xp[iy * g.w..(iy + 1) * g.w]);
            }
        }
    }
}

/// Unfolds `rows` output rows of one group into `col` (`K × rows·ow`, row `(c·kh + i)·kw + j`).
///
/// `src` holds the group's input rows without any out-of-image access left to clip: either the input
/// planes themselves (no padding; `plane = h·w`, `row = w`, `off` = first row the block reads) or the
/// block's zero-padded copy from [`pad_block`]. Every piece is then an unconditional copy of one output
/// row (`ow` values, stride `sw`), so the per-row work is a few vector moves.
#[allow(clippy::too_many_arguments)]
fn im2col<T: Real>(
    g: &ConvGeom,
    src: &[T],
    plane: usize,
    row: usize,
    off: usize,
    rows: usize,
    col: &mut [T],
) {
    let ow = g.ow;
    let ncols = rows * ow;
    let step = g.sh * row;
    let span = (ow - 1) * g.sw + 1;
    let mut dst_rows = col[..g.k_g() * ncols].chunks_exact_mut(ncols);
    for c in 0..g.cin_g() {
        let p = &src[c * plane + off..];
        for i in 0..g.kh {
            for j in 0..g.kw {
                let Some(dst) = dst_rows.next() else { return };
                let mut so = i * row + j;
                for out in dst.chunks_exact_mut(ow) {
                    let s = &p[so..so + span];
                    match g.sw {
                        1 => copy_short(out, s),
                        2 => {
                            // Pairs, the last value on its own (its pair partner may lie past the row).
                            let (head, last) = out.split_at_mut(ow - 1);
                            for (o, pr) in head.iter_mut().zip(s.chunks_exact(2)) {
                                *o = pr[0];
                            }
                            last[0] = s[span - 1];
                        }
                        sw => {
                            for (o, &v) in out.iter_mut().zip(s.iter().step_by(sw)) {
                                *o = v;
                            }
                        }
                    }
                    so += step;
                }
            }
        }
    }
}

/// Unfolds output rows `[oy0, oy0 + rows)` of group input `xg`, padding through `pbuf` when needed.
fn unfold_block<T: Real>(
    g: &ConvGeom,
    xg: &[T],
    oy0: usize,
    rows: usize,
    pbuf: &mut [T],
    col: &mut [T],
) {
    if g.ph == 0 && g.pw == 0 {
        im2col(g, xg, g.h * g.w, g.w, oy0 * g.sh * g.w, rows, col);
    } else {
        pad_block(g, xg, oy0, rows, pbuf);
        im2col(g, pbuf, g.pad_rows(rows) * g.wp(), g.wp(), 0, rows, col);
    }
}

/// Adds the column matrix of output rows `[oy0, oy1)` back into one group's input-gradient planes.
fn col2im<T: Real>(g: &ConvGeom, col: &[T], oy0: usize, oy1: usize, dxg: &mut [T]) {
    let hw = g.h * g.w;
    let ncols = (oy1 - oy0) * g.ow;
    let mut rows = col[..g.k_g() * ncols].chunks_exact(ncols);
    let sstep = g.sh * g.w;
    for xp in dxg[..g.cin_g() * hw].chunks_exact_mut(hw) {
        for i in 0..g.kh {
            for j in 0..g.kw {
                let Some(src) = rows.next() else { return };
                let (lo, hi, oxl, len, mut so) = tap_span(g, i, j, oy0, oy1);
                let mut d = (lo - oy0) * g.ow + oxl;
                for _ in lo..hi {
                    let v = &src[d..d + len];
                    match g.sw {
                        1 => {
                            for (t, &v) in xp[so..so + len].iter_mut().zip(v) {
                                *t += v;
                            }
                        }
                        2 => {
                            let dst = &mut xp[so..so + 2 * len - 1];
                            let (head, last) = v.split_at(len - 1);
                            for (p, &v) in dst.chunks_exact_mut(2).zip(head) {
                                p[0] += v;
                            }
                            dst[2 * len - 2] += last[0];
                        }
                        sw => {
                            for (t, &v) in xp[so..].iter_mut().step_by(sw).zip(v) {
                                *t += v;
                            }
                        }
                    }
                    so += sstep;
                    d += g.ow;
                }
            }
        }
    }
}

/// Forward: `y = conv(x, W) + b` for `n` samples.
#[allow(clippy::too_many_arguments)]
pub fn conv_fwd<T: Real>(
    g: &ConvGeom,
    n: usize,
    x: &[T],
    w: &[T],
    b: Option<&[T]>,
    y: &mut [T],
    scratch: &mut [T],
) {
    fwd_cap(&SingleThread, g, n, x, w, b, y, scratch, CONV_COL_CAP)
}

/// [`conv_fwd`] on the workers of `pool`: samples split across workers that each have a scratch copy
/// (see [`conv_scratch_len_threads`]), else each sample's GEMMs split by output rows. The same bits for
/// any pool.
#[allow(clippy::too_many_arguments)]
pub fn conv_fwd_par<T: Real>(
    pool: &dyn WorkerPool,
    g: &ConvGeom,
    n: usize,
    x: &[T],
    w: &[T],
    b: Option<&[T]>,
    y: &mut [T],
    scratch: &mut [T],
) {
    fwd_cap(pool, g, n, x, w, b, y, scratch, CONV_COL_CAP)
}

#[allow(clippy::too_many_arguments)]
fn fwd_cap<T: Real>(
    pool: &dyn WorkerPool,
    g: &ConvGeom,
    n: usize,
    x: &[T],
    w: &[T],
    b: Option<&[T]>,
    y: &mut [T],
    scratch: &mut [T],
    cap: usize,
) {
    let (in_len, out_len) = (g.in_len(), g.out_len());
    let per = scratch_len_cap(g, cap);
    let work = n * out_len * g.k_g().max(1);
    by_samples(
        pool,
        n,
        (x, in_len),
        (y, out_len),
        scratch,
        per,
        work,
        &|pool, xs, ys, sc| fwd_sample(pool, g, xs, w, b, ys, sc, cap),
    );
}

/// The forward pass of one sample.
#[allow(clippy::too_many_arguments)]
fn fwd_sample<T: Real>(
    pool: &dyn WorkerPool,
    g: &ConvGeom,
    xs: &[T],
    w: &[T],
    b: Option<&[T]>,
    ys: &mut [T],
    scratch: &mut [T],
    cap: usize,
) {
    let (ohow, hw) = (g.oh * g.ow, g.h * g.w);
    let (cin_g, cout_g, k) = (g.cin_g(), g.cout_g(), g.k_g());
    let path = g.path();
    {
        // Bias first; the kernels below accumulate on top of it.
        match b {
            Some(b) => {
                for (yp, &bv) in ys.chunks_exact_mut(ohow).zip(b) {
                    fill(yp, bv);
                }
            }
            None if path == Path::Direct => fill(ys, T::ZERO),
            None => {}
        }
        let acc = b.is_some();
        match path {
            Path::Direct => direct_fwd(g, xs, w, ys, scratch),
            Path::Pointwise => {
                for gi in 0..g.groups {
                    gemm_par(
                        pool,
                        cout_g,
                        hw,
                        cin_g,
                        MatRef::row_major(&w[gi * cout_g * k..], k),
                        MatRef::row_major(&xs[gi * cin_g * hw..], hw),
                        &mut ys[gi * cout_g * ohow..],
                        ohow,
                        acc,
                        scratch,
                    );
                }
            }
            Path::Im2col => {
                let rows = g.block_rows(cap);
                let (col, rest) = scratch.split_at_mut(k * rows * g.ow);
                let (pbuf, gs) = rest.split_at_mut(g.pad_len(rows));
                for gi in 0..g.groups {
                    let xg = &xs[gi * cin_g * hw..(gi + 1) * cin_g * hw];
                    let wg = &w[gi * cout_g * k..(gi + 1) * cout_g * k];
                    let yg = &mut ys[gi * cout_g * ohow..(gi + 1) * cout_g * ohow];
                    for oy0 in (0..g.oh).step_by(rows) {
                        let oy1 = (oy0 + rows).min(g.oh);
                        let ncols = (oy1 - oy0) * g.ow;
                        unfold_block(g, xg, oy0, oy1 - oy0, pbuf, col);
                        gemm_par(
                            pool,
                            cout_g,
                            ncols,
                            k,
                            MatRef::row_major(wg, k),
                            MatRef::row_major(&col[..k * ncols], ncols),
                            &mut yg[oy0 * g.ow..],
                            ohow,
                            acc,
                            gs,
                        );
                    }
                }
            }
        }
    }
}

/// Weight gradient: `dW = Σ_samples dY ⋆ X` and `db = Σ dY` (overwritten, or added when `accumulate`).
#[allow(clippy::too_many_arguments)]
pub fn conv_grad_w<T: Real>(
    g: &ConvGeom,
    n: usize,
    x: &[T],
    dy: &[T],
    dw: &mut [T],
    db: Option<&mut [T]>,
    accumulate: bool,
    scratch: &mut [T],
) {
    grad_w_cap(
        &SingleThread,
        g,
        n,
        x,
        dy,
        Some(dw),
        db,
        g.cout,
        accumulate,
        scratch,
        CONV_COL_CAP,
    )
}

/// [`conv_grad_w`] on the workers of `pool`: samples stay in order (the gradient sums over them), each
/// GEMM's rows of dW are split. The same bits for any pool.
#[allow(clippy::too_many_arguments)]
pub fn conv_grad_w_par<T: Real>(
    pool: &dyn WorkerPool,
    g: &ConvGeom,
    n: usize,
    x: &[T],
    dy: &[T],
    dw: &mut [T],
    db: Option<&mut [T]>,
    accumulate: bool,
    scratch: &mut [T],
) {
    grad_w_cap(
        pool,
        g,
        n,
        x,
        dy,
        Some(dw),
        db,
        g.cout,
        accumulate,
        scratch,
        CONV_COL_CAP,
    )
}

/// [`conv_grad_w_par`] for the leading `rows` output channels only (a sparse update): `dw` holds
/// `rows × cin/groups × kh × kw` elements and `db` `rows` — or none, when only the bias trains (then
/// `x` is not read and may be empty). The updated channels' values are the full gradient's.
#[allow(clippy::too_many_arguments)]
pub fn conv_grad_w_rows_par<T: Real>(
    pool: &dyn WorkerPool,
    g: &ConvGeom,
    n: usize,
    rows: usize,
    x: &[T],
    dy: &[T],
    dw: Option<&mut [T]>,
    db: Option<&mut [T]>,
    accumulate: bool,
    scratch: &mut [T],
) {
    grad_w_cap(
        pool,
        g,
        n,
        x,
        dy,
        dw,
        db,
        rows.min(g.cout),
        accumulate,
        scratch,
        CONV_COL_CAP,
    )
}

#[allow(clippy::too_many_arguments)]
fn grad_w_cap<T: Real>(
    pool: &dyn WorkerPool,
    g: &ConvGeom,
    n: usize,
    x: &[T],
    dy: &[T],
    dw: Option<&mut [T]>,
    db: Option<&mut [T]>,
    cout: usize,
    accumulate: bool,
    scratch: &mut [T],
    cap: usize,
) {
    let (in_len, out_len, ohow, hw) = (g.in_len(), g.out_len(), g.oh * g.ow, g.h * g.w);
    let (cin_g, cout_g, k) = (g.cin_g(), g.cout_g(), g.k_g());
    if let Some(db) = db {
        let db = &mut db[..cout];
        if !accumulate {
            fill(db, T::ZERO);
        }
        for ds in dy[..n * out_len].chunks_exact(out_len) {
            for (d, p) in db.iter_mut().zip(ds.chunks_exact(ohow)) {
                *d += sum(p);
            }
        }
    }
    // Only the leading `cout` output channels' rows of dW (all of them but under a sparse update).
    let Some(dw) = dw else { return };
    let dw = &mut dw[..cout * k];
    // Zero once (unless accumulating micro-batches), then every sample / block accumulates.
    if !accumulate {
        fill(dw, T::ZERO);
    }
    // Rows of group `gi` that are updated: a prefix of the group's `cout_g`.
    let m_of = |gi: usize| cout.saturating_sub(gi * cout_g).min(cout_g);
    let groups = cout.div_ceil(cout_g.max(1)).min(g.groups);
    let xs = x[..n * in_len].chunks_exact(in_len);
    let ds = dy[..n * out_len].chunks_exact(out_len);
    match g.path() {
        Path::Direct => {
            for (xs, ds) in xs.zip(ds) {
                direct_grad_w(g, xs, ds, dw, scratch);
            }
        }
        Path::Pointwise => {
            for (xs, ds) in xs.zip(ds) {
                for gi in 0..groups {
                    gemm_par(
                        pool,
                        m_of(gi),
                        cin_g,
                        hw,
                        MatRef::row_major(&ds[gi * cout_g * ohow..], ohow),
                        MatRef::row_major_t(&xs[gi * cin_g * hw..], hw),
                        &mut dw[gi * cout_g * k..],
                        k,
                        true,
                        scratch,
                    );
                }
            }
        }
        Path::Im2col => {
            let rows = g.block_rows(cap);
            let (col, rest) = scratch.split_at_mut(k * rows * g.ow);
            let (pbuf, gs) = rest.split_at_mut(g.pad_len(rows));
            for (xs, ds) in xs.zip(ds) {
                for gi in 0..groups {
                    let m = m_of(gi);
                    let xg = &xs[gi * cin_g * hw..(gi + 1) * cin_g * hw];
                    let dyg = &ds[gi * cout_g * ohow..(gi + 1) * cout_g * ohow];
                    for oy0 in (0..g.oh).step_by(rows) {
                        let oy1 = (oy0 + rows).min(g.oh);
                        let ncols = (oy1 - oy0) * g.ow;
                        unfold_block(g, xg, oy0, oy1 - oy0, pbuf, col);
                        // dW_g[cout_g × K] += dY_block[cout_g × ncols] · colᵀ[ncols × K]
                        gemm_par(
                            pool,
                            m,
                            k,
                            ncols,
                            MatRef {
                                data: &dyg[oy0 * g.ow..],
                                rs: ohow,
                                cs: 1,
                            },
                            MatRef::row_major_t(&col[..k * ncols], ncols),
                            &mut dw[gi * cout_g * k..gi * cout_g * k + m * k],
                            k,
                            true,
                            gs,
                        );
                    }
                }
            }
        }
    }
}

/// Input gradient: `dX = conv_transpose(dY, W)` (added into `dx` when `accumulate`).
#[allow(clippy::too_many_arguments)]
pub fn conv_grad_x<T: Real>(
    g: &ConvGeom,
    n: usize,
    dy: &[T],
    w: &[T],
    dx: &mut [T],
    accumulate: bool,
    scratch: &mut [T],
) {
    grad_x_cap(
        &SingleThread,
        g,
        n,
        dy,
        w,
        dx,
        accumulate,
        scratch,
        CONV_COL_CAP,
    )
}

/// [`conv_grad_x`] on the workers of `pool` (samples split as in [`conv_fwd_par`]), the same bits for
/// any pool.
#[allow(clippy::too_many_arguments)]
pub fn conv_grad_x_par<T: Real>(
    pool: &dyn WorkerPool,
    g: &ConvGeom,
    n: usize,
    dy: &[T],
    w: &[T],
    dx: &mut [T],
    accumulate: bool,
    scratch: &mut [T],
) {
    grad_x_cap(pool, g, n, dy, w, dx, accumulate, scratch, CONV_COL_CAP)
}

#[allow(clippy::too_many_arguments)]
fn grad_x_cap<T: Real>(
    pool: &dyn WorkerPool,
    g: &ConvGeom,
    n: usize,
    dy: &[T],
    w: &[T],
    dx: &mut [T],
    accumulate: bool,
    scratch: &mut [T],
    cap: usize,
) {
    let (in_len, out_len) = (g.in_len(), g.out_len());
    let per = scratch_len_cap(g, cap);
    let work = n * out_len * g.k_g().max(1);
    by_samples(
        pool,
        n,
        (dy, out_len),
        (dx, in_len),
        scratch,
        per,
        work,
        &|pool, ds, xs, sc| grad_x_sample(pool, g, ds, w, xs, accumulate, sc, cap),
    );
}

/// The input gradient of one sample.
#[allow(clippy::too_many_arguments)]
fn grad_x_sample<T: Real>(
    pool: &dyn WorkerPool,
    g: &ConvGeom,
    ds: &[T],
    w: &[T],
    xs: &mut [T],
    accumulate: bool,
    scratch: &mut [T],
    cap: usize,
) {
    let (ohow, hw) = (g.oh * g.ow, g.h * g.w);
    let (cin_g, cout_g, k) = (g.cin_g(), g.cout_g(), g.k_g());
    let path = g.path();
    if !accumulate && path != Path::Pointwise {
        fill(xs, T::ZERO);
    }
    match path {
        Path::Direct => direct_grad_x(g, ds, w, xs, scratch),
        Path::Pointwise => {
            for gi in 0..g.groups {
                // dX_g[cin_g × hw] = W_gᵀ[cin_g × cout_g] · dY_g[cout_g × hw]
                gemm_par(
                    pool,
                    cin_g,
                    hw,
                    cout_g,
                    MatRef::row_major_t(&w[gi * cout_g * k..], k),
                    MatRef::row_major(&ds[gi * cout_g * ohow..], ohow),
                    &mut xs[gi * cin_g * hw..],
                    hw,
                    accumulate,
                    scratch,
                );
            }
        }
        Path::Im2col => {
            let rows = g.block_rows(cap);
            let (col, gs) = scratch.split_at_mut(k * rows * g.ow);
            for gi in 0..g.groups {
                let wg = &w[gi * cout_g * k..(gi + 1) * cout_g * k];
                let dyg = &ds[gi * cout_g * ohow..(gi + 1) * cout_g * ohow];
                let dxg = &mut xs[gi * cin_g * hw..(gi + 1) * cin_g * hw];
                for oy0 in (0..g.oh).step_by(rows) {
                    let oy1 = (oy0 + rows).min(g.oh);
                    let ncols = (oy1 - oy0) * g.ow;
                    // col[K × ncols] = W_gᵀ[K × cout_g] · dY_block[cout_g × ncols]
                    gemm_par(
                        pool,
                        k,
                        ncols,
                        cout_g,
                        MatRef::row_major_t(wg, k),
                        MatRef {
                            data: &dyg[oy0 * g.ow..],
                            rs: ohow,
                            cs: 1,
                        },
                        &mut col[..k * ncols],
                        ncols,
                        false,
                        gs,
                    );
                    col2im(g, col, oy0, oy1, dxg);
                }
            }
        }
    }
}

// ---- direct kernels (one input channel per group: depthwise and channel multipliers) ----

/// Calls `f(oy, iy, ox_lo, ox_hi, ix0, tap)` for every kernel tap and every output row whose input
/// row is inside the image, with the valid output-column range `[ox_lo, ox_hi)` and its first input
/// column `ix0`. All index arithmetic happens here, once per row.
#[inline(always)]
fn for_each_tap_row(g: &ConvGeom, mut f: impl FnMut(usize, usize, usize, usize, usize, usize)) {
    for i in 0..g.kh {
        let (oyl, oyh) = valid_out(i, g.ph, g.sh, g.h, g.oh);
        for j in 0..g.kw {
            let (oxl, oxh) = valid_out(j, g.pw, g.sw, g.w, g.ow);
            if oxl >= oxh {
                continue;
            }
            let ix0 = oxl * g.sw + j - g.pw;
            for oy in oyl..oyh {
                f(oy, oy * g.sh + i - g.ph, oxl, oxh, ix0, i * g.kw + j);
            }
        }
    }
}

/// The wide-row buffers of one plane (see the module docs): the zero-bordered input plane
/// (`(h + 2ph) × wp`) and the wide output (`oh × wp`).
fn wide_bufs<'s, T: Real>(g: &ConvGeom, scratch: &'s mut [T]) -> (usize, &'s mut [T], &'s mut [T]) {
    let wp = g.w + 2 * g.pw;
    let (pad, rest) = scratch[..g.wide_len()].split_at_mut((g.h + 2 * g.ph) * wp);
    (wp, pad, rest)
}

/// Copies plane `src` (`h × w`) into the interior of the zero-bordered `pad` (borders zeroed too).
fn pad_plane<T: Real>(g: &ConvGeom, src: &[T], pad: &mut [T], wp: usize) {
    fill(pad, T::ZERO);
    for (r, row) in src.chunks_exact(g.w).enumerate() {
        let at = (r + g.ph) * wp + g.pw;
        pad[at..at + g.w].copy_from_slice(row);
    }
}

/// Length of a tap's contiguous run over the wide output: every real output, and the discarded columns
/// in between (not after the last row, which would read past the padded plane).
fn wide_run(g: &ConvGeom, wp: usize) -> usize {
    (g.oh - 1) * wp + g.ow
}

fn direct_fwd<T: Real>(g: &ConvGeom, xs: &[T], w: &[T], ys: &mut [T], scratch: &mut [T]) {
    let (hw, ohow, kk, mult) = (g.h * g.w, g.oh * g.ow, g.kh * g.kw, g.cout_g());
    if g.wide() {
        let (wp, pad, wide) = wide_bufs(g, scratch);
        let run = wide_run(g, wp);
        let mut padded = usize::MAX;
        for (co, (yp, wk)) in ys
            .chunks_exact_mut(ohow)
            .zip(w.chunks_exact(kk))
            .enumerate()
        {
            let ci = co / mult;
            if padded != ci {
                pad_plane(g, &xs[ci * hw..(ci + 1) * hw], pad, wp);
                padded = ci;
            }
            // Start from what the output holds (bias or zero), then add the taps in order.
            for (r, row) in yp.chunks_exact(g.ow).enumerate() {
                wide[r * wp..r * wp + g.ow].copy_from_slice(row);
            }
            for i in 0..g.kh {
                for j in 0..g.kw {
                    let wv = wk[i * g.kw + j];
                    let src = &pad[i * wp + j..i * wp + j + run];
                    for (y, &x) in wide[..run].iter_mut().zip(src) {
                        *y += wv * x;
                    }
                }
            }
            for (r, row) in yp.chunks_exact_mut(g.ow).enumerate() {
                row.copy_from_slice(&wide[r * wp..r * wp + g.ow]);
            }
        }
        return;
    }
    for (co, (yp, wk)) in ys
        .chunks_exact_mut(ohow)
        .zip(w.chunks_exact(kk))
        .enumerate()
    {
        let ci = co / mult;
        let xp = &xs[ci * hw..(ci + 1) * hw];
        for_each_tap_row(g, |oy, iy, oxl, oxh, ix0, t| {
            let wv = wk[t];
            let yr = &mut yp[oy * g.ow + oxl..oy * g.ow + oxh];
            let xr = &xp[iy * g.w + ix0..(iy + 1) * g.w];
            if g.sw == 1 {
                for (y, &x) in yr.iter_mut().zip(xr) {
                    *y += wv * x;
                }
            } else {
                for (y, &x) in yr.iter_mut().zip(xr.iter().step_by(g.sw)) {
                    *y += wv * x;
                }
            }
        });
    }
}

fn direct_grad_w<T: Real>(g: &ConvGeom, xs: &[T], ds: &[T], dw: &mut [T], scratch: &mut [T]) {
    let (hw, ohow, kk, mult) = (g.h * g.w, g.oh * g.ow, g.kh * g.kw, g.cout_g());
    if g.wide() {
        let (wp, pad, wide) = wide_bufs(g, scratch);
        let run = wide_run(g, wp);
        // The wide output gradient: dY's rows with zeros in the discarded columns.
        fill(&mut wide[..], T::ZERO);
        let mut padded = usize::MAX;
        for (co, (dp, dwk)) in ds
            .chunks_exact(ohow)
            .zip(dw.chunks_exact_mut(kk))
            .enumerate()
        {
            let ci = co / mult;
            if padded != ci {
                pad_plane(g, &xs[ci * hw..(ci + 1) * hw], pad, wp);
                padded = ci;
            }
            for (r, row) in dp.chunks_exact(g.ow).enumerate() {
                wide[r * wp..r * wp + g.ow].copy_from_slice(row);
            }
            for i in 0..g.kh {
                for j in 0..g.kw {
                    dwk[i * g.kw + j] += dot(&wide[..run], &pad[i * wp + j..i * wp + j + run]);
                }
            }
        }
        return;
    }
    for (co, (dp, dwk)) in ds
        .chunks_exact(ohow)
        .zip(dw.chunks_exact_mut(kk))
        .enumerate()
    {
        let ci = co / mult;
        let xp = &xs[ci * hw..(ci + 1) * hw];
        for_each_tap_row(g, |oy, iy, oxl, oxh, ix0, t| {
            let dr = &dp[oy * g.ow + oxl..oy * g.ow + oxh];
            let xr = &xp[iy * g.w + ix0..(iy + 1) * g.w];
            dwk[t] += if g.sw == 1 {
                dot(dr, xr)
            } else {
                let mut s = T::ZERO;
                for (&d, &x) in dr.iter().zip(xr.iter().step_by(g.sw)) {
                    s += d * x;
                }
                s
            };
        });
    }
}

fn direct_grad_x<T: Real>(g: &ConvGeom, ds: &[T], w: &[T], dxs: &mut [T], scratch: &mut [T]) {
    let (hw, ohow, kk, mult) = (g.h * g.w, g.oh * g.ow, g.kh * g.kw, g.cout_g());
    if g.wide() {
        let (wp, pad, wide) = wide_bufs(g, scratch);
        let run = wide_run(g, wp);
        fill(&mut wide[..], T::ZERO);
        for (co, (dp, wk)) in ds.chunks_exact(ohow).zip(w.chunks_exact(kk)).enumerate() {
            let ci = co / mult;
            let xp = &mut dxs[ci * hw..(ci + 1) * hw];
            // The padded input gradient starts from what dX holds; the discarded columns of the wide dY
            // are zero, so the border collects only zeros-times-weights and is dropped.
            pad_plane(g, xp, pad, wp);
            for (r, row) in dp.chunks_exact(g.ow).enumerate() {
                wide[r * wp..r * wp + g.ow].copy_from_slice(row);
            }
            for i in 0..g.kh {
                for j in 0..g.kw {
                    let wv = wk[i * g.kw + j];
                    let dst = &mut pad[i * wp + j..i * wp + j + run];
                    for (x, &d) in dst.iter_mut().zip(&wide[..run]) {
                        *x += wv * d;
                    }
                }
            }
            for (r, row) in xp.chunks_exact_mut(g.w).enumerate() {
                let at = (r + g.ph) * wp + g.pw;
                row.copy_from_slice(&pad[at..at + g.w]);
            }
        }
        return;
    }
    for (co, (dp, wk)) in ds.chunks_exact(ohow).zip(w.chunks_exact(kk)).enumerate() {
        let ci = co / mult;
        let xp = &mut dxs[ci * hw..(ci + 1) * hw];
        for_each_tap_row(g, |oy, iy, oxl, oxh, ix0, t| {
            let wv = wk[t];
            let dr = &dp[oy * g.ow + oxl..oy * g.ow + oxh];
            let xr = &mut xp[iy * g.w + ix0..(iy + 1) * g.w];
            if g.sw == 1 {
                for (x, &d) in xr.iter_mut().zip(dr) {
                    *x += wv * d;
                }
            } else {
                for (x, &d) in xr.iter_mut().step_by(g.sw).zip(dr) {
                    *x += wv * d;
                }
            }
        });
    }
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;
    use crate::rng::Rng;

    #[allow(clippy::too_many_arguments)]
    fn geom(
        cin: usize,
        h: usize,
        w: usize,
        cout: usize,
        k: (usize, usize),
        s: (usize, usize),
        p: (usize, usize),
        groups: usize,
    ) -> ConvGeom {
        ConvGeom::new(cin, h, w, cout, k.0, k.1, s.0, s.1, p.0, p.1, groups).unwrap()
    }

    /// (geometry, batch, expected path)
    fn cases() -> Vec<(ConvGeom, usize, Path)> {
        vec![
            // non-square kernel, stride 2 rows, padding, ragged output
            (geom(3, 7, 6, 4, (3, 2), (2, 1), (1, 1), 1), 2, Path::Im2col),
            // groups = 2
            (geom(4, 5, 5, 6, (3, 3), (1, 1), (1, 1), 2), 2, Path::Im2col),
            // depthwise, stride (2,1), non-square kernel, asymmetric padding
            (geom(3, 6, 7, 3, (3, 2), (2, 1), (1, 0), 3), 2, Path::Direct),
            // depthwise with channel multiplier 2, horizontal stride 2
            (geom(2, 5, 6, 4, (2, 3), (1, 2), (0, 1), 2), 2, Path::Direct),
            // pointwise, plain and grouped
            (
                geom(3, 4, 5, 5, (1, 1), (1, 1), (0, 0), 1),
                3,
                Path::Pointwise,
            ),
            (
                geom(4, 4, 3, 6, (1, 1), (1, 1), (0, 0), 2),
                2,
                Path::Pointwise,
            ),
            // stride 2 both ways, padding 2 (> kernel/2)
            (geom(2, 8, 5, 3, (3, 3), (2, 2), (2, 1), 1), 2, Path::Im2col),
            // 1×1 with stride 2 goes through im2col (subsampling)
            (geom(3, 5, 5, 2, (1, 1), (2, 2), (0, 0), 1), 2, Path::Im2col),
            // padding ≥ kernel: whole output rows/columns see only padding
            (geom(1, 3, 3, 2, (2, 2), (1, 1), (2, 2), 1), 2, Path::Im2col),
            // depthwise with padding ≥ kernel
            (geom(2, 3, 4, 2, (2, 2), (2, 1), (2, 2), 2), 1, Path::Direct),
            // depthwise at stride 1 (wide rows): 3×3 "same", and non-square kernel with asymmetric
            // padding and a channel multiplier of 2
            (geom(3, 6, 7, 3, (3, 3), (1, 1), (1, 1), 3), 2, Path::Direct),
            (geom(2, 5, 6, 4, (2, 3), (1, 1), (0, 2), 2), 2, Path::Direct),
            // padding ≥ kernel at stride 1
            (geom(2, 3, 4, 2, (2, 2), (1, 1), (2, 2), 2), 1, Path::Direct),
            // depthwise 1×1 (no wide rows)
            (geom(2, 4, 3, 2, (1, 1), (1, 1), (0, 0), 2), 2, Path::Direct),
        ]
    }

    struct Data {
        x: Vec<f64>,
        w: Vec<f64>,
        b: Vec<f64>,
        r: Vec<f64>,
    }

    fn data(rng: &mut Rng, g: &ConvGeom, n: usize) -> Data {
        Data {
            x: rand_vec(rng, n * g.in_len(), -1.0, 1.0),
            w: rand_vec(rng, g.weight_len(), -1.0, 1.0),
            b: rand_vec(rng, g.cout, -1.0, 1.0),
            r: rand_vec(rng, n * g.out_len(), -1.0, 1.0),
        }
    }

    fn fwd<T: Real>(
        g: &ConvGeom,
        n: usize,
        x: &[T],
        w: &[T],
        b: Option<&[T]>,
        cap: usize,
    ) -> Vec<T> {
        let mut y = vec![T::from_f32(f32::NAN); n * g.out_len()];
        let mut s = vec![T::ZERO; scratch_len_cap(g, cap)];
        fwd_cap(&SingleThread, g, n, x, w, b, &mut y, &mut s, cap);
        y
    }

    fn grad_w<T: Real>(g: &ConvGeom, n: usize, x: &[T], dy: &[T], cap: usize) -> (Vec<T>, Vec<T>) {
        let mut dw = vec![T::from_f32(f32::NAN); g.weight_len()];
        let mut db = vec![T::from_f32(f32::NAN); g.cout];
        let mut s = vec![T::ZERO; scratch_len_cap(g, cap)];
        grad_w_cap(
            &SingleThread,
            g,
            n,
            x,
            dy,
            Some(&mut dw),
            Some(&mut db),
            g.cout,
            false,
            &mut s,
            cap,
        );
        (dw, db)
    }

    fn grad_x<T: Real>(
        g: &ConvGeom,
        n: usize,
        dy: &[T],
        w: &[T],
        pre: Option<&[T]>,
        cap: usize,
    ) -> Vec<T> {
        let mut dx = match pre {
            Some(p) => p.to_vec(),
            None => vec![T::from_f32(f32::NAN); n * g.in_len()],
        };
        let mut s = vec![T::ZERO; scratch_len_cap(g, cap)];
        grad_x_cap(
            &SingleThread,
            g,
            n,
            dy,
            w,
            &mut dx,
            pre.is_some(),
            &mut s,
            cap,
        );
        dx
    }

    /// Caps to exercise: the production one, one row per block, and two rows per block (ragged last).
    fn caps(g: &ConvGeom) -> [usize; 3] {
        [CONV_COL_CAP, 1, 2 * g.k_g() * g.ow]
    }

    #[test]
    fn geometry_validation() {
        let g = geom(3, 7, 6, 4, (3, 2), (2, 1), (1, 1), 1);
        assert_eq!((g.oh, g.ow), (4, 7));
        assert!(
            ConvGeom::new(3, 4, 4, 4, 3, 3, 1, 1, 0, 0, 2).is_none(),
            "groups ∤ cin"
        );
        assert!(
            ConvGeom::new(4, 4, 4, 3, 3, 3, 1, 1, 0, 0, 2).is_none(),
            "groups ∤ cout"
        );
        assert!(
            ConvGeom::new(1, 2, 2, 1, 3, 1, 1, 1, 0, 0, 1).is_none(),
            "kernel > input"
        );
        assert!(
            ConvGeom::new(1, 2, 2, 1, 3, 1, 1, 1, 1, 0, 1).is_some(),
            "fits once padded"
        );
        assert!(
            ConvGeom::new(1, 2, 2, 1, 1, 1, 0, 1, 0, 0, 1).is_none(),
            "zero stride"
        );
        assert!(
            ConvGeom::new(1, 2, 2, 1, 1, 1, 1, 1, usize::MAX, 0, 1).is_none(),
            "overflow"
        );
        for (g, _, p) in cases() {
            assert_eq!(g.path(), p, "{g:?}");
        }
    }

    #[test]
    fn valid_out_ranges() {
        // Brute force against the definition.
        for k in 0..4 {
            for p in 0..4 {
                for s in 1..4 {
                    for len in 1..7usize {
                        let out = (len + 2 * p).saturating_sub(k) / s + 1;
                        let (lo, hi) = valid_out(k, p, s, len, out);
                        let ok: Vec<usize> = (0..out)
                            .filter(|&o| o * s + k >= p && o * s + k - p < len)
                            .collect();
                        let got: Vec<usize> = (lo..hi).collect();
                        assert_eq!(got, ok, "k{k} p{p} s{s} len{len}");
                    }
                }
            }
        }
    }

    #[test]
    fn scratch_is_bounded_and_batch_independent() {
        // A 64-channel 3×3 conv on 224×224 would need 576·50176 elements unfolded whole.
        let g = geom(64, 224, 224, 64, (3, 3), (1, 1), (1, 1), 1);
        let k = 64 * 9;
        let col = k * 224; // one output row (k·ow > cap)
        assert!(conv_scratch_len(&g, 1) >= col);
        assert!(conv_scratch_len(&g, 1) <= col + g.pad_len(1) + gemm3(64, 224, k));
        assert_eq!(g.pad_len(1), 64 * 3 * 226);
        assert_eq!(conv_scratch_len(&g, 1), conv_scratch_len(&g, 4096));
        let small = geom(6, 12, 12, 16, (5, 5), (1, 1), (0, 0), 1);
        assert!(conv_scratch_len(&small, 64) <= CONV_COL_CAP + gemm3(16, 64, 150));
        // Depthwise: the wide-row buffers at stride 1 (padded plane 11×11, wide output 9×11), none
        // with a stride or for 1×1.
        assert_eq!(
            conv_scratch_len(&geom(8, 9, 9, 8, (3, 3), (1, 1), (1, 1), 8), 32),
            11 * 11 + 9 * 11
        );
        assert_eq!(
            conv_scratch_len(&geom(8, 9, 9, 8, (3, 3), (2, 2), (1, 1), 8), 32),
            0
        );
        assert_eq!(
            conv_scratch_len(&geom(8, 9, 9, 8, (1, 1), (1, 1), (0, 0), 8), 32),
            0
        );
    }

    #[test]
    fn fd_gradients_all_paths() {
        let mut rng = Rng::new(60);
        for (g, n, _) in cases() {
            let d = data(&mut rng, &g, n);
            let pre = rand_vec(&mut rng, n * g.in_len(), -1.0, 1.0);
            let cap = CONV_COL_CAP;
            let loss =
                |x: &[f64], w: &[f64], b: &[f64]| dotf(&fwd(&g, n, x, w, Some(b), cap), &d.r);
            let fx = fd_grad(&d.x, |x| loss(x, &d.w, &d.b));
            let fw = fd_grad(&d.w, |w| loss(&d.x, w, &d.b));
            let fb = fd_grad(&d.b, |b| loss(&d.x, &d.w, b));
            for cap in caps(&g) {
                let (dw, db) = grad_w(&g, n, &d.x, &d.r, cap);
                let dx = grad_x(&g, n, &d.r, &d.w, None, cap);
                let dacc = grad_x(&g, n, &d.r, &d.w, Some(&pre), cap);
                let what = format!("{g:?} cap {cap}");
                assert_close(&format!("dx {what}"), &dx, &fx, FD_TOL, FD_FLOOR);
                assert_close(
                    &format!("dx acc {what}"),
                    &sub(&dacc, &pre),
                    &fx,
                    FD_TOL,
                    FD_FLOOR,
                );
                assert_close(&format!("dw {what}"), &dw, &fw, FD_TOL, FD_FLOOR);
                assert_close(&format!("db {what}"), &db, &fb, FD_TOL, FD_FLOOR);
                // Blocking only regroups the same exact products: forwards agree to rounding.
                let y0 = fwd(&g, n, &d.x, &d.w, Some(&d.b), CONV_COL_CAP);
                let y1 = fwd(&g, n, &d.x, &d.w, Some(&d.b), cap);
                assert_close(&format!("y blocked {what}"), &y1, &y0, 1e-13, 1e-3);
            }
        }
    }

    /// Naive 7-loop reference convolution (f64).
    fn reference(g: &ConvGeom, n: usize, x: &[f64], w: &[f64], b: &[f64]) -> Vec<f64> {
        let mut y = vec![0.0; n * g.out_len()];
        let (cin_g, cout_g) = (g.cin_g(), g.cout_g());
        for s in 0..n {
            for co in 0..g.cout {
                let gi = co / cout_g;
                for oy in 0..g.oh {
                    for ox in 0..g.ow {
                        let mut acc = b[co];
                        for c in 0..cin_g {
                            for i in 0..g.kh {
                                for j in 0..g.kw {
                                    let iy = (oy * g.sh + i) as isize - g.ph as isize;
                                    let ix = (ox * g.sw + j) as isize - g.pw as isize;
                                    if iy < 0 || ix < 0 || iy >= g.h as isize || ix >= g.w as isize
                                    {
                                        continue;
                                    }
                                    let ci = gi * cin_g + c;
                                    acc += w[((co * cin_g + c) * g.kh + i) * g.kw + j]
                                        * x[((s * g.cin + ci) * g.h + iy as usize) * g.w
                                            + ix as usize];
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

    #[test]
    fn forward_matches_naive_reference() {
        let mut rng = Rng::new(61);
        for (g, n, _) in cases() {
            let d = data(&mut rng, &g, n);
            let want = reference(&g, n, &d.x, &d.w, &d.b);
            for cap in caps(&g) {
                let got = fwd(&g, n, &d.x, &d.w, Some(&d.b), cap);
                assert_close(&format!("fwd {g:?}"), &got, &want, 1e-13, 1e-3);
            }
            let zero = vec![0.0; g.cout];
            let got = fwd(&g, n, &d.x, &d.w, None, CONV_COL_CAP);
            assert_close(
                "fwd no bias",
                &got,
                &reference(&g, n, &d.x, &d.w, &zero),
                1e-13,
                1e-3,
            );
        }
    }

    #[test]
    fn f32_matches_f64() {
        // Rigorous per-element bound: a sum of m products computed in f32 in any order (blocked, FMA or
        // not) differs from the exact sum by at most γ_m·Σ|terms|, γ_m = m·u/(1−m·u), u = 2^-24. The
        // inputs are f32-representable, so the f64 result is exact to ~1e-16 relative; Σ|terms| is the
        // same op evaluated on |x|, |w|, |dy| in f64.
        let mut rng = Rng::new(62);
        let u = 1.0 / (1u64 << 24) as f64;
        let check = |what: &str, got: &[f32], want: &[f64], absref: &[f64], m: usize| {
            let gamma = m as f64 * u / (1.0 - m as f64 * u);
            for i in 0..want.len() {
                let err = (got[i] as f64 - want[i]).abs();
                assert!(
                    err <= gamma * absref[i] + 1e-30,
                    "{what}[{i}]: err {err:e} bound {:e}",
                    gamma * absref[i]
                );
            }
        };
        let abs = |v: &[f64]| v.iter().map(|a| a.abs()).collect::<Vec<_>>();
        for (g, n, _) in cases() {
            let d = data(&mut rng, &g, n);
            let (x32, w32, b32, r32) = (to_f32(&d.x), to_f32(&d.w), to_f32(&d.b), to_f32(&d.r));
            let (ax, aw, ab, ar) = (abs(&d.x), abs(&d.w), abs(&d.b), abs(&d.r));
            for cap in caps(&g) {
                let y = fwd(&g, n, &d.x, &d.w, Some(&d.b), cap);
                let y32 = fwd(&g, n, &x32, &w32, Some(&b32), cap);
                let yabs = fwd(&g, n, &ax, &aw, Some(&ab), cap);
                check("y", &y32, &y, &yabs, g.k_g() + 2);

                let (dw, db) = grad_w(&g, n, &d.x, &d.r, cap);
                let (dw32, db32) = grad_w(&g, n, &x32, &r32, cap);
                let (dwabs, dbabs) = grad_w(&g, n, &ax, &ar, cap);
                check("dw", &dw32, &dw, &dwabs, n * g.oh * g.ow + 2);
                check("db", &db32, &db, &dbabs, n * g.oh * g.ow + 2);

                let dx = grad_x(&g, n, &d.r, &d.w, None, cap);
                let dx32 = grad_x(&g, n, &r32, &w32, None, cap);
                let dxabs = grad_x(&g, n, &ar, &aw, None, cap);
                check("dx", &dx32, &dx, &dxabs, g.cout_g() * g.kh * g.kw + 2);
            }
        }
    }

    #[test]
    fn hand_computed_2x2() {
        // x = [[1 2 3] [4 5 6] [7 8 9]], W = [[1 2] [3 4]], b = 0.5.
        let g = geom(1, 3, 3, 1, (2, 2), (1, 1), (0, 0), 1);
        let x: Vec<f32> = (1..=9).map(|v| v as f32).collect();
        let w = [1.0f32, 2.0, 3.0, 4.0];
        let y = fwd(&g, 1, &x, &w, Some(&[0.5]), CONV_COL_CAP);
        assert_eq!(y, [37.5, 47.5, 67.5, 77.5]);
        let (dw, db) = grad_w(&g, 1, &x, &[1.0; 4], CONV_COL_CAP);
        assert_eq!(dw, [12.0, 16.0, 24.0, 28.0]);
        assert_eq!(db, [4.0]);
        let dx = grad_x(&g, 1, &[1.0; 4], &w, None, CONV_COL_CAP);
        assert_eq!(dx, [1.0, 3.0, 2.0, 4.0, 10.0, 6.0, 3.0, 7.0, 4.0]);
        // Same numbers through the direct kernel: two depthwise channels, second one all zeros.
        let gd = geom(2, 3, 3, 2, (2, 2), (1, 1), (0, 0), 2);
        let mut x2 = x.clone();
        x2.extend([0.0f32; 9]);
        let y = fwd(
            &gd,
            1,
            &x2,
            &[1.0, 2.0, 3.0, 4.0, 1.0, 1.0, 1.0, 1.0],
            Some(&[0.5, 0.0]),
            CONV_COL_CAP,
        );
        assert_eq!(y, [37.5, 47.5, 67.5, 77.5, 0.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn empty_batch() {
        let g = geom(3, 5, 5, 4, (3, 3), (1, 1), (1, 1), 1);
        let (dw, db) = grad_w::<f32>(&g, 0, &[], &[], CONV_COL_CAP);
        assert!(dw.iter().chain(&db).all(|&v| v == 0.0));
        assert!(fwd::<f32>(&g, 0, &[], &[0.0; 108], None, CONV_COL_CAP).is_empty());
    }

    /// Every path and phase on 2, 3 and 4 workers equals one worker bit for bit: samples split when the
    /// scratch has a copy per worker, GEMM rows split when it has one (and in the weight gradient).
    #[test]
    fn threads_give_identical_bits() {
        use crate::kernels::par::testing::Scoped;
        let mut rng = Rng::new(11);
        let mut cases = cases();
        cases.push((
            geom(3, 19, 21, 5, (3, 3), (2, 2), (1, 1), 1),
            5,
            Path::Im2col,
        ));
        cases.push((
            geom(8, 9, 10, 16, (1, 1), (1, 1), (0, 0), 1),
            7,
            Path::Pointwise,
        ));
        for (g, n0, _) in cases {
            for n in [n0, 2 * n0 + 1] {
                let d = data(&mut rng, &g, n);
                let (x, w, b, r) = (to_f32(&d.x), to_f32(&d.w), to_f32(&d.b), to_f32(&d.r));
                for cap in caps(&g) {
                    let per = scratch_len_cap(&g, cap);
                    let run = |pool: &dyn WorkerPool, len: usize| {
                        let mut s = vec![0.0f32; len];
                        let mut y = vec![f32::NAN; n * g.out_len()];
                        fwd_cap(pool, &g, n, &x, &w, Some(&b), &mut y, &mut s, cap);
                        let mut dw = vec![f32::NAN; g.weight_len()];
                        let mut db = vec![f32::NAN; g.cout];
                        grad_w_cap(
                            pool,
                            &g,
                            n,
                            &x,
                            &r,
                            Some(&mut dw),
                            Some(&mut db),
                            g.cout,
                            false,
                            &mut s,
                            cap,
                        );
                        let mut dx = vec![f32::NAN; n * g.in_len()];
                        grad_x_cap(pool, &g, n, &r, &w, &mut dx, false, &mut s, cap);
                        let mut dxa = x.clone();
                        grad_x_cap(pool, &g, n, &r, &w, &mut dxa, true, &mut s, cap);
                        [y, dw, db, dx, dxa]
                    };
                    let want = run(&SingleThread, per);
                    for threads in [2usize, 3, 4] {
                        for len in [per, per * threads, per * threads + 7] {
                            let got = run(&Scoped(threads), len);
                            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                                let same = a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits());
                                assert!(
                                    same,
                                    "{g:?} n={n} cap={cap} t={threads} len={len} output {i}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
