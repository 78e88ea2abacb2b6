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
 *   m = max_j s_j;  p_j = exp(s_j - m) (exp_neg below, a fixed polynomial);  z = sum_j p_j in j order
 *   o = (sum_j p_j v_j, 8-lane FMA in j order) / z
 * Keys are bfloat16 (widened exactly) or float32. Nothing is vectorised across queries or keys in a
 * way that changes one query's order, so the AVX512 and AVX2 builds give the same bits too (both use
 * 256-bit vectors: Zen 4 executes 512-bit FMAs as two halves anyway).
 *
 * Visibility: query t of row b sees keys [0, nkeys[b, t]) of its slot, or, when mask is given, the
 * keys j < nkeys[b, t] with mask[b, t, j] != 0 (tree nodes: the prefix and their ancestors).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

typedef float v8f __attribute__((vector_size(32)));

static inline v8f load8(const void *p, int bf16) {
    if (bf16) /* bfloat16 -> float32 is a 16-bit shift: exact */
        return (v8f)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    return (v8f)_mm256_loadu_ps((const float *)p);
}

static inline v8f fma8(v8f a, v8f b, v8f c) { return (v8f)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }

static inline float hsum8(v8f v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

/* exp(x) for x <= 0 (Cephes' expf polynomial, ~1 ulp); 0 below -87. Plain float operations only,
 * so the compiler may vectorise the loop calling it without changing a single result (the library
 * is built without floating-point contraction). */
static inline float exp_neg(float x) {
    if (x < -87.f) return 0.f;
    const float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.f;
    union { int32_t i; float f; } e = {.i = ((int32_t)n + 127) << 23};
    return p * e.f;
}

/* Scores of one query against keys [0, n): 4 keys per pass share the query's loads, each with its
 * own chain, which is exactly the chain a single key gets. */
static void scores(const float *q, const char *k, size_t kstride, int n, int D, int bf16, float scale, float *s) {
    const int es = bf16 ? 2 : 4;
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        const char *k0 = k + (size_t)j * kstride;
        for (int d = 0; d < D; d += 8) {
            const v8f qd = load8(q + d, 0);
            a0 = fma8(qd, load8(k0 + (size_t)d * es, bf16), a0);
            a1 = fma8(qd, load8(k0 + kstride + (size_t)d * es, bf16), a1);
            a2 = fma8(qd, load8(k0 + 2 * kstride + (size_t)d * es, bf16), a2);
            a3 = fma8(qd, load8(k0 + 3 * kstride + (size_t)d * es, bf16), a3);
        }
        s[j] = scale * hsum8(a0);
        s[j + 1] = scale * hsum8(a1);
        s[j + 2] = scale * hsum8(a2);
        s[j + 3] = scale * hsum8(a3);
    }
    for (; j < n; j++) {
        v8f a = {0};
        const char *kj = k + (size_t)j * kstride;
        for (int d = 0; d < D; d += 8) a = fma8(load8(q + d, 0), load8(kj + (size_t)d * es, bf16), a);
        s[j] = scale * hsum8(a);
    }
}

/* One query: o[D] from its scores s[0, n) (overwritten by the weights) and visibility vis (NULL:
 * all of [0, n) visible). */
static void attend_one(float *s, int n, const uint8_t *vis, const char *v, size_t vstride, int D, int bf16, float *o) {
    const int es = bf16 ? 2 : 4;
    float m = -INFINITY;
    for (int j = 0; j < n; j++)
        if ((!vis || vis[j]) && s[j] > m) m = s[j];
    for (int j = 0; j < n; j++) s[j] = (!vis || vis[j]) ? exp_neg(s[j] - m) : 0.f;
    float z = 0.f;
    for (int j = 0; j < n; j++)
        if (!vis || vis[j]) z += s[j];
    v8f acc[32]; /* D <= 256 */
    for (int c = 0; c < D / 8; c++) acc[c] = (v8f){0};
    for (int j = 0; j < n; j++) {
        if (vis && !vis[j]) continue;
        const v8f p = {s[j], s[j], s[j], s[j], s[j], s[j], s[j], s[j]};
        const char *vj = v + (size_t)j * vstride;
        for (int c = 0; c < D / 8; c++) acc[c] = fma8(p, load8(vj + (size_t)c * 8 * es, bf16), acc[c]);
    }
    for (int c = 0; c < D / 8; c++) {
        const v8f r = acc[c] / z;
        _mm256_storeu_ps(o + 8 * c, (__m256)r);
    }
}

/* q, o: float32 [B, H, T, D]; kc, vc: one layer of the cache, [S, Hkv, Lmax, D] (bf16 or float32);
 * slots int32 [B]; nkeys int32 [B, T] (>= 1); mask uint8 [B, T, Lm] or NULL. D % 8 == 0, D <= 256.
 * Returns 0, or -1 where a scratch buffer could not be allocated. */
int specdecode_attention(const float *q, const void *kc, const void *vc, int bf16, int B, int H, int Hkv,
                         int T, int D, int Lmax, const int32_t *slots, const int32_t *nkeys, const uint8_t *mask,
                         int Lm, float scale, float *o, int nthreads) {
    const int G = H / Hkv;
    const size_t es = bf16 ? 2 : 4, row = (size_t)D * es;
    int failed = 0;
#pragma omp parallel num_threads(nthreads)
    {
        int lmax = 0;
        for (int i = 0; i < B * T; i++)
            if (nkeys[i] > lmax) lmax = nkeys[i];
        float *s = malloc(sizeof(float) * (size_t)(lmax > 0 ? lmax : 1));
        if (!s) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for collapse(3) schedule(dynamic)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++) {
                    if (!s) continue;
                    const int n = nkeys[b * T + t];
                    const size_t base = ((size_t)slots[b] * Hkv + (size_t)(h / G)) * (size_t)Lmax * row;
                    const float *qi = q + (((size_t)b * H + h) * T + t) * D;
                    scores(qi, (const char *)kc + base, row, n, D, bf16, scale, s);
                    attend_one(s, n, mask ? mask + ((size_t)b * T + t) * Lm : NULL, (const char *)vc + base, row, D,
                               bf16, o + (((size_t)b * H + h) * T + t) * D);
                }
        free(s);
    }
    return failed ? -1 : 0;
}
