//! Typed ids of a plan's storages and storage groups, and the vectors indexed by them.
//!
//! A *storage* is one lifetime segment of a group of tensors sharing bytes ([`super::TensorLife`]); a
//! *group* is the set of tensors sharing one value's bytes (NNTrainer's in-place and view merging), whose
//! value may live in several storages over a step (segments split by swaps, packs and moves). Both were
//! bare `u32`s indexing parallel vectors; as newtypes one cannot index the other's vectors, nor a tensor's.
//! An [`IdVec`] is a `Vec` that only its id type indexes — the same memory as the `Vec`, so a decoded plan
//! costs a microcontroller nothing more.
use alloc::vec::Vec;
use core::fmt;
use core::marker::PhantomData;
use core::ops::{Index, IndexMut};

/// A dense id: the position of an element in an [`IdVec`].
pub trait Id: Copy {
    /// The id of position `i` (ids are `u32`: a plan never has 2³² storages or groups).
    fn from_index(i: usize) -> Self;
    /// The position this id names.
    fn index(self) -> usize;
}

macro_rules! id {
    ($(#[$m:meta])* $name:ident, $short:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub u32);

        impl Id for $name {
            fn from_index(i: usize) -> Self {
                debug_assert!(i <= u32::MAX as usize);
                $name(i as u32)
            }
            fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($short, "{}"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

id!(
    /// A storage of a plan: an index of [`Plan::lives`](super::Plan::lives),
    /// [`Plan::offsets`](super::Plan::offsets) and [`Plan::touches`](super::Plan::touches).
    StorageId,
    "s"
);
id!(
    /// A storage group of a plan: an index of [`Plan::segments`](super::Plan::segments), the value of
    /// [`Plan::group_of`](super::Plan::group_of).
    GroupId,
    "g"
);

/// A vector indexed by the id type `I` only.
pub struct IdVec<I, T> {
    items: Vec<T>,
    id: PhantomData<fn() -> I>,
}

impl<I: Id, T> IdVec<I, T> {
    /// An empty vector.
    pub const fn new() -> Self {
        Self {
            items: Vec::new(),
            id: PhantomData,
        }
    }

    /// An empty vector with room for `n` elements.
    pub fn with_capacity(n: usize) -> Self {
        Vec::with_capacity(n).into()
    }

    /// Number of elements (the first id not in use).
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there is no element.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Appends `v`; returns its id.
    pub fn push(&mut self, v: T) -> I {
        self.items.push(v);
        I::from_index(self.items.len() - 1)
    }

    /// Removes the last element.
    pub fn pop(&mut self) -> Option<T> {
        self.items.pop()
    }

    /// The element of `id`, if there is one.
    pub fn get(&self, id: I) -> Option<&T> {
        self.items.get(id.index())
    }

    /// Every id, ascending.
    pub fn ids(&self) -> impl DoubleEndedIterator<Item = I> + ExactSizeIterator {
        (0..self.items.len()).map(I::from_index)
    }

    /// The elements in id order.
    pub fn iter(&self) -> core::slice::Iter<'_, T> {
        self.items.iter()
    }

    /// The elements in id order, mutably.
    pub fn iter_mut(&mut self) -> core::slice::IterMut<'_, T> {
        self.items.iter_mut()
    }

    /// (id, element) pairs in id order.
    pub fn iter_enumerated(
        &self,
    ) -> impl DoubleEndedIterator<Item = (I, &T)> + ExactSizeIterator + '_ {
        self.items
            .iter()
            .enumerate()
            .map(|(i, v)| (I::from_index(i), v))
    }

    /// The elements as a slice (position = id index): for code that works on positions, such as the
    /// layout strategies.
    pub fn as_slice(&self) -> &[T] {
        &self.items
    }

    /// The underlying vector, for code that manages its capacity itself (the adaptive switch fills
    /// plans within capacities sized in advance, [`crate::exec`]).
    pub fn raw_mut(&mut self) -> &mut Vec<T> {
        &mut self.items
    }

    /// The underlying vector.
    pub fn into_vec(self) -> Vec<T> {
        self.items
    }

    /// Shrinks the capacity to the length.
    pub fn shrink_to_fit(&mut self) {
        self.items.shrink_to_fit()
    }
}

impl<I: Id, T> Default for IdVec<I, T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<I, T: Clone> Clone for IdVec<I, T> {
    fn clone(&self) -> Self {
        Self {
            items: self.items.clone(),
            id: PhantomData,
        }
    }
}

impl<I, T: PartialEq> PartialEq for IdVec<I, T> {
    fn eq(&self, other: &Self) -> bool {
        self.items == other.items
    }
}

impl<I, T: Eq> Eq for IdVec<I, T> {}

impl<I, T: fmt::Debug> fmt::Debug for IdVec<I, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.items.fmt(f)
    }
}

impl<I, T> From<Vec<T>> for IdVec<I, T> {
    fn from(items: Vec<T>) -> Self {
        Self {
            items,
            id: PhantomData,
        }
    }
}

impl<I, T> FromIterator<T> for IdVec<I, T> {
    fn from_iter<It: IntoIterator<Item = T>>(it: It) -> Self {
        Vec::from_iter(it).into()
    }
}

impl<'a, I, T> IntoIterator for &'a IdVec<I, T> {
    type Item = &'a T;
    type IntoIter = core::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

impl<'a, I, T> IntoIterator for &'a mut IdVec<I, T> {
    type Item = &'a mut T;
    type IntoIter = core::slice::IterMut<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.iter_mut()
    }
}

impl<I: Id, T> Index<I> for IdVec<I, T> {
    type Output = T;
    fn index(&self, id: I) -> &T {
        &self.items[id.index()]
    }
}

impl<I: Id, T> IndexMut<I> for IdVec<I, T> {
    fn index_mut(&mut self, id: I) -> &mut T {
        &mut self.items[id.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_index_and_enumerate_agree() {
        let mut v: IdVec<StorageId, &str> = IdVec::new();
        let a = v.push("a");
        let b = v.push("b");
        assert_eq!((a, b), (StorageId(0), StorageId(1)));
        assert_eq!((v[a], v[b]), ("a", "b"));
        v[b] = "c";
        assert_eq!(v.get(StorageId(2)), None);
        let pairs: Vec<(StorageId, &str)> = v.iter_enumerated().map(|(i, s)| (i, *s)).collect();
        assert_eq!(pairs, [(StorageId(0), "a"), (StorageId(1), "c")]);
        assert_eq!(v.ids().collect::<Vec<_>>(), [a, b]);
        assert_eq!(alloc::format!("{a:?} {:?}", GroupId(7)), "s0 g7");
    }
}
