//! Moving storages to their places in another layout, in place: the copies of a plan switch
//! (`exec::adapt`). Any set of moves between disjoint source ranges and disjoint destination ranges of
//! one arena is carried out without free bytes — chains from their end, cycles through a small stack
//! bounce buffer — in a number of copies that grows with the number of moves, not their bytes.
#[cfg(test)]
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
/// Sorts `busy` in place (the result does not depend on its order); allocates nothing.
pub(super) fn find_free(busy: &mut Vec<(usize, usize)>, len: usize, limit: usize) -> Option<usize> {
    busy.retain(|r| r.1 > 0);
    busy.sort_unstable();
    let mut at = 0usize;
    for &(o, l) in busy.iter() {
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

/// A buffer of [`MoveBufs`] (or a switch's scratch) would have grown past the capacity it was given
/// when it was sized: the move set is refused instead of reallocating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Full;

/// Pushes `x` onto `v` only within its capacity (never reallocates).
pub(super) fn push<T>(v: &mut Vec<T>, x: T) -> Result<(), Full> {
    if v.len() == v.capacity() {
        return Err(Full);
    }
    v.push(x);
    Ok(())
}

/// Resizes `v` to `n` copies of `x` only within its capacity (never reallocates).
pub(super) fn refill<T: Clone>(v: &mut Vec<T>, n: usize, x: T) -> Result<(), Full> {
    if n > v.capacity() {
        return Err(Full);
    }
    v.clear();
    v.resize(n, x);
    Ok(())
}

/// The working buffers of [`order_moves_into`], sized once for at most `moves` moves within an arena
/// of `arena` bytes; ordering moves then allocates nothing.
///
/// Capacities (with `A = arena / ALIGN`, `P = min(MAX_POINTS, A) + 1`, `m = moves`), and why no push
/// exceeds them (every offset and length is a multiple of `ALIGN`, sources and destinations lie in
/// `[0, arena]`):
/// * `points`, `queue`: distinct split points, multiples of `ALIGN` in `[0, arena]`, so at most `A + 1`;
///   and the closure stops (falls back to blocks) as soon as there are `MAX_POINTS + 1`. Each point is
///   queued once, when it is first inserted.
/// * `pieces` (and `by_dst`, `done`, `ready`, `cycle`, indexed by piece): cut at the points, the pieces
///   are disjoint intervals between consecutive points, so at most `P - 1`; in the block fallback, one
///   per `ALIGN` bytes moved, at most `A` — more than the capacity (only when `A > MAX_POINTS`, an arena
///   over 1 MiB) is refused ([`Full`]).
/// * the copies ([`MoveBufs::copies_cap`]): `m` whole moves, then per piece one copy in a chain, or
///   `ceil(len / BOUNCE)` chunks of `k + 1` copies for a cycle of `k` pieces: at most
///   `m + 2 * Σ ceil(len / BOUNCE) ≤ m + 2 * (P + A / 64 + 1)`.
pub(super) struct MoveBufs {
    pending: Vec<(usize, usize, usize)>,
    points: Vec<usize>,
    queue: Vec<usize>,
    pieces: Vec<(usize, usize, usize)>,
    by_dst: Vec<(usize, usize)>,
    done: Vec<bool>,
    ready: Vec<usize>,
    cycle: Vec<usize>,
}

impl MoveBufs {
    /// Buffers for up to `moves` moves within `arena` bytes.
    pub(super) fn new(moves: usize, arena: usize) -> Self {
        let p = Self::pieces_cap(arena);
        MoveBufs {
            pending: Vec::with_capacity(moves),
            points: Vec::with_capacity(p + 1),
            queue: Vec::with_capacity(p + 1),
            pieces: Vec::with_capacity(p),
            by_dst: Vec::with_capacity(p),
            done: Vec::with_capacity(p),
            ready: Vec::with_capacity(p),
            cycle: Vec::with_capacity(p),
        }
    }

    fn pieces_cap(arena: usize) -> usize {
        MAX_POINTS.min(arena / ALIGN) + 1
    }

    /// The capacity an output of [`order_moves_into`] needs for `moves` moves within `arena` bytes.
    pub(super) fn copies_cap(moves: usize, arena: usize) -> usize {
        moves + 2 * (Self::pieces_cap(arena) + arena / BOUNCE + 1)
    }
}

/// Orders moves `(src, dst, len)` so no destination overwrites a source still to be moved; allocates.
/// (A switch uses [`order_moves_into`] with buffers sized up front.)
#[cfg(test)]
pub(super) fn order_moves(moves: &[(usize, usize, usize)]) -> Vec<(usize, usize, usize)> {
    let arena = moves
        .iter()
        .map(|m| (m.0 + m.2).max(m.1 + m.2))
        .max()
        .unwrap_or(0);
    let mut bufs = MoveBufs::new(moves.len(), arena);
    let mut out = Vec::with_capacity(MoveBufs::copies_cap(moves.len(), arena));
    order_moves_into(moves, &mut bufs, &mut out).expect("sized for these moves");
    out
}

/// Orders moves `(src, dst, len)` into `out` so no destination overwrites a source still to be moved.
/// Sources are disjoint, destinations are disjoint, and all offsets and lengths are multiples of
/// [`ALIGN`]. Whole moves go first, in dependency order. What remains (moves whose destinations overlap
/// each other's sources in cycles) is cut into *pieces* at every range boundary and its images under the
/// moves' shifts, so that a piece's destination is exactly another piece's source or meets no source at
/// all; the pieces form chains (copied from their end) and cycles (rotated through a [`BOUNCE`]-byte
/// bounce buffer, [`BUF`], a chunk at a time). So every set of moves can be carried out without any
/// free bytes, in a number of copies that grows with the number of moves, not with their bytes.
///
/// Allocates nothing: `bufs` and `out` (capacity [`MoveBufs::copies_cap`]) are sized for the moves
/// ([`MoveBufs`] proves the bounds); a move set they cannot hold is refused with [`Full`].
pub(super) fn order_moves_into(
    moves: &[(usize, usize, usize)],
    bufs: &mut MoveBufs,
    out: &mut Vec<(usize, usize, usize)>,
) -> Result<(), Full> {
    let MoveBufs {
        pending,
        points,
        queue,
        pieces: next,
        by_dst,
        done,
        ready,
        cycle,
    } = bufs;
    out.clear();
    pending.clear();
    for &m in moves.iter().filter(|m| m.0 != m.1 && m.2 > 0) {
        push(pending, m)?;
    }
    while let Some(i) = (0..pending.len()).find(|&i| {
        let (_, d, l) = pending[i];
        (pending.iter().enumerate()).all(|(j, o)| j == i || !overlaps(d, l, o.0, o.2))
    }) {
        push(out, pending.remove(i))?;
    }
    if pending.is_empty() {
        return Ok(());
    }
    // Pieces `(src, dst, len)`, sorted by source.
    pieces_into(pending, points, queue, next)?;
    next.sort_unstable();
    let find = |v: &[(usize, usize, usize)], s: usize| v.binary_search_by_key(&s, |e| e.0).ok();
    // The piece whose destination is `d` (destinations are disjoint): (dst, src).
    by_dst.clear();
    for &(s, d, _) in next.iter() {
        push(by_dst, (d, s))?;
    }
    by_dst.sort_unstable();
    let find_dst = |d: usize| by_dst.binary_search_by_key(&d, |e| e.0).ok();
    refill(done, next.len(), false)?;
    // Chains: a piece whose destination is no pending source can go; then the piece writing its source.
    ready.clear();
    for k in (0..next.len()).filter(|&k| find(next, next[k].1).is_none()) {
        push(ready, k)?;
    }
    while let Some(k) = ready.pop() {
        let (s, d, l) = next[k];
        push(out, (s, d, l))?;
        done[k] = true;
        if let Some(j) = find_dst(s) {
            if let Some(kj) = find(next, by_dst[j].1) {
                push(ready, kj)?;
            }
        }
    }
    // Cycles p0 → p1 → … → pk → p0 (all of one length): per chunk, park pk's, shift the others, unpark
    // into p0's.
    for k0 in 0..next.len() {
        if done[k0] {
            continue;
        }
        cycle.clear();
        push(cycle, k0)?;
        let mut k = k0;
        while let Some(kn) = find(next, next[k].1) {
            if kn == k0 || done[kn] {
                break;
            }
            push(cycle, kn)?;
            k = kn;
        }
        let last = next[*cycle.last().unwrap_or(&k0)];
        let len = next[k0].2;
        for o in (0..len).step_by(BOUNCE) {
            let c = BOUNCE.min(len - o);
            push(out, (last.0 + o, BUF, c))?;
            for &p in cycle.iter().rev().skip(1) {
                push(out, (next[p].0 + o, next[p].1 + o, c))?;
            }
            push(out, (BUF, last.1 + o, c))?;
        }
        for &c in cycle.iter() {
            done[c] = true;
        }
    }
    coalesce_in_place(out);
    Ok(())
}

/// Inserts split point `p` into the sorted `points` (queueing it when new); false once there are more
/// than [`MAX_POINTS`].
fn insert(points: &mut Vec<usize>, queue: &mut Vec<usize>, p: usize) -> Result<bool, Full> {
    if let Err(i) = points.binary_search(&p) {
        if points.len() == points.capacity() {
            return Err(Full);
        }
        points.insert(i, p);
        push(queue, p)?;
    }
    Ok(points.len() <= MAX_POINTS)
}

/// Cuts `moves` into pieces at every source and destination boundary and at the images of those points
/// under the moves' shifts (a point inside a source maps to the same place in the destination, and back),
/// until no new point appears. Then a piece's destination is exactly one piece's source or meets none.
/// Falls back to `ALIGN`-byte pieces past [`MAX_POINTS`] points. The split points go to `points`, each
/// queued once in `queue` when first inserted (the closure is the same in any order); allocates
/// nothing ([`MoveBufs`]).
fn pieces_into(
    moves: &[(usize, usize, usize)],
    points: &mut Vec<usize>,
    queue: &mut Vec<usize>,
    out: &mut Vec<(usize, usize, usize)>,
) -> Result<(), Full> {
    points.clear();
    queue.clear();
    out.clear();
    let mut within = true;
    'seed: for &(s, d, l) in moves {
        for p in [s, s + l, d, d + l] {
            if !insert(points, queue, p)? {
                within = false;
                break 'seed;
            }
        }
    }
    while within {
        let Some(p) = queue.pop() else {
            break;
        };
        for &(s, d, l) in moves {
            if s < p && p < s + l && !insert(points, queue, p - s + d)? {
                within = false;
                break;
            }
            if d < p && p < d + l && !insert(points, queue, p - d + s)? {
                within = false;
                break;
            }
        }
    }
    if !within {
        for &(s, d, l) in moves {
            for k in 0..l / ALIGN {
                push(out, (s + k * ALIGN, d + k * ALIGN, ALIGN))?;
            }
        }
        return Ok(());
    }
    for &(s, d, l) in moves {
        // Cuts of this move: points inside its source, and (mapped back) inside its destination; by
        // closure both sets are the same.
        let lo = points.partition_point(|&p| p <= s);
        let mut at = s;
        for &p in points[lo..].iter().take_while(|&&p| p < s + l) {
            push(out, (at, at - s + d, p - at))?;
            at = p;
        }
        push(out, (at, at - s + d, s + l - at))?;
    }
    Ok(())
}

/// Merges runs of block copies that one `copy_within` (a memmove: everything read before anything is
/// written) carries out exactly as the sequence did: adjacent blocks of the same shift, where no block's
/// write lands on a later block's source. Chains of megabyte tensors then take a few copies instead of
/// one per 64-byte block.
#[cfg(test)]
pub(super) fn coalesce(mut copies: Vec<(usize, usize, usize)>) -> Vec<(usize, usize, usize)> {
    coalesce_in_place(&mut copies);
    copies
}

/// [`coalesce`] in place (the merged sequence is never longer).
fn coalesce_in_place(copies: &mut Vec<(usize, usize, usize)>) {
    let mut w = 0usize;
    for r in 0..copies.len() {
        let c = copies[r];
        if w > 0 {
            let last = &mut copies[w - 1];
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
        copies[w] = c;
        w += 1;
    }
    copies.truncate(w);
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
                // Under Miri (which checks every byte it touches, ~1000× slower) up to 70 blocks: still
                // more than one bounce buffer (64 blocks), so cycles still take several chunks.
                let long = if cfg!(miri) { 70 } else { 200 };
                let most = if rng.below(2) == 0 { 4 } else { long };
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
        for case in 0..if cfg!(miri) { 12 } else { 3000 } {
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
