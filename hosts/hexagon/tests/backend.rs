//! Whole int8 training steps of the digits CNN (examples/digits-cnn.toml) on `DspBackend` through
//! `QemuHexagon`: all-DSP and mixed CPU/DSP placements give the loss bits and weights of all-CPU; the
//! DSP is set up once per plan (none per step); a DSP killed mid-step fails the step with a typed
//! error, the weights stay as before it, and the next step works on a fresh DSP.
//! Reported *skipped* without clang/qemu-hexagon; fails then under `FRUGAL_REQUIRE_DSP=1`.
use std::path::PathBuf;

use frugal_cli::spec_toml::load_model;
use frugal_core::backend::Backend;
use frugal_core::backend::{CpuInt8, ExecError, Placement, Target};
use frugal_core::exec::Executor;
use frugal_core::graph::Graph;
use frugal_core::model::{Int8Update, Precision};
use frugal_core::plan::{Phase, Plan};
use frugal_core::rng::Rng;
use frugal_hexagon::{qemu_or_skip, DspBackend, DspPlan, QemuHexagon, DSP_SPACE};

const BATCH: usize = 16;
const STEPS: usize = 3;

fn plan(update: Int8Update) -> Plan {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/digits-cnn.toml");
    let m = load_model(&path).unwrap();
    Plan::new(Graph::with_precision(&m.spec, BATCH, Precision::Int8(update)).unwrap())
}

fn batches() -> Vec<(Vec<f32>, Vec<u32>)> {
    let (tr, _) = frugal_cli::data::digits();
    let per = tr.x.len() / tr.len();
    (0..STEPS + 1)
        .map(|s| {
            let idx: Vec<usize> = (0..BATCH).map(|i| (s * BATCH + i) % tr.len()).collect();
            let (mut x, mut y) = (vec![0f32; BATCH * per], vec![0u32; BATCH]);
            tr.batch(&idx, &mut x, &mut y);
            (x, y)
        })
        .collect()
}

/// The persistent bytes of the arena (weights and optimizer state), from the aligned start the
/// executor uses.
fn weights(plan: &Plan, arena: &[u8]) -> Vec<u8> {
    let base = arena
        .as_ptr()
        .align_offset(frugal_core::plan::ALIGN)
        .min(frugal_core::plan::ALIGN);
    let arena = &arena[base..];
    let mut out = Vec::new();
    for n in &plan.graph.nodes {
        for p in &n.params {
            for t in std::iter::once(p.value).chain(p.state.iter().copied()) {
                let (off, len) = plan.region(t).unwrap();
                out.extend_from_slice(&arena[off..off + len]);
            }
        }
    }
    out
}

/// All-CPU: (loss bits per step, weights after each step).
fn cpu_run(plan: &Plan, data: &[(Vec<f32>, Vec<u32>)]) -> (Vec<u32>, Vec<Vec<u8>>) {
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::with_backend(plan, &arena, CpuInt8::new(plan).unwrap()).unwrap();
    ex.init_params(&mut arena, 1).unwrap();
    let (mut losses, mut ws) = (Vec::new(), Vec::new());
    for (x, y) in data {
        let s = ex.train_step(&mut arena, x, Target::Classes(y)).unwrap();
        losses.push(s.loss.to_bits());
        ws.push(weights(plan, &arena));
    }
    (losses, ws)
}

fn placed(base: &Plan, on_dsp: impl Fn(usize, Phase) -> bool) -> Plan {
    let mut p = base.clone();
    for (i, ins) in p.program.iter_mut().enumerate() {
        ins.placement = if on_dsp(i, ins.phase) {
            Placement::Dsp
        } else {
            Placement::Cpu
        };
    }
    p
}

fn updates() -> [Int8Update; 2] {
    [
        Int8Update::Integer { update_bits: 4 },
        Int8Update::FloatMaster,
    ]
}

#[test]
fn all_dsp_and_mixed_placements_give_the_cpu_loss_bits() {
    let Some(_) = qemu_or_skip().expect("DSP required") else {
        return;
    };
    let data = batches();
    for update in updates() {
        let base = plan(update);
        let (want, want_w) = cpu_run(&base, &data[..STEPS]);
        let mut rng = Rng::new(42);
        let coin: Vec<bool> = (0..base.program.len()).map(|_| rng.below(2) == 1).collect();
        let placements: Vec<(&str, Plan)> = vec![
            ("all-dsp", placed(&base, |_, _| true)),
            (
                "forward on dsp",
                placed(&base, |_, ph| ph == Phase::Forward),
            ),
            (
                "backward on dsp",
                placed(&base, |_, ph| matches!(ph, Phase::GradW | Phase::GradX)),
            ),
            ("alternating", placed(&base, |i, _| i % 2 == 0)),
            ("random", placed(&base, |i, _| coin[i])),
        ];
        for (name, p) in &placements {
            let mut arena = vec![0u8; p.needed_bytes()];
            let dsp = DspBackend::new(p, QemuHexagon::new().unwrap()).unwrap();
            let mut ex = Executor::with_backend(p, &arena, dsp).unwrap();
            ex.init_params(&mut arena, 1).unwrap();
            let mut got = Vec::new();
            for (s, (x, y)) in data[..STEPS].iter().enumerate() {
                let st = ex.train_step(&mut arena, x, Target::Classes(y)).unwrap();
                got.push(st.loss.to_bits());
                assert!(
                    weights(p, &arena) == want_w[s],
                    "{update:?}, {name}: weights after step {s}"
                );
            }
            assert_eq!(got, want, "{update:?}, {name}: loss bits");
            let b = ex.backend();
            let calls = b.calls();
            // The DSP did the work: products on every placement, pooling where a pool is on it.
            assert!(calls.gemm > 0, "{name}: no GEMM reached the DSP");
            // Counting: one DSP set-up for the plan, none in any step; one DSP process.
            assert_eq!(b.preparations, 1, "{name}: DSP preparations");
            let starts = ex.backend_mut().with_transport(|t| t.starts);
            assert_eq!(starts, 1, "{name}: DSP processes started");
        }
    }
}

#[test]
fn a_dsp_killed_mid_step_fails_the_step_and_keeps_the_weights() {
    let Some(_) = qemu_or_skip().expect("DSP required") else {
        return;
    };
    let data = batches();
    let base = plan(Int8Update::FloatMaster);
    // All-CPU reference for steps 0, 1 (the killed step is retried as step 1).
    let (want, want_w) = cpu_run(&base, &data[..2]);
    let p = placed(&base, |_, _| true);
    let mut arena = vec![0u8; p.needed_bytes()];
    let dsp = DspBackend::new(&p, QemuHexagon::new().unwrap()).unwrap();
    let mut ex = Executor::with_backend(&p, &arena, dsp).unwrap();
    ex.init_params(&mut arena, 1).unwrap();
    let s0 = ex
        .train_step(&mut arena, &data[0].0, Target::Classes(&data[0].1))
        .unwrap();
    assert_eq!(s0.loss.to_bits(), want[0]);
    let before = weights(&p, &arena);
    let per_step = ex.backend_mut().with_transport(|t| t.calls);
    // Kill the DSP late in the next step: after its first updates (the backward pass interleaves
    // them), so a rollback is needed to keep the weights.
    let kill_at = per_step + per_step * 9 / 10;
    ex.backend_mut()
        .with_transport(|t| t.kill_before_call = Some(kill_at));
    let r = ex.train_step(&mut arena, &data[1].0, Target::Classes(&data[1].1));
    assert!(
        matches!(r, Err(ExecError::Device(_))),
        "a dead DSP must fail the step: {r:?}"
    );
    let b = ex.backend_mut();
    assert!(
        matches!(b.last_error(), Some(frugal_hexagon::DspError::Died { .. })),
        "{:?}",
        b.last_error()
    );
    assert_eq!(b.faults, 1);
    assert!(
        weights(&p, &arena) == before,
        "weights changed by a failed step"
    );
    // The next step restarts the DSP and gives the CPU's bits for that batch.
    let s1 = ex
        .train_step(&mut arena, &data[1].0, Target::Classes(&data[1].1))
        .unwrap();
    assert_eq!(s1.loss.to_bits(), want[1], "the step after the fault");
    let got_w = weights(&p, &arena);
    assert!(got_w == want_w[1], "weights after the step after the fault");
    assert_eq!(ex.backend_mut().with_transport(|t| t.starts), 2);
}

#[test]
fn a_dsp_answering_garbage_is_a_typed_error() {
    let Some(_) = qemu_or_skip().expect("DSP required") else {
        return;
    };
    // `cat` echoes the request: a frame with the request's magic, not a reply.
    let mut d = frugal_hexagon::Dsp::new(QemuHexagon::with_command("cat".into(), vec![]));
    let e = d.ping().unwrap_err();
    assert!(
        matches!(
            e,
            frugal_hexagon::DspError::BadReply {
                what: "wrong magic",
                ..
            }
        ),
        "{e}"
    );
    // A program that exits at once: the DSP died.
    let mut d = frugal_hexagon::Dsp::new(QemuHexagon::with_command("true".into(), vec![]));
    let e = d.ping().unwrap_err();
    assert!(matches!(e, frugal_hexagon::DspError::Died { .. }), "{e}");
    // Random bytes: never a panic, a typed error.
    let mut d = frugal_hexagon::Dsp::new(QemuHexagon::with_command(
        "head".into(),
        vec!["-c".into(), "4096".into(), "/dev/urandom".into()],
    ));
    assert!(d.ping().is_err());
}

/// The aligned arena the executor hands the backend.
fn aligned(arena: &[u8]) -> &[u8] {
    let base = arena
        .as_ptr()
        .align_offset(frugal_core::plan::ALIGN)
        .min(frugal_core::plan::ALIGN);
    &arena[base..]
}

/// Bytes sent to and received from the DSP by the steps of a run.
fn pipe_bytes(c: frugal_hexagon::Calls) -> u64 {
    c.bytes_in + c.bytes_out
}

#[test]
fn a_planned_dsp_space_gives_the_cpu_loss_bits_and_moves_fewer_bytes() {
    let Some(_) = qemu_or_skip().expect("DSP required") else {
        return;
    };
    let data = batches();
    let base = plan(Int8Update::FloatMaster);
    let (want, want_w) = cpu_run(&base, &data[..STEPS]);
    let want_eval = {
        let mut arena = vec![0u8; base.needed_bytes()];
        let mut ex = Executor::with_backend(&base, &arena, CpuInt8::new(&base).unwrap()).unwrap();
        ex.init_params(&mut arena, 1).unwrap();
        for (x, y) in &data[..STEPS] {
            ex.train_step(&mut arena, x, Target::Classes(y)).unwrap();
        }
        let (x, y) = &data[STEPS];
        let e = ex.evaluate(&mut arena, x, Target::Classes(y)).unwrap();
        (e.loss.to_bits(), e.correct)
    };
    let nodes = base.graph.nodes.len();
    let mut rng = Rng::new(7);
    let coin: Vec<bool> = (0..nodes).map(|_| rng.below(2) == 1).collect();
    let cases: Vec<(&str, Vec<Placement>)> = vec![
        ("all-dsp", vec![Placement::Dsp; nodes]),
        (
            "alternating nodes",
            (0..nodes)
                .map(|i| {
                    if i % 2 == 0 {
                        Placement::Dsp
                    } else {
                        Placement::Cpu
                    }
                })
                .collect(),
        ),
        (
            "random nodes",
            coin.iter()
                .map(|&c| if c { Placement::Dsp } else { Placement::Cpu })
                .collect(),
        ),
    ];
    for (name, devs) in &cases {
        let dp = DspPlan::new(base.clone(), devs).unwrap();
        assert!(dp.space_bytes() > 0, "{name}: an empty DSP space");
        let p = &dp.plan;
        let mut arena = vec![0u8; p.needed_bytes()];
        let dsp = DspBackend::planned(&dp, QemuHexagon::new().unwrap()).unwrap();
        let mut ex = Executor::with_backend(p, &arena, dsp).unwrap();
        ex.init_params(&mut arena, 1).unwrap();
        let mut got = Vec::new();
        let mut w = Vec::new();
        let mut per_step = Vec::new();
        for (s, (x, y)) in data[..STEPS].iter().enumerate() {
            let before = pipe_bytes(ex.backend().calls());
            let st = ex.train_step(&mut arena, x, Target::Classes(y)).unwrap();
            per_step.push(pipe_bytes(ex.backend().calls()) - before);
            got.push(st.loss.to_bits());
            ex.backend_mut().persistent_bytes(aligned(&arena), &mut w);
            assert!(w == want_w[s], "{name}: weights after step {s}");
        }
        assert_eq!(got, want, "{name}: loss bits");
        // Evaluation runs the plan's forward moves too.
        let (ex_x, ex_y) = &data[STEPS];
        let ev = ex
            .evaluate(&mut arena, ex_x, Target::Classes(ex_y))
            .unwrap();
        assert_eq!(
            (ev.loss.to_bits(), ev.correct),
            want_eval,
            "{name}: evaluation"
        );
        let b = ex.backend_mut();
        // The DSP's space holds exactly what the host's record says it holds.
        assert_eq!(b.verify_space().unwrap(), dp.space_bytes(), "{name}");
        // One preparation (and one space) for the plan, none per step; one DSP process.
        assert_eq!(b.preparations, 1, "{name}: DSP preparations");
        assert_eq!(b.space_prepared(), Some((1, 1)), "{name}: spaces mapped");
        assert!(b.calls().in_space > 0, "{name}: no call ran on the space");
        assert_eq!(b.with_transport(|t| t.starts), 1, "{name}: DSP processes");
        // A second executor over the same plan and backend keeps the DSP space and its weights; the
        // executor reads a tensor that lives there through the backend.
        let mut ex = Executor::with_backend(p, &arena, ex.into_backend()).unwrap();
        let mut again = Vec::new();
        ex.backend_mut()
            .persistent_bytes(aligned(&arena), &mut again);
        assert!(again == w, "{name}: weights after a second prepare");
        assert_eq!(ex.backend().space_prepared(), Some((1, 1)), "{name}");
        let on_dsp = p
            .graph
            .nodes
            .iter()
            .zip(devs)
            .find(|(n, &d)| d == Placement::Dsp && !n.params.is_empty())
            .map(|(n, _)| n.params[0].value);
        if let Some(t) = on_dsp {
            // (A float-master plan: the weight's value is its f32 master.)
            let len = p.graph.tensors[t as usize].bytes / 4;
            let mut v = vec![0f32; len];
            ex.backend_mut().read_tensor(p, t, &mut v).unwrap();
            assert!(
                v.iter().any(|&x| x != 0.0),
                "{name}: a DSP-resident weight reads as zeros"
            );
        }
        // The same placement without a planned space copies every call's operands.
        let unplanned = {
            let mut up = base.clone();
            for ins in up.program.iter_mut() {
                ins.placement = if ins.node != frugal_core::plan::LOSS_NODE
                    && devs.get(ins.node as usize) == Some(&Placement::Dsp)
                    && ins.phase != Phase::Apply
                {
                    Placement::Dsp
                } else {
                    Placement::Cpu
                };
            }
            up
        };
        let mut arena = vec![0u8; unplanned.needed_bytes()];
        let dsp = DspBackend::new(&unplanned, QemuHexagon::new().unwrap()).unwrap();
        let mut ex = Executor::with_backend(&unplanned, &arena, dsp).unwrap();
        ex.init_params(&mut arena, 1).unwrap();
        let mut old = Vec::new();
        for (x, y) in &data[..STEPS] {
            let before = pipe_bytes(ex.backend().calls());
            ex.train_step(&mut arena, x, Target::Classes(y)).unwrap();
            old.push(pipe_bytes(ex.backend().calls()) - before);
        }
        eprintln!("{name}: pipe bytes per step, operands copied per call {old:?}, planned space {per_step:?}");
        // After the first step (which fills the space), a step moves fewer bytes than the copying one.
        for s in 1..STEPS {
            assert!(
                per_step[s] < old[s],
                "{name}: step {s} moved {} bytes with the space, {} without",
                per_step[s],
                old[s]
            );
        }
    }
}

/// A budget change: the DSP space of the plan in force is over the DSP's budget, the re-planned step
/// (two micro-batches) fits it; its backend, on the same DSP process, maps the new (smaller) layout and
/// the skel frees the old one.
#[test]
fn a_new_plan_maps_a_new_dsp_space_and_frees_the_old() {
    let Some(_) = qemu_or_skip().expect("DSP required") else {
        return;
    };
    let data = batches();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/digits-cnn.toml");
    let m = load_model(&path).unwrap();
    let graph =
        |b| Graph::with_precision(&m.spec, b, Precision::Int8(Int8Update::FloatMaster)).unwrap();
    // A smaller budget: the same 16-sample step as two micro-batches of 8.
    let plans = [
        Plan::new(graph(BATCH)),
        Plan::shaped(
            graph(BATCH / 2),
            frugal_core::plan::PlanShape {
                micro_batches: 2,
                in_place: true,
            },
        ),
    ];
    let mut transport = Some(QemuHexagon::new().unwrap());
    let mut sizes = Vec::new();
    // The DSP's budget: what the first plan's space needs, less one byte.
    let mut dsp_budget = None;
    for (k, base) in plans.into_iter().enumerate() {
        let (want, _) = cpu_run(&base, &data[..2]);
        let nodes = base.graph.nodes.len();
        let dp = DspPlan::new(base, &vec![Placement::Dsp; nodes]).unwrap();
        sizes.push(dp.space_bytes());
        let budget = *dsp_budget.get_or_insert(dp.space_bytes() - 1);
        let fits = dp
            .plan
            .check_budgets(&[(DSP_SPACE, frugal_core::budget::Budget::new(budget))]);
        // The first plan is over the DSP's budget, the re-planned one within it.
        assert_eq!(fits.is_ok(), k == 1, "plan {k}: {fits:?}");
        let p = &dp.plan;
        let mut arena = vec![0u8; p.needed_bytes()];
        let dsp = DspBackend::planned(&dp, transport.take().unwrap()).unwrap();
        let mut ex = Executor::with_backend(p, &arena, dsp).unwrap();
        ex.init_params(&mut arena, 1).unwrap();
        for (s, (x, y)) in data[..2].iter().enumerate() {
            let st = ex.train_step(&mut arena, x, Target::Classes(y)).unwrap();
            assert_eq!(st.loss.to_bits(), want[s], "plan {k}, step {s}");
        }
        let b = ex.backend_mut();
        // The same DSP process: its k-th space, the only one mapped (the old one was freed).
        assert_eq!(b.space_prepared(), Some((k as u32 + 1, 1)), "plan {k}");
        assert_eq!(b.verify_space().unwrap(), dp.space_bytes(), "plan {k}");
        assert_eq!(b.with_transport(|t| t.starts), 1);
        transport = ex.into_backend().into_transport();
        assert!(transport.is_some());
    }
    assert!(sizes[1] < sizes[0], "the two plans' DSP layouts: {sizes:?}");
}

#[test]
fn a_hung_dsp_times_out_and_keeps_the_weights() {
    let Some(_) = qemu_or_skip().expect("DSP required") else {
        return;
    };
    let data = batches();
    let base = plan(Int8Update::FloatMaster);
    let (want, want_w) = cpu_run(&base, &data[..2]);
    let nodes = base.graph.nodes.len();
    let dp = DspPlan::new(base, &vec![Placement::Dsp; nodes]).unwrap();
    let p = &dp.plan;
    let mut arena = vec![0u8; p.needed_bytes()];
    let mut q = QemuHexagon::new().unwrap();
    let timeout = std::time::Duration::from_secs(2);
    q.timeout = timeout;
    let dsp = DspBackend::planned(&dp, q).unwrap();
    let mut ex = Executor::with_backend(p, &arena, dsp).unwrap();
    ex.init_params(&mut arena, 1).unwrap();
    let s0 = ex
        .train_step(&mut arena, &data[0].0, Target::Classes(&data[0].1))
        .unwrap();
    assert_eq!(s0.loss.to_bits(), want[0]);
    let mut before = Vec::new();
    ex.backend_mut()
        .persistent_bytes(aligned(&arena), &mut before);
    let calls = ex.backend_mut().with_transport(|t| t.calls);
    let per_step = calls - 2; // the preparation's ping and space
                              // Hang late in the next step: after its first updates (the backward pass interleaves them).
    ex.backend_mut()
        .with_transport(|t| t.hang_at_call = Some(calls + per_step * 9 / 10));
    let t0 = std::time::Instant::now();
    let r = ex.train_step(&mut arena, &data[1].0, Target::Classes(&data[1].1));
    let waited = t0.elapsed();
    assert!(
        matches!(r, Err(ExecError::Device(_))),
        "a hung DSP must fail the step: {r:?}"
    );
    // Waited the time-out, not forever (the margin: the rest of the step's work before the hang).
    assert!(waited >= timeout && waited < timeout * 10, "{waited:?}");
    let b = ex.backend_mut();
    assert!(
        matches!(
            b.last_error(),
            Some(frugal_hexagon::DspError::TimedOut { .. })
        ),
        "{:?}",
        b.last_error()
    );
    let mut after = Vec::new();
    b.persistent_bytes(aligned(&arena), &mut after);
    assert!(after == before, "weights changed by a timed-out step");
    // The next step starts a fresh DSP (its space mapped again) and gives the CPU's bits.
    let s1 = ex
        .train_step(&mut arena, &data[1].0, Target::Classes(&data[1].1))
        .unwrap();
    assert_eq!(s1.loss.to_bits(), want[1], "the step after the time-out");
    let b = ex.backend_mut();
    b.persistent_bytes(aligned(&arena), &mut after);
    assert!(
        after == want_w[1],
        "weights after the step after the time-out"
    );
    assert_eq!(b.with_transport(|t| t.starts), 2);
    assert_eq!(b.verify_space().unwrap(), dp.space_bytes());
}
