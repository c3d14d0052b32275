//! Builds the guest (`guest/`, crate `frugal-guest`: the frugal core behind a C ABI) for
//! `wasm32-unknown-unknown` and hands its path to the crate as `FRUGAL_GUEST_WASM` (`include_bytes!`).
//!
//! * No deadlock with the outer cargo: the nested cargo gets its own target directory under `OUT_DIR`
//!   (so it never waits for the outer build-directory lock) and its own workspace and lock file
//!   (`guest/Cargo.lock`; not `--locked`, so a dependency added to the core does not break the
//!   build — cargo records it there).
//! * Rebuilt when the guest or the core changes: `rerun-if-changed` on both source trees and
//!   manifests; the nested cargo then rebuilds incrementally.
//! * Independent of the caller's flags: `CARGO_ENCODED_RUSTFLAGS` is set explicitly (wasm SIMD, a
//!   64 KiB stack) and inherited `RUSTFLAGS`/target settings are dropped.
use std::env;
use std::path::PathBuf;
use std::process::Command;

/// The guest's shadow stack. Part of every budget, so small; the core's planner recurses little.
const STACK_BYTES: usize = 64 * 1024;

fn main() {
    let here =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let guest = here.join("guest");
    let core = here.join("../../core");
    for p in [
        guest.join("src"),
        guest.join("Cargo.toml"),
        guest.join("Cargo.lock"),
        core.join("src"),
        core.join("Cargo.toml"),
        here.join("../../Cargo.toml"),
    ] {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target_dir = out.join("guest-target");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let rustflags = [
        "-Ctarget-feature=+simd128".to_string(),
        format!("-Clink-arg=-zstack-size={STACK_BYTES}"),
    ]
    .join("\x1f");
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&guest)
        .args(["build", "--release", "--target", "wasm32-unknown-unknown"])
        .arg("--manifest-path")
        .arg(guest.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_RUSTFLAGS");
    let status = cmd.status().unwrap_or_else(|e| {
        panic!(
            "could not run cargo to build the wasm guest ({}): {e}",
            guest.display()
        )
    });
    if !status.success() {
        panic!(
            "building the wasm guest failed ({status}). It needs the wasm32 target: \
             `rustup target add wasm32-unknown-unknown`"
        );
    }
    let wasm = target_dir.join("wasm32-unknown-unknown/release/frugal_guest.wasm");
    if !wasm.is_file() {
        panic!(
            "the guest build succeeded but {} is missing",
            wasm.display()
        );
    }
    println!("cargo:rustc-env=FRUGAL_GUEST_WASM={}", wasm.display());
}
