//! The Python package (`python/`): its virtual environment, the wheel, the pytest suite, and the
//! Python benchmark.
//!
//! The venv lives at `$FRUGAL_PY_VENV`, else `~/.cache/frugal-py-venv`, with the packages of
//! `python/requirements-dev.txt` (maturin, NumPy, pytest, Flower with its Ray simulation engine);
//! `cargo xtask setup` creates it (`setup::Install::PyVenv`). The `python` leg of `cargo xtask test`
//! checks the extension crate's formatting and clippy, builds the abi3 release wheel with maturin,
//! installs it into the venv and runs `python/tests` with Flower required (`FRUGAL_REQUIRE_FLOWER=1`:
//! a Flower test may not skip there).
use std::path::PathBuf;
use std::process::Command;

use crate::setup::{root, run};

/// The venv's directory.
pub fn venv() -> PathBuf {
    if let Some(v) = std::env::var_os("FRUGAL_PY_VENV") {
        return PathBuf::from(v);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache/frugal-py-venv")
}

/// The venv's interpreter.
pub fn python() -> PathBuf {
    venv().join("bin/python")
}

/// The modules the checks import (one per line of `requirements-dev.txt`).
pub const MODULES: &str = "import maturin, numpy, pytest, flwr, ray";

/// Creates the venv with `python3 -m venv` (when it is not there) and installs the requirements.
pub fn install_venv() -> Result<(), String> {
    if !python().is_file() {
        run(Command::new("python3").arg("-m").arg("venv").arg(venv()))?;
    }
    run(Command::new(python())
        .args(["-m", "pip", "install", "-q", "-r"])
        .arg(root().join("python/requirements-dev.txt")))
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// Builds the release wheel (abi3) and installs it into the venv; returns the wheel's path.
pub fn build_and_install() -> Result<PathBuf, String> {
    let out = target_dir().join("wheels");
    let _ = std::fs::remove_dir_all(&out);
    run(Command::new(python())
        .args(["-m", "maturin", "build", "--release", "--manifest-path"])
        .arg(root().join("python/Cargo.toml"))
        .arg("--out")
        .arg(&out))?;
    let wheel = std::fs::read_dir(&out)
        .map_err(|e| format!("{}: {e}", out.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("maturin left no wheel in {}", out.display()))?;
    run(Command::new(python())
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "--force-reinstall",
            "--no-deps",
        ])
        .arg(&wheel))?;
    Ok(wheel)
}

/// The `python` leg: the extension crate's formatting and clippy (it is outside the workspace, so
/// the fmt and clippy legs do not see it), the wheel, then the pytest suite (Flower tests included
/// and required).
pub fn test() -> Result<(), String> {
    let manifest = root().join("python/Cargo.toml");
    run(Command::new("cargo")
        .args(["fmt", "--check", "--manifest-path"])
        .arg(&manifest))?;
    run(Command::new("cargo")
        .args(["clippy", "--all-targets", "--manifest-path"])
        .arg(&manifest)
        .args(["--", "-D", "warnings"])
        .env("PYO3_PYTHON", python()))?;
    let wheel = build_and_install()?;
    eprintln!("wheel: {}", wheel.display());
    run(Command::new(python())
        .args(["-m", "pytest", "-q", "-ra"])
        .arg(root().join("python/tests"))
        .env("FRUGAL_REQUIRE_FLOWER", "1")
        .current_dir(root()))
}

/// `cargo xtask bench python [ARGS…]`: builds and installs the wheel, then runs `python/bench/figures.py`.
pub fn bench(args: &[String]) -> Result<(), String> {
    build_and_install()?;
    run(Command::new(python())
        .arg(root().join("python/bench/figures.py"))
        .args(args)
        .current_dir(root()))
}
