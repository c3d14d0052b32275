//! `cargo xtask bench gpu [--reps R]`: the wgpu backend's tiled SGEMM on the adapter this machine has
//! (lavapipe on a machine without a GPU), 1024³ and the digits MLP's shapes, in GFLOPS beside frugal's CPU
//! SGEMM on the same machine in the same run (best of `R`, default 5). On lavapipe the "GPU" runs on the
//! CPU's cores: the ratio is for information, not a GPU figure.
use frugal_core::kernels::gemm::SgemmKernel;
use frugal_core::pool::ThreadPool;
use frugal_wgpu::Gpu;

pub fn main(args: &[String]) -> Result<(), String> {
    let reps: usize = match args {
        [f, v] if f == "--reps" => v.parse().map_err(|_| "--reps needs a number")?,
        [] => 5,
        _ => return Err("usage: cargo xtask bench gpu [--reps R]".into()),
    };
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
    println!("| m×n×k | GPU GFLOPS | CPU GFLOPS | GPU / CPU |");
    println!("|---|---:|---:|---:|");
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
        let (mut g_best, mut c_best) = (0f64, 0f64);
        for _ in 0..reps {
            let s = gpu.time_sgemm(&bufs, 4).map_err(|e| e.to_string())?;
            g_best = g_best.max(Gpu::flops(&bufs) / s / 1e9);
            c_best = c_best.max(crate::sgemm::gflops(
                SgemmKernel::selected(),
                &pool,
                m,
                n,
                k,
                1,
                false,
            ));
        }
        println!(
            "| {m}×{n}×{k} | {g_best:.1} | {c_best:.1} | {:.2} |",
            g_best / c_best
        );
    }
    Ok(())
}
