//! `cargo xtask miri [--all]`: without `--all` (the leg of `cargo xtask test`), the tests over the core's
//! `unsafe` that run in minutes (see `QUICK`); with `--all`, the `frugal-core` tests that Miri can run in
//! reasonable time (about an hour here) — the binary
//! decoders (model, plan, plan table: round trips, corrupt and random bytes), the planner's hand-checked
//! cases, the executor (arena carving, one whole step through the backend, the switch's in-place moves),
//! the thread pool's unsafe job hand-off (with real threads), the GEMM and int8 kernel
//! conformance suites (the x86 SIMD kernels are compiled out under Miri; the portable ones run) and
//! the int8 ops — under `cargo +nightly miri` with one proptest case each (Miri runs ~1000× slower
//! than native). Needs a nightly toolchain with `miri` and `rust-src` (`cargo xtask setup miri`); the project itself builds on
//! stable (this is a checking tool, like the sanitizers). Isolation is off because proptest reads its
//! failure-persistence files.
use std::process::Command;

/// The quick set `cargo xtask test` runs (minutes): the `unsafe` of the arena carving, the thread pool's
/// job hand-off (real threads), the kernels' slice sharding, the switch's in-place moves and small GEMMs.
const QUICK: &[&str] = &[
    "backend::arena",
    // The thread pool (`pool::tests`, `pool::threads::tests`; `ops::pool` is skipped: see `QUICK_SKIP`).
    "pool::",
    "kernels::par",
    "exec::permute::tests",
    "kernels::gemm::tests::portable::k_zero",
    "kernels::gemm::tests::portable::empty",
    "plan::tests::lower_bound_counts",
];

/// Skipped in the quick set: tests the filters above match by name but that hold no `unsafe` and take
/// many minutes under Miri (`ops::pool`'s finite-difference checks, matched by `pool::`).
const QUICK_SKIP: &[&str] = &["ops::pool::"];

/// Everything Miri can run in reasonable time (`cargo xtask miri --all`; about an hour on 2 cores).
const FILTERS: &[&str] = &[
    "format::",
    // The planner's hand-checked cases (its random-DAG properties take too long under Miri).
    "plan::tests::relu_after_conv",
    "plan::tests::in_place_is_refused",
    "plan::tests::frozen_layers",
    "plan::tests::lower_bound_counts",
    "plan::tests::a_second_memory_space",
    // The unsafe of the executor's arena carving and of the thread pool's job hand-off, and the switch's
    // in-place permutations.
    "backend::arena",
    "pool::",
    "exec::permute::tests",
    // One whole training step through the backend, and a refused placement.
    "exec::record_tests::every_instruction_of_a_plain_plan",
    "exec::record_tests::an_executor_refuses",
    "kernels::gemm::tests::portable::matches_reference",
    "kernels::gemm::tests::portable::k_zero",
    "kernels::gemm::tests::portable::empty",
    "kernels::int8",
    "quant::ops",
];

/// Tests among those that take many minutes under Miri (large shapes, the deepest exact sums): the
/// native and emulated runs cover them; Miri checks the same code paths on the small shapes.
const SKIP: &[&str] = &[
    "large_shapes",
    "near_max_k",
    "max_depth",
    "max_k_is_the_exact_bound",
];

pub fn main(args: &[String]) -> Result<(), String> {
    let all = args.iter().any(|a| a == "--all");
    if let Some(a) = args.iter().find(|a| *a != "--all") {
        return Err(format!(
            "unknown argument {a:?}; usage: cargo xtask miri [--all]"
        ));
    }
    let filters = if all { FILTERS } else { QUICK };
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
        .join("miri");
    let st = Command::new("cargo")
        .args([
            "+nightly",
            "miri",
            "test",
            "-p",
            "frugal-core",
            "--lib",
            "--",
        ])
        .args(filters)
        .args(SKIP.iter().flat_map(|s| ["--skip", s]))
        .args(
            (if all { &[][..] } else { QUICK_SKIP })
                .iter()
                .flat_map(|s| ["--skip", s]),
        )
        .env("PROPTEST_CASES", "1")
        .env("MIRIFLAGS", "-Zmiri-disable-isolation")
        .env("CARGO_TARGET_DIR", target)
        .env_remove("RUSTUP_TOOLCHAIN")
        .status()
        .map_err(|e| format!("cannot run cargo miri: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("cargo miri test failed ({st})"))
    }
}
