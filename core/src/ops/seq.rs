//! Sequence layers on `[n, t, d]` tensors (row-major; `rows = n·t` token rows of `d` features):
//! token embedding, learned positional embedding, LayerNorm and RMSNorm over the last axis, GELU and
//! SiLU, causal multi-head self-attention and a Linear with LoRA adapters. Forward and backward, generic
//! over [`Real`](crate::kernels::Real) like every op; temporary storage comes from caller-provided scratch whose length is
//! given by the `*_scratch_len` functions (never proportional to the batch, except LoRA's rank-sized
//! rows, which the graph sizes per batch).
//!
//! Token ids arrive as the model input (f32 values holding integers); [`check_ids`] validates them
//! (the backend calls it before any op reads them) and the ops index with `id as usize`, bounds-checked.
//!
//! The kernels are built with the core's `seq` feature (on by default); the geometry, the scratch sizes
//! and [`check_ids`] always are, so the graph and the backends can name these layers and refuse them
//! in a build without it.
use crate::kernels::gemm_scratch_len;
#[cfg(feature = "seq")]
use crate::kernels::{gemm, vector, MatRef, Real};
#[cfg(feature = "seq")]
use crate::ops::linear_grad_w_rows_par;
#[cfg(feature = "seq")]
use crate::pool::WorkerPool;

// ---------------------------------------------------------------------------------------------------
// Embeddings
// ---------------------------------------------------------------------------------------------------

/// The first id that is not an integer in `0..vocab`, with its index.
pub fn check_ids(ids: &[f32], vocab: usize) -> Result<(), (usize, f32)> {
    match ids
        .iter()
        .position(|&v| !(v >= 0.0 && v < vocab as f32 && (v as u32) as f32 == v))
    {
        Some(i) => Err((i, ids[i])),
        None => Ok(()),
    }
}

/// `y[r] = table[ids[r]]` for every token row `r` (`dim` features per row).
#[cfg(feature = "seq")]
pub fn embedding_fwd<T: Real>(ids: &[f32], table: &[T], dim: usize, y: &mut [T]) {
    for (row, &id) in y.chunks_exact_mut(dim.max(1)).zip(ids) {
        let id = id as usize;
        row.copy_from_slice(&table[id * dim..(id + 1) * dim]);
    }
}

/// `dW[ids[r]] += dy[r]`: only the rows of the tokens seen are touched by the scatter (the rest of the
/// gradient is zeroed when not `accumulate`, so the optimizer sees PyTorch's dense gradient).
#[cfg(feature = "seq")]
pub fn embedding_grad_w<T: Real>(
    ids: &[f32],
    dy: &[T],
    dim: usize,
    dw: &mut [T],
    accumulate: bool,
) {
    if !accumulate {
        dw.iter_mut().for_each(|v| *v = T::ZERO);
    }
    for (row, &id) in dy.chunks_exact(dim.max(1)).zip(ids) {
        let id = id as usize;
        for (d, &g) in dw[id * dim..(id + 1) * dim].iter_mut().zip(row) {
            *d += g;
        }
    }
}

/// `y[b, t] = x[b, t] + p[t]` for `n` sequences of `per = t·d` elements.
#[cfg(feature = "seq")]
pub fn pos_fwd<T: Real>(n: usize, per: usize, x: &[T], p: &[T], y: &mut [T]) {
    for (ys, xs) in y[..n * per].chunks_exact_mut(per).zip(x.chunks_exact(per)) {
        for ((y, &x), &p) in ys.iter_mut().zip(xs).zip(p) {
            *y = x + p;
        }
    }
}

/// [`pos_fwd`] in place (`y` holds `x`).
#[cfg(feature = "seq")]
pub fn pos_fwd_inplace<T: Real>(n: usize, per: usize, p: &[T], y: &mut [T]) {
    for ys in y[..n * per].chunks_exact_mut(per) {
        for (y, &p) in ys.iter_mut().zip(p) {
            *y += p;
        }
    }
}

/// `dp = Σ_b dy[b]` (added into `dp` when `accumulate`).
#[cfg(feature = "seq")]
pub fn pos_grad_w<T: Real>(n: usize, per: usize, dy: &[T], dp: &mut [T], accumulate: bool) {
    let dp = &mut dp[..per];
    if !accumulate {
        dp.iter_mut().for_each(|v| *v = T::ZERO);
    }
    for ds in dy[..n * per].chunks_exact(per) {
        for (d, &g) in dp.iter_mut().zip(ds) {
            *d += g;
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// LayerNorm / RMSNorm over the last axis
// ---------------------------------------------------------------------------------------------------

/// LayerNorm (`mean = Some`) or RMSNorm (`mean = None`) of `rows` rows of `dim`: `y = x̂·γ (+ β)` with
/// `x̂ = (x − μ)·rstd` (LayerNorm, biased variance like PyTorch) or `x̂ = x·rstd`, `rstd = 1/√(var + ε)`
/// resp. `1/√(mean(x²) + ε)`. Saves `μ` and `rstd` per row for the backward.
#[allow(clippy::too_many_arguments)]
#[cfg(feature = "seq")]
pub fn norm_fwd<T: Real>(
    rows: usize,
    dim: usize,
    eps: f32,
    x: &[T],
    g: &[T],
    b: Option<&[T]>,
    y: &mut [T],
    mut mean: Option<&mut [T]>,
    rstd: &mut [T],
) {
    let inv_d = T::ONE / T::from_usize(dim.max(1));
    let eps = T::from_f32(eps);
    for r in 0..rows {
        let xs = &x[r * dim..(r + 1) * dim];
        let ys = &mut y[r * dim..(r + 1) * dim];
        // Both sums in `vector::sum_map`'s lane order: a row is eight chains, not one.
        let mu = match mean.as_deref_mut() {
            Some(m) => {
                m[r] = vector::sum_map(xs, |v| v) * inv_d;
                m[r]
            }
            None => T::ZERO,
        };
        let ss = vector::sum_map(xs, |v| {
            let c = v - mu;
            c * c
        });
        let rs = T::ONE / (ss * inv_d + eps).sqrt();
        rstd[r] = rs;
        for (j, (y, &v)) in ys.iter_mut().zip(xs).enumerate() {
            let h = (v - mu) * rs * g[j];
            *y = match b {
                Some(b) => h + b[j],
                None => h,
            };
        }
    }
}

/// `dγ = Σ_rows dy·x̂`, `dβ = Σ_rows dy` (added when `accumulate`).
#[allow(clippy::too_many_arguments)]
#[cfg(feature = "seq")]
pub fn norm_grad_w<T: Real>(
    rows: usize,
    dim: usize,
    x: &[T],
    dy: &[T],
    mean: Option<&[T]>,
    rstd: &[T],
    dg: &mut [T],
    db: Option<&mut [T]>,
    accumulate: bool,
) {
    let dg = &mut dg[..dim];
    if !accumulate {
        dg.iter_mut().for_each(|v| *v = T::ZERO);
    }
    for r in 0..rows {
        let mu = mean.map_or(T::ZERO, |m| m[r]);
        let rs = rstd[r];
        let xs = &x[r * dim..(r + 1) * dim];
        let ds = &dy[r * dim..(r + 1) * dim];
        for ((d, &v), &g) in dg.iter_mut().zip(xs).zip(ds) {
            *d += g * ((v - mu) * rs);
        }
    }
    if let Some(db) = db {
        let db = &mut db[..dim];
        if !accumulate {
            db.iter_mut().for_each(|v| *v = T::ZERO);
        }
        for ds in dy[..rows * dim].chunks_exact(dim.max(1)) {
            for (d, &g) in db.iter_mut().zip(ds) {
                *d += g;
            }
        }
    }
}

/// `dx = rstd·(γ·dy − mean(γ·dy) − x̂·mean(γ·dy·x̂))` (LayerNorm; RMSNorm drops the middle term).
#[allow(clippy::too_many_arguments)]
#[cfg(feature = "seq")]
pub fn norm_grad_x<T: Real>(
    rows: usize,
    dim: usize,
    x: &[T],
    dy: &[T],
    g: &[T],
    mean: Option<&[T]>,
    rstd: &[T],
    dx: &mut [T],
    accumulate: bool,
) {
    let inv_d = T::ONE / T::from_usize(dim.max(1));
    for r in 0..rows {
        let mu = mean.map_or(T::ZERO, |m| m[r]);
        let rs = rstd[r];
        let xs = &x[r * dim..(r + 1) * dim];
        let ds = &dy[r * dim..(r + 1) * dim];
        let (s1, s2) = vector::sum2_zip3(&g[..dim], ds, xs, |g, d, x| {
            let gd = g * d;
            (gd, gd * ((x - mu) * rs))
        });
        let m1 = if mean.is_some() { s1 * inv_d } else { T::ZERO };
        let m2 = s2 * inv_d;
        let dxs = &mut dx[r * dim..(r + 1) * dim];
        for j in 0..dim {
            let v = rs * (g[j] * ds[j] - m1 - (xs[j] - mu) * rs * m2);
            if accumulate {
                dxs[j] += v;
            } else {
                dxs[j] = v;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// GELU, SiLU (their derivatives need the input, so they never run in place)
// ---------------------------------------------------------------------------------------------------

/// An activation whose derivative is a function of its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Smooth {
    /// `x·Φ(x) = ½x(1 + erf(x/√2))` (PyTorch's exact `nn.GELU()`).
    Gelu,
    /// `x·σ(x)` (`nn.SiLU`).
    Silu,
}

#[cfg(feature = "seq")]
const FRAC_1_SQRT_2: f32 = core::f32::consts::FRAC_1_SQRT_2;
/// 1/√(2π).
#[cfg(feature = "seq")]
const INV_SQRT_2PI: f32 = 0.398_942_3;

/// `y = a(x)`.
#[cfg(feature = "seq")]
pub fn smooth_fwd<T: Real>(a: Smooth, x: &[T], y: &mut [T]) {
    let half = T::from_f32(0.5);
    match a {
        Smooth::Gelu => vector::map(x, y, |x| {
            half * x * (T::ONE + (x * T::from_f32(FRAC_1_SQRT_2)).erf())
        }),
        Smooth::Silu => vector::map(x, y, |x| x / (T::ONE + (-x).exp())),
    }
}

/// `a'(x)`.
#[cfg(feature = "seq")]
#[inline(always)]
fn smooth_slope<T: Real>(a: Smooth, x: T) -> T {
    let half = T::from_f32(0.5);
    match a {
        Smooth::Gelu => {
            let cdf = half * (T::ONE + (x * T::from_f32(FRAC_1_SQRT_2)).erf());
            cdf + x * T::from_f32(INV_SQRT_2PI) * (-half * x * x).exp_nonpos()
        }
        Smooth::Silu => {
            let s = T::ONE / (T::ONE + (-x).exp());
            s * (T::ONE + x * (T::ONE - s))
        }
    }
}

/// `dx = a'(x)·dy` (added when `accumulate`).
#[cfg(feature = "seq")]
pub fn smooth_grad<T: Real>(a: Smooth, x: &[T], dy: &[T], dx: &mut [T], accumulate: bool) {
    for ((d, &x), &g) in dx.iter_mut().zip(x).zip(dy) {
        let k = smooth_slope(a, x);
        if accumulate {
            *d += k * g;
        } else {
            *d = k * g;
        }
    }
}

/// [`smooth_grad`] in place over `dy` (the derivative's storage shared with the output's): `d =
/// a'(x)·d`, the same bits.
#[cfg(feature = "seq")]
pub fn smooth_grad_inplace<T: Real>(a: Smooth, x: &[T], d: &mut [T]) {
    // One loop per activation, so that each vectorises without the match inside.
    match a {
        Smooth::Gelu => vector::zip_inplace(x, d, |x, d| smooth_slope(Smooth::Gelu, x) * d),
        Smooth::Silu => vector::zip_inplace(x, d, |x, d| smooth_slope(Smooth::Silu, x) * d),
    }
}

/// Rows of the recomputed activation [`linear_act_grad_w_par`] holds at once: the GEMM's depth
/// block (256), so over a multiple of it the tiles' products add up in the order of one product over
/// every row.
pub const ACT_TILE_ROWS: usize = 256;

/// Elements of [`linear_act_grad_w_par`]'s tile of the recomputed activation for `rows` rows of `fin`
/// (the front of its scratch; the GEMM's room follows).
pub fn act_tile_len(rows: usize, fin: usize) -> usize {
    rows.min(ACT_TILE_ROWS).saturating_mul(fin)
}

/// The weight gradient of a Linear whose input is `a(h)`, from the activation's input `h` `[n, fin]`
/// instead of `a(h)` ([`crate::graph::Node::act_in`]): `a(h)` is recomputed [`ACT_TILE_ROWS`] rows at a
/// time into the front of `scratch` and each tile's `dYᵀ·a(h)` added into `dw` — the leading `rows`
/// outputs, as [`crate::ops::linear_grad_w_rows_par`], which it equals on `a(h)` up to the blocking
/// of the sums (none over a multiple of the tile). `db = Σ_rows dY`. So `a(h)` need not be kept from
/// the forward pass. `scratch`: [`act_tile_len`] elements, then the GEMM's.
#[cfg(feature = "seq")]
#[allow(clippy::too_many_arguments)]
pub fn linear_act_grad_w_par<T: Real>(
    pool: &dyn WorkerPool,
    a: Smooth,
    n: usize,
    fin: usize,
    fout: usize,
    rows: usize,
    h: &[T],
    dy: &[T],
    dw: Option<&mut [T]>,
    db: Option<&mut [T]>,
    accumulate: bool,
    scratch: &mut [T],
) {
    let (tile, room) = scratch.split_at_mut(act_tile_len(n, fin));
    if let Some(dw) = dw {
        if n == 0 {
            // The GEMM's own k = 0 case: zero (or unchanged when accumulating).
            linear_grad_w_rows_par(
                pool,
                0,
                fin,
                fout,
                rows,
                &[],
                &[],
                Some(dw),
                None,
                accumulate,
                room,
            );
        }
        for (i, r0) in (0..n).step_by(ACT_TILE_ROWS).enumerate() {
            let r1 = (r0 + ACT_TILE_ROWS).min(n);
            let t = &mut tile[..(r1 - r0) * fin];
            smooth_fwd(a, &h[r0 * fin..r1 * fin], t);
            linear_grad_w_rows_par(
                pool,
                r1 - r0,
                fin,
                fout,
                rows,
                t,
                &dy[r0 * fout..r1 * fout],
                Some(&mut *dw),
                None,
                accumulate || i > 0,
                room,
            );
        }
    }
    if db.is_some() {
        linear_grad_w_rows_par(
            pool,
            n,
            fin,
            fout,
            rows,
            &[],
            dy,
            None,
            db,
            accumulate,
            room,
        );
    }
}

// ---------------------------------------------------------------------------------------------------
// Causal multi-head self-attention
// ---------------------------------------------------------------------------------------------------

/// Query rows of the score matrix attention computes at once (a tile: its scores against the causal
/// keys only, `0..=` its last row). Both modes ([`AttnGeom::recompute_probs`]) compute the
/// probabilities tile by tile with the same products in the same order, so they give the same bits;
/// in recompute mode the backward regenerates one tile at a time into a scratch of
/// `ATTN_TILE_ROWS × seq` elements instead of reading a saved `[n, heads, seq, seq]` matrix.
pub const ATTN_TILE_ROWS: usize = 16;

/// Geometry of causal self-attention: input `qkv` `[n, seq, 3·dim]` (queries, keys, values side by side,
/// each `heads` heads of `dim/heads`), output `[n, seq, dim]`, and what the forward saves for the
/// backward: the probabilities `[n, heads, seq, seq]`, or in recompute mode only each query row's
/// softmax statistics `[n, heads, seq, 2]` (row maximum of the scaled scores, sum of exponentials).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnGeom {
    /// Sequence length.
    pub seq: usize,
    /// Model width (heads × head width).
    pub dim: usize,
    /// Heads.
    pub heads: usize,
    /// Recompute mode: save the row statistics (`2·heads·seq` a sample, 2 KiB for the char
    /// transformer's block against 64 KiB of probabilities) and recompute the probabilities tile by tile
    /// in the backward (one more `Q·Kᵀ` tile product and its exponentials: about a quarter more
    /// attention FLOPs). The same bits as the saving mode.
    pub recompute_probs: bool,
}

impl AttnGeom {
    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.dim / self.heads.max(1)
    }
    /// Elements of one sample's probabilities.
    pub fn probs_per_sample(&self) -> usize {
        self.heads * self.seq * self.seq
    }
    /// Elements of one sample's row statistics (recompute mode).
    pub fn rowstats_per_sample(&self) -> usize {
        2 * self.heads * self.seq
    }
    /// Elements one sample saves for the backward: its probabilities, or in recompute mode its row
    /// statistics.
    pub fn saved_per_sample(&self) -> usize {
        if self.recompute_probs {
            self.rowstats_per_sample()
        } else {
            self.probs_per_sample()
        }
    }
    /// Elements of one tile of probabilities (or of their derivatives): [`ATTN_TILE_ROWS`] rows of
    /// `seq`.
    pub fn tile_len(&self) -> usize {
        ATTN_TILE_ROWS.min(self.seq) * self.seq
    }
}

/// GEMM packing room of any tile product: `S = Q·Kᵀ` and `dP = dO·Vᵀ` (`rows × keys × dh`),
/// `O = P·V` and `dQ = dS·K` (`rows × dh × keys`), `dV = Pᵀ·dO` and `dK = dSᵀ·Q` (`keys × dh × rows`).
/// Every product gets at least its own room, so its blocking, hence its bits, do not depend on the
/// mode.
fn attention_gemm_scratch_len(g: &AttnGeom) -> usize {
    let (t, dh) = (g.seq, g.head_dim());
    let r = ATTN_TILE_ROWS.min(t);
    gemm_scratch_len(r, t, dh)
        .max(gemm_scratch_len(r, dh, t))
        .max(gemm_scratch_len(t, dh, r))
}

/// Scratch elements of the forward: GEMM packing, after one tile of probabilities in recompute mode.
pub fn attention_fwd_scratch_len(g: &AttnGeom) -> usize {
    let tile = if g.recompute_probs { g.tile_len() } else { 0 };
    tile + attention_gemm_scratch_len(g)
}

/// Scratch elements of the backward: one tile of `dP`, one of recomputed probabilities in recompute
/// mode, and GEMM packing (never proportional to the batch, and in recompute mode not to `seq²`
/// either).
pub fn attention_bwd_scratch_len(g: &AttnGeom) -> usize {
    let tiles = if g.recompute_probs { 2 } else { 1 };
    tiles * g.tile_len() + attention_gemm_scratch_len(g)
}

/// The scaled, masked scores of query rows `i0..i1` of head `h` against keys `0..i1` into `pt` (row
/// stride `seq`): `S = Q·Kᵀ` for that tile. `xb`: one sample's `qkv`.
#[cfg(feature = "seq")]
fn attn_scores_tile<T: Real>(
    g: &AttnGeom,
    xb: &[T],
    h: usize,
    i0: usize,
    i1: usize,
    pt: &mut [T],
    room: &mut [T],
) {
    let (t, d, dh) = (g.seq, g.dim, g.head_dim());
    let ld = 3 * d;
    let q = MatRef::row_major(&xb[i0 * ld + h * dh..], ld);
    let kt = MatRef {
        data: &xb[d + h * dh..],
        rs: 1,
        cs: ld,
    };
    gemm(i1 - i0, i1, dh, q, kt, pt, t, false, room);
}

/// Forward of `n` sequences: per sample, head and tile of [`ATTN_TILE_ROWS`] query rows, `S = Q·Kᵀ/√dh`
/// over the causal keys, masked to `j ≤ i`, softmax per row, `O = P·V`. `saved`: the probabilities
/// (0 above the diagonal), or in recompute mode ([`AttnGeom::recompute_probs`]) each row's maximum of
/// the scaled scores and sum of exponentials, the probabilities going to the front of `scratch`.
#[cfg(feature = "seq")]
pub fn attention_fwd<T: Real>(
    g: &AttnGeom,
    n: usize,
    qkv: &[T],
    saved: &mut [T],
    o: &mut [T],
    scratch: &mut [T],
) {
    let (t, d, dh) = (g.seq, g.dim, g.head_dim());
    let ld = 3 * d;
    let scale = T::ONE / T::from_usize(dh).sqrt();
    let (tile, room) = if g.recompute_probs {
        scratch.split_at_mut(g.tile_len())
    } else {
        (&mut [][..], scratch)
    };
    for b in 0..n {
        let xb = &qkv[b * t * ld..(b + 1) * t * ld];
        for h in 0..g.heads {
            let bh = b * g.heads + h;
            for i0 in (0..t).step_by(ATTN_TILE_ROWS) {
                let i1 = (i0 + ATTN_TILE_ROWS).min(t);
                // The tile's probabilities, and in recompute mode its rows' statistics.
                let (pt, stats): (&mut [T], &mut [T]) = if g.recompute_probs {
                    (
                        &mut tile[..],
                        &mut saved[2 * (bh * t + i0)..2 * (bh * t + i1)],
                    )
                } else {
                    (
                        &mut saved[bh * t * t + i0 * t..(bh + 1) * t * t],
                        &mut [][..],
                    )
                };
                attn_scores_tile(g, xb, h, i0, i1, pt, room);
                for i in i0..i1 {
                    let row = &mut pt[(i - i0) * t..(i - i0 + 1) * t];
                    let mut m = row[0] * scale;
                    for &v in &row[1..=i] {
                        let v = v * scale;
                        if v > m {
                            m = v;
                        }
                    }
                    // e^(v·scale − m) ≤ 1 in a pass that vectorises, then their sum in lane order.
                    vector::map_inplace(&mut row[..=i], |v| (v * scale - m).exp_nonpos());
                    let s = vector::sum_map(&row[..=i], |e| e);
                    let inv = T::ONE / s;
                    vector::map_inplace(&mut row[..=i], |v| v * inv);
                    // Keys past the tile's last row were not computed; in the saved matrix they are
                    // zeros like the rest above the diagonal.
                    let end = if g.recompute_probs { i1 } else { t };
                    row[i + 1..end].iter_mut().for_each(|v| *v = T::ZERO);
                    if g.recompute_probs {
                        stats[2 * (i - i0)] = m;
                        stats[2 * (i - i0) + 1] = s;
                    }
                }
                let v = MatRef::row_major(&xb[2 * d + h * dh..], ld);
                let ob = &mut o[b * t * d + i0 * d + h * dh..];
                gemm(
                    i1 - i0,
                    dh,
                    i1,
                    MatRef::row_major(pt, t),
                    v,
                    ob,
                    d,
                    false,
                    room,
                );
            }
        }
    }
}

/// Input derivative of `n` sequences, tile by tile of [`ATTN_TILE_ROWS`] query rows over the causal
/// keys: `dV += Pᵀ·dO`, `dP = dO·Vᵀ`, `dS = P∘(dP − rowsum(P∘dP))/√dh`, `dQ = dS·K`, `dK += dSᵀ·Q`
/// (added into `dqkv` when `accumulate`). `saved` as [`attention_fwd`] wrote it: in recompute mode each
/// tile's probabilities are recomputed from `Q`, `K` and the row statistics with the forward's
/// arithmetic (the same bits) into the front of `scratch`.
#[allow(clippy::too_many_arguments)]
#[cfg(feature = "seq")]
pub fn attention_grad_x<T: Real>(
    g: &AttnGeom,
    n: usize,
    qkv: &[T],
    saved: &[T],
    d_o: &[T],
    dqkv: &mut [T],
    accumulate: bool,
    scratch: &mut [T],
) {
    let (t, d, dh) = (g.seq, g.dim, g.head_dim());
    let ld = 3 * d;
    let scale = T::ONE / T::from_usize(dh).sqrt();
    if !accumulate {
        dqkv[..n * t * ld].iter_mut().for_each(|v| *v = T::ZERO);
    }
    let (dp, scratch) = scratch.split_at_mut(g.tile_len());
    let (tile, room) = if g.recompute_probs {
        scratch.split_at_mut(g.tile_len())
    } else {
        (&mut [][..], scratch)
    };
    for b in 0..n {
        let xb = &qkv[b * t * ld..(b + 1) * t * ld];
        let dxb = &mut dqkv[b * t * ld..(b + 1) * t * ld];
        let dob = &d_o[b * t * d..(b + 1) * t * d];
        for h in 0..g.heads {
            let bh = b * g.heads + h;
            for i0 in (0..t).step_by(ATTN_TILE_ROWS) {
                let (i1, r) = ((i0 + ATTN_TILE_ROWS).min(t), ATTN_TILE_ROWS.min(t - i0));
                let pt: &[T] = if g.recompute_probs {
                    attn_scores_tile(g, xb, h, i0, i1, tile, room);
                    for i in i0..i1 {
                        let st = &saved[2 * (bh * t + i)..2 * (bh * t + i) + 2];
                        let (m, inv) = (st[0], T::ONE / st[1]);
                        let row = &mut tile[(i - i0) * t..(i - i0) * t + i1];
                        // As the forward pass computes them, so recomputed probabilities are its bits.
                        vector::map_inplace(&mut row[..=i], |v| (v * scale - m).exp_nonpos() * inv);
                        row[i + 1..].iter_mut().for_each(|v| *v = T::ZERO);
                    }
                    &tile[..]
                } else {
                    &saved[bh * t * t + i0 * t..(bh + 1) * t * t]
                };
                let dout = MatRef::row_major(&dob[i0 * d + h * dh..], d);
                // dV[..i1] += Pᵀ·dO.
                gemm(
                    i1,
                    dh,
                    r,
                    MatRef::row_major_t(pt, t),
                    dout,
                    &mut dxb[2 * d + h * dh..],
                    ld,
                    true,
                    room,
                );
                // dP = dO·Vᵀ over the tile's keys.
                let vt = MatRef {
                    data: &xb[2 * d + h * dh..],
                    rs: 1,
                    cs: ld,
                };
                gemm(r, i1, dh, dout, vt, dp, t, false, room);
                for i in i0..i1 {
                    let pr = &pt[(i - i0) * t..(i - i0) * t + i1];
                    let dr = &mut dp[(i - i0) * t..(i - i0) * t + i1];
                    let s = vector::sum_zip(&pr[..=i], &dr[..=i], |p, d| p * d);
                    for j in 0..=i {
                        dr[j] = pr[j] * (dr[j] - s) * scale;
                    }
                    dr[i + 1..].iter_mut().for_each(|v| *v = T::ZERO);
                }
                // dQ[i0..i1] += dS·K.
                gemm(
                    r,
                    dh,
                    i1,
                    MatRef::row_major(dp, t),
                    MatRef::row_major(&xb[d + h * dh..], ld),
                    &mut dxb[i0 * ld + h * dh..],
                    ld,
                    true,
                    room,
                );
                // dK[..i1] += dSᵀ·Q.
                gemm(
                    i1,
                    dh,
                    r,
                    MatRef::row_major_t(dp, t),
                    MatRef::row_major(&xb[i0 * ld + h * dh..], ld),
                    &mut dxb[d + h * dh..],
                    ld,
                    true,
                    room,
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Linear with LoRA adapters: y = x·Wᵀ + b + s·(x·Aᵀ)·Bᵀ, W and b frozen
// ---------------------------------------------------------------------------------------------------

/// Shape of a LoRA Linear: `W [fout, fin]`, `A [rank, fin]`, `B [fout, rank]`, `scale = alpha/rank`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraGeom {
    /// Input features.
    pub fin: usize,
    /// Output features.
    pub fout: usize,
    /// Adapter rank.
    pub rank: usize,
    /// `alpha / rank`.
    pub scale: f32,
}

/// GEMM packing elements any LoRA phase needs for `rows` token rows.
pub fn lora_gemm_scratch_len(g: &LoraGeom, rows: usize) -> usize {
    let (i, o, r) = (g.fin, g.fout, g.rank);
    [
        gemm_scratch_len(rows, o, i),
        gemm_scratch_len(rows, r, i),
        gemm_scratch_len(rows, o, r),
        gemm_scratch_len(rows, r, o),
        gemm_scratch_len(r, i, rows),
        gemm_scratch_len(o, r, rows),
        gemm_scratch_len(rows, i, o),
        gemm_scratch_len(rows, i, r),
    ]
    .into_iter()
    .max()
    .unwrap_or(0)
}

/// Scratch elements of the backward phases: `rows × rank` for `s·dY·B` plus GEMM packing.
pub fn lora_bwd_scratch_len(g: &LoraGeom, rows: usize) -> usize {
    rows * g.rank + lora_gemm_scratch_len(g, rows)
}

/// Forward of `rows` token rows: `u = s·x·Aᵀ` (saved), `y = x·Wᵀ + b + u·Bᵀ`.
#[allow(clippy::too_many_arguments)]
#[cfg(feature = "seq")]
pub fn lora_fwd<T: Real>(
    g: &LoraGeom,
    rows: usize,
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    a: &[T],
    bm: &[T],
    u: &mut [T],
    y: &mut [T],
    scratch: &mut [T],
) {
    let (fin, fout, r) = (g.fin, g.fout, g.rank);
    super::linear_fwd(rows, fin, fout, x, w, bias, y, scratch);
    let u = &mut u[..rows * r];
    gemm(
        rows,
        r,
        fin,
        MatRef::row_major(x, fin),
        MatRef::row_major_t(a, fin),
        u,
        r,
        false,
        scratch,
    );
    let s = T::from_f32(g.scale);
    u.iter_mut().for_each(|v| *v *= s);
    gemm(
        rows,
        fout,
        r,
        MatRef::row_major(u, r),
        MatRef::row_major_t(bm, r),
        &mut y[..rows * fout],
        fout,
        true,
        scratch,
    );
}

/// Adapter gradients: `dB = dYᵀ·u`, `dA = (s·dY·B)ᵀ·x` (added when `accumulate`).
#[allow(clippy::too_many_arguments)]
#[cfg(feature = "seq")]
pub fn lora_grad_w<T: Real>(
    g: &LoraGeom,
    rows: usize,
    x: &[T],
    u: &[T],
    dy: &[T],
    bm: &[T],
    da: &mut [T],
    db: &mut [T],
    accumulate: bool,
    scratch: &mut [T],
) {
    lora_act_grad_w(g, None, rows, x, u, dy, bm, da, db, accumulate, scratch)
}

/// [`lora_grad_w`]; with `act`, of a LoRA Linear whose input is `act(x)`, from the activation's input
/// `x` ([`crate::graph::Node::act_in`]): `dA`'s product recomputes `act(x)` [`ACT_TILE_ROWS`] rows at a
/// time, as [`linear_act_grad_w_par`] does, in [`act_tile_len`] elements of `scratch` after the
/// `rows × rank` of `s·dY·B` (before the GEMM's room).
#[allow(clippy::too_many_arguments)]
#[cfg(feature = "seq")]
pub fn lora_act_grad_w<T: Real>(
    g: &LoraGeom,
    act: Option<Smooth>,
    rows: usize,
    x: &[T],
    u: &[T],
    dy: &[T],
    bm: &[T],
    da: &mut [T],
    db: &mut [T],
    accumulate: bool,
    scratch: &mut [T],
) {
    let (fin, fout, r) = (g.fin, g.fout, g.rank);
    let (t, scratch) = scratch.split_at_mut(rows * r);
    let (tile, scratch) = match act {
        Some(_) => scratch.split_at_mut(act_tile_len(rows, fin)),
        None => (&mut [][..], scratch),
    };
    if rows == 0 {
        if !accumulate {
            da[..r * fin].iter_mut().for_each(|v| *v = T::ZERO);
            db[..fout * r].iter_mut().for_each(|v| *v = T::ZERO);
        }
        return;
    }
    gemm(
        fout,
        r,
        rows,
        MatRef::row_major_t(dy, fout),
        MatRef::row_major(u, r),
        &mut db[..fout * r],
        r,
        accumulate,
        scratch,
    );
    scaled_dy_b(g, rows, dy, bm, t, scratch);
    let Some(act) = act else {
        gemm(
            r,
            fin,
            rows,
            MatRef::row_major_t(t, r),
            MatRef::row_major(x, fin),
            &mut da[..r * fin],
            fin,
            accumulate,
            scratch,
        );
        return;
    };
    for (i, r0) in (0..rows).step_by(ACT_TILE_ROWS).enumerate() {
        let r1 = (r0 + ACT_TILE_ROWS).min(rows);
        let xt = &mut tile[..(r1 - r0) * fin];
        smooth_fwd(act, &x[r0 * fin..r1 * fin], xt);
        gemm(
            r,
            fin,
            r1 - r0,
            MatRef::row_major_t(&t[r0 * r..r1 * r], r),
            MatRef::row_major(xt, fin),
            &mut da[..r * fin],
            fin,
            accumulate || i > 0,
            scratch,
        );
    }
}

/// `t = s·dY·B` (`rows × rank`).
#[cfg(feature = "seq")]
fn scaled_dy_b<T: Real>(
    g: &LoraGeom,
    rows: usize,
    dy: &[T],
    bm: &[T],
    t: &mut [T],
    scratch: &mut [T],
) {
    let (fout, r) = (g.fout, g.rank);
    gemm(
        rows,
        r,
        fout,
        MatRef::row_major(dy, fout),
        MatRef::row_major(bm, r),
        &mut t[..rows * r],
        r,
        false,
        scratch,
    );
    let s = T::from_f32(g.scale);
    t[..rows * r].iter_mut().for_each(|v| *v *= s);
}

/// Input derivative: `dx = dY·W + (s·dY·B)·A` (added when `accumulate`).
#[allow(clippy::too_many_arguments)]
#[cfg(feature = "seq")]
pub fn lora_grad_x<T: Real>(
    g: &LoraGeom,
    rows: usize,
    dy: &[T],
    w: &[T],
    a: &[T],
    bm: &[T],
    dx: &mut [T],
    accumulate: bool,
    scratch: &mut [T],
) {
    let (fin, fout, r) = (g.fin, g.fout, g.rank);
    let (t, scratch) = scratch.split_at_mut(rows * r);
    super::linear_grad_x(rows, fin, fout, dy, w, dx, accumulate, scratch);
    scaled_dy_b(g, rows, dy, bm, t, scratch);
    gemm(
        rows,
        fin,
        r,
        MatRef::row_major(t, r),
        MatRef::row_major(a, fin),
        &mut dx[..rows * fin],
        fin,
        true,
        scratch,
    );
}

#[cfg(all(test, feature = "seq"))]
#[path = "seq_tests.rs"]
mod tests;
