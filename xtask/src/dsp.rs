//! `cargo xtask bench dsp [--batch N]`: the Hexagon DSP co-scheduling report — per-instruction DSP
//! packets of int8 training steps (the digits CNN at batch N, a MobileNet-class model at batch 8)
//! counted under `qemu-hexagon`, CPU times measured here, the switch cost, the predicted step time
//! for all-CPU, all-DSP and the DP's co-scheduled placement (checked against brute force where it
//! can run and an exact shortest path always), and the bytes over the pipe per step without and with
//! a planned DSP space. The model is documented in `frugal_hexagon::cost`.
//!
//! This writes a small TCG plugin ([`PLUGIN_C`]) and compiles it with the host `cc`, as
//! `bench aarch64` does: it counts executed guest instructions (under `qemu-hexagon`, packets) and
//! prints the running count at the skel's per-request markers (`getpid` before each request,
//! `gettid` around each kernel), then runs `hosts/hexagon/examples/dsp_bench.rs` with it.
use std::path::{Path, PathBuf};
use std::process::Command;

/// The counting plugin (QEMU plugin API version 1, QEMU 7.2).
const PLUGIN_C: &str = r#"// Counts executed guest instructions and prints the count at the skel's markers. Written by cargo xtask bench dsp.
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
typedef void (*syscall_cb)(qemu_plugin_id_t, unsigned int, int64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);
extern void qemu_plugin_register_vcpu_syscall_cb(qemu_plugin_id_t, syscall_cb);
extern void qemu_plugin_outs(const char *);
static uint64_t insns;
static void trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &insns, qemu_plugin_tb_n_insns(tb));
}
static void sys(qemu_plugin_id_t id, unsigned int vcpu, int64_t num, uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5, uint64_t a6, uint64_t a7, uint64_t a8) {
    if (num == 172 || num == 178) {
        char b[64];
        snprintf(b, sizeof b, "%s %llu\n", num == 172 ? "fhx-mark" : "fhx-kernel", (unsigned long long)insns);
        qemu_plugin_outs(b);
    }
}
__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv) {
    qemu_plugin_register_vcpu_tb_trans_cb(id, trans);
    qemu_plugin_register_vcpu_syscall_cb(id, sys);
    return 0;
}
"#;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

pub fn main(args: &[String]) -> Result<(), String> {
    let mut batch = "32".to_string();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--batch" => batch = it.next().ok_or("--batch needs a value")?.clone(),
            other => return Err(format!("bench dsp: unknown argument {other}")),
        }
    }
    let dir = target_dir().join("xtask-dsp");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let src = dir.join("libfhxcount.c");
    std::fs::write(&src, PLUGIN_C).map_err(|e| format!("{}: {e}", src.display()))?;
    let lib = dir.join("libfhxcount.so");
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .map_err(|e| format!("cc: {e}"))?;
    if !st.success() {
        return Err(format!("cc failed ({st}) building {}", lib.display()));
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .args([
            "run",
            "--release",
            "-q",
            "-p",
            "frugal-hexagon",
            "--example",
            "dsp_bench",
        ])
        .env("FRUGAL_DSP_PLUGIN", &lib)
        .env("FRUGAL_DSP_BATCH", &batch)
        .status()
        .map_err(|e| format!("cargo: {e}"))?;
    if !st.success() {
        return Err(format!("dsp_bench failed ({st})"));
    }
    Ok(())
}
