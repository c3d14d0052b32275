//! The planner's layout is within 5% of the lower bound (max over execution orders of live bytes) for every
//! example model and every benchmark workload (models with attention also in its recompute mode).
use std::path::PathBuf;

use frugal_cli::{spec_toml::load_model, workloads};
use frugal_core::graph::Graph;
use frugal_core::plan::Plan;
use frugal_core::policy;

fn check(what: &str, p: &Plan) {
    let ratio = p.arena_bytes as f64 / p.lower_bound as f64;
    assert!(
        ratio <= 1.05,
        "{what}: arena {} B is {ratio:.3}× the lower bound {} B ({})",
        p.arena_bytes,
        p.lower_bound,
        p.strategy
    );
}

#[test]
fn examples_plan_within_five_percent_of_the_lower_bound() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "toml") {
            let m = load_model(&path).unwrap();
            for batch in [1, 32, 64, 128] {
                check(
                    &format!("{} b{batch}", path.display()),
                    &Plan::new(Graph::new(&m.spec, batch).unwrap()),
                );
                // Attention in recompute mode: row statistics saved, one tile of scratch.
                if policy::has_attention(&m.spec) {
                    check(
                        &format!("{} b{batch} attention recomputed", path.display()),
                        &Plan::new(policy::graph_in_mode(&m.spec, batch, true).unwrap()),
                    );
                }
            }
            n += 1;
        }
    }
    assert!(n >= 4, "expected the four example models, found {n}");
}

#[test]
fn benchmark_workloads_plan_within_five_percent_of_the_lower_bound() {
    for w in workloads::all() {
        for &b in w.batches {
            check(
                &format!("{} b{b}", w.id),
                &Plan::new(Graph::new(&w.spec, b).unwrap()),
            );
        }
    }
}
