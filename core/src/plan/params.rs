//! The read-only parameter space: frozen parameters read from the caller's immutable bytes (flash on a
//! microcontroller, a host's `&[u8]`) instead of living in the arena.
//!
//! A sparse update ([`crate::model::Update`]) leaves parameters that a step only reads: the values of
//! parameters without a gradient (frozen layers, a bias-only layer's weight) and the running statistics
//! of BatchNorms in evaluation mode. [`Plan::read_only_params`] moves their storages out of the host
//! arena into a memory space of their own — [`PARAMS`] (f32), [`PARAMS_I8`] (Linear/Conv weights and
//! LoRA Linears' base weights as int8 with one f32 scale per output channel, [`crate::kernels::rows`];
//! everything else f32) or [`PARAMS_F16`] (those weights as IEEE fp16, everything else f32) — laid out
//! like any other space (the plan format carries it): the arena shrinks by exactly their bytes. The
//! caller hands the space's bytes to the executor as a *parameter image*
//! ([`Executor::with_params`](crate::exec::Executor::with_params)): a 64-byte header ([`IMAGE_MAGIC`],
//! the encoding, the body's length and a fingerprint of the layout, so an image made for another plan
//! is refused) followed by the body at the plan's offsets. [`split_state`] builds it (and the rest of
//! the state, which goes into the arena) from the state in [`Executor::state_ids`] order; under
//! [`PARAMS_I8`] and [`PARAMS_F16`] that is where the weights are quantised or rounded. A step
//! converts such a weight to f32, one weight at a time, into a region at the top of the arena
//! ([`Plan::dequant_region`]).
//!
//! Channel subsets ([`crate::model::Update::Channels`]) stay in the arena whole: their frozen rows
//! share a tensor with the trained ones, and a kernel reads a weight as one slice.
//!
//! [`Executor::state_ids`]: crate::exec::Executor::state_ids
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

use super::{Eo, GroupId, IdVec, Plan, SpaceId, StorageId, TensorLife, ALIGN};
use crate::graph::{Graph, NodeOp, TensorId};
use crate::kernels::rows::quantize_rows;
use crate::model::Precision;

/// The read-only parameter space with every tensor in f32.
pub const PARAMS: SpaceId = SpaceId(0xF0);
/// The read-only parameter space with Linear/Conv weights in int8 (per-output-channel scales).
pub const PARAMS_I8: SpaceId = SpaceId(0xF1);
/// The read-only parameter space with Linear/Conv weights in IEEE fp16.
pub const PARAMS_F16: SpaceId = SpaceId(0xF2);

/// Bytes of a parameter image's header; the body follows (64-byte aligned when the image is).
pub const IMAGE_HEADER: usize = 64;
/// Magic of a parameter image.
pub const IMAGE_MAGIC: [u8; 4] = *b"FRGR";

/// How the read-only parameters are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamEncoding {
    /// f32, as in the arena: training is bit-identical to the plan that keeps them in the arena.
    F32,
    /// Linear/Conv weights as int8, row `r` (output channel) stored as its f32 scale among the
    /// weight's scales, then its int8 values; read as `q × scale`. Biases, BatchNorm parameters and
    /// statistics stay f32.
    Int8,
    /// Linear/Conv weights as IEEE fp16 (round to nearest even), read as their f32 values; the rest
    /// f32, as under [`ParamEncoding::Int8`].
    F16,
}

impl ParamEncoding {
    /// The space this encoding's parameters live in.
    pub const fn space(self) -> SpaceId {
        match self {
            ParamEncoding::F32 => PARAMS,
            ParamEncoding::Int8 => PARAMS_I8,
            ParamEncoding::F16 => PARAMS_F16,
        }
    }
    /// The encoding of a read-only parameter space (None: another space).
    pub fn of_space(s: SpaceId) -> Option<Self> {
        match s {
            PARAMS => Some(ParamEncoding::F32),
            PARAMS_I8 => Some(ParamEncoding::Int8),
            PARAMS_F16 => Some(ParamEncoding::F16),
            _ => None,
        }
    }
    fn code(self) -> u8 {
        match self {
            ParamEncoding::F32 => 0,
            ParamEncoding::Int8 => 1,
            ParamEncoding::F16 => 2,
        }
    }
    /// Whether Linear/Conv weights are stored narrower than f32 (converted into the arena's
    /// dequantisation region when an instruction reads them).
    pub const fn narrow(self) -> bool {
        !matches!(self, ParamEncoding::F32)
    }
}

/// Why a plan cannot read its parameters from an image, or an image does not fit a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamsError {
    /// The plan cannot take a read-only parameter space (what it has instead).
    Unsupported(&'static str),
    /// The image is shorter than its header and the plan's parameter space.
    TooShort {
        /// Bytes needed.
        needed: usize,
        /// Bytes given.
        given: usize,
    },
    /// The image does not start at a 4-byte aligned address (its f32 values are read in place).
    Misaligned,
    /// The image does not start with [`IMAGE_MAGIC`].
    Magic,
    /// The image was made for another layout or encoding (what differs).
    Mismatch(&'static str),
    /// An fp16 weight of the image holds a NaN or an infinity (a corrupt image; fp16 rounding of a
    /// finite weight saturates instead): the parameter's node.
    NonFinite {
        /// The graph node whose weight it is.
        node: usize,
    },
}

impl fmt::Display for ParamsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamsError::Unsupported(w) => write!(f, "no read-only parameters for this plan: {w}"),
            ParamsError::TooShort { needed, given } => write!(
                f,
                "the parameter image holds {given} B, the plan needs {needed} B"
            ),
            ParamsError::Misaligned => {
                write!(f, "the parameter image is not at a 4-byte aligned address")
            }
            ParamsError::Magic => write!(f, "the parameter image does not start with FRGR"),
            ParamsError::Mismatch(w) => {
                write!(f, "the parameter image was made for another plan: {w}")
            }
            ParamsError::NonFinite { node } => write!(
                f,
                "the parameter image's fp16 weight of node {node} holds a NaN or an infinity"
            ),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for ParamsError {}

/// The tensors a training step of `g` only reads, in state order (node by node, parameters then
/// statistics): parameter values without a gradient, and the running statistics of BatchNorms in
/// evaluation mode.
pub fn read_only_tensors(g: &Graph) -> impl Iterator<Item = TensorId> + '_ {
    g.nodes.iter().flat_map(|n| {
        let frozen_stats = matches!(n.op, NodeOp::BatchNorm { train: false, .. });
        n.params
            .iter()
            .filter(|p| p.grad.is_none())
            .map(|p| p.value)
            .chain(n.stats.iter().copied().filter(move |_| frozen_stats))
    })
}

/// A node's weight that the narrow encodings store narrower than f32: a Linear's, a convolution's or
/// a LoRA Linear's base weight (its first parameter).
fn narrow_weight(n: &crate::graph::Node) -> Option<&crate::graph::Param> {
    match n.op {
        NodeOp::Linear { .. } | NodeOp::Conv(_) | NodeOp::Lora(_) => n.params.first(),
        _ => None,
    }
}

/// Output channels of `t` when it is a Linear/Conv weight or a LoRA Linear's base weight (the tensors
/// [`ParamEncoding::Int8`] stores in int8 and [`ParamEncoding::F16`] in fp16).
pub fn weight_rows(g: &Graph, t: TensorId) -> Option<usize> {
    g.nodes.iter().find_map(|n| match narrow_weight(n) {
        Some(p) if p.value == t => p.shape.first().copied(),
        _ => None,
    })
}

/// Bytes tensor `t` takes in the parameter space of `enc`.
pub fn encoded_bytes(g: &Graph, t: TensorId, enc: ParamEncoding) -> usize {
    let bytes = g.tensors[t as usize].bytes;
    match (enc, weight_rows(g, t)) {
        (ParamEncoding::Int8, Some(rows)) => rows * 4 + bytes / 4,
        (ParamEncoding::F16, Some(_)) => bytes / 2,
        _ => bytes,
    }
}

fn storage_of(
    group_of: &[Option<GroupId>],
    segments: &IdVec<GroupId, Vec<(Eo, StorageId)>>,
    t: TensorId,
) -> Option<StorageId> {
    let g = group_of.get(t as usize).copied().flatten()?;
    segments.get(g)?.first().map(|s| s.1)
}

/// Sizes the storages of a parameter space by their encoding (the lifetimes give f32 sizes) and checks
/// that only read-only tensors live there: what the plan decoder does after reading the spaces.
pub(crate) fn apply_encoding(
    g: &Graph,
    group_of: &[Option<GroupId>],
    segments: &IdVec<GroupId, Vec<(Eo, StorageId)>>,
    lives: &mut IdVec<StorageId, TensorLife>,
) -> Result<(), &'static str> {
    let mut read_only = 0usize;
    for t in read_only_tensors(g) {
        let Some(s) = storage_of(group_of, segments, t) else {
            continue;
        };
        if let Some(enc) = ParamEncoding::of_space(lives[s].space) {
            lives[s].bytes = encoded_bytes(g, t, enc);
            read_only += 1;
        }
    }
    let in_space = lives
        .iter()
        .filter(|l| ParamEncoding::of_space(l.space).is_some())
        .count();
    if in_space != read_only {
        return Err("a tensor the step writes is in the read-only parameter space");
    }
    Ok(())
}

fn fnv(h: u64, v: u64) -> u64 {
    v.to_le_bytes().iter().fold(h, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl Plan {
    /// The read-only parameter space of this plan: its encoding and size (None: every parameter is in
    /// the arena).
    pub fn params_space(&self) -> Option<(ParamEncoding, usize)> {
        self.spaces
            .iter()
            .find_map(|s| ParamEncoding::of_space(s.space).map(|e| (e, s.bytes)))
    }

    /// Whether tensor `t` is read from the parameter image (not the arena).
    pub fn in_params_space(&self, t: TensorId) -> bool {
        self.storage_at(t, 0)
            .is_some_and(|s| ParamEncoding::of_space(self.lives[s].space).is_some())
    }

    /// f32 elements of the largest int8 or fp16 weight in the parameter space (0 without one): what
    /// the dequantisation region at the top of the arena holds ([`Plan::dequant_region`]).
    pub fn dequant_elems(&self) -> usize {
        let narrow = |s: SpaceId| ParamEncoding::of_space(s).is_some_and(ParamEncoding::narrow);
        if !self.spaces.iter().any(|s| narrow(s.space)) {
            return 0;
        }
        self.graph
            .nodes
            .iter()
            .filter_map(|n| {
                let p = narrow_weight(n)?;
                self.storage_at(p.value, 0)
                    .filter(|&s| narrow(self.lives[s].space))
                    .map(|_| self.graph.tensors[p.value as usize].bytes / 4)
            })
            .max()
            .unwrap_or(0)
    }

    /// The arena range `(offset, bytes)` int8 and fp16 weights are converted into, one weight at a
    /// time by the instruction that reads it: the top [`Plan::dequant_elems`] f32 values of the arena
    /// (rounded up to [`ALIGN`]), which no storage uses. None when the plan has no such weights.
    pub fn dequant_region(&self) -> Option<(usize, usize)> {
        let elems = self.dequant_elems();
        if elems == 0 {
            return None;
        }
        let reserved = (elems * 4).div_ceil(ALIGN) * ALIGN;
        Some((self.arena_bytes.checked_sub(reserved)?, elems * 4))
    }

    /// Moves every tensor a step only reads ([`read_only_tensors`]) out of the arena into the read-only
    /// parameter space of `enc`, and lays out the arena again without them; under
    /// [`ParamEncoding::Int8`] and [`ParamEncoding::F16`] the arena then grows by the dequantisation
    /// region at its top ([`Plan::dequant_region`]). Returns the number of tensors moved (0 leaves the
    /// plan as it was). f32 plans whose storages are all in the arena only, without a frozen LSTM/GRU
    /// (its kernels read their weights from the arena).
    pub fn read_only_params(&mut self, enc: ParamEncoding) -> Result<usize, ParamsError> {
        if self.graph.precision != Precision::F32 {
            return Err(ParamsError::Unsupported(
                "an int8 plan (its weights are quantised in the arena)",
            ));
        }
        if !self.spaces.is_empty() || self.lives.iter().any(|l| l.space != SpaceId::HOST) {
            return Err(ParamsError::Unsupported(
                "the plan already uses another memory space",
            ));
        }
        let frozen_rnn =
            self.graph.nodes.iter().any(|n| {
                matches!(n.op, NodeOp::Rnn(_)) && n.params.iter().any(|p| p.grad.is_none())
            });
        if frozen_rnn {
            return Err(ParamsError::Unsupported(
                "a frozen LSTM/GRU (its parameters stay in the arena)",
            ));
        }
        let moved: Vec<(TensorId, StorageId)> = read_only_tensors(&self.graph)
            .filter_map(|t| storage_of(&self.group_of, &self.segments, t).map(|s| (t, s)))
            .collect();
        if moved.is_empty() {
            return Ok(0);
        }
        for &(t, s) in &moved {
            self.lives[s].bytes = encoded_bytes(&self.graph, t, enc);
        }
        let space = enc.space();
        self.place_spaces(
            |s, l| {
                if moved.iter().any(|m| m.1 == s) {
                    space
                } else {
                    l.space
                }
            },
            |_| ALIGN,
        );
        if let Some((_, bytes)) = self.dequant_region_after_layout() {
            self.arena_bytes += bytes;
            self.lower_bound += bytes;
        }
        Ok(moved.len())
    }

    /// The dequantisation region's reserved bytes, before it is added to the arena.
    fn dequant_region_after_layout(&self) -> Option<(usize, usize)> {
        let elems = self.dequant_elems();
        (elems > 0).then(|| (self.arena_bytes, (elems * 4).div_ceil(ALIGN) * ALIGN))
    }

    /// A fingerprint of the parameter space's layout (encoding, each tensor's id, offset and bytes,
    /// the space's size): what an image records and the executor checks.
    pub fn params_fingerprint(&self) -> u64 {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        let Some((enc, bytes)) = self.params_space() else {
            return h;
        };
        h = fnv(h, u64::from(enc.code()));
        h = fnv(h, bytes as u64);
        for t in read_only_tensors(&self.graph) {
            if let Some(s) = self.storage_at(t, 0) {
                if ParamEncoding::of_space(self.lives[s].space).is_some() {
                    h = fnv(h, u64::from(t));
                    h = fnv(h, self.offsets[s] as u64);
                    h = fnv(h, self.lives[s].bytes as u64);
                }
            }
        }
        h
    }

    /// Checks a parameter image against this plan and returns its body (what instructions read at the
    /// space's offsets). A plan without a parameter space takes only an empty image.
    pub fn check_params_image<'a>(&self, image: &'a [u8]) -> Result<&'a [u8], ParamsError> {
        let Some((enc, bytes)) = self.params_space() else {
            return if image.is_empty() {
                Ok(image)
            } else {
                Err(ParamsError::Mismatch(
                    "the plan keeps every parameter in the arena",
                ))
            };
        };
        let needed = IMAGE_HEADER + bytes;
        if image.len() < IMAGE_HEADER {
            return Err(ParamsError::TooShort {
                needed,
                given: image.len(),
            });
        }
        if image[..4] != IMAGE_MAGIC {
            return Err(ParamsError::Magic);
        }
        if image.as_ptr().align_offset(4) != 0 {
            return Err(ParamsError::Misaligned);
        }
        if image[4] != enc.code() {
            return Err(ParamsError::Mismatch("another encoding"));
        }
        let word = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&image[at..at + 8]);
            u64::from_le_bytes(b)
        };
        if word(8) != bytes as u64 {
            return Err(ParamsError::Mismatch("another size of the parameter space"));
        }
        if word(16) != self.params_fingerprint() {
            return Err(ParamsError::Mismatch(
                "another layout of the parameter space",
            ));
        }
        let body = image
            .get(IMAGE_HEADER..needed)
            .ok_or(ParamsError::TooShort {
                needed,
                given: image.len(),
            })?;
        if enc == ParamEncoding::F16 {
            self.check_f16_finite(body)?;
        }
        Ok(body)
    }

    /// Every fp16 weight of an [`ParamEncoding::F16`] image's `body` is finite ([`split_state`]
    /// saturates what it rounds, so a NaN or an infinity there is a corrupt image).
    fn check_f16_finite(&self, body: &[u8]) -> Result<(), ParamsError> {
        for (node, n) in self.graph.nodes.iter().enumerate() {
            let Some(p) = narrow_weight(n) else { continue };
            if let Some(ReadOnly::F16(v)) = read_only(self, body, p.value)? {
                // Exponent all ones: an infinity or a NaN.
                if v.iter().any(|&h| h & 0x7c00 == 0x7c00) {
                    return Err(ParamsError::NonFinite { node });
                }
            }
        }
        Ok(())
    }
}

/// Splits a state (every persistent tensor's little-endian f32 values back to back in
/// [`Executor::state_ids`](crate::exec::Executor::state_ids) order, as a checkpoint or `cargo xtask
/// mcu-pretrain` writes it) into the plan's parameter image (header and body; weights quantised under
/// [`ParamEncoding::Int8`], rounded to fp16 under [`ParamEncoding::F16`], saturating at ±65504) and the
/// rest of the state in the same order, which
/// [`Executor::write_state`](crate::exec::Executor::write_state) loads into the arena. A plan without a
/// parameter space gives an empty image and the whole state.
pub fn split_state(plan: &Plan, state: &[u8]) -> Result<(Vec<u8>, Vec<u8>), ParamsError> {
    let g = &plan.graph;
    let enc = plan.params_space();
    let mut image = match enc {
        Some((_, bytes)) => vec![0u8; IMAGE_HEADER + bytes],
        None => Vec::new(),
    };
    let mut rest = Vec::with_capacity(state.len());
    let mut at = 0usize;
    let ids = g.nodes.iter().flat_map(|n| {
        n.params
            .iter()
            .map(|p| p.value)
            .chain(n.stats.iter().copied())
    });
    for t in ids {
        let bytes = g.tensors[t as usize].bytes;
        let src = state.get(at..at + bytes).ok_or(ParamsError::TooShort {
            needed: at + bytes,
            given: state.len(),
        })?;
        at += bytes;
        let s = plan.storage_at(t, 0);
        let space = s.map(|s| plan.lives[s].space);
        let (Some(s), Some(e)) = (s, space.and_then(ParamEncoding::of_space)) else {
            rest.extend_from_slice(src);
            continue;
        };
        let off = IMAGE_HEADER + plan.offsets[s];
        let len = plan.lives[s].bytes;
        let dst = image.get_mut(off..off + len).ok_or(ParamsError::Mismatch(
            "a storage outside the parameter space",
        ))?;
        match (e, weight_rows(g, t)) {
            (ParamEncoding::Int8, Some(rows)) => {
                let w: Vec<f32> = src
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                let mut q = vec![0i8; w.len()];
                let mut scales = vec![0f32; rows];
                if !quantize_rows(&w, rows, &mut q, &mut scales) {
                    return Err(ParamsError::Mismatch("a weight is not whole rows"));
                }
                let (sd, qd) = dst.split_at_mut(rows * 4);
                for (d, v) in sd.chunks_exact_mut(4).zip(&scales) {
                    d.copy_from_slice(&v.to_le_bytes());
                }
                for (d, v) in qd.iter_mut().zip(&q) {
                    *d = *v as u8;
                }
            }
            (ParamEncoding::F16, Some(_)) => {
                for (d, c) in dst.chunks_exact_mut(2).zip(src.chunks_exact(4)) {
                    d.copy_from_slice(
                        &f16_bits(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes(),
                    );
                }
            }
            _ => dst[..src.len()].copy_from_slice(src),
        }
    }
    if at != state.len() {
        return Err(ParamsError::Mismatch(
            "more state values than the plan holds",
        ));
    }
    if let Some((e, bytes)) = enc {
        image[..4].copy_from_slice(&IMAGE_MAGIC);
        image[4] = e.code();
        image[8..16].copy_from_slice(&(bytes as u64).to_le_bytes());
        image[16..24].copy_from_slice(&plan.params_fingerprint().to_le_bytes());
    }
    Ok((image, rest))
}

/// `v` rounded to the nearest fp16 (ties to even), saturating at ±65504 instead of overflowing to an
/// infinity (a weight that large is out of fp16's range, not infinite); a NaN stays a NaN.
pub fn f16_bits(v: f32) -> u16 {
    let max = half::f16::MAX.to_f32();
    let v = if v.is_nan() { v } else { v.clamp(-max, max) };
    half::f16::from_f32(v).to_bits()
}

/// A read-only parameter as an instruction reads it from the image's body.
#[derive(Clone, Copy, Debug)]
pub enum ReadOnly<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// An int8 weight: per-row scales and values (dequantised by [`crate::kernels::rows`]).
    I8 {
        /// One scale per output channel.
        scales: &'a [f32],
        /// The values, row after row.
        q: &'a [i8],
    },
    /// An fp16 weight: the values' bits (converted by [`f16_to_f32`]).
    F16(&'a [u16]),
}

/// Converts an fp16 weight's `bits` into `out` (as long as `bits`).
pub fn f16_to_f32(bits: &[u16], out: &mut [f32]) {
    for (o, &h) in out.iter_mut().zip(bits) {
        *o = half::f16::from_bits(h).to_f32();
    }
}

/// Tensor `t` of `plan` read from the parameter image's `body` (None: it is not in a parameter
/// space). `Err` when the body is too short or misaligned for it.
pub fn read_only<'a>(
    plan: &Plan,
    body: &'a [u8],
    t: TensorId,
) -> Result<Option<ReadOnly<'a>>, ParamsError> {
    let Some(s) = plan.storage_at(t, 0) else {
        return Ok(None);
    };
    let Some(enc) = ParamEncoding::of_space(plan.lives[s].space) else {
        return Ok(None);
    };
    let off = plan.offsets[s];
    let bytes = plan.graph.tensors[t as usize].bytes;
    let short = ParamsError::TooShort {
        needed: off + plan.lives[s].bytes,
        given: body.len(),
    };
    let f32s = |b: &'a [u8]| -> Result<&'a [f32], ParamsError> {
        if b.is_empty() {
            return Ok(&[]);
        }
        bytemuck::try_cast_slice(b).map_err(|_| ParamsError::Misaligned)
    };
    match (enc, weight_rows(&plan.graph, t)) {
        (ParamEncoding::Int8, Some(rows)) => {
            let scales = body.get(off..off + rows * 4).ok_or(short)?;
            let q = body
                .get(off + rows * 4..off + rows * 4 + bytes / 4)
                .ok_or(short)?;
            Ok(Some(ReadOnly::I8 {
                scales: f32s(scales)?,
                q: bytemuck::cast_slice(q),
            }))
        }
        (ParamEncoding::F16, Some(_)) => {
            let b = body.get(off..off + bytes / 2).ok_or(short)?;
            Ok(Some(ReadOnly::F16(if b.is_empty() {
                &[]
            } else {
                bytemuck::try_cast_slice(b).map_err(|_| ParamsError::Misaligned)?
            })))
        }
        _ => Ok(Some(ReadOnly::F32(f32s(
            body.get(off..off + bytes).ok_or(short)?,
        )?))),
    }
}
