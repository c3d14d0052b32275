//! The GEMM conformance suite shared by the f32 (`gemm/tests.rs`) and int8 (`int8/tests.rs`) kernels:
//! operand layouts and values, the check against the element type's reference product, the fixed
//! large shapes and empty cases, and the harness that runs a kernel family's suite only where the
//! family is available, says so on stderr when it is not ("skipped" is not "passed"), and fails when
//! `FRUGAL_REQUIRE_KERNELS` names it (`cargo xtask cross` / the kernel table in `xtask/src/kernels.rs`).
//! [`gemm_conformance!`] instantiates the suite for one family; each element type says through
//! [`GemmUnderTest`] how its values look and how close a result must be (f32: the dot-product error
//! bound; int8: bit-exact).
use core::fmt::Debug;
use std::sync::Once;
use std::{format, string::String, vec, vec::Vec};

use proptest::prelude::*;

use super::gemm::MatRef;

/// How an operand is laid out in memory.
#[derive(Clone, Copy, Debug)]
pub(super) enum Layout {
    /// Row-major, rows padded by `pad`.
    Row(usize),
    /// Column-major (the transpose of a row-major matrix), columns padded by `pad`.
    Col(usize),
    /// Neither stride is 1: element (i, j) at `i·(2·cols + 1) + 2·j`.
    Strided,
}

pub(super) fn layout_strategy() -> impl Strategy<Value = Layout> {
    prop_oneof![
        (0usize..3).prop_map(Layout::Row),
        (0usize..3).prop_map(Layout::Col),
        Just(Layout::Strided),
    ]
}

/// Tiny deterministic generator for operand values (keeps proptest's inputs small).
pub(super) struct Lcg(pub u64);
impl Lcg {
    pub(super) fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
}

/// An operand of `rows×cols` in `layout`, with `data` holding only what the layout addresses plus the
/// padding between rows/columns, filled with `pad` (a value whose use would show).
pub(super) fn operand<T: Copy>(
    rows: usize,
    cols: usize,
    layout: Layout,
    pad: T,
    mut value: impl FnMut() -> T,
) -> (Vec<T>, usize, usize) {
    let (rs, cs) = match layout {
        Layout::Row(pad) => (cols + pad, 1),
        Layout::Col(pad) => (1, rows + pad),
        Layout::Strided => (2 * cols + 1, 2),
    };
    let len = if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * rs + (cols - 1) * cs + 1
    };
    let mut data = vec![pad; len];
    for i in 0..rows {
        for j in 0..cols {
            data[i * rs + j * cs] = value();
        }
    }
    (data, rs, cs)
}

/// A GEMM kernel family and its element types, as the shared suite drives it.
pub(super) trait GemmUnderTest: Copy + Debug {
    /// Operand (and scratch) element.
    type E: Copy + Debug;
    /// Element of C.
    type C: Copy + Debug + PartialEq;
    /// Operand padding (NaN, or a value whose products would show).
    const PAD: Self::E;
    /// What the scratch is filled with before a product.
    const SCRATCH_FILL: Self::E;
    /// C outside the product's rows and columns (must come back untouched).
    const C_SENTINEL: Self::C;
    /// The name `FRUGAL_REQUIRE_KERNELS` uses.
    fn name(self) -> &'static str;
    fn is_available(self) -> bool;
    /// An operand value; `special`: f32 small integers (every sum exact), int8 the extremes.
    fn value(rng: &mut Lcg, special: bool) -> Self::E;
    /// An initial C value.
    fn c_value(rng: &mut Lcg, special: bool) -> Self::C;
    /// `v` as a C value (small integers).
    fn c_of(v: i8) -> Self::C;
    fn scratch_len(m: usize, n: usize, k: usize) -> usize;
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        self,
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<'_, Self::E>,
        b: MatRef<'_, Self::E>,
        c: &mut [Self::C],
        ldc: usize,
        accumulate: bool,
        scratch: &mut [Self::E],
    );
    #[allow(clippy::too_many_arguments)]
    fn reference(
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<'_, Self::E>,
        b: MatRef<'_, Self::E>,
        c: &mut [Self::C],
        ldc: usize,
        accumulate: bool,
    );
    /// Whether `got` is close enough to the reference `want` for C[i][j] (`c0`: its value before).
    #[allow(clippy::too_many_arguments)]
    fn agrees(
        case: &Case,
        a: MatRef<'_, Self::E>,
        b: MatRef<'_, Self::E>,
        i: usize,
        j: usize,
        c0: Self::C,
        got: Self::C,
        want: Self::C,
    ) -> Result<(), String>;
}

/// One conformance case; `scratch_len = None` means exactly the element type's scratch formula.
#[derive(Clone, Copy, Debug)]
pub(super) struct Case {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub la: Layout,
    pub lb: Layout,
    pub ldc_pad: usize,
    pub accumulate: bool,
    /// See [`GemmUnderTest::value`].
    pub special: bool,
    pub scratch_len: Option<usize>,
    pub seed: u64,
}

/// Runs `case` through `kernel` and checks it against the reference, and that nothing outside C's
/// `m×n` elements was written; `Err` describes the first mismatch.
pub(super) fn check<K: GemmUnderTest>(kernel: K, case: Case) -> Result<(), String> {
    let Case {
        m,
        n,
        k,
        la,
        lb,
        ldc_pad,
        accumulate,
        special,
        scratch_len,
        seed,
    } = case;
    let mut rng = Lcg(seed);
    let (a, ars, acs) = operand(m, k, la, K::PAD, || K::value(&mut rng, special));
    let (b, brs, bcs) = operand(k, n, lb, K::PAD, || K::value(&mut rng, special));
    let a = MatRef {
        data: &a,
        rs: ars,
        cs: acs,
    };
    let b = MatRef {
        data: &b,
        rs: brs,
        cs: bcs,
    };
    let ldc = n + ldc_pad;
    // C has one extra row's worth of sentinel after the last row, and sentinels in the row padding.
    let mut c = vec![K::C_SENTINEL; m * ldc + 3];
    for i in 0..m {
        for j in 0..n {
            c[i * ldc + j] = K::c_value(&mut rng, special);
        }
    }
    let c0 = c.clone();
    let mut want = c.clone();
    K::reference(m, n, k, a, b, &mut want, ldc, accumulate);
    let full = K::scratch_len(m, n, k);
    let mut scratch = vec![K::SCRATCH_FILL; scratch_len.unwrap_or(full).min(full)];
    kernel.gemm(m, n, k, a, b, &mut c, ldc, accumulate, &mut scratch);
    for (idx, (&got, &orig)) in c.iter().zip(&c0).enumerate() {
        let (i, j) = (idx / ldc.max(1), idx % ldc.max(1));
        if i < m && j < n {
            K::agrees(&case, a, b, i, j, orig, got, want[idx])?;
        } else if got != orig {
            return Err(format!(
                "wrote outside C at element {idx}: {got:?}, was {orig:?}"
            ));
        }
    }
    Ok(())
}

/// Random cases up to `max_dim` in each dimension (`m`, `n` from `min_mn`), with a scratch up to
/// `max_scratch` a quarter of the time and `special` values with probability `special`.
pub(super) fn case_strategy(
    min_mn: usize,
    max_dim: usize,
    special: f64,
    max_scratch: usize,
) -> impl Strategy<Value = Case> {
    (
        (min_mn..=max_dim, min_mn..=max_dim, 0..=max_dim),
        (layout_strategy(), layout_strategy(), 0usize..4),
        (any::<bool>(), prop::bool::weighted(special)),
        prop_oneof![3 => Just(None), 1 => (0usize..max_scratch).prop_map(Some)],
        any::<u64>(),
    )
        .prop_map(
            |((m, n, k), (la, lb, ldc_pad), (accumulate, special), scratch_len, seed)| Case {
                m,
                n,
                k,
                la,
                lb,
                ldc_pad,
                accumulate,
                special,
                scratch_len,
                seed,
            },
        )
}

/// Fixed shapes in three layout pairs, each overwriting, accumulating and with a `small_scratch`.
pub(super) fn large_shapes<K: GemmUnderTest>(
    kernel: K,
    shapes: &[(usize, usize, usize)],
    small_scratch: usize,
) {
    let layouts = [Layout::Row(0), Layout::Col(1), Layout::Strided];
    for (s, &(m, n, k)) in shapes.iter().enumerate() {
        for (t, (&la, &lb)) in layouts.iter().zip(layouts.iter().rev()).enumerate() {
            for (accumulate, scratch_len) in
                [(false, None), (true, None), (false, Some(small_scratch))]
            {
                let case = Case {
                    m,
                    n,
                    k,
                    la,
                    lb,
                    ldc_pad: t,
                    accumulate,
                    special: t == 1,
                    scratch_len,
                    seed: (s * 7 + t) as u64,
                };
                assert_eq!(check(kernel, case), Ok(()), "{case:?}");
            }
        }
    }
}

/// `k = 0`: C is kept when accumulating, else zeroed (its row padding kept either way).
pub(super) fn k_zero_zeroes_or_keeps<K: GemmUnderTest>(kernel: K) {
    let five = K::c_of(5);
    let zero = K::c_of(0);
    let mut c = [five; 12];
    let e: [K::E; 0] = [];
    let (a, b) = (MatRef::row_major(&e, 0), MatRef::row_major(&e, 3));
    kernel.gemm(3, 3, 0, a, b, &mut c, 4, true, &mut []);
    assert_eq!(c, [five; 12]);
    kernel.gemm(3, 3, 0, a, b, &mut c, 4, false, &mut []);
    let want: Vec<K::C> = (0..12)
        .map(|i| if i % 4 == 3 { five } else { zero })
        .collect();
    assert_eq!(c[..], want[..]);
}

/// `m = 0` or `n = 0`: nothing is read or written (C may be empty).
pub(super) fn empty_m_or_n_touches_nothing<K: GemmUnderTest>(kernel: K) {
    let mut rng = Lcg(1);
    let a: Vec<K::E> = (0..6).map(|_| K::value(&mut rng, false)).collect();
    let mut c: [K::C; 0] = [];
    let ma = MatRef::row_major(&a, 2);
    kernel.gemm(
        0,
        3,
        2,
        ma,
        MatRef::row_major(&a, 3),
        &mut c,
        3,
        false,
        &mut [],
    );
    kernel.gemm(
        3,
        0,
        2,
        ma,
        MatRef::row_major(&a, 0),
        &mut c,
        0,
        false,
        &mut [],
    );
}

/// `Some(kernel)` where it can run; else `None`, said once per suite (`said`) on stderr past the test
/// harness's capture, so a skip shows in every `cargo test` run. Panics when `FRUGAL_REQUIRE_KERNELS`
/// (comma-separated names) requires it.
pub(super) fn available<K: GemmUnderTest>(kernel: K, said: &Once) -> Option<K> {
    if kernel.is_available() {
        return Some(kernel);
    }
    skipped(kernel.name(), &format!("{kernel:?} kernel suite"), said);
    None
}

/// Says once (`said`) on stderr, past the test harness's capture, that `what` was skipped because
/// the kernel `name` cannot run here; panics instead when `FRUGAL_REQUIRE_KERNELS` (comma-separated
/// names) requires that kernel.
pub(super) fn skipped(name: &str, what: &str, said: &Once) {
    let required = std::env::var("FRUGAL_REQUIRE_KERNELS")
        .is_ok_and(|v| v.split(',').any(|n| n.trim() == name));
    assert!(
        !required,
        "{name} is required here (FRUGAL_REQUIRE_KERNELS) but not available"
    );
    said.call_once(|| {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "skipped: {what} (not available here)");
    });
}

/// The shared GEMM suite for each `name => kernel` of one element type, as modules named `name` with
/// a `kernel()` (see [`available`]) for the element type's own tests added in `extra`:
/// `gemm_conformance! { cases: N, random: (min_mn, max_dim, special, max_scratch), large: SHAPES,
/// small_scratch: S, kind: KernelType, extra: { items }, kernels: { name => kernel; … } }`.
macro_rules! gemm_conformance {
    (
        cases: $cases:expr,
        random: $random:tt,
        large: $large:expr,
        small_scratch: $small:expr,
        kind: $kind:ty,
        extra: $extra:tt,
        kernels: { $($name:ident => $kernel:expr;)* }
    ) => {$(
        $crate::kernels::testkit::gemm_conformance!(@one $name, $kernel, $kind, $cases, $random, $large, $small, $extra);
    )*};
    (
        @one $name:ident, $kernel:expr, $kind:ty, $cases:expr,
        ($min_mn:expr, $max_dim:expr, $special:expr, $max_scratch:expr),
        $large:expr, $small:expr, { $($extra:tt)* }
    ) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            #[allow(unused_imports)]
            use proptest::prelude::*;
            use $crate::kernels::testkit as kit;

            fn kernel() -> Option<$kind> {
                static SAID: std::sync::Once = std::sync::Once::new();
                kit::available($kernel, &SAID)
            }

            proptest! {
                #![proptest_config(ProptestConfig { cases: $cases, failure_persistence: None, ..ProptestConfig::default() })]
                #[test]
                fn gemm_matches_reference(case in kit::case_strategy($min_mn, $max_dim, $special, $max_scratch)) {
                    if let Some(kern) = kernel() {
                        prop_assert_eq!(kit::check(kern, case), Ok(()));
                    }
                }
            }

            #[test]
            fn gemm_large_shapes_all_layouts() {
                if let Some(kern) = kernel() {
                    kit::large_shapes(kern, $large, $small);
                }
            }

            #[test]
            fn gemm_k_zero_zeroes_or_keeps() {
                if let Some(kern) = kernel() {
                    kit::k_zero_zeroes_or_keeps(kern);
                }
            }

            #[test]
            fn gemm_empty_m_or_n_touches_nothing() {
                if let Some(kern) = kernel() {
                    kit::empty_m_or_n_touches_nothing(kern);
                }
            }

            $($extra)*
        }
    };
}
pub(super) use gemm_conformance;
