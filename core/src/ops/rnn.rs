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
//! gradients then read `dxg`: `dW_hh = Σ_t dgᵀ·h_{t−1}` per sample (one GEMM over its steps) and
//! `db_hh = Σ dg`, where `dg` is `dxg` except for the GRU's n gate (`r ∘ dn`).
use crate::kernels::{gemm, gemm_scratch_len, MatRef, Real};
use crate::ops::act::{sigmoid_real, tanh_real};

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

/// Scratch elements of the input derivative for `n` samples (the carried `dh`, the LSTM's `dc` or the
/// GRU's recurrent gate derivative of one step, GEMM packing).
pub fn rnn_grad_x_scratch_len(g: &RnnGeom, n: usize) -> usize {
    let gw = g.gate_width();
    let own = match g.cell {
        Cell::Lstm => 2 * n * g.hidden,
        Cell::Gru => n * g.hidden + n * gw,
    };
    own + gemm_scratch_len(n, g.hidden, gw)
}

/// Scratch elements of the weight gradient (the GRU's recurrent gate derivatives of one sample, GEMM
/// packing); independent of the batch.
pub fn rnn_grad_w_scratch_len(g: &RnnGeom) -> usize {
    let gw = g.gate_width();
    let own = match g.cell {
        Cell::Lstm => 0,
        Cell::Gru => g.seq * gw,
    };
    own + gemm_scratch_len(gw, g.hidden, g.seq.saturating_sub(1))
}

/// Forward of `n` sequences: `xg` the input projection, `w` = `W_hh`, `b` = `b_hh`; writes the gates
/// after their nonlinearities (`gates`), the per-step state (`state`: LSTM `c_t`, GRU
/// `W_hn·h_{t−1} + b_hn`) and the output `y` (every `h_t`).
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
                    i_f.iter_mut().for_each(|v| *v = sigmoid_real(*v));
                    o.iter_mut().for_each(|v| *v = sigmoid_real(*v));
                    gg.iter_mut().for_each(|v| *v = tanh_real(*v));
                    let (i, f) = i_f.split_at(h);
                    let base = s * ys + t * h;
                    for j in 0..h {
                        let prev = if t > 0 { state[base - h + j] } else { T::ZERO };
                        let c = f[j] * prev + i[j] * gg[j];
                        state[base + j] = c;
                        y[base + j] = o[j] * tanh_real(c);
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
                    let base = s * ys + t * h;
                    for j in 0..h {
                        let r = sigmoid_real(gr[j] + hr[j]);
                        let z = sigmoid_real(gr[h + j] + hr[h + j]);
                        let hn = hr[2 * h + j];
                        let nn = tanh_real(gr[2 * h + j] + r * hn);
                        let prev = if t > 0 { y[base - h + j] } else { T::ZERO };
                        gr[j] = r;
                        gr[h + j] = z;
                        gr[2 * h + j] = nn;
                        state[base + j] = hn;
                        y[base + j] = (T::ONE - z) * nn + z * prev;
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
    let (dh, scratch) = scratch.split_at_mut(n * h);
    dh.iter_mut().for_each(|v| *v = T::ZERO);
    match g.cell {
        Cell::Lstm => {
            let (dc, scratch) = scratch.split_at_mut(n * h);
            dc.iter_mut().for_each(|v| *v = T::ZERO);
            for t in (0..t_len).rev() {
                for s in 0..n {
                    let gr = &gates[s * gs + t * gw..s * gs + (t + 1) * gw];
                    let dr = &mut dxg[s * gs + t * gw..s * gs + (t + 1) * gw];
                    let base = s * ys + t * h;
                    for j in 0..h {
                        let (i, f, gg, o) = (gr[j], gr[h + j], gr[2 * h + j], gr[3 * h + j]);
                        let c = state[base + j];
                        let prev = if t > 0 { state[base - h + j] } else { T::ZERO };
                        let dht = dy[base + j] + dh[s * h + j];
                        let tc = tanh_real(c);
                        let dct = dht * o * (T::ONE - tc * tc) + dc[s * h + j];
                        dc[s * h + j] = dct * f;
                        dr[j] = dct * gg * i * (T::ONE - i);
                        dr[h + j] = dct * prev * f * (T::ONE - f);
                        dr[2 * h + j] = dct * i * (T::ONE - gg * gg);
                        dr[3 * h + j] = dht * tc * o * (T::ONE - o);
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
                    let dr = &mut dxg[s * gs + t * gw..s * gs + (t + 1) * gw];
                    let dq = &mut dhg[s * gw..(s + 1) * gw];
                    let base = s * ys + t * h;
                    for j in 0..h {
                        let (r, z, nn) = (gr[j], gr[h + j], gr[2 * h + j]);
                        let prev = if t > 0 { y[base - h + j] } else { T::ZERO };
                        let dht = dy[base + j] + dh[s * h + j];
                        let dn = dht * (T::ONE - z) * (T::ONE - nn * nn);
                        let dz = dht * (prev - nn) * z * (T::ONE - z);
                        let drr = dn * state[base + j] * r * (T::ONE - r);
                        dr[j] = drr;
                        dr[h + j] = dz;
                        dr[2 * h + j] = dn;
                        dq[j] = drr;
                        dq[h + j] = dz;
                        dq[2 * h + j] = dn * r;
                        dh[s * h + j] = dht * z;
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
/// into `dw`, `db` when `accumulate`).
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
        if t_len < 2 || n == 0 {
            dw.iter_mut().for_each(|v| *v = T::ZERO);
        }
    }
    let (tmp, scratch) = match g.cell {
        Cell::Lstm => scratch.split_at_mut(0),
        Cell::Gru => scratch.split_at_mut(gs),
    };
    for s in 0..n {
        let dgs = &dxg[s * gs..(s + 1) * gs];
        // The recurrent GEMM's output derivative: dxg, but r∘dn for the GRU's n gate.
        let dq: &[T] = match g.cell {
            Cell::Lstm => dgs,
            Cell::Gru => {
                let gr = &gates[s * gs..(s + 1) * gs];
                for ((q, d), r) in tmp
                    .chunks_exact_mut(gw)
                    .zip(dgs.chunks_exact(gw))
                    .zip(gr.chunks_exact(gw))
                {
                    q[..2 * h].copy_from_slice(&d[..2 * h]);
                    for j in 0..h {
                        q[2 * h + j] = d[2 * h + j] * r[j];
                    }
                }
                tmp
            }
        };
        for row in dq.chunks_exact(gw) {
            for (b, &v) in db.iter_mut().zip(row) {
                *b += v;
            }
        }
        if t_len >= 2 {
            gemm(
                gw,
                h,
                t_len - 1,
                MatRef::row_major_t(&dq[gw..], gw),
                MatRef::row_major(&y[s * ys..], h),
                dw,
                h,
                accumulate || s > 0,
                scratch,
            );
        }
    }
}

#[cfg(test)]
#[path = "rnn_tests.rs"]
mod tests;
