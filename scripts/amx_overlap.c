/* Whether the int4 kernel's AMX pass can hide its tile instructions under its vector epilogue on this core.
 * Per group of 32 inputs and 16 rows x 16 lanes, quant_gemm_amx.h issues tilezero, two tileloadd (the rows'
 * activations, the codes), tdpbsud and tilestored, and then the group's float epilogue: per row, a load of
 * the 16 dots, int -> float, a multiply by the row's scale and two fused multiply-adds (group_row). This
 * times each part alone and each tile instruction interleaved with the epilogue, cache-hot, one thread.
 * If the tile unit ran beside the vector ports, "epilogue + X" would cost max(epilogue, X), not the sum.
 *
 *     gcc -O2 -march=native scripts/amx_overlap.c -o /tmp/amx_overlap && /tmp/amx_overlap
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define STEPS 1500000 /* group steps per measurement, three per iteration */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static int8_t act[64][16 * 32] __attribute__((aligned(64)));  /* 64 groups' activation tiles (16 rows x 32) */
static uint8_t codes[64][512] __attribute__((aligned(64)));   /* 64 groups' code tiles (8 x 64 bytes) */
static int32_t dots[3][256] __attribute__((aligned(64)));     /* three groups' dots in flight, as in the pass */
static int32_t settled[256] __attribute__((aligned(64)));     /* dots no tile store writes */
static float sx[16], xsum[16];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* group_row for 16 rows, as quant_gemm_avx512.h computes it */
static inline void epilogue(__m512 *acc, const int32_t *d, __m512 sv, __m512 mv) {
    for (int i = 0; i < 16; i++) {
        const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(d + 16 * i)), _mm512_set1_ps(sx[i]));
        acc[i] = _mm512_fmadd_ps(f, sv, acc[i]);
        acc[i] = _mm512_fmadd_ps(mv, _mm512_set1_ps(xsum[i]), acc[i]);
    }
}

#define ISSUE(C, g)                                                                                \
    do {                                                                                           \
        _tile_zero(C);                                                                             \
        _tile_loadd(3, act[(g) & 63], 32);                                                         \
        _tile_loadd(4, codes[(g) & 63], 64);                                                       \
        _tile_dpbsud(C, 3, 4);                                                                     \
        _tile_stored(C, dots[C], 64);                                                              \
    } while (0)
#define TIME(name, body)                                                                           \
    do {                                                                                           \
        const double t0 = now();                                                                   \
        for (int g = 0; g < STEPS; g += 3) { body }                                                \
        printf("%-34s %6.2f ns a group\n", name, (now() - t0) / STEPS * 1e9);                    \
    } while (0)

int main(void) {
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) {
        puts("no AMX tile state granted (CPU, kernel or VM)");
        return 1;
    }
    tile_config c = {0};
    c.palette = 1;
    for (int i = 0; i < 3; i++) c.rows[i] = 16, c.colsb[i] = 64;
    c.rows[3] = 16, c.colsb[3] = 32;
    c.rows[4] = 8, c.colsb[4] = 64;
    _tile_loadconfig(&c);
    for (int i = 0; i < 16; i++) sx[i] = 1e-3f * (float)(i + 1), xsum[i] = 0.5f - 1e-2f * (float)i;
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    const __m512 sv = _mm512_set1_ps(1.0001f), mv = _mm512_set1_ps(-0.999f);
    for (int round = 0; round < 2; round++) {
        printf("round %d\n", round + 1);
        TIME("epilogue alone", epilogue(acc, settled, sv, mv); epilogue(acc, settled, sv, mv);
             epilogue(acc, settled, sv, mv););
        TIME("tile instructions alone (5)", ISSUE(0, g); ISSUE(1, g + 1); ISSUE(2, g + 2););
        TIME("the pass: both, interleaved", ISSUE(0, g); epilogue(acc, dots[2], sv, mv); ISSUE(1, g + 1);
             epilogue(acc, dots[0], sv, mv); ISSUE(2, g + 2); epilogue(acc, dots[1], sv, mv););
        TIME("tdpbsud alone", _tile_dpbsud(0, 3, 4); _tile_dpbsud(1, 3, 4); _tile_dpbsud(2, 3, 4););
        TIME("epilogue + tdpbsud", _tile_dpbsud(0, 3, 4); epilogue(acc, settled, sv, mv); _tile_dpbsud(1, 3, 4);
             epilogue(acc, settled, sv, mv); _tile_dpbsud(2, 3, 4); epilogue(acc, settled, sv, mv););
        TIME("two tileloadd alone", _tile_loadd(3, act[g & 63], 32); _tile_loadd(4, codes[g & 63], 64);
             _tile_loadd(3, act[(g + 1) & 63], 32); _tile_loadd(4, codes[(g + 1) & 63], 64);
             _tile_loadd(3, act[(g + 2) & 63], 32); _tile_loadd(4, codes[(g + 2) & 63], 64););
        TIME("epilogue + two tileloadd", _tile_loadd(3, act[g & 63], 32); _tile_loadd(4, codes[g & 63], 64);
             epilogue(acc, settled, sv, mv); _tile_loadd(3, act[(g + 1) & 63], 32);
             _tile_loadd(4, codes[(g + 1) & 63], 64); epilogue(acc, settled, sv, mv);
             _tile_loadd(3, act[(g + 2) & 63], 32); _tile_loadd(4, codes[(g + 2) & 63], 64);
             epilogue(acc, settled, sv, mv););
        TIME("tilestored alone", _tile_stored(0, dots[0], 64); _tile_stored(1, dots[1], 64);
             _tile_stored(2, dots[2], 64););
        TIME("epilogue + tilestored", _tile_stored(0, dots[0], 64); epilogue(acc, settled, sv, mv);
             _tile_stored(1, dots[1], 64); epilogue(acc, settled, sv, mv); _tile_stored(2, dots[2], 64);
             epilogue(acc, settled, sv, mv););
    }
    float s = 0.f; /* keeps the epilogue's results alive */
    for (int i = 0; i < 16; i++) s += _mm512_reduce_add_ps(acc[i]);
    printf("(checksum %g)\n", s);
    _tile_release();
    return 0;
}
