//! Weights on disk: [safetensors](https://github.com/huggingface/safetensors) files, PyTorch
//! `state_dict` names (`{layer}.weight`, `{layer}.bias`, `{layer}.running_mean`, …).
//!
//! Loading accepts F32, F16 and BF16 tensors (converted to f32); saving writes F32 through
//! [`crate::fsutil::write_atomic`], so a crash never leaves a torn checkpoint.
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use crate::fsutil::write_atomic;
use frugal_core::format::tensor::{f32_bytes, to_f32, Elem};

/// One tensor: name, shape (row-major), values.
pub type NamedTensor = (String, Vec<usize>, Vec<f32>);

/// Why a checkpoint could not be read or written. Every variant names the file.
#[derive(Debug)]
pub enum CheckpointError {
    /// Reading or writing the file failed.
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The bytes are not a valid safetensors file (bad header length, bad JSON, offsets that do not
    /// cover the data, …).
    Format {
        /// The file (or the name given to [`parse_safetensors`]).
        file: String,
        /// What is wrong, as the safetensors reader reports it.
        reason: String,
    },
    /// A tensor has an element type other than F32, F16 or BF16.
    UnsupportedDtype {
        /// The file.
        file: String,
        /// The tensor.
        tensor: String,
        /// Its element type, e.g. `I64`.
        dtype: String,
    },
    /// A tensor given to [`save_safetensors`] is inconsistent (shape vs. length, duplicate name,
    /// empty name).
    BadTensor {
        /// The file being written.
        file: String,
        /// The tensor.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckpointError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            CheckpointError::Format { file, reason } => {
                write!(f, "{file}: not a valid safetensors file: {reason}")
            }
            CheckpointError::UnsupportedDtype { file, tensor, dtype } => write!(
                f,
                "{file}: tensor \"{tensor}\" has element type {dtype}; only F32, F16 and BF16 are supported"
            ),
            CheckpointError::BadTensor { file, tensor, reason } => {
                write!(f, "{file}: tensor \"{tensor}\": {reason}")
            }
        }
    }
}

impl std::error::Error for CheckpointError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CheckpointError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Reads a safetensors file; tensors come back in file (data offset) order, converted to f32.
pub fn load_safetensors(path: &Path) -> Result<Vec<NamedTensor>, CheckpointError> {
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_safetensors(&bytes, &path.display().to_string())
}

/// Parses safetensors bytes held in memory; `name` is used in error messages. Never panics, whatever
/// the bytes.
pub fn parse_safetensors(bytes: &[u8], name: &str) -> Result<Vec<NamedTensor>, CheckpointError> {
    let st = deserialize(bytes, name)?;
    let mut views: Vec<(String, TensorView<'_>)> = st.tensors();
    // The header's tensor map has no inherent order; file order (by data address) is stable and
    // matches the writer's order.
    views.sort_by_key(|(_, v)| (v.data().as_ptr() as usize, v.data().len()));
    let mut out = Vec::with_capacity(views.len());
    for (tensor, view) in views {
        let elem = match view.dtype() {
            Dtype::F32 => Elem::F32,
            Dtype::F16 => Elem::F16,
            Dtype::BF16 => Elem::Bf16,
            other => {
                return Err(CheckpointError::UnsupportedDtype {
                    file: name.to_string(),
                    tensor,
                    dtype: format!("{other:?}"),
                })
            }
        };
        // safetensors checked that the data holds shape × element size bytes.
        let values = to_f32(elem, view.data()).ok_or_else(|| CheckpointError::BadTensor {
            file: name.to_string(),
            tensor: tensor.clone(),
            reason: "a partial element".into(),
        })?;
        out.push((tensor, view.shape().to_vec(), values));
    }
    Ok(out)
}

/// The free-form `__metadata__` string map of a safetensors file (empty when absent).
pub fn parse_safetensors_metadata(
    bytes: &[u8],
    name: &str,
) -> Result<HashMap<String, String>, CheckpointError> {
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|e| CheckpointError::Format {
        file: name.to_string(),
        reason: e.to_string(),
    })?;
    Ok(meta.metadata().clone().unwrap_or_default())
}

fn deserialize<'a>(bytes: &'a [u8], name: &str) -> Result<SafeTensors<'a>, CheckpointError> {
    SafeTensors::deserialize(bytes).map_err(|e| CheckpointError::Format {
        file: name.to_string(),
        reason: e.to_string(),
    })
}

/// Encodes tensors (F32, little-endian) and optional string metadata as safetensors bytes.
pub fn serialize_safetensors(
    tensors: &[(&str, &[usize], &[f32])],
    metadata: Option<HashMap<String, String>>,
    name: &str,
) -> Result<Vec<u8>, CheckpointError> {
    let bad = |tensor: &str, reason: String| CheckpointError::BadTensor {
        file: name.to_string(),
        tensor: tensor.to_string(),
        reason,
    };
    let mut seen = HashSet::new();
    let mut raw: Vec<(&str, &[usize], Vec<u8>)> = Vec::with_capacity(tensors.len());
    for &(tensor, shape, values) in tensors {
        if tensor.is_empty() {
            return Err(bad(tensor, "empty tensor name".into()));
        }
        if tensor == "__metadata__" {
            return Err(bad(tensor, "the name __metadata__ is reserved".into()));
        }
        if !seen.insert(tensor) {
            return Err(bad(tensor, "name given twice".into()));
        }
        let numel = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .filter(|n| n.checked_mul(4).is_some());
        if numel != Some(values.len()) {
            return Err(bad(
                tensor,
                format!("shape {shape:?} does not match {} values", values.len()),
            ));
        }
        let bytes = f32_bytes(values);
        raw.push((tensor, shape, bytes));
    }
    let mut views = Vec::with_capacity(raw.len());
    for (tensor, shape, bytes) in &raw {
        let view = TensorView::new(Dtype::F32, shape.to_vec(), bytes)
            .map_err(|e| bad(tensor, e.to_string()))?;
        views.push((*tensor, view));
    }
    safetensors::serialize(views, metadata).map_err(|e| CheckpointError::Format {
        file: name.to_string(),
        reason: e.to_string(),
    })
}

/// Writes tensors as an F32 safetensors file, atomically: a temporary file in the same directory is
/// written, fsynced and renamed over `path`. On any error an existing `path` is left as it was.
pub fn save_safetensors(
    path: &Path,
    tensors: &[(&str, &[usize], &[f32])],
    metadata: Option<HashMap<String, String>>,
) -> Result<(), CheckpointError> {
    let bytes = serialize_safetensors(tensors, metadata, &path.display().to_string())?;
    write_atomic(path, &bytes).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{mutate, scratch_dir};
    use proptest::prelude::*;

    fn sample() -> Vec<u8> {
        let w = [1.0f32, -2.5, 3.25, 0.0, 1e-7, -0.0];
        let b = [0.5f32, 7.0];
        serialize_safetensors(
            &[("fc.weight", &[2, 3], &w), ("fc.bias", &[2], &b)],
            None,
            "mem",
        )
        .unwrap()
    }

    #[test]
    fn round_trip_in_memory_and_on_disk() {
        let w: Vec<f32> = (0..24).map(|i| i as f32 * 0.25 - 3.0).collect();
        let b = vec![f32::MIN_POSITIVE, f32::MAX, -1.0];
        let scalar = [42.0f32];
        let d = scratch_dir("ckpt");
        let p = d.join("m.safetensors");
        let meta = HashMap::from([("epoch".to_string(), "3".to_string())]);
        save_safetensors(
            &p,
            &[
                ("conv1.weight", &[3, 2, 2, 2], &w),
                ("conv1.bias", &[3], &b),
                ("s", &[], &scalar),
            ],
            Some(meta.clone()),
        )
        .unwrap();
        let mut got = load_safetensors(&p).unwrap();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            got,
            vec![
                ("conv1.bias".to_string(), vec![3], b.clone()),
                ("conv1.weight".to_string(), vec![3, 2, 2, 2], w.clone()),
                ("s".to_string(), vec![], scalar.to_vec()),
            ]
        );
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(parse_safetensors_metadata(&bytes, "m").unwrap(), meta);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn failed_save_keeps_existing_file() {
        let d = scratch_dir("ckpt-fail");
        let p = d.join("m.safetensors");
        save_safetensors(&p, &[("a", &[2], &[1.0, 2.0])], None).unwrap();
        let before = std::fs::read(&p).unwrap();
        // Shape does not match the data: refused before anything is written.
        let e = save_safetensors(&p, &[("a", &[3], &[1.0, 2.0])], None).unwrap_err();
        assert!(e.to_string().contains("tensor \"a\""), "{e}");
        assert!(e.to_string().contains("does not match 2 values"), "{e}");
        // Duplicate names.
        let e =
            save_safetensors(&p, &[("a", &[1], &[1.0]), ("a", &[1], &[2.0])], None).unwrap_err();
        assert!(e.to_string().contains("name given twice"), "{e}");
        // The target's directory vanished mid-way: the write fails, nothing else is touched.
        let e = save_safetensors(&d.join("gone/m.safetensors"), &[("a", &[1], &[1.0])], None)
            .unwrap_err();
        assert!(matches!(e, CheckpointError::Io { .. }));
        assert_eq!(std::fs::read(&p).unwrap(), before);
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "temporary files left behind: {names:?}");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn half_precision_is_converted() {
        let h: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect();
        let bf: Vec<u8> = [0.25f32, 3.0]
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        let bytes = safetensors::serialize(
            [
                ("h", TensorView::new(Dtype::F16, vec![2], &h).unwrap()),
                ("bf", TensorView::new(Dtype::BF16, vec![2], &bf).unwrap()),
            ],
            None,
        )
        .unwrap();
        let mut got = parse_safetensors(&bytes, "x").unwrap();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(got[0], ("bf".into(), vec![2], vec![0.25, 3.0]));
        assert_eq!(got[1], ("h".into(), vec![2], vec![1.5, -2.0]));
    }

    #[test]
    fn other_dtypes_are_rejected_by_name() {
        let data = [0u8; 16];
        let bytes = safetensors::serialize(
            [(
                "steps",
                TensorView::new(Dtype::I64, vec![2], &data).unwrap(),
            )],
            None,
        )
        .unwrap();
        let e = parse_safetensors(&bytes, "opt.safetensors").unwrap_err();
        assert_eq!(
            e.to_string(),
            "opt.safetensors: tensor \"steps\" has element type I64; only F32, F16 and BF16 are supported"
        );
    }

    #[test]
    fn garbage_is_a_format_error() {
        let e = parse_safetensors(b"hello", "g.safetensors").unwrap_err();
        assert!(matches!(e, CheckpointError::Format { .. }));
        assert!(
            e.to_string()
                .starts_with("g.safetensors: not a valid safetensors file"),
            "{e}"
        );
        let mut bytes = sample();
        bytes.truncate(bytes.len() - 1);
        let e = parse_safetensors(&bytes, "t.safetensors").unwrap_err();
        assert!(e.to_string().starts_with("t.safetensors:"), "{e}");
    }

    #[test]
    fn missing_file_names_the_path() {
        let e = load_safetensors(Path::new("/nonexistent/w.safetensors")).unwrap_err();
        assert!(
            e.to_string().starts_with("/nonexistent/w.safetensors: "),
            "{e}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn fuzz_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_safetensors(&bytes, "fuzz");
            let _ = parse_safetensors_metadata(&bytes, "fuzz");
        }

        #[test]
        fn fuzz_random_header(json in "\\PC{0,200}", tail in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
            bytes.extend_from_slice(json.as_bytes());
            bytes.extend_from_slice(&tail);
            let _ = parse_safetensors(&bytes, "fuzz");
        }

        #[test]
        fn fuzz_mutations(muts in proptest::collection::vec((0u8..3, any::<usize>(), any::<u8>()), 1..8)) {
            let bytes = mutate(sample(), &muts);
            let _ = parse_safetensors(&bytes, "fuzz");
        }
    }
}
