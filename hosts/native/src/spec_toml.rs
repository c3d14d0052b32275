//! The TOML model description (`docs/model-format.md`) → [`ModelSpec`] + [`TrainConfig`].
//!
//! Two steps. serde deserialises the document into typed structs (`Raw*` below: `deny_unknown_fields`,
//! every value that a later check needs to point at kept as a [`Spanned`]), which settles the shape:
//! unknown keys, missing keys, TOML types. Code over those structs then does what a schema cannot:
//! keys that depend on a layer's or the optimizer's `type`, ranges, names and references between
//! layers. Every error carries a line and column and names the field (`layers[3] ("conv2").kernel`);
//! the field is found from the error's position in toml's spanned document tree ([`Doc::field_at`]).
use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use frugal_core::graph::Graph;
use frugal_core::model::{
    Dims, LayerKind, LayerSpec, LossKind, ModelSpec, OptimizerSpec, Src, Update,
};
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// A parsed model file: the network and how the CLI trains it.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelFile {
    /// The network, loss, optimizer and seed.
    pub spec: ModelSpec,
    /// The `[train]` section (all fields absent when there is none).
    pub train: TrainConfig,
    /// The `[lora]` section, when the model fine-tunes LoRA adapters (already applied to `spec`: the
    /// targeted Linear layers are LoRA Linears, every other layer frozen).
    pub lora: Option<LoraConfig>,
}

/// The `[lora]` section: which Linear layers get adapters, of which rank and scale.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraConfig {
    /// Adapter rank.
    pub rank: u32,
    /// Scale numerator (`alpha / rank`).
    pub alpha: f32,
    /// Layer names or name suffixes (`"qkv"` matches `h0.qkv`), as PEFT's `target_modules`.
    pub targets: Vec<String>,
}

/// The `[train]` section: CLI-only training settings. Absent values are for the CLI to default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrainConfig {
    /// Samples per step.
    pub batch: Option<u32>,
    /// Passes over the training set.
    pub epochs: Option<u32>,
    /// Where the training data comes from.
    pub dataset: Option<DatasetSource>,
    /// A safetensors file loaded before training. [`load_model`] makes a relative path relative to
    /// the model file's directory.
    pub weights: Option<PathBuf>,
}

/// The `dataset` value of `[train]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DatasetSource {
    /// `"digits"`: the bundled UCI digits ([`crate::data::digits`]).
    Digits,
    /// `{ idx_images = "…", idx_labels = "…" }`: MNIST-style IDX files (pixels scaled by 1/255).
    Idx {
        /// The image file.
        images: PathBuf,
        /// The label file.
        labels: PathBuf,
    },
    /// `{ text = "…" }`: a text file, tokenised into bytes ([`crate::text`]); a sample is a window of
    /// the model input's length, its labels the next bytes.
    Text {
        /// The file.
        path: PathBuf,
    },
    /// `{ csv = "…", label_column = 0 }`: a numeric CSV file ([`crate::data::load_csv`]).
    Csv {
        /// The file.
        path: PathBuf,
        /// 0-based column holding the class index (default 0).
        label_column: usize,
    },
}

/// A model-file error: where (file, line, column, field) and why.
#[derive(Debug)]
pub struct SpecError {
    /// The model file, when read from disk ([`load_model`]).
    pub file: Option<PathBuf>,
    /// 1-based line of the offending key or value.
    pub line: Option<u32>,
    /// 1-based column (in characters).
    pub column: Option<u32>,
    /// The field, e.g. `optimizer.lr` or `layers[3] ("conv2").kernel`; empty for the whole file.
    pub field: String,
    /// What is wrong.
    pub kind: SpecErrorKind,
}

/// What is wrong in a model file.
#[derive(Debug)]
#[non_exhaustive]
pub enum SpecErrorKind {
    /// The file could not be read.
    Io(io::Error),
    /// Not valid TOML.
    Syntax(String),
    /// A key that this table (or this layer type) does not take.
    UnknownKey {
        /// The key as written.
        key: String,
        /// The keys that are allowed here.
        allowed: &'static [&'static str],
    },
    /// A required key is absent.
    Missing(String),
    /// A value of the wrong TOML type, in serde's words (`invalid type: string "8", expected an
    /// integer`).
    WrongType(String),
    /// An unknown name for an enumerated value (layer type, loss, optimizer, dataset).
    UnknownValue {
        /// The value as written.
        value: String,
        /// The accepted values.
        known: &'static [&'static str],
    },
    /// A number outside its valid range.
    OutOfRange {
        /// The value as written.
        value: String,
        /// The constraint, e.g. `"≥ 1"`, `"in [0, 1)"`.
        must_be: &'static str,
    },
    /// Two layers have the same name.
    DuplicateName {
        /// The name.
        name: String,
        /// Index of the earlier layer with that name.
        first: usize,
    },
    /// An `inputs` entry that names no layer.
    UnknownInput(String),
    /// An `inputs` entry naming this layer or a later one (the layer list is a DAG in list order).
    LaterInput {
        /// The name.
        name: String,
        /// That layer's index.
        index: usize,
    },
    /// Wrong number of inputs for the layer type.
    InputCount {
        /// Inputs the type takes.
        expected: usize,
        /// Inputs given.
        found: usize,
    },
    /// Anything else; the text says what.
    Invalid(String),
}

impl fmt::Display for SpecErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpecErrorKind::Io(e) => write!(f, "{e}"),
            SpecErrorKind::Syntax(m) => write!(f, "TOML syntax error: {m}"),
            SpecErrorKind::UnknownKey { key, allowed } => {
                write!(f, "unknown key \"{key}\" (allowed: {})", allowed.join(", "))
            }
            SpecErrorKind::Missing(key) => write!(f, "missing key \"{key}\""),
            SpecErrorKind::WrongType(m) | SpecErrorKind::Invalid(m) => f.write_str(m),
            SpecErrorKind::UnknownValue { value, known } => {
                write!(f, "unknown value \"{value}\" (known: {})", known.join(", "))
            }
            SpecErrorKind::OutOfRange { value, must_be } => {
                write!(f, "must be {must_be}, got {value}")
            }
            SpecErrorKind::DuplicateName { name, first } => {
                write!(
                    f,
                    "duplicate layer name \"{name}\" (already used by layers[{first}])"
                )
            }
            SpecErrorKind::UnknownInput(name) => {
                write!(
                    f,
                    "input \"{name}\" is neither \"input\" nor the name of a layer"
                )
            }
            SpecErrorKind::LaterInput { name, index } => write!(
                f,
                "input \"{name}\" is layers[{index}], which does not come before this layer \
                 (inputs must name earlier layers)"
            ),
            SpecErrorKind::InputCount { expected, found } => {
                write!(f, "takes exactly {expected} input(s), got {found}")
            }
        }
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}:", file.display())?;
            if let Some(line) = self.line {
                write!(f, "{line}:")?;
                if let Some(col) = self.column {
                    write!(f, "{col}:")?;
                }
            }
            f.write_str(" ")?;
        } else if let Some(line) = self.line {
            write!(f, "line {line}")?;
            if let Some(col) = self.column {
                write!(f, ", column {col}")?;
            }
            f.write_str(": ")?;
        }
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        write!(f, "{}", self.kind)
    }
}

impl std::error::Error for SpecError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            SpecErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// Reads and parses a model file. Errors carry the file name; relative `dataset` and `weights`
/// paths are resolved against the model file's directory.
pub fn load_model(path: &Path) -> Result<ModelFile, SpecError> {
    let text = std::fs::read_to_string(path).map_err(|e| SpecError {
        file: Some(path.to_path_buf()),
        line: None,
        column: None,
        field: String::new(),
        kind: SpecErrorKind::Io(e),
    })?;
    let mut model = parse_model(&text).map_err(|mut e| {
        e.file = Some(path.to_path_buf());
        e
    })?;
    let base = path.parent().unwrap_or(Path::new(""));
    let resolve = |p: &mut PathBuf| {
        if p.is_relative() {
            *p = base.join(&*p);
        }
    };
    if let Some(w) = &mut model.train.weights {
        resolve(w);
    }
    match &mut model.train.dataset {
        Some(DatasetSource::Idx { images, labels }) => {
            resolve(images);
            resolve(labels);
        }
        Some(DatasetSource::Csv { path, .. }) | Some(DatasetSource::Text { path }) => resolve(path),
        Some(DatasetSource::Digits) | None => {}
    }
    Ok(model)
}

/// Parses a model description. Paths in `[train]` are returned as written. Never panics.
pub fn parse_model(text: &str) -> Result<ModelFile, SpecError> {
    let doc = DeTable::parse(text).map_err(|e| {
        let (line, column) = e.span().map_or((None, None), |s| {
            let (l, c) = pos(text, s.start);
            (Some(l), Some(c))
        });
        SpecError {
            file: None,
            line,
            column,
            field: String::new(),
            kind: SpecErrorKind::Syntax(e.message().to_string()),
        }
    })?;
    let cx = Doc { text, doc: &doc };
    let raw = RawFile::deserialize(toml::de::Deserializer::from(doc.clone()))
        .map_err(|e| cx.serde_error(&e))?;

    let Some(model) = raw.model else {
        return Err(cx.err_in(0..0, "", missing_section("model")));
    };
    let Some(optimizer) = raw.optimizer else {
        return Err(cx.err_in(0..0, "", missing_section("optimizer")));
    };
    let model = model.into_inner().0;
    let input = cx.dims(&model.input)?;
    let seed = match &model.seed {
        Some(s) => cx.int(s, 0, i64::MAX as u128, "a non-negative integer")? as u64,
        None => 0,
    };
    let loss = match cx.pick(&model.loss, &["cross_entropy", "mse"])? {
        0 => LossKind::SoftmaxCrossEntropy,
        _ => LossKind::Mse,
    };
    let width = model
        .width
        .as_ref()
        .map(|w| cx.float(w, Limit::Positive).map(|_| w.get_ref().0))
        .transpose()?;
    let optimizer = cx.optimizer(&optimizer.get_ref().0)?;
    let layers = match &raw.layers {
        Some(list) => cx.layers(list, input, width)?,
        None => {
            return Err(cx.err_in(
                0..0,
                "layers",
                SpecErrorKind::Invalid("no [[layers]]: a model needs at least one layer".into()),
            ))
        }
    };
    let train = match &raw.train {
        Some(t) => cx.train(&t.get_ref().0)?,
        None => TrainConfig::default(),
    };
    let mut layers = layers;
    let lora = match &raw.lora {
        Some(l) => Some(cx.lora(l, &mut layers)?),
        None => None,
    };
    Ok(ModelFile {
        spec: ModelSpec {
            input,
            layers,
            loss,
            optimizer,
            seed,
        },
        train,
        lora,
    })
}

fn missing_section(name: &str) -> SpecErrorKind {
    SpecErrorKind::Invalid(format!("missing section [{name}]"))
}

// ---- The typed document (serde) ----

type Span = std::ops::Range<usize>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    model: Option<Spanned<Table<RawModel>>>,
    optimizer: Option<Spanned<Table<RawOptimizer>>>,
    layers: Option<Spanned<Seq<Spanned<Table<RawLayer>>, LayerList>>>,
    train: Option<Spanned<Table<RawTrain>>>,
    lora: Option<Spanned<Table<RawLora>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLora {
    rank: Spanned<Int>,
    alpha: Option<Spanned<Number>>,
    targets: Spanned<Seq<Spanned<String>, NameList>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    input: Spanned<DimsList>,
    seed: Option<Spanned<Int>>,
    loss: Spanned<String>,
    width: Option<Spanned<Number>>,
}

/// Adam and SGD in one struct; which keys each type takes is checked in code
/// ([`Doc::only_keys`]).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOptimizer {
    #[serde(rename = "type")]
    ty: Spanned<String>,
    lr: Spanned<Number>,
    beta1: Option<Spanned<Number>>,
    beta2: Option<Spanned<Number>>,
    eps: Option<Spanned<Number>>,
    momentum: Option<Spanned<Number>>,
    weight_decay: Option<Spanned<Number>>,
}

/// Every layer type's keys in one struct: an internally tagged enum would make serde buffer the
/// table, which loses toml's positions (and [`Spanned`] does not survive it). Which keys each type
/// takes is checked in code ([`layer_keys`], [`Doc::only_keys`]).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLayer {
    name: Option<Spanned<String>>,
    #[serde(rename = "type")]
    ty: Spanned<String>,
    inputs: Option<Spanned<Seq<Spanned<String>, NameList>>>,
    trainable: Option<Spanned<bool>>,
    update: Option<Spanned<RawUpdate>>,
    out: Option<Spanned<Int>>,
    kernel: Option<Spanned<Pair>>,
    stride: Option<Spanned<Pair>>,
    padding: Option<Spanned<Pair>>,
    groups: Option<Spanned<Int>>,
    bias: Option<Spanned<bool>>,
    to: Option<Spanned<DimsList>>,
    eps: Option<Spanned<Number>>,
    momentum: Option<Spanned<Number>>,
    p: Option<Spanned<Number>>,
    vocab: Option<Spanned<Int>>,
    dim: Option<Spanned<Int>>,
    heads: Option<Spanned<Int>>,
    rank: Option<Spanned<Int>>,
    alpha: Option<Spanned<Number>>,
    expand: Option<Spanned<Int>>,
    repeat: Option<Spanned<Int>>,
    scale_width: Option<Spanned<bool>>,
    hidden: Option<Spanned<Int>>,
}

/// A layer's `update` (sparse update): `"all"`, `"frozen"`, `"bias"` or `{ channels = f }`.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawUpdate {
    Name(String),
    Channels { channels: f64 },
}

/// The values `update` takes by name.
const UPDATE_NAMES: &[&str] = &["all", "frozen", "bias"];

impl RawLayer {
    /// The type-specific keys present, with their value spans.
    fn present(&self) -> [(&'static str, Option<Span>); 20] {
        fn s<T>(v: &Option<Spanned<T>>) -> Option<Span> {
            v.as_ref().map(Spanned::span)
        }
        [
            ("update", s(&self.update)),
            ("out", s(&self.out)),
            ("kernel", s(&self.kernel)),
            ("stride", s(&self.stride)),
            ("padding", s(&self.padding)),
            ("groups", s(&self.groups)),
            ("bias", s(&self.bias)),
            ("to", s(&self.to)),
            ("eps", s(&self.eps)),
            ("momentum", s(&self.momentum)),
            ("p", s(&self.p)),
            ("vocab", s(&self.vocab)),
            ("dim", s(&self.dim)),
            ("heads", s(&self.heads)),
            ("rank", s(&self.rank)),
            ("alpha", s(&self.alpha)),
            ("expand", s(&self.expand)),
            ("repeat", s(&self.repeat)),
            ("scale_width", s(&self.scale_width)),
            ("hidden", s(&self.hidden)),
        ]
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTrain {
    batch: Option<Spanned<Int>>,
    epochs: Option<Spanned<Int>>,
    dataset: Option<Spanned<RawDataset>>,
    weights: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFiles {
    csv: Option<Spanned<String>>,
    text: Option<Spanned<String>>,
    label_column: Option<Spanned<Int>>,
    idx_images: Option<Spanned<String>>,
    idx_labels: Option<Spanned<String>>,
}

/// A TOML table deserialised as `T`. A derived struct also accepts an array (its fields in order),
/// which would read `[[model]]` as a model; this takes tables only.
struct Table<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Table<T> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Table<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a table")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Table<T>, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Table)
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// The integer `visit_*` methods of a visitor, each mapping its value through `$f` (an `i128`:
/// toml hands over `i64`, beyond it `i128`/`u128`; a `u128` past `i128` saturates, which is out of
/// every range this format has).
macro_rules! visit_ints {
    ($value:ty, $f:expr) => {
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<$value, E> {
            Ok($f(i128::from(v)))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<$value, E> {
            Ok($f(i128::from(v)))
        }
        fn visit_i128<E: de::Error>(self, v: i128) -> Result<$value, E> {
            Ok($f(v))
        }
        fn visit_u128<E: de::Error>(self, v: u128) -> Result<$value, E> {
            Ok($f(i128::try_from(v).unwrap_or(i128::MAX)))
        }
    };
}

/// A scalar read by one visitor that says what it expected (`$what`) in a wrong-type message.
macro_rules! scalar {
    ($ty:ident, $what:literal; $($visits:tt)*) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = $ty;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($what)
                    }
                    $($visits)*
                }
                d.deserialize_any(V)
            }
        }
    };
}

/// An integer as written; its range is checked with its span ([`Doc::int`]).
#[derive(Clone, Copy)]
struct Int(i128);
scalar! { Int, "an integer"; visit_ints!(Int, Int); }

/// A float field: a TOML float or integer (`lr = 1`); its range is checked in [`Doc::float`].
struct Number(f64);
scalar! { Number, "a number";
    visit_ints!(Number, |v| Number(v as f64));
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Number, E> {
        Ok(Number(v))
    }
}

/// `n` or `[h, w]` (the element count is checked in [`Doc::pair`], to say how many there were).
enum Pair {
    One(Int),
    List(Vec<Spanned<Int>>),
}
scalar! { Pair, "an integer or [h, w]";
    visit_ints!(Pair, |v| Pair::One(Int(v)));
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Pair, A::Error> {
        Ok(Pair::List(collect(seq)?))
    }
}

/// `"digits"` or a table of files.
enum RawDataset {
    Named(String),
    Files(RawFiles),
}
scalar! { RawDataset, "\"digits\", { idx_images, idx_labels } or { csv, label_column }";
    fn visit_str<E: de::Error>(self, v: &str) -> Result<RawDataset, E> {
        Ok(RawDataset::Named(v.to_string()))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawDataset, A::Error> {
        RawFiles::deserialize(de::value::MapAccessDeserializer::new(map)).map(RawDataset::Files)
    }
}

fn collect<'de, T: Deserialize<'de>, A: SeqAccess<'de>>(mut seq: A) -> Result<Vec<T>, A::Error> {
    let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
    while let Some(x) = seq.next_element()? {
        v.push(x);
    }
    Ok(v)
}

/// What a [`Seq`] is called in a wrong-type message.
trait SeqName {
    const EXPECTING: &'static str;
}
struct LayerList;
impl SeqName for LayerList {
    const EXPECTING: &'static str = "an array of tables ([[layers]])";
}
struct NameList;
impl SeqName for NameList {
    const EXPECTING: &'static str = "an array of layer names";
}
struct DimsName;
impl SeqName for DimsName {
    const EXPECTING: &'static str = "[C, H, W] or [F] of positive integers";
}
type DimsList = Seq<Spanned<Int>, DimsName>;

/// An array that names itself in a wrong-type message (`Vec` says "a sequence").
struct Seq<T, N>(Vec<T>, PhantomData<N>);

impl<'de, T: Deserialize<'de>, N: SeqName> Deserialize<'de> for Seq<T, N> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T, N>(PhantomData<(T, N)>);
        impl<'de, T: Deserialize<'de>, N: SeqName> Visitor<'de> for V<T, N> {
            type Value = Seq<T, N>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(N::EXPECTING)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Ok(Seq(collect(seq)?, PhantomData))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

// ---- Key lists for the per-type checks and unknown-key messages ----

const ROOT_KEYS: &[&str] = &["model", "optimizer", "layers", "train", "lora"];
const MODEL_KEYS: &[&str] = &["input", "seed", "loss", "width"];
const TRAIN_KEYS: &[&str] = &["batch", "epochs", "dataset", "weights"];
const CSV_KEYS: &[&str] = &["csv", "label_column"];
const IDX_KEYS: &[&str] = &["idx_images", "idx_labels"];
const FILES_KEYS: &[&str] = &["csv", "label_column", "idx_images", "idx_labels", "text"];
const TEXT_KEYS: &[&str] = &["text"];
const LORA_KEYS: &[&str] = &["rank", "alpha", "targets"];
const ADAM_KEYS: &[&str] = &["type", "lr", "beta1", "beta2", "eps", "weight_decay"];
const SGD_KEYS: &[&str] = &["type", "lr", "momentum", "weight_decay"];
const OPTIMIZER_KEYS: &[&str] = &[
    "type",
    "lr",
    "beta1",
    "beta2",
    "eps",
    "momentum",
    "weight_decay",
];

const LAYER_TYPES: &[&str] = &[
    "linear",
    "conv2d",
    "maxpool2d",
    "avgpool2d",
    "global_avgpool",
    "relu",
    "relu6",
    "sigmoid",
    "tanh",
    "flatten",
    "reshape",
    "add",
    "batchnorm2d",
    "dropout",
    "embedding",
    "pos_embedding",
    "layernorm",
    "rmsnorm",
    "gelu",
    "silu",
    "attention",
    "lora_linear",
    "inverted_residual",
    "lstm",
    "gru",
];

/// The keys a layer of type `ty` takes: those every layer takes, then its own; for an unknown type,
/// every layer key.
fn layer_keys(ty: &str) -> &'static [&'static str] {
    match ty {
        "linear" => &[
            "name",
            "type",
            "inputs",
            "trainable",
            "update",
            "out",
            "bias",
        ],
        "conv2d" => &[
            "name",
            "type",
            "inputs",
            "trainable",
            "update",
            "out",
            "kernel",
            "stride",
            "padding",
            "groups",
            "bias",
            "scale_width",
        ],
        "inverted_residual" => &[
            "name",
            "type",
            "inputs",
            "trainable",
            "out",
            "expand",
            "repeat",
            "stride",
        ],
        "maxpool2d" | "avgpool2d" => &["name", "type", "inputs", "trainable", "kernel", "stride"],
        "reshape" => &["name", "type", "inputs", "trainable", "to"],
        "batchnorm2d" => &[
            "name",
            "type",
            "inputs",
            "trainable",
            "update",
            "eps",
            "momentum",
        ],
        "dropout" => &["name", "type", "inputs", "trainable", "p"],
        "embedding" => &["name", "type", "inputs", "trainable", "vocab", "dim"],
        "layernorm" | "rmsnorm" => &["name", "type", "inputs", "trainable", "eps"],
        "attention" => &["name", "type", "inputs", "trainable", "heads"],
        "lstm" | "gru" => &["name", "type", "inputs", "trainable", "hidden"],
        "lora_linear" => &[
            "name",
            "type",
            "inputs",
            "trainable",
            "out",
            "bias",
            "rank",
            "alpha",
        ],
        t if LAYER_TYPES.contains(&t) => &["name", "type", "inputs", "trainable"],
        _ => &[
            "name",
            "type",
            "inputs",
            "trainable",
            "update",
            "out",
            "kernel",
            "stride",
            "padding",
            "groups",
            "bias",
            "to",
            "eps",
            "momentum",
            "p",
            "vocab",
            "dim",
            "heads",
            "rank",
            "alpha",
            "expand",
            "repeat",
            "scale_width",
            "hidden",
        ],
    }
}

// ---- Checks over the typed document ----

/// Valid ranges for floating-point fields (all must also be finite).
#[derive(Clone, Copy)]
enum Limit {
    /// > 0.
    Positive,
    /// ≥ 0.
    NonNegative,
    /// [0, 1).
    UnitOpen,
    /// [0, 1].
    UnitClosed,
}

impl Limit {
    fn ok(self, v: f64) -> bool {
        v.is_finite()
            && match self {
                Limit::Positive => v > 0.0 && (v as f32) > 0.0,
                Limit::NonNegative => v >= 0.0,
                Limit::UnitOpen => (0.0..1.0).contains(&v) && (v as f32) < 1.0,
                Limit::UnitClosed => (0.0..=1.0).contains(&v),
            }
            && (v as f32).is_finite()
    }
    fn text(self) -> &'static str {
        match self {
            Limit::Positive => "a finite number > 0",
            Limit::NonNegative => "a finite number ≥ 0",
            Limit::UnitOpen => "in [0, 1)",
            Limit::UnitClosed => "in [0, 1]",
        }
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn pos(text: &str, offset: usize) -> (u32, u32) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |p| p + 1);
    let col = before[line_start..].chars().count() + 1;
    (
        u32::try_from(line).unwrap_or(u32::MAX),
        u32::try_from(col).unwrap_or(u32::MAX),
    )
}

/// Where a byte offset lies in the document ([`Doc::field_at`]).
struct Place<'d> {
    /// For messages: `layers[3] ("conv2").kernel`; at a key, the path of its table.
    field: String,
    /// The same without layer indices and names (`layers.kernel`), to look up key lists.
    schema: String,
    /// The key the offset is in, or the innermost key whose value holds it.
    key: Option<(&'d str, Span)>,
    /// Whether the offset is in a key (rather than a value).
    at_key: bool,
    /// The table holding that key.
    table: Option<&'d DeTable<'d>>,
}

/// The source and toml's spanned tree of it: positions and field paths for messages.
struct Doc<'d> {
    text: &'d str,
    doc: &'d Spanned<DeTable<'d>>,
}

impl<'d> Doc<'d> {
    /// The field at a byte offset: a generic walk of the tree (keys and layer indices), not of the
    /// format. toml gives a `[section]` table the span of its header only, so every table is
    /// searched, not just those whose span holds the offset.
    fn field_at(&self, offset: usize) -> Place<'d> {
        let mut place = Place {
            field: String::new(),
            schema: String::new(),
            key: None,
            at_key: false,
            table: None,
        };
        Self::in_table(self.doc.get_ref(), offset, &mut place);
        place
    }

    fn in_table(t: &'d DeTable<'d>, offset: usize, place: &mut Place<'d>) -> bool {
        for (k, v) in t.iter() {
            if k.span().contains(&offset) {
                place.key = Some((k.get_ref().as_ref(), k.span()));
                place.at_key = true;
                place.table = Some(t);
                return true;
            }
            let (field, schema) = (place.field.len(), place.schema.len());
            for p in [&mut place.field, &mut place.schema] {
                if !p.is_empty() {
                    p.push('.');
                }
                p.push_str(k.get_ref());
            }
            let prev = place.key.replace((k.get_ref().as_ref(), k.span()));
            let prev_table = place.table.replace(t);
            if Self::in_value(v, offset, place) {
                return true;
            }
            place.field.truncate(field);
            place.schema.truncate(schema);
            place.key = prev;
            place.table = prev_table;
        }
        false
    }

    fn in_value(v: &'d Spanned<DeValue<'d>>, offset: usize, place: &mut Place<'d>) -> bool {
        match v.get_ref() {
            DeValue::Table(t) if Self::in_table(t, offset, place) => return true,
            // Only the layer list is indexed into: elsewhere an array is one field.
            DeValue::Array(items) if place.field == "layers" => {
                for (i, item) in items.iter().enumerate() {
                    place.field = layer_label(i, item.get_ref());
                    if Self::in_value(item, offset, place) {
                        return true;
                    }
                }
                place.field = "layers".into();
            }
            _ => {}
        }
        v.span().contains(&offset)
    }

    /// An error at `span`, naming the field found there.
    fn err(&self, span: Span, kind: SpecErrorKind) -> SpecError {
        let field = self.field_at(span.start).field;
        self.err_in(span, &field, kind)
    }

    /// An error at `span` naming `field`.
    fn err_in(&self, span: Span, field: &str, kind: SpecErrorKind) -> SpecError {
        let (line, column) = pos(self.text, span.start);
        SpecError {
            file: None,
            line: Some(line),
            column: Some(column),
            field: field.to_string(),
            kind,
        }
    }

    /// serde's error as a [`SpecError`]: its position, the field found there, and for unknown and
    /// missing keys the same kinds as the checks in code (with the keys this table takes, which for
    /// a layer or the optimizer depend on its `type`).
    fn serde_error(&self, e: &toml::de::Error) -> SpecError {
        let msg = e.message();
        let Some(span) = e.span() else {
            return SpecError {
                file: None,
                line: None,
                column: None,
                field: String::new(),
                kind: SpecErrorKind::WrongType(msg.to_string()),
            };
        };
        let place = self.field_at(span.start);
        let kind = if let Some(key) = msg
            .strip_prefix("missing field `")
            .and_then(|m| m.strip_suffix('`'))
        {
            SpecErrorKind::Missing(key.to_string())
        } else if let (true, true, Some((key, _))) =
            (msg.starts_with("unknown field `"), place.at_key, &place.key)
        {
            let ty = || {
                place
                    .table
                    .and_then(|t| match t.get("type").map(Spanned::get_ref) {
                        Some(DeValue::String(s)) => Some(s.as_ref()),
                        _ => None,
                    })
            };
            let has = |k: &str| place.table.is_some_and(|t| t.get(k).is_some());
            let allowed: &'static [&'static str] = match place.schema.as_str() {
                "" => ROOT_KEYS,
                "model" => MODEL_KEYS,
                "train" => TRAIN_KEYS,
                "lora" => LORA_KEYS,
                "train.dataset" if has("csv") => CSV_KEYS,
                "train.dataset" if has("text") => TEXT_KEYS,
                "train.dataset" if has("idx_images") || has("idx_labels") => IDX_KEYS,
                "train.dataset" => FILES_KEYS,
                "optimizer" => match ty() {
                    Some("adam") | Some("adamw") => ADAM_KEYS,
                    Some("sgd") => SGD_KEYS,
                    _ => OPTIMIZER_KEYS,
                },
                _ => layer_keys(ty().unwrap_or("")),
            };
            SpecErrorKind::UnknownKey {
                key: key.to_string(),
                allowed,
            }
        } else {
            SpecErrorKind::WrongType(msg.to_string())
        };
        self.err_in(span, &place.field, kind)
    }

    /// The source text of a value, for "got …" in messages.
    fn src(&self, span: &Span) -> String {
        self.text.get(span.clone()).unwrap_or("").to_string()
    }

    /// Rejects the first (in source order) of the `present` keys that is not `allowed`, at its key.
    fn only_keys(
        &self,
        present: &[(&'static str, Option<Span>)],
        allowed: &'static [&'static str],
    ) -> Result<(), SpecError> {
        let bad = present
            .iter()
            .filter_map(|(k, s)| Some((*k, s.clone()?)))
            .filter(|(k, _)| !allowed.contains(k))
            .min_by_key(|(_, s)| s.start);
        let Some((key, value)) = bad else {
            return Ok(());
        };
        let span = match self.field_at(value.start).key {
            Some((k, span)) if k == key => span,
            _ => value,
        };
        Err(self.err(
            span,
            SpecErrorKind::UnknownKey {
                key: key.to_string(),
                allowed,
            },
        ))
    }

    /// Index into `known` of a string value.
    fn pick(
        &self,
        v: &Spanned<String>,
        known: &'static [&'static str],
    ) -> Result<usize, SpecError> {
        known.iter().position(|k| k == v.get_ref()).ok_or_else(|| {
            self.err(
                v.span(),
                SpecErrorKind::UnknownValue {
                    value: v.get_ref().clone(),
                    known,
                },
            )
        })
    }

    /// An integer in `[lo, hi]`.
    fn int(
        &self,
        v: &Spanned<Int>,
        lo: u128,
        hi: u128,
        what: &'static str,
    ) -> Result<u128, SpecError> {
        match u128::try_from(v.get_ref().0) {
            Ok(n) if (lo..=hi).contains(&n) => Ok(n),
            _ => Err(self.err(
                v.span(),
                SpecErrorKind::OutOfRange {
                    value: self.src(&v.span()),
                    must_be: what,
                },
            )),
        }
    }

    fn size(&self, v: &Spanned<Int>) -> Result<u32, SpecError> {
        Ok(self.int(v, 1, u32::MAX as u128, "a positive integer")? as u32)
    }

    fn opt_size(&self, v: &Option<Spanned<Int>>) -> Result<Option<u32>, SpecError> {
        v.as_ref().map(|v| self.size(v)).transpose()
    }

    fn float(&self, v: &Spanned<Number>, range: Limit) -> Result<f32, SpecError> {
        if range.ok(v.get_ref().0) {
            Ok(v.get_ref().0 as f32)
        } else {
            Err(self.err(
                v.span(),
                SpecErrorKind::OutOfRange {
                    value: self.src(&v.span()),
                    must_be: range.text(),
                },
            ))
        }
    }

    fn opt_float(
        &self,
        v: &Option<Spanned<Number>>,
        range: Limit,
        default: f32,
    ) -> Result<f32, SpecError> {
        v.as_ref().map_or(Ok(default), |v| self.float(v, range))
    }

    /// A required key of a table at `table`.
    fn need<'v, T>(&self, v: &'v Option<T>, table: &Span, key: &str) -> Result<&'v T, SpecError> {
        v.as_ref()
            .ok_or_else(|| self.err(table.clone(), SpecErrorKind::Missing(key.to_string())))
    }

    /// `n` or `[h, w]`, each ≥ `min`.
    fn pair(&self, v: &Spanned<Pair>, min: u128) -> Result<[u32; 2], SpecError> {
        let what = if min == 0 {
            "a non-negative integer or [h, w]"
        } else {
            "a positive integer or [h, w]"
        };
        let one = |i: &Spanned<Int>| Ok(self.int(i, min, u32::MAX as u128, what)? as u32);
        match v.get_ref() {
            Pair::One(n) => {
                let n = one(&Spanned::new(v.span(), *n))?;
                Ok([n, n])
            }
            Pair::List(a) if a.len() == 2 => Ok([one(&a[0])?, one(&a[1])?]),
            Pair::List(a) => Err(self.err(
                v.span(),
                SpecErrorKind::Invalid(format!("expected [h, w], got {} elements", a.len())),
            )),
        }
    }

    /// `[C, H, W]` or `[F]`, positive, with a product that fits in u32.
    fn dims(&self, v: &Spanned<DimsList>) -> Result<Dims, SpecError> {
        let items = &v.get_ref().0;
        let mut d = Vec::with_capacity(3);
        for item in items {
            d.push(self.size(item)?);
        }
        let dims = match d[..] {
            [f] => Dims::flat(f),
            [c, h, w] => Dims::new(c, h, w),
            _ => {
                return Err(self.err(
                    v.span(),
                    SpecErrorKind::Invalid(format!(
                        "expected [C, H, W] or [F], got {} elements",
                        d.len()
                    )),
                ))
            }
        };
        if dims.c as u128 * dims.h as u128 * dims.w as u128 > u32::MAX as u128 {
            return Err(self.err(
                v.span(),
                SpecErrorKind::Invalid(format!("{dims} has more than 2^32 - 1 elements")),
            ));
        }
        Ok(dims)
    }

    fn path(&self, v: &Spanned<String>) -> Result<PathBuf, SpecError> {
        if v.get_ref().is_empty() {
            return Err(self.err(v.span(), SpecErrorKind::Invalid("empty path".into())));
        }
        Ok(PathBuf::from(v.get_ref()))
    }

    fn optimizer(&self, o: &RawOptimizer) -> Result<OptimizerSpec, SpecError> {
        let kind = self.pick(&o.ty, &["adam", "sgd", "adamw"])?;
        let adam = kind != 1;
        let s = |v: &Option<Spanned<Number>>| v.as_ref().map(Spanned::span);
        let present = [
            ("beta1", s(&o.beta1)),
            ("beta2", s(&o.beta2)),
            ("eps", s(&o.eps)),
            ("momentum", s(&o.momentum)),
        ];
        self.only_keys(&present, if adam { ADAM_KEYS } else { SGD_KEYS })?;
        let lr = self.float(&o.lr, Limit::Positive)?;
        // torch.optim.AdamW's default decay is 0.01; Adam's and SGD's 0.
        let default_wd = if kind == 2 { 0.01 } else { 0.0 };
        let weight_decay = self.opt_float(&o.weight_decay, Limit::NonNegative, default_wd)?;
        Ok(if kind == 2 {
            OptimizerSpec::AdamW {
                lr,
                beta1: self.opt_float(&o.beta1, Limit::UnitOpen, 0.9)?,
                beta2: self.opt_float(&o.beta2, Limit::UnitOpen, 0.999)?,
                eps: self.opt_float(&o.eps, Limit::Positive, 1e-8)?,
                weight_decay,
            }
        } else if adam {
            OptimizerSpec::Adam {
                lr,
                beta1: self.opt_float(&o.beta1, Limit::UnitOpen, 0.9)?,
                beta2: self.opt_float(&o.beta2, Limit::UnitOpen, 0.999)?,
                eps: self.opt_float(&o.eps, Limit::Positive, 1e-8)?,
                weight_decay,
            }
        } else {
            OptimizerSpec::Sgd {
                lr,
                momentum: self.opt_float(&o.momentum, Limit::UnitOpen, 0.0)?,
                weight_decay,
            }
        })
    }

    fn layers(
        &self,
        list: &Spanned<Seq<Spanned<Table<RawLayer>>, LayerList>>,
        input: Dims,
        width: Option<f64>,
    ) -> Result<Vec<LayerSpec>, SpecError> {
        let items = &list.get_ref().0;
        if items.is_empty() {
            return Err(self.err(
                list.span(),
                SpecErrorKind::Invalid("a model needs at least one layer".into()),
            ));
        }
        // Every layer's name, to tell forward references from typos.
        let all_names: Vec<String> = items
            .iter()
            .enumerate()
            .map(|(i, l)| default_name(i, &l.get_ref().0))
            .collect();
        // The spec's layers (an `inverted_residual` entry becomes several) and, per entry, the index
        // of the spec layer that is its output.
        let mut layers: Vec<LayerSpec> = Vec::with_capacity(items.len());
        let mut outputs: Vec<u32> = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let l = &item.get_ref().0;
            let ty = LAYER_TYPES[self.pick(&l.ty, LAYER_TYPES)?];
            if let Some(n) = &l.name {
                let n = n.get_ref();
                let bad = if n.is_empty() || n.trim() != n || n.chars().any(char::is_control) {
                    Some(format!(
                        "layer name \"{n}\" must be non-empty, without surrounding spaces or control characters"
                    ))
                } else if n == "input" {
                    Some("the name \"input\" is reserved for the model input".into())
                } else {
                    None
                };
                if let Some(m) = bad {
                    return Err(self.err(
                        l.name.as_ref().map_or(item.span(), Spanned::span),
                        SpecErrorKind::Invalid(m),
                    ));
                }
            }
            self.only_keys(&l.present(), layer_keys(ty))?;
            let name = &all_names[i];
            let name_span = l.name.as_ref().map_or(item.span(), Spanned::span);
            if let Some(first) = all_names[..i].iter().position(|p| p == name) {
                return Err(self.err_in(
                    name_span,
                    &format!("{}.name", layer_label_of(i, name)),
                    SpecErrorKind::DuplicateName {
                        name: name.clone(),
                        first,
                    },
                ));
            }
            let inputs = self.inputs(item, i, &outputs, &all_names, ty)?;
            let (trainable, update) = self.update(l, &layer_label_of(i, name))?;
            let before = layers.len();
            if ty == "inverted_residual" {
                self.inverted_residual(
                    item,
                    name,
                    inputs[0],
                    input,
                    width,
                    trainable,
                    &mut layers,
                )?;
            } else if ty == "lstm" || ty == "gru" {
                self.recurrent(item, name, ty, inputs[0], trainable, &mut layers)?;
            } else {
                let mut kind = self.layer_kind(item, ty)?;
                if let (Some(w), LayerKind::Conv2d { out, groups, .. }) = (width, &mut kind) {
                    if l.scale_width.as_ref().is_none_or(|s| *s.get_ref()) {
                        let at = l.out.as_ref().map_or(item.span(), Spanned::span);
                        *out = self.scaled(*out, w, &at)?;
                        if *out % *groups != 0 {
                            return Err(self.err(
                                at,
                                SpecErrorKind::Invalid(format!(
                                    "groups = {groups} does not divide out = {out} (after the width multiplier)"
                                )),
                            ));
                        }
                    }
                }
                layers.push(LayerSpec {
                    name: name.clone(),
                    kind,
                    inputs,
                    trainable,
                    update,
                });
            }
            // A generated name must not collide with a name written elsewhere in the file, nor a
            // layer's name with one generated before it (names written twice are duplicates above).
            for k in before..layers.len() {
                let n = &layers[k].name;
                let generated = matches!(ty, "inverted_residual" | "lstm" | "gru");
                let clash = all_names
                    .iter()
                    .enumerate()
                    .find(|&(j, a)| generated && a == n && j != i)
                    .map(|(j, _)| j)
                    .or_else(|| {
                        layers[..before]
                            .iter()
                            .position(|p| p.name == *n)
                            .and_then(|q| outputs.iter().position(|&o| o as usize >= q))
                    });
                if let Some(j) = clash {
                    return Err(self.err_in(
                        name_span,
                        &format!("{}.name", layer_label_of(i, name)),
                        SpecErrorKind::Invalid(format!(
                            "the layer \"{n}\" (this {ty} or one it generates) has the name of another layer (layers[{j}] or one it generates)"
                        )),
                    ));
                }
            }
            outputs.push((layers.len() - 1) as u32);
        }
        Ok(layers)
    }

    /// A layer's `trainable` and `update` keys: whether it trains and which part (sparse update).
    fn update(&self, l: &RawLayer, label: &str) -> Result<(bool, Update), SpecError> {
        let trainable = l.trainable.as_ref().is_none_or(|t| *t.get_ref());
        let Some(u) = &l.update else {
            return Ok((trainable, Update::All));
        };
        let field = format!("{label}.update");
        let at = |kind| Err(self.err_in(u.span(), &field, kind));
        let (on, update) = match u.get_ref() {
            RawUpdate::Name(n) if n == "all" => (true, Update::All),
            RawUpdate::Name(n) if n == "frozen" => (false, Update::All),
            RawUpdate::Name(n) if n == "bias" => (true, Update::Bias),
            RawUpdate::Name(n) => {
                return at(SpecErrorKind::UnknownValue {
                    value: n.clone(),
                    known: UPDATE_NAMES,
                })
            }
            RawUpdate::Channels { channels } => {
                let f = *channels as f32;
                if !(Update::Channels(f).valid() && *channels > 0.0) {
                    return at(SpecErrorKind::OutOfRange {
                        value: channels.to_string(),
                        must_be: "in (0, 1] (the fraction of output channels updated)",
                    });
                }
                (true, Update::Channels(f))
            }
        };
        if l.trainable.is_some() && trainable != on {
            return at(SpecErrorKind::Invalid(format!(
                "update = {update_s} contradicts trainable = {trainable}",
                update_s = if on {
                    update.to_string()
                } else {
                    "\"frozen\"".into()
                }
            )));
        }
        Ok((on, update))
    }

    /// `make_divisible(out × width, 8)`: MobileNet's channel rounding (torchvision's rule: the nearest
    /// multiple of 8, at least 8, and never below 90 % of `out × width`).
    fn scaled(&self, out: u32, width: f64, at: &Span) -> Result<u32, SpecError> {
        let v = out as f64 * width;
        let mut n = ((v + 4.0).floor() / 8.0).floor() * 8.0;
        n = n.max(8.0);
        if n < 0.9 * v {
            n += 8.0;
        }
        if n > u32::MAX as f64 {
            return Err(self.err(
                at.clone(),
                SpecErrorKind::Invalid(format!(
                    "out = {out} × width = {width} is more than 2^32 - 1 channels"
                )),
            ));
        }
        Ok(n as u32)
    }

    /// Appends the layers of an `inverted_residual` entry (MobileNetV2's bottleneck, Sandler et al.
    /// 2018, Table 1): `repeat` blocks, each a 1×1 expansion to `expand` × its input channels
    /// (left out when `expand = 1`), a 3×3 depthwise convolution (`stride` in the first block, 1 after),
    /// a linear 1×1 projection to `out` channels, BatchNorm after every convolution, ReLU6 after the
    /// first two, and a residual `add` of the block's input where the stride is 1 and the channels
    /// match. Layer `k` of block `b` of `name` is `{name}_{b}_{k}` (`expand`, `expand_bn`,
    /// `expand_relu`, `dw`, `dw_bn`, `dw_relu`, `project`, `project_bn`, `add`); `name` itself stands
    /// for the last block's output.
    #[allow(clippy::too_many_arguments)]
    fn inverted_residual(
        &self,
        item: &Spanned<Table<RawLayer>>,
        name: &str,
        src: Src,
        input: Dims,
        width: Option<f64>,
        trainable: bool,
        layers: &mut Vec<LayerSpec>,
    ) -> Result<(), SpecError> {
        let l = &item.get_ref().0;
        let span = item.span();
        let out_v = self.need(&l.out, &span, "out")?;
        let mut out = self.size(out_v)?;
        if let Some(w) = width {
            out = self.scaled(out, w, &out_v.span())?;
        }
        let expand = self.int(
            self.need(&l.expand, &span, "expand")?,
            1,
            1 << 16,
            "an integer in [1, 65536]",
        )? as u32;
        let repeat = match &l.repeat {
            Some(r) => self.int(r, 1, 1 << 16, "an integer in [1, 65536]")? as u32,
            None => 1,
        };
        let stride = l.stride.as_ref().map_or(Ok([1, 1]), |s| self.pair(s, 1))?;
        // The block input's channels (the hidden width is a multiple of them): realise the layers so
        // far, which also reports a shape error in them here rather than later.
        let mut cin = match src {
            Src::Input => input.c,
            Src::Layer(j) => {
                // The layers up to the block's input, and a trainable probe reading it (a prefix of
                // activations alone would not realise: nothing to train).
                let mut probe = layers[..=j as usize].to_vec();
                probe.push(LayerSpec {
                    name: String::from("\u{0}probe"),
                    kind: LayerKind::Linear { out: 1, bias: true },
                    inputs: vec![src],
                    trainable: true,
                    update: Update::All,
                });
                let prefix = ModelSpec {
                    input,
                    layers: probe,
                    loss: LossKind::Mse,
                    optimizer: OptimizerSpec::Sgd {
                        lr: 1.0,
                        momentum: 0.0,
                        weight_decay: 0.0,
                    },
                    seed: 0,
                };
                match Graph::new(&prefix, 1) {
                    Ok(g) => match g.nodes.iter().find(|n| n.layer == j) {
                        Some(n) => n.out_dims.c,
                        None => input.c,
                    },
                    Err(e) => {
                        return Err(self.err(
                            span,
                            SpecErrorKind::Invalid(format!("its input does not realise: {e}")),
                        ))
                    }
                }
            }
        };
        let too_wide = || {
            self.err(
                span.clone(),
                SpecErrorKind::Invalid(format!(
                    "expand = {expand} × the input's channels is more than 2^32 - 1 channels"
                )),
            )
        };
        let mut prev = src;
        for b in 0..repeat {
            let block_in = prev;
            let s = if b == 0 { stride } else { [1, 1] };
            let hidden = cin.checked_mul(expand).ok_or_else(too_wide)?;
            let mut push = |suffix: &str, kind: LayerKind, inputs: Vec<Src>| {
                layers.push(LayerSpec {
                    name: format!("{name}_{b}_{suffix}"),
                    kind,
                    inputs,
                    trainable,
                    update: Update::All,
                });
                Src::Layer((layers.len() - 1) as u32)
            };
            let bn = LayerKind::BatchNorm2d {
                eps: 1e-5,
                momentum: 0.1,
            };
            let conv = |out: u32, k: u32, s: [u32; 2], groups: u32| LayerKind::Conv2d {
                out,
                kernel: [k, k],
                stride: s,
                padding: [k / 2, k / 2],
                groups,
                bias: false,
            };
            let mut x = block_in;
            if expand != 1 {
                x = push("expand", conv(hidden, 1, [1, 1], 1), vec![x]);
                x = push("expand_bn", bn.clone(), vec![x]);
                x = push("expand_relu", LayerKind::Relu6, vec![x]);
            }
            x = push("dw", conv(hidden, 3, s, hidden), vec![x]);
            x = push("dw_bn", bn.clone(), vec![x]);
            x = push("dw_relu", LayerKind::Relu6, vec![x]);
            x = push("project", conv(out, 1, [1, 1], 1), vec![x]);
            x = push("project_bn", bn, vec![x]);
            if s == [1, 1] && cin == out {
                x = push("add", LayerKind::Add, vec![block_in, x]);
            }
            prev = x;
            cin = out;
        }
        Ok(())
    }

    /// Appends the layers of an `lstm` or `gru` entry (one PyTorch `nn.LSTM`/`nn.GRU` layer,
    /// `batch_first`, zero initial state): the input projection of every time step, a linear
    /// `{name}_ih` to `4·hidden` (LSTM: gates i, f, g, o) or `3·hidden` (GRU: r, z, n) — PyTorch's
    /// `weight_ih_l0`, `bias_ih_l0` as `{name}_ih.weight`, `{name}_ih.bias` —, then the recurrent
    /// layer `{name}` (`{name}.weight_hh_l0`, `{name}.bias_hh_l0`), whose output is every hidden
    /// state.
    fn recurrent(
        &self,
        item: &Spanned<Table<RawLayer>>,
        name: &str,
        ty: &str,
        src: Src,
        trainable: bool,
        layers: &mut Vec<LayerSpec>,
    ) -> Result<(), SpecError> {
        let l = &item.get_ref().0;
        let span = item.span();
        let hidden_v = self.need(&l.hidden, &span, "hidden")?;
        let hidden = self.size(hidden_v)?;
        let gates = if ty == "lstm" { 4 } else { 3 };
        let out = hidden.checked_mul(gates).ok_or_else(|| {
            self.err(
                hidden_v.span(),
                SpecErrorKind::Invalid(format!(
                    "hidden = {hidden}: {gates}·hidden is more than 2^32 - 1 features"
                )),
            )
        })?;
        layers.push(LayerSpec {
            name: format!("{name}_ih"),
            kind: LayerKind::Linear { out, bias: true },
            inputs: vec![src],
            trainable,
            update: Update::All,
        });
        let kind = if ty == "lstm" {
            LayerKind::Lstm { hidden }
        } else {
            LayerKind::Gru { hidden }
        };
        layers.push(LayerSpec {
            name: name.to_string(),
            kind,
            inputs: vec![Src::Layer((layers.len() - 1) as u32)],
            trainable,
            update: Update::All,
        });
        Ok(())
    }

    fn layer_kind(
        &self,
        item: &Spanned<Table<RawLayer>>,
        ty: &str,
    ) -> Result<LayerKind, SpecError> {
        let l = &item.get_ref().0;
        let span = item.span();
        let bias = l.bias.as_ref().is_none_or(|b| *b.get_ref());
        Ok(match ty {
            "linear" => LayerKind::Linear {
                out: self.size(self.need(&l.out, &span, "out")?)?,
                bias,
            },
            "conv2d" => {
                let out = self.size(self.need(&l.out, &span, "out")?)?;
                let kernel = self.pair(self.need(&l.kernel, &span, "kernel")?, 1)?;
                let groups = self.opt_size(&l.groups)?.unwrap_or(1);
                if out % groups != 0 {
                    let at = l.groups.as_ref().map_or(span, Spanned::span);
                    return Err(self.err(
                        at,
                        SpecErrorKind::Invalid(format!(
                            "groups = {groups} does not divide out = {out}"
                        )),
                    ));
                }
                LayerKind::Conv2d {
                    out,
                    kernel,
                    stride: l.stride.as_ref().map_or(Ok([1, 1]), |s| self.pair(s, 1))?,
                    padding: l.padding.as_ref().map_or(Ok([0, 0]), |s| self.pair(s, 0))?,
                    groups,
                    bias,
                }
            }
            "maxpool2d" | "avgpool2d" => {
                let kernel = self.pair(self.need(&l.kernel, &span, "kernel")?, 1)?;
                let stride = l.stride.as_ref().map_or(Ok(kernel), |s| self.pair(s, 1))?;
                if ty == "maxpool2d" {
                    LayerKind::MaxPool2d { kernel, stride }
                } else {
                    LayerKind::AvgPool2d { kernel, stride }
                }
            }
            "global_avgpool" => LayerKind::GlobalAvgPool,
            "relu" => LayerKind::Relu,
            "relu6" => LayerKind::Relu6,
            "sigmoid" => LayerKind::Sigmoid,
            "tanh" => LayerKind::Tanh,
            "flatten" => LayerKind::Flatten,
            "reshape" => LayerKind::Reshape {
                to: self.dims(self.need(&l.to, &span, "to")?)?,
            },
            "add" => LayerKind::Add,
            "batchnorm2d" => LayerKind::BatchNorm2d {
                eps: self.opt_float(&l.eps, Limit::Positive, 1e-5)?,
                momentum: self.opt_float(&l.momentum, Limit::UnitClosed, 0.1)?,
            },
            "dropout" => LayerKind::Dropout {
                p: self.opt_float(&l.p, Limit::UnitOpen, 0.5)?,
            },
            "embedding" => LayerKind::Embedding {
                vocab: self.size(self.need(&l.vocab, &span, "vocab")?)?,
                dim: self.size(self.need(&l.dim, &span, "dim")?)?,
            },
            "pos_embedding" => LayerKind::PosEmbedding,
            "layernorm" => LayerKind::LayerNorm {
                eps: self.opt_float(&l.eps, Limit::Positive, 1e-5)?,
            },
            "rmsnorm" => LayerKind::RmsNorm {
                eps: self.opt_float(&l.eps, Limit::Positive, 1e-6)?,
            },
            "gelu" => LayerKind::Gelu,
            "silu" => LayerKind::Silu,
            "attention" => LayerKind::Attention {
                heads: self.size(self.need(&l.heads, &span, "heads")?)?,
            },
            "lora_linear" => {
                let rank = self.size(self.need(&l.rank, &span, "rank")?)?;
                LayerKind::LoraLinear {
                    out: self.size(self.need(&l.out, &span, "out")?)?,
                    bias,
                    rank,
                    alpha: self.opt_float(&l.alpha, Limit::Positive, rank as f32)?,
                }
            }
            _ => unreachable!("type checked against LAYER_TYPES"),
        })
    }

    fn inputs(
        &self,
        item: &Spanned<Table<RawLayer>>,
        index: usize,
        outputs: &[u32],
        all: &[String],
        ty: &str,
    ) -> Result<Vec<Src>, SpecError> {
        let expected = if ty == "add" { 2 } else { 1 };
        let Some(v) = &item.get_ref().0.inputs else {
            if expected != 1 {
                return Err(self.err_in(
                    item.span(),
                    &format!("{}.inputs", layer_label_of(index, &all[index])),
                    SpecErrorKind::Invalid(format!(
                        "{ty} needs inputs = [a, b] naming its {expected} inputs"
                    )),
                ));
            }
            return Ok(vec![match outputs.last() {
                None => Src::Input,
                Some(&j) => Src::Layer(j),
            }]);
        };
        let names = &v.get_ref().0;
        if names.len() != expected {
            return Err(self.err(
                v.span(),
                SpecErrorKind::InputCount {
                    expected,
                    found: names.len(),
                },
            ));
        }
        names
            .iter()
            .map(|n| {
                let name = n.get_ref();
                if name == "input" {
                    return Ok(Src::Input);
                }
                if let Some(j) = all[..outputs.len()].iter().position(|l| l == name) {
                    return Ok(Src::Layer(outputs[j]));
                }
                // Not earlier: a later layer (or itself) is a forward reference, otherwise unknown.
                let kind = match all.iter().position(|a| a == name) {
                    Some(j) => SpecErrorKind::LaterInput {
                        name: name.clone(),
                        index: j,
                    },
                    None => SpecErrorKind::UnknownInput(name.clone()),
                };
                Err(self.err(n.span(), kind))
            })
            .collect()
    }

    /// The `[lora]` section, applied: every Linear whose name matches a target becomes a LoRA Linear
    /// (same name, so its base weights load from the pretrained file), every other layer is frozen.
    fn lora(
        &self,
        l: &Spanned<Table<RawLora>>,
        layers: &mut [LayerSpec],
    ) -> Result<LoraConfig, SpecError> {
        let r = &l.get_ref().0;
        let rank = self.size(&r.rank)?;
        let alpha = self.opt_float(&r.alpha, Limit::Positive, rank as f32)?;
        let mut targets = Vec::new();
        for t in &r.targets.get_ref().0 {
            let name = t.get_ref();
            let hit = |n: &str| n == name || n.ends_with(&format!(".{name}"));
            let mut found = false;
            for layer in layers.iter_mut().filter(|x| hit(&x.name)) {
                let LayerKind::Linear { out, bias } = layer.kind else {
                    return Err(self.err_in(
                        t.span(),
                        "lora.targets",
                        SpecErrorKind::Invalid(format!(
                            "LoRA target {name:?} matches layer {:?}, a {}; only linear layers take adapters",
                            layer.name,
                            layer.kind.type_name()
                        )),
                    ));
                };
                layer.kind = LayerKind::LoraLinear {
                    out,
                    bias,
                    rank,
                    alpha,
                };
                found = true;
            }
            if !found {
                return Err(self.err_in(
                    t.span(),
                    "lora.targets",
                    SpecErrorKind::Invalid(format!("LoRA target {name:?} matches no layer")),
                ));
            }
            targets.push(name.clone());
        }
        if targets.is_empty() {
            return Err(self.err_in(
                r.targets.span(),
                "lora.targets",
                SpecErrorKind::Invalid("LoRA needs at least one target layer".into()),
            ));
        }
        for layer in layers.iter_mut() {
            layer.trainable = matches!(layer.kind, LayerKind::LoraLinear { .. });
        }
        Ok(LoraConfig {
            rank,
            alpha,
            targets,
        })
    }

    fn train(&self, t: &RawTrain) -> Result<TrainConfig, SpecError> {
        let dataset = match &t.dataset {
            None => None,
            Some(v) => Some(match v.get_ref() {
                RawDataset::Named(s) if s == "digits" => DatasetSource::Digits,
                RawDataset::Named(s) => {
                    return Err(self.err(
                        v.span(),
                        SpecErrorKind::UnknownValue {
                            value: s.clone(),
                            known: &[
                                "digits",
                                "{ idx_images, idx_labels }",
                                "{ csv, label_column }",
                                "{ text }",
                            ],
                        },
                    ))
                }
                RawDataset::Files(f) => {
                    let s = |v: &Option<Spanned<String>>| v.as_ref().map(Spanned::span);
                    let present = [
                        ("csv", s(&f.csv)),
                        ("text", s(&f.text)),
                        ("label_column", f.label_column.as_ref().map(Spanned::span)),
                        ("idx_images", s(&f.idx_images)),
                        ("idx_labels", s(&f.idx_labels)),
                    ];
                    let span = v.span();
                    if let Some(text) = &f.text {
                        self.only_keys(&present, TEXT_KEYS)?;
                        DatasetSource::Text {
                            path: self.path(text)?,
                        }
                    } else if let Some(csv) = &f.csv {
                        self.only_keys(&present, CSV_KEYS)?;
                        DatasetSource::Csv {
                            path: self.path(csv)?,
                            label_column: match &f.label_column {
                                Some(c) => {
                                    self.int(c, 0, u32::MAX as u128, "a non-negative integer")?
                                        as usize
                                }
                                None => 0,
                            },
                        }
                    } else if f.idx_images.is_some() || f.idx_labels.is_some() {
                        self.only_keys(&present, IDX_KEYS)?;
                        DatasetSource::Idx {
                            images: self.path(self.need(&f.idx_images, &span, "idx_images")?)?,
                            labels: self.path(self.need(&f.idx_labels, &span, "idx_labels")?)?,
                        }
                    } else {
                        return Err(self.err(
                            span,
                            SpecErrorKind::Invalid(
                                "a dataset table needs idx_images and idx_labels, csv, or text"
                                    .into(),
                            ),
                        ));
                    }
                }
            }),
        };
        Ok(TrainConfig {
            batch: self.opt_size(&t.batch)?,
            epochs: self.opt_size(&t.epochs)?,
            dataset,
            weights: t.weights.as_ref().map(|w| self.path(w)).transpose()?,
        })
    }
}

/// A layer's name: as written, or `{type}{index}`.
fn default_name(index: usize, l: &RawLayer) -> String {
    match &l.name {
        Some(n) => n.get_ref().clone(),
        None => format!("{}{index}", l.ty.get_ref()),
    }
}

fn layer_label_of(index: usize, name: &str) -> String {
    format!("layers[{index}] (\"{name}\")")
}

/// `layers[i] ("name")` from the document tree: the name as written, else the default name when
/// the type is known, else `layers[i]`.
fn layer_label(index: usize, item: &DeValue<'_>) -> String {
    let get = |k: &str| match item {
        DeValue::Table(t) => t.get(k).map(Spanned::get_ref),
        _ => None,
    };
    match (get("name"), get("type")) {
        (Some(DeValue::String(n)), _) => layer_label_of(index, n),
        (None, Some(DeValue::String(ty))) if LAYER_TYPES.contains(&ty.as_ref()) => {
            layer_label_of(index, &format!("{ty}{index}"))
        }
        _ => format!("layers[{index}]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{mutate, scratch_dir};
    use proptest::prelude::*;

    const HEAD: &str = "[model]\ninput = [1, 8, 8]\nloss = \"cross_entropy\"\n\n[optimizer]\ntype = \"adam\"\nlr = 0.001\n\n";

    const SEQ: &str = r#"
[model]
input = [8]
loss = "cross_entropy"

[optimizer]
type = "adamw"
lr = 0.01

[[layers]]
name = "tok"
type = "embedding"
vocab = 16
dim = 8

[[layers]]
type = "pos_embedding"

[[layers]]
name = "b.ln"
type = "layernorm"

[[layers]]
name = "b.qkv"
type = "linear"
out = 24
bias = false

[[layers]]
type = "attention"
heads = 2

[[layers]]
name = "b.proj"
type = "linear"
out = 8

[[layers]]
type = "rmsnorm"
eps = 1e-5

[[layers]]
type = "silu"

[[layers]]
type = "gelu"

[[layers]]
name = "head"
type = "linear"
out = 16
"#;

    #[test]
    fn sequence_layers_and_lora_parse() {
        let m = parse_model(SEQ).unwrap();
        assert_eq!(
            m.spec.optimizer,
            OptimizerSpec::AdamW {
                lr: 0.01,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.01
            }
        );
        assert_eq!(
            m.spec.layers[0].kind,
            LayerKind::Embedding { vocab: 16, dim: 8 }
        );
        assert_eq!(m.spec.layers[4].kind, LayerKind::Attention { heads: 2 });
        assert_eq!(m.spec.layers[6].kind, LayerKind::RmsNorm { eps: 1e-5 });
        assert!(m.lora.is_none());
        frugal_core::graph::Graph::new(&m.spec, 2).unwrap();

        let lora = format!("{SEQ}\n[lora]\nrank = 2\nalpha = 4\ntargets = [\"qkv\", \"b.proj\"]\n");
        let m = parse_model(&lora).unwrap();
        let l = m.lora.unwrap();
        assert_eq!((l.rank, l.alpha), (2, 4.0));
        for layer in &m.spec.layers {
            let adapted = layer.name == "b.qkv" || layer.name == "b.proj";
            assert_eq!(layer.trainable, adapted, "{}", layer.name);
            assert_eq!(
                matches!(layer.kind, LayerKind::LoraLinear { rank: 2, .. }),
                adapted,
                "{}",
                layer.name
            );
        }
        let g = frugal_core::graph::Graph::new(&m.spec, 2).unwrap();
        assert!(g
            .params()
            .all(|(_, p)| p.grad.is_some() == p.name.contains(".lora_")));

        // Typed errors: a target that matches nothing, or a layer that is not linear.
        let e = err(&format!("{SEQ}\n[lora]\nrank = 2\ntargets = [\"nope\"]\n"));
        assert!(e.contains("matches no layer"), "{e}");
        let e = err(&format!("{SEQ}\n[lora]\nrank = 2\ntargets = [\"tok\"]\n"));
        assert!(e.contains("only linear layers"), "{e}");
        let e = err(&format!("{SEQ}\n[lora]\nrank = 0\ntargets = [\"qkv\"]\n"));
        assert!(e.contains("lora.rank") || e.contains("positive"), "{e}");
        let e = err(&SEQ.replace("heads = 2", "heads = 2\nvocab = 3"));
        assert!(e.contains("unknown key"), "{e}");
        let e = err(&SEQ.replace("vocab = 16\n", ""));
        assert!(e.contains("vocab"), "{e}");
    }

    /// An `lstm`/`gru` entry is its input projection `NAME_ih` (a linear to 4·hidden / 3·hidden) and
    /// the recurrent layer `NAME`, which later entries name; stacked by listing two.
    #[test]
    fn lstm_and_gru_entries() {
        let rnn = |ty: &str, keys: &str| {
            format!(
                "[model]\ninput = [6]\nloss = \"cross_entropy\"\n[optimizer]\ntype = \"adam\"\nlr = 0.01\n\
                 [[layers]]\nname = \"tok\"\ntype = \"embedding\"\nvocab = 16\ndim = 8\n\
                 [[layers]]\nname = \"r1\"\ntype = \"{ty}\"\n{keys}\n\
                 [[layers]]\nname = \"r2\"\ntype = \"{ty}\"\nhidden = 5\n\
                 [[layers]]\nname = \"head\"\ntype = \"linear\"\nout = 16\ninputs = [\"r2\"]\n"
            )
        };
        for (ty, gates) in [("lstm", 4), ("gru", 3)] {
            let m = parse_model(&rnn(ty, "hidden = 7")).unwrap_or_else(|e| panic!("{e}"));
            let names: Vec<&str> = m.spec.layers.iter().map(|l| l.name.as_str()).collect();
            assert_eq!(names, ["tok", "r1_ih", "r1", "r2_ih", "r2", "head"]);
            let l = &m.spec.layers;
            assert_eq!(
                l[1].kind,
                LayerKind::Linear {
                    out: gates * 7,
                    bias: true
                }
            );
            assert_eq!(l[1].inputs, [Src::Layer(0)]);
            assert_eq!(l[2].inputs, [Src::Layer(1)]);
            assert_eq!(l[3].inputs, [Src::Layer(2)]);
            assert_eq!(l[5].inputs, [Src::Layer(4)]);
            let want = if ty == "lstm" {
                LayerKind::Lstm { hidden: 5 }
            } else {
                LayerKind::Gru { hidden: 5 }
            };
            assert_eq!(l[4].kind, want);
            frugal_core::graph::Graph::new(&m.spec, 2).unwrap();
            // Typed errors.
            let e = err(&rnn(ty, ""));
            assert!(e.contains("missing key \"hidden\""), "{e}");
            let e = err(&rnn(ty, "hidden = 0"));
            assert!(e.contains("hidden"), "{e}");
            let e = err(&rnn(ty, "hidden = 4\nout = 3"));
            assert!(e.contains("unknown key \"out\""), "{e}");
            let e = err(&rnn(ty, "hidden = 4\nupdate = \"bias\""));
            assert!(e.contains("unknown key \"update\""), "{e}");
            // A generated name another layer has.
            let e = err(&rnn(ty, "hidden = 4").replace("name = \"tok\"", "name = \"r2_ih\""));
            assert!(e.contains("has the name of another layer"), "{e}");
        }
    }

    /// `examples/char-lstm.toml`: an LSTM language model of 0.5–1 M parameters on text.
    #[test]
    fn the_char_lstm_example_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let m = load_model(&dir.join("char-lstm.toml")).unwrap();
        assert!(m
            .spec
            .layers
            .iter()
            .any(|l| matches!(l.kind, LayerKind::Lstm { .. })));
        let g = frugal_core::graph::Graph::new(&m.spec, 2).unwrap();
        let params: usize = g
            .params()
            .map(|(_, p)| p.shape.iter().product::<usize>())
            .sum();
        assert!((500_000..=1_000_000).contains(&params), "{params}");
        assert!(matches!(m.train.dataset, Some(DatasetSource::Text { .. })));
    }

    #[test]
    fn the_char_gpt_examples_parse_and_keep_their_layers_in_step() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let base = load_model(&dir.join("char-gpt.toml")).unwrap();
        let lora = load_model(&dir.join("char-gpt-lora.toml")).unwrap();
        assert!(base.lora.is_none() && lora.lora.is_some());
        assert_eq!(base.spec.layers.len(), lora.spec.layers.len());
        for (a, b) in base.spec.layers.iter().zip(&lora.spec.layers) {
            assert_eq!(a.name, b.name);
            match (&a.kind, &b.kind) {
                (
                    LayerKind::Linear { out, bias },
                    LayerKind::LoraLinear {
                        out: o, bias: c, ..
                    },
                ) => {
                    assert_eq!((out, bias), (o, c))
                }
                (x, y) => assert_eq!(x, y, "{}", a.name),
            }
        }
        assert!(matches!(
            lora.train.dataset,
            Some(DatasetSource::Text { .. })
        ));
    }

    /// HEAD followed by `rest`.
    fn with(rest: &str) -> String {
        format!("{HEAD}{rest}")
    }

    fn err(text: &str) -> String {
        match parse_model(text) {
            Ok(m) => panic!("expected an error, parsed {m:?}"),
            Err(e) => e.to_string(),
        }
    }

    /// The error message without its "line L, column C: " prefix.
    fn err_body(text: &str) -> String {
        let e = parse_model(text).unwrap_err();
        assert!(e.line.is_some(), "error without a line: {e}");
        e.to_string().split_once(": ").unwrap().1.to_string()
    }

    const FULL: &str = r#"
[model]
input = [1, 8, 8]
seed = 7
loss = "cross_entropy"

[optimizer]
type = "adam"
lr = 1e-3
beta2 = 0.99
weight_decay = 0.0001

[[layers]]
name = "conv1"
type = "conv2d"
out = 8
kernel = 3
padding = 1

[[layers]]
type = "batchnorm2d"

[[layers]]
type = "relu"
trainable = false

[[layers]]
type = "conv2d"
out = 8
kernel = [3, 1]
stride = [1, 2]
padding = [1, 0]
groups = 8
bias = false
inputs = ["relu2"]

[[layers]]
name = "sum"
type = "add"
inputs = ["relu2", "conv2d3"]

[[layers]]
type = "maxpool2d"
kernel = 2

[[layers]]
type = "avgpool2d"
kernel = [2, 1]
stride = 1

[[layers]]
type = "global_avgpool"

[[layers]]
type = "reshape"
to = [8]

[[layers]]
type = "dropout"
p = 0.25

[[layers]]
type = "dropout"

[[layers]]
type = "flatten"

[[layers]]
type = "linear"
out = 10
bias = false
inputs = ["input"]

[[layers]]
type = "sigmoid"
[[layers]]
type = "tanh"
[[layers]]
type = "relu6"

[train]
batch = 32
epochs = 20
dataset = "digits"
weights = "w/backbone.safetensors"
"#;

    #[test]
    fn full_model_maps_every_field() {
        let m = parse_model(FULL).unwrap();
        let s = &m.spec;
        assert_eq!(s.input, Dims::new(1, 8, 8));
        assert_eq!(s.seed, 7);
        assert_eq!(s.loss, LossKind::SoftmaxCrossEntropy);
        assert_eq!(
            s.optimizer,
            OptimizerSpec::Adam {
                lr: 1e-3,
                beta1: 0.9,
                beta2: 0.99,
                eps: 1e-8,
                weight_decay: 1e-4
            }
        );
        let names: Vec<&str> = s.layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "conv1",
                "batchnorm2d1",
                "relu2",
                "conv2d3",
                "sum",
                "maxpool2d5",
                "avgpool2d6",
                "global_avgpool7",
                "reshape8",
                "dropout9",
                "dropout10",
                "flatten11",
                "linear12",
                "sigmoid13",
                "tanh14",
                "relu615"
            ]
        );
        let l = &s.layers;
        assert_eq!(
            l[0].kind,
            LayerKind::Conv2d {
                out: 8,
                kernel: [3, 3],
                stride: [1, 1],
                padding: [1, 1],
                groups: 1,
                bias: true
            }
        );
        assert_eq!(l[0].inputs, vec![Src::Input]);
        assert!(l[0].trainable);
        assert_eq!(
            l[1].kind,
            LayerKind::BatchNorm2d {
                eps: 1e-5,
                momentum: 0.1
            }
        );
        assert_eq!(l[1].inputs, vec![Src::Layer(0)]);
        assert!(!l[2].trainable);
        assert_eq!(
            l[3].kind,
            LayerKind::Conv2d {
                out: 8,
                kernel: [3, 1],
                stride: [1, 2],
                padding: [1, 0],
                groups: 8,
                bias: false
            }
        );
        assert_eq!(l[3].inputs, vec![Src::Layer(2)]);
        assert_eq!(l[4].kind, LayerKind::Add);
        assert_eq!(l[4].inputs, vec![Src::Layer(2), Src::Layer(3)]);
        assert_eq!(
            l[5].kind,
            LayerKind::MaxPool2d {
                kernel: [2, 2],
                stride: [2, 2]
            }
        );
        assert_eq!(
            l[6].kind,
            LayerKind::AvgPool2d {
                kernel: [2, 1],
                stride: [1, 1]
            }
        );
        assert_eq!(l[7].kind, LayerKind::GlobalAvgPool);
        assert_eq!(l[8].kind, LayerKind::Reshape { to: Dims::flat(8) });
        assert_eq!(l[9].kind, LayerKind::Dropout { p: 0.25 });
        assert_eq!(l[10].kind, LayerKind::Dropout { p: 0.5 });
        assert_eq!(l[11].kind, LayerKind::Flatten);
        assert_eq!(
            l[12].kind,
            LayerKind::Linear {
                out: 10,
                bias: false
            }
        );
        assert_eq!(l[12].inputs, vec![Src::Input]);
        assert_eq!(
            [&l[13].kind, &l[14].kind, &l[15].kind],
            [&LayerKind::Sigmoid, &LayerKind::Tanh, &LayerKind::Relu6]
        );
        assert_eq!(
            m.train,
            TrainConfig {
                batch: Some(32),
                epochs: Some(20),
                dataset: Some(DatasetSource::Digits),
                weights: Some("w/backbone.safetensors".into())
            }
        );
    }

    #[test]
    fn sgd_mse_and_datasets() {
        let m = parse_model(
            "[model]\ninput = [64]\nloss = \"mse\"\n[optimizer]\ntype = \"sgd\"\nlr = 1\nmomentum = 0.9\n\
             [[layers]]\ntype = \"linear\"\nout = 1_0\n\
             [train]\ndataset = { csv = \"d.csv\", label_column = 3 }\n",
        )
        .unwrap();
        assert_eq!(m.spec.input, Dims::flat(64));
        assert_eq!(m.spec.seed, 0);
        assert_eq!(m.spec.loss, LossKind::Mse);
        assert_eq!(
            m.spec.optimizer,
            OptimizerSpec::Sgd {
                lr: 1.0,
                momentum: 0.9,
                weight_decay: 0.0
            }
        );
        assert_eq!(
            m.spec.layers[0].kind,
            LayerKind::Linear {
                out: 10,
                bias: true
            }
        );
        assert_eq!(
            m.train.dataset,
            Some(DatasetSource::Csv {
                path: "d.csv".into(),
                label_column: 3
            })
        );
        let m = parse_model(&with(
            "[[layers]]\ntype = \"flatten\"\n[train]\ndataset = { idx_images = \"i.idx\", idx_labels = \"l.idx\" }\n",
        ))
        .unwrap();
        assert_eq!(
            m.train.dataset,
            Some(DatasetSource::Idx {
                images: "i.idx".into(),
                labels: "l.idx".into()
            })
        );
        assert_eq!(m.train.batch, None);
        let m = parse_model(&with("[[layers]]\ntype = \"relu\"\n")).unwrap();
        assert_eq!(m.train, TrainConfig::default());
        let m = parse_model(&with("[[layers]]\ntype = \"dropout\"\np = 0\n")).unwrap();
        assert_eq!(m.spec.layers[0].kind, LayerKind::Dropout { p: 0.0 });
    }

    #[test]
    fn unknown_keys_are_named() {
        let text = with(
            "[[layers]]\ntype = \"relu\"\n[[layers]]\ntype = \"relu\"\n[[layers]]\ntype = \"relu\"\n\
             [[layers]]\nname = \"conv2\"\ntype = \"conv2d\"\nout = 4\nkernal = 3\n",
        );
        let e = parse_model(&text).unwrap_err();
        assert_eq!(e.line, Some(19));
        assert_eq!(e.column, Some(1));
        assert!(
            e.to_string().starts_with(
                "line 19, column 1: layers[3] (\"conv2\"): unknown key \"kernal\" (allowed: name, type, inputs, trainable, update, out, kernel, stride, padding, groups, bias, scale_width)"
            ),
            "{e}"
        );
        // A key of another layer type.
        assert_eq!(
            err_body(&with("[[layers]]\ntype = \"relu\"\nout = 3\n")),
            "layers[0] (\"relu0\"): unknown key \"out\" (allowed: name, type, inputs, trainable)"
        );
        // Adam-only key on SGD.
        assert!(err_body(
            "[model]\ninput=[1]\nloss=\"mse\"\n[optimizer]\ntype=\"sgd\"\nlr=0.1\nbeta1=0.9\n[[layers]]\ntype=\"relu\"\n"
        )
        .starts_with("optimizer: unknown key \"beta1\""));
        assert!(
            err_body(&format!("{HEAD}[[layers]]\ntype=\"relu\"\n[extra]\n"))
                .starts_with("unknown key \"extra\"")
        );
        assert!(err_body(&HEAD.replace("loss", "seed = 1\nlosss = 1\nloss"))
            .starts_with("model: unknown key \"losss\""));
        assert!(
            err_body(&with("[[layers]]\ntype=\"relu\"\n[train]\nbatchsize = 3\n"))
                .starts_with("train: unknown key \"batchsize\"")
        );
        assert!(err_body(&with(
            "[[layers]]\ntype=\"relu\"\n[train]\ndataset = { csv = \"a\", idx_labels = \"b\" }\n"
        ))
        .starts_with("train.dataset: unknown key \"idx_labels\""));
    }

    #[test]
    fn unknown_values_are_named() {
        assert_eq!(
            err_body(&with("[[layers]]\ntype = \"conv3d\"\n")),
            "layers[0].type: unknown value \"conv3d\" (known: linear, conv2d, maxpool2d, avgpool2d, \
             global_avgpool, relu, relu6, sigmoid, tanh, flatten, reshape, add, batchnorm2d, dropout, \
             embedding, pos_embedding, layernorm, rmsnorm, gelu, silu, attention, lora_linear, \
             inverted_residual, lstm, gru)"
        );
        assert!(err_body(&HEAD.replace("cross_entropy", "hinge"))
            .starts_with("model.loss: unknown value \"hinge\""));
        assert!(err_body(&HEAD.replace("adam", "nadam"))
            .starts_with("optimizer.type: unknown value \"nadam\""));
        assert!(err_body(&with(
            "[[layers]]\ntype=\"relu\"\n[train]\ndataset = \"mnist\"\n"
        ))
        .starts_with("train.dataset: unknown value \"mnist\""));
        assert!(
            err_body(&with("[[layers]]\ntype=\"relu\"\n[train]\ndataset = {}\n"))
                .starts_with("train.dataset: a dataset table needs")
        );
    }

    #[test]
    fn names_and_inputs() {
        let dup = err_body(&with(
            "[[layers]]\nname = \"a\"\ntype = \"relu\"\n[[layers]]\nname = \"a\"\ntype = \"relu\"\n",
        ));
        assert_eq!(
            dup,
            "layers[1] (\"a\").name: duplicate layer name \"a\" (already used by layers[0])"
        );
        // An explicit name that equals a later default name.
        let dup = err_body(&with(
            "[[layers]]\nname = \"relu1\"\ntype = \"relu\"\n[[layers]]\ntype = \"relu\"\n",
        ));
        assert!(dup.contains("duplicate layer name \"relu1\""), "{dup}");
        assert_eq!(
            err_body(&with("[[layers]]\ntype = \"relu\"\ninputs = [\"nope\"]\n")),
            "layers[0] (\"relu0\").inputs: input \"nope\" is neither \"input\" nor the name of a layer"
        );
        assert_eq!(
            err_body(&with("[[layers]]\ntype = \"relu\"\ninputs = [\"b\"]\n[[layers]]\nname = \"b\"\ntype = \"relu\"\n")),
            "layers[0] (\"relu0\").inputs: input \"b\" is layers[1], which does not come before this layer (inputs must name earlier layers)"
        );
        assert!(err_body(&with(
            "[[layers]]\nname = \"s\"\ntype = \"relu\"\ninputs = [\"s\"]\n"
        ))
        .contains("input \"s\" is layers[0], which does not come before"));
        assert_eq!(
            err_body(&with(
                "[[layers]]\ntype = \"relu\"\n[[layers]]\ntype = \"add\"\ninputs = [\"relu0\"]\n"
            )),
            "layers[1] (\"add1\").inputs: takes exactly 2 input(s), got 1"
        );
        assert!(err_body(&with("[[layers]]\ntype = \"add\"\n"))
            .starts_with("layers[0] (\"add0\").inputs: add needs inputs = [a, b]"));
        assert!(err_body(&with(
            "[[layers]]\ntype = \"relu\"\ninputs = [\"input\", \"input\"]\n"
        ))
        .contains("takes exactly 1 input(s), got 2"));
        assert!(
            err_body(&with("[[layers]]\nname = \"input\"\ntype = \"relu\"\n"))
                .contains("the name \"input\" is reserved")
        );
        assert!(
            err_body(&with("[[layers]]\nname = \"\"\ntype = \"relu\"\n"))
                .contains("must be non-empty")
        );
        assert!(
            err_body(&with("[[layers]]\ntype = \"relu\"\ninputs = \"input\"\n")).contains(
                "inputs: invalid type: string \"input\", expected an array of layer names"
            )
        );
        assert!(
            err_body(&with("[[layers]]\ntype = \"relu\"\ninputs = [3]\n"))
                .contains("inputs: invalid type: integer `3`, expected a string")
        );
    }

    /// `inverted_residual` writes out MobileNetV2's blocks; `width` scales conv2d and block channels.
    #[test]
    fn inverted_residual_and_width() {
        let text = "[model]\ninput = [3, 8, 8]\nloss = \"cross_entropy\"\nwidth = 0.5\n\n\
            [optimizer]\ntype = \"sgd\"\nlr = 0.1\n\n\
            [[layers]]\nname = \"stem\"\ntype = \"conv2d\"\nout = 32\nkernel = 3\npadding = 1\nbias = false\n\
            [[layers]]\nname = \"a\"\ntype = \"inverted_residual\"\nexpand = 1\nout = 16\n\
            [[layers]]\nname = \"b\"\ntype = \"inverted_residual\"\nexpand = 6\nout = 16\nrepeat = 2\nstride = 2\n\
            [[layers]]\nname = \"head\"\ntype = \"conv2d\"\nout = 20\nkernel = 1\nscale_width = false\ninputs = [\"b\"]\n";
        let m = parse_model(text).unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<&str> = m.spec.layers.iter().map(|l| l.name.as_str()).collect();
        #[rustfmt::skip]
        assert_eq!(names, [
            "stem",
            "a_0_dw", "a_0_dw_bn", "a_0_dw_relu", "a_0_project", "a_0_project_bn",
            "b_0_expand", "b_0_expand_bn", "b_0_expand_relu", "b_0_dw", "b_0_dw_bn", "b_0_dw_relu",
            "b_0_project", "b_0_project_bn",
            "b_1_expand", "b_1_expand_bn", "b_1_expand_relu", "b_1_dw", "b_1_dw_bn", "b_1_dw_relu",
            "b_1_project", "b_1_project_bn", "b_1_add",
            "head",
        ]);
        let l = |n: &str| m.spec.layers.iter().find(|l| l.name == n).unwrap();
        let at = |n: &str| Src::Layer(names.iter().position(|x| *x == n).unwrap() as u32);
        let conv = |n: &str| match l(n).kind {
            LayerKind::Conv2d {
                out,
                kernel,
                stride,
                padding,
                groups,
                bias,
            } => {
                assert!(!bias || n == "head", "{n} has a bias");
                (out, kernel[0], stride[0], padding[0], groups)
            }
            ref k => panic!("{n} is {k:?}"),
        };
        // width 0.5: stem 32 → 16; block outs 16 → 8; the head keeps 20.
        assert_eq!(conv("stem"), (16, 3, 1, 1, 1));
        // Expand 1: no expansion conv; a 16-channel input into 8 channels: no residual.
        assert_eq!(conv("a_0_dw"), (16, 3, 1, 1, 16));
        assert_eq!(conv("a_0_project"), (8, 1, 1, 0, 1));
        assert_eq!(l("a_0_dw").inputs, [at("stem")]);
        // Stride 2 in the first block only; hidden = 6 × the block's input channels.
        assert_eq!(conv("b_0_expand"), (48, 1, 1, 0, 1));
        assert_eq!(conv("b_0_dw"), (48, 3, 2, 1, 48));
        assert_eq!(conv("b_1_dw"), (48, 3, 1, 1, 48));
        assert_eq!(l("b_0_expand").inputs, [at("a_0_project_bn")]);
        assert_eq!(l("b_1_expand").inputs, [at("b_0_project_bn")]);
        assert_eq!(
            l("b_1_add").inputs,
            [at("b_0_project_bn"), at("b_1_project_bn")]
        );
        assert_eq!(l("b_1_expand_relu").kind, LayerKind::Relu6);
        assert!(matches!(
            l("b_1_project_bn").kind,
            LayerKind::BatchNorm2d { .. }
        ));
        // The entry's name is its last block's output.
        assert_eq!(l("head").inputs, [at("b_1_add")]);
        assert_eq!(conv("head"), (20, 1, 1, 0, 1));
        // The same blocks realise: 3×8×8 → 8×4×4.
        let g = Graph::new(&m.spec, 2).unwrap();
        assert_eq!(g.pred_dims(), Dims::new(20, 4, 4));

        // Without width nothing is scaled (an out of 10 stays 10).
        let plain = with("[[layers]]\ntype = \"conv2d\"\nout = 10\nkernel = 1\n");
        assert!(matches!(
            parse_model(&plain).unwrap().spec.layers[0].kind,
            LayerKind::Conv2d { out: 10, .. }
        ));

        let ir = |keys: &str| {
            with(&format!(
                "[[layers]]\nname = \"b\"\ntype = \"inverted_residual\"\n{keys}"
            ))
        };
        assert!(
            err_body(&ir("out = 8\n")).contains("missing key \"expand\""),
            "{}",
            err_body(&ir("out = 8\n"))
        );
        assert!(err_body(&ir("expand = 6\n")).contains("missing key \"out\""));
        assert!(err_body(&ir("expand = 0\nout = 8\n"))
            .contains("expand: must be an integer in [1, 65536], got 0"));
        assert!(err_body(&ir("expand = 6\nout = 8\nrepeat = 0\n"))
            .contains("repeat: must be an integer in [1, 65536], got 0"));
        assert!(
            err_body(&ir("expand = 6\nout = 8\nkernel = 3\n")).contains("unknown key \"kernel\"")
        );
        assert!(err_body(&with("[[layers]]\ntype = \"relu\"\nexpand = 2\n"))
            .contains("unknown key \"expand\""));
        assert!(err_body(&with(
            "[[layers]]\ntype = \"linear\"\nout = 2\nscale_width = false\n"
        ))
        .contains("unknown key \"scale_width\""));
        // A generated name that another layer has.
        let clash = with("[[layers]]\nname = \"b_0_dw\"\ntype = \"relu\"\n[[layers]]\nname = \"b\"\ntype = \"inverted_residual\"\nexpand = 1\nout = 8\n");
        assert!(
            err_body(&clash).contains("has the name of another layer"),
            "{}",
            err_body(&clash)
        );
        // Its input must realise (the hidden width depends on its channels).
        let bad_in = with("[[layers]]\ntype = \"conv2d\"\nout = 4\nkernel = 9\n[[layers]]\ntype = \"inverted_residual\"\nexpand = 6\nout = 8\n");
        assert!(
            err_body(&bad_in).contains("its input does not realise"),
            "{}",
            err_body(&bad_in)
        );
        // width: positive and finite; a depthwise conv whose groups no longer divide the scaled out.
        let w = |v: &str, rest: &str| {
            format!("[model]\ninput = [1, 8, 8]\nloss = \"mse\"\nwidth = {v}\n[optimizer]\ntype = \"sgd\"\nlr = 0.1\n{rest}")
        };
        let one = "[[layers]]\ntype = \"relu\"\n";
        assert!(err_body(&w("0", one)).contains("width: must be a finite number > 0"));
        assert!(err_body(&w("nan", one)).contains("width: must be a finite number > 0"));
        assert!(err_body(&w(
            "0.5",
            "[[layers]]\ntype = \"conv2d\"\nout = 32\nkernel = 3\ngroups = 32\n"
        ))
        .contains("does not divide out = 16 (after the width multiplier)"));
    }

    #[test]
    fn sparse_updates_parse_and_bad_ones_are_named() {
        let conv = "type = \"conv2d\"\nout = 4\nkernel = 3\npadding = 1";
        let one = |extra: &str| {
            parse_model(&with(&format!("[[layers]]\n{conv}\n{extra}\n")))
                .map(|m| (m.spec.layers[0].trainable, m.spec.layers[0].update))
        };
        assert_eq!(one("").unwrap(), (true, Update::All));
        assert_eq!(one("update = \"all\"").unwrap(), (true, Update::All));
        assert_eq!(one("update = \"frozen\"").unwrap(), (false, Update::All));
        assert_eq!(one("update = \"bias\"").unwrap(), (true, Update::Bias));
        assert_eq!(
            one("update = { channels = 0.25 }").unwrap(),
            (true, Update::Channels(0.25))
        );
        let err = |extra: &str| one(extra).unwrap_err().to_string();
        assert!(
            err("update = \"some\"")
                .contains("layers[0] (\"conv2d0\").update: unknown value \"some\""),
            "{}",
            err("update = \"some\"")
        );
        for bad in ["0", "0.0", "1.5", "-0.25"] {
            let e = err(&format!("update = {{ channels = {bad} }}"));
            assert!(e.contains("update: must be in (0, 1]"), "{e}");
        }
        let e = err("trainable = false\nupdate = \"bias\"");
        assert!(e.contains("contradicts trainable = false"), "{e}");
        // The key exists only for layers with parameters.
        let e = err_body(&with("[[layers]]\ntype = \"relu\"\nupdate = \"bias\"\n"));
        assert!(e.contains("unknown key \"update\""), "{e}");
    }

    #[test]
    fn ranges_are_checked() {
        let layer = |body: &str| err_body(&with(&format!("[[layers]]\n{body}\n")));
        assert_eq!(
            layer("type = \"linear\"\nout = 0"),
            "layers[0] (\"linear0\").out: must be a positive integer, got 0"
        );
        assert!(layer("type = \"linear\"\nout = -3")
            .contains("out: must be a positive integer, got -3"));
        assert!(layer("type = \"linear\"\nout = 4294967296")
            .contains("out: must be a positive integer"));
        assert!(layer("type = \"linear\"").contains("layers[0] (\"linear0\"): missing key \"out\""));
        assert!(layer("type = \"conv2d\"\nout = 2\nkernel = [3, 0]")
            .contains("kernel: must be a positive integer or [h, w], got 0"));
        assert!(layer("type = \"conv2d\"\nout = 2\nkernel = [3, 3, 3]")
            .contains("kernel: expected [h, w], got 3 elements"));
        assert!(layer("type = \"conv2d\"\nout = 2\nkernel = 3\nstride = 0")
            .contains("stride: must be a positive integer"));
        assert!(
            layer("type = \"conv2d\"\nout = 2\nkernel = 3\npadding = -1")
                .contains("padding: must be a non-negative integer")
        );
        assert!(layer("type = \"conv2d\"\nout = 6\nkernel = 3\ngroups = 4")
            .contains("groups: groups = 4 does not divide out = 6"));
        assert!(layer("type = \"conv2d\"\nout = \"8\"\nkernel = 3")
            .contains("out: invalid type: string \"8\", expected an integer"));
        assert!(layer("type = \"linear\"\nout = 2\nbias = 1")
            .contains("bias: invalid type: integer `1`, expected a boolean"));
        assert!(layer("type = \"maxpool2d\"").contains("missing key \"kernel\""));
        assert_eq!(
            layer("type = \"dropout\"\np = 1.0"),
            "layers[0] (\"dropout0\").p: must be in [0, 1), got 1.0"
        );
        assert!(layer("type = \"dropout\"\np = -0.1").contains("p: must be in [0, 1), got -0.1"));
        assert!(layer("type = \"dropout\"\np = nan").contains("p: must be in [0, 1), got nan"));
        assert!(
            layer("type = \"batchnorm2d\"\neps = 0").contains("eps: must be a finite number > 0")
        );
        assert!(
            layer("type = \"batchnorm2d\"\nmomentum = 1.5").contains("momentum: must be in [0, 1]")
        );
        assert!(layer("type = \"reshape\"\nto = [2, 0, 1]")
            .contains("to: must be a positive integer, got 0"));
        assert!(layer("type = \"reshape\"\nto = [2, 2]")
            .contains("to: expected [C, H, W] or [F], got 2 elements"));
        assert!(layer("type = \"relu\"\ntrainable = \"no\"")
            .contains("trainable: invalid type: string \"no\", expected a boolean"));

        let opt = |lr: &str| {
            err_body(
                &HEAD
                    .replace("lr = 0.001", lr)
                    .replace("[optimizer]", "[[layers]]\ntype=\"relu\"\n[optimizer]"),
            )
        };
        assert_eq!(
            opt("lr = 0"),
            "optimizer.lr: must be a finite number > 0, got 0"
        );
        assert!(opt("lr = -0.1").contains("optimizer.lr: must be a finite number > 0, got -0.1"));
        assert!(opt("lr = inf").contains("optimizer.lr: must be a finite number > 0, got inf"));
        assert!(opt("lr = nan").contains("optimizer.lr: must be a finite number > 0, got nan"));
        assert!(
            opt("lr = 1e39").contains("optimizer.lr: must be a finite number > 0"),
            "overflows f32"
        );
        assert!(
            opt("lr = 1e-50").contains("optimizer.lr: must be a finite number > 0"),
            "underflows f32"
        );
        assert!(opt("lr = \"fast\"")
            .contains("optimizer.lr: invalid type: string \"fast\", expected a number"));
        assert!(opt("beta1 = 1.0\nlr = 0.1").contains("optimizer.beta1: must be in [0, 1)"));
        assert!(opt("weight_decay = -1\nlr = 0.1")
            .contains("optimizer.weight_decay: must be a finite number ≥ 0"));
        assert!(
            err_body(&with("[[layers]]\ntype=\"relu\"\n").replace("lr = 0.001\n", ""))
                .starts_with("optimizer: missing key \"lr\"")
        );

        let model = |input: &str| {
            err_body(&with("[[layers]]\ntype=\"relu\"\n").replace("input = [1, 8, 8]", input))
        };
        assert!(
            model("input = [0, 8, 8]").contains("model.input: must be a positive integer, got 0")
        );
        assert!(model("input = [1, 8]")
            .contains("model.input: expected [C, H, W] or [F], got 2 elements"));
        assert!(model("input = []").contains("got 0 elements"));
        assert!(model("input = 64").contains(
            "model.input: invalid type: integer `64`, expected [C, H, W] or [F] of positive integers"
        ));
        assert!(model("input = [65536, 65536, 2]").contains("more than 2^32 - 1 elements"));
        assert!(model("input = [1]\nseed = -1")
            .contains("model.seed: must be a non-negative integer, got -1"));

        let train =
            |t: &str| err_body(&with(&format!("[[layers]]\ntype=\"relu\"\n[train]\n{t}\n")));
        assert!(train("batch = 0").contains("train.batch: must be a positive integer, got 0"));
        assert!(train("epochs = 1.5")
            .contains("train.epochs: invalid type: floating point `1.5`, expected an integer"));
        assert!(train("weights = 3")
            .contains("train.weights: invalid type: integer `3`, expected a string"));
        assert!(train("weights = \"\"").contains("train.weights: empty path"));
        assert!(train("dataset = { csv = \"a.csv\", label_column = -1 }")
            .contains("train.dataset.label_column: must be a non-negative integer"));
        assert!(train("dataset = { idx_images = \"a\" }")
            .contains("train.dataset: missing key \"idx_labels\""));
    }

    /// serde's errors (wrong TOML types, keys no table of that kind takes) get the same position and
    /// field path as the checks in code, and unknown keys list what this layer or optimizer type takes.
    #[test]
    fn serde_errors_name_the_field() {
        let layer = |body: &str| err(&with(&format!("[[layers]]\n{body}\n")));
        assert_eq!(
            layer("type = \"conv2d\"\nout = 4\nkernel = [1, \"a\"]"),
            "line 12, column 14: layers[0] (\"conv2d0\").kernel: invalid type: string \"a\", expected an integer"
        );
        assert_eq!(
            layer("type = \"conv2d\"\nout = 4\nkernel = { h = 1 }"),
            "line 12, column 10: layers[0] (\"conv2d0\").kernel: invalid type: map, expected an integer or [h, w]"
        );
        assert_eq!(
            layer("type = \"relu\"\nstart = 1979-05-27"),
            "line 11, column 1: layers[0] (\"relu0\"): unknown key \"start\" (allowed: name, type, inputs, trainable)"
        );
        assert!(layer("type = \"linear\"\nout = 99999999999999999999")
            .contains("out: must be a positive integer, got 99999999999999999999"));
        assert_eq!(
            err(&with("[[layers]]\ntype = \"relu\"\n[optimizer.x]\n")),
            "line 11, column 12: optimizer: unknown key \"x\" (allowed: type, lr, beta1, beta2, eps, weight_decay)"
        );
        assert_eq!(
            err(&with("[[layers]]\ntype = \"relu\"\n[train]\ndataset = { foo = 1 }\n")),
            "line 12, column 13: train.dataset: unknown key \"foo\" (allowed: csv, label_column, idx_images, idx_labels, text)"
        );
        assert_eq!(
            err(&with("[[layers]]\ntype = \"relu\"\n[train]\ndataset = 3\n")),
            "line 12, column 11: train.dataset: invalid type: integer `3`, expected \"digits\", { idx_images, idx_labels } or { csv, label_column }"
        );
        // The second of two layers, with a name: the path names it.
        assert_eq!(
            err(&with("[[layers]]\ntype = \"relu\"\n[[layers]]\nname = \"c\"\ntype = \"conv2d\"\nout = 2.0\n")),
            "line 14, column 7: layers[1] (\"c\").out: invalid type: floating point `2.0`, expected an integer"
        );
    }

    #[test]
    fn structure_errors() {
        assert_eq!(
            err("[optimizer]\ntype=\"sgd\"\nlr=1\n[[layers]]\ntype=\"relu\"\n"),
            "line 1, column 1: missing section [model]"
        );
        assert!(
            err("[model]\ninput=[1]\nloss=\"mse\"\n[[layers]]\ntype=\"relu\"\n")
                .contains("missing section [optimizer]")
        );
        assert!(err(HEAD).contains("layers: no [[layers]]: a model needs at least one layer"));
        assert!(err(&format!("layers = []\n{HEAD}"))
            .contains("layers: a model needs at least one layer"));
        assert!(err(&format!("layers = 3\n{HEAD}")).contains(
            "layers: invalid type: integer `3`, expected an array of tables ([[layers]])"
        ));
        assert!(err(&format!("layers = [1]\n{HEAD}"))
            .contains("layers[0]: invalid type: integer `1`, expected a table"));
        assert!(err("model = 3\n").contains("model: invalid type: integer `3`, expected a table"));
        assert!(err(&HEAD.replace("loss = \"cross_entropy\"\n", ""))
            .contains("model: missing key \"loss\""));
        assert!(err(&with("[[layers]]\nname = \"x\"\n"))
            .contains("layers[0] (\"x\"): missing key \"type\""));
        assert!(err(&with("[[layers]]\ntype = 3\n"))
            .contains("layers[0].type: invalid type: integer `3`, expected a string"));
    }

    #[test]
    fn syntax_errors_have_positions() {
        let e = parse_model("[model]\ninput = [1, 8, 8\nloss = 3\n").unwrap_err();
        assert!(matches!(e.kind, SpecErrorKind::Syntax(_)), "{e:?}");
        assert!(e.line.is_some());
        assert!(e.to_string().contains("TOML syntax error"), "{e}");
        let e = parse_model("[model]\ninput = [1]\ninput = [2]\n").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
    }

    #[test]
    fn load_model_names_the_file_and_resolves_paths() {
        let d = scratch_dir("spec");
        let p = d.join("m.toml");
        std::fs::write(
            &p,
            with("[[layers]]\ntype = \"relu\"\n[train]\nweights = \"w.safetensors\"\ndataset = { idx_images = \"i.idx\", idx_labels = \"/abs/l.idx\" }\n"),
        )
        .unwrap();
        let m = load_model(&p).unwrap();
        assert_eq!(m.train.weights, Some(d.join("w.safetensors")));
        assert_eq!(
            m.train.dataset,
            Some(DatasetSource::Idx {
                images: d.join("i.idx"),
                labels: "/abs/l.idx".into()
            })
        );
        std::fs::write(
            &p,
            with("[[layers]]\ntype = \"relu\"\n[train]\ndataset = { csv = \"x/d.csv\" }\n"),
        )
        .unwrap();
        assert_eq!(
            load_model(&p).unwrap().train.dataset,
            Some(DatasetSource::Csv {
                path: d.join("x/d.csv"),
                label_column: 0
            })
        );
        std::fs::write(&p, with("[[layers]]\ntype = \"relu\"\nout = 1\n")).unwrap();
        let e = load_model(&p).unwrap_err().to_string();
        assert_eq!(
            e,
            format!("{}:11:1: layers[0] (\"relu0\"): unknown key \"out\" (allowed: name, type, inputs, trainable)", p.display())
        );
        let e = load_model(&d.join("missing.toml")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("{}: ", d.join("missing.toml").display())),
            "{e}"
        );
        assert!(matches!(e.kind, SpecErrorKind::Io(_)));
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn examples_and_docs_parse() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut n = 0;
        if let Ok(dir) = std::fs::read_dir(root.join("examples")) {
            for entry in dir {
                let p = entry.unwrap().path();
                if p.extension().is_some_and(|e| e == "toml") {
                    load_model(&p).unwrap_or_else(|e| panic!("{e}"));
                    n += 1;
                }
            }
        }
        // The example in docs/model-format.md, with its first layer completed.
        if let Ok(doc) = std::fs::read_to_string(root.join("docs/model-format.md")) {
            let block = doc
                .split("```toml\n")
                .nth(1)
                .unwrap()
                .split("```")
                .next()
                .unwrap();
            let m = parse_model(block).unwrap_or_else(|e| panic!("docs example: {e}"));
            assert_eq!(m.spec.layers[0].name, "conv1");
            n += 1;
        }
        assert!(n > 0, "nothing to check");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn fuzz_random_text(text in "\\PC{0,200}") {
            let _ = parse_model(&text);
        }

        #[test]
        fn fuzz_tomlish_text(text in "(\\[\\[?(model|optimizer|layers|train)\\]\\]?\n|(input|type|name|out|kernel|inputs|lr|p|to|dataset|loss|groups) = (\"(relu|add|conv2d|linear|sgd|adam|mse|digits|input|relu0)\"|-?[0-9]{1,11}|[0-9]\\.[0-9]e-?[0-9]{1,2}|nan|inf|true|\\[[0-9, \"a-z]{0,12}\\]|\\{ csv = \"a\" \\})\n){0,24}") {
            let _ = parse_model(&text);
        }

        #[test]
        fn fuzz_mutations(muts in proptest::collection::vec((0u8..3, any::<usize>(), any::<u8>()), 1..8)) {
            let bytes = mutate(FULL.as_bytes().to_vec(), &muts);
            let _ = parse_model(&String::from_utf8_lossy(&bytes));
        }
    }
}
