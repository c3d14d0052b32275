//! Every instruction goes through the backend: a recording decorator over the real backends sees each
//! instruction the step loop runs — plain, micro-batched, recomputing, fp16-storage, spilled, moving,
//! adaptive and int8 plans — exactly once and in program order, and results are bit-identical to the
//! undecorated run. An executor refuses, when it is created, a plan placed where its backend cannot run.
use alloc::vec;
use alloc::vec::Vec;

use super::*;
use crate::backend::{
    Backend, CpuInt8, Cx, LayerOps, LossOps, LossOut, MoveOps, OptimOps, Placement, Region,
    StepStart,
};
use crate::budget::Budget;
use crate::graph::Graph;
use crate::model::{Int8Update, Precision};
use crate::plan::tests::random_model;
use crate::plan::SpaceId;
use crate::policy::{half, recompute, spaces, swap, CostModel};
use crate::spill::MemSpill;

/// One call the backend saw: (plan identity, execution order, phase).
type Call = (usize, Eo, Phase);

/// Wraps a backend and records every call. The log is reserved up front, so recording allocates nothing
/// while a step runs.
struct Recorder<B> {
    inner: B,
    log: Vec<Call>,
    steps_begun: usize,
    steps_ended: usize,
}

impl<B> Recorder<B> {
    fn new(inner: B) -> Self {
        Self {
            inner,
            log: Vec::with_capacity(1 << 16),
            steps_begun: 0,
            steps_ended: 0,
        }
    }
    fn note(&mut self, cx: &Cx<'_>) {
        self.log
            .push((cx.plan as *const Plan as usize, cx.eo, cx.ins.phase));
    }
}

impl<B: Backend> LayerOps for Recorder<B> {
    fn forward(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.note(cx);
        self.inner.forward(cx, host)
    }
    fn grad_w(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.note(cx);
        self.inner.grad_w(cx, host)
    }
    fn grad_x(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.note(cx);
        self.inner.grad_x(cx, host)
    }
}

impl<B: Backend> LossOps for Recorder<B> {
    fn loss(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        target: Target<'_>,
        norm: usize,
    ) -> Result<LossOut, ExecError> {
        self.note(cx);
        self.inner.loss(cx, host, target, norm)
    }
}

impl<B: Backend> OptimOps for Recorder<B> {
    fn apply(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.note(cx);
        self.inner.apply(cx, host)
    }
}

impl<B: Backend> MoveOps for Recorder<B> {
    fn spill_out(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        spill: &mut dyn Spill,
    ) -> Result<(), ExecError> {
        self.note(cx);
        self.inner.spill_out(cx, host, spill)
    }
    fn spill_in(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        spill: &mut dyn Spill,
    ) -> Result<(), ExecError> {
        self.note(cx);
        self.inner.spill_in(cx, host, spill)
    }
    fn convert_half(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.note(cx);
        self.inner.convert_half(cx, host)
    }
    fn move_between(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        from: Region,
        to: Region,
    ) -> Result<(), ExecError> {
        self.note(cx);
        self.inner.move_between(cx, host, from, to)
    }
}

impl<B: Backend> Backend for Recorder<B> {
    fn name(&self) -> &'static str {
        "recorder"
    }
    fn serves(&self, p: Placement) -> bool {
        self.inner.serves(p)
    }
    fn prepare(&mut self, plan: &Plan) -> Result<(), ExecError> {
        self.inner.prepare(plan)
    }
    fn begin_step(&mut self, plan: &Plan, step: &StepStart<'_>) -> Result<(), ExecError> {
        self.steps_begun += 1;
        self.inner.begin_step(plan, step)
    }
    fn end_step(&mut self, plan: &Plan) -> Result<Option<LossOut>, ExecError> {
        self.steps_ended += 1;
        self.inner.end_step(plan)
    }
    fn read_tensor(
        &mut self,
        plan: &Plan,
        t: crate::graph::TensorId,
        out: &mut [f32],
    ) -> Result<(), ExecError> {
        self.inner.read_tensor(plan, t, out)
    }
    fn write_tensor(
        &mut self,
        plan: &Plan,
        t: crate::graph::TensorId,
        data: &[f32],
    ) -> Result<(), ExecError> {
        self.inner.write_tensor(plan, t, data)
    }
    fn init_params(&mut self, plan: &Plan, host: &mut [u8], seed: u64) -> Result<(), ExecError> {
        self.inner.init_params(plan, host, seed)
    }
}

/// conv-relu-pool ×2 + linear on 16×16 (the small CNN shape), no BatchNorm.
fn cnn() -> crate::model::ModelSpec {
    random_model(
        &[
            (0, 2, true),
            (3, 0, true),
            (4, 0, true),
            (0, 2, true),
            (3, 0, true),
            (4, 0, true),
        ],
        1,
        16,
        1,
    )
}

fn data(p: &Plan, n: usize) -> (Vec<f32>, Vec<u32>) {
    let per = p.graph.input_dims.numel();
    let mut rng = crate::rng::Rng::new(3);
    let x: Vec<f32> = (0..n * per).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let y: Vec<u32> = (0..n).map(|i| (i % 3) as u32).collect();
    (x, y)
}

/// What the step loop must hand the backend for one full step of `p` on `n` samples: every instruction
/// whose micro-batch has samples, in order.
fn expected(p: &Plan, n: usize) -> Vec<Call> {
    let mb = p.graph.batch;
    p.program
        .iter()
        .enumerate()
        .filter(|(_, i)| i.phase == Phase::Apply || n.saturating_sub(i.mb as usize * mb) > 0)
        .map(|(eo, i)| (p as *const Plan as usize, eo as Eo, i.phase))
        .collect()
}

/// Two steps through the recorder; returns (losses and weights, calls of the second step).
fn recorded(p: &Plan, n: usize, spill: Option<&mut dyn Spill>) -> (Vec<u32>, Vec<Call>) {
    let mut arena = vec![0u8; p.needed_bytes()];
    let mut ex = Executor::with_backend(p, &arena, Recorder::new(CpuBackend::new())).unwrap();
    ex.init_params(&mut arena, 9).unwrap();
    let (x, y) = data(p, n);
    let mut out = Vec::new();
    let mut spill = spill;
    for _ in 0..2 {
        ex.backend_mut().log.clear();
        let st = match spill.as_deref_mut() {
            Some(s) => ex.train_step_spilled(&mut arena, &x, Target::Classes(&y), s),
            None => ex.train_step(&mut arena, &x, Target::Classes(&y)),
        };
        out.push(st.unwrap().loss.to_bits());
    }
    for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
        out.extend(ex.read(&mut arena, t).unwrap().iter().map(|v| v.to_bits()));
    }
    assert_eq!(ex.backend().steps_begun, 2);
    // Every step that began was ended (a deferring backend runs its work there).
    assert_eq!(ex.backend().steps_ended, 2);
    (out, ex.backend().log.clone())
}

/// The same two steps on the plain CPU backend.
fn plain(p: &Plan, n: usize, spill: Option<&mut dyn Spill>) -> Vec<u32> {
    let mut arena = vec![0u8; p.needed_bytes()];
    let mut ex = Executor::new(p, &arena).unwrap();
    ex.init_params(&mut arena, 9).unwrap();
    let (x, y) = data(p, n);
    let mut out = Vec::new();
    let mut spill = spill;
    for _ in 0..2 {
        let st = match spill.as_deref_mut() {
            Some(s) => ex.train_step_spilled(&mut arena, &x, Target::Classes(&y), s),
            None => ex.train_step(&mut arena, &x, Target::Classes(&y)),
        };
        out.push(st.unwrap().loss.to_bits());
    }
    for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
        out.extend(ex.read(&mut arena, t).unwrap().iter().map(|v| v.to_bits()));
    }
    out
}

fn check(p: &Plan, n: usize, must_have: &[Phase]) {
    let (bits, calls) = recorded(p, n, None);
    assert_eq!(calls, expected(p, n), "every instruction once, in order");
    for ph in must_have {
        assert!(
            calls.iter().any(|c| c.2 == *ph),
            "the plan exercises {ph:?}"
        );
    }
    assert_eq!(bits, plain(p, n, None), "the decorator changes nothing");
}

#[test]
fn every_instruction_of_a_plain_plan_goes_through_the_backend() {
    let p = Plan::new(Graph::new(&cnn(), 8).unwrap());
    check(
        &p,
        8,
        &[
            Phase::Forward,
            Phase::Loss,
            Phase::GradW,
            Phase::GradX,
            Phase::Apply,
        ],
    );
}

#[test]
fn micro_batched_and_recomputing_plans_go_through_the_backend() {
    let g = Graph::new(&cnn(), 4).unwrap();
    let cost = CostModel::estimate(&g);
    // Three micro-batches of 4 (the last one partial at n = 10); then the smallest recompute plan.
    let roomy = recompute(&g, 3, usize::MAX, &cost).unwrap();
    check(&roomy, 10, &[Phase::GradW]);
    let g = Graph::new(&cnn(), 32).unwrap();
    let tight = recompute(&g, 1, 0, &CostModel::estimate(&g)).unwrap_or_else(|p| p);
    check(&tight, 32, &[Phase::Recompute]);
}

#[test]
fn fp16_storage_pack_and_unpack_go_through_the_backend() {
    let p = half::f16_storage(&Graph::new(&cnn(), 8).unwrap());
    check(&p, 8, &[Phase::Pack, Phase::Unpack]);
}

#[test]
fn moves_go_through_the_backend() {
    // Within the host arena: the plan every backend runs with `MoveOps`' default.
    let p = spaces::offload(
        &Graph::new(&cnn(), 8).unwrap(),
        SpaceId::HOST,
        64,
        |_, _| true,
    );
    check(&p, 8, &[Phase::Move]);
}

#[test]
fn spilled_steps_go_through_the_backend() {
    let g = Graph::new(&cnn(), 8).unwrap();
    let plain_bytes = Plan::new(g.clone()).arena_bytes;
    let p = swap::plan_swap(&g, 2, plain_bytes * 7 / 10).unwrap_or_else(|p| p);
    assert!(p.program.iter().any(|i| i.phase == Phase::SpillOut));
    let (bits, calls) = recorded(&p, 8, Some(&mut MemSpill::default()));
    assert_eq!(calls, expected(&p, 8));
    assert_eq!(bits, plain(&p, 8, Some(&mut MemSpill::default())));
}

#[test]
fn an_adaptive_step_runs_every_instruction_and_regeneration_through_the_backend() {
    let (_, table) = super::adapt_tests::bn_table();
    let big = &table.entries.last().unwrap().plan;
    let small = &table.entries[0].plan;
    assert!(small.needed_bytes() < big.needed_bytes());
    let mut arena = vec![0u8; big.needed_bytes()];
    let mut ex = Executor::with_backend(big, &arena, Recorder::new(CpuBackend::new())).unwrap();
    ex.init_params(&mut arena, 9).unwrap();
    let (x, y) = data(big, 16);
    let drop_at = big.program.len() / 2;
    let mut ran = 0usize;
    let mut count = |_: usize, _: &Instr, _: &[u8]| ran += 1;
    let (_, ad) = ex
        .train_step_adaptive(
            &mut arena,
            &x,
            Target::Classes(&y),
            &table,
            &mut |eo, _| (eo == drop_at).then_some(Budget::new(small.needed_bytes())),
            &mut count,
        )
        .unwrap();
    assert!(ad.switches >= 1, "the drop switched plans");
    let calls = &ex.backend().log;
    assert_eq!(
        calls.len(),
        ran + ad.recomputed as usize,
        "each instruction run and each regeneration is one backend call"
    );
    assert!(calls.iter().any(|c| c.0 == small as *const Plan as usize));
}

#[test]
fn int8_steps_go_through_the_backend_bit_for_bit() {
    let spec = crate::quant::tests::tiny_spec();
    let p = Precision::Int8(Int8Update::Integer { update_bits: 2 });
    let plan = Plan::new(Graph::with_precision(&spec, 8, p).unwrap());
    let mut a1 = vec![0u8; plan.needed_bytes()];
    let mut a2 = a1.clone();
    let mut plain = int8::Int8Executor::new(&plan, &a1).unwrap();
    let rec = Recorder::new(CpuInt8::new(&plan).unwrap());
    let mut ex = Executor::with_backend(&plan, &a2, rec).unwrap();
    plain.init_params(&mut a1, spec.seed).unwrap();
    ex.init_params(&mut a2, spec.seed).unwrap();
    for step in 0..3 {
        let (x, y) = crate::quant::tests::synthetic(8, step);
        ex.backend_mut().log.clear();
        let s1 = plain.train_step(&mut a1, &x, Target::Classes(&y)).unwrap();
        let s2 = ex.train_step(&mut a2, &x, Target::Classes(&y)).unwrap();
        assert_eq!(s1.loss.to_bits(), s2.loss.to_bits());
        assert_eq!(ex.backend().log, expected(&plan, 8));
    }
    let (b1, b2) = (base_of(&a1), base_of(&a2));
    let n = plan.arena_bytes;
    assert!(a1[b1..b1 + n] == a2[b2..b2 + n], "same bytes in the arena");
}

#[test]
fn an_executor_refuses_a_plan_placed_where_its_backend_cannot_run() {
    let mut p = Plan::new(Graph::new(&cnn(), 4).unwrap());
    let arena = vec![0u8; p.needed_bytes()];
    p.program[3].placement = Placement::Gpu;
    match Executor::new(&p, &arena) {
        Err(ExecError::Placement(Placement::Gpu)) => {}
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("a GPU-placed instruction was accepted by the CPU backend"),
    }
    let spec = crate::quant::tests::tiny_spec();
    let prec = Precision::Int8(Int8Update::FloatMaster);
    let mut q = Plan::new(Graph::with_precision(&spec, 8, prec).unwrap());
    q.program[0].placement = Placement::Dsp;
    let arena = vec![0u8; q.needed_bytes()];
    assert!(matches!(
        int8::Int8Executor::new(&q, &arena).map(|_| ()),
        Err(ExecError::Placement(Placement::Dsp))
    ));
}

/// A decoded plan may name, for an instruction, a tensor the op cannot use: the input derivative of the
/// first layer (which has none), or a tensor smaller than the op needs. The step fails with
/// `ExecError::BadPlan`; no kernel sees a short slice (found by `cargo xtask fuzz` on the `plan` target).
#[test]
fn an_instruction_on_a_missing_operand_is_an_error_not_a_panic() {
    use crate::format::{decode_plan, encode_plan};
    let run = |spec: &crate::model::ModelSpec, g: Graph| {
        let mut p = Plan::new(g);
        let first = p
            .graph
            .nodes
            .iter()
            .position(|n| n.d_in[0].is_none())
            .unwrap();
        let gx = p
            .program
            .iter()
            .position(|i| i.phase == Phase::GradX && i.node as usize != first)
            .expect("a derivative instruction");
        p.program[gx].node = first as u16;
        let p = Plan::from_program(p.graph, p.micro_batches, p.program, p.roots);
        // Through the file format: the decoder accepts this program (its storages are consistent).
        let (_, p) = decode_plan(&encode_plan(spec, &p)).expect("the plan decodes");
        let mut arena = vec![0u8; p.needed_bytes()];
        let n = p.batch();
        let x = vec![0.5f32; n * p.graph.input_dims.numel()];
        let y = vec![0u32; n];
        let r = if p.graph.precision == Precision::F32 {
            let mut ex = Executor::new(&p, &arena).unwrap();
            ex.init_params(&mut arena, 1).unwrap();
            ex.train_step(&mut arena, &x, Target::Classes(&y))
                .map(|_| ())
        } else {
            let mut ex = int8::Int8Executor::new(&p, &arena).unwrap();
            ex.init_params(&mut arena, 1).unwrap();
            ex.train_step(&mut arena, &x, Target::Classes(&y))
                .map(|_| ())
        };
        assert!(matches!(r, Err(ExecError::BadPlan(_))), "{r:?}");
    };
    run(&cnn(), Graph::new(&cnn(), 4).unwrap());
    let spec = crate::quant::tests::tiny_spec();
    let prec = Precision::Int8(Int8Update::FloatMaster);
    run(&spec, Graph::with_precision(&spec, 8, prec).unwrap());
}
