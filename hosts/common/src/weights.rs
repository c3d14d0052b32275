//! Weights in and out as safetensors bytes (PyTorch `state_dict` names), the format the native host's
//! checkpoints use. Loading accepts F32, F16 and BF16 tensors; saving writes F32. Errors are the
//! message; each host wraps it in its own error type.
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use frugal_core::format::tensor::{f32_bytes, to_f32, Elem};

/// One tensor: name, shape (row-major), values.
pub type NamedTensor = (String, Vec<usize>, Vec<f32>);

/// Parses safetensors bytes into f32 tensors. Never panics, whatever the bytes.
pub fn parse(bytes: &[u8]) -> Result<Vec<NamedTensor>, String> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for (name, view) in st.tensors() {
        let elem = match view.dtype() {
            Dtype::F32 => Elem::F32,
            Dtype::F16 => Elem::F16,
            Dtype::BF16 => Elem::Bf16,
            other => {
                return Err(alloc::format!(
                    "tensor \"{name}\" has element type {other:?}; only F32, F16 and BF16 are supported"
                ))
            }
        };
        // safetensors checked that the data holds shape × element size bytes.
        let values = to_f32(elem, view.data())
            .ok_or_else(|| alloc::format!("tensor \"{name}\": a partial element"))?;
        out.push((name, view.shape().to_vec(), values));
    }
    Ok(out)
}

/// Encodes tensors as F32 safetensors bytes.
pub fn serialize(tensors: &[NamedTensor]) -> Result<Vec<u8>, String> {
    let raw: Vec<Vec<u8>> = tensors.iter().map(|(_, _, v)| f32_bytes(v)).collect();
    let mut views = Vec::with_capacity(tensors.len());
    for ((name, shape, _), bytes) in tensors.iter().zip(&raw) {
        let view = TensorView::new(Dtype::F32, shape.clone(), bytes)
            .map_err(|e| alloc::format!("tensor \"{name}\": {e}"))?;
        views.push((name.as_str(), view));
    }
    safetensors::serialize(views, None).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn f32_tensors_round_trip() {
        let t = vec![
            (
                "fc.weight".to_string(),
                vec![2, 3],
                vec![1.0, -2.5, 3.25, 0.0, 1e-7, -0.0],
            ),
            ("fc.bias".to_string(), vec![2], vec![0.5, f32::MAX]),
        ];
        let bytes = serialize(&t).unwrap();
        let mut got = parse(&bytes).unwrap();
        got.sort_by(|a, b| b.0.cmp(&a.0));
        assert_eq!(got, t);
    }

    #[test]
    fn corrupt_bytes_are_errors_never_panics() {
        let good = serialize(&[("w".to_string(), vec![4], vec![1.0; 4])]).unwrap();
        assert!(parse(&[]).is_err());
        assert!(parse(&good[..good.len() - 1]).is_err());
        assert!(parse(b"\xff\xff\xff\xff\xff\xff\xff\x7f{}").is_err());
        // Every single-byte corruption either parses or is an error.
        for i in 0..good.len() {
            for v in [0u8, b'9', b'"', 0xff] {
                let mut b = good.clone();
                b[i] = v;
                let _ = parse(&b);
            }
        }
    }
}
