// C (m×n) (+)= op(A) · op(B), op(A) m×k and op(B) k×n, row-major f32 (op = transpose when `trans_a` /
// `trans_b`: A stored k×m, B stored n×k), tiled in workgroup memory: each workgroup of 16×16
// invocations computes a 64×64 tile of C, each invocation a 4×4 block, stepping k by 16 with the A and B
// tiles staged in workgroup memory (one load per element per tile instead of one per product).
struct Dims {
    m: u32,
    n: u32,
    k: u32,
    accumulate: u32,
    trans_a: u32,
    trans_b: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> dims: Dims;
// A and B are read_write only so that the GPU backend may bind ranges of one buffer to all three (wgpu
// refuses one buffer bound both read-only and read-write in a dispatch); the kernel never writes them.
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;

const TS: u32 = 64u;
const TK: u32 = 16u;
var<workgroup> at: array<f32, 1024>; // TS × TK
var<workgroup> bt: array<f32, 1024>; // TK × TS

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let row0 = wid.y * TS;
    let col0 = wid.x * TS;
    let t = lid.y * 16u + lid.x;
    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i++) {
        acc[i] = 0.0;
    }
    for (var k0 = 0u; k0 < dims.k; k0 += TK) {
        for (var l = 0u; l < 4u; l++) {
            let idx = t + l * 256u;
            let ar = idx / TK;
            let ac = idx % TK;
            var v = 0.0;
            if (row0 + ar < dims.m && k0 + ac < dims.k) {
                if (dims.trans_a != 0u) {
                    v = a[(k0 + ac) * dims.m + row0 + ar];
                } else {
                    v = a[(row0 + ar) * dims.k + k0 + ac];
                }
            }
            at[idx] = v;
            let br = idx / TS;
            let bc = idx % TS;
            var w = 0.0;
            if (k0 + br < dims.k && col0 + bc < dims.n) {
                if (dims.trans_b != 0u) {
                    w = b[(col0 + bc) * dims.k + k0 + br];
                } else {
                    w = b[(k0 + br) * dims.n + col0 + bc];
                }
            }
            bt[idx] = w;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            var av: array<f32, 4>;
            var bv: array<f32, 4>;
            for (var i = 0u; i < 4u; i++) {
                av[i] = at[(lid.y * 4u + i) * TK + kk];
                bv[i] = bt[kk * TS + lid.x * 4u + i];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    acc[i * 4u + j] = fma(av[i], bv[j], acc[i * 4u + j]);
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + lid.y * 4u + i;
        for (var j = 0u; j < 4u; j++) {
            let col = col0 + lid.x * 4u + j;
            if (r < dims.m && col < dims.n) {
                let at_c = r * dims.n + col;
                if (dims.accumulate != 0u) {
                    c[at_c] = c[at_c] + acc[i * 4u + j];
                } else {
                    c[at_c] = acc[i * 4u + j];
                }
            }
        }
    }
}
