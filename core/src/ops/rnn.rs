//! Recurrent layers: the recurrent part of an LSTM and of a GRU (PyTorch's `nn.LSTM`/`nn.GRU`, one
//! layer, `batch_first`, zero initial state), on `[n, seq, ·]` tensors, row-major.
//!
//! The input projection `x·W_ihᵀ + b_ih` of every time step is a plain Linear before the layer (one
//! GEMM over all `n·seq` token rows); these ops take its output, the gate pre-activations `xg`
//! `[n, seq, G·hidden]` (`G` = 4 for the LSTM in PyTorch's gate order i, f, g, o; 3 for the GRU:
//! r, z, n), and own `W_hh [G·hidden, hidden]` and `b_hh [G·hidden]`. Each time step runs the
//! recurrent GEMM `h_{t−1}·W_hhᵀ` over the batch.
//!
//! Saved for the backward: the gates after their nonlinearities (`[n, seq, G·hidden]`) and one
//! state per step (`[n, seq, hidden]`: the LSTM's cell `c_t`; the GRU's `W_hn·h_{t−1} + b_hn`, which
//! the reset gate multiplies). The output `y` (`[n, seq, hidden]`, every `h_t`) is read back too.
//!
//! The backward runs through time once, in the input-derivative phase, writing `dxg` (the gate
//! pre-activations' derivative, which is also the projection's output derivative); the weight
//! gradients then read `dxg`: `dW_hh = Σ_t dgᵀ·h_{t−1}` (one GEMM per chunk of samples, ≥ 512 steps
//! deep) and `db_hh = Σ dg`, where `dg` is `dxg` except for the GRU's n gate (`r ∘ dn`).
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

/// Scratch elements of the forward for `n` samples (the GRU's `h·W_hhᵀ + b_hh` of one step, GEMM
/// packing).
pub fn rnn_fwd_scratch_len(g: &RnnGeom, n: usize) -> usize {
    let gw = g.gate_width();
    let own = match g.cell {
        Cell::Lstm => 0,
        Cell::Gru => n * gw,
    };
    own + gemm_scratch_len(n, gw, g.hidden)
}

/// Scratch elements of the input derivative for `n` samples (the carried `dh`; the LSTM's `dc` and
/// one row of `tanh(c)` or the GRU's recurrent gate derivative of one step; GEMM packing).
pub fn rnn_grad_x_scratch_len(g: &RnnGeom, n: usize) -> usize {
    let gw = g.gate_width();
    let own = match g.cell {
        Cell::Lstm => 2 * n * g.hidden + g.hidden,
        Cell::Gru => n * g.hidden + n * gw,
    };
    own + gemm_scratch_len(n, g.hidden, gw)
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

/// Forward of `n` sequences: `xg` the input projection, `w` = `W_hh`, `b` = `b_hh`; writes the gates
/// after their nonlinearities (`gates`), the per-step state (`state`: LSTM `c_t`, GRU
/// `W_hn·h_{t−1} + b_hn`) and the output `y` (every `h_t`). The element-wise work of a step is a few
/// simple passes over rows of `hidden` (each vectorises).
#[allow(clippy::too_many_arguments)]
pub fn rnn_fwd<T: Real>(
    g: &RnnGeom,
    n: usize,
    xg: &[T],
    w: &[T],
    b: &[T],
    gates: &mut [T],
    state: &mut [T],
    y: &mut [T],
    scratch: &mut [T],
) {
    let (t_len, h, gw) = (g.seq, g.hidden, g.gate_width());
    let (ys, gs) = (t_len * h, t_len * gw);
    match g.cell {
        Cell::Lstm => {
            // Both biases go into the pre-activations before the recurrent GEMM adds h·W_hhᵀ.
            for (dst, src) in gates[..n * gs]
                .chunks_exact_mut(gw)
                .zip(xg.chunks_exact(gw))
            {
                for ((d, &x), &bb) in dst.iter_mut().zip(src).zip(b) {
                    *d = x + bb;
                }
            }
            for t in 0..t_len {
                if t > 0 {
                    gemm(
                        n,
                        gw,
                        h,
                        MatRef::row_major(&y[(t - 1) * h..], ys),
                        MatRef::row_major_t(w, h),
                        &mut gates[t * gw..],
                        gs,
                        true,
                        scratch,
                    );
                }
                for s in 0..n {
                    let gr = &mut gates[s * gs + t * gw..s * gs + (t + 1) * gw];
                    let (ifg, o) = gr.split_at_mut(3 * h);
                    let (i_f, gg) = ifg.split_at_mut(2 * h);
                    act_fwd_inplace(Act::Sigmoid, i_f);
                    act_fwd_inplace(Act::Sigmoid, o);
                    act_fwd_inplace(Act::Tanh, gg);
                    let (i, f) = i_f.split_at(h);
                    let base = s * ys + t * h;
                    let (before, after) = state.split_at_mut(base);
                    let c = &mut after[..h];
                    // c = f·c_{t−1} + i·g (c_{−1} = 0).
                    for ((c, &i), &g) in c.iter_mut().zip(i).zip(&*gg) {
                        *c = i * g;
                    }
                    if t > 0 {
                        for ((c, &f), &p) in c.iter_mut().zip(f).zip(&before[base - h..]) {
                            *c += f * p;
                        }
                    }
                    // h = o·tanh(c).
                    let y_out = &mut y[base..base + h];
                    act_fwd(Act::Tanh, c, y_out);
                    for (y, &o) in y_out.iter_mut().zip(&*o) {
                        *y *= o;
                    }
                }
            }
        }
        Cell::Gru => {
            let (hg, scratch) = scratch.split_at_mut(n * gw);
            gates[..n * gs].copy_from_slice(&xg[..n * gs]);
            for t in 0..t_len {
                for row in hg.chunks_exact_mut(gw) {
                    row.copy_from_slice(&b[..gw]);
                }
                if t > 0 {
                    gemm(
                        n,
                        gw,
                        h,
                        MatRef::row_major(&y[(t - 1) * h..], ys),
                        MatRef::row_major_t(w, h),
                        hg,
                        gw,
                        true,
                        scratch,
                    );
                }
                for s in 0..n {
                    let gr = &mut gates[s * gs + t * gw..s * gs + (t + 1) * gw];
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
                    let base = s * ys + t * h;
                    state[base..base + h].copy_from_slice(hn);
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
}

/// Input derivative of `n` sequences: back-propagation through time from `dy` (every `h_t`'s
/// derivative) with the saved `gates`, `state` and output `y`; writes `dxg`, the derivative of the
/// gate pre-activations (overwritten: the layer's input has no other reader).
#[allow(clippy::too_many_arguments)]
pub fn rnn_grad_x<T: Real>(
    g: &RnnGeom,
    n: usize,
    dy: &[T],
    w: &[T],
    gates: &[T],
    state: &[T],
    y: &[T],
    dxg: &mut [T],
    scratch: &mut [T],
) {
    let (t_len, h, gw) = (g.seq, g.hidden, g.gate_width());
    let (ys, gs) = (t_len * h, t_len * gw);
    let one = T::ONE;
    let (dh, scratch) = scratch.split_at_mut(n * h);
    dh.iter_mut().for_each(|v| *v = T::ZERO);
    match g.cell {
        Cell::Lstm => {
            let (dc, scratch) = scratch.split_at_mut(n * h);
            let (tc, scratch) = scratch.split_at_mut(h);
            dc.iter_mut().for_each(|v| *v = T::ZERO);
            for t in (0..t_len).rev() {
                for s in 0..n {
                    let gr = &gates[s * gs + t * gw..s * gs + (t + 1) * gw];
                    let (gi, gf, gg, go) =
                        (&gr[..h], &gr[h..2 * h], &gr[2 * h..3 * h], &gr[3 * h..]);
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
                    act_fwd(Act::Tanh, &state[base..base + h], tc);
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
                        let prev = &state[base - h..base];
                        for (((d, &dc), &p), &f) in df.iter_mut().zip(&*dct).zip(prev).zip(gf) {
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
        }
        Cell::Gru => {
            let (dhg, scratch) = scratch.split_at_mut(n * gw);
            for t in (0..t_len).rev() {
                for s in 0..n {
                    let gr = &gates[s * gs + t * gw..s * gs + (t + 1) * gw];
                    let (gr_r, gr_z, gr_n) = (&gr[..h], &gr[h..2 * h], &gr[2 * h..]);
                    let dr = &mut dxg[s * gs + t * gw..s * gs + (t + 1) * gw];
                    let (dr_r, rest) = dr.split_at_mut(h);
                    let (dr_z, dr_n) = rest.split_at_mut(h);
                    let dq = &mut dhg[s * gw..(s + 1) * gw];
                    let base = s * ys + t * h;
                    let hn = &state[base..base + h];
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
                        let prev = &y[base - h..base];
                        for (((d, &dh), &z), &p) in dr_z.iter_mut().zip(&*dht).zip(gr_z).zip(prev) {
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
}

/// Weight gradients of `n` sequences from `dxg` (written by [`rnn_grad_x`]), the output `y` and the
/// saved `gates` (the GRU's reset gate): `dW_hh = Σ_{s, t≥1} dg[s,t]ᵀ·y[s,t−1]`, `db_hh = Σ dg` (added
/// into `dw`, `db` when `accumulate`). One GEMM per chunk of samples against their `y` shifted by one
/// step (a zero row at `t = 0`).
#[allow(clippy::too_many_arguments)]
pub fn rnn_grad_w<T: Real>(
    g: &RnnGeom,
    n: usize,
    dxg: &[T],
    gates: &[T],
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
                let gr = &gates[s0 * gs..(s0 + c) * gs];
                for ((q, d), r) in tmp
                    .chunks_exact_mut(gw)
                    .zip(dgs.chunks_exact(gw))
                    .zip(gr.chunks_exact(gw))
                {
                    q[..2 * h].copy_from_slice(&d[..2 * h]);
                    for ((q, &d), &r) in q[2 * h..].iter_mut().zip(&d[2 * h..]).zip(&r[..h]) {
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
