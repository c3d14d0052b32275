//! # frugal-wgpu
//!
//! frugal's GPU backend on [wgpu](https://wgpu.rs): Vulkan, Metal and DX12 natively, Mesa's lavapipe (a
//! Vulkan driver on the CPU) on machines without a GPU. [`GpuBackend`] runs whole training steps of a
//! plan in one GPU buffer laid out by the planner ([`gpu_plan`]; see the `backend` module). [`Gpu`] holds
//! the device and the WGSL kernels — the tiled f32 GEMM in workgroup memory that linear and convolution
//! layers build on, the element-wise layers, the fused losses, SGD and Adam, pooling, convolution,
//! BatchNorm, Dropout — each also callable on its own (operands moved through the host) and checked
//! against frugal-core's CPU ops on every adapter the tests can open.
//!
//! Mixed plans (natively): [`MixedBackend`] runs a plan whose layers are split between the CPU and the
//! GPU ([`mixed_plan`], frugal-core's `policy::mixed`), moving values between the host arena and the
//! GPU buffer where the plan says; [`auto`] measures per-layer costs and the host↔GPU link and places
//! the layers by dynamic programming (`frugal train --device auto`).
//!
//! ```no_run
//! let gpu = frugal_wgpu::Gpu::open().expect("a GPU adapter (or lavapipe)");
//! let c = gpu.sgemm(2, 2, 3, &[1., 2., 3., 4., 5., 6.], &[1., 0., 0., 1., 1., 1.]).unwrap();
//! assert_eq!(c, [4., 5., 10., 11.]);
//! ```
use std::fmt;
use std::time::Instant;

use wgpu::util::DeviceExt;

mod backend;
mod bn;
mod conv;
mod elementwise;
mod gemm;
pub use backend::{gpu_plan, DispatchTime, GpuBackend, GpuBytes, GPU_ALIGN, GPU_SPACE};
pub use bn::{BnForward, BnGrads};
pub use gemm::{GemmKernel, GemmVariant};
#[cfg(not(target_arch = "wasm32"))]
pub mod auto;
mod linear;
#[cfg(not(target_arch = "wasm32"))]
mod mixed;
#[cfg(not(target_arch = "wasm32"))]
pub use mixed::{mixed_plan, MixedBackend};
mod pool;

/// A buffer mapping in flight: wgpu's map callback resolves it. Natively the host waits for the GPU and
/// then asks [`Mapping::done`]; on the web the callback runs only once the page's event loop does, so the
/// host awaits it.
pub(crate) struct Mapping {
    state: MappingState,
}

type MappingState = std::sync::Arc<
    std::sync::Mutex<(
        Option<Result<(), wgpu::BufferAsyncError>>,
        Option<std::task::Waker>,
    )>,
>;

impl Mapping {
    /// Maps `slice` for reading.
    pub(crate) fn start(slice: &wgpu::BufferSlice<'_>) -> Mapping {
        let state: MappingState = Default::default();
        let st = state.clone();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
            s.0 = Some(r);
            if let Some(w) = s.1.take() {
                w.wake();
            }
        });
        Mapping { state }
    }
}

impl std::future::Future for Mapping {
    type Output = Result<(), GpuError>;
    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match s.0.take() {
            Some(r) => std::task::Poll::Ready(r.map_err(|e| GpuError::Readback(e.to_string()))),
            None => {
                s.1 = Some(cx.waker().clone());
                std::task::Poll::Pending
            }
        }
    }
}

/// Runs a future to completion on this thread (natively; the browser awaits instead).
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    pollster::block_on(f)
}

/// The f32 values of a mapped slice.
pub(crate) fn mapped_f32(slice: &wgpu::BufferSlice<'_>) -> Result<Vec<f32>, GpuError> {
    let view = slice
        .get_mapped_range()
        .map_err(|e| GpuError::Readback(e.to_string()))?;
    Ok(bytemuck::cast_slice::<u8, f32>(&view).to_vec())
}

/// Why the GPU could not be used.
#[derive(Debug, Clone, PartialEq)]
pub enum GpuError {
    /// No adapter: no GPU and no software Vulkan driver (`apt-get install mesa-vulkan-drivers`).
    NoAdapter(String),
    /// The adapter refused a device.
    Device(String),
    /// Reading results back failed.
    Readback(String),
    /// Operand slices that do not match the dimensions, or a product too large for one buffer.
    Shape(String),
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuError::NoAdapter(w) if cfg!(target_arch = "wasm32") => write!(
                f,
                "no WebGPU adapter ({w}); the browser must expose WebGPU (headless Chromium: --enable-unsafe-webgpu)"
            ),
            GpuError::NoAdapter(w) => write!(
                f,
                "no GPU adapter ({w}); without a GPU, install Mesa's lavapipe: apt-get install mesa-vulkan-drivers"
            ),
            GpuError::Device(w) => write!(f, "the GPU adapter refused a device: {w}"),
            GpuError::Readback(w) => write!(f, "reading the GPU's result back failed: {w}"),
            GpuError::Shape(w) => write!(f, "bad GEMM operands: {w}"),
        }
    }
}

impl std::error::Error for GpuError {}

/// `v` as a shader's u32 parameter.
pub(crate) fn u32_of(v: usize) -> Result<u32, GpuError> {
    u32::try_from(v).map_err(|_| GpuError::Shape(format!("{v} is too large")))
}

/// An operand's length, checked.
pub(crate) fn check_len(what: &str, got: usize, want: usize) -> Result<(), GpuError> {
    if got == want {
        Ok(())
    } else {
        Err(GpuError::Shape(format!(
            "{what} has {got} values, not {want}"
        )))
    }
}

/// The starting values of an output of `len` values: its `old` values when accumulating, else zeros.
pub(crate) fn start_values(
    what: &str,
    old: Option<&[f32]>,
    len: usize,
) -> Result<Vec<f32>, GpuError> {
    match old {
        Some(o) => {
            check_len(what, o.len(), len)?;
            Ok(o.to_vec())
        }
        None => Ok(vec![0f32; len]),
    }
}

/// The uniform block of `sgemm.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Dims {
    m: u32,
    n: u32,
    k: u32,
    accumulate: u32,
    trans_a: u32,
    trans_b: u32,
    pad: [u32; 2],
}

impl Dims {
    fn of(m: u32, n: u32, k: u32, opts: GemmOpts) -> Dims {
        Dims {
            m,
            n,
            k,
            accumulate: opts.accumulate as u32,
            trans_a: opts.trans_a as u32,
            trans_b: opts.trans_b as u32,
            pad: [0; 2],
        }
    }
}

/// How a GEMM reads its operands and writes its result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GemmOpts {
    /// A is stored transposed (k×m).
    pub trans_a: bool,
    /// B is stored transposed (n×k).
    pub trans_b: bool,
    /// C += A·B (C's old values are given) instead of C = A·B.
    pub accumulate: bool,
}

/// Rows and columns of C one workgroup computes (`TS` in `sgemm.wgsl`).
pub const TILE: u32 = 64;

impl GemmBuffers {
    fn dims(&self) -> Dims {
        Dims::of(self.m, self.n, self.k, self.opts)
    }
}

/// An opened GPU with frugal's pipelines, created once.
pub struct Gpu {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    sgemm: wgpu::ComputePipeline,
    /// The default tile-multiple kernels ([`GemmVariant::defaults`], 2 per layout), compiled on first
    /// use; `None` where this device refuses one.
    fast_gemm: [std::sync::OnceLock<Option<GemmKernel>>; 8],
    layout: wgpu::BindGroupLayout,
    elementwise: elementwise::Pipelines,
    pool: elementwise::Pipelines,
    conv: elementwise::Pipelines,
    bn: elementwise::Pipelines,
}

/// GEMM operands resident on the GPU, for repeated products without transfers.
pub struct GemmBuffers {
    m: u32,
    n: u32,
    k: u32,
    opts: GemmOpts,
    /// Bytes bound for A, B and C.
    bytes: [u64; 3],
    c: wgpu::Buffer,
    group: wgpu::BindGroup,
}

impl Gpu {
    /// Opens the first adapter wgpu offers (a discrete GPU first), or lavapipe.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open() -> Result<Gpu, GpuError> {
        pollster::block_on(Self::open_async())
    }

    /// [`Gpu::open`] with those of `wanted` the adapter has (`bench_gpu --profile`: timestamp
    /// queries); see [`Gpu::features`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open_with_features(wanted: wgpu::Features) -> Result<Gpu, GpuError> {
        pollster::block_on(Self::open_with_features_async(wanted))
    }

    /// [`Gpu::open`] as a future: the browser's way (WebGPU hands out adapters asynchronously).
    pub async fn open_async() -> Result<Gpu, GpuError> {
        Self::open_with_features_async(wgpu::Features::empty()).await
    }

    /// The optional features the device was opened with.
    pub fn features(&self) -> wgpu::Features {
        self.device.features()
    }

    async fn open_with_features_async(wanted: wgpu::Features) -> Result<Gpu, GpuError> {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            })
            .await
            .map_err(|e| GpuError::NoAdapter(e.to_string()))?;
        let info = adapter.get_info();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("frugal"),
                required_features: wanted & adapter.features(),
                required_limits: adapter.limits(),
                ..Default::default()
            })
            .await
            .map_err(|e| GpuError::Device(e.to_string()))?;
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("sgemm"),
            source: wgpu::ShaderSource::Wgsl(include_str!("sgemm.wgsl").into()),
        });
        let storage = |binding, read_only| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("sgemm"),
            entries: &[
                wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                },
                storage(1, false),
                storage(2, false),
                storage(3, false),
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("sgemm"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let sgemm = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("sgemm"),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let elementwise = elementwise::Pipelines::new(&device);
        let pool = pool::pipelines(&device);
        let conv = conv::pipelines(&device);
        let bn = bn::pipelines(&device);
        Ok(Gpu {
            device,
            queue,
            info,
            sgemm,
            fast_gemm: Default::default(),
            layout,
            elementwise,
            pool,
            conv,
            bn,
        })
    }

    /// The adapter, e.g. "llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan, Cpu)".
    pub fn adapter(&self) -> String {
        // Browsers may not say the adapter's name (WebGPU's privacy rules).
        let name = if self.info.name.is_empty() {
            "unnamed adapter"
        } else {
            &self.info.name
        };
        format!(
            "{name} ({:?}, {:?})",
            self.info.backend, self.info.device_type
        )
    }

    /// The adapter with its driver and ids, for benchmark reports.
    pub fn adapter_details(&self) -> String {
        let i = &self.info;
        format!(
            "{}; driver {} ({}); vendor {:#06x}, device {:#06x}",
            self.adapter(),
            i.driver,
            i.driver_info,
            i.vendor,
            i.device
        )
    }

    /// Whether the adapter is a software rasteriser on the CPU (lavapipe, SwiftShader, WARP).
    pub fn is_software(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// Uploads `a` (m×k) and `b` (k×n), row-major, and makes C (m×n) on the GPU.
    pub fn gemm_buffers(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
    ) -> Result<GemmBuffers, GpuError> {
        self.gemm_buffers_with(m, n, k, a, b, GemmOpts::default(), &[])
    }

    /// [`Gpu::gemm_buffers`] with transposed operands and, when accumulating, C's old values `c`
    /// (m×n; ignored otherwise).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_buffers_with(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        opts: GemmOpts,
        c_old: &[f32],
    ) -> Result<GemmBuffers, GpuError> {
        let dims = |v: usize, what: &str| {
            u32::try_from(v).map_err(|_| GpuError::Shape(format!("{what} = {v} is too large")))
        };
        let (mu, nu, ku) = (dims(m, "m")?, dims(n, "n")?, dims(k, "k")?);
        let len = |r: usize, c: usize, what: &str| {
            r.checked_mul(c)
                .filter(|&e| (e as u64) * 4 <= self.device.limits().max_storage_buffer_binding_size)
                .ok_or_else(|| GpuError::Shape(format!("{what} ({r}×{c}) exceeds one GPU buffer")))
        };
        if a.len() != len(m, k, "A")? || b.len() != len(k, n, "B")? {
            return Err(GpuError::Shape(format!(
                "A has {} elements for {m}×{k}, B {} for {k}×{n}",
                a.len(),
                b.len()
            )));
        }
        let c_len = len(m, n, "C")?;
        if opts.accumulate && c_old.len() != c_len {
            return Err(GpuError::Shape(format!(
                "accumulating into C ({m}×{n}) needs its {c_len} old values, got {}",
                c_old.len()
            )));
        }
        // wgpu refuses zero-sized bindings: an empty operand still gets one element.
        let init = |label, data: &[f32], usage| {
            let one = [0f32];
            let data = if data.is_empty() { &one[..] } else { data };
            self.device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(label),
                    contents: bytemuck::cast_slice(data),
                    usage,
                })
        };
        let uniform = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("dims"),
                contents: bytemuck::bytes_of(&Dims::of(mu, nu, ku, opts)),
                usage: wgpu::BufferUsages::UNIFORM,
            });
        let ab = init("A", a, wgpu::BufferUsages::STORAGE);
        let bb = init("B", b, wgpu::BufferUsages::STORAGE);
        let c_init = if opts.accumulate {
            c_old.to_vec()
        } else {
            vec![0f32; c_len]
        };
        let c = init(
            "C",
            &c_init,
            wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
        );
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("sgemm"),
            layout: &self.layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: uniform.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: ab.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: bb.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 3,
                    resource: c.as_entire_binding(),
                },
            ],
        });
        Ok(GemmBuffers {
            m: mu,
            n: nu,
            k: ku,
            opts,
            bytes: [ab.size(), bb.size(), c.size()],
            c,
            group,
        })
    }

    /// Records `reps` products by the default kernel ([`Gpu::gemm_default`]) into one command buffer
    /// and submits it once.
    fn dispatch(&self, g: &GemmBuffers, reps: usize) {
        let (pipeline, groups) = self.gemm_default(&g.dims(), g.bytes);
        self.dispatch_with(pipeline, groups, g, reps);
    }

    /// The kernel every GEMM runs by default (`sgemm_with`, Linear, the GPU backend's step): the first
    /// of [`GemmVariant::defaults`] for the layout that fits the dimensions, compiles on this device and
    /// whose bindings (`bytes`: A, B, C) hold the whole operands, else `sgemm.wgsl`. Its pipeline and
    /// workgroups. The results are bit-equal whichever it picks (each C element is the same in-order
    /// `fma` chain).
    pub(crate) fn gemm_default(
        &self,
        d: &Dims,
        bytes: [u64; 3],
    ) -> (&wgpu::ComputePipeline, (u32, u32)) {
        if let Some(k) = self.gemm_default_kernel(d, bytes) {
            return (&k.pipeline, k.variant.groups(d.m, d.n));
        }
        (&self.sgemm, (d.n.div_ceil(TILE), d.m.div_ceil(TILE)))
    }

    /// The generated kernel [`Gpu::gemm_default`] picks, if any.
    fn gemm_default_kernel(&self, d: &Dims, bytes: [u64; 3]) -> Option<&GemmKernel> {
        let (ta, tb) = (d.trans_a != 0, d.trans_b != 0);
        let need = |r: u32, c: u32| 4 * r as u64 * c as u64;
        // The unchecked kernels read and write every element of the operands and nothing beyond.
        if bytes[0] < need(d.m, d.k) || bytes[1] < need(d.k, d.n) || bytes[2] < need(d.m, d.n) {
            return None;
        }
        let layout = usize::from(ta) + 2 * usize::from(tb);
        GemmVariant::defaults(ta, tb)
            .into_iter()
            .enumerate()
            .filter(|(_, v)| v.fits(d.m, d.n, d.k, ta, tb))
            .find_map(|(i, v)| {
                self.fast_gemm[2 * layout + i]
                    .get_or_init(|| self.gemm_kernel(v).ok())
                    .as_ref()
            })
    }

    /// [`Gpu::gemm_default`]'s kernel's name for bindings of `bytes`.
    pub(crate) fn gemm_default_name_bound(&self, d: &Dims, bytes: [u64; 3]) -> String {
        self.gemm_default_kernel(d, bytes)
            .map_or_else(|| "sgemm.wgsl".to_string(), |k| k.variant.name())
    }

    /// The name of the kernel a product of these dimensions runs by default (`sgemm.wgsl` or a
    /// [`GemmVariant::name`]); compiles it if it is the first use.
    pub fn gemm_default_name(&self, m: u32, n: u32, k: u32, opts: GemmOpts) -> String {
        self.gemm_default_name_bound(&Dims::of(m, n, k, opts), [u64::MAX; 3])
    }

    /// [`Gpu::dispatch`] on `pipeline` with `groups` workgroups per product.
    fn dispatch_with(
        &self,
        pipeline: &wgpu::ComputePipeline,
        groups: (u32, u32),
        g: &GemmBuffers,
        reps: usize,
    ) {
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("sgemm"),
            });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("sgemm"),
                timestamp_writes: None,
            });
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &g.group, &[]);
            for _ in 0..reps {
                pass.dispatch_workgroups(groups.0, groups.1, 1);
            }
        }
        self.queue.submit([enc.finish()]);
    }

    /// Sets every element of `g`'s C to `v` (a benchmark's poison before checking that a kernel wrote
    /// all of C).
    pub fn fill_c(&self, g: &GemmBuffers, v: f32) {
        let len = g.m as usize * g.n as usize;
        if len > 0 {
            self.queue
                .write_buffer(&g.c, 0, bytemuck::cast_slice(&vec![v; len]));
        }
    }

    /// Floating-point operations of one product (2·m·n·k).
    pub fn flops(g: &GemmBuffers) -> f64 {
        2.0 * g.m as f64 * g.n as f64 * g.k as f64
    }

    /// Reads C back.
    pub fn read_c(&self, g: &GemmBuffers) -> Result<Vec<f32>, GpuError> {
        self.read(&g.c, g.m as usize * g.n as usize)
    }

    /// Reads the first `len` f32 of `buf` back (one copy to a mappable buffer, then a wait).
    fn read(&self, buf: &wgpu::Buffer, len: usize) -> Result<Vec<f32>, GpuError> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            self.read_range(buf, 0, len)
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = (buf, len);
            Err(GpuError::Readback(
                "a blocking read-back cannot run in the browser (the GPU backend awaits instead)"
                    .into(),
            ))
        }
    }

    /// Reads `len` f32 of `buf` from byte `offset` (a multiple of 4) back, waiting for the GPU (not on
    /// the web: see [`Gpu::read_range_async`]).
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn read_range(
        &self,
        buf: &wgpu::Buffer,
        offset: u64,
        len: usize,
    ) -> Result<Vec<f32>, GpuError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let staging = self.copy_out(buf, offset, len);
        let slice = staging.slice(..);
        let mapping = Mapping::start(&slice);
        self.wait()?;
        // Another thread's poll on this device may be running our callback right now: wait for it.
        block_on(mapping)?;
        let out = mapped_f32(&slice)?;
        staging.unmap();
        Ok(out)
    }

    /// [`Gpu::read_range`] that awaits the mapping instead of blocking (the browser's way: the mapping
    /// completes only once the page's event loop runs).
    pub(crate) async fn read_range_async(
        &self,
        buf: &wgpu::Buffer,
        offset: u64,
        len: usize,
    ) -> Result<Vec<f32>, GpuError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let staging = self.copy_out(buf, offset, len);
        let slice = staging.slice(..);
        Mapping::start(&slice).await?;
        let out = mapped_f32(&slice)?;
        staging.unmap();
        Ok(out)
    }

    /// A mappable copy of `len` f32 of `buf` from byte `offset`, submitted.
    fn copy_out(&self, buf: &wgpu::Buffer, offset: u64, len: usize) -> wgpu::Buffer {
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: (len * 4) as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("readback"),
            });
        enc.copy_buffer_to_buffer(buf, offset, &staging, 0, (len * 4) as u64);
        self.queue.submit([enc.finish()]);
        staging
    }

    /// Waits for the GPU's submitted work (natively; on the web it returns at once).
    pub(crate) fn wait(&self) -> Result<(), GpuError> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| GpuError::Readback(e.to_string()))
    }

    /// C = A·B on the GPU: `a` is m×k, `b` k×n, row-major; returns C (m×n).
    pub fn sgemm(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
    ) -> Result<Vec<f32>, GpuError> {
        self.sgemm_with(m, n, k, a, b, GemmOpts::default(), &[])
    }

    /// C (+)= op(A)·op(B) (see [`GemmOpts`]); `c_old` is C's old values when accumulating.
    #[allow(clippy::too_many_arguments)]
    pub fn sgemm_with(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        opts: GemmOpts,
        c_old: &[f32],
    ) -> Result<Vec<f32>, GpuError> {
        let g = self.gemm_buffers_with(m, n, k, a, b, opts, c_old)?;
        self.dispatch(&g, 1);
        self.read_c(&g)
    }

    /// Seconds per product by the default kernel ([`Gpu::gemm_default`]) over `reps` products of
    /// resident operands, submitted at once (after one untimed submission).
    pub fn time_sgemm(&self, g: &GemmBuffers, reps: usize) -> Result<f64, GpuError> {
        let (pipeline, groups) = self.gemm_default(&g.dims(), g.bytes);
        self.time_launch(pipeline, groups, g, reps)
    }

    /// The kernel [`Gpu::time_sgemm`] and [`Gpu::sgemm_with`] run on `g` (see
    /// [`Gpu::gemm_default_name`]).
    pub fn sgemm_kernel_name(&self, g: &GemmBuffers) -> String {
        self.gemm_default_name(g.m, g.n, g.k, g.opts)
    }

    /// The pipeline and workgroups of one product of `g` by `kern` (`None`: `sgemm.wgsl`), or why
    /// the kernel does not fit the operands.
    fn gemm_launch<'k>(
        &'k self,
        kern: Option<&'k GemmKernel>,
        g: &GemmBuffers,
    ) -> Result<(&'k wgpu::ComputePipeline, (u32, u32)), GpuError> {
        match kern {
            None => Ok((&self.sgemm, (g.n.div_ceil(TILE), g.m.div_ceil(TILE)))),
            Some(kern) => {
                let v = kern.variant;
                if !v.fits(g.m, g.n, g.k, g.opts.trans_a, g.opts.trans_b) {
                    return Err(GpuError::Shape(format!(
                        "{} does not fit {}×{}×{} {:?}",
                        v.name(),
                        g.m,
                        g.n,
                        g.k,
                        g.opts
                    )));
                }
                Ok((&kern.pipeline, v.groups(g.m, g.n)))
            }
        }
    }

    /// [`Gpu::time_sgemm`] with `kern` (`None`: `sgemm.wgsl`): seconds per product of `reps` products
    /// recorded in one pass and submitted once, after one untimed submission.
    pub fn time_gemm(
        &self,
        kern: Option<&GemmKernel>,
        g: &GemmBuffers,
        reps: usize,
    ) -> Result<f64, GpuError> {
        let (pipeline, groups) = self.gemm_launch(kern, g)?;
        self.time_launch(pipeline, groups, g, reps)
    }

    /// Seconds per product of `reps` dispatches of `pipeline` recorded in one pass and submitted once,
    /// after one untimed submission.
    fn time_launch(
        &self,
        pipeline: &wgpu::ComputePipeline,
        groups: (u32, u32),
        g: &GemmBuffers,
        reps: usize,
    ) -> Result<f64, GpuError> {
        self.dispatch_with(pipeline, groups, g, 1);
        self.wait()?;
        let t = Instant::now();
        self.dispatch_with(pipeline, groups, g, reps.max(1));
        self.wait()?;
        Ok(t.elapsed().as_secs_f64() / reps.max(1) as f64)
    }

    /// One product of `g` by `kern` (`None`: `sgemm.wgsl`) into its C, which is then read back.
    pub fn run_gemm(
        &self,
        kern: Option<&GemmKernel>,
        g: &GemmBuffers,
    ) -> Result<Vec<f32>, GpuError> {
        let (pipeline, groups) = self.gemm_launch(kern, g)?;
        self.dispatch_with(pipeline, groups, g, 1);
        self.read_c(g)
    }
}
