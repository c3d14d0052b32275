//! `cargo xtask bench gpu [--reps R]` runs this (`cargo run --release -p frugal-wgpu --example
//! bench_gpu`; a separate binary, so that the memory benchmark's process does not carry wgpu): the
//! tiled SGEMM on the adapter this machine has
//! (lavapipe on a machine without a GPU), 1024³ and the digits MLP's shapes, in GFLOPS beside frugal's CPU
//! SGEMM on the same machine in the same run (best of `R`, default 5). On lavapipe the "GPU" runs on the
//! CPU's cores: the ratio is for information, not a GPU figure.
//!
//! `--placement` instead: mixed CPU/GPU placement — the digits MLP (batch 32) and the digits CNN
//! (examples/digits-cnn.toml, batch 32): per-layer times and the link measured (`frugal_wgpu::auto`),
//! the DP's placement printed, then ms/step of all-CPU (the CPU backend on one thread, as the mixed
//! backend's CPU side runs), all-GPU, the DP's placement (the CPU backend alone when it puts every
//! layer on the CPU, as `--device auto` then trains) and alternating layers (a forced mixed plan),
//! rounds alternating, median of each round's steps, best round of `R`.
//!
//! Then whole training steps: the digits MLP (8×8 → 128 → 64 → 10, Adam) at batch 32 and 128, and the
//! reference workloads LeNet-5 and the small CNN at batch 128, on the GPU backend (one submission per
//! step, the loss read back) beside the CPU backend on the same threads, alternating, median ms/step of
//! each round's steps, best round of `R`.
//!
//! `--one ROW …`: one measurement, printed as one `BENCH-JSON {…}` line — what `cargo xtask bench gpu
//! --burn` runs, alternating with Burn's wgpu backend (tests/bench/burn-wgpu) in fresh processes.

#[cfg(target_arch = "wasm32")]
fn main() {}

#[cfg(not(target_arch = "wasm32"))]
fn main() {
    native::main()
}

#[cfg(not(target_arch = "wasm32"))]
mod native {
    use std::time::Instant;

    use frugal_core::backend::{Backend, CpuBackend};
    use frugal_core::exec::{Executor, Target};
    use frugal_core::graph::Graph;
    use frugal_core::kernels::gemm::{gemm_scratch_len_threads, sgemm_with_pool, SgemmKernel};
    use frugal_core::kernels::MatRef;
    use frugal_core::model::{Dims, LayerKind, LayerSpec, LossKind, ModelSpec, OptimizerSpec, Src};
    use frugal_core::plan::Plan;
    use frugal_core::pool::ThreadPool;
    use frugal_wgpu::{gpu_plan, Gpu, GpuBackend};

    /// The digits MLP (examples/digits-mlp.toml's layers).
    fn digits_mlp() -> ModelSpec {
        let l = |name: &str, kind, from: Src| LayerSpec {
            name: name.into(),
            kind,
            inputs: vec![from],
            trainable: true,
            update: frugal_core::model::Update::All,
        };
        use LayerKind as K;
        use Src::{Input, Layer};
        ModelSpec {
            input: Dims { c: 1, h: 8, w: 8 },
            layers: vec![
                l("flat", K::Flatten, Input),
                l(
                    "fc1",
                    K::Linear {
                        out: 128,
                        bias: true,
                    },
                    Layer(0),
                ),
                l("relu1", K::Relu, Layer(1)),
                l(
                    "fc2",
                    K::Linear {
                        out: 64,
                        bias: true,
                    },
                    Layer(2),
                ),
                l("relu2", K::Relu, Layer(3)),
                l(
                    "fc3",
                    K::Linear {
                        out: 10,
                        bias: true,
                    },
                    Layer(4),
                ),
            ],
            loss: LossKind::SoftmaxCrossEntropy,
            optimizer: OptimizerSpec::Adam {
                lr: 0.003,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.0,
            },
            seed: 1,
        }
    }

    /// `--placement`: all-CPU, all-GPU, the DP's placement and alternating layers, ms/step.
    fn placements(reps: usize) -> Result<(), String> {
        use frugal_core::backend::Placement;
        use frugal_wgpu::{auto::auto_plan, mixed_plan, MixedBackend};
        let gpu = Gpu::open().map_err(|e| e.to_string())?;
        println!(
            "`cargo xtask bench gpu --placement` — adapter: {}{}; CPU: one thread; best of {reps}\n",
            gpu.adapter(),
            if gpu.is_software() { " (software: runs on this CPU — information only)" } else { "" },
        );
        let cnn = frugal_cli::spec_toml::load_model(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/digits-cnn.toml"
        )))
        .map_err(|e| e.to_string())?
        .spec;
        let mut table = Vec::new();
        for (title, spec, batch) in [("digits MLP", digits_mlp(), 32), ("digits CNN", cnn, 32)] {
            let plan = Plan::new(Graph::new(&spec, batch).map_err(|e| e.to_string())?);
            let per = spec.input.numel();
            let classes = plan.graph.pred_dims().numel();
            let x: Vec<f32> = (0..batch * per).map(|i| (i % 17) as f32 / 16.0).collect();
            let y: Vec<u32> = (0..batch).map(|i| (i % classes) as u32).collect();
            let backend = GpuBackend::open().map_err(|e| e.to_string())?;
            let (auto, backend) = auto_plan(
                &plan,
                &CpuBackend::new(),
                backend,
                &x,
                Target::Classes(&y),
                5,
            )
            .map_err(|e| e.to_string())?;
            let l = auto.measured.link;
            println!(
                "{title}, batch {batch} — link: host→GPU {:.1} µs + {:.2} GB/s, GPU→host {:.1} µs + {:.2} GB/s",
                l.up_latency * 1e6,
                l.up_bandwidth / 1e9,
                l.down_latency * 1e6,
                l.down_bandwidth / 1e9
            );
            for (i, node) in plan.graph.nodes.iter().enumerate() {
                let [c, g] = auto.measured.node[i];
                println!(
                    "  {:<8} {:<3}  cpu {:.3} ms  gpu {:.3} ms",
                    node.name,
                    if auto.devices[i] == Placement::Gpu {
                        "gpu"
                    } else {
                        "cpu"
                    },
                    c * 1e3,
                    g * 1e3
                );
            }
            println!(
                "  DP predicts {:.3} ms/step (all-CPU by the same measurements {:.3})\n",
                auto.predicted * 1e3,
                auto.all_cpu * 1e3
            );
            let n = plan.graph.nodes.len();
            let alt: Vec<Placement> = (0..n)
                .map(|i| {
                    if i % 2 == 0 {
                        Placement::Gpu
                    } else {
                        Placement::Cpu
                    }
                })
                .collect();
            let alt_plan = mixed_plan(plan.clone(), &alt).map_err(|e| e.to_string())?;
            let gp = gpu_plan(plan.clone());
            let open = || GpuBackend::open().map_err(|e| e.to_string());
            let mut a_cpu = vec![0u8; plan.needed_bytes()];
            let mut a_gpu = vec![0u8; gp.needed_bytes()];
            let mut a_dp = vec![0u8; auto.plan.needed_bytes()];
            let mut a_alt = vec![0u8; alt_plan.needed_bytes()];
            let err = |e: frugal_core::backend::ExecError| e.to_string();
            let mut e_cpu =
                Executor::with_backend(&plan, &a_cpu, CpuBackend::new()).map_err(err)?;
            let mut e_gpu = Executor::with_backend(&gp, &a_gpu, open()?).map_err(err)?;
            let mut e_dp = Executor::with_backend(&auto.plan, &a_dp, MixedBackend::new(backend))
                .map_err(err)?;
            let mut e_alt = Executor::with_backend(&alt_plan, &a_alt, MixedBackend::new(open()?))
                .map_err(err)?;
            e_cpu.init_params(&mut a_cpu, 1).map_err(err)?;
            e_gpu.init_params(&mut a_gpu, 1).map_err(err)?;
            e_dp.init_params(&mut a_dp, 1).map_err(err)?;
            e_alt.init_params(&mut a_alt, 1).map_err(err)?;
            let dp_cpu = auto.devices.iter().all(|&d| d == Placement::Cpu);
            let mut best = [f64::MAX; 4];
            for _ in 0..reps {
                best[0] = best[0].min(ms_per_step(&mut e_cpu, &mut a_cpu, &x, &y, 20)?);
                best[1] = best[1].min(ms_per_step(&mut e_gpu, &mut a_gpu, &x, &y, 20)?);
                // All on the CPU: `--device auto` then trains on the CPU backend alone.
                best[2] = best[2].min(if dp_cpu {
                    ms_per_step(&mut e_cpu, &mut a_cpu, &x, &y, 20)?
                } else {
                    ms_per_step(&mut e_dp, &mut a_dp, &x, &y, 20)?
                });
                best[3] = best[3].min(ms_per_step(&mut e_alt, &mut a_alt, &x, &y, 20)?);
            }
            let moves = |p: &Plan| frugal_core::policy::spaces::move_volume(p).0;
            table.push(format!(
                "| {title} | {batch} | {:.3} | {:.3} | {:.3} ({} on GPU, {} moves) | {:.3} ({} moves) |",
                best[0],
                best[1],
                best[2],
                auto.devices.iter().filter(|&&d| d == Placement::Gpu).count(),
                moves(&auto.plan),
                best[3],
                moves(&alt_plan),
            ));
        }
        println!("| model | batch | all-CPU ms/step | all-GPU ms/step | DP placement ms/step | alternating ms/step |");
        println!("|---|---:|---:|---:|---:|---:|");
        for row in table {
            println!("{row}");
        }
        Ok(())
    }

    /// Median ms/step of `steps` steps on `ex` (after one untimed step).
    fn ms_per_step<B: Backend>(
        ex: &mut Executor<'_, B>,
        arena: &mut [u8],
        x: &[f32],
        y: &[u32],
        steps: usize,
    ) -> Result<f64, String> {
        ms_per_step_after(ex, arena, x, y, 1, steps)
    }

    /// Median ms/step of `steps` steps on `ex` after `warmup` untimed ones.
    fn ms_per_step_after<B: Backend>(
        ex: &mut Executor<'_, B>,
        arena: &mut [u8],
        x: &[f32],
        y: &[u32],
        warmup: usize,
        steps: usize,
    ) -> Result<f64, String> {
        let mut t = Vec::with_capacity(steps);
        for i in 0..warmup + steps {
            let s = Instant::now();
            ex.train_step(arena, x, Target::Classes(y))
                .map_err(|e| e.to_string())?;
            if i >= warmup {
                t.push(s.elapsed().as_secs_f64() * 1e3);
            }
        }
        t.sort_by(f64::total_cmp);
        Ok(t[t.len() / 2])
    }

    /// GFLOPS of frugal's CPU SGEMM (`kern`, on `pool`'s `threads`) for one product of `a`·`b`.
    #[allow(clippy::too_many_arguments)]
    fn cpu_gflops(
        kern: SgemmKernel,
        pool: &ThreadPool,
        threads: usize,
        (m, n, k): (usize, usize, usize),
        a: &[f32],
        b: &[f32],
    ) -> f64 {
        let mut c = vec![0f32; m * n];
        let mut s = vec![0f32; gemm_scratch_len_threads(m, n, k, threads)];
        // One untimed product (fresh pages), then 8 timed together.
        let mut secs = 0.0;
        for timed in [1usize, 8] {
            let t = Instant::now();
            for _ in 0..timed {
                sgemm_with_pool(
                    kern,
                    pool,
                    m,
                    n,
                    k,
                    MatRef::row_major(a, k),
                    MatRef::row_major(b, n),
                    &mut c,
                    n,
                    false,
                    &mut s,
                );
            }
            secs = t.elapsed().as_secs_f64() / timed as f64;
        }
        std::hint::black_box(&c);
        2.0 * (m * n * k) as f64 / secs / 1e9
    }

    pub fn main() {
        let args: Vec<String> = std::env::args().skip(1).collect();
        if let Err(e) = run(&args) {
            eprintln!("bench_gpu: {e}");
            std::process::exit(1);
        }
    }

    /// `s` as a JSON string literal.
    fn json_str(s: &str) -> String {
        let mut o = String::from('"');
        for c in s.chars() {
            match c {
                '"' | '\\' => {
                    o.push('\\');
                    o.push(c);
                }
                c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
                c => o.push(c),
            }
        }
        o.push('"');
        o
    }

    /// A flag's positive number, or `default` when absent.
    fn flag(args: &[String], name: &str, default: usize) -> Result<usize, String> {
        match args.iter().position(|a| a == name) {
            None => Ok(default),
            Some(i) => args
                .get(i + 1)
                .and_then(|v| v.parse().ok())
                .filter(|&v| v > 0)
                .ok_or_else(|| format!("{name} needs a positive number")),
        }
    }

    /// Median, min and max of `v` (non-empty).
    fn med_min_max(v: &mut [f64]) -> (f64, f64, f64) {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    }

    /// ‖got − want‖ / ‖want‖ (Frobenius; NaN anywhere gives NaN).
    fn rel_err(got: &[f32], want: &[f32]) -> f64 {
        let (mut d, mut w) = (0f64, 0f64);
        for (&g, &r) in got.iter().zip(want) {
            d += (g as f64 - r as f64).powi(2);
            w += (r as f64).powi(2);
        }
        if got.len() != want.len() {
            return f64::NAN;
        }
        (d / w.max(f64::MIN_POSITIVE)).sqrt()
    }

    /// Deterministic operands in [-1, 1) (never zeros: zeros hide unwritten outputs).
    fn operand(len: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// Clocks an idle GPU up before a timing (an idle H100 starts at 345 MHz of 1,980): `bufs`'
    /// products by the default kernel for ≥ 1 s, untimed; nothing on a software adapter.
    fn warm_up(gpu: &Gpu, bufs: &frugal_wgpu::GemmBuffers) -> Result<(), String> {
        if gpu.is_software() {
            return Ok(());
        }
        let t = Instant::now();
        while t.elapsed().as_secs_f64() < 1.0 {
            gpu.time_sgemm(bufs, 4).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// GFLOPS of the default kernel on `bufs`, one timing: products back to back in one submission of
    /// ≥ 2 ms (≥ 4 products), so that submit latency stays out.
    fn sgemm_gflops(gpu: &Gpu, bufs: &frugal_wgpu::GemmBuffers) -> Result<f64, String> {
        let est = gpu.time_sgemm(bufs, 4).map_err(|e| e.to_string())?;
        let reps = ((2e-3 / est).ceil() as usize).clamp(4, 1024);
        let s = gpu.time_sgemm(bufs, reps).map_err(|e| e.to_string())?;
        Ok(Gpu::flops(bufs) / s / 1e9)
    }

    /// `--sgemm-sweep [--sizes N,N,…] [--timings T] [--top K]`: every SGEMM candidate (the legacy
    /// `sgemm.wgsl` and `GemmVariant::sweep()`) on N³ products of resident operands (default 1024,
    /// 2048, 4096; 256 on a software adapter). Each is first checked against frugal's CPU SGEMM
    /// (‖C − C_cpu‖/‖C_cpu‖ printed; C poisoned with NaN first; over 1e-3 — far above f32 rounding
    /// at these k — is flagged WRONG and excluded), then timed: `T` (default 5) timings, each of ≥ 8
    /// back-to-back products in one pass of one submission (more when one product is under 0.25 ms,
    /// so that a submission lasts ≥ 2 ms and its latency stays out), median and min–max GFLOPS.
    /// Sizes beyond the first run the `K` (default 6) fastest of the first size plus the legacy kernel,
    /// skipping a candidate the first size predicts over 4 s. Then the `K` fastest fast kernels in the
    /// transposed layouts (A k×m, B n×k, both) at the first size, checked against the legacy kernel in
    /// the same layout. One `BENCH-JSON` line per measurement; the winners last.
    fn sgemm_sweep(args: &[String]) -> Result<(), String> {
        use frugal_wgpu::{GemmKernel, GemmOpts, GemmVariant};
        let start = Instant::now();
        let gpu = Gpu::open().map_err(|e| e.to_string())?;
        let soft = gpu.is_software();
        let sizes: Vec<usize> = match args.iter().position(|a| a == "--sizes") {
            Some(i) => args
                .get(i + 1)
                .map(|v| {
                    v.split(',')
                        .map(|x| x.trim().parse::<usize>())
                        .collect::<Result<Vec<_>, _>>()
                })
                .and_then(Result::ok)
                .filter(|v| !v.is_empty() && v.iter().all(|&n| n > 0))
                .ok_or("--sizes needs positive sizes, comma-separated")?,
            None if soft => vec![256],
            None => vec![1024, 2048, 4096],
        };
        let timings = flag(args, "--timings", 5)?;
        let top = flag(args, "--top", 6)?;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let pool =
            ThreadPool::new(threads).map_err(|e| format!("cannot start {threads} threads: {e}"))?;
        println!(
            "`bench_gpu --sgemm-sweep` — adapter: {}",
            gpu.adapter_details()
        );
        if soft {
            println!(
                "(software adapter: runs on this CPU; checks the candidates, not a GPU figure)"
            );
        }
        let adapter = json_str(&gpu.adapter_details());
        // The candidates: None is the legacy kernel.
        let mut cands: Vec<(String, Option<GemmKernel>)> = vec![("legacy-sgemm.wgsl".into(), None)];
        for v in GemmVariant::sweep() {
            match gpu.gemm_kernel(v) {
                Ok(k) => cands.push((v.name(), Some(k))),
                Err(e) => {
                    println!("  {:<24} not compiled: {e}", v.name());
                    println!(
                        "BENCH-JSON {{\"side\":\"frugal-wgpu\",\"row\":\"sgemm-sweep\",\"variant\":{},\"skipped\":{},\"adapter\":{adapter}}}",
                        json_str(&v.name()),
                        json_str(&e.to_string())
                    );
                }
            }
        }
        println!(
            "{} candidates compiled in {:.1} s; {timings} timings each\n",
            cands.len(),
            start.elapsed().as_secs_f64()
        );
        // Times one candidate on `bufs` (already checked): (median, min, max) GFLOPS and reps.
        let time = |kern: Option<&GemmKernel>,
                    bufs: &frugal_wgpu::GemmBuffers|
         -> Result<((f64, f64, f64), usize), String> {
            let flops = Gpu::flops(bufs);
            let est = gpu.time_gemm(kern, bufs, 8).map_err(|e| e.to_string())?;
            let reps = ((2e-3 / est).ceil() as usize).clamp(8, 256);
            let mut g: Vec<f64> = (0..timings)
                .map(|_| gpu.time_gemm(kern, bufs, reps).map(|s| flops / s / 1e9))
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?;
            Ok((med_min_max(&mut g), reps))
        };
        println!("| variant | m×n×k | layout | rel. error | bit-equal to legacy | GFLOPS median | min–max | reps |");
        println!("|---|---|---|---:|---|---:|---|---:|");
        // GFLOPS at the first size, by candidate index.
        // Clocks up first (an idle GPU starts slow: 345 MHz of 1,980 on the H100): the legacy kernel
        // at the largest size for ≥ 1 s, untimed.
        {
            let n = *sizes.iter().max().unwrap_or(&256);
            let warm = gpu
                .gemm_buffers(n, n, n, &operand(n * n, 5), &operand(n * n, 6))
                .map_err(|e| e.to_string())?;
            let t = Instant::now();
            while t.elapsed().as_secs_f64() < 1.0 {
                gpu.time_gemm(None, &warm, 4).map_err(|e| e.to_string())?;
            }
        }
        let mut first: Vec<(usize, f64)> = Vec::new();
        let mut best: Vec<(usize, String, f64)> = Vec::new();
        for (si, &n) in sizes.iter().enumerate() {
            let a = operand(n * n, 1 + n as u64);
            let b = operand(n * n, 2 + n as u64);
            let mut want = vec![0f32; n * n];
            let mut scratch = vec![0f32; gemm_scratch_len_threads(n, n, n, threads)];
            sgemm_with_pool(
                SgemmKernel::selected(),
                &pool,
                n,
                n,
                n,
                MatRef::row_major(&a, n),
                MatRef::row_major(&b, n),
                &mut want,
                n,
                false,
                &mut scratch,
            );
            let bufs = gpu
                .gemm_buffers(n, n, n, &a, &b)
                .map_err(|e| e.to_string())?;
            let mut legacy: Option<Vec<f32>> = None;
            let mut size_best: Option<(String, f64)> = None;
            for (ci, (name, kern)) in cands.iter().enumerate() {
                if si > 0 && ci > 0 {
                    // Beyond the first size: the `top` fastest there, unless predicted too slow.
                    let Some(rank) = first.iter().position(|&(c, _)| c == ci) else {
                        continue;
                    };
                    let predicted = 2.0 * (n as f64).powi(3) / (first[rank].1 * 1e9)
                        * (8 * (timings + 2)) as f64;
                    if rank >= top || predicted > 4.0 {
                        continue;
                    }
                }
                if let Some(k) = kern {
                    if !k.variant().fits(n as u32, n as u32, n as u32, false, false) {
                        println!("| {name} | {n}³ | nn | — | — | does not fit | | |");
                        continue;
                    }
                }
                gpu.fill_c(&bufs, f32::NAN);
                let got = gpu
                    .run_gemm(kern.as_ref(), &bufs)
                    .map_err(|e| e.to_string())?;
                let err = rel_err(&got, &want);
                let same = match &legacy {
                    None => {
                        legacy = Some(got.clone());
                        true
                    }
                    Some(l) => l.iter().zip(&got).all(|(x, y)| x.to_bits() == y.to_bits()),
                };
                // f32 products summed in another order differ from the CPU's by ~√k·2⁻²⁴ relatively;
                // 1e-3 flags only a wrong kernel (a missed tile or element gives errors near 1).
                if err.is_nan() || err > 1e-3 {
                    println!("| {name} | {n}³ | nn | {err:.2e} WRONG | {same} | excluded | | |");
                    println!(
                        "BENCH-JSON {{\"side\":\"frugal-wgpu\",\"row\":\"sgemm-sweep\",\"variant\":{},\"n\":{n},\"layout\":\"nn\",\"rel_err\":{},\"wrong\":true,\"adapter\":{adapter}}}",
                        json_str(name),
                        if err.is_nan() { "null".to_string() } else { format!("{err:e}") }
                    );
                    continue;
                }
                let ((med, lo, hi), reps) = time(kern.as_ref(), &bufs)?;
                println!("| {name} | {n}³ | nn | {err:.2e} | {same} | {med:.1} | {lo:.1}–{hi:.1} | {reps} |");
                println!(
                    "BENCH-JSON {{\"side\":\"frugal-wgpu\",\"row\":\"sgemm-sweep\",\"variant\":{},\"n\":{n},\"layout\":\"nn\",\"rel_err\":{err:e},\"bit_equal_legacy\":{same},\"gflops\":{med:.3},\"gflops_min\":{lo:.3},\"gflops_max\":{hi:.3},\"reps\":{reps},\"timings\":{timings},\"adapter\":{adapter}}}",
                    json_str(name)
                );
                if si == 0 {
                    first.push((ci, med));
                }
                if size_best.as_ref().is_none_or(|(_, g)| med > *g) {
                    size_best = Some((name.clone(), med));
                }
            }
            if si == 0 {
                // The legacy kernel again, last: its drift over the sweep is the measurement's noise.
                let ((med, lo, hi), reps) = time(None, &bufs)?;
                println!("| legacy-sgemm.wgsl (again, last) | {n}³ | nn | | | {med:.1} | {lo:.1}–{hi:.1} | {reps} |");
                println!(
                    "BENCH-JSON {{\"side\":\"frugal-wgpu\",\"row\":\"sgemm-sweep\",\"variant\":\"legacy-sgemm.wgsl-again\",\"n\":{n},\"layout\":\"nn\",\"gflops\":{med:.3},\"gflops_min\":{lo:.3},\"gflops_max\":{hi:.3},\"reps\":{reps},\"timings\":{timings},\"adapter\":{adapter}}}"
                );
                first.sort_by(|x, y| y.1.total_cmp(&x.1));
            }
            if let Some((name, g)) = size_best {
                best.push((n, name, g));
            }
        }
        // The fastest fast kernels in the transposed layouts, at the first size.
        let n = sizes[0];
        let a = operand(n * n, 3);
        let b = operand(n * n, 4);
        let mut layout_best = Vec::new();
        for (ta, tb, layout) in [(true, false, "tn"), (false, true, "nt"), (true, true, "tt")] {
            let opts = GemmOpts {
                trans_a: ta,
                trans_b: tb,
                accumulate: false,
            };
            let bufs = gpu
                .gemm_buffers_with(n, n, n, &a, &b, opts, &[])
                .map_err(|e| e.to_string())?;
            let want = gpu.run_gemm(None, &bufs).map_err(|e| e.to_string())?;
            let mut lb: Option<(String, f64)> = None;
            let fast = first
                .iter()
                .filter(|&&(c, _)| cands[c].1.as_ref().is_some_and(|k| k.variant().fast));
            for &(ci, _) in fast.take(top.min(3)) {
                let Some(k) = &cands[ci].1 else { continue };
                let v = k.variant().with_trans(ta, tb);
                let kern = match gpu.gemm_kernel(v) {
                    Ok(k) => k,
                    Err(e) => {
                        println!(
                            "| {} | {n}³ | {layout} | not compiled: {e} | | | | |",
                            v.name()
                        );
                        continue;
                    }
                };
                if !v.fits(n as u32, n as u32, n as u32, ta, tb) {
                    continue;
                }
                gpu.fill_c(&bufs, f32::NAN);
                let got = gpu
                    .run_gemm(Some(&kern), &bufs)
                    .map_err(|e| e.to_string())?;
                let err = rel_err(&got, &want);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(x, y)| x.to_bits() == y.to_bits());
                if err.is_nan() || err > 1e-3 {
                    println!("| {} | {n}³ | {layout} | {err:.2e} WRONG (vs legacy) | {same} | excluded | | |", v.name());
                    continue;
                }
                let ((med, lo, hi), reps) = time(Some(&kern), &bufs)?;
                println!("| {} | {n}³ | {layout} | {err:.2e} (vs legacy) | {same} | {med:.1} | {lo:.1}–{hi:.1} | {reps} |", v.name());
                println!(
                    "BENCH-JSON {{\"side\":\"frugal-wgpu\",\"row\":\"sgemm-sweep\",\"variant\":{},\"n\":{n},\"layout\":\"{layout}\",\"rel_err_legacy\":{err:e},\"bit_equal_legacy\":{same},\"gflops\":{med:.3},\"gflops_min\":{lo:.3},\"gflops_max\":{hi:.3},\"reps\":{reps},\"timings\":{timings},\"adapter\":{adapter}}}",
                    json_str(&v.name())
                );
                if lb.as_ref().is_none_or(|(_, g)| med > *g) {
                    lb = Some((v.name(), med));
                }
            }
            if let Some((name, g)) = lb {
                layout_best.push((layout, name, g));
            }
        }
        println!("\nsweep took {:.1} s", start.elapsed().as_secs_f64());
        for (n, name, g) in &best {
            println!("BEST {n}³ nn: {name} {g:.1} GFLOPS");
        }
        for (layout, name, g) in &layout_best {
            println!("BEST {n}³ {layout}: {name} {g:.1} GFLOPS");
        }
        Ok(())
    }

    /// `--one ROW …`: one measurement in this process, printed as one `BENCH-JSON {…}` line, for
    /// `cargo xtask bench gpu --burn`, which runs it alternately with the Burn driver
    /// (tests/bench/burn-wgpu, the same line format). `ROW` is a workload id of
    /// `frugal_cli::workloads` (`lenet5`, `small_cnn`, …; `--batch B --steps S --warmup W`: median
    /// ms/step of `S` steps on the GPU backend after `W` untimed ones) or `matmul` (`--n N --reps R`:
    /// the default SGEMM kernel's best GFLOPS on N³ after ≥ 1 s of untimed products, `R` timings of
    /// one ≥ 2 ms submission each). Exit code 3 when no adapter
    /// opens (the caller reports *skipped*).
    fn one(args: &[String]) -> Result<(), String> {
        let row = args
            .get(1)
            .ok_or("--one needs a row: a workload id or matmul")?;
        let gpu = match Gpu::open() {
            Ok(g) => g,
            Err(e) => {
                let why = format!("frugal could not open a wgpu adapter: {e}");
                println!(
                    "BENCH-JSON {{\"side\":\"frugal-wgpu\",\"skipped\":{}}}",
                    json_str(&why)
                );
                eprintln!("bench_gpu: skipped: {why}");
                std::process::exit(3);
            }
        };
        let adapter = format!(
            "\"adapter\":{},\"software\":{}",
            json_str(&gpu.adapter()),
            gpu.is_software()
        );
        if row == "matmul" {
            let n = flag(args, "--n", 1024)?;
            let reps = flag(args, "--reps", 5)?;
            let a: Vec<f32> = (0..n * n)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0)
                .collect();
            let b: Vec<f32> = (0..n * n)
                .map(|i| ((i * 5 % 11) as f32 - 5.0) / 8.0)
                .collect();
            let bufs = gpu
                .gemm_buffers(n, n, n, &a, &b)
                .map_err(|e| e.to_string())?;
            warm_up(&gpu, &bufs)?;
            let mut best = 0f64;
            for _ in 0..reps {
                best = best.max(sgemm_gflops(&gpu, &bufs)?);
            }
            println!(
                "BENCH-JSON {{\"side\":\"frugal-wgpu\",\"row\":\"matmul\",\"n\":{n},\"gflops\":{best:.3},\"reps\":{reps},\"kernel\":{},{adapter}}}",
                json_str(&gpu.sgemm_kernel_name(&bufs))
            );
            return Ok(());
        }
        let w = frugal_cli::workloads::all()
            .into_iter()
            .find(|w| w.id == row)
            .ok_or_else(|| format!("unknown row {row:?}"))?;
        let batch = flag(args, "--batch", 128)?;
        let steps = flag(args, "--steps", 10)?;
        let warmup = flag(args, "--warmup", 3)?;
        let plan = gpu_plan(Plan::new(
            Graph::new(&w.spec, batch).map_err(|e| e.to_string())?,
        ));
        let mut arena = vec![0u8; plan.needed_bytes()];
        let mut ex = Executor::with_backend(&plan, &arena, GpuBackend::new(gpu))
            .map_err(|e| e.to_string())?;
        ex.init_params(&mut arena, 1).map_err(|e| e.to_string())?;
        let per = w.spec.input.numel();
        let classes = plan.graph.pred_dims().numel();
        // The data of the table rows below, and of the Burn driver: the values do not change the work.
        let x: Vec<f32> = (0..batch * per).map(|i| (i % 17) as f32 / 16.0).collect();
        let y: Vec<u32> = (0..batch).map(|i| (i % classes) as u32).collect();
        let d0 = ex.backend().dispatches();
        let ms = ms_per_step_after(&mut ex, &mut arena, &x, &y, warmup, steps)?;
        let dispatches = (ex.backend().dispatches() - d0) / (warmup + steps) as u64;
        println!(
            "BENCH-JSON {{\"side\":\"frugal-wgpu\",\"row\":\"{row}\",\"batch\":{batch},\"ms_per_step\":{ms:.4},\"steps\":{steps},\"warmup\":{warmup},\"dispatches_per_step\":{dispatches},{adapter}}}"
        );
        Ok(())
    }

    /// `--profile [--batch B] [--steps S]`: the GPU time of every dispatch of one training step of
    /// LeNet-5 and the small CNN (batch `B`, default 128), from timestamp queries written before and
    /// after each dispatch inside the step's pass, after `S` (default 10) untimed steps: the top ops
    /// by GPU time (kernel, workgroups, µs), per-kernel totals, and the dispatches' sum against the
    /// step's wall time (median of `S` steps). The device is opened with `TIMESTAMP_QUERY` and
    /// `TIMESTAMP_QUERY_INSIDE_PASSES` only in this mode; "skipped: no timestamp queries" where the
    /// adapter lacks them. One `BENCH-JSON` line per workload.
    fn profile(args: &[String]) -> Result<(), String> {
        let batch = flag(args, "--batch", 128)?;
        let steps = flag(args, "--steps", 10)?;
        let need = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        for id in ["lenet5", "small_cnn"] {
            let w = frugal_cli::workloads::all()
                .into_iter()
                .find(|w| w.id == id)
                .ok_or_else(|| format!("no workload {id}"))?;
            let gpu = Gpu::open_with_features(need).map_err(|e| e.to_string())?;
            let adapter = gpu.adapter_details();
            let mut backend = GpuBackend::new(gpu);
            if !backend.set_timestamps(true) {
                println!(
                    "`bench_gpu --profile` — adapter: {adapter}\nskipped: no timestamp queries (the adapter lacks TIMESTAMP_QUERY + TIMESTAMP_QUERY_INSIDE_PASSES)"
                );
                println!(
                    "BENCH-JSON {{\"side\":\"frugal-wgpu\",\"row\":\"profile\",\"skipped\":\"no timestamp queries\",\"adapter\":{}}}",
                    json_str(&adapter)
                );
                return Ok(());
            }
            let plan = gpu_plan(Plan::new(
                Graph::new(&w.spec, batch).map_err(|e| e.to_string())?,
            ));
            let mut arena = vec![0u8; plan.needed_bytes()];
            let mut ex =
                Executor::with_backend(&plan, &arena, backend).map_err(|e| e.to_string())?;
            ex.init_params(&mut arena, 1).map_err(|e| e.to_string())?;
            let per = w.spec.input.numel();
            let classes = plan.graph.pred_dims().numel();
            let x: Vec<f32> = (0..batch * per).map(|i| (i % 17) as f32 / 16.0).collect();
            let y: Vec<u32> = (0..batch).map(|i| (i % classes) as u32).collect();
            // Untimed steps first (clocks up, kernels compiled), then the timed ones (timestamps
            // on: their cost is in the wall time), then the profiled one.
            let wall = ms_per_step_after(&mut ex, &mut arena, &x, &y, steps, steps)?;
            ex.train_step(&mut arena, &x, Target::Classes(&y))
                .map_err(|e| e.to_string())?;
            let times = ex
                .backend_mut()
                .timestamps(&plan)
                .map_err(|e| e.to_string())?;
            let sum: f64 = times.iter().map(|t| t.micros).sum();
            println!(
                "\n`bench_gpu --profile` — {} b{batch}, adapter: {adapter}\n{} dispatches: GPU time {:.1} µs summed; wall {:.1} µs/step (median of {steps}); the rest is submission, copies between passes, the loss read-back and gaps\n",
                w.title,
                times.len(),
                sum,
                wall * 1e3
            );
            let mut order: Vec<usize> = (0..times.len()).collect();
            order.sort_by(|&a, &b| times[b].micros.total_cmp(&times[a].micros));
            println!("| # | instruction | kernel | workgroups | GPU µs | share |");
            println!("|---:|---|---|---:|---:|---:|");
            for &i in order.iter().take(15) {
                let t = &times[i];
                println!(
                    "| {i} | {} | {} | {}×{} | {:.1} | {:.1} % |",
                    t.instruction,
                    t.kernel,
                    t.workgroups.0,
                    t.workgroups.1,
                    t.micros,
                    100.0 * t.micros / sum.max(1e-9)
                );
            }
            // Per kernel, summed.
            let mut by: Vec<(String, usize, f64)> = Vec::new();
            for t in &times {
                match by.iter_mut().find(|b| b.0 == t.kernel) {
                    Some(b) => {
                        b.1 += 1;
                        b.2 += t.micros;
                    }
                    None => by.push((t.kernel.clone(), 1, t.micros)),
                }
            }
            by.sort_by(|a, b| b.2.total_cmp(&a.2));
            println!("\n| kernel | dispatches | GPU µs | share |\n|---|---:|---:|---:|");
            for (k, n, us) in &by {
                println!(
                    "| {k} | {n} | {us:.1} | {:.1} % |",
                    100.0 * us / sum.max(1e-9)
                );
            }
            let top: Vec<String> = by
                .iter()
                .take(5)
                .map(|(k, n, us)| {
                    format!(
                        "{{\"kernel\":{},\"dispatches\":{n},\"us\":{us:.2}}}",
                        json_str(k)
                    )
                })
                .collect();
            println!(
                "BENCH-JSON {{\"side\":\"frugal-wgpu\",\"row\":\"profile\",\"workload\":\"{id}\",\"batch\":{batch},\"dispatches\":{},\"gpu_us\":{sum:.2},\"wall_us\":{:.2},\"top_kernels\":[{}],\"adapter\":{}}}",
                times.len(),
                wall * 1e3,
                top.join(","),
                json_str(&adapter)
            );
        }
        Ok(())
    }

    fn run(args: &[String]) -> Result<(), String> {
        if args.first().map(String::as_str) == Some("--one") {
            return one(args);
        }
        if args.first().map(String::as_str) == Some("--profile") {
            return profile(args);
        }
        if args.first().map(String::as_str) == Some("--sgemm-sweep") {
            return sgemm_sweep(args);
        }
        let placement = args.iter().any(|a| a == "--placement");
        let rest: Vec<&String> = args.iter().filter(|a| *a != "--placement").collect();
        let reps: usize = match rest[..] {
            [f, v] if f == "--reps" => v.parse().map_err(|_| "--reps needs a number")?,
            [] => 5,
            _ => return Err("usage: cargo xtask bench gpu [--placement] [--reps R]".into()),
        };
        if placement {
            return placements(reps);
        }
        let gpu = Gpu::open().map_err(|e| e.to_string())?;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let pool =
            ThreadPool::new(threads).map_err(|e| format!("cannot start {threads} threads: {e}"))?;
        println!(
            "`cargo xtask bench gpu` — adapter: {}{}; CPU: frugal's SGEMM ({}) on {threads} threads; best of {reps}\n",
            gpu.adapter(),
            if gpu.is_software() { " (software: runs on this CPU)" } else { "" },
            SgemmKernel::selected().name()
        );
        println!("| m×n×k | GPU kernel | GPU GFLOPS | CPU GFLOPS | GPU / CPU |");
        println!("|---|---|---:|---:|---:|");
        let mut warm = !gpu.is_software();
        for (m, n, k) in [(1024, 1024, 1024), (32, 256, 784), (2048, 1024, 1024)] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 5 % 11) as f32 - 5.0) / 8.0)
                .collect();
            let bufs = gpu
                .gemm_buffers(m, n, k, &a, &b)
                .map_err(|e| e.to_string())?;
            // Alternate GPU and CPU rounds so both see the same moments of the machine.
            if std::mem::take(&mut warm) {
                warm_up(&gpu, &bufs)?;
            }
            let (mut g_best, mut c_best) = (0f64, 0f64);
            for _ in 0..reps {
                g_best = g_best.max(sgemm_gflops(&gpu, &bufs)?);
                c_best = c_best.max(cpu_gflops(
                    SgemmKernel::selected(),
                    &pool,
                    threads,
                    (m, n, k),
                    &a,
                    &b,
                ));
            }
            println!(
                "| {m}×{n}×{k} | {} | {g_best:.1} | {c_best:.1} | {:.2} |",
                gpu.sgemm_kernel_name(&bufs),
                g_best / c_best
            );
        }
        println!(
            "\n| training step | batch | GPU backend ms/step | CPU backend ms/step ({threads} threads) | GPU / CPU | GPU dispatches + copies /step |"
        );
        println!("|---|---:|---:|---:|---:|---:|");
        let mut rows: Vec<(String, frugal_core::model::ModelSpec, usize)> = vec![
            ("digits MLP".into(), digits_mlp(), 32),
            ("digits MLP".into(), digits_mlp(), 128),
        ];
        // The reference workloads the issue names (28×28 inputs, SGD): LeNet-5 and the small CNN at b128.
        for w in frugal_cli::workloads::all() {
            if w.id == "lenet5" || w.id == "small_cnn" {
                rows.push((w.title.to_string(), w.spec, 128));
            }
        }
        for (title, spec, batch) in rows {
            let plan = Plan::new(Graph::new(&spec, batch).map_err(|e| e.to_string())?);
            let gp = gpu_plan(plan.clone());
            let mut arena = vec![0u8; plan.needed_bytes()];
            let mut garena = vec![0u8; gp.needed_bytes()];
            let mut cpu = Executor::with_backend(&plan, &arena, CpuBackend::with_pool(&pool))
                .map_err(|e| e.to_string())?;
            let backend = GpuBackend::open().map_err(|e| e.to_string())?;
            let mut gex =
                Executor::with_backend(&gp, &garena, backend).map_err(|e| e.to_string())?;
            cpu.init_params(&mut arena, 1).map_err(|e| e.to_string())?;
            gex.init_params(&mut garena, 1).map_err(|e| e.to_string())?;
            let per = spec.input.numel();
            let classes = plan.graph.pred_dims().numel();
            let x: Vec<f32> = (0..batch * per).map(|i| (i % 17) as f32 / 16.0).collect();
            let y: Vec<u32> = (0..batch).map(|i| (i % classes) as u32).collect();
            // The kernel launches of one step (after the first, which prepares the plan).
            gex.train_step(&mut garena, &x, Target::Classes(&y))
                .map_err(|e| e.to_string())?;
            let (d0, c0) = (gex.backend().dispatches(), gex.backend().copies());
            gex.train_step(&mut garena, &x, Target::Classes(&y))
                .map_err(|e| e.to_string())?;
            let dispatches = gex.backend().dispatches() - d0;
            let copies = gex.backend().copies() - c0;
            let (mut g_best, mut c_best) = (f64::MAX, f64::MAX);
            // Fewer steps for the 28×28 CNNs: lavapipe takes hundreds of ms per step.
            let steps = if per > 64 { 5 } else { 20 };
            for _ in 0..reps {
                g_best = g_best.min(ms_per_step(&mut gex, &mut garena, &x, &y, steps)?);
                c_best = c_best.min(ms_per_step(&mut cpu, &mut arena, &x, &y, steps)?);
            }
            println!(
                "| {title} | {batch} | {g_best:.3} | {c_best:.3} | {:.1} | {dispatches} + {copies} |",
                g_best / c_best
            );
        }
        Ok(())
    }
}
