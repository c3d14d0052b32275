//! Recurrent layers: the recurrent part of an LSTM and of a GRU (PyTorch's `nn.LSTM`/`nn.GRU`, one
//! layer, `batch_first`, zero initial state), on `[n, seq, ·]` tensors, row-major.
//!
//! The input projection `x·W_ihᵀ + b_ih` of every time step is a plain Linear before the layer (one
//! GEMM over all `n·seq` token rows); these ops take its output, the gate pre-activations `xg`
//! `[n, seq, G·hidden]` (`G` = 4 for the LSTM in PyTorch's gate order i, f, g, o; 3 for the GRU:
//! r, z, n), and own `W_hh [G·hidden, hidden]` and `b_hh [G·hidden]`. Each time step runs the
//! recurrent GEMM `h_{t−1}·W_hhᵀ` over the batch.
//!
//! The layer runs one time step at a time: [`rnn_fwd_step`] and [`rnn_grad_x_step`] are each one
//! instruction of the plan (`Phase::StepFwd`/`Phase::StepBwd`), so the planner sees every step's
//! saved tensors — the gates after their nonlinearities (`[n, G·hidden]`) and one state (`[n,
//! hidden]`: the LSTM's cell `c_t`; the GRU's `W_hn·h_{t−1} + b_hn`, which the reset gate
//! multiplies) — each alive from its forward step to its backward step. The output `y` (`[n, seq,
//! hidden]`, every `h_t`) is read back too, and the GRU keeps its reset gates (`[n, seq, hidden]`)
//! for the weight gradient.
//!
//! The backward runs through time, step `seq − 1` down to 0, writing `dxg` (the gate
//! pre-activations' derivative, which is also the projection's output derivative) and carrying `dh`
//! (and the LSTM's `dc`) from step to step in a planned tensor; the weight gradients then read `dxg`:
//! `dW_hh = Σ_t dgᵀ·h_{t−1}` (one GEMM per chunk of samples, ≥ 512 steps deep) and `db_hh = Σ dg`,
//! where `dg` is `dxg` except for the GRU's n gate (`r ∘ dn`). The arithmetic is that of the
//! whole-sequence kernels these replaced, operation for operation (the tests keep those to compare
//! bit for bit).
use crate::kernels::{gemm, gemm_scratch_len, MatRef, Real};
use crate::ops::act::{act_fwd, act_fwd_inplace, Act};

/// Which recurrent cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cell {
    /// Long short-term memory: gates i, f, g, o.
    Lstm,
    /// Gated recurrent unit: gates r, z, n (`b_hn` inside the reset product).
    Gru,
}

impl Cell {
    /// Gates per hidden unit.
    pub const fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
        }
    }
}

/// Geometry of a recurrent layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RnnGeom {
    /// The cell.
    pub cell: Cell,
    /// Sequence length (time steps).
    pub seq: usize,
    /// Hidden width.
    pub hidden: usize,
}

impl RnnGeom {
    /// Gate width `G·hidden`.
    pub fn gate_width(&self) -> usize {
        self.cell.gates() * self.hidden
    }
}

/// Scratch elements of one forward step for `n` samples (the step's `W_hh·h_{t−1}ᵀ`, the GRU's
/// `h·W_hhᵀ + b_hh` too, GEMM packing).
pub fn rnn_fwd_scratch_len(g: &RnnGeom, n: usize) -> usize {
    let gw = g.gate_width();
    let own = match g.cell {
        Cell::Lstm => n * gw,
        Cell::Gru => 2 * n * gw,
    };
    own + gemm_scratch_len(gw, n, g.hidden)
}

/// Scratch elements of one backward step for `n` samples (the LSTM's row of `tanh(c)` or the GRU's
/// recurrent gate derivative of the step; GEMM packing). The derivatives carried from step to step
/// are a planned tensor of their own ([`rnn_carry_len`]).
pub fn rnn_grad_x_scratch_len(g: &RnnGeom, n: usize) -> usize {
    let gw = g.gate_width();
    let own = match g.cell {
        Cell::Lstm => g.hidden,
        Cell::Gru => n * gw,
    };
    own + gemm_scratch_len(n, g.hidden, gw)
}

/// Elements of the derivatives the backward carries from step `t` to step `t − 1` for `n` samples:
/// `dh` (`[n, hidden]`), then the LSTM's `dc` (as many).
pub fn rnn_carry_len(g: &RnnGeom, n: usize) -> usize {
    match g.cell {
        Cell::Lstm => 2 * n * g.hidden,
        Cell::Gru => n * g.hidden,
    }
}

/// Samples per weight-gradient GEMM: enough of them that the product is ≥ 512 steps deep (a GEMM
/// over one sample's few steps would rewrite all of `dW_hh` for little work), at most `n`.
fn grad_w_chunk(g: &RnnGeom, n: usize) -> usize {
    n.min((512 / g.seq.max(1)).max(1))
}

/// Scratch elements of the weight gradient for up to `n` samples: a chunk of samples' `h_{t−1}` rows
/// (and the GRU's recurrent gate derivatives), GEMM packing; bounded by 512 steps' rows, not the batch.
pub fn rnn_grad_w_scratch_len(g: &RnnGeom, n: usize) -> usize {
    let (gw, steps) = (g.gate_width(), grad_w_chunk(g, n) * g.seq);
    let own = steps * g.hidden
        + match g.cell {
            Cell::Lstm => 0,
            Cell::Gru => steps * gw,
        };
    own + gemm_scratch_len(gw, g.hidden, steps)
}

/// The recurrent product of a forward step, transposed: `gt = W_hh·h_{t−1}ᵀ` (`[G·hidden, n]`),
/// `h_{t−1}` being row `t − 1` of each sample's outputs (`prev`, sample stride `ys`). As `h·W_hhᵀ`,
/// B would be `W_hh` column-major, repacked whole (`G·hidden × hidden`) at every step: 10 % of the
/// char LSTM's training step. Transposed, `W_hh` is A, read in place, and only `h_{t−1}` (`n ×
/// hidden`) is packed. Each element is the same depth-ordered sum either way; the caller adds it
/// to the pre-activations.
fn recurrent_product<T: Real>(
    g: &RnnGeom,
    n: usize,
    w: &[T],
    prev: &[T],
    ys: usize,
    gt: &mut [T],
    room: &mut [T],
) {
    let (h, gw) = (g.hidden, g.gate_width());
    let hp = MatRef {
        data: prev,
        rs: 1,
        cs: ys,
    };
    gemm(gw, n, h, MatRef::row_major(w, h), hp, gt, n, false, room);
}

/// `dst[s, j] += gt[j, s]` for `dst` `[n, gw]` and `gt` `[gw, n]`, 16 columns of `dst` at a time
/// (so the 16 rows of `gt` they read stay in L1 while every sample's row takes its 16 sums).
fn add_transposed<T: Real>(n: usize, gw: usize, gt: &[T], dst: &mut [T]) {
    const J: usize = 16;
    let (gt, dst) = (&gt[..gw * n], &mut dst[..n * gw]);
    for j0 in (0..gw).step_by(J) {
        let j1 = (j0 + J).min(gw);
        let block = &gt[j0 * n..j1 * n];
        for (s, row) in dst.chunks_exact_mut(gw).enumerate() {
            for (d, col) in row[j0..j1].iter_mut().zip(block.chunks_exact(n)) {
                *d += col[s];
            }
        }
    }
}

/// Forward step `t` of `n` sequences: `xg` the input projection (`[n, seq, G·hidden]`), `w` = `W_hh`,
/// `b` = `b_hh`, `y` the output (`[n, seq, hidden]`: rows `t − 1` read, rows `t` written). Writes the
/// step's gates after their nonlinearities (`gates`, `[n, G·hidden]`) and state (`state`, `[n,
/// hidden]`: LSTM `c_t`, GRU `W_hn·h_{t−1} + b_hn`) from the previous step's (`prev`: LSTM `c_{t−1}`,
/// unused at `t = 0` and by the GRU); the GRU also keeps its reset gate in `r` (`[n, seq, hidden]`,
/// rows `t`), the one gate its weight gradient reads. The element-wise work is a few simple passes
/// over rows of `hidden` (each vectorises). Each step is one instruction of the plan, so the planner
/// sees every step's saved tensors; the arithmetic is the whole-sequence kernel's, step by step.
#[allow(clippy::too_many_arguments)]
pub fn rnn_fwd_step<T: Real>(
    g: &RnnGeom,
    n: usize,
    t: usize,
    xg: &[T],
    w: &[T],
    b: &[T],
    gates: &mut [T],
    prev: &[T],
    state: &mut [T],
    y: &mut [T],
    r: &mut [T],
    scratch: &mut [T],
) {
    let (t_len, h, gw) = (g.seq, g.hidden, g.gate_width());
    let (ys, gs) = (t_len * h, t_len * gw);
    match g.cell {
        Cell::Lstm => {
            // Both biases go into the pre-activations before the recurrent GEMM adds h·W_hhᵀ.
            for (s, dst) in gates[..n * gw].chunks_exact_mut(gw).enumerate() {
                let src = &xg[s * gs + t * gw..s * gs + (t + 1) * gw];
                for ((d, &x), &bb) in dst.iter_mut().zip(src).zip(b) {
                    *d = x + bb;
                }
            }
            if t > 0 {
                let (gt, room) = scratch.split_at_mut(n * gw);
                recurrent_product(g, n, w, &y[(t - 1) * h..], ys, gt, room);
                add_transposed(n, gw, gt, gates);
            }
            for s in 0..n {
                let gr = &mut gates[s * gw..(s + 1) * gw];
                let (ifg, o) = gr.split_at_mut(3 * h);
                let (i_f, gg) = ifg.split_at_mut(2 * h);
                act_fwd_inplace(Act::Sigmoid, i_f);
                act_fwd_inplace(Act::Sigmoid, o);
                act_fwd_inplace(Act::Tanh, gg);
                let (i, f) = i_f.split_at(h);
                let c = &mut state[s * h..(s + 1) * h];
                // c = f·c_{t−1} + i·g (c_{−1} = 0).
                for ((c, &i), &g) in c.iter_mut().zip(i).zip(&*gg) {
                    *c = i * g;
                }
                if t > 0 {
                    for ((c, &f), &p) in c.iter_mut().zip(f).zip(&prev[s * h..(s + 1) * h]) {
                        *c += f * p;
                    }
                }
                // h = o·tanh(c).
                let base = s * ys + t * h;
                let y_out = &mut y[base..base + h];
                act_fwd(Act::Tanh, c, y_out);
                for (y, &o) in y_out.iter_mut().zip(&*o) {
                    *y *= o;
                }
            }
        }
        Cell::Gru => {
            let (hg, scratch) = scratch.split_at_mut(n * gw);
            for (s, dst) in gates[..n * gw].chunks_exact_mut(gw).enumerate() {
                dst.copy_from_slice(&xg[s * gs + t * gw..s * gs + (t + 1) * gw]);
            }
            for row in hg.chunks_exact_mut(gw) {
                row.copy_from_slice(&b[..gw]);
            }
            if t > 0 {
                let (gt, room) = scratch.split_at_mut(n * gw);
                recurrent_product(g, n, w, &y[(t - 1) * h..], ys, gt, room);
                add_transposed(n, gw, gt, hg);
            }
            for s in 0..n {
                let gr = &mut gates[s * gw..(s + 1) * gw];
                let hr = &hg[s * gw..(s + 1) * gw];
                let (rz, nn) = gr.split_at_mut(2 * h);
                // r, z = σ(x + h·W_hhᵀ + b_hh).
                for (v, &q) in rz.iter_mut().zip(&hr[..2 * h]) {
                    *v += q;
                }
                act_fwd_inplace(Act::Sigmoid, rz);
                // n = tanh(x_n + r·(W_hn·h + b_hn)).
                let hn = &hr[2 * h..];
                for ((v, &r), &q) in nn.iter_mut().zip(&rz[..h]).zip(hn) {
                    *v += r * q;
                }
                act_fwd_inplace(Act::Tanh, nn);
                state[s * h..(s + 1) * h].copy_from_slice(hn);
                let base = s * ys + t * h;
                r[base..base + h].copy_from_slice(&rz[..h]);
                // h = (1 − z)·n + z·h_{t−1} (h_{−1} = 0).
                let (before, after) = y.split_at_mut(base);
                let y_out = &mut after[..h];
                let z = &rz[h..];
                for ((y, &z), &nv) in y_out.iter_mut().zip(z).zip(&*nn) {
                    *y = (T::ONE - z) * nv;
                }
                if t > 0 {
                    for ((y, &z), &p) in y_out.iter_mut().zip(z).zip(&before[base - h..]) {
                        *y += z * p;
                    }
                }
            }
        }
    }
}

/// Backward step `t` of `n` sequences (back-propagation through time walks `t` from `seq − 1` down to
/// 0, one instruction each): from `dy` (every `h_t`'s derivative, `[n, seq, hidden]`), the step's
/// saved `gates` and `state`, the previous step's state `prev` (the LSTM's `c_{t−1}`; unused at
/// `t = 0` and by the GRU) and the output `y` (the GRU reads `h_{t−1}`), writes rows `t` of `dxg`
/// (`[n, seq, G·hidden]`, the gate pre-activations' derivative; overwritten: the layer's input has no
/// other reader). `carry` holds the derivatives carried between steps ([`rnn_carry_len`]): zeroed at
/// `t = seq − 1`, read and left for step `t − 1` after.
#[allow(clippy::too_many_arguments)]
pub fn rnn_grad_x_step<T: Real>(
    g: &RnnGeom,
    n: usize,
    t: usize,
    dy: &[T],
    w: &[T],
    gates: &[T],
    prev: &[T],
    state: &[T],
    y: &[T],
    dxg: &mut [T],
    carry: &mut [T],
    scratch: &mut [T],
) {
    let (t_len, h, gw) = (g.seq, g.hidden, g.gate_width());
    let (ys, gs) = (t_len * h, t_len * gw);
    let one = T::ONE;
    let carry = &mut carry[..rnn_carry_len(g, n)];
    if t + 1 == t_len {
        carry.iter_mut().for_each(|v| *v = T::ZERO);
    }
    let (dh, dc) = carry.split_at_mut(n * h);
    match g.cell {
        Cell::Lstm => {
            let (tc, scratch) = scratch.split_at_mut(h);
            for s in 0..n {
                let gr = &gates[s * gw..(s + 1) * gw];
                let (gi, gf, gg, go) = (&gr[..h], &gr[h..2 * h], &gr[2 * h..3 * h], &gr[3 * h..]);
                let dr = &mut dxg[s * gs + t * gw..s * gs + (t + 1) * gw];
                let (di, rest) = dr.split_at_mut(h);
                let (df, rest) = rest.split_at_mut(h);
                let (dg, d_o) = rest.split_at_mut(h);
                let base = s * ys + t * h;
                let dht = &mut dh[s * h..(s + 1) * h];
                let dct = &mut dc[s * h..(s + 1) * h];
                // dh_t = dy_t + the carried dh; tanh(c_t).
                for (d, &v) in dht.iter_mut().zip(&dy[base..base + h]) {
                    *d += v;
                }
                act_fwd(Act::Tanh, &state[s * h..(s + 1) * h], tc);
                // do = dh·tanh(c)·o(1 − o); dc = dh·o·(1 − tanh²c) + the carried dc.
                for (((d, &dh), &tc), &o) in d_o.iter_mut().zip(&*dht).zip(&*tc).zip(go) {
                    *d = dh * tc * o * (one - o);
                }
                for (((dc, &dh), &tc), &o) in dct.iter_mut().zip(&*dht).zip(&*tc).zip(go) {
                    *dc += dh * o * (one - tc * tc);
                }
                // di = dc·g·i(1 − i); dg = dc·i·(1 − g²); df = dc·c_{t−1}·f(1 − f).
                for (((d, &dc), &g), &i) in di.iter_mut().zip(&*dct).zip(gg).zip(gi) {
                    *d = dc * g * i * (one - i);
                }
                for (((d, &dc), &g), &i) in dg.iter_mut().zip(&*dct).zip(gg).zip(gi) {
                    *d = dc * i * (one - g * g);
                }
                if t > 0 {
                    let p = &prev[s * h..(s + 1) * h];
                    for (((d, &dc), &p), &f) in df.iter_mut().zip(&*dct).zip(p).zip(gf) {
                        *d = dc * p * f * (one - f);
                    }
                } else {
                    df.iter_mut().for_each(|d| *d = T::ZERO);
                }
                // The carried dc_{t−1} = dc·f.
                for (dc, &f) in dct.iter_mut().zip(gf) {
                    *dc *= f;
                }
            }
            if t > 0 {
                // dh_{t−1} = dg_t·W_hh.
                gemm(
                    n,
                    h,
                    gw,
                    MatRef::row_major(&dxg[t * gw..], gs),
                    MatRef::row_major(w, h),
                    dh,
                    h,
                    false,
                    scratch,
                );
            }
        }
        Cell::Gru => {
            let (dhg, scratch) = scratch.split_at_mut(n * gw);
            for s in 0..n {
                let gr = &gates[s * gw..(s + 1) * gw];
                let (gr_r, gr_z, gr_n) = (&gr[..h], &gr[h..2 * h], &gr[2 * h..]);
                let dr = &mut dxg[s * gs + t * gw..s * gs + (t + 1) * gw];
                let (dr_r, rest) = dr.split_at_mut(h);
                let (dr_z, dr_n) = rest.split_at_mut(h);
                let dq = &mut dhg[s * gw..(s + 1) * gw];
                let base = s * ys + t * h;
                let hn = &state[s * h..(s + 1) * h];
                let dht = &mut dh[s * h..(s + 1) * h];
                for (d, &v) in dht.iter_mut().zip(&dy[base..base + h]) {
                    *d += v;
                }
                // dn = dh·(1 − z)·(1 − n²); dz = dh·(h_{t−1} − n)·z(1 − z);
                // dr = dn·(W_hn·h + b_hn)·r(1 − r).
                for (((d, &dh), &z), &nv) in dr_n.iter_mut().zip(&*dht).zip(gr_z).zip(gr_n) {
                    *d = dh * (one - z) * (one - nv * nv);
                }
                for (((d, &dh), &z), &nv) in dr_z.iter_mut().zip(&*dht).zip(gr_z).zip(gr_n) {
                    *d = -dh * nv * z * (one - z);
                }
                if t > 0 {
                    let p = &y[base - h..base];
                    for (((d, &dh), &z), &p) in dr_z.iter_mut().zip(&*dht).zip(gr_z).zip(p) {
                        *d += dh * p * z * (one - z);
                    }
                }
                for (((d, &dn), &q), &r) in dr_r.iter_mut().zip(&*dr_n).zip(hn).zip(gr_r) {
                    *d = dn * q * r * (one - r);
                }
                // The recurrent GEMM's output derivative: (dr, dz, r·dn).
                let (dq_rz, dq_n) = dq.split_at_mut(2 * h);
                dq_rz[..h].copy_from_slice(dr_r);
                dq_rz[h..].copy_from_slice(dr_z);
                for ((d, &dn), &r) in dq_n.iter_mut().zip(&*dr_n).zip(gr_r) {
                    *d = dn * r;
                }
                // The direct path: dh_{t−1} = dh·z (+ the GEMM below).
                for (d, &z) in dht.iter_mut().zip(gr_z) {
                    *d *= z;
                }
            }
            if t > 0 {
                // dh_{t−1} = dh_t∘z + dg_t·W_hh.
                gemm(
                    n,
                    h,
                    gw,
                    MatRef::row_major(dhg, gw),
                    MatRef::row_major(w, h),
                    dh,
                    h,
                    true,
                    scratch,
                );
            }
        }
    }
}

/// Weight gradients of `n` sequences from `dxg` (written by [`rnn_grad_x_step`]), the output `y` and
/// the GRU's reset gate `r` (`[n, seq, hidden]`, kept by [`rnn_fwd_step`]; unused by the LSTM): `dW_hh = Σ_{s, t≥1} dg[s,t]ᵀ·y[s,t−1]`, `db_hh = Σ dg` (added
/// into `dw`, `db` when `accumulate`). One GEMM per chunk of samples against their `y` shifted by one
/// step (a zero row at `t = 0`).
#[allow(clippy::too_many_arguments)]
pub fn rnn_grad_w<T: Real>(
    g: &RnnGeom,
    n: usize,
    dxg: &[T],
    r: &[T],
    y: &[T],
    dw: &mut [T],
    db: &mut [T],
    accumulate: bool,
    scratch: &mut [T],
) {
    let (t_len, h, gw) = (g.seq, g.hidden, g.gate_width());
    let (ys, gs) = (t_len * h, t_len * gw);
    let (dw, db) = (&mut dw[..gw * h], &mut db[..gw]);
    if !accumulate {
        db.iter_mut().for_each(|v| *v = T::ZERO);
        if n == 0 {
            dw.iter_mut().for_each(|v| *v = T::ZERO);
        }
    }
    let cs = grad_w_chunk(g, n);
    let (shifted, rest) = scratch.split_at_mut(cs * ys);
    let (tmp, scratch) = match g.cell {
        Cell::Lstm => rest.split_at_mut(0),
        Cell::Gru => rest.split_at_mut(cs * gs),
    };
    for (ci, s0) in (0..n).step_by(cs.max(1)).enumerate() {
        let c = cs.min(n - s0);
        for (dst, src) in shifted
            .chunks_exact_mut(ys)
            .zip(y[s0 * ys..].chunks_exact(ys))
            .take(c)
        {
            dst[..h].iter_mut().for_each(|v| *v = T::ZERO);
            dst[h..].copy_from_slice(&src[..ys - h]);
        }
        let dgs = &dxg[s0 * gs..(s0 + c) * gs];
        // The recurrent GEMM's output derivative: dxg, but r∘dn for the GRU's n gate.
        let dq: &[T] = match g.cell {
            Cell::Lstm => dgs,
            Cell::Gru => {
                let gr = &r[s0 * ys..(s0 + c) * ys];
                for ((q, d), r) in tmp
                    .chunks_exact_mut(gw)
                    .zip(dgs.chunks_exact(gw))
                    .zip(gr.chunks_exact(h))
                {
                    q[..2 * h].copy_from_slice(&d[..2 * h]);
                    for ((q, &d), &r) in q[2 * h..].iter_mut().zip(&d[2 * h..]).zip(r) {
                        *q = d * r;
                    }
                }
                &tmp[..c * gs]
            }
        };
        for row in dq.chunks_exact(gw) {
            for (b, &v) in db.iter_mut().zip(row) {
                *b += v;
            }
        }
        gemm(
            gw,
            h,
            c * t_len,
            MatRef::row_major_t(dq, gw),
            MatRef::row_major(&shifted[..c * ys], h),
            dw,
            h,
            accumulate || ci > 0,
            scratch,
        );
    }
}

#[cfg(test)]
#[path = "rnn_tests.rs"]
mod tests;
