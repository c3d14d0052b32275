//! The blocked GEMM driver shared by the f32 ([`super::gemm`]) and int8 ([`super::int8`]) products:
//! operand validation, the BLIS-style loops over `NC`/`KC` blocks and `MR`×`NR` register tiles with their
//! edges, packing into caller scratch, and the split of a block over a [`WorkerPool`].
//!
//! ```text
//! for jc in n by NC:                      B block (KC×NC, packed once per (jc, pc)) lives in L2
//!   for pc in k by KC:
//!     pack B[pc.., jc..] into panels of NR   (panel ranges split over the workers)
//!     for ir in m by MR:                    (rows of C split into bands, one per worker)
//!       pack A[ir.., pc..] into one MR×KC panel (stays in L1), or read A in place
//!       for jr in NC by NR:
//!         micro-kernel: C[ir.., jc+jr..] (+)= Apanel · Bpanel   (edge tiles: rows ≤ MR, cols ≤ NR)
//! ```
//!
//! A band of few rows whose A is read in place (an RNN step's 32 rows) swaps the two inner loops, so
//! that each B panel serves every row panel while it is in L1 (see `A_RESIDENT`).
//!
//! What differs per element type is behind [`Micro`]: the packed layouts (f32 panels of single depth
//! steps; int8 panels of `G`-step groups, i16-widened or with column sums), the scratch fit, the
//! unpacked fallback and the register tile. Every tile is computed from the same packed operands in
//! the same depth order whatever the worker count, so results do not depend on it (int8: bit-exact).
use core::ops::Range;

use super::gemm::MatRef;
use super::par;
use crate::pool::WorkerPool;

/// Rounds `a` up to a multiple of `b`.
pub(super) fn round_up(a: usize, b: usize) -> usize {
    a.div_ceil(b) * b
}

/// Splits `len` into `ceil(len / cap)` near-equal blocks and returns the block size.
pub(super) fn balanced(len: usize, cap: usize) -> usize {
    len.div_ceil(len.div_ceil(cap))
}

/// The block sizes of one product, in scratch elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Blocking {
    /// Depth block (every k block but the last has exactly this size).
    pub kc: usize,
    /// Column block, a multiple of NR (every n block but the last has exactly this size).
    pub nc: usize,
    /// Elements of one packed A region (a multiple of the alignment, so the B block after the first
    /// one starts aligned too).
    pub a_len: usize,
    /// Elements of the packed B block.
    pub b_len: usize,
}

impl Blocking {
    pub(super) fn len(&self) -> usize {
        self.a_len + self.b_len
    }
}

/// One validated product: `m, n, k ≥ 1`, operands addressable, `C` long enough, `ldc ≥ n` if `m > 1`.
pub(super) struct Problem<'a, E> {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: MatRef<'a, E>,
    pub b: MatRef<'a, E>,
    pub ldc: usize,
    pub accumulate: bool,
}

/// Whether every element (i < rows, j < cols) of `x` is inside `x.data` (rows, cols ≥ 1).
fn addressable<E: Copy>(x: MatRef<'_, E>, rows: usize, cols: usize) -> bool {
    (rows - 1)
        .checked_mul(x.rs)
        .and_then(|r| (cols - 1).checked_mul(x.cs).and_then(|c| r.checked_add(c)))
        .is_some_and(|last| last < x.data.len())
}

/// Checks a product's operands (panicking, prefixed with `what`, on short operands or overlapping rows
/// of C) and finishes the empty cases: nothing for `m = 0` or `n = 0`; for `k = 0`, `C = 0` unless
/// `accumulate`. `Some` when there is something to multiply.
#[allow(clippy::too_many_arguments)]
pub(super) fn validate<'a, E: Copy, C: Copy + Default>(
    what: &str,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'a, E>,
    b: MatRef<'a, E>,
    c: &mut [C],
    ldc: usize,
    accumulate: bool,
) -> Option<Problem<'a, E>> {
    if m == 0 || n == 0 {
        return None;
    }
    assert!(m == 1 || ldc >= n, "{what}: ldc ({ldc}) < n ({n})");
    let c_need = (m - 1).checked_mul(ldc).and_then(|x| x.checked_add(n));
    assert!(
        c_need.is_some_and(|need| c.len() >= need),
        "{what}: C too short"
    );
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                c[i * ldc..i * ldc + n].fill(C::default());
            }
        }
        return None;
    }
    // These two checks are what makes every packing read in bounds: any element (i, p) with i < m,
    // p < k has index ≤ (m-1)·rs + (k-1)·cs < len, and that sum does not overflow.
    assert!(addressable(a, m, k), "{what}: A too short for its strides");
    assert!(addressable(b, k, n), "{what}: B too short for its strides");
    Some(Problem {
        m,
        n,
        k,
        a,
        b,
        ldc,
        accumulate,
    })
}

/// One register tile's operands: `C[rows×cols] (+)= A·B` over `kc` depth steps, where `C` (passed
/// alongside) starts at the tile's first element with row stride `ldc`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tile<'a, E> {
    pub kc: usize,
    /// A rows: a packed panel (`a_rs = 1`, `a_ps = MR`; int8: in its grouped layout) or, for a
    /// [`Micro::a_in_place`] kernel, A in place with element (r, p) at `r·a_rs + p·a_ps`.
    pub a: &'a [E],
    pub a_rs: usize,
    pub a_ps: usize,
    /// B: a packed panel (f32: element (p, j) at `p·ldb + j`, `ldb` its width) or, for a
    /// [`Micro::b_in_place`] kernel, B in place (row stride `ldb`).
    pub b: &'a [E],
    pub ldb: usize,
    /// Whether B is a (zero-padded) packed panel rather than B in place.
    pub b_padded: bool,
    pub ldc: usize,
    pub rows: usize,
    pub cols: usize,
    /// Add to C instead of overwriting it.
    pub acc: bool,
}

/// A micro-kernel family with its packed layouts, as the driver sees it.
pub(super) trait Micro: Copy + Sync {
    /// Operand and packed-scratch element.
    type E: Copy + Send + Sync;
    /// Element of C (the accumulator).
    type C: Copy + Send + Sync;
    /// Register tile rows (height of a packed A panel).
    const MR: usize;
    /// Register tile columns (width of a full packed B panel).
    const NR: usize;
    /// Whether [`Micro::tile`] can read A in place (then extra workers without an A region of their
    /// own read it in place; otherwise the worker count is capped by the A regions).
    const A_IN_PLACE: bool;
    /// Scratch layout: `[B block | A regions …]` (f32: keeps B 64-byte aligned) rather than
    /// `[A region | B block | further A regions]` (int8: its A region is a multiple of 64 bytes).
    const B_FIRST: bool;
    /// Whether this product reads A in place instead of packing it.
    fn a_in_place(p: &Problem<'_, Self::E>) -> bool;
    /// Whether this product reads a row-major B in place instead of packing it.
    fn b_in_place(p: &Problem<'_, Self::E>) -> bool;
    /// Block sizes that fit `scratch`, and the offset of the (aligned when possible) packed region;
    /// regions not packed get no room; `None` when not even one panel pair fits.
    fn fit(
        n: usize,
        k: usize,
        pack_a: bool,
        pack_b: bool,
        scratch: &[Self::E],
    ) -> Option<(Blocking, usize)>;
    /// Elements of one packed A panel `kc` deep.
    fn a_panel(kc: usize) -> usize;
    /// Where the packed B panel starting at column `j` of a `kc`-deep block of `nc` columns lies in
    /// the block, and its row stride for [`Tile::ldb`].
    fn b_panel(nc: usize, j: usize, kc: usize) -> (Range<usize>, usize);
    /// Packs rows `i0..i0+rows` × depth `p0..p0+kc` of A into one panel `dst`.
    fn pack_a(
        self,
        a: MatRef<'_, Self::E>,
        i0: usize,
        p0: usize,
        rows: usize,
        kc: usize,
        dst: &mut [Self::E],
    );
    /// Packs depth `p0..p0+kc` × columns `j0..j0+cols` (`j0 - jc` a multiple of NR) of B into the
    /// consecutive panels `dst`.
    fn pack_b(
        self,
        b: MatRef<'_, Self::E>,
        p0: usize,
        j0: usize,
        cols: usize,
        kc: usize,
        dst: &mut [Self::E],
    );
    /// Runs one register tile.
    fn tile(self, t: &Tile<'_, Self::E>, c: &mut [Self::C]);
    /// Correct, slower product without packing, for a scratch too short to hold a panel pair.
    fn unpacked(p: &Problem<'_, Self::E>, c: &mut [Self::C]);
}

/// A band of C's rows whose A (read in place) has at most this many elements per depth block
/// (64 KiB of f32: L2-resident) is computed columns-outer; see `drive`.
const A_RESIDENT: usize = 16 * 1024;

/// Products with fewer multiply-adds than this per task are not split across workers (the fork-join
/// costs a few microseconds).
const PAR_MIN_FMAS: usize = if cfg!(test) { 16 } else { 1 << 18 };

/// The blocked product. With a pool of more than one worker, each (jc, pc) block is two fork-joins:
/// the B block is packed panel range by panel range, then the register-tile rows of C are split into
/// contiguous bands, one per task. Every tile is computed exactly as with one worker (same blocks, same
/// kernel, same depth order), so the result does not depend on the worker count. Scratch layout (see
/// [`Micro::B_FIRST`]): the B block and the A regions of tasks 0, 1, …; task `w ≥ 1` packs A into its region
/// when the scratch has it, else reads A in place (only a kernel with [`Micro::A_IN_PLACE`] gets such
/// tasks; the SIMD kernels compute the same values either way).
pub(super) fn drive<M: Micro>(
    kern: M,
    p: &Problem<'_, M::E>,
    c: &mut [M::C],
    scratch: &mut [M::E],
    pool: &dyn WorkerPool,
) {
    let (mr, nr) = (M::MR, M::NR);
    let (m, n, k, a, b, ldc) = (p.m, p.n, p.k, p.a, p.b, p.ldc);
    let b_in_place = M::b_in_place(p);
    let a_in_place = M::a_in_place(p);
    let Some((blk, off)) = M::fit(n, k, !a_in_place, !b_in_place, scratch) else {
        return M::unpacked(p, c);
    };
    let mt = m.div_ceil(mr);
    let (a_first, bpack, a_more) = if M::B_FIRST {
        let (bpack, rest) = scratch[off..].split_at_mut(blk.b_len);
        let (a_first, a_more) = rest.split_at_mut(blk.a_len);
        (a_first, bpack, a_more)
    } else {
        let (a_first, rest) = scratch[off..].split_at_mut(blk.a_len);
        let (bpack, a_more) = rest.split_at_mut(blk.b_len);
        (a_first, bpack, a_more)
    };
    let extra_a = a_more.len().checked_div(blk.a_len).unwrap_or(usize::MAX);
    let mut tasks =
        par::tasks_for(pool, m.saturating_mul(n).saturating_mul(k), PAR_MIN_FMAS).min(mt);
    if !M::A_IN_PLACE {
        tasks = tasks.min(extra_a.saturating_add(1));
    }
    let a_regions = if blk.a_len == 0 {
        0
    } else {
        tasks.min(extra_a.saturating_add(1))
    };
    let c_end = (m - 1) * ldc + n;
    let rows_of = |w: usize| {
        let t = crate::pool::chunk(mt, tasks, 1, w);
        (t.start * mr).min(m)..(t.end * mr).min(m)
    };
    for jc in (0..n).step_by(blk.nc) {
        let nc = blk.nc.min(n - jc);
        let npanels = nc.div_ceil(nr);
        for (pi, pc) in (0..k).step_by(blk.kc).enumerate() {
            let kc = blk.kc.min(k - pc);
            if !b_in_place {
                let ptasks = tasks.min(npanels);
                // Panel q starts at `at(q)`; `at(npanels)` is the end of the block.
                let at = |q: usize| {
                    if q < npanels {
                        M::b_panel(nc, q * nr, kc).0.start
                    } else {
                        M::b_panel(nc, (npanels - 1) * nr, kc).0.end
                    }
                };
                let span = |w: usize| {
                    let q = crate::pool::chunk(npanels, ptasks, 1, w);
                    let j0 = (q.start * nr).min(nc);
                    let j1 = (q.end * nr).min(nc);
                    (j0, j1, at(q.start)..at(q.end))
                };
                let pack = |w: usize, dst: &mut [M::E]| {
                    let (j0, j1, _) = span(w);
                    if j1 > j0 {
                        kern.pack_b(b, pc, jc + j0, j1 - j0, kc, dst);
                    }
                };
                // `!SPLITS` is a constant: where threads cannot run (Cortex-M0), the split path and its
                // `Shards` (hundreds of bytes each) leave the frame: 1.6 KB of stack on the micro:bit.
                if ptasks == 1 || !par::SPLITS {
                    pack(0, &mut bpack[..]);
                } else {
                    let sh = par::Shards::new(&mut bpack[..], ptasks, |w| span(w).2);
                    pool.run(ptasks, &|w| pack(w, sh.take(w)));
                }
            }
            let bpack = &*bpack;
            let acc = p.accumulate || pi > 0;
            // One register tile: rows `ir..` of A (`at`, strides `a_rs`, `a_ps`) times columns
            // `jr..` of the B block, into C's band `cb` (which starts at row `row0`).
            let tile =
                |ir: usize, jr: usize, row0: usize, cb: &mut [M::C], at: &[M::E], a_rs, a_ps| {
                    let rows_t = mr.min(m - ir);
                    let cols = nr.min(nc - jr);
                    let (bt, ldb) = if b_in_place {
                        let b0 = pc * b.rs + jc + jr;
                        (&b.data[b0..b0 + (kc - 1) * b.rs + cols], b.rs)
                    } else {
                        let (r, ldb) = M::b_panel(nc, jr, kc);
                        (&bpack[r], ldb)
                    };
                    let t = Tile {
                        kc,
                        a: at,
                        a_rs,
                        a_ps,
                        b: bt,
                        ldb,
                        b_padded: !b_in_place,
                        ldc,
                        rows: rows_t,
                        cols,
                        acc,
                    };
                    let c0 = (ir - row0) * ldc + jc + jr;
                    kern.tile(&t, &mut cb[c0..c0 + (rows_t - 1) * ldc + cols]);
                };
            // A in place, rows `ir..` at depth `pc..`.
            let a_at = |ir: usize| {
                let rows_t = mr.min(m - ir);
                let a0 = ir * a.rs + pc * a.cs;
                &a.data[a0..a0 + (rows_t - 1) * a.rs + (kc - 1) * a.cs + 1]
            };
            // Rows `rows` of C (its band `cb` starts at row `rows.start`), A packed into `ap` if given.
            let body = |rows: Range<usize>, cb: &mut [M::C], mut ap: Option<&mut [M::E]>| {
                let packs = ap.is_some() && !a_in_place;
                if !packs && rows.len().saturating_mul(kc) <= A_RESIDENT {
                    // Few rows, read in place: columns outer, so that each B panel is used by every
                    // row panel while it is in L1 and the band's A stays in L2, instead of the whole
                    // B block streaming past once per row panel. Each tile is computed as in the
                    // rows-outer order, so the bits are the same.
                    for jr in (0..nc).step_by(nr) {
                        for ir in rows.clone().step_by(mr) {
                            tile(ir, jr, rows.start, cb, a_at(ir), a.rs, a.cs);
                        }
                    }
                    return;
                }
                for ir in rows.clone().step_by(mr) {
                    let rows_t = mr.min(m - ir);
                    let (at, a_rs, a_ps) = match ap.as_deref_mut() {
                        Some(ap) if packs => {
                            let ap = &mut ap[..M::a_panel(kc)];
                            kern.pack_a(a, ir, pc, rows_t, kc, ap);
                            (&*ap, 1, mr)
                        }
                        _ => (a_at(ir), a.rs, a.cs),
                    };
                    for jr in (0..nc).step_by(nr) {
                        tile(ir, jr, rows.start, cb, at, a_rs, a_ps);
                    }
                }
            };
            if tasks == 1 || !par::SPLITS {
                body(0..m, &mut c[..c_end], Some(&mut a_first[..]));
            } else {
                let cs = par::Shards::new(&mut c[..c_end], tasks, |w| {
                    let r = rows_of(w);
                    let start = (r.start * ldc).min(c_end);
                    start..if r.end == m { c_end } else { r.end * ldc }
                });
                // Task 0's A region, and those of tasks 1, 2, … (see `Micro::B_FIRST`).
                let first = par::Shards::new(&mut a_first[..], 1, |_| 0..blk.a_len);
                let more_n = a_regions.saturating_sub(1);
                let more =
                    par::Shards::new(&mut a_more[..more_n * blk.a_len], more_n.max(1), |w| {
                        if more_n == 0 {
                            0..0
                        } else {
                            w * blk.a_len..(w + 1) * blk.a_len
                        }
                    });
                pool.run(tasks, &|w| {
                    let ap = match w {
                        0 if a_regions > 0 => Some(first.take(0)),
                        w if w < a_regions => Some(more.take(w - 1)),
                        _ => None,
                    };
                    body(rows_of(w), cs.take(w), ap);
                });
            }
        }
    }
}
