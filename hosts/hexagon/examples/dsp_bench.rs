//! `cargo xtask bench dsp` runs this (it builds the counting plugin and passes it in
//! `FRUGAL_DSP_PLUGIN`): per-instruction CPU and DSP costs of an int8 training step of the digits
//! CNN and of a MobileNet-class model, the placements the DP picks (for this CPU and for one 30×
//! slower), checked against brute force where it can run and against an exact shortest path always,
//! the predicted step times (see `frugal_hexagon::cost`), and the bytes over the pipe per step with
//! every call's operands copied and with a planned DSP space (`DspPlan`), by node placement.
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
use frugal_hexagon::{DspBackend, DspPlan, QemuHexagon};

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

/// A MobileNet-class model for the int8 path: MobileNet v1's depthwise 3×3 + pointwise 1×1 blocks
/// with strides, at 3×32×32 and 10 classes (small enough for int8's exact i32 sums at batch 8).
const MOBILENET_CLASS: &str = r#"
[model]
input = [3, 32, 32]
loss = "cross_entropy"

[optimizer]
type = "sgd"
lr = 0.01

[[layers]]
name = "stem"
type = "conv2d"
out = 16
kernel = 3
stride = 2
padding = 1

[[layers]]
name = "relu0"
type = "relu"

[[layers]]
name = "dw1"
type = "conv2d"
out = 16
kernel = 3
padding = 1
groups = 16

[[layers]]
name = "pw1"
type = "conv2d"
out = 32
kernel = 1

[[layers]]
name = "relu1"
type = "relu"

[[layers]]
name = "dw2"
type = "conv2d"
out = 32
kernel = 3
stride = 2
padding = 1
groups = 32

[[layers]]
name = "pw2"
type = "conv2d"
out = 64
kernel = 1

[[layers]]
name = "relu2"
type = "relu"

[[layers]]
name = "dw3"
type = "conv2d"
out = 64
kernel = 3
padding = 1
groups = 64

[[layers]]
name = "pw3"
type = "conv2d"
out = 64
kernel = 1

[[layers]]
name = "relu3"
type = "relu"

[[layers]]
name = "dw4"
type = "conv2d"
out = 64
kernel = 3
stride = 2
padding = 1
groups = 64

[[layers]]
name = "pw4"
type = "conv2d"
out = 128
kernel = 1

[[layers]]
name = "relu4"
type = "relu"

[[layers]]
name = "pool"
type = "maxpool2d"
kernel = 2

[[layers]]
name = "flat"
type = "flatten"

[[layers]]
name = "fc"
type = "linear"
out = 10
"#;

fn main() -> Result<(), String> {
    let batch: usize = std::env::var("FRUGAL_DSP_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let plugin = std::env::var("FRUGAL_DSP_PLUGIN")
        .map_err(|_| "FRUGAL_DSP_PLUGIN (the counting plugin; run `cargo xtask bench dsp`)")?;
    let update = Int8Update::FloatMaster;
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/digits-cnn.toml");
    let m = load_model(&path).map_err(|e| e.to_string())?;
    let plan = Plan::new(
        Graph::with_precision(&m.spec, batch, Precision::Int8(update))
            .map_err(|e| e.to_string())?,
    );
    let (tr, _) = frugal_cli::data::digits();
    let per = tr.x.len() / tr.len();
    let idx: Vec<usize> = (0..batch).collect();
    let (mut x, mut y) = (vec![0f32; batch * per], vec![0u32; batch]);
    tr.batch(&idx, &mut x, &mut y);
    report(
        &format!("digits CNN, int8 (float master), batch {batch}"),
        &plan,
        &x,
        &y,
        &plugin,
    )?;

    // The MobileNet-class model at batch 8 (int8's exact i32 sums), on random inputs.
    let mb = 8;
    let m = frugal_cli::spec_toml::parse_model(MOBILENET_CLASS).map_err(|e| e.to_string())?;
    let plan = Plan::new(
        Graph::with_precision(&m.spec, mb, Precision::Int8(update)).map_err(|e| e.to_string())?,
    );
    let mut rng = frugal_core::rng::Rng::new(3);
    let x: Vec<f32> = (0..mb * 3 * 32 * 32)
        .map(|_| rng.below(2001) as f32 / 1000.0 - 1.0)
        .collect();
    let y: Vec<u32> = (0..mb).map(|_| rng.below(10) as u32).collect();
    println!();
    report(
        &format!(
            "MobileNet-class (depthwise 3×3 + pointwise 1×1 blocks, strides 2; 3×32×32), int8 (float master), batch {mb}"
        ),
        &plan,
        &x,
        &y,
        &plugin,
    )
}

/// The least total of `prob` by a shortest path over the explicit graph of (instruction, device)
/// states (Dijkstra over a binary heap): an exact method independent of the DP's code, for instances
/// too large for brute force.
/// The slower CPU of the second DP instance.
const CPU_SLOWER: f64 = 30.0;

fn shortest_path(prob: &Problem<'_>) -> f64 {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let (n, d) = (prob.cost.len() / prob.devices, prob.devices);
    let tr = |b: usize, from: usize, to: usize| prob.transfer[b * d * d + from * d + to];
    // State s = i·d + x: instructions 0..i done, the last on x; s = n·d + end: the sink.
    let mut dist = vec![f64::INFINITY; (n + 1) * d];
    let mut heap = BinaryHeap::new();
    // Total-order key on non-negative finite times.
    let key = |t: f64| Reverse(t.to_bits());
    for (x, slot) in dist.iter_mut().enumerate().take(d) {
        let t = tr(0, prob.start, x) + prob.cost[x];
        if t.is_finite() && t < *slot {
            *slot = t;
            heap.push((key(t), x));
        }
    }
    while let Some((Reverse(bits), s)) = heap.pop() {
        let t = f64::from_bits(bits);
        if t > dist[s] {
            continue;
        }
        let (i, x) = (s / d, s % d);
        if i == n {
            return t;
        }
        if i + 1 == n {
            let u = t + tr(n, x, prob.end);
            let sink = n * d + prob.end;
            if u < dist[sink] {
                dist[sink] = u;
                heap.push((key(u), sink));
            }
            continue;
        }
        for y in 0..d {
            let u = t + tr(i + 1, x, y) + prob.cost[(i + 1) * d + y];
            let s2 = (i + 1) * d + y;
            if u.is_finite() && u < dist[s2] {
                dist[s2] = u;
                heap.push((key(u), s2));
            }
        }
    }
    f64::INFINITY
}

/// Pipe bytes (to the DSP, from it) of the second of two steps of `plan` on `backend`.
fn second_step_bytes(
    plan: &Plan,
    backend: DspBackend<'_, QemuHexagon>,
    x: &[f32],
    y: &[u32],
) -> Result<[u64; 2], ExecError> {
    let pipe = |c: frugal_hexagon::Calls| [c.bytes_in, c.bytes_out];
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::with_backend(plan, &arena, backend)?;
    ex.init_params(&mut arena, 1)?;
    ex.train_step(&mut arena, x, Target::Classes(y))?;
    let c0 = pipe(ex.backend().calls());
    ex.train_step(&mut arena, x, Target::Classes(y))?;
    let c1 = pipe(ex.backend().calls());
    Ok([c1[0] - c0[0], c1[1] - c0[1]])
}

/// Pipe bytes (to the DSP, from it) of the second of two steps with nodes placed by `devs`: the
/// operands copied per call, and with a planned DSP space.
fn bytes_per_step(
    base: &Plan,
    devs: &[Placement],
    x: &[f32],
    y: &[u32],
) -> Result<([u64; 2], [u64; 2]), String> {
    let err = |e: ExecError| e.to_string();
    let qemu = || QemuHexagon::new().map_err(|e| e.to_string());
    let mut copying = base.clone();
    for ins in copying.program.iter_mut() {
        let on = ins.node != LOSS_NODE
            && ins.phase != Phase::Apply
            && devs.get(ins.node as usize) == Some(&Placement::Dsp);
        ins.placement = if on { Placement::Dsp } else { Placement::Cpu };
    }
    let b = DspBackend::new(&copying, qemu()?).map_err(err)?;
    let old = second_step_bytes(&copying, b, x, y).map_err(err)?;
    let dp = DspPlan::new(base.clone(), devs).map_err(|e| e.to_string())?;
    let b = DspBackend::planned(&dp, qemu()?).map_err(err)?;
    let new = second_step_bytes(&dp.plan, b, x, y).map_err(err)?;
    Ok((old, new))
}

fn report(title: &str, plan: &Plan, x: &[f32], y: &[u32], plugin: &str) -> Result<(), String> {
    let plugin = plugin.to_string();
    let n = plan.program.len();
    let err = |e: ExecError| e.to_string();

    // CPU: the fastest of 30 steps per instruction.
    let mut arena = vec![0u8; plan.needed_bytes()];
    let probe = Probe {
        inner: CpuInt8::new(plan).map_err(err)?,
        secs: vec![f64::INFINITY; n],
        calls: vec![(0, 0); n],
        count: None,
    };
    let mut ex = Executor::with_backend(plan, &arena, probe).map_err(err)?;
    ex.init_params(&mut arena, 1).map_err(err)?;
    for _ in 0..30 {
        ex.train_step(&mut arena, x, Target::Classes(y))
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
    ex.train_step(&mut arena, x, Target::Classes(y))
        .map_err(err)?;
    ex.train_step(&mut arena, x, Target::Classes(y))
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
        if !dsp_capable(plan, i) {
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
        "{title}: {n} instructions; DSP model {:.1} GHz, 1 packet/cycle; switch = {:.0} µs + live bytes / {:.0} GB/s",
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
            label(plan, i),
            cpu[i] * 1e6,
            packets[i],
            overhead[i],
            d,
            r
        );
    }

    let transfer = cost::transfers(plan);
    // The CPU measured here (x86-64 with AVX2 int8 products) and, as a second instance for the DP, a
    // CPU 30× slower per instruction (the order of a phone's efficiency core against this one).
    let mut placement = Vec::new();
    for scale in [1.0, CPU_SLOWER] {
        let mut costv = vec![0.0; n * 2];
        for i in 0..n {
            costv[2 * i] = cpu[i] * scale;
            costv[2 * i + 1] = dsp[i];
        }
        let prob = Problem {
            devices: 2,
            cost: &costv,
            transfer: &transfer,
            start: 0,
            end: 0,
        };
        let all_cpu = vec![0usize; n];
        let all_dsp: Vec<usize> = (0..n).map(|i| usize::from(dsp[i].is_finite())).collect();
        let (best, pl) = place(&prob).map_err(|e| format!("{e:?}"))?;
        println!();
        if scale == 1.0 {
            println!("predicted step time (model), this CPU:");
        } else {
            println!("predicted step time (model), CPU times ×{scale}:");
        }
        println!(
            "  all-CPU                         {:>10.1} µs",
            prob.total(&all_cpu) * 1e6
        );
        println!(
            "  all-DSP (every op it can run)   {:>10.1} µs",
            prob.total(&all_dsp) * 1e6
        );
        // Not in the model: every request is one FastRPC call on a phone (here, one pipe round
        // trip); an instruction makes several (GEMM tiles, one per convolution group).
        let requests: u64 = (0..n)
            .filter(|&i| dsp[i].is_finite())
            .map(|i| calls[i].1 - calls[i].0)
            .sum();
        println!(
            "  all-DSP + {:.0} µs per request     {:>10.1} µs  ({requests} requests: the model charges one call per device switch only)",
            cost::RPC_SECONDS * 1e6,
            (prob.total(&all_dsp) + requests as f64 * cost::RPC_SECONDS) * 1e6
        );
        println!(
            "  co-scheduled (DP)               {:>10.1} µs  ({} of {} instructions on the DSP)",
            best * 1e6,
            pl.iter().filter(|&&d| d == 1).count(),
            n
        );
        // Brute force over the instructions the DSP can run (the others have one choice).
        let free: Vec<usize> = (0..n).filter(|&i| dsp[i].is_finite()).collect();
        if free.len() <= 22 {
            let mut bf = f64::INFINITY;
            let mut p = all_cpu.clone();
            for mask in 0u64..(1 << free.len()) {
                for (k, &i) in free.iter().enumerate() {
                    p[i] = ((mask >> k) & 1) as usize;
                }
                bf = bf.min(prob.total(&p));
            }
            println!(
                "  brute force over 2^{} placements {:>10.1} µs  (DP / brute force = {:.6})",
                free.len(),
                bf * 1e6,
                best / bf
            );
        } else {
            println!(
                "  brute force skipped: 2^{} placements (the shortest path below is exact)",
                free.len()
            );
        }
        let sp = shortest_path(&prob);
        println!(
            "  shortest path (Dijkstra, exact)  {:>10.1} µs  (DP / shortest path = {:.6})",
            sp * 1e6,
            best / sp
        );
        let on: Vec<String> = (0..n)
            .filter(|&i| pl[i] == 1)
            .map(|i| label(plan, i))
            .collect();
        println!("  DP places on the DSP: {}", on.join(", "));
        placement = pl;
    }

    // Bytes over the pipe per step (the second of two), per node placement: every call's operands
    // copied (no DSP space) vs a planned DSP space.
    let nodes = plan.graph.nodes.len();
    let mut dp_nodes = vec![Placement::Cpu; nodes];
    for (ins, &p) in plan.program.iter().zip(&placement) {
        if ins.node != LOSS_NODE && p == 1 {
            dp_nodes[ins.node as usize] = Placement::Dsp;
        }
    }
    let heavy: Vec<Placement> = plan
        .graph
        .nodes
        .iter()
        .map(|nd| match nd.op {
            NodeOp::Linear { .. } | NodeOp::Conv(_) | NodeOp::MaxPool(_) => Placement::Dsp,
            _ => Placement::Cpu,
        })
        .collect();
    println!();
    println!("bytes to / from the DSP per step (the second), by node placement:");
    println!(
        "{:<46} {:>22} {:>22} {:>8}",
        "placement", "operands copied/call", "planned DSP space", "ratio"
    );
    for (name, devs) in [
        (
            "all nodes on the DSP".to_string(),
            vec![Placement::Dsp; nodes],
        ),
        ("conv/linear/pool on the DSP".to_string(), heavy),
        (
            format!("the DP's at CPU ×{CPU_SLOWER} (nodes it uses the DSP for)"),
            dp_nodes,
        ),
    ] {
        if devs.iter().all(|&d| d == Placement::Cpu) {
            println!("{name:<46} {:>22} {:>22} {:>8}", "0", "0", "-");
            continue;
        }
        let (old, new) = bytes_per_step(plan, &devs, x, y)?;
        let (o, p) = (old[0] + old[1], new[0] + new[1]);
        println!(
            "{name:<46} {:>22} {:>22} {:>8.3}",
            format!("{} / {}", old[0], old[1]),
            format!("{} / {}", new[0], new[1]),
            p as f64 / o as f64
        );
    }
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
