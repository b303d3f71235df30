"""Loading with the kernel choice kept (gpt2/kernel_cache.py) against the plain face, on random-
weight stand-ins of a real size:

    python -m benchmarks.load_time                          # gpt2-large stand-ins, 5 pairs of runs
    python -m benchmarks.load_time --model gpt2 --repeats 3

Every load runs in a fresh process (nothing kept in memory between them), with a cache file of
this run's own (a temporary folder; the user's cache is never touched):

  1. the first load, with the cache empty: dtype "auto" measures the format and the kernels
     (said on stderr) and keeps them;
  2. then, interleaved so that a busy spell of the machine hits each alike (A B C D A B C D ...):
     A: a load in dtype "auto" that reads the kept choice;
     B: a load with GPT2_FAST_LINEAR=0 (the plain face: float32, nothing measured or attached);
     C: the format A loads, given explicitly, with GPT2_MEASURE_KERNELS=0 (nothing measured or
        read: what A costs beside deciding, i.e. converting and packing the weights);
     D: float32 with the kernels attached (its choice measured in step 1 too, then read).
     Medians of each.

Each run also decodes the same prompt greedily: every later run in the auto format must give the
first run's tokens (the same kernels, so the same rounding). The load time counted is load_gpt2
alone (not Python's or torch's start-up). Stand-ins are written once to --checkpoints.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import DEFAULT_CHECKPOINTS, machine_info, markdown_table, median, random_prompt, standin_checkpoint

PROMPT_LENGTH, NEW_TOKENS = 16, 16


def child(folder: str) -> None:
    """One run (in its own process): load, decode, print one JSON line."""
    import torch

    from gpt2 import kernels, load_gpt2
    from spec_decoding import autoregressive_generate

    kwargs = json.loads(os.environ.get("LOAD_TIME_ARGS", "{}"))  # load_gpt2's options for this run
    t0 = time.perf_counter()
    model = load_gpt2(folder, **kwargs)
    seconds = time.perf_counter() - t0
    tokens = autoregressive_generate(model, random_prompt(PROMPT_LENGTH, seed=0), NEW_TOKENS).tokens
    quantize = getattr(model, "quantize", None)
    print(json.dumps({"load_s": seconds, "tokens": tokens, "threads": torch.get_num_threads(),
                      "format": "fp16" if quantize == "fp16" else str(model.wte.weight.dtype).removeprefix("torch."),
                      "kernels": len(kernels.attached(model))}))


def run(folder: Path, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-m", "benchmarks.load_time", "--child", str(folder)],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: a load failed:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["measured"] = "measuring " in done.stderr
    result["stderr"] = done.stderr.strip()
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load_time", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2-large", help="the stand-ins' size (default gpt2-large)")
    parser.add_argument("--repeats", type=int, default=5, help="pairs of interleaved runs (default 5)")
    parser.add_argument("--checkpoints", type=Path, default=DEFAULT_CHECKPOINTS,
                        help=f"where the stand-ins are written once (default {DEFAULT_CHECKPOINTS})")
    parser.add_argument("--arms", default="ABCD", help="which interleaved loads to run (default ABCD; "
                        "e.g. BD: the plain face against float32 with its kernels)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child)
    folder = standin_checkpoint(args.model, args.checkpoints)
    with tempfile.TemporaryDirectory(prefix="load-time-") as cache_dir:
        base = {**os.environ, "GPT2_KERNEL_CACHE": str(Path(cache_dir) / "kernels.json")}
        base.pop("GPT2_MEASURE_KERNELS", None)
        base.pop("GPT2_FAST_LINEAR", None)
        first = run(folder, base)
        print(f"first load (cache empty): {first['load_s']:.2f} s, {first['format']}, "
              f"measured: {first['measured']}\n  " + first["stderr"].replace("\n", "\n  "), flush=True)
        float32 = {**base, "LOAD_TIME_ARGS": json.dumps({"dtype": "float32"})}
        print("float32 with kernels, first load: " + run(folder, float32)["stderr"].replace("\n", "\n  "))
        same_format = {"fp16": {"quantize": "fp16"}}.get(first["format"], {"dtype": first["format"]})
        arms = {"A: cached choice (auto)": base,
                "B: GPT2_FAST_LINEAR=0": {**base, "GPT2_FAST_LINEAR": "0"},
                f"C: {first['format']} given, nothing measured": {
                    **base, "GPT2_MEASURE_KERNELS": "0", "LOAD_TIME_ARGS": json.dumps(same_format)},
                "D: float32, cached kernels": float32}
        arms = {name: env for name, env in arms.items() if name[0] in args.arms.upper()}
        runs = {name: [] for name in arms}
        for i in range(args.repeats):
            for name, env in arms.items():
                runs[name].append(run(folder, env))
                print(f"  {i + 1}/{args.repeats} {name}: {runs[name][-1]['load_s']:.2f} s", flush=True)
    seconds = {name[0]: median([r["load_s"] for r in rs]) for name, rs in runs.items()}
    cached = runs.get("A: cached choice (auto)", [])
    same = all(r["tokens"] == first["tokens"] and r["format"] == first["format"] for r in cached)
    rows = [[name, rs[0]["format"], rs[0]["kernels"], f"{median([r['load_s'] for r in rs]):.2f}",
             " ".join(f"{r['load_s']:.2f}" for r in rs), any(r["measured"] for r in rs)]
            for name, rs in (("first load, cache empty", [first]), *runs.items())]
    info = machine_info()
    print(f"\n{args.model} stand-ins ({folder}); CPU: {info['cpu']}, {info['torch_threads']} torch threads, "
          f"torch {info['torch']}, load average before: {' '.join(f'{x:.1f}' for x in info['load_average'])}")
    print(markdown_table(["load", "format", "kernels attached", "median s", "each run s", "measured"], rows))
    ratios = {"A / B (cached auto / plain)": "AB", "A / C (deciding: reading the kept choice)": "AC",
              "D / B (float32 with its kernels / plain)": "DB"}
    print("\nmedians: " + "; ".join(f"{what} {seconds[a] / seconds[b]:.3f}" for what, (a, b) in ratios.items()
                                    if a in seconds and b in seconds)
          + (f"; every cached run gave the first run's {NEW_TOKENS} greedy tokens in its format: {same}" if cached else ""))


if __name__ == "__main__":
    main()
