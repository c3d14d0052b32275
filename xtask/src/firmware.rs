//! `cargo xtask firmware --board netduinoplus2|microbit|mps2-an500 [--precision f32|int8] [--timeout SECS]`: builds
//! `firmware/` for the board in each precision it runs (or the one asked for), runs it in `qemu-system-arm` with `-icount shift=0` (one instruction = 1 ns of virtual time, so
//! SysTick ticks convert to instructions), decodes its defmt log with `defmt-print`, prints it, and
//! checks that the firmware's first 10 losses equal a native run of the very plan baked into the ELF
//! (found in the binary by its `FRGP` frame) on the same stream of samples: bit for bit in int8 (integer
//! arithmetic does not depend on the summation order), within 1e-5 relative in f32. The exit status is
//! the firmware's (0: accuracy and RAM targets met); a loss mismatch fails too.
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use frugal_cli::spec_toml::load_model;
use frugal_core::backend::CpuBackend;
use frugal_core::exec::int8::Int8Executor;
use frugal_core::exec::{Executor, Target};
use frugal_core::format::plan::decode_plan;
use frugal_core::format::{encode_model, unframe};
use frugal_core::graph::Graph;
use frugal_core::model::Precision;
use frugal_core::plan::params::split_state;
use frugal_core::plan::Plan;

#[path = "../../firmware/src/boards.rs"]
#[allow(dead_code)]
pub(crate) mod boards;
#[path = "../../firmware/src/stream.rs"]
#[allow(dead_code)]
mod stream;

/// Steps whose losses the firmware logs one by one and this task compares.
const COMPARED_STEPS: usize = 10;
/// QEMU `-icount` shift: each instruction advances virtual time by 2^shift ns.
const ICOUNT_SHIFT: u32 = 0;

fn usage() -> String {
    "usage: cargo xtask firmware --board netduinoplus2|microbit|mps2-an500 [--precision f32|int8] [--timeout SECS]"
        .into()
}

/// Runs the task.
pub fn main(args: &[String]) -> Result<(), String> {
    let mut board = None;
    let mut precision = None;
    let mut timeout = 600u64;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--board" => {
                let name = it.next().ok_or_else(usage)?;
                board = Some(
                    boards::ALL
                        .into_iter()
                        .find(|b| b.name == name)
                        .ok_or_else(|| format!("unknown board {name:?}; {}", usage()))?,
                );
            }
            "--precision" => {
                let name = it.next().ok_or_else(usage)?;
                precision = Some(
                    [boards::Numerics::F32, boards::Numerics::Int8]
                        .into_iter()
                        .find(|n| n.name() == name)
                        .ok_or_else(|| format!("unknown precision {name:?}; {}", usage()))?,
                );
            }
            "--timeout" => {
                timeout = it.next().and_then(|s| s.parse().ok()).ok_or_else(usage)?;
            }
            _ => return Err(usage()),
        }
    }
    let board = board.ok_or_else(usage)?;
    let runs: Vec<boards::Numerics> = match precision {
        Some(p) if board.numerics.contains(&p) => vec![p],
        Some(p) => {
            return Err(format!(
                "{} does not run in {} (it runs {})",
                board.name,
                p.name(),
                board
                    .numerics
                    .iter()
                    .map(|n| n.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
        None => board.numerics.to_vec(),
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    check_model_file(&root, &board)?;
    let mut failed = Vec::new();
    for n in runs {
        if let Err(e) = run_one(&root, &board, n, timeout) {
            eprintln!("{e}");
            failed.push(n.name());
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "firmware on {} failed in {}",
            board.name,
            failed.join(", ")
        ))
    }
}

/// Builds, runs and checks the firmware for `board` in `n`.
fn run_one(
    root: &Path,
    board: &boards::Board,
    n: boards::Numerics,
    timeout: u64,
) -> Result<(), String> {
    let int8 = n == boards::Numerics::Int8;
    let elf = build(root, board, int8)?;
    let (ok, log) = run_qemu(&elf, board, timeout)?;
    println!("{log}");

    let fw = firmware_losses(&log);
    if !ok && fw.len() < COMPARED_STEPS {
        return Err(format!(
            "firmware on {} failed after logging {} step losses (see the log above)",
            board.name,
            fw.len()
        ));
    }
    let elf_bytes = std::fs::read(&elf).map_err(|e| e.to_string())?;
    let native = native_losses(root, board, &elf_bytes, int8)?;
    compare(&fw, &native, int8)?;
    if !int8 && board.frozen != boards::Frozen::Arena {
        frozen_accuracy(root, board, &elf_bytes)?;
    }
    println!(
        "losses: the firmware's first {COMPARED_STEPS} equal the native run of the same plan ({})",
        if int8 {
            "int8, bit for bit"
        } else {
            "f32, within 1e-5 relative"
        }
    );
    if let Some((ticks, hz)) = ticks_per_step(&log) {
        let insns = ticks as f64 * 1e9 / hz as f64 / f64::from(1u32 << ICOUNT_SHIFT);
        println!(
            "instructions per training step ({} samples): {:.0} (SysTick {ticks} ticks at {hz} Hz under `qemu-system-arm -machine {} -icount shift={ICOUNT_SHIFT}`)",
            board.batch, insns, board.qemu_machine
        );
    }
    if ok {
        println!("firmware on {} in {}: PASS", board.name, n.name());
        Ok(())
    } else {
        Err(format!(
            "firmware on {} in {} exited with failure",
            board.name,
            n.name()
        ))
    }
}

/// The board's binary model must be the conversion of its TOML, when it has one beside it.
fn check_model_file(root: &Path, b: &boards::Board) -> Result<(), String> {
    let frgm = root.join(b.model);
    let toml = frgm.with_extension("toml");
    if !toml.exists() {
        return Ok(());
    }
    let m = load_model(&toml).map_err(|e| format!("{}: {e}", toml.display()))?;
    let have = std::fs::read(&frgm).map_err(|e| format!("{}: {e}", frgm.display()))?;
    if encode_model(&m.spec) != have {
        return Err(format!(
            "{} is stale: run `frugal convert {} -o {}`",
            frgm.display(),
            toml.display(),
            frgm.display()
        ));
    }
    Ok(())
}

fn build(root: &Path, b: &boards::Board, int8: bool) -> Result<PathBuf, String> {
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let manifest = root.join("firmware/Cargo.toml");
    let manifest = manifest.to_str().ok_or("non-UTF-8 repository path")?;
    // The firmware sits outside the workspace: name the target directory, or cargo would build into
    // firmware/target and the ELF would not be where it is run from.
    let target_arg = target_dir.to_str().ok_or("non-UTF-8 target directory")?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let features = if int8 {
        format!("{},int8", b.name)
    } else {
        b.name.to_string()
    };
    let args = [
        "build",
        "--release",
        "--manifest-path",
        manifest,
        "--target",
        b.target,
        "--features",
        &features,
        "--target-dir",
        target_arg,
    ];
    eprintln!(
        "\n$ CARGO_PROFILE_RELEASE_OPT_LEVEL={} cargo {}",
        b.opt_level,
        args.join(" ")
    );
    let st = Command::new(cargo)
        .args(args)
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", b.opt_level)
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !st.success() {
        return Err(format!(
            "building the firmware for {} failed ({st})",
            b.name
        ));
    }
    Ok(target_dir.join(b.target).join("release/frugal-firmware"))
}

/// Runs the ELF in QEMU, returns (exit status 0, decoded log).
fn run_qemu(elf: &Path, b: &boards::Board, timeout: u64) -> Result<(bool, String), String> {
    let shift = format!("shift={ICOUNT_SHIFT}");
    let mut args: Vec<&str> = vec![
        "-machine",
        b.qemu_machine,
        "-cpu",
        b.qemu_cpu,
        "-nographic",
        "-monitor",
        "none",
        "-semihosting-config",
        "enable=on,target=native",
        "-icount",
        &shift,
        "-kernel",
    ];
    let elf_s = elf.to_str().ok_or("non-UTF-8 ELF path")?;
    args.push(elf_s);
    eprintln!("\n$ qemu-system-arm {}", args.join(" "));
    let mut child = Command::new("qemu-system-arm")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!(
                "cannot run qemu-system-arm ({e}); install it: apt-get install -y qemu-system-arm"
            )
        })?;
    let mut out = child.stdout.take().ok_or("no QEMU stdout")?;
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out.read_to_end(&mut buf);
        buf
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(s);
        }
        if start.elapsed() > Duration::from_secs(timeout) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let raw = reader.join().map_err(|_| "QEMU reader thread panicked")?;
    let log = decode_defmt(elf_s, &raw)?;
    match status {
        None => Err(format!("{log}\nQEMU timed out after {timeout} s")),
        Some(s) => Ok((s.success(), log)),
    }
}

fn decode_defmt(elf: &str, raw: &[u8]) -> Result<String, String> {
    let mut p = Command::new("defmt-print")
        .args(["-e", elf])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run defmt-print ({e}); `cargo xtask setup` installs it"))?;
    p.stdin
        .take()
        .ok_or("no defmt-print stdin")?
        .write_all(raw)
        .map_err(|e| e.to_string())?;
    let o = p.wait_with_output().map_err(|e| e.to_string())?;
    let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&o.stderr));
    Ok(s)
}

/// `step N loss L bits 0xB ticks T` lines: the loss of step N, exactly (from its bits).
fn firmware_losses(log: &str) -> Vec<(usize, f32)> {
    log.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let i = w.iter().position(|&t| t == "step")?;
            if w.get(i + 2) != Some(&"loss") || w.get(i + 4) != Some(&"bits") {
                return None;
            }
            let n = w.get(i + 1)?.parse().ok()?;
            let bits = u32::from_str_radix(w.get(i + 5)?.trim_start_matches("0x"), 16).ok()?;
            Some((n, f32::from_bits(bits)))
        })
        .collect()
}

/// `ticks per training step T at F Hz`.
fn ticks_per_step(log: &str) -> Option<(u64, u64)> {
    let l = log
        .lines()
        .find(|l| l.contains("ticks per training step"))?;
    let w: Vec<&str> = l.split_whitespace().collect();
    let i = w.iter().position(|&t| t == "step")?;
    Some((w.get(i + 1)?.parse().ok()?, w.get(i + 3)?.parse().ok()?))
}

/// The `FRGP` frame in the ELF that decodes (the magic also appears as a constant in the code).
fn baked_plan(elf: &[u8]) -> Result<Plan, String> {
    baked_plan_and_model(elf).map(|p| p.1)
}

/// The baked plan and its model.
fn baked_plan_and_model(elf: &[u8]) -> Result<(frugal_core::model::ModelSpec, Plan), String> {
    let mut at = 0;
    while let Some(p) = elf[at..].windows(4).position(|w| w == b"FRGP") {
        let pos = at + p;
        at = pos + 1;
        let Some(len) = elf.get(pos + 8..pos + 12) else {
            continue;
        };
        let len = u32::from_le_bytes(len.try_into().unwrap()) as usize;
        let Some(frame) = elf.get(pos..pos + 16 + len) else {
            continue;
        };
        if let Ok(p) = decode_plan(frame) {
            return Ok(p);
        }
    }
    Err("no decodable FRGP plan in the firmware ELF".into())
}

fn idx_body(path: &Path, header: usize) -> Result<Vec<u8>, String> {
    let b = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    b.get(header..)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| format!("{}: shorter than its header", path.display()))
}

/// The board's slice of `split` as `firmware/build.rs` bakes it: its classes, relabelled from 0; 8×8
/// images and labels.
fn board_slice(root: &Path, b: &boards::Board, split: &str) -> Result<(Vec<u8>, Vec<u8>), String> {
    let dir = root.join("data/digits");
    let all_images = idx_body(&dir.join(format!("digits-{split}-images.idx")), 16)?;
    let all_labels = idx_body(&dir.join(format!("digits-{split}-labels.idx")), 8)?;
    let px = stream::PIXELS;
    let keep: Vec<usize> = stream::kept(&all_labels, b.classes).collect();
    let images: Vec<u8> = keep
        .iter()
        .flat_map(|&i| all_images[i * px..(i + 1) * px].iter().copied())
        .collect();
    let labels: Vec<u8> = keep.iter().map(|&i| all_labels[i] - b.classes.0).collect();
    Ok((images, labels))
}

/// The board's pretrained state split for `plan` (`plan::params::split_state`): its read-only
/// parameter image and the rest, as `firmware/build.rs` bakes them (both empty without pretraining).
fn pretrained(root: &Path, b: &boards::Board, plan: &Plan) -> Result<(Vec<u8>, Vec<u8>), String> {
    let Some(w) = b.weights else {
        return Ok((Vec::new(), Vec::new()));
    };
    let p = root.join(w);
    let file = std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    let (_, payload) = unframe(crate::mcu::WEIGHTS_MAGIC, 1, &file)
        .map_err(|e| format!("{}: {e}", p.display()))?;
    split_state(plan, payload).map_err(|e| format!("{}: {e}", p.display()))
}

/// Fine-tunes `plan` natively as the firmware does (the board's epochs over its stream, from the
/// pretrained state, frozen parameters from `image`) and returns the held-out accuracy (%).
fn native_accuracy(
    root: &Path,
    b: &boards::Board,
    plan: &Plan,
    image: &[u8],
    rest: &[u8],
) -> Result<f64, String> {
    let (images, labels) = board_slice(root, b, "train")?;
    let (timages, tlabels) = board_slice(root, b, "test")?;
    let px = stream::PIXELS;
    let inp = b.input_len();
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex =
        Executor::with_params(plan, &arena, CpuBackend::new(), image).map_err(|e| e.to_string())?;
    ex.init_params(&mut arena, b.seed)
        .map_err(|e| e.to_string())?;
    ex.write_state(&mut arena, rest)
        .map_err(|e| e.to_string())?;
    let mut x = vec![0f32; b.batch * inp];
    let mut y = vec![0u32; b.batch];
    let steps = stream::steps_per_epoch(b.n_train, b.batch);
    for s in 0..b.epochs * steps {
        for j in 0..b.batch {
            let i = stream::sample_at(s * b.batch + j, b.n_train);
            stream::input(
                &images[i * px..(i + 1) * px],
                b.upscale,
                &mut x[j * inp..(j + 1) * inp],
            );
            y[j] = u32::from(labels[i]);
        }
        ex.train_step(&mut arena, &x, Target::Classes(&y))
            .map_err(|e| e.to_string())?;
    }
    let mut right = 0;
    let mb = plan.graph.batch;
    let mut i = 0;
    while i < b.n_test {
        let n = mb.min(b.n_test - i);
        for j in 0..n {
            stream::input(
                &timages[(i + j) * px..(i + j + 1) * px],
                b.upscale,
                &mut x[j * inp..(j + 1) * inp],
            );
            y[j] = u32::from(tlabels[i + j]);
        }
        right += ex
            .evaluate(&mut arena, &x[..n * inp], Target::Classes(&y[..n]))
            .map_err(|e| e.to_string())?
            .correct;
        i += n;
    }
    Ok(right as f64 * 100.0 / b.n_test as f64)
}

/// Frozen parameters in flash: the held-out accuracy of the firmware's plan (its parameter image) and
/// of the same model with every parameter f32 in the arena (the plain plan, the pretrained state
/// copied in), both fine-tuned natively as the firmware runs. int8 frozen weights may cost at most 2
/// points (about 1 pt is the aim; 170 held-out samples make a point 1.7 samples).
fn frozen_accuracy(root: &Path, b: &boards::Board, elf: &[u8]) -> Result<(), String> {
    let (spec, baked) = baked_plan_and_model(elf)?;
    let (image, rest) = pretrained(root, b, &baked)?;
    let flash = native_accuracy(root, b, &baked, &image, &rest)?;
    let plain = Plan::new(Graph::new(&spec, b.batch).map_err(|e| e.to_string())?);
    let (_, all) = pretrained(root, b, &plain)?;
    let arena = native_accuracy(root, b, &plain, &[], &all)?;
    let (enc, bytes) = baked
        .params_space()
        .ok_or("the baked plan has no parameter image")?;
    println!(
        "held-out accuracy after {} epochs (native, the firmware's schedule): {flash:.1} % with the frozen parameters in a {bytes} B {enc:?} image (arena {} B); {arena:.1} % with every parameter f32 in the arena (arena {} B)",
        b.epochs, baked.arena_bytes, plain.arena_bytes
    );
    if flash + 2.0 < arena {
        return Err(format!(
            "the frozen parameters' image costs {:.1} points of held-out accuracy (at most 2)",
            arena - flash
        ));
    }
    Ok(())
}

/// The native executor of the baked plan's precision.
enum Native<'p> {
    F32(Executor<'p>),
    Int8(Box<Int8Executor<'p>>),
}

/// The first steps natively: the plan baked into `elf`, the same initialisation seed and the same stream.
fn native_losses(
    root: &Path,
    b: &boards::Board,
    elf: &[u8],
    int8: bool,
) -> Result<Vec<f32>, String> {
    let plan = baked_plan(elf)?;
    if (plan.graph.precision != Precision::F32) != int8 {
        return Err(format!(
            "the plan baked into the firmware is {:?}, not the precision built",
            plan.graph.precision
        ));
    }
    let (images, labels) = board_slice(root, b, "train")?;
    let px = stream::PIXELS;
    let (image, rest) = if int8 {
        (Vec::new(), Vec::new())
    } else {
        pretrained(root, b, &plan)?
    };
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = if int8 {
        let mut e = Int8Executor::new(&plan, &arena).map_err(|e| e.to_string())?;
        e.init_params(&mut arena, b.seed)
            .map_err(|e| e.to_string())?;
        Native::Int8(Box::new(e))
    } else {
        let mut e = Executor::with_params(&plan, &arena, CpuBackend::new(), &image)
            .map_err(|e| e.to_string())?;
        e.init_params(&mut arena, b.seed)
            .map_err(|e| e.to_string())?;
        if b.weights.is_some() {
            e.write_state(&mut arena, &rest)
                .map_err(|e| format!("pretrained weights: {e}"))?;
        }
        Native::F32(e)
    };
    let inp = b.input_len();
    let mut x = vec![0f32; b.batch * inp];
    let mut y = vec![0u32; b.batch];
    let mut out = Vec::new();
    for s in 0..COMPARED_STEPS {
        for j in 0..b.batch {
            let i = stream::sample_at(s * b.batch + j, b.n_train);
            stream::input(
                &images[i * px..(i + 1) * px],
                b.upscale,
                &mut x[j * inp..(j + 1) * inp],
            );
            y[j] = u32::from(labels[i]);
        }
        let st = match &mut ex {
            Native::Int8(e) => e.train_step(&mut arena, &x, Target::Classes(&y)),
            Native::F32(e) => e.train_step(&mut arena, &x, Target::Classes(&y)),
        }
        .map_err(|e| e.to_string())?;
        out.push(st.loss);
    }
    Ok(out)
}

/// Checks the firmware's losses against the native ones: bit for bit when `exact` (int8), else within
/// 1e-5 relative.
fn compare(fw: &[(usize, f32)], native: &[f32], exact: bool) -> Result<(), String> {
    if fw.len() < COMPARED_STEPS {
        return Err(format!(
            "the firmware logged {} step losses, want {COMPARED_STEPS}",
            fw.len()
        ));
    }
    println!("step  firmware loss   native loss     relative difference");
    let mut bad = Vec::new();
    for (i, &want) in native.iter().enumerate() {
        let (n, got) = fw[i];
        // f32: the firmware runs the portable kernels with Cortex-M rounding, natively the SIMD kernel
        // chosen at run time sums in another order: f32 losses agree to 1e-5 relative, not bit for bit.
        // int8: every product and sum is an exact integer and the float steps (loss, rescale factors)
        // are the same IEEE operations in the same order, so the losses must be identical bits.
        let rel = (got - want).abs() / want.abs().max(f32::MIN_POSITIVE);
        println!("{n:>4}  {got:<14} {want:<14} {rel:.2e}");
        // (A NaN difference fails: `is_some_and` is false for it.)
        let same = if exact {
            got.to_bits() == want.to_bits()
        } else {
            rel.partial_cmp(&1e-5).is_some_and(|o| o.is_le())
        };
        if n != i || !same {
            bad.push(i);
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "firmware losses differ from the native run at steps {bad:?}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "INFO  step 0 loss 2.2807765 bits 0x4011f83e ticks 318420\n\
                       INFO  step 1 loss 2.394706 bits 0x401942dd ticks 318640\n\
                       INFO  ticks per training step 339046 at 168000000 Hz core clock; RAM: ...\n";

    #[test]
    fn losses_are_read_exactly_from_their_bits() {
        let l = firmware_losses(LOG);
        assert_eq!(l.len(), 2);
        assert_eq!(l[0], (0, f32::from_bits(0x4011_f83e)));
        assert_eq!(l[1].1.to_bits(), 0x4019_42dd);
        assert_eq!(ticks_per_step(LOG), Some((339_046, 168_000_000)));
    }

    #[test]
    fn compare_rejects_a_loss_off_by_more_than_1e5_relative() {
        let native: Vec<f32> = (0..COMPARED_STEPS).map(|i| 2.0 + i as f32 * 0.01).collect();
        let same: Vec<(usize, f32)> = native.iter().copied().enumerate().collect();
        assert!(compare(&same, &native, false).is_ok());
        assert!(compare(&same, &native, true).is_ok());
        let mut off = same.clone();
        off[3].1 *= 1.0 + 2e-5;
        assert!(compare(&off, &native, false).is_err());
        let mut nan = same.clone();
        nan[5].1 = f32::NAN;
        assert!(compare(&nan, &native, false).is_err());
        assert!(compare(&nan, &native, true).is_err());
        assert!(compare(&same[..COMPARED_STEPS - 1], &native, false).is_err());
        // int8 is bit for bit: one unit in the last place fails it, though f32 would accept it.
        let mut ulp = same.clone();
        ulp[7].1 = f32::from_bits(ulp[7].1.to_bits() + 1);
        assert!(compare(&ulp, &native, false).is_ok());
        assert!(compare(&ulp, &native, true).is_err());
    }

    #[test]
    fn a_board_keeps_its_classes_and_upscales_by_nearest() {
        let labels = [7u8, 3, 5, 9, 0, 6];
        let kept: Vec<usize> = stream::kept(&labels, (5, 5)).collect();
        assert_eq!(kept, [0, 2, 3, 5]);
        assert_eq!(stream::kept(&labels, (0, 10)).count(), labels.len());
        let px: Vec<u8> = (0..64).map(|i| (i % 17) as u8).collect();
        let mut one = [0f32; 64];
        stream::input(&px, 1, &mut one);
        assert!(one.iter().zip(&px).all(|(&a, &p)| a == stream::pixel(p)));
        let mut two = [0f32; 256];
        stream::input(&px, 2, &mut two);
        for r in 0..16 {
            for c in 0..16 {
                assert_eq!(two[r * 16 + c], one[(r / 2) * 8 + c / 2], "({r}, {c})");
            }
        }
        assert_eq!(boards::MPS2_AN500.input_len(), 256);
    }

    #[test]
    fn the_stream_is_a_permutation_of_the_slice_each_epoch() {
        for n in [1000usize, 1437] {
            let mut seen = vec![false; n];
            for k in n..2 * n {
                seen[stream::sample_at(k, n)] = true;
            }
            assert!(seen.iter().all(|&s| s), "n = {n}");
        }
    }
}
