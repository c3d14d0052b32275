//! Layout: give every storage an offset so that storages alive at the same execution order never overlap
//! — a 2-D packing of (time × address) rectangles. Several strategies run; the planner keeps the smallest.
use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;

use super::TensorLife;
use crate::sort::heap_sort_by_key;
use core::cmp::Reverse;

/// Offsets for each storage plus the arena size they need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Offset of storage i.
    pub offsets: Vec<usize>,
    /// max(offset + bytes).
    pub arena_bytes: usize,
}

/// A way to lay storages out.
pub trait LayoutStrategy {
    /// Name for reports.
    fn name(&self) -> &'static str;
    /// Lays out `lives`.
    fn layout(&self, lives: &[TensorLife]) -> Layout;
}

/// All built-in strategies.
pub fn strategies() -> Vec<Box<dyn LayoutStrategy>> {
    vec![
        Box::new(FirstUseOrder),
        Box::new(LongestLifetimeFirst),
        Box::new(BestFitBySize),
    ]
}

/// max over execution orders of the bytes alive at once.
pub fn lower_bound(lives: &[TensorLife]) -> usize {
    let mut events: Vec<(u32, i64)> = Vec::with_capacity(lives.len() * 2);
    for l in lives {
        events.push((l.first, l.bytes as i64));
        events.push((l.last + 1, -(l.bytes as i64)));
    }
    // At equal times, frees (negative) first: a tensor ending at eo-1 and one starting at eo don't coexist.
    // Equal keys are equal events, so any sort gives the same sums; the heapsort needs a few words of
    // stack (decoders run this).
    crate::sort::heap_sort_by_key(&mut events, |&e| e);
    let (mut cur, mut best) = (0i64, 0i64);
    for (_, d) in events {
        cur += d;
        best = best.max(cur);
    }
    best as usize
}

fn overlaps(a: &TensorLife, b: &TensorLife) -> bool {
    a.first <= b.last && b.first <= a.last
}

/// Places storages one by one in `order`; each goes into a gap between already-placed storages whose
/// lifetimes overlap it: the lowest gap (first fit) or the tightest (best fit).
fn place(lives: &[TensorLife], order: &[usize], best_fit: bool) -> Layout {
    let mut offsets = vec![usize::MAX; lives.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(lives.len());
    let mut busy: Vec<(usize, usize)> = Vec::new();
    let mut arena = 0;
    for &i in order {
        let me = &lives[i];
        busy.clear();
        busy.extend(
            placed
                .iter()
                .filter(|&&j| overlaps(me, &lives[j]))
                .map(|&j| (offsets[j], offsets[j] + lives[j].bytes)),
        );
        // Equal keys are equal ranges: any order of them places alike.
        heap_sort_by_key(&mut busy, |&r| r);
        let mut chosen: Option<(usize, usize)> = None; // (offset, gap size)
        let mut cursor = 0usize;
        for &(s, e) in &busy {
            if s > cursor {
                let gap = s - cursor;
                if gap >= me.bytes {
                    if !best_fit {
                        chosen = Some((cursor, gap));
                        break;
                    }
                    if chosen.is_none_or(|(_, g)| gap < g) {
                        chosen = Some((cursor, gap));
                    }
                }
            }
            cursor = cursor.max(e);
        }
        let off = chosen.map(|c| c.0).unwrap_or(cursor);
        offsets[i] = off;
        arena = arena.max(off + me.bytes);
        placed.push(i);
    }
    Layout {
        offsets,
        arena_bytes: arena,
    }
}

/// NNTrainer's planner: storages sorted by first use, each placed at the lowest free offset.
pub struct FirstUseOrder;
impl LayoutStrategy for FirstUseOrder {
    fn name(&self) -> &'static str {
        "first-use"
    }
    fn layout(&self, lives: &[TensorLife]) -> Layout {
        let mut order: Vec<usize> = (0..lives.len()).collect();
        heap_sort_by_key(&mut order, |&i| (lives[i].first, Reverse(lives[i].last), i));
        place(lives, &order, false)
    }
}

/// Melon's lifetime-aware layout: longest-lived storages first (they go low in the arena), ties by size.
pub struct LongestLifetimeFirst;
impl LayoutStrategy for LongestLifetimeFirst {
    fn name(&self) -> &'static str {
        "longest-lifetime"
    }
    fn layout(&self, lives: &[TensorLife]) -> Layout {
        let mut order: Vec<usize> = (0..lives.len()).collect();
        heap_sort_by_key(&mut order, |&i| {
            (
                Reverse(lives[i].last - lives[i].first),
                Reverse(lives[i].bytes),
                i,
            )
        });
        place(lives, &order, false)
    }
}

/// Greedy by size (TFLite's arena planner): largest storages first, each into the tightest gap.
pub struct BestFitBySize;
impl LayoutStrategy for BestFitBySize {
    fn name(&self) -> &'static str {
        "greedy-size-best-fit"
    }
    fn layout(&self, lives: &[TensorLife]) -> Layout {
        let mut order: Vec<usize> = (0..lives.len()).collect();
        heap_sort_by_key(&mut order, |&i| {
            (Reverse(lives[i].bytes), lives[i].first, i)
        });
        place(lives, &order, true)
    }
}
