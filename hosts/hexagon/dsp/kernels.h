/* HVX int8 kernels of frugal's DSP side: each bit-exact with the portable kernels of
 * core/src/kernels/int8 (the conformance tests of frugal-hexagon hold them to it). */
#ifndef FRUGAL_HEXAGON_KERNELS_H
#define FRUGAL_HEXAGON_KERNELS_H
#include <stdint.h>
#include <stddef.h>

/* Bytes of the tightly coupled vector memory a GEMM packs its B panels into (a v68 cDSP has 4-8 MiB
 * of VTCM; one panel of at most this much is what a tile of the batch/depth split may use). */
#define FHX_VTCM_BYTES (256u * 1024u)

/* C[m x n] (dense, row stride n) = (accumulate ? C : 0) + A[m x k] . B[k x n]; A and B strided views
 * (element (i,p) of A at a[i*a_rs + p*a_cs]). `apack` has room for m * round4(min(k, KC)) bytes. */
void fhx_gemm(uint32_t m, uint32_t n, uint32_t k, const int8_t *a, uint32_t a_rs, uint32_t a_cs,
              const int8_t *b, uint32_t b_rs, uint32_t b_cs, int32_t *c, int accumulate,
              int8_t *apack);
/* The depth of one VTCM tile of fhx_gemm. */
uint32_t fhx_gemm_kc(void);

uint32_t fhx_max_abs(const int32_t *x, uint32_t len);
/* Returns the number of clamped values. mode 0: nearest (halves away from zero), 1: stochastic. */
uint32_t fhx_rescale(const int32_t *src, uint32_t len, uint32_t shift, uint32_t mode, uint64_t seed,
                     uint64_t offset, int8_t *dst);
void fhx_maxpool(const int8_t *x, uint32_t w, uint32_t pairs, int8_t *y, uint8_t *idx);
void fhx_maxpool_grad(const int8_t *dy, const uint8_t *idx, uint32_t w, uint32_t pairs, int8_t *dx);
void fhx_quantize(const float *src, uint32_t len, float k, int8_t *dst);

struct fhx_conv {
    uint32_t cin, h, w, cout, kh, kw, sh, sw, ph, pw, groups, oh, ow;
};
/* cols[kg][samples*oh*ow] of group grp (kg = cin/groups*kh*kw), zero padding. */
void fhx_im2col(const struct fhx_conv *g, const int8_t *x, uint32_t samples, uint32_t grp, int8_t *cols);

#endif
