//! Text data for sequence models: a byte-level tokenizer (every UTF-8 byte is a token: a vocabulary of
//! 256, so any text a user types is in it, no vocabulary file to keep in step) and next-token windows.
use std::path::Path;

use frugal_core::model::Dims;

use crate::data::{DataError, Dataset};

/// Tokens of the byte tokenizer.
pub const VOCAB: usize = 256;

/// The tokens of `text` (its bytes) as model input values.
pub fn encode(text: &[u8]) -> Vec<f32> {
    text.iter().map(|&b| b as f32).collect()
}

/// Token `t` back to its byte (`None` for a value that is not a token).
pub fn decode(t: usize) -> Option<u8> {
    u8::try_from(t).ok()
}

/// Non-overlapping windows of `seq` tokens of `bytes`, each labelled with the `seq` tokens that follow
/// each position (the next byte). `name` is used in errors.
pub fn windows(bytes: &[u8], seq: usize, name: &str) -> Result<Dataset, DataError> {
    if seq == 0 || bytes.len() < seq + 1 {
        return Err(DataError::Mismatch {
            file: name.to_string(),
            reason: format!(
                "{} bytes of text are fewer than one window of {seq} tokens plus its next token",
                bytes.len()
            ),
        });
    }
    let count = (bytes.len() - 1) / seq;
    let mut y = Vec::with_capacity(count * seq);
    for k in 0..count {
        y.extend(
            bytes[k * seq + 1..k * seq + seq + 1]
                .iter()
                .map(|&b| b as u32),
        );
    }
    // Every label is a byte, below the vocabulary: the invariants `Dataset::new` checks hold.
    Ok(Dataset {
        dims: Dims::flat(seq as u32),
        classes: VOCAB as u32,
        x: encode(&bytes[..count * seq]),
        y,
        tokens: seq,
    })
}

/// A text file as (train, test): the last tenth of its bytes (at least one window) is the test text.
pub fn load(path: &Path, seq: usize) -> Result<(Dataset, Dataset), DataError> {
    let bytes = std::fs::read(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let name = path.display().to_string();
    let cut = bytes.len() - (bytes.len() / 10).max(seq + 1).min(bytes.len());
    let train = windows(&bytes[..cut], seq, &name)?;
    let test = windows(&bytes[cut..], seq, &name)?;
    Ok((train, test))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_label_the_next_byte() {
        let ds = windows(b"hello world", 4, "t").unwrap();
        assert_eq!(ds.len(), 2);
        assert_eq!(ds.tokens, 4);
        assert_eq!(ds.x, encode(b"hello wo"));
        assert_eq!(
            ds.labels(0, 1),
            &[b'e' as u32, b'l' as u32, b'l' as u32, b'o' as u32]
        );
        assert_eq!(
            ds.labels(1, 1),
            &[b' ' as u32, b'w' as u32, b'o' as u32, b'r' as u32]
        );
        assert!(windows(b"abc", 4, "t").is_err());
        assert_eq!(decode(104), Some(b'h'));
        assert_eq!(decode(256), None);
    }
}
