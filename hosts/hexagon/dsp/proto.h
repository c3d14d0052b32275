/* The frugal DSP pipe protocol, shared by the skel (this directory) and the host (src/proto.rs, which
 * must agree with every constant here). All integers little-endian.
 *
 * Request  (host -> DSP): magic FHX_REQ, op, seq, nparam, payload_len, checksum,
 *                         then nparam u32 parameters, then payload_len bytes.
 * Response (DSP -> host): magic FHX_RSP, status, seq, nresult, payload_len, checksum,
 *                         then nresult u32 results, then payload_len bytes.
 * checksum = fhx_sum(parameters/results bytes, then payload bytes) (FNV-1a over bytes, 32-bit).
 */
#ifndef FRUGAL_HEXAGON_PROTO_H
#define FRUGAL_HEXAGON_PROTO_H

#define FHX_REQ 0x52584846u /* "FHXR" */
#define FHX_RSP 0x41584846u /* "FHXA" */
#define FHX_HEADER_WORDS 6u
#define FHX_MAX_PARAMS 32u
#define FHX_QUIET 0x80000000u /* IN_SPACE: keep the output in the space, send none back */

enum fhx_op {
    FHX_OP_PING = 1,         /* results: [protocol version] */
    FHX_OP_GEMM = 2,         /* params m n k a_rs a_cs b_rs b_cs accumulate a_len b_len; payload A, B, [C m*n i32]; -> C m*n i32 */
    FHX_OP_RESCALE = 3,      /* params len shift mode(0 nearest,1 stochastic) seed_lo seed_hi off_lo off_hi; payload i32[len]; results [clamped]; -> i8[len] */
    FHX_OP_MAX_ABS = 4,      /* payload i32[len]; results [max |x| as u32] */
    FHX_OP_MAXPOOL = 5,      /* params w pairs; payload x i8[pairs*2w]; -> y i8[pairs*w/2], idx u8[pairs*w/2] */
    FHX_OP_MAXPOOL_GRAD = 6, /* params w pairs; payload dy[pairs*w/2], idx[pairs*w/2], dx[pairs*2w]; -> dx */
    FHX_OP_QUANTIZE = 7,     /* params len k_bits(f32); payload f32[len]; -> i8[len] */
    FHX_OP_IM2COL = 8,       /* params cin h w cout kh kw sh sw ph pw groups oh ow samples grp; payload x; -> cols[kg][samples*oh*ow] */
    FHX_OP_EXIT = 9,         /* the skel exits 0 after answering */
    /* The planned DSP space (one per plan; see ../README.md): */
    FHX_OP_PREPARE = 10,     /* params bytes; frees the old space, maps a zeroed one; results [generation, bytes, live spaces] */
    FHX_OP_WRITE = 11,       /* params nspans, (off, len) x nspans; payload the spans' bytes back to back -> space */
    FHX_OP_IN_SPACE = 12,    /* params inner_op nsrc ndst, (off rowlen rows stride) x (nsrc + ndst), inner params;
                                no payload: the sources are gathered from the space in order as the inner op's
                                payload; its output is scattered to the destinations in order and returned
                                (not returned when inner_op has FHX_QUIET set: the host computes it too) */
    FHX_OP_SPACE_SUM = 13,   /* results [FNV-1a of the whole space, its bytes] */
    FHX_OP_HANG = 14         /* test only: never answers (a hung DSP, for the host's time-out) */
};

enum fhx_status {
    FHX_OK = 0,
    FHX_BAD_MAGIC = 1,
    FHX_BAD_CHECKSUM = 2,
    FHX_BAD_OP = 3,
    FHX_BAD_PARAMS = 4,
    FHX_TOO_LARGE = 5
};

#define FHX_VERSION 2u

#endif
