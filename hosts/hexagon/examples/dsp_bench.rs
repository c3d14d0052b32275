//! `cargo xtask bench dsp` runs this (it builds the counting plugin and passes it in
//! `FRUGAL_DSP_PLUGIN`): per-instruction CPU and DSP costs of an int8 training step of the digits
//! CNN, the placements the DP picks, and the predicted step times (see `frugal_hexagon::cost`).
use std::path::PathBuf;
use std::time::Instant;

use frugal_cli::spec_toml::load_model;
use frugal_core::backend::{
    Backend, CpuInt8, Cx, ExecError, LayerOps, LossOps, LossOut, MoveOps, OptimOps, Placement,
    StepStart, Target,
};
use frugal_core::exec::Executor;
use frugal_core::graph::{Graph, NodeOp};
use frugal_core::model::{Int8Update, Precision};
use frugal_core::plan::{Phase, Plan, LOSS_NODE};
use frugal_core::policy::placement::{place, Problem};
use frugal_hexagon::cost::{self, dsp_seconds};
use frugal_hexagon::{DspBackend, QemuHexagon};

/// Times every instruction of a backend (the fastest of all steps), or counts the DSP calls it makes.
struct Probe<B> {
    inner: B,
    secs: Vec<f64>,
    /// Per instruction: the range of DSP call numbers it made (DSP runs only).
    calls: Vec<(u64, u64)>,
    count: Option<fn(&mut B) -> u64>,
}

impl<B: Backend> Probe<B> {
    fn time<R>(&mut self, eo: usize, f: impl FnOnce(&mut B) -> R) -> R {
        let c0 = self.count.map(|c| c(&mut self.inner));
        let t0 = Instant::now();
        let r = f(&mut self.inner);
        let s = t0.elapsed().as_secs_f64();
        self.secs[eo] = self.secs[eo].min(s);
        if let (Some(c0), Some(c)) = (c0, self.count) {
            self.calls[eo] = (c0, c(&mut self.inner));
        }
        r
    }
}

impl<B: Backend> LayerOps for Probe<B> {
    fn forward(&mut self, cx: &Cx<'_>, h: &mut [u8]) -> Result<(), ExecError> {
        self.time(cx.eo as usize, |b| b.forward(cx, h))
    }
    fn grad_w(&mut self, cx: &Cx<'_>, h: &mut [u8]) -> Result<(), ExecError> {
        self.time(cx.eo as usize, |b| b.grad_w(cx, h))
    }
    fn grad_x(&mut self, cx: &Cx<'_>, h: &mut [u8]) -> Result<(), ExecError> {
        self.time(cx.eo as usize, |b| b.grad_x(cx, h))
    }
}
impl<B: Backend> LossOps for Probe<B> {
    fn loss(
        &mut self,
        cx: &Cx<'_>,
        h: &mut [u8],
        t: Target<'_>,
        norm: usize,
    ) -> Result<LossOut, ExecError> {
        self.time(cx.eo as usize, |b| b.loss(cx, h, t, norm))
    }
}
impl<B: Backend> OptimOps for Probe<B> {
    fn apply(&mut self, cx: &Cx<'_>, h: &mut [u8]) -> Result<(), ExecError> {
        self.time(cx.eo as usize, |b| b.apply(cx, h))
    }
}
impl<B: Backend> MoveOps for Probe<B> {
    fn convert_half(&mut self, cx: &Cx<'_>, h: &mut [u8]) -> Result<(), ExecError> {
        self.inner.convert_half(cx, h)
    }
}
impl<B: Backend> Backend for Probe<B> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn serves(&self, p: Placement) -> bool {
        self.inner.serves(p)
    }
    fn prepare(&mut self, plan: &Plan) -> Result<(), ExecError> {
        self.inner.prepare(plan)
    }
    fn begin_step(&mut self, plan: &Plan, s: &StepStart<'_>) -> Result<(), ExecError> {
        self.inner.begin_step(plan, s)
    }
    fn init_params(&mut self, plan: &Plan, h: &mut [u8], seed: u64) -> Result<(), ExecError> {
        self.inner.init_params(plan, h, seed)
    }
}

fn label(plan: &Plan, i: usize) -> String {
    let ins = &plan.program[i];
    let node = if ins.node == LOSS_NODE {
        "loss".to_string()
    } else {
        plan.graph.nodes[ins.node as usize].name.clone()
    };
    let ph = match ins.phase {
        Phase::Forward => "fwd",
        Phase::GradW => "dW",
        Phase::GradX => "dX",
        Phase::Apply => "apply",
        Phase::Loss => "loss",
        _ => "other",
    };
    format!("{ph} {node}")
}

/// Whether the DSP has kernels for instruction `i` (Linear/Conv in every phase, max-pool).
fn dsp_capable(plan: &Plan, i: usize) -> bool {
    let ins = &plan.program[i];
    if ins.node == LOSS_NODE || !matches!(ins.phase, Phase::Forward | Phase::GradW | Phase::GradX) {
        return false;
    }
    matches!(
        plan.graph.nodes[ins.node as usize].op,
        NodeOp::Linear { .. } | NodeOp::Conv(_) | NodeOp::MaxPool(_)
    )
}

fn main() -> Result<(), String> {
    let batch: usize = std::env::var("FRUGAL_DSP_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let plugin = std::env::var("FRUGAL_DSP_PLUGIN")
        .map_err(|_| "FRUGAL_DSP_PLUGIN (the counting plugin; run `cargo xtask bench dsp`)")?;
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/digits-cnn.toml");
    let m = load_model(&path).map_err(|e| e.to_string())?;
    let update = Int8Update::FloatMaster;
    let plan = Plan::new(
        Graph::with_precision(&m.spec, batch, Precision::Int8(update))
            .map_err(|e| e.to_string())?,
    );
    let n = plan.program.len();
    let (tr, _) = frugal_cli::data::digits();
    let per = tr.x.len() / tr.len();
    let idx: Vec<usize> = (0..batch).collect();
    let (mut x, mut y) = (vec![0f32; batch * per], vec![0u32; batch]);
    tr.batch(&idx, &mut x, &mut y);
    let err = |e: ExecError| e.to_string();

    // CPU: the fastest of 30 steps per instruction.
    let mut arena = vec![0u8; plan.needed_bytes()];
    let probe = Probe {
        inner: CpuInt8::new(&plan).map_err(err)?,
        secs: vec![f64::INFINITY; n],
        calls: vec![(0, 0); n],
        count: None,
    };
    let mut ex = Executor::with_backend(&plan, &arena, probe).map_err(err)?;
    ex.init_params(&mut arena, 1).map_err(err)?;
    for _ in 0..30 {
        ex.train_step(&mut arena, &x, Target::Classes(&y))
            .map_err(err)?;
    }
    let cpu = ex.backend().secs.clone();

    // DSP: one warm step, then one counted step, all placed on the DSP.
    let mut dp = plan.clone();
    for ins in dp.program.iter_mut() {
        ins.placement = Placement::Dsp;
    }
    let log = std::env::temp_dir().join(format!("frugal-dsp-bench-{}.log", std::process::id()));
    let q = QemuHexagon::new()
        .map_err(|e| e.to_string())?
        .with_extra_args(&[
            "-plugin".into(),
            plugin,
            "-d".into(),
            "plugin".into(),
            "-D".into(),
            log.display().to_string(),
        ]);
    let mut arena = vec![0u8; dp.needed_bytes()];
    let probe = Probe {
        inner: DspBackend::new(&dp, q).map_err(err)?,
        secs: vec![f64::INFINITY; n],
        calls: vec![(0, 0); n],
        count: Some(|b: &mut DspBackend<'_, QemuHexagon>| b.with_transport(|t| t.calls)),
    };
    let mut ex = Executor::with_backend(&dp, &arena, probe).map_err(err)?;
    ex.init_params(&mut arena, 1).map_err(err)?;
    ex.train_step(&mut arena, &x, Target::Classes(&y))
        .map_err(err)?;
    ex.train_step(&mut arena, &x, Target::Classes(&y))
        .map_err(err)?;
    let calls = ex.backend().calls.clone();
    let dsp_calls = ex.backend().inner.calls();
    // The skel marks the start of its next read too; closing its input ends it and completes the log.
    ex.backend_mut()
        .inner
        .with_transport(|t| t.finish())
        .map_err(|e| e.to_string())?;
    drop(ex);
    let text = std::fs::read_to_string(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let _ = std::fs::remove_file(&log);
    // Request k (1-based call number k) costs per_req[k - 1]: mark k is printed before request k.
    let per_req = cost::packets_per_request(&text);
    let mut dsp = vec![f64::INFINITY; n];
    let (mut packets, mut overhead) = (vec![0u64; n], vec![0u64; n]);
    for i in 0..n {
        if !dsp_capable(&plan, i) {
            continue;
        }
        let (c0, c1) = calls[i];
        for c in c0..c1 {
            let r = per_req
                .get(c as usize)
                .copied()
                .ok_or("the plugin's log has fewer requests than were made")?;
            packets[i] += r.kernel;
            overhead[i] += r.total - r.kernel;
        }
        // The model charges the kernels; the pipe's framing and checksums are this transport's.
        dsp[i] = dsp_seconds(packets[i]);
    }

    println!(
        "digits CNN, int8 (float master), batch {batch}: {n} instructions; DSP model {:.1} GHz, 1 packet/cycle; switch = {:.0} µs + live bytes / {:.0} GB/s",
        cost::DSP_HZ / 1e9,
        cost::RPC_SECONDS * 1e6,
        cost::COPY_BYTES_PER_SECOND / 1e9
    );
    println!(
        "DSP requests in the counted step: {} GEMM, {} rescale, {} pool, {} quantise; {} KiB in, {} KiB out",
        dsp_calls.gemm / 2,
        dsp_calls.rescale / 2,
        dsp_calls.pool / 2,
        dsp_calls.quantize / 2,
        dsp_calls.bytes_in / 2048,
        dsp_calls.bytes_out / 2048
    );
    println!(
        "{:<16} {:>10} {:>14} {:>14} {:>10} {:>9}",
        "instruction", "CPU µs", "kernel packets", "pipe packets", "DSP µs", "DSP/CPU"
    );
    for i in 0..n {
        let r = if dsp[i].is_finite() {
            format!("{:.2}", dsp[i] / cpu[i])
        } else {
            "-".into()
        };
        let d = if dsp[i].is_finite() {
            format!("{:.1}", dsp[i] * 1e6)
        } else {
            "CPU only".into()
        };
        println!(
            "{:<16} {:>10.1} {:>14} {:>14} {:>10} {:>9}",
            label(&plan, i),
            cpu[i] * 1e6,
            packets[i],
            overhead[i],
            d,
            r
        );
    }

    let mut costv = vec![0.0; n * 2];
    for i in 0..n {
        costv[2 * i] = cpu[i];
        costv[2 * i + 1] = dsp[i];
    }
    let transfer = cost::transfers(&plan);
    let prob = Problem {
        devices: 2,
        cost: &costv,
        transfer: &transfer,
        start: 0,
        end: 0,
    };
    let all_cpu = vec![0usize; n];
    let all_dsp: Vec<usize> = (0..n).map(|i| usize::from(dsp[i].is_finite())).collect();
    let (best, placement) = place(&prob).map_err(|e| format!("{e:?}"))?;
    println!();
    println!("predicted step time (model):");
    println!(
        "  all-CPU                         {:>10.1} µs",
        prob.total(&all_cpu) * 1e6
    );
    println!(
        "  all-DSP (every op it can run)   {:>10.1} µs",
        prob.total(&all_dsp) * 1e6
    );
    println!(
        "  co-scheduled (DP)               {:>10.1} µs  ({} of {} instructions on the DSP)",
        best * 1e6,
        placement.iter().filter(|&&d| d == 1).count(),
        n
    );
    // Brute force over the instructions the DSP can run (the others have one choice).
    let free: Vec<usize> = (0..n).filter(|&i| dsp[i].is_finite()).collect();
    if free.len() <= 22 {
        let mut bf = f64::INFINITY;
        let mut pl = all_cpu.clone();
        for mask in 0u64..(1 << free.len()) {
            for (k, &i) in free.iter().enumerate() {
                pl[i] = ((mask >> k) & 1) as usize;
            }
            bf = bf.min(prob.total(&pl));
        }
        println!(
            "  brute force over 2^{} placements {:>10.1} µs  (DP / brute force = {:.6})",
            free.len(),
            bf * 1e6,
            best / bf
        );
    } else {
        println!("  brute force skipped: {} free instructions", free.len());
    }
    let on: Vec<String> = (0..n)
        .filter(|&i| placement[i] == 1)
        .map(|i| label(&plan, i))
        .collect();
    println!("  DP places on the DSP: {}", on.join(", "));
    println!();
    println!("Mandheling Table 3 (DSP-unfriendly ops, DSP/CPU latency): Transpose 25/3 = 8.3, WeightRotate 20/4 = 5.0, Slice 17/4 = 4.3");
    let ratio = |pred: &dyn Fn(&NodeOp) -> bool| {
        let (mut c, mut d) = (0.0, 0.0);
        for i in 0..n {
            let ins = &plan.program[i];
            if dsp[i].is_finite() && pred(&plan.graph.nodes[ins.node as usize].op) {
                c += cpu[i];
                d += dsp[i];
            }
        }
        d / c
    };
    println!(
        "here (DSP model / this CPU): max-pool (scalar byte shuffles on the DSP) {:.2}, conv/linear (HVX GEMM) {:.2}",
        ratio(&|o| matches!(o, NodeOp::MaxPool(_))),
        ratio(&|o| matches!(o, NodeOp::Conv(_) | NodeOp::Linear { .. }))
    );
    Ok(())
}
