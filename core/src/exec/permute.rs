//! Moving storages to their places in another layout, in place: the copies of a plan switch
//! (`exec::adapt`). Any set of moves between disjoint source ranges and disjoint destination ranges of
//! one arena is carried out without free bytes — chains from their end, cycles through a small stack
//! bounce buffer — in a number of copies that grows with the number of moves, not their bytes.
use alloc::vec;
use alloc::vec::Vec;

use crate::backend::ExecError;
use crate::plan::ALIGN;

pub(super) fn overlaps(a: usize, al: usize, b: usize, bl: usize) -> bool {
    al > 0 && bl > 0 && a < b + bl && b < a + al
}

pub(super) fn align_up(v: usize) -> usize {
    v.div_ceil(ALIGN) * ALIGN
}

/// Lowest ALIGN-aligned offset where `len` bytes fit in `[0, limit)` overlapping none of `busy`.
pub(super) fn find_free(busy: &[(usize, usize)], len: usize, limit: usize) -> Option<usize> {
    let mut b: Vec<(usize, usize)> = busy.iter().copied().filter(|r| r.1 > 0).collect();
    b.sort_unstable();
    let mut at = 0usize;
    for (o, l) in b {
        if at + len <= o {
            break;
        }
        at = at.max(align_up(o + l));
    }
    (at + len <= limit).then_some(at)
}

/// The stand-in for the bounce buffer in a copy `(src, dst, len)` (see [`order_moves`]); such a copy
/// moves at most [`BOUNCE`] bytes.
pub(super) const BUF: usize = usize::MAX;

/// Bytes of the stack bounce buffer that rotates cycles of moves (a multiple of [`ALIGN`]).
pub(super) const BOUNCE: usize = 64 * ALIGN;

/// Split points beyond which [`order_moves`] gives up cutting moves at their mutual boundaries and cuts
/// them into `ALIGN`-byte blocks instead (bounds the work on pathological move sets).
pub(super) const MAX_POINTS: usize = 1 << 14;

/// Orders moves `(src, dst, len)` so no destination overwrites a source still to be moved. Sources are
/// disjoint, destinations are disjoint, and all offsets and lengths are multiples of [`ALIGN`]. Whole
/// moves go first, in dependency order. What remains (moves whose destinations overlap each other's
/// sources in cycles) is cut into *pieces* at every range boundary and its images under the moves'
/// shifts, so that a piece's destination is exactly another piece's source or meets no source at all;
/// the pieces form chains (copied from their end) and cycles (rotated through a [`BOUNCE`]-byte bounce
/// buffer, [`BUF`], a chunk at a time). So every set of moves can be carried out without any free bytes,
/// in a number of copies that grows with the number of moves, not with their bytes.
pub(super) fn order_moves(moves: &[(usize, usize, usize)]) -> Vec<(usize, usize, usize)> {
    let mut pending: Vec<(usize, usize, usize)> = moves
        .iter()
        .copied()
        .filter(|m| m.0 != m.1 && m.2 > 0)
        .collect();
    let mut out = Vec::with_capacity(pending.len());
    while let Some(i) = (0..pending.len()).find(|&i| {
        let (_, d, l) = pending[i];
        (pending.iter().enumerate()).all(|(j, o)| j == i || !overlaps(d, l, o.0, o.2))
    }) {
        out.push(pending.remove(i));
    }
    if pending.is_empty() {
        return out;
    }
    // Pieces `(src, dst, len)`, sorted by source.
    let mut next = pieces(&pending);
    next.sort_unstable();
    let find = |v: &[(usize, usize, usize)], s: usize| v.binary_search_by_key(&s, |e| e.0).ok();
    // The piece whose destination is `d` (destinations are disjoint): (dst, src).
    let mut by_dst: Vec<(usize, usize)> = next.iter().map(|&(s, d, _)| (d, s)).collect();
    by_dst.sort_unstable();
    let find_dst = |d: usize| by_dst.binary_search_by_key(&d, |e| e.0).ok();
    let mut done = vec![false; next.len()];
    // Chains: a piece whose destination is no pending source can go; then the piece writing its source.
    let mut ready: Vec<usize> = (0..next.len())
        .filter(|&k| find(&next, next[k].1).is_none())
        .collect();
    while let Some(k) = ready.pop() {
        let (s, d, l) = next[k];
        out.push((s, d, l));
        done[k] = true;
        if let Some(j) = find_dst(s) {
            if let Some(kj) = find(&next, by_dst[j].1) {
                ready.push(kj);
            }
        }
    }
    // Cycles p0 → p1 → … → pk → p0 (all of one length): per chunk, park pk's, shift the others, unpark
    // into p0's.
    for k0 in 0..next.len() {
        if done[k0] {
            continue;
        }
        let mut cycle = vec![k0];
        let mut k = k0;
        while let Some(kn) = find(&next, next[k].1) {
            if kn == k0 || done[kn] {
                break;
            }
            cycle.push(kn);
            k = kn;
        }
        let last = next[*cycle.last().unwrap_or(&k0)];
        let len = next[k0].2;
        for o in (0..len).step_by(BOUNCE) {
            let c = BOUNCE.min(len - o);
            out.push((last.0 + o, BUF, c));
            for &p in cycle.iter().rev().skip(1) {
                out.push((next[p].0 + o, next[p].1 + o, c));
            }
            out.push((BUF, last.1 + o, c));
        }
        for &c in &cycle {
            done[c] = true;
        }
    }
    coalesce(out)
}

/// Cuts `moves` into pieces at every source and destination boundary and at the images of those points
/// under the moves' shifts (a point inside a source maps to the same place in the destination, and back),
/// until no new point appears. Then a piece's destination is exactly one piece's source or meets none.
/// Falls back to `ALIGN`-byte pieces past [`MAX_POINTS`] points.
pub(super) fn pieces(moves: &[(usize, usize, usize)]) -> Vec<(usize, usize, usize)> {
    let mut points: Vec<usize> = Vec::new();
    let mut work: Vec<usize> = moves
        .iter()
        .flat_map(|&(s, d, l)| [s, s + l, d, d + l])
        .collect();
    while let Some(p) = work.pop() {
        match points.binary_search(&p) {
            Ok(_) => continue,
            Err(i) => points.insert(i, p),
        }
        if points.len() > MAX_POINTS {
            return moves
                .iter()
                .flat_map(|&(s, d, l)| {
                    (0..l / ALIGN).map(move |k| (s + k * ALIGN, d + k * ALIGN, ALIGN))
                })
                .collect();
        }
        for &(s, d, l) in moves {
            if s < p && p < s + l {
                work.push(p - s + d);
            }
            if d < p && p < d + l {
                work.push(p - d + s);
            }
        }
    }
    let mut out = Vec::new();
    for &(s, d, l) in moves {
        // Cuts of this move: points inside its source, and (mapped back) inside its destination; by
        // closure both sets are the same.
        let lo = points.partition_point(|&p| p <= s);
        let mut at = s;
        for &p in points[lo..].iter().take_while(|&&p| p < s + l) {
            out.push((at, at - s + d, p - at));
            at = p;
        }
        out.push((at, at - s + d, s + l - at));
    }
    out
}

/// Merges runs of block copies that one `copy_within` (a memmove: everything read before anything is
/// written) carries out exactly as the sequence did: adjacent blocks of the same shift, where no block's
/// write lands on a later block's source. Chains of megabyte tensors then take a few copies instead of
/// one per 64-byte block.
pub(super) fn coalesce(copies: Vec<(usize, usize, usize)>) -> Vec<(usize, usize, usize)> {
    let mut out: Vec<(usize, usize, usize)> = Vec::with_capacity(copies.len());
    for c in copies {
        if let Some(last) = out.last_mut() {
            let (s, d, l) = *last;
            let real = s != BUF && d != BUF && c.0 != BUF && c.1 != BUF;
            if real && c.0 == s + l && c.1 == d + l {
                // Ascending: earlier writes [d, d + l) must miss the later sources [c.0, c.0 + c.2).
                if !overlaps(d, l, c.0, c.2) {
                    *last = (s, d, l + c.2);
                    continue;
                }
            } else if real && c.0 + c.2 == s && c.1 + c.2 == d {
                // Descending (a chain copied from its end): the same test the other way round.
                if !overlaps(d, l, c.0, c.2) {
                    *last = (c.0, c.1, l + c.2);
                    continue;
                }
            }
        }
        out.push(c);
    }
    out
}

/// Carries out copies from [`order_moves`], adding the bytes copied within the arena to `moved` and
/// calling `after` with the arena after each copy (the tests check budgets there).
pub(super) fn run_copies(
    whole: &mut [u8],
    copies: &[(usize, usize, usize)],
    moved: &mut usize,
    after: &mut dyn FnMut(&[u8]),
) -> Result<(), ExecError> {
    let mut buf = [0u8; BOUNCE];
    for &(src, dst, len) in copies {
        let bad = || ExecError::BadPlan("a switch moves bytes outside the arena");
        match (src, dst) {
            (BUF, d) => whole
                .get_mut(d..d + len)
                .ok_or_else(bad)?
                .copy_from_slice(buf.get(..len).ok_or_else(bad)?),
            (s, BUF) => buf
                .get_mut(..len)
                .ok_or_else(bad)?
                .copy_from_slice(whole.get(s..s + len).ok_or_else(bad)?),
            (s, d) => {
                if s.max(d) + len > whole.len() {
                    return Err(bad());
                }
                whole.copy_within(s..s + len, d);
                *moved += len;
            }
        }
        after(whole);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Random storages (lengths in `ALIGN` units) laid out twice, in two random orders with random gaps:
    /// the moves between the layouts, and the arena length.
    fn layouts(rng: &mut Rng) -> (Vec<(usize, usize, usize)>, usize) {
        let n = 1 + rng.below(8) as usize;
        // Lengths from one block to a few bounce buffers, so cycles need several chunks.
        let lens: Vec<usize> = (0..n)
            .map(|_| {
                let most = if rng.below(2) == 0 { 4 } else { 200 };
                ALIGN * (1 + rng.below(most) as usize)
            })
            .collect();
        let place = |rng: &mut Rng| {
            let mut order: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
            let mut at = 0;
            let mut off = vec![0; n];
            for &k in &order {
                at += ALIGN * rng.below(3) as usize;
                off[k] = at;
                at += lens[k];
            }
            (off, at)
        };
        let (src, a) = place(rng);
        let (dst, b) = place(rng);
        let moves = (0..n).map(|k| (src[k], dst[k], lens[k])).collect();
        (moves, a.max(b))
    }

    #[test]
    fn ordered_moves_carry_out_any_permutation_in_place() {
        let mut rng = Rng::new(11);
        // Fewer cases under Miri, which checks the copies' bounds and aliasing rather than the orders.
        for case in 0..if cfg!(miri) { 40 } else { 3000 } {
            let (moves, len) = layouts(&mut rng);
            let before: Vec<u8> = (0..len).map(|i| (i * 31 + i / 251) as u8).collect();
            let mut arena = before.clone();
            let copies = order_moves(&moves);
            run_copies(&mut arena, &copies, &mut 0, &mut |_| {}).unwrap();
            for &(s, d, l) in &moves {
                assert_eq!(arena[d..d + l], before[s..s + l], "case {case}: {moves:?}");
            }
            // Never more copies than moving block by block would take.
            let blocks: usize = moves.iter().map(|m| m.2 / ALIGN).sum();
            let bounce: usize = moves.iter().map(|m| 2 * m.2.div_ceil(BOUNCE)).sum();
            assert!(
                copies.len() <= blocks + bounce,
                "case {case}: {} copies for {moves:?}",
                copies.len()
            );
        }
    }

    #[test]
    fn swapping_tensors_takes_a_few_copies_not_one_per_block() {
        // Three 1 MiB storages rotated one slot (a cycle) and one shifted down by half its size (a chain
        // with overlap): pieces are whole tensors, the cycle goes through the bounce buffer chunk by
        // chunk, the chain in one memmove.
        // Under Miri four bounce buffers each (the same shapes, fewer bytes to check).
        let m = if cfg!(miri) { 4 * BOUNCE } else { 1 << 20 };
        let moves = [
            (0, m, m),
            (m, 2 * m, m),
            (2 * m, 0, m),
            (3 * m + m / 2, 3 * m, m),
        ];
        let copies = order_moves(&moves);
        assert!(
            copies.len() <= 4 * (m / BOUNCE) + 4,
            "{} copies",
            copies.len()
        );
        let before: Vec<u8> = (0..5 * m).map(|i| (i % 253) as u8).collect();
        let mut arena = before.clone();
        run_copies(&mut arena, &copies, &mut 0, &mut |_| {}).unwrap();
        for &(s, d, l) in &moves {
            assert_eq!(arena[d..d + l], before[s..s + l]);
        }
    }

    #[test]
    fn adjacent_block_copies_merge_only_where_one_memmove_does_the_same() {
        // A chain shifting up by one block, copied from its end: one memmove does the same.
        let seq = vec![(2 * ALIGN, 3 * ALIGN, ALIGN), (ALIGN, 2 * ALIGN, ALIGN)];
        assert_eq!(coalesce(seq), vec![(ALIGN, 2 * ALIGN, 2 * ALIGN)]);
        // Ascending copies shifting up by one block: the first write lands on the second source.
        let up = vec![(0, ALIGN, ALIGN), (ALIGN, 2 * ALIGN, ALIGN)];
        assert_eq!(coalesce(up.clone()), up);
        // Ascending copies shifting down: safe to merge.
        let down = vec![(ALIGN, 0, ALIGN), (2 * ALIGN, ALIGN, ALIGN)];
        assert_eq!(coalesce(down), vec![(ALIGN, 0, 2 * ALIGN)]);
    }
}
