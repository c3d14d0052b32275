/* HVX int8 kernels (128-byte vectors). See kernels.h; bit-exactness is against core/src/kernels/int8. */
#include "kernels.h"
#include <hexagon_types.h>
#include <hexagon_protos.h>
#include <hvx_hexagon_protos.h>

#define LANES 32u /* i32 lanes of one 128-byte vector */

/* The emulated VTCM: the GEMM's packed B panel (FHX_VTCM_BYTES). */
static int8_t vtcm[FHX_VTCM_BYTES] __attribute__((aligned(128)));

static void *fhx_memset(void *d, int v, size_t n) {
    uint8_t *p = d;
    if (v == 0 && ((uintptr_t)p & 3u) == 0) {
        for (; n >= 4; n -= 4, p += 4) *(uint32_t *)p = 0;
    }
    while (n--) *p++ = (uint8_t)v;
    return d;
}
static void *fhx_memcpy(void *d, const void *s, size_t n) {
    uint8_t *p = d;
    const uint8_t *q = s;
    if ((((uintptr_t)p | (uintptr_t)q) & 3u) == 0) {
        for (; n >= 4; n -= 4, p += 4, q += 4) *(uint32_t *)p = *(const uint32_t *)q;
    }
    while (n--) *p++ = *q++;
    return d;
}
/* clang may emit calls to these for struct copies and loops. */
void *memset(void *d, int v, size_t n) { return fhx_memset(d, v, n); }
void *memcpy(void *d, const void *s, size_t n) { return fhx_memcpy(d, s, n); }

uint32_t fhx_gemm_kc(void) { return (FHX_VTCM_BYTES / 128u) * 4u; }

void fhx_gemm(uint32_t m, uint32_t n, uint32_t k, const int8_t *a, uint32_t a_rs, uint32_t a_cs,
              const int8_t *b, uint32_t b_rs, uint32_t b_cs, int32_t *c, int accumulate,
              int8_t *apack) {
    static int32_t row[4][LANES] __attribute__((aligned(128)));
    if (m == 0 || n == 0) return;
    if (k == 0) {
        if (!accumulate) fhx_memset(c, 0, (size_t)m * n * 4u);
        return;
    }
    const uint32_t kc_max = fhx_gemm_kc();
    for (uint32_t k0 = 0; k0 < k; k0 += kc_max) {
        const uint32_t kc = (k - k0 < kc_max) ? k - k0 : kc_max;
        const uint32_t groups = (kc + 3u) / 4u, kp = groups * 4u;
        /* A's depth tile, rows k-contiguous and zero-padded to whole groups of 4. */
        for (uint32_t i = 0; i < m; i++) {
            int8_t *dst = apack + (size_t)i * kp;
            const int8_t *src = a + (size_t)i * a_rs + (size_t)k0 * a_cs;
            if (a_cs == 1) {
                fhx_memcpy(dst, src, kc);
            } else {
                for (uint32_t p = 0; p < kc; p++, src += a_cs) dst[p] = *src;
            }
            for (uint32_t p = kc; p < kp; p++) dst[p] = 0;
        }
        for (uint32_t j0 = 0; j0 < n; j0 += LANES) {
            const uint32_t nb = (n - j0 < LANES) ? n - j0 : LANES;
            /* B panel in VTCM: group g is one vector, lane j holds B[k0+4g .. k0+4g+3][j0+j]. */
            for (uint32_t g = 0; g < groups; g++) {
                int8_t *v = vtcm + (size_t)g * 128u;
                if (nb < LANES || 4u * g + 4u > kc) fhx_memset(v, 0, 128);
                for (uint32_t t = 0; t < 4; t++) {
                    uint32_t p = 4u * g + t;
                    if (p >= kc) break;
                    const int8_t *src = b + (size_t)(k0 + p) * b_rs + (size_t)j0 * b_cs;
                    int8_t *d = v + t;
                    if (b_cs == 1) {
                        for (uint32_t j = 0; j < nb; j++, d += 4) *d = src[j];
                    } else {
                        for (uint32_t j = 0; j < nb; j++, d += 4, src += b_cs) *d = *src;
                    }
                }
            }
            const HVX_Vector *bp = (const HVX_Vector *)vtcm;
            uint32_t i = 0;
            /* C starts at zero (first depth tile, not accumulating): no load. */
            const int fresh = !accumulate && k0 == 0;
            for (; i + 4 <= m; i += 4) {
                HVX_Vector acc0 = Q6_V_vzero(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
                if (!fresh) {
                    for (uint32_t r = 0; r < 4; r++) fhx_memcpy(row[r], c + (size_t)(i + r) * n + j0, nb * 4u);
                    acc0 = *(HVX_Vector *)row[0];
                    acc1 = *(HVX_Vector *)row[1];
                    acc2 = *(HVX_Vector *)row[2];
                    acc3 = *(HVX_Vector *)row[3];
                }
                const int8_t *a0 = apack + (size_t)i * kp;
                /* apack is 128-aligned and its rows are whole words long: word loads. */
                const int32_t *aw = (const int32_t *)a0;
                const uint32_t kw = kp / 4u;
                for (uint32_t g = 0; g < groups; g++) {
                    HVX_Vector bv = bp[g];
                    int32_t w0 = aw[g], w1 = aw[kw + g], w2 = aw[2u * kw + g], w3 = aw[3u * kw + g];
                    /* 32 lanes of 4 signed byte products summed into i32: exact. */
                    acc0 = Q6_Vw_vrmpyacc_VwVbVb(acc0, bv, Q6_V_vsplat_R(w0));
                    acc1 = Q6_Vw_vrmpyacc_VwVbVb(acc1, bv, Q6_V_vsplat_R(w1));
                    acc2 = Q6_Vw_vrmpyacc_VwVbVb(acc2, bv, Q6_V_vsplat_R(w2));
                    acc3 = Q6_Vw_vrmpyacc_VwVbVb(acc3, bv, Q6_V_vsplat_R(w3));
                }
                *(HVX_Vector *)row[0] = acc0;
                *(HVX_Vector *)row[1] = acc1;
                *(HVX_Vector *)row[2] = acc2;
                *(HVX_Vector *)row[3] = acc3;
                for (uint32_t r = 0; r < 4; r++) fhx_memcpy(c + (size_t)(i + r) * n + j0, row[r], nb * 4u);
            }
            for (; i < m; i++) {
                HVX_Vector acc = Q6_V_vzero();
                if (!fresh) {
                    fhx_memcpy(row[0], c + (size_t)i * n + j0, nb * 4u);
                    acc = *(HVX_Vector *)row[0];
                }
                const int32_t *aw = (const int32_t *)(apack + (size_t)i * kp);
                for (uint32_t g = 0; g < groups; g++)
                    acc = Q6_Vw_vrmpyacc_VwVbVb(acc, bp[g], Q6_V_vsplat_R(aw[g]));
                *(HVX_Vector *)row[0] = acc;
                fhx_memcpy(c + (size_t)i * n + j0, row[0], nb * 4u);
            }
        }
    }
}

uint32_t fhx_max_abs(const int32_t *x, uint32_t len) {
    static int32_t buf[LANES] __attribute__((aligned(128)));
    HVX_Vector mx = Q6_V_vzero(), mn = Q6_V_vzero();
    uint32_t i = 0;
    for (; i + LANES <= len; i += LANES) {
        fhx_memcpy(buf, x + i, sizeof buf);
        HVX_Vector v = *(HVX_Vector *)buf;
        /* |INT32_MIN| wraps to INT32_MIN: the minimum below catches it. */
        mx = Q6_Vw_vmax_VwVw(mx, Q6_Vw_vabs_Vw(v));
        mn = Q6_Vw_vmin_VwVw(mn, v);
    }
    *(HVX_Vector *)buf = mx;
    uint32_t m = 0;
    for (uint32_t j = 0; j < LANES; j++)
        if ((uint32_t)buf[j] > m && buf[j] >= 0) m = (uint32_t)buf[j];
    *(HVX_Vector *)buf = mn;
    for (uint32_t j = 0; j < LANES; j++)
        if (buf[j] == INT32_MIN) m = 0x80000000u;
    for (; i < len; i++) {
        int32_t v = x[i];
        uint32_t a = v < 0 ? 0u - (uint32_t)v : (uint32_t)v;
        if (a > m) m = a;
    }
    return m;
}

static uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}
static uint32_t stream_key(uint64_t seed, uint32_t hi) {
    return mix32((uint32_t)seed ^ mix32((uint32_t)(seed >> 32) ^ mix32(hi ^ 0x9e3779b9u)));
}

static int32_t clamp127(int32_t q, uint32_t *clamped) {
    int32_t v = q < -127 ? -127 : (q > 127 ? 127 : q);
    *clamped += (v != q);
    return v;
}

uint32_t fhx_rescale(const int32_t *src, uint32_t len, uint32_t shift, uint32_t mode, uint64_t seed,
                     uint64_t offset, int8_t *dst) {
    uint32_t clamped = 0;
    if (mode == 1) {
        uint32_t hi = (uint32_t)(offset >> 32), key = stream_key(seed, hi);
        const uint32_t mask = (uint32_t)((1ull << shift) - 1u);
        for (uint32_t i = 0; i < len; i++) {
            uint64_t idx = offset + i;
            if ((uint32_t)(idx >> 32) != hi) {
                hi = (uint32_t)(idx >> 32);
                key = stream_key(seed, hi);
            }
            uint32_t r = shift == 0 ? 0 : mix32((uint32_t)idx ^ key) >> (32 - shift);
            int32_t x = src[i];
            int32_t q = (x >> shift) + (int32_t)((((uint32_t)x & mask) + r) >> shift);
            dst[i] = (int8_t)clamp127(q, &clamped);
        }
        return clamped;
    }
    /* Nearest, halves away from zero: q = (|x| + half) >> shift, negated for x < 0; clamp to ±127. */
    static int32_t buf[LANES] __attribute__((aligned(128)));
    const uint32_t half = (1u << shift) >> 1;
    const HVX_Vector vhalf = Q6_V_vsplat_R((int32_t)half), zero = Q6_V_vzero();
    const HVX_Vector hi127 = Q6_V_vsplat_R(127), lo127 = Q6_V_vsplat_R(-127), one = Q6_V_vsplat_R(1);
    HVX_Vector count = zero;
    uint32_t i = 0;
    for (; i + LANES <= len; i += LANES) {
        fhx_memcpy(buf, src + i, sizeof buf);
        HVX_Vector x = *(HVX_Vector *)buf;
        HVX_Vector u = Q6_Vw_vadd_VwVw(Q6_Vw_vabs_Vw(x), vhalf); /* < 2^32 as unsigned */
        HVX_Vector q = Q6_Vuw_vlsr_VuwR(u, shift);
        HVX_VectorPred neg = Q6_Q_vcmp_gt_VwVw(zero, x);
        q = Q6_V_vmux_QVV(neg, Q6_Vw_vsub_VwVw(zero, q), q);
        HVX_Vector v = Q6_Vw_vmin_VwVw(Q6_Vw_vmax_VwVw(q, lo127), hi127);
        count = Q6_Vw_vadd_VwVw(count, Q6_V_vmux_QVV(Q6_Q_vcmp_eq_VwVw(v, q), zero, one));
        *(HVX_Vector *)buf = v;
        for (uint32_t j = 0; j < LANES; j++) dst[i + j] = (int8_t)buf[j];
    }
    *(HVX_Vector *)buf = count;
    for (uint32_t j = 0; j < LANES; j++) clamped += (uint32_t)buf[j];
    for (; i < len; i++) {
        int32_t x = src[i];
        uint32_t ax = x < 0 ? 0u - (uint32_t)x : (uint32_t)x;
        int32_t q = (int32_t)((ax + half) >> shift);
        if (x < 0) q = (int32_t)(0u - (uint32_t)q);
        dst[i] = (int8_t)clamp127(q, &clamped);
    }
    return clamped;
}

void fhx_maxpool(const int8_t *x, uint32_t w, uint32_t pairs, int8_t *y, uint8_t *idx) {
    const uint32_t ow = w / 2;
    for (uint32_t k = 0; k < pairs; k++) {
        const int8_t *top = x + (size_t)k * 2u * w, *bot = top + w;
        for (uint32_t o = 0; o < ow; o++) {
            int8_t best = top[2 * o];
            uint8_t bi = 0;
            if (top[2 * o + 1] > best) { best = top[2 * o + 1]; bi = 1; }
            if (bot[2 * o] > best) { best = bot[2 * o]; bi = 2; }
            if (bot[2 * o + 1] > best) { best = bot[2 * o + 1]; bi = 3; }
            y[(size_t)k * ow + o] = best;
            idx[(size_t)k * ow + o] = bi;
        }
    }
}

void fhx_maxpool_grad(const int8_t *dy, const uint8_t *idx, uint32_t w, uint32_t pairs, int8_t *dx) {
    const uint32_t ow = w / 2;
    for (uint32_t k = 0; k < pairs; k++)
        for (uint32_t o = 0; o < ow; o++) {
            uint32_t i = idx[(size_t)k * ow + o] & 3u;
            size_t at = (size_t)k * 2u * w + (i / 2) * w + 2 * o + i % 2;
            int32_t v = (int32_t)dx[at] + dy[(size_t)k * ow + o];
            dx[at] = (int8_t)(v < -127 ? -127 : (v > 127 ? 127 : v));
        }
}

void fhx_quantize(const float *src, uint32_t len, float k, int8_t *dst) {
    for (uint32_t i = 0; i < len; i++) {
        float t = src[i] * k;
        if (t != t) { dst[i] = 0; continue; } /* NaN -> 0, as Rust's clamp then `as i32` */
        if (t < -128.0f) t = -128.0f;
        if (t > 128.0f) t = 128.0f;
        int32_t q = (int32_t)t;
        float f = t - (float)q;
        int32_t r = q + (f >= 0.5f) - (f <= -0.5f);
        dst[i] = (int8_t)(r < -127 ? -127 : (r > 127 ? 127 : r));
    }
}

void fhx_im2col(const struct fhx_conv *g, const int8_t *x, uint32_t samples, uint32_t grp, int8_t *cols) {
    const uint32_t cin_g = g->cin / g->groups, p = g->oh * g->ow, span = samples * p;
    const size_t hw = (size_t)g->h * g->w, per_in = (size_t)g->cin * hw;
    for (uint32_t cl = 0; cl < cin_g; cl++)
        for (uint32_t ki = 0; ki < g->kh; ki++)
            for (uint32_t kj = 0; kj < g->kw; kj++) {
                const uint32_t rowi = (cl * g->kh + ki) * g->kw + kj, c = grp * cin_g + cl;
                int8_t *dst = cols + (size_t)rowi * span;
                for (uint32_t s = 0; s < samples; s++) {
                    const int8_t *xc = x + s * per_in + c * hw;
                    for (uint32_t oy = 0; oy < g->oh; oy++) {
                        int64_t iy = (int64_t)oy * g->sh + ki - g->ph;
                        for (uint32_t ox = 0; ox < g->ow; ox++) {
                            int64_t ix = (int64_t)ox * g->sw + kj - g->pw;
                            int in = iy >= 0 && iy < g->h && ix >= 0 && ix < g->w;
                            dst[(size_t)s * p + oy * g->ow + ox] = in ? xc[iy * g->w + ix] : 0;
                        }
                    }
                }
            }
}
