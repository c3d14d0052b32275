//! BatchNorm2d with PyTorch semantics over `x: [n, c, hw]`, statistics per channel over `(n, hw)`.
//!
//! * Training: normalise with the batch mean and the **biased** batch variance; update
//!   `running = (1 − m)·running + m·batch` with the **unbiased** variance `Σ(x−μ)²/(count−1)`.
//! * Eval (or a frozen layer): normalise with the running statistics.
//!
//! Accuracy: channel reductions are two-pass (mean, then `Σ(x−μ)²`) and summed in blocks of 64 elements
//! (eight interleaved partial sums each), the block sums combined with Kahan compensation. The error is
//! then `O(10·ε)` relative to `Σ|terms|` whatever the channel size, which for f32 matches PyTorch's
//! double-accumulated CPU statistics to ~1e-7 relative — without needing a wider type in `T`.
use crate::kernels::vector::{self, LANES};
use crate::kernels::Real;

const BLOCK: usize = 64;

/// Kahan-compensated running sum.
#[derive(Clone, Copy)]
struct Comp<T> {
    s: T,
    c: T,
}

impl<T: Real> Comp<T> {
    fn new() -> Self {
        Self {
            s: T::ZERO,
            c: T::ZERO,
        }
    }
    #[inline(always)]
    fn add(&mut self, v: T) {
        let y = v - self.c;
        let t = self.s + y;
        self.c = (t - self.s) - y;
        self.s = t;
    }
    fn get(self) -> T {
        self.s - self.c
    }
}

/// `(Σ a, Σ f(a)·b)` over a pair of blocks, eight partial sums each.
#[inline(always)]
fn block_sum2<T: Real>(a: &[T], b: &[T], f: impl Fn(T) -> T) -> (T, T) {
    let (mut s1, mut s2) = ([T::ZERO; LANES], [T::ZERO; LANES]);
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..LANES {
            s1[l] += y[l];
            s2[l] += f(x[l]) * y[l];
        }
    }
    for (l, (&x, &y)) in ca.remainder().iter().zip(cb.remainder()).enumerate() {
        s1[l] += y;
        s2[l] += f(x) * y;
    }
    (vector::combine(s1), vector::combine(s2))
}

/// Channels per group at most (the accumulators of a group live on the stack).
const MAX_GROUP: usize = 64;

/// About how many bytes of a group's planes (over the whole batch, per operand) are visited in one
/// pass: small enough that the next pass finds them in the cache.
const GROUP_BYTES: usize = 256 << 10;

/// The channels `0..c` in groups of up to [`MAX_GROUP`] whose planes over the batch fit
/// [`GROUP_BYTES`] per operand (one channel at least).
///
/// Every pass walks a group sample by sample, the group's planes of a sample being contiguous in
/// `[n, c, hw]`: a channel at a time would stride `c·hw` elements from one sample to the next, which
/// for small planes (a 4×4 plane is one cache line) and a large batch is a cache and TLB miss per plane
/// — BatchNorm at batch 144 ran 15–26× slower than at batch 32 that way (4.5× the samples). Each
/// channel's sums still add the same blocks in the same order (samples in order, blocks within a
/// plane in order), so the results are the same bits as a channel at a time.
fn groups(
    n: usize,
    c: usize,
    hw: usize,
    elem: usize,
) -> impl Iterator<Item = core::ops::Range<usize>> {
    let per_channel = (n * hw * elem).max(1);
    let g = (GROUP_BYTES / per_channel).clamp(1, MAX_GROUP);
    (0..c).step_by(g).map(move |c0| c0..(c0 + g).min(c))
}

/// `Σ f(x)` over each channel of `chs`, compensated, into `out[ch]`; `f` is given the channel.
fn group_sums<T: Real>(
    n: usize,
    c: usize,
    hw: usize,
    x: &[T],
    chs: core::ops::Range<usize>,
    f: impl Fn(usize, T) -> T + Copy,
    out: &mut [T],
) {
    let mut acc = [Comp::new(); MAX_GROUP];
    for s in 0..n {
        for (k, ch) in chs.clone().enumerate() {
            let o = (s * c + ch) * hw;
            for b in x[o..o + hw].chunks(BLOCK) {
                acc[k].add(vector::sum_map(b, |v| f(ch, v)));
            }
        }
    }
    for (k, ch) in chs.enumerate() {
        out[ch] = acc[k].get();
    }
}

/// `(Σ dy, Σ (x−μ)·dy)` over each channel of `chs` (`μ = mean[ch]`), compensated, into
/// `(sdy[k], sdxm[k])` by position in the group.
#[allow(clippy::too_many_arguments)]
fn group_grad_sums<T: Real>(
    n: usize,
    c: usize,
    hw: usize,
    x: &[T],
    dy: &[T],
    chs: core::ops::Range<usize>,
    mean: &[T],
    sdy: &mut [T; MAX_GROUP],
    sdxm: &mut [T; MAX_GROUP],
) {
    let mut a1 = [Comp::new(); MAX_GROUP];
    let mut a2 = [Comp::new(); MAX_GROUP];
    for s in 0..n {
        for (k, ch) in chs.clone().enumerate() {
            let o = (s * c + ch) * hw;
            let mu = mean[ch];
            for (xb, db) in x[o..o + hw].chunks(BLOCK).zip(dy[o..o + hw].chunks(BLOCK)) {
                let (s1, s2) = block_sum2(xb, db, |v| v - mu);
                a1[k].add(s1);
                a2[k].add(s2);
            }
        }
    }
    for k in 0..chs.len() {
        sdy[k] = a1[k].get();
        sdxm[k] = a2[k].get();
    }
}

/// `y = post((x − mean[ch])·a(ch) + b(ch))` over the channels of `chs`, sample by sample.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn affine<T: Real>(
    n: usize,
    c: usize,
    hw: usize,
    x: &[T],
    y: &mut [T],
    chs: core::ops::Range<usize>,
    mean: &[T],
    a: impl Fn(usize) -> T,
    b: impl Fn(usize) -> T,
    post: impl Fn(T) -> T,
) {
    for s in 0..n {
        for ch in chs.clone() {
            let o = (s * c + ch) * hw;
            let (mu, a, b) = (mean[ch], a(ch), b(ch));
            for (y, &x) in y[o..o + hw].iter_mut().zip(&x[o..o + hw]) {
                *y = post((x - mu) * a + b);
            }
        }
    }
}

/// Training-mode forward. Writes `y`, the batch `mean` and `invstd = 1/√(σ²_biased + eps)` per channel
/// (saved for the backward), and updates `run_mean`/`run_var` (unbiased variance). A channel with a
/// single value (`n·hw = 1`, which PyTorch rejects) updates `run_var` with the biased variance (0);
/// an empty batch changes nothing.
#[allow(clippy::too_many_arguments)]
pub fn bn_fwd_train<T: Real>(
    n: usize,
    c: usize,
    hw: usize,
    x: &[T],
    gamma: &[T],
    beta: &[T],
    y: &mut [T],
    mean: &mut [T],
    invstd: &mut [T],
    run_mean: &mut [T],
    run_var: &mut [T],
    momentum: T,
    eps: T,
) {
    bn_fwd_train_then(
        n,
        c,
        hw,
        x,
        gamma,
        beta,
        y,
        mean,
        invstd,
        run_mean,
        run_var,
        momentum,
        eps,
        |v| v,
    );
}

/// [`bn_fwd_train`] with `post` applied to every output element as it is written: `y = post(BN(x))`.
/// With `post` an activation this is the BatchNorm and the activation after it in one pass over `y`
/// (the same bits as the two in turn), which a large batch, whose tensors leave the cache, pays for
/// by the pass.
#[allow(clippy::too_many_arguments)]
pub fn bn_fwd_train_then<T: Real>(
    n: usize,
    c: usize,
    hw: usize,
    x: &[T],
    gamma: &[T],
    beta: &[T],
    y: &mut [T],
    mean: &mut [T],
    invstd: &mut [T],
    run_mean: &mut [T],
    run_var: &mut [T],
    momentum: T,
    eps: T,
    post: impl Fn(T) -> T + Copy,
) {
    let count = n * hw;
    if count == 0 {
        return;
    }
    let cnt = T::from_usize(count);
    let elem = core::mem::size_of::<T>();
    for chs in groups(n, c, hw, elem) {
        group_sums(n, c, hw, x, chs.clone(), |_, v| v, mean);
        for ch in chs.clone() {
            mean[ch] = mean[ch] / cnt;
        }
        // Σ(x−μ)² per channel, held in `invstd` until it becomes the inverse deviation.
        group_sums(
            n,
            c,
            hw,
            x,
            chs.clone(),
            |ch, v| {
                let d = v - mean[ch];
                d * d
            },
            invstd,
        );
        for ch in chs.clone() {
            let ss = invstd[ch];
            let var = ss / cnt;
            invstd[ch] = T::ONE / (var + eps).sqrt();
            let unbiased = if count > 1 {
                ss / T::from_usize(count - 1)
            } else {
                var
            };
            run_mean[ch] = (T::ONE - momentum) * run_mean[ch] + momentum * mean[ch];
            run_var[ch] = (T::ONE - momentum) * run_var[ch] + momentum * unbiased;
        }
        affine(
            n,
            c,
            hw,
            x,
            y,
            chs,
            mean,
            |ch| gamma[ch] * invstd[ch],
            |ch| beta[ch],
            post,
        );
    }
}

/// Training-mode output from the statistics [`bn_fwd_train`] saved, bit-identical to its `y` and without
/// touching the running statistics: what a recomputation re-runs.
#[allow(clippy::too_many_arguments)]
pub fn bn_fwd_recompute<T: Real>(
    n: usize,
    c: usize,
    hw: usize,
    x: &[T],
    gamma: &[T],
    beta: &[T],
    mean: &[T],
    invstd: &[T],
    y: &mut [T],
) {
    bn_fwd_recompute_then(n, c, hw, x, gamma, beta, mean, invstd, y, |v| v);
}

/// [`bn_fwd_recompute`] with `post` applied to every output element as it is written (see
/// [`bn_fwd_train_then`]).
#[allow(clippy::too_many_arguments)]
pub fn bn_fwd_recompute_then<T: Real>(
    n: usize,
    c: usize,
    hw: usize,
    x: &[T],
    gamma: &[T],
    beta: &[T],
    mean: &[T],
    invstd: &[T],
    y: &mut [T],
    post: impl Fn(T) -> T,
) {
    if n * hw == 0 {
        return;
    }
    // One pass: every plane in memory order.
    affine(
        n,
        c,
        hw,
        x,
        y,
        0..c,
        mean,
        |ch| gamma[ch] * invstd[ch],
        |ch| beta[ch],
        post,
    );
}

/// Eval-mode forward: `y = (x − run_mean)·γ/√(run_var + eps) + β`.
#[allow(clippy::too_many_arguments)]
pub fn bn_fwd_eval<T: Real>(
    n: usize,
    c: usize,
    hw: usize,
    x: &[T],
    gamma: &[T],
    beta: &[T],
    run_mean: &[T],
    run_var: &[T],
    eps: T,
    y: &mut [T],
) {
    affine(
        n,
        c,
        hw,
        x,
        y,
        0..c,
        run_mean,
        |ch| gamma[ch] / (run_var[ch] + eps).sqrt(),
        |ch| beta[ch],
        |v| v,
    );
}

/// [`bn_fwd_eval`] over `x` in place (a frozen BatchNorm, merged with its input by the planner): the
/// same bits.
#[allow(clippy::too_many_arguments)]
pub fn bn_fwd_eval_inplace<T: Real>(
    n: usize,
    c: usize,
    hw: usize,
    gamma: &[T],
    beta: &[T],
    run_mean: &[T],
    run_var: &[T],
    eps: T,
    x: &mut [T],
) {
    for ch in 0..c {
        let a = gamma[ch] / (run_var[ch] + eps).sqrt();
        let (mu, b) = (run_mean[ch], beta[ch]);
        for s in 0..n {
            let o = (s * c + ch) * hw;
            for v in &mut x[o..o + hw] {
                *v = (*v - mu) * a + b;
            }
        }
    }
}

/// Parameter gradients (overwritten): `dγ = Σ dy·(x−μ)·invstd`, `dβ = Σ dy`, with the `mean`/`invstd`
/// saved by [`bn_fwd_train`].
#[allow(clippy::too_many_arguments)]
pub fn bn_grad_w<T: Real>(
    n: usize,
    c: usize,
    hw: usize,
    x: &[T],
    dy: &[T],
    mean: &[T],
    invstd: &[T],
    dgamma: &mut [T],
    dbeta: &mut [T],
    accumulate: bool,
) {
    bn_grad_w_rows(
        n,
        c,
        hw,
        x,
        dy,
        mean,
        invstd,
        Some(&mut dgamma[..c]),
        Some(&mut dbeta[..c]),
        accumulate,
    )
}

/// [`bn_grad_w`] for a sparse update: `dgamma` and `dbeta` hold the leading channels that train (their
/// lengths say how many), either may be absent (frozen); the channels' values are the full gradient's.
#[allow(clippy::too_many_arguments)]
pub fn bn_grad_w_rows<T: Real>(
    n: usize,
    c: usize,
    hw: usize,
    x: &[T],
    dy: &[T],
    mean: &[T],
    invstd: &[T],
    mut dgamma: Option<&mut [T]>,
    mut dbeta: Option<&mut [T]>,
    accumulate: bool,
) {
    let rows = dgamma
        .as_deref()
        .map_or(0, <[T]>::len)
        .max(dbeta.as_deref().map_or(0, <[T]>::len))
        .min(c);
    let put = |d: &mut Option<&mut [T]>, ch: usize, v: T| {
        if let Some(slot) = d.as_deref_mut().and_then(|d| d.get_mut(ch)) {
            if accumulate {
                *slot += v;
            } else {
                *slot = v;
            }
        }
    };
    let (mut sdy, mut sdxm) = ([T::ZERO; MAX_GROUP], [T::ZERO; MAX_GROUP]);
    for chs in groups(n, rows, hw, 2 * core::mem::size_of::<T>()) {
        group_grad_sums(n, c, hw, x, dy, chs.clone(), mean, &mut sdy, &mut sdxm);
        for (k, ch) in chs.enumerate() {
            put(&mut dgamma, ch, sdxm[k] * invstd[ch]);
            put(&mut dbeta, ch, sdy[k]);
        }
    }
}

/// Training-mode input gradient (through the batch statistics), PyTorch's formulation:
/// `dx = (dy − Σdy/N − (x−μ)·invstd²·Σ(x−μ)dy/N)·invstd·γ`, `N = n·hw` (added when `accumulate`).
#[allow(clippy::too_many_arguments)]
pub fn bn_grad_x<T: Real>(
    n: usize,
    c: usize,
    hw: usize,
    x: &[T],
    dy: &[T],
    mean: &[T],
    invstd: &[T],
    gamma: &[T],
    dx: &mut [T],
    accumulate: bool,
) {
    let count = n * hw;
    if count == 0 {
        return;
    }
    let cnt = T::from_usize(count);
    let (mut sdy, mut dotp) = ([T::ZERO; MAX_GROUP], [T::ZERO; MAX_GROUP]);
    for chs in groups(n, c, hw, 2 * core::mem::size_of::<T>()) {
        group_grad_sums(n, c, hw, x, dy, chs.clone(), mean, &mut sdy, &mut dotp);
        // Per channel of the group: (k, gm, a) in place of the sums.
        for (k, ch) in chs.clone().enumerate() {
            let is = invstd[ch];
            (dotp[k], sdy[k]) = (dotp[k] * is * is / cnt, sdy[k] / cnt);
        }
        for s in 0..n {
            for (j, ch) in chs.clone().enumerate() {
                let (mu, k, gm, a) = (mean[ch], dotp[j], sdy[j], invstd[ch] * gamma[ch]);
                let o = (s * c + ch) * hw;
                let it = dx[o..o + hw]
                    .iter_mut()
                    .zip(&x[o..o + hw])
                    .zip(&dy[o..o + hw]);
                if accumulate {
                    for ((d, &x), &g) in it {
                        *d += (g - gm - (x - mu) * k) * a;
                    }
                } else {
                    for ((d, &x), &g) in it {
                        *d = (g - gm - (x - mu) * k) * a;
                    }
                }
            }
        }
    }
}

/// [`bn_grad_x`] in place: `d` holds dy on entry and dx on return. Each channel's sums are taken before
/// that channel is overwritten, so the result is bit-identical to the out-of-place version.
#[allow(clippy::too_many_arguments)]
pub fn bn_grad_x_inplace<T: Real>(
    n: usize,
    c: usize,
    hw: usize,
    x: &[T],
    d: &mut [T],
    mean: &[T],
    invstd: &[T],
    gamma: &[T],
) {
    let count = n * hw;
    if count == 0 {
        return;
    }
    let cnt = T::from_usize(count);
    let (mut sdy, mut dotp) = ([T::ZERO; MAX_GROUP], [T::ZERO; MAX_GROUP]);
    for chs in groups(n, c, hw, 2 * core::mem::size_of::<T>()) {
        // The group's sums are taken before any of its channels is overwritten.
        group_grad_sums(n, c, hw, x, d, chs.clone(), mean, &mut sdy, &mut dotp);
        for (k, ch) in chs.clone().enumerate() {
            let is = invstd[ch];
            (dotp[k], sdy[k]) = (dotp[k] * is * is / cnt, sdy[k] / cnt);
        }
        for s in 0..n {
            for (j, ch) in chs.clone().enumerate() {
                let (mu, k, gm, a) = (mean[ch], dotp[j], sdy[j], invstd[ch] * gamma[ch]);
                let o = (s * c + ch) * hw;
                for (g, &x) in d[o..o + hw].iter_mut().zip(&x[o..o + hw]) {
                    *g = (*g - gm - (x - mu) * k) * a;
                }
            }
        }
    }
}

/// `(Σ g, Σ (x−μ)·g)` over each channel of `chs` with `g = pre(y, d)` taken element by element as it
/// is read (`μ = mean[ch]`), compensated, into `(sdy[k], sdxm[k])` by position in the group: the sums
/// [`group_grad_sums`] takes over a `dy` holding `pre(y, d)`, the same bits.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn group_grad_sums_then<T: Real>(
    n: usize,
    c: usize,
    hw: usize,
    x: &[T],
    y: &[T],
    d: &[T],
    chs: core::ops::Range<usize>,
    mean: &[T],
    pre: impl Fn(T, T) -> T + Copy,
    sdy: &mut [T; MAX_GROUP],
    sdxm: &mut [T; MAX_GROUP],
) {
    let mut a1 = [Comp::new(); MAX_GROUP];
    let mut a2 = [Comp::new(); MAX_GROUP];
    for s in 0..n {
        for (k, ch) in chs.clone().enumerate() {
            let o = (s * c + ch) * hw;
            let mu = mean[ch];
            let blocks = x[o..o + hw]
                .chunks(BLOCK)
                .zip(y[o..o + hw].chunks(BLOCK))
                .zip(d[o..o + hw].chunks(BLOCK));
            for ((xb, yb), db) in blocks {
                // `block_sum2`'s eight partial sums, the gradient transformed as it is read.
                let (mut s1, mut s2) = ([T::ZERO; LANES], [T::ZERO; LANES]);
                let mut cx = xb.chunks_exact(LANES);
                let mut cy = yb.chunks_exact(LANES);
                let mut cd = db.chunks_exact(LANES);
                for ((xv, yv), dv) in (&mut cx).zip(&mut cy).zip(&mut cd) {
                    for l in 0..LANES {
                        let g = pre(yv[l], dv[l]);
                        s1[l] += g;
                        s2[l] += (xv[l] - mu) * g;
                    }
                }
                let rest = cx
                    .remainder()
                    .iter()
                    .zip(cy.remainder())
                    .zip(cd.remainder());
                for (l, ((&xv, &yv), &dv)) in rest.enumerate() {
                    let g = pre(yv, dv);
                    s1[l] += g;
                    s2[l] += (xv - mu) * g;
                }
                a1[k].add(vector::combine(s1));
                a2[k].add(vector::combine(s2));
            }
        }
    }
    for k in 0..chs.len() {
        sdy[k] = a1[k].get();
        sdxm[k] = a2[k].get();
    }
}

/// The training-mode BatchNorm backward in place with the gradient reaching its output given as
/// `pre(y, d)` element by element: `d` holds the derivative of the layer after the BatchNorm (an
/// activation over its output `y`, `pre` its derivative, [`super::act::act_grad_one`]) on entry and the
/// BatchNorm's input derivative on return. `dgamma`/`dbeta` (at least `c` long) are overwritten with
/// every channel's parameter gradient from the same per-channel sums, which [`bn_grad_w_store`] then
/// puts where [`bn_grad_w_rows`] would: apart, because a plan may place the gradients in the bytes of
/// `y`, whose life ends with the activation's derivative (a caller passes a buffer of its own).
///
/// The same bits as [`super::act::act_grad_inplace`], [`bn_grad_w_rows`] and [`bn_grad_x_inplace`] in
/// turn, with the transformed gradient never written: one pass reads `x`, `y` and `d` for the sums, a
/// second (over a group the cache still holds) writes `d`, where the three kernels read the gradient
/// four times and write it twice.
#[allow(clippy::too_many_arguments)]
pub fn bn_grad_inplace_then<T: Real>(
    n: usize,
    c: usize,
    hw: usize,
    x: &[T],
    y: &[T],
    d: &mut [T],
    mean: &[T],
    invstd: &[T],
    gamma: &[T],
    dgamma: &mut [T],
    dbeta: &mut [T],
    pre: impl Fn(T, T) -> T + Copy,
) {
    let count = n * hw;
    let cnt = T::from_usize(count);
    let (mut sdy, mut dotp) = ([T::ZERO; MAX_GROUP], [T::ZERO; MAX_GROUP]);
    for chs in groups(n, c, hw, 3 * core::mem::size_of::<T>()) {
        group_grad_sums_then(
            n,
            c,
            hw,
            x,
            y,
            d,
            chs.clone(),
            mean,
            pre,
            &mut sdy,
            &mut dotp,
        );
        for (k, ch) in chs.clone().enumerate() {
            let is = invstd[ch];
            // The parameter gradients first ([`bn_grad_w_rows`]), then the input derivative's factors
            // ([`bn_grad_x_inplace`]) in place of the sums.
            dgamma[ch] = dotp[k] * is;
            dbeta[ch] = sdy[k];
            (dotp[k], sdy[k]) = (dotp[k] * is * is / cnt, sdy[k] / cnt);
        }
        if count == 0 {
            continue; // no element to write (the parameter gradients are the empty sums)
        }
        for s in 0..n {
            for (j, ch) in chs.clone().enumerate() {
                let (mu, k, gm, a) = (mean[ch], dotp[j], sdy[j], invstd[ch] * gamma[ch]);
                let o = (s * c + ch) * hw;
                let it = d[o..o + hw]
                    .iter_mut()
                    .zip(&x[o..o + hw])
                    .zip(&y[o..o + hw]);
                for ((g, &x), &y) in it {
                    *g = (pre(y, *g) - gm - (x - mu) * k) * a;
                }
            }
        }
    }
}

/// Stores the parameter gradient `src` (every channel's, from [`bn_grad_inplace_then`]) into `dst`,
/// the leading channels that train (absent: frozen), added when `accumulate`: what
/// [`bn_grad_w_rows`] writes there.
pub fn bn_grad_w_store<T: Real>(src: &[T], dst: Option<&mut [T]>, accumulate: bool) {
    for (d, &v) in dst.unwrap_or_default().iter_mut().zip(src) {
        if accumulate {
            *d += v;
        } else {
            *d = v;
        }
    }
}

/// Eval-mode (frozen) input gradient: `dx = dy·γ/√(run_var + eps)` (added when `accumulate`).
#[allow(clippy::too_many_arguments)]
pub fn bn_grad_x_eval<T: Real>(
    n: usize,
    c: usize,
    hw: usize,
    dy: &[T],
    gamma: &[T],
    run_var: &[T],
    eps: T,
    dx: &mut [T],
    accumulate: bool,
) {
    for ch in 0..c {
        let a = gamma[ch] / (run_var[ch] + eps).sqrt();
        for s in 0..n {
            let o = (s * c + ch) * hw;
            super::elementwise::scale_into(a, &dy[o..o + hw], &mut dx[o..o + hw], accumulate);
        }
    }
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;
    use crate::rng::Rng;

    struct Out<T> {
        y: Vec<T>,
        mean: Vec<T>,
        invstd: Vec<T>,
        rm: Vec<T>,
        rv: Vec<T>,
    }

    #[allow(clippy::too_many_arguments)]
    fn train<T: Real>(
        n: usize,
        c: usize,
        hw: usize,
        x: &[T],
        g: &[T],
        b: &[T],
        rm: &[T],
        rv: &[T],
    ) -> Out<T> {
        let mut o = Out {
            y: vec![T::ZERO; n * c * hw],
            mean: vec![T::ZERO; c],
            invstd: vec![T::ZERO; c],
            rm: rm.to_vec(),
            rv: rv.to_vec(),
        };
        let (m, e) = (T::from_f32(0.1), T::from_f32(1e-5));
        bn_fwd_train(
            n,
            c,
            hw,
            x,
            g,
            b,
            &mut o.y,
            &mut o.mean,
            &mut o.invstd,
            &mut o.rm,
            &mut o.rv,
            m,
            e,
        );
        o
    }

    /// The activation derivative fused into the BatchNorm backward gives the same bits as the activation's
    /// derivative, the gradient and the input derivative in turn: ReLU and ReLU6 (outputs on and past
    /// both edges, exactly 0 and 6 among them), planes that are not a multiple of eight or of a block,
    /// groups of several channels and of one, a sparse update's leading channels, a frozen γ, added
    /// gradients.
    #[test]
    fn act_then_backward_in_one_kernel_is_bit_identical() {
        use crate::ops::act::{act_fwd_inplace, act_grad_inplace, act_grad_one, Act};
        let mut rng = Rng::new(41);
        for &(n, c, hw) in &[
            (3usize, 5usize, 13usize),
            (2, 70, 9),
            (4, 3, 130),
            (1, 2, 1),
            (40, 3, 4096),
        ] {
            for act in [Act::Relu, Act::Relu6] {
                for (rows, frozen_gamma, acc) in [
                    (c, false, false),
                    (c.div_ceil(2), false, true),
                    (c, true, false),
                ] {
                    let len = n * c * hw;
                    let x = to_f32(&rand_vec(&mut rng, len, -3.0, 3.0));
                    let gamma = to_f32(&rand_vec(&mut rng, c, 0.5, 4.0));
                    let beta = to_f32(&rand_vec(&mut rng, c, -1.0, 7.0));
                    let o = train(n, c, hw, &x, &gamma, &beta, &vec![0.0; c], &vec![1.0; c]);
                    let mut y = o.y.clone();
                    act_fwd_inplace(act, &mut y);
                    // Outputs exactly on the edges, where the derivative's conventions matter.
                    for (i, v) in y.iter_mut().enumerate().step_by(7) {
                        *v = if i % 2 == 0 { 0.0 } else { 6.0 };
                    }
                    let dy = to_f32(&rand_vec(&mut rng, len, -1.0, 1.0));
                    let start = to_f32(&rand_vec(&mut rng, c, -1.0, 1.0));
                    // The three kernels in turn.
                    let mut d_ref = dy.clone();
                    act_grad_inplace(act, &y, &mut d_ref);
                    let (mut dg_ref, mut db_ref) = (start[..rows].to_vec(), start[..rows].to_vec());
                    bn_grad_w_rows(
                        n,
                        c,
                        hw,
                        &x,
                        &d_ref,
                        &o.mean,
                        &o.invstd,
                        (!frozen_gamma).then_some(&mut dg_ref[..]),
                        Some(&mut db_ref[..]),
                        acc,
                    );
                    bn_grad_x_inplace(n, c, hw, &x, &mut d_ref, &o.mean, &o.invstd, &gamma);
                    // One kernel.
                    let mut d = dy.clone();
                    let (mut dg, mut db) = (start[..rows].to_vec(), start[..rows].to_vec());
                    let (mut sg, mut sb) = (vec![0.0; c], vec![0.0; c]);
                    bn_grad_inplace_then(
                        n,
                        c,
                        hw,
                        &x,
                        &y,
                        &mut d,
                        &o.mean,
                        &o.invstd,
                        &gamma,
                        &mut sg,
                        &mut sb,
                        |y, g| act_grad_one(act, y, g),
                    );
                    bn_grad_w_store(&sg, (!frozen_gamma).then_some(&mut dg[..]), acc);
                    bn_grad_w_store(&sb, Some(&mut db[..]), acc);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let what = format!("{act:?} n{n} c{c} hw{hw} rows{rows}");
                    assert_eq!(bits(&d), bits(&d_ref), "{what}: dx");
                    assert_eq!(bits(&dg), bits(&dg_ref), "{what}: dγ");
                    assert_eq!(bits(&db), bits(&db_ref), "{what}: dβ");
                }
            }
        }
    }

    /// A channel at a time, as the kernels ran before they walked groups of channels sample by sample:
    /// the statistics, the outputs and the gradients must be the same bits.
    mod channel_at_a_time {
        use super::super::{block_sum2, Comp, BLOCK};
        use crate::kernels::vector::sum_map;
        use crate::kernels::Real;

        fn planes<T>(
            n: usize,
            c: usize,
            hw: usize,
            x: &[T],
            ch: usize,
        ) -> impl Iterator<Item = &[T]> {
            (0..n).map(move |s| &x[(s * c + ch) * hw..(s * c + ch + 1) * hw])
        }

        pub fn chan_sum<T: Real>(
            n: usize,
            c: usize,
            hw: usize,
            x: &[T],
            ch: usize,
            f: impl Fn(T) -> T + Copy,
        ) -> T {
            let mut acc = Comp::new();
            for p in planes(n, c, hw, x, ch) {
                for b in p.chunks(BLOCK) {
                    acc.add(sum_map(b, f));
                }
            }
            acc.get()
        }

        #[allow(clippy::too_many_arguments)]
        pub fn chan_grad_sums<T: Real>(
            n: usize,
            c: usize,
            hw: usize,
            x: &[T],
            dy: &[T],
            ch: usize,
            mu: T,
        ) -> (T, T) {
            let (mut a1, mut a2) = (Comp::new(), Comp::new());
            for (xp, dp) in planes(n, c, hw, x, ch).zip(planes(n, c, hw, dy, ch)) {
                for (xb, db) in xp.chunks(BLOCK).zip(dp.chunks(BLOCK)) {
                    let (s1, s2) = block_sum2(xb, db, |v| v - mu);
                    a1.add(s1);
                    a2.add(s2);
                }
            }
            (a1.get(), a2.get())
        }
    }

    #[test]
    fn channel_groups_give_the_bits_of_a_channel_at_a_time() {
        use channel_at_a_time::*;
        let mut rng = Rng::new(21);
        // Groups of many channels (small planes), of one (large planes), a short last group, planes
        // that are not a multiple of the block.
        for (n, c, hw) in [
            (3, 70, 16),
            (5, 130, 9),
            (2, 3, 40_000),
            (7, 65, 70),
            (1, 1, 1),
        ] {
            let len = n * c * hw;
            let x: Vec<f32> = (0..len).map(|_| rng.uniform(-2.0, 3.0)).collect();
            let dy: Vec<f32> = (0..len).map(|_| rng.uniform(-1.0, 1.0)).collect();
            let gamma: Vec<f32> = (0..c).map(|_| rng.uniform(0.5, 1.5)).collect();
            let beta: Vec<f32> = (0..c).map(|_| rng.uniform(-0.5, 0.5)).collect();
            let got = train(n, c, hw, &x, &gamma, &beta, &vec![0.0; c], &vec![1.0; c]);
            let cnt = (n * hw) as f32;
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let mut want_y = vec![0f32; len];
            let (mut dx, mut want_dx) = (vec![0f32; len], vec![0f32; len]);
            for ch in 0..c {
                let mu = chan_sum(n, c, hw, &x, ch, |v| v) / cnt;
                let ss = chan_sum(n, c, hw, &x, ch, |v| (v - mu) * (v - mu));
                let is = 1.0 / (ss / cnt + 1e-5).sqrt();
                assert_eq!(
                    got.mean[ch].to_bits(),
                    mu.to_bits(),
                    "mean, shape {n}×{c}×{hw}"
                );
                assert_eq!(got.invstd[ch].to_bits(), is.to_bits(), "invstd");
                let (sdy, dotp) = chan_grad_sums(n, c, hw, &x, &dy, ch, mu);
                let (k, gm, a) = (dotp * is * is / cnt, sdy / cnt, is * gamma[ch]);
                for s in 0..n {
                    let o = (s * c + ch) * hw;
                    for i in o..o + hw {
                        want_y[i] = (x[i] - mu) * (gamma[ch] * is) + beta[ch];
                        want_dx[i] = (dy[i] - gm - (x[i] - mu) * k) * a;
                    }
                }
            }
            assert_eq!(bits(&got.y), bits(&want_y), "y");
            let mut y = vec![0f32; len];
            bn_fwd_recompute(n, c, hw, &x, &gamma, &beta, &got.mean, &got.invstd, &mut y);
            assert_eq!(bits(&y), bits(&want_y), "recomputed y");
            bn_grad_x(
                n,
                c,
                hw,
                &x,
                &dy,
                &got.mean,
                &got.invstd,
                &gamma,
                &mut dx,
                false,
            );
            assert_eq!(bits(&dx), bits(&want_dx), "dx");
            let (mut dg, mut db) = (vec![0f32; c], vec![0f32; c]);
            bn_grad_w(
                n,
                c,
                hw,
                &x,
                &dy,
                &got.mean,
                &got.invstd,
                &mut dg,
                &mut db,
                false,
            );
            for ch in 0..c {
                let (sdy, sdxm) = chan_grad_sums(n, c, hw, &x, &dy, ch, got.mean[ch]);
                assert_eq!(
                    dg[ch].to_bits(),
                    (sdxm * got.invstd[ch]).to_bits(),
                    "dgamma"
                );
                assert_eq!(db[ch].to_bits(), sdy.to_bits(), "dbeta");
            }
        }
    }

    #[test]
    fn grad_x_in_place_is_bit_identical() {
        let (n, c, hw) = (3, 2, 5);
        let mut rng = crate::rng::Rng::new(11);
        let v = |rng: &mut crate::rng::Rng, k: usize| {
            (0..k)
                .map(|_| rng.uniform(-1.0, 1.0))
                .collect::<alloc::vec::Vec<f32>>()
        };
        let (x, dy, g) = (
            v(&mut rng, n * c * hw),
            v(&mut rng, n * c * hw),
            v(&mut rng, c),
        );
        let mean = [0.1f32, -0.2];
        let invstd = [1.3f32, 0.7];
        let mut dx = alloc::vec![0f32; n * c * hw];
        bn_grad_x(n, c, hw, &x, &dy, &mean, &invstd, &g, &mut dx, false);
        let mut d = dy.clone();
        bn_grad_x_inplace(n, c, hw, &x, &mut d, &mean, &invstd, &g);
        assert!(d.iter().zip(&dx).all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    #[test]
    fn hand_computed_running_stats() {
        // x = 1 2 3 4: mean 2.5, biased var 1.25, unbiased 5/3.
        let o = train(
            1,
            1,
            4,
            &[1.0f64, 2.0, 3.0, 4.0],
            &[2.0],
            &[0.5],
            &[0.0],
            &[1.0],
        );
        let eps = 1e-5f32 as f64;
        assert_eq!(o.mean, [2.5]);
        let is = 1.0 / (1.25 + eps).sqrt();
        assert!((o.invstd[0] - is).abs() < 1e-15);
        let m = 0.1f32 as f64;
        assert!((o.rm[0] - m * 2.5).abs() < 1e-15);
        assert!(
            (o.rv[0] - ((1.0 - m) + m * 5.0 / 3.0)).abs() < 1e-15,
            "{}",
            o.rv[0]
        );
        for (i, &v) in [1.0, 2.0, 3.0, 4.0].iter().enumerate() {
            assert!((o.y[i] - ((v - 2.5) * is * 2.0 + 0.5)).abs() < 1e-14);
        }
        // Same in f32 (momentum 0.1 → 0.9·1 + 0.1·1.6667 = 1.0666667).
        let o = train(
            1,
            1,
            4,
            &[1.0f32, 2.0, 3.0, 4.0],
            &[2.0],
            &[0.5],
            &[0.0],
            &[1.0],
        );
        assert!((o.rv[0] - 1.066_666_7).abs() < 2e-7);
        assert!((o.rm[0] - 0.25).abs() < 1e-7);
        // Two samples, spatial extent: statistics run over (n, hw), not per sample.
        let x = [1.0f64, 2.0, 10.0, 20.0, 3.0, 4.0, 30.0, 40.0]; // [n=2, c=2, hw=2]
        let o = train(
            2,
            2,
            2,
            &x,
            &[1.0, 1.0],
            &[0.0, 0.0],
            &[0.0, 0.0],
            &[0.0, 0.0],
        );
        assert_eq!(o.mean, [2.5, 25.0]);
        assert!((o.rv[1] - 0.1 * (500.0 / 3.0)).abs() < 1e-6, "{}", o.rv[1]);
    }

    #[test]
    fn fd_train_mode() {
        let mut rng = Rng::new(70);
        for (n, c, hw) in [(3, 2, 5), (1, 3, 7), (4, 1, 1)] {
            let len = n * c * hw;
            let x = rand_vec(&mut rng, len, -1.0, 1.0);
            let g = rand_vec(&mut rng, c, 0.5, 1.5);
            let b = rand_vec(&mut rng, c, -1.0, 1.0);
            let r = rand_vec(&mut rng, len, -1.0, 1.0);
            let (rm, rv) = (vec![0.0; c], vec![1.0; c]);
            let o = train(n, c, hw, &x, &g, &b, &rm, &rv);
            let (mut dg, mut db, mut dx) = (vec![0.0; c], vec![0.0; c], vec![9.0; len]);
            bn_grad_w(
                n, c, hw, &x, &r, &o.mean, &o.invstd, &mut dg, &mut db, false,
            );
            bn_grad_x(n, c, hw, &x, &r, &o.mean, &o.invstd, &g, &mut dx, false);
            let pre = rand_vec(&mut rng, len, -1.0, 1.0);
            let mut dacc = pre.clone();
            bn_grad_x(n, c, hw, &x, &r, &o.mean, &o.invstd, &g, &mut dacc, true);
            let loss =
                |x: &[f64], g: &[f64], b: &[f64]| dotf(&train(n, c, hw, x, g, b, &rm, &rv).y, &r);
            let fx = fd_grad(&x, |x| loss(x, &g, &b));
            let fg = fd_grad(&g, |g| loss(&x, g, &b));
            let fb = fd_grad(&b, |b| loss(&x, &g, b));
            assert_close("bn dx", &dx, &fx, FD_TOL, FD_FLOOR);
            assert_close("bn dx acc", &sub(&dacc, &pre), &fx, FD_TOL, FD_FLOOR);
            assert_close("bn dgamma", &dg, &fg, FD_TOL, FD_FLOOR);
            assert_close("bn dbeta", &db, &fb, FD_TOL, FD_FLOOR);
        }
    }

    #[test]
    fn fd_eval_mode() {
        let mut rng = Rng::new(71);
        let (n, c, hw) = (2, 3, 4);
        let len = n * c * hw;
        let x = rand_vec(&mut rng, len, -1.0, 1.0);
        let g = rand_vec(&mut rng, c, 0.5, 1.5);
        let b = rand_vec(&mut rng, c, -1.0, 1.0);
        let rm = rand_vec(&mut rng, c, -0.5, 0.5);
        let rv = rand_vec(&mut rng, c, 0.5, 2.0);
        let r = rand_vec(&mut rng, len, -1.0, 1.0);
        let eps = 1e-5;
        let fwd = |x: &[f64]| {
            let mut y = vec![0.0; len];
            bn_fwd_eval(n, c, hw, x, &g, &b, &rm, &rv, eps, &mut y);
            y
        };
        let mut dx = vec![9.0; len];
        bn_grad_x_eval(n, c, hw, &r, &g, &rv, eps, &mut dx, false);
        let pre = rand_vec(&mut rng, len, -1.0, 1.0);
        let mut dacc = pre.clone();
        bn_grad_x_eval(n, c, hw, &r, &g, &rv, eps, &mut dacc, true);
        let fx = fd_grad(&x, |x| dotf(&fwd(x), &r));
        assert_close("bn eval dx", &dx, &fx, FD_TOL, FD_FLOOR);
        assert_close("bn eval dx acc", &sub(&dacc, &pre), &fx, FD_TOL, FD_FLOOR);
        // Eval with the running stats equal to the batch stats reproduces the training forward.
        let o = train(n, c, hw, &x, &g, &b, &rm, &rv);
        let bv: Vec<f64> = o.invstd.iter().map(|is| 1.0 / (is * is) - eps).collect();
        let mut ye = vec![0.0; len];
        bn_fwd_eval(n, c, hw, &x, &g, &b, &o.mean, &bv, eps, &mut ye);
        assert_close("bn eval = train", &ye, &o.y, 1e-12, 1e-3);
    }

    #[test]
    fn f32_matches_f64_with_offset() {
        // A large common offset (mean ≫ std) is the hard case for one-pass variance. With two passes and
        // compensated block sums, mean, invstd and the running statistics keep ~1e-7 relative accuracy
        // in f32 (the few final roundings); 1e-6 is the PyTorch-matching target.
        let mut rng = Rng::new(72);
        let (n, c, hw) = (8, 3, 28 * 28);
        let len = n * c * hw;
        let x: Vec<f64> = rand_vec(&mut rng, len, -1.0, 1.0)
            .iter()
            .map(|v| (v + 100.0) as f32 as f64)
            .collect();
        let g = rand_vec(&mut rng, c, 0.5, 1.5);
        let b = rand_vec(&mut rng, c, -1.0, 1.0);
        let dy = rand_vec(&mut rng, len, -1.0, 1.0);
        let (rm, rv) = (vec![0.5; c], vec![1.0; c]);
        let o = train(n, c, hw, &x, &g, &b, &rm, &rv);
        let o32 = train(
            n,
            c,
            hw,
            &to_f32(&x),
            &to_f32(&g),
            &to_f32(&b),
            &to_f32(&rm),
            &to_f32(&rv),
        );
        assert_close("mean", &widen(&o32.mean), &o.mean, 1e-6, 0.0);
        assert_close("invstd", &widen(&o32.invstd), &o.invstd, 1e-6, 0.0);
        assert_close("run_mean", &widen(&o32.rm), &o.rm, 1e-6, 0.0);
        assert_close("run_var", &widen(&o32.rv), &o.rv, 1e-6, 0.0);
        // y = (x−μ)·a + b. The f32 mean itself is off by up to u·|μ| (u = 2^-24; |μ| ≈ 100 here, so
        // ≈ 6e-6 absolute — no f32 value is closer, PyTorch's saved f32 mean has the same error),
        // which shifts every y of the channel by a·u·|μ|; the rest is a few roundings of |x−μ|·|a|
        // and |y|. Bound: |Δy| ≤ 4u·(|a|·(|μ| + |x−μ|) + |y|).
        let u = 1.0 / (1u64 << 24) as f64;
        for s in 0..n {
            for ch in 0..c {
                let a = (g[ch] * o.invstd[ch]).abs();
                for i in 0..hw {
                    let j = (s * c + ch) * hw + i;
                    let bound = 4.0
                        * u
                        * (a * (o.mean[ch].abs() + (x[j] - o.mean[ch]).abs()) + o.y[j].abs());
                    let err = (o32.y[j] as f64 - o.y[j]).abs();
                    assert!(err <= bound, "y[{j}]: err {err:e} > {bound:e}");
                }
            }
        }
        // Without the offset the mean is O(σ) and y agrees to ~1e-6 normwise.
        let xc: Vec<f64> = x.iter().map(|v| ((v - 100.0) as f32) as f64).collect();
        let oc = train(n, c, hw, &xc, &g, &b, &rm, &rv);
        let oc32 = train(
            n,
            c,
            hw,
            &to_f32(&xc),
            &to_f32(&g),
            &to_f32(&b),
            &to_f32(&rm),
            &to_f32(&rv),
        );
        assert_close("y centred", &widen(&oc32.y), &oc.y, 1e-6, 1.0);
        let (mut dg, mut db, mut dx) = (vec![0.0; c], vec![0.0; c], vec![0.0; len]);
        let (mut dg32, mut db32, mut dx32) = (vec![0f32; c], vec![0f32; c], vec![0f32; len]);
        bn_grad_w(
            n, c, hw, &x, &dy, &o.mean, &o.invstd, &mut dg, &mut db, false,
        );
        bn_grad_x(n, c, hw, &x, &dy, &o.mean, &o.invstd, &g, &mut dx, false);
        let dy32 = to_f32(&dy);
        let x32 = to_f32(&x);
        bn_grad_w(
            n,
            c,
            hw,
            &x32,
            &dy32,
            &o32.mean,
            &o32.invstd,
            &mut dg32,
            &mut db32,
            false,
        );
        bn_grad_x(
            n,
            c,
            hw,
            &x32,
            &dy32,
            &o32.mean,
            &o32.invstd,
            &to_f32(&g),
            &mut dx32,
            false,
        );
        // dγ, dβ are sums of ~19k terms of random sign: compared relative to Σ|terms| (≈ count/4 and
        // count/2 here), compensation keeps the error at a few ulps of that.
        let cnt = (n * hw) as f64;
        for ch in 0..c {
            assert!(
                (dg32[ch] as f64 - dg[ch]).abs() <= 1e-6 * cnt,
                "dgamma {ch}"
            );
            assert!((db32[ch] as f64 - db[ch]).abs() <= 1e-6 * cnt, "dbeta {ch}");
        }
        // dx = (dy − gm − (x−μ)k)·a: O(1) terms, a few roundings each: normwise 1e-6.
        assert_close("dx", &widen(&dx32), &dx, 1e-6, 1.0);
        let mut dxe = vec![0.0; len];
        let mut dxe32 = vec![0f32; len];
        bn_grad_x_eval(n, c, hw, &dy, &g, &rv, 1e-5, &mut dxe, false);
        bn_grad_x_eval(
            n,
            c,
            hw,
            &dy32,
            &to_f32(&g),
            &to_f32(&rv),
            1e-5,
            &mut dxe32,
            false,
        );
        assert_close("dx eval", &widen(&dxe32), &dxe, 1e-6, 1e-3);
        let mut ye = vec![0.0; len];
        let mut ye32 = vec![0f32; len];
        bn_fwd_eval(n, c, hw, &x, &g, &b, &o.rm, &o.rv, 1e-5, &mut ye);
        bn_fwd_eval(
            n,
            c,
            hw,
            &x32,
            &to_f32(&g),
            &to_f32(&b),
            &o32.rm,
            &o32.rv,
            1e-5,
            &mut ye32,
        );
        // Eval normalises by the running statistics (mean ≈ 10, std ≈ 1): x − run_mean ≈ 90 carries
        // the f32 rounding of run_mean (~1e-6 relative of 10) amplified by a/|y|; normwise 1e-5.
        assert_close("y eval", &widen(&ye32), &ye, 1e-5, 1.0);
    }

    /// The BatchNorm forward with the activation applied as it writes (what the CPU backend runs for a
    /// BatchNorm followed by a ReLU/ReLU6 in place) against the two in turn: the same bits, for the
    /// training forward (and its running statistics) and the recomputation. The inputs straddle both
    /// kinks (outputs below 0 and above 6), NaN included.
    #[test]
    fn bn_then_activation_is_the_bits_of_bn_and_the_activation_in_turn() {
        use crate::ops::act::{act_fwd_inplace, relu, relu6, Act};
        let mut rng = Rng::new(33);
        for (n, c, hw) in [(3, 70, 16), (2, 3, 4100), (5, 9, 1)] {
            let len = n * c * hw;
            let mut x: Vec<f32> = (0..len).map(|_| rng.uniform(-4.0, 4.0)).collect();
            x[len / 2] = f32::NAN;
            let g: Vec<f32> = (0..c).map(|_| rng.uniform(0.5, 8.0)).collect();
            let b: Vec<f32> = (0..c).map(|_| rng.uniform(-3.0, 3.0)).collect();
            let rm: Vec<f32> = (0..c).map(|_| rng.uniform(-1.0, 1.0)).collect();
            let rv: Vec<f32> = (0..c).map(|_| rng.uniform(0.5, 2.0)).collect();
            let want = train(n, c, hw, &x, &g, &b, &rm, &rv);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for act in [Act::Relu, Act::Relu6] {
                let mut y_ref = want.y.clone();
                act_fwd_inplace(act, &mut y_ref);
                assert!(y_ref.contains(&0.0), "{act:?}: no clamped output");
                if act == Act::Relu6 {
                    assert!(y_ref.contains(&6.0), "no output clamped at 6");
                }
                let mut o = Out {
                    y: vec![0.0; len],
                    mean: vec![0.0; c],
                    invstd: vec![0.0; c],
                    rm: rm.clone(),
                    rv: rv.clone(),
                };
                let (m, e) = (0.1f32, 1e-5f32);
                macro_rules! fwd {
                    ($post:expr) => {
                        bn_fwd_train_then(
                            n,
                            c,
                            hw,
                            &x,
                            &g,
                            &b,
                            &mut o.y,
                            &mut o.mean,
                            &mut o.invstd,
                            &mut o.rm,
                            &mut o.rv,
                            m,
                            e,
                            $post,
                        )
                    };
                }
                match act {
                    Act::Relu => fwd!(relu),
                    _ => fwd!(relu6),
                }
                assert_eq!(bits(&o.y), bits(&y_ref), "{act:?} ({n}, {c}, {hw})");
                assert_eq!(bits(&o.mean), bits(&want.mean));
                assert_eq!(bits(&o.invstd), bits(&want.invstd));
                assert_eq!(bits(&o.rm), bits(&want.rm));
                assert_eq!(bits(&o.rv), bits(&want.rv));
                let mut r = vec![0.0f32; len];
                macro_rules! rec {
                    ($post:expr) => {
                        bn_fwd_recompute_then(
                            n,
                            c,
                            hw,
                            &x,
                            &g,
                            &b,
                            &want.mean,
                            &want.invstd,
                            &mut r,
                            $post,
                        )
                    };
                }
                match act {
                    Act::Relu => rec!(relu),
                    _ => rec!(relu6),
                }
                assert_eq!(
                    bits(&r),
                    bits(&y_ref),
                    "recompute, {act:?} ({n}, {c}, {hw})"
                );
            }
        }
    }
}
