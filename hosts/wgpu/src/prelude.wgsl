// What every element-wise, pooling, convolution and BatchNorm shader shares, prepended to each
// (`Pipelines::from_source`): the bindings — the shader's own `Params` block, two read-only and two
// read-write f32 buffers — and the flat invocation index of a dispatch of (x ≤ 65535, y) workgroups of 64.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;
@group(0) @binding(4) var<storage, read_write> d: array<f32>;

fn index(gid: vec3<u32>) -> u32 {
    return gid.y * 65535u * 64u + gid.x;
}
