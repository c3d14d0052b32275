//! `cargo xtask miri`: the `frugal-core` tests that Miri can run in reasonable time — the binary
//! decoders (model, plan, plan table: round trips, corrupt and random bytes), the GEMM and int8 kernel
//! conformance suites (the x86 SIMD kernels are compiled out under Miri; the portable ones run) and
//! the int8 ops — under `cargo +nightly miri` with one proptest case each (Miri runs ~1000× slower
//! than native). Needs a nightly toolchain with `miri` and `rust-src` (`cargo xtask setup miri`); the project itself builds on
//! stable (this is a checking tool, like the sanitizers). Isolation is off because proptest reads its
//! failure-persistence files.
use std::process::Command;

const FILTERS: &[&str] = &[
    "format::",
    "kernels::gemm::tests::portable::matches_reference",
    "kernels::gemm::tests::portable::k_zero",
    "kernels::gemm::tests::portable::empty",
    "kernels::int8",
    "quant::ops",
];

pub fn main(_args: &[String]) -> Result<(), String> {
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
        .args(FILTERS)
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
