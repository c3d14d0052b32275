//! Finite-difference checks of the LSTM and GRU ops (f64 path; tolerances in `testutil`), a PyTorch
//! formula check of one step, and the f32 path against the f64 one.
use super::*;
use crate::ops::testutil::*;
use crate::rng::Rng;

struct Case {
    g: RnnGeom,
    n: usize,
    xg: Vec<f64>,
    w: Vec<f64>,
    b: Vec<f64>,
    r: Vec<f64>,
}

fn case(cell: Cell, seed: u64) -> Case {
    let mut rng = Rng::new(seed);
    let g = RnnGeom {
        cell,
        seq: 4,
        hidden: 3,
    };
    let n = 2;
    let gw = g.gate_width();
    Case {
        g,
        n,
        xg: rand_vec(&mut rng, n * g.seq * gw, -1.5, 1.5),
        w: rand_vec(&mut rng, gw * g.hidden, -0.8, 0.8),
        b: rand_vec(&mut rng, gw, -0.5, 0.5),
        r: rand_vec(&mut rng, n * g.seq * g.hidden, -1.0, 1.0),
    }
}

/// Every step's saved tensors, as the plan keeps them: `gates[t]` (`[n, G·hidden]`), `state[t]`
/// (`[n, hidden]`), and the GRU's reset gates (`[n, seq, hidden]`).
struct Saved<T> {
    gates: Vec<Vec<T>>,
    state: Vec<Vec<T>>,
    r: Vec<T>,
}

/// The forward, step by step as the plan runs it: (saved tensors, y).
fn fwd_steps<T: Real>(g: &RnnGeom, n: usize, xg: &[T], w: &[T], b: &[T]) -> (Saved<T>, Vec<T>) {
    let mut sv = Saved {
        gates: vec![vec![T::ZERO; n * g.gate_width()]; g.seq],
        state: vec![vec![T::ZERO; n * g.hidden]; g.seq],
        r: vec![
            T::ZERO;
            if g.cell == Cell::Gru {
                n * g.seq * g.hidden
            } else {
                0
            }
        ],
    };
    let mut y = vec![T::ZERO; n * g.seq * g.hidden];
    let mut s = vec![T::ZERO; rnn_fwd_scratch_len(g, n)];
    for t in 0..g.seq {
        let (before, after) = sv.state.split_at_mut(t);
        let prev = before.last().map_or(&[][..], |p| &p[..]);
        rnn_fwd_step(
            g,
            n,
            t,
            xg,
            w,
            b,
            &mut sv.gates[t],
            prev,
            &mut after[0],
            &mut y,
            &mut sv.r,
            &mut s,
        );
    }
    (sv, y)
}

/// The backward through time, step by step as the plan runs it: `dxg`.
fn grad_x_steps<T: Real>(
    g: &RnnGeom,
    n: usize,
    dy: &[T],
    w: &[T],
    sv: &Saved<T>,
    y: &[T],
) -> Vec<T> {
    let mut dxg = vec![T::ZERO; n * g.seq * g.gate_width()];
    // Stale values in the carry and scratch: the last step (the first run) must clear what it reads.
    let mut carry = vec![T::ONE; rnn_carry_len(g, n)];
    let mut s = vec![T::ONE; rnn_grad_x_scratch_len(g, n)];
    for t in (0..g.seq).rev() {
        let prev = if t > 0 { &sv.state[t - 1][..] } else { &[][..] };
        rnn_grad_x_step(
            g,
            n,
            t,
            dy,
            w,
            &sv.gates[t],
            prev,
            &sv.state[t],
            y,
            &mut dxg,
            &mut carry,
            &mut s,
        );
    }
    dxg
}

/// Forward: (saved tensors, y).
fn fwd<T: Real>(c: &Case, xg: &[T], w: &[T], b: &[T]) -> (Saved<T>, Vec<T>) {
    fwd_steps(&c.g, c.n, xg, w, b)
}

fn check(cell: Cell) {
    let c = case(cell, 7 + cell.gates() as u64);
    let (g, n) = (&c.g, c.n);
    let (sv, y) = fwd(&c, &c.xg, &c.w, &c.b);
    let dxg = grad_x_steps(g, n, &c.r, &c.w, &sv, &y);
    let mut dw = vec![7.0; c.w.len()];
    let mut db = vec![7.0; c.b.len()];
    let mut s = vec![0.0; rnn_grad_w_scratch_len(g, n)];
    rnn_grad_w(g, n, &dxg, &sv.r, &y, &mut dw, &mut db, false, &mut s);
    let loss = |xg: &[f64], w: &[f64], b: &[f64]| dotf(&fwd(&c, xg, w, b).1, &c.r);
    let what = format!("{cell:?}");
    let fd = |x: &[f64], an: &[f64], part: &str, f: &dyn Fn(&[f64]) -> f64| {
        assert_close(
            &format!("{what} {part}"),
            an,
            &fd_grad(x, f),
            FD_TOL,
            FD_FLOOR,
        );
    };
    fd(&c.xg, &dxg, "dxg", &|x| loss(x, &c.w, &c.b));
    fd(&c.w, &dw, "dW_hh", &|w| loss(&c.xg, w, &c.b));
    fd(&c.b, &db, "db_hh", &|b| loss(&c.xg, &c.w, b));
    // Accumulating adds the same gradient again.
    let mut s = vec![0.0; rnn_grad_w_scratch_len(g, n)];
    let (mut dw2, mut db2) = (dw.clone(), db.clone());
    rnn_grad_w(g, n, &dxg, &sv.r, &y, &mut dw2, &mut db2, true, &mut s);
    assert_close("accumulated dW", &dw2, &scale2(&dw), 1e-12, 1e-9);
    assert_close("accumulated db", &db2, &scale2(&db), 1e-12, 1e-9);
    // The f32 path (SIMD GEMM, fast sigmoid/tanh) agrees with f64: O(1) values through ≤ 4 steps of
    // sums of ≤ 3 products, each nonlinearity within ~2e-7 relative.
    let (_, y32) = fwd(&c, &to_f32(&c.xg), &to_f32(&c.w), &to_f32(&c.b));
    assert_close(&format!("{what} f32"), &widen(&y32), &y, 1e-5, 1e-2);
}

fn scale2(v: &[f64]) -> Vec<f64> {
    v.iter().map(|x| 2.0 * x).collect()
}

#[test]
fn lstm_finite_differences() {
    check(Cell::Lstm);
}

#[test]
fn gru_finite_differences() {
    check(Cell::Gru);
}

/// One step from zero state against PyTorch's formulas written out by hand.
#[test]
fn first_step_matches_pytorch_formulas() {
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    for cell in [Cell::Lstm, Cell::Gru] {
        let c = case(cell, 3);
        let (h, gw) = (c.g.hidden, c.g.gate_width());
        let (_, y) = fwd(&c, &c.xg, &c.w, &c.b);
        for (j, &got) in y[..h].iter().enumerate() {
            let x = |k: usize| c.xg[k * h + j];
            let b = |k: usize| c.b[k * h + j];
            let want = match cell {
                // h₀ = 0: gates = x + b_hh; c = i·g; h = o·tanh(c).
                Cell::Lstm => sig(x(3) + b(3)) * (sig(x(0) + b(0)) * (x(2) + b(2)).tanh()).tanh(),
                // n = tanh(x_n + r·b_hn); h = (1 − z)·n.
                Cell::Gru => {
                    let r = sig(x(0) + b(0));
                    (1.0 - sig(x(1) + b(1))) * (x(2) + r * b(2)).tanh()
                }
            };
            // f64 libm vs f64 libm in another association: a few ulps.
            assert!((got - want).abs() < 1e-12, "{cell:?} h[{j}]");
        }
        assert_eq!(gw, cell.gates() * h);
    }
}

/// The weight gradient over several GEMM chunks (a long sequence: one sample per chunk) equals the
/// formula summed directly: `dW_hh = Σ_{s, t≥1} dq[s,t]ᵀ·y[s,t−1]`, `db_hh = Σ dq`.
#[test]
fn weight_gradient_over_chunks_matches_the_formula() {
    let mut rng = Rng::new(5);
    for cell in [Cell::Lstm, Cell::Gru] {
        let g = RnnGeom {
            cell,
            seq: 300,
            hidden: 2,
        };
        let (n, h, gw) = (3, g.hidden, g.gate_width());
        assert_eq!(grad_w_chunk(&g, n), 1);
        let dxg = rand_vec(&mut rng, n * g.seq * gw, -1.0, 1.0);
        let r = rand_vec(&mut rng, n * g.seq * h, 0.0, 1.0);
        let y = rand_vec(&mut rng, n * g.seq * h, -1.0, 1.0);
        let mut dw = vec![0.0; gw * h];
        let mut db = vec![0.0; gw];
        let mut s = vec![0.0; rnn_grad_w_scratch_len(&g, n)];
        rnn_grad_w(&g, n, &dxg, &r, &y, &mut dw, &mut db, false, &mut s);
        let (mut want_w, mut want_b) = (vec![0.0; gw * h], vec![0.0; gw]);
        for smp in 0..n {
            for t in 0..g.seq {
                let row = (smp * g.seq + t) * gw;
                for k in 0..gw {
                    let mut d = dxg[row + k];
                    if cell == Cell::Gru && k >= 2 * h {
                        d *= r[(smp * g.seq + t) * h + k - 2 * h];
                    }
                    want_b[k] += d;
                    if t > 0 {
                        for j in 0..h {
                            want_w[k * h + j] += d * y[(smp * g.seq + t - 1) * h + j];
                        }
                    }
                }
            }
        }
        // f64 sums of ≤ 900 O(1) terms in another order: ~1e-13 relative.
        assert_close(&format!("{cell:?} dW"), &dw, &want_w, 1e-10, 1e-6);
        assert_close(&format!("{cell:?} db"), &db, &want_b, 1e-10, 1e-6);
    }
}

/// The step kernels against the whole-sequence kernels they replaced (kept below, as they were): the
/// same gates, states, outputs, input derivatives and weight gradients, bit for bit (`to_bits`), in
/// f32 (the SIMD GEMM and activations) at a width with vector tails and a batch over several GEMM
/// row blocks; then the weight gradient accumulating into the first.
#[test]
fn steps_are_bit_identical_to_the_whole_sequence_kernels() {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for cell in [Cell::Lstm, Cell::Gru] {
        let mut rng = Rng::new(11 + cell.gates() as u64);
        let g = RnnGeom {
            cell,
            seq: 9,
            hidden: 19,
        };
        let (n, h, gw) = (13, g.hidden, g.gate_width());
        let xg = to_f32(&rand_vec(&mut rng, n * g.seq * gw, -1.5, 1.5));
        let w = to_f32(&rand_vec(&mut rng, gw * h, -0.4, 0.4));
        let b = to_f32(&rand_vec(&mut rng, gw, -0.5, 0.5));
        let dy = to_f32(&rand_vec(&mut rng, n * g.seq * h, -1.0, 1.0));
        // The whole-sequence kernels.
        let mut gates = vec![0.0f32; n * g.seq * gw];
        let mut state = vec![0.0f32; n * g.seq * h];
        let mut y = vec![0.0f32; n * g.seq * h];
        let mut s = vec![0.0f32; ref_fwd_scratch_len(&g, n)];
        ref_fwd(&g, n, &xg, &w, &b, &mut gates, &mut state, &mut y, &mut s);
        let mut dxg = vec![0.0f32; xg.len()];
        let mut s = vec![0.0f32; ref_grad_x_scratch_len(&g, n)];
        ref_grad_x(&g, n, &dy, &w, &gates, &state, &y, &mut dxg, &mut s);
        let mut s = vec![0.0f32; rnn_grad_w_scratch_len(&g, n)];
        let (mut dw, mut db) = (vec![0.0f32; gw * h], vec![0.0f32; gw]);
        ref_grad_w(&g, n, &dxg, &gates, &y, &mut dw, &mut db, false, &mut s);
        ref_grad_w(&g, n, &dxg, &gates, &y, &mut dw, &mut db, true, &mut s);
        // The step kernels.
        let (sv, y2) = fwd_steps(&g, n, &xg, &w, &b);
        let dxg2 = grad_x_steps(&g, n, &dy, &w, &sv, &y2);
        let (mut dw2, mut db2) = (vec![0.0f32; gw * h], vec![0.0f32; gw]);
        rnn_grad_w(&g, n, &dxg2, &sv.r, &y2, &mut dw2, &mut db2, false, &mut s);
        rnn_grad_w(&g, n, &dxg2, &sv.r, &y2, &mut dw2, &mut db2, true, &mut s);
        for t in 0..g.seq {
            for smp in 0..n {
                let (a, z) = (smp * g.seq * gw + t * gw, smp * gw);
                assert_eq!(
                    bits(&gates[a..a + gw]),
                    bits(&sv.gates[t][z..z + gw]),
                    "{cell:?} gates"
                );
                let (a, z) = (smp * g.seq * h + t * h, smp * h);
                assert_eq!(
                    bits(&state[a..a + h]),
                    bits(&sv.state[t][z..z + h]),
                    "{cell:?} state"
                );
                if cell == Cell::Gru {
                    let a = smp * g.seq * gw + t * gw;
                    let q = smp * g.seq * h + t * h;
                    assert_eq!(bits(&gates[a..a + h]), bits(&sv.r[q..q + h]), "{cell:?} r");
                }
            }
        }
        assert_eq!(bits(&y), bits(&y2), "{cell:?} y");
        assert_eq!(bits(&dxg), bits(&dxg2), "{cell:?} dxg");
        assert_eq!(bits(&dw), bits(&dw2), "{cell:?} dW_hh");
        assert_eq!(bits(&db), bits(&db2), "{cell:?} db_hh");
    }
}

/// Scratch of `ref_fwd` (as main's `rnn_fwd_scratch_len`).
fn ref_fwd_scratch_len(g: &RnnGeom, n: usize) -> usize {
    rnn_fwd_scratch_len(g, n)
}

/// Scratch of `ref_grad_x` (main's `rnn_grad_x_scratch_len`: the carried `dh`, the LSTM's `dc` and
/// one row of `tanh(c)` or the GRU's recurrent gate derivative of one step; GEMM packing).
fn ref_grad_x_scratch_len(g: &RnnGeom, n: usize) -> usize {
    let gw = g.gate_width();
    let own = match g.cell {
        Cell::Lstm => 2 * n * g.hidden + g.hidden,
        Cell::Gru => n * g.hidden + n * gw,
    };
    own + gemm_scratch_len(n, g.hidden, gw)
}

// The whole-sequence kernels as they were before the layer ran per time step (the reference of the
// bit-identity test above).

/// Forward of `n` sequences: `xg` the input projection, `w` = `W_hh`, `b` = `b_hh`; writes the gates
/// after their nonlinearities (`gates`), the per-step state (`state`: LSTM `c_t`, GRU
/// `W_hn·h_{t−1} + b_hn`) and the output `y` (every `h_t`). The element-wise work of a step is a few
/// simple passes over rows of `hidden` (each vectorises).
#[allow(clippy::too_many_arguments)]
fn ref_fwd<T: Real>(
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
fn ref_grad_x<T: Real>(
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

/// Weight gradients of `n` sequences from `dxg` (written by `ref_grad_x`), the output `y` and the
/// saved `gates` (the GRU's reset gate): `dW_hh = Σ_{s, t≥1} dg[s,t]ᵀ·y[s,t−1]`, `db_hh = Σ dg` (added
/// into `dw`, `db` when `accumulate`). One GEMM per chunk of samples against their `y` shifted by one
/// step (a zero row at `t = 0`).
#[allow(clippy::too_many_arguments)]
fn ref_grad_w<T: Real>(
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
