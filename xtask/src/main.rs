//! `cargo xtask <task>`:
//! - `test [--fast] [--no-setup]`: everything CI checks — fmt, clippy, the workspace tests,
//!   `frugal-core` built without `std` for Cortex-M4F, Cortex-M0 and wasm32, the memory benchmark's
//!   targets, the int8 kernels on aarch64 (qemu) and wasm32 (Node), the browser build and its Chromium
//!   tests, the firmware on the Cortex-M4F, Cortex-M0 and Cortex-M7 boards in QEMU, and the Python package's
//!   wheel and pytest suite with the Flower app (`--fast` leaves out those last six); installs what is missing first (`--no-setup`: refuses instead); ends with a table of
//!   legs, results and times (see `test.rs`).
//! - `setup [--fast] [--check] [LEG…]`: installs the tools the legs need, skipping what is present at a
//!   compatible version (see `setup.rs`, the one list of them). The emulator, browser and Miri tasks
//!   below run it for their own needs first.
//! - `bench memory [--only id,id] [--steps N]`: the reference workloads, each in a fresh process: arena,
//!   lower bound, peak RSS over the process baseline, ms/step at one thread, beside PyTorch's and the
//!   best peer's numbers measured on this machine kind.
//! - `bench sgemm [--threads N] [--reps R]`: SGEMM GFLOPS (1024³ and the FC-FC-FC shapes) per kernel
//!   family, with the measured clock and the share of the FMA peak.
//! - `bench gpu [--placement] [--reps R]`: the wgpu tiled SGEMM on this machine's adapter beside the CPU's SGEMM;
//!   `--sgemm-sweep [--prebuilt DIR | --export DIR]`: every SGEMM kernel candidate checked and timed;
//!   `--placement`: ms/step of all-CPU, all-GPU, the DP's measured CPU/GPU placement and alternating layers;
//!   `--burn [--reps R] [--prebuilt DIR | --export DIR]`: frugal's GPU backend against Burn's wgpu backend
//!   (tests/bench/burn-wgpu, a standalone project) on LeNet-5 and the small CNN at b128 and a 1024³ matmul,
//!   alternating fresh processes (see `gpu.rs`).
//! - `bench aarch64 [--check]`: instructions counted under `qemu-aarch64` (a TCG plugin built on the fly):
//!   SGEMM 512³ per FLOP, NEON vs portable, and the int8 ÷ f32 digits-CNN step (see `insns.rs`).
//! - `bench dsp [--batch N]`: the Hexagon DSP co-scheduling report — DSP packets per instruction under
//!   `qemu-hexagon` (a TCG plugin built on the fly), CPU times, the DP's placement and predicted step times.
//! - `bench python [--rounds R] [--clients C] [--only fl|overhead]`: the Python package's figures — federated
//!   (Flower) vs centralised held-out accuracy, each client's arena against its budget per device
//!   class, and Python's per-call overhead on a digits-MLP step (see `python.rs`, `python/bench/figures.py`).
//! - `bench budget [--mobilenet | --mobilenet-fusion [--batches B,B] [--reps N]]`: the memory policies — Melon's headline, smallest budgets, Sage's orderings; MobileNetV2's fused BatchNorm backward against none.
//! - `bench planning [--reps R] [--batches B,B] [--refusals]`: how long planning for a budget takes, by model, batch and budget; `--refusals`: how long refusing a budget of 0 takes (sizing the figure it names).
//! - `bench swap [--scale S] [--lookahead L] [--budget-mib M] [--steps N] [--rounds R] [--keep-cache]`:
//!   proactive swap (NNTrainer §4.3) on VGG-16/CIFAR: no swap, on-demand and proactive swap, each in a
//!   fresh process.
//! - `web [--serve [--port N]] [--test] [--bench]`: the browser build (`web-demo/dist/`), its Chromium
//!   tests and its figures (see `web.rs`).
//! - `firmware --board netduinoplus2|microbit|mps2-an500`: builds `firmware/`, trains in QEMU, decodes the defmt log,
//!   compares the first losses with a native run of the baked plan (see `firmware.rs`).
//! - `mcu-pretrain`: pretrains the Cortex-M7 board's MobileNetV2-class model on the host, picks its
//!   sparse update for the board's arena and writes the model and weights the firmware embeds (`mcu.rs`).
//! - `fuzz [--time SECS] [--seeds] [TARGET …]`: the libFuzzer targets of `fuzz/` (nightly, cargo-fuzz),
//!   each for SECS seconds (default 20), with a table of runs, crashes and coverage (see `fuzz.rs`).
//! - `miri`: the decoders, kernel suites and int8 ops of `frugal-core` under Miri (nightly; see `miri.rs`).
//! - `android [--bench]`: the Android host — header staleness, the C-API test natively and on aarch64
//!   under qemu, the JNI test on the host JVM, the aarch64-linux-android staticlib; `--bench`: the
//!   C-ABI overhead per `train_steps` call (see `android.rs`).
//! - `cross`: the int8/quant tests of `frugal-core` natively, on aarch64 under qemu (NEON, `sdot`) and on
//!   wasm32-wasip1 + simd128 under Node (see `cross.rs`).
mod android;
mod bench;
mod budget;
mod cross;
mod dsp;
mod firmware;
mod fuzz;
mod gpu;
mod igemm;
mod insns;
mod int8;
mod kernels;
mod mcu;
mod miri;
mod python;
mod seq;
mod setup;
mod sgemm;
mod sparse;
mod stats;
mod swap;
mod test;
mod web;

use std::process::ExitCode;

use test::Leg;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("test") => test::main(&args[1..]),
        Some("setup") => setup::main(&args[1..]),
        Some("bench") if args.get(1).map(String::as_str) == Some("budget") => {
            budget::main(&args[2..])
        }
        Some("bench") if args.get(1).map(String::as_str) == Some("swap") => swap::main(&args[2..]),
        Some("bench") if args.get(1).map(String::as_str) == Some("sparse") => {
            sparse::main(&args[2..])
        }
        Some("bench") if args.get(1).map(String::as_str) == Some("gpu") => gpu::main(&args[2..]),
        Some("bench") if args.get(1).map(String::as_str) == Some("dsp") => dsp::main(&args[2..]),
        Some("bench") if args.get(1).map(String::as_str) == Some("planning") => {
            budget::planning(&args[2..])
        }
        Some("bench") if args.get(1).map(String::as_str) == Some("int8") => int8::main(&args[2..]),
        Some("bench") if args.get(1).map(String::as_str) == Some("python") => {
            python::bench(&args[2..])
        }
        Some("bench") if args.get(1).map(String::as_str) == Some("aarch64") => {
            insns::main(&args[2..])
        }
        Some("bench") if args.get(1).map(String::as_str) == Some("sgemm") => {
            sgemm::main(&args[2..])
        }
        Some("bench") if args.get(1).map(String::as_str) == Some("igemm") => {
            igemm::main(&args[2..])
        }
        Some("bench") if args.get(1).map(String::as_str) == Some("seq") => seq::main(&args[2..]),
        Some("bench") => bench::main(&args[1..]),
        Some("__bench-seq-one") => seq::child(&args[1..]),
        Some("__bench-seq-lora") => seq::lora_child(&args[1..]),
        Some("__bench-swap-one") => swap::child(&args[1..]),
        Some("__bench-int8-one") => int8::child(&args[1..]),
        Some("firmware") => ready(&[Leg::FirmwareM4, Leg::FirmwareM0, Leg::FirmwareM7])
            .and_then(|()| firmware::main(&args[1..])),
        Some("mcu-pretrain") => mcu::main(&args[1..]),
        Some("cross") => ready(&[Leg::Cross]).and_then(|()| cross::main(&args[1..])),
        Some("android") => ready(&[Leg::Android]).and_then(|()| android::main(&args[1..])),
        Some("web") => ready(&[Leg::Web]).and_then(|()| web::main(&args[1..])),
        Some("miri") => ready(&[Leg::Miri]).and_then(|()| miri::main(&args[1..])),
        Some("fuzz") => ready(&[Leg::Fuzz]).and_then(|()| fuzz::main(&args[1..])),
        _ => {
            eprintln!("usage: cargo xtask test [--fast] [--no-setup] | setup [--fast] [--check] [LEG…] | bench memory|budget|planning|seq|sparse|swap|int8|sgemm|igemm|gpu [--burn]|aarch64|dsp … | cross | android [--bench] | web [--pretrain] [--serve|--test|--bench] | firmware --board netduinoplus2|microbit|mps2-an500 | mcu-pretrain | miri | fuzz [--time SECS] [TARGET…]");
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

/// Before a task run on its own: installs what its legs need (see `setup.rs`), or says what is missing.
fn ready(legs: &[Leg]) -> Result<(), String> {
    let missing = setup::ensure(legs).missing();
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|t| t.name).collect();
    Err(format!("missing {} (see above)", names.join(", ")))
}
