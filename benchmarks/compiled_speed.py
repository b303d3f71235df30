"""The decode paths side by side, per weight format: eager, compiled (gpt2/speed/compiled.py) and, on a
CUDA GPU, CUDA graphs (gpt2/speed/cuda_graph.py); a decoding step and a 5-row verification, with the
bandwidth floor.

    python -m benchmarks.compiled_speed --checkpoints /tmp/standins --out runs/compiled_speed
    python -m benchmarks.compiled_speed --quick      # gpt2-shaped, fp32 only, few rounds (smoke run)
    python -m benchmarks.compiled_speed --device cuda --formats bf16 fp16 --paths eager compiled graph

Loads a random stand-in of --target-model (gpt2-large by default; timings do not depend on the
weight values) in each --formats format, one format at a time (a gpt2-large in four formats
does not fit a small machine at once), and per format times, round after round, each path in
turn: its step, its verify-5 (the same model object and cache: the paths are switched on and
off, so all read the same weights), in wall time and in this process's CPU time (in brackets;
steadier on a shared machine). A step is one new token on a cache holding --context positions;
a verification is 5 new tokens with the logits of all 5, as speculative decoding needs them. Medians over --rounds.

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
from gpt2.speed.compiled import CompiledDecode, eager
from gpt2.speed.cuda_graph import graph_decode, ungraph
from gpt2.speed.device import resolve_device

from .common import (BYTES_PER_GB, DEFAULT_CHECKPOINTS, add_output_options, machine_info, markdown_table,
                     measure_read_bandwidth, median, random_prompt, standin_checkpoint, timed, write_results)
from .weight_formats import FORMATS, format_bytes

VERIFY_ROWS = 5
GPU_FORMATS = {"fp32", "bf16", "fp16"}  # weight formats a GPU computes in directly
PATHS = ["eager", "compiled", "graph", "compiled-graph"]
GRAPH_PATHS = {"graph", "compiled-graph"}  # recorded as CUDA graphs (a GPU only)


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


def use_path(model, path: str, compiled: CompiledDecode):
    """Put `model` on one decode path: eager, compiled (this CompiledDecode), graph (the eager
    block recorded as CUDA graphs) or compiled-graph (the compiled block recorded)."""
    ungraph(eager(model))
    if path == "compiled":
        model.forward = compiled
    elif path in GRAPH_PATHS:
        graph_decode(model, compiled=path == "compiled-graph")


@torch.inference_mode()
def measure_format(folder, fmt: str, context: int, rounds: int, paths: list[str], device=None) -> dict:
    model = load_gpt2(folder, device=device, **FORMATS[fmt])
    compiled = CompiledDecode(model)
    prompt, new = random_prompt(context, seed=0), random_prompt(VERIFY_ROWS, seed=1)
    # A cache from the graphed path's pool serves every path (eager reads the same buffers).
    use_path(model, "graph" if GRAPH_PATHS & set(paths) else "eager", compiled)
    cache = model.new_kv_cache(max_len=context + VERIFY_ROWS)
    model(torch.tensor([prompt], device=device), cache, 1)
    times = {f"{path}_{name}{kind}": [] for path in paths for name in ("step", "verify") for kind in ("", "_cpu")}
    setup = {}
    for r in range(rounds + 1):  # the first round warms up (compiles, records the graphs)
        for path in paths:
            use_path(model, path, compiled)
            t0 = time.perf_counter()
            step = forward_seconds(model, cache, context, new[:1], device)
            verify = forward_seconds(model, cache, context, new, device)
            if not r:
                setup[path] = time.perf_counter() - t0
            else:
                for name, (wall, cpu) in (("step", step), ("verify", verify)):
                    times[f"{path}_{name}"].append(wall)
                    times[f"{path}_{name}_cpu"].append(cpu)
        print(f"  {fmt}: round {r + 1}/{rounds + 1}", flush=True)
    print(f"  {fmt}: " + ", ".join(f"{name} {median(ts) * 1e3:.1f} ms" for name, ts in times.items()), flush=True)
    result = {"weight_bytes": format_bytes(model, fmt), "compile_s": compiled.compile_seconds,
              "first_round_s": setup, **{name: ts for name, ts in times.items()},
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
    p.add_argument("--paths", nargs="+", default=["eager", "compiled"], choices=PATHS,
                   help="decode paths to time, in turns (graph, compiled-graph: CUDA graphs of the eager or "
                        "the compiled block, a GPU only; the first is the one the others are compared with)")
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
    if GRAPH_PATHS & set(args.paths) and device.type != "cuda":
        p.error("--paths graph, compiled-graph: CUDA graphs need a CUDA GPU (--device cuda)")
    folder = standin_checkpoint(args.target_model, args.checkpoints)
    results = {fmt: measure_format(folder, fmt, args.context, args.rounds, args.paths, device)
               for fmt in args.formats}
    bandwidth = measure_read_bandwidth(device=device)
    gbs = bandwidth["gb_per_s_median"]
    rows = []
    for fmt, r in results.items():
        floor = r["weight_bytes"] / BYTES_PER_GB / gbs
        e1 = r[f"{args.paths[0]}_step_median"]
        for path in args.paths:
            t1, t5 = r[f"{path}_step_median"], r[f"{path}_verify_median"]
            c1, c5 = r[f"{path}_step_cpu_median"], r[f"{path}_verify_cpu_median"]
            rows.append([fmt, path, f"{t1 * 1e3:.1f} ({c1 * 1e3:.1f})", f"{t1 / e1:.2f}",
                         f"{t5 / t1:.2f} ({c5 / c1:.2f})", f"{floor * 1e3:.2f}", f"{floor / t1:.2f}",
                         f"{r['first_round_s'][path]:.1f}"])
    table = markdown_table(["format", "path", "step ms (CPU ms)", f"step / {args.paths[0]}'s",
                            "verify-5 / step (CPU)", "floor ms", "floor / step", "first round s"], rows)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{args.threads} threads"
    md = (f"{args.target_model}-shaped random stand-in, {where}, context "
          f"{args.context}, {args.rounds} rounds per format (the paths in turns; formats one after "
          f"another), medians; the first round (compiling, recording graphs) is not counted. Read "
          f"bandwidth {gbs:.1f} GB/s (x.sum() over 1 GiB).\n\n"
          f"{table}\n")
    print("\n" + md)
    write_results(args.out, {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()},
                             "read_bandwidth": bandwidth, "formats": results}, md)


if __name__ == "__main__":
    main()
