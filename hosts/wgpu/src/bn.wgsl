// BatchNorm in training mode, forward and backward, with the CPU's (`ops::bn`) formulas: batch mean and
// biased variance per channel (compensated sums), invstd = 1/√(var + eps), running statistics with the
// unbiased variance; the input gradient in PyTorch's formulation. Per-channel passes (one workgroup
// per channel, see `stats`) fill a statistics buffer S of 8 rows of `c` values:
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

// The per-channel sums (N·hw terms each) run one workgroup of 256 per channel (see `wg_index`): each
// invocation a compensated (Kahan) sum of a strided share of the terms, in order, then a tree over the
// workgroup in a fixed order — the same result run to run.
const RED: u32 = 256u;
var<workgroup> red: array<f32, 256>;
var<workgroup> red2: array<f32, 256>;

// The workgroup's flat index in a dispatch of (x ≤ 65535, y) workgroups.
fn wg_index(wid: vec3<u32>) -> u32 {
    return wid.y * 65535u + wid.x;
}

// Sums `red` and `red2` (every invocation's share stored) into their first entries, in a fixed order.
fn tree(lid: u32) {
    workgroupBarrier();
    for (var k = RED / 2u; k > 0u; k = k / 2u) {
        if (lid < k) {
            red[lid] = red[lid] + red[lid + k];
            red2[lid] = red2[lid] + red2[lid + k];
        }
        workgroupBarrier();
    }
}

// Term r of channel ch's sum as (sample, position); `next` the term RED further (adv = term(RED)),
// carried: no division in the loop; `at` its offset.
fn term(r: u32) -> vec2<u32> {
    return vec2<u32>(r / p.hw, r % p.hw);
}

fn next(t: vec2<u32>, adv: vec2<u32>) -> vec2<u32> {
    var s = t.x + adv.x;
    var j = t.y + adv.y;
    if (j >= p.hw) {
        j -= p.hw;
        s += 1u;
    }
    return vec2<u32>(s, j);
}

fn at(t: vec2<u32>, ch: u32) -> u32 {
    return (t.x * p.c + ch) * p.hw + t.y;
}

// x = a; S = d.
@compute @workgroup_size(256)
fn stats(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let ch = wg_index(wid);
    let count = p.n * p.hw;
    if (ch >= p.c || count == 0u) {
        return;
    }
    // Kahan sums, as the CPU's compensated ones.
    let adv = term(RED);
    var s = 0.0;
    var comp = 0.0;
    var k = term(lid);
    for (var r = lid; r < count; r += RED) {
        let y = a[at(k, ch)] - comp;
        let t = s + y;
        comp = (t - s) - y;
        s = t;
        k = next(k, adv);
    }
    red[lid] = s;
    red2[lid] = 0.0;
    tree(lid);
    let cnt = f32(count);
    let mu = red[0] / cnt;
    workgroupBarrier();
    s = 0.0;
    comp = 0.0;
    k = term(lid);
    for (var r = lid; r < count; r += RED) {
        let v = a[at(k, ch)] - mu;
        let y = v * v - comp;
        let t = s + y;
        comp = (t - s) - y;
        s = t;
        k = next(k, adv);
    }
    red[lid] = s;
    tree(lid);
    if (lid != 0u) {
        return;
    }
    s = red[0];
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

// x = a; dy = b; S = d (rows 6 and 7 written). One workgroup per channel, as `stats`.
@compute @workgroup_size(256)
fn sums(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let ch = wg_index(wid);
    if (ch >= p.c) {
        return;
    }
    let mu = d[ch];
    let count = p.n * p.hw;
    var s1 = 0.0;
    var c1 = 0.0;
    var s2 = 0.0;
    var c2 = 0.0;
    let adv = term(RED);
    var k = term(lid);
    for (var r = lid; r < count; r += RED) {
        let o = at(k, ch);
        k = next(k, adv);
        let g = b[o];
        let y1 = g - c1;
        let t1 = s1 + y1;
        c1 = (t1 - s1) - y1;
        s1 = t1;
        let y2 = (a[o] - mu) * g - c2;
        let t2 = s2 + y2;
        c2 = (t2 - s2) - y2;
        s2 = t2;
    }
    red[lid] = s1;
    red2[lid] = s2;
    tree(lid);
    if (lid == 0u) {
        d[6u * p.c + ch] = red[0];
        d[7u * p.c + ch] = red2[0];
    }
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
