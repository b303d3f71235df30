"""Does gamma="auto" ever lose to plain decoding? Ten runs of each, interleaved, on three pairs.

    python -m benchmarks.auto_gamma --size gpt2 --repeats 10 --max-gen 32 --threads 1
    python -m benchmarks.auto_gamma --target runs/trained_pair/target --draft runs/trained_pair/draft \
        --prompts prompts/code.txt --temperatures 0 1 --repeats 10

With --target and --draft (a trained pair, e.g. offline.train_pair's: real acceptance, which
random stand-ins do not have) the pairs are that pair ("given") and its target drafting for
itself ("cannot"), on the prompts of --prompts (one per line, taken in turn); at a temperature
above 0 plain decoding and auto sample (seeded alike; their tokens then differ, the comparison
is of speed only).

The pairs, random-weight stand-ins of the official shape (a forward's cost does not depend on the
weights; benchmarks/common.py):
  pays      a draft made of the target's first --draft-layers blocks that agrees with it often
            (offline.random_weights.save_agreeing_pair): speculation pays.
  cannot    the target drafting for itself: it always agrees, but a draft step costs a target
            step, so every gamma is slower than the target alone (the break-even alpha is > 1).
  disagrees a cheap draft from another seed's random weights with small embeddings (no copier):
            it costs what the paying draft costs but rarely picks the target's token, so
            speculation loses on acceptance.

For each pair the CostModel is measured once (as gamma="auto" does, once per pair in a process);
then each repeat runs plain decoding (autoregressive_generate) and greedy speculative decoding
with gamma="auto" on the same prompt, back to back, in alternating order (A B, B A, ...) so a busy
moment slows both alike. A repeat's ratio is plain seconds / auto seconds (both make the same
tokens: checked), so below 1 auto lost. The table gives each pair's smallest, median and largest
ratio, the smallest in the CostModel's seconds (the rounds auto chose, priced by the costs it
measured: the comparison without the machine's noise), and how many of auto's rounds were plain.
"""

import argparse
import statistics
import sys
from pathlib import Path

import torch

from gpt2 import load_gpt2
from gpt2.speed.machine_load import busy_note, load_average
from spec_decoding import CostModel, autoregressive_generate, speculative_sampling, speculative_sampling_greedy

from .common import (DEFAULT_CHECKPOINTS, machine_info, markdown_table, random_prompt, read_prompts,
                     standin_pair, timed, write_results)


def compare(target, draft, costs: CostModel, repeats: int, max_gen: int, prompt_len: int,
            temperature: float = 0.0, prompts: list[list[int]] | None = None) -> dict:
    """`repeats` interleaved runs of plain decoding and gamma="auto" on one pair: greedy (the
    same tokens, checked) or sampled at `temperature` (each repeat's two runs seeded alike).
    prompts: taken in turn (default: random token ids of prompt_len, a new one each repeat)."""
    device = target.wte.weight.device
    ratios, cost_ratios, plain_rounds, rounds, drafted, accepted = [], [], 0, 0, 0, 0
    for r in range(repeats):
        prompt = (prompts[r % len(prompts)] if prompts
                  else random_prompt(prompt_len, seed=r, vocab_size=target.config.vocab_size))
        runs = {}
        for name in (("plain", "auto") if r % 2 == 0 else ("auto", "plain")):
            seeded = torch.Generator(device=device).manual_seed(r)
            if name == "plain":
                runs[name] = timed(device, autoregressive_generate, target, prompt, max_gen, temperature,
                                   generator=seeded)
            elif temperature == 0:
                runs[name] = timed(device, speculative_sampling_greedy, target, draft, prompt, max_gen, "auto",
                                   cost_model=costs)
            else:
                runs[name] = timed(device, speculative_sampling, target, draft, prompt, max_gen, "auto",
                                   temperature=temperature, generator=seeded, cost_model=costs)
        (plain, plain_s), (auto, auto_s) = runs["plain"], runs["auto"]
        if temperature == 0 and plain.tokens != auto.tokens:
            raise AssertionError(f"repeat {r}: gamma auto's greedy tokens differ from the target's own")
        # a sampled run can stop early (a full context window): compare the rates
        plain_s, auto_s = plain_s / max(1, len(plain.tokens)) * max_gen, auto_s / max(1, len(auto.tokens)) * max_gen
        ratios.append(plain_s / auto_s)
        # The same comparison in the CostModel's seconds: what the gammas chose, without the noise.
        gammas = auto.stats.gamma_by_round
        cost_ratios.append(len(gammas) and len(auto.tokens) * costs.round_seconds(0)
                           / sum(costs.round_seconds(g) for g in gammas))
        plain_rounds += auto.stats.gamma_by_round.count(0)
        rounds += len(auto.stats.gamma_by_round)
        drafted, accepted = drafted + auto.stats.tokens_drafted, accepted + auto.stats.tokens_accepted
        print(f"  repeat {r + 1}: plain {plain_s:.2f} s, auto {auto_s:.2f} s, ratio {ratios[-1]:.2f}, "
              f"gammas {' '.join(map(str, auto.stats.gamma_by_round))}", flush=True)
    return {"ratios": ratios, "min": min(ratios), "median": statistics.median(ratios), "max": max(ratios),
            "cost_model_ratios": cost_ratios, "cost_model_min": min(cost_ratios),
            "plain_round_share": plain_rounds / rounds, "acceptance": accepted / drafted if drafted else None, "break_even_alpha": costs.break_even_alpha(),
            "c": costs.c, "verify_cost_5": costs.verify_cost(min(4, costs.gamma_max))}


def load_pairs(args) -> tuple[object, list[tuple[str, object]], str]:
    """(target, [(pair name, its draft)], what the models are): the given pair, or the stand-ins."""
    if args.target or args.draft:
        if not (args.target and args.draft):
            sys.exit("error: give both --target DIR and --draft DIR (a pair, e.g. runs/trained_pair/target and .../draft)")
        target, draft = load_gpt2(args.target, dtype="float32"), load_gpt2(args.draft, dtype="float32")
        return target, [("given", draft), ("cannot", target)], f"the pair {args.target} / {args.draft}"
    target_dir, draft_dir = standin_pair(args.checkpoints, args.size, args.draft_layers, damping=0.05,
                                         embedding_std=0.3)
    # Small embeddings: this model does not copy its input as the pair's large-embedding models do,
    # so it rarely picks their next token.
    _, stranger_dir = standin_pair(args.checkpoints, args.size, args.draft_layers, damping=0.05,
                                   embedding_std=0.02, seed=1)
    target, draft = load_gpt2(target_dir, dtype="float32"), load_gpt2(draft_dir, dtype="float32")
    stranger = load_gpt2(stranger_dir, dtype="float32")
    return target, [("pays", draft), ("cannot", target), ("disagrees", stranger)], f"{args.size}-shaped stand-ins"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.auto_gamma", description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="gpt2", help="the stand-ins' official shape (default gpt2)")
    parser.add_argument("--draft-layers", type=int, default=3, help="the paying pair's draft: the target's first K blocks")
    parser.add_argument("--target", help="a target checkpoint folder (with --draft: that pair instead of the stand-ins)")
    parser.add_argument("--draft", help="its draft's checkpoint folder")
    parser.add_argument("--prompts", help="a text file, one prompt a line, taken in turn (default: random token ids)")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0],
                        help="0: greedy (default); above 0, both sample, seeded alike")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--max-gen", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=16, help="random prompts' length")
    parser.add_argument("--threads", type=int, help="PyTorch threads (default: its own choice)")
    parser.add_argument("--checkpoints", default=str(DEFAULT_CHECKPOINTS), help="where the stand-ins are kept")
    parser.add_argument("--out", default="runs/auto-gamma", help="output folder (results.json, results.md)")
    args = parser.parse_args(argv)
    if any(t < 0 for t in args.temperatures):
        sys.exit("error: --temperatures must be >= 0 (0 is greedy)")
    prompts = read_prompts(Path(args.prompts)) if args.prompts else None
    if args.threads:
        torch.set_num_threads(args.threads)
    if note := busy_note("--threads 1"):
        print(note, flush=True)
    load_start = load_average()
    target, pairs, models = load_pairs(args)
    results = {"machine": machine_info(), "settings": vars(args), "pairs": {}}
    rows = []
    for name, pair_draft in pairs:
        print(f"{name}: measuring the costs ...", flush=True)
        costs = CostModel.calibrate(target, pair_draft, gamma_max=8)
        for temperature in args.temperatures:
            if len(args.temperatures) > 1:
                print(f"  temperature {temperature:g}", flush=True)
            r = compare(target, pair_draft, costs, args.repeats, args.max_gen, args.prompt_len, temperature, prompts)
            results["pairs"][name if len(args.temperatures) == 1 else f"{name}, T={temperature:g}"] = r
            rows.append([name, f"{temperature:g}", f"{r['c']:.2f}", f"{r['verify_cost_5']:.2f}",
                         "never" if r["break_even_alpha"] is None else f"{r['break_even_alpha']:.2f}",
                         f"{r['min']:.2f}x", f"{r['median']:.2f}x", f"{r['max']:.2f}x", f"{r['cost_model_min']:.2f}x",
                         f"{r['plain_round_share']:.0%}", "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"])
    results["load_average_start_end"] = [load_start, load_average()]
    table = markdown_table(["pair", "temperature", "c", "verify 5 tokens", "pays from alpha",
                            "auto / plain: min", "median", "max", "min in the CostModel's seconds", "plain rounds",
                            "acceptance of drafted tokens"], rows)
    m = results["machine"]
    header = (f"{args.repeats} repeats, {models}, {args.max_gen} tokens, "
              f"{m['torch_threads']} threads, {m['cpu']} ({m['cores']} cores), torch {m['torch']}, "
              f"load average {load_start:.1f} at the start, {load_average():.1f} at the end")
    print("\n" + header + "\n\n" + table)
    write_results(args.out, results, header + "\n\n" + table + "\n")


if __name__ == "__main__":
    sys.exit(main())
