//! `cargo xtask bench gpu [--placement] [--reps R]`: the wgpu tiled SGEMM on this machine's adapter
//! beside frugal's CPU SGEMM (or, with `--placement`, ms/step of all-CPU, all-GPU, the DP's measured
//! placement and alternating layers), measured by `hosts/wgpu/examples/bench_gpu.rs` in its own process (the xtask binary, whose
//! process the memory benchmark measures, does not link wgpu).
//!
//! `cargo xtask bench gpu --sgemm-sweep [--sizes N,…] [--timings T] [--top K] [--prebuilt DIR |
//! --export DIR]`: every SGEMM kernel candidate checked against the CPU and timed in one process
//! (`bench_gpu --sgemm-sweep`, which documents the method); `cargo xtask bench gpu --profile
//! [--batch B] [--steps S] [--prebuilt DIR]`: per-dispatch GPU times of one LeNet-5 and small-CNN step
//! from timestamp queries (`bench_gpu --profile`); `--export DIR` builds `bench_gpu` alone
//! and copies it, stripped, with this xtask binary into `DIR`; `--prebuilt DIR` runs `DIR/bench_gpu`.
//!
//! `cargo xtask bench gpu --burn [--reps R] [--steps S] [--warmup W] [--batch B] [--prebuilt DIR |
//! --export DIR]`: frugal's GPU backend against Burn's wgpu backend on the same adapter — LeNet-5 and
//! the small CNN at batch 128 (ms/step) and a 1024³ matmul (GFLOPS). Burn's side is the standalone
//! program `tests/bench/burn-wgpu` (its own workspace and lock file, built here in release under
//! `<target>/burn-wgpu`, `nice -n 10`); frugal's is `bench_gpu --one`. Each measurement is a fresh
//! process printing one `BENCH-JSON {…}` line; the two sides alternate row by row, `R` rounds, the one
//! going first swapped every round. `--export DIR` builds both and copies them with this xtask binary
//! into `DIR` (for a GPU machine that cannot build); `--prebuilt DIR` runs the binaries in `DIR`
//! without building. A side that opens no adapter is reported *skipped*; `FRUGAL_REQUIRE_BURN=1`
//! turns that into a failure.
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

pub fn main(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "--burn") {
        return burn(args);
    }
    let prebuilt = crate::bench::arg(args, "--prebuilt").map(PathBuf::from);
    let export = crate::bench::arg(args, "--export").map(PathBuf::from);
    // The arguments for `bench_gpu`: without `--prebuilt DIR` / `--export DIR`.
    let mut rest = Vec::new();
    let mut skip = false;
    for a in args {
        if std::mem::take(&mut skip) {
            continue;
        }
        if a == "--prebuilt" || a == "--export" {
            skip = true;
        } else {
            rest.push(a.clone());
        }
    }
    if let Some(dir) = export {
        // `bench_gpu` and this xtask binary, stripped, for a GPU machine that cannot build (the
        // SGEMM sweep and the step profile need no Burn driver).
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.args([
            "build",
            "--release",
            "-p",
            "frugal-wgpu",
            "--example",
            FRUGAL_BIN,
        ]);
        let frugal = built_executable(cmd, FRUGAL_BIN, "bench_gpu")?;
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let me = std::env::current_exe().map_err(|e| format!("this xtask binary: {e}"))?;
        for (from, name) in [(&frugal, FRUGAL_BIN), (&me, "xtask")] {
            copy_stripped(from, &dir.join(name))?;
        }
        println!(
            "\non the GPU machine: XDG_RUNTIME_DIR=/tmp {}/xtask bench gpu {} --prebuilt {}",
            dir.display(),
            rest.join(" "),
            dir.display()
        );
        return Ok(());
    }
    let st = match prebuilt {
        Some(dir) => {
            let bin = dir.join(FRUGAL_BIN);
            if !bin.is_file() {
                return Err(format!("{} is missing", bin.display()));
            }
            Command::new(bin).args(&rest).status()
        }
        None => Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args([
                "run",
                "--release",
                "-p",
                "frugal-wgpu",
                "--example",
                "bench_gpu",
                "--",
            ])
            .args(&rest)
            .status(),
    }
    .map_err(|e| format!("cannot run the GPU benchmark: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("the GPU benchmark failed ({st})"))
    }
}

/// Timings of Burn's matmul row on a GPU (see `burn`).
const BURN_MATMUL_REPS: usize = 500;

const USAGE: &str = "usage: cargo xtask bench gpu --burn [--reps R] [--steps S] [--warmup W] [--batch B] [--prebuilt DIR | --export DIR]";

/// The file names of the two measuring programs (in `--export`/`--prebuilt` directories).
const FRUGAL_BIN: &str = "bench_gpu";
const BURN_BIN: &str = "frugal-burn-bench";

/// The executable `cargo build --message-format=json` reports for the target named `name`.
fn built_executable(mut cmd: Command, name: &str, what: &str) -> Result<PathBuf, String> {
    let out = cmd
        .arg("--message-format=json-render-diagnostics")
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo for {what}: {e}"))?;
    if !out.status.success() {
        return Err(format!("building {what} failed ({})", out.status));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == name)
        .find_map(|v| v["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| format!("cargo built {what} but named no executable {name}"))
}

/// Copies `from` to `to` and strips the copy (line tables are most of a release binary: bench_gpu
/// 39 → 6 MB), printing its size.
fn copy_stripped(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::copy(from, to).map_err(|e| format!("{} → {}: {e}", from.display(), to.display()))?;
    match Command::new("strip").arg(to).status() {
        Ok(st) if st.success() => {}
        other => eprintln!(
            "could not strip {} ({other:?}): copied as built",
            to.display()
        ),
    }
    let bytes = std::fs::metadata(to).map(|m| m.len()).unwrap_or(0);
    println!(
        "{} ({:.1} MiB)",
        to.display(),
        bytes as f64 / (1024.0 * 1024.0)
    );
    Ok(())
}

/// Builds frugal's `bench_gpu` and the Burn driver in release; their paths.
fn build() -> Result<(PathBuf, PathBuf), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = crate::setup::root();
    let mut frugal = Command::new("nice");
    frugal.args([
        "-n",
        "10",
        &cargo,
        "build",
        "--release",
        "-p",
        "frugal-wgpu",
    ]);
    frugal.args(["--example", FRUGAL_BIN]).current_dir(&root);
    let frugal = built_executable(frugal, FRUGAL_BIN, "frugal's bench_gpu")?;
    // The Burn driver in its own target directory under the workspace's (Burn is large and shares
    // nothing with frugal's build), from its committed lock file.
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("burn-wgpu");
    let mut burn = Command::new("nice");
    burn.args(["-n", "10", &cargo, "build", "--release", "--locked"])
        .arg("--manifest-path")
        .arg(root.join("tests/bench/burn-wgpu/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        // The workspace's CARGO_TARGET_DIR would otherwise win over --target-dir for nothing: be explicit.
        .env_remove("CARGO_TARGET_DIR");
    let burn = built_executable(burn, BURN_BIN, "the Burn driver (tests/bench/burn-wgpu)")?;
    Ok((frugal, burn))
}

/// One process's `BENCH-JSON` line: `Ok(Some(v))`, `Ok(None)` when it reported *skipped* (exit code
/// 3: no adapter), `Err` when it failed.
fn measure(bin: &Path, args: &[String]) -> Result<Option<Value>, String> {
    let out = Command::new(bin)
        .args(args)
        .env(
            "XDG_RUNTIME_DIR",
            std::env::var_os("XDG_RUNTIME_DIR").unwrap_or_else(|| "/tmp".into()),
        )
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = parse_line(&stdout);
    match (out.status.code(), line) {
        (Some(0), Some(v)) if v.get("skipped").is_none() => Ok(Some(v)),
        (Some(3), Some(v)) if v.get("skipped").is_some() => {
            eprintln!("{}: skipped: {}", bin.display(), v["skipped"]);
            Ok(None)
        }
        (code, _) => Err(format!(
            "{} {} failed (exit {code:?}); stdout: {stdout}",
            bin.display(),
            args.join(" ")
        )),
    }
}

/// The last `BENCH-JSON {…}` line of `stdout`, parsed.
fn parse_line(stdout: &str) -> Option<Value> {
    stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("BENCH-JSON "))
        .and_then(|j| serde_json::from_str(j).ok())
}

/// frugal's adapter string for a Burn line (`name (Api, DeviceType)`, as `Gpu::adapter` prints).
fn burn_adapter(v: &Value) -> String {
    format!(
        "{} ({}, {})",
        v["adapter"].as_str().unwrap_or("?"),
        v["api"].as_str().unwrap_or("?"),
        v["device_type"].as_str().unwrap_or("?")
    )
}

/// One row's measurements: frugal's and Burn's values per round (ms/step or GFLOPS).
struct Row {
    title: String,
    key: &'static str,
    args: Vec<String>,
    frugal: Vec<f64>,
    burn: Vec<f64>,
}

fn spread(v: &[f64]) -> String {
    if v.is_empty() {
        return "skipped".into();
    }
    let s = crate::stats::Spread::of(v);
    format!("{:.2} ({:.2}–{:.2})", s.median, s.min, s.max)
}

fn burn(args: &[String]) -> Result<(), String> {
    let get = |name: &str, default: usize| -> Result<usize, String> {
        match crate::bench::arg(args, name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .ok()
                .filter(|&v: &usize| v > 0)
                .ok_or_else(|| format!("{name} needs a positive number; {USAGE}")),
        }
    };
    let reps = get("--reps", 5)?;
    let steps = get("--steps", 10)?;
    let warmup = get("--warmup", 3)?;
    let batch = get("--batch", 128)?;
    let prebuilt = crate::bench::arg(args, "--prebuilt").map(PathBuf::from);
    let export = crate::bench::arg(args, "--export").map(PathBuf::from);
    let (frugal, burn) = match &prebuilt {
        Some(dir) => {
            // `--export` carries the Burn driver gzipped (79 MiB stripped, 23 MiB compressed).
            let gz = dir.join(format!("{BURN_BIN}.gz"));
            if !dir.join(BURN_BIN).is_file() && gz.is_file() {
                let st = Command::new("gzip").arg("-dkf").arg(&gz).status();
                if !st.as_ref().is_ok_and(|s| s.success()) {
                    return Err(format!("cannot gunzip {} ({st:?})", gz.display()));
                }
                // gzip gives the unpacked file the archive's mode: a `.gz` made without the execute bit
                // (or copied through a tool that drops it) unpacks to a driver that cannot be run.
                #[cfg(unix)]
                {
                    use std::os::unix::fs::PermissionsExt;
                    let bin = dir.join(BURN_BIN);
                    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755))
                        .map_err(|e| format!("{}: {e}", bin.display()))?;
                }
            }
            (dir.join(FRUGAL_BIN), dir.join(BURN_BIN))
        }
        None => build()?,
    };
    for b in [&frugal, &burn] {
        if !b.is_file() {
            return Err(format!("{} is missing; {USAGE}", b.display()));
        }
    }
    if let Some(dir) = export {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let me = std::env::current_exe().map_err(|e| format!("this xtask binary: {e}"))?;
        // Stripped, so that the three fit a carry of a few tens of MB.
        for (from, name) in [(&frugal, FRUGAL_BIN), (&burn, BURN_BIN), (&me, "xtask")] {
            copy_stripped(from, &dir.join(name))?;
        }
        // The Burn driver stays over a 64 MiB carry even stripped: gzip it (`--prebuilt` unpacks it).
        let st = Command::new("gzip")
            .arg("-f")
            .arg(dir.join(BURN_BIN))
            .status();
        if !st.as_ref().is_ok_and(|s| s.success()) {
            return Err(format!(
                "cannot gzip {} ({st:?})",
                dir.join(BURN_BIN).display()
            ));
        }
        println!("{}.gz (gzipped)", dir.join(BURN_BIN).display());
        println!(
            "\non the GPU machine: XDG_RUNTIME_DIR=/tmp {}/xtask bench gpu --burn --prebuilt {}",
            dir.display(),
            dir.display()
        );
        return Ok(());
    }

    let s = |v: usize| v.to_string();
    let mut rows: Vec<Row> = ["lenet5", "small_cnn"]
        .into_iter()
        .map(|id| Row {
            title: format!(
                "{} b{batch} ms/step",
                if id == "lenet5" {
                    "LeNet-5"
                } else {
                    "small CNN"
                }
            ),
            key: "ms_per_step",
            args: vec![
                id.into(),
                "--batch".into(),
                s(batch),
                "--steps".into(),
                s(steps),
                "--warmup".into(),
                s(warmup),
            ],
            frugal: Vec::new(),
            burn: Vec::new(),
        })
        .collect();
    rows.push(Row {
        title: "matmul 1024³ GFLOPS".into(),
        key: "gflops",
        args: vec![
            "matmul".into(),
            "--n".into(),
            "1024".into(),
            "--reps".into(),
            "5".into(),
        ],
        frugal: Vec::new(),
        burn: Vec::new(),
    });

    let (mut frugal_adapter, mut burn_adapter_name) = (None::<String>, None::<String>);
    let (mut frugal_skipped, mut burn_skipped) = (false, false);
    let started = std::time::Instant::now();
    for round in 0..reps {
        for row in &mut rows {
            // Swap who goes first every round, so neither side always runs on a machine the other
            // just warmed (or heated).
            let burn_first = round % 2 == 1;
            for side in [burn_first, !burn_first] {
                if (side && burn_skipped) || (!side && frugal_skipped) {
                    continue;
                }
                let got = if side {
                    // Burn's matmul times 4 products per timing (its driver, built once, is left
                    // as it is): on a GPU, 500 timings, so that the early ones clock the GPU up as
                    // frugal's 1 s warm-up does and the best is a warm one.
                    let mut a = row.args.clone();
                    let hardware = frugal_adapter
                        .as_deref()
                        .is_some_and(|a| !a.ends_with(", Cpu)"));
                    if row.key == "gflops" && hardware {
                        if let Some(r) = a.iter().position(|x| x == "--reps") {
                            a[r + 1] = BURN_MATMUL_REPS.to_string();
                        }
                    }
                    measure(&burn, &a)?
                } else {
                    let mut a = vec!["--one".to_string()];
                    a.extend(row.args.iter().cloned());
                    measure(&frugal, &a)?
                };
                let Some(v) = got else {
                    if side {
                        burn_skipped = true;
                    } else {
                        frugal_skipped = true;
                    }
                    continue;
                };
                let x = v[row.key]
                    .as_f64()
                    .ok_or_else(|| format!("no {} in {v}", row.key))?;
                if side {
                    burn_adapter_name.get_or_insert_with(|| burn_adapter(&v));
                    row.burn.push(x);
                } else {
                    frugal_adapter
                        .get_or_insert_with(|| v["adapter"].as_str().unwrap_or("?").to_string());
                    row.frugal.push(x);
                }
            }
        }
    }

    let software = frugal_adapter
        .as_deref()
        .is_some_and(|a| a.ends_with(", Cpu)"));
    println!(
        "\n`cargo xtask bench gpu --burn --reps {reps} --steps {steps} --warmup {warmup}` — {reps} rounds, frugal and Burn alternating row by row ({:.0} s){}",
        started.elapsed().as_secs_f64(),
        if prebuilt.is_some() { ", prebuilt binaries" } else { "" }
    );
    println!(
        "frugal's adapter: {}",
        frugal_adapter.as_deref().unwrap_or("none (skipped)")
    );
    println!(
        "Burn's adapter:   {}",
        burn_adapter_name.as_deref().unwrap_or("none (skipped)")
    );
    if let (Some(f), Some(b)) = (&frugal_adapter, &burn_adapter_name) {
        if f != b {
            println!("WARNING: the two sides opened different adapters — the ratios compare different devices");
        }
    }
    if software {
        println!("The adapter is a software rasteriser (lavapipe): it runs on this CPU — information only, not a GPU figure.");
    }
    println!(
        "ms/step: each process {warmup} untimed steps then the median of {steps} (device synchronised, loss read back); GFLOPS: frugal the best of 5 timings of one ≥ 2 ms submission after ≥ 1 s of untimed products (its default kernel), Burn the best of {} timings of 4 products (synchronised). Cells: median over rounds (min–max).\n",
        if software { 5 } else { BURN_MATMUL_REPS }
    );
    println!("| row | frugal wgpu | Burn 0.22.1 wgpu | frugal / Burn (medians) | paired ratios, median (min–max) |");
    println!("|---|---:|---:|---:|---:|");
    for row in &rows {
        let (ratio, paired) = if row.frugal.is_empty() || row.burn.is_empty() {
            ("skipped".to_string(), "skipped".to_string())
        } else {
            let fm = crate::stats::median(row.frugal.clone());
            let bm = crate::stats::median(row.burn.clone());
            let p: Vec<f64> = row
                .frugal
                .iter()
                .zip(&row.burn)
                .map(|(f, b)| f / b)
                .collect();
            let ps = crate::stats::Spread::of(&p);
            (
                format!("{:.3}", fm / bm),
                format!("{:.3} ({:.3}–{:.3})", ps.median, ps.min, ps.max),
            )
        };
        println!(
            "| {} | {} | {} | {ratio} | {paired} |",
            row.title,
            spread(&row.frugal),
            spread(&row.burn)
        );
    }
    println!("\n(ms/step: frugal / Burn ≤ 1 means frugal is at least as fast; GFLOPS: > 1 means frugal is faster.)");
    if frugal_skipped || burn_skipped {
        let who = match (frugal_skipped, burn_skipped) {
            (true, true) => "both sides",
            (true, false) => "frugal",
            _ => "Burn",
        };
        let msg = format!("skipped: {who} could not open a wgpu adapter — nothing was compared");
        if std::env::var_os("FRUGAL_REQUIRE_BURN").is_some_and(|v| v == "1") {
            return Err(format!("{msg} (FRUGAL_REQUIRE_BURN=1)"));
        }
        println!("{msg}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_last_bench_line_and_the_burn_adapter() {
        let out = "noise\nBENCH-JSON {\"side\":\"burn-wgpu\",\"row\":\"lenet5\",\"ms_per_step\":1.5,\"adapter\":\"llvmpipe (LLVM 19)\",\"device_type\":\"Cpu\",\"api\":\"Vulkan\"}\n";
        let v = parse_line(out).expect("one line");
        assert_eq!(v["ms_per_step"].as_f64(), Some(1.5));
        assert_eq!(burn_adapter(&v), "llvmpipe (LLVM 19) (Vulkan, Cpu)");
        assert!(parse_line("no line here\n").is_none());
        assert!(parse_line("BENCH-JSON {not json").is_none());
    }

    #[test]
    fn spread_is_median_and_range() {
        assert_eq!(spread(&[3.0, 1.0, 2.0]), "2.00 (1.00–3.00)");
        assert_eq!(spread(&[]), "skipped");
    }
}
