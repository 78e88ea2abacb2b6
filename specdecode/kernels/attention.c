/* Batch-invariant attention over the slot KV cache, for CPU prefill, decode and verify.
 *
 * Why: a fused attention kernel (PyTorch's SDPA) reduces in an order that depends on the call's
 * shape: how many queries it gets, how many keys, where the mask cuts. So the same query gets
 * other bits when it is decoded alone, verified among draft tokens, prefilled in a chunk or run in
 * a batch beside other sequences, and greedy output would change with load and history. Here every
 * query is computed on its own, in one fixed order that depends only on the keys it sees: with the
 * row-invariant linears of quant_gemm.c, a token's hidden state has the same bits whichever way it
 * reaches the model.
 *
 * Arithmetic for one query q (float32 [D]) of kv head c, seeing keys J (ascending cache indices):
 *   s_j = scale * dot(q, k_j)     dot: one 8-lane FMA chain over D, then a fixed 8-lane sum
 *   m = max_j s_j;  p_j = exp(s_j - m) (exp8 below, a fixed polynomial);  z = sum_j p_j in j order
 *   o = (sum_j p_j v_j, 8-lane FMA in j order) / z
 * Keys are bfloat16 (widened exactly) or float32. The G query heads of a kv head share the work of
 * widening each block of keys and values, and nothing is vectorised across queries or keys in a way
 * that changes one query's order, so the AVX512 and AVX2 builds give the same bits too (both use
 * 256-bit vectors: Zen 4 executes 512-bit FMAs as two halves anyway).
 *
 * Visibility: query t of row b sees keys [0, nkeys[b, t]) of its slot, or, when mask is given, the
 * keys j < nkeys[b, t] with mask[b, t, j] != 0 (tree nodes: the prefix and their ancestors).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "simd.h"

/* Scores of one query against keys [0, n): 8 keys per pass, each with its own FMA chain (8 chains
 * in flight hide the FMA latency), which is exactly the chain a single key gets. */
static void scores(const float *q, const char *k, size_t kstride, int n, int D, int bf16, float scale, float *s) {
    const int es = bf16 ? 2 : 4;
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        v8f a[8] = {{0}};
        const char *k0 = k + (size_t)j * kstride;
        for (int d = 0; d < D; d += 8) {
            const v8f qd = load8(q + d, 0);
            for (int i = 0; i < 8; i++) a[i] = fma8(qd, load8(k0 + i * kstride + (size_t)d * es, bf16), a[i]);
        }
        for (int i = 0; i < 8; i++) s[j + i] = scale * hsum8(a[i]);
    }
    for (; j < n; j++) {
        v8f a = {0};
        const char *kj = k + (size_t)j * kstride;
        for (int d = 0; d < D; d += 8) a = fma8(load8(q + d, 0), load8(kj + (size_t)d * es, bf16), a);
        s[j] = scale * hsum8(a);
    }
}

/* Softmax weights of one query in place over s[0, n) (0 where vis says invisible; vis NULL: all of
 * [0, n) visible); returns their sum z. */
static float softmax(float *s, int n, const uint8_t *vis) {
    float m = -INFINITY;
    for (int j = 0; j < n; j++)
        if ((!vis || vis[j]) && s[j] > m) m = s[j];
    const v8f mv = {m, m, m, m, m, m, m, m};
    int j = 0;
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(s + j, (__m256)exp8(load8(s + j, 0) - mv));
    if (j < n) { /* the tail through the same instructions, padded */
        float t[8] = {0};
        for (int i = j; i < n; i++) t[i - j] = s[i];
        _mm256_storeu_ps(t, (__m256)exp8(load8(t, 0) - mv));
        for (int i = j; i < n; i++) s[i] = t[i - j];
    }
    if (vis)
        for (j = 0; j < n; j++) s[j] = vis[j] ? s[j] : 0.f;
    float z = 0.f;
    for (j = 0; j < n; j++) z += s[j]; /* invisible keys add +0: z is unchanged by them */
    return z;
}

/* acc[D] += p_j v_j over visible j in [0, n), in j order; v float32 rows of D. Eight vectors of
 * acc (64 floats) at a time, so that they stay in registers across the key loop; each element's
 * chain over j is the same whatever the chunking. */
static void accumulate(const float *p, int n, const uint8_t *vis, const float *v, int D, float *acc) {
    int c0 = 0;
    for (; c0 + 64 <= D; c0 += 64) {
        v8f a[8];
        for (int i = 0; i < 8; i++) a[i] = load8(acc + c0 + 8 * i, 0);
        for (int j = 0; j < n; j++) {
            if (vis && !vis[j]) continue;
            const v8f pj = {p[j], p[j], p[j], p[j], p[j], p[j], p[j], p[j]};
            const float *vj = v + (size_t)j * D + c0;
            for (int i = 0; i < 8; i++) a[i] = fma8(pj, load8(vj + 8 * i, 0), a[i]);
        }
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(acc + c0 + 8 * i, (__m256)a[i]);
    }
    for (; c0 < D; c0 += 8) { /* head dims that are not a multiple of 64 */
        v8f a = load8(acc + c0, 0);
        for (int j = 0; j < n; j++) {
            if (vis && !vis[j]) continue;
            const v8f pj = {p[j], p[j], p[j], p[j], p[j], p[j], p[j], p[j]};
            a = fma8(pj, load8(v + (size_t)j * D + c0, 0), a);
        }
        _mm256_storeu_ps(acc + c0, (__m256)a);
    }
}

/* Rows [0, n) of one kv head (stride row bytes) as float32 [n, D] in dst (exact for bfloat16). */
static void widen(const char *src, size_t row, int n, int D, int bf16, float *dst) {
    for (int j = 0; j < n; j++)
        for (int c = 0; c < D; c += 8)
            _mm256_storeu_ps(dst + (size_t)j * D + c,
                             (__m256)load8(src + (size_t)j * row + (size_t)c * (bf16 ? 2 : 4), bf16));
}

#define KB 32 /* keys per block: a block's keys or values, widened (16 KB at D = 128), stay in L1 for all G queries */

/* The G query heads that share kv head c, at token t of row b: keys and values are widened once
 * per block and read by every one of them. q_g = q[g * qstride], o_g likewise. */
static void group(const float *q, size_t qstride, const char *k, const char *v, size_t row, int n,
                  const uint8_t *vis, int G, int D, int bf16, float scale, float *s, float *buf, float *acc,
                  float *o) {
    for (int j0 = 0; j0 < n; j0 += KB) {
        const int nb = n - j0 < KB ? n - j0 : KB;
        widen(k + (size_t)j0 * row, row, nb, D, bf16, buf);
        for (int g = 0; g < G; g++)
            scores(q + g * qstride, (const char *)buf, (size_t)D * 4, nb, D, 0, scale, s + (size_t)g * n + j0);
    }
    float z[64]; /* G <= 64 */
    for (int g = 0; g < G; g++) {
        z[g] = softmax(s + (size_t)g * n, n, vis);
        for (int c = 0; c < D; c++) acc[(size_t)g * D + c] = 0.f;
    }
    for (int j0 = 0; j0 < n; j0 += KB) {
        const int nb = n - j0 < KB ? n - j0 : KB;
        widen(v + (size_t)j0 * row, row, nb, D, bf16, buf);
        for (int g = 0; g < G; g++)
            accumulate(s + (size_t)g * n + j0, nb, vis ? vis + j0 : NULL, buf, D, acc + (size_t)g * D);
    }
    for (int g = 0; g < G; g++)
        for (int c = 0; c < D; c += 8) {
            const v8f r = load8(acc + (size_t)g * D + c, 0) / z[g];
            _mm256_storeu_ps(o + g * qstride + c, (__m256)r);
        }
}

/* q, o: float32 [B, H, T, D]; kc, vc: one layer of the cache, [S, Hkv, Lmax, D] (bf16 or float32);
 * slots int32 [B]; nkeys int32 [B, T] (>= 1); mask uint8 [B, T, Lm] or NULL. D % 8 == 0, D <= 256,
 * H / Hkv <= 64. Returns 0, or -1 where a scratch buffer could not be allocated. */
int specdecode_attention(const float *q, const void *kc, const void *vc, int bf16, int B, int H, int Hkv,
                         int T, int D, int Lmax, const int32_t *slots, const int32_t *nkeys, const uint8_t *mask,
                         int Lm, float scale, float *o, int nthreads) {
    const int G = H / Hkv;
    const size_t es = bf16 ? 2 : 4, row = (size_t)D * es, qstride = (size_t)T * D;
    int lmax = 1, failed = 0;
    for (int i = 0; i < B * T; i++)
        if (nkeys[i] > lmax) lmax = nkeys[i];
#pragma omp parallel num_threads(nthreads)
    {
        /* per thread: scores [G, lmax], one widened block [KB, D], accumulators [G, D] */
        float *s = malloc(sizeof(float) * ((size_t)G * lmax + (size_t)KB * D + (size_t)G * D));
        if (!s) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for collapse(3) schedule(dynamic)
        for (int b = 0; b < B; b++)
            for (int c = 0; c < Hkv; c++)
                for (int t = 0; t < T; t++) {
                    if (!s) continue;
                    const size_t base = ((size_t)slots[b] * Hkv + (size_t)c) * (size_t)Lmax * row;
                    const size_t qo = ((size_t)b * H + (size_t)c * G) * qstride + (size_t)t * D;
                    group(q + qo, qstride, (const char *)kc + base, (const char *)vc + base, row, nkeys[b * T + t],
                          mask ? mask + ((size_t)b * T + t) * Lm : NULL, G, D, bf16, scale, s,
                          s + (size_t)G * lmax, s + (size_t)G * lmax + (size_t)KB * D, o + qo);
                }
        free(s);
    }
    return failed ? -1 : 0;
}

