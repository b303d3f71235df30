/* A linear layer for a few rows, in AVX2 (with FMA and F16C; several rows in AVX-512 where the CPU
   has it, below): y = x @ W.T + bias.

   x [rows, in] float32, bias [out] float32 (or NULL), y [rows, out] float32. The weight W [out, in]
   (float16, float32 or int8) comes packed in panels of 16 output rows: panel p holds
   W[16p : 16p + 16, :] transposed, [in][16] (gpt2/speed/native.py's pack_panels; the last panel padded
   with zeros).

   int8 weights are per-channel: W = q * scale[out]. Their output is the float32 sum of q * x (x as
   given, in float32), times the channel's float32 scale, then the bias: nothing is rounded to 16
   bits, so the logits of an int8 head keep float32's precision (gpt2/speed/fast_linear.py's
   NativeInt8Linear; this is the int8 format's one computation, gpt2/speed/kernels.py).
   gpt2/speed/native.py compiles this file with the machine's C compiler and calls it through ctypes;
   gpt2/speed/fast_linear.py's NativeRowsLinear and NativeInt8Linear are the Python side.

   Why our own: a decode step (1 row) and a verification (gamma + 1 rows) each read every weight
   once from memory, so both should cost about the same. Library kernels are written for large
   matrices; for a few rows some read the weight once per row or per few rows, or run other code
   for each row count. Here each panel is streamed from memory once, front to back, and serves
   every row: for each input k, its 16 weights (two 8-lane vectors) are multiplied by x[r][k] of
   each row r and added into that row's 16 outputs, kept in registers (up to 6 rows at a time;
   more rows take more passes over the panel, from the cache; a decode step reads four panels at
   once).

   Each output is one running sum over k = 0, 1, ..., in - 1 in that order, in its own lane, then
   the bias: no other row, no tiling and no thread count changes it. So a row's result is
   bit-identical whether it comes alone (a decode step) or among others (a verification): greedy
   speculative decoding on this kernel computes what plain greedy decoding computes.

   The panels are shared among `threads` OpenMP threads (PyTorch's own OpenMP runtime, loaded
   first, so the two share one pool of threads). */

#include <immintrin.h>
#include <stdint.h>

#define PANEL 16
#define MAX_ROWS 6
/* Several rows: ask for the weights this far ahead of the ones in use. With the arithmetic of
   several rows between two reads, the CPU's own prefetcher alone leaves the loop waiting on
   memory and then memory waiting on the loop; asked ahead, the two overlap. (A decode step has
   little arithmetic per read, and the CPU's prefetcher keeps up.) */
#ifndef AHEAD_BYTES
#define AHEAD_BYTES 8192
#endif

#define LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define LOAD_F32(p) _mm256_loadu_ps(p)
/* 8 int8 weights as 8 floats (exact: integers up to 127) */
#define LOAD_I8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))

/* One panel (weights [in][16]) against R input rows (x, `in` apart), R <= MAX_ROWS, into
   y[r * out + n] for the panel's `width` real outputs n. Called with a constant R, so the
   untaken rows' code is dropped, and each row's two accumulators are named variables (arrays of
   them are kept in memory by some compilers), which stay in registers. */
#define ROW_STEP(r)                                                                              \
    if (R > r) {                                                                                 \
        __m256 xk = _mm256_broadcast_ss(x + r * in + k);                                         \
        lo##r = _mm256_fmadd_ps(w_lo, xk, lo##r);                                                \
        hi##r = _mm256_fmadd_ps(w_hi, xk, hi##r);                                                \
    }
#define ROW_STORE(r)                                                                             \
    if (R > r) {                                                                                 \
        float sums[PANEL];                                                                       \
        _mm256_storeu_ps(sums, lo##r);                                                           \
        _mm256_storeu_ps(sums + 8, hi##r);                                                       \
        for (int n = 0; n < width; n++) y[r * out + n] = sums[n];                                \
    }

#ifndef __AVX512F__
#define PANEL_ROWS(NAME, WTYPE, LOAD)                                                             \
static inline __attribute__((always_inline)) void NAME(                                          \
        const WTYPE *panel, const float *x, const int R, int64_t in, float *y, int64_t out, int width) { \
    __m256 lo0, hi0, lo1, hi1, lo2, hi2, lo3, hi3, lo4, hi4, lo5, hi5;                           \
    lo0 = hi0 = lo1 = hi1 = lo2 = hi2 = lo3 = hi3 = lo4 = hi4 = lo5 = hi5 = _mm256_setzero_ps(); \
    for (int64_t k = 0; k < in; k++) {                                                           \
        _mm_prefetch((const char *)(panel + k * PANEL) + AHEAD_BYTES, _MM_HINT_T0);              \
        __m256 w_lo = LOAD(panel + k * PANEL), w_hi = LOAD(panel + k * PANEL + 8);               \
        ROW_STEP(0) ROW_STEP(1) ROW_STEP(2) ROW_STEP(3) ROW_STEP(4) ROW_STEP(5)                  \
    }                                                                                            \
    ROW_STORE(0) ROW_STORE(1) ROW_STORE(2) ROW_STORE(3) ROW_STORE(4) ROW_STORE(5)                \
}

PANEL_ROWS(panel_rows_f16, uint16_t, LOAD_F16)
PANEL_ROWS(panel_rows_f32, float, LOAD_F32)
PANEL_ROWS(panel_rows_i8, int8_t, LOAD_I8)
#else
/* Built with AVX-512 (gpt2/speed/native.py does where the CPU has it): a panel's 16 weights of one input
   are one 16-lane vector, so each input costs one conversion and one multiply-add per row where
   AVX2 takes two of each; several rows are bound by that arithmetic, not by memory. Each lane
   computes what the AVX2 lane of the same output computes, in the same order: the same bits. */
#define LOAD16_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define LOAD16_F32(p) _mm512_loadu_ps(p)
#define LOAD16_I8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#define ROW_STEP16(r)                                                                            \
    if (R > r) acc##r = _mm512_fmadd_ps(w, _mm512_set1_ps(x[r * in + k]), acc##r);
#define ROW_STORE16(r)                                                                           \
    if (R > r) {                                                                                 \
        float sums[PANEL];                                                                       \
        _mm512_storeu_ps(sums, acc##r);                                                          \
        for (int n = 0; n < width; n++) y[r * out + n] = sums[n];                                \
    }

#define PANEL_ROWS(NAME, WTYPE, LOAD)                                                             \
static inline __attribute__((always_inline)) void NAME(                                          \
        const WTYPE *panel, const float *x, const int R, int64_t in, float *y, int64_t out, int width) { \
    __m512 acc0, acc1, acc2, acc3, acc4, acc5;                                                   \
    acc0 = acc1 = acc2 = acc3 = acc4 = acc5 = _mm512_setzero_ps();                              \
    for (int64_t k = 0; k < in; k++) {                                                           \
        _mm_prefetch((const char *)(panel + k * PANEL) + AHEAD_BYTES, _MM_HINT_T0);              \
        __m512 w = LOAD(panel + k * PANEL);                                                      \
        ROW_STEP16(0) ROW_STEP16(1) ROW_STEP16(2) ROW_STEP16(3) ROW_STEP16(4) ROW_STEP16(5)      \
    }                                                                                            \
    ROW_STORE16(0) ROW_STORE16(1) ROW_STORE16(2) ROW_STORE16(3) ROW_STORE16(4) ROW_STORE16(5)    \
}

PANEL_ROWS(panel_rows_f16, uint16_t, LOAD16_F16)
PANEL_ROWS(panel_rows_f32, float, LOAD16_F32)
PANEL_ROWS(panel_rows_i8, int8_t, LOAD16_I8)
#endif

/* One row against four neighbouring panels at once (a decode step): a single panel's two running
   sums would wait on their own additions, not on memory; four panels give eight independent sums
   and four streams of memory. Each output's sum is the same as panel_rows' (same order over k). */
#define FOUR_PANELS_ONE_ROW(NAME, WTYPE, LOAD)                                                     \
static inline void NAME(const WTYPE *panel, const float *x, int64_t in, float *y) {              \
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0; \
    const WTYPE *pb = panel + in * PANEL, *pc = pb + in * PANEL, *pd = pc + in * PANEL;          \
    for (int64_t k = 0; k < in; k++) {                                                           \
        __m256 xk = _mm256_broadcast_ss(x + k);                                                  \
        a0 = _mm256_fmadd_ps(LOAD(panel + k * PANEL), xk, a0);                                   \
        a1 = _mm256_fmadd_ps(LOAD(panel + k * PANEL + 8), xk, a1);                               \
        b0 = _mm256_fmadd_ps(LOAD(pb + k * PANEL), xk, b0);                                      \
        b1 = _mm256_fmadd_ps(LOAD(pb + k * PANEL + 8), xk, b1);                                  \
        c0 = _mm256_fmadd_ps(LOAD(pc + k * PANEL), xk, c0);                                      \
        c1 = _mm256_fmadd_ps(LOAD(pc + k * PANEL + 8), xk, c1);                                  \
        d0 = _mm256_fmadd_ps(LOAD(pd + k * PANEL), xk, d0);                                      \
        d1 = _mm256_fmadd_ps(LOAD(pd + k * PANEL + 8), xk, d1);                                  \
    }                                                                                            \
    _mm256_storeu_ps(y, a0); _mm256_storeu_ps(y + 8, a1);                                        \
    _mm256_storeu_ps(y + 16, b0); _mm256_storeu_ps(y + 24, b1);                                  \
    _mm256_storeu_ps(y + 32, c0); _mm256_storeu_ps(y + 40, c1);                                  \
    _mm256_storeu_ps(y + 48, d0); _mm256_storeu_ps(y + 56, d1);                                  \
}

FOUR_PANELS_ONE_ROW(four_panels_one_row_f16, uint16_t, LOAD_F16)
FOUR_PANELS_ONE_ROW(four_panels_one_row_f32, float, LOAD_F32)
FOUR_PANELS_ONE_ROW(four_panels_one_row_i8, int8_t, LOAD_I8)

/* Outputs o0 .. o1 - 1 of one row, once their sums are done: int8's scale (NULL: none), then the
   bias (NULL: none), each one float32 operation. */
static inline void finish(float *y, const float *scale, const float *bias, int64_t o0, int64_t o1) {
    if (scale)
        for (int64_t o = o0; o < o1; o++) y[o] = y[o] * scale[o];
    if (bias)
        for (int64_t o = o0; o < o1; o++) y[o] += bias[o];
}

/* Panel p against every row, up to MAX_ROWS at a time through panel_rows (a constant R per call),
   then finish. */
#define ONE_PANEL(NAME, PANEL_ROWS_FN, WTYPE)                                                     \
static inline void NAME(const float *x, int64_t rows, int64_t in, const WTYPE *w, int64_t out,   \
                        const float *scale, const float *bias, float *y, int64_t p) {            \
    const WTYPE *panel = w + p * in * PANEL;                                                     \
    int64_t o = p * PANEL;                                                                       \
    int width = out - o < PANEL ? (int)(out - o) : PANEL;                                        \
    for (int64_t r = 0; r < rows; r += MAX_ROWS) {                                               \
        const float *xr = x + r * in;                                                            \
        float *yr = y + r * out + o;                                                             \
        switch (rows - r < MAX_ROWS ? rows - r : MAX_ROWS) {                                     \
            case 1: PANEL_ROWS_FN(panel, xr, 1, in, yr, out, width); break;                      \
            case 2: PANEL_ROWS_FN(panel, xr, 2, in, yr, out, width); break;                      \
            case 3: PANEL_ROWS_FN(panel, xr, 3, in, yr, out, width); break;                      \
            case 4: PANEL_ROWS_FN(panel, xr, 4, in, yr, out, width); break;                      \
            case 5: PANEL_ROWS_FN(panel, xr, 5, in, yr, out, width); break;                      \
            default: PANEL_ROWS_FN(panel, xr, 6, in, yr, out, width); break;                     \
        }                                                                                        \
    }                                                                                            \
    for (int64_t r = 0; r < rows; r++)                                                           \
        finish(y + r * out, scale, bias, o, o + width);                                          \
}

ONE_PANEL(one_panel_f16, panel_rows_f16, uint16_t)
ONE_PANEL(one_panel_f32, panel_rows_f32, float)
ONE_PANEL(one_panel_i8, panel_rows_i8, int8_t)

/* The entry points. One row (a decode step): whole groups of four panels, then the up to three
   panels left (the last one may be partial). Several rows: panel by panel. scale: int8's [out]
   (the float and half entries pass NULL). Returns 0. */
#define ROWS_LINEAR(NAME, ONE_PANEL_FN, FOUR_FN, WTYPE)                                           \
int NAME(const float *x, int64_t rows, int64_t in, const WTYPE *w, int64_t out,                  \
         const float *scale, const float *bias, float *y, int threads) {                         \
    int64_t panels = (out + PANEL - 1) / PANEL;                                                  \
    int64_t fours = rows == 1 ? out / (4 * PANEL) : 0;                                           \
    int64_t units = fours + panels - 4 * fours;                                                  \
    _Pragma("omp parallel for schedule(static) num_threads(threads)")                            \
    for (int64_t u = 0; u < units; u++) {                                                        \
        if (u < fours) {                                                                         \
            FOUR_FN(w + 4 * u * in * PANEL, x, in, y + 4 * u * PANEL);                           \
            finish(y, scale, bias, 4 * u * PANEL, (4 * u + 4) * PANEL);                          \
        } else {                                                                                 \
            ONE_PANEL_FN(x, rows, in, w, out, scale, bias, y, u + 3 * fours);                    \
        }                                                                                        \
    }                                                                                            \
    return 0;                                                                                    \
}

ROWS_LINEAR(rows_linear_f16, one_panel_f16, four_panels_one_row_f16, uint16_t)
ROWS_LINEAR(rows_linear_f32, one_panel_f32, four_panels_one_row_f32, float)
ROWS_LINEAR(rows_linear_i8, one_panel_i8, four_panels_one_row_i8, int8_t)
