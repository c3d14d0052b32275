//! Where swapped-out tensors go (NNTrainer §4.3, proactive swap). A swap plan
//! ([`crate::policy::swap::plan_swap`]) moves an activation out of the arena after its last forward use
//! ([`Phase::SpillOut`](crate::plan::Phase::SpillOut)) and back in shortly before its backward use
//! ([`Phase::SpillIn`](crate::plan::Phase::SpillIn)); the executor hands the bytes to a host-provided
//! [`Spill`] (a file, flash, another memory) and, when the store asks for it ([`Spill::lookahead`]),
//! announces each swap-in a few instructions early so the host can read it in the background. Swapping
//! only moves bytes: a swap plan's results are bit-identical to the plain plan's.
use core::fmt;

/// Why a [`Spill`] could not store or return bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpillError {
    /// Writing `key` failed (`os`: the OS error code when there is one).
    Write {
        /// The key being written.
        key: u32,
        /// OS error code, if any.
        os: Option<i32>,
    },
    /// Reading `key` failed (`os`: the OS error code when there is one).
    Read {
        /// The key being read.
        key: u32,
        /// OS error code, if any.
        os: Option<i32>,
    },
    /// Nothing of that length was written under `key` (never written, shorter, or its write failed).
    Missing {
        /// The key asked for.
        key: u32,
        /// Bytes asked for.
        len: usize,
    },
    /// The store has no room for `len` more bytes.
    Full {
        /// The key being written.
        key: u32,
        /// Bytes that did not fit.
        len: usize,
    },
}

impl fmt::Display for SpillError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let os = |f: &mut fmt::Formatter<'_>, os: &Option<i32>| match os {
            Some(c) => write!(f, " (OS error {c})"),
            None => Ok(()),
        };
        match self {
            SpillError::Write { key, os: e } => {
                write!(f, "spill: writing key {key} failed")?;
                os(f, e)
            }
            SpillError::Read { key, os: e } => {
                write!(f, "spill: reading key {key} failed")?;
                os(f, e)
            }
            SpillError::Missing { key, len } => {
                write!(f, "spill: no {len} bytes stored under key {key}")
            }
            SpillError::Full { key, len } => {
                write!(f, "spill: no room for {len} bytes of key {key}")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for SpillError {}

/// A store for swapped-out tensors, keyed by tensor id. A key is written once per swap and read back once;
/// a later write of the same key replaces its bytes.
pub trait Spill {
    /// Stores `data` under `key`. On error the key must read as missing (never as stale bytes).
    fn write(&mut self, key: u32, data: &[u8]) -> Result<(), SpillError>;
    /// Fills `out` with the `out.len()` bytes stored under `key`.
    fn read(&mut self, key: u32, out: &mut [u8]) -> Result<(), SpillError>;
    /// Hint: `key` (`len` bytes) will be read soon, so a host can start reading it in the background.
    /// The executor calls it [`Spill::lookahead`] instructions before the swap-in (never before the
    /// key's swap-out). A prefetch that is never followed by a read must not leak.
    fn prefetch(&mut self, key: u32, len: usize) {
        let _ = (key, len);
    }
    /// How many instructions before each swap-in this store wants its [`Spill::prefetch`] hint: 0 (the
    /// default) is on-demand swapping, no hints; a few instructions let a background reader overlap
    /// the executor's compute (proactive swapping).
    fn lookahead(&self) -> usize {
        0
    }
}

impl<S: Spill + ?Sized> Spill for &mut S {
    fn write(&mut self, key: u32, data: &[u8]) -> Result<(), SpillError> {
        (**self).write(key, data)
    }
    fn read(&mut self, key: u32, out: &mut [u8]) -> Result<(), SpillError> {
        (**self).read(key, out)
    }
    fn prefetch(&mut self, key: u32, len: usize) {
        (**self).prefetch(key, len)
    }
    fn lookahead(&self) -> usize {
        (**self).lookahead()
    }
}

/// An in-memory [`Spill`] (tests; a host whose "far" memory is ordinary heap). Counts what it moved.
#[cfg(feature = "alloc")]
#[derive(Clone, Debug, Default)]
pub struct MemSpill {
    slots: alloc::collections::BTreeMap<u32, alloc::vec::Vec<u8>>,
    /// Bytes written so far.
    pub written: usize,
    /// Bytes read so far.
    pub read: usize,
    /// Prefetch hints received so far.
    pub prefetches: usize,
    /// What [`Spill::lookahead`] answers.
    pub lookahead: usize,
}

#[cfg(feature = "alloc")]
impl MemSpill {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.slots.values().map(|v| v.len()).sum()
    }
}

#[cfg(feature = "alloc")]
impl Spill for MemSpill {
    fn write(&mut self, key: u32, data: &[u8]) -> Result<(), SpillError> {
        let v = self.slots.entry(key).or_default();
        v.clear();
        v.extend_from_slice(data);
        self.written += data.len();
        Ok(())
    }
    fn read(&mut self, key: u32, out: &mut [u8]) -> Result<(), SpillError> {
        let v = self
            .slots
            .get(&key)
            .filter(|v| v.len() == out.len())
            .ok_or(SpillError::Missing {
                key,
                len: out.len(),
            })?;
        out.copy_from_slice(v);
        self.read += out.len();
        Ok(())
    }
    fn prefetch(&mut self, _key: u32, _len: usize) {
        self.prefetches += 1;
    }
    fn lookahead(&self) -> usize {
        self.lookahead
    }
}
