//! The integer executor: the step loop over an int8 plan on the [`CpuInt8`] backend, with the integer
//! backend's settings and state (rescaling, exponents, batch splitting) at hand.
use alloc::vec;
use alloc::vec::Vec;

use super::{ExecError, Executor, StepStats, Target};
use crate::backend::CpuInt8;
use crate::graph::TensorId;
use crate::model::Int8Update;
use crate::plan::Plan;
use crate::quant::{Rescale, RescaleCounts, Site};

/// Runs an int8 plan (a graph realised with [`Graph::with_precision`](crate::graph::Graph::with_precision))
/// through the one step loop on the integer CPU backend.
pub struct Int8Executor<'p>(Executor<'p, CpuInt8<'p>>);

impl<'p> Int8Executor<'p> {
    /// An executor for `plan`, whose graph must be int8. Checks the arena and the exactness of every
    /// i32 accumulation.
    pub fn new(plan: &'p Plan, arena: &[u8]) -> Result<Self, ExecError> {
        Executor::with_backend(plan, arena, CpuInt8::new(plan)?).map(Self)
    }

    /// The executor underneath (observed steps, the backend).
    pub fn inner(&mut self) -> &mut Executor<'p, CpuInt8<'p>> {
        &mut self.0
    }

    /// The plan.
    pub fn plan(&self) -> &'p Plan {
        self.0.plan()
    }

    /// The update mode.
    pub fn update(&self) -> Int8Update {
        self.0.backend().update()
    }

    /// Self-adaptive (default) or every-step rescaling.
    pub fn set_rescale(&mut self, r: Rescale) {
        self.0.backend_mut().set_rescale(r)
    }

    /// Steps taken.
    pub fn steps(&self) -> u32 {
        self.0.steps()
    }

    /// Rescale counters summed over all tensors.
    pub fn counts(&self) -> RescaleCounts {
        self.0.backend().counts()
    }

    /// Per tensor: (name, its site) for the tensors that rescale.
    pub fn sites(&self) -> impl Iterator<Item = (&str, &Site)> + '_ {
        self.0.backend().sites()
    }

    /// The exponent of tensor `t` (real value = int8 value · 2^exponent).
    pub fn exponent(&self, t: TensorId) -> i32 {
        self.0.backend().exponent(t)
    }

    /// Initialises the parameters (see [`CpuInt8`]'s initialisation) and resets the step counter.
    pub fn init_params(&mut self, arena: &mut [u8], seed: u64) -> Result<(), ExecError> {
        self.0.init_params(arena, seed)
    }

    /// The parameters a checkpoint holds: `state_dict` names and shapes.
    pub fn state_tensors(
        &self,
    ) -> impl Iterator<Item = (alloc::string::String, Vec<usize>, TensorId)> + 'p {
        let g = &self.0.plan().graph;
        g.nodes.iter().flat_map(|n| {
            n.params
                .iter()
                .map(|p| (p.name.clone(), p.shape.clone(), p.value))
        })
    }

    /// A parameter as f32 (dequantised in integer mode).
    pub fn read_f32(&self, arena: &mut [u8], t: TensorId) -> Result<Vec<f32>, ExecError> {
        let a = self.0.arena(arena)?;
        self.0.backend().read_f32(a, t)
    }

    /// Overwrites a parameter from f32 values (quantised with an exponent from their `max |x|` in integer
    /// mode, with the same head-room as initialisation: `max` in [32, 64)).
    pub fn write_f32(
        &mut self,
        arena: &mut [u8],
        t: TensorId,
        data: &[f32],
    ) -> Result<(), ExecError> {
        let a = self.0.arena(arena)?;
        self.0.backend.write_f32(a, t, data)
    }

    /// One training step (forward, loss, backward, update) in integers.
    ///
    /// Every phase (forward, loss, gradient, derivative, apply) runs in a backend function of its own
    /// that is never inlined, so their locals never share one stack frame: the step's stack is the
    /// deepest phase, not their sum (a Cortex-M0 trains in about 2 KiB of stack).
    pub fn train_step(
        &mut self,
        arena: &mut [u8],
        x: &[f32],
        target: Target<'_>,
    ) -> Result<StepStats, ExecError> {
        Self::classes(target)?;
        self.0.train_step(arena, x, target)
    }

    /// Forward in evaluation mode (exact rescales, no state change) and the loss on at most one
    /// micro-batch.
    pub fn evaluate(
        &mut self,
        arena: &mut [u8],
        x: &[f32],
        target: Target<'_>,
    ) -> Result<StepStats, ExecError> {
        Self::classes(target)?;
        self.0.evaluate(arena, x, target)
    }

    /// The model's prediction for `x` (at most one micro-batch), dequantised into `out` (`n × outputs`
    /// values): the forward pass in evaluation mode, with exact rescales and no state change, as
    /// [`Self::evaluate`] runs it. Like [`Executor::predict`], the values are the last layer's output,
    /// i.e. the logits (the softmax lives in the loss), each int8 value times 2^exponent of the
    /// output tensor. Their arg-max (first maximum) is the class [`Self::evaluate`] counts as
    /// correct on the same samples. Each integer output takes one exponent for the whole batch, so a
    /// sample's values can depend on the samples it is batched with. Allocates nothing. Returns `n`.
    /// Errors: the batch's (sample size, more samples than the plan's batch, a non-finite value), an
    /// `out` whose length is not `n × outputs`, an arena smaller than the plan.
    pub fn predict_into(
        &mut self,
        arena: &mut [u8],
        x: &[f32],
        out: &mut [f32],
    ) -> Result<usize, ExecError> {
        let g = &self.0.plan().graph;
        // The batch's errors (size, count, finiteness) come before the output's.
        let n = self.0.check_batch(x, None, g.batch)?;
        if out.len() != n * g.pred_dims().numel() {
            return Err(ExecError::BadBatch(
                "output length differs from samples × outputs",
                out.len(),
            ));
        }
        let pred = g.pred();
        let (_, bytes) = self.0.predict_bytes(arena, x, 1)?;
        let k = crate::quant::pow2(self.exponent(pred));
        for (o, &b) in out.iter_mut().zip(bytes) {
            *o = b as i8 as f32 * k;
        }
        Ok(n)
    }

    fn classes(target: Target<'_>) -> Result<(), ExecError> {
        match target {
            Target::Classes(_) => Ok(()),
            Target::Values(_) => Err(ExecError::BadBatch("int8 training needs class targets", 0)),
        }
    }

    /// Batch splitting (Mandheling §3.4): one training step on `x` that times every Linear/Conv gradient
    /// instruction on the whole batch and in chunks of n/2, n/4, n/8 (same FLOPs) with the host's
    /// nanosecond `clock`, then splits the ops whose full-batch time is more than `threshold` × their
    /// best chunked time ("abnormal": cost per FLOP jumps with batch size) into that chunk size. Their
    /// chunks' int8 gradients combine by Eq. 4. Returns per node: (full-batch ns, best chunk, its ns).
    pub fn profile_split(
        &mut self,
        arena: &mut [u8],
        x: &[f32],
        target: Target<'_>,
        clock: fn() -> u64,
        threshold: f64,
    ) -> Result<Vec<(usize, u64, usize, u64)>, ExecError> {
        let nodes = self.0.plan().graph.nodes.len();
        let b = self.0.backend_mut();
        b.profile = vec![None; nodes];
        b.clock = Some(clock);
        let r = self.train_step(arena, x, target);
        let b = self.0.backend_mut();
        b.clock = None;
        r?;
        let mut out = Vec::new();
        let mut splits = Vec::new();
        for (ni, p) in b.profile.iter().enumerate() {
            let Some((n, times)) = *p else { continue };
            let (k, best) = (1..4)
                .map(|k| (k, times[k]))
                .min_by_key(|&(_, t)| t)
                .unwrap_or((0, times[0]));
            let chunk = (n >> k).max(1);
            let abnormal = (times[0] as f64) > threshold * best as f64 && chunk < n;
            splits.push((ni, if abnormal { chunk as u16 } else { 0 }));
            out.push((ni, times[0], if abnormal { chunk } else { n }, best));
        }
        for (ni, c) in splits {
            b.set_split(ni, c);
        }
        Ok(out)
    }

    /// Chunk size of each node's weight gradient (0: whole batch), as set by [`Self::profile_split`]
    /// or [`Self::set_split`].
    pub fn split(&self) -> &[u16] {
        self.0.backend().split()
    }

    /// Runs node `node`'s weight gradient in chunks of `chunk` samples (0: whole batch).
    pub fn set_split(&mut self, node: usize, chunk: u16) {
        self.0.backend_mut().set_split(node, chunk)
    }
}
