//! `cargo xtask bench aarch64 [--check]`: instructions counted under `qemu-aarch64` (issue 14's figures):
//! SGEMM 512³ instructions per FLOP for the NEON kernel beside the portable kernel as LLVM vectorises it,
//! and the int8 digits-CNN training step's instructions over the f32 step's (batch 64), on `-cpu max`
//! (with `dotprod`: `sdot`) and `-cpu cortex-a53` (ARMv8.0, no `dotprod`). `--check` fails when a target
//! is missed: ≤ 0.16 instructions per FLOP and int8 ÷ f32 ≤ 0.5, on both.
//!
//! How the count is made (repeatable to the instruction):
//! * Debian's QEMU is built with TCG plugin support but ships no plugin, so this writes a 30-line one
//!   ([`PLUGIN_C`], the equivalent of QEMU's `libinsn` in its default inline mode) and compiles it with
//!   the host `cc`: at translation it registers, for every translated block, an inline add of the block's
//!   instruction count to one counter, executed each time the block runs; at exit it prints the counter.
//!   Under `qemu-aarch64` (user mode, one thread) this is the number of guest instructions executed, and
//!   it does not depend on the host, its load or the time.
//! * The workloads are `core/examples/insn_workload.rs`, built for `aarch64-unknown-linux-gnu` (release)
//!   and run `qemu-aarch64 -cpu CPU -L /usr/aarch64-linux-gnu -plugin libinsn.so -d plugin insn_workload
//!   …`. Each runs twice, with `N` and with 0 repetitions; the difference divided by `N` is the count of
//!   one repetition alone (loading, allocation and the warm-up step cancel out).
use std::path::{Path, PathBuf};
use std::process::Command;

/// The instruction-counting TCG plugin (QEMU plugin API version 1, as in QEMU 7.2): only the five
/// functions it calls are declared, with QEMU's signatures.
const PLUGIN_C: &str = r#"// Counts executed guest instructions (QEMU's libinsn, inline mode). Written by cargo xtask bench aarch64.
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
typedef struct qemu_info_t qemu_info_t;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
__attribute__((visibility("default"))) int qemu_plugin_version = 1;
extern void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t, void (*)(qemu_plugin_id_t, struct qemu_plugin_tb *));
extern size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *);
extern void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *, enum qemu_plugin_op, void *, uint64_t);
extern void qemu_plugin_register_atexit_cb(qemu_plugin_id_t, void (*)(qemu_plugin_id_t, void *), void *);
extern void qemu_plugin_outs(const char *);
static uint64_t insns;
static void trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &insns, qemu_plugin_tb_n_insns(tb));
}
static void done(qemu_plugin_id_t id, void *p) {
    char b[64];
    snprintf(b, sizeof b, "insns: %llu\n", (unsigned long long)insns);
    qemu_plugin_outs(b);
}
__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv) {
    qemu_plugin_register_vcpu_tb_trans_cb(id, trans);
    qemu_plugin_register_atexit_cb(id, done, NULL);
    return 0;
}
"#;

/// Issue 14's targets.
const MAX_INSNS_PER_FLOP: f64 = 0.16;
const MAX_INT8_OVER_F32: f64 = 0.5;
/// Repetitions counted (beyond the 0-repetition baseline).
const SGEMM_REPS: u64 = 2;
const STEPS: u64 = 8;
/// FLOPs of one 512³ product.
const SGEMM_FLOP: f64 = 2.0 * 512.0 * 512.0 * 512.0;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

fn run(cmd: &mut Command) -> Result<String, String> {
    eprintln!("$ {cmd:?}");
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

/// Builds the plugin and the workload binary; returns their paths.
fn build() -> Result<(PathBuf, PathBuf), String> {
    let dir = target_dir().join("xtask-insns");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let src = dir.join("libinsn.c");
    std::fs::write(&src, PLUGIN_C).map_err(|e| format!("{}: {e}", src.display()))?;
    let lib = dir.join("libinsn.so");
    run(Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&src))?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(cargo)
        .args([
            "build",
            "--release",
            "-p",
            "frugal-core",
            "--features",
            "std",
            "--example",
            "insn_workload",
            "--target",
            "aarch64-unknown-linux-gnu",
        ])
        .env(
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
            "aarch64-linux-gnu-gcc",
        ))?;
    let bin = target_dir().join("aarch64-unknown-linux-gnu/release/examples/insn_workload");
    Ok((lib, bin))
}

/// Instructions one run of `insn_workload args…` executes on the emulated `cpu`.
fn count(lib: &Path, bin: &Path, cpu: &str, args: &[&str]) -> Result<u64, String> {
    let out = run(Command::new("qemu-aarch64")
        .args(["-cpu", cpu, "-L", "/usr/aarch64-linux-gnu", "-plugin"])
        .arg(lib)
        .args(["-d", "plugin"])
        .arg(bin)
        .args(args))?;
    out.lines()
        .find_map(|l| l.strip_prefix("insns: "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("no instruction count in the output of {args:?}: {out}"))
}

/// Instructions of one repetition: (count with `n` − count with 0) / `n`.
fn per_rep(lib: &Path, bin: &Path, cpu: &str, what: [&str; 2], n: u64) -> Result<f64, String> {
    let ns = n.to_string();
    let full = count(lib, bin, cpu, &[what[0], what[1], &ns])?;
    let base = count(lib, bin, cpu, &[what[0], what[1], "0"])?;
    Ok(full.saturating_sub(base) as f64 / n as f64)
}

pub fn main(args: &[String]) -> Result<(), String> {
    let check = args.iter().any(|a| a == "--check");
    if let Some(a) = args.iter().find(|a| *a != "--check") {
        return Err(format!(
            "`cargo xtask bench aarch64` takes only --check (got `{a}`)"
        ));
    }
    let (lib, bin) = build()?;
    let mut table = String::from(
        "| emulated CPU (int8 kernel) | SGEMM 512³ insns/FLOP, neon | portable (LLVM-vectorised) | f32 step insns | int8 step insns | int8 ÷ f32 |\n|---|---|---|---|---|---|\n",
    );
    let mut missed = Vec::new();
    for (cpu, int8) in [("max", "neon-dotprod"), ("cortex-a53", "neon")] {
        let neon = per_rep(&lib, &bin, cpu, ["sgemm", "neon"], SGEMM_REPS)? / SGEMM_FLOP;
        let portable = per_rep(&lib, &bin, cpu, ["sgemm", "portable"], SGEMM_REPS)? / SGEMM_FLOP;
        let f = per_rep(&lib, &bin, cpu, ["step", "f32"], STEPS)?;
        let i = per_rep(&lib, &bin, cpu, ["step", "int8"], STEPS)?;
        let ratio = i / f;
        table.push_str(&format!(
            "| {cpu} ({int8}) | {neon:.4} | {portable:.4} | {f:.0} | {i:.0} | {ratio:.3} |\n"
        ));
        if neon > MAX_INSNS_PER_FLOP {
            missed.push(format!(
                "{cpu}: SGEMM {neon:.4} insns/FLOP > {MAX_INSNS_PER_FLOP}"
            ));
        }
        if ratio > MAX_INT8_OVER_F32 {
            missed.push(format!(
                "{cpu}: int8 step {ratio:.3} × the f32 step > {MAX_INT8_OVER_F32}"
            ));
        }
    }
    println!("\n{table}");
    println!(
        "Instructions executed under qemu-aarch64 {} (TCG plugin, inline count per translated block), one \
         repetition = (run with N − run with 0) / N; digits CNN (examples/digits-cnn.frgm) at batch 64, f32 \
         with the NEON SGEMM (Adam), int8 pure-integer (update_bits 4). `cargo xtask bench aarch64`.",
        qemu_version()
    );
    if check && !missed.is_empty() {
        return Err(format!("targets missed: {}", missed.join("; ")));
    }
    Ok(())
}

fn qemu_version() -> String {
    Command::new("qemu-aarch64")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_string)
        })
        .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
        .unwrap_or_else(|| "?".into())
}
