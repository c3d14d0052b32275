//! [`DspBackend`]: an int8 plan's instructions placed on [`Placement::Dsp`] run their heavy kernels
//! (the GEMMs of Linear and convolution forwards, weight gradients and input derivatives; tensor
//! rescales; max-pool and its backward; input quantisation) on the DSP, and instructions placed on
//! [`Placement::Cpu`] run on the CPU int8 backend — one plan, mixed placements, the same bits.
//!
//! How: the integer bookkeeping (exponents, rescale sites, batch splitting) stays in
//! [`CpuInt8`]; around a DSP instruction the backend installs its DSP as the int8 kernels'
//! [`offload`] hook, so every product, rescale, pooling and
//! (with a planned space) im2col of that instruction goes to the DSP, bit-exact with the CPU (the
//! conformance suite). Loss and updates run on the host's CPU wherever they are placed.
//!
//! Memory, two ways:
//!
//! - [`DspBackend::new`]: a plan whose storages all live in the host arena (placements set per
//!   instruction); the transport copies every call's operands and results.
//! - [`DspBackend::planned`] with a [`DspPlan`]: the DSP-placed nodes' storages (weights, their
//!   gradients and optimizer state, activations passed between DSP nodes, scratch) live in
//!   [`DSP_SPACE`], laid out by the planner with their own lifetimes; values crossing CPU ↔ DSP move
//!   through the plan's `Phase::Move`s. `prepare` (once per plan) allocates the host's mirror of the
//!   space and has the skel map the DSP's copy (`PREPARE`; a new plan maps a new one and frees the
//!   old). The DSP side of an instruction runs as a second [`CpuInt8`] on the plan's DSP view and the
//!   mirror (the integer state handed between the two when the side changes); its kernels run on the
//!   DSP's copy (`IN_SPACE`), and only the bytes the DSP does not hold yet travel (`crate::space`).
//!   A move in copies into the mirror, a move out from it (the DSP's outputs came back with their
//!   calls); a DSP-placed update changes the mirror's weights, which reach the DSP at their next use.
//!
//! The DSP session, the staging buffers and the space are set up once per plan in
//! [`Backend::prepare`] ([`DspBackend::preparations`]); a step sets up and allocates nothing.
//!
//! Faults: a DSP that dies, answers garbage or does not answer within the transport's time-out
//! ([`QemuHexagon::timeout`](crate::QemuHexagon::timeout)) mid-step fails the step with
//! [`ExecError::Device`] (details in [`DspBackend::last_error`]); the persistent bytes (weights,
//! optimizer state — in the arena and the mirror) and the integer state, saved at the step's first
//! instruction, are put back, and the next step starts a fresh DSP (its space mapped again).
use std::cell::RefCell;
use std::rc::Rc;

use frugal_core::backend::{
    check_placements, Backend, CpuInt8, Cx, ExecError, Int8State, LayerOps, LossOps, LossOut,
    MoveOps, OptimOps, Placement, Region, StepStart, Target,
};
use frugal_core::graph::TensorId;
use frugal_core::kernels::int8::{offload, MatRef, Rounding};
use frugal_core::plan::{Plan, SpaceId, ALIGN};
use frugal_core::policy::mixed::{device_view, host_view, mixed, MixedError};

use crate::dsp::{Calls, Dsp};
use crate::error::DspError;
use crate::space::Resident;
use crate::transport::Transport;

/// The DSP's memory space in a [`DspPlan`].
pub const DSP_SPACE: SpaceId = SpaceId(2);
/// Its alignment (one HVX vector).
pub const DSP_ALIGN: usize = 128;
/// Where the DSP's view of a plan puts the host's storages (a space nobody serves).
const OUT_OF_REACH: SpaceId = SpaceId(0xEE);

/// An int8 plan with a planned DSP space: the nodes placed on [`Placement::Dsp`] keep their
/// storages (weights, gradients, optimizer state, activations passed between DSP nodes, scratch) in
/// [`DSP_SPACE`], laid out with their own lifetimes; values crossing CPU ↔ DSP move through planned
/// [`Phase::Move`](frugal_core::plan::Phase::Move)s (`frugal_core::policy::mixed`). The loss runs on
/// the CPU. Built once per plan (a budget change plans again and builds a new one).
pub struct DspPlan {
    /// The plan the executor runs.
    pub plan: Plan,
    /// The same plan as the DSP side sees it: its space is the arena.
    view: Plan,
}

impl DspPlan {
    /// `base` (an int8 plan: plain, micro-batched or recomputing) with node `i` on `nodes[i]`
    /// (`Cpu` or `Dsp`).
    pub fn new(base: Plan, nodes: &[Placement]) -> Result<Self, MixedError> {
        let plan = mixed(base, nodes, |d| {
            (d == Placement::Dsp).then_some((DSP_SPACE, DSP_ALIGN))
        })?;
        let view = device_view(&plan, DSP_SPACE, OUT_OF_REACH);
        Ok(Self { plan, view })
    }

    /// Bytes of the DSP space (what the skel maps once per plan).
    pub fn space_bytes(&self) -> usize {
        self.plan.space_bytes(DSP_SPACE)
    }
}

/// The DSP as the int8 kernels' offload: a failed call is remembered and declined (the CPU finishes
/// the kernel; the backend then rejects the step).
struct Hook<T: Transport> {
    dsp: Dsp<T>,
    error: Option<DspError>,
    cbuf: Vec<i32>,
    space: Resident,
}

impl<T: Transport> Hook<T> {
    fn run<R>(
        &mut self,
        f: impl FnOnce(&mut Dsp<T>, &mut Vec<i32>, &mut Resident) -> Result<R, DspError>,
    ) -> Option<R> {
        if self.error.is_some() {
            return None;
        }
        match f(&mut self.dsp, &mut self.cbuf, &mut self.space) {
            Ok(r) => Some(r),
            Err(e) => {
                // The transport dropped the DSP process: its space is gone with it.
                self.space.ready = false;
                self.error = Some(e);
                None
            }
        }
    }

    /// Maps the DSP space (once per plan, and again after a DSP restart).
    fn prepare_space(&mut self) -> Result<(), DspError> {
        let bytes = self.space.shadow.len();
        self.space.prepared = self.dsp.prepare_space(bytes)?;
        self.space.shadow.fill(0);
        self.space.ready = true;
        Ok(())
    }
}

/// The hook installed on the thread: the shared DSP.
struct Shared<T: Transport>(Rc<RefCell<Hook<T>>>);

impl<T: Transport> offload::Offload for Shared<T> {
    fn igemm(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<'_, i8>,
        b: MatRef<'_, i8>,
        c: &mut [i32],
        ldc: usize,
        accumulate: bool,
    ) -> bool {
        self.0
            .borrow_mut()
            .run(
                |d, cb, sp| match sp.igemm(d, m, n, k, a, b, c, ldc, accumulate) {
                    Some(r) => r,
                    None => d.igemm(m, n, k, a, b, c, ldc, accumulate, cb),
                },
            )
            .is_some()
    }
    fn rescale(
        &mut self,
        src: &[i32],
        shift: u32,
        rounding: Rounding,
        offset: u64,
        dst: &mut [i8],
    ) -> Option<usize> {
        self.0.borrow_mut().run(
            |d, _, sp| match sp.rescale(d, src, shift, rounding, offset, dst) {
                Some(r) => r,
                None => d.rescale(src, shift, rounding, offset, dst),
            },
        )
    }
    fn maxpool2x2(
        &mut self,
        x: &[i8],
        w: usize,
        pairs: usize,
        y: &mut [i8],
        idx: &mut [u8],
    ) -> bool {
        self.0
            .borrow_mut()
            .run(|d, _, sp| match sp.maxpool2x2(d, x, w, pairs, y, idx) {
                Some(r) => r,
                None => d.maxpool2x2(x, w, pairs, y, idx),
            })
            .is_some()
    }
    fn maxpool2x2_grad(
        &mut self,
        dy: &[i8],
        idx: &[u8],
        w: usize,
        pairs: usize,
        dx: &mut [i8],
    ) -> bool {
        self.0
            .borrow_mut()
            .run(
                |d, _, sp| match sp.maxpool2x2_grad(d, dy, idx, w, pairs, dx) {
                    Some(r) => r,
                    None => d.maxpool2x2_grad(dy, idx, w, pairs, dx),
                },
            )
            .is_some()
    }
    fn quantize(&mut self, src: &[f32], k: f32, dst: &mut [i8]) -> bool {
        self.0
            .borrow_mut()
            .run(|d, _, _| d.quantize(src, k, dst))
            .is_some()
    }
    fn im2col(
        &mut self,
        geom: [usize; 13],
        x: &[i8],
        samples: usize,
        grp: usize,
        cols: &mut [i8],
        ld: usize,
    ) -> bool {
        self.0.borrow_mut().run(
            |d, _, sp| match sp.im2col(d, geom, x, samples, grp, cols, ld) {
                Some(r) => r.map(|()| true),
                // Not worth a call without a DSP space: the columns (kh·kw times the input) would
                // come back only to be sent again with the GEMM.
                None => Ok(false),
            },
        ) == Some(true)
    }
}

/// Puts the hook back into its slot when the instruction returns (or unwinds).
struct Installed<'a>(&'a mut Option<Box<dyn offload::Offload>>);

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        *self.0 = offload::take();
    }
}

/// The DSP side of a [`DspPlan`]: the CPU int8 backend over the DSP's view of the plan and the
/// host's mirror of the DSP space it computes on.
struct DeviceSide<'p> {
    int8: CpuInt8<'p>,
    view: &'p Plan,
    mem: Vec<u8>,
    base: usize,
}

impl DeviceSide<'_> {
    fn mem(&mut self) -> &mut [u8] {
        let n = self.view.arena_bytes;
        &mut self.mem[self.base..self.base + n]
    }
}

/// Where a persistent tensor's bytes are.
#[derive(Clone, Copy)]
enum At {
    Host(usize, usize),
    Dsp(usize, usize),
}

/// The Hexagon DSP backend for int8 plans (see the module documentation).
pub struct DspBackend<'p, T: Transport + 'static> {
    inner: CpuInt8<'p>,
    /// With a planned DSP space: its side.
    dev: Option<DeviceSide<'p>>,
    /// The DSP side holds the current integer state (exponents, rescale sites), else `inner`.
    on_dev: bool,
    xfer: Int8State,
    shared: Rc<RefCell<Hook<T>>>,
    /// The boxed hook, made once; moved into the thread's slot around each DSP instruction.
    hook: Option<Box<dyn offload::Offload>>,
    /// Persistent tensors (weights, optimizer state).
    persist: Vec<At>,
    saved: Vec<u8>,
    state: Int8State,
    snapshot_due: bool,
    /// The current step trains (its first instruction saved the weights).
    training: bool,
    last_error: Option<DspError>,
    /// DSP set-ups (session start, staging buffers, the DSP space): once per plan, never per step
    /// (again only after a DSP failure).
    pub preparations: u64,
    /// Steps rejected because the DSP failed.
    pub faults: u64,
}

impl<'p, T: Transport + 'static> DspBackend<'p, T> {
    fn build(plan: &'p Plan, dev: Option<DeviceSide<'p>>, transport: T) -> Result<Self, ExecError> {
        let shared = Rc::new(RefCell::new(Hook {
            dsp: Dsp::new(transport),
            error: None,
            cbuf: Vec::new(),
            space: Resident::default(),
        }));
        let hook: Box<dyn offload::Offload> = Box::new(Shared(shared.clone()));
        Ok(Self {
            inner: CpuInt8::new(plan)?,
            dev,
            on_dev: false,
            xfer: Int8State::default(),
            shared,
            hook: Some(hook),
            persist: Vec::new(),
            saved: Vec::new(),
            state: Int8State::default(),
            snapshot_due: false,
            training: false,
            last_error: None,
            preparations: 0,
            faults: 0,
        })
    }

    /// The backend for int8 `plan` (instructions placed on `Cpu` or `Dsp`, every storage in the host
    /// arena) over `transport`: each DSP call sends its operands (no DSP space).
    pub fn new(plan: &'p Plan, transport: T) -> Result<Self, ExecError> {
        Self::build(plan, None, transport)
    }

    /// The backend for `plan`'s [`DspPlan::plan`] with its planned DSP space.
    pub fn planned(plan: &'p DspPlan, transport: T) -> Result<Self, ExecError> {
        let dev = DeviceSide {
            int8: CpuInt8::new(&plan.view)?,
            view: &plan.view,
            mem: Vec::new(),
            base: 0,
        };
        Self::build(&plan.plan, Some(dev), transport)
    }

    /// The transport back (to hand the same DSP to the backend of the next plan).
    pub fn into_transport(mut self) -> Option<T> {
        self.hook = None;
        Rc::try_unwrap(self.shared)
            .ok()
            .map(|h| h.into_inner().dsp.transport)
    }

    /// The CPU int8 backend underneath (exponents, rescale sites).
    pub fn int8(&mut self) -> &mut CpuInt8<'p> {
        &mut self.inner
    }

    /// Why the last rejected step failed.
    pub fn last_error(&self) -> Option<&DspError> {
        self.last_error.as_ref()
    }

    /// Calls made to the DSP so far.
    pub fn calls(&self) -> Calls {
        self.shared.borrow().dsp.calls
    }

    /// Runs `f` on the transport (fault injection, counters).
    pub fn with_transport<R>(&mut self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.shared.borrow_mut().dsp.transport)
    }

    /// What the skel answered to the last preparation of the DSP space: (generation — preparations
    /// in its current process —, spaces it has mapped); `None` without a planned space.
    pub fn space_prepared(&self) -> Option<(u32, u32)> {
        let h = self.shared.borrow();
        (self.dev.is_some() && h.space.ready).then_some(h.space.prepared)
    }

    /// Checks that the DSP's space holds what the host's record of it says (a checksum of the whole
    /// space asked from the DSP); `Ok(bytes)` of the space.
    pub fn verify_space(&mut self) -> Result<usize, DspError> {
        let mut h = self.shared.borrow_mut();
        let (sum, bytes) = h.dsp.space_sum()?;
        let want = crate::proto::fnv(crate::proto::FNV_INIT, &h.space.shadow);
        if sum != want || bytes != h.space.shadow.len() {
            return Err(DspError::BadReply {
                op: "space checksum",
                what: "the DSP space differs from the host's record of it",
            });
        }
        Ok(bytes)
    }

    /// The persistent bytes (weights, optimizer state) in tensor order, wherever they live; `host` is
    /// the arena as the executor hands it to the backend (from its aligned start).
    pub fn persistent_bytes(&mut self, host: &[u8], out: &mut Vec<u8>) {
        out.clear();
        for &at in &self.persist {
            match at {
                At::Host(off, len) => out.extend_from_slice(&host[off..off + len]),
                At::Dsp(off, len) => {
                    if let Some(d) = self.dev.as_mut() {
                        out.extend_from_slice(&d.mem()[off..off + len]);
                    }
                }
            }
        }
    }

    /// The f32 values of tensor `t` (`len` of them) in the mirror of the DSP space.
    fn dsp_tensor(&mut self, t: TensorId, len: usize) -> Result<&mut [f32], ExecError> {
        let d = self.dev.as_mut().ok_or(ExecError::Tensor(
            "the tensor is in a memory space this backend does not own",
        ))?;
        let (off, bytes) = d
            .view
            .region(t)
            .ok_or(ExecError::Tensor("the tensor is in no memory space"))?;
        if bytes != 4 * len {
            return Err(ExecError::Tensor("the tensor's length differs"));
        }
        frugal_core::backend::arena::f32s(&mut d.mem()[off..off + bytes])
    }

    /// Moves the integer state to the side that runs next (the DSP side or the CPU).
    fn use_side(&mut self, dev: bool) {
        let Some(d) = self.dev.as_mut() else {
            return;
        };
        if self.on_dev == dev {
            return;
        }
        if dev {
            self.inner.save_state(&mut self.xfer);
            d.int8.restore_state(&self.xfer);
        } else {
            d.int8.save_state(&mut self.xfer);
            self.inner.restore_state(&self.xfer);
        }
        self.on_dev = dev;
    }

    fn snapshot(&mut self, host: &[u8]) {
        if !self.snapshot_due {
            return;
        }
        self.snapshot_due = false;
        let mut at = 0;
        for &p in &self.persist {
            let src = match (p, self.dev.as_mut()) {
                (At::Host(off, len), _) => &host[off..off + len],
                (At::Dsp(off, len), Some(d)) => &d.mem()[off..off + len],
                (At::Dsp(..), None) => continue,
            };
            self.saved[at..at + src.len()].copy_from_slice(src);
            at += src.len();
        }
        match (self.on_dev, self.dev.as_ref()) {
            (true, Some(d)) => d.int8.save_state(&mut self.state),
            _ => self.inner.save_state(&mut self.state),
        }
    }

    fn rollback(&mut self, host: &mut [u8]) {
        let mut at = 0;
        for &p in &self.persist {
            let dst = match (p, self.dev.as_mut()) {
                (At::Host(off, len), _) => &mut host[off..off + len],
                (At::Dsp(off, len), Some(d)) => &mut d.mem()[off..off + len],
                (At::Dsp(..), None) => continue,
            };
            let n = dst.len();
            dst.copy_from_slice(&self.saved[at..at + n]);
            at += n;
        }
        self.inner.restore_state(&self.state);
        if let Some(d) = self.dev.as_mut() {
            d.int8.restore_state(&self.state);
        }
    }

    /// A DSP failure: counted, remembered, the step's weights put back; the executor's error.
    fn fail(&mut self, e: DspError, host: &mut [u8]) -> ExecError {
        self.faults += 1;
        let what = e.summary();
        self.last_error = Some(e);
        // A training step (its recomputing forwards included) puts the weights back; evaluation
        // and prediction changed none.
        if self.training {
            self.rollback(host);
        }
        ExecError::Device(what)
    }

    /// Runs `f` (an instruction of the CPU int8 backend) on the side `cx` is placed on: the CPU on the
    /// host arena, or the DSP — with its kernels offloaded (`kernels`) and, with a planned space, on
    /// the DSP side's view and mirror. A DSP failure rolls the step back.
    fn run(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        kernels: bool,
        f: impl FnOnce(&mut CpuInt8<'p>, &Cx<'_>, &mut [u8]) -> Result<(), ExecError>,
    ) -> Result<(), ExecError> {
        self.snapshot(host);
        let on_dsp = cx.ins.placement == Placement::Dsp;
        self.use_side(on_dsp && self.dev.is_some());
        if !on_dsp {
            return f(&mut self.inner, cx, host);
        }
        if self.dev.is_some() && kernels {
            let up = {
                let mut h = self.shared.borrow_mut();
                if h.space.ready {
                    Ok(())
                } else {
                    // After a DSP failure: a fresh process, its space mapped again.
                    self.preparations += 1;
                    h.prepare_space()
                }
            };
            if let Err(e) = up {
                return Err(self.fail(e, host));
            }
        }
        let r = {
            let slot = &mut self.hook;
            if kernels {
                if let Some(h) = slot.take() {
                    offload::install(h);
                }
            }
            let _back = kernels.then(|| Installed(slot));
            match self.dev.as_mut() {
                Some(d) => {
                    let view = d.view;
                    let n = view.arena_bytes;
                    let mem = &mut d.mem[d.base..d.base + n];
                    f(&mut d.int8, &Cx { plan: view, ..*cx }, mem)
                }
                None => f(&mut self.inner, cx, host),
            }
        };
        let failed = self.shared.borrow_mut().error.take();
        if let Some(e) = failed {
            return Err(self.fail(e, host));
        }
        r
    }
}

impl<T: Transport + 'static> LayerOps for DspBackend<'_, T> {
    fn forward(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.run(cx, host, true, |b, cx, h| b.forward(cx, h))
    }
    fn grad_w(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.run(cx, host, true, |b, cx, h| b.grad_w(cx, h))
    }
    fn grad_x(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.run(cx, host, true, |b, cx, h| b.grad_x(cx, h))
    }
}

impl<T: Transport + 'static> LossOps for DspBackend<'_, T> {
    /// The loss runs on the CPU wherever it is placed (a softmax in f32 arithmetic on int8 logits:
    /// not the DSP's kind of work; a [`DspPlan`] places it there).
    fn loss(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        target: Target<'_>,
        norm: usize,
    ) -> Result<LossOut, ExecError> {
        self.snapshot(host);
        if self.dev.is_some() && cx.ins.placement != Placement::Cpu {
            return Err(ExecError::Placement(cx.ins.placement));
        }
        self.use_side(false);
        self.inner.loss(cx, host, target, norm)
    }
}

impl<T: Transport + 'static> OptimOps for DspBackend<'_, T> {
    /// Updates run on the host's CPU wherever they are placed (the master weights are f32): a
    /// DSP-placed node's update on the mirror of the DSP space, whose changed weights reach the DSP
    /// at their next use.
    fn apply(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.run(cx, host, false, |b, cx, h| b.apply(cx, h))
    }
}

impl<T: Transport + 'static> MoveOps for DspBackend<'_, T> {
    fn convert_half(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.inner.convert_half(cx, host)
    }
    /// Host ↔ DSP space: the mirror is the host's side of the space, kept equal to the DSP's copy
    /// wherever the DSP reads (see `space`): a move in copies into the mirror (the bytes reach the
    /// DSP with the first kernel that reads them), a move out copies from it (the DSP's outputs came
    /// back with their calls).
    fn move_between(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        from: Region,
        to: Region,
    ) -> Result<(), ExecError> {
        self.snapshot(host);
        let bad = || ExecError::BadPlan("a move outside its memory space");
        let (Some(fe), Some(te)) = (from.end(), to.end()) else {
            return Err(bad());
        };
        match (from.space, to.space, self.dev.as_mut()) {
            (SpaceId::HOST, SpaceId::HOST, _) => self.inner.move_between(cx, host, from, to),
            (SpaceId::HOST, DSP_SPACE, Some(d)) => {
                let src = host.get(from.offset..fe).ok_or_else(bad)?;
                d.mem()
                    .get_mut(to.offset..te)
                    .ok_or_else(bad)?
                    .copy_from_slice(src);
                Ok(())
            }
            (DSP_SPACE, SpaceId::HOST, Some(d)) => {
                let src = d.mem().get(from.offset..fe).ok_or_else(bad)?;
                host.get_mut(to.offset..te)
                    .ok_or_else(bad)?
                    .copy_from_slice(src);
                Ok(())
            }
            (SpaceId::HOST, s, _) | (s, _, _) => Err(ExecError::Space(s.0)),
        }
    }
}

impl<T: Transport + 'static> Backend for DspBackend<'_, T> {
    fn name(&self) -> &'static str {
        "hexagon-dsp-int8"
    }
    fn serves(&self, p: Placement) -> bool {
        matches!(p, Placement::Cpu | Placement::Dsp)
    }
    fn prepare(&mut self, plan: &Plan) -> Result<(), ExecError> {
        if !core::ptr::eq(plan, self.inner.plan()) {
            return Err(ExecError::BadPlan(
                "the DSP backend was built for another plan",
            ));
        }
        match self.dev.as_mut() {
            None => check_placements(self, plan)?,
            Some(d) => {
                let served = |p: Placement| matches!(p, Placement::Cpu | Placement::Dsp);
                if let Some(i) = plan.program.iter().find(|i| !served(i.placement)) {
                    return Err(ExecError::Placement(i.placement));
                }
                if let Some(s) = plan.spaces.iter().find(|s| s.space != DSP_SPACE) {
                    return Err(ExecError::Space(s.space.0));
                }
                // The mirror of the DSP space, allocated once per plan: a second executor over the
                // same plan (`Executor::into_backend`) keeps it, the weights in it and the DSP's copy.
                if d.mem.is_empty() {
                    let n = d.view.arena_bytes;
                    d.mem.resize(n + ALIGN, 0);
                    d.base = d.mem.as_ptr().align_offset(ALIGN);
                    let base = d.mem()[..].as_ptr() as usize;
                    let mut h = self.shared.borrow_mut();
                    h.space = crate::space::Resident {
                        base,
                        len: n,
                        shadow: vec![0; n],
                        ready: false,
                        prepared: (0, 0),
                    };
                }
            }
        }
        self.persist.clear();
        for node in &plan.graph.nodes {
            for p in &node.params {
                for t in core::iter::once(p.value).chain(p.state.iter().copied()) {
                    let at = match (plan.region(t), &self.dev) {
                        (Some((off, len)), _) => At::Host(off, len),
                        (None, Some(d)) => {
                            let (off, len) = d
                                .view
                                .region(t)
                                .ok_or(ExecError::Tensor("a parameter is in no memory space"))?;
                            At::Dsp(off, len)
                        }
                        (None, None) => {
                            return Err(ExecError::Tensor("a parameter is not in the arena"))
                        }
                    };
                    self.persist.push(at);
                }
            }
        }
        let bytes = self
            .persist
            .iter()
            .map(|&a| match a {
                At::Host(_, l) | At::Dsp(_, l) => l,
            })
            .sum();
        self.saved.clear();
        self.saved.resize(bytes, 0);
        self.inner.save_state(&mut self.state);
        self.on_dev = false;
        if plan.program.iter().any(|i| i.placement == Placement::Dsp) {
            let mut h = self.shared.borrow_mut();
            let mut up = h
                .dsp
                .transport
                .restart()
                .and_then(|_| h.dsp.ping().map(|_| ()));
            if up.is_ok() && self.dev.is_some() && !h.space.ready {
                up = h.prepare_space();
            }
            if let Err(e) = up {
                let what = e.summary();
                drop(h);
                self.last_error = Some(e);
                return Err(ExecError::Device(what));
            }
        }
        self.preparations += 1;
        Ok(())
    }
    fn begin_step(&mut self, plan: &Plan, step: &StepStart<'_>) -> Result<(), ExecError> {
        self.snapshot_due = step.train;
        self.training = step.train;
        if let Some(d) = self.dev.as_mut() {
            d.int8.begin_step(d.view, step)?;
        }
        self.inner.begin_step(plan, step)
    }
    /// A persistent tensor in the DSP space, from the mirror (the DSP's copy holds the same bytes
    /// wherever it read them).
    fn read_tensor(&mut self, _: &Plan, t: TensorId, out: &mut [f32]) -> Result<(), ExecError> {
        out.copy_from_slice(self.dsp_tensor(t, out.len())?);
        Ok(())
    }
    /// Writes a persistent tensor in the DSP space into the mirror; the bytes reach the DSP with the
    /// first kernel that reads them.
    fn write_tensor(&mut self, _: &Plan, t: TensorId, data: &[f32]) -> Result<(), ExecError> {
        self.dsp_tensor(t, data.len())?.copy_from_slice(data);
        Ok(())
    }
    fn init_params(&mut self, plan: &Plan, host: &mut [u8], seed: u64) -> Result<(), ExecError> {
        let Some(d) = self.dev.as_mut() else {
            return self.inner.init_params(plan, host, seed);
        };
        // The all-CPU plan's values: initialised in one host view of both spaces, then split.
        let (all, base) = host_view(plan, DSP_SPACE);
        let mut both = vec![0u8; all.arena_bytes + ALIGN];
        let b = both.as_ptr().align_offset(ALIGN);
        let both = &mut both[b..b + all.arena_bytes];
        let mut init = CpuInt8::new(&all)?;
        init.init_params(&all, both, seed)?;
        host[..plan.arena_bytes].copy_from_slice(&both[..plan.arena_bytes]);
        d.mem().copy_from_slice(&both[base..]);
        init.save_state(&mut self.xfer);
        self.inner.restore_state(&self.xfer);
        d.int8.restore_state(&self.xfer);
        Ok(())
    }
}
