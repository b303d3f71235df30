/* A linear layer for a few rows, in AVX2 (with FMA and F16C): y = x @ W.T + bias.

   x [rows, in] float32, W [out, in] float16 or float32, bias [out] float32 (or NULL), y [rows, out]
   float32. gpt2/native.py compiles this file with the machine's C compiler and calls it through
   ctypes; gpt2/fast_linear.py's NativeRowsLinear is the Python side.

   Why our own: a decode step (1 row) and a verification (gamma + 1 rows) each read every weight
   once from memory, so both should cost about the same. Library kernels are written for large
   matrices; for a few rows some read the weight once per row or per few rows, or run other code
   for each row count. Here each output row's weights are read from memory once, then dotted with
   every input row while they sit in the L1 cache.

   Each dot product is summed in one fixed order, whatever `rows` is: four 8-lane accumulators
   over blocks of 32 inputs, then 8-input blocks into the first, added up as
   (a0 + a1) + (a2 + a3), the 8 lanes in a fixed tree, then the remaining inputs one by one, then
   the bias. So a row's result is bit-identical whether it comes alone (a decode step) or among
   others (a verification): greedy speculative decoding on this kernel computes what plain greedy
   decoding computes.

   The output rows are shared among `threads` OpenMP threads (PyTorch's own OpenMP runtime, which
   is loaded first, so the two share one pool of threads). */

#include <immintrin.h>
#include <stdint.h>

#define LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define LOAD_F32(p) _mm256_loadu_ps(p)

static inline float sum_lanes(__m256 v) {
    __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    half = _mm_add_ps(half, _mm_movehl_ps(half, half));
    half = _mm_add_ss(half, _mm_movehdup_ps(half));
    return _mm_cvtss_f32(half);
}

static inline float to_float_f16(const uint16_t *p) { return _cvtsh_ss(*p); }
static inline float to_float_f32(const float *p) { return *p; }

/* One output row against R input rows (R = 1 or 2: eight accumulators at most, which with the
   loaded weights stay in AVX2's sixteen registers). */
#define DOT_ROWS(NAME, WTYPE, LOAD, TO_FLOAT)                                                     \
static inline __attribute__((always_inline)) void NAME(                                          \
        const WTYPE *w, const float *x, int64_t in, int64_t R, float *out, int64_t out_stride) {  \
    __m256 a[2][4];                                                                              \
    for (int r = 0; r < 2; r++)                                                                  \
        for (int k = 0; k < 4; k++) a[r][k] = _mm256_setzero_ps();                               \
    int64_t i = 0;                                                                               \
    for (; i + 32 <= in; i += 32) {                                                              \
        __m256 w0 = LOAD(w + i), w1 = LOAD(w + i + 8), w2 = LOAD(w + i + 16), w3 = LOAD(w + i + 24); \
        for (int r = 0; r < R; r++) {                                                            \
            const float *xr = x + r * in + i;                                                    \
            a[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr), a[r][0]);                         \
            a[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr + 8), a[r][1]);                     \
            a[r][2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xr + 16), a[r][2]);                    \
            a[r][3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xr + 24), a[r][3]);                    \
        }                                                                                        \
    }                                                                                            \
    for (; i + 8 <= in; i += 8) {                                                                \
        __m256 w0 = LOAD(w + i);                                                                 \
        for (int r = 0; r < R; r++)                                                              \
            a[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * in + i), a[r][0]);             \
    }                                                                                            \
    for (int r = 0; r < R; r++) {                                                                \
        float s = sum_lanes(_mm256_add_ps(_mm256_add_ps(a[r][0], a[r][1]),                       \
                                          _mm256_add_ps(a[r][2], a[r][3])));                     \
        for (int64_t j = i; j < in; j++) s += TO_FLOAT(w + j) * x[r * in + j];                    \
        out[r * out_stride] = s;                                                                 \
    }                                                                                            \
}

#define ROWS_LINEAR(NAME, DOT, WTYPE)                                                             \
void NAME(const float *x, int64_t rows, int64_t in, const WTYPE *w, int64_t out,                 \
          const float *bias, float *y, int threads) {                                            \
    _Pragma("omp parallel for schedule(static) num_threads(threads)")                            \
    for (int64_t o = 0; o < out; o++) {                                                          \
        const WTYPE *wo = w + o * in;                                                            \
        for (int64_t r = 0; r < rows; r += 2) {                                                  \
            if (rows - r >= 2) DOT(wo, x + r * in, in, 2, y + r * out + o, out);                 \
            else DOT(wo, x + r * in, in, 1, y + r * out + o, out);                               \
        }                                                                                        \
        if (bias)                                                                                \
            for (int64_t r = 0; r < rows; r++) y[r * out + o] += bias[o];                        \
    }                                                                                            \
}

DOT_ROWS(dot_rows_f16, uint16_t, LOAD_F16, to_float_f16)
DOT_ROWS(dot_rows_f32, float, LOAD_F32, to_float_f32)
ROWS_LINEAR(rows_linear_f16, dot_rows_f16, uint16_t)
ROWS_LINEAR(rows_linear_f32, dot_rows_f32, float)
