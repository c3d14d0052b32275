//! WebGPU for the trainer (feature `webgpu`, the second, larger `.wasm`): the page's adapter and the GPU
//! backend kept between calls, so a plan's buffers are made once (`GpuBackend::prepare` keeps them for
//! the same plan).
use alloc::string::{String, ToString};

use frugal_wgpu::GpuBackend;

use crate::error::WebError;

/// The page's GPU backend.
pub struct Gpu {
    backend: Option<GpuBackend>,
    adapter: String,
}

impl Gpu {
    /// Opens the page's WebGPU adapter.
    pub async fn open() -> Result<Gpu, WebError> {
        let b = GpuBackend::open_async()
            .await
            .map_err(|e| WebError::Gpu(e.to_string()))?;
        Ok(Gpu {
            adapter: b.gpu().adapter(),
            backend: Some(b),
        })
    }

    /// The adapter's name.
    pub fn adapter(&self) -> &str {
        &self.adapter
    }

    /// The backend for one call (given back with [`Gpu::put`]).
    pub(crate) fn take(&mut self) -> Result<GpuBackend, WebError> {
        self.backend.take().ok_or_else(|| {
            WebError::Gpu("the GPU is in use by another call (await it first)".into())
        })
    }

    pub(crate) fn put(&mut self, b: GpuBackend) {
        self.backend = Some(b);
    }
}
