"""A decode step of five Triton kernels per block (a CUDA GPU), recorded as CUDA graphs.
Opt-in: `graph_decode(model, fused=True)`, `load_gpt2(..., compile="fused")`, `--compile fused`.

Why: a graphed step of the plain block (gpt2/speed/cuda_graph.py) replays some 15 kernels per
block, most of them a few microseconds of launch and ramp-up for a few kilobytes of work: the
LayerNorms, the bias adds, the GELU, the residual adds, the cache writes. At batch 1 a step only
has to read its weights once; everything else is overhead. Here each block is five kernels:

  1. ln_1, then c_attn and its bias; q goes out, k and v go straight into their cache slots
  2. attention of the new rows over the cache, up to its last written slot (flash-style:
     the softmax is accumulated chunk by chunk, so the scores never go to memory)
  3. attn.c_proj, its bias and the residual add
  4. ln_2, then c_fc, its bias and the GELU
  5. mlp.c_proj, its bias and the residual add

and ln_f with the head is one more. A LayerNorm is computed inside the matrix product that reads
it: every program of the product normalises the rows it multiplies (a few KB, read from L2), so the
normalised rows never go to memory either. The products themselves: for one row (a step) each
program reads BLOCK_N rows of the weight and reduces them against x (a matrix-vector product);
2 to 8 rows (verifications, trees) run so too, each weight read once for every row, or as a
tensor-core product of the rows padded to 16, whichever the GPU runs faster; 9 to 16 rows the latter.

Numerics: float32 models multiply at IEEE precision (not TF32) and match eager's logits to
rounding; 16-bit models round what eager rounds to 16 bits (the normalised rows, the attention
weights before they multiply v) and keep the rest in float32. The model's code is unchanged
(gpt2/model.py); `fused_block_step` has block_step's arguments (gpt2/speed/compiled.py).

Block sizes: on a GPU each product's (rows a program, BLOCK_N, BLOCK_K, warps) is tuned per shape
the first time it comes, outside any recording, timing the candidates inside a CUDA graph, and kept
per machine and GPU with the kernel choices (GPT2_FUSED_TUNE=0: the first of each, untimed).
On a CPU, Triton's interpreter runs the same kernels on CPU tensors, slowly: that is how the tests
check them without a GPU (tests/test_fused_step.py).
"""

import functools
import os
import sys

import torch

from . import kernel_cache
from .device import note_once

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only PyTorch comes without Triton; the fused path then says so
    import types
    triton = None
    tl = types.SimpleNamespace(constexpr=None)  # so that the kernels' signatures below still read

# (BLOCK_N, BLOCK_K, num_warps) tried per rows of a program: 1, 2, 4, 8 on the vector units;
# BLOCK_M = 16 on tensor cores (BLOCK_N and BLOCK_K >= 16), also tried for 2 to 8 rows. The first
# is the default; on a GPU the rest are timed against it. Small BLOCK_N makes many programs: at
# batch 1 the products are small, and a GPU reads its memory fast only with many reads in flight.
VECTOR_CONFIGS = {
    1: ((8, 256, 4), (2, 1024, 4), (1, 2048, 8), (2, 2048, 8), (4, 1024, 8), (4, 512, 4), (8, 512, 8),
        (16, 256, 4), (32, 128, 4)),
    2: ((4, 512, 4), (2, 1024, 4), (1, 2048, 8), (4, 1024, 8), (8, 256, 4)),
    4: ((2, 512, 4), (1, 1024, 4), (2, 1024, 8), (4, 512, 8), (8, 256, 8)),
    8: ((2, 256, 4), (1, 1024, 8), (1, 512, 4), (2, 512, 8), (4, 256, 8)),
}
DOT_CONFIGS = ((16, 128, 4), (16, 256, 4), (16, 512, 8), (32, 256, 8), (32, 128, 4), (64, 64, 4))
BLOCK_M = 16  # the most rows of one program; also the most rows the attention kernel takes per head


def candidates(M: int) -> list[tuple[int, int, int, int]]:
    """(rows of a program, BLOCK_N, BLOCK_K, num_warps) tried for a product of M rows."""
    vector = [(triton.next_power_of_2(M), *c) for c in VECTOR_CONFIGS.get(triton.next_power_of_2(M), ())]
    return vector + ([(BLOCK_M, *c) for c in DOT_CONFIGS] if M > 1 else [])


# Cache slots per step of the attention kernel's loop (float32 tiles take twice the shared memory)
BLOCK_L = {torch.float32: 64, torch.bfloat16: 128, torch.float16: 128}


def why_not_fused(model) -> str | None:
    """Why this model cannot take the fused path (None: it can)."""
    if triton is None:
        return "Triton is not installed (it comes with PyTorch's CUDA builds)"
    c, w = model.config, model.wte.weight
    head_dim = c.n_embd // c.n_head
    if w.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"its weights are {w.dtype}, not float32, bfloat16 or float16"
    if head_dim < 16 or head_dim & (head_dim - 1):
        return f"its head size {head_dim} is not a power of 2 of at least 16"
    for name, p in model.named_parameters():
        if type(p.data) is not torch.Tensor or not p.is_contiguous():
            return f"{name} is held in a kernel's own layout, not as a plain tensor"
    return None


# ---------------------------------------------------------------------------------------------
# The kernels, as plain functions: `_kernels` makes Triton kernels of them (compiled for the GPU,
# or interpreted for CPU tensors).

def _linear_kernel(x_ptr, w_ptr, b_ptr, res_ptr, out_ptr, lnw_ptr, lnb_ptr, keys_ptr, values_ptr, slots_ptr,
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


def _attention_kernel(q_ptr, keys_ptr, values_ptr, mask_ptr, slots_ptr, out_ptr, T, L, scale,
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


@functools.cache
def _kernels():
    """(linear, attention) as Triton kernels: compiled for a CUDA GPU or, where TRITON_INTERPRET=1
    was set before Triton was imported, run by Triton's interpreter on CPU tensors."""
    return triton.jit(_linear_kernel), triton.jit(_attention_kernel)


def _kernels_for(x):
    if triton is None:
        raise RuntimeError("the fused decode step needs Triton (it comes with PyTorch's CUDA builds)")
    if x.device.type != "cuda" and not triton.knobs.runtime.interpret:
        raise RuntimeError(f"the fused kernels run on a CUDA GPU (these tensors are on {x.device.type}); on a "
                           f"CPU only under Triton's interpreter (TRITON_INTERPRET=1 before Triton is imported)")
    return _kernels()


# ---------------------------------------------------------------------------------------------
# Choosing block sizes: per (kernel flags, rows, N, K, dtype), timed on the GPU once per machine
# and kept with the kernel choices (gpt2/speed/kernel_cache.py; `python -m gpt2.speed.kernel_report
# --remeasure` forgets them).

_chosen: dict[tuple, tuple] = {}


def _choose(key, candidates, launch):
    """The candidate that runs launch(candidate) fastest: kept from an earlier process on this
    machine and GPU, else timed now (the first candidate without a GPU to time on, while a graph is
    being recorded, or with GPT2_FUSED_TUNE=0); kept per key."""
    if key in _chosen:
        return _chosen[key]
    if (not torch.cuda.is_available() or torch.cuda.is_current_stream_capturing()
            or os.environ.get("GPT2_FUSED_TUNE", "1") == "0"):
        return candidates[0]
    flags, rows, N, K, dtype = key
    what = {"flags (ln, bias, gelu, residual, kv)": list(flags), "rows up to": rows, "N": N, "K": K,
            "dtype": str(dtype).removeprefix("torch."), "device": torch.cuda.get_device_name(),
            "triton": triton.__version__}
    kept = kernel_cache.lookup("fused_block_sizes", what)
    if kept is not None and tuple(kept) in candidates:
        _chosen[key] = best = tuple(kept)
        return best
    note_once(f"note: timing the fused kernels' block sizes on this GPU, once per shape (kept in "
              f"{kernel_cache.shown_path()})", sys.stderr)
    times = [_graph_seconds(lambda: launch(config)) for config in candidates]
    _chosen[key] = best = candidates[times.index(min(times))]
    kernel_cache.store("fused_block_sizes", what, list(best))
    return best


def _graph_seconds(call) -> float:
    """graph_seconds(call) for the tuner: infinite for a candidate that does not fit this GPU."""
    try:
        return graph_seconds(call)
    except triton.runtime.errors.OutOfResources:  # more shared memory than this GPU has (its first call, compiling)
        return float("inf")


def graph_seconds(call, launches: int = 10, replays: int = 3) -> float:
    """Seconds of one call() on a CUDA GPU as it runs in a recorded step: `launches` calls recorded
    as one CUDA graph, replayed (Python's launches, one at a time, would time the launching)."""
    call()  # compiles, tunes: outside the recording
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            call()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / (launches * replays)


def chosen_configs() -> dict[tuple, tuple]:
    """What was chosen so far: (flags, M, N, K, dtype) -> (rows of a program, BLOCK_N, BLOCK_K, num_warps)."""
    return dict(_chosen)


# ---------------------------------------------------------------------------------------------
# The step, in the terms of gpt2/model.py

def _dot_precision(dtype) -> str:
    """tl.dot's input precision: IEEE for float32 (TF32 would round eager's float32 away); 16-bit
    inputs multiply exactly either way."""
    return "ieee" if dtype == torch.float32 else "tf32"


def fused_linear(x, weight, bias=None, ln=None, gelu=False, residual=None, kv=None):
    """x [M, K] -> [M, N]: (ln(x) if ln else x) @ weight.T + bias, then GELU, then + residual
    [M, N]; one kernel. kv = (keys, values, slots [T], T) for c_attn: k and v go into the cache
    at the slots and only q [M, C] comes back."""
    M, K = x.shape
    N = weight.shape[0]
    linear, _ = _kernels_for(x)
    interpret = x.device.type != "cuda"
    C = N // 3 if kv else N
    out = x.new_empty(M, C)
    keys, values, slots, T = kv if kv else (out, out, out, 1)
    strides = keys.stride()[:3] if kv else (0, 0, 0)
    flags = (ln is not None, bias is not None, gelu, residual is not None, kv is not None)
    dummy = out  # pointers the flags leave unread

    def launch(config):
        rows, block_n, block_k, warps = config
        grid = (triton.cdiv(N, block_n), triton.cdiv(M, rows))
        linear[grid](x, weight, bias if bias is not None else dummy, residual if residual is not None else dummy,
                     out, ln.weight if ln is not None else dummy, ln.bias if ln is not None else dummy,
                     keys, values, slots, M, N, K, T, ln.eps if ln is not None else 0.0, *strides,
                     C=C if kv else 1, HEAD_DIM=keys.shape[3] if kv else 1,
                     LN=flags[0], BIAS=flags[1], GELU=gelu, RES=flags[3], KV=flags[4],
                     ROWS=rows, BLOCK_N=block_n, BLOCK_K=block_k,
                     K_POW2=triton.next_power_of_2(K) if ln is not None and rows <= 8 else 16,
                     DOT_PRECISION=_dot_precision(x.dtype), num_warps=warps)

    if interpret:  # the interpreter's time goes by programs and tile sizes: a tile of the product's size
        launch((triton.next_power_of_2(M) if M <= 8 else BLOCK_M, min(32, max(16, triton.next_power_of_2(N))),
                min(256, max(16, triton.next_power_of_2(K))), 4))
    else:
        launch(_choose((flags, triton.next_power_of_2(M), N, K, x.dtype), candidates(M), launch))
    return out


def fused_attention(q, keys, values, attn_mask, slots, B: int, T: int):
    """q [B*T, C] of T new tokens per batch row -> [B*T, C]: attention over the cache buffers
    keys, values [B, n_head, L, head_dim] (already holding the new tokens' k, v at `slots` [T]),
    masked by attn_mask [T, L] (True: may attend)."""
    n_head, head_dim = keys.shape[1], keys.shape[3]
    if T > BLOCK_M:
        raise ValueError(f"the fused attention takes at most {BLOCK_M} new rows, got {T}")
    _, attention = _kernels_for(q)
    out = torch.empty_like(q)
    attention[(n_head, B)](q, keys, values, attn_mask, slots, out, T, attn_mask.shape[1], head_dim ** -0.5,
                           *keys.stride()[:3], C=q.shape[1], HEAD_DIM=head_dim, BLOCK_T=BLOCK_M, BLOCK_L=BLOCK_L[q.dtype],
                           DOT_PRECISION=_dot_precision(q.dtype), num_warps=4)
    return out


def fused_block_step(block, x, keys, values, slots, attn_mask):
    """One Block.forward in five kernels, over a fixed-size cache (block_step's arguments and result).

    x [B, T, C]; keys, values [B, n_head, L, head_dim], this block's cache buffers, written at
    `slots` [T]; attn_mask [T, L] bool (True = may attend). Returns [B, T, C]."""
    B, T, C = x.shape
    attn, mlp = block.attn, block.mlp
    rows = x.reshape(B * T, C).contiguous()
    q = fused_linear(rows, attn.c_attn.weight, attn.c_attn.bias, ln=block.ln_1, kv=(keys, values, slots, T))
    y = fused_attention(q, keys, values, attn_mask, slots, B, T)
    rows = fused_linear(y, attn.c_proj.weight, attn.c_proj.bias, residual=rows)
    h = fused_linear(rows, mlp.c_fc.weight, mlp.c_fc.bias, ln=block.ln_2, gelu=True)
    rows = fused_linear(h, mlp.c_proj.weight, mlp.c_proj.bias, residual=rows)
    return rows.view(B, T, C)


def fused_head(model, x):
    """ln_f and the tied head in one kernel: x [B, T, C] -> logits [B, T, vocab_size]."""
    B, T, C = x.shape
    logits = fused_linear(x.reshape(B * T, C).contiguous(), model.wte.weight, ln=model.ln_f)
    return logits.view(B, T, -1)
