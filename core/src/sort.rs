//! An in-place sort for every sort of the planner and the plan decoder: Shell sort up to
//! [`SHELL_MAX`] elements, heapsort above (O(n log n)); no allocation, no recursion and a few words of
//! stack. `core`'s sorts keep scratch on the stack (the stable one up to
//! 4 KiB, the unstable one several hundred bytes per recursion level), more than the ~2 KiB a Cortex-M0
//! decodes a plan in; and each of their instantiations is several KiB of code (the browser build had
//! 86 KiB of them before they all went through this one). Unstable: callers sort by unique keys (an
//! index breaks ties where the order of equals matters) or by whole values, where every sort agrees.

/// Slices up to this length are Shell-sorted: no recursion or scratch either, and faster than the
/// heapsort on the tens to hundreds of ranges the layout sorts per storage placed (the planner's hot
/// loop: `floor` on the small character transformer at batch 32 went from 1.76 s to 1.32 s).
const SHELL_MAX: usize = 1024;

/// Ciura's gap sequence (descending), ending in an insertion sort's gap of 1.
const SHELL_GAPS: [usize; 8] = [701, 301, 132, 57, 23, 10, 4, 1];

/// Sorts `v` by `key`, ascending (equal keys in unspecified order).
pub(crate) fn heap_sort_by_key<T, K: Ord>(v: &mut [T], key: impl Fn(&T) -> K) {
    let n = v.len();
    if n <= SHELL_MAX {
        // Shell sort (Ciura's gaps), the last pass (gap 1) an insertion sort.
        for &gap in SHELL_GAPS.iter().filter(|&&g| g < n) {
            for i in gap..n {
                let mut j = i;
                while j >= gap && key(&v[j - gap]) > key(&v[j]) {
                    v.swap(j - gap, j);
                    j -= gap;
                }
            }
        }
        return;
    }
    for start in (0..n / 2).rev() {
        sift_down(v, start, n, &key);
    }
    for end in (1..n).rev() {
        v.swap(0, end);
        sift_down(v, 0, end, &key);
    }
}

/// Restores the max-heap property of `v[..end]` below `root`.
fn sift_down<T, K: Ord>(v: &mut [T], mut root: usize, end: usize, key: &impl Fn(&T) -> K) {
    loop {
        let mut child = 2 * root + 1;
        if child >= end {
            return;
        }
        if child + 1 < end && key(&v[child]) < key(&v[child + 1]) {
            child += 1;
        }
        if key(&v[root]) >= key(&v[child]) {
            return;
        }
        v.swap(root, child);
        root = child;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn heap_sort_agrees_with_the_standard_sort(mut v in proptest::collection::vec((0u8..8, any::<i16>()), 0..2000)) {
            let mut want = v.clone();
            want.sort();
            heap_sort_by_key(&mut v, |&x| x);
            prop_assert_eq!(v, want);
        }

        #[test]
        fn heap_sort_by_a_unique_key_is_the_stable_order(keys in proptest::collection::vec(0u32..16, 0..2000)) {
            let mut idx: Vec<usize> = (0..keys.len()).collect();
            heap_sort_by_key(&mut idx, |&i| (keys[i], i));
            let mut want: Vec<usize> = (0..keys.len()).collect();
            want.sort_by_key(|&i| keys[i]);
            prop_assert_eq!(idx, want);
        }
    }
}
