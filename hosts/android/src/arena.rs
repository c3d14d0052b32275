//! `Arena`: the trainer's arena, one heap block at the plan alignment ([`ALIGN`]) that can grow and
//! shrink in place of a `Vec<u8>`. A `Vec<u8>` may come back from a reallocation at another offset
//! from a 64-byte boundary, which would shift every tensor relative to the plan's offsets; this block
//! is always aligned, so a reallocation keeps the plan's tensors where they were (the bytes below the
//! new length). Allocation failures are errors naming the bytes, never aborts.
use std::alloc::{self, Layout};
use std::ptr::NonNull;

use frugal_core::plan::ALIGN;

/// A zero-initialised, [`ALIGN`]-aligned byte block.
pub struct Arena {
    /// `ALIGN`-aligned; dangling (never dereferenced) when `len == 0`.
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `Arena` owns its block exclusively (like `Vec<u8>`); nothing else points into it.
unsafe impl Send for Arena {}
// SAFETY: shared access only reads (`&self` gives `&[u8]`), as for `Vec<u8>`.
unsafe impl Sync for Arena {}

fn layout(len: usize) -> Result<Layout, usize> {
    Layout::from_size_align(len, ALIGN).map_err(|_| len)
}

fn dangling() -> NonNull<u8> {
    // An aligned, non-null address that is never dereferenced (len 0).
    NonNull::new(ALIGN as *mut u8).expect("ALIGN is not zero")
}

impl Arena {
    /// An empty arena (no allocation).
    pub fn empty() -> Arena {
        Arena {
            ptr: dangling(),
            len: 0,
        }
    }

    /// `len` zero bytes; `Err(len)` when they cannot be allocated.
    pub fn zeroed(len: usize) -> Result<Arena, usize> {
        let mut a = Arena::empty();
        a.resize(len)?;
        Ok(a)
    }

    /// Changes the length to `len`, keeping the first `min(old, new)` bytes at the same offsets from
    /// an `ALIGN`-aligned start; new bytes are zero. On failure (`Err(len)`) the arena is unchanged.
    pub fn resize(&mut self, len: usize) -> Result<(), usize> {
        if len == self.len {
            return Ok(());
        }
        let new_layout = layout(len)?;
        if len == 0 {
            *self = Arena::empty(); // drops the old block
            return Ok(());
        }
        let p = if self.len == 0 {
            // SAFETY: `new_layout` has a non-zero size (len > 0) and a valid power-of-two alignment.
            unsafe { alloc::alloc_zeroed(new_layout) }
        } else {
            let old = layout(self.len)?;
            // SAFETY: `self.ptr` was allocated by the global allocator with `old` (same size and
            // alignment: every allocation here uses `layout(self.len)`), and `len` is non-zero and,
            // rounded up to ALIGN, does not overflow isize (checked by `layout(len)` above).
            unsafe { alloc::realloc(self.ptr.as_ptr(), old, len) }
        };
        let Some(p) = NonNull::new(p) else {
            return Err(len); // the old block (if any) is untouched by a failed realloc
        };
        if len > self.len && self.len > 0 {
            // SAFETY: the block `p` holds `len` bytes; bytes `self.len..len` are inside it and are not
            // yet initialised (realloc copies only the old ones).
            unsafe { p.as_ptr().add(self.len).write_bytes(0, len - self.len) };
        }
        self.ptr = p;
        self.len = len;
        Ok(())
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised bytes (zeroed or written through `&mut`),
        // aligned, and not mutated while this shared borrow lives; for len 0 a dangling aligned
        // pointer is allowed.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and `&mut self` makes this the only borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        if self.len > 0 {
            if let Ok(l) = layout(self.len) {
                // SAFETY: allocated by the global allocator with exactly this layout.
                unsafe { alloc::dealloc(self.ptr.as_ptr(), l) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growing_and_shrinking_keep_bytes_and_alignment() {
        let mut a = Arena::zeroed(1000).unwrap();
        assert!(a.as_slice().iter().all(|&b| b == 0));
        for (i, b) in a.as_mut_slice().iter_mut().enumerate() {
            *b = i as u8;
        }
        for len in [5000usize, 300, 70_000, 64, 1] {
            let keep = a.len().min(len);
            a.resize(len).unwrap();
            assert_eq!(a.as_slice().as_ptr() as usize % ALIGN, 0);
            assert_eq!(a.len(), len);
            for (i, &b) in a.as_slice()[..keep].iter().enumerate() {
                assert_eq!(b, i as u8, "byte {i} after resizing to {len}");
            }
            assert!(
                a.as_slice()[keep..].iter().all(|&b| b == 0),
                "new bytes are zero"
            );
        }
        a.resize(0).unwrap();
        assert!(a.is_empty());
        a.resize(10).unwrap();
        assert_eq!(a.as_slice(), &[0; 10]);
    }

    #[test]
    fn an_impossible_size_is_an_error_and_keeps_the_arena() {
        let mut a = Arena::zeroed(128).unwrap();
        a.as_mut_slice()[3] = 7;
        assert_eq!(a.resize(usize::MAX - 8), Err(usize::MAX - 8));
        assert_eq!(a.len(), 128);
        assert_eq!(a.as_slice()[3], 7);
    }
}
