/* quant_gemm.c's AMX pass, beside the AVX512-VNNI body whose epilogue it shares (group_scales, group_row);
 * included by quant_gemm.c after TILE and super_groups, which it uses.
 *
 * AMX (Sapphire Rapids and later Xeons) for passes of 12 or more rows: prefill, long verifies, wide
 * batches. Beyond ~8 rows the VNNI body is bound by its vector ports: per row and group, 8 vpdpbusd
 * and 4 float operations. One TDPBSUD computes a group's dots for up to 16 rows x 16 lanes (the 128
 * vpdpbusd of those rows) on the tile unit, leaving the vector ports the float epilogue alone. Each
 * group has its own scales, so the dots leave the tile after every group (K = 32 per multiply), and
 * the epilogue is the VNNI body's, operation for operation: the same integers meet the same float
 * operations in the same order, so every output has the same bits as the VNNI body gives it
 * (tests/test_int4_kernel.py). Groups of 32 only (every Q4_K tensor); other sizes use VNNI. */
#define SPECDECODE_AMX 1
#define AMX_ROWS 16
/* Fewer rows per pass than this stay on VNNI: below ~11 rows each group's fixed tile traffic (codes
 * in, dots out) costs more than the vpdpbusd it saves (measured cache-hot, one thread). */
#define AMX_MIN_ROWS 12
/* The tiles' height for a call of R rows: its passes of that many rows run on AMX, the rest on VNNI. */
static inline int amx_height(int R) { return R < AMX_ROWS ? R : AMX_ROWS; }
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Linux grants a process the tile state only on request; without it the first tile instruction
 * faults. Asked once; a kernel that refuses leaves every pass on VNNI. Benign race: concurrent
 * first callers make the same request and store the same answer. */
static int amx_granted(void) {
    static volatile int state = -1;
    if (state < 0) state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return state;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* Per thread (tile configuration is thread state). tmm0-2: dots of three groups, M rows x 16 int32
 * lanes each; tmm3: M activation rows x one group of 32 int8; tmm4: the group's codes, 8 rows (4
 * inputs each) x 16 lanes x 4 bytes, AMX's B layout. */
static void amx_begin(int M) {
    amx_config c = {0};
    c.palette = 1;
    for (int i = 0; i < 3; i++) c.rows[i] = M, c.colsb[i] = 64;
    c.rows[3] = M, c.colsb[3] = 32;
    c.rows[4] = 8, c.colsb[4] = 64;
    _tile_loadconfig(&c);
}

/* Tile t's codes one byte each, as consecutive B tiles: chunk j (64 bytes) of the packed layout gives
 * B row 2 j (its low nibbles: inputs 8 j .. 8 j + 3 of each lane) and 2 j + 1 (the high ones). So
 * group g's B tile is the 512 bytes at b + 512 g. b: K * 16 bytes. */
static void amx_unpack(const uint8_t *w, int K, int t, uint8_t *b) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    const size_t bytes = (size_t)K * TILE / 2;
    const uint8_t *wt = w + (size_t)t * bytes;
    for (size_t off = 0; off < bytes; off += 64) {
        const __m512i v = _mm512_loadu_si512((const void *)(wt + off));
        _mm512_store_si512((void *)(b + 2 * off), _mm512_and_si512(v, low));
        _mm512_store_si512((void *)(b + 2 * off + 64), _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
    }
}

/* The VNNI body's epilogue for group g of rows [r0, r0 + M): dots [M rows][16 lanes] int32. */
static inline __attribute__((always_inline)) void amx_epilogue(
    __m512 *acc, const int32_t *dots, const uint8_t *sub, const uint16_t *sup, int G, int S, int t, int g,
    const float *sx, const float *xsum, int R, int r0, const int M) {
    const uint16_t *sp = sup + ((size_t)t * (G / S) + g / S) * 2 * TILE;
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sp));
    const __m512 dmv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sp + TILE)));
    __m512 sv, mv;
    group_scales(sub + ((size_t)t * G + g) * 2 * TILE, dv, dmv, &sv, &mv);
    const size_t rg = (size_t)g * R + r0;
    for (int i = 0; i < M; i++)
        group_row(&acc[i], _mm512_load_si512((const void *)(dots + i * TILE)), sx + rg + i, xsum + rg + i, sv, mv);
}

/* Group g's dots into tile C (tile numbers are immediates). tmm3, tmm4: the activations and codes. */
#define AMX_ISSUE(C, g)                                                        \
    do {                                                                       \
        _tile_zero(C);                                                         \
        _tile_loadd(3, xq + ((size_t)(g) * R + r0) * 32, 32);                  \
        _tile_loadd(4, b + (size_t)(g) * 512, 64);                             \
        _tile_dpbsud(C, 3, 4);                                                 \
    } while (0)
#define AMX_EPI(g, d)                                                                        \
    do {                                                                                     \
        if (next)                                                                            \
            for (int l = 0; l < 4; l++) _mm_prefetch((const char *)(next + (size_t)(g) * 256 + 64 * l), _MM_HINT_T2); \
        amx_epilogue(acc, d, sub, sup, G, S, t, g, sx, xsum, R, r0, M);                      \
    } while (0)

/* Rows [r0, r0 + 16) against tile t, whose codes amx_unpack left in b (gs = 32). Software-pipelined
 * three deep, group g in dot tile g % 3 and buffer g % 3: while the vector units scale group g, group
 * g + 1's dots travel from their tile to memory and the tile unit computes group g + 2's. next: the
 * packed codes of the tile this thread unpacks next (NULL: none), requested into L2 a group at a time
 * (256 bytes) while this one computes: amx_unpack reads a whole tile before any of its groups
 * computes, so without this the pass alternates between waiting for memory and leaving it idle. */
static inline __attribute__((always_inline)) void amx_tile_rows(
    const uint8_t *b, const uint8_t *sub, const uint16_t *sup, int K, int t, const int8_t *xq, const float *sx,
    const float *xsum, int R, int r0, float *y, int N, const uint8_t *next, const int M) {
    const int G = K / 32, S = super_groups(G);
    __attribute__((aligned(64))) int32_t dots[3][AMX_ROWS * TILE];
    __m512 acc[AMX_ROWS];
    for (int i = 0; i < M; i++) acc[i] = _mm512_setzero_ps();
    AMX_ISSUE(0, 0);
    if (G > 1) AMX_ISSUE(1, 1);
    _tile_stored(0, dots[0], 64);
    for (int g = 0; g < G; g += 3) { /* here: group g is in dots[0], group g + 1 issued to tile 1 */
        if (g + 2 < G) AMX_ISSUE(2, g + 2);
        if (g + 1 < G) _tile_stored(1, dots[1], 64);
        AMX_EPI(g, dots[0]);
        if (g + 1 >= G) break;
        if (g + 3 < G) AMX_ISSUE(0, g + 3);
        if (g + 2 < G) _tile_stored(2, dots[2], 64);
        AMX_EPI(g + 1, dots[1]);
        if (g + 2 >= G) break;
        if (g + 4 < G) AMX_ISSUE(1, g + 4);
        if (g + 3 < G) _tile_stored(0, dots[0], 64);
        AMX_EPI(g + 2, dots[2]);
    }
    for (int i = 0; i < M; i++) _mm512_storeu_ps(y + (size_t)(r0 + i) * N + (size_t)t * TILE, acc[i]);
}

/* A pass of M rows, AMX_MIN_ROWS <= M <= AMX_ROWS (the tiles' configured height), M a constant in
 * each body. */
static void amx_rows(const uint8_t *b, const uint8_t *sub, const uint16_t *sup, int K, int t, const int8_t *xq,
                     const float *sx, const float *xsum, int R, int r0, float *y, int N, const uint8_t *next, int M) {
    switch (M) {
#define AMX_CASE(m) case m: amx_tile_rows(b, sub, sup, K, t, xq, sx, xsum, R, r0, y, N, next, m); break;
    AMX_CASE(12) AMX_CASE(13) AMX_CASE(14) AMX_CASE(15) AMX_CASE(16) /* AMX_MIN_ROWS .. AMX_ROWS */
#undef AMX_CASE
    default: break;
    }
}

/* A thread's unpacked-codes buffer, kept for its next call: pool threads live as long as the pool
 * (release_threads ends them, a few times per process; their buffers are not reclaimed). */
static uint8_t *amx_buffer(size_t bytes) {
    static _Thread_local uint8_t *buf;
    static _Thread_local size_t size;
    if (bytes > size) {
        free(buf);
        buf = aligned_alloc(64, bytes);
        size = buf ? bytes : 0;
    }
    return buf;
}
