//! `cargo xtask fuzz [--time SECS] [--seed N] [--seeds] [TARGET …]`: every libFuzzer target in `fuzz/`
//! (cargo-fuzz on nightly, debug assertions and overflow checks on), each for `--time` seconds (default
//! 20) from libFuzzer seed `N` (default 1, so a clean run starts the same way everywhere; 0 picks one at
//! random), then a table a person can paste: runs, crashes, coverage (libFuzzer's `cov:` edges and `ft:`
//! features), corpus size. Fails when a target crashes; the crashing input is under
//! `fuzz/artifacts/<target>/`, and the log carries the panic and the input as hex, to replay from a log.
//!
//! Needs `rustup toolchain install nightly --profile minimal` and `cargo install cargo-fuzz`
//! (0.13.2 checked). Each run reads the committed seeds (`fuzz/corpus/<target>/`, never written) and
//! grows a scratch corpus under `fuzz/target/corpus/<target>/`, kept between runs.
//!
//! `--seeds` rewrites the seed files that are derived from the repository's own examples (models,
//! plans, plan tables, safetensors, IDX, CSV, TOML) and exits.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The targets, in the order they run.
pub const TARGETS: &[&str] = &[
    "model",
    "plan",
    "plan_table",
    "safetensors",
    "idx",
    "csv",
    "toml",
    "js_api",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the repository")
        .to_path_buf()
}

/// `cargo +nightly fuzz …` in `fuzz/`, with the environment of the stable `cargo xtask` cleared so the
/// nightly toolchain and the fuzz crate's own target directory are used.
fn cargo_fuzz(fuzz_dir: &Path) -> Command {
    let mut c = Command::new("cargo");
    c.arg("+nightly")
        .arg("fuzz")
        .current_dir(fuzz_dir)
        .env("CARGO_TARGET_DIR", fuzz_dir.join("target"));
    for v in [
        "RUSTUP_TOOLCHAIN",
        "RUSTC",
        "CARGO",
        "RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
    ] {
        c.env_remove(v);
    }
    c
}

/// One target's numbers, read from libFuzzer's output.
#[derive(Debug, Default, PartialEq)]
pub struct Stats {
    /// Inputs executed.
    pub runs: u64,
    /// Edges covered (`cov:`).
    pub cov: u64,
    /// Features (`ft:`).
    pub ft: u64,
    /// Inputs in the corpus at the end (`corp:`).
    pub corpus: u64,
    /// Whether libFuzzer reported a crash, leak, timeout or out-of-memory.
    pub crashed: bool,
}

/// Parses libFuzzer's stderr: the last status line (`#N … cov: C ft: F corp: K/…`), the final
/// `stat::number_of_executed_units`, and any crash report.
pub fn parse_stats(log: &str) -> Stats {
    let mut s = Stats::default();
    let field = |line: &str, key: &str| -> Option<u64> {
        let rest = &line[line.find(key)? + key.len()..];
        rest.split_whitespace()
            .next()?
            .split('/')
            .next()?
            .parse()
            .ok()
    };
    for line in log.lines() {
        if let Some(rest) = line.strip_prefix('#') {
            if let Some(n) = rest.split_whitespace().next().and_then(|n| n.parse().ok()) {
                s.runs = s.runs.max(n);
            }
            if let Some(c) = field(line, "cov: ") {
                s.cov = c;
            }
            if let Some(f) = field(line, "ft: ") {
                s.ft = f;
            }
            if let Some(k) = field(line, "corp: ") {
                s.corpus = k;
            }
        }
        if let Some(n) = line
            .strip_prefix("stat::number_of_executed_units:")
            .and_then(|n| n.trim().parse().ok())
        {
            s.runs = s.runs.max(n);
        }
        if line.contains("==ERROR: libFuzzer")
            || line.contains("ERROR: AddressSanitizer")
            || line.starts_with("SUMMARY: libFuzzer")
            || line.contains("panicked at")
        {
            s.crashed = true;
        }
    }
    s
}

/// What a person needs from a crash when only the log survives (a CI machine's artifacts are gone): the
/// panic message, and the crashing input as hex with the commands that replay it.
fn crash_report(log: &str, fuzz_dir: &Path, target: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    let mut out = String::from("-- crash report --\n");
    for (i, l) in lines.iter().enumerate() {
        if l.contains("panicked at") || l.contains("ERROR: libFuzzer") {
            out += l;
            out.push('\n');
            if let Some(next) = lines.get(i + 1) {
                out += next;
                out.push('\n');
            }
        }
    }
    let written = lines
        .iter()
        .find_map(|l| l.split("Test unit written to ").nth(1))
        .map(|p| fuzz_dir.join(p.trim()));
    match written.map(|p| (std::fs::read(&p), p)) {
        Some((Ok(bytes), p)) if bytes.len() <= 16 * 1024 => {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            out += &format!(
                "input ({} bytes, {}):\n{hex}\nreplay: echo <hex> | xxd -r -p > crash.bin && \
                 (cd fuzz && cargo +nightly fuzz run -a {target} ../crash.bin)\n",
                bytes.len(),
                p.display()
            );
        }
        Some((Ok(bytes), p)) => {
            out += &format!("input: {} ({} bytes)\n", p.display(), bytes.len());
        }
        _ => out += "input: not written (see the log above)\n",
    }
    out
}

/// Entry point: `args` after `fuzz`.
pub fn main(args: &[String]) -> Result<(), String> {
    let mut secs = 20u64;
    // A fixed seed: a clean run explores the same inputs first, so a CI failure reproduces.
    let mut seed = 1u64;
    let mut chosen = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--time" => {
                secs = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--time needs a number of seconds")?
            }
            "--seed" => {
                seed = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--seed needs a number (0: a random seed each run)")?
            }
            "--seeds" => return write_seeds(&root().join("fuzz/corpus")),
            t if TARGETS.contains(&t) => chosen.push(t),
            other => {
                return Err(format!(
                    "unknown argument {other:?}; targets: {}",
                    TARGETS.join(", ")
                ))
            }
        }
    }
    if chosen.is_empty() {
        chosen = TARGETS.to_vec();
    }
    let fuzz_dir = root().join("fuzz");
    let ok = cargo_fuzz(&fuzz_dir)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return Err("cargo-fuzz on nightly is missing: `rustup toolchain install nightly --profile minimal` and `cargo install cargo-fuzz` (0.13.2)".into());
    }
    eprintln!("$ cargo +nightly fuzz build -a (in fuzz/)");
    let st = cargo_fuzz(&fuzz_dir)
        .args(["build", "-a"])
        .status()
        .map_err(|e| format!("cannot run cargo fuzz: {e}"))?;
    if !st.success() {
        return Err(format!("`cargo +nightly fuzz build -a` failed ({st})"));
    }
    let mut rows = Vec::new();
    for t in &chosen {
        let work = fuzz_dir.join("target/corpus").join(t);
        std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
        let seeds = fuzz_dir.join("corpus").join(t);
        eprintln!("\n== fuzz {t} for {secs} s");
        let out = cargo_fuzz(&fuzz_dir)
            .args(["run", "-a", t])
            .arg(&work)
            .arg(&seeds)
            .arg("--")
            .arg(format!("-max_total_time={secs}"))
            .arg(format!("-seed={seed}"))
            .args([
                "-print_final_stats=1",
                "-rss_limit_mb=2048",
                "-timeout=20",
                "-max_len=65536",
            ])
            .stdout(Stdio::inherit())
            .output()
            .map_err(|e| format!("cannot run cargo fuzz: {e}"))?;
        let log = String::from_utf8_lossy(&out.stderr);
        let mut s = parse_stats(&log);
        s.crashed |= !out.status.success();
        if s.crashed {
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
            eprintln!("{}", crash_report(&log, &fuzz_dir, t));
        }
        rows.push((t, s));
    }
    println!("\ncargo xtask fuzz --time {secs}");
    println!("| target | runs | crashes | cov (edges) | ft (features) | corpus |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (t, s) in &rows {
        println!(
            "| {t} | {} | {} | {} | {} | {} |",
            s.runs, s.crashed as u8, s.cov, s.ft, s.corpus
        );
    }
    let crashed: Vec<&str> = rows
        .iter()
        .filter(|(_, s)| s.crashed)
        .map(|(t, _)| **t)
        .collect();
    if crashed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "crashes in {} (inputs under fuzz/artifacts/<target>/; reproduce with `cargo +nightly fuzz run -a <target> <file>` in fuzz/)",
            crashed.join(", ")
        ))
    }
}

fn put(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let p = dir.join(name);
    std::fs::write(&p, bytes).map_err(|e| format!("{}: {e}", p.display()))
}

/// Writes the seeds derived from the repository's examples into `corpus/<target>/`.
fn write_seeds(corpus: &Path) -> Result<(), String> {
    use frugal_core::budget::Budget;
    use frugal_core::format::{encode_model, encode_plan, encode_plan_table, PlanEntry, PlanTable};
    use frugal_core::graph::Graph;
    use frugal_core::model::{Int8Update, Precision};
    use frugal_core::plan::Plan;
    use frugal_core::policy::{plan_for_budget, CostModel, PolicyKind};

    let r = root();
    let load = |name: &str| {
        frugal_cli::spec_toml::load_model(&r.join("examples").join(name)).map_err(|e| e.to_string())
    };
    let mlp = load("digits-mlp.toml")?.spec;
    let cnn = load("digits-cnn.toml")?.spec;
    let res = load("residual-bn.toml")?.spec;
    for (n, s) in [("mlp", &mlp), ("cnn", &cnn), ("residual-bn", &res)] {
        put(
            &corpus.join("model"),
            &format!("{n}.frgm"),
            &encode_model(s),
        )?;
    }
    for n in ["digits-mlp.toml", "digits-cnn.toml", "residual-bn.toml"] {
        let text = std::fs::read(r.join("examples").join(n)).map_err(|e| e.to_string())?;
        put(&corpus.join("toml"), n, &text)?;
    }
    let g = |s, b| Graph::new(s, b).map_err(|e| e.to_string());
    let plain = Plan::new(g(&mlp, 2)?);
    put(
        &corpus.join("plan"),
        "mlp-b2.frgp",
        &encode_plan(&mlp, &plain),
    )?;
    let cost = CostModel::estimate(&g(&cnn, 4)?);
    let full = Plan::new(g(&cnn, 4)?).arena_bytes;
    for (name, kind) in [
        ("cnn-micro.frgp", PolicyKind::MicroBatch),
        ("cnn-recompute.frgp", PolicyKind::Recompute),
    ] {
        // The largest budget below the plain plan's that the policy meets.
        let c = (1..8)
            .rev()
            .find_map(|k| plan_for_budget(&cnn, 4, Budget::new(full * k / 8), kind, &cost).ok())
            .ok_or(format!("no {name} plan below the plain arena"))?;
        put(&corpus.join("plan"), name, &encode_plan(&cnn, &c.plan))?;
    }
    let int8 = Graph::with_precision(
        &mlp,
        2,
        Precision::Int8(Int8Update::Integer { update_bits: 4 }),
    )
    .map_err(|e| e.to_string())?;
    put(
        &corpus.join("plan"),
        "mlp-int8.frgp",
        &encode_plan(&mlp, &Plan::new(int8)),
    )?;
    // A small transformer with its attention in recompute mode (plan version 5's attention byte).
    let gpt = frugal_cli::spec_toml::load_model(&r.join("tests/golden/gpt.toml"))
        .map_err(|e| e.to_string())?
        .spec;
    let rec = frugal_core::policy::graph_in_mode(&gpt, 2, true).map_err(|e| e.to_string())?;
    put(
        &corpus.join("plan"),
        "gpt-attn-recompute.frgp",
        &encode_plan(&gpt, &Plan::new(rec)),
    )?;
    let table = PlanTable {
        entries: vec![
            PlanEntry {
                budget: plain.arena_bytes,
                plan: plain.clone(),
            },
            PlanEntry {
                budget: plain.arena_bytes * 2,
                plan: Plan::new(g(&mlp, 2)?),
            },
        ],
    };
    put(
        &corpus.join("plan_table"),
        "mlp-2.frgt",
        &encode_plan_table(&mlp, &table),
    )?;
    // safetensors: the `Raw` variant of the target's input (a zero u32 picks it).
    let st = frugal_cli::checkpoint::serialize_safetensors(
        &[
            (
                "fc.weight",
                &[2, 3][..],
                &[0.5f32, -1.0, 2.0, 0.0, 1.5, -0.25][..],
            ),
            ("fc.bias", &[2][..], &[0.1f32, 0.2][..]),
        ],
        None,
        "seed.safetensors",
    )
    .map_err(|e| e.to_string())?;
    put(
        &corpus.join("safetensors"),
        "raw-f32.bin",
        &[&[0u8; 4][..], &st].concat(),
    )?;
    // IDX: selector byte, then the file (labels and images alone), or both behind a u16 length.
    let images = [
        &[0u8, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2][..],
        &[0, 255, 16, 8, 1, 2, 3, 4],
    ]
    .concat();
    let labels = [0u8, 0, 8, 1, 0, 0, 0, 2, 3, 7];
    put(
        &corpus.join("idx"),
        "images.bin",
        &[&[0u8][..], &images].concat(),
    )?;
    put(
        &corpus.join("idx"),
        "labels.bin",
        &[&[0u8][..], &labels].concat(),
    )?;
    let both = [
        &[4u8][..],
        &(images.len() as u16).to_le_bytes(),
        &images,
        &labels,
    ]
    .concat();
    put(&corpus.join("idx"), "both.bin", &both)?;
    // CSV: selector byte (label column 0, no shape / 2 features), then the text.
    put(
        &corpus.join("csv"),
        "header.csv",
        b"\x00label,a,b\n0,1.5,2\n1,-3e2,0.25\n\n2,4,5\n",
    )?;
    put(&corpus.join("csv"), "shaped.csv", b"\x082,1,0\n1,0.5,3\n")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libfuzzer_output_gives_runs_coverage_and_crashes() {
        let log = "INFO: Seed: 1\n#2\tINITED cov: 10 ft: 11 corp: 1/1b exec/s: 0 rss: 30Mb\n\
                   #4096\tpulse  cov: 812 ft: 2301 corp: 95/3102b lim: 43 exec/s: 2048 rss: 60Mb\n\
                   #5000\tDONE   cov: 815 ft: 2310 corp: 97/3200b lim: 43 exec/s: 2000 rss: 61Mb\n\
                   stat::number_of_executed_units: 5001\n";
        assert_eq!(
            parse_stats(log),
            Stats {
                runs: 5001,
                cov: 815,
                ft: 2310,
                corpus: 97,
                crashed: false
            }
        );
        let crash = "#10\tNEW cov: 3 ft: 3 corp: 2/2b\nthread '<unnamed>' panicked at core/src/x.rs:1:1:\n==123== ERROR: libFuzzer: deadly signal\n";
        assert!(parse_stats(crash).crashed);
    }
}
