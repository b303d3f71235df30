"""The CPU's fused step (gpt2/speed/native_step.py, `--compile fused`) beside the eager forward on one
pair: plain greedy decoding, greedy speculative decoding (a chain of gamma drafts) and a token tree,
each path in turn, round after round (so a busy moment slows each alike); the median seconds of
each, and whether each gives that path's plain greedy tokens.

    python -m benchmarks.fused_cpu_speed --format auto --gamma 4 --tree 2 2 --rounds 3
    python -m benchmarks.fused_cpu_speed --target DIR --draft DIR     # a pair of your own

The default pair is benchmarks.speculative_speed's: a gpt2-large-shaped random-weight target and
its first 6 blocks as the draft (its agreement is the stand-ins', not real GPT-2's). The fused step
takes the int8 and w8a8 formats; where a model cannot take it, the note says why and that row runs
eagerly (the table says which path ran).
"""

import argparse
import time
from pathlib import Path

import torch

from gpt2.speed import load_accelerated
from gpt2.speed.accelerator import FORMAT_NAMES
from gpt2.speed.native_step import fused_decode, is_fused, unfuse
from spec_decoding import GREEDY, autoregressive_generate, speculative_sampling_greedy, tree_speculative_sampling

from .common import (DEFAULT_CHECKPOINTS, add_output_options, machine_info, markdown_table, median, random_prompt,
                     standin_pair, write_results)

PATHS = ("eager", "fused")


def methods(target, draft, prompt: list[int], new_tokens: int, gamma: int, tree: tuple[int, ...]) -> dict:
    """name -> a function giving that method's greedy tokens."""
    return {"plain": lambda: autoregressive_generate(target, prompt, new_tokens).tokens,
            f"chain, gamma {gamma}": lambda: speculative_sampling_greedy(target, draft, prompt, new_tokens, gamma).tokens,
            f"tree {tree}": lambda: tree_speculative_sampling(target, draft, prompt, new_tokens, tree,
                                                              sampling=GREEDY).tokens}


@torch.inference_mode()
def run(target, draft, prompt, args) -> dict:
    """{path: {method: {"seconds": [..], "equal_to_plain": bool}}, "ran": {path: fused or not}}."""
    jobs = methods(target, draft, prompt, args.new_tokens, args.gamma, tuple(args.tree))
    results = {path: {name: {"seconds": []} for name in jobs} for path in PATHS}
    ran = {}
    for round_ in range(args.rounds + 1):  # round 0: a warm-up, untimed
        for path in PATHS:
            for model in (target, draft):
                fused_decode(model) if path == "fused" else unfuse(model)
            ran[path] = "fused" if is_fused(target) else "eager"
            tokens = {}
            for name, job in jobs.items():
                t0 = time.perf_counter()
                tokens[name] = job()
                if round_:
                    results[path][name]["seconds"].append(time.perf_counter() - t0)
            for name in jobs:
                results[path][name]["equal_to_plain"] = tokens[name] == tokens["plain"]
    for model in (target, draft):
        unfuse(model)
    return {"paths": results, "ran": ran}


def report(res: dict) -> str:
    a = res["settings"]
    rows = []
    for path, by_method in res["paths"].items():
        plain = median(by_method["plain"]["seconds"])
        for name, r in by_method.items():
            s = median(r["seconds"])
            rows.append([f"{path} (ran: {res['ran'][path]})", name, f"{s:.3f}", f"{plain / s:.2f}x",
                         "yes" if r["equal_to_plain"] else "**no**"])
    return "\n".join([
        f"# The fused CPU step beside eager ({a['format']}, {a['threads'] or 'default'} threads)\n",
        f"Target {res['target_dir']}, draft {res['draft_dir']}; a {a['prompt_len']}-token random prompt "
        f"(seed {a['prompt_seed']}), {a['new_tokens']} greedy tokens, medians of {a['rounds']} interleaved "
        f"rounds. Machine: {res['machine']['cpu']}.\n",
        markdown_table(["path", "method", "seconds", "speed-up over its plain decoding",
                        "tokens equal to its plain decoding's"], rows), ""])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoints", type=Path, default=DEFAULT_CHECKPOINTS, help="where the stand-ins are kept")
    p.add_argument("--target", help="a target checkpoint folder (with --draft: that pair instead of the stand-ins)")
    p.add_argument("--draft", help="its draft's checkpoint folder")
    p.add_argument("--format", default="auto", choices=list(FORMAT_NAMES), help="both models' format (default auto)")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--tree", type=int, nargs="+", default=[2, 2], help="the tree's branching per depth")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--prompt-seed", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, help="PyTorch threads (default: its own choice)")
    add_output_options(p, "fused_cpu_speed", "gpt2-shaped stand-ins with a 2-block draft, 16 tokens, 1 round")
    args = p.parse_args(argv)
    if (args.target is None) != (args.draft is None):
        p.error("--target and --draft go together (or leave both out for the stand-ins)")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.target:
        target_dir, draft_dir = Path(args.target), Path(args.draft)
    else:
        shape, layers = ("gpt2", 2) if args.quick else ("gpt2-large", 6)
        target_dir, draft_dir = standin_pair(args.checkpoints, shape, layers, 0.04, 0.1)
    if args.quick:
        args.new_tokens, args.rounds = 16, 1
    target, draft = (load_accelerated(folder, format=args.format) for folder in (target_dir, draft_dir))
    prompt = random_prompt(args.prompt_len, seed=args.prompt_seed, vocab_size=target.config.vocab_size)
    res = {"machine": machine_info(), "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           "target_dir": str(target_dir), "draft_dir": str(draft_dir), **run(target, draft, prompt, args)}
    md = report(res)
    print(md)
    write_results(args.out, res, md)


if __name__ == "__main__":
    main()
