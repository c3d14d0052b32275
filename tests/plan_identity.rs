//! The planner's choices, pinned: for every example model and benchmark workload, every policy at a
//! ladder of budgets (plus swapping, fp16 storage and offloading), the plan chosen must be exactly the
//! one recorded in `golden/plans.txt` — its file encoding (program, offsets, arena, strategy, spaces;
//! lifetimes follow from the program) hashed, beside its arena size and length to read a difference by.
//! A refactoring of the planner or the policies must leave every line as it is; a change that means to
//! change plans regenerates the file (`FRUGAL_BLESS=1 cargo test -p frugal-tests --test plan_identity`)
//! and says why in its commit.
use std::fmt::Write as _;
use std::path::PathBuf;

use frugal_cli::{spec_toml::load_model, workloads};
use frugal_core::budget::Budget;
use frugal_core::format::encode_plan;
use frugal_core::graph::Graph;
use frugal_core::model::ModelSpec;
use frugal_core::plan::{Plan, SpaceId, ALIGN};
use frugal_core::policy::{
    self, half::f16_storage, spaces::offload, swap::plan_swap, CostModel, PolicyKind,
};

/// FNV-1a, 64 bits: a fingerprint of the encoded plan (not a checksum against tampering).
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

fn describe(spec: &ModelSpec, p: &Plan) -> String {
    format!(
        "x{} arena {} instrs {} {:016x}",
        p.micro_batches,
        p.arena_bytes,
        p.program.len(),
        fnv(&encode_plan(spec, p))
    )
}

/// Every line for one model at one batch.
fn lines(out: &mut String, name: &str, spec: &ModelSpec, batch: usize) {
    let g = Graph::new(spec, batch).unwrap();
    let cost = CostModel::estimate(&g);
    let plain = Plan::new(g.clone());
    let need = plain.needed_bytes();
    let min = policy::min_budget(spec, batch, &cost).unwrap();
    let budgets = [
        ("plain", need),
        ("3/4", need * 3 / 4),
        ("1/2", need / 2),
        ("1/4", need / 4),
        ("min", min),
    ];
    let kinds = [
        PolicyKind::Auto,
        PolicyKind::MicroBatch,
        PolicyKind::Recompute,
        PolicyKind::Hybrid,
        PolicyKind::RecomputeFirst,
    ];
    for (label, b) in budgets {
        for k in kinds {
            let r = match policy::plan_for_budget(spec, batch, Budget::new(b), k, &cost) {
                Ok(c) => format!("{} {}", c.policy.name(), describe(spec, &c.plan)),
                Err(e) => format!("refused: {e}"),
            };
            writeln!(out, "{name} b{batch} {} {label}: {r}", k.name()).unwrap();
        }
    }
    // The policies outside plan_for_budget: swapping (its best effort when it does not fit), fp16
    // storage, and saved activations offloaded to another memory space.
    for (label, b) in [("1/2", need / 2), ("min", min)] {
        let (Ok(p) | Err(p)) = plan_swap(&g, 3, b);
        writeln!(out, "{name} b{batch} swap {label}: {}", describe(spec, &p)).unwrap();
    }
    let p = f16_storage(&g);
    writeln!(out, "{name} b{batch} f16: {}", describe(spec, &p)).unwrap();
    let p = offload(&g, SpaceId(1), 4 * ALIGN, |_, _| true);
    writeln!(out, "{name} b{batch} offload: {}", describe(spec, &p)).unwrap();
}

#[test]
fn plans_are_the_recorded_ones() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut out = String::new();
    // The examples pinned when the file was written (the deep ones added since, e.g. mobilenetv2,
    // take minutes to search a minimum budget for: they have tests of their own).
    let examples: Vec<PathBuf> = ["digits-cnn", "digits-mlp", "residual-bn", "transfer"]
        .iter()
        .map(|n| root.join(format!("../examples/{n}.toml")))
        .collect();
    for path in &examples {
        let m = load_model(path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy();
        lines(&mut out, &name, &m.spec, 32);
    }
    for w in workloads::all() {
        // The workloads' own batches up to 128 (fc3's 2048 plans for seconds; its 64 has the same
        // layers and policies).
        let batch = w.batches[0].min(128);
        lines(&mut out, w.id, &w.spec, batch);
    }
    let file = root.join("golden/plans.txt");
    if std::env::var_os("FRUGAL_BLESS").is_some() {
        std::fs::write(&file, &out).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&file).expect(
        "tests/golden/plans.txt: generate it with FRUGAL_BLESS=1 cargo test -p frugal-tests \
         --test plan_identity",
    );
    let diff: Vec<String> = want
        .lines()
        .zip(out.lines())
        .filter(|(a, b)| a != b)
        .map(|(a, b)| format!("  recorded: {a}\n  now:      {b}"))
        .collect();
    assert!(
        diff.is_empty() && want.lines().count() == out.lines().count(),
        "{} of {} plans differ from tests/golden/plans.txt ({} lines recorded, {} now):\n{}",
        diff.len(),
        out.lines().count(),
        want.lines().count(),
        out.lines().count(),
        diff.join("\n")
    );
}

/// The recurrent layers' plans, pinned like the others (the golden `lstm` and `gru` models, two stacked
/// layers each, 12 time steps: every step one forward and one backward instruction, each step's saved
/// tensors their own storages), in a file of their own (`golden/plans_rnn.txt`, regenerated the same
/// way) so that a change to them reads apart from the rest.
#[test]
fn recurrent_plans_are_the_recorded_ones() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut out = String::new();
    for case in ["lstm", "gru"] {
        let m = load_model(&root.join(format!("golden/{case}.toml"))).unwrap();
        lines(&mut out, case, &m.spec, 8);
    }
    let file = root.join("golden/plans_rnn.txt");
    if std::env::var_os("FRUGAL_BLESS").is_some() {
        std::fs::write(&file, &out).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&file).expect(
        "tests/golden/plans_rnn.txt: generate it with FRUGAL_BLESS=1 cargo test -p frugal-tests \
         --test plan_identity",
    );
    assert_eq!(
        want, out,
        "the recurrent plans differ from tests/golden/plans_rnn.txt"
    );
}
