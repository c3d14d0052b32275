//! `cargo xtask cross`: the integer kernels and integer training tests of `frugal-core` (every test whose
//! name contains `int8` or `quant`) on three machines:
//!
//! 1. natively (every int8 kernel this CPU has is required to run: AVX2, AVX-512 VNNI);
//! 2. `aarch64-unknown-linux-gnu` under `qemu-aarch64`, twice: `-cpu max` (NEON and `sdot` both required)
//!    and `-cpu cortex-a53` (no `dotprod`: the plain NEON kernel alone), the f32 GEMM conformance suite
//!    (`kernels::gemm`, the NEON f32 kernel required) included; plus a `no_std` build with
//!    `-C target-feature=+dotprod`, where the kernel choice is made at compile time;
//! 3. `wasm32-wasip1` with `-C target-feature=+simd128`, run by Node's WASI (the `simd128` kernels
//!    required), where the f32 GEMM conformance suite (`kernels::gemm`, the explicit `simd128` f32 kernel
//!    against the reference) runs too.
//!
//! It fails if any suite fails or runs no test. A "required" kernel that is unavailable fails the suite
//! (the tests read `FRUGAL_REQUIRE_KERNELS`), so a misconfigured emulator cannot skip it silently.
//!
//! Needs the aarch64 cross linker and glibc, `qemu-aarch64`, Node ≥ 20 (`node:wasi`) and the two Rust
//! targets: `cargo xtask setup` installs them (the table in `setup.rs`).
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use frugal_core::kernels::int8::IgemmKernel;

/// Test-name filters (libtest runs a test when its name contains any of them).
const FILTERS: [&str; 2] = ["int8", "quant"];
/// Extra filter for the wasm32 and aarch64 runs: the f32 GEMM suite (their `simd128` and `neon` kernels
/// exist only there).
const GEMM_FILTER: &str = "kernels::gemm";

/// Node ESM program running a WASI command module: `node run-wasi.mjs module.wasm args…`.
const WASI_RUNNER: &str = r#"import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';
const [file, ...args] = process.argv.slice(2);
const wasi = new WASI({ version: 'preview1', args: [file, ...args], env: process.env, returnOnExit: true });
const module = await WebAssembly.compile(await readFile(file));
const instance = await WebAssembly.instantiate(module, { wasi_snapshot_preview1: wasi.wasiImport });
process.exitCode = wasi.start(instance);
"#;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

pub fn main(args: &[String]) -> Result<(), String> {
    if let Some(a) = args.first() {
        return Err(format!(
            "`cargo xtask cross` takes no arguments (got `{a}`)"
        ));
    }
    let mut report = Vec::new();

    // 1. Native.
    let native: Vec<&str> = IgemmKernel::ALL
        .iter()
        .filter(|k| k.is_available())
        .map(|k| k.name())
        .collect();
    let n = suite("native", None, &[], &native.join(","), &[])?;
    report.push(format!("native ({}): {n} tests", native.join(", ")));

    // 2. aarch64 under qemu-user.
    let linker = [(
        "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
        "aarch64-linux-gnu-gcc".to_string(),
    )];
    for (cpu, required) in crate::kernels::AARCH64 {
        let env = [
            linker[0].clone(),
            (
                "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER",
                format!("qemu-aarch64 -cpu {cpu} -L /usr/aarch64-linux-gnu"),
            ),
        ];
        let n = suite(
            &format!("aarch64 (qemu -cpu {cpu})"),
            Some("aarch64-unknown-linux-gnu"),
            &env,
            required,
            &[GEMM_FILTER],
        )?;
        report.push(format!(
            "aarch64, qemu -cpu {cpu} ({required}; int8 and f32 GEMM): {n} tests"
        ));
    }
    // Compile-time kernel choice (no `std`): `sdot` selected statically.
    let dot_dir = target_dir().join("xtask-cross-dotprod");
    run(Command::new(cargo_bin())
        .args([
            "build",
            "-p",
            "frugal-core",
            "--no-default-features",
            "--target",
            "aarch64-unknown-linux-gnu",
        ])
        .env("CARGO_TARGET_DIR", &dot_dir)
        .env(
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
            "-C target-feature=+dotprod",
        ))?;
    report.push("aarch64 no_std +dotprod: builds".into());

    // 3. wasm32-wasip1 + simd128 under Node's WASI.
    let runner = target_dir().join("xtask-cross").join("run-wasi.mjs");
    std::fs::create_dir_all(runner.parent().expect("has a parent"))
        .and_then(|()| std::fs::write(&runner, WASI_RUNNER))
        .map_err(|e| format!("cannot write {}: {e}", runner.display()))?;
    let env = [
        (
            "CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS",
            "-C target-feature=+simd128".to_string(),
        ),
        (
            "CARGO_TARGET_WASM32_WASIP1_RUNNER",
            format!("node --no-warnings {}", runner.display()),
        ),
    ];
    let n = suite(
        "wasm32-wasip1 + simd128 (node WASI)",
        Some("wasm32-wasip1"),
        &env,
        crate::kernels::WASM,
        &[GEMM_FILTER],
    )?;
    report.push(format!(
        "wasm32-wasip1 + simd128 (portable, simd128; int8 and f32 GEMM): {n} tests"
    ));

    eprintln!("\ncross: all suites passed");
    for line in report {
        eprintln!("  {line}");
    }
    Ok(())
}

fn cargo_bin() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn run(cmd: &mut Command) -> Result<(), String> {
    eprintln!("\n$ {cmd:?}");
    let st = cmd
        .status()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed ({st})"))
    }
}

/// Runs the filtered `frugal-core` tests (names containing one of [`FILTERS`] or `extra`) for `target`
/// (native when `None`) with `required` kernels, echoes the output and returns how many tests passed; an
/// error if the run fails or no test ran.
fn suite(
    label: &str,
    target: Option<&str>,
    env: &[(&str, String)],
    required: &str,
    extra: &[&str],
) -> Result<usize, String> {
    let mut cmd = Command::new(cargo_bin());
    cmd.args(["test", "-p", "frugal-core", "--lib", "--tests"]);
    if let Some(t) = target {
        cmd.args(["--target", t]);
    }
    // One test thread: wasm32-wasip1 has no threads (elsewhere it keeps qemu's memory use modest).
    cmd.arg("--")
        .args(FILTERS)
        .args(extra)
        .arg("--test-threads=1");
    cmd.env("FRUGAL_REQUIRE_KERNELS", required);
    for (k, v) in env {
        cmd.env(k, v);
    }
    eprintln!("\n== {label}\n$ {cmd:?}");
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    if !out.status.success() {
        return Err(format!("{label}: tests failed ({})", out.status));
    }
    let passed: usize = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("test result: ok. "))
        .filter_map(|l| l.split(' ').next()?.parse::<usize>().ok())
        .sum();
    if passed == 0 {
        return Err(format!("{label}: no test ran (filters {FILTERS:?})"));
    }
    Ok(passed)
}
