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
