//! `cargo xtask <task>`:
//! - `test [--fast]`: everything CI checks — fmt, clippy, the workspace tests, `frugal-core` built
//!   without `std` for Cortex-M4F, Cortex-M0 and wasm32, the memory benchmark's targets, the int8 kernels
//!   on aarch64 (qemu) and wasm32 (Node), the browser build and its Chromium tests, and the firmware on
//!   the Cortex-M4F and Cortex-M0 boards in QEMU (`--fast` leaves out those last three).
//! - `bench memory [--only id,id] [--steps N]`: the reference workloads, each in a fresh process: arena,
//!   lower bound, peak RSS over the process baseline, ms/step at one thread, beside PyTorch's and the
//!   best peer's numbers measured on this machine kind.
//! - `bench sgemm [--threads N] [--reps R]`: SGEMM GFLOPS (1024³ and the FC-FC-FC shapes) per kernel
//!   family, with the measured clock and the share of the FMA peak.
//! - `bench budget`: the memory policies — Melon's headline, smallest budgets, Sage's orderings.
//! - `bench swap [--scale S] [--lookahead L] [--budget-mib M] [--steps N] [--rounds R] [--keep-cache]`:
//!   proactive swap (NNTrainer §4.3) on VGG-16/CIFAR: no swap, on-demand and proactive swap, each in a
//!   fresh process.
//! - `web [--serve [--port N]] [--test] [--bench]`: the browser build (`web-demo/dist/`), its Chromium
//!   tests and its figures (see `web.rs`).
//! - `firmware --board netduinoplus2|microbit`: builds `firmware/`, trains in QEMU, decodes the defmt log,
//!   compares the first losses with a native run of the baked plan (see `firmware.rs`).
//! - `miri`: the decoders, kernel suites and int8 ops of `frugal-core` under Miri (nightly; see `miri.rs`).
//! - `cross`: the int8/quant tests of `frugal-core` natively, on aarch64 under qemu (NEON, `sdot`) and on
//!   wasm32-wasip1 + simd128 under Node (see `cross.rs`).
mod bench;
mod budget;
mod cross;
mod firmware;
mod int8;
mod miri;
mod sgemm;
mod swap;
mod web;

use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("test") => test(&args[1..]),
        Some("bench") if args.get(1).map(String::as_str) == Some("budget") => {
            budget::main(&args[2..])
        }
        Some("bench") if args.get(1).map(String::as_str) == Some("swap") => swap::main(&args[2..]),
        Some("bench") if args.get(1).map(String::as_str) == Some("int8") => int8::main(&args[2..]),
        Some("bench") if args.get(1).map(String::as_str) == Some("sgemm") => {
            sgemm::main(&args[2..])
        }
        Some("bench") => bench::main(&args[1..]),
        Some("__bench-swap-one") => swap::child(&args[1..]),
        Some("__bench-one") => bench::child(&args[1..]),
        Some("firmware") => firmware::main(&args[1..]),
        Some("cross") => cross::main(&args[1..]),
        Some("web") => web::main(&args[1..]),
        Some("miri") => miri::main(&args[1..]),
        _ => {
            eprintln!("usage: cargo xtask test [--fast] | bench memory|budget|swap|int8|sgemm … | cross | web [--serve|--test|--bench] | firmware --board netduinoplus2|microbit");
            Err("unknown task".into())
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn cargo(args: &[&str]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("\n$ cargo {}", args.join(" "));
    let st = Command::new(&cargo)
        .args(args)
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({st})", args.join(" ")))
    }
}

/// What the emulated and browser legs need beyond cargo: (program, what installs it).
const TOOLS: &[(&str, &str)] = &[
    ("qemu-aarch64", "apt-get install -y qemu-user"),
    (
        "aarch64-linux-gnu-gcc",
        "apt-get install -y gcc-aarch64-linux-gnu libc6-dev-arm64-cross",
    ),
    ("qemu-system-arm", "apt-get install -y qemu-system-arm"),
    ("node", "apt-get install -y nodejs npm"),
    ("npm", "apt-get install -y nodejs npm"),
    ("chromium", "apt-get install -y chromium chromium-driver"),
    (
        "chromedriver",
        "apt-get install -y chromium chromium-driver",
    ),
    ("wasm-opt", "apt-get install -y binaryen"),
    (
        "wasm-bindgen",
        "cargo install wasm-bindgen-cli --version 0.2.130",
    ),
    (
        "wasm-bindgen-test-runner",
        "cargo install wasm-bindgen-cli --version 0.2.130",
    ),
    (
        "defmt-print",
        "cargo install defmt-print --version 1.2.0 --locked",
    ),
];

/// Every target the checks build for.
const TARGETS: &[&str] = &[
    "thumbv7em-none-eabihf",
    "thumbv6m-none-eabi",
    "wasm32-unknown-unknown",
    "wasm32-wasip1",
    "aarch64-unknown-linux-gnu",
];

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// Fails before the first build when a tool of the full run is missing, naming how to install it
/// (`.ci/run` installs all of them).
fn preflight() -> Result<(), String> {
    let missing: Vec<String> = TOOLS
        .iter()
        .filter(|(t, _)| !on_path(t))
        .map(|(t, how)| format!("  {t}: {how}"))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "missing tools (`.ci/run` installs them; `cargo xtask test --fast` skips the emulated and browser legs):\n{}",
        missing.join("\n")
    ))
}

fn step(name: &str, r: Result<(), String>) -> Result<(), String> {
    eprintln!("\n== {name}");
    r.map_err(|e| format!("{name}: {e}"))
}

/// `cargo xtask test [--fast]`: everything CI checks. `--fast` leaves out the legs that need
/// emulators and a browser (aarch64/wasm kernels, the web demo, the firmware in QEMU).
fn test(args: &[String]) -> Result<(), String> {
    let fast = args.iter().any(|a| a == "--fast");
    if !fast {
        preflight()?;
    }
    for target in TARGETS {
        // Idempotent and quick when the target is already there.
        let _ = Command::new("rustup")
            .args(["target", "add", target])
            .status();
    }
    cargo(&["fmt", "--all", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])?;
    cargo(&["test", "--workspace"])?;
    for target in [
        "thumbv7em-none-eabihf",
        "thumbv6m-none-eabi",
        "wasm32-unknown-unknown",
    ] {
        cargo(&[
            "build",
            "-p",
            "frugal-core",
            "--no-default-features",
            "--target",
            target,
        ])
        .map_err(|e| format!("{e}\n(hint: `rustup target add {target}`)"))?;
        cargo(&[
            "build",
            "-p",
            "frugal-core",
            "--no-default-features",
            "--features",
            "alloc",
            "--target",
            target,
        ])?;
    }
    // The memory targets of the benchmark (peak RSS is repeatable; times are only reported).
    cargo(&[
        "run",
        "--release",
        "-p",
        "xtask",
        "--",
        "bench",
        "memory",
        "--check",
    ])?;
    if !fast {
        step(
            "int8 kernels natively, on aarch64 (qemu) and wasm32 (Node)",
            cross::main(&[]),
        )?;
        step(
            "browser: frugal-wasm, the demo in Chromium, cross-target losses",
            web::main(&["--test".to_string()]),
        )?;
        step(
            "firmware on netduinoplus2 (QEMU), f32 and int8",
            firmware::main(&["--board".to_string(), "netduinoplus2".to_string()]),
        )?;
        step(
            "firmware on microbit (QEMU, Cortex-M0, 16 KiB RAM), int8",
            firmware::main(&["--board".to_string(), "microbit".to_string()]),
        )?;
    }
    eprintln!("\nall checks passed");
    Ok(())
}
