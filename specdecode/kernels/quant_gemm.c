/* Weight-only int4 and int8 GEMM for CPU decode and verify: y[R, N] = x[R, K] @ W[N, K]^T.
 *
 * Why kernels of our own: PyTorch's CPU int4 and int8 kernels widen every weight to bfloat16 before
 * the dot product, so one core handles ~7-10 GB/s of weights (compute-bound, well below DRAM bandwidth), and
 * it works in blocks of 4 activation rows, so verifying 5-8 tokens costs ~3x one token. Here the
 * activations are quantized to int8 per group (as llama.cpp does for its Q4 x Q8 dot products) and the
 * 4-bit codes meet them in integer dot-product instructions (AVX512-VNNI vpdpbusd, AVX-VNNI's 256-bit
 * vpdpbusd, or AVX2 maddubs+madd): unpacking a weight costs ~1/32 instruction, it is shared by every activation row,
 * and each row adds ~1 instruction per 64 multiply-adds. Decode becomes bandwidth-bound and a verify
 * of up to 10 rows (8 on AVX2) reads the weights once.
 *
 * int4 weight format (packed by specdecode/kernels/__init__.py:pack_int4 and Int4Linear): codes c in
 * 0..15, and per group g = k / gs an 8-bit sub-scale sc and sub-minimum m under 16-bit super-scales
 * d and dm shared by the S groups of a super-block (b = g / S; S = super_groups(K / gs) below):
 *   w[n, k] = c[n, k] * d[n, b] * sc[n, g]  +  dm[n, b] * m[n, g]      (sc uint8, m int8)
 * GGUF's Q4_K is this with S = 8 (6-bit sc and m, dm = -dmin), so its blocks load without rounding.
 * Per 32 weights: 16 bytes of codes, 2 of sub-scales, 0.5 of super-scales: 4.625 bits per weight
 * (a half scale and zero per group: 5.0).
 * Outputs come in tiles of 16 rows (n = 16 t + l). Within tile t and group g the 16 x gs codes fill
 * gs / 8 chunks of 64 bytes; byte 4 l + b of chunk j holds
 *   low nibble:  c[16 t + l, g gs + 8 j + b]      high nibble: c[16 t + l, g gs + 8 j + 4 + b]
 * so one 64-byte load gives, per nibble half, 4 consecutive codes of each of the 16 rows: exactly
 * the operand of one vpdpbusd against 4 activation bytes broadcast to all lanes.
 *   packed: uint8 [N/16, K/gs, gs/8, 64]
 *   sub:    uint8 [N/16, K/gs, 2, 16]   (sc of the 16 lanes, then m as int8)
 *   sup:    uint16 (half bits) [N/16, K/(gs S), 2, 16]   (d, then dm)
 *
 * Activations: per row r and group g, sx = max|x| / 127, xq = rint(x / sx) in [-127, 127], and
 * xsum = sum of the float x. Then, exactly,
 *   y[r, n] = sum_g  d sc * sx * sum_k c * xq  +  dm m * xsum        (k in group g)
 * where only the activation rounding (|x - sx xq| <= sx / 2) departs from the float product.
 * The quantized activations are stored group-major (quantize_rows): a pass over one group of a tile
 * reads its rows' bytes and scales at constant offsets from one pointer, with no per-row addresses
 * held in registers (with row-major storage a 9-row pass spilled them to the stack).
 *
 * int8 weight format (pack_int8): w[n, k] = q[n, k] * wscale[n], q in -127..127 stored as the
 * unsigned byte u = q + 128 (vpdpbusd multiplies unsigned by signed bytes), in the same 16-row tiles:
 * byte 4 l + b of chunk j (64 bytes) of tile t holds u[16 t + l, 4 j + b].
 *   packed: uint8 [N/16, K/4, 64]      wscale: float32 [N]
 * With the same int8 activations (groups of gs = 32) and xqsum = sum of xq per group:
 *   y[r, n] = wscale[n] * (sum_g sx (sum_k u xq) - 128 sum_g sx xqsum)
 * and the second term does not depend on n: one subtraction per row at the end.
 */
#define _GNU_SOURCE /* syscall(), for AMX's permission request */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stddef.h>

#define TILE 16
#include "share.h"

/* Groups per super-block: the largest divisor of G up to 8 (8 when K % (8 gs) == 0, as in Q4_K);
 * layers/quant/formats.py:super_groups is the same function. */
static inline int super_groups(int G) {
    int S = 8;
    while (G % S) S--;
    return S;
}
/* Software prefetch of the packed weights, in two levels: a thread streams its tiles in order, and
 * each group's lines are requested PF_FAR bytes ahead into L2 (the T2 hint; L2 on Intel, the nearest
 * level on cores that do not distinguish) and again PF_NEAR bytes ahead into L1. Without software
 * prefetch one row's GEMV streams its weights ~15-20 % slower (Zen 4, Intel Xeon); adding the far
 * level to a single L1 level made one row stream ~7 % faster on an Intel Xeon (docs/benchmarks.md,
 * round 21). */
#ifndef PF_FAR
#define PF_FAR 16384
#endif
#ifndef PF_NEAR
#define PF_NEAR 4096
#endif
/* The sub-scales and the super-blocks' scales are two more streams beside the codes (2 x 16 bytes per
 * group, and 64 bytes per super-block of 8 groups, against the codes' 256 per group: an eighth and a
 * thirty-second of their rate), requested at least as far ahead in time as the codes' far level, into L1
 * (they are few). Left to the hardware prefetcher, a pass of one to three rows, bound by the streams,
 * waits on their lines (docs/benchmarks.md, round 42). */
#ifndef PF_SUB
#define PF_SUB (PF_FAR / 8)
#endif
#ifndef PF_SUP
#define PF_SUP (PF_FAR / 16)
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include "quant_gemm_avx512.h"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "quant_gemm_avx2.h"
#else
#error "quant_gemm.c needs AVX512-VNNI or AVX2+FMA+F16C (the loader falls back to PyTorch's kernel)"
#endif

#if defined(__AVX512VNNI__) && defined(__AMX_TILE__) && defined(__AMX_INT8__) && !defined(SPECDECODE_NO_AMX)
#include "quant_gemm_amx.h" /* defines SPECDECODE_AMX */
#endif

/* x [R, K] float -> the activations in group-major order, so that a pass over one group of a tile
 * finds its rows' bytes and scales at fixed offsets from one base: xq int8 [K / gs, R, gs], sx / xsum
 * float [K / gs, R] (sx = max|x| / 127, xsum = the float sum of x); xqsum (may be NULL): the integer
 * sums of xq per group, as float, [K / gs, R]. Called inside a parallel region: the team shares the
 * groups (each is independent) and meets at the loop's barrier, so the tiles start on complete
 * activations. */
static void quantize_rows(const float *x, int R, int K, int gs, int8_t *xq, float *sx, float *xsum, float *xqsum) {
    const int G = K / gs;
#pragma omp for schedule(static)
    for (int gr = 0; gr < G * R; gr++) {
        const int g = gr / R, r = gr % R;
        float amax;
        int32_t qsum;
        quantize_group(x + (size_t)r * K + (size_t)g * gs, gs, xq + (size_t)gr * gs, &amax, &xsum[gr], &qsum);
        sx[gr] = amax / 127.f;
        if (xqsum) xqsum[gr] = (float)qsum;
    }
}

/* The VNNI / AVX2 passes of tile t for rows [r0, r1) of R: gs a constant where the caller passes one. */
static inline __attribute__((always_inline)) void tile_passes(
    const uint8_t *w, const uint8_t *s, const uint16_t *z, int K, const int gs, int t, const int8_t *xq,
    const float *sx, const float *xsum, int R, int r0, int r1, float *y, int N) {
    for (; r0 + MAX_ROWS <= r1; r0 += MAX_ROWS)
        tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, MAX_ROWS, y, N);
    switch (r1 - r0) { /* one specialised body per remainder, so the row loops unroll */
    case 1: tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, 1, y, N); break;
    case 2: tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, 2, y, N); break;
    case 3: tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, 3, y, N); break;
    case 4: tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, 4, y, N); break;
    case 5: tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, 5, y, N); break;
    case 6: tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, 6, y, N); break;
    case 7: tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, 7, y, N); break;
#if MAX_ROWS > 8
    case 8: tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, 8, y, N); break;
    case 9: tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, 9, y, N); break;
#endif
    default: break;
    }
}

/* Rows [r0, r1) of R against tile t. amx: a buffer of K * 16 bytes where AMX takes this call's passes of
 * amx_height(R) rows (the tiles' height, set by amx_begin), else NULL; the rows left over run on VNNI. */
static void tile(const uint8_t *w, const uint8_t *s, const uint16_t *z, int K, int gs, int t,
                 const int8_t *xq, const float *sx, const float *xsum, int R, int r0, int r1, float *y, int N,
                 uint8_t *amx) {
#ifdef SPECDECODE_AMX
    if (amx) {
        amx_unpack(w, K, t, amx);
        const int M = amx_height(R);
        const uint8_t *next = (t + 1) * TILE < N ? w + (size_t)(t + 1) * K * TILE / 2 : NULL;
        for (; r0 + M <= r1; r0 += M, next = NULL) amx_rows(amx, s, z, K, t, xq, sx, xsum, R, r0, y, N, next, M);
    }
#else
    (void)amx;
#endif
    if (gs == 32) /* every Q4_K tensor: the chunk loops unroll and the row offsets become immediates */
        tile_passes(w, s, z, K, 32, t, xq, sx, xsum, R, r0, r1, y, N);
    else
        tile_passes(w, s, z, K, gs, t, xq, sx, xsum, R, r0, r1, y, N);
}

static void tile_i8(const uint8_t *w, const float *ws, int K, int t, const int8_t *xq, const float *sx,
                    const float *corr, int R, float *y, int N) {
    int r0 = 0;
    for (; r0 + MAX_ROWS <= R; r0 += MAX_ROWS) tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, MAX_ROWS, y, N);
    switch (R - r0) {
    case 1: tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, 1, y, N); break;
    case 2: tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, 2, y, N); break;
    case 3: tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, 3, y, N); break;
    case 4: tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, 4, y, N); break;
    case 5: tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, 5, y, N); break;
    case 6: tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, 6, y, N); break;
    case 7: tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, 7, y, N); break;
#if MAX_ROWS > 8
    case 8: tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, 8, y, N); break;
    case 9: tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, 9, y, N); break;
#endif
    default: break;
    }
}

/* Rows per block of a many-row call (a prompt chunk), in whole passes of MAX_ROWS. Every tile reads all
 * of its block's int8 activations (rows x K bytes): a 512-token chunk of the 8960-wide down projection
 * is 4.6 MB, fetched from L3 again for every 16 outputs. Blocks of <= 256 KiB stay in any of our cores'
 * L2 (Zen 3: 512 KiB) next to the tile's weights; the weights are then read once per block, which a
 * compute-bound chunk hides. Decode and verify calls (R <= MAX_ROWS) are one block. */
#ifndef ROW_BLOCK_BYTES
#define ROW_BLOCK_BYTES (256 << 10)
#endif
static inline int row_block(int K) {
    const int rows = ROW_BLOCK_BYTES / K / MAX_ROWS * MAX_ROWS;
    return rows > MAX_ROWS ? rows : MAX_ROWS;
}

#ifdef SPECDECODE_AMX
const char *specdecode_isa(void) { return amx_granted() ? SPECDECODE_ISA "+amx" : SPECDECODE_ISA; }
#else
const char *specdecode_isa(void) { return SPECDECODE_ISA; }
#endif

/* y [R, N] = x [R, K] @ W^T. scratch: R * K bytes + 2 * R * (K / gs) floats, caller-owned.
 * Preconditions (checked by the caller): N % 16 == 0, K % gs == 0, gs % 8 == 0, R >= 1. */
void specdecode_int4_gemm(const float *x, int R, int K, int N, int gs, const uint8_t *w, const uint8_t *sub,
                          const uint16_t *sup, float *y, int8_t *xq, float *sx, float *xsum, int threads) {
    const int T = N / TILE;
#ifdef SPECDECODE_AMX
    const int amx = R >= AMX_MIN_ROWS && gs == 32 && amx_granted();
    const int RB = amx ? R : row_block(K); /* AMX widens each tile once per call: one block */
#else
    const int RB = row_block(K);
#endif
    /* Each thread streams its contiguous range of tiles (prefetch-friendly) and then helps the others
     * (share.h); every row block has its own ranges. */
    const int nb = (R + RB - 1) / RB, chunk = share_chunk((size_t)K * TILE / 2);
    tile_range *ranges = tile_ranges((size_t)nb * threads);
#pragma omp parallel num_threads(threads)
    {
        const int me = omp_get_thread_num(), team = omp_get_num_threads();
        if (ranges) {
#pragma omp single nowait
            for (int b = 0; b < nb; b++) ranges_init(ranges + (size_t)b * team, team, T);
        }
        quantize_rows(x, R, K, gs, xq, sx, xsum, NULL); /* ends at a barrier: the ranges are set */
        uint8_t *buf = NULL;
#ifdef SPECDECODE_AMX
        if (amx && (buf = amx_buffer((size_t)K * TILE)) != NULL) amx_begin(amx_height(R));
#endif
        for (int b = 0, r0 = 0; r0 < R; b++, r0 += RB) { /* no barrier between blocks: their outputs are disjoint */
            const int r1 = R - r0 < RB ? R : r0 + RB;
            if (ranges) {
                for (int t0, n; (n = tiles_next(ranges + (size_t)b * team, me, team, chunk, &t0)) > 0;)
                    for (int t = t0; t < t0 + n; t++) tile(w, sub, sup, K, gs, t, xq, sx, xsum, R, r0, r1, y, N, buf);
            } else {
#pragma omp for schedule(static) nowait
                for (int t = 0; t < T; t++) tile(w, sub, sup, K, gs, t, xq, sx, xsum, R, r0, r1, y, N, buf);
            }
        }
#ifdef SPECDECODE_AMX
        if (buf) _tile_release();
#endif
    }
}

/* y [R, N] = x [R, K] @ (wscale * q)^T. scratch: R * K bytes + 3 * R * (K / 32) floats (+ R floats),
 * caller-owned. Preconditions (checked by the caller): N % 16 == 0, K % 32 == 0, R >= 1. */
void specdecode_int8_gemm(const float *x, int R, int K, int N, const uint8_t *w, const float *ws, float *y,
                          int8_t *xq, float *sx, float *xsum, float *xqsum, float *corr, int threads) {
    const int G = K / 32, T = N / TILE, chunk = share_chunk((size_t)K * TILE);
    tile_range *ranges = tile_ranges((size_t)threads);
#pragma omp parallel num_threads(threads)
    {
        const int me = omp_get_thread_num(), team = omp_get_num_threads();
        if (ranges) {
#pragma omp single nowait
            ranges_init(ranges, team, T);
        }
        quantize_rows(x, R, K, 32, xq, sx, xsum, xqsum);
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++) { /* 128 sum_g sx xqsum: the +128 bias of the unsigned weights */
            float c = 0.f;
            for (int g = 0; g < G; g++) c += sx[(size_t)g * R + r] * xqsum[(size_t)g * R + r];
            corr[r] = INT8_UNSIGNED_BIAS ? 128.f * c : 0.f;
        }
        if (ranges) {
            for (int t0, n; (n = tiles_next(ranges, me, team, chunk, &t0)) > 0;)
                for (int t = t0; t < t0 + n; t++) tile_i8(w, ws, K, t, xq, sx, corr, R, y, N);
        } else {
#pragma omp for schedule(static) nowait
            for (int t = 0; t < T; t++) tile_i8(w, ws, K, t, xq, sx, corr, R, y, N);
        }
    }
}
