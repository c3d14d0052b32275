//! Host side of the firmware build: plans the board's model for its budget with `frugal-core` and bakes
//! the binary plan (`FRGP`, which embeds the `FRGM` model), the digits slices and `memory.x` into the build.
use std::fs;
use std::path::{Path, PathBuf};

use frugal_core::format::plan::encode_plan;
use frugal_core::format::{decode_model, unframe};
use frugal_core::graph::{Graph, GraphOptions};
use frugal_core::kernels::int8::KernelFamily;
use frugal_core::model::{Int8Update, Precision};
use frugal_core::plan::params::{read_only_tensors, split_state, ParamEncoding};
use frugal_core::plan::{Plan, ALIGN};
use frugal_core::policy::{plan_for_budget, CostModel, PolicyKind};
use frugal_core::Budget;

#[path = "src/boards.rs"]
#[allow(dead_code)]
mod boards;
#[path = "src/stream.rs"]
#[allow(dead_code)]
mod stream;

/// Magic of the pretrained-weights frame (`cargo xtask mcu-pretrain`).
const WEIGHTS_MAGIC: [u8; 4] = *b"FRGW";

fn board() -> boards::Board {
    let on = |f: &str| {
        std::env::var_os(format!(
            "CARGO_FEATURE_{}",
            f.to_uppercase().replace('-', "_")
        ))
        .is_some()
    };
    let chosen: Vec<boards::Board> = boards::ALL.into_iter().filter(|b| on(b.name)).collect();
    match chosen.as_slice() {
        [b] => *b,
        _ => panic!(
            "frugal-firmware: enable exactly one board feature ({}); use `cargo xtask firmware --board NAME`",
            boards::ALL.map(|b| b.name).join(", ")
        ),
    }
}

/// The data part of an IDX file after checking its magic and dimensions.
fn idx<'a>(bytes: &'a [u8], magic: u32, dims: &[u32], file: &str) -> &'a [u8] {
    let rank = dims.len();
    let head = 4 + 4 * rank;
    assert!(bytes.len() >= head, "{file}: shorter than its header");
    let m = u32::from_be_bytes(bytes[0..4].try_into().unwrap());
    assert_eq!(m, magic, "{file}: magic");
    for (i, &d) in dims.iter().enumerate() {
        let got = u32::from_be_bytes(bytes[4 + 4 * i..8 + 4 * i].try_into().unwrap());
        // The first dimension (samples) may be anything; the others must match.
        assert!(
            i == 0 || got == d,
            "{file}: dimension {i} is {got}, want {d}"
        );
    }
    &bytes[head..]
}

/// The first `n` samples the board keeps of `split` (its classes, relabelled from 0), 8×8 each, as
/// `{split}_images.bin` / `{split}_labels.bin` for the firmware to embed.
fn slice(root: &Path, b: &boards::Board, split: &str, n: usize, out: &Path) {
    let dir = root.join("data/digits");
    let ip = dir.join(format!("digits-{split}-images.idx"));
    let lp = dir.join(format!("digits-{split}-labels.idx"));
    println!("cargo:rerun-if-changed={}", ip.display());
    println!("cargo:rerun-if-changed={}", lp.display());
    let ib = fs::read(&ip).expect("bundled digits images");
    let lb = fs::read(&lp).expect("bundled digits labels");
    let images = idx(&ib, 0x803, &[0, 8, 8], &ip.display().to_string());
    let labels = idx(&lb, 0x801, &[0], &lp.display().to_string());
    assert!(
        images.len() >= labels.len() * stream::PIXELS,
        "{split}: fewer images than labels"
    );
    assert!(labels.iter().all(|&l| l < 10), "{split}: label ≥ 10");
    let keep: Vec<usize> = stream::kept(labels, b.classes).take(n).collect();
    assert!(
        keep.len() == n,
        "{split}: fewer than {n} samples of the board's classes"
    );
    let px = stream::PIXELS;
    let x: Vec<u8> = keep
        .iter()
        .flat_map(|&i| images[i * px..(i + 1) * px].iter().copied())
        .collect();
    let y: Vec<u8> = keep.iter().map(|&i| labels[i] - b.classes.0).collect();
    fs::write(out.join(format!("{split}_images.bin")), x).unwrap();
    fs::write(out.join(format!("{split}_labels.bin")), y).unwrap();
}

/// The board's pretrained persistent tensors as the firmware loads them: checked against the plan's
/// state size and split (`plan::params::split_state`) into the read-only parameter image
/// (`params.bin`, the frozen tensors; int8 weights quantised here, on the host) and the rest of the
/// state (`weights.bin`, for `Executor::write_state`); both empty without pretraining.
fn weights(root: &Path, b: &boards::Board, plan: &Plan, out: &Path) {
    let (image, bytes) = match b.weights {
        None => (Vec::new(), Vec::new()),
        Some(w) => {
            let p = root.join(w);
            println!("cargo:rerun-if-changed={}", p.display());
            let file = fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let (_, payload) =
                unframe(WEIGHTS_MAGIC, 1, &file).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let want: usize = plan
                .graph
                .nodes
                .iter()
                .flat_map(|n| {
                    n.params
                        .iter()
                        .map(|p| p.value)
                        .chain(n.stats.iter().copied())
                })
                .map(|t| plan.graph.tensors[t as usize].bytes)
                .sum();
            assert_eq!(
                payload.len(),
                want,
                "{}: {} B of state, the plan of {} holds {want} B (rerun `cargo xtask mcu-pretrain`)",
                p.display(),
                payload.len(),
                b.model
            );
            split_state(plan, payload).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        }
    };
    assert!(
        plan.params_space().is_none() || !image.is_empty(),
        "{}: frozen parameters in flash need pretrained weights",
        b.name
    );
    fs::write(out.join("params.bin"), image).unwrap();
    fs::write(out.join("weights.bin"), bytes).unwrap();
}

fn main() {
    let b = board();
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("..");
    println!("cargo:rerun-if-changed=src/boards.rs");
    println!("cargo:rerun-if-changed=src/stream.rs");

    // The plan: the board's model at its batch, planned for its budget (the arena's size).
    let model_path = root.join(b.model);
    println!("cargo:rerun-if-changed={}", model_path.display());
    let bytes = fs::read(&model_path).unwrap_or_else(|e| panic!("{}: {e}", model_path.display()));
    let spec = decode_model(&bytes).unwrap_or_else(|e| panic!("{}: {e}", model_path.display()));
    let int8 = std::env::var_os("CARGO_FEATURE_INT8").is_some();
    let plan = if int8 {
        // int8: the plain plan of the int8 graph (the executor runs one micro-batch per step).
        let update = match b.int8_update_bits {
            0 => Int8Update::FloatMaster,
            bits => Int8Update::Integer { update_bits: bits },
        };
        // Cortex-M runs the portable int8 kernel (no SIMD kernel exists for thumb targets): size the
        // GEMM scratch for it alone instead of reserving AVX2's and VNNI's packing. The board may
        // accumulate Linear weight gradients in tiles.
        let options = GraphOptions {
            precision: Precision::Int8(update),
            kernels: KernelFamily::Portable,
            grad_tile: b.int8_grad_tile,
            names: true,
            threads: 1,
            attn_recompute: false,
        };
        let g = Graph::with_options(&spec, b.batch, options)
            .unwrap_or_else(|e| panic!("{} in int8: {e}", b.model));
        let plan = Plan::new(g);
        let budget = b.arena_for(boards::Numerics::Int8);
        // The static arena is 64-byte aligned, so it needs `arena_bytes`, without the slack
        // `needed_bytes` keeps for an arena of any alignment.
        assert!(
            plan.arena_bytes <= budget,
            "{} in int8 needs {} B, more than the {budget} B arena of {}",
            b.model,
            plan.arena_bytes,
            b.name
        );
        plan
    } else {
        let g = Graph::new(&spec, b.batch).unwrap_or_else(|e| panic!("{}: {e}", b.model));
        let enc = match b.frozen {
            boards::Frozen::Arena => None,
            boards::Frozen::FlashF32 => Some(ParamEncoding::F32),
            boards::Frozen::FlashInt8 => Some(ParamEncoding::Int8),
        };
        // Frozen parameters read from flash leave the arena by exactly their (aligned) bytes: plan
        // for the arena plus them, then move them out.
        let frozen: usize = match enc {
            None => 0,
            Some(_) => read_only_tensors(&g)
                .map(|t| g.tensors[t as usize].bytes.div_ceil(ALIGN) * ALIGN)
                .sum(),
        };
        let mut plan = plan_for_budget(
            &spec,
            b.batch,
            Budget {
                bytes: b.arena + frozen,
            },
            PolicyKind::Auto,
            &CostModel::estimate(&g),
        )
        .unwrap_or_else(|e| panic!("{} does not fit {} B on {}: {e}", b.model, b.arena, b.name))
        .plan;
        if let Some(enc) = enc {
            plan.read_only_params(enc)
                .unwrap_or_else(|e| panic!("{} on {}: {e}", b.model, b.name));
            assert!(
                plan.arena_bytes <= b.arena,
                "{} needs {} B of arena with its frozen parameters in flash, more than the {} B of {}",
                b.model,
                plan.arena_bytes,
                b.arena,
                b.name
            );
        }
        plan
    };
    fs::write(out.join("plan.frgp"), encode_plan(&spec, &plan)).unwrap();

    weights(&root, &b, &plan, &out);
    slice(&root, &b, "train", b.n_train, &out);
    slice(&root, &b, "test", b.n_test, &out);

    // Linker scripts: cortex-m-rt's link.x reads memory.x; defmt's defmt.x places the log strings.
    let memory = format!(
        "MEMORY\n{{\n  FLASH : ORIGIN = {:#010x}, LENGTH = {}\n  RAM : ORIGIN = {:#010x}, LENGTH = {}\n}}\n",
        b.flash.0, b.flash.1, b.ram.0, b.ram.1
    );
    fs::write(out.join("memory.x"), memory).unwrap();
    println!("cargo:rustc-link-search={}", out.display());
    // defmt keeps only errors unless DEFMT_LOG says otherwise; the run's log is its report.
    println!("cargo:rerun-if-env-changed=DEFMT_LOG");
    if std::env::var_os("DEFMT_LOG").is_none() {
        println!("cargo:rustc-env=DEFMT_LOG=info");
    }
    if std::env::var("TARGET").is_ok_and(|t| t.starts_with("thumb")) {
        println!("cargo:rustc-link-arg-bins=-Tlink.x");
        println!("cargo:rustc-link-arg-bins=-Tdefmt.x");
    }
}
