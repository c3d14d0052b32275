//! Where a session's batches come from: the host side of the guest's `next_batch` import. The data
//! set stays in the host's memory; only one batch at a time is copied into the guest.
use frugal_cli::data::Dataset;

/// A source of training and held-out batches for a session.
pub trait Batches: Send + 'static {
    /// `f32` values per sample (must equal the model's input size).
    fn sample_len(&self) -> usize;
    /// Writes the samples of training step `step` (at most `y.len()`; `x` holds `y.len()` samples)
    /// and returns how many. Returning 0 ends training with a data error.
    fn train_batch(&mut self, step: u64, x: &mut [f32], y: &mut [u32]) -> usize;
    /// Writes held-out batch `index` (0, 1, …) like [`Batches::train_batch`]; 0 ends the evaluation.
    fn eval_batch(&mut self, index: u64, x: &mut [f32], y: &mut [u32]) -> usize;
}

/// The order of training samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Step `i` takes samples `[b·i, b·i + b)` (batch `b`), wrapping around: the cross-target
    /// reference run.
    Sequential,
    /// Each epoch is a fresh shuffle ([`Dataset::shuffle_indices`] with this seed), split into
    /// batches; the last batch of an epoch may be short — exactly as `frugal train` does.
    Shuffled {
        /// Shuffle seed.
        seed: u64,
    },
}

/// Batches from a training and a held-out [`Dataset`].
pub struct DatasetBatches {
    train: Dataset,
    test: Dataset,
    order: Order,
    /// The current epoch's shuffled indices, by epoch.
    shuffled: Option<(u64, Vec<usize>)>,
    idx: Vec<usize>,
}

impl DatasetBatches {
    /// Batches of `train` in `order`; evaluation runs over all of `test`.
    pub fn new(train: Dataset, test: Dataset, order: Order) -> Self {
        Self {
            train,
            test,
            order,
            shuffled: None,
            idx: Vec::new(),
        }
    }

    /// Training steps per epoch at batch `batch`.
    pub fn steps_per_epoch(&self, batch: usize) -> u64 {
        self.train.len().div_ceil(batch.max(1)) as u64
    }
}

impl Batches for DatasetBatches {
    fn sample_len(&self) -> usize {
        self.train.dims.numel()
    }

    fn train_batch(&mut self, step: u64, x: &mut [f32], y: &mut [u32]) -> usize {
        let (b, len) = (y.len(), self.train.len());
        if b == 0 || len == 0 {
            return 0;
        }
        self.idx.clear();
        match self.order {
            Order::Sequential => {
                let start = (step as usize).wrapping_mul(b);
                self.idx.extend((0..b).map(|k| start.wrapping_add(k) % len));
            }
            Order::Shuffled { seed } => {
                let per_epoch = len.div_ceil(b) as u64;
                let (epoch, k) = (step / per_epoch, (step % per_epoch) as usize);
                if self.shuffled.as_ref().map(|(e, _)| *e) != Some(epoch) {
                    self.shuffled = Some((epoch, self.train.shuffle_indices(seed, epoch)));
                }
                if let Some((_, order)) = &self.shuffled {
                    let end = (k * b + b).min(len);
                    self.idx.extend_from_slice(&order[k * b..end]);
                }
            }
        }
        self.train.batch(&self.idx, x, y);
        self.idx.len()
    }

    fn eval_batch(&mut self, index: u64, x: &mut [f32], y: &mut [u32]) -> usize {
        let (b, len) = (y.len(), self.test.len());
        let start = (index as usize).saturating_mul(b);
        if start >= len {
            return 0;
        }
        self.idx.clear();
        self.idx.extend(start..(start + b).min(len));
        self.test.batch(&self.idx, x, y);
        self.idx.len()
    }
}
