//! int8 training on the bundled digits through the driver `frugal train --precision int8[-master]`
//! uses: held-out accuracy close to f32, the int8 arena well below the f32 one, and the rescale
//! counters showing skipped passes.
use std::path::PathBuf;

use frugal_cli::spec_toml::load_model;
use frugal_cli::train::{self, TrainOptions, DEFAULT_UPDATE_BITS};
use frugal_core::budget::Budget;
use frugal_core::graph::Graph;
use frugal_core::model::{Int8Update, Precision};
use frugal_core::plan::Plan;
use frugal_core::quant::Rescale;

fn run(example: &str, precision: Precision, epochs: u32) -> train::Int8Report {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(example);
    let m = load_model(&path).unwrap();
    let (tr, te) = frugal_cli::data::digits();
    let opts = TrainOptions {
        batch: m.train.batch.unwrap_or(32) as usize,
        epochs,
        budget: Budget::UNLIMITED,
        seed: 1,
        progress: false,
        quiet: true,
        policy: frugal_core::policy::PolicyKind::Plain,
        approx: Default::default(),
        threads: 1,
        device: Default::default(),
        frozen: None,
    };
    train::train_int8(
        &m,
        &tr,
        &te,
        &opts,
        precision,
        Rescale::Adaptive,
        None,
        |_, _| {},
    )
    .unwrap()
}

#[test]
fn int8_float_master_mlp_reaches_95_percent_held_out() {
    let r = run(
        "digits-mlp.toml",
        Precision::Int8(Int8Update::FloatMaster),
        15,
    );
    assert!(
        r.report.test_accuracy >= 0.95,
        "int8 float-master MLP held-out accuracy {}",
        r.report.test_accuracy
    );
    // Self-adaptive rescaling skips most exact passes after the first epoch.
    let later = r.per_epoch[1..].iter().fold(
        Default::default(),
        |mut a: frugal_core::quant::RescaleCounts, c| {
            a.add(c);
            a
        },
    );
    assert!(later.skipped_fraction() >= 0.5, "{later}");
}

#[test]
fn int8_pure_integer_cnn_reaches_93_percent_held_out() {
    let r = run(
        "digits-cnn.toml",
        Precision::Int8(Int8Update::Integer {
            update_bits: DEFAULT_UPDATE_BITS,
        }),
        30,
    );
    assert!(
        r.report.test_accuracy >= 0.93,
        "pure-integer CNN held-out accuracy {}",
        r.report.test_accuracy
    );
}

#[test]
fn int8_arena_is_at_most_035_of_f32_for_the_cnn_at_batch_64() {
    let m =
        load_model(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/digits-cnn.toml"))
            .unwrap();
    let p = Precision::Int8(Int8Update::Integer { update_bits: 4 });
    let i8_plan = Plan::new(Graph::with_precision(&m.spec, 64, p).unwrap());
    let f32_plan = Plan::new(Graph::new(&m.spec, 64).unwrap());
    let ratio = i8_plan.arena_bytes as f64 / f32_plan.arena_bytes as f64;
    assert!(ratio <= 0.35, "int8 / f32 arena {ratio}");
    // Too small a budget is the planner's typed error, never a panic.
    assert!(i8_plan
        .check_budget(Budget::new(i8_plan.arena_bytes / 2))
        .is_err());
}
