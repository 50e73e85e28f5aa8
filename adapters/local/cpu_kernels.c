/* The embedded engine's C kernels (built and loaded by kernels.py): matrix products straight from
   GGUF Q4_1 weights, and decode attention over one run of KV pages.

   A Q4_1 block holds 32 consecutive weights of one row as 4-bit integers q (0..15), a scale d and
   an offset m: w = d * q + m. The weights stay packed (0.75 bytes per weight with fp32 d and m,
   against 4 for fp32): a decode step reads every weight once, so its matmuls run at memory
   speed, and fewer bytes are faster.

   Layout (the caller's tensors): qs [N, K/2] bytes, block g of row n at qs[n][16g..16g+15], byte j
   holding element j in its low nibble and element j + 16 in its high nibble (GGUF's order);
   d, m [N, K/32] fp32.

   The kernels use AVX-512F, chosen per function (`target`), so the file builds with any x86-64
   compiler flags; `cpu_kernels_supported` tells whether this CPU runs them. Threads: OpenMP, linked to
   the libgomp that torch already loaded, so the kernels share torch's thread pool. */

#include <immintrin.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 32
#define ROWS 4 /* input rows sharing one unpacked block */

#define AVX512 __attribute__((target("avx512f")))
#define INLINE static inline __attribute__((always_inline))

int cpu_kernels_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}

/* One block's 32 weights as floats: lo = elements 0..15, hi = elements 16..31 (still 0..15). */
AVX512 INLINE void unpack(const uint8_t *q, __m512 *lo, __m512 *hi) {
    __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
    *lo = _mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(15)));
    *hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4));
}

/* Output n of `rows` (<= ROWS) input rows. Per block, d * (q . x) and m * sum(x) are two
   independent accumulator chains; `pairs` holds x[i] + x[i + 16] per block, so the offset term
   is one vector FMA, not a scalar tail per output. */
AVX512 INLINE void output_rows(const float *x, int ldx, const float *pairs, int K, const uint8_t *q,
                               const float *d, const float *m, float *y, int ldy, int accumulate,
                               const int rows) {
    __m512 scaled[ROWS], offset[ROWS];
    for (int r = 0; r < ROWS; r++) {
        scaled[r] = _mm512_setzero_ps();
        offset[r] = _mm512_setzero_ps();
    }
    for (int g = 0; g < K / BLOCK; g++) {
        __m512 lo, hi;
        unpack(q + g * 16, &lo, &hi);
        __m512 dg = _mm512_set1_ps(d[g]), mg = _mm512_set1_ps(m[g]);
        for (int r = 0; r < rows; r++) {
            const float *xr = x + (size_t)r * ldx + g * BLOCK;
            __m512 dot = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xr + 16), _mm512_mul_ps(lo, _mm512_loadu_ps(xr)));
            scaled[r] = _mm512_fmadd_ps(dot, dg, scaled[r]);
            offset[r] = _mm512_fmadd_ps(_mm512_loadu_ps(pairs + (size_t)r * (K / 2) + g * 16), mg, offset[r]);
        }
    }
    for (int r = 0; r < rows; r++) {
        float sum = _mm512_reduce_add_ps(_mm512_add_ps(scaled[r], offset[r]));
        float *out = y + (size_t)r * ldy;
        *out = accumulate ? *out + sum : sum;
    }
}

/* y[r][n] (+)= sum_k x[r][k] * w[n][k] for r < M, n < N; x rows ldx floats apart, y rows ldy.
   Returns 0, or -1 when out of memory (nothing written). */
AVX512 int q4_1_matmul(const float *x, int ldx, int M, int K, const uint8_t *qs, const float *d,
                       const float *m, int N, float *y, int ldy, int accumulate, int threads) {
    const int groups = K / BLOCK, half = K / 2;
    float *pairs = malloc(sizeof(float) * (size_t)M * half);
    if (pairs == NULL) return -1;
    for (int r = 0; r < M; r++)
        for (int g = 0; g < groups; g++)
            for (int i = 0; i < 16; i++)
                pairs[(size_t)r * half + g * 16 + i] =
                    x[(size_t)r * ldx + g * BLOCK + i] + x[(size_t)r * ldx + g * BLOCK + 16 + i];
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int n = 0; n < N; n++) {
        const uint8_t *q = qs + (size_t)n * half;
        const float *dn = d + (size_t)n * groups, *mn = m + (size_t)n * groups;
        for (int r0 = 0; r0 < M; r0 += ROWS) {
            const float *xr = x + (size_t)r0 * ldx, *pr = pairs + (size_t)r0 * half;
            float *yr = y + (size_t)r0 * ldy + n;
            /* A constant row count per call site, so the accumulators live in registers. */
            switch (M - r0 < ROWS ? M - r0 : ROWS) {
            case 1: output_rows(xr, ldx, pr, K, q, dn, mn, yr, ldy, accumulate, 1); break;
            case 2: output_rows(xr, ldx, pr, K, q, dn, mn, yr, ldy, accumulate, 2); break;
            case 3: output_rows(xr, ldx, pr, K, q, dn, mn, yr, ldy, accumulate, 3); break;
            default: output_rows(xr, ldx, pr, K, q, dn, mn, yr, ldy, accumulate, 4); break;
            }
        }
    }
    free(pairs);
    return 0;
}

/* ---- Q8_0: w = d * q, q int8, one fp32 scale d per block of 32 (GGUF's embedding tables) ---- */

AVX512 INLINE void q8_output_rows(const float *x, int ldx, int K, const int8_t *q, const float *d, float *y,
                                  int ldy, const int rows) {
    __m512 acc[ROWS];
    for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < K / BLOCK; g++) {
        __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + g * BLOCK))));
        __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + g * BLOCK + 16))));
        __m512 dg = _mm512_set1_ps(d[g]);
        for (int r = 0; r < rows; r++) {
            const float *xr = x + (size_t)r * ldx + g * BLOCK;
            __m512 dot = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xr + 16), _mm512_mul_ps(lo, _mm512_loadu_ps(xr)));
            acc[r] = _mm512_fmadd_ps(dot, dg, acc[r]);
        }
    }
    for (int r = 0; r < rows; r++) y[(size_t)r * ldy] = _mm512_reduce_add_ps(acc[r]);
}

/* y[r][n] = sum_k x[r][k] * w[n][k]: qs [N, K] int8, d [N, K/32] fp32. */
AVX512 void q8_0_matmul(const float *x, int ldx, int M, int K, const int8_t *qs, const float *d, int N, float *y,
                        int ldy, int threads) {
    const int groups = K / BLOCK;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int n = 0; n < N; n++) {
        const int8_t *q = qs + (size_t)n * K;
        const float *dn = d + (size_t)n * groups;
        for (int r0 = 0; r0 < M; r0 += ROWS) {
            const float *xr = x + (size_t)r0 * ldx;
            float *yr = y + (size_t)r0 * ldy + n;
            switch (M - r0 < ROWS ? M - r0 : ROWS) {
            case 1: q8_output_rows(xr, ldx, K, q, dn, yr, ldy, 1); break;
            case 2: q8_output_rows(xr, ldx, K, q, dn, yr, ldy, 2); break;
            case 3: q8_output_rows(xr, ldx, K, q, dn, yr, ldy, 3); break;
            default: q8_output_rows(xr, ldx, K, q, dn, yr, ldy, 4); break;
            }
        }
    }
}

/* ---- Decode attention: each decode row over its own KV pages ----

   q [R, H, 64] (head dimension 64 only); query head h reads KV head h / (H / KVH); out [R, H * 64].
   The pool's layout: a token slot holds every KV head's 64 values, so a stretch of consecutive
   slots is one contiguous piece of memory. Each stretch is attended by every KV head in turn,
   taking the queries of that head's group (4 at a time, so their 64-wide outputs stay in
   registers), keeping the queries' maximum score, sum of exponentials and unnormalized output;
   a row's stretches are merged by their maxima at the end (splitting a softmax is exact up to
   rounding, as FlashAttention's blocks are). */

#define HEAD_DIM 64
#define QUERY_BLOCK 4

typedef struct {
    float max, sum;
} Stats;

/* e^x for x <= 0 (scores minus their maximum): 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2], p the
   degree-7 Taylor polynomial (relative error < 1e-8 on that interval, below fp32's rounding). */
AVX512 INLINE __m512 exp_nonpositive(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* Queries qs[0..nq) (nq <= 4, 64 floats each) over tokens [0, n) of one KV head: fills stats and
   the unnormalized outputs acc[nq][64]; scores is n * nq floats of scratch. */
AVX512 INLINE void attend_block(const float *qs, const int nq, const float *k, const float *v, int ts, int n,
                                float scale, float *scores, Stats *stats, float *acc) {
    __m512 qv[QUERY_BLOCK][4];
    for (int i = 0; i < nq; i++)
        for (int c = 0; c < 4; c++) qv[i][c] = _mm512_mul_ps(_mm512_loadu_ps(qs + i * HEAD_DIM + c * 16), _mm512_set1_ps(scale));
    for (int t = 0; t < n; t++) {
        const float *kt = k + (size_t)t * ts;
        __m512 k0 = _mm512_loadu_ps(kt), k1 = _mm512_loadu_ps(kt + 16), k2 = _mm512_loadu_ps(kt + 32),
               k3 = _mm512_loadu_ps(kt + 48);
        for (int i = 0; i < nq; i++) {
            __m512 d = _mm512_fmadd_ps(qv[i][1], k1, _mm512_mul_ps(qv[i][0], k0));
            d = _mm512_fmadd_ps(qv[i][3], k3, _mm512_fmadd_ps(qv[i][2], k2, d));
            scores[(size_t)i * n + t] = _mm512_reduce_add_ps(d);
        }
    }
    for (int i = 0; i < nq; i++) {
        float *s = scores + (size_t)i * n;
        float peak = -INFINITY;
        for (int t = 0; t < n; t++) peak = s[t] > peak ? s[t] : peak;
        __m512 top = _mm512_set1_ps(peak), total = _mm512_setzero_ps();
        int t = 0;
        for (; t + 16 <= n; t += 16) {
            __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + t), top));
            _mm512_storeu_ps(s + t, e);
            total = _mm512_add_ps(total, e);
        }
        if (t < n) {
            __mmask16 tail = (__mmask16)((1u << (n - t)) - 1);
            __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + t), top));
            _mm512_mask_storeu_ps(s + t, tail, e);
            total = _mm512_add_ps(total, _mm512_maskz_mov_ps(tail, e));
        }
        stats[i].max = peak;
        stats[i].sum = _mm512_reduce_add_ps(total);
    }
    __m512 out[QUERY_BLOCK][4];
    for (int i = 0; i < QUERY_BLOCK; i++)
        for (int c = 0; c < 4; c++) out[i][c] = _mm512_setzero_ps();
    for (int t = 0; t < n; t++) {
        const float *vt = v + (size_t)t * ts;
        __m512 v0 = _mm512_loadu_ps(vt), v1 = _mm512_loadu_ps(vt + 16), v2 = _mm512_loadu_ps(vt + 32),
               v3 = _mm512_loadu_ps(vt + 48);
        for (int i = 0; i < nq; i++) {
            __m512 p = _mm512_set1_ps(scores[(size_t)i * n + t]);
            out[i][0] = _mm512_fmadd_ps(p, v0, out[i][0]);
            out[i][1] = _mm512_fmadd_ps(p, v1, out[i][1]);
            out[i][2] = _mm512_fmadd_ps(p, v2, out[i][2]);
            out[i][3] = _mm512_fmadd_ps(p, v3, out[i][3]);
        }
    }
    for (int i = 0; i < nq; i++)
        for (int c = 0; c < 4; c++) _mm512_storeu_ps(acc + i * HEAD_DIM + c * 16, out[i][c]);
}

AVX512 static void attend_window(const float *qbuf, int Q, const float *k, const float *v, int ts, int n,
                                 float scale, float *scores, Stats *stats, float *acc) {
    for (int i0 = 0; i0 < Q; i0 += QUERY_BLOCK) {
        const float *qs = qbuf + (size_t)i0 * HEAD_DIM;
        float *a = acc + (size_t)i0 * HEAD_DIM;
        /* A constant block size per call site, so the block's state stays in registers. */
        switch (Q - i0 < QUERY_BLOCK ? Q - i0 : QUERY_BLOCK) {
        case 1: attend_block(qs, 1, k, v, ts, n, scale, scores, stats + i0, a); break;
        case 2: attend_block(qs, 2, k, v, ts, n, scale, scores, stats + i0, a); break;
        case 3: attend_block(qs, 3, k, v, ts, n, scale, scores, stats + i0, a); break;
        default: attend_block(qs, 4, k, v, ts, n, scale, scores, stats + i0, a); break;
        }
    }
}

/* Decode rows over their own pages. `segments` [S][3]: (row, first token slot, tokens), a stretch
   of consecutive slots (a run of consecutive pages, or part of one), rows in ascending order,
   every row with at least one. Token slot s of KV head j is at k/v + s * ts + j * 64. A segment is
   a unit of work: every KV head of its row attends over it in turn; a row's segments are merged
   by their maxima at the end. Returns 0, -1 when out of memory, -2 on shapes it does not handle
   (head dimension not 64). */
AVX512 int decode_attention(const float *q, int R, int H, int KVH, int D, const float *k, const float *v,
                            int ts, const int32_t *segments, int S, float scale, float *out, int threads) {
    if (D != HEAD_DIM || H % KVH != 0 || S < 1 || R < 1) return -2;
    const int groups = H / KVH, per_segment = KVH * groups;
    int span = 1;
    for (int s = 0; s < S; s++) span = segments[3 * s + 2] > span ? segments[3 * s + 2] : span;
    float *scores = malloc(sizeof(float) * (size_t)S * QUERY_BLOCK * span);
    Stats *stats = malloc(sizeof(Stats) * (size_t)S * per_segment);
    float *acc = malloc(sizeof(float) * (size_t)S * per_segment * D);
    int status = 0;
    if (scores == NULL || stats == NULL || acc == NULL) {
        status = -1;
        goto done;
    }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int s = 0; s < S; s++) {
        const int r = segments[3 * s], n = segments[3 * s + 2];
        const size_t slot = (size_t)segments[3 * s + 1];
        for (int j = 0; j < KVH; j++) {
            const size_t unit = (size_t)s * per_segment + (size_t)j * groups;
            attend_window(q + ((size_t)r * H + (size_t)j * groups) * D, groups, k + slot * ts + (size_t)j * D,
                          v + slot * ts + (size_t)j * D, ts, n, scale, scores + (size_t)s * QUERY_BLOCK * span,
                          stats + unit, acc + unit * D);
        }
    }
    for (int first = 0; first < S;) {
        const int r = segments[3 * first];
        int last = first;
        while (last + 1 < S && segments[3 * (last + 1)] == r) last++;
        for (int i = 0; i < per_segment; i++) {
            float peak = -INFINITY, total = 0.0f, merged[HEAD_DIM] = {0};
            for (int s = first; s <= last; s++) {
                const float m = stats[(size_t)s * per_segment + i].max;
                peak = m > peak ? m : peak;
            }
            for (int s = first; s <= last; s++) {
                const size_t unit = (size_t)s * per_segment + i;
                const float weight = expf(stats[unit].max - peak);
                total += stats[unit].sum * weight;
                for (int c = 0; c < D; c++) merged[c] += acc[unit * D + c] * weight;
            }
            /* i runs over (KV head, group), which is the query head's own index. */
            for (int c = 0; c < D; c++) out[((size_t)r * H + i) * D + c] = merged[c] / total;
        }
        first = last + 1;
    }
done:
    free(scores);
    free(stats);
    free(acc);
    return status;
}

/* ---- RMSNorm of a few rows: y = x / sqrt(mean(x^2) + eps) * w, K a multiple of 16 ----
   One call instead of the seven small torch ops `transformers`' formula takes, each of which costs
   more in dispatch than in arithmetic at decode's row counts. */
AVX512 void rms_norm(const float *x, int ldx, int M, int K, const float *w, float eps, float *y, int ldy) {
    for (int r = 0; r < M; r++) {
        const float *xr = x + (size_t)r * ldx;
        float *yr = y + (size_t)r * ldy;
        __m512 squares = _mm512_setzero_ps();
        for (int c = 0; c < K; c += 16) {
            __m512 v = _mm512_loadu_ps(xr + c);
            squares = _mm512_fmadd_ps(v, v, squares);
        }
        const float inverse = 1.0f / sqrtf(_mm512_reduce_add_ps(squares) / (float)K + eps);
        const __m512 factor = _mm512_set1_ps(inverse);
        for (int c = 0; c < K; c += 16)
            _mm512_storeu_ps(yr + c, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(xr + c), factor),
                                                   _mm512_loadu_ps(w + c)));
    }
}
