//! The precision rules a graph is built with: each tensor's dtype, the optimizer state per parameter,
//! what int8 training supports, and the int8 kernels' scratch layouts (how many bytes each instruction's
//! scratch tensor needs). They sit with the graph, which sizes its tensors with them; `quant` (the
//! integer kernels' driver, above the graph) re-exports them.
use alloc::format;
use alloc::string::String;

use super::{DType, GraphError, NodeOp, TensorKind};
use crate::kernels::int8::{igemm_scratch_len_for, KernelFamily, MAX_K};
use crate::model::{Int8Update, LayerKind, LossKind, ModelSpec, OptimizerSpec, Precision, Update};
use crate::ops::ConvGeom;

/// Elements of an i32 tile for Linear (rows of the batch × output features).
pub const TILE: usize = 4096;
/// Alignment of the parts an int8 scratch tensor is split into.
const PART_ALIGN: usize = 64;

/// The dtype of a tensor of `kind` in `precision` (External tensors are the host's f32 batch).
pub fn dtype_of(precision: Precision, kind: TensorKind) -> DType {
    match precision {
        Precision::F32 => DType::F32,
        Precision::Int8(u) => match kind {
            TensorKind::Weight => match u {
                Int8Update::Integer { .. } => DType::I8,
                Int8Update::FloatMaster => DType::F32,
            },
            TensorKind::OptState | TensorKind::Stat | TensorKind::External => DType::F32,
            TensorKind::Activation | TensorKind::Derivative | TensorKind::Gradient => DType::I8,
            TensorKind::Scratch => DType::U8,
        },
    }
}

/// Optimizer state tensors per parameter: none in pure-integer mode.
pub fn state_slots(precision: Precision, opt: &OptimizerSpec) -> usize {
    match precision {
        Precision::Int8(Int8Update::Integer { .. }) => 0,
        _ => opt.state_slots(),
    }
}

/// Rejects what int8 training does not support, naming the layer.
pub fn check_supported(precision: Precision, spec: &ModelSpec) -> Result<(), GraphError> {
    let Precision::Int8(u) = precision else {
        return Ok(());
    };
    if let Int8Update::Integer { update_bits } = u {
        if !(1..=7).contains(&update_bits) {
            return Err(GraphError::Loss(format!(
                "int8 integer update needs update_bits in 1..=7, got {update_bits}"
            )));
        }
    }
    for (i, l) in spec.layers.iter().enumerate() {
        let why = match &l.kind {
            LayerKind::BatchNorm2d { .. }
            | LayerKind::Sigmoid
            | LayerKind::Tanh
            | LayerKind::Relu6
            | LayerKind::Dropout { .. }
            | LayerKind::Embedding { .. }
            | LayerKind::PosEmbedding
            | LayerKind::LayerNorm { .. }
            | LayerKind::RmsNorm { .. }
            | LayerKind::Gelu
            | LayerKind::Silu
            | LayerKind::Attention { .. }
            | LayerKind::LoraLinear { .. }
            | LayerKind::Lstm { .. }
            | LayerKind::Gru { .. } => Some(format!(
                "{} is not part of int8 training (supported: linear, conv2d, relu, maxpool2d, avgpool2d, global_avgpool, flatten, reshape, add); train it with --precision f32",
                l.kind.type_name()
            )),
            LayerKind::MaxPool2d { kernel, .. } if kernel[0] as usize * kernel[1] as usize > 255 => {
                Some(String::from(
                    "int8 max pooling stores window indices as one byte: windows of at most 255 elements",
                ))
            }
            _ if l.trainable && l.update != Update::All => Some(format!(
                "update = {} (a sparse update) is not part of int8 training; train it with --precision f32",
                l.update
            )),
            _ => None,
        };
        if let Some(reason) = why {
            return Err(GraphError::Layer {
                index: i,
                name: l.name.clone(),
                reason,
            });
        }
    }
    if spec.loss == LossKind::Mse {
        return Err(GraphError::Loss(String::from(
            "int8 training supports the cross_entropy loss only (mse is not part of it)",
        )));
    }
    Ok(())
}

fn al(x: usize) -> usize {
    x.div_ceil(PART_ALIGN) * PART_ALIGN
}

/// Splits a scratch tensor into parts of the given byte lengths (each 64-byte aligned); None when short.
pub fn split<const K: usize>(buf: &mut [u8], lens: [usize; K]) -> Option<[&mut [u8]; K]> {
    let mut rest = buf;
    let mut out: [&mut [u8]; K] = core::array::from_fn(|_| <&mut [u8]>::default());
    for (i, &l) in lens.iter().enumerate() {
        let take = al(l).min(rest.len());
        if l > rest.len() {
            return None;
        }
        let (mine, tail) = core::mem::take(&mut rest).split_at_mut(take);
        out[i] = &mut mine[..l];
        rest = tail;
    }
    Some(out)
}

fn total<const K: usize>(lens: [usize; K]) -> usize {
    lens.iter().map(|&l| al(l)).sum()
}

/// Bytes of the per-sample buffers a convolution tile may use per phase: the sample block of each phase
/// is the largest that keeps its columns, i32 accumulators and copies within this and within the
/// layer's int8 output over the batch (at least one sample).
pub const CONV_TILE_BYTES: usize = 16 * 1024;

/// Samples per tile of a convolution at batch `n` for its forward, weight gradient and derivative (the
/// layouts of [`layouts`] hold that many). Bigger tiles mean fewer, larger GEMMs.
pub fn conv_blocks(g: &ConvGeom, n: usize, ext_in: bool) -> [usize; 3] {
    let (cout_g, kg, p) = (
        g.cout / g.groups,
        g.cin / g.groups * g.kh * g.kw,
        g.oh * g.ow,
    );
    let per_in = g.cin * g.h * g.w;
    let xq = if ext_in { per_in } else { 0 };
    let fwd = 4 * g.cout * p + kg * p + xq;
    let gw = kg * p + cout_g * p + xq;
    let gx = 4 * kg * p + 4 * per_in + cout_g * p;
    // Never more than the layer's int8 output over the batch: small models keep small scratch.
    let cap = CONV_TILE_BYTES.min(n * g.cout * p);
    [fwd, gw, gx].map(|per| (cap / per.max(1)).clamp(1, n.max(1)))
}

/// Rows of a Linear tile with `cols` outputs per row.
pub fn tile_rows(n: usize, cols: usize) -> usize {
    (TILE / cols.max(1)).clamp(1, n.max(1))
}

/// Output features per tile of a Linear weight gradient (`fout × fin`) whose i32 accumulator may hold
/// `grad_tile` elements (0: no limit, the whole gradient in one tile); at least one row.
pub fn grad_rows(fout: usize, fin: usize, grad_tile: usize) -> usize {
    match grad_tile {
        0 => fout,
        cap => (cap / fin.max(1)).clamp(1, fout.max(1)),
    }
}

/// Byte lengths of the parts of each phase's scratch (F, CG, CD) for a node; see the executor for their
/// meaning. Part order: F `[input i8, weight i8, bias i32, acc i32, gemm i8]`, CG `[input i8, cols i8,
/// acc i32, gemm i8, unused]`, CD `[weight i8, dcols i32, acc i32, gemm i8, unused]`. The GEMM parts are
/// sized for the kernels of `family`; a Linear's CG accumulator holds [`grad_rows`] rows of the weight
/// gradient (at most `grad_tile` elements unless 0) and the whole bias gradient.
pub fn layouts(
    precision: Precision,
    family: KernelFamily,
    grad_tile: usize,
    op: &NodeOp,
    n: usize,
    ext_in: bool,
) -> Option<[[usize; 5]; 3]> {
    let fm = matches!(precision, Precision::Int8(Int8Update::FloatMaster));
    let igemm_scratch_len = |m, n, k| igemm_scratch_len_for(family, m, n, k);
    match op {
        NodeOp::Linear { fin, fout } => {
            let (fin, fout) = (*fin, *fout);
            let xq = if ext_in { n * fin } else { 0 };
            let wq = if fm { fin * fout } else { 0 };
            let r = tile_rows(n, fout);
            let rx = tile_rows(n, fin);
            let rw = grad_rows(fout, fin, grad_tile);
            Some([
                [
                    xq,
                    wq,
                    4 * fout,
                    4 * r * fout,
                    igemm_scratch_len(r, fout, fin),
                ],
                [
                    xq,
                    0,
                    4 * (rw * fin + fout),
                    igemm_scratch_len(rw, fin, n),
                    0,
                ],
                [wq, 0, 4 * rx * fin, igemm_scratch_len(rx, fin, fout), 0],
            ])
        }
        NodeOp::Conv(g) => {
            let (cin_g, cout_g) = (g.cin / g.groups, g.cout / g.groups);
            let kg = cin_g * g.kh * g.kw;
            let p = g.oh * g.ow;
            let per_in = g.cin * g.h * g.w;
            let [bf, bw, bx] = conv_blocks(g, n, ext_in);
            let xq = |b: usize| if ext_in { b * per_in } else { 0 };
            let wq = if fm { g.cout * kg } else { 0 };
            Some([
                [
                    xq(bf),
                    wq,
                    4 * g.cout,
                    4 * g.cout * bf * p,
                    kg * bf * p + igemm_scratch_len(cout_g, bf * p, kg),
                ],
                [
                    xq(bw),
                    kg * bw * p,
                    4 * (g.cout * kg + g.cout),
                    igemm_scratch_len(cout_g, kg, bw * p),
                    cout_g * bw * p,
                ],
                [
                    wq,
                    4 * kg * bx * p,
                    4 * bx * per_in,
                    igemm_scratch_len(kg, bx * p, cout_g),
                    cout_g * bx * p,
                ],
            ])
        }
        _ => None,
    }
}

/// Scratch bytes per phase (F, CG, CD) of a node in an int8 graph whose GEMMs run kernels of `family`
/// and whose Linear weight gradients accumulate in tiles of `grad_tile` elements (see [`layouts`]).
pub fn scratch_bytes(
    precision: Precision,
    family: KernelFamily,
    grad_tile: usize,
    op: &NodeOp,
    n: usize,
    ext_in: bool,
) -> (usize, usize, usize) {
    match layouts(precision, family, grad_tile, op, n, ext_in) {
        Some([f, w, x]) => (total(f), total(w), total(x)),
        None => (0, 0, 0),
    }
}

/// Whether a node's int8 scratch can be sized at batch `n` without overflow: every product the layouts
/// form (input, output, weight and column buffers over the batch) is at most `isize::MAX / 64`, so
/// their sums and small multiples stay in range. A decoded model's geometry is untrusted; the graph
/// refuses one that fails this with a typed error instead of overflowing.
pub fn scratch_fits(op: &NodeOp, n: usize) -> bool {
    let prod = |xs: &[usize]| {
        xs.iter()
            .try_fold(1usize, |a, &x| a.checked_mul(x))
            .is_some_and(|v| v <= isize::MAX as usize / 64)
    };
    match op {
        NodeOp::Linear { fin, fout } => {
            prod(&[n, *fin]) && prod(&[n, *fout]) && prod(&[*fin, *fout])
        }
        NodeOp::Conv(g) => {
            g.groups >= 1
                && prod(&[n, g.cin, g.h, g.w])
                && prod(&[n, g.cout, g.oh, g.ow])
                && prod(&[n, g.cin, g.kh, g.kw, g.oh, g.ow])
                && prod(&[g.cout, g.cin, g.kh, g.kw])
        }
        _ => true,
    }
}

/// The largest inner dimension (GEMM `k`, or summed terms) a node accumulates in i32, for the exactness
/// check ([`MAX_K`]).
pub fn max_accumulation(op: &NodeOp, n: usize) -> usize {
    match op {
        NodeOp::Linear { fin, fout } => (*fin).max(*fout).max(n),
        NodeOp::Conv(g) => {
            let kg = g.cin / g.groups * g.kh * g.kw;
            kg.max(g.cout / g.groups * g.kh * g.kw).max(n * g.oh * g.ow)
        }
        NodeOp::AvgPool(g) => g.kh * g.kw,
        NodeOp::GlobalAvgPool { hw, .. } => *hw,
        _ => 0,
    }
}

/// `MAX_K` re-exported for the executor's check.
pub const ACC_LIMIT: usize = MAX_K;
