//! int8 training (NITI / Mandheling): int8 weights, activations and errors with a power-of-two scale
//! exponent per tensor, int32 accumulation, shift rescaling with self-adaptive periods, and the integer
//! combination of split-batch gradients (Mandheling Eq. 4).
//!
//! # Number format
//! A tensor is int8 values `q` in `[-127, 127]` and one exponent `e` (held by the executor): the real
//! value is `q · 2^e`. Products of two tensors accumulate exactly in i32 at exponent `e_a + e_b`; a
//! rescale by `s` bits (`round(acc / 2^s)`, clamped to ±127) gives exponent `e_a + e_b + s`. The shift of
//! a tensor is `bit_width(max |acc|) − 7` (Mandheling Listing 1).
//!
//! # Never a whole int32 output
//! Linear and Conv compute in tiles (row blocks of the batch for Linear, blocks of samples for Conv, see
//! [`conv_blocks`]) into a small i32 scratch and rescale each tile at once with the tensor's shift
//! ([`produce`]). The shift must be known before the first tile, so each output keeps a [`Site`]: the
//! first pass of a tensor is exact (two passes: compute every tile for `max |acc|`, then rescale — the
//! last tile from where it still lies, the others recomputed); later passes reuse the last shift in one
//! pass and watch the clamp count — any saturation redoes the op exactly ("forced").
//!
//! # Convolutions
//! A convolution tile is im2col + one integer product per group. Flat geometries (stride 1, output rows
//! as wide as the input rows — small-image CNNs) take a packing-free path where the CPU has SIMD pair
//! products (`flat`: the im2col written straight in the products' layout, the derivative as the
//! convolution of `dY` with the flipped kernel, no col2im); others im2col into columns for the packed
//! [`igemm`](k8::igemm). Both give the same integers, in the same scratch ([`layouts`]).
//!
//! Weight gradients are rescaled exactly every step. By default a layer's whole i32 gradient is
//! accumulated at once (4 bytes per weight of scratch); a graph realised with a `grad_tile`
//! ([`GraphOptions`](crate::graph::GraphOptions)) accumulates a Linear's weight gradient in tiles of
//! [`grad_rows`] output rows instead, computing every tile twice (once for `max |acc|`, once to
//! rescale): the same int8 gradient, bit for bit, for a second GEMM pass — how a 16 KiB microcontroller
//! trains a 64×16 layer.
//!
//! # Self-adaptive rescaling (Mandheling §3.4)
//! Each [`Site`] checks its scale exactly every `period` passes. After an exact check, a changed shift
//! halves the period (scales move: check more often) and an unchanged one doubles it, capped at
//! [`PERIOD_CAP`] — the check frequency follows half the observed change frequency. [`RescaleCounts`]
//! tallies exact, skipped and forced passes.
//!
//! # Weight update (one setting, two modes, see [`crate::model::Int8Update`])
//! * **Integer** (NITI): weights int8 with an exponent fixed at initialisation (`max |w|` in (32, 64], two
//!   bits of head-room). The int8 gradient is shifted down so its largest value has `update_bits` bits,
//!   with stochastic rounding (seeded per step and tensor), and subtracted with saturation. The update
//!   bit-width is the learning rate; the optimizer's `lr`, momentum and weight decay are not used.
//!   Memory per parameter: weight 1 B + gradient 1 B = **2 B** (f32 SGD: 8 B, f32 Adam: 16 B).
//! * **Float master**: f32 master weights and the model's optimizer (SGD/Adam, [`crate::optim`]) on the
//!   dequantised int8 gradient; the int8 copy a Linear/Conv multiplies with is quantised from the master
//!   into that instruction's scratch (power-of-two exponent from `max |w|`, recomputed after each update),
//!   so no persistent int8 copy exists. Memory per parameter: master 4 B + gradient 1 B + optimizer state
//!   (SGD 0 B, momentum 4 B, Adam 8 B) = **5–13 B**, plus 1 B of scratch while its layer runs.
//!
//! # Other ops
//! ReLU works in place on int8 (exponent unchanged; backward masks by the output's sign). MaxPool keeps
//! the exponent and stores the window index of each maximum as one byte (u8, windows ≤ 255 elements).
//! AvgPool / GlobalAvgPool sum in i32 and divide by the window size `k`: by a rounding shift when `k` is a
//! power of two, else by the integer multiply-shift `(sum · round(2^16 / k) + 2^15) >> 16` (within one unit
//! of the exact quotient for `k < 512`). Their backward spreads `dy · 2^c / k` with `c = floor(log2 k)` and
//! exponent `e_dy − c` (exact for powers of two). Add aligns both inputs to the coarser exponent (rounding
//! shift of the finer), and takes one more bit when the sum would saturate. The loss is a fixed-point
//! softmax cross-entropy ([`softmax_ce`]).
//!
//! # The input
//! The host passes f32; each step quantises the batch with the exponent from its `max |x|` (into the first
//! layer's scratch, per instruction, so no int8 copy of the input lives in the arena).
// The precision rules the graph is built with live in `graph::precision` (so that `graph` never imports
// `quant`); re-exported here, where the integer kernels use them.
pub use crate::graph::precision::{
    check_supported, conv_blocks, dtype_of, grad_rows, layouts, max_accumulation, scratch_bytes,
    split, state_slots, tile_rows, ACC_LIMIT, CONV_TILE_BYTES, TILE,
};
use crate::kernels::int8::{self as k8, Rounding};
use crate::ops::{ConvGeom, PoolGeom};

mod flat;
mod lut;
pub mod ops;
#[cfg(test)]
pub(crate) mod tests;

use lut::EXP2_LUT;

/// Elements of the on-stack buffers that convert a tensor piece by piece (integer update, gradient
/// combination, float-master update). Results do not depend on it (rounding noise is indexed by
/// element); it is small because a Cortex-M0 trains in about 2 KiB of stack.
pub const CHUNK: usize = 64;
/// Largest self-adaptive period.
pub const PERIOD_CAP: u16 = 64;

/// Whether a check is due every step or self-adaptively.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Rescale {
    /// Mandheling §3.4: exact every `period` passes, period adapted to how often the scale changes.
    #[default]
    Adaptive,
    /// Exact two-pass rescale on every pass (the baseline).
    EveryStep,
}

/// Rescale pass counters (sums over sites).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RescaleCounts {
    /// Exact (two-pass) rescales that were due.
    pub exact: u64,
    /// One-pass rescales with the reused shift and no saturation.
    pub skipped: u64,
    /// One-pass rescales that saturated and were redone exactly.
    pub forced: u64,
    /// Exact checks whose shift differed from the previous one.
    pub changed: u64,
    /// Split-batch gradient combinations (Eq. 4) whose scales agreed (no rescale needed).
    pub combine_skipped: u64,
    /// Split-batch gradient combinations that rescaled one side.
    pub combine_rescaled: u64,
}

impl RescaleCounts {
    /// All passes.
    pub fn passes(&self) -> u64 {
        self.exact + self.skipped + self.forced
    }
    /// Fraction of passes whose exact max pass was skipped.
    pub fn skipped_fraction(&self) -> f64 {
        self.skipped as f64 / self.passes().max(1) as f64
    }
    /// Adds `o`.
    pub fn add(&mut self, o: &RescaleCounts) {
        self.exact += o.exact;
        self.skipped += o.skipped;
        self.forced += o.forced;
        self.changed += o.changed;
        self.combine_skipped += o.combine_skipped;
        self.combine_rescaled += o.combine_rescaled;
    }
    /// `self − earlier` (counters since a snapshot).
    pub fn since(&self, earlier: &RescaleCounts) -> RescaleCounts {
        RescaleCounts {
            exact: self.exact - earlier.exact,
            skipped: self.skipped - earlier.skipped,
            forced: self.forced - earlier.forced,
            changed: self.changed - earlier.changed,
            combine_skipped: self.combine_skipped - earlier.combine_skipped,
            combine_rescaled: self.combine_rescaled - earlier.combine_rescaled,
        }
    }
}

impl core::fmt::Display for RescaleCounts {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "rescale passes: {} exact, {} skipped ({:.0}%), {} forced; scale changes: {}",
            self.exact,
            self.skipped,
            100.0 * self.skipped_fraction(),
            self.forced,
            self.changed
        )?;
        if self.combine_skipped + self.combine_rescaled > 0 {
            write!(
                f,
                "; split-batch combines: {} rescaled, {} skipped",
                self.combine_rescaled, self.combine_skipped
            )?;
        }
        Ok(())
    }
}

/// The self-adaptive rescale state of one tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Site {
    /// The shift in use.
    pub shift: u32,
    /// An exact pass has set `shift`.
    pub ready: bool,
    /// Passes between exact checks.
    pub period: u16,
    /// Passes since the last exact check.
    pub since: u16,
    /// Its counters.
    pub counts: RescaleCounts,
}

impl Default for Site {
    fn default() -> Self {
        Self {
            shift: 0,
            ready: false,
            period: 1,
            since: 0,
            counts: RescaleCounts::default(),
        }
    }
}

impl Site {
    /// Whether the next training pass must be exact.
    pub fn due(&self, r: Rescale) -> bool {
        !self.ready || r == Rescale::EveryStep || self.since + 1 >= self.period
    }
    fn exact_done(&mut self, shift: u32, forced: bool) {
        let changed = self.ready && shift != self.shift;
        if forced {
            self.counts.forced += 1;
        } else {
            self.counts.exact += 1;
        }
        if changed {
            self.counts.changed += 1;
        }
        self.period = if changed || forced {
            (self.period / 2).max(1)
        } else if self.ready {
            (self.period.saturating_mul(2)).min(PERIOD_CAP)
        } else {
            self.period
        };
        self.shift = shift;
        self.ready = true;
        self.since = 0;
    }
    fn skip_done(&mut self) {
        self.counts.skipped += 1;
        self.since = self.since.saturating_add(1);
    }
}

/// What kind of pass runs an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// A training pass: the site decides exact or reuse, and learns.
    Train(Rescale),
    /// Always exact; the site is left untouched (evaluation).
    Eval,
    /// Reuse the site's shift without checks or learning (recompute: bit-identical to its forward).
    Replay,
}

/// Where a computed tile of i32 goes in the int8 destination: elements `[off, off + len)`. With
/// `rows > 1` the tile is stored transposed by blocks: `acc` is `[rows][b][inner]` while the destination
/// is `[b][rows][inner]` (`b = len / (rows·inner)`), e.g. a convolution GEMM whose output channels run
/// over several samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileOut {
    /// First destination element.
    pub off: usize,
    /// Elements.
    pub len: usize,
    /// Row blocks of the transposed layout (1: `acc` is in destination order).
    pub rows: usize,
    /// Elements per block.
    pub inner: usize,
}

impl TileOut {
    /// A tile already in destination order.
    pub fn flat(off: usize, len: usize) -> Self {
        Self {
            off,
            len,
            rows: 1,
            inner: len.max(1),
        }
    }
}

/// Rescales one tile into `dst`; returns the clamp count. Stochastic noise is indexed by the destination
/// element, so the result does not depend on the tile's layout.
fn put_tile(acc: &[i32], t: TileOut, s: u32, rounding: Rounding, dst: &mut [i8]) -> usize {
    let b = t.len / (t.rows * t.inner).max(1);
    if t.rows <= 1 || b <= 1 {
        let (off, len) = (t.off, t.len);
        return k8::rescale_i32_to_i8(
            &acc[..len],
            s,
            rounding,
            off as u64,
            &mut dst[off..off + len],
        );
    }
    k8::rescale_i32_to_i8_blocks(
        &acc[..t.len],
        t.rows,
        t.inner,
        s,
        rounding,
        t.off as u64,
        &mut dst[t.off..t.off + t.len],
    )
}

/// Computes a tensor of `tiles` tiles into i32 (`compute(tile, acc, dst)` fills `acc[..len]` and returns
/// where the tile goes in `dst` ([`TileOut`]); it may read `dst`'s old values of that tile, which are
/// still intact when it runs in an exact pass) and rescales each tile to int8 with one shift for the
/// whole tensor, chosen by `site` and `pass` (see the module docs). Returns the shift used. An exact
/// pass computes every tile for `max |acc|`, then rescales the last one (still in `acc`) and recomputes
/// the others.
pub fn produce<E>(
    site: &mut Site,
    pass: Pass,
    tiles: usize,
    acc: &mut [i32],
    dst: &mut [i8],
    rounding: Rounding,
    mut compute: impl FnMut(usize, &mut [i32], &[i8]) -> Result<TileOut, E>,
) -> Result<u32, E> {
    let mut forced = false;
    let reuse = match pass {
        Pass::Train(r) => !site.due(r),
        Pass::Eval => false,
        Pass::Replay => site.ready,
    };
    if reuse {
        let s = site.shift;
        let mut clamped = 0usize;
        for t in 0..tiles {
            let to = compute(t, acc, dst)?;
            clamped += put_tile(acc, to, s, rounding, dst);
        }
        if clamped == 0 || pass == Pass::Replay {
            if let Pass::Train(_) = pass {
                site.skip_done();
            }
            return Ok(s);
        }
        forced = true;
    }
    let mut m = 0u32;
    let mut last = None;
    for t in 0..tiles {
        let to = compute(t, acc, dst)?;
        m = m.max(k8::max_abs_i32(&acc[..to.len]));
        last = Some(to);
    }
    let s = k8::shift_for(m);
    // The last tile is still in `acc`: rescale it first (tiles are disjoint, so the others' old values
    // stay intact), then recompute the rest.
    if let Some(to) = last {
        put_tile(acc, to, s, rounding, dst);
    }
    for t in 0..tiles.saturating_sub(1) {
        let to = compute(t, acc, dst)?;
        put_tile(acc, to, s, rounding, dst);
    }
    if let Pass::Train(_) = pass {
        site.exact_done(s, forced);
    }
    Ok(s)
}

/// 2^e as f32 (e clamped to the f32 range).
pub fn pow2(e: i32) -> f32 {
    libm::ldexpf(1.0, e.clamp(-300, 300))
}

/// Exponent for quantising values with `max |x| = m`: `floor(log2 m) − 6`, so `m / 2^e ∈ [64, 128)`.
/// 0 for zero or non-finite `m`.
pub fn exp_for_max(m: f32) -> i32 {
    if !(m.is_finite() && m > 0.0) {
        return 0;
    }
    let (_, e) = libm::frexpf(m); // m = f · 2^e, f ∈ [0.5, 1)
    e - 1 - 6
}

/// `max |x|`.
pub fn max_abs_f32(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// `dst = clamp(round(src / 2^e), ±127)`, halves away from zero.
pub fn quantize(src: &[f32], e: i32, dst: &mut [i8]) {
    k8::quantize_f32(src, pow2(-e), dst);
}

/// `q · 2^(from − to)` rounded (half away from zero) and saturated to i32.
pub fn align(q: i32, from: i32, to: i32) -> i32 {
    let d = from - to;
    if d >= 0 {
        let v = (q as i64) << d.min(40);
        v.clamp(i32::MIN as i64, i32::MAX as i64) as i32
    } else {
        let s = (-d).min(40) as u32;
        let half = 1i64 << (s - 1);
        let a = (q as i64).abs();
        let r = ((a + half) >> s) as i32;
        if q < 0 {
            -r
        } else {
            r
        }
    }
}

fn sat8(v: i32) -> i8 {
    v.clamp(-127, 127) as i8
}

/// Mandheling Eq. 4: `acc ← acc ⊕ new` for two int8 gradients of one tensor with exponents `e_acc`
/// and `e_new`: both are brought to the larger exponent (the finer one rescaled by a rounding shift,
/// skipped when the exponents agree) and added; if the sum would saturate, one more bit is taken.
/// Returns the result's exponent and whether the rescale was skipped.
pub fn combine_eq4(acc: &mut [i8], e_acc: i32, new: &[i8], e_new: i32) -> (i32, bool) {
    let e = e_acc.max(e_new);
    let skipped = e_acc == e_new;
    let sum = |a: i8, b: i8| align(a as i32, e_acc, e) + align(b as i32, e_new, e);
    let over = acc.iter().zip(new).any(|(&a, &b)| sum(a, b).abs() > 127);
    let (e_out, extra) = if over { (e + 1, 1) } else { (e, 0) };
    for (a, &b) in acc.iter_mut().zip(new) {
        *a = sat8(align(sum(*a, b), e, e + extra));
    }
    (e_out, skipped)
}

/// Integer exponent and bound for pure-integer initialisation of a layer with `fan_in`: PyTorch's
/// uniform bound `1/√fan_in` expressed as `bound_q · 2^e` with `bound_q ∈ (32, 64]`, computed without
/// floats (`4^k ∈ (1024·f, 4096·f]`, `bound_q = ⌊√(4^k / f)⌋`, `e = −k`).
pub fn int_init_bound(fan_in: usize) -> (i32, i32) {
    let f = fan_in.max(1) as u128;
    let mut k = 0u32;
    while (1u128 << (2 * k)) <= 1024 * f && k < 60 {
        k += 1;
    }
    let q = (1u128 << (2 * k)) / f;
    let b = isqrt(q) as i32;
    (-(k as i32), b.clamp(1, 127))
}

fn isqrt(v: u128) -> u128 {
    let mut x = 0u128;
    let mut bit = 1u128 << 126;
    let mut v = v;
    while bit > v {
        bit >>= 2;
    }
    while bit != 0 {
        if v >= x + bit {
            v -= x + bit;
            x = (x >> 1) + bit;
        } else {
            x >>= 1;
        }
        bit >>= 2;
    }
    x
}

/// NITI's integer update: `w ← clamp(w − sr(g / 2^s), ±127)` with `s = bit_width(max |g|) − update_bits`
/// (at least 0) and stochastic rounding `sr` seeded by `seed`.
pub fn integer_update(w: &mut [i8], g: &[i8], update_bits: u32, seed: u64) {
    let m = g.iter().fold(0u32, |m, &v| m.max(v.unsigned_abs() as u32));
    let s = k8::bit_width(m).saturating_sub(update_bits);
    let mut src = [0i32; CHUNK];
    let mut d = [0i8; CHUNK];
    for (c, (wc, gc)) in w.chunks_mut(CHUNK).zip(g.chunks(CHUNK)).enumerate() {
        let len = wc.len();
        for (a, &b) in src.iter_mut().zip(gc) {
            *a = b as i32;
        }
        k8::rescale_i32_to_i8(
            &src[..len],
            s,
            Rounding::Stochastic(seed),
            (c * CHUNK) as u64,
            &mut d[..len],
        );
        for (wv, &dv) in wc.iter_mut().zip(&d[..len]) {
            *wv = sat8(*wv as i32 - dv as i32);
        }
    }
}

/// log2(e) in Q16.
const LOG2E_Q16: i64 = 94_548;

/// 2^(t / 2^16) in Q16 for `t ≤ 0` (LUT over the top 8 fraction bits, linear in the low 8).
pub fn exp2_q16(t: i64) -> u32 {
    if t > 0 {
        return 1 << 16;
    }
    let ip = t >> 16; // floor
    if ip < -31 {
        return 0;
    }
    let f = (t & 0xFFFF) as usize;
    let (i, r) = (f >> 8, (f & 0xFF) as u32);
    let v = EXP2_LUT[i] + (((EXP2_LUT[i + 1] - EXP2_LUT[i]) * r + 128) >> 8);
    v >> (-ip) as u32
}

/// Fixed-point softmax probabilities (Q16, `buf[j]`, summing to about 2^16) of one row of int8 logits
/// with exponent `e`: `exp(z_j − max z)` as `2^((q_j − q_max)·2^e·log2 e)` in Q16.
pub fn softmax_row_q16(q: &[i8], e: i32, buf: &mut [i32]) {
    let m = q.iter().copied().max().unwrap_or(0) as i64;
    let mut sum = 0i64;
    for (b, &v) in buf.iter_mut().zip(q) {
        let d = (v as i64 - m) * LOG2E_Q16;
        let t = if e >= 0 {
            (d << e.min(24)).max(-(40 << 16))
        } else {
            let s = (-e).min(40) as u32;
            -((-d + (1 << (s - 1))) >> s)
        };
        let x = exp2_q16(t);
        *b = x as i32;
        sum += x as i64;
    }
    // One division for the row: the same quotients `((b << 16) + sum/2) / sum` from a reciprocal.
    let div = Divider::new(sum as u64);
    for b in buf.iter_mut() {
        *b = div.div(((*b as u64) << 16) + sum as u64 / 2) as i32;
    }
}

/// Exact `floor(n / d)` for a fixed `d` by a multiply: `q = ⌊n·⌊(2^64−1)/d⌋ / 2^64⌋` is at most one
/// below the true quotient for `n < 2^64`, and one comparison corrects it. `d = 0` gives 0 (like the
/// `checked_div(…).unwrap_or(0)` it replaces).
#[derive(Clone, Copy, Debug)]
struct Divider {
    d: u64,
    r: u64,
}

impl Divider {
    fn new(d: u64) -> Self {
        Self {
            d,
            r: u64::MAX.checked_div(d).unwrap_or(0),
        }
    }
    #[inline]
    fn div(&self, n: u64) -> u64 {
        if self.d == 0 {
            return 0;
        }
        let q = ((n as u128 * self.r as u128) >> 64) as u64;
        // n − q·d < 2d: one step up at most.
        q + (n - q * self.d >= self.d) as u64
    }
}

/// The fused softmax cross-entropy of int8 logits `pred` (`n × classes`, exponent `e`) in fixed point.
/// The derivative `(p − onehot) / norm` is formed in Q30 (`round((p_q16 − 2^16·[j = y]) · 2^14 / norm)`)
/// and rescaled exactly to int8 into `d` (or into `pred` itself when `d` is None); its exponent is
/// returned. The reported loss is `−ln(p_y)` from the same Q16 probabilities (clamped at 2^-16, so at
/// most 16·ln 2 per sample), summed over the samples. `buf` holds `classes` i32.
#[allow(clippy::too_many_arguments)]
pub fn softmax_ce(
    n: usize,
    classes: usize,
    pred: &mut [i8],
    e: i32,
    y: &[u32],
    norm: usize,
    mut d: Option<&mut [i8]>,
    buf: &mut [i32],
) -> (f32, usize, i32) {
    let buf = &mut buf[..classes];
    let norm = norm.max(1) as i64;
    let w = |p: i32, hot: bool| -> i32 {
        let err = p as i64 - if hot { 1 << 16 } else { 0 };
        let num = err << 14;
        let r = (num.abs() + norm / 2) / norm;
        (if num < 0 { -r } else { r }) as i32
    };
    let (mut loss, mut correct, mut m) = (0f32, 0usize, 0u32);
    for s in 0..n {
        let row = &pred[s * classes..(s + 1) * classes];
        softmax_row_q16(row, e, buf);
        let yc = y[s] as usize;
        let arg = row
            .iter()
            .enumerate()
            .fold(0, |b, (j, &v)| if v > row[b] { j } else { b });
        correct += (arg == yc) as usize;
        let py = buf[yc].max(1) as f32 / 65536.0;
        loss -= libm::logf(py);
        for (j, &p) in buf.iter().enumerate() {
            m = m.max(w(p, j == yc).unsigned_abs());
        }
    }
    let shift = k8::shift_for(m);
    for s in 0..n {
        softmax_row_q16(&pred[s * classes..(s + 1) * classes], e, buf);
        let yc = y[s] as usize;
        for (j, b) in buf.iter_mut().enumerate() {
            *b = w(*b, j == yc);
        }
        let out = match d.as_deref_mut() {
            Some(d) => &mut d[s * classes..(s + 1) * classes],
            None => &mut pred[s * classes..(s + 1) * classes],
        };
        k8::rescale_i32_to_i8(buf, shift, Rounding::Nearest, (s * classes) as u64, out);
    }
    (loss, correct, shift as i32 - 30)
}

/// Loss and correct count without a derivative (evaluation).
pub fn softmax_ce_eval(
    n: usize,
    classes: usize,
    pred: &[i8],
    e: i32,
    y: &[u32],
    buf: &mut [i32],
) -> (f32, usize) {
    let buf = &mut buf[..classes];
    let (mut loss, mut correct) = (0f32, 0usize);
    for s in 0..n {
        let row = &pred[s * classes..(s + 1) * classes];
        softmax_row_q16(row, e, buf);
        let yc = y[s] as usize;
        let arg = row
            .iter()
            .enumerate()
            .fold(0, |b, (j, &v)| if v > row[b] { j } else { b });
        correct += (arg == yc) as usize;
        loss -= libm::logf(buf[yc].max(1) as f32 / 65536.0);
    }
    (loss, correct)
}

/// Geometry helpers shared with [`ops`].
pub(crate) fn conv_dims(g: &ConvGeom) -> (usize, usize, usize, usize) {
    let cin_g = g.cin / g.groups;
    let cout_g = g.cout / g.groups;
    (cin_g, cout_g, cin_g * g.kh * g.kw, g.oh * g.ow)
}

/// Window size of a pool.
pub(crate) fn pool_k(g: &PoolGeom) -> usize {
    g.kh * g.kw
}
