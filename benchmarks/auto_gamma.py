"""gamma="auto" by the clock: beside plain decoding and the best fixed gamma, interleaved, repeated.

    python -m benchmarks.auto_gamma --size gpt2-large --draft-layers 12 --max-gens 48 200 --repeats 5
    python -m benchmarks.auto_gamma --target runs/trained_pair/target --draft runs/trained_pair/draft \
        --prompts prompts/code.txt --temperatures 0 1 --max-gens 48 200 --repeats 9
    python -m benchmarks.auto_gamma --size gpt2-large --draft-layers 12 --breakdown   # where the time goes

The pairs. With --target and --draft (a trained pair, e.g. offline.train_pair's: real acceptance,
which random stand-ins do not have): that pair ("given"), on the prompts of --prompts (one per
line, taken in turn). Otherwise random-weight stand-ins of an official shape (a forward's cost does
not depend on the weights; benchmarks/common.py), --pairs of:
  pays      a draft made of the target's first --draft-layers blocks, which agrees with it often
            (offline.random_weights.save_agreeing_pair): speculation pays.
  disagrees an independent draft of --draft-layers blocks of the same width (another seed, small
            embeddings): it costs what the paying draft costs but never picks the target's token.

For each pair the CostModel is measured once (calibrate_costs); the best fixed gamma is the one
the CostModel predicts fastest from the acceptance by position of one untimed pilot run at
gamma_max (on the first prompt). Then each repeat runs plain decoding (autoregressive_generate),
the best fixed gamma and gamma="auto" on the same prompt, back to back, the order rotating from
repeat to repeat (so a busy moment slows each alike); a ratio is plain seconds / its seconds (below
1: slower than the target alone). Greedy runs must give the target's own tokens (checked); at a
temperature above 0 all three sample, seeded alike (then they differ; the comparison is of speed).
The table gives each ratio's median and quartiles over the repeats. A generation shorter than half
a second (small models, few tokens) is timed over as many calls as make it one, the same for each
method (the same seed: the same tokens each call), the methods taking turns call by call. At a
temperature above 0 the costs it reports and picks the best fixed gamma from are a sampled
round's (CostModel.sampled), as auto's are.

--breakdown instead times gamma="auto" round by round against plain decoding's steps on the same
prompt (model forwards timed by hooks, the draft's rows counted), and says where the time goes:
the first round (both prefills), the opening drafting rounds, the probes (the draft's catch-up
over the tokens it skipped: one forward of many rows), the plain rounds beside plain steps.
"""

import argparse
import math
import statistics
import sys
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch

from gpt2.speed import load_accelerated
from gpt2.speed.compiled import COMPILE_FLAGS
from gpt2.speed.machine_load import busy_note, load_average
from spec_decoding import autoregressive_generate, CostModel, SamplingParams, speculative_sampling
from spec_decoding.policies.theory import expected_tokens_by_position
from spec_decoding.calibration import calibrate_costs

from .common import (DEFAULT_CHECKPOINTS, machine_info, markdown_table, random_prompt, read_prompts,
                     standin_pair, timed, write_results)

GAMMA_MAX = 8


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile); with fewer than 2 values all three are the value."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def generate(method, target, draft, prompt, max_gen: int, temperature: float, seed: int, costs):
    """One generation by `method`: "plain", an int (a fixed gamma) or "auto"."""
    generator = torch.Generator(device=target.wpe.weight.device).manual_seed(seed)
    if method == "plain":
        return autoregressive_generate(target, prompt, max_gen,
                                       sampling=SamplingParams(temperature=temperature, generator=generator))
    return speculative_sampling(target, draft, prompt, max_gen, costs if method == "auto" else method,
                                SamplingParams(temperature=temperature, generator=generator))


MIN_TIMED_S = 0.5  # seconds a method's timing in a repeat spans at least (more calls when shorter)


def best_fixed_gamma(target, draft, round_costs: CostModel, prompt, max_gen: int, temperature: float) -> int:
    """The fixed gamma the CostModel predicts fastest, from the acceptance by position of one
    (untimed) pilot run at gamma_max: argmax E(g) / round_seconds(g), E as in theory.py.
    round_costs: the costs of a round as it runs at `temperature` (CostModel.sampled above 0)."""
    stats = generate(round_costs.gamma_max, target, draft, prompt, max_gen, temperature, 0, None).stats
    alphas = [a if a is not None else 0.0 for a in stats.acceptance_by_position]
    return max(range(1, round_costs.gamma_max + 1),
               key=lambda g: expected_tokens_by_position(alphas[:g]) / round_costs.round_seconds(g))


def compare(target, draft, costs: CostModel, repeats: int, max_gen: int, prompt_len: int,
            temperature: float = 0.0, prompts: list[list[int]] | None = None,
            fixed_gamma: int | None = None, min_timed_s: float | None = None) -> dict:
    """`repeats` interleaved runs of plain decoding, FixedGamma(fixed_gamma) (None: best_fixed_gamma)
    and gamma="auto" on one pair, greedy (the same tokens, checked) or sampled at `temperature`
    (a repeat's runs seeded alike). prompts: taken in turn (default: random token ids of
    prompt_len, a new one each repeat). Ratios are plain seconds over each method's seconds."""
    def prompt_of(r):
        return (prompts[r % len(prompts)] if prompts
                else random_prompt(prompt_len, seed=r, vocab_size=target.config.vocab_size))

    decided_from = costs.sampled() if temperature else costs  # the costs auto decides from (make_policy)
    if fixed_gamma is None:
        fixed_gamma = best_fixed_gamma(target, draft, decided_from, prompt_of(0), max_gen, temperature)
    methods = ["plain", fixed_gamma, "auto"]
    device = target.wpe.weight.device
    # A generation shorter than MIN_TIMED_S is timed over several calls (the same seed: the same
    # tokens each time), as many for each method, so the clock's own noise stays small beside it.
    _, plain_s = timed(device, generate, "plain", target, draft, prompt_of(0), max_gen, temperature, 0, costs)
    min_timed_s = MIN_TIMED_S if min_timed_s is None else min_timed_s
    calls = max(1, math.ceil(min_timed_s / max(plain_s, 1e-6)))
    if calls > 1:
        print(f"  each timing below: the mean of {calls} calls (plain decoding takes {plain_s * 1e3:.0f} ms)", flush=True)
    ratios = {"fixed": [], "auto": []}
    auto_gammas, plain_rounds, rounds, drafted, accepted = [], 0, 0, 0, 0
    for r in range(repeats):
        prompt, order = prompt_of(r), methods[r % 3:] + methods[:r % 3]  # the order rotates
        # The calls of the three methods take turns (plain, g, auto, plain, g, auto, ...): a drift
        # of the machine's speed then slows each alike.
        runs = {method: (None, 0.0) for method in order}
        for _ in range(calls):
            for method in order:
                result, seconds = timed(device, generate, method, target, draft, prompt, max_gen, temperature, r, costs)
                runs[method] = result, runs[method][1] + seconds / calls
        (plain, plain_s) = runs["plain"]
        for method in methods[1:]:
            result, seconds = runs[method]
            if temperature == 0 and result.tokens != plain.tokens:
                raise AssertionError(f"repeat {r}: gamma={method}'s greedy tokens differ from the target's own")
            # a sampled run can stop early (a full context window): compare the rates
            rate = len(result.tokens) / seconds
            ratios["auto" if method == "auto" else "fixed"].append(rate / (len(plain.tokens) / plain_s))
        auto = runs["auto"][0].stats
        auto_gammas.append(auto.gamma_by_round)
        plain_rounds, rounds = plain_rounds + auto.gamma_by_round.count(0), rounds + len(auto.gamma_by_round)
        drafted, accepted = drafted + auto.tokens_drafted, accepted + auto.tokens_accepted
        print(f"  repeat {r + 1}: plain {plain_s:.2f} s, gamma {fixed_gamma} {ratios['fixed'][-1]:.2f}x, "
              f"auto {ratios['auto'][-1]:.2f}x, auto's gammas {' '.join(map(str, auto.gamma_by_round))}",
              flush=True)
    result = {"fixed_gamma": fixed_gamma, "auto_gammas": auto_gammas, "calls_per_timing": calls,
              "plain_round_share": plain_rounds / rounds, "acceptance": accepted / drafted if drafted else None,
              "break_even_alpha": decided_from.break_even_alpha(), "c": decided_from.c,
              "verify_cost_2": decided_from.verify_cost(1)}
    for name, values in ratios.items():
        q1, q2, q3 = quartiles(values)
        result[name] = {"ratios": values, "q1": q1, "median": q2, "q3": q3, "min": min(values)}
    result["auto_over_fixed_median"] = result["auto"]["median"] / result["fixed"]["median"]
    return result


# ------------------------------------------------------------------------ where the time goes

class ForwardTimer:
    """Forward hooks on a model: the wall time and the rows (new tokens) of every forward."""

    def __init__(self, model):
        self.calls, self._start = [], None
        self.handles = [model.register_forward_pre_hook(self._before), model.register_forward_hook(self._after)]

    def _before(self, module, args):
        self._start = time.perf_counter()

    def _after(self, module, args, output):
        self.calls.append((args[0].shape[1], time.perf_counter() - self._start))

    def take(self) -> list[tuple[int, float]]:
        calls, self.calls = self.calls, []
        return calls

    def remove(self):
        for handle in self.handles:
            handle.remove()


def round_breakdown(target, draft, costs: CostModel, prompt, max_gen: int) -> dict:
    """gamma="auto" (greedy) timed round by round beside plain decoding's steps on the same prompt:
    per round its gamma, wall seconds, the target's forward seconds, and the draft's forwards
    (rows, seconds). Returns {"auto": [round dicts], "plain": [step seconds], "summary": {...}}."""
    target_timer, draft_timer = ForwardTimer(target), ForwardTimer(draft)
    try:
        rounds, marks = [], [time.perf_counter()]

        def on_round(report):
            now = time.perf_counter()
            target_calls, draft_calls = target_timer.take(), draft_timer.take()
            rounds.append({"gamma": len(report.draft_tokens), "seconds": now - marks[-1],
                           "target_s": sum(s for _, s in target_calls),
                           "draft_rows": [n for n, _ in draft_calls], "draft_s": sum(s for _, s in draft_calls)})
            marks.append(now)

        target_timer.take(), draft_timer.take()
        marks[0] = time.perf_counter()
        from spec_decoding import Observers, speculative_sampling_greedy
        auto = speculative_sampling_greedy(target, draft, prompt, max_gen, costs,
                                           observers=Observers(on_round=on_round))
        auto_s = time.perf_counter() - marks[0]
        steps, step_marks = [], [time.perf_counter()]

        def on_tokens(tokens, sources):
            now = time.perf_counter()
            steps.append(now - step_marks[-1])
            step_marks.append(now)

        target_timer.take()
        step_marks[0] = time.perf_counter()
        plain = autoregressive_generate(target, prompt, max_gen, observers=Observers(on_tokens=on_tokens))
        plain_s = time.perf_counter() - step_marks[0]
        plain_forwards = target_timer.take()
    finally:
        target_timer.remove(), draft_timer.remove()
    if plain.tokens != auto.tokens:
        raise AssertionError("gamma auto's greedy tokens differ from the target's own")
    step = statistics.median(steps[1:])
    first = rounds[0]
    plain_rounds = [r for r in rounds[1:] if r["gamma"] == 0]
    drafting = [(i, r) for i, r in enumerate(rounds) if r["gamma"] > 0]
    opening = [r for i, r in drafting if i == 0 or all(rounds[j]["gamma"] > 0 for j in range(i))]
    probes = [r for i, r in drafting if r not in opening]
    plain_forward = statistics.median(s for _, s in plain_forwards[1:])
    summary = {
        "plain_total_s": plain_s, "auto_total_s": auto_s, "ratio": plain_s / auto_s,
        "plain_step_s": step, "plain_first_step_s": steps[0],
        "plain_step_forward_s": plain_forward,
        "auto_first_round_s": first["seconds"], "auto_first_round_gamma": first["gamma"],
        "auto_first_round_draft_s": first["draft_s"], "auto_first_round_draft_rows": first["draft_rows"],
        "opening_rounds": len(opening), "opening_extra_s": sum(r["seconds"] - step for r in opening[1:]),
        "probes": len(probes), "probe_draft_rows": [r["draft_rows"] for r in probes],
        "probe_extra_s": sum(r["seconds"] - step for r in probes),
        "probe_catch_up_s": sum(r["draft_s"] for r in probes),
        "plain_rounds": len(plain_rounds),
        "plain_round_s": statistics.median(r["seconds"] for r in plain_rounds) if plain_rounds else None,
        "plain_round_forward_s": statistics.median(r["target_s"] for r in plain_rounds) if plain_rounds else None,
        "gammas": auto.stats.gamma_by_round,
    }
    return {"auto": rounds, "plain": steps, "summary": summary}


def breakdown_table(summary: dict) -> str:
    """The breakdown as a table: each part's seconds, and what auto spent beyond plain decoding in
    plain decoding's median step (later steps: the first holds the prompt's prefill)."""
    s, step = summary, summary["plain_step_s"]

    def ms(x):
        return f"{1000 * x:.1f} ms"

    def steps(x):
        return f"{x / step:+.2f} steps"

    rows = [
        ["whole generation", ms(s["plain_total_s"]), ms(s["auto_total_s"]),
         f"{steps(s['auto_total_s'] - s['plain_total_s'])} (plain / auto {s['ratio']:.3f}x)"],
        ["first round (both prefills)", ms(s["plain_first_step_s"]),
         f"{ms(s['auto_first_round_s'])}: g = {s['auto_first_round_gamma']}, the draft {ms(s['auto_first_round_draft_s'])} "
         f"over rows {s['auto_first_round_draft_rows']}", steps(s["auto_first_round_s"] - s["plain_first_step_s"])],
        [f"opening drafting rounds after the first: {max(0, s['opening_rounds'] - 1)}", "-",
         f"{ms(s['opening_extra_s'])} beyond plain steps", steps(s["opening_extra_s"])],
        [f"probes: {s['probes']}, the draft's rows {s['probe_draft_rows']}", "-",
         f"{ms(s['probe_extra_s'])} beyond plain steps (the draft's forwards {ms(s['probe_catch_up_s'])})",
         steps(s["probe_extra_s"])],
    ]
    if s["plain_rounds"]:
        rows.append([f"a plain round ({s['plain_rounds']}), median", f"{ms(step)} (outside the forward "
                     f"{ms(step - s['plain_step_forward_s'])})", f"{ms(s['plain_round_s'])} (outside the "
                     f"forward {ms(s['plain_round_s'] - s['plain_round_forward_s'])})",
                     steps(s["plain_round_s"] - step)])
    return markdown_table(["where", "plain decoding", "gamma auto", "auto beyond plain decoding"], rows)


# ------------------------------------------------------------------------ the command

def load_pairs(args) -> tuple[object, list[tuple[str, object]], str]:
    """(target, [(pair name, its draft)], what the models are): the given pair, or the stand-ins."""
    if args.target or args.draft:
        if not (args.target and args.draft):
            sys.exit("error: give both --target DIR and --draft DIR (a pair, e.g. runs/trained_pair/target and .../draft)")
        target, draft = (load_accelerated(folder, device=args.device, dtype="float32", compile=COMPILE_FLAGS[args.compile])
                         for folder in (args.target, args.draft))
        return target, [("given", draft)], f"the pair {args.target} / {args.draft}"
    target_dir, draft_dir = standin_pair(args.checkpoints, args.size, args.draft_layers, damping=0.05,
                                         embedding_std=0.3)
    load = partial(load_accelerated, device=args.device, dtype=args.dtype, compile=COMPILE_FLAGS[args.compile])
    target = load(target_dir)
    pairs = []
    if "pays" in args.pairs:
        pairs.append(("pays", load(draft_dir)))
    if "disagrees" in args.pairs:
        # Another seed's weights with small embeddings: this model does not copy its input as the
        # pair's large-embedding models do, so it never picks their next token.
        _, stranger_dir = standin_pair(args.checkpoints, args.size, args.draft_layers, damping=0.05,
                                       embedding_std=0.02, seed=1)
        pairs.append(("disagrees", load(stranger_dir)))
    return target, pairs, f"{args.size}-shaped stand-ins ({args.dtype})"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.auto_gamma", description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="gpt2", help="the stand-ins' official shape (default gpt2)")
    parser.add_argument("--draft-layers", type=int, default=3, help="the stand-in drafts' blocks")
    parser.add_argument("--pairs", nargs="+", choices=["pays", "disagrees"], default=["pays", "disagrees"],
                        help="which stand-in pairs (default both)")
    parser.add_argument("--dtype", default="float32", help="the stand-ins' format for load_accelerated (default float32)")
    parser.add_argument("--target", help="a target checkpoint folder (with --draft: that pair instead of the stand-ins)")
    parser.add_argument("--draft", help="its draft's checkpoint folder")
    parser.add_argument("--prompts", help="a text file, one prompt a line, taken in turn (default: random token ids)")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0],
                        help="0: greedy (default); above 0, all sample, seeded alike")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--min-timed-s", type=float, default=MIN_TIMED_S,
                        help=f"time a shorter generation over several calls, to span this (default {MIN_TIMED_S})")
    parser.add_argument("--max-gens", type=int, nargs="+", default=[48, 200])
    parser.add_argument("--prompt-len", type=int, default=24, help="random prompts' length")
    parser.add_argument("--fixed-gamma", type=int, help="the fixed gamma to compare (default: the best, by a pilot run)")
    parser.add_argument("--breakdown", action="store_true", help="time auto round by round instead (greedy)")
    parser.add_argument("--calibrate-s", type=float, default=10.0,
                        help="seconds to measure each pair's CostModel (default 10; more is steadier on a busy machine)")
    parser.add_argument("--calibrate-rounds", type=int, default=7, help="at least this many rounds of it (default 7)")
    parser.add_argument("--threads", type=int, help="PyTorch threads (default: its own choice)")
    parser.add_argument("--device", default="cpu", help="where the models run: cpu (default), cuda")
    parser.add_argument("--compile", choices=list(COMPILE_FLAGS), default="off",
                        help="the models' decode path, as the scripts' --compile (e.g. fused on a GPU)")
    parser.add_argument("--checkpoints", default=str(DEFAULT_CHECKPOINTS), help="where the stand-ins are kept")
    parser.add_argument("--out", default="runs/auto-gamma", help="output folder (results.json, results.md)")
    args = parser.parse_args(argv)
    if any(t < 0 for t in args.temperatures):
        sys.exit("error: --temperatures must be >= 0 (0 is greedy)")
    if args.repeats < 1 or any(m < 1 for m in args.max_gens):
        sys.exit("error: --repeats and --max-gens must be >= 1")
    prompts = read_prompts(Path(args.prompts)) if args.prompts else None
    if args.threads:
        torch.set_num_threads(args.threads)
    if note := busy_note("--threads 1"):
        print(note, flush=True)
    load_start = load_average()
    target, pairs, models = load_pairs(args)
    results = {"machine": machine_info(), "settings": vars(args), "cost_models": {}, "pairs": {}}
    rows, texts = [], []
    for name, pair_draft in pairs:
        print(f"{name}: measuring the costs ...", flush=True)
        costs = calibrate_costs(target, pair_draft, gamma_max=GAMMA_MAX, budget_s=args.calibrate_s,
                                min_rounds=args.calibrate_rounds)
        print(costs, flush=True)
        results["cost_models"][name] = asdict(costs)
        if args.breakdown:
            for max_gen in args.max_gens:
                prompt = prompts[0] if prompts else random_prompt(args.prompt_len, 0, target.config.vocab_size)
                generate("plain", target, pair_draft, prompt, 4, 0.0, 0, costs)  # warm up
                b = round_breakdown(target, pair_draft, costs, prompt, max_gen)
                results["pairs"][f"{name}, {max_gen} tokens"] = b
                texts.append(f"{name}, {max_gen} tokens, auto's gammas "
                             f"{' '.join(map(str, b['summary']['gammas']))}:\n\n{breakdown_table(b['summary'])}")
                print("\n" + texts[-1] + "\n", flush=True)
            continue
        for temperature in args.temperatures:
            for max_gen in args.max_gens:
                print(f"  temperature {temperature:g}, {max_gen} tokens", flush=True)
                r = compare(target, pair_draft, costs, args.repeats, max_gen, args.prompt_len, temperature,
                            prompts, args.fixed_gamma, args.min_timed_s)
                results["pairs"][f"{name}, T={temperature:g}, {max_gen} tokens"] = r
                f, a = r["fixed"], r["auto"]
                rows.append([name, f"{temperature:g}", max_gen,
                             "never" if r["break_even_alpha"] is None else f"{r['break_even_alpha']:.2f}",
                             "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}",
                             f"{r['fixed_gamma']}: {f['median']:.2f}x ({f['q1']:.2f}-{f['q3']:.2f})",
                             f"{a['median']:.2f}x ({a['q1']:.2f}-{a['q3']:.2f})", f"{a['min']:.2f}x",
                             f"{r['auto_over_fixed_median']:.2f}", f"{r['plain_round_share']:.0%}"])
    results["load_average_start_end"] = [load_start, load_average()]
    m = results["machine"]
    where = (f"{torch.cuda.get_device_name()} (--compile {args.compile}), host " if args.device == "cuda"
             else "" if args.compile == "off" else f"--compile {args.compile}, ")
    header = (f"{args.repeats} repeats, {models}, {where}{m['torch_threads']} threads, {m['cpu']} ({m['cores']} cores), "
              f"torch {m['torch']}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
              f"{load_start:.1f} at the start, {load_average():.1f} at the end")
    if not args.breakdown:
        texts.append(markdown_table(
            ["pair", "temperature", "max_gen", "pays from alpha", "auto's acceptance",
             "best fixed gamma / plain: median (quartiles)", "auto / plain: median (quartiles)", "auto: min",
             "auto / best fixed (medians)", "auto's plain rounds"], rows))
    print("\n" + header + "\n\n" + "\n\n".join(texts))
    write_results(args.out, results, header + "\n\n" + "\n\n".join(texts) + "\n")


if __name__ == "__main__":
    sys.exit(main())
