// What every element-wise, pooling, convolution and BatchNorm shader shares, prepended to each
// (`Pipelines::from_source`): the bindings — the shader's own `Params` block and five f32 operands —
// and the flat invocation index of a dispatch of (x ≤ 65535, y) workgroups of 64.
//
// Every operand is declared read_write although most kernels only read `a` and `b`: the GPU backend binds
// ranges of one buffer (the plan's GPU space) to several operands of one dispatch, and wgpu refuses a
// buffer used both read-only and read-write in one dispatch. Ranges of one dispatch are disjoint except
// where a kernel runs in place element by element (each invocation reads its element before writing it).
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;
@group(0) @binding(4) var<storage, read_write> d: array<f32>;
@group(0) @binding(5) var<storage, read_write> e: array<f32>;

fn index(gid: vec3<u32>) -> u32 {
    return gid.y * 65535u * 64u + gid.x;
}
