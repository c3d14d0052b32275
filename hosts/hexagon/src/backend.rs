//! [`DspBackend`]: an int8 plan's instructions placed on [`Placement::Dsp`] run their heavy kernels
//! (the GEMMs of Linear and convolution forwards, weight gradients and input derivatives; tensor
//! rescales; max-pool and its backward; input quantisation) on the DSP, and instructions placed on
//! [`Placement::Cpu`] run on the CPU int8 backend — one plan, mixed placements, the same bits.
//!
//! How: the integer bookkeeping (exponents, rescale sites, batch splitting) stays in
//! [`CpuInt8`]; around a DSP instruction the backend installs its DSP as the int8 kernels'
//! [`offload`](frugal_core::kernels::int8::offload) hook, so every product, rescale and pooling of
//! that instruction goes to the DSP, bit-exact with the CPU (the conformance suite).
//!
//! Memory: the DSP's operands stay in the host arena and the transport copies them per call (no
//! planned DSP space yet: the core's transform for mixed placements, which inserts moves where a
//! storage crosses devices, is not merged). The DSP session and the host's staging buffers are set up
//! once per plan in [`Backend::prepare`] ([`DspBackend::preparations`]); a step sets up nothing.
//! With a planned DSP space (`Plan::spaces`, as the GPU backend's), `prepare` would size the skel's
//! arena once and the moves would be the only copies.
//!
//! Faults: a DSP that dies or answers garbage mid-step fails the step with
//! [`ExecError::Device`] (details in [`DspBackend::last_error`]); the persistent bytes of the arena
//! (weights, optimizer state) and the integer state, saved at the step's first instruction, are put
//! back, and the next step starts a fresh DSP.
use std::cell::RefCell;
use std::rc::Rc;

use frugal_core::backend::{
    check_placements, Backend, CpuInt8, Cx, ExecError, Int8State, LayerOps, LossOps, LossOut,
    MoveOps, OptimOps, Placement, StepStart, Target,
};
use frugal_core::kernels::int8::{offload, MatRef, Rounding};
use frugal_core::plan::Plan;

use crate::dsp::{Calls, Dsp};
use crate::error::DspError;
use crate::transport::Transport;

/// The DSP as the int8 kernels' offload: a failed call is remembered and declined (the CPU finishes
/// the kernel; the backend then rejects the step).
struct Hook<T: Transport> {
    dsp: Dsp<T>,
    error: Option<DspError>,
    cbuf: Vec<i32>,
}

impl<T: Transport> Hook<T> {
    fn run<R>(
        &mut self,
        f: impl FnOnce(&mut Dsp<T>, &mut Vec<i32>) -> Result<R, DspError>,
    ) -> Option<R> {
        if self.error.is_some() {
            return None;
        }
        match f(&mut self.dsp, &mut self.cbuf) {
            Ok(r) => Some(r),
            Err(e) => {
                self.error = Some(e);
                None
            }
        }
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
            .run(|d, cb| d.igemm(m, n, k, a, b, c, ldc, accumulate, cb))
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
        self.0
            .borrow_mut()
            .run(|d, _| d.rescale(src, shift, rounding, offset, dst))
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
            .run(|d, _| d.maxpool2x2(x, w, pairs, y, idx))
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
            .run(|d, _| d.maxpool2x2_grad(dy, idx, w, pairs, dx))
            .is_some()
    }
    fn quantize(&mut self, src: &[f32], k: f32, dst: &mut [i8]) -> bool {
        self.0
            .borrow_mut()
            .run(|d, _| d.quantize(src, k, dst))
            .is_some()
    }
}

/// Puts the hook back into its slot when the instruction returns (or unwinds).
struct Installed<'a>(&'a mut Option<Box<dyn offload::Offload>>);

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        *self.0 = offload::take();
    }
}

/// The Hexagon DSP backend for int8 plans (see the module documentation).
pub struct DspBackend<'p, T: Transport + 'static> {
    inner: CpuInt8<'p>,
    shared: Rc<RefCell<Hook<T>>>,
    /// The boxed hook, made once; moved into the thread's slot around each DSP instruction.
    hook: Option<Box<dyn offload::Offload>>,
    /// Persistent regions of the host arena (weights, optimizer state): (offset, bytes).
    persist: Vec<(usize, usize)>,
    saved: Vec<u8>,
    state: Int8State,
    snapshot_due: bool,
    /// The current step trains (its first instruction saved the weights).
    training: bool,
    last_error: Option<DspError>,
    /// DSP set-ups (session start, staging buffers): once per plan, never per step.
    pub preparations: u64,
    /// Steps rejected because the DSP failed.
    pub faults: u64,
}

impl<'p, T: Transport + 'static> DspBackend<'p, T> {
    /// The backend for int8 `plan` over `transport`.
    pub fn new(plan: &'p Plan, transport: T) -> Result<Self, ExecError> {
        let shared = Rc::new(RefCell::new(Hook {
            dsp: Dsp::new(transport),
            error: None,
            cbuf: Vec::new(),
        }));
        let hook: Box<dyn offload::Offload> = Box::new(Shared(shared.clone()));
        Ok(Self {
            inner: CpuInt8::new(plan)?,
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

    fn snapshot(&mut self, host: &[u8]) {
        if !self.snapshot_due {
            return;
        }
        self.snapshot_due = false;
        let mut at = 0;
        for &(off, len) in &self.persist {
            self.saved[at..at + len].copy_from_slice(&host[off..off + len]);
            at += len;
        }
        self.inner.save_state(&mut self.state);
    }

    fn rollback(&mut self, host: &mut [u8]) {
        let mut at = 0;
        for &(off, len) in &self.persist {
            host[off..off + len].copy_from_slice(&self.saved[at..at + len]);
            at += len;
        }
        self.inner.restore_state(&self.state);
    }

    /// Runs `f` (an instruction of the CPU int8 backend) with the DSP as its kernels when `cx` is
    /// placed on the DSP; a DSP failure rolls the step back.
    fn run(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        f: impl FnOnce(&mut CpuInt8<'p>, &mut [u8]) -> Result<(), ExecError>,
    ) -> Result<(), ExecError> {
        self.snapshot(host);
        if cx.ins.placement != Placement::Dsp {
            return f(&mut self.inner, host);
        }
        let r = {
            let slot = &mut self.hook;
            if let Some(h) = slot.take() {
                offload::install(h);
            }
            let _back = Installed(slot);
            f(&mut self.inner, host)
        };
        let failed = self.shared.borrow_mut().error.take();
        if let Some(e) = failed {
            self.faults += 1;
            let what = e.summary();
            self.last_error = Some(e);
            // A training step (its recomputing forwards included) puts the weights back; evaluation
            // and prediction changed none.
            if self.training {
                self.rollback(host);
            }
            return Err(ExecError::Device(what));
        }
        r
    }
}

impl<T: Transport + 'static> LayerOps for DspBackend<'_, T> {
    fn forward(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.run(cx, host, |b, h| b.forward(cx, h))
    }
    fn grad_w(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.run(cx, host, |b, h| b.grad_w(cx, h))
    }
    fn grad_x(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.run(cx, host, |b, h| b.grad_x(cx, h))
    }
}

impl<T: Transport + 'static> LossOps for DspBackend<'_, T> {
    /// The loss runs on the CPU wherever it is placed (a softmax in f32 arithmetic on int8 logits:
    /// not the DSP's kind of work).
    fn loss(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        target: Target<'_>,
        norm: usize,
    ) -> Result<LossOut, ExecError> {
        self.snapshot(host);
        self.inner.loss(cx, host, target, norm)
    }
}

impl<T: Transport + 'static> OptimOps for DspBackend<'_, T> {
    /// Updates run on the CPU wherever they are placed (the master weights are f32).
    fn apply(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.snapshot(host);
        self.inner.apply(cx, host)
    }
}

impl<T: Transport + 'static> MoveOps for DspBackend<'_, T> {
    fn convert_half(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        self.inner.convert_half(cx, host)
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
        // Host arena only (see the module documentation): check_placements refuses other spaces.
        check_placements(self, plan)?;
        self.persist.clear();
        for node in &plan.graph.nodes {
            for p in &node.params {
                for t in core::iter::once(p.value).chain(p.state.iter().copied()) {
                    let r = plan
                        .region(t)
                        .ok_or(ExecError::Tensor("a parameter is not in the arena"))?;
                    self.persist.push(r);
                }
            }
        }
        let bytes = self.persist.iter().map(|r| r.1).sum();
        self.saved.clear();
        self.saved.resize(bytes, 0);
        self.inner.save_state(&mut self.state);
        if plan.program.iter().any(|i| i.placement == Placement::Dsp) {
            let mut h = self.shared.borrow_mut();
            let up = h.dsp.transport.restart().and_then(|_| h.dsp.ping());
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
        self.inner.begin_step(plan, step)
    }
    fn init_params(&mut self, plan: &Plan, host: &mut [u8], seed: u64) -> Result<(), ExecError> {
        self.inner.init_params(plan, host, seed)
    }
}
