/* frugal's DSP "skel": a command loop serving the host's requests over a framed pipe protocol
 * (proto.h) on stdin/stdout. Under qemu-hexagon it is a freestanding static Linux program (raw
 * syscalls); on a phone the same kernels sit behind FastRPC's generated skel instead (see
 * ../README.md). One request at a time; every frame is validated (magic, sizes, checksum) and a bad
 * one is answered with a status, never trusted. */
#include "kernels.h"
#include "proto.h"

#define SYS_READ 63
#define SYS_WRITE 64
#define SYS_EXIT 93
#define SYS_NANOSLEEP 101
#define SYS_MUNMAP 215
#define SYS_MMAP 222 /* mmap2 on 32-bit asm-generic targets; offset 0 here */
/* Markers for `cargo xtask bench dsp`'s counting plugin, which prints its packet count at them:
 * getpid at the start of every request, gettid right before and after the kernel. */
#define SYS_GETPID 172
#define SYS_GETTID 178

static long sys3(long nr, long a, long b, long c) {
    register long r0 __asm__("r0") = a;
    register long r1 __asm__("r1") = b;
    register long r2 __asm__("r2") = c;
    register long r6 __asm__("r6") = nr;
    __asm__ volatile("trap0(#1)" : "+r"(r0) : "r"(r1), "r"(r2), "r"(r6) : "memory");
    return r0;
}

static long sys6(long nr, long a, long b, long c, long d, long e, long f) {
    register long r0 __asm__("r0") = a;
    register long r1 __asm__("r1") = b;
    register long r2 __asm__("r2") = c;
    register long r3 __asm__("r3") = d;
    register long r4 __asm__("r4") = e;
    register long r5 __asm__("r5") = f;
    register long r6 __asm__("r6") = nr;
    __asm__ volatile("trap0(#1)" : "+r"(r0) : "r"(r1), "r"(r2), "r"(r3), "r"(r4), "r"(r5), "r"(r6) : "memory");
    return r0;
}

static void die(int code) {
    sys3(SYS_EXIT, code, 0, 0);
    for (;;) {}
}

/* Reads exactly n bytes; 0 on end of input before the first byte, exits on a short read. */
static int read_all(void *buf, uint32_t n) {
    uint8_t *p = buf;
    uint32_t got = 0;
    while (got < n) {
        long r = sys3(SYS_READ, 0, (long)(p + got), (long)(n - got));
        if (r <= 0) {
            if (got == 0 && r == 0) return 0;
            die(3);
        }
        got += (uint32_t)r;
    }
    return 1;
}

static void write_all(const void *buf, uint32_t n) {
    const uint8_t *p = buf;
    while (n) {
        long r = sys3(SYS_WRITE, 1, (long)p, (long)n);
        if (r <= 0) die(4);
        p += r;
        n -= (uint32_t)r;
    }
}

static uint32_t fnv(uint32_t h, const uint8_t *p, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
    return h;
}
#define FNV_INIT 2166136261u

/* The skel's working memory: request payloads and results (bss; a phone's skel maps the host's
 * ION/dma-buf buffers instead). */
#define ARENA_BYTES (96u << 20)
static uint8_t arena[ARENA_BYTES] __attribute__((aligned(128)));

static uint32_t params[FHX_MAX_PARAMS];
static uint32_t results[4];

/* The planned DSP space: one mapping per plan (FHX_OP_PREPARE), holding the tensors the plan keeps on
 * the DSP (weights, gradients, activations between DSP ops) across calls and steps. */
static uint8_t *space;
static uint64_t space_len;
static uint32_t space_gen, spaces_live;

static void respond(uint32_t status, uint32_t seq, uint32_t nres, const void *payload, uint32_t len) {
    uint32_t h[FHX_HEADER_WORDS];
    uint32_t sum = fnv(FNV_INIT, (const uint8_t *)results, nres * 4u);
    sum = fnv(sum, payload, len);
    h[0] = FHX_RSP; h[1] = status; h[2] = seq; h[3] = nres; h[4] = len; h[5] = sum;
    write_all(h, sizeof h);
    write_all(results, nres * 4u);
    write_all(payload, len);
}

static uint64_t align128(uint64_t x) { return (x + 127u) & ~(uint64_t)127u; }

/* The last element a strided rows x cols view addresses, +1 (0 when empty). */
static uint64_t extent(uint64_t rows, uint64_t cols, uint64_t rs, uint64_t cs) {
    if (rows == 0 || cols == 0) return 0;
    return (rows - 1) * rs + (cols - 1) * cs + 1;
}

/* Serves one validated request; returns the status, sets out, out_len and nres. */
static uint32_t serve(uint32_t op, uint32_t np, uint32_t len, const uint8_t **out, uint32_t *out_len,
                      uint32_t *nres) {
    const uint64_t cap = ARENA_BYTES, base = align128(len);
    *out = arena;
    *out_len = 0;
    *nres = 0;
    switch (op) {
    case FHX_OP_PING:
        results[0] = FHX_VERSION;
        *nres = 1;
        return FHX_OK;
    case FHX_OP_EXIT:
        return FHX_OK;
    case FHX_OP_GEMM: {
        if (np != 10) return FHX_BAD_PARAMS;
        uint32_t m = params[0], n = params[1], k = params[2], acc = params[7];
        uint64_t a_len = params[8], b_len = params[9], c_len = (uint64_t)m * n * 4u;
        if (k > 131071u || acc > 1) return FHX_BAD_PARAMS; /* MAX_K: i32::MAX / (128*128) */
        if (a_len < extent(m, k, params[3], params[4]) || b_len < extent(k, n, params[5], params[6]))
            return FHX_BAD_PARAMS;
        if ((uint64_t)len != a_len + b_len + (acc ? c_len : 0)) return FHX_BAD_PARAMS;
        uint32_t kc = fhx_gemm_kc();
        uint64_t apack = (uint64_t)m * (((k < kc ? k : kc) + 3u) & ~3u);
        if (base + align128(c_len) + apack > cap) return FHX_TOO_LARGE;
        int32_t *c = (int32_t *)(arena + base);
        if (acc) {
            const uint8_t *src = arena + a_len + b_len;
            uint8_t *dst = (uint8_t *)c;
            for (uint64_t i = 0; i < c_len; i++) dst[i] = src[i];
        }
        fhx_gemm(m, n, k, (const int8_t *)arena, params[3], params[4], (const int8_t *)arena + a_len,
                 params[5], params[6], c, (int)acc, (int8_t *)(arena + base + align128(c_len)));
        *out = (const uint8_t *)c;
        *out_len = (uint32_t)c_len;
        return FHX_OK;
    }
    case FHX_OP_RESCALE: {
        if (np != 7) return FHX_BAD_PARAMS;
        uint32_t n = params[0], shift = params[1], mode = params[2];
        if (shift > 31 || mode > 1 || (uint64_t)len != (uint64_t)n * 4u) return FHX_BAD_PARAMS;
        if (base + n > cap) return FHX_TOO_LARGE;
        uint64_t seed = params[3] | ((uint64_t)params[4] << 32), off = params[5] | ((uint64_t)params[6] << 32);
        results[0] = fhx_rescale((const int32_t *)arena, n, shift, mode, seed, off, (int8_t *)(arena + base));
        *nres = 1;
        *out = arena + base;
        *out_len = n;
        return FHX_OK;
    }
    case FHX_OP_MAX_ABS:
        if (np != 0 || len % 4u) return FHX_BAD_PARAMS;
        results[0] = fhx_max_abs((const int32_t *)arena, len / 4u);
        *nres = 1;
        return FHX_OK;
    case FHX_OP_MAXPOOL: {
        if (np != 2) return FHX_BAD_PARAMS;
        uint64_t w = params[0], pairs = params[1], outn = pairs * (w / 2);
        if (w % 2 || (uint64_t)len != pairs * 2u * w) return FHX_BAD_PARAMS;
        if (base + 2u * outn > cap) return FHX_TOO_LARGE;
        int8_t *y = (int8_t *)(arena + base);
        fhx_maxpool((const int8_t *)arena, (uint32_t)w, (uint32_t)pairs, y, (uint8_t *)y + outn);
        *out = (const uint8_t *)y;
        *out_len = (uint32_t)(2u * outn);
        return FHX_OK;
    }
    case FHX_OP_MAXPOOL_GRAD: {
        if (np != 2) return FHX_BAD_PARAMS;
        uint64_t w = params[0], pairs = params[1], outn = pairs * (w / 2), xn = pairs * 2u * w;
        if (w % 2 || (uint64_t)len != 2u * outn + xn) return FHX_BAD_PARAMS;
        const uint8_t *idx = arena + outn;
        for (uint64_t i = 0; i < outn; i++)
            if (idx[i] > 3) return FHX_BAD_PARAMS;
        int8_t *dx = (int8_t *)arena + 2u * outn;
        fhx_maxpool_grad((const int8_t *)arena, idx, (uint32_t)w, (uint32_t)pairs, dx);
        *out = (const uint8_t *)dx;
        *out_len = (uint32_t)xn;
        return FHX_OK;
    }
    case FHX_OP_QUANTIZE: {
        if (np != 2) return FHX_BAD_PARAMS;
        uint32_t n = params[0];
        if ((uint64_t)len != (uint64_t)n * 4u) return FHX_BAD_PARAMS;
        if (base + n > cap) return FHX_TOO_LARGE;
        union { uint32_t u; float f; } k = { params[1] };
        fhx_quantize((const float *)arena, n, k.f, (int8_t *)(arena + base));
        *out = arena + base;
        *out_len = n;
        return FHX_OK;
    }
    case FHX_OP_IM2COL: {
        if (np != 15) return FHX_BAD_PARAMS;
        struct fhx_conv g = { params[0], params[1], params[2], params[3], params[4], params[5], params[6],
                              params[7], params[8], params[9], params[10], params[11], params[12] };
        uint32_t samples = params[13], grp = params[14];
        if (g.groups == 0 || g.cin % g.groups || g.cout % g.groups || grp >= g.groups || g.sh == 0 ||
            g.sw == 0 || g.kh == 0 || g.kw == 0)
            return FHX_BAD_PARAMS;
        /* The output size must be the one the geometry gives (as ConvGeom::new computes it). */
        if ((uint64_t)g.h + 2u * g.ph < g.kh || (uint64_t)g.w + 2u * g.pw < g.kw) return FHX_BAD_PARAMS;
        if (g.oh != (g.h + 2u * g.ph - g.kh) / g.sh + 1u || g.ow != (g.w + 2u * g.pw - g.kw) / g.sw + 1u)
            return FHX_BAD_PARAMS;
        uint64_t per_in = (uint64_t)g.cin * g.h * g.w;
        if ((uint64_t)len != per_in * samples) return FHX_BAD_PARAMS;
        uint64_t kg = (uint64_t)(g.cin / g.groups) * g.kh * g.kw, outn = kg * samples * g.oh * g.ow;
        if (base + outn > cap) return FHX_TOO_LARGE;
        fhx_im2col(&g, (const int8_t *)arena, samples, grp, (int8_t *)(arena + base));
        *out = arena + base;
        *out_len = (uint32_t)outn;
        return FHX_OK;
    }
    default:
        return FHX_BAD_OP;
    }
}

/* One span of the space: rows x rowlen bytes, rows `stride` apart from `off`; 0 when out of bounds. */
static int span_ok(const uint32_t *sp) {
    uint64_t off = sp[0], rowlen = sp[1], rows = sp[2], stride = sp[3];
    if (rows == 0 || rowlen == 0) return 1;
    if (rows > 1 && stride < rowlen) return 0;
    return off + (rows - 1) * stride + rowlen <= space_len;
}

static uint64_t span_bytes(const uint32_t *sp) { return (uint64_t)sp[1] * sp[2]; }

/* Serves the space operations (PREPARE, WRITE, IN_SPACE, SPACE_SUM); other ops go to serve(). */
static uint32_t serve_space(uint32_t op, uint32_t np, uint32_t len, const uint8_t **out, uint32_t *out_len,
                            uint32_t *nres) {
    *out = arena;
    *out_len = 0;
    *nres = 0;
    switch (op) {
    case FHX_OP_PREPARE: {
        if (np != 1 || len) return FHX_BAD_PARAMS;
        uint64_t bytes = params[0];
        if (space) {
            sys3(SYS_MUNMAP, (long)space, (long)space_len, 0);
            space = 0;
            space_len = 0;
            spaces_live--;
        }
        if (bytes) {
            /* PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS: zeroed pages. */
            long p = sys6(SYS_MMAP, 0, (long)bytes, 3, 0x22, -1, 0);
            if (p < 0 && p > -4096) return FHX_TOO_LARGE;
            space = (uint8_t *)p;
            space_len = bytes;
            spaces_live++;
        }
        space_gen++;
        results[0] = space_gen;
        results[1] = (uint32_t)space_len;
        results[2] = spaces_live;
        *nres = 3;
        return FHX_OK;
    }
    case FHX_OP_WRITE: {
        if (np < 1 || np != 1 + 2 * params[0]) return FHX_BAD_PARAMS;
        uint64_t at = 0;
        for (uint32_t i = 0; i < params[0]; i++) {
            uint64_t off = params[1 + 2 * i], n = params[2 + 2 * i];
            if (off + n > space_len || at + n > len) return FHX_BAD_PARAMS;
            at += n;
        }
        if (at != len) return FHX_BAD_PARAMS;
        at = 0;
        for (uint32_t i = 0; i < params[0]; i++) {
            uint64_t off = params[1 + 2 * i], n = params[2 + 2 * i];
            for (uint64_t j = 0; j < n; j++) space[off + j] = arena[at + j];
            at += n;
        }
        return FHX_OK;
    }
    case FHX_OP_SPACE_SUM:
        if (np || len) return FHX_BAD_PARAMS;
        results[0] = fnv(FNV_INIT, space, (uint32_t)space_len);
        results[1] = (uint32_t)space_len;
        *nres = 2;
        return FHX_OK;
    case FHX_OP_IN_SPACE: {
        if (np < 3 || len) return FHX_BAD_PARAMS;
        uint32_t inner = params[0] & ~FHX_QUIET, quiet = params[0] & FHX_QUIET, nsrc = params[1], ndst = params[2];
        if (inner == FHX_OP_PING || inner == FHX_OP_EXIT || inner >= FHX_OP_PREPARE) return FHX_BAD_OP;
        uint64_t head = 3 + 4 * ((uint64_t)nsrc + ndst);
        if (head > np) return FHX_BAD_PARAMS;
        uint32_t spec[4 * FHX_MAX_PARAMS];
        for (uint32_t i = 0; i < 4 * (nsrc + ndst); i++) spec[i] = params[3 + i];
        uint64_t glen = 0, dlen = 0;
        for (uint32_t i = 0; i < nsrc + ndst; i++) {
            if (!span_ok(spec + 4 * i)) return FHX_BAD_PARAMS;
            if (i < nsrc) glen += span_bytes(spec + 4 * i); else dlen += span_bytes(spec + 4 * i);
        }
        if (glen > ARENA_BYTES) return FHX_TOO_LARGE;
        /* Gather the sources as the inner op's payload, then serve it as if sent inline. */
        uint64_t at = 0;
        for (uint32_t i = 0; i < nsrc; i++) {
            const uint32_t *sp = spec + 4 * i;
            for (uint64_t r = 0; r < sp[2]; r++) {
                const uint8_t *src = space + sp[0] + r * sp[3];
                for (uint64_t j = 0; j < sp[1]; j++) arena[at + j] = src[j];
                at += sp[1];
            }
        }
        uint32_t inp = np - (uint32_t)head;
        for (uint32_t i = 0; i < inp; i++) params[i] = params[head + i];
        uint32_t st = serve(inner, inp, (uint32_t)glen, out, out_len, nres);
        if (st != FHX_OK) return st;
        if (dlen != *out_len) return FHX_BAD_PARAMS;
        /* Scatter the output into the space (it is also returned: the host's bookkeeping reads it). */
        at = 0;
        for (uint32_t i = nsrc; i < nsrc + ndst; i++) {
            const uint32_t *sp = spec + 4 * i;
            for (uint64_t r = 0; r < sp[2]; r++) {
                uint8_t *dst = space + sp[0] + r * sp[3];
                for (uint64_t j = 0; j < sp[1]; j++) dst[j] = (*out)[at + j];
                at += sp[1];
            }
        }
        if (quiet) *out_len = 0;
        return FHX_OK;
    }
    case FHX_OP_HANG:
        for (;;) {
            long ts[2] = {3600, 0};
            sys3(SYS_NANOSLEEP, (long)ts, 0, 0);
        }
    default:
        return serve(op, np, len, out, out_len, nres);
    }
}

void _start(void) {
    uint32_t h[FHX_HEADER_WORDS];
    for (;;) {
        sys3(SYS_GETPID, 0, 0, 0);
        if (!read_all(h, sizeof h)) die(0);
        uint32_t op = h[1], seq = h[2], np = h[3], len = h[4];
        if (h[0] != FHX_REQ || np > FHX_MAX_PARAMS) {
            /* Out of step with the host: say so and stop (the host restarts the DSP). */
            respond(FHX_BAD_MAGIC, seq, 0, 0, 0);
            die(2);
        }
        if (len > ARENA_BYTES) {
            respond(FHX_TOO_LARGE, seq, 0, 0, 0);
            die(2);
        }
        read_all(params, np * 4u);
        read_all(arena, len);
        uint32_t sum = fnv(fnv(FNV_INIT, (const uint8_t *)params, np * 4u), arena, len);
        if (sum != h[5]) {
            respond(FHX_BAD_CHECKSUM, seq, 0, 0, 0);
            continue;
        }
        const uint8_t *out;
        uint32_t out_len, nres;
        sys3(SYS_GETTID, 0, 0, 0);
        uint32_t st = serve_space(op, np, len, &out, &out_len, &nres);
        sys3(SYS_GETTID, 0, 0, 0);
        if (st != FHX_OK) {
            respond(st, seq, 0, 0, 0);
            continue;
        }
        respond(FHX_OK, seq, nres, out, out_len);
        if (op == FHX_OP_EXIT) die(0);
    }
}
