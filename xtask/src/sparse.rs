//! `cargo xtask bench sparse`: the accuracy–memory curve of sparse-update transfer learning.
//!
//! The task (deterministic, shipped): the bundled UCI digits (CC BY 4.0, `data/digits/README.md`)
//! upscaled 2× to 16×16 (nearest). `examples/mcu-mbv2.toml` (a MobileNetV2-class network) is pretrained
//! with every layer training on digits 0–4, then fine-tuned from those weights on digits 5–9 (labels 5–9
//! become 0–4) by: the full update; "last k" (the last k layers with parameters, the rest frozen); and
//! the selection policy (`policy::sparse::select`: gradient-norm importance from
//! `exec::importance` on 4 batches of the new task, greedy under an arena budget). Each row: the fine-
//! tuning plan's arena at batch 32 (what the update needs, planned), its share of the full update's, the
//! backward pass's multiply-adds relative to the full update's, and the accuracy on the 5–9 test digits
//! (mean over `SEEDS` fine-tuning runs with different sample orders).
use std::collections::HashMap;
use std::path::Path;

use frugal_cli::data::{digits, Dataset};
use frugal_cli::spec_toml::load_model;
use frugal_core::exec::importance::{gradient_importance, scoring_spec};
use frugal_core::exec::{Executor, Target};
use frugal_core::graph::Graph;
use frugal_core::model::{Dims, ModelSpec, OptimizerSpec};
use frugal_core::plan::Plan;
use frugal_core::policy::sparse::{self, Choice, Importance, SparseBudget};

const BATCH: usize = 32;
pub(crate) const PRETRAIN_EPOCHS: usize = 30;
const FINETUNE_EPOCHS: usize = 15;
const SEEDS: u64 = 3;

/// Digits of classes `lo..lo + 5` upscaled to 16×16, labels shifted to 0..5.
pub(crate) fn task(d: &Dataset, lo: u32) -> (Vec<f32>, Vec<u32>) {
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for (i, &l) in d.y.iter().enumerate() {
        if !(lo..lo + 5).contains(&l) {
            continue;
        }
        let s = &d.x[i * 64..(i + 1) * 64];
        for r in 0..16 {
            for c in 0..16 {
                x.push(s[(r / 2) * 8 + c / 2]);
            }
        }
        y.push(l - lo);
    }
    (x, y)
}

/// A deterministic permutation of `0..n` for epoch `e` of run `seed`.
fn order(n: usize, seed: u64, e: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut s = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(e as u64 + 1);
    for i in (1..n).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.swap(i, (s % (i as u64 + 1)) as usize);
    }
    v
}

pub(crate) type Weights = HashMap<String, Vec<f32>>;

pub(crate) struct Run {
    pub(crate) arena: usize,
    pub(crate) flops: u64,
    pub(crate) acc: f64,
}

/// Trains `spec` from `init` (or its own initialisation) for `epochs` on `(x, y)`, returns the arena,
/// backward multiply-adds, the accuracy on `test`, and the trained persistent tensors.
pub(crate) fn train(
    spec: &ModelSpec,
    init: Option<&Weights>,
    (x, y): (&[f32], &[u32]),
    test: (&[f32], &[u32]),
    epochs: usize,
    seed: u64,
) -> Result<(Run, Weights), String> {
    let per = 256;
    let g = Graph::new(spec, BATCH).map_err(|e| e.to_string())?;
    let flops = sparse::backward_flops(&g);
    let plan = Plan::new(g);
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(&plan, &arena).map_err(|e| e.to_string())?;
    ex.init_params(&mut arena, 1).map_err(|e| e.to_string())?;
    if let Some(w) = init {
        let st: Vec<_> = ex.state_tensors().collect();
        for (name, _, t) in st {
            if let Some(v) = w.get(&name) {
                ex.write(&mut arena, t, v).map_err(|e| e.to_string())?;
            }
        }
    }
    let n = y.len();
    let (mut xb, mut yb) = (vec![0f32; BATCH * per], vec![0u32; BATCH]);
    for e in 0..epochs {
        let o = order(n, seed, e);
        for chunk in o.chunks(BATCH).filter(|c| c.len() == BATCH) {
            for (k, &i) in chunk.iter().enumerate() {
                xb[k * per..(k + 1) * per].copy_from_slice(&x[i * per..(i + 1) * per]);
                yb[k] = y[i];
            }
            ex.train_step(&mut arena, &xb, Target::Classes(&yb))
                .map_err(|e| e.to_string())?;
        }
    }
    let (tx, ty) = test;
    let mut correct = 0;
    for (xs, ys) in tx.chunks(BATCH * per).zip(ty.chunks(BATCH)) {
        correct += ex
            .evaluate(&mut arena, xs, Target::Classes(ys))
            .map_err(|e| e.to_string())?
            .correct;
    }
    let mut w = Weights::new();
    let st: Vec<_> = ex.state_tensors().collect();
    for (name, _, t) in st {
        w.insert(
            name,
            ex.read(&mut arena, t).map_err(|e| e.to_string())?.to_vec(),
        );
    }
    Ok((
        Run {
            arena: plan.needed_bytes(),
            flops,
            acc: 100.0 * correct as f64 / ty.len() as f64,
        },
        w,
    ))
}

/// What a selection trains: how many layers at each level, and the lowest updated layer.
pub(crate) fn describe(spec: &ModelSpec, c: &[Choice]) -> String {
    use frugal_core::model::Update;
    let count = |f: &dyn Fn(&Update) -> bool| c.iter().flatten().filter(|u| f(u)).count();
    let lowest = c
        .iter()
        .position(Option::is_some)
        .map_or("none", |i| spec.layers[i].name.as_str());
    format!(
        "{} all, {} channel subsets, {} bias only; lowest {lowest}",
        count(&|u| *u == Update::All),
        count(&|u| matches!(u, Update::Channels(_))),
        count(&|u| *u == Update::Bias)
    )
}

/// Importance (`exec::importance::gradient_importance`) of `base`'s layers and channels for the task
/// `(bx, by)` at the `pretrained` weights: 4 batches of 32 of the new task.
pub(crate) fn importance(
    base: &ModelSpec,
    pretrained: &Weights,
    (bx, by): (&[f32], &[u32]),
) -> Result<Importance, String> {
    let sspec = scoring_spec(base);
    let splan = Plan::new(Graph::new(&sspec, BATCH).map_err(|e| e.to_string())?);
    let mut sarena = vec![0u8; splan.needed_bytes()];
    let mut sex = Executor::new(&splan, &sarena).map_err(|e| e.to_string())?;
    let st: Vec<_> = sex.state_tensors().collect();
    for (name, _, t) in st {
        if let Some(v) = pretrained.get(&name) {
            sex.write(&mut sarena, t, v).map_err(|e| e.to_string())?;
        }
    }
    let o = order(by.len(), 99, 0);
    let mut batches_x: Vec<Vec<f32>> = Vec::new();
    let mut batches_y: Vec<Vec<u32>> = Vec::new();
    for chunk in o.chunks(BATCH).take(4) {
        batches_x.push(
            chunk
                .iter()
                .flat_map(|&i| bx[i * 256..(i + 1) * 256].iter().copied())
                .collect(),
        );
        batches_y.push(chunk.iter().map(|&i| by[i]).collect());
    }
    let batches: Vec<(&[f32], &[u32])> = batches_x
        .iter()
        .zip(&batches_y)
        .map(|(x, y)| (x.as_slice(), y.as_slice()))
        .collect();
    gradient_importance(&mut sex, &mut sarena, &batches).map_err(|e| e.to_string())
}

pub fn main(_args: &[String]) -> Result<(), String> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mcu-mbv2.toml");
    let base = load_model(&p).map_err(|e| e.to_string())?.spec;
    if base.input != Dims::new(1, 16, 16) {
        return Err("examples/mcu-mbv2.toml: expected 1×16×16 inputs".into());
    }
    let (train_set, test_set) = digits();
    let (ax, ay) = task(&train_set, 0);
    let (atx, aty) = task(&test_set, 0);
    let (bx, by) = task(&train_set, 5);
    let (btx, bty) = task(&test_set, 5);
    println!("`cargo xtask bench sparse` — examples/mcu-mbv2.toml, digits upscaled to 16×16: pretrain on 0–4 ({} train / {} test), fine-tune on 5–9 ({} / {}); batch {BATCH}, 1 thread.\n", ay.len(), aty.len(), by.len(), bty.len());

    // Pretraining: every layer, Adam.
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
        "Pretrained {PRETRAIN_EPOCHS} epochs on 0–4: {:.1} % on the 0–4 test digits.\n",
        r.acc
    );

    // Fine-tuning runs: the model's own optimizer (SGD with momentum).
    let finetune = |choices: &[Choice]| -> Result<Run, String> {
        let spec = sparse::apply(&base, choices);
        let mut acc = 0.0;
        let mut last = None;
        for seed in 0..SEEDS {
            let (r, _) = train(
                &spec,
                Some(&pretrained),
                (&bx, &by),
                (&btx, &bty),
                FINETUNE_EPOCHS,
                seed + 1,
            )?;
            acc += r.acc / SEEDS as f64;
            last = Some(r);
        }
        let r = last.ok_or("no run")?;
        Ok(Run { acc, ..r })
    };
    let n_param = sparse::last_k(&base, usize::MAX).iter().flatten().count();
    let full = finetune(&sparse::last_k(&base, n_param))?;
    let mut rows: Vec<(String, Run)> = Vec::new();
    for k in [1, 2, 4, 8, 14, 20, 26] {
        rows.push((
            format!("last {k} layers"),
            finetune(&sparse::last_k(&base, k))?,
        ));
    }

    let imp = importance(&base, &pretrained, (&bx, &by))?;
    let mut smallest: Option<(f64, Vec<Choice>)> = None;
    for frac in [0.1, 0.15, 0.2, 0.25, 0.35] {
        let budget = SparseBudget {
            arena_bytes: (full.arena as f64 * frac) as usize,
            backward_flops: full.flops,
        };
        let picked = sparse::select(&base, BATCH, &imp, budget);
        if let (Ok(c), None) = (&picked, &smallest) {
            smallest = Some((frac, c.clone()));
        }
        match picked {
            Ok(c) => rows.push((
                format!(
                    "policy, arena ≤ {frac:.2} of full ({})",
                    describe(&base, &c)
                ),
                finetune(&c)?,
            )),
            Err(e) => println!("policy at {frac:.2} of the full arena: {e:?}"),
        }
    }
    let budget = SparseBudget {
        arena_bytes: full.arena / 5,
        backward_flops: full.flops / 4,
    };
    match sparse::select(&base, BATCH, &imp, budget) {
        Ok(c) => rows.push((
            format!(
                "policy, arena ≤ 0.20, backward ≤ 0.25 ({})",
                describe(&base, &c)
            ),
            finetune(&c)?,
        )),
        Err(e) => println!("policy at 0.20 arena, 0.25 compute: {e:?}"),
    }

    println!("| update | arena | × full arena | × full backward | accuracy on 5–9 (mean of {SEEDS}) | − full |");
    println!("|---|---:|---:|---:|---:|---:|");
    let line = |name: &str, r: &Run| {
        println!(
            "| {name} | {:.1} KiB | {:.3} | {:.3} | {:.1} % | {:+.1} |",
            r.arena as f64 / 1024.0,
            r.arena as f64 / full.arena as f64,
            r.flops as f64 / full.flops as f64,
            r.acc,
            r.acc - full.acc
        )
    };
    line("full fine-tuning", &full);
    for (name, r) in &rows {
        line(name, r);
    }

    // Microcontroller-sized batches: the same updates planned at small batches (planning only).
    if let Some((frac, c)) = smallest {
        println!(
            "\n### Arena at microcontroller batch sizes (planned; f32 weights are in the arena)\n"
        );
        println!("| batch | full update | last 8 layers | policy of the {frac:.2} row | weights (all f32) |");
        println!("|---:|---:|---:|---:|---:|");
        let weights: usize = Graph::new(&base, 1)
            .map_err(|e| e.to_string())?
            .params()
            .map(|(_, p)| p.shape.iter().product::<usize>() * 4)
            .sum();
        for b in [1, 4, 8, 16] {
            let arena = |ch: &[Choice]| -> Result<String, String> {
                let g = Graph::new(&sparse::apply(&base, ch), b).map_err(|e| e.to_string())?;
                Ok(format!(
                    "{:.1} KiB",
                    Plan::new(g).needed_bytes() as f64 / 1024.0
                ))
            };
            println!(
                "| {b} | {} | {} | {} | {:.1} KiB |",
                arena(&sparse::last_k(&base, n_param))?,
                arena(&sparse::last_k(&base, 8))?,
                arena(&c)?,
                weights as f64 / 1024.0
            );
        }
    }
    Ok(())
}
