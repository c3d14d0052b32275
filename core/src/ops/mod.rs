//! Layer kernels: forward and backward of every layer kind (`model::LayerKind`), as pure slice
//! functions generic over [`Real`](crate::kernels::Real) (`f32` for training, `f64` for the
//! finite-difference reference path).
//!
//! Conventions shared by every op:
//!
//! * Layout is NCHW, row-major; the batch size `n` is passed explicitly and may be smaller than the
//!   planned batch (buffers may be longer than needed; only the first `n` samples are touched).
//! * No allocation and no `alloc`: temporary storage comes from caller-provided `scratch` slices whose
//!   required length is given by the op's `*_scratch_len` function. Those lengths are bounded —
//!   never proportional to the batch — so the planner can reserve them in the arena.
//! * Weight gradients (`*_grad_w`) overwrite `dW`/`db`. Input gradients (`*_grad_x`, `*_grad`) take
//!   `accumulate`: `true` adds into `dx` (a tensor with several consumers, e.g. a residual), `false`
//!   overwrites it.
//! * Shapes are validated by the caller (geometry constructors return `None` for invalid ones);
//!   valid shapes never panic. Indexing is bounds-checked.
//! * Activations and dropout compute their backward from data that survives an in-place forward
//!   (the output `y`, or the regenerated dropout mask), and offer `_inplace` variants.

pub mod act;
pub mod bn;
pub mod conv;
pub mod dropout;
pub mod elementwise;
pub mod linear;
pub mod loss;
pub mod pool;
pub mod rnn;
pub mod seq;

#[cfg(test)]
mod testutil;

pub use act::{
    act_fwd, act_fwd_inplace, act_grad, act_grad_inplace, act_grad_one, relu, relu6, Act,
};
pub use bn::{
    bn_fwd_eval, bn_fwd_eval_inplace, bn_fwd_recompute, bn_fwd_recompute_then, bn_fwd_train,
    bn_fwd_train_then, bn_grad_inplace_then, bn_grad_w, bn_grad_w_rows, bn_grad_w_store, bn_grad_x,
    bn_grad_x_eval, bn_grad_x_inplace,
};
pub use conv::{
    conv_fwd, conv_fwd_par, conv_grad_w, conv_grad_w_par, conv_grad_w_rows_par, conv_grad_x,
    conv_grad_x_par, conv_scratch_len, conv_scratch_len_threads, ConvGeom, CONV_COL_CAP,
};
pub use dropout::{
    dropout_fwd, dropout_fwd_inplace, dropout_grad, dropout_grad_inplace, dropout_keep,
};
pub use elementwise::{
    add_fwd, add_fwd_inplace, axpy, copy_or_acc, dot, fill, par_map, scale, scale_into, sum,
};
pub use linear::{
    linear_fwd, linear_fwd_par, linear_grad_w, linear_grad_w_par, linear_grad_w_rows_par,
    linear_grad_x, linear_grad_x_par, linear_scratch_len, linear_scratch_len_threads,
};
pub use loss::{mse, mse_eval, mse_inplace, softmax_ce, softmax_ce_eval, softmax_ce_inplace};
pub use pool::{
    avgpool_fwd, avgpool_grad_x, global_avgpool_fwd, global_avgpool_grad_x, maxpool_fwd,
    maxpool_grad_x, PoolGeom,
};
