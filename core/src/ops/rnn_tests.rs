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

/// Forward: (gates, state, y).
fn fwd<T: Real>(c: &Case, xg: &[T], w: &[T], b: &[T]) -> (Vec<T>, Vec<T>, Vec<T>) {
    let (g, n) = (&c.g, c.n);
    let mut gates = vec![T::ZERO; n * g.seq * g.gate_width()];
    let mut state = vec![T::ZERO; n * g.seq * g.hidden];
    let mut y = vec![T::ZERO; n * g.seq * g.hidden];
    let mut s = vec![T::ZERO; rnn_fwd_scratch_len(g, n)];
    rnn_fwd(g, n, xg, w, b, &mut gates, &mut state, &mut y, &mut s);
    (gates, state, y)
}

fn check(cell: Cell) {
    let c = case(cell, 7 + cell.gates() as u64);
    let (g, n) = (&c.g, c.n);
    let (gates, state, y) = fwd(&c, &c.xg, &c.w, &c.b);
    let mut dxg = vec![0.0; c.xg.len()];
    let mut s = vec![0.0; rnn_grad_x_scratch_len(g, n)];
    rnn_grad_x(g, n, &c.r, &c.w, &gates, &state, &y, &mut dxg, &mut s);
    let mut dw = vec![7.0; c.w.len()];
    let mut db = vec![7.0; c.b.len()];
    let mut s = vec![0.0; rnn_grad_w_scratch_len(g, n)];
    rnn_grad_w(g, n, &dxg, &gates, &y, &mut dw, &mut db, false, &mut s);
    let loss = |xg: &[f64], w: &[f64], b: &[f64]| dotf(&fwd(&c, xg, w, b).2, &c.r);
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
    rnn_grad_w(g, n, &dxg, &gates, &y, &mut dw2, &mut db2, true, &mut s);
    assert_close("accumulated dW", &dw2, &scale2(&dw), 1e-12, 1e-9);
    assert_close("accumulated db", &db2, &scale2(&db), 1e-12, 1e-9);
    // The f32 path (SIMD GEMM, fast sigmoid/tanh) agrees with f64: O(1) values through ≤ 4 steps of
    // sums of ≤ 3 products, each nonlinearity within ~2e-7 relative.
    let (_, _, y32) = fwd(&c, &to_f32(&c.xg), &to_f32(&c.w), &to_f32(&c.b));
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
        let (_, _, y) = fwd(&c, &c.xg, &c.w, &c.b);
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
        let gates = rand_vec(&mut rng, n * g.seq * gw, 0.0, 1.0);
        let y = rand_vec(&mut rng, n * g.seq * h, -1.0, 1.0);
        let mut dw = vec![0.0; gw * h];
        let mut db = vec![0.0; gw];
        let mut s = vec![0.0; rnn_grad_w_scratch_len(&g, n)];
        rnn_grad_w(&g, n, &dxg, &gates, &y, &mut dw, &mut db, false, &mut s);
        let (mut want_w, mut want_b) = (vec![0.0; gw * h], vec![0.0; gw]);
        for smp in 0..n {
            for t in 0..g.seq {
                let row = (smp * g.seq + t) * gw;
                for k in 0..gw {
                    let mut d = dxg[row + k];
                    if cell == Cell::Gru && k >= 2 * h {
                        d *= gates[row + k - 2 * h];
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
