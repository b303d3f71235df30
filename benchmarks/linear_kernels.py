"""Which kernel runs GPT-2's linear layers fastest on this CPU, with which weight format?

    python -m benchmarks.linear_kernels --out runs/linear_kernels          # all candidates
    python -m benchmarks.linear_kernels --candidates fp32_onednn bf16_onednn --rounds 3

Decoding reads every weight once per token, so a linear layer at batch 1 (and at the few rows
verification feeds it, M = 1..9) should take (bytes of its weights) / (memory bandwidth). This
times every candidate on each of gpt2-large's linear shapes (c_attn 3840x1280, attn.c_proj
1280x1280, c_fc 5120x1280, mlp.c_proj 1280x5120, and the 50257x1280 output head) for M = 1..9.

To time what a decoding step sees (weights coming from memory, not from the cache), each shape is
held in enough copies to fill COPY_BYTES and every timed pass calls the kernel once per copy.
Candidates are interleaved (a shuffled order per round, each M in turn) so that machine noise hits
them alike; medians over rounds. The per-step numbers add up a gpt2-large step:
36 x (c_attn + attn.c_proj + c_fc + mlp.c_proj) + head.

Each candidate maps fp32 weights [out, in] and bias to its own format once (`prepare`) and runs
x [M, in] -> [M, out] (`run`), x in the dtype it computes in. The error column is the largest
|y - y_fp32| relative to max |y_fp32| on the c_fc shape, M = 5.

Writes <out>/results.json and <out>/results.md.
"""

import argparse
import random
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from gpt2.speed import native
from gpt2.speed.fast_linear import NativeInt8Linear, NativeRowsLinear, NativeW8A8Linear

from .common import BYTES_PER_GB, machine_info, markdown_table, measure_read_bandwidth, write_results

SHAPES = {  # name: (out_features, in_features, times per gpt2-large step)
    "c_attn": (3840, 1280, 36),
    "attn.c_proj": (1280, 1280, 36),
    "c_fc": (5120, 1280, 36),
    "mlp.c_proj": (1280, 5120, 36),
    "head": (50257, 1280, 1),
}
COPY_BYTES = 64 * 2**20  # bytes (in each candidate's format) of a shape's copies: 2x the L3 cache
ROWS = range(1, 10)


# ---------------------------------------------------------------------------------------------
# Candidates: name -> (prepare(w fp32 [N, K], b fp32 [N]) -> state, run(x, state) -> y, x dtype)
# ---------------------------------------------------------------------------------------------

def _onednn(x, s):
    return torch.ops.mkldnn._linear_pointwise(x, s[0], s[1], "none", [], "")


def _flinear(x, s):
    return F.linear(x, s[0], s[1])


def _mm(x, s):
    """torch.mm(W, x.T): the weight as the left operand (gpt2.speed.kernels' "mm" path)."""
    return torch.mm(s[0], x.T).T + s[1]


def _cast(dtype):
    return lambda w, b: (w.to(dtype), b.to(dtype))


def _prepacked_bf16(batch_size):
    def prepare(w, b):
        wb = w.to(torch.bfloat16)
        return torch.ops.mkldnn._reorder_linear_weight(wb, batch_size), b.to(torch.bfloat16)
    return prepare


def _prepacked_fp32(batch_size):
    return lambda w, b: (torch.ops.mkldnn._reorder_linear_weight(w, batch_size), b)


def _mkl_packed(batch_size):
    """MKL's packed sgemm (cblas_sgemm_pack, what inductor's CPU freezing uses): packed for one
    row count; another row count runs on the plain weight."""
    return lambda w, b: (torch.ops.mkl._mkl_reorder_linear_weight(w, batch_size), w, b, batch_size)


def _run_mkl_packed(x, s):
    return torch.ops.mkl._mkl_linear(x, s[0], s[1], s[2], s[3])


def _int8_as_bf16(w, b):
    """gpt2.speed.fast_linear.Int8AsBF16's layout: q as bfloat16 integers, pre-packed; scale [1, N]."""
    q, scale = int8_per_channel(w)
    return (torch.ops.mkldnn._reorder_linear_weight(q.to(torch.bfloat16), 1), scale.to(torch.bfloat16)[None],
            b.to(torch.bfloat16))


def _run_int8_as_bf16(x, s):
    return torch.ops.mkldnn._linear_pointwise.binary(x, s[1].expand(x.shape[0], -1), s[0], None, "mul") + s[2]


def _fbgemm_fp16(w, b):
    return (torch.ops.quantized.linear_prepack_fp16(w, b),)


def _run_fbgemm_fp16(x, s):
    return torch.ops.quantized.linear_dynamic_fp16(x, s[0])


def _native(dtype, avx2_build: bool = False, avx_vnni: bool = False):
    """Our C kernel (gpt2/speed/csrc/rows_linear.c): weights packed in panels, in dtype (torch.int8:
    per-channel int8; torch.uint8: the w8a8 computation, int8 weights and inputs). avx2_build: its
    AVX2 build even where the CPU has AVX-512 (whose build is the default there), to time the two
    side by side; avx_vnni: that build with AVX-VNNI (without, where False)."""
    def prepare(w, b):
        if dtype == torch.uint8:
            kernel = NativeW8A8Linear(*int8_per_channel(w))
        else:
            kernel = NativeInt8Linear(*int8_per_channel(w)) if dtype == torch.int8 else NativeRowsLinear(w, dtype)
        if avx2_build:
            kernel.lib = native.library(wide_build=False, avx_vnni_build=avx_vnni)
        return (kernel, b)
    return prepare


def _run_native(x, s):
    return s[0](x, s[1])


def int8_per_channel(w):
    """Symmetric per-output-channel int8: w ~ q * scale, q in [-127, 127], scale [N] fp32."""
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def _int8pack(x_dtype):
    def prepare(w, b):
        q, scale = int8_per_channel(w)
        return q, scale.to(x_dtype), b.to(x_dtype)
    return prepare


def _run_int8pack(x, s):
    return torch._weight_int8pack_mm(x, s[0], s[1]) + s[2]


def _int4pack(w, b, group_size=128):
    """gpt-fast's CPU int4 layout: asymmetric groups of 128 along in_features. The kernel wants
    out_features a multiple of 16, so the head's 50257 rows are padded (and the output cut)."""
    N = w.shape[0]
    w = F.pad(w, (0, 0, 0, -N % 16))
    N, K = w.shape
    g = w.reshape(N, K // group_size, group_size)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    zero_point = lo + 8 * scale  # gpt-fast's convention: w = (q - 8) * scale + zero
    q = torch.round((g - lo) / scale).clamp(0, 15).to(torch.int32).reshape(N, K)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    scales_and_zeros = torch.stack([scale.squeeze(-1), zero_point.squeeze(-1)], dim=-1)
    scales_and_zeros = scales_and_zeros.transpose(0, 1).contiguous().to(torch.bfloat16)
    return packed, scales_and_zeros, b.to(torch.bfloat16), group_size


def _run_int4pack(x, s):
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, s[0], s[3], s[1])
    return y[:, :s[2].shape[0]] + s[2]


def _fbgemm_int8_dynamic(w, b):
    """W8A8 dynamic (torch.ao's quantize_dynamic): per-channel int8 weights, activations
    quantized per tensor on the fly, int32 accumulation in fbgemm."""
    q, scale = int8_per_channel(w)
    qw = torch._make_per_channel_quantized_tensor(q, scale.double(), torch.zeros_like(scale, dtype=torch.long), 0)
    return (torch.ops.quantized.linear_prepack(qw, b),)


def _run_fbgemm_int8_dynamic(x, s):
    return torch.ops.quantized.linear_dynamic(x, s[0])


def _blocked_upcast(dtype, block_rows=128):
    """Weights stored in `dtype`, cut into row blocks; each block is upcast to fp32 (small enough
    to stay in L2) and multiplied there."""
    def prepare(w, b):
        blocks = list(w.to(dtype).split(block_rows))
        return blocks, b
    return prepare


def _run_blocked_upcast(x, s):
    blocks, b = s
    out = torch.empty(x.shape[0], b.shape[0])
    row = 0
    for blk in blocks:
        n = blk.shape[0]
        torch.mm(x, blk.float().t(), out=out[:, row:row + n])
        row += n
    return out.add_(b)


def _torchao(config_name):
    def prepare(w, b):
        import torchao.quantization as tq
        lin = torch.nn.Linear(w.shape[1], w.shape[0], dtype=torch.bfloat16)
        lin.weight.data.copy_(w)
        lin.bias.data.copy_(b)
        config = {"int8wo": lambda: tq.Int8WeightOnlyConfig(),
                  "int8dyn": lambda: tq.Int8DynamicActivationInt8WeightConfig()}[config_name]()
        tq.quantize_(lin, config)
        return (lin,)
    return prepare


def _run_module(x, s):
    return s[0](x)


def _compiled_upcast(dtype):
    """torch.compile (inductor, needs a C++ compiler at run time) of F.linear with the weight
    stored in `dtype` and upcast to fp32 inside the compiled function."""
    fn = torch.compile(lambda x, w, b: F.linear(x, w.float(), b), dynamic=True)

    def prepare(w, b):
        return fn, w.to(dtype), b
    return prepare


def _run_compiled(x, s):
    return s[0](x, s[1], s[2])


CANDIDATES = {
    # name: (prepare, run, activation dtype, what it is)
    "fp32_onednn": (lambda w, b: (w, b), _onednn, torch.float32, "fp32, oneDNN (linear()'s float32 path)"),
    "fp32_mkl": (lambda w, b: (w, b), _flinear, torch.float32, "fp32, F.linear (MKL)"),
    "fp32_mm": (lambda w, b: (w, b), _mm, torch.float32, "fp32, torch.mm(W, x.T) (gpt2.speed.kernels' mm path)"),
    "fp32_onednn_packed1": (_prepacked_fp32(1), _onednn, torch.float32, "fp32, oneDNN, weights pre-packed for M=1"),
    "fp32_onednn_packed5": (_prepacked_fp32(5), _onednn, torch.float32, "fp32, oneDNN, weights pre-packed for M=5"),
    "fp32_mkl_packed5": (_mkl_packed(5), _run_mkl_packed, torch.float32, "fp32, MKL packed sgemm for M=5 (other M: plain MKL)"),
    "bf16_flinear": (_cast(torch.bfloat16), _flinear, torch.bfloat16, "bf16, F.linear"),
    "bf16_mm": (_cast(torch.bfloat16), _mm, torch.bfloat16, "bf16, torch.mm(W, x.T)"),
    "bf16_onednn": (_cast(torch.bfloat16), _onednn, torch.bfloat16, "bf16, oneDNN, plain weights (GPT2_FAST_LINEAR=0)"),
    "bf16_onednn_packed1": (_prepacked_bf16(1), _onednn, torch.bfloat16, "bf16, oneDNN, weights pre-packed for M=1 (dtype=\"bfloat16\")"),
    "bf16_onednn_packed": (_prepacked_bf16(None), _onednn, torch.bfloat16, "bf16, oneDNN, weights pre-packed (no M hint)"),
    "fp16_flinear": (_cast(torch.float16), _flinear, torch.float16, "fp16, F.linear"),
    "fp16_fbgemm": (_fbgemm_fp16, _run_fbgemm_fp16, torch.float32, "fp16 weights, fp32 math, fbgemm (quantized.linear_dynamic_fp16; quantize=\"fp16\")"),
    "fp16_native": (_native(torch.float16), _run_native, torch.float32, "fp16 weights, fp32 math, our C kernel (gpt2/speed/csrc/rows_linear.c, native-fp16)"),
    "fp32_native": (_native(torch.float32), _run_native, torch.float32, "fp32, our C kernel (gpt2/speed/csrc/rows_linear.c, native-f32)"),
    "int8_native": (_native(torch.int8), _run_native, torch.float32, "int8 per-channel, our C kernel (gpt2/speed/csrc/rows_linear.c, native-int8): int8pack's numbers"),
    "fp16_native_avx2": (_native(torch.float16, True), _run_native, torch.float32, "fp16_native, its AVX2 build (the same as fp16_native on a CPU without AVX-512)"),
    "int8_native_avx2": (_native(torch.int8, True), _run_native, torch.float32, "int8_native, its AVX2 build (the same as int8_native on a CPU without AVX-512)"),
    "int8_w8a8_native": (_native(torch.uint8), _run_native, torch.float32, "w8a8: int8 weights and inputs in blocks of 32, integer dot products, our C kernel (native-w8a8; AVX512-VNNI where the CPU has it)"),
    "int8_w8a8_native_avx2": (_native(torch.uint8, True), _run_native, torch.float32, "int8_w8a8_native, its AVX2 build (vpmaddwd)"),
    "int8_w8a8_native_avx_vnni": (_native(torch.uint8, True, True), _run_native, torch.float32, "int8_w8a8_native, its AVX2 build with AVX-VNNI (vpdpbusd on 8 lanes; a CPU with AVX-VNNI)"),
    "bf16_blocked_upcast": (_blocked_upcast(torch.bfloat16), _run_blocked_upcast, torch.float32, "bf16 weights, 128-row tiles upcast to fp32, oneDNN/MKL sgemm per tile"),
    "bf16_compile_upcast": (_compiled_upcast(torch.bfloat16), _run_compiled, torch.float32, "bf16 weights, torch.compile(F.linear(x, w.float()))"),
    "int8_pack_bf16": (_int8pack(torch.bfloat16), _run_int8pack, torch.bfloat16, "int8 per-channel, torch._weight_int8pack_mm, bf16 x (quantize=\"int8\")"),
    "int8_bf16_onednn": (_int8_as_bf16, _run_int8_as_bf16, torch.bfloat16, "int8 per-channel as bf16 integers, oneDNN pre-packed, scale as post-op (int8-bf16)"),
    "int8_pack_fp32": (_int8pack(torch.float32), _run_int8pack, torch.float32, "int8 per-channel, torch._weight_int8pack_mm, fp32 x"),
    "int8_fbgemm_dynamic": (_fbgemm_int8_dynamic, _run_fbgemm_int8_dynamic, torch.float32, "int8 weights AND activations (W8A8 dynamic), fbgemm"),
    "int8_blocked_upcast": (_blocked_upcast(torch.int8), _run_blocked_upcast, torch.float32, "int8 tiles upcast to fp32 (scales not applied: speed only)"),
    "int4_pack": (_int4pack, _run_int4pack, torch.bfloat16, "int4 groups of 128, aten._weight_int4pack_mm_for_cpu (gpt-fast)"),
    "torchao_int8wo": (_torchao("int8wo"), _run_module, torch.bfloat16, "torchao Int8WeightOnlyConfig, bf16 x"),
    "torchao_int8dyn": (_torchao("int8dyn"), _run_module, torch.bfloat16, "torchao Int8DynamicActivationInt8WeightConfig, bf16 x"),
}


def state_bytes(state) -> int:
    """Bytes of weights a call reads (tensors in the state; packed fbgemm/oneDNN weights and
    modules are counted from their known formats by the caller)."""
    total = 0
    for t in state if isinstance(state, (tuple, list)) else (state,):
        if isinstance(t, list):
            total += state_bytes(t)
        elif isinstance(t, torch.Tensor) and t.layout == torch.strided:
            total += t.numel() * t.element_size()
    return total


WEIGHT_BITS = {"fp32": 32, "bf16": 16, "fp16": 16, "int8": 8, "int4": 4, "torchao_int8": 8}


def nominal_bytes(name, N, K) -> int:
    """Weight bytes of the candidate's format (the number the GB/s column divides by)."""
    key = next(k for k in WEIGHT_BITS if name.startswith(k))
    return N * K * WEIGHT_BITS[key] // 8


def time_pass(run, states, x) -> float:
    """Seconds per call, over one call per weight copy."""
    start = time.perf_counter()
    for s in states:
        run(x, s)
    return (time.perf_counter() - start) / len(states)


@torch.inference_mode()
def measure(names, rounds, rows, seed=0):
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    results = {}  # name -> shape -> M -> [seconds]
    errors = {}
    failed = {}
    for shape, (N, K, _) in SHAPES.items():
        w = torch.randn(N, K, generator=g) * 0.02
        b = torch.randn(N, generator=g) * 0.02
        xs = {M: torch.randn(M, K, generator=g) for M in rows}
        reference = {M: F.linear(xs[M], w, b) for M in rows}
        prepared = {}
        for name in names:
            prepare, run, x_dtype, _ = CANDIDATES[name]
            copies = max(1, -(-COPY_BYTES // nominal_bytes(name, N, K)))
            try:
                # Distinct copies (a tiny perturbation) so that no packing cache can share them.
                states = [prepare(w if i == 0 else w * (1 + 1e-3 * i), b) for i in range(copies)]
                y = run(xs[5 if 5 in rows else rows[0]].to(x_dtype), states[0]).float()
                ref = reference[5 if 5 in rows else rows[0]]
                err = ((y - ref).abs().max() / ref.abs().max()).item()
                for M in rows:  # warm up every M once (packing, compilation, first-touch)
                    run(xs[M].to(x_dtype), states[0])
                prepared[name] = states
                errors.setdefault(name, {})[shape] = err
            except Exception as e:  # a candidate this build lacks: report it, go on
                failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                print(f"  {name} on {shape}: FAILED {failed[name]}", flush=True)
        for r in range(rounds):
            order = list(prepared)
            rng.shuffle(order)
            for M in rows:
                for name in order:
                    _, run, x_dtype, _ = CANDIDATES[name]
                    x = xs[M].to(x_dtype)
                    t = time_pass(run, prepared[name], x)
                    results.setdefault(name, {}).setdefault(shape, {}).setdefault(M, []).append(t)
        print(f"  {shape} [{N}x{K}]: done", flush=True)
        del prepared
    return results, errors, failed


def summarize(results, errors, names, rows):
    """Per candidate: per-shape GB/s at M=1, a gpt2-large step's linears at each M."""
    summary = {}
    for name in names:
        if name not in results or set(results[name]) != set(SHAPES):
            continue
        med = {s: {M: statistics.median(ts) for M, ts in by_m.items()} for s, by_m in results[name].items()}
        best = {s: {M: min(ts) for M, ts in by_m.items()} for s, by_m in results[name].items()}
        step = {M: sum(med[s][M] * SHAPES[s][2] for s in SHAPES) for M in rows}
        step_best = {M: sum(best[s][M] * SHAPES[s][2] for s in SHAPES) for M in rows}
        step_bytes = sum(nominal_bytes(name, N, K) * n for N, K, n in SHAPES.values())
        summary[name] = {
            "description": CANDIDATES[name][3],
            "gb_per_s_m1": {s: nominal_bytes(name, *SHAPES[s][:2]) / med[s][1] / BYTES_PER_GB for s in SHAPES},
            "step_ms": {M: step[M] * 1e3 for M in rows},
            "step_ms_best": {M: step_best[M] * 1e3 for M in rows},
            "step_gb_per_s_m1": step_bytes / step[1] / BYTES_PER_GB,
            "cost_ratio": {M: step[M] / step[1] for M in rows},
            "median_seconds": med,
            "max_rel_error_c_fc": errors.get(name, {}).get("c_fc"),
        }
    return summary


def report(summary, rows, baseline="fp32_onednn"):
    base = summary.get(baseline, {}).get("step_ms", {})
    headers = (["candidate", "step ms M=1", "best", "vs fp32 oneDNN", "GB/s step", "GB/s head", "rel. error"]
               + [f"M={M}" for M in rows if M > 1])
    table = []
    for name, s in sorted(summary.items(), key=lambda kv: kv[1]["step_ms"][1]):
        err = s["max_rel_error_c_fc"]
        table.append([f"`{name}`", f"{s['step_ms'][1]:.1f}", f"{s['step_ms_best'][1]:.1f}",
                      f"{s['step_ms'][1] / base[1]:.2f}" if base else "",
                      f"{s['step_gb_per_s_m1']:.1f}", f"{s['gb_per_s_m1']['head']:.1f}",
                      f"{err:.0e}" if err is not None else ""]
                     + [f"{s['cost_ratio'][M]:.2f}" for M in rows if M > 1])
    return markdown_table(headers, table)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS), help="M values (default 1..9)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("runs/linear_kernels"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = sorted(set(args.rows))
    if 1 not in rows:
        rows = [1] + rows
    print(f"{len(args.candidates)} candidates, {len(SHAPES)} shapes, M = {rows}, {args.rounds} rounds, "
          f"{args.threads} threads", flush=True)
    results, errors, failed = measure(args.candidates, args.rounds, rows)
    bandwidth = measure_read_bandwidth()  # the same run's x.sum(), for the GB/s columns
    summary = summarize(results, errors, args.candidates, rows)
    table = report(summary, rows)
    legend = "\n".join(f"- `{n}`: {CANDIDATES[n][3]}" for n in args.candidates)
    fails = "\n".join(f"- `{n}`: {why}" for n, why in failed.items())
    md = (f"gpt2-large linear layers, one step = 36 x 4 blocks' linears + head; M rows; "
          f"step ms is the median over rounds, best the fastest round (the machine may be shared); columns M=k give cost(M=k) / cost(M=1), medians. "
          f"Read bandwidth in the same run: {bandwidth['gb_per_s_best']:.1f} GB/s (x.sum() over 1 GiB, best; median {bandwidth['gb_per_s_median']:.1f}).\n\n{table}\n\n{legend}\n"
          + (f"\nFailed:\n{fails}\n" if fails else ""))
    print("\n" + md)
    write_results(args.out, {"machine": machine_info(), "rounds": args.rounds, "rows": rows, "read_bandwidth": bandwidth,
                             "summary": summary, "failed": failed}, md)


if __name__ == "__main__":
    main()
