//! The integer CPU backend: runs the instructions of an int8 graph's plan ([`Graph::with_precision`]).
//! Same program, lifetimes and layout as f32 plans; tensors hold int8 (gradients int8, weights int8 or
//! f32 master); exponents and self-adaptive rescale state live here (allocated once in
//! [`Backend::prepare`], never in a step). See [`crate::quant`] for the number format and the two update
//! modes, and [`crate::exec::int8::Int8Executor`] for the executor over it.
use alloc::vec;
use alloc::vec::Vec;

use super::arena::{carve, f32s};
use super::{
    Backend, Cx, ExecError, LayerOps, LossOps, LossOut, Mode, MoveOps, OptimOps, Placement,
    StepStart, Target,
};
use crate::graph::{scratch_slot, Graph, Node, NodeOp, Param, Share, TensorId, TensorKind};
use crate::kernels::int8 as k8;
use crate::model::{Int8Update, LossKind, Precision};
use crate::optim::{self, StepCtx};
use crate::plan::{Eo, Instr, Plan, LOSS_NODE};
use crate::quant::ops::{self as q, XSrc};
use crate::quant::{self, Pass, Rescale, RescaleCounts, Site};
use crate::rng::{hash2, Rng};

fn i8s(b: &mut [u8]) -> &mut [i8] {
    bytemuck::cast_slice_mut(b)
}

fn i32s(b: &mut [u8]) -> Result<&mut [i32], ExecError> {
    if b.is_empty() {
        return Ok(&mut []);
    }
    bytemuck::try_cast_slice_mut(b).map_err(|_| ExecError::BadPlan("tensor is not 4-byte aligned"))
}

/// What [`CpuInt8::save_state`] keeps.
#[derive(Clone, Debug, Default)]
pub struct Int8State {
    exps: Vec<i32>,
    sites: Vec<(TensorId, Site)>,
    combine: RescaleCounts,
}

/// Runs the instructions of one int8 plan. Holds exponents, rescale sites and counters; the arena is
/// passed to every call.
pub struct CpuInt8<'p> {
    plan: &'p Plan,
    update: Int8Update,
    rescale: Rescale,
    /// The step's seed (stochastic rounding of integer updates).
    seed: u64,
    /// The step's optimizer t (float-master updates).
    t: u32,
    /// Exponent per tensor (indexed by the canonical tensor, see `canon`).
    exps: Vec<i32>,
    /// Rescale state of the tensors Linear/Conv produce (forward outputs and input derivatives), by
    /// tensor: a handful of entries rather than one per tensor.
    sites: Vec<(TensorId, Site)>,
    /// Canonical tensor of each tensor: read-only views and external tensors share their source's exponent.
    canon: Vec<TensorId>,
    /// Split-batch (micro-batch) gradient combination counters.
    combine: RescaleCounts,
    /// Exponent of the current batch's quantised input.
    input_exp: i32,
    /// Per node: chunk size of its weight gradient (0 = whole batch; batch splitting).
    split: Vec<u16>,
    /// The host clock while profiling batch splitting.
    pub(crate) clock: Option<fn() -> u64>,
    /// Per node: profiled (batch, times for chunks n, n/2, n/4, n/8).
    pub(crate) profile: Vec<Option<(usize, [u64; 4])>>,
}

impl<'p> CpuInt8<'p> {
    /// The backend for `plan`, whose graph must be int8. Checks the exactness of every i32 accumulation.
    pub fn new(plan: &'p Plan) -> Result<Self, ExecError> {
        let g = &plan.graph;
        let Precision::Int8(update) = g.precision else {
            return Err(ExecError::BadPlan(
                "the plan is not int8 (realise the graph with Graph::with_precision)",
            ));
        };
        if g.loss != LossKind::SoftmaxCrossEntropy {
            return Err(ExecError::BadPlan(
                "int8 training needs the cross-entropy loss",
            ));
        }
        for nd in &g.nodes {
            if quant::max_accumulation(&nd.op, g.batch) > quant::ACC_LIMIT {
                return Err(ExecError::BadPlan(
                    "a layer sums more int8 products than int32 holds exactly (smaller batch or layer)",
                ));
            }
        }
        let canon = (0..g.tensors.len() as TensorId)
            .map(|t| canonical(g, t))
            .collect();
        // Linear and Conv rescale their output and their input derivative.
        let rescaled = |n: &Node| match n.op {
            NodeOp::Linear { .. } | NodeOp::Conv(_) => {
                [Some(n.out), n.d_in.first().copied().flatten().map(|d| d.0)]
            }
            _ => [None, None],
        };
        let count = g.nodes.iter().flat_map(rescaled).flatten().count();
        let mut sites = Vec::with_capacity(count);
        sites.extend(
            g.nodes
                .iter()
                .flat_map(rescaled)
                .flatten()
                .map(|t| (t, Site::default())),
        );
        Ok(Self {
            plan,
            update,
            rescale: Rescale::Adaptive,
            seed: 0,
            t: 1,
            exps: vec![0; g.tensors.len()],
            sites,
            canon,
            combine: RescaleCounts::default(),
            input_exp: 0,
            split: vec![0; g.nodes.len()],
            clock: None,
            profile: Vec::new(),
        })
    }

    /// The plan.
    pub fn plan(&self) -> &'p Plan {
        self.plan
    }

    /// Copies the state a step changes (exponents, rescale sites, combination counters) into `s`,
    /// reusing its buffers: after the first call it allocates nothing. With the persistent bytes of
    /// the arena, what a backend that rejects a step mid-way puts back ([`Self::restore_state`]).
    pub fn save_state(&self, s: &mut Int8State) {
        s.exps.clone_from(&self.exps);
        s.sites.clone_from(&self.sites);
        s.combine = self.combine;
    }

    /// Puts back the state saved by [`Self::save_state`] (of this backend).
    pub fn restore_state(&mut self, s: &Int8State) {
        self.exps.clone_from(&s.exps);
        self.sites.clone_from(&s.sites);
        self.combine = s.combine;
    }

    /// The update mode.
    pub fn update(&self) -> Int8Update {
        self.update
    }

    /// Self-adaptive (default) or every-step rescaling.
    pub fn set_rescale(&mut self, r: Rescale) {
        self.rescale = r;
    }

    /// Rescale counters summed over all tensors.
    pub fn counts(&self) -> RescaleCounts {
        let mut c = self.combine;
        for (_, s) in &self.sites {
            c.add(&s.counts);
        }
        c
    }

    /// Per tensor: (name, its site) for the tensors that rescale.
    pub fn sites(&self) -> impl Iterator<Item = (&str, &Site)> + '_ {
        self.sites
            .iter()
            .filter(|(_, s)| s.ready)
            .map(|(t, s)| (self.plan.graph.tensors[*t as usize].name.as_str(), s))
    }

    /// The exponent of tensor `t` (real value = int8 value · 2^exponent).
    pub fn exponent(&self, t: TensorId) -> i32 {
        self.exps[self.canon[t as usize] as usize]
    }

    fn ex(&self, t: TensorId) -> i32 {
        self.exponent(t)
    }

    fn set_ex(&mut self, t: TensorId, e: i32) {
        let c = self.canon[t as usize] as usize;
        self.exps[c] = e;
    }

    fn fm(&self) -> bool {
        self.update == Int8Update::FloatMaster
    }

    /// Initialises the parameters. Float master: PyTorch's uniform ±1/√fan_in (the same random stream as
    /// the f32 executor, so both start from the same weights). Integer: the same bound as an int8 value
    /// and exponent ([`quant::int_init_bound`]) drawn with integer arithmetic only.
    fn init_int8(&mut self, a: &mut [u8], seed: u64) -> Result<(), ExecError> {
        let plan = self.plan;
        let fm = self.fm();
        let mut rng = Rng::new(seed);
        let mut exps = Vec::new();
        for node in &plan.graph.nodes {
            let fan_in = match &node.op {
                NodeOp::Linear { fin, .. } => *fin,
                NodeOp::Conv(g) => g.cin / g.groups * g.kh * g.kw,
                _ => 0,
            };
            for p in &node.params {
                let (off, len) = plan
                    .region(p.value)
                    .ok_or(ExecError::Tensor("parameter is not in the arena"))?;
                let buf = &mut a[off..off + len];
                if fm {
                    let v = f32s(buf)?;
                    let bound = 1.0 / libm::sqrtf(fan_in.max(1) as f32);
                    for x in v.iter_mut() {
                        *x = rng.uniform(-bound, bound);
                    }
                    exps.push((p.value, quant::exp_for_max(quant::max_abs_f32(v))));
                } else {
                    let (e, b) = quant::int_init_bound(fan_in);
                    for x in i8s(buf).iter_mut() {
                        *x = (rng.below(2 * b as u64 + 1) as i64 - b as i64) as i8;
                    }
                    exps.push((p.value, e));
                }
                for &s in &p.state {
                    let (off, len) = plan
                        .region(s)
                        .ok_or(ExecError::Tensor("state is not in the arena"))?;
                    a[off..off + len].fill(0);
                }
            }
        }
        for (t, e) in exps {
            self.set_ex(t, e);
        }
        Ok(())
    }

    /// The parameters a checkpoint holds: `state_dict` names and shapes.
    pub fn state_tensors(
        &self,
    ) -> impl Iterator<Item = (alloc::string::String, Vec<usize>, TensorId)> + 'p {
        let g: &'p Graph = &self.plan.graph;
        g.nodes.iter().flat_map(|n| {
            n.params
                .iter()
                .map(|p| (p.name.clone(), p.shape.clone(), p.value))
        })
    }

    /// A parameter as f32 (dequantised in integer mode).
    pub fn read_f32(&self, a: &mut [u8], t: TensorId) -> Result<Vec<f32>, ExecError> {
        let plan = self.plan;
        let (off, len) = plan
            .region(t)
            .ok_or(ExecError::Tensor("tensor is not in the arena"))?;
        let buf = &mut a[off..off + len];
        if plan.graph.tensors[t as usize].kind == TensorKind::Weight && self.fm() {
            return Ok(f32s(buf)?.to_vec());
        }
        let k = quant::pow2(self.ex(t));
        Ok(i8s(buf).iter().map(|&v| v as f32 * k).collect())
    }

    /// Overwrites a parameter from f32 values (quantised with an exponent from their `max |x|` in integer
    /// mode, with the same head-room as initialisation: `max` in [32, 64)).
    pub fn write_f32(&mut self, a: &mut [u8], t: TensorId, data: &[f32]) -> Result<(), ExecError> {
        let plan = self.plan;
        let fm = self.fm();
        let (off, len) = plan
            .region(t)
            .ok_or(ExecError::Tensor("tensor is not in the arena"))?;
        if plan.graph.tensors[t as usize].kind != TensorKind::Weight {
            return Err(ExecError::Tensor("only parameters can be written"));
        }
        let buf = &mut a[off..off + len];
        let e = quant::exp_for_max(quant::max_abs_f32(data));
        if fm {
            let dst = f32s(buf)?;
            if dst.len() != data.len() {
                return Err(ExecError::Tensor("length differs from the planned tensor"));
            }
            dst.copy_from_slice(data);
            self.set_ex(t, e);
        } else {
            let dst = i8s(buf);
            if dst.len() != data.len() {
                return Err(ExecError::Tensor("length differs from the planned tensor"));
            }
            quant::quantize(data, e + 1, dst);
            self.set_ex(t, e + 1);
        }
        Ok(())
    }

    fn node(&self, ins: &Instr) -> Result<&'p Node, ExecError> {
        if ins.node == LOSS_NODE {
            return Err(ExecError::BadPlan("loss instruction in the wrong place"));
        }
        self.plan
            .graph
            .nodes
            .get(ins.node as usize)
            .ok_or(ExecError::BadPlan("node index out of range"))
    }

    fn is_ext(&self, t: TensorId) -> bool {
        self.plan.graph.tensors[t as usize].kind == TensorKind::External
    }

    #[inline(never)] // own frame: see `train_step`
    fn loss(
        &mut self,
        eo: Eo,
        a: &mut [u8],
        n: usize,
        y: &[u32],
        train: bool,
        norm: usize,
    ) -> Result<(f32, usize), ExecError> {
        let plan = self.plan;
        let g = &plan.graph;
        let per = g.pred_dims().numel();
        let pred = g.pred();
        let e = self.ex(pred);
        let sb = reg(plan, eo, g.loss_scratch, 4 * per)?;
        if !train {
            let [pb, sb] = carve(a, [reg(plan, eo, Some(pred), n * per)?, sb])?;
            let (l, c) = quant::softmax_ce_eval(n, per, i8s(pb), e, y, i32s(sb)?);
            return Ok((l, c));
        }
        let (l, c, ed) = if same(plan, eo, pred, g.d_pred) {
            let [pb, sb] = carve(a, [reg(plan, eo, Some(pred), n * per)?, sb])?;
            quant::softmax_ce(n, per, i8s(pb), e, y, norm, None, i32s(sb)?)
        } else {
            let [pb, db, sb] = carve(
                a,
                [
                    reg(plan, eo, Some(pred), n * per)?,
                    reg(plan, eo, Some(g.d_pred), n * per)?,
                    sb,
                ],
            )?;
            quant::softmax_ce(n, per, i8s(pb), e, y, norm, Some(i8s(db)), i32s(sb)?)
        };
        self.set_ex(g.d_pred, ed);
        Ok((l, c))
    }

    /// The int8 weight of a Linear/Conv for compute: the arena tensor (integer mode) or the master
    /// quantised into `wq` (float master).
    fn weight<'a>(
        &self,
        wb: &'a mut [u8],
        wq: &'a mut [i8],
        t: TensorId,
    ) -> Result<&'a [i8], ExecError> {
        if self.fm() {
            quant::quantize(f32s(wb)?, self.ex(t), wq);
            Ok(wq)
        } else {
            Ok(i8s(wb))
        }
    }

    fn bias_acc(
        &self,
        bb: &mut [u8],
        t: TensorId,
        e_acc: i32,
        out: &mut [i32],
    ) -> Result<(), ExecError> {
        if self.fm() {
            q::bias_f32_to_acc(f32s(bb)?, e_acc, out);
        } else {
            q::bias_i8_to_acc(i8s(bb), self.ex(t), e_acc, out);
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(never)] // own frame: see `train_step`
    fn forward(
        &mut self,
        eo: Eo,
        a: &mut [u8],
        ins: &Instr,
        n: usize,
        xext: &[f32],
        pass: Pass,
    ) -> Result<(), ExecError> {
        let plan = self.plan;
        let node = self.node(ins)?;
        let xin = node.inputs[0];
        let ext = self.is_ext(xin);
        let in_elems = n * node.in_dims[0].numel();
        let out_elems = n * node.out_dims.numel();
        let e_x = self.ex(xin);
        let out = node.out;
        match &node.op {
            NodeOp::Linear { .. } | NodeOp::Conv(_) => {
                let w = node.params[0].value;
                let b = node.params.get(1).map(|p| p.value);
                let lay = layouts(&plan.graph, &node.op, ext)
                    .ok_or(ExecError::BadPlan("no int8 layout"))?[0];
                let [xb, yb, wb, bb, sb] = carve(
                    a,
                    [
                        if ext {
                            (0, 0)
                        } else {
                            reg(plan, eo, Some(xin), in_elems)?
                        },
                        reg(plan, eo, Some(out), out_elems)?,
                        whole(plan, eo, Some(w))?,
                        whole(plan, eo, b)?,
                        whole(plan, eo, node.scratch[scratch_slot::FWD])?,
                    ],
                )?;
                let [xq, wq, biasb, accb, gsb] =
                    quant::split(sb, lay).ok_or(ExecError::BadPlan("int8 scratch is too small"))?;
                let e_w = self.ex(w);
                let e_acc = e_x + e_w;
                let bias = if let Some(bt) = b {
                    let out = i32s(biasb)?;
                    self.bias_acc(bb, bt, e_acc, out)?;
                    Some(&*out)
                } else {
                    None
                };
                let wv = self.weight(wb, i8s(wq), w)?;
                let mut src = if ext {
                    XSrc::F32 {
                        x: xext,
                        e: e_x,
                        buf: i8s(xq),
                    }
                } else {
                    XSrc::I8(i8s(xb))
                };
                let site = site_of(&mut self.sites, out)?;
                let shift = match &node.op {
                    NodeOp::Linear { fin, fout } => {
                        let xv = src.rows(0, n, *fin);
                        q::linear_fwd(
                            n,
                            *fin,
                            *fout,
                            xv,
                            wv,
                            bias,
                            i8s(yb),
                            i32s(accb)?,
                            i8s(gsb),
                            site,
                            pass,
                        )
                    }
                    NodeOp::Conv(g) => {
                        let blk = quant::conv_blocks(g, plan.graph.batch, ext)[0];
                        q::conv_fwd(
                            g,
                            n,
                            blk,
                            &mut src,
                            wv,
                            bias,
                            i8s(yb),
                            i32s(accb)?,
                            i8s(gsb),
                            site,
                            pass,
                        )
                    }
                    _ => 0,
                };
                self.set_ex(out, e_acc + shift as i32);
            }
            NodeOp::View => {}
            _ if ext => {
                return Err(ExecError::BadPlan(
                    "int8: only linear and conv2d layers may read the model input",
                ))
            }
            NodeOp::MaxPool(g) => {
                let [xb, yb, ib] = carve(
                    a,
                    [
                        reg(plan, eo, Some(xin), in_elems)?,
                        reg(plan, eo, Some(out), out_elems)?,
                        reg(plan, eo, node.saved.first().copied(), out_elems)?,
                    ],
                )?;
                q::maxpool_fwd(g, n, i8s(xb), i8s(yb), ib);
                self.set_ex(out, e_x);
            }
            NodeOp::AvgPool(g) => {
                let [xb, yb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(xin), in_elems)?,
                        reg(plan, eo, Some(out), out_elems)?,
                    ],
                )?;
                q::avgpool_fwd(g, n, i8s(xb), i8s(yb));
                self.set_ex(out, e_x);
            }
            NodeOp::GlobalAvgPool { c, hw } => {
                let [xb, yb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(xin), in_elems)?,
                        reg(plan, eo, Some(out), out_elems)?,
                    ],
                )?;
                q::global_avgpool_fwd(n, *c, *hw, i8s(xb), i8s(yb));
                self.set_ex(out, e_x);
            }
            NodeOp::Act(_) => {
                if same(plan, eo, xin, out) {
                    let [yb] = carve(a, [reg(plan, eo, Some(out), out_elems)?])?;
                    q::relu_inplace(i8s(yb));
                } else {
                    let [xb, yb] = carve(
                        a,
                        [
                            reg(plan, eo, Some(xin), in_elems)?,
                            reg(plan, eo, Some(out), out_elems)?,
                        ],
                    )?;
                    for (y, &x) in i8s(yb).iter_mut().zip(i8s(xb).iter()) {
                        *y = x.max(0);
                    }
                }
                self.set_ex(out, e_x);
            }
            NodeOp::Add => {
                let bin = node.inputs[1];
                if self.is_ext(bin) {
                    return Err(ExecError::BadPlan(
                        "int8: only linear and conv2d layers may read the model input",
                    ));
                }
                let e_b = self.ex(bin);
                let e = if same(plan, eo, xin, out) {
                    let [yb, bb] = carve(
                        a,
                        [
                            reg(plan, eo, Some(out), out_elems)?,
                            reg(plan, eo, Some(bin), in_elems)?,
                        ],
                    )?;
                    let (y, bv) = (i8s(yb), i8s(bb));
                    let e = q::add_exp(y, e_x, bv, e_b);
                    for (v, &w) in y.iter_mut().zip(bv.iter()) {
                        *v = q::add_at(*v, e_x, w, e_b, e);
                    }
                    e
                } else {
                    let [xb, bb, yb] = carve(
                        a,
                        [
                            reg(plan, eo, Some(xin), in_elems)?,
                            reg(plan, eo, Some(bin), in_elems)?,
                            reg(plan, eo, Some(out), out_elems)?,
                        ],
                    )?;
                    let (xv, bv) = (i8s(xb), i8s(bb));
                    let e = q::add_exp(xv, e_x, bv, e_b);
                    for ((v, &u), &w) in i8s(yb).iter_mut().zip(xv.iter()).zip(bv.iter()) {
                        *v = q::add_at(u, e_x, w, e_b, e);
                    }
                    e
                };
                self.set_ex(out, e);
            }
            NodeOp::BatchNorm { .. }
            | NodeOp::Dropout { .. }
            | NodeOp::Embedding { .. }
            | NodeOp::PosEmbedding { .. }
            | NodeOp::Norm { .. }
            | NodeOp::Smooth(_)
            | NodeOp::Attention(_)
            | NodeOp::Lora(_)
            | NodeOp::Rnn(_) => {
                return Err(ExecError::BadPlan(
                    "layer kind is not part of int8 training",
                ))
            }
        }
        Ok(())
    }

    #[inline(never)] // own frame: see `train_step`
    fn grad_w(
        &mut self,
        eo: Eo,
        a: &mut [u8],
        ins: &Instr,
        n: usize,
        xext: &[f32],
    ) -> Result<(), ExecError> {
        let plan = self.plan;
        let node = self.node(ins)?;
        let xin = node.inputs[0];
        let ext = self.is_ext(xin);
        let in_elems = n * node.in_dims[0].numel();
        let out_elems = n * node.out_dims.numel();
        let dy = node
            .d_out
            .ok_or(ExecError::BadPlan("gradient without an output derivative"))?;
        let dw = node.params.first().and_then(|p| p.grad);
        let db = node.params.get(1).and_then(|p| p.grad);
        let lay = layouts(&plan.graph, &node.op, ext).ok_or(ExecError::BadPlan(
            "gradient phase on a layer without parameters",
        ))?[1];
        let [xb, dyb, dwb, dbb, sb] = carve(
            a,
            [
                if ext {
                    (0, 0)
                } else {
                    reg(plan, eo, Some(xin), in_elems)?
                },
                reg(plan, eo, Some(dy), out_elems)?,
                whole(plan, eo, dw)?,
                whole(plan, eo, db)?,
                whole(plan, eo, node.scratch[scratch_slot::GRAD_W])?,
            ],
        )?;
        let [xq, colsb, accb, gsb, dycb] =
            quant::split(sb, lay).ok_or(ExecError::BadPlan("int8 scratch is too small"))?;
        let e_x = self.ex(xin);
        let e_dy = self.ex(dy);
        let mut src = if ext {
            XSrc::F32 {
                x: xext,
                e: e_x,
                buf: i8s(xq),
            }
        } else {
            XSrc::I8(i8s(xb))
        };
        let acc = i32s(accb)?;
        let dyv = i8s(dyb);
        let (dwv, dbv) = (i8s(dwb), i8s(dbb));
        let (cols, gs, dyc) = (i8s(colsb), i8s(gsb), i8s(dycb));
        let ni = ins.node as usize;
        let configured = match self.split.get(ni) {
            Some(&c) if c > 0 && (c as usize) < n => c as usize,
            _ => n,
        };
        let e_acc = e_dy + e_x;
        let mut run = |me: &mut Self, chunk: usize| -> Result<(), ExecError> {
            let mut first = ins.mb == 0;
            for c0 in (0..n).step_by(chunk) {
                let cn = chunk.min(n - c0);
                match &node.op {
                    NodeOp::Linear { fin, fout } => {
                        let (fin, fout) = (*fin, *fout);
                        // `rows` output rows of the weight gradient at a time (all of them unless the
                        // graph has a `grad_tile`).
                        let rows = quant::grad_rows(fout, fin, plan.graph.grad_tile);
                        let (accw, accbias) = acc.split_at_mut(rows * fin);
                        let xv = src.rows(c0, cn, fin);
                        let dyc = &dyv[c0 * fout..];
                        if let Some(t) = dw {
                            let mut fill = |start: usize, out: &mut [i32]| {
                                let (r0, nr) = (start / fin, out.len() / fin);
                                q::linear_grad_w_rows(cn, fin, fout, r0, nr, xv, dyc, out, gs);
                            };
                            let part = if rows == fout {
                                fill(0, accw);
                                GradSrc::Whole(accw)
                            } else {
                                GradSrc::Tiles {
                                    tile: accw,
                                    fill: &mut fill,
                                }
                            };
                            me.gradient_part(t, &mut *dwv, part, e_acc, first);
                        }
                        if let Some(t) = db {
                            q::linear_grad_b(cn, fout, dyc, accbias);
                            me.gradient_part(t, &mut *dbv, GradSrc::Whole(accbias), e_acc, first);
                        }
                    }
                    NodeOp::Conv(g) => {
                        let kg = g.cin / g.groups * g.kh * g.kw;
                        let (accw, accbias) = acc.split_at_mut(g.cout * kg);
                        q::conv_grad_w(
                            g,
                            cn,
                            c0,
                            quant::conv_blocks(g, plan.graph.batch, ext)[1],
                            &mut src,
                            &dyv[c0 * g.cout * g.oh * g.ow..],
                            accw,
                            db.map(|_| &mut accbias[..g.cout]),
                            cols,
                            dyc,
                            gs,
                        );
                        let (accw, accbias) = acc.split_at_mut(g.cout * kg);
                        if let Some(t) = dw {
                            me.gradient_part(t, &mut *dwv, GradSrc::Whole(accw), e_acc, first);
                        }
                        if let Some(t) = db {
                            me.gradient_part(t, &mut *dbv, GradSrc::Whole(accbias), e_acc, first);
                        }
                    }
                    _ => {
                        return Err(ExecError::BadPlan(
                            "gradient phase on a layer without parameters",
                        ))
                    }
                }
                first = false;
            }
            Ok(())
        };
        if let Some(clock) = self.clock {
            // Batch-split profiling: the whole batch in chunks of n/8, n/4, n/2 and n (same FLOPs),
            // timed with the host's clock; the full batch runs last, so its gradient stands.
            let saved = self.combine;
            let mut times = [0u64; 4];
            for k in (0..4).rev() {
                let chunk = (n >> k).max(1);
                let t0 = clock();
                run(self, chunk)?;
                times[k] = clock().saturating_sub(t0);
            }
            self.combine = saved;
            if let Some(slot) = self.profile.get_mut(ni) {
                *slot = Some((n, times));
            }
            return Ok(());
        }
        run(self, configured)
    }

    /// Writes one chunk's i32 gradient (`part`) as int8: exactly (the first chunk of a step), or
    /// combined with the gradient so far by Mandheling Eq. 4 (later chunks and micro-batches): rescale to
    /// the larger scale, skipped when the scales agree (counted), one more bit when the sum would
    /// saturate. A gradient in tiles is recomputed on every pass over it (two passes, or three to
    /// combine); the int8 result is the same as from the whole gradient.
    #[inline(never)] // own frame: see `train_step`
    fn gradient_part(
        &mut self,
        t: TensorId,
        g8: &mut [i8],
        mut part: GradSrc<'_>,
        e_acc: i32,
        first: bool,
    ) {
        let len = g8.len();
        let mut m = 0;
        part.each(len, &mut |_, v| m = m.max(k8::max_abs_i32(v)));
        let s = k8::shift_for(m);
        let e_new = e_acc + s as i32;
        if first {
            part.each(len, &mut |start, v| {
                let dst = &mut g8[start..start + v.len()];
                k8::rescale_i32_to_i8(v, s, k8::Rounding::Nearest, 0, dst);
            });
            self.set_ex(t, e_new);
            return;
        }
        let e_old = self.ex(t);
        let mut tmp = [0i8; quant::CHUNK];
        // The new chunk is rescaled to int8 piece by piece (on the stack) in both passes.
        let mut over = false;
        part.each(len, &mut |start, v| {
            for (c, chunk) in v.chunks(quant::CHUNK).enumerate() {
                let tl = &mut tmp[..chunk.len()];
                k8::rescale_i32_to_i8(chunk, s, k8::Rounding::Nearest, 0, tl);
                let at = start + c * quant::CHUNK;
                over |= g8[at..at + chunk.len()]
                    .iter()
                    .zip(tl.iter())
                    .any(|(&o, &v)| q::eq4_sum(o, e_old, v, e_new).1);
            }
        });
        let e = e_old.max(e_new) + over as i32;
        part.each(len, &mut |start, v| {
            for (c, chunk) in v.chunks(quant::CHUNK).enumerate() {
                let tl = &mut tmp[..chunk.len()];
                k8::rescale_i32_to_i8(chunk, s, k8::Rounding::Nearest, 0, tl);
                let at = start + c * quant::CHUNK;
                for (o, &v) in g8[at..at + chunk.len()].iter_mut().zip(tl.iter()) {
                    *o = q::eq4_at(*o, e_old, v, e_new, e);
                }
            }
        });
        if e_old == e_new {
            self.combine.combine_skipped += 1;
        } else {
            self.combine.combine_rescaled += 1;
        }
        self.set_ex(t, e);
    }

    /// Chunk size of each node's weight gradient (0: whole batch), as set by [`Self::profile_split`]
    /// or [`Self::set_split`].
    pub fn split(&self) -> &[u16] {
        &self.split
    }

    /// Runs node `node`'s weight gradient in chunks of `chunk` samples (0: whole batch).
    pub fn set_split(&mut self, node: usize, chunk: u16) {
        if let Some(s) = self.split.get_mut(node) {
            *s = chunk;
        }
    }

    #[inline(never)] // own frame: see `train_step`
    fn grad_x(
        &mut self,
        eo: Eo,
        a: &mut [u8],
        ins: &Instr,
        n: usize,
        pass: Pass,
    ) -> Result<(), ExecError> {
        let plan = self.plan;
        let node = self.node(ins)?;
        let in_elems = n * node.in_dims[0].numel();
        let out_elems = n * node.out_dims.numel();
        let dy = node.d_out.ok_or(ExecError::BadPlan(
            "derivative without an output derivative",
        ))?;
        let (dx, acc) = match node.d_in.first().copied().flatten() {
            Some(d) => (Some(d.0), d.1),
            None => (None, false),
        };
        let e_dy = self.ex(dy);
        match &node.op {
            NodeOp::Linear { .. } | NodeOp::Conv(_) => {
                let dx = dx.ok_or(ExecError::BadPlan("derivative without a target"))?;
                let w = node.params[0].value;
                let lay = layouts(&plan.graph, &node.op, false)
                    .ok_or(ExecError::BadPlan("no int8 layout"))?[2];
                let [dyb, wb, dxb, sb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(dy), out_elems)?,
                        whole(plan, eo, Some(w))?,
                        reg(plan, eo, Some(dx), in_elems)?,
                        whole(plan, eo, node.scratch[scratch_slot::GRAD_X])?,
                    ],
                )?;
                let [wq, dcolsb, accb, gsb, dycb] =
                    quant::split(sb, lay).ok_or(ExecError::BadPlan("int8 scratch is too small"))?;
                let e_acc = e_dy + self.ex(w);
                let old = acc.then(|| (self.ex(dx), e_acc));
                // Accumulating reads the old values while writing: only an exact pass keeps them intact.
                let pass = match (acc, pass) {
                    (true, Pass::Train(_)) => Pass::Train(Rescale::EveryStep),
                    (_, p) => p,
                };
                let wv = self.weight(wb, i8s(wq), w)?;
                let site = site_of(&mut self.sites, dx)?;
                let shift = match &node.op {
                    NodeOp::Linear { fin, fout } => q::linear_grad_x(
                        n,
                        *fin,
                        *fout,
                        i8s(dyb),
                        wv,
                        i8s(dxb),
                        old,
                        i32s(accb)?,
                        i8s(gsb),
                        site,
                        pass,
                    ),
                    NodeOp::Conv(g) => q::conv_grad_x(
                        g,
                        n,
                        quant::conv_blocks(g, plan.graph.batch, false)[2],
                        i8s(dyb),
                        wv,
                        i8s(dxb),
                        old,
                        i32s(dcolsb)?,
                        i32s(accb)?,
                        i8s(dycb),
                        i8s(gsb),
                        site,
                        pass,
                    ),
                    _ => 0,
                };
                self.set_ex(dx, e_acc + shift as i32);
            }
            NodeOp::MaxPool(g) => {
                let dx = dx.ok_or(ExecError::BadPlan("derivative without a target"))?;
                let e_old = self.ex(dx);
                let [dyb, ib, dxb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(dy), out_elems)?,
                        reg(plan, eo, node.saved.first().copied(), out_elems)?,
                        reg(plan, eo, Some(dx), in_elems)?,
                    ],
                )?;
                let e = q::prepare_acc(i8s(dxb), e_old, e_dy, acc);
                q::maxpool_grad_x(g, n, i8s(dyb), ib, i8s(dxb), e_dy, e);
                self.set_ex(dx, e);
            }
            NodeOp::AvgPool(g) => {
                let dx = dx.ok_or(ExecError::BadPlan("derivative without a target"))?;
                let e_old = self.ex(dx);
                let [dyb, dxb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(dy), out_elems)?,
                        reg(plan, eo, Some(dx), in_elems)?,
                    ],
                )?;
                let e_new = e_dy - q::avg_grad_shift(g.kh * g.kw);
                let e = q::prepare_acc(i8s(dxb), e_old, e_new, acc);
                q::avgpool_grad_x(g, n, i8s(dyb), i8s(dxb), e_dy, e);
                self.set_ex(dx, e);
            }
            NodeOp::GlobalAvgPool { c, hw } => {
                let dx = dx.ok_or(ExecError::BadPlan("derivative without a target"))?;
                let e_old = self.ex(dx);
                let [dyb, dxb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(dy), out_elems)?,
                        reg(plan, eo, Some(dx), in_elems)?,
                    ],
                )?;
                let e_new = e_dy - q::avg_grad_shift(*hw);
                let e = q::prepare_acc(i8s(dxb), e_old, e_new, acc);
                q::global_avgpool_grad_x(n, *c, *hw, i8s(dyb), i8s(dxb), e_dy, e);
                self.set_ex(dx, e);
            }
            NodeOp::Act(_) => {
                let dx = dx.ok_or(ExecError::BadPlan("activation derivative without a target"))?;
                if same(plan, eo, dy, dx) {
                    let [yb, db] = carve(
                        a,
                        [
                            reg(plan, eo, Some(node.out), out_elems)?,
                            reg(plan, eo, Some(dx), in_elems)?,
                        ],
                    )?;
                    q::relu_grad_inplace(i8s(yb), i8s(db));
                    self.set_ex(dx, e_dy);
                } else {
                    let e_old = self.ex(dx);
                    let [yb, dyb, dxb] = carve(
                        a,
                        [
                            reg(plan, eo, Some(node.out), out_elems)?,
                            reg(plan, eo, Some(dy), out_elems)?,
                            reg(plan, eo, Some(dx), in_elems)?,
                        ],
                    )?;
                    let d = i8s(dxb);
                    let e = q::prepare_acc(d, e_old, e_dy, acc);
                    for ((o, &yv), &g) in d.iter_mut().zip(i8s(yb).iter()).zip(i8s(dyb).iter()) {
                        if yv > 0 {
                            *o = (*o as i32 + quant::align(g as i32, e_dy, e)).clamp(-127, 127)
                                as i8;
                        }
                    }
                    self.set_ex(dx, e);
                }
            }
            NodeOp::View => {
                let dx = dx.ok_or(ExecError::BadPlan("view derivative without a target"))?;
                if !same(plan, eo, dy, dx) {
                    self.copy_acc(eo, a, dy, dx, out_elems, acc)?;
                }
            }
            NodeOp::Add => {
                if let Some((dbt, acc_b)) = node.d_in.get(1).copied().flatten() {
                    self.copy_acc(eo, a, dy, dbt, out_elems, acc_b)?;
                }
                if let Some(dat) = dx {
                    if !same(plan, eo, dy, dat) {
                        self.copy_acc(eo, a, dy, dat, out_elems, acc)?;
                    } else {
                        self.set_ex(dat, e_dy);
                    }
                }
            }
            NodeOp::BatchNorm { .. }
            | NodeOp::Dropout { .. }
            | NodeOp::Embedding { .. }
            | NodeOp::PosEmbedding { .. }
            | NodeOp::Norm { .. }
            | NodeOp::Smooth(_)
            | NodeOp::Attention(_)
            | NodeOp::Lora(_)
            | NodeOp::Rnn(_) => {
                return Err(ExecError::BadPlan(
                    "layer kind is not part of int8 training",
                ))
            }
        }
        Ok(())
    }

    fn copy_acc(
        &mut self,
        eo: Eo,
        a: &mut [u8],
        src: TensorId,
        dst: TensorId,
        elems: usize,
        acc: bool,
    ) -> Result<(), ExecError> {
        let plan = self.plan;
        let (e_s, e_old) = (self.ex(src), self.ex(dst));
        let [sb, db] = carve(
            a,
            [
                reg(plan, eo, Some(src), elems)?,
                reg(plan, eo, Some(dst), elems)?,
            ],
        )?;
        let d = i8s(db);
        let e = q::prepare_acc(d, e_old, e_s, acc);
        for (o, &v) in d.iter_mut().zip(i8s(sb).iter()) {
            *o = (*o as i32 + quant::align(v as i32, e_s, e)).clamp(-127, 127) as i8;
        }
        self.set_ex(dst, e);
        Ok(())
    }

    #[inline(never)] // own frame: see `train_step`
    fn apply(&mut self, eo: Eo, a: &mut [u8], ins: &Instr) -> Result<(), ExecError> {
        let plan = self.plan;
        let node = self.node(ins)?;
        for p in &node.params {
            let Some(g) = p.grad else { continue };
            match self.update {
                Int8Update::Integer { update_bits } => {
                    let [wb, gb] = carve(
                        a,
                        [whole(plan, eo, Some(p.value))?, whole(plan, eo, Some(g))?],
                    )?;
                    let seed = hash2(self.seed, p.value as u64);
                    quant::integer_update(i8s(wb), i8s(gb), update_bits as u32, seed);
                }
                Int8Update::FloatMaster => self.master_update(eo, a, p, g)?,
            }
        }
        Ok(())
    }

    /// The float-master update of parameter `p` (gradient `g`): the model's optimizer on the dequantised
    /// gradient, then the exponent of the new master. A frame of its own, only on the stack in this mode.
    #[inline(never)]
    fn master_update(
        &mut self,
        eo: Eo,
        a: &mut [u8],
        p: &Param,
        g: TensorId,
    ) -> Result<(), ExecError> {
        let plan = self.plan;
        let ctx = StepCtx { t: self.t };
        let e_g = self.ex(g);
        let opt = &plan.graph.optimizer;
        let k = quant::pow2(e_g);
        let mut gf = [0f32; quant::CHUNK];
        let m = match p.state.as_slice() {
            [] => {
                let [wb, gb] = carve(
                    a,
                    [whole(plan, eo, Some(p.value))?, whole(plan, eo, Some(g))?],
                )?;
                let (w, g8) = (f32s(wb)?, i8s(gb));
                for (wc, gc) in w.chunks_mut(quant::CHUNK).zip(g8.chunks(quant::CHUNK)) {
                    let gfc = &mut gf[..gc.len()];
                    for (f, &v) in gfc.iter_mut().zip(gc) {
                        *f = v as f32 * k;
                    }
                    optim::apply(opt, ctx, wc, gfc, &mut []);
                }
                quant::max_abs_f32(w)
            }
            [s0] => {
                let [wb, gb, s0b] = carve(
                    a,
                    [
                        whole(plan, eo, Some(p.value))?,
                        whole(plan, eo, Some(g))?,
                        whole(plan, eo, Some(*s0))?,
                    ],
                )?;
                let (w, g8, s0) = (f32s(wb)?, i8s(gb), f32s(s0b)?);
                for ((wc, gc), sc) in w
                    .chunks_mut(quant::CHUNK)
                    .zip(g8.chunks(quant::CHUNK))
                    .zip(s0.chunks_mut(quant::CHUNK))
                {
                    let gfc = &mut gf[..gc.len()];
                    for (f, &v) in gfc.iter_mut().zip(gc) {
                        *f = v as f32 * k;
                    }
                    optim::apply(opt, ctx, wc, gfc, &mut [sc]);
                }
                quant::max_abs_f32(w)
            }
            [s0, s1] => {
                let [wb, gb, s0b, s1b] = carve(
                    a,
                    [
                        whole(plan, eo, Some(p.value))?,
                        whole(plan, eo, Some(g))?,
                        whole(plan, eo, Some(*s0))?,
                        whole(plan, eo, Some(*s1))?,
                    ],
                )?;
                let (w, g8, s0, s1) = (f32s(wb)?, i8s(gb), f32s(s0b)?, f32s(s1b)?);
                for (((wc, gc), sc0), sc1) in w
                    .chunks_mut(quant::CHUNK)
                    .zip(g8.chunks(quant::CHUNK))
                    .zip(s0.chunks_mut(quant::CHUNK))
                    .zip(s1.chunks_mut(quant::CHUNK))
                {
                    let gfc = &mut gf[..gc.len()];
                    for (f, &v) in gfc.iter_mut().zip(gc) {
                        *f = v as f32 * k;
                    }
                    optim::apply(opt, ctx, wc, gfc, &mut [sc0, sc1]);
                }
                quant::max_abs_f32(w)
            }
            _ => {
                return Err(ExecError::BadPlan(
                    "more optimizer state slots than any optimizer uses",
                ))
            }
        };
        if !m.is_finite() {
            return Err(ExecError::NonFinite("a master weight"));
        }
        self.set_ex(p.value, quant::exp_for_max(m));
        Ok(())
    }
}

/// A chunk's i32 weight or bias gradient, for [`Int8Executor::gradient_part`].
enum GradSrc<'a> {
    /// All of it, computed.
    Whole(&'a [i32]),
    /// Computed on demand in tiles of `tile.len()` elements (the last one shorter): `fill(start, out)`
    /// writes elements `start..start + out.len()` into `out`.
    Tiles {
        tile: &'a mut [i32],
        fill: &'a mut dyn FnMut(usize, &mut [i32]),
    },
}

impl GradSrc<'_> {
    /// One pass over the first `len` elements, in order: `visit(start, values)` per piece (the tiles
    /// are computed afresh on every pass).
    fn each(&mut self, len: usize, visit: &mut dyn FnMut(usize, &[i32])) {
        match self {
            GradSrc::Whole(v) => visit(0, &v[..len]),
            GradSrc::Tiles { tile, fill } => {
                let step = tile.len().max(1);
                for start in (0..len).step_by(step) {
                    let v = &mut tile[..step.min(len - start)];
                    fill(start, v);
                    visit(start, v);
                }
            }
        }
    }
}

/// The scratch parts of a node of `g` (see [`quant::layouts`]).
fn layouts(g: &Graph, op: &NodeOp, ext_in: bool) -> Option<[[usize; 5]; 3]> {
    quant::layouts(g.precision, g.kernels, g.grad_tile, op, g.batch, ext_in)
}

/// The rescale site of tensor `t`.
fn site_of(sites: &mut [(TensorId, Site)], t: TensorId) -> Result<&mut Site, ExecError> {
    sites
        .iter_mut()
        .find(|(u, _)| *u == t)
        .map(|(_, s)| s)
        .ok_or(ExecError::BadPlan(
            "a Linear or Conv output has no rescale site",
        ))
}

/// Read-only views and host tensors share their source's exponent.
fn canonical(g: &Graph, mut t: TensorId) -> TensorId {
    for _ in 0..g.tensors.len() {
        let info = &g.tensors[t as usize];
        if info.kind == TensorKind::External {
            return g.input;
        }
        match info.share {
            Share::ReadView(v) => t = v,
            _ => return t,
        }
    }
    t
}

use super::arena::{operand as reg, operand_whole as whole};

fn same(plan: &Plan, eo: Eo, a: TensorId, b: TensorId) -> bool {
    matches!((plan.region_at(a, eo), plan.region_at(b, eo)), (Some(x), Some(y)) if x.0 == y.0)
}

impl CpuInt8<'_> {
    fn pass(&self, mode: Mode) -> Pass {
        match mode {
            Mode::Train => Pass::Train(self.rescale),
            Mode::Eval => Pass::Eval,
            Mode::Recompute => Pass::Replay,
        }
    }
}

impl LayerOps for CpuInt8<'_> {
    fn forward(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        let pass = self.pass(cx.mode);
        CpuInt8::forward(self, cx.eo, host, cx.ins, cx.n, cx.x, pass)
    }
    fn grad_w(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        CpuInt8::grad_w(self, cx.eo, host, cx.ins, cx.n, cx.x)
    }
    fn grad_x(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        let pass = self.pass(cx.mode);
        CpuInt8::grad_x(self, cx.eo, host, cx.ins, cx.n, pass)
    }
}

impl LossOps for CpuInt8<'_> {
    fn loss(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        target: Target<'_>,
        norm: usize,
    ) -> Result<LossOut, ExecError> {
        let Target::Classes(y) = target else {
            return Err(ExecError::BadBatch("int8 training needs class targets", 0));
        };
        let train = cx.mode == Mode::Train;
        let (l, correct) = CpuInt8::loss(self, cx.eo, host, cx.n, y, train, norm)?;
        Ok(LossOut {
            sum: l as f64,
            mean: l / cx.n as f32,
            correct,
        })
    }
}

impl OptimOps for CpuInt8<'_> {
    fn apply(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        CpuInt8::apply(self, cx.eo, host, cx.ins)
    }
}

impl MoveOps for CpuInt8<'_> {
    fn convert_half(&mut self, _: &Cx<'_>, _: &mut [u8]) -> Result<(), ExecError> {
        Err(ExecError::BadPlan(
            "int8 plans have no fp16 storage (pack/unpack)",
        ))
    }
}

impl Backend for CpuInt8<'_> {
    fn name(&self) -> &'static str {
        "cpu-int8"
    }
    fn serves(&self, p: Placement) -> bool {
        p == Placement::Cpu
    }
    fn prepare(&mut self, plan: &Plan) -> Result<(), ExecError> {
        if !core::ptr::eq(plan, self.plan) {
            return Err(ExecError::BadPlan(
                "the int8 backend was built for another plan",
            ));
        }
        super::check_placements(self, plan)
    }
    fn begin_step(&mut self, plan: &Plan, step: &StepStart<'_>) -> Result<(), ExecError> {
        self.input_exp = quant::exp_for_max(quant::max_abs_f32(step.x));
        self.set_ex(plan.graph.input, self.input_exp);
        self.seed = step.seed;
        self.t = step.t;
        Ok(())
    }
    fn init_params(&mut self, _: &Plan, host: &mut [u8], seed: u64) -> Result<(), ExecError> {
        self.init_int8(host, seed)
    }
}
