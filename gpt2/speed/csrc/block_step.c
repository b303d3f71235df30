/* GPT-2's transformer blocks for new tokens on a KV cache, in C: the CPU's fused decode step
   (gpt2/speed/native_step.py is the Python side; it is what `compile="fused"` runs on a CPU).

   Why: in a decode step the four linear layers of a block read the weights (the step's floor),
   and everything else (two LayerNorms, the cache writes, attention, a GELU, two residual adds,
   the reshapes between them) is a few kilobytes of work. Dispatched one PyTorch operation at a
   time from Python, those small operations cost about as much time each as the work itself;
   here they are plain loops, and one call runs every block of the model.

   Each block is gpt2/model.py's Block.forward, for B = 1:
     h   = LayerNorm(x; ln_1)                          x [T, C]
     qkv = h @ c_attn.T + b                            [T, 3C]: q, k, v, each [T, n_head, D]
     k, v of row t are written at cache slot start + t
     a   = softmax(q k^T / sqrt(D)) v                  row t over slots 0 .. start + t (causal), or
                                                       the slots a token tree's mask gives it
     x   = x + a @ attn.c_proj.T + b
     h   = LayerNorm(x; ln_2)
     x   = x + gelu_tanh(h @ c_fc.T + b) @ mlp.c_proj.T + b
   The linear layers run on the kernels the model's FastLinear layers hold (rows_linear.c's entry
   points, passed in as function pointers with their packed weights): the same computation, bit
   for bit, as the eager model's. The rest is written here and rounds differently from PyTorch's
   own operations (sums in another order; exp by a polynomial): the logits agree with the eager
   step's to float32 rounding, not bit for bit (tests/test_native_step.py).

   A row's result does not depend on how many rows come with it: every loop over a row's values
   runs in one fixed order that depends only on that row (its position in the cache), so a
   verification of T tokens computes, row for row, the bits T decode steps compute, and greedy
   speculative decoding on this path gives what plain greedy decoding on it gives. */

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* rows_linear.c's entry points: (x, rows, in, panels, out, scale, bias, y, threads) -> 0 */
typedef int (*linear_fn)(const float *x, int64_t rows, int64_t in, const void *w, int64_t out,
                         const float *scale, const float *bias, float *y, int threads);

typedef struct {
    linear_fn run;
    const void *panels;
    const float *scale; /* int8 formats' per-output scale, else NULL */
    const float *bias;  /* NULL: none */
    int64_t in, out;
} Linear;

typedef struct {
    const float *ln1_weight, *ln1_bias, *ln2_weight, *ln2_bias;
    Linear c_attn, attn_proj, c_fc, mlp_proj;
} Block;

/* e^x for 8 floats: x = n ln2 + r, |r| <= ln2 / 2, e^r by a degree-7 polynomial (Cephes' expf
   coefficients), times 2^n built in the exponent bits. Below -87.3 (n <= -127) it gives 0. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* r = x - n ln2, ln2 in two parts so that n * the first is exact */
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    e = _mm256_max_epi32(e, _mm256_setzero_si256()); /* n <= -127: 2^n taken as 0 */
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
}

/* The 8 lanes' sum, in a fixed order. */
static inline float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* y = LayerNorm(x) for one row of n: (x - mean) / sqrt(var + eps) * weight + bias, the biased
   variance, as nn.LayerNorm. */
static void layer_norm(const float *x, int64_t n, const float *weight, const float *bias, float eps, float *y) {
    float mean = 0.0f, var = 0.0f;
    for (int64_t i = 0; i < n; i++) mean += x[i];
    mean /= (float)n;
    for (int64_t i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    float inv = 1.0f / sqrtf(var / (float)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mean) * inv * weight[i] + bias[i];
}

/* GELU, tanh form, in place on one row of n: x * (1 + tanh(u)) / 2 with u = sqrt(2/pi) (x +
   0.044715 x^3), written as x / (1 + e^(-2u)) (the same function), 8 at a time; the tail goes
   through the same vector code. */
static void gelu_tanh(float *x, int64_t n) {
    const __m256 c = _mm256_set1_ps(-2.0f * 0.7978845608028654f), a = _mm256_set1_ps(0.044715f);
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 8) {
        float tail[8] = {0};
        int64_t m = n - i < 8 ? n - i : 8;
        float *p = m == 8 ? x + i : tail;
        if (m < 8) memcpy(tail, x + i, m * sizeof(float));
        __m256 v = _mm256_loadu_ps(p);
        __m256 u = _mm256_mul_ps(_mm256_add_ps(v, _mm256_mul_ps(a, _mm256_mul_ps(_mm256_mul_ps(v, v), v))), c);
        _mm256_storeu_ps(p, _mm256_div_ps(v, _mm256_add_ps(one, exp8(u))));
        if (m < 8) memcpy(x + i, tail, m * sizeof(float));
    }
}

/* One head of one row: a [D] = softmax(q k_j / sqrt(D)) v over the slots j it may attend, in
   increasing order: slots[0 .. n) (a causal row: 0 .. its own; a token tree's node: the cached
   slots and its ancestors). The scores are taken in that order into `scores` (room for n rounded
   up to 8), so a node computes, value for value, what the same token computes at the end of a
   chain of its ancestors. keys, values [max_len, D] of this head; D is a multiple of 8. */
static void attend(const float *q, const float *keys, const float *values, const int32_t *slots, int64_t n,
                   int64_t D, float *scores, float *a) {
    float scale = 1.0f / sqrtf((float)D), top = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        const float *k = keys + slots[i] * D;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 8)
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d)));
        scores[i] = sum8(acc) * scale;
        top = scores[i] > top ? scores[i] : top;
    }
    int64_t padded = (n + 7) / 8 * 8;
    for (int64_t i = n; i < padded; i++) scores[i] = -INFINITY;
    __m256 total = _mm256_setzero_ps(), shift = _mm256_set1_ps(top);
    for (int64_t i = 0; i < padded; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + i), shift));
        _mm256_storeu_ps(scores + i, e);
        total = _mm256_add_ps(total, e);
    }
    float inv = 1.0f / sum8(total);
    for (int64_t d = 0; d < D; d += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t i = 0; i < n; i++)
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(scores[i]), _mm256_loadu_ps(values + slots[i] * D + d)));
        _mm256_storeu_ps(a + d, _mm256_mul_ps(acc, _mm256_set1_ps(inv)));
    }
}

static inline int run(const Linear *l, const float *x, int64_t rows, float *y, int threads) {
    return l->run(x, rows, l->in, l->panels, l->out, l->scale, l->bias, y, threads);
}

/* Blocks [0, n_blocks) on x [T, C] (the embeddings of T new tokens, at cache slots start ..
   start + T - 1; overwritten with the last block's output). keys[i], values[i]: block i's cache
   [n_head, max_len, D] (batch 1), written at those slots. mask: NULL (causal: row t attends
   slots 0 .. start + t), or [T, start + T] bytes, 1 where row t may attend the slot (a token
   tree's). Returns 0, 1 if out of memory, or the failing linear kernel's code. */
int decode_blocks(float *x, int64_t T, int64_t C, int64_t n_head, int64_t max_len, int64_t start,
                  const uint8_t *mask, float eps, const Block *blocks, int64_t n_blocks, float *const *keys,
                  float *const *values, int threads) {
    int64_t D = C / n_head, len = start + T, padded = (len + 7) / 8 * 8;
    float *h = malloc(T * C * sizeof(float)), *qkv = malloc(T * 3 * C * sizeof(float));
    float *a = malloc(T * C * sizeof(float)), *y = malloc(T * C * sizeof(float));
    float *fc = malloc(T * 4 * C * sizeof(float));
    float *scores = malloc(threads * padded * sizeof(float)); /* one row of scores a thread */
    int32_t *slots = malloc(T * len * sizeof(int32_t));    /* the slots each row attends, in order */
    int64_t *counts = malloc(T * sizeof(int64_t));
    int failed = !h || !qkv || !a || !y || !fc || !scores || !slots || !counts;
    for (int64_t t = 0; t < T && !failed; t++) {
        counts[t] = 0;
        for (int64_t j = 0; j < (mask ? len : start + t + 1); j++)
            if (!mask || mask[t * len + j]) slots[t * len + counts[t]++] = (int32_t)j;
    }
    for (int64_t i = 0; i < n_blocks && !failed; i++) {
        const Block *b = blocks + i;
        for (int64_t t = 0; t < T; t++) layer_norm(x + t * C, C, b->ln1_weight, b->ln1_bias, eps, h + t * C);
        if ((failed = run(&b->c_attn, h, T, qkv, threads))) break;
        for (int64_t t = 0; t < T; t++)
            for (int64_t hd = 0; hd < n_head; hd++) {
                const float *row = qkv + t * 3 * C + hd * D;
                memcpy(keys[i] + (hd * max_len + start + t) * D, row + C, D * sizeof(float));
                memcpy(values[i] + (hd * max_len + start + t) * D, row + 2 * C, D * sizeof(float));
            }
        #pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t th = 0; th < T * n_head; th++) {
            int64_t t = th / n_head, hd = th % n_head;
            attend(qkv + t * 3 * C + hd * D, keys[i] + hd * max_len * D, values[i] + hd * max_len * D,
                   slots + t * len, counts[t], D, scores + omp_get_thread_num() * padded, a + t * C + hd * D);
        }
        if ((failed = run(&b->attn_proj, a, T, y, threads))) break;
        for (int64_t k = 0; k < T * C; k++) x[k] += y[k];
        for (int64_t t = 0; t < T; t++) layer_norm(x + t * C, C, b->ln2_weight, b->ln2_bias, eps, h + t * C);
        if ((failed = run(&b->c_fc, h, T, fc, threads))) break;
        for (int64_t t = 0; t < T; t++) gelu_tanh(fc + t * 4 * C, 4 * C);
        if ((failed = run(&b->mlp_proj, fc, T, y, threads))) break;
        for (int64_t k = 0; k < T * C; k++) x[k] += y[k];
    }
    free(h); free(qkv); free(a); free(y); free(fc); free(scores); free(slots); free(counts);
    return failed;
}
