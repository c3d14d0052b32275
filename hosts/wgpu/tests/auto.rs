//! Placement by measured cost on this machine's adapter (lavapipe without a GPU): the measurements are
//! finite, the DP's placement is predicted no slower than all-CPU (a placement it could have chosen),
//! and the mixed plan it builds trains as the CPU does.
#![cfg(not(target_arch = "wasm32"))]
mod common;
mod models;

use frugal_core::backend::{CpuBackend, Placement};
use frugal_core::exec::Executor;
use frugal_core::model::LossKind;
use frugal_core::pool::ThreadPool;
use frugal_wgpu::auto::auto_plan;
use frugal_wgpu::MixedBackend;
use models::{batch, cnn, mlp, plan, target, ADAM, SGD};

#[test]
fn the_measured_placement_trains_as_on_the_cpu() {
    for (spec, mb) in [
        (mlp(LossKind::SoftmaxCrossEntropy, ADAM, 5), 16),
        (cnn(SGD), 8),
    ] {
        let Some(backend) = common::backend() else {
            return;
        };
        let p = plan(&spec, mb, 1);
        let (x, y, t) = batch(&spec, mb, 7, 5);
        // Measured and trained with the CPU side on 2 workers, as `frugal train --device auto` does.
        let pool = ThreadPool::new(2).unwrap();
        let cpu = CpuBackend::with_pool(&pool);
        let (auto, gpu) = auto_plan(&p, &cpu, backend, &x, target(spec.loss, &y, &t), 2).unwrap();
        let n = p.graph.nodes.len();
        assert_eq!(auto.devices.len(), n);
        assert_eq!(auto.measured.node.len(), n);
        for c in &auto.measured.node {
            assert!(c[0].is_finite() && c[0] >= 0.0 && c[1].is_finite() && c[1] >= 0.0);
        }
        let l = auto.measured.link;
        assert!(l.up_latency > 0.0 && l.up_bandwidth > 0.0);
        assert!(l.down_latency > 0.0 && l.down_bandwidth > 0.0);
        // All-CPU moves nothing and is among the placements the DP weighed. (Relative slack for the
        // sums' rounding in another order.)
        assert!(
            auto.predicted <= auto.all_cpu * (1.0 + 1e-9),
            "{} > {}",
            auto.predicted,
            auto.all_cpu
        );
        eprintln!(
            "auto placement: {:?} (predicted {:.3} ms/step, all-CPU {:.3})",
            auto.devices,
            auto.predicted * 1e3,
            auto.all_cpu * 1e3
        );
        // Train the chosen plan and the CPU's for 3 steps: within the GPU suites' 1e-5 (norm-wise; see
        // tests/backend.rs's `agree`), exactly equal where everything stayed on the CPU.
        let run = |mixed: bool, gpu: Option<frugal_wgpu::GpuBackend>| -> Vec<Vec<f32>> {
            let pl = if mixed { &auto.plan } else { &p };
            let mut arena = vec![0u8; pl.needed_bytes()];
            let mut out = Vec::new();
            macro_rules! steps {
                ($ex:expr) => {{
                    let ex = &mut $ex;
                    ex.init_params(&mut arena, 3).unwrap();
                    let mut losses = Vec::new();
                    for s in 0..3 {
                        let (x, y, t) = batch(&spec, mb, s, 5);
                        let st = ex
                            .train_step(&mut arena, &x, target(spec.loss, &y, &t))
                            .unwrap();
                        losses.push(st.loss);
                    }
                    out.push(losses);
                    let ts: Vec<_> = ex.state_tensors().map(|s| s.2).collect();
                    for t in ts {
                        out.push(ex.read_vec(&mut arena, t).unwrap());
                    }
                }};
            }
            match gpu {
                Some(g) => {
                    steps!(
                        Executor::with_backend(pl, &arena, MixedBackend::with_cpu(cpu, g)).unwrap()
                    )
                }
                None => steps!(Executor::with_backend(pl, &arena, CpuBackend::new()).unwrap()),
            }
            out
        };
        let got = run(true, Some(gpu));
        let want = run(false, None);
        for (k, (g, c)) in got.iter().zip(&want).enumerate() {
            common::close_norm(&format!("auto placement, vector {k}"), g, c, 1e-5);
        }
        if auto.devices.iter().all(|&d| d == Placement::Cpu) {
            assert_eq!(got, want, "all on the CPU: the CPU's run, bit for bit");
        }
    }
}
