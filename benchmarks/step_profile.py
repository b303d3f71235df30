"""Where a 1-row decoding step's time goes, against the memory read bandwidth measured in the same run.

A batch-1 step must read every weight once, so its floor is weight bytes / read bandwidth
(x.sum() over 1 GiB, as benchmarks/llama_cpp_anchor.py measures it). For each thread count this
prints: the bandwidth, the step's median time and its fraction of the floor, the share of the
step's operator time per operator (torch.profiler); then, interleaved, a step and a 5-row
verification as they are and with every linear layer's kernel replaced by one that returns a
ready zero output ("the rest": LayerNorms, GELU, attention, cache writes, the Python around them),
so the linear layers' own time and read speed come out by difference; and, interleaved A B A B,
the attached 1-row kernel against ATen's matrix-vector product (torch.mv / torch.addmv) as a
candidate (float models only).

    python -m benchmarks.step_profile --checkpoint CHECKPOINT --dtype bfloat16 --threads 2 1
    python -m benchmarks.step_profile --checkpoint CHECKPOINT --dtype float32 --quantize int8 --threads 2
"""

import argparse

import torch
import torch.nn.functional as F
from torch.profiler import profile

from benchmarks.common import measure_read_bandwidth, median, timed
from benchmarks.weight_formats import format_bytes
from gpt2.speed import kernels
from gpt2.speed import load_accelerated


def aten_mv(weight: torch.Tensor):
    """A 1-row kernel on ATen's gemv: x [1, 1, in] -> [1, 1, out] = W x + bias (more rows: F.linear)."""
    def kernel(x, bias):
        rows = x.reshape(-1, x.shape[-1])
        if rows.shape[0] != 1:
            return F.linear(x, weight, bias)
        y = torch.mv(weight, rows[0]) if bias is None else torch.addmv(bias, weight, rows[0])
        return y.reshape(*x.shape[:-1], -1)
    return kernel


def step_seconds(model, token: torch.Tensor, steps: int, rows: int = 1) -> float:
    """Median seconds of one decoding step (1 token, a few cached positions), or of a verification
    of `rows` tokens."""
    cache = model.new_kv_cache(1, 16 + rows * steps)
    model(token.repeat(1, 16), cache=cache)
    return median([timed(None, model, token.repeat(1, rows), cache=cache)[1] for _ in range(steps)])


def use_kernels(layers, by_rows_per_layer) -> None:
    """Give each attached layer the kernels [(max_rows, path, kernel)] of its entry."""
    for layer, by_rows in zip(layers, by_rows_per_layer):
        layer.kernel.by_rows = by_rows


def zero_output(out_features: int):
    """A stand-in kernel: x [..., in] -> zeros [..., out], made once per shape and returned again
    (no work: what a step costs besides its linear layers)."""
    made = {}

    def kernel(x, bias):
        shape = (*x.shape[:-1], out_features)
        if shape not in made:
            made[shape] = torch.zeros(shape, dtype=x.dtype)
        return made[shape]
    return kernel


def operator_shares(model, token: torch.Tensor, steps: int) -> list[tuple[str, float]]:
    """(operator, share of the profiled self time) over a few steps, largest first."""
    cache = model.new_kv_cache(1, 16 + steps)
    model(token.repeat(1, 16), cache=cache)
    with profile() as prof:
        for _ in range(steps):
            model(token, cache=cache)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    return sorted(((e.key, e.self_cpu_time_total / total) for e in events), key=lambda kv: -kv[1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="checkpoint folder or hub name")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quantize", choices=["int8", "fp16", "w8a8"], help="the weights' format (load_gpt2's quantize)")
    parser.add_argument("--threads", type=int, nargs="+", default=[torch.get_num_threads()])
    parser.add_argument("--steps", type=int, default=5, help="steps per measurement")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the kernel comparison")
    args = parser.parse_args(argv)

    model = load_accelerated(args.checkpoint, dtype=args.dtype, quantize=args.quantize)
    kernels.pack_now(model)  # packing happens on a layer's first call: not part of a step
    layers = kernels.attached(model)
    attached_kernels = [layer.kernel.by_rows for layer in layers]
    candidate = [[(rows, "aten-mv", aten_mv(layer.weight)) for rows, _, _ in layer.kernel.by_rows]
                 for layer in layers]
    no_linears = [[(rows, "zero", zero_output(layer.out_features)) for rows, _, _ in layer.kernel.by_rows]
                  for layer in layers]
    step_bytes = format_bytes(model, "auto")  # the bytes its format stores (int8: 1 a weight)
    token = torch.tensor([[464 % model.config.vocab_size]])  # " The" in GPT-2's vocabulary
    with torch.no_grad():
        for threads in args.threads:
            torch.set_num_threads(threads)
            gb_per_s = measure_read_bandwidth()["gb_per_s_best"]
            step = step_seconds(model, token, args.steps)
            floor = step_bytes / (gb_per_s * 1e9)
            print(f"\n{threads} thread(s): read bandwidth {gb_per_s:.1f} GB/s (x.sum, best); step {step * 1e3:.1f} ms, "
                  f"floor {floor * 1e3:.1f} ms ({step_bytes / 1e9:.2f} GB): floor / step {floor / step:.2f}")
            shares = operator_shares(model, token, args.steps)
            print("  share of the step's operator time: " + ", ".join(f"{k} {s:.1%}" for k, s in shares[:6])
                  + (" (our C kernel, called through ctypes, is not an operator the profiler sees)"
                     if any(p.startswith("native") for layer in layers for _, p in layer.kernel.paths()) else ""))
            parts = {(name, rows): [] for name in ("step", "rest") for rows in (1, 5)}
            for _ in range(args.rounds):
                for name, chosen in (("step", attached_kernels), ("rest", no_linears)):
                    use_kernels(layers, chosen)
                    for rows in (1, 5):
                        parts[name, rows].append(step_seconds(model, token, args.steps, rows))
            for rows, what in ((1, "step"), (5, "verify(5)")):
                whole, rest = median(parts["step", rows]), median(parts["rest", rows])
                print(f"  {what}: {whole * 1e3:.1f} ms = linear layers {(whole - rest) * 1e3:.1f} ms"
                      + (f" ({step_bytes / (whole - rest) / 1e9:.1f} GB/s, {step_bytes / (whole - rest) / 1e9 / gb_per_s:.2f}"
                         f" of x.sum)" if rows == 1 and whole > rest else "")
                      + f" + the rest {rest * 1e3:.1f} ms ({rest / whole:.0%})")
            print(f"  verify(5) / step: {median(parts['step', 5]) / median(parts['step', 1]):.2f}")
            use_kernels(layers, attached_kernels)
            if args.quantize:
                print("  (aten-mv runs on float weights: no candidate for quantized ones)")
                continue
            times = {"attached": [], "aten-mv": []}
            for _ in range(args.rounds):
                for name, chosen in (("attached", attached_kernels), ("aten-mv", candidate)):
                    use_kernels(layers, chosen)
                    times[name].append(step_seconds(model, token, args.steps))
            use_kernels(layers, attached_kernels)
            print("  interleaved step medians: " + ", ".join(f"{k} {median(v) * 1e3:.1f} ms" for k, v in times.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
