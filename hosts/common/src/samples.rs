//! The training samples a host's trainer keeps (the browser's `Session`, Android's `Trainer`): inputs
//! checked and appended, labels, and each step's batch.
//!
//! Batches: with at most `batch` samples every step trains on all of them in the order added; with more,
//! each step trains on the `batch` samples after the previous step's, in the order added, wrapping
//! around. A batch is always borrowed from the store. When its window would wrap past the last sample,
//! the store is first rotated in place so that the window starts at the first sample: the samples' order
//! as a ring, and so every batch, stays the same. A rotation moves each sample once per pass over them —
//! what copying every batch into a buffer of its own cost, without the buffer — and allocates nothing.
use alloc::vec::Vec;

/// Why a sample was refused (each host words the message itself).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SampleError {
    /// The input has `got` values; the model's input has `per`.
    Length {
        /// Values given.
        got: usize,
        /// Values per sample.
        per: usize,
    },
    /// Value `index` of the input is `value`, which is not finite.
    NonFinite {
        /// Its index in the input.
        index: usize,
        /// The value.
        value: f32,
    },
    /// The label is not below the number of classes.
    Label {
        /// The label given.
        label: u32,
        /// Classes the model predicts (≥ 1).
        classes: usize,
    },
    /// The store could not grow by this many bytes.
    OutOfMemory(usize),
}

/// The samples: inputs of `per` values laid end to end, their labels (`tokens` per sample: one for a
/// classifier, one per position for a sequence model), and where the next batch starts.
#[derive(Clone, Debug)]
pub struct Samples {
    per: usize,
    classes: usize,
    tokens: usize,
    batch: usize,
    xs: Vec<f32>,
    ys: Vec<u32>,
    /// Where the next batch starts when there are more samples than the batch.
    cursor: usize,
}

impl Samples {
    /// An empty store for inputs of `per` values, labels below `classes`, batches of `batch`
    /// samples (≥ 1).
    pub fn new(per: usize, classes: usize, batch: usize) -> Samples {
        Samples::with_tokens(per, classes, 1, batch)
    }

    /// An empty store whose samples carry `tokens` labels each (≥ 1; a sequence model's label per
    /// position).
    pub fn with_tokens(per: usize, classes: usize, tokens: usize, batch: usize) -> Samples {
        Samples {
            per,
            classes,
            tokens: tokens.max(1),
            batch,
            xs: Vec::new(),
            ys: Vec::new(),
            cursor: 0,
        }
    }

    /// Checks an input: `per` values, all finite.
    pub fn check(&self, x: &[f32]) -> Result<(), SampleError> {
        if x.len() != self.per {
            return Err(SampleError::Length {
                got: x.len(),
                per: self.per,
            });
        }
        match x.iter().position(|v| !v.is_finite()) {
            Some(index) => Err(SampleError::NonFinite {
                index,
                value: x[index],
            }),
            None => Ok(()),
        }
    }

    /// Adds a sample: `x` as [`Samples::check`] wants it and a label below the classes (checked in
    /// that order). A refused sample leaves the store as it was.
    pub fn add(&mut self, x: &[f32], label: u32) -> Result<(), SampleError> {
        self.add_labels(x, &[label])
    }

    /// [`Samples::add`] for a store of `tokens` labels per sample: `labels` has that many, each below
    /// the classes (a wrong count is a [`SampleError::Length`] of the labels).
    pub fn add_labels(&mut self, x: &[f32], labels: &[u32]) -> Result<(), SampleError> {
        self.check(x)?;
        if labels.len() != self.tokens {
            return Err(SampleError::Length {
                got: labels.len(),
                per: self.tokens,
            });
        }
        if let Some(&label) = labels.iter().find(|&&l| l as usize >= self.classes) {
            return Err(SampleError::Label {
                label,
                classes: self.classes,
            });
        }
        self.xs
            .try_reserve(x.len())
            .map_err(|_| SampleError::OutOfMemory(x.len() * 4))?;
        self.ys
            .try_reserve(labels.len())
            .map_err(|_| SampleError::OutOfMemory(labels.len() * 4))?;
        self.xs.extend_from_slice(x);
        self.ys.extend_from_slice(labels);
        Ok(())
    }

    /// Forgets the samples added after the store held `n` (a host undoing a call that added several):
    /// appending never moves the samples already held, so those are the last `len() - n` in the store.
    pub fn truncate(&mut self, n: usize) {
        if n < self.len() {
            self.xs.truncate(n * self.per);
            self.ys.truncate(n * self.tokens);
            if self.cursor >= n {
                self.cursor = 0;
            }
        }
    }

    /// Forgets every sample.
    pub fn clear(&mut self) {
        self.xs.clear();
        self.ys.clear();
        self.cursor = 0;
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.ys.len() / self.tokens
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ys.is_empty()
    }

    /// Values per input.
    pub fn per(&self) -> usize {
        self.per
    }

    /// The next step's batch (inputs, labels; `min(len, batch)` samples; empty when the store is):
    /// see the module docs for which samples, and for the rotation when the window would wrap.
    pub fn next_batch(&mut self) -> (&[f32], &[u32]) {
        let (per, tokens, total, batch) = (self.per, self.tokens, self.len(), self.batch);
        if total <= batch {
            return (&self.xs, &self.ys);
        }
        if self.cursor + batch > total {
            // The window would wrap: rotate the store so that it starts at the first sample.
            self.xs.rotate_left(self.cursor * per);
            self.ys.rotate_left(self.cursor * tokens);
            self.cursor = 0;
        }
        let c = self.cursor;
        self.cursor = (c + batch) % total;
        (
            &self.xs[c * per..(c + batch) * per],
            &self.ys[c * tokens..(c + batch) * tokens],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sample i is `[i, i + 0.5]` with label i % 3.
    fn store(n: usize, batch: usize) -> Samples {
        let mut s = Samples::new(2, 3, batch);
        for i in 0..n {
            s.add(&[i as f32, i as f32 + 0.5], (i % 3) as u32).unwrap();
        }
        s
    }

    /// The batch the documented order gives for step `k`: with more samples than the batch,
    /// samples (k·batch + j) mod n.
    fn expected(n: usize, batch: usize, k: usize) -> (Vec<f32>, Vec<u32>) {
        let ids: Vec<usize> = if n <= batch {
            (0..n).collect()
        } else {
            (0..batch).map(|j| (k * batch + j) % n).collect()
        };
        let x = ids
            .iter()
            .flat_map(|&i| [i as f32, i as f32 + 0.5])
            .collect();
        (x, ids.iter().map(|&i| (i % 3) as u32).collect())
    }

    #[test]
    fn batches_follow_the_documented_order_borrowed_or_wrapped() {
        for (n, batch) in [(1, 4), (4, 4), (5, 4), (7, 3), (9, 3), (10, 7), (2, 1)] {
            let mut s = store(n, batch);
            for k in 0..3 * n {
                let (x, y) = s.next_batch();
                let (ex, ey) = expected(n, batch, k);
                assert_eq!((x, y), (&ex[..], &ey[..]), "n {n}, batch {batch}, step {k}");
            }
        }
    }

    #[test]
    fn batches_are_borrowed_and_a_wrapping_window_rotates_the_store_in_place() {
        let mut s = store(10, 4);
        let (base, cap) = (s.xs.as_ptr(), s.xs.capacity());
        let (x, _) = s.next_batch(); // samples 0..4
        assert_eq!(x.as_ptr(), base);
        let (x, _) = s.next_batch(); // samples 4..8
        assert_eq!(x.as_ptr(), base.wrapping_add(8));
        let (x, y) = s.next_batch(); // samples 8, 9, 0, 1: the store rotated by 8
        assert_eq!((x.as_ptr(), y), (base, &[2, 0, 0, 1][..]));
        assert_eq!(x, &[8.0, 8.5, 9.0, 9.5, 0.0, 0.5, 1.0, 1.5]);
        let (x, _) = s.next_batch(); // samples 2..6, now at store positions 4..8
        assert_eq!(x.as_ptr(), base.wrapping_add(8));
        assert_eq!(
            (s.xs.as_ptr(), s.xs.capacity()),
            (base, cap),
            "nothing reallocated"
        );
    }

    #[test]
    fn refused_samples_say_why_and_change_nothing() {
        let mut s = store(2, 4);
        assert_eq!(
            s.add(&[1.0], 0),
            Err(SampleError::Length { got: 1, per: 2 })
        );
        assert_eq!(
            s.add(&[1.0, f32::INFINITY], 0),
            Err(SampleError::NonFinite {
                index: 1,
                value: f32::INFINITY
            })
        );
        assert!(matches!(
            s.add(&[f32::NAN, 0.0], 0),
            Err(SampleError::NonFinite { index: 0, .. })
        ));
        assert_eq!(
            s.add(&[1.0, 2.0], 3),
            Err(SampleError::Label {
                label: 3,
                classes: 3
            })
        );
        assert_eq!(s.len(), 2);
        let (ex, ey) = expected(2, 4, 0);
        assert_eq!(s.next_batch(), (&ex[..], &ey[..]));
        s.clear();
        assert!(s.is_empty());
        assert_eq!(s.next_batch(), (&[][..], &[][..]));
    }

    #[test]
    fn clearing_restarts_the_window_at_the_first_sample() {
        let mut s = store(5, 2);
        s.next_batch();
        s.next_batch();
        s.clear();
        for i in 10..15 {
            s.add(&[i as f32, 0.0], 0).unwrap();
        }
        assert_eq!(s.next_batch().0, &[10.0, 0.0, 11.0, 0.0]);
    }

    #[test]
    fn sequence_samples_carry_a_label_per_token_through_wrapping_batches() {
        // Sample i: input [i, i], labels [i, i + 1, i + 2] (3 tokens), classes 10.
        let mut s = Samples::with_tokens(2, 10, 3, 2);
        for i in 0..5u32 {
            s.add_labels(&[i as f32; 2], &[i, i + 1, i + 2]).unwrap();
        }
        assert_eq!(s.len(), 5);
        for k in 0..12usize {
            let (x, y) = s.next_batch();
            let ids: Vec<u32> = (0..2).map(|j| ((k * 2 + j) % 5) as u32).collect();
            let ex: Vec<f32> = ids.iter().flat_map(|&i| [i as f32; 2]).collect();
            let ey: Vec<u32> = ids.iter().flat_map(|&i| [i, i + 1, i + 2]).collect();
            assert_eq!((x, y), (&ex[..], &ey[..]), "step {k}");
        }
        assert_eq!(
            s.add_labels(&[0.0; 2], &[1, 2]),
            Err(SampleError::Length { got: 2, per: 3 })
        );
        assert_eq!(
            s.add_labels(&[0.0; 2], &[1, 10, 2]),
            Err(SampleError::Label {
                label: 10,
                classes: 10
            })
        );
        assert_eq!(s.len(), 5, "refused samples are not kept");
    }
}
