//! `cargo xtask bench int8 [--check] [--epochs N] [--speed-only | --arena-only] [--runs N]`: the
//! integer-training figures of issue 4 on the bundled digits — held-out accuracy f32 vs int8
//! float-master vs int8 pure-integer for the MLP and the small CNN (their example settings), int8 / f32
//! arena for the same model and batch, ms/step int8 vs f32 on the small CNN at batch 64 (this process
//! is single-threaded), and the rescale passes the self-adaptive schedule removes after epoch 1 with
//! its accuracy change against rescaling every step.
//! `--check` fails when a target of the issue is missed.
//!
//! `--runs N` (default 1) measures the speed N times, each in a fresh child process (its own stack and
//! heap placement: Linux randomises the stack's position within a cache line per process) with the
//! arena's start moved by a different number of cache lines within a page, and prints every run and the
//! median and range of each ms/step and of the ratios (taken within a run).
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use crate::stats::{median, Spread};

use frugal_cli::data::Dataset;
use frugal_cli::measure::thread_cpu_ns;
use frugal_cli::spec_toml::{load_model, ModelFile};
use frugal_cli::train::{self, TrainOptions, DEFAULT_UPDATE_BITS};
use frugal_core::budget::Budget;
use frugal_core::exec::int8::Int8Executor;
use frugal_core::exec::{Executor, Target};
use frugal_core::graph::Graph;
use frugal_core::model::{Int8Update, Precision};
use frugal_core::plan::{Plan, ALIGN};
use frugal_core::quant::{Rescale, RescaleCounts};

const PURE: Precision = Precision::Int8(Int8Update::Integer {
    update_bits: DEFAULT_UPDATE_BITS,
});
const MASTER: Precision = Precision::Int8(Int8Update::FloatMaster);

fn model(name: &str) -> Result<ModelFile, String> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name);
    load_model(&p).map_err(|e| e.to_string())
}

fn opts(m: &ModelFile, epochs: Option<u32>) -> TrainOptions {
    TrainOptions {
        batch: m.train.batch.unwrap_or(32) as usize,
        epochs: epochs.unwrap_or(m.train.epochs.unwrap_or(30)),
        budget: Budget::UNLIMITED,
        seed: 1,
        progress: false,
        quiet: true,
        policy: frugal_core::policy::PolicyKind::Plain,
        approx: Default::default(),
        threads: 1,
        device: Default::default(),
        frozen: None,
    }
}

struct Run {
    acc: f32,
    later: RescaleCounts,
    all: RescaleCounts,
}

fn run(
    m: &ModelFile,
    data: &(Dataset, Dataset),
    p: Precision,
    r: Rescale,
    epochs: Option<u32>,
) -> Result<Run, String> {
    let o = opts(m, epochs);
    if p == Precision::F32 {
        let rep = train::train(m, &data.0, &data.1, &o, None).map_err(|e| e.to_string())?;
        return Ok(Run {
            acc: rep.test_accuracy,
            later: RescaleCounts::default(),
            all: RescaleCounts::default(),
        });
    }
    let rep = train::train_int8(m, &data.0, &data.1, &o, p, r, None, |_, _| {})
        .map_err(|e| e.to_string())?;
    let mut later = RescaleCounts::default();
    for c in rep.per_epoch.iter().skip(1) {
        later.add(c);
    }
    Ok(Run {
        acc: rep.report.test_accuracy,
        later,
        all: rep.counts,
    })
}

/// The fp16-storage row: (held-out accuracy, stored / f32 bytes of the layer outputs the backward
/// pass reads, stored / f32 bytes of every activation alive across the loss).
fn fp16_row(
    m: &ModelFile,
    data: &(Dataset, Dataset),
    epochs: Option<u32>,
) -> Result<(f32, f64, f64), String> {
    let mut o = opts(m, epochs);
    o.approx.f16_storage = true;
    let rep = train::train(m, &data.0, &data.1, &o, None).map_err(|e| e.to_string())?;
    let g = Graph::new(&m.spec, o.batch).map_err(|e| e.to_string())?;
    let f32_plan = Plan::new(g.clone());
    let half = frugal_core::policy::half::f16_storage(&g);
    let (full, stored) = frugal_core::policy::half::packed_bytes(&half);
    let all_f32 = frugal_core::policy::half::saved_activation_bytes(&f32_plan);
    let all_half = frugal_core::policy::half::saved_activation_bytes(&half);
    Ok((
        rep.test_accuracy,
        stored as f64 / full.max(1) as f64,
        all_half as f64 / all_f32.max(1) as f64,
    ))
}

/// One training step over (arena, inputs, labels).
type StepFn<'a> = dyn FnMut(&mut [u8], &[f32], &[u32]) -> Result<(), String> + 'a;

/// What [`ms_per_step`] measured.
struct Timed {
    /// Median wall-clock ms/step.
    wall: f64,
    /// Mean on-CPU ms/step (batch copies included) where the OS reports it.
    cpu: Option<f64>,
    /// Where the arena the executor uses starts within a 4 KiB page.
    place: usize,
}

/// Median wall-clock ms/step over `steps` steps at `batch` (after 3 warm-up steps) for f32 or int8,
/// and the mean on-CPU ms/step over the same steps (batch copies included) where the OS reports it.
/// The arena starts `shift` bytes into a fresh allocation (the executor aligns it to a cache line).
fn ms_per_step(
    m: &ModelFile,
    data: &Dataset,
    batch: usize,
    p: Precision,
    steps: usize,
    shift: usize,
) -> Result<Timed, String> {
    let per = m.spec.input.numel();
    let mut times = Vec::new();
    let g = Graph::with_precision(&m.spec, batch, p).map_err(|e| e.to_string())?;
    let plan = Plan::new(g);
    let mut whole = vec![0u8; plan.needed_bytes() + shift];
    let arena = &mut whole[shift..];
    let place = (arena.as_ptr() as usize).next_multiple_of(ALIGN) % 4096;
    let mut xb = vec![0f32; batch * per];
    let mut yb = vec![0u32; batch];
    let order: Vec<usize> = (0..data.len()).collect();
    let mut f32ex;
    let mut i8ex;
    let mut step: Box<StepFn> = if p == Precision::F32 {
        f32ex = Executor::new(&plan, arena).map_err(|e| e.to_string())?;
        f32ex.init_params(arena, 1).map_err(|e| e.to_string())?;
        Box::new(move |a, x, y| {
            f32ex
                .train_step(a, x, Target::Classes(y))
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    } else {
        i8ex = Int8Executor::new(&plan, arena).map_err(|e| e.to_string())?;
        i8ex.init_params(arena, 1).map_err(|e| e.to_string())?;
        Box::new(move |a, x, y| {
            i8ex.train_step(a, x, Target::Classes(y))
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    };
    let mut cpu0 = None;
    for s in 0..steps + 3 {
        if s == 3 {
            cpu0 = thread_cpu_ns();
        }
        let start = (s * batch) % (data.len() - batch);
        data.batch(&order[start..start + batch], &mut xb, &mut yb);
        let t = Instant::now();
        step(arena, &xb, &yb)?;
        if s >= 3 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    let cpu = match (cpu0, thread_cpu_ns()) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / 1e6 / steps as f64),
        _ => None,
    };
    Ok(Timed {
        wall: median(times),
        cpu,
        place,
    })
}

pub fn main(args: &[String]) -> Result<(), String> {
    let check = args.iter().any(|a| a == "--check");
    let epochs = args
        .iter()
        .position(|a| a == "--epochs")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse::<u32>().map_err(|e| format!("--epochs: {e}")))
        .transpose()?;
    let data = frugal_cli::data::digits();
    let mut failures = Vec::new();
    let speed_only = args.iter().any(|a| a == "--speed-only");
    let runs = args
        .iter()
        .position(|a| a == "--runs")
        .map(|i| match args.get(i + 1).map(|v| v.parse::<usize>()) {
            Some(Ok(n)) if n >= 1 => Ok(n),
            _ => Err("--runs: expected a run count ≥ 1".to_string()),
        })
        .transpose()?
        .unwrap_or(1);
    if args.iter().any(|a| a == "--arena-only") {
        arena(&mut failures)?;
    } else {
        if !speed_only {
            accuracy_and_arena(&data, epochs, &mut failures)?;
        }
        speed(&data, runs, &mut failures)?;
    }
    if failures.is_empty() {
        println!("\nall int8 targets met");
        return Ok(());
    }
    println!("\nmissed targets:");
    for f in &failures {
        println!("- {f}");
    }
    if check {
        Err(format!("{} int8 target(s) missed", failures.len()))
    } else {
        Ok(())
    }
}

fn accuracy_and_arena(
    data: &(Dataset, Dataset),
    epochs: Option<u32>,
    failures: &mut Vec<String>,
) -> Result<(), String> {
    let data = data.clone();
    println!("## int8 training (digits, held-out accuracy, example settings; pure-integer update bits {DEFAULT_UPDATE_BITS})\n");
    println!("| model | f32 | int8 float-master | Δ | int8 pure-integer | Δ | fp16 storage | Δ | fp16 bytes: saved layer outputs / all activations across the loss |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut rescale_rows = Vec::new();
    for name in ["digits-mlp.toml", "digits-cnn.toml"] {
        let m = model(name)?;
        let f = run(&m, &data, Precision::F32, Rescale::Adaptive, epochs)?;
        let fm = run(&m, &data, MASTER, Rescale::Adaptive, epochs)?;
        let pi = run(&m, &data, PURE, Rescale::Adaptive, epochs)?;
        let fm_every = run(&m, &data, MASTER, Rescale::EveryStep, epochs)?;
        let d_fm = 100.0 * (fm.acc - f.acc);
        let d_pi = 100.0 * (pi.acc - f.acc);
        let (h_acc, h_out, h_all) = fp16_row(&m, &data, epochs)?;
        let d_h = 100.0 * (h_acc - f.acc);
        println!(
            "| {name} | {:.2}% | {:.2}% | {d_fm:+.2} | {:.2}% | {d_pi:+.2} | {:.2}% | {d_h:+.2} | {h_out:.2}× / {h_all:.2}× |",
            100.0 * f.acc,
            100.0 * fm.acc,
            100.0 * pi.acc,
            100.0 * h_acc
        );
        if d_h.abs() > 0.5 {
            failures.push(format!(
                "{name}: fp16 storage {d_h:+.2} points (target within ±0.5)"
            ));
        }
        if h_out > 0.5 + 1e-9 {
            failures.push(format!(
                "{name}: fp16 storage keeps {h_out:.2}× the f32 bytes of the saved layer outputs (target 0.5×)"
            ));
        }
        if d_fm < -1.0 {
            failures.push(format!(
                "{name}: float-master {d_fm:+.2} points (target ≥ −1.0)"
            ));
        }
        if d_pi < -2.5 {
            failures.push(format!(
                "{name}: pure-integer {d_pi:+.2} points (target ≥ −2.5)"
            ));
        }
        rescale_rows.push((name, fm, fm_every, pi));
    }
    println!("\n## self-adaptive rescaling (float-master; pure-integer counters for reference)\n");
    println!("| model | passes skipped after epoch 1 | forced | accuracy adaptive | every step | Δ | pure-integer skipped after epoch 1 |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, fm, every, pi) in &rescale_rows {
        let d = 100.0 * (fm.acc - every.acc);
        println!(
            "| {name} | {:.1}% ({} of {}) | {} | {:.2}% | {:.2}% | {d:+.2} | {:.1}% |",
            100.0 * fm.later.skipped_fraction(),
            fm.later.skipped,
            fm.later.passes(),
            fm.all.forced,
            100.0 * fm.acc,
            100.0 * every.acc,
            100.0 * pi.later.skipped_fraction()
        );
        if fm.later.skipped_fraction() < 0.5 {
            failures.push(format!(
                "{name}: adaptive rescaling skipped < 50% after epoch 1"
            ));
        }
        if d.abs() > 0.3 {
            failures.push(format!(
                "{name}: adaptive vs every-step accuracy {d:+.2} points (target within 0.3)"
            ));
        }
    }
    arena(failures)
}

/// The arena rows: int8 (both update modes) against f32 for the same model and batch, plain plans.
fn arena(failures: &mut Vec<String>) -> Result<(), String> {
    println!("\n## arena (plain plan, same model and batch; pure-integer / float-master vs f32)\n");
    println!("| model | batch | f32 | int8 pure | ratio | int8 float-master | ratio |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, batch) in [
        ("digits-mlp.toml", 32),
        ("digits-cnn.toml", 32),
        ("digits-cnn.toml", 64),
    ] {
        let m = model(name)?;
        let bytes = |p| -> Result<usize, String> {
            Ok(
                Plan::new(Graph::with_precision(&m.spec, batch, p).map_err(|e| e.to_string())?)
                    .arena_bytes,
            )
        };
        let (f, pi, fm) = (bytes(Precision::F32)?, bytes(PURE)?, bytes(MASTER)?);
        let r = pi as f64 / f as f64;
        println!(
            "| {name} | {batch} | {f} | {pi} | {r:.3} | {fm} | {:.3} |",
            fm as f64 / f as f64
        );
        if r > 0.35 {
            failures.push(format!(
                "{name} batch {batch}: int8 arena ratio {r:.3} (target ≤ 0.35)"
            ));
        }
    }
    Ok(())
}

/// The modes the speed rows time, in their column order.
const MODES: [&str; 3] = ["f32", "int8 pure", "int8 float-master"];

/// One speed measurement: per mode (in [`MODES`] order) the median wall-clock ms/step, the mean
/// on-CPU ms/step where the OS reports it and the arena's start within a page; and the stack's
/// position within a cache line (of one local: the step's frames keep their distances to it).
struct Speed {
    wall: [f64; 3],
    cpu: Option<[f64; 3]>,
    place: [usize; 3],
    stack: usize,
}

impl Speed {
    /// The small CNN at batch 64, f32 then int8 pure then int8 float-master, 200 steps each, the
    /// arenas `shift` bytes into their allocations.
    fn measure(data: &Dataset, shift: usize) -> Result<Self, String> {
        let m = model("digits-cnn.toml")?;
        let (mut wall, mut cpu, mut place) = ([0.0; 3], Some([0.0; 3]), [0; 3]);
        for (k, p) in [Precision::F32, PURE, MASTER].into_iter().enumerate() {
            let t = ms_per_step(&m, data, 64, p, 200, shift)?;
            (wall[k], place[k]) = (t.wall, t.place);
            match (t.cpu, cpu.as_mut()) {
                (Some(c), Some(v)) => v[k] = c,
                _ => cpu = None,
            }
        }
        let probe = 0u8;
        let stack = std::hint::black_box(&probe) as *const u8 as usize % 64;
        Ok(Speed {
            wall,
            cpu,
            place,
            stack,
        })
    }

    /// The child's report: `SPEED` and ten numbers: wall, on-CPU (NaN where not reported), arena
    /// places, stack.
    fn line(&self) -> String {
        let cpu = self.cpu.unwrap_or([f64::NAN; 3]);
        let v: Vec<String> = self.wall.iter().chain(&cpu).map(f64::to_string).collect();
        let [p0, p1, p2] = self.place;
        format!("SPEED {} {p0} {p1} {p2} {}", v.join(" "), self.stack)
    }

    fn parse(line: &str) -> Option<Self> {
        let v: Vec<f64> = line
            .strip_prefix("SPEED ")?
            .split_whitespace()
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        let [w0, w1, w2, c0, c1, c2, p0, p1, p2, st] = v[..] else {
            return None;
        };
        let cpu = [c0, c1, c2];
        let whole = |x: f64| (x >= 0.0 && x.fract() == 0.0).then_some(x as usize);
        Some(Speed {
            wall: [w0, w1, w2],
            cpu: cpu.iter().all(|c| c.is_finite()).then_some(cpu),
            place: [whole(p0)?, whole(p1)?, whole(p2)?],
            stack: whole(st)?,
        })
    }
}

/// The arena shift of run `k` (0-based): run 0 keeps the allocation's start, the others move it by a
/// different number of 64-byte lines (0–63) within a 4 KiB page, stepping by 37 lines so that a few
/// runs already spread over the page.
fn shift_of(k: usize) -> usize {
    k * 37 % 64 * 64
}

/// The hidden child of `--runs`: `__bench-int8-one RUN` measures once with run RUN's arena shift.
pub fn child(args: &[String]) -> Result<(), String> {
    let k: usize = args
        .first()
        .and_then(|a| a.parse().ok())
        .ok_or("usage: __bench-int8-one RUN")?;
    let data = frugal_cli::data::digits();
    println!("{}", Speed::measure(&data.0, shift_of(k))?.line());
    Ok(())
}

fn speed(data: &(Dataset, Dataset), runs: usize, failures: &mut Vec<String>) -> Result<(), String> {
    let ratio = if runs <= 1 {
        speed_once(data)?
    } else {
        speed_runs(runs)?
    };
    if ratio > 0.5 {
        failures.push(format!("ms/step ratio {ratio:.2} (target ≤ 0.5)"));
    }
    Ok(())
}

/// One measurement in this process (the bench's output before `--runs`); returns int8 pure / f32.
fn speed_once(data: &(Dataset, Dataset)) -> Result<f64, String> {
    println!("\n## speed (small CNN, batch 64, one thread, median of 200 steps)\n");
    let s = Speed::measure(&data.0, 0)?;
    let [f, pi, fm] = s.wall;
    println!("| f32 ms/step | int8 pure ms/step | ratio | int8 float-master ms/step | ratio |");
    println!("|---:|---:|---:|---:|---:|");
    println!(
        "| {f:.3} | {pi:.3} | {:.2} | {fm:.3} | {:.2} |",
        pi / f,
        fm / f
    );
    if let Some([fc, pic, fmc]) = s.cpu {
        // On a shared machine the wall clock also counts waits for a core; on-CPU time does not.
        println!(
            "\non-CPU ms/step (mean, this thread's scheduler time): f32 {fc:.3}, int8 pure {pic:.3} ({:.2}×), int8 float-master {fmc:.3} ({:.2}×)",
            pic / fc,
            fmc / fc
        );
    }
    Ok(pi / f)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| {
            let v: Vec<&str> = l.split_whitespace().take(3).collect();
            (v.len() == 3).then(|| v.join(" "))
        })
        .unwrap_or_else(|| "not reported".into())
}

/// `runs` measurements, each in a child process; prints them and their spread and returns the median
/// int8 pure / f32 ratio.
fn speed_runs(runs: usize) -> Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let load0 = loadavg();
    let mut all = Vec::with_capacity(runs);
    for k in 0..runs {
        let out = Command::new(&exe)
            .args(["__bench-int8-one", &k.to_string()])
            .output()
            .map_err(|e| format!("cannot start the benchmark child: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let s = text.lines().find_map(Speed::parse).ok_or_else(|| {
            format!(
                "run {}: child failed ({}): {text}{}",
                k + 1,
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        eprintln!(
            "run {}/{runs}: f32 {:.3}, int8 pure {:.3} ms/step",
            k + 1,
            s.wall[0],
            s.wall[1]
        );
        all.push(s);
    }
    println!("\n## speed (small CNN, batch 64, one thread, median of 200 steps; {runs} runs, each a fresh process)\n");
    println!(
        "load average (1, 5, 15 min) before: {load0}; after: {}\n",
        loadavg()
    );
    println!("| run | arena mod 4096 B: f32 / pure / master | stack mod 64 B | f32 ms/step | int8 pure ms/step | ratio | int8 float-master ms/step | ratio | on-CPU f32 | int8 pure | int8 float-master |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (k, s) in all.iter().enumerate() {
        let [f, pi, fm] = s.wall;
        let cpu = match s.cpu {
            Some([a, b, c]) => format!("{a:.3} | {b:.3} | {c:.3}"),
            None => "– | – | –".into(),
        };
        println!(
            "| {} | {} / {} / {} | {} | {f:.3} | {pi:.3} | {:.2} | {fm:.3} | {:.2} | {cpu} |",
            k + 1,
            s.place[0],
            s.place[1],
            s.place[2],
            s.stack,
            pi / f,
            fm / f
        );
    }
    let col = |f: &dyn Fn(&Speed) -> Option<f64>| -> Option<Spread> {
        let v: Option<Vec<f64>> = all.iter().map(f).collect();
        v.map(|v| Spread::of(&v))
    };
    println!("\nmedian [min–max] over the {runs} runs (ratios taken within each run):\n");
    println!("| quantity | wall clock | on-CPU |");
    println!("|---|---|---|");
    for (k, name) in MODES.iter().enumerate() {
        let w = col(&|s| Some(s.wall[k])).expect("wall times are always there");
        let c = col(&|s| s.cpu.map(|c| c[k]));
        let c = c.map_or("–".into(), |c| format!("{c}"));
        println!("| {name} ms/step | {w} | {c} |");
    }
    let mut median_ratio = f64::NAN;
    for (k, name) in MODES.iter().enumerate().skip(1) {
        let w = col(&|s| Some(s.wall[k] / s.wall[0])).expect("wall times are always there");
        let c = col(&|s| s.cpu.map(|c| c[k] / c[0]));
        let c = c.map_or("–".into(), |c| format!("{c:.2}"));
        println!("| {name} / f32 | {w:.2} | {c} |");
        if k == 1 {
            median_ratio = w.median;
        }
    }
    Ok(median_ratio)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_report_reads_back() {
        let s = Speed {
            wall: [0.5, 0.196, 0.28],
            cpu: Some([0.51, 0.2, 0.29]),
            place: [64, 1472, 4032],
            stack: 48,
        };
        let r = Speed::parse(&s.line()).expect("the child's line parses");
        assert_eq!(
            (r.wall, r.cpu, r.place, r.stack),
            (s.wall, s.cpu, s.place, s.stack)
        );
        assert!(Speed::parse(&s.line().replace(" 48", " 4.5")).is_none());
        let none = Speed { cpu: None, ..s };
        assert_eq!(Speed::parse(&none.line()).map(|r| r.cpu), Some(None));
        assert!(Speed::parse("SPEED 1 2 3 4 5 6").is_none());
        assert!(Speed::parse("speed 1 2 3 4 5 6 0 0 0 0").is_none());
    }

    #[test]
    fn runs_move_the_arena_over_every_line_of_a_page() {
        assert_eq!(shift_of(0), 0);
        let mut seen: Vec<usize> = (0..64).map(shift_of).collect();
        assert!(seen.iter().all(|s| s % 64 == 0 && *s < 4096));
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(
            seen.len(),
            64,
            "64 runs place the arena at 64 different lines"
        );
    }
}
