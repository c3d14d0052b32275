//! A second memory space, end to end: a test backend owns "device memory" (a `Vec<u8>` at 256-byte
//! alignment), computes on host storages through the CPU backend and implements the planned moves by
//! copying between the arena and its memory. Activations moved there between their forward and backward
//! uses train bit-identically to the plain plan, every move goes through `MoveOps`, the plan format
//! carries the moves, budgets are checked per space, and the CPU backend refuses such a plan.
use alloc::vec;
use alloc::vec::Vec;

use super::*;
use crate::backend::{
    Backend, Cx, LayerOps, LossOps, LossOut, MoveOps, OptimOps, Placement, Region, StepStart,
};
use crate::budget::{Budget, BudgetError};
use crate::format::{decode_plan, encode_plan, FormatError};
use crate::graph::Graph;
use crate::plan::tests::random_model;
use crate::plan::{lower_bound, SpaceId, StorageId, TensorLife};
use crate::policy::spaces::{move_volume, offload};

/// The test's second space.
const DEVICE: SpaceId = SpaceId(1);
/// Its alignment (the host arena's is 64).
const DEVICE_ALIGN: usize = 256;

/// Owns [`DEVICE`]: memory of its own, sized from the plan's layout of that space when it is prepared.
struct Device {
    cpu: CpuBackend,
    mem: Vec<u8>,
    /// Offset of the first `DEVICE_ALIGN`-aligned byte of `mem`.
    base: usize,
    moves: usize,
    bytes_out: usize,
    bytes_in: usize,
}

impl Device {
    fn new() -> Self {
        Self {
            cpu: CpuBackend::new(),
            mem: Vec::new(),
            base: 0,
            moves: 0,
            bytes_out: 0,
            bytes_in: 0,
        }
    }

    fn region(&mut self, r: Region) -> Result<&mut [u8], ExecError> {
        if r.space != DEVICE {
            return Err(ExecError::Space(r.space.0));
        }
        let start = self.base + r.offset;
        self.mem
            .get_mut(start..start + r.bytes)
            .ok_or(ExecError::BadPlan("a move outside device memory"))
    }
}

fn host_part(host: &mut [u8], r: Region) -> Result<&mut [u8], ExecError> {
    let end = r
        .end()
        .ok_or(ExecError::BadPlan("a move outside the arena"))?;
    host.get_mut(r.offset..end)
        .ok_or(ExecError::BadPlan("a move outside the arena"))
}

impl LayerOps for Device {
    fn forward(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.cpu.forward(cx, host)
    }
    fn grad_w(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.cpu.grad_w(cx, host)
    }
    fn grad_x(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.cpu.grad_x(cx, host)
    }
}

impl LossOps for Device {
    fn loss(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        target: Target<'_>,
        norm: usize,
    ) -> Result<LossOut, ExecError> {
        self.cpu.loss(cx, host, target, norm)
    }
}

impl OptimOps for Device {
    fn apply(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.cpu.apply(cx, host)
    }
}

impl MoveOps for Device {
    fn convert_half(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.cpu.convert_half(cx, host)
    }
    fn move_between(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        from: Region,
        to: Region,
    ) -> Result<(), ExecError> {
        self.moves += 1;
        match (from.space == SpaceId::HOST, to.space == SpaceId::HOST) {
            (true, true) => self.cpu.move_between(cx, host, from, to),
            (true, false) => {
                self.region(to)?.copy_from_slice(host_part(host, from)?);
                self.bytes_out += from.bytes;
                Ok(())
            }
            (false, true) => {
                host_part(host, to)?.copy_from_slice(self.region(from)?);
                self.bytes_in += from.bytes;
                Ok(())
            }
            (false, false) => Err(ExecError::BadPlan("a move within device memory")),
        }
    }
}

impl Backend for Device {
    fn name(&self) -> &'static str {
        "device (test)"
    }
    fn serves(&self, p: Placement) -> bool {
        p == Placement::Cpu
    }
    /// Checks placements and spaces (only [`DEVICE`], at a multiple of its alignment, touched by moves
    /// only: it computes on the host), then sizes its memory.
    fn prepare(&mut self, plan: &Plan) -> Result<(), ExecError> {
        if let Some(i) = plan.program.iter().find(|i| !self.serves(i.placement)) {
            return Err(ExecError::Placement(i.placement));
        }
        for sp in &plan.spaces {
            if sp.space != DEVICE {
                return Err(ExecError::Space(sp.space.0));
            }
            if sp.align % DEVICE_ALIGN != 0 {
                return Err(ExecError::BadPlan("device storages below its alignment"));
            }
        }
        for (s, l) in plan.lives.iter_enumerated() {
            let moved_only = plan.touches[s]
                .iter()
                .all(|&eo| plan.program[eo as usize].phase == Phase::Move);
            if l.space != SpaceId::HOST && !moved_only {
                return Err(ExecError::BadPlan("compute on a device storage"));
            }
        }
        self.mem = vec![0xA5; plan.space_bytes(DEVICE) + DEVICE_ALIGN - 1];
        self.base = self.mem.as_ptr().align_offset(DEVICE_ALIGN);
        self.cpu.prepare(&host_only(plan))
    }
    fn begin_step(&mut self, plan: &Plan, step: &StepStart<'_>) -> Result<(), ExecError> {
        self.cpu.begin_step(plan, step)
    }
    fn end_step(&mut self, plan: &Plan) -> Result<Option<crate::backend::LossOut>, ExecError> {
        self.cpu.end_step(plan)
    }
    fn init_params(&mut self, plan: &Plan, host: &mut [u8], seed: u64) -> Result<(), ExecError> {
        self.cpu.init_params(plan, host, seed)
    }
}

/// `plan` without its other spaces: what the inner CPU backend is prepared with (it only ever sees host
/// storages).
fn host_only(plan: &Plan) -> Plan {
    let mut p = plan.clone();
    p.spaces.clear();
    p
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

/// Three steps of `p` on `backend` in an arena of exactly `p.needed_bytes()`: the losses and every
/// weight, bit for bit; `done` sees the backend afterwards.
fn train<B: Backend>(p: &Plan, backend: B, done: impl FnOnce(&B)) -> Vec<u32> {
    let mut arena = vec![0u8; p.needed_bytes()];
    let mut ex = Executor::with_backend(p, &arena, backend).unwrap();
    ex.init_params(&mut arena, 9).unwrap();
    let per = p.graph.input_dims.numel();
    let mut rng = crate::rng::Rng::new(3);
    let x: Vec<f32> = (0..8 * per).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let y: Vec<u32> = (0..8).map(|i| (i % 3) as u32).collect();
    let mut out = Vec::new();
    for _ in 0..3 {
        let st = ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
        out.push(st.loss.to_bits());
    }
    for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
        out.extend(ex.read(&mut arena, t).unwrap().iter().map(|v| v.to_bits()));
    }
    done(ex.backend());
    out
}

/// Every other saved activation (a plan that moves some, not all).
fn every_other() -> impl FnMut(crate::graph::TensorId, usize) -> bool {
    let mut k = 0;
    move |_, _| {
        k += 1;
        k % 2 == 1
    }
}

#[test]
fn activations_moved_to_a_second_space_train_bit_identically() {
    let g = Graph::new(&cnn(), 8).unwrap();
    let plain = Plan::new(g.clone());
    let want = train(&plain, CpuBackend::new(), |_| {});
    let all = offload(&g, DEVICE, DEVICE_ALIGN, |_, _| true);
    let some = offload(&g, DEVICE, DEVICE_ALIGN, every_other());
    assert!(move_volume(&some).0 < move_volume(&all).0);
    for p in [&all, &some] {
        let (moves, bytes) = move_volume(p);
        assert!(moves >= 2 && moves % 2 == 0, "{moves} moves");
        assert_eq!(
            moves,
            p.program.iter().filter(|i| i.phase == Phase::Move).count()
        );
        // The host arena shrinks by what left it; the device space has its own size and lower bound.
        assert!(p.arena_bytes < plain.arena_bytes);
        assert!(p.arena_bytes >= p.lower_bound);
        let [sp] = p.spaces[..] else {
            panic!("one other space: {:?}", p.spaces)
        };
        assert_eq!((sp.space, sp.align), (DEVICE, DEVICE_ALIGN));
        let on_device: Vec<StorageId> = (p.lives.ids())
            .filter(|&s| p.lives[s].space == DEVICE)
            .collect();
        assert_eq!(
            on_device.len(),
            moves / 2,
            "one device storage per round trip"
        );
        let own: Vec<TensorLife> = on_device
            .iter()
            .map(|&s| {
                let mut l = p.lives[s].clone();
                l.bytes = l.bytes.next_multiple_of(DEVICE_ALIGN);
                l
            })
            .collect();
        assert_eq!(sp.lower_bound, lower_bound(&own));
        assert!(sp.lower_bound > 0 && sp.bytes >= sp.lower_bound);
        for &s in &on_device {
            assert_eq!(p.offsets[s] % DEVICE_ALIGN, 0);
            assert!(p.offsets[s] + p.lives[s].bytes <= sp.bytes);
            // Touched by its two moves only: out after the forward use, back before the backward use.
            assert_eq!(p.touches[s].len(), 2);
        }
        // Each move ends one storage and begins the next, in the other space: both live at the move.
        let loss = p
            .program
            .iter()
            .position(|i| i.phase == Phase::Loss)
            .unwrap() as Eo;
        for eo in (0..p.n_eo()).filter(|&e| p.program[e as usize].phase == Phase::Move) {
            let (from, to) = p.move_storages(eo).unwrap();
            let (a, b) = (&p.lives[from], &p.lives[to]);
            assert_eq!((a.last, b.first), (eo, eo));
            assert_eq!(a.bytes, b.bytes);
            let out = eo < loss;
            assert_eq!((a.space, b.space) == (SpaceId::HOST, DEVICE), out);
            assert_eq!((a.space, b.space) == (DEVICE, SpaceId::HOST), !out);
            // The host arena holds no range of a value that waits on the device.
            let t = p.program[eo as usize].moved().unwrap();
            assert_eq!(p.region_at(t, eo).is_none(), out);
        }
        // Training through the device backend: bit for bit the plain plan's; every move through MoveOps.
        let got = train(p, Device::new(), |d| {
            assert_eq!(d.moves, 3 * moves);
            assert_eq!(d.bytes_out, d.bytes_in);
            assert_eq!(d.bytes_out + d.bytes_in, 3 * bytes);
        });
        assert_eq!(got, want);
    }
}

#[test]
fn moves_within_the_host_arena_run_on_the_cpu_backend() {
    let g = Graph::new(&cnn(), 8).unwrap();
    let want = train(&Plan::new(g.clone()), CpuBackend::new(), |_| {});
    let p = offload(&g, SpaceId::HOST, 64, |_, _| true);
    assert!(p.spaces.is_empty());
    assert!(move_volume(&p).0 > 0);
    assert_eq!(train(&p, CpuBackend::new(), |_| {}), want);
    // The device backend runs it too: host-to-host moves go through its MoveOps to the CPU's default.
    let moves = move_volume(&p).0;
    let got = train(&p, Device::new(), |d| assert_eq!(d.moves, 3 * moves));
    assert_eq!(got, want);
}

#[test]
fn a_plan_with_a_second_space_round_trips_and_is_refused_where_no_backend_owns_it() {
    let spec = cnn();
    let g = Graph::new(&spec, 8).unwrap();
    let p = offload(&g, DEVICE, DEVICE_ALIGN, every_other());
    let (_, q) = decode_plan(&encode_plan(&spec, &p)).unwrap();
    assert_eq!(q.program, p.program);
    assert_eq!(q.lives, p.lives);
    assert_eq!(q.offsets, p.offsets);
    assert_eq!(q.spaces, p.spaces);
    assert_eq!(
        (q.arena_bytes, q.lower_bound),
        (p.arena_bytes, p.lower_bound)
    );
    assert_eq!(
        train(&q, Device::new(), |_| {}),
        train(&p, Device::new(), |_| {})
    );
    // The CPU backend owns no space but the host's.
    let arena = vec![0u8; p.needed_bytes()];
    assert!(matches!(
        Executor::new(&p, &arena).map(|_| ()),
        Err(ExecError::Space(1))
    ));
    // Nor does the device backend own space 2.
    let mut other = p.clone();
    other.spaces[0].space = SpaceId(2);
    assert!(matches!(
        Executor::with_backend(&other, &arena, Device::new()).map(|_| ()),
        Err(ExecError::Space(2))
    ));
}

#[test]
fn budgets_cover_each_space_on_its_own() {
    let g = Graph::new(&cnn(), 8).unwrap();
    let plain = Plan::new(g.clone());
    let p = offload(&g, DEVICE, DEVICE_ALIGN, |_, _| true);
    let sp = p.spaces[0];
    // A host budget the plain plan overflows fits once activations wait on the device.
    let host = (SpaceId::HOST, Budget::new(p.needed_bytes()));
    assert!(plain.check_budget(host.1).is_err());
    assert!(p.check_budgets(&[host]).is_ok());
    assert!(p
        .check_budgets(&[host, (DEVICE, Budget::new(sp.bytes))])
        .is_ok());
    assert_eq!(
        p.check_budgets(&[host, (DEVICE, Budget::new(sp.bytes - 1))]),
        Err(BudgetError::TooSmall {
            needed: sp.bytes,
            given: sp.bytes - 1
        })
    );
    // Device bytes never pay for host bytes.
    let short = (SpaceId::HOST, Budget::new(p.needed_bytes() - 1));
    assert!(p
        .check_budgets(&[short, (DEVICE, Budget::new(usize::MAX))])
        .is_err());
}

#[test]
fn a_move_with_nothing_to_move_is_an_error_not_a_panic() {
    let spec = cnn();
    let g = Graph::new(&spec, 8).unwrap();
    let plain = Plan::new(g.clone());
    // A move of the first layer's output before anything wrote it.
    let t = g.nodes[0].out;
    let mut program = plain.program.clone();
    program.insert(0, Instr::move_of(t).unwrap());
    let bad = Plan::from_program(g.clone(), 1, program, plain.roots.clone());
    assert_eq!(bad.move_storages(0), None);
    match decode_plan(&encode_plan(&spec, &bad)) {
        Err(FormatError::BadValue { reason, .. }) => {
            assert_eq!(reason, "a move of a tensor that holds no value before it")
        }
        other => panic!("decoded a move of nothing: {:?}", other.map(|_| ())),
    }
    let mut arena = vec![0u8; bad.needed_bytes()];
    let mut ex = Executor::new(&bad, &arena).unwrap();
    ex.init_params(&mut arena, 9).unwrap();
    let x = vec![0.5f32; 8 * g.input_dims.numel()];
    let y = vec![0u32; 8];
    assert!(matches!(
        ex.train_step(&mut arena, &x, Target::Classes(&y)),
        Err(ExecError::BadPlan(_))
    ));
    // A move naming a weight is no plan either.
    let p = offload(&g, DEVICE, DEVICE_ALIGN, |_, _| true);
    let mut weight = p.clone();
    let i = weight
        .program
        .iter()
        .position(|i| i.phase == Phase::Move)
        .unwrap();
    weight.program[i].node = g.nodes[0].params[0].value as u16;
    assert!(decode_plan(&encode_plan(&spec, &weight)).is_err());
}
