//! Builds the DSP side (`dsp/*.c`, HVX) into the skel ELF that `QemuHexagon` runs under qemu-hexagon,
//! when a clang that targets Hexagon is installed (`cargo xtask setup` installs Debian's clang and
//! lld). Without one the crate still builds: `FRUGAL_HEXAGON_SKEL` is empty, the skel's tests report
//! *skipped* and fail under `FRUGAL_REQUIRE_DSP=1`, and `FRUGAL_HEXAGON_SKEL_WHY` says why.
use std::path::PathBuf;
use std::process::Command;

const SOURCES: [&str; 3] = ["dsp/kernels.c", "dsp/skel.c", "dsp/rt.c"];

fn main() {
    for f in SOURCES.iter().chain(&["dsp/kernels.h", "dsp/proto.h"]) {
        println!("cargo:rerun-if-changed={f}");
    }
    println!("cargo:rerun-if-env-changed=FRUGAL_HEXAGON_CC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let elf = out.join("frugal-skel.elf");
    let cc = std::env::var("FRUGAL_HEXAGON_CC").unwrap_or_else(|_| "clang".into());
    // The kernels use v68 HVX (128-byte vectors); the ELF runs under `qemu-hexagon -cpu v67`, whose
    // HVX executes them. Freestanding: raw Linux syscalls, no libc.
    let run = Command::new(&cc)
        .args([
            "--target=hexagon-unknown-linux-musl",
            "-mv68",
            "-mhvx",
            "-mhvx-length=128b",
            "-ffreestanding",
            "-nostdlib",
            "-static",
            "-fuse-ld=lld",
            "-O2",
            "-Wall",
            "-Werror",
            "-o",
        ])
        .arg(&elf)
        .args(SOURCES)
        .output();
    let why = match run {
        Ok(o) if o.status.success() => {
            println!("cargo:rustc-env=FRUGAL_HEXAGON_SKEL={}", elf.display());
            println!("cargo:rustc-env=FRUGAL_HEXAGON_SKEL_WHY=");
            return;
        }
        Ok(o) => format!(
            "{cc} could not build the skel: {}",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .next()
                .unwrap_or("")
        ),
        Err(e) => format!("{cc} not found ({e}); run `cargo xtask setup`"),
    };
    println!("cargo:warning=frugal-hexagon: DSP skel not built: {why}");
    println!("cargo:rustc-env=FRUGAL_HEXAGON_SKEL=");
    println!(
        "cargo:rustc-env=FRUGAL_HEXAGON_SKEL_WHY={}",
        why.replace('\n', " ")
    );
}
