//! One sort routine for the planner's many orderings. Every `sort_by_key` closure instantiates a sort
//! of its own (a few KiB of code each; tens of KiB of the browser build across the planner); here every
//! ordering builds a [`Key`] per element and one shared routine sorts `(key, index)` pairs.
use alloc::vec::Vec;

/// A sort key, compared lexicographically. Unsigned fields go in as they are; [`rev`] flips a field for
/// descending order, [`signed`] maps a signed one onto the unsigned order.
pub type Key = [u64; 3];

/// `x` in descending order.
pub const fn rev(x: u64) -> u64 {
    u64::MAX - x
}

/// A signed field in ascending order.
pub const fn signed(x: i64) -> u64 {
    (x as u64) ^ (1 << 63)
}

/// Sorts `v` by `key`; equal keys keep their order (a stable sort). Allocates (the planner's use, never a
/// training step's).
pub fn sort_by_key<T: Copy>(v: &mut [T], key: impl Fn(&T) -> Key) {
    let mut keyed: Vec<(Key, u32)> = v
        .iter()
        .enumerate()
        .map(|(i, x)| (key(x), i as u32))
        .collect();
    sort_pairs(&mut keyed);
    let old: Vec<T> = v.to_vec();
    for (slot, &(_, i)) in v.iter_mut().zip(&keyed) {
        *slot = old[i as usize];
    }
}

/// Sorts a short slice in place (insertion sort: no allocation, little code; quadratic, so only for a
/// handful of elements, such as the tensors one instruction touches).
pub fn sort_short<T: Copy + Ord>(v: &mut [T]) {
    for i in 1..v.len() {
        let mut j = i;
        while j > 0 && v[j - 1] > v[j] {
            v.swap(j - 1, j);
            j -= 1;
        }
    }
}

/// The shared routine (the index makes every pair distinct, so an unstable sort is a stable one here).
#[inline(never)]
fn sort_pairs(v: &mut [(Key, u32)]) {
    v.sort_unstable();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_stably_by_key_with_descending_and_signed_fields() {
        let mut v: Vec<(i64, u32, char)> = vec![
            (3, 1, 'a'),
            (-2, 5, 'b'),
            (3, 1, 'c'),
            (0, 9, 'd'),
            (-2, 7, 'e'),
        ];
        sort_by_key(&mut v, |&(s, u, _)| [signed(s), rev(u as u64), 0]);
        let order: Vec<char> = v.iter().map(|x| x.2).collect();
        assert_eq!(order, ['e', 'b', 'd', 'a', 'c']);
        let mut w: Vec<u32> = (0..100).map(|i| (i * 37) % 101).collect();
        let mut expect = w.clone();
        expect.sort();
        let mut short = w.clone();
        sort_by_key(&mut w, |&x| [x as u64, 0, 0]);
        assert_eq!(w, expect);
        sort_short(&mut short);
        assert_eq!(short, expect);
    }
}
