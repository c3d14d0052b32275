//! frugal's binary encodings. A `ModelSpec` file is
//! `b"FRGM" | version: u16 | reserved: u16 | payload_len: u32 | payload | crc32(payload): u32`, all
//! little-endian. Decoding never trusts a length or an index: every read is bounds-checked and every
//! failure is a [`FormatError`] naming the field and the byte offset.
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use crate::model::{Dims, LayerKind, LayerSpec, LossKind, ModelSpec, OptimizerSpec, Src, Update};

pub mod plan;
pub mod tensor;
pub use plan::{
    decode_plan, decode_plan_table, encode_plan, encode_plan_table, PlanEntry, PlanTable,
};

/// Magic of an encoded `ModelSpec`.
pub const MODEL_MAGIC: [u8; 4] = *b"FRGM";
/// Current `ModelSpec` encoding version.
pub const MODEL_VERSION: u16 = 1;
/// Most layers a decoded model may have.
pub const MAX_LAYERS: usize = 4096;
/// Longest layer name in bytes.
pub const MAX_NAME: usize = 255;

/// Why bytes could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FormatError {
    /// The file does not start with the expected magic.
    BadMagic,
    /// A version this build cannot read.
    BadVersion {
        /// Version found.
        found: u16,
        /// Newest version this build reads (every version from 1 up to it decodes).
        newest: u16,
    },
    /// The data ends before `field`.
    Truncated {
        /// Field being read.
        field: &'static str,
        /// Byte offset.
        at: usize,
    },
    /// The payload checksum does not match.
    BadChecksum {
        /// Stored checksum.
        stored: u32,
        /// Computed checksum.
        computed: u32,
    },
    /// A field holds a value that is not allowed.
    BadValue {
        /// Field.
        field: &'static str,
        /// Byte offset.
        at: usize,
        /// Why.
        reason: &'static str,
    },
    /// Bytes remain after the last field.
    TrailingBytes {
        /// Offset of the first extra byte.
        at: usize,
    },
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatError::BadMagic => write!(
                f,
                "not a frugal model: the file does not start with \"FRGM\""
            ),
            FormatError::BadVersion { found, newest } => {
                write!(f, "encoding version {found} is not supported (this build reads versions 1 to {newest})")
            }
            FormatError::Truncated { field, at } => {
                write!(f, "truncated at byte {at} while reading {field}")
            }
            FormatError::BadChecksum { stored, computed } => {
                write!(f, "checksum mismatch: stored {stored:#010x}, computed {computed:#010x} (the file is corrupt)")
            }
            FormatError::BadValue { field, at, reason } => {
                write!(f, "bad {field} at byte {at}: {reason}")
            }
            FormatError::TrailingBytes { at } => write!(
                f,
                "unexpected bytes after the end of the model at byte {at}"
            ),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for FormatError {}

/// CRC-32 (IEEE 802.3, reflected, as zlib), bitwise: small and fast enough for model and plan files.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Bounds-checked little-endian reader.
pub struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    base: usize,
}

impl<'a> Reader<'a> {
    /// Reads `data`, reporting offsets relative to `base`.
    pub fn new(data: &'a [u8], base: usize) -> Self {
        Self { data, pos: 0, base }
    }
    /// Current absolute offset.
    pub fn at(&self) -> usize {
        self.base + self.pos
    }
    /// Next `n` bytes.
    pub fn bytes(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], FormatError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or(FormatError::Truncated {
                field,
                at: self.at(),
            })?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    /// u8.
    pub fn u8(&mut self, field: &'static str) -> Result<u8, FormatError> {
        Ok(self.bytes(1, field)?[0])
    }
    /// u16.
    pub fn u16(&mut self, field: &'static str) -> Result<u16, FormatError> {
        let b = self.bytes(2, field)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    /// u32.
    pub fn u32(&mut self, field: &'static str) -> Result<u32, FormatError> {
        let b = self.bytes(4, field)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// u64.
    pub fn u64(&mut self, field: &'static str) -> Result<u64, FormatError> {
        let lo = self.u32(field)? as u64;
        let hi = self.u32(field)? as u64;
        Ok(lo | hi << 32)
    }
    /// A finite f32.
    pub fn f32(&mut self, field: &'static str) -> Result<f32, FormatError> {
        let at = self.at();
        let v = f32::from_bits(self.u32(field)?);
        if v.is_finite() {
            Ok(v)
        } else {
            Err(FormatError::BadValue {
                field,
                at,
                reason: "not a finite number",
            })
        }
    }
    /// Whether all bytes were read.
    pub fn finish(&self) -> Result<(), FormatError> {
        if self.pos == self.data.len() {
            Ok(())
        } else {
            Err(FormatError::TrailingBytes { at: self.at() })
        }
    }
}

struct Writer(Vec<u8>);
impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v)
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes())
    }
    fn f32(&mut self, v: f32) {
        self.u32(v.to_bits())
    }
    fn pair(&mut self, p: [u32; 2]) {
        self.u32(p[0]);
        self.u32(p[1]);
    }
}

/// Wraps `payload` in a header and checksum.
pub fn frame(magic: [u8; 4], version: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 16);
    out.extend_from_slice(&magic);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(&crc32(payload).to_le_bytes());
    out
}

/// Checks header and checksum; returns the version and the payload.
pub fn unframe(magic: [u8; 4], max_version: u16, data: &[u8]) -> Result<(u16, &[u8]), FormatError> {
    let mut r = Reader::new(data, 0);
    if r.bytes(4, "magic").map_err(|_| FormatError::BadMagic)? != magic {
        return Err(FormatError::BadMagic);
    }
    let version = r.u16("version")?;
    if version == 0 || version > max_version {
        return Err(FormatError::BadVersion {
            found: version,
            newest: max_version,
        });
    }
    let _reserved = r.u16("reserved")?;
    let len = r.u32("payload length")? as usize;
    let payload = r.bytes(len, "payload")?;
    let stored = r.u32("checksum")?;
    r.finish()?;
    let computed = crc32(payload);
    if stored != computed {
        return Err(FormatError::BadChecksum { stored, computed });
    }
    Ok((version, payload))
}

fn src_code(s: Src) -> u32 {
    match s {
        Src::Input => u32::MAX,
        Src::Layer(i) => i,
    }
}

/// Encodes a model.
pub fn encode_model(m: &ModelSpec) -> Vec<u8> {
    let mut w = Writer(Vec::new());
    w.u32(m.input.c);
    w.u32(m.input.h);
    w.u32(m.input.w);
    w.u64(m.seed);
    w.u8(match m.loss {
        LossKind::Mse => 0,
        LossKind::SoftmaxCrossEntropy => 1,
    });
    match m.optimizer {
        OptimizerSpec::Sgd {
            lr,
            momentum,
            weight_decay,
        } => {
            w.u8(0);
            w.f32(lr);
            w.f32(momentum);
            w.f32(weight_decay);
        }
        OptimizerSpec::Adam {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } => {
            w.u8(1);
            for v in [lr, beta1, beta2, eps, weight_decay] {
                w.f32(v);
            }
        }
        OptimizerSpec::AdamW {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } => {
            w.u8(2);
            for v in [lr, beta1, beta2, eps, weight_decay] {
                w.f32(v);
            }
        }
    }
    w.u32(m.layers.len() as u32);
    for l in &m.layers {
        let name = l.name.as_bytes();
        let name = &name[..name.len().min(MAX_NAME)];
        w.u8(name.len() as u8);
        w.0.extend_from_slice(name);
        // The training byte: 0 frozen, 1 every parameter, 2 biases only, 3 a channel fraction (an f32
        // follows). Files without a sparse update hold only 0 and 1, as before it existed.
        match (l.trainable, l.update) {
            (false, _) => w.u8(0),
            (true, Update::All) => w.u8(1),
            (true, Update::Bias) => w.u8(2),
            (true, Update::Channels(f)) => {
                w.u8(3);
                w.f32(f);
            }
        }
        w.u8(l.inputs.len() as u8);
        for &s in &l.inputs {
            w.u32(src_code(s));
        }
        match &l.kind {
            LayerKind::Linear { out, bias } => {
                w.u8(0);
                w.u32(*out);
                w.u8(*bias as u8);
            }
            LayerKind::Conv2d {
                out,
                kernel,
                stride,
                padding,
                groups,
                bias,
            } => {
                w.u8(1);
                w.u32(*out);
                w.pair(*kernel);
                w.pair(*stride);
                w.pair(*padding);
                w.u32(*groups);
                w.u8(*bias as u8);
            }
            LayerKind::MaxPool2d { kernel, stride } => {
                w.u8(2);
                w.pair(*kernel);
                w.pair(*stride);
            }
            LayerKind::AvgPool2d { kernel, stride } => {
                w.u8(3);
                w.pair(*kernel);
                w.pair(*stride);
            }
            LayerKind::GlobalAvgPool => w.u8(4),
            LayerKind::Relu => w.u8(5),
            LayerKind::Relu6 => w.u8(6),
            LayerKind::Sigmoid => w.u8(7),
            LayerKind::Tanh => w.u8(8),
            LayerKind::Flatten => w.u8(9),
            LayerKind::Reshape { to } => {
                w.u8(10);
                w.u32(to.c);
                w.u32(to.h);
                w.u32(to.w);
            }
            LayerKind::Add => w.u8(11),
            LayerKind::BatchNorm2d { eps, momentum } => {
                w.u8(12);
                w.f32(*eps);
                w.f32(*momentum);
            }
            LayerKind::Dropout { p } => {
                w.u8(13);
                w.f32(*p);
            }
            LayerKind::Embedding { vocab, dim } => {
                w.u8(14);
                w.u32(*vocab);
                w.u32(*dim);
            }
            LayerKind::PosEmbedding => w.u8(15),
            LayerKind::LayerNorm { eps } => {
                w.u8(16);
                w.f32(*eps);
            }
            LayerKind::RmsNorm { eps } => {
                w.u8(17);
                w.f32(*eps);
            }
            LayerKind::Gelu => w.u8(18),
            LayerKind::Silu => w.u8(19),
            LayerKind::Attention { heads } => {
                w.u8(20);
                w.u32(*heads);
            }
            LayerKind::LoraLinear {
                out,
                bias,
                rank,
                alpha,
            } => {
                w.u8(21);
                w.u32(*out);
                w.u8(*bias as u8);
                w.u32(*rank);
                w.f32(*alpha);
            }
            LayerKind::Lstm { hidden } => {
                w.u8(22);
                w.u32(*hidden);
            }
            LayerKind::Gru { hidden } => {
                w.u8(23);
                w.u32(*hidden);
            }
        }
    }
    frame(MODEL_MAGIC, MODEL_VERSION, &w.0)
}

fn pair(r: &mut Reader<'_>, field: &'static str) -> Result<[u32; 2], FormatError> {
    Ok([r.u32(field)?, r.u32(field)?])
}

fn flag(r: &mut Reader<'_>, field: &'static str) -> Result<bool, FormatError> {
    let at = r.at();
    match r.u8(field)? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(FormatError::BadValue {
            field,
            at,
            reason: "must be 0 or 1",
        }),
    }
}

/// Decodes a model. Shape consistency is checked later by [`crate::graph::Graph::new`], which names the
/// layer; this checks the encoding itself.
pub fn decode_model(data: &[u8]) -> Result<ModelSpec, FormatError> {
    let (_version, payload) = unframe(MODEL_MAGIC, MODEL_VERSION, data)?;
    let mut r = Reader::new(payload, 12);
    let input = Dims::new(r.u32("input.c")?, r.u32("input.h")?, r.u32("input.w")?);
    let seed = r.u64("seed")?;
    let at = r.at();
    let loss = match r.u8("loss")? {
        0 => LossKind::Mse,
        1 => LossKind::SoftmaxCrossEntropy,
        _ => {
            return Err(FormatError::BadValue {
                field: "loss",
                at,
                reason: "unknown loss kind",
            })
        }
    };
    let at = r.at();
    let optimizer = match r.u8("optimizer")? {
        0 => OptimizerSpec::Sgd {
            lr: r.f32("sgd.lr")?,
            momentum: r.f32("sgd.momentum")?,
            weight_decay: r.f32("sgd.weight_decay")?,
        },
        1 => OptimizerSpec::Adam {
            lr: r.f32("adam.lr")?,
            beta1: r.f32("adam.beta1")?,
            beta2: r.f32("adam.beta2")?,
            eps: r.f32("adam.eps")?,
            weight_decay: r.f32("adam.weight_decay")?,
        },
        2 => OptimizerSpec::AdamW {
            lr: r.f32("adamw.lr")?,
            beta1: r.f32("adamw.beta1")?,
            beta2: r.f32("adamw.beta2")?,
            eps: r.f32("adamw.eps")?,
            weight_decay: r.f32("adamw.weight_decay")?,
        },
        _ => {
            return Err(FormatError::BadValue {
                field: "optimizer",
                at,
                reason: "unknown optimizer kind",
            })
        }
    };
    let at = r.at();
    let n = r.u32("layer count")? as usize;
    if n > MAX_LAYERS {
        return Err(FormatError::BadValue {
            field: "layer count",
            at,
            reason: "more than 4096 layers",
        });
    }
    let mut layers = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        let at = r.at();
        let len = r.u8("layer name length")? as usize;
        let name = core::str::from_utf8(r.bytes(len, "layer name")?).map_err(|_| {
            FormatError::BadValue {
                field: "layer name",
                at,
                reason: "not UTF-8",
            }
        })?;
        let at = r.at();
        let (trainable, update) = match r.u8("trainable")? {
            0 => (false, Update::All),
            1 => (true, Update::All),
            2 => (true, Update::Bias),
            3 => {
                let at = r.at();
                let f = r.f32("update.channels")?;
                if !Update::Channels(f).valid() {
                    return Err(FormatError::BadValue {
                        field: "update.channels",
                        at,
                        reason: "the channel fraction must be in (0, 1]",
                    });
                }
                (true, Update::Channels(f))
            }
            _ => {
                return Err(FormatError::BadValue {
                    field: "trainable",
                    at,
                    reason: "must be 0 (frozen), 1 (all), 2 (bias) or 3 (channels)",
                })
            }
        };
        let at = r.at();
        let ni = r.u8("input count")? as usize;
        if ni > 2 {
            return Err(FormatError::BadValue {
                field: "input count",
                at,
                reason: "a layer has at most 2 inputs",
            });
        }
        let mut inputs = Vec::with_capacity(ni);
        for _ in 0..ni {
            inputs.push(match r.u32("input")? {
                u32::MAX => Src::Input,
                i => Src::Layer(i),
            });
        }
        let at = r.at();
        let kind = match r.u8("layer kind")? {
            0 => LayerKind::Linear {
                out: r.u32("linear.out")?,
                bias: flag(&mut r, "linear.bias")?,
            },
            1 => LayerKind::Conv2d {
                out: r.u32("conv2d.out")?,
                kernel: pair(&mut r, "conv2d.kernel")?,
                stride: pair(&mut r, "conv2d.stride")?,
                padding: pair(&mut r, "conv2d.padding")?,
                groups: r.u32("conv2d.groups")?,
                bias: flag(&mut r, "conv2d.bias")?,
            },
            2 => LayerKind::MaxPool2d {
                kernel: pair(&mut r, "maxpool2d.kernel")?,
                stride: pair(&mut r, "maxpool2d.stride")?,
            },
            3 => LayerKind::AvgPool2d {
                kernel: pair(&mut r, "avgpool2d.kernel")?,
                stride: pair(&mut r, "avgpool2d.stride")?,
            },
            4 => LayerKind::GlobalAvgPool,
            5 => LayerKind::Relu,
            6 => LayerKind::Relu6,
            7 => LayerKind::Sigmoid,
            8 => LayerKind::Tanh,
            9 => LayerKind::Flatten,
            10 => LayerKind::Reshape {
                to: Dims::new(
                    r.u32("reshape.c")?,
                    r.u32("reshape.h")?,
                    r.u32("reshape.w")?,
                ),
            },
            11 => LayerKind::Add,
            12 => LayerKind::BatchNorm2d {
                eps: r.f32("batchnorm2d.eps")?,
                momentum: r.f32("batchnorm2d.momentum")?,
            },
            13 => LayerKind::Dropout {
                p: r.f32("dropout.p")?,
            },
            14 => LayerKind::Embedding {
                vocab: r.u32("embedding.vocab")?,
                dim: r.u32("embedding.dim")?,
            },
            15 => LayerKind::PosEmbedding,
            16 => LayerKind::LayerNorm {
                eps: r.f32("layernorm.eps")?,
            },
            17 => LayerKind::RmsNorm {
                eps: r.f32("rmsnorm.eps")?,
            },
            18 => LayerKind::Gelu,
            19 => LayerKind::Silu,
            20 => LayerKind::Attention {
                heads: r.u32("attention.heads")?,
            },
            21 => LayerKind::LoraLinear {
                out: r.u32("lora_linear.out")?,
                bias: flag(&mut r, "lora_linear.bias")?,
                rank: r.u32("lora_linear.rank")?,
                alpha: r.f32("lora_linear.alpha")?,
            },
            22 => LayerKind::Lstm {
                hidden: r.u32("lstm.hidden")?,
            },
            23 => LayerKind::Gru {
                hidden: r.u32("gru.hidden")?,
            },
            _ => {
                return Err(FormatError::BadValue {
                    field: "layer kind",
                    at,
                    reason: "unknown layer kind",
                })
            }
        };
        layers.push(LayerSpec {
            name: String::from(name),
            kind,
            inputs,
            trainable,
            update,
        });
    }
    r.finish()?;
    Ok(ModelSpec {
        input,
        layers,
        loss,
        optimizer,
        seed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use proptest::prelude::*;

    /// Found by `cargo xtask fuzz` (target `model`): an input of u32::MAX³ elements decodes (the
    /// encoding allows it) and must then be refused when realised, not overflow `Dims::numel`.
    #[test]
    fn decoded_model_with_an_overflowing_input_shape_is_a_typed_graph_error() {
        let mut m = sample();
        m.input = Dims::new(u32::MAX, u32::MAX, u32::MAX);
        let d = decode_model(&encode_model(&m)).unwrap();
        assert_eq!(d.input.numel(), usize::MAX);
        assert!(crate::graph::Graph::new(&d, 1).is_err());
    }

    /// Found by `cargo xtask fuzz` (targets `model`, `plan_table`): a linear layer whose weight has
    /// more elements than the address space (2^48 inputs × u32::MAX outputs) is refused as TooLarge,
    /// not an overflowing product.
    #[test]
    fn decoded_model_with_an_overflowing_weight_is_a_typed_graph_error() {
        let m = ModelSpec {
            input: Dims::new(1 << 16, 1 << 16, 1 << 16),
            layers: vec![LayerSpec {
                name: "fc".into(),
                kind: LayerKind::Linear {
                    out: u32::MAX,
                    bias: true,
                },
                inputs: vec![Src::Input],
                trainable: true,
                update: crate::model::Update::All,
            }],
            ..sample()
        };
        let d = decode_model(&encode_model(&m)).unwrap();
        let e = crate::graph::Graph::new(&d, 1).unwrap_err();
        assert!(
            matches!(&e, crate::graph::GraphError::TooLarge { tensor } if tensor == "fc.weight"),
            "{e:?}"
        );
    }

    /// A sparse update (frozen, biases only, a channel fraction) survives the encoding; a fraction
    /// outside (0, 1] and an unknown training byte are typed errors.
    #[test]
    fn sparse_updates_round_trip_and_bad_ones_are_refused() {
        let mut m = sample();
        m.layers[0].update = Update::Channels(0.5);
        m.layers[1].update = Update::Bias;
        m.layers[3].update = Update::Bias; // frozen: not encoded
        let bytes = encode_model(&m);
        let d = decode_model(&bytes).unwrap();
        assert_eq!(d.layers[0].update, Update::Channels(0.5));
        assert_eq!(d.layers[1].update, Update::Bias);
        assert_eq!(d.layers[3].update, Update::All);
        assert!(!d.layers[3].trainable);
        assert_eq!(d.layers[4].update, Update::All);
        // A fraction of 2.0 written in place of 0.5, the checksum repaired.
        let f = 0.5f32.to_le_bytes();
        let at = (12..bytes.len() - 4)
            .find(|&i| bytes[i] == 3 && bytes[i + 1..i + 5] == f)
            .unwrap();
        let repair = |mut b: Vec<u8>| {
            let n = b.len();
            let crc = crate::format::crc32(&b[12..n - 4]);
            b[n - 4..].copy_from_slice(&crc.to_le_bytes());
            b
        };
        let mut b = bytes.clone();
        b[at + 1..at + 5].copy_from_slice(&2.0f32.to_le_bytes());
        let e = decode_model(&repair(b)).unwrap_err();
        assert!(
            matches!(
                e,
                FormatError::BadValue {
                    field: "update.channels",
                    ..
                }
            ),
            "{e:?}"
        );
        let mut b = bytes.clone();
        b[at] = 4;
        let e = decode_model(&repair(b)).unwrap_err();
        assert!(
            matches!(
                e,
                FormatError::BadValue {
                    field: "trainable",
                    ..
                }
            ),
            "{e:?}"
        );
    }

    fn sample() -> ModelSpec {
        ModelSpec {
            input: Dims::new(1, 8, 8),
            layers: vec![
                LayerSpec {
                    name: "conv1".into(),
                    kind: LayerKind::Conv2d {
                        out: 4,
                        kernel: [3, 3],
                        stride: [1, 1],
                        padding: [1, 1],
                        groups: 1,
                        bias: true,
                    },
                    inputs: vec![Src::Input],
                    trainable: true,
                    update: crate::model::Update::All,
                },
                LayerSpec {
                    name: "bn".into(),
                    kind: LayerKind::BatchNorm2d {
                        eps: 1e-5,
                        momentum: 0.1,
                    },
                    inputs: vec![Src::Layer(0)],
                    trainable: true,
                    update: crate::model::Update::All,
                },
                LayerSpec {
                    name: "add".into(),
                    kind: LayerKind::Add,
                    inputs: vec![Src::Layer(0), Src::Layer(1)],
                    trainable: true,
                    update: crate::model::Update::All,
                },
                LayerSpec {
                    name: "flat".into(),
                    kind: LayerKind::Flatten,
                    inputs: vec![Src::Layer(2)],
                    trainable: false,
                    update: crate::model::Update::All,
                },
                LayerSpec {
                    name: "fc".into(),
                    kind: LayerKind::Linear {
                        out: 10,
                        bias: false,
                    },
                    inputs: vec![Src::Layer(3)],
                    trainable: true,
                    update: crate::model::Update::All,
                },
            ],
            loss: LossKind::SoftmaxCrossEntropy,
            optimizer: OptimizerSpec::Adam {
                lr: 1e-3,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.0,
            },
            seed: 42,
        }
    }

    #[test]
    fn crc32_matches_zlib() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn model_round_trips() {
        let m = sample();
        assert_eq!(decode_model(&encode_model(&m)).unwrap(), m);
    }

    /// LSTM and GRU layers round-trip, encoded as kind 22 / 23 (after the other layers' codes)
    /// followed by the hidden width.
    #[cfg(feature = "seq")]
    #[test]
    fn recurrent_models_round_trip() {
        for gru in [false, true] {
            let m = crate::exec::rnn_tests::rnn_lm(gru, 11, 6, 6, 5, 2);
            let b = encode_model(&m);
            assert_eq!(decode_model(&b).unwrap(), m);
            let code = if gru { 23 } else { 22 };
            assert!(b.windows(5).any(|w| w == [code, 5, 0, 0, 0]));
        }
    }

    #[test]
    fn corrupt_payload_is_a_checksum_error() {
        let mut b = encode_model(&sample());
        b[20] ^= 0x40;
        assert!(matches!(
            decode_model(&b),
            Err(FormatError::BadChecksum { .. })
        ));
    }

    #[test]
    fn truncation_names_the_field() {
        let b = encode_model(&sample());
        let e = decode_model(&b[..b.len() - 9]).unwrap_err();
        assert!(matches!(e, FormatError::Truncated { .. }), "{e}");
        assert_eq!(decode_model(b"FRGX"), Err(FormatError::BadMagic));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
        /// Fuzz: arbitrary bytes never panic.
        #[test]
        fn decode_never_panics_on_random_bytes(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_model(&data);
        }

        /// Fuzz: mutations of a valid file (with a recomputed checksum, so the payload parser is reached)
        /// never panic.
        #[test]
        fn decode_never_panics_on_mutated_payload(pos in 0usize..200, val in any::<u8>(), cut in 0usize..200) {
            let b = encode_model(&sample());
            let (_, payload) = unframe(MODEL_MAGIC, MODEL_VERSION, &b).unwrap();
            let mut p = payload.to_vec();
            let i = pos % p.len();
            p[i] = val;
            p.truncate(p.len() - cut % p.len());
            let framed = frame(MODEL_MAGIC, MODEL_VERSION, &p);
            let _ = decode_model(&framed);
        }
    }
}
