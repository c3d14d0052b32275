// Element-wise layers, the fused softmax cross-entropy and the optimizer updates, with the formulas of
// frugal-core's CPU ops (`ops::act`, `ops::loss`, `optim`). One invocation per element (per sample for
// the loss). Bindings: the parameters, two read-only operands, two read-write ones.
struct Params {
    n: u32,        // elements (samples for the loss)
    classes: u32,  // the loss's classes
    kind: u32,     // activation: 0 relu, 1 relu6, 2 sigmoid, 3 tanh; loss: samples with a valid label
    accumulate: u32,
    lr: f32,
    momentum: f32, // SGD momentum; Adam β1; dropout: the keep scale 1/(1 − p)
    wd: f32,
    beta2: f32,
    eps: f32,
    step_size: f32, // Adam: lr / (1 − β1^t)
    bc2_sqrt: f32,  // Adam: √(1 − β2^t)
    _pad: f32,
}

// Bindings `p`, `a`, `b`, `c`, `d` and `index`: see `prelude.wgsl`.

fn act(x: f32) -> f32 {
    switch p.kind {
        case 0u: { return select(x, 0.0, x < 0.0); }
        case 1u: { return select(select(x, 0.0, x < 0.0), 6.0, x > 6.0); }
        case 2u: { return 1.0 / (1.0 + exp(-x)); }
        default: { return tanh(x); }
    }
}

// The derivative from the output y, as the CPU computes it.
fn act_d(y: f32) -> f32 {
    switch p.kind {
        case 0u: { return select(0.0, 1.0, y > 0.0); }
        case 1u: { return select(0.0, 1.0, y > 0.0 && y < 6.0); }
        case 2u: { return y * (1.0 - y); }
        default: { return 1.0 - y * y; }
    }
}

// c = act(a)
@compute @workgroup_size(64)
fn act_fwd(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < p.n) {
        c[i] = act(a[i]);
    }
}

// c (+)= act'(y = a) · dy (= b)
@compute @workgroup_size(64)
fn act_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < p.n) {
        // ReLU and ReLU6 select rather than multiply, so an infinite dy on a dead unit gives 0.
        var g = act_d(a[i]) * b[i];
        if (p.kind <= 1u) {
            g = select(0.0, b[i], act_d(a[i]) > 0.0);
        }
        if (p.accumulate != 0u) {
            c[i] = c[i] + g;
        } else {
            c[i] = g;
        }
    }
}

// Per sample s: logits a[s·C ..], label bits b[s]; c = dlogits = (softmax − onehot) / valid, d[s] = the
// sample's loss (0 for an out-of-range label, whose gradient is 0), d[n + s] = 1 when its first argmax
// is the label.
@compute @workgroup_size(64)
fn softmax_ce(@builtin(global_invocation_id) gid: vec3<u32>) {
    let s = index(gid);
    if (s >= p.n) {
        return;
    }
    let k = p.classes;
    let base = s * k;
    let label = bitcast<u32>(b[s]);
    var mx = a[base];
    var arg = 0u;
    for (var j = 1u; j < k; j++) {
        if (a[base + j] > mx) {
            mx = a[base + j];
            arg = j;
        }
    }
    var sum = 0.0;
    for (var j = 0u; j < k; j++) {
        sum += exp(a[base + j] - mx);
    }
    if (label >= k) {
        for (var j = 0u; j < k; j++) {
            c[base + j] = 0.0;
        }
        d[s] = 0.0;
        d[p.n + s] = 0.0;
        return;
    }
    let inv = 1.0 / f32(max(p.kind, 1u));
    // Read before the gradient is written: the GPU backend may run this in place (dlogits = logits).
    let zl = a[base + label];
    for (var j = 0u; j < k; j++) {
        let sm = exp(a[base + j] - mx) / sum;
        c[base + j] = (sm - select(0.0, 1.0, j == label)) * inv;
    }
    d[s] = log(sum) - (zl - mx);
    d[p.n + s] = select(0.0, 1.0, arg == label);
}

// The step's guard word (`b[0]`, written by `guard`): non-zero when the step's loss is not finite, and
// the optimizer then leaves weights and state as they were (the CPU rejects such a step before any
// update; the GPU learns the loss only when the step's one submission has run).
fn rejected() -> bool {
    return bitcast<u32>(b[0]) != 0u;
}

// SGD with momentum and weight decay (PyTorch): w = c, g = a, momentum buffer = d, guard = b.
@compute @workgroup_size(64)
fn sgd(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < p.n && !rejected()) {
        var g = a[i];
        if (p.wd != 0.0) {
            g = g + p.wd * c[i];
        }
        if (p.momentum != 0.0) {
            d[i] = d[i] * p.momentum + g;
            g = d[i];
        }
        c[i] = c[i] + (-p.lr) * g;
    }
}

// Adam (PyTorch): w = c, g = a, the moments m = d, v = e, guard = b.
@compute @workgroup_size(64)
fn adam(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < p.n && !rejected()) {
        var g = a[i];
        if (p.wd != 0.0) {
            g = g + p.wd * c[i];
        }
        let w1 = 1.0 - p.momentum;
        let m = d[i];
        var m2 = 0.0;
        if (w1 < 0.5) {
            m2 = m + w1 * (g - m);
        } else {
            m2 = g - (g - m) * (1.0 - w1);
        }
        let v2 = e[i] * p.beta2 + (1.0 - p.beta2) * g * g;
        d[i] = m2;
        e[i] = v2;
        let denom = sqrt(v2) / p.bc2_sqrt + p.eps;
        c[i] = c[i] + ((-p.step_size) * m2) / denom;
    }
}

// Mean squared error over p.n elements: pred = a, target = b; dpred = c = (pred − target)·p.lr (the
// host's 2/elements of the batch); d[i] = (pred − target)², summed on the host.
@compute @workgroup_size(64)
fn mse(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < p.n) {
        let r = a[i] - b[i];
        c[i] = r * p.lr;
        d[i] = r * r;
    }
}

// Add (residual): c = a + b.
@compute @workgroup_size(64)
fn add(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < p.n) {
        c[i] = a[i] + b[i];
    }
}

// Dropout with the CPU's counter-based masks (`ops::dropout`, `rng::hash2`): element i is kept when the
// top 24 bits of splitmix64-style hash(seed, i) / 2^24 ≥ p. WGSL has no 64-bit integers: the hash runs on
// (low, high) pairs of u32 and equals the CPU's bit for bit. Seed = (p.classes, p.kind) as (low, high),
// p = p.lr.
fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn shr64(a: vec2<u32>, s: u32) -> vec2<u32> {
    // 0 < s < 32.
    return vec2<u32>((a.x >> s) | (a.y << (32u - s)), a.y >> s);
}

// The full 64-bit product of two u32.
fn mul32(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let p11 = a1 * b1;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return vec2<u32>((mid << 16u) | (p00 & 0xffffu), p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}

// The low 64 bits of a·b.
fn mul64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = mul32(a.x, b.x);
    return vec2<u32>(lo.x, lo.y + a.x * b.y + a.y * b.x);
}

fn mix64(z0: vec2<u32>) -> vec2<u32> {
    var z = mul64(z0 ^ shr64(z0, 30u), vec2<u32>(0x1CE4E5B9u, 0xBF58476Du));
    z = mul64(z ^ shr64(z, 27u), vec2<u32>(0x133111EBu, 0x94D049BBu));
    return z ^ shr64(z, 31u);
}

fn keep(i: u32) -> bool {
    let seed = vec2<u32>(p.classes, p.kind);
    let h = mix64(seed ^ mix64(add64(vec2<u32>(i, 0u), vec2<u32>(0x7F4A7C15u, 0x9E3779B9u))));
    return f32(h.y >> 8u) * (1.0 / 16777216.0) >= p.lr;
}

// Forward (x = a, y = c) and backward (dy = a, dx = c, (+)=): mask · value / (1 − p).
@compute @workgroup_size(64)
fn dropout(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < p.n) {
        let s = p.momentum; // 1/(1 − p), computed by the host as the CPU does (WGSL's division need not round correctly)
        var v = 0.0;
        if (keep(i)) {
            v = a[i] * s;
        }
        if (p.accumulate != 0u) {
            if (keep(i)) {
                c[i] = c[i] + v;
            }
        } else {
            c[i] = v;
        }
    }
}

// A linear layer's bias in every row: c[i] = a[i mod p.classes] (the product then accumulates onto it,
// as the CPU does).
@compute @workgroup_size(64)
fn bias_rows(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < p.n) {
        c[i] = a[i % p.classes];
    }
}

// Column sums of a (p.kind rows × p.n columns), in row order: c[j] (+)= Σ_r a[r·n + j] (a linear
// layer's bias gradient).
@compute @workgroup_size(64)
fn col_sum(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = index(gid);
    if (j < p.n) {
        var s = 0.0;
        for (var r = 0u; r < p.kind; r++) {
            s += a[r * p.n + j];
        }
        if (p.accumulate != 0u) {
            c[j] = c[j] + s;
        } else {
            c[j] = s;
        }
    }
}

// c (+)= a (a view's or a residual's derivative handed on).
@compute @workgroup_size(64)
fn copy(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < p.n) {
        if (p.accumulate != 0u) {
            c[i] = c[i] + a[i];
        } else {
            c[i] = a[i];
        }
    }
}

fn finite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u;
}

// The step's guard (one invocation): c[0] = 1 (as bits) when any of the step's loss values is not
// finite, else 0. The values are in a: p.kind slots of p.classes floats, the first p.n of each slot
// used (fewer in the last when the batch is partial: p.accumulate holds the values of the last slot).
@compute @workgroup_size(1)
fn guard(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x != 0u) {
        return;
    }
    var bad = 0u;
    for (var k = 0u; k < p.kind; k++) {
        var used = p.n;
        if (k + 1u == p.kind) {
            used = p.accumulate;
        }
        for (var i = 0u; i < used; i++) {
            if (!finite(a[k * p.classes + i])) {
                bad = 1u;
            }
        }
    }
    c[0] = bitcast<f32>(bad);
}

// frugal-core's `rng::hash2(seed, i)` on (low, high) u32 pairs.
fn hash2v(seed: vec2<u32>, i: u32) -> vec2<u32> {
    return mix64(seed ^ mix64(add64(vec2<u32>(i, 0u), vec2<u32>(0x7F4A7C15u, 0x9E3779B9u))));
}

// Dropout as the GPU step runs it: rows of `per` values, one sample each; sample s of the micro-batch has
// the CPU's mask seed hash2(layer seed, start + s) (its index in the whole batch, so micro-batching draws
// the whole batch's masks), element j is kept when hash2(that, j) >> 40 / 2^24 ≥ p. Layer seed =
// (p.classes, p.kind), p = p.lr, per = bits of p.beta2, start = bits of p.eps. Forward: x = a, y = c;
// backward: dy = a, dx = c, (+)= when p.accumulate.
@compute @workgroup_size(64)
fn dropout_rows(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < p.n) {
        let per = bitcast<u32>(p.beta2);
        let start = bitcast<u32>(p.eps);
        let sample = hash2v(vec2<u32>(p.classes, p.kind), start + i / per);
        let h = hash2v(sample, i % per);
        let kept = f32(h.y >> 8u) * (1.0 / 16777216.0) >= p.lr;
        let s = p.momentum; // 1/(1 − p), computed by the host as the CPU does (WGSL's division need not round correctly)
        var v = 0.0;
        if (kept) {
            v = a[i] * s;
        }
        if (p.accumulate != 0u) {
            if (kept) {
                c[i] = c[i] + v;
            }
        } else {
            c[i] = v;
        }
    }
}

// fp16 storage (the CPU's `Phase::Pack`): word w of c (u32 bits) = elements 2w, 2w+1 of a rounded to
// IEEE half, low half first (little-endian, as the CPU lays the half copy out), each saturated at ±65504
// first as the CPU does, so a large activation never becomes infinity. The last word of an odd count
// holds 0 in its high half (bytes nothing reads).
@compute @workgroup_size(64)
fn pack_half(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = index(gid);
    if (2u * w >= p.n) {
        return;
    }
    let lo = clamp(a[2u * w], -65504.0, 65504.0);
    var hi = 0.0;
    if (2u * w + 1u < p.n) {
        hi = clamp(a[2u * w + 1u], -65504.0, 65504.0);
    }
    c[w] = bitcast<f32>(pack2x16float(vec2<f32>(lo, hi)));
}

// `Phase::Unpack`: elements 2w, 2w+1 of c = the halves of word w of a, widened.
@compute @workgroup_size(64)
fn unpack_half(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = index(gid);
    if (2u * w >= p.n) {
        return;
    }
    let v = unpack2x16float(bitcast<u32>(a[w]));
    c[2u * w] = v.x;
    if (2u * w + 1u < p.n) {
        c[2u * w + 1u] = v.y;
    }
}
