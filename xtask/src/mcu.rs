//! `cargo xtask mcu-pretrain`: the host half of the Cortex-M7 transfer-learning run (board
//! `mps2-an500`). Pretrains `examples/mcu-mbv2.toml` (every layer, Adam, as `bench sparse` does) on
//! digits 0–4 upscaled to 16×16, scores its layers and channels for digits 5–9
//! (`exec::importance::gradient_importance`, 4 batches of the new task), lets the selection policy
//! (`policy::sparse::select`) pick the update that fits the board's arena at its batch, and writes what
//! the firmware embeds:
//! - `firmware/models/mcu-mbv2-ft.frgm`: the model with that update (frozen layers, channel subsets, …);
//! - `firmware/models/mcu-mbv2-pretrained.frgw`: the pretrained persistent tensors (parameters and
//!   BatchNorm statistics) as little-endian f32 in `Executor::state_tensors` order, in an `FRGW` frame
//!   (`format::frame`, CRC-checked). The firmware's build splits it (`plan::params::split_state`) into
//!   the read-only parameter image of the frozen tensors (int8 weights quantised there), read from
//!   flash, and the trained tensors, copied into its arena at boot (`Executor::write_state`).
//!
//! Deterministic (fixed seeds, one thread): rerunning it rewrites the same bytes.
use std::path::Path;

use frugal_cli::data::digits;
use frugal_cli::spec_toml::load_model;
use frugal_core::exec::Executor;
use frugal_core::format::{encode_model, frame};
use frugal_core::graph::Graph;
use frugal_core::model::OptimizerSpec;
use frugal_core::plan::Plan;
use frugal_core::policy::sparse::{self, SparseBudget};

use crate::sparse::{describe, importance, task, train, PRETRAIN_EPOCHS};

use crate::firmware::boards;

/// Magic of the pretrained-weights frame (`firmware/build.rs` reads it).
pub const WEIGHTS_MAGIC: [u8; 4] = *b"FRGW";

pub fn main(_args: &[String]) -> Result<(), String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let b = boards::MPS2_AN500;
    let base = load_model(&root.join("examples/mcu-mbv2.toml"))
        .map_err(|e| e.to_string())?
        .spec;
    let (train_set, test_set) = digits();
    let (ax, ay) = task(&train_set, 0);
    let (atx, aty) = task(&test_set, 0);
    let (bx, by) = task(&train_set, u32::from(b.classes.0));

    let mut pre = base.clone();
    pre.optimizer = OptimizerSpec::Adam {
        lr: 3e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    let (r, pretrained) = train(&pre, None, (&ax, &ay), (&atx, &aty), PRETRAIN_EPOCHS, 0)?;
    println!(
        "pretrained {PRETRAIN_EPOCHS} epochs on digits 0–4: {:.1} % on their test digits",
        r.acc
    );

    // The update: the selection policy's pick for the board's arena at its batch.
    let imp = importance(&base, &pretrained, (&bx, &by))?;
    let full = Plan::new(Graph::new(&base, b.batch).map_err(|e| e.to_string())?);
    let flops = sparse::backward_flops(&full.graph);
    let budget = SparseBudget {
        arena_bytes: b.arena,
        backward_flops: flops,
    };
    let choices = sparse::select(&base, b.batch, &imp, budget)
        .map_err(|e| format!("no update fits {} B at batch {}: {e:?}", b.arena, b.batch))?;
    let ft = sparse::apply(&base, &choices);
    let plan = Plan::new(Graph::new(&ft, b.batch).map_err(|e| e.to_string())?);
    println!(
        "update for {} (arena {} B, batch {}): {}; arena {} B (the full update's: {} B)",
        b.name,
        b.arena,
        b.batch,
        describe(&base, &choices),
        plan.needed_bytes(),
        full.needed_bytes()
    );

    for (l, c) in base.layers.iter().zip(&choices) {
        if let Some(u) = c {
            println!("  {}: {u:?}", l.name);
        }
    }
    // What the arena holds of the pretrained state that the update never writes: frozen parameters
    // and the BatchNorm statistics of frozen (evaluation-mode) layers. It could stay in flash.
    let (mut frozen, mut updated) = (0usize, 0usize);
    for n in &plan.graph.nodes {
        for p in &n.params {
            let numel: usize = p.shape.iter().product();
            frozen += (numel - p.updated) * 4;
            updated += p.updated * 4;
        }
        // A trained BatchNorm updates its running statistics; a frozen one only reads them.
        let stats: usize = n
            .stats
            .iter()
            .map(|&t| plan.graph.tensors[t as usize].bytes)
            .sum();
        if n.params.iter().any(|p| p.updated > 0) {
            updated += stats;
        } else {
            frozen += stats;
        }
    }
    println!(
        "state in the arena: {} B never written by the update (frozen parameters, BatchNorm statistics), {updated} B of updated parameters and statistics",
        frozen
    );
    // The pretrained state in the fine-tuning plan's order.
    let arena = vec![0u8; plan.needed_bytes()];
    let ex = Executor::new(&plan, &arena).map_err(|e| e.to_string())?;
    let mut payload = Vec::new();
    for (name, shape, _) in ex.state_tensors() {
        let v = pretrained
            .get(&name)
            .ok_or_else(|| format!("pretraining left no tensor {name:?}"))?;
        if v.len() != shape.iter().product::<usize>() {
            return Err(format!("{name}: {} values, shape {shape:?}", v.len()));
        }
        payload.extend(v.iter().flat_map(|x| x.to_le_bytes()));
    }
    let model = root.join(b.model);
    let weights = root.join(b.weights.ok_or("the board has no weights file")?);
    std::fs::write(&model, encode_model(&ft)).map_err(|e| format!("{}: {e}", model.display()))?;
    std::fs::write(&weights, frame(WEIGHTS_MAGIC, 1, &payload))
        .map_err(|e| format!("{}: {e}", weights.display()))?;
    println!(
        "wrote {} and {} ({} B of f32 state)",
        model.display(),
        weights.display(),
        payload.len()
    );
    Ok(())
}
