"""Peak resident memory and time to the first token, per weight format, for a target alone and for
a target + draft pair, on the first load in a format (cold: the weight cache empty, so the format
is computed and kept) and the next (warm: the weight cache mapped):

    python -m benchmarks.memory --target checkpoints/standins/gpt2-large --draft checkpoints/standins/gpt2
    python -m benchmarks.memory --target T --formats auto,float32-plain --no-pair

Every measurement runs in a process of its own, one at a time (none is killed for memory while
another holds its weights), with this run's own kernel-choice and weight cache folder (a temporary
folder; the user's cache is never touched). Before the cold runs of each format, one unreported
run measures the kernel choices (and for "auto" the format) into that folder, so that cold and
warm differ only by the weight cache. A run: import torch and gpt2, load the model(s), then the
first token (the target's prompt forward, PROMPT_LENGTH tokens, and for the pair the draft's).
It reports:

  - peak RSS: the process's peak resident memory (getrusage's ru_maxrss: PyTorch and Python
    included, mapped file pages once read included);
  - the bytes a step reads: every tensor the model(s) hold (gpt2.speed.kernels.held_bytes);
  - load s: load_gpt2 alone; first token s: load + the prompt's forward (imports not counted).

"float32-plain" is load_gpt2(path), the model as written (nothing cached: it is the baseline). llama.cpp's
figures for the same GGUF are given where a llama.cpp build is on the PATH (llama-cli); where it
is not, the table says so and nothing is built.
"""

import argparse
import json
import logging
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from .common import machine_info, markdown_table, random_prompt

PROMPT_LENGTH = 16
FORMAT_ARGS = {"auto": {}, "float32-plain": {"plain": True},
               "float32": {"dtype": "float32"}, "bfloat16": {"dtype": "bfloat16"},
               "fp16": {"quantize": "fp16"}, "int8": {"dtype": "float32", "quantize": "int8"}}


def child(target: str, draft: str | None) -> None:
    """One run (its own process): load, the first token, print one JSON line."""
    t_start = time.perf_counter()
    import torch

    from gpt2.speed import load_accelerated
    from gpt2.speed import kernels

    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the load's kernel line, to stderr
    kwargs = json.loads(os.environ["MEMORY_ARGS"])
    t0 = time.perf_counter()
    from gpt2 import load_gpt2
    load = load_gpt2 if kwargs.pop("plain", False) else partial(load_accelerated, **kwargs)
    models = [load(target)] + ([load(draft)] if draft else [])
    load_s = time.perf_counter() - t0
    load_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    prompt = torch.tensor([random_prompt(PROMPT_LENGTH, seed=0)])
    with torch.inference_mode():
        token = [int(m(prompt)[0, -1].argmax()) for m in models][0]
    first_token_s = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # (before anything else runs)
    print(json.dumps({"load_s": load_s, "first_token_s": first_token_s, "token": token,
                      "import_s": t0 - t_start,
                      "held_gb": sum(kernels.held_bytes(m) for m in models) / 1e9,
                      "peak_rss_gb": peak, "load_peak_rss_gb": load_peak,
                      "format": getattr(models[0], "quantize", None) or str(models[0].wpe.weight.dtype).removeprefix("torch.")}))


def run(target: Path, draft: Path | None, env: dict) -> dict:
    command = [sys.executable, "-m", "benchmarks.memory", "--child", str(target)] + ([str(draft)] if draft else [])
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: a run failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["stderr"] = done.stderr.strip()
    result["mapped"] = "mapped from the weight cache" in done.stderr
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, default=None, help="the target's checkpoint folder (required)")
    parser.add_argument("--draft", type=Path, default=None, help="the draft's checkpoint folder (the pair's rows)")
    parser.add_argument("--formats", default="auto,int8,float32-plain",
                        help=f"comma-separated, from {','.join(FORMAT_ARGS)} (default auto,int8,float32-plain)")
    parser.add_argument("--child", nargs="+", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child[0], args.child[1] if len(args.child) > 1 else None)
    if args.target is None:
        parser.error("--target is required: a checkpoint folder")
    formats = args.formats.split(",")
    if unknown := [f for f in formats if f not in FORMAT_ARGS]:
        sys.exit(f"error: unknown format(s) {', '.join(unknown)}: use {', '.join(FORMAT_ARGS)}")
    for folder in [args.target] + ([args.draft] if args.draft else []):
        if not (folder / "model.safetensors").is_file():
            sys.exit(f"error: {folder} has no model.safetensors (python -m offline.random_weights --size "
                     f"gpt2-large --out {folder} writes a stand-in)")
    info, rows = machine_info(), []
    setups = [("target", None)] + ([("pair", args.draft)] if args.draft else [])
    with tempfile.TemporaryDirectory(prefix="memory-") as cache_dir:
        weights = Path(cache_dir) / "weights"
        base = {k: v for k, v in os.environ.items() if k not in ("GPT2_MEASURE_KERNELS", "GPT2_FAST_LINEAR",
                                                                 "GPT2_WEIGHT_CACHE")}
        base["GPT2_KERNEL_CACHE"] = str(Path(cache_dir) / "kernels.json")
        for fmt in formats:
            env = {**base, "MEMORY_ARGS": json.dumps(FORMAT_ARGS[fmt])}
            run(args.target, None, env)  # measures the kernel choices (not reported)
            for setup, draft in setups:
                shutil.rmtree(weights, ignore_errors=True)
                for load in ("cold", "warm"):
                    r = run(args.target, draft, env)
                    rows.append([fmt, setup, load, r["format"], "yes" if r["mapped"] else "no",
                                 f"{r['held_gb']:.2f}", f"{r['peak_rss_gb']:.2f}",
                                 f"{r['peak_rss_gb'] / r['held_gb']:.2f}", f"{r['load_s']:.1f}",
                                 f"{r['first_token_s']:.1f}"])
                    print(" | ".join(rows[-1]), flush=True)
    llama = shutil.which("llama-cli")
    print(f"\ntarget {args.target}" + (f", draft {args.draft}" if args.draft else "")
          + f"; CPU: {info['cpu']}, {info['torch_threads']} torch threads, torch {info['torch']}; load average "
          f"before: {' '.join(f'{x:.1f}' for x in info['load_average'])}, after: "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(markdown_table(["format asked", "models", "load", "format", "weights mapped", "bytes held GB",
                          "peak RSS GB", "peak / held", "load s", "first token s"], rows))
    print("\nllama.cpp: " + (f"{llama} is on the PATH, but this script does not run it yet" if llama else
                             "not built here (no llama-cli on the PATH): skipped"))


if __name__ == "__main__":
    main()
