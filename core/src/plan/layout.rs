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
///
/// Only the union of the overlapping storages' byte ranges decides the gaps. Storages alive through the
/// whole step (weights, optimizer state: hundreds in a deep network) overlap every other one, so they
/// are kept apart as one sorted union of disjoint ranges, merged into each storage's busy ranges, rather
/// than found, listed and sorted again for every storage placed: the same offsets, found faster.
fn place(lives: &[TensorLife], order: &[usize], best_fit: bool) -> Layout {
    let mut offsets = vec![usize::MAX; lives.len()];
    let end = lives.iter().map(|l| l.last).max().unwrap_or(0);
    let whole = |l: &TensorLife| l.first == 0 && l.last == end;
    let mut index = PlacedIndex::new(lives);
    // The placed whole-step storages' ranges: sorted, disjoint, touching ranges merged.
    let mut always: Vec<(usize, usize)> = Vec::new();
    let mut busy: Vec<(usize, usize)> = Vec::new();
    let mut arena = 0;
    for &i in order {
        let me = &lives[i];
        busy.clear();
        index.overlapping(me, |j| busy.push((offsets[j], offsets[j] + lives[j].bytes)));
        busy.extend_from_slice(&always);
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
        if whole(me) {
            add_range(&mut always, (off, off + me.bytes));
        } else {
            index.insert(i);
        }
    }
    Layout {
        offsets,
        arena_bytes: arena,
    }
}

/// Adds `r` to `v`, a sorted list of disjoint ranges no two of which touch, keeping it so. An empty
/// range stays (as a point it still splits a gap, as it does among the busy ranges of `place`).
fn add_range(v: &mut Vec<(usize, usize)>, r: (usize, usize)) {
    // The ranges that touch or overlap `r`: from the first ending at or after its start to the last
    // starting at or before its end.
    let a = v.partition_point(|&(_, e)| e < r.0);
    let b = v.partition_point(|&(s, _)| s <= r.1);
    let merged = if a < b {
        (v[a].0.min(r.0), v[b - 1].1.max(r.1))
    } else {
        r
    };
    v.splice(a..b, core::iter::once(merged));
}

/// The placed storages, found by lifetime. Small plans (a microcontroller's) scan them all; from
/// [`INDEX_FROM`] storages on — a batch split into hundreds of micro-batches has tens of thousands — each
/// is filed under the blocks of execution orders it spans, so a storage meets only those alive near it
/// and a layout costs about `n · k` rather than `n²` (`k` storages alive at once).
struct PlacedIndex<'a> {
    lives: &'a [TensorLife],
    placed: Vec<usize>,
    /// Per block of [`BLOCK`] execution orders, the placed storages alive in it (empty when scanning).
    blocks: Vec<Vec<u32>>,
    block: u32,
    /// The last query that met each storage (a storage spanning several blocks is met once).
    seen: Vec<u32>,
    query: u32,
}

/// Storages from which [`PlacedIndex`] files them by blocks of execution orders.
const INDEX_FROM: usize = 256;

impl<'a> PlacedIndex<'a> {
    fn new(lives: &'a [TensorLife]) -> Self {
        let n_eo = lives.iter().map(|l| l.last as usize + 1).max().unwrap_or(0);
        let indexed = lives.len() >= INDEX_FROM;
        // About 256 blocks: a storage alive through the step is filed 256 times, a short one once or twice.
        let block = (n_eo / 256).max(16) as u32;
        Self {
            lives,
            placed: Vec::new(),
            blocks: if indexed {
                vec![Vec::new(); n_eo.div_ceil(block as usize)]
            } else {
                Vec::new()
            },
            block,
            seen: if indexed {
                vec![0; lives.len()]
            } else {
                Vec::new()
            },
            query: 0,
        }
    }

    fn insert(&mut self, i: usize) {
        if self.blocks.is_empty() {
            self.placed.push(i);
            return;
        }
        let l = &self.lives[i];
        for b in (l.first / self.block)..=(l.last / self.block) {
            self.blocks[b as usize].push(i as u32);
        }
    }

    /// Calls `f` once with each placed storage whose lifetime overlaps `me`'s.
    fn overlapping(&mut self, me: &TensorLife, mut f: impl FnMut(usize)) {
        let lives = self.lives;
        if self.blocks.is_empty() {
            for &j in self.placed.iter().filter(|&&j| overlaps(me, &lives[j])) {
                f(j);
            }
            return;
        }
        self.query += 1;
        let last_block = (me.last / self.block) as usize;
        for b in &self.blocks[(me.first / self.block) as usize..=last_block] {
            for &j in b {
                let j = j as usize;
                if self.seen[j] != self.query && overlaps(me, &lives[j]) {
                    self.seen[j] = self.query;
                    f(j);
                }
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::TensorKind;
    use crate::plan::SpaceId;
    use crate::rng::Rng;

    /// Placing with the block index gives, bit for bit, the offsets that scanning every placed storage
    /// gives (the index only finds the same overlapping storages faster), below and above the size
    /// where indexing starts; every strategy's layout stays free of overlaps.
    #[test]
    fn the_block_index_lays_out_exactly_as_scanning() {
        let mut rng = Rng::new(7);
        for n in [INDEX_FROM - 1, INDEX_FROM, 3000] {
            let n_eo = 4 * n as u32;
            let lives: Vec<TensorLife> = (0..n)
                .map(|i| {
                    // Mostly short lives, some spanning the whole step (weights).
                    let (first, last) = if i % 50 == 0 {
                        (0, n_eo - 1)
                    } else {
                        let f = (rng.next_u64() % n_eo as u64) as u32;
                        (f, (f + (rng.next_u64() % 40) as u32).min(n_eo - 1))
                    };
                    TensorLife {
                        name: "t".into(),
                        kind: TensorKind::Activation,
                        bytes: 64 * (1 + (rng.next_u64() % 100) as usize),
                        first,
                        last,
                        space: SpaceId::HOST,
                    }
                })
                .collect();
            for s in strategies() {
                let got = s.layout(&lives);
                // No two storages alive together overlap.
                for (a, la) in lives.iter().enumerate() {
                    for (b, lb) in lives.iter().enumerate().skip(a + 1) {
                        if overlaps(la, lb) {
                            let (oa, ob) = (got.offsets[a], got.offsets[b]);
                            assert!(oa + la.bytes <= ob || ob + lb.bytes <= oa, "{}", s.name());
                        }
                    }
                }
            }
            // Bit-for-bit: the indexed placement equals a scanning placement in a fixed order.
            let order: Vec<usize> = (0..n).rev().collect();
            for best_fit in [false, true] {
                let fast = place(&lives, &order, best_fit);
                let slow = place_scanning(&lives, &order, best_fit);
                assert_eq!(fast, slow, "n = {n}, best fit {best_fit}");
            }
        }
    }

    /// `place` without the index.
    fn place_scanning(lives: &[TensorLife], order: &[usize], best_fit: bool) -> Layout {
        let mut offsets = vec![usize::MAX; lives.len()];
        let mut placed: Vec<usize> = Vec::new();
        let mut arena = 0;
        for &i in order {
            let me = &lives[i];
            let mut busy: Vec<(usize, usize)> = placed
                .iter()
                .filter(|&&j| overlaps(me, &lives[j]))
                .map(|&j| (offsets[j], offsets[j] + lives[j].bytes))
                .collect();
            busy.sort();
            let mut chosen: Option<(usize, usize)> = None;
            let mut cursor = 0usize;
            for &(s, e) in &busy {
                if s > cursor && s - cursor >= me.bytes {
                    if !best_fit {
                        chosen = Some((cursor, s - cursor));
                        break;
                    }
                    if chosen.is_none_or(|(_, g)| s - cursor < g) {
                        chosen = Some((cursor, s - cursor));
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
}
