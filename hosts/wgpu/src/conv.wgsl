// Convolution's data movement around the GEMM: im2col (one sample, one channel group: the columns
// [cin_g·kh·kw × oh·ow] the product with the group's weights needs) and col2im (the input gradient's
// gather from the columns' gradient: each input element sums the column entries that read it, so no
// atomics). Zero padding and strides as `ops::ConvGeom` describes them.
struct Params {
    cin_g: u32,
    h: u32,
    w: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
    oh: u32,
    ow: u32,
    group: u32,
    accumulate: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

// Bindings `p`, `a`, `b`, `c`, `d` and `index`: see `prelude.wgsl`.

// x (one sample, every channel) = a; cols = c.
@compute @workgroup_size(64)
fn im2col(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = index(gid);
    let cols = p.oh * p.ow;
    let rows = p.cin_g * p.kh * p.kw;
    if (e >= rows * cols) {
        return;
    }
    let r = e / cols;
    let q = e % cols;
    let ci = r / (p.kh * p.kw);
    let ky = (r / p.kw) % p.kh;
    let kx = r % p.kw;
    let iy = i32((q / p.ow) * p.sh + ky) - i32(p.ph);
    let ix = i32((q % p.ow) * p.sw + kx) - i32(p.pw);
    var v = 0.0;
    if (iy >= 0 && iy < i32(p.h) && ix >= 0 && ix < i32(p.w)) {
        let ch = p.group * p.cin_g + ci;
        v = a[(ch * p.h + u32(iy)) * p.w + u32(ix)];
    }
    c[e] = v;
}

// dcols = a; dx (one sample, every channel; this group's channels written) = c.
@compute @workgroup_size(64)
fn col2im(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = index(gid);
    let hw = p.h * p.w;
    if (e >= p.cin_g * hw) {
        return;
    }
    let ci = e / hw;
    let y = (e % hw) / p.w;
    let x = e % p.w;
    let cols = p.oh * p.ow;
    var acc = 0.0;
    for (var ky = 0u; ky < p.kh; ky++) {
        let ty = i32(y + p.ph) - i32(ky);
        if (ty < 0 || u32(ty) % p.sh != 0u || u32(ty) / p.sh >= p.oh) {
            continue;
        }
        let oy = u32(ty) / p.sh;
        for (var kx = 0u; kx < p.kw; kx++) {
            let tx = i32(x + p.pw) - i32(kx);
            if (tx < 0 || u32(tx) % p.sw != 0u || u32(tx) / p.sw >= p.ow) {
                continue;
            }
            let ox = u32(tx) / p.sw;
            acc = acc + a[((ci * p.kh + ky) * p.kw + kx) * cols + oy * p.ow + ox];
        }
    }
    let at = (p.group * p.cin_g + ci) * hw + y * p.w + x;
    if (p.accumulate != 0u) {
        c[at] = c[at] + acc;
    } else {
        c[at] = acc;
    }
}

// Direct convolution for the GPU step (whole micro-batch, every group, no column buffer): one invocation
// per output element (forward, bias gradient), input element (input gradient) or weight (weight
// gradient), each summing in the order of the CPU's im2col·GEMM (channel, kernel row, kernel column; then
// samples and positions for the weight gradient). Layouts of `ops::conv`: x [n, groups·cin_g, h, w],
// w [cout, cin_g, kh, kw], y [n, cout, oh, ow]. Here p.group = 1 when there is a bias, and the padding
// words hold cout_g, groups and n.

fn in_at(s: u32, ci: u32, iy: i32, ix: i32) -> u32 {
    return ((s * p._pad1 * p.cin_g + ci) * p.h + u32(iy)) * p.w + u32(ix);
}

// y = a ⊛ w (= b) + bias (= d) into c.
@compute @workgroup_size(64)
fn direct_fwd(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    let cout = p._pad0 * p._pad1;
    if (i >= p._pad2 * cout * p.oh * p.ow) {
        return;
    }
    let ox = i % p.ow;
    let oy = (i / p.ow) % p.oh;
    let co = (i / (p.ow * p.oh)) % cout;
    let s = i / (p.ow * p.oh * cout);
    let g = co / p._pad0;
    var acc = 0.0;
    for (var ci = 0u; ci < p.cin_g; ci++) {
        for (var ky = 0u; ky < p.kh; ky++) {
            let iy = i32(oy * p.sh + ky) - i32(p.ph);
            if (iy < 0 || iy >= i32(p.h)) {
                continue;
            }
            for (var kx = 0u; kx < p.kw; kx++) {
                let ix = i32(ox * p.sw + kx) - i32(p.pw);
                if (ix < 0 || ix >= i32(p.w)) {
                    continue;
                }
                let wv = b[((co * p.cin_g + ci) * p.kh + ky) * p.kw + kx];
                acc = fma(a[in_at(s, g * p.cin_g + ci, iy, ix)], wv, acc);
            }
        }
    }
    if (p.group != 0u) {
        c[i] = d[co] + acc;
    } else {
        c[i] = acc;
    }
}

// dx (= c) (+)= the transposed convolution of dy (= a) with w (= b).
@compute @workgroup_size(64)
fn direct_dx(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    let cin = p.cin_g * p._pad1;
    if (i >= p._pad2 * cin * p.h * p.w) {
        return;
    }
    let ix = i % p.w;
    let iy = (i / p.w) % p.h;
    let ct = (i / (p.w * p.h)) % cin;
    let s = i / (p.w * p.h * cin);
    let g = ct / p.cin_g;
    let ci = ct % p.cin_g;
    let cout = p._pad0 * p._pad1;
    var acc = 0.0;
    for (var k = 0u; k < p._pad0; k++) {
        let co = g * p._pad0 + k;
        for (var ky = 0u; ky < p.kh; ky++) {
            let ty = i32(iy + p.ph) - i32(ky);
            if (ty < 0 || ty % i32(p.sh) != 0 || ty / i32(p.sh) >= i32(p.oh)) {
                continue;
            }
            let oy = u32(ty) / p.sh;
            for (var kx = 0u; kx < p.kw; kx++) {
                let tx = i32(ix + p.pw) - i32(kx);
                if (tx < 0 || tx % i32(p.sw) != 0 || tx / i32(p.sw) >= i32(p.ow)) {
                    continue;
                }
                let ox = u32(tx) / p.sw;
                let dyv = a[((s * cout + co) * p.oh + oy) * p.ow + ox];
                acc = fma(dyv, b[((co * p.cin_g + ci) * p.kh + ky) * p.kw + kx], acc);
            }
        }
    }
    if (p.accumulate != 0u) {
        c[i] = c[i] + acc;
    } else {
        c[i] = acc;
    }
}

// The weight and bias gradients are reductions over every sample and position (N·oh·ow terms, 100,352
// for LeNet-5's first convolution at batch 128): one workgroup of 256 per weight (per output channel for
// the bias), each invocation summing a strided share of the terms in order, then a tree over the
// workgroup in a fixed order, so the result is the same run to run. The dispatch has one workgroup per
// output (see `wg_index`).
const RED: u32 = 256u;
var<workgroup> red: array<f32, 256>;

// The workgroup's flat index in a dispatch of (x ≤ 65535, y) workgroups.
fn wg_index(wid: vec3<u32>) -> u32 {
    return wid.y * 65535u + wid.x;
}

// Sums `red` (every invocation's share stored) into red[0], in a fixed order.
fn tree(lid: u32) {
    workgroupBarrier();
    for (var k = RED / 2u; k > 0u; k = k / 2u) {
        if (lid < k) {
            red[lid] = red[lid] + red[lid + k];
        }
        workgroupBarrier();
    }
}

// Term r of a reduction over (sample, oy, ox) as (s, oy, ox); `next` the term RED further (adv =
// first(RED)), carried digit by digit: no division in the loop.
fn first(r: u32) -> vec3<u32> {
    let ohow = p.oh * p.ow;
    return vec3<u32>(r / ohow, (r % ohow) / p.ow, r % p.ow);
}

fn next(t: vec3<u32>, adv: vec3<u32>) -> vec3<u32> {
    var s = t.x + adv.x;
    var oy = t.y + adv.y;
    var ox = t.z + adv.z;
    if (ox >= p.ow) {
        ox -= p.ow;
        oy += 1u;
    }
    if (oy >= p.oh) {
        oy -= p.oh;
        s += 1u;
    }
    return vec3<u32>(s, oy, ox);
}

// dW (= c) (+)= Σ_samples,positions dy (= a) · x (= b) at the weight's tap; with a bias (p.group = 1) the
// workgroups after the weights' also sum db (= d) (+)= Σ dy per output channel, so that one dispatch
// computes both.
@compute @workgroup_size(256)
fn direct_dw(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = wg_index(wid);
    let cout = p._pad0 * p._pad1;
    let wlen = cout * p.cin_g * p.kh * p.kw;
    if (i >= wlen) {
        // Uniform per workgroup (i is the workgroup's), so the barriers of bias_sum are too.
        if (p.group == 0u || i >= wlen + cout) {
            return;
        }
        let v = bias_sum(i - wlen, lid);
        if (lid == 0u) {
            if (p.accumulate != 0u) {
                d[i - wlen] = d[i - wlen] + v;
            } else {
                d[i - wlen] = v;
            }
        }
        return;
    }
    let kx = i % p.kw;
    let ky = (i / p.kw) % p.kh;
    let ci = (i / (p.kw * p.kh)) % p.cin_g;
    let co = i / (p.kw * p.kh * p.cin_g);
    let g = co / p._pad0;
    let ohow = p.oh * p.ow;
    let terms = p._pad2 * ohow;
    var t = first(lid);
    let adv = first(RED);
    var acc = 0.0;
    for (var r = lid; r < terms; r += RED) {
        let iy = i32(t.y * p.sh + ky) - i32(p.ph);
        let ix = i32(t.z * p.sw + kx) - i32(p.pw);
        if (iy >= 0 && iy < i32(p.h) && ix >= 0 && ix < i32(p.w)) {
            let dyv = a[((t.x * cout + co) * p.oh + t.y) * p.ow + t.z];
            acc = fma(dyv, b[in_at(t.x, g * p.cin_g + ci, iy, ix)], acc);
        }
        t = next(t, adv);
    }
    red[lid] = acc;
    tree(lid);
    if (lid == 0u) {
        if (p.accumulate != 0u) {
            c[i] = c[i] + red[0];
        } else {
            c[i] = red[0];
        }
    }
}

// Σ_samples,positions dy (= a) for output channel co, by the workgroup (every invocation gets it).
fn bias_sum(co: u32, lid: u32) -> f32 {
    let cout = p._pad0 * p._pad1;
    let terms = p._pad2 * p.oh * p.ow;
    var t = first(lid);
    let adv = first(RED);
    var acc = 0.0;
    for (var r = lid; r < terms; r += RED) {
        acc += a[((t.x * cout + co) * p.oh + t.y) * p.ow + t.z];
        t = next(t, adv);
    }
    red[lid] = acc;
    tree(lid);
    return red[0];
}

// db (= c) (+)= Σ_samples,positions dy (= a), per output channel (one workgroup each): a bias trained
// without its weights (with them, `direct_dw` sums it).
@compute @workgroup_size(256)
fn direct_db(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let co = wg_index(wid);
    let cout = p._pad0 * p._pad1;
    if (co >= cout) {
        return;
    }
    let v = bias_sum(co, lid);
    if (lid == 0u) {
        if (p.accumulate != 0u) {
            c[co] = c[co] + v;
        } else {
            c[co] = v;
        }
    }
}
