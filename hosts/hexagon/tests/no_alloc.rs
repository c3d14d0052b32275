//! A DSP training step allocates nothing on the host after the first: the counting allocator of the
//! workspace's no-allocation suite (`frugal_tests::counting`, every thread counted — the transport's
//! time-out watchdog included) sees zero allocations over steps of the digits CNN on `DspBackend`
//! through `QemuHexagon`, with operands copied per call and with a planned DSP space, all-DSP and
//! mixed. The transport's buffers (frame writer, reply payload, the accumulator copy) keep their
//! capacity from the first step. Reported *skipped* without clang/qemu-hexagon; fails then under
//! `FRUGAL_REQUIRE_DSP=1`.
use std::path::PathBuf;

use frugal_cli::spec_toml::load_model;
use frugal_core::backend::{Placement, Target};
use frugal_core::exec::Executor;
use frugal_core::graph::Graph;
use frugal_core::model::{Int8Update, Precision};
use frugal_core::plan::Plan;
use frugal_hexagon::{qemu_or_skip, DspBackend, DspPlan, QemuHexagon};
use frugal_tests::counting::{allocations, run, Counting};

#[global_allocator]
static A: Counting = Counting;

fn main() {
    run(&[(
        "dsp_steps_allocate_nothing_after_the_first",
        dsp_steps_allocate_nothing_after_the_first,
    )]);
}

const BATCH: usize = 16;

fn dsp_steps_allocate_nothing_after_the_first() {
    let Some(_) = qemu_or_skip().expect("DSP required") else {
        return;
    };
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/digits-cnn.toml");
    let m = load_model(&path).unwrap();
    let (tr, _) = frugal_cli::data::digits();
    let per = tr.x.len() / tr.len();
    let batches: Vec<(Vec<f32>, Vec<u32>)> = (0..4)
        .map(|s| {
            let idx: Vec<usize> = (0..BATCH).map(|i| s * BATCH + i).collect();
            let (mut x, mut y) = (vec![0f32; BATCH * per], vec![0u32; BATCH]);
            tr.batch(&idx, &mut x, &mut y);
            (x, y)
        })
        .collect();
    for update in [
        Int8Update::FloatMaster,
        Int8Update::Integer { update_bits: 4 },
    ] {
        let base =
            Plan::new(Graph::with_precision(&m.spec, BATCH, Precision::Int8(update)).unwrap());
        let nodes = base.graph.nodes.len();
        // Operands copied per call: every instruction on the DSP.
        let mut all = base.clone();
        for ins in all.program.iter_mut() {
            ins.placement = Placement::Dsp;
        }
        steps(
            &format!("{update:?}, copying, all-DSP"),
            &all,
            None,
            &batches,
        );
        // A planned DSP space: all-DSP and alternating nodes.
        for (name, devs) in [
            ("all-DSP", vec![Placement::Dsp; nodes]),
            (
                "alternating",
                (0..nodes)
                    .map(|i| [Placement::Dsp, Placement::Cpu][i % 2])
                    .collect(),
            ),
        ] {
            let dp = DspPlan::new(base.clone(), &devs).unwrap();
            steps(
                &format!("{update:?}, planned space, {name}"),
                &dp.plan,
                Some(&dp),
                &batches,
            );
        }
    }
}

fn steps(name: &str, p: &Plan, dp: Option<&DspPlan>, data: &[(Vec<f32>, Vec<u32>)]) {
    let q = QemuHexagon::new().unwrap();
    let b = match dp {
        Some(dp) => DspBackend::planned(dp, q),
        None => DspBackend::new(p, q),
    }
    .unwrap();
    let mut arena = vec![0u8; p.needed_bytes()];
    let mut ex = Executor::with_backend(p, &arena, b).unwrap();
    ex.init_params(&mut arena, 1).unwrap();
    // The first step starts the DSP process and grows the transport's buffers.
    let (x, y) = &data[0];
    ex.train_step(&mut arena, x, Target::Classes(y)).unwrap();
    let calls = ex.backend().calls();
    let (r, n) = allocations(|| {
        for (x, y) in &data[1..] {
            ex.train_step(&mut arena, x, Target::Classes(y))?;
        }
        Ok::<_, frugal_core::backend::ExecError>(())
    });
    r.unwrap();
    let after = ex.backend().calls();
    assert!(after.gemm > calls.gemm, "{name}: no GEMM reached the DSP");
    assert_eq!(n, 0, "{name}: allocations in DSP steps after the first");
    println!("{name}: 0 allocations in {} steps", data.len() - 1);
}
