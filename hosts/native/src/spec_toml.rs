//! The TOML model description (`docs/model-format.md`) → [`ModelSpec`] + [`TrainConfig`].
//!
//! The document is walked by hand over toml's spanned tree (not deserialised into structs) so that
//! every error carries a line and column, names the field (`layers[3] ("conv2").kernel`) and says
//! what is wrong; unknown keys are rejected per layer type.
use std::fmt;
use std::io;
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
    let lr = t.req_float("lr", Limit::Positive)?.expect("required");
    let wd = t
        .opt_float("weight_decay", Limit::NonNegative)?
        .unwrap_or(0.0);
    Ok(if adam {
        OptimizerSpec::Adam {
            lr,
            beta1: t.opt_float("beta1", Limit::UnitOpen)?.unwrap_or(0.9),
            beta2: t.opt_float("beta2", Limit::UnitOpen)?.unwrap_or(0.999),
            eps: t.opt_float("eps", Limit::Positive)?.unwrap_or(1e-8),
            weight_decay: wd,
        }
    } else {
        OptimizerSpec::Sgd {
            lr,
            momentum: t.opt_float("momentum", Limit::UnitOpen)?.unwrap_or(0.0),
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

/// The keys a layer of type `ty` takes: those every layer takes, then its own.
fn layer_keys(ty: &str) -> &'static [&'static str] {
    match ty {
        "linear" => &["name", "type", "inputs", "trainable", "out", "bias"],
        "conv2d" => &[
            "name",
            "type",
            "inputs",
            "trainable",
            "out",
            "kernel",
            "stride",
            "padding",
            "groups",
            "bias",
        ],
        "maxpool2d" | "avgpool2d" => &["name", "type", "inputs", "trainable", "kernel", "stride"],
        "reshape" => &["name", "type", "inputs", "trainable", "to"],
        "batchnorm2d" => &["name", "type", "inputs", "trainable", "eps", "momentum"],
        "dropout" => &["name", "type", "inputs", "trainable", "p"],
        _ => &["name", "type", "inputs", "trainable"],
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
        if let Some(DeValue::String(n)) = lt.get("name").map(|v| v.get_ref()) {
            lt.path = format!("layers[{i}] (\"{n}\")");
        }
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
        lt.check_keys(layer_keys(ty))?;
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
            eps: t.opt_float("eps", Limit::Positive)?.unwrap_or(1e-5),
            momentum: t.opt_float("momentum", Limit::UnitClosed)?.unwrap_or(0.1),
        },
        "dropout" => LayerKind::Dropout {
            p: t.opt_float("p", Limit::UnitOpen)?.unwrap_or(0.5),
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
                            known: &[
                                "digits",
                                "{ idx_images, idx_labels }",
                                "{ csv, label_column }",
                            ],
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
                            .opt_int(
                                "label_column",
                                0,
                                u32::MAX as u128,
                                "a non-negative integer",
                            )?
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
                            "a dataset table needs either idx_images and idx_labels, or csv".into(),
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
    fn pos(&self, offset: usize) -> (u32, u32) {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |p| p + 1);
        let col = before[line_start..].chars().count() + 1;
        (
            u32::try_from(line).unwrap_or(u32::MAX),
            u32::try_from(col).unwrap_or(u32::MAX),
        )
    }
}

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
    fn check_keys(&self, allowed: &'static [&'static str]) -> Result<(), SpecError> {
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
                    allowed,
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
            return Err(self.err(v.span(), key, SpecErrorKind::Invalid("empty path".into())));
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
    fn req_enum(
        &self,
        key: &'static str,
        known: &'static [&'static str],
    ) -> Result<usize, SpecError> {
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

    fn req_int(
        &self,
        key: &'static str,
        lo: u128,
        hi: u128,
        what: &'static str,
    ) -> Result<u128, SpecError> {
        let v = self.get(key).ok_or_else(|| self.missing(key))?;
        self.int_of(v, key, lo, hi, what)
    }

    fn opt_float(&self, key: &str, range: Limit) -> Result<Option<f32>, SpecError> {
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

    fn req_float(&self, key: &'static str, range: Limit) -> Result<Option<f32>, SpecError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{mutate, scratch_dir};
    use proptest::prelude::*;

    const HEAD: &str = "[model]\ninput = [1, 8, 8]\nloss = \"cross_entropy\"\n\n[optimizer]\ntype = \"adam\"\nlr = 0.001\n\n";

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
                "line 19, column 1: layers[3] (\"conv2\"): unknown key \"kernal\" (allowed: name, type, inputs, trainable, out, kernel, stride, padding, groups, bias)"
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
             global_avgpool, relu, relu6, sigmoid, tanh, flatten, reshape, add, batchnorm2d, dropout)"
        );
        assert!(err_body(&HEAD.replace("cross_entropy", "hinge"))
            .starts_with("model.loss: unknown value \"hinge\""));
        assert!(err_body(&HEAD.replace("adam", "adamw"))
            .starts_with("optimizer.type: unknown value \"adamw\""));
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
            err_body(&with("[[layers]]\ntype = \"relu\"\ninputs = \"input\"\n"))
                .contains("inputs: expected an array of layer names, found string")
        );
        assert!(
            err_body(&with("[[layers]]\ntype = \"relu\"\ninputs = [3]\n"))
                .contains("inputs: expected a string, found integer")
        );
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
            .contains("out: expected a positive integer, found string"));
        assert!(layer("type = \"linear\"\nout = 2\nbias = 1")
            .contains("bias: expected true or false, found integer"));
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
            .contains("trainable: expected true or false"));

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
        assert!(opt("lr = \"fast\"").contains("optimizer.lr: expected a number, found string"));
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
            "model.input: expected [C, H, W] or [F] of positive integers, found integer"
        ));
        assert!(model("input = [65536, 65536, 2]").contains("more than 2^32 - 1 elements"));
        assert!(model("input = [1]\nseed = -1")
            .contains("model.seed: must be a non-negative integer, got -1"));

        let train =
            |t: &str| err_body(&with(&format!("[[layers]]\ntype=\"relu\"\n[train]\n{t}\n")));
        assert!(train("batch = 0").contains("train.batch: must be a positive integer, got 0"));
        assert!(train("epochs = 1.5")
            .contains("train.epochs: expected a positive integer, found float"));
        assert!(train("weights = 3").contains("train.weights: expected a string, found integer"));
        assert!(train("weights = \"\"").contains("train.weights: empty path"));
        assert!(train("dataset = { csv = \"a.csv\", label_column = -1 }")
            .contains("train.dataset.label_column: must be a non-negative integer"));
        assert!(train("dataset = { idx_images = \"a\" }")
            .contains("train.dataset: missing key \"idx_labels\""));
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
        assert!(err(&format!("layers = 3\n{HEAD}"))
            .contains("layers: expected an array of tables ([[layers]]), found integer"));
        assert!(err(&format!("layers = [1]\n{HEAD}"))
            .contains("layers[0]: expected a table, found integer"));
        assert!(err("model = 3\n").contains("model: expected a table, found integer"));
        assert!(err(&HEAD.replace("loss = \"cross_entropy\"\n", ""))
            .contains("model: missing key \"loss\""));
        assert!(err(&with("[[layers]]\nname = \"x\"\n"))
            .contains("layers[0] (\"x\"): missing key \"type\""));
        assert!(err(&with("[[layers]]\ntype = 3\n"))
            .contains("layers[0].type: expected a string, found integer"));
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
