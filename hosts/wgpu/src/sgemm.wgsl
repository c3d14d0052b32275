// C (m×n) (+)= op(A) · op(B), op(A) m×k and op(B) k×n, row-major f32 (op = transpose when `trans_a` /
// `trans_b`: A stored k×m, B stored n×k), tiled in workgroup memory: each workgroup of 16×16
// invocations computes a 64×64 tile of C, each invocation a 4×4 block, stepping k by 16 with the A and B
// tiles staged in workgroup memory (one load per element per tile instead of one per product).
// The 4×4 block is four vec4 accumulators and the tiles are vec4 arrays, so no private array is indexed
// (drivers that cannot unroll a loop keep such arrays in memory) and each step of k reads one vec4 of A
// (four rows) and one of B (four columns) for 16 FMAs. Every C element is still
// fma(a[r][k], b[k][c], acc) over k in order, as before.
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
// at[kk * 16 + g] = A[row0 + 4g .. 4g + 3][k0 + kk]; bt[kk * 16 + g] = B[k0 + kk][col0 + 4g .. 4g + 3].
var<workgroup> at: array<vec4<f32>, 256>;
var<workgroup> bt: array<vec4<f32>, 256>;

fn a_at(r: u32, k: u32) -> f32 {
    if (r >= dims.m || k >= dims.k) {
        return 0.0;
    }
    if (dims.trans_a != 0u) {
        return a[k * dims.m + r];
    }
    return a[r * dims.k + k];
}

fn b_at(k: u32, col: u32) -> f32 {
    if (k >= dims.k || col >= dims.n) {
        return 0.0;
    }
    if (dims.trans_b != 0u) {
        return b[col * dims.k + k];
    }
    return b[k * dims.n + col];
}

fn store(r: u32, col: u32, v: f32) {
    if (r < dims.m && col < dims.n) {
        let at_c = r * dims.n + col;
        if (dims.accumulate != 0u) {
            c[at_c] = c[at_c] + v;
        } else {
            c[at_c] = v;
        }
    }
}

fn store_row(r: u32, col: u32, v: vec4<f32>) {
    store(r, col, v.x);
    store(r, col + 1u, v.y);
    store(r, col + 2u, v.z);
    store(r, col + 3u, v.w);
}

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let row0 = wid.y * TS;
    let col0 = wid.x * TS;
    let t = lid.y * 16u + lid.x;
    // What this invocation stages per tile: A's rows 4g..4g+3 at depth kk, B's columns 4g..4g+3 at kk.
    let kk_t = t % TK;
    let g_t = t / TK;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < dims.k; k0 += TK) {
        let ra = row0 + g_t * 4u;
        at[kk_t * 16u + g_t] = vec4<f32>(
            a_at(ra, k0 + kk_t),
            a_at(ra + 1u, k0 + kk_t),
            a_at(ra + 2u, k0 + kk_t),
            a_at(ra + 3u, k0 + kk_t),
        );
        // B: invocation t stages row t / 16 of the tile, columns 4 (t % 16) .. + 3.
        let kb = k0 + t / 16u;
        let cb = col0 + (t % 16u) * 4u;
        bt[t] = vec4<f32>(b_at(kb, cb), b_at(kb, cb + 1u), b_at(kb, cb + 2u), b_at(kb, cb + 3u));
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            let av = at[kk * 16u + lid.y];
            let bv = bt[kk * 16u + lid.x];
            acc0 = fma(vec4<f32>(av.x), bv, acc0);
            acc1 = fma(vec4<f32>(av.y), bv, acc1);
            acc2 = fma(vec4<f32>(av.z), bv, acc2);
            acc3 = fma(vec4<f32>(av.w), bv, acc3);
        }
        workgroupBarrier();
    }
    let r = row0 + lid.y * 4u;
    let col = col0 + lid.x * 4u;
    store_row(r, col, acc0);
    store_row(r + 1u, col, acc1);
    store_row(r + 2u, col, acc2);
    store_row(r + 3u, col, acc3);
}
