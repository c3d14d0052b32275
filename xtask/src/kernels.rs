//! Which kernels ran where: the table `cargo xtask test` ends with (issue: "skipped is not passed").
//!
//! Every leg that runs a kernel suite names the kernels it *requires* (`FRUGAL_REQUIRE_KERNELS`): the
//! suites fail rather than skip a required kernel, so "ran" in the table is checked, not assumed. On this
//! machine the tests leg requires every kernel this CPU has; the others are reported skipped, with why.
use frugal_core::kernels::gemm::SgemmKernel;
use frugal_core::kernels::int8::IgemmKernel;

use crate::test::Leg;

/// The emulated aarch64 CPUs `cargo xtask cross` runs the int8 and f32 GEMM suites on, with the kernels
/// each must run (`neon` names both the f32 and the int8 NEON kernel: both are required on both CPUs).
pub const AARCH64: [(&str, &str); 2] = [
    ("max", "portable,neon,neon-dotprod"),
    ("cortex-a53", "portable,neon"),
];
/// The kernels the wasm32 (simd128, Node's WASI) run of `cargo xtask cross` must run.
pub const WASM: &str = "portable,simd128";

/// Every f32 and int8 kernel this CPU can run, as `FRUGAL_REQUIRE_KERNELS` wants them.
pub fn native_required() -> String {
    let f32s = F32.iter().filter(|k| k.is_available()).map(|k| k.name());
    let int8 = IgemmKernel::ALL
        .iter()
        .filter(|k| k.is_available())
        .map(|k| k.name());
    let mut v: Vec<&str> = f32s.chain(int8).collect();
    v.sort_unstable();
    v.dedup();
    v.join(",")
}

const F32: [SgemmKernel; 5] = [
    SgemmKernel::Portable,
    SgemmKernel::Avx2,
    SgemmKernel::Avx512,
    SgemmKernel::Simd128,
    SgemmKernel::Neon,
];

/// What a leg's run says about its kernels.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum LegResult {
    Passed,
    Failed,
    NotRun,
}

/// The table: a row per kernel, a column per machine; `leg` tells how each leg ended.
pub fn table(leg: impl Fn(Leg) -> LegResult) -> String {
    // Columns: (heading, the leg that runs there).
    let cols: [(&str, Leg); 6] = [
        ("x86-64, this CPU", Leg::Tests),
        ("aarch64 qemu -cpu max", Leg::Cross),
        ("aarch64 qemu -cpu cortex-a53", Leg::Cross),
        ("wasm32 + simd128 (Node)", Leg::Cross),
        ("Cortex-M4F (QEMU)", Leg::FirmwareM4),
        ("Cortex-M0 (QEMU)", Leg::FirmwareM0),
    ];
    // What each column does with a kernel: runs (and requires) its suite — on the boards, trains with
    // it —, lacks it, does not build it for that target, or has no suite for that family.
    enum Cell {
        Runs,
        Unavailable(&'static str),
        NotBuilt,
        NoSuite,
    }
    let native = native_required();
    let has = |list: &str, k: &str| list.split(',').any(|n| n == k);
    let cell = |col: usize, family: &str, k: &'static str| -> Cell {
        let x86 = matches!(k, "avx2+fma" | "avx512f" | "avx2" | "avx512-vnni");
        let arm = matches!(k, "neon" | "neon-dotprod");
        match col {
            0 if k == "simd128" || arm => Cell::NotBuilt,
            0 if has(&native, k) => Cell::Runs,
            0 => Cell::Unavailable("this CPU lacks it"),
            1 | 2 if x86 || k == "simd128" => Cell::NotBuilt,
            1 | 2 if has(AARCH64[col - 1].1, k) => Cell::Runs,
            1 | 2 => Cell::Unavailable("the emulated CPU lacks it"),
            3 if has(WASM, k) => Cell::Runs,
            3 => Cell::NotBuilt,
            // The boards train with the portable kernels (f32 and int8 on the M4F, int8 on the M0).
            4 if k == "portable" => Cell::Runs,
            5 if k == "portable" && family == "int8" => Cell::Runs,
            4 | 5 if k == "portable" => Cell::NoSuite,
            _ => Cell::NotBuilt,
        }
    };
    let gpu = match leg(Leg::Gpu) {
        LegResult::Passed => "ran (this machine's adapter)",
        LegResult::Failed => "**failed**",
        LegResult::NotRun => "not run (gpu skipped)",
    };
    let mut s = String::from("\n| kernel |");
    for (h, _) in &cols {
        s.push_str(&format!(" {h} |"));
    }
    s.push_str("\n|---|");
    s.push_str(&"---|".repeat(cols.len()));
    s.push('\n');
    let rows = F32
        .iter()
        .map(|k| ("f32", k.name()))
        .chain(IgemmKernel::ALL.iter().map(|k| ("int8", k.name())));
    for (family, k) in rows {
        s.push_str(&format!("| {family} {k} |"));
        for (col, (_, l)) in cols.iter().enumerate() {
            let text = match (cell(col, family, k), leg(*l)) {
                (Cell::NotBuilt, _) => "–".to_string(),
                (Cell::NoSuite, _) => "no suite here".to_string(),
                (Cell::Unavailable(why), _) => format!("skipped: {why}"),
                (Cell::Runs, LegResult::Passed) => "ran".to_string(),
                (Cell::Runs, LegResult::Failed) => "**failed**".to_string(),
                (Cell::Runs, LegResult::NotRun) => format!("not run ({} skipped)", l.name()),
            };
            s.push_str(&format!(" {text} |"));
        }
        s.push('\n');
    }
    s.push_str(&format!(
        "| f32 wgpu kernels (WGSL) | {gpu} |{}\n",
        " – |".repeat(cols.len() - 1)
    ));
    // The op conformance suite (hosts/wgpu/tests/conformance.rs): every op against an f64 reference,
    // through the CPU backend in the tests leg and the wgpu backend in the gpu leg (which requires the
    // adapter; the tests leg's run may skip it).
    let cpu_conf = match leg(Leg::Tests) {
        LegResult::Passed => "ran",
        LegResult::Failed => "**failed**",
        LegResult::NotRun => "not run (tests skipped)",
    };
    for (backend, text) in [("cpu", cpu_conf), ("wgpu (lavapipe without a GPU)", gpu)] {
        s.push_str(&format!(
            "| op conformance vs f64, {backend} | {text} |{}\n",
            " – |".repeat(cols.len() - 1)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_says_ran_only_where_a_passing_leg_required_the_kernel() {
        let t = table(|l| {
            if l == Leg::Cross {
                LegResult::Passed
            } else {
                LegResult::NotRun
            }
        });
        let row = |name: &str| {
            t.lines()
                .find(|l| l.starts_with(&format!("| {name} |")))
                .unwrap()
                .to_string()
        };
        // neon-dotprod: ran on -cpu max, skipped on the a53, not built for x86 or wasm.
        let r = row("int8 neon-dotprod");
        assert!(
            r.contains("| ran | skipped: the emulated CPU lacks it |"),
            "{r}"
        );
        // The tests leg did not run: the native column says so instead of "ran".
        assert!(row("int8 portable").contains("not run (tests skipped)"));
        assert!(row("f32 simd128").contains("| ran |"));
        // The f32 NEON kernel ran on both emulated aarch64 CPUs (NEON is baseline), nowhere else.
        let r = row("f32 neon");
        assert!(r.starts_with("| f32 neon | – | ran | ran | – |"), "{r}");
        let failed = table(|_| LegResult::Failed);
        assert!(!failed.contains("| ran |"));
        // The conformance rows follow their legs: the CPU's the tests leg, wgpu's the gpu leg.
        let t = table(|l| {
            if l == Leg::Tests {
                LegResult::Passed
            } else {
                LegResult::NotRun
            }
        });
        let row = |name: &str| t.lines().find(|l| l.starts_with(name)).unwrap().to_string();
        assert!(row("| op conformance vs f64, cpu |").contains("| ran |"));
        assert!(row("| op conformance vs f64, wgpu").contains("not run (gpu skipped)"));
        assert!(failed.contains("| op conformance vs f64, cpu | **failed** |"));
    }
}
