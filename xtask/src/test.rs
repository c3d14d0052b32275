//! `cargo xtask test [--fast] [--no-setup]`: every check CI runs, as legs, each timed, ending with one
//! summary table.
//!
//! It first probes what the legs need (`setup.rs`) and installs what is missing; `--no-setup` refuses
//! instead, naming what is missing and how to install it. A leg whose tools are still missing is
//! *skipped* with the reason, never passed; a failed leg does not stop the others. The run fails when
//! a leg failed or was skipped for a missing tool; `--fast` leaves out the emulated and browser legs
//! (skipped: `--fast`), which need nothing beyond rustup.
use std::process::Command;
use std::time::Instant;

use crate::setup;

/// One part of the full run (and `miri`, which setup knows about but the run leaves out).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Leg {
    Fmt,
    Clippy,
    Tests,
    NoStd,
    Memory,
    Gpu,
    Dsp,
    Cross,
    Android,
    Web,
    FirmwareM4,
    FirmwareM0,
    FirmwareM7,
    Python,
    Miri,
    Fuzz,
}

impl Leg {
    /// The legs of `cargo xtask test`, in order.
    pub const TEST: [Leg; 16] = [
        Leg::Fmt,
        Leg::Clippy,
        Leg::Tests,
        Leg::NoStd,
        Leg::Memory,
        Leg::Gpu,
        Leg::Dsp,
        Leg::Cross,
        Leg::Android,
        Leg::Web,
        Leg::FirmwareM4,
        Leg::FirmwareM0,
        Leg::FirmwareM7,
        Leg::Python,
        Leg::Miri,
        Leg::Fuzz,
    ];
    /// Every leg setup knows.
    pub const ALL: [Leg; 16] = [
        Leg::Fmt,
        Leg::Clippy,
        Leg::Tests,
        Leg::NoStd,
        Leg::Memory,
        Leg::Gpu,
        Leg::Dsp,
        Leg::Cross,
        Leg::Android,
        Leg::Web,
        Leg::FirmwareM4,
        Leg::FirmwareM0,
        Leg::FirmwareM7,
        Leg::Python,
        Leg::Miri,
        Leg::Fuzz,
    ];

    /// Its name in the summary table and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Leg::Fmt => "fmt",
            Leg::Clippy => "clippy",
            Leg::Tests => "tests",
            Leg::NoStd => "no-std",
            Leg::Memory => "memory",
            Leg::Gpu => "gpu",
            Leg::Dsp => "dsp",
            Leg::Cross => "cross",
            Leg::Android => "android",
            Leg::Web => "web",
            Leg::FirmwareM4 => "firmware-m4",
            Leg::FirmwareM0 => "firmware-m0",
            Leg::FirmwareM7 => "firmware-m7",
            Leg::Python => "python",
            Leg::Miri => "miri",
            Leg::Fuzz => "fuzz",
        }
    }

    /// What it checks.
    pub fn about(self) -> &'static str {
        match self {
            Leg::Fmt => "formatting (cargo fmt --check)",
            Leg::Clippy => "clippy, warnings denied",
            Leg::Tests => "the workspace tests",
            Leg::NoStd => "frugal-core without std for Cortex-M4F, Cortex-M0 and wasm32 (with and without alloc, seq)",
            Leg::Memory => "the memory benchmark's targets",
            Leg::Gpu => "the wgpu kernels on this machine's adapter (lavapipe without a GPU)",
            Leg::Dsp => "the Hexagon DSP kernels and backend under qemu-hexagon, bit-exact with the CPU",
            Leg::Cross => "int8 kernels natively, on aarch64 (qemu) and wasm32 (Node)",
            Leg::Android => "Android host: C API natively and on aarch64 (qemu), JNI on the JVM, header, android staticlib",
            Leg::Web => "browser: frugal-wasm, the demo in Chromium, cross-target losses",
            Leg::FirmwareM4 => "firmware on netduinoplus2 (QEMU, Cortex-M4F), f32 and int8",
            Leg::FirmwareM0 => "firmware on microbit (QEMU, Cortex-M0, 16 KiB RAM), int8",
            Leg::FirmwareM7 => "firmware on mps2-an500 (QEMU, Cortex-M7, 256 KiB RAM): MobileNetV2-class sparse fine-tune",
            Leg::Python => "the Python package: abi3 wheel (maturin), pytest with the Flower app (simulation and deployment)",
            Leg::Miri => "frugal-core under Miri (cargo xtask miri)",
            Leg::Fuzz => "every parser and the JS API under libFuzzer (cargo xtask fuzz)",
        }
    }

    /// Whether `--fast` runs it (it needs nothing beyond rustup).
    pub fn fast(self) -> bool {
        matches!(
            self,
            Leg::Fmt | Leg::Clippy | Leg::Tests | Leg::NoStd | Leg::Memory
        )
    }

    pub fn parse(name: &str) -> Option<Leg> {
        Leg::ALL.into_iter().find(|l| l.name() == name)
    }

    /// Runs it.
    fn run(self) -> Result<(), String> {
        let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        match self {
            Leg::Fmt => cargo(&["fmt", "--all", "--check"]),
            // `frugal-wasm/seq`: the browser's sequence API (a feature of its own, so that the CPU module
            // stays under its size limit) is linted and tested natively too.
            Leg::Clippy => cargo(&[
                "clippy",
                "--workspace",
                "--all-targets",
                "--features",
                "frugal-wasm/seq",
                "--",
                "-D",
                "warnings",
            ]),
            // Every kernel this CPU has must run its conformance suite (none may skip silently).
            Leg::Tests => cargo_env(
                &["test", "--workspace", "--features", "frugal-wasm/seq"],
                &[("FRUGAL_REQUIRE_KERNELS", crate::kernels::native_required())],
            ),
            Leg::NoStd => {
                for target in [
                    "thumbv7em-none-eabihf",
                    "thumbv6m-none-eabi",
                    "wasm32-unknown-unknown",
                ] {
                    let build = ["build", "-p", "frugal-core", "--no-default-features"];
                    cargo(&[&build[..], &["--target", target]].concat())?;
                    cargo(&[&build[..], &["--features", "alloc", "--target", target]].concat())?;
                    // The sequence layers' kernels, with and without the planner.
                    cargo(&[&build[..], &["--features", "seq", "--target", target]].concat())?;
                    cargo(
                        &[&build[..], &["--features", "alloc,seq", "--target", target]].concat(),
                    )?;
                }
                Ok(())
            }
            // Peak RSS is repeatable; times are only reported.
            Leg::Memory => cargo(&[
                "run",
                "--release",
                "-p",
                "xtask",
                "--",
                "bench",
                "memory",
                "--check",
            ]),
            // The suite must find an adapter here: lavapipe is installed for this leg.
            // Then `frugal train --device gpu` as a user runs it (the CLI built with `--features gpu`).
            Leg::Gpu => {
                let env = [
                    ("FRUGAL_REQUIRE_GPU", "1".into()),
                    (
                        "XDG_RUNTIME_DIR",
                        std::env::temp_dir().display().to_string(),
                    ),
                ];
                cargo_env(&["test", "-p", "frugal-wgpu"], &env)?;
                cargo_env(
                    &[
                        "test",
                        "-p",
                        "frugal-cli",
                        "--features",
                        "gpu",
                        "--test",
                        "cli",
                        "--",
                        "gpu",
                    ],
                    &env,
                )
            }
            // The skel must build (clang, lld) and run (qemu-hexagon): the suite may not skip here.
            Leg::Dsp => cargo_env(
                &["test", "-p", "frugal-hexagon"],
                &[("FRUGAL_REQUIRE_DSP", "1".into())],
            ),
            Leg::Cross => crate::cross::main(&[]),
            Leg::Android => crate::android::main(&[]),
            Leg::Web => crate::web::main(&s(&["--test"])),
            Leg::FirmwareM4 => crate::firmware::main(&s(&["--board", "netduinoplus2"])),
            Leg::FirmwareM0 => crate::firmware::main(&s(&["--board", "microbit"])),
            Leg::FirmwareM7 => crate::firmware::main(&s(&["--board", "mps2-an500"])),
            Leg::Python => crate::python::test(),
            Leg::Miri => crate::miri::main(&[]),
            Leg::Fuzz => crate::fuzz::main(&[]),
        }
    }
}

fn cargo(args: &[&str]) -> Result<(), String> {
    cargo_env(args, &[])
}

fn cargo_env(args: &[&str], env: &[(&str, String)]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let shown: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    eprintln!("\n$ {}cargo {}", shown.concat(), args.join(" "));
    let st = Command::new(&cargo)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({st})", args.join(" ")))
    }
}

/// The space left on the file system of the target directory, as `df -h` says it (None when `df`
/// cannot tell).
fn free_disk() -> Option<String> {
    let dir = std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| ".".into());
    let out = Command::new("df").arg("-Ph").arg(&dir).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    // POSIX format: a header line, then `fs size used avail use% mount`.
    let line = text.lines().nth(1)?;
    line.split_whitespace().nth(3).map(str::to_string)
}

/// How a leg ended.
enum Outcome {
    Passed,
    Failed(String),
    Skipped(String),
}

/// The summary table: leg, result, time.
fn table(rows: &[(&str, Outcome, Option<f64>)]) -> String {
    let mut s = String::from("\n| leg | result | time |\n|---|---|---|\n");
    for (name, outcome, secs) in rows {
        let result = match outcome {
            Outcome::Passed => "passed".to_string(),
            Outcome::Failed(e) => format!("**failed**: {}", e.lines().next().unwrap_or("")),
            Outcome::Skipped(why) => format!("skipped: {why}"),
        };
        let time = secs.map_or("–".to_string(), |t| format!("{t:.1} s"));
        s.push_str(&format!("| {name} | {result} | {time} |\n"));
    }
    s
}

pub fn main(args: &[String]) -> Result<(), String> {
    let mut fast = false;
    let mut no_setup = false;
    let mut only: Option<Vec<Leg>> = None;
    let usage = "usage: cargo xtask test [--fast] [--no-setup] [--only LEG,LEG…]";
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--fast" => fast = true,
            "--no-setup" => no_setup = true,
            "--only" => {
                let names = it.next().ok_or(format!("--only needs legs; {usage}"))?;
                let legs = names
                    .split(',')
                    .map(|n| {
                        Leg::parse(n).ok_or_else(|| {
                            let all: Vec<&str> = Leg::TEST.iter().map(|l| l.name()).collect();
                            format!("unknown leg {n:?} (legs: {})", all.join(", "))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                only = Some(legs);
            }
            _ => return Err(format!("unknown argument {a:?}; {usage}")),
        }
    }
    let t0 = Instant::now();
    let legs: Vec<Leg> = Leg::TEST
        .into_iter()
        .filter(|l| !fast || l.fast())
        .filter(|l| only.as_ref().is_none_or(|o| o.contains(l)))
        .collect();
    let mut rows = Vec::new();

    eprintln!("== setup: what the legs need");
    let t = Instant::now();
    let status = if no_setup {
        let s = setup::Status::of(&legs);
        s.print();
        let missing = s.missing();
        if !missing.is_empty() {
            let how: Vec<String> = missing
                .iter()
                .map(|t| format!("  {}: {}", t.name, t.hint()))
                .collect();
            return Err(format!(
                "--no-setup: missing tools (`cargo xtask setup` installs them):\n{}",
                how.join("\n")
            ));
        }
        s
    } else {
        setup::ensure(&legs)
    };
    let missing = status.missing().len();
    rows.push((
        "setup",
        if missing == 0 {
            Outcome::Passed
        } else {
            Outcome::Failed(format!("{missing} tools still missing"))
        },
        Some(t.elapsed().as_secs_f64()),
    ));

    for leg in Leg::TEST {
        if !legs.contains(&leg) {
            // Left out on purpose: by --fast, or not named by --only.
            let why = if fast && !leg.fast() {
                "--fast"
            } else {
                "not in --only"
            };
            rows.push((leg.name(), Outcome::Skipped(why.into()), None));
            continue;
        }
        if let Some(why) = status.blocks(leg) {
            eprintln!("\n== {}: skipped ({why})", leg.name());
            rows.push((leg.name(), Outcome::Skipped(why), None));
            continue;
        }
        let needs = setup::needs(leg);
        eprintln!(
            "\n== {}: {} (needs: {})",
            leg.name(),
            leg.about(),
            if needs.is_empty() {
                "cargo only".to_string()
            } else {
                needs.join(", ")
            }
        );
        let t = Instant::now();
        let outcome = match leg.run() {
            Ok(()) => Outcome::Passed,
            Err(e) => Outcome::Failed(e),
        };
        let secs = t.elapsed().as_secs_f64();
        match &outcome {
            Outcome::Failed(e) => eprintln!("-- {}: FAILED after {secs:.1} s: {e}", leg.name()),
            _ => eprintln!("-- {}: passed in {secs:.1} s", leg.name()),
        }
        // A full disk fails legs with unrelated-looking errors: say how much is left after each.
        if let Some(free) = free_disk() {
            eprintln!("-- disk: {free} free where the builds go");
        }
        rows.push((leg.name(), outcome, Some(secs)));
    }

    let failed: Vec<&str> = rows
        .iter()
        .filter(|(_, o, _)| matches!(o, Outcome::Failed(_)))
        .map(|(n, _, _)| *n)
        .collect();
    let blocked: Vec<&str> = rows
        .iter()
        .filter(
            |(_, o, _)| matches!(o, Outcome::Skipped(w) if w != "--fast" && w != "not in --only"),
        )
        .map(|(n, _, _)| *n)
        .collect();
    println!("{}", table(&rows));
    println!(
        "Kernels (\"ran\": its conformance suite — on the boards, training — ran and was required to):{}",
        crate::kernels::table(|l| {
            match rows.iter().find(|(n, _, _)| *n == l.name()).map(|r| &r.1) {
                Some(Outcome::Passed) => crate::kernels::LegResult::Passed,
                Some(Outcome::Failed(_)) => crate::kernels::LegResult::Failed,
                _ => crate::kernels::LegResult::NotRun,
            }
        })
    );
    println!(
        "total {:.1} s{}",
        t0.elapsed().as_secs_f64(),
        if fast {
            " (--fast: the emulated and browser legs left out)"
        } else {
            ""
        }
    );
    if !failed.is_empty() {
        return Err(format!("failed: {}", failed.join(", ")));
    }
    if !blocked.is_empty() {
        return Err(format!(
            "skipped for missing tools: {} (`cargo xtask setup` says how to install them)",
            blocked.join(", ")
        ));
    }
    eprintln!("all checks passed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leg_names_round_trip() {
        for l in Leg::ALL {
            assert_eq!(Leg::parse(l.name()), Some(l));
        }
        assert_eq!(Leg::parse("nope"), None);
    }

    #[test]
    fn the_table_says_why_a_leg_was_skipped_and_shows_no_time_for_it() {
        let t = table(&[
            ("fmt", Outcome::Passed, Some(1.5)),
            ("web", Outcome::Skipped("missing chromium".into()), None),
            ("cross", Outcome::Failed("boom\nmore".into()), Some(3.0)),
        ]);
        assert!(t.contains("| fmt | passed | 1.5 s |"));
        assert!(t.contains("| web | skipped: missing chromium | – |"));
        assert!(t.contains("| cross | **failed**: boom | 3.0 s |"));
    }
}
