"""Loading with the kernel choice kept (gpt2/speed/kernel_cache.py) against the plain face, per weight
format, on random-weight stand-ins of a real size:

    python -m benchmarks.load_time                          # gpt2-large stand-ins, 3 rounds
    python -m benchmarks.load_time --model gpt2 --repeats 5 --formats bfloat16,fp16

Every load runs in a fresh process (nothing kept in memory between them), with cache files of
this run's own (a temporary folder; the user's cache is never touched). For dtype "auto" and for
each format "auto" can pick on this machine (float32, bfloat16, fp16, int8: those with a fast path
here):

  1. the first load, with that format's cache empty: it measures the kernels (and for "auto" the
     format; said on stderr) and keeps them;
  2. then, interleaved so that a busy spell of the machine hits each alike (C P E C P E ...):
     C: a load that reads the kept choice (the cached second load);
     P: load_gpt2(path), the model as written (float32: nothing measured, computed or attached);
     E: the cached load, then every kernel packed at once, counted as load (where the packing was
        before it moved to each layer's first call): the load + generate columns say whether
        moving it made a plain generate slower end to end.
     Medians of each.

Each run then decodes the same prompt greedily (PROMPT_LENGTH tokens, --new-tokens new ones) and
times the prompt's forward, the first one-row decode step (where a layer packs on its first call)
and the later steps. Every cached run in a format must give that format's first run's tokens (the
same kernels, so the same rounding). The load time counted is the load alone (not Python's or
torch's start-up). Stand-ins are written once to --checkpoints.
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

PROMPT_LENGTH, NEW_TOKENS = 16, 16  # NEW_TOKENS: the default of --new-tokens
# load_gpt2's options for each format "auto" can pick on a CPU (gpt2.speed.kernels.AUTO_FORMATS).
FORMAT_ARGS = {"auto": {}, "float32": {"dtype": "float32"}, "bfloat16": {"dtype": "bfloat16"},
               "fp16": {"quantize": "fp16"}, "int8": {"dtype": "float32", "quantize": "int8"}}
ARMS = {"C": "cached", "P": "load_gpt2 (the model as written)", "E": "packed at load"}


def child(folder: str) -> None:
    """One run (in its own process): load, decode with each forward timed, print one JSON line."""
    import torch

    from gpt2.speed import load_accelerated
    from gpt2.speed import kernels
    from spec_decoding import autoregressive_generate

    kwargs = json.loads(os.environ.get("LOAD_TIME_ARGS", "{}"))
    t0 = time.perf_counter()
    if os.environ.get("LOAD_TIME_PLAIN") == "1":
        from gpt2 import load_gpt2
        model = load_gpt2(folder)
    else:
        model = load_accelerated(folder, **kwargs)
    packed_at_load = kernels.pack_now(model) if os.environ.get("LOAD_TIME_PACK") == "1" else 0
    load_s = time.perf_counter() - t0
    starts, seconds = [], []
    model.register_forward_pre_hook(lambda *_: starts.append(time.perf_counter()))
    model.register_forward_hook(lambda *_: seconds.append(time.perf_counter() - starts[-1]))
    t0 = time.perf_counter()
    new_tokens = int(os.environ.get("LOAD_TIME_NEW_TOKENS", NEW_TOKENS))
    tokens = autoregressive_generate(model, random_prompt(PROMPT_LENGTH, seed=0), new_tokens).tokens
    generate_s = time.perf_counter() - t0
    quantize = getattr(model, "quantize", None)
    print(json.dumps({"load_s": load_s, "prompt_s": seconds[0], "first_step_s": seconds[1],
                      "step_s": median(seconds[2:]), "generate_s": generate_s, "tokens": tokens,
                      "format": quantize or str(model.wpe.weight.dtype).removeprefix("torch."),
                      "kernels": len(kernels.attached(model)), "packed_at_load": packed_at_load,
                      "threads": torch.get_num_threads()}))


def run(folder: Path, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-m", "benchmarks.load_time", "--child", str(folder)],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: a load failed:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["measured"] = "measuring " in done.stderr
    result["stderr"] = done.stderr.strip()
    return result


def auto_pickable() -> list[str]:
    """The formats dtype="auto" can pick here (those with a fast path on this CPU)."""
    from gpt2.speed import kernels

    return [fmt for fmt, paths in kernels.format_paths().items() if paths]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load_time", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2-large", help="the stand-ins' size (default gpt2-large)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of interleaved runs (default 3)")
    parser.add_argument("--formats", default=None, help="comma-separated, from auto,float32,bfloat16,fp16,int8 "
                        "(default: auto and every format auto can pick here)")
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS,
                        help=f"greedy tokens each run decodes, at least 3 (default {NEW_TOKENS})")
    parser.add_argument("--arms", default="CPE", help="which interleaved loads to run (default CPE)")
    parser.add_argument("--checkpoints", type=Path, default=DEFAULT_CHECKPOINTS,
                        help=f"where the stand-ins are written once (default {DEFAULT_CHECKPOINTS})")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child)
    formats = args.formats.split(",") if args.formats else ["auto", *auto_pickable()]
    unknown = [f for f in formats if f not in FORMAT_ARGS]
    if args.new_tokens < 3:
        sys.exit("error: --new-tokens must be at least 3 (the prompt's step, the first and a later decode step)")
    if unknown:
        sys.exit(f"error: unknown format(s) {', '.join(unknown)}: use {', '.join(FORMAT_ARGS)}")
    arms = [a for a in ARMS if a in args.arms.upper()]
    folder = standin_checkpoint(args.model, args.checkpoints)
    info = machine_info()
    first, runs = {}, {(f, a): [] for f in formats for a in arms}
    with tempfile.TemporaryDirectory(prefix="load-time-") as cache_dir:
        base = {k: v for k, v in os.environ.items() if k not in ("GPT2_MEASURE_KERNELS", "GPT2_FAST_LINEAR")}
        base["LOAD_TIME_NEW_TOKENS"] = str(args.new_tokens)

        def env(fmt: str, arm: str) -> dict:  # each format its own cache file: its first load measures
            return {**base, "GPT2_KERNEL_CACHE": str(Path(cache_dir) / f"{fmt}.json"),
                    "LOAD_TIME_ARGS": json.dumps(FORMAT_ARGS[fmt]),
                    **({"LOAD_TIME_PLAIN": "1"} if arm == "P" else {}), **({"LOAD_TIME_PACK": "1"} if arm == "E" else {})}

        for fmt in formats:
            first[fmt] = run(folder, env(fmt, "C"))
            print(f"first load, {fmt}: {first[fmt]['load_s']:.2f} s ({first[fmt]['format']})\n  "
                  + first[fmt]["stderr"].replace("\n", "\n  "), flush=True)
        for i in range(args.repeats):
            for fmt in formats:
                for arm in arms:
                    runs[fmt, arm].append(run(folder, env(fmt, arm)))
                    r = runs[fmt, arm][-1]
                    print(f"  {i + 1}/{args.repeats} {fmt} {ARMS[arm]}: load {r['load_s']:.2f} s, first step "
                          f"{r['first_step_s']:.2f} s, generate {r['generate_s']:.2f} s", flush=True)

    def cell(rs, key):
        return f"{median([r[key] for r in rs]):.2f}"

    rows, ratios = [], []
    for fmt in formats:
        for name, rs in (("first load (cache empty)", [first[fmt]]),
                         *((ARMS[a], runs[fmt, a]) for a in arms)):
            rows.append([fmt, name, rs[0]["format"], rs[0]["kernels"], cell(rs, "load_s"),
                         " ".join(f"{r['load_s']:.2f}" for r in rs), cell(rs, "prompt_s"), cell(rs, "first_step_s"),
                         f"{1000 * median([r['step_s'] for r in rs]):.0f}", cell(rs, "generate_s"),
                         f"{median([r['load_s'] + r['generate_s'] for r in rs]):.2f}"])
        load = {a: median([r["load_s"] for r in runs[fmt, a]]) for a in arms}
        end_to_end = {a: median([r["load_s"] + r["generate_s"] for r in runs[fmt, a]]) for a in arms}
        same = all(r["tokens"] == first[fmt]["tokens"] for r in runs.get((fmt, "C"), []) + runs.get((fmt, "E"), []))
        ratios.append(f"{fmt}: " + ", ".join(
            [f"cached load / plain load {load['C'] / load['P']:.3f}"] * ("C" in load and "P" in load)
            + [f"cached / packed at load, load + generate {end_to_end['C'] / end_to_end['E']:.3f}"] * (
                "C" in load and "E" in load)
            + [f"every cached and packed-at-load run gave the first run's {args.new_tokens} tokens: {same}"]))
    print(f"\n{args.model} stand-ins ({folder}); CPU: {info['cpu']}, {info['torch_threads']} torch threads, "
          f"torch {info['torch']}, load average before: {' '.join(f'{x:.1f}' for x in info['load_average'])}, "
          f"after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; medians of {args.repeats}")
    print(markdown_table(["format asked", "load", "format", "kernels", "load s", "each load s", "prompt s",
                          "first step s", "later steps ms", "generate s", "load + generate s"], rows))
    print("\n" + "\n".join(ratios))


if __name__ == "__main__":
    main()
