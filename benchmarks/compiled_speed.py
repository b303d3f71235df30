"""The compiled decode path (gpt2/compiled.py) against eager, per weight format: a decoding step
and a 5-row verification, side by side, with the bandwidth floor.

    python -m benchmarks.compiled_speed --checkpoints /tmp/standins --out runs/compiled_speed
    python -m benchmarks.compiled_speed --quick      # gpt2-shaped, fp32 only, few rounds (smoke run)
    python -m benchmarks.compiled_speed --device cuda --formats bf16 fp16   # on a CUDA GPU

Loads a random stand-in of --target-model (gpt2-large by default; timings do not depend on the
weight values) in each --formats format, one format at a time (a gpt2-large in four formats
does not fit a small machine at once), and per format times, round after round, in turns:
eager step, eager verify-5, compiled step, compiled verify-5 (the same model object: the compiled
path is switched on and off, so both read the same weights), in wall time and in this process's
CPU time (in brackets; steadier on a shared machine). A step is one new token on a cache
holding --context positions; a verification is 5 new tokens with the logits of all 5, as
speculative decoding needs them. Medians over --rounds.

The floor is the step's weight bytes / read bandwidth (x.sum() over 1 GiB, measured here, on the
device that decodes): what a step costs if it only read its weights at the speed the machine reads
memory. On a GPU the CPU time in brackets is the host's: the Python that launches the kernels.
"""

import argparse
import gc
import time
from pathlib import Path

import torch

from gpt2 import load_gpt2
from gpt2.compiled import CompiledDecode, eager
from gpt2.device import resolve_device

from .common import (BYTES_PER_GB, DEFAULT_CHECKPOINTS, add_output_options, machine_info, markdown_table,
                     measure_read_bandwidth, median, random_prompt, standin_checkpoint, timed, write_results)
from .weight_formats import FORMATS, format_bytes

VERIFY_ROWS = 5
GPU_FORMATS = {"fp32", "bf16", "fp16"}  # weight formats a GPU computes in directly


@torch.inference_mode()
def forward_seconds(model, cache, context_len, tokens, device=None) -> tuple[float, float]:
    """(wall, CPU) seconds of one forward of len(tokens) new tokens with the logits of all of
    them; rolls back. CPU time is this process's, all threads: on a machine shared with other
    work it counts only what this forward ran (but waiting threads that spin count too)."""
    cpu = time.process_time()
    _, seconds = timed(device, model, torch.tensor([tokens], device=device), cache, len(tokens))
    cpu = time.process_time() - cpu
    cache.truncate(context_len)
    return seconds, cpu


@torch.inference_mode()
def measure_format(folder, fmt: str, context: int, rounds: int, device=None) -> dict:
    model = load_gpt2(folder, device=device, **FORMATS[fmt])
    compiled = CompiledDecode(model)
    prompt, new = random_prompt(context, seed=0), random_prompt(VERIFY_ROWS, seed=1)
    cache = model.new_kv_cache(max_len=context + VERIFY_ROWS)
    model(torch.tensor([prompt], device=device), cache, 1)
    times = {f"{path}_{name}{kind}": [] for path in ("eager", "compiled") for name in ("step", "verify")
             for kind in ("", "_cpu")}
    for r in range(rounds + 1):  # the first round warms up (and compiles)
        for path in ("eager", "compiled"):
            eager(model)
            if path == "compiled":
                model.forward = compiled
            step = forward_seconds(model, cache, context, new[:1], device)
            verify = forward_seconds(model, cache, context, new, device)
            if r:
                for name, (wall, cpu) in (("step", step), ("verify", verify)):
                    times[f"{path}_{name}"].append(wall)
                    times[f"{path}_{name}_cpu"].append(cpu)
        print(f"  {fmt}: round {r + 1}/{rounds + 1}", flush=True)
    print(f"  {fmt}: " + ", ".join(f"{name} {median(ts) * 1e3:.1f} ms" for name, ts in times.items()), flush=True)
    result = {"weight_bytes": format_bytes(model, fmt), "compile_s": compiled.compile_seconds,
              **{name: ts for name, ts in times.items()},
              **{f"{name}_median": median(ts) for name, ts in times.items()}}
    del model, compiled, cache
    gc.collect()
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoints", type=Path, default=DEFAULT_CHECKPOINTS)
    p.add_argument("--target-model", default="gpt2-large")
    p.add_argument("--formats", nargs="+", default=["fp32", "fp16w", "bf16", "int8"],
                   choices=[f for f in FORMATS if not f.endswith("-plain")])
    p.add_argument("--context", type=int, default=160, help="cached positions for the timings")
    p.add_argument("--rounds", type=int, default=10, help="timed rounds per format")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where to decode (cuda: give --formats bf16 fp16 fp32)")
    add_output_options(p, "compiled_speed", "gpt2-shaped, fp32 only, 3 rounds")
    args = p.parse_args(argv)
    if args.quick:
        args.target_model, args.formats, args.rounds = "gpt2", ["fp32"], 3
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if device.type == "cuda" and set(args.formats) - GPU_FORMATS:
        p.error(f"--formats {' '.join(sorted(set(args.formats) - GPU_FORMATS))}: on a GPU, use "
                f"{', '.join(sorted(GPU_FORMATS))} (the others are CPU kernels' formats)")
    folder = standin_checkpoint(args.target_model, args.checkpoints)
    results = {fmt: measure_format(folder, fmt, args.context, args.rounds, device) for fmt in args.formats}
    bandwidth = measure_read_bandwidth(device=device)
    gbs = bandwidth["gb_per_s_median"]
    rows = []
    for fmt, r in results.items():
        e1, e5 = r["eager_step_median"], r["eager_verify_median"]
        c1, c5 = r["compiled_step_median"], r["compiled_verify_median"]
        cpu = {k: r[f"{k}_cpu_median"] for k in ("eager_step", "eager_verify", "compiled_step", "compiled_verify")}
        floor = r["weight_bytes"] / BYTES_PER_GB / gbs
        rows.append([fmt, f"{e1 * 1e3:.0f} ({cpu['eager_step'] * 1e3:.0f})",
                     f"{c1 * 1e3:.0f} ({cpu['compiled_step'] * 1e3:.0f})",
                     f"{c1 / e1:.2f} ({cpu['compiled_step'] / cpu['eager_step']:.2f})",
                     f"{e5 / e1:.2f} ({cpu['eager_verify'] / cpu['eager_step']:.2f})",
                     f"{c5 / c1:.2f} ({cpu['compiled_verify'] / cpu['compiled_step']:.2f})",
                     f"{floor * 1e3:.0f}", f"{floor / min(e1, c1):.2f}", f"{sum(r['compile_s'].values()):.0f}"])
    table = markdown_table(["format", "eager step ms (CPU ms)", "compiled step ms (CPU ms)", "compiled / eager",
                            "eager verify-5 / step", "compiled verify-5 / step", "floor ms",
                            "floor / best step", "compile s"], rows)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{args.threads} threads"
    md = (f"{args.target_model}-shaped random stand-in, {where}, context "
          f"{args.context}, {args.rounds} rounds per format (eager and compiled in turns; formats "
          f"one after another), medians. Read bandwidth {gbs:.1f} GB/s (x.sum() over 1 GiB).\n\n"
          f"{table}\n")
    print("\n" + md)
    write_results(args.out, {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()},
                             "read_bandwidth": bandwidth, "formats": results}, md)


if __name__ == "__main__":
    main()
