/* The portable build of cpu_kernels.c (`kernels.load_kernel(..., portable=True)`): the same source
   compiled against SIMDe (SIMD Everywhere, the `simde-py` package's headers), which implements the
   AVX-512 intrinsics with whatever the host has (AVX2 here), so the kernels build and run on any
   x86-64 CPU. It exists so the kernels' tests run on every host; on a CPU without AVX-512 it is
   slower than torch's path (measured in benchmarks/results/engine_quantized.md), so the engine
   never serves with it.

   SIMDe 0.8.2 lacks a few intrinsics the kernels use, and its masked store writes zeros to the
   lanes outside the mask; those are defined below from intrinsics it has. */

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#define AVX512
#define VNNI

static inline float portable_reduce_add_ps(__m512 a) {
    __m256 half = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m128 quarter = _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
    quarter = _mm_add_ps(quarter, _mm_movehl_ps(quarter, quarter));
    return _mm_cvtss_f32(_mm_add_ss(quarter, _mm_movehdup_ps(quarter)));
}

static inline int portable_reduce_add_epi32(__m512i a) {
    __m256i half = _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti32x8_epi32(a, 1));
    __m128i quarter = _mm_add_epi32(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
    quarter = _mm_add_epi32(quarter, _mm_shuffle_epi32(quarter, 0x4e));
    quarter = _mm_add_epi32(quarter, _mm_shuffle_epi32(quarter, 0xb1));
    return _mm_cvtsi128_si32(quarter);
}

static inline __m512i portable_cvtepu8_epi32(__m128i a) {
    return _mm512_inserti32x8(_mm512_castsi256_si512(_mm256_cvtepu8_epi32(a)),
                              _mm256_cvtepu8_epi32(_mm_srli_si128(a, 8)), 1);
}

static inline __m512i portable_cvtepi8_epi32(__m128i a) {
    return _mm512_inserti32x8(_mm512_castsi256_si512(_mm256_cvtepi8_epi32(a)),
                              _mm256_cvtepi8_epi32(_mm_srli_si128(a, 8)), 1);
}

static inline void portable_mask_storeu_ps(void *to, __mmask16 mask, __m512 a) {
    float lanes[16];
    _mm512_storeu_ps(lanes, a);
    for (int i = 0; i < 16; i++)
        if (mask >> i & 1) ((float *)to)[i] = lanes[i];
}

/* Undefined first: a later SIMDe may alias some of these itself. */
#undef _mm512_reduce_add_ps
#undef _mm512_reduce_add_epi32
#undef _mm512_cvtepu8_epi32
#undef _mm512_cvtepi8_epi32
#undef _mm512_mask_storeu_ps
#define _mm512_reduce_add_ps portable_reduce_add_ps
#define _mm512_reduce_add_epi32 portable_reduce_add_epi32
#define _mm512_cvtepu8_epi32 portable_cvtepu8_epi32
#define _mm512_cvtepi8_epi32 portable_cvtepi8_epi32
#define _mm512_mask_storeu_ps portable_mask_storeu_ps
