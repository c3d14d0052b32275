//! Helpers shared by the unit tests.
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh, empty directory under the system temp dir (the test removes it when done).
pub(crate) fn scratch_dir(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "frugal-cli-test-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Applies byte flips (op 0), truncations (op 1) and insertions (op 2) to `bytes`; positions are
/// taken modulo the current length. Used by the fuzz tests to corrupt valid inputs.
pub(crate) fn mutate(mut bytes: Vec<u8>, muts: &[(u8, usize, u8)]) -> Vec<u8> {
    for &(op, at, val) in muts {
        let i = if bytes.is_empty() {
            0
        } else {
            at % bytes.len()
        };
        match op {
            0 if !bytes.is_empty() => bytes[i] ^= val.max(1),
            1 => bytes.truncate(i),
            _ => bytes.insert(i.min(bytes.len()), val),
        }
    }
    bytes
}
