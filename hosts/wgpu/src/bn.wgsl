// BatchNorm in training mode, forward and backward, with the CPU's (`ops::bn`) formulas: batch mean and
// biased variance per channel (compensated sums), invstd = 1/√(var + eps), running statistics with the
// unbiased variance; the input gradient in PyTorch's formulation. Per-channel passes (one invocation
// per channel) fill a statistics buffer S of 8 rows of `c` values:
//   0 mean, 1 invstd, 2 gamma, 3 beta, 4 running mean, 5 running variance, 6 Σdy, 7 Σ(x−μ)·dy
// and per-element passes read it.
struct Params {
    n: u32,
    c: u32,
    hw: u32,
    accumulate: u32,
    momentum: f32,
    eps: f32,
    _pad0: f32,
    _pad1: f32,
}

// Bindings `p`, `a`, `b`, `c`, `d` and `index`: see `prelude.wgsl`.

// x = a; S = d.
@compute @workgroup_size(64)
fn stats(@builtin(global_invocation_id) gid: vec3<u32>) {
    let ch = index(gid);
    let count = p.n * p.hw;
    if (ch >= p.c || count == 0u) {
        return;
    }
    // Kahan sums, as the CPU's compensated ones.
    var s = 0.0;
    var comp = 0.0;
    for (var i = 0u; i < p.n; i++) {
        let o = (i * p.c + ch) * p.hw;
        for (var j = 0u; j < p.hw; j++) {
            let y = a[o + j] - comp;
            let t = s + y;
            comp = (t - s) - y;
            s = t;
        }
    }
    let cnt = f32(count);
    let mu = s / cnt;
    s = 0.0;
    comp = 0.0;
    for (var i = 0u; i < p.n; i++) {
        let o = (i * p.c + ch) * p.hw;
        for (var j = 0u; j < p.hw; j++) {
            let v = a[o + j] - mu;
            let y = v * v - comp;
            let t = s + y;
            comp = (t - s) - y;
            s = t;
        }
    }
    let variance = s / cnt;
    d[ch] = mu;
    d[p.c + ch] = 1.0 / sqrt(variance + p.eps);
    var unbiased = variance;
    if (count > 1u) {
        unbiased = s / f32(count - 1u);
    }
    d[4u * p.c + ch] = (1.0 - p.momentum) * d[4u * p.c + ch] + p.momentum * mu;
    d[5u * p.c + ch] = (1.0 - p.momentum) * d[5u * p.c + ch] + p.momentum * unbiased;
}

// x = a; S = d; y = c.
@compute @workgroup_size(64)
fn affine(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = index(gid);
    if (e >= p.n * p.c * p.hw) {
        return;
    }
    let ch = (e / p.hw) % p.c;
    c[e] = (a[e] - d[ch]) * (d[2u * p.c + ch] * d[p.c + ch]) + d[3u * p.c + ch];
}

// x = a; dy = b; S = d (rows 6 and 7 written).
@compute @workgroup_size(64)
fn sums(@builtin(global_invocation_id) gid: vec3<u32>) {
    let ch = index(gid);
    if (ch >= p.c) {
        return;
    }
    let mu = d[ch];
    var s1 = 0.0;
    var c1 = 0.0;
    var s2 = 0.0;
    var c2 = 0.0;
    for (var i = 0u; i < p.n; i++) {
        let o = (i * p.c + ch) * p.hw;
        for (var j = 0u; j < p.hw; j++) {
            let g = b[o + j];
            let y1 = g - c1;
            let t1 = s1 + y1;
            c1 = (t1 - s1) - y1;
            s1 = t1;
            let y2 = (a[o + j] - mu) * g - c2;
            let t2 = s2 + y2;
            c2 = (t2 - s2) - y2;
            s2 = t2;
        }
    }
    d[6u * p.c + ch] = s1;
    d[7u * p.c + ch] = s2;
}

// S = d; c = [dgamma | dbeta] (+)=.
@compute @workgroup_size(64)
fn dparams(@builtin(global_invocation_id) gid: vec3<u32>) {
    let ch = index(gid);
    if (ch >= p.c) {
        return;
    }
    let dg = d[7u * p.c + ch] * d[p.c + ch];
    let db = d[6u * p.c + ch];
    if (p.accumulate != 0u) {
        c[ch] = c[ch] + dg;
        c[p.c + ch] = c[p.c + ch] + db;
    } else {
        c[ch] = dg;
        c[p.c + ch] = db;
    }
}

// x = a; dy = b; S = d; dx = c (+)=.
@compute @workgroup_size(64)
fn dx(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = index(gid);
    if (e >= p.n * p.c * p.hw) {
        return;
    }
    let ch = (e / p.hw) % p.c;
    let cnt = f32(p.n * p.hw);
    let mu = d[ch];
    let is = d[p.c + ch];
    let k = d[7u * p.c + ch] * is * is / cnt;
    let gm = d[6u * p.c + ch] / cnt;
    let v = (b[e] - gm - (a[e] - mu) * k) * (is * d[2u * p.c + ch]);
    if (p.accumulate != 0u) {
        c[e] = c[e] + v;
    } else {
        c[e] = v;
    }
}

// Evaluation mode, from the running statistics: y = (x − running mean)·γ/√(running var + eps) + β.
// x = a; S = d; y = c.
@compute @workgroup_size(64)
fn eval_fwd(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = index(gid);
    if (e >= p.n * p.c * p.hw) {
        return;
    }
    let ch = (e / p.hw) % p.c;
    let k = d[2u * p.c + ch] / sqrt(d[5u * p.c + ch] + p.eps);
    c[e] = (a[e] - d[4u * p.c + ch]) * k + d[3u * p.c + ch];
}

// Its input gradient: dx (+)= dy·γ/√(running var + eps). dy = a; S = d; dx = c.
@compute @workgroup_size(64)
fn eval_dx(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = index(gid);
    if (e >= p.n * p.c * p.hw) {
        return;
    }
    let ch = (e / p.hw) % p.c;
    let k = d[2u * p.c + ch] / sqrt(d[5u * p.c + ch] + p.eps);
    if (p.accumulate != 0u) {
        c[e] = c[e] + k * a[e];
    } else {
        c[e] = k * a[e];
    }
}
