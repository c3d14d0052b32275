//! The TOML model description (`docs/model-format.md`) → [`ModelSpec`] + [`TrainConfig`].
//!
//! The document is walked by hand over toml's spanned tree (not deserialised into structs) so that
//! every error carries a line and column, names the field (`layers[3] ("conv2").kernel`) and says
//! what is wrong; unknown keys are rejected per layer type.
use std::fmt;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};

use frugal_core::model::{Dims, LayerKind, LayerSpec, LossKind, ModelSpec, OptimizerSpec, Src};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// A parsed model file: the network and how the CLI trains it.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelFile {
    /// The network, loss, optimizer and seed.
    pub spec: ModelSpec,
    /// The `[train]` section (all fields absent when there is none).
    pub train: TrainConfig,
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
    pub line: Option<usize>,
    /// 1-based column (in characters).
    pub column: Option<usize>,
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
        allowed: Vec<&'static str>,
    },
    /// A required key is absent.
    Missing(&'static str),
    /// A value of the wrong TOML type.
    WrongType {
        /// What was expected, e.g. `"a positive integer or [h, w]"`.
        expected: &'static str,
        /// The TOML type found, e.g. `"string"`.
        found: &'static str,
    },
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
            SpecErrorKind::WrongType { expected, found } => {
                write!(f, "expected {expected}, found {found}")
            }
            SpecErrorKind::UnknownValue { value, known } => {
                write!(f, "unknown value \"{value}\" (known: {})", known.join(", "))
            }
            SpecErrorKind::OutOfRange { value, must_be } => {
                write!(f, "must be {must_be}, got {value}")
            }
            SpecErrorKind::DuplicateName { name, first } => {
                write!(f, "duplicate layer name \"{name}\" (already used by layers[{first}])")
            }
            SpecErrorKind::UnknownInput(name) => {
                write!(f, "input \"{name}\" is neither \"input\" nor the name of a layer")
            }
            SpecErrorKind::LaterInput { name, index } => write!(
                f,
                "input \"{name}\" is layers[{index}], which does not come before this layer \
                 (inputs must name earlier layers)"
            ),
            SpecErrorKind::InputCount { expected, found } => {
                write!(f, "takes exactly {expected} input(s), got {found}")
            }
            SpecErrorKind::Invalid(m) => write!(f, "{m}"),
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
        Some(DatasetSource::Csv { path, .. }) => resolve(path),
        Some(DatasetSource::Digits) | None => {}
    }
    Ok(model)
}

/// Parses a model description. Paths in `[train]` are returned as written. Never panics.
pub fn parse_model(text: &str) -> Result<ModelFile, SpecError> {
    let cx = Cx { text };
    let doc = DeTable::parse(text).map_err(|e| {
        let (line, column) = e.span().map_or((None, None), |s| {
            let (l, c) = cx.pos(s.start);
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
    let root = Tbl {
        cx: &cx,
        t: doc.get_ref(),
        path: String::new(),
        span: doc.span(),
    };
    root.check_keys(&["model", "optimizer", "layers", "train"])?;

    let model = root.req_table("model")?;
    model.check_keys(&["input", "seed", "loss"])?;
    let input = model.req_dims("input")?;
    let seed = model.opt_int("seed", 0, i64::MAX as u128, "a non-negative integer")?;
    let loss = match model.req_enum("loss", &["cross_entropy", "mse"])? {
        0 => LossKind::SoftmaxCrossEntropy,
        _ => LossKind::Mse,
    };

    let optimizer = parse_optimizer(&root.req_table("optimizer")?)?;
    let layers = parse_layers(&root)?;
    let train = match root.opt_table("train")? {
        Some(t) => parse_train(&t)?,
        None => TrainConfig::default(),
    };
    Ok(ModelFile {
        spec: ModelSpec {
            input,
            layers,
            loss,
            optimizer,
            seed: seed.unwrap_or(0) as u64,
        },
        train,
    })
}

fn parse_optimizer(t: &Tbl<'_, '_>) -> Result<OptimizerSpec, SpecError> {
    const ADAM: &[&str] = &["type", "lr", "beta1", "beta2", "eps", "weight_decay"];
    const SGD: &[&str] = &["type", "lr", "momentum", "weight_decay"];
    let adam = t.req_enum("type", &["adam", "sgd"])? == 0;
    t.check_keys(if adam { ADAM } else { SGD })?;
    let lr = t
        .req_float("lr", Range::Positive)?
        .expect("required");
    let wd = t.opt_float("weight_decay", Range::NonNegative)?.unwrap_or(0.0);
    Ok(if adam {
        OptimizerSpec::Adam {
            lr,
            beta1: t.opt_float("beta1", Range::UnitOpen)?.unwrap_or(0.9),
            beta2: t.opt_float("beta2", Range::UnitOpen)?.unwrap_or(0.999),
            eps: t.opt_float("eps", Range::Positive)?.unwrap_or(1e-8),
            weight_decay: wd,
        }
    } else {
        OptimizerSpec::Sgd {
            lr,
            momentum: t.opt_float("momentum", Range::UnitOpen)?.unwrap_or(0.0),
            weight_decay: wd,
        }
    })
}

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
];

/// Keys every layer takes, then the keys specific to each type.
const COMMON_KEYS: &[&str] = &["name", "type", "inputs", "trainable"];

fn type_keys(ty: &str) -> &'static [&'static str] {
    match ty {
        "linear" => &["out", "bias"],
        "conv2d" => &["out", "kernel", "stride", "padding", "groups", "bias"],
        "maxpool2d" | "avgpool2d" => &["kernel", "stride"],
        "reshape" => &["to"],
        "batchnorm2d" => &["eps", "momentum"],
        "dropout" => &["p"],
        _ => &[],
    }
}

fn parse_layers(root: &Tbl<'_, '_>) -> Result<Vec<LayerSpec>, SpecError> {
    let Some(list) = root.get("layers") else {
        return Err(root.err(
            root.span.start..root.span.start,
            "layers",
            SpecErrorKind::Invalid("no [[layers]]: a model needs at least one layer".into()),
        ));
    };
    let DeValue::Array(items) = list.get_ref() else {
        return Err(root.wrong_type(list, "layers", "an array of tables ([[layers]])"));
    };
    if items.is_empty() {
        return Err(root.err(
            list.span(),
            "layers",
            SpecErrorKind::Invalid("a model needs at least one layer".into()),
        ));
    }
    // Every layer's name as far as it can be told up front, to tell forward references from typos.
    let all_names: Vec<Option<String>> = items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let t = item.get_ref().as_table()?;
            let get = |k: &str| t.iter().find(|(key, _)| key.get_ref() == k).map(|(_, v)| v);
            match get("name").map(|v| v.get_ref()) {
                Some(DeValue::String(n)) => Some(n.to_string()),
                Some(_) => None,
                None => get("type")?.get_ref().as_str().map(|ty| format!("{ty}{i}")),
            }
        })
        .collect();
    let mut names: Vec<String> = Vec::with_capacity(items.len());
    let mut layers = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let DeValue::Table(t) = item.get_ref() else {
            return Err(root.wrong_type(item, &format!("layers[{i}]"), "a table"));
        };
        let mut lt = Tbl {
            cx: root.cx,
            t,
            path: format!("layers[{i}]"),
            span: item.span(),
        };
        let ty_idx = lt.req_enum("type", LAYER_TYPES)?;
        let ty = LAYER_TYPES[ty_idx];
        let name = match lt.get("name") {
            Some(v) => {
                let n = lt.str_of(v, "name")?;
                if n.is_empty() || n.trim() != n || n.chars().any(char::is_control) {
                    return Err(lt.err(
                        v.span(),
                        "name",
                        SpecErrorKind::Invalid(format!(
                            "layer name \"{n}\" must be non-empty, without surrounding spaces or control characters"
                        )),
                    ));
                }
                if n == "input" {
                    return Err(lt.err(
                        v.span(),
                        "name",
                        SpecErrorKind::Invalid(
                            "the name \"input\" is reserved for the model input".into(),
                        ),
                    ));
                }
                n.to_string()
            }
            None => format!("{ty}{i}"),
        };
        lt.path = format!("layers[{i}] (\"{name}\")");
        let allowed: Vec<&'static str> = COMMON_KEYS.iter().chain(type_keys(ty)).copied().collect();
        lt.check_keys(&allowed)?;
        if let Some(first) = names.iter().position(|n| *n == name) {
            let span = lt.get("name").map_or(item.span(), |v| v.span());
            return Err(lt.err(
                span,
                "name",
                SpecErrorKind::DuplicateName {
                    name: name.clone(),
                    first,
                },
            ));
        }

        let kind = parse_kind(&lt, ty)?;
        let inputs = parse_inputs(&lt, i, &names, &all_names, ty)?;
        let trainable = lt.opt_bool("trainable")?.unwrap_or(true);
        names.push(name.clone());
        layers.push(LayerSpec {
            name,
            kind,
            inputs,
            trainable,
        });
    }
    Ok(layers)
}

fn parse_kind(t: &Tbl<'_, '_>, ty: &str) -> Result<LayerKind, SpecError> {
    let size = |key: &'static str| -> Result<u32, SpecError> {
        Ok(t.req_int(key, 1, u32::MAX as u128, "a positive integer")? as u32)
    };
    let bias = || Ok::<bool, SpecError>(t.opt_bool("bias")?.unwrap_or(true));
    Ok(match ty {
        "linear" => LayerKind::Linear {
            out: size("out")?,
            bias: bias()?,
        },
        "conv2d" => {
            let out = size("out")?;
            let kernel = t.req_pair("kernel", 1)?;
            let groups = t
                .opt_int("groups", 1, u32::MAX as u128, "a positive integer")?
                .unwrap_or(1) as u32;
            if out % groups != 0 {
                let span = t.get("groups").map_or(t.span.clone(), |v| v.span());
                return Err(t.err(
                    span,
                    "groups",
                    SpecErrorKind::Invalid(format!(
                        "groups = {groups} does not divide out = {out}"
                    )),
                ));
            }
            LayerKind::Conv2d {
                out,
                kernel,
                stride: t.opt_pair("stride", 1)?.unwrap_or([1, 1]),
                padding: t.opt_pair("padding", 0)?.unwrap_or([0, 0]),
                groups,
                bias: bias()?,
            }
        }
        "maxpool2d" | "avgpool2d" => {
            let kernel = t.req_pair("kernel", 1)?;
            let stride = t.opt_pair("stride", 1)?.unwrap_or(kernel);
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
            to: t.req_dims("to")?,
        },
        "add" => LayerKind::Add,
        "batchnorm2d" => LayerKind::BatchNorm2d {
            eps: t.opt_float("eps", Range::Positive)?.unwrap_or(1e-5),
            momentum: t.opt_float("momentum", Range::UnitClosed)?.unwrap_or(0.1),
        },
        "dropout" => LayerKind::Dropout {
            p: t.opt_float("p", Range::UnitOpen)?.unwrap_or(0.5),
        },
        _ => unreachable!("type checked against LAYER_TYPES"),
    })
}

fn parse_inputs(
    t: &Tbl<'_, '_>,
    index: usize,
    earlier: &[String],
    all: &[Option<String>],
    ty: &str,
) -> Result<Vec<Src>, SpecError> {
    let expected = if ty == "add" { 2 } else { 1 };
    let Some(v) = t.get("inputs") else {
        if expected != 1 {
            return Err(t.err(
                t.span.clone(),
                "inputs",
                SpecErrorKind::Invalid(format!(
                    "{ty} needs inputs = [a, b] naming its {expected} inputs"
                )),
            ));
        }
        return Ok(vec![if index == 0 {
            Src::Input
        } else {
            Src::Layer(index as u32 - 1)
        }]);
    };
    let DeValue::Array(items) = v.get_ref() else {
        return Err(t.wrong_type(v, "inputs", "an array of layer names"));
    };
    if items.len() != expected {
        return Err(t.err(
            v.span(),
            "inputs",
            SpecErrorKind::InputCount {
                expected,
                found: items.len(),
            },
        ));
    }
    let mut srcs = Vec::with_capacity(items.len());
    for item in items.iter() {
        let name = t.str_of(item, "inputs")?;
        if name == "input" {
            srcs.push(Src::Input);
        } else if let Some(j) = earlier.iter().position(|n| n == name) {
            srcs.push(Src::Layer(j as u32));
        } else {
            // Not earlier: a later layer (or itself) is a forward reference, otherwise unknown.
            let later = all.iter().position(|n| n.as_deref() == Some(name));
            let kind = match later {
                Some(j) => SpecErrorKind::LaterInput {
                    name: name.to_string(),
                    index: j,
                },
                None => SpecErrorKind::UnknownInput(name.to_string()),
            };
            return Err(t.err(item.span(), "inputs", kind));
        }
    }
    Ok(srcs)
}

fn parse_train(t: &Tbl<'_, '_>) -> Result<TrainConfig, SpecError> {
    t.check_keys(&["batch", "epochs", "dataset", "weights"])?;
    let batch = t.opt_int("batch", 1, u32::MAX as u128, "a positive integer")?;
    let epochs = t.opt_int("epochs", 1, u32::MAX as u128, "a positive integer")?;
    let dataset = match t.get("dataset") {
        None => None,
        Some(v) => Some(match v.get_ref() {
            DeValue::String(s) => {
                if s.as_ref() != "digits" {
                    return Err(t.err(
                        v.span(),
                        "dataset",
                        SpecErrorKind::UnknownValue {
                            value: s.to_string(),
                            known: &["digits", "{ idx_images, idx_labels }", "{ csv, label_column }"],
                        },
                    ));
                }
                DatasetSource::Digits
            }
            DeValue::Table(d) => {
                let dt = Tbl {
                    cx: t.cx,
                    t: d,
                    path: t.field("dataset"),
                    span: v.span(),
                };
                if dt.get("csv").is_some() {
                    dt.check_keys(&["csv", "label_column"])?;
                    DatasetSource::Csv {
                        path: dt.req_path("csv")?,
                        label_column: dt
                            .opt_int("label_column", 0, u32::MAX as u128, "a non-negative integer")?
                            .unwrap_or(0) as usize,
                    }
                } else if dt.get("idx_images").is_some() || dt.get("idx_labels").is_some() {
                    dt.check_keys(&["idx_images", "idx_labels"])?;
                    DatasetSource::Idx {
                        images: dt.req_path("idx_images")?,
                        labels: dt.req_path("idx_labels")?,
                    }
                } else {
                    return Err(t.err(
                        v.span(),
                        "dataset",
                        SpecErrorKind::Invalid(
                            "a dataset table needs either idx_images and idx_labels, or csv"
                                .into(),
                        ),
                    ));
                }
            }
            _ => {
                return Err(t.wrong_type(
                    v,
                    "dataset",
                    "\"digits\", { idx_images, idx_labels } or { csv, label_column }",
                ))
            }
        }),
    };
    let weights = match t.get("weights") {
        Some(_) => Some(t.req_path("weights")?),
        None => None,
    };
    Ok(TrainConfig {
        batch: batch.map(|b| b as u32),
        epochs: epochs.map(|e| e as u32),
        dataset,
        weights,
    })
}

/// Source text, for turning byte offsets into line/column.
struct Cx<'s> {
    text: &'s str,
}

impl Cx<'_> {
    fn pos(&self, offset: usize) -> (usize, usize) {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |p| p + 1);
        (line, before[line_start..].chars().count() + 1)
    }
}

/// Valid ranges for floating-point fields (all must also be finite).
#[derive(Clone, Copy)]
enum Range {
    /// > 0.
    Positive,
    /// ≥ 0.
    NonNegative,
    /// [0, 1).
    UnitOpen,
    /// [0, 1].
    UnitClosed,
}

impl Range {
    fn ok(self, v: f64) -> bool {
        v.is_finite()
            && match self {
                Range::Positive => v > 0.0 && (v as f32) > 0.0,
                Range::NonNegative => v >= 0.0,
                Range::UnitOpen => (0.0..1.0).contains(&v) && (v as f32) < 1.0,
                Range::UnitClosed => (0.0..=1.0).contains(&v),
            }
            && (v as f32).is_finite()
    }
    fn text(self) -> &'static str {
        match self {
            Range::Positive => "a finite number > 0",
            Range::NonNegative => "a finite number ≥ 0",
            Range::UnitOpen => "in [0, 1)",
            Range::UnitClosed => "in [0, 1]",
        }
    }
}

/// A table being read, with its path for messages.
struct Tbl<'a, 'i> {
    cx: &'a Cx<'a>,
    t: &'a DeTable<'i>,
    path: String,
    span: std::ops::Range<usize>,
}

impl<'a, 'i> Tbl<'a, 'i> {
    fn field(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn err(&self, span: std::ops::Range<usize>, key: &str, kind: SpecErrorKind) -> SpecError {
        let (line, column) = self.cx.pos(span.start);
        SpecError {
            file: None,
            line: Some(line),
            column: Some(column),
            field: if key.is_empty() {
                self.path.clone()
            } else {
                self.field(key)
            },
            kind,
        }
    }

    fn wrong_type(&self, v: &Spanned<DeValue<'_>>, key: &str, expected: &'static str) -> SpecError {
        self.err(
            v.span(),
            key,
            SpecErrorKind::WrongType {
                expected,
                found: v.get_ref().type_str(),
            },
        )
    }

    fn get(&self, key: &str) -> Option<&'a Spanned<DeValue<'i>>> {
        self.t
            .iter()
            .find(|(k, _)| k.get_ref().as_ref() == key)
            .map(|(_, v)| v)
    }

    /// Rejects the first (in source order) key not in `allowed`.
    fn check_keys(&self, allowed: &[&'static str]) -> Result<(), SpecError> {
        let bad = self
            .t
            .iter()
            .filter(|(k, _)| !allowed.contains(&k.get_ref().as_ref()))
            .min_by_key(|(k, _)| k.span().start);
        match bad {
            None => Ok(()),
            Some((k, _)) => Err(self.err(
                k.span(),
                "",
                SpecErrorKind::UnknownKey {
                    key: k.get_ref().to_string(),
                    allowed: allowed.to_vec(),
                },
            )),
        }
    }

    fn missing(&self, key: &'static str) -> SpecError {
        let mut e = self.err(self.span.clone(), "", SpecErrorKind::Missing(key));
        if self.path.is_empty() {
            e.field.clear();
        }
        e
    }

    fn opt_table(&self, key: &str) -> Result<Option<Tbl<'a, 'i>>, SpecError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.get_ref() {
                DeValue::Table(t) => Ok(Some(Tbl {
                    cx: self.cx,
                    t,
                    path: self.field(key),
                    span: v.span(),
                })),
                _ => Err(self.wrong_type(v, key, "a table")),
            },
        }
    }

    fn req_table(&self, key: &'static str) -> Result<Tbl<'a, 'i>, SpecError> {
        self.opt_table(key)?.ok_or_else(|| {
            let mut e = self.missing(key);
            e.kind = SpecErrorKind::Invalid(format!("missing section [{key}]"));
            e
        })
    }

    fn str_of<'v>(&self, v: &'v Spanned<DeValue<'i>>, key: &str) -> Result<&'v str, SpecError> {
        match v.get_ref() {
            DeValue::String(s) => Ok(s.as_ref()),
            _ => Err(self.wrong_type(v, key, "a string")),
        }
    }

    fn req_path(&self, key: &'static str) -> Result<PathBuf, SpecError> {
        let v = self.get(key).ok_or_else(|| self.missing(key))?;
        let s = self.str_of(v, key)?;
        if s.is_empty() {
            return Err(self.err(
                v.span(),
                key,
                SpecErrorKind::Invalid("empty path".into()),
            ));
        }
        Ok(PathBuf::from(s))
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>, SpecError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.get_ref() {
                DeValue::Boolean(b) => Ok(Some(*b)),
                _ => Err(self.wrong_type(v, key, "true or false")),
            },
        }
    }

    /// Index into `known` of the string value of a required key.
    fn req_enum(&self, key: &'static str, known: &'static [&'static str]) -> Result<usize, SpecError> {
        let v = self.get(key).ok_or_else(|| self.missing(key))?;
        let s = self.str_of(v, key)?;
        known.iter().position(|k| *k == s).ok_or_else(|| {
            self.err(
                v.span(),
                key,
                SpecErrorKind::UnknownValue {
                    value: s.to_string(),
                    known,
                },
            )
        })
    }

    /// An integer value in `[lo, hi]`.
    fn int_of(
        &self,
        v: &Spanned<DeValue<'_>>,
        key: &str,
        lo: u128,
        hi: u128,
        what: &'static str,
    ) -> Result<u128, SpecError> {
        let DeValue::Integer(i) = v.get_ref() else {
            return Err(self.wrong_type(v, key, what));
        };
        let parsed = i128::from_str_radix(i.as_str(), i.radix()).ok();
        match parsed {
            Some(n) if n >= 0 && (lo..=hi).contains(&(n as u128)) => Ok(n as u128),
            _ => Err(self.err(
                v.span(),
                key,
                SpecErrorKind::OutOfRange {
                    value: i.to_string(),
                    must_be: what,
                },
            )),
        }
    }

    fn opt_int(
        &self,
        key: &str,
        lo: u128,
        hi: u128,
        what: &'static str,
    ) -> Result<Option<u128>, SpecError> {
        self.get(key)
            .map(|v| self.int_of(v, key, lo, hi, what))
            .transpose()
    }

    fn req_int(&self, key: &'static str, lo: u128, hi: u128, what: &'static str) -> Result<u128, SpecError> {
        let v = self.get(key).ok_or_else(|| self.missing(key))?;
        self.int_of(v, key, lo, hi, what)
    }

    fn opt_float(&self, key: &str, range: Range) -> Result<Option<f32>, SpecError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let (x, text) = match v.get_ref() {
            DeValue::Float(f) => (f.as_str().parse::<f64>().unwrap_or(f64::NAN), f.to_string()),
            DeValue::Integer(i) => (
                i128::from_str_radix(i.as_str(), i.radix()).map_or(f64::NAN, |n| n as f64),
                i.to_string(),
            ),
            _ => return Err(self.wrong_type(v, key, "a number")),
        };
        if !range.ok(x) {
            return Err(self.err(
                v.span(),
                key,
                SpecErrorKind::OutOfRange {
                    value: text,
                    must_be: range.text(),
                },
            ));
        }
        Ok(Some(x as f32))
    }

    fn req_float(&self, key: &'static str, range: Range) -> Result<Option<f32>, SpecError> {
        if self.get(key).is_none() {
            return Err(self.missing(key));
        }
        self.opt_float(key, range)
    }

    /// `n` or `[h, w]`, each ≥ `min`.
    fn opt_pair(&self, key: &str, min: u128) -> Result<Option<[u32; 2]>, SpecError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let what = if min == 0 {
            "a non-negative integer or [h, w]"
        } else {
            "a positive integer or [h, w]"
        };
        match v.get_ref() {
            DeValue::Integer(_) => {
                let n = self.int_of(v, key, min, u32::MAX as u128, what)? as u32;
                Ok(Some([n, n]))
            }
            DeValue::Array(a) if a.len() == 2 => {
                let h = self.int_of(&a[0], key, min, u32::MAX as u128, what)? as u32;
                let w = self.int_of(&a[1], key, min, u32::MAX as u128, what)? as u32;
                Ok(Some([h, w]))
            }
            DeValue::Array(a) => Err(self.err(
                v.span(),
                key,
                SpecErrorKind::Invalid(format!("expected [h, w], got {} elements", a.len())),
            )),
            _ => Err(self.wrong_type(v, key, what)),
        }
    }

    fn req_pair(&self, key: &'static str, min: u128) -> Result<[u32; 2], SpecError> {
        self.opt_pair(key, min)?.ok_or_else(|| self.missing(key))
    }

    /// `[C, H, W]` or `[F]`, positive, with a product that fits in u32.
    fn req_dims(&self, key: &'static str) -> Result<Dims, SpecError> {
        let v = self.get(key).ok_or_else(|| self.missing(key))?;
        let what = "[C, H, W] or [F] of positive integers";
        let DeValue::Array(a) = v.get_ref() else {
            return Err(self.wrong_type(v, key, what));
        };
        let mut d = Vec::with_capacity(3);
        for item in a.iter() {
            d.push(self.int_of(item, key, 1, u32::MAX as u128, "a positive integer")? as u32);
        }
        let dims = match d[..] {
            [f] => Dims::flat(f),
            [c, h, w] => Dims::new(c, h, w),
            _ => {
                return Err(self.err(
                    v.span(),
                    key,
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
                key,
                SpecErrorKind::Invalid(format!("{dims} has more than 2^32 - 1 elements")),
            ));
        }
        Ok(dims)
    }
}
