//! Tensor element bytes as f32: the one conversion the hosts' safetensors readers and writers share
//! (the native checkpoints and the browser's `loadWeights`/`exportWeights`).
use alloc::vec::Vec;

/// Element types frugal reads weights in (all widened to f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// IEEE single, little-endian.
    F32,
    /// IEEE half, little-endian.
    F16,
    /// bfloat16, little-endian.
    Bf16,
}

impl Elem {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Elem::F32 => 4,
            Elem::F16 | Elem::Bf16 => 2,
        }
    }
}

/// The values of little-endian `bytes` of `elem`, widened to f32 (exactly: every f16 and bf16 value is an
/// f32). None when the length is not a whole number of elements.
pub fn to_f32(elem: Elem, bytes: &[u8]) -> Option<Vec<f32>> {
    if !bytes.len().is_multiple_of(elem.size()) {
        return None;
    }
    Some(match elem {
        Elem::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Elem::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Elem::Bf16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
    })
}

/// `values` as little-endian f32 bytes.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widening_is_exact_and_round_trips() {
        let v = [1.0f32, -2.5, 0.0, -0.0, f32::MAX, 1e-7];
        assert_eq!(to_f32(Elem::F32, &f32_bytes(&v)).unwrap(), v);
        let h = half::f16::from_f32(0.333).to_le_bytes();
        assert_eq!(
            to_f32(Elem::F16, &h).unwrap(),
            [half::f16::from_f32(0.333).to_f32()]
        );
        let b = half::bf16::from_f32(-3.5).to_le_bytes();
        assert_eq!(to_f32(Elem::Bf16, &b).unwrap(), [-3.5]);
        assert_eq!(to_f32(Elem::F32, &[0, 0, 0]), None);
    }
}
