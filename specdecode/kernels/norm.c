/* Row-invariant RMSNorm for CPU inference. */
#include <math.h>
#include <stddef.h>

#include "simd.h"

/* RMSNorm of rows x [R, D] float32: y = x / sqrt(mean(x^2) + eps) * w. Each row on its own, its
 * sum of squares in one fixed order (8 lanes, then a fixed lane sum), so a row's result does not
 * depend on the others. D % 8 == 0. Runs on the calling thread: a row costs ~100 ns. */
void specdecode_rmsnorm(const float *x, const float *w, float *y, int R, int D, float eps) {
    for (int r = 0; r < R; r++) {
        const float *xr = x + (size_t)r * D;
        float *yr = y + (size_t)r * D;
        v8f acc = {0};
        for (int d = 0; d < D; d += 8) {
            const v8f v = load8(xr + d, 0);
            acc = fma8(v, v, acc);
        }
        const float inv = 1.f / sqrtf(hsum8(acc) / (float)D + eps);
        const v8f s = {inv, inv, inv, inv, inv, inv, inv, inv};
        for (int d = 0; d < D; d += 8) _mm256_storeu_ps(yr + d, (__m256)(load8(xr + d, 0) * s * load8(w + d, 0)));
    }
}
