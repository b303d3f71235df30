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


@functools.cache
def _triton():
    """The triton module, or None where it is not installed (a CPU-only PyTorch comes without it).
    Imported on first use: importing Triton takes a noticeable part of a second, and most
    processes that import the model never run the fused step."""
    try:
        import triton
    except ImportError:
        return None
    return triton


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
    rows = _triton().next_power_of_2(M)
    vector = [(rows, *c) for c in VECTOR_CONFIGS.get(rows, ())]
    return vector + ([(BLOCK_M, *c) for c in DOT_CONFIGS] if M > 1 else [])


# Cache slots per step of the attention kernel's loop (float32 tiles take twice the shared memory)
BLOCK_L = {torch.float32: 64, torch.bfloat16: 128, torch.float16: 128}


def why_not_fused(model) -> str | None:
    """Why this model cannot take the fused path (None: it can)."""
    if _triton() is None:
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
# The kernels (gpt2/speed/fused_kernels.py) as Triton kernels, made on first use

@functools.cache
def _kernels():
    """(linear, attention) as Triton kernels: compiled for a CUDA GPU or, where TRITON_INTERPRET=1
    was set before Triton was imported, run by Triton's interpreter on CPU tensors."""
    from . import fused_kernels

    jit = _triton().jit
    return jit(fused_kernels.linear_kernel), jit(fused_kernels.attention_kernel)


def _kernels_for(x):
    triton = _triton()
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
            "triton": _triton().__version__}
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
    except _triton().runtime.errors.OutOfResources:  # more shared memory than this GPU has (its first call, compiling)
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
    triton = _triton()
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
