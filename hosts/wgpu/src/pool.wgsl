// Pooling, forward and backward, with the CPU's (`ops::pool`) order of operations so that max and
// average pooling match it bit for bit: windows scanned row by row, the first maximum kept (a NaN
// always taken), sums in the CPU's order. The backward passes gather — each input element sums the
// windows that cover it, in the order the CPU's scatter adds them — so no atomics are needed.
struct Params {
    planes: u32, // samples × channels
    h: u32,
    w: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    oh: u32,
    ow: u32,
    accumulate: u32,
    inv: f32, // 1/(window size), from the host: averages multiply by it as the CPU does
    zero: u32, // always 0, written by the host: see `rounded`
}

// `v` rounded to f32 where it stands. A product that feeds an addition may be fused into one FMA by the
// driver (NVIDIA's Vulkan compiler does; the CPU rounds the product first): OR-ing its bits with a
// uniform the compiler cannot prove zero makes the product a value of its own, so it is rounded before
// the addition, as on the CPU.
fn rounded(v: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(v) | p.zero);
}

// Bindings `p`, `a`, `b`, `c`, `d` and `index`: see `prelude.wgsl`.

// x = a; y = c; argmax (plane-local, as u32 bits) = d.
@compute @workgroup_size(64)
fn max_fwd(@builtin(global_invocation_id) gid: vec3<u32>) {
    let o = index(gid);
    let ohow = p.oh * p.ow;
    if (o >= p.planes * ohow) {
        return;
    }
    let plane = o / ohow;
    let oy = (o % ohow) / p.ow;
    let ox = o % p.ow;
    let base = plane * p.h * p.w;
    var best = 0.0;
    var arg = 0u;
    for (var i = 0u; i < p.kh; i++) {
        for (var j = 0u; j < p.kw; j++) {
            let at = (oy * p.sh + i) * p.w + ox * p.sw + j;
            let v = a[base + at];
            if ((i == 0u && j == 0u) || v > best || v != v) {
                best = v;
                arg = at;
            }
        }
    }
    c[o] = best;
    d[o] = bitcast<f32>(arg);
}

// The windows along one axis that cover input coordinate `v` (window size k, stride st, `o` windows):
// [first, end), those with ov·st ≤ v < ov·st + k.
fn covering(v: u32, k: u32, st: u32, o: u32) -> vec2<u32> {
    var lo = 0u;
    if (v + 1u > k) {
        lo = (v + 1u - k + st - 1u) / st;
    }
    let hi = min(v / st + 1u, o);
    return vec2<u32>(lo, max(lo, hi));
}

// The windows (oy, ox) that cover input (y, x), visited as `visit` below: oy ascending, then the column
// offset j ascending.
// dy = a, argmax bits = b, dx = c.
@compute @workgroup_size(64)
fn max_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = index(gid);
    let hw = p.h * p.w;
    if (e >= p.planes * hw) {
        return;
    }
    let plane = e / hw;
    let at = e % hw;
    let y = at / p.w;
    let x = at % p.w;
    var acc = 0.0;
    if (p.accumulate != 0u) {
        acc = c[e];
    }
    // The CPU adds in output order (oy, ox ascending): the same here, over the covering windows only.
    let ry = covering(y, p.kh, p.sh, p.oh);
    let rx = covering(x, p.kw, p.sw, p.ow);
    for (var oy = ry.x; oy < ry.y; oy++) {
        for (var ox = rx.x; ox < rx.y; ox++) {
            let o = plane * p.oh * p.ow + oy * p.ow + ox;
            if (bitcast<u32>(b[o]) == at) {
                acc = acc + a[o];
            }
        }
    }
    c[e] = acc;
}

// x = a; y = c.
@compute @workgroup_size(64)
fn avg_fwd(@builtin(global_invocation_id) gid: vec3<u32>) {
    let o = index(gid);
    let ohow = p.oh * p.ow;
    if (o >= p.planes * ohow) {
        return;
    }
    let plane = o / ohow;
    let oy = (o % ohow) / p.ow;
    let ox = o % p.ow;
    let base = plane * p.h * p.w;
    var s = 0.0;
    for (var i = 0u; i < p.kh; i++) {
        for (var j = 0u; j < p.kw; j++) {
            s = s + a[base + (oy * p.sh + i) * p.w + ox * p.sw + j];
        }
    }
    c[o] = s * p.inv;
}

// dy = a; dx = c. The CPU adds dy/cnt window row by window row (oy), then by window column j.
@compute @workgroup_size(64)
fn avg_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = index(gid);
    let hw = p.h * p.w;
    if (e >= p.planes * hw) {
        return;
    }
    let plane = e / hw;
    let y = (e % hw) / p.w;
    let x = e % p.w;
    var acc = 0.0;
    if (p.accumulate != 0u) {
        acc = c[e];
    }
    let ry = covering(y, p.kh, p.sh, p.oh);
    for (var oy = ry.x; oy < ry.y; oy++) {
        for (var j = 0u; j < p.kw; j++) {
            if (x < j || (x - j) % p.sw != 0u) {
                continue;
            }
            let ox = (x - j) / p.sw;
            if (ox < p.ow) {
                acc = acc + rounded(a[plane * p.oh * p.ow + oy * p.ow + ox] * p.inv);
            }
        }
    }
    c[e] = acc;
}

// Global average pooling over planes of h·w: x = a; y = c (one value per plane).
@compute @workgroup_size(64)
fn gap_fwd(@builtin(global_invocation_id) gid: vec3<u32>) {
    let plane = index(gid);
    if (plane >= p.planes) {
        return;
    }
    let hw = p.h * p.w;
    var s = 0.0;
    for (var i = 0u; i < hw; i++) {
        s = s + a[plane * hw + i];
    }
    c[plane] = s * p.inv;
}

// dy = a (one per plane); dx = c (+)= dy/(h·w).
@compute @workgroup_size(64)
fn gap_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = index(gid);
    let hw = p.h * p.w;
    if (e >= p.planes * hw) {
        return;
    }
    let v = rounded(a[e / hw] * p.inv);
    if (p.accumulate != 0u) {
        c[e] = c[e] + v;
    } else {
        c[e] = v;
    }
}
