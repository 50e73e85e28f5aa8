/* The embedded engine's C kernels (built and loaded by kernels.py): matrix products straight from
   GGUF Q4_1 and Q8_0 weights (fp32 activations, or int8 ones for prompt rows), decode and prefill
   attention over KV pages, RMSNorm, and a prompt chunk's RoPE with its K/V writes and SwiGLU.

   A Q4_1 block holds 32 consecutive weights of one row as 4-bit integers q (0..15), a scale d and
   an offset m: w = d * q + m; a Q8_0 block 32 int8 q and a scale: w = d * q. The weights stay
   packed (0.75 and 1.125 bytes per weight with fp32 scales, against 4 for fp32) in a layout
   interleaved by 16 outputs (see the products' section), which `linear.py` builds from GGUF's.

   The kernels use AVX-512F, chosen per function (`target`), so the file builds with any x86-64
   compiler flags; `cpu_kernels_supported` tells whether this CPU runs them. Built with
   RADIXGATE_PORTABLE, the same code runs on any x86-64 CPU through SIMDe's emulation of those
   intrinsics (`cpu_kernels_portable.h`: for the tests, slower than torch's path). Threads: OpenMP,
   linked to the libgomp that torch already loaded, so the kernels share torch's thread pool. */

#ifdef RADIXGATE_PORTABLE
#include "cpu_kernels_portable.h"
#else
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f")))
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
#endif
#include <pthread.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 32

#define INLINE static inline __attribute__((always_inline))

int cpu_kernels_supported(void) {
#ifdef RADIXGATE_PORTABLE
    return 1;
#else
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
#endif
}

/* ---- Decode attention: each decode row over its own KV pages ----

   q [R, H, 64] (head dimension 64 only); query head h reads KV head h / (H / KVH); out [R, H * 64].
   The pool's layout: slot s of KV head j is at s * ts + j * hs (head-major: ts = 64, so a stretch
   of consecutive slots is one contiguous piece of memory per head). Each stretch is attended by
   every KV head in turn, taking the queries of that head's group (4 at a time, so their 64-wide
   outputs stay in registers), keeping the queries' maximum score, sum of exponentials and
   unnormalized output; a row's stretches are merged by their maxima at the end (splitting a
   softmax is exact up to rounding, as FlashAttention's blocks are). */

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

/* The scores of one query (q, 4 registers of 16 dimensions) against 16 consecutive tokens: each
   token's 64 products are summed down to 16 lanes by FMAs, then the 16 registers are summed
   across lanes together, in a tree of unpacks and shuffles (45 operations instead of 16 separate
   horizontal sums, whose dependent steps made the loop latency-bound). Lane t holds token t. */
AVX512 INLINE __m512 scores16(const __m512 *q, const float *k, int ts) {
    __m512 part[16];
    for (int t = 0; t < 16; t++) {
        const float *kt = k + (size_t)t * ts;
        __m512 d = _mm512_fmadd_ps(q[1], _mm512_loadu_ps(kt + 16), _mm512_mul_ps(q[0], _mm512_loadu_ps(kt)));
        part[t] = _mm512_fmadd_ps(q[3], _mm512_loadu_ps(kt + 48), _mm512_fmadd_ps(q[2], _mm512_loadu_ps(kt + 32), d));
    }
    /* Per 128-bit lane: pairs of tokens, then fours ([t0, t1, t2, t3] of that lane's sums). */
    __m512 pairs[8], fours[4];
    for (int i = 0; i < 8; i++)
        pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(part[2 * i], part[2 * i + 1]),
                                 _mm512_unpackhi_ps(part[2 * i], part[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        fours[i] = _mm512_add_ps(_mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], 0x44),
                                 _mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], 0xEE));
    /* Across the four 128-bit lanes: lane j of the result holds tokens 4j..4j+3. */
    __m512 low = _mm512_add_ps(_mm512_shuffle_f32x4(fours[0], fours[1], 0x88), _mm512_shuffle_f32x4(fours[0], fours[1], 0xDD));
    __m512 high = _mm512_add_ps(_mm512_shuffle_f32x4(fours[2], fours[3], 0x88), _mm512_shuffle_f32x4(fours[2], fours[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(low, high, 0x88), _mm512_shuffle_f32x4(low, high, 0xDD));
}

/* Queries qs[0..nq) (nq <= 4, 64 floats each) over tokens [0, n) of one KV head: fills stats and
   the unnormalized outputs acc[nq][64]; scores is n * nq floats of scratch. */
AVX512 INLINE void attend_block(const float *qs, const int nq, const float *k, const float *v, int ts, int n,
                                float scale, float *scores, Stats *stats, float *acc) {
    __m512 qv[QUERY_BLOCK][4];
    for (int i = 0; i < nq; i++)
        for (int c = 0; c < 4; c++) qv[i][c] = _mm512_mul_ps(_mm512_loadu_ps(qs + i * HEAD_DIM + c * 16), _mm512_set1_ps(scale));
    const int whole = n - n % 16;
    for (int i = 0; i < nq; i++)
        for (int t = 0; t < whole; t += 16) {
            if (i == 0) {
                /* Ask for the next 16 tokens' keys and these tokens' values now: the hardware's
                   prefetcher stops at 4 KiB page boundaries, and with a slot stride above 64
                   floats it would restart every few tokens and leave a stream of misses. */
                const int ahead = t + 32 < n ? 16 : n - t - 16;
                for (int a = 0; a < 16; a++) {
                    const float *vt = v + (size_t)(t + a) * ts;
                    for (int c = 0; c < HEAD_DIM; c += 16) _mm_prefetch((const char *)(vt + c), _MM_HINT_T0);
                    if (a < ahead) {
                        const float *kt = k + (size_t)(t + 16 + a) * ts;
                        for (int c = 0; c < HEAD_DIM; c += 16) _mm_prefetch((const char *)(kt + c), _MM_HINT_T0);
                    }
                }
            }
            _mm512_storeu_ps(scores + (size_t)i * n + t, scores16(qv[i], k + (size_t)t * ts, ts));
        }
    for (int t = whole; t < n; t++) {
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

/* A segment's sort key: its stretch (first slot, tokens), then its index. Ordered so, the segments
   of rows on one cached prefix (the same stretches) sit side by side. */
typedef struct {
    int32_t first, tokens, index;
} StretchKey;

static int by_stretch(const void *a, const void *b) {
    const StretchKey *x = a, *y = b;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    if (x->tokens != y->tokens) return x->tokens < y->tokens ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* Decode rows over their own pages. `segments` [S][3]: (row, first token slot, tokens), a stretch
   of consecutive slots (a run of consecutive pages, or part of one), rows in ascending order,
   every row with at least one. Token slot s of KV head j is at k/v + s * ts + j * hs. Segments of
   different rows over the same stretch (a prefix shared from the cache) are one unit of work: each
   KV head reads the stretch once for all of their queries, while it is in cache, instead of once
   per row (each query's arithmetic is the same either way, so the result is too). A row's
   segments are merged by their maxima at the end. Returns 0, -1 when out of memory, -2 on shapes
   it does not handle (head dimension not 64). */
AVX512 int decode_attention(const float *q, int R, int H, int KVH, int D, const float *k, const float *v,
                            int ts, int64_t hs, const int32_t *segments, int S, float scale, float *out,
                            int threads) {
    if (D != HEAD_DIM || H % KVH != 0 || S < 1 || R < 1) return -2;
    const int groups = H / KVH, per_segment = KVH * groups;
    int span = 1;
    for (int s = 0; s < S; s++) span = segments[3 * s + 2] > span ? segments[3 * s + 2] : span;
    Stats *stats = malloc(sizeof(Stats) * (size_t)S * per_segment);
    float *acc = malloc(sizeof(float) * (size_t)S * per_segment * D);
    StretchKey *keys = malloc(sizeof(StretchKey) * (size_t)S);
    int *order = malloc(sizeof(int) * (size_t)S), *starts = malloc(sizeof(int) * ((size_t)S + 1));
    int *first = NULL;
    int status = 0, units = 0, widest = 1;
    if (stats == NULL || acc == NULL || keys == NULL || order == NULL || starts == NULL) {
        status = -1;
        goto done;
    }
    for (int s = 0; s < S; s++) keys[s] = (StretchKey){segments[3 * s + 1], segments[3 * s + 2], s};
    qsort(keys, (size_t)S, sizeof(StretchKey), by_stretch);
    for (int i = 0; i < S; i++) {
        order[i] = keys[i].index;
        if (i == 0 || keys[i].first != keys[i - 1].first || keys[i].tokens != keys[i - 1].tokens) starts[units++] = i;
    }
    starts[units] = S;
    for (int u = 0; u < units; u++) widest = starts[u + 1] - starts[u] > widest ? starts[u + 1] - starts[u] : widest;
#pragma omp parallel num_threads(threads)
    {
        /* Per thread: the unit's queries, their scores, statistics and outputs. */
        const size_t queries = (size_t)widest * groups;
        float *qbuf = malloc(sizeof(float) * queries * D), *unit_acc = malloc(sizeof(float) * queries * D);
        float *scores = malloc(sizeof(float) * (size_t)QUERY_BLOCK * span);
        Stats *unit_stats = malloc(sizeof(Stats) * queries);
        if (qbuf == NULL || unit_acc == NULL || scores == NULL || unit_stats == NULL) {
#pragma omp atomic write
            status = -1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int uj = 0; uj < units * KVH; uj++) {
            int failed;
#pragma omp atomic read
            failed = status;
            if (failed != 0) continue;
            const int u = uj / KVH, j = uj % KVH, members = starts[u + 1] - starts[u];
            const int32_t *stretch = segments + 3 * order[starts[u]];
            const size_t slot = (size_t)stretch[1];
            for (int i = 0; i < members; i++) {
                const int r = segments[3 * order[starts[u] + i]];
                memcpy(qbuf + (size_t)i * groups * D, q + ((size_t)r * H + (size_t)j * groups) * D,
                       sizeof(float) * groups * D);
            }
            attend_window(qbuf, members * groups, k + slot * ts + (size_t)j * hs, v + slot * ts + (size_t)j * hs, ts,
                          stretch[2], scale, scores, unit_stats, unit_acc);
            for (int i = 0; i < members; i++) {
                const size_t unit = (size_t)order[starts[u] + i] * per_segment + (size_t)j * groups;
                memcpy(stats + unit, unit_stats + (size_t)i * groups, sizeof(Stats) * groups);
                memcpy(acc + unit * D, unit_acc + (size_t)i * groups * D, sizeof(float) * groups * D);
            }
        }
        free(qbuf);
        free(unit_acc);
        free(scores);
        free(unit_stats);
    }
    if (status != 0) goto done;
    /* A row's segments are consecutive (rows ascending): merge each row's on its own thread. */
    first = malloc(sizeof(int) * ((size_t)R + 1));
    if (first == NULL) {
        status = -1;
        goto done;
    }
    for (int s = 0, r = 0; r <= R; r++) {
        while (s < S && segments[3 * s] < r) s++;
        first[r] = s;
    }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int r = 0; r < R; r++) {
        for (int i = 0; i < per_segment; i++) {
            float peak = -INFINITY, total = 0.0f;
            for (int s = first[r]; s < first[r + 1]; s++) {
                const float m = stats[(size_t)s * per_segment + i].max;
                peak = m > peak ? m : peak;
            }
            __m512 merged[HEAD_DIM / 16];
            for (int c = 0; c < HEAD_DIM / 16; c++) merged[c] = _mm512_setzero_ps();
            for (int s = first[r]; s < first[r + 1]; s++) {
                const size_t unit = (size_t)s * per_segment + i;
                const float weight = expf(stats[unit].max - peak);
                total += stats[unit].sum * weight;
                for (int c = 0; c < HEAD_DIM / 16; c++)
                    merged[c] = _mm512_fmadd_ps(_mm512_loadu_ps(acc + unit * D + c * 16), _mm512_set1_ps(weight), merged[c]);
            }
            /* i runs over (KV head, group), which is the query head's own index. */
            const __m512 sum = _mm512_set1_ps(total);
            for (int c = 0; c < HEAD_DIM / 16; c++)
                _mm512_storeu_ps(out + ((size_t)r * H + i) * D + c * 16, _mm512_div_ps(merged[c], sum));
        }
    }
done:
    free(first);
    free(keys);
    free(order);
    free(starts);
    free(stats);
    free(acc);
    return status;
}

/* ---- RMSNorm of rows: y = x / sqrt(mean(x^2) + eps) * w, K a multiple of 16 ----
   One call instead of the seven small torch ops `transformers`' formula takes, each of which costs
   more in dispatch than in arithmetic at decode's row counts; prefill chunks take it too. */
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

/* ---- A prompt chunk's rows between its products: RoPE with the K/V writes, and SwiGLU ----

   Done in torch these were ~12 % of a cold prefill (a roll, a multiply and an add over q and k, two
   index copies into the pool, q made contiguous for attention; SiLU, a multiply), each op a pass
   over memory; here each is one pass. */

/* qkv [n][(H + 2 KVH) * 64] (row stride ldqkv): q heads, then k heads, then v heads. Rotates q and k
   by their row's position (cos_half/sin_half [positions][32]: both halves of a head use the same
   angles; out = x * cos + rotate_half(x) * sin, as the model's torch path computes it), writes the
   rotated q to q_out [n][H][64] and k and v to slot slots[i] of the pool (KV head j at
   slot * ts + j * hs). */
AVX512 void rope_store(const float *qkv, int ldqkv, int n, int H, int KVH, const int64_t *positions,
                       const float *cos_half, const float *sin_half, float *q_out, float *k, float *v, int ts,
                       int64_t hs, const int64_t *slots, int threads) {
    const int half = HEAD_DIM / 2;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int i = 0; i < n; i++) {
        const float *row = qkv + (size_t)i * ldqkv;
        const float *c = cos_half + (size_t)positions[i] * half, *s = sin_half + (size_t)positions[i] * half;
        const __m512 c0 = _mm512_loadu_ps(c), c1 = _mm512_loadu_ps(c + 16);
        const __m512 s0 = _mm512_loadu_ps(s), s1 = _mm512_loadu_ps(s + 16);
        for (int h = 0; h < H + KVH; h++) {
            const float *x = row + (size_t)h * HEAD_DIM;
            float *dst = h < H ? q_out + ((size_t)i * H + h) * HEAD_DIM
                               : k + (size_t)slots[i] * ts + (size_t)(h - H) * hs;
            const __m512 lo0 = _mm512_loadu_ps(x), lo1 = _mm512_loadu_ps(x + 16);
            const __m512 hi0 = _mm512_loadu_ps(x + half), hi1 = _mm512_loadu_ps(x + half + 16);
            _mm512_storeu_ps(dst, _mm512_fnmadd_ps(hi0, s0, _mm512_mul_ps(lo0, c0)));
            _mm512_storeu_ps(dst + 16, _mm512_fnmadd_ps(hi1, s1, _mm512_mul_ps(lo1, c1)));
            _mm512_storeu_ps(dst + half, _mm512_fmadd_ps(lo0, s0, _mm512_mul_ps(hi0, c0)));
            _mm512_storeu_ps(dst + half + 16, _mm512_fmadd_ps(lo1, s1, _mm512_mul_ps(hi1, c1)));
        }
        for (int j = 0; j < KVH; j++)
            memcpy(v + (size_t)slots[i] * ts + (size_t)j * hs, row + (size_t)(H + KVH + j) * HEAD_DIM,
                   sizeof(float) * HEAD_DIM);
    }
}

/* y [M][F] = silu(g) * u for gate_up [M][2F] (row stride ld; g its first F columns, u the rest),
   F a multiple of 16. silu(g) = g * sigmoid(g), the sigmoid from e^-|g| (no overflow either way). */
AVX512 void swiglu(const float *gate_up, int ld, int M, int F, float *y, int ldy, int threads) {
    const __m512 one = _mm512_set1_ps(1.0f);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int r = 0; r < M; r++) {
        const float *g = gate_up + (size_t)r * ld, *u = g + F;
        float *out = y + (size_t)r * ldy;
        for (int c = 0; c < F; c += 16) {
            const __m512 x = _mm512_loadu_ps(g + c);
            const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
            const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
            const __m512 sigmoid = _mm512_div_ps(_mm512_mask_blend_ps(negative, one, e), _mm512_add_ps(one, e));
            _mm512_storeu_ps(out + c, _mm512_mul_ps(_mm512_mul_ps(x, sigmoid), _mm512_loadu_ps(u + c)));
        }
    }
}

/* ---- Q4_1 interleaved by 16 outputs: products of any number of rows ----

   The same Q4_1 values laid out so that one 16-byte load holds two consecutive k of 16 outputs:
   qi [N/16][K/2][16], byte j of pair p of group G = q[16G + j][2p] | q[16G + j][2p + 1] << 4;
   d, m [N/16][K/32][16]. A tile keeps 16 outputs of each of its rows in one register, every weight
   unpacked once serves all of the tile's rows, and outputs leave as vector stores: no horizontal
   sums. Rows are multiplied in tiles of 16 (many rows: the weights are dequantized to fp32 in
   registers, w = d * q + m exactly as `gguf` computes it, then one FMA per row and weight) or of
   up to 4 rows over two groups (few rows, memory-bound: the scale and offset are applied once per
   block and row, d * sum(q x) + m * sum(x), so a weight costs one FMA and its unpacking). */

#define GROUP 16
#define MANY_ROWS 16
#define FEW_ROWS 4
#define FEW_GROUPS 2

/* x's rows in tiles of 16, transposed: xt[t][k][i] = x[16t + i][k] (zero past M), so a tile's 16
   values of one k share a cache line and the tile reads x front to back. A whole tile is moved
   by gathers, one k at a time (24 us for 16 x 1,536, against 48 element by element). */
AVX512 static float *transpose_tiles(const float *x, int ldx, int M, int K) {
    const int tiles = (M + MANY_ROWS - 1) / MANY_ROWS;
    float *xt = malloc(sizeof(float) * (size_t)tiles * K * MANY_ROWS);
    if (xt == NULL) return NULL;
    const __m512i rows_apart = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(ldx));
    for (int t = 0; t < tiles; t++) {
        const int rows = M - t * MANY_ROWS < MANY_ROWS ? M - t * MANY_ROWS : MANY_ROWS;
        const float *src = x + (size_t)t * MANY_ROWS * ldx;
        float *dst = xt + (size_t)t * K * MANY_ROWS;
        if (rows == MANY_ROWS && ldx <= (1 << 26)) { /* 15 rows apart fits the gather's int32 */
            for (int k = 0; k < K; k++) _mm512_storeu_ps(dst + (size_t)k * MANY_ROWS, _mm512_i32gather_ps(rows_apart, src + k, 4));
            continue;
        }
        memset(dst, 0, sizeof(float) * (size_t)K * MANY_ROWS);
        for (int r = 0; r < rows; r++)
            for (int k = 0; k < K; k++) dst[(size_t)k * MANY_ROWS + r] = src[(size_t)r * ldx + k];
    }
    return xt;
}

/* `rows` (<= 16) rows times the 16 outputs of one group. */
AVX512 INLINE void tile_many(const float *xt, int K, const uint8_t *q, const float *d, const float *m, float *y,
                             int ldy, int accumulate, const int rows) {
    __m512 acc[MANY_ROWS];
    for (int r = 0; r < MANY_ROWS; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < K / BLOCK; b++) {
        const __m512 db = _mm512_loadu_ps(d + (size_t)b * GROUP), mb = _mm512_loadu_ps(m + (size_t)b * GROUP);
        for (int p = 0; p < BLOCK / 2; p++) {
            const int k = b * BLOCK + 2 * p;
            __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + (size_t)k * (GROUP / 2))));
            __m512 w0 = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(15))), db), mb);
            __m512 w1 = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4)), db), mb);
            const float *x0 = xt + (size_t)k * MANY_ROWS, *x1 = x0 + MANY_ROWS;
            for (int r = 0; r < rows; r++) {
                acc[r] = _mm512_fmadd_ps(w0, _mm512_set1_ps(x0[r]), acc[r]);
                acc[r] = _mm512_fmadd_ps(w1, _mm512_set1_ps(x1[r]), acc[r]);
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        float *out = y + (size_t)r * ldy;
        __m512 sum = accumulate ? _mm512_add_ps(acc[r], _mm512_loadu_ps(out)) : acc[r];
        _mm512_storeu_ps(out, sum);
    }
}

/* `rows` (<= 4) rows times the 32 outputs of two groups; `sums` [rows][K/32]: each block's sum of x. */
AVX512 INLINE void tile_few(const float *x, int ldx, const float *sums, int K, const uint8_t *q, const float *d,
                            const float *m, size_t group_bytes, size_t group_scales, float *y, int ldy,
                            int accumulate, const int rows) {
    const int blocks = K / BLOCK;
    __m512 total[FEW_ROWS][FEW_GROUPS];
    for (int r = 0; r < FEW_ROWS; r++)
        for (int g = 0; g < FEW_GROUPS; g++) total[r][g] = _mm512_setzero_ps();
    for (int b = 0; b < blocks; b++) {
        __m512 dot[FEW_ROWS][FEW_GROUPS];
        for (int r = 0; r < FEW_ROWS; r++)
            for (int g = 0; g < FEW_GROUPS; g++) dot[r][g] = _mm512_setzero_ps();
        for (int p = 0; p < BLOCK / 2; p++) {
            const int k = b * BLOCK + 2 * p;
            for (int g = 0; g < FEW_GROUPS; g++) {
                __m512i bytes = _mm512_cvtepu8_epi32(
                    _mm_loadu_si128((const __m128i *)(q + g * group_bytes + (size_t)k * (GROUP / 2))));
                __m512 q0 = _mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(15)));
                __m512 q1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4));
                for (int r = 0; r < rows; r++) {
                    const float *xr = x + (size_t)r * ldx + k;
                    dot[r][g] = _mm512_fmadd_ps(q0, _mm512_set1_ps(xr[0]), dot[r][g]);
                    dot[r][g] = _mm512_fmadd_ps(q1, _mm512_set1_ps(xr[1]), dot[r][g]);
                }
            }
        }
        for (int g = 0; g < FEW_GROUPS; g++) {
            const __m512 db = _mm512_loadu_ps(d + g * group_scales + (size_t)b * GROUP);
            const __m512 mb = _mm512_loadu_ps(m + g * group_scales + (size_t)b * GROUP);
            for (int r = 0; r < rows; r++) {
                total[r][g] = _mm512_fmadd_ps(dot[r][g], db, total[r][g]);
                total[r][g] = _mm512_fmadd_ps(_mm512_set1_ps(sums[(size_t)r * blocks + b]), mb, total[r][g]);
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < FEW_GROUPS; g++) {
            float *out = y + (size_t)r * ldy + g * GROUP;
            __m512 sum = accumulate ? _mm512_add_ps(total[r][g], _mm512_loadu_ps(out)) : total[r][g];
            _mm512_storeu_ps(out, sum);
        }
}

/* y[r][n] (+)= sum_k x[r][k] * w[n][k] for the interleaved layout above; N a multiple of 32 when
   M <= 4, of 16 otherwise. Returns 0, -1 out of memory, -2 on a shape it does not take. */
AVX512 int q4_1_matmul(const float *x, int ldx, int M, int K, const uint8_t *qi, const float *d, const float *m,
                        int N, float *y, int ldy, int accumulate, int threads) {
    const size_t group_bytes = (size_t)K * (GROUP / 2), group_scales = (size_t)(K / BLOCK) * GROUP;
    if (M <= 0) return 0; /* a chunk with no row giving logits leaves the last layer none */
    if (M <= FEW_ROWS) {
        if (N % (GROUP * FEW_GROUPS) != 0) return -2;
        const int blocks = K / BLOCK;
        float sums[FEW_ROWS * 512];
        if (blocks > 512) return -2;
        for (int r = 0; r < M; r++)
            for (int b = 0; b < blocks; b++) {
                __m512 s = _mm512_add_ps(_mm512_loadu_ps(x + (size_t)r * ldx + b * BLOCK),
                                         _mm512_loadu_ps(x + (size_t)r * ldx + b * BLOCK + 16));
                sums[r * blocks + b] = _mm512_reduce_add_ps(s);
            }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 2)
        for (int G = 0; G < N / GROUP; G += FEW_GROUPS) {
            const uint8_t *q = qi + (size_t)G * group_bytes;
            const float *dg = d + (size_t)G * group_scales, *mg = m + (size_t)G * group_scales;
            float *yg = y + (size_t)G * GROUP;
            switch (M) {
            case 1: tile_few(x, ldx, sums, K, q, dg, mg, group_bytes, group_scales, yg, ldy, accumulate, 1); break;
            case 2: tile_few(x, ldx, sums, K, q, dg, mg, group_bytes, group_scales, yg, ldy, accumulate, 2); break;
            case 3: tile_few(x, ldx, sums, K, q, dg, mg, group_bytes, group_scales, yg, ldy, accumulate, 3); break;
            default: tile_few(x, ldx, sums, K, q, dg, mg, group_bytes, group_scales, yg, ldy, accumulate, 4); break;
            }
        }
        return 0;
    }
    if (N % GROUP != 0) return -2;
    float *xt = transpose_tiles(x, ldx, M, K);
    if (xt == NULL) return -1;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 2)
    for (int G = 0; G < N / GROUP; G++) {
        const uint8_t *q = qi + (size_t)G * group_bytes;
        const float *dg = d + (size_t)G * group_scales, *mg = m + (size_t)G * group_scales;
        for (int r0 = 0; r0 < M; r0 += MANY_ROWS) {
            const float *xr = xt + (size_t)r0 * K;
            float *yr = y + (size_t)r0 * ldy + (size_t)G * GROUP;
            const int rows = M - r0 < MANY_ROWS ? M - r0 : MANY_ROWS;
            switch (rows) {
#define TILE_CASE(n) case n: tile_many(xr, K, q, dg, mg, yr, ldy, accumulate, n); break;
            TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6) TILE_CASE(7)
            TILE_CASE(8) TILE_CASE(9) TILE_CASE(10) TILE_CASE(11) TILE_CASE(12) TILE_CASE(13) TILE_CASE(14)
            TILE_CASE(15) default: tile_many(xr, K, q, dg, mg, yr, ldy, accumulate, 16); break;
#undef TILE_CASE
            }
        }
    }
    free(xt);
    return 0;
}

/* ---- Q8_0 interleaved by 16 outputs: qi [N/16][K][16] int8, d [N/16][K/32][16] ---- */

AVX512 INLINE __m512 q8_values(const int8_t *q) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
}

/* `rows` (<= 16) rows times one group of 16 outputs, w = d * q dequantized in registers. */
AVX512 INLINE void q8_tile_many(const float *xt, int K, const int8_t *q, const float *d, float *y, int ldy,
                                const int rows) {
    __m512 acc[MANY_ROWS];
    for (int r = 0; r < MANY_ROWS; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < K / BLOCK; b++) {
        const __m512 db = _mm512_loadu_ps(d + (size_t)b * GROUP);
        for (int i = 0; i < BLOCK; i++) {
            const int k = b * BLOCK + i;
            const __m512 w = _mm512_mul_ps(q8_values(q + (size_t)k * GROUP), db);
            const float *xk = xt + (size_t)k * MANY_ROWS;
            for (int r = 0; r < rows; r++) acc[r] = _mm512_fmadd_ps(w, _mm512_set1_ps(xk[r]), acc[r]);
        }
    }
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(y + (size_t)r * ldy, acc[r]);
}

/* `rows` (<= 4) rows times two groups: d * sum(q x) per block and row. */
AVX512 INLINE void q8_tile_few(const float *x, int ldx, int K, const int8_t *q, const float *d, size_t group_bytes,
                               size_t group_scales, float *y, int ldy, const int rows) {
    __m512 total[FEW_ROWS][FEW_GROUPS];
    for (int r = 0; r < FEW_ROWS; r++)
        for (int g = 0; g < FEW_GROUPS; g++) total[r][g] = _mm512_setzero_ps();
    for (int b = 0; b < K / BLOCK; b++) {
        __m512 dot[FEW_ROWS][FEW_GROUPS];
        for (int r = 0; r < FEW_ROWS; r++)
            for (int g = 0; g < FEW_GROUPS; g++) dot[r][g] = _mm512_setzero_ps();
        for (int i = 0; i < BLOCK; i++) {
            const int k = b * BLOCK + i;
            for (int g = 0; g < FEW_GROUPS; g++) {
                const __m512 w = q8_values(q + g * group_bytes + (size_t)k * GROUP);
                for (int r = 0; r < rows; r++)
                    dot[r][g] = _mm512_fmadd_ps(w, _mm512_set1_ps(x[(size_t)r * ldx + k]), dot[r][g]);
            }
        }
        for (int g = 0; g < FEW_GROUPS; g++) {
            const __m512 db = _mm512_loadu_ps(d + g * group_scales + (size_t)b * GROUP);
            for (int r = 0; r < rows; r++) total[r][g] = _mm512_fmadd_ps(dot[r][g], db, total[r][g]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < FEW_GROUPS; g++) _mm512_storeu_ps(y + (size_t)r * ldy + g * GROUP, total[r][g]);
}

/* y[r][n] = sum_k x[r][k] * w[n][k] for the interleaved Q8_0 layout; N a multiple of 32.
   Returns 0, or -2 on a shape it does not take. */
AVX512 int q8_0_matmul(const float *x, int ldx, int M, int K, const int8_t *qi, const float *d, int N, float *y,
                        int ldy, int threads) {
    const size_t group_bytes = (size_t)K * GROUP, group_scales = (size_t)(K / BLOCK) * GROUP;
    if (N % (GROUP * FEW_GROUPS) != 0 || K % BLOCK != 0) return -2;
    if (M <= 0) return 0;
    if (M <= FEW_ROWS) {
#pragma omp parallel for num_threads(threads) schedule(dynamic, 2)
        for (int G = 0; G < N / GROUP; G += FEW_GROUPS) {
            const int8_t *q = qi + (size_t)G * group_bytes;
            const float *dg = d + (size_t)G * group_scales;
            float *yg = y + (size_t)G * GROUP;
            switch (M) {
            case 1: q8_tile_few(x, ldx, K, q, dg, group_bytes, group_scales, yg, ldy, 1); break;
            case 2: q8_tile_few(x, ldx, K, q, dg, group_bytes, group_scales, yg, ldy, 2); break;
            case 3: q8_tile_few(x, ldx, K, q, dg, group_bytes, group_scales, yg, ldy, 3); break;
            default: q8_tile_few(x, ldx, K, q, dg, group_bytes, group_scales, yg, ldy, 4); break;
            }
        }
        return 0;
    }
    float *xt = transpose_tiles(x, ldx, M, K);
    if (xt == NULL) return -1;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 2)
    for (int G = 0; G < N / GROUP; G++) {
        const int8_t *q = qi + (size_t)G * group_bytes;
        const float *dg = d + (size_t)G * group_scales;
        for (int r0 = 0; r0 < M; r0 += MANY_ROWS) {
            const float *xr = xt + (size_t)r0 * K;
            float *yr = y + (size_t)r0 * ldy + (size_t)G * GROUP;
            switch (M - r0 < MANY_ROWS ? M - r0 : MANY_ROWS) {
#define TILE_CASE(n) case n: q8_tile_many(xr, K, q, dg, yr, ldy, n); break;
            TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6) TILE_CASE(7)
            TILE_CASE(8) TILE_CASE(9) TILE_CASE(10) TILE_CASE(11) TILE_CASE(12) TILE_CASE(13) TILE_CASE(14)
            TILE_CASE(15) default: q8_tile_many(xr, K, q, dg, yr, ldy, 16); break;
#undef TILE_CASE
            }
        }
    }
    free(xt);
    return 0;
}

/* ---- Q4_1 weights times int8 activations (AVX-512 VNNI), for prompt chunks ----

   The weights, interleaved by 16 outputs for VNNI (`linear.interleave_q4_1_vnni`): wv
   [N/16][K/8][16][4] bytes, byte (4j + t) of chunk c of group G holding input 8c + t of output
   16G + j in its low nibble and input 8c + 4 + t in its high one; d, m as above. Each row of x is
   quantized per block of 32 inputs to int8 (scale max|x| / 127, rounded to nearest), as GGUF
   engines do for quantized products.
   vpdpbusd multiplies 4 unsigned weight nibbles by 4 signed activations per 32-bit lane, so one
   instruction does 64 multiply-adds where an fp32 FMA does 16. */

#define Q8_ROWS 8

int cpu_kernels_vnni(void) {
#ifdef RADIXGATE_PORTABLE
    return 1;
#else
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
#endif
}

/* x quantized, in tiles of Q8_ROWS rows laid out for the product (rows past M are zeros):
   qx [M/8][K/4][8][4]: for each 4 consecutive inputs, the 8 rows' 4 bytes side by side, so one
   pointer and constant offsets reach every row's broadcast; sx and sums [M/8][K/32][8]: each
   block's scale and the sum of its quantized values (scale times the integers' sum, as GGUF's Q8_1
   keeps it). The quantized sum, not x's exact one, goes with the offset: Q4_1's d * q is biased (q
   in 0..15, the offset m near -8d), so pairing the exact sum with m leaves d * q's rounding error
   uncancelled; measured on SmolLM2's layers, relative error 0.53 % against 0.99 % with the exact
   sum. (Rows kept apart, the tile's 8 row pointers and 16 scale pointers did not fit the
   registers: the loop reloaded them from the stack, and ran ~45 % slower than without its
   floating-point part.) */
VNNI static void quantize_tiles(const float *x, int ldx, int M, int K, int8_t *qx, float *sx, float *sums,
                                int threads) {
    const int blocks = K / BLOCK, tiles = (M + Q8_ROWS - 1) / Q8_ROWS;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int rt = 0; rt < tiles * Q8_ROWS; rt++) {
        const int t = rt / Q8_ROWS, lane = rt % Q8_ROWS;
        int8_t *tile = qx + (size_t)t * K * Q8_ROWS;
        float *tile_sx = sx + (size_t)t * blocks * Q8_ROWS, *tile_sums = sums + (size_t)t * blocks * Q8_ROWS;
        for (int b = 0; b < blocks; b++) {
            int32_t words[BLOCK / 4];
            float amax = 0.0f, sum = 0.0f;
            if (rt < M) {
                const float *src = x + (size_t)rt * ldx + b * BLOCK;
                const __m512 lo = _mm512_loadu_ps(src), hi = _mm512_loadu_ps(src + 16);
                amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
                const __m512 inverse = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
                const __m512i first = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inverse));
                const __m512i second = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inverse));
                _mm_storeu_si128((__m128i *)words, _mm512_cvtsepi32_epi8(first));
                _mm_storeu_si128((__m128i *)(words + 4), _mm512_cvtsepi32_epi8(second));
                sum = amax / 127.0f * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(first, second));
            } else {
                memset(words, 0, sizeof(words));
            }
            for (int g = 0; g < BLOCK / 4; g++)
                memcpy(tile + ((size_t)(b * (BLOCK / 4) + g) * Q8_ROWS + lane) * 4, &words[g], 4);
            tile_sx[(size_t)b * Q8_ROWS + lane] = amax / 127.0f;
            tile_sums[(size_t)b * Q8_ROWS + lane] = sum;
        }
    }
}

/* One tile of Q8_ROWS quantized rows (`quantize_tiles`) times the 16 outputs of one group; the
   first `rows` are stored. */
VNNI INLINE void tile_q8(const int8_t *qx, const float *sx, const float *sums, int K, const uint8_t *w,
                         const float *d, const float *m, float *y, int ldy, int accumulate, int rows) {
    const int blocks = K / BLOCK;
    const __m512i nibble = _mm512_set1_epi8(15);
    __m512 acc[Q8_ROWS];
    for (int r = 0; r < Q8_ROWS; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < blocks; b++) {
        __m512i dot[Q8_ROWS];
        for (int r = 0; r < Q8_ROWS; r++) dot[r] = _mm512_setzero_si512();
        const int8_t *xb = qx + (size_t)b * BLOCK * Q8_ROWS;
        for (int c = 0; c < BLOCK / 8; c++) {
            const __m512i v = _mm512_loadu_si512((const void *)(w + ((size_t)b * (BLOCK / 8) + c) * 64));
            const __m512i low = _mm512_and_si512(v, nibble);
            const __m512i high = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
            const int8_t *first = xb + (size_t)c * 2 * 4 * Q8_ROWS, *second = first + 4 * Q8_ROWS;
            for (int r = 0; r < Q8_ROWS; r++) {
                int32_t lo_inputs, hi_inputs;
                memcpy(&lo_inputs, first + 4 * r, 4);
                memcpy(&hi_inputs, second + 4 * r, 4);
                dot[r] = _mm512_dpbusd_epi32(dot[r], low, _mm512_set1_epi32(lo_inputs));
                dot[r] = _mm512_dpbusd_epi32(dot[r], high, _mm512_set1_epi32(hi_inputs));
            }
        }
        const __m512 db = _mm512_loadu_ps(d + (size_t)b * GROUP), mb = _mm512_loadu_ps(m + (size_t)b * GROUP);
        const float *sb = sx + (size_t)b * Q8_ROWS, *ub = sums + (size_t)b * Q8_ROWS;
        for (int r = 0; r < Q8_ROWS; r++) {
            const __m512 scale = _mm512_mul_ps(db, _mm512_set1_ps(sb[r]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), scale, acc[r]);
            acc[r] = _mm512_fmadd_ps(mb, _mm512_set1_ps(ub[r]), acc[r]);
        }
    }
    for (int r = 0; r < rows; r++) {
        float *out = y + (size_t)r * ldy;
        __m512 sum = accumulate ? _mm512_add_ps(acc[r], _mm512_loadu_ps(out)) : acc[r];
        _mm512_storeu_ps(out, sum);
    }
}

/* y[r][n] (+)= sum_k x[r][k] * w[n][k] with x quantized to int8 as above; N a multiple of 16, K of
   32. Returns 0, -1 out of memory, -2 on a shape it does not take. */
VNNI int q4_1_matmul_q8(const float *x, int ldx, int M, int K, const uint8_t *wv, const float *d, const float *m,
                         int N, float *y, int ldy, int accumulate, int threads) {
    if (M <= 0) return 0;
    if (N % GROUP != 0 || K % BLOCK != 0 || K <= 0) return -2;
    const int blocks = K / BLOCK, tiles = (M + Q8_ROWS - 1) / Q8_ROWS;
    const size_t group_bytes = (size_t)K * (GROUP / 2), group_scales = (size_t)blocks * GROUP;
    int8_t *qx = malloc((size_t)tiles * Q8_ROWS * K);
    float *sx = malloc(sizeof(float) * (size_t)tiles * Q8_ROWS * blocks);
    float *sums = malloc(sizeof(float) * (size_t)tiles * Q8_ROWS * blocks);
    if (qx == NULL || sx == NULL || sums == NULL) {
        free(qx);
        free(sx);
        free(sums);
        return -1;
    }
    quantize_tiles(x, ldx, M, K, qx, sx, sums, threads);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int G = 0; G < N / GROUP; G++) {
        const uint8_t *w = wv + (size_t)G * group_bytes;
        const float *dg = d + (size_t)G * group_scales, *mg = m + (size_t)G * group_scales;
        for (int t = 0; t < tiles; t++) {
            const int r0 = t * Q8_ROWS, rows = M - r0 < Q8_ROWS ? M - r0 : Q8_ROWS;
            tile_q8(qx + (size_t)t * K * Q8_ROWS, sx + (size_t)t * blocks * Q8_ROWS,
                    sums + (size_t)t * blocks * Q8_ROWS, K, w, dg, mg, y + (size_t)r0 * ldy + (size_t)G * GROUP,
                    ldy, accumulate, rows);
        }
    }
    free(qx);
    free(sx);
    free(sums);
    return 0;
}

/* ---- Prefill attention: a chunk's rows over their context, causally ----

   The context is `L` token slots in order (`slots`), the chunk's `n` rows its last n tokens: row i
   sees positions 0 .. L - n + i. Each KV head's keys are first copied transposed in blocks of 16
   tokens (kt [L/16][64][16]) and its values in order (vh [L][64]), so a query's 16 scores of a block
   are 64 FMAs into one register (no horizontal sums) and every later pass reads L1/L2-resident
   memory. Queries go in tiles of PF_QUERIES of one KV head's group (rows x the group's heads),
   attended PF_STEP keys at a time with the online softmax (FlashAttention's); a unit of work is
   PF_TILES tiles. Measured on the dev box (2 threads, 2,176-token context): 512 rows 17.9 ms
   (127 GFLOP/s), 128 rows 6.1 ms; torch's flash kernel over the same pages took 30-34 ms for 512. */

#define PF_BLOCK 16
#define PF_QUERIES 12
#define PF_PV 3
#define PF_STEP 64
#define PF_TILES 2

/* The 16 scores of PF_QUERIES queries (qs, pre-scaled) for keys first .. first + 15, stored to
   scores[j][at .. at + 15], with -inf where query j cannot see the key (position > limit[j]). */
AVX512 INLINE void pf_scores(const float *qs, const int *limit, int nq, int bottom, const float *kb, int first,
                             float (*scores)[PF_STEP], int at) {
    __m512 s[PF_QUERIES];
    for (int j = 0; j < PF_QUERIES; j++) s[j] = _mm512_setzero_ps();
    for (int d = 0; d < HEAD_DIM; d++) {
        const __m512 kd = _mm512_load_ps(kb + d * PF_BLOCK);
        for (int j = 0; j < PF_QUERIES; j++) s[j] = _mm512_fmadd_ps(_mm512_set1_ps(qs[j * HEAD_DIM + d]), kd, s[j]);
    }
    if (first + PF_BLOCK - 1 <= bottom) {
        for (int j = 0; j < nq; j++) _mm512_store_ps(scores[j] + at, s[j]);
        return;
    }
    const __m512i positions = _mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                               _mm512_set1_epi32(first));
    for (int j = 0; j < nq; j++) {
        const __mmask16 seen = _mm512_cmple_epi32_mask(positions, _mm512_set1_epi32(limit[j]));
        _mm512_store_ps(scores[j] + at, _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), seen, s[j]));
    }
}

/* Up to PF_QUERIES queries of one KV head (rows x the group's heads) and their online-softmax state. */
typedef struct {
    float qs[PF_QUERIES * HEAD_DIM] __attribute__((aligned(64))); /* pre-scaled, unused ones 0 */
    float o[PF_QUERIES * HEAD_DIM] __attribute__((aligned(64)));  /* unnormalized outputs */
    float p[PF_QUERIES][PF_STEP] __attribute__((aligned(64)));    /* a step's scores, then weights */
    float m[PF_QUERIES], l[PF_QUERIES];
    int limit[PF_QUERIES]; /* last position each query sees */
    float *rows[PF_QUERIES];
    int nq, top, bottom;
} PfTile;

AVX512 static void pf_begin(PfTile *tile) {
    tile->top = tile->bottom = tile->limit[0];
    for (int j = 0; j < tile->nq; j++) {
        tile->top = tile->limit[j] > tile->top ? tile->limit[j] : tile->top;
        tile->bottom = tile->limit[j] < tile->bottom ? tile->limit[j] : tile->bottom;
    }
    for (int j = 0; j < PF_QUERIES; j++) {
        tile->m[j] = -INFINITY;
        tile->l[j] = 0.0f;
    }
    memset(tile->p, 0, sizeof(tile->p)); /* the unused queries' weights stay 0 */
    memset(tile->o, 0, sizeof(tile->o));
}

/* One step of PF_STEP keys from `first` on: scores, then every query's maximum, rescale,
   exponentials and sum (each phase independent across the queries, so their latencies overlap),
   then the values. */
AVX512 static void pf_step(PfTile *tile, const float *kt, const float *vh, int first) {
    if (first > tile->top) return;
    const int nq = tile->nq;
    const int count = tile->top - first + 1 < PF_STEP ? (tile->top - first + PF_BLOCK) / PF_BLOCK : PF_STEP / PF_BLOCK;
    for (int c = 0; c < count; c++)
        pf_scores(tile->qs, tile->limit, nq, tile->bottom, kt + (size_t)(first / PF_BLOCK + c) * HEAD_DIM * PF_BLOCK,
                  first + c * PF_BLOCK, tile->p, c * PF_BLOCK);
    float peak[PF_QUERIES];
    for (int j = 0; j < nq; j++) {
        __m512 top_lanes = _mm512_load_ps(tile->p[j]);
        for (int c = 1; c < count; c++) top_lanes = _mm512_max_ps(top_lanes, _mm512_load_ps(tile->p[j] + c * PF_BLOCK));
        peak[j] = _mm512_reduce_max_ps(top_lanes);
    }
    for (int j = 0; j < nq; j++)
        if (peak[j] > tile->m[j]) {
            const float alpha = expf(tile->m[j] - peak[j]); /* 0 on the first step: m is -inf */
            const __m512 a = _mm512_set1_ps(alpha);
            float *oj = tile->o + j * HEAD_DIM;
            for (int c = 0; c < HEAD_DIM; c += 16) _mm512_store_ps(oj + c, _mm512_mul_ps(a, _mm512_load_ps(oj + c)));
            tile->l[j] *= alpha;
            tile->m[j] = peak[j];
        }
    for (int j = 0; j < nq; j++) {
        __m512 total = _mm512_setzero_ps();
        const __m512 mj = _mm512_set1_ps(tile->m[j]);
        for (int c = 0; c < count; c++) {
            const __m512 sj = _mm512_load_ps(tile->p[j] + c * PF_BLOCK);
            const __mmask16 seen = _mm512_cmp_ps_mask(sj, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
            const __m512 e = _mm512_maskz_mov_ps(seen, exp_nonpositive(_mm512_sub_ps(sj, mj)));
            total = _mm512_add_ps(total, e);
            _mm512_store_ps(tile->p[j] + c * PF_BLOCK, e);
        }
        tile->l[j] += _mm512_reduce_add_ps(total);
    }
    const float *vb = vh + (size_t)first * HEAD_DIM;
    const int keys = count * PF_BLOCK;
    for (int j0 = 0; j0 < nq; j0 += PF_PV) {
        __m512 acc[PF_PV][4];
        for (int i = 0; i < PF_PV; i++)
            for (int c = 0; c < 4; c++) acc[i][c] = _mm512_load_ps(tile->o + (j0 + i) * HEAD_DIM + c * 16);
        for (int t = 0; t < keys; t++) {
            const float *vt = vb + (size_t)t * HEAD_DIM;
            const __m512 v0 = _mm512_load_ps(vt), v1 = _mm512_load_ps(vt + 16), v2 = _mm512_load_ps(vt + 32),
                         v3 = _mm512_load_ps(vt + 48);
            for (int i = 0; i < PF_PV; i++) {
                const __m512 w = _mm512_set1_ps(tile->p[j0 + i][t]);
                acc[i][0] = _mm512_fmadd_ps(w, v0, acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(w, v1, acc[i][1]);
                acc[i][2] = _mm512_fmadd_ps(w, v2, acc[i][2]);
                acc[i][3] = _mm512_fmadd_ps(w, v3, acc[i][3]);
            }
        }
        for (int i = 0; i < PF_PV; i++)
            for (int c = 0; c < 4; c++) _mm512_store_ps(tile->o + (j0 + i) * HEAD_DIM + c * 16, acc[i][c]);
    }
}

AVX512 static void pf_finish(const PfTile *tile) {
    for (int j = 0; j < tile->nq; j++) {
        const __m512 inverse = _mm512_set1_ps(1.0f / tile->l[j]);
        for (int c = 0; c < HEAD_DIM; c += 16)
            _mm512_storeu_ps(tile->rows[j] + c, _mm512_mul_ps(inverse, _mm512_load_ps(tile->o + j * HEAD_DIM + c)));
    }
}

/* The calling thread's scratch for the transposed keys and values, kept between calls: allocated
   per call it was mapped fresh each time (above glibc's mmap threshold), and its page faults cost
   ~3 ms per layer at 2,176 tokens on the dev box, as much as 128 rows' attention. It grows to the
   longest context seen (6 MB at 4,096 tokens for 3 KV heads), which is also what a call holds,
   and is freed when the thread ends. */
typedef struct {
    float *data;
    size_t floats;
} Scratch;

static pthread_key_t pf_key;
static pthread_once_t pf_once = PTHREAD_ONCE_INIT;

static void pf_release(void *scratch) {
    free(((Scratch *)scratch)->data);
    free(scratch);
}

static void pf_make_key(void) { pthread_key_create(&pf_key, pf_release); }

static float *pf_buffer(size_t floats) {
    pthread_once(&pf_once, pf_make_key);
    Scratch *scratch = pthread_getspecific(pf_key);
    if (scratch == NULL) {
        scratch = calloc(1, sizeof(Scratch));
        if (scratch == NULL || pthread_setspecific(pf_key, scratch) != 0) {
            free(scratch);
            return NULL;
        }
    }
    if (floats > scratch->floats) {
        free(scratch->data);
        scratch->data = aligned_alloc(64, sizeof(float) * floats);
        scratch->floats = scratch->data == NULL ? 0 : floats;
    }
    return scratch->data;
}

/* q [n][H][64] (the chunk's rows), k/v the pool (slot s of KV head j at s * ts + j * hs), slots [L]
   the context in order, out [n][H * 64]. Returns 0, -1 out of memory, -2 on shapes it does not
   handle (head dimension not 64, more than PF_QUERIES heads per KV head, n > L). */
AVX512 int prefill_attention(const float *q, int n, int H, int KVH, int D, const float *k, const float *v, int ts,
                             int64_t hs, const int32_t *slots, int L, float scale, float *out, int threads) {
    if (D != HEAD_DIM || H % KVH != 0 || H / KVH > PF_QUERIES || n < 1 || n > L) return -2;
    const int groups = H / KVH, rows_per_tile = PF_QUERIES / groups;
    const int blocks = (L + PF_BLOCK - 1) / PF_BLOCK, padded = blocks * PF_BLOCK;
    const size_t head_floats = (size_t)padded * HEAD_DIM;
    float *kt = pf_buffer(2 * head_floats * KVH);
    if (kt == NULL) return -1;
    float *vh = kt + head_floats * KVH;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int hb = 0; hb < KVH * blocks; hb++) {
        const int h = hb / blocks, b = hb % blocks;
        float *kb = kt + h * head_floats + (size_t)b * HEAD_DIM * PF_BLOCK;
        float *vb = vh + h * head_floats + (size_t)b * PF_BLOCK * HEAD_DIM;
        for (int t = 0; t < PF_BLOCK; t++) {
            const int pos = b * PF_BLOCK + t;
            if (pos >= L) {
                for (int d = 0; d < HEAD_DIM; d++) kb[d * PF_BLOCK + t] = 0.0f;
                memset(vb + t * HEAD_DIM, 0, sizeof(float) * HEAD_DIM);
                continue;
            }
            const float *ks = k + (size_t)slots[pos] * ts + h * hs, *vs = v + (size_t)slots[pos] * ts + h * hs;
            for (int d = 0; d < HEAD_DIM; d++) kb[d * PF_BLOCK + t] = ks[d];
            memcpy(vb + t * HEAD_DIM, vs, sizeof(float) * HEAD_DIM);
        }
    }
    /* A unit of work is PF_TILES tiles of rows_per_tile rows: they take each step's keys and values
       in turn while those are in L1, so each is read from L2 once per PF_TILES tiles. */
    const int rows_per_unit = rows_per_tile * PF_TILES, units = (n + rows_per_unit - 1) / rows_per_unit;
    /* One KV head after another (its keys and values stay in cache), its last units first: they see
       the most keys, so dynamic scheduling ends with the short ones. */
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int u = 0; u < KVH * units; u++) {
        const int h = u / units, r0 = (units - 1 - u % units) * rows_per_unit;
        PfTile tiles[PF_TILES];
        int used = 0, top = 0;
        for (int t = 0; t < PF_TILES && r0 + t * rows_per_tile < n; t++, used++) {
            PfTile *tile = &tiles[t];
            memset(tile->qs, 0, sizeof(tile->qs));
            tile->nq = 0;
            for (int r = r0 + t * rows_per_tile; r < r0 + (t + 1) * rows_per_tile && r < n; r++)
                for (int g = 0; g < groups; g++, tile->nq++) {
                    const int head = h * groups + g;
                    const float *src = q + ((size_t)r * H + head) * HEAD_DIM;
                    for (int d = 0; d < HEAD_DIM; d++) tile->qs[tile->nq * HEAD_DIM + d] = src[d] * scale;
                    tile->limit[tile->nq] = L - n + r;
                    tile->rows[tile->nq] = out + (size_t)r * H * HEAD_DIM + (size_t)head * HEAD_DIM;
                }
            pf_begin(tile);
            top = tile->top > top ? tile->top : top;
        }
        for (int first = 0; first <= top; first += PF_STEP)
            for (int t = 0; t < used; t++) pf_step(&tiles[t], kt + h * head_floats, vh + h * head_floats, first);
        for (int t = 0; t < used; t++) pf_finish(&tiles[t]);
    }
    return 0;
}
