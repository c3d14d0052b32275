//! Register-tiled SGEMM variants, generated WGSL: the candidates `bench_gpu --sgemm-sweep` times on a
//! real GPU, behind the interface of `sgemm.wgsl` (the same [`Dims`](crate::Dims) uniform, the same four
//! bindings, row-major operands, C (+)= op(A)·op(B)).
//!
//! A [`GemmVariant`] fixes at pipeline creation what `sgemm.wgsl` decides per element at run time:
//! - the tile: a workgroup computes `bm×bn` of C with `(bn/tn)×(bm/tm)` invocations, each a `tm×tn`
//!   block held in registers (`tm·tn/4` vec4 accumulators, named, never an indexed array), stepping k by
//!   `tk` with both tiles staged k-major in workgroup memory (A's tile transposed while staging), so the
//!   inner loop reads `tm/4 + tn/4` vec4s for `tm·tn` FMAs;
//! - the transposes: each operand is staged along its contiguous dimension in memory, so global loads
//!   stay coalesced whichever way it is stored; a tile row of workgroup memory is padded by one vec4
//!   where the staging stores stride through it;
//! - `fast`: the tile-multiple path (m % bm = n % bn = k % tk = 0): no bounds checks in the kernel and
//!   vec4 global loads and stores (every leading dimension is then a multiple of 4); the general path
//!   checks every load and store and handles any shape;
//! - `unchecked` (fast only): the module is created without Naga's injected bounds checks, sound because
//!   every index of the fast path is in range for operands of the dispatched dimensions (see
//!   [`Gpu::gemm_kernel`]).
//!
//! An invocation's block is interleaved (its vec4 groups of rows and columns are `bm/tm`·4 and
//! `bn/tn`·4 apart), so the invocations of a row read consecutive vec4s of workgroup memory and store
//! consecutive vec4s of C. Every C element is still `fma(a, b, acc)` over k in order from 0, then stored
//! (or added to C's old value): bit-for-bit the rounding of `sgemm.wgsl`.
use std::fmt::Write;

use crate::{Gpu, GpuError};

/// One generated SGEMM kernel's shape; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmVariant {
    /// Rows of C per workgroup.
    pub bm: u32,
    /// Columns of C per workgroup.
    pub bn: u32,
    /// Rows of C per invocation (4 or 8).
    pub tm: u32,
    /// Columns of C per invocation (4 or 8).
    pub tn: u32,
    /// Depth of one k step (a multiple of 4).
    pub tk: u32,
    /// A is stored k×m.
    pub trans_a: bool,
    /// B is stored n×k.
    pub trans_b: bool,
    /// The tile-multiple path: no bounds checks, vec4 global accesses.
    pub fast: bool,
    /// Without Naga's runtime bounds checks (fast only).
    pub unchecked: bool,
}

const XYZW: [&str; 4] = ["x", "y", "z", "w"];

impl GemmVariant {
    /// A general (bounds-checked) variant for untransposed operands.
    pub const fn general(bm: u32, bn: u32, tm: u32, tn: u32, tk: u32) -> GemmVariant {
        GemmVariant {
            bm,
            bn,
            tm,
            tn,
            tk,
            trans_a: false,
            trans_b: false,
            fast: false,
            unchecked: false,
        }
    }

    /// The tile-multiple variant of the same shape.
    pub const fn fast(bm: u32, bn: u32, tm: u32, tn: u32, tk: u32) -> GemmVariant {
        let mut v = GemmVariant::general(bm, bn, tm, tn, tk);
        v.fast = true;
        v
    }

    /// This variant without Naga's bounds checks.
    pub const fn unchecked(mut self) -> GemmVariant {
        self.unchecked = true;
        self
    }

    /// This variant for other operand layouts.
    pub const fn with_trans(mut self, trans_a: bool, trans_b: bool) -> GemmVariant {
        self.trans_a = trans_a;
        self.trans_b = trans_b;
        self
    }

    /// The candidates of `bench_gpu --sgemm-sweep` (untransposed; ≤ 24 with the legacy kernel).
    pub fn sweep() -> Vec<GemmVariant> {
        let g = GemmVariant::general;
        let f = GemmVariant::fast;
        vec![
            g(64, 64, 4, 4, 16),
            g(128, 128, 8, 8, 16),
            g(128, 64, 8, 4, 16),
            g(64, 128, 8, 8, 16),
            f(64, 64, 4, 4, 16),
            f(64, 64, 4, 4, 32),
            f(64, 64, 8, 8, 16),
            f(128, 128, 8, 8, 16),
            f(128, 64, 8, 8, 16),
            f(64, 128, 8, 8, 16),
            f(128, 64, 8, 4, 16),
            f(64, 128, 4, 8, 16),
            f(64, 64, 4, 4, 16).unchecked(),
            f(64, 64, 8, 8, 16).unchecked(),
            f(128, 128, 8, 8, 8).unchecked(),
            f(128, 128, 8, 8, 16).unchecked(),
            f(128, 64, 8, 8, 16).unchecked(),
            f(64, 128, 8, 8, 16).unchecked(),
            f(128, 64, 8, 4, 16).unchecked(),
            f(128, 64, 8, 4, 32).unchecked(),
            f(64, 128, 4, 8, 16).unchecked(),
            f(64, 64, 4, 4, 32).unchecked(),
        ]
    }

    /// The kernels every GEMM tries first ([`Gpu::gemm_default`](crate::Gpu)), in order, for operands
    /// in these layouts: the fastest of the H100 sweep for the layout (`bench_gpu --sgemm-sweep`,
    /// tests/bench/README.md: 25.8–29.4 TFLOPS at 1024³ against 13.4 for `sgemm.wgsl`), then the
    /// 64×64 tile, which fits more shapes (m, n multiples of 64, k of 16). Fast and unchecked both; a
    /// shape neither fits runs `sgemm.wgsl`.
    pub const fn defaults(trans_a: bool, trans_b: bool) -> [GemmVariant; 2] {
        let best = match (trans_a, trans_b) {
            (true, false) => GemmVariant::fast(64, 64, 4, 4, 32),
            _ => GemmVariant::fast(128, 64, 8, 4, 16),
        };
        [
            best.unchecked().with_trans(trans_a, trans_b),
            GemmVariant::fast(64, 64, 4, 4, 16)
                .unchecked()
                .with_trans(trans_a, trans_b),
        ]
    }

    /// A short name: `f128x64-8x8-k16-nt-u` (f fast / g general, tile, block, depth, layouts of A and
    /// B, u without Naga's checks).
    pub fn name(&self) -> String {
        format!(
            "{}{}x{}-{}x{}-k{}-{}{}{}",
            if self.fast { 'f' } else { 'g' },
            self.bm,
            self.bn,
            self.tm,
            self.tn,
            self.tk,
            if self.trans_a { 't' } else { 'n' },
            if self.trans_b { 't' } else { 'n' },
            if self.unchecked { "-u" } else { "" }
        )
    }

    /// Invocations per workgroup.
    pub fn invocations(&self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }

    /// Row strides (in vec4s) of the staged A and B tiles: padded by one vec4 where staging walks k
    /// along the operand's contiguous dimension and so stores k-major rows one element at a time.
    fn strides(&self) -> (u32, u32) {
        (
            self.bm / 4 + u32::from(!self.trans_a),
            self.bn / 4 + u32::from(self.trans_b),
        )
    }

    /// Bytes of workgroup memory.
    pub fn workgroup_bytes(&self) -> u32 {
        let (sa, sb) = self.strides();
        (sa + sb) * self.tk * 16
    }

    /// Why the shape is not one the generator makes, if it is not.
    pub fn invalid(&self) -> Option<&'static str> {
        let ok_block = |t: u32| t == 4 || t == 8;
        if !ok_block(self.tm) || !ok_block(self.tn) {
            return Some("tm and tn must be 4 or 8");
        }
        if !self.bm.is_multiple_of(4 * self.tm) || !self.bn.is_multiple_of(4 * self.tn) {
            return Some("bm and bn must be multiples of 4·tm and 4·tn");
        }
        if self.tk == 0 || !self.tk.is_multiple_of(4) {
            return Some("tk must be a positive multiple of 4");
        }
        if self.unchecked && !self.fast {
            return Some("only the fast path may drop Naga's bounds checks");
        }
        if !(32..=1024).contains(&self.invocations()) {
            return Some("between 32 and 1024 invocations per workgroup");
        }
        None
    }

    /// Whether this kernel computes C (m×n) (+)= op(A)·op(B) for these layouts.
    pub fn fits(&self, m: u32, n: u32, k: u32, trans_a: bool, trans_b: bool) -> bool {
        trans_a == self.trans_a
            && trans_b == self.trans_b
            && (!self.fast
                || (m.is_multiple_of(self.bm)
                    && n.is_multiple_of(self.bn)
                    && k.is_multiple_of(self.tk)
                    && m != 0
                    && n != 0
                    && k != 0))
    }

    /// Workgroups of a dispatch for C m×n: (x over columns, y over rows).
    pub fn groups(&self, m: u32, n: u32) -> (u32, u32) {
        (n.div_ceil(self.bn), m.div_ceil(self.bm))
    }

    /// The WGSL source.
    pub fn source(&self) -> String {
        let v = self;
        let (wx, wy) = (v.bn / v.tn, v.bm / v.tm);
        let t_all = wx * wy;
        let (sa, sb) = v.strides();
        let (gm, gn) = (v.tm / 4, v.tn / 4);
        let elem = if v.fast { "vec4<f32>" } else { "f32" };
        let mut s = String::new();
        let w = &mut s;
        let _ = writeln!(w, "// generated by frugal-wgpu's gemm.rs: {}", v.name());
        w.push_str(
            "struct Dims { m: u32, n: u32, k: u32, accumulate: u32, trans_a: u32, trans_b: u32, \
             _pad0: u32, _pad1: u32 }\n@group(0) @binding(0) var<uniform> dims: Dims;\n",
        );
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            let _ = writeln!(
                w,
                "@group(0) @binding({}) var<storage, read_write> {name}: array<{elem}>;",
                i + 1
            );
        }
        let _ = writeln!(
            w,
            "var<workgroup> ta: array<vec4<f32>, {}>;\nvar<workgroup> tb: array<vec4<f32>, {}>;",
            sa * v.tk,
            sb * v.tk
        );
        let _ = writeln!(
            w,
            "@compute @workgroup_size({wx}, {wy}, 1)\nfn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{"
        );
        let _ = writeln!(
            w,
            "  let tx = lid.x;\n  let ty = lid.y;\n  let t = ty * {wx}u + tx;\n  let row0 = wid.y * {}u;\n  let col0 = wid.x * {}u;",
            v.bm, v.bn
        );
        for i in 0..v.tm {
            for j in 0..gn {
                let _ = writeln!(w, "  var c{i}_{j} = vec4<f32>(0.0);");
            }
        }
        w.push_str("  for (var k0 = 0u; k0 < dims.k; k0 += ");
        let _ = writeln!(w, "{}u) {{", v.tk);
        // Staging: A's tile is (r in bm) × (kk in tk), B's (kk in tk) × (c in bn); each is walked along
        // its contiguous dimension in memory (`inner`).
        // (tile, operand, mn extent, stride, mn origin, mn limit, inner is k, global index of (mn, kk))
        let a_idx = if v.trans_a {
            "(k0 + kk) * dims.m + row0 + mn"
        } else {
            "(row0 + mn) * dims.k + k0 + kk"
        };
        let b_idx = if v.trans_b {
            "(col0 + mn) * dims.k + k0 + kk"
        } else {
            "(k0 + kk) * dims.n + col0 + mn"
        };
        for (tile, op, ext, stride, lim, inner_k, idx) in [
            ("ta", "a", v.bm, sa, "dims.m - row0", !v.trans_a, a_idx),
            ("tb", "b", v.bn, sb, "dims.n - col0", v.trans_b, b_idx),
        ] {
            let inner = if inner_k { v.tk } else { ext };
            let per = if v.fast { 4 } else { 1 };
            let count = ext * v.tk / per;
            let inner_n = inner / per;
            let iters = count.div_ceil(t_all);
            let _ = writeln!(w, "    for (var i = 0u; i < {iters}u; i++) {{");
            let _ = writeln!(w, "      let e = t + i * {t_all}u;");
            if !count.is_multiple_of(t_all) {
                let _ = writeln!(w, "      if (e >= {count}u) {{ break; }}");
            }
            let (mn, kk) = if inner_k {
                (
                    format!("e / {inner_n}u"),
                    format!("(e % {inner_n}u) * {per}u"),
                )
            } else {
                (
                    format!("(e % {inner_n}u) * {per}u"),
                    format!("e / {inner_n}u"),
                )
            };
            let _ = writeln!(w, "      let mn = {mn};\n      let kk = {kk};");
            if v.fast {
                let _ = writeln!(w, "      let v = {op}[({idx}) / 4u];");
                if inner_k {
                    for (q, comp) in XYZW.iter().enumerate() {
                        let _ = writeln!(
                            w,
                            "      {tile}[(kk + {q}u) * {stride}u + mn / 4u][mn % 4u] = v.{comp};"
                        );
                    }
                } else {
                    let _ = writeln!(w, "      {tile}[kk * {stride}u + mn / 4u] = v;");
                }
            } else {
                let _ = writeln!(
                    w,
                    "      var v = 0.0;\n      if (mn < {lim} && k0 + kk < dims.k) {{ v = {op}[{idx}]; }}\n      {tile}[kk * {stride}u + mn / 4u][mn % 4u] = v;"
                );
            }
            w.push_str("    }\n");
        }
        w.push_str("    workgroupBarrier();\n");
        let _ = writeln!(w, "    for (var kk = 0u; kk < {}u; kk++) {{", v.tk);
        for i in 0..gm {
            let _ = writeln!(w, "      let a{i} = ta[kk * {sa}u + {}u + ty];", i * wy);
        }
        for j in 0..gn {
            let _ = writeln!(w, "      let b{j} = tb[kk * {sb}u + {}u + tx];", j * wx);
        }
        for i in 0..v.tm {
            let (g, q) = (i / 4, XYZW[(i % 4) as usize]);
            for j in 0..gn {
                let _ = writeln!(
                    w,
                    "      c{i}_{j} = fma(vec4<f32>(a{g}.{q}), b{j}, c{i}_{j});"
                );
            }
        }
        w.push_str("    }\n    workgroupBarrier();\n  }\n");
        // Stores: row r of the block is row (r/4·wy + ty)·4 + r%4 of the tile, column group j is
        // columns (j·wx + tx)·4 .. + 3.
        for i in 0..v.tm {
            let _ = writeln!(
                w,
                "  let r{i} = row0 + ({}u + ty) * 4u + {}u;",
                (i / 4) * wy,
                i % 4
            );
            for j in 0..gn {
                let col = format!("col0 + ({}u + tx) * 4u", j * wx);
                if v.fast {
                    let _ = writeln!(
                        w,
                        "  {{ let at = (r{i} * dims.n + {col}) / 4u; if (dims.accumulate != 0u) {{ c[at] = c[at] + c{i}_{j}; }} else {{ c[at] = c{i}_{j}; }} }}"
                    );
                } else {
                    let _ = writeln!(w, "  store4(r{i}, {col}, c{i}_{j});");
                }
            }
        }
        w.push_str("}\n");
        if !v.fast {
            w.push_str(
                "fn store4(r: u32, col: u32, v: vec4<f32>) {
  if (r >= dims.m) { return; }
  for (var q = 0u; q < 4u; q++) {
    if (col + q < dims.n) {
      let at = r * dims.n + col + q;
      if (dims.accumulate != 0u) { c[at] = c[at] + v[q]; } else { c[at] = v[q]; }
    }
  }
}
",
            );
        }
        s
    }
}

/// A compiled [`GemmVariant`].
#[derive(Clone, Debug)]
pub struct GemmKernel {
    pub(crate) variant: GemmVariant,
    pub(crate) pipeline: wgpu::ComputePipeline,
}

impl GemmKernel {
    /// The variant compiled.
    pub fn variant(&self) -> GemmVariant {
        self.variant
    }
}

impl Gpu {
    /// Compiles `v` into a pipeline on this device's GEMM bind-group layout; `Err` when the shape is
    /// invalid, beyond the device's limits, or refused by the driver's compiler.
    pub fn gemm_kernel(&self, v: GemmVariant) -> Result<GemmKernel, GpuError> {
        if let Some(why) = v.invalid() {
            return Err(GpuError::Shape(format!("{}: {why}", v.name())));
        }
        let limits = self.device.limits();
        if v.workgroup_bytes() > limits.max_compute_workgroup_storage_size
            || v.invocations() > limits.max_compute_invocations_per_workgroup
            || v.bn / v.tn > limits.max_compute_workgroup_size_x
            || v.bm / v.tm > limits.max_compute_workgroup_size_y
        {
            return Err(GpuError::Shape(format!(
                "{}: {} B of workgroup memory and {} invocations exceed the device's limits ({} B, {})",
                v.name(),
                v.workgroup_bytes(),
                v.invocations(),
                limits.max_compute_workgroup_storage_size,
                limits.max_compute_invocations_per_workgroup
            )));
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some("sgemm variant"),
            source: wgpu::ShaderSource::Wgsl(v.source().into()),
        };
        let module = if v.unchecked {
            // SAFETY: an unchecked variant is a fast one, which is dispatched only for operands it fits
            // (`GemmVariant::fits`: m, n, k multiples of the tile, checked by every caller before a
            // dispatch) on bindings of at least m·k, k·n and m·n f32 (exact for `GemmBuffers`; checked
            // against the bound sizes by `Gpu::gemm_default` for the GPU backend's bindings).
            // Then every index is in range: the staging reads rows row0 + mn < m (row0 + bm ≤ m) at
            // depths k0 + kk < k (k0 + tk ≤ k), or the transposed equivalents, B likewise, and the
            // stores write rows < m and columns < n; vec4 indices divide element indices that are
            // multiples of 4 (every leading dimension is a multiple of 4). Workgroup memory is indexed
            // below tk·stride by construction.
            unsafe {
                self.device
                    .create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
            }
        } else {
            self.device.create_shader_module(desc)
        };
        let layout = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("sgemm variant"),
                bind_group_layouts: &[Some(&self.layout)],
                immediate_size: 0,
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("sgemm variant"),
                layout: Some(&layout),
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        // Natively a refused module is an error here; the browser reports it on its console.
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(e) = crate::block_on(scope.pop()) {
            return Err(GpuError::Device(format!("{}: {e}", v.name())));
        }
        #[cfg(target_arch = "wasm32")]
        drop(scope);
        Ok(GemmKernel {
            variant: v,
            pipeline,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sweep_variant_is_valid_and_named_once() {
        let mut names = std::collections::HashSet::new();
        for v in GemmVariant::sweep() {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let v = v.with_trans(ta, tb);
                assert_eq!(v.invalid(), None, "{}", v.name());
                assert!(names.insert(v.name()));
            }
        }
        // With the legacy kernel: at most 24 candidates, for a sweep under a minute.
        assert!(GemmVariant::sweep().len() < 24);
    }

    #[test]
    fn fits_only_tile_multiples_on_the_fast_path() {
        let f = GemmVariant::fast(128, 64, 8, 8, 16);
        assert!(f.fits(256, 128, 32, false, false));
        assert!(!f.fits(256, 128, 33, false, false));
        assert!(!f.fits(256, 130, 32, false, false));
        assert!(!f.fits(0, 128, 32, false, false));
        assert!(!f.fits(256, 128, 32, true, false));
        let g = GemmVariant::general(128, 64, 8, 8, 16);
        assert!(g.fits(1, 1, 0, false, false));
        assert_eq!(g.groups(129, 64), (1, 2));
        assert!(GemmVariant::general(64, 64, 4, 4, 16)
            .unchecked()
            .invalid()
            .is_some());
    }
}
