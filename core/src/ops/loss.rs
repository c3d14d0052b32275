//! Losses fused with the derivative of the last layer: softmax + cross-entropy over class logits, and
//! mean squared error.
use super::elementwise::dot;
use crate::kernels::{vector, Real};

/// Per-sample log-softmax pieces: `(max, first argmax)`.
#[inline]
fn max_argmax<T: Real>(z: &[T]) -> (T, usize) {
    let mut m = z[0];
    let mut am = 0;
    for (j, &v) in z.iter().enumerate().skip(1) {
        if v > m {
            m = v;
            am = j;
        }
    }
    (m, am)
}

/// Softmax cross-entropy over `n` samples of `classes` logits (row-major `[n, classes]`).
///
/// Returns `(mean loss, number of samples whose first argmax equals the label)` and writes
/// `dlogits = (softmax − onehot)/n`. Numerically stable: `loss = ln Σ e^{z−max} − (z_label − max)`.
/// Labels are validated by the caller; an out-of-range label is still never indexed: that sample is
/// ignored (zero gradient, no loss, not counted), and the mean is over the remaining samples, like
/// PyTorch's `ignore_index`. With no valid sample the loss is 0.
pub fn softmax_ce<T: Real>(
    n: usize,
    classes: usize,
    logits: &[T],
    labels: &[u32],
    dlogits: &mut [T],
) -> (T, usize) {
    let len = n * classes;
    dlogits[..len].copy_from_slice(&logits[..len]);
    softmax_ce_inplace(n, classes, dlogits, labels)
}

/// [`softmax_ce`] with the logits overwritten by their gradient (`z` holds the logits on entry and
/// `dlogits` on return).
pub fn softmax_ce_inplace<T: Real>(
    n: usize,
    classes: usize,
    z: &mut [T],
    labels: &[u32],
) -> (T, usize) {
    let labels = &labels[..n];
    if classes == 0 {
        return (T::ZERO, 0);
    }
    let valid = labels.iter().filter(|&&l| (l as usize) < classes).count();
    let inv = if valid > 0 {
        T::ONE / T::from_usize(valid)
    } else {
        T::ZERO
    };
    let mut loss = T::ZERO;
    let mut correct = 0;
    for (d, &label) in z[..n * classes].chunks_exact_mut(classes).zip(labels) {
        let label = label as usize;
        if label >= classes {
            d.iter_mut().for_each(|v| *v = T::ZERO);
            continue;
        }
        let (m, am) = max_argmax(d);
        let zl = d[label] - m;
        // e^(v − m) ≤ 1 in a pass that vectorises, then their sum in lane order.
        vector::map_inplace(d, |v| (v - m).exp_nonpos());
        let s = vector::sum_map(d, |e| e);
        loss += s.ln() - zl;
        correct += usize::from(am == label);
        let k = inv / s;
        vector::map_inplace(d, |v| v * k);
        d[label] -= inv;
    }
    (loss * inv, correct)
}

/// Softmax cross-entropy without gradient: returns `(SUM of per-sample losses, correct count)` so that
/// evaluation can aggregate over batches of any size. Invalid labels are skipped as in [`softmax_ce`].
pub fn softmax_ce_eval<T: Real>(
    n: usize,
    classes: usize,
    logits: &[T],
    labels: &[u32],
) -> (T, usize) {
    if classes == 0 {
        return (T::ZERO, 0);
    }
    let mut loss = T::ZERO;
    let mut correct = 0;
    for (z, &label) in logits[..n * classes]
        .chunks_exact(classes)
        .zip(&labels[..n])
    {
        let label = label as usize;
        if label >= classes {
            continue;
        }
        let (m, am) = max_argmax(z);
        // The exponential and the sum's order the training loss uses.
        let s = vector::sum_map(z, |v| (v - m).exp_nonpos());
        loss += s.ln() - (z[label] - m);
        correct += usize::from(am == label);
    }
    (loss, correct)
}

/// Mean squared error over all elements, `mean((pred − target)²)`; writes `dpred = 2(pred − target)/len`.
/// Returns 0 for empty input.
pub fn mse<T: Real>(pred: &[T], target: &[T], dpred: &mut [T]) -> T {
    let len = pred.len().min(target.len()).min(dpred.len());
    dpred[..len].copy_from_slice(&pred[..len]);
    mse_inplace(&mut dpred[..len], &target[..len])
}

/// [`mse`] with the predictions overwritten by their gradient (`d` holds `pred` on entry, `dpred` on
/// return).
pub fn mse_inplace<T: Real>(d: &mut [T], target: &[T]) -> T {
    let len = d.len().min(target.len());
    if len == 0 {
        return T::ZERO;
    }
    let d = &mut d[..len];
    for (d, &t) in d.iter_mut().zip(target) {
        *d -= t;
    }
    let cnt = T::from_usize(len);
    let loss = dot(d, d) / cnt;
    let k = (T::ONE + T::ONE) / cnt;
    d.iter_mut().for_each(|v| *v *= k);
    loss
}

/// Mean squared error without gradient (same value as [`mse`]); 0 for empty input.
pub fn mse_eval<T: Real>(pred: &[T], target: &[T]) -> T {
    let len = pred.len().min(target.len());
    if len == 0 {
        return T::ZERO;
    }
    // The order of `mse`'s `dot(d, d)`, so both give the same value.
    vector::sum_zip(pred, target, |p, t| {
        let e = p - t;
        e * e
    }) / T::from_usize(len)
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;
    use crate::rng::Rng;

    #[test]
    fn softmax_ce_known_values() {
        // logits (1, 2, 3): log-sum-exp = 3 + ln(1 + e^-1 + e^-2) = 3.40760596444438
        let z = [1.0f64, 2.0, 3.0, 0.0, 0.0, 0.0];
        let mut d = [0.0f64; 6];
        let (loss, correct) = softmax_ce(2, 3, &z, &[2, 0], &mut d);
        let l0 = 0.40760596444437994f64; // lse − 3
        let l1 = 3.0f64.ln(); // uniform over 3
        assert!((loss - (l0 + l1) / 2.0).abs() < 1e-15, "{loss}");
        // sample 0: argmax 2 == label; sample 1: ties, first argmax 0 == label.
        assert_eq!(correct, 2);
        let e = [(-2.0f64).exp(), (-1.0f64).exp(), 1.0];
        let s: f64 = e.iter().sum();
        let want = [
            e[0] / s / 2.0,
            e[1] / s / 2.0,
            (e[2] / s - 1.0) / 2.0,
            -1.0 / 3.0,
            1.0 / 6.0,
            1.0 / 6.0,
        ];
        for i in 0..6 {
            assert!(
                (d[i] - want[i]).abs() < 1e-16,
                "{i}: {} vs {}",
                d[i],
                want[i]
            );
        }
        let (sum, c) = softmax_ce_eval(2, 3, &z, &[2, 0]);
        assert!((sum - (l0 + l1)).abs() < 1e-15);
        assert_eq!(c, 2);
        // Huge logits stay finite (max subtraction): loss of the argmax class is ~0.
        let (big, c) = softmax_ce_eval(1, 2, &[1000.0f32, -1000.0], &[0]);
        assert_eq!((big, c), (0.0, 1));
        let (big, _) = softmax_ce_eval(1, 2, &[1000.0f32, -1000.0], &[1]);
        assert_eq!(big, 2000.0);
    }

    #[test]
    fn softmax_ce_invalid_label_is_ignored() {
        let z = [1.0f32, 2.0, 3.0, 0.5, 0.1, 0.2];
        let mut d = [9.0f32; 6];
        let (loss, correct) = softmax_ce(2, 3, &z, &[7, 2], &mut d);
        assert_eq!(&d[..3], &[0.0; 3]);
        let mut d1 = [0.0f32; 3];
        let (l1, c1) = softmax_ce(1, 3, &z[3..], &[2], &mut d1);
        assert_eq!(&d[3..], &d1);
        assert_eq!((loss, correct), (l1, c1));
        assert_eq!(softmax_ce(1, 3, &z, &[3], &mut d).0, 0.0);
    }

    #[test]
    fn softmax_ce_fd_and_f32() {
        let mut rng = Rng::new(30);
        let (n, k) = (5, 7);
        let z = rand_vec(&mut rng, n * k, -3.0, 3.0);
        let labels: Vec<u32> = (0..n).map(|_| rng.below(k as u64) as u32).collect();
        let mut d = vec![0.0; n * k];
        let (loss, _) = softmax_ce(n, k, &z, &labels, &mut d);
        let fd = fd_grad(&z, |z| {
            let mut t = vec![0.0; n * k];
            softmax_ce(n, k, z, &labels, &mut t).0
        });
        assert_close("softmax_ce dlogits", &d, &fd, FD_TOL, FD_FLOOR);
        let mut zi = z.clone();
        assert_eq!(softmax_ce_inplace(n, k, &mut zi, &labels).0, loss);
        assert_eq!(zi, d, "in-place equals out-of-place");
        let (sum, _) = softmax_ce_eval(n, k, &z, &labels);
        assert!((sum / n as f64 - loss).abs() < 1e-14);
        // f32: exp/log ≈ 1 ulp each, sums of 7 terms: errors of a few 1e-7 relative; 2e-6 is safe.
        let mut d32 = vec![0.0f32; n * k];
        let (l32, c32) = softmax_ce(n, k, &to_f32(&z), &labels, &mut d32);
        let (_, c64) = softmax_ce(n, k, &z, &labels, &mut d);
        assert!(((l32 as f64) - loss).abs() <= 2e-6 * loss.abs());
        assert_eq!(c32, c64);
        assert_close("softmax_ce f32", &widen(&d32), &d, 2e-6, 1e-3);
    }

    #[test]
    fn mse_exact_fd_f32() {
        let mut d = [0.0f64; 3];
        let l = mse(&[1.0, 2.0, 4.0], &[0.0, 2.0, 1.0], &mut d);
        assert_eq!(l, 10.0 / 3.0);
        assert_eq!(d, [2.0 / 3.0, 0.0, 2.0]);
        assert_eq!(mse_eval(&[1.0, 2.0, 4.0], &[0.0, 2.0, 1.0]), 10.0 / 3.0);
        let mut ip = [1.0f64, 2.0, 4.0];
        assert_eq!(mse_inplace(&mut ip, &[0.0, 2.0, 1.0]), 10.0 / 3.0);
        assert_eq!(ip, d);
        assert_eq!(mse::<f32>(&[], &[], &mut []), 0.0);

        let mut rng = Rng::new(31);
        let p = rand_vec(&mut rng, 29, -2.0, 2.0);
        let t = rand_vec(&mut rng, 29, -2.0, 2.0);
        let mut d = vec![0.0; 29];
        let l = mse(&p, &t, &mut d);
        let fd = fd_grad(&p, |p| mse(p, &t, &mut vec![0.0; 29]));
        assert_close("mse dpred", &d, &fd, FD_TOL, FD_FLOOR);
        assert!((mse_eval(&p, &t) - l).abs() < 1e-14);
        // f32: 29 squared terms, 8 lanes: ≤ ~6 roundings per lane chain ⇒ ≲ 1e-6 relative.
        let mut d32 = vec![0.0f32; 29];
        let l32 = mse(&to_f32(&p), &to_f32(&t), &mut d32);
        assert!(((l32 as f64) - l).abs() <= 2e-6 * l);
        assert_close("mse f32", &widen(&d32), &d, 1e-6, 1e-3);
    }
}
