//! Per-row (per-output-channel) symmetric int8 quantisation of a weight matrix, and its inverse: the
//! storage of frozen weights in a read-only parameter image ([`crate::plan::params`]). Row `r` of a
//! `rows × k` matrix is stored as `q[r·k..(r+1)·k]` with one f32 scale `s[r] = max |w| / 127`, and
//! read back as `q · s[r]` (exactly that product, so every reader dequantises to the same bits).

/// Quantises `w` (`rows` rows, row-major) into `q` (its length) and `scales` (`rows`): round to nearest,
/// ties away from zero, clamped to ±127; an all-zero (or non-finite-free zero) row gets scale 0. Lengths
/// that do not match leave the outputs untouched and return false.
pub fn quantize_rows(w: &[f32], rows: usize, q: &mut [i8], scales: &mut [f32]) -> bool {
    if rows == 0 || !w.len().is_multiple_of(rows) || q.len() != w.len() || scales.len() != rows {
        return false;
    }
    let k = w.len() / rows;
    for ((wr, qr), s) in w
        .chunks_exact(k.max(1))
        .zip(q.chunks_exact_mut(k.max(1)))
        .zip(scales.iter_mut())
    {
        let max = wr.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = if max.is_finite() { max / 127.0 } else { 0.0 };
        *s = scale;
        for (v, o) in wr.iter().zip(qr.iter_mut()) {
            *o = if scale > 0.0 {
                libm::roundf(v / scale).clamp(-127.0, 127.0) as i8
            } else {
                0
            };
        }
    }
    true
}

/// Dequantises rows: `out[i] = q[i] as f32 × scales[i / k]` with `k = q.len() / scales.len()`. `out`
/// must be as long as `q`; extra output is left untouched.
pub fn dequantize_rows(q: &[i8], scales: &[f32], out: &mut [f32]) {
    if scales.is_empty() {
        return;
    }
    let k = q.len() / scales.len();
    if k == 0 {
        return;
    }
    for ((qr, &s), o) in q.chunks_exact(k).zip(scales).zip(out.chunks_exact_mut(k)) {
        for (&v, d) in qr.iter().zip(o.iter_mut()) {
            *d = f32::from(v) * s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_within_half_a_step() {
        let w = [0.5f32, -1.0, 0.25, 0.0, 0.0, 0.0, 3.0, -0.01, 1.5];
        let (mut q, mut s) = ([0i8; 9], [0f32; 3]);
        assert!(quantize_rows(&w, 3, &mut q, &mut s));
        assert_eq!(s[1], 0.0, "an all-zero row has scale 0");
        assert_eq!(q[0..3], [64, -127, 32]);
        let mut back = [9f32; 9];
        dequantize_rows(&q, &s, &mut back);
        for (r, (a, b)) in w.chunks(3).zip(back.chunks(3)).enumerate() {
            for (x, y) in a.iter().zip(b) {
                // Rounding to the nearest step of the row's scale: at most half a step off.
                assert!((x - y).abs() <= s[r] / 2.0 + 1e-7, "{x} vs {y}");
            }
        }
        assert!(!quantize_rows(&w, 2, &mut q, &mut s), "9 is not 2 rows");
    }
}
