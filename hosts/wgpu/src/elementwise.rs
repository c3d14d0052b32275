//! Element-wise layers, the fused softmax cross-entropy and the optimizer updates on the GPU
//! (`elementwise.wgsl`), one pipeline per entry point, created once with the [`Gpu`](crate::Gpu).
use frugal_core::model::OptimizerSpec;
use frugal_core::ops::Act;
use wgpu::util::DeviceExt;

use crate::{start_values, Gpu, GpuError};

/// The uniform block of `elementwise.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    pub(crate) n: u32,
    pub(crate) classes: u32,
    pub(crate) kind: u32,
    pub(crate) accumulate: u32,
    pub(crate) lr: f32,
    pub(crate) momentum: f32,
    pub(crate) wd: f32,
    pub(crate) beta2: f32,
    pub(crate) eps: f32,
    pub(crate) step_size: f32,
    pub(crate) bc2_sqrt: f32,
    pub(crate) pad: f32,
}

/// The optimizer kernel (an [`ENTRIES`] index) and its parameters for step `t` (1-based) over `n`
/// values, and the state values each parameter value has (SGD's momentum buffer, Adam's m and v).
pub(crate) fn optim_params(spec: &OptimizerSpec, t: u32, n: u32) -> (usize, Params, usize) {
    match *spec {
        OptimizerSpec::Sgd {
            lr,
            momentum,
            weight_decay,
        } => (
            entry::SGD,
            Params {
                n,
                lr,
                momentum,
                wd: weight_decay,
                ..Default::default()
            },
            (momentum != 0.0) as usize,
        ),
        OptimizerSpec::Adam {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } => {
            // The bias corrections in f64, as PyTorch (and `optim::apply`) compute them.
            let bc1 = 1.0 - (beta1 as f64).powi(t as i32);
            let bc2 = 1.0 - (beta2 as f64).powi(t as i32);
            (
                entry::ADAM,
                Params {
                    n,
                    lr,
                    momentum: beta1,
                    wd: weight_decay,
                    beta2,
                    eps,
                    step_size: (lr as f64 / bc1) as f32,
                    bc2_sqrt: bc2.sqrt() as f32,
                    ..Default::default()
                },
                2,
            )
        }
        // Refused when the backend prepares a plan (`check`): no AdamW kernel. Plain Adam's kernel
        // without decay keeps this total.
        OptimizerSpec::AdamW {
            lr,
            beta1,
            beta2,
            eps,
            ..
        } => optim_params(
            &OptimizerSpec::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay: 0.0,
            },
            t,
            n,
        ),
    }
}

/// The entry points, in the order of [`Pipelines::all`].
pub(crate) const ENTRIES: [&str; 15] = [
    "act_fwd",
    "act_grad",
    "softmax_ce",
    "sgd",
    "adam",
    "mse",
    "add",
    "dropout",
    "bias_rows",
    "col_sum",
    "copy",
    "guard",
    "dropout_rows",
    "pack_half",
    "unpack_half",
];

/// Indices into [`ENTRIES`] (and [`Pipelines::all`]).
pub(crate) mod entry {
    pub const ACT_FWD: usize = 0;
    pub const ACT_GRAD: usize = 1;
    pub const SOFTMAX_CE: usize = 2;
    pub const SGD: usize = 3;
    pub const ADAM: usize = 4;
    pub const MSE: usize = 5;
    pub const ADD: usize = 6;
    pub const BIAS_ROWS: usize = 8;
    pub const COL_SUM: usize = 9;
    pub const COPY: usize = 10;
    pub const GUARD: usize = 11;
    pub const DROPOUT_ROWS: usize = 12;
    pub const PACK_HALF: usize = 13;
    pub const UNPACK_HALF: usize = 14;
}

/// Invocations per workgroup (`@workgroup_size(64)`), and workgroups per dispatch row.
const GROUP: u32 = 64;
const ROW: u32 = 65535;

/// The workgroups of a dispatch of `invocations` (64 each, rows of at most 65,535; see `index` in
/// `prelude.wgsl`).
pub(crate) fn workgroups(invocations: u32) -> (u32, u32) {
    let groups = invocations.div_ceil(GROUP);
    (groups.min(ROW), groups.div_ceil(ROW))
}

/// The "invocations" to ask of [`workgroups`] (and of `Gpu::run_set`) for a kernel that runs one
/// workgroup per item — the reductions of `conv.wgsl` and `bn.wgsl`, whose workgroups of 256 index
/// themselves by `wg_index` — so that the dispatch has `items` workgroups.
pub(crate) fn per_workgroup(items: usize) -> usize {
    items.saturating_mul(GROUP as usize)
}

pub(crate) struct Pipelines {
    pub(crate) layout: wgpu::BindGroupLayout,
    pub(crate) all: Vec<wgpu::ComputePipeline>,
}

impl Pipelines {
    /// The element-wise, loss and optimizer pipelines.
    pub(crate) fn new(device: &wgpu::Device) -> Pipelines {
        Self::from_source(
            device,
            "elementwise",
            include_str!("elementwise.wgsl"),
            &ENTRIES,
        )
    }

    /// One pipeline per entry point of `source` (after `prelude.wgsl`: a uniform block and five storage
    /// buffers).
    pub(crate) fn from_source(
        device: &wgpu::Device,
        label: &str,
        source: &str,
        entries: &[&str],
    ) -> Pipelines {
        let source = format!("{}\n{source}", include_str!("prelude.wgsl"));
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let entry = |binding, ty| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty,
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let rw = wgpu::BufferBindingType::Storage { read_only: false };
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(label),
            entries: &[
                entry(0, wgpu::BufferBindingType::Uniform),
                entry(1, rw),
                entry(2, rw),
                entry(3, rw),
                entry(4, rw),
                entry(5, rw),
            ],
        });
        let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(label),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let all = entries
            .iter()
            .map(|e| {
                device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(e),
                    layout: Some(&pl),
                    module: &module,
                    entry_point: Some(e),
                    compilation_options: Default::default(),
                    cache: None,
                })
            })
            .collect();
        Pipelines { layout, all }
    }
}

fn act_code(a: Act) -> u32 {
    match a {
        Act::Relu => 0,
        Act::Relu6 => 1,
        Act::Sigmoid => 2,
        Act::Tanh => 3,
    }
}

impl Gpu {
    fn run_elementwise(
        &self,
        entry: usize,
        params: Params,
        invocations: usize,
        ops: [&[f32]; 4],
    ) -> Result<[Vec<f32>; 2], GpuError> {
        self.run_set(
            &self.elementwise,
            entry,
            bytemuck::bytes_of(&params),
            invocations,
            ops,
        )
    }

    /// Runs entry point `entry` of `set` over `invocations` (64 per workgroup) with the uniform block
    /// `params` and operands `a`, `b` (read) and `c`, `d` (read and written, returned).
    pub(crate) fn run_set(
        &self,
        set: &Pipelines,
        entry: usize,
        params: &[u8],
        invocations: usize,
        ops: [&[f32]; 4],
    ) -> Result<[Vec<f32>; 2], GpuError> {
        let [a, b, c, d] = ops;
        let [c, d, _] = self.run_set5(set, entry, params, invocations, [a, b, c, d, &[]])?;
        Ok([c, d])
    }

    /// [`Gpu::run_set`] with the fifth operand `e` (read and written, returned third).
    pub(crate) fn run_set5(
        &self,
        set: &Pipelines,
        entry: usize,
        params: &[u8],
        invocations: usize,
        ops: [&[f32]; 5],
    ) -> Result<[Vec<f32>; 3], GpuError> {
        let inv = u32::try_from(invocations)
            .map_err(|_| GpuError::Shape(format!("{invocations} elements is too many")))?;
        let limit = self.device.limits().max_storage_buffer_binding_size;
        if ops.iter().any(|o| o.len() as u64 * 4 > limit) {
            return Err(GpuError::Shape("an operand exceeds one GPU buffer".into()));
        }
        let uniform = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("params"),
                contents: params,
                usage: wgpu::BufferUsages::UNIFORM,
            });
        let buf = |data: &[f32], usage| {
            let one = [0f32];
            let data = if data.is_empty() { &one[..] } else { data };
            self.device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: None,
                    contents: bytemuck::cast_slice(data),
                    usage,
                })
        };
        let rw = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
        let bufs = [
            buf(ops[0], wgpu::BufferUsages::STORAGE),
            buf(ops[1], wgpu::BufferUsages::STORAGE),
            buf(ops[2], rw),
            buf(ops[3], rw),
            buf(ops[4], rw),
        ];
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: uniform.as_entire_binding(),
        }];
        for (i, b) in bufs.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: b.as_entire_binding(),
            });
        }
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &set.layout,
            entries: &entries,
        });
        let (gx, gy) = workgroups(inv);
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: None,
            });
            pass.set_pipeline(&set.all[entry]);
            pass.set_bind_group(0, &group, &[]);
            if gx > 0 {
                pass.dispatch_workgroups(gx, gy, 1);
            }
        }
        self.queue.submit([enc.finish()]);
        let c = self.read(&bufs[2], ops[2].len())?;
        let d = self.read(&bufs[3], ops[3].len())?;
        let e = self.read(&bufs[4], ops[4].len())?;
        Ok([c, d, e])
    }

    /// `y = act(x)`.
    pub fn act_fwd(&self, act: Act, x: &[f32]) -> Result<Vec<f32>, GpuError> {
        let p = Params {
            n: x.len() as u32,
            kind: act_code(act),
            ..Default::default()
        };
        let y = vec![0f32; x.len()];
        let [out, _] = self.run_elementwise(0, p, x.len(), [x, &[], &y, &[]])?;
        Ok(out)
    }

    /// `dx (+)= act'(y) · dy`, from the activation's output `y`; `dx` holds the old values when
    /// `accumulate`.
    pub fn act_grad(
        &self,
        act: Act,
        y: &[f32],
        dy: &[f32],
        dx: &[f32],
        accumulate: bool,
    ) -> Result<Vec<f32>, GpuError> {
        if dy.len() != y.len() || dx.len() != y.len() {
            return Err(GpuError::Shape("y, dy and dx differ in length".into()));
        }
        let p = Params {
            n: y.len() as u32,
            kind: act_code(act),
            accumulate: accumulate as u32,
            ..Default::default()
        };
        let [out, _] = self.run_elementwise(1, p, y.len(), [y, dy, dx, &[]])?;
        Ok(out)
    }

    /// Softmax cross-entropy of `n` samples: `(mean loss, correct, dlogits)`, as `ops::softmax_ce`
    /// (out-of-range labels ignored).
    pub fn softmax_ce(
        &self,
        n: usize,
        classes: usize,
        logits: &[f32],
        labels: &[u32],
    ) -> Result<(f32, usize, Vec<f32>), GpuError> {
        if classes == 0 || Some(logits.len()) != n.checked_mul(classes) || labels.len() != n {
            return Err(GpuError::Shape(format!(
                "{} logits and {} labels for {n} samples of {classes} classes",
                logits.len(),
                labels.len()
            )));
        }
        let valid = labels.iter().filter(|&&l| (l as usize) < classes).count();
        let p = Params {
            n: n as u32,
            classes: classes as u32,
            kind: valid as u32,
            ..Default::default()
        };
        let bits: Vec<f32> = labels.iter().map(|&l| f32::from_bits(l)).collect();
        let dz = vec![0f32; logits.len()];
        let per = vec![0f32; 2 * n];
        let [dz, per] = self.run_elementwise(2, p, n, [logits, &bits, &dz, &per])?;
        // The mean in f64 on the host (the CPU sums in f32 in sample order; the test's bound covers it).
        let loss = per[..n].iter().map(|&l| l as f64).sum::<f64>() / valid.max(1) as f64;
        let correct = per[n..].iter().filter(|&&c| c != 0.0).count();
        Ok((loss as f32, correct, dz))
    }

    /// `y = a + b` (a residual connection; its backward hands dy to both inputs, a copy).
    pub fn add(&self, a: &[f32], b: &[f32]) -> Result<Vec<f32>, GpuError> {
        if a.len() != b.len() {
            return Err(GpuError::Shape("the two inputs differ in length".into()));
        }
        let p = Params {
            n: a.len() as u32,
            ..Default::default()
        };
        let y = vec![0f32; a.len()];
        let [out, _] = self.run_elementwise(6, p, a.len(), [a, b, &y, &[]])?;
        Ok(out)
    }

    /// Dropout with probability `p` and the CPU's counter-based masks (`ops::dropout_fwd` with the same
    /// `seed` keeps the same elements): `y = mask·x/(1−p)`; for the backward pass give dy as `x` and dx's
    /// old values in `old` to accumulate (`ops::dropout_grad`).
    pub fn dropout(
        &self,
        p: f32,
        seed: u64,
        x: &[f32],
        old: Option<&[f32]>,
    ) -> Result<Vec<f32>, GpuError> {
        if !(0.0..1.0).contains(&p) {
            return Err(GpuError::Shape(format!(
                "dropout probability {p} is not in [0, 1)"
            )));
        }
        let y = start_values("dx", old, x.len())?;
        let params = Params {
            n: x.len() as u32,
            classes: seed as u32,
            kind: (seed >> 32) as u32,
            accumulate: old.is_some() as u32,
            lr: p,
            momentum: keep_scale(p),
            ..Default::default()
        };
        let [out, _] = self.run_elementwise(7, params, x.len(), [x, &[], &y, &[]])?;
        Ok(out)
    }

    /// Mean squared error `mean((pred − target)²)` and `dpred = 2(pred − target)/len`, as `ops::mse`.
    pub fn mse(&self, pred: &[f32], target: &[f32]) -> Result<(f32, Vec<f32>), GpuError> {
        if pred.len() != target.len() {
            return Err(GpuError::Shape("pred and target differ in length".into()));
        }
        if pred.is_empty() {
            return Ok((0.0, Vec::new()));
        }
        let p = Params {
            n: pred.len() as u32,
            lr: 2.0 / pred.len() as f32,
            ..Default::default()
        };
        let zeros = vec![0f32; pred.len()];
        let [d, sq] = self.run_elementwise(5, p, pred.len(), [pred, target, &zeros, &zeros])?;
        let loss = sq.iter().map(|&v| v as f64).sum::<f64>() / pred.len() as f64;
        Ok((loss as f32, d))
    }

    /// One optimizer step on `w` from gradient `g` with `state` (SGD's momentum buffer, empty without
    /// momentum; Adam's m then v, `2·len` values); `t` is the 1-based step. Returns (w, state).
    pub fn optim_step(
        &self,
        spec: &OptimizerSpec,
        t: u32,
        w: &[f32],
        g: &[f32],
        state: &[f32],
    ) -> Result<(Vec<f32>, Vec<f32>), GpuError> {
        if g.len() != w.len() {
            return Err(GpuError::Shape("w and g differ in length".into()));
        }
        let (entry, p, per) = optim_params(spec, t, w.len() as u32);
        let need = per * w.len();
        if state.len() != need {
            return Err(GpuError::Shape(format!(
                "the optimizer state has {} values, not {need}",
                state.len()
            )));
        }
        // Adam's m and v are two operands (d and e); the guard word (b) is 0: nothing rejected.
        let (m, v) = if entry == entry::ADAM {
            state.split_at(w.len())
        } else {
            (state, &[][..])
        };
        let [w, mut s, v] = self.run_set5(
            &self.elementwise,
            entry,
            bytemuck::bytes_of(&p),
            w.len(),
            [g, &[], w, m, v],
        )?;
        s.extend_from_slice(&v);
        Ok((w, s))
    }
}

/// Dropout's scale for kept elements, `1/(1 − p)` in f32 as the CPU computes it (`ops::dropout`):
/// computed here and passed to the kernel, because WGSL's `/` may be off by ulps on real GPUs (NVIDIA's
/// Vulkan divides by a reciprocal), which broke bit-exactness with the CPU on an H200.
pub(crate) fn keep_scale(p: f32) -> f32 {
    1.0 / (1.0 - p)
}
