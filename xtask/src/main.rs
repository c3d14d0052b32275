//! `cargo xtask <task>`:
//! - `test`: everything CI checks — fmt, clippy, the workspace tests, and `frugal-core` built without
//!   `std` for `thumbv7em-none-eabihf` and `wasm32-unknown-unknown`.
//! - `bench memory [--only id,id] [--steps N]`: the reference workloads, each in a fresh process: arena,
//!   lower bound, peak RSS over the process baseline, ms/step at one thread, beside PyTorch's and the
//!   best peer's numbers measured on this machine kind.
//! - `bench budget`: the memory policies — Melon's headline, smallest budgets, Sage's orderings.
//! - `bench swap [--scale S] [--lookahead L] [--budget-mib M] [--steps N] [--rounds R] [--keep-cache]`:
//!   proactive swap (NNTrainer §4.3) on VGG-16/CIFAR: no swap, on-demand and proactive swap, each in a
//!   fresh process.
//! - `web [--serve [--port N]] [--test] [--bench]`: the browser build (`web-demo/dist/`), its Chromium
//!   tests and its figures (see `web.rs`).
//! - `firmware --board netduinoplus2|microbit`: builds `firmware/`, trains in QEMU, decodes the defmt log,
//!   compares the first losses with a native run of the baked plan (see `firmware.rs`).
//! - `cross`: the int8/quant tests of `frugal-core` natively, on aarch64 under qemu (NEON, `sdot`) and on
//!   wasm32-wasip1 + simd128 under Node (see `cross.rs`).
mod bench;
mod budget;
mod cross;
mod firmware;
mod int8;
mod swap;
mod web;

use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("test") => test(),
        Some("bench") if args.get(1).map(String::as_str) == Some("budget") => {
            budget::main(&args[2..])
        }
        Some("bench") if args.get(1).map(String::as_str) == Some("swap") => swap::main(&args[2..]),
        Some("bench") if args.get(1).map(String::as_str) == Some("int8") => int8::main(&args[2..]),
        Some("bench") => bench::main(&args[1..]),
        Some("__bench-swap-one") => swap::child(&args[1..]),
        Some("__bench-one") => bench::child(&args[1..]),
        Some("firmware") => firmware::main(&args[1..]),
        Some("cross") => cross::main(&args[1..]),
        Some("web") => web::main(&args[1..]),
        _ => {
            eprintln!("usage: cargo xtask test | cargo xtask bench memory [--only linear,conv2d,...] [--steps N]");
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

fn test() -> Result<(), String> {
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
    for target in ["thumbv7em-none-eabihf", "wasm32-unknown-unknown"] {
        // Idempotent and quick when the target is already there.
        let _ = Command::new("rustup")
            .args(["target", "add", target])
            .status();
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
    eprintln!("\nall checks passed");
    Ok(())
}
