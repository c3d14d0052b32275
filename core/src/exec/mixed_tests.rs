//! Mixed placement end to end on the CPU alone: a test backend serves two devices — the CPU on the
//! host arena, and a "device" (`Placement::Gpu`) that owns a second memory space (a `Vec<u8>` at
//! 256-byte alignment) and computes there with the CPU's own kernels (through a view of the plan in
//! which that space is the arena). Since both devices run the same kernels and a move copies bytes,
//! a mixed plan must train **bit-identically** to the all-CPU plan it came from; any instruction that
//! touched a value in the other device's space would fail (its operand has no storage in the space it
//! computes in).
use alloc::vec;
use alloc::vec::Vec;

use proptest::prelude::*;

use super::*;
use crate::backend::{
    Backend, Cx, LayerOps, LossOps, LossOut, MoveOps, OptimOps, Placement, Region, StepStart,
};
use crate::budget::{Budget, BudgetError};
use crate::format::{decode_plan, encode_plan};
use crate::graph::Graph;
use crate::plan::tests::random_model;
use crate::plan::{PlanShape, SpaceId};
use crate::policy::mixed::{host_view, mixed, node_devices, MixedError, LOSS_PLACEMENT};
use crate::policy::spaces::{move_volume, offload};

/// The device's space.
const DEVICE: SpaceId = SpaceId(1);
/// Its alignment (the host arena's is 64).
const DEVICE_ALIGN: usize = 256;
/// The id host storages get in the device's view (any space but the host's: unreachable there).
const ELSEWHERE: SpaceId = SpaceId(9);

fn space_of(d: Placement) -> Option<(SpaceId, usize)> {
    (d == Placement::Gpu).then_some((DEVICE, DEVICE_ALIGN))
}

/// The plan as the device's kernels see it: its space is the arena, the host's storages are out of
/// reach.
fn device_view(plan: &Plan) -> Plan {
    crate::policy::mixed::device_view(plan, DEVICE, ELSEWHERE)
}

/// Two devices: the CPU on the host arena, and the device on its own memory.
struct Dual {
    cpu: CpuBackend,
    dev: CpuBackend,
    view: Option<Plan>,
    mem: Vec<u8>,
    base: usize,
    /// Instructions run on the device (moves aside), moves, bytes host→device and device→host.
    on_device: usize,
    moves: usize,
    bytes_out: usize,
    bytes_in: usize,
}

impl Dual {
    fn new() -> Self {
        Self {
            cpu: CpuBackend::new(),
            dev: CpuBackend::new(),
            view: None,
            mem: Vec::new(),
            base: 0,
            on_device: 0,
            moves: 0,
            bytes_out: 0,
            bytes_in: 0,
        }
    }

    /// The device's memory (exactly its space's size) and its view of the plan.
    fn parts(&mut self) -> Result<(&mut CpuBackend, &Plan, &mut [u8]), ExecError> {
        let view = self
            .view
            .as_ref()
            .ok_or(ExecError::BadPlan("not prepared"))?;
        let mem = &mut self.mem[self.base..self.base + view.arena_bytes];
        Ok((&mut self.dev, view, mem))
    }

    /// Runs `f` on the device for a device-placed instruction, on the CPU otherwise.
    fn run(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        f: impl Fn(&mut CpuBackend, &Cx<'_>, &mut [u8]) -> Result<(), ExecError>,
    ) -> Result<(), ExecError> {
        match cx.ins.placement {
            Placement::Cpu => f(&mut self.cpu, cx, host),
            Placement::Gpu => {
                self.on_device += 1;
                let (dev, view, mem) = self.parts()?;
                f(dev, &Cx { plan: view, ..*cx }, mem)
            }
            p => Err(ExecError::Placement(p)),
        }
    }

    fn dev_region(&mut self, r: Region) -> Result<&mut [u8], ExecError> {
        let (_, _, mem) = self.parts()?;
        mem.get_mut(r.offset..r.offset + r.bytes)
            .ok_or(ExecError::BadPlan("a move outside device memory"))
    }
}

fn host_part(host: &mut [u8], r: Region) -> Result<&mut [u8], ExecError> {
    host.get_mut(r.offset..r.offset + r.bytes)
        .ok_or(ExecError::BadPlan("a move outside the arena"))
}

impl LayerOps for Dual {
    fn forward(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.run(cx, host, |b, cx, a| b.forward(cx, a))
    }
    fn grad_w(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.run(cx, host, |b, cx, a| b.grad_w(cx, a))
    }
    fn grad_x(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.run(cx, host, |b, cx, a| b.grad_x(cx, a))
    }
}

impl LossOps for Dual {
    fn loss(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        target: Target<'_>,
        norm: usize,
    ) -> Result<LossOut, ExecError> {
        if cx.ins.placement != Placement::Cpu {
            return Err(ExecError::Placement(cx.ins.placement));
        }
        self.cpu.loss(cx, host, target, norm)
    }
}

impl OptimOps for Dual {
    fn apply(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.run(cx, host, |b, cx, a| b.apply(cx, a))
    }
}

impl MoveOps for Dual {
    fn convert_half(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.run(cx, host, |b, cx, a| b.convert_half(cx, a))
    }
    fn move_between(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        from: Region,
        to: Region,
    ) -> Result<(), ExecError> {
        self.moves += 1;
        match (from.space, to.space) {
            (SpaceId::HOST, SpaceId::HOST) => self.cpu.move_between(cx, host, from, to),
            (SpaceId::HOST, DEVICE) => {
                self.bytes_out += from.bytes;
                let src = host_part(host, from)?;
                self.dev_region(to)?.copy_from_slice(src);
                Ok(())
            }
            (DEVICE, SpaceId::HOST) => {
                self.bytes_in += from.bytes;
                let dst = host_part(host, to)?;
                dst.copy_from_slice(self.dev_region(from)?);
                Ok(())
            }
            _ => Err(ExecError::BadPlan(
                "a move within one space of the mixed plan",
            )),
        }
    }
}

impl Backend for Dual {
    fn name(&self) -> &'static str {
        "cpu + device (test)"
    }
    fn serves(&self, p: Placement) -> bool {
        matches!(p, Placement::Cpu | Placement::Gpu)
    }
    fn prepare(&mut self, plan: &Plan) -> Result<(), ExecError> {
        if let Some(i) = plan.program.iter().find(|i| !self.serves(i.placement)) {
            return Err(ExecError::Placement(i.placement));
        }
        if let Some(s) = plan.spaces.iter().find(|s| s.space != DEVICE) {
            return Err(ExecError::Space(s.space.0));
        }
        // Exactly the space's bytes (its budget): an access beyond them is an error.
        self.mem = vec![0xA5; plan.space_bytes(DEVICE) + DEVICE_ALIGN];
        self.base = self.mem.as_ptr().align_offset(DEVICE_ALIGN);
        self.view = Some(device_view(plan));
        Ok(())
    }
    fn begin_step(&mut self, plan: &Plan, step: &StepStart<'_>) -> Result<(), ExecError> {
        self.cpu.begin_step(plan, step)
    }
    fn read_tensor(&mut self, _: &Plan, t: TensorId, out: &mut [f32]) -> Result<(), ExecError> {
        let (_, view, mem) = self.parts()?;
        let (off, len) = view
            .region(t)
            .ok_or(ExecError::Tensor("not on the device"))?;
        let v = crate::backend::arena::f32s(&mut mem[off..off + len])?;
        out.copy_from_slice(v);
        Ok(())
    }
    fn write_tensor(&mut self, _: &Plan, t: TensorId, data: &[f32]) -> Result<(), ExecError> {
        let (_, view, mem) = self.parts()?;
        let (off, len) = view
            .region(t)
            .ok_or(ExecError::Tensor("not on the device"))?;
        crate::backend::arena::f32s(&mut mem[off..off + len])?.copy_from_slice(data);
        Ok(())
    }
    /// The all-CPU plan's values: initialised in one host view of both spaces, then split.
    fn init_params(&mut self, plan: &Plan, host: &mut [u8], seed: u64) -> Result<(), ExecError> {
        let (all, base) = host_view(plan, DEVICE);
        let mut both = vec![0u8; all.arena_bytes + 64];
        let b = both.as_ptr().align_offset(64);
        let both = &mut both[b..b + all.arena_bytes];
        self.cpu.init_params(&all, both, seed)?;
        host[..plan.arena_bytes].copy_from_slice(&both[..plan.arena_bytes]);
        let (_, _, mem) = self.parts()?;
        mem.copy_from_slice(&both[base..]);
        Ok(())
    }
}

/// `steps` training steps of `p` on `backend` (an arena of exactly `p.needed_bytes()`), then an
/// evaluation and a prediction: every loss and every persistent tensor, bit for bit.
fn train<B: Backend>(p: &Plan, backend: B, steps: usize, done: impl FnOnce(&B)) -> Vec<u32> {
    let mut arena = vec![0u8; p.needed_bytes()];
    let mut ex = Executor::with_backend(p, &arena, backend).unwrap();
    ex.init_params(&mut arena, 9).unwrap();
    let n = p.batch();
    let per = p.graph.input_dims.numel();
    let mut rng = crate::rng::Rng::new(3);
    let x: Vec<f32> = (0..n * per).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let y: Vec<u32> = (0..n).map(|i| (i % 3) as u32).collect();
    let mut out = Vec::new();
    for _ in 0..steps {
        let st = ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
        out.push(st.loss.to_bits());
    }
    let mb = p.graph.batch;
    let ev = ex
        .evaluate(&mut arena, &x[..mb * per], Target::Classes(&y[..mb]))
        .unwrap();
    out.push(ev.loss.to_bits());
    out.push(ev.correct as u32);
    let pred = ex.predict(&mut arena, &x[..mb * per]).unwrap().to_vec();
    out.extend(pred.iter().map(|v| v.to_bits()));
    for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
        out.extend(
            ex.read_vec(&mut arena, t)
                .unwrap()
                .iter()
                .map(|v| v.to_bits()),
        );
    }
    done(ex.backend());
    out
}

/// Checks the shape of a mixed plan against the placements it was given.
fn check_mixed(p: &Plan, devices: &[Placement]) {
    assert_eq!(node_devices(p), devices);
    for (eo, ins) in p.program.iter().enumerate() {
        match ins.phase {
            Phase::Loss => assert_eq!(ins.placement, LOSS_PLACEMENT),
            Phase::Move => {
                // A move serves the next instruction: its device and micro-batch, and writes its space.
                let next = p.program[eo + 1];
                assert_eq!((ins.placement, ins.mb), (next.placement, next.mb));
                let (from, to) = p.move_storages(eo as Eo).expect("a move reads a value");
                let (a, b) = (&p.lives[from], &p.lives[to]);
                assert_ne!(a.space, b.space, "a move crosses spaces");
                let want = if next.placement == Placement::Cpu {
                    SpaceId::HOST
                } else {
                    DEVICE
                };
                assert_eq!(b.space, want);
            }
            _ => assert_eq!(ins.placement, devices[ins.node as usize]),
        }
    }
    // Persistent storages stay where their node computes, for the whole step.
    for (s, l) in p.lives.iter_enumerated() {
        if l.kind.persistent() {
            assert_eq!((l.first, l.last), (0, p.n_eo() - 1));
            let eo = p.touches[s][0] as usize;
            let on_dev = p.program[eo].placement == Placement::Gpu;
            assert_eq!(l.space == DEVICE, on_dev, "{}", l.name);
        }
    }
    // Each space is laid out on its own, at its alignment.
    for (s, l) in p.lives.iter_enumerated() {
        if l.space == DEVICE {
            assert_eq!(p.offsets[s] % DEVICE_ALIGN, 0);
            assert!(p.offsets[s] + l.bytes <= p.space_bytes(DEVICE));
        } else {
            assert_eq!(l.space, SpaceId::HOST);
            assert!(p.offsets[s] + l.bytes <= p.arena_bytes);
        }
    }
    for sp in &p.spaces {
        assert_eq!((sp.space, sp.align), (DEVICE, DEVICE_ALIGN));
        assert!(sp.lower_bound <= sp.bytes);
    }
    assert!(p.lower_bound <= p.arena_bytes);
}

/// conv-bn-relu-pool, conv-relu-pool, linear on 8×8 (BatchNorm running statistics on either device).
fn cnn() -> crate::model::ModelSpec {
    random_model(
        &[
            (0, 2, true),
            (2, 0, true),
            (3, 0, true),
            (4, 0, true),
            (0, 2, true),
            (5, 0, true),
            (3, 0, true),
            (4, 1, true),
        ],
        1,
        8,
        1,
    )
}

/// Alternating devices, starting with `first`.
fn alternating(n: usize, first: Placement) -> Vec<Placement> {
    let other = |d| {
        if d == Placement::Cpu {
            Placement::Gpu
        } else {
            Placement::Cpu
        }
    };
    let mut d = first;
    (0..n)
        .map(|_| {
            let here = d;
            d = other(d);
            here
        })
        .collect()
}

#[test]
fn alternating_layers_train_bit_identically_with_moves_counted() {
    let g = Graph::new(&cnn(), 4).unwrap();
    let plain = Plan::new(g.clone());
    let want = train(&plain, CpuBackend::new(), 3, |_| {});
    for first in [Placement::Cpu, Placement::Gpu] {
        let devices = alternating(g.nodes.len(), first);
        let p = mixed(plain.clone(), &devices, space_of).unwrap();
        check_mixed(&p, &devices);
        let (moves, bytes) = move_volume(&p);
        assert!(moves > 0);
        let on_dev = p
            .program
            .iter()
            .filter(|i| i.placement == Placement::Gpu && i.phase != Phase::Move)
            .count();
        let got = train(&p, Dual::new(), 3, |d| {
            // Three steps run every move; evaluation and prediction the moves before the loss.
            assert!(d.moves >= 3 * moves, "{} of {moves}", d.moves);
            assert!(d.bytes_out + d.bytes_in >= 3 * bytes);
            assert!(d.on_device >= 3 * on_dev);
        });
        assert_eq!(got, want, "first layer on {first:?}");
    }
}

#[test]
fn all_on_the_device_moves_only_the_prediction_and_its_derivative() {
    let g = Graph::new(&cnn(), 4).unwrap();
    let plain = Plan::new(g.clone());
    let devices = vec![Placement::Gpu; g.nodes.len()];
    let p = mixed(plain.clone(), &devices, space_of).unwrap();
    check_mixed(&p, &devices);
    // The prediction moves to the host for the loss, dL/d(prediction) back to the last layer.
    let moved: Vec<TensorId> = p.program.iter().filter_map(|i| i.moved()).collect();
    assert_eq!(moved.len(), 2, "{moved:?}");
    assert_eq!(move_volume(&p).0, 2);
    let want = train(&plain, CpuBackend::new(), 2, |_| {});
    assert_eq!(train(&p, Dual::new(), 2, |_| {}), want);
    // All on the CPU: no move, the plan itself.
    let cpu = mixed(
        plain.clone(),
        &vec![Placement::Cpu; g.nodes.len()],
        space_of,
    )
    .unwrap();
    assert_eq!(cpu.program, plain.program);
    assert!(cpu.spaces.is_empty());
    assert_eq!(cpu.arena_bytes, plain.arena_bytes);
}

#[test]
fn a_mixed_plan_round_trips_through_the_plan_format() {
    let spec = cnn();
    let g = Graph::new(&spec, 4).unwrap();
    let devices = alternating(g.nodes.len(), Placement::Gpu);
    let p = mixed(Plan::new(g), &devices, space_of).unwrap();
    let (_, q) = decode_plan(&encode_plan(&spec, &p)).unwrap();
    assert_eq!(q.program, p.program, "placements and moves");
    assert_eq!(q.lives, p.lives);
    assert_eq!(q.offsets, p.offsets);
    assert_eq!(q.spaces, p.spaces);
    assert_eq!(
        (q.arena_bytes, q.lower_bound),
        (p.arena_bytes, p.lower_bound)
    );
    assert_eq!(
        train(&q, Dual::new(), 2, |_| {}),
        train(&p, Dual::new(), 2, |_| {})
    );
}

#[test]
fn budgets_hold_per_space() {
    let g = Graph::new(&cnn(), 4).unwrap();
    let devices = alternating(g.nodes.len(), Placement::Cpu);
    let p = mixed(Plan::new(g), &devices, space_of).unwrap();
    let dev = p.space_bytes(DEVICE);
    assert!(dev > 0 && p.arena_bytes > 0);
    let host = (SpaceId::HOST, Budget::new(p.needed_bytes()));
    assert!(p.check_budgets(&[host, (DEVICE, Budget::new(dev))]).is_ok());
    assert_eq!(
        p.check_budgets(&[host, (DEVICE, Budget::new(dev - 1))]),
        Err(BudgetError::TooSmall {
            needed: dev,
            given: dev - 1
        })
    );
    let short = (SpaceId::HOST, Budget::new(p.needed_bytes() - 1));
    assert!(p
        .check_budgets(&[short, (DEVICE, Budget::new(usize::MAX))])
        .is_err());
    // The run itself stays inside them: `train` gives the executor exactly `needed_bytes` of arena
    // and the device exactly its space's bytes (an access beyond either is an error).
    train(&p, Dual::new(), 1, |_| {});
}

/// Every persistent tensor of `ex`'s plan, bit for bit; `params_only` leaves out the running statistics.
fn state<B: Backend>(
    ex: &mut Executor<'_, B>,
    arena: &mut [u8],
    params_only: bool,
) -> Vec<Vec<u32>> {
    let stats: Vec<TensorId> = ex
        .plan()
        .graph
        .nodes
        .iter()
        .flat_map(|n| n.stats.clone())
        .collect();
    let ts: Vec<_> = ex
        .state_tensors()
        .map(|s| s.2)
        .filter(|t| !(params_only && stats.contains(t)))
        .collect();
    ts.iter()
        .map(|&t| {
            ex.read_vec(arena, t)
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect()
}

/// One good step, a step whose forward overflows, one good step: the overflowing step is rejected
/// with the parameters unchanged; returns the state after each step.
fn overflow_run<B: Backend>(p: &Plan, backend: B) -> Vec<Vec<Vec<u32>>> {
    let mut arena = vec![0u8; p.needed_bytes()];
    let mut ex = Executor::with_backend(p, &arena, backend).unwrap();
    ex.init_params(&mut arena, 9).unwrap();
    let per = p.graph.input_dims.numel();
    let x: Vec<f32> = (0..4 * per).map(|i| (i % 7) as f32 * 0.1).collect();
    let y = vec![0u32, 1, 2, 0];
    ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
    let before = state(&mut ex, &mut arena, true);
    let mut out = vec![state(&mut ex, &mut arena, false)];
    // Finite inputs so large that the forward overflows: the loss is not finite.
    let huge = vec![3.0e38f32; 4 * per];
    assert_eq!(
        ex.train_step(&mut arena, &huge, Target::Classes(&y)),
        Err(ExecError::NonFinite("the loss"))
    );
    assert_eq!(
        state(&mut ex, &mut arena, true),
        before,
        "parameters and optimizer state"
    );
    out.push(state(&mut ex, &mut arena, false));
    // The next finite step trains (nothing was left half-done).
    ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
    assert_ne!(state(&mut ex, &mut arena, true), before);
    out.push(state(&mut ex, &mut arena, false));
    out
}

/// The loss runs on the CPU before any update of either device, so a rejected step leaves the
/// parameters and optimizer state unchanged on both; everything (running statistics included, which
/// the CPU's forward updates before the loss is known — as in the all-CPU plan) matches the all-CPU
/// plan's run.
#[test]
fn a_non_finite_loss_leaves_both_devices_unchanged() {
    let g = Graph::new(&cnn(), 4).unwrap();
    let plain = Plan::new(g.clone());
    let want = overflow_run(&plain, CpuBackend::new());
    for first in [Placement::Cpu, Placement::Gpu] {
        let devices = alternating(g.nodes.len(), first);
        let p = mixed(plain.clone(), &devices, space_of).unwrap();
        assert_eq!(overflow_run(&p, Dual::new()), want);
    }
}

#[test]
fn what_a_mixed_plan_refuses_is_a_typed_error() {
    let g = Graph::new(&cnn(), 4).unwrap();
    let plain = Plan::new(g.clone());
    let n = g.nodes.len();
    assert_eq!(
        mixed(plain.clone(), &vec![Placement::Cpu; n - 1], space_of).map(|_| ()),
        Err(MixedError::Nodes {
            given: n - 1,
            nodes: n
        })
    );
    assert_eq!(
        mixed(plain.clone(), &vec![Placement::Dsp; n], space_of).map(|_| ()),
        Err(MixedError::NoSpace(Placement::Dsp))
    );
    // A device that claims the host arena is refused too.
    assert_eq!(
        mixed(plain.clone(), &vec![Placement::Gpu; n], |_| Some((
            SpaceId::HOST,
            64
        )))
        .map(|_| ()),
        Err(MixedError::NoSpace(Placement::Gpu))
    );
    let parked = offload(&g, DEVICE, DEVICE_ALIGN, |_, _| true);
    assert!(matches!(
        mixed(parked, &vec![Placement::Gpu; n], space_of),
        Err(MixedError::Unsupported {
            phase: Phase::Move,
            ..
        })
    ));
    // The CPU backend alone refuses a mixed plan when the executor is created.
    let p = mixed(plain, &alternating(n, Placement::Cpu), space_of).unwrap();
    let arena = vec![0u8; p.needed_bytes()];
    assert!(matches!(
        Executor::new(&p, &arena).map(|_| ()),
        Err(ExecError::Placement(Placement::Gpu))
    ));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random models (convolutions, BatchNorm, activations, pooling, residual adds, dropout), one or
    /// two micro-batches, random devices per node: bit-identical to the all-CPU plan over three steps,
    /// an evaluation and a prediction.
    #[test]
    fn random_placements_train_bit_identically(
        choices in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<bool>()), 1..10),
        c0 in 1u32..4, hw in 2u32..7, batch in 2usize..5, opt in any::<u8>(),
        micro in 1u16..3, seed in any::<u64>(),
    ) {
        let spec = random_model(&choices, c0, hw, opt);
        let g = match Graph::new(&spec, batch) { Ok(g) => g, Err(_) => return Ok(()) };
        let plain = Plan::shaped(g.clone(), PlanShape { micro_batches: micro, in_place: true });
        let mut rng = crate::rng::Rng::new(seed);
        let devices: Vec<Placement> = (0..g.nodes.len())
            .map(|_| if rng.uniform(0.0, 1.0) < 0.5 { Placement::Cpu } else { Placement::Gpu })
            .collect();
        let p = mixed(plain.clone(), &devices, space_of).unwrap();
        check_mixed(&p, &devices);
        let want = train(&plain, CpuBackend::new(), 3, |_| {});
        prop_assert_eq!(train(&p, Dual::new(), 3, |_| {}), want);
    }
}
