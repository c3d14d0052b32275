//! Burn's wgpu backend on the shapes of frugal's GPU bench rows, for `cargo xtask bench gpu --burn`.
//!
//! A standalone program (its own workspace and lock file): Burn never enters frugal's dependency tree.
//! It trains LeNet-5 or the small CNN (exactly the shapes of `hosts/native/src/workloads.rs`, which
//! `hosts/wgpu/examples/bench_gpu.rs` trains: 1×28×28 inputs, softmax cross-entropy, SGD lr 0.01 without
//! momentum) or times a square matmul, and prints one machine-readable line:
//!
//! ```text
//! BENCH-JSON {"side":"burn-wgpu","row":"lenet5","batch":128,"ms_per_step":…,"steps":…,"warmup":…,"loss":…,"adapter":"…","device_type":"…","api":"…"}
//! BENCH-JSON {"side":"burn-wgpu","row":"matmul","n":1024,"gflops":…,"reps":…,"adapter":"…",…}
//! BENCH-JSON {"side":"burn-wgpu","skipped":"why"}        (exit code 3: no adapter)
//! ```
//!
//! A training step is: forward, loss, backward, SGD update, the loss read back (as frugal's GPU backend
//! reads its loss back every step), then `Device::sync` — the clock stops after the queue is idle, so
//! lazily fused work of this step cannot leak into the next one. `warmup` untimed steps first (Burn
//! autotunes kernels on first use), then `steps` timed ones; the median is printed.
//!
//! Usage: `frugal-burn-bench (lenet5|small_cnn) [--batch 128] [--steps 10] [--warmup 3]`
//!        `frugal-burn-bench matmul [--n 1024] [--reps 5]`
//!        `frugal-burn-bench adapter`   (prints the adapter line only)
use std::process::ExitCode;
use std::time::Instant;

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d};
use burn::optim::{GradientsParams, SgdConfig};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Int, Tensor, TensorData};

/// Exit code for "no adapter could be opened": the caller reports the Burn side *skipped*.
const SKIPPED: u8 = 3;

/// LeNet-5 (ReLU, max-pool), as the reference harness and frugal's `lenet5` workload: conv 1→6 k5 p2,
/// pool 2, conv 6→16 k5, pool 2, fc 400→120→84→10.
#[derive(Module, Debug)]
struct LeNet5 {
    conv1: Conv2d,
    conv2: Conv2d,
    pool: MaxPool2d,
    fc1: Linear,
    fc2: Linear,
    fc3: Linear,
}

/// The small CNN, as frugal's `small_cnn` workload: conv 1→8 k3 p1, pool 2, conv 8→16 k3 p1, pool 2,
/// fc 784→10.
#[derive(Module, Debug)]
struct SmallCnn {
    conv1: Conv2d,
    conv2: Conv2d,
    pool: MaxPool2d,
    fc: Linear,
}

fn conv(cin: usize, cout: usize, k: usize, pad: usize, device: &Device) -> Conv2d {
    Conv2dConfig::new([cin, cout], [k, k])
        .with_padding(PaddingConfig2d::Explicit(pad, pad, pad, pad))
        .init(device)
}

fn pool2() -> MaxPool2d {
    MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init()
}

impl LeNet5 {
    fn new(device: &Device) -> Self {
        Self {
            conv1: conv(1, 6, 5, 2, device),
            conv2: conv(6, 16, 5, 0, device),
            pool: pool2(),
            fc1: LinearConfig::new(16 * 5 * 5, 120).init(device),
            fc2: LinearConfig::new(120, 84).init(device),
            fc3: LinearConfig::new(84, 10).init(device),
        }
    }

    fn forward(&self, x: Tensor<4>) -> Tensor<2> {
        let x = self.pool.forward(relu(self.conv1.forward(x)));
        let x = self.pool.forward(relu(self.conv2.forward(x)));
        let x: Tensor<2> = x.flatten(1, 3);
        let x = relu(self.fc1.forward(x));
        let x = relu(self.fc2.forward(x));
        self.fc3.forward(x)
    }
}

impl SmallCnn {
    fn new(device: &Device) -> Self {
        Self {
            conv1: conv(1, 8, 3, 1, device),
            conv2: conv(8, 16, 3, 1, device),
            pool: pool2(),
            fc: LinearConfig::new(16 * 7 * 7, 10).init(device),
        }
    }

    fn forward(&self, x: Tensor<4>) -> Tensor<2> {
        let x = self.pool.forward(relu(self.conv1.forward(x)));
        let x = self.pool.forward(relu(self.conv2.forward(x)));
        self.fc.forward(x.flatten(1, 3))
    }
}

/// The adapter Burn's runtime opened, as JSON fields.
struct Adapter {
    json: String,
}

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// Opens Burn's default wgpu device (the adapter wgpu's heuristics prefer, as `Device::default()`
/// would); `Err` says why none could be opened.
fn open() -> Result<(Device, Adapter), String> {
    let r = std::panic::catch_unwind(|| Device::wgpu_options().init_with_setup());
    match r {
        Ok(Ok((device, setup))) => {
            let info = setup.adapter.get_info();
            let json = format!(
                "\"adapter\":{},\"device_type\":{},\"api\":{},\"driver\":{}",
                json_str(&info.name),
                json_str(&format!("{:?}", info.device_type)),
                json_str(&format!("{:?}", setup.backend)),
                json_str(&format!("{} {}", info.driver, info.driver_info)),
            );
            Ok((device, Adapter { json }))
        }
        Ok(Err(e)) => Err(format!("Burn could not open a wgpu adapter: {e}")),
        Err(_) => Err("Burn's wgpu runtime panicked while opening an adapter".into()),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Trains `row` at `batch` on `device`: `warmup` untimed steps, then the median of `steps` timed ones,
/// and the last loss.
fn train(
    row: &str,
    batch: usize,
    steps: usize,
    warmup: usize,
    device: &Device,
) -> Result<(f64, f32), String> {
    let dev = device.clone().autodiff();
    let per = 28 * 28;
    // The inputs and labels frugal's bench uses (bench_gpu.rs): the values do not change the work.
    let x: Vec<f32> = (0..batch * per).map(|i| (i % 17) as f32 / 16.0).collect();
    let y: Vec<i64> = (0..batch).map(|i| (i % 10) as i64).collect();
    let x = Tensor::<4>::from_data(TensorData::new(x, [batch, 1, 28, 28]), &dev);
    let y = Tensor::<1, Int>::from_data(TensorData::new(y, [batch]), &dev);
    let ce = CrossEntropyLossConfig::new().init(&dev);
    let mut optim = SgdConfig::new().init();
    let lr = 0.01;
    let mut times = Vec::with_capacity(steps);
    let mut last = f32::NAN;
    macro_rules! run {
        ($model:expr) => {{
            let mut model = $model;
            for i in 0..warmup + steps {
                let t = Instant::now();
                let logits = model.forward(x.clone());
                let loss = ce.forward(logits, y.clone());
                let grads = GradientsParams::from_grads(loss.backward(), &model);
                model = optim.step(lr, model, grads);
                last = loss
                    .try_into_scalar::<f32>()
                    .map_err(|e| format!("reading the loss back: {e:?}"))?;
                device
                    .sync()
                    .map_err(|e| format!("synchronising the device: {e:?}"))?;
                if i >= warmup {
                    times.push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
        }};
    }
    match row {
        "lenet5" => run!(LeNet5::new(&dev)),
        "small_cnn" => run!(SmallCnn::new(&dev)),
        _ => return Err(format!("unknown row {row:?} (lenet5, small_cnn)")),
    }
    if !last.is_finite() {
        return Err(format!("{row}: the loss is not finite ({last})"));
    }
    Ok((median(times), last))
}

/// GFLOPS of an `n`×`n`×`n` f32 matmul: best of `reps` timings of 4 products each (the device
/// synchronised before the clock stops), after 2 untimed products — as frugal's `time_sgemm`.
fn matmul(n: usize, reps: usize, device: &Device) -> Result<f64, String> {
    let a: Vec<f32> = (0..n * n)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0)
        .collect();
    let b: Vec<f32> = (0..n * n)
        .map(|i| ((i * 5 % 11) as f32 - 5.0) / 8.0)
        .collect();
    let a = Tensor::<2>::from_data(TensorData::new(a, [n, n]), device);
    let b = Tensor::<2>::from_data(TensorData::new(b, [n, n]), device);
    let sync = || device.sync().map_err(|e| format!("synchronising: {e:?}"));
    for _ in 0..2 {
        let _ = a.clone().matmul(b.clone());
        sync()?;
    }
    let mut best = 0f64;
    for _ in 0..reps {
        let t = Instant::now();
        let outs: Vec<Tensor<2>> = (0..4).map(|_| a.clone().matmul(b.clone())).collect();
        sync()?;
        let s = t.elapsed().as_secs_f64() / 4.0;
        drop(outs);
        best = best.max(2.0 * (n * n * n) as f64 / s / 1e9);
    }
    Ok(best)
}

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

const USAGE: &str = "usage: frugal-burn-bench (lenet5|small_cnn) [--batch 128] [--steps 10] [--warmup 3] | matmul [--n 1024] [--reps 5] | adapter";

fn run(args: &[String]) -> Result<Option<String>, String> {
    let what = args.first().ok_or(USAGE)?.as_str();
    if !matches!(what, "lenet5" | "small_cnn" | "matmul" | "adapter") {
        return Err(format!("{USAGE} (got {what:?})"));
    }
    let (device, adapter) = match open() {
        Ok(d) => d,
        Err(why) => return Ok(Some(why)),
    };
    let a = &adapter.json;
    match what {
        "adapter" => println!("BENCH-JSON {{\"side\":\"burn-wgpu\",{a}}}"),
        "matmul" => {
            let n = flag(args, "--n", 1024)?;
            let reps = flag(args, "--reps", 5)?;
            let g = matmul(n, reps, &device)?;
            println!(
                "BENCH-JSON {{\"side\":\"burn-wgpu\",\"row\":\"matmul\",\"n\":{n},\"gflops\":{g:.3},\"reps\":{reps},{a}}}"
            );
        }
        row => {
            let batch = flag(args, "--batch", 128)?;
            let steps = flag(args, "--steps", 10)?;
            let warmup = flag(args, "--warmup", 3)?;
            let (ms, loss) = train(row, batch, steps, warmup, &device)?;
            println!(
                "BENCH-JSON {{\"side\":\"burn-wgpu\",\"row\":\"{row}\",\"batch\":{batch},\"ms_per_step\":{ms:.4},\"steps\":{steps},\"warmup\":{warmup},\"loss\":{loss},{a}}}"
            );
        }
    }
    Ok(None)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(why)) => {
            println!(
                "BENCH-JSON {{\"side\":\"burn-wgpu\",\"skipped\":{}}}",
                json_str(&why)
            );
            eprintln!("frugal-burn-bench: skipped: {why}");
            ExitCode::from(SKIPPED)
        }
        Err(e) => {
            eprintln!("frugal-burn-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
