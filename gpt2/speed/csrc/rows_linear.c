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

/* ---------------------------------------------------------------------------------------------
   w8a8: int8 weights AND int8 activations, integer dot products (gpt2/speed/fast_linear.py's
   NativeW8A8Linear; the "w8a8" format).

   The int8 kernel above converts every weight to float32 and multiplies it by a float32 input:
   per weight a conversion and a multiply-add per row, so a verification's rows cost arithmetic,
   not only the weight's byte. Here each input row is rounded to int8 too, in blocks of QBLOCK
   inputs, each block with its own float32 scale (a block's largest |x| / 127), and the products
   are integer dot products: 4 weights by 4 inputs into one 32-bit sum per instruction with
   AVX512-VNNI or AVX-VNNI (vpdpbusd, 16 or 8 lanes), 2 by 2 with AVX2 (vpmaddwd) otherwise.

   The computation, for row r and output o (fast_linear.w8a8_reference writes it out in PyTorch,
   tests/test_w8a8.py holds this kernel to it):
     xs[b]   = max |x[k]| over block b / 127                      (float32; 0 for an all-zero block)
     xq[k]   = round-half-even(x[k] / xs[b]), in [-127, 127]      (0 where xs[b] is 0)
     s[b]    = sum over k in block b of q[o][k] * xq[k]            (exact, in integers)
     acc     = (((0 + float(s[0]) * xs[0]) + float(s[1]) * xs[1]) + ...)   (float32, blocks in order,
                                                                   a multiply then an add, not fused)
     y[r][o] = acc * scale[o] + bias[o]                            (float32, as the int8 kernel)
   Each block's sum is exact whatever instructions compute it, and the float32 steps run in one
   fixed order per output: every build gives the same bits, and a row the same bits
   alone as among others.

   Layout: vpdpbusd multiplies unsigned bytes by signed ones, so the weights are stored as
   q + 128 (1 .. 255, unsigned) and the inputs stay signed: sum (q + 128) xq = sum q xq + 128 sum xq,
   and the second term, one number per row and block, is subtracted. A panel is 16 outputs by the
   inputs in quads: [in4 / 4][16][4] bytes (in4: `in` rounded up to a multiple of 4, the padding
   weights 128, i.e. q = 0), so one 64-byte load holds 4 inputs of all 16 outputs
   (gpt2/speed/native.py's pack_quad_panels). */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define QBLOCK 32

/* The inputs as int8 in blocks (xq: in4 values a row, padding 0), with each block's scale and
   128 * (sum of its xq). AVX2's build keeps xq as int16 (what vpmaddwd multiplies). */
#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
typedef int8_t xq_t;
#else
typedef int16_t xq_t;
#endif

/* Block b of row r (QBLOCK inputs from k0 = b * QBLOCK; the last one may be partial, and the
   inputs from `in` to in4 are padding, 0). A whole block in vector code, a partial one element by
   element: the same operations (a correctly rounded division, rounding half to even, the clamp). */
static inline void quantize_block(const float *xr, int64_t in, int64_t in4, int64_t b, xq_t *xq, float *xs,
                                  int32_t *xcorr) {
    int64_t k0 = b * QBLOCK, k1 = k0 + QBLOCK < in ? k0 + QBLOCK : in;
    int32_t q[QBLOCK] = {0}, sum = 0;
    float amax = 0.0f, s;
    if (k1 - k0 == QBLOCK) {
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 x0 = _mm256_loadu_ps(xr + k0), x1 = _mm256_loadu_ps(xr + k0 + 8);
        __m256 x2 = _mm256_loadu_ps(xr + k0 + 16), x3 = _mm256_loadu_ps(xr + k0 + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, x0), _mm256_andnot_ps(sign, x1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, x2), _mm256_andnot_ps(sign, x3)));
        float lanes[8];
        _mm256_storeu_ps(lanes, m);
        for (int i = 0; i < 8; i++) amax = fmaxf(amax, lanes[i]);
        s = amax / 127.0f;
        if (s > 0.0f) {
            const __m256 sv = _mm256_set1_ps(s), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
            __m256 v[4] = {x0, x1, x2, x3};
            for (int i = 0; i < 4; i++) {
                __m256 r = _mm256_round_ps(_mm256_div_ps(v[i], sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                _mm256_storeu_si256((__m256i *)(q + 8 * i), _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(r, hi), lo)));
            }
        }
    } else {
        for (int64_t k = k0; k < k1; k++) amax = fmaxf(amax, fabsf(xr[k]));
        s = amax / 127.0f;
        for (int64_t k = k0; k < k1 && s > 0.0f; k++) {
            float v = nearbyintf(xr[k] / s);  /* the default rounding: half to even */
            q[k - k0] = v > 127.0f ? 127 : (v < -127.0f ? -127 : (int32_t)v);
        }
    }
    int64_t n = k0 + QBLOCK < in4 ? QBLOCK : in4 - k0;
    for (int64_t i = 0; i < n; i++) {
        xq[k0 + i] = (xq_t)q[i];
        sum += q[i];
    }
    *xs = s;
    *xcorr = 128 * sum;
}

#define W8_MAX_ROWS 6

/* The 8-lane builds' end of a block (AVX-VNNI and AVX2 alike): row r's integer sums of outputs
   0-7 (lo) and 8-15 (hi), less the offset's term, times the block's scale, added to the row's
   float32 sums flo[r], fhi[r]; then the row's outputs stored. */
#define W8_FLOAT_STEP8(r, lo, hi)                                                                \
    {                                                                                            \
        __m256i corr = _mm256_set1_epi32(xcorr[r * blocks + b]);                                 \
        __m256 sc = _mm256_set1_ps(xs[r * blocks + b]);                                          \
        flo[r] = _mm256_add_ps(flo[r], _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(lo, corr)), sc)); \
        fhi[r] = _mm256_add_ps(fhi[r], _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(hi, corr)), sc)); \
    }
#define W8_STORE8(r)                                                                             \
    if (R > r) {                                                                                 \
        float sums[PANEL];                                                                       \
        _mm256_storeu_ps(sums, flo[r]);                                                          \
        _mm256_storeu_ps(sums + 8, fhi[r]);                                                      \
        for (int n = 0; n < width; n++) y[r * out + n] = sums[n];                                \
    }

#if defined(__AVX512VNNI__)
/* One panel against R rows: per block, two 16-lane integer sums a row (even and odd quads: two
   chains of vpdpbusd instead of one waiting on its own latency), then the block's float32 step. */
#define W8_STEP(r, sum)                                                                          \
    if (R > r) {                                                                                 \
        int32_t four;                                                                            \
        memcpy(&four, xq + r * in4 + 4 * j, 4);                                                  \
        sum##r = _mm512_dpbusd_epi32(sum##r, w, _mm512_set1_epi32(four));                        \
    }
#define W8_BLOCK_END(r)                                                                          \
    if (R > r) {                                                                                 \
        __m512i s = _mm512_sub_epi32(_mm512_add_epi32(ev##r, od##r),                             \
                                     _mm512_set1_epi32(xcorr[r * blocks + b]));                  \
        acc##r = _mm512_add_ps(acc##r, _mm512_mul_ps(_mm512_cvtepi32_ps(s),                      \
                                                     _mm512_set1_ps(xs[r * blocks + b])));       \
        ev##r = od##r = _mm512_setzero_si512();                                                  \
    }
#define W8_STORE(r)                                                                              \
    if (R > r) {                                                                                 \
        float sums[PANEL];                                                                       \
        _mm512_storeu_ps(sums, acc##r);                                                          \
        for (int n = 0; n < width; n++) y[r * out + n] = sums[n];                                \
    }

static inline __attribute__((always_inline)) void w8_panel_rows(
        const uint8_t *panel, const xq_t *xq, const float *xs, const int32_t *xcorr, const int R,
        int64_t in4, int64_t blocks, float *y, int64_t out, int width) {
    __m512i ev0, od0, ev1, od1, ev2, od2, ev3, od3, ev4, od4, ev5, od5;
    __m512 acc0, acc1, acc2, acc3, acc4, acc5;
    ev0 = od0 = ev1 = od1 = ev2 = od2 = ev3 = od3 = ev4 = od4 = ev5 = od5 = _mm512_setzero_si512();
    acc0 = acc1 = acc2 = acc3 = acc4 = acc5 = _mm512_setzero_ps();
    int64_t quads = in4 / 4;
    for (int64_t b = 0; b < blocks; b++) {
        int64_t j1 = (b + 1) * (QBLOCK / 4) < quads ? (b + 1) * (QBLOCK / 4) : quads;
        for (int64_t j = b * (QBLOCK / 4); j < j1; j++) {
            _mm_prefetch((const char *)(panel + j * 64) + AHEAD_BYTES, _MM_HINT_T0);
            __m512i w = _mm512_loadu_si512((const void *)(panel + j * 64));
            W8_STEP(0, ev) W8_STEP(1, ev) W8_STEP(2, ev) W8_STEP(3, ev) W8_STEP(4, ev) W8_STEP(5, ev)
            if (++j >= j1) break;
            _mm_prefetch((const char *)(panel + j * 64) + AHEAD_BYTES, _MM_HINT_T0);
            w = _mm512_loadu_si512((const void *)(panel + j * 64));
            W8_STEP(0, od) W8_STEP(1, od) W8_STEP(2, od) W8_STEP(3, od) W8_STEP(4, od) W8_STEP(5, od)
        }
        W8_BLOCK_END(0) W8_BLOCK_END(1) W8_BLOCK_END(2) W8_BLOCK_END(3) W8_BLOCK_END(4) W8_BLOCK_END(5)
    }
    W8_STORE(0) W8_STORE(1) W8_STORE(2) W8_STORE(3) W8_STORE(4) W8_STORE(5)
}
#define W8_ROWS_PER_PASS W8_MAX_ROWS
#elif defined(__AVXVNNI__)
/* AVX-VNNI (Intel since Alder Lake, AMD since Zen 5, without AVX-512): vpdpbusd on 8 lanes. A
   quad's 64 bytes are two loads, outputs 0-7 and 8-15, each 4 inputs deep: two sums a row. */
#define W8_STEP(r)                                                                               \
    if (R > r) {                                                                                 \
        int32_t four;                                                                            \
        memcpy(&four, xq + r * in4 + 4 * j, 4);                                                  \
        __m256i xv = _mm256_set1_epi32(four);                                                    \
        lo##r = _mm256_dpbusd_avx_epi32(lo##r, w_lo, xv);                                        \
        hi##r = _mm256_dpbusd_avx_epi32(hi##r, w_hi, xv);                                        \
    }
#define W8_BLOCK_END(r)                                                                          \
    if (R > r) {                                                                                 \
        W8_FLOAT_STEP8(r, lo##r, hi##r)                                                          \
        lo##r = hi##r = _mm256_setzero_si256();                                                  \
    }

static inline __attribute__((always_inline)) void w8_panel_rows(
        const uint8_t *panel, const xq_t *xq, const float *xs, const int32_t *xcorr, const int R,
        int64_t in4, int64_t blocks, float *y, int64_t out, int width) {
    __m256i lo0, hi0, lo1, hi1, lo2, hi2, lo3, hi3, lo4, hi4, lo5, hi5;
    __m256 flo[W8_MAX_ROWS], fhi[W8_MAX_ROWS];  /* touched once a block: they may live in memory */
    lo0 = hi0 = lo1 = hi1 = lo2 = hi2 = lo3 = hi3 = lo4 = hi4 = lo5 = hi5 = _mm256_setzero_si256();
    for (int r = 0; r < W8_MAX_ROWS; r++) flo[r] = fhi[r] = _mm256_setzero_ps();
    int64_t quads = in4 / 4;
    for (int64_t b = 0; b < blocks; b++) {
        int64_t j1 = (b + 1) * (QBLOCK / 4) < quads ? (b + 1) * (QBLOCK / 4) : quads;
        for (int64_t j = b * (QBLOCK / 4); j < j1; j++) {
            const uint8_t *p = panel + j * 64;
            _mm_prefetch((const char *)p + AHEAD_BYTES, _MM_HINT_T0);
            __m256i w_lo = _mm256_loadu_si256((const __m256i *)p), w_hi = _mm256_loadu_si256((const __m256i *)(p + 32));
            W8_STEP(0) W8_STEP(1) W8_STEP(2) W8_STEP(3) W8_STEP(4) W8_STEP(5)
        }
        W8_BLOCK_END(0) W8_BLOCK_END(1) W8_BLOCK_END(2) W8_BLOCK_END(3) W8_BLOCK_END(4) W8_BLOCK_END(5)
    }
    W8_STORE8(0) W8_STORE8(1) W8_STORE8(2) W8_STORE8(3) W8_STORE8(4) W8_STORE8(5)
}
#define W8_ROWS_PER_PASS W8_MAX_ROWS
#else
/* AVX2: a quad of 16 outputs is four 16-byte loads (4 outputs x 4 inputs each), each widened to
   16-bit and multiplied by every row's 4 inputs with vpmaddwd: 8 sums of 2 products, two per
   output. At a block's end the pairs are added (vphaddd, then the lanes put in order). W8_AVX2_ROWS
   rows a pass: each row's four sums, its 4 inputs and one widened load in the 16 registers. */
#ifndef W8_AVX2_ROWS
#define W8_AVX2_ROWS 2
#endif
#define W8_INPUTS(r)                                                                             \
    __m256i xv##r = R > r ? _mm256_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)(xq + r * in4 + 4 * j))) \
                          : _mm256_setzero_si256();
#define W8_MADD(r, acc, wv)                                                                      \
    if (R > r) acc##r = _mm256_add_epi32(acc##r, _mm256_madd_epi16(wv, xv##r));
#define W8_SUBVECTOR(acc, offset)                                                                \
    {                                                                                            \
        __m256i wv = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + offset)));        \
        W8_MADD(0, acc, wv) W8_MADD(1, acc, wv) W8_MADD(2, acc, wv) W8_MADD(3, acc, wv)          \
    }
#define W8_BLOCK_END(r)                                                                          \
    if (R > r) {                                                                                 \
        __m256i lo = _mm256_permute4x64_epi64(_mm256_hadd_epi32(a##r, b##r), 0xD8);              \
        __m256i hi = _mm256_permute4x64_epi64(_mm256_hadd_epi32(c##r, d##r), 0xD8);              \
        W8_FLOAT_STEP8(r, lo, hi)                                                                \
        a##r = b##r = c##r = d##r = _mm256_setzero_si256();                                      \
    }

static inline __attribute__((always_inline)) void w8_panel_rows(
        const uint8_t *panel, const xq_t *xq, const float *xs, const int32_t *xcorr, const int R,
        int64_t in4, int64_t blocks, float *y, int64_t out, int width) {
    __m256i a0, b0, c0, d0, a1, b1, c1, d1, a2, b2, c2, d2, a3, b3, c3, d3;
    __m256 flo[4], fhi[4];  /* touched once a block: they may live in memory */
    a0 = b0 = c0 = d0 = a1 = b1 = c1 = d1 = a2 = b2 = c2 = d2 = a3 = b3 = c3 = d3 = _mm256_setzero_si256();
    for (int r = 0; r < 4; r++) flo[r] = fhi[r] = _mm256_setzero_ps();
    int64_t quads = in4 / 4;
    for (int64_t b = 0; b < blocks; b++) {
        int64_t j1 = (b + 1) * (QBLOCK / 4) < quads ? (b + 1) * (QBLOCK / 4) : quads;
        for (int64_t j = b * (QBLOCK / 4); j < j1; j++) {
            const uint8_t *p = panel + j * 64;
            _mm_prefetch((const char *)p + AHEAD_BYTES, _MM_HINT_T0);
            W8_INPUTS(0) W8_INPUTS(1) W8_INPUTS(2) W8_INPUTS(3)
            W8_SUBVECTOR(a, 0) W8_SUBVECTOR(b, 16) W8_SUBVECTOR(c, 32) W8_SUBVECTOR(d, 48)
        }
        W8_BLOCK_END(0) W8_BLOCK_END(1) W8_BLOCK_END(2) W8_BLOCK_END(3)
    }
    W8_STORE8(0) W8_STORE8(1) W8_STORE8(2) W8_STORE8(3)
}
#define W8_ROWS_PER_PASS W8_AVX2_ROWS
#endif

/* The entry point, with the other kernels' arguments: w is the quad panels (uint8), scale the
   weights' int8 scales [out]. The inputs are quantized once, then the panels are shared among the
   threads, each against every row, W8_ROWS_PER_PASS rows at a time. Returns 0, or 1 if the
   buffer for the quantized inputs could not be allocated. */
int rows_linear_w8a8(const float *x, int64_t rows, int64_t in, const uint8_t *w, int64_t out,
                     const float *scale, const float *bias, float *y, int threads) {
    int64_t in4 = (in + 3) / 4 * 4, blocks = (in4 + QBLOCK - 1) / QBLOCK;
    int64_t panels = (out + PANEL - 1) / PANEL;
    xq_t *xq = malloc(rows * in4 * sizeof(xq_t) + 8);
    float *xs = malloc(rows * blocks * sizeof(float));
    int32_t *xcorr = malloc(rows * blocks * sizeof(int32_t));
    if (!xq || !xs || !xcorr) {
        free(xq); free(xs); free(xcorr);
        return 1;
    }
    #pragma omp parallel num_threads(threads)
    {
    /* the inputs' blocks, shared among the threads; then (after the loop's barrier) the panels */
    #pragma omp for schedule(static)
    for (int64_t rb = 0; rb < rows * blocks; rb++) {
        int64_t r = rb / blocks, b = rb % blocks;
        quantize_block(x + r * in, in, in4, b, xq + r * in4, xs + rb, xcorr + rb);
    }
    #pragma omp for schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        const uint8_t *panel = w + p * in4 * PANEL;
        int64_t o = p * PANEL;
        int width = out - o < PANEL ? (int)(out - o) : PANEL;
        for (int64_t r = 0; r < rows; r += W8_ROWS_PER_PASS) {
            const xq_t *xr = xq + r * in4;
            const float *sr = xs + r * blocks;
            const int32_t *cr = xcorr + r * blocks;
            float *yr = y + r * out + o;
            int64_t left = rows - r;
            switch (left < W8_ROWS_PER_PASS ? left : W8_ROWS_PER_PASS) {
                case 1: w8_panel_rows(panel, xr, sr, cr, 1, in4, blocks, yr, out, width); break;
#if W8_ROWS_PER_PASS > 2
                case 2: w8_panel_rows(panel, xr, sr, cr, 2, in4, blocks, yr, out, width); break;
#endif
#if W8_ROWS_PER_PASS > 3
                case 3: w8_panel_rows(panel, xr, sr, cr, 3, in4, blocks, yr, out, width); break;
#endif
#if W8_ROWS_PER_PASS > 4
                case 4: w8_panel_rows(panel, xr, sr, cr, 4, in4, blocks, yr, out, width); break;
                case 5: w8_panel_rows(panel, xr, sr, cr, 5, in4, blocks, yr, out, width); break;
#endif
                default: w8_panel_rows(panel, xr, sr, cr, W8_ROWS_PER_PASS, in4, blocks, yr, out, width); break;
            }
        }
        for (int64_t r = 0; r < rows; r++)
            finish(y + r * out, scale, bias, o, o + width);
    }
    }
    free(xq); free(xs); free(xcorr);
    return 0;
}
