//! A linear layer on the GPU — forward, weight (and bias) gradient, input gradient — as the tiled GEMM
//! with the operand layouts the CPU's `ops::linear` uses: `y[n, fout] = x[n, fin]·Wᵀ + b`,
//! `dW (+)= dyᵀ·x`, `db (+)= Σ_samples dy`, `dx (+)= dy·W`.
//!
//! These run one product per call, with transfers, to be checked against the CPU; the GPU backend's
//! step (issue 12) will record the same products into one submission over its planned buffer.
use crate::{GemmOpts, Gpu, GpuError};

impl Gpu {
    /// `y = x·Wᵀ + b` for `n` samples (`x` n×fin, `w` fout×fin, `b` fout).
    pub fn linear_fwd(
        &self,
        n: usize,
        fin: usize,
        fout: usize,
        x: &[f32],
        w: &[f32],
        b: Option<&[f32]>,
    ) -> Result<Vec<f32>, GpuError> {
        let opts = GemmOpts {
            trans_b: true,
            accumulate: b.is_some(),
            ..Default::default()
        };
        // As the CPU does: C starts as the bias in every row and the product accumulates onto it.
        let start: Vec<f32> = match b {
            Some(b) if b.len() == fout => b.iter().copied().cycle().take(n * fout).collect(),
            Some(b) => {
                return Err(GpuError::Shape(format!(
                    "the bias has {} values for {fout} outputs",
                    b.len()
                )))
            }
            None => Vec::new(),
        };
        self.sgemm_with(n, fout, fin, x, w, opts, &start)
    }

    /// `(dW, db)`: `dW (+)= dyᵀ·x`, `db (+)= Σ dy` over the `n` samples; `old` holds their previous
    /// values when accumulating (micro-batches after the first).
    #[allow(clippy::too_many_arguments)]
    pub fn linear_grad_w(
        &self,
        n: usize,
        fin: usize,
        fout: usize,
        x: &[f32],
        dy: &[f32],
        old: Option<(&[f32], &[f32])>,
        with_bias: bool,
    ) -> Result<(Vec<f32>, Vec<f32>), GpuError> {
        let acc = old.is_some();
        let opts = GemmOpts {
            trans_a: true,
            accumulate: acc,
            ..Default::default()
        };
        let (old_w, old_b) = old.unwrap_or((&[], &[]));
        let dw = self.sgemm_with(fout, fin, n, dy, x, opts, old_w)?;
        let db = if with_bias {
            // The column sums as a product with a row of ones (1×n · n×fout).
            let ones = vec![1f32; n];
            let opts = GemmOpts {
                accumulate: acc,
                ..Default::default()
            };
            self.sgemm_with(1, fout, n, &ones, dy, opts, old_b)?
        } else {
            Vec::new()
        };
        Ok((dw, db))
    }

    /// `dx (+)= dy·W` (`dy` n×fout, `w` fout×fin); `old` is dx's previous value when accumulating.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_grad_x(
        &self,
        n: usize,
        fin: usize,
        fout: usize,
        dy: &[f32],
        w: &[f32],
        old: Option<&[f32]>,
    ) -> Result<Vec<f32>, GpuError> {
        let opts = GemmOpts {
            accumulate: old.is_some(),
            ..Default::default()
        };
        self.sgemm_with(n, fin, fout, dy, w, opts, old.unwrap_or(&[]))
    }
}
