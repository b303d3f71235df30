"""The fused decode step's two Triton kernels (gpt2/speed/fused_step.py launches them).

Plain functions: fused_step's `_kernels` makes Triton kernels of them when the fused path is first
used (compiled for a CUDA GPU, or run by Triton's interpreter on CPU tensors). They sit apart so
that importing the model never imports Triton.

linear_kernel: x [M, K] -> [M, N], optionally LayerNorm first (LN), then bias (BIAS), GELU
(GELU), residual (RES); for c_attn (KV) q goes out and k, v go into their cache slots.
attention_kernel: the new rows' attention over the cache, flash-style (one program per head and
batch row).
"""

import triton.language as tl


def linear_kernel(x_ptr, w_ptr, b_ptr, res_ptr, out_ptr, lnw_ptr, lnb_ptr, keys_ptr, values_ptr, slots_ptr,
                   M, N, K, T, eps, stride_b, stride_h, stride_s,
                   C: tl.constexpr, HEAD_DIM: tl.constexpr, LN: tl.constexpr, BIAS: tl.constexpr,
                   GELU: tl.constexpr, RES: tl.constexpr, KV: tl.constexpr,
                   ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_POW2: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
    """out [M, N] = (LN(x) if LN else x) [M, K] @ w [N, K].T (+ bias) (GELU) (+ res [M, N]).

    KV (c_attn): the N = 3C columns are q, k, v; q goes to out [M, C], and k, v of row m (batch
    m // T, new token m % T) into keys/values [B, n_head, slots, HEAD_DIM] at slot slots[m % T].
    Each program makes BLOCK_N outputs of ROWS rows (rows past M masked): ROWS = 1 to 8 on the
    vector units (each weight read once, multiplied into every row), ROWS = 16 a tensor-core
    product."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    rk = tl.arange(0, BLOCK_K)
    rm = pid_m * ROWS + tl.arange(0, ROWS)
    m_mask = rm < M
    if LN:
        # The row statistics in two passes (mean, then the mean square about it), as LayerNorm
        # computes them: one pass of sums of squares loses digits on rows with a large mean.
        if ROWS <= 8:  # the whole rows at once, in registers: one load's latency, not a loop's
            rk_all = tl.arange(0, K_POW2)
            row = tl.load(x_ptr + rm[:, None] * K + rk_all[None, :], mask=m_mask[:, None] & (rk_all < K)[None, :],
                          other=0.0)
            row = row.to(tl.float32)
            mean = tl.sum(row, axis=1) / K
            centred = tl.where((rk_all < K)[None, :], row - mean[:, None], 0.0)
            rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / K + eps)
        else:
            total = tl.zeros([ROWS], tl.float32)
            for k0 in range(0, K, BLOCK_K):
                mask = m_mask[:, None] & (k0 + rk < K)[None, :]
                x = tl.load(x_ptr + rm[:, None] * K + k0 + rk[None, :], mask=mask, other=0.0).to(tl.float32)
                total += tl.sum(x, axis=1)
            mean = total / K
            total = tl.zeros([ROWS], tl.float32)
            for k0 in range(0, K, BLOCK_K):
                mask = m_mask[:, None] & (k0 + rk < K)[None, :]
                x = tl.load(x_ptr + rm[:, None] * K + k0 + rk[None, :], mask=mask, other=0.0).to(tl.float32)
                centred = tl.where(mask, x - mean[:, None], 0.0)
                total += tl.sum(centred * centred, axis=1)
            rstd = 1.0 / tl.sqrt(total / K + eps)
    if ROWS <= 8:  # products summed elementwise, reduced over K once, after the loop
        acc3 = tl.zeros([ROWS, BLOCK_N, BLOCK_K], tl.float32)
    else:
        acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = k0 + rk < K
        x = tl.load(x_ptr + rm[:, None] * K + k0 + rk[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        if LN:
            g = tl.load(lnw_ptr + k0 + rk, mask=k_mask, other=0.0).to(tl.float32)
            beta = tl.load(lnb_ptr + k0 + rk, mask=k_mask, other=0.0).to(tl.float32)
            x = (x.to(tl.float32) - mean[:, None]) * rstd[:, None] * g[None, :] + beta[None, :]
            x = tl.where(k_mask[None, :], x, 0.0)
        x = x.to(w_ptr.dtype.element_ty)  # the normalised rows in the model's dtype, as eager's LayerNorm gives them
        w = tl.load(w_ptr + rn[:, None] * K + k0 + rk[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        if ROWS <= 8:  # [ROWS, 1, BLOCK_K] * [1, BLOCK_N, BLOCK_K]
            acc3 += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
        else:
            acc += tl.dot(x, tl.trans(w), input_precision=DOT_PRECISION)
    if ROWS <= 8:
        acc = tl.sum(acc3, axis=2)
    if BIAS:
        acc += tl.load(b_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if GELU:  # tanh GELU: 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
        acc = acc * tl.sigmoid(1.5957691216057308 * (acc + 0.044715 * acc * acc * acc))
    mask = m_mask[:, None] & n_mask[None, :]
    if RES:
        acc += tl.load(res_ptr + rm[:, None] * N + rn[None, :], mask=mask, other=0.0).to(tl.float32)
    acc = acc.to(out_ptr.dtype.element_ty)
    if KV:
        part = rn // C  # 0: q, 1: k, 2: v
        within = rn % C
        tl.store(out_ptr + rm[:, None] * C + within[None, :], acc, mask=mask & (part == 0)[None, :])
        slot = tl.load(slots_ptr + rm % T, mask=m_mask, other=0)
        offset = ((rm // T) * stride_b + slot * stride_s)[:, None] + \
            ((within // HEAD_DIM) * stride_h + within % HEAD_DIM)[None, :]
        tl.store(keys_ptr + offset, acc, mask=mask & (part == 1)[None, :])
        tl.store(values_ptr + offset, acc, mask=mask & (part == 2)[None, :])
    else:
        tl.store(out_ptr + rm[:, None] * N + rn[None, :], acc, mask=mask)


def attention_kernel(q_ptr, keys_ptr, values_ptr, mask_ptr, slots_ptr, out_ptr, T, L, scale,
                      stride_b, stride_h, stride_s,
                      C: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_L: tl.constexpr,
                      DOT_PRECISION: tl.constexpr):
    """out [B*T, C] = softmax(q k^T * scale, masked) v for one head (program 0) of one batch row
    (program 1): q [B*T, C]; keys, values [B, n_head, L, HEAD_DIM]; mask [T, L] (nonzero: may
    attend). Reads slots up to the last new token's (slots[T - 1]): nothing later is written."""
    h = tl.program_id(0)
    b = tl.program_id(1)
    rt = tl.arange(0, BLOCK_T)
    t_mask = rt < T
    rd = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + (b * T + rt)[:, None] * C + h * HEAD_DIM + rd[None, :], mask=t_mask[:, None], other=0.0)
    base = b * stride_b + h * stride_h
    kv_len = (tl.load(slots_ptr + T - 1) + 1).to(tl.int32)
    m_i = tl.full([BLOCK_T], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_T], tl.float32)
    acc = tl.zeros([BLOCK_T, HEAD_DIM], tl.float32)
    for l0 in range(0, kv_len, BLOCK_L):
        rl = l0 + tl.arange(0, BLOCK_L)
        l_mask = rl < kv_len
        k = tl.load(keys_ptr + base + rl[:, None] * stride_s + rd[None, :], mask=l_mask[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # [BLOCK_T, BLOCK_L], float32
        allowed = tl.load(mask_ptr + rt[:, None] * L + rl[None, :], mask=t_mask[:, None] & l_mask[None, :], other=0)
        s = tl.where(allowed != 0, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that may attend to nothing yet: no NaN
        p = tl.exp(s - m_use[:, None])
        alpha = tl.exp(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(values_ptr + base + rl[:, None] * stride_s + rd[None, :], mask=l_mask[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + (b * T + rt)[:, None] * C + h * HEAD_DIM + rd[None, :], out.to(out_ptr.dtype.element_ty),
             mask=t_mask[:, None])
