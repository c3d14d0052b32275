//! `cargo xtask android [--bench]`: the Android host (`hosts/android`, `frugal-android`) as CI checks
//! it:
//!
//! 1. `include/frugal.h` is what cbindgen generates today (`cargo test --test header`);
//! 2. the C-API test (`tests/c/capi_test.c`, every error path, the digits MLP to ≥ 95 % with the
//!    budget quartered mid-step from another thread) natively (gcc, x86-64 staticlib) and on aarch64
//!    (aarch64-linux-gnu-gcc, the aarch64-unknown-linux-gnu staticlib) under `qemu-aarch64`;
//! 3. the JNI test (`tests/java/ai/frugal/TrainerTest.java`) on the host JVM with `-Xcheck:jni`,
//!    loading the x86-64 `libfrugal.so`;
//! 4. the `aarch64-linux-android` staticlib (`cargo rustc --crate-type staticlib`: the crate's
//!    `cdylib` needs the NDK's linker, which these machines do not have);
//! 5. `frugal-hexagon` (the DSP backend and its FastRPC transport) for `aarch64-linux-android`.
//!
//! `--bench`: the C-ABI overhead per `train_steps(1)` call against the Rust executor (release), timed
//! (`examples/capi_overhead.rs`: alternating rounds, median and spread of the per-round overhead, thread
//! CPU time) and counted: the instructions of [`COUNTED_STEPS`] steps of each path under `valgrind
//! --tool=callgrind`, which do not depend on the machine's load (skipped, and said so, without valgrind).
//! Needs the aarch64 cross linker and glibc, `qemu-aarch64`, a JDK and the two Rust targets:
//! `cargo xtask setup` installs them (the table in `setup.rs`).
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn run(cmd: &mut Command) -> Result<(), String> {
    eprintln!("\n$ {cmd:?}");
    let st = cmd
        .current_dir(root())
        .status()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed ({st})"))
    }
}

const AARCH64_LINKER: (&str, &str) = (
    "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
    "aarch64-linux-gnu-gcc",
);

/// The test's arguments: the model and the digits.
fn data_args() -> Vec<PathBuf> {
    let r = root();
    let mut v = vec![r.join("examples/digits-mlp.frgm")];
    for f in ["train-images", "train-labels", "test-images", "test-labels"] {
        v.push(r.join(format!("data/digits/digits-{f}.idx")));
    }
    v
}

/// Compiles the C test against the staticlib of `target` with `cc` and runs it (through `runner`).
fn c_test(label: &str, cc: &str, target: Option<&str>, runner: &[&str]) -> Result<(), String> {
    let mut build = cargo();
    build.args(["build", "--release", "-p", "frugal-android"]);
    if let Some(t) = target {
        build
            .args(["--target", t])
            .env(AARCH64_LINKER.0, AARCH64_LINKER.1);
    }
    run(&mut build)?;
    let lib_dir = match target {
        Some(t) => target_dir().join(t).join("release"),
        None => target_dir().join("release"),
    };
    let out = target_dir().join("xtask-android");
    std::fs::create_dir_all(&out).map_err(|e| e.to_string())?;
    let exe = out.join(format!("capi_test-{label}"));
    run(Command::new(cc)
        .args([
            "-std=c11",
            "-D_POSIX_C_SOURCE=200809L",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-O1",
        ])
        .arg("-I")
        .arg(root().join("hosts/android/include"))
        .arg(root().join("hosts/android/tests/c/capi_test.c"))
        .arg(lib_dir.join("libfrugal.a"))
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe))?;
    eprintln!("\n== C-API test, {label}");
    let mut cmd = match runner.split_first() {
        Some((r, rest)) => {
            let mut c = Command::new(r);
            c.args(rest).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    run(cmd.args(data_args()))
}

fn jni_test() -> Result<(), String> {
    run(cargo().args(["build", "--release", "-p", "frugal-android"]))?;
    let classes = target_dir().join("xtask-android/java");
    let _ = std::fs::remove_dir_all(&classes);
    std::fs::create_dir_all(&classes).map_err(|e| e.to_string())?;
    let mut javac = Command::new("javac");
    javac.args(["-Xlint:all", "-Werror", "-d"]).arg(&classes);
    for dir in [
        "hosts/android/java/ai/frugal",
        "hosts/android/tests/java/ai/frugal",
    ] {
        for e in std::fs::read_dir(root().join(dir)).map_err(|e| format!("{dir}: {e}"))? {
            let p = e.map_err(|e| e.to_string())?.path();
            if p.extension().is_some_and(|x| x == "java") {
                javac.arg(p);
            }
        }
    }
    run(&mut javac)?;
    eprintln!("\n== JNI test on the host JVM");
    run(Command::new("java")
        .arg("-Xcheck:jni")
        .arg(format!(
            "-Djava.library.path={}",
            target_dir().join("release").display()
        ))
        .arg("-cp")
        .arg(&classes)
        .arg("ai.frugal.TrainerTest")
        .args(data_args()))
}

/// Steps per path callgrind counts.
const COUNTED_STEPS: u64 = 20;

/// Instructions callgrind counts inside `counted_steps` for `COUNTED_STEPS` steps of `path`.
fn callgrind(exe: &Path, path: &str) -> Result<u64, String> {
    let out = target_dir().join(format!("xtask-android/callgrind.{path}.out"));
    std::fs::create_dir_all(out.parent().expect("has a parent")).map_err(|e| e.to_string())?;
    let st = Command::new("valgrind")
        .args(["--tool=callgrind", "--toggle-collect=*counted_steps*"])
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(exe)
        .args(["count", path, &COUNTED_STEPS.to_string()])
        .output()
        .map_err(|e| format!("cannot run valgrind: {e}"))?;
    if !st.status.success() {
        return Err(format!(
            "valgrind on {path} failed: {}",
            String::from_utf8_lossy(&st.stderr)
        ));
    }
    let text = std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("totals: "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("no totals line in {}", out.display()))
}

fn bench() -> Result<(), String> {
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "frugal-android",
        "--example",
        "capi_overhead",
    ]))?;
    let exe = target_dir().join("release/examples/capi_overhead");
    run(&mut Command::new(&exe))?;
    if Command::new("valgrind").arg("--version").output().is_err() {
        println!("\ninstruction counts: skipped (valgrind not found)");
        return Ok(());
    }
    let capi = callgrind(&exe, "capi")? as f64 / COUNTED_STEPS as f64;
    let rust = callgrind(&exe, "rust")? as f64 / COUNTED_STEPS as f64;
    println!(
        "\n| path (valgrind --tool=callgrind, {COUNTED_STEPS} steps each) | instructions/step |\n|---|---:|\n\
         | Rust executor | {rust:.0} |\n| C ABI frugal_train_steps(h, 1) | {capi:.0} |\n\n\
         instruction overhead: {:.0} per call = {:.3} % of a step (target ≤ 1 %)",
        capi - rust,
        100.0 * (capi - rust) / rust
    );
    println!("command: cargo xtask android --bench");
    Ok(())
}

pub fn main(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("--bench") => return bench(),
        Some(a) => return Err(format!("usage: cargo xtask android [--bench] (got `{a}`)")),
        None => {}
    }
    let mut report = Vec::new();
    run(cargo().args(["test", "-p", "frugal-android"]))?;
    report.push("frugal-android tests (trainer, policy, header staleness, C-ABI properties)");
    c_test("x86-64", "gcc", None, &[])?;
    report.push("C-API test natively (x86-64)");
    c_test(
        "aarch64",
        "aarch64-linux-gnu-gcc",
        Some("aarch64-unknown-linux-gnu"),
        &["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"],
    )?;
    report.push("C-API test on aarch64 under qemu-aarch64");
    jni_test()?;
    report.push("JNI test on the host JVM (-Xcheck:jni)");
    run(cargo().args([
        "rustc",
        "-p",
        "frugal-android",
        "--lib",
        "--target",
        "aarch64-linux-android",
        "--crate-type",
        "staticlib",
    ]))?;
    report.push("aarch64-linux-android staticlib builds");
    // The Hexagon DSP backend's FastRPC transport (libcdsprpc.so opened at run time: no NDK needed
    // for the rlib).
    run(cargo().args([
        "build",
        "-p",
        "frugal-hexagon",
        "--lib",
        "--target",
        "aarch64-linux-android",
    ]))?;
    report.push("frugal-hexagon (FastRpc transport) builds for aarch64-linux-android");
    eprintln!("\nandroid: all checks passed");
    for line in report {
        eprintln!("  {line}");
    }
    eprintln!("  (Kotlin sources not compiled: no kotlinc here, and Debian has no package for it)");
    Ok(())
}
